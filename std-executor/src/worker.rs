//! Worker threads: find a runnable, drain a key's chain under the fairness budget, release or
//! requeue it, retire idle keys, sleep without losing wakeups, and stop cleanly.
//!
//! # Lanes first
//!
//! Every keyed submission arrives in a lane (`lanes.rs`). A worker takes a `FREE` lane with items
//! (its home lanes first: lane `l` belongs to core worker `l % workers`, so while every worker is
//! busy a key's data stays on one core), pops and routes its items (`route.rs`), and releases it
//! when it is empty, after `4 * fairness_budget` tasks run from it, or after 64 times as many
//! items routed onto chains (so that, on a single worker, the chains it fills get to run). A worker alternates between
//! lanes and the ready queues below (where tracked keys' chains and unkeyed tasks wait), so
//! neither starves the other.
//!
//! A worker takes over a lane whose owner it finds inside the same task, with items waiting, at
//! two looks at least `STEAL_AFTER` apart, deferring only that task's key (`deferral.rs`); the
//! stolen owner runs the deferral when its task returns. Nobody waits to look: a busy worker
//! looks between its own turns, an idle one between its spins and naps.
//!
//! # Fairness in a lane
//!
//! A lane is a FIFO shared by many keys, so a key with a deep backlog would hold back the keys
//! queued behind it. When one key has run `fairness_budget` tasks in a row from a lane and more
//! items wait, its next items go onto its chain instead (the key becomes tracked): routing them is
//! a push each, the owner reaches the other keys' items at once, and the hot key's chain runs from
//! the ready queues under the fairness budget like any chain.
//!
//! # Sharing a lane with an idle worker
//!
//! A lane is served by one worker at a time, so keys that share a lane share a worker. Keys
//! hash onto lanes at random (the table's seeded hasher), so a few busy keys can land in one
//! lane (2 keys on 4 lanes: one time in four) and run on one core while the other has nothing
//! to do. So every [`SHED_EVERY`] items it pops, a lane's owner looks at its core siblings'
//! phase words (one load each). If one of them is `IDLE` (its last search found nothing), the
//! items popped since the last look came from at most [`FEW_KEYS`] keys (hash buckets, one bit
//! each), at least `4 * fairness_budget` items (a lane's hold) wait in the lane, and no other
//! lane is `FREE` with items (work the sibling would find by itself), the owner *sheds* the key
//! of the next item it pops: it moves that item onto the key's chain, as it moves a hot key's
//! (below, and `route.rs`), and the chain goes onto the owner's deque, from which the idle
//! sibling steals it (a chain made runnable wakes a sleeper, `sleep.rs`). The key's entry is
//! marked shed, so its later items follow onto its chain in lane order even when the sibling
//! has drained the chain meanwhile (a hot key's run directly again once its chain is idle),
//! until the chain retires (`key_idle_timeout` after it last drained).
//!
//! Nothing else changes, and no new protocol: a shed key is one more tracked key, routed by the
//! lane's owner alone, whose order `route.rs` keeps (an item that goes onto its key's chain is
//! always in order; only running one directly needs the chain idle); the shed mark is a hint
//! that only chooses between those two paths. A lane of many keys is never shed from: its
//! imbalance is small, and there an idle sibling is mostly one between two bursts of a
//! submitter that outruns the workers, which finds a lane in a moment (measured: shedding on an
//! idle sibling alone slowed W2 to 0.55x and W3 to 0.62x; with the few-keys rule no key was shed
//! in W2, W3, W5 or W6 runs).
//!
//! # Runs of direct tasks
//!
//! Most items a lane's owner pops run as they are: no deferral for their key, a plain task, no
//! tracked key in the lane's bucket of its hash (`route.rs` would return them `Direct` without
//! looking anything up).
//! A row of such items runs under one `RUNNING` section of the slot's phase word: the owner
//! enters `RUNNING` before the first, and between two of them only loads the word for `STOP`,
//! pops the lane and moves the lane's own word (`begin`, `end`); it leaves `RUNNING` before it
//! routes an item that needs routing, releases the lane, or stops (`phase.rs`, "Runs of lane
//! tasks", says why `shutdown_now` stays exact). Per task that leaves one locked instruction, the
//! lane word's `end`, where each task used to pay two more for the phase word.
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
//!
//! # Idle workers nap before they sleep
//!
//! A worker whose search comes back empty searches again after [`SPIN_ROUNDS`] short spins
//! (`2^round` spin hints each), then after each of [`NAP_ROUNDS`] naps of [`NAP`], and only then
//! registers asleep (below). A napping worker is neither searching nor asleep in the sleep word,
//! so a submitter wakes nobody for it (no wakeup is lost: it searches again when the nap ends).
//! Why naps and not `yield_now`: a worker that polls the lanes without pause keeps taking the
//! lines a submitter writes at every push (the FIFO's tail, the slot next to the one it reads),
//! and on a busy machine runs in lockstep with the submitter, one item per look, each push then
//! waiting for its lines to come back. A nap lets a batch build up, which the worker then reads
//! in order, one tail read per batch (`core::fifo`). A nap costs an item that arrives during it
//! at most `NAP` (plus the timer's slack) of latency, only while no worker is running, and no
//! worker registers asleep for a gap between submits shorter than the naps.
//!
//! # Draining and fairness
//!
//! The worker owns the chain it popped. It runs at most `fairness_budget` tasks, then, if the chain
//! still has work, pushes it to the back of its injector (behind keys that arrived meanwhile) and
//! notifies; otherwise it releases the chain (`CAS(ACTIVE -> 0)`, which fails if a push came in:
//! then it keeps draining). After a release, the key's idle bookkeeping runs (`idle.rs`) under an
//! epoch guard taken *before* the release, since the entry may be retired by others from then on.
//!
//! # Stopping (`shutdown_now`)
//!
//! Each slot has a phase word (`phase.rs`: `IDLE`, `BUSY`, `RUNNING`, plus `STOP` and `STOLEN`)
//! through which `shutdown_now` takes the queue behind a running task without waiting for the
//! task. A worker either hands back what it holds before going `IDLE`, or had its chain stolen
//! while `RUNNING`: each queued task ends up in exactly one place.

