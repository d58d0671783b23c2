//! Futures as tasks (`submit_async`): in order with the key's closures, polled on the workers,
//! holding no worker while pending, woken from anywhere any number of times, and handled by the
//! shutdown family as the contract says.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use keyserial::{Builder, RejectReason, Serializer, TaskError};

mod common;
use common::{block_worker, wait_until};

/// A future that is pending until [`Opener::open`] is called (from any thread), counting its
/// polls and checking that no two polls overlap.
struct Gate {
    shared: Arc<GateState>,
}

#[derive(Default)]
struct GateState {
    inner: Mutex<(bool, Vec<Waker>)>,
    polls: AtomicUsize,
    polling: AtomicUsize,
    overlaps: AtomicUsize,
}

#[derive(Clone)]
struct Opener(Arc<GateState>);

impl Opener {
    fn open(&self) {
        let wakers = {
            let mut g = self.0.inner.lock().unwrap();
            g.0 = true;
            std::mem::take(&mut g.1)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Wakes every waker seen so far without opening (a spurious wake), keeping them.
    fn poke(&self) {
        let wakers = self.0.inner.lock().unwrap().1.clone();
        for w in wakers {
            w.wake_by_ref();
        }
    }

    fn polls(&self) -> usize {
        self.0.polls.load(SeqCst)
    }
}

fn gate() -> (Gate, Opener) {
    let shared = Arc::new(GateState::default());
    (
        Gate {
            shared: shared.clone(),
        },
        Opener(shared),
    )
}

impl Future for Gate {
    type Output = usize;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
        let s = &self.shared;
        if s.polling.fetch_add(1, SeqCst) != 0 {
            s.overlaps.fetch_add(1, SeqCst);
        }
        let polls = s.polls.fetch_add(1, SeqCst) + 1;
        std::thread::yield_now();
        let ready = {
            let mut g = s.inner.lock().unwrap();
            if !g.0 {
                g.1.push(cx.waker().clone());
            }
            g.0
        };
        s.polling.fetch_sub(1, SeqCst);
        if ready {
            Poll::Ready(polls)
        } else {
            Poll::Pending
        }
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn futures_and_closures_of_a_key_run_in_submission_order() {
    let s: Serializer<u32> = Builder::new().workers(2).build().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut openers = Vec::new();
    let mut handles = Vec::new();
    for i in 0..20u32 {
        let log = log.clone();
        if i % 2 == 0 {
            let (g, o) = gate();
            openers.push(o);
            handles.push(
                s.submit_async(7, async move {
                    log.lock().unwrap().push((i, "start"));
                    g.await;
                    log.lock().unwrap().push((i, "end"));
                })
                .unwrap(),
            );
        } else {
            handles.push(
                s.submit(7, move || log.lock().unwrap().push((i, "closure")))
                    .unwrap(),
            );
        }
    }
    // Open the gates out of order, from another thread, while the key waits.
    let t = std::thread::spawn(move || {
        for o in openers.iter().rev() {
            std::thread::sleep(Duration::from_millis(2));
            o.open();
        }
    });
    for h in handles {
        h.join().unwrap();
    }
    t.join().unwrap();
    let log = log.lock().unwrap();
    let mut want = Vec::new();
    for i in 0..20u32 {
        if i % 2 == 0 {
            want.push((i, "start"));
            want.push((i, "end"));
        } else {
            want.push((i, "closure"));
        }
    }
    assert_eq!(
        *log, want,
        "a key's tasks, futures included, ran one after another in order"
    );
}

#[test]
fn a_pending_future_holds_no_worker() {
    // One worker: while key 1's future waits, key 2's closures still run.
    let s: Serializer<u32> = Builder::new().workers(1).build().unwrap();
    let (g, opener) = gate();
    let fut = s.submit_async(1, g).unwrap();
    assert!(
        wait_until(secs(5), || opener.polls() == 1),
        "the future was polled"
    );
    let st = s.stats();
    assert_eq!(st.running, 1, "a started pending future counts as running");
    assert_eq!(st.queued, 0);
    let behind = s.submit(1, || "after the future").unwrap();
    for k in 2..50u32 {
        assert_eq!(s.submit(k, move || k * 2).unwrap().join().unwrap(), k * 2);
    }
    assert!(!behind.is_finished(), "key 1 waits for its future");
    opener.open();
    assert_eq!(fut.join().unwrap(), 2, "polled once pending, once ready");
    assert_eq!(behind.join().unwrap(), "after the future");
    s.shutdown();
    assert!(s.await_termination(secs(5)));
    let st = s.stats();
    assert_eq!((st.queued, st.running, st.completed), (0, 0, 50));
}

#[test]
fn wakers_from_many_threads_many_times_never_poll_twice_at_once() {
    let s: Serializer<u32> = Builder::new().workers(2).build().unwrap();
    let mut futs = Vec::new();
    let mut openers = Vec::new();
    for k in 0..8u32 {
        let (g, o) = gate();
        openers.push((o, g.shared.clone()));
        futs.push(s.submit_async(k, g).unwrap());
    }
    assert!(wait_until(secs(5), || openers
        .iter()
        .all(|(o, _)| o.polls() >= 1)));
    // Spurious wakes from four threads at once, then the real one, then more after completion.
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..200 {
                    for (o, _) in &openers {
                        o.poke();
                    }
                }
            });
        }
    });
    for (o, _) in &openers {
        o.open();
    }
    for f in futs {
        f.join().unwrap();
    }
    for (o, state) in &openers {
        o.poke();
        o.poke();
        assert_eq!(
            state.overlaps.load(SeqCst),
            0,
            "never polled by two threads at once"
        );
    }
    drop(s);
    // Wakes after the serializer is gone do nothing.
    for (o, _) in &openers {
        o.poke();
    }
}

