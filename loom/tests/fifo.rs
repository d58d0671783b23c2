//! Loom models of a lane's FIFO (core/src/fifo.rs), over the real `Fifo`. Under `cfg(loom)` a
//! block has 2 slots (`fifo::BLOCK`), so a few pushes fill blocks and install new ones: every
//! model below crosses block installs, and the popper gives emptied blocks back as the spare that
//! a later installer takes (and cleans: every tag 0, so a reused block's old slots read as
//! unwritten).
//!
//! - [`two_pushers_race_then_one_pops`]: pushers A and B push three and two items, racing across
//!   block installs (a push reading the tail at the gap, waiting for the installer); B then pops
//!   until it has all five while A may still be pushing, installing, and taking back the block B
//!   just gave up, to write its last item into the slot B popped an item from (whose tag A's
//!   install cleared). Every item has its own tag (`try_push_tagged`), and each pop checks that
//!   it comes back with its item's: no tag left from a block's earlier use is read as a write.
//!   Nothing lost, nothing doubled, each pusher's items in its own order; at the end the FIFO is
//!   empty (`is_empty`, `len() == 0`, `pop() == None`).
//! - [`a_third_thread_pops_while_two_pushers_race`]: the same two pushers, and a third thread that
//!   tries one pop while they race (reading the tail maybe at a gap, maybe waiting for the first
//!   slot's tag); the main thread pops the rest after the joins.
//! - [`a_peek_sees_what_the_next_pop_takes`]: a popper that peeks before each pop (as a lane's
//!   owner looks ahead) while a pusher pushes across a block install: a peek that sees an item
//!   sees the one the next pop returns.
//! - [`popper_turn_handed_over_after_one_pop`] and [`popper_turn_handed_over_after_two_pops`]:
//!   the right to pop passes from thread A to thread B through a flag (Release store, Acquire
//!   load), as a lane's ownership does, while a pusher pushes. Items 0, 1 and 2 are queued first
//!   (the first block full, the second installed), the pusher pushes 3 (the second block's last
//!   slot: it installs the third block, from the spare if a popper has given one up already). A
//!   pops the first one or two (two: A follows `next`, gives up the first block, and leaves B
//!   starting in the second), B the rest. Each popper gets exactly its share, in order. `pop`
//!   reads the head's position and block and the tail it saw last `Relaxed`, so this checks that
//!   the turn alone carries them.
//! - [`the_excess_list_passes_with_the_popper_turn`]: popper A gives up a block while the spares
//!   are full, so it goes to A's excess list (the popper's alone, `Relaxed`), and passes the turn
//!   to B while a pusher pushes; the first of B's pops that finds the FIFO empty frees the list.
//!   B sees A's list (no block leaks) and frees it once.
//! - [`a_spare_refilled_from_the_excess_list_is_cleaned_before_reuse`]: a block goes from the
//!   popper's excess list to the spares (`refill_spares`) and a pusher's install takes it, with
//!   the tags of its earlier use, while a popper pops every item and checks its tag: the
//!   installer's cleaning covers blocks that come back by way of the excess list too.
//! - [`push_vs_emptiness_check`] and [`push_vs_popper_going_idle`]: the pairing a lane's wake
//!   protocol relies on (Dekker). A pusher does `push; fence(SeqCst); read F`; the other thread
//!   does `F = true; fence(SeqCst); is_empty()`. Never both "F was false" and "empty" while the
//!   item is still queued. The first model runs it from three starting states (an empty block;
//!   one slot used, so the push installs the next block; one block used up and given up as the
//!   spare, so the push lands in the second block) and with `F` stored `SeqCst` or `Relaxed`. In
//!   the second the checker is the popper itself, which first pops until `pop` returns `None`
//!   (what the lane's owner does before it releases the lane), so the push races a pop of a
//!   block's last slot.
//! - [`close_races_two_pushers_across_a_block_install`] and
//!   [`a_popper_that_saw_the_close_misses_no_accepted_push`]: `Fifo::close` against pushers
//!   (one of them installing the next block while the position is at the gap) and against a
//!   popper that leaves once it saw the close and an empty FIFO (the executor's shutdown rule).
//! - [`items_left_at_drop_are_dropped_once`]: pushers A and B push two items each, B then pops
//!   one, and the FIFO is dropped by whichever thread lets go of it last (A, B or the main one).
//!   Every item is dropped exactly once (per-item std counters): by the popper, or by `Fifo`'s
//!   `Drop`. Each item carries a loom `UnsafeCell` written when it is made (on its pusher's thread)
//!   and read when it is dropped, so loom also checks that the dropping thread sees its writes.
//!
//! A slot's item is in a loom `UnsafeCell` (core/src/sync.rs), so in every model loom itself
//! reports a slot read without happens-before from its write (a missing Release/Acquire on the
//! tag, or a pusher writing into a block it read stale), and a slot written by two pushers. The
//! installer clears a reused block's tags with plain writes (`with_mut` under loom), so loom also
//! reports a clearing that races with the block's previous popper or its next pushers.
//!
//! **Blocks are counted.** Loom tracks its own `Arc`s for leaks, not `Box`es, and the FIFO's blocks
//! are `Box`es. So this test binary has a global allocator that counts allocations aligned to 64
//! bytes, which are exactly the FIFO's blocks (`#[repr(align(64))]`; `Fifo`'s own fields are
//! `CachePadded`, aligned to 128 on x86-64; each model checks that `Fifo::new` makes exactly one).
//! Loom runs every model thread as a coroutine on the test's OS thread, so the count is
//! thread-local and tests running in parallel do not mix. Every model checks at the end of every
//! execution that the blocks still live are the ones that were live when it started: no block
//! leaked (a spare, or a block an installer took and then lost the race for the last slot
//! with), and none freed twice (the allocator would abort first). The count of allocations also
//! shows when an installer reused the popper's spare instead of allocating, and the coverage
//! counters check that this happened.
//!
//! **At most one thread spins at a time, by construction.** Loom 0.7 lets a model switch freely
//! (without spending a preemption) away from a thread that yields, so when two threads spin with
//! `yield_now` waiting on a third that made no progress, some explored executions alternate
//! between the two forever and never schedule the third (tokio-rs/loom#53, open): the model
//! fails with "exceeded maximum number of branches". The FIFO spins in two places (a pusher that
//! reads the tail at a block's gap waits for the installer; the popper waits for a reserved slot's
//! tag), and both can wait on the same installer: a popper that reached a block's last slot
//! while its installer is mid-install, and another pusher at the gap. A model with two pushers and
//! a separate popper of more than the first item hits this at `LOOM_MAX_PREEMPTIONS=2` already
//! (checked while writing these models, with the spins instrumented: the installer was simply
//! never scheduled again; at a bound of 1 it ends, after some 660,000 executions). So the models are shaped so that no two threads can spin at once: the
//! popper of [`two_pushers_race_then_one_pops`] (and of the drop model) is a pusher that has
//! finished its own pushes (the other one, pushing alone, never meets a gap); the third thread of
//! [`a_third_thread_pops_while_two_pushers_race`] pops at most the first slot, which is written
//! whenever a pusher waits at a gap, and does not wait for the FIFO to fill; in the handoff models
//! A pops only items queued before the threads start (it never waits) while B waits for the turn,
//! and the pusher pushes alone.
//!
//! **Thread order.** Loom 0.7's DPOR keeps only the last access of each atomic (tokio-rs/loom#392):
//! a thread that only loads a word must be spawned after the threads that load it and then write
//! it, or the later load hides the earlier one and loom never tries the write before it. Poppers
//! and emptiness checkers only load the tail's position, which pushers load and then CAS, so they
//! are spawned last. Coverage counters (std statics, outside the model) check that each model
//! reached the interleavings it exists for.
//!
//! **What loom cannot check here.** Loom 0.7 treats `SeqCst` loads and stores as Acquire and
//! Release (only `SeqCst` fences are totally ordered), so the emptiness models rest on the
//! callers' fences, as the lane's code does, not on the `SeqCst` of the reserving CAS and of
//! `is_empty`'s loads.
#![cfg(loom)]

