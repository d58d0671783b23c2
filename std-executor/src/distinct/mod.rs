//! A job queue without duplicates, where failed work goes back where it was.
//!
//! ```
//! use keyserial::DistinctQueue;
//!
//! let q = DistinctQueue::new();
//! assert!(q.add("refresh user 7"));
//! assert!(!q.add("refresh user 7")); // already queued
//! let batch = q.take(10).unwrap();
//! assert_eq!(&batch[..], ["refresh user 7"]);
//! assert!(!q.add("refresh user 7")); // in progress
//! batch.complete();
//! assert!(q.add("refresh user 7")); // done: may be queued again
//! ```
//!
//! # Protocol
//!
//! All state is under one mutex (no user code runs while it is held, apart from the item type's
//! `Hash`, `Eq` and `Clone`):
//!
//! - `members`: every item that is **queued or in progress**, with its sequence number and which
//!   of the two it is. This is what makes items unique: `add` is refused while an equal item is a
//!   member, and an item stops being a member only when its batch is completed.
//! - `queue`: the queued items by sequence number (a `BTreeMap<u64, T>`), so the oldest comes
//!   first. A sequence number is given once, when the item is added, and kept while it is in
//!   progress: a failed batch puts each item back **under its old number**, so it returns to its
//!   original position, ahead of everything added after it.
//! - `takers`: takers waiting for an item (blocked threads and pending [`Take`] futures), in
//!   arrival order, each with a way to wake it.
//!
//! An item's life: *absent* ─`add`→ *queued* ─`take`→ *in progress* ─`complete`→ *absent*, or
//! ─`fail`/drop→ *queued* (same position). Every transition happens under the lock and moves the
//! item between exactly two places, so no item is lost or duplicated, and the `members` entry
//! exists exactly while the item is queued or in progress.
//!
//! **Wakeups.** A taker that finds the queue empty registers itself and sleeps (a thread parks;
//! a future returns `Pending`). Whoever makes items available (`add`, `add_all`, a failed batch)
//! removes up to as many registered takers as it added items and wakes them after unlocking. A
//! woken taker is no longer registered ("notified"); it re-checks the queue: it takes items, or,
//! if others took them first, registers again under its old number (keeping its place). The
//! invariant is: *whenever items are queued while takers sleep, some notified taker has yet to
//! check the queue.* It holds because takers only register when the queue is empty, every
//! operation that adds items notifies one, every take that leaves items behind notifies one more,
//! and a notified taker that leaves without taking (a dropped `Take`) passes its notification on
//! if items are queued. A taker whose timeout expires leaves only after seeing an empty queue,
//! so it has nothing to pass on. `close` wakes every registered taker. Blocked threads wait on
//! a parker of their own rather than a shared condvar, so each wakeup goes to one chosen taker
//! (the one waiting longest). Takers are not ordered among themselves beyond that: one that
//! arrives while items are queued takes them at once.
//!
//! After `close`: `add` refuses everything; takers get the queued items, then `None` once the
//! queue is empty. Batches in progress can still be completed or failed; failed items go back and
//! can still be taken.

mod batch;
mod take;

pub use batch::Batch;
pub use take::Take;

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::ops::Deref;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::sync::{lock, Arc, Mutex, MutexGuard, Parker, Wakeup};

/// A multi-producer, multi-consumer queue of unique items, taken in batches.
///
/// An item (by `Eq`) is accepted only if no equal item is queued or in progress. Takers get the
/// oldest items first, as a [`Batch`] that they [`complete`](Batch::complete) (the items are done
/// and may be added again later) or [`fail`](Batch::fail) (the items go back to where they were in
/// the queue; dropping a batch, also during a panic, does the same). Clones share one queue.
///
/// ```
/// use keyserial::DistinctQueue;
/// use std::thread;
///
/// let q = DistinctQueue::new();
/// let consumer = {
///     let q = q.clone();
///     thread::spawn(move || {
///         let mut done = Vec::new();
///         while let Some(batch) = q.take(8) {
///             done.extend(batch.iter().copied());
///             batch.complete();
///         }
///         done
///     })
/// };
/// for i in 0..100 {
///     q.add(i % 10); // duplicates of queued items are dropped
/// }
/// q.close();
/// let done = consumer.join().unwrap();
/// assert!(done.len() >= 10 && done.len() <= 100);
/// ```
pub struct DistinctQueue<T> {
    inner: Arc<Mutex<State<T>>>,
}

