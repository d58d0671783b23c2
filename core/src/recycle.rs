//! Recycling of fixed-size blocks between threads (`alloc` feature): a *magazine* cache.
//!
//! **A building block**: keyserial's executor allocates its task nodes and key-table entries
//! through it (as an [`EntryAlloc`](crate::table::EntryAlloc)); an executor of your own can do the
//! same. [`Cache::free`] is `unsafe` because it trusts the block's origin and layout.
//!
//! # Why
//!
//! A serializer allocates one task node per submission on the submitting thread and frees it on
//! a worker thread. That producer/consumer pattern is the worst case of general-purpose
//! allocators' per-thread caches: the producer's cache is always empty, the consumer's always
//! full, so every allocation and every free falls through to the shared (locked) arena. Profiled
//! on glibc, that was a third of the submitting thread's time (`BENCHMARKS.md`). Here freed
//! blocks travel back to the allocating thread in batches, one shared-queue operation per
//! [`BATCH`] blocks.
//!
//! # Shape
//!
//! - A **magazine** is a private, intrusive singly-linked list of at most [`BATCH`] free blocks
//!   of one size class, linked through each block's first word.
//! - A [`Cache`] is one thread's pair of magazines, `current` and `spare`.
//! - A [`Depot`] is the shared store of magazines of one size class: a
//!   [`BoundedQueue`] of `N` magazines.
//!
//! ```text
//! alloc: current non-empty        -> pop a block from it
//!        else spare non-empty     -> swap current and spare, pop
//!        else depot has a magazine-> it becomes current, pop
//!        else                     -> a fresh block from the global allocator
//! free:  current not full         -> push the block onto it
//!        else spare empty         -> current becomes spare, push onto a new current
//!        else                     -> spare goes to the depot (or, depot full, back to the global
//!                                    allocator), current becomes spare, push onto a new current
//! drop of a Cache: both magazines go to the depot, or back to the global allocator
//! ```
//!
//! # Concurrency
//!
//! There is no new atomic protocol: a magazine is owned by exactly one party at a time, a cache
//! (one thread) or one depot cell, and moves between them whole through the depot's queue, whose
//! own protocol (checked in `loom/tests/bounded_queue.rs`) hands each cell to one thread at a
//! time. So a free block is in exactly one magazine, and a block handed out by [`Cache::alloc`]
//! is in none until it is given back with [`Cache::free`]: no block is handed out twice. The loom
//! model `loom/tests/recycle.rs` runs two caches over one depot and checks exactly that.
//!
//! # Memory bound
//!
//! At most `2 × BATCH` blocks per cache (per thread and size class) plus `N × BATCH` in the
//! depot; anything beyond goes back to the global allocator at once.
//!
//! # When the depot gives its memory back
//!
//! A depot that is dropped frees every block it holds. A depot in a `static` is never dropped,
//! so it also counts its *users*: a cache becomes one the first time it may hand the depot a
//! magazine (its first rotation, or its drop) and stops being one when it is dropped. The cache
//! whose drop takes the count to zero empties the depot into the global allocator. So once every
//! cache over a static depot is gone (every thread that used it has ended and run its
//! thread-local destructors), the depot holds no memory: nothing is left for a leak checker
//! (Miri's) to find, and a process that stops using the caches gets their memory back. A cache
//! created again later simply starts over. Emptying races harmlessly with a cache that becomes a
//! user meanwhile: the emptier may free a magazine that cache just stored (both are free
//! blocks, owned by whoever pops them), which costs a later allocation, never a block.
//!
//! Why not let the leak checker find the blocks through the static instead: the blocks reach
//! the depot through pointers that went through the chains' tagged words (exposed-provenance
//! casts), so the links stored in them carry no provenance a checker could follow, and "still
//! reachable" would be a claim nobody checks. Counting users makes the depot's memory go back
//! for real.

use alloc::alloc::{alloc, dealloc, handle_alloc_error};
use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;

use crate::ready::BoundedQueue;
use crate::sync::{AtomicUsize, Ordering};

