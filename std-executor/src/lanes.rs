//! Lanes: the front door of every keyed submission.
//!
//! Keys hash onto a fixed number of *lanes* (twice the core workers, a power of two); each lane
//! is a FIFO of [`Item`]s (key, hash, task) in submission order. A lane is not tied to a thread:
//! any worker may *own* it, and only its owner pops it, under core's lane word
//! ([`keyserial_core::lane`], whose module docs give the ownership protocol and the steal). A
//! plain task of a key that holds no state runs straight from the lane: no key table, no chain,
//! no per-key allocation, and the worker reads tasks in the order they were written, several to
//! a cache line. Keys that need state (a `submit_latest` slot, a permit wait, a task queued
//! behind one) are *tracked*: the owner routes their items onto the key's chain, in lane order
//! (`route.rs`). A key whose task blocks is *deferred* when an idle worker takes the lane over
//! (`deferral.rs`): only that key waits.
//!
//! # Waking for a push (no lost wakeup)
//!
//! A submitter pushes its item, issues a `SeqCst` fence, then reads the lane's phase:
//!
//! - `FREE`: nobody will pop the lane unless a worker comes: it notifies the sleep word (one
//!   wakeup if nobody searches; `sleep.rs`).
//! - `OWNED` / `RUNNING`: the owner pops the item after its current task. An owner that finds the
//!   lane empty releases it (`FREE`, a Release store), issues a `SeqCst` fence and looks at the
//!   queue once more, re-acquiring it if it is not empty. The two fences order the push before the
//!   owner's second look, or the release before the submitter's read of the phase: either the
//!   owner sees the item or the submitter sees `FREE` and notifies.
//! - An owner may stay inside one task for long. Idle workers notice that by *watching* lanes in
//!   `RUNNING` with a backlog: a sleeper whose last look found any lane with queued items parks
//!   only for [`POLL`] and looks again; one that found every lane empty registers as a *deep*
//!   sleeper first (`deep += 1`, `SeqCst`), then looks at the lanes once more. A submitter that
//!   sees `OWNED`/`RUNNING` notifies if `deep > 0`: by the same fence pairing, either it sees the
//!   deep sleeper or the sleeper sees its item and only naps.
//!
//! With the elastic pool, a push behind an owner while no worker is idle also stamps the
//! starvation clock (`Shared::starving`), as a ready chain does.
//!
//! # Per-key order
//!
//! A key's items leave its one lane in push order, popped by one owner at a time (ownership
//! passes by Release/Acquire on the lane word). Each is then run directly by the owner, or pushed
//! onto the key's chain, or onto the key's deferral, and each of those runs its items in push
//! order, by one runner at a time; `route.rs` shows that a key is never in two of those places
//! with items at once.

use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;
use keyserial_core::lane::{Lane as LaneWord, Phase, Watch};

use crate::deferral::Deferrals;
use crate::lane_task::LaneTask;
use crate::sync::{fence, Arc, AtomicBool, AtomicUsize, Ordering};

/// How long a sleeper naps while some lane has items queued behind a busy owner (it must
/// notice an owner stuck in one task).
pub(crate) const POLL: std::time::Duration = std::time::Duration::from_micros(100);

/// How long a lane's word must stand still in `RUNNING`, with items waiting behind it, before
/// an idle worker takes the lane over: long against a streaming owner's task (which moves the
/// word at every task), short against a blocked one.
pub(crate) const STEAL_AFTER: std::time::Duration = std::time::Duration::from_micros(20);

/// The worker id `shutdown_now` uses to take lanes (never a real worker's).
pub(crate) const STOPPER: usize = keyserial_core::lane::MAX_WORKER;

/// One keyed submission in a lane: the key, its hash (the table's hasher) and its task; 24
/// bytes for a `u64` key, so the queue's 32-byte slots sit two to a cache line.
pub(crate) struct Item<K> {
    pub(crate) key: K,
    pub(crate) hash: u64,
    pub(crate) task: LaneTask,
}

/// One lane: its ownership word, its FIFO and the keys deferred from it.
pub(crate) struct Lane<K> {
    pub(crate) word: CachePadded<LaneWord>,
    pub(crate) queue: SegQueue<Item<K>>,
    /// Keys whose items go to a deferral (only the lane's owner touches it).
    pub(crate) deferrals: Deferrals<K>,
}

impl<K> Lane<K> {
    /// The owner `me` found the lane empty: releases it, then looks once more (see "Waking for
    /// a push"); `true` if an item came meanwhile and `me` owns the lane again.
    pub(crate) fn release_or_keep(&self, me: usize) -> bool {
        self.word.release(me);
        fence(Ordering::SeqCst);
        !self.queue.is_empty() && self.word.try_acquire(me)
    }
}

/// Live key-table entries per lane: a lane whose count is 0 has no tracked key, and its owner
/// runs plain items without looking at the table. Raised when a key's state is made, lowered
/// when it is freed (`KeyState`'s drop), so it never reads 0 while a key of the lane is tracked.
pub(crate) struct Tracked {
    counts: Box<[CachePadded<AtomicUsize>]>,
}

