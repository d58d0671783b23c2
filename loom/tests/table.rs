//! Loom models of the key table (core/src/table.rs), over the real code. crossbeam-epoch's own
//! atomics are not loom's, so reclamation is treated as a correct black box (loom runs one
//! thread at a time, which crossbeam's SeqCst reasoning covers); what is explored is every
//! interleaving of the table's own CASes.
//!
//! One thing the black box must be told: pinning and flushing are SeqCst fences in
//! crossbeam-epoch, and that is what makes a thread that pins after an unlink see the unlink.
//! Loom does not see those fences, so without help it lets a reader that pinned after the
//! unlinker's flush (in schedule order) still load the unlinked pointer from the slot, while the
//! real epoch, which saw nobody pinned, has already freed the entry: a use-after-free of the
//! model, not of the table. [`pin`] and [`flush`] add the fences loom can see. (The model of the
//! lookup racing reclamation used to pass only because the freed memory still looked valid; it
//! crashed as soon as the entry's layout changed.)
#![cfg(loom)]

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;

use keyserial_core::chain::{BoxNode, Chain, Retired};
use keyserial_core::table::{Retire, Table};
use loom::sync::atomic::{fence, AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

type H = BuildHasherDefault<DefaultHasher>;

/// Pins, with the SeqCst fence crossbeam-epoch's pin performs, made visible to loom.
fn pin(h: &crossbeam_epoch::LocalHandle) -> crossbeam_epoch::Guard {
    let g = h.pin();
    fence(Ordering::SeqCst);
    g
}

/// Flushes the thread's deferred frees, after the SeqCst fence crossbeam-epoch performs before
/// it tries to advance the epoch, made visible to loom.
fn flush(h: &crossbeam_epoch::LocalHandle) {
    fence(Ordering::SeqCst);
    h.pin().flush();
}

/// A chain that records, in a flag the model can read, when it is freed.
struct Probe {
    chain: Chain<BoxNode<u32>>,
    freed: Arc<AtomicBool>,
}

impl Retire for Probe {
    fn is_retired(&self) -> bool {
        self.chain.is_retired()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.freed.store(true, Ordering::Release);
    }
}

#[test]
fn two_inserters_of_one_key_get_one_chain() {
    loom::model(|| {
        let t: Arc<Table<u32, Chain<BoxNode<u32>>, H>> = Arc::new(Table::with_hasher(H::default()));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let t = t.clone();
                thread::spawn(move || {
                    let h = t.register();
                    let g = pin(&h);
                    t.get_or_insert_with(1, Chain::new, &g) as *const _ as usize
                })
            })
            .collect();
        let ptrs: Vec<usize> = threads.into_iter().map(|j| j.join().unwrap()).collect();
        assert_eq!(ptrs[0], ptrs[1]);
        assert_eq!(t.len(), 1);
    });
}

#[test]
fn two_inserters_of_colliding_keys_both_land() {
    // Identity hash; under loom the root has 4 slots, so keys 4 and 8 share root slot 0 and part
    // at the first inner level: the expansion CAS races the plain insert.
    loom::model(|| {
        let t: Arc<IdentTable> = Arc::new(Table::with_hasher(Default::default()));
        let threads: Vec<_> = [4, 8]
            .into_iter()
            .map(|k| {
                let t = t.clone();
                thread::spawn(move || {
                    let h = t.register();
                    let g = pin(&h);
                    t.get_or_insert_with(k, Chain::new, &g);
                })
            })
            .collect();
        for j in threads {
            j.join().unwrap();
        }
        let h = t.register();
        let g = pin(&h);
        assert!(t.get(&4, &g).is_some() && t.get(&8, &g).is_some());
        assert_eq!(t.len(), 2);
    });
}

#[test]
fn lookup_racing_unlink_and_reclamation_never_sees_freed_memory() {
    loom::model(|| {
        let t: Arc<Table<u32, Probe, H>> = Arc::new(Table::with_hasher(H::default()));
        let freed = Arc::new(AtomicBool::new(false));
        {
            let h = t.register();
            let g = pin(&h);
            let f = freed.clone();
            t.get_or_insert_with(
                1,
                move || Probe {
                    chain: Chain::new(),
                    freed: f,
                },
                &g,
            );
        }
        let t2 = t.clone();
        let reader = thread::spawn(move || {
            let h = t2.register();
            let g = pin(&h);
            if let Some(e) = t2.get(&1, &g) {
                // Still pinned: whatever happened to the entry, its memory is alive.
                assert!(
                    !e.value().freed.load(Ordering::Acquire),
                    "read a freed entry"
                );
                let _ = e.value().chain.is_retired();
            }
        });
        {
            let h = t.register();
            let g = pin(&h);
            let e = t.get(&1, &g).unwrap();
            assert!(e.value().chain.try_retire());
            assert!(t.unlink(e, &g));
            drop(g);
            // Push reclamation as far as it goes.
            for _ in 0..3 {
                flush(&h);
            }
        }
        reader.join().unwrap();
        assert_eq!(t.len(), 0);
    });
}

