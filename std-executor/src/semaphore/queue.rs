//! The waiter queue: the slow paths of an acquire, cancelling, releasing, shrinking, and
//! assigning permits to the head waiters first (see the module docs' "Protocol").

use super::*;

/// Outcome of the slow path.
pub(super) enum Slow<'a> {
    Done(Result<Permit, AcquireError>),
    /// Must wait: the lock is held, `usize` permits are already assigned.
    Wait(MutexGuard<'a, Queue>, usize),
}

impl Semaphore {
    /// `forget`: `n` held permits leave circulation and the capacity shrinks by `n`; queued
    /// requests above the new capacity fail with `TooMany`, their assigned permits handed on.
    pub(super) fn shrink(&self, n: usize) {
        let mut out = Vec::new();
        {
            let mut q = lock(&self.inner.queue);
            let cap = self.inner.capacity.fetch_sub(n, Ordering::AcqRel) - n;
            let doomed: Vec<u64> = q
                .waiters
                .iter()
                .filter(|(_, w)| w.n > cap)
                .map(|(&id, _)| id)
                .collect();
            let mut returned = 0;
            for id in doomed {
                let w = q.waiters.remove(&id).expect("listed above");
                returned += w.assigned;
                resolve(self, w, Err(AcquireError::TooMany), &mut out);
            }
            // Also clears `WAITERS` if the queue emptied.
            self.assign_locked(returned, &mut q, &mut out);
        }
        run_deferred(out);
    }

    /// Pre-checks and the lock-free attempt. `None`: must take the slow path.
    pub(super) fn fast_path(&self, n: usize) -> Option<Result<Permit, AcquireError>> {
        if self.inner.counter.is_closed() {
            return Some(Err(AcquireError::Closed));
        }
        if n > self.capacity() {
            return Some(Err(AcquireError::TooMany));
        }
        match self.inner.counter.try_acquire(n) {
            Ok(()) => Some(Ok(Permit::new(self.clone(), n))),
            Err(TryAcquireError::Closed) => Some(Err(AcquireError::Closed)),
            Err(TryAcquireError::NoPermits) => None,
        }
    }

