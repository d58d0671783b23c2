//! Futures as tasks (`submit_async`): a key's future is polled on the serializer's workers, in
//! the key's order, and while it is pending its key stays owned without holding a worker.
//!
//! # Where a future lives
//!
//! A future task is a node of kind `Future` whose job is an [`AsyncJob`]: the future itself sits
//! in a [`FutureCell`] (boxed, so it never moves once polled) behind an `Arc<dyn PollTask>`, and
//! once first polled the job also carries the future's [`Parking`], which its wakers hold. A
//! future's item always goes onto its key's chain (`route.rs`), like a permit-gated task's: the
//! chain is what keeps the key owned while the future waits. The chain's owner pops the node,
//! takes the job out of it and polls the future, with the slot `RUNNING` as for any task:
//!
//! - **Ready** (or a panic in `poll`, caught): the handle resolves and the chain goes on with
//!   its next task.
//! - **Pending**: the worker puts a new node with the same job back at the chain's head
//!   (`unpop`), registers a wait in the serializer's registry of parked chains (the one
//!   permit-gated tasks use, `permits.rs`, with no semaphore request), and parks the chain: it
//!   stays `ACTIVE`, on no ready queue, so nothing else of the key starts and later submits queue
//!   behind. The worker never touches the chain again; the wait's baton passes to a waker.
//!
//! # The wake state (one word per future, [`WakeState`])
//!
//! ```text
//!  RUNNABLE  scheduled or about to be polled (initially, and after a wake took the park)
//!  POLLING   a worker is polling it
//!  NOTIFIED  woken while POLLING: poll it again
//!  PARKED    pending; its chain is parked with a registered wait
//!  DONE      completed, panicked or cancelled (terminal)
//! ```
//!
//! | transition | by |
//! |---|---|
//! | `RUNNABLE`/`NOTIFIED -> POLLING` (swap) | the chain's owner, before polling ([`WakeState::begin_poll`]); it owns the chain, so no waker can be taking the park |
//! | `RUNNABLE -> RUNNABLE`, `NOTIFIED -> NOTIFIED` (CAS) | a waker while a poll is coming: changes nothing, but is an RMW |
//! | `POLLING -> NOTIFIED` (CAS) | a waker during the poll |
//! | `POLLING -> PARKED` (CAS) | the owner after `Pending`, once the wait is registered ([`WakeState::try_park`]); fails on `NOTIFIED`: the owner takes the wait back and polls again |
//! | `PARKED -> RUNNABLE` (CAS) | a waker ([`WakeState::wake`] returns `true`): it alone reschedules the chain, through the wait's hand-off (`Handoff::grant`), which `shutdown_now`'s steal may have won first |
//! | `-> DONE` (store) | the owner at completion, or whoever cancels the future |
//!
//! Every access that a waker and the owner race on is an RMW on the word (a wake that changes
//! nothing still CASes the value it read), so they are totally ordered, and each wake either
//! lands during the poll (the owner sees `NOTIFIED` and polls again) or after the park (the waker
//! moves `PARKED -> RUNNABLE` and reschedules). Exactly one of them goes on with the future: no
//! wake is lost, and the chain is never scheduled twice, so the future is never polled by two
//! threads at once. A wake in `RUNNABLE` or `NOTIFIED` changes nothing: a poll is coming, and
//! its `begin_poll` swap comes after the wake's RMW, so it sees what the waker did before
//! waking (with a plain store and a load instead, that would be a store-then-load race and a
//! lost wakeup). A wake in `DONE` does nothing. A waker after the serializer is gone finds no serializer to schedule on and
//! does nothing. The wait is stored in the parking *before* the `POLLING -> PARKED` CAS (Release;
//! the waker's CAS is Acquire), so the waker that wins the park finds it. Loom:
//! `loom/tests/future.rs`.
//!
//! # Shutdown
//!
//! `shutdown` lets started futures finish: a pending future counts as a running task, so the
//! workers stay until it completes. `shutdown_now` steals every parked chain through the
//! registry (as for permits), cancels the started future at its head (its handle resolves
//! `Cancelled`) and hands back the tasks behind it; a future not yet polled is handed back as a
//! [`PendingTask`](crate::PendingTask), whose `run` drives it to completion on the calling thread.

use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};

use crate::error::{PanicPayload, TaskError};
use crate::handle::JoinState;
use crate::key::{KeyEntry, Runnable};
use crate::permit_wait::{Parked, PermitWait};
use crate::semaphore::Permit;
use crate::shared::Shared;
use crate::sync::{lock, AtomicU8, Mutex, Ordering};
use crate::task::{Abandon, Job};
use crate::user::{self, Payload};

