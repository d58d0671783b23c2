//! Deferrals: where a lane sends the items of a key whose task blocked the lane's former owner.
//!
//! # Protocol
//!
//! When an idle worker takes a lane from an owner stuck in a task of key hash `h`
//! (`Lane::try_steal`, core `lane`), it hands that owner a fresh, *open* [`Deferral`] for `h`
//! through the owner's mailbox and records it in the lane's [`Deferrals`]. From then on:
//!
//! - the lane's owner (whoever owns the lane, which may change) puts every popped item of hash
//!   `h` into the deferral while it is open, in pop order, and routes other items as usual;
//! - the stuck worker, once its task returns and its `end` finds the lane stolen, collects the
//!   deferral and *runs* it: under the deferral's lock it takes the front item, routes it
//!   exactly as a lane owner would (`route.rs`) and, to run it, enters `RUNNING` before it
//!   unlocks (if `shutdown_now` stopped it, it puts the item back in front), until it finds the
//!   deferral empty, which *closes* it, in the same critical section;
//! - an owner that finds the deferral of an item's hash closed removes it from the lane's list
//!   and routes the item itself (and sweeps out other closed ones).
//!
//! The owner looks at the list only for an item whose bit is set in a one-word summary of the
//! listed hashes (`hash % 64`), which only the owner writes, under the list's lock, whenever the
//! list changes: an item whose bit is clear has no deferral listed, open or closed, and is routed
//! at once. Closed deferrals are swept when an item of a set bit comes (1 in 64 hashes) or at
//! `shutdown_now`.
//!
//! Every step is under the deferral's lock, so an item is appended either before the close (and
//! the runner takes it) or after (and the owner routes it): never both, never lost. A key of hash
//! `h` is routed by exactly one party at a time, the runner while the deferral is open and the
//! lane's owner after, and the close orders the runner's last routing before the owner's next
//! (the lock's release and acquire), so its items keep their lane order. Two keys with the same
//! hash share a deferral (ordered, never concurrent; only one waits longer).
//!
//! `shutdown_now` (holding the lane) takes the items of every open deferral of the lane and
//! closes them; a stopped runner leaves its deferral alone (its remaining items are taken that
//! way).

use std::collections::VecDeque;
use std::sync::Arc;

use crate::lane_task::Item;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};

/// One deferred key hash's items (see the module docs).
pub(crate) struct Deferral<K> {
    hash: usize,
    inner: Mutex<Inner<K>>,
}

struct Inner<K> {
    /// Each item with the time its push is known by (`Lane::pushed_by`), for `key_stats`.
    items: VecDeque<(Item<K>, u64)>,
    open: bool,
}

impl<K> Deferral<K> {
    /// An open, empty deferral for key hash `hash`.
    pub(crate) fn new(hash: usize) -> Arc<Deferral<K>> {
        Arc::new(Deferral {
            hash,
            inner: Mutex::new(Inner {
                items: VecDeque::new(),
                open: true,
            }),
        })
    }

    /// What `shutdown_now` offers an owner whose lane it takes: no deferral at all, just "the
    /// lane is gone, stop" (never a real deferral's address: those come from `Arc::into_raw`).
    pub(crate) fn stop_sentinel() -> std::ptr::NonNull<Deferral<K>> {
        std::ptr::NonNull::dangling()
    }

    /// Whether items of hash `hash` belong here.
    pub(crate) fn is_for(&self, hash: u64) -> bool {
        self.hash == hash as usize
    }

    /// The lane's owner: appends `item` if the deferral is still open; otherwise gives it back.
    fn push(&self, item: Item<K>, pushed_by: &mut dyn FnMut() -> u64) -> Result<(), Item<K>> {
        let mut g = lock(&self.inner);
        if g.open {
            g.items.push_back((item, pushed_by()));
            Ok(())
        } else {
            Err(item)
        }
    }

    /// The runner: the deferral, locked, to take its next item (see `Next`).
    pub(crate) fn lock(&self) -> Next<'_, K> {
        Next {
            inner: lock(&self.inner),
            taken_by: 0,
        }
    }

    /// `shutdown_now`: every item, in order; the deferral is closed.
    pub(crate) fn take_all(&self) -> Vec<Item<K>> {
        let mut g = lock(&self.inner);
        g.open = false;
        g.items.drain(..).map(|(item, _)| item).collect()
    }

    fn is_open(&self) -> bool {
        lock(&self.inner).open
    }
}

/// A deferral locked by its runner: it takes the front item, and until it unlocks, nobody else
/// sees the deferral without it; it closes the deferral when it finds it empty.
pub(crate) struct Next<'a, K> {
    inner: crate::sync::MutexGuard<'a, Inner<K>>,
    /// The pushed-by time of the item last taken, for `push_front`.
    taken_by: u64,
}

