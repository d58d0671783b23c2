//! Loom models of a future task's wake state (`std-executor/src/future_task.rs`, "The wake
//! state"), over the real `WakeState`: the chain's owner polls (a poll that reads a stand-in
//! event flag and is pending while it is unset), parks with `try_park`, and polls again when a
//! wake came during its poll; wakers set the event and call `wake`, and the one whose wake
//! returns `true` reschedules (here: polls once more, as the worker that picks the chain up).
//!
//! Checked in every interleaving: the event is seen by some poll (no lost wakeup), the future
//! completes exactly once, it is never rescheduled while its owner still polls it (never polled
//! by two threads at once), a wake after completion does nothing, a wake racing
//! `shutdown_now`'s steal for a parked future's chain hands the chain to exactly one of them
//! (and a lost steal finds the chain queued), and a second park woken while the first waker
//! is still between its push and its mark is never taken twice.
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
            self.state.scheduled(); // "on the queue": the stand-in worker is this thread
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
    // The owner has parked the future (`try_park` done); a waker and `shutdown_now` race for
    // the chain: the waker through `wake`, a push onto the (stand-in) global queue and
    // `scheduled`, as `future_task.rs`'s `wake_node` does; `shutdown_now` through `steal`. A
    // lost steal must find the chain on the queue (it drains the queues next).
    loom::model(|| {
        let m = Arc::new(Model::default());
        m.state.begin_poll();
        assert!(m.state.try_park());
        let queued = Arc::new(AtomicBool::new(false));
        let (m2, q2) = (m.clone(), queued.clone());
        let waker = thread::spawn(move || {
            m2.event.store(true, Ordering::Relaxed);
            if m2.state.wake() {
                q2.store(true, Ordering::Relaxed);
                m2.state.scheduled();
                true
            } else {
                false
            }
        });
        let stolen = m.state.steal();
        if !stolen {
            assert!(
                queued.load(Ordering::Relaxed),
                "a lost steal finds the chain on the queue"
            );
        }
        let rescheduled = waker.join().unwrap();
        assert!(
            stolen ^ rescheduled,
            "the chain went to exactly one of them (stolen {stolen}, rescheduled {rescheduled})"
        );
        // A wake after the steal does nothing.
        assert!(!m.state.wake() || !stolen);
    });
}

#[test]
fn a_second_park_is_not_taken_while_the_first_waker_is_marking() {
    // The owner parked; waker A takes the park, pushes the chain (the stand-in queue) and marks
    // it; a worker pops it once it is queued and polls again (pending once more: it parks
    // again), while waker B wakes. `begin_poll` waits out A's `WAKING`, so B can take the second
    // park only after A's mark: A's late mark can never stand for B's push.
    loom::model(|| {
        let m = Arc::new(Model::default());
        m.state.begin_poll();
        assert!(m.state.try_park());
        let queued = Arc::new(AtomicUsize::new(0));
        let a_marked = Arc::new(AtomicBool::new(false));
        // B starts once A has taken the first park, and may wake at any point after.
        assert!(m.state.wake(), "A takes the first park");
        let (mb, qb, ab) = (m.clone(), queued.clone(), a_marked.clone());
        let b = thread::spawn(move || {
            if mb.state.wake() {
                assert!(
                    ab.load(Ordering::SeqCst),
                    "B took a park before A marked its own"
                );
                qb.fetch_add(1, Ordering::SeqCst);
                mb.state.scheduled();
            }
        });
        let (ma, qa, aa) = (m.clone(), queued.clone(), a_marked.clone());
        let a = thread::spawn(move || {
            qa.fetch_add(1, Ordering::SeqCst);
            // Flagged just before the mark: B may see a park only once the mark let the
            // worker poll, so after this store.
            aa.store(true, Ordering::SeqCst);
            ma.state.scheduled();
        });
        let (mw, qw) = (m.clone(), queued.clone());
        let worker = thread::spawn(move || {
            while qw.load(Ordering::SeqCst) == 0 {
                thread::yield_now();
            }
            loop {
                mw.state.begin_poll();
                if mw.state.try_park() {
                    break;
                }
            }
        });
        a.join().unwrap();
        worker.join().unwrap();
        b.join().unwrap();
        let q = queued.load(Ordering::SeqCst);
        assert!(q == 1 || q == 2);
        // Queued twice: B's park is RUNNABLE now; else B woke during the worker's poll (or
        // before A's push) and the worker's loop parked after polling again.
        assert_eq!(
            m.state.steal(),
            q == 1,
            "parked exactly when B did not take it"
        );
    });
}

#[test]
fn a_cancel_after_a_wakers_push_waits_for_its_mark() {
    // The owner parked; a waker takes the park and pushes the chain; the chain is drained at
    // once (a stopped worker put it back unpolled, and `shutdown_now` takes it from the queue)
    // and its started future cancelled, `finish`, while the waker has not marked yet. `finish`
    // waits out `WAKING`, so the waker's mark never overwrites `DONE`.
    loom::model(|| {
        let m = Arc::new(Model::default());
        m.state.begin_poll();
        assert!(m.state.try_park());
        let queued = Arc::new(AtomicBool::new(false));
        let (m2, q2) = (m.clone(), queued.clone());
        let waker = thread::spawn(move || {
            if m2.state.wake() {
                q2.store(true, Ordering::SeqCst);
                m2.state.scheduled();
            }
        });
        // The drainer: once the chain is on the queue, it cancels the future.
        while !queued.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        m.state.finish();
        waker.join().unwrap();
        assert!(m.state.is_done(), "the waker's mark overwrote DONE");
        assert!(!m.state.wake(), "a wake after the cancel does nothing");
    });
}
