//! Worker threads: find a runnable, drain a key's chain under the fairness budget, release or
//! requeue it, retire idle keys, sleep without losing wakeups, and stop cleanly.
//!
//! # Rooms
//!
//! - this file: the thread (its identity, `spawn`), the loop and what it found, counters, idle
//!   keys and exit;
//! - [`find`]: where work is found (lanes, the ready queues, stealing from a stuck sibling);
//! - [`serve`]: serving a lane (direct runs, routing, fairness, shedding, deferrals);
//! - [`steal`]: taking a lane over from an owner stuck in a task;
//! - [`chain`]: draining a key's chain, running an unkeyed task;
//! - [`park`]: spinning, napping and sleeping;
//! - [`hand_back`]: what a stopped worker hands back to `shutdown_now`.

mod chain;
mod find;
mod hand_back;
mod park;
mod serve;
mod steal;

use park::{NAP, NAP_ROUNDS, SPIN_ROUNDS};

use std::ptr::NonNull;
use std::sync::Arc;

use crossbeam_deque::Worker;
use keyserial_core::lane::Watch;

use crate::idle::IdleKeys;
use crate::key::{KeyEntry, Runnable};
use crate::shared::Shared;
use crate::slot::{Counters, Owned, Slot};
use crate::sync::{lock, Ordering};

