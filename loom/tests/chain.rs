//! Loom models of the chain (core/src/chain.rs), over the real code: the handoff word (who
//! activates, releases and retires the chain) and the forward-linked queue under it.
//!
//! The first five models queue plain `u32`s and check the handoff: exactly one activation per
//! idle-to-active transition, no stranded task, nothing pushed onto a retired chain. The later
//! ones queue [`Val`]s and check the queue itself: the *pending window* (a push has CASed itself
//! in as the tail but not yet stored its link, `prev.next` or `first`), the owner's *swing* of the
//! last node out of the tail, `first` after an empty spell, `unpop` (including its `THEN_FIRST`
//! case), `peek`, `pop_coalescing`, and `Drop`. A [`Val`] carries its id twice: plainly, and in
//! a loom `UnsafeCell` written when the pusher allocates the node and read by whoever pops it, so
//! loom checks that every node reaches the owner with happens-before (the link stores' `Release`
//! and the owner's `Acquire` loads). Its `Drop` counts per id, so a model can check at the end
//! (chain dropped) that every node was freed exactly once: popped or bounced or dropped with the
//! chain, never lost, never twice. Nodes are `BoxNode`s, freed as soon as they are popped, so a
//! node handed out before a pusher's link store into it would also be a use-after-free.
#![cfg(loom)]

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::sync::Arc as StdArc;

use keyserial_core::chain::{BoxNode, Chain, Pushed, Retired};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

type C = Chain<BoxNode<u32>>;

/// Drains everything while owning the chain, then releases; returns what it took. A failed
/// release with nothing to pop means a push is between its two steps: the model yields (an
/// executor would requeue the chain) and tries again.
fn drain_and_release(c: &C) -> Vec<u32> {
    let mut out = Vec::new();
    loop {
        // SAFETY: the caller owns the chain.
        unsafe {
            while let Some(v) = c.pop_value() {
                out.push(v);
            }
            if c.try_release() {
                return out;
            }
        }
        thread::yield_now();
    }
}

#[test]
fn two_pushers_on_an_idle_chain_exactly_one_schedules() {
    loom::model(|| {
        let c = Arc::new(C::new());
        let pushers: Vec<_> = (0..2)
            .map(|i| {
                let c = c.clone();
                thread::spawn(move || c.push_value(i).unwrap() == Pushed::Activated)
            })
            .collect();
        let activations: usize = pushers
            .into_iter()
            .map(|h| h.join().unwrap() as usize)
            .sum();
        assert_eq!(activations, 1);
        let mut got = drain_and_release(&c);
        got.sort();
        assert_eq!(got, [0, 1]);
        assert!(c.is_idle());
    });
}

#[test]
fn push_racing_the_drainers_release_is_never_stranded() {
    loom::model(|| {
        let c = Arc::new(C::new());
        assert_eq!(c.push_value(0), Ok(Pushed::Activated)); // this thread owns the chain
        let c2 = c.clone();
        let pusher = thread::spawn(move || c2.push_value(1).unwrap());
        let mut got = drain_and_release(&c);
        if pusher.join().unwrap() == Pushed::Activated {
            // The push landed after the release: the pusher owns the chain and must drain it.
            got.extend(drain_and_release(&c));
        }
        assert_eq!(got, [0, 1], "both tasks taken, in push order");
        assert!(c.is_idle());
    });
}

#[test]
fn owner_hands_off_to_a_second_drainer_without_double_drain() {
    // Two pushers race the owner; whoever activates drains on its own thread. A per-chain
    // "draining" flag catches two drainers at once.
    loom::model(|| {
        use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let c = Arc::new(C::new());
        let draining = Arc::new(AtomicBool::new(false));
        let taken = Arc::new(AtomicUsize::new(0));
        let run = |c: Arc<C>, draining: Arc<AtomicBool>, taken: Arc<AtomicUsize>, v: u32| {
            move || {
                if c.push_value(v).unwrap() == Pushed::Activated {
                    assert!(!draining.swap(true, Ordering::AcqRel), "two drainers");
                    let mut n = 0;
                    loop {
                        // SAFETY: the activating push made this thread the owner.
                        unsafe {
                            while c.pop_value().is_some() {
                                n += 1;
                            }
                            draining.store(false, Ordering::Release);
                            if c.try_release() {
                                break;
                            }
                            assert!(!draining.swap(true, Ordering::AcqRel), "two drainers");
                        }
                        thread::yield_now(); // a push between its two steps
                    }
                    taken.fetch_add(n, Ordering::AcqRel);
                }
            }
        };
        let a = thread::spawn(run(c.clone(), draining.clone(), taken.clone(), 1));
        let b = thread::spawn(run(c.clone(), draining.clone(), taken.clone(), 2));
        run(c.clone(), draining.clone(), taken.clone(), 3)();
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(
            taken.load(Ordering::Acquire),
            3,
            "every push taken exactly once"
        );
        assert!(c.is_idle());
    });
}

