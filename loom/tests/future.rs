//! Loom models of a future task's wake state (`std-executor/src/future_task.rs`, "The wake
//! state"), over the real `WakeState`: the chain's owner polls (a poll that reads a stand-in
//! event flag and is pending while it is unset), parks with `try_park`, and polls again when a
//! wake came during its poll; wakers set the event and call `wake`, and the one whose wake
//! returns `true` reschedules (here: polls once more, as the worker that picks the chain up).
//!
//! Checked in every interleaving: the event is seen by some poll (no lost wakeup), the future
//! completes exactly once, it is never rescheduled while its owner still polls it (never polled
//! by two threads at once), a wake after completion does nothing, and a wake racing
//! `shutdown_now` for a parked future's chain (through the real wait registry) hands the chain
//! to exactly one of them.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

use keyserial::loom_api::WakeState;

/// The shared side of one future: its wake state, the event its poll waits for, and what the
/// model observes.
#[derive(Default)]
struct Model {
    state: WakeState,
    event: AtomicBool,
    /// Polls that found the event (the future completed in them).
    completed: AtomicUsize,
    /// A poll is running (to catch two at once).
    polling: AtomicUsize,
    /// Reschedules won by a waker.
    rescheduled: AtomicUsize,
}

impl Model {
    /// One poll by whoever holds the future; `true` if it completed.
    fn poll(&self) -> bool {
        assert_eq!(
            self.polling.fetch_add(1, Ordering::SeqCst),
            0,
            "two polls at once"
        );
        self.state.begin_poll();
        let ready = self.event.load(Ordering::Relaxed);
        self.polling.fetch_sub(1, Ordering::SeqCst);
        if ready {
            self.state.finish();
            self.completed.fetch_add(1, Ordering::SeqCst);
        }
        ready
    }

    /// The chain's owner: polls until the future completes or parks.
    fn owner(&self) {
        while !self.poll() {
            if self.state.try_park() {
                return; // parked: the baton is the wakers' now
            }
            // Woken during the poll: poll again.
        }
    }

    /// A waker: the event, then the wake; the winner of the park reschedules, and the
    /// rescheduled chain's owner polls (this thread, standing in for that worker).
    fn waker(&self) {
        self.event.store(true, Ordering::Relaxed);
        if self.state.wake() {
            self.rescheduled.fetch_add(1, Ordering::SeqCst);
            self.owner();
        }
    }
}

#[test]
fn a_wake_during_the_poll_or_after_the_park_is_never_lost() {
    loom::model(|| {
        let m = Arc::new(Model::default());
        let w = m.clone();
        let waker = thread::spawn(move || w.waker());
        m.owner();
        waker.join().unwrap();
        assert_eq!(
            m.completed.load(Ordering::SeqCst),
            1,
            "completed exactly once"
        );
        assert!(m.rescheduled.load(Ordering::SeqCst) <= 1);
    });
}

#[test]
fn two_wakers_reschedule_at_most_once_and_lose_nothing() {
    loom::model(|| {
        let m = Arc::new(Model::default());
        let wakers: Vec<_> = (0..2)
            .map(|_| {
                let w = m.clone();
                thread::spawn(move || w.waker())
            })
            .collect();
        m.owner();
        for w in wakers {
            w.join().unwrap();
        }
        assert_eq!(
            m.completed.load(Ordering::SeqCst),
            1,
            "completed exactly once"
        );
        assert!(
            m.rescheduled.load(Ordering::SeqCst) <= 1,
            "one reschedule at most"
        );
    });
}

#[test]
fn a_wake_after_completion_does_nothing() {
    loom::model(|| {
        let m = Arc::new(Model::default());
        m.event.store(true, Ordering::Relaxed);
        m.owner();
        let w = m.clone();
        let late = thread::spawn(move || w.state.wake());
        assert!(!late.join().unwrap(), "nothing to reschedule");
        assert_eq!(m.completed.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn shutdown_now_racing_a_wake_of_a_parked_future_takes_it_exactly_once() {
    use keyserial::loom_api::WaitRegistry;
    // The owner has parked the future (the wait registered, `try_park` done); a waker and
    // `shutdown_now` race for the chain: the waker through `wake` and then the wait's grant (as
    // `Parking::wake_by_ref` does), `shutdown_now` through `steal_all`.
    loom::model(|| {
        let m = Arc::new(Model::default());
        let registry: Arc<WaitRegistry<u32>> = Arc::new(WaitRegistry::new());
        let wait = registry.register(7);
        m.state.begin_poll();
        assert!(m.state.try_park());
        let rescheduled = Arc::new(AtomicUsize::new(0));
        let (m2, r2, w2, res2) = (
            m.clone(),
            registry.clone(),
            wait.clone(),
            rescheduled.clone(),
        );
        let waker = thread::spawn(move || {
            m2.event.store(true, Ordering::Relaxed);
            if m2.state.wake() {
                r2.grant(&w2, |_| {
                    res2.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        let stolen = AtomicUsize::new(0);
        registry.steal_all(|_| {
            stolen.fetch_add(1, Ordering::SeqCst);
        });
        waker.join().unwrap();
        let (s, r) = (
            stolen.load(Ordering::SeqCst),
            rescheduled.load(Ordering::SeqCst),
        );
        assert_eq!(
            s + r,
            1,
            "the chain went to exactly one of them (stolen {s}, rescheduled {r})"
        );
    });
}
