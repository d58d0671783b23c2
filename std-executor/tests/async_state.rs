//! `submit_async_with_state` (DESIGN 3.1c): a future that owns its key's state while it runs.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use common::{block_worker, wait_until};
use keyserial::{Builder, TaskError};

/// Pending `n` times (waking itself each time), then ready.
struct YieldN(u32);

impl Future for YieldN {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 == 0 {
            return Poll::Ready(());
        }
        self.0 -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

const SECS: Duration = Duration::from_secs(10);

/// An idle timeout far past any test: a key (and its state) must stay live between its tasks
/// even when a panic's backtrace, printed on a loaded machine, outlasts the default 100 ms.
const IDLE: Duration = Duration::from_secs(600);

/// The future gets the key's state by value and gives it back; nothing else of the key runs
/// until it completes (its yields let other keys run, never its own), and the key's state and
/// plain tasks see everything in submission order.
#[test]
fn the_future_owns_the_state_and_the_key_waits_for_it() {
    let s = Builder::<u32>::new()
        .key_idle_timeout(IDLE)
        .workers(2)
        .key_state(|_| Vec::<String>::new())
        .build()
        .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for round in 0..20u32 {
        for key in 0..8u32 {
            let l = log.clone();
            handles.push(
                s.submit_async_with_state(key, move |mut st: Vec<String>| async move {
                    l.lock().unwrap().push((key, format!("start {round}")));
                    YieldN(3).await;
                    st.push(format!("async {round}"));
                    l.lock().unwrap().push((key, format!("end {round}")));
                    (st, round)
                })
                .unwrap(),
            );
            let l = log.clone();
            s.execute(key, move || {
                l.lock().unwrap().push((key, format!("plain {round}")))
            })
            .unwrap();
            drop(
                s.submit_with_state(key, move |st: &mut Vec<String>| {
                    st.push(format!("sync {round}"))
                })
                .unwrap(),
            );
        }
    }
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), (i / 8) as u32);
    }
    for key in 0..8u32 {
        let st = s
            .submit_with_state(key, |st: &mut Vec<String>| st.clone())
            .unwrap()
            .join()
            .unwrap();
        let want: Vec<String> = (0..20)
            .flat_map(|r| [format!("async {r}"), format!("sync {r}")])
            .collect();
        assert_eq!(st, want, "key {key}'s state, in order");
        let seen: Vec<String> = log
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, e)| e.clone())
            .collect();
        let want: Vec<String> = (0..20)
            .flat_map(|r| {
                [
                    format!("start {r}"),
                    format!("end {r}"),
                    format!("plain {r}"),
                ]
            })
            .collect();
        assert_eq!(
            seen, want,
            "key {key}: nothing between a future's start and end"
        );
    }
    s.shutdown();
    assert!(s.await_termination(SECS));
    assert_eq!(s.stats().completed, 20 * 8 * 3 + 8);
}

/// A serializer without `key_state` gives `()`.
#[test]
fn without_key_state_the_state_is_unit() {
    let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
    let h = s
        .submit_async_with_state(1, |unit: ()| async move { (unit, "ran") })
        .unwrap();
    assert_eq!(h.join().unwrap(), "ran");
}

/// A panic in `f` or in the future's `poll` loses that state: the next state task gets a
/// fresh one from `init`, the hook never sees the lost ones, and the key goes on.
#[test]
fn a_panic_loses_only_that_keys_state() {
    let inits = Arc::new(AtomicU32::new(0));
    let released = Arc::new(Mutex::new(Vec::new()));
    let (i2, r2) = (inits.clone(), released.clone());
    let s = Builder::<u32>::new()
        .key_idle_timeout(IDLE)
        .workers(1)
        .key_state(move |_| (i2.fetch_add(1, Ordering::SeqCst), 0u32)) // (serial, count)
        .on_key_release(move |k, st| r2.lock().unwrap().push((k, st)))
        .build()
        .unwrap();
    let bump = |st: &mut (u32, u32)| {
        st.1 += 1;
        *st
    };
    assert_eq!(
        s.submit_with_state(1, bump).unwrap().join().unwrap(),
        (0, 1)
    );
    assert_eq!(
        s.submit_with_state(2, bump).unwrap().join().unwrap(),
        (1, 1)
    );
    // A panic in `f`: key 1's state 0 is lost.
    let in_f = s
        .submit_async_with_state(
            1,
            |_st: (u32, u32)| -> std::future::Ready<((u32, u32), ())> { panic!("in f") },
        )
        .unwrap();
    assert!(matches!(in_f.join(), Err(TaskError::Panicked(_))));
    assert_eq!(
        s.submit_with_state(1, bump).unwrap().join().unwrap(),
        (2, 1),
        "fresh"
    );
    // A panic in `poll`, after a yield: state 2 is lost.
    let in_poll = s
        .submit_async_with_state(1, |st: (u32, u32)| async move {
            YieldN(2).await;
            if st.1 > 0 {
                panic!("in poll");
            }
            (st, ())
        })
        .unwrap();
    assert!(matches!(in_poll.join(), Err(TaskError::Panicked(_))));
    assert_eq!(
        s.submit_with_state(1, bump).unwrap().join().unwrap(),
        (3, 1),
        "fresh"
    );
    // Key 2 kept its state throughout.
    assert_eq!(
        s.submit_with_state(2, bump).unwrap().join().unwrap(),
        (1, 2)
    );
    s.shutdown();
    assert!(s.await_termination(SECS));
    let mut released = released.lock().unwrap().clone();
    released.sort();
    assert_eq!(
        released,
        [(1, (3, 1)), (2, (1, 2))],
        "never a lost state, each once"
    );
    assert_eq!(inits.load(Ordering::SeqCst), 4);
    let st = s.stats();
    assert_eq!((st.completed, st.panicked), (7, 2));
}