#[test]
fn push_racing_retire_never_lands_on_a_retired_chain() {
    loom::model(|| {
        let c = Arc::new(C::new());
        let c2 = c.clone();
        let pusher = thread::spawn(move || c2.push_value(7));
        let retired = c.try_retire();
        match (retired, pusher.join().unwrap()) {
            // Retire won: the push bounced with its task (the caller goes back to the table).
            (true, Err(Retired(7))) => assert!(c.is_retired()),
            // Push won: retire failed on a non-idle chain, and the pusher owns it.
            (false, Ok(Pushed::Activated)) => {
                assert_eq!(drain_and_release(&c), [7]);
                assert!(c.try_retire());
            }
            other => panic!("impossible outcome {other:?}"),
        }
    });
}

#[test]
fn retire_racing_an_owner_release_and_a_push() {
    // The owner releases while a pusher pushes and a third thread tries to retire: the task is
    // either drained or bounced, never stranded on a retired chain.
    loom::model(|| {
        let c = Arc::new(C::new());
        assert_eq!(c.push_value(0), Ok(Pushed::Activated));
        let (c1, c2) = (c.clone(), c.clone());
        let pusher = thread::spawn(move || c1.push_value(1));
        let retirer = thread::spawn(move || c2.try_retire());
        let mut got = drain_and_release(&c);
        let pushed = pusher.join().unwrap();
        let retired = retirer.join().unwrap();
        match pushed {
            Ok(Pushed::Activated) => got.extend(drain_and_release(&c)),
            Ok(Pushed::Queued) => {}
            Err(Retired(v)) => {
                assert!(retired);
                got.push(v); // bounced: the caller keeps it
            }
        }
        got.sort();
        assert_eq!(got, [0, 1]);
        if retired {
            assert!(c.is_retired());
        }
    });
}

// ---- The queue: pending window, swing, `first`, unpop, peek, coalescing, drop ----------------

/// Per-id drop counts of one execution's [`Val`]s. Plain std atomics: bookkeeping outside the
/// model, not a point where loom switches threads.
#[derive(Default)]
struct Tally([StdAtomicUsize; 4]);

impl Tally {
    /// Every id below `n` was dropped exactly once (and no other id at all).
    fn assert_each_dropped_once(&self, n: usize) {
        for (id, drops) in self.0.iter().enumerate() {
            let want = usize::from(id < n);
            assert_eq!(drops.load(StdOrdering::Relaxed), want, "value {id} dropped");
        }
    }
}

/// A queued value: see the module docs.
struct Val {
    id: u32,
    /// The coalescing flag, for `pop_coalescing`.
    latest: bool,
    /// `id` again, written on the pusher's thread (the cell's creation counts as a write) and
    /// read by the consumer: loom flags the read unless the node was published to it.
    cell: UnsafeCell<u32>,
    tally: StdArc<Tally>,
}

impl Drop for Val {
    fn drop(&mut self) {
        self.tally.0[self.id as usize].fetch_add(1, StdOrdering::Relaxed);
    }
}

type Q = Chain<BoxNode<Val>>;

fn try_push(c: &Q, tally: &StdArc<Tally>, id: u32, latest: bool) -> Result<Pushed, Retired<Val>> {
    c.push_value(Val {
        id,
        latest,
        cell: UnsafeCell::new(id),
        tally: tally.clone(),
    })
}

/// A push onto a chain that no model thread retires.
fn push(c: &Q, tally: &StdArc<Tally>, id: u32) -> Pushed {
    try_push(c, tally, id, false).unwrap_or_else(|_| panic!("push {id} bounced"))
}

/// A fresh chain with node 0 pushed by this thread, which the push made the owner.
fn owning_zero() -> (StdArc<Tally>, Arc<Q>) {
    let tally = StdArc::new(Tally::default());
    let c = Arc::new(Q::new());
    assert_eq!(push(&c, &tally, 0), Pushed::Activated);
    (tally, c)
}

