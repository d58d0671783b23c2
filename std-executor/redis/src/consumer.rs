//! The consumer loop: owns its partitions, reads them in batches, runs each entry under its key
//! on a [`Serializer`], acknowledges it once its task completed.
//!
//! # The loop (one thread, one connection)
//!
//! [`Consumer::run`] repeats, never blocking longer than a *tick* (the read block time, at most
//! half the hold-refresh interval):
//! 1. collect completed tasks and `XACK` them (one pipelined round trip for all partitions);
//! 2. refresh the holds when due (see [Claim safety](crate#claim-safety));
//! 3. partitions still re-reading their own pending list (`XREADGROUP … 0`, then from the last
//!    ID seen) read the next batch of it;
//! 4. partitions waiting for other consumers' pending entries check `XPENDING` and take over what
//!    idled past `claim_idle` with `XAUTOCLAIM`; live partitions scan with `XAUTOCLAIM` every
//!    `claim_idle / 2`;
//! 5. entries read (their *backlog*) are submitted with `try_submit_async` (see `task.rs`); a full
//!    serializer leaves them queued here, which stops that partition's reads;
//! 6. live partitions with an empty backlog read new entries (`>`), all in one `XREADGROUP`,
//!    `BLOCK`ing only when nothing is in flight.
//!
//! An entry is *in flight* from the read that delivered it to the `XACK` that succeeded; reads
//! ask for at most what the in-flight budget (`budget.rs`: entries and bytes) and the
//! partition's watermark room allow.
//! The partition state is `part.rs`'s, the read steps `reads.rs`'s, what becomes of each entry
//! `ledger.rs`'s, the Redis commands `group.rs`'s, the tasks `task.rs`'s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyserial::{RejectReason, Serializer};

use crate::budget::Budget;
use crate::conn::EventFn;
use crate::entry::Event;
use crate::error::StreamError;
use crate::group::Group;
use crate::id::StreamId;
use crate::ledger::Ledger;
use crate::part::{Part, Phase};
use crate::reads::{self, Step};
use crate::stats::{ConsumerStats, StatsHandle};
use crate::stop::StopHandle;
use crate::stream_name;
use crate::task::{self, Handler, Report, Retry, Stalled};
use crate::watermark::Watermark;

