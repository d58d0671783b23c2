//! Idle release of keys: a key's chain is retired `key_idle_timeout` after it drains, even if
//! nothing else is ever submitted, so memory does not grow with the keys ever seen.
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
//! worker holds more idle keys than its adaptive cap (`IdleCap`, 1,024 to 65,536; the oldest go
//! first): the timeout is a cache of hot keys' state, bounded in size, not a promise to keep
//! state.

use std::collections::VecDeque;
use std::ptr::NonNull;

use crossbeam_epoch::Guard;
use keyserial_core::chain::{Chain, Linked};
use keyserial_core::table::Unlinked;

use crate::shared::{IdleItem, KeyEntry, Shared};
use crate::sync::{AtomicU64, Ordering};

const QUEUED: u64 = 1;

/// A key's idle word: `(release tick << 1) | QUEUED` (see the module docs).
#[derive(Debug, Default)]
pub struct IdleWord(AtomicU64);

/// What the holder of a key's idle item must do with it (see [`IdleWord::reap`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reap {
    /// The chain was idle and empty and is now retired: unlink it from the table.
    Retired,
    /// Keep the item, with this deadline.
    Requeue(u64),
    /// The key is active again: the item is dropped (a later release queues a new one).
    Dropped,
}

impl IdleWord {
    /// A word with no item queued.
    pub fn new() -> IdleWord {
        IdleWord(AtomicU64::new(0))
    }

    /// After the key's chain was released at `now`: records the tick and returns `true` if the
    /// caller set `QUEUED` and so must queue the key's one idle item.
    pub fn released(&self, now: u64) -> bool {
        self.0.swap((now << 1) | QUEUED, Ordering::AcqRel) & QUEUED == 0
    }

    /// The tick of the key's last release (a hint: it may move on at any time).
    pub fn last_release(&self) -> u64 {
        self.0.load(Ordering::Relaxed) >> 1
    }

    /// The holder of the key's idle item, at `now`, with the idle `timeout` (`force`: ignore the
    /// time, as at shutdown): retire the key if it stayed idle long enough, keep the item if it was
    /// released again since, or drop the item if the key is active.
    pub fn reap<N: Linked>(&self, chain: &Chain<N>, now: u64, timeout: u64, force: bool) -> Reap {
        let last = self.0.load(Ordering::Acquire) >> 1;
        if !force && last + timeout > now {
            return Reap::Requeue(last + timeout);
        }
        if chain.try_retire() {
            return Reap::Retired;
        }
        // Active again: drop our item; a later release queues a new one...
        self.0.fetch_and(!QUEUED, Ordering::AcqRel);
        // ...unless it was released before our fetch_and saw its swap: then re-queue it here.
        if chain.is_idle() {
            let prev = self.0.fetch_or(QUEUED, Ordering::AcqRel);
            if prev & QUEUED == 0 {
                return Reap::Requeue((prev >> 1) + timeout);
            }
        }
        Reap::Dropped
    }
}

/// The most idle keys one worker keeps waiting for their timeout; beyond its current cap (see
/// [`IdleCap`]) the oldest is released at once. A working set of up to this many keys per worker
/// (100 k keys round-robin on 2 workers: 2.1x the throughput of a 1,024 cap) skips re-creating
/// key state between tasks; an idle key costs about 100 bytes (a 64-byte entry, its share of the
/// table and a 16-byte FIFO item), so at most about 6 MiB per worker. Releasing an idle key early
/// is invisible to users (its next task re-creates it).
pub(crate) const IDLE_CAP_MAX: usize = 1 << 16;

/// The smallest cap [`IdleCap`] shrinks to.
pub(crate) const IDLE_CAP_MIN: usize = 1 << 10;

/// Cap evictions per window after which [`IdleCap`] decides.
const CAP_WINDOW: u32 = 1024;

/// Most evictions one release performs when the FIFO is above the cap (so a shrinking cap
/// never stalls a worker on one long eviction loop).
const EVICTIONS_PER_RELEASE: usize = 2;

/// One worker's adaptive bound on its idle keys: the idle set is a cache of key state, and its
/// right size depends on whether keys come back.
///
/// Each eviction forced by the cap records whether the evicted key had been reused while it
/// waited (released again, or active again). Per window of [`CAP_WINDOW`] evictions: if fewer
/// than 1 in 8 evicted keys had been reused, the cache is pure cost (a flood of one-shot keys, or
/// a working set far larger than the cache, where an old key's path in the table is cold and its
/// unlink a string of cache misses): halve the cap, down to [`IDLE_CAP_MIN`]. If at least 1 in 4
/// had, keys come back and the cache is too small for them: double it, up to [`IDLE_CAP_MAX`].
/// When time-based reaping empties the FIFO (load calmed down), the cap resets to the maximum.
#[derive(Debug)]
pub(crate) struct IdleCap {
    cap: usize,
    evicted: u32,
    reused: u32,
}

impl IdleCap {
    pub(crate) fn new() -> IdleCap {
        IdleCap {
            cap: IDLE_CAP_MAX,
            evicted: 0,
            reused: 0,
        }
    }

    /// The current cap.
    pub(crate) fn get(&self) -> usize {
        self.cap
    }

    /// Records one eviction forced by the cap.
    fn evicted(&mut self, was_reused: bool) {
        self.evicted += 1;
        self.reused += u32::from(was_reused);
        if self.evicted >= CAP_WINDOW {
            if self.reused * 8 < self.evicted {
                self.cap = (self.cap / 2).max(IDLE_CAP_MIN);
            } else if self.reused * 4 >= self.evicted {
                self.cap = (self.cap * 2).min(IDLE_CAP_MAX);
            }
            self.evicted = 0;
            self.reused = 0;
        }
    }