/// The end of a model whose main thread owned the chain throughout: the release succeeds, the
/// chain is idle, and once it is dropped each of the `n` nodes was freed exactly once.
fn release_then_count_drops(c: Arc<Q>, tally: &Tally, n: usize) {
    // SAFETY: main made the activating push and never released.
    assert!(unsafe { c.try_release() });
    assert!(c.is_idle());
    drop(c);
    tally.assert_each_dropped_once(n);
}

/// Spawns a thread that pushes `ids` in order onto a chain no model thread retires; its join
/// returns what each push reported.
fn spawn_pushes<const M: usize>(
    c: &Arc<Q>,
    tally: &StdArc<Tally>,
    ids: [u32; M],
) -> thread::JoinHandle<[Pushed; M]> {
    let (c, tally) = (c.clone(), tally.clone());
    thread::spawn(move || ids.map(|id| push(&c, &tally, id)))
}

/// Reads a node's value through its cell (loom checks it was published to this thread).
fn read(v: &Val) -> u32 {
    // SAFETY: the cell is only ever read after its creation.
    let seen = v.cell.with(|p| unsafe { *p });
    assert_eq!(seen, v.id, "torn value");
    seen
}

/// Pops one value (freeing its node). The caller owns the chain.
fn pop(c: &Q) -> Option<u32> {
    // SAFETY: the caller owns the chain.
    unsafe { c.pop_value() }.map(|v| read(&v))
}

/// Frees a node the caller popped; returns its id.
fn free(n: NonNull<BoxNode<Val>>) -> u32 {
    // SAFETY: a `push_value` node, popped by the caller and no longer on the chain.
    read(&unsafe { BoxNode::into_value(n) })
}

/// Pops until `n` values came out, waiting (yielding) while the rest are still being pushed.
/// Never releases. The caller owns the chain.
fn pop_n(c: &Q, n: usize) -> Vec<u32> {
    let mut out = Vec::new();
    while out.len() < n {
        match pop(c) {
            Some(v) => out.push(v),
            None => thread::yield_now(),
        }
    }
    out
}

/// [`drain_and_release`] for [`Val`]s. The caller owns the chain.
fn drain_vals_and_release(c: &Q) -> Vec<u32> {
    let mut out = Vec::new();
    loop {
        while let Some(v) = pop(c) {
            out.push(v);
        }
        // SAFETY: the caller owns the chain.
        if unsafe { c.try_release() } {
            return out;
        }
        thread::yield_now(); // a push between its two steps: see `drain_and_release`
    }
}

/// Pops the next node, waiting (yielding) while the push of the node after it is between its
/// two steps. The caller owns the chain and knows a node is queued.
fn pop_node_wait(c: &Q) -> NonNull<BoxNode<Val>> {
    loop {
        // SAFETY: the caller owns the chain.
        match unsafe { c.pop() } {
            Some(n) => return n,
            None => thread::yield_now(),
        }
    }
}

/// [`pop_node_wait`], then frees the node; returns its id.
fn pop_wait(c: &Q) -> u32 {
    free(pop_node_wait(c))
}

/// The owner pops while one pusher pushes twice. The owner's first pop takes node 0 while push 1
/// may be anywhere: not started (0 is the tail: the swing succeeds and 1 goes to `first`),
/// inside its pending window (the swing fails: the pop returns `None`, keeps 0 queued and must
/// not free it before that store; the model yields and pops again), or linked. Push 2 then races the owner's pop of 1 the same way, and
/// the owner's release races both pushes (a push after it activates; the pusher hands the baton
/// to main through `join`). Asserts: values 0, 1, 2 each delivered exactly once and in push
/// order, at most one activation (the release is the only idle spell, and nobody drains the
/// pusher's baton before the join), the chain ends idle, every node freed once.
#[test]
fn pending_window_the_owner_waits_for_each_link() {
    loom::model(|| {
        let tally = StdArc::new(Tally::default());
        let c = Arc::new(Q::new());
        assert_eq!(push(&c, &tally, 0), Pushed::Activated); // main owns the chain
        let pusher = spawn_pushes(&c, &tally, [1, 2]);
        let mut got = vec![pop_wait(&c)];
        got.extend(drain_vals_and_release(&c));
        let pushed = pusher.join().unwrap();
        let activations = pushed.iter().filter(|&&p| p == Pushed::Activated).count();
        assert!(activations <= 1, "{pushed:?}");
        if activations == 1 {
            got.extend(drain_vals_and_release(&c)); // the activating pusher's baton
        }
        assert_eq!(got, [0, 1, 2]);
        assert!(c.is_idle());
        drop(c);
        tally.assert_each_dropped_once(3);
    });
}

