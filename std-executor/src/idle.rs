//! Idle release of keys: a key's chain is retired `key_idle_timeout` after it drains, even if
//! nothing else is ever submitted, so memory does not grow with the keys ever seen. This module
//! is the worker side ([`IdleKeys`]: a worker's FIFO of idle keys and its garbage list); the
//! key's own word is `idle_word.rs`.
//!
//! # Protocol
//!
//! `key_idle_timeout == 0`: the worker that released the chain retires it at once
//! (`CAS(0 -> RETIRED)`, fails if a push re-activated it) and unlinks it from the table.
//!
//! Otherwise each key has an idle word `(release tick << 1) | QUEUED`, and each worker an idle FIFO
//! of `(entry, deadline)` items. Since the timeout is one constant, release order is deadline order.
//!
//! - **release** (worker, after `CAS(ACTIVE -> 0)` succeeded, under an epoch guard pinned before
//!   it): `prev = idle.swap(now << 1 | QUEUED)`. If `prev` lacked `QUEUED`, this worker pushes an
//!   item onto its own FIFO. So a key has an item in some FIFO exactly while `QUEUED` is set.
//! - **reap** (the FIFO's owner, when the head's deadline passed): if the key was released again
//!   since (its tick is newer), push the item back with the newer deadline. Else try
//!   `CAS(0 -> RETIRED)`: success means idle and empty; unlink it and the epoch frees it. Failure
//!   means the chain is active: `fetch_and(!QUEUED)` drops the item, then, if the chain is idle
//!   again by now, `fetch_or(QUEUED)` and re-queue the item if that set the bit.
//!
//! **Only the holder of a key's item retires the key**, and `QUEUED` (set by an RMW that returns the
//! old value) means exactly one item exists, so an entry in a FIFO is never freed behind its
//! item's back. **No idle key is forgotten**: a releaser's `swap` and the reaper's `fetch_and` are
//! RMWs on one word; if the swap comes second it sees `QUEUED` clear and queues an item; if it
//! comes first, the reaper's `fetch_and` happens-after the release CAS, so the reaper's following
//! `is_idle` check sees the chain idle (or active again, when a later release will queue it).
//! A key is retired between one and two timeouts after its last release, or earlier when its
//! worker holds more than `IDLE_CAP` idle keys (the oldest go first): without key state, the
//! timeout is a cache of hot keys' entries, bounded in size. With key state (`state.rs`) it is a
//! promise: a key's state lives until its timeout (or a key budget) releases it, so the cap
//! does not apply.

use crate::owner::Owned;
use std::collections::VecDeque;
use std::ptr::NonNull;

use crossbeam_epoch::{Guard, LocalHandle};
use keyserial_core::table::Unlinked;

use crate::idle_word::Reap;
use crate::key::{IdleItem, KeyEntry, KeyState, Runnable};
use crate::shared::Shared;

/// The most idle keys one worker keeps waiting for their timeout; beyond this the oldest is
/// released at once. A hot working set of up to this many keys per worker skips re-creating key
/// state between tasks, while a flood of one-shot keys costs little: the evicted keys are recent,
/// so their unlink finds the table's path still warm. Measured against 65,536 (BENCHMARKS.md):
/// W3 (1 M one-shot keys) 1.2-2x faster with a lower peak RSS; W6 at 100 k keys, whose working
/// set then fits, 1.6x slower. Releasing an idle key early is invisible to users (its next task
/// re-creates it).
pub(crate) const IDLE_CAP: usize = 1 << 10;

/// Entries a worker unlinked and has yet to hand to the epoch, freed in batches of this many
/// (one deferred call per batch instead of one per key).
pub(crate) const GARBAGE_BATCH: usize = 64;

/// A worker's unlinked entries, waiting for a batched deferred free.
pub(crate) type Garbage<K> = Vec<Unlinked<K, KeyState>>;

/// Retires a key with `retire` (the chain's or the idle word's retire) and, if that succeeded,
/// unlinks it and queues its entry for a batched free. Retiring inside the table's call is what
/// lets it unlink from the entry's home slot instead of searching (see `table.rs`).
///
/// # Safety
/// `entry` is an entry of `shared.table()`, and `retire` returns `true` only if it moved the
/// key's chain from idle to retired in this call (`Table::retire_take`'s contract).
unsafe fn retire_unlink<K>(
    shared: &Shared<K>,
    entry: &KeyEntry<K>,
    guard: &Guard,
    garbage: &mut Garbage<K>,
    retire: impl FnOnce(&KeyState) -> bool,
) where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: the caller's contract is `retire_take`'s.
    if let Some(taken) = unsafe { shared.table().retire_take(entry, guard, retire) } {
        // Retired: the key's share of a key budget goes back now (`key_budget.rs`), not when
        // the epoch frees the entry.
        entry.value().share.release();
        crate::trace::released(shared.labeler(), entry.key(), entry.hash());
        garbage.push(taken);
        if garbage.len() >= GARBAGE_BATCH {
            let batch = std::mem::replace(garbage, Vec::with_capacity(GARBAGE_BATCH));
            shared.table().defer_free(batch, guard);
        }
    }
}

