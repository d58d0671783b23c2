//! Loom models of the std executor's own protocols (std-executor/src/{gate,sleep,capacity}.rs),
//! over the real code, reached through the crate's `cfg(loom)`-only `loom_api` module.
//!
//! The models' own flags are set with RMWs (`fetch_or`), never plain stores: loom 0.7 keeps a
//! partial modification order and lets an RMW read any maximal store, so a plain store racing an
//! RMW on the same flag can be "missed" even when it happens-before the RMW (a model artifact;
//! every protocol word in the library is changed by RMWs only).
#![cfg(loom)]

use keyserial::loom_api::{Capacity, Gate, Parker, Sleep};
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

#[test]
fn gate_close_waits_for_admitted_pushes_and_refuses_later_ones() {
    // A submitter enters, "pushes" and admits; shutdown closes and waits. After wait_idle, the
    // shutdown thread sees exactly the pushes that were admitted: nothing slips in afterwards.
    loom::model(|| {
        let gate = Arc::new(Gate::new(2));
        let pushed = Arc::new(AtomicUsize::new(0));
        let (g, p) = (gate.clone(), pushed.clone());
        let submitter = thread::spawn(move || {
            if let Some(ticket) = g.enter() {
                p.fetch_add(1, Ordering::Relaxed);
                ticket.admit();
                true
            } else {
                false
            }
        });
        gate.close();
        gate.wait_idle();
        let seen = pushed.load(Ordering::Relaxed);
        assert_eq!(
            seen as u64,
            gate.admitted(),
            "admitted pushes are complete and visible"
        );
        let accepted = submitter.join().unwrap();
        assert_eq!(
            accepted as usize, seen,
            "no push lands after close + wait_idle"
        );
        assert!(gate.enter().is_none());
    });
}

#[test]
fn sleep_never_loses_a_wakeup() {
    // One worker searches a one-slot "queue" and sleeps when it finds nothing; one submitter
    // fills the slot and notifies. If a wakeup could be lost the worker would park forever, which
    // loom reports as a deadlock.
    loom::model(|| {
        let parker = Parker::new();
        let sleep = Arc::new(Sleep::new(
            vec![parker.unparker().clone()].into_boxed_slice(),
        ));
        let work = Arc::new(AtomicBool::new(false));
        sleep.start_searching();
        let (s, w) = (sleep.clone(), work.clone());
        let submitter = thread::spawn(move || {
            w.fetch_or(true, Ordering::Release);
            s.notify();
        });
        loop {
            let snapshot = sleep.snapshot();
            if work.swap(false, Ordering::AcqRel) {
                break;
            }
            if sleep.try_sleep(0, snapshot, true) {
                parker.park();
                sleep.woke(0);
            }
        }
        submitter.join().unwrap();
    });
}

#[test]
fn sleep_an_uncounted_worker_never_loses_a_wakeup() {
    // A worker whose queues ran dry after a task is not counted as searching; the submitter's
    // notify then sees nobody searching. Either its notify wakes the sleeper, or the sleeper's
    // try_sleep sees EVENTS move and searches again.
    loom::model(|| {
        let parker = Parker::new();
        let sleep = Arc::new(Sleep::new(
            vec![parker.unparker().clone()].into_boxed_slice(),
        ));
        let work = Arc::new(AtomicBool::new(false));
        let (s, w) = (sleep.clone(), work.clone());
        let submitter = thread::spawn(move || {
            w.fetch_or(true, Ordering::Release);
            s.notify();
        });
        let mut counted = false;
        loop {
            let snapshot = sleep.snapshot();
            if work.swap(false, Ordering::AcqRel) {
                if counted {
                    sleep.stop_searching();
                }
                break;
            }
            if sleep.try_sleep(0, snapshot, counted) {
                parker.park();
                sleep.woke(0);
                counted = true; // a woken worker is counted (by its waker or by itself)
            }
        }
        submitter.join().unwrap();
    });
}

