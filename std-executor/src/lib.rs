//! # keyserial
//!
//! Run tasks **in order per key and in parallel across keys** on a small pool of OS threads.
//!
//! Every user's requests, every trade's messages, every device's events: each stream must be
//! handled in arrival order, but unrelated streams must never wait for each other. A
//! [`Serializer`] hashes keys onto *lanes*, FIFOs that any worker may serve (one at a time); a
//! worker stuck in a task loses its lane to an idle worker, and only the stuck task's key waits
//! for it. A key that needs state (a permit wait, a backlog behind its own tasks) gets a lock-free
//! task chain of its own (from `keyserial-core`) that one worker at a time drains. So a key never
//! runs two tasks at once, and a slow key delays nobody else.
//!
//! ```
//! use keyserial::Serializer;
//!
//! let s: Serializer<u64> = Serializer::new();
//! for user in 0..100u64 {
//!     for request in 0..10 {
//!         s.execute(user, move || {
//!             // handled in order for this user, in parallel with other users
//!             let _ = (user, request);
//!         })
//!         .unwrap();
//!     }
//! }
//! let answer = s.submit(7, || 6 * 7).unwrap();
//! assert_eq!(answer.join().unwrap(), 42);
//! ```
//!
//! # The ordering promise, and the two ways to break it
//!
//! Tasks of one key run one at a time, in the order their submissions returned `Ok`; a task of a
//! key starts only after the key's previous task has **returned**. Two things defeat this:
//!
//! ## ⚠ A closure that returns a future is not an async task
//!
//! `submit(key, || async { ... })` compiles, and **silently breaks per-key order**: the task is
//! the closure, and the closure only *creates* the future. The task returns at once (its handle
//! yields the unstarted future), the key moves on to its next task, and the future's body runs
//! later, wherever and whenever it is awaited, in no particular order with the key's other work.
//!
//! ```
//! use keyserial::Serializer;
//! let s: Serializer<u32> = Serializer::new();
//! // WRONG: the handle's value is an unstarted future; nothing of its body ran in key 1's order.
//! let fut = s.submit(1, || async { "body" }).unwrap().join().unwrap();
//! # drop(fut);
//! ```
//!
//! Submit the future itself with [`Serializer::submit_async`] instead: it is a task of the key
//! like a closure (the key's next task starts only after the future completes), polled on the
//! serializer's workers, and while it waits **it holds no worker thread**.
//!
//! ```
//! use keyserial::Serializer;
//! let s: Serializer<u32> = Serializer::new();
//! // RIGHT: the whole future runs as a task of key 1, in its order.
//! let h = s.submit_async(1, async { "body ran in order" }).unwrap();
//! assert_eq!(h.join().unwrap(), "body ran in order");
//! ```
//!
//! With Cargo feature `tokio`, `Builder::tokio_handle` lets those futures use tokio's timers
//! and sockets. A future that needs a key's per-key data can get it from a closure task of the
//! key that hands it over (`submit`, then `submit_async` with what it returned).
//!
//! ## ⚠ A task must never wait for a later task of its own key
//!
//! A task that blocks on a task of the same key submitted after it (joining its handle, waiting on
//! a channel it fills, a barrier they share) **never finishes**: the later task cannot start
//! before the waiting one returns, and the key is stuck for good. Waiting on such a task's
//! handle from inside the key's task ([`TaskHandle::join`], or polling the handle: `block_on`,
//! `.await` in a `submit_async` future) panics in every build instead of hanging, so the waiting
//! task fails `Panicked` and the key goes on. A wait on something else the later task would
//! fill (a channel, a barrier) cannot be seen, and hangs. Waiting for *other* keys' tasks is
//! allowed, but holds a worker thread.
//!
//! ```
//! use std::sync::{mpsc, Arc};
//! use keyserial::{Serializer, TaskError};
//! let s: Arc<Serializer<u32>> = Arc::new(Serializer::new());
//! let (tx, rx) = mpsc::channel();
//! let waiting = s.submit(1, move || { let later: keyserial::TaskHandle<()> = rx.recv().unwrap(); later.join() }).unwrap();
//! tx.send(s.submit(1, || ()).unwrap()).unwrap(); // a later task of key 1
//! assert!(matches!(waiting.join(), Err(TaskError::Panicked(_)))); // not a hang
//! ```
//!
//! # Sharing a serializer
//!
//! A `Serializer` is `Send + Sync`: share it by reference, or own it jointly with an [`Arc`]
//! (also to submit from inside its own tasks, which never blocks). It shuts down when dropped
//! (see [Dropping](Serializer#dropping)), so the last owner decides when.
//!
//! Scoped threads borrow it, no `Arc` needed:
//!
//! ```
//! use keyserial::Serializer;
//! let s: Serializer<u32> = Serializer::new();
//! std::thread::scope(|scope| {
//!     for producer in 0..4u32 {
//!         let s = &s;
//!         scope.spawn(move || {
//!             for i in 0..100 {
//!                 s.execute(producer, move || { let _ = i; }).unwrap();
//!             }
//!         });
//!     }
//! });
//! s.shutdown();
//! assert!(s.await_termination(std::time::Duration::from_secs(10)));
//! assert_eq!(s.stats().completed, 400);
//! ```
//!
//! With an `Arc`, threads and tasks own it together (here a task submits follow-up work):
//!
//! ```
//! use std::sync::Arc;
//! use keyserial::Serializer;
//! let s: Arc<Serializer<String>> = Arc::new(Serializer::new());
//! let handles: Vec<_> = (0..4)
//!     .map(|t| {
//!         let s = Arc::clone(&s);
//!         std::thread::spawn(move || {
//!             let inner = Arc::clone(&s);
//!             s.submit(format!("user-{t}"), move || {
//!                 // follow-up work for another key, from inside a task: never blocks
//!                 inner.execute("audit".to_string(), move || { let _ = t; }).unwrap();
//!                 t
//!             })
//!             .unwrap()
//!             .join()
//!             .unwrap()
//!         })
//!     })
//!     .collect();
//! let sum: i32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
//! assert_eq!(sum, 6);
//! ```
//!
//! # Also here
//!
//! [`Semaphore`] (fair FIFO, all-or-nothing multi-permit acquire, also gating tasks through
//! [`Serializer::submit_with_permits`]) and [`DistinctQueue`] (a job queue without duplicates,
//! where failed work goes back). A partitioned Redis stream consumed in per-key order across
//! processes is the package `keyserial-redis`, built on this crate's public API.
//!
//! # Tracing
//!
//! With Cargo feature `tracing`, every task gets a span (target `keyserial`, level `TRACE`,
//! name `task`) with its key, its queue wait (`wait_us`) and its run time (`run_us`), and the
//! per-key controls, refusals and key releases are events (level `DEBUG`, `TRACE` for
//! releases). Keys appear by hash unless the builder's `trace_keys` (for `Debug` keys) asks for
//! their text. A submission checks once whether a subscriber wants task spans and, if none
//! does, leaves the task alone; without the feature nothing of this is compiled in.
//!
//! [`Arc`]: std::sync::Arc
#![cfg_attr(not(loom), deny(missing_docs))]
#![deny(unsafe_op_in_unsafe_fn)]