use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_deque::{Steal, Worker};
use crossbeam_utils::Backoff;
use keyserial_core::lane::{Ended, Phase, Watch};

use crate::deferral::Deferral;
use crate::lane_task::Item;
use crate::lane_task::LaneTask;
use crate::lanes::{KeyPanicked, POLL, STEAL_AFTER};
use crate::route::{route, Route, Track};

use crate::idle::IdleKeys;
use crate::key::{KeyEntry, Runnable};
use crate::pending::PendingTask;
use crate::permits::PermitOutcome;
use crate::phase::AfterTask;
use crate::shared::Shared;
use crate::slot::{Counters, Owned, Slot};
use crate::sync::{lock, Ordering};
use crate::task::{Abandon, Kind, TaskRef};

/// How many rounds an idle worker spins (re-searching after `2^round` spin hints) before it
/// naps.
const SPIN_ROUNDS: u32 = 6;

/// How many naps an idle worker takes (re-searching after each) before it registers asleep.
const NAP_ROUNDS: u32 = 16;

/// An idle worker's nap between two searches (see "Idle workers nap before they sleep").
const NAP: Duration = Duration::from_micros(20);

/// A lane's owner looks for an idle sibling once every this many items it pops (see "Sharing a
/// lane with an idle worker").
const SHED_EVERY: usize = 64;

/// A lane's owner sheds keys only while the items it popped since its last look came from at
/// most this many keys (the tracked counts' 64 hash buckets, `lanes.rs`; see "Sharing a lane
/// with an idle worker"). W2's lanes (250 keys each) show about 40 in 64 pops; a lane of a few
/// busy keys, a handful.
const FEW_KEYS: u32 = 16;

/// A worker starts its search at the global queue once every this many looks.
const GLOBAL_INTERVAL: u32 = 31;
/// The most runnables a worker moves from the global queue into its deque at once: enough to
/// take one shared-queue transfer per several chains, few enough that a batch stuck behind a
/// task that blocks is small (and stealable).
const GLOBAL_BATCH: usize = 4;

thread_local! {
    /// The serializer and slot of the worker running on this thread, and its local deque.
    static CURRENT: Cell<(usize, usize, *const ())> = const { Cell::new((0, 0, std::ptr::null())) };
}

/// If this thread is one of serializer `id`'s workers: its slot and local deque.
pub(crate) fn current_worker<K>(id: usize) -> Option<(usize, &'static Worker<Runnable<K>>)> {
    let (sid, slot, deque) = CURRENT.with(Cell::get);
    if sid == id && !deque.is_null() {
        // CURRENT is cleared before the worker loop returns; callers use the reference only
        // within their own call (never stored), so it never outlives the deque.
        // SAFETY: CURRENT holds the deque of a `Worker` loop running further up this thread's
        // stack for serializer `id`, whose runnables are `Runnable<K>` (one serializer, one K).
        Some((slot, unsafe { &*(deque as *const Worker<Runnable<K>>) }))
    } else {
        None
    }
}

/// `true` if this thread is a worker of serializer `id`.
pub(crate) fn on_worker_of(id: usize) -> bool {
    CURRENT.with(Cell::get).0 == id
}

/// Starts the worker thread of `index`. The slot's deque and parker must be free.
pub(crate) fn spawn<K>(shared: &Arc<Shared<K>>, index: usize) -> std::io::Result<()>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let owned = lock(&shared.slots[index].local)
        .take()
        .expect("a free slot has its deque");
    shared.slots[index].alive.store(true, Ordering::Release);
    shared.live_workers.fetch_add(1, Ordering::AcqRel);
    shared.sleep.start_searching();
    let s = shared.clone();
    let name = format!("{}-{}", shared.config.thread_name, index);
    let result = std::thread::Builder::new()
        .name(name)
        .spawn(move || WorkerLoop::new(&s, index, owned).run());
    match result {
        Ok(handle) => {
            let mut threads = lock(&shared.threads);
            threads.retain(|h| !h.is_finished());
            threads.push(handle);
            Ok(())
        }
        Err(e) => {
            shared.slots[index].alive.store(false, Ordering::Release);
            shared.live_workers.fetch_sub(1, Ordering::AcqRel);
            // This worker was counted as searching, so a submit meanwhile may have stamped
            // nothing: hand its work on as an exiting worker does.
            shared.sleep.stop_searching();
            if shared.sleep.unattended(|| shared.has_visible_work()) {
                shared.starving();
            }
            Err(e)
        }
    }
}

