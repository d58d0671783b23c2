//! Loom models of "Waking for a push" (std-executor/src/lanes.rs): no push to a lane is left
//! unnoticed, whatever the interleaving of a submitter, the lane's owner and a sleeper.
//!
//! **What is real.** The lane's word is core's real `Lane` (core/src/lane.rs). The submitter's
//! half (`push; fence(SeqCst); phase`), the owner's half (`release; fence(SeqCst); look;
//! try_acquire`), `try_take` and `queued_anywhere` are the very functions `Lanes::push`,
//! `Lane::release_or_keep`, `Lanes::try_take` and `Lanes::queued_anywhere` are made of, reached
//! through `keyserial::loom_api::lanes` (lanes.rs `loom_hooks`), over plain `u32` items instead of
//! `Item<K>` (the protocol never looks into an item). Under `cfg(loom)` the lane's FIFO is
//! lanes.rs's `Fifo`, a stand-in for core's `fifo::Fifo` (modelled on its own in fifo.rs): the
//! items sit under a loom mutex, but emptiness is a `SeqCst` length word read without the lock,
//! as `Fifo::is_empty` reads its positions, so the emptiness check borrows no happens-before from
//! the lock that the real queue would not give.
//!
//! The submitter's whole rule is real too (`push_then_look` returns what to do: nothing while a
//! worker searches, the elastic hint while nobody is idle, and, while a worker sleeps and none
//! searches, a notify iff the lane is `FREE` or `deep > 0`); models (a) to (c) give it a sleep
//! word reading "asleep, not searching", the case in which the lane decides.
//!
//! **What is transcribed** (worker/ is not a loom-checked module): the sleeper's registration
//! in `WorkerLoop::park` (worker/park.rs: look at every lane; if
//! none has items, `deep.fetch_add(1, SeqCst)` and look once more; sleep without a bound only if
//! that look found nothing). `deep` is the models' own loom `AtomicUsize`, as `Lanes::deep` is. A
//! sleeper's `fetch_sub` after its sleep is left out: it comes after the window the claims are
//! about. See "The sleeper's fence" below for the one place where the transcription differs.
//!
//! **The claims and why they follow.** Both halves put a `SeqCst` fence between their write (the
//! push; the release) and their read (the phase; the second look). `SeqCst` fences are totally
//! ordered: whichever comes second sees the other's write. So for every push and every release of
//! its lane, either the owner's look sees the item (it re-acquires and pops it) or the submitter's
//! phase read sees `FREE` (it notifies); never neither. The sleeper pairs its `deep` registration
//! with the submitter's fence the same way: either the submitter sees `deep > 0` (it notifies) or
//! the sleeper's second look sees the item (it only naps). The models check these outcomes at the
//! end of every execution:
//!
//! - [`push_vs_owner_going_idle`]: one submitter, one owner that pops, finds the lane empty and
//!   releases it (claims 1 and 3).
//! - [`push_behind_a_running_owner_vs_deep_sleeper`]: the owner is inside a task (`RUNNING`, via
//!   core's `begin`); one submitter, one sleeper (claim 2).
//! - [`push_vs_worker_going_to_sleep`]: no owner, a free lane; a worker that was searching
//!   registers as asleep (the real `Sleep::try_sleep`), then looks for a free lane with items
//!   (`park`'s fence, transcribed, and the real `free_work`); the submitter reads the real sleep
//!   word (`Sleep::idle_now`) and wakes nobody while a worker searches or none sleeps. The same
//!   fence pairing: either it sees the registration and notifies, or the sleeper sees the item
//!   (removing the sleeper's fence fails this model).
//! - [`two_pushes_vs_owner_and_woken_workers`]: two submitters and the owner; a submitter that
//!   sees `FREE` then acts as the worker its notify wakes (the real `try_take`, then popping and
//!   `release_or_keep` like an owner). Every item is popped by the end, and the lane is never
//!   owned by two workers at once: each owner bumps a loom `UnsafeCell` while it owns the lane, so
//!   loom reports two owners at once, or an owner change without happens-before (claim 3).
//!
//! Coverage counters (std statics, outside the model) check that each model reached the
//! interleavings it exists for.
//!
//! **The sleeper's fence.** `park` issues a `fence(SeqCst)` right after its
//! `deep.fetch_add(1, SeqCst)`, and so does the modelled sleeper. Without it the pairing would
//! rest on `Fifo::push` and `Fifo::is_empty` being `SeqCst` operations in C11's single
//! total order, which loom 0.7 does not model for atomic accesses (only for fences): the exact
//! transcription of the fenceless version failed model (b) here on an execution C11 forbids. With
//! the fence, the real code no longer depends on the queue's own orderings, and the model checks
//! it as written.
//!
//! **Mutation check** (by hand, not kept): deleting the fence of `push_then_look` fails all three
//! models; deleting the fence of `release_then_look`, or weakening it to `Release`, fails the first
//! and the third (the second has no release). The stand-in FIFO matters: with `is_empty` taking
//! the mutex (a plain `Mutex<VecDeque>`), every model passes even with *both* fences deleted, since
//! the lock then orders the owner's release before the submitter's phase read.
#![cfg(loom)]