/// With key state (`state.rs`), the release of an idle key: claims its idle chain (so that no
/// state task runs meanwhile), takes its state and calls the release hook while it holds the
/// chain, then retires the chain from owned (core `Chain::try_retire_owned`), so that no task
/// can come between the hook and the retire; a task that came during the hook keeps the key
/// alive (the chain goes to a worker, and the task makes a fresh state after the hook
/// returned). `None`: the chain was active, nothing done (the caller's ordinary reap handles
/// it); `Some(retired)` otherwise (if not retired, the caller drops its idle item: the key is
/// active again, and its next release queues a new one).
///
/// # Safety
/// `entry` is an entry of `shared.table()`, alive for the call (the caller holds its idle item
/// or a guard pinned before the chain's last release), and `guard` is pinned.
unsafe fn reap_with_state<K>(
    shared: &Shared<K>,
    entry: &KeyEntry<K>,
    guard: &Guard,
    garbage: &mut Garbage<K>,
) -> Option<bool>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let owned = Owned::claim(entry)?;
    if let Some(st) = owned.take_state() {
        shared.state_hooks().release(entry.key(), st);
    }
    let mut owned = Some(owned);
    let mut retired = false;
    let mut paused = false;
    // SAFETY: the entry is our table's; the closure retires only by moving our owned (claimed
    // above), empty chain to retired, in this call. The retire happens under the key's control
    // lock, unless paused (`Control::retire_unless_paused`): a pause meanwhile is not lost.
    unsafe {
        retire_unlink(shared, entry, guard, garbage, |ks| {
            let retire = || match owned.take().expect("ours until retired").retire_if_empty() {
                Ok(()) => true,
                Err(still_ours) => {
                    owned = Some(still_ours);
                    false
                }
            };
            match ks.control.retire_unless_paused(retire) {
                Some(r) => retired = r,
                None => paused = true,
            }
            retired
        })
    };
    if let Some(owned) = owned {
        if paused {
            crate::key_control::park_or_schedule(shared, owned);
        } else {
            shared.schedule(Runnable::Chain(owned.into_ptr()), None);
        }
    }
    Some(retired)
}

/// Called by the worker that just released `entry`'s chain, with a guard pinned before the release.
fn released<K>(
    shared: &Shared<K>,
    entry_ptr: NonNull<KeyEntry<K>>,
    guard: &Guard,
    fifo: &mut VecDeque<IdleItem<K>>,
    garbage: &mut Garbage<K>,
    now: &mut u64,
) where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: the guard was pinned before the release, so the entry stays allocated while it is
    // held even if another thread retires and unlinks it now.
    let entry = unsafe { entry_ptr.as_ref() };
    let timeout = shared.config().key_idle_timeout.as_millis() as u64;
    if timeout == 0 {
        if shared.state_hooks().on && entry.value().control.may_retire() {
            // SAFETY: the guard, pinned before the release, keeps the entry alive.
            unsafe { reap_with_state(shared, entry, guard, garbage) };
            return;
        }
        let mut paused = false;
        // SAFETY: every entry the executor handles comes from its one table, and `try_retire`
        // succeeds only on the idle-to-retired transition.
        unsafe {
            retire_unlink(shared, entry, guard, garbage, |ks| {
                paused = !ks.control.may_retire();
                !paused && ks.chain.try_retire()
            })
        };
        if paused {
            // SAFETY: the guard, pinned before the release, keeps the entry alive.
            unsafe { crate::key_control::park_idle(shared, entry_ptr) };
        }
        return;
    }
    if *now == 0 {
        *now = shared.now_ms();
    }
    if entry.value().idle.released(*now) {
        // We set QUEUED, so no item exists and nobody can retire the key: it is safe to keep.
        fifo.push_back(IdleItem {
            entry: entry_ptr,
            deadline: *now + timeout,
        });
        // With key state the cap does not apply: a key's state lives while the key is live,
        // until its idle timeout or a key budget releases it (DESIGN 3.1b), so an early release
        // would lose it (issue "Baton": `init` ran again for live keys once a worker held more
        // than `IDLE_CAP` idle keys). The user's timeout and `max_keys` bound those keys.
        while !shared.state_hooks().on && fifo.len() > IDLE_CAP {
            reap_front(shared, fifo, garbage, guard, *now, timeout, true);
        }
    }
}

