//! A batch of taken items: completed, or put back where they were.

use super::*;

/// Items taken from a [`DistinctQueue`], in queue order (it dereferences to `[T]`). Call
/// [`complete`](Self::complete) when they are done; [`fail`](Self::fail) — or just dropping the
/// batch, also while unwinding from a panic — puts them back at their original queue positions.
///
/// ```
/// use keyserial::DistinctQueue;
///
/// let q = DistinctQueue::new();
/// q.add_all([1, 2, 3]);
/// let batch = q.take(2).unwrap();
/// assert_eq!(batch.len(), 2);
/// assert_eq!(batch.iter().sum::<i32>(), 3);
/// q.add(4);
/// batch.fail();
/// assert_eq!(q.queued(), vec![1, 2, 3, 4]);
/// ```
pub struct Batch<T: Hash + Eq + Clone + Send + 'static> {
    queue: DistinctQueue<T>,
    /// Empty once completed or failed (a live batch holds at least one item).
    items: Vec<T>,
}

impl<T: Hash + Eq + Clone + Send + 'static> Batch<T> {
    pub(super) fn new(queue: DistinctQueue<T>, items: Vec<T>) -> Self {
        Batch { queue, items }
    }

    /// The items are done: they leave the queue for good (equal items may be added again).
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    ///
    /// let q = DistinctQueue::new();
    /// q.add(1);
    /// q.take(1).unwrap().complete();
    /// assert!(q.is_empty() && q.in_progress().is_empty());
    /// assert!(q.add(1));
    /// ```
    pub fn complete(mut self) {
        let items = std::mem::take(&mut self.items);
        self.queue.complete_items(items);
    }

    /// The items were not done: they go back to their original queue positions (ahead of items
    /// added after them), to be taken again. The same as dropping the batch.
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    ///
    /// let q = DistinctQueue::new();
    /// q.add_all([1, 2]);
    /// let b = q.take(1).unwrap();
    /// b.fail();
    /// assert_eq!(q.queued(), vec![1, 2]);
    /// ```
    pub fn fail(mut self) {
        let items = std::mem::take(&mut self.items);
        self.queue.fail_items(items);
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> Deref for Batch<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.items
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> Drop for Batch<T> {
    fn drop(&mut self) {
        if !self.items.is_empty() {
            let items = std::mem::take(&mut self.items);
            self.queue.fail_items(items);
        }
    }
}

impl<T: Hash + Eq + Clone + Send + 'static + fmt::Debug> fmt::Debug for Batch<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Batch").field(&self.items).finish()
    }
}
