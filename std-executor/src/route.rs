//! Routing a lane's item: run it straight away, or queue it on its key's chain.
//!
//! # Who routes, and why a key never runs twice at once
//!
//! Items of a key are routed by exactly one party at a time, in the key's lane order: the
//! lane's owner, or, while the key is deferred, the deferral's runner (`deferral.rs`). The
//! router decides:
//!
//! - A plain or distinct item **runs directly** on the router's thread if its key is not
//!   tracked: its lane counts no tracked key in its hash bucket
//!   ([`Tracked::any`](crate::lanes::Tracked::any)), or the key has no entry, or its chain is
//!   idle (and the key was not shed to an idle worker, whose items all go onto its chain until
//!   the chain retires). An idle chain has no owner and nothing queued, and only a router of
//!   the key pushes onto it, so nothing else of the key can be running: the
//!   only task of the key that ran from the lane before is the router's own previous one (a
//!   deferred key's running task belongs to the deferral's runner, which routes instead), and a
//!   chain's last task returned before its owner released it (Release on the chain's word, read
//!   here with Acquire).
//! - Otherwise it **goes onto the key's chain**, behind what is there: a plain item of a key
//!   whose chain is active (a task of the key is queued or running there, or a permit wait holds
//!   it), every permit-gated item (its chain parks while it waits for permits, holding the key
//!   without holding a worker), every future (its chain parks while it is pending,
//!   `future_task.rs`), and the item of a *hot* key that a lane's owner moves off the
//!   lane (`worker/serve.rs`, "Fairness in a lane") or sheds to an idle sibling (`worker/serve.rs`,
//!   "Sharing a lane with an idle worker"). The router makes the entry if there is none,
//!   raising the lane's tracked count first. The chain runs from the ready queues as before.
//! - A `submit_latest` item is a cell (`latest_cells.rs`): the router takes the task out of it
//!   and routes that like a plain one (kind `Latest`, so a chain still coalesces two in a row).
//!
//! A key stops being tracked when its chain drains and its entry is released
//! (`key_idle_timeout`); from then on its plain items run directly again.

use std::ptr::NonNull;

use crossbeam_deque::Worker;
use keyserial_core::chain::{Pushed, Retired};

use crate::key::{KeyEntry, KeyState, Runnable};
use crate::key_budget::{KeyBudget, KeyShare};
use crate::lane_task::Item;
use crate::lane_task::LaneTask;
use crate::lanes::TrackToken;
use crate::shared::Shared;
use crate::sync::Ordering;
use crate::task::{Kind, TaskRef};
use crate::user::{self, Payload};

/// What the router did with an item.
pub(crate) enum Route<K> {
    /// Run it now, on this thread.
    Direct(Item<K>),
    /// It is on its key's chain (or it superseded the key's pending latest task).
    Queued,
    /// The key's `Hash`, `Eq` or `Clone` panicked while the router looked it up (`user.rs`):
    /// the task is to be failed with the payload; the key is dropped, nothing else changed.
    Failed(LaneTask, Payload),
}

/// `Route::Failed` for `task`, whose key `key` panicked with `payload`.
#[cold]
fn failed<K>(key: K, task: LaneTask, payload: Payload) -> Route<K> {
    crate::user::drop_quietly(key);
    Route::Failed(task, payload)
}

/// How an item must be routed besides what its kind and its key's state ask for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Track {
    /// As its key's state says.
    AsIs,
    /// Onto its key's chain even if the key is not tracked yet: a hot key (`worker/serve.rs`,
    /// "Fairness in a lane").
    Hot,
    /// Onto its key's chain, and the key's later plain items too, even while its chain is idle:
    /// a key shed to an idle worker (`worker/serve.rs`, "Sharing a lane with an idle worker").
    Shed,
}

