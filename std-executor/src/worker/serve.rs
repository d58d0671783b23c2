//! Serving a lane: pop its items in order, run them, route them, and give the lane up.
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

use std::ptr::NonNull;

use keyserial_core::lane::Ended;

use super::{After, Direct, WorkerLoop};
use crate::deferral::Deferral;
use crate::lane_task::{Item, LaneTask};
use crate::lanes::KeyPanicked;
use crate::phase::AfterTask;
use crate::route::{route, Route, Track};
use crate::sync::Ordering;
use crate::task::Kind;

/// A lane's owner looks for an idle sibling once every this many items it pops (see "Sharing a
/// lane with an idle worker").
pub(super) const SHED_EVERY: usize = 64;

/// A lane's owner sheds keys only while the items it popped since its last look came from at
/// most this many keys (the tracked counts' 64 hash buckets, `lanes.rs`; see "Sharing a lane
/// with an idle worker"). W2's lanes (250 keys each) show about 40 in 64 pops; a lane of a few
/// busy keys, a handful.
pub(super) const FEW_KEYS: u32 = 16;

impl<K> WorkerLoop<'_, K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Serves lane `l`, which this worker owns: pops and routes its items until the lane is
    /// empty, the budget is spent, or the lane is taken while a task runs. Items that run
    /// directly without routing run under one `RUNNING` section (see "Runs of direct tasks").
    pub(super) fn serve(&mut self, l: usize) -> After {
        let sh = self.shared;
        let lane = sh.lanes().get(l);
        let fair = sh.config().fairness_budget;
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
            // A task whose key's `Hash` panics is failed here and the next one popped.
            let failed = |k: KeyPanicked| self.fail_task(k.task, k.payload);
            let Some(item) = (unsafe { lane.pop(failed) }) else {
                if std::mem::take(&mut in_run) && self.end_run() {
                    return self.stop_holding_lane(l, None);
                }
                if lane.release_or_keep(self.index) {
                    continue;
                }
                return After::Continue;
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
                    && !sh.lanes().free_work_except(l);
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
            let Some(item) = lane.divert(item, hash, || sh.now_ms()) else {
                routed += 1;
                continue;
            };
            let local = self.owned.as_ref().map(|o| &o.deque);
            let track = match (shed_now, hot) {
                (true, _) => Track::Shed,
                (false, true) => Track::Hot,
                (false, false) => Track::AsIs,
            };
            let item = match route(sh, item, hash, local, track, &self.epoch) {
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
    pub(super) fn sibling_idle(&self) -> bool {
        let sh = self.shared;
        sh.slots()[..sh.config().workers]
            .iter()
            .enumerate()
            .any(|(i, s)| i != self.index && s.phase.is_idle())
    }

    /// Whether the item popped from lane `l` runs as it is, with nothing to look up: no
    /// deferral for its key, a plain task, no tracked key in the lane's bucket of its hash
    /// (`route.rs` would send it `Direct` without touching anything).
    #[inline]
    pub(super) fn runs_directly(&self, l: usize, item: &Item<K>) -> bool {
        let lanes = &self.shared.lanes();
        lanes.get(l).deferrals.passes(item.hash)
            && item.task.kind() == Kind::Plain
            && !lanes.tracked.any(l, item.hash)
    }

    /// Leaves the `RUNNING` section of a run; `true` if `shutdown_now` stopped the worker
    /// meanwhile (it then hands back what it holds).
    pub(super) fn end_run(&self) -> bool {
        self.slot.phase.leave_running() != AfterTask::Continue
    }

    /// `shutdown_now` stopped the worker while it owns lane `l` (`OWNED`) and perhaps holds an
    /// item popped from it: hands both back and exits.
    pub(super) fn stop_holding_lane(&self, l: usize, item: Option<Item<K>>) -> After {
        self.hand_back_lane_with(l, item);
        After::Exit
    }

    /// Runs a task popped from lane `l` inside the open run (the slot is `RUNNING`); leaves the
    /// run open unless the lane was taken while the task ran.
    #[inline(always)]
    pub(super) fn run_in_run(&mut self, l: usize, item: Item<K>, hash: u64) -> Direct {
        match self.run_item(Some(l), item, hash) {
            Some(Ended::Stolen(p)) => {
                let after = self.slot.phase.leave_running();
                self.after_steal(p, after)
            }
            _ => Direct::Continue,
        }
    }

    /// Runs a routed item's task on this thread: from lane `lane`, which this worker owns, or
    /// (`None`) from a deferral it runs.
    pub(super) fn run_direct(&mut self, lane: Option<usize>, item: Item<K>, hash: u64) -> Direct {
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

    /// `run_direct` once the slot is `RUNNING` (`enter_running` succeeded): runs the task and
    /// leaves `RUNNING`.
    pub(super) fn run_entered(&mut self, lane: Option<usize>, item: Item<K>, hash: u64) -> Direct {
        let ended = self.run_item(lane, item, hash);
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

    /// The one run function of a task taken from a lane (`lane`, which this worker owns) or a
    /// deferral (`None`), with the slot `RUNNING`: gives back its capacity slot, counts it
    /// started, moves the lane's word into the task (`begin`: a thief may take the lane while
    /// it runs) and out of it (`end`), runs it (its handle resolves after the counters), and
    /// drops the key. Returns how the lane's word ended (`None` without a lane).
    #[inline(always)]
    fn run_item(
        &mut self,
        lane: Option<usize>,
        item: Item<K>,
        hash: u64,
    ) -> Option<Ended<Deferral<K>>> {
        let sh = self.shared;
        let Item { key, task, .. } = item;
        self.release_capacity();
        self.bump(|c| &c.started);
        self.slot.direct_hash.store(hash | 1, Ordering::Relaxed);
        let word = lane.map(|l| &sh.lanes().get(l).word);
        let run = word.map(|w| w.begin(self.index, hash as usize));
        task.run(&|panicked| {
            self.finish_task(panicked);
            if panicked && self.pauses_on_panic() {
                // Before the handle resolves: the key's later items, routed after this task,
                // find it paused (`control.rs`).
                crate::key_control::pause(sh, &key);
            }
        });
        let ended = word
            .zip(run)
            .map(|(w, run)| w.end(run, sh.mailbox(self.index).expect("a worker has a mailbox")));
        crate::user::drop_quietly(key);
        ended
    }

    /// The lane was taken while a task ran (`p`: what the thief offered) and the slot has left
    /// `RUNNING` (`after`): runs the deferral the thief built, unless `shutdown_now` took the lane
    /// or stopped the worker.
    pub(super) fn after_steal(&mut self, p: NonNull<Deferral<K>>, after: AfterTask) -> Direct {
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
    pub(super) fn run_deferral(&mut self, d: &Deferral<K>) -> bool {
        loop {
            let mut next = d.lock();
            let Some(item) = next.pop_front() else {
                next.close();
                return false;
            };
            let local = self.owned.as_ref().map(|o| &o.deque);
            let hash = item.hash;
            let item = match route(self.shared, item, hash, local, Track::AsIs, &self.epoch) {
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
            // The key's running task is announced before the deferral's lock is let go: a
            // handed-back state task's run (`handed_back.rs`) that visits the deferral under
            // its lock then sees it (`key_control::running_direct`).
            self.slot.direct_hash.store(hash | 1, Ordering::Relaxed);
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

    /// Fails a task whose key's code (`Hash`, `Eq`, `Clone`) panicked on its way to running
    /// (`user.rs`): it counts as started and ended by a panic, its capacity slot comes back,
    /// and its handle resolves `Panicked` with the payload (after the counters, as for a task
    /// that ran).
    #[cold]
    pub(super) fn fail_task(&self, task: LaneTask, payload: crate::user::Payload) {
        self.release_capacity();
        self.bump(|c| &c.started);
        self.finish_task(true);
        task.fail(payload);
    }
}