const RUNNABLE: u8 = 0;
const POLLING: u8 = 1;
const NOTIFIED: u8 = 2;
const PARKED: u8 = 3;
const DONE: u8 = 4;

/// A future's wake state (see the module docs): the word its wakers and its chain's owner race on.
#[derive(Debug)]
pub struct WakeState(AtomicU8);

impl Default for WakeState {
    fn default() -> Self {
        WakeState::new()
    }
}

impl WakeState {
    /// `RUNNABLE`.
    pub fn new() -> WakeState {
        WakeState(AtomicU8::new(RUNNABLE))
    }

    /// The chain's owner is about to poll (`RUNNABLE` or `NOTIFIED` -> `POLLING`): a swap, so
    /// that a wake that found `RUNNABLE` (its no-op RMW, below) is ordered before it and what
    /// that waker did before waking is seen by this poll.
    pub fn begin_poll(&self) {
        self.0.swap(POLLING, Ordering::AcqRel);
    }

    /// The owner got `Pending` and has registered the wait: `POLLING -> PARKED`. `false`: a
    /// wake came during the poll (`NOTIFIED`); the owner still owns the chain and polls again.
    #[must_use = "on `false` the future must be polled again"]
    pub fn try_park(&self) -> bool {
        self.0
            .compare_exchange(POLLING, PARKED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// A wake: `true` if this wake took the park (`PARKED -> RUNNABLE`) and must reschedule the
    /// chain; `false` if there is nothing to do (a poll is running, coming, or not needed).
    #[must_use = "on `true` the caller must reschedule the chain"]
    pub fn wake(&self) -> bool {
        let mut s = self.0.load(Ordering::Acquire);
        loop {
            let to = match s {
                POLLING => NOTIFIED,
                PARKED => RUNNABLE,
                // A poll is coming: still an RMW (of the same value), so it is ordered with
                // that poll's `begin_poll` swap (no store-then-load race between the waker's
                // event and the poller's look at it).
                RUNNABLE | NOTIFIED => s,
                _ => return false,
            };
            match self
                .0
                .compare_exchange(s, to, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return s == PARKED,
                Err(actual) => s = actual,
            }
        }
    }

    /// Completed or cancelled: later wakes do nothing.
    pub fn finish(&self) {
        self.0.store(DONE, Ordering::Release);
    }
}

/// A future behind its type: what a worker (or `PendingTask::run`) does with it.
pub(crate) trait PollTask: Send + Sync {
    /// Polls the future once (user code, caught). `Ready(panicked)` once it is done: the
    /// future is dropped, `done(panicked)` has run and then the handle resolved.
    fn poll(&self, cx: &mut Context<'_>, done: &dyn Fn(bool)) -> Poll<bool>;
    /// Drops the future unfinished, resolving the handle.
    fn cancel(&self, why: Abandon);
    /// Drops the future unstarted because its key's code panicked on its way: `Panicked`.
    fn fail(&self, payload: Payload);
}

/// A future and its handle's state.
pub(crate) struct FutureCell<Fut: Future> {
    /// `None` once done. Locked only by the one poller at a time (the protocol above), so never
    /// contended; the lock makes the cell `Sync` for a `Send` future.
    fut: Mutex<Option<Pin<Box<Fut>>>>,
    join: crate::sync::Arc<JoinState<Fut::Output>>,
}

impl<Fut: Future> FutureCell<Fut> {
    pub(crate) fn new(fut: Fut, join: crate::sync::Arc<JoinState<Fut::Output>>) -> Self {
        FutureCell {
            fut: Mutex::new(Some(Box::pin(fut))),
            join,
        }
    }

    /// Takes the future out (it is dropped by the caller, outside the lock).
    fn take(&self) -> Option<Pin<Box<Fut>>> {
        lock(&self.fut).take()
    }
}

impl<Fut> PollTask for FutureCell<Fut>
where
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    fn poll(&self, cx: &mut Context<'_>, done: &dyn Fn(bool)) -> Poll<bool> {
        let polled = {
            let mut slot = lock(&self.fut);
            let Some(fut) = slot.as_mut() else {
                return Poll::Ready(false); // done already (never polled again by the protocol)
            };
            // The future's `poll` is user code: caught inside the lock's scope, so it never
            // unwinds through the lock.
            user::catch(|| fut.as_mut().poll(cx))
        };
        let result = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(v)) => Ok(v),
            Err(p) => Err(TaskError::Panicked(PanicPayload::new(p))),
        };
        // The finished future's `Drop` is user code too.
        user::drop_quietly(self.take());
        let panicked = result.is_err();
        done(panicked);
        self.join.complete(result);
        Poll::Ready(panicked)
    }