mod common;

use common::coverage::{assert_all_reached, count};

use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};

use keyserial::loom_api::lanes::{self as hooks, AfterPush, Fifo};
use keyserial::loom_api::{Idle, Parker, Sleep};
use keyserial_core::lane::{Lane, Phase};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// The worker id of the lane's first owner.
const OWNER: usize = 0;

/// The preemption bound of the three-thread model (the two-thread ones are exhaustive).
const PREEMPTIONS: usize = 4;

/// One lane (the real word, the loom FIFO), the deep-sleeper count, and a cell that only the
/// lane's current owner touches.
struct World {
    word: Lane,
    queue: Fifo<u32>,
    /// `Lanes::deep`.
    deep: AtomicUsize,
    /// Pops by owners: bumped by whoever owns the lane, so loom checks exclusive ownership.
    owned: UnsafeCell<usize>,
}

// SAFETY: `owned` is touched only by the lane's owner (loom checks that); the rest is Sync.
unsafe impl Sync for World {}
// SAFETY: as above.
unsafe impl Send for World {}

impl World {
    /// A lane owned by worker [`OWNER`] (acquired on the main thread).
    fn owned() -> Arc<World> {
        let w = Arc::new(World {
            word: Lane::new(),
            queue: Fifo::new(),
            deep: AtomicUsize::new(0),
            owned: UnsafeCell::new(0),
        });
        assert!(w.word.try_acquire(OWNER));
        w
    }

    /// The submitter: `Lanes::push` (real), with the sleep word reading "a worker is asleep,
    /// none searching" (the case in which the lane's phase decides; model (d) checks the
    /// others). Returns whether it notifies.
    fn submit(&self, item: u32) -> bool {
        let after = hooks::push(
            &self.word,
            &self.queue,
            move || item,
            &self.deep,
            || Idle {
                asleep: true,
                searching: false,
            },
        );
        after.ok() == Some(AfterPush::Notify) // the lane is never closed here
    }

    /// One pop by the lane's owner (the caller owns the lane).
    fn pop(&self) -> Option<u32> {
        // SAFETY: the caller owns the lane, so it is the FIFO's only popper.
        let item = unsafe { self.queue.pop() };
        self.owned.with_mut(|n| {
            // SAFETY: only the lane's owner touches the cell, and the caller owns the lane.
            unsafe { *n += 1 }
        });
        item
    }

    /// The owner `me`'s loop: pop until empty, then `release_or_keep` (real); on again if it
    /// kept the lane. Returns the items it popped, and how many times it re-acquired.
    fn own(&self, me: usize) -> (Vec<u32>, usize) {
        let (mut popped, mut kept) = (Vec::new(), 0);
        loop {
            while let Some(item) = self.pop() {
                popped.push(item);
            }
            if !hooks::release_or_keep(&self.word, &self.queue, me) {
                return (popped, kept);
            }
            kept += 1;
        }
    }

