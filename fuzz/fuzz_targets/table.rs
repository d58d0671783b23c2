//! `Table<u8, Val, _>` against a `HashMap` model, on one thread.
//!
//! The first bytes pick the hasher: SipHash (`DefaultHasher`, fixed keys), or a deliberately weak
//! one that keeps only `bits` bits of it, shifted left by `shift`. A weak hasher makes collision
//! nodes (identical 64-bit hashes), and a large shift puts every key into root shard 0 with
//! hashes that agree on many low bits, so inserts build deep inner-node paths and unlinks shrink
//! them again (freezing and unlinking emptied inner nodes).
//!
//! Every value counts its drops; at the end, after the table and every epoch handle are gone,
//! each value made must have been dropped exactly once.
#![no_main]

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use arbitrary::Arbitrary;
use keyserial_core::table::{Entry, Retire, Table};
use libfuzzer_sys::fuzz_target;

/// SipHash with fixed keys, optionally weakened to `bits` bits shifted left by `shift`.
#[derive(Clone, Copy, Debug)]
struct Weak {
    weak: bool,
    bits: u32,
    shift: u32,
}

struct WeakHasher {
    inner: DefaultHasher,
    cfg: Weak,
}

impl Hasher for WeakHasher {
    fn finish(&self) -> u64 {
        let h = self.inner.finish();
        if !self.cfg.weak {
            return h;
        }
        let kept = if self.cfg.bits == 0 {
            0
        } else {
            h & (u64::MAX >> (64 - self.cfg.bits))
        };
        kept.checked_shl(self.cfg.shift).unwrap_or(0)
    }
    fn write(&mut self, bytes: &[u8]) {
        self.inner.write(bytes)
    }
}

impl BuildHasher for Weak {
    type Hasher = WeakHasher;
    fn build_hasher(&self) -> WeakHasher {
        WeakHasher {
            inner: DefaultHasher::new(),
            cfg: *self,
        }
    }
}

struct Val {
    id: u32,
    retired: AtomicBool,
    drops: Arc<AtomicUsize>,
}

impl Retire for Val {
    fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }
}

impl Drop for Val {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    /// `get_or_insert_with` (or `get_or_insert_cloned` if the flag is set).
    Insert(u8, bool),
    Get(u8),
    /// Retire the key's live entry (if any).
    Retire(u8),
    /// Unlink the key's retired entry (if any).
    Unlink(u8),
    /// Retire and unlink at once (the idle-release path).
    RetireUnlink(u8),
    /// Unlink an entry that already left the table (unlinked or replaced): must return false.
    UnlinkStale(u8),
    /// Drop the guard (and stale references) and pin again, letting the epoch advance.
    Repin,
}

#[derive(Arbitrary, Debug)]
struct Input {
    weak: bool,
    bits: u8,
    shift: u8,
    /// Keys are taken modulo this (+1): small key spaces make collisions likelier.
    key_space: u8,
    ops: Vec<Op>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Live(u32),
    /// Retired, still linked (the table still counts and finds it).
    Retired(u32),
}

