//! A fair (FIFO) counting semaphore with all-or-nothing multi-permit acquires, usable from
//! threads (blocking, with or without a timeout), from async code ([`Acquire`]) and by callback
//! ([`Semaphore::acquire_with`]).
//!
//! ```
//! use keyserial::Semaphore;
//!
//! let sem = Semaphore::new(3);
//! let a = sem.acquire(2).unwrap();
//! assert_eq!(sem.available(), 1);
//! assert!(sem.try_acquire(2).is_err()); // all or nothing
//! drop(a);
//! assert_eq!(sem.available(), 3);
//! ```
//!
//! # Protocol
//!
//! Two pieces of state:
//!
//! - the **permit word**, a [`keyserial_core::permits::PermitCounter`]: the free count plus a
//!   `CLOSED` bit and a `WAITERS` bit, changed only by compare-and-swap (its module docs give
//!   the word-level protocol);
//! - the **waiter queue**, under a mutex: waiters in arrival order (a `BTreeMap` keyed by an
//!   increasing id, so a cancelled waiter can leave from the middle), each with the number of
//!   permits it asked for, the number already **assigned** to it, and how to tell it (a parked
//!   thread, an async task's waker, or a callback).
//!
//! The queue lock's holder keeps two invariants: `WAITERS` is set iff the queue is non-empty, and
//! while it is set the free count is 0. From them:
//!
//! - **Fast paths** touch only the word. `try_acquire` CASes the count down; it fails while
//!   `WAITERS` is set, so nobody overtakes a waiter (no barging) even if permits were just
//!   released. Dropping a [`Permit`] CASes the count up unless `WAITERS` is set.
//! - **Waiting.** An acquire whose fast path failed takes the lock and calls
//!   `PermitCounter::acquire_slow`: either everything it needs is free after all (done), or it
//!   takes what is free (partial assignment), sets `WAITERS` and joins the back of the queue.
//!   Only the head of the queue ever holds assigned permits: a newcomer gets any only when the
//!   queue was empty, making it the head.
//! - **Releasing into the queue.** A release that saw `WAITERS` takes the lock and assigns its
//!   permits to the head waiter, then the next, in order; a waiter whose assignment is complete is
//!   removed and granted. A head that needs more keeps the rest waiting, so a large request at the
//!   head holds back later small ones (no starvation of large requests). If the queue empties,
//!   the leftover permits go to the free count and `WAITERS` is cleared in the same CAS
//!   (`end_waiting`).
//! - **Cancellation** (a timed-out `acquire_timeout`, a dropped [`Acquire`], a cancelled
//!   crate-internal callback waiter) takes the lock and removes the waiter if it is still queued,
//!   then releases its assigned permits exactly like a release (to the next waiters first). If the
//!   waiter is no longer queued, it was already granted (or closed): the canceller then owns the
//!   granted permits (and returns them by dropping a `Permit`) or sees `Closed`.
//! - **Close** takes the lock, sets `CLOSED`, removes every waiter (resolving each with
//!   `Closed`) and returns all their assigned permits to the free count with `end_waiting`.
//!
//! **Why no permit is lost or doubled.** Every permit is at any moment in exactly one place: the
//! free count, some waiter's `assigned`, or a `Permit` value. Moves between the free count and
//! the queue happen in a single CAS made by the lock holder (`acquire_slow`, `end_waiting`); moves
//! between the queue and a `Permit` happen under the lock when a waiter is removed, and the
//! removal is what decides, exactly once, whether a waiter was granted, cancelled or closed. A
//! lock-free release and a waiter joining the queue both CAS the same word, so one of them sees
//! the other (see the core module).
//!
//! **Waking.** A removed waiter is told *after* the lock is released: its status (an atomic,
//! written under the lock) is set first, then the thread is unparked, the waker woken or the
//! callback called. A waiting thread re-checks the status after every unpark, and the parker's
//! token makes an unpark that comes before the park count. No user code (waker clones, wakes,
//! callbacks, the drop of a cancelled callback) runs under the lock.
//!
//! Callbacks granted while another callback of the same thread is running are queued on a
//! per-thread trampoline instead of being called recursively, so a chain of callbacks that each
//! drop their permit runs in a loop, not in ever deeper stack frames. A panicking callback does
//! not stop the other granted callbacks; the first panic is resumed after all have run.
//!
//! # Forgotten permits
//!
//! The semaphore's **capacity** is the largest request it accepts (a larger one is
//! [`AcquireError::TooMany`] at once, never a hang). It starts as the permits given to
//! [`Semaphore::new`], grows with [`Semaphore::add_permits`], and shrinks with
//! [`Permit::forget`], which (as in tokio) drops permits without returning them: they leave
//! circulation for good. So, whenever no operation is in flight, the capacity equals the free
//! permits plus those assigned to waiters plus those held in `Permit`s. `forget` works under the queue lock: it
//! lowers the capacity and fails every queued request that no longer fits with `TooMany`
//! (handing their assigned permits on); the slow path checks the capacity again under the same
//! lock, so no request above the capacity ever waits.

