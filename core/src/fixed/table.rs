//! The fixed key table: `KEYS` slots, each holding one live key and its task chain.
//!
//! # The slot word
//!
//! ```text
//!  bits 0..3   state   FREE | CLAIMED | CANDIDATE | LIVE | DEAD
//!  bits 3..11  tag     8 bits of the key's hash (0 while FREE or CLAIMED)
//!  bits 11..   pins    how many calls are reading this slot's key or chain right now
//! ```
//!
//! | transition | who | how |
//! |---|---|---|
//! | `FREE -> CLAIMED` | an inserter | `CAS`; the slot is then its alone: it writes the key |
//! | `CLAIMED -> CANDIDATE` (1 pin) | that inserter | release store (nobody else writes a claimed word) |
//! | `CANDIDATE -> LIVE` or `-> DEAD` | anyone helping the insert descriptor (below) | `CAS`, pins kept |
//! | `LIVE -> DEAD` | whoever holds a pin and sees the chain `RETIRED` | `CAS`, pins kept |
//! | pins `+1` | a reader | `CAS`, only on `CANDIDATE`/`LIVE`, or `DEAD` with pins > 0 |
//! | pins `-1` | that reader | `fetch_sub`; the one that leaves `DEAD` with 0 pins frees the slot |
//! | `DEAD`, 0 pins `-> FREE` | that one | drops the key, revives the chain, release store |
//!
//! **Pins make reuse safe (no ABA).** A slot's key is read, and its chain pushed to, only under
//! a pin, and a pinned slot is never freed, so a reader always sees one incarnation. A lookup
//! that pinned a slot re-checks the key under the pin, so pinning a slot that was reused since
//! the lookup read its word is harmless. Every `+1` is undone by the same call (the table never
//! waits for a pin to drop: the last reader out frees the slot).
//!
//! # Inserting a new key: the insert descriptor
//!
//! Two submitters of one new key must end up with one slot. An inserter claims a free slot,
//! writes the key, makes it a `CANDIDATE`, then installs it in the one-word *insert descriptor*
//! `ins` (`CAS(0 -> slot + 1)`; the descriptor holds its own pin). Whoever finds a candidate in
//! `ins`, its own or another's, *helps* it: pins it, checks `ins` still names it, scans the table
//! for a `LIVE` slot with an equal key whose chain is not retired, and decides the candidate with
//! one `CAS`: `DEAD` if such a key exists (the inserter then uses that slot), `LIVE` otherwise;
//! then clears `ins` (`CAS(slot + 1 -> 0)`, dropping the descriptor's pin). Inserting must first
//! clear `ins`, so a stopped inserter never blocks anyone: the next one finishes its insert.
//! Only the candidate in `ins` can become `LIVE`, and `ins` is cleared only after it is decided,
//! so a helper's scan (done while `ins` names the candidate) cannot miss a key that became `LIVE`
//! before the decision: **at most one `LIVE` slot per key**.
//!
//! A lookup scans from the key's home `hash % KEYS` through all `KEYS` slots (bounded probes:
//! one word each, a key comparison only on a tag match); an inserter claims the first `FREE`
//! slot from the home, so a key is usually found within a few probes.
//!
//! # Capacity
//!
//! `live` counts reserved keys (claimed, candidate and live slots): an inserter reserves one
//! (`CAS` while below `KEYS`) before it claims a slot, so `KEYS` keys fit exactly. The reservation
//! is returned by whoever moves the slot to `DEAD`. A `DEAD` slot is reused once its last pin is
//! gone; while a preempted call still pins one, an insert can find no free slot although fewer
//! than `KEYS` keys are live, and refuses it (`KeysFull`): a transient shortfall of one slot per
//! call stopped in the middle of a key comparison.

use core::hash::Hash;
use core::mem::MaybeUninit;

use crate::chain::Chain;
use crate::pool::PoolNode;
use crate::sync::{AtomicUsize, Ordering, UnsafeCell};

