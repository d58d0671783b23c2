//! Loom model of the worker phase word (std-executor/src/phase.rs): `shutdown_now` takes the
//! queue behind a running task, and every queued task is either run or handed back, exactly once.
#![cfg(loom)]

use keyserial::loom_api::{AfterTask, Phase, Stopped};
use keyserial_core::chain::{BoxNode, Chain, Pushed};
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

type C = Chain<BoxNode<u32>>;

/// Pops everything left in a chain we own into the `handed` bit set.
fn hand_back(chain: &C, handed: &AtomicUsize) {
    // SAFETY (model): the caller owns the chain.
    while let Some(v) = unsafe { chain.pop_value() } {
        handed.fetch_or(1 << v, Ordering::AcqRel);
    }
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
        assert_eq!(r | h, 0b11, "a task was lost: ran {r:b} handed {h:b}");
    });
}
