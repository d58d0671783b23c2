//! Taking a lane for a moment from outside the workers: how `key_stats`, `busiest_keys` and
//! `cancel_key` see (and `cancel_key` takes) the items a lane still holds.
//!
//! A lane's FIFO has one popper at a time, its owner (core `lane`). An *inspector* (any thread,
//! owner id [`INSPECTOR`]) becomes the owner the ways a worker does: it acquires a `FREE` lane,
//! or steals one whose owner is inside a task, handing that owner a deferral of the task's key
//! exactly as an idle worker's steal does (`worker/steal.rs`: the stuck owner runs the deferral
//! when its task returns, so nothing of that key overtakes it). An `OWNED` lane's owner is
//! routing and gives the lane up or enters a task within moments; the inspector waits for that.
//! It never runs a task and never enters `RUNNING`, so nobody steals from it, and while it owns
//! the lane it only looks at the queued items in place (`Lane::for_each_queued`): it may take a
//! task out (leaving a tombstone a pop skips) but moves nothing else, so the lane's order is
//! untouched. Then it releases the lane and wakes a worker if items wait.
//!
//! `shutdown_now` takes every lane for good (as `STOPPER`): an inspector that finds the lanes
//! stopped gives up (returns `None`); one that owns a lane when `shutdown_now` comes to it is
//! waited for (the lane is `OWNED`).

use crate::deferral::Deferral;
use crate::lanes::{Lane, STOPPER};
use crate::shared::Shared;
use crate::sync::Ordering;
use keyserial_core::lane::Phase;

/// The owner id of an inspecting thread (never a worker's, never `shutdown_now`'s).
pub(crate) const INSPECTOR: usize = STOPPER - 1;

/// Runs `f` with lane `l` owned by the calling thread (see the module docs); `None` if
/// `shutdown_now` has taken the lanes. If `f` panics, the lane is given back first.
pub(crate) fn with_lane<K, R>(sh: &Shared<K>, l: usize, f: impl FnOnce(&Lane<K>) -> R) -> Option<R>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let lane = sh.lanes().get(l);
    let backoff = crossbeam_utils::Backoff::new();
    loop {
        if sh.lanes().stopped.load(Ordering::Acquire) {
            return None;
        }
        let taken = match lane.word.phase() {
            Phase::Free => lane.word.try_acquire(INSPECTOR),
            Phase::Running => steal(sh, lane),
            Phase::Owned => false,
        };
        if taken {
            break;
        }
        crate::sync::snooze(&backoff);
    }
    // `f` may run user code (a key's `Eq`): the lane is given back even if it unwinds, and the
    // panic then goes on to the caller.
    let r = crate::user::catch(|| f(lane));
    lane.word.release(INSPECTOR);
    if !lane.is_empty() {
        sh.notify();
    }
    match r {
        Ok(r) => Some(r),
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

/// Takes `lane` from an owner inside a task, deferring that task's key (as `worker/steal.rs`).
fn steal<K>(sh: &Shared<K>, lane: &Lane<K>) -> bool
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let Some(w) = lane.word.watch() else {
        return false;
    };
    let Some(victim) = sh.mailbox(w.owner()) else {
        return false; // not a worker: `shutdown_now` (or another inspector, which never runs)
    };
    let d = Deferral::new(w.key_hash());
    let p = std::sync::Arc::into_raw(d.clone()).cast_mut();
    let p = std::ptr::NonNull::new(p).expect("an Arc is never null");
    match lane.word.try_steal(INSPECTOR, &w, victim, p) {
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
