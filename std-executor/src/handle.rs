//! Task handles: a blocking `join` and a `Future`, fed by the worker that finishes the task.
//!
//! The shared state is a mutex-protected slot (result + waker) plus a condvar. The worker stores
//! the outcome and takes the waker under the lock, then wakes after unlocking; a joiner or poller
//! checks the slot under the same lock, so a completion is never missed.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::error::TaskError;
use crate::sync::{lock, Arc, AtomicBool, Condvar, Mutex, Ordering};

pub(crate) struct JoinState<T> {
    done: AtomicBool,
    slot: Mutex<Slot<T>>,
    cond: Condvar,
    /// The serializer and key the task was submitted to, so that a wait on the handle can catch
    /// a task that waits for a later task of its own key (`None`: unkeyed, or not checkable).
    origin: OriginCheck,
}

/// What a handle keeps for the self-wait check: its task's serializer and key (`None`:
/// unkeyed, or a `submit_latest` task, which can also resolve by being superseded).
pub(crate) type OriginCheck = Option<SelfWait>;

/// A keyed task's serializer and key, as the self-wait check compares them with the task the
/// calling thread runs (`worker::running_key_here`): the key's hash, tagged (`hash | 1`, so
/// that it is never 0, which stands for "no keyed task").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SelfWait {
    pub(crate) serializer: usize,
    pub(crate) key: u64,
}

impl SelfWait {
    /// Panics if the calling thread is one of the task's serializer's workers inside a task of
    /// the same key: the awaited task is queued behind the caller (or is the caller) and cannot
    /// start before the caller returns, so the wait would never end.
    fn check(self) {
        if crate::running::running_key_here(self.serializer) == Some(self.key) {
            panic!(
                "keyserial: a task waits for a task of its own key that has not run (a later \
                 one, or itself): that task is queued behind the waiting one and can never \
                 start, so the wait would never end (see the crate docs, \"A task must never \
                 wait for a later task of its own key\")"
            );
        }
    }
}

struct Slot<T> {
    result: Option<Result<T, TaskError>>,
    waker: Option<Waker>,
}

impl<T> JoinState<T> {
    /// A state for a task submitted from `origin` (checked in debug builds only).
    pub(crate) fn new(origin: OriginCheck) -> Arc<Self> {
        Arc::new(JoinState {
            done: AtomicBool::new(false),
            slot: Mutex::new(Slot {
                result: None,
                waker: None,
            }),
            cond: Condvar::new(),
            origin,
        })
    }

    /// Stores the outcome (exactly once) and wakes the joiner.
    pub(crate) fn complete(&self, result: Result<T, TaskError>) {
        let waker = {
            let mut slot = lock(&self.slot);
            debug_assert!(slot.result.is_none(), "a task completes once");
            slot.result = Some(result);
            self.done.store(true, Ordering::Release);
            slot.waker.take()
        };
        self.cond.notify_all();
        if let Some(w) = waker {
            // A waker is user code (the awaiting executor's): outside the lock, and a panic
            // in it (or in its drop) is contained, with the result already stored.
            crate::user::call_quietly(|| w.wake());
        }
    }
}

/// The handle of a submitted task: wait for its result with [`join`](Self::join), or `.await` it
/// (it is a [`Future`] that works under any executor).
///
/// Dropping the handle detaches the task; it still runs.
///
/// ```
/// use keyserial::Serializer;
/// let s: Serializer<&str> = Serializer::new();
/// let h = s.submit("alice", || 2 + 2).unwrap();
/// assert_eq!(h.join().unwrap(), 4);
/// ```
#[must_use = "dropping a handle detaches the task; use `execute` if you need no result"]
pub struct TaskHandle<T> {
    state: Arc<JoinState<T>>,
}

impl<T> TaskHandle<T> {
    pub(crate) fn new(state: Arc<JoinState<T>>) -> Self {
        TaskHandle { state }
    }

    /// Blocks until the task has finished and returns its value, or why there is none.
    ///
    /// # Panics
    ///
    /// From inside a task, on a task of the **same key** that has not finished (one submitted
    /// after it, or the task itself): that task is queued behind the joining one and cannot
    /// start before it returns, so the join would never end. Every build panics instead of
    /// hanging (the joining task's handle then resolves `Panicked`), for every kind of
    /// submission except `submit_latest`, whose handles can also resolve by being superseded;
    /// awaiting the handle (its `Future`, `block_on`) panics the same way. The check compares
    /// the keys' 64-bit hashes. Joining tasks of other keys from inside a task is allowed, but
    /// holds a worker thread while it waits.
    ///
    /// ```
    /// use keyserial::{Serializer, TaskError};
    /// let s: Serializer<u8> = Serializer::new();
    /// assert_eq!(s.submit(1, || "done").unwrap().join().unwrap(), "done");
    /// ```
    pub fn join(self) -> Result<T, TaskError> {
        if !self.is_finished() {
            if let Some(origin) = self.state.origin {
                origin.check();
            }
        }
        let mut slot = lock(&self.state.slot);
        loop {
            if let Some(r) = slot.result.take() {
                return r;
            }
            #[cfg(not(loom))]
            {
                slot = self
                    .state
                    .cond
                    .wait(slot)
                    .unwrap_or_else(|e| e.into_inner());
            }
            #[cfg(loom)]
            {
                slot = self.state.cond.wait(slot).unwrap();
            }
        }
    }

    /// `true` once the task has finished (ran, panicked, or was cancelled or superseded).
    ///
    /// ```
    /// use keyserial::Serializer;
    /// let s: Serializer<u8> = Serializer::new();
    /// let h = s.submit(1, || ()).unwrap();
    /// while !h.is_finished() { std::thread::yield_now(); }
    /// ```
    pub fn is_finished(&self) -> bool {
        self.state.done.load(Ordering::Acquire)
    }
}

