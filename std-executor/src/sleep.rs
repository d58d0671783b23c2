//! Parking idle workers without lost wakeups and without waking a herd.
//!
//! # Protocol
//!
//! One word, changed only by read-modify-write operations:
//!
//! ```text
//!  bits 0..16   SEARCHING  workers awake and looking for work (not running a task)
//!  bits 16..32  SLEEPERS   workers registered as asleep (== the registry's length, under its lock)
//!  bits 32..64  EVENTS     bumped once per newly runnable chain or task
//! ```
//!
//! - **notify** (after a chain or task became runnable and was pushed to a queue):
//!   `prev = fetch_add(EVENT)`. If `prev` shows nobody searching and somebody asleep, wake one:
//!   under the registry lock pop a sleeper and move it from SLEEPERS to SEARCHING, then unpark it
//!   after unlocking. If somebody is searching, it will find the work (and, being the last
//!   searcher to find work, wake another if more is visible): one wakeup per ready chain, only if
//!   nobody is already looking.
//! - **sleep**: a worker takes `snapshot = load()` *before* its last search of every queue. If that
//!   search finds nothing it locks the registry and CASes `SLEEPERS + 1` (and `SEARCHING - 1` if it
//!   was counted as searching) *only if EVENTS still equals the snapshot's*, pushes itself and
//!   parks. If EVENTS moved, a runnable may have been pushed after its search started: it searches
//!   again instead.
//! - **searching**: a worker is counted in SEARCHING from when it starts or is woken until it finds
//!   work or sleeps. A worker whose own queues just ran dry after a task is *not* counted (that
//!   would cost two RMWs on this shared line per task); it still searches and sleeps by the rule
//!   above. SEARCHING only suppresses extra wakeups, so an uncounted searcher cannot cause a lost
//!   one: the no-lost-wakeup argument below rests on EVENTS and SLEEPERS alone.
//! - **wake-up**: the parked worker returns (unparked, timed out, or spuriously). Under the lock, if
//!   it is still registered it removes itself and moves SLEEPERS -> SEARCHING itself; otherwise a
//!   notifier already did that for it.
//!
//! **No lost wakeup**: the notifier's `fetch_add` and the sleeper's CAS are RMWs on one word, so
//! one precedes the other. If the notify comes first, the sleeper's CAS fails (EVENTS changed) and
//! it searches again, finding the pushed work (the push happened before the notify). If the
//! sleeper's CAS comes first, the notify sees `SLEEPERS > 0` and wakes someone (the registry and the
//! count agree under the lock). There is no store-then-load pattern, so loom can check it.
//! The unparker remembers an unpark that arrives before the park (crossbeam's `Parker`).
//!
//! **Lane pushes skip `notify`.** This argument covers work made runnable on the ready queues
//! (chains, unkeyed tasks), each followed by `notify`. A keyed submission pushed onto a lane does
//! not call `notify` unconditionally: it reads this word once and wakes a sleeper only when the
//! lane is `FREE` (or a deep sleeper waits), and a worker about to sleep looks at every lane
//! after registering. That pairing is a store-then-load one (`SeqCst` on both sides); its
//! argument, and its loom model, are in `lanes.rs` ("Waking for a push").
//! EVENTS wraps after 2^32 notifications; a stale snapshot would then have to match by chance while
//! a worker is between its snapshot and its CAS, which we accept.

use crossbeam_utils::CachePadded;

use crate::sync::{lock, AtomicU64, Mutex, Ordering, Unparker};

const SEARCHING: u64 = 1;
const SLEEPER: u64 = 1 << 16;
const EVENT: u64 = 1 << 32;
const FIELD: u64 = 0xFFFF;

/// What one load of the sleep word says about idle workers ([`Sleep::idle_now`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Idle {
    /// Some worker is registered asleep.
    pub asleep: bool,
    /// Some worker is searching (awake, looking for work).
    pub searching: bool,
}

/// A reading of the sleep word taken before a worker's last search ([`Sleep::snapshot`]), for
/// [`Sleep::try_sleep`], which refuses if anything became runnable since.
#[derive(Clone, Copy, Debug)]
pub struct Snapshot(u64);

fn searching(w: u64) -> u64 {
    w & FIELD
}
fn sleepers(w: u64) -> u64 {
    (w >> 16) & FIELD
}
fn events(w: u64) -> u64 {
    w >> 32
}

pub struct Sleep {
    word: CachePadded<AtomicU64>,
    registry: Mutex<Vec<usize>>,
    unparkers: Box<[Unparker]>,
}

impl Sleep {
    pub fn new(unparkers: Box<[Unparker]>) -> Sleep {
        Sleep {
            word: CachePadded::new(AtomicU64::new(0)),
            registry: Mutex::new(Vec::with_capacity(unparkers.len())),
            unparkers,
        }
    }

    /// A worker (new, or already counted elsewhere) starts searching.
    pub fn start_searching(&self) {
        self.word.fetch_add(SEARCHING, Ordering::AcqRel);
    }

    /// A searching worker found work (or exits). Returns `true` if it was the last searcher.
    pub fn stop_searching(&self) -> bool {
        let prev = self.word.fetch_sub(SEARCHING, Ordering::AcqRel);
        debug_assert!(searching(prev) > 0);
        searching(prev) == 1
    }

