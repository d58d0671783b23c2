//! `reserve(key).await` and `Reservation` (DESIGN 3.1c), and the blocking calls that panic on a
//! thread inside a tokio runtime when the serializer is bounded.
#![cfg(feature = "tokio")]

mod common;

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::{block_worker, wait_until, within};
use keyserial::{Builder, RejectReason, Semaphore, Serializer};

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Polls `fut` once with a waker that does nothing.
fn poll_once<F: Future + ?Sized>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

const SECS: Duration = Duration::from_secs(10);

/// Waiters get room in the order they started waiting, and a freed slot goes to the oldest
/// waiter, not to a `try_submit` that comes later.
#[test]
fn reserve_is_fair_in_arrival_order() {
    let s = Arc::new(
        Builder::<u32>::new()
            .workers(1)
            .capacity(2)
            .build()
            .unwrap(),
    );
    let gate = block_worker(&s, 0);
    let queued: Vec<_> = (0..2).map(|_| s.try_submit(0, || ()).unwrap()).collect();
    let rt = current_thread();
    let got = Arc::new(Mutex::new(Vec::new()));
    let ran = Arc::new(Mutex::new(Vec::new()));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..6u32 {
            let (s, got, ran) = (s.clone(), got.clone(), ran.clone());
            tasks.push(tokio::spawn(async move {
                let room = s.reserve(100).await.unwrap();
                got.lock().unwrap().push(i);
                room.submit(move || ran.lock().unwrap().push(i))
                    .unwrap()
                    .await
                    .unwrap();
            }));
            // Let it poll once, so that it waits before the next one starts.
            tokio::task::yield_now().await;
        }
        assert!(got.lock().unwrap().is_empty(), "full: everybody waits");
        assert_eq!(
            s.try_submit(9, || ()).unwrap_err().reason,
            RejectReason::Full,
            "waiters come first"
        );
        drop(gate);
        for t in tasks {
            t.await.unwrap();
        }
    });
    for h in queued {
        h.join().unwrap();
    }
    assert_eq!(
        *got.lock().unwrap(),
        [0, 1, 2, 3, 4, 5],
        "room in arrival order"
    );
    assert_eq!(*ran.lock().unwrap(), [0, 1, 2, 3, 4, 5]);
    let st = s.stats();
    assert_eq!((st.completed, st.queued, st.running), (9, 0, 0));
}

/// A dropped `reserve` future holds nothing; one dropped after a slot was handed to it passes
/// the slot on to the next waiter.
#[test]
fn a_dropped_reserve_future_passes_its_slot_on() {
    let s = Builder::<u32>::new()
        .workers(1)
        .capacity(1)
        .build()
        .unwrap();
    let gate = block_worker(&s, 0);
    let queued = s.try_submit(0, || ()).unwrap();
    let mut a = Box::pin(s.reserve(1));
    let mut b = Box::pin(s.reserve(2));
    let mut c = Box::pin(s.reserve(3));
    assert!(poll_once(a.as_mut()).is_pending());
    assert!(poll_once(b.as_mut()).is_pending());
    assert!(poll_once(c.as_mut()).is_pending());
    drop(b); // waiting: it just leaves
    drop(gate);
    queued.join().unwrap();
    assert!(wait_until(SECS, || s.stats().completed == 2));
    // The queued task started: its slot went to `a`, which is dropped without using it.
    assert!(poll_once(c.as_mut()).is_pending(), "a has the slot");
    assert_eq!(
        s.try_submit(9, || ()).unwrap_err().reason,
        RejectReason::Full,
        "the freed slot was handed over, not left for a newcomer"
    );
    drop(a);
    let room = match poll_once(c.as_mut()) {
        Poll::Ready(r) => r.unwrap(),
        Poll::Pending => panic!("the slot went on to c"),
    };
    assert_eq!(
        s.try_submit(9, || ()).unwrap_err().reason,
        RejectReason::Full
    );
    drop(room);
    drop(c);
    // Every slot is back: one free.
    let h = s.try_submit(9, || 9).unwrap();
    assert_eq!(h.join().unwrap(), 9);
    assert_eq!(s.stats().completed, 3);
}