mod common;

use common::coverage::{assert_all_reached, count};

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::sync::Arc as StdArc;

use keyserial_core::fifo::{Fifo, Tag, BLOCK};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// The default preemption bound (`LOOM_MAX_PREEMPTIONS` overrides it).
const PREEMPTIONS: usize = 3;

/// A model builder with the default preemption bound.
fn builder() -> loom::model::Builder {
    let mut model = loom::model::Builder::new();
    if model.preemption_bound.is_none() {
        model.preemption_bound = Some(PREEMPTIONS);
    }
    model
}

// ---------------------------------------------------------------------------------------------
// Block accounting.

/// The alignment of a FIFO block under loom (`#[cfg_attr(loom, repr(align(64)))] struct Block`).
const BLOCK_ALIGN: usize = 64;

thread_local! {
    /// Live allocations aligned to [`BLOCK_ALIGN`] made on this OS thread (loom's model threads
    /// are coroutines on it).
    static LIVE_BLOCKS: Cell<isize> = const { Cell::new(0) };
    /// Allocations aligned to [`BLOCK_ALIGN`] ever made on this OS thread.
    static BLOCKS_MADE: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, counting the FIFO's blocks (see the module docs).
struct CountBlocks;

impl CountBlocks {
    fn note(layout: Layout, made: bool) {
        if layout.align() == BLOCK_ALIGN {
            let _ = LIVE_BLOCKS.try_with(|n| n.set(n.get() + if made { 1 } else { -1 }));
            if made {
                let _ = BLOCKS_MADE.try_with(|n| n.set(n.get() + 1));
            }
        }
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the counting touches no allocation.
unsafe impl GlobalAlloc for CountBlocks {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded, same contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            Self::note(layout, true);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded, same contract.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            Self::note(layout, true);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::note(layout, false);
        // SAFETY: forwarded, same contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded, same contract (a block is never reallocated, and the count only
        // depends on the alignment, which `realloc` keeps).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountBlocks = CountBlocks;

/// The blocks live and made when an execution starts.
struct Blocks {
    live: isize,
    made: usize,
}

impl Blocks {
    fn start() -> Blocks {
        Blocks {
            live: LIVE_BLOCKS.with(Cell::get),
            made: BLOCKS_MADE.with(Cell::get),
        }
    }

    /// Blocks live now that were not live at the start.
    fn live(&self) -> isize {
        LIVE_BLOCKS.with(Cell::get) - self.live
    }

    /// Blocks allocated since the start.
    fn made(&self) -> usize {
        BLOCKS_MADE.with(Cell::get) - self.made
    }

    /// A new FIFO, checking that it allocated exactly one counted block, so that the count sees
    /// the FIFO's blocks and nothing else. Call it first.
    fn fifo<T>(&self) -> Arc<Fifo<T>> {
        let q = Arc::new(Fifo::new());
        assert_eq!(
            (LIVE_BLOCKS.with(Cell::get) - self.live, self.made()),
            (1, 1),
            "the allocator does not count exactly the FIFO's blocks"
        );
        q
    }

    /// No block leaked or was freed twice since the start.
    fn assert_freed(&self) {
        assert_eq!(
            LIVE_BLOCKS.with(Cell::get),
            self.live,
            "blocks leaked (positive) or freed twice (negative)"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Pops (as the only popper) until it has `n` items, yielding while the FIFO is empty. Returns
/// the items and whether it found the FIFO empty at least once.
///
/// # Safety
/// The calling thread is the only popper, and holds the popper's turn.
unsafe fn pop_n<T>(q: &Fifo<T>, n: usize) -> (Vec<T>, bool) {
    let mut got = Vec::with_capacity(n);
    let mut waited = false;
    while got.len() < n {
        // SAFETY: the caller is the only popper.
        match unsafe { q.pop() } {
            Some(v) => got.push(v),
            None => {
                waited = true;
                thread::yield_now();
            }
        }
    }
    (got, waited)
}

/// The tag of item `(t, i)`: its own, never 0.
fn tag_of((t, i): (usize, usize)) -> Tag {
    Tag::new((i << 1 | t) + 1).unwrap()
}

/// Pushes `item` with its own tag ([`tag_of`]).
fn push_tagged(q: &Fifo<(usize, usize)>, item: (usize, usize)) {
    assert!(q.try_push_tagged(|| (tag_of(item), item)).is_ok());
}

/// [`pop_n`] for items pushed by [`push_tagged`], checking that each comes with its own tag.
///
/// # Safety
/// As [`pop_n`].
unsafe fn pop_n_tagged(q: &Fifo<(usize, usize)>, n: usize) -> (Vec<(usize, usize)>, bool) {
    let mut got = Vec::with_capacity(n);
    let mut waited = false;
    while got.len() < n {
        // SAFETY: the caller is the only popper.
        match unsafe { q.pop_tagged() } {
            Some((tag, v)) => {
                assert_eq!(tag, tag_of(v), "an item popped with another's tag");
                got.push(v);
            }
            None => {
                waited = true;
                thread::yield_now();
            }
        }
    }
    (got, waited)
}

/// The FIFO is empty, by every measure.
///
/// # Safety
/// The calling thread may pop (no other thread pops any more).
unsafe fn assert_empty<T: std::fmt::Debug>(q: &Fifo<T>) {
    assert!(q.is_empty(), "is_empty() is false at the end");
    assert_eq!(q.len(), 0, "len() is not 0 at the end");
    // SAFETY: the caller may pop.
    assert!(unsafe { q.pop() }.is_none(), "an item left at the end");
}

/// Each pusher's items (`(pusher, index)`) are all there, once each, in the pusher's order:
/// `per[t]` items of pusher `t`.
fn assert_per_pusher_order(got: &[(usize, usize)], per: [usize; 2]) {
    let mut next = [0usize; 2];
    for &(t, i) in got {
        assert_eq!(
            i, next[t],
            "pusher {t}'s items lost, doubled or reordered: {got:?}"
        );
        next[t] += 1;
    }
    assert_eq!(next, per, "items lost: {got:?}");
}

/// The orders in which `per[0]` items of pusher 0 and `per[1]` of pusher 1 can come out, as bit
/// patterns (bit `k` set: the `k`-th item out is pusher 1's), in increasing order.
fn orders(per: [usize; 2]) -> Vec<u32> {
    (0u32..1 << (per[0] + per[1]))
        .filter(|m| m.count_ones() as usize == per[1])
        .collect()
}

/// `got`'s order, as an index into [`orders`].
fn order_of(got: &[(usize, usize)], per: [usize; 2]) -> usize {
    let bits = got
        .iter()
        .enumerate()
        .map(|(k, &(t, _))| u32::from(t == 1) << k)
        .sum::<u32>();
    orders(per).iter().position(|&o| o == bits).unwrap()
}

/// Names for the outcomes of [`orders`]: which pusher, item by item.
fn order_names(per: [usize; 2]) -> Vec<String> {
    orders(per)
        .iter()
        .map(|o| {
            let who: Vec<String> = (0..per[0] + per[1])
                .map(|k| (o >> k & 1).to_string())
                .collect();
            format!("order {}", who.join(" "))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 1. Two pushers, racing across installs, and a popper.

#[test]
fn two_pushers_race_then_one_pops() {
    // Items are (pusher, index); A pushes three, B two. Positions 1 and 4 are blocks' last slots:
    // their pushers install the next block while the other pusher may read the tail at the gap
    // and wait. B pops once its own pushes are done, while A may still push: B waits for A's
    // slots, follows `next` (maybe while A is still writing the installer's slot), and gives up
    // the first block, which A's install of the third block may take back (and clean), so that
    // A's last item (position 6) goes into the slot that held position 0. Each item has its own
    // tag, checked at its pop. Outcomes: the ten pop orders; B found the FIFO empty (waiting for
    // A); the last item went into a reused block.
    const PER: [usize; 2] = [3, 2];
    static OUTCOMES: [StdAtomicUsize; 12] = counters!(12);
    builder().check(|| {
        let blocks = Blocks::start();
        let q = blocks.fifo();
        let a = {
            let q = q.clone();
            thread::spawn(move || (0..PER[0]).for_each(|i| push_tagged(&q, (0, i))))
        };
        let b = {
            let q = q.clone();
            thread::spawn(move || {
                (0..PER[1]).for_each(|i| push_tagged(&q, (1, i)));
                // SAFETY: this thread is the only popper.
                unsafe { pop_n_tagged(&q, PER[0] + PER[1]) }
            })
        };
        a.join().unwrap();
        let (got, waited) = b.join().unwrap();
        assert_per_pusher_order(&got, PER);
        // SAFETY: every other thread is joined; this one is the only popper now.
        unsafe { assert_empty(&q) };
        // Three blocks in use (positions 0-1, 3-4, 6): fewer made means one was reused.
        let reused = blocks.made() < 3;
        drop(q);
        blocks.assert_freed();

        count(&OUTCOMES, order_of(&got, PER));
        if waited {
            count(&OUTCOMES, 10);
        }
        if reused {
            count(&OUTCOMES, 11);
        }
    });
    let mut names = order_names(PER);
    names.extend([
        "the popper found it empty, waiting for the other pusher".to_string(),
        "the last item went into the block the popper gave up".to_string(),
    ]);
    assert_all_reached(
        &OUTCOMES,
        &names.iter().map(String::as_str).collect::<Vec<_>>(),
    );
}

#[test]
fn a_third_thread_pops_while_two_pushers_race() {
    // Pushers A and B push two items each; thread C tries one pop while they race (the first
    // item, if any position is reserved yet: it may wait for that slot's tag); the main thread
    // pops the rest after the joins. Outcomes: the six pop orders; C found the FIFO empty.
    static OUTCOMES: [StdAtomicUsize; 7] = counters!(7);
    builder().check(|| {
        let blocks = Blocks::start();
        let q = blocks.fifo();
        let pushers = [0usize, 1].map(|t| {
            let q = q.clone();
            thread::spawn(move || {
                q.push((t, 0usize));
                q.push((t, 1));
            })
        });
        let popper = {
            let q = q.clone();
            // SAFETY: this thread is the only popper until it is joined.
            thread::spawn(move || unsafe { q.pop() })
        };
        pushers.into_iter().for_each(|p| p.join().unwrap());
        let first = popper.join().unwrap();
        let waited = first.is_none();
        let mut got: Vec<_> = first.into_iter().collect();
        // SAFETY: every other thread is joined; this one is the only popper now.
        got.extend(unsafe { pop_n(&q, 4 - got.len()) }.0);
        assert_per_pusher_order(&got, [2, 2]);
        // SAFETY: as above.
        unsafe { assert_empty(&q) };
        drop(q);
        blocks.assert_freed();
        count(&OUTCOMES, order_of(&got, [2, 2]));
        if waited {
            count(&OUTCOMES, 6);
        }
    });
    let mut names = order_names([2, 2]);
    names.push("the third thread found it empty".to_string());
    assert_all_reached(
        &OUTCOMES,
        &names.iter().map(String::as_str).collect::<Vec<_>>(),
    );
}

#[test]
fn a_peek_sees_what_the_next_pop_takes() {
    // A pusher pushes five items (three blocks of two: the third block's install takes the first
    // block back from the spares if the popper has given it up by then, and cleans it, so a later
    // peek reads slots whose tags were cleared after their first use) while the popper peeks before
    // every pop, as a lane's owner looks ahead. A peek that sees an item sees the one the next pop
    // returns; a peek that sees none is followed by a pop that may find the item written since,
    // never a different one. Outcomes: a peek saw an item; a peek saw none; the third block was the
    // spare; the third block was new.
    const N: usize = 5;
    static OUTCOMES: [StdAtomicUsize; 4] = counters!(4);
    builder().check(|| {
        let blocks = Blocks::start();
        let q = blocks.fifo();
        let pusher = {
            let q = q.clone();
            thread::spawn(move || (0..N).for_each(|i| q.push(i)))
        };
        let mut next = 0;
        while next < N {
            // SAFETY: this thread is the only popper.
            let peeked = unsafe { q.peek_with(|v| *v) };
            count(&OUTCOMES, usize::from(peeked.is_none()));
            // SAFETY: as above.
            match (peeked, unsafe { q.pop() }) {
                (Some(p), popped) => assert_eq!((p, popped), (next, Some(next))),
                (None, Some(v)) => assert_eq!(v, next),
                (None, None) => {
                    thread::yield_now();
                    continue;
                }
            }
            next += 1;
        }
        pusher.join().unwrap();
        // SAFETY: as above.
        unsafe { assert_empty(&q) };
        count(&OUTCOMES, if blocks.made() == 2 { 2 } else { 3 });
        drop(q);
        blocks.assert_freed();
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "a peek saw an item",
            "a peek saw none",
            "the third block was the spare",
            "the third block was new",
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// 2. The popper's turn handed between threads.

/// Items 0, 1 and 2 are queued on the main thread (positions 0, 1 and 3: the second block is
/// installed); then a pusher pushes 3 (position 4, the second block's last slot: it installs the
/// third block, taking the spare if a popper gave up the first block already), popper A pops the
/// first `first` items (queued already: it never waits) and passes the turn to popper B (Release
/// store, Acquire load), which pops the rest. Outcomes: B found the FIFO empty (waiting for the
/// pusher) or not; the pusher's install reused the block a popper gave up, or not.
fn popper_turn_handed_over(first: usize, outcomes: &'static [StdAtomicUsize]) {
    const QUEUED: usize = 3;
    const ITEMS: usize = 4;
    builder().check(move || {
        let blocks = Blocks::start();
        let q = blocks.fifo();
        (0..QUEUED).for_each(|i| q.push(i));
        let turn = Arc::new(AtomicBool::new(false));
        let pusher = {
            let q = q.clone();
            thread::spawn(move || (QUEUED..ITEMS).for_each(|i| q.push(i)))
        };
        let a = {
            let (q, turn) = (q.clone(), turn.clone());
            thread::spawn(move || {
                // SAFETY: A holds the turn until it stores it below.
                let got: Vec<_> = (0..first).map(|_| unsafe { q.pop() }).collect();
                turn.store(true, Ordering::Release);
                got
            })
        };
        let b = {
            let (q, turn) = (q.clone(), turn.clone());
            thread::spawn(move || {
                while !turn.load(Ordering::Acquire) {
                    thread::yield_now();
                }
                // SAFETY: B holds the turn now: A's last pop happened before its Release
                // store, which B's Acquire load read.
                unsafe { pop_n(&q, ITEMS - first) }
            })
        };
        pusher.join().unwrap();
        let got_a = a.join().unwrap();
        let (got_b, b_waited) = b.join().unwrap();
        assert_eq!(
            got_a,
            (0..first).map(Some).collect::<Vec<_>>(),
            "A's pops: lost, doubled or reordered (B got {got_b:?})"
        );
        assert_eq!(
            got_b,
            (first..ITEMS).collect::<Vec<_>>(),
            "B's pops: lost, doubled or reordered (A got {got_a:?})"
        );
        // SAFETY: every other thread is joined.
        unsafe { assert_empty(&q) };
        let reused = blocks.made() < 3;
        drop(q);
        blocks.assert_freed();
        count(outcomes, usize::from(b_waited) * 2 + usize::from(reused));
    });
}

const HANDOFF_OUTCOMES: [&str; 4] = [
    "B never waited; the install allocated",
    "B never waited; the install reused the spare",
    "B waited for the pusher; the install allocated",
    "B waited for the pusher; the install reused the spare",
];

#[test]
fn popper_turn_handed_over_after_one_pop() {
    // A pops item 0; B pops item 1 (a block's last slot: it follows `next` and gives up the
    // first block, which the pusher's install of the third block may take), then 2 and 3.
    static OUTCOMES: [StdAtomicUsize; 4] = counters!(4);
    popper_turn_handed_over(1, &OUTCOMES);
    assert_all_reached(&OUTCOMES, &HANDOFF_OUTCOMES);
}

#[test]
fn popper_turn_handed_over_after_two_pops() {
    // A pops items 0 and 1 (and gives up the first block); B starts in the second block, which
    // it knows of only through A's Relaxed store of the head's block, carried by the turn.
    static OUTCOMES: [StdAtomicUsize; 4] = counters!(4);
    popper_turn_handed_over(2, &OUTCOMES);
    assert_all_reached(&OUTCOMES, &HANDOFF_OUTCOMES);
}

/// The excess list travels with the popper's turn. Items 0 to 5 are queued on the main thread
/// (three full blocks; the fourth installed), which pops 0 to 3, giving up two blocks: the spares
/// are full (`SPARES` is 2 under loom). Then popper A pops 4 and 5 (queued: it never waits) and
/// gives up the third block to its excess list, a `Relaxed` pointer only the popper touches,
/// and passes the turn to popper B (Release store, Acquire load), while a pusher pushes 6 (the
/// fourth block's first slot). B pops 6 (waiting for the pusher, or not) and then pops once
/// more; whichever of B's pops first finds the FIFO empty (one while it waits, or that last one)
/// frees the excess list: B must see A's list (else the block leaks) and free it once (else the
/// allocator aborts). Checked before the drop: only the head's block and the
/// two spares are still live.
#[test]
fn the_excess_list_passes_with_the_popper_turn() {
    static OUTCOMES: [StdAtomicUsize; 2] = counters!(2);
    const QUEUED: usize = 6;
    const BY_MAIN: usize = 4;
    builder().check(|| {
        let blocks = Blocks::start();
        let q = blocks.fifo();
        (0..QUEUED).for_each(|i| q.push(i));
        for i in 0..BY_MAIN {
            // SAFETY: the only popper until the threads start.
            assert_eq!(unsafe { q.pop() }, Some(i));
        }
        let turn = Arc::new(AtomicBool::new(false));
        let pusher = {
            let q = q.clone();
            thread::spawn(move || q.push(QUEUED))
        };
        let a = {
            let (q, turn) = (q.clone(), turn.clone());
            thread::spawn(move || {
                // SAFETY: A holds the turn until it stores it below.
                let got: Vec<_> = (BY_MAIN..QUEUED).map(|_| unsafe { q.pop() }).collect();
                turn.store(true, Ordering::Release);
                got
            })
        };
        let b = {
            let (q, turn) = (q.clone(), turn.clone());
            thread::spawn(move || {
                while !turn.load(Ordering::Acquire) {
                    thread::yield_now();
                }
                // SAFETY: B holds the turn now (A's Release store, B's Acquire load).
                let (got, waited) = unsafe { pop_n(&q, 1) };
                // SAFETY: as above. Empty: this pop frees the excess list.
                let last = unsafe { q.pop() };
                (got, waited, last)
            })
        };
        pusher.join().unwrap();
        let got_a = a.join().unwrap();
        let (got_b, waited, last) = b.join().unwrap();
        assert_eq!(
            got_a,
            (BY_MAIN..QUEUED).map(Some).collect::<Vec<_>>(),
            "A's pops"
        );
        assert_eq!((got_b, last), (vec![QUEUED], None), "B's pops");
        assert_eq!(
            blocks.live(),
            3,
            "the head's block and two spares, no excess"
        );
        drop(q);
        blocks.assert_freed();
        count(&OUTCOMES, usize::from(waited));
    });
    assert_all_reached(&OUTCOMES, &["B never waited", "B waited for the pusher"]);
}

#[test]
fn a_spare_refilled_from_the_excess_list_is_cleaned_before_reuse() {
    // One thread sets up, alone: 8 items (blocks B0-B3 full, B4 installed), 6 popped (B0 and
    // B1 to the spares, B2 to the excess list), 4 more pushed (their installs take B1 and B0),
    // 2 more popped (B3 to the spares, then the refill moves B2 from the excess list on top
    // of it). Then a pusher pushes 12-14, whose install at item 13 takes B2, with the tags of
    // items 4 and 5 still in it, while a popper pops 8-14, each with its own tag. Without the
    // installer's cleaning, the popper would read item 4 again from B2's first slot before
    // item 14 is written. Outcomes: the popper waited for the pusher, or did not.
    static OUTCOMES: [StdAtomicUsize; 2] = counters!(2);
    builder().check(|| {
        let blocks = Blocks::start();
        let q = blocks.fifo();
        (0..8).for_each(|i| push_tagged(&q, (0, i)));
        // SAFETY: the only popper until the threads start.
        let (first, _) = unsafe { pop_n_tagged(&q, 6) };
        assert_eq!(first, (0..6).map(|i| (0, i)).collect::<Vec<_>>());
        (8..12).for_each(|i| push_tagged(&q, (0, i)));
        // SAFETY: as above.
        let (second, _) = unsafe { pop_n_tagged(&q, 2) };
        assert_eq!(second, vec![(0, 6), (0, 7)]);
        assert_eq!(blocks.made(), 5, "B0-B4, then only spares reused");
        let pusher = {
            let q = q.clone();
            thread::spawn(move || (12..15).for_each(|i| push_tagged(&q, (0, i))))
        };
        let popper = {
            let q = q.clone();
            // SAFETY: the only popper from here on.
            thread::spawn(move || unsafe { pop_n_tagged(&q, 7) })
        };
        pusher.join().unwrap();
        let (got, waited) = popper.join().unwrap();
        assert_eq!(got, (8..15).map(|i| (0, i)).collect::<Vec<_>>());
        assert_eq!(blocks.made(), 5, "the install at item 13 reused a spare");
        // SAFETY: every other thread is joined.
        unsafe { assert_empty(&q) };
        drop(q);
        blocks.assert_freed();
        count(&OUTCOMES, usize::from(waited));
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "the popper never waited",
            "the popper waited for the pusher",
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Emptiness against a push.

/// The pusher's half: `push; fence(SeqCst); read F` (the submitter's side of the lane's wake).
/// Returns whether it read `F == true`.
fn push_then_look(q: &Fifo<usize>, flag: &AtomicBool, item: usize) -> bool {
    q.push(item);
    fence(Ordering::SeqCst);
    flag.load(Ordering::Relaxed)
}

/// The checker's half: `F = true; fence(SeqCst); is_empty()`. Returns whether it saw the FIFO
/// empty.
fn flag_then_check(q: &Fifo<usize>, flag: &AtomicBool, order: Ordering) -> bool {
    flag.store(true, order);
    fence(Ordering::SeqCst);
    q.is_empty()
}

/// The outcome of a pairing, (the pusher read `F`, the checker saw it empty), as an index into
/// [`PAIRING_OUTCOMES`]; 3 is the forbidden one.
fn pairing(saw_flag: bool, saw_empty: bool) -> usize {
    match (saw_flag, saw_empty) {
        (false, false) => 0,
        (true, false) => 1,
        (true, true) => 2,
        (false, true) => 3,
    }
}

const PAIRING_OUTCOMES: [&str; 3] = [
    "pusher missed F, checker saw the item",
    "pusher read F, checker saw the item",
    "pusher read F, checker saw it empty",
];

#[test]
fn push_vs_emptiness_check() {
    // Starting states: `used` items pushed and popped on the main thread first (with 2-slot
    // blocks: 1 leaves the push on a block's last slot, so it installs the next block; 2 leaves
    // the first block given up as the spare and the push in the second block).
    static OUTCOMES: [StdAtomicUsize; 4] = counters!(4);
    assert_eq!(BLOCK, 2, "the starting states assume 2-slot blocks");
    for used in 0..=2 {
        for order in [Ordering::SeqCst, Ordering::Relaxed] {
            builder().check(move || {
                let blocks = Blocks::start();
                let q = blocks.fifo();
                for i in 0..used {
                    q.push(100 + i);
                    // SAFETY: no other thread exists yet.
                    assert_eq!(unsafe { q.pop() }, Some(100 + i));
                }
                let flag = Arc::new(AtomicBool::new(false));
                let pusher = {
                    let (q, flag) = (q.clone(), flag.clone());
                    thread::spawn(move || push_then_look(&q, &flag, 1))
                };
                let checker = {
                    let (q, flag) = (q.clone(), flag.clone());
                    thread::spawn(move || flag_then_check(&q, &flag, order))
                };
                let saw_flag = pusher.join().unwrap();
                let saw_empty = checker.join().unwrap();
                assert!(
                    saw_flag || !saw_empty,
                    "missed each other: the pusher read F == false and the checker saw the \
                     FIFO empty (used {used}, F stored {order:?})"
                );
                assert_eq!(q.len(), 1);
                // SAFETY: every other thread is joined.
                assert_eq!(unsafe { q.pop() }, Some(1));
                // SAFETY: as above.
                unsafe { assert_empty(&q) };
                drop(q);
                blocks.assert_freed();
                count(&OUTCOMES, pairing(saw_flag, saw_empty));
            });
        }
    }
    assert_all_reached(&OUTCOMES[..3], &PAIRING_OUTCOMES);
    assert_eq!(OUTCOMES[3].load(StdOrdering::Relaxed), 0);
}

#[test]
fn push_vs_popper_going_idle() {
    // The checker is the popper: item 10 is queued; it pops until `pop` returns `None` (maybe
    // taking the pushed item 1 too, from the block's last slot: following `next` and giving up
    // the first block), then `F = true; fence(SeqCst); is_empty()`. Unless it popped the item,
    // never both "F false" and "empty".
    static OUTCOMES: [StdAtomicUsize; 4] = counters!(4);
    builder().check(|| {
        let blocks = Blocks::start();
        let q = blocks.fifo();
        q.push(10);
        let flag = Arc::new(AtomicBool::new(false));
        let pusher = {
            let (q, flag) = (q.clone(), flag.clone());
            thread::spawn(move || push_then_look(&q, &flag, 1))
        };
        let owner = {
            let (q, flag) = (q.clone(), flag.clone());
            thread::spawn(move || {
                let mut popped = Vec::new();
                // SAFETY: this thread is the only popper.
                while let Some(v) = unsafe { q.pop() } {
                    popped.push(v);
                }
                (popped, flag_then_check(&q, &flag, Ordering::SeqCst))
            })
        };
        let saw_flag = pusher.join().unwrap();
        let (popped, saw_empty) = owner.join().unwrap();
        let took_it = match popped.as_slice() {
            [10] => false,
            [10, 1] => true,
            other => panic!("lost, doubled or reordered: popped {other:?}"),
        };
        assert!(
            took_it || saw_flag || !saw_empty,
            "missed each other: item queued, the pusher read F == false, the popper saw empty"
        );
        assert_eq!(q.len(), usize::from(!took_it));
        if !took_it {
            // SAFETY: every other thread is joined.
            assert_eq!(unsafe { q.pop() }, Some(1));
        }
        // SAFETY: as above.
        unsafe { assert_empty(&q) };
        drop(q);
        blocks.assert_freed();
        count(
            &OUTCOMES,
            if took_it {
                0
            } else {
                1 + pairing(saw_flag, saw_empty)
            },
        );
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "the popper took the item",
            "left queued; pusher missed F, popper saw the item",
            "left queued; pusher read F, popper saw the item",
            "left queued; pusher read F, popper saw it empty",
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Items left at drop.

/// An item that counts its drops, and carries a loom cell written on its pusher's thread and
/// read by whoever drops it.
struct Counted {
    id: usize,
    made: UnsafeCell<usize>,
    drops: StdArc<[StdAtomicUsize; 4]>,
}

impl Counted {
    fn new(id: usize, drops: &StdArc<[StdAtomicUsize; 4]>) -> Counted {
        Counted {
            id,
            made: UnsafeCell::new(id),
            drops: drops.clone(),
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A failing execution is unwinding: do not panic again (that would abort the test
            // binary and hide loom's report).
            return;
        }
        // SAFETY: only this item's owner touches it (loom checks the happens-before).
        let made = self.made.with(|p| unsafe { *p });
        assert_eq!(made, self.id);
        self.drops[self.id].fetch_add(1, StdOrdering::Relaxed);
    }
}

/// The FIFO of [`items_left_at_drop_are_dropped_once`], noting which thread dropped it.
struct Noted {
    fifo: Fifo<Counted>,
    dropped_by: StdArc<std::sync::Mutex<Option<thread::ThreadId>>>,
}

impl Drop for Noted {
    fn drop(&mut self) {
        // (`fifo` is dropped right after this: on this thread.)
        *self.dropped_by.lock().unwrap() = Some(thread::current().id());
    }
}

#[test]
fn items_left_at_drop_are_dropped_once() {
    // Pushers A and B push items (0, 1) and (2, 3); B then pops one item (A's first or its own
    // first: whichever reserved position 0) and drops it. Every thread lets go of the FIFO when
    // done, the main thread right after spawning the others, so `Fifo::drop` runs on whichever
    // lets go last: it pops the three items left, across two blocks, and frees the head's block
    // and the spare. Outcomes: which item B took, and which thread dropped the FIFO.
    static OUTCOMES: [StdAtomicUsize; 5] = counters!(5);
    builder().check(|| {
        let blocks = Blocks::start();
        let drops: StdArc<[StdAtomicUsize; 4]> = StdArc::new(counters!(4));
        let dropped_by = StdArc::new(std::sync::Mutex::new(None));
        let q = Arc::new(Noted {
            fifo: Fifo::new(),
            dropped_by: dropped_by.clone(),
        });
        assert_eq!(
            blocks.made(),
            1,
            "the allocator does not count the FIFO's blocks"
        );
        let a = {
            let (q, drops) = (q.clone(), drops.clone());
            thread::spawn(move || {
                q.fifo.push(Counted::new(0, &drops));
                q.fifo.push(Counted::new(1, &drops));
                drop(q);
                thread::current().id()
            })
        };
        let b = {
            let (q, drops) = (q.clone(), drops.clone());
            thread::spawn(move || {
                q.fifo.push(Counted::new(2, &drops));
                q.fifo.push(Counted::new(3, &drops));
                // SAFETY: this thread is the only popper (`Fifo::drop`, the other, runs after
                // every thread let go of the FIFO).
                let got = unsafe { q.fifo.pop() }.expect("B's own items are queued");
                let id = got.id;
                drop(got);
                drop(q);
                (id, thread::current().id())
            })
        };
        drop(q);
        let a_id = a.join().unwrap();
        let (popped, b_id) = b.join().unwrap();
        let by = dropped_by
            .lock()
            .unwrap()
            .expect("the FIFO was not dropped");
        let dropped: Vec<usize> = drops.iter().map(|d| d.load(StdOrdering::Relaxed)).collect();
        assert_eq!(
            dropped, [1; 4],
            "drops per item (B popped {popped}): an item leaked or dropped twice"
        );
        blocks.assert_freed();
        count(&OUTCOMES, usize::from(popped == 2));
        count(
            &OUTCOMES,
            if by == a_id {
                2
            } else if by == b_id {
                3
            } else {
                4
            },
        );
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "B popped A's first item",
            "B popped its own first item",
            "A dropped the FIFO",
            "B dropped the FIFO",
            "the main thread dropped the FIFO (A and B were done first)",
        ],
    );
}

/// [`close_races_two_pushers_across_a_block_install`]: pushes `(pusher, index)` with
/// `try_push_with`, stopping at the first refusal; returns how many were accepted. A refused
/// `make` must never be called (`built` counts the calls).
fn push_until_refused(
    q: &Fifo<(usize, usize)>,
    pusher: usize,
    n: usize,
    built: &AtomicUsize,
) -> usize {
    for i in 0..n {
        let make = || {
            built.fetch_add(1, Ordering::Relaxed);
            (pusher, i)
        };
        if q.try_push_with(make).is_err() {
            return i;
        }
    }
    n
}

/// `close` against two pushers: A pushes two items (the second takes the first block's last
/// slot, so A installs the next block while the position sits at the gap, where the close may
/// land), B one (maybe waiting at the gap for A's install). After the joins the main thread pops
/// everything. Every accepted push is popped exactly once, in its pusher's order; every refused
/// one had its `make` never called; a pusher refused once is refused after (the close is for
/// good); the close leaves the FIFO closed and its blocks are all freed. Outcomes: how many of the
/// three pushes were accepted (0 to 3), and B refused while A got both.
#[test]
fn close_races_two_pushers_across_a_block_install() {
    static OUTCOMES: [StdAtomicUsize; 5] = counters!(5);
    builder().check(|| {
        let blocks = Blocks::start();
        let q = blocks.fifo();
        let built = Arc::new(AtomicUsize::new(0));
        let a = {
            let (q, built) = (q.clone(), built.clone());
            thread::spawn(move || push_until_refused(&q, 0, 2, &built))
        };
        let b = {
            let (q, built) = (q.clone(), built.clone());
            thread::spawn(move || push_until_refused(&q, 1, 1, &built))
        };
        q.close();
        let accepted = [a.join().unwrap(), b.join().unwrap()];
        assert!(q.is_closed());
        assert!(
            q.try_push_with(|| (2, 0)).is_err(),
            "a push after the close"
        );
        let total = accepted[0] + accepted[1];
        assert_eq!(
            built.load(Ordering::Relaxed),
            total,
            "a refused make was called"
        );
        assert_eq!(q.pushed(), total);
        // SAFETY: every other thread is joined; this one is the only popper.
        let (got, _) = unsafe { pop_n(&q, total) };
        assert_per_pusher_order(&got, accepted);
        // SAFETY: as above.
        unsafe { assert_empty(&q) };
        drop(q);
        blocks.assert_freed();
        count(&OUTCOMES, total);
        if accepted == [2, 0] {
            count(&OUTCOMES, 4);
        }
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "all three refused",
            "one accepted",
            "two accepted",
            "all three accepted",
            "A got both (across the install), B refused",
        ],
    );
}

/// The executor's shutdown rule (`serializer/admit.rs`, "Admission"): the closer closes the FIFO and
/// then raises a flag (Release); a popper that finds the FIFO empty leaves only once it has seen
/// the flag (Acquire) and then found the FIFO empty again. A pusher pushes one item. An
/// accepted push is popped before the popper leaves: a reservation before the close in the tail's
/// modification order is in the tail value the popper reads after the flag (the install across a
/// block's gap is `close_races_two_pushers_across_a_block_install`'s). The popper is spawned last
/// (it only loads the tail). Outcomes: refused, accepted.
#[test]
fn a_popper_that_saw_the_close_misses_no_accepted_push() {
    static OUTCOMES: [StdAtomicUsize; 2] = counters!(2);
    builder().check(|| {
        let blocks = Blocks::start();
        let q = blocks.fifo();
        let closed = Arc::new(AtomicBool::new(false));
        let built = Arc::new(AtomicUsize::new(0));
        let pusher = {
            let (q, built) = (q.clone(), built.clone());
            thread::spawn(move || push_until_refused(&q, 0, 1, &built))
        };
        let closer = {
            let (q, closed) = (q.clone(), closed.clone());
            thread::spawn(move || {
                q.close();
                closed.store(true, Ordering::Release);
            })
        };
        let popper = {
            let (q, closed) = (q.clone(), closed.clone());
            thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    // SAFETY: this thread is the only popper.
                    if let Some(item) = unsafe { q.pop() } {
                        got.push(item);
                    } else if closed.load(Ordering::Acquire) {
                        if q.is_empty() {
                            return got;
                        }
                    } else {
                        thread::yield_now();
                    }
                }
            })
        };
        let accepted = pusher.join().unwrap();
        closer.join().unwrap();
        let got = popper.join().unwrap();
        assert_per_pusher_order(&got, [accepted, 0]);
        assert_eq!(built.load(Ordering::Relaxed), accepted);
        drop(q);
        blocks.assert_freed();
        count(&OUTCOMES, accepted);
    });
    assert_all_reached(
        &OUTCOMES,
        &["none accepted", "one accepted", "both accepted"],
    );
}

#[test]
fn a_walk_racing_pushes_across_a_block_install_visits_a_prefix_and_changes_it_in_place() {
    // One item is queued; the main thread pushes two more (three items: a block of two, and the
    // next block, which the push that takes the first block's last slot installs) while the
    // popper thread walks the queue, multiplying what it visits by 10, then pops everything. In every interleaving the
    // walk visited, in order, a prefix of what was finally popped (everything reserved when it
    // began), the pops show exactly the walk's changes, each item is popped once, and no block
    // leaks. Outcomes: how many items the walk visited (1, 2 or 3).
    static OUTCOMES: [StdAtomicUsize; 3] = counters!(3);
    builder().check(|| {
        let blocks = Blocks::start();
        let q: Arc<Fifo<usize>> = blocks.fifo();
        q.push(1);
        let popper = {
            let q = q.clone();
            thread::spawn(move || {
                let mut walked = Vec::new();
                // SAFETY: this thread is the only popper; the closure neither pops nor passes
                // the turn.
                unsafe {
                    q.for_each_queued_mut(|_, v| {
                        walked.push(*v);
                        *v *= 10;
                    })
                };
                // SAFETY: as above.
                let (popped, _) = unsafe { pop_n(&q, 3) };
                (walked, popped)
            })
        };
        q.push(2); // the first block's last slot: this push installs the next block
        q.push(3);
        let (walked, popped) = popper.join().unwrap();
        assert!(
            !walked.is_empty() && walked[0] == 1,
            "the queued item is always visited"
        );
        for (i, v) in popped.iter().enumerate() {
            match walked.get(i) {
                Some(w) => assert_eq!(*v, w * 10, "a visited item kept its change"),
                None => assert!(*v == 2 || *v == 3, "an unvisited item is unchanged"),
            }
        }
        let mut sorted: Vec<usize> = popped
            .iter()
            .map(|v| if *v >= 10 { v / 10 } else { *v })
            .collect();
        sorted.sort_unstable();
        assert_eq!(sorted, [1, 2, 3], "every item popped exactly once");
        // SAFETY: as above.
        unsafe { assert_empty(&q) };
        drop(q);
        blocks.assert_freed();
        count(&OUTCOMES, walked.len() - 1);
    });
    assert_all_reached(
        &OUTCOMES,
        &[
            "the walk saw only the item queued before",
            "the walk saw the first racing push",
            "the walk saw both racing pushes, across the install",
        ],
    );
}
