//! FixedSerializer driven by std threads: 4 producers x 20,000 tasks over shared keys, 3 drivers
//! calling `run`. Checks per-key order, no overlap within a key, and every task exactly once.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use keyserial_core::fixed::{FixedSerializer, RefuseReason};

const PRODUCERS: usize = 4;
#[cfg(miri)]
const PER: usize = 200;
#[cfg(not(miri))]
const PER: usize = 20_000;
const KEY_SPACE: usize = 24; // more keys than slots: keys come and go
const KEYS: usize = 11;
const TASKS: usize = 37;

/// A task: which producer sent it and its sequence number there.
type Task = (usize, usize);

#[test]
fn four_producers_three_drivers() {
    let s: Arc<FixedSerializer<u16, Task, KEYS, TASKS>> = Arc::new(FixedSerializer::new());
    let busy: Arc<Vec<AtomicBool>> =
        Arc::new((0..KEY_SPACE).map(|_| AtomicBool::new(false)).collect());
    // last[key * PRODUCERS + p]: the sequence number + 1 of the last task of producer p run on key.
    let last: Arc<Vec<AtomicUsize>> = Arc::new(
        (0..KEY_SPACE * PRODUCERS)
            .map(|_| AtomicUsize::new(0))
            .collect(),
    );
    // seen[p * PER + i]: how many times that task ran.
    let seen: Arc<Vec<AtomicU64>> =
        Arc::new((0..PRODUCERS * PER).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicUsize::new(0));
    let refusals = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);

    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (s, refusals) = (s.clone(), refusals.clone());
            thread::spawn(move || {
                let mut x = p as u64 * 0x9E37_79B9 + 1;
                for i in 0..PER {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = (x % KEY_SPACE as u64) as u16;
                    let mut task = (p, i);
                    // The key of a task is chosen once; a refusal is retried with the same key,
                    // so per-key order of one producer's tasks is its submission order.
                    while let Err(back) = s.submit(key, task) {
                        let r = (back.reason == RefuseReason::KeysFull) as usize;
                        refusals[r].fetch_add(1, Ordering::Relaxed);
                        task = back.task;
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();

    let drivers: Vec<_> = (0..3)
        .map(|d| {
            let (s, busy, last, seen, done) = (
                s.clone(),
                busy.clone(),
                last.clone(),
                seen.clone(),
                done.clone(),
            );
            thread::spawn(move || {
                let total = PRODUCERS * PER;
                while done.load(Ordering::Relaxed) < total {
                    let n = s.run(1 + d * 3, |key, (p, i)| {
                        let k = *key as usize;
                        assert!(!busy[k].swap(true, Ordering::Relaxed), "key {k} overlapped");
                        // Relaxed: only the serializer orders a key's tasks across drivers.
                        let before = last[k * PRODUCERS + p].load(Ordering::Relaxed);
                        assert!(
                            before <= i,
                            "key {k}: producer {p} task {i} after {}",
                            before - 1
                        );
                        last[k * PRODUCERS + p].store(i + 1, Ordering::Relaxed);
                        seen[p * PER + i].fetch_add(1, Ordering::Relaxed);
                        busy[k].store(false, Ordering::Relaxed);
                    });
                    done.fetch_add(n, Ordering::Relaxed);
                    if n == 0 {
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();

    for t in producers.into_iter().chain(drivers) {
        t.join().unwrap();
    }
    for (n, count) in seen.iter().enumerate() {
        assert_eq!(
            count.load(Ordering::Relaxed),
            1,
            "task {n} ran a wrong number of times"
        );
    }
    assert_eq!(done.load(Ordering::Relaxed), PRODUCERS * PER);
    assert_eq!((s.queued(), s.live_keys()), (0, 0));
    eprintln!(
        "refusals: tasks full {}, keys full {}",
        refusals[0].load(Ordering::Relaxed),
        refusals[1].load(Ordering::Relaxed)
    );
}

/// The same serializer in a `static`, with re-entrant submits from inside tasks.
#[test]
fn static_serializer_with_reentrant_submits() {
    static S: FixedSerializer<u8, u32, 4, 16> = FixedSerializer::new();
    for k in 0..4u8 {
        S.submit(k, 3).unwrap();
    }
    let ran = AtomicUsize::new(0);
    thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| loop {
                let n = S.run(2, |k, left| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    if left > 0 {
                        S.submit(*k, left - 1).unwrap();
                    }
                });
                if n == 0 && S.queued() == 0 && S.live_keys() == 0 {
                    break;
                }
            });
        }
    });
    assert_eq!(ran.load(Ordering::Relaxed), 16);
}
