//! One Redis connection that reconnects with backoff, and the reply-parsing helpers.
//!
//! # Protocol
//!
//! A command that fails for a connection reason (I/O error, reset, EOF, a reply that did not
//! come within the command timeout) drops the connection; the next attempt dials a new one
//! after a backoff (`first`, doubling, at most `max`; `attempts` failed attempts in a row, or
//! for ever), reporting each failed attempt as [`Event::ConnectionFailed`]. A command the server
//! refused without running it (`LOADING` while it reads its data after a restart, `TRYAGAIN`,
//! `MASTERDOWN`, `CLUSTERDOWN`) waits the same way and is sent again on the same connection.
//!
//! A reply that did not come does not mean the command did not run: a stalled server that
//! resumes executes what was sent before it stopped. So a new connection first closes the old
//! one on the server, `CLIENT KILL ID old` (the old connection's `CLIENT ID`, asked when it was
//! made): when that returns, the old connection's command either ran already or never will.
//! Then:
//! - commands safe to repeat ([`Conn::query`], [`Conn::query_pipe`], [`Conn::script`]: acks,
//!   refreshes, group creation, `XPENDING`) are sent again;
//! - commands that deliver entries to this consumer ([`Conn::query_once`]: reads, claims) are
//!   not: the caller gets `None` and re-reads its own pending list first, which holds whatever
//!   the lost command delivered, before anything newer (`consumer.rs`). `epoch` counts
//!   reconnects so the caller can tell.

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use redis::{Client, Cmd, Connection, Pipeline, Value};

use crate::entry::Event;
use crate::error::StreamError;
use crate::id::StreamId;

/// Called with each [`Event`].
pub(crate) type EventFn = dyn Fn(&Event) + Send + Sync + 'static;

/// How a lost connection is retried: `attempts` failed reconnects in a row (`None`: for ever),
/// waiting `first`, then twice as long each time, at most `max`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    pub attempts: Option<u32>,
    pub first: Duration,
    pub max: Duration,
}

/// A connection that reconnects (see the module docs).
pub(crate) struct Conn {
    client: Client,
    con: Option<Connection>,
    /// The server's `CLIENT ID` of the connection (of the last one, once it is dropped).
    client_id: Option<i64>,
    backoff: Backoff,
    read_timeout: Duration,
    on_event: Arc<EventFn>,
    /// Bumped on every successful reconnect.
    pub epoch: u64,
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_unrecoverable_error()
}

