//! Pause and resume in the executor: the steps of `control.rs`'s protocol on a key's entry, its
//! chain and the registry of parked chains, for the serializer's methods, the workers
//! (`PanicPolicy::PauseKey`, a drained chain) and the idle reaper.
//!
//! A paused key is tracked (it has an entry, `route.rs` sends its items onto its chain), and its
//! chain, once whoever holds it parks it, is a registered wait ([`ParkedFor::Pause`]): the
//! resume's grant schedules it, `shutdown_now` steals it like any parked chain (and hands its
//! tasks back), and a graceful shutdown cancels what it holds ([`cancel_paused`]).
//!
//! # A state task handed back by `cancel_key`
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
//! the chain is empty ([`give_back`] releases the key itself). A window remains: a
//! `shutdown_now` that runs entirely between `give_back`'s check and its push of the chain onto
//! the global queue leaves the chain there (its state then goes with the table, without the
//! hook); `cancel_key`'s own give-back has the same window.

use std::ptr::NonNull;

use crate::control::Resumed;
use crate::key::{KeyEntry, Runnable};
use crate::permit_wait::{Parked, ParkedFor};
use crate::route::entry_for;
use crate::shared::Shared;
use crate::sync::Mutex;
use crate::sync::Ordering;
use crate::task::{Abandon, TaskRef};
use crate::user;

/// Pauses `key` (see `control.rs`): makes its entry if it has none, marks it paused, and parks
/// its chain at once if the chain is idle (else its holder parks it). Runs the key's `Hash` and
/// `Eq` (and `Clone` for a new entry) on the calling thread.
pub(crate) fn pause<K>(sh: &Shared<K>, key: &K)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let hash = sh.hash_of(key);
    let lane = sh.lanes().index_of(hash);
    let guard = sh.pin();
    loop {
        let entry = entry_for(sh, key, lane, hash, &guard);
        let ks = entry.value();
        ks.control.pause();
        if ks.chain.try_claim() {
            // SAFETY: the claim made us the chain's owner.
            unsafe { park_or_schedule(sh, NonNull::from(entry)) };
            return;
        }
        if !ks.chain.is_retired() {
            // Owned: its holder parks it when it next pops, or releases it idle (then the
            // key's reaper parks it instead of retiring it).
            return;
        }
        // Retired under us (an idle release that came first): again, on the key's new entry.
    }
}

/// Resumes `key`; nothing if it is not paused (or not live).
pub(crate) fn resume<K>(sh: &Shared<K>, key: &K)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let guard = sh.pin();
    let Some(entry) = sh.table().get(key, &guard) else {
        return;
    };
    if let Resumed::Parked(id) = entry.value().control.resume() {
        // Unless `shutdown_now` stole it first, the wait's grant hands us the baton.
        if let Some(wait) = sh.permit_waits().get(id) {
            sh.permit_waits().grant(&wait, |parked| {
                sh.schedule(Runnable::Chain(parked.entry), None);
            });
        }
    }
}

/// By the holder of `entry`'s chain: parks the chain if the key is paused; `true` if it did
/// (the baton now belongs to the pause's wait, and the caller must not touch the chain again).
///
/// # Safety
/// The caller owns `entry`'s chain (holds its baton).
pub(crate) unsafe fn park<K>(sh: &Shared<K>, entry: NonNull<KeyEntry<K>>) -> bool
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: the caller owns the chain, so the entry is alive.
    let ks = unsafe { entry.as_ref() }.value();
    ks.control.park(|| {
        sh.permit_waits()
            .register(Parked {
                entry,
                token: Mutex::new(None),
                why: ParkedFor::Pause,
            })
            .id()
    })
}

/// [`park`], and if the key is not paused after all, hands the chain to a worker (which drains
/// it and releases it as usual).
///
/// # Safety
/// As for [`park`].
pub(crate) unsafe fn park_or_schedule<K>(sh: &Shared<K>, entry: NonNull<KeyEntry<K>>)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: the caller's contract.
    if !unsafe { park(sh, entry) } {
        sh.schedule(Runnable::Chain(entry), None);
    }
}