struct Member {
    seq: u64,
    in_progress: bool,
}

struct State<T> {
    members: HashMap<T, Member>,
    queue: BTreeMap<u64, T>,
    next_seq: u64,
    takers: BTreeMap<u64, Wakeup>,
    next_taker: u64,
    closed: bool,
}

impl<T: Hash + Eq> State<T> {
    /// Takes up to `max` (at least 1) of the oldest queued items, marking them in progress.
    fn take_now(&mut self, max: usize) -> Option<Vec<T>> {
        if self.queue.is_empty() {
            return None;
        }
        let max = max.max(1);
        let mut items = Vec::with_capacity(max.min(self.queue.len()));
        while items.len() < max {
            let Some((_, item)) = self.queue.pop_first() else {
                break;
            };
            if let Some(m) = self.members.get_mut(&item) {
                m.in_progress = true;
            }
            items.push(item);
        }
        Some(items)
    }

    /// Unregisters up to `k` takers, oldest first, for waking after unlock.
    fn notify(&mut self, k: usize, out: &mut Vec<Wakeup>) {
        for _ in 0..k {
            match self.takers.pop_first() {
                Some((_, w)) => out.push(w),
                None => break,
            }
        }
    }

    /// After a take: if items are left, pass a wakeup on.
    fn after_take(&mut self, out: &mut Vec<Wakeup>) {
        if !self.queue.is_empty() {
            self.notify(1, out);
        }
    }

    fn taker_id(&mut self) -> u64 {
        let id = self.next_taker;
        self.next_taker += 1;
        id
    }

    /// Puts failed items back under their own sequence numbers.
    fn put_back(&mut self, items: Vec<T>, out: &mut Vec<Wakeup>) {
        let n = items.len();
        for item in items {
            match self.members.get_mut(&item) {
                Some(m) if m.in_progress => {
                    m.in_progress = false;
                    let seq = m.seq;
                    self.queue.insert(seq, item);
                }
                // Unreachable while the Eq/Hash impls are consistent: only a batch removes its
                // items from `members`.
                _ => debug_assert!(false, "a batch item is not in progress"),
            }
        }
        self.notify(n, out);
    }
}

fn wake_all(wakes: Vec<Wakeup>) {
    wakes.into_iter().for_each(Wakeup::wake);
}

