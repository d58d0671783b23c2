//! `DistinctQueue::take_async`'s future.

use super::*;

/// The future of [`DistinctQueue::take_async`]: resolves to a batch, or to `None` once the queue
/// is closed and empty. Dropping it while it waits gives up its place; a wakeup it had received
/// goes to another taker. Polling it again after it resolved panics.
///
/// ```
/// use keyserial::DistinctQueue;
/// use std::future::Future;
/// use std::pin::pin;
/// use std::sync::Arc;
/// use std::task::{Context, Poll, Wake, Waker};
///
/// struct Noop;
/// impl Wake for Noop {
///     fn wake(self: Arc<Self>) {}
/// }
/// let waker = Waker::from(Arc::new(Noop));
/// let mut cx = Context::from_waker(&waker);
///
/// let q: DistinctQueue<u8> = DistinctQueue::new();
/// q.close();
/// assert!(matches!(pin!(q.take_async(1)).poll(&mut cx), Poll::Ready(None)));
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct Take<T: Hash + Eq + Clone + Send + 'static> {
    pub(super) queue: DistinctQueue<T>,
    pub(super) max: usize,
    /// Our registration number once we had to wait (kept to keep our place).
    pub(super) id: Option<u64>,
    pub(super) done: bool,
}

impl<T: Hash + Eq + Clone + Send + 'static> Future for Take<T> {
    type Output = Option<Batch<T>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        assert!(!this.done, "`Take` polled after completion");
        let waker = cx.waker().clone();
        let mut wakes = Vec::new();
        let mut st = this.queue.state();
        if let Some(items) = st.take_now(this.max) {
            let old = this.id.take().and_then(|id| st.takers.remove(&id));
            st.after_take(&mut wakes);
            drop(st);
            drop(old);
            drop(waker);
            wake_all(wakes);
            this.done = true;
            return Poll::Ready(Some(Batch::new(this.queue.clone(), items)));
        }
        if st.closed {
            let old = this.id.take().and_then(|id| st.takers.remove(&id));
            drop(st);
            drop(old);
            drop(waker);
            this.done = true;
            return Poll::Ready(None);
        }
        let id = match this.id {
            Some(id) => id,
            None => *this.id.insert(st.taker_id()),
        };
        let old = st.takers.insert(id, Wakeup::Task(waker));
        drop(st);
        drop(old);
        Poll::Pending
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> Drop for Take<T> {
    fn drop(&mut self) {
        let Some(id) = self.id else { return };
        let mut wakes = Vec::new();
        let old = {
            let mut st = self.queue.state();
            let old = st.takers.remove(&id);
            if old.is_none() {
                // We were notified but will never look: pass the wakeup on.
                st.after_take(&mut wakes);
            }
            old
        };
        drop(old);
        wake_all(wakes);
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> fmt::Debug for Take<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Take")
            .field("max", &self.max)
            .field("waiting", &self.id.is_some())
            .finish()
    }
}
