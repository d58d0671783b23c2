//! Loom models of the elastic pool's starvation detection (std-executor/src/shared.rs
//! `notify`/`starving`, worker/mod.rs `found`, sleep.rs, supervisor.rs), over the real `Sleep`
//! (reached through the crate's `cfg(loom)`-only `loom_api` module).
//!
//! The claim: whenever work is visible and no worker is idle (searching or asleep), the
//! starvation stamp is set, or a sleeper was woken, or a searcher remains (it will find the
//! work), whatever the interleaving of a submitter's push + notify and the workers' steps.
//!
//! Stand-ins: the run queue is a count of queued items (a push is an RMW on it, as an
//! `Injector` push is a CAS on its tail; "visible" is a load, as `Injector::is_empty` is); the
//! stamp is an `AtomicU64` set by a CAS from 0 after a relaxed load, exactly as
//! `Shared::starving`. The workers' and submitters' steps are transcriptions calling the real
//! `Sleep`: [`World::submit`] is `Shared::schedule` + `notify`, [`World::found`] is the head of
//! `WorkerLoop::found`, [`elastic_exit`] is the keep-alive exit and the end of `WorkerLoop::exit`;
//! the supervisor's step is the real `stamp_expired`. Two models run the steps as they were
//! before the fixes of `exit` and of the supervisor and require the model to find the lost stamp.
#![cfg(loom)]

use keyserial::loom_api::{stamp_expired, Parker, Sleep};
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// The stamp's value when set (a time in ms, never 0).
const NOW: u64 = 7;

struct World {
    sleep: Sleep,
    /// Items queued (the stand-in for every run queue).
    queued: AtomicUsize,
    /// `Shared::starved_since`.
    stamp: AtomicU64,
}

impl World {
    /// A world with `workers` parkable workers, their parkers, and `queued` items.
    fn new(workers: usize, queued: usize) -> (Arc<World>, Vec<Parker>) {
        let parkers: Vec<Parker> = (0..workers).map(|_| Parker::new()).collect();
        let world = Arc::new(World {
            sleep: Sleep::new(parkers.iter().map(|p| p.unparker().clone()).collect()),
            queued: AtomicUsize::new(queued),
            stamp: AtomicU64::new(0),
        });
        (world, parkers)
    }

    fn visible(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0
    }

    fn push(&self) {
        self.queued.fetch_add(1, Ordering::AcqRel);
    }

