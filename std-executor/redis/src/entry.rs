//! An entry as the handler sees it, and what the consumer reports besides.

use crate::id::StreamId;

/// One stream entry, handed to the consumer's handler.
///
/// ```
/// use keyserial_redis::{Entry, StreamId};
/// let e = Entry {
///     partition: 3,
///     id: StreamId::new(1_700_000_000_000, 0),
///     key: b"user-42".to_vec(),
///     data: b"paid".to_vec(),
///     fields: vec![(b"trace".to_vec(), b"abc".to_vec())],
/// };
/// assert_eq!(e.field(b"trace"), Some(&b"abc"[..]));
/// assert_eq!(e.field(b"nope"), None);
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
}

impl Entry {
    /// The value of one of the other fields.
    ///
    /// ```
    /// # use keyserial_redis::{Entry, StreamId};
    /// let e = Entry { partition: 0, id: StreamId::ZERO, key: vec![], data: vec![], fields: vec![] };
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
    /// The handler panicked on this entry. The entry counts as processed and is acknowledged
    /// (a poison entry must not block its partition); retry it yourself if you need to.
    HandlerPanicked {
        /// Its partition.
        partition: u32,
        /// Its ID.
        id: StreamId,
        /// Its key.
        key: Vec<u8>,
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
            Event::HandlerPanicked { partition, id, key } => write!(
                f,
                "the handler panicked on entry {id} (key {:?}) of partition {partition}: acknowledged",
                String::from_utf8_lossy(key)
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
        }
    }
}