/// The swing alone: the owner pops the only node, 0, while a push of 1 races it, then waits for
/// 1 without ever releasing. Either the swing `0|ACTIVE -> ACTIVE` wins (1 then replaces a null
/// tail and goes to `first`) or the push does (1 is linked behind 0, and the pop of 0 returns
/// `None` until that link is visible). Asserts: 0 then 1, each exactly once; the push is `Queued` in
/// every case (the chain never stopped being owned); the release then succeeds and the chain is
/// idle; every node freed once.
#[test]
fn swing_racing_a_push_links_it_or_sends_it_to_first() {
    loom::model(|| {
        let (tally, c) = owning_zero();
        let pusher = spawn_pushes(&c, &tally, [1]);
        assert_eq!(pop_wait(&c), 0);
        assert_eq!(pop_n(&c, 1), [1]);
        assert_eq!(pusher.join().unwrap(), [Pushed::Queued]);
        assert_eq!(pop(&c), None);
        release_then_count_drops(c, &tally, 2);
    });
}

/// `first` refilled after each swing: the owner popped its only node (the swing left the tail
/// null) and keeps popping while one pusher pushes 1 then 2. Push 1 replaces the null tail and
/// stores `first`; the owner takes it (and clears `first`) and, if 2 is not pushed yet, swings 1
/// out, so that 2 goes to `first` again; otherwise 2 is linked behind 1. Asserts: [1, 2] in that
/// order, each exactly once (a stale `first` would hand out a freed node again), both pushes
/// `Queued`, the release then succeeds, every node freed once.
#[test]
fn first_refilled_after_each_swing_keeps_a_pushers_order() {
    loom::model(|| {
        let (tally, c) = owning_zero();
        assert_eq!(pop(&c), Some(0)); // the swing: owned, tail null
        let pusher = spawn_pushes(&c, &tally, [1, 2]);
        assert_eq!(pop_n(&c, 2), [1, 2]);
        assert_eq!(pusher.join().unwrap(), [Pushed::Queued; 2]);
        assert_eq!(pop(&c), None);
        release_then_count_drops(c, &tally, 3);
    });
}

/// Two pushers onto a swung (null) tail while the owner keeps popping: exactly one of them
/// replaces the null tail and stores `first`, the other links behind it (possibly while the
/// owner's pops return `None` in its pending window), or, if the owner has taken and swung out
/// the first one meanwhile, stores `first` afresh. Asserts: 1 and 2 each delivered exactly once (`first` never
/// overwritten unread, nothing lost), both pushes `Queued`, the release then succeeds, every
/// node freed once.
#[test]
fn two_pushers_onto_a_swung_tail_lose_no_first() {
    loom::model(|| {
        let (tally, c) = owning_zero();
        assert_eq!(pop(&c), Some(0)); // the swing: owned, tail null
        let pushers: Vec<_> = [1, 2]
            .into_iter()
            .map(|id| {
                let (c, tally) = (c.clone(), tally.clone());
                thread::spawn(move || push(&c, &tally, id))
            })
            .collect();
        let mut got = pop_n(&c, 2);
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
        for p in pushers {
            assert_eq!(p.join().unwrap(), Pushed::Queued);
        }
        assert_eq!(pop(&c), None);
        release_then_count_drops(c, &tally, 3);
    });
}

/// `unpop` after the pop that swung the tail (the `THEN_FIRST` case), racing pushes: the owner
/// pops its only node 0 (swing: `head` is 0), then un-pops it while a pusher pushes 1 and 2,
/// which go to `first` and behind it. Asserts: 0 comes out first, then 1, 2 (the un-popped node
/// is followed by `first`, which may still be pending), each exactly once; both pushes `Queued`;
/// the release succeeds; every node freed once.
#[test]
fn unpop_of_a_swung_node_comes_before_racing_pushes() {
    loom::model(|| {
        let (tally, c) = owning_zero();
        // SAFETY: main owns the chain (activating push).
        let zero = unsafe { c.pop() }.expect("0 is queued, alone"); // the swing
        let pusher = spawn_pushes(&c, &tally, [1, 2]);
        // SAFETY: main owns the chain; `zero` is the node it just popped.
        unsafe { c.unpop(zero) };
        assert_eq!(pop_n(&c, 3), [0, 1, 2]);
        assert_eq!(pusher.join().unwrap(), [Pushed::Queued; 2]);
        release_then_count_drops(c, &tally, 3);
    });
}

