//! The table's unit tests (the loom models are in `loom/tests/table.rs`).

use super::node::Node;
use super::node::FROZEN;
use super::word::Home;
use super::*;
use core::alloc::Layout;
use core::ptr::NonNull;
use std::vec::Vec;

/// Entries through a size-class allocator that rounds every layout up (as the executor's
/// recycling caches do): alloc and free must agree on the layout on every path (published,
/// unpublished, replaced, unlinked, and left in the table when it drops).
#[test]
fn entries_through_a_rounding_allocator() {
    use crate::chain::{BoxNode, Chain};
    use std::collections::hash_map::RandomState;
    struct Rounding;
    fn class(layout: Layout) -> Layout {
        Layout::from_size_align(layout.size().max(64).next_power_of_two(), 16).unwrap()
    }
    // SAFETY: both directions use `class(layout)` with the global allocator.
    unsafe impl EntryAlloc for Rounding {
        fn alloc(layout: Layout) -> NonNull<u8> {
            // SAFETY: `class` never yields a zero size.
            NonNull::new(unsafe { std::alloc::alloc(class(layout)) }).unwrap()
        }
        unsafe fn free(block: NonNull<u8>, layout: Layout) {
            // SAFETY: per the trait's contract the block came from `alloc(layout)`.
            unsafe { std::alloc::dealloc(block.as_ptr(), class(layout)) }
        }
    }
    let t: Table<u32, Chain<BoxNode<u32>>, RandomState, Rounding> =
        Table::with_hasher(RandomState::new());
    let h = t.register();
    let g = h.pin();
    let mut garbage = Vec::new();
    for k in 0..200u32 {
        let e = t.get_or_insert_with(k, Chain::new, &g);
        assert_eq!(e.value().push_value(k), Ok(crate::chain::Pushed::Activated));
        if k % 3 == 0 {
            // SAFETY: the push activated the chain, so we own it.
            unsafe {
                assert_eq!(e.value().pop_value(), Some(k));
                assert!(e.value().try_release());
            }
            assert!(e.value().try_retire());
            if k % 2 == 0 {
                garbage.extend(t.unlink_take(e, &g));
            } else {
                // Replaced by a re-insert of the same key.
                let fresh = t.get_or_insert_with(k, Chain::new, &g);
                assert!(!core::ptr::eq(fresh, e));
                assert!(t.unlink_take(e, &g).is_none());
            }
        }
    }
    t.defer_free(garbage, &g);
    drop(g);
    drop(h);
    drop(t); // frees the live entries (some with a queued task) through `Rounding`
}

#[test]
#[should_panic(expected = "freed by the table it was taken from")]
#[cfg_attr(
    miri,
    ignore = "the misused entry is leaked on purpose, which Miri reports"
)]
fn an_unlinked_entry_is_freed_only_by_its_own_table() {
    use crate::chain::{BoxNode, Chain};
    use std::collections::hash_map::RandomState;
    let a: Table<u8, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
    let b: Table<u8, Chain<BoxNode<()>>, RandomState> = Table::with_hasher(RandomState::new());
    let ga = a.register().pin();
    let gb = b.register().pin();
    let e = a.get_or_insert_with(1, Chain::new, &ga);
    assert!(e.value().try_retire());
    let taken = a.unlink_take(e, &ga);
    b.defer_free(taken, &gb);
}
use crate::chain::{BoxNode, Chain, Pushed};
use core::hash::{BuildHasherDefault, Hasher};
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::sync::Arc;
use std::thread;

impl Retire for u32 {
    fn is_retired(&self) -> bool {
        false
    }
}

