//! A future task's wake state: the one word its wakers, its chain's owner and `shutdown_now`
//! race on. The protocol (states, transitions, who may make each, and why no wake is lost and
//! no future is polled twice at once) is written down in `future_task.rs`, "The wake state";
//! this module is only the word, so that a key's entry can point at it (`KeyState::parked_future`)
//! without knowing about future tasks. Loom: `loom/tests/future.rs`, over this type.

use crate::sync::{AtomicU8, Ordering};

const NEW: u8 = 0;
const RUNNABLE: u8 = 1;
const POLLING: u8 = 2;
const NOTIFIED: u8 = 3;
const PARKED: u8 = 4;
const WAKING: u8 = 5;
const DONE: u8 = 6;

/// A future's wake state (see the module docs): the word its wakers, its chain's owner and
/// `shutdown_now` race on.
#[derive(Debug)]
pub struct WakeState(AtomicU8);

impl Default for WakeState {
    fn default() -> Self {
        WakeState::new()
    }
}

impl WakeState {
    /// `NEW`.
    pub fn new() -> WakeState {
        WakeState(AtomicU8::new(NEW))
    }

    /// Whether the future was ever polled by a worker (exact for the holder of its job).
    pub fn started(&self) -> bool {
        self.0.load(Ordering::Acquire) != NEW
    }

    /// The chain's owner is about to poll (`NEW`, `RUNNABLE` or `NOTIFIED` -> `POLLING`): an RMW,
    /// so that a wake that found a poll coming (its no-op RMW) is ordered before it and what that
    /// waker did before waking is seen by this poll. Waits while a waker is between its push and
    /// its mark (`WAKING`).
    pub fn begin_poll(&self) {
        let prev = self.move_to(POLLING);
        debug_assert!(
            matches!(prev, NEW | RUNNABLE | NOTIFIED),
            "polled in state {prev}"
        );
    }

    /// Moves the word to `to` from whatever it holds, waiting while a waker is between its push
    /// and its mark (`WAKING`, which only that waker may end); returns what it replaced. One
    /// CAS (an RMW) once the word is not `WAKING`.
    fn move_to(&self, to: u8) -> u8 {
        let backoff = crossbeam_utils::Backoff::new();
        let mut s = self.0.load(Ordering::Acquire);
        loop {
            if s == WAKING {
                crate::sync::snooze(&backoff);
                s = self.0.load(Ordering::Acquire);
                continue;
            }
            match self
                .0
                .compare_exchange(s, to, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(prev) => return prev,
                Err(actual) => s = actual,
            }
        }
    }

    /// The owner got `Pending` and put the future back on its chain: `POLLING -> PARKED`.
    /// `false`: a wake came during the poll (`NOTIFIED`); the owner still owns the chain and
    /// polls again. After `true` the caller must not touch the chain or the future.
    #[must_use = "on `false` the future must be polled again"]
    pub fn try_park(&self) -> bool {
        self.0
            .compare_exchange(POLLING, PARKED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// A wake: `true` if this wake took the park (`PARKED -> WAKING`): the caller must put the
    /// chain on a ready queue and then call [`scheduled`](Self::scheduled), running no user code
    /// in between. `false`: nothing to do (a poll is running or coming, or the future is done).
    #[must_use = "on `true` the caller must reschedule the chain"]
    pub fn wake(&self) -> bool {
        let mut s = self.0.load(Ordering::Acquire);
        loop {
            let to = match s {
                POLLING => NOTIFIED,
                PARKED => WAKING,
                // A poll is coming: still an RMW (of the same value), so it is ordered with
                // that poll's `begin_poll` CAS (no store-then-load race between the waker's
                // event and the poller's look at it).
                // (`NEW` too: no waker exists before the first poll, but a wake there is one
                // of a poll coming, like `RUNNABLE`.)
                NEW | RUNNABLE | NOTIFIED | WAKING => s,
                _ => return false, // DONE
            };
            match self
                .0
                .compare_exchange(s, to, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return s == PARKED,
                Err(actual) => s = actual,
            }
        }
    }

    /// `WAKING -> RUNNABLE`, by the waker that took the park, once the chain is on a ready
    /// queue: a release, so whoever sees `RUNNABLE` (`shutdown_now`) finds the chain there.
    pub fn scheduled(&self) {
        let prev = self.0.swap(RUNNABLE, Ordering::AcqRel);
        debug_assert_eq!(prev, WAKING, "only the park's waker marks it scheduled");
    }

    /// `shutdown_now`'s CAS `PARKED -> DONE`: `true` if it took the parked chain's baton (the
    /// future will never be polled again). `false` if the future is not parked: a waker took
    /// the park (waited for until the chain is on the global queue), or it is queued, being
    /// polled, or done.
    pub fn steal(&self) -> bool {
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            match self
                .0
                .compare_exchange(PARKED, DONE, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(WAKING) => crate::sync::snooze(&backoff),
                Err(_) => return false,
            }
        }
    }

    /// Whether the future is done (for the loom models).
    #[cfg(loom)]
    pub fn is_done(&self) -> bool {
        self.0.load(Ordering::Acquire) == DONE
    }

    /// The waker that took a park cannot reschedule the chain (unreachable: see `wake_node`):
    /// `WAKING -> DONE`, so that nobody waits on `WAKING` for ever.
    pub(crate) fn abandon_wake(&self) {
        self.0.store(DONE, Ordering::Release);
    }

    /// Completed or cancelled: later wakes do nothing.
    ///
    /// Waits out `WAKING` (as [`steal`](Self::steal) does): a waker between its push and its
    /// mark may still be there when the chain it pushed is drained and the future cancelled
    /// (a worker that popped it and was stopped before polling put it back unpolled), and its
    /// mark must not overwrite `DONE`.
    pub fn finish(&self) {
        self.move_to(DONE);
    }
}
