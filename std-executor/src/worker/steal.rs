//! Taking a lane over from an owner stuck in one task (or one its home worker never came for),
//! deferring only the stuck task's key (`deferral.rs`); see `serve.rs`, "Lanes first".

use keyserial_core::lane::{Phase, Watch};

use super::WorkerLoop;
use crate::deferral::Deferral;
use crate::lanes::STEAL_AFTER;

/// How often a worker's look at the lanes also marks the ones holding items (`push_marks.rs`):
/// the marks' resolution is a millisecond.
const MARK_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

impl<K> WorkerLoop<'_, K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A lane taken over from an owner stuck in one task (the task's key deferred), or left
    /// waiting by its home worker. At most every [`STEAL_AFTER`], a worker compares each lane
    /// with what it saw at its previous look, and takes one whose owner is still inside the same
    /// task with items waiting, or one still `FREE` with items waiting (its home worker never
    /// came: it may be stuck in a task of another lane). The criterion is progress, and nobody
    /// waits for it: a busy worker looks between its own turns, an idle one between its spins
    /// and naps ([`POLL`](crate::lanes::POLL) while any lane has items).
    pub(super) fn lane_stuck_since_last_look(&mut self) -> Option<usize> {
        let now = std::time::Instant::now();
        if now.duration_since(self.watched_at) < STEAL_AFTER {
            return None;
        }
        self.watched_at = now;
        let lanes = &self.shared.lanes();
        if now.duration_since(self.marked_at) >= MARK_EVERY {
            // When the waiting items were pushed, for `key_stats` (`push_marks.rs`).
            self.marked_at = now;
            lanes.mark_waiting();
        }
        let mut found = None;
        for l in 0..lanes.len() {
            let prev = self.watched[l].take();
            let was_free = std::mem::take(&mut self.seen_free[l]);
            let lane = lanes.get(l);
            if lane.is_empty() {
                continue;
            }
            if lane.word.phase() == Phase::Free {
                // Waiting for a worker at two looks in a row (its home worker is busy, perhaps
                // stuck): take it, if this worker has not found another already.
                if was_free && found.is_none() && lanes.try_take(l, self.index) {
                    found = Some(l);
                } else {
                    self.seen_free[l] = true;
                }
                continue;
            }
            if let Some(prev) = prev.filter(|p| found.is_none() && lane.word.is_still(p)) {
                if self.try_steal_lane(l, &prev) {
                    found = Some(l);
                    continue;
                }
            }
            self.watched[l] = lane.word.watch();
        }
        found
    }

    /// Takes lane `l` from the owner `w` saw inside a task, deferring that task's key.
    pub(super) fn try_steal_lane(&self, l: usize, w: &Watch) -> bool {
        let sh = self.shared;
        let lane = sh.lanes().get(l);
        let Some(victim) = sh.mailbox(w.owner()) else {
            return false; // shutdown_now's
        };
        if w.owner() == self.index || !lane.word.is_still(w) {
            return false;
        }
        let d = Deferral::new(w.key_hash());
        let p = std::sync::Arc::into_raw(d.clone()).cast_mut();
        let p = std::ptr::NonNull::new(p).expect("an Arc is never null");
        match lane.word.try_steal(self.index, w, victim, p) {
            Ok(()) => {
                lane.deferrals.insert(d);
                true
            }
            Err(p) => {
                // SAFETY: `p` came from `Arc::into_raw` above and was handed back unused.
                drop(unsafe { std::sync::Arc::from_raw(p.as_ptr().cast_const()) });
                false
            }
        }
    }
}
