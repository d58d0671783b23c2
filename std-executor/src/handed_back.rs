//! A state task handed back by `cancel_key`, run by its `PendingTask`.
//!
//! Run by its `PendingTask` ([`run_handed_back`]), it takes its key's chain baton the way
//! `cancel_key` does, on the calling thread: it holds the key (`Control::hold`: the key's plain
//! items then queue on the chain, and the chain's drainer parks it at its next pop) on the
//! key's live entry, **making one if the key has none** (`entry_for`, as `pause` and
//! `cancel_key` do), then [`hold_chain`] (steals a parked chain from its wait, claims an idle
//! one, or waits for the key's running task to return), and waits for a plain task of the key
//! that runs straight from its lane (`running_direct`, by hash). With the baton it runs the task
//! against the entry's state cell (`state.rs`: only the baton's holder touches it; `init` makes
//! it if the key has none), then un-holds and gives the baton back ([`give_back`]).
//!
//! Why exclusive, also against a key re-created concurrently: a key has at most one live entry
//! (the table's insert is the one place entries are made, and a retired entry is never used
//! again: the loop above looks again), the cell is the key's only state, and the baton has one
//! holder. A key released before the run therefore gets a new entry, whose state this task
//! makes; a submission racing it lands on the same entry and queues behind the baton. No
//! second state exists at any time, and the new one goes through the hook when the key is next
//! released (its idle timeout, `max_keys`, termination).
//!
//! Where it cannot wait: on one of the serializer's workers it gives up after about a
//! millisecond (as `cancel_key` does: there may be no other worker to come), and from inside a
//! task of its own key (the chain's owner on this thread) it could only wait for itself; both
//! fail the task `Panicked` with a message saying so. After `shutdown_now` or termination (or
//! without the serializer) it runs against a fresh state from `init`, released right after:
//! `shutdown_now` has moved or released the key's state, and no worker is left to give the
//! baton to. At a graceful shutdown the baton is given back without relying on a worker when
//! the chain is empty ([`give_back`] releases the key itself).
//!
//! Against `shutdown_now`, the run is an outside holder of the chain (`baton.rs`): it takes
//! and gives back the baton while `BUSY` (a `shutdown_now` waits for that, then finds the
//! chain parked or on a ready queue: after a stop, `give_back` puts it on the global queue,
//! which `shutdown_now` drains), and runs the task `RUNNING`, where `shutdown_now` steals the
//! chain as from a worker: the tasks queued behind the run are handed back, and the key's
//! state reaches their holder through the run's `lent` slot once the task returned.

use crate::owner::Owned;
use std::ptr::NonNull;

use crate::baton::OutsideHold;
use crate::key::{KeyEntry, Runnable};
use crate::key_control::{
    hold_chain, owns_chain_here, park_or_schedule, running_direct, Held, ON_WORKER_TRIES,
};
use crate::phase::AfterTask;
use crate::route::entry_for;
use crate::shared::Shared;
use crate::task::TaskRef;
use crate::user;

impl<K> crate::pending::KeyRunner<K> for Shared<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    fn run_on_key(&self, key: &K, task: TaskRef) {
        run_handed_back(self, key, task);
    }
}