// The map of this crate, for its developers (the modules are private). Grouped by what they
// serve; each module's own docs give its protocol.
//
// | group | modules |
// |---|---|
// | the facade | `serializer/` (`mod`: the type and its submit methods; `admit`: admission; `keys`: per-key control; `shutdown`: the shutdown family and `Drop`), `builder`, `policy`, `stats`, `error`, `pending` |
// | shared state | `shared` (the routing state, behind accessors; the counts, summed in `Shared::tally`), `lifecycle` (flags, termination, threads, hand-backs, behind one lock), `slot` (a worker's slot), `sync` (std or loom) |
// | the lane path (every keyed task) | `lanes`, `lane_task` (a task in a lane's slot), `inspect` (a lane taken for a moment from outside: key_stats, cancel_key), `route` (run it or queue it on its key's chain), `deferral` (a key deferred when its lane is taken over), `latest_cells` (`submit_latest`), `claims` (`submit_distinct`), `gate` (admission of unkeyed and latest tasks), `capacity` |
// | the chain path (keys with state) | `baton` (a chain held outside the workers: `cancel_key`, handed-back runs; stopped and stolen from by `shutdown_now` like workers), `key` (a key's entry and state), `idle`, `idle_word` (idle release), `permits`, `permit_wait` (permit-gated tasks), `control` (a key's pause word), `key_control` (pause and resume on the entry, chain and wait registry), `handed_back` (a state task `cancel_key` handed back, run with its key's chain), `key_budget` (`max_keys`) |
// | workers | `worker/` (its `mod.rs` lists its rooms), `phase` (what `shutdown_now` may take), `running` (what the worker on this thread is inside: the self-wait check), `sleep` (parking without lost wakeups), `supervisor` (the elastic pool) |
// | tasks and handles | `task/` (type-erased task nodes), `future_task` (a future as a task: one allocation, its wakers), `wake_state` (a future's wake word), `nodes`, `slab` (their recycled memory), `handle` (`TaskHandle`), `state` (per-key state), `state_hold` (a key's state held by its handed-back tasks), `user` (the one boundary for user code: where it runs, what a panic in it does), `trace` (feature `tracing`) |
// | the extras | `semaphore/`, `distinct/` (`DistinctQueue`) |
//
// Who owns a key (issue "Baton"). A key's next task is run or touched only by the holder of
// its chain's baton (core `chain`: the `ACTIVE` bit), or, for a plain closure of a key without
// an active chain, by its lane's owner (the lane's direct run, `route.rs`: the one deliberate
// exception). The baton is held by exactly one of: a ready queue; a worker draining the chain
// (its slot's phase word, `phase.rs`); a parked wait (`permit_wait.rs`: permits or a pause);
// a pending future's wake word (`wake_state.rs`); an outside holder (`baton.rs`: `cancel_key`,
// a handed-back state task's run), or the releaser of an idle key (a worker's reaper, or a
// submitter making room under `max_keys`, which claims only an empty chain). In code, holding
// it is holding an `Owned` token (`owner.rs`), the only caller of the chain's owner operations:
// made by a claim or by the taker of a hand-over (a ready queue's pop, a grant, a waker, a steal),
// spent by a release, a retire or the next hand-over. `shutdown_now`
// takes a queue, a wait or a parked future over through that place's own word (one CAS that
// decides against a grant, a resume or a waker), and every other holder that may hold tasks
// (a worker, an outside holder) has a phase word that `shutdown_now` stops: it waits while the holder is
// between two steps (`BUSY`) and steals the chain from one inside a task (`RUNNING`), so that
// after its first step every baton is in a queue, a wait or `shutdown_now`'s hands, which it
// then drains; a holder gives the baton back before it leaves `BUSY`, and takes nothing once
// stopped. The two sweeps of parked pause waits at a graceful end follow the same rule: a
// worker cancelling paused keys' tasks does it `BUSY` (and drops what it cancelled after), an
// exiting worker releasing their states is an outside holder, one chain at a time, its hooks
// run `RUNNING`. That is why nothing queued is missed or taken twice by a stop.
//
// A task in transit has one name per place it can be, outermost first: a `Job` is the user's
// closure plus how its outcome is reported (`task/`); a `TaskRef` owns a type-erased node that
// holds a job; a `LaneTask` is a task as a lane's slot holds it (an inline `execute` closure or
// a `TaskRef`); an `Item` is a `LaneTask` with its key and the key's hash, as a lane's owner or a
// deferral handles it, and `Stored` is an item as the slot keeps it (without the hash,
// `Lane::pop` computes it again); a `Runnable` is what a ready queue holds (a key's chain, or an
// unkeyed `TaskRef`); a `PendingTask` is a task handed back to the user.

