//! Pausing a key: a per-key word that keeps the key's later tasks from starting, and the parked
//! chain that holds the key, live and owned, without holding a worker.
//!
//! # States
//!
//! Each tracked key (`key.rs`) has a [`Control`]: under one small mutex, `paused` and the id of
//! the pause's parked wait (`wait`, 0 for none), with `paused` mirrored in an atomic hint that
//! the hot paths read without the lock.
//!
//! ```text
//!   running      not paused; the chain is idle or owned by whoever drains it
//!   paused       paused, not parked: the chain is owned by a worker inside the key's running
//!                task (it parks the chain when that task returns), or idle and empty
//!   parked       paused and parked: the chain's baton belongs to a registered wait in the
//!                serializer's registry of parked chains (`permit_wait.rs`), as for a permit wait
//! ```
//!
//! # Transitions and who makes them
//!
//! | step | who | what |
//! |---|---|---|
//! | [`pause`](Control::pause) | anyone | under the lock: `paused = true` (and the hint). Then the pauser tries [`try_claim`](keyserial_core::chain::Chain::try_claim) on the chain: if it wins an idle chain's baton, it parks it (next row). |
//! | [`park`](Control::park) | the holder of the chain's baton (a worker draining it, the pauser that claimed it, the reaper of an idle key) | under the lock, if `paused`: register a wait and keep its id; the baton goes to the wait. If not paused any more, the caller keeps the baton (and schedules or releases the chain as usual). |
//! | [`resume`](Control::resume) | anyone | under the lock: `paused = false`, take the wait id. Outside the lock, the resumer grants that wait (`WaitRegistry::grant`), which puts the chain on a ready queue, unless `shutdown_now` stole it first. |
//! | may retire | whoever would retire the key's idle chain | under the lock: `!paused`. |
//!
//! # Why nothing is lost, run twice, or run while paused
//!
//! - **A submit after `pause` returned never starts before `resume`.** `pause` made the key
//!   tracked (its entry, counted in its lane) and set the hint before it returned; the submit's
//!   lane push happens after that, and the lane's pop (Acquire) makes both visible to the router,
//!   which sends the item onto the key's chain (`route.rs`: a paused key's items always go
//!   there). The chain's owner reads the hint after it pops the item (the pop acquires the push,
//!   which happened after the hint was set), so it puts the item back and parks instead of
//!   running it. A task already starting when `pause` is called may still start: that is the
//!   "running one".
//! - **The baton has one holder.** Only the holder parks; the wait, once registered, is taken by
//!   exactly one of the resume's grant and `shutdown_now` (the wait's hand-off CAS). `park` and
//!   `resume` serialize on the lock, so a resume either finds the wait id (and grants it) or
//!   comes first (and `park` then finds the key not paused, and the holder keeps the baton).
//! - **A paused key is never released.** Retiring needs an idle chain and, under the lock,
//!   `!paused`; a pauser whose claim loses to a retire (the chain word's CAS decides) sees the
//!   chain retired and starts over on the key's fresh entry. A paused key whose chain is idle
//!   but not parked (its owner released it before it saw the hint) keeps its entry: the reaper of
//!   an idle key finds it paused under the lock and parks it instead of retiring it.
//!
//! Loom model: `loom/tests/control.rs` (pause, resume, a worker's drain and a reaper racing on
//! the real [`Control`] and core chain).

use crate::sync::{lock, AtomicBool, Mutex, Ordering};

/// What the lock guards.
#[derive(Debug, Default)]
struct Locked {
    paused: bool,
    /// `cancel_key`s holding the key still while they take its tasks (each parks the chain like
    /// a pause, without changing what `pause` and `resume` see).
    holds: u32,
    /// The id of the wait that holds the parked chain's baton (0: none).
    wait: u64,
}

/// A key's pause state (see the module docs).
#[derive(Debug, Default)]
pub struct Control {
    /// `Locked::paused`, readable without the lock (a hint: see the module docs for when a
    /// reader may rely on it).
    hint: AtomicBool,
    locked: Mutex<Locked>,
}

/// What [`Control::resume`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// The key was not paused: nothing changed.
    NotPaused,
    /// The key was paused and is not any more; the chain was not parked (its owner goes on).
    Unparked,
    /// The key was paused and parked by the wait with this id: the caller grants it.
    Parked(u64),
}

impl Control {
    /// A key that is not paused.
    pub fn new() -> Control {
        Control::default()
    }

    /// Whether the chain's holder must park it: the key is paused or held (the hint: see the
    /// module docs for when a reader may rely on it).
    #[inline]
    pub fn is_paused(&self) -> bool {
        self.hint.load(Ordering::Acquire)
    }