const STATE: usize = 0b111;
const FREE: usize = 0;
const CLAIMED: usize = 1;
const CANDIDATE: usize = 2;
const LIVE: usize = 3;
const DEAD: usize = 4;
const TAG_SHIFT: u32 = 3;
const TAG: usize = 0xff << TAG_SHIFT;
const PIN: usize = 1 << 11;

/// hash32's 32-bit FNV-1a hasher (heapless's) over `K`'s `Hash`.
#[inline]
pub(super) fn hash_of<K: Hash>(key: &K) -> u32 {
    use hash32::Hasher as _;
    let mut h = hash32::FnvHasher::default();
    key.hash(&mut h);
    h.finish32()
}

#[inline]
fn tag_of(hash: u32) -> usize {
    ((hash >> 24) as usize) << TAG_SHIFT
}

pub(super) struct Slot<K, T> {
    word: AtomicUsize,
    key: UnsafeCell<MaybeUninit<K>>,
    pub(super) chain: Chain<PoolNode<T>>,
}

impl<K, T> Slot<K, T> {
    #[cfg(not(loom))]
    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Self = Slot {
        word: AtomicUsize::new(FREE),
        key: UnsafeCell::new(MaybeUninit::uninit()),
        chain: Chain::new(),
    };

    /// The slot's key.
    ///
    /// # Safety
    /// The caller pins the slot (or holds its chain's baton, which keeps it `LIVE`) and the slot
    /// is `CANDIDATE`, `LIVE` or `DEAD`, so the key is written and not dropped while `'a` lasts.
    pub(super) unsafe fn key<'a>(&self) -> &'a K {
        // SAFETY: per the contract the key is initialised and outlives 'a; it is written only
        // while the slot is CLAIMED, which a pinned or baton-held slot cannot become.
        self.key.with(|k| unsafe { (*k).assume_init_ref() })
    }
}

pub(super) struct Table<K, T, const KEYS: usize> {
    slots: [Slot<K, T>; KEYS],
    /// The insert descriptor: 0, or the index + 1 of the candidate being decided.
    ins: AtomicUsize,
    /// Reserved keys (see the module docs).
    live: AtomicUsize,
}

// SAFETY: keys are read through `&K` from many threads at once (K: Sync) and moved in and dropped
// by whichever thread inserts or frees a slot (K: Send); tasks only move (T: Send). The protocol
// above gives every write of a key or chain field to one thread at a time.
unsafe impl<K: Send + Sync, T: Send, const KEYS: usize> Sync for Table<K, T, KEYS> {}

/// What [`Table::insert`] did.
pub(super) enum Inserted {
    /// The new key is `LIVE` in this slot, pinned for the caller.
    Live(usize),
    /// Another slot holds the key now: look it up again.
    Exists,
    /// No room for another key.
    Full,
}

impl<K: Hash + Eq + Clone, T, const KEYS: usize> Table<K, T, KEYS> {
    #[cfg(not(loom))]
    pub(super) const fn new() -> Self {
        Table {
            slots: [Slot::EMPTY; KEYS],
            ins: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
        }
    }

    #[cfg(loom)]
    pub(super) fn new() -> Self {
        Table {
            slots: core::array::from_fn(|_| Slot {
                word: AtomicUsize::new(FREE),
                key: UnsafeCell::new(MaybeUninit::uninit()),
                chain: Chain::new(),
            }),
            ins: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
        }
    }

    #[inline]
    pub(super) fn slot(&self, i: usize) -> &Slot<K, T> {
        &self.slots[i]
    }

    pub(super) fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Pins slot `i` if it is `LIVE` with `tag`. Lock-free (retries only when the word changed).
    fn pin_live(&self, i: usize, tag: usize) -> bool {
        let word = &self.slots[i].word;
        let mut w = word.load(Ordering::Relaxed);
        loop {
            if w & (STATE | TAG) != LIVE | tag {
                return false;
            }
            // Acquire: the key written before the slot was published happens-before our read.
            match word.compare_exchange_weak(w, w + PIN, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => w = actual,
            }
        }
    }

