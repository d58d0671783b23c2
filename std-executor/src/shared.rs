//! The state shared by a serializer's handle, its workers and its supervisor.

use std::hash::Hash;
use std::time::Duration;

use crossbeam_deque::Injector;
use crossbeam_utils::CachePadded;
use keyserial_core::table::Table;

use keyserial_core::lane::Mailbox;

use crate::capacity::Capacity;
use crate::claims::Claims;
use crate::deferral::Deferral;
use crate::gate::Gate;
use crate::key::{KeyState, Runnable};
use crate::lane_task::Item;
use crate::lanes::{AfterPush, Closed, KeyHasher, Lanes};
use crate::latest_cells::LatestCells;
use crate::lifecycle::Lifecycle;
use crate::nodes::Recycled;
use crate::permit_wait::PermitWaits;
use crate::phase::Phase;
use crate::sleep::Sleep;
use crate::slot::{Counters, Owned, Slot};
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering};

pub(crate) struct Config {
    pub(crate) workers: usize,
    pub(crate) max_workers: usize,
    pub(crate) worker_keep_alive: Duration,
    pub(crate) key_idle_timeout: Duration,
    pub(crate) fairness_budget: usize,
    pub(crate) thread_name: String,
    pub(crate) panic_policy: crate::PanicPolicy,
    /// `Builder::max_keys` (`key_budget.rs`).
    pub(crate) max_keys: Option<usize>,
    #[cfg(feature = "tokio")]
    pub(crate) tokio: Option<tokio::runtime::Handle>,
}

impl Config {
    /// Enters the tokio runtime's context for a future's poll, if one was given (the guard
    /// leaves it); nothing without the `tokio` feature.
    #[cfg(feature = "tokio")]
    pub(crate) fn enter_runtime(&self) -> Option<tokio::runtime::EnterGuard<'_>> {
        self.tokio.as_ref().map(|h| h.enter())
    }

    /// Enters the tokio runtime's context for a future's poll, if one was given (the guard
    /// leaves it); nothing without the `tokio` feature.
    #[cfg(not(feature = "tokio"))]
    #[inline(always)]
    pub(crate) fn enter_runtime(&self) {}
}

/// Everything a serializer's handle, its workers and its supervisor share. Every field is private:
/// the hot routing state (lanes, ready queues, slots, sleep, key table) is reached through
/// accessors named for what it is, the lifecycle through [`Lifecycle`]'s transitions, and the
/// counts kept outside the worker slots through the `count_*` methods, summed with the slots'
/// in one place ([`Shared::tally`]).
pub(crate) struct Shared<K> {
    id: usize,
    config: Config,
    /// Entries come from the per-thread recycling caches: a key is created on the submitter and
    /// freed wherever the epoch runs its deferred frees. Keys are hashed with foldhash (hashbrown's
    /// default), randomly seeded per serializer: every submit hashes its key, and SipHash costs
    /// several times more instructions on a small key.
    table: Table<K, KeyState, foldhash::fast::RandomState, Recycled>,
    /// Where chains that yield after their fairness budget and unkeyed tasks from outside the
    /// workers queue: any worker takes from it (see `worker/find.rs`, "Finding work").
    global: CachePadded<Injector<Runnable<K>>>,
    /// Where every keyed submission goes first (`lanes.rs`).
    lanes: Lanes<K>,
    /// Per worker slot: the deferral a thief hands the worker it took a lane from.
    mailboxes: Box<[CachePadded<Mailbox<Deferral<K>>>]>,
    /// `submit_distinct`'s claims (`claims.rs`).
    claims: std::sync::Arc<Claims<K>>,
    /// `submit_latest`'s pending tasks (`latest_cells.rs`).
    latest: LatestCells<K>,
    slots: Box<[Slot<K>]>,
    sleep: Sleep,
    gate: Gate,
    capacity: Option<Capacity>,
    lifecycle: Lifecycle<K>,
    outside: Outside,
    /// Milliseconds (since `start`) at which every worker was first seen busy with work waiting;
    /// 0 when not starved. Drives the elastic pool.
    starved_since: AtomicU64,
    permit_waits: PermitWaits<K>,
    /// Chain batons held outside the workers (`baton.rs`).
    outside_holds: crate::baton::OutsideHolds<K>,
    /// With `max_keys`: the key budget, and the one FIFO of idle keys that workers and
    /// submitters share (`key_budget.rs`).
    budget: Option<crate::sync::Arc<crate::key_budget::KeyBudget>>,
    shared_idle: Option<Mutex<std::collections::VecDeque<crate::key::IdleItem<K>>>>,
    /// How spans and events write a key (feature `tracing`; nothing without it).
    labeler: crate::trace::Labeler<K>,
    /// `key_state` and `on_key_release` (`state.rs`).
    state: crate::state::StateHooks<K>,
}

