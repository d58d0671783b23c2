//! Loom models of "one way to own a key" (`std-executor/src/baton.rs`): a key's chain baton held
//! outside the workers (by `cancel_key`, or by the run of a state task it handed back) is held
//! by a registered holder with a phase word of its own, which `shutdown_now` stops and steals
//! from exactly as it does a worker. Over the real registry (`baton::loom_hooks`, thin wrappers
//! over `OutsideHolds`), the real `Phase`, the real core chain and, for the last model, the real
//! `Control` and `WaitRegistry`.
//!
//! Stand-ins (each one RMW, as the real step it stands for):
//! - the registry of parked chains, for a chain parked for the key's hold: `Key::parked`, taken
//!   by a swap (the wait's hand-off CAS, `permit_wait.rs`);
//! - the ready queues: `Key::ready` (one chain, so one slot);
//! - `shutdown_now` (`serializer/shutdown.rs`): `stop_all`, the chains it stole, then the parked
//!   chains, then the ready queues; it runs after the routers stopped pushing (it stops every
//!   worker first), so each model joins its pusher before `stop_all`.
//!
//! Checked: each queued task is taken (by `cancel_key`), run, or handed back by `shutdown_now`,
//! exactly once, and everything `shutdown_now` does not hand back was taken or run before it
//! returns (nothing is taken or handed back afterwards).
//!
//! Each model names the seeded bug that made it fail (each since reverted).
#![cfg(loom)]

mod common;

use common::coverage::{assert_all_reached, count};
use keyserial::loom_api::baton::Holds;
use keyserial::loom_api::{AfterTask, Control, Phase, Stopped, WaitRegistry};
use keyserial_core::chain::{BoxNode, Chain, Pushed};
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

type C = Chain<BoxNode<u32>>;

/// The key's chain, named to the registry (`OutsideHold::set_current`) by this tag instead of
/// its entry's address (never dereferenced).
const TAG: usize = 8;

/// One key: its chain, where its baton may wait, and who got which task (bit sets).
#[derive(Default)]
struct Key {
    chain: C,
    /// The chain is parked (for the key's hold) and its baton belongs to that wait.
    parked: AtomicBool,
    /// The chain is on the ready queue.
    ready: AtomicBool,
    /// Tasks taken by `cancel_key` (its hand-back).
    taken: AtomicUsize,
    /// Tasks run.
    ran: AtomicUsize,
    /// Tasks handed back by `shutdown_now` (or by a worker it stopped).
    handed: AtomicUsize,
}

impl Key {
    /// Pops everything queued into `into`. The caller holds the baton.
    fn pop_all(&self, into: &AtomicUsize) {
        // SAFETY (model): the caller holds the chain's baton.
        while let Some(v) = unsafe { self.chain.pop_value() } {
            assert_eq!(into.fetch_or(1 << v, Ordering::AcqRel) & (1 << v), 0);
        }
    }

    /// A router pushes task `v`; the push that activates the chain hands it on.
    fn push(&self, v: u32, activated: impl FnOnce(&Key)) {
        match self.chain.push_value(v) {
            Ok(Pushed::Activated) => activated(self),
            Ok(Pushed::Queued) => {}
            Err(_) => panic!("no chain is retired here"),
        }
    }

    /// The baton goes to the ready queue (`Serializer::schedule`).
    fn schedule(&self) {
        assert!(!self.ready.swap(true, Ordering::AcqRel), "two batons");
    }

    /// The baton goes to a parked wait (the drainer of a held key parks it).
    fn park(&self) {
        assert!(!self.parked.swap(true, Ordering::AcqRel), "two batons");
    }

    /// The holder gives the chain back: released if nothing is queued, else to a worker (the
    /// ready queue).
    fn give_back(&self) {
        // SAFETY (model): the caller holds the chain's baton.
        if !unsafe { self.chain.try_release() } {
            self.schedule();
        }
    }

