//! Permit-gated tasks: a key's chain parks, without blocking any worker, until its head task's
//! permits are granted.
//!
//! # Protocol
//!
//! The worker that owns a chain pops a permit-gated task. If `try_acquire` succeeds, it runs the
//! task holding the permits. Otherwise it puts the task back at the front (`unpop`), registers a
//! wait ([`WaitRegistry::register`], hand-off word `WAITING`) in the serializer's registry
//! ([`PermitWaits`](crate::permit_wait::PermitWaits), `Shared::permit_waits`), and calls the semaphore's cancellable
//! `acquire_with`; from that call on, the chain's `ACTIVE` baton belongs to the wait, and the
//! worker never touches the chain again. Pushes to the key keep queueing behind the parked task
//! (the chain stays `ACTIVE`, so nobody schedules it), while other keys keep running. The worker
//! does all this while its phase is `BUSY` (`phase.rs`), so `shutdown_now`, which waits for
//! `BUSY` to end before it looks at the registry, never races a registration.
//!
//! The state machine and the registry live in `permit_wait.rs`, apart from the serializer:
//!
//! - [`Handoff`]: one word per wait, `WAITING`, then either `WAITING -> GRANTED -> SCHEDULED`
//!   or `WAITING -> STOLEN`, every step an RMW. [`Handoff::grant`] and [`Handoff::steal`] are the
//!   two competing CASes and return the [`Winner`]; [`Handoff::mark_scheduled`] and
//!   [`Handoff::wait_scheduled`] close the gap between a won grant and its chain being visible on
//!   a ready queue.
//! - [`WaitRegistry`](crate::permit_wait::WaitRegistry): the map of parked waits (and their id counter) under one mutex;
//!   [`WaitRegistry::grant`] is the callback's whole sequence, [`WaitRegistry::steal_all`] is
//!   `shutdown_now`'s. A wait carries a [`Parked`] value here (the key entry and the semaphore
//!   request). A pending future's parked chain uses the same registry and hand-off, with no
//!   semaphore request: its waker plays the grant callback (`future_task.rs`).
//!
//! Exactly one of two parties takes the baton from the wait, decided by one CAS on its word:
//!
//! - the **grant callback** (`WAITING -> GRANTED`): stores the permit in the head task, schedules
//!   the chain on a ready queue, then marks the wait `SCHEDULED` and removes it from the registry;
//! - **`shutdown_now`** (`WAITING -> STOLEN`): removes the wait, withdraws the semaphore request,
//!   drains the chain and hands its tasks back; a grant already on its way finds `STOLEN` and
//!   just drops the permit (returning it to the semaphore).
//!
//! If `shutdown_now` finds `GRANTED`, it waits for `SCHEDULED` (the callback runs no user code in
//! between; `SCHEDULED` is stored by an RMW after the ready-queue push and read with acquire) and
//! then finds the chain on a ready queue, which it drains next. A closed semaphore resolves the
//! head task as `Cancelled` (its permits can never come) and the key goes on.
//!
//! # Loom models
//!
//! `loom/tests/permits.rs` checks the real [`Handoff`] and [`WaitRegistry`](crate::permit_wait::WaitRegistry) (through
//! `keyserial::loom_api`), with a stand-in chain, permit count and ready queue:
//!
//! - `grant_racing_steal_hands_the_baton_to_exactly_one`: a grant callback holding a permit
//!   races `steal_all`; exactly one takes the baton, the loser's permit goes back, and the
//!   registry ends empty;
//! - `steal_finding_granted_waits_until_the_chain_is_scheduled`: `steal_all` meets a grant
//!   between its CAS and its ready-queue push, and when it returns the chain is in the queue;
//! - `grants_racing_steal_all_handle_every_wait_once`: two waits, each granted (and removed) by
//!   its own thread while `steal_all` walks the registry; every wait ends stolen or scheduled,
//!   exactly once.
//!
//! [`Handoff`]: crate::permit_wait::Handoff
//! [`Handoff::grant`]: crate::permit_wait::Handoff::grant
//! [`Handoff::steal`]: crate::permit_wait::Handoff::steal
//! [`Handoff::mark_scheduled`]: crate::permit_wait::Handoff::mark_scheduled
//! [`Handoff::wait_scheduled`]: crate::permit_wait::Handoff::wait_scheduled
//! [`Winner`]: crate::permit_wait::Winner
//! [`WaitRegistry::register`]: crate::permit_wait::WaitRegistry::register
//! [`WaitRegistry::grant`]: crate::permit_wait::WaitRegistry::grant
//! [`WaitRegistry::steal_all`]: crate::permit_wait::WaitRegistry::steal_all

