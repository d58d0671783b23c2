//! A key's [`Entry`], where entries get their memory ([`EntryAlloc`]), and the [`Unlinked`] token
//! for an entry taken out of the table.

use core::alloc::Layout;
use core::fmt;
use core::ptr::NonNull;

use crossbeam_epoch::Guard;

use super::word::Home;
use crate::sync::{AtomicUsize, Ordering};

/// Where a table's entries get their memory: the global allocator ([`Global`]) by default, or a
/// recycling allocator when entries are created and freed on different threads at a high rate
/// (keyserial's executor uses its per-thread magazine caches, [`crate::recycle`]).
///
/// Entries are freed on whichever thread runs the epoch's deferred functions.
///
/// # Safety
/// [`alloc`](Self::alloc) returns memory valid for reads and writes of `layout` (never
/// zero-sized here), and [`free`](Self::free) accepts any block `alloc` returned for the same
/// layout, on any thread.
///
/// ```
/// use core::alloc::Layout;
/// use core::ptr::NonNull;
/// use keyserial_core::table::EntryAlloc;
/// struct Counting;
/// // SAFETY: forwards to the global allocator with the same layout.
/// unsafe impl EntryAlloc for Counting {
///     fn alloc(layout: Layout) -> NonNull<u8> {
///         // SAFETY: entries are never zero-sized.
///         NonNull::new(unsafe { std::alloc::alloc(layout) }).expect("out of memory")
///     }
///     unsafe fn free(block: NonNull<u8>, layout: Layout) {
///         // SAFETY: per the trait's contract the block came from `alloc(layout)`.
///         unsafe { std::alloc::dealloc(block.as_ptr(), layout) }
///     }
/// }
/// ```
pub unsafe trait EntryAlloc: 'static {
    /// Memory for one entry of `layout`.
    fn alloc(layout: Layout) -> NonNull<u8>;
    /// Gives back memory from [`alloc`](Self::alloc)`(layout)`.
    ///
    /// # Safety
    /// `block` came from `Self::alloc(layout)`, holds no live value, and is freed once.
    unsafe fn free(block: NonNull<u8>, layout: Layout);
}

/// Entries from the global allocator (the default).
///
/// ```
/// use keyserial_core::table::{Global, Table};
/// use std::collections::hash_map::RandomState;
/// let table: Table<u64, u8, RandomState, Global> = Table::with_hasher(RandomState::new());
/// assert!(table.is_empty());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Global;

// SAFETY: the global allocator with the caller's layout, both ways.
unsafe impl EntryAlloc for Global {
    fn alloc(layout: Layout) -> NonNull<u8> {
        // SAFETY: entries hold at least a hash, so `layout` is never zero-sized.
        let p = unsafe { alloc::alloc::alloc(layout) };
        NonNull::new(p).unwrap_or_else(|| alloc::alloc::handle_alloc_error(layout))
    }

    unsafe fn free(block: NonNull<u8>, layout: Layout) {
        // SAFETY: per the trait's contract `block` came from `alloc(layout)` above.
        unsafe { alloc::alloc::dealloc(block.as_ptr(), layout) }
    }
}

/// Allocates an entry through `M`.
pub(super) fn new_entry<K, V, M: EntryAlloc>(entry: Entry<K, V>) -> NonNull<Entry<K, V>> {
    let p = M::alloc(Layout::new::<Entry<K, V>>()).cast::<Entry<K, V>>();
    // SAFETY: fresh memory with the entry's layout.
    unsafe { p.as_ptr().write(entry) };
    p
}

/// Drops an entry and gives its memory back to `M`.
///
/// # Safety
/// `p` came from [`new_entry::<K, V, M>`](new_entry), is owned by the caller, reachable by nobody
/// else, and freed once.
pub(super) unsafe fn free_entry<K, V, M: EntryAlloc>(p: *mut Entry<K, V>) {
    // SAFETY: per the contract the entry is live and ours.
    unsafe { core::ptr::drop_in_place(p) };
    // SAFETY: the memory came from `M::alloc` with this layout and holds nothing live now.
    unsafe {
        M::free(
            NonNull::new_unchecked(p).cast(),
            Layout::new::<Entry<K, V>>(),
        )
    };
}

/// Defers the free of `entry` (through `M`) until every guard that could have seen it is gone.
///
/// # Safety
/// `entry` was read from a table word (it carries the provenance the entry was published with;
/// a pointer derived from a `&Entry` cannot authorise the deallocation), was made by
/// [`new_entry::<K, V, M>`](new_entry), and was just removed from the table by the caller's
/// successful CAS, so no new reader can reach it; `guard` is pinned from that table's collector.
/// `K` and `V` may be dropped on another thread later (`Send + 'static` in the table's bounds).
pub(super) unsafe fn defer_free_entry<K, V, M: EntryAlloc>(
    guard: &Guard,
    entry: *const Entry<K, V>,
) {
    let p = entry as *mut Entry<K, V>;
    // SAFETY: per the contract.
    unsafe { guard.defer_unchecked(move || free_entry::<K, V, M>(p)) };
}

/// One key's entry: its hash, key and value. Lives until it is unlinked and every guard that
/// could have seen it is dropped.
///
/// ```
/// use keyserial_core::chain::{BoxNode, Chain};
/// use keyserial_core::table::{Entry, Table};
/// use std::collections::hash_map::RandomState;
/// let table: Table<&str, Chain<BoxNode<u8>>, RandomState> = Table::with_hasher(RandomState::new());
/// let guard = table.register().pin();
/// let entry: &Entry<_, _> = table.get_or_insert_with("k", Chain::new, &guard);
/// assert_eq!(*entry.key(), "k");
/// assert!(entry.value().is_idle());
/// ```
pub struct Entry<K, V> {
    pub(super) hash: u64,
    /// Where the entry was last seen (see "Home slots" in the module docs): a [`Home`]'s bits.
    home: AtomicUsize,
    pub(super) key: K,
    pub(super) value: V,
}