    /// `shutdown_now` after `stop_all`: drains the chains it stole, then a parked chain, then
    /// the ready queue, handing everything back.
    fn shutdown_drains(&self, stolen: Vec<usize>) {
        for tag in stolen {
            assert_eq!(tag, TAG);
            self.pop_all(&self.handed);
        }
        if self.parked.swap(false, Ordering::AcqRel) {
            self.pop_all(&self.handed);
        }
        if self.ready.swap(false, Ordering::AcqRel) {
            self.pop_all(&self.handed);
        }
    }

    /// Bit sets (taken, ran, handed).
    fn ledger(&self) -> [usize; 3] {
        [&self.taken, &self.ran, &self.handed].map(|a| a.load(Ordering::Acquire))
    }

    /// Called where `shutdown_now` returns: each task of `all` was taken, run or handed back,
    /// exactly once, already; then joins `threads` and checks that nothing moved afterwards.
    fn each_task_once_at_return(&self, all: usize, threads: Vec<thread::JoinHandle<()>>) {
        let at_return = self.ledger();
        let [t, r, h] = at_return;
        assert_eq!(
            (t & r) | (t & h) | (r & h),
            0,
            "a task went two ways: taken {t:b} ran {r:b} handed {h:b}"
        );
        assert_eq!(
            t | r | h,
            all,
            "a task neither taken, run nor handed back when shutdown_now returned: taken {t:b} \
             ran {r:b} handed {h:b}"
        );
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(
            self.ledger(),
            at_return,
            "a task was taken, run or handed back after shutdown_now returned"
        );
    }
}

/// Model a. `cancel_key` as an outside holder (`Serializer::cancel_key`,
/// `key_control::hold_chain`) races `shutdown_now`'s `stop_all`. The key's chain starts idle;
/// a router pushes tasks 0 and 1 (the key is held, so whoever activates the chain ends up
/// parking it: here the activating push parks it at once). The holder registers, goes `BUSY`,
/// takes the baton from the parked wait or claims the idle chain (then the pushes queue behind
/// it), pops everything (its hand-back), gives the chain back (released, or to the ready queue
/// if a push came in after its pops), and only then leaves `BUSY`. `hold_chain` tries again
/// later when it finds the chain busy; one attempt is enough here (the chain then reaches
/// `shutdown_now` by its wait). A holder that registers after `stop_all` is refused and takes
/// nothing.
///
/// Seeded bugs that failed it: the holder leaving `BUSY` before it gives the chain back (a
/// push queued after its pops is lost: `stop_all` returns `Idle`, the parked slot and the ready
/// queue are empty); `OutsideHolds::register` not refusing once closed (a holder registered
/// after `stop_all` takes the parked chain from under `shutdown_now`, whose return misses
/// tasks).
#[test]
fn cancel_key_against_stop_all_each_task_once() {
    static SEEN: [std::sync::atomic::AtomicUsize; 5] = counters!(5);
    loom::model(|| {
        let holds = Arc::new(Holds::new());
        let key = Arc::new(Key::default());

        let pusher = {
            let key = key.clone();
            thread::spawn(move || {
                for v in 0..2 {
                    key.push(v, Key::park);
                }
            })
        };
        let holder = {
            let (holds, key) = (holds.clone(), key.clone());
            thread::spawn(move || {
                let Some(reg) = holds.register() else {
                    count(&SEEN, 0); // refused: shutdown_now hands back everything
                    return;
                };
                if !reg.phase().enter_busy() {
                    count(&SEEN, 1); // stopped before its first attempt
                    return;
                }
                let from_wait = key.parked.swap(false, Ordering::AcqRel);
                if from_wait || key.chain.try_claim() {
                    count(&SEEN, if from_wait { 2 } else { 3 });
                    key.pop_all(&key.taken);
                    key.give_back();
                } else {
                    count(&SEEN, 4); // busy (being parked): hold_chain would look again
                }
                reg.phase().leave_busy();
            })
        };

        // shutdown_now: the routers stopped first.
        pusher.join().unwrap();
        let stolen = holds.stop_all();
        assert!(stolen.is_empty(), "a cancel_key is never inside a task");
        key.shutdown_drains(stolen);
        key.each_task_once_at_return(0b11, vec![holder]);
        assert_eq!(key.ran.load(Ordering::Acquire), 0);
    });
    assert_all_reached(
        &SEEN,
        &[
            "refused",
            "stopped",
            "took the parked chain",
            "claimed the idle chain",
            "found it busy",
        ],
    );
}

