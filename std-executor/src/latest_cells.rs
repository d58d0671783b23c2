//! `submit_latest` at submission: each key's pending latest task sits in a *cell* that a later
//! `submit_latest` of the key may still replace, so a key whose tasks wait (behind its own
//! blocked task, or behind a busy lane) holds at most one pending latest task, and a superseded
//! closure, its handle and its capacity slot are released at once.
//!
//! # Protocol
//!
//! Sharded maps `key hash -> [(key, cell)]` under mutexes; a cell is `Mutex<Option<task>>`, and
//! its lane item is a node of kind `LatestCell` that owns one reference to it.
//!
//! - **offer** (`submit_latest`), under the key's shard lock: if the key has a cell whose task
//!   has not been taken, swap the new task in; the old one is superseded. Otherwise make a new
//!   cell, enter it in the map, and push its lane item **before unlocking**, so that every
//!   submission that finds the cell finds it already in the lane.
//! - **seal** (every other keyed submission of the key, *after* its own push): remove the key's
//!   cell from the map, so no later latest task replaces a task that now has a successor. A
//!   submission that returned before a replacement started has sealed by then, so a replacement
//!   never overtakes a returned submission; one racing it has no order to keep. Sealing goes by
//!   hash (the submitter's key has moved into the lane by then): keys sharing a 64-bit hash are
//!   sealed together, which only means a latest task that could have been replaced runs. The
//!   count of cells is read after the push: an offer's push came before ours in the lane's order
//!   (the queue's tail is an RMW), so its count increment, made before that push, is seen.
//! - **take** (the lane's router, when it pops the item), under the shard lock: remove the cell
//!   from the map if it is still there, and take its task, which is then routed like any other
//!   (kind `Latest`, so a chain still coalesces two in a row). A taken cell is empty, and an
//!   empty cell is never replaced into (offer makes a new one).
//!
//! Everything happens under one lock per key, so a task is replaced, taken or run exactly once.
//!
//! One imprecision, on the safe side: a plain submission that races the *creation* of its key's
//! cell (its push comes first, the cell's push second, its seal third) seals that newer cell, so
//! the next latest task queues behind it instead of replacing it: one superseded task runs. No
//! task is lost, reordered or replaced wrongly.
//! `seal` costs one load while no cell exists anywhere. A cell's item handed back by
//! `shutdown_now` runs (or cancels) the task it holds.

use std::collections::HashMap;
use std::hash::Hash;

use crossbeam_utils::CachePadded;

use crate::semaphore::Permit;
use crate::sync::{lock, Arc, AtomicUsize, Mutex, Ordering};
use crate::task::{Abandon, Job, Kind, TaskRef};

const SHARDS: usize = 64;

type Cell = Arc<Mutex<Option<TaskRef>>>;

/// One shard: key hash -> the cells of the keys with that hash.
type Shard<K> = Mutex<HashMap<u64, Vec<(K, Cell)>>>;

/// The job of a cell's lane item: runs (or abandons) whatever task the cell holds then.
struct CellJob(Cell);

impl Job for CellJob {
    fn run(self, permit: Option<Permit>, done: &dyn Fn(bool)) -> bool {
        let task = lock(&self.0).take();
        match task {
            Some(t) => t.run(permit, done),
            None => {
                done(false);
                false
            }
        }
    }

    fn abandon(self, why: Abandon) {
        let task = lock(&self.0).take();
        if let Some(t) = task {
            t.abandon(why);
        }
    }

    fn fail(self, payload: crate::user::Payload) {
        let task = lock(&self.0).take();
        match task {
            Some(t) => t.fail(payload),
            None => crate::user::drop_payload(payload),
        }
    }
}

/// What [`LatestCells::offer`] did.
pub(crate) enum Offered {
    /// The key's pending latest task was replaced; here it is, to be abandoned as superseded.
    Replaced(TaskRef),
    /// A new cell holds the task, and its item is in the lane.
    Pushed,
}

pub(crate) struct LatestCells<K> {
    shards: Box<[CachePadded<Shard<K>>]>,
    /// Cells in the maps (so `seal` can skip the lock while there are none).
    len: AtomicUsize,
}

impl<K: Hash + Eq + Clone> LatestCells<K> {
    pub(crate) fn new() -> Self {
        LatestCells {
            shards: (0..SHARDS)
                .map(|_| CachePadded::new(Mutex::new(HashMap::new())))
                .collect(),
            len: AtomicUsize::new(0),
        }
    }

    fn shard(&self, hash: u64) -> &Shard<K> {
        &self.shards[(hash >> 20) as usize % SHARDS]
    }

