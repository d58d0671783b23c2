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

// ---------------------------------------------------------------------------------------------
// key_stats, busiest_keys

#[test]
fn key_stats_counts_what_waits_behind_a_running_task() {
    for workers in [1, 2] {
        let s = Builder::<u32>::new().workers(workers).build().unwrap();
        assert_eq!(s.key_stats(&1), None, "not live");
        let gate = block_worker(&s, 1);
        let log = Log::default();
        let queued: Vec<_> = (0..3).map(|i| logged(&s, &log, 1, i)).collect();
        // With two workers, the idle one may take the lane over and defer key 1's tasks.
        std::thread::sleep(Duration::from_millis(5));
        let st = s.key_stats(&1).expect("live");
        assert_eq!(
            (st.queued, st.running, st.paused),
            (3, true, false),
            "{workers} workers"
        );
        assert_eq!(s.key_stats(&2), None);
        drop(gate);
        for h in queued {
            h.join().unwrap();
        }
        assert!(wait_until(LONG, || s
            .key_stats(&1)
            .is_none_or(|st| st.queued == 0 && !st.running)));
    }
}

#[test]
fn key_stats_of_a_paused_key_shows_its_queue_and_its_age() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    s.pause(&4);
    let st = s.key_stats(&4).expect("a paused key is live");
    assert_eq!(
        (st.queued, st.running, st.paused, st.oldest_queued),
        (0, false, true, None)
    );
    let log = Log::default();
    let held: Vec<_> = (0..4).map(|i| logged(&s, &log, 4, i)).collect();
    std::thread::sleep(SETTLE);
    let st = s.key_stats(&4).unwrap();
    assert_eq!((st.queued, st.running, st.paused), (4, false, true));
    let age = st.oldest_queued.expect("queued on the key's own queue");
    assert!(age >= Duration::from_millis(30), "{age:?}");
    s.resume(&4);
    for h in held {
        h.join().unwrap();
    }
    let st = s.key_stats(&4).map(|st| (st.queued, st.paused));
    assert!(matches!(st, None | Some((0, false))), "{st:?}");
}

/// Issue "Baton": `oldest_queued` of tasks waiting in the key's lane behind the key's own
/// running task (the most common backlog) was `None` (checked on 752b82c: this test failed with
/// "queued in its lane" there).
#[test]
fn key_stats_ages_tasks_waiting_in_the_lane_behind_the_keys_running_task() {
    for workers in [1, 2, 4] {
        let s = Builder::<u32>::new().workers(workers).build().unwrap();
        let gate = block_worker(&s, 7);
        let start = std::time::Instant::now();
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..3 {
            let ran = ran.clone();
            s.execute(7, move || {
                ran.fetch_add(1, SeqCst);
            })
            .unwrap();
        }
        // A first look marks the lane now, if nobody (every worker inside a task) did.
        let _ = s.key_stats(&7);
        std::thread::sleep(Duration::from_millis(40));
        let st = s.key_stats(&7).expect("live");
        assert_eq!((st.queued, st.running), (3, true), "{workers} workers");
        let age = st.oldest_queued.expect("queued in its lane");
        assert!(
            age >= Duration::from_millis(35) && age <= start.elapsed(),
            "{workers} workers: {age:?} (submitted {:?} ago)",
            start.elapsed()
        );
        drop(gate);
        assert!(wait_until(LONG, || ran.load(SeqCst) == 3));
        assert!(wait_until(LONG, || s
            .key_stats(&7)
            .is_none_or(|st| st.queued == 0 && st.oldest_queued.is_none())));
    }
}

/// With a free worker looking at the lanes, the age needs no earlier look: the lanes are marked
/// as they wait, to within about a millisecond.
#[test]
fn key_stats_ages_a_lane_backlog_without_an_earlier_look() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let gate = block_worker(&s, 7);
    let start = std::time::Instant::now();
    for _ in 0..3 {
        s.execute(7, || ()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(40));
    let st = s.key_stats(&7).expect("live");
    assert_eq!(st.queued, 3);
    let age = st.oldest_queued.expect("queued behind its running task");
    assert!(
        age >= Duration::from_millis(30) && age <= start.elapsed(),
        "{age:?} (submitted {:?} ago)",
        start.elapsed()
    );
    drop(gate);
}

