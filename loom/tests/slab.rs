//! Loom model of the node slabs (std-executor/src/slab.rs): two threads free the blocks of one
//! slab, batched through their `Freer`s, while its owner retires it; exactly one of them frees the
//! slab, and only after every block in it was freed.
#![cfg(loom)]

use std::ptr::NonNull;

use keyserial::loom_api::{Bump, Freer};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

struct Block(NonNull<u8>);
// SAFETY: a block is owned by whoever holds the `Block`.
unsafe impl Send for Block {}

#[test]
fn exactly_one_party_frees_a_slab_after_all_its_blocks() {
    loom::model(|| {
        let mut owner = Bump::new(64);
        let blocks: Vec<Block> = (0..4).map(|_| Block(owner.alloc())).collect();
        // Blocks freed so far, counted before each free: the slab's freer must see all four.
        let freed_blocks = Arc::new(AtomicUsize::new(0));
        let mut it = blocks.into_iter();
        let halves = [
            vec![it.next().unwrap(), it.next().unwrap()],
            vec![it.next().unwrap(), it.next().unwrap()],
        ];
        let freers: Vec<_> = halves
            .into_iter()
            .map(|half| {
                let freed_blocks = freed_blocks.clone();
                thread::spawn(move || {
                    let mut f = Freer::new();
                    let mut freed_slab = false;
                    for b in half {
                        freed_blocks.fetch_add(1, Ordering::Relaxed);
                        // SAFETY: from `owner.alloc()`, handed over whole, freed once.
                        freed_slab |= unsafe { f.free(b.0) };
                    }
                    if f.flush() {
                        freed_slab = true;
                    }
                    if freed_slab {
                        assert_eq!(freed_blocks.load(Ordering::Relaxed), 4);
                    }
                    freed_slab
                })
            })
            .collect();
        let by_owner = owner.retire();
        if by_owner {
            assert_eq!(freed_blocks.load(Ordering::Relaxed), 4);
        }
        let by_freers: usize = freers.into_iter().map(|t| t.join().unwrap() as usize).sum();
        assert_eq!(
            by_owner as usize + by_freers,
            1,
            "the slab is freed exactly once"
        );
    });
}