impl<K> Next<'_, K> {
    pub(crate) fn pop_front(&mut self) -> Option<Item<K>> {
        let (item, by) = self.inner.items.pop_front()?;
        self.taken_by = by;
        Some(item)
    }

    /// Puts back the item just taken (its task could not start: `shutdown_now`).
    pub(crate) fn push_front(&mut self, item: Item<K>) {
        self.inner.items.push_front((item, self.taken_by));
    }

    /// The runner found the deferral empty: the lane's owner routes the hash again.
    pub(crate) fn close(&mut self) {
        self.inner.open = false;
    }
}

/// A lane's open deferrals; touched only by the lane's owner.
pub(crate) struct Deferrals<K> {
    list: Mutex<Vec<Arc<Deferral<K>>>>,
    /// A one-word summary of `list`: bit `hash % 64` of every listed deferral's hash, read
    /// without the lock on every pop (by the owner, who alone writes it). An item whose bit is
    /// clear has no deferral, so a stuck key's deferral slows down only its own items (and the
    /// 1 in 64 hashes sharing its bit), not every item of the lane.
    filter: AtomicU64,
}

/// `hash`'s bit in [`Deferrals`]' summary.
#[inline]
fn bit(hash: usize) -> u64 {
    1 << (hash % 64)
}

/// The summary of `list`.
fn summary<K>(list: &[Arc<Deferral<K>>]) -> u64 {
    list.iter().fold(0, |m, d| m | bit(d.hash))
}

impl<K> Deferrals<K> {
    pub(crate) fn new() -> Self {
        Deferrals {
            list: Mutex::new(Vec::new()),
            filter: AtomicU64::new(0),
        }
    }

    /// Records a deferral just handed to a stuck owner.
    pub(crate) fn insert(&self, d: Arc<Deferral<K>>) {
        let mut list = lock(&self.list);
        list.push(d);
        self.filter.store(summary(&list), Ordering::Relaxed);
    }

    /// Whether an item of key hash `hash` certainly has no deferral to go to (`divert` would
    /// hand it straight back). Only the lane's owner changes the list (a thief inserts once its
    /// steal made it the owner), so to the owner this is exact.
    #[inline]
    pub(crate) fn passes(&self, hash: u64) -> bool {
        self.filter.load(Ordering::Relaxed) & bit(hash as usize) == 0
    }

    /// The owner, for a popped item of key hash `hash`: puts it into its hash's open deferral
    /// and returns `None`, or returns it to be routed. Costs one load unless a deferral is
    /// listed for the hash (or one sharing its bit in the summary). `pushed_by` says by when
    /// the item was pushed (called only if it is deferred).
    #[inline]
    pub(crate) fn divert(
        &self,
        item: Item<K>,
        hash: u64,
        pushed_by: impl FnOnce() -> u64,
    ) -> Option<Item<K>> {
        if self.passes(hash) {
            return Some(item);
        }
        let mut pushed_by = Some(pushed_by);
        let mut by = move || pushed_by.take().map_or(0, |f| f());
        self.divert_slow(item, hash, &mut by)
    }

    #[cold]
    fn divert_slow(
        &self,
        item: Item<K>,
        hash: u64,
        pushed_by: &mut dyn FnMut() -> u64,
    ) -> Option<Item<K>> {
        let mut list = lock(&self.list);
        let mut item = Some(item);
        // The first *open* deferral of the hash: a closed one may still be listed beside a
        // newer one for the same hash (its key was deferred again); closed ones are dropped.
        while let Some(i) = list.iter().position(|d| d.is_for(hash)) {
            match list[i].push(item.take().expect("not yet placed"), pushed_by) {
                Ok(()) => break,
                Err(back) => {
                    item = Some(back);
                    list.swap_remove(i);
                }
            }
        }
        if item.is_some() {
            // Not deferred: forget the deferrals whose runner is done.
            list.retain(|d| d.is_open());
        }
        self.filter.store(summary(&list), Ordering::Relaxed);
        item
    }

    /// The lane's owner (an inspector, `inspect.rs`): calls `f` with every item waiting in an
    /// open deferral of key hash `hash`, oldest first, under that deferral's lock; `f` returns
    /// `true` to take the item out (it is then handed to `taken`, in order). Under the lock the
    /// runner can neither take an item nor close the deferral, so what `f` sees has not started.
    /// `f` also gets the time by which the item was pushed (`Lane::pushed_by`).
    pub(crate) fn visit_hash(
        &self,
        hash: u64,
        mut f: impl FnMut(&Item<K>, u64) -> bool,
        mut taken: impl FnMut(Item<K>),
    ) {
        if self.passes(hash) {
            return;
        }
        let list = lock(&self.list);
        for d in list.iter().filter(|d| d.is_for(hash)) {
            let mut g = lock(&d.inner);
            if !g.open {
                continue;
            }
            // In place: if `f` (user code) panics, every item not yet taken stays queued.
            let mut i = 0;
            while i < g.items.len() {
                let (item, by) = &g.items[i];
                if f(item, *by) {
                    taken(g.items.remove(i).expect("in bounds").0);
                } else {
                    i += 1;
                }
            }
        }
    }