/// `PendingTask::run` of a state task handed back by `cancel_key`: runs it on the calling
/// thread against `key`'s state in the key's entry, with the key's chain baton (see the module
/// docs, "A state task handed back by `cancel_key`").
pub(crate) fn run_handed_back<K>(sh: &Shared<K>, key: &K, task: TaskRef)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let hooks = sh.state_hooks();
    let stopped = || sh.lifecycle().is_stopped() || sh.lifecycle().is_terminated();
    if stopped() {
        return crate::pending::run_fresh(hooks, key, task);
    }
    // The key's `Hash`, `Eq` and `Clone` are user code: a panic fails the task, nothing held.
    let hash = match user::catch(|| sh.hash_of(key)) {
        Ok(h) => h,
        Err(payload) => return task.fail(payload),
    };
    let lane = sh.lanes().index_of(hash);
    let guard = sh.pin();
    let on_worker = crate::running::on_worker_of(sh.id());
    // An outside holder of the key's chain (`baton.rs`): `shutdown_now` stops it, and steals
    // the chain while the task runs, as from a worker.
    let Some(reg) = sh.outside_holds().register() else {
        return crate::pending::run_fresh(hooks, key, task);
    };
    let (entry, mut owned) = loop {
        let entry = user::catch(|| loop {
            let e = entry_for(sh, key, lane, hash, &guard);
            e.value().control.hold();
            if !e.value().chain.is_retired() {
                break e;
            }
            e.value().control.unhold(); // released under us: again, on its new entry
        });
        let entry = match entry {
            Ok(e) => e,
            Err(payload) => return task.fail(payload),
        };
        let ks = entry.value();
        // SAFETY: only whether it is there is used.
        let held_here =
            unsafe { crate::running::held_here(sh.id(), entry as *const KeyEntry<K> as usize) }
                .is_some();
        if owns_chain_here(sh, entry) || held_here {
            ks.control.unhold();
            return crate::state_hold::fail(
                task,
                "a state task handed back by cancel_key was run from inside a task of its own \
                 key: it would wait for itself",
            );
        }
        // SAFETY: `entry` is our table's, kept allocated by `guard`.
        match unsafe { hold_chain(sh, entry, &reg, on_worker) } {
            Held::Baton(owned) => break (entry, owned),
            Held::Busy => {
                ks.control.unhold();
                return crate::state_hold::fail(
                    task,
                    "a state task handed back by cancel_key was run on a worker while its key \
                     stayed busy: a worker does not wait for another",
                );
            }
            // Released (idle) between our hold and our take: again, on the key's new entry
            // (issue "Baton": a fresh state here ran beside the key's own tasks).
            Held::Retired if !stopped() => ks.control.unhold(),
            // Stopped (`shutdown_now` has the key's tasks and state).
            Held::Retired | Held::Stopped | Held::Mine(_) => {
                ks.control.unhold();
                return crate::pending::run_fresh(hooks, key, task);
            }
        }
    };
    let ks = entry.value();
    let ptr = NonNull::from(entry);
    // We hold the baton (`BUSY`) and the key (its new plain items queue on the chain): wait
    // for a plain task of the key that runs straight from its lane or a deferral, if one does.
    let backoff = crossbeam_utils::Backoff::new();
    let mut waited = 0u32;
    let give_up = |why: Option<&'static str>, task: TaskRef, owned: Owned<K>| {
        ks.control.unhold();
        give_back(sh, owned, &reg);
        reg.phase.leave_busy();
        match why {
            Some(why) => crate::state_hold::fail(task, why),
            None => crate::pending::run_fresh(hooks, key, task),
        }
    };
    loop {
        // Looked at with the key's lane taken (`inspect.rs`) and each of its deferrals of the
        // key visited under its lock: a router that sent a task of the key to run straight
        // away (it found the chain idle, before our claim) announces it (the lane's word, or
        // its slot's `direct_hash`) before it lets go of the lane or the deferral, so it is
        // seen here; one that routes after our claim finds the chain active and queues behind
        // us (issue "Baton": the chaos test saw a handed-back state task overlap a task of
        // its key that ran straight from its lane).
        let busy = crate::inspect::with_lane(sh, lane, |l| {
            l.deferrals.visit_hash(hash, |_, _| false, |_| {});
            running_direct(sh, lane, hash)
        });
        match busy {
            Some(false) => break,
            Some(true) => {}
            None => return give_up(None, task, owned), // `shutdown_now` has the lanes: stopped
        }
        waited += 1;
        if on_worker && waited > ON_WORKER_TRIES {
            return give_up(
                Some(
                    "a state task handed back by cancel_key was run on a worker while its key \
                     stayed busy: a worker does not wait for another",
                ),
                task,
                owned,
            );
        }
        if reg.phase.stop_requested() {
            return give_up(None, task, owned); // `shutdown_now` waits for us: the chain goes to it
        }
        crate::sync::snooze(&backoff);
    }
    reg.set_current(ptr);
    if !reg.phase.enter_running() {
        return give_up(None, task, owned); // stopped meanwhile
    }
    ks.seen.set_running(true);
    {
        let _here = crate::running::running_here(sh.id(), ptr.as_ptr() as usize, &reg.phase);
        // The key's state is the baton holder's to hand over (a `shutdown_now` that steals
        // the chain meanwhile leaves the state alone).
        let slot = owned.state_slot();
        let mut source = crate::state::EntrySource {
            slot,
            key: entry.key(),
            init: &*hooks.init,
        };
        crate::state::run_with(&mut source, || task.run(None, &|_| {}));
    }
    ks.seen.set_running(false);
    ks.control.unhold();
    match reg.phase.leave_running() {
        AfterTask::Stolen => {
            // `shutdown_now` took the chain while the task ran: the state goes to the key's
            // handed-back tasks through our `lent` slot, as a worker's does.
            if hooks.on {
                // The thief never touches a stolen chain's state, and the task that used it
                // has returned: we are its last user, through the token of our hold.
                let state = owned.take_state();
                crate::state_hold::worker_returns(&reg.lent, state);
            }
            let _stolen = owned.into_ptr();
        }
        AfterTask::Continue | AfterTask::HandBack => give_back(sh, owned, &reg),
    }
    reg.phase.leave_busy();
}

