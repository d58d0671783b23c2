//! Pause and resume in the executor: the steps of `control.rs`'s protocol on a key's entry, its
//! chain and the registry of parked chains, for the serializer's methods, the workers
//! (`PanicPolicy::PauseKey`, a drained chain) and the idle reaper.
//!
//! A paused key is tracked (it has an entry, `route.rs` sends its items onto its chain), and its
//! chain, once whoever holds it parks it, is a registered wait ([`ParkedFor::Pause`]): the
//! resume's grant schedules it, `shutdown_now` steals it like any parked chain (and hands its
//! tasks back), and a graceful shutdown cancels what it holds ([`cancel_paused`]).
//!
//! A state task that `cancel_key` handed back runs through `handed_back.rs`, which takes the
//! key's chain the way `cancel_key` does ([`hold_chain`]).

use std::ptr::NonNull;

use crate::control::Resumed;
use crate::key::{KeyEntry, Runnable};
use crate::owner::Owned;
use crate::permit_wait::{Parked, ParkedFor};
use crate::phase::AfterTask;
use crate::route::entry_for;
use crate::shared::Shared;
use crate::sync::Mutex;
use crate::sync::Ordering;
use crate::task::TaskRef;

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
        // The claim and the park as an outside holder (`baton.rs`), so that a `shutdown_now`
        // never runs between them (it would not find the parked chain, nor its state). Once
        // `shutdown_now` has begun, the key is only marked paused: the idle chain is left to
        // the reapers (`release_paused_states_after_stop`).
        let Some(reg) = sh.outside_holds().register() else {
            return;
        };
        if !reg.phase.enter_busy() {
            return;
        }
        if let Some(owned) = Owned::claim(entry) {
            park_or_schedule(sh, owned);
            reg.phase.leave_busy();
            return;
        }
        reg.phase.leave_busy();
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

/// By the holder of a key's chain: parks the chain if the key is paused (`Ok`: the baton now
/// belongs to the pause's wait); else the baton is still the caller's (`Err`).
pub(crate) fn park<K>(sh: &Shared<K>, owned: Owned<K>) -> Result<(), Owned<K>>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let entry = owned.ptr();
    let parked = owned.entry().value().control.park(|| {
        sh.permit_waits()
            .register(Parked {
                entry,
                token: Mutex::new(None),
                why: ParkedFor::Pause,
            })
            .id()
    });
    if parked {
        let _handed_to_the_wait = owned.into_ptr();
        Ok(())
    } else {
        Err(owned)
    }
}

/// [`park`], and if the key is not paused after all, hands the chain to a worker (which drains
/// it and releases it as usual).
pub(crate) fn park_or_schedule<K>(sh: &Shared<K>, owned: Owned<K>)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    if let Err(owned) = park(sh, owned) {
        sh.schedule(Runnable::Chain(owned.into_ptr()), None);
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
    if let Some(owned) = Owned::claim(unsafe { entry.as_ref() }) {
        park_or_schedule(sh, owned);
    }
}

/// At a graceful shutdown, once nothing else is left to run, by a worker that is `BUSY` (a
/// `shutdown_now` waits for it; once one has begun, the chains go to it instead): the tasks
/// held by paused keys' parked chains do not run; each resolves `Cancelled` (and is counted as dropped), and the
/// chain stays parked (the key stays paused, so anything still routed onto it is cancelled by a
/// later call). Returns the cancelled tasks, counted as dropped, for the caller to abandon
/// (`Cancelled`) once it is no longer `BUSY`: their drops and their handles' wakers are user
/// code, which may call `shutdown_now` (issue "Baton", a review: that waited for its own worker).
#[must_use = "the cancelled tasks are abandoned by the caller, once it is not BUSY"]
pub(crate) fn cancel_paused<K>(sh: &Shared<K>) -> Vec<TaskRef>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let mut stolen = Vec::new();
    sh.permit_waits()
        .steal_where(|p| p.why == ParkedFor::Pause, |p| stolen.push(p.entry));
    let mut cancelled = Vec::new();
    for e in stolen {
        // SAFETY: the steal took the baton from the pause's wait.
        let owned = unsafe { Owned::assume(e) };
        let ks = owned.entry().value();
        ks.control.forget_wait();
        if sh.lifecycle().is_stopped() {
            // `shutdown_now` has begun: its tasks are its to hand back. The caller is `BUSY`,
            // so `shutdown_now` drains the global queue only after this returns.
            sh.global().push(Runnable::Chain(owned.into_ptr()));
            continue;
        }
        if !ks.control.is_paused_by_user() {
            // Parked for a `cancel_key`'s hold (or resumed meanwhile), not for a pause: its
            // tasks run as any key's at a graceful shutdown (issue "Baton": they were
            // cancelled). Parked again while held, else scheduled.
            park_or_schedule(sh, owned);
            continue;
        }
        let before = cancelled.len();
        owned.drain_into(&mut cancelled);
        let n = cancelled.len() - before;
        // A paused chain parks only before a task starts: nothing drained here had started.
        ks.seen.left(n);
        sh.count_dropped_outside(n as u64);
        for _ in 0..n {
            sh.release_slot();
        }
        park_or_schedule(sh, owned);
    }
    cancelled
}

