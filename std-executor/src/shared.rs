//! The state shared by a serializer's handle, its workers and its supervisor.

use std::collections::hash_map::RandomState;
use std::hash::Hash;
use std::ptr::NonNull;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_deque::{Injector, Stealer};
use crossbeam_utils::CachePadded;
use keyserial_core::chain::Chain;
use keyserial_core::table::{Entry, Retire, Table};

use crate::capacity::Capacity;
use crate::gate::Gate;
use crate::idle::IdleWord;
use crate::latest::LatestSlot;
use crate::nodes::Recycled;
use crate::phase::Phase;
use crate::sleep::Sleep;
use crate::sync::{lock, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};
use crate::task::{Header, TaskRef};
use crate::PendingTask;

/// Per-key state: the key's chain plus what the executor keeps per key.
pub(crate) struct KeyState {
    pub(crate) chain: Chain<Header>,
    /// A `submit_distinct` task of this key is queued and not started.
    pub(crate) distinct: AtomicBool,
    /// Idle bookkeeping (see `idle.rs`).
    pub(crate) idle: IdleWord,
    /// The `submit_latest` coalescing slot (see `latest.rs`).
    pub(crate) latest: LatestSlot<Header>,
}

impl KeyState {
    pub(crate) fn new() -> KeyState {
        KeyState {
            chain: Chain::new(),
            distinct: AtomicBool::new(false),
            idle: IdleWord::new(),
            latest: LatestSlot::new(Header::marker()),
        }
    }

    /// Turns a node popped from this key's chain into the task to run: the slot's task if the
    /// node is the latest-slot marker (`None` if it stood for nothing), else the node itself.
    ///
    /// # Safety
    /// The caller owns the chain and just popped `node` from it.
    pub(crate) unsafe fn popped(&self, node: NonNull<Header>) -> Option<TaskRef> {
        let node = self.latest.popped(node)?;
        // SAFETY: popping (or taking from the slot) made the caller the node's unique owner.
        Some(unsafe { TaskRef::from_raw(node) })
    }
}

impl Drop for KeyState {
    fn drop(&mut self) {
        if let Some(task) = self.latest.take_mut() {
            // SAFETY: a task in the slot is owned by the slot, and we are its last user.
            unsafe { TaskRef::from_raw(task) }.abandon(crate::task::Abandon::Cancelled);
        }
    }
}

impl Retire for KeyState {
    fn is_retired(&self) -> bool {
        self.chain.is_retired()
    }
}

pub(crate) type KeyEntry<K> = Entry<K, KeyState>;

/// Something a worker can run: a key's chain (owned through its `ACTIVE` baton) or an unkeyed
/// task.
pub(crate) enum Runnable<K> {
    Chain(NonNull<KeyEntry<K>>),
    Task(TaskRef),
}

// SAFETY: a `Runnable::Chain` carries the chain's ACTIVE baton between threads; the entry is
// Sync (K: Sync) and stays allocated while the baton is held (an active chain is never retired).
unsafe impl<K: Send + Sync> Send for Runnable<K> {}

/// Counters a worker slot writes (single writer at a time) and anyone reads.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) started: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) panicked: AtomicU64,
    /// Tasks that left without running: superseded, or cancelled (closed semaphore).
    pub(crate) dropped: AtomicU64,
}

impl Counters {
    /// Single-writer increment: a load and a store, no RMW on the hot path.
    pub(crate) fn bump(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Release);
    }
}

/// One worker slot: the stealing end of its local queue, its phase and its counters. Slots
/// `0..workers` are the core workers; the rest are for elastic extras.
pub(crate) struct Slot<K> {
    pub(crate) stealer: Stealer<Runnable<K>>,
    /// The slot's local deque while no thread owns the slot.
    pub(crate) local: Mutex<Option<crate::worker::Owned<K>>>,
    pub(crate) phase: CachePadded<Phase>,
    /// The entry whose chain the slot's worker is running (valid while `RUNNING`).
    pub(crate) current: AtomicUsize,
    pub(crate) counters: CachePadded<Counters>,
    /// A thread currently owns this slot.
    pub(crate) alive: AtomicBool,
}

pub(crate) struct Config {
    pub(crate) workers: usize,
    pub(crate) max_workers: usize,
    pub(crate) worker_keep_alive: Duration,
    pub(crate) key_idle_timeout: Duration,
    pub(crate) fairness_budget: usize,
    pub(crate) thread_name: String,
}

/// An idle chain waiting for its timeout (see `idle.rs`).
pub(crate) struct IdleItem<K> {
    pub(crate) entry: NonNull<KeyEntry<K>>,
    pub(crate) deadline: u64,
}

// SAFETY: the entry stays allocated while it is in an idle queue (only the queue's owner may
// retire it), and entries are Sync.
unsafe impl<K: Send + Sync> Send for IdleItem<K> {}

pub(crate) struct Shared<K> {
    pub(crate) id: usize,
    pub(crate) config: Config,
    /// Entries come from the per-thread recycling caches: a key is created on the submitter and
    /// freed wherever the epoch runs its deferred frees.
    pub(crate) table: Table<K, KeyState, RandomState, Recycled>,
    /// Where outside submitters and yielding chains queue runnables: any worker takes from it
    /// (see `worker.rs`, "Finding work").
    pub(crate) global: CachePadded<Injector<Runnable<K>>>,
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
    pub(crate) permit_waits: crate::permits::PermitWaits<K>,
    pub(crate) start: Instant,
}

/// Serializer ids (for "am I on one of this serializer's workers?"); a plain std atomic.
static NEXT_ID: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

impl<K> Shared<K> {
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
        owned: Vec<crate::worker::Owned<K>>,
    ) -> Shared<K> {
        let slots: Box<[Slot<K>]> = owned
            .into_iter()
            .map(|o| Slot {
                stealer: o.deque.stealer(),
                local: Mutex::new(Some(o)),
                phase: CachePadded::new(Phase::new()),
                current: AtomicUsize::new(0),
                counters: CachePadded::new(Counters::default()),
                alive: AtomicBool::new(false),
            })
            .collect();
        let gate_words = (slots.len() * 2).next_power_of_two().max(8);
        Shared {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            table: Table::with_hasher_and_collector(
                RandomState::new(),
                crossbeam_epoch::default_collector().clone(),
            ),
            global: CachePadded::new(Injector::new()),
            slots,
            sleep: Sleep::new(unparkers),
            gate: Gate::new(gate_words),
            capacity: capacity.map(Capacity::new),
            shutdown: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            live_workers: AtomicUsize::new(0),
            handback: Mutex::new(Vec::new()),
            handed_back: AtomicU64::new(0),
            dropped_outside: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            orphans: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            terminated: Mutex::new(false),
            terminated_cond: Condvar::new(),
            starved_since: AtomicU64::new(0),
            supervisor: Mutex::new(None),
            permit_waits: crate::permits::PermitWaits::new(),
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
    pub(crate) fn starving(&self) {
        if self.config.max_workers > self.config.workers
            && self.starved_since.load(Ordering::Relaxed) == 0
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
        self.gate.admitted().saturating_sub(finished)
    }

    /// `true` if any queue visibly holds something runnable.
    pub(crate) fn has_visible_work(&self) -> bool {
        !self.global.is_empty() || self.slots.iter().any(|s| !s.stealer.is_empty())
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
