//! A ready queue: where chains that became active can wait for a worker, in an executor that
//! keeps them on a shared queue.
//!
//! **A building block for executors of your own**: keyserial's `Serializer` does not use it
//! (its ready work waits in lanes, [`crate::fifo`] and [`crate::lane`]), and the
//! no-allocator [`FixedSerializer`](crate::fixed::FixedSerializer) has its own ready ring
//! (`fixed/ready.rs`). [`BoundedQueue`] is a plain, safe MPMC queue of any `T`, usable on its own:
//! a fixed-capacity queue that needs no allocator (a `const` constructor, so it can live in a
//! `static`), on every target the crate supports. It is used by [`crate::recycle`]'s depot (the
//! `alloc` build, and through it keyserial's key table), and meant for executors without an
//! allocator. (An executor with an allocator that wants an unbounded ready queue can use
//! crossbeam-queue's `SegQueue` directly.)
//!
//! # `BoundedQueue` protocol
//!
//! A ring of `N` cells (`N` a power of two, at least 2) and two cache-padded counters, `tail` (next position
//! to write) and `head` (next position to read); positions grow forever (wrapping) and position
//! `p` lives in cell `p % N`. Each cell carries a sequence number, its *generation*, which says
//! whose turn it is and prevents ABA on the cell:
//!
//! ```text
//!  seq == p           cell is free for the producer of position p
//!  seq == p + 1       cell holds the value written at position p, for the consumer of p
//!  seq == p + N       the consumer of p is done: free for the producer of position p + N
//! ```
//!
//! - **push**: read `tail = p`; if the cell's `seq == p`, claim the position with
//!   `CAS(tail: p -> p + 1)`, write the value, then store `seq = p + 1` (release). If
//!   `seq < p` the ring is full (the value is handed back); if `seq > p` another producer won, retry.
//! - **pop**: read `head = p`; if `seq == p + 1`, claim with `CAS(head: p -> p + 1)`, read the
//!   value, then store `seq = p + N` (release). If `seq < p + 1` the queue is empty.
//!
//! Exactly one producer and one consumer win each position (the CAS on the counter), the value is
//! written before the release store that makes it visible and read after the acquire load that saw
//! it, and the cell is reused only after its consumer's release store, so nothing is lost or read
//! twice. Progress: the CASes make claiming lock-free; a thread stopped between claiming a cell and
//! publishing it makes that one cell look empty (to consumers) or full (to producers) until it
//! resumes, the same trade as crossbeam's `ArrayQueue`. Sequence numbers are stored relative to the
//! cell's index so that an all-zero ring is the initial state (which is what makes `new` `const`).

use core::fmt;
use core::mem::MaybeUninit;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicUsize, Ordering, UnsafeCell};

struct Cell<T> {
    /// The generation, stored as `seq - index` (wrapping) so that zero is the initial state.
    seq: AtomicUsize,
    value: UnsafeCell<MaybeUninit<T>>,
}

impl<T> Cell<T> {
    #[cfg(not(loom))]
    // Only used as the repeat operand of the `const` array initialiser (each element is a fresh
    // copy), which is exactly what this lint warns about but intends.
    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Self = Cell {
        seq: AtomicUsize::new(0),
        value: UnsafeCell::new(MaybeUninit::uninit()),
    };
}

/// A fixed-capacity, allocation-free MPMC queue (see the [module docs](self) for the protocol).
/// `N` must be a power of two and at least 2 (checked at compile time).
///
/// ```
/// use keyserial_core::ready::BoundedQueue;
/// static READY: BoundedQueue<u32, 4> = BoundedQueue::new();
/// READY.push(1).unwrap();
/// READY.push(2).unwrap();
/// assert_eq!(READY.pop(), Some(1));
/// assert_eq!(READY.pop(), Some(2));
/// assert_eq!(READY.pop(), None);
/// ```
pub struct BoundedQueue<T, const N: usize> {
    head: CachePadded<AtomicUsize>,
    tail: CachePadded<AtomicUsize>,
    cells: [Cell<T>; N],
}

// SAFETY: values move between threads through the queue; the protocol hands each cell to exactly
// one thread at a time, so `T: Send` suffices for both.
unsafe impl<T: Send, const N: usize> Send for BoundedQueue<T, N> {}
// SAFETY: as above.
unsafe impl<T: Send, const N: usize> Sync for BoundedQueue<T, N> {}

impl<T, const N: usize> BoundedQueue<T, N> {
    // With N == 1 "written at p" (seq p + 1) and "free for p + N" (seq p + N) coincide.
    const CHECK: () = assert!(
        N.is_power_of_two() && N >= 2,
        "BoundedQueue capacity must be a power of two, at least 2"
    );

