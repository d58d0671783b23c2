//! Inserting a key: [`Table::get_or_insert_with`] and [`Table::get_or_insert_cloned`], the entry
//! an insert may publish ([`Fresh`]), and the private subtrees an expansion publishes.

use alloc::boxed::Box;
use core::hash::{BuildHasher, Hash};
use core::marker::PhantomData;
use core::ptr::NonNull;

use crossbeam_epoch::Guard;

use super::entry::{defer_free_entry, free_entry, new_entry, Entry, EntryAlloc};
use super::node::{replace_collision, Collision, Inner};
use super::walk::{descend, Path, Step, Stop, Trail};
use super::word::{Home, Kind, Word};
use super::{index, Retire, Table, NODE_BITS};
use crate::sync::Ordering;

impl<K, V, S, A: EntryAlloc> Table<K, V, S, A>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Retire + Send + Sync + 'static,
    S: BuildHasher,
{
    /// The live entry for `key`, inserting `make()` if there is none or if the key's entry is
    /// retired (then the retired entry is replaced and reclaimed). Lock-free. `make` runs at most
    /// once, and its value is dropped unused if another thread inserted the key first.
    ///
    /// The returned entry was live when found; it can be retired concurrently, so a caller that
    /// then fails to use it (a push reporting [`Retired`](crate::chain::Retired)) simply calls
    /// this again.
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use std::collections::hash_map::RandomState;
    /// # use keyserial_core::chain::{BoxNode, Chain};
    /// let table: Table<u32, Chain<BoxNode<u8>>, RandomState> = Table::with_hasher(RandomState::new());
    /// let guard = table.register().pin();
    /// let a = table.get_or_insert_with(1, Chain::new, &guard);
    /// let b = table.get_or_insert_with(1, Chain::new, &guard);
    /// assert!(core::ptr::eq(a, b));
    /// assert_eq!(table.len(), 1);
    /// ```
    pub fn get_or_insert_with<'g>(
        &'g self,
        key: K,
        make: impl FnOnce() -> V,
        guard: &'g Guard,
    ) -> &'g Entry<K, V> {
        self.insert_impl(OwnedKey(key), make, guard)
    }

    /// Like [`get_or_insert_with`](Self::get_or_insert_with), but borrows the key and clones it
    /// only if a new entry is inserted: one walk of the trie whether the key is present or not.
    ///
    /// ```
    /// # use keyserial_core::table::Table;
    /// # use keyserial_core::chain::{BoxNode, Chain};
    /// # use std::collections::hash_map::RandomState;
    /// let table: Table<String, Chain<BoxNode<u8>>, RandomState> = Table::with_hasher(RandomState::new());
    /// let guard = table.register().pin();
    /// let key = "alice".to_string();
    /// let a = table.get_or_insert_cloned(&key, Chain::new, &guard);
    /// let b = table.get_or_insert_cloned(&key, Chain::new, &guard); // found: no clone
    /// assert!(core::ptr::eq(a, b));
    /// ```
    pub fn get_or_insert_cloned<'g>(
        &'g self,
        key: &K,
        make: impl FnOnce() -> V,
        guard: &'g Guard,
    ) -> &'g Entry<K, V>
    where
        K: Clone,
    {
        self.insert_impl(ClonedKey(key), make, guard)
    }

    fn insert_impl<'g, Q: KeyArg<K>>(
        &'g self,
        key: Q,
        make: impl FnOnce() -> V,
        guard: &'g Guard,
    ) -> &'g Entry<K, V> {
        self.check_guard(guard);
        let hash = self.hasher.hash_one(key.as_key());
        let mut fresh = Fresh::<K, V, _, _, A>::new(hash, key, make);
        'restart: loop {
            let mut path = Path::new(self.root(hash));
            loop {
                // SAFETY: the path starts at this table's root and `guard` is this table's.
                let stop = unsafe { descend::<K, V>(&mut path, hash, guard) };
                let Step { slot, node } = path.top();
                match stop {
                    Stop::Empty => {
                        if let Some(node) = node {
                            if !node.reserve() {
                                // The node is frozen: help unlink it, then start over.
                                self.unlink_frozen_at(&mut path, guard);
                                continue 'restart;
                            }
                        }
                        let leaf = fresh.leaf();
                        fresh.set_home(Home::of(slot, node));
                        if slot.cas(Word::EMPTY, leaf).is_ok() {
                            self.count(hash, 1);
                            return fresh.publish();
                        }
                        if let Some(node) = node {
                            if node.release() {
                                // Rare but possible: while we held the reservation, the slot
                                // we wanted was filled and then every entry of the node left,
                                // so ours was the last count. The node is frozen now: unlink
                                // it; the retry, one level up, stays on the key's path.
                                self.unlink_frozen_at(&mut path, guard);
                            }
                        }
                    }
                    Stop::Leaf(word, e) if e.hash == hash && e.key == *fresh.key() => {
                        if !e.value.is_retired() {
                            return e;
                        }
                        // Replace the retired entry; its retirer's unlink will find it gone.
                        let leaf = fresh.leaf();
                        fresh.set_home(Home::of(slot, node));
                        if slot.cas(word, leaf).is_ok() {
                            // SAFETY: our CAS removed the old entry from its only slot; no new
                            // reader can reach it, current readers are covered by the epoch.
                            unsafe { defer_free_entry::<K, V, A>(guard, word.entry::<K, V>()) };
                            return fresh.publish();
                        }
                    }
                    Stop::Leaf(word, e) => {
                        // Another key holds the slot: push both one level down (or further).
                        let leaf = fresh.leaf();
                        let shift = path.shift();
                        let here = Home::of(slot, node);
                        let sub = build_subtree::<K, V>(word, e.hash, leaf, hash, shift, here);
                        // Both homes, read off the subtree while it is still private.
                        fresh.set_home(home_in_subtree(sub, leaf, hash, shift, here));
                        let moved = home_in_subtree(sub, word, e.hash, shift, here);
                        if slot.cas(word, sub).is_ok() {
                            // The other entry moved down: tell its home. Racing stores (a later
                            // expansion's) may leave an older, shallower slot here; that is
                            // still on the entry's path, which is all that counts.
                            e.set_home(moved, Ordering::Release);
                            self.count(hash, 1);
                            return fresh.publish();
                        }
                        // SAFETY: `sub` was never published; free its private nodes only.
                        unsafe { free_private_subtree::<K, V>(sub) };
                    }
                    Stop::Collision(word, coll) => {
                        let mut entries = alloc::vec::Vec::with_capacity(coll.entries.len() + 1);
                        let mut replaced = None;
                        for &p in &coll.entries {
                            // SAFETY: entries listed in a published collision node are live.
                            let e = unsafe { &*p };
                            if e.key == *fresh.key() {
                                if !e.value.is_retired() {
                                    return e;
                                }
                                replaced = Some(p);
                            } else {
                                entries.push(p);
                            }
                        }
                        entries.push(fresh.ptr());
                        // Not a leaf slot: an unlink through the home falls back to the walk.
                        fresh.set_home(Home::of(slot, node));
                        // SAFETY: `word` is the collision node just read from `slot` under
                        // `guard`, a guard of this table.
                        if unsafe { replace_collision(slot, word, entries, guard) }.is_ok() {
                            match replaced {
                                // SAFETY: our CAS unpublished the retired entry we left out of
                                // the list.
                                Some(old) => unsafe { defer_free_entry::<K, V, A>(guard, old) },
                                None => self.count(hash, 1),
                            }
                            return fresh.publish();
                        }
                    }
                }
                // A CAS lost a race: walk on from the same slot.
            }
        }
    }
}

