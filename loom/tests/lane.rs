//! Loom models of a lane's ownership word and of the steal handoff (core/src/lane.rs), over the
//! real `Lane` and `Mailbox`.
//!
//! The lane's FIFO is a stand-in: a fixed list of key hashes and a consumer cursor in a loom
//! `UnsafeCell` that only the lane's current owner touches (a pop is a `with_mut`). So loom itself
//! reports two owners popping at once, and an owner change without the happens-before the module
//! docs promise (a release to the next acquire, a `begin` to the steal that takes the lane from
//! inside that task, a thief's release back to the robbed owner). A deferral is a heap
//! [`Deferral`] that the thief builds for the key hash its `Watch` read, and passes as a raw pointer
//! through `try_steal` and `Ended::Stolen`. The key hash sits in a loom cell that the thief writes
//! (the cell's creation) and whoever frees the deferral reads, so loom checks that the deferral
//! reached that thread with happens-before. Its `Drop` counts per thief: every model checks at the
//! end that each deferral built was freed exactly once, by the thief when `try_steal` hands it
//! back, or by the robbed owner after `Ended::Stolen`. The robbed owner also checks that the
//! deferral is the winning thief's (same address, same thief) and that its key hash is the key of
//! the task it was inside, which a stale `current` read by `watch` would break. Tasks' bodies are
//! not modelled: a thief that took the lane pops what is left and releases it.
//!
//! **Thread order.** Loom 0.7's DPOR keeps only the last access of each atomic, so a thread that
//! only loads a word can hide from the race check behind another's load-then-write
//! (tokio-rs/loom#392). A thief only *loads* the lane's word (`watch`) before its CASes, while an
//! owner loads it and then writes it (`begin`, `release`), so the owners' threads are spawned first
//! and the thieves last, and the main thread only sets the lane up (acquiring it, sometimes
//! beginning a task) and joins. (Spawning them the other way round reached the same outcomes here,
//! with the same execution counts but for the two-thief model.) Coverage counters (std statics,
//! outside the model) check that each model reached the interleavings it exists for: a steal won in
//! either task, lost, or never tried; each of two racing thieves winning, and neither; a lane
//! handed back to the worker it was stolen from; a second worker's acquire both refused and
//! successful; a stale offer.
//!
//! **What loom cannot check here: that a stolen owner *finds* the offer.** The Release of the
//! thief's winning CAS and the Acquire of `end`'s failed CAS make the offer happen before the
//! owner's collect, so that the collect's `swap` cannot come before the offer in the mailbox's
//! modification order (which C11 would otherwise allow: `end` would hit its `unreachable!`).
//! Loom 0.7 lets a read-modify-write read only a store that is maximal in its modification order,
//! so the collect always reads the offer, whatever orderings the lane uses; and the deferral's
//! contents are published by the mailbox itself (Release offer, Acquire collect). Weakening either
//! of the two orderings alone therefore passes every model; weakening one of them together with
//! the offer's Release fails them (the deferral's cell is then read without happens-before), so
//! the models do see the path through the word, just not the coherence it exists for.
//! `stolen_owner_collects_the_winning_offer` checks the handoff's outcome only.
#![cfg(loom)]

mod common;

use common::coverage::{assert_all_reached, count};

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::sync::Arc as StdArc;

use keyserial_core::lane::{Ended, Lane, Mailbox, Phase, Running, Watch};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

/// Worker ids in the models: 0 is the lane's first owner, 1 and 2 are thieves or other workers,
/// 3 is the main thread settling the lane at the end.
const WORKERS: usize = 4;
const SETTLER: usize = 3;

/// Per thief: deferrals built and freed in one execution. Plain std atomics: bookkeeping outside
/// the model, not a point where loom switches threads.
#[derive(Default)]
struct Tally {
    built: [StdAtomicUsize; WORKERS],
    freed: [StdAtomicUsize; WORKERS],
}

/// A thief's deferral for the key the robbed owner was running (see the module docs).
struct Deferral {
    thief: usize,
    /// The key hash, written on the thief's thread and read by whoever frees it.
    key: UnsafeCell<usize>,
    tally: StdArc<Tally>,
}

impl Drop for Deferral {
    fn drop(&mut self) {
        self.tally.freed[self.thief].fetch_add(1, StdOrdering::Relaxed);
    }
}