impl<T> Future for TaskHandle<T> {
    type Output = Result<T, TaskError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = lock(&self.state.slot);
        if let Some(r) = slot.result.take() {
            return Poll::Ready(r);
        }
        if let Some(origin) = self.state.origin {
            // Not finished, and it cannot finish while the caller runs, if it is the caller's
            // own key's (see `join`): checked outside the lock, as the panic unwinds.
            drop(slot);
            origin.check();
            slot = lock(&self.state.slot);
            if let Some(r) = slot.result.take() {
                return Poll::Ready(r);
            }
        }
        if slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return Poll::Pending;
        }
        // Cloning the new waker and dropping the old one are the caller's executor's code: not
        // under the lock. A completion between the two locks is seen by the second look; one
        // after it takes the waker stored here.
        drop(slot);
        let new = cx.waker().clone();
        let mut slot = lock(&self.state.slot);
        if let Some(r) = slot.result.take() {
            drop(slot);
            drop(new);
            return Poll::Ready(r);
        }
        let old = slot.waker.replace(new);
        drop(slot);
        drop(old);
        Poll::Pending
    }
}

impl<T> fmt::Debug for TaskHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskHandle")
            .field("finished", &self.is_finished())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{block_on, CountingWaker, Drops};

    fn pair<T>() -> (Arc<JoinState<T>>, TaskHandle<T>) {
        let state = JoinState::new(Default::default());
        let h = TaskHandle::new(state.clone());
        (state, h)
    }

    #[test]
    fn join_after_completion_returns_at_once() {
        let (state, h) = pair();
        assert!(!h.is_finished());
        state.complete(Ok(String::from("done")));
        assert!(h.is_finished());
        assert_eq!(format!("{h:?}"), "TaskHandle { finished: true }");
        assert_eq!(h.join().unwrap(), "done");
    }

    #[test]
    fn join_waits_for_a_completion_on_another_thread() {
        let (state, h) = pair();
        let (tx, rx) = std::sync::mpsc::channel();
        let completer = std::thread::spawn(move || {
            rx.recv().unwrap(); // the joiner is about to block
            for _ in 0..3 {
                std::thread::yield_now();
            }
            state.complete(Ok(vec![1u8, 2, 3]));
        });
        tx.send(()).unwrap();
        assert_eq!(h.join().unwrap(), [1, 2, 3]);
        completer.join().unwrap();
    }

    #[test]
    fn a_joiner_on_another_thread_gets_an_error_outcome() {
        let (state, h) = pair::<u8>();
        let joiner = std::thread::spawn(move || h.join());
        std::thread::yield_now();
        state.complete(Err(TaskError::Superseded));
        assert!(matches!(joiner.join().unwrap(), Err(TaskError::Superseded)));
    }

    #[test]
    fn the_future_is_pending_then_woken_once_then_ready() {
        let (state, mut h) = pair();
        let (counter, waker) = CountingWaker::new();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut h).poll(&mut cx).is_pending());
        // Polling again with the same waker keeps it (one registration, one wake).
        assert!(Pin::new(&mut h).poll(&mut cx).is_pending());
        assert_eq!(counter.wakes(), 0);
        state.complete(Ok(7u32));
        assert_eq!(counter.wakes(), 1);
        match Pin::new(&mut h).poll(&mut cx) {
            Poll::Ready(r) => assert_eq!(r.unwrap(), 7),
            Poll::Pending => panic!("completed handle still pending"),
        }
        assert_eq!(counter.wakes(), 1);
    }

    #[test]
    fn only_the_latest_waker_is_woken() {
        let (state, mut h) = pair::<()>();
        let (first, w1) = CountingWaker::new();
        let (second, w2) = CountingWaker::new();
        assert!(Pin::new(&mut h)
            .poll(&mut Context::from_waker(&w1))
            .is_pending());
        assert!(Pin::new(&mut h)
            .poll(&mut Context::from_waker(&w2))
            .is_pending());
        state.complete(Err(TaskError::Cancelled));
        assert_eq!((first.wakes(), second.wakes()), (0, 1));
        let mut cx = Context::from_waker(&w2);
        assert!(matches!(
            Pin::new(&mut h).poll(&mut cx),
            Poll::Ready(Err(TaskError::Cancelled))
        ));
    }

    #[test]
    fn block_on_a_handle_completed_by_another_thread() {
        let (state, h) = pair();
        let completer = std::thread::spawn(move || {
            std::thread::yield_now();
            state.complete(Ok(99u64));
        });
        let (r, polls) = block_on(h);
        assert_eq!(r.unwrap(), 99);
        assert!(polls >= 1);
        completer.join().unwrap();
    }

    #[test]
    fn a_handle_dropped_before_completion_drops_the_result_once() {
        let drops = Drops::default();
        let (state, h) = pair();
        drop(h);
        state.complete(Ok(drops.make(1)));
        assert_eq!(drops.count(), 0, "kept in the slot until the state goes");
        drop(state);
        assert_eq!(drops.count(), 1);
    }

    #[test]
    fn a_handle_dropped_after_completion_drops_the_result_once() {
        let drops = Drops::default();
        let (state, h) = pair();
        let completer = std::thread::spawn({
            let v = drops.make(2);
            move || state.complete(Ok(v))
        });
        completer.join().unwrap();
        assert!(h.is_finished());
        drop(h);
        assert_eq!(drops.count(), 1);
    }
}
