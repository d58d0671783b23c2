//! What a consumer has done so far: counters kept by the consumer loop.

/// What a consumer has done so far ([`Consumer::stats`](crate::Consumer::stats)).
///
/// ```
/// let s = keyserial_redis::ConsumerStats::default();
/// assert_eq!(s.acked, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Entries delivered by reads and claims (including re-deliveries).
    pub read: u64,
    /// Entries whose task finished: succeeded, or failed its last attempt.
    pub processed: u64,
    /// Entries acknowledged.
    pub acked: u64,
    /// Entries taken over from other consumer names.
    pub claimed: u64,
    /// Entries without a `key` field (acknowledged, not run).
    pub missing_key: u64,
    /// Pending entries whose body was deleted (acknowledged, not run).
    pub deleted: u64,
    /// Handler runs that failed (returned an error or panicked), retried or not.
    pub failed: u64,
    /// Of those, the runs that panicked.
    pub panicked: u64,
    /// Failed runs followed by a retry.
    pub retried: u64,
    /// Entries appended to the dead-letter stream (and then acknowledged).
    pub dead_lettered: u64,
    /// Held entries found claimed by another consumer at a refresh.
    pub lost: u64,
    /// The most bytes ever in flight (see
    /// [`max_in_flight_bytes`](crate::ConsumerBuilder::max_in_flight_bytes)).
    pub peak_in_flight_bytes: u64,
}

/// One owned partition's figures in a [`StatsSnapshot`].
///
/// ```
/// let p = keyserial_redis::PartitionStats::default();
/// assert_eq!((p.in_flight, p.completed), (0, 0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionStats {
    /// The partition.
    pub partition: u32,
    /// Entries of the partition stream the group has not read yet (Redis's `lag` of the group,
    /// from `XINFO GROUPS`, refreshed about once a second); `None` until known, or when Redis
    /// cannot tell (after an `XDEL` or trim in the unread part).
    pub lag: Option<u64>,
    /// Entries read and not yet acknowledged.
    pub in_flight: usize,
    /// Their size, as the in-flight byte bound counts it (fields plus 64 bytes each).
    pub in_flight_bytes: usize,
    /// The highest ID with every earlier entry of this consumer done ([`Watermark::mark`](crate::Watermark::mark)).
    pub watermark: Option<crate::StreamId>,
    /// Entries acknowledged after they succeeded.
    pub completed: u64,
    /// Failed runs followed by a retry.
    pub retried: u64,
    /// Entries appended to the dead-letter stream.
    pub dead_lettered: u64,
}

/// What a running consumer looks like at one moment ([`StatsHandle::snapshot`]).
///
/// ```
/// let s = keyserial_redis::StatsSnapshot::default();
/// assert!(s.partitions.is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// The consumer's counters.
    pub totals: ConsumerStats,
    /// Per owned partition, in partition order.
    pub partitions: Vec<PartitionStats>,
    /// Times the consumer loop published.
    pub published: u64,
}

/// A cloneable view of a consumer's statistics, readable from any thread while
/// [`Consumer::run`](crate::Consumer::run) runs ([`Consumer::stats_handle`](crate::Consumer::stats_handle)).
/// The loop publishes a fresh snapshot every 10 ms or so while it runs (every round of the loop
/// at most that often; a round ends at least every tick, 100 ms by default), and once more when
/// `run` returns.
///
/// ```no_run
/// # let mut c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 8, "g", "c")
/// #     .handler(|_| ()).build()?;
/// let stats = c.stats_handle();
/// std::thread::spawn(move || loop {
///     for p in stats.snapshot().partitions {
///         println!("partition {}: lag {:?}, in flight {}", p.partition, p.lag, p.in_flight);
///     }
///     std::thread::sleep(std::time::Duration::from_secs(10));
/// });
/// c.run()?;
/// # Ok::<(), keyserial_redis::StreamError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct StatsHandle(pub(crate) std::sync::Arc<std::sync::Mutex<StatsSnapshot>>);

impl StatsHandle {
    /// The latest published snapshot.
    ///
    /// ```
    /// let h = keyserial_redis::StatsHandle::default();
    /// assert_eq!(h.snapshot().totals.acked, 0);
    /// ```
    pub fn snapshot(&self) -> StatsSnapshot {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the snapshot (the consumer loop).
    pub(crate) fn publish(&self, totals: ConsumerStats, partitions: &[PartitionStats]) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.totals = totals;
        g.partitions.clear();
        g.partitions.extend_from_slice(partitions);
        g.published += 1;
    }
}
