//! The order-and-overlap checker every keyed run goes through.
//!
//! Each task carries its key, a submitting *lane* (the index of the thread that submitted it) and a
//! sequence number: the tasks a lane submits for one key are numbered 0, 1, 2, … in submission order.
//! When a task starts, the checker
//! - swaps the key's `running` flag to set; finding it already set means two tasks of the key
//!   overlap (a violation);
//! - compares the sequence number with the key's next expected number for that lane; a mismatch is
//!   a violation (a task ran early, late, twice, or one before it was lost);
//! - counts the task as run for the key (the key's counter).
//!
//! When it ends, the checker clears `running`. Tasks submitted from different threads for the same
//! key have no defined relative order, so each lane has its own expected number; mutual exclusion is
//! checked across lanes. After a run, [`Checker::ran`] (the sum of the per-key counters) must equal
//! the number of tasks submitted.
//!
//! A key's state is 16 bytes. For up to [`SPREAD_LIMIT`] keys each key gets a cache line of its own,
//! so two workers running neighbouring keys do not bounce a shared line (which would cost every
//! executor alike and blur the comparison); above that the states are packed so that a million keys
//! cost 16 MB. All slots are written at construction, so their pages are resident before a run
//! starts (the RSS measurement of W3 does not see them).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Number of submitting lanes a key's state tracks.
pub const MAX_LANES: usize = 2;

/// Up to this many keys, each key's state gets its own cache line.
pub const SPREAD_LIMIT: usize = 100_000;

#[repr(C, align(16))]
#[derive(Default)]
struct Slot {
    running: AtomicU32,
    count: AtomicU32,
    next: [AtomicU32; MAX_LANES],
}

/// Checks per-key order and mutual exclusion; counts tasks run.
pub struct Checker {
    slots: Box<[Slot]>,
    spread: usize,
    keys: usize,
    violations: AtomicU64,
}

impl Checker {
    /// State for keys `0..keys`.
    pub fn new(keys: usize) -> Self {
        let spread = if keys <= SPREAD_LIMIT { 4 } else { 1 };
        let n = keys.max(1) * spread;
        let mut slots = Vec::with_capacity(n);
        slots.resize_with(n, Slot::default);
        // Atomic stores cannot be elided or turned into a lazily-zeroed allocation: every page is
        // written here, before any measurement starts.
        for s in &slots {
            s.running.store(0, Ordering::Relaxed);
        }
        Checker {
            slots: slots.into_boxed_slice(),
            spread,
            keys,
            violations: AtomicU64::new(0),
        }
    }

    /// Number of keys checked.
    pub fn keys(&self) -> usize {
        self.keys
    }

    #[inline]
    fn slot(&self, key: u64) -> &Slot {
        &self.slots[key as usize * self.spread]
    }

    /// Records the start of task `seq` of `lane` for `key`.
    #[inline]
    pub fn enter(&self, key: u64, lane: usize, seq: u32) {
        let s = self.slot(key);
        let mut bad = 0;
        if s.running.swap(1, Ordering::Acquire) != 0 {
            bad += 1;
        }
        let expected = s.next[lane].load(Ordering::Relaxed);
        if expected != seq {
            bad += 1;
        }
        s.next[lane].store(seq.wrapping_add(1), Ordering::Relaxed);
        s.count.fetch_add(1, Ordering::Relaxed);
        if bad != 0 {
            self.violations.fetch_add(bad, Ordering::Relaxed);
        }
    }

    /// Records the end of the task of `key` that last entered.
    #[inline]
    pub fn exit(&self, key: u64) {
        self.slot(key).running.store(0, Ordering::Release);
    }

    /// Runs `f` as task `seq` of `lane` for `key`, between [`enter`](Self::enter) and
    /// [`exit`](Self::exit).
    #[inline]
    pub fn run<R>(&self, key: u64, lane: usize, seq: u32, f: impl FnOnce() -> R) -> R {
        self.enter(key, lane, seq);
        let r = f();
        self.exit(key);
        r
    }

