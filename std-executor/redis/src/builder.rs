//! Configuring a consumer: [`ConsumerBuilder`] checks the settings, connects, creates the
//! group on the owned partition streams, and hands everything to the loop
//! ([`Consumer`]). Nothing here runs after [`build`](ConsumerBuilder::build) returned.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keyserial::{Builder, Serializer};

use crate::conn::EventFn;
use crate::conn::{Backoff, Conn};
use crate::consumer::{Consumer, Settings};
use crate::entry::{Entry, Event};
use crate::error::StreamError;
use crate::group::Group;
use crate::outcome::HandlerResult;
use crate::stream_name;
use crate::task::{Handler, Retry};
#[cfg(doc)]
use crate::watermark::Watermark;

/// Configures a [`Consumer`]; made by [`Consumer::builder`].
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`index`](Self::index) | 0 of 1 | consumer `i` of `n` owns the partitions `p` with `p % n == i` |
/// | [`max_in_flight`](Self::max_in_flight) | 1,024 | entries read and not yet acknowledged, at most (the duplicates a crash can cause) |
/// | [`max_in_flight_bytes`](Self::max_in_flight_bytes) | 64 MiB | bytes of entries in flight, at most (plus one unusually large entry per partition) |
/// | [`batch`](Self::batch) | 256 | `COUNT` of one read, per partition |
/// | [`claim_idle`](Self::claim_idle) | 30 s | pending entries of other consumer names idle this long are taken over |
/// | [`refresh_every`](Self::refresh_every) | `claim_idle / 4` | how often held entries' idle time is reset |
/// | [`watermark_limit`](Self::watermark_limit) | 65,536 | IDs a partition's [`Watermark`] tracks; at the limit that partition's reads pause |
/// | [`block`](Self::block) | 100 ms | how long an idle read waits on the server |
/// | [`reconnect`](Self::reconnect) / [`reconnect_forever`](Self::reconnect_forever) | for ever, 50 ms doubling to 2 s | lost-connection retries (each failed one an [`Event::ConnectionFailed`]); a finite count ends `run` with [`StreamError::ConnectionLost`] |
/// | [`drain_timeout`](Self::drain_timeout) | 30 s | how long a stopped consumer lets in-flight entries finish |
/// | [`retry`](Self::retry) | 3 attempts, 100 ms doubling to 10 s | runs of a failing entry before it is dead-lettered |
/// | [`dead_letter`](Self::dead_letter) | `{stream}:dead` | where entries that failed every attempt go |
/// | [`exit_when_idle`](Self::exit_when_idle) | never | [`Consumer::run`] returns after nothing was read or in flight this long |
/// | [`workers`](Self::workers) / [`serializer`](Self::serializer) | a serializer of its own (one worker per core, capacity `max_in_flight`) | where handlers run |
///
/// ```no_run
/// use std::time::Duration;
/// use keyserial_redis::Consumer;
/// let consumer = Consumer::builder("redis://127.0.0.1:6379", "orders", 8, "billing", "billing-1")
///     .index(1, 2)
///     .max_in_flight(512)
///     .claim_idle(Duration::from_secs(10))
///     .workers(32)
///     .handler(|e| println!("{} {}", e.id, String::from_utf8_lossy(&e.key)))
///     .build()?;
/// # Ok::<(), keyserial_redis::StreamError>(())
/// ```
pub struct ConsumerBuilder {
    url: String,
    stream: String,
    partitions: u32,
    group: String,
    name: String,
    index: u32,
    of: u32,
    max_in_flight: usize,
    max_in_flight_bytes: usize,
    batch: usize,
    claim_idle: Duration,
    refresh: Option<Duration>,
    watermark_limit: usize,
    block: Duration,
    command_timeout: Option<Duration>,
    backoff: Backoff,
    exit_when_idle: Option<Duration>,
    workers: Option<usize>,
    serializer: Option<Arc<Serializer<Vec<u8>>>>,
    handler: Option<Handler>,
    on_event: Option<Arc<EventFn>>,
    retry: Retry,
    dead_letter: Option<String>,
    drain_timeout: Duration,
}

impl std::fmt::Debug for ConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerBuilder")
            .field("stream", &self.stream)
            .field("partitions", &self.partitions)
            .field("group", &self.group)
            .field("name", &self.name)
            .field("index", &self.index)
            .field("of", &self.of)
            .finish_non_exhaustive()
    }
}

impl ConsumerBuilder {
    /// Consumer `index` of `of`: it owns the partitions `p` with `p % of == index`.
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.index(1, 2); // partitions 1, 3, 5, 7
    /// ```
    pub fn index(mut self, index: u32, of: u32) -> Self {
        self.index = index;
        self.of = of;
        self
    }

