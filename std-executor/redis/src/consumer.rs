//! The consumer: owns its partitions, reads them in batches, runs each entry under its key on a
//! [`Serializer`], acknowledges it once its task completed.
//!
//! # The loop (one thread, one connection)
//!
//! [`Consumer::run`] repeats, never blocking longer than a *tick* (the read block time, at most
//! half the hold-refresh interval):
//! 1. collect completed tasks and `XACK` them (one pipelined round trip for all partitions);
//! 2. refresh the holds when due (see [Claim safety](super#claim-safety));
//! 3. partitions still re-reading their own pending list (`XREADGROUP … 0`, then from the last
//!    ID seen) read the next batch of it;
//! 4. partitions waiting for other consumers' pending entries check `XPENDING` and take over what
//!    idled past `claim_idle` with `XAUTOCLAIM`; live partitions scan with `XAUTOCLAIM` every
//!    `claim_idle / 2`;
//! 5. entries read (their *backlog*) are submitted with `try_submit`/`try_submit_async`; a full
//!    serializer leaves them queued here, which stops that partition's reads;
//! 6. live partitions with an empty backlog read new entries (`>`), all in one `XREADGROUP`,
//!    `BLOCK`ing only when nothing is in flight.
//!
//! An entry is *in flight* from the read that delivered it to the `XACK` that succeeded; reads
//! ask for at most `max_in_flight` minus that, and for at most the partition's watermark room.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use redis::Value;

use crate::conn::{self, Backoff, Conn, RawEntry};
use crate::entry::{Entry, Event};
use crate::error::StreamError;
use crate::id::StreamId;
use crate::stream_name;
use crate::watermark::Watermark;
use keyserial::{Builder, RejectReason, Serializer};

type BlockingFn = dyn Fn(&Entry) + Send + Sync + 'static;
type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
type AsyncFn = dyn Fn(Entry) -> BoxFuture + Send + Sync + 'static;
type EventFn = dyn Fn(&Event) + Send + Sync + 'static;

#[derive(Clone)]
enum Handler {
    Blocking(Arc<BlockingFn>),
    Async(Arc<AsyncFn>),
}

/// The Lua script that refreshes this consumer's holds: for each ID, if the entry is still in
/// *this* consumer's pending list, `XCLAIM … JUSTID` it to itself (idle time back to 0, delivery
/// count unchanged); otherwise report it lost. One script run is atomic on the server, so a
/// refresh never takes back an entry another consumer claimed meanwhile.
const REFRESH_LUA: &str = r#"
local lost = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"#;

