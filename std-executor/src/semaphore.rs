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

/// Work to do once the queue lock is released.
enum Deferred {
    Wake(Wakeup),
    Call(Callback, Result<Permit, AcquireError>),
    Drop(Callback),
    DropWaker(Waker),
}

impl Deferred {
    fn run(self) {
        match self {
            Deferred::Wake(w) => w.wake(),
            Deferred::Call(f, outcome) => f(outcome),
            Deferred::Drop(f) => drop(f),
            Deferred::DropWaker(w) => drop(w),
        }
    }

    #[cfg(not(loom))]
    fn is_user_call(&self) -> bool {
        matches!(self, Deferred::Call(..) | Deferred::Drop(_))
    }
}

/// Runs deferred work after the lock is released: wakes at once; callbacks through the per-thread
/// trampoline (see the module docs).
fn run_deferred(actions: Vec<Deferred>) {
    if actions.is_empty() {
        return;
    }
    #[cfg(loom)]
    for a in actions {
        a.run();
    }
    #[cfg(not(loom))]
    trampoline::run(actions);
}

#[cfg(not(loom))]
mod trampoline {
    use super::Deferred;
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

    thread_local! {
        /// `Some` while this thread is running granted callbacks: nested grants queue here.
        static PENDING: RefCell<Option<VecDeque<Deferred>>> = const { RefCell::new(None) };
    }

    pub(super) fn run(actions: Vec<Deferred>) {
        let mut calls = VecDeque::new();
        for a in actions {
            if a.is_user_call() {
                calls.push_back(a);
            } else {
                a.run();
            }
        }
        if calls.is_empty() {
            return;
        }
        // Nested inside a callback of this thread? Queue for the outer loop.
        let outer = PENDING.try_with(|p| {
            let mut p = p.borrow_mut();
            match p.as_mut() {
                Some(q) => {
                    q.append(&mut calls);
                    false
                }
                None => {
                    *p = Some(VecDeque::new());
                    true
                }
            }
        });
        match outer {
            Ok(false) => (),
            Ok(true) => {
                let mut panic = None;
                loop {
                    let next = calls.pop_front().or_else(|| {
                        PENDING
                            .try_with(|p| p.borrow_mut().as_mut().and_then(VecDeque::pop_front))
                            .ok()
                            .flatten()
                    });
                    let Some(a) = next else { break };
                    if let Err(p) = catch_unwind(AssertUnwindSafe(|| a.run())) {
                        panic.get_or_insert(p);
                    }
                }
                let _ = PENDING.try_with(|p| *p.borrow_mut() = None);
                if let Some(p) = panic {
                    if !std::thread::panicking() {
                        resume_unwind(p);
                    }
                }
            }
            // Thread-local storage is being torn down: call directly.
            Err(_) => calls.into_iter().for_each(Deferred::run),
        }
    }
}

