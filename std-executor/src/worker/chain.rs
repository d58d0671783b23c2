//! Running what the ready queues hold: a key's chain, drained under the fairness budget (its
//! futures polled there, `future_task.rs`), or an unkeyed task.
//!
//! # Draining and fairness
//!
//! The worker owns the chain it popped. It runs at most `fairness_budget` tasks, then, if the chain
//! still has work, pushes it to the back of its injector (behind keys that arrived meanwhile) and
//! notifies; otherwise it releases the chain (`CAS(ACTIVE -> 0)`, which fails if a push came in:
//! then it keeps draining). After a release, the key's idle bookkeeping runs (`idle.rs`) under an
//! epoch guard taken *before* the release, since the entry may be retired by others from then on.

use crate::future_task;
use crate::wake_state::WakeState;
use std::ptr::NonNull;

use super::{After, WorkerLoop};
use crate::key::{KeyEntry, Runnable};
use crate::owner::Owned;
use crate::permits::PermitOutcome;
use crate::phase::AfterTask;
use crate::sync::Ordering;
use crate::task::{Abandon, Kind, TaskRef};

impl<K> WorkerLoop<'_, K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    pub(super) fn run_unkeyed(&mut self, task: TaskRef) -> After {
        self.slot.current.store(0, Ordering::Relaxed);
        if !self.slot.phase.enter_running() {
            self.hand_back(task);
            return After::Exit;
        }
        self.release_capacity();
        self.bump(|c| &c.started);
        self.slot.direct_hash.store(0, Ordering::Relaxed); // no key
        task.run(None, &|panicked| self.finish_task(panicked));
        match self.slot.phase.leave_running() {
            AfterTask::Continue => After::Continue,
            AfterTask::Stolen | AfterTask::HandBack => After::Exit,
        }
    }

    pub(super) fn run_chain(&mut self, entry_ptr: NonNull<KeyEntry<K>>) -> After {
        // SAFETY: a chain on a ready queue is handed over with its baton (an activating push
        // or its last holder put it there), and we popped it: the baton is ours.
        let mut owned = unsafe { Owned::assume(entry_ptr) };
        // SAFETY: we hold the chain's baton, so the entry is not retired and stays allocated
        // until we give the baton up; `owned` is not used past that point.
        let entry = unsafe { entry_ptr.as_ref() };
        let ks = entry.value();
        let budget = self.shared.config().fairness_budget;
        let mut ran = 0;
        // Backs off on failed releases in a row with nothing to pop (see below).
        let stall = crossbeam_utils::Backoff::new();
        loop {
            if ran >= budget {
                let guard = self.epoch.pin();
                match owned.release_if_empty() {
                    Ok(()) => self.released(entry_ptr, &guard),
                    // Yield: to the back of the global queue, behind keys that arrived
                    // meanwhile, where any worker can take it.
                    Err(o) => self.shared.schedule(Runnable::Chain(o.into_ptr()), None),
                }
                return After::Continue;
            }
            let Some((mut task, superseded)) = owned.pop_coalescing() else {
                // A paused key's drained chain stays owned, parked (`control.rs`): the key
                // stays live and its later items queue behind the pause.
                if ks.control.is_paused() {
                    match crate::key_control::park(self.shared, owned) {
                        Ok(()) => return After::Continue,
                        Err(o) => owned = o,
                    }
                }
                let guard = self.epoch.pin();
                match owned.release_if_empty() {
                    Ok(()) => {
                        self.released(entry_ptr, &guard);
                        return After::Continue;
                    }
                    Err(o) => owned = o,
                }
                // Nothing to pop, yet a push is queued: it is between its two steps (core
                // `chain`, "The pop"), normally a few instructions from done. Back off (spin,
                // then yield, which lets a preempted pusher on this core run); once the backoff
                // is spent, do not wait any longer: queue the key behind the others.
                if stall.is_completed() {
                    self.shared
                        .schedule(Runnable::Chain(owned.into_ptr()), None);
                    return After::Continue;
                }
                crate::sync::snooze(&stall);
                continue;
            };
            stall.reset();
            if superseded {
                ks.seen.left(1);
                task.abandon(Abandon::Superseded);
                self.bump(|c| &c.dropped);
                self.release_capacity();
                continue;
            }
            // Paused: the task goes back, and the chain parks until `resume` (`control.rs`;
            // read after the pop, which acquired the task's push). A future is checked in
            // `poll_future`: a started one is the key's running task and goes on.
            if task.kind() != Kind::Future && ks.control.is_paused() {
                // SAFETY: `task` is the task we popped last.
                unsafe { owned.put_back(task) };
                match crate::key_control::park(self.shared, owned) {
                    Ok(()) => return After::Continue,
                    Err(o) => owned = o,
                }
                continue;
            }
            if task.kind() == Kind::Future {
                match self.poll_future(owned, task) {
                    Polled::Again(o) => {
                        owned = o;
                        ran += 1;
                        continue;
                    }
                    Polled::Parked => return After::Continue,
                    Polled::Exit => return After::Exit,
                }
            }
            let mut permit = None;
            if task.kind() == Kind::Permits {
                match crate::permits::acquire_or_park(self.shared, owned, task) {
                    PermitOutcome::Run(o, t, p) => {
                        owned = o;
                        task = t;
                        permit = p;
                    }
                    PermitOutcome::Parked => return After::Continue,
                    PermitOutcome::Dropped(o) => {
                        owned = o;
                        ks.seen.left(1);
                        self.bump(|c| &c.dropped);
                        self.release_capacity();
                        continue;
                    }
                }
            }
            self.slot
                .current
                .store(entry_ptr.as_ptr() as usize, Ordering::Relaxed);
            self.slot
                .direct_hash
                .store(entry.hash() | 1, Ordering::Relaxed);
            if !self.slot.phase.enter_running() {
                crate::user::drop_quietly(permit);
                // `shutdown_now`: put the task back and leave the whole chain to the others
                // (through the global queue): a worker routing a lane may push onto the chain
                // until every worker has stopped, which `shutdown_now` waits for before it
                // drains the queues; a worker not stopped yet may still run the chain.
                // SAFETY: `task` is the task we popped last.
                unsafe { owned.put_back(task) };
                self.shared.global().push(Runnable::Chain(owned.into_ptr()));
                return After::Exit;
            }
            self.release_capacity();
            self.bump(|c| &c.started);
            ks.seen.left(1);
            ks.seen.set_running(true);
            let done = |panicked| {
                self.finish_task(panicked);
                if panicked && self.pauses_on_panic() {
                    // Before the handle resolves; this loop parks the chain at its next pop.
                    ks.control.pause();
                }
            };
            if task.kind() == Kind::State {
                let slot = owned.state_slot();
                let mut source = crate::state::EntrySource {
                    slot,
                    key: entry.key(),
                    init: &*self.shared.state_hooks().init,
                };
                crate::state::run_with(&mut source, || task.run(permit, &done));
            } else {
                task.run(permit, &done);
            }
            ks.seen.set_running(false);
            ran += 1;
            match self.slot.phase.leave_running() {
                AfterTask::Continue => {}
                AfterTask::Stolen => {
                    // The chain is not ours any more; the key's state goes to its handed-back
                    // tasks.
                    self.stolen_state(owned);
                    return After::Exit;
                }
                AfterTask::HandBack => {
                    // STOP without STOLEN: the chain is still ours; as above.
                    self.shared.global().push(Runnable::Chain(owned.into_ptr()));
                    return After::Exit;
                }
            }
        }
    }
}