/// Configures a [`Consumer`]; made by [`Consumer::builder`].
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`index`](Self::index) | 0 of 1 | consumer `i` of `n` owns the partitions `p` with `p % n == i` |
/// | [`max_in_flight`](Self::max_in_flight) | 1,024 | entries read and not yet acknowledged, at most (the duplicates a crash can cause) |
/// | [`batch`](Self::batch) | 256 | `COUNT` of one read, per partition |
/// | [`claim_idle`](Self::claim_idle) | 30 s | pending entries of other consumer names idle this long are taken over |
/// | [`refresh_every`](Self::refresh_every) | `claim_idle / 4` | how often held entries' idle time is reset |
/// | [`watermark_limit`](Self::watermark_limit) | 65,536 | IDs a partition's [`Watermark`] tracks; at the limit that partition's reads pause |
/// | [`block`](Self::block) | 100 ms | how long an idle read waits on the server |
/// | [`reconnect`](Self::reconnect) | 10 attempts, 50 ms doubling to 2 s | lost-connection retries before [`StreamError::ConnectionLost`] |
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
    batch: usize,
    claim_idle: Duration,
    refresh: Option<Duration>,
    watermark_limit: usize,
    block: Duration,
    backoff: Backoff,
    exit_when_idle: Option<Duration>,
    workers: Option<usize>,
    serializer: Option<Arc<Serializer<Vec<u8>>>>,
    handler: Option<Handler>,
    on_event: Option<Arc<EventFn>>,
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
    /// `claim_idle / 4`; at least 1 ms). See [Claim safety](super#claim-safety).
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

    /// Lost-connection retries: `attempts` reconnects, waiting `first`, doubling up to `max`.
    /// The first connection (in [`build`](Self::build)) is not retried.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.reconnect(5, Duration::from_millis(100), Duration::from_secs(1));
    /// ```
    pub fn reconnect(mut self, attempts: u32, first: Duration, max: Duration) -> Self {
        self.backoff = Backoff {
            attempts,
            first,
            max,
        };
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
    /// stream order). The entry is acknowledged after it returns (or panicked).
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.handler(|e| println!("{}", e.id));
    /// ```
    pub fn handler(mut self, f: impl Fn(&Entry) + Send + Sync + 'static) -> Self {
        self.handler = Some(Handler::Blocking(Arc::new(f)));
        self
    }

    /// An async handler: the future it returns runs as a task of the entry's key with
    /// [`Serializer::submit_async`] (it holds no worker while it waits); the entry is
    /// acknowledged after the future completed. The function itself runs on a worker too.
    ///
    /// ```no_run
    /// # let b = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c1");
    /// let b = b.async_handler(|e| async move { println!("{}", e.id) });
    /// ```
    pub fn async_handler<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Entry) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.handler = Some(Handler::Async(Arc::new(move |e| Box::pin(f(e)))));
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
        if self.max_in_flight == 0 || self.batch == 0 || self.watermark_limit == 0 {
            return bad("max_in_flight, batch and watermark_limit must be at least 1".into());
        }
        let refresh = self.refresh.unwrap_or(self.claim_idle / 4);
        if self.claim_idle < Duration::from_millis(1) || refresh < Duration::from_millis(1) {
            return bad("claim_idle and refresh_every must be at least 1 ms".into());
        }
        if self.workers == Some(0) {
            return bad("workers must be at least 1".into());
        }
        let Some(handler) = self.handler else {
            return bad("no handler: call handler or async_handler".into());
        };
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
        let tick = self.block.min(refresh / 2).max(Duration::from_millis(1));
        let mut conn = Conn::open(
            &self.url,
            self.backoff,
            self.block + Duration::from_secs(10),
        )?;
        let mut parts = Vec::new();
        let mut by_name = HashMap::new();
        for p in (self.index..self.partitions).step_by(self.of as usize) {
            let name = stream_name(&self.stream, p);
            let mut cmd = redis::cmd("XGROUP");
            cmd.arg("CREATE")
                .arg(&name)
                .arg(&self.group)
                .arg("0")
                .arg("MKSTREAM");
            create_group(&mut conn, &cmd)?;
            by_name.insert(name.clone().into_bytes(), parts.len());
            parts.push(Part::new(p, name));
        }
        let (tx, rx) = mpsc::channel();
        Ok(Consumer {
            conn,
            group: self.group,
            name: self.name,
            max_in_flight: self.max_in_flight,
            batch: self.batch,
            claim_idle: self.claim_idle,
            refresh,
            tick,
            block: self.block,
            exit_when_idle: self.exit_when_idle,
            serializer,
            handler,
            on_event: self.on_event,
            parts,
            by_name,
            watermark: Watermark::new(self.watermark_limit),
            in_flight: 0,
            tx,
            rx,
            stop: Arc::new(AtomicBool::new(false)),
            stats: ConsumerStats::default(),
            refresh_script: redis::Script::new(REFRESH_LUA),
            rotate: 0,
            epoch: 0,
        })
    }
}

fn create_group(conn: &mut Conn, cmd: &redis::Cmd) -> Result<(), StreamError> {
    match conn.query(cmd) {
        Ok(_) => Ok(()),
        Err(StreamError::Redis(e)) if e.code() == Some("BUSYGROUP") => Ok(()),
        Err(e) => Err(e),
    }
}

/// Where an owned partition is in the ownership protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Re-reading this consumer name's own pending entries, after `after`.
    OwnPending { after: StreamId },
    /// Waiting for other consumer names' pending entries to be taken over (or acknowledged).
    Others,
    /// Reading new entries.
    Live,
}