/// The lane, its FIFO stand-in, every worker's mailbox, and the deferral tally.
struct World {
    lane: Lane,
    /// The tasks' key hashes in submission order.
    keys: &'static [usize],
    /// The FIFO's consumer cursor: the index of the next task to pop. Only the lane's owner
    /// touches it (and the main thread, once every other thread is joined).
    next: UnsafeCell<usize>,
    boxes: [Mailbox<Deferral>; WORKERS],
    tally: StdArc<Tally>,
}

// SAFETY: `next` is touched only by the lane's owner (loom checks that); the rest is Sync.
unsafe impl Sync for World {}
// SAFETY: as above.
unsafe impl Send for World {}

/// How an owner's run ended when a thief took the lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Robbed {
    /// The key of the task it was inside.
    key: usize,
    /// The thief whose deferral it collected, and the deferral's address.
    by: usize,
    at: usize,
}

/// What a thief's single attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Thief {
    /// `watch` found no owner inside a task.
    Idle,
    /// It saw an owner inside the task of `key`, tried, and `try_steal` handed its deferral back
    /// (freed by the thief).
    Lost { key: usize },
    /// It took the lane from an owner inside the task of `key`, handing over the deferral at `at`.
    Won { key: usize, at: usize },
}

impl World {
    fn new(keys: &'static [usize]) -> Arc<World> {
        Arc::new(World {
            lane: Lane::new(),
            keys,
            next: UnsafeCell::new(0),
            boxes: std::array::from_fn(|_| Mailbox::new()),
            tally: StdArc::new(Tally::default()),
        })
    }

    /// Pops the next task's key hash (a write of the cursor even when the FIFO is empty). The
    /// caller owns the lane.
    fn pop(&self) -> Option<usize> {
        self.next.with_mut(|next| {
            // SAFETY: only the lane's owner touches the cursor, and the caller owns the lane.
            let i = unsafe { *next };
            let key = self.keys.get(i).copied();
            if key.is_some() {
                // SAFETY: as above.
                unsafe { *next = i + 1 };
            }
            key
        })
    }

    /// Pops everything left, without running it, and releases; returns how many it popped. The
    /// caller `me` owns the lane.
    fn drain_and_release(&self, me: usize) -> usize {
        let mut n = 0;
        while self.pop().is_some() {
            n += 1;
        }
        self.lane.release(me);
        n
    }

    /// The owner `me` ends the task of `key` it began with `run`: `Ok` if it keeps the lane; if
    /// a thief took it, frees the deferral it collected (checking it was built for `key`).
    fn end(&self, me: usize, run: Running, key: usize) -> Result<(), Robbed> {
        match self.lane.end(run, &self.boxes[me]) {
            Ended::Kept => Ok(()),
            Ended::Stolen(p) => {
                let (by, deferred) = free(p);
                assert_eq!(deferred, key, "the deferral is for another key");
                Err(Robbed {
                    key,
                    by,
                    at: p.as_ptr() as usize,
                })
            }
        }
    }

    /// The owner `me` runs tasks (pop, begin, end) until the FIFO is empty, then releases; or
    /// stops when a thief takes the lane.
    fn own(&self, me: usize) -> Result<(), Robbed> {
        while let Some(key) = self.pop() {
            let run = self.lane.begin(me, key);
            self.end(me, run, key)?;
        }
        self.lane.release(me);
        Ok(())
    }

    /// [`own`](Self::own) for an owner already inside the task of `key` (begun with `run`).
    fn finish(&self, me: usize, run: Running, key: usize) -> Result<(), Robbed> {
        self.end(me, run, key)?;
        self.own(me)
    }

    /// Builds worker `me`'s deferral for the key a watch saw.
    fn defer(&self, me: usize, seen: &Watch) -> NonNull<Deferral> {
        self.tally.built[me].fetch_add(1, StdOrdering::Relaxed);
        NonNull::from(Box::leak(Box::new(Deferral {
            thief: me,
            key: UnsafeCell::new(seen.key_hash()),
            tally: self.tally.clone(),
        })))
    }

