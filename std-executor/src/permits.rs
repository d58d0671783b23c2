//! Permit-gated tasks: a key's chain parks, without blocking any worker, until its head task's
//! permits are granted.
//!
//! # Protocol
//!
//! The worker that owns a chain pops a permit-gated task. If `try_acquire` succeeds, it runs the
//! task holding the permits. Otherwise it puts the task back at the front (`unpop`), records a
//! [`Wait`] (state `WAITING`) in the serializer's registry, and calls the semaphore's cancellable
//! `acquire_with`; from that
//! call on, the chain's `ACTIVE` baton belongs to the wait, and the worker never touches the chain
//! again. Pushes to the key keep queueing behind the parked task (the chain stays `ACTIVE`, so
//! nobody schedules it), while other keys keep running.
//!
//! Exactly one of two parties takes the baton from the wait, decided by one CAS on its state:
//!
//! - the **grant callback** (`WAITING -> GRANTED`): stores the permit in the head task, schedules
//!   the chain on a ready queue, then marks the wait `QUEUED` and removes it from the registry;
//! - **`shutdown_now`** (`WAITING -> STOLEN`): withdraws the semaphore request, drains the chain
//!   and hands its tasks back; a grant already on its way finds `STOLEN` and just drops the
//!   permit (returning it to the semaphore).
//!
//! If `shutdown_now` finds `GRANTED`, it waits for `QUEUED` (the callback runs no user code in
//! between) and then finds the chain on a ready queue. A closed semaphore resolves the head task as
//! `Cancelled` (its permits can never come) and the key goes on.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Weak};

use crate::semaphore::{AcquireError, Permit, WaiterToken};
use crate::shared::{KeyEntry, Runnable, Shared};
use crate::sync::{lock, AtomicU8, Mutex, Ordering};
use crate::task::{Abandon, TaskRef};

const WAITING: u8 = 0;
const GRANTED: u8 = 1;
const QUEUED: u8 = 2;
const STOLEN: u8 = 3;

pub(crate) struct Wait<K> {
    state: AtomicU8,
    entry: NonNull<KeyEntry<K>>,
    /// The semaphore-side request, so `shutdown_now` can withdraw it from the queue.
    token: Mutex<Option<WaiterToken>>,
}

// SAFETY: the entry pointer is only dereferenced by whoever holds the chain's baton (decided by
// the state CAS); entries are Sync.
unsafe impl<K: Send + Sync> Send for Wait<K> {}
// SAFETY: as above.
unsafe impl<K: Send + Sync> Sync for Wait<K> {}

/// The chains parked on permits.
pub(crate) struct Waits<K> {
    next: u64,
    map: HashMap<u64, Arc<Wait<K>>>,
}

impl<K> Default for Waits<K> {
    fn default() -> Self {
        Waits {
            next: 0,
            map: HashMap::new(),
        }
    }
}

pub(crate) enum Gate {
    /// Run the task with these permits.
    Run(TaskRef, Option<Permit>),
    /// The chain is parked; the worker must not touch it again.
    Parked,
    /// The task was resolved without running (closed semaphore).
    Dropped,
}

/// Called by the chain's owner on a popped permit-gated task.
pub(crate) fn acquire_or_park<K>(
    shared: &Arc<Shared<K>>,
    entry: NonNull<KeyEntry<K>>,
    mut task: TaskRef,
) -> Gate
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    if let Some(p) = task.take_granted() {
        return Gate::Run(task, Some(p));
    }
    let (sem, n) = task
        .permits()
        .expect("a permit-gated task knows its semaphore");
    match sem.try_acquire(n) {
        Ok(p) => Gate::Run(task, Some(p)),
        Err(AcquireError::Closed) | Err(AcquireError::TooMany) => {
            task.abandon(Abandon::Cancelled);
            Gate::Dropped
        }
        Err(_) => {
            // SAFETY: we own the chain and just popped this node from it.
            unsafe {
                entry
                    .as_ref()
                    .value()
                    .chain
                    .unpop(NonNull::from(task_into_raw(task)))
            };
            let wait = Arc::new(Wait {
                state: AtomicU8::new(WAITING),
                entry,
                token: Mutex::new(None),
            });
            let id = {
                let mut w = lock(&shared.permit_waits);
                w.next += 1;
                let id = w.next;
                w.map.insert(id, wait.clone());
                id
            };
            let weak = Arc::downgrade(shared);
            // From here on the baton belongs to the wait.
            let w = wait.clone();
            if let Some(token) =
                sem.acquire_with_cancellable(n, move |res| on_grant(weak, id, w, res))
            {
                *lock(&wait.token) = Some(token);
            }
            Gate::Parked
        }
    }
}

fn task_into_raw(task: TaskRef) -> &'static mut crate::task::Header {
    // SAFETY: `into_raw` gives up ownership of a live node; the chain takes it over.
    unsafe { &mut *task.into_raw().as_ptr() }
}

fn on_grant<K>(
    weak: Weak<Shared<K>>,
    id: u64,
    wait: Arc<Wait<K>>,
    res: Result<Permit, AcquireError>,
) where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let Some(shared) = weak.upgrade() else {
        return; // the serializer is gone; the permit (if any) goes back on drop
    };
    if wait
        .state
        .compare_exchange(WAITING, GRANTED, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return; // shutdown_now took the chain; dropping `res` returns the permits
    }
    // SAFETY: winning the CAS gave us the chain's baton; the entry is alive while it is active.
    let entry = unsafe { wait.entry.as_ref() };
    let chain = &entry.value().chain;
    // SAFETY: we own the chain; its head is the parked task.
    let head = unsafe { chain.pop() }.expect("the parked task is at the head");
    // SAFETY: popping made us the node's owner.
    let mut task = unsafe { TaskRef::from_raw(head) };
    match res {
        Ok(permit) => {
            task.set_granted(permit);
            // SAFETY: we own the chain; the node was just popped from it.
            unsafe { chain.unpop(NonNull::from(task_into_raw(task))) };
        }
        Err(_) => {
            task.abandon(Abandon::Cancelled);
            shared.dropped_outside.fetch_add(1, Ordering::AcqRel);
            if let Some(c) = &shared.capacity {
                c.release();
            }
        }
    }
    shared.schedule(Runnable::Chain(wait.entry), None);
    wait.state.store(QUEUED, Ordering::Release);
    lock(&shared.permit_waits).map.remove(&id);
}

/// `shutdown_now`: takes every parked chain whose grant has not arrived; returns their entries
/// (the caller drains them). Waits for grants in progress to reach a ready queue.
pub(crate) fn steal_all<K>(shared: &Shared<K>) -> Vec<NonNull<KeyEntry<K>>> {
    let waits: Vec<(u64, Arc<Wait<K>>)> = lock(&shared.permit_waits)
        .map
        .iter()
        .map(|(id, w)| (*id, w.clone()))
        .collect();
    let mut stolen = Vec::new();
    for (id, w) in waits {
        match w
            .state
            .compare_exchange(WAITING, STOLEN, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                lock(&shared.permit_waits).map.remove(&id);
                // Withdraw the request so it does not hold up the semaphore's queue. If the grant
                // is already on its way, its callback finds STOLEN and returns the permits.
                if let Some(token) = lock(&w.token).take() {
                    token.cancel();
                }
                stolen.push(w.entry);
            }
            Err(_) => {
                let backoff = crossbeam_utils::Backoff::new();
                while w.state.load(Ordering::Acquire) == GRANTED {
                    crate::sync::snooze(&backoff);
                }
            }
        }
    }
    stolen
}