struct WorkerLoop<'a, K> {
    shared: &'a Arc<Shared<K>>,
    slot: &'a Slot<K>,
    index: usize,
    owned: Option<Owned<K>>,
    /// Keys released here, waiting for their idle timeout (`idle.rs`).
    idle: IdleKeys<K>,
    searching: bool,
    /// Its home lanes, `(index, workers)`: lanes `l` with `l % workers == index` (core workers
    /// only), served first so that a key's data stays on one core while every worker is busy.
    home: Option<(usize, usize)>,
    /// Rotates the home lane served first.
    turn: usize,
    /// Each lane as seen inside a task with items waiting, at the last look (`watched_at`); see
    /// "Finding work".
    watched: Vec<Option<Watch>>,
    /// Each lane seen `FREE` with items waiting at the last look.
    seen_free: Vec<bool>,
    watched_at: std::time::Instant,
    tick: u32,
    now: u64,
    /// Each slot's `started` count at the previous periodic check (see "Finding work").
    seen: Vec<u64>,
}

enum After {
    Continue,
    Exit,
}

/// What a worker found to do.
enum Work<K> {
    /// A lane it now owns.
    Lane(usize),
    Run(Runnable<K>),
}

/// How a task run straight from a lane (or a deferral) ended for the worker.
enum Direct {
    /// Go on with the lane (or deferral).
    Continue,
    /// The lane was taken while the task ran (and the deferral it brought has been run).
    LaneLost,
    /// `shutdown_now`: what the worker held is handed back; stop.
    Exit,
}

