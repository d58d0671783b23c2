//! Loom models of the worker phase word (std-executor/src/phase.rs): `shutdown_now` takes the
//! queue behind a running task, and every queued task is either run or handed back, exactly once;
//! and the same for a run of tasks straight from a lane under one `RUNNING` section, whose lane
//! `shutdown_now` takes through the lane's word (core/src/lane.rs).
#![cfg(loom)]

use keyserial::loom_api::{AfterTask, Phase, Stopped};
use keyserial_core::chain::{BoxNode, Chain, Pushed};
use keyserial_core::lane::{Ended, Lane, Mailbox, Phase as LanePhase, MAX_WORKER};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use std::ptr::NonNull;

type C = Chain<BoxNode<u32>>;

/// Pops everything left in a chain we own into the `handed` bit set.
fn hand_back(chain: &C, handed: &AtomicUsize) {
    // SAFETY (model): the caller owns the chain.
    while let Some(v) = unsafe { chain.pop_value() } {
        handed.fetch_or(1 << v, Ordering::AcqRel);
    }
}

/// Called where `shutdown_now` returns: joins the worker, then checks that nothing was handed
/// back after the return, and that each task of `all` (bit sets) ran or was handed back, once.
fn each_task_once(
    worker: thread::JoinHandle<()>,
    ran: &AtomicUsize,
    handed: &AtomicUsize,
    all: usize,
) {
    let handed_at_return = handed.load(Ordering::Acquire);
    worker.join().unwrap();
    assert_eq!(
        handed.load(Ordering::Acquire),
        handed_at_return,
        "a task was handed back after shutdown_now returned"
    );
    let (r, h) = (ran.load(Ordering::Acquire), handed.load(Ordering::Acquire));
    assert_eq!(
        r & h,
        0,
        "a task both ran and was handed back: ran {r:b} handed {h:b}"
    );
    assert_eq!(r | h, all, "a task was lost: ran {r:b} handed {h:b}");
}

#[test]
fn shutdown_now_takes_the_queue_behind_a_running_task_exactly_once() {
    loom::model(|| {
        let phase = Arc::new(Phase::new());
        let chain = Arc::new(C::new());
        assert_eq!(chain.push_value(0), Ok(Pushed::Activated));
        assert_eq!(chain.push_value(1), Ok(Pushed::Queued));
        // The chain waits on a "ready queue" (one slot) until a worker takes it.
        let queued = Arc::new(AtomicBool::new(true));
        let ran = Arc::new(AtomicUsize::new(0));
        let handed = Arc::new(AtomicUsize::new(0));

        let worker = {
            let (phase, chain, queued, ran, handed) = (
                phase.clone(),
                chain.clone(),
                queued.clone(),
                ran.clone(),
                handed.clone(),
            );
            thread::spawn(move || {
                if !phase.enter_busy() {
                    return; // stopped before it started
                }
                if queued.swap(false, Ordering::AcqRel) {
                    // SAFETY (model): taking the chain off the queue made us its owner.
                    while let Some(v) = unsafe { chain.pop_value() } {
                        if !phase.enter_running() {
                            handed.fetch_or(1 << v, Ordering::AcqRel);
                            hand_back(&chain, &handed);
                            break;
                        }
                        ran.fetch_or(1 << v, Ordering::AcqRel); // the task runs
                        match phase.leave_running() {
                            AfterTask::Continue => {}
                            AfterTask::Stolen => break,
                            AfterTask::HandBack => {
                                hand_back(&chain, &handed);
                                break;
                            }
                        }
                    }
                }
                phase.leave_busy();
            })
        };

        // shutdown_now: stop the worker, steal its chain if it is inside a task, then drain the
        // ready queue.
        if phase.stop() == Stopped::Stole {
            hand_back(&chain, &handed);
        }
        if queued.swap(false, Ordering::AcqRel) {
            hand_back(&chain, &handed);
        }
        // shutdown_now returns here: whatever will never run must already be handed back.
        each_task_once(worker, &ran, &handed, 0b11);
    });
}

/// A lane the worker owns, with its FIFO stand-in: tasks `0..TASKS` and a consumer cursor in a
/// loom cell that only the lane's owner touches (so loom reports two poppers at once).
struct OwnedLane {
    word: Lane,
    next: UnsafeCell<usize>,
    /// The worker's mailbox (the only worker here is 0).
    mailbox: Mailbox<()>,
}