/// The loop's settings, checked by the builder.
pub(crate) struct Settings {
    pub max_in_flight: usize,
    pub max_in_flight_bytes: usize,
    pub batch: usize,
    pub claim_idle: Duration,
    pub refresh: Duration,
    pub block: Duration,
    pub exit_when_idle: Option<Duration>,
    pub watermark_limit: usize,
    pub retry: Retry,
    pub dead_letter: String,
    pub drain_timeout: Duration,
    /// The serializer was made by the builder (not given): the consumer may shut it down.
    pub own_serializer: bool,
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
    group: Group,
    cfg: Settings,
    tick: Duration,
    serializer: Arc<Serializer<Vec<u8>>>,
    handler: Handler,
    led: Ledger,
    by_name: HashMap<Vec<u8>, usize>,
    tx: Sender<Report>,
    rx: Receiver<Report>,
    stop: Arc<AtomicBool>,
    shared_stats: StatsHandle,
    next_lag: Instant,
    next_publish: Instant,
    rotate: usize,
    epoch: u64,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("group", &self.group.group)
            .field("name", &self.group.name)
            .field("partitions", &self.owned())
            .field("in_flight", &self.led.budget.entries())
            .field("stats", &self.led.stats)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// The loop over `owned` partitions of `stream`, ready to [`run`](Self::run).
    pub(crate) fn start(
        cfg: Settings,
        group: Group,
        stream: &str,
        owned: &[u32],
        serializer: Arc<Serializer<Vec<u8>>>,
        handler: Handler,
        on_event: Arc<EventFn>,
    ) -> Consumer {
        let mut parts = Vec::new();
        let mut by_name = HashMap::new();
        for &p in owned {
            let name = stream_name(stream, p);
            by_name.insert(name.clone().into_bytes(), parts.len());
            parts.push(Part::new(p, name));
        }
        let (tx, rx) = mpsc::channel();
        let tick = cfg.block.min(cfg.refresh / 2).max(Duration::from_millis(1));
        let led = Ledger::new(
            parts,
            Budget::new(cfg.max_in_flight, cfg.max_in_flight_bytes),
            Watermark::new(cfg.watermark_limit),
            on_event,
            cfg.dead_letter.clone(),
        );
        Consumer {
            group,
            tick,
            serializer,
            handler,
            led,
            by_name,
            cfg,
            tx,
            rx,
            stop: Arc::new(AtomicBool::new(false)),
            shared_stats: StatsHandle::default(),
            next_lag: Instant::now(),
            next_publish: Instant::now(),
            rotate: 0,
            epoch: 0,
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
        self.led.parts.iter().map(|p| p.p).collect()
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
        &self.led.watermark
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
        self.led.stats
    }

    /// A cloneable handle on this consumer's statistics, readable from any thread while
    /// [`run`](Self::run) runs: per partition the lag, in flight, watermark, completed, retried
    /// and dead-lettered entries, and the totals.
    ///
    /// ```no_run
    /// # let mut c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c")
    /// #     .handler(|_| ()).build()?;
    /// let stats = c.stats_handle();
    /// std::thread::spawn(move || {
    ///     std::thread::sleep(std::time::Duration::from_secs(1));
    ///     println!("{:?}", stats.snapshot().totals);
    /// });
    /// c.run()?;
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn stats_handle(&self) -> StatsHandle {
        self.shared_stats.clone()
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
        self.led.budget.entries()
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
        self.led.event(e)
    }

    /// Consumes until stopped ([`stopper`](Self::stopper)), idle for
    /// [`exit_when_idle`](crate::ConsumerBuilder::exit_when_idle), or an error. Returns the stats.
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
        let mut next_refresh = Instant::now() + self.cfg.refresh;
        let mut last_busy = Instant::now();
        loop {
            self.maintain(Duration::ZERO, &mut next_refresh)?;
            self.check_epoch();
            if self.stop.load(Ordering::Acquire) {
                return self.drain(next_refresh);
            }
            let mut progressed = self.read_own_pending()?;
            progressed |= self.claims()?;
            progressed |= self.submit_backlogs()?;
            let quiet = !progressed && self.led.budget.entries() == 0;
            progressed |= self.read_new(quiet)?;
            if self.led.budget.entries() > 0 || progressed {
                last_busy = Instant::now();
            }
            if !progressed && self.led.budget.entries() > 0 {
                // Wait for a task to complete (never longer than a tick: refreshes are due).
                self.collect(self.tick.min(Duration::from_millis(10)))?;
            }
            if let Some(idle) = self.cfg.exit_when_idle {
                let settled = self
                    .led
                    .parts
                    .iter()
                    .all(|p| p.phase == Phase::Live && !p.blocked());
                if settled && self.led.budget.entries() == 0 && last_busy.elapsed() >= idle {
                    self.publish_final()?;
                    return Ok(self.led.stats);
                }
            }
        }
    }

    /// After a reconnect, a reply may have been lost with the connection: entries delivered to
    /// this consumer by a read or a claim whose reply never arrived are in its pending list but
    /// not held. Re-reading its own pending list (skipping held IDs) recovers them; they are
    /// newer than everything held, so per-key order holds. True if it was so.
    fn check_epoch(&mut self) -> bool {
        if self.group.conn.epoch == self.epoch {
            return false;
        }
        self.epoch = self.group.conn.epoch;
        for part in &mut self.led.parts {
            part.reread_own();
        }
        self.event(Event::Reconnected);
        true
    }

    /// Takes reports (waiting up to `wait` for one), acknowledges, refreshes holds when due.
    fn maintain(&mut self, wait: Duration, next_refresh: &mut Instant) -> Result<(), StreamError> {
        self.collect(wait)?;
        self.led.flush_acks(&mut self.group)?;
        if Instant::now() >= *next_refresh {
            self.led.refresh_holds(&mut self.group)?;
            *next_refresh = Instant::now() + self.cfg.refresh;
        }
        self.publish()
    }

    /// Publishes the statistics at most every 10 ms (the group's lags at most once a second).
    fn publish(&mut self) -> Result<(), StreamError> {
        let now = Instant::now();
        if now < self.next_publish {
            return Ok(());
        }
        self.next_publish = now + Duration::from_millis(10);
        if Instant::now() >= self.next_lag {
            let names: Vec<&str> = self.led.parts.iter().map(|p| p.name.as_str()).collect();
            let lags = self.group.lags(&names)?;
            for (part, lag) in self.led.parts.iter_mut().zip(lags) {
                part.lag = lag;
            }
            self.next_lag = Instant::now() + Duration::from_secs(1);
        }
        let parts = self.led.partition_stats();
        self.shared_stats.publish(self.led.stats, &parts);
        Ok(())
    }

