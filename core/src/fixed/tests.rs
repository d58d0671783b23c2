use super::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread;
use std::vec::Vec;

fn drain<K: Hash + Eq + Clone + Copy, T, const N: usize, const M: usize>(
    s: &FixedSerializer<K, T, N, M>,
    budget: usize,
) -> Vec<(K, T)> {
    let mut out = Vec::new();
    while s.run(budget, |k, t| out.push((*k, t))) > 0 {}
    out
}

#[test]
fn per_key_order_and_budget() {
    let s: FixedSerializer<u8, u32, 3, 7> = FixedSerializer::new();
    for t in 0..5 {
        s.submit(1, t).unwrap();
    }
    s.submit(2, 100).unwrap();
    assert_eq!(s.run(0, |_, _| panic!("budget 0 runs nothing")), 0);
    assert_eq!(s.queued(), 6);
    let mut log = Vec::new();
    assert_eq!(s.run(2, |k, t| log.push((*k, t))), 2);
    assert_eq!(s.run(2, |k, t| log.push((*k, t))), 1);
    log.extend(drain(&s, 2));
    assert_eq!(log, [(1, 0), (1, 1), (2, 100), (1, 2), (1, 3), (1, 4)]);
    assert_eq!((s.queued(), s.live_keys()), (0, 0));
}

#[test]
fn exact_capacities_any_size() {
    // KEYS = 3 and TASKS = 5: not powers of two.
    let s: FixedSerializer<u32, u32, 3, 5> = FixedSerializer::new();
    for k in 0..3 {
        s.submit(k, k).unwrap();
    }
    assert_eq!(
        s.submit(7, 70),
        Err(Refused {
            reason: RefuseReason::KeysFull,
            task: 70
        })
    );
    s.submit(0, 1).unwrap();
    s.submit(0, 2).unwrap();
    assert_eq!(
        s.submit(0, 3),
        Err(Refused {
            reason: RefuseReason::TasksFull,
            task: 3
        })
    );
    assert_eq!((s.queued(), s.live_keys()), (5, 3));
    assert_eq!(drain(&s, 10).len(), 5);
    // One key may hold all TASKS.
    for t in 0..5 {
        s.submit(9, t).unwrap();
    }
    assert_eq!(s.submit(9, 5).unwrap_err().reason, RefuseReason::TasksFull);
    assert_eq!(drain(&s, 1), (0..5).map(|t| (9, t)).collect::<Vec<_>>());
    // Slots freed: three new keys fit again.
    for k in 10..13 {
        s.submit(k, 0).unwrap();
    }
    assert_eq!(s.live_keys(), 3);
}

#[test]
fn single_slot_single_task() {
    let s: FixedSerializer<u8, u8, 1, 1> = FixedSerializer::new();
    for round in 0..20u8 {
        s.submit(round, round).unwrap();
        assert_eq!(
            s.submit(round, 0).unwrap_err().reason,
            RefuseReason::TasksFull
        );
        assert_eq!(drain(&s, 1), [(round, round)]);
        assert_eq!(s.live_keys(), 0);
    }
}

#[test]
fn key_stays_live_while_its_last_task_runs() {
    let s: FixedSerializer<u8, u8, 1, 4> = FixedSerializer::new();
    s.submit(1, 0).unwrap();
    let ran = s.run(5, |_, t| {
        assert_eq!(s.live_keys(), 1);
        // Another key cannot take the slot yet; the same key queues behind the running task.
        assert_eq!(s.submit(2, 9).unwrap_err().reason, RefuseReason::KeysFull);
        if t == 0 {
            s.submit(1, 1).unwrap();
        }
    });
    assert_eq!(ran, 2);
    // The run went on with the task queued from inside `f`.
    assert_eq!(s.live_keys(), 0);
    s.submit(2, 9).unwrap();
}

#[test]
fn ready_keys_served_in_order_they_became_ready() {
    let s: FixedSerializer<u8, u8, 5, 10> = FixedSerializer::new();
    for k in [4, 2, 0, 3, 1] {
        s.submit(k, k).unwrap();
    }
    s.submit(4, 40).unwrap();
    let order: Vec<u8> = (0..6)
        .map(|_| {
            let mut key = 0;
            assert_eq!(s.run(1, |k, _| key = *k), 1);
            key
        })
        .collect();
    assert_eq!(order, [4, 2, 0, 3, 1, 4]); // key 4 requeued behind the others
}

#[test]
fn reentrant_submit_and_run() {
    let s: FixedSerializer<u8, u8, 4, 8> = FixedSerializer::new();
    s.submit(0, 0).unwrap();
    let mut seen = Vec::new();
    s.run(1, |_, _| {
        s.submit(1, 10).unwrap();
        s.submit(0, 1).unwrap();
        // A nested run takes another ready key, never the running one.
        assert_eq!(s.run(4, |k, t| seen.push((*k, t))), 1);
    });
    assert_eq!(seen, [(1, 10)]);
    assert_eq!(drain(&s, 4), [(0, 1)]);
}

