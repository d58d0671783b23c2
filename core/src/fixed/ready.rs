//! The ready ring: key slots whose chain became ready, served oldest first.
//!
//! A ring of `N` one-word cells (`N` = `KEYS`, any size) and two position words, `tail` (next
//! position to write) and `head` (next position to take). A position is `(lap, index)`; each cell
//! word holds the lap it belongs to, a `FULL` bit and, when full, a slot index:
//!
//! ```text
//!  cell = lap << (SB + 1) | slot << 1 | FULL        position = lap << SB | index   (index < N)
//!  EMPTY, lap L   free for the writer of position (L, i)
//!  FULL,  lap L   holds the slot written at (L, i), for the taker of that position
//!  EMPTY, lap L+1 taken: free for the writer of (L + 1, i)
//! ```
//!
//! - **push**: read `tail = (L, i)`; if cell `i` is `EMPTY, L`, `CAS` it to `FULL, L, slot` (the
//!   linearisation point), then `CAS(tail -> next)`. If the cell was already written at `(L, i)`
//!   (full, or taken: `EMPTY, L+1`) some writer stopped before moving `tail`: move it for them.
//! - **pop**: read `head = (L, i)`; if cell `i` is `FULL, L`, `CAS` it to `EMPTY, L+1` (the
//!   linearisation point), then `CAS(head -> next)`; if it is `EMPTY, L+1` help `head` on; if it
//!   is `EMPTY, L` nothing was written at `head`, so the ring is empty.
//!
//! Unlike [`BoundedQueue`](crate::ready::BoundedQueue) (claim a position, then publish the cell),
//! writing the cell *is* the claim, so there is no window in which a stopped thread makes a cell
//! look full or empty to others: every step a stopped thread leaves undone is one `CAS` on a
//! position word that anyone completes. Both operations are lock-free: a retry means another push
//! or pop succeeded. It also needs no power-of-two size.
//!
//! **Never full.** A slot is in the ring at most once (only the holder of its chain's `ACTIVE`
//! baton pushes it, and the baton is in the ring until popped), and takes happen in position
//! order. A push that found `FULL, L-1` at `tail` would mean positions `tail-N .. tail-1` all hold
//! untaken slots, `N` distinct slots, while the pusher holds an `N + 1`-th: impossible with `N`
//! slots. So `N = KEYS` cells suffice and `push` cannot fail.
//!
//! Laps wrap modulo `2^(usize::BITS - SB - 1)` (`SB` = bits of a slot index): a push or pop
//! stalled for that many laps of the ring could be fooled, 2^27 laps for 16 keys on a 32-bit
//! target, far beyond one preemption.

use crate::sync::{AtomicUsize, Ordering};

const FULL: usize = 1;

pub(super) struct ReadyRing<const N: usize> {
    head: AtomicUsize,
    tail: AtomicUsize,
    cells: [AtomicUsize; N],
}

impl<const N: usize> ReadyRing<N> {
    /// Bits of an index below `N`.
    const SB: u32 = usize::BITS - (N.saturating_sub(1)).leading_zeros();
    const INDEX_MASK: usize = (1 << Self::SB) - 1;
    const LAP_MASK: usize = usize::MAX >> (Self::SB + 1);

    #[cfg(not(loom))]
    pub(super) const fn new() -> Self {
        #[allow(clippy::declare_interior_mutable_const)]
        const ZERO: AtomicUsize = AtomicUsize::new(0);
        ReadyRing {
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            cells: [ZERO; N],
        }
    }

    #[cfg(loom)]
    pub(super) fn new() -> Self {
        ReadyRing {
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            cells: core::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }

    #[inline]
    fn next(pos: usize) -> usize {
        if (pos & Self::INDEX_MASK) + 1 == N {
            ((pos >> Self::SB).wrapping_add(1)) << Self::SB
        } else {
            pos + 1
        }
    }

    /// The cell of `pos`, its lap (masked to what a cell stores) and the cell's current word.
    #[inline]
    fn at(&self, pos: usize) -> (&AtomicUsize, usize, usize) {
        let cell = &self.cells[pos & Self::INDEX_MASK];
        let lap = (pos >> Self::SB) & Self::LAP_MASK;
        (cell, lap, cell.load(Ordering::Acquire))
    }

    #[inline]
    fn cell_lap(word: usize) -> usize {
        word >> (Self::SB + 1)
    }

    #[inline]
    fn empty(lap: usize) -> usize {
        (lap & Self::LAP_MASK) << (Self::SB + 1)
    }

    /// Appends `slot` (the caller holds its chain's baton, so it is not in the ring). Lock-free;
    /// never fails (see the module docs).
    pub(super) fn push(&self, slot: usize) {
        debug_assert!(slot < N);
        let mut pos = self.tail.load(Ordering::Acquire);
        loop {
            let (cell, lap, word) = self.at(pos);
            let written = if Self::cell_lap(word) == lap {
                if word & FULL == 0 {
                    let full = Self::empty(lap) | (slot << 1) | FULL;
                    // AcqRel: Release hands the slot (and everything its baton covers) to the
                    // taker; Acquire orders this after the previous taker's release.
                    if cell
                        .compare_exchange(word, full, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        let _ = self.tail.compare_exchange(
                            pos,
                            Self::next(pos),
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        );
                        return;
                    }
                    false
                } else {
                    true
                }
            } else {
                Self::cell_lap(word) == (lap + 1) & Self::LAP_MASK && word & FULL == 0
            };
            if written {
                // Another push wrote this position and has not moved `tail` yet: do it for it.
                let _ = self.tail.compare_exchange(
                    pos,
                    Self::next(pos),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
            pos = self.tail.load(Ordering::Acquire);
        }
    }

    /// Takes the oldest slot, or `None` if the ring is empty. Lock-free.
    pub(super) fn pop(&self) -> Option<usize> {
        let mut pos = self.head.load(Ordering::Acquire);
        loop {
            let (cell, lap, word) = self.at(pos);
            if Self::cell_lap(word) == lap {
                if word & FULL == 0 {
                    return None; // nothing written at `head`
                }
                if cell
                    .compare_exchange(
                        word,
                        Self::empty(lap + 1),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok()
                {
                    let _ = self.head.compare_exchange(
                        pos,
                        Self::next(pos),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                    return Some((word >> 1) & Self::INDEX_MASK);
                }
            } else if Self::cell_lap(word) == (lap + 1) & Self::LAP_MASK && word & FULL == 0 {
                // Taken by a pop that has not moved `head` yet: do it for it.
                let _ = self.head.compare_exchange(
                    pos,
                    Self::next(pos),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
            }
            pos = self.head.load(Ordering::Acquire);
        }
    }
}