mod acquire;
mod deferred;
mod permit;
mod queue;

pub use acquire::Acquire;
use deferred::{run_deferred, Deferred};
pub use permit::Permit;
pub(crate) use permit::WaiterToken;
use queue::{push_waiter, resolve, Slow};

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use keyserial_core::permits::{PermitCounter, SlowAcquire, TryAcquireError};

use crate::sync::{lock, Arc, AtomicU8, AtomicUsize, Mutex, MutexGuard, Ordering, Parker, Wakeup};

/// Waiter status: still queued (or being queued).
const WAITING: u8 = 0;
/// Removed from the queue with all its permits: they belong to the waiting party now.
const GRANTED: u8 = 1;
/// Removed from the queue by `close`: no permits.
const CLOSED: u8 = 2;
/// Removed from the queue because forgotten permits lowered the capacity below its request.
const TOO_MANY: u8 = 3;

/// Why an acquire returned no [`Permit`].
///
/// ```
/// use keyserial::{AcquireError, Semaphore};
///
/// let sem = Semaphore::new(1);
/// assert_eq!(sem.try_acquire(2).unwrap_err(), AcquireError::TooMany);
/// let _p = sem.try_acquire(1).unwrap();
/// assert_eq!(sem.try_acquire(1).unwrap_err(), AcquireError::NoPermits);
/// sem.close();
/// assert_eq!(sem.acquire(1).unwrap_err(), AcquireError::Closed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireError {
    /// `try_acquire` only: not enough permits free right now, or others are waiting (they go
    /// first).
    NoPermits,
    /// `acquire_timeout` only: the permits were not granted in time (any permits already assigned
    /// to this request went on to the next waiters).
    Timeout,
    /// The semaphore is closed.
    Closed,
    /// More permits were requested than the semaphore's capacity: they could never be granted.
    /// (Also the outcome of a queued request when [`Permit::forget`] shrinks the capacity below
    /// it.)
    TooMany,
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AcquireError::NoPermits => "no permits available",
            AcquireError::Timeout => "timed out waiting for permits",
            AcquireError::Closed => "the semaphore is closed",
            AcquireError::TooMany => "more permits requested than the semaphore's capacity",
        })
    }
}

impl std::error::Error for AcquireError {}

/// A fair counting semaphore: permits are granted in request order, `n` at a time, all at once.
///
/// Clones share one semaphore. The number of permits given to [`new`](Self::new) is also its
/// **capacity**: a request for more is [`AcquireError::TooMany`] at once (it could never be
/// granted); [`add_permits`](Self::add_permits) raises both, [`Permit::forget`] lowers the
/// capacity for good (queued requests that no longer fit then fail with `TooMany`).
///
/// ```
/// use keyserial::Semaphore;
/// use std::thread;
///
/// let sem = Semaphore::new(2);
/// let workers: Vec<_> = (0..4)
///     .map(|_| {
///         let sem = sem.clone();
///         thread::spawn(move || {
///             let _permit = sem.acquire(1).unwrap(); // at most 2 threads in here at once
///         })
///     })
///     .collect();
/// for w in workers {
///     w.join().unwrap();
/// }
/// assert_eq!(sem.available(), 2);
/// ```
#[derive(Clone)]
pub struct Semaphore {
    inner: Arc<Inner>,
}

struct Inner {
    counter: PermitCounter,
    capacity: AtomicUsize,
    queue: Mutex<Queue>,
}

struct Queue {
    /// Waiters in arrival order (ids only increase).
    waiters: BTreeMap<u64, Waiter>,
    next_id: u64,
}