#[test]
fn sleep_two_workers_one_item_is_taken_once_and_nobody_sleeps_forever() {
    // Two workers search, sleep when they find nothing, and stop once the single item has been
    // taken (the taker announces it with a notify, like a worker that exits). A lost wakeup would
    // leave a worker parked forever: loom reports that as a deadlock.
    loom::model(|| {
        let parkers = [Parker::new(), Parker::new()];
        let sleep = Arc::new(Sleep::new(
            parkers.iter().map(|p| p.unparker().clone()).collect(),
        ));
        let work = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let taken = Arc::new(AtomicUsize::new(0));
        sleep.start_searching();
        sleep.start_searching();
        let workers: Vec<_> = parkers
            .into_iter()
            .enumerate()
            .map(|(index, parker)| {
                let (sleep, work, done, taken) =
                    (sleep.clone(), work.clone(), done.clone(), taken.clone());
                thread::spawn(move || loop {
                    // The snapshot comes first: everything checked after it (the stop flag and
                    // the work) is covered by try_sleep's EVENTS check.
                    let snapshot = sleep.snapshot();
                    if done.fetch_or(false, Ordering::AcqRel) {
                        sleep.stop_searching();
                        return;
                    }
                    if work.swap(false, Ordering::AcqRel) {
                        taken.fetch_add(1, Ordering::AcqRel);
                        sleep.stop_searching();
                        done.fetch_or(true, Ordering::AcqRel);
                        sleep.notify();
                        return;
                    }
                    if sleep.try_sleep(index, snapshot, true) {
                        parker.park();
                        sleep.woke(index);
                    }
                })
            })
            .collect();
        work.fetch_or(true, Ordering::Release);
        sleep.notify();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(taken.load(Ordering::Acquire), 1);
    });
}

#[test]
fn capacity_release_wakes_a_blocked_submitter() {
    loom::model(|| {
        let cap = Arc::new(Capacity::new(1));
        assert!(cap.try_reserve());
        let c = cap.clone();
        let blocked = thread::spawn(move || c.reserve(|| false));
        cap.release();
        assert!(blocked.join().unwrap(), "the waiter got the freed slot");
        assert!(!cap.try_reserve(), "and it holds it");
    });
}

/// Two submitters that block on `cap` (held full), each giving up when `give_up` says so;
/// each thread returns whether it got a slot.
fn blocked_submitters(
    cap: &Arc<Capacity>,
    give_up: impl Fn() -> bool + Clone + Send + 'static,
) -> Vec<thread::JoinHandle<bool>> {
    (0..2)
        .map(|_| {
            let (c, g) = (cap.clone(), give_up.clone());
            thread::spawn(move || c.reserve(g))
        })
        .collect()
}

#[test]
fn capacity_each_release_wakes_one_of_two_blocked_submitters() {
    // Both slots held, two submitters block (spin, then sleep), two slots are freed: each release
    // wakes one sleeper (notify_one), and both get through, whatever the interleaving (the second
    // release may come while the first woken waiter is still registered).
    loom::model(|| {
        let cap = Arc::new(Capacity::new(2));
        assert!(cap.try_reserve() && cap.try_reserve());
        let blocked = blocked_submitters(&cap, || false);
        cap.release();
        cap.release();
        for b in blocked {
            assert!(
                b.join().unwrap(),
                "every blocked submitter got a freed slot"
            );
        }
        assert!(!cap.try_reserve(), "and they hold both");
    });
}

#[test]
fn capacity_a_barged_sleeper_is_woken_by_the_next_release() {
    // The only slot is held and a submitter blocks. The slot is freed, but another submitter
    // that never slept may take it first (and free it again when "its task starts"): the
    // sleeper, woken for a slot it then finds taken, sleeps again and is woken by that second
    // release. Whatever the order, both get through and nobody sleeps on.
    loom::model(|| {
        let cap = Arc::new(Capacity::new(1));
        assert!(cap.try_reserve());
        let c = cap.clone();
        let blocked = thread::spawn(move || c.reserve(|| false));
        let c = cap.clone();
        let barger = thread::spawn(move || {
            if c.try_reserve() {
                c.release();
            }
        });
        cap.release();
        barger.join().unwrap();
        assert!(blocked.join().unwrap(), "the sleeper got a slot");
        assert!(!cap.try_reserve(), "and holds it");
    });
}

#[test]
fn capacity_shutdown_wakes_every_blocked_submitter() {
    // The only slot is held; two submitters block; shutdown sets its flag and wakes all: each
    // gives up (no slot taken), none sleeps on.
    loom::model(|| {
        let cap = Arc::new(Capacity::new(1));
        assert!(cap.try_reserve());
        let shut = Arc::new(AtomicBool::new(false));
        let s = shut.clone();
        let blocked = blocked_submitters(&cap, move || s.fetch_or(false, Ordering::SeqCst));
        shut.fetch_or(true, Ordering::SeqCst);
        cap.wake_all();
        for b in blocked {
            assert!(
                !b.join().unwrap(),
                "a blocked submitter gives up at shutdown"
            );
        }
    });
}