/// A dropped reservation gives its room back: the capacity slot and the key share.
#[test]
fn a_dropped_reservation_gives_its_room_back() {
    let rt = current_thread();
    let s = Builder::<u32>::new()
        .workers(1)
        .capacity(1)
        .build()
        .unwrap();
    let gate = block_worker(&s, 0);
    let room = rt.block_on(s.reserve(1)).unwrap();
    assert_eq!(
        s.try_submit(2, || ()).unwrap_err().reason,
        RejectReason::Full
    );
    drop(room);
    let h = s.try_submit(2, || 2).unwrap();
    drop(gate);
    assert_eq!(h.join().unwrap(), 2);

    let k = Builder::<u32>::new()
        .workers(1)
        .max_keys(1)
        .build()
        .unwrap();
    let room = rt.block_on(k.reserve(1)).unwrap();
    assert_eq!(k.stats().active_keys, 1, "the share is held");
    assert_eq!(
        k.try_submit(2, || ()).unwrap_err().reason,
        RejectReason::TooManyKeys
    );
    drop(room);
    assert_eq!(k.stats().active_keys, 0);
    assert_eq!(k.try_submit(2, || 2).unwrap().join().unwrap(), 2);
}

/// A `reserve` waiting when `shutdown` is called resolves `Err(Shutdown)`, so does one made
/// after; a reservation used after shutdown hands the task back; queued tasks still run.
#[test]
fn shutdown_ends_waiting_and_new_reserves() {
    let s = Builder::<u32>::new()
        .workers(1)
        .capacity(1)
        .build()
        .unwrap();
    let gate = block_worker(&s, 0);
    let queued = s.try_submit(0, || "queued").unwrap();
    let mut waiting = Box::pin(s.reserve(1));
    assert!(poll_once(waiting.as_mut()).is_pending());
    s.shutdown();
    assert!(matches!(
        poll_once(waiting.as_mut()),
        Poll::Ready(Err(RejectReason::Shutdown))
    ));
    assert!(matches!(
        poll_once(pin!(s.reserve(2))),
        Poll::Ready(Err(RejectReason::Shutdown))
    ));
    drop(gate);
    assert_eq!(queued.join().unwrap(), "queued");
    assert!(s.await_termination(SECS));

    // Reserved before, used after: the task comes back.
    let s = Builder::<u32>::new()
        .capacity(1)
        .max_keys(4)
        .build()
        .unwrap();
    let room = current_thread().block_on(s.reserve(1)).unwrap();
    s.shutdown();
    let back = room.submit(|| 5).unwrap_err();
    assert_eq!(back.reason, RejectReason::Shutdown);
    assert_eq!((back.task)(), 5);
    assert!(s.await_termination(SECS));
    assert_eq!(s.stats().active_keys, 0, "the share went back");
}