/// Counts kept outside the worker slots (by submitters and `shutdown_now`).
#[derive(Default)]
struct Outside {
    /// Tasks handed back by `shutdown_now`.
    handed_back: AtomicU64,
    /// Started futures that `shutdown_now` cancelled outside a worker (they ended).
    completed: AtomicU64,
    /// Tasks resolved without running outside a worker (a superseded latest task, a permit
    /// wait on a closed semaphore, a task whose key's `Clone` panicked while handed back).
    dropped: AtomicU64,
    rejected: AtomicU64,
}

/// Every count of a serializer's tasks, summed once ([`Shared::tally`]).
pub(crate) struct Tally {
    pub(crate) admitted: u64,
    pub(crate) started: u64,
    pub(crate) completed: u64,
    pub(crate) panicked: u64,
    /// Left without running, on a worker or outside one.
    pub(crate) dropped: u64,
    pub(crate) handed_back: u64,
    pub(crate) rejected: u64,
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
        self.lanes.now_ms()
    }

    /// The serializer's id (which serializer a worker thread belongs to).
    #[inline]
    pub(crate) fn id(&self) -> usize {
        self.id
    }

    /// The settings it was built with.
    #[inline]
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The key table: the keys that hold state (a chain).
    #[inline]
    pub(crate) fn table(&self) -> &Table<K, KeyState, foldhash::fast::RandomState, Recycled> {
        &self.table
    }

    /// Registers the calling thread with the key table's epoch collector (a worker does this
    /// once, at its start).
    pub(crate) fn register_epoch(&self) -> crossbeam_epoch::LocalHandle {
        self.table.register()
    }

    /// A guard of the key table's collector for a thread that is not a worker (`shutdown_now`):
    /// registers the thread for as long as the guard lives.
    pub(crate) fn pin(&self) -> crossbeam_epoch::Guard {
        self.table.register().pin()
    }

    /// The global ready queue.
    #[inline]
    pub(crate) fn global(&self) -> &Injector<Runnable<K>> {
        &self.global
    }

    /// The lanes every keyed submission enters by.
    #[inline]
    pub(crate) fn lanes(&self) -> &Lanes<K> {
        &self.lanes
    }

    /// Worker slot `i`'s mailbox for the deferral a lane's thief hands it (`None`: no such
    /// slot, as for `shutdown_now`'s own id).
    #[inline]
    pub(crate) fn mailbox(&self, i: usize) -> Option<&Mailbox<Deferral<K>>> {
        self.mailboxes.get(i).map(|m| &**m)
    }

    /// `submit_distinct`'s claims.
    #[inline]
    pub(crate) fn claims(&self) -> &std::sync::Arc<Claims<K>> {
        &self.claims
    }

    /// `submit_latest`'s pending tasks.
    #[inline]
    pub(crate) fn latest(&self) -> &LatestCells<K> {
        &self.latest
    }

    /// The worker slots (core workers first, then elastic ones).
    #[inline]
    pub(crate) fn slots(&self) -> &[Slot<K>] {
        &self.slots
    }

    /// Who searches and who sleeps.
    #[inline]
    pub(crate) fn sleep(&self) -> &Sleep {
        &self.sleep
    }

    /// The admission gate of unkeyed and latest submissions.
    #[inline]
    pub(crate) fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The bound on queued tasks, if any.
    #[inline]
    pub(crate) fn capacity(&self) -> Option<&Capacity> {
        self.capacity.as_ref()
    }

    /// Gives a queued task's capacity slot back (it started, or left without running).
    #[inline]
    pub(crate) fn release_slot(&self) {
        if let Some(c) = &self.capacity {
            c.release();
        }
    }

    /// Running, shut down, stopped, terminated; threads and hand-backs.
    #[inline]
    pub(crate) fn lifecycle(&self) -> &Lifecycle<K> {
        &self.lifecycle
    }

    /// The elastic pool's clock: when every worker was first seen busy with work waiting.
    pub(crate) fn starved_since(&self) -> &AtomicU64 {
        &self.starved_since
    }

    /// Chain batons held outside the workers (`baton.rs`).
    pub(crate) fn outside_holds(&self) -> &crate::baton::OutsideHolds<K> {
        &self.outside_holds
    }

    /// The registry of parked chains (`permit_wait.rs`).
    pub(crate) fn permit_waits(&self) -> &PermitWaits<K> {
        &self.permit_waits
    }

    /// A submission was refused.
    /// The key budget, with `max_keys` (`key_budget.rs`).
    #[inline]
    pub(crate) fn budget(&self) -> Option<&crate::sync::Arc<crate::key_budget::KeyBudget>> {
        self.budget.as_ref()
    }

    /// `key_state` and `on_key_release` (`state.rs`).
    #[inline]
    pub(crate) fn state_hooks(&self) -> &crate::state::StateHooks<K> {
        &self.state
    }

    /// How spans and events write a key (`trace.rs`).
    #[inline]
    pub(crate) fn labeler(&self) -> &crate::trace::Labeler<K> {
        &self.labeler
    }

    /// The idle keys' shared FIFO, with `max_keys` (`idle.rs`).
    #[inline]
    pub(crate) fn shared_idle(
        &self,
    ) -> Option<&Mutex<std::collections::VecDeque<crate::key::IdleItem<K>>>> {
        self.shared_idle.as_ref()
    }

    pub(crate) fn count_rejected(&self) {
        self.outside.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// `n` tasks were resolved without running, outside a worker.
    pub(crate) fn count_dropped_outside(&self, n: u64) {
        self.outside.dropped.fetch_add(n, Ordering::AcqRel);
    }

    /// A started task ended outside a worker (a pending future cancelled by `shutdown_now`).
    pub(crate) fn count_completed_outside(&self) {
        self.outside.completed.fetch_add(1, Ordering::AcqRel);
    }

    /// `shutdown_now` handed `n` tasks back.
    pub(crate) fn count_handed_back(&self, n: u64) {
        self.outside.handed_back.fetch_add(n, Ordering::AcqRel);
    }

    /// Every count, summed over the slots and the outside counters: the one place that knows
    /// how (for `stats` and `outstanding`).
    pub(crate) fn tally(&self) -> Tally {
        let mut t = Tally {
            admitted: self.gate.admitted() + self.lanes.pushed(),
            started: 0,
            completed: self.outside.completed.load(Ordering::Acquire),
            panicked: 0,
            dropped: self.outside.dropped.load(Ordering::Acquire),
            handed_back: self.outside.handed_back.load(Ordering::Acquire),
            rejected: self.outside.rejected.load(Ordering::Relaxed),
        };
        for s in self.slots.iter() {
            t.started += s.counters.started.load(Ordering::Acquire);
            t.completed += s.counters.completed.load(Ordering::Acquire);
            t.panicked += s.counters.panicked.load(Ordering::Acquire);
            t.dropped += s.counters.dropped.load(Ordering::Acquire);
        }
        t
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
        labeler: crate::trace::Labeler<K>,
        state: crate::state::StateHooks<K>,
    ) -> Shared<K> {
        let slots: Box<[Slot<K>]> = owned
            .into_iter()
            .map(|o| Slot {
                stealer: o.deque.stealer(),
                local: Mutex::new(Some(o)),
                phase: CachePadded::new(Phase::new()),
                current: AtomicUsize::new(0),
                direct_hash: crate::sync::AtomicU64::new(0),
                counters: CachePadded::new(Counters::default()),
                alive: AtomicBool::new(false),
                lent: Mutex::new(crate::state_hold::Lent::Empty),
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
            // A collector of its own: a dropped serializer's garbage is freed with it (and the
            // leak check of Miri's whole-serializer tests covers the key table).
            table: Table::with_hasher_and_collector(hasher, crossbeam_epoch::Collector::new()),
            global: CachePadded::new(Injector::new()),
            mailboxes,
            claims: Claims::new(),
            latest: LatestCells::new(),
            slots,
            sleep: Sleep::new(unparkers),
            gate: Gate::new(gate_words),
            capacity: capacity.map(Capacity::new),
            lifecycle: Lifecycle::new(),
            outside: Outside::default(),
            starved_since: AtomicU64::new(0),
            permit_waits: PermitWaits::new(),
            outside_holds: crate::baton::OutsideHolds::default(),
            budget: config.max_keys.map(crate::key_budget::KeyBudget::new),
            shared_idle: config
                .max_keys
                .map(|_| Mutex::new(std::collections::VecDeque::new())),
            labeler,
            state,
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
            self.lifecycle.wake_supervisor();
        }
    }

    /// Tasks admitted and not yet finished (run, dropped or handed back). Exact when quiescent.
    pub(crate) fn outstanding(&self) -> u64 {
        let t = self.tally();
        t.admitted
            .saturating_sub(t.completed + t.dropped + t.handed_back)
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
        let left = self.lifecycle.worker_ended();
        if left == 0 && self.lifecycle.is_shutdown() {
            self.lifecycle.set_terminated();
        }
    }
}