    /// Stopping: reads nothing more, lets submitted entries finish and acknowledges them until
    /// `drain_timeout`; past it, a serializer of the consumer's own is shut down at once (tasks
    /// not started, and retries waiting out a backoff, are dropped) and the rest stays pending.
    fn drain(&mut self, mut next_refresh: Instant) -> Result<ConsumerStats, StreamError> {
        let deadline = Instant::now() + self.cfg.drain_timeout;
        // Entries not submitted are let go: they stay in this name's pending list.
        for part in &mut self.led.parts {
            for e in part.backlog.drain(..) {
                if let Some(size) = part.held.remove(&e.id) {
                    self.led.budget.give(size);
                }
            }
            // The refused head task: dropping it reports it through its guard as not run.
            drop(part.stalled.take());
        }
        while self.led.budget.entries() > 0 {
            let now = Instant::now();
            if now >= deadline {
                if self.cfg.own_serializer {
                    drop(self.serializer.shutdown_now());
                    self.collect(Duration::ZERO)?;
                }
                // What finished meanwhile is still acknowledged.
                self.led.flush_acks(&mut self.group)?;
                return Err(StreamError::DrainTimeout {
                    left: self.led.budget.entries(),
                });
            }
            self.maintain(self.tick.min(deadline - now), &mut next_refresh)?;
        }
        self.publish_final()?;
        Ok(self.led.stats)
    }

    /// The last snapshot of a `run`, with fresh lags.
    fn publish_final(&mut self) -> Result<(), StreamError> {
        self.next_lag = Instant::now();
        self.next_publish = Instant::now();
        self.publish()
    }

    /// Takes the tasks' reports: waits up to `wait` for the first.
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
        let mut next = first;
        while let Some(report) = next {
            self.led.take_report(report);
            next = self.rx.try_recv().ok();
        }
        Ok(())
    }

    /// The re-reads of partitions in their `OwnPending` phase.
    fn read_own_pending(&mut self) -> Result<bool, StreamError> {
        self.check_epoch();
        let step = reads::own_pending(&mut self.group, &mut self.led, self.cfg.batch)?;
        Ok(self.after(step))
    }

    /// Claim checks and scans.
    fn claims(&mut self) -> Result<bool, StreamError> {
        if self.check_epoch() {
            return Ok(true);
        }
        let step = reads::claims(
            &mut self.group,
            &mut self.led,
            self.cfg.batch,
            self.cfg.claim_idle,
        )?;
        Ok(self.after(step))
    }

    /// One read of new entries; `quiet`: nothing in flight, so it may block on the server.
    fn read_new(&mut self, quiet: bool) -> Result<bool, StreamError> {
        if self.check_epoch() {
            return Ok(true);
        }
        let block = quiet.then(|| self.cfg.block.min(self.tick).as_millis().max(1) as u64);
        let step = reads::new_entries(
            &mut self.group,
            &mut self.led,
            self.cfg.batch,
            block,
            &mut self.rotate,
            &self.by_name,
        )?;
        Ok(self.after(step))
    }

    /// After a read step: a lost reply sends every partition back to its own pending list.
    fn after(&mut self, step: Step) -> bool {
        match step {
            Step::Progress(p) => p,
            Step::Lost => {
                self.check_epoch();
                true
            }
        }
    }

    /// Submits each partition's backlog in order, until the serializer refuses one.
    fn submit_backlogs(&mut self) -> Result<bool, StreamError> {
        let mut progressed = false;
        for i in 0..self.led.parts.len() {
            loop {
                let refused = match self.led.parts[i].stalled.take() {
                    Some(Stalled(key, fut)) => {
                        match self.serializer.try_submit_async(key.clone(), fut) {
                            Ok(_) => None,
                            Err(r) => Some((r.reason, Stalled(key, r.task))),
                        }
                    }
                    None => {
                        let Some(e) = self.led.parts[i].backlog.pop_front() else {
                            break;
                        };
                        let (key, fut) = task::make(&self.handler, self.cfg.retry, &self.tx, i, e);
                        match self.serializer.try_submit_async(key.clone(), fut) {
                            Ok(_) => None,
                            Err(r) => Some((r.reason, Stalled(key, Box::pin(r.task)))),
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
                        self.led.parts[i].stalled = Some(t);
                        break;
                    }
                }
            }
        }
        Ok(progressed)
    }
}
