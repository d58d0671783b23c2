//! An entry as the handler sees it, and what the consumer reports besides.

use crate::id::StreamId;

/// One stream entry, handed to the consumer's handler.
///
/// ```
/// use keyserial_redis::{Entry, StreamId};
/// let e = Entry::new(
///     3,
///     StreamId::new(1_700_000_000_000, 0),
///     b"user-42".to_vec(),
///     b"paid".to_vec(),
///     vec![(b"trace".to_vec(), b"abc".to_vec())],
/// );
/// assert_eq!(e.field(b"trace"), Some(&b"abc"[..]));
/// assert_eq!(e.field(b"nope"), None);
/// assert_eq!(e.attempt(), 1);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The partition (`{stream}:{partition}` is the Redis stream it came from).
    pub partition: u32,
    /// Its ID in that stream.
    pub id: StreamId,
    /// The `key` field: the serializer key it ran under.
    pub key: Vec<u8>,
    /// The `data` field (empty if the entry has none).
    pub data: Vec<u8>,
    /// Every other field, in the entry's order.
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// See [`attempt`](Self::attempt).
    attempt: u32,
}

impl Entry {
    /// An entry on its first attempt (for tests of handlers; the consumer makes its own).
    ///
    /// ```
    /// let e = keyserial_redis::Entry::new(0, keyserial_redis::StreamId::new(1, 0), b"k".to_vec(), vec![], vec![]);
    /// assert_eq!((e.partition, e.attempt()), (0, 1));
    /// ```
    pub fn new(
        partition: u32,
        id: StreamId,
        key: Vec<u8>,
        data: Vec<u8>,
        fields: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Entry {
        Entry {
            partition,
            id,
            key,
            data,
            fields,
            attempt: 1,
        }
    }

    /// Which run of this entry this is, 1-based, earlier deliveries included: Redis's delivery
    /// count of the entry when it was read (1 for a first delivery; more when it is re-read
    /// after a crash or taken over from another consumer), plus one for each retry here. Each
    /// retry is recorded in Redis's delivery count before it runs, so a consumer restarted
    /// mid-retry goes on counting.
    ///
    /// ```
    /// # let e = keyserial_redis::Entry::new(0, keyserial_redis::StreamId::new(1, 0), b"k".to_vec(), vec![], vec![]);
    /// if e.attempt() > 1 {
    ///     println!("entry {} again (attempt {})", e.id, e.attempt());
    /// }
    /// ```
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    pub(crate) fn set_attempt(&mut self, attempt: u32) {
        self.attempt = attempt.max(1);
    }

    /// The value of one of the other fields.
    ///
    /// ```
    /// # use keyserial_redis::{Entry, StreamId};
    /// let e = Entry::new(0, StreamId::ZERO, vec![], vec![], vec![]);
    /// assert!(e.field(b"x").is_none());
    /// ```
    pub fn field(&self, name: &[u8]) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(f, _)| f == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// Something the consumer did besides running an entry's handler, reported to
/// [`ConsumerBuilder::on_event`](crate::ConsumerBuilder::on_event).
///
/// ```
/// use keyserial_redis::{Event, StreamId};
/// let e = Event::MissingKey { partition: 1, id: StreamId::new(5, 0) };
/// assert_eq!(e.to_string(), "entry 5-0 of partition 1 has no key field: acknowledged, not run");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// An entry without a `key` field: acknowledged without running (it blocks nothing).
    MissingKey {
        /// Its partition.
        partition: u32,
        /// Its ID.
        id: StreamId,
    },
    /// A pending entry whose body was deleted from the stream (`XDEL`, trimming) while it was
    /// pending: acknowledged without running, so it does not stay in the pending list.
    Deleted {
        /// Its partition.
        partition: u32,
        /// Its ID.
        id: StreamId,
    },
    /// The handler failed on this entry (returned an error or panicked). With `retry` it runs
    /// again after a backoff, before the key's later entries; without, it goes to the
    /// dead-letter stream ([`Event::DeadLettered`] once it is there).
    HandlerFailed {
        /// Its partition.
        partition: u32,
        /// Its ID.
        id: StreamId,
        /// Its key.
        key: Vec<u8>,
        /// The attempt that failed ([`Entry::attempt`]).
        attempt: u32,
        /// The error's text (`panicked: …` for a panic).
        error: String,
        /// Whether it runs again.
        retry: bool,
    },
    /// An entry that failed its last attempt was appended to the dead-letter stream and then
    /// acknowledged.
    DeadLettered {
        /// Its partition.
        partition: u32,
        /// Its ID.
        id: StreamId,
        /// The dead-letter stream.
        stream: String,
        /// Its attempts.
        attempts: u32,
    },
    /// Entries of other consumer names taken over with `XAUTOCLAIM` (they idled longer than
    /// `claim_idle`: their consumer is gone).
    Claimed {
        /// Their partition.
        partition: u32,
        /// How many.
        count: usize,
    },
    /// An entry this consumer holds was found in another consumer's pending list when it
    /// refreshed its holds: this consumer did not refresh for longer than the other's
    /// `claim_idle` (a stall), and the entry may run twice.
    Lost {
        /// Its partition.
        partition: u32,
        /// Its ID.
        id: StreamId,
    },
    /// The connection was lost and re-established; the consumer re-reads its own pending
    /// entries (replies lost with the connection are recovered from there).
    Reconnected,
    /// A command failed for a connection reason (or a reconnect failed); the next attempt is
    /// in `retry_in`.
    ConnectionFailed {
        /// Failed attempts in a row, from 1.
        attempt: u32,
        /// The error's text.
        error: String,
        /// The wait before the next attempt.
        retry_in: std::time::Duration,
    },
    /// The consumer group was found missing on `stream` (the server lost its data, or the
    /// stream was deleted): entries this consumer held there are no longer pending anywhere.
    /// Reported before the group is created again (at ID `0`, with `MKSTREAM`).
    GroupLost {
        /// The partition stream where a command found no group.
        stream: String,
        /// The group.
        group: String,
    },
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::MissingKey { partition, id } => write!(
                f,
                "entry {id} of partition {partition} has no key field: acknowledged, not run"
            ),
            Event::Deleted { partition, id } => write!(
                f,
                "pending entry {id} of partition {partition} was deleted from the stream: acknowledged, not run"
            ),
            Event::HandlerFailed {
                partition,
                id,
                key,
                attempt,
                error,
                retry,
            } => write!(
                f,
                "the handler failed on entry {id} (key {:?}) of partition {partition}, attempt {attempt}: {error}{}",
                String::from_utf8_lossy(key),
                if *retry { "; retrying" } else { "" }
            ),
            Event::DeadLettered {
                partition,
                id,
                stream,
                attempts,
            } => write!(
                f,
                "entry {id} of partition {partition} failed {attempts} attempts: appended to {stream} and acknowledged"
            ),
            Event::Claimed { partition, count } => write!(
                f,
                "took over {count} entries of departed consumers in partition {partition}"
            ),
            Event::Lost { partition, id } => write!(
                f,
                "entry {id} of partition {partition} was claimed by another consumer while held here"
            ),
            Event::Reconnected => f.write_str("reconnected to redis; re-reading own pending entries"),
            Event::ConnectionFailed {
                attempt,
                error,
                retry_in,
            } => write!(
                f,
                "redis connection attempt {attempt} failed ({error}); retrying in {} ms",
                retry_in.as_millis()
            ),
            Event::GroupLost { stream, group } => write!(
                f,
                "consumer group {group} is missing on {stream} (redis lost its data?): creating it again"
            ),
        }
    }
}