    fn pop(&self) -> bool {
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// `Shared::starving`.
    fn starving(&self) {
        if self.stamp.load(Ordering::Relaxed) == 0 {
            let _ = self
                .stamp
                .compare_exchange(0, NOW, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// `Shared::schedule` after its push: `Shared::notify`.
    fn submit(&self) {
        self.push();
        if self.sleep.notify() {
            self.starving();
        }
    }

    /// `WorkerLoop::found` for a worker counted as searching, up to running what it found.
    fn found(&self) {
        if self.sleep.stop_searching() && self.sleep.unattended(|| self.visible()) {
            self.starving();
        }
    }

    fn stamped(&self) -> bool {
        self.stamp.load(Ordering::Acquire) != 0
    }
}

#[test]
fn last_searcher_finding_work_racing_a_submit_stamps() {
    // One worker, counted as searching, takes the one queued item while a submitter pushes a
    // second and notifies. Nobody is idle afterwards, so the second item must be stamped.
    loom::model(|| {
        let (world, _parkers) = World::new(1, 1);
        world.sleep.start_searching();
        let worker = {
            let world = world.clone();
            thread::spawn(move || {
                assert!(world.pop());
                world.found();
            })
        };
        world.submit();
        worker.join().unwrap();
        assert!(world.visible(), "the second item is still queued");
        assert!(!world.sleep.has_idle_worker());
        assert!(world.stamped(), "visible work, nobody idle, no stamp");
    });
}

#[test]
fn last_searcher_finding_work_racing_a_submit_wakes_the_sleeper() {
    // As above with a second worker asleep: it must be woken (by the submit or by the searcher),
    // and then it is the searcher that will find the item. A sleeper never woken deadlocks the
    // model.
    loom::model(|| {
        let (world, mut parkers) = World::new(2, 1);
        world.sleep.start_searching(); // worker 0
        world.sleep.start_searching(); // worker 1, which goes to sleep at once:
        let snapshot = world.sleep.snapshot();
        assert!(world.sleep.try_sleep(1, snapshot, true));
        let sleeper = {
            let (world, parker) = (world.clone(), parkers.pop().unwrap());
            thread::spawn(move || {
                parker.park();
                world.sleep.woke(1);
            })
        };
        let worker = {
            let world = world.clone();
            thread::spawn(move || {
                assert!(world.pop());
                world.found();
            })
        };
        world.submit();
        worker.join().unwrap();
        sleeper.join().unwrap();
        assert!(world.visible());
        assert!(
            world.sleep.has_idle_worker(),
            "the woken worker is searching"
        );
    });
}

/// An elastic worker, counted as searching, idle past its keep-alive: it saw no work and leaves
/// (`WorkerLoop::main_loop`'s keep-alive check, then `exit`). `stamp_if_unattended` is `exit`'s
/// last step: with `false`, the step as it was before the fix (wake a sleeper, never stamp).
fn elastic_exit(world: &World, stamp_if_unattended: bool) {
    if world.visible() {
        return; // it stays (and would find the work)
    }
    world.sleep.stop_searching();
    if stamp_if_unattended {
        if world.sleep.unattended(|| world.visible()) {
            world.starving();
        }
    } else if world.visible() {
        world.sleep.wake_one();
    }
}

/// Runs the exit-racing-a-submit model; returns `false` if this execution left visible work
/// with nobody idle and no stamp.
fn exit_racing_a_submit(stamp_if_unattended: bool) -> bool {
    // The only other worker is busy in a long task (not modelled: never idle).
    let (world, _parkers) = World::new(2, 0);
    world.sleep.start_searching();
    let leaving = {
        let world = world.clone();
        thread::spawn(move || elastic_exit(&world, stamp_if_unattended))
    };
    world.submit();
    leaving.join().unwrap();
    assert!(world.visible());
    world.stamped() || world.sleep.has_idle_worker()
}

#[test]
fn elastic_worker_leaving_racing_a_submit_stamps() {
    loom::model(|| {
        assert!(
            exit_racing_a_submit(true),
            "visible work, nobody idle, no stamp"
        );
    });
}

/// Executions of the model below that lost the stamp (a plain std counter across executions).
static EXIT_LOST: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[test]
fn elastic_worker_leaving_without_stamping_loses_the_work() {
    // The exit step before the fix: the submit's notify saw the leaving worker still searching
    // (no stamp), then the worker stopped searching, saw the work, found no sleeper to wake, and
    // left. The model must find that execution (it is why `exit` now stamps).
    loom::model(|| {
        if !exit_racing_a_submit(false) {
            EXIT_LOST.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(EXIT_LOST.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

/// The supervisor's look at an expired stamp. `fixed`: the real `stamp_expired` (clear the
/// stamp, fence on the sleep word, then look); otherwise the order before the fix (look, then
/// clear). Returns `true` if it starts an extra worker.
fn supervise(world: &World, fixed: bool) -> bool {
    if fixed {
        stamp_expired(&world.stamp, &world.sleep, || world.visible())
    } else {
        let spawn = !world.sleep.has_idle_worker() && world.visible();
        world.stamp.store(0, Ordering::Release);
        spawn
    }
}

/// Runs the supervisor-racing-a-submit model (`searcher`: a worker counted as searching also
/// takes the one queued item meanwhile); returns `None` if this execution left visible work
/// with nobody idle, no stamp and no extra worker, else whether the supervisor started one.
fn supervisor_racing_a_submit(fixed: bool, searcher: bool) -> Option<bool> {
    // An earlier starvation stamped; its work is gone (or is being taken by the searcher).
    let (world, _parkers) = World::new(1, searcher as usize);
    world.stamp.store(NOW, Ordering::Release);
    if searcher {
        world.sleep.start_searching();
    }
    let supervisor = {
        let world = world.clone();
        thread::spawn(move || supervise(&world, fixed))
    };
    let worker = searcher.then(|| {
        let world = world.clone();
        thread::spawn(move || {
            assert!(world.pop());
            world.found();
        })
    });
    world.submit();
    if let Some(w) = worker {
        w.join().unwrap();
    }
    let spawned = supervisor.join().unwrap();
    assert!(world.visible());
    (spawned || world.stamped() || world.sleep.has_idle_worker()).then_some(spawned)
}

#[test]
fn supervisor_clearing_the_stamp_racing_a_submit_keeps_it() {
    loom::model(|| {
        assert!(
            supervisor_racing_a_submit(true, false).is_some(),
            "visible work, nobody idle, no stamp, no extra worker"
        );
    });
}

/// Executions of the model below, by who kept the work attended: `[the stamp (the supervisor
/// started nobody), the supervisor]` (plain std counters across executions).
static SEARCHER_KEPT: [std::sync::atomic::AtomicUsize; 2] = [
    std::sync::atomic::AtomicUsize::new(0),
    std::sync::atomic::AtomicUsize::new(0),
];

#[test]
fn supervisor_racing_a_submit_and_the_last_searcher_keeps_the_stamp() {
    // The supervisor only loads the queue, and it is spawned before the searcher, whose pop loads
    // the queue before its CAS: loom 0.7 can hide such a pair (it keeps only the last access of
    // each atomic, tokio-rs/loom#392). The counters check that both ways out were reached: the
    // searcher (or the submit) stamped after the supervisor cleared, or the stamp was cleared after
    // the searcher saw it set and the supervisor saw the work and started a worker.
    loom::model(|| {
        let spawned = supervisor_racing_a_submit(true, true)
            .expect("visible work, nobody idle, no stamp, no extra worker");
        SEARCHER_KEPT[usize::from(spawned)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    let [stamped, spawned] = SEARCHER_KEPT
        .each_ref()
        .map(|c| c.load(std::sync::atomic::Ordering::Relaxed));
    assert!(
        stamped > 0 && spawned > 0,
        "kept by the stamp in {stamped} and by the supervisor in {spawned} executions"
    );
}

/// Executions of the model below that lost the stamp (a plain std counter across executions).
static SUPERVISOR_LOST: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[test]
fn supervisor_clearing_after_looking_loses_the_stamp() {
    // The order before the fix: the supervisor saw no work, the submit pushed, found the old
    // stamp still set (so stamped nothing), and then the supervisor cleared it.
    loom::model(|| {
        if supervisor_racing_a_submit(false, false).is_none() {
            SUPERVISOR_LOST.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(SUPERVISOR_LOST.load(std::sync::atomic::Ordering::Relaxed) > 0);
}
