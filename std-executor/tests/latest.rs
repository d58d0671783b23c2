//! `submit_latest` coalesces at submit time: a superseded task releases its closure, its
//! capacity slot and its handle when it is superseded, so a blocked key holds at most one
//! pending latest task (issue 13, 1b).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keyserial::{Builder, RejectReason, Serializer, TaskError};

/// A key-1 task that blocks until the returned sender is dropped or sent to.
fn block_key(
    s: &Serializer<u32>,
    key: u32,
) -> (std::sync::mpsc::Sender<()>, keyserial::TaskHandle<()>) {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let h = s
        .submit(key, move || {
            let _ = rx.recv();
        })
        .unwrap();
    let start = Instant::now();
    while s.stats().running == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the blocker never started"
        );
        std::thread::yield_now();
    }
    (tx, h)
}

#[test]
fn latest_tasks_behind_a_blocked_key_do_not_fill_the_capacity() {
    let s = Builder::<u32>::new()
        .workers(1)
        .capacity(10)
        .build()
        .unwrap();
    let (release, blocker) = block_key(&s, 1);
    let mut handles = Vec::new();
    for i in 0..1_000u32 {
        // try_submit's cousin: submit_latest would block at capacity; it must never need to.
        handles.push(s.submit_latest(1, move || i).unwrap());
        if i > 0 {
            assert!(
                handles[i as usize - 1].is_finished(),
                "the superseded task resolves when it is superseded"
            );
        }
    }
    assert_eq!(s.stats().queued, 1, "one pending latest task");
    // The capacity is still there for other keys.
    let other = s
        .try_submit(2, || "other")
        .expect("capacity left for key 2");
    release.send(()).unwrap();
    blocker.join().unwrap();
    assert_eq!(other.join().unwrap(), "other");
    let last = handles.pop().unwrap();
    assert_eq!(last.join().unwrap(), 999);
    for h in handles {
        assert!(matches!(h.join(), Err(TaskError::Superseded)));
    }
}

#[test]
fn a_superseded_closure_is_dropped_at_once() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let (release, blocker) = block_key(&s, 1);
    let payload = Arc::new([0u8; 1024]);
    for _ in 0..100 {
        let p = payload.clone();
        drop(s.submit_latest(1, move || p.len()).unwrap());
    }
    assert_eq!(
        Arc::strong_count(&payload),
        2,
        "only the newest closure keeps its capture"
    );
    release.send(()).unwrap();
    blocker.join().unwrap();
    s.shutdown();
    assert!(s.await_termination(Duration::from_secs(10)));
    assert_eq!(Arc::strong_count(&payload), 1);
}

#[test]
fn only_the_immediately_preceding_latest_task_is_replaced() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let (release, blocker) = block_key(&s, 1);
    let log = Arc::new(Mutex::new(Vec::new()));
    let push = |name: &'static str| {
        let log = log.clone();
        move || log.lock().unwrap().push(name)
    };
    let a = s.submit_latest(1, push("a")).unwrap();
    let b = s.submit_latest(1, push("b")).unwrap(); // replaces a
    let c = s.submit(1, push("c")).unwrap(); // plain: b is no longer the newest
    let d = s.submit_latest(1, push("d")).unwrap(); // does not replace b (c came between)
    let e = s.submit_latest(1, push("e")).unwrap(); // replaces d
    assert!(matches!(a.join(), Err(TaskError::Superseded)));
    release.send(()).unwrap();
    blocker.join().unwrap();
    b.join().unwrap();
    c.join().unwrap();
    assert!(matches!(d.join(), Err(TaskError::Superseded)));
    e.join().unwrap();
    assert_eq!(*log.lock().unwrap(), ["b", "c", "e"]);
}

#[test]
fn latest_tasks_of_a_running_key_keep_order_and_the_newest_runs() {
    // Many latest submissions while the key keeps running: whatever is superseded, the runs
    // are in submission order and the last one always runs.
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for i in 0..if cfg!(miri) { 50 } else { 20_000 } {
        let seen = seen.clone();
        handles.push(
            s.submit_latest(7, move || seen.lock().unwrap().push(i))
                .unwrap(),
        );
    }
    let last = handles.pop().unwrap();
    last.join().unwrap();
    let mut superseded = 0;
    for h in handles {
        match h.join() {
            Ok(()) => {}
            Err(TaskError::Superseded) => superseded += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    let seen = seen.lock().unwrap();
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "in submission order");
    assert_eq!(
        seen.len() + superseded,
        if cfg!(miri) { 50 } else { 20_000 }
    );
    assert_eq!(*seen.last().unwrap(), if cfg!(miri) { 49 } else { 19_999 });
}

#[test]
fn shutdown_now_hands_back_a_pending_latest_task_and_releases_keys() {
    let s = Builder::<u32>::new()
        .workers(1)
        .key_idle_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    // Some keys that ran and went idle (kept for the idle timeout).
    for k in 100..200 {
        s.submit(k, || ()).unwrap().join().unwrap();
    }
    let (release, blocker) = block_key(&s, 1);
    let ran = Arc::new(AtomicUsize::new(0));
    for k in 2..300u32 {
        let ran = ran.clone();
        s.execute(k, move || {
            ran.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    }
    let latest = s.submit_latest(1, || "latest").unwrap();
    let pending = s.shutdown_now();
    assert_eq!(pending.len(), 299, "298 plain tasks and the latest one");
    assert!(pending.iter().any(|p| p.key() == Some(&1)));
    drop(pending);
    assert!(matches!(latest.join(), Err(TaskError::Cancelled)));
    release.send(()).unwrap();
    blocker.join().unwrap();
    assert!(s.await_termination(Duration::from_secs(10)));
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert_eq!(
        s.stats().active_keys,
        0,
        "handed-back and idle keys are released at termination"
    );
    assert_eq!(
        s.execute(1, || ()).unwrap_err().reason,
        RejectReason::Shutdown
    );
}