/// How an insert holds its key until it needs an owned one.
trait KeyArg<K> {
    fn as_key(&self) -> &K;
    fn into_key(self) -> K;
}

/// A key passed by value ([`Table::get_or_insert_with`]).
struct OwnedKey<K>(K);

impl<K> KeyArg<K> for OwnedKey<K> {
    fn as_key(&self) -> &K {
        &self.0
    }
    fn into_key(self) -> K {
        self.0
    }
}

/// A borrowed key, cloned only if an entry is made ([`Table::get_or_insert_cloned`]).
struct ClonedKey<'a, K>(&'a K);

impl<K: Clone> KeyArg<K> for ClonedKey<'_, K> {
    fn as_key(&self) -> &K {
        self.0
    }
    fn into_key(self) -> K {
        self.0.clone()
    }
}

/// The entry an insert may publish: allocated on first need, freed if never published.
struct Fresh<K, V, F, Q, A: EntryAlloc> {
    hash: u64,
    key: Option<Q>,
    make: Option<F>,
    entry: Option<NonNull<Entry<K, V>>>,
    _alloc: PhantomData<A>,
}

impl<K, V, F: FnOnce() -> V, Q: KeyArg<K>, A: EntryAlloc> Fresh<K, V, F, Q, A> {
    fn new(hash: u64, key: Q, make: F) -> Self {
        Fresh {
            hash,
            key: Some(key),
            make: Some(make),
            entry: None,
            _alloc: PhantomData,
        }
    }

    fn key(&self) -> &K {
        match (&self.key, self.entry) {
            (Some(k), _) => k.as_key(),
            // SAFETY: the entry is ours until published.
            (None, Some(e)) => unsafe { &(*e.as_ptr()).key },
            (None, None) => unreachable!("key is either held or inside the entry"),
        }
    }

