//! A lane's FIFO under loom (`lanes.rs` uses it in place of core's `Fifo` under `cfg(loom)`).
//!
//! A `VecDeque` under a loom mutex holds the items, and a length word mirrors the real FIFO's
//! positions (`loom/tests/fifo.rs` models the real one on its own), so that the models in
//! `loom/tests/lanes.rs` check the lanes' wake-up protocol over the same orderings the real
//! queue gives it, and no more (see [`Fifo`]).

use crate::sync::{AtomicBool, AtomicUsize, Ordering};

/// A lane's FIFO under loom: a `VecDeque` under a loom mutex holds the items, and a length word
/// mirrors the real FIFO's positions (`loom/tests/fifo.rs` models the real one on its own):
/// `push` raises it with a `SeqCst` RMW (as `Fifo::push` CASes its tail position, `SeqCst`) and
/// `is_empty` reads it without the lock (as `Fifo::is_empty` loads the positions, `SeqCst`). The
/// emptiness check therefore synchronises with nothing but that word, as with the real queue:
/// the lock must not lend the "Waking for a push" protocol a happens-before the real queue does
/// not give it. (The real `pop` advances its head with a Release store, so a reader may see a
/// popped item as still queued; nothing here relies on seeing a pop, only on seeing a push.)
pub struct Fifo<T> {
    items: crate::sync::Mutex<std::collections::VecDeque<(keyserial_core::fifo::Tag, T)>>,
    /// `items.len()`, changed under the lock, read without it.
    len: AtomicUsize,
    /// Items ever pushed, and whether it is closed: changed under the lock.
    pushed: AtomicUsize,
    closed: AtomicBool,
}

impl<T> Default for Fifo<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Fifo<T> {
    /// An empty FIFO.
    pub fn new() -> Self {
        Fifo {
            items: crate::sync::Mutex::new(std::collections::VecDeque::new()),
            len: AtomicUsize::new(0),
            pushed: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
        }
    }

    /// Appends `item`.
    pub fn push(&self, item: T) {
        self.push_with(move || item);
    }

    /// Appends the item `make` returns (as `Fifo::push_with`).
    pub fn push_with(&self, make: impl FnOnce() -> T) {
        if self.try_push_with(make).is_err() {
            panic!("push onto a closed Fifo");
        }
    }

    /// As `Fifo::try_push_with`: `make` handed back uncalled once closed.
    pub fn try_push_with<F: FnOnce() -> T>(&self, make: F) -> Result<(), F> {
        let mut items = crate::sync::lock(&self.items);
        if self.closed.load(Ordering::Relaxed) {
            return Err(make);
        }
        items.push_back((keyserial_core::fifo::UNTAGGED, make()));
        self.pushed.fetch_add(1, Ordering::Relaxed);
        self.len.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// As `Fifo::try_push_tagged`: `make` handed back uncalled once closed.
    pub fn try_push_tagged<F: FnOnce() -> (keyserial_core::fifo::Tag, T)>(
        &self,
        make: F,
    ) -> Result<(), F> {
        let mut items = crate::sync::lock(&self.items);
        if self.closed.load(Ordering::Relaxed) {
            return Err(make);
        }
        items.push_back(make());
        self.pushed.fetch_add(1, Ordering::Relaxed);
        self.len.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// As `Fifo::close`.
    pub fn close(&self) {
        let _items = crate::sync::lock(&self.items);
        self.closed.store(true, Ordering::Relaxed);
    }

    /// As `Fifo::popped`.
    pub fn popped(&self) -> usize {
        let items = crate::sync::lock(&self.items);
        self.pushed.load(Ordering::Relaxed) - items.len()
    }

    /// As `Fifo::pushed`.
    pub fn pushed(&self) -> usize {
        let _items = crate::sync::lock(&self.items);
        self.pushed.load(Ordering::Relaxed)
    }

    /// Takes the oldest item, if any.
    ///
    /// # Safety
    ///
    /// As `Fifo::pop`: one popper at a time (here the lock would forgive it; the real FIFO
    /// does not).
    pub unsafe fn pop(&self) -> Option<T> {
        // SAFETY: the caller's contract.
        unsafe { self.pop_tagged() }.map(|(_, item)| item)
    }

    /// As `Fifo::for_each_queued_mut` (the popper's in-place walk).
    ///
    /// # Safety
    ///
    /// As `Fifo::for_each_queued_mut`.
    pub unsafe fn for_each_queued_mut(
        &self,
        mut f: impl FnMut(&mut keyserial_core::fifo::Tag, &mut T),
    ) {
        let mut items = crate::sync::lock(&self.items);
        for (tag, item) in items.iter_mut() {
            f(tag, item);
        }
    }

    /// As `Fifo::pop_tagged`: the oldest item with its tag.
    ///
    /// # Safety
    ///
    /// As [`pop`](Self::pop).
    pub unsafe fn pop_tagged(&self) -> Option<(keyserial_core::fifo::Tag, T)> {
        let mut items = crate::sync::lock(&self.items);
        let item = items.pop_front();
        if item.is_some() {
            self.len.fetch_sub(1, Ordering::SeqCst);
        }
        item
    }

    /// As `Fifo::peek_with`: `f` on the oldest item, left in place.
    ///
    /// # Safety
    ///
    /// As [`pop`](Self::pop).
    pub unsafe fn peek_with<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        crate::sync::lock(&self.items)
            .front()
            .map(|(_, item)| f(item))
    }

    /// As `Fifo::peek_tagged`: `f` on the oldest item and its tag, left in place.
    ///
    /// # Safety
    ///
    /// As [`pop`](Self::pop).
    pub unsafe fn peek_tagged<R>(
        &self,
        f: impl FnOnce(keyserial_core::fifo::Tag, &T) -> R,
    ) -> Option<R> {
        crate::sync::lock(&self.items)
            .front()
            .map(|(tag, item)| f(*tag, item))
    }

    /// Whether it holds no item (a snapshot, without the lock).
    pub fn is_empty(&self) -> bool {
        self.len.load(Ordering::SeqCst) == 0
    }

    /// How many items it holds (a snapshot, without the lock).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::SeqCst)
    }
}
