//! Issue "Control": pausing and resuming a key, and `PanicPolicy::PauseKey`.
//!
//! Every test checks the accounting exactly: each task ran once, was handed back, or its handle
//! says `Cancelled`.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keyserial::{Builder, PanicPolicy, Serializer, TaskError, TaskHandle};

mod common;
use common::{block_worker, wait_until};

const LONG: Duration = Duration::from_secs(10);
/// Long enough for a worker to have started a task it wrongly let through.
const SETTLE: Duration = Duration::from_millis(50);

/// A log of `(key, i)` in the order tasks ran.
type Log = Arc<Mutex<Vec<(u32, u32)>>>;

fn logged(s: &Serializer<u32>, log: &Log, key: u32, i: u32) -> TaskHandle<u32> {
    let log = log.clone();
    s.submit(key, move || {
        log.lock().unwrap().push((key, i));
        i
    })
    .unwrap()
}

fn ran(log: &Log, key: u32) -> Vec<u32> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k == key)
        .map(|(_, i)| *i)
        .collect()
}

#[test]
fn a_paused_key_runs_nothing_until_resumed_and_others_go_on() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let log = Log::default();
    s.pause(&1);
    let held: Vec<_> = (0..5).map(|i| logged(&s, &log, 1, i)).collect();
    let other: Vec<_> = (0..5).map(|i| logged(&s, &log, 2, i)).collect();
    for h in other {
        h.join().unwrap();
    }
    std::thread::sleep(SETTLE);
    assert!(ran(&log, 1).is_empty(), "a paused key's task started");
    assert!(held.iter().all(|h| !h.is_finished()));
    assert_eq!(s.stats().queued, 5);
    s.resume(&1);
    let values: Vec<u32> = held.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(values, [0, 1, 2, 3, 4]);
    assert_eq!(ran(&log, 1), [0, 1, 2, 3, 4]);
    assert_eq!(s.stats().completed, 10);
}

#[test]
fn pausing_a_running_key_lets_its_task_finish_and_holds_the_rest() {
    for workers in [1, 2] {
        let s = Builder::<u32>::new().workers(workers).build().unwrap();
        let log = Log::default();
        let gate = block_worker(&s, 1);
        let held: Vec<_> = (0..3).map(|i| logged(&s, &log, 1, i)).collect();
        s.pause(&1);
        gate.send(()).unwrap();
        // The blocking task returns; nothing queued behind it starts.
        assert!(wait_until(LONG, || s.stats().running == 0));
        std::thread::sleep(SETTLE);
        assert!(
            ran(&log, 1).is_empty(),
            "{workers} workers: a task started after pause"
        );
        // Other keys still run, on every worker.
        assert_eq!(s.submit(2, || 7).unwrap().join().unwrap(), 7);
        s.resume(&1);
        let values: Vec<u32> = held.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(values, [0, 1, 2]);
        assert_eq!(s.stats().completed, 5);
    }
}