/// A task refused by a full serializer, kept to be submitted again, in order.
enum Stalled {
    Blocking(Vec<u8>, Box<dyn FnOnce() + Send + 'static>),
    Async(Vec<u8>, BoxFuture),
}

struct Part {
    p: u32,
    name: String,
    phase: Phase,
    /// Read, not yet submitted, in stream order.
    backlog: VecDeque<Entry>,
    /// The head of the backlog, built and refused by the serializer.
    stalled: Option<Stalled>,
    /// In flight: read and not yet acknowledged (backlog, submitted, completed-not-acked).
    held: BTreeSet<StreamId>,
    /// Completed (or not to be run), to `XACK`.
    acks: Vec<StreamId>,
    claim_cursor: StreamId,
    next_claim: Instant,
}

impl Part {
    fn new(p: u32, name: String) -> Part {
        Part {
            p,
            name,
            phase: Phase::OwnPending {
                after: StreamId::ZERO,
            },
            backlog: VecDeque::new(),
            stalled: None,
            held: BTreeSet::new(),
            acks: Vec::new(),
            claim_cursor: StreamId::ZERO,
            next_claim: Instant::now(),
        }
    }

    fn blocked(&self) -> bool {
        !self.backlog.is_empty() || self.stalled.is_some()
    }
}

/// A finished (or abandoned) task's report to the consumer loop.
struct Done {
    part: usize,
    id: StreamId,
    /// `Some(panicked)`: the task completed; `None`: dropped without running (serializer shut
    /// down under the consumer), so not acknowledged.
    outcome: Option<bool>,
    key: Vec<u8>,
}

/// Sends the task's [`Done`] when dropped, so a task that is dropped unrun reports too.
struct DoneGuard {
    tx: Sender<Done>,
    part: usize,
    id: StreamId,
    outcome: Option<bool>,
    key: Vec<u8>,
}

impl Drop for DoneGuard {
    fn drop(&mut self) {
        let _ = self.tx.send(Done {
            part: self.part,
            id: self.id,
            outcome: self.outcome,
            key: std::mem::take(&mut self.key),
        });
    }
}

/// Polls the handler's future, turning a panic in it into a report instead of unwinding.
struct Guarded {
    fut: BoxFuture,
    guard: Option<DoneGuard>,
}

impl Future for Guarded {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        match catch_unwind(AssertUnwindSafe(|| this.fut.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(())) => {
                if let Some(mut g) = this.guard.take() {
                    g.outcome = Some(false);
                }
                Poll::Ready(())
            }
            Err(_) => {
                if let Some(mut g) = this.guard.take() {
                    g.outcome = Some(true);
                }
                Poll::Ready(())
            }
        }
    }
}

/// What a consumer has done so far ([`Consumer::stats`]).
///
/// ```
/// let s = keyserial_redis::ConsumerStats::default();
/// assert_eq!(s.acked, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Entries delivered by reads and claims (including re-deliveries).
    pub read: u64,
    /// Handler runs that completed (returned or panicked).
    pub processed: u64,
    /// Entries acknowledged.
    pub acked: u64,
    /// Entries taken over from other consumer names.
    pub claimed: u64,
    /// Entries without a `key` field (acknowledged, not run).
    pub missing_key: u64,
    /// Pending entries whose body was deleted (acknowledged, not run).
    pub deleted: u64,
    /// Handler runs that panicked.
    pub panicked: u64,
    /// Held entries found claimed by another consumer at a refresh.
    pub lost: u64,
}

/// Stops a running [`Consumer`] from another thread ([`Consumer::stopper`]).
///
/// ```no_run
/// # let mut c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 1, "g", "c")
/// #     .handler(|_| ()).build()?;
/// let stop = c.stopper();
/// std::thread::spawn(move || {
///     std::thread::sleep(std::time::Duration::from_secs(5));
///     stop.stop();
/// });
/// c.run()?;
/// # Ok::<(), keyserial_redis::StreamError>(())
/// ```
#[derive(Clone, Debug)]
pub struct StopHandle(Arc<AtomicBool>);

