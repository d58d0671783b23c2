//! One Redis connection that reconnects with backoff, and the reply-parsing helpers.

use std::thread;
use std::time::Duration;

use redis::{Client, Cmd, Connection, Pipeline, Value};

use crate::error::StreamError;
use crate::id::StreamId;

/// How a lost connection is retried: `attempts` reconnects, waiting `first`, then twice as long
/// each time, at most `max`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    pub attempts: u32,
    pub first: Duration,
    pub max: Duration,
}

/// A connection that, when a command fails for a connection reason (I/O error, reset, EOF,
/// timeout), reconnects with [`Backoff`] and sends the command again. Every command this module
/// sends is safe to repeat (see `consumer.rs`: a repeated read is followed by a re-read of the
/// consumer's own pending entries); `epoch` counts reconnects so the caller can tell.
pub(crate) struct Conn {
    client: Client,
    con: Option<Connection>,
    backoff: Backoff,
    read_timeout: Duration,
    /// Bumped on every successful reconnect.
    pub epoch: u64,
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_unrecoverable_error()
}

impl Conn {
    /// Connects once (no retry: an unreachable server at start is a configuration error).
    pub fn open(url: &str, backoff: Backoff, read_timeout: Duration) -> Result<Conn, StreamError> {
        let client = Client::open(url).map_err(StreamError::Connect)?;
        let con = Self::dial(&client, read_timeout).map_err(StreamError::Connect)?;
        Ok(Conn {
            client,
            con: Some(con),
            backoff,
            read_timeout,
            epoch: 0,
        })
    }

    fn dial(client: &Client, read_timeout: Duration) -> redis::RedisResult<Connection> {
        let con = client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
        con.set_read_timeout(Some(read_timeout))?;
        con.set_write_timeout(Some(read_timeout))?;
        Ok(con)
    }

    /// Runs `f` on the connection; on a connection error, reconnects (with backoff) and runs it
    /// again, up to the attempt limit.
    fn with<T>(
        &mut self,
        mut f: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T, StreamError> {
        let mut attempt = 0u32;
        let mut wait = self.backoff.first;
        loop {
            let err = match self.con.as_mut() {
                Some(con) => match f(con) {
                    Ok(v) => return Ok(v),
                    Err(e) if is_connection_error(&e) => e,
                    Err(e) => return Err(StreamError::Redis(e)),
                },
                None => match Self::dial(&self.client, self.read_timeout) {
                    Ok(con) => {
                        self.con = Some(con);
                        self.epoch += 1;
                        continue;
                    }
                    Err(e) => e,
                },
            };
            self.con = None;
            if attempt >= self.backoff.attempts {
                return Err(StreamError::ConnectionLost {
                    attempts: attempt,
                    last: err,
                });
            }
            attempt += 1;
            thread::sleep(wait);
            wait = (wait * 2).min(self.backoff.max);
        }
    }

    pub fn query(&mut self, cmd: &Cmd) -> Result<Value, StreamError> {
        self.with(|con| cmd.query::<Value>(con))
    }

    pub fn query_pipe(&mut self, pipe: &Pipeline) -> Result<Vec<Value>, StreamError> {
        self.with(|con| pipe.query::<Vec<Value>>(con))
    }

    pub fn script(&mut self, inv: &redis::ScriptInvocation<'_>) -> Result<Value, StreamError> {
        self.with(|con| inv.invoke::<Value>(con))
    }
}

pub(crate) fn protocol(what: &str, v: &Value) -> StreamError {
    let mut s = format!("{v:?}");
    if s.len() > 200 {
        let mut cut = 200;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    StreamError::Protocol(format!("{what}: {s}"))
}

pub(crate) fn bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.into_bytes()),
        _ => None,
    }
}

pub(crate) fn id_of(v: Value) -> Result<StreamId, StreamError> {
    match bytes(v.clone()).as_deref().and_then(StreamId::from_bytes) {
        Some(id) => Ok(id),
        None => Err(protocol("an entry ID", &v)),
    }
}

pub(crate) fn array(v: Value, what: &str) -> Result<Vec<Value>, StreamError> {
    match v {
        Value::Array(a) | Value::Set(a) => Ok(a),
        Value::Nil => Ok(Vec::new()),
        other => Err(protocol(what, &other)),
    }
}

pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// An entry as Redis returns it: `[id, [field, value, ...]]`, or `[id, nil]` when the entry
/// was deleted while pending (history reads return those).
pub(crate) struct RawEntry {
    pub id: StreamId,
    /// `None`: deleted.
    pub fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

pub(crate) fn entries(v: Value) -> Result<Vec<RawEntry>, StreamError> {
    let mut out = Vec::new();
    for e in array(v, "a list of entries")? {
        let mut pair = array(e, "an entry")?.into_iter();
        let (Some(id), body) = (pair.next(), pair.next()) else {
            return Err(StreamError::Protocol("an empty entry".into()));
        };
        let id = id_of(id)?;
        let fields = match body {
            None | Some(Value::Nil) => None,
            Some(Value::Map(m)) => {
                let mut f = Vec::with_capacity(m.len());
                for (k, v) in m {
                    match (bytes(k), bytes(v)) {
                        (Some(k), Some(v)) => f.push((k, v)),
                        _ => {
                            return Err(StreamError::Protocol(
                                "a field that is not a string".into(),
                            ))
                        }
                    }
                }
                Some(f)
            }
            Some(body) => {
                let flat = array(body, "an entry's fields")?;
                let mut f = Vec::with_capacity(flat.len() / 2);
                let mut it = flat.into_iter();
                while let Some(k) = it.next() {
                    match (bytes(k), it.next().and_then(bytes)) {
                        (Some(k), Some(v)) => f.push((k, v)),
                        _ => {
                            return Err(StreamError::Protocol(
                                "an odd or non-string field list".into(),
                            ))
                        }
                    }
                }
                Some(f)
            }
        };
        out.push(RawEntry { id, fields });
    }
    Ok(out)
}

/// One stream's part of an XREADGROUP reply: its name and entries.
pub(crate) type StreamEntries = (Vec<u8>, Vec<RawEntry>);

/// An XREADGROUP reply: per stream name, its entries. `Nil` (nothing before the timeout) is
/// empty.
pub(crate) fn read_reply(v: Value) -> Result<Vec<StreamEntries>, StreamError> {
    let mut out = Vec::new();
    match v {
        Value::Nil => {}
        Value::Map(m) => {
            for (k, es) in m {
                let name = bytes(k).ok_or_else(|| StreamError::Protocol("a stream name".into()))?;
                out.push((name, entries(es)?));
            }
        }
        other => {
            for s in array(other, "an XREADGROUP reply")? {
                let mut pair = array(s, "a stream's entries")?.into_iter();
                let (Some(name), Some(es)) = (pair.next(), pair.next()) else {
                    return Err(StreamError::Protocol("a stream without entries".into()));
                };
                let name =
                    bytes(name).ok_or_else(|| StreamError::Protocol("a stream name".into()))?;
                out.push((name, entries(es)?));
            }
        }
    }
    Ok(out)
}