    /// The sleeper's look and deep registration (`WorkerLoop::park`, transcribed, plus the fence
    /// discussed in the module docs). `true` if it saw an item (it naps with a bound),
    /// `false` if it sleeps without one.
    fn sleep(&self) -> bool {
        if hooks::queued_anywhere(&[&self.queue]) {
            return true;
        }
        self.deep.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        hooks::queued_anywhere(&[&self.queue])
    }

    /// Pops what is left without an owner; call once every other thread is joined.
    fn leftovers(&self) -> Vec<u32> {
        // SAFETY: every other thread is joined: this is the only popper.
        std::iter::from_fn(|| unsafe { self.queue.pop() }).collect()
    }
}

/// Spawns a model thread running `f` on the world.
fn spawn<R: 'static>(
    w: &Arc<World>,
    f: impl FnOnce(&World) -> R + 'static,
) -> thread::JoinHandle<R> {
    let w = w.clone();
    thread::spawn(move || f(&w))
}

#[test]
fn push_vs_owner_going_idle() {
    // Worker 0 owns the lane and runs its loop (pop until empty, release_or_keep); one
    // submitter pushes item 1. Never neither: the owner popped the item (before its release, or
    // after re-acquiring), or the submitter read FREE and notifies. If the item is still queued
    // at the end, the lane is FREE and the submitter notified.
    static OUTCOMES: [StdAtomicUsize; 4] = counters!(4);
    loom::model(|| {
        let w = World::owned();
        let owner = spawn(&w, |w| w.own(OWNER));
        let submitter = spawn(&w, |w| w.submit(1));
        let (popped, kept) = owner.join().unwrap();
        let notify = submitter.join().unwrap();
        assert_eq!(w.word.phase(), Phase::Free, "the owner left the lane owned");
        let left = w.leftovers();
        assert_eq!(
            popped.len() + left.len(),
            1,
            "the item was lost or popped twice"
        );
        assert!(
            popped == [1] || notify,
            "lost wakeup: item queued, owner gone, submitter read no FREE"
        );
        match (popped.as_slice(), kept, notify) {
            ([1], 0, false) => count(&OUTCOMES, 0),
            ([1], _, false) => count(&OUTCOMES, 1),
            ([], 0, true) => count(&OUTCOMES, 2),
            ([1], _, true) => count(&OUTCOMES, 3),
            other => panic!("impossible outcome {other:?}"),
        }
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "popped before the release, submitter saw the owner",
            "re-acquired and popped",
            "released first, submitter notifies",
            "popped and notified both",
        ],
    );
}

/// Model (b): the owner is inside a task.
fn running_owner_vs_sleeper(outcomes: &'static [StdAtomicUsize]) {
    loom::model(move || {
        let w = World::owned();
        let _run = w.word.begin(OWNER, 10);
        let sleeper = spawn(&w, |w| w.sleep());
        let submitter = spawn(&w, |w| w.submit(1));
        let saw_item = sleeper.join().unwrap();
        let notify = submitter.join().unwrap();
        assert_eq!(
            w.word.phase(),
            Phase::Running,
            "the owner never leaves its task here"
        );
        assert!(
            notify || saw_item,
            "item queued behind a running owner, sleeper in a deep sleep, nobody notified"
        );
        count(outcomes, usize::from(notify) * 2 + usize::from(saw_item));
    });
}

#[test]
fn push_behind_a_running_owner_vs_deep_sleeper() {
    // Worker 0 is inside a task (RUNNING, begun on the main thread) and stays there; one
    // submitter pushes item 1; one sleeper looks, registers as deep and looks again. Either the
    // submitter saw deep > 0 (it notifies) or the sleeper saw the item (it naps and watches).
    static OUTCOMES: [StdAtomicUsize; 4] = counters!(4);
    running_owner_vs_sleeper(&OUTCOMES);
    assert_all_reached(
        &OUTCOMES[1..],
        &["sleeper saw the item", "submitter saw deep", "both"],
    );
    assert_eq!(OUTCOMES[0].load(StdOrdering::Relaxed), 0);
}