#[test]
fn busiest_keys_lists_the_longest_queues_first() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let log = Log::default();
    for k in 1..=4 {
        s.pause(&k);
    }
    let mut handles = Vec::new();
    for (k, n) in [(1, 2), (2, 7), (3, 4), (4, 0)] {
        for i in 0..n {
            handles.push(logged(&s, &log, k, i));
        }
    }
    // A key whose tasks still wait behind its own running task, in its lane, counts too.
    let gate = block_worker(&s, 5);
    for i in 0..5 {
        handles.push(logged(&s, &log, 5, i));
    }
    let top = s.busiest_keys(3);
    let got: Vec<(u32, usize)> = top.iter().map(|(k, st)| (*k, st.queued)).collect();
    assert_eq!(got, [(2, 7), (5, 5), (3, 4)]);
    assert!(top[1].1.running && !top[1].1.paused);
    assert_eq!(s.busiest_keys(10).len(), 4, "key 4 has nothing queued");
    assert!(s.busiest_keys(0).is_empty());
    drop(gate);
    for k in 1..=4 {
        s.resume(&k);
    }
    for h in handles {
        h.join().unwrap();
    }
    assert!(s.busiest_keys(10).is_empty());
}

// ---------------------------------------------------------------------------------------------
// cancel_key

/// Runs or drops handed-back tasks and checks what their handles say.
fn settle(back: Vec<keyserial::PendingTask<u32>>, run: bool) {
    for p in back {
        if run {
            p.run();
        }
    }
}

#[test]
fn cancel_key_hands_back_what_waits_behind_the_running_task_in_order() {
    for workers in [1, 2] {
        let s = Builder::<u32>::new().workers(workers).build().unwrap();
        let log = Log::default();
        let gate = block_worker(&s, 1);
        let queued: Vec<_> = (0..4).map(|i| logged(&s, &log, 1, i)).collect();
        let other = logged(&s, &log, 2, 0);
        std::thread::sleep(Duration::from_millis(5));
        let back = s.cancel_key(&1);
        assert_eq!(back.len(), 4, "{workers} workers");
        assert!(back.iter().all(|p| p.key() == Some(&1)));
        // Later submissions go on as usual, after the running task.
        let later = logged(&s, &log, 1, 10);
        drop(gate);
        assert_eq!(later.join().unwrap(), 10);
        assert_eq!(other.join().unwrap(), 0);
        // Run the first two here, in order; drop the others.
        let mut back = back.into_iter();
        back.next().unwrap().run();
        back.next().unwrap().run();
        drop(back);
        let results: Vec<_> = queued.into_iter().map(|h| h.join()).collect();
        assert_eq!(results[0].as_ref().ok(), Some(&0));
        assert_eq!(results[1].as_ref().ok(), Some(&1));
        assert!(results[2..]
            .iter()
            .all(|r| matches!(r, Err(TaskError::Cancelled))));
        assert_eq!(ran(&log, 1), [10, 0, 1]);
        let st = s.stats();
        assert_eq!((st.queued, st.running), (0, 0));
        assert_eq!(
            st.completed, 3,
            "the blocker, `later` and `other` ran on the serializer"
        );
    }
}

#[test]
fn cancel_key_of_a_paused_key_takes_its_queue_and_it_stays_paused() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let log = Log::default();
    s.pause(&3);
    let held: Vec<_> = (0..5).map(|i| logged(&s, &log, 3, i)).collect();
    std::thread::sleep(SETTLE);
    let back = s.cancel_key(&3);
    assert_eq!(back.len(), 5);
    assert_eq!(
        s.key_stats(&3).map(|st| (st.queued, st.paused)),
        Some((0, true))
    );
    let later = logged(&s, &log, 3, 9);
    std::thread::sleep(SETTLE);
    assert!(!later.is_finished(), "still paused");
    settle(back, true);
    let values: Vec<u32> = held.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(values, [0, 1, 2, 3, 4]);
    s.resume(&3);
    assert_eq!(later.join().unwrap(), 9);
}

#[test]
fn cancel_key_takes_a_task_parked_on_permits_and_those_behind_it() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let sem = keyserial::Semaphore::new(1);
    let permit = sem.try_acquire(1).unwrap();
    let log = Log::default();
    let l = log.clone();
    let gated = s
        .submit_with_permits(6, &sem, 1, move || {
            l.lock().unwrap().push((6, 100));
            100
        })
        .unwrap();
    let behind: Vec<_> = (0..3).map(|i| logged(&s, &log, 6, i)).collect();
    std::thread::sleep(SETTLE);
    let back = s.cancel_key(&6);
    assert_eq!(back.len(), 4);
    drop(back);
    assert!(matches!(gated.join(), Err(TaskError::Cancelled)));
    for h in behind {
        assert!(matches!(h.join(), Err(TaskError::Cancelled)));
    }
    // The withdrawn request does not hold the permit up: the next waiter gets it.
    drop(permit);
    let next = s.submit_with_permits(6, &sem, 1, || 7).unwrap();
    assert_eq!(next.join().unwrap(), 7);
    assert!(ran(&log, 6).is_empty());
}

