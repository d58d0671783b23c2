//! Backpressure: a bound on queued (admitted, not yet started) tasks.
//!
//! # Protocol
//!
//! One word: `queued` in the low 40 bits and the number of blocked submitters (`waiters`) above.
//! Only RMWs touch it:
//!
//! - **reserve** (submit): CAS `queued + 1` while `queued < capacity`. Over capacity, a blocking
//!   submitter first *spins*: it retries the CAS between the steps of an exponential backoff
//!   that ends in a few `yield_now`s (crossbeam's `Backoff`), since a slot comes free each time
//!   a worker starts a task, usually within microseconds. Only then does it sleep: it locks the
//!   mutex, CASes `waiters + 1` *only if still full* (else retries reserve), and waits on the
//!   condvar; when woken it CASes `waiters - 1` under the lock and retries from the top.
//! - **release** (a task started, was dropped or handed back): `prev = fetch_sub(1)`; if `prev`
//!   shows waiters, lock the mutex and wake **one** of them: one slot came free, so one waiter
//!   can use it (rayon's rule for sleepers, here for submitters). Waking every waiter for each
//!   slot made them all take the mutex, one win and the rest sleep again: with `capacity(10)` and
//!   4 submitters, most of a run's time went to the kernel.
//!
//! A waiter registers (RMW) under the lock and waits atomically releasing it; a releaser's
//! `fetch_sub` either precedes the registration (then the registering CAS sees room and does not
//! wait, unless another submitter took that room first, in which case the slot was used) or
//! follows it (then it sees `waiters > 0` and notifies under the lock, after the waiter is
//! inside `wait`). So every slot freed while someone sleeps wakes a sleeper, and no wakeup is
//! lost:
//!
//! - Two slots freed while two submitters sleep wake both: the second release still counts the
//!   first waiter (it unregisters only after it wakes), so it notifies too, and a condvar's
//!   `notify_one` wakes a thread still blocked in `wait`, not the one already woken.
//! - A woken waiter may find its slot already taken by a submitter that never slept, and sleeps
//!   again: the slot went to a submitter all the same, so no freed slot is left unused while
//!   someone sleeps.
//! - Whichever way a wait ends (a wakeup, the timeout, both at once), the waiter tries for a slot
//!   before anything else, so a wakeup it absorbed still fills the slot. It gives up (`give_up`:
//!   shutdown) only after a failed try, having just seen the queue full: it leaves with no
//!   slot's wakeup. Shutdown wakes every sleeper ([`Capacity::wake_all`]) so that each sees
//!   `give_up`. A wait also ends after 100 ms without a wakeup, a safety net that no path
//!   relies on.
//!
//! Loom: `loom/tests/executor.rs` (`capacity_*`).

use std::time::Duration;

use crate::sync::{lock, snooze, AtomicU64, Condvar, Mutex, Ordering};

const QUEUED_MASK: u64 = (1 << 40) - 1;
const WAITER: u64 = 1 << 40;

pub struct Capacity {
    limit: u64,
    word: AtomicU64,
    mutex: Mutex<()>,
    cond: Condvar,
}

impl Capacity {
    pub fn new(limit: usize) -> Capacity {
        Capacity {
            limit: (limit as u64).min(QUEUED_MASK),
            word: AtomicU64::new(0),
            mutex: Mutex::new(()),
            cond: Condvar::new(),
        }
    }

