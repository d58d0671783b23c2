//! Handing back what a worker holds when `shutdown_now` stops it.
//!
//! # Stopping (`shutdown_now`)
//!
//! Each slot has a phase word (`phase.rs`: `IDLE`, `BUSY`, `RUNNING`, plus `STOP` and `STOLEN`)
//! through which `shutdown_now` takes the queue behind a running task without waiting for the
//! task. A worker either hands back what it holds before going `IDLE`, or had its chain stolen
//! while `RUNNING`: each queued task ends up in exactly one place.

use super::WorkerLoop;
use crate::lane_task::Item;
use crate::lanes::Lane;
use crate::pending::PendingTask;
use crate::task::TaskRef;

impl<K> WorkerLoop<'_, K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// `shutdown_now`: hands back lane `l`'s deferred and queued items, then releases it.
    pub(super) fn hand_back_lane(&self, l: usize) {
        self.hand_back_lane_with(l, None);
    }

    /// `hand_back_lane`, with `held`, an item this worker popped from the lane and did not
    /// route, put back where it was: after the deferred items (popped before it; a deferral of
    /// its own key holds that key's earlier items) and before the queued ones.
    pub(super) fn hand_back_lane_with(&self, l: usize, held: Option<Item<K>>) {
        let lane = self.shared.lanes().get(l);
        let mut back = Vec::new();
        // SAFETY: this worker owns lane `l`: every caller passes the lane it holds (a lane
        // whose task ended `Kept`, the lane `run_direct` was called for, or the lane `serve`
        // pops).
        unsafe { lane_items(lane, held, &mut back) };
        self.shared.lifecycle().hand_back_lane_items(&mut back);
        lane.word.release(self.index);
    }

    pub(super) fn hand_back_items(&self, items: Vec<Item<K>>) {
        let mut back: Vec<_> = items.into_iter().map(pending).collect();
        self.shared.lifecycle().hand_back_lane_items(&mut back);
    }

    /// Hands an unkeyed task back for `shutdown_now`.
    pub(super) fn hand_back(&self, task: TaskRef) {
        self.shared
            .lifecycle()
            .hand_back(PendingTask::new(None, task));
    }
}

/// Everything a lane holds, in its keys' order, onto `out`: its deferrals' items (popped before
/// the rest; a key's deferral holds that key's earlier items), then `held` (an item its owner
/// popped and did not route), then its queued items. For a stopped owner and for
/// `shutdown_now`, which takes every lane for good.
///
/// # Safety
///
/// The caller owns `lane` (as its owner, or as `shutdown_now`'s `STOPPER`), so it is the lane's
/// only popper.
pub(crate) unsafe fn lane_items<K: std::hash::Hash>(
    lane: &Lane<K>,
    held: Option<Item<K>>,
    out: &mut Vec<PendingTask<K>>,
) {
    out.extend(lane.deferrals.take_all().into_iter().map(pending));
    out.extend(held.map(pending));
    // SAFETY: the caller's contract.
    while let Some((key, task)) = unsafe { lane.pop_unhashed() } {
        out.push(PendingTask::new(Some(key), task.into_task()));
    }
}

/// A lane's item, handed back as it is (no user code: the key is moved, not cloned).
fn pending<K>(item: Item<K>) -> PendingTask<K> {
    PendingTask::new(Some(item.key), item.task.into_task())
}
