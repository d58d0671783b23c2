//! The key table (`alloc` feature): key → entry (a key's chain plus whatever the executor keeps
//! per key), sharded by hash, lock-free, with entries freed through `crossbeam-epoch`.
//!
//! **A building block**, for keyserial's executor and for anyone writing their own. It is a
//! concurrent map with one unusual rule: entries leave it only through retirement of their value
//! ([`Retire`]), which is what makes "release an idle key" safe against a racing submit. Lookups,
//! inserts, [`unlink`](Table::unlink) and batched reclamation are safe;
//! [`retire_take`](Table::retire_take) and [`EntryAlloc`] are `unsafe` because they trust the
//! caller's promise about the entry's history and the allocator's behaviour.
//!
//! # Shape: a sharded hash trie
//!
//! The table is a fixed root array of `2^12` slots (the *shards*: 32 KiB, selected by the low 12
//! bits of the hash) under which each shard grows a trie of 16-slot inner nodes indexed by the next
//! 4 hash bits per level. A slot word is one of:
//!
//! ```text
//!  0                    empty
//!  ptr | LEAF  (0b00)   an Entry (boxed, holds hash, key, value)
//!  ptr | INNER (0b01)   an inner node: 16 slots + an occupancy word
//!  ptr | COLL  (0b10)   a collision node: an immutable list of entries with one full 64-bit hash
//! ```
//!
//! **Growth without a pause.** There is no resize. When an insert finds its slot taken by a leaf
//! with another hash, it builds a private inner node (or a short path of them, down to the level
//! where the two hashes differ) holding both leaves and publishes it with one CAS on that slot.
//! Growth is local to one slot, so the table holds 1 to 10,000,000+ keys with the depth growing
//! like `log16(keys / 4096)` (about 3.7 levels at 1 M keys, 4.5 at 10 M; simulated) and no scan is
//! ever longer than a 64-bit hash collision list.
//!
//! **Shrinking.** Each inner node counts its non-empty slots plus inserts in flight (`occupancy`).
//! An insert *reserves* (increments) before it CASes an empty slot of a node and un-reserves if the
//! CAS fails; whoever empties a slot decrements. The thread that takes the count to zero tries
//! `CAS(occupancy: 0 -> FROZEN)`; a frozen node is empty forever (nobody can reserve in it), so
//! anyone who meets it — that thread, a reader, an inserter — may CAS its parent slot from the node
//! to empty, and the winner of that CAS defers the node's free and decrements the parent (which may
//! freeze in turn). So the index is bounded by the live keys, not by every key ever seen.
//!
//! # Entries and retirement
//!
//! Removal happens only through retirement of the entry's value ([`Retire`]; for a chain:
//! `CAS(0 -> RETIRED)`), never by key: a map's "remove if idle" cannot be made safe against a
//! pusher that already holds the chain, the chain's own terminal state can. After retiring, the
//! retirer calls [`Table::unlink`] (or retires inside [`Table::retire_take`], which unlinks from
//! the entry's home slot, below). Two threads can take a retired entry out of its slot:
//!
//! - the retirer, `CAS(slot: entry -> empty)` in `unlink`, or
//! - an inserter of the same key that finds the retired entry and *replaces* it:
//!   `CAS(slot: entry -> fresh entry)`, so a new chain never waits for the retirer to finish.
//!
//! The slot holding an entry is unique (an expansion CAS moves the pointer from the old slot to the
//! new inner node atomically) and an entry is never re-inserted, so exactly one CAS removes it, and
//! that CAS's winner defers its destruction (`Guard::defer_unchecked`). Readers hold a guard from
//! this table's collector while they use an entry, so it is freed only after they are done.
//!
//! # Home slots: unlinking without a search
//!
//! Unlinking by search walks the key's path again, one likely cache miss per level once the
//! table outgrows the caches. So every entry keeps a *home* word naming the slot it was last
//! seen in, and every inner node the slot that holds it (its *parent*; nodes never move).
//!
//! - An inserter sets a new entry's home to the slot it publishes it in (before the CAS).
//! - An expansion moves the other key's entry one or more levels down: after its CAS, the
//!   expander stores the entry's new slot in its home. Two expansions of one entry may store out
//!   of order, leaving the older, shallower slot: still a slot on the entry's path.
//!
//! So **the home always names a slot on the path from the root to the entry**, and every node
//! on that path is non-empty (never frozen, never unlinked) while the entry is in the table.
//! [`Table::retire_take`] relies on that: it retires the entry under the caller's guard (so the
//! entry was in the table while the guard was pinned, and any later free of a node on its path
//! waits for the guard), loads the home slot, and if it holds the entry, removes it with one CAS
//! there. Otherwise (a home store still in flight, or the entry replaced by an inserter) it falls
//! back to the search. If its CAS empties and freezes the home node, it unlinks the node from its
//! parent slot, and so on upwards, exactly as the search-based unlink does with its path: a
//! node still linked in its parent slot keeps that parent non-empty, so the parent is allocated.
//!
//! # Exactly one entry per key
//!
//! The path of a key is fixed by its hash. An insert publishes a leaf only by CAS on the first
//! empty slot of that path, or by replacing a leaf of the same key that is retired, or inside a
//! fresh inner node that replaces the leaf of another key. In each case the CAS's expected value
//! proves no live entry of the key existed on the path at that instant, and two inserters of one
//! key race on the same slot: one CAS wins, the loser re-reads the slot, finds the winner's entry
//! and returns it (freeing its own unpublished entry on the spot).
//!
//! # Progress guarantees
//!
//! | operation | guarantee |
//! |---|---|
//! | [`get`](Table::get) | wait-free apart from the trie depth: at most one load per level, no retries |
//! | [`get_or_insert_with`](Table::get_or_insert_with) | lock-free: a CAS fails only because another insert, replacement, unlink or expansion of that slot succeeded |
//! | [`unlink`](Table::unlink), [`retire_take`](Table::retire_take) | lock-free, same argument |
//! | [`len`](Table::len) | wait-free, a sum of 16 sharded counters (approximate under concurrency) |
//!
//! Memory is reclaimed through the table's own [`Collector`] (no_std has no default collector):
//! every guard passed in must come from [`Table::collector`] (checked).
//!
//! # Where things are
//!
//! | file | concept |
//! |---|---|
//! | `word.rs` | the typed slot word `Word` (empty, or a tagged pointer), the atomic `Slot`, the `Home` word naming a slot |
//! | `entry.rs` | [`Entry`], [`EntryAlloc`], [`Unlinked`] |
//! | `node.rs` | inner nodes (occupancy, freezing) and collision lists |
//! | `walk.rs` | the walk down a key's path, shared by lookups, inserts and unlinks |
//! | `insert.rs` | [`get_or_insert_with`](Table::get_or_insert_with) and expansions |
//! | `unlink.rs` | [`unlink`](Table::unlink), [`retire_take`](Table::retire_take), reclamation, node unlinking |