/// `unpop` after a pop that raced a push: the owner pops 0 while 1 is being pushed (so the pop
/// either swung 0 out, and `unpop` marks it `THEN_FIRST`, or found `0.next` (retrying while it
/// was pending), and
/// `unpop` puts 0 back in front of its link), then un-pops it and drains. Asserts: 0 then 1,
/// each exactly once, the push `Queued`, the release succeeds, every node freed once.
#[test]
fn unpop_of_a_racing_pop_comes_before_the_racing_push() {
    loom::model(|| {
        let (tally, c) = owning_zero();
        let pusher = spawn_pushes(&c, &tally, [1]);
        let zero = pop_node_wait(&c); // main owns the chain (activating push)
                                      // SAFETY: main owns the chain; `zero` is the node it just popped.
        unsafe { c.unpop(zero) };
        assert_eq!(pop_n(&c, 2), [0, 1]);
        assert_eq!(pusher.join().unwrap(), [Pushed::Queued]);
        release_then_count_drops(c, &tally, 2);
    });
}

/// Drop after `unpop` with racing pushes: the owner pops 0 while a pusher pushes 1 and 2,
/// un-pops 0 and, once the pusher is done, drops the chain without draining it. The queued
/// nodes are then split between `head` (0, possibly marked `THEN_FIRST`, and what is linked
/// behind it) and `first`. Asserts: `Drop` frees each of 0, 1, 2 exactly once.
#[test]
fn drop_after_unpop_and_racing_pushes_frees_each_node_once() {
    loom::model(|| {
        let (tally, c) = owning_zero();
        let pusher = spawn_pushes(&c, &tally, [1, 2]);
        let zero = pop_node_wait(&c); // main owns the chain (activating push)
                                      // SAFETY: main owns the chain; `zero` is the node it just popped.
        unsafe { c.unpop(zero) };
        assert_eq!(pusher.join().unwrap(), [Pushed::Queued; 2]);
        drop(c);
        tally.assert_each_dropped_once(3);
    });
}

/// `peek` racing pushes: the owner alternates peek and pop while a pusher pushes 1 then 2 behind
/// node 0. A peek on an empty cursor takes `first` (or returns `None` while the `first` store is
/// pending); a peek or pop that finds nothing is retried. Asserts: every peeked node is the node the
/// next pop returns, with the expected value (0, 1, 2 in order, each exactly once), both pushes
/// `Queued`, the release succeeds, every node freed once.
#[test]
fn peek_racing_pushes_shows_the_node_pop_takes() {
    loom::model(|| {
        let (tally, c) = owning_zero();
        let pusher = spawn_pushes(&c, &tally, [1, 2]);
        let mut got = Vec::new();
        while got.len() < 3 {
            // SAFETY: main owns the chain (activating push, never released).
            let Some(peeked) = (unsafe { c.peek() }) else {
                thread::yield_now();
                continue;
            };
            // SAFETY: a peeked node stays queued, hence alive, until popped.
            assert_eq!(read(&unsafe { peeked.as_ref() }.value), got.len() as u32);
            let popped = pop_node_wait(&c); // a peeked node is queued
            assert_eq!(popped, peeked);
            got.push(free(popped));
        }
        assert_eq!(got, [0, 1, 2]);
        assert_eq!(pusher.join().unwrap(), [Pushed::Queued; 2]);
        // SAFETY: main owns the chain.
        unsafe {
            assert!(c.peek().is_none());
            assert!(c.try_release());
        }
        assert!(c.is_idle());
        drop(c);
        tally.assert_each_dropped_once(3);
    });
}

