//! Admission: how a submission gets in.
//!
//! # Admission
//!
//! A submission is *admitted* (it will run or be handed back) at one atomic step, so that
//! `shutdown` can say which submissions got in:
//!
//! - **A keyed task** (`execute`, `submit`, `submit_distinct`, `submit_with_permits`) by the
//!   reserving CAS of its slot in its key's lane (`core::fifo`): no other shared word is
//!   written. `shutdown` closes every lane's FIFO (a `fetch_or` of a bit of its tail position),
//!   so each such CAS comes before the close (the task is in the lane, counted by the lane's
//!   position) or fails and reads the bit (the task is handed back untouched, and a distinct
//!   claim is released).
//! - **An unkeyed task, and a `submit_latest` task** (which may replace its key's pending one
//!   instead of pushing) by the gate (`gate.rs`): `enter` before, `admit` after. A latest task
//!   that pushed leaves the gate uncounted (its lane counts it).
//!
//! `shutdown` closes the gate, waits for the submissions inside it to finish (their pushes
//! cannot be refused: no lane is closed yet), then closes the lanes and only then says so
//! (`Lanes::is_closed`, Release). Admitted = the gate's count + the lanes' positions. A worker
//! leaves on shutdown only after it has seen the lanes closed (Acquire): every admitted keyed
//! task is then visible to its emptiness checks (a reserved slot counts), so none is left
//! behind.

use std::hash::Hash;

use crate::capacity::Reservation;
use crate::claims::Claim;
use std::future::Future;

use crate::error::{RejectReason, Rejected};
use crate::future_task;
use crate::handle::{JoinState, OriginCheck, TaskHandle};
use crate::key::{KeyState, Runnable};
use crate::key_budget::{KeyBudget, KeyShare};
use crate::lane_task::Item;
use crate::lane_task::LaneTask;
use crate::lanes::TrackToken;
use crate::latest_cells::Offered;
use crate::semaphore::Semaphore;
use crate::task::{Abandon, Joined, Kind, TaskRef};
use crate::worker;
use keyserial_core::chain::{Pushed, Retired};

use super::{Mode, Serializer};