use alloc::boxed::Box;
use core::borrow::Borrow;
use core::fmt;
use core::hash::{BuildHasher, Hash};
use core::marker::PhantomData;

use crossbeam_epoch::{Collector, Guard, LocalHandle};
use crossbeam_utils::CachePadded;

use crate::chain::{Chain, Linked};
use crate::sync::{AtomicUsize, Ordering};

mod entry;
mod insert;
mod node;
mod unlink;
mod walk;
mod word;

pub use entry::{Entry, EntryAlloc, Global, Unlinked};

use entry::free_entry;
use node::{Collision, Inner};
use walk::{descend, Cursor, Stop};
use word::{Kind, Slot, Word};

#[cfg(not(loom))]
const ROOT_BITS: u32 = 12;
/// Under loom every slot is a modelled atomic: keep the root tiny (same code paths).
#[cfg(loom)]
const ROOT_BITS: u32 = 2;
const NODE_BITS: u32 = 4;
const FANOUT: usize = 1 << NODE_BITS;
const NODE_MASK: u64 = FANOUT as u64 - 1;
const ROOT_MASK: u64 = (1 << ROOT_BITS) - 1;
#[cfg(not(loom))]
const LEN_SHARDS: usize = 16;
#[cfg(loom)]
const LEN_SHARDS: usize = 2;

