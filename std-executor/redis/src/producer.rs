//! Appending entries to the partition streams, never twice.
//!
//! # Protocol: a retried append is not stored twice
//!
//! An `XADD` whose reply was lost (a stall, a reset) may or may not have run, and a generated
//! ID says nothing about which entry it is, so resending it can store the entry twice. Here
//! every append goes through one server-side script call per partition and call (a batch's
//! entries of one partition together), carrying a sequence number that grows with every call
//! of this producer. The script runs atomically: it appends the entries (`XADD`, with the
//! optional approximate `MAXLEN`), then records `seq` and the IDs it got in the producer's
//! marker key `{stream}:{p}:producer:{producer id}` (a hash that expires after a day). A call
//! whose marker already holds its `seq` appended everything before: the script returns the
//! recorded IDs and appends nothing. The connection resends a call only after a reconnect that
//! first closed the old connection on the server (`CLIENT KILL ID`, see `conn.rs`), so the old
//! call has either run (its marker is there) or never will: every entry is stored exactly once.
//! The producer id is random per [`Producer`] (64 bits); the marker of a producer that is gone
//! expires. A server error inside a call (an explicit ID at or below the stream's top) leaves
//! the entries before it appended and records nothing; the error is returned.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use crate::conn::{self, Backoff, Conn, EventFn};
use crate::entry::Event;
use crate::error::StreamError;
use crate::id::StreamId;
use crate::partition::partition_of;
use crate::stream_name;

/// The append script (see the module docs). KEYS: the stream, the marker. ARGV: seq, the
/// marker's time to live (ms), MAXLEN (`0`: none), the entry count; then per entry its ID (`*`
/// or explicit), its field count, and its fields and values.
const APPEND_LUA: &str = r#"
local m = redis.call('HMGET', KEYS[2], 'seq', 'ids')
if m[1] == ARGV[1] then
  return m[2]