/// Model b. The run of a state task that `cancel_key` handed back (`handed_back.rs`,
/// `run_handed_back`): the holder registers, takes the chain's baton from its parked wait
/// (task 0 queued on it), names the chain (`set_current`), enters `RUNNING` and runs its task
/// while a router pushes task 1 onto the chain. `shutdown_now`'s `stop_all` may steal the chain
/// (`Stopped::Stole`) and hand back what is queued; the holder then never touches it. Leaving
/// `RUNNING`: on `Continue` the holder pops the rest and runs it (standing for the worker its
/// give-back schedules), then releases the chain or puts it on the ready queue; on `HandBack`
/// it gives the chain back on the ready queue (`give_back` after a stop), which `shutdown_now`
/// drains once the holder left `BUSY`; stopped before `RUNNING`, the same.
///
/// Seeded bugs that failed it: `set_current` after `enter_running` (a steal in between finds
/// no chain named: its queue is neither run nor handed back); `AfterTask::Stolen` treated as
/// `Continue` (the holder pops the chain `shutdown_now` drains: a task both ran and was handed
/// back, or loom's concurrent-access check on the chain).
#[test]
fn handed_back_run_against_stop_all_each_task_once() {
    static SEEN: [std::sync::atomic::AtomicUsize; 6] = counters!(6);
    loom::model(|| {
        let holds = Arc::new(Holds::new());
        let key = Arc::new(Key::default());
        assert_eq!(key.chain.push_value(0), Ok(Pushed::Activated));
        key.park();
        let task_ran = Arc::new(AtomicBool::new(false));

        let pusher = {
            let key = key.clone();
            thread::spawn(move || key.push(1, Key::schedule))
        };
        let holder = {
            let (holds, key, task_ran) = (holds.clone(), key.clone(), task_ran.clone());
            thread::spawn(move || {
                let Some(reg) = holds.register() else {
                    count(&SEEN, 0); // refused: runs against a fresh state, holds nothing
                    return;
                };
                if !reg.phase().enter_busy() {
                    count(&SEEN, 1);
                    return;
                }
                assert!(
                    key.parked.swap(false, Ordering::AcqRel),
                    "only shutdown_now takes the parked chain, after stop_all"
                );
                reg.set_current(TAG);
                if !reg.phase().enter_running() {
                    count(&SEEN, 2); // stopped meanwhile: give the chain back
                    key.schedule();
                    reg.phase().leave_busy();
                    return;
                }
                task_ran.store(true, Ordering::Release); // the handed-back task runs
                match reg.phase().leave_running() {
                    AfterTask::Stolen => count(&SEEN, 3), // the chain is shutdown_now's
                    AfterTask::Continue => {
                        count(&SEEN, 4);
                        key.pop_all(&key.ran);
                        key.give_back();
                    }
                    AfterTask::HandBack => {
                        count(&SEEN, 5);
                        key.schedule();
                    }
                }
                reg.phase().leave_busy();
            })
        };

        pusher.join().unwrap();
        let stolen = holds.stop_all();
        key.shutdown_drains(stolen);
        key.each_task_once_at_return(0b11, vec![holder]);
        assert_eq!(key.taken.load(Ordering::Acquire), 0);
    });
    assert_all_reached(
        &SEEN,
        &[
            "refused",
            "stopped",
            "stopped before running",
            "stolen",
            "continue",
            "hand back",
        ],
    );
}