/// Executions of `pusher_meeting_a_retired_chain_goes_back_to_the_table` in which the push
/// bounced off the retired chain and the pusher looked the key up again (a plain std counter
/// across executions).
static PUSH_RETRIED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[test]
fn pusher_meeting_a_retired_chain_goes_back_to_the_table() {
    // The submit loop of the std executor: look up (or insert) the key's chain and push; on
    // `Retired`, look up again. Racing a drainer that retires and unlinks, the task must end up in
    // a live chain, exactly once. The pusher (the main thread, so it runs first) may only load
    // the slot before the retirer's unlink loads it and CASes it, a pair loom 0.7 can hide (it
    // keeps only the last access of each atomic, tokio-rs/loom#392): the counter checks that the
    // bounce and retry were reached.
    loom::model(|| {
        let t: Arc<Table<u32, Chain<BoxNode<u32>>, H>> = Arc::new(Table::with_hasher(H::default()));
        {
            let h = t.register();
            let g = pin(&h);
            t.get_or_insert_with(1, Chain::new, &g);
        }
        let t2 = t.clone();
        let retirer = thread::spawn(move || {
            let h = t2.register();
            let g = pin(&h);
            if let Some(e) = t2.get(&1, &g) {
                if e.value().try_retire() {
                    t2.unlink(e, &g);
                }
            }
        });
        let h = t.register();
        let g = pin(&h);
        let mut v = 42;
        let mut attempts = 0;
        let entry = loop {
            attempts += 1;
            assert!(attempts <= 3, "the retry loop must converge");
            let e = t.get_or_insert_with(1, Chain::new, &g);
            match e.value().push_value(v) {
                Ok(_) => break e,
                Err(Retired(back)) => v = back,
            }
        };
        retirer.join().unwrap();
        if attempts > 1 {
            PUSH_RETRIED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        assert!(!entry.value().is_retired(), "the task sits in a live chain");
        // SAFETY: this thread's push activated the chain (nobody else pushes).
        assert_eq!(unsafe { entry.value().pop_value() }, Some(42));
        assert!(unsafe { entry.value().try_release() });
        assert!(core::ptr::eq(t.get(&1, &g).unwrap(), entry));
    });
    assert!(
        PUSH_RETRIED.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the model never bounced a push off the retired chain"
    );
}

/// Identity hash (of `u32` keys): places keys on chosen paths. Under loom the root has 4 slots
/// (2 bits) and each inner level takes the next 4 bits.
#[derive(Default)]
struct Ident(u64);
impl std::hash::Hasher for Ident {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!()
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = n as u64;
    }
}
type IdentTable = Table<u32, Chain<BoxNode<u32>>, BuildHasherDefault<Ident>>;

/// Keys 4 and 8 share root slot 0 and part at the first inner level (slots 1 and 2 of node N):
/// 8 is published in N, its home; 4 was published in the root and moved down.
fn table_with_4_and_8() -> Arc<IdentTable> {
    let t: Arc<IdentTable> = Arc::new(Table::with_hasher(Default::default()));
    let h = t.register();
    let g = pin(&h);
    t.get_or_insert_with(4, Chain::new, &g);
    t.get_or_insert_with(8, Chain::new, &g);
    t
}

/// Inserts `key` into `t` from a new thread.
fn spawn_insert(t: &Arc<IdentTable>, key: u32) -> thread::JoinHandle<()> {
    let t = t.clone();
    thread::spawn(move || {
        let h = t.register();
        let g = pin(&h);
        t.get_or_insert_with(key, Chain::new, &g);
    })
}

/// The owner's retire of `key` through `retire_take`, its entry handed to the epoch. Returns
/// whether this call took the entry out (`false`: an inserter replaced it first).
fn retire_and_take(t: &IdentTable, key: u32, g: &crossbeam_epoch::Guard) -> bool {
    let e = t.get(&key, g).expect("the key is in the table");
    // SAFETY: the entry is this table's; `try_retire` succeeds only on the transition.
    let taken = unsafe { t.retire_take(e, g, |c| c.try_retire()) };
    let took = taken.is_some();
    t.defer_free(taken, g);
    took
}