/// [`run_handed_back`] gives the key's chain back (its holder `reg` is `BUSY`): as `cancel_key`
/// does (a paused key's parked, else to a worker, which releases it), unless the serializer is
/// shutting down: its workers may be gone (or leave once nothing is outstanding), so an empty
/// chain is released here, its state through the hook; after `shutdown_now`, the chain goes to
/// the global queue, which `shutdown_now` drains once we leave `BUSY` (`baton.rs`).
///
/// The hook is user code: it runs with the holder `RUNNING`, as a task would, so that a
/// `shutdown_now` meanwhile steals the chain instead of waiting for the hook (issue "Baton",
/// a review: a `shutdown_now` waited 1.5 s for a slow hook).
///
fn give_back<K>(sh: &Shared<K>, mut owned: Owned<K>, reg: &OutsideHold<K>)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    if !sh.lifecycle().is_shutdown() {
        park_or_schedule(sh, owned);
        return;
    }
    let entry = owned.ptr();
    // SAFETY: we hold the baton, so the entry is alive; past a hand-over below it is read only
    // while `shutdown_now`'s steal keeps it (a stolen chain is never retired).
    let e = unsafe { entry.as_ref() };
    let ks = e.value();
    if sh.lifecycle().is_stopped() {
        // `shutdown_now` is waiting for us to leave `BUSY` (`baton.rs`), before it drains the
        // ready queues: it hands back what the chain holds, and releases the key.
        sh.global().push(Runnable::Chain(owned.into_ptr()));
        return;
    }
    if owned.has_queued() {
        // Outstanding tasks keep the workers (a graceful shutdown): they run them.
        park_or_schedule(sh, owned);
        return;
    }
    if let Some(st) = owned.take_state() {
        reg.set_current(entry);
        if !reg.phase.enter_running() {
            // `shutdown_now` is waiting for us: the state goes back in the cell, and the chain
            // to it (its drain releases the state).
            *owned.state_slot() = Some(st);
            sh.global().push(Runnable::Chain(owned.into_ptr()));
            return;
        }
        {
            // The hook's own calls on the key (`cancel_key`, a run of another handed-back state
            // task of it) find the chain held here, as a task's do.
            let _here = crate::running::running_here(sh.id(), entry.as_ptr() as usize, &reg.phase);
            hooks_release(sh, e, st);
        }
        match reg.phase.leave_running() {
            AfterTask::Continue => {}
            AfterTask::Stolen => {
                // The chain is `shutdown_now`'s; the state already went through the hook.
                let _stolen = owned.into_ptr();
                crate::state_hold::worker_returns(&reg.lent, None);
                return;
            }
            AfterTask::HandBack => {
                sh.global().push(Runnable::Chain(owned.into_ptr()));
                return;
            }
        }
    }
    if ks.control.is_paused_by_user() {
        park_or_schedule(sh, owned);
        return;
    }
    // The (empty) chain of an entry of our table (its state is gone: nothing of it runs in
    // here).
    // SAFETY: an entry of our table (`entry_for`).
    if let Err(owned) = unsafe { crate::idle::release_drained(sh, owned) } {
        sh.schedule(Runnable::Chain(owned.into_ptr()), None); // a push came in meanwhile
    }
}

fn hooks_release<K: Clone>(sh: &Shared<K>, e: &KeyEntry<K>, st: crate::state::Erased) {
    sh.state_hooks().release(e.key(), st);
}
