//! Finding work: a lane to serve, or a runnable from the ready queues.
//!
//! # Finding work
//!
//! Outside submitters (and chains yielding after their fairness budget) put a runnable on the
//! one global queue (a crossbeam `Injector`); any worker takes from it, so a ready key never
//! waits behind a particular worker's slow task. A chain made runnable from inside a task goes
//! to the running worker's local FIFO deque, where the key's data is hot: that is the only key
//! affinity, and it costs no latency because idle workers steal from every deque at once (no
//! time threshold).
//!
//! A worker looks in its deque, then takes a small batch (at most [`GLOBAL_BATCH`]) from the
//! global queue into its deque, then steals half of a sibling's deque. Every [`GLOBAL_INTERVAL`]
//! looks it starts at the global queue, so a worker fed by its own tasks cannot starve outside
//! submitters (tokio's inject-queue check). A chain moves whole, with its `ACTIVE` baton, so
//! stealing never reorders a key.
//!
//! A sibling that blocks in a task cannot run what waits in its deque, and a worker that never
//! runs dry would never steal it. So at each of those periodic checks, before the global queue,
//! a worker also reads each sibling's `started` counter (one load per sibling): a sibling that
//! started no task since the previous check, [`GLOBAL_INTERVAL`] looks ago, while its deque holds
//! work, is stuck in one task, and the worker takes a batch of that deque. The criterion is
//! progress, not time: it costs no latency when nothing blocks, and a sibling merely descheduled
//! by the OS only loses one batch it would have run a little later.
//!
//! Waking follows rayon's rule, exactly as many sleepers as there is new work (`sleep.rs`): a
//! submit wakes one sleeper only if no worker is already searching, and the last searcher to
//! find work wakes one more if work is still visible. A batch moved into a deque is visible to
//! stealers, so a worker that then blocks in a task leaves that batch to its idle siblings, and
//! when no sibling is idle the elastic pool hears of it (`Shared::starving`): the searcher that
//! finds work while more waits and nobody else is idle starts the elastic clock, whatever the
//! timing of the submits (`supervisor.rs`); loom models of that claim: `loom/tests/starvation.rs`.

use crossbeam_deque::{Steal, Worker};
use crossbeam_utils::Backoff;

use super::{Work, WorkerLoop};
use crate::key::Runnable;
use crate::shared::Shared;
use crate::sync::Ordering;

/// A worker starts its search at the global queue once every this many looks.
pub(super) const GLOBAL_INTERVAL: u32 = 31;

/// The most runnables a worker moves from the global queue into its deque at once: enough to
/// take one shared-queue transfer per several chains, few enough that a batch stuck behind a
/// task that blocks is small (and stealable).
pub(super) const GLOBAL_BATCH: usize = 4;

impl<K> WorkerLoop<'_, K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A lane to serve or a runnable, lanes and ready queues first in turn (neither starves
    /// the other).
    pub(super) fn find_work(&mut self) -> Option<Work<K>> {
        if let Some(l) = self.lane_stuck_since_last_look() {
            return Some(Work::Lane(l));
        }
        let lanes_first = self.tick.is_multiple_of(2);
        if lanes_first {
            if let Some(l) = self.acquire_lane() {
                return Some(Work::Lane(l));
            }
        }
        if let Some(r) = self.find_runnable() {
            return Some(Work::Run(r));
        }
        if !lanes_first {
            if let Some(l) = self.acquire_lane() {
                return Some(Work::Lane(l));
            }
        }
        None
    }

    /// A free lane with items, taken. If other lanes wait for a worker too, one more sleeper
    /// is woken: this worker serves one lane at a time, and a sleeper that naps would come back
    /// only after its nap (rayon's rule, the half that follows finding work).
    pub(super) fn acquire_lane(&mut self) -> Option<usize> {
        let sh = self.shared;
        let l = sh.lanes().acquire_free(self.index, self.home, self.turn)?;
        if sh.sleep().has_sleepers() && sh.lanes().free_work_except(l) {
            sh.sleep().wake_one();
        }
        Some(l)
    }

    pub(super) fn find_runnable(&mut self) -> Option<Runnable<K>> {
        self.tick = self.tick.wrapping_add(1);
        let deque = &self.owned.as_ref()?.deque;
        let global = &self.shared.global();
        let from_global =
            || steal_into(|| global.steal_batch_with_limit_and_pop(deque, GLOBAL_BATCH));
        let found = if self.tick.is_multiple_of(GLOBAL_INTERVAL) {
            from_stuck_sibling(self.shared, self.index, &mut self.seen, deque).or_else(from_global)
        } else {
            None
        };
        if found.is_none() {
            if let Some(r) = deque.pop() {
                return Some(r);
            }
        }
        let found = found.or_else(from_global).or_else(|| {
            let n = self.shared.slots().len();
            (1..n).find_map(|k| {
                let other = &self.shared.slots()[(self.index + k) % n];
                steal_into(|| other.stealer.steal_batch_and_pop(deque))
            })
        });
        if found.is_some() && !self.searching && !deque.is_empty() {
            // What we moved into our deque is more work than we can start now: let a sleeper
            // steal it (a searcher does this in `found`).
            self.shared.notify();
        }
        found
    }
}

/// A batch from the deque of a sibling that started no task since the previous periodic
/// check and has work queued (it is stuck in one task; see "Finding work").
fn from_stuck_sibling<K>(
    shared: &Shared<K>,
    index: usize,
    seen: &mut [u64],
    deque: &Worker<Runnable<K>>,
) -> Option<Runnable<K>> {
    let mut found = None;
    for (i, other) in shared.slots().iter().enumerate() {
        let started = other.counters.started.load(Ordering::Relaxed);
        let stuck = started == std::mem::replace(&mut seen[i], started)
            && i != index
            && found.is_none()
            && !other.stealer.is_empty();
        if stuck {
            found = steal_into(|| other.stealer.steal_batch_and_pop(deque));
        }
    }
    found
}

pub(crate) fn steal_into<T>(mut f: impl FnMut() -> Steal<T>) -> Option<T> {
    let backoff = Backoff::new();
    loop {
        match f() {
            Steal::Success(r) => return Some(r),
            Steal::Empty => return None,
            Steal::Retry => backoff.spin(),
        }
    }
}
