//! When a lane's items were pushed, to within a millisecond or so, without a clock read per push.
//!
//! A lane's slot has no room for a time (48 bytes: `lane_task.rs`), and reading the clock on
//! every push would cost a submit about half of what it costs now. Instead a lane keeps a few
//! *marks*: a mark `(n, t)` says "the lane's first `n` items had been pushed by time `t`". It is
//! made by reading the lane's push count first and the clock after, so it is true whatever runs
//! meanwhile. For the item with index `i` (the `i`-th ever pushed to the lane), the first mark
//! with `n > i` bounds its push time from above, so `now - t` bounds its age from **below**: an
//! age from the marks is never more than the truth, only less, by at most the gap between the
//! item's push and the next mark.
//!
//! # Who marks
//!
//! Nobody is asked to, and each mark is a try: a contended ring skips it (a later mark serves).
//! - A pusher whose push made the count a multiple of [`EVERY`] (one clock read in `EVERY`
//!   pushes), so a lane whose workers are all inside long tasks is still marked as it fills.
//! - A worker's periodic look at every lane (`worker/steal.rs`), for each lane holding items,
//!   while any worker is free to look (every few tens of microseconds).
//! - The lane's owner putting an item into a deferral and an inspector (`key_stats`) just before
//!   they ask for an age, so a bound always exists (then it is their own moment: age 0 at worst).
//!
//! Marks within one millisecond of the last are merged into it (`(n, t)` then `(n', t)` with
//! `n' > n` becomes `(n', t)`: both statements still hold). A full ring drops the inner mark whose
//! neighbours are closest in time: recent marks stay dense and old ones thin out, so an item that
//! has waited long gets a bound that is coarse in proportion, still never above the truth.

use crate::sync::{AtomicU64, Mutex, Ordering};

/// A pusher marks when its push makes the lane's count a multiple of this.
pub(crate) const EVERY: usize = 64;

/// Marks kept per lane.
const MARKS: usize = 32;

/// One lane's marks (see the module docs).
pub(crate) struct PushMarks {
    /// The time of the newest mark: a mark in the same millisecond only moves that mark's
    /// count, and a reader of this word skips taking the lock for one whose count is not newer.
    last_ms: AtomicU64,
    ring: Mutex<Ring>,
}

/// `(count, ms)` pairs, both increasing, oldest first.
#[derive(Default)]
struct Ring {
    marks: Vec<(u64, u64)>,
}

impl Default for PushMarks {
    fn default() -> Self {
        PushMarks {
            last_ms: AtomicU64::new(0),
            ring: Mutex::new(Ring::default()),
        }
    }
}

impl PushMarks {
    /// Records that the lane's first `pushed` items had been pushed by `ms` (`pushed` read
    /// before the clock). Skipped if another thread is marking.
    pub(crate) fn note(&self, pushed: u64, ms: u64) {
        let Ok(mut ring) = self.ring.try_lock() else {
            return;
        };
        ring.note(pushed, ms);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Whether a mark at `ms` would be a new one (not merged into the newest): a cheap check
    /// for a marker that is about to read a count and take the lock for nothing.
    pub(crate) fn is_due(&self, ms: u64) -> bool {
        self.last_ms.load(Ordering::Relaxed) < ms
    }

    /// The earliest time by which the item of index `index` is known to have been pushed
    /// (`None` if no mark covers it yet).
    pub(crate) fn pushed_by(&self, index: u64) -> Option<u64> {
        let ring = crate::sync::lock(&self.ring);
        ring.marks
            .iter()
            .find(|&&(n, _)| n > index)
            .map(|&(_, ms)| ms)
    }
}

impl Ring {
    fn note(&mut self, pushed: u64, ms: u64) {
        if let Some(last) = self.marks.last_mut() {
            if pushed <= last.0 {
                return; // nothing pushed since: the newest mark says more
            }
            if ms <= last.1 {
                // Same millisecond (or a clock read that lost a race): move the count.
                last.0 = pushed;
                return;
            }
        }
        if self.marks.len() == MARKS {
            // Drop the inner mark that costs least (the newest and the oldest stay): its items
            // fall to the next mark, a later (so smaller-age) bound, off by the gap between its
            // neighbours; weighed against their age, so old marks thin out before recent ones
            // and the error stays a fraction of the age.
            let m = &self.marks;
            let cost = |i: usize| {
                let gap = u128::from(m[i + 1].1 - m[i - 1].1);
                let age = u128::from(ms - m[i - 1].1 + 1);
                (gap, age)
            };
            let i = (1..MARKS - 1)
                .min_by(|&a, &b| {
                    let ((ga, aa), (gb, ab)) = (cost(a), cost(b));
                    (ga * ab).cmp(&(gb * aa))
                })
                .expect("MARKS > 2");
            self.marks.remove(i);
        }
        self.marks.push((pushed, ms));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn an_item_is_bounded_by_the_first_mark_after_it() {
        let m = PushMarks::default();
        assert_eq!(m.pushed_by(0), None, "no mark yet");
        m.note(3, 10); // items 0, 1, 2 by 10 ms
        m.note(5, 10); // same ms: items 3, 4 join that mark
        m.note(5, 20); // nothing new pushed: ignored
        m.note(9, 30);
        assert_eq!(m.pushed_by(0), Some(10));
        assert_eq!(m.pushed_by(4), Some(10));
        assert_eq!(m.pushed_by(5), Some(30));
        assert_eq!(m.pushed_by(8), Some(30));
        assert_eq!(m.pushed_by(9), None, "pushed after the newest mark");
        assert!(!m.is_due(30) && m.is_due(31));
    }

    #[test]
    fn a_full_ring_thins_old_marks_and_never_raises_an_age() {
        let m = PushMarks::default();
        // A mark every ms for 1,000 ms, one item each.
        for t in 1..=1000u64 {
            m.note(t, t);
        }
        let ring = crate::sync::lock(&m.ring);
        assert_eq!(ring.marks.len(), MARKS);
        assert_eq!(ring.marks[0], (1, 1), "the oldest mark stays");
        assert_eq!(*ring.marks.last().unwrap(), (1000, 1000));
        drop(ring);
        // Item i was pushed by ms i + 1 (its own mark is (i + 1, i + 1)): every bound is that
        // or later, never earlier (an earlier one would overstate its age).
        for i in 0..999u64 {
            let by = m.pushed_by(i).unwrap();
            assert!(by > i, "item {i} bounded by {by}");
        }
        // Thinned in proportion to age: each bound is off by at most about half the item's age
        // (at the end, 1,000 ms), so recent items keep tight bounds.
        for i in 0..999u64 {
            let error = m.pushed_by(i).unwrap() - (i + 1);
            assert!(error <= (1000 - i) / 2 + 2, "item {i}: off by {error} ms");
        }
        assert!(m.pushed_by(995).unwrap() <= 998);
    }
}
