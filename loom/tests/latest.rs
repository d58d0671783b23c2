//! Loom models of the `submit_latest` coalescing slot (std-executor/src/latest.rs), over the real
//! `LatestSlot` (reached through the crate's `cfg(loom)`-only `loom_api` module) and the real core
//! `Chain`.
//!
//! The executor's two sides are played by short transcriptions: [`submit`] is `admit`'s push
//! loop for one key (serializer.rs: offer, push the marker or the node, unclaim on a bounce; a
//! bounce ends the submit here, where `admit` would go back to the table), and [`drain`] is
//! `run_chain` without the fairness budget (worker.rs: `pop_coalescing` with `Latest | Marker`
//! coalescing, then the real `LatestSlot::popped`, which `KeyState::popped` forwards to). A push
//! that activates the chain drains it on the pushing thread.
//!
//! Nodes are a test type of our own, allocated with `Box`; the marker is embedded in the slot.
//! The key's run log is a loom `UnsafeCell` touched only by the chain's owner, so loom also
//! checks that ownership passes with happens-before.
#![cfg(loom)]

use std::ptr::NonNull;

use keyserial::loom_api::{LatestSlot, Offer};
use keyserial_core::chain::{Chain, Link, Linked, Pushed, Retired};
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// An ordinary task.
    Plain,
    /// A `submit_latest` task.
    Latest,
    /// The slot's marker (never run).
    Marker,
}

#[repr(C)]
struct Node {
    link: Link,
    kind: Kind,
    id: u32,
}

// SAFETY: `link` is the first field of a `repr(C)` struct, so the casts are exact inverses; a
// Link is pointer-aligned.
unsafe impl Linked for Node {
    fn link(node: NonNull<Self>) -> NonNull<Link> {
        node.cast()
    }

    unsafe fn from_link(link: NonNull<Link>) -> NonNull<Self> {
        link.cast()
    }

    unsafe fn drop_queued(node: NonNull<Self>) {
        // SAFETY: the chain hands over a node it no longer uses; only task nodes are boxed.
        unsafe {
            if node.as_ref().kind != Kind::Marker {
                drop(Box::from_raw(node.as_ptr()));
            }
        }
    }
}

fn alloc(id: u32, kind: Kind) -> NonNull<Node> {
    NonNull::from(Box::leak(Box::new(Node {
        link: Link::new(),
        kind,
        id,
    })))
}

/// Frees a task node the caller owns; returns its id.
fn free(node: NonNull<Node>) -> u32 {
    // SAFETY: callers own `node` (popped, taken from the slot, replaced or bounced), a Box.
    let node = unsafe { Box::from_raw(node.as_ptr()) };
    assert_ne!(node.kind, Kind::Marker, "the marker is never handed out");
    node.id
}

/// What happened to a task when it left the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Run by the chain's owner.
    Ran(u32),
    /// Skipped by the owner: directly followed by another latest task (drain-time rule).
    Superseded(u32),
}

/// One key: its chain, its coalescing slot and the owner's run log.
struct Key {
    chain: Chain<Node>,
    latest: LatestSlot<Node>,
    log: UnsafeCell<Vec<Fate>>,
}

// SAFETY: `log` is touched only by the chain's owner (and by the test thread once every other
// thread is joined); the rest is Sync.
unsafe impl Sync for Key {}
// SAFETY: as above.
unsafe impl Send for Key {}

impl Key {
    fn new() -> Arc<Key> {
        Arc::new(Key {
            chain: Chain::new(),
            latest: LatestSlot::new(Node {
                link: Link::new(),
                kind: Kind::Marker,
                id: u32::MAX,
            }),
            log: UnsafeCell::new(Vec::new()),
        })
    }

    /// The run log, once every other thread is joined.
    fn log(&self) -> Vec<Fate> {
        // SAFETY: no other thread is left.
        self.log.with(|l| unsafe { (*l).clone() })
    }

    /// `true` if the slot is empty (a claim succeeds). Leaves it as it was.
    fn slot_is_empty(&self) -> bool {
        let probe = alloc(u32::MAX - 1, Kind::Latest);
        match self.latest.offer(&self.chain, probe) {
            Offer::PushMarker(_) => {
                assert_eq!(free(self.latest.unclaim()), u32::MAX - 1);
                true
            }
            Offer::Plain(back) => {
                free(back);
                false
            }
            Offer::Replaced(_) => panic!("the probe replaced a task"),
        }
    }
}

/// How a submit ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Submitted {
    /// Queued (as the marker or a node); someone else owns the chain.
    Queued,
    /// This push activated the chain; the submitter drained it.
    Drained,
    /// It replaced this older task in the slot, which the submitter abandoned.
    Replaced(u32),
    /// The chain was retired: the task came back (`admit` would retry on a fresh chain).
    Bounced(u32),
}

