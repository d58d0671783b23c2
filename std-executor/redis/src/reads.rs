//! What the loop reads: this consumer's own pending entries, other consumers' entries taken over,
//! new entries. Each step asks for what the ledger's budget and watermark allow and admits what
//! arrives into the ledger; the phases that order the steps are `part.rs`'s.
//!
//! # Protocol
//!
//! A step whose reply was lost ([`Step::Lost`]: the connection was renewed, see `conn.rs`) may
//! have delivered entries to this consumer that it never saw. It admits nothing and returns at
//! once; the loop then sends every partition back to re-reading its own pending list from `0`
//! before any further read, which holds whatever the lost command delivered. Entries already
//! held are skipped by [`Ledger::admit`], so a re-read never runs an entry twice.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::conn::RawEntry;
use crate::entry::Event;
use crate::error::StreamError;
use crate::group::Group;
use crate::id::StreamId;
use crate::ledger::Ledger;
use crate::part::Phase;

/// How a read step went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The reply came; `true` if anything was admitted (or a phase moved on).
    Progress(bool),
    /// The reply was lost: re-read own pending lists before anything else.
    Lost,
}

fn count_for(led: &Ledger, i: usize, batch: usize) -> usize {
    led.budget
        .per_stream(1, batch)
        .min(led.watermark.room(led.parts[i].p))
}

/// Redis's delivery counts of entries just re-read or claimed in partition `i` (those not
/// held yet: the others are skipped by `admit`).
fn delivery_counts(
    g: &mut Group,
    led: &Ledger,
    i: usize,
    es: &[RawEntry],
) -> Result<HashMap<StreamId, u32>, StreamError> {
    let part = &led.parts[i];
    let fresh: Vec<StreamId> = es
        .iter()
        .map(|e| e.id)
        .filter(|id| !part.held.contains_key(id))
        .collect();
    let (Some(&first), Some(&last)) = (fresh.first(), fresh.last()) else {
        return Ok(HashMap::new());
    };
    // This consumer's pending entries in the range: the fresh ones plus held ones there.
    let count = fresh.len() + part.held.range(first..=last).count();
    let name = part.name.clone();
    g.delivery_counts(&name, first, last, count)
}

/// One batch of each re-reading partition's own pending list.
pub(crate) fn own_pending(
    g: &mut Group,
    led: &mut Ledger,
    batch: usize,
) -> Result<Step, StreamError> {
    let mut progressed = false;
    for i in 0..led.parts.len() {
        let Phase::OwnPending { after } = led.parts[i].phase else {
            continue;
        };
        let count = count_for(led, i, batch);
        if count == 0 || led.parts[i].blocked() {
            continue;
        }
        let name = led.parts[i].name.clone();
        let Some(reply) = g.read(&[(&name, after.to_string())], count, None)? else {
            // The reply was lost: every partition starts its re-read again.
            return Ok(Step::Lost);
        };
        let es: Vec<RawEntry> = reply.into_iter().flat_map(|(_, es)| es).collect();
        let counts = delivery_counts(g, led, i, &es)?;
        let last = es.last().map(|e| e.id);
        let got = es.len();
        for e in es {
            let n = counts.get(&e.id).copied().unwrap_or(1);
            led.admit(i, e, n);
        }
        progressed |= got > 0;
        let part = &mut led.parts[i];
        part.phase = match last {
            Some(id) if got == count => Phase::OwnPending { after: id },
            // Fewer than asked: the list is exhausted.
            _ => Phase::Others,
        };
        if part.phase == Phase::Others {
            part.next_claim = Instant::now();
        }
    }
    Ok(Step::Progress(progressed))
}

/// Partitions waiting for others: done when no other name has pending entries there, else
/// `XAUTOCLAIM` what idled past `claim_idle`. Live partitions: a scan every `claim_idle / 2`.
pub(crate) fn claims(
    g: &mut Group,
    led: &mut Ledger,
    batch: usize,
    claim_idle: Duration,
) -> Result<Step, StreamError> {
    let mut progressed = false;
    let now = Instant::now();
    for i in 0..led.parts.len() {
        let part = &led.parts[i];
        if matches!(part.phase, Phase::OwnPending { .. }) || now < part.next_claim || part.blocked()
        {
            continue;
        }
        if part.phase == Phase::Others && !g.others_pending(&part.name)? {
            let part = &mut led.parts[i];
            part.phase = Phase::Live;
            part.next_claim = now + claim_idle / 2;
            continue;
        }
        let count = count_for(led, i, batch);
        if count == 0 {
            continue;
        }
        let name = led.parts[i].name.clone();
        let Some((cursor, claimed)) = g.autoclaim(
            &name,
            claim_idle.as_millis() as u64,
            led.parts[i].claim_cursor,
            count,
        )?
        else {
            // The reply was lost: what it took is in this consumer's pending list now.
            return Ok(Step::Lost);
        };
        let counts = delivery_counts(g, led, i, &claimed)?;
        let mut taken = 0;
        for e in claimed {
            let n = counts.get(&e.id).copied().unwrap_or(1);
            if led.admit(i, e, n) {
                taken += 1;
            }
        }
        if taken > 0 {
            led.stats.claimed += taken as u64;
            progressed = true;
            let p = led.parts[i].p;
            led.event(Event::Claimed {
                partition: p,
                count: taken,
            });
        }
        let part = &mut led.parts[i];
        part.claim_cursor = cursor;
        part.next_claim = if cursor != StreamId::ZERO {
            now // more to scan
        } else if part.phase == Phase::Others {
            now + (claim_idle / 4).min(Duration::from_millis(250))
        } else {
            now + claim_idle / 2
        };
    }
    Ok(Step::Progress(progressed))
}

/// One `XREADGROUP … >` over the live partitions that have room and nothing queued here.
pub(crate) fn new_entries(
    g: &mut Group,
    led: &mut Ledger,
    batch: usize,
    block: Option<u64>,
    rotate: &mut usize,
    by_name: &HashMap<Vec<u8>, usize>,
) -> Result<Step, StreamError> {
    let room = led.budget.entry_room();
    if led.budget.per_stream(1, batch) == 0 {
        return Ok(Step::Progress(false));
    }
    let n = led.parts.len();
    let mut chosen = Vec::new();
    for k in 0..n {
        let i = (*rotate + k) % n;
        let part = &led.parts[i];
        if part.phase == Phase::Live && !part.blocked() && led.watermark.room(part.p) > 0 {
            chosen.push(i);
        }
        if chosen.len() == room {
            break;
        }
    }
    *rotate = (*rotate + 1) % n;
    if chosen.is_empty() {
        return Ok(Step::Progress(false));
    }
    let mut count = led.budget.per_stream(chosen.len(), batch);
    for &i in &chosen {
        count = count.min(led.watermark.room(led.parts[i].p));
    }
    let streams: Vec<(&str, String)> = chosen
        .iter()
        .map(|&i| (led.parts[i].name.as_str(), ">".to_string()))
        .collect();
    let Some(reply) = g.read(&streams, count, block)? else {
        return Ok(Step::Lost);
    };
    let mut got = false;
    for (name, es) in reply {
        let Some(&i) = by_name.get(&name) else {
            return Err(StreamError::Protocol(format!(
                "entries of a stream not asked for: {}",
                String::from_utf8_lossy(&name)
            )));
        };
        for e in es {
            // A new entry: its first delivery.
            got |= led.admit(i, e, 1);
        }
    }
    Ok(Step::Progress(got))
}