#[test]
fn unwinding_task_releases_the_key() {
    let s: FixedSerializer<u8, u8, 2, 4> = FixedSerializer::new();
    for t in 0..3 {
        s.submit(1, t).unwrap();
    }
    let r = catch_unwind(AssertUnwindSafe(|| {
        s.run(3, |_, t| {
            if t == 1 {
                panic!("task 1 fails");
            }
        })
    }));
    assert!(r.is_err());
    assert_eq!(s.queued(), 1);
    assert_eq!(drain(&s, 3), [(1, 2)]);
    assert_eq!(s.live_keys(), 0);
    // The last task unwinding frees the slot too.
    s.submit(5, 0).unwrap();
    let r = catch_unwind(AssertUnwindSafe(|| s.run(1, |_, _| panic!("boom"))));
    assert!(r.is_err());
    assert_eq!((s.queued(), s.live_keys()), (0, 0));
}

#[test]
fn drop_drops_queued_tasks_and_keys() {
    let token = Arc::new(());
    {
        let s: FixedSerializer<(u8, Arc<()>), Arc<()>, 3, 6> = FixedSerializer::new();
        for i in 0..6 {
            s.submit((i % 3, token.clone()), token.clone()).unwrap();
        }
        s.run(1, |_, _| {});
        assert!(Arc::strong_count(&token) > 1);
    }
    assert_eq!(Arc::strong_count(&token), 1);
}

#[test]
fn refused_task_and_key_come_back_whole() {
    let token = Arc::new(());
    let s: FixedSerializer<u8, Arc<()>, 1, 1> = FixedSerializer::new();
    s.submit(0, token.clone()).unwrap();
    let back = s.submit(1, token.clone()).unwrap_err();
    assert!(Arc::ptr_eq(&back.task, &token));
    drop(back);
    drop(s);
    assert_eq!(Arc::strong_count(&token), 1);
}

#[test]
fn colliding_keys_and_churn() {
    // Many distinct keys through few slots: reuse, collisions on the home slot, tag misses.
    let s: FixedSerializer<u32, u32, 4, 8> = FixedSerializer::new();
    let mut next = [0u32; 64];
    for round in 0..200u32 {
        let k = (round * 7) % 64;
        let _ = s.submit(k, next[k as usize]).map(|_| next[k as usize] += 1);
        let k2 = (round * 13 + 5) % 64;
        let _ = s
            .submit(k2, next[k2 as usize])
            .map(|_| next[k2 as usize] += 1);
        if round % 3 == 0 {
            s.run(2, |_, _| {});
        }
    }
    drain(&s, 3);
    assert_eq!((s.queued(), s.live_keys()), (0, 0));
}

#[test]
fn is_send_and_sync() {
    fn check<X: Send + Sync>() {}
    check::<FixedSerializer<u8, fn(), 2, 2>>();
    check::<FixedSerializer<&'static str, std::boxed::Box<dyn FnOnce() + Send>, 2, 2>>();
}

#[test]
fn threads_keep_order_and_lose_nothing() {
    #[cfg(miri)]
    const PER: usize = 30;
    #[cfg(not(miri))]
    const PER: usize = 5_000;
    const KEYS: usize = 3;
    let s: Arc<FixedSerializer<usize, (usize, usize), KEYS, 5>> = Arc::new(FixedSerializer::new());
    let busy: Arc<[AtomicBool; 4]> = Arc::new(Default::default());
    let producers: Vec<_> = (0..2)
        .map(|p| {
            let s = s.clone();
            thread::spawn(move || {
                for i in 0..PER {
                    let mut task = (p, i);
                    // Two keys per producer, one of them shared (key 3 % 4 = 3 for both).
                    let key = if i % 2 == 0 { p } else { 3 };
                    while let Err(back) = s.submit(key, task) {
                        task = back.task;
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let done = Arc::new(AtomicUsize::new(0));
    // Per key and producer: the last task index run, plus one (written only under `busy`).
    let last: Arc<[[AtomicUsize; 2]; 4]> = Arc::new(Default::default());
    let drivers: Vec<_> = (0..2)
        .map(|_| {
            let (s, busy, done, last) = (s.clone(), busy.clone(), done.clone(), last.clone());
            thread::spawn(move || {
                while done.load(Ordering::Relaxed) < 2 * PER {
                    let n = s.run(3, |k, (p, i)| {
                        assert!(!busy[*k].swap(true, Ordering::SeqCst), "overlap on {k}");
                        // Relaxed: the serializer itself must order a key's tasks.
                        assert!(last[*k][p].load(Ordering::Relaxed) <= i, "reordered");
                        last[*k][p].store(i + 1, Ordering::Relaxed);
                        busy[*k].store(false, Ordering::SeqCst);
                    });
                    done.fetch_add(n, Ordering::Relaxed);
                    if n == 0 {
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    for d in drivers {
        d.join().unwrap();
    }
    assert_eq!(done.load(Ordering::Relaxed), 2 * PER);
    assert_eq!((s.queued(), s.live_keys()), (0, 0));
}