/// `admit`'s push loop for one key (serializer.rs), with the drain on activation.
fn submit(key: &Key, id: u32, kind: Kind) -> Submitted {
    let node = alloc(id, kind);
    let push = match kind {
        Kind::Latest => match key.latest.offer(&key.chain, node) {
            Offer::Replaced(old) => return Submitted::Replaced(free(old)),
            Offer::PushMarker(marker) => marker,
            Offer::Plain(node) => node,
        },
        _ => node,
    };
    // SAFETY: a node this thread owns, or the marker, which only its claimer (us) pushes.
    match unsafe { key.chain.push(push) } {
        Ok(Pushed::Activated) => {
            drain(key);
            Submitted::Drained
        }
        Ok(Pushed::Queued) => Submitted::Queued,
        Err(Retired(back)) => {
            let node = if key.latest.is_marker(back) {
                key.latest.unclaim()
            } else {
                back
            };
            Submitted::Bounced(free(node))
        }
    }
}

/// `run_chain` without the budget (worker.rs): drains until a release succeeds.
fn drain(key: &Key) {
    let coalescing = |n: NonNull<Node>| {
        // SAFETY: the owner reads nodes queued on its chain (or the marker's constant kind).
        matches!(unsafe { n.as_ref() }.kind, Kind::Latest | Kind::Marker)
    };
    loop {
        // SAFETY: this thread owns the chain (its push activated it).
        let Some(p) = (unsafe { key.chain.pop_coalescing(coalescing) }) else {
            // SAFETY: as above.
            if unsafe { key.chain.try_release() } {
                return;
            }
            // A push between its two steps (core `chain`, "The pop"): the worker would requeue
            // the key; the model yields.
            loom::thread::yield_now();
            continue;
        };
        let Some(task) = key.latest.popped(p.node) else {
            panic!("a queued marker always stands for a task");
        };
        let id = free(task);
        let fate = if p.superseded {
            Fate::Superseded(id)
        } else {
            Fate::Ran(id)
        };
        // SAFETY: only the chain's owner touches the log.
        key.log.with_mut(|l| unsafe { (*l).push(fate) });
    }
}

/// Checks that every id in `ids` left exactly once (ran, superseded, replaced or bounced), that
/// each pair `(a, b)` of `order` (`a`'s submit returned before `b`'s started) ran in that order
/// if both ran, and that the key ends idle (or retired) with an empty slot. Returns the ids that
/// ran, in run order.
fn check(key: &Key, ids: &[u32], order: &[(u32, u32)], outcomes: &[Submitted]) -> Vec<u32> {
    let log = key.log();
    let ran: Vec<u32> = log
        .iter()
        .filter_map(|f| match f {
            Fate::Ran(id) => Some(*id),
            Fate::Superseded(_) => None,
        })
        .collect();
    let mut seen: Vec<u32> = log
        .iter()
        .map(|f| match f {
            Fate::Ran(id) | Fate::Superseded(id) => *id,
        })
        .chain(outcomes.iter().filter_map(|o| match o {
            Submitted::Replaced(id) | Submitted::Bounced(id) => Some(*id),
            Submitted::Queued | Submitted::Drained => None,
        }))
        .collect();
    seen.sort();
    assert_eq!(
        seen, ids,
        "every task leaves once: log {log:?}, {outcomes:?}"
    );
    let pos = |id: u32| ran.iter().position(|&r| r == id);
    for &(a, b) in order {
        if let (Some(a), Some(b)) = (pos(a), pos(b)) {
            assert!(a < b, "run order is submission order: {log:?}");
        }
    }
    // Superseded at drain time only by a task right behind it (which ran or was itself
    // superseded), never by one submitted before it; so the log always ends with a run.
    for (i, f) in log.iter().enumerate() {
        if let Fate::Superseded(id) = *f {
            let next = match log.get(i + 1) {
                Some(Fate::Ran(next) | Fate::Superseded(next)) => *next,
                None => panic!("{id} superseded by nothing: {log:?}"),
            };
            assert!(
                !order.contains(&(next, id)),
                "{id} superseded by an older task: {log:?}"
            );
        }
    }
    assert!(key.chain.is_idle() || key.chain.is_retired());
    assert!(key.slot_is_empty(), "nothing stranded in the slot");
    ran
}

#[test]
fn replace_racing_the_owner_taking_the_marker() {
    // The owner (this thread) claimed the slot for 1 and activated the chain; a submitter offers
    // 2 then 3 while the owner pops the marker and takes the slot.
    loom::model(|| {
        let key = Key::new();
        assert_eq!(submit_queued(&key, 1), Pushed::Activated);
        let submitter = {
            let key = key.clone();
            thread::spawn(move || [submit(&key, 2, Kind::Latest), submit(&key, 3, Kind::Latest)])
        };
        drain(&key);
        let outcomes = submitter.join().unwrap();
        let ran = check(&key, &[1, 2, 3], &[(1, 2), (1, 3), (2, 3)], &outcomes);
        assert_eq!(ran.last(), Some(&3), "the last latest task always runs");
        for o in outcomes {
            if let Submitted::Replaced(old) = o {
                assert!(!ran.contains(&old));
            }
        }
    });
}