/// Blocks per magazine: the unit in which blocks move between a [`Cache`] and its [`Depot`], and
/// of the memory bound in the module docs (at most `2 * BATCH` blocks per cache). Size a
/// workload, or a depot's `N`, in magazines with it.
///
/// ```
/// use core::alloc::Layout;
/// use keyserial_core::recycle::{Cache, Depot, BATCH};
/// let depot: Depot<4> = Depot::new(Layout::new::<u64>());
/// let mut cache = Cache::new(&depot);
/// let blocks: Vec<_> = (0..2 * BATCH + 1).map(|_| cache.alloc()).collect();
/// for b in blocks {
///     unsafe { cache.free(b) }; // SAFETY: from this depot's class, no longer used.
/// }
/// // Two magazines stay with the cache; the first full one beyond them went to the depot.
/// assert_eq!((cache.cached(), depot.magazines()), (BATCH + 1, 1));
/// ```
#[cfg(not(loom))]
pub const BATCH: usize = 32;
/// Blocks per magazine (tiny under loom, where every depot access is a modelled branch; same
/// code paths).
#[cfg(loom)]
pub const BATCH: usize = 2;

/// A free block: while it is in a magazine its first word links to the next free block.
struct FreeBlock {
    next: Option<NonNull<FreeBlock>>,
}

/// An intrusive list of at most [`BATCH`] free blocks, owned by whoever holds the value.
struct Magazine {
    head: Option<NonNull<FreeBlock>>,
    len: usize,
}

// SAFETY: a magazine owns its blocks exclusively (no other pointer to a free block is used), so
// it may move to another thread with them.
unsafe impl Send for Magazine {}

impl Magazine {
    const EMPTY: Magazine = Magazine { head: None, len: 0 };

    fn is_full(&self) -> bool {
        self.len == BATCH
    }

    /// # Safety
    /// `block` is a free block of this magazine's size class, owned by the caller, at least
    /// pointer-sized and pointer-aligned.
    unsafe fn push(&mut self, block: NonNull<u8>) {
        debug_assert!(self.len < BATCH);
        let block = block.cast::<FreeBlock>();
        // SAFETY: per the contract the block is ours and large and aligned enough for a link.
        unsafe {
            block.as_ptr().write(FreeBlock { next: self.head });
        }
        self.head = Some(block);
        self.len += 1;
    }

    fn pop(&mut self) -> Option<NonNull<u8>> {
        let block = self.head?;
        // SAFETY: every block on the list was written by `push` and is owned by this magazine.
        self.head = unsafe { block.as_ref() }.next;
        self.len -= 1;
        Some(block.cast())
    }

    /// Returns every block to the global allocator.
    ///
    /// # Safety
    /// The blocks were allocated with `layout`.
    unsafe fn release(&mut self, layout: Layout) {
        while let Some(block) = self.pop() {
            // SAFETY: per the contract; the block left the list, nobody else refers to it.
            unsafe { dealloc(block.as_ptr(), layout) }
        }
    }
}

/// The shared store of one size class's magazines: at most `N` of them (a power of two, ≥ 2).
///
/// ```
/// use core::alloc::Layout;
/// use keyserial_core::recycle::{Cache, Depot};
/// static DEPOT: Depot<8> = Depot::new(Layout::new::<[u64; 8]>());
/// let mut cache = Cache::new(&DEPOT);
/// let block = cache.alloc();
/// // SAFETY: `block` came from this cache's class and we are done with it.
/// unsafe { cache.free(block) };
/// ```
pub struct Depot<const N: usize> {
    layout: Layout,
    magazines: BoundedQueue<Magazine, N>,
    /// Caches that may still hand this depot a magazine (see the module docs, "When the depot
    /// gives its memory back").
    users: AtomicUsize,
}

impl<const N: usize> Depot<N> {
    const CHECK: () = assert!(
        N.is_power_of_two() && N >= 2,
        "Depot capacity must be a power of two, at least 2"
    );

    /// A depot for blocks of `layout` (rounded up to hold a pointer).
    ///
    /// ```
    /// # use core::alloc::Layout;
    /// let depot: keyserial_core::recycle::Depot<4> = keyserial_core::recycle::Depot::new(Layout::new::<u128>());
    /// assert_eq!(depot.layout().size(), 16);
    /// ```
    #[cfg(not(loom))]
    pub const fn new(layout: Layout) -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK;
        Depot {
            layout: block_layout(layout),
            magazines: BoundedQueue::new(),
            users: AtomicUsize::new(0),
        }
    }

    /// A depot for blocks of `layout` (rounded up to hold a pointer).
    #[cfg(loom)]
    pub fn new(layout: Layout) -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK;
        Depot {
            layout: block_layout(layout),
            magazines: BoundedQueue::new(),
            users: AtomicUsize::new(0),
        }
    }

    /// The layout of every block of this depot.
    ///
    /// ```
    /// # use core::alloc::Layout;
    /// let depot: keyserial_core::recycle::Depot<4> = keyserial_core::recycle::Depot::new(Layout::new::<u8>());
    /// assert!(depot.layout().size() >= core::mem::size_of::<usize>());
    /// ```
    pub const fn layout(&self) -> Layout {
        self.layout
    }

    /// Stores a magazine, or frees its blocks if the depot is full.
    fn put(&self, magazine: Magazine) {
        if magazine.len == 0 {
            return;
        }
        if let Err(mut rejected) = self.magazines.push(magazine) {
            // SAFETY: every magazine of this depot holds blocks of `self.layout`.
            unsafe { rejected.release(self.layout) };
        }
    }
}