/// `shutdown_now` drained `entry`'s chain (its tasks were handed back): releases the key's
/// state (if still there), the chain and, unless a worker's idle queue holds the key's item
/// (that worker retires it when it exits), retires and frees the key now, so handed-back keys
/// do not stay live until the drop. `Err`: the chain was not empty after all (a push came),
/// and the caller still owns it.
///
/// # Safety
/// `owned`'s entry is an entry of `shared.table()`.
pub(crate) unsafe fn release_drained<K>(shared: &Shared<K>, owned: Owned<K>) -> Result<(), Owned<K>>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // Pinned before the release: from then on others may retire the entry.
    let guard = shared.pin();
    // SAFETY: the entry is alive while we hold the baton, and after the release under `guard`
    // (pinned before it).
    let entry = unsafe { owned.ptr().as_ref() };
    // Its state ends here (`shutdown_now` moved it to the key's handed-back tasks first, if
    // there are any: `state_hold.rs`).
    if let Some(st) = owned.take_state() {
        shared.state_hooks().release(entry.key(), st);
    }
    owned.release_if_empty()?; // not empty after all: still the caller's
    let now = shared.now_ms();
    if entry.value().idle.released(now) {
        // We set QUEUED: we hold the key's one idle item, so we may retire it (as its reaper).
        let mut garbage = Vec::new();
        // SAFETY: the entry is our table's; `reap` answers `Retired` only when its `try_retire`
        // made the idle-to-retired transition.
        unsafe {
            retire_unlink(shared, entry, &guard, &mut garbage, |ks| {
                ks.idle.reap(&ks.chain, now, 0, true) == Reap::Retired
            })
        };
        shared.table().defer_free(garbage, &guard);
    }
    Ok(())
}

/// Takes the oldest item and acts on it (`force`: whatever its deadline).
fn reap_front<K>(
    shared: &Shared<K>,
    fifo: &mut VecDeque<IdleItem<K>>,
    garbage: &mut Garbage<K>,
    guard: &Guard,
    now: u64,
    timeout: u64,
    force: bool,
) -> bool
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let Some(item) = fifo.pop_front() else {
        return false;
    };
    // SAFETY: we hold the key's only idle item, so nobody else retires (and frees) it.
    let entry = unsafe { item.entry.as_ref() };
    let mut outcome = Reap::Dropped;
    if !entry.value().control.may_retire() {
        // A paused key is never released (`control.rs`): its item is dropped and its idle
        // chain parked instead (a chain active again is parked by its owner).
        entry.value().idle.drop_item();
        // SAFETY: we held the key's idle item until now, under `guard`.
        unsafe { crate::key_control::park_idle(shared, item.entry) };
        return false;
    }
    if shared.state_hooks().on && entry.value().idle.due(now, timeout, force) {
        // SAFETY: we hold the key's idle item.
        match unsafe { reap_with_state(shared, entry, guard, garbage) } {
            Some(true) => return true,
            Some(false) => {
                entry.value().idle.drop_item();
                return false;
            }
            None => {
                // Active again. Not the ordinary reap below: its `try_retire` would succeed on
                // a chain released since our claim failed, and retire the key without its
                // state's hook (issue "Baton": a state lost, found by the chaos test under
                // `max_keys`, whose submitters reap keys active again).
                let ks = entry.value();
                if let Reap::Requeue(deadline) = ks.idle.active_again(&ks.chain, timeout) {
                    fifo.push_back(IdleItem {
                        entry: item.entry,
                        deadline,
                    });
                }
                return false;
            }
        }
    }
    // SAFETY: every entry the executor handles comes from its one table, and `reap` answers
    // `Retired` only when its `try_retire` made the idle-to-retired transition.
    unsafe {
        retire_unlink(shared, entry, guard, garbage, |ks| {
            outcome = ks.idle.reap(&ks.chain, now, timeout, force);
            outcome == Reap::Retired
        })
    };
    if let Reap::Requeue(deadline) = outcome {
        fifo.push_back(IdleItem {
            entry: item.entry,
            deadline,
        });
    }
    outcome == Reap::Retired
}

