//! Fixed-capacity node storage for builds without an allocator.
//!
//! **A building block** for executors without an allocator (keyserial's own no-alloc parts and
//! yours): it gives [`Chain`](crate::chain::Chain) nodes from `static` storage. Allocating is safe;
//! [`Pool::free`] and [`PoolNode::value`] are `unsafe` because they trust that the node is an
//! allocated one of this pool that no chain holds.
//!
//! A [`Pool<T, N>`] owns `N` [`PoolNode`]s (a `const` constructor, so it can be a `static`) and
//! hands them out one value at a time; the nodes implement [`Linked`], so they can be pushed onto a
//! [`Chain`](crate::chain::Chain) directly.
//!
//! # Protocol
//!
//! Slots are handed out first by a bump counter (`fresh`: slots `0..fresh` have been used at
//! least once) and, once returned, through a lock-free free list (a Treiber stack threaded through
//! the slots' `next_free` words). The free list's head is one word holding a *generation* (high
//! half) and `index + 1` (low half; 0 means empty):
//!
//! - **alloc**: pop the free list: read `head = (g, i + 1)`, read `slot[i].next_free = j`,
//!   `CAS(head: (g, i + 1) -> (g + 1, j))`. If the list is empty, bump `fresh` with a CAS while it
//!   is below `N`. The winner of either CAS owns slot `i` exclusively and writes the value.
//! - **free**: the owner reads the value out, then pushes: `slot[i].next_free = head.index`,
//!   `CAS(head: (g, _) -> (g + 1, i + 1))` (release).
//!
//! The generation changes on every successful CAS, which defeats ABA: a popper that read
//! `(g, i + 1)` and `next_free = j`, then stalled while slot `i` was popped, reused and pushed back,
//! finds generation `g + 2` or later and retries instead of installing the stale `j`. (A generation
//! can only repeat after `2^(usize::BITS / 2)` operations while one thread stalls, which on 32-bit
//! targets is 65,536: documented, and far beyond what one preemption allows in practice.)
//! `next_free` is atomic because a stale popper may read it while the slot's new owner rewrites it.
//! Both operations are lock-free.

use core::fmt;
use core::mem::MaybeUninit;
use core::ptr::NonNull;

use crate::chain::{Link, Linked};
use crate::sync::{AtomicUsize, Ordering, UnsafeCell};

const HALF: u32 = usize::BITS / 2;
const INDEX_MASK: usize = (1 << HALF) - 1;

/// One slot of a [`Pool`]: a chain [`Link`], the free-list word and the value. Nodes are only
/// ever handed out by [`Pool::alloc`], as pointers.
///
/// ```
/// use keyserial_core::pool::{Pool, PoolNode};
/// let pool: Pool<u8, 1> = Pool::new();
/// let node: core::ptr::NonNull<PoolNode<u8>> = pool.alloc(3).unwrap();
/// // SAFETY: `node` is allocated from `pool` and not queued anywhere.
/// unsafe {
///     assert_eq!(*PoolNode::value(node), 3);
///     assert_eq!(pool.free(node), 3);
/// }
/// ```
#[repr(C)]
pub struct PoolNode<T> {
    link: Link,
    next_free: AtomicUsize,
    value: UnsafeCell<MaybeUninit<T>>,
}

impl<T> PoolNode<T> {
    #[cfg(not(loom))]
    // Only used as the repeat operand of the `const` array initialiser (each element is a fresh
    // copy), which is exactly what this lint warns about but intends.
    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Self = PoolNode {
        link: Link::new(),
        next_free: AtomicUsize::new(0),
        value: UnsafeCell::new(MaybeUninit::uninit()),
    };

    /// A shared reference to the value of an allocated node.
    ///
    /// # Safety
    /// `node` was returned by [`Pool::alloc`] and not yet passed to [`Pool::free`].
    ///
    /// ```
    /// use keyserial_core::pool::{Pool, PoolNode};
    /// let pool: Pool<u32, 2> = Pool::new();
    /// let node = pool.alloc(5).unwrap();
    /// // SAFETY: the node is allocated and not freed.
    /// assert_eq!(unsafe { *PoolNode::value(node) }, 5);
    /// # unsafe { pool.free(node) };
    /// ```
    pub unsafe fn value<'a>(node: NonNull<Self>) -> &'a T {
        // SAFETY: an allocated node holds an initialised value that only `free` moves out.
        unsafe { node.as_ref().value.with(|v| (*v).assume_init_ref()) }
    }
}

// SAFETY: `link` is the first field of a `repr(C)` struct, so the casts are exact inverses, and a
// Link is pointer-aligned.
unsafe impl<T> Linked for PoolNode<T> {
    fn link(node: NonNull<Self>) -> NonNull<Link> {
        node.cast()
    }

    unsafe fn from_link(link: NonNull<Link>) -> NonNull<Self> {
        link.cast()
    }