    /// Pins slot `i` unless it is free, claimed, or dead with no pins (being freed).
    fn pin_any(&self, i: usize) -> bool {
        let word = &self.slots[i].word;
        let mut w = word.load(Ordering::Relaxed);
        loop {
            let s = w & STATE;
            if s == FREE || s == CLAIMED || (s == DEAD && w < PIN) {
                return false;
            }
            match word.compare_exchange_weak(w, w + PIN, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => w = actual,
            }
        }
    }

    /// Pins slot `i`, which the caller knows is `LIVE` (it holds the chain's baton).
    pub(super) fn pin_held(&self, i: usize) {
        self.slots[i].word.fetch_add(PIN, Ordering::Acquire);
    }

    /// Drops a pin; the call that leaves the slot `DEAD` with no pins frees it. Wait-free.
    pub(super) fn unpin(&self, i: usize) {
        // Release: our reads of the key happen-before the freer's drop; Acquire: the freer sees
        // every other reader's release.
        let prev = self.slots[i].word.fetch_sub(PIN, Ordering::AcqRel);
        debug_assert!(prev >= PIN);
        if prev & STATE == DEAD && prev < 2 * PIN {
            self.free(i);
        }
    }

    /// Frees a slot that is `DEAD` with no pins, which makes the caller its only user.
    fn free(&self, i: usize) {
        let slot = &self.slots[i];
        // SAFETY: DEAD with no pins: nobody can pin the slot again, so nobody reads the key; it
        // was written before the slot became CANDIDATE and is dropped exactly once, here.
        slot.key.with_mut(|k| unsafe { (*k).assume_init_drop() });
        // SAFETY: the chain is retired or never used (a candidate that never went LIVE), and
        // every push to it happens under a pin, so no stale push can follow.
        unsafe { slot.chain.revive() };
        slot.word.store(FREE, Ordering::Release);
    }

    /// Marks a `LIVE` slot whose chain is retired `DEAD` and returns its key reservation. The
    /// caller holds a pin, so the slot is freed by the last unpin, not here. Lock-free.
    pub(super) fn mark_dead(&self, i: usize) {
        let word = &self.slots[i].word;
        let mut w = word.load(Ordering::Relaxed);
        while w & STATE == LIVE {
            match word.compare_exchange_weak(
                w,
                (w & !STATE) | DEAD,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.live.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
                Err(actual) => w = actual,
            }
        }
    }

    /// Finds the `LIVE` slot holding `key` and pins it. Lock-free; at most `KEYS` probes.
    pub(super) fn find(&self, key: &K, hash: u32) -> Option<usize> {
        self.scan(key, tag_of(hash), hash as usize % KEYS, usize::MAX)
    }

    /// Scans all slots from `start` (skipping `skip`) for a `LIVE`, not retired slot holding
    /// `key`; returns it pinned.
    fn scan(&self, key: &K, tag: usize, start: usize, skip: usize) -> Option<usize> {
        let mut i = start;
        for _ in 0..KEYS {
            if i != skip && self.pin_live(i, tag) {
                let slot = &self.slots[i];
                // SAFETY: pinned and LIVE when pinned, so the key stays initialised.
                if unsafe { slot.key() } == key {
                    if !slot.chain.is_retired() {
                        return Some(i);
                    }
                    self.mark_dead(i); // its retirer may be stopped: finish its step
                }
                self.unpin(i);
            }
            i += 1;
            if i == KEYS {
                i = 0;
            }
        }
        None
    }