/// The reaper of a paused key's idle chain (it holds the key's idle item, or released the chain
/// itself with `key_idle_timeout` 0) found it paused: instead of retiring it, claims and parks
/// it. If the claim fails, a push made it active again and its new owner parks it.
///
/// # Safety
/// `entry` is alive: the caller holds the key's idle item or an epoch guard pinned before the
/// chain's release.
pub(crate) unsafe fn park_idle<K>(sh: &Shared<K>, entry: NonNull<KeyEntry<K>>)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: the caller's contract.
    if unsafe { entry.as_ref() }.value().chain.try_claim() {
        // SAFETY: the claim made us the owner.
        unsafe { park_or_schedule(sh, entry) };
    }
}

/// At a graceful shutdown, once nothing else is left to run: the tasks held by paused keys'
/// parked chains do not run; each resolves `Cancelled` (and is counted as dropped), and the
/// chain stays parked (the key stays paused, so anything still routed onto it is cancelled by a
/// later call). Returns how many tasks it cancelled.
pub(crate) fn cancel_paused<K>(sh: &Shared<K>) -> usize
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let mut stolen = Vec::new();
    sh.permit_waits()
        .steal_where(|p| p.why == ParkedFor::Pause, |p| stolen.push(p.entry));
    let mut cancelled = 0;
    for e in stolen {
        // SAFETY: the steal gave us the chain's baton, so the entry is alive.
        let ks = unsafe { e.as_ref() }.value();
        ks.control.forget_wait();
        let mut tasks: Vec<TaskRef> = Vec::new();
        // SAFETY: we own the chain.
        unsafe { crate::key::drain_chain(e.as_ref(), &mut tasks) };
        cancelled += tasks.len();
        // A paused chain parks only before a task starts: nothing drained here had started.
        ks.seen.left(tasks.len());
        sh.count_dropped_outside(tasks.len() as u64);
        for t in tasks {
            sh.release_slot();
            t.abandon(Abandon::Cancelled);
        }
        // SAFETY: we still own the chain.
        unsafe { park_or_schedule(sh, e) };
    }
    cancelled
}

/// How `cancel_key` came to hold a key's chain ([`hold_chain`]).
pub(crate) enum Held {
    /// The chain is retired (`shutdown_now` released the key): nothing to take.
    Retired,
    /// The caller holds the chain's baton, taken from a pause's or a permit's parked wait, or
    /// claimed idle (never from a pending future, which is the key's running task).
    Baton,
    /// The calling thread is the chain's owner, inside one of the key's tasks: it may take
    /// what is queued (the owner's loop pops again after the task returns).
    Mine,
    /// Called from one of the serializer's workers, which must not wait for another worker:
    /// the chain stayed busy, nothing was taken.
    Busy,
}

/// How many times `hold_chain` looks again, on a worker, before it gives up (each look a
/// backoff step: about a millisecond in all).
const ON_WORKER_TRIES: u32 = 200;