fuzz_target!(|input: Input| {
    let hasher = Weak {
        weak: input.weak,
        bits: u32::from(input.bits % 9),
        shift: u32::from(input.shift % 64),
    };
    let space = u16::from(input.key_space) + 1;
    let drops = Arc::new(AtomicUsize::new(0));
    let mut made = 0u32;
    let table: Table<u8, Val, Weak> = Table::with_hasher(hasher);
    let handle = table.register();
    let mut model: HashMap<u8, Slot> = HashMap::new();
    let ops: Vec<Op> = input.ops.iter().copied().take(2048).collect();

    for segment in ops.split(|op| matches!(op, Op::Repin)) {
        let guard = handle.pin();
        // Entries that left the table while this guard is pinned (still valid to look at).
        let mut stale: Vec<&Entry<u8, Val>> = Vec::new();
        for &op in segment {
            let key_of = |k: u8| (u16::from(k) % space) as u8;
            match op {
                Op::Insert(k, cloned) => {
                    let k = key_of(k);
                    let before = model.get(&k).copied();
                    let old = table.get(&k, &guard);
                    let mut called = false;
                    let make = || {
                        called = true;
                        made += 1;
                        Val {
                            id: made,
                            retired: AtomicBool::new(false),
                            drops: drops.clone(),
                        }
                    };
                    let e = if cloned {
                        table.get_or_insert_cloned(&k, make, &guard)
                    } else {
                        table.get_or_insert_with(k, make, &guard)
                    };
                    assert_eq!(*e.key(), k);
                    assert!(!e.value().is_retired(), "insert returned a retired entry");
                    match before {
                        Some(Slot::Live(id)) => {
                            assert!(!called, "make ran although the key was live");
                            assert_eq!(e.value().id, id, "insert did not return the live entry");
                        }
                        other => {
                            assert!(called, "make did not run for a new key");
                            assert_eq!(e.value().id, made, "not the fresh entry");
                            if let Some(Slot::Retired(id)) = other {
                                // The retired entry was replaced: it left the table.
                                let old = old.expect("retired entry must still be found");
                                assert_eq!(old.value().id, id);
                                stale.push(old);
                            } else {
                                assert!(old.is_none(), "get found an absent key");
                            }
                            model.insert(k, Slot::Live(made));
                        }
                    }
                }
                Op::Get(k) => {
                    let k = key_of(k);
                    let got = table.get(&k, &guard);
                    match (got, model.get(&k)) {
                        (None, None) => {}
                        (Some(e), Some(&Slot::Live(id))) => {
                            assert_eq!((e.value().id, e.value().is_retired()), (id, false));
                        }
                        (Some(e), Some(&Slot::Retired(id))) => {
                            assert_eq!((e.value().id, e.value().is_retired()), (id, true));
                        }
                        (g, m) => panic!(
                            "get({k}) = {:?}, model {m:?}",
                            g.map(|e| (e.value().id, e.value().is_retired()))
                        ),
                    }
                }
                Op::Retire(k) | Op::RetireUnlink(k) => {
                    let k = key_of(k);
                    if let Some(&Slot::Live(id)) = model.get(&k) {
                        let e = table.get(&k, &guard).expect("live key not found");
                        assert_eq!(e.value().id, id);
                        assert!(!e.value().retired.swap(true, Ordering::AcqRel));
                        model.insert(k, Slot::Retired(id));
                    }
                    if matches!(op, Op::RetireUnlink(_)) {
                        unlink(&table, &guard, &mut model, &mut stale, k);
                    }
                }
                Op::Unlink(k) => unlink(&table, &guard, &mut model, &mut stale, key_of(k)),
                Op::UnlinkStale(i) => {
                    if !stale.is_empty() {
                        let e = stale[usize::from(i) % stale.len()];
                        assert!(!table.unlink(e, &guard), "an entry was unlinked twice");
                    }
                }
                Op::Repin => unreachable!("split on Repin"),
            }
            assert_eq!(table.len(), model.len(), "len disagrees with the model");
        }
    }
    // Every key the model knows is found (with its id), every other key is absent.
    let guard = handle.pin();
    for k in 0..space.min(256) {
        let k = k as u8;
        let got = table.get(&k, &guard).map(|e| e.value().id);
        let want = match model.get(&k) {
            Some(Slot::Live(id) | Slot::Retired(id)) => Some(*id),
            None => None,
        };
        assert_eq!(got, want, "key {k}");
    }
    drop(guard);
    assert_eq!(table.is_empty(), model.is_empty());
    drop(table);
    drop(handle);
    assert_eq!(
        drops.load(Ordering::Relaxed),
        made as usize,
        "every value must be dropped exactly once"
    );
});

fn unlink<'g>(
    table: &'g Table<u8, Val, Weak>,
    guard: &'g crossbeam_epoch::Guard,
    model: &mut HashMap<u8, Slot>,
    stale: &mut Vec<&'g Entry<u8, Val>>,
    k: u8,
) {
    if let Some(&Slot::Retired(id)) = model.get(&k) {
        let e = table.get(&k, guard).expect("retired entry not found");
        assert_eq!(e.value().id, id);
        assert!(
            table.unlink(e, guard),
            "the first unlink of a retired entry must succeed"
        );
        assert!(!table.unlink(e, guard), "unlink returns true exactly once");
        model.remove(&k);
        stale.push(e);
        assert!(table.get(&k, guard).is_none(), "unlinked key still found");
    }
}