/// If this thread is one of serializer `id`'s workers: its slot and local deque.
pub(crate) fn current_worker<K>(id: usize) -> Option<(usize, &'static Worker<Runnable<K>>)> {
    let (sid, slot, deque) = crate::running::current_worker_raw();
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

pub(crate) use crate::running::on_worker_of;

/// Starts the worker thread of `index`. The slot's deque and parker must be free.
pub(crate) fn spawn<K>(shared: &Arc<Shared<K>>, index: usize) -> std::io::Result<()>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let owned = lock(&shared.slots()[index].local)
        .take()
        .expect("a free slot has its deque");
    shared.slots()[index].alive.store(true, Ordering::Release);
    shared.lifecycle().worker_started();
    shared.sleep().start_searching();
    let s = shared.clone();
    let name = format!("{}-{}", shared.config().thread_name, index);
    let result = std::thread::Builder::new()
        .name(name)
        .spawn(move || WorkerLoop::new(&s, index, owned).run());
    match result {
        Ok(handle) => {
            shared.lifecycle().add_thread(handle);
            Ok(())
        }
        Err(e) => {
            shared.slots()[index].alive.store(false, Ordering::Release);
            shared.lifecycle().worker_ended();
            // This worker was counted as searching, so a submit meanwhile may have stamped
            // nothing: hand its work on as an exiting worker does.
            shared.sleep().stop_searching();
            if shared.sleep().unattended(|| shared.has_visible_work()) {
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
    /// This thread's registration with the key table's epoch collector.
    epoch: crossbeam_epoch::LocalHandle,
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
    /// When this worker last marked the lanes holding items (`steal.rs`).
    marked_at: std::time::Instant,
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
            slot: &shared.slots()[index],
            index,
            owned: Some(owned),
            idle: IdleKeys::new(),
            epoch: shared.register_epoch(),
            searching: true,
            home: (index < shared.config().workers).then_some((index, shared.config().workers)),
            turn: 0,
            watched: vec![None; shared.lanes().len()],
            seen_free: vec![false; shared.lanes().len()],
            watched_at: std::time::Instant::now(),
            marked_at: std::time::Instant::now(),
            tick: 0,
            now: shared.now_ms(),
            seen: vec![0; shared.slots().len()],
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
        crate::running::set_current_worker((self.shared.id(), self.index, deque_ptr));
        let sh = self.shared.clone();
        let stopped = move || sh.lifecycle().is_stopped();
        let stopped: &dyn Fn() -> bool = &stopped;
        // SAFETY: the slot and `stopped` outlive the main loop, and `enter`'s guard (dropped
        // right after the loop, also on unwind) clears the view before either goes.
        let here = unsafe {
            crate::running::enter(
                self.shared.id(),
                &self.slot.direct_hash,
                &self.slot.phase,
                stopped,
            )
        };
        self.main_loop();
        drop(here);
        crate::running::set_current_worker((0, 0, std::ptr::null()));
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
            let snapshot = self.shared.sleep().snapshot();
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
                .sleep()
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
            self.shared.sleep().woke(self.index);
            self.searching = true;
            self.now = self.shared.now_ms();
            self.reap_idle(false);
            if self.index >= self.shared.config().workers {
                let keep = self.shared.config().worker_keep_alive.as_millis() as u64;
                if self.now.saturating_sub(idle_since) >= keep
                    && self.idle.is_empty()
                    && !self.shared.has_visible_work()
                {
                    return; // an elastic worker idle past its keep-alive
                }
            }
        }
    }

    fn found(&mut self, w: Work<K>) -> After {
        if std::mem::take(&mut self.searching)
            && self.shared.sleep().stop_searching()
            && self
                .shared
                .sleep()
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
        if self.tick.is_multiple_of(64) {
            self.now = self.shared.now_ms();
            self.reap_idle(false);
        }
        if let After::Exit = after {
            self.leave_busy();
        }
        after
    }

    fn bump(&self, f: impl Fn(&Counters) -> &crate::sync::AtomicU64) {
        Counters::bump(f(&self.slot.counters));
    }

    fn release_capacity(&self) {
        self.shared.release_slot();
    }

    /// Whether a key whose task panicked is paused (`PanicPolicy::PauseKey`).
    #[inline]
    fn pauses_on_panic(&self) -> bool {
        self.shared.config().panic_policy == crate::PanicPolicy::PauseKey
    }

    fn finish_task(&self, panicked: bool) {
        if panicked {
            self.bump(|c| &c.panicked);
        }
        self.bump(|c| &c.completed);
    }

    /// The chain was released: idle bookkeeping. `guard` was pinned before the release.
    fn released(&mut self, entry_ptr: NonNull<KeyEntry<K>>, guard: &crossbeam_epoch::Guard) {
        self.idle
            .released(self.shared, entry_ptr, guard, &mut self.now);
    }

    fn reap_idle(&mut self, all: bool) {
        if self.index == 0 {
            self.idle.adopt(self.shared.lifecycle().adopt_orphans());
        }
        self.idle.reap(self.shared, &self.epoch, self.now, all);
    }

    /// Hands every unlinked entry to the epoch now (before sleeping or exiting).
    fn flush_garbage(&mut self) {
        self.idle.flush(self.shared, &self.epoch);
    }

    fn exit(mut self) {
        if self.shared.lifecycle().is_shutdown() {
            // Shutting down: release every idle key now rather than at the serializer's drop,
            // so `stats().active_keys` and memory reflect it after termination.
            self.now = self.shared.now_ms();
            self.reap_idle(true);
            crate::key_control::release_paused_states(self.shared);
        }
        self.flush_garbage();
        if self.searching {
            self.shared.sleep().stop_searching();
            self.searching = false;
        }
        if !self.idle.is_empty() {
            if self.index == 0 {
                // Worker 0 exits only at shutdown: what is left (keys active again) is freed
                // with the table.
                self.idle.forget();
            } else {
                let items = self.idle.take_items();
                self.shared.lifecycle().orphan(items);
            }
        }
        // Elastic slots are reused: give the deque and parker back.
        *lock(&self.slot.local) = self.owned.take();
        self.slot.alive.store(false, Ordering::Release);
        // Work that came while we left: wake a sleeper for it, or, if nobody is idle, start the
        // elastic clock (a submit that saw us still searching stamped nothing).
        let sh = self.shared;
        if !sh.lifecycle().is_stopped() && sh.sleep().unattended(|| sh.has_visible_work()) {
            sh.starving();
        }
        self.shared.worker_exited();
    }
}

pub(crate) use find::steal_into;
pub(crate) use hand_back::lane_items;