use std::ptr::NonNull;
use std::sync::{Arc, Weak};

use crate::key::{KeyEntry, Runnable};
use crate::owner::Owned;
use crate::permit_wait::{Parked, PermitWait};
use crate::semaphore::{AcquireError, Permit};
use crate::shared::Shared;
use crate::sync::{lock, Mutex};
use crate::task::{Abandon, TaskRef};

pub(crate) enum PermitOutcome<K> {
    /// Run the task with these permits (the baton is still ours).
    Run(Owned<K>, TaskRef, Option<Permit>),
    /// The chain is parked; its baton belongs to the permit's wait.
    Parked,
    /// The task was resolved without running (closed semaphore); the baton is still ours.
    Dropped(Owned<K>),
}

/// Called by the chain's owner on a popped permit-gated task.
pub(crate) fn acquire_or_park<K>(
    shared: &Arc<Shared<K>>,
    owned: Owned<K>,
    mut task: TaskRef,
) -> PermitOutcome<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    if let Some(p) = task.take_granted() {
        return PermitOutcome::Run(owned, task, Some(p));
    }
    let (sem, n) = task
        .permits()
        .expect("a permit-gated task knows its semaphore");
    match sem.try_acquire(n) {
        Ok(p) => PermitOutcome::Run(owned, task, Some(p)),
        Err(AcquireError::Closed) | Err(AcquireError::TooMany) => {
            task.abandon(Abandon::Cancelled);
            PermitOutcome::Dropped(owned)
        }
        Err(_) => {
            // SAFETY: the caller just popped `task`: the last popped.
            unsafe { owned.put_back(task) };
            let wait = shared.permit_waits().register(Parked {
                entry: owned.into_ptr(),
                token: Mutex::new(None),
                why: crate::permit_wait::ParkedFor::Permits,
            });
            let weak = Arc::downgrade(shared);
            // From here on the baton belongs to the wait.
            let w = wait.clone();
            if let Some(token) = sem.acquire_with_cancellable(n, move |res| on_grant(weak, w, res))
            {
                *lock(&wait.value().token) = Some(token);
            }
            PermitOutcome::Parked
        }
    }
}

fn on_grant<K>(
    weak: Weak<Shared<K>>,
    wait: crate::sync::Arc<PermitWait<Parked<K>>>,
    res: Result<Permit, AcquireError>,
) where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let Some(shared) = weak.upgrade() else {
        return; // the serializer is gone; the permit (if any) goes back on drop
    };
    // On `Winner::Steal`, shutdown_now took the chain; dropping `res` returns the permits.
    shared.permit_waits().grant(&wait, |parked| {
        // SAFETY: winning the grant took the baton from the permit's wait.
        let owned = unsafe { Owned::assume(parked.entry) };
        let mut task = owned.pop().expect("the parked task is at the head");
        match res {
            Ok(permit) => {
                task.set_granted(permit);
                // SAFETY: just popped.
                unsafe { owned.put_back(task) };
            }
            Err(_) => {
                owned.entry().value().seen.left(1);
                task.abandon(Abandon::Cancelled);
                shared.count_dropped_outside(1);
                shared.release_slot();
            }
        }
        shared.schedule(Runnable::Chain(owned.into_ptr()), None);
    });
}

/// `shutdown_now`: takes every parked chain whose grant has not arrived; returns their entries
/// (the caller drains them). Waits for grants in progress to reach a ready queue.
pub(crate) fn steal_all<K>(shared: &Shared<K>) -> Vec<NonNull<KeyEntry<K>>> {
    let mut stolen = Vec::new();
    shared.permit_waits().steal_all(|parked| {
        // Withdraw the request so it does not hold up the semaphore's queue. If the grant is
        // already on its way, its callback finds STOLEN and returns the permits.
        if let Some(token) = lock(&parked.token).take() {
            token.cancel();
        }
        stolen.push(parked.entry);
    });
    stolen
}