struct Waiter {
    /// Permits requested.
    n: usize,
    /// Permits already assigned (only ever non-zero at the head of the queue).
    assigned: usize,
    notify: Notify,
}

type Callback = Box<dyn FnOnce(Result<Permit, AcquireError>) + Send>;

enum Notify {
    /// A thread or a future polls `status` and is woken through `wake`.
    Signal { status: Arc<AtomicU8>, wake: Wakeup },
    /// `acquire_with`: called with the outcome.
    Callback(Callback),
}

impl Semaphore {
    /// A semaphore with `permits` free permits; `permits` is also its capacity.
    ///
    /// # Panics
    /// If `permits` exceeds `usize::MAX >> 2`.
    ///
    /// ```
    /// use keyserial::Semaphore;
    ///
    /// let sem = Semaphore::new(4);
    /// assert_eq!(sem.available(), 4);
    /// ```
    pub fn new(permits: usize) -> Semaphore {
        Semaphore {
            inner: Arc::new(Inner {
                counter: PermitCounter::new(permits),
                capacity: AtomicUsize::new(permits),
                queue: Mutex::new(Queue {
                    waiters: BTreeMap::new(),
                    next_id: 0,
                }),
            }),
        }
    }

    /// The free permits right now. While anyone waits this is 0: permits released then go to
    /// the waiters (the head waiter may hold some already, which are not counted here).
    ///
    /// ```
    /// use keyserial::Semaphore;
    ///
    /// let sem = Semaphore::new(3);
    /// let _p = sem.try_acquire(1).unwrap();
    /// assert_eq!(sem.available(), 2);
    /// ```
    pub fn available(&self) -> usize {
        self.inner.counter.available()
    }

    /// The number of requests waiting right now (a snapshot, for monitoring and tests).
    ///
    /// ```
    /// use keyserial::Semaphore;
    ///
    /// let sem = Semaphore::new(1);
    /// assert_eq!(sem.waiters(), 0);
    /// ```
    pub fn waiters(&self) -> usize {
        lock(&self.inner.queue).waiters.len()
    }