/// The index of `hash`'s slot in an inner node whose level starts at bit `shift`.
fn index(hash: u64, shift: u32) -> usize {
    ((hash >> shift) & NODE_MASK) as usize
}

/// A value that can be taken out of the table: it has a terminal "retired" state after which it
/// is never used for new work. [`Chain`] is the canonical implementation.
///
/// A safe trait: the table's safe operations stay sound whatever `is_retired` returns (a value
/// that reports wrongly only gets wrong answers); [`Table::retire_take`], which is `unsafe`,
/// requires it to report truthfully.
///
/// ```
/// use core::sync::atomic::{AtomicBool, Ordering};
/// use keyserial_core::table::{Retire, Table};
/// use std::collections::hash_map::RandomState;
///
/// #[derive(Default)]
/// struct Session { closed: AtomicBool }
/// impl Retire for Session {
///     fn is_retired(&self) -> bool { self.closed.load(Ordering::Acquire) }
/// }
///
/// let table: Table<u32, Session, RandomState> = Table::with_hasher(RandomState::new());
/// let guard = table.register().pin();
/// let e = table.get_or_insert_with(7, Session::default, &guard);
/// e.value().closed.store(true, Ordering::Release);
/// assert!(table.unlink(e, &guard));
/// ```
pub trait Retire {
    /// `true` once the value is retired.
    ///
    /// ```
    /// use keyserial_core::{chain::{BoxNode, Chain}, table::Retire};
    /// let chain: Chain<BoxNode<u8>> = Chain::new();
    /// assert!(!Retire::is_retired(&chain));
    /// ```
    fn is_retired(&self) -> bool;
}

impl<N: Linked> Retire for Chain<N> {
    fn is_retired(&self) -> bool {
        Chain::is_retired(self)
    }
}

/// The sharded, lock-free key table. See the [module documentation](self) for the protocol and
/// progress guarantees.
///
/// ```
/// use keyserial_core::chain::{BoxNode, Chain, Pushed};
/// use keyserial_core::table::Table;
/// use std::collections::hash_map::RandomState;
///
/// let table: Table<&str, Chain<BoxNode<u32>>, RandomState> = Table::with_hasher(RandomState::new());
/// let handle = table.collector().register();
/// let guard = handle.pin();
/// let entry = table.get_or_insert_with("alice", Chain::new, &guard);
/// assert_eq!(entry.value().push_value(1), Ok(Pushed::Activated));
/// assert!(table.get("alice", &guard).is_some());
/// // drain, release, retire, unlink:
/// unsafe {
///     assert_eq!(entry.value().pop_value(), Some(1));
///     assert!(entry.value().try_release());
/// }
/// assert!(entry.value().try_retire());
/// assert!(table.unlink(entry, &guard));
/// assert!(table.get("alice", &guard).is_none());
/// ```
pub struct Table<K, V, S, A: EntryAlloc = Global> {
    roots: Box<[Slot]>,
    lens: [CachePadded<AtomicUsize>; LEN_SHARDS],
    hasher: S,
    collector: Collector,
    _entries: PhantomData<(Box<Entry<K, V>>, A)>,
}

// SAFETY: the table owns its entries (K, V); sending it sends them.
unsafe impl<K: Send, V: Send, S: Send, A: EntryAlloc> Send for Table<K, V, S, A> {}
// SAFETY: shared access hands out `&Entry<K, V>` to several threads (needs K, V: Sync) and moves
// ownership of entries between threads on replacement and reclamation (needs K, V: Send).
unsafe impl<K: Send + Sync, V: Send + Sync, S: Sync, A: EntryAlloc> Sync for Table<K, V, S, A> {}

impl<K, V, S, A: EntryAlloc> fmt::Debug for Table<K, V, S, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table").field("len", &self.len()).finish()
    }
}

impl<K, V, S, A: EntryAlloc> Table<K, V, S, A> {
    /// An empty table with its own epoch collector.
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// let table: Table<u64, u8, RandomState> = Table::with_hasher(RandomState::new());
    /// assert_eq!(table.len(), 0);
    /// ```
    pub fn with_hasher(hasher: S) -> Self {
        Self::with_hasher_and_collector(hasher, Collector::new())
    }