/// Under `max_keys`, a reserve for a live key never waits for key room; one for a new key
/// waits until a key is released (here: it releases the idle one itself once it drains).
#[test]
fn max_keys_a_live_key_never_waits_for_key_room() {
    let s = Arc::new(
        Builder::<u32>::new()
            .workers(1)
            .max_keys(1)
            .build()
            .unwrap(),
    );
    let gate = block_worker(&s, 1);
    let rt = current_thread();
    let log = Arc::new(Mutex::new(Vec::new()));
    rt.block_on(async {
        // Key 1 is live (its task runs): no wait.
        let room = tokio::time::timeout(SECS, s.reserve(1))
            .await
            .unwrap()
            .unwrap();
        let l = log.clone();
        room.execute(move || l.lock().unwrap().push("1: through the reservation"))
            .unwrap();
        // Key 2 is new, and key 1 busy: it waits.
        let s2 = s.clone();
        let l = log.clone();
        let new_key = tokio::spawn(async move {
            let room = s2.reserve(2).await.unwrap();
            room.submit(move || l.lock().unwrap().push("2: after key 1 was released"))
                .unwrap()
                .await
                .unwrap();
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!new_key.is_finished(), "no key room while key 1 is busy");
        drop(gate); // key 1 drains and goes idle: the waiter releases it
        tokio::time::timeout(SECS, new_key).await.unwrap().unwrap();
    });
    assert_eq!(
        *log.lock().unwrap(),
        ["1: through the reservation", "2: after key 1 was released"]
    );
    assert!(s.stats().active_keys <= 1);
}

/// The deadlock, now through `reserve`: many users on a current-thread runtime submit
/// 100,000 futures (some of them sleeping on that runtime's timer) to a serializer with
/// `capacity(64)` built inside it. Each user's futures run in order; every one completes.
#[test]
fn no_deadlock_at_100k_submits_with_capacity_64_on_a_current_thread_runtime() {
    const USERS: u32 = 200;
    const EACH: u32 = 500;
    let done = within(Duration::from_secs(120), || {
        let rt = current_thread();
        rt.block_on(async {
            let s = Arc::new(
                Builder::<u32>::new()
                    .workers(2)
                    .capacity(64)
                    .build()
                    .unwrap(),
            );
            let seen: Arc<Vec<AtomicUsize>> =
                Arc::new((0..USERS).map(|_| AtomicUsize::new(0)).collect());
            let mut users = Vec::new();
            for u in 0..USERS {
                let (s, seen) = (s.clone(), seen.clone());
                users.push(tokio::spawn(async move {
                    let mut last = None;
                    for i in 0..EACH {
                        let seen = seen.clone();
                        let room = s.reserve(u).await.unwrap();
                        last = Some(
                            room.submit_async(async move {
                                if i % 50 == 0 {
                                    tokio::time::sleep(Duration::from_millis(1)).await;
                                } else {
                                    tokio::task::yield_now().await;
                                }
                                // In order: the i-th future of the user sees i before it.
                                let before = seen[u as usize].fetch_add(1, Ordering::SeqCst);
                                assert_eq!(before, i as usize, "user {u} in order");
                            })
                            .unwrap(),
                        );
                    }
                    last.unwrap().await.unwrap();
                }));
            }
            for u in users {
                u.await.unwrap();
            }
            s.shutdown();
            s.terminated().await;
            let st = s.stats();
            assert_eq!(st.completed, u64::from(USERS * EACH));
            assert_eq!(st.panicked, 0);
            for c in seen.iter() {
                assert_eq!(c.load(Ordering::SeqCst), EACH as usize);
            }
        });
    });
    assert!(done.is_some(), "hung (the issue's deadlock)");
}

/// A blocking call on a serializer, by name.
type Call<'a> = Box<dyn Fn(&Serializer<u32>) + 'a>;

fn message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Every blocking call on a bounded serializer, on a thread inside a tokio runtime, panics at
/// once naming `reserve(..).await` and the `try_` form, and admits nothing; without the bounds
/// nothing panics; from inside the serializer's own tasks nothing panics.
#[test]
fn blocking_calls_in_a_runtime_panic_naming_the_async_way() {
    let rt = current_thread();
    let sem = Semaphore::new(1);
    for bounded in [
        Builder::<u32>::new().capacity(8).build().unwrap(),
        Builder::<u32>::new().max_keys(8).build().unwrap(),
    ] {
        let calls: Vec<(&str, Call<'_>)> = vec![
            ("submit", Box::new(|s| drop(s.submit(1, || ())))),
            ("execute", Box::new(|s| drop(s.execute(1, || ())))),
            ("spawn", Box::new(|s| drop(s.spawn(|| ())))),
            (
                "submit_with_state",
                Box::new(|s| drop(s.submit_with_state(1, |_: &mut ()| ()))),
            ),
            (
                "submit_latest",
                Box::new(|s| drop(s.submit_latest(1, || ()))),
            ),
            (
                "submit_distinct",
                Box::new(|s| drop(s.submit_distinct(1, || ()))),
            ),
            (
                "submit_with_permits",
                Box::new(|s| drop(s.submit_with_permits(1, &sem, 1, || ()))),
            ),
            (
                "submit_async",
                Box::new(|s| drop(s.submit_async(1, async {}))),
            ),
            (
                "execute_async",
                Box::new(|s| drop(s.execute_async(1, async {}))),
            ),
            (
                "submit_async_with_state",
                Box::new(|s| drop(s.submit_async_with_state(1, |u: ()| async move { (u, ()) }))),
            ),
        ];
        rt.block_on(async {
            for (name, call) in &calls {
                let err = catch_unwind(AssertUnwindSafe(|| call(&bounded)))
                    .expect_err(&format!("{name} panics inside a runtime"));
                let msg = message(err);
                assert!(msg.contains("reserve(..).await"), "{name}: {msg}");
                assert!(msg.contains("try_"), "{name}: {msg}");
            }
            let err = catch_unwind(AssertUnwindSafe(|| {
                bounded.await_termination(Duration::from_millis(1))
            }))
            .expect_err("await_termination panics inside a runtime");
            assert!(message(err).contains("terminated().await"));
        });
        let st = bounded.stats();
        assert_eq!(
            (st.queued, st.completed, st.active_keys),
            (0, 0, 0),
            "admitted nothing"
        );
        // Outside the runtime the same calls work.
        for (_, call) in &calls {
            call(&bounded);
        }
    }
    // Without bounds nothing panics.
    let free = Builder::<u32>::new().build().unwrap();
    rt.block_on(async {
        free.submit(1, || ()).unwrap().await.unwrap();
        free.submit_async(1, async {}).unwrap().await.unwrap();
    });
    // From inside its own tasks (here a future polled in the runtime's context), nothing
    // panics either.
    let s = Arc::new(
        Builder::<u32>::new()
            .capacity(4)
            .tokio_handle(rt.handle().clone())
            .build()
            .unwrap(),
    );
    let inner = s.clone();
    let h = s
        .submit_async(1, async move {
            assert!(tokio::runtime::Handle::try_current().is_ok());
            inner.submit(2, || "inner").unwrap().join().unwrap()
        })
        .unwrap();
    assert_eq!(h.join().unwrap(), "inner");
}

/// Every kind of submission through a reservation, each in its key's order at the moment it
/// is submitted (not at `reserve`), with the room handed on: the accounting ends exact.
#[test]
fn every_submission_through_a_reservation_is_ordered_when_submitted() {
    let rt = current_thread();
    let s = Builder::<u32>::new()
        .workers(2)
        .capacity(2)
        .max_keys(2)
        .key_idle_timeout(Duration::from_secs(600)) // the key keeps its state between tasks
        .key_state(|_| Vec::<&str>::new())
        .build()
        .unwrap();
    let st =
        rt.block_on(async {
            let early = s.reserve(1).await.unwrap(); // reserved first, used last
            s.reserve(1)
                .await
                .unwrap()
                .submit_with_state(|v: &mut Vec<&str>| v.push("a"))
                .unwrap()
                .await
                .unwrap();
            let h = s.reserve(1).await.unwrap().submit_async_with_state(
                |mut v: Vec<&str>| async move {
                    v.push("b");
                    (v, ())
                },
            );
            h.unwrap().await.unwrap();
            s.reserve(1).await.unwrap().execute(|| ()).unwrap();
            s.reserve(1).await.unwrap().execute_async(async {}).unwrap();
            s.reserve(1)
                .await
                .unwrap()
                .submit_async(async {})
                .unwrap()
                .await
                .unwrap();
            s.reserve(1)
                .await
                .unwrap()
                .submit(|| ())
                .unwrap()
                .await
                .unwrap();
            early
                .submit_with_state(|v: &mut Vec<&str>| {
                    v.push("early");
                    v.clone()
                })
                .unwrap()
                .await
                .unwrap()
        });
    assert_eq!(st, ["a", "b", "early"]);
    s.shutdown();
    assert!(s.await_termination(SECS));
    let stats = s.stats();
    assert_eq!((stats.completed, stats.queued, stats.rejected), (7, 0, 0));
}

/// Under `max_keys`, a share handed to a `reserve` future that is then dropped goes on to the
/// next waiter for key room; waiters for key room are served in arrival order.
#[test]
fn a_dropped_reserve_future_passes_its_key_share_on() {
    let s = Builder::<u32>::new()
        .workers(1)
        .max_keys(1)
        .key_idle_timeout(Duration::ZERO) // a drained key is released at once
        .build()
        .unwrap();
    let gate = block_worker(&s, 1);
    let mut a = Box::pin(s.reserve(2));
    let mut b = Box::pin(s.reserve(3));
    let mut c = Box::pin(s.reserve(4));
    assert!(poll_once(a.as_mut()).is_pending());
    assert!(poll_once(b.as_mut()).is_pending());
    assert!(poll_once(c.as_mut()).is_pending());
    drop(gate); // key 1 drains and is released: its share goes to `a`
    assert!(wait_until(SECS, || s.stats().completed == 1));
    assert!(wait_until(SECS, || s.stats().active_keys == 1));
    assert!(poll_once(c.as_mut()).is_pending());
    assert_eq!(
        s.try_submit(5, || ()).unwrap_err().reason,
        RejectReason::TooManyKeys,
        "the share was handed over"
    );
    drop(a); // granted, never used: on to `b`
    let room = match poll_once(b.as_mut()) {
        Poll::Ready(r) => r.unwrap(),
        Poll::Pending => panic!("the share went on to b"),
    };
    assert!(poll_once(c.as_mut()).is_pending(), "c comes after b");
    let h = room.submit(|| 3).unwrap();
    assert_eq!(h.join().unwrap(), 3);
    // Key 3 drained and was released: its share goes to `c`.
    let mut got = None;
    assert!(wait_until(SECS, || {
        if let Poll::Ready(r) = poll_once(c.as_mut()) {
            got = Some(r.unwrap());
        }
        got.is_some()
    }));
    let room = got.unwrap();
    drop(room);
    assert_eq!(s.stats().active_keys, 0, "every share back");
    assert_eq!(s.try_submit(5, || 5).unwrap().join().unwrap(), 5);
}