impl StopHandle {
    /// Asks the consumer to stop: it reads nothing more, lets submitted tasks finish and
    /// acknowledges them, leaves entries it read but had not submitted pending (this consumer
    /// name re-reads them on restart), and `run` returns.
    ///
    /// ```no_run
    /// # let c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 1, "g", "c")
    /// #     .handler(|_| ()).build()?;
    /// c.stopper().stop();
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn stop(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Consumes the partitions it owns of a partitioned Redis stream, running each entry as a task
/// of its key on a [`Serializer`]; see the [crate docs](crate) for the protocol, the delivery
/// guarantee and claim safety.
///
/// ```no_run
/// use keyserial_redis::Consumer;
/// let mut c = Consumer::builder("redis://127.0.0.1:6379", "orders", 8, "billing", "billing-0")
///     .index(0, 2)
///     .handler(|e| println!("{} {} {}", e.partition, e.id, String::from_utf8_lossy(&e.key)))
///     .build()?;
/// c.run()?; // until stopped, idle (exit_when_idle) or an error
/// # Ok::<(), keyserial_redis::StreamError>(())
/// ```
pub struct Consumer {
    conn: Conn,
    group: String,
    name: String,
    max_in_flight: usize,
    batch: usize,
    claim_idle: Duration,
    refresh: Duration,
    tick: Duration,
    block: Duration,
    exit_when_idle: Option<Duration>,
    serializer: Arc<Serializer<Vec<u8>>>,
    handler: Handler,
    on_event: Option<Arc<EventFn>>,
    parts: Vec<Part>,
    by_name: HashMap<Vec<u8>, usize>,
    watermark: Watermark<StreamId>,
    in_flight: usize,
    tx: Sender<Done>,
    rx: Receiver<Done>,
    stop: Arc<AtomicBool>,
    stats: ConsumerStats,
    refresh_script: redis::Script,
    rotate: usize,
    epoch: u64,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("group", &self.group)
            .field("name", &self.name)
            .field("partitions", &self.owned())
            .field("in_flight", &self.in_flight)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
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
            batch: 256,
            claim_idle: Duration::from_secs(30),
            refresh: None,
            watermark_limit: 65_536,
            block: Duration::from_millis(100),
            backoff: Backoff {
                attempts: 10,
                first: Duration::from_millis(50),
                max: Duration::from_secs(2),
            },
            exit_when_idle: None,
            workers: None,
            serializer: None,
            handler: None,
            on_event: None,
        }
    }

    /// The partitions this consumer owns.
    ///
    /// ```no_run
    /// # let c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c")
    /// #     .index(1, 2).handler(|_| ()).build()?;
    /// assert_eq!(c.owned(), [1, 3, 5, 7]);
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn owned(&self) -> Vec<u32> {
        self.parts.iter().map(|p| p.p).collect()
    }

    /// The completion watermark of the owned partitions.
    ///
    /// ```no_run
    /// # let c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c")
    /// #     .handler(|_| ()).build()?;
    /// for p in c.owned() {
    ///     println!("partition {p}: done up to {:?}", c.watermark().mark(p));
    /// }
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn watermark(&self) -> &Watermark<StreamId> {
        &self.watermark
    }

    /// Counts of what the consumer did.
    ///
    /// ```no_run
    /// # let c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c")
    /// #     .handler(|_| ()).build()?;
    /// assert_eq!(c.stats().acked, 0);
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn stats(&self) -> ConsumerStats {
        self.stats
    }

    /// Entries read and not yet acknowledged.
    ///
    /// ```no_run
    /// # let c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c")
    /// #     .handler(|_| ()).build()?;
    /// assert_eq!(c.in_flight(), 0);
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// A handle that stops [`run`](Self::run) from another thread.
    ///
    /// ```no_run
    /// # let c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c")
    /// #     .handler(|_| ()).build()?;
    /// let stop = c.stopper();
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn stopper(&self) -> StopHandle {
        StopHandle(Arc::clone(&self.stop))
    }

    fn event(&self, e: Event) {
        match &self.on_event {
            Some(f) => f(&e),
            None => eprintln!("keyserial_redis: {e}"),
        }
    }