    /// The lane's owner (an inspector): calls `f` with every item waiting in an open deferral.
    pub(crate) fn visit_all(&self, mut f: impl FnMut(&Item<K>)) {
        let list = lock(&self.list);
        for d in list.iter() {
            let g = lock(&d.inner);
            if g.open {
                g.items.iter().for_each(|(item, _)| f(item));
            }
        }
    }

    /// `shutdown_now` or a stopped owner: the items of every open deferral, closing them all.
    pub(crate) fn take_all(&self) -> Vec<Item<K>> {
        let mut list = lock(&self.list);
        let items = list.iter().flat_map(|d| d.take_all()).collect();
        list.clear();
        self.filter.store(0, Ordering::Relaxed);
        items
    }
}

/// Hooks for the loom model in `loom/` (only under `cfg(loom)`): a lane's deferrals and one
/// deferral, over `u32` keys, driven through the very methods the executor calls.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_hooks {
    use std::sync::Arc;

    use super::{Deferral, Deferrals};
    use crate::lane_task::{Item, LaneTask};

    /// A lane's deferrals.
    pub struct List(Deferrals<u32>);

    /// One deferral, as its runner holds it.
    pub struct Deferred(Arc<Deferral<u32>>);

    /// A lane's deferrals holding one open deferral for key hash `hash`, and that deferral.
    pub fn deferred(hash: u64) -> (List, Deferred) {
        let list = Deferrals::new();
        let d = Deferral::new(hash as usize);
        list.insert(d.clone());
        (List(list), Deferred(d))
    }

    /// The lane's owner pops key `key` (of hash `hash`): `true` if it went to the deferral,
    /// `false` if the owner routes it itself.
    pub fn divert(list: &List, key: u32, hash: u64) -> bool {
        let task = LaneTask::execute(|| ());
        list.0
            .divert(Item { key, hash, task }, hash, || 1)
            .is_none()
    }

    /// One step of the runner (`WorkerLoop::run_deferral`, without routing): the next key, or
    /// `None` once it found the deferral empty and closed it.
    pub fn run_step(d: &Deferred) -> Option<u32> {
        let mut next = d.0.lock();
        match next.pop_front() {
            Some(item) => Some(item.key),
            None => {
                next.close();
                None
            }
        }
    }

    /// What a stopped owner hands back of the lane's deferrals.
    pub fn take_all(list: &List) -> Vec<u32> {
        list.0.take_all().into_iter().map(|i| i.key).collect()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::lane_task::LaneTask;

    fn item(key: u32, hash: u64) -> Item<u32> {
        Item {
            key,
            hash,
            task: LaneTask::execute(|| ()),
        }
    }

    #[test]
    fn the_summary_lets_other_keys_pass_and_sweeps_a_closed_deferral() {
        let list: Deferrals<u32> = Deferrals::new();
        assert!(list.passes(5));
        let d = Deferral::new(5);
        list.insert(d.clone());
        // Only hash 5's bit is set: 6 passes without the lock; 5 and 69 (same bit) do not.
        assert!(list.passes(6));
        assert!(!list.passes(5) && !list.passes(69));
        assert!(list.divert(item(1, 5), 5, || 7).is_none(), "5 is deferred");
        let mut seen = Vec::new();
        list.visit_hash(
            5,
            |i, by| {
                seen.push((i.key, by));
                false
            },
            |_| {},
        );
        assert_eq!(seen, [(1, 7)], "kept with the time it was pushed by");
        let back = list
            .divert(item(2, 69), 69, || {
                unreachable!("not deferred: no time asked")
            })
            .expect("69 shares the bit, not the deferral");
        assert_eq!(back.key, 2);
        // The runner drains and closes the deferral; the next item of the bit sweeps it.
        let mut next = d.lock();
        assert_eq!(next.pop_front().map(|i| i.key), Some(1));
        assert!(next.pop_front().is_none());
        next.close();
        drop(next);
        assert!(
            !list.passes(5),
            "a closed deferral stays listed until swept"
        );
        assert!(
            list.divert(item(3, 5), 5, || unreachable!()).is_some(),
            "closed: the owner routes it"
        );
        assert!(list.passes(5) && list.passes(69), "swept");
        assert!(list.take_all().is_empty());
    }
}