impl<T> Clone for DistinctQueue<T> {
    fn clone(&self) -> Self {
        DistinctQueue {
            inner: self.inner.clone(),
        }
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> Default for DistinctQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> DistinctQueue<T> {
    /// An empty, open queue.
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    ///
    /// let q: DistinctQueue<u32> = DistinctQueue::new();
    /// assert!(q.is_empty());
    /// ```
    pub fn new() -> Self {
        DistinctQueue {
            inner: Arc::new(Mutex::new(State {
                members: HashMap::new(),
                queue: BTreeMap::new(),
                next_seq: 0,
                takers: BTreeMap::new(),
                next_taker: 0,
                closed: false,
            })),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<T>> {
        lock(&self.inner)
    }

    /// Queues `item` at the back; `false` (and `item` is dropped) if an equal item is queued or in
    /// progress, or the queue is closed.
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    ///
    /// let q = DistinctQueue::new();
    /// assert!(q.add(1));
    /// assert!(!q.add(1));
    /// q.close();
    /// assert!(!q.add(2));
    /// ```
    pub fn add(&self, item: T) -> bool {
        self.add_all(std::iter::once(item)).is_empty()
    }

    /// Queues each item in turn like [`add`](Self::add), under one lock; returns the rejected
    /// ones (duplicates of queued or in-progress items, including of earlier items of the same
    /// call, or everything if closed), in their order.
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    ///
    /// let q = DistinctQueue::new();
    /// q.add(2);
    /// assert_eq!(q.add_all([1, 2, 3, 1]), vec![2, 1]);
    /// assert_eq!(q.queued(), vec![2, 1, 3]);
    /// ```
    pub fn add_all<I: IntoIterator<Item = T>>(&self, items: I) -> Vec<T> {
        let mut rejected = Vec::new();
        let mut wakes = Vec::new();
        {
            let mut st = self.state();
            let mut added = 0;
            for item in items {
                if st.closed {
                    rejected.push(item);
                    continue;
                }
                if st.members.contains_key(&item) {
                    rejected.push(item);
                    continue;
                }
                let seq = st.next_seq;
                st.next_seq += 1;
                st.members.insert(
                    item.clone(),
                    Member {
                        seq,
                        in_progress: false,
                    },
                );
                st.queue.insert(seq, item);
                added += 1;
            }
            st.notify(added, &mut wakes);
        }
        wake_all(wakes);
        rejected
    }

    /// Takes between 1 and `max` of the oldest queued items (`max == 0` counts as 1), waiting
    /// until at least one is queued. `None` once the queue is closed and empty.
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    ///
    /// let q = DistinctQueue::new();
    /// q.add_all(["a", "b", "c"]);
    /// let batch = q.take(2).unwrap();
    /// assert_eq!(&batch[..], ["a", "b"]);
    /// batch.complete();
    /// q.close();
    /// assert_eq!(&q.take(2).unwrap()[..], ["c"]); // dropped: goes back
    /// assert_eq!(&q.take(2).unwrap()[..], ["c"]);
    /// ```
    pub fn take(&self, max: usize) -> Option<Batch<T>> {
        self.take_blocking(max, None)
    }

    /// Takes at once what [`take`](Self::take) would, or `None` if nothing is queued.
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    ///
    /// let q = DistinctQueue::new();
    /// assert!(q.try_take(1).is_none());
    /// q.add(5);
    /// assert_eq!(&q.try_take(0).unwrap()[..], [5]);
    /// ```
    pub fn try_take(&self, max: usize) -> Option<Batch<T>> {
        let mut wakes = Vec::new();
        let items = {
            let mut st = self.state();
            let items = st.take_now(max);
            if items.is_some() {
                st.after_take(&mut wakes);
            }
            items
        };
        wake_all(wakes);
        items.map(|items| Batch::new(self.clone(), items))
    }

    /// Like [`take`](Self::take), but gives up with `None` after `timeout` (or at once if the
    /// queue is closed and empty).
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    /// use std::time::Duration;
    ///
    /// let q: DistinctQueue<u8> = DistinctQueue::new();
    /// assert!(q.take_timeout(1, Duration::from_millis(5)).is_none());
    /// ```
    pub fn take_timeout(&self, max: usize, timeout: Duration) -> Option<Batch<T>> {
        // A timeout too large for `Instant` waits without a deadline.
        self.take_blocking(max, Instant::now().checked_add(timeout))
    }

    fn take_blocking(&self, max: usize, deadline: Option<Instant>) -> Option<Batch<T>> {
        let mut parker: Option<Parker> = None;
        // Our registration number, kept across wakeups (so we keep our place).
        let mut id: Option<u64> = None;
        let mut parked = false;
        let mut st = self.state();
        loop {
            if let Some(items) = st.take_now(max) {
                let mut wakes = Vec::new();
                if let Some(id) = id {
                    st.takers.remove(&id);
                }
                st.after_take(&mut wakes);
                drop(st);
                wake_all(wakes);
                return Some(Batch::new(self.clone(), items));
            }
            // The queue is empty: nothing to pass on if we leave now.
            let expired = match deadline {
                // Under loom, `park_timeout` returns at once: the first one models expiry.
                Some(d) => Instant::now() >= d || (cfg!(loom) && parked),
                None => false,
            };
            if st.closed || expired {
                let old = id.and_then(|id| st.takers.remove(&id));
                drop(st);
                drop(old);
                return None;
            }
            let p = parker.get_or_insert_with(Parker::new);
            let my = match id {
                Some(my) => my,
                None => *id.insert(st.taker_id()),
            };
            if let Entry::Vacant(v) = st.takers.entry(my) {
                v.insert(Wakeup::Thread(p.unparker().clone()));
            }
            drop(st);
            match deadline {
                None => p.park(),
                Some(d) => {
                    p.park_timeout(d.saturating_duration_since(Instant::now()));
                    parked = true;
                }
            }
            st = self.state();
        }
    }

    /// A future that resolves like [`take`](Self::take): to a batch once an item is queued, or
    /// to `None` once the queue is closed and empty. Dropping it gives up its place without
    /// losing a wakeup meant for it (another taker gets it).
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
    /// let q = DistinctQueue::new();
    /// let mut take = pin!(q.take_async(4));
    /// assert!(take.as_mut().poll(&mut cx).is_pending());
    /// q.add(1);
    /// match take.as_mut().poll(&mut cx) {
    ///     Poll::Ready(Some(batch)) => assert_eq!(&batch[..], [1]),
    ///     _ => panic!("expected a batch"),
    /// }
    /// ```
    pub fn take_async(&self, max: usize) -> Take<T> {
        Take {
            queue: self.clone(),
            max,
            id: None,
            done: false,
        }
    }

    /// The queued items, oldest first (a snapshot; in-progress items are not included).
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    ///
    /// let q = DistinctQueue::new();
    /// q.add_all([3, 1, 2]);
    /// assert_eq!(q.queued(), vec![3, 1, 2]);
    /// ```
    pub fn queued(&self) -> Vec<T> {
        self.state().queue.values().cloned().collect()
    }

    /// The items in progress (taken, not yet completed or failed), in their queue order.
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    ///
    /// let q = DistinctQueue::new();
    /// q.add_all([1, 2, 3]);
    /// let b = q.take(2).unwrap();
    /// assert_eq!(q.in_progress(), vec![1, 2]);
    /// b.complete();
    /// assert!(q.in_progress().is_empty());
    /// ```
    pub fn in_progress(&self) -> Vec<T> {
        let st = self.state();
        let mut items: Vec<(u64, T)> = st
            .members
            .iter()
            .filter(|(_, m)| m.in_progress)
            .map(|(item, m)| (m.seq, item.clone()))
            .collect();
        drop(st);
        items.sort_unstable_by_key(|(seq, _)| *seq);
        items.into_iter().map(|(_, item)| item).collect()
    }

    /// The number of queued items (not counting those in progress).
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    ///
    /// let q = DistinctQueue::new();
    /// q.add_all([1, 2]);
    /// let _b = q.take(1).unwrap();
    /// assert_eq!(q.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.state().queue.len()
    }

    /// Whether no item is queued (items may still be in progress).
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    ///
    /// let q = DistinctQueue::new();
    /// assert!(q.is_empty());
    /// q.add(1);
    /// assert!(!q.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.state().queue.is_empty()
    }

    /// Closes the queue: `add` refuses everything from now on, and takers get what is queued, then
    /// `None`. Wakes every waiting taker. Batches in progress can still be completed or failed
    /// (failed items go back and can still be taken).
    ///
    /// ```
    /// use keyserial::DistinctQueue;
    ///
    /// let q = DistinctQueue::new();
    /// q.add(1);
    /// q.close();
    /// assert!(!q.add(2));
    /// q.take(1).unwrap().complete();
    /// assert!(q.take(1).is_none());
    /// ```
    pub fn close(&self) {
        let wakes = {
            let mut st = self.state();
            st.closed = true;
            std::mem::take(&mut st.takers)
        };
        wakes.into_values().for_each(Wakeup::wake);
    }

    /// A batch completed: its items stop being members (they may be added again).
    fn complete_items(&self, items: Vec<T>) {
        // The members' keys and the items are dropped after unlocking (destructors are user
        // code).
        let mut removed = Vec::with_capacity(items.len());
        {
            let mut st = self.state();
            for item in &items {
                if let Some((key, _)) = st.members.remove_entry(item) {
                    removed.push(key);
                }
            }
        }
        drop(items);
        drop(removed);
    }

    /// A batch failed (or was dropped): its items go back to their old positions.
    fn fail_items(&self, items: Vec<T>) {
        let mut wakes = Vec::new();
        self.state().put_back(items, &mut wakes);
        wake_all(wakes);
    }
}

impl<T> fmt::Debug for DistinctQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = lock(&self.inner);
        f.debug_struct("DistinctQueue")
            .field("queued", &st.queue.len())
            .field(
                "in_progress",
                &(st.members.len().saturating_sub(st.queue.len())),
            )
            .field("closed", &st.closed)
            .finish()
    }
}