/// A state whose drops are counted, by serial.
struct Tracked {
    serial: usize,
    dropped: Arc<Mutex<Vec<usize>>>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.dropped.lock().unwrap().push(self.serial);
    }
}

/// After `shutdown_now`: a started, pending one is dropped with its state (handle `Cancelled`,
/// no hook for that state); a not-started one is handed back and runs, when run, against the
/// key's handed-back state; every task ran once, was handed back, or had its handle resolved.
#[test]
fn shutdown_now_drops_a_started_one_with_its_state_and_hands_back_the_rest() {
    let serial = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(Mutex::new(Vec::new()));
    let released = Arc::new(Mutex::new(Vec::new()));
    let (n, d, r) = (serial.clone(), dropped.clone(), released.clone());
    let s = Builder::<u32>::new()
        .key_idle_timeout(IDLE)
        .workers(1)
        .key_state(move |_| Tracked {
            serial: n.fetch_add(1, Ordering::SeqCst),
            dropped: d.clone(),
        })
        .on_key_release(move |k, st: Tracked| r.lock().unwrap().push((k, st.serial)))
        .build()
        .unwrap();
    // Key 1: a future that takes state 0 and never completes.
    let started = Arc::new(AtomicUsize::new(0));
    let st2 = started.clone();
    let pending = s
        .submit_async_with_state(1, move |st: Tracked| async move {
            st2.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
            (st, ())
        })
        .unwrap();
    assert!(wait_until(SECS, || started.load(Ordering::SeqCst) == 1));
    let behind = s
        .submit_with_state(1, |st: &mut Tracked| st.serial)
        .unwrap();
    // Key 3: queued behind a busy worker, never started.
    let gate = block_worker(&s, 2);
    let queued = s
        .submit_async_with_state(3, |st: Tracked| async move {
            let serial = st.serial;
            (st, serial)
        })
        .unwrap();
    let back = s.shutdown_now();
    assert_eq!(back.len(), 2, "key 1's state task and key 3's future");
    assert!(matches!(pending.join(), Err(TaskError::Cancelled)));
    assert_eq!(
        *dropped.lock().unwrap(),
        [0],
        "state 0 dropped with its future"
    );
    for p in back {
        p.run();
    }
    let (b, q) = (behind.join().unwrap(), queued.join().unwrap());
    assert!(
        b >= 1 && q >= 1 && b != q,
        "fresh states from init: {b} {q}"
    );
    drop(gate);
    assert!(s.await_termination(SECS));
    let mut released = released.lock().unwrap().clone();
    released.sort();
    assert_eq!(
        released,
        [(1, b), (3, q)],
        "hook once each, never for state 0"
    );
    assert_eq!(serial.load(Ordering::SeqCst), 3);
    let mut dropped = dropped.lock().unwrap().clone();
    dropped.sort();
    assert_eq!(dropped, [0, 1, 2], "every state dropped once");
}

/// `cancel_key` hands a not-started one back; run, it gets the key's live state.
#[test]
fn cancel_key_hands_one_back_that_runs_against_the_keys_state() {
    let s = Builder::<u32>::new()
        .key_idle_timeout(IDLE)
        .workers(1)
        .key_state(|_| 10u32)
        .build()
        .unwrap();
    s.submit_with_state(1, |n: &mut u32| *n += 1)
        .unwrap()
        .join()
        .unwrap();
    let gate = block_worker(&s, 1);
    let h = s
        .submit_async_with_state(1, |n: u32| async move { (n + 1, n) })
        .unwrap();
    let back = s.cancel_key(&1);
    assert_eq!(back.len(), 1);
    drop(gate);
    for p in back {
        p.run();
    }
    assert_eq!(h.join().unwrap(), 11);
    let now = s
        .submit_with_state(1, |n: &mut u32| *n)
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(
        now, 12,
        "the handed-back future's state went back to the key"
    );
}