#[test]
fn retire_take_racing_an_expansion_of_its_home() {
    // Key 72 lands in N's slot 2 too (72 >> 2 = 18, low nibble 2): its insert pushes entry 8 one
    // level deeper while 8's owner unlinks it through its home. Either the home CAS wins (and
    // the expansion CAS fails and retries on an empty slot), or the entry moved first (and the
    // unlink falls back to the search). Exactly one removal either way.
    loom::model(|| {
        let t = table_with_4_and_8();
        let inserter = spawn_insert(&t, 72);
        let h = t.register();
        let g = pin(&h);
        assert!(
            retire_and_take(&t, 8, &g),
            "the owner's retire_take removes the entry"
        );
        inserter.join().unwrap();
        assert!(t.get(&8, &g).is_none());
        assert!(t.get(&4, &g).is_some() && t.get(&72, &g).is_some());
        assert_eq!(t.len(), 2);
    });
}

#[test]
fn retire_take_racing_a_replacement() {
    // An inserter of key 8 that meets the retired entry replaces it in its slot; the owner's
    // home CAS then fails and the search reports the entry gone. Or the owner wins and the
    // inserter publishes a fresh entry in the emptied slot. Never both, never neither.
    loom::model(|| {
        let t = table_with_4_and_8();
        let t2 = t.clone();
        let inserter = thread::spawn(move || {
            let h = t2.register();
            let g = pin(&h);
            let e = t2.get_or_insert_with(8, Chain::new, &g);
            (e as *const _ as usize, e.value().is_retired())
        });
        let h = t.register();
        let g = pin(&h);
        let e8 = t.get(&8, &g).unwrap();
        // SAFETY: the entry is this table's; `try_retire` succeeds only on the transition.
        let taken = unsafe { t.retire_take(e8, &g, |c| c.try_retire()) };
        let took = taken.is_some();
        t.defer_free(taken, &g);
        let (got, got_retired) = inserter.join().unwrap();
        let now = t.get(&8, &g);
        if got == e8 as *const _ as usize {
            // The inserter found the old entry before the retire (it may see it retired since).
            assert!(took, "nobody replaced it, so the owner removed it");
            assert!(now.is_none());
            assert_eq!(t.len(), 1);
        } else {
            assert!(
                !got_retired,
                "an inserter never returns a retired entry it made"
            );
            assert_eq!(now.map(|e| e as *const _ as usize), Some(got));
            assert_eq!(t.len(), 2);
        }
    });
}

#[test]
fn retire_take_that_empties_its_home_node_racing_an_insert_into_it() {
    // The owner takes out 8 (home N) and 4 (moved down into N): the second removal empties and
    // freezes N and unlinks it from root slot 0. Key 12 (N's slot 3) is inserted meanwhile:
    // into N before the freeze, or, meeting N frozen, after helping unlink it. 12 must land.
    loom::model(|| {
        let t = table_with_4_and_8();
        let inserter = spawn_insert(&t, 12);
        let h = t.register();
        {
            let g = pin(&h);
            for k in [8, 4] {
                assert!(retire_and_take(&t, k, &g), "key {k}");
            }
        }
        flush(&h);
        inserter.join().unwrap();
        let g = pin(&h);
        assert!(t.get(&12, &g).is_some(), "the racing insert landed");
        assert!(t.get(&4, &g).is_none() && t.get(&8, &g).is_none());
        assert_eq!(t.len(), 1);
    });
}

#[test]
fn retire_take_racing_two_expansions_of_its_entry() {
    // 4 sits in root slot 0. Inserting 8 moves it into a new node N1 (slot 1); inserting 68
    // (slots 0, then 1, then 1 again) moves it once more, or together with 8's expansion in
    // either order, so the two home stores can land in either order. The owner retires 4
    // through its home meanwhile; then every key is taken out and inserted again: exactly one
    // removal each, and no frozen node left in the way.
    loom::model(|| {
        let t: Arc<IdentTable> = Arc::new(Table::with_hasher(Default::default()));
        {
            let h = t.register();
            let g = pin(&h);
            t.get_or_insert_with(4, Chain::new, &g);
        }
        let inserters = [spawn_insert(&t, 8), spawn_insert(&t, 68)];
        let h = t.register();
        {
            let g = pin(&h);
            assert!(retire_and_take(&t, 4, &g));
        }
        for j in inserters {
            j.join().unwrap();
        }
        let g = pin(&h);
        assert!(t.get(&4, &g).is_none());
        assert_eq!(t.len(), 2);
        for k in [8u32, 68] {
            assert!(retire_and_take(&t, k, &g), "key {k}");
        }
        assert_eq!(t.len(), 0);
        for k in [4u32, 8, 68] {
            t.get_or_insert_with(k, Chain::new, &g);
        }
        assert_eq!(t.len(), 3);
    });
}
