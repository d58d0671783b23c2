//! # keyserial
//!
//! Run tasks **in order per key and in parallel across keys** on a small pool of OS threads.
//!
//! Every user's requests, every trade's messages, every device's events: each stream must be
//! handled in arrival order, but unrelated streams must never wait for each other. A
//! [`Serializer`] gives each key a lock-free task chain (from `keyserial-core`); whichever worker
//! holds the key's `ACTIVE` baton drains it, so a key never runs two tasks at once, and a slow key
//! delays nobody else.
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
//! Also here: [`Semaphore`] (fair FIFO, all-or-nothing multi-permit acquire, also gating tasks
//! through [`Serializer::submit_with_permits`]) and [`DistinctQueue`] (a job queue without
//! duplicates, where failed work goes back).
#![cfg_attr(not(loom), deny(missing_docs))]
#![deny(unsafe_op_in_unsafe_fn)]

mod builder;
mod capacity;
mod error;
#[cfg(test)]
mod exec_tests;
mod gate;
mod handle;
mod idle;
mod nodes;
mod permits;
mod phase;
mod serializer;
mod shared;
mod sleep;
mod stats;
mod supervisor;
mod sync;
mod task;
#[cfg(test)]
mod test_util;
mod worker;

pub mod distinct;
pub mod semaphore;

pub use builder::Builder;
pub use distinct::{Batch, DistinctQueue, Take};
pub use error::{BuildError, RejectReason, Rejected, TaskError};
pub use handle::TaskHandle;
pub use semaphore::{Acquire, AcquireError, Permit, Semaphore};
pub use serializer::{PendingTask, Serializer};
pub use stats::Stats;

/// Internals exposed to the loom models in `loom/` (only under `cfg(loom)`).
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_api {
    pub use crate::capacity::Capacity;
    pub use crate::gate::{Gate, Ticket};
    pub use crate::idle::{IdleWord, Reap};
    pub use crate::phase::{AfterTask, Phase, Stopped};
    pub use crate::sleep::Sleep;
    pub use crate::sync::{Parker, Unparker};
}

/// A per-thread spread for unkeyed tasks' first queue.
pub(crate) fn gate_slot_hint() -> usize {
    gate::thread_slot()
}