#[test]
fn a_paused_key_with_no_tasks_stays_live_and_is_never_idle_released() {
    let s = Builder::<u32>::new()
        .workers(2)
        .key_idle_timeout(Duration::from_millis(1))
        .build()
        .unwrap();
    s.pause(&9);
    assert_eq!(s.stats().active_keys, 1);
    // Far past the idle timeout, with the reapers running (other keys come and go).
    for i in 0..50 {
        s.submit(100 + i, || ()).unwrap().join().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(s.stats().active_keys >= 1, "the paused key was released");
    let log = Log::default();
    let h = logged(&s, &log, 9, 0);
    std::thread::sleep(SETTLE);
    assert!(!h.is_finished(), "the pause was lost with the key's state");
    s.resume(&9);
    assert_eq!(h.join().unwrap(), 0);
    // Resumed and drained: the key goes back to being released when idle.
    assert!(wait_until(LONG, || s.stats().active_keys == 0));
}

#[test]
fn resume_of_a_key_that_is_not_paused_does_nothing() {
    let s: Serializer<u32> = Serializer::new();
    s.resume(&3); // never seen
    let log = Log::default();
    let h = logged(&s, &log, 3, 1);
    s.resume(&3); // live, not paused
    assert_eq!(h.join().unwrap(), 1);
    s.pause(&3);
    s.pause(&3); // twice: still one pause, undone by one resume
    let h = logged(&s, &log, 3, 2);
    s.resume(&3);
    assert_eq!(h.join().unwrap(), 2);
    s.resume(&3);
    assert_eq!(ran(&log, 3), [1, 2]);
}

#[test]
fn panic_policy_pause_key_stops_the_key_at_the_failed_task() {
    for workers in [1, 2] {
        let s = Builder::<u32>::new()
            .workers(workers)
            .panic_policy(PanicPolicy::PauseKey)
            .build()
            .unwrap();
        let log = Log::default();
        let gate = block_worker(&s, 5);
        let before = logged(&s, &log, 5, 0);
        let failed = s.submit(5, || -> u32 { panic!("bad event") }).unwrap();
        let after: Vec<_> = (1..4).map(|i| logged(&s, &log, 5, i)).collect();
        let other = logged(&s, &log, 6, 0);
        drop(gate);
        assert_eq!(before.join().unwrap(), 0);
        assert!(matches!(failed.join(), Err(TaskError::Panicked(_))));
        assert_eq!(other.join().unwrap(), 0, "other keys go on");
        std::thread::sleep(SETTLE);
        assert_eq!(
            ran(&log, 5),
            [0],
            "{workers} workers: a task ran past the failure"
        );
        s.resume(&5);
        let values: Vec<u32> = after.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(values, [1, 2, 3]);
        let st = s.stats();
        assert_eq!((st.completed, st.panicked), (7, 1));
    }
}

#[test]
fn panic_policy_pause_key_also_for_a_panicking_future() {
    let s = Builder::<u32>::new()
        .workers(2)
        .panic_policy(PanicPolicy::PauseKey)
        .build()
        .unwrap();
    let failed = s
        .submit_async(1, async {
            if true {
                panic!("bad future");
            }
        })
        .unwrap();
    assert!(matches!(failed.join(), Err(TaskError::Panicked(_))));
    let next = s.submit_async(1, async { 2 }).unwrap();
    std::thread::sleep(SETTLE);
    assert!(!next.is_finished());
    s.resume(&1);
    assert_eq!(next.join().unwrap(), 2);
}

#[test]
fn continue_is_the_default_policy() {
    let s: Serializer<u32> = Serializer::new();
    let failed = s.submit(1, || -> u32 { panic!("boom") }).unwrap();
    let next = s.submit(1, || 3).unwrap();
    assert!(failed.join().is_err());
    assert_eq!(next.join().unwrap(), 3);
}

#[test]
fn shutdown_cancels_what_paused_keys_hold_when_it_terminates() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let log = Log::default();
    s.pause(&1);
    let held: Vec<_> = (0..3).map(|i| logged(&s, &log, 1, i)).collect();
    let runs: Vec<_> = (0..3).map(|i| logged(&s, &log, 2, i)).collect();
    s.shutdown();
    assert!(
        s.await_termination(LONG),
        "a paused key held up termination"
    );
    for h in runs {
        h.join().unwrap();
    }
    for h in held {
        assert!(matches!(h.join(), Err(TaskError::Cancelled)));
    }
    assert!(ran(&log, 1).is_empty());
    let st = s.stats();
    assert_eq!((st.completed, st.queued, st.running), (3, 0, 0));
}

#[test]
fn dropping_a_serializer_with_a_paused_key_returns() {
    let log = Log::default();
    let held = {
        let s = Builder::<u32>::new().workers(1).build().unwrap();
        s.pause(&1);
        s.pause(&2); // no tasks at all
        logged(&s, &log, 1, 0)
    };
    assert!(matches!(held.join(), Err(TaskError::Cancelled)));
}

