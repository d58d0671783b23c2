//! Loom model of the no-alloc ready queue and node pool (core/src/ready.rs, core/src/pool.rs).
//!
//! **Thread order matters**: loom 0.7 keeps only the last access of each atomic for its race check,
//! so a thread that only loads a word, spawned before a thread that loads the same word and then
//! writes it, is hidden behind that later load, and loom never tries the write before the first
//! load (tokio-rs/loom#392); a thread that only loads must therefore be spawned after the writers.
//! Here, a pop that finds the queue empty (it only loads the head and the cell's sequence) and runs
//! before the producers is hidden by the producer's own load of that sequence before its store:
//! loom never tries the push before the pop. With the pop on the main thread, before the joins, the
//! racing pop found the queue empty in all 132 executions explored. So the consumer is a thread
//! spawned after the producers, the main thread only joins, and a coverage counter (a std static,
//! outside the model) checks that every outcome of the racing pop was reached.
#![cfg(loom)]

use std::sync::atomic::AtomicUsize as StdAtomicUsize;
use std::sync::atomic::Ordering as StdOrdering;

use keyserial_core::pool::Pool;
use keyserial_core::ready::BoundedQueue;
use loom::sync::Arc;
use loom::thread;

/// What the racing pop of `bounded_queue_two_producers_one_consumer` got, over all executions:
/// `[nothing, 1, 2]`.
static RACING_POP: [StdAtomicUsize; 3] = [
    StdAtomicUsize::new(0),
    StdAtomicUsize::new(0),
    StdAtomicUsize::new(0),
];

#[test]
fn bounded_queue_two_producers_one_consumer() {
    loom::model(|| {
        let q = Arc::new(BoundedQueue::<u32, 2>::new());
        let producers: Vec<_> = (1..=2)
            .map(|v| {
                let q = q.clone();
                thread::spawn(move || q.push(v).is_ok())
            })
            .collect();
        // Spawned last: an empty pop only loads (see the module docs).
        let consumer = {
            let q = q.clone();
            thread::spawn(move || q.pop())
        };
        for p in producers {
            assert!(p.join().unwrap(), "capacity 2 holds both");
        }
        let first = consumer.join().unwrap();
        RACING_POP[first.map_or(0, |v| v as usize)].fetch_add(1, StdOrdering::Relaxed);
        let mut got: Vec<u32> = first.into_iter().collect();
        while let Some(v) = q.pop() {
            got.push(v);
        }
        got.sort();
        assert_eq!(got, [1, 2]);
    });
    let [empty, one, two] = RACING_POP.each_ref().map(|c| c.load(StdOrdering::Relaxed));
    assert!(
        empty > 0 && one > 0 && two > 0,
        "the racing pop found nothing in {empty}, 1 in {one}, 2 in {two} executions: an outcome unexplored"
    );
}

#[test]
fn pool_alloc_free_race_hands_each_slot_to_one_owner() {
    loom::model(|| {
        let pool = Arc::new(Pool::<u32, 1>::new());
        let first = pool.alloc(1).unwrap();
        let p2 = pool.clone();
        // SAFETY: the node came from this pool and is not queued.
        let t = thread::spawn(move || p2.alloc(2).ok().map(|n| unsafe { p2.free(n) }));
        // SAFETY: `first` came from this pool and is not queued.
        assert_eq!(unsafe { pool.free(first) }, 1);
        let other = t.join().unwrap();
        assert!(other.is_none() || other == Some(2));
        let again = pool.alloc(3).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { pool.free(again) }, 3);
    });
}
