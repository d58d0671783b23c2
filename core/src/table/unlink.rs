//! Taking entries out: [`Table::unlink`], [`Table::unlink_take`] (by search),
//! [`Table::retire_take`] (through the entry's home slot), batched reclamation
//! ([`Table::defer_free`]), and unlinking inner nodes that empty out.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::hash::{BuildHasher, Hash};

use crossbeam_epoch::Guard;

use super::entry::{Doomed, Entry, EntryAlloc, Unlinked};
use super::node::{replace_collision, Inner};
use super::walk::{descend, Path, Step, Stop, Trail};
use super::word::{Home, Slot, Word};
use super::{Retire, Table};
use crate::sync::Ordering;

impl<K, V, S, A: EntryAlloc> Table<K, V, S, A>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Retire + Send + Sync + 'static,
    S: BuildHasher,
{
    /// Takes a retired entry out of the table and defers its free through the epoch. Returns
    /// `true` if this call removed it, `false` if it was already gone (an inserter of the same key
    /// replaced it). Lock-free.
    ///
    /// # Panics
    /// If the entry's value is not retired: entries leave the table only through retirement.
    ///
    /// ```
    /// # use keyserial_core::chain::{BoxNode, Chain};
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// let table: Table<u8, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
    /// let guard = table.register().pin();
    /// let e = table.get_or_insert_with(1, Chain::new, &guard);
    /// assert!(e.value().try_retire());
    /// assert!(table.unlink(e, &guard));
    /// assert!(!table.unlink(e, &guard)); // already gone; `e` itself stays valid while pinned
    /// assert_eq!(table.len(), 0);
    /// ```
    pub fn unlink<'g>(&'g self, entry: &'g Entry<K, V>, guard: &'g Guard) -> bool {
        match self.unlink_take(entry, guard) {
            Some(taken) => {
                self.defer_free(core::iter::once(taken), guard);
                true
            }
            None => false,
        }
    }

    /// Like [`unlink`](Self::unlink), but hands the unlinked entry back instead of deferring its
    /// free, so that a caller unlinking many entries can reclaim them in batches with one
    /// deferred call ([`defer_free`](Self::defer_free)): one epoch bag slot per batch instead of
    /// one per entry. `None` if the entry was already gone.
    ///
    /// # Panics
    /// If the entry's value is not retired.
    ///
    /// ```
    /// # use keyserial_core::chain::{BoxNode, Chain};
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// let table: Table<u8, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
    /// let guard = table.register().pin();
    /// let mut batch = Vec::new();
    /// for k in 0..3 {
    ///     let e = table.get_or_insert_with(k, Chain::new, &guard);
    ///     assert!(e.value().try_retire());
    ///     batch.extend(table.unlink_take(e, &guard));
    /// }
    /// table.defer_free(batch, &guard);
    /// assert_eq!(table.len(), 0);
    /// ```
    pub fn unlink_take<'g>(
        &'g self,
        entry: &'g Entry<K, V>,
        guard: &'g Guard,
    ) -> Option<Unlinked<K, V>> {
        self.check_guard(guard);
        assert!(
            entry.value.is_retired(),
            "only retired entries leave the table"
        );
        let hash = entry.hash;
        let target = entry as *const Entry<K, V>;
        let mut path = Path::new(self.root(hash));
        loop {
            // SAFETY: the path starts at this table's root and `guard` is this table's.
            let stop = unsafe { descend::<K, V>(&mut path, hash, guard) };
            let Step { slot, node } = path.top();
            match stop {
                Stop::Empty => return None,
                Stop::Leaf(word, _) => {
                    if word.entry::<K, V>() != target {
                        return None;
                    }
                    if slot.cas(word, Word::EMPTY).is_err() {
                        continue;
                    }
                    self.count(hash, -1);
                    if let Some(node) = node {
                        if node.release() {
                            self.unlink_frozen_at(&mut path, guard);
                        }
                    }
                    // Our CAS removed the entry from its only slot: it is ours to reclaim
                    // (through the pointer in the word, which carries the entry's provenance).
                    return Some(Unlinked::new::<A>(word.entry::<K, V>(), self.id()));
                }
                Stop::Collision(word, coll) => {
                    let &victim = coll.entries.iter().find(|&&p| p == target)?;
                    let rest: Vec<_> = coll
                        .entries
                        .iter()
                        .copied()
                        .filter(|&p| p != target)
                        .collect();
                    // SAFETY: `word` is the collision node just read from `slot` under `guard`,
                    // a guard of this table.
                    let Ok(new) = (unsafe { replace_collision(slot, word, rest, guard) }) else {
                        continue;
                    };
                    self.count(hash, -1);
                    if new.is_empty() {
                        if let Some(node) = node {
                            if node.release() {
                                self.unlink_frozen_at(&mut path, guard);
                            }
                        }
                    }
                    // Our CAS unpublished `entry` (listed once, in this node only).
                    return Some(Unlinked::new::<A>(victim, self.id()));
                }
            }
        }
    }

    /// Retires `entry` with `retire` and, if that succeeded, takes the entry out of the table as
    /// [`unlink_take`](Self::unlink_take) does, but usually without searching for it: it tries
    /// the slot the entry was last seen in first (its *home*, see the module docs) and walks from
    /// the root only if that fails. `None` if `retire` returned `false` or an inserter of the
    /// same key already replaced the entry.
    ///
    /// This is how an owner of an entry that decides to retire it should do both: retiring
    /// while `guard` is pinned is what makes the home slot safe to read.
    ///
    /// # Safety
    /// - `entry` is an entry of **this** table (returned by its lookups or inserts): its home
    ///   names a node of this table, which this table's guard protects; another table's node
    ///   may be freed under it.
    /// - `retire` returns `true` only if this call moved the value from live to retired (as
    ///   [`Chain::try_retire`](crate::chain::Chain::try_retire) does), and the value's
    ///   [`Retire::is_retired`] reports `false` until then (the table takes an entry out only
    ///   once it reports retired): then the entry was still in the table while `guard` was
    ///   pinned. An entry retired and removed earlier may have homes in freed nodes.
    ///
    /// # Panics
    /// If `retire` returned `true` but the value is not retired.
    ///
    /// ```
    /// # use keyserial_core::chain::{BoxNode, Chain};
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// let table: Table<u8, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
    /// let guard = table.register().pin();
    /// let e = table.get_or_insert_with(1, Chain::new, &guard);
    /// // SAFETY: `e` came from this table, and `try_retire` succeeds only on the live-to-retired
    /// // transition, before which a chain never reports retired.
    /// let taken = unsafe { table.retire_take(e, &guard, |chain| chain.try_retire()) };
    /// assert!(taken.is_some());
    /// table.defer_free(taken, &guard);
    /// assert_eq!(table.len(), 0);
    /// ```
    pub unsafe fn retire_take<'g>(
        &'g self,
        entry: &'g Entry<K, V>,
        guard: &'g Guard,
        retire: impl FnOnce(&V) -> bool,
    ) -> Option<Unlinked<K, V>> {
        self.check_guard(guard);
        if !retire(&entry.value) {
            return None;
        }
        assert!(
            entry.value.is_retired(),
            "only retired entries leave the table"
        );
        let hash = entry.hash;
        let leaf = Word::leaf(entry as *const Entry<K, V>);
        // The home node is allocated: the entry is this table's (caller's contract) and every
        // value its home word ever holds names a slot on its path (see "Home slots"); a node on
        // the path to an entry in the table is non-empty, so never frozen or unlinked. The entry
        // was in the table when `retire` moved it to retired just now (contract), under `guard`:
        // the node can be unlinked only after that, and its free waits for `guard`.
        // SAFETY: the home node outlives `guard`'s use here, as just argued.
        let (slot, node) = unsafe { self.slot_at(entry.home(Ordering::Acquire), hash) };
        if slot.load(Ordering::Acquire) == leaf && slot.cas(leaf, Word::EMPTY).is_ok() {
            self.count(hash, -1);
            if let Some(n) = node {
                if n.release() {
                    self.unlink_frozen_node(hash, n, guard);
                }
            }
            // Our CAS removed the entry from its only slot: it is ours to reclaim (through a
            // pointer rebuilt from the integer address, which takes the provenance exposed at
            // publication, never one derived from the shared reference).
            return Some(Unlinked::new::<A>(leaf.entry::<K, V>(), self.id()));
        }
        // Moved deeper by an expansion, or replaced: search for it.
        self.unlink_take(entry, guard)
    }

    /// Frees entries taken out by [`unlink_take`](Self::unlink_take) once every guard that could
    /// have seen them is gone, with **one** deferred call for the whole batch.
    ///
    /// # Panics
    /// If an entry was taken out of another table (its readers pin that table's collector): the
    /// batch is then leaked, never freed early.
    ///
    /// ```
    /// # use keyserial_core::chain::{BoxNode, Chain};
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// let table: Table<u8, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
    /// let guard = table.register().pin();
    /// let e = table.get_or_insert_with(1, Chain::new, &guard);
    /// assert!(e.value().try_retire());
    /// let taken = table.unlink_take(e, &guard);
    /// table.defer_free(taken, &guard);
    /// ```
    pub fn defer_free(&self, batch: impl IntoIterator<Item = Unlinked<K, V>>, guard: &Guard) {
        self.check_guard(guard);
        let id = self.id();
        let mut batch = batch.into_iter();
        let mut doomed: Vec<Doomed<K, V>> = Vec::with_capacity(batch.size_hint().0);
        while let Some(u) = batch.next() {
            if u.table != id {
                // Freeing it here would use the wrong epoch (its readers pin the other table's
                // collector): leak this batch instead.
                core::mem::forget(u);
                batch.for_each(core::mem::forget);
                panic!("an Unlinked entry must be freed by the table it was taken from");
            }
            doomed.push(u.into_doomed());
        }
        if doomed.is_empty() {
            return;
        }
        // Each pointer left the table by exactly one successful CAS (its `Unlinked` token is
        // unique and consumed here), and is freed by the allocator that made it (`free`, recorded
        // by the table that unlinked it); K and V are Send + 'static, so dropping them later is
        // fine.
        // SAFETY: no new reader can reach the entries, and the guard belongs to this table's
        // collector, so the free waits for every reader that could have seen them.
        unsafe {
            guard.defer_unchecked(move || {
                for d in doomed {
                    d.free();
                }
            })
        };
    }

    /// The slot a home word names, and the inner node holding it (`None`: the root slot of
    /// `hash`, which must be a hash of the subtree below that slot).
    ///
    /// # Safety
    /// The node the home names stays allocated while the returned references are used.
    pub(super) unsafe fn slot_at(&self, home: Home, hash: u64) -> (&Slot, Option<&Inner>) {
        match home.node() {
            None => (self.root(hash), None),
            Some((node, index)) => {
                // SAFETY: per the contract; homes are made by `Home::of` from a live node.
                let n = unsafe { &*node };
                (&n.slots[index], Some(n))
            }
        }
    }

    /// Unlinks the frozen `node` from `slot`, the slot holding it, and defers its free. `false`
    /// if a helper unlinked it first (and so handles its parent).
    fn unlink_node(slot: &Slot, node: &Inner, guard: &Guard) -> bool {
        debug_assert!(node.is_frozen());
        let expected = Word::inner(node);
        if slot.cas(expected, Word::EMPTY).is_err() {
            return false;
        }
        // SAFETY: our CAS removed the node from its only slot. The pointer is rebuilt from the
        // integer address, so it takes the provenance the Box's pointer exposed when the node
        // was published; one derived from the shared reference may not free it.
        unsafe {
            let p = expected.inner_node() as *mut Inner;
            guard.defer_unchecked(move || drop(Box::from_raw(p)));
        }
        true
    }

    /// `frozen` (an inner node on the path of `hash`) was just frozen by this thread: unlink it
    /// from its parent slot (unless a helper did), cascading upwards through parents that this
    /// thread's release empties in turn. `guard` was pinned while `frozen` was linked.
    fn unlink_frozen_node(&self, hash: u64, frozen: &Inner, guard: &Guard) {
        let mut node = frozen;
        loop {
            // The parent is allocated: `node` stays linked in its parent slot until the CAS in
            // `unlink_node` succeeds (only that CAS, ours or a helper's, unlinks it), so the
            // parent has a non-empty slot and is not frozen; it was linked while `guard` was
            // pinned, so its free (after it empties, later) waits for `guard`.
            // SAFETY: the parent outlives `guard`'s use here, as just argued.
            let (slot, parent) = unsafe { self.slot_at(node.parent, hash) };
            if !Self::unlink_node(slot, node, guard) {
                return; // a helper unlinked it (and handles the parent)
            }
            match parent {
                Some(p) if p.release() => node = p, // the parent froze too: cascade
                _ => return,
            }
        }
    }

    /// `path`'s current step is a slot inside a frozen node: unlink that node from its parent
    /// slot (if nobody has yet; inserters that meet a frozen node help), cascading upwards
    /// through parents that empty out in turn. The path is left at the slot that held the
    /// highest node unlinked (or a helper's), which is still on the key's path.
    pub(super) fn unlink_frozen_at(&self, path: &mut Path<'_>, guard: &Guard) {
        // Invariant: the current step's node is frozen.
        while let Some(Step {
            node: Some(frozen), ..
        }) = path.pop()
        {
            debug_assert!(frozen.is_frozen());
            let parent = path.top();
            if !Self::unlink_node(parent.slot, frozen, guard) {
                return; // someone else unlinked it (and handles the parent)
            }
            match parent.node {
                Some(pnode) if pnode.release() => continue, // parent froze too: cascade
                _ => return,
            }
        }
    }
}