impl Tracked {
    fn new(lanes: usize) -> Tracked {
        Tracked {
            counts: (0..lanes)
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
        }
    }

    pub(crate) fn raise(&self, lane: usize) {
        self.counts[lane].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn lower(&self, lane: usize) {
        self.counts[lane].fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether lane `lane` may have a tracked key. The count is raised by the router (or a
    /// deferral's runner, see `route.rs`) before it makes the key's state, and either that is
    /// this thread or its raise happened before this read (lane ownership or a deferral's lock
    /// passes from one to the other): never a stale 0 while a key of the lane is tracked.
    pub(crate) fn any(&self, lane: usize) -> bool {
        self.counts[lane].load(Ordering::Relaxed) != 0
    }
}

/// A key's claim on its lane's tracked count: made with the key's state, dropped with it.
pub(crate) struct TrackToken {
    tracked: Arc<Tracked>,
    lane: usize,
}

impl TrackToken {
    pub(crate) fn new(tracked: &Arc<Tracked>, lane: usize) -> TrackToken {
        tracked.raise(lane);
        TrackToken {
            tracked: tracked.clone(),
            lane,
        }
    }
}

impl Drop for TrackToken {
    fn drop(&mut self) {
        self.tracked.lower(self.lane);
    }
}

/// The lanes of one serializer.
pub(crate) struct Lanes<K> {
    lanes: Box<[Lane<K>]>,
    mask: usize,
    pub(crate) tracked: Arc<Tracked>,
    /// Sleepers parked until woken (no lane had items when they looked); see the module docs.
    pub(crate) deep: CachePadded<AtomicUsize>,
    /// `shutdown_now` has taken every lane for good.
    pub(crate) stopped: AtomicBool,
}

impl<K> Lanes<K> {
    /// `n` lanes (a power of two).
    pub(crate) fn new(n: usize) -> Lanes<K> {
        assert!(n.is_power_of_two(), "a power of two lanes");
        Lanes {
            lanes: (0..n)
                .map(|_| Lane {
                    word: CachePadded::new(LaneWord::new()),
                    queue: SegQueue::new(),
                    deferrals: Deferrals::new(),
                })
                .collect(),
            mask: n - 1,
            tracked: Arc::new(Tracked::new(n)),
            deep: CachePadded::new(AtomicUsize::new(0)),
            stopped: AtomicBool::new(false),
        }
    }

    /// How many lanes there are.
    pub(crate) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// The lane of a key hash.
    pub(crate) fn index_of(&self, hash: u64) -> usize {
        // The high bits: the table's trie indexes with the low ones.
        (hash >> 40) as usize & self.mask
    }

    pub(crate) fn get(&self, l: usize) -> &Lane<K> {
        &self.lanes[l]
    }

    /// Pushes `item` onto its lane; returns the lane's phase after the push (see "Waking for a
    /// push" in the module docs).
    pub(crate) fn push(&self, item: Item<K>) -> Phase {
        let lane = &self.lanes[self.index_of(item.hash)];
        lane.queue.push(item);
        fence(Ordering::SeqCst);
        lane.word.phase()
    }

    /// A lane that is `FREE` with items queued, taken by worker `me`: its home lanes first
    /// (`home = (mine, of)`: lanes `l` with `l % of == mine`), starting with the one after
    /// the home lane it served last (`turn`), then the others. (A worker whose home lanes never
    /// run dry leaves the others to their home workers; a lane left waiting that way is taken by
    /// `WorkerLoop::lane_stuck_since_last_look`.)
    pub(crate) fn acquire_free(
        &self,
        me: usize,
        home: Option<(usize, usize)>,
        turn: usize,
    ) -> Option<usize> {
        let n = self.lanes.len();
        if let Some((mine, of)) = home.filter(|&(mine, _)| mine < n) {
            let count = (n - mine).div_ceil(of);
            if let Some(l) = (0..count)
                .map(|i| mine + ((turn + i) % count) * of)
                .find(|&l| self.try_take(l, me))
            {
                return Some(l);
            }
        }
        (0..n).find(|&l| self.try_take(l, me))
    }

    /// Takes lane `l` for `me` if it is `FREE` with items queued.
    pub(crate) fn try_take(&self, l: usize, me: usize) -> bool {
        let lane = &self.lanes[l];
        lane.word.phase() == Phase::Free && !lane.queue.is_empty() && lane.word.try_acquire(me)
    }

    /// Whether any lane has items queued (perhaps behind an owner that may get stuck).
    pub(crate) fn queued_anywhere(&self) -> bool {
        self.lanes.iter().any(|l| !l.queue.is_empty())
    }

    /// Lanes whose owner is inside a task with items waiting behind it, as seen now.
    pub(crate) fn watch_busy(&self) -> Vec<(usize, Watch)> {
        self.lanes
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.queue.is_empty())
            .filter_map(|(i, l)| l.word.watch().map(|w| (i, w)))
            .collect()
    }
}