impl<'a, K> WorkerLoop<'a, K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    fn new(shared: &'a Arc<Shared<K>>, index: usize, owned: Owned<K>) -> Self {
        WorkerLoop {
            shared,
            slot: &shared.slots[index],
            index,
            owned: Some(owned),
            idle: IdleKeys::new(),
            searching: true,
            home: (index < shared.config.workers).then_some((index, shared.config.workers)),
            turn: 0,
            watched: vec![None; shared.lanes.len()],
            seen_free: vec![false; shared.lanes.len()],
            watched_at: std::time::Instant::now(),
            tick: 0,
            now: shared.now_ms(),
            seen: vec![0; shared.slots.len()],
        }
    }

    fn deque(&self) -> &Worker<Runnable<K>> {
        &self
            .owned
            .as_ref()
            .expect("deque present while running")
            .deque
    }

    fn run(mut self) {
        let deque_ptr = self.deque() as *const Worker<Runnable<K>> as *const ();
        CURRENT.with(|c| c.set((self.shared.id, self.index, deque_ptr)));
        self.main_loop();
        CURRENT.with(|c| c.set((0, 0, std::ptr::null())));
        self.exit();
    }

    fn main_loop(&mut self) {
        let mut spins = 0;
        let mut idle_since = self.shared.now_ms();
        loop {
            if !self.enter_busy() {
                return;
            }
            // Stay BUSY from one runnable to the next: the phase goes back to IDLE only when
            // the search comes back empty (a STOP meanwhile is seen by `enter_running`, which
            // then hands back what was found).
            while let Some(w) = self.find_work() {
                spins = 0;
                if let After::Exit = self.found(w) {
                    return;
                }
                idle_since = self.now;
            }
            if self.leave_busy() {
                return;
            }
            if spins < SPIN_ROUNDS + NAP_ROUNDS {
                spins += 1;
                if spins > SPIN_ROUNDS {
                    std::thread::sleep(NAP);
                } else {
                    for _ in 0..(1 << spins) {
                        std::hint::spin_loop();
                    }
                }
                continue;
            }
            spins = 0;
            self.now = self.shared.now_ms();
            self.reap_idle(false);
            // The snapshot comes before the last checks (shutdown and every queue): whatever
            // changes after it bumps EVENTS, and then try_sleep refuses (sleep.rs).
            let snapshot = self.shared.sleep.snapshot();
            if self.should_exit_on_shutdown() {
                return;
            }
            if !self.enter_busy() {
                return;
            }
            if let Some(w) = self.find_work() {
                if let After::Exit = self.found(w) {
                    return;
                }
                idle_since = self.now;
                if self.leave_busy() {
                    return;
                }
                continue;
            }
            if self.leave_busy() {
                return;
            }
            if !self
                .shared
                .sleep
                .try_sleep(self.index, snapshot, self.searching)
            {
                continue;
            }
            self.searching = false;
            self.flush_garbage();
            // Our pending slab count would otherwise keep a slab alive while we sleep.
            crate::nodes::flush();
            let timeout = self.park_timeout(idle_since);
            self.park(timeout);
            self.shared.sleep.woke(self.index);
            self.searching = true;
            self.now = self.shared.now_ms();
            self.reap_idle(false);
            if self.index >= self.shared.config.workers {
                let keep = self.shared.config.worker_keep_alive.as_millis() as u64;
                if self.now.saturating_sub(idle_since) >= keep
                    && self.idle.is_empty()
                    && !self.shared.has_visible_work()
                {
                    return; // an elastic worker idle past its keep-alive
                }
            }
        }
    }

    /// Parks for at most `timeout`; only for [`POLL`] while a lane has items queued behind an
    /// owner, who may get stuck in a task (see "Waking for a push" in `lanes.rs`).
    fn park(&self, timeout: Duration) {
        let parker = &self.owned.as_ref().expect("parker").parker;
        let lanes = &self.shared.lanes;
        // Registered as asleep (`try_sleep`): look for a free lane with items once more. A
        // submitter that saw nobody asleep woke nobody (lanes.rs, "Waking for a push"): either
        // it sees this registration or this look sees its item.
        crate::sync::fence(Ordering::SeqCst);
        if lanes.free_work() {
            return;
        }
        if lanes.queued_anywhere() {
            parker.park_timeout(timeout.min(POLL));
            return;
        }
        // A deep sleep: register first, then look once more (pairs with a push's fence; the
        // fence makes that pairing independent of the queue's own orderings).
        lanes.deep.fetch_add(1, Ordering::SeqCst);
        crate::sync::fence(Ordering::SeqCst);
        if lanes.queued_anywhere() {
            parker.park_timeout(timeout.min(POLL));
        } else {
            parker.park_timeout(timeout);
        }
        lanes.deep.fetch_sub(1, Ordering::SeqCst);
    }

    fn park_timeout(&self, idle_since: u64) -> Duration {
        let mut ms: u64 = 1000;
        if let Some(deadline) = self.idle.next_deadline() {
            ms = ms.min(deadline.saturating_sub(self.now).max(1));
        }
        if self.index >= self.shared.config.workers {
            let keep = self.shared.config.worker_keep_alive.as_millis() as u64;
            ms = ms.min((idle_since + keep).saturating_sub(self.now).max(1));
        }
        if self.shared.shutdown.load(Ordering::Acquire) {
            ms = ms.min(10);
        }
        Duration::from_millis(ms)
    }

    fn should_exit_on_shutdown(&self) -> bool {
        let sh = self.shared;
        if sh.stop.load(Ordering::Acquire) {
            return true;
        }
        if sh.shutdown.load(Ordering::Acquire)
            && sh.lanes.is_closed()
            && sh.gate.in_flight() == 0
            && sh.outstanding() == 0
            && !sh.has_visible_work()
        {
            sh.sleep.wake_all();
            return true;
        }
        false
    }

    /// `IDLE -> BUSY`; `false` if `shutdown_now` stopped this worker.
    fn enter_busy(&self) -> bool {
        self.slot.phase.enter_busy()
    }

    /// Back to `IDLE`; `true` if `STOP` is set.
    fn leave_busy(&self) -> bool {
        self.slot.phase.leave_busy()
    }

    fn found(&mut self, w: Work<K>) -> After {
        if std::mem::take(&mut self.searching)
            && self.shared.sleep.stop_searching()
            && self
                .shared
                .sleep
                .unattended(|| self.shared.has_visible_work())
        {
            // The last searcher found work and more is waiting (perhaps pushed while we were
            // searching, when the submit woke nobody): get another worker looking, or, if none
            // is idle, tell the elastic pool that every worker is busy while work waits.
            self.shared.starving();
        }
        let after = match w {
            Work::Lane(l) => self.serve(l),
            Work::Run(Runnable::Chain(entry)) => self.run_chain(entry),
            Work::Run(Runnable::Task(task)) => self.run_unkeyed(task),
        };
        self.tick = self.tick.wrapping_add(1);
        if self.tick % 64 == 0 {
            self.now = self.shared.now_ms();
            self.reap_idle(false);
        }
        if let After::Exit = after {
            self.leave_busy();
        }
        after
    }

    /// A lane to serve or a runnable, lanes and ready queues first in turn (neither starves
    /// the other).
    fn find_work(&mut self) -> Option<Work<K>> {
        if let Some(l) = self.lane_stuck_since_last_look() {
            return Some(Work::Lane(l));
        }
        let lanes_first = self.tick % 2 == 0;
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
    fn acquire_lane(&mut self) -> Option<usize> {
        let sh = self.shared;
        let l = sh.lanes.acquire_free(self.index, self.home, self.turn)?;
        if sh.sleep.has_sleepers() && sh.lanes.free_work_except(l) {
            sh.sleep.wake_one();
        }
        Some(l)
    }

    fn find_runnable(&mut self) -> Option<Runnable<K>> {
        self.tick = self.tick.wrapping_add(1);
        let deque = &self.owned.as_ref()?.deque;
        let global = &self.shared.global;
        let from_global =
            || steal_into(|| global.steal_batch_with_limit_and_pop(deque, GLOBAL_BATCH));
        let found = if self.tick % GLOBAL_INTERVAL == 0 {
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
            let n = self.shared.slots.len();
            (1..n).find_map(|k| {
                let other = &self.shared.slots[(self.index + k) % n];
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

    fn bump(&self, f: impl Fn(&Counters) -> &crate::sync::AtomicU64) {
        Counters::bump(f(&self.slot.counters));
    }

    fn release_capacity(&self) {
        if let Some(c) = &self.shared.capacity {
            c.release();
        }
    }

    fn run_unkeyed(&mut self, task: TaskRef) -> After {
        self.slot.current.store(0, Ordering::Relaxed);
        if !self.slot.phase.enter_running() {
            self.hand_back(task);
            return After::Exit;
        }
        self.release_capacity();
        self.bump(|c| &c.started);
        task.run(None, &|panicked| self.finish_task(panicked));
        match self.slot.phase.leave_running() {
            AfterTask::Continue => After::Continue,
            AfterTask::Stolen | AfterTask::HandBack => After::Exit,
        }
    }

    /// Serves lane `l`, which this worker owns: pops and routes its items until the lane is
    /// empty, the budget is spent, or the lane is taken while a task runs. Items that run
    /// directly without routing run under one `RUNNING` section (see "Runs of direct tasks").
    fn serve(&mut self, l: usize) -> After {
        let sh = self.shared;
        let lane = sh.lanes.get(l);
        let fair = sh.config.fairness_budget;
        let budget = fair.saturating_mul(4);
        // Routing an item onto a chain is a push, far cheaper than a task, but not free: a
        // lane fed as fast as its owner routes must still let the owner go (to run the chains
        // it fills, on a single worker).
        let route_budget = budget.saturating_mul(64);
        let (mut ran, mut routed) = (0, 0);
        // The key hash of the last task run here, and how many ran in a row.
        let mut streak = (0u64, 0usize);
        // Items popped here, and whether the next one's key is shed to an idle sibling (see
        // "Sharing a lane with an idle worker").
        let (mut popped, mut shed) = (0usize, false);
        // The hash buckets of the keys popped since the last look, one bit each.
        let mut seen_keys = 0u64;
        // Whether the slot is `RUNNING` from the last task to the next (a run is open).
        let mut in_run = false;
        loop {
            if ran >= budget || routed >= route_budget {
                if in_run && self.end_run() {
                    return self.stop_holding_lane(l, None);
                }
                lane.word.release(self.index);
                self.turn = self.turn.wrapping_add(1);
                return After::Continue;
            }
            // SAFETY: this worker owns the lane (it acquired it and has not released it).
            let Some(next) = (unsafe { lane.pop() }) else {
                if std::mem::take(&mut in_run) && self.end_run() {
                    return self.stop_holding_lane(l, None);
                }
                if lane.release_or_keep(self.index) {
                    continue;
                }
                return After::Continue;
            };
            let item = match next {
                Ok(item) => item,
                Err(KeyPanicked { task, payload }) => {
                    // Its key's `Hash` panicked: the task fails, the lane goes on.
                    ran += 1;
                    self.fail_task(task, payload);
                    continue;
                }
            };
            // While this item runs, the next one's data comes (`lane_task.rs`, "Looking
            // ahead").
            // SAFETY: as for the pop.
            unsafe { lane.look_ahead() };
            let hash = item.hash;
            popped += 1;
            seen_keys |= 1 << crate::lanes::bucket(hash);
            // A key that ran `fairness_budget` tasks in a row while others wait in the lane
            // moves onto its chain (see "Fairness in a lane"), and so does a key shed to an idle
            // sibling (see "Sharing a lane with an idle worker").
            let shed_now = std::mem::take(&mut shed);
            let hot = shed_now || (streak.0 == hash && streak.1 >= fair && !lane.is_empty());
            if popped % SHED_EVERY == 0 {
                let few_keys = std::mem::take(&mut seen_keys).count_ones() <= FEW_KEYS;
                shed = few_keys
                    && self.sibling_idle()
                    && lane.len() >= budget
                    && !sh.lanes.free_work_except(l);
            }
            let next_streak = if streak.0 == hash {
                (hash, streak.1 + 1)
            } else {
                (hash, 1)
            };
            if !hot && self.runs_directly(l, &item) {
                ran += 1;
                streak = next_streak;
                if !in_run {
                    self.slot.current.store(0, Ordering::Relaxed);
                    if !self.slot.phase.enter_running() {
                        return self.stop_holding_lane(l, Some(item));
                    }
                    in_run = true;
                } else if self.slot.phase.stop_requested() {
                    self.slot.phase.leave_running();
                    return self.stop_holding_lane(l, Some(item));
                }
                match self.run_in_run(l, item, hash) {
                    Direct::Continue => continue,
                    Direct::LaneLost => return After::Continue,
                    Direct::Exit => return After::Exit,
                }
            }
            if std::mem::take(&mut in_run) && self.end_run() {
                return self.stop_holding_lane(l, Some(item));
            }
            let Some(item) = lane.deferrals.divert(item, hash) else {
                routed += 1;
                continue;
            };
            let local = self.owned.as_ref().map(|o| &o.deque);
            let track = match (shed_now, hot) {
                (true, _) => Track::Shed,
                (false, true) => Track::Hot,
                (false, false) => Track::AsIs,
            };
            let item = match route(sh, item, hash, local, track) {
                Route::Direct(item) => item,
                Route::Queued => {
                    routed += 1;
                    continue;
                }
                Route::Failed(task, payload) => {
                    ran += 1;
                    self.fail_task(task, payload);
                    continue;
                }
            };
            ran += 1;
            streak = next_streak;
            match self.run_direct(Some(l), item, hash) {
                Direct::Continue => {}
                Direct::LaneLost => return After::Continue,
                Direct::Exit => return After::Exit,
            }
        }
    }

    /// Whether a core sibling is `IDLE` right now (its last search found nothing): one relaxed
    /// load per sibling (see "Sharing a lane with an idle worker").
    fn sibling_idle(&self) -> bool {
        let sh = self.shared;
        sh.slots[..sh.config.workers]
            .iter()
            .enumerate()
            .any(|(i, s)| i != self.index && s.phase.is_idle())
    }

    /// Whether the item popped from lane `l` runs as it is, with nothing to look up: no
    /// deferral for its key, a plain task, no tracked key in the lane's bucket of its hash
    /// (`route.rs` would send it `Direct` without touching anything).
    #[inline]
    fn runs_directly(&self, l: usize, item: &Item<K>) -> bool {
        let lanes = &self.shared.lanes;
        lanes.get(l).deferrals.passes(item.hash)
            && item.task.kind() == Kind::Plain
            && !lanes.tracked.any(l, item.hash)
    }

    /// Leaves the `RUNNING` section of a run; `true` if `shutdown_now` stopped the worker
    /// meanwhile (it then hands back what it holds).
    fn end_run(&self) -> bool {
        self.slot.phase.leave_running() != AfterTask::Continue
    }

    /// `shutdown_now` stopped the worker while it owns lane `l` (`OWNED`) and perhaps holds an
    /// item popped from it: hands both back and exits.
    fn stop_holding_lane(&self, l: usize, item: Option<Item<K>>) -> After {
        self.hand_back_lane_with(l, item);
        After::Exit
    }

    /// Runs a task popped from lane `l` inside the open run (the slot is `RUNNING`); leaves the
    /// run open unless the lane was taken while the task ran.
    #[inline(always)]
    fn run_in_run(&mut self, l: usize, item: Item<K>, hash: u64) -> Direct {
        let sh = self.shared;
        let word = &sh.lanes.get(l).word;
        let Item { key, task, .. } = item;
        #[cfg(debug_assertions)]
        self.slot
            .direct_key
            .store(&key as *const K as usize, Ordering::Relaxed);
        self.release_capacity();
        self.bump(|c| &c.started);
        let run = word.begin(self.index, hash as usize);
        task.run(&|panicked| self.finish_task(panicked));
        let ended = word.end(run, &sh.mailboxes[self.index]);
        #[cfg(debug_assertions)]
        self.slot.direct_key.store(0, Ordering::Relaxed);
        crate::user::drop_quietly(key);
        match ended {
            Ended::Kept => Direct::Continue,
            Ended::Stolen(p) => {
                let after = self.slot.phase.leave_running();
                self.after_steal(p, after)
            }
        }
    }

    /// Runs a routed item's task on this thread: from lane `lane`, which this worker owns, or
    /// (`None`) from a deferral it runs.
    fn run_direct(&mut self, lane: Option<usize>, item: Item<K>, hash: u64) -> Direct {
        self.slot.current.store(0, Ordering::Relaxed);
        if !self.slot.phase.enter_running() {
            match lane {
                Some(l) => self.hand_back_lane_with(l, Some(item)),
                None => self.hand_back_items(vec![item]),
            }
            return Direct::Exit;
        }
        self.run_entered(lane, item, hash)
    }

    /// `run_direct` once the slot is `RUNNING` (`enter_running` succeeded).
    fn run_entered(&mut self, lane: Option<usize>, item: Item<K>, hash: u64) -> Direct {
        let sh = self.shared;
        let Item { key, task, .. } = item;
        // `key` stays here, unmoved, until it is dropped after the task.
        #[cfg(debug_assertions)]
        self.slot
            .direct_key
            .store(&key as *const K as usize, Ordering::Relaxed);
        self.release_capacity();
        self.bump(|c| &c.started);
        let word = lane.map(|l| &sh.lanes.get(l).word);
        let run = word.map(|w| w.begin(self.index, hash as usize));
        task.run(&|panicked| self.finish_task(panicked));
        let ended = word
            .zip(run)
            .map(|(w, run)| w.end(run, &sh.mailboxes[self.index]));
        #[cfg(debug_assertions)]
        self.slot.direct_key.store(0, Ordering::Relaxed);
        crate::user::drop_quietly(key);
        let after = self.slot.phase.leave_running();
        match ended {
            Some(Ended::Stolen(p)) => self.after_steal(p, after),
            Some(Ended::Kept) if after != AfterTask::Continue => {
                self.hand_back_lane(lane.expect("a lane run"));
                Direct::Exit
            }
            _ if after != AfterTask::Continue => Direct::Exit,
            _ => Direct::Continue,
        }
    }

    /// The lane was taken while a task ran (`p`: what the thief offered) and the slot has left
    /// `RUNNING` (`after`): runs the deferral the thief built, unless `shutdown_now` took the lane
    /// or stopped the worker.
    fn after_steal(&mut self, p: NonNull<Deferral<K>>, after: AfterTask) -> Direct {
        if p == Deferral::stop_sentinel() {
            return Direct::Exit;
        }
        // SAFETY: a thief made `p` with `Arc::into_raw` and handed us that count.
        let d = unsafe { std::sync::Arc::from_raw(p.as_ptr().cast_const()) };
        if after != AfterTask::Continue {
            // Stopped: the deferral's items are handed back with the lane's.
            return Direct::Exit;
        }
        if self.run_deferral(&d) {
            return Direct::Exit;
        }
        Direct::LaneLost
    }

    /// Runs a deferral collected after a steal (`deferral.rs`): routes its items in order until
    /// it is empty, which closes it. `true` if the worker must exit (`shutdown_now`).
    ///
    /// An item leaves the deferral only once it has started or been queued on its key's
    /// chain: it is routed, and its task entered, under the deferral's lock, and put back in
    /// front if `shutdown_now` stopped this worker, so that whoever hands the deferral back
    /// hands back all of it, in order.
    fn run_deferral(&mut self, d: &Deferral<K>) -> bool {
        loop {
            let mut next = d.lock();
            let Some(item) = next.pop_front() else {
                next.close();
                return false;
            };
            let local = self.owned.as_ref().map(|o| &o.deque);
            let hash = item.hash;
            let item = match route(self.shared, item, hash, local, Track::AsIs) {
                Route::Direct(item) => item,
                Route::Queued => continue,
                Route::Failed(task, payload) => {
                    // Its key's code panicked while it was routed: it leaves the deferral
                    // failed, and the handle resolves outside the deferral's lock.
                    drop(next);
                    self.fail_task(task, payload);
                    continue;
                }
            };
            self.slot.current.store(0, Ordering::Relaxed);
            if !self.slot.phase.enter_running() {
                next.push_front(item);
                return true;
            }
            drop(next);
            if let Direct::Exit = self.run_entered(None, item, hash) {
                return true;
            }
        }
    }

    /// A lane taken over from an owner stuck in one task (the task's key deferred), or left
    /// waiting by its home worker. At most every [`STEAL_AFTER`], a worker compares each lane
    /// with what it saw at its previous look, and takes one whose owner is still inside the same
    /// task with items waiting, or one still `FREE` with items waiting (its home worker never
    /// came: it may be stuck in a task of another lane). The criterion is progress, and nobody
    /// waits for it: a busy worker looks between its own turns, an idle one between its spins
    /// and naps ([`POLL`] while any lane has items).
    fn lane_stuck_since_last_look(&mut self) -> Option<usize> {
        let now = std::time::Instant::now();
        if now.duration_since(self.watched_at) < STEAL_AFTER {
            return None;
        }
        self.watched_at = now;
        let lanes = &self.shared.lanes;
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
    fn try_steal_lane(&self, l: usize, w: &Watch) -> bool {
        let sh = self.shared;
        let lane = sh.lanes.get(l);
        let Some(victim) = sh.mailboxes.get(w.owner()) else {
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

    /// `shutdown_now`: hands back lane `l`'s deferred and queued items, then releases it.
    fn hand_back_lane(&self, l: usize) {
        self.hand_back_lane_with(l, None);
    }

    /// `hand_back_lane`, with `held`, an item this worker popped from the lane and did not
    /// route, put back where it was: after the deferred items (popped before it; a deferral of
    /// its own key holds that key's earlier items) and before the queued ones.
    fn hand_back_lane_with(&self, l: usize, held: Option<Item<K>>) {
        let lane = self.shared.lanes.get(l);
        let mut items = lane.deferrals.take_all();
        items.extend(held);
        let mut back: Vec<_> = items.into_iter().map(pending).collect();
        // SAFETY: this worker owns lane `l`: every caller passes the lane it holds (a lane
        // whose task ended `Kept`, the lane `run_direct` was called for, or the lane `serve`
        // pops).
        while let Some((key, task)) = unsafe { lane.pop_unhashed() } {
            back.push(PendingTask::new(Some(key), task.into_task()));
        }
        lock(&self.shared.handback_lanes).append(&mut back);
        lane.word.release(self.index);
    }

    fn hand_back_items(&self, items: Vec<Item<K>>) {
        let mut back: Vec<_> = items.into_iter().map(pending).collect();
        lock(&self.shared.handback_lanes).append(&mut back);
    }

    /// Fails a task whose key's code (`Hash`, `Eq`, `Clone`) panicked on its way to running
    /// (`user.rs`): it counts as started and ended by a panic, its capacity slot comes back,
    /// and its handle resolves `Panicked` with the payload (after the counters, as for a task
    /// that ran).
    #[cold]
    fn fail_task(&self, task: LaneTask, payload: crate::user::Payload) {
        self.release_capacity();
        self.bump(|c| &c.started);
        self.finish_task(true);
        task.fail(payload);
    }

    fn finish_task(&self, panicked: bool) {
        if panicked {
            self.bump(|c| &c.panicked);
        }
        self.bump(|c| &c.completed);
    }

    fn run_chain(&mut self, entry_ptr: NonNull<KeyEntry<K>>) -> After {
        // SAFETY: we hold the chain's ACTIVE baton, so the entry is not retired and stays
        // allocated until we release it.
        let entry = unsafe { entry_ptr.as_ref() };
        let ks = entry.value();
        let chain = &ks.chain;
        let budget = self.shared.config.fairness_budget;
        let mut ran = 0;
        // Backs off on failed releases in a row with nothing to pop (see below).
        let stall = crossbeam_utils::Backoff::new();
        loop {
            if ran >= budget {
                let guard = crossbeam_epoch::pin();
                // SAFETY: we own the chain.
                if unsafe { chain.try_release() } {
                    self.released(entry_ptr, &guard);
                } else {
                    // Yield: to the back of the global queue, behind keys that arrived
                    // meanwhile, where any worker can take it.
                    self.shared.schedule(Runnable::Chain(entry_ptr), None);
                }
                return After::Continue;
            }
            // SAFETY: we own the chain; `kind_of` reads queued nodes of a chain we own.
            let popped = unsafe { chain.pop_coalescing(|n| TaskRef::kind_of(n) == Kind::Latest) };
            let Some(p) = popped else {
                let guard = crossbeam_epoch::pin();
                // SAFETY: we own the chain.
                if unsafe { chain.try_release() } {
                    self.released(entry_ptr, &guard);
                    return After::Continue;
                }
                // Nothing to pop, yet a push is queued: it is between its two steps (core
                // `chain`, "The pop"), normally a few instructions from done. Back off (spin,
                // then yield, which lets a preempted pusher on this core run); once the backoff
                // is spent, do not wait any longer: queue the key behind the others.
                if stall.is_completed() {
                    self.shared.schedule(Runnable::Chain(entry_ptr), None);
                    return After::Continue;
                }
                crate::sync::snooze(&stall);
                continue;
            };
            stall.reset();
            // SAFETY: we own the chain and just popped the node: it is ours alone.
            let mut task = unsafe { TaskRef::from_raw(p.node) };
            if p.superseded {
                task.abandon(Abandon::Superseded);
                self.bump(|c| &c.dropped);
                self.release_capacity();
                continue;
            }
            let mut permit = None;
            if task.kind() == Kind::Permits {
                match crate::permits::acquire_or_park(self.shared, entry_ptr, task) {
                    PermitOutcome::Run(t, p) => {
                        task = t;
                        permit = p;
                    }
                    PermitOutcome::Parked => return After::Continue,
                    PermitOutcome::Dropped => {
                        self.bump(|c| &c.dropped);
                        self.release_capacity();
                        continue;
                    }
                }
            }
            self.slot
                .current
                .store(entry_ptr.as_ptr() as usize, Ordering::Relaxed);
            if !self.slot.phase.enter_running() {
                crate::user::drop_quietly(permit);
                // `shutdown_now`: put the task back and leave the whole chain to the others
                // (through the global queue): a worker routing a lane may push onto the chain
                // until every worker has stopped, which `shutdown_now` waits for before it
                // drains the queues; a worker not stopped yet may still run the chain.
                // SAFETY: we own the chain, and `task` is the node we popped last.
                unsafe { chain.unpop(task.into_raw()) };
                self.shared.global.push(Runnable::Chain(entry_ptr));
                return After::Exit;
            }
            self.release_capacity();
            self.bump(|c| &c.started);
            task.run(permit, &|panicked| self.finish_task(panicked));
            ran += 1;
            match self.slot.phase.leave_running() {
                AfterTask::Continue => {}
                AfterTask::Stolen => return After::Exit, // the chain is not ours any more
                AfterTask::HandBack => {
                    // STOP without STOLEN: the chain is still ours; as above.
                    self.shared.global.push(Runnable::Chain(entry_ptr));
                    return After::Exit;
                }
            }
        }
    }

    /// Hands an unkeyed task back for `shutdown_now`.
    fn hand_back(&self, task: TaskRef) {
        lock(&self.shared.handback).push(PendingTask::new(None, task));
    }

    /// The chain was released: idle bookkeeping. `guard` was pinned before the release.
    fn released(&mut self, entry_ptr: NonNull<KeyEntry<K>>, guard: &crossbeam_epoch::Guard) {
        self.idle
            .released(self.shared, entry_ptr, guard, &mut self.now);
    }

    fn reap_idle(&mut self, all: bool) {
        if self.index == 0 {
            self.idle.adopt(lock(&self.shared.orphans).drain(..));
        }
        self.idle.reap(self.shared, self.now, all);
    }

    /// Hands every unlinked entry to the epoch now (before sleeping or exiting).
    fn flush_garbage(&mut self) {
        self.idle.flush(self.shared);
    }

    fn exit(mut self) {
        if self.shared.shutdown.load(Ordering::Acquire) {
            // Shutting down: release every idle key now rather than at the serializer's drop,
            // so `stats().active_keys` and memory reflect it after termination.
            self.now = self.shared.now_ms();
            self.reap_idle(true);
        }
        self.flush_garbage();
        if self.searching {
            self.shared.sleep.stop_searching();
            self.searching = false;
        }
        if !self.idle.is_empty() {
            if self.index == 0 {
                // Worker 0 exits only at shutdown: what is left (keys active again) is freed
                // with the table.
                self.idle.forget();
            } else {
                let items = self.idle.take_items();
                lock(&self.shared.orphans).extend(items);
            }
        }
        // Elastic slots are reused: give the deque and parker back.
        *lock(&self.slot.local) = self.owned.take();
        self.slot.alive.store(false, Ordering::Release);
        // Work that came while we left: wake a sleeper for it, or, if nobody is idle, start the
        // elastic clock (a submit that saw us still searching stamped nothing).
        let sh = self.shared;
        if !sh.stop.load(Ordering::Acquire) && sh.sleep.unattended(|| sh.has_visible_work()) {
            sh.starving();
        }
        self.shared.worker_exited();
    }
}

/// A lane's item, handed back as it is (no user code: the key is moved, not cloned).
fn pending<K>(item: Item<K>) -> PendingTask<K> {
    PendingTask::new(Some(item.key), item.task.into_task())
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
    for (i, other) in shared.slots.iter().enumerate() {
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

/// Pops every queued task of a chain we own.
///
/// # Safety
/// The caller owns the entry's chain.
pub(crate) unsafe fn drain_chain<K>(entry: &KeyEntry<K>, out: &mut Vec<TaskRef>) {
    let ks = entry.value();
    // Every caller runs after `shutdown_now` closed the gate, waited for the submissions inside
    // it and stopped every worker (the routers that push onto chains), so no push is half done
    // and `None` means the chain is empty.
    // SAFETY: per the contract; popped nodes are ours.
    while let Some(n) = unsafe { ks.chain.pop() } {
        // SAFETY: we own the chain and just popped `n`.
        out.push(unsafe { TaskRef::from_raw(n) });
    }
}
