//! Loom model of the magazine caches (core/src/recycle.rs): magazines move between threads only
//! through the depot's queue, so a block is never handed out twice.
#![cfg(loom)]

use std::alloc::Layout;
use std::collections::HashSet;
use std::ptr::NonNull;

use keyserial_core::recycle::{Cache, Depot, BATCH};
use loom::sync::Arc;
use loom::thread;

struct Block(NonNull<u8>);
// SAFETY: a block is owned by whoever holds the `Block`.
unsafe impl Send for Block {}

#[test]
fn a_freeing_and_an_allocating_cache_never_share_a_block() {
    loom::model(|| {
        let depot = Arc::new(Depot::<2>::new(Layout::new::<[u64; 4]>()));
        // Blocks for the freeing thread: enough to fill both its magazines and send one more
        // magazine to the depot while the other thread allocates.
        let mut owner = Cache::new(&*depot);
        let given: Vec<Block> = (0..3 * BATCH + 1).map(|_| Block(owner.alloc())).collect();
        drop(owner);

        let d1 = depot.clone();
        let freer = thread::spawn(move || {
            let mut cache = Cache::new(&*d1);
            for b in given {
                // SAFETY: allocated from this depot's class; ownership moved to this thread.
                unsafe { cache.free(b.0) };
            }
            // Dropping the cache hands its magazines to the depot (or frees them if full).
        });
        let d2 = depot.clone();
        let taker = thread::spawn(move || {
            let mut cache = Cache::new(&*d2);
            let mut held: Vec<Block> = (0..BATCH + 2).map(|_| Block(cache.alloc())).collect();
            for b in &held {
                // SAFETY: a block we hold, of at least 32 bytes.
                unsafe { b.0.as_ptr().write_bytes(0xAB, 32) };
            }
            // Take out whatever the cache still holds too, so every block this thread got is
            // checked below and the emptied cache can be forgotten without leaking.
            let cached = cache.cached();
            held.extend((0..cached).map(|_| Block(cache.alloc())));
            assert_eq!(cache.cached(), 0);
            std::mem::forget(cache);
            held
        });
        freer.join().unwrap();
        let held = taker.join().unwrap();

        let held_set: HashSet<usize> = held.iter().map(|b| b.0.as_ptr() as usize).collect();
        assert_eq!(held_set.len(), held.len(), "a block was handed out twice");
        // Everything still cached in the depot is distinct from the blocks in use.
        let mut check = Cache::new(&*depot);
        let rest: Vec<Block> = (0..4 * BATCH).map(|_| Block(check.alloc())).collect();
        for b in &rest {
            assert!(
                !held_set.contains(&(b.0.as_ptr() as usize)),
                "a block in use was also cached"
            );
        }
        let rest_set: HashSet<usize> = rest.iter().map(|b| b.0.as_ptr() as usize).collect();
        assert_eq!(rest_set.len(), rest.len());
        for b in held.into_iter().chain(rest) {
            // SAFETY: every block came from this depot's class and is freed once.
            unsafe { check.free(b.0) };
        }
    });
}