#[test]
fn a_plain_submit_ends_replacement() {
    // As above, but the submitter's second task is an ordinary one: the latest task before it
    // (2) must run, and so must the latest task after it (4), which cannot replace 2.
    loom::model(|| {
        let key = Key::new();
        assert_eq!(submit_queued(&key, 1), Pushed::Activated);
        let submitter = {
            let key = key.clone();
            thread::spawn(move || {
                [
                    submit(&key, 2, Kind::Latest),
                    submit(&key, 3, Kind::Plain),
                    submit(&key, 4, Kind::Latest),
                ]
            })
        };
        drain(&key);
        let outcomes = submitter.join().unwrap();
        let order = [(1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)];
        let ran = check(&key, &[1, 2, 3, 4], &order, &outcomes);
        assert_eq!(ran[ran.len() - 3..], [2, 3, 4], "{outcomes:?}");
        assert!(!matches!(outcomes[2], Submitted::Replaced(_)));
    });
}

/// Claims the slot for latest task `id` and pushes the marker without draining (the caller owns
/// the chain on `Activated`).
fn submit_queued(key: &Key, id: u32) -> Pushed {
    let Offer::PushMarker(marker) = key.latest.offer(&key.chain, alloc(id, Kind::Latest)) else {
        panic!("the slot is empty");
    };
    // SAFETY: the marker, pushed by its claimer.
    unsafe { key.chain.push(marker) }.expect("not retired")
}

#[test]
fn two_submitters_race_the_owners_drain() {
    loom::model(|| {
        let key = Key::new();
        assert_eq!(submit_queued(&key, 1), Pushed::Activated);
        let submitters: Vec<_> = [2, 3]
            .into_iter()
            .map(|id| {
                let key = key.clone();
                thread::spawn(move || submit(&key, id, Kind::Latest))
            })
            .collect();
        drain(&key);
        let outcomes: Vec<Submitted> = submitters.into_iter().map(|s| s.join().unwrap()).collect();
        let ran = check(&key, &[1, 2, 3], &[(1, 2), (1, 3)], &outcomes);
        // 1 was submitted before both: if it ran, it ran first. The two racing submits have no
        // order, but whichever came last is never dropped.
        if ran.contains(&1) {
            assert_eq!(ran[0], 1);
        }
        assert!(ran.contains(&2) || ran.contains(&3));
    });
}

#[test]
fn submitters_to_a_blocked_key_keep_one_pending_task() {
    // The owner is busy (it holds the chain and has not popped the marker): every offer finds the
    // marker newest, so the two submits coalesce into the slot, one pending task in all.
    loom::model(|| {
        let key = Key::new();
        assert_eq!(submit_queued(&key, 1), Pushed::Activated);
        let submitters: Vec<_> = [2, 3]
            .into_iter()
            .map(|id| {
                let key = key.clone();
                thread::spawn(move || submit(&key, id, Kind::Latest))
            })
            .collect();
        let outcomes: Vec<Submitted> = submitters.into_iter().map(|s| s.join().unwrap()).collect();
        let replaced: Vec<u32> = outcomes
            .iter()
            .map(|o| match o {
                Submitted::Replaced(id) => *id,
                other => panic!("a blocked key's latest submit replaces: {other:?}"),
            })
            .collect();
        drain(&key);
        let ran = check(&key, &[1, 2, 3], &[], &outcomes);
        assert_eq!(
            ran.len(),
            1,
            "one pending task ran: {ran:?}, replaced {replaced:?}"
        );
        assert!(replaced.contains(&1));
    });
}

#[test]
fn claims_meeting_a_retired_chain_unclaim() {
    // An idle key is retired while two latest submits claim its slot: every task either ran
    // (the push won and the pusher drained) or came back, and nothing is left in the slot.
    loom::model(|| {
        let key = Key::new();
        let submitters: Vec<_> = [1, 2]
            .into_iter()
            .map(|id| {
                let key = key.clone();
                thread::spawn(move || submit(&key, id, Kind::Latest))
            })
            .collect();
        let retired = key.chain.try_retire();
        let outcomes: Vec<Submitted> = submitters.into_iter().map(|s| s.join().unwrap()).collect();
        let ran = check(&key, &[1, 2], &[], &outcomes);
        let bounced = outcomes
            .iter()
            .filter(|o| matches!(o, Submitted::Bounced(_)))
            .count();
        assert_eq!(retired, key.chain.is_retired());
        if !retired {
            assert_eq!(bounced, 0, "only a retired chain bounces");
        }
        if bounced > 0 {
            assert!(retired);
        }
        // Nothing is lost: a task replaced in the slot was replaced by one that ran or bounced.
        for o in &outcomes {
            if let Submitted::Replaced(old) = o {
                assert!(!ran.contains(old));
                assert!(!ran.is_empty() || bounced > 0);
            }
        }
    });
}