/// How an outside holder (`baton.rs`) came to hold a key's chain ([`hold_chain`]).
pub(crate) enum Held<K> {
    /// The chain is retired (`shutdown_now` released the key): nothing to take.
    Retired,
    /// The caller holds the chain's baton, taken from a pause's or a permit's parked wait, or
    /// claimed idle (never from a pending future, which is the key's running task). Its
    /// registration is `BUSY`: it gives the chain back before it leaves `BUSY`.
    Baton(Owned<K>),
    /// The calling thread is the chain's owner, inside one of the key's tasks, and has
    /// suspended its `RUNNING` phase (`Phase::suspend_running`): it may take what is queued
    /// (the owner's loop pops again after the task returns) and resumes `RUNNING` when done.
    /// The token is the suspended owner's, lent for that while and given back
    /// ([`Owned::into_ptr`]) before it resumes.
    Mine(Owned<K>),
    /// Called from one of the serializer's workers, which must not wait for another worker:
    /// the chain stayed busy, nothing was taken.
    Busy,
    /// `shutdown_now` stopped the holder (or had stolen the key's chain from its own task):
    /// nothing taken; `shutdown_now` hands back what is queued.
    Stopped,
}

/// How many times `hold_chain` looks again, on a worker, before it gives up (each look a
/// backoff step: about a millisecond in all).
pub(crate) const ON_WORKER_TRIES: u32 = 200;