    /// One steal attempt by worker `me`: watch once; if an owner is inside a task, offer a
    /// deferral for its key and try to take the lane. A thief that wins pops what is left and
    /// releases; one that loses frees its deferral.
    fn steal(&self, me: usize) -> Thief {
        let Some(seen) = self.lane.watch() else {
            return Thief::Idle;
        };
        assert_ne!(seen.owner(), me, "a thief watched itself inside a task");
        let p = self.defer(me, &seen);
        match self.lane.try_steal(me, &seen, &self.boxes[seen.owner()], p) {
            Ok(()) => {
                self.drain_and_release(me);
                Thief::Won {
                    key: seen.key_hash(),
                    at: p.as_ptr() as usize,
                }
            }
            Err(back) => {
                assert_eq!(back, p, "a failed steal handed back another deferral");
                let (by, key) = free(back);
                assert_eq!((by, key), (me, seen.key_hash()));
                Thief::Lost { key }
            }
        }
    }

    /// The end of every model, once all its threads are joined: the lane is free (the main thread
    /// takes it, pops what is left and releases it), every mailbox is empty, every task was
    /// popped, and every deferral was freed exactly once. Returns how many tasks were left.
    fn settle(&self) -> usize {
        assert_eq!(self.lane.phase(), Phase::Free, "a lane left owned");
        assert!(self.lane.watch().is_none());
        assert!(self.lane.try_acquire(SETTLER), "a free lane refused");
        let left = self.drain_and_release(SETTLER);
        // SAFETY: every other thread is joined.
        let next = self.next.with(|next| unsafe { *next });
        assert_eq!(next, self.keys.len(), "a task was never popped");
        for (w, b) in self.boxes.iter().enumerate() {
            assert!(b.is_empty(), "worker {w}'s mailbox holds a stray offer");
        }
        for w in 0..WORKERS {
            let built = self.tally.built[w].load(StdOrdering::Relaxed);
            let freed = self.tally.freed[w].load(StdOrdering::Relaxed);
            assert_eq!(
                freed, built,
                "worker {w} built {built} deferrals, {freed} freed"
            );
        }
        left
    }
}

/// Frees a deferral; returns its thief and the key hash it was built for (read through its cell).
fn free(p: NonNull<Deferral>) -> (usize, usize) {
    // SAFETY: a `World::defer` box, handed to the caller by `try_steal` or `Ended::Stolen`, and
    // freed only here.
    let d = unsafe { Box::from_raw(p.as_ptr()) };
    // SAFETY: the cell is only ever read after its creation.
    let key = d.key.with(|k| unsafe { *k });
    (d.thief, key)
}

/// Spawns a model thread running `f` on the world.
fn spawn<R: 'static>(
    w: &Arc<World>,
    f: impl FnOnce(&World) -> R + 'static,
) -> thread::JoinHandle<R> {
    let w = w.clone();
    thread::spawn(move || f(&w))
}

/// A world whose lane the main thread acquired for worker 0.
fn owned_by_zero(keys: &'static [usize]) -> Arc<World> {
    let w = World::new(keys);
    assert!(w.lane.try_acquire(0));
    w
}

/// A world whose lane worker 0 (the main thread) acquired and popped its first task from, and is
/// now inside it: returns the running token and that task's key.
fn stuck_in_first_task(keys: &'static [usize]) -> (Arc<World>, Running, usize) {
    let w = owned_by_zero(keys);
    let key = w.pop().expect("a task to be stuck in");
    let run = w.lane.begin(0, key);
    (w, run, key)
}

/// The robbed owner and the winning thief agree: the owner collected exactly that thief's
/// deferral, built for the key the owner was inside.
fn assert_handoff(robbed: Robbed, thief: usize, won: Thief) {
    match won {
        Thief::Won { key, at } => assert_eq!(robbed, Robbed { key, by: thief, at }),
        other => panic!(
            "robbed by thief {} but thief {thief} says {other:?}",
            robbed.by
        ),
    }
}

#[test]
fn owner_running_two_tasks_vs_one_thief() {
    // Worker 0 runs tasks of keys 10 and 20 (pop, begin, end each), then releases; worker 1
    // watches once and, if worker 0 is inside a task, tries to steal the lane. Its watch may be
    // stale (task 10 seen, task 20 running): then the steal must fail.
    static OUTCOMES: [StdAtomicUsize; 4] = counters!(4);
    loom::model(|| {
        let w = owned_by_zero(&[10, 20]);
        let owner = spawn(&w, |w| w.own(0));
        let thief = spawn(&w, |w| w.steal(1));
        let owned = owner.join().unwrap();
        let stole = thief.join().unwrap();
        match (owned, stole) {
            (Ok(()), Thief::Idle) => count(&OUTCOMES, 0),
            (Ok(()), Thief::Lost { .. }) => count(&OUTCOMES, 1),
            (Err(robbed), won) => {
                assert_handoff(robbed, 1, won);
                count(&OUTCOMES, if robbed.key == 10 { 2 } else { 3 });
            }
            other => panic!("impossible outcome {other:?}"),
        }
        assert_eq!(w.settle(), 0, "the owner or the thief pops everything");
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "no steal tried",
            "steal lost",
            "stolen in 10",
            "stolen in 20",
        ],
    );
}