// SAFETY: `next` is touched only by the lane's owner (loom checks that); the rest is Sync.
unsafe impl Sync for OwnedLane {}
// SAFETY: as above.
unsafe impl Send for OwnedLane {}

const TASKS: usize = 3;
const STOPPER: usize = MAX_WORKER;

impl OwnedLane {
    /// Pops the next task. The caller owns the lane.
    fn pop(&self) -> Option<usize> {
        self.next.with_mut(|next| {
            // SAFETY: only the lane's owner touches the cursor, and the caller owns it.
            let i = unsafe { *next };
            (i < TASKS).then(|| {
                // SAFETY: as above.
                unsafe { *next = i + 1 };
                i
            })
        })
    }

    /// Pops everything left into `handed`. The caller owns the lane.
    fn hand_back(&self, handed: &AtomicUsize) {
        while let Some(v) = self.pop() {
            handed.fetch_or(1 << v, Ordering::AcqRel);
        }
    }
}

/// A run of tasks straight from a lane under one `RUNNING` section (phase.rs, "Runs of lane
/// tasks"; `WorkerLoop::serve`), against `shutdown_now`: it stops the worker (stealing nothing of
/// a chain: a run holds none) and then takes the lane through the lane's own word, at once if it
/// is `FREE`, by a steal offering "stop" if its owner is inside a task, and not while it is
/// `OWNED` (the owner is popping, or handing back). Every task is run or handed back, exactly
/// once, and everything handed back is handed back before `shutdown_now` returns.
#[test]
fn shutdown_now_takes_a_lane_from_a_run_of_tasks_exactly_once() {
    loom::model(|| {
        let phase = Arc::new(Phase::new());
        let lane = Arc::new(OwnedLane {
            word: Lane::new(),
            next: UnsafeCell::new(0),
            mailbox: Mailbox::new(),
        });
        assert!(lane.word.try_acquire(0)); // the worker found the lane with items
        let ran = Arc::new(AtomicUsize::new(0));
        let handed = Arc::new(AtomicUsize::new(0));

        let worker = {
            let (phase, lane, ran, handed) =
                (phase.clone(), lane.clone(), ran.clone(), handed.clone());
            thread::spawn(move || {
                // Stopped, while holding the lane and perhaps a popped task: hand both back,
                // then let the lane go (shutdown_now takes it from there).
                let stop = |held: Option<usize>| {
                    if let Some(v) = held {
                        handed.fetch_or(1 << v, Ordering::AcqRel);
                    }
                    lane.hand_back(&handed);
                    lane.word.release(0);
                };
                if !phase.enter_busy() {
                    stop(None);
                    return;
                }
                let mut in_run = false;
                loop {
                    let Some(v) = lane.pop() else {
                        if in_run && phase.leave_running() != AfterTask::Continue {
                            stop(None);
                        } else {
                            lane.word.release(0);
                        }
                        break;
                    };
                    if !in_run {
                        if !phase.enter_running() {
                            stop(Some(v));
                            break;
                        }
                        in_run = true;
                    } else if phase.stop_requested() {
                        phase.leave_running();
                        stop(Some(v));
                        break;
                    }
                    let run = lane.word.begin(0, v);
                    ran.fetch_or(1 << v, Ordering::AcqRel); // the task runs
                    match lane.word.end(run, &lane.mailbox) {
                        Ended::Kept => {}
                        Ended::Stolen(p) => {
                            assert_eq!(p, NonNull::dangling(), "only shutdown_now steals here");
                            phase.leave_running();
                            break;
                        }
                    }
                }
                phase.leave_busy();
            })
        };

        // shutdown_now: stop the worker (a run holds no chain: nothing to take from it), then
        // take the lane for good and hand back what is left in it.
        phase.stop();
        loop {
            let taken = match lane.word.phase() {
                LanePhase::Free => lane.word.try_acquire(STOPPER),
                LanePhase::Running => lane.word.watch().is_some_and(|w| {
                    lane.word
                        .try_steal(STOPPER, &w, &lane.mailbox, NonNull::dangling())
                        .is_ok()
                }),
                LanePhase::Owned => false,
            };
            if taken {
                break;
            }
            thread::yield_now();
        }
        lane.hand_back(&handed);
        each_task_once(worker, &ran, &handed, 0b111);
    });
}