end
local ids = {}
local i = 5
for e = 1, tonumber(ARGV[4]) do
  local args = {KEYS[1]}
  if ARGV[3] ~= '0' then
    args[#args + 1] = 'MAXLEN'
    args[#args + 1] = '~'
    args[#args + 1] = ARGV[3]
  end
  args[#args + 1] = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  i = i + 2
  for f = 1, 2 * n do
    args[#args + 1] = ARGV[i]
    i = i + 1
  end
  ids[#ids + 1] = redis.call('XADD', unpack(args))
end
local joined = table.concat(ids, ' ')
redis.call('HSET', KEYS[2], 'seq', ARGV[1], 'ids', joined)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return joined
"#;

/// How long a producer's marker outlives its last append.
const MARKER_TTL: Duration = Duration::from_secs(24 * 3600);

/// One entry to append.
struct Append<'a> {
    id: Option<StreamId>,
    key: &'a [u8],
    data: &'a [u8],
    extra: &'a [(&'a [u8], &'a [u8])],
}

/// Appends entries to a partitioned stream: an entry with key `k` goes to `{stream}:{p}` with
/// `p = partition_of(k, partitions)`, as the fields `key` and `data` (the wire format that
/// producers in other languages follow too).
///
/// A lost connection is retried for ever by default (50 ms doubling to 2 s, each failed attempt
/// an [`Event`] to [`on_event`](Self::on_event); [`reconnect`](Self::reconnect) for a finite
/// count), and a retried append is never stored twice (see the module docs: one script call
/// per partition and call, deduplicated by a sequence number). [`max_len`](Self::max_len)
/// trims each partition stream to about that many entries.
///
/// ```no_run
/// use keyserial_redis::Producer;
/// let mut p = Producer::connect("redis://127.0.0.1:6379", "orders", 8)?.max_len(Some(1_000_000));
/// let id = p.send(b"user-42", b"paid")?;
/// println!("appended {id} to orders:{}", keyserial_redis::partition_of(b"user-42", 8));
/// # Ok::<(), keyserial_redis::StreamError>(())
/// ```
pub struct Producer {
    conn: Conn,
    stream: String,
    partitions: u32,
    /// Random per producer: names its marker keys.
    producer_id: u64,
    /// The sequence number of the last script call.
    seq: u64,
    max_len: Option<u64>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("stream", &self.stream)
            .field("partitions", &self.partitions)
            .field("max_len", &self.max_len)
            .finish_non_exhaustive()
    }
}

impl Producer {
    /// Connects to `url` (`redis://host:port[/db]`) to append to `stream`'s `partitions`
    /// partition streams.
    ///
    /// # Errors
    /// [`StreamError::Config`] for 0 partitions or an empty stream name,
    /// [`StreamError::Connect`] if the server cannot be reached (not retried).
    ///
    /// ```no_run
    /// let p = keyserial_redis::Producer::connect("redis://127.0.0.1:6379", "orders", 8)?;
    /// assert_eq!(p.partitions(), 8);
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn connect(url: &str, stream: &str, partitions: u32) -> Result<Producer, StreamError> {
        if partitions == 0 {
            return Err(StreamError::Config("partitions must be at least 1".into()));
        }
        if stream.is_empty() {
            return Err(StreamError::Config("the stream name is empty".into()));
        }
        let backoff = Backoff {
            attempts: None,
            first: Duration::from_millis(50),
            max: Duration::from_secs(2),
        };
        let on_event: Arc<EventFn> =
            Arc::new(|e: &Event| eprintln!("keyserial_redis::Producer: {e}"));
        Ok(Producer {
            conn: Conn::open(url, backoff, Duration::from_secs(10), on_event)?,
            stream: stream.to_string(),
            partitions,
            producer_id: RandomState::new().hash_one(std::time::SystemTime::now()),
            seq: 0,
            max_len: None,
        })
    }

    /// Gives up on a lost connection after `attempts` failed attempts in a row (waiting
    /// `first`, doubling up to `max`): the call returns [`StreamError::ConnectionLost`]. The
    /// default retries for ever (50 ms doubling to 2 s).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// let p = keyserial_redis::Producer::connect("redis://127.0.0.1:6379", "s", 4)?
    ///     .reconnect(5, Duration::from_millis(50), Duration::from_secs(1));
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn reconnect(mut self, attempts: u32, first: Duration, max: Duration) -> Self {
        self.conn.set_backoff(Backoff {
            attempts: Some(attempts),
            first,
            max,
        });
        self
    }

    /// Called for each [`Event`] (a failed connection attempt; default: one line on stderr).
    ///
    /// ```no_run
    /// let p = keyserial_redis::Producer::connect("redis://127.0.0.1:6379", "s", 4)?
    ///     .on_event(|e| eprintln!("producer: {e}"));
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn on_event(mut self, f: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        self.conn.set_on_event(Arc::new(f));
        self
    }

    /// How long a call waits for the server's reply before it takes the connection for lost
    /// (default 10 s; at least 1 ms).
    ///
    /// ```no_run
    /// let p = keyserial_redis::Producer::connect("redis://127.0.0.1:6379", "s", 4)?
    ///     .command_timeout(std::time::Duration::from_secs(2));
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn command_timeout(mut self, d: Duration) -> Self {
        self.conn.set_timeout(d.max(Duration::from_millis(1)));
        self
    }

    /// Trims each partition stream to about `n` entries on every append (`XADD … MAXLEN ~ n`:
    /// Redis trims whole nodes, so a little more may stay); `None` (the default) never trims.
    /// Trimming deletes entries whether or not consumers processed them: pick `n` well above
    /// what a consumer group can lag.
    ///
    /// ```no_run
    /// let p = keyserial_redis::Producer::connect("redis://127.0.0.1:6379", "s", 4)?
    ///     .max_len(Some(100_000));
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn max_len(mut self, n: Option<u64>) -> Self {
        self.max_len = n;
        self
    }

    /// The number of partitions.
    ///
    /// ```no_run
    /// # let p = keyserial_redis::Producer::connect("redis://127.0.0.1:6379", "s", 4)?;
    /// assert_eq!(p.partitions(), 4);
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// Appends `key`/`data` with a server-generated ID; returns the ID.
    ///
    /// # Errors
    /// A lost connection that reconnecting did not fix (with a finite
    /// [`reconnect`](Self::reconnect)), or the server's error.
    ///
    /// ```no_run
    /// # let mut p = keyserial_redis::Producer::connect("redis://127.0.0.1:6379", "s", 4)?;
    /// let id = p.send(b"k", b"v")?;
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn send(&mut self, key: &[u8], data: &[u8]) -> Result<StreamId, StreamError> {
        self.send_fields(None, key, data, &[])
    }

    /// Appends `key`/`data` under the explicit ID `id` (it must be above the partition stream's
    /// last ID, or the server refuses it with an error).
    ///
    /// # Errors
    /// As [`send`](Self::send); an ID at or below the stream's top is a [`StreamError::Redis`].
    ///
    /// ```no_run
    /// use keyserial_redis::StreamId;
    /// # let mut p = keyserial_redis::Producer::connect("redis://127.0.0.1:6379", "s", 4)?;
    /// p.send_with_id(StreamId::new(1_700_000_000_000, 7), b"k", b"v")?;
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn send_with_id(
        &mut self,
        id: StreamId,
        key: &[u8],
        data: &[u8],
    ) -> Result<StreamId, StreamError> {
        self.send_fields(Some(id), key, data, &[])
    }

    /// Appends `key`/`data` plus extra fields (passed through to the consumer's handler as
    /// [`Entry::fields`](crate::Entry::fields)); `id` as in `send_with_id`, `None` for a
    /// generated one.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    ///
    /// ```no_run
    /// # let mut p = keyserial_redis::Producer::connect("redis://127.0.0.1:6379", "s", 4)?;
    /// p.send_fields(None, b"k", b"v", &[(b"trace".as_slice(), b"abc".as_slice())])?;
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn send_fields(
        &mut self,
        id: Option<StreamId>,
        key: &[u8],
        data: &[u8],
        extra: &[(&[u8], &[u8])],
    ) -> Result<StreamId, StreamError> {
        let ids = self.append(&[Append {
            id,
            key,
            data,
            extra,
        }])?;
        Ok(ids[0])
    }

    /// Appends many entries in one round trip (one script call per partition, pipelined);
    /// returns their IDs in order. Each entry is stored once, also when the connection is
    /// lost mid-batch and the batch is sent again.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    ///
    /// ```no_run
    /// # let mut p = keyserial_redis::Producer::connect("redis://127.0.0.1:6379", "s", 4)?;
    /// let ids = p.send_batch(&[(b"a".as_slice(), b"1".as_slice()), (b"b", b"2")])?;
    /// assert_eq!(ids.len(), 2);
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn send_batch(&mut self, entries: &[(&[u8], &[u8])]) -> Result<Vec<StreamId>, StreamError> {
        let appends: Vec<Append<'_>> = entries
            .iter()
            .map(|(key, data)| Append {
                id: None,
                key,
                data,
                extra: &[],
            })
            .collect();
        self.append(&appends)
    }

    /// One pipelined round trip: a script call per partition present, in partition order.
    fn append(&mut self, entries: &[Append<'_>]) -> Result<Vec<StreamId>, StreamError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        // Per partition, the indexes of its entries, in order.
        let mut by_part: Vec<(u32, Vec<usize>)> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            let p = partition_of(e.key, self.partitions);
            match by_part.iter_mut().find(|(q, _)| *q == p) {
                Some((_, v)) => v.push(i),
                None => by_part.push((p, vec![i])),
            }
        }
        let mut pipe = redis::pipe();
        for (p, idx) in &by_part {
            self.seq += 1;
            let stream = stream_name(&self.stream, *p);
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(APPEND_LUA).arg(2);
            cmd.arg(&stream)
                .arg(format!("{stream}:producer:{:016x}", self.producer_id));
            cmd.arg(self.seq)
                .arg(MARKER_TTL.as_millis() as u64)
                .arg(self.max_len.unwrap_or(0))
                .arg(idx.len());
            for &i in idx {
                let e = &entries[i];
                match e.id {
                    Some(id) => cmd.arg(id.to_string()),
                    None => cmd.arg("*"),
                };
                cmd.arg(2 + e.extra.len());
                cmd.arg("key").arg(e.key).arg("data").arg(e.data);
                for (f, v) in e.extra {
                    cmd.arg(*f).arg(*v);
                }
            }
            pipe.add_command(cmd);
        }
        let replies = self.conn.query_pipe(&pipe)?;
        if replies.len() != by_part.len() {
            return Err(StreamError::Protocol(format!(
                "{} replies to {} appends",
                replies.len(),
                by_part.len()
            )));
        }
        let mut out = vec![StreamId::ZERO; entries.len()];
        for ((_, idx), reply) in by_part.iter().zip(replies) {
            let text = match conn::bytes(reply.clone()) {
                Some(b) => String::from_utf8(b).map_err(|_| conn::protocol("IDs", &reply))?,
                None => return Err(conn::protocol("the append script's reply", &reply)),
            };
            let ids: Vec<StreamId> = text
                .split(' ')
                .map(|s| s.parse().map_err(|_| conn::protocol("an ID", &reply)))
                .collect::<Result<_, _>>()?;
            if ids.len() != idx.len() {
                return Err(conn::protocol("the append script's IDs", &reply));
            }
            for (&i, id) in idx.iter().zip(ids) {
                out[i] = id;
            }
        }
        Ok(out)
    }
}