#[test]
fn two_pushes_vs_owner_and_woken_workers() {
    // Worker 0 owns the lane and runs its loop; submitters 1 and 2 push items 1 and 2. A
    // submitter that reads FREE acts as the worker its notify wakes (ids 1, 2): the real
    // `try_take`, then the owner's loop. By the end every item was popped exactly once, by
    // exclusive owners (the `owned` cell), and the lane is FREE.
    static OUTCOMES: [StdAtomicUsize; 3] = counters!(3);
    let mut model = loom::model::Builder::new();
    // Three threads with loops and a mutex: unbounded, the search does not end in minutes.
    // LOOM_MAX_PREEMPTIONS overrides the bound.
    if model.preemption_bound.is_none() {
        model.preemption_bound = Some(PREEMPTIONS);
    }
    model.check(|| {
        let w = World::owned();
        let owner = spawn(&w, |w| w.own(OWNER).0);
        let submitters = [1u32, 2].map(|me| {
            spawn(&w, move |w| {
                let notify = w.submit(me);
                let took = notify && hooks::try_take(&w.word, &w.queue, me as usize);
                let popped = if took {
                    w.own(me as usize).0
                } else {
                    Vec::new()
                };
                (notify, took, popped)
            })
        });
        let mut popped = owner.join().unwrap();
        let mut notified = 0;
        let mut taken = 0;
        for s in submitters {
            let (notify, took, p) = s.join().unwrap();
            notified += usize::from(notify);
            taken += usize::from(took);
            popped.extend(p);
        }
        assert_eq!(w.word.phase(), Phase::Free, "a lane left owned");
        assert!(
            w.leftovers().is_empty(),
            "an item left queued with no owner"
        );
        popped.sort_unstable();
        assert_eq!(popped, [1, 2], "an item lost or popped twice");
        count(
            &OUTCOMES,
            if taken > 0 {
                2
            } else {
                usize::from(notified > 0)
            },
        );
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "the owner popped both, nobody notified",
            "notified, the owner popped it anyway",
            "a woken worker took the lane",
        ],
    );
}

#[test]
fn push_vs_worker_going_to_sleep() {
    // No owner: the lane is FREE. Worker 0 is searching (counted in the sleep word); its search
    // found nothing, so it registers as asleep (`Sleep::try_sleep`, real) and then, as `park`
    // does (transcribed: a `SeqCst` fence, then `Lanes::free_work`, real), looks for a free lane
    // with items once more. One submitter pushes item 1 with the real rule, reading the real
    // sleep word (`Sleep::idle_now`): while a worker searches or none sleeps it wakes nobody.
    // Never neither: the submitter notifies, or the sleeper's look sees the item.
    static OUTCOMES: [StdAtomicUsize; 3] = counters!(3);
    loom::model(|| {
        let parker = Parker::new();
        let sleep = Arc::new(Sleep::new(vec![parker.unparker().clone()].into()));
        sleep.start_searching();
        let snapshot = sleep.snapshot();
        let w = Arc::new(World {
            word: Lane::new(),
            queue: Fifo::new(),
            deep: AtomicUsize::new(0),
            owned: UnsafeCell::new(0),
        });
        let sleeper = {
            let (w, sleep) = (w.clone(), sleep.clone());
            thread::spawn(move || {
                if !sleep.try_sleep(0, snapshot, true) {
                    return true; // something happened since the snapshot: it searches again
                }
                fence(Ordering::SeqCst);
                hooks::free_work(&[(&w.word, &w.queue)])
            })
        };
        let submitter = {
            let (w, sleep) = (w.clone(), sleep.clone());
            thread::spawn(move || {
                hooks::push(&w.word, &w.queue, || 1, &w.deep, || sleep.idle_now()).ok()
                    == Some(AfterPush::Notify)
            })
        };
        let saw_item = sleeper.join().unwrap();
        let notify = submitter.join().unwrap();
        assert!(
            notify || saw_item,
            "lost wakeup: the worker sleeps, the item waits in a free lane, nobody notified"
        );
        count(
            &OUTCOMES,
            match (notify, saw_item) {
                (false, true) => 0,
                (true, false) => 1,
                _ => 2,
            },
        );
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "the sleeper saw the item",
            "the submitter saw the sleeper",
            "both",
        ],
    );
}