#[test]
fn two_thieves_race_for_one_stuck_owner() {
    // Worker 0 is inside the task of key 10 (begun on the main thread) and ends it on its own
    // thread, then runs the task of key 20; workers 1 and 2 each watch once and try to steal. At
    // most one steal wins; a loser gets its own deferral back; the robbed owner collects exactly
    // the winner's. A thief may steal in either task, and the other one's watch may be stale.
    static OUTCOMES: [StdAtomicUsize; 5] = counters!(5);
    loom::model(|| {
        let (w, run, key) = stuck_in_first_task(&[10, 20]);
        let owner = spawn(&w, move |w| w.finish(0, run, key));
        let thieves = [1, 2].map(|me| spawn(&w, move |w| w.steal(me)));
        let owned = owner.join().unwrap();
        let stole = thieves.map(|t| t.join().unwrap());
        let winners: Vec<usize> = (1..=2)
            .filter(|&me| matches!(stole[me - 1], Thief::Won { .. }))
            .collect();
        let losers = stole
            .iter()
            .filter(|t| matches!(t, Thief::Lost { .. }))
            .count();
        match (owned, winners.as_slice()) {
            (Ok(()), []) => count(&OUTCOMES, if losers == 2 { 1 } else { 0 }),
            (Err(robbed), &[winner]) => {
                assert_handoff(robbed, winner, stole[winner - 1]);
                count(&OUTCOMES, 1 + winner);
                if losers == 1 {
                    count(&OUTCOMES, 4);
                }
            }
            (owned, winners) => panic!("owner {owned:?} with winners {winners:?}"),
        }
        assert_eq!(w.settle(), 0);
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "none wins",
            "none wins, both tried",
            "thief 1 wins",
            "thief 2 wins",
            "one wins, the other tried and lost",
        ],
    );
}

#[test]
fn release_then_acquire_by_another_worker() {
    // Worker 0 pops the task of key 10 and releases the lane; worker 1 tries once to acquire it
    // and, if that works, pops the rest and releases. The acquire succeeds only after the release
    // (and then loom checks that the pop came before worker 1's pop); before it, it is refused.
    static OUTCOMES: [StdAtomicUsize; 2] = counters!(2);
    loom::model(|| {
        let w = owned_by_zero(&[10, 20]);
        let owner = spawn(&w, |w| {
            assert_eq!(w.pop(), Some(10));
            w.lane.release(0);
        });
        let other = spawn(&w, |w| {
            w.lane.try_acquire(1).then(|| w.drain_and_release(1))
        });
        owner.join().unwrap();
        let acquired = other.join().unwrap();
        assert!(
            matches!(acquired, None | Some(1)),
            "worker 1 popped {acquired:?}"
        );
        count(&OUTCOMES, usize::from(acquired.is_some()));
        assert_eq!(w.settle(), usize::from(acquired.is_none()));
    });
    assert_all_reached(
        &OUTCOMES,
        &["refused while owned", "acquired after release"],
    );
}

