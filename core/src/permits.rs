//! The permit counter behind keyserial's fair semaphore: one atomic word that makes the
//! uncontended acquire and release lock-free, while leaving fairness to a waiter queue that the
//! caller keeps under its own lock.
//!
//! **A building block** for a semaphore implementation (keyserial's `Semaphore`, or yours); it
//! is not a semaphore by itself: it has no waiter queue and never blocks. Everything here is safe.
//!
//! # The word
//!
//! ```text
//!   bit 0        CLOSED   terminal: no permit is ever handed out again
//!   bit 1        WAITERS  the caller's waiter queue is non-empty
//!   bits 2..     count    free permits (at most PermitCounter::MAX_PERMITS)
//! ```
//!
//! Every change is a read-modify-write (a compare-and-swap loop) on this one word, so the
//! operations below are totally ordered by the word's modification order; no operation reads the
//! word and then writes it with a plain store.
//!
//! # Who may do what
//!
//! The counter serves a *queue owner*: whoever holds the lock around the caller's FIFO queue of
//! waiters (in keyserial, the std `Semaphore`'s mutex). Two kinds of operations exist:
//!
//! | operation | who | effect on the word |
//! |---|---|---|
//! | [`try_acquire`](PermitCounter::try_acquire)`(n)` | anyone, lock-free | `count -= n` if `!CLOSED && !WAITERS && count >= n`, else nothing |
//! | [`try_release`](PermitCounter::try_release)`(n)` | anyone, lock-free | `count += n` if `!WAITERS`, else nothing (the caller must go to the queue) |
//! | [`close`](PermitCounter::close)`()` | anyone (keyserial: the queue owner) | sets `CLOSED` |
//! | [`acquire_slow`](PermitCounter::acquire_slow)`(n)` | queue owner only | takes all of `n`, or takes what is free, sets `WAITERS` and leaves `count == 0` |
//! | [`end_waiting`](PermitCounter::end_waiting)`(r)` | queue owner only | clears `WAITERS`, `count += r` |
//!
//! "Queue owner only" is a contract, not a safety requirement: breaking it cannot cause undefined
//! behaviour, only wrong counts.
//!
//! # States and invariants
//!
//! The queue owner keeps, at every moment it releases its lock:
//!
//! 1. `WAITERS` is set **iff** its waiter queue is non-empty (only the queue owner changes `WAITERS`,
//!    and it changes it together with the queue);
//! 2. while `WAITERS` is set, `count == 0`: every permit that becomes free goes to the waiter at the
//!    head of the queue (partly, if it needs more), never to the free count.
//!
//! So the word moves between three shapes, plus `CLOSED` on any of them:
//!
//! ```text
//!   free  (count = c, no WAITERS) ──acquire_slow, c < n──► waiting (count = 0, WAITERS)
//!   waiting ──end_waiting(r), queue emptied──► free (count = r)
//!   free ──try_acquire / try_release──► free
//! ```
//!
//! # Why no permit is lost or doubled
//!
//! - **No barging.** While a waiter exists `WAITERS` is set, so every lock-free `try_acquire`
//!   fails, whatever it asks for; the free count is 0 anyway (invariant 2).
//! - **A lock-free release never strands permits behind a waiter.** `try_release` adds only when
//!   `WAITERS` is clear, in one CAS. A waiter that is being queued sets `WAITERS` with a CAS on the
//!   same word: if the release's CAS came first, the queue owner's CAS sees the larger count (and
//!   may even satisfy the request at once); if the owner's CAS came first, the release sees
//!   `WAITERS`, adds nothing, and hands its permits to the queue under the lock instead. There is
//!   no window between "checked for waiters" and "added": it is one atomic step.
//! - **Slow paths move permits exactly once.** `acquire_slow` takes `min(count, n)` and subtracts
//!   exactly that in the same CAS; `end_waiting(r)` adds exactly the `r` permits the owner still had
//!   in hand (partly assigned ones of a cancelled waiter, the remainder of a release) in the same
//!   CAS that clears `WAITERS`. Permits assigned to a waiter are out of the word and owned by the
//!   queue entry until it is granted (they become the waiter's) or removed (they are released
//!   again, to the next waiter or to the word).
//! - **`CLOSED` is sticky** and checked by every acquiring CAS, so after the CAS that set it no
//!   permit is handed out by this word. Releases still add (a closed semaphore's `available()`
//!   stays meaningful).
//!
//! The counter never blocks and never spins except to retry a CAS that lost a race (lock-free).

use core::fmt;

use crate::sync::{AtomicUsize, Ordering};