impl<const N: usize> Depot<N> {
    /// A cache becomes a user: until it [`leaves`](Self::leave) the depot is not emptied.
    fn join(&self) {
        self.users.fetch_add(1, Ordering::Relaxed);
    }

    /// A user is gone; the last one empties the depot. `AcqRel`: the last user's emptying sees
    /// every magazine the other users stored before they left (each store happens before its
    /// user's decrement, which the last decrement reads through the release sequence).
    fn leave(&self) {
        if self.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.empty();
        }
    }

    /// Frees every block the depot holds.
    fn empty(&self) {
        while let Some(mut magazine) = self.magazines.pop() {
            // SAFETY: every magazine of this depot holds blocks of `self.layout`; the pop made
            // it ours alone.
            unsafe { magazine.release(self.layout) };
        }
    }

    /// How many magazines the depot holds now (a snapshot, for tests and diagnostics).
    ///
    /// ```
    /// # use core::alloc::Layout;
    /// # use keyserial_core::recycle::{Cache, Depot};
    /// let depot: Depot<2> = Depot::new(Layout::new::<u64>());
    /// let cache = Cache::new(&depot);
    /// assert_eq!(depot.magazines(), 0);
    /// drop(cache); // the last user gone, the depot is empty again
    /// assert_eq!(depot.magazines(), 0);
    /// ```
    pub fn magazines(&self) -> usize {
        self.magazines.len()
    }
}

impl<const N: usize> Drop for Depot<N> {
    fn drop(&mut self) {
        self.empty();
    }
}

impl<const N: usize> fmt::Debug for Depot<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Depot")
            .field("layout", &self.layout)
            .field("magazines", &self.magazines.len())
            .finish()
    }
}

/// A block layout able to hold a free-list link.
const fn block_layout(layout: Layout) -> Layout {
    let word = Layout::new::<FreeBlock>();
    let size = if layout.size() > word.size() {
        layout.size()
    } else {
        word.size()
    };
    let align = if layout.align() > word.align() {
        layout.align()
    } else {
        word.align()
    };
    match Layout::from_size_align(size, align) {
        Ok(l) => l,
        Err(_) => panic!("block layout overflows"),
    }
}

/// One thread's cache of free blocks of one depot's size class.
///
/// ```
/// use core::alloc::Layout;
/// use keyserial_core::recycle::{Cache, Depot};
/// static DEPOT: Depot<4> = Depot::new(Layout::new::<[u8; 64]>());
/// let mut cache = Cache::new(&DEPOT);
/// let a = cache.alloc();
/// // SAFETY: `a` came from this class and is no longer used.
/// unsafe { cache.free(a) };
/// assert_eq!(cache.alloc(), a, "the last freed block is reused first");
/// # unsafe { cache.free(a) };
/// ```
pub struct Cache<'d, const N: usize> {
    depot: &'d Depot<N>,
    current: Magazine,
    spare: Magazine,
    /// This cache counts among the depot's users (it has rotated a magazine into it).
    joined: bool,
}

impl<'d, const N: usize> Cache<'d, N> {
    /// An empty cache over `depot`.
    ///
    /// ```
    /// # use core::alloc::Layout;
    /// # use keyserial_core::recycle::{Cache, Depot};
    /// let depot: Depot<2> = Depot::new(Layout::new::<u64>());
    /// let cache = Cache::new(&depot);
    /// assert_eq!(cache.cached(), 0);
    /// ```
    pub const fn new(depot: &'d Depot<N>) -> Self {
        Cache {
            depot,
            current: Magazine::EMPTY,
            spare: Magazine::EMPTY,
            joined: false,
        }
    }

    /// Free blocks held by this cache.
    ///
    /// ```
    /// # use core::alloc::Layout;
    /// # use keyserial_core::recycle::{Cache, Depot};
    /// let depot: Depot<2> = Depot::new(Layout::new::<u64>());
    /// let mut cache = Cache::new(&depot);
    /// let b = cache.alloc();
    /// unsafe { cache.free(b) }; // SAFETY: from this class, unused.
    /// assert_eq!(cache.cached(), 1);
    /// ```
    pub fn cached(&self) -> usize {
        self.current.len + self.spare.len
    }

