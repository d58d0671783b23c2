//! A worker's phase word: lets `shutdown_now` take the queue behind a running task without
//! waiting for the task, and without ever taking a task the worker is about to run.
//!
//! # States
//!
//! ```text
//!  bits 0..2  IDLE (0)    the worker holds nothing (no chain, no lane, no deferral)
//!             BUSY (1)    searching, or holding a chain, a lane or a deferral between tasks
//!             RUNNING (2) inside a user task (or a run of lane tasks, below); the chain's
//!                         queue is untouched and may be taken
//!  bit 2      STOLEN      shutdown_now took the chain while the worker was RUNNING
//!  bit 3      STOP        shutdown_now was called
//! ```
//!
//! Every transition is an RMW on this word:
//!
//! | transition | by | when `STOP` is set |
//! |---|---|---|
//! | `IDLE -> BUSY` (CAS) | worker, before searching | fails: the worker exits |
//! | `BUSY -> RUNNING` (CAS) | worker, before a task | fails: the worker hands back that task and its chain's queue itself |
//! | `RUNNING -> BUSY` (CAS loop, keeps flags) | worker, after a task | reports `STOLEN` (do not touch the chain) or `STOP` (hand back the queue) |
//! | `-> IDLE` (`fetch_and`, keeps flags) | worker, holding nothing | — |
//! | `fetch_or(STOP)`, then `RUNNING -> RUNNING|STOLEN` (CAS) | `shutdown_now` | — |
//! | `RUNNING -> BUSY` (CAS loop, keeps flags) | worker, inside a task of its chain's key, before it takes that chain's queue itself (`cancel_key` from the key's own task) | fails if `STOLEN`: the queue is `shutdown_now`'s |
//! | `BUSY -> RUNNING` (CAS loop, keeps flags) | the same worker, when done, back inside its task | — (a waiting `shutdown_now` then steals) |
//!
//! `shutdown_now` sets `STOP` and then waits while the worker is `BUSY`. A `BUSY` worker runs
//! user code only briefly and never unwinds out of it (`user.rs`): a superseded closure's
//! `Drop`, a handle's waker, and its keys' `Hash`, `Eq` and `Clone` while it pops and routes
//! items. It ends up seeing either
//! `IDLE` (the worker holds nothing, and has handed back what it held before going `IDLE`) or
//! `RUNNING`, where its CAS to `STOLEN` gives it the chain: the worker's next transition sees
//! `STOLEN` and leaves the chain alone. If the worker leaves `RUNNING` first, the CAS fails and
//! `shutdown_now` waits for `BUSY` to end as above. So each queued task is handed back by exactly
//! one of them, and none is both run and handed back. The `RUNNING` transition is a release and
//! the stealing CAS an acquire: the thief sees the chain's queue as the worker left it.
//!
//! # Runs of lane tasks
//!
//! A worker that runs several tasks in a row straight from a lane it owns (`worker/serve.rs`, "Runs
//! of direct tasks") enters `RUNNING` once for the run, not once per task, and between two tasks
//! of the run does only this: loads the word ([`Phase::stop_requested`]), pops its own lane and
//! moves that lane's word (`core::lane`: `begin`, `end`); a popped item whose key's `Hash`
//! panicked is failed there too (its handle resolves, nothing else moves). It touches no chain, ready queue or
//! deferral while `RUNNING`, and keeps `current` at 0, so what `shutdown_now` may take from a
//! `RUNNING` worker is unchanged: nothing of a chain. The lane is taken through its own word,
//! which `shutdown_now` acquires once the owner releases it or steals while the owner is inside
//! a task (its `end` then reports the steal). A worker that finds `STOP` between two tasks, or
//! pops an item that needs routing, leaves `RUNNING` first, and on `STOP` hands back the item it
//! holds and its lane, as after a single task. A `STOP` set just after the load lets the worker
//! start one more task: it starts before `shutdown_now` takes the lane (which needs the lane's
//! word out of `OWNED`), so that task is run and not handed back, and nothing is both.
//! Loom model: `loom/tests/phase.rs`, the run model.

use crate::sync::{AtomicU8, Ordering};

const IDLE: u8 = 0;
const BUSY: u8 = 1;
const RUNNING: u8 = 2;
const MASK: u8 = 0b11;
const STOLEN: u8 = 1 << 2;
const STOP: u8 = 1 << 3;

/// What a worker must do after a task (see [`Phase::leave_running`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterTask {
    /// Go on with the chain.
    Continue,
    /// `shutdown_now` took the chain: do not touch it.
    Stolen,
    /// `shutdown_now` is waiting: hand back the chain's queue, then go idle.
    HandBack,
}

