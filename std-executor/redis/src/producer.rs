//! Appending entries to the partition streams.

use std::sync::Arc;
use std::time::Duration;

use crate::conn::{self, Backoff, Conn, EventFn};
use crate::entry::Event;
use crate::error::StreamError;
use crate::id::StreamId;
use crate::partition::partition_of;
use crate::stream_name;

/// Appends entries to a partitioned stream: an entry with key `k` goes to `{stream}:{p}` with
/// `p = partition_of(k, partitions)`, as the fields `key` and `data` (the wire format of
/// DESIGN.md section 3.3, which producers in other languages follow too).
///
/// A lost connection is retried with backoff (5 attempts); note that an `XADD` whose reply was
/// lost may have been applied, so a retried append can store the entry twice (with
/// [`send_with_id`](Self::send_with_id) the repeat is refused by the server instead).
///
/// ```no_run
/// use keyserial_redis::Producer;
/// let mut p = Producer::connect("redis://127.0.0.1:6379", "orders", 8)?;
/// let id = p.send(b"user-42", b"paid")?;
/// println!("appended {id} to orders:{}", keyserial_redis::partition_of(b"user-42", 8));
/// # Ok::<(), keyserial_redis::StreamError>(())
/// ```
pub struct Producer {
    conn: Conn,
    stream: String,
    partitions: u32,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("stream", &self.stream)
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

impl Producer {
    /// Connects to `url` (`redis://host:port[/db]`) to append to `stream`'s `partitions`
    /// partition streams.
    ///
    /// # Errors
    /// [`StreamError::Config`] for 0 partitions or an empty stream name,
    /// [`StreamError::Connect`] if the server cannot be reached.
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
        })
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
    /// A lost connection that reconnecting did not fix, or the server's error.
    ///
    /// ```no_run
    /// # let mut p = keyserial_redis::Producer::connect("redis://127.0.0.1:6379", "s", 4)?;
    /// let id = p.send(b"k", b"v")?;
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn send(&mut self, key: &[u8], data: &[u8]) -> Result<StreamId, StreamError> {
        let cmd = self.xadd(None, key, data, &[]);
        conn::id_of(self.conn.query(&cmd)?)
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
        let cmd = self.xadd(Some(id), key, data, &[]);
        conn::id_of(self.conn.query(&cmd)?)
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
        let cmd = self.xadd(id, key, data, extra);
        conn::id_of(self.conn.query(&cmd)?)
    }

    /// Appends many entries in one round trip (a pipeline); returns their IDs in order.
    ///
    /// # Errors
    /// As [`send`](Self::send). If the connection is lost mid-batch, the batch is sent again
    /// whole, so entries already appended are appended twice.
    ///
    /// ```no_run
    /// # let mut p = keyserial_redis::Producer::connect("redis://127.0.0.1:6379", "s", 4)?;
    /// let ids = p.send_batch(&[(b"a".as_slice(), b"1".as_slice()), (b"b", b"2")])?;
    /// assert_eq!(ids.len(), 2);
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn send_batch(&mut self, entries: &[(&[u8], &[u8])]) -> Result<Vec<StreamId>, StreamError> {
        let mut pipe = redis::pipe();
        for (key, data) in entries {
            pipe.add_command(self.xadd(None, key, data, &[]));
        }
        self.conn
            .query_pipe(&pipe)?
            .into_iter()
            .map(conn::id_of)
            .collect()
    }

    fn xadd(
        &self,
        id: Option<StreamId>,
        key: &[u8],
        data: &[u8],
        extra: &[(&[u8], &[u8])],
    ) -> redis::Cmd {
        let p = partition_of(key, self.partitions);
        let mut cmd = redis::cmd("XADD");
        cmd.arg(stream_name(&self.stream, p));
        match id {
            Some(id) => cmd.arg(id.to_string()),
            None => cmd.arg("*"),
        };
        cmd.arg("key").arg(key).arg("data").arg(data);
        for (f, v) in extra {
            cmd.arg(*f).arg(*v);
        }
        cmd
    }
}