    /// An empty table that reclaims through `collector` (for example crossbeam-epoch's global
    /// default collector in std builds, whose guards are cheap to get on any thread).
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// let collector = crossbeam_epoch::Collector::new();
    /// let table: Table<u64, u8, RandomState> =
    ///     Table::with_hasher_and_collector(RandomState::new(), collector.clone());
    /// assert!(table.collector() == &collector);
    /// ```
    pub fn with_hasher_and_collector(hasher: S, collector: Collector) -> Self {
        Table {
            roots: (0..1usize << ROOT_BITS).map(|_| Slot::new()).collect(),
            lens: core::array::from_fn(|_| CachePadded::new(AtomicUsize::new(0))),
            hasher,
            collector,
            _entries: PhantomData,
        }
    }

    /// The collector that reclaims this table's memory; every guard passed to the table must be
    /// pinned from a handle registered with it.
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// let table: Table<u64, u8, RandomState> = Table::with_hasher(RandomState::new());
    /// let handle = table.collector().register();
    /// let _guard = handle.pin();
    /// ```
    pub fn collector(&self) -> &Collector {
        &self.collector
    }

    /// Registers the calling thread with the table's collector (shorthand for
    /// `self.collector().register()`).
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// let table: Table<u64, u8, RandomState> = Table::with_hasher(RandomState::new());
    /// let guard = table.register().pin();
    /// assert!(table.get(&1, &guard).is_none());
    /// ```
    pub fn register(&self) -> LocalHandle {
        self.collector.register()
    }

    /// The hasher.
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// let table: Table<u64, u8, RandomState> = Table::with_hasher(RandomState::new());
    /// let _ = table.hasher();
    /// ```
    pub fn hasher(&self) -> &S {
        &self.hasher
    }

    /// The number of entries in the table (retired entries not yet unlinked included); a sum of
    /// sharded counters, exact when the table is quiescent.
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// # use keyserial_core::chain::{BoxNode, Chain};
    /// let table: Table<u64, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
    /// let guard = table.register().pin();
    /// table.get_or_insert_with(1, Chain::new, &guard);
    /// assert_eq!(table.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.lens
            .iter()
            .map(|l| l.load(Ordering::Relaxed))
            .fold(0usize, usize::wrapping_add)
            .min(isize::MAX as usize)
    }

    /// `true` if [`len`](Self::len) is zero.
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// assert!(Table::<u64, u8, RandomState>::with_hasher(RandomState::new()).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn check_guard(&self, guard: &Guard) {
        assert!(
            guard.collector() == Some(&self.collector),
            "guard belongs to another collector than this table's"
        );
    }

    fn count(&self, hash: u64, delta: isize) {
        let shard = (hash >> (64 - 4)) as usize % LEN_SHARDS;
        self.lens[shard].fetch_add(delta as usize, Ordering::Relaxed);
    }

    fn root(&self, hash: u64) -> &Slot {
        &self.roots[(hash & ROOT_MASK) as usize]
    }

    /// This table's identity: the address of its root array (stable when the table moves).
    fn id(&self) -> usize {
        self.roots.as_ptr() as usize
    }
}

impl<K: Hash + Eq, V, S: BuildHasher, A: EntryAlloc> Table<K, V, S, A> {
    /// The entry for `key`, if the table has one (it may be retired: check its value).
    /// Never locks, never retries.
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// # use keyserial_core::chain::{BoxNode, Chain};
    /// let table: Table<String, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
    /// let guard = table.register().pin();
    /// table.get_or_insert_with("k".to_string(), Chain::new, &guard);
    /// assert!(table.get("k", &guard).is_some());
    /// assert!(table.get("other", &guard).is_none());
    /// ```
    pub fn get<'g, Q>(&'g self, key: &Q, guard: &'g Guard) -> Option<&'g Entry<K, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.check_guard(guard);
        let hash = self.hasher.hash_one(key);
        // SAFETY: the walk starts at this table's root and `guard` is this table's (checked).
        match unsafe { descend::<K, V>(&mut Cursor::new(self.root(hash)), hash, guard) } {
            Stop::Empty => None,
            Stop::Leaf(_, e) => (e.hash == hash && e.key.borrow() == key).then_some(e),
            Stop::Collision(_, coll) => coll
                .entries
                .iter()
                // SAFETY: entries listed in a published collision node stay allocated while we
                // are pinned.
                .map(|&e| unsafe { &*e })
                .find(|e| e.key.borrow() == key),
        }
    }
}

