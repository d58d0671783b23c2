//! The state shared by a serializer's handle, its workers and its supervisor.

use std::hash::Hash;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_deque::Injector;
use crossbeam_utils::CachePadded;
use keyserial_core::table::Table;

use keyserial_core::lane::Mailbox;

use crate::capacity::Capacity;
use crate::claims::Claims;
use crate::deferral::Deferral;
use crate::gate::Gate;
use crate::key::{IdleItem, KeyState, Runnable};
use crate::lane_task::Item;
use crate::lanes::{AfterPush, Closed, KeyHasher, Lanes};
use crate::latest_cells::LatestCells;
use crate::nodes::Recycled;
use crate::pending::PendingTask;
use crate::permit_wait::PermitWaits;
use crate::phase::Phase;
use crate::sleep::Sleep;
use crate::slot::{Counters, Owned, Slot};
use crate::sync::{lock, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};

pub(crate) struct Config {
    pub(crate) workers: usize,
    pub(crate) max_workers: usize,
    pub(crate) worker_keep_alive: Duration,
    pub(crate) key_idle_timeout: Duration,
    pub(crate) fairness_budget: usize,
    pub(crate) thread_name: String,
}

pub(crate) struct Shared<K> {
    pub(crate) id: usize,
    pub(crate) config: Config,
    /// Entries come from the per-thread recycling caches: a key is created on the submitter and
    /// freed wherever the epoch runs its deferred frees. Keys are hashed with foldhash (hashbrown's
    /// default), randomly seeded per serializer: every submit hashes its key, and SipHash costs
    /// several times more instructions on a small key.
    pub(crate) table: Table<K, KeyState, foldhash::fast::RandomState, Recycled>,
    /// Where outside submitters and yielding chains queue runnables: any worker takes from it
    /// (see `worker/find.rs`, "Finding work").
    pub(crate) global: CachePadded<Injector<Runnable<K>>>,
    /// Where every keyed submission goes first (`lanes.rs`).
    pub(crate) lanes: Lanes<K>,
    /// Per worker slot: the deferral a thief hands the worker it took a lane from.
    pub(crate) mailboxes: Box<[CachePadded<Mailbox<Deferral<K>>>]>,
    /// `submit_distinct`'s claims (`claims.rs`).
    pub(crate) claims: std::sync::Arc<Claims<K>>,
    /// `submit_latest`'s pending tasks (`latest_cells.rs`).
    pub(crate) latest: LatestCells<K>,
    pub(crate) slots: Box<[Slot<K>]>,
    pub(crate) sleep: Sleep,
    pub(crate) gate: Gate,
    pub(crate) capacity: Option<Capacity>,
    /// `shutdown` was called (no new tasks; queued ones run).
    pub(crate) shutdown: AtomicBool,
    /// `shutdown_now` was called (nothing more runs).
    pub(crate) stop: AtomicBool,
    pub(crate) live_workers: AtomicUsize,
    /// Tasks handed back by `shutdown_now` or by workers that met the stop flag.
    pub(crate) handback: Mutex<Vec<PendingTask<K>>>,
    /// The same for items a worker held of a lane or a deferral (kept apart: per key, they come
    /// after the key's chain).
    pub(crate) handback_lanes: Mutex<Vec<PendingTask<K>>>,
    pub(crate) handed_back: AtomicU64,
    /// Tasks resolved without running outside a worker (a permit wait on a closed semaphore).
    pub(crate) dropped_outside: AtomicU64,
    pub(crate) rejected: AtomicU64,
    /// Idle items of elastic workers that exited; adopted by worker 0.
    pub(crate) orphans: Mutex<Vec<IdleItem<K>>>,
    pub(crate) threads: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) terminated: Mutex<bool>,
    pub(crate) terminated_cond: Condvar,
    /// Milliseconds (since `start`) at which every worker was first seen busy with work waiting;
    /// 0 when not starved. Drives the elastic pool.
    pub(crate) starved_since: AtomicU64,
    pub(crate) supervisor: Mutex<Option<crate::sync::Unparker>>,
    pub(crate) permit_waits: PermitWaits<K>,
    pub(crate) start: Instant,
}

/// Serializer ids (for "am I on one of this serializer's workers?"); a plain std atomic.
static NEXT_ID: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

impl<K> Shared<K> {
    /// A key's hash (the table's hasher): its lane, its deferral, its claims.
    pub(crate) fn hash_of(&self, key: &K) -> u64
    where
        K: Hash,
    {
        use std::hash::BuildHasher;
        self.table.hasher().hash_one(key)
    }

    /// Milliseconds since the serializer started (the idle and elastic clocks); never 0.
    pub(crate) fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }
}