    /// Something became runnable. Returns `true` if no worker was searching or asleep (every
    /// worker is busy): the elastic pool's hint.
    pub fn notify(&self) -> bool {
        let prev = self.word.fetch_add(EVENT, Ordering::AcqRel);
        if searching(prev) != 0 {
            return false;
        }
        if sleepers(prev) == 0 {
            return true;
        }
        self.wake_one();
        false
    }

    /// Wakes one sleeper, if any. Returns `true` if one was woken.
    pub fn wake_one(&self) -> bool {
        let mut reg = lock(&self.registry);
        let Some(index) = reg.pop() else {
            return false;
        };
        self.word
            .fetch_add(SEARCHING.wrapping_sub(SLEEPER), Ordering::AcqRel);
        drop(reg);
        self.unparkers[index].unpark();
        true
    }

    /// Wakes every sleeper (shutdown). Bumps EVENTS first, so that a worker between its snapshot
    /// and its `try_sleep` searches again (and sees the shutdown) instead of registering after us.
    pub fn wake_all(&self) {
        self.word.fetch_add(EVENT, Ordering::AcqRel);
        while self.wake_one() {}
    }

    /// Work is visible (`visible()`, asked only by a worker that just stopped searching or is
    /// leaving the pool, after its RMW on the word): wakes a sleeper for it. Returns `true` if
    /// the work is visible, no sleeper could be woken and no worker is idle, so the caller must
    /// start the elastic clock (`Shared::starving`). Checked by `loom/tests/starvation.rs`.
    pub fn unattended(&self, visible: impl FnOnce() -> bool) -> bool {
        visible() && !self.wake_one() && !self.has_idle_worker()
    }

    /// An RMW on the word that changes nothing: whatever the caller did before it happens-before
    /// every later [`notify`](Self::notify), and every earlier notify (with the push before it)
    /// happens-before what the caller does after it, since all of them are RMWs on one word.
    pub fn fence(&self) {
        self.word.fetch_add(0, Ordering::AcqRel);
    }

    /// Take before the last search that precedes [`try_sleep`](Self::try_sleep).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot(self.word.load(Ordering::Acquire))
    }

    /// One load: whether some worker is registered asleep, and whether some is searching.
    #[inline]
    pub fn idle_now(&self) -> Idle {
        let w = self.word.load(Ordering::SeqCst);
        Idle {
            asleep: sleepers(w) > 0,
            searching: searching(w) > 0,
        }
    }

    /// `true` if some worker is registered as asleep.
    pub fn has_sleepers(&self) -> bool {
        sleepers(self.word.load(Ordering::Acquire)) > 0
    }

    /// `true` if some worker is searching or asleep (capacity is available).
    pub fn has_idle_worker(&self) -> bool {
        let w = self.word.load(Ordering::Acquire);
        searching(w) + sleepers(w) > 0
    }

    /// Registers worker `index` as asleep unless something became runnable since `snapshot`
    /// (`searching_now`: the worker is counted in SEARCHING, and stops being so). On `true` the
    /// caller must park and then call [`woke`](Self::woke); on `false` nothing changed and it must
    /// search again.
    #[must_use = "on `true` the caller must park, then call `woke`"]
    pub fn try_sleep(&self, index: usize, snapshot: Snapshot, searching_now: bool) -> bool {
        let Snapshot(snapshot) = snapshot;
        let mut reg = lock(&self.registry);
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if events(cur) != events(snapshot) {
                return false;
            }
            debug_assert!(!searching_now || searching(cur) > 0);
            let new = cur + SLEEPER - if searching_now { SEARCHING } else { 0 };
            match self
                .word
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        reg.push(index);
        true
    }

    /// After parking: the worker is searching again (a notifier may already have counted it).
    pub fn woke(&self, index: usize) {
        let mut reg = lock(&self.registry);
        if let Some(pos) = reg.iter().position(|&i| i == index) {
            reg.swap_remove(pos);
            self.word
                .fetch_add(SEARCHING.wrapping_sub(SLEEPER), Ordering::AcqRel);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crossbeam_utils::sync::Parker;

    #[test]
    fn notify_wakes_a_sleeper_only_when_nobody_searches() {
        let parkers: Vec<Parker> = (0..2).map(|_| Parker::new()).collect();
        let s = Sleep::new(parkers.iter().map(|p| p.unparker().clone()).collect());
        s.start_searching();
        s.start_searching();
        let snap = s.snapshot();
        assert!(s.try_sleep(0, snap, true));
        // worker 1 still searching: no wakeup
        assert!(!s.notify());
        assert_eq!(sleepers(s.snapshot().0), 1);
        // worker 1's snapshot is stale now: it must search again
        assert!(!s.try_sleep(1, snap, true));
        let snap = s.snapshot();
        assert!(s.try_sleep(1, snap, true));
        // nobody searching, two asleep: one is woken and counted as searching
        assert!(!s.notify());
        let w = s.snapshot().0;
        assert_eq!((searching(w), sleepers(w)), (1, 1));
        s.woke(1); // 1 was popped by the notifier (LIFO): nothing changes
        s.woke(0); // 0 timed out: it moves itself to searching
        let w = s.snapshot().0;
        assert_eq!((searching(w), sleepers(w)), (2, 0));
        assert!(!s.stop_searching());
        assert!(s.stop_searching());
        assert!(s.notify(), "all busy");
    }
}