    /// Consumes until stopped ([`stopper`](Self::stopper)), idle for
    /// [`exit_when_idle`](ConsumerBuilder::exit_when_idle), or an error. Returns the stats.
    ///
    /// # Errors
    /// [`StreamError::ConnectionLost`] after the reconnect attempts, [`StreamError::Redis`] if
    /// the server refuses a command, [`StreamError::SerializerShutdown`] if the serializer is
    /// shut down under the consumer. Nothing is acknowledged that did not complete; what was
    /// in flight stays pending and is re-read by this consumer name on restart.
    ///
    /// ```no_run
    /// # let mut c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c")
    /// #     .exit_when_idle(std::time::Duration::from_secs(1)).handler(|_| ()).build()?;
    /// let stats = c.run()?;
    /// println!("acknowledged {}", stats.acked);
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn run(&mut self) -> Result<ConsumerStats, StreamError> {
        let mut next_refresh = Instant::now() + self.refresh;
        let mut last_busy = Instant::now();
        loop {
            self.collect(Duration::ZERO)?;
            self.flush_acks()?;
            if Instant::now() >= next_refresh {
                self.refresh_holds()?;
                next_refresh = Instant::now() + self.refresh;
            }
            self.check_epoch();
            if self.stop.load(Ordering::Acquire) {
                return self.drain();
            }
            let mut progressed = self.read_own_pending()?;
            progressed |= self.claims()?;
            progressed |= self.submit_backlogs()?;
            let quiet = !progressed && self.in_flight == 0;
            progressed |= self.read_new(quiet)?;
            if self.in_flight > 0 || progressed {
                last_busy = Instant::now();
            }
            if !progressed && self.in_flight > 0 {
                // Wait for a task to complete (never longer than a tick: refreshes are due).
                self.collect(self.tick.min(Duration::from_millis(10)))?;
            }
            if let Some(idle) = self.exit_when_idle {
                let settled = self
                    .parts
                    .iter()
                    .all(|p| p.phase == Phase::Live && !p.blocked());
                if settled && self.in_flight == 0 && last_busy.elapsed() >= idle {
                    return Ok(self.stats);
                }
            }
        }
    }

    /// After a reconnect, a reply may have been lost with the connection: entries delivered to
    /// this consumer by a read or a claim whose reply never arrived are in its pending list but
    /// not held. Re-reading its own pending list (skipping held IDs) recovers them; they are
    /// newer than everything held, so per-key order holds.
    fn check_epoch(&mut self) {
        if self.conn.epoch != self.epoch {
            self.epoch = self.conn.epoch;
            for part in &mut self.parts {
                part.phase = Phase::OwnPending {
                    after: StreamId::ZERO,
                };
            }
            self.event(Event::Reconnected);
        }
    }

    fn drain(&mut self) -> Result<ConsumerStats, StreamError> {
        // Entries not submitted are let go: they stay in this name's pending list.
        for part in &mut self.parts {
            for e in part.backlog.drain(..) {
                if part.held.remove(&e.id) {
                    self.in_flight -= 1;
                }
            }
            // The refused head task: dropping it reports it through its guard as not run.
            drop(part.stalled.take());
        }
        while self.in_flight > 0 {
            self.collect(self.tick)?;
            self.flush_acks()?;
        }
        Ok(self.stats)
    }

    /// Takes completion reports: waits up to `wait` for the first.
    fn collect(&mut self, wait: Duration) -> Result<(), StreamError> {
        let first = if wait.is_zero() {
            self.rx.try_recv().ok()
        } else {
            match self.rx.recv_timeout(wait) {
                Ok(d) => Some(d),
                Err(RecvTimeoutError::Timeout) => None,
                // The consumer holds a sender itself: never disconnected.
                Err(RecvTimeoutError::Disconnected) => None,
            }
        };
        let Some(first) = first else { return Ok(()) };
        let mut next = Some(first);
        while let Some(d) = next {
            let part = &mut self.parts[d.part];
            match d.outcome {
                Some(panicked) => {
                    part.acks.push(d.id);
                    self.stats.processed += 1;
                    if panicked {
                        self.stats.panicked += 1;
                        let p = part.p;
                        self.event(Event::HandlerPanicked {
                            partition: p,
                            id: d.id,
                            key: d.key,
                        });
                    }
                }
                None => {
                    // Not run: not acknowledged; it stays pending for a later delivery.
                    if part.held.remove(&d.id) {
                        self.in_flight -= 1;
                    }
                }
            }
            next = self.rx.try_recv().ok();
        }
        Ok(())
    }