// The facade.
mod builder;
mod error;
mod pending;
mod policy;
mod serializer;
mod stats;

// Shared state.
mod lifecycle;
mod shared;
mod slot;
mod sync;

// The lane path.
mod capacity;
mod claims;
mod deferral;
mod gate;
mod inspect;
mod lane_task;
mod lanes;
mod latest_cells;
#[cfg(loom)]
mod loom_fifo;
mod push_marks;
mod route;

// The chain path.
mod baton;
mod control;
mod handed_back;
mod idle;
mod idle_word;
mod key;
mod key_budget;
mod key_control;
mod owner;
mod permit_wait;
mod permits;

// Workers.
mod phase;
mod running;
mod sleep;
mod supervisor;
mod worker;

// Tasks and handles.
mod handle;
mod nodes;
mod slab;
mod state;
mod state_hold;
mod task;
mod trace;
mod user;

// The extras.
mod distinct;
mod future_task;
mod semaphore;
mod wake_state;

#[cfg(test)]
mod exec_tests;
#[cfg(test)]
mod test_util;

pub use builder::Builder;
pub use distinct::{Batch, DistinctQueue, Take};
pub use error::{BuildError, BuildErrorKind, PanicPayload, RejectReason, Rejected, TaskError};
pub use handle::TaskHandle;
pub use pending::PendingTask;
pub use policy::PanicPolicy;
pub use semaphore::{Acquire, AcquireError, Permit, Semaphore};
pub use serializer::Serializer;
pub use stats::{KeyStats, Stats};

/// Internals exposed to the loom models in `loom/` (only under `cfg(loom)`).
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_api {
    pub use crate::baton::loom_hooks as baton;
    pub use crate::capacity::Capacity;
    pub use crate::control::{Control, Resumed};
    pub use crate::deferral::loom_hooks as deferral;
    pub use crate::gate::{Gate, Ticket};
    pub use crate::idle_word::{IdleWord, Reap};
    pub use crate::lanes::loom_hooks as lanes;
    pub use crate::permit_wait::{Handoff, PermitWait, WaitRegistry, Winner};
    pub use crate::phase::{AfterTask, Phase, Stopped};
    pub use crate::semaphore::loom_hooks as semaphore;
    pub use crate::slab::{free_one, Bump, Freer, SLAB};
    pub use crate::sleep::{Idle, Sleep};
    pub use crate::state_hold::loom_hooks as state_hold;
    pub use crate::supervisor::stamp_expired;
    pub use crate::sync::{Parker, Unparker};
    pub use crate::wake_state::WakeState;
}

/// The package README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