/// With a key budget, a submitter of a new key at the limit: releases the oldest idle key of
/// the shared FIFO (whatever its deadline); `true` if one was retired (its share is back).
pub(crate) fn release_one_idle<K>(shared: &Shared<K>) -> bool
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let Some(shared_fifo) = shared.shared_idle() else {
        return false;
    };
    let guard = shared.pin();
    let timeout = shared.config().key_idle_timeout.as_millis() as u64;
    let now = shared.now_ms();
    let mut garbage = Vec::new();
    let mut fifo = crate::sync::lock(shared_fifo);
    let mut retired = false;
    while !retired && !fifo.is_empty() {
        retired = reap_front(shared, &mut fifo, &mut garbage, &guard, now, timeout, true);
    }
    drop(fifo);
    shared.table().defer_free(garbage, &guard);
    retired
}

/// Retires the keys whose timeout passed (all of them if `all`).
fn reap<K>(
    shared: &Shared<K>,
    epoch: &LocalHandle,
    fifo: &mut VecDeque<IdleItem<K>>,
    garbage: &mut Garbage<K>,
    now: u64,
    all: bool,
) where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let timeout = shared.config().key_idle_timeout.as_millis() as u64;
    let guard = epoch.pin();
    let mut budget = fifo.len();
    while budget > 0 {
        budget -= 1;
        let Some(front) = fifo.front() else { break };
        if !all && front.deadline > now {
            break;
        }
        reap_front(shared, fifo, garbage, &guard, now, timeout, all);
    }
}

/// One worker's idle keys: the FIFO of keys waiting for their timeout (deadline order) and the
/// entries it unlinked that wait for a batched deferred free. Owned by its worker thread.
pub(crate) struct IdleKeys<K> {
    fifo: VecDeque<IdleItem<K>>,
    garbage: Garbage<K>,
}

impl<K> IdleKeys<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    pub(crate) fn new() -> Self {
        IdleKeys {
            fifo: VecDeque::new(),
            garbage: Vec::new(),
        }
    }

    /// No key is waiting for its timeout in this worker's own FIFO (with a key budget the
    /// shared one holds them: any worker may leave).
    pub(crate) fn is_empty(&self) -> bool {
        self.fifo.is_empty()
    }

    /// The earliest deadline, if any key waits (in the shared FIFO, with a key budget).
    pub(crate) fn next_deadline(&self, shared: &Shared<K>) -> Option<u64> {
        match shared.shared_idle() {
            Some(f) => crate::sync::lock(f).front().map(|i| i.deadline),
            None => self.fifo.front().map(|i| i.deadline),
        }
    }

    /// The worker just released `entry_ptr`'s chain, under `guard` pinned before the release
    /// (`now`: the worker's clock, read lazily).
    pub(crate) fn released(
        &mut self,
        shared: &Shared<K>,
        entry_ptr: NonNull<KeyEntry<K>>,
        guard: &Guard,
        now: &mut u64,
    ) {
        match shared.shared_idle() {
            Some(f) => {
                let mut fifo = crate::sync::lock(f);
                released(shared, entry_ptr, guard, &mut fifo, &mut self.garbage, now);
            }
            None => released(
                shared,
                entry_ptr,
                guard,
                &mut self.fifo,
                &mut self.garbage,
                now,
            ),
        }
    }

    /// Retires the keys whose timeout passed by `now` (every key if `all`); `epoch`: the
    /// worker's registration with the table's collector.
    pub(crate) fn reap(&mut self, shared: &Shared<K>, epoch: &LocalHandle, now: u64, all: bool) {
        if let Some(f) = shared.shared_idle() {
            let mut fifo = crate::sync::lock(f);
            if !fifo.is_empty() {
                reap(shared, epoch, &mut fifo, &mut self.garbage, now, all);
            }
            return;
        }
        if !self.fifo.is_empty() {
            reap(shared, epoch, &mut self.fifo, &mut self.garbage, now, all);
        }
    }

    /// Takes over the items of a worker that exited.
    pub(crate) fn adopt(&mut self, items: impl IntoIterator<Item = IdleItem<K>>) {
        self.fifo.extend(items);
    }

    /// Gives up every item (an exiting worker's, for another to adopt).
    pub(crate) fn take_items(&mut self) -> Vec<IdleItem<K>> {
        self.fifo.drain(..).collect()
    }

    /// Forgets every item: at shutdown, the keys still listed are freed with the table.
    pub(crate) fn forget(&mut self) {
        self.fifo.clear();
    }

    /// Hands every unlinked entry to the epoch now (before sleeping or exiting).
    pub(crate) fn flush(&mut self, shared: &Shared<K>, epoch: &LocalHandle) {
        if !self.garbage.is_empty() {
            let guard = epoch.pin();
            shared
                .table()
                .defer_free(std::mem::take(&mut self.garbage), &guard);
        }
    }
}