#[test]
fn cancel_key_waits_for_a_pending_future_and_takes_what_is_behind_it() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let (fire, signal) = futures_channel();
    let started = Arc::new(AtomicUsize::new(0));
    let st = started.clone();
    let running = s
        .submit_async(8, async move {
            st.fetch_add(1, SeqCst);
            signal.await;
            "done"
        })
        .unwrap();
    assert!(wait_until(LONG, || started.load(SeqCst) == 1));
    let behind: Vec<_> = (0..3).map(|i| s.submit(8, move || i).unwrap()).collect();
    std::thread::sleep(SETTLE);
    // The pending future is the key's running task: cancel_key waits for it to complete.
    let firing = std::thread::spawn(move || {
        std::thread::sleep(SETTLE);
        fire.fire();
    });
    let back = s.cancel_key(&8);
    assert_eq!(back.len(), 3);
    drop(back);
    firing.join().unwrap();
    assert_eq!(running.join().unwrap(), "done");
    for h in behind {
        assert!(matches!(h.join(), Err(TaskError::Cancelled)));
    }
    assert_eq!(s.submit(8, || 1).unwrap().join().unwrap(), 1);
}

#[test]
fn cancel_key_from_inside_the_keys_own_task() {
    let s = Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
    // Paused then resumed with a backlog: the key's tasks run from its own queue.
    s.pause(&1);
    let s2 = s.clone();
    let first = s.submit(1, move || s2.cancel_key(&1).len()).unwrap();
    let behind: Vec<_> = (0..3).map(|i| s.submit(1, move || i).unwrap()).collect();
    std::thread::sleep(SETTLE);
    s.resume(&1);
    assert_eq!(
        first.join().unwrap(),
        3,
        "took what was behind it, without waiting for itself"
    );
    for h in behind {
        assert!(matches!(h.join(), Err(TaskError::Cancelled)));
    }
    // And from a task run straight from its lane.
    let s3 = s.clone();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let direct = s
        .submit(2, move || {
            rx.recv().unwrap();
            s3.cancel_key(&2).len()
        })
        .unwrap();
    let behind: Vec<_> = (0..2).map(|i| s.submit(2, move || i).unwrap()).collect();
    tx.send(()).unwrap();
    assert_eq!(direct.join().unwrap(), 2);
    for h in behind {
        assert!(matches!(h.join(), Err(TaskError::Cancelled)));
    }
}

#[test]
fn cancel_key_of_an_unknown_key_returns_nothing() {
    let s: Serializer<u32> = Serializer::new();
    assert!(s.cancel_key(&42).is_empty());
    assert_eq!(s.submit(42, || 1).unwrap().join().unwrap(), 1);
}

#[test]
fn cancel_key_racing_submits_and_workers_accounts_for_every_task() {
    const KEYS: u32 = 4;
    const PER_KEY: u32 = 3_000;
    let s = Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
    let log = Log::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let canceller = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut back = Vec::new();
            let mut k = 0;
            while !stop.load(SeqCst) {
                back.extend(s.cancel_key(&(k % KEYS)));
                k += 1;
                std::thread::yield_now();
            }
            back
        })
    };
    let mut handles = Vec::new();
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            handles.push(logged(&s, &log, k, i));
        }
    }
    stop.store(true, SeqCst);
    let back = canceller.join().unwrap();
    let n_back = back.len();
    drop(back);
    let (mut ok, mut cancelled) = (0, 0);
    for h in handles {
        match h.join() {
            Ok(_) => ok += 1,
            Err(TaskError::Cancelled) => cancelled += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(
        cancelled, n_back,
        "every handed-back task, and only those, was cancelled"
    );
    assert_eq!(ok + cancelled, (KEYS * PER_KEY) as usize);
    for k in 0..KEYS {
        let r = ran(&log, k);
        assert!(
            r.windows(2).all(|w| w[0] < w[1]),
            "key {k} ran out of order"
        );
    }
    let st = s.stats();
    assert_eq!(st.completed as usize, ok);
    assert_eq!((st.queued, st.running), (0, 0));
}

#[test]
fn cancel_key_from_another_task_never_waits_for_long() {
    // One worker: a task of key 1 cancels key 2, whose queue sits on the ready queue that only
    // this (busy) worker would drain: it gives up and takes nothing, instead of a deadlock.
    let s = Arc::new(Builder::<u32>::new().workers(1).build().unwrap());
    s.pause(&2);
    let queued: Vec<_> = (0..2).map(|i| s.submit(2, move || i).unwrap()).collect();
    std::thread::sleep(SETTLE);
    s.resume(&2); // key 2's chain goes to the ready queue
    let inner = s.clone();
    let n = s.submit(1, move || inner.cancel_key(&2).len()).unwrap();
    let got = n.join().unwrap();
    let results: Vec<_> = queued.into_iter().map(|h| h.join()).collect();
    // Either it took the two (the worker drained nothing yet and the chain was claimable) or it
    // gave up; never a hang, and every task ran once or was handed back.
    let ran = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ran + got, 2, "{results:?}");
}