/// `pop_coalescing` racing a push: 0 and 1 are both coalescing; the owner peeks 0, notes whether
/// it is still the newest push (`is_newest`), and pops it coalescing while 1 is being pushed.
/// 0 is superseded iff 1 was queued by the time of the check; whether it was is a race, but if
/// `is_newest(0)` already said no, push 1 had CASed in, so the pop of 0 cannot swing it out: it
/// returns `None` (retried) until `0.next` is visible, and then reports 0 superseded. Asserts that, that the popped node is the peeked one, that 1
/// (the last node) is never superseded, 0 then 1 exactly once, the push `Queued`, the release
/// succeeds, every node freed once.
#[test]
fn pop_coalescing_racing_a_push() {
    loom::model(|| {
        let tally = StdArc::new(Tally::default());
        let c = Arc::new(Q::new());
        assert!(matches!(
            try_push(&c, &tally, 0, true),
            Ok(Pushed::Activated)
        ));
        let pusher = {
            let (c, tally) = (c.clone(), tally.clone());
            thread::spawn(move || try_push(&c, &tally, 1, true).map_err(|_| ()))
        };
        // SAFETY: queued nodes are alive; only the owner (main) calls this.
        let latest = |n: NonNull<BoxNode<Val>>| unsafe { n.as_ref() }.value.latest;
        // SAFETY: main owns the chain (activating push, never released); the peeked node stays
        // queued, hence alive, until popped.
        let (zero, newest) = unsafe {
            let zero = c.peek().expect("0 is queued");
            (zero, c.is_newest(zero.as_ref()))
        };
        let p = loop {
            // SAFETY: main owns the chain.
            match unsafe { c.pop_coalescing(latest) } {
                Some(p) => break p,
                None => thread::yield_now(), // 0's successor is being pushed
            }
        };
        assert_eq!(p.node, zero);
        assert!(newest || p.superseded, "1 was pushed before the check");
        assert_eq!(free(p.node), 0);
        let one = loop {
            // SAFETY: main owns the chain.
            match unsafe { c.pop_coalescing(latest) } {
                Some(p) => break p,
                None => thread::yield_now(),
            }
        };
        assert!(!one.superseded, "nothing follows 1");
        assert_eq!(free(one.node), 1);
        assert_eq!(pusher.join().unwrap(), Ok(Pushed::Queued));
        // SAFETY: main owns the chain.
        unsafe {
            assert!(c.pop_coalescing(latest).is_none());
            assert!(c.try_release());
        }
        assert!(c.is_idle());
        drop(c);
        tally.assert_each_dropped_once(2);
    });
}

/// Release racing pushes that go through `first`, and a retire: the owner has swung its only
/// node out (tail null), then drains and releases while one thread pushes 1 then 2 and another
/// tries to retire. Push 1 lands in `first` (owner still there: `Queued`), or after the release
/// (`Activated`: the pusher owns the chain and hands the baton to main through `join`), or
/// after a retire (bounced, and so is 2); push 2 likewise. Asserts: every value is either
/// delivered (in push order) or bounced, exactly once; a bounce only on a retired chain, and
/// then every later push bounces too; at most one activation, none on a retired chain; the chain
/// ends retired if the retire succeeded, idle otherwise; every node freed once.
#[test]
fn release_racing_pushes_through_first_and_a_retire() {
    loom::model(|| {
        let (tally, c) = owning_zero();
        assert_eq!(pop(&c), Some(0)); // the swing: owned, tail null
        let pusher = {
            let (c, tally) = (c.clone(), tally.clone());
            thread::spawn(move || {
                [1, 2].map(|id| try_push(&c, &tally, id, false).map_err(|Retired(v)| read(&v)))
            })
        };
        let retirer = {
            let c = c.clone();
            thread::spawn(move || c.try_retire())
        };
        let mut got = drain_vals_and_release(&c);
        let pushed = pusher.join().unwrap();
        let retired = retirer.join().unwrap();
        let activations = pushed
            .iter()
            .filter(|&p| *p == Ok(Pushed::Activated))
            .count();
        assert!(activations <= 1, "{pushed:?}");
        if activations == 1 {
            assert!(!retired, "retired while owned: {pushed:?}");
            got.extend(drain_vals_and_release(&c)); // the activating pusher's baton
        }
        let bounced: Vec<u32> = pushed.iter().filter_map(|p| p.err()).collect();
        if !bounced.is_empty() {
            assert!(retired);
            assert_eq!(*bounced.last().unwrap(), 2, "a push after a bounce went in");
        }
        let mut all = got.clone();
        all.extend(&bounced);
        assert_eq!(all, [1, 2], "delivered {got:?}, bounced {bounced:?}");
        if retired {
            assert!(c.is_retired());
        } else {
            assert!(c.is_idle());
        }
        drop(c);
        tally.assert_each_dropped_once(3);
    });
}