/// `cancel_key`: waits until it can take `entry`'s queued tasks. The key must be held
/// (`Control::hold`), so that a worker draining the chain parks it at its next pop; waiting
/// here is waiting for the key's running task (a pending future included), if it runs from the
/// chain. A chain parked for a pause or for permits is taken from its wait (a permit request is
/// withdrawn); an idle one is claimed. On a worker (`on_worker`) it gives up after a short
/// while ([`Held::Busy`]).
///
/// # Safety
/// `entry` is an entry of `sh`'s table, kept allocated by the caller's epoch guard.
pub(crate) unsafe fn hold_chain<K>(
    sh: &Shared<K>,
    entry: &KeyEntry<K>,
    on_owner: bool,
    on_worker: bool,
) -> Held
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let ks = entry.value();
    let ptr = NonNull::from(entry);
    let backoff = crossbeam_utils::Backoff::new();
    let mut waited = 0u32;
    loop {
        if ks.chain.is_retired() {
            return Held::Retired;
        }
        if on_owner {
            return Held::Mine;
        }
        if let Some(id) = ks.control.wait_id() {
            if let Some(w) = sh.permit_waits().get(id) {
                if sh.permit_waits().steal_one(&w) {
                    ks.control.forget_wait();
                    return Held::Baton;
                }
            }
        } else if let Some(w) = sh
            .permit_waits()
            .find(|p| p.entry == ptr && p.why == ParkedFor::Permits)
        {
            // Only a permit wait: a pause's is taken through its id above (the control lock
            // orders that), and a pending future is the key's running task, waited for like a
            // running closure (its waker owns the wait's other side).
            if sh.permit_waits().steal_one(&w) {
                if let Some(token) = crate::sync::lock(&w.value().token).take() {
                    token.cancel(); // a late grant finds the wait stolen and gives back
                }
                return Held::Baton;
            }
        } else if ks.chain.try_claim() {
            return Held::Baton;
        }
        if on_worker {
            // A worker must not wait for another worker (there may be none to come): it gives
            // up after a short while.
            waited += 1;
            if waited > ON_WORKER_TRIES {
                return Held::Busy;
            }
        }
        crate::sync::snooze(&backoff);
    }
}

/// At termination, with key state: the states of paused keys (whose chains stay parked) go
/// through the release hook too (`state.rs`); each chain is taken from its wait and parked again.
pub(crate) fn release_paused_states<K>(sh: &Shared<K>)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    if !sh.state_hooks().on {
        return;
    }
    let mut stolen = Vec::new();
    sh.permit_waits()
        .steal_where(|p| p.why == ParkedFor::Pause, |p| stolen.push(p.entry));
    for e in stolen {
        // SAFETY: the steal gave us the chain's baton, so the entry is alive and the state ours.
        let entry = unsafe { e.as_ref() };
        entry.value().control.forget_wait();
        // SAFETY: as above.
        if let Some(st) = unsafe { entry.value().state.take() } {
            sh.state_hooks().release(entry.key(), st);
        }
        // SAFETY: we still own the chain.
        unsafe { park_or_schedule(sh, e) };
    }
}

/// Whether a worker runs a task of key hash `hash` straight from lane `l` (a lane's word says
/// so while its owner is inside a task) or from a deferral (its slot says so).
pub(crate) fn running_direct<K>(sh: &Shared<K>, l: usize, hash: u64) -> bool
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    sh.lanes()
        .get(l)
        .word
        .watch()
        .is_some_and(|w| w.key_hash() == hash as usize)
        || sh.slots().iter().any(|s| {
            s.phase.is_running()
                && s.current.load(Ordering::Relaxed) == 0
                && s.direct_hash.load(Ordering::Relaxed) == hash | 1
        })
}