const CLOSED: usize = 0b01;
const WAITERS: usize = 0b10;
const SHIFT: u32 = 2;
const ONE: usize = 1 << SHIFT;

/// An atomic count of free permits with a `CLOSED` bit and a "waiters exist" bit: the
/// lock-free fast path of a fair semaphore (see the [module docs](self) for the protocol).
///
/// ```
/// use keyserial_core::permits::{PermitCounter, TryAcquireError};
///
/// let c = PermitCounter::new(3);
/// assert_eq!(c.try_acquire(2), Ok(()));
/// assert_eq!(c.try_acquire(2), Err(TryAcquireError::NoPermits));
/// assert!(c.try_release(2));
/// assert_eq!(c.available(), 3);
/// ```
pub struct PermitCounter {
    word: AtomicUsize,
}

/// Why [`PermitCounter::try_acquire`] handed out nothing.
///
/// ```
/// use keyserial_core::permits::{PermitCounter, TryAcquireError};
///
/// let c = PermitCounter::new(0);
/// assert_eq!(c.try_acquire(1), Err(TryAcquireError::NoPermits));
/// c.close();
/// assert_eq!(c.try_acquire(1), Err(TryAcquireError::Closed));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryAcquireError {
    /// Too few free permits, or waiters are queued (who go first).
    NoPermits,
    /// The counter is closed.
    Closed,
}

impl fmt::Display for TryAcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TryAcquireError::NoPermits => "no permits available",
            TryAcquireError::Closed => "the permit counter is closed",
        })
    }
}

/// What [`PermitCounter::acquire_slow`] did (called by the queue owner, under its lock).
///
/// ```
/// use keyserial_core::permits::{PermitCounter, SlowAcquire};
///
/// let c = PermitCounter::new(2);
/// assert_eq!(c.acquire_slow(1), SlowAcquire::Acquired);
/// // One permit is free; a request of 3 takes it and must wait for 2 more.
/// assert_eq!(c.acquire_slow(3), SlowAcquire::Queued { assigned: 1 });
/// assert!(c.has_waiters());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlowAcquire {
    /// All `n` permits were taken; nothing is queued and `WAITERS` is unchanged.
    Acquired,
    /// Not enough were free (or waiters were already queued): `assigned` permits (possibly 0)
    /// were taken for this request, `WAITERS` is now set and the free count is 0. The caller must
    /// put the request at the back of its queue, owning those `assigned` permits.
    Queued {
        /// The permits taken from the free count for this request (fewer than it asked for).
        assigned: usize,
    },
    /// The counter is closed; nothing was taken.
    Closed,
}

impl PermitCounter {
    /// The largest count the word can hold: `usize::MAX >> 2` (two bits hold the flags).
    ///
    /// ```
    /// use keyserial_core::permits::PermitCounter;
    ///
    /// assert_eq!(PermitCounter::MAX_PERMITS, usize::MAX >> 2);
    /// ```
    pub const MAX_PERMITS: usize = usize::MAX >> SHIFT;

    /// A counter with `permits` free permits, open, with no waiters.
    ///
    /// # Panics
    /// If `permits` exceeds [`MAX_PERMITS`](Self::MAX_PERMITS).
    ///
    /// ```
    /// use keyserial_core::permits::PermitCounter;
    ///
    /// let c = PermitCounter::new(5);
    /// assert_eq!(c.available(), 5);
    /// assert!(!c.is_closed() && !c.has_waiters());
    /// ```
    pub fn new(permits: usize) -> PermitCounter {
        assert!(
            permits <= Self::MAX_PERMITS,
            "a permit counter holds at most MAX_PERMITS permits"
        );
        PermitCounter {
            word: AtomicUsize::new(permits << SHIFT),
        }
    }

    /// The free permits right now (0 while waiters are queued: free permits go to them).
    ///
    /// ```
    /// use keyserial_core::permits::PermitCounter;
    ///
    /// let c = PermitCounter::new(4);
    /// c.try_acquire(3).unwrap();
    /// assert_eq!(c.available(), 1);
    /// ```
    pub fn available(&self) -> usize {
        self.word.load(Ordering::Acquire) >> SHIFT
    }

    /// Whether [`close`](Self::close) was called.
    ///
    /// ```
    /// use keyserial_core::permits::PermitCounter;
    ///
    /// let c = PermitCounter::new(1);
    /// assert!(!c.is_closed());
    /// c.close();
    /// assert!(c.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.word.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Whether the `WAITERS` bit is set (the queue owner's queue is non-empty).
    ///
    /// ```
    /// use keyserial_core::permits::PermitCounter;
    ///
    /// let c = PermitCounter::new(0);
    /// assert!(!c.has_waiters());
    /// c.acquire_slow(1); // queued, as the queue owner
    /// assert!(c.has_waiters());
    /// ```
    pub fn has_waiters(&self) -> bool {
        self.word.load(Ordering::Acquire) & WAITERS != 0
    }