    /// A chain dropped with pool nodes still queued drops their values in place; the slots stay
    /// allocated (the chain does not know their pool).
    unsafe fn drop_queued(node: NonNull<Self>) {
        // SAFETY: the chain hands over exclusive ownership of an allocated node.
        unsafe { node.as_ref().value.with_mut(|v| (*v).assume_init_drop()) }
    }
}

/// `N` nodes of fixed storage with a lock-free, ABA-safe free list (see the [module docs](self)).
///
/// ```
/// use keyserial_core::chain::{Chain, Pushed};
/// use keyserial_core::pool::{Pool, PoolNode};
///
/// static POOL: Pool<&str, 4> = Pool::new();
/// let chain: Chain<PoolNode<&str>> = Chain::new();
/// let node = POOL.alloc("hello").unwrap();
/// // SAFETY: a fresh node of a pool that outlives the chain, queued once, untouched while queued.
/// assert_eq!(unsafe { chain.push(node) }.unwrap(), Pushed::Activated);
/// // SAFETY: the push above activated the chain, so this thread owns it; the popped node came
/// // from POOL.
/// unsafe {
///     let node = chain.pop().unwrap();
///     assert_eq!(POOL.free(node), "hello");
///     assert!(chain.try_release());
/// }
/// ```
pub struct Pool<T, const N: usize> {
    head: AtomicUsize,
    fresh: AtomicUsize,
    slots: [PoolNode<T>; N],
}

// SAFETY: values move between threads through the pool; each slot is owned by one thread at a time.
unsafe impl<T: Send, const N: usize> Send for Pool<T, N> {}
// SAFETY: as above.
unsafe impl<T: Send, const N: usize> Sync for Pool<T, N> {}

impl<T, const N: usize> Pool<T, N> {
    const CHECK: () = assert!(N < INDEX_MASK, "Pool capacity too large for this target");

    /// An empty pool of `N` slots.
    ///
    /// ```
    /// let pool: keyserial_core::pool::Pool<u8, 16> = keyserial_core::pool::Pool::new();
    /// assert_eq!(pool.capacity(), 16);
    /// ```
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK;
        Pool {
            head: AtomicUsize::new(0),
            fresh: AtomicUsize::new(0),
            slots: [PoolNode::EMPTY; N],
        }
    }

    /// An empty pool of `N` slots.
    #[cfg(loom)]
    pub fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK;
        Pool {
            head: AtomicUsize::new(0),
            fresh: AtomicUsize::new(0),
            slots: core::array::from_fn(|_| PoolNode {
                link: Link::new(),
                next_free: AtomicUsize::new(0),
                value: UnsafeCell::new(MaybeUninit::uninit()),
            }),
        }
    }

    /// The number of slots, `N`.
    ///
    /// ```
    /// assert_eq!(keyserial_core::pool::Pool::<u8, 3>::new().capacity(), 3);
    /// ```
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Stores `value` in a free slot and returns its node, or hands `value` back if every slot is
    /// in use. Lock-free.
    ///
    /// ```
    /// let pool = keyserial_core::pool::Pool::<u8, 1>::new();
    /// let a = pool.alloc(1).unwrap();
    /// assert_eq!(pool.alloc(2), Err(2));
    /// // SAFETY: `a` came from this pool.
    /// assert_eq!(unsafe { pool.free(a) }, 1);
    /// assert!(pool.alloc(3).is_ok());
    /// ```
    pub fn alloc(&self, value: T) -> Result<NonNull<PoolNode<T>>, T> {
        let index = match self.pop_free().or_else(|| self.bump()) {
            Some(i) => i,
            None => return Err(value),
        };
        let slot = &self.slots[index];
        // SAFETY: winning the free-list or bump CAS made this thread the slot's only owner.
        slot.value.with_mut(|v| unsafe { (*v).write(value) });
        Ok(NonNull::from(slot))
    }

    /// Returns a node's slot to the pool and gives back its value. Lock-free.
    ///
    /// # Safety
    /// `node` was returned by `alloc` on this pool, is not queued on any chain, and is not used
    /// again.
    ///
    /// ```
    /// let pool = keyserial_core::pool::Pool::<String, 2>::new();
    /// let n = pool.alloc("x".to_string()).unwrap();
    /// // SAFETY: `n` came from this pool and is not queued.
    /// assert_eq!(unsafe { pool.free(n) }, "x");
    /// ```
    pub unsafe fn free(&self, node: NonNull<PoolNode<T>>) -> T {
        let base = self.slots.as_ptr() as usize;
        let offset = (node.as_ptr() as usize).wrapping_sub(base);
        let index = offset / core::mem::size_of::<PoolNode<T>>();
        assert!(
            index < N && offset % core::mem::size_of::<PoolNode<T>>() == 0,
            "node does not belong to this pool"
        );
        let slot = &self.slots[index];
        // SAFETY: the caller owns the allocated node; its value is initialised.
        let value = slot.value.with(|v| unsafe { (*v).assume_init_read() });
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            slot.next_free.store(head & INDEX_MASK, Ordering::Relaxed);
            let new = (Self::generation(head).wrapping_add(1) << HALF) | (index + 1);
            match self
                .head
                .compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return value,
                Err(actual) => head = actual,
            }
        }
    }

    fn generation(head: usize) -> usize {
        head >> HALF
    }

    fn pop_free(&self) -> Option<usize> {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let index = (head & INDEX_MASK).checked_sub(1)?;
            let next = self.slots[index].next_free.load(Ordering::Relaxed);
            let new = (Self::generation(head).wrapping_add(1) << HALF) | next;
            match self
                .head
                .compare_exchange_weak(head, new, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return Some(index),
                Err(actual) => head = actual,
            }
        }
    }

    fn bump(&self) -> Option<usize> {
        let mut fresh = self.fresh.load(Ordering::Relaxed);
        loop {
            if fresh >= N {
                return None;
            }
            match self.fresh.compare_exchange_weak(
                fresh,
                fresh + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(fresh),
                Err(actual) => fresh = actual,
            }
        }
    }
}

