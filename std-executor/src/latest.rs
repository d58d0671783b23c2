//! The coalescing slot behind `submit_latest`: a key's pending latest task is replaced *when it
//! is superseded*, not when the key drains, so a blocked key holds at most one of them.
//!
//! # Protocol
//!
//! Each key has one [`LatestSlot`]: a *marker* node, embedded in the key's state (so it lives as
//! long as the key's entry, which the epoch protects), and a `slot` word holding the task the
//! marker stands for. The marker is queued on the key's chain like any task; whoever pops it
//! runs the task in the slot at that position. States of the slot word:
//!
//! ```text
//!   EMPTY (null)   the marker is not queued (free to claim)
//!   FULL(task)     the marker is queued (or just popped) and stands for `task`
//! ```
//!
//! - **claim** (submitter, slot `EMPTY`): `CAS(EMPTY -> FULL(task))`, then push the marker. Only
//!   the claimer pushes it, so the marker is on the chain at most once. If the push finds the
//!   chain retired, the claimer takes its task back with `swap(EMPTY)` (nobody else can have
//!   replaced it: a retired chain's tail is null, so the marker is never its newest node).
//! - **replace** (submitter, slot `FULL(old)`): only if the marker is the chain's tail, pushed
//!   last and not popped yet ([`Chain::is_newest`]; the owner may have peeked at it): then nothing
//!   was submitted to the key after `old`, and `old` has not started (an owner that pops the
//!   marker takes the slot with the swap below, which this CAS races fairly). `CAS(FULL(old) ->
//!   FULL(task))`; on success the submitter owns `old` and abandons it as superseded (closure
//!   dropped, capacity slot and handle released now). The new task takes the marker's place in
//!   the key's order, which is where it belongs: nothing was queued after the marker.
//! - **take** (the chain's owner, after popping the marker): `swap(EMPTY)` returns the task to run.
//!   The marker left the chain before the swap, so whoever sees `EMPTY` may queue it again.
//! - Otherwise (slot `FULL` but the marker is not the newest push: something else was submitted
//!   after it, or the owner already popped the marker) the task is queued as an ordinary node of
//!   kind `Latest`; the drain-time rule (a latest task whose successor is also a latest task is
//!   superseded) still applies to those.
//!
//! **Nothing lost or run twice**: a task is in exactly one place at a time. The replacing CAS and
//! the owner's swap are RMWs on one word, so either the replacement lands before the take (and the
//! owner runs the new task) or it fails (`old` is gone) and the submitter retries from the top.
//! **Order**: a replacement happens only while the marker is the newest push; a submit that
//! returned before this one started made itself the newest push, so it is never overtaken. Two
//! submits of one key that race each other have no order to keep; the replacement then
//! linearizes at its `is_newest` check.
//! **ABA**: a slot value is a live node's address; for the CAS to succeed against a different task
//! at the same address, the old task must have been taken, run and freed, and a new one claimed
//! into the marker, all between one submitter's two loads; the result is still a replacement of
//! the marker's current task while the marker was recently the newest push, which no caller can
//! tell from a slightly earlier linearization point.
//!
//! Loom models (real `LatestSlot` and `Chain`): `loom/tests/latest.rs`.

use std::ptr::{self, NonNull};

use keyserial_core::chain::{Chain, Linked};

use crate::sync::{AtomicPtr, Ordering};

/// A key's coalescing slot for `submit_latest` (see the module docs).
pub struct LatestSlot<N: Linked> {
    marker: N,
    slot: AtomicPtr<N>,
}

/// What a submitter should do with a latest task after [`LatestSlot::offer`].
#[allow(dead_code)] // the executor's latest tasks moved to `latest_cells.rs`; loom models still use it
pub enum Offer<N> {
    /// It replaced this older task, which the caller now owns and must abandon as superseded.
    Replaced(NonNull<N>),
    /// It is in the slot: push this marker (the caller claimed it).
    PushMarker(NonNull<N>),
    /// Queue it as an ordinary node (given back).
    Plain(NonNull<N>),
}

// SAFETY: the slot hands whole nodes between threads, which is sound when nodes are Send; the
// marker is touched only through the chain protocol (its link) and is never given out.
unsafe impl<N: Linked + Send> Send for LatestSlot<N> {}
// SAFETY: as above; shared access goes through the atomic slot word and the chain.
unsafe impl<N: Linked + Send> Sync for LatestSlot<N> {}

impl<N: Linked> LatestSlot<N> {
    /// An empty slot with `marker` as its (never run) marker node.
    pub fn new(marker: N) -> Self {
        LatestSlot {
            marker,
            slot: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// The marker node's address (what the chain holds while it is queued).
    pub fn marker(&self) -> NonNull<N> {
        NonNull::from(&self.marker)
    }

    /// `true` if `node` is this slot's marker.
    pub fn is_marker(&self, node: NonNull<N>) -> bool {
        node == self.marker()
    }

    /// A submitter offers `task` (an unpublished node it owns) for the key of `chain`.
    #[allow(dead_code)]
    pub fn offer(&self, chain: &Chain<N>, task: NonNull<N>) -> Offer<N> {
        let mut cur = self.slot.load(Ordering::Acquire);
        loop {
            // An empty slot is free to claim; a full one may be replaced only while its marker
            // is the newest push (see the module docs).
            if !cur.is_null() && !chain.is_newest(&self.marker) {
                return Offer::Plain(task);
            }
            let result =
                self.slot
                    .compare_exchange(cur, task.as_ptr(), Ordering::AcqRel, Ordering::Acquire);
            match result {
                Ok(prev) => {
                    return match NonNull::new(prev) {
                        None => Offer::PushMarker(self.marker()),
                        Some(old) => Offer::Replaced(old),
                    }
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// After a claim whose marker push found the chain retired: takes the task back.
    pub fn unclaim(&self) -> NonNull<N> {
        let task = self.slot.swap(ptr::null_mut(), Ordering::AcqRel);
        NonNull::new(task).expect("a claimed slot holds the claimer's task")
    }

    /// The chain's owner popped `node` from the key's chain: the node to run, which is the
    /// slot's task if `node` is the marker (`None` if it stood for nothing), else `node` itself.
    pub fn popped(&self, node: NonNull<N>) -> Option<NonNull<N>> {
        if self.is_marker(node) {
            self.take()
        } else {
            Some(node)
        }
    }

    /// The chain's owner popped the marker: the task it stands for (now the owner's).
    pub fn take(&self) -> Option<NonNull<N>> {
        NonNull::new(self.slot.swap(ptr::null_mut(), Ordering::AcqRel))
    }

    /// The slot's task, if any, when the key's state is dropped (`&mut self`: nobody else).
    pub(crate) fn take_mut(&mut self) -> Option<NonNull<N>> {
        NonNull::new(self.slot.swap(ptr::null_mut(), Ordering::Relaxed))
    }
}