    /// Takes `n` permits at once or none, without blocking (a CAS loop that retries only when
    /// another thread changed the word). Fails with `NoPermits` while waiters are queued, even if
    /// enough permits would be free (no barging), and with `Closed` once closed. `n == 0` succeeds
    /// unless closed.
    ///
    /// Success has `Acquire` ordering: it synchronizes with the release that returned the
    /// permits.
    ///
    /// ```
    /// use keyserial_core::permits::{PermitCounter, TryAcquireError};
    ///
    /// let c = PermitCounter::new(2);
    /// assert_eq!(c.try_acquire(3), Err(TryAcquireError::NoPermits)); // all or nothing
    /// assert_eq!(c.available(), 2);
    /// assert_eq!(c.try_acquire(2), Ok(()));
    /// assert_eq!(c.try_acquire(0), Ok(()));
    /// ```
    pub fn try_acquire(&self, n: usize) -> Result<(), TryAcquireError> {
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if cur & CLOSED != 0 {
                return Err(TryAcquireError::Closed);
            }
            if n == 0 {
                return Ok(());
            }
            if cur & WAITERS != 0 || n > cur >> SHIFT {
                return Err(TryAcquireError::NoPermits);
            }
            let next = cur - (n << SHIFT);
            match self
                .word
                .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// The lock-free release: adds `n` permits to the free count and returns `true`, **unless**
    /// waiters are queued, in which case it changes nothing and returns `false`: the caller must
    /// then take the queue lock and hand the `n` permits to the head waiter(s) (finishing with
    /// [`end_waiting`](Self::end_waiting) if the queue empties). `n == 0` always returns `true`.
    ///
    /// Works the same on a closed counter (permits returned after `close` are counted).
    ///
    /// # Panics
    /// If the count would exceed [`MAX_PERMITS`](Self::MAX_PERMITS) (more permits released than
    /// ever existed).
    ///
    /// ```
    /// use keyserial_core::permits::{PermitCounter, SlowAcquire};
    ///
    /// let c = PermitCounter::new(0);
    /// assert!(c.try_release(1));
    /// assert_eq!(c.acquire_slow(2), SlowAcquire::Queued { assigned: 1 });
    /// // A waiter is queued: the release must go through the queue.
    /// assert!(!c.try_release(1));
    /// assert_eq!(c.available(), 0);
    /// ```
    #[must_use = "on `false` the permits were not added and must be handed to the waiters"]
    pub fn try_release(&self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if cur & WAITERS != 0 {
                return false;
            }
            let next = add_count(cur, n);
            match self
                .word
                .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Sets `CLOSED`; returns `true` if this call closed the counter, `false` if it already was.
    /// From then on every acquire fails with `Closed`. The queue owner should close under its
    /// lock and then empty its queue (returning partly assigned permits with
    /// [`end_waiting`](Self::end_waiting)).
    ///
    /// ```
    /// use keyserial_core::permits::PermitCounter;
    ///
    /// let c = PermitCounter::new(1);
    /// assert!(c.close());
    /// assert!(!c.close());
    /// assert_eq!(c.available(), 1); // permits stay counted
    /// ```
    pub fn close(&self) -> bool {
        self.word.fetch_or(CLOSED, Ordering::AcqRel) & CLOSED == 0
    }

    /// **Queue owner only**, under its lock, after `try_acquire` failed: takes all `n` permits if
    /// they are free and nobody waits ([`SlowAcquire::Acquired`]); otherwise takes what is free
    /// (up to `n`), sets `WAITERS`, and tells the caller to queue the request owning those
    /// permits ([`SlowAcquire::Queued`]). On a closed counter takes nothing
    /// ([`SlowAcquire::Closed`]).
    ///
    /// ```
    /// use keyserial_core::permits::{PermitCounter, SlowAcquire};
    ///
    /// let c = PermitCounter::new(1);
    /// assert_eq!(c.acquire_slow(3), SlowAcquire::Queued { assigned: 1 });
    /// assert_eq!(c.available(), 0);
    /// // A second request queues behind the first, with nothing assigned.
    /// assert_eq!(c.acquire_slow(1), SlowAcquire::Queued { assigned: 0 });
    /// c.close();
    /// assert_eq!(c.acquire_slow(1), SlowAcquire::Closed);
    /// ```
    pub fn acquire_slow(&self, n: usize) -> SlowAcquire {
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            if cur & CLOSED != 0 {
                return SlowAcquire::Closed;
            }
            if n == 0 {
                return SlowAcquire::Acquired;
            }
            let free = cur >> SHIFT;
            let (next, result) = if cur & WAITERS == 0 && free >= n {
                (cur - (n << SHIFT), SlowAcquire::Acquired)
            } else {
                let assigned = free.min(n);
                (
                    (cur - (assigned << SHIFT)) | WAITERS,
                    SlowAcquire::Queued { assigned },
                )
            };
            match self
                .word
                .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return result,
                Err(actual) => cur = actual,
            }
        }
    }