/// What [`Phase::stop`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The worker holds nothing (and has handed back whatever it held).
    Idle,
    /// The worker is inside a task; the caller now owns the chain it was running.
    Stole,
}

/// One worker's phase word (see the [module docs](self)).
#[derive(Debug, Default)]
pub struct Phase(AtomicU8);

impl Phase {
    /// A phase word in `IDLE`.
    pub fn new() -> Phase {
        Phase(AtomicU8::new(IDLE))
    }

    /// Worker: `IDLE -> BUSY`. `false` once stopped.
    pub fn enter_busy(&self) -> bool {
        self.0
            .compare_exchange(IDLE, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Worker: back to `IDLE`, holding nothing. Returns `true` if `STOP` is set.
    pub fn leave_busy(&self) -> bool {
        self.0.fetch_and(!MASK, Ordering::AcqRel) & STOP != 0
    }

    /// Worker: `BUSY -> RUNNING` before a task (release: publishes the chain's queue). `false`
    /// if stopped: the worker must hand back the task and the chain's queue itself.
    pub fn enter_running(&self) -> bool {
        self.0
            .compare_exchange(BUSY, RUNNING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Worker, between two tasks of one run (`RUNNING` held from one to the next, see "Runs of
    /// lane tasks"): whether `shutdown_now` has stopped it. A load; on `true` the worker leaves
    /// `RUNNING` ([`Phase::leave_running`]) and does what it reports.
    #[inline]
    pub fn stop_requested(&self) -> bool {
        self.0.load(Ordering::Relaxed) & STOP != 0
    }

    /// `true` while the worker is inside a task (`RUNNING`, stolen or not). Exact for the
    /// worker's own thread, which alone moves the word in and out of `RUNNING`; a snapshot for
    /// others (`key_stats`).
    pub(crate) fn is_running(&self) -> bool {
        self.0.load(Ordering::Relaxed) & MASK == RUNNING
    }

    /// Whether the worker is `IDLE` (holding nothing; its last search found nothing): a hint
    /// for a lane's owner deciding whether to go on sharing its lane (`worker/serve.rs`, "Sharing a
    /// lane with an idle worker"), not part of the protocol.
    pub(crate) fn is_idle(&self) -> bool {
        self.0.load(Ordering::Relaxed) & (MASK | STOP) == IDLE
    }

    /// Worker: `RUNNING -> BUSY` after a task, keeping the flags.
    pub fn leave_running(&self) -> AfterTask {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let new = (cur & !MASK) | BUSY;
            match self
                .0
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(prev) if prev & STOLEN != 0 => return AfterTask::Stolen,
                Ok(prev) if prev & STOP != 0 => return AfterTask::HandBack,
                Ok(_) => return AfterTask::Continue,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Worker, inside a task of the chain it runs: leaves `RUNNING` for `BUSY` (keeping the
    /// flags) so that it may touch its chain's queue from inside the task (`cancel_key` of the
    /// key's own task) without `shutdown_now` stealing the queue meanwhile: `shutdown_now`
    /// waits while the worker is `BUSY`. `false` (nothing changed): `shutdown_now` already
    /// stole the chain, whose queue is not the worker's any more.
    pub fn suspend_running(&self) -> bool {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            debug_assert_eq!(cur & MASK, RUNNING, "suspended from inside a task");
            if cur & STOLEN != 0 {
                return false;
            }
            let new = (cur & !MASK) | BUSY;
            match self
                .0
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Worker: back to `RUNNING` after [`suspend_running`](Phase::suspend_running), keeping the
    /// flags (also `STOP`: a `shutdown_now` waiting for `BUSY` to end then steals the chain, as
    /// from any worker inside a task). A release: the thief sees the queue as it was left.
    pub fn resume_running(&self) {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            debug_assert_eq!(cur & MASK, BUSY, "resumed after a suspend");
            let new = (cur & !MASK) | RUNNING;
            match self
                .0
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// `shutdown_now`: stops the worker; waits while it is `BUSY`; steals its chain if it is
    /// inside a task.
    pub fn stop(&self) -> Stopped {
        let mut cur = self.0.fetch_or(STOP, Ordering::AcqRel) | STOP;
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            match cur & MASK {
                RUNNING if cur & STOLEN == 0 => {
                    match self.0.compare_exchange(
                        cur,
                        cur | STOLEN,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return Stopped::Stole,
                        Err(actual) => cur = actual,
                    }
                }
                BUSY => {
                    crate::sync::snooze(&backoff);
                    cur = self.0.load(Ordering::Acquire);
                }
                // IDLE, or RUNNING already stolen (a second stop).
                _ => return Stopped::Idle,
            }
        }
    }
}