    /// Whether the key is paused by `pause` (not counting holds), read under the lock.
    pub fn is_paused_by_user(&self) -> bool {
        lock(&self.locked).paused
    }

    /// The id of the wait that holds the parked chain, if it is parked (under the lock).
    pub fn wait_id(&self) -> Option<u64> {
        Some(lock(&self.locked).wait).filter(|&id| id != 0)
    }

    /// `cancel_key` holds the key still: its chain's holder parks it as for a pause.
    pub fn hold(&self) {
        let mut l = lock(&self.locked);
        l.holds += 1;
        self.hint.store(true, Ordering::Release);
    }

    /// `cancel_key` lets go (it holds the chain's baton, so no wait is registered for it).
    pub fn unhold(&self) {
        let mut l = lock(&self.locked);
        l.holds -= 1;
        self.hint.store(l.paused || l.holds > 0, Ordering::Release);
    }

    /// Pauses the key; `true` if it was not paused before.
    pub fn pause(&self) -> bool {
        let mut l = lock(&self.locked);
        if l.paused {
            return false;
        }
        l.paused = true;
        self.hint.store(true, Ordering::Release);
        true
    }

    /// By the holder of the chain's baton: if the key is paused, calls `register` (which
    /// registers a wait and returns its id, non-zero) under the lock and returns `true`: the baton
    /// now belongs to that wait. `false`: not paused, the caller keeps the baton.
    pub fn park(&self, register: impl FnOnce() -> u64) -> bool {
        let mut l = lock(&self.locked);
        if !l.paused && l.holds == 0 {
            return false;
        }
        debug_assert_eq!(l.wait, 0, "a paused key's chain is parked once");
        l.wait = register();
        debug_assert_ne!(l.wait, 0, "wait ids start at 1");
        true
    }

    /// Resumes the key (see [`Resumed`]).
    pub fn resume(&self) -> Resumed {
        let mut l = lock(&self.locked);
        if !l.paused {
            return Resumed::NotPaused;
        }
        l.paused = false;
        if l.holds > 0 {
            // A `cancel_key` still holds the key: the chain stays parked until it lets go.
            return Resumed::Unparked;
        }
        self.hint.store(false, Ordering::Release);
        match std::mem::take(&mut l.wait) {
            0 => Resumed::Unparked,
            id => Resumed::Parked(id),
        }
    }

    /// `shutdown_now` or a graceful termination took the parked chain's wait: forget its id, so
    /// that a later park may register a new one. The key stays paused.
    pub fn forget_wait(&self) {
        lock(&self.locked).wait = 0;
    }

    /// Runs `retire` under the lock unless the key is paused or held: `None` if it is (nothing
    /// run), else what `retire` returned. A `pause` then either comes first (and the caller does
    /// not retire) or after, and finds the chain retired (and goes to the key's new entry).
    pub fn retire_unless_paused(&self, retire: impl FnOnce() -> bool) -> Option<bool> {
        let l = lock(&self.locked);
        if l.paused || l.holds > 0 {
            return None;
        }
        Some(retire())
    }

    /// Whether the key's idle chain may be retired (it is neither paused nor held), read under
    /// the lock.
    pub fn may_retire(&self) -> bool {
        let l = lock(&self.locked);
        !l.paused && l.holds == 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn pause_park_resume() {
        let c = Control::new();
        assert!(!c.park(|| unreachable!("not paused")));
        assert!(c.may_retire());
        assert!(c.pause());
        assert!(!c.pause(), "already paused");
        assert!(c.is_paused() && !c.may_retire());
        assert!(c.park(|| 7));
        assert_eq!(c.resume(), Resumed::Parked(7));
        assert_eq!(c.resume(), Resumed::NotPaused);
        assert!(!c.is_paused());
        assert!(c.pause());
        assert_eq!(c.resume(), Resumed::Unparked);
        assert!(c.pause());
        assert!(c.park(|| 9));
        c.forget_wait();
        assert!(c.park(|| 10), "a stolen wait's key may park again");
        assert_eq!(c.resume(), Resumed::Parked(10));
        // A hold parks like a pause but is not one; a resume during it leaves the chain parked.
        c.hold();
        assert!(c.is_paused() && !c.is_paused_by_user() && !c.may_retire());
        assert!(c.park(|| 11));
        assert_eq!(c.wait_id(), Some(11));
        c.forget_wait();
        assert!(c.pause());
        assert_eq!(c.resume(), Resumed::Unparked);
        assert!(c.is_paused(), "still held");
        c.unhold();
        assert!(!c.is_paused() && c.may_retire() && c.wait_id().is_none());
    }
}