    /// A block of the depot's [`layout`](Depot::layout), uninitialised. Never fails: allocation
    /// failure of the global allocator aborts through [`handle_alloc_error`].
    ///
    /// ```
    /// # use core::alloc::Layout;
    /// # use keyserial_core::recycle::{Cache, Depot};
    /// let depot: Depot<2> = Depot::new(Layout::new::<u64>());
    /// let mut cache = Cache::new(&depot);
    /// let b = cache.alloc().cast::<u64>();
    /// unsafe { b.as_ptr().write(7) }; // SAFETY: a fresh block of u64's layout.
    /// unsafe { cache.free(b.cast()) }; // SAFETY: from this class, no longer used.
    /// ```
    #[inline]
    pub fn alloc(&mut self) -> NonNull<u8> {
        if let Some(block) = self.current.pop() {
            return block;
        }
        self.alloc_slow()
    }

    #[cold]
    fn alloc_slow(&mut self) -> NonNull<u8> {
        if self.spare.len > 0 {
            core::mem::swap(&mut self.current, &mut self.spare);
        } else if let Some(magazine) = self.depot.magazines.pop() {
            self.current = magazine;
        }
        if let Some(block) = self.current.pop() {
            return block;
        }
        let layout = self.depot.layout;
        // SAFETY: `block_layout` never yields a zero size (it holds a link).
        let p = unsafe { alloc(layout) };
        match NonNull::new(p) {
            Some(p) => p,
            None => handle_alloc_error(layout),
        }
    }

    /// Gives a block back to the cache.
    ///
    /// # Safety
    /// `block` has the depot's [`layout`](Depot::layout) and came either from
    /// [`alloc`](Cache::alloc) of a cache over the same depot (any thread's) or from the global
    /// allocator with that layout; it is not used any more, and it is freed once.
    ///
    /// ```
    /// # use core::alloc::Layout;
    /// # use keyserial_core::recycle::{Cache, Depot};
    /// let depot: Depot<2> = Depot::new(Layout::new::<[u8; 32]>());
    /// let mut here = Cache::new(&depot);
    /// let block = here.alloc();
    /// // Any cache over the same depot may take it back, on any thread.
    /// let depot = &depot;
    /// std::thread::scope(|s| {
    ///     let block = block.as_ptr() as usize; // (raw pointers are not Send)
    ///     s.spawn(move || {
    ///         let mut there = Cache::new(depot);
    ///         // SAFETY: the block came from a cache over `depot` and is no longer used.
    ///         unsafe { there.free(core::ptr::NonNull::new(block as *mut u8).unwrap()) };
    ///     });
    /// });
    /// ```
    #[inline]
    pub unsafe fn free(&mut self, block: NonNull<u8>) {
        if self.current.is_full() {
            self.rotate();
        }
        // SAFETY: per the contract the block is ours and has the depot's layout, which holds a
        // link (`block_layout`).
        unsafe { self.current.push(block) }
    }

    #[cold]
    fn rotate(&mut self) {
        if !self.joined {
            self.depot.join();
            self.joined = true;
        }
        let full = core::mem::replace(&mut self.current, Magazine::EMPTY);
        let old_spare = core::mem::replace(&mut self.spare, full);
        self.depot.put(old_spare);
    }
}

impl<const N: usize> Drop for Cache<'_, N> {
    fn drop(&mut self) {
        if !self.joined {
            self.depot.join();
        }
        self.depot
            .put(core::mem::replace(&mut self.current, Magazine::EMPTY));
        self.depot
            .put(core::mem::replace(&mut self.spare, Magazine::EMPTY));
        self.depot.leave();
    }
}

