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
}
