//! Loom model of the no-alloc ready queue and node pool (core/src/ready.rs, core/src/pool.rs).
#![cfg(loom)]

use keyserial_core::pool::Pool;
use keyserial_core::ready::BoundedQueue;
use loom::sync::Arc;
use loom::thread;

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
        let mut got = Vec::new();
        if let Some(v) = q.pop() {
            got.push(v);
        }
        for p in producers {
            assert!(p.join().unwrap(), "capacity 2 holds both");
        }
        while let Some(v) = q.pop() {
            got.push(v);
        }
        got.sort();
        assert_eq!(got, [1, 2]);
    });
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
