//! Benchmarks of keyserial against what one would otherwise write.
//!
//! - [`exec`]: the [`KeyedExecutor`](exec::KeyedExecutor) trait every contender implements, and
//!   the shared completion counter.
//! - The contenders: [`keyserial_exec`] (keyserial itself), [`inline`] (the work's own cost), [`thread_per_key`], [`lanes`] (keys hashed
//!   onto single-thread workers), [`striped`] (a global `Mutex<HashMap<K, VecDeque<Task>>>` and a
//!   pool), [`tokio_actor`] (an actor per key), [`tokio_mutex`] (a tokio `Mutex` per key, W7 only), [`tokio_chain`] (a keyed chain on tokio, W7
//!   and W8 only), [`unordered`] (a plain pool: the floor of a handoff,
//!   not a serializer).
//! - [`workloads`]: W1–W8, every task checked by the [`checker`] for per-key order and overlap.
//! - [`rss`], [`work`]: the RSS sampler and task bodies the workloads use (W5's Zipf keys come
//!   from `rand_distr`).
//!
//! The `compare` binary runs everything and prints the tables; `benches/` holds the criterion
//! suite.

pub mod checker;
pub mod contenders;
pub mod exec;
pub mod inline;
pub mod keyserial_exec;
pub mod lanes;
pub mod rss;
pub mod striped;
pub mod thread_per_key;
pub mod tokio_actor;
pub mod tokio_chain;
pub mod tokio_mutex;
pub mod unordered;
pub mod work;
pub mod workloads;