    /// The FIFO emptied by time: start over at the maximum.
    fn reset(&mut self) {
        *self = IdleCap::new();
    }
}

/// Entries a worker unlinked and has yet to hand to the epoch, freed in batches of this many
/// (one deferred call per batch instead of one per key).
pub(crate) const GARBAGE_BATCH: usize = 64;

/// A worker's unlinked entries, waiting for a batched deferred free.
pub(crate) type Garbage<K> = Vec<Unlinked<K, crate::shared::KeyState>>;

/// Unlinks a retired key and queues its entry for a batched free.
fn unlink<K>(shared: &Shared<K>, entry: &KeyEntry<K>, guard: &Guard, garbage: &mut Garbage<K>)
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
{
    if let Some(taken) = shared.table.unlink_take(entry, guard) {
        garbage.push(taken);
        if garbage.len() >= GARBAGE_BATCH {
            shared.table.defer_free(std::mem::take(garbage), guard);
        }
    }
}

/// Called by the worker that just released `entry`'s chain, with a guard pinned before the release.
pub(crate) fn released<K>(
    shared: &Shared<K>,
    entry_ptr: NonNull<KeyEntry<K>>,
    guard: &Guard,
    fifo: &mut VecDeque<IdleItem<K>>,
    cap: &mut IdleCap,
    garbage: &mut Garbage<K>,
    now: &mut u64,
) where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
{
    // SAFETY: the guard was pinned before the release, so the entry stays allocated while it is
    // held even if another thread retires and unlinks it now.
    let entry = unsafe { entry_ptr.as_ref() };
    let timeout = shared.config.key_idle_timeout.as_millis() as u64;
    if timeout == 0 {
        if entry.value().chain.try_retire() {
            unlink(shared, entry, guard, garbage);
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
        let mut budget = EVICTIONS_PER_RELEASE;
        while fifo.len() > cap.get() && budget > 0 {
            budget -= 1;
            if let Some(was_reused) = reap_front(shared, fifo, garbage, guard, *now, timeout, true)
            {
                cap.evicted(was_reused);
            }
        }
    }
}

/// Takes the oldest item and acts on it (`force`: whatever its deadline). Returns whether the
/// key had been reused while its item waited (released again since, or active now), or `None`
/// if the FIFO was empty.
fn reap_front<K>(
    shared: &Shared<K>,
    fifo: &mut VecDeque<IdleItem<K>>,
    garbage: &mut Garbage<K>,
    guard: &Guard,
    now: u64,
    timeout: u64,
    force: bool,
) -> Option<bool>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
{
    let item = fifo.pop_front()?;
    // SAFETY: we hold the key's only idle item, so nobody else retires (and frees) it.
    let entry = unsafe { item.entry.as_ref() };
    let ks = entry.value();
    let released_again = ks.idle.last_release() + timeout > item.deadline;
    match ks.idle.reap(&ks.chain, now, timeout, force) {
        Reap::Retired => {
            unlink(shared, entry, guard, garbage);
            Some(released_again)
        }
        Reap::Requeue(deadline) => {
            fifo.push_back(IdleItem {
                entry: item.entry,
                deadline,
            });
            Some(true)
        }
        Reap::Dropped => Some(true),
    }
}

/// Retires the keys whose timeout passed (all of them if `all`).
pub(crate) fn reap<K>(
    shared: &Shared<K>,
    fifo: &mut VecDeque<IdleItem<K>>,
    cap: &mut IdleCap,
    garbage: &mut Garbage<K>,
    now: u64,
    all: bool,
) where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
{
    let timeout = shared.config.key_idle_timeout.as_millis() as u64;
    let guard = crossbeam_epoch::pin();
    let mut budget = fifo.len();
    while budget > 0 {
        budget -= 1;
        let Some(front) = fifo.front() else { break };
        if !all && front.deadline > now {
            break;
        }
        reap_front(shared, fifo, garbage, &guard, now, timeout, all);
    }
    if fifo.is_empty() {
        cap.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_shrinks_when_evicted_keys_never_came_back() {
        let mut cap = IdleCap::new();
        assert_eq!(cap.get(), IDLE_CAP_MAX);
        for _ in 0..CAP_WINDOW {
            cap.evicted(false);
        }
        assert_eq!(cap.get(), IDLE_CAP_MAX / 2);
        for _ in 0..64 * CAP_WINDOW {
            cap.evicted(false);
        }
        assert_eq!(cap.get(), IDLE_CAP_MIN, "never below the minimum");
    }

    #[test]
    fn cap_grows_when_evicted_keys_were_being_reused() {
        let mut cap = IdleCap::new();
        for _ in 0..3 * CAP_WINDOW {
            cap.evicted(false);
        }
        assert_eq!(cap.get(), IDLE_CAP_MAX / 8);
        // One in three evicted keys had been reused: the cache is too small for them.
        for i in 0..CAP_WINDOW {
            cap.evicted(i % 3 == 0);
        }
        assert_eq!(cap.get(), IDLE_CAP_MAX / 4);
        for i in 0..64 * CAP_WINDOW {
            cap.evicted(i % 2 == 0);
        }
        assert_eq!(cap.get(), IDLE_CAP_MAX, "never above the maximum");
    }

    #[test]
    fn cap_holds_in_between_and_resets() {
        let mut cap = IdleCap::new();
        for _ in 0..CAP_WINDOW {
            cap.evicted(false);
        }
        let c = cap.get();
        // One in six reused: neither pure cost nor clearly too small.
        for i in 0..CAP_WINDOW {
            cap.evicted(i % 6 == 0);
        }
        assert_eq!(cap.get(), c);
        cap.reset();
        assert_eq!(cap.get(), IDLE_CAP_MAX);
    }
}