/// A value whose retirement is a flag, for table-only tests.
#[derive(Default)]
struct Flag(crate::sync::AtomicBool);
impl Retire for Flag {
    fn is_retired(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
impl Flag {
    fn retire(&self) {
        self.0.store(true, Ordering::Release)
    }
}

/// A terrible hasher: only the low 3 bits of the key survive, so everything collides.
#[derive(Default)]
struct Low3(u64);
impl Hasher for Low3 {
    fn finish(&self) -> u64 {
        self.0 & 7
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | *b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Identity hasher: lets tests place keys on chosen trie paths.
#[derive(Default)]
struct Ident(u64);
impl Hasher for Ident {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!()
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

fn n() -> usize {
    if cfg!(miri) {
        200
    } else {
        20_000
    }
}

#[test]
fn insert_get_many_keys() {
    let t: Table<u64, u32, RandomState> = Table::with_hasher(RandomState::new());
    let h = t.register();
    let g = h.pin();
    for k in 0..n() as u64 {
        let e = t.get_or_insert_with(k, || k as u32, &g);
        assert_eq!(*e.value(), k as u32);
    }
    assert_eq!(t.len(), n());
    for k in 0..n() as u64 {
        assert_eq!(t.get(&k, &g).map(|e| *e.value()), Some(k as u32));
    }
    assert!(t.get(&(n() as u64 + 1), &g).is_none());
}

#[test]
fn retire_unlink_and_reinsert_with_full_collisions() {
    let t: Table<u64, Flag, BuildHasherDefault<Low3>> = Table::with_hasher(Default::default());
    let h = t.register();
    for round in 0..3 {
        let g = h.pin();
        let keys = 0..64u64;
        for k in keys.clone() {
            t.get_or_insert_with(k, Flag::default, &g);
        }
        assert_eq!(t.len(), 64, "round {round}");
        for k in keys.clone().filter(|k| k % 2 == 0) {
            let e = t.get(&k, &g).unwrap();
            e.value().retire();
            assert!(t.unlink(e, &g));
            assert!(!t.unlink(e, &g));
        }
        assert_eq!(t.len(), 32);
        for k in keys.clone() {
            assert_eq!(t.get(&k, &g).is_some(), k % 2 == 1, "key {k}");
        }
        for k in keys.filter(|k| k % 2 == 1) {
            // Listed in a collision node: the home names the slot holding the list, so
            // this goes by search.
            let e = t.get(&k, &g).unwrap();
            let taken = retire_flag(&t, e, &g);
            assert!(taken.is_some(), "key {k}");
            t.defer_free(taken, &g);
        }
        assert_eq!(t.len(), 0);
        drop(g);
        h.pin().flush();
    }
}

#[test]
fn insert_replaces_a_retired_entry_and_unlink_then_reports_gone() {
    let t: Table<u64, Flag, RandomState> = Table::with_hasher(RandomState::new());
    let h = t.register();
    let g = h.pin();
    let old = t.get_or_insert_with(5, Flag::default, &g);
    old.value().retire();
    let new = t.get_or_insert_with(5, Flag::default, &g);
    assert!(!core::ptr::eq(old, new));
    assert!(!new.value().is_retired());
    assert!(!t.unlink(old, &g), "the inserter already took it out");
    assert_eq!(t.len(), 1);
    assert!(core::ptr::eq(t.get(&5, &g).unwrap(), new));
}

#[test]
fn empty_inner_nodes_are_unlinked() {
    let t: Table<u64, Flag, BuildHasherDefault<Ident>> = Table::with_hasher(Default::default());
    let h = t.register();
    let g = h.pin();
    // Same root slot (low 12 bits 0), same first nibble, different second nibble: two
    // levels of inner nodes.
    let keys = [0u64, 1 << 16, 2 << 16, 1 << 40];
    for &k in &keys {
        t.get_or_insert_with(k, Flag::default, &g);
    }
    assert!(!t.roots[0].load(Ordering::Relaxed).is_empty());
    assert_eq!(t.roots[0].load(Ordering::Relaxed).kind(), Kind::Inner);
    for &k in &keys {
        let e = t.get(&k, &g).unwrap();
        e.value().retire();
        assert!(t.unlink(e, &g));
    }
    assert_eq!(
        t.roots[0].load(Ordering::Relaxed),
        Word::EMPTY,
        "index shrank back to nothing"
    );
    // And it grows again.
    for &k in &keys {
        t.get_or_insert_with(k, Flag::default, &g);
    }
    for &k in &keys {
        assert!(t.get(&k, &g).is_some());
    }
}

/// Retires a `Flag` entry of `t` and takes it out through `retire_take`.
fn retire_flag<S: BuildHasher>(
    t: &Table<u64, Flag, S>,
    e: &Entry<u64, Flag>,
    g: &Guard,
) -> Option<Unlinked<u64, Flag>> {
    assert!(
        !e.value().is_retired(),
        "the test retires live entries only"
    );
    // SAFETY: every caller passes an entry it got from `t`, and the flag goes from live to
    // retired in this call (checked above; single-threaded tests).
    unsafe {
        t.retire_take(e, g, |f| {
            f.retire();
            true
        })
    }
}

/// The slot an entry's home word names.
fn home_slot<'a>(
    t: &'a Table<u64, Flag, BuildHasherDefault<Ident>>,
    e: &Entry<u64, Flag>,
) -> &'a Slot {
    // SAFETY (test): single-threaded, the entry is in the table, so its path is allocated.
    unsafe { t.slot_at(e.home(Ordering::Relaxed), e.hash).0 }
}

#[test]
fn entries_sit_in_their_home_slots_as_the_trie_grows() {
    let t: Table<u64, Flag, BuildHasherDefault<Ident>> = Table::with_hasher(Default::default());
    let h = t.register();
    let g = h.pin();
    // Root slot 0; an expansion two levels deep (which moves key 0 down); plain inserts
    // into existing inner nodes; a deep path (bit 40); another root slot.
    let keys = [0u64, 1 << 16, 2 << 16, 1 << 40, 3 << 12, 7, 1 << 44];
    for (i, &k) in keys.iter().enumerate() {
        t.get_or_insert_with(k, Flag::default, &g);
        for &k in &keys[..=i] {
            let e = t.get(&k, &g).unwrap();
            let leaf = Word::leaf(e as *const Entry<u64, Flag>);
            assert_eq!(home_slot(&t, e).load(Ordering::Relaxed), leaf, "key {k:#x}");
        }
    }
    assert_ne!(
        t.get(&0, &g).unwrap().home(Ordering::Relaxed),
        Home::ROOT,
        "key 0's home followed it down"
    );
}

#[test]
fn retire_take_unlinks_from_home_or_by_search() {
    let t: Table<u64, Flag, BuildHasherDefault<Ident>> = Table::with_hasher(Default::default());
    let h = t.register();
    let g = h.pin();
    let keys = [0u64, 1 << 16, 2 << 16, 1 << 40, 3 << 12, 7];
    for &k in &keys {
        t.get_or_insert_with(k, Flag::default, &g);
    }
    // A refused retire leaves the entry alone.
    let e = t.get(&7, &g).unwrap();
    // SAFETY: `e` is this table's; the closure retires nothing.
    assert!(unsafe { t.retire_take(e, &g, |_| false) }.is_none());
    assert!(core::ptr::eq(t.get(&7, &g).unwrap(), e));
    // Replaced by an inserter of the same key between the retire and the unlink: reported
    // gone, and the fresh entry stays.
    let mut fresh = None;
    // SAFETY: `e` is this table's; the closure makes the live-to-retired transition.
    let taken = unsafe {
        t.retire_take(e, &g, |f| {
            f.retire();
            fresh = Some(t.get_or_insert_with(7, Flag::default, &g));
            true
        })
    };
    assert!(taken.is_none());
    let fresh = fresh.unwrap();
    assert!(core::ptr::eq(t.get(&7, &g).unwrap(), fresh));
    let mut garbage = Vec::new();
    garbage.extend(retire_flag(&t, fresh, &g));
    // Every other key, from its home.
    for &k in &keys[..5] {
        let e = t.get(&k, &g).unwrap();
        let taken = retire_flag(&t, e, &g);
        assert!(taken.is_some(), "key {k:#x}");
        garbage.extend(taken);
        assert!(t.get(&k, &g).is_none());
    }
    t.defer_free(garbage, &g);
    assert_eq!(t.len(), 0);
    assert_eq!(
        t.roots[0].load(Ordering::Relaxed),
        Word::EMPTY,
        "emptied nodes were unlinked"
    );
    assert!(t.roots[7].load(Ordering::Relaxed).is_empty());
}

/// Random inserts and removals of keys that share long hash prefixes (deep paths,
/// expansions, freezes), against a `HashMap`; removals by search (`unlink`) or through the
/// home slot (`retire_take`). Every fresh entry must sit in its home slot, and once every
/// key is out the index must have shrunk to nothing.
fn churn_against_a_hashmap_model(seed: u64, iterations: usize, via_home: bool) {
    let t: Table<u64, Flag, BuildHasherDefault<Ident>> = Table::with_hasher(Default::default());
    let h = t.register();
    let remove = |e: &Entry<u64, Flag>, g: &Guard| {
        if via_home {
            let taken = retire_flag(&t, e, g);
            assert!(taken.is_some());
            t.defer_free(taken, g);
        } else {
            e.value().retire();
            assert!(t.unlink(e, g));
        }
    };
    let mut model: HashMap<u64, ()> = HashMap::new();
    let mut x = seed;
    for _ in 0..iterations {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = (x % 64) << ((x >> 8) % 50);
        let g = h.pin();
        if x & 1 == 0 {
            let e = t.get_or_insert_with(k, Flag::default, &g);
            let leaf = Word::leaf(e as *const Entry<u64, Flag>);
            if !model.contains_key(&k) {
                assert_eq!(home_slot(&t, e).load(Ordering::Relaxed), leaf);
            }
            model.insert(k, ());
        } else if let Some(e) = t.get(&k, &g) {
            remove(e, &g);
            assert!(model.remove(&k).is_some());
        } else {
            assert!(!model.contains_key(&k));
        }
    }
    assert_eq!(t.len(), model.len());
    let g = h.pin();
    for k in model.keys() {
        remove(
            t.get(k, &g).expect("a key of the model is in the table"),
            &g,
        );
    }
    assert_eq!(t.len(), 0);
    assert!(
        t.roots.iter().all(|r| r.load(Ordering::Relaxed).is_empty()),
        "index shrank to nothing"
    );
}

#[test]
fn matches_a_hashmap_model_under_churn() {
    churn_against_a_hashmap_model(0x9E37_79B9_7F4A_7C15, n(), false);
}

#[test]
fn retire_take_matches_a_hashmap_model_under_churn() {
    churn_against_a_hashmap_model(0x2545_F491_4F6C_DD1D, n() / 2, true);
}

#[test]
#[should_panic(expected = "another collector")]
fn foreign_guard_is_rejected() {
    let t: Table<u64, u32, RandomState> = Table::with_hasher(RandomState::new());
    // Keep the foreign collector alive past its handle: crossbeam-epoch frees a `Local`
    // from inside its own method when the handle holds the last reference to the collector,
    // which Miri's Tree Borrows flags (upstream pattern, not ours).
    let collector = Collector::new();
    let other = collector.register();
    let g = other.pin();
    t.get(&1, &g);
}

#[test]
fn concurrent_inserters_of_one_key_get_one_chain() {
    let rounds = if cfg!(miri) { 5 } else { 500 };
    for r in 0..rounds {
        let t: Arc<Table<u64, Chain<BoxNode<u32>>, RandomState>> =
            Arc::new(Table::with_hasher(RandomState::new()));
        let ptrs: std::vec::Vec<usize> = (0..2)
            .map(|_| {
                let t = t.clone();
                thread::spawn(move || {
                    let h = t.register();
                    let g = h.pin();
                    t.get_or_insert_with(r, Chain::new, &g) as *const _ as usize
                })
            })
            .collect::<std::vec::Vec<_>>()
            .into_iter()
            .map(|j| j.join().unwrap())
            .collect();
        assert_eq!(ptrs[0], ptrs[1]);
        assert_eq!(t.len(), 1);
    }
}

#[test]
fn submit_retire_storm_loses_no_task() {
    // Pushers look a key up and push; a drainer drains, releases and retires at once. A push
    // that meets a retired chain goes back to the table. Every pushed value must be drained.
    use std::sync::atomic::{AtomicUsize as A, Ordering as O};
    let per = if cfg!(miri) { 30 } else { 5_000 };
    let t: Arc<Table<u64, Chain<BoxNode<u64>>, RandomState>> =
        Arc::new(Table::with_hasher(RandomState::new()));
    let drained = Arc::new(A::new(0));
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let pushers: std::vec::Vec<_> = (0..2)
        .map(|_| {
            let t = t.clone();
            let tx = tx.clone();
            thread::spawn(move || {
                let h = t.register();
                for i in 0..per {
                    let g = h.pin();
                    let key = (i % 4) as u64;
                    let mut v = i as u64;
                    loop {
                        let e = t.get_or_insert_with(key, Chain::new, &g);
                        match e.value().push_value(v) {
                            Ok(Pushed::Activated) => {
                                tx.send(e as *const _ as usize).unwrap();
                                break;
                            }
                            Ok(Pushed::Queued) => break,
                            Err(crate::chain::Retired(back)) => v = back,
                        }
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let h = t.register();
    while let Ok(p) = rx.recv() {
        let g = h.pin();
        // SAFETY (test): an active chain is never retired, so its entry is alive.
        let e = unsafe { &*(p as *const Entry<u64, Chain<BoxNode<u64>>>) };
        loop {
            while unsafe { e.value().pop_value() }.is_some() {
                drained.fetch_add(1, O::Relaxed);
            }
            // SAFETY: the test's drainer owns the chain (it received the activation through the channel).
            if unsafe { e.value().try_release() } {
                break;
            }
        }
        // The executor's way: retire and unlink in one call, through the entry's home.
        // SAFETY: `e` is this table's; `try_retire` succeeds only on the transition.
        t.defer_free(unsafe { t.retire_take(e, &g, |c| c.try_retire()) }, &g);
    }
    for p in pushers {
        p.join().unwrap();
    }
    assert_eq!(drained.load(O::Relaxed), 2 * per);
}

/// Retirement as one CAS (`false -> true`): a real live-to-retired transition, as
/// `retire_take`'s contract asks.
#[derive(Default)]
struct Once(crate::sync::AtomicBool);
impl Retire for Once {
    fn is_retired(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
impl Once {
    fn try_retire(&self) -> bool {
        self.0
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// Puts every key in root slot 0 and splits them at three depths (bits 12, 16 and 56);
/// keys equal mod 64 share the whole hash (collision nodes).
#[derive(Default)]
struct Spread(u64);
impl Hasher for Spread {
    fn finish(&self) -> u64 {
        let h = self.0 % 64;
        ((h & 3) << 12) | (((h >> 2) & 3) << 16) | (((h >> 4) & 3) << 56)
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!()
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type SpreadTable = Table<u64, Once, BuildHasherDefault<Spread>>;

/// The table's structural invariants, checked while nobody uses it: every linked inner
/// node is unfrozen and non-empty, its occupancy is its number of non-empty slots, its
/// parent word names the slot holding it; every entry is live and its home is on its path;
/// `len` counts the entries.
fn check_quiet(t: &SpreadTable) {
    fn walk(word: Word, parent: Home, path: &mut Vec<Home>, n: &mut usize) {
        let entry_ok = |e: &Entry<u64, Once>, path: &Vec<Home>| {
            assert!(!e.value.is_retired(), "a retired entry left in the table");
            let home = e.home(Ordering::Relaxed);
            assert!(
                path.contains(&home),
                "home {home:x?} not on the path {path:x?}"
            );
        };
        // SAFETY (test): quiescent table, linked nodes and entries are alive.
        match unsafe { word.node::<u64, Once>() } {
            Node::Empty => unreachable!("walk is called on non-empty words"),
            Node::Leaf(e) => {
                entry_ok(e, path);
                *n += 1;
            }
            Node::Inner(node) => {
                let occupancy = node.occupancy.load(Ordering::Relaxed);
                assert_eq!(node.parent, parent, "parent word");
                assert_eq!(occupancy & FROZEN, 0, "a frozen node left linked");
                let used = node
                    .slots
                    .iter()
                    .filter(|s| !s.load(Ordering::Relaxed).is_empty())
                    .count();
                assert_eq!(occupancy, used, "occupancy");
                assert!(used > 0, "an empty node left linked");
                for s in node.slots.iter() {
                    let w = s.load(Ordering::Relaxed);
                    if !w.is_empty() {
                        let here = Home::of(s, Some(node));
                        path.push(here);
                        walk(w, here, path, n);
                        path.pop();
                    }
                }
            }
            Node::Collision(c) => {
                assert!(c.entries.len() >= 2);
                for &e in &c.entries {
                    // SAFETY (test): listed entries are alive.
                    entry_ok(unsafe { &*e }, path);
                    *n += 1;
                }
            }
        }
    }
    let mut n = 0;
    for r in t.roots.iter() {
        let w = r.load(Ordering::Relaxed);
        if !w.is_empty() {
            walk(w, Home::ROOT, &mut std::vec![Home::ROOT], &mut n);
        }
    }
    assert_eq!(n, t.len(), "len");
}

/// `threads` threads insert, retire through `retire_take`, and insert-then-retire at once
/// (so inserters replace retired entries), over `keys` keys of [`Spread`] paths; then the
/// structure is checked.
fn retire_take_storm(threads: usize, iters: usize, keys: u64, seed: u64) {
    let t: Arc<SpreadTable> = Arc::new(Table::with_hasher(Default::default()));
    let workers: std::vec::Vec<_> = (0..threads as u64)
        .map(|i| {
            let t = t.clone();
            thread::spawn(move || {
                let h = t.register();
                let mut x = seed ^ 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i + 1);
                for _ in 0..iters {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = x % keys;
                    let g = h.pin();
                    let e = match (x >> 20) % 4 {
                        0 | 1 => {
                            t.get_or_insert_with(k, Once::default, &g);
                            None
                        }
                        2 => t.get(&k, &g),
                        _ => Some(t.get_or_insert_with(k, Once::default, &g)),
                    };
                    if let Some(e) = e {
                        // SAFETY: `e` is this table's; `try_retire` is one CAS, true only
                        // on the live-to-retired transition.
                        let taken = unsafe { t.retire_take(e, &g, |v| v.try_retire()) };
                        t.defer_free(taken, &g);
                    }
                    if (x >> 40) % 64 == 0 {
                        drop(g);
                        h.pin().flush();
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    check_quiet(&t);
    // Then every key out, through the same path: the index must shrink to nothing (a
    // frozen node that nobody unlinked would stay).
    let h = t.register();
    let g = h.pin();
    for k in 0..keys {
        if let Some(e) = t.get(&k, &g) {
            // SAFETY: as above; nobody else runs now.
            let taken = unsafe { t.retire_take(e, &g, |v| v.try_retire()) };
            assert!(taken.is_some());
            t.defer_free(taken, &g);
        }
    }
    assert_eq!(t.len(), 0);
    assert!(
        t.roots.iter().all(|r| r.load(Ordering::Relaxed).is_empty()),
        "the index shrank to nothing"
    );
}

#[test]
fn retire_take_storm_keeps_the_structure_sound() {
    if cfg!(miri) {
        // Small: Miri runs it once per seed; loom explores the interleavings.
        retire_take_storm(3, 40, 40, 0x1234_5678);
        return;
    }
    for r in 0..20 {
        retire_take_storm(3, 10_000, 160, 0x1234_5678 + r);
        retire_take_storm(2, 10_000, 12, 0x9999 + r);
        retire_take_storm(4, 5_000, 2000, 0x7777 + r);
    }
}