/// An outside holder (`baton.rs`, registered as `hold`): waits until it can take `entry`'s
/// chain baton. The key must be held (`Control::hold`), so that a worker draining the chain
/// parks it at its next pop; waiting here is waiting for the key's running task (a pending
/// future included), if it runs from the chain. A chain parked for a pause or for permits is
/// taken from its wait (a permit request is withdrawn); an idle one is claimed. Each attempt
/// is made `BUSY`, and the holder stays `BUSY` when it returns [`Held::Baton`]. On a worker
/// (`on_worker`) it gives up after a short while ([`Held::Busy`]); once `shutdown_now` stopped
/// the holder, at once ([`Held::Stopped`]).
///
/// # Safety
/// `entry` is an entry of `sh`'s table, kept allocated by the caller's epoch guard.
pub(crate) unsafe fn hold_chain<K>(
    sh: &Shared<K>,
    entry: &KeyEntry<K>,
    hold: &crate::baton::OutsideHold<K>,
    on_worker: bool,
) -> Held<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let ks = entry.value();
    let ptr = NonNull::from(entry);
    let backoff = crossbeam_utils::Backoff::new();
    let mut waited = 0u32;
    loop {
        if !hold.phase.enter_busy() {
            return Held::Stopped;
        }
        if ks.chain.is_retired() {
            hold.phase.leave_busy();
            return Held::Retired;
        }
        if let Some(id) = ks.control.wait_id() {
            if let Some(w) = sh.permit_waits().get(id) {
                if sh.permit_waits().steal_one(&w) {
                    ks.control.forget_wait();
                    // SAFETY: the steal took the baton from the pause's wait.
                    return Held::Baton(unsafe { Owned::assume(ptr) });
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
                // SAFETY: the steal took the baton from the permit's wait.
                return Held::Baton(unsafe { Owned::assume(ptr) });
            }
        } else if let Some(owned) = Owned::claim(entry) {
            return Held::Baton(owned);
        }
        if hold.phase.leave_busy() {
            return Held::Stopped;
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
///
/// The caller (an exiting worker) is an outside holder here (`baton.rs`), one chain at a time:
/// `BUSY` while it takes a chain and gives it back, `RUNNING` while the hook runs (user code, as
/// a task is), so a `shutdown_now` meanwhile waits for a take or steals the chain, and hands
/// back its queued tasks, whose state then comes from `init` only after the hook returned
/// (through the holder's `lent` slot). Once `shutdown_now` has closed the registry, it does
/// nothing: `shutdown_now` releases those states itself. (Issue "Baton", two reviews: a take
/// hid a paused key's tasks from `shutdown_now`; a hook run after the give-back let a handed-back
/// task make a new state while the old one's hook still ran.)
pub(crate) fn release_paused_states<K>(sh: &Shared<K>)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    if !sh.state_hooks().on {
        return;
    }
    let Some(reg) = sh.outside_holds().register() else {
        return release_paused_states_after_stop(sh);
    };
    let mut done = std::collections::HashSet::new();
    loop {
        if !reg.phase.enter_busy() {
            return; // stopped: `shutdown_now` has the rest
        }
        let Some(w) = sh
            .permit_waits()
            .find(|p| p.why == ParkedFor::Pause && !done.contains(&p.entry))
        else {
            reg.phase.leave_busy();
            return;
        };
        let e = w.value().entry;
        done.insert(e);
        if !sh.permit_waits().steal_one(&w) {
            reg.phase.leave_busy(); // resumed meanwhile: not ours
            continue;
        }
        // SAFETY: the steal took the baton from the pause's wait.
        let mut owned = unsafe { Owned::assume(e) };
        // SAFETY: the baton keeps the entry alive; past a hand-over below, the hook's key is
        // read only while `shutdown_now`'s steal keeps the entry (a stolen chain is never
        // retired).
        let entry = unsafe { e.as_ref() };
        entry.value().control.forget_wait();
        if let Some(st) = owned.take_state() {
            reg.set_current(e);
            if !reg.phase.enter_running() {
                // Stopped while we held it: the state goes back, the chain to `shutdown_now`.
                *owned.state_slot() = Some(st);
                sh.global().push(Runnable::Chain(owned.into_ptr()));
                reg.phase.leave_busy();
                return;
            }
            {
                let _here = crate::running::running_here(sh.id(), e.as_ptr() as usize, &reg.phase);
                sh.state_hooks().release(entry.key(), st);
            }
            match reg.phase.leave_running() {
                AfterTask::Continue => {}
                AfterTask::Stolen => {
                    // `shutdown_now` has the chain; its handed-back tasks get a state made
                    // after the hook returned.
                    let _stolen = owned.into_ptr();
                    crate::state_hold::worker_returns(&reg.lent, None);
                    reg.phase.leave_busy();
                    return;
                }
                AfterTask::HandBack => {
                    sh.global().push(Runnable::Chain(owned.into_ptr()));
                    reg.phase.leave_busy();
                    return;
                }
            }
        }
        park_or_schedule(sh, owned);
        reg.phase.leave_busy();
    }
}

/// [`release_paused_states`] once `shutdown_now` has closed the outside holds: waits until no
/// `shutdown_now` is taking what it hands back, then releases the states of the chains parked after it
/// took the waits (a paused idle key an exiting worker's reaper parked: empty, but with its
/// state). Anything queued on them came after the stop and is cancelled. (Issue "Baton": the
/// chaos test found such a state never released.)
fn release_paused_states_after_stop<K>(sh: &Shared<K>)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    sh.lifecycle().wait_collected();
    // Keeps the entries allocated until their hooks ran (a `resume` may schedule a chain we
    // parked again, and a later `shutdown_now` release its key).
    let guard = sh.pin();
    let mut stolen = Vec::new();
    sh.permit_waits()
        .steal_where(|p| p.why == ParkedFor::Pause, |p| stolen.push(p.entry));
    for e in stolen {
        // SAFETY: the steal took the baton from the pause's wait.
        let owned = unsafe { Owned::assume(e) };
        // SAFETY: the entry stays allocated under `guard`, pinned before the steal, whatever
        // happens to it once given back.
        let entry = unsafe { e.as_ref() };
        entry.value().control.forget_wait();
        let mut tasks = Vec::new();
        owned.drain_into(&mut tasks);
        entry.value().seen.left(tasks.len());
        sh.count_dropped_outside(tasks.len() as u64);
        let state = owned.take_state();
        park_or_schedule(sh, owned);
        for t in tasks {
            sh.release_slot();
            t.abandon(crate::task::Abandon::Cancelled);
        }
        if let Some(st) = state {
            sh.state_hooks().release(entry.key(), st);
        }
    }
    drop(guard);
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
    let Some(slot) = crate::running::current_slot(sh.id()) else {
        return false;
    };
    let slot = &sh.slots()[slot];
    slot.phase.is_running()
        && slot.current.load(Ordering::Relaxed) == entry as *const KeyEntry<K> as usize
}