    /// An empty queue.
    ///
    /// ```
    /// let q: keyserial_core::ready::BoundedQueue<u8, 8> = keyserial_core::ready::BoundedQueue::new();
    /// assert!(q.is_empty());
    /// ```
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK;
        BoundedQueue {
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            cells: [Cell::EMPTY; N],
        }
    }

    /// An empty queue.
    #[cfg(loom)]
    pub fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK;
        BoundedQueue {
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            cells: core::array::from_fn(|_| Cell {
                seq: AtomicUsize::new(0),
                value: UnsafeCell::new(MaybeUninit::uninit()),
            }),
        }
    }

    /// The capacity, `N`.
    ///
    /// ```
    /// assert_eq!(keyserial_core::ready::BoundedQueue::<u8, 16>::new().capacity(), 16);
    /// ```
    pub const fn capacity(&self) -> usize {
        N
    }

    #[inline]
    fn seq(&self, pos: usize) -> (&Cell<T>, usize) {
        let idx = pos & (N - 1);
        let cell = &self.cells[idx];
        (cell, cell.seq.load(Ordering::Acquire).wrapping_add(idx))
    }

    /// Appends `value`, or hands it back if the queue is full.
    ///
    /// ```
    /// let q = keyserial_core::ready::BoundedQueue::<u8, 2>::new();
    /// assert_eq!(q.push(1), Ok(()));
    /// assert_eq!(q.push(2), Ok(()));
    /// assert_eq!(q.push(3), Err(3));
    /// ```
    pub fn push(&self, value: T) -> Result<(), T> {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let (cell, seq) = self.seq(pos);
            let diff = seq.wrapping_sub(pos) as isize;
            if diff == 0 {
                match self.tail.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: the CAS gave this thread position `pos`; the cell's generation
                        // says its previous consumer is done, so nobody else touches the value.
                        cell.value.with_mut(|v| unsafe { (*v).write(value) });
                        let idx = pos & (N - 1);
                        cell.seq
                            .store(pos.wrapping_add(1).wrapping_sub(idx), Ordering::Release);
                        return Ok(());
                    }
                    Err(actual) => pos = actual,
                }
            } else if diff < 0 {
                return Err(value);
            } else {
                crate::sync::spin_hint();
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Takes the oldest value, if any.
    ///
    /// ```
    /// let q = keyserial_core::ready::BoundedQueue::<&str, 2>::new();
    /// q.push("a").unwrap();
    /// assert_eq!(q.pop(), Some("a"));
    /// assert_eq!(q.pop(), None);
    /// ```
    pub fn pop(&self) -> Option<T> {
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let (cell, seq) = self.seq(pos);
            let diff = seq.wrapping_sub(pos.wrapping_add(1)) as isize;
            if diff == 0 {
                match self.head.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: the CAS gave this thread position `pos`, whose value was
                        // published by the release store the acquire in `seq` observed.
                        let value = cell.value.with(|v| unsafe { (*v).assume_init_read() });
                        let idx = pos & (N - 1);
                        cell.seq
                            .store(pos.wrapping_add(N).wrapping_sub(idx), Ordering::Release);
                        return Some(value);
                    }
                    Err(actual) => pos = actual,
                }
            } else if diff < 0 {
                return None;
            } else {
                crate::sync::spin_hint();
                pos = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// The number of queued values (a snapshot).
    ///
    /// ```
    /// let q = keyserial_core::ready::BoundedQueue::<u8, 4>::new();
    /// q.push(1).unwrap();
    /// assert_eq!(q.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        loop {
            let tail = self.tail.load(Ordering::Acquire);
            let head = self.head.load(Ordering::Acquire);
            if self.tail.load(Ordering::Acquire) == tail {
                return tail.wrapping_sub(head).min(N);
            }
        }
    }

    /// `true` if nothing is queued (a snapshot).
    ///
    /// ```
    /// assert!(keyserial_core::ready::BoundedQueue::<u8, 4>::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T, const N: usize> Default for BoundedQueue<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const N: usize> Drop for BoundedQueue<T, N> {
    fn drop(&mut self) {
        while self.pop().is_some() {}
    }
}

impl<T, const N: usize> fmt::Debug for BoundedQueue<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundedQueue")
            .field("len", &self.len())
            .field("capacity", &N)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;
    use std::vec::Vec;

    #[test]
    fn fifo_full_and_wraparound() {
        let q = BoundedQueue::<u32, 4>::new();
        for round in 0..10u32 {
            for i in 0..4 {
                q.push(round * 10 + i).unwrap();
            }
            assert_eq!(q.push(99), Err(99));
            assert_eq!(q.len(), 4);
            for i in 0..4 {
                assert_eq!(q.pop(), Some(round * 10 + i));
            }
            assert_eq!(q.pop(), None);
        }
    }

    #[test]
    fn drop_drops_queued_values() {
        let token = Arc::new(());
        {
            let q = BoundedQueue::<Arc<()>, 8>::new();
            for _ in 0..5 {
                q.push(token.clone()).unwrap();
            }
            drop(q.pop());
        }
        assert_eq!(Arc::strong_count(&token), 1);
    }

    #[test]
    fn mpmc_loses_and_duplicates_nothing() {
        #[cfg(miri)]
        const PER: usize = 100;
        #[cfg(not(miri))]
        const PER: usize = 50_000;
        let q = Arc::new(BoundedQueue::<usize, 64>::new());
        let producers: Vec<_> = (0..2)
            .map(|p| {
                let q = q.clone();
                thread::spawn(move || {
                    for i in 0..PER {
                        let mut v = p * PER + i;
                        while let Err(back) = q.push(v) {
                            v = back;
                            thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                thread::spawn(move || {
                    let mut got = Vec::new();
                    while got.len() < PER {
                        match q.pop() {
                            Some(v) => got.push(v),
                            None => thread::yield_now(),
                        }
                    }
                    got
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        let mut all: Vec<usize> = consumers
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..2 * PER).collect::<Vec<_>>());
    }
}