    /// Violations seen so far (overlaps plus out-of-sequence starts).
    pub fn violations(&self) -> u64 {
        self.violations.load(Ordering::Acquire)
    }

    /// Tasks run so far, over all keys.
    pub fn ran(&self) -> u64 {
        self.slots
            .iter()
            .step_by(self.spread)
            .map(|s| u64::from(s.count.load(Ordering::Acquire)))
            .sum()
    }

    /// Tasks run so far for `key`.
    pub fn ran_for(&self, key: u64) -> u32 {
        self.slot(key).count.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_sequence_has_no_violation() {
        let c = Checker::new(3);
        for seq in 0..10 {
            for key in 0..3 {
                c.run(key, 0, seq, || ());
            }
        }
        assert_eq!(c.violations(), 0);
        assert_eq!(c.ran(), 30);
        assert_eq!(c.ran_for(2), 10);
    }

    #[test]
    fn reordered_sequence_is_caught() {
        let c = Checker::new(1);
        for seq in [0, 2, 1, 3] {
            c.run(0, 0, seq, || ());
        }
        // Every out-of-place start counts: 2 (1 expected), 1 (3 expected), 3 (2 expected).
        assert_eq!(c.violations(), 3);
        assert_eq!(c.ran(), 4);
    }

    #[test]
    fn lost_task_is_caught_by_sequence_and_count() {
        let c = Checker::new(1);
        for seq in [0, 1, 3] {
            c.run(0, 0, seq, || ());
        }
        assert_eq!(c.violations(), 1);
        assert_eq!(c.ran(), 3);
    }

    #[test]
    fn duplicate_is_caught() {
        let c = Checker::new(1);
        for seq in [0, 1, 1, 2] {
            c.run(0, 0, seq, || ());
        }
        assert!(c.violations() >= 1);
    }

    #[test]
    fn overlap_is_caught() {
        let c = Checker::new(2);
        c.enter(1, 0, 0);
        c.enter(1, 0, 1); // a second task of key 1 starts while the first still runs
        c.exit(1);
        c.exit(1);
        assert_eq!(c.violations(), 1);
        // Other keys are independent.
        c.enter(0, 0, 0);
        c.run(1, 0, 2, || ());
        c.exit(0);
        assert_eq!(c.violations(), 1);
    }

    #[test]
    fn lanes_are_sequenced_independently() {
        let c = Checker::new(1);
        c.run(0, 0, 0, || ());
        c.run(0, 1, 0, || ());
        c.run(0, 1, 1, || ());
        c.run(0, 0, 1, || ());
        assert_eq!(c.violations(), 0);
        c.run(0, 1, 5, || ());
        assert_eq!(c.violations(), 1);
    }

    #[test]
    fn packed_layout_for_many_keys() {
        let c = Checker::new(SPREAD_LIMIT + 1);
        c.run(SPREAD_LIMIT as u64, 0, 0, || ());
        c.run(0, 0, 0, || ());
        assert_eq!(c.ran(), 2);
        assert_eq!(c.violations(), 0);
    }

    #[test]
    fn concurrent_overlap_is_detected() {
        // Two threads running the same key's tasks without any serialization must trip the checker.
        // They start together and run until it notices (or 10 s pass): on a loaded machine one
        // thread can otherwise finish a fixed count before the other is scheduled at all.
        let c = Checker::new(1);
        let c = &c;
        let start = std::sync::Barrier::new(2);
        let start = &start;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let ran: u64 = std::thread::scope(|s| {
            let lanes: Vec<_> = (0..2)
                .map(|lane| {
                    s.spawn(move || {
                        start.wait();
                        let mut seq = 0u32;
                        while c.violations() == 0 && std::time::Instant::now() < deadline {
                            for _ in 0..1000 {
                                c.run(0, lane, seq, || std::hint::black_box(seq));
                                seq += 1;
                            }
                        }
                        u64::from(seq)
                    })
                })
                .collect();
            lanes.into_iter().map(|l| l.join().unwrap()).sum()
        });
        assert!(c.violations() > 0, "overlapping runs went unnoticed");
        assert_eq!(c.ran(), ran);
    }
}