    /// **Queue owner only**, under its lock, when its waiter queue has just become empty (the
    /// last waiter was granted, cancelled or closed): clears `WAITERS` and adds the `remaining`
    /// permits it still had in hand to the free count, in one step. Also correct when `WAITERS`
    /// was already clear (then it only adds).
    ///
    /// # Panics
    /// If the count would exceed [`MAX_PERMITS`](Self::MAX_PERMITS).
    ///
    /// ```
    /// use keyserial_core::permits::{PermitCounter, SlowAcquire};
    ///
    /// let c = PermitCounter::new(1);
    /// assert_eq!(c.acquire_slow(2), SlowAcquire::Queued { assigned: 1 });
    /// // The waiter gives up: its one assigned permit goes back, and nobody waits any more.
    /// c.end_waiting(1);
    /// assert!(!c.has_waiters());
    /// assert_eq!(c.available(), 1);
    /// ```
    pub fn end_waiting(&self, remaining: usize) {
        let mut cur = self.word.load(Ordering::Acquire);
        loop {
            let next = add_count(cur & !WAITERS, remaining);
            match self
                .word
                .compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }
}

/// `word` with `n` more permits, keeping its flags.
fn add_count(word: usize, n: usize) -> usize {
    let count = (word >> SHIFT)
        .checked_add(n)
        .filter(|&c| c <= PermitCounter::MAX_PERMITS)
        .expect("permit count overflow: more permits released than exist");
    (count << SHIFT) | (word & (ONE - 1))
}

impl fmt::Debug for PermitCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self.word.load(Ordering::Acquire);
        f.debug_struct("PermitCounter")
            .field("available", &(w >> SHIFT))
            .field("waiters", &(w & WAITERS != 0))
            .field("closed", &(w & CLOSED != 0))
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;
    use std::vec::Vec;

    #[test]
    fn all_or_nothing() {
        let c = PermitCounter::new(3);
        assert_eq!(c.try_acquire(4), Err(TryAcquireError::NoPermits));
        assert_eq!(c.available(), 3);
        assert_eq!(c.try_acquire(3), Ok(()));
        assert_eq!(c.available(), 0);
        assert_eq!(c.try_acquire(1), Err(TryAcquireError::NoPermits));
        assert_eq!(c.try_acquire(0), Ok(()));
        assert!(c.try_release(3));
        assert_eq!(c.available(), 3);
    }

    #[test]
    fn waiters_block_the_fast_paths() {
        let c = PermitCounter::new(2);
        assert_eq!(c.acquire_slow(5), SlowAcquire::Queued { assigned: 2 });
        assert!(c.has_waiters());
        assert_eq!(c.available(), 0);
        // Nobody barges, even for permits that "exist".
        assert_eq!(c.try_acquire(1), Err(TryAcquireError::NoPermits));
        // A later request queues behind it with nothing assigned.
        assert_eq!(c.acquire_slow(1), SlowAcquire::Queued { assigned: 0 });
        // Releases must go through the queue.
        assert!(!c.try_release(4));
        assert_eq!(c.available(), 0);
        // A zero release is trivially done.
        assert!(c.try_release(0));
        // The queue owner hands the 4 released permits on: 3 complete the head (5), the last one
        // grants the second waiter (1); the queue is empty and nothing is left over.
        c.end_waiting(0);
        assert!(!c.has_waiters());
        assert_eq!(c.available(), 0);
        assert!(c.try_release(2));
        assert_eq!(c.try_acquire(2), Ok(()));
    }

    #[test]
    fn acquire_slow_takes_everything_when_it_fits() {
        let c = PermitCounter::new(4);
        assert_eq!(c.acquire_slow(4), SlowAcquire::Acquired);
        assert!(!c.has_waiters());
        assert_eq!(c.acquire_slow(0), SlowAcquire::Acquired);
        assert!(!c.has_waiters());
    }