    /// `XACK`s every completed entry, one pipelined round trip; only then are they done in the
    /// watermark and no longer in flight.
    fn flush_acks(&mut self) -> Result<(), StreamError> {
        if self.parts.iter().all(|p| p.acks.is_empty()) {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for part in &self.parts {
            for chunk in part.acks.chunks(1000) {
                let mut cmd = redis::cmd("XACK");
                cmd.arg(&part.name).arg(&self.group);
                for id in chunk {
                    cmd.arg(id.to_string());
                }
                pipe.add_command(cmd);
            }
        }
        self.conn.query_pipe(&pipe)?;
        for part in &mut self.parts {
            for id in part.acks.drain(..) {
                if part.held.remove(&id) {
                    self.in_flight -= 1;
                }
                self.watermark.complete(part.p, &id);
                self.stats.acked += 1;
            }
        }
        Ok(())
    }

    /// Resets the idle time of every held entry still in this consumer's pending list, so no
    /// other consumer's `XAUTOCLAIM` (which needs `claim_idle` of idleness) takes it.
    fn refresh_holds(&mut self) -> Result<(), StreamError> {
        for i in 0..self.parts.len() {
            let ids: Vec<StreamId> = self.parts[i].held.iter().copied().collect();
            for chunk in ids.chunks(500) {
                let mut inv = self.refresh_script.key(&self.parts[i].name);
                inv.arg(&self.group).arg(&self.name);
                for id in chunk {
                    inv.arg(id.to_string());
                }
                let lost = conn::array(self.conn.script(&inv)?, "the refresh script's reply")?;
                for v in lost {
                    let id = conn::id_of(v)?;
                    self.stats.lost += 1;
                    let p = self.parts[i].p;
                    self.event(Event::Lost { partition: p, id });
                }
            }
        }
        Ok(())
    }

    fn room(&self) -> usize {
        self.max_in_flight.saturating_sub(self.in_flight)
    }

    /// Takes one delivered entry into the consumer: held, tracked, and either queued for its
    /// handler or (no key, deleted) acknowledged at once.
    fn admit(&mut self, i: usize, raw: RawEntry) -> bool {
        let part = &mut self.parts[i];
        if !part.held.insert(raw.id) {
            // Already ours (a re-read after a reconnect, or our own entry in a claim scan).
            return false;
        }
        self.in_flight += 1;
        self.stats.read += 1;
        // Below the mark: an old entry delivered again; it runs, untracked (the mark stays).
        let _ = self.watermark.track(part.p, raw.id);
        let p = part.p;
        let Some(fields) = raw.fields else {
            part.acks.push(raw.id);
            self.stats.deleted += 1;
            self.event(Event::Deleted {
                partition: p,
                id: raw.id,
            });
            return true;
        };
        let (mut key, mut data, mut rest) = (None, None, Vec::new());
        for (f, v) in fields {
            match f.as_slice() {
                b"key" if key.is_none() => key = Some(v),
                b"data" if data.is_none() => data = Some(v),
                _ => rest.push((f, v)),
            }
        }
        let Some(key) = key else {
            part.acks.push(raw.id);
            self.stats.missing_key += 1;
            self.event(Event::MissingKey {
                partition: p,
                id: raw.id,
            });
            return true;
        };
        part.backlog.push_back(Entry {
            partition: p,
            id: raw.id,
            key,
            data: data.unwrap_or_default(),
            fields: rest,
        });
        true
    }

    /// One batch of each re-reading partition's own pending list.
    fn read_own_pending(&mut self) -> Result<bool, StreamError> {
        let mut progressed = false;
        for i in 0..self.parts.len() {
            let Phase::OwnPending { after } = self.parts[i].phase else {
                continue;
            };
            let count = self
                .room()
                .min(self.batch)
                .min(self.watermark.room(self.parts[i].p));
            if count == 0 || self.parts[i].blocked() {
                continue;
            }
            let mut cmd = redis::cmd("XREADGROUP");
            cmd.arg("GROUP")
                .arg(&self.group)
                .arg(&self.name)
                .arg("COUNT")
                .arg(count);
            cmd.arg("STREAMS")
                .arg(&self.parts[i].name)
                .arg(after.to_string());
            let reply = self.query_group(&cmd)?;
            let mut last = None;
            let mut got = 0;
            for (_, es) in conn::read_reply(reply)? {
                for e in es {
                    last = Some(e.id);
                    got += 1;
                    self.admit(i, e);
                }
            }
            progressed |= got > 0;
            self.parts[i].phase = match last {
                Some(id) if got == count => Phase::OwnPending { after: id },
                // Fewer than asked: the list is exhausted.
                _ => Phase::Others,
            };
            if self.parts[i].phase == Phase::Others {
                self.parts[i].next_claim = Instant::now();
            }
        }
        Ok(progressed)
    }

    /// Sends a command that needs the group; if the group is gone (the stream was deleted),
    /// creates it again and retries once.
    fn query_group(&mut self, cmd: &redis::Cmd) -> Result<Value, StreamError> {
        match self.conn.query(cmd) {
            Err(StreamError::Redis(e)) if e.code() == Some("NOGROUP") => {
                for i in 0..self.parts.len() {
                    let mut c = redis::cmd("XGROUP");
                    c.arg("CREATE")
                        .arg(&self.parts[i].name)
                        .arg(&self.group)
                        .arg("0")
                        .arg("MKSTREAM");
                    create_group(&mut self.conn, &c)?;
                }
                self.conn.query(cmd)
            }
            other => other,
        }
    }

    /// Partitions waiting for others: done when no other name has pending entries there, else
    /// `XAUTOCLAIM` what idled past `claim_idle`. Live partitions: a scan every `claim_idle / 2`.
    fn claims(&mut self) -> Result<bool, StreamError> {
        let mut progressed = false;
        let now = Instant::now();
        for i in 0..self.parts.len() {
            let part = &self.parts[i];
            if matches!(part.phase, Phase::OwnPending { .. })
                || now < part.next_claim
                || part.blocked()
            {
                continue;
            }
            if part.phase == Phase::Others && !self.others_pending(i)? {
                let part = &mut self.parts[i];
                part.phase = Phase::Live;
                part.next_claim = now + self.claim_idle / 2;
                continue;
            }
            let count = self
                .room()
                .min(self.batch)
                .min(self.watermark.room(self.parts[i].p));
            if count == 0 {
                continue;
            }
            let mut cmd = redis::cmd("XAUTOCLAIM");
            cmd.arg(&self.parts[i].name)
                .arg(&self.group)
                .arg(&self.name);
            cmd.arg(self.claim_idle.as_millis() as u64)
                .arg(self.parts[i].claim_cursor.to_string());
            cmd.arg("COUNT").arg(count);
            let reply = conn::array(self.query_group(&cmd)?, "an XAUTOCLAIM reply")?;
            let mut it = reply.into_iter();
            let (Some(cursor), Some(claimed)) = (it.next(), it.next()) else {
                return Err(StreamError::Protocol("a short XAUTOCLAIM reply".into()));
            };
            let cursor = conn::id_of(cursor)?;
            let mut count_claimed = 0;
            for e in conn::entries(claimed)? {
                if self.admit(i, e) {
                    count_claimed += 1;
                }
            }
            // The third element lists claimed IDs whose entries were deleted: the server
            // already removed them from the pending list.
            let part = &mut self.parts[i];
            part.claim_cursor = cursor;
            if count_claimed > 0 {
                self.stats.claimed += count_claimed as u64;
                progressed = true;
                let p = part.p;
                self.event(Event::Claimed {
                    partition: p,
                    count: count_claimed,
                });
            }
            let part = &mut self.parts[i];
            part.next_claim = if cursor != StreamId::ZERO {
                now // more to scan
            } else if part.phase == Phase::Others {
                now + (self.claim_idle / 4).min(Duration::from_millis(250))
            } else {
                now + self.claim_idle / 2
            };
        }
        Ok(progressed)
    }

    /// Whether consumer names other than this one have pending entries in partition `i`.
    fn others_pending(&mut self, i: usize) -> Result<bool, StreamError> {
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(&self.parts[i].name).arg(&self.group);
        let reply = conn::array(self.query_group(&cmd)?, "an XPENDING summary")?;
        let Some(consumers) = reply.into_iter().nth(3) else {
            return Err(StreamError::Protocol("a short XPENDING summary".into()));
        };
        for c in conn::array(consumers, "XPENDING's consumers")? {
            let mut pair = conn::array(c, "an XPENDING consumer")?.into_iter();
            let name = pair.next().and_then(conn::bytes);
            let n = pair.next().as_ref().and_then(conn::int).unwrap_or(0);
            if n > 0 && name.as_deref() != Some(self.name.as_bytes()) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Submits each partition's backlog in order, until the serializer refuses one.
    fn submit_backlogs(&mut self) -> Result<bool, StreamError> {
        let mut progressed = false;
        for i in 0..self.parts.len() {
            loop {
                let task = match self.parts[i].stalled.take() {
                    Some(t) => t,
                    None => match self.parts[i].backlog.pop_front() {
                        Some(e) => self.task(i, e),
                        None => break,
                    },
                };
                let refused = match task {
                    Stalled::Blocking(key, f) => match self.serializer.try_submit(key.clone(), f) {
                        Ok(_) => None,
                        Err(r) => Some((r.reason, Stalled::Blocking(key, r.task))),
                    },
                    Stalled::Async(key, fut) => {
                        match self.serializer.try_submit_async(key.clone(), fut) {
                            Ok(_) => None,
                            Err(r) => Some((r.reason, Stalled::Async(key, r.task))),
                        }
                    }
                };
                match refused {
                    None => progressed = true,
                    Some((RejectReason::Shutdown, _)) => {
                        return Err(StreamError::SerializerShutdown)
                    }
                    Some((_, t)) => {
                        // Full (or another transient refusal): keep it at the head, try later.
                        self.parts[i].stalled = Some(t);
                        break;
                    }
                }
            }
        }
        Ok(progressed)
    }

    fn task(&self, i: usize, entry: Entry) -> Stalled {
        let mut guard = DoneGuard {
            tx: self.tx.clone(),
            part: i,
            id: entry.id,
            outcome: None,
            key: Vec::new(),
        };
        let key = entry.key.clone();
        match &self.handler {
            Handler::Blocking(h) => {
                let h = Arc::clone(h);
                Stalled::Blocking(
                    key,
                    Box::new(move || {
                        // The whole guard moves in (and reports when this closure ends or is
                        // dropped unrun).
                        let mut g = guard;
                        let panicked = catch_unwind(AssertUnwindSafe(|| h(&entry))).is_err();
                        if panicked {
                            g.key = entry.key;
                        }
                        g.outcome = Some(panicked);
                    }),
                )
            }
            Handler::Async(h) => {
                let h = Arc::clone(h);
                guard.key = entry.key.clone();
                Stalled::Async(
                    key,
                    Box::pin(async move {
                        let fut: BoxFuture = Box::pin(async move { h(entry).await });
                        Guarded {
                            fut,
                            guard: Some(guard),
                        }
                        .await
                    }),
                )
            }
        }
    }

    /// One `XREADGROUP … >` over the live partitions that have room and nothing queued here.
    fn read_new(&mut self, quiet: bool) -> Result<bool, StreamError> {
        let room = self.room();
        if room == 0 {
            return Ok(false);
        }
        let n = self.parts.len();
        let mut chosen = Vec::new();
        for k in 0..n {
            let i = (self.rotate + k) % n;
            let part = &self.parts[i];
            if part.phase == Phase::Live && !part.blocked() && self.watermark.room(part.p) > 0 {
                chosen.push(i);
            }
            if chosen.len() == room {
                break;
            }
        }
        self.rotate = (self.rotate + 1) % n;
        if chosen.is_empty() {
            return Ok(false);
        }
        let mut count = (room / chosen.len()).min(self.batch).max(1);
        for &i in &chosen {
            count = count.min(self.watermark.room(self.parts[i].p));
        }
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.group)
            .arg(&self.name)
            .arg("COUNT")
            .arg(count);
        if quiet {
            cmd.arg("BLOCK")
                .arg(self.block.min(self.tick).as_millis().max(1) as u64);
        }
        cmd.arg("STREAMS");
        for &i in &chosen {
            cmd.arg(&self.parts[i].name);
        }
        for _ in &chosen {
            cmd.arg(">");
        }
        let reply = self.query_group(&cmd)?;
        let mut got = false;
        for (name, es) in conn::read_reply(reply)? {
            let Some(&i) = self.by_name.get(&name) else {
                return Err(StreamError::Protocol(format!(
                    "entries of a stream not asked for: {}",
                    String::from_utf8_lossy(&name)
                )));
            };
            for e in es {
                got |= self.admit(i, e);
            }
        }
        Ok(got)
    }
}