    /// Takes one slot if there is room.
    pub fn try_reserve(&self) -> bool {
        let mut cur = self.word.load(Ordering::Relaxed);
        loop {
            if cur & QUEUED_MASK >= self.limit {
                return false;
            }
            match self
                .word
                .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Takes one slot even over the limit (a submit from inside a running task).
    pub fn force_reserve(&self) {
        self.word.fetch_add(1, Ordering::AcqRel);
    }

    /// Blocks until a slot is taken or `give_up()` returns `true` (checked after each failed try:
    /// every spin step, and after every wakeup). Returns whether a slot was taken.
    pub fn reserve(&self, give_up: impl Fn() -> bool) -> bool {
        loop {
            // Spin first (see "Protocol"): a slot is usually freed within microseconds.
            let backoff = crossbeam_utils::Backoff::new();
            let mut rounds = 0;
            loop {
                if self.try_reserve() {
                    return true;
                }
                if give_up() {
                    return false;
                }
                if spun_enough(&backoff, rounds) {
                    break;
                }
                snooze(&backoff);
                rounds += 1;
            }
            let guard = lock(&self.mutex);
            // Register as a waiter only while still full.
            let mut cur = self.word.load(Ordering::Acquire);
            let registered = loop {
                if cur & QUEUED_MASK < self.limit {
                    break false;
                }
                match self.word.compare_exchange_weak(
                    cur,
                    cur + WAITER,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break true,
                    Err(actual) => cur = actual,
                }
            };
            if !registered {
                continue;
            }
            if give_up() {
                self.word.fetch_sub(WAITER, Ordering::AcqRel);
                return false;
            }
            #[cfg(not(loom))]
            let guard = self
                .cond
                .wait_timeout(guard, Duration::from_millis(100))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
            #[cfg(loom)]
            let guard = {
                let _ = Duration::ZERO;
                self.cond.wait(guard).unwrap()
            };
            self.word.fetch_sub(WAITER, Ordering::AcqRel);
            drop(guard);
        }
    }

    /// Gives one slot back (the task started, or left without running).
    pub fn release(&self) {
        let prev = self.word.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(prev & QUEUED_MASK > 0);
        if prev >= WAITER {
            let _g = lock(&self.mutex);
            self.cond.notify_one();
        }
    }

    /// Wakes every blocked submitter (shutdown).
    pub fn wake_all(&self) {
        let _g = lock(&self.mutex);
        self.cond.notify_all();
    }
}

/// A slot a submission holds until it is admitted. Dropped without [`keep`](Self::keep) (the
/// submission was refused, or user code on its way, its key's `Hash`, `Eq` or `Clone`,
/// panicked) it gives the slot back, so no path leaks one.
#[must_use = "dropping a reservation gives its slot back at once"]
pub(crate) struct Reservation<'a>(Option<&'a Capacity>);

impl<'a> Reservation<'a> {
    /// No capacity limit: nothing to give back.
    pub(crate) fn unlimited() -> Self {
        Reservation(None)
    }

    /// A slot already taken from `cap`.
    pub(crate) fn taken(cap: &'a Capacity) -> Self {
        Reservation(Some(cap))
    }

    /// The submission was admitted: the slot now belongs to its task, which gives it back
    /// when it starts or leaves.
    pub(crate) fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(cap) = self.0 {
            cap.release();
        }
    }
}

/// Whether a blocked submitter has spun long enough to sleep: until crossbeam's backoff is
/// completed (its spins, then a few `yield_now`s), or, under loom, after one round, so that the
/// models reach the sleep without exploring every round of a spin that only retries
/// `try_reserve`.
fn spun_enough(backoff: &crossbeam_utils::Backoff, rounds: u32) -> bool {
    #[cfg(not(loom))]
    {
        let _ = rounds;
        backoff.is_completed()
    }
    #[cfg(loom)]
    {
        let _ = backoff;
        rounds >= 1
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn blocks_when_full_until_a_release() {
        let c = Arc::new(Capacity::new(1));
        assert!(c.try_reserve());
        assert!(!c.try_reserve());
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.reserve(|| false));
        std::thread::sleep(Duration::from_millis(20));
        c.release();
        assert!(t.join().unwrap());
        c.force_reserve();
        c.release();
        c.release();
        assert!(c.try_reserve());
    }

    #[test]
    fn each_release_lets_one_blocked_submitter_through() {
        let c = Arc::new(Capacity::new(1));
        assert!(c.try_reserve());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || c.reserve(|| false))
            })
            .collect();
        // Let them spin out and sleep; then free the slot, wait until one of them holds it, and
        // free it again (a task of the one that got through starting), three times.
        std::thread::sleep(Duration::from_millis(20));
        let queued = || c.word.load(Ordering::Acquire) & QUEUED_MASK;
        for _ in 0..3 {
            c.release();
            while queued() == 0 {
                std::thread::yield_now();
            }
        }
        for w in waiters {
            assert!(w.join().unwrap(), "every blocked submitter got a slot");
        }
        assert!(!c.try_reserve(), "the last one still holds the slot");
    }

    #[test]
    fn an_unkept_reservation_gives_its_slot_back_also_on_unwind() {
        let c = Capacity::new(1);
        assert!(c.try_reserve());
        drop(Reservation::taken(&c));
        assert!(c.try_reserve(), "a dropped reservation freed its slot");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _held = Reservation::taken(&c);
            crate::test_util::quiet_panic(1);
        }));
        assert!(r.is_err());
        assert!(c.try_reserve(), "unwinding freed it too");
        Reservation::taken(&c).keep();
        assert!(!c.try_reserve(), "a kept reservation holds its slot");
        Reservation::unlimited().keep();
    }

    #[test]
    fn gives_up_on_request() {
        let c = Capacity::new(1);
        assert!(c.try_reserve());
        assert!(!c.reserve(|| true));
    }
}
