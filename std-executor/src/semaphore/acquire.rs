//! `Semaphore::acquire_async`'s future.

use super::*;

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

impl Acquire {
    /// A request for `n` permits of `sem`, not queued until first polled.
    pub(super) fn new(sem: Semaphore, n: usize) -> Acquire {
        Acquire {
            sem,
            n,
            state: AcquireState::Start,
        }
    }
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
