//! A key's idle word: the lock-free half of idle release (see `idle.rs` for the worker side).
//!
//! `(release tick << 1) | QUEUED`: a key has an item in some worker's idle FIFO exactly while
//! `QUEUED` is set; the protocol (who sets and clears it, why no idle key is forgotten and no
//! queued key is freed) is written down in `idle.rs`, and checked by `loom/tests/idle.rs`.

use keyserial_core::chain::{Chain, Linked};

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

    /// Whether the key has stayed idle for `timeout` by `now` since its last release (`force`:
    /// whatever the time): what [`reap`](Self::reap) checks first.
    pub fn due(&self, now: u64, timeout: u64, force: bool) -> bool {
        force || (self.0.load(Ordering::Acquire) >> 1) + timeout <= now
    }

    /// The holder of the key's idle item drops it without retiring the key (a paused key,
    /// `control.rs`): a later release queues a new one.
    pub fn drop_item(&self) {
        self.0.fetch_and(!QUEUED, Ordering::AcqRel);
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
        self.active_again(chain, timeout)
    }

    /// The holder of the key's idle item found the chain active (its claim or retire failed):
    /// drops the item, or keeps it ([`Reap::Requeue`]) if the chain was released again before
    /// the drop. Never retires: with key state the key must be released by a claim
    /// (`idle.rs`, `reap_with_state`), which takes the state first.
    pub fn active_again<N: Linked>(&self, chain: &Chain<N>, timeout: u64) -> Reap {
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