    /// The entry, made on first call.
    fn ptr(&mut self) -> *const Entry<K, V> {
        if let Some(e) = self.entry {
            return e.as_ptr();
        }
        let p = new_entry::<K, V, A>(Entry::new(
            self.hash,
            self.key.take().expect("key").into_key(),
            (self.make.take().expect("make"))(),
        ));
        self.entry = Some(p);
        p.as_ptr()
    }

    /// The entry as a leaf word, made on first call.
    fn leaf(&mut self) -> Word {
        Word::leaf(self.ptr())
    }

    /// Records the slot the entry is about to be published in (see "Home slots").
    fn set_home(&mut self, home: Home) {
        let p = self.ptr();
        // SAFETY: the entry is unpublished, so this thread is its only user; the publishing
        // CAS (release) makes the store visible with the entry.
        unsafe { (*p).set_home(home, Ordering::Relaxed) };
    }

    /// The entry was published by a successful CAS: hand out the reference, never free it here.
    fn publish<'g>(mut self) -> &'g Entry<K, V> {
        let e = self.entry.take().expect("published entry exists");
        // SAFETY: published entries live until unlinked and reclaimed after every guard is gone.
        unsafe { &*e.as_ptr() }
    }
}

impl<K, V, F, Q, A: EntryAlloc> Drop for Fresh<K, V, F, Q, A> {
    fn drop(&mut self) {
        if let Some(e) = self.entry.take() {
            // SAFETY: never published, so still exclusively ours; made by `new_entry::<_, _, A>`.
            unsafe { free_entry::<K, V, A>(e.as_ptr()) };
        }
    }
}

/// The home of `leaf` inside the private subtree `sub` that [`build_subtree`] made for it at the
/// slot `here`, starting at bit `shift` of `hash`. A leaf that ended up in a collision node gets
/// the home of the slot holding that node (an unlink then falls back to the walk).
fn home_in_subtree(sub: Word, leaf: Word, hash: u64, mut shift: u32, here: Home) -> Home {
    let mut home = here;
    let mut word = sub;
    while word.kind() == Kind::Inner {
        // SAFETY: the subtree is private to this thread (not yet published).
        let inner = unsafe { &*word.inner_node() };
        let s = inner.slot(hash, shift);
        home = Home::of(s, Some(inner));
        word = s.load(Ordering::Relaxed);
        shift += NODE_BITS;
    }
    debug_assert!(word == leaf || word.kind() == Kind::Collision);
    home
}

/// Builds a private subtree holding leaf `a` (hash `ha`) and leaf `b` (hash `hb`), starting with
/// the level indexed at bit `shift`, to be published in the slot `parent` names. Returns the word
/// to CAS into that slot.
fn build_subtree<K, V>(a: Word, ha: u64, b: Word, hb: u64, shift: u32, parent: Home) -> Word {
    if shift >= 64 {
        let coll = Collision::<K, V> {
            entries: alloc::vec![a.entry::<K, V>(), b.entry::<K, V>()],
        };
        return Word::collision(Box::into_raw(Box::new(coll)));
    }
    let node = Inner::new(parent);
    let (ia, ib) = (index(ha, shift), index(hb, shift));
    if ia == ib {
        let here = Home::of(&node.slots[ia], Some(&node));
        let child = build_subtree::<K, V>(a, ha, b, hb, shift + NODE_BITS, here);
        node.slots[ia].store_private(child);
        node.occupancy.store(1, Ordering::Relaxed);
    } else {
        node.slots[ia].store_private(a);
        node.slots[ib].store_private(b);
        node.occupancy.store(2, Ordering::Relaxed);
    }
    Word::inner(Box::into_raw(node))
}

/// Frees the inner and collision nodes of a subtree made by [`build_subtree`] that was never
/// published. Leaves are not freed (they belong to the table or to the inserter).
///
/// # Safety
/// `word` came from `build_subtree` and was never published.
unsafe fn free_private_subtree<K, V>(word: Word) {
    match word.kind() {
        Kind::Inner => {
            // SAFETY: private node made by build_subtree.
            let node = unsafe { Box::from_raw(word.inner_node() as *mut Inner) };
            for s in node.slots.iter() {
                let w = s.load(Ordering::Relaxed);
                if matches!(w.kind(), Kind::Inner | Kind::Collision) {
                    // SAFETY: children of a private node are private too.
                    unsafe { free_private_subtree::<K, V>(w) };
                }
            }
        }
        Kind::Collision => {
            // SAFETY: private node made by build_subtree.
            drop(unsafe { Box::from_raw(word.collision_node::<K, V>() as *mut Collision<K, V>) });
        }
        Kind::Empty | Kind::Leaf => {}
    }
}
