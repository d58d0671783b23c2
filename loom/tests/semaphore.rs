//! Loom models of the fair semaphore (std-executor/src/semaphore.rs) over the real code: a grant
//! racing each way a waiter can leave (timeout, cancelled callback, dropped future, close). In
//! every model the permits are conserved: at the end `available()` equals the start, nobody
//! waits, and each callback ran at most once (exactly once where it could not be cancelled).
//!
//! Under `cfg(loom)` the semaphore's blocking waits park on a loom parker whose `park_timeout`
//! returns at once; `acquire_timeout` treats the first such return as its deadline, so a timed
//! wait is modelled as "gives up at any point after queueing".
//!
//! Flags in the models are set with RMWs (see the crate docs for why).
#![cfg(loom)]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use keyserial::loom_api::semaphore::acquire_with_cancellable;
use keyserial::{AcquireError, Semaphore};
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

struct Noop;

impl Wake for Noop {
    fn wake(self: std::sync::Arc<Self>) {}
}

#[test]
fn release_races_a_timed_out_waiter() {
    loom::model(|| {
        let sem = Semaphore::new(2);
        let mut held = sem.try_acquire(2).unwrap();
        let one = held.split(1).unwrap();
        let waiter = {
            let sem = sem.clone();
            thread::spawn(move || {
                sem.acquire_timeout(2, Duration::from_secs(1))
                    .map(|p| p.count())
            })
        };
        // Two releases: the waiter may time out holding one of them as a partial grant.
        drop(one);
        drop(held);
        match waiter.join().unwrap() {
            Ok(n) => assert_eq!(n, 2),
            Err(e) => assert_eq!(e, AcquireError::Timeout),
        }
        assert_eq!(sem.available(), 2, "a permit was lost or doubled");
        assert_eq!(sem.waiters(), 0);
    });
}

#[test]
fn release_races_a_cancelled_callback() {
    loom::model(|| {
        let sem = Semaphore::new(1);
        let held = sem.try_acquire(1).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let token = {
            let ran = ran.clone();
            acquire_with_cancellable(&sem, 1, move |r| {
                assert_eq!(r.unwrap().count(), 1);
                ran.fetch_add(1, Ordering::AcqRel);
            })
            .expect("no permit is free: the request is queued")
        };
        let releaser = thread::spawn(move || drop(held));
        let cancelled = token.cancel();
        releaser.join().unwrap();
        let ran = ran.fetch_add(0, Ordering::AcqRel);
        assert_eq!(
            ran + cancelled as usize,
            1,
            "the callback ran iff cancel returned false"
        );
        assert!(!token.cancel(), "a second cancel finds nothing");
        assert_eq!(sem.available(), 1, "a permit was lost or doubled");
        assert_eq!(sem.waiters(), 0);
    });
}

#[test]
fn a_cancelled_head_hands_its_partial_grant_to_the_next_waiter() {
    loom::model(|| {
        let sem = Semaphore::new(2);
        let mut held = sem.try_acquire(2).unwrap();
        let first = held.split(1).unwrap();
        let (head_ran, next_ran) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        // The head wants 2, the next one wants 1.
        let head = {
            let head_ran = head_ran.clone();
            acquire_with_cancellable(&sem, 2, move |_| {
                head_ran.fetch_add(1, Ordering::AcqRel);
            })
            .expect("queued")
        };
        {
            let next_ran = next_ran.clone();
            sem.acquire_with(1, move |r| {
                assert_eq!(r.unwrap().count(), 1);
                next_ran.fetch_add(1, Ordering::AcqRel);
            });
        }
        // One permit comes back (assigned to the head) while the head is cancelled.
        let releaser = thread::spawn(move || drop(first));
        assert!(
            head.cancel(),
            "the head cannot have been granted: it needs 2"
        );
        releaser.join().unwrap();
        // Whichever came first, the released permit reached the next waiter.
        assert_eq!(next_ran.fetch_add(0, Ordering::AcqRel), 1);
        drop(held);
        assert_eq!(head_ran.fetch_add(0, Ordering::AcqRel), 0);
        assert_eq!(sem.available(), 2, "a permit was lost or doubled");
        assert_eq!(sem.waiters(), 0);
    });
}

#[test]
fn release_races_a_dropped_future() {
    loom::model(|| {
        let sem = Semaphore::new(1);
        let held = sem.try_acquire(1).unwrap();
        let waker = Waker::from(std::sync::Arc::new(Noop));
        let mut fut = Box::pin(sem.acquire_async(1));
        assert!(Pin::new(&mut fut)
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        let releaser = thread::spawn(move || drop(held));
        drop(fut);
        releaser.join().unwrap();
        assert_eq!(sem.available(), 1, "a permit was lost or doubled");
        assert_eq!(sem.waiters(), 0);
    });
}

#[test]
fn close_wakes_a_blocked_waiter() {
    loom::model(|| {
        let sem = Semaphore::new(1);
        let held = sem.try_acquire(1).unwrap();
        let waiter = {
            let sem = sem.clone();
            thread::spawn(move || sem.acquire(1).map(|p| p.count()))
        };
        sem.close();
        // Whether it queued before the close or arrived after it: Closed, and it wakes (a lost
        // wakeup would be a deadlock, which loom reports).
        assert_eq!(waiter.join().unwrap(), Err(AcquireError::Closed));
        drop(held);
        assert_eq!(sem.available(), 1);
        assert_eq!(sem.waiters(), 0);
    });
}

#[test]
fn two_releases_race_into_one_waiter() {
    loom::model(|| {
        let sem = Semaphore::new(2);
        let mut held = sem.try_acquire(2).unwrap();
        let one = held.split(1).unwrap();
        let waiter = {
            let sem = sem.clone();
            thread::spawn(move || sem.acquire(2).map(|p| p.count()))
        };
        let releaser = thread::spawn(move || drop(one));
        drop(held);
        releaser.join().unwrap();
        assert_eq!(waiter.join().unwrap(), Ok(2));
        assert_eq!(sem.available(), 2);
        assert_eq!(sem.waiters(), 0);
    });
}

#[test]
fn a_timed_out_head_and_a_second_waiter_race_two_releases() {
    loom::model(|| {
        let sem = Semaphore::new(2);
        let mut held = sem.try_acquire(2).unwrap();
        let one = held.split(1).unwrap();
        let head = {
            let sem = sem.clone();
            thread::spawn(move || {
                sem.acquire_timeout(2, Duration::from_secs(1))
                    .map(|p| p.count())
            })
        };
        let second = {
            let sem = sem.clone();
            thread::spawn(move || sem.acquire(1).map(|p| p.count()))
        };
        drop(one);
        drop(held);
        match head.join().unwrap() {
            Ok(n) => assert_eq!(n, 2),
            Err(e) => assert_eq!(e, AcquireError::Timeout),
        }
        // Whatever the head did, the second waiter is served (or it would deadlock).
        assert_eq!(second.join().unwrap(), Ok(1));
        assert_eq!(sem.available(), 2, "a permit was lost or doubled");
        assert_eq!(sem.waiters(), 0);
    });
}