    fn reserve(&self) -> bool {
        let mut n = self.live.load(Ordering::Relaxed);
        loop {
            if n >= KEYS {
                return false;
            }
            match self
                .live
                .compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => n = actual,
            }
        }
    }

    fn claim(&self, home: usize) -> Option<usize> {
        let mut i = home;
        for _ in 0..KEYS {
            let word = &self.slots[i].word;
            if word.load(Ordering::Relaxed) == FREE
                && word
                    .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return Some(i);
            }
            i += 1;
            if i == KEYS {
                i = 0;
            }
        }
        None
    }

    /// Inserts `key`, which [`find`](Self::find) did not find. Lock-free.
    pub(super) fn insert(&self, key: &K, hash: u32) -> Inserted {
        if !self.reserve() {
            return Inserted::Full;
        }
        let home = hash as usize % KEYS;
        let c = match self.claim(home) {
            Some(c) => c,
            None => {
                // A decided candidate may still be held by the descriptor: clear it, retry once.
                self.help();
                match self.claim(home) {
                    Some(c) => c,
                    None => {
                        self.live.fetch_sub(1, Ordering::Relaxed);
                        return Inserted::Full;
                    }
                }
            }
        };
        let slot = &self.slots[c];
        let key = key.clone();
        // SAFETY: CLAIMED: this thread is the slot's only user until it publishes below.
        slot.key.with_mut(|k| unsafe { (*k).write(key) });
        // Our own pin and the descriptor's. Release publishes the key to every later pinner.
        slot.word
            .store(CANDIDATE | tag_of(hash) | (2 * PIN), Ordering::Release);
        loop {
            self.help();
            if self
                .ins
                .compare_exchange(0, c + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                break;
            }
        }
        self.help(); // decides our candidate, unless a helper already did
        if slot.word.load(Ordering::Acquire) & STATE == LIVE {
            Inserted::Live(c)
        } else {
            self.unpin(c);
            Inserted::Exists
        }
    }

    /// Completes the insert named by the descriptor, if any. Lock-free.
    fn help(&self) {
        let d = self.ins.load(Ordering::Acquire);
        let Some(c) = d.checked_sub(1) else { return };
        if !self.pin_any(c) {
            return; // the descriptor pins its candidate, so it has moved on
        }
        // The descriptor's pin kept this incarnation from being freed since it was installed,
        // and ours keeps it now: if `ins` still names it, it is the one we pinned.
        if self.ins.load(Ordering::Acquire) == d {
            self.decide(c);
            if self
                .ins
                .compare_exchange(d, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.unpin(c); // the descriptor's pin
            }
        }
        self.unpin(c);
    }

    /// Decides a pinned candidate that the descriptor names: `DEAD` if its key is already
    /// `LIVE` elsewhere, `LIVE` otherwise.
    fn decide(&self, c: usize) {
        let slot = &self.slots[c];
        let w = slot.word.load(Ordering::Acquire);
        if w & STATE != CANDIDATE {
            return;
        }
        // SAFETY: pinned, and CANDIDATE or later, so the key is initialised.
        let key = unsafe { slot.key() };
        let exists = match self.scan(key, w & TAG, 0, c) {
            Some(other) => {
                self.unpin(other);
                true
            }
            None => false,
        };
        let to = if exists { DEAD } else { LIVE };
        let mut w = w;
        while w & STATE == CANDIDATE {
            match slot.word.compare_exchange_weak(
                w,
                (w & !STATE) | to,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if exists {
                        self.live.fetch_sub(1, Ordering::Relaxed);
                    }
                    return;
                }
                Err(actual) => w = actual,
            }
        }
    }
}

impl<K, T, const KEYS: usize> Drop for Table<K, T, KEYS> {
    fn drop(&mut self) {
        for slot in &self.slots {
            // `&mut self`: no other thread touches the table. (A load rather than `get_mut`, as
            // in `Chain::drop`, so loom models do not flag the destructor.)
            let s = slot.word.load(Ordering::Relaxed) & STATE;
            if s == CANDIDATE || s == LIVE || s == DEAD {
                // SAFETY: the key is initialised in these states and dropped only here or by
                // `free`, which did not run for this incarnation (the slot is not FREE).
                slot.key.with_mut(|k| unsafe { (*k).assume_init_drop() });
            }
        }
    }
}