impl<K, V> Entry<K, V> {
    /// The key.
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// # use keyserial_core::chain::{BoxNode, Chain};
    /// let table: Table<u32, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
    /// let handle = table.collector().register();
    /// let guard = handle.pin();
    /// assert_eq!(*table.get_or_insert_with(7, Chain::new, &guard).key(), 7);
    /// ```
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The value.
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// # use keyserial_core::chain::{BoxNode, Chain};
    /// let table: Table<u32, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
    /// let handle = table.collector().register();
    /// let guard = handle.pin();
    /// assert!(table.get_or_insert_with(7, Chain::new, &guard).value().is_idle());
    /// ```
    pub fn value(&self) -> &V {
        &self.value
    }

    /// The key's 64-bit hash under the table's hasher.
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// # use core::hash::BuildHasher;
    /// # use keyserial_core::chain::{BoxNode, Chain};
    /// let table: Table<u32, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
    /// let handle = table.collector().register();
    /// let guard = handle.pin();
    /// let e = table.get_or_insert_with(7, Chain::new, &guard);
    /// assert_eq!(e.hash(), table.hasher().hash_one(7u32));
    /// ```
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// A new entry whose home is the root slot.
    pub(super) fn new(hash: u64, key: K, value: V) -> Self {
        Entry {
            hash,
            home: AtomicUsize::new(Home::ROOT.to_bits()),
            key,
            value,
        }
    }

    /// The slot the entry was last seen in.
    pub(super) fn home(&self, order: Ordering) -> Home {
        Home::from_bits(self.home.load(order))
    }

    /// Records the slot the entry was moved to (or is about to be published in).
    pub(super) fn set_home(&self, home: Home, order: Ordering) {
        self.home.store(home.to_bits(), order)
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for Entry<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("key", &self.key)
            .field("value", &self.value)
            .finish()
    }
}

/// An entry taken out of the table by [`Table::unlink_take`](super::Table::unlink_take), not yet
/// reclaimed. Give it to [`Table::defer_free`](super::Table::defer_free); dropping it instead leaks
/// the entry (never frees it too early).
///
/// ```
/// use keyserial_core::chain::{BoxNode, Chain};
/// use keyserial_core::table::{Table, Unlinked};
/// use std::collections::hash_map::RandomState;
/// let table: Table<u8, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
/// let guard = table.register().pin();
/// let e = table.get_or_insert_with(1, Chain::new, &guard);
/// assert!(e.value().try_retire());
/// let taken: Option<Unlinked<_, _>> = table.unlink_take(e, &guard);
/// table.defer_free(taken, &guard); // freed once no guard can see it
/// ```
pub struct Unlinked<K, V> {
    ptr: NonNull<Entry<K, V>>,
    /// The table it came from (its identity, the address of its root array): only that table
    /// may free it, since its epoch protects the entry's readers.
    pub(super) table: usize,
    /// Frees the entry through the allocator that made it ([`free_entry`] of the table's
    /// [`EntryAlloc`]). Kept with the entry rather than taken from the freeing table, so that a
    /// table of another allocator type that reuses a dropped table's address can never free the
    /// entry with the wrong allocator.
    free: unsafe fn(*mut Entry<K, V>),
}

// SAFETY: the token is the unique owner of an entry nobody else can reach any more; moving it
// moves that ownership (K and V are Send where the table allows unlinking).
unsafe impl<K: Send, V: Send> Send for Unlinked<K, V> {}

impl<K, V> Unlinked<K, V> {
    /// The token for `ptr`, which the caller's CAS just took out of table `table`, whose
    /// allocator is `A`.
    pub(super) fn new<A: EntryAlloc>(ptr: *const Entry<K, V>, table: usize) -> Self {
        Unlinked {
            ptr: NonNull::new(ptr as *mut Entry<K, V>).expect("unlinked entries are not null"),
            table,
            free: free_entry::<K, V, A>,
        }
    }

    /// Gives up the token for the entry and the function that frees it.
    pub(super) fn into_doomed(self) -> Doomed<K, V> {
        let doomed = Doomed {
            ptr: self.ptr.as_ptr(),
            free: self.free,
        };
        core::mem::forget(self);
        doomed
    }
}

impl<K, V> Drop for Unlinked<K, V> {
    fn drop(&mut self) {
        debug_assert!(
            false,
            "an Unlinked entry was dropped instead of given to defer_free"
        );
    }
}

impl<K, V> fmt::Debug for Unlinked<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Unlinked")
    }
}

/// An unlinked entry on its way to a deferred free: the pointer and the function that frees it
/// (may move into the deferred closure; its owner guarantees exclusivity).
pub(super) struct Doomed<K, V> {
    ptr: *mut Entry<K, V>,
    free: unsafe fn(*mut Entry<K, V>),
}

// SAFETY: only used for entries owned exclusively by the deferred closure that frees them (K and
// V are Send where the table unlinks).
unsafe impl<K: Send, V: Send> Send for Doomed<K, V> {}

impl<K, V> Doomed<K, V> {
    /// Frees the entry.
    ///
    /// # Safety
    /// Every guard that could have seen the entry is gone.
    pub(super) unsafe fn free(self) {
        // SAFETY: the entry was made by the allocator `free` belongs to (recorded when it was
        // unlinked), is exclusively ours, and is freed once (`self` is consumed).
        unsafe { (self.free)(self.ptr) }
    }
}