    /// `submit_latest`: replaces the key's pending latest task with `task`, or puts `task` in a
    /// new cell whose item `push` puts into the key's lane (under the lock).
    ///
    /// The key's `Eq` runs under the shard's lock (the look-up and the replacement must be one
    /// step), once per key of the same hash, before anything changes: a panic in it leaves the
    /// map as it was (`task` is then dropped unrun). `key` is the caller's own clone, moved in
    /// (no `Clone` under the lock), and `push` runs no user code.
    pub(crate) fn offer(
        &self,
        key: K,
        hash: u64,
        task: TaskRef,
        push: impl FnOnce(TaskRef),
    ) -> Offered {
        let mut map = lock(self.shard(hash));
        let found = map
            .get(&hash)
            .and_then(|bucket| bucket.iter().position(|(k, _)| *k == key));
        let bucket = map.entry(hash).or_default();
        let mut task = Some(task);
        let replaced = found.and_then(|i| {
            let mut slot = lock(&bucket[i].1);
            let old = slot.as_mut()?;
            Some(std::mem::replace(old, task.take().expect("offered once")))
        });
        let unused_key = match (replaced.is_some(), found) {
            (true, _) => Some(key),
            (false, Some(i)) => {
                bucket[i].1 = Arc::new(Mutex::new(task.take()));
                push(TaskRef::new(
                    CellJob(bucket[i].1.clone()),
                    Kind::LatestCell,
                    None,
                ));
                Some(key)
            }
            (false, None) => {
                let cell: Cell = Arc::new(Mutex::new(task.take()));
                bucket.push((key, cell.clone()));
                self.len.fetch_add(1, Ordering::SeqCst);
                push(TaskRef::new(CellJob(cell), Kind::LatestCell, None));
                None
            }
        };
        drop(map);
        // A key not kept in the map: its `Drop` is the user's, outside the lock.
        crate::user::drop_quietly(unused_key);
        match replaced {
            Some(old) => Offered::Replaced(old),
            None => Offered::Pushed,
        }
    }

    /// Any other keyed submission of `key`, after its push: no later latest task may replace the
    /// key's pending one.
    #[inline]
    pub(crate) fn seal(&self, hash: u64) {
        if self.len.load(Ordering::SeqCst) != 0 {
            self.seal_pending(hash);
        }
    }

    /// `seal` while some latest task is pending (out of line: a serializer that never takes
    /// a latest task pays only `seal`'s load per submission).
    #[cold]
    #[inline(never)]
    fn seal_pending(&self, hash: u64) {
        if let Some(bucket) = lock(self.shard(hash)).remove(&hash) {
            self.len.fetch_sub(bucket.len(), Ordering::SeqCst);
        }
    }

    /// The router, for a popped cell item: the task to route now (`None` if there is none).
    pub(crate) fn take(&self, hash: u64, item: TaskRef) -> Option<TaskRef> {
        // SAFETY: items of kind `LatestCell` are made only by `offer`, from a `CellJob`.
        let CellJob(cell) = unsafe { item.into_job::<CellJob>() };
        let mut map = lock(self.shard(hash));
        if let Some(bucket) = map.get_mut(&hash) {
            if let Some(i) = bucket.iter().position(|(_, c)| Arc::ptr_eq(c, &cell)) {
                bucket.swap_remove(i);
                self.len.fetch_sub(1, Ordering::SeqCst);
            }
            if bucket.is_empty() {
                map.remove(&hash);
            }
        }
        let task = lock(&cell).take();
        task
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::task::Detached;

    fn task() -> TaskRef {
        TaskRef::new(Detached(|| ()), Kind::Latest, None)
    }

    #[test]
    fn an_offer_replaces_until_sealed_or_taken() {
        let cells: LatestCells<u32> = LatestCells::new();
        let mut lane = Vec::new();
        assert!(matches!(
            cells.offer(1, 7, task(), |i| lane.push(i)),
            Offered::Pushed
        ));
        assert!(matches!(
            cells.offer(1, 7, task(), |i| lane.push(i)),
            Offered::Replaced(_)
        ));
        assert_eq!(lane.len(), 1, "a replacement pushes nothing");
        cells.seal(7);
        assert!(matches!(
            cells.offer(1, 7, task(), |i| lane.push(i)),
            Offered::Pushed
        ));
        assert_eq!(lane.len(), 2);
        let second = lane.pop().unwrap();
        assert!(cells.take(7, second).is_some());
        assert!(matches!(
            cells.offer(1, 7, task(), |i| lane.push(i)),
            Offered::Pushed
        ));
        // The first cell was sealed, not taken: its task is still there.
        let first = lane.remove(0);
        assert!(cells.take(7, first).is_some());
    }
}