    #[test]
    fn end_waiting_keeps_closed_and_adds() {
        let c = PermitCounter::new(1);
        assert_eq!(c.acquire_slow(3), SlowAcquire::Queued { assigned: 1 });
        assert!(c.close());
        c.end_waiting(1);
        assert!(c.is_closed());
        assert!(!c.has_waiters());
        assert_eq!(c.available(), 1);
        assert_eq!(c.try_acquire(1), Err(TryAcquireError::Closed));
        assert_eq!(c.try_acquire(0), Err(TryAcquireError::Closed));
        assert_eq!(c.acquire_slow(1), SlowAcquire::Closed);
        // Releases after close still count.
        assert!(c.try_release(2));
        assert_eq!(c.available(), 3);
    }

    #[test]
    #[should_panic(expected = "overflow")]
    fn overflow_panics() {
        let c = PermitCounter::new(PermitCounter::MAX_PERMITS);
        let _ = c.try_release(1);
    }

    #[test]
    #[should_panic(expected = "MAX_PERMITS")]
    fn too_many_at_creation_panics() {
        let _ = PermitCounter::new(PermitCounter::MAX_PERMITS + 1);
    }

    #[test]
    fn max_permits_round_trip() {
        let c = PermitCounter::new(PermitCounter::MAX_PERMITS);
        assert_eq!(c.available(), PermitCounter::MAX_PERMITS);
        assert_eq!(c.try_acquire(PermitCounter::MAX_PERMITS), Ok(()));
        assert!(c.try_release(PermitCounter::MAX_PERMITS));
        assert!(c.close());
        assert_eq!(c.available(), PermitCounter::MAX_PERMITS);
    }

    #[test]
    fn debug_and_display() {
        let c = PermitCounter::new(2);
        let s = std::format!("{c:?}");
        assert!(s.contains("available: 2"), "{s}");
        assert_eq!(
            std::format!("{}", TryAcquireError::NoPermits),
            "no permits available"
        );
    }

    /// Threads race lock-free acquires and releases: the count never goes wrong.
    #[test]
    fn concurrent_fast_paths_conserve_permits() {
        const PERMITS: usize = 3;
        let threads = if cfg!(miri) { 3 } else { 4 };
        let rounds = if cfg!(miri) { 50 } else { 5_000 };
        let c = Arc::new(PermitCounter::new(PERMITS));
        let held = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (c, held) = (c.clone(), held.clone());
                thread::spawn(move || {
                    let mut got = 0usize;
                    for i in 0..rounds {
                        let n = 1 + (i + t) % PERMITS;
                        if c.try_acquire(n).is_ok() {
                            let now = held.fetch_add(n, Ordering::AcqRel) + n;
                            assert!(now <= PERMITS, "{now} permits held at once");
                            held.fetch_sub(n, Ordering::AcqRel);
                            assert!(c.try_release(n));
                            got += 1;
                        }
                    }
                    got
                })
            })
            .collect();
        let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(total > 0);
        assert_eq!(c.available(), PERMITS);
    }

    /// A queue owner (behind a std mutex, as in the std semaphore) racing lock-free releasers:
    /// every released permit ends up either assigned to the waiter or free, never both or neither.
    #[test]
    fn slow_path_races_fast_release() {
        let rounds = if cfg!(miri) { 20 } else { 2_000 };
        for _ in 0..rounds {
            let c = Arc::new(PermitCounter::new(0));
            let owner = Arc::new(std::sync::Mutex::new(0usize)); // permits the queue holds
            let releaser = {
                let (c, owner) = (c.clone(), owner.clone());
                thread::spawn(move || {
                    for _ in 0..2 {
                        if !c.try_release(1) {
                            // Slow path: hand the permit to the queued waiter (needs 2).
                            let mut assigned = owner.lock().unwrap();
                            if c.has_waiters() {
                                *assigned += 1;
                                if *assigned == 2 {
                                    c.end_waiting(0); // granted: the queue is empty
                                }
                            } else {
                                c.end_waiting(1);
                            }
                        }
                    }
                })
            };
            {
                let mut assigned = owner.lock().unwrap();
                match c.acquire_slow(2) {
                    SlowAcquire::Acquired => *assigned = 2,
                    SlowAcquire::Queued { assigned: a } => *assigned += a,
                    SlowAcquire::Closed => unreachable!(),
                }
            }
            releaser.join().unwrap();
            let assigned = owner.lock().unwrap();
            // Both permits reached the waiter exactly once, none stayed free or got lost.
            assert_eq!(*assigned, 2, "a permit was lost or doubled");
            assert_eq!(c.available(), 0);
            assert!(!c.has_waiters());
        }
    }
}