impl<K> Shared<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: Config,
        capacity: Option<usize>,
        unparkers: Box<[crate::sync::Unparker]>,
        owned: Vec<Owned<K>>,
    ) -> Shared<K> {
        let slots: Box<[Slot<K>]> = owned
            .into_iter()
            .map(|o| Slot {
                stealer: o.deque.stealer(),
                local: Mutex::new(Some(o)),
                phase: CachePadded::new(Phase::new()),
                current: AtomicUsize::new(0),
                #[cfg(debug_assertions)]
                direct_key: AtomicUsize::new(0),
                counters: CachePadded::new(Counters::default()),
                alive: AtomicBool::new(false),
            })
            .collect();
        let gate_words = (slots.len() * 2).next_power_of_two().max(8);
        let lanes = (config.workers * 2).next_power_of_two();
        let mailboxes = (0..slots.len())
            .map(|_| CachePadded::new(Mailbox::new()))
            .collect();
        let hasher = KeyHasher::default();
        Shared {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            lanes: Lanes::new(lanes, &hasher),
            table: Table::with_hasher_and_collector(
                hasher,
                crossbeam_epoch::default_collector().clone(),
            ),
            global: CachePadded::new(Injector::new()),
            mailboxes,
            claims: Claims::new(),
            latest: LatestCells::new(),
            slots,
            sleep: Sleep::new(unparkers),
            gate: Gate::new(gate_words),
            capacity: capacity.map(Capacity::new),
            shutdown: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            live_workers: AtomicUsize::new(0),
            handback: Mutex::new(Vec::new()),
            handback_lanes: Mutex::new(Vec::new()),
            handed_back: AtomicU64::new(0),
            dropped_outside: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            orphans: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            terminated: Mutex::new(false),
            terminated_cond: Condvar::new(),
            starved_since: AtomicU64::new(0),
            supervisor: Mutex::new(None),
            permit_waits: PermitWaits::new(),
            start: Instant::now(),
            config,
        }
    }

    /// Makes `r` runnable: into the calling worker's own deque when called from one of our
    /// workers (`local`: the key's data is hot there, and idle siblings steal from it), else
    /// into the global queue; then wakes a worker if needed.
    pub(crate) fn schedule(
        &self,
        r: Runnable<K>,
        local: Option<&crossbeam_deque::Worker<Runnable<K>>>,
    ) {
        match local {
            Some(w) => w.push(r),
            None => self.global.push(r),
        }
        self.notify();
    }

    /// Pushes a keyed item onto its lane and wakes a worker if it needs one (see "Waking for
    /// a push" in `lanes.rs`).
    #[inline]
    pub(crate) fn push_keyed(
        &self,
        hash: u64,
        make: impl FnOnce() -> Item<K>,
    ) -> Result<(), Closed> {
        match self.lanes.push(hash, make, || self.sleep.idle_now())? {
            AfterPush::Nothing => {}
            AfterPush::Notify => self.notify(),
            // Queued while no worker is idle: its lane's owner may be stuck in a task.
            AfterPush::AllBusy => self.starving(),
        }
        Ok(())
    }

    /// Submissions admitted so far: those the gate counted, and every item pushed onto a lane
    /// (a keyed submission is admitted by its lane's reservation, see `serializer/admit.rs`,
    /// "Admission").
    pub(crate) fn admitted(&self) -> u64 {
        self.gate.admitted() + self.lanes.pushed()
    }

    /// Something became runnable: wake a sleeper if nobody is searching; if every worker is
    /// busy, tell the elastic pool.
    pub(crate) fn notify(&self) {
        if self.sleep.notify() {
            self.starving();
        }
    }

    /// Every worker was seen busy (none searching or asleep) while work waits: start the elastic
    /// clock and let the supervisor look (`supervisor.rs`). Cheap when the clock already runs,
    /// and a no-op without elastic slots.
    #[inline]
    pub(crate) fn starving(&self) {
        if self.config.max_workers > self.config.workers {
            self.start_starved_clock();
        }
    }

    /// `starving` with elastic slots: stamps the clock if it is not running, and wakes the
    /// supervisor.
    #[inline(never)]
    fn start_starved_clock(&self) {
        if self.starved_since.load(Ordering::Relaxed) == 0
            && self
                .starved_since
                .compare_exchange(0, self.now_ms(), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            if let Some(u) = lock(&self.supervisor).as_ref() {
                u.unpark();
            }
        }
    }

    /// Tasks admitted and not yet finished (run, dropped or handed back). Exact when quiescent.
    pub(crate) fn outstanding(&self) -> u64 {
        let (mut completed, mut dropped) = (0u64, 0u64);
        for s in self.slots.iter() {
            completed += s.counters.completed.load(Ordering::Acquire);
            dropped += s.counters.dropped.load(Ordering::Acquire);
        }
        let finished = completed
            + dropped
            + self.handed_back.load(Ordering::Acquire)
            + self.dropped_outside.load(Ordering::Acquire);
        self.admitted().saturating_sub(finished)
    }

    /// `true` if any queue visibly holds something to run (a lane's items count even behind
    /// a busy owner, who may be stuck in a task).
    pub(crate) fn has_visible_work(&self) -> bool {
        !self.global.is_empty()
            || self.slots.iter().any(|s| !s.stealer.is_empty())
            || self.lanes.queued_anywhere()
    }

    /// Marks termination once the last worker has exited after shutdown.
    pub(crate) fn worker_exited(&self) {
        let left = self.live_workers.fetch_sub(1, Ordering::AcqRel) - 1;
        if left == 0 && self.shutdown.load(Ordering::Acquire) {
            self.set_terminated();
        }
    }

    pub(crate) fn set_terminated(&self) {
        let mut t = lock(&self.terminated);
        *t = true;
        self.terminated_cond.notify_all();
        drop(t);
        if let Some(u) = lock(&self.supervisor).as_ref() {
            u.unpark();
        }
    }
}
