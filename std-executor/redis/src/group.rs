//! The consumer group's side in Redis: creating the group, reads, claims, hold refreshes and
//! acknowledgements, each one command (or one pipeline, or one script) on the consumer's
//! connection.
//!
//! # Protocol
//!
//! - Every command that needs the group recovers from `NOGROUP` (the stream and its group were
//!   deleted, or the server lost its data) by creating the group on every owned partition
//!   stream at ID `0` with `MKSTREAM`, then sending the command once more.
//! - A hold refresh ([`Group::refresh`]) is one server-side script per partition and chunk: per
//!   ID, if the entry is still in *this* consumer's pending list, `XCLAIM … JUSTID` it to itself
//!   (idle time back to 0, delivery count unchanged), otherwise report it lost. A script runs
//!   atomically on the server, so a refresh never takes back an entry another consumer claimed
//!   meanwhile (see [Claim safety](crate#claim-safety)).
//! - Acknowledgements of all partitions go in one pipeline.
//!
//! Nothing here decides what to read or claim, or when: that is the loop's (`consumer.rs`).

use redis::Value;

use crate::conn::{self, Conn, RawEntry, StreamEntries};
use crate::entry::Event;
use crate::error::StreamError;
use crate::id::StreamId;
use crate::part::DeadLetter;
use std::collections::HashMap;
use std::sync::Arc;

/// The Lua script that refreshes this consumer's holds (see the module docs).
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

/// The Lua script that records a retry's attempt number as the entry's delivery count: per
/// `(id, count)`, if the entry is still in this consumer's pending list, `XCLAIM … RETRYCOUNT
/// count JUSTID` (which also resets its idle time); otherwise report it lost.
const ATTEMPTS_LUA: &str = r#"
local lost = {}
for i = 3, #ARGV, 2 do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'RETRYCOUNT', ARGV[i + 1], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"#;

/// Whether the server said the group (or its stream) does not exist, also from inside a script.
fn no_group(e: &redis::RedisError) -> bool {
    e.code() == Some("NOGROUP") || e.to_string().contains("NOGROUP")
}

/// One partition's part of a flush: the entries to acknowledge, and those to append to the
/// dead-letter stream first.
pub(crate) struct Flush<'a> {
    pub stream: &'a str,
    pub acks: &'a [StreamId],
    pub dead: &'a [DeadLetter],
}

/// This consumer's view of its group: the connection, the group and consumer names, and the
/// owned partition streams.
pub(crate) struct Group {
    pub conn: Conn,
    pub group: String,
    pub name: String,
    streams: Vec<String>,
    refresh_script: Arc<redis::Script>,
    attempts_script: Arc<redis::Script>,
}

impl Group {
    /// Creates the group on each of `streams` (if missing) and returns the view.
    pub fn open(
        conn: Conn,
        group: String,
        name: String,
        streams: Vec<String>,
    ) -> Result<Group, StreamError> {
        let mut g = Group {
            conn,
            group,
            name,
            streams,
            refresh_script: Arc::new(redis::Script::new(REFRESH_LUA)),
            attempts_script: Arc::new(redis::Script::new(ATTEMPTS_LUA)),
        };
        g.create_all()?;
        Ok(g)
    }

