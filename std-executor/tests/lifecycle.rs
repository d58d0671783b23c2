//! Shutdown family, idle release, backpressure, panics, coalescing, keep-first, fairness, stats.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keyserial::{Builder, RejectReason, Semaphore, TaskError};

mod common;
use common::{block_worker, wait_until};

#[test]
fn bad_configuration_is_a_build_error() {
    for (b, what) in [
        (Builder::<u8>::new().workers(0), "workers"),
        (
            Builder::<u8>::new().workers(4).max_workers(2),
            "max_workers",
        ),
        (Builder::<u8>::new().capacity(0), "capacity"),
        (Builder::<u8>::new().fairness_budget(0), "fairness_budget"),
    ] {
        let err = b.build().unwrap_err();
        assert!(err.to_string().contains(what), "{err}");
    }
}

#[test]
fn shutdown_runs_queued_tasks_and_rejects_new_ones() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let tx = block_worker(&s, 0);
    let ran = Arc::new(AtomicUsize::new(0));
    for k in 0..100 {
        let ran = ran.clone();
        s.execute(k % 7, move || {
            ran.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
    }
    s.shutdown();
    assert!(s.is_shutdown());
    let r = s.execute(1, || ()).unwrap_err();
    assert_eq!(r.reason, RejectReason::Shutdown);
    let r = s.submit(1, || 5).unwrap_err();
    assert_eq!((r.task)(), 5, "the rejected task comes back intact");
    assert!(
        !s.await_termination(Duration::from_millis(50)),
        "a task still blocks"
    );
    assert!(!s.is_terminated());
    drop(tx);
    assert!(s.await_termination(Duration::from_secs(10)));
    assert!(s.is_terminated());
    assert_eq!(ran.load(Ordering::Relaxed), 100);
    assert!(s.stats().rejected >= 2);
}

#[test]
fn shutdown_now_hands_back_exactly_the_unstarted_tasks() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let tx = block_worker(&s, 0);
    let ran = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    // Behind the running task on its own key, on other keys, unkeyed, coalescing and distinct.
    for i in 0..50u32 {
        let ran = ran.clone();
        handles.push(
            s.submit(i % 5, move || {
                ran.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap(),
        );
    }
    let unkeyed = s.spawn(|| ()).unwrap();
    let distinct = s.submit_distinct(9, || ()).unwrap();
    let pending = s.shutdown_now();
    assert_eq!(pending.len(), 52, "every queued task is handed back once");
    let mut keys: Vec<Option<u32>> = pending.iter().map(|p| p.key().copied()).collect();
    keys.sort();
    assert_eq!(keys[0], None);
    assert_eq!(keys.iter().filter(|k| **k == Some(9)).count(), 1);
    drop(tx);
    assert!(s.await_termination(Duration::from_secs(10)));
    assert_eq!(
        ran.load(Ordering::Relaxed),
        0,
        "nothing handed back was run"
    );
    // Run half, drop the rest: their handles resolve accordingly.
    let mut run_keys = Vec::new();
    for (i, p) in pending.into_iter().enumerate() {
        if i % 2 == 0 {
            run_keys.push(p.key().copied());
            p.run();
        }
    }
    let mut ok = 0;
    let mut cancelled = 0;
    for h in handles.into_iter() {
        match h.join() {
            Ok(()) => ok += 1,
            Err(TaskError::Cancelled) => cancelled += 1,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(ran.load(Ordering::Relaxed), ok);
    assert_eq!(ok + cancelled, 50);
    let _ = (unkeyed.join(), distinct.join());
    assert_eq!(s.stats().queued, 0);
}

#[test]
fn shutdown_now_from_another_thread_during_a_storm_loses_nothing() {
    for round in 0..20 {
        let s = Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
        let ran = Arc::new(AtomicUsize::new(0));
        let submitted = Arc::new(AtomicUsize::new(0));
        let producers: Vec<_> = (0..2)
            .map(|p| {
                let (s, ran, submitted) = (s.clone(), ran.clone(), submitted.clone());
                std::thread::spawn(move || {
                    for i in 0..20_000u32 {
                        let ran = ran.clone();
                        let r = s.execute((i * 2 + p) % 97, move || {
                            ran.fetch_add(1, Ordering::Relaxed);
                        });
                        if r.is_err() {
                            break;
                        }
                        submitted.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_micros(200 * (round % 5)));
        let pending = s.shutdown_now();
        for p in producers {
            p.join().unwrap();
        }
        assert!(s.await_termination(Duration::from_secs(10)));
        let handed = pending.len();
        drop(pending);
        assert_eq!(
            ran.load(Ordering::Relaxed) + handed,
            submitted.load(Ordering::Relaxed),
            "round {round}: every accepted task ran once or was handed back once"
        );
    }
}

/// `shutdown` from another thread while producers submit keyed tasks of every kind: a keyed
/// task is admitted by its lane's reservation, refused by a closed lane. Every accepted task
/// runs exactly once, every refused one comes back untouched (never run), and `stats` counts
/// exactly the accepted ones.
#[test]
fn shutdown_during_keyed_submits_runs_every_accepted_task_once() {
    for round in 0..20u32 {
        let s = Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
        let ran = Arc::new(AtomicUsize::new(0));
        let producers: Vec<_> = (0..2u32)
            .map(|p| {
                let (s, ran) = (s.clone(), ran.clone());
                std::thread::spawn(move || {
                    let (mut accepted, mut refused) = (0usize, 0usize);
                    for i in 0..20_000u32 {
                        let key = (i * 2 + p) % 257;
                        let r = ran.clone();
                        let task = move || {
                            r.fetch_add(1, Ordering::Relaxed);
                        };
                        let ok = match i % 3 {
                            0 => s.execute(key, task).map_err(|e| e.task).is_ok(),
                            1 => s.submit(key, task).map_err(|e| e.task).is_ok(),
                            _ => match s.submit_distinct(key + 1000 * (i % 7), task) {
                                Ok(_) => true,
                                Err(e) if e.reason == RejectReason::Duplicate => continue,
                                Err(_) => false,
                            },
                        };
                        if ok {
                            accepted += 1;
                        } else {
                            refused += 1;
                        }
                    }
                    (accepted, refused)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_micros(150 * u64::from(round % 6)));
        s.shutdown();
        let (mut accepted, mut refused) = (0, 0);
        for p in producers {
            let (a, r) = p.join().unwrap();
            accepted += a;
            refused += r;
        }
        assert!(s.await_termination(Duration::from_secs(20)));
        assert_eq!(
            ran.load(Ordering::Relaxed),
            accepted,
            "round {round}: every accepted task ran once, no refused one ran"
        );
        let stats = s.stats();
        assert_eq!(
            stats.completed as usize, accepted,
            "round {round}: {stats:?}"
        );
        assert_eq!(stats.queued, 0, "round {round}: {stats:?}");
        assert!(
            stats.rejected as usize >= refused,
            "round {round}: {stats:?}"
        );
    }
}

/// Runs of tasks straight from a lane (one `RUNNING` section for many tasks) stop mid-run
/// under `shutdown_now`: per key, what ran is a prefix of what was submitted and what came back
/// is the rest, in order, nothing both.
#[test]
fn shutdown_now_mid_run_hands_back_each_key_s_suffix_in_order() {
    const KEYS: u32 = 64;
    const PER_KEY: u32 = 400;
    for round in 0..10u32 {
        let s = Builder::<u32>::new().workers(2).build().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        for i in 0..PER_KEY {
            for k in 0..KEYS {
                let log = log.clone();
                s.execute(k, move || {
                    log.lock().unwrap().push((k, i));
                    if i % 50 == 0 {
                        std::thread::sleep(Duration::from_micros(20));
                    }
                })
                .unwrap();
            }
        }
        std::thread::sleep(Duration::from_micros(300 * u64::from(round % 4)));
        let pending = s.shutdown_now();
        assert!(s.await_termination(Duration::from_secs(10)));
        let ran = std::mem::take(&mut *log.lock().unwrap());
        for p in pending {
            p.run();
        }
        let handed = std::mem::take(&mut *log.lock().unwrap());
        for k in 0..KEYS {
            let r: Vec<u32> = ran.iter().filter(|e| e.0 == k).map(|e| e.1).collect();
            let h: Vec<u32> = handed.iter().filter(|e| e.0 == k).map(|e| e.1).collect();
            let expected: Vec<u32> = (0..PER_KEY).collect();
            assert_eq!(
                [r.clone(), h].concat(),
                expected,
                "round {round}, key {k}: ran {} then handed back the rest, in order",
                r.len()
            );
        }
    }
}

/// Keys hold state (an entry in the key table, counted in `active_keys`) only while they need
/// it: a permit-gated task makes its key's state (its chain parks there), plain tasks of a key
/// with no state run straight from their lane and make none.
#[test]
fn idle_keys_are_released_to_zero() {
    for timeout in [Duration::ZERO, Duration::from_millis(20)] {
        let s = Builder::<u32>::new()
            .workers(2)
            .key_idle_timeout(timeout)
            .build()
            .unwrap();
        let sem = Semaphore::new(1 << 20);
        for k in 0..5000 {
            drop(s.submit_with_permits(k, &sem, 1, || ()).unwrap());
        }
        s.submit(1, || ()).unwrap().join().unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || s.stats().active_keys == 0),
            "timeout {timeout:?}: {:?}",
            s.stats()
        );
        // Keys come back when used again.
        assert_eq!(
            s.submit_with_permits(3, &sem, 1, || 3)
                .unwrap()
                .join()
                .unwrap(),
            3
        );
        assert!(wait_until(Duration::from_secs(10), || s
            .stats()
            .active_keys
            == 0));
    }
}

#[test]
fn try_submit_refuses_when_full_and_hands_the_task_back() {
    let s = Builder::<u32>::new()
        .workers(1)
        .capacity(3)
        .build()
        .unwrap();
    let tx = block_worker(&s, 0);
    let hs: Vec<_> = (0..3)
        .map(|i| s.try_submit(1, move || i).unwrap())
        .collect();
    let r = s.try_submit(2, || 99).unwrap_err();
    assert_eq!(r.reason, RejectReason::Full);
    assert_eq!((r.task)(), 99);
    assert_eq!(s.stats().queued, 3);
    drop(tx);
    for (i, h) in hs.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), i as u32);
    }
}

#[test]
fn submit_blocks_while_full_and_resumes() {
    let s = Arc::new(
        Builder::<u32>::new()
            .workers(1)
            .capacity(2)
            .build()
            .unwrap(),
    );
    let tx = block_worker(&s, 0);
    s.execute(1, || ()).unwrap();
    s.execute(1, || ()).unwrap();
    let s2 = s.clone();
    let t = std::thread::spawn(move || s2.submit(2, || "in").unwrap().join().unwrap());
    std::thread::sleep(Duration::from_millis(50));
    assert!(!t.is_finished(), "the third submit must block");
    drop(tx);
    assert_eq!(t.join().unwrap(), "in");
}

#[test]
fn shutdown_wakes_blocked_submitters_with_shutdown() {
    let s = Arc::new(
        Builder::<u32>::new()
            .workers(1)
            .capacity(1)
            .build()
            .unwrap(),
    );
    let tx = block_worker(&s, 0);
    s.execute(1, || ()).unwrap();
    let s2 = s.clone();
    let t = std::thread::spawn(move || s2.submit(2, || 7).map_err(|r| (r.reason, (r.task)())));
    std::thread::sleep(Duration::from_millis(50));
    s.shutdown();
    assert_eq!(t.join().unwrap().unwrap_err(), (RejectReason::Shutdown, 7));
    drop(tx);
}

#[test]
fn submit_from_inside_a_task_at_capacity_never_blocks() {
    let s = Arc::new(
        Builder::<u32>::new()
            .workers(1)
            .capacity(1)
            .build()
            .unwrap(),
    );
    let inner = s.clone();
    let h = s
        .submit(1, move || {
            // The serializer is at capacity after the first of these; none may block.
            let hs: Vec<_> = (0..10)
                .map(|i| inner.submit(2, move || i).unwrap())
                .collect();
            hs.len()
        })
        .unwrap();
    assert_eq!(h.join().unwrap(), 10);
    assert!(wait_until(Duration::from_secs(5), || s.stats().completed == 11));
}

#[test]
fn a_panicking_task_fails_only_its_handle() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let a = s.submit(1, || 1).unwrap();
    let b = s.submit(1, || -> u32 { panic!("task b failed") }).unwrap();
    s.execute(1, || panic!("detached panic")).unwrap();
    let c = s.submit(1, || 3).unwrap();
    assert_eq!(a.join().unwrap(), 1);
    let err = b.join().unwrap_err();
    assert_eq!(err.panic_message(), Some("task b failed"));
    assert_eq!(c.join().unwrap(), 3, "the key goes on after a panic");
    assert_eq!(s.stats().panicked, 2);
    assert_eq!(s.stats().workers, 1, "the worker lives");
}

#[test]
fn submit_latest_replaces_only_the_immediately_preceding_latest() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let tx = block_worker(&s, 0);
    let order = Arc::new(Mutex::new(Vec::new()));
    let push = |v: &'static str| {
        let order = order.clone();
        move || order.lock().unwrap().push(v)
    };
    let l1 = s.submit_latest(1, push("l1")).unwrap();
    let l2 = s.submit_latest(1, push("l2")).unwrap();
    let p = s.submit(1, push("plain")).unwrap();
    let l3 = s.submit_latest(1, push("l3")).unwrap();
    let l4 = s.submit_latest(1, push("l4")).unwrap();
    let l5 = s.submit_latest(1, push("l5")).unwrap();
    drop(tx);
    assert!(matches!(l1.join(), Err(TaskError::Superseded)));
    l2.join().unwrap();
    p.join().unwrap();
    assert!(matches!(l3.join(), Err(TaskError::Superseded)));
    assert!(matches!(l4.join(), Err(TaskError::Superseded)));
    l5.join().unwrap();
    assert_eq!(*order.lock().unwrap(), ["l2", "plain", "l5"]);
}

#[test]
fn submit_distinct_keeps_the_first_until_it_starts() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let tx = block_worker(&s, 0);
    let first = s.submit_distinct(1, || 1).unwrap();
    assert_eq!(
        s.submit_distinct(1, || 2).unwrap_err().reason,
        RejectReason::Duplicate
    );
    let other_key = s.submit_distinct(2, || 3).unwrap();
    drop(tx);
    assert_eq!(first.join().unwrap(), 1);
    assert_eq!(other_key.join().unwrap(), 3);
    assert_eq!(s.submit_distinct(1, || 4).unwrap().join().unwrap(), 4);
}

#[test]
fn a_hot_key_cannot_starve_a_cold_key() {
    let s = Arc::new(
        Builder::<u32>::new()
            .workers(1)
            .fairness_budget(8)
            .build()
            .unwrap(),
    );
    let tx = block_worker(&s, 99);
    let hot_done = Arc::new(AtomicUsize::new(0));
    for _ in 0..10_000 {
        let hot_done = hot_done.clone();
        s.execute(1, move || {
            hot_done.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_micros(20));
        })
        .unwrap();
    }
    let cold = {
        let hot_done = hot_done.clone();
        s.submit(2, move || hot_done.load(Ordering::Relaxed))
            .unwrap()
    };
    drop(tx);
    let hot_before_cold = cold.join().unwrap();
    assert!(
        hot_before_cold <= 64,
        "the cold key waited for {hot_before_cold} hot tasks"
    );
}

#[test]
fn dropping_the_last_reference_inside_a_task_does_not_deadlock() {
    let s = Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
    let (tx, rx) = mpsc::channel();
    let inner = s.clone();
    s.execute(1, move || {
        // Wait until the outside reference is gone, then drop the last one here.
        std::thread::sleep(Duration::from_millis(50));
        drop(inner);
        tx.send(()).unwrap();
    })
    .unwrap();
    drop(s);
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
}

#[test]
fn dropping_the_serializer_runs_queued_tasks_and_joins() {
    let ran = Arc::new(AtomicUsize::new(0));
    {
        let s = Builder::<u32>::new().workers(2).build().unwrap();
        for k in 0..1000 {
            let ran = ran.clone();
            s.execute(k % 10, move || {
                ran.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
        }
    }
    assert_eq!(ran.load(Ordering::Relaxed), 1000);
}

#[test]
fn worker_threads_are_named() {
    let s = Builder::<u32>::new()
        .workers(2)
        .thread_name("pay")
        .build()
        .unwrap();
    let name = s
        .submit(1, || std::thread::current().name().map(str::to_string))
        .unwrap()
        .join()
        .unwrap()
        .unwrap();
    assert!(name.starts_with("pay-"), "{name}");
}

#[test]
fn handles_are_futures_under_a_minimal_executor() {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let tx = block_worker(&s, 0);
    let mut fut = pin!(s.submit(0, || 41 + 1).unwrap());
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    drop(tx);
    let v = loop {
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(v) => break v,
            Poll::Pending => std::thread::park_timeout(Duration::from_millis(100)),
        }
    };
    assert_eq!(v.unwrap(), 42);
}

#[test]
fn idle_keys_are_capped_per_worker_even_with_a_long_timeout() {
    let s = Builder::<u32>::new()
        .workers(2)
        .key_idle_timeout(Duration::from_secs(3600))
        .build()
        .unwrap();
    let sem = Semaphore::new(1 << 20);
    for k in 0..5000 {
        drop(s.submit_with_permits(k, &sem, 1, || ()).unwrap());
    }
    s.submit(0, || ()).unwrap().join().unwrap();
    // At most 1,024 idle keys per worker survive; the rest were released at once.
    assert!(
        wait_until(Duration::from_secs(10), || s.stats().active_keys
            <= 2 * 1024),
        "{:?}",
        s.stats()
    );
    assert!(
        s.stats().active_keys > 0,
        "the timeout still keeps some hot keys"
    );
}