impl<K> WorkerLoop<'_, K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// `shutdown_now` stole `entry`'s chain while this worker was inside one of its tasks,
    /// which has now returned: the key's state goes to the key's handed-back tasks, through
    /// this slot (`state_hold.rs`, "A state lent to a running task").
    fn stolen_state(&self, was_ours: Owned<K>) {
        if self.shared.state_hooks().on {
            // The thief (`shutdown_now`) holds the baton now but never touches a stolen
            // chain's state, and the task that used it has returned: we are its last user, and
            // the token, the last of our hold, gives it up here. The entry stays allocated (a
            // stolen chain is never retired).
            let state = was_ours.take_state();
            crate::state_hold::worker_returns(&self.slot.lent, state);
        }
        let _stolen = was_ours.into_ptr();
    }
}

/// How polling a key's future ended for the chain's owner.
enum Polled<K> {
    /// Go on with the chain (the future completed, or was woken during its poll and is back at
    /// the chain's head): the baton, still ours.
    Again(Owned<K>),
    /// The future is pending and its chain parked: the chain is not ours any more.
    Parked,
    /// `shutdown_now` stopped the worker (the future is cancelled, or put back with the chain).
    Exit,
}

impl<K> WorkerLoop<'_, K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Polls the future of node `task`, just popped from `entry_ptr`'s chain, which this worker
    /// owns (`future_task.rs`: "Where a future lives" and "The wake state"). The node stays
    /// where it is: put back at the chain's head while the future is pending, freed once it is
    /// done.
    fn poll_future(&mut self, owned: Owned<K>, task: TaskRef) -> Polled<K> {
        let entry_ptr = owned.ptr();
        // SAFETY: we own the chain, so the entry is alive while the baton is ours; past a hand-
        // over below (the park) neither `ks` nor `owned` is used.
        let ks = unsafe { entry_ptr.as_ref() }.value();
        // We own the chain: its head future is ours to poll, not parked any more.
        ks.parked_future
            .store(std::ptr::null_mut(), Ordering::Relaxed);
        // SAFETY: nodes of kind `Future` are made only by `future_task::make::<_, K>`.
        let job = unsafe { future_task::head_of::<K>(&task) };
        let first = !job.started();
        if first && ks.control.is_paused() {
            // Paused before it started: back at the head, unstarted, and the chain parks
            // (`control.rs`). A started future is the key's running task and goes on.
            // SAFETY: `task` is the task we popped last.
            unsafe { owned.put_back(task) };
            return match crate::key_control::park(self.shared, owned) {
                Ok(()) => Polled::Parked,
                Err(o) => Polled::Again(o),
            };
        }
        self.slot
            .current
            .store(entry_ptr.as_ptr() as usize, Ordering::Relaxed);
        // SAFETY: we own the chain, so the entry is alive.
        let key_word = unsafe { entry_ptr.as_ref() }.hash() | 1;
        self.slot.direct_hash.store(key_word, Ordering::Relaxed);
        if !self.slot.phase.enter_running() {
            // `shutdown_now`: as for a task (`run_chain`), the future goes back (started or
            // not, as it was) and the chain to the others.
            // SAFETY: `task` is the task we popped last.
            unsafe { owned.put_back(task) };
            self.shared.global().push(Runnable::Chain(owned.into_ptr()));
            return Polled::Exit;
        }
        if first {
            // Started: it holds no capacity slot from now on, and counts as running until it
            // completes.
            self.release_capacity();
            self.bump(|c| &c.started);
            ks.seen.left(1);
            ks.seen.set_running(true);
            job.set_home(self.shared, entry_ptr);
        }
        job.state().begin_poll();
        let polled = {
            // A guard with feature `tokio`, `()` without it.
            #[allow(clippy::let_unit_value)]
            let _runtime = self.shared.config().enter_runtime();
            job.poll_here(&|panicked| {
                self.finish_task(panicked);
                if panicked && self.pauses_on_panic() {
                    ks.control.pause();
                }
            })
        };
        let after = self.slot.phase.leave_running();
        if polled.is_ready() {
            ks.seen.set_running(false);
            job.state().finish();
            future_task::finish_completed::<K>(task);
            return match after {
                AfterTask::Continue => Polled::Again(owned),
                AfterTask::Stolen => {
                    self.stolen_state(owned);
                    Polled::Exit
                }
                AfterTask::HandBack => {
                    self.shared.global().push(Runnable::Chain(owned.into_ptr()));
                    Polled::Exit
                }
            };
        }
        if after != AfterTask::Continue {
            // `shutdown_now` stopped us while the future was pending: a started future is
            // cancelled (it ended, for the counters).
            ks.seen.set_running(false);
            self.finish_task(false);
            task.abandon(Abandon::Cancelled);
            if after == AfterTask::HandBack {
                self.shared.global().push(Runnable::Chain(owned.into_ptr()));
            } else {
                self.stolen_state(owned);
            }
            return Polled::Exit;
        }
        // Pending: the node goes back to the chain's head, the wake state into the entry (for
        // `shutdown_now`), and the chain parks on the wake state.
        let state: *const WakeState = job.state();
        // SAFETY: `task` is the task we popped last.
        unsafe { owned.put_back(task) };
        ks.parked_future.store(state.cast_mut(), Ordering::Release);
        // SAFETY: the node, and with it a counted reference to the cell, is on the chain we
        // still own until the park succeeds: the state is alive.
        if unsafe { (*state).try_park() } {
            // The baton is the wakers' now (handed over to the wake state): we touch neither
            // the chain nor the cell again.
            let _parked = owned.into_ptr();
            Polled::Parked
        } else {
            // Woken during the poll: still ours, at the chain's head; poll it again.
            ks.parked_future
                .store(std::ptr::null_mut(), Ordering::Relaxed);
            Polled::Again(owned)
        }
    }
}