/// The server refused the command for now without running it (loading its data after a
/// restart, a failover): wait and send it again on the same connection.
fn is_busy(e: &redis::RedisError) -> bool {
    matches!(
        e.code(),
        Some("LOADING" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN")
    )
}

impl Conn {
    /// Connects once (no retry: an unreachable server at start is a configuration error).
    pub fn open(
        url: &str,
        backoff: Backoff,
        read_timeout: Duration,
        on_event: Arc<EventFn>,
    ) -> Result<Conn, StreamError> {
        let client = Client::open(url).map_err(StreamError::Connect)?;
        let (con, id) = Self::dial(&client, read_timeout).map_err(StreamError::Connect)?;
        Ok(Conn {
            client,
            con: Some(con),
            client_id: Some(id),
            backoff,
            read_timeout,
            on_event,
            epoch: 0,
        })
    }

    fn dial(client: &Client, read_timeout: Duration) -> redis::RedisResult<(Connection, i64)> {
        let mut con = client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
        con.set_read_timeout(Some(read_timeout))?;
        con.set_write_timeout(Some(read_timeout))?;
        let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut con)?;
        Ok((con, id))
    }

    /// A new connection, after the old one is closed on the server.
    fn redial(&mut self) -> redis::RedisResult<()> {
        let (mut con, id) = Self::dial(&self.client, self.read_timeout)?;
        if let Some(old) = self.client_id {
            let mut kill = redis::cmd("CLIENT");
            kill.arg("KILL").arg("ID").arg(old);
            match kill.query::<Value>(&mut con) {
                // Killed, or already gone ("No such client").
                Ok(_) => {}
                Err(e) if !is_connection_error(&e) => {}
                Err(e) => return Err(e),
            }
        }
        self.con = Some(con);
        self.client_id = Some(id);
        self.epoch += 1;
        Ok(())
    }

    /// Runs `f` on the connection; on a connection error, reconnects (with backoff) and, if
    /// `resend`, runs it again; if not, returns `None` once reconnected.
    fn with<T>(
        &mut self,
        resend: bool,
        mut f: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<Option<T>, StreamError> {
        let mut attempt = 0u32;
        let mut wait = self.backoff.first;
        loop {
            let err = match self.con.as_mut() {
                Some(con) => match f(con) {
                    Ok(v) => return Ok(Some(v)),
                    Err(e) if is_connection_error(&e) => e,
                    Err(e) if is_busy(&e) => {
                        // Not run: the same connection, the same command, after the wait.
                        self.wait_after(&mut attempt, &mut wait, e)?;
                        continue;
                    }
                    Err(e) => return Err(StreamError::Redis(e)),
                },
                None => match self.redial() {
                    Ok(()) if resend => continue,
                    Ok(()) => return Ok(None),
                    Err(e) => e,
                },
            };
            self.con = None;
            self.wait_after(&mut attempt, &mut wait, err)?;
        }
    }

    /// After the failed attempt `attempt` (counted here): gives up past the limit, else reports
    /// it and waits.
    fn wait_after(
        &self,
        attempt: &mut u32,
        wait: &mut Duration,
        err: redis::RedisError,
    ) -> Result<(), StreamError> {
        if self.backoff.attempts.is_some_and(|a| *attempt >= a) {
            return Err(StreamError::ConnectionLost {
                attempts: *attempt,
                last: err,
            });
        }
        *attempt += 1;
        (self.on_event)(&Event::ConnectionFailed {
            attempt: *attempt,
            error: err.to_string(),
            retry_in: *wait,
        });
        thread::sleep(*wait);
        *wait = (*wait * 2).min(self.backoff.max);
        Ok(())
    }

    /// Changes how lost connections are retried.
    pub fn set_backoff(&mut self, backoff: Backoff) {
        self.backoff = backoff;
    }

    /// Changes where events go.
    pub fn set_on_event(&mut self, on_event: Arc<EventFn>) {
        self.on_event = on_event;
    }

    /// Changes the command timeout (of this connection and the next ones).
    pub fn set_timeout(&mut self, d: Duration) {
        self.read_timeout = d;
        if let Some(con) = &self.con {
            let _ = con.set_read_timeout(Some(d));
            let _ = con.set_write_timeout(Some(d));
        }
    }

    /// Reports `e` to the owner's event callback.
    pub fn event(&self, e: &Event) {
        (self.on_event)(e)
    }

    /// A command safe to repeat: sent again on a new connection if the reply was lost.
    pub fn query(&mut self, cmd: &Cmd) -> Result<Value, StreamError> {
        self.with(true, |con| cmd.query::<Value>(con))
            .map(|v| v.unwrap_or(Value::Nil))
    }

    /// A command that is not repeated: `None` if its reply was lost (the connection is new).
    pub fn query_once(&mut self, cmd: &Cmd) -> Result<Option<Value>, StreamError> {
        self.with(false, |con| cmd.query::<Value>(con))
    }

    /// A pipeline safe to repeat.
    pub fn query_pipe(&mut self, pipe: &Pipeline) -> Result<Vec<Value>, StreamError> {
        self.with(true, |con| pipe.query::<Vec<Value>>(con))
            .map(Option::unwrap_or_default)
    }

    /// A script safe to repeat.
    pub fn script(&mut self, inv: &redis::ScriptInvocation<'_>) -> Result<Value, StreamError> {
        self.with(true, |con| inv.invoke::<Value>(con))
            .map(|v| v.unwrap_or(Value::Nil))
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
    let text = match &v {
        Value::BulkString(b) => Some(b.as_slice()),
        Value::SimpleString(s) => Some(s.as_bytes()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes()),
        _ => None,
    };
    match text.and_then(StreamId::from_bytes) {
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
    let list = array(v, "a list of entries")?;
    let mut out = Vec::with_capacity(list.len());
    for e in list {
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