/// Whether the calling thread is one of `sh`'s workers, inside a task of `entry`'s chain.
pub(crate) fn owns_chain_here<K>(sh: &Shared<K>, entry: &KeyEntry<K>) -> bool {
    let Some(slot) = crate::worker::current_slot(sh.id()) else {
        return false;
    };
    let slot = &sh.slots()[slot];
    slot.phase.is_running()
        && slot.current.load(Ordering::Relaxed) == entry as *const KeyEntry<K> as usize
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
    let ptr = NonNull::from(entry);
    if owns_chain_here(sh, entry) {
        ks.control.unhold();
        return crate::state_hold::fail(
            task,
            "a state task handed back by cancel_key was run from inside a task of its own \
             key: it would wait for itself",
        );
    }
    let on_worker = crate::worker::on_worker_of(sh.id());
    let held = loop {
        // SAFETY: `entry` is our table's, kept allocated by `guard`.
        match unsafe { hold_chain(sh, entry, false, true) } {
            Held::Busy if !on_worker && !stopped() => continue,
            h => break h,
        }
    };
    match held {
        Held::Baton => {}
        Held::Busy if on_worker => {
            ks.control.unhold();
            return crate::state_hold::fail(
                task,
                "a state task handed back by cancel_key was run on a worker while its key \
                 stayed busy: a worker does not wait for another",
            );
        }
        // Released by `shutdown_now` (retired), or stopped while we waited.
        Held::Retired | Held::Busy | Held::Mine => {
            ks.control.unhold();
            return crate::pending::run_fresh(hooks, key, task);
        }
    }
    // We hold the baton and the key (its new plain items queue on the chain): wait for a plain
    // task of the key that runs straight from its lane or a deferral, if one does.
    let backoff = crossbeam_utils::Backoff::new();
    let mut waited = 0u32;
    while running_direct(sh, lane, hash) {
        waited += 1;
        if on_worker && waited > ON_WORKER_TRIES {
            ks.control.unhold();
            // SAFETY: we hold the baton.
            unsafe { give_back(sh, ptr) };
            return crate::state_hold::fail(
                task,
                "a state task handed back by cancel_key was run on a worker while its key \
                 stayed busy: a worker does not wait for another",
            );
        }
        crate::sync::snooze(&backoff);
    }
    ks.seen.set_running(true);
    {
        // SAFETY: we hold the chain's baton: the key's state is ours to hand over.
        let slot = unsafe { ks.state.slot() };
        let mut source = crate::state::EntrySource {
            slot,
            key: entry.key(),
            init: &*hooks.init,
        };
        crate::state::run_with(&mut source, || task.run(None, &|_| {}));
    }
    ks.seen.set_running(false);
    ks.control.unhold();
    // SAFETY: we hold the baton.
    unsafe { give_back(sh, ptr) };
}

/// [`run_handed_back`] gives the key's chain back: as `cancel_key` does (a paused key's parked,
/// else to a worker, which releases it), unless
/// the serializer is shutting down: its workers may be gone (or leave once nothing is
/// outstanding), so an empty chain is released here, its state through the hook; after
/// `shutdown_now`, tasks routed onto it while we held it are cancelled (`shutdown_now` could not
/// take them).
///
/// # Safety
/// The caller holds `entry`'s chain baton.
unsafe fn give_back<K>(sh: &Shared<K>, entry: NonNull<KeyEntry<K>>)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    if !sh.lifecycle().is_shutdown() {
        // SAFETY: the caller's contract.
        unsafe { park_or_schedule(sh, entry) };
        return;
    }
    // SAFETY: we hold the baton, so the entry is alive.
    let e = unsafe { entry.as_ref() };
    let ks = e.value();
    if sh.lifecycle().is_stopped() {
        let mut tasks: Vec<TaskRef> = Vec::new();
        // SAFETY: we hold the baton.
        unsafe { crate::key::drain_chain(e, &mut tasks) };
        ks.seen.left(tasks.len());
        sh.count_dropped_outside(tasks.len() as u64);
        for t in tasks {
            sh.release_slot();
            t.abandon(Abandon::Cancelled);
        }
    }
    // SAFETY: we hold the baton.
    let queued = unsafe { ks.chain.peek() }.is_some();
    if queued {
        // Outstanding tasks keep the workers (a graceful shutdown): they run them.
        // SAFETY: we hold the baton.
        unsafe { park_or_schedule(sh, entry) };
        return;
    }
    if ks.control.is_paused_by_user() {
        // SAFETY: we hold the baton.
        if let Some(st) = unsafe { ks.state.take() } {
            hooks_release(sh, e, st);
        }
        // SAFETY: we hold the baton.
        unsafe { park_or_schedule(sh, entry) };
        return;
    }
    // SAFETY: we hold the baton of the (empty) chain of an entry of our table.
    if !unsafe { crate::idle::release_drained(sh, entry) } {
        sh.schedule(Runnable::Chain(entry), None); // a push came in meanwhile
    }
}

fn hooks_release<K: Clone>(sh: &Shared<K>, e: &KeyEntry<K>, st: crate::state::Erased) {
    sh.state_hooks().release(e.key(), st);
}
