//! An idle worker: spin, nap, then sleep without losing a wakeup; and when to leave at shutdown.
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

use std::time::Duration;

use super::WorkerLoop;
use crate::lanes::POLL;
use crate::sync::Ordering;

/// How many rounds an idle worker spins (re-searching after `2^round` spin hints) before it
/// naps.
pub(super) const SPIN_ROUNDS: u32 = 6;

/// How many naps an idle worker takes (re-searching after each) before it registers asleep.
pub(super) const NAP_ROUNDS: u32 = 16;

/// An idle worker's nap between two searches (see "Idle workers nap before they sleep").
pub(super) const NAP: Duration = Duration::from_micros(20);

impl<K> WorkerLoop<'_, K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Parks for at most `timeout`; only for [`POLL`] while a lane has items queued behind an
    /// owner, who may get stuck in a task (see "Waking for a push" in `lanes.rs`).
    pub(super) fn park(&self, timeout: Duration) {
        let parker = &self.owned.as_ref().expect("parker").parker;
        let lanes = &self.shared.lanes();
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

    pub(super) fn park_timeout(&self, idle_since: u64) -> Duration {
        let mut ms: u64 = 1000;
        if let Some(deadline) = self.idle.next_deadline(self.shared) {
            ms = ms.min(deadline.saturating_sub(self.now).max(1));
        }
        if self.index >= self.shared.config().workers {
            let keep = self.shared.config().worker_keep_alive.as_millis() as u64;
            ms = ms.min((idle_since + keep).saturating_sub(self.now).max(1));
        }
        if self.shared.lifecycle().is_shutdown() {
            ms = ms.min(10);
        }
        Duration::from_millis(ms)
    }

    pub(super) fn should_exit_on_shutdown(&self) -> bool {
        let sh = self.shared;
        if sh.lifecycle().is_stopped() {
            return true;
        }
        let quiet = || {
            sh.lifecycle().is_shutdown()
                && sh.lanes().is_closed()
                && sh.gate().in_flight() == 0
                && !sh.has_visible_work()
        };
        if !quiet() {
            return false;
        }
        if sh.outstanding() != 0 {
            // What paused keys hold does not run at shutdown: it is cancelled, so that it does
            // not hold up termination (`key_control.rs`). `BUSY` meanwhile, as any holder of a
            // chain (`baton.rs`): a `shutdown_now` waits for it, and it leaves every chain it
            // took for `shutdown_now` once that has begun (issue "Baton": a stop's hand-back
            // missed the tasks a worker was cancelling).
            if self.slot.phase.enter_busy() {
                let cancelled = crate::key_control::cancel_paused(sh);
                self.slot.phase.leave_busy();
                for t in cancelled {
                    t.abandon(crate::task::Abandon::Cancelled);
                }
            }
        }
        if sh.outstanding() == 0 && quiet() {
            sh.sleep().wake_all();
            return true;
        }
        false
    }

    /// `IDLE -> BUSY`; `false` if `shutdown_now` stopped this worker.
    pub(super) fn enter_busy(&self) -> bool {
        self.slot.phase.enter_busy()
    }

    /// Back to `IDLE`; `true` if `STOP` is set.
    pub(super) fn leave_busy(&self) -> bool {
        self.slot.phase.leave_busy()
    }
}