impl<const N: usize> fmt::Debug for Cache<'_, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("cached", &self.cached())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::vec::Vec;

    /// A block on its way to another thread.
    struct Ptr(NonNull<u8>);
    // SAFETY: the block is owned by whoever holds the Ptr.
    unsafe impl Send for Ptr {}

    #[test]
    fn reuses_freed_blocks_lifo() {
        let depot: Depot<2> = Depot::new(Layout::new::<[u64; 4]>());
        let mut cache = Cache::new(&depot);
        let a = cache.alloc();
        let b = cache.alloc();
        // SAFETY: both from this class, unused.
        unsafe {
            cache.free(a);
            cache.free(b);
        }
        assert_eq!(cache.alloc(), b);
        assert_eq!(cache.alloc(), a);
        // SAFETY: as above.
        unsafe {
            cache.free(a);
            cache.free(b);
        }
    }

    #[test]
    fn bounded_and_distinct() {
        let depot: Depot<2> = Depot::new(Layout::new::<[u8; 48]>());
        let mut cache = Cache::new(&depot);
        let blocks: Vec<_> = (0..5 * BATCH).map(|_| cache.alloc()).collect();
        let distinct: HashSet<_> = blocks.iter().map(|p| p.as_ptr() as usize).collect();
        assert_eq!(distinct.len(), blocks.len(), "no block handed out twice");
        for (i, &b) in blocks.iter().enumerate() {
            // SAFETY: each block written through its own pointer, then freed once.
            unsafe {
                b.as_ptr().write_bytes(i as u8, 48);
                cache.free(b);
            }
        }
        assert!(cache.cached() <= 2 * BATCH);
        assert!(depot.magazines.len() <= 2);
        // Everything cached comes back without a duplicate.
        let again: Vec<_> = (0..5 * BATCH).map(|_| cache.alloc()).collect();
        let distinct: HashSet<_> = again.iter().map(|p| p.as_ptr() as usize).collect();
        assert_eq!(distinct.len(), again.len());
        for b in again {
            // SAFETY: from this class, freed once.
            unsafe { cache.free(b) };
        }
    }

    #[test]
    fn blocks_travel_between_threads() {
        static DEPOT: Depot<8> = Depot::new(Layout::new::<[u64; 8]>());
        let (tx, rx) = std::sync::mpsc::channel::<Ptr>();
        let mut cache = Cache::new(&DEPOT);
        // Make this cache a user of the depot (free enough to rotate once), so the consumer's
        // exit below is not the last user's and its magazines stay in the depot.
        let mine: Vec<_> = (0..BATCH + 1).map(|_| cache.alloc()).collect();
        for b in mine {
            // SAFETY: from DEPOT's class, unused, freed once.
            unsafe { cache.free(b) };
        }
        let consumer = std::thread::spawn(move || {
            let mut cache = Cache::new(&DEPOT);
            for p in rx {
                // SAFETY: allocated from DEPOT's class by the producer, handed over once.
                unsafe { cache.free(p.0) };
            }
        });
        for round in 0..4u8 {
            for _ in 0..3 * BATCH {
                let b = cache.alloc();
                // SAFETY: a block of 64 bytes, ours.
                unsafe { b.as_ptr().write_bytes(round, 64) };
                tx.send(Ptr(b)).unwrap();
            }
        }
        drop(tx);
        consumer.join().unwrap();
        // The consumer's cache went to the depot when its thread ended.
        assert!(DEPOT.magazines() > 0);
        let b = cache.alloc();
        // SAFETY: from DEPOT's class, unused.
        unsafe { cache.free(b) };
        // The last user gone, the static depot holds nothing (no leak at exit).
        drop(cache);
        assert_eq!(DEPOT.magazines(), 0);
    }

    #[test]
    fn the_last_user_empties_the_depot() {
        static DEPOT: Depot<4> = Depot::new(Layout::new::<[u64; 2]>());
        // A cache that only allocates never becomes a user and leaves nothing behind.
        let mut taker = Cache::new(&DEPOT);
        let blocks: Vec<_> = (0..3 * BATCH).map(|_| Ptr(taker.alloc())).collect();
        let freer = std::thread::spawn(move || {
            let mut cache = Cache::new(&DEPOT);
            for b in blocks {
                // SAFETY: from DEPOT's class, handed over whole, freed once.
                unsafe { cache.free(b.0) };
            }
            // 3 × BATCH frees: one magazine rotated into the depot, two still cached.
            assert_eq!(DEPOT.magazines(), 1);
            assert_eq!(cache.cached(), 2 * BATCH);
        });
        freer.join().unwrap();
        assert_eq!(
            DEPOT.magazines(),
            0,
            "the only user's exit empties the depot"
        );
        // Used again later, the depot starts over.
        let b = taker.alloc();
        // SAFETY: from DEPOT's class, unused.
        unsafe { taker.free(b) };
        drop(taker);
        assert_eq!(DEPOT.magazines(), 0);
    }

    #[test]
    fn small_layouts_hold_a_link() {
        let depot: Depot<2> = Depot::new(Layout::new::<u8>());
        assert_eq!(depot.layout().size(), core::mem::size_of::<usize>());
        let mut cache = Cache::new(&depot);
        let b = cache.alloc();
        // SAFETY: from this class, unused.
        unsafe { cache.free(b) };
    }
}