#[test]
fn a_panic_in_poll_fails_the_handle_and_the_key_goes_on() {
    let s: Serializer<u32> = Builder::new().workers(1).build().unwrap();
    std::panic::set_hook(Box::new(|_| {}));
    let bad = s
        .submit_async(1, async {
            std::future::ready(()).await;
            panic!("boom in poll");
        })
        .unwrap();
    let next = s.submit_async(1, async { "next" }).unwrap();
    let _ = std::panic::take_hook();
    match bad.join() {
        Err(TaskError::Panicked(p)) => assert_eq!(p.message(), Some("boom in poll")),
        other => panic!("expected Panicked, got {other:?}"),
    }
    assert_eq!(next.join().unwrap(), "next");
    assert_eq!(s.stats().panicked, 1);
}

#[test]
fn shutdown_lets_started_futures_finish() {
    let s: Serializer<u32> = Builder::new().workers(1).build().unwrap();
    let (g, opener) = gate();
    let fut = s.submit_async(1, g).unwrap();
    let behind = s.submit(1, || "behind").unwrap();
    assert!(wait_until(secs(5), || opener.polls() == 1));
    s.shutdown();
    assert!(
        !s.await_termination(Duration::from_millis(50)),
        "the future is still pending"
    );
    assert!(matches!(
        s.submit_async(2, async {}).unwrap_err().reason,
        RejectReason::Shutdown
    ));
    opener.open();
    assert!(s.await_termination(secs(5)));
    assert_eq!(fut.join().unwrap(), 2);
    assert_eq!(behind.join().unwrap(), "behind");
}

#[test]
fn shutdown_now_cancels_started_futures_and_hands_back_unstarted_ones() {
    let s: Serializer<u32> = Builder::new().workers(1).build().unwrap();
    let (g, opener) = gate();
    let started = s.submit_async(1, g).unwrap();
    assert!(wait_until(secs(5), || opener.polls() == 1));
    let behind = s.submit_async(1, async { "ran by hand" }).unwrap();
    let release = block_worker(&s, 9);
    let unstarted = s.submit_async(2, async { 2 + 2 }).unwrap();
    let pending = s.shutdown_now();
    assert_eq!(pending.len(), 2, "key 1's waiting future and key 2's");
    assert!(matches!(started.join(), Err(TaskError::Cancelled)));
    for p in pending {
        p.run(); // drives the future to completion here
    }
    assert_eq!(behind.join().unwrap(), "ran by hand");
    assert_eq!(unstarted.join().unwrap(), 4);
    drop(release);
    opener.open(); // a waker after the cancellation does nothing
    assert!(s.await_termination(secs(5)));
    let st = s.stats();
    assert_eq!((st.queued, st.running), (0, 0), "{st:?}");
}

#[test]
fn try_submit_async_hands_the_future_back_when_full() {
    let s: Serializer<u32> = Builder::new().workers(1).capacity(1).build().unwrap();
    let release = block_worker(&s, 1);
    let queued = s.try_submit_async(2, async { 1 }).unwrap();
    let full = s.try_submit_async(3, async { 2 }).unwrap_err();
    assert_eq!(full.reason, RejectReason::Full);
    drop(release);
    assert_eq!(queued.join().unwrap(), 1);
    assert_eq!(
        futures_block_on(full.task),
        2,
        "the rejected future came back whole"
    );
}

/// A minimal `block_on` for the test itself.
fn futures_block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark()
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            return v;
        }
        std::thread::park();
    }
}

#[test]
fn execute_async_runs_in_order_with_closures_and_shutdown_now_hands_back_or_drops_it() {
    let s: Serializer<u32> = Builder::new().workers(1).build().unwrap();
    let log: Arc<Mutex<Vec<&str>>> = Arc::default();
    let (g, opener) = gate();
    let l = log.clone();
    s.execute_async(1, async move {
        g.await;
        l.lock().unwrap().push("future");
    })
    .unwrap();
    let l = log.clone();
    let closure = s
        .submit(1, move || l.lock().unwrap().push("closure"))
        .unwrap();
    assert!(wait_until(secs(5), || opener.polls() == 1));
    assert_eq!(s.stats().running, 1, "a pending future counts as running");
    opener.open();
    closure.join().unwrap();
    assert_eq!(*log.lock().unwrap(), ["future", "closure"]);

    // A started, pending one is dropped by shutdown_now; an unstarted one comes back and runs.
    let dropped = Arc::new(AtomicUsize::new(0));
    struct CountDrop(Arc<AtomicUsize>);
    impl Drop for CountDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }
    let (g2, opener2) = gate();
    let guard = CountDrop(dropped.clone());
    s.execute_async(2, async move {
        let _guard = guard;
        g2.await;
    })
    .unwrap();
    assert!(wait_until(secs(5), || opener2.polls() == 1));
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    s.execute_async(2, async move {
        r.fetch_add(1, SeqCst);
    })
    .unwrap();
    let pending = s.shutdown_now();
    assert_eq!(pending.len(), 1, "the unstarted future only");
    // Dropped by shutdown_now, or (if its first poll was still running) by its worker as the
    // poll returns.
    assert!(
        wait_until(secs(5), || dropped.load(SeqCst) == 1),
        "the started one was dropped"
    );
    for p in pending {
        p.run();
    }
    assert_eq!(ran.load(SeqCst), 1);
    opener2.open(); // its waker, after the drop: nothing
    assert!(s.await_termination(secs(5)));
    let err = s.execute_async(3, async {}).unwrap_err();
    assert_eq!(err.reason, RejectReason::Shutdown);
}