    fn create_all(&mut self) -> Result<(), StreamError> {
        for i in 0..self.streams.len() {
            let mut c = redis::cmd("XGROUP");
            c.arg("CREATE")
                .arg(&self.streams[i])
                .arg(&self.group)
                .arg("0")
                .arg("MKSTREAM");
            match self.conn.query(&c) {
                Ok(_) => {}
                Err(StreamError::Redis(e)) if e.code() == Some("BUSYGROUP") => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sends a command that needs the group; if the group is gone, reports it, creates it
    /// again and retries once. `once`: a delivering command, not resent after a reconnect
    /// (`None`).
    fn query(
        &mut self,
        stream: &str,
        cmd: &redis::Cmd,
        once: bool,
    ) -> Result<Option<Value>, StreamError> {
        let send = |c: &mut Conn| {
            if once {
                c.query_once(cmd)
            } else {
                c.query(cmd).map(Some)
            }
        };
        match send(&mut self.conn) {
            Err(StreamError::Redis(e)) if no_group(&e) => {
                self.group_lost(stream)?;
                send(&mut self.conn)
            }
            other => other,
        }
    }

    /// Runs a script that needs the group, as [`query`](Self::query) (repeatable).
    fn script(
        &mut self,
        stream: &str,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<Value, StreamError> {
        match self.conn.script(inv) {
            Err(StreamError::Redis(e)) if no_group(&e) => {
                self.group_lost(stream)?;
                self.conn.script(inv)
            }
            other => other,
        }
    }

    fn group_lost(&mut self, stream: &str) -> Result<(), StreamError> {
        self.conn.event(&Event::GroupLost {
            stream: stream.to_string(),
            group: self.group.clone(),
        });
        self.create_all()
    }

    /// `XREADGROUP` of up to `count` entries per stream: each `(stream, after)` reads after the
    /// ID `after` (`">"`: new entries; an ID: this consumer's pending list). `block` in ms.
    /// `None`: the reply was lost (it may have delivered entries: re-read the pending list).
    pub fn read(
        &mut self,
        streams: &[(&str, String)],
        count: usize,
        block: Option<u64>,
    ) -> Result<Option<Vec<StreamEntries>>, StreamError> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.group)
            .arg(&self.name)
            .arg("COUNT")
            .arg(count);
        if let Some(ms) = block {
            cmd.arg("BLOCK").arg(ms);
        }
        cmd.arg("STREAMS");
        for (s, _) in streams {
            cmd.arg(*s);
        }
        for (_, after) in streams {
            cmd.arg(after);
        }
        match self.query(streams[0].0, &cmd, true)? {
            Some(v) => conn::read_reply(v).map(Some),
            None => Ok(None),
        }
    }

    /// `XAUTOCLAIM` from `cursor`: entries of `stream` idle at least `idle_ms`, at most `count`.
    /// Returns the next cursor (`0-0`: the scan is complete) and the entries taken; `None` if
    /// the reply was lost (as for [`read`](Self::read)).
    pub fn autoclaim(
        &mut self,
        stream: &str,
        idle_ms: u64,
        cursor: StreamId,
        count: usize,
    ) -> Result<Option<(StreamId, Vec<RawEntry>)>, StreamError> {
        let mut cmd = redis::cmd("XAUTOCLAIM");
        cmd.arg(stream).arg(&self.group).arg(&self.name);
        cmd.arg(idle_ms).arg(cursor.to_string());
        cmd.arg("COUNT").arg(count);
        let Some(reply) = self.query(stream, &cmd, true)? else {
            return Ok(None);
        };
        let reply = conn::array(reply, "an XAUTOCLAIM reply")?;
        let mut it = reply.into_iter();
        let (Some(cursor), Some(claimed)) = (it.next(), it.next()) else {
            return Err(StreamError::Protocol("a short XAUTOCLAIM reply".into()));
        };
        // The third element lists claimed IDs whose entries were deleted: the server already
        // removed them from the pending list.
        Ok(Some((conn::id_of(cursor)?, conn::entries(claimed)?)))
    }

    /// Whether consumer names other than this one have pending entries in `stream`.
    pub fn others_pending(&mut self, stream: &str) -> Result<bool, StreamError> {
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(stream).arg(&self.group);
        let reply = self.query(stream, &cmd, false)?.unwrap_or(Value::Nil);
        let reply = conn::array(reply, "an XPENDING summary")?;
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

    /// Resets the idle time of `ids` in `stream` where they are still this consumer's; returns
    /// those that are not (lost to another consumer).
    pub fn refresh(
        &mut self,
        stream: &str,
        ids: &[StreamId],
    ) -> Result<Vec<StreamId>, StreamError> {
        let mut lost = Vec::new();
        for chunk in ids.chunks(500) {
            let script = Arc::clone(&self.refresh_script);
            let mut inv = script.key(stream);
            inv.arg(&self.group).arg(&self.name);
            for id in chunk {
                inv.arg(id.to_string());
            }
            for v in conn::array(self.script(stream, &inv)?, "the refresh script's reply")? {
                lost.push(conn::id_of(v)?);
            }
        }
        Ok(lost)
    }

    /// Records each `(id, attempt)` of `stream` as the entry's delivery count where it is
    /// still this consumer's; returns those that are not.
    pub fn set_attempts(
        &mut self,
        stream: &str,
        attempts: &[(StreamId, u32)],
    ) -> Result<Vec<StreamId>, StreamError> {
        let mut lost = Vec::new();
        for chunk in attempts.chunks(250) {
            let script = Arc::clone(&self.attempts_script);
            let mut inv = script.key(stream);
            inv.arg(&self.group).arg(&self.name);
            for (id, n) in chunk {
                inv.arg(id.to_string()).arg(*n);
            }
            for v in conn::array(self.script(stream, &inv)?, "the attempts script's reply")? {
                lost.push(conn::id_of(v)?);
            }
        }
        Ok(lost)
    }

    /// The delivery counts of this consumer's pending entries of `stream` from `first` to
    /// `last`, at most `count` of them.
    pub fn delivery_counts(
        &mut self,
        stream: &str,
        first: StreamId,
        last: StreamId,
        count: usize,
    ) -> Result<HashMap<StreamId, u32>, StreamError> {
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(stream).arg(&self.group);
        cmd.arg(first.to_string()).arg(last.to_string()).arg(count);
        cmd.arg(&self.name);
        let mut out = HashMap::new();
        let reply = self.query(stream, &cmd, false)?.unwrap_or(Value::Nil);
        for row in conn::array(reply, "an XPENDING range")? {
            let mut it = conn::array(row, "an XPENDING row")?.into_iter();
            let (Some(id), Some(n)) = (it.next(), it.nth(2)) else {
                return Err(StreamError::Protocol("a short XPENDING row".into()));
            };
            let n = conn::int(&n).unwrap_or(1).clamp(1, i64::from(u32::MAX)) as u32;
            out.insert(conn::id_of(id)?, n);
        }
        Ok(out)
    }

    /// The group's `lag` on each of `streams` (`XINFO GROUPS`, one pipeline): `None` where
    /// Redis does not know it.
    pub fn lags(&mut self, streams: &[&str]) -> Result<Vec<Option<u64>>, StreamError> {
        let mut pipe = redis::pipe();
        for s in streams {
            pipe.add_command(redis::cmd("XINFO").arg("GROUPS").arg(*s).clone());
        }
        let replies = match self.conn.query_pipe(&pipe) {
            Ok(r) => r,
            // A stream not there (yet): lags unknown, not an error of the consumer.
            Err(StreamError::Redis(_)) => return Ok(vec![None; streams.len()]),
            Err(e) => return Err(e),
        };
        let mut out = Vec::with_capacity(streams.len());
        for reply in replies {
            let mut lag = None;
            for g in conn::array(reply, "XINFO GROUPS")? {
                let fields: Vec<(Vec<u8>, Value)> = match g {
                    Value::Map(m) => m
                        .into_iter()
                        .filter_map(|(k, v)| conn::bytes(k).map(|k| (k, v)))
                        .collect(),
                    other => {
                        let mut it = conn::array(other, "an XINFO group")?.into_iter();
                        let mut f = Vec::new();
                        while let (Some(k), Some(v)) = (it.next(), it.next()) {
                            if let Some(k) = conn::bytes(k) {
                                f.push((k, v));
                            }
                        }
                        f
                    }
                };
                let field = |name: &[u8]| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v);
                if field(b"name")
                    .and_then(|v| conn::bytes(v.clone()))
                    .as_deref()
                    == Some(self.group.as_bytes())
                {
                    lag = field(b"lag")
                        .and_then(conn::int)
                        .and_then(|n| u64::try_from(n).ok());
                }
            }
            out.push(lag);
        }
        Ok(out)
    }

    /// Appends the dead letters to `dead_letter` (the entry's own fields, then `source_stream`,
    /// `source_id`, `error`, `attempts`), then `XACK`s everything of each stream, dead letters
    /// included: one pipelined round trip, executed in that order by the server. A connection
    /// lost mid-way sends it all again (at least once into the dead-letter stream).
    pub fn flush(&mut self, dead_letter: &str, parts: &[Flush<'_>]) -> Result<(), StreamError> {
        let mut pipe = redis::pipe();
        for f in parts {
            for d in f.dead {
                let e = &d.entry;
                let mut cmd = redis::cmd("XADD");
                cmd.arg(dead_letter).arg("*");
                cmd.arg("key").arg(&e.key).arg("data").arg(&e.data);
                for (k, v) in &e.fields {
                    cmd.arg(k).arg(v);
                }
                cmd.arg("source_stream").arg(f.stream);
                cmd.arg("source_id").arg(e.id.to_string());
                cmd.arg("error").arg(&d.error);
                cmd.arg("attempts").arg(e.attempt());
                pipe.add_command(cmd).ignore();
            }
        }
        for f in parts {
            let ids = f.acks.iter().chain(f.dead.iter().map(|d| &d.entry.id));
            let ids: Vec<&StreamId> = ids.collect();
            let mut buf = [0u8; 41];
            for chunk in ids.chunks(1000) {
                let mut cmd = redis::cmd("XACK");
                cmd.arg(f.stream).arg(&self.group);
                for id in chunk {
                    cmd.arg(id.write_to(&mut buf));
                }
                pipe.add_command(cmd).ignore();
            }
        }
        self.conn.query_pipe(&pipe)?;
        Ok(())
    }
}
