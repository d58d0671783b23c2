//! The admission gate: lets submissions in until shutdown, and lets shutdown wait for the
//! submissions already inside.
//!
//! It admits the submissions that do not go straight into a lane: unkeyed tasks, and
//! `submit_latest` tasks (which may replace their key's pending one instead of pushing). A keyed
//! task is admitted by its lane slot's reservation instead, and refused by the lanes' close,
//! which `shutdown` does only after this gate is closed and idle (`serializer/admit.rs`, "Admission"),
//! so a push made inside the gate is never refused.
//!
//! # Protocol
//!
//! The gate is a set of cache-padded words (one is picked per submitting thread, so threads
//! rarely share a line). Each word holds:
//!
//! ```text
//!  bit 0        CLOSED     set by shutdown on every word, never cleared
//!  bits 1..=20  IN-FLIGHT  submissions between `enter` and their end
//!  bits 21..    ADMITTED   submissions that were accepted (monotonic; feeds `Stats`)
//! ```
//!
//! - `enter`: `fetch_add(IN_FLIGHT)`. If the previous value had `CLOSED`, undo and refuse.
//! - the submission then pushes its task, and ends with one RMW: `+ADMITTED - IN_FLIGHT` if the
//!   task was accepted, `- IN_FLIGHT` if not (release: the push happens-before it).
//! - `close`: `fetch_or(CLOSED)` on every word; then `wait_idle` spins until every word's
//!   in-flight count is zero (acquire).
//!
//! Every step is an RMW on the same word, so for each submission either its `enter` precedes
//! `close` in that word's modification order (then `close` sees it in flight and `wait_idle` waits
//! for its push to be complete and visible) or follows it (then `enter` sees `CLOSED` and the task
//! is handed back). There is no store-then-load race, and after `close` + `wait_idle` no task can
//! appear in any chain through the gate: what shutdown collects afterwards is complete.

use std::cell::Cell;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering};

const CLOSED: u64 = 1;
const IN_FLIGHT: u64 = 1 << 1;
const IN_FLIGHT_MASK: u64 = ((1 << 20) - 1) << 1;
const ADMITTED: u64 = 1 << 21;

pub struct Gate {
    words: Box<[CachePadded<AtomicU64>]>,
    /// `words.len() - 1` (a power of two): a thread's word is `thread_slot() & mask`.
    mask: usize,
}

/// Process-wide round-robin of thread slots: a plain std atomic (not part of any protocol, and
/// loom's atomics cannot live in a `static`).
static NEXT_THREAD_SLOT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

thread_local! {
    static THREAD_SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

pub(crate) fn thread_slot() -> usize {
    THREAD_SLOT.with(|s| {
        let v = s.get();
        if v != usize::MAX {
            return v;
        }
        let v = NEXT_THREAD_SLOT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        s.set(v);
        v
    })
}

/// A submission inside the gate. Dropping it without [`admit`](Ticket::admit) counts it out as
/// refused.
pub struct Ticket<'a> {
    word: &'a AtomicU64,
}

impl Ticket<'_> {
    /// The task was pushed: count it as admitted and leave the gate.
    #[inline]
    pub fn admit(self) {
        self.word.fetch_add(ADMITTED - IN_FLIGHT, Ordering::Release);
        std::mem::forget(self);
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.word.fetch_sub(IN_FLIGHT, Ordering::Release);
    }
}

impl Gate {
    /// A gate of at least `words` words (rounded up to a power of two, so that picking a
    /// thread's word is a mask, not a division).
    pub fn new(words: usize) -> Gate {
        let n = words.max(1).next_power_of_two();
        Gate {
            words: (0..n)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            mask: n - 1,
        }
    }

    /// Enters the gate, or `None` once it is closed.
    #[inline]
    pub fn enter(&self) -> Option<Ticket<'_>> {
        let word = &self.words[thread_slot() & self.mask];
        let prev = word.fetch_add(IN_FLIGHT, Ordering::Acquire);
        let ticket = Ticket { word };
        if prev & CLOSED != 0 {
            drop(ticket);
            return None;
        }
        Some(ticket)
    }

    pub fn close(&self) {
        for w in self.words.iter() {
            w.fetch_or(CLOSED, Ordering::AcqRel);
        }
    }

    pub fn is_closed(&self) -> bool {
        self.words[0].load(Ordering::Acquire) & CLOSED != 0
    }

    /// Submissions inside the gate right now.
    pub fn in_flight(&self) -> u64 {
        self.words
            .iter()
            .map(|w| (w.load(Ordering::Acquire) & IN_FLIGHT_MASK) >> 1)
            .sum()
    }

    /// Waits until no submission is inside the gate (call after `close`; takes as long as the
    /// slowest push, which never blocks).
    pub fn wait_idle(&self) {
        let backoff = crossbeam_utils::Backoff::new();
        while self.in_flight() != 0 {
            crate::sync::snooze(&backoff);
        }
    }

    /// Submissions admitted so far.
    pub fn admitted(&self) -> u64 {
        self.words
            .iter()
            .map(|w| w.load(Ordering::Acquire) / ADMITTED)
            .sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn admits_until_closed_then_refuses() {
        let g = Gate::new(4);
        g.enter().unwrap().admit();
        let t = g.enter().unwrap();
        assert_eq!(g.in_flight(), 1);
        g.close();
        assert!(g.enter().is_none());
        assert_eq!(g.in_flight(), 1);
        t.admit();
        g.wait_idle();
        assert_eq!(g.admitted(), 2);
        assert!(g.is_closed());
    }
}
