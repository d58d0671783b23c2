//! Beyond one machine: a partitioned Redis stream consumed in per-key order across processes,
//! with a completion watermark, built on [`keyserial`]'s public API.
//!
//! A [`Producer`] appends an entry with fields `key` and `data` to the partition stream
//! `{stream}:{p}`, `p = `[`partition_of`]`(key, P)` (Kafka's default partitioner, so a Kafka
//! producer and this one agree). A [`Consumer`] owns some of the partitions (consumer `i` of `n`
//! owns those with `p % n == i`), reads them in batches with `XREADGROUP`, runs each entry as a
//! task of its key on a [`Serializer`](keyserial::Serializer) (in order per key, in parallel across
//! keys), and `XACK`s it once its task completed. The [`Watermark`] (engine-agnostic, bounded)
//! records per partition how far everything is done.
//!
//! ```no_run
//! use keyserial_redis::{Consumer, Producer};
//!
//! let mut producer = Producer::connect("redis://127.0.0.1:6379", "orders", 8)?;
//! producer.send(b"user-42", b"paid")?;
//!
//! let mut consumer = Consumer::builder("redis://127.0.0.1:6379", "orders", 8, "billing", "billing-0")
//!     .index(0, 1) // the only consumer: all 8 partitions
//!     .workers(16)
//!     .exit_when_idle(std::time::Duration::from_secs(1))
//!     .handler(|e| println!("{} {} {}", e.partition, e.id, String::from_utf8_lossy(&e.key)))
//!     .build()?;
//! consumer.run()?;
//! # Ok::<(), keyserial_redis::StreamError>(())
//! ```
//!
//! # Groups and ownership
//!
//! The consumer group is created on each owned partition stream at ID `0` with `MKSTREAM` if it
//! is missing, so entries written before any consumer started are consumed. Per partition the
//! consumer goes through three phases:
//! 1. **its own pending entries**: it re-reads this consumer name's pending list
//!    (`XREADGROUP … STREAMS {stream}:{p} 0`, then from the last ID seen) until it is exhausted.
//!    A consumer restarted under the same name therefore resumes exactly where it was;
//! 2. **other names' pending entries**: while `XPENDING` shows entries of other consumer names in
//!    the partition, it takes over those idle longer than `claim_idle` with `XAUTOCLAIM` and reads
//!    nothing new. A consumer restarted under a *new* name waits `claim_idle` here before it
//!    reads on, so the departed name's entries run before any newer entry of their keys;
//! 3. **live**: it reads new entries (`>`), and every `claim_idle / 2` scans with `XAUTOCLAIM`
//!    again; whatever a scan takes runs before the partition's next read.
//!
//! Entry IDs are compared numerically ([`StreamId`]); explicit IDs (`XADD s 1700000000000-7 …`)
//! are as good as generated ones.
//!
//! # Claim safety
//!
//! An entry waiting in keyserial's queue behind its key's earlier entries is still pending in
//! Redis and ages there (Dapr's issue 4599): with a plain `XAUTOCLAIM`, another consumer would
//! take it and run it a second time while the first still holds it. Here a live consumer
//! **refreshes its holds**: every `refresh_every` (default `claim_idle / 4`) it resets the idle
//! time of every entry it holds (read and not yet acknowledged, queued or running) with
//! `XCLAIM {stream}:{p} group self 0 id… JUSTID` (which does not count a delivery). The refresh
//! is a server-side script that first checks, per ID, that the entry is still in *this*
//! consumer's pending list, so it never takes back an entry someone else claimed meanwhile (that
//! can only happen after this consumer stalled for longer than `claim_idle`; it is reported as
//! [`Event::Lost`]). So a held entry's idle time never exceeds the refresh interval plus one
//! loop tick, and an `XAUTOCLAIM` with `claim_idle` above that never takes it. Consumers of one
//! group must agree on `claim_idle` (the refresh interval must stay well below every claimer's
//! `claim_idle`); the integration test `claim_idle_never_takes_a_held_entry` checks this against
//! a real server, and shows that without the refresh the same schedule does run entries twice.
//!
//! Why not a liveness key per consumer name instead? `XAUTOCLAIM` cannot skip a consumer name,
//! so claimers would have to list pending entries and `XCLAIM` them one by one after checking
//! the owner's key; the refresh keeps `XAUTOCLAIM` correct as it is, costs one script call per
//! partition per interval, and needs no extra keys.
//!
//! # Delivery: at least once — what a handler must tolerate
//!
//! An entry is acknowledged only after its handler succeeded, or after it failed every attempt
//! and was appended to the dead-letter stream (see [Failures](#failures-retry-then-dead-letter)),
//! so a poison entry does not block its partition for ever. A key's entries are **first** run in stream order, also across a
//! consumer's kill and restart and across a take-over. A handler must tolerate:
//! - **running again** an entry it already ran, when the consumer died (or lost its connection
//!   for good) after the handler ran but before the `XACK`: at most `max_in_flight` entries per
//!   consumer crash (every entry in flight, none of them more than once per crash);
//! - a re-run comes **after** the key's first runs of earlier entries, and may come after the
//!   first run of the same key's *later* entries only if those were in flight together with it
//!   (the restarted consumer runs them all again, in order). Make effects idempotent (keyed by
//!   the entry's partition and ID) if a repeat matters;
//! - entries without a `key` field and entries deleted while pending are acknowledged without
//!   running ([`Event::MissingKey`], [`Event::Deleted`]).
//!
//! # Failures: retry, then dead letter
//!
//! A handler returns `()` or `Result<(), E>` ([`HandlerResult`]); an `Err` or a panic is a
//! failure ([`Event::HandlerFailed`]). The entry runs again after a backoff (exponential,
//! capped: [`ConsumerBuilder::retry`], default 3 attempts from 100 ms to 10 s) as the same task of
//! its key: the key's later entries wait behind it, other keys go on (the wait holds no worker
//! thread), and the entry stays held, its idle time refreshed, so no other consumer claims it.
//! [`Entry::attempt`] counts the runs, earlier deliveries included: each retry is recorded as the
//! entry's delivery count in Redis (`XCLAIM … RETRYCOUNT`, only while the entry is still this
//! consumer's) before it runs, so a consumer restarted mid-retry goes on counting where it was.
//! After `max_attempts` failures the entry is appended to the dead-letter stream
//! ([`ConsumerBuilder::dead_letter`], default `{stream}:dead`; fields: the entry's own plus
//! `source_stream`, `source_id`, `error`, `attempts`) and acknowledged in the same pipeline,
//! after the append ([`Event::DeadLettered`]); a crash between the two appends it again, so an
//! entry reaches the dead-letter stream at least once.
//!
//! ```no_run
//! use std::time::Duration;
//! use keyserial_redis::Consumer;
//!
//! let mut consumer = Consumer::builder("redis://127.0.0.1:6379", "orders", 8, "billing", "billing-0")
//!     .retry(5, Duration::from_millis(200), Duration::from_secs(30))
//!     .dead_letter("orders:failed")
//!     .handler(|e| -> Result<(), String> {
//!         let amount: u64 = std::str::from_utf8(&e.data)
//!             .ok()
//!             .and_then(|s| s.parse().ok())
//!             .ok_or_else(|| format!("not an amount: {:?}", e.data))?;
//!         println!("charge {amount} (attempt {})", e.attempt());
//!         Ok(())
//!     })
//!     .build()?;
//! consumer.run()?;
//! # Ok::<(), keyserial_redis::StreamError>(())
//! ```
//!
//! # Backpressure and bounds
//!
//! Nothing is buffered without bound: an entry is in flight from its read to its `XACK`, and
//! reads ask for at most `max_in_flight` minus what is in flight, and for no more bytes than
//! [`max_in_flight_bytes`](ConsumerBuilder::max_in_flight_bytes) (default 64 MiB) minus the
//! bytes in flight, sized by the largest recent entry (the bound is exceeded by at most one
//! unusually large entry per partition read at once). Entries the serializer refuses
//! (its `capacity`; the consumer's own serializer has capacity `max_in_flight`) wait in the
//! consumer in order and stop that partition's reads. A partition whose [`Watermark`] is at its
//! limit (one slow entry and many done after it) is not read until the mark moves.
//!
//! # Stopping and watching
//!
//! [`StopHandle::stop`] (the CLI: SIGTERM or SIGINT) stops reading, lets the entries in flight
//! finish and acknowledges them within the drain deadline
//! ([`drain_timeout`](ConsumerBuilder::drain_timeout)), else `run` returns
//! [`StreamError::DrainTimeout`] with the rest pending. [`Consumer::stats_handle`] is readable
//! from any thread while `run` runs: per partition the lag behind the stream, the entries in
//! flight, the watermark, and the completed, retried and dead-lettered entries.
//!
//! # Connection loss
//!
//! A command that fails for a connection reason (or whose reply does not come within the
//! command timeout) is retried on a new connection with backoff (50 ms doubling to 2 s), for
//! ever by default, each failed attempt reported as [`Event::ConnectionFailed`]; with a finite
//! [`ConsumerBuilder::reconnect`] `run` returns [`StreamError::ConnectionLost`] after that many.
//! An unreachable server at start is an error at once ([`StreamError::Connect`]).
//!
//! A reply that did not come does not mean the command did not run: a stalled server (SIGSTOP,
//! a long fork, a network partition) executes what it had received when it resumes, so a read
//! the consumer gave up on may still deliver entries to it. Two rules keep a key's entries in
//! stream order across that:
//! - a new connection first closes the old one on the server (`CLIENT KILL ID`), so once it is
//!   up, the old connection's command has either run or never will;
//! - a read or claim whose reply was lost is not sent again: every partition first re-reads
//!   this consumer's own pending list (from `0`; held IDs are skipped), which holds whatever
//!   the lost command delivered, before it reads anything newer ([`Event::Reconnected`]).
//!
//! Acknowledgements, refreshes and other commands that are safe to repeat are sent again. A
//! group found missing (the server lost its data, or the stream was deleted) is reported as
//! [`Event::GroupLost`] and created again; entries held then are no longer pending anywhere.
//! The integration test `order_holds_across_redis_stalls` stalls the server under a running
//! consumer and checks every entry, the order of first processing per key and the pending
//! lists.
//!
//! # Why the blocking Redis API
//!
//! The consumer talks to Redis from one loop per consumer: a few round trips per batch of
//! entries (read, acknowledge, now and then a refresh or claim scan), never one per entry. The
//! concurrency is the handlers', and keyserial provides it (blocking handlers on its workers,
//! async handlers as [`submit_async`](keyserial::Serializer::submit_async) futures). So the
//! `redis` crate's blocking connection costs one thread and no runtime, keeps the loop plain
//! sequential code whose order of effects is easy to check, and users of blocking handlers
//! need no tokio.

#![deny(missing_docs)]

mod budget;
mod builder;
mod conn;
mod consumer;
mod entry;
mod error;
mod group;
mod id;
mod ledger;
mod outcome;
mod part;
mod partition;
mod producer;
mod reads;
mod stats;
mod stop;
mod task;
mod timer;
mod watermark;

pub use builder::ConsumerBuilder;
pub use consumer::Consumer;
pub use entry::{Entry, Event};
pub use error::StreamError;
pub use id::{ParseIdError, StreamId};
pub use outcome::{BoxError, HandlerResult};
pub use partition::{murmur2, partition_of};
pub use producer::Producer;
pub use stats::{ConsumerStats, PartitionStats, StatsHandle, StatsSnapshot};
pub use stop::StopHandle;
pub use watermark::{TrackError, Watermark};

/// The Redis key of partition `p` of `stream`: `{stream}:{p}`.
///
/// ```
/// assert_eq!(keyserial_redis::stream_name("orders", 3), "orders:3");
/// ```
pub fn stream_name(stream: &str, p: u32) -> String {
    format!("{stream}:{p}")
}
