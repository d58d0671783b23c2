//! Worker threads: find a runnable, drain a key's chain under the fairness budget, release or
//! requeue it, retire idle keys, sleep without losing wakeups, and stop cleanly.
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

use crate::idle::IdleKeys;
use crate::key::{KeyEntry, Runnable};
use crate::pending::PendingTask;
use crate::permits::PermitOutcome;
use crate::phase::AfterTask;
use crate::shared::Shared;
use crate::slot::{Counters, Owned, Slot};
use crate::sync::{lock, Ordering};
use crate::task::{Abandon, Kind, TaskRef};

/// How many rounds an idle worker spins (re-searching) before it parks.
const SPIN_ROUNDS: u32 = 16;

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
    tick: u32,
    now: u64,
    /// Each slot's `started` count at the previous periodic check (see "Finding work").
    seen: Vec<u64>,
}

enum After {
    Continue,
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
            while let Some(r) = self.find_work() {
                spins = 0;
                if let After::Exit = self.found(r) {
                    return;
                }
                idle_since = self.now;
            }
            if self.leave_busy() {
                return;
            }
            if spins < SPIN_ROUNDS {
                spins += 1;
                if spins > 6 {
                    std::thread::yield_now();
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
            if let Some(r) = self.find_work() {
                if let After::Exit = self.found(r) {
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
            self.owned
                .as_ref()
                .expect("parker")
                .parker
                .park_timeout(timeout);
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

    fn found(&mut self, r: Runnable<K>) -> After {
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
        let after = match r {
            Runnable::Chain(entry) => self.run_chain(entry),
            Runnable::Task(task) => self.run_unkeyed(task),
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

    fn find_work(&mut self) -> Option<Runnable<K>> {
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
            self.hand_back(None, vec![task]);
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
            let popped = unsafe {
                chain.pop_coalescing(|n| matches!(TaskRef::kind_of(n), Kind::Latest | Kind::Marker))
            };
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
            // SAFETY: we own the chain and just popped the node.
            let Some(mut task) = (unsafe { ks.popped(p.node) }) else {
                continue;
            };
            if p.superseded {
                task.abandon(Abandon::Superseded);
                self.bump(|c| &c.dropped);
                self.release_capacity();
                continue;
            }
            let mut permit = None;
            match task.kind() {
                Kind::Distinct => ks.distinct.store(false, Ordering::Release),
                Kind::Permits => {
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
                _ => {}
            }
            self.slot
                .current
                .store(entry_ptr.as_ptr() as usize, Ordering::Relaxed);
            if !self.slot.phase.enter_running() {
                drop(permit);
                let mut tasks = vec![task];
                // SAFETY: we still own the chain.
                unsafe { drain_chain(entry, &mut tasks) };
                self.hand_back(Some(entry), tasks);
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
                    let mut tasks = Vec::new();
                    // SAFETY: STOP without STOLEN: we still own the chain.
                    unsafe { drain_chain(entry, &mut tasks) };
                    self.hand_back(Some(entry), tasks);
                    return After::Exit;
                }
            }
        }
    }

    /// Hands tasks back for `shutdown_now`.
    fn hand_back(&self, entry: Option<&KeyEntry<K>>, tasks: Vec<TaskRef>) {
        let key = entry.map(|e| e.key().clone());
        let mut hb = lock(&self.shared.handback);
        for t in tasks {
            hb.push(PendingTask::new(key.clone(), t));
        }
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
    // Every caller runs after `shutdown_now` closed the gate and waited for the submissions
    // inside it, so no push is half done and `None` means the chain is empty.
    // SAFETY: per the contract; popped nodes are ours.
    while let Some(n) = unsafe { ks.chain.pop() } {
        // SAFETY: we own the chain and just popped `n`.
        out.extend(unsafe { ks.popped(n) });
    }
}