#[test]
fn shutdown_now_hands_back_a_paused_keys_tasks_in_order() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let log = Log::default();
    s.pause(&1);
    let held: Vec<_> = (0..4).map(|i| logged(&s, &log, 1, i)).collect();
    // Let the router move them onto the parked chain.
    std::thread::sleep(SETTLE);
    let back = s.shutdown_now();
    assert_eq!(back.len(), 4);
    assert!(back.iter().all(|p| p.key() == Some(&1)));
    for p in back {
        p.run();
    }
    let values: Vec<u32> = held.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(values, [0, 1, 2, 3]);
    assert!(s.await_termination(LONG));
}

#[test]
fn a_pending_future_of_a_paused_key_finishes_and_the_next_task_waits() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let (tx, rx) = futures_channel();
    let started = Arc::new(AtomicUsize::new(0));
    let st = started.clone();
    let running = s
        .submit_async(1, async move {
            st.fetch_add(1, SeqCst);
            rx.await;
            "future done"
        })
        .unwrap();
    assert!(wait_until(LONG, || started.load(SeqCst) == 1));
    let next = s.submit(1, || "next").unwrap();
    s.pause(&1);
    tx.fire();
    assert_eq!(running.join().unwrap(), "future done");
    std::thread::sleep(SETTLE);
    assert!(!next.is_finished());
    s.resume(&1);
    assert_eq!(next.join().unwrap(), "next");
}

#[test]
fn pause_and_resume_racing_submits_lose_reorder_and_double_nothing() {
    const KEYS: u32 = 8;
    const PER_KEY: u32 = 2_000;
    let s = Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
    let log = Log::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let toggler = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut k = 0;
            while !stop.load(SeqCst) {
                s.pause(&(k % KEYS));
                std::thread::yield_now();
                s.resume(&(k % KEYS));
                k += 1;
            }
        })
    };
    let submitters: Vec<_> = (0..2)
        .map(|t| {
            let (s, log) = (s.clone(), log.clone());
            std::thread::spawn(move || {
                let mut handles = Vec::new();
                for i in 0..PER_KEY {
                    for k in (t * KEYS / 2)..((t + 1) * KEYS / 2) {
                        handles.push(logged(&s, &log, k, i));
                    }
                }
                handles
            })
        })
        .collect();
    let handles: Vec<_> = submitters
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    stop.store(true, SeqCst);
    toggler.join().unwrap();
    for k in 0..KEYS {
        s.resume(&k);
    }
    assert_eq!(handles.len() as u32, KEYS * PER_KEY);
    for h in handles {
        h.join().unwrap();
    }
    for k in 0..KEYS {
        assert_eq!(ran(&log, k), (0..PER_KEY).collect::<Vec<_>>(), "key {k}");
    }
    assert_eq!(s.stats().completed, u64::from(KEYS * PER_KEY));
}

/// A one-shot future signal, fired from another thread (no extra dependency).
fn futures_channel() -> (Fire, Signal) {
    let shared = Arc::new(Mutex::new((false, None::<std::task::Waker>)));
    (Fire(shared.clone()), Signal(shared))
}

struct Fire(Arc<Mutex<(bool, Option<std::task::Waker>)>>);
impl Fire {
    fn fire(self) {
        let waker = {
            let mut g = self.0.lock().unwrap();
            g.0 = true;
            g.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

struct Signal(Arc<Mutex<(bool, Option<std::task::Waker>)>>);
impl std::future::Future for Signal {
    type Output = ();
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let mut g = self.0.lock().unwrap();
        if g.0 {
            std::task::Poll::Ready(())
        } else {
            g.1 = Some(cx.waker().clone());
            std::task::Poll::Pending
        }
    }
}