/// Outcome of the slow path.
enum Slow<'a> {
    Done(Result<Permit, AcquireError>),
    /// Must wait: the lock is held, `usize` permits are already assigned.
    Wait(MutexGuard<'a, Queue>, usize),
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
        Acquire {
            sem: self.clone(),
            n,
            state: AcquireState::Start,
        }
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

    /// `forget`: `n` held permits leave circulation and the capacity shrinks by `n`; queued
    /// requests above the new capacity fail with `TooMany`, their assigned permits handed on.
    fn shrink(&self, n: usize) {
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
    fn fast_path(&self, n: usize) -> Option<Result<Permit, AcquireError>> {
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
    fn slow_path(&self, n: usize) -> Slow<'_> {
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

    fn acquire_blocking(
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
    fn outcome(&self, status: &AtomicU8, n: usize) -> Option<Result<Permit, AcquireError>> {
        match status.load(Ordering::Acquire) {
            GRANTED => Some(Ok(Permit::new(self.clone(), n))),
            CLOSED => Some(Err(AcquireError::Closed)),
            TOO_MANY => Some(Err(AcquireError::TooMany)),
            _ => None,
        }
    }

    /// Removes waiter `id` if it is still queued, handing its assigned permits on. Returns
    /// whether it was removed (false: it was granted or closed, or removed before).
    fn cancel_waiter(&self, id: u64) -> bool {
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
    fn release(&self, n: usize) {
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
    fn assign_locked(&self, mut rem: usize, q: &mut Queue, out: &mut Vec<Deferred>) {
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
fn push_waiter(q: &mut Queue, n: usize, assigned: usize, notify: Notify) -> u64 {
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
fn resolve(sem: &Semaphore, w: Waiter, outcome: Result<(), AcquireError>, out: &mut Vec<Deferred>) {
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

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("available", &self.available())
            .field("capacity", &self.capacity())
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// A handle on a queued [`Semaphore::acquire_with_cancellable`] request (crate-internal).
pub(crate) struct WaiterToken {
    sem: Semaphore,
    id: u64,
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
    fn new(sem: Semaphore, n: usize) -> Permit {
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

/// The future of [`Semaphore::acquire_async`]: resolves to the granted [`Permit`] (or the
/// error). Dropping it before it resolves cancels the request without losing permits.
/// Polling it again after it resolved panics.
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
/// let sem = Semaphore::new(2);
/// let mut fut = pin!(sem.acquire_async(2));
/// let waker = Waker::from(Arc::new(Noop));
/// let mut cx = Context::from_waker(&waker);
/// assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Acquire {
    sem: Semaphore,
    n: usize,
    state: AcquireState,
}

enum AcquireState {
    Start,
    Queued { id: u64, status: Arc<AtomicU8> },
    Done,
}

impl Future for Acquire {
    type Output = Result<Permit, AcquireError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &this.state {
            AcquireState::Start => {
                if let Some(r) = this.sem.fast_path(this.n) {
                    this.state = AcquireState::Done;
                    return Poll::Ready(r);
                }
                let waker = cx.waker().clone();
                let status = Arc::new(AtomicU8::new(WAITING));
                match this.sem.slow_path(this.n) {
                    Slow::Done(r) => {
                        this.state = AcquireState::Done;
                        Poll::Ready(r)
                    }
                    Slow::Wait(mut q, assigned) => {
                        let id = push_waiter(
                            &mut q,
                            this.n,
                            assigned,
                            Notify::Signal {
                                status: status.clone(),
                                wake: Wakeup::Task(waker),
                            },
                        );
                        drop(q);
                        this.state = AcquireState::Queued { id, status };
                        Poll::Pending
                    }
                }
            }
            AcquireState::Queued { id, status } => {
                if let Some(r) = this.sem.outcome(status, this.n) {
                    this.state = AcquireState::Done;
                    return Poll::Ready(r);
                }
                // Still queued (as far as we know): refresh the waker, outside-in.
                let mut new = Some(cx.waker().clone());
                let queued = {
                    let mut q = lock(&this.sem.inner.queue);
                    match q.waiters.get_mut(id) {
                        Some(Waiter {
                            notify:
                                Notify::Signal {
                                    wake: Wakeup::Task(w),
                                    ..
                                },
                            ..
                        }) => {
                            if !w.will_wake(new.as_ref().expect("set above")) {
                                std::mem::swap(w, new.as_mut().expect("set above"));
                            }
                            true
                        }
                        _ => false,
                    }
                };
                drop(new); // the old (or unneeded) waker, dropped outside the lock
                if queued {
                    return Poll::Pending;
                }
                let r = this
                    .sem
                    .outcome(status, this.n)
                    .expect("a waiter no longer queued was granted or closed");
                this.state = AcquireState::Done;
                Poll::Ready(r)
            }
            AcquireState::Done => panic!("`Acquire` polled after completion"),
        }
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        if let AcquireState::Queued { id, status } = &self.state {
            if !self.sem.cancel_waiter(*id) {
                // Granted (or closed) but never polled: return what was granted.
                drop(self.sem.outcome(status, self.n));
            }
        }
    }
}

impl fmt::Debug for Acquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquire")
            .field("permits", &self.n)
            .field("queued", &matches!(self.state, AcquireState::Queued { .. }))
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