    /// The most entries read and not yet acknowledged (at least 1). After a crash, at most this
    /// many entries run again.
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.max_in_flight(256);
    /// ```
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// The most bytes of entries read and not yet acknowledged (default 64 MiB; at least 1): an
    /// entry counts its fields' bytes plus 64. Reads shrink as the bytes in flight near the
    /// limit (sized by the largest recent entry) and stop at it, so in flight stays below the
    /// limit plus at most one unusually large entry per partition read at once.
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.max_in_flight_bytes(16 << 20);
    /// ```
    pub fn max_in_flight_bytes(mut self, n: usize) -> Self {
        self.max_in_flight_bytes = n;
        self
    }

    /// Entries one read asks for per partition (at least 1).
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.batch(64);
    /// ```
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n;
        self
    }

    /// How long another consumer name's pending entry must have idled before this consumer
    /// takes it over (at least 1 ms). Every consumer of a group should use the same value: a
    /// live consumer refreshes its holds every [`refresh_every`](Self::refresh_every), which must
    /// stay well below every other consumer's `claim_idle`.
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.claim_idle(std::time::Duration::from_secs(5));
    /// ```
    pub fn claim_idle(mut self, d: Duration) -> Self {
        self.claim_idle = d;
        self
    }

    /// How often this consumer resets the idle time of the entries it holds (default
    /// `claim_idle / 4`; at least 1 ms). See [Claim safety](crate#claim-safety).
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.refresh_every(std::time::Duration::from_secs(1));
    /// ```
    pub fn refresh_every(mut self, d: Duration) -> Self {
        self.refresh = Some(d);
        self
    }

    /// The most IDs one partition's [`Watermark`] tracks (at least 1).
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.watermark_limit(4096);
    /// ```
    pub fn watermark_limit(mut self, n: usize) -> Self {
        self.watermark_limit = n;
        self
    }

    /// How long the consumer waits for a reply before it takes the connection for lost
    /// (default: the [`block`](Self::block) time plus 10 s; at least 1 ms more than `block`).
    /// A reply that did not come may still be executed by the server later (a stalled server
    /// resumes): see [Connection loss](crate#connection-loss) for why that loses nothing.
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.command_timeout(std::time::Duration::from_secs(2));
    /// ```
    pub fn command_timeout(mut self, d: Duration) -> Self {
        self.command_timeout = Some(d);
        self
    }

    /// How long a read with nothing in flight waits on the server for new entries.
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.block(std::time::Duration::from_millis(50));
    /// ```
    pub fn block(mut self, d: Duration) -> Self {
        self.block = d;
        self
    }

    /// Gives up on a lost connection after `attempts` failed attempts in a row (waiting
    /// `first`, doubling up to `max`): [`run`](Consumer::run) returns
    /// [`StreamError::ConnectionLost`]. The default retries for ever
    /// ([`reconnect_forever`](Self::reconnect_forever)). The first connection (in
    /// [`build`](Self::build)) is never retried: an unreachable server at start is an error at
    /// once.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.reconnect(5, Duration::from_millis(100), Duration::from_secs(1));
    /// ```
    pub fn reconnect(mut self, attempts: u32, first: Duration, max: Duration) -> Self {
        self.backoff = Backoff {
            attempts: Some(attempts),
            first,
            max,
        };
        self
    }

    /// Retries a lost connection for ever (the default), waiting `first`, doubling up to
    /// `max` (default 50 ms to 2 s); each failed attempt is an [`Event::ConnectionFailed`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.reconnect_forever(Duration::from_millis(20), Duration::from_secs(5));
    /// ```
    pub fn reconnect_forever(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = Backoff {
            attempts: None,
            first,
            max,
        };
        self
    }

    /// How long a stopped consumer ([`StopHandle::stop`](crate::StopHandle::stop)) lets its
    /// in-flight entries finish and acknowledges them (default 30 s). Past it, `run` returns
    /// [`StreamError::DrainTimeout`] with the rest left pending; a serializer of the consumer's
    /// own is shut down at once (entries not started, and retries waiting out a backoff, are
    /// dropped; entries running finish on its threads, unacknowledged).
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.drain_timeout(std::time::Duration::from_secs(5));
    /// ```
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }

    /// [`Consumer::run`] returns once nothing was read and nothing was in flight for `d` (and no
    /// owned partition waits for other consumers' pending entries).
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.exit_when_idle(std::time::Duration::from_secs(2));
    /// ```
    pub fn exit_when_idle(mut self, d: Duration) -> Self {
        self.exit_when_idle = Some(d);
        self
    }

    /// Worker threads of the consumer's own serializer. Blocking handlers that wait (sleep, I/O)
    /// need about as many workers as entries should wait at once.
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.workers(64);
    /// ```
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n);
        self
    }

    /// Runs handlers on `serializer` instead of a serializer of the consumer's own (for example
    /// one built with `Builder::tokio_handle` for async handlers). Its capacity bounds the
    /// queued tasks; entries it refuses wait in the consumer and stop its reads.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// let s = Arc::new(keyserial::Serializer::<Vec<u8>>::builder().workers(4).build().unwrap());
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.serializer(s);
    /// ```
    pub fn serializer(mut self, s: Arc<Serializer<Vec<u8>>>) -> Self {
        self.serializer = Some(s);
        self
    }

    /// The handler, run as a task of the entry's key (so a key's entries run one at a time, in
    /// stream order). It returns `()` or `Result<(), E>` ([`HandlerResult`]); an `Err` or a
    /// panic is a failure, retried as [`retry`](Self::retry) says, then dead-lettered. The entry
    /// is acknowledged after it succeeded (or was dead-lettered).
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.handler(|e| -> Result<(), String> {
    ///     if e.data.is_empty() {
    ///         return Err(format!("entry {} has no data", e.id));
    ///     }
    ///     println!("{}", e.id);
    ///     Ok(())
    /// });
    /// ```
    pub fn handler<F, R>(mut self, f: F) -> Self
    where
        F: Fn(&Entry) -> R + Send + Sync + 'static,
        R: HandlerResult,
    {
        self.handler = Some(Handler::Blocking(Arc::new(move |e| f(e).into_result())));
        self
    }

    /// An async handler: the future it returns runs as a task of the entry's key with
    /// [`Serializer::submit_async`] (it holds no worker while it waits); the entry is
    /// acknowledged after the future succeeded (or the entry was dead-lettered). The function
    /// itself runs on a worker too. Its output is `()` or `Result<(), E>` as for
    /// [`handler`](Self::handler); a retry calls the function again with the entry.
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.async_handler(|e| async move {
    ///     if e.attempt() < 2 {
    ///         return Err("the first attempt always fails here");
    ///     }
    ///     Ok(())
    /// });
    /// ```
    pub fn async_handler<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Entry) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: HandlerResult,
    {
        self.handler = Some(Handler::Async(Arc::new(move |e| {
            let fut = f(e);
            Box::pin(async move { fut.await.into_result() })
        })));
        self
    }

    /// How a failed entry is retried: at most `max_attempts` runs in all (at least 1), the
    /// first retry after `first`, each next one after twice as long, at most `max` (default 3
    /// attempts, 100 ms to 10 s). A retry runs as the same task of its key, so the key's later
    /// entries wait behind it while other keys go on; its attempt is recorded in Redis's
    /// delivery count ([`Entry::attempt`]). After the last failed attempt the entry is
    /// appended to the [`dead_letter`](Self::dead_letter) stream, then acknowledged.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.retry(5, Duration::from_millis(50), Duration::from_secs(2));
    /// ```
    pub fn retry(mut self, max_attempts: u32, first: Duration, max: Duration) -> Self {
        self.retry = Retry {
            max_attempts,
            first,
            max,
        };
        self
    }

    /// The dead-letter stream (default `{stream}:dead`): an entry that failed its last attempt
    /// is appended there with its own fields plus `source_stream`, `source_id`, `error` and
    /// `attempts`, and then acknowledged (a crash between the two appends it again: at least
    /// once into the dead-letter stream).
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.dead_letter("orders:failed");
    /// ```
    pub fn dead_letter(mut self, stream: &str) -> Self {
        self.dead_letter = Some(stream.to_string());
        self
    }

    /// Called on the consumer's thread for each [`Event`] (default: one line on stderr).
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.on_event(|e| eprintln!("stream: {e}"));
    /// ```
    pub fn on_event(mut self, f: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        self.on_event = Some(Arc::new(f));
        self
    }

    /// Checks the settings, connects, and creates the consumer group on each owned partition
    /// stream (at ID `0`, with `MKSTREAM`, if it does not exist yet).
    ///
    /// # Errors
    /// [`StreamError::Config`] for an invalid setting or a missing handler,
    /// [`StreamError::Connect`] if the server cannot be reached, [`StreamError::Redis`] if it
    /// refuses to create the group (for example: the key is not a stream).
    ///
    /// ```no_run
    /// let c = keyserial_redis::Consumer::builder("redis://127.0.0.1:6379", "s", 8, "g", "c1")
    ///     .handler(|_| ())
    ///     .build()?;
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn build(self) -> Result<Consumer, StreamError> {
        let bad = |m: String| Err(StreamError::Config(m));
        if self.partitions == 0 {
            return bad("partitions must be at least 1".into());
        }
        if self.of == 0 || self.index >= self.of {
            return bad(format!(
                "index {} of {}: the index must be below the consumer count",
                self.index, self.of
            ));
        }
        if self.index >= self.partitions {
            return bad(format!(
                "consumer {} of {} owns no partition of {}",
                self.index, self.of, self.partitions
            ));
        }
        if self.stream.is_empty() || self.group.is_empty() || self.name.is_empty() {
            return bad("the stream, group and consumer names must not be empty".into());
        }
        if self.max_in_flight == 0
            || self.max_in_flight_bytes == 0
            || self.batch == 0
            || self.watermark_limit == 0
        {
            return bad(
                "max_in_flight, max_in_flight_bytes, batch and watermark_limit must be at least 1"
                    .into(),
            );
        }
        let refresh = self.refresh.unwrap_or(self.claim_idle / 4);
        if self.claim_idle < Duration::from_millis(1) || refresh < Duration::from_millis(1) {
            return bad("claim_idle and refresh_every must be at least 1 ms".into());
        }
        if self.retry.max_attempts == 0 {
            return bad("retry: max_attempts must be at least 1".into());
        }
        if self.retry.first > self.retry.max {
            return bad("retry: the first backoff must not exceed the largest".into());
        }
        if self.dead_letter.as_deref() == Some("") {
            return bad("the dead-letter stream's name must not be empty".into());
        }
        let command_timeout = self
            .command_timeout
            .unwrap_or(self.block + Duration::from_secs(10));
        if command_timeout <= self.block {
            return bad("command_timeout must exceed the block time".into());
        }
        if self.workers == Some(0) {
            return bad("workers must be at least 1".into());
        }
        let Some(handler) = self.handler else {
            return bad("no handler: call handler or async_handler".into());
        };
        let own_serializer = self.serializer.is_none();
        let serializer = match self.serializer {
            Some(s) => s,
            None => {
                let mut b = Builder::new().capacity(self.max_in_flight);
                if let Some(w) = self.workers {
                    b = b.workers(w);
                }
                Arc::new(b.build().map_err(|e| StreamError::Config(e.to_string()))?)
            }
        };
        let on_event: Arc<EventFn> = self
            .on_event
            .unwrap_or_else(|| Arc::new(|e: &Event| eprintln!("keyserial_redis: {e}")));
        let conn = Conn::open(
            &self.url,
            self.backoff,
            command_timeout,
            Arc::clone(&on_event),
        )?;
        let owned: Vec<u32> = (self.index..self.partitions)
            .step_by(self.of as usize)
            .collect();
        let streams = owned
            .iter()
            .map(|&p| stream_name(&self.stream, p))
            .collect();
        let group = Group::open(conn, self.group, self.name, streams)?;
        Ok(Consumer::start(
            Settings {
                max_in_flight: self.max_in_flight,
                max_in_flight_bytes: self.max_in_flight_bytes,
                batch: self.batch,
                claim_idle: self.claim_idle,
                refresh,
                block: self.block,
                exit_when_idle: self.exit_when_idle,
                watermark_limit: self.watermark_limit,
                retry: self.retry,
                drain_timeout: self.drain_timeout,
                own_serializer,
                dead_letter: self
                    .dead_letter
                    .unwrap_or_else(|| format!("{}:dead", self.stream)),
            },
            group,
            &self.stream,
            &owned,
            serializer,
            handler,
            on_event,
        ))
    }
}

impl Consumer {
    /// A builder for consumer `name` of group `group` over the `partitions` partition streams
    /// `{stream}:0` … of the server at `url`.
    ///
    /// ```no_run
    /// let b = keyserial_redis::Consumer::builder("redis://127.0.0.1:6379", "orders", 8, "g", "c0");
    /// ```
    pub fn builder(
        url: &str,
        stream: &str,
        partitions: u32,
        group: &str,
        name: &str,
    ) -> ConsumerBuilder {
        ConsumerBuilder {
            url: url.to_string(),
            stream: stream.to_string(),
            partitions,
            group: group.to_string(),
            name: name.to_string(),
            index: 0,
            of: 1,
            max_in_flight: 1024,
            max_in_flight_bytes: 64 << 20,
            batch: 256,
            claim_idle: Duration::from_secs(30),
            refresh: None,
            watermark_limit: 65_536,
            block: Duration::from_millis(100),
            command_timeout: None,
            backoff: Backoff {
                attempts: None,
                first: Duration::from_millis(50),
                max: Duration::from_secs(2),
            },
            exit_when_idle: None,
            workers: None,
            serializer: None,
            handler: None,
            on_event: None,
            retry: Retry {
                max_attempts: 3,
                first: Duration::from_millis(100),
                max: Duration::from_secs(10),
            },
            dead_letter: None,
            drain_timeout: Duration::from_secs(30),
        }
    }
}