impl<T, const N: usize> Default for Pool<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const N: usize> fmt::Debug for Pool<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool").field("capacity", &N).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::{Chain, Pushed};
    use std::sync::Arc;
    use std::thread;
    use std::vec::Vec;

    #[test]
    fn alloc_until_full_then_reuse() {
        let pool = Pool::<u32, 3>::new();
        let nodes: Vec<_> = (0..3).map(|i| pool.alloc(i).unwrap()).collect();
        assert_eq!(pool.alloc(9), Err(9));
        // SAFETY: the node came from this pool and is not queued on any chain.
        let mut back: Vec<u32> = nodes.into_iter().map(|n| unsafe { pool.free(n) }).collect();
        back.sort();
        assert_eq!(back, [0, 1, 2]);
        let again: Vec<_> = (10..13).map(|i| pool.alloc(i).unwrap()).collect();
        assert_eq!(pool.alloc(9), Err(9));
        for n in again {
            // SAFETY: the node came from this pool and is not queued on any chain.
            unsafe { pool.free(n) };
        }
    }

    #[test]
    fn chain_over_pool_nodes_keeps_order() {
        let pool = Pool::<u32, 8>::new();
        let chain: Chain<PoolNode<u32>> = Chain::new();
        for i in 0..5 {
            // SAFETY: a fresh node of a pool that outlives the chain, queued once.
            let r = unsafe { chain.push(pool.alloc(i).unwrap()) }.unwrap();
            assert_eq!(r == Pushed::Activated, i == 0);
        }
        for i in 0..5 {
            // SAFETY: this test thread made the push that activated the chain, so it owns the chain.
            let n = unsafe { chain.pop() }.unwrap();
            // SAFETY: the node came from this pool and is not queued on any chain.
            assert_eq!(unsafe { pool.free(n) }, i);
        }
        // SAFETY: this test thread made the push that activated the chain, so it owns the chain.
        assert!(unsafe { chain.try_release() });
    }

    #[test]
    #[should_panic(expected = "does not belong")]
    fn foreign_node_is_rejected() {
        let a = Pool::<u32, 2>::new();
        let b = Pool::<u32, 2>::new();
        let n = a.alloc(1).unwrap();
        // SAFETY: deliberately the wrong pool: `free` checks membership and panics before touching the node.
        unsafe { b.free(n) };
    }

    #[test]
    fn concurrent_alloc_free_never_hands_a_slot_out_twice() {
        #[cfg(miri)]
        const ROUNDS: usize = 50;
        #[cfg(not(miri))]
        const ROUNDS: usize = 20_000;
        let pool = Arc::new(Pool::<usize, 4>::new());
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let pool = pool.clone();
                thread::spawn(move || {
                    for r in 0..ROUNDS {
                        let tag = t * ROUNDS + r;
                        if let Ok(n) = pool.alloc(tag) {
                            // Nobody else may see or change our value while we hold the slot.
                            // SAFETY: the node is allocated and held by this thread only.
                            assert_eq!(unsafe { *PoolNode::value(n) }, tag);
                            // SAFETY: the node came from this pool and is not queued on any chain.
                            assert_eq!(unsafe { pool.free(n) }, tag);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Every slot is free again: exactly N allocations succeed.
        let all: Vec<_> = (0..4).map(|i| pool.alloc(i).unwrap()).collect();
        assert!(pool.alloc(99).is_err());
        for n in all {
            // SAFETY: the node came from this pool and is not queued on any chain.
            unsafe { pool.free(n) };
        }
    }
}