impl<K, S> Serializer<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    pub(super) fn submit_joined<F, T>(
        &self,
        key: Option<K>,
        task: F,
        kind: Kind,
        mode: Mode,
        permits: Option<(Semaphore, usize)>,
    ) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        debug_assert!(kind != Kind::Distinct, "distinct tasks carry their claim");
        self.submit_job(key, task, kind, mode, permits, |f, _| f)
    }

    /// `submit_joined` for any job closure `G` made from the user's `F` and, for a distinct
    /// task, its key's claim (`wrap`, called only once the task is sure to be admitted).
    pub(super) fn submit_job<F, T, G>(
        &self,
        key: Option<K>,
        task: F,
        kind: Kind,
        mode: Mode,
        permits: Option<(Semaphore, usize)>,
        wrap: impl FnOnce(F, Option<Claim<K>>) -> G,
    ) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: Send + 'static,
        G: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let mut slot = Some(task);
        let mut handle = None;
        let mut permits = permits;
        let mut origin = Some(self.origin_of(key.as_ref(), kind));
        let sh = &*self.shared;
        let traced = crate::trace::origin(sh.labeler(), key.as_ref(), |k| sh.hash_of(k));
        self.admit(key, kind, mode, |claim| {
            let state = JoinState::new(origin.take().unwrap_or_default());
            handle = Some(TaskHandle::new(state.clone()));
            let job = Joined {
                f: crate::trace::wrap(traced, wrap(slot.take().expect("built once"), claim)),
                state,
            };
            LaneTask::node(TaskRef::new(job, kind, permits.take()))
        })
        .map(|()| handle.take().expect("handle made with the task"))
        .map_err(|reason| Rejected {
            reason,
            task: slot.take().expect("refused before the task was built"),
        })
    }

    /// `execute_async`: as `submit_future`, without a handle.
    pub(super) fn execute_future<Fut>(&self, key: K, fut: Fut) -> Result<(), Rejected<Fut>>
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut slot = Some(fut);
        let sh = &*self.shared;
        let traced = crate::trace::origin(sh.labeler(), Some(&key), |k| sh.hash_of(k));
        self.admit(Some(key), Kind::Future, Mode::Block, |_| {
            let fut = crate::trace::wrap_future(traced, slot.take().expect("built once"));
            LaneTask::node(future_task::make::<_, K>(fut, None))
        })
        .map_err(|reason| Rejected {
            reason,
            task: slot.take().expect("refused before the task was built"),
        })
    }

    /// `submit_async` / `try_submit_async`: the future becomes a node of kind `Future`
    /// (`future_task.rs`), admitted like any keyed task.
    pub(super) fn submit_future<Fut>(
        &self,
        key: K,
        fut: Fut,
        mode: Mode,
    ) -> Result<TaskHandle<Fut::Output>, Rejected<Fut>>
    where
        Fut: Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        let mut slot = Some(fut);
        let mut handle = None;
        let mut origin = Some(self.origin_of(Some(&key), Kind::Future));
        let sh = &*self.shared;
        let traced = crate::trace::origin(sh.labeler(), Some(&key), |k| sh.hash_of(k));
        self.admit(Some(key), Kind::Future, mode, |_| {
            let state = JoinState::new(origin.take().unwrap_or_default());
            handle = Some(TaskHandle::new(state.clone()));
            let fut = crate::trace::wrap_future(traced, slot.take().expect("built once"));
            LaneTask::node(future_task::make::<_, K>(fut, Some(state)))
        })
        .map(|()| handle.take().expect("handle made with the task"))
        .map_err(|reason| Rejected {
            reason,
            task: slot.take().expect("refused before the task was built"),
        })
    }

    /// The one admission path: capacity, then the admission itself (see "Admission" in the
    /// module docs), the distinct claim, the push. `build` makes the task (given its claim, for
    /// a distinct task); it runs only once the task is sure to be accepted, so a refusal hands
    /// back the untouched closure, and it runs no user code (it is called with a lane slot
    /// reserved, which must be filled).
    ///
    /// The key's `Hash`, `Eq` and `Clone` run here, on the caller's thread, before anything is
    /// admitted: a panic in them reaches the caller, and the capacity slot (a
    /// [`Reservation`]), a distinct claim and a gate ticket are all given back as it unwinds.
    pub(super) fn admit(
        &self,
        key: Option<K>,
        kind: Kind,
        mode: Mode,
        build: impl FnOnce(Option<Claim<K>>) -> LaneTask,
    ) -> Result<(), RejectReason> {
        let sh = &*self.shared;
        let refuse = |reason| {
            sh.count_rejected();
            crate::trace::rejected(reason);
            Err(reason)
        };
        if sh.lifecycle().is_shutdown() {
            return refuse(RejectReason::Shutdown);
        }
        let reservation = match &sh.capacity() {
            None => Reservation::unlimited(),
            Some(cap) => {
                let ok = if worker::current_worker::<K>(sh.id()).is_some() {
                    cap.force_reserve();
                    true
                } else if mode == Mode::Try {
                    cap.try_reserve()
                } else {
                    cap.reserve(|| sh.gate().is_closed() || sh.lifecycle().is_shutdown())
                };
                if !ok {
                    let shut = sh.lifecycle().is_shutdown();
                    let reason = if shut {
                        RejectReason::Shutdown
                    } else {
                        RejectReason::Full
                    };
                    return refuse(reason);
                }
                Reservation::taken(cap)
            }
        };
        let Some(key) = key else {
            // An unkeyed task is admitted by the gate.
            let Some(ticket) = sh.gate().enter() else {
                return refuse(RejectReason::Shutdown);
            };
            let local = worker::current_worker::<K>(sh.id()).map(|(_, d)| d);
            sh.schedule(Runnable::Task(build(None).into_task()), local);
            reservation.keep();
            ticket.admit();
            return Ok(());
        };
        let hash = sh.hash_of(&key);
        if sh.budget().is_some() {
            return self.admit_budgeted(key, hash, kind, mode, build, reservation, refuse);
        }
        if kind == Kind::Latest {
            return self.admit_latest(key, hash, build, reservation, refuse);
        }
        // Keep-first: a `submit_distinct` claims its key until its task starts (`claims.rs`).
        let claim = if kind == Kind::Distinct {
            match sh.claims().claim(&key, hash) {
                Some(claim) => Some(claim),
                None => return refuse(RejectReason::Duplicate),
            }
        } else {
            None
        };
        // Every keyed task enters through its key's lane, in submission order (`lanes.rs`),
        // and is admitted by the reservation of its slot. The item is built in that slot once
        // reserved (`Fifo::try_push_tagged`): key clones and hashing, which run user code that
        // may panic, come before. (The lane's owner hashes the key again when it pops it,
        // `Lane::pop`.)
        let mut parts = Some((key, claim));
        let pushed = sh.push_keyed(hash, || {
            let (key, claim) = parts.take().expect("built once");
            Item {
                key,
                hash,
                task: build(claim),
            }
        });
        if pushed.is_err() {
            // The key and the claim (released as it drops) go back with the refusal.
            drop(parts);
            return refuse(RejectReason::Shutdown);
        }
        reservation.keep();
        sh.latest().seal(hash);
        Ok(())
    }

    /// `admit` with a key budget (`key_budget.rs`, "How a serializer with a key budget runs"):
    /// the task goes straight onto its key's chain, admitted by the gate. A new key takes a
    /// share of the budget before its entry is made: at the limit it releases the oldest idle
    /// key, then waits (`submit` from outside the workers) or is refused `TooManyKeys`. A
    /// `submit_latest` task is pushed like any other, and coalesces on the chain (its owner's
    /// coalescing pop supersedes a latest task followed by another).
    ///
    /// The key's `Hash`, `Eq` and `Clone` run before anything is admitted, as in `admit`.
    #[allow(clippy::too_many_arguments)]
    fn admit_budgeted(
        &self,
        key: K,
        hash: u64,
        kind: Kind,
        mode: Mode,
        build: impl FnOnce(Option<Claim<K>>) -> LaneTask,
        reservation: Reservation<'_>,
        refuse: impl Fn(RejectReason) -> Result<(), RejectReason>,
    ) -> Result<(), RejectReason> {
        let sh = &*self.shared;
        let budget = sh.budget().expect("a serializer with a key budget");
        let Some(ticket) = sh.gate().enter() else {
            return refuse(RejectReason::Shutdown);
        };
        let claim = if kind == Kind::Distinct {
            match sh.claims().claim(&key, hash) {
                Some(claim) => Some(claim),
                None => return refuse(RejectReason::Duplicate),
            }
        } else {
            None
        };
        let local = worker::current_worker::<K>(sh.id()).map(|(_, d)| d);
        let lane = sh.lanes().index_of(hash);
        let epoch = sh.register_epoch();
        let mut guard = epoch.pin();
        let mut entry = loop {
            match entry_of(sh, &key, lane, hash, &guard, None) {
                Ok(e) if !e.value().chain.is_retired() => break e,
                Ok(_) => continue, // released under us: again
                Err(()) => {}
            }
            // At the limit: make room from the idle keys, else wait or refuse. Not from inside
            // a release hook, whose caller may hold the idle keys' FIFO: refused, as in a task.
            let in_hook = crate::state::in_release_hook();
            if !in_hook && crate::idle::release_one_idle(sh) {
                continue;
            }
            if mode == Mode::Try || local.is_some() || in_hook {
                return refuse(RejectReason::TooManyKeys);
            }
            if sh.gate().is_closed() || sh.lifecycle().is_shutdown() {
                return refuse(RejectReason::Shutdown);
            }
            // Unpinned while it waits, so that the epoch can free what others retire.
            drop(guard);
            budget.wait_a_little(std::time::Duration::from_millis(10));
            guard = epoch.pin();
        };
        let mut node = build(claim).into_task().into_raw();
        loop {
            let ks = entry.value();
            ks.seen.pushed(|| sh.now_ms());
            // SAFETY: a live task node we own (just made, or handed back by a bounced push):
            // queued nowhere else; the chain hands it to its owner or `Header::drop_queued`.
            match unsafe { ks.chain.push(node) } {
                Ok(Pushed::Activated) => {
                    sh.schedule(Runnable::Chain(std::ptr::NonNull::from(entry)), local);
                    break;
                }
                Ok(Pushed::Queued) => break,
                Err(Retired(back)) => {
                    // Released between the look-up and the push (an idle release): onto the
                    // key's new entry. The task is built and goes in, so its share is taken
                    // even past the limit (this race, and only it, may exceed it by one).
                    ks.seen.left(1);
                    node = back;
                    entry = loop {
                        let share = KeyBudget::try_take(budget)
                            .unwrap_or_else(|| KeyBudget::force_take(budget));
                        match entry_of(sh, &key, lane, hash, &guard, Some(share)) {
                            Ok(e) if !e.value().chain.is_retired() => break e,
                            _ => continue,
                        }
                    };
                }
            }
        }
        reservation.keep();
        ticket.admit();
        Ok(())
    }

    /// `admit` for a `submit_latest` task: it may replace its key's pending one instead of
    /// being pushed (`latest_cells.rs`), so it is admitted by the gate, and its push (when
    /// there is one) cannot be refused: lanes close only once the gate is idle.
    pub(super) fn admit_latest(
        &self,
        key: K,
        hash: u64,
        build: impl FnOnce(Option<Claim<K>>) -> LaneTask,
        reservation: Reservation<'_>,
        refuse: impl Fn(RejectReason) -> Result<(), RejectReason>,
    ) -> Result<(), RejectReason> {
        let sh = &*self.shared;
        let Some(ticket) = sh.gate().enter() else {
            return refuse(RejectReason::Shutdown);
        };
        // The key's `Clone` for the lane item, before anything is offered (user code: a
        // panic here gives back the ticket and the reservation).
        let mut lane_key = Some(key.clone());
        let task = build(None);
        let push = |cell| {
            let key = lane_key.take().expect("pushed once");
            let pushed = sh.push_keyed(hash, || Item {
                key,
                hash,
                task: LaneTask::node(cell),
            });
            assert!(pushed.is_ok(), "a lane closed while the gate was open");
        };
        let offered = sh.latest().offer(key, hash, task.into_task(), push);
        // Unused when the task replaced its key's pending one: the user's `Drop`, contained.
        crate::user::drop_quietly(lane_key);
        match offered {
            Offered::Replaced(old) => {
                old.abandon(Abandon::Superseded);
                sh.count_dropped_outside(1);
                // The replaced task's slot is the new task's: give back the one reserved.
                drop(reservation);
                // No push: the gate counts this one.
                ticket.admit();
            }
            // Pushed: its lane counts it.
            Offered::Pushed => {
                reservation.keep();
                drop(ticket);
            }
        }
        Ok(())
    }

    /// What a handle needs to catch a wait on a later task of the caller's own key
    /// (`handle::SelfWait`). Not for `submit_latest` tasks, which can also resolve by being
    /// superseded while the caller waits. Runs the key's `Hash` (user code) on the caller.
    pub(super) fn origin_of(&self, key: Option<&K>, kind: Kind) -> OriginCheck {
        let key = key.filter(|_| kind != Kind::Latest)?;
        Some(crate::handle::SelfWait {
            serializer: self.shared.id(),
            key: self.shared.hash_of(key) | 1,
        })
    }
}