    /// Whether [`close`](Self::close) was called.
    ///
    /// ```
    /// use keyserial::Semaphore;
    ///
    /// let sem = Semaphore::new(1);
    /// sem.close();
    /// assert!(sem.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.inner.counter.is_closed()
    }

    /// The largest request this semaphore accepts: the initial permits, plus all
    /// [`add_permits`](Self::add_permits), minus all [forgotten](Permit::forget) permits.
    pub(crate) fn capacity(&self) -> usize {
        self.inner.capacity.load(Ordering::Acquire)
    }

    /// Takes `n` permits at once if they are free and nobody is waiting; never blocks.
    ///
    /// Errors: `Closed` once closed; `TooMany` if `n` exceeds the capacity; `NoPermits` if fewer
    /// than `n` are free **or anyone is waiting** (waiters go first, even if `n` permits are free).
    /// `n == 0` succeeds at once with an empty permit (unless closed).
    ///
    /// ```
    /// use keyserial::{AcquireError, Semaphore};
    ///
    /// let sem = Semaphore::new(2);
    /// let p = sem.try_acquire(2).unwrap();
    /// assert_eq!(p.count(), 2);
    /// assert_eq!(sem.try_acquire(1).unwrap_err(), AcquireError::NoPermits);
    /// assert_eq!(sem.try_acquire(0).unwrap().count(), 0);
    /// ```
    pub fn try_acquire(&self, n: usize) -> Result<Permit, AcquireError> {
        self.fast_path(n).unwrap_or(Err(AcquireError::NoPermits))
    }

    /// Takes `n` permits, waiting (parked, in FIFO order) until they are granted all at once.
    ///
    /// Errors: `Closed` if the semaphore is or becomes closed; `TooMany` if `n` exceeds the
    /// capacity (also while waiting, if [forgotten](Permit::forget) permits shrink the capacity
    /// below `n`). `n == 0` succeeds at once.
    ///
    /// ```
    /// use keyserial::Semaphore;
    /// use std::thread;
    ///
    /// let sem = Semaphore::new(1);
    /// let held = sem.acquire(1).unwrap();
    /// let t = {
    ///     let sem = sem.clone();
    ///     thread::spawn(move || sem.acquire(1).unwrap().count())
    /// };
    /// drop(held); // hands the permit to the waiting thread
    /// assert_eq!(t.join().unwrap(), 1);
    /// ```
    pub fn acquire(&self, n: usize) -> Result<Permit, AcquireError> {
        self.acquire_blocking(n, None)
    }

    /// Like [`acquire`](Self::acquire), but gives up after `timeout` with `Timeout`. Permits
    /// already assigned to this request when it gives up are passed to the next waiters (or
    /// become free); nothing is lost. If the permits are granted at the very moment it gives up,
    /// the grant wins and it returns them.
    ///
    /// ```
    /// use keyserial::{AcquireError, Semaphore};
    /// use std::time::Duration;
    ///
    /// let sem = Semaphore::new(2);
    /// let _held = sem.acquire(1).unwrap();
    /// let r = sem.acquire_timeout(2, Duration::from_millis(10));
    /// assert_eq!(r.unwrap_err(), AcquireError::Timeout);
    /// assert_eq!(sem.available(), 1); // the permit it had been assigned came back
    /// ```
    pub fn acquire_timeout(&self, n: usize, timeout: Duration) -> Result<Permit, AcquireError> {
        // A timeout too large for `Instant` waits without a deadline.
        self.acquire_blocking(n, Instant::now().checked_add(timeout))
    }

    /// Takes `n` permits asynchronously: the returned future resolves when they are granted, in
    /// FIFO order with every other kind of waiter. Dropping the future cancels the request and
    /// returns any permits it had been assigned (or granted) to the next waiters. Errors as for
    /// [`acquire`](Self::acquire). The future works with any executor (it only uses the waker).
    ///
    /// ```
    /// use keyserial::Semaphore;
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::sync::Arc;
    /// use std::task::{Context, Poll, Wake, Waker};
    ///
    /// struct Noop;
    /// impl Wake for Noop {
    ///     fn wake(self: Arc<Self>) {}
    /// }
    ///
    /// let sem = Semaphore::new(1);
    /// let held = sem.try_acquire(1).unwrap();
    /// let mut fut = pin!(sem.acquire_async(1));
    /// let waker = Waker::from(Arc::new(Noop));
    /// let mut cx = Context::from_waker(&waker);
    /// assert!(fut.as_mut().poll(&mut cx).is_pending());
    /// drop(held);
    /// match fut.as_mut().poll(&mut cx) {
    ///     Poll::Ready(Ok(p)) => assert_eq!(p.count(), 1),
    ///     other => panic!("{other:?}"),
    /// }
    /// ```
    pub fn acquire_async(&self, n: usize) -> Acquire {
        Acquire::new(self.clone(), n)
    }

    /// Requests `n` permits and calls `callback` exactly once with the outcome: at once, in the
    /// caller, if they are free (or the request fails: `Closed`, `TooMany`); otherwise later, on
    /// the thread that releases the last permits it needs (or that closes the semaphore). Waits in
    /// FIFO order with every other kind of waiter. Keep callbacks short: they run on whichever
    /// thread released the permits.
    ///
    /// ```
    /// use keyserial::Semaphore;
    /// use std::sync::mpsc;
    ///
    /// let sem = Semaphore::new(1);
    /// let held = sem.try_acquire(1).unwrap();
    /// let (tx, rx) = mpsc::channel();
    /// sem.acquire_with(1, move |r| tx.send(r.map(|p| p.count())).unwrap());
    /// assert!(rx.try_recv().is_err()); // still waiting
    /// drop(held); // runs the callback here, on this thread
    /// assert_eq!(rx.try_recv().unwrap(), Ok(1));
    /// ```
    pub fn acquire_with<F>(&self, n: usize, callback: F)
    where
        F: FnOnce(Result<Permit, AcquireError>) + Send + 'static,
    {
        let _waiting = self.acquire_with_cancellable(n, callback);
    }

    /// [`acquire_with`](Self::acquire_with) that can be called off.
    ///
    /// Contract:
    /// - If the request is resolved at once (the permits are free, `n == 0`, or it fails with
    ///   `Closed`/`TooMany`), `callback` has been called, in the caller, before this returns, and
    ///   the result is `None`.
    /// - Otherwise the request is queued and the result is `Some(token)`. `callback` will then be
    ///   called exactly once, with `Ok(permit)` when granted, `Err(Closed)` on close, or
    ///   `Err(TooMany)` if [`Permit::forget`] shrinks the capacity below `n`, on the releasing
    ///   (closing, forgetting) thread, after the semaphore's lock is released — unless
    ///   [`WaiterToken::cancel`] returns `true` first.
    /// - `cancel` returns `true` iff it removed the still-queued request: the callback will never
    ///   be called (it is dropped, inside `cancel`, after the lock is released) and any permits
    ///   already assigned to the request have been handed to the next waiters (or made free)
    ///   before `cancel` returns. It returns `false` if the request had already been granted or
    ///   closed (its callback has run, is running, or is about to run on another thread) or was
    ///   already cancelled.
    /// - Dropping the token does not cancel anything.
    pub(crate) fn acquire_with_cancellable<F>(&self, n: usize, callback: F) -> Option<WaiterToken>
    where
        F: FnOnce(Result<Permit, AcquireError>) + Send + 'static,
    {
        if let Some(r) = self.fast_path(n) {
            callback(r);
            return None;
        }
        match self.slow_path(n) {
            Slow::Done(r) => {
                callback(r);
                None
            }
            Slow::Wait(mut q, assigned) => {
                let id = push_waiter(&mut q, n, assigned, Notify::Callback(Box::new(callback)));
                drop(q);
                Some(WaiterToken {
                    sem: self.clone(),
                    id,
                })
            }
        }
    }

    /// Adds `n` permits: they go to the waiters first, in order, and the rest become free. Also
    /// raises the capacity by `n`.
    ///
    /// # Panics
    /// If the capacity would exceed `usize::MAX >> 2`.
    ///
    /// ```
    /// use keyserial::{AcquireError, Semaphore};
    ///
    /// let sem = Semaphore::new(1);
    /// assert_eq!(sem.try_acquire(3).unwrap_err(), AcquireError::TooMany);
    /// sem.add_permits(2);
    /// assert_eq!(sem.try_acquire(3).unwrap().count(), 3);
    /// ```
    pub fn add_permits(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut cap = self.inner.capacity.load(Ordering::Acquire);
        loop {
            let next = cap
                .checked_add(n)
                .filter(|&c| c <= PermitCounter::MAX_PERMITS)
                .expect("a semaphore holds at most usize::MAX >> 2 permits");
            match self.inner.capacity.compare_exchange(
                cap,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(actual) => cap = actual,
            }
        }
        self.release(n);
    }

    /// Closes the semaphore: every waiter is woken with `Err(Closed)` (callbacks are called with
    /// it), permits assigned to them become free, and every later acquire fails with `Closed`.
    /// Permits already held stay valid and are returned (counted in [`available`](Self::available))
    /// when dropped.
    ///
    /// ```
    /// use keyserial::{AcquireError, Semaphore};
    ///
    /// let sem = Semaphore::new(1);
    /// let held = sem.acquire(1).unwrap();
    /// sem.close();
    /// assert_eq!(sem.try_acquire(1).unwrap_err(), AcquireError::Closed);
    /// drop(held);
    /// assert_eq!(sem.available(), 1);
    /// ```
    pub fn close(&self) {
        let mut out = Vec::new();
        {
            let mut q = lock(&self.inner.queue);
            self.inner.counter.close();
            let mut returned = 0;
            for (_, w) in std::mem::take(&mut q.waiters) {
                returned += w.assigned;
                resolve(self, w, Err(AcquireError::Closed), &mut out);
            }
            // Always: clears WAITERS even when no waiter held permits.
            self.inner.counter.end_waiting(returned);
        }
        run_deferred(out);
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("available", &self.available())
            .field("capacity", &self.capacity())
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Hooks for the loom models in `loom/` (only under `cfg(loom)`): the crate-internal
/// cancellable acquire.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_hooks {
    use super::{AcquireError, Permit, Semaphore};

    /// A queued cancellable request; see `Semaphore::acquire_with_cancellable`.
    pub struct Token(super::WaiterToken);

    impl Token {
        /// `WaiterToken::cancel`.
        pub fn cancel(&self) -> bool {
            self.0.cancel()
        }
    }

    /// `Semaphore::acquire_with_cancellable`.
    pub fn acquire_with_cancellable<F>(sem: &Semaphore, n: usize, callback: F) -> Option<Token>
    where
        F: FnOnce(Result<Permit, AcquireError>) + Send + 'static,
    {
        sem.acquire_with_cancellable(n, callback).map(Token)
    }
}