    fn cancel(&self, why: Abandon) {
        user::drop_quietly(self.take());
        self.join.complete(Err(match why {
            Abandon::Cancelled => TaskError::Cancelled,
            Abandon::Superseded => TaskError::Superseded,
        }));
    }

    fn fail(&self, payload: Payload) {
        user::drop_quietly(self.take());
        self.join
            .complete(Err(TaskError::Panicked(PanicPayload::new(payload))));
    }
}

/// Where a started future's wakers find its key: the wake state, the chain's entry and the wait
/// registered while it is parked.
pub(crate) struct Parking<K> {
    state: WakeState,
    shared: Weak<Shared<K>>,
    entry: NonNull<KeyEntry<K>>,
    /// The registered wait while `PARKED` (stored before the park, taken by the waker that wins
    /// it, or by the owner whose park failed).
    wait: Mutex<Option<crate::sync::Arc<PermitWait<Parked<K>>>>>,
}

// SAFETY: `entry` is dereferenced only by whoever holds the chain's baton (the waker that won the
// park and then the wait's hand-off), and entries are `Sync`; the rest is `Send + Sync`.
unsafe impl<K: Send + Sync> Send for Parking<K> {}
// SAFETY: as above.
unsafe impl<K: Send + Sync> Sync for Parking<K> {}

impl<K> Parking<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// The parking of a future of `entry`'s chain, first polled now.
    pub(crate) fn new(shared: &Arc<Shared<K>>, entry: NonNull<KeyEntry<K>>) -> Arc<Self> {
        Arc::new(Parking {
            state: WakeState::new(),
            shared: Arc::downgrade(shared),
            entry,
            wait: Mutex::new(None),
        })
    }

    pub(crate) fn state(&self) -> &WakeState {
        &self.state
    }

    /// The chain's owner got `Pending` and put the future back at the chain's head: registers
    /// the wait and parks. `false`: a wake came during the poll; the wait is taken back, the
    /// chain is still the caller's, and the future must be polled again.
    pub(crate) fn park(&self, shared: &Shared<K>) -> bool {
        let wait = shared.permit_waits().register(Parked {
            entry: self.entry,
            token: Mutex::new(None),
            why: crate::permit_wait::ParkedFor::Future,
        });
        *lock(&self.wait) = Some(wait.clone());
        if self.state.try_park() {
            return true;
        }
        lock(&self.wait).take();
        shared.permit_waits().remove(&wait);
        false
    }
}

impl<K> Wake for Parking<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.state.wake() {
            return;
        }
        // This wake took the park: it holds the wait's side of the baton.
        let wait = lock(&self.wait).take();
        let (Some(wait), Some(shared)) = (wait, self.shared.upgrade()) else {
            return; // the serializer is gone
        };
        // `shutdown_now` may have stolen the chain first (then this does nothing).
        shared.permit_waits().grant(&wait, |parked| {
            shared.schedule(Runnable::Chain(parked.entry), None);
        });
    }
}

/// A future task's job (the node of a `submit_async`).
pub(crate) struct AsyncJob<K> {
    pub(crate) task: Arc<dyn PollTask>,
    /// Set once the future was first polled (it has started).
    pub(crate) parking: Option<Arc<Parking<K>>>,
}

impl<K: Send + Sync + 'static> Job for AsyncJob<K> {
    /// Drives the future to completion on the calling thread (a handed-back future's
    /// `PendingTask::run`), parking the thread while it is pending.
    fn run(self, permit: Option<Permit>, done: &dyn Fn(bool)) -> bool {
        user::drop_quietly(permit);
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let panicked = loop {
            match self.task.poll(&mut cx, done) {
                Poll::Ready(panicked) => break panicked,
                Poll::Pending => std::thread::park(),
            }
        };
        if let Some(p) = &self.parking {
            p.state.finish();
        }
        user::drop_quietly(self);
        panicked
    }

    fn abandon(self, why: Abandon) {
        self.task.cancel(why);
        if let Some(p) = &self.parking {
            p.state.finish();
        }
        user::drop_quietly(self);
    }

    fn fail(self, payload: Payload) {
        self.task.fail(payload);
        user::drop_quietly(self);
    }
}

/// Unparks the thread that drives a handed-back future.
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}
