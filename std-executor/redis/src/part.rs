//! One owned partition's state: where it is in the ownership protocol, and the entries it holds.
//!
//! # Protocol
//!
//! A partition goes through three [`Phase`]s (see the [crate docs](crate#groups-and-ownership)):
//! `OwnPending` (re-reading this consumer name's pending list from `after`) → `Others`
//! (waiting until no other consumer name has pending entries here, taking over what idled past
//! `claim_idle`) → `Live` (reading new entries). Anything that may have lost a delivery (a
//! reconnect) sends every partition back to `OwnPending` from `0`.
//!
//! An entry is **held** from the read that delivered it until its `XACK` succeeded; while held it
//! is in exactly one of: the `backlog` (read, not yet submitted, in stream order), `stalled` (the
//! backlog's head, built as a task and refused by a full serializer), the serializer (queued or
//! running), or `acks` (completed, to acknowledge). A partition with a backlog or a stalled task
//! reads nothing more, so its entries reach the serializer in stream order. An entry that failed
//! its last attempt waits in `dead` until it is appended to the dead-letter stream, and is
//! acknowledged in the same pipeline, after the append.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use crate::conn::RawEntry;
use crate::entry::Entry;
use crate::id::StreamId;
use crate::task::Stalled;

/// Where an owned partition is in the ownership protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Re-reading this consumer name's own pending entries, after `after`.
    OwnPending { after: StreamId },
    /// Waiting for other consumer names' pending entries to be taken over (or acknowledged).
    Others,
    /// Reading new entries.
    Live,
}

/// One owned partition.
pub(crate) struct Part {
    pub p: u32,
    /// Its Redis stream, `{stream}:{p}`.
    pub name: String,
    pub phase: Phase,
    /// Read, not yet submitted, in stream order.
    pub backlog: VecDeque<Entry>,
    /// The head of the backlog, built and refused by the serializer.
    pub stalled: Option<Stalled>,
    /// Held: read and not yet acknowledged (backlog, submitted, completed-not-acked), with the
    /// size each counts for in the in-flight budget.
    pub held: BTreeMap<StreamId, usize>,
    /// Completed (or not to be run), to `XACK`.
    pub acks: Vec<StreamId>,
    /// Failed their last attempt: to append to the dead-letter stream, then `XACK`.
    pub dead: Vec<DeadLetter>,
    /// Retries about to run: `(id, attempt)` to record as the entry's delivery count.
    pub retries: Vec<(StreamId, u32)>,
    /// Where the next `XAUTOCLAIM` scan starts.
    pub claim_cursor: StreamId,
    /// When the next claim scan (or `XPENDING` check) is due.
    pub next_claim: Instant,
    /// Counters for the statistics handle.
    pub completed: u64,
    pub retried: u64,
    pub dead_lettered: u64,
    /// The group's lag on this stream, last seen.
    pub lag: Option<u64>,
}

impl Part {
    pub fn new(p: u32, name: String) -> Part {
        Part {
            p,
            name,
            phase: Phase::OwnPending {
                after: StreamId::ZERO,
            },
            backlog: VecDeque::new(),
            stalled: None,
            held: BTreeMap::new(),
            acks: Vec::new(),
            dead: Vec::new(),
            retries: Vec::new(),
            claim_cursor: StreamId::ZERO,
            next_claim: Instant::now(),
            completed: 0,
            retried: 0,
            dead_lettered: 0,
            lag: None,
        }
    }

    /// Entries wait here to be submitted: the partition reads nothing more until they are.
    pub fn blocked(&self) -> bool {
        !self.backlog.is_empty() || self.stalled.is_some()
    }

    /// Back to re-reading this consumer's own pending list from the start.
    pub fn reread_own(&mut self) {
        self.phase = Phase::OwnPending {
            after: StreamId::ZERO,
        };
    }
}

/// An entry that failed its last attempt, on its way to the dead-letter stream.
pub(crate) struct DeadLetter {
    pub entry: Entry,
    pub error: String,
}

/// What a delivered entry is.
pub(crate) enum Parsed {
    /// An entry to run.
    Run(Entry),
    /// No `key` field: acknowledged without running.
    MissingKey,
    /// Deleted while pending (no body): acknowledged without running.
    Deleted,
}

/// Splits a delivered entry of partition `p` into its `key`, `data` and other fields.
pub(crate) fn parse(p: u32, raw: RawEntry) -> Parsed {
    let Some(fields) = raw.fields else {
        return Parsed::Deleted;
    };
    let (mut key, mut data, mut rest) = (None, None, Vec::new());
    for (f, v) in fields {
        match f.as_slice() {
            b"key" if key.is_none() => key = Some(v),
            b"data" if data.is_none() => data = Some(v),
            _ => rest.push((f, v)),
        }
    }
    let Some(key) = key else {
        return Parsed::MissingKey;
    };
    Parsed::Run(Entry::new(p, raw.id, key, data.unwrap_or_default(), rest))
}