/// Routes `item`, of key hash `hash` (see the module docs). `local`: the calling worker's
/// deque, where a chain made runnable goes. `track`: see [`Track`].
pub(crate) fn route<K>(
    sh: &Shared<K>,
    item: Item<K>,
    hash: u64,
    local: Option<&Worker<Runnable<K>>>,
    track: Track,
    epoch: &crossbeam_epoch::LocalHandle,
) -> Route<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let mut item = item;
    if item.task.kind() == Kind::LatestCell {
        // A pending latest task's cell: from here on its task is routed like any other.
        let Item { key, hash, task } = item;
        match sh.latest().take(hash, task.into_task()) {
            Some(task) => {
                item = Item {
                    key,
                    hash,
                    task: LaneTask::node(task),
                }
            }
            None => return Route::Queued,
        }
    }
    let kind = item.task.kind();
    // Only a permit-gated task needs its key's state (the chain it parks); the rest run
    // directly unless the key is tracked.
    // A future needs it too: its chain keeps the key owned while the future is pending.
    // And a state task: its key's state is its chain's owner's to hand over (`state.rs`).
    let plain = kind != Kind::Permits
        && kind != Kind::Future
        && kind != Kind::State
        && track == Track::AsIs;
    let lane = sh.lanes().index_of(hash);
    if plain && !sh.lanes().tracked.any(lane, hash) {
        return Route::Direct(item);
    }
    let guard = epoch.pin();
    // A plain item of a key without an active chain runs directly, as it is (an inline task
    // stays inline): only an item bound for a chain becomes a node.
    //
    // Every look-up below runs the key's `Hash` and `Eq` (and, making an entry, its `Clone`):
    // user code, run under `user::catch` while the task is still in our hands. The table is
    // as it was when one of them unwinds (`entry_for`).
    let mut first = None;
    if plain {
        match user::catch(|| chain_of(sh, &item.key, &guard)) {
            Ok(Some(e)) => first = Some(e),
            Ok(None) => return Route::Direct(item),
            Err(payload) => return failed(item.key, item.task, payload),
        }
    }
    let Item { key, task, .. } = item;
    let mut node = task.into_task().into_raw();
    // SAFETY (for the three `from_raw` below): `node` is the item's task, given up by
    // `into_raw` above (or handed back by a bounced push below): ours, queued nowhere.
    loop {
        let found = match first.take() {
            Some(e) => Ok(Some(e)),
            None if plain => user::catch(|| chain_of(sh, &key, &guard)),
            None => user::catch(|| entry_for(sh, &key, lane, hash, &guard)).map(Some),
        };
        let entry: &KeyEntry<K> = match found {
            Ok(Some(e)) => e,
            Ok(None) => {
                // SAFETY: see above the loop.
                let task = LaneTask::node(unsafe { TaskRef::from_raw(node) });
                return Route::Direct(Item { key, hash, task });
            }
            Err(payload) => {
                // SAFETY: see above the loop.
                let task = LaneTask::node(unsafe { TaskRef::from_raw(node) });
                return failed(key, task, payload);
            }
        };
        let ks = entry.value();
        if track == Track::Shed {
            ks.shed.store(true, Ordering::Relaxed);
        }
        // Counted before the push, so that the owner's count of its leaving comes after.
        ks.seen.pushed(|| sh.now_ms());
        // SAFETY: a live task node we own (given up by `into_raw`, or handed back by a bounced
        // push): queued nowhere else; the chain hands it to its owner or `Header::drop_queued`.
        let pushed = unsafe { ks.chain.push(node) };
        if pushed.is_err() {
            ks.seen.left(1);
        }
        match pushed {
            Ok(Pushed::Activated) => {
                sh.schedule(Runnable::Chain(NonNull::from(entry)), local);
                return Route::Queued;
            }
            Ok(Pushed::Queued) => return Route::Queued,
            Err(Retired(back)) => {
                // The key was released under us: take back what we pushed and retry on the
                // key's fresh chain, or run it directly.
                node = back;
            }
        }
    }
}

/// The entry of `key` if a plain item of it goes onto its chain ([`bound_for_chain`]).
fn chain_of<'g, K>(
    sh: &'g Shared<K>,
    key: &K,
    guard: &'g crossbeam_epoch::Guard,
) -> Option<&'g KeyEntry<K>>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    sh.table()
        .get(key, guard)
        .filter(|e| bound_for_chain(e.value()))
}

/// Whether a plain item of a key with state `ks` goes onto the key's chain: while the chain is
/// active (something of the key is queued or running there), while the key is paused
/// (`control.rs`: its chain's owner parks it), or, once the key was shed, until the chain
/// retires. A retired chain is idle and empty, so the item runs directly, as before
/// the shed; without that exception a router that found the retired entry still in the table
/// would push, be bounced, find it again and spin until the retiring thread unlinked it.
fn bound_for_chain(ks: &KeyState) -> bool {
    ks.chain.is_active()
        || ((ks.shed.load(Ordering::Relaxed) || ks.control.is_paused()) && !ks.chain.is_retired())
}

/// The key's live entry, made (and counted in `lane`'s tracked keys, by its hash `hash`) if
/// there is none.
pub(crate) fn entry_for<'g, K>(
    sh: &'g Shared<K>,
    key: &K,
    lane: usize,
    hash: u64,
    guard: &'g crossbeam_epoch::Guard,
) -> &'g KeyEntry<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // A live key is found by the plain walk; only a new key pays for the insert's path. The
    // key is cloned before the insert starts, so that a panicking `Clone` leaves no half-made
    // insert behind; the insert runs only the key's `Hash` and `Eq`, neither while it holds
    // anything of the table's (a panic there drops its unpublished entry).
    match sh.table().get(key, guard) {
        Some(entry) if !entry.value().chain.is_retired() => entry,
        _ => {
            // A key made here (a worker's route, `pause`, `cancel_key`) takes its share of a key
            // budget whatever the limit (`key_budget.rs`); one left unpublished gives it back.
            let mut share = Some(
                sh.budget()
                    .map_or_else(KeyShare::none, KeyBudget::force_take),
            );
            sh.table().get_or_insert_with(
                key.clone(),
                || {
                    KeyState::new(
                        TrackToken::new(&sh.lanes().tracked, lane, hash),
                        share.take().expect("made once"),
                    )
                },
                guard,
            )
        }
    }
}
