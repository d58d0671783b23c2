//! Permits held (`Permit`) and a queued cancellable request (`WaiterToken`).

use super::*;

/// A handle on a queued [`Semaphore::acquire_with_cancellable`] request (crate-internal).
pub(crate) struct WaiterToken {
    pub(super) sem: Semaphore,
    pub(super) id: u64,
}

impl WaiterToken {
    /// Removes the request if it is still queued. `true`: its callback will never run (it was
    /// dropped here, outside the lock) and its assigned permits went to the next waiters.
    /// `false`: it was already granted or closed (the callback has run or is about to run), or
    /// cancelled before. See [`Semaphore::acquire_with_cancellable`].
    pub(crate) fn cancel(&self) -> bool {
        self.sem.cancel_waiter(self.id)
    }
}

/// Permits granted by a [`Semaphore`]; dropping it returns them (to the waiters first).
///
/// ```
/// use keyserial::Semaphore;
///
/// let sem = Semaphore::new(3);
/// let mut p = sem.try_acquire(3).unwrap();
/// let one = p.split(1).unwrap();
/// assert_eq!((p.count(), one.count()), (2, 1));
/// drop(one);
/// assert_eq!(sem.available(), 1);
/// drop(p);
/// assert_eq!(sem.available(), 3);
/// ```
pub struct Permit {
    sem: Semaphore,
    n: usize,
}

impl Permit {
    pub(super) fn new(sem: Semaphore, n: usize) -> Permit {
        Permit { sem, n }
    }

    /// How many permits this holds.
    ///
    /// ```
    /// use keyserial::Semaphore;
    ///
    /// let sem = Semaphore::new(2);
    /// assert_eq!(sem.try_acquire(2).unwrap().count(), 2);
    /// ```
    pub fn count(&self) -> usize {
        self.n
    }

    /// Moves `n` of these permits into a new `Permit` (of the same semaphore); `None` (and no
    /// change) if this holds fewer than `n`.
    ///
    /// ```
    /// use keyserial::Semaphore;
    ///
    /// let sem = Semaphore::new(2);
    /// let mut p = sem.try_acquire(2).unwrap();
    /// assert!(p.split(3).is_none());
    /// let q = p.split(2).unwrap();
    /// assert_eq!((p.count(), q.count()), (0, 2));
    /// ```
    pub fn split(&mut self, n: usize) -> Option<Permit> {
        if n > self.n {
            return None;
        }
        self.n -= n;
        Some(Permit::new(self.sem.clone(), n))
    }

    /// Drops the permits **without** returning them: they are gone for good, and the
    /// semaphore's capacity shrinks by as many (so the total of free, waiting-assigned and held
    /// permits always equals the capacity). Queued requests that the smaller capacity can never
    /// satisfy fail with [`AcquireError::TooMany`] (their assigned permits go on to the next
    /// waiters), and so do later ones: nothing waits forever. [`Semaphore::add_permits`] brings
    /// permits (and capacity) back.
    ///
    /// ```
    /// use keyserial::{AcquireError, Semaphore};
    ///
    /// let sem = Semaphore::new(3);
    /// sem.try_acquire(1).unwrap().forget();
    /// assert_eq!(sem.available(), 2);
    /// assert_eq!(sem.try_acquire(3).unwrap_err(), AcquireError::TooMany);
    /// sem.add_permits(1);
    /// assert_eq!(sem.try_acquire(3).unwrap().count(), 3);
    /// ```
    pub fn forget(mut self) {
        let n = std::mem::take(&mut self.n);
        if n > 0 {
            self.sem.shrink(n);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.n > 0 {
            self.sem.release(self.n);
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit").field("count", &self.n).finish()
    }
}