/// With a key budget: the key's live entry, or a new one holding a share of the budget (`share`,
/// or one taken now if the budget has room; `Err` if it has none). A share not used goes back.
fn entry_of<'g, K>(
    sh: &'g crate::shared::Shared<K>,
    key: &K,
    lane: usize,
    hash: u64,
    guard: &'g crossbeam_epoch::Guard,
    share: Option<KeyShare>,
) -> Result<&'g crate::key::KeyEntry<K>, ()>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    if let Some(e) = live_entry(sh, key, guard) {
        return Ok(e);
    }
    let budget = sh.budget().expect("a serializer with a key budget");
    let Some(share) = share.or_else(|| KeyBudget::try_take(budget)) else {
        return Err(());
    };
    let mut share = Some(share);
    Ok(sh.table().get_or_insert_with(
        key.clone(),
        || {
            KeyState::new(
                TrackToken::new(&sh.lanes().tracked, lane, hash),
                share.take().expect("made once"),
            )
        },
        guard,
    ))
}

/// The key's entry in the table if it is live (not retired).
fn live_entry<'g, K>(
    sh: &'g crate::shared::Shared<K>,
    key: &K,
    guard: &'g crossbeam_epoch::Guard,
) -> Option<&'g crate::key::KeyEntry<K>>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    sh.table()
        .get(key, guard)
        .filter(|e| !e.value().chain.is_retired())
}