#[test]
fn steal_publishes_the_pops_and_release_hands_the_lane_back() {
    // Worker 0 pops the task of key 10 and begins it; worker 1 watches once and tries to steal.
    // A successful steal must see the pop (begin's Release, the steal's Acquire): the thief pops
    // next. The robbed worker 0 then tries once to take the lane back, which works only after
    // the thief's release, and must see the thief's pops.
    static OUTCOMES: [StdAtomicUsize; 4] = counters!(4);
    loom::model(|| {
        let w = owned_by_zero(&[10, 20]);
        let owner = spawn(&w, |w| {
            let key = w.pop().unwrap();
            let run = w.lane.begin(0, key);
            match w.end(0, run, key) {
                Ok(()) => Ok(w.drain_and_release(0)),
                Err(robbed) => Err((
                    robbed,
                    w.lane.try_acquire(0).then(|| w.drain_and_release(0)),
                )),
            }
        });
        let thief = spawn(&w, |w| w.steal(1));
        let owned = owner.join().unwrap();
        let stole = thief.join().unwrap();
        match (owned, stole) {
            (Ok(1), Thief::Idle) => count(&OUTCOMES, 0),
            (Ok(1), Thief::Lost { .. }) => count(&OUTCOMES, 1),
            (Err((robbed, back)), won) => {
                assert_handoff(robbed, 1, won);
                // The thief popped task 20 before its release, so nothing is left for worker 0.
                assert!(matches!(back, None | Some(0)));
                count(&OUTCOMES, if back.is_some() { 3 } else { 2 });
            }
            other => panic!("impossible outcome {other:?}"),
        }
        assert_eq!(w.settle(), 0);
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "no steal tried",
            "steal lost",
            "stolen",
            "stolen, then taken back",
        ],
    );
}

#[test]
fn stolen_owner_collects_the_winning_offer() {
    // Worker 0 is inside the task of key 10 (begun on the main thread) and ends it on its own
    // thread; worker 1 watches once and steals. The end and the steal CAS the same word: if the
    // steal wins, `end` must find the offer (it panics otherwise) and it must be the thief's; if
    // the end wins, the thief's offer is withdrawn and freed by the thief.
    static OUTCOMES: [StdAtomicUsize; 3] = counters!(3);
    loom::model(|| {
        let (w, run, key) = stuck_in_first_task(&[10]);
        let owner = spawn(&w, move |w| w.finish(0, run, key));
        let thief = spawn(&w, |w| w.steal(1));
        let owned = owner.join().unwrap();
        let stole = thief.join().unwrap();
        match (owned, stole) {
            (Ok(()), Thief::Idle) => count(&OUTCOMES, 0),
            (Ok(()), Thief::Lost { .. }) => count(&OUTCOMES, 1),
            (Err(robbed), won) => {
                assert_handoff(robbed, 1, won);
                count(&OUTCOMES, 2);
            }
            other => panic!("impossible outcome {other:?}"),
        }
        assert_eq!(w.settle(), 0);
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "ended first, not watched",
            "ended first, offer withdrawn",
            "stolen",
        ],
    );
}

#[test]
fn stale_thief_offers_to_an_owner_inside_a_later_task() {
    // Not a safety property: a reproducer for a sentence of lane.rs's module docs that does not
    // hold ("its mailbox is empty whenever it is inside a task as an owner"). Worker 1 watches
    // worker 0 inside the task of key 10 and offers after worker 0 ended it and began the task of
    // key 20: the stale offer sits in worker 0's mailbox while worker 0 is inside that task,
    // until the thief's CAS fails and it withdraws it. Harmless to safety (worker 0's `end`
    // succeeds, so it never collects it; a thief that watched the task of key 20 meanwhile finds
    // the mailbox taken and gives up, to retry later), but the mailbox is not empty then.
    static STALE_OFFER_SEEN: StdAtomicUsize = StdAtomicUsize::new(0);
    loom::model(|| {
        let w = owned_by_zero(&[10, 20]);
        let owner = spawn(&w, |w| {
            // `own`, with a look at the mailbox inside the task of key 20.
            let mut offered_inside_20 = false;
            while let Some(key) = w.pop() {
                let run = w.lane.begin(0, key);
                offered_inside_20 |= key == 20 && !w.boxes[0].is_empty();
                if let Err(robbed) = w.end(0, run, key) {
                    return (Err(robbed), offered_inside_20);
                }
            }
            w.lane.release(0);
            (Ok(()), offered_inside_20)
        });
        let thief = spawn(&w, |w| w.steal(1));
        let (owned, offered_inside_20) = owner.join().unwrap();
        let stole = thief.join().unwrap();
        if let Err(robbed) = owned {
            assert_handoff(robbed, 1, stole);
        }
        if offered_inside_20 && stole == (Thief::Lost { key: 10 }) {
            STALE_OFFER_SEEN.fetch_add(1, StdOrdering::Relaxed);
        }
        assert_eq!(w.settle(), 0);
    });
    assert!(
        STALE_OFFER_SEEN.load(StdOrdering::Relaxed) > 0,
        "the model never found a stale offer in the mailbox of an owner inside a later task"
    );
}