    /// Under the lock: take the permits after all, or prepare to queue.
    pub(super) fn slow_path(&self, n: usize) -> Slow<'_> {
        let q = lock(&self.inner.queue);
        // Checked again under the lock: `forget` lowers the capacity under it, so no request
        // above the capacity can join the queue (where it would wait forever).
        if n > self.capacity() {
            drop(q);
            return Slow::Done(Err(AcquireError::TooMany));
        }
        match self.inner.counter.acquire_slow(n) {
            SlowAcquire::Acquired => {
                drop(q);
                Slow::Done(Ok(Permit::new(self.clone(), n)))
            }
            SlowAcquire::Closed => {
                drop(q);
                Slow::Done(Err(AcquireError::Closed))
            }
            SlowAcquire::Queued { assigned } => Slow::Wait(q, assigned),
        }
    }

    pub(super) fn acquire_blocking(
        &self,
        n: usize,
        deadline: Option<Instant>,
    ) -> Result<Permit, AcquireError> {
        if let Some(r) = self.fast_path(n) {
            return r;
        }
        let parker = Parker::new();
        let status = Arc::new(AtomicU8::new(WAITING));
        let wake = Wakeup::Thread(parker.unparker().clone());
        let id = match self.slow_path(n) {
            Slow::Done(r) => return r,
            Slow::Wait(mut q, assigned) => push_waiter(
                &mut q,
                n,
                assigned,
                Notify::Signal {
                    status: status.clone(),
                    wake,
                },
            ),
        };
        let mut parked = false;
        loop {
            if let Some(r) = self.outcome(&status, n) {
                return r;
            }
            match deadline {
                None => parker.park(),
                Some(deadline) => {
                    let now = Instant::now();
                    // Under loom, `park_timeout` returns at once: the first one models expiry.
                    if now >= deadline || (cfg!(loom) && parked) {
                        if self.cancel_waiter(id) {
                            return Err(AcquireError::Timeout);
                        }
                        // Resolved before we could leave: the status is set.
                        return self
                            .outcome(&status, n)
                            .expect("a waiter no longer queued was granted or closed");
                    }
                    parker.park_timeout(deadline - now);
                    parked = true;
                }
            }
        }
    }

    /// The outcome recorded for a removed waiter, or `None` while it is queued.
    pub(super) fn outcome(
        &self,
        status: &AtomicU8,
        n: usize,
    ) -> Option<Result<Permit, AcquireError>> {
        match status.load(Ordering::Acquire) {
            GRANTED => Some(Ok(Permit::new(self.clone(), n))),
            CLOSED => Some(Err(AcquireError::Closed)),
            TOO_MANY => Some(Err(AcquireError::TooMany)),
            _ => None,
        }
    }

    /// Removes waiter `id` if it is still queued, handing its assigned permits on. Returns
    /// whether it was removed (false: it was granted or closed, or removed before).
    pub(super) fn cancel_waiter(&self, id: u64) -> bool {
        let mut out = Vec::new();
        let removed = {
            let mut q = lock(&self.inner.queue);
            match q.waiters.remove(&id) {
                Some(w) => {
                    self.assign_locked(w.assigned, &mut q, &mut out);
                    match w.notify {
                        Notify::Callback(f) => out.push(Deferred::Drop(f)),
                        Notify::Signal {
                            wake: Wakeup::Task(waker),
                            ..
                        } => out.push(Deferred::DropWaker(waker)),
                        Notify::Signal { .. } => (),
                    }
                    true
                }
                None => false,
            }
        };
        run_deferred(out);
        removed
    }

    /// Returns `n` permits: lock-free if nobody waits, else to the waiters under the lock.
    pub(super) fn release(&self, n: usize) {
        if self.inner.counter.try_release(n) {
            return;
        }
        let mut out = Vec::new();
        {
            let mut q = lock(&self.inner.queue);
            self.assign_locked(n, &mut q, &mut out);
        }
        run_deferred(out);
    }

    /// Under the lock: assigns `rem` permits to the waiters in order, granting each whose
    /// assignment completes; if the queue empties, the rest become free and `WAITERS` is cleared.
    pub(super) fn assign_locked(&self, mut rem: usize, q: &mut Queue, out: &mut Vec<Deferred>) {
        while let Some(mut head) = q.waiters.first_entry() {
            let w = head.get_mut();
            let give = rem.min(w.n - w.assigned);
            w.assigned += give;
            rem -= give;
            if w.assigned < w.n {
                break;
            }
            resolve(self, head.remove(), Ok(()), out);
        }
        if q.waiters.is_empty() {
            self.inner.counter.end_waiting(rem);
        } else {
            debug_assert_eq!(rem, 0, "permits left over while a waiter still needs some");
        }
    }
}

/// Appends a waiter (the lock is held and `WAITERS` was set by `acquire_slow`).
pub(super) fn push_waiter(q: &mut Queue, n: usize, assigned: usize, notify: Notify) -> u64 {
    let id = q.next_id;
    q.next_id += 1;
    q.waiters.insert(
        id,
        Waiter {
            n,
            assigned,
            notify,
        },
    );
    id
}

/// Waiter `w` has left the queue, granted (`Ok`: with all its permits) or failed (its assigned
/// permits were taken back by the caller): record the outcome and defer the wake or the call.
/// The lock is held.
pub(super) fn resolve(
    sem: &Semaphore,
    w: Waiter,
    outcome: Result<(), AcquireError>,
    out: &mut Vec<Deferred>,
) {
    match w.notify {
        Notify::Signal { status, wake } => {
            // The waiting party builds its `Permit` from the status it reads.
            let s = match outcome {
                Ok(()) => GRANTED,
                Err(AcquireError::TooMany) => TOO_MANY,
                Err(_) => CLOSED,
            };
            status.swap(s, Ordering::AcqRel);
            out.push(Deferred::Wake(wake));
        }
        Notify::Callback(f) => {
            let outcome = outcome.map(|()| Permit::new(sem.clone(), w.n));
            out.push(Deferred::Call(f, outcome));
        }
    }
}