/// Model c. `cancel_key` from inside a task of its own key, on the worker that runs the key's
/// chain (`Held::Mine`): the worker, `RUNNING` inside task 0 with tasks 1 and 2 queued,
/// suspends `RUNNING` (`Phase::suspend_running`), pops the queued tasks, and resumes; then the
/// task returns and the worker leaves `RUNNING` as usual. `shutdown_now`'s `Phase::stop` races
/// it and hands back the chain's queue if it stole the chain.
///
/// Seeded bugs that failed it: `cancel_key` popping without suspending `RUNNING` (the bug the
/// suspend fixed: it and `shutdown_now`'s steal both popped the chain); `suspend_running` not
/// refusing once `STOLEN` (the same double pop). Also `Phase::stop` not waiting out `BUSY`
/// (which fails models a, b and c).
#[test]
fn cancel_key_inside_its_task_against_stop_each_task_once() {
    static SEEN: [std::sync::atomic::AtomicUsize; 5] = counters!(5);
    loom::model(|| {
        let phase = Arc::new(Phase::new());
        let key = Arc::new(Key::default());
        for v in 0..3 {
            key.push(v, |_| {});
        }
        // The worker took the chain and is inside task 0.
        assert!(phase.enter_busy());
        // SAFETY (model): the activating push made us the owner.
        assert_eq!(unsafe { key.chain.pop_value() }, Some(0));
        assert!(phase.enter_running());

        let worker = {
            let (phase, key) = (phase.clone(), key.clone());
            thread::spawn(move || {
                // Inside task 0: cancel_key(its own key).
                if phase.suspend_running() {
                    count(&SEEN, 0);
                    key.pop_all(&key.taken);
                    phase.resume_running();
                } else {
                    count(&SEEN, 1); // shutdown_now stole the chain: nothing taken
                }
                // Task 0 returns.
                match phase.leave_running() {
                    AfterTask::Stolen => count(&SEEN, 2),
                    AfterTask::Continue => {
                        count(&SEEN, 3);
                        key.pop_all(&key.ran);
                        key.give_back();
                    }
                    AfterTask::HandBack => {
                        // STOP came just before the task returned, the steal not yet: the
                        // worker hands back the queue itself before it goes idle.
                        count(&SEEN, 4);
                        key.pop_all(&key.handed);
                    }
                }
                phase.leave_busy();
            })
        };

        if phase.stop() == Stopped::Stole {
            key.pop_all(&key.handed);
        }
        if key.ready.swap(false, Ordering::AcqRel) {
            key.pop_all(&key.handed);
        }
        key.each_task_once_at_return(0b110, vec![worker]);
    });
    assert_all_reached(
        &SEEN,
        &[
            "suspended",
            "found it stolen",
            "stolen",
            "continue",
            "hand back",
        ],
    );
}

/// What a parked chain waits for (`ParkedFor`), as the model's wait value.
const PAUSE: u8 = 0;