impl<K, V, S, A: EntryAlloc> Table<K, V, S, A> {
    /// Calls `f` with every entry in the table (retired ones included: check the value), while
    /// others go on inserting and unlinking: an entry that stays in the table for the whole walk
    /// is visited exactly once; one inserted, moved down by an expansion or unlinked meanwhile,
    /// at most once. Lock-free reads only, one per slot (a table of `n` keys has about `n / 4 +
    /// 4096` slots to read). Meant for inspection (the busiest keys of an executor), not for a
    /// hot path.
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// # use keyserial_core::chain::{BoxNode, Chain};
    /// let table: Table<u32, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
    /// let guard = table.register().pin();
    /// for k in 0..100 {
    ///     table.get_or_insert_with(k, Chain::new, &guard);
    /// }
    /// let mut keys = Vec::new();
    /// table.for_each(&guard, |e| keys.push(*e.key()));
    /// keys.sort();
    /// assert_eq!(keys, (0..100).collect::<Vec<_>>());
    /// ```
    pub fn for_each<'g>(&'g self, guard: &'g Guard, mut f: impl FnMut(&'g Entry<K, V>)) {
        self.check_guard(guard);
        /// Visits what `word` points to. Everything reachable from a slot read under `guard`
        /// stays allocated while the guard is pinned (frees are deferred through the table's
        /// collector, whose guard this is, checked above).
        fn visit<'g, K: 'g, V: 'g>(word: Word, f: &mut impl FnMut(&'g Entry<K, V>)) {
            match word.kind() {
                Kind::Empty => {}
                Kind::Leaf => {
                    // SAFETY: a leaf read from a linked slot under the guard stays allocated
                    // while the guard lives (see above).
                    f(unsafe { &*word.entry::<K, V>() })
                }
                Kind::Inner => {
                    // SAFETY: as above, for an inner node.
                    let node = unsafe { &*word.inner_node() };
                    for s in node.slots.iter() {
                        visit(s.load(Ordering::Acquire), f);
                    }
                }
                Kind::Collision => {
                    // SAFETY: as above, for a collision node and the entries it lists.
                    let coll = unsafe { &*word.collision_node::<K, V>() };
                    for &e in &coll.entries {
                        // SAFETY: as above.
                        f(unsafe { &*e });
                    }
                }
            }
        }
        for root in self.roots.iter() {
            visit(root.load(Ordering::Acquire), &mut f);
        }
    }
}

impl<K, V, S, A: EntryAlloc> Drop for Table<K, V, S, A> {
    fn drop(&mut self) {
        // `&mut self`: no thread is inside the table. Everything still linked is ours; what was
        // unlinked is owned by the collector's deferred frees.
        fn free<K, V, A: EntryAlloc>(word: Word) {
            match word.kind() {
                Kind::Empty => {}
                Kind::Leaf => {
                    // SAFETY: a linked leaf is owned by the table (made by `new_entry::<_, _, A>`).
                    unsafe { free_entry::<K, V, A>(word.entry::<K, V>() as *mut Entry<K, V>) };
                }
                Kind::Inner => {
                    // SAFETY: a linked inner node is owned by the table.
                    let node = unsafe { Box::from_raw(word.inner_node() as *mut Inner) };
                    for s in node.slots.iter() {
                        free::<K, V, A>(s.load(Ordering::Relaxed));
                    }
                }
                Kind::Collision => {
                    // SAFETY: a linked collision node and its entries are owned by the table.
                    let coll = unsafe {
                        Box::from_raw(word.collision_node::<K, V>() as *mut Collision<K, V>)
                    };
                    for &e in &coll.entries {
                        // SAFETY: as above.
                        unsafe { free_entry::<K, V, A>(e as *mut Entry<K, V>) };
                    }
                }
            }
        }
        for root in self.roots.iter() {
            free::<K, V, A>(root.load(Ordering::Relaxed));
        }
    }
}

#[cfg(test)]
mod tests;