/// Model d. A `cancel_key` hold parks the chain like a pause (`Control::hold`, `Control::park`:
/// the wait is a `ParkedFor::Pause` one), and a graceful shutdown's `cancel_paused` steals the
/// pause waits. For a key that is only held (not paused by the user) it must not cancel the
/// tasks: it parks the chain again (or schedules it) and the holder, which may have lost its
/// first steal to it, takes the chain from the new wait. Over the real `Control` and
/// `WaitRegistry`; the holder follows `hold_chain` (`wait_id`, `steal_one`, `forget_wait`;
/// `try_claim` of an idle chain), then `cancel_key`'s give-back (`unhold`,
/// `park_or_schedule`). No `shutdown_now` here, so the holder's phase word plays no part.
///
/// With `pause`, a user's `pause` (`key_control::pause`: `Control::pause`, then a claim of an
/// idle chain) races both: then `cancel_paused` may cancel what the holder has not taken yet.
/// Either way each task is taken or cancelled, exactly once, and only a key paused by the user
/// loses tasks to `cancel_paused`; the chain ends parked if the key is paused, else on the
/// ready queue.
///
/// Seeded bug that failed it: `cancel_paused` without its `is_paused_by_user` check (the held
/// key's tasks are cancelled instead of taken by `cancel_key`).
fn graceful_cancel(pause: bool, seen: &'static [std::sync::atomic::AtomicUsize]) {
    loom::model(move || {
        let control = Arc::new(Control::new());
        let waits: Arc<WaitRegistry<u8>> = Arc::new(WaitRegistry::new());
        let key = Arc::new(Key::default());
        // `park_or_schedule` by the chain's holder.
        let park_or_schedule = {
            let (control, waits) = (control.clone(), waits.clone());
            move |key: &Key| {
                if !control.park(|| waits.register(PAUSE).id()) {
                    key.schedule();
                }
            }
        };
        // The key is held by cancel_key; its drainer parked the chain, tasks 0 and 1 queued.
        control.hold();
        assert_eq!(key.chain.push_value(0), Ok(Pushed::Activated));
        assert_eq!(key.chain.push_value(1), Ok(Pushed::Queued));
        park_or_schedule(&key);
        assert_eq!(waits.len(), 1);

        let holder = {
            let (control, waits, key, park_or_schedule) = (
                control.clone(),
                waits.clone(),
                key.clone(),
                park_or_schedule.clone(),
            );
            thread::spawn(move || {
                // hold_chain
                let mut lost_once = false;
                loop {
                    if let Some(id) = control.wait_id() {
                        if let Some(w) = waits.get(id) {
                            if waits.steal_one(&w) {
                                control.forget_wait();
                                break;
                            }
                        }
                    } else if key.chain.try_claim() {
                        break;
                    }
                    lost_once = true;
                    thread::yield_now();
                }
                count(seen, usize::from(lost_once));
                key.pop_all(&key.taken);
                control.unhold();
                park_or_schedule(&key);
            })
        };
        let pauser = pause.then(|| {
            let (control, key, park_or_schedule) =
                (control.clone(), key.clone(), park_or_schedule.clone());
            thread::spawn(move || {
                control.pause();
                if key.chain.try_claim() {
                    park_or_schedule(&key);
                }
            })
        });

        // The graceful shutdown's cancel_paused.
        let mut stolen = 0;
        waits.steal_where(|w| *w == PAUSE, |_| stolen += 1);
        assert!(stolen <= 1);
        if stolen == 1 {
            control.forget_wait();
            if control.is_paused_by_user() {
                count(seen, 2);
                key.pop_all(&key.handed); // cancelled
            }
            park_or_schedule(&key);
        }

        holder.join().unwrap();
        let paused = pauser.map(|p| p.join().unwrap()).is_some();
        let [t, _, c] = key.ledger();
        assert_eq!(t & c, 0, "a task taken and cancelled");
        assert_eq!(t | c, 0b11, "a task neither taken nor cancelled");
        if !paused {
            assert_eq!(c, 0, "a held key's task cancelled");
        }
        // Given back: parked for the pause, or to a worker (which parks it if the key is
        // paused by then: a pause that found the chain owned leaves that to its holder).
        let parked = control.wait_id().is_some();
        assert_eq!(waits.len(), usize::from(parked));
        assert!(parked != key.ready.load(Ordering::Acquire), "one baton");
        assert!(paused || !parked, "parked for nothing");
    });
}

#[test]
fn graceful_cancel_leaves_a_held_key_alone() {
    static SEEN: [std::sync::atomic::AtomicUsize; 3] = counters!(3);
    graceful_cancel(false, &SEEN);
    assert_all_reached(
        &SEEN[..2],
        &["took it at once", "lost a steal to cancel_paused"],
    );
}

#[test]
fn graceful_cancel_of_a_held_and_paused_key_each_task_once() {
    static SEEN: [std::sync::atomic::AtomicUsize; 3] = counters!(3);
    graceful_cancel(true, &SEEN);
    assert_all_reached(
        &SEEN,
        &[
            "took it at once",
            "lost a steal to cancel_paused",
            "cancel_paused cancelled",
        ],
    );
}
