//! The consumer's ledger: which entries it holds, what became of each, and the counters. The
//! loop (`consumer.rs`) decides what to read and when; everything an entry's arrival, its task's
//! report and its acknowledgement change is here.
//!
//! # Protocol
//!
//! [`Ledger::admit`] takes a delivered entry: held (with its size, against the in-flight
//! budget), tracked in the watermark, and queued for its task, or (no `key` field, deleted)
//! put straight on the acknowledgement list. [`Ledger::take_report`] takes a task's report: a
//! success goes on the acknowledgement list; a failure with a retry to come records the next
//! attempt (sent to Redis with the next flush, see `group.rs`); a failure of the last attempt
//! goes on the dead-letter list; a task dropped unfinished is let go (released, still pending
//! in Redis). [`Ledger::flush_acks`] sends all of it in one round trip (dead letters appended
//! before anything is acknowledged) and only then releases the entries: an entry stops counting
//! as in flight, and is done in the watermark, only once its `XACK` succeeded.

use std::sync::Arc;

use crate::budget::{self, Budget};
use crate::conn::{EventFn, RawEntry};
use crate::entry::Event;
use crate::error::StreamError;
use crate::group::{Flush, Group};
use crate::id::StreamId;
use crate::part::{self, DeadLetter, Parsed, Part};
use crate::stats::{ConsumerStats, PartitionStats};
use crate::task::{Outcome, Report};
use crate::watermark::Watermark;

/// The consumer's partitions, in-flight budget, watermark and counters.
pub(crate) struct Ledger {
    pub parts: Vec<Part>,
    pub budget: Budget,
    pub watermark: Watermark<StreamId>,
    pub stats: ConsumerStats,
    on_event: Arc<EventFn>,
    dead_letter: String,
}

impl Ledger {
    pub fn new(
        parts: Vec<Part>,
        budget: Budget,
        watermark: Watermark<StreamId>,
        on_event: Arc<EventFn>,
        dead_letter: String,
    ) -> Ledger {
        Ledger {
            parts,
            budget,
            watermark,
            stats: ConsumerStats::default(),
            on_event,
            dead_letter,
        }
    }

    pub fn event(&self, e: Event) {
        (self.on_event)(&e)
    }

    /// Per partition, the figures of the statistics handle.
    pub fn partition_stats(&self) -> Vec<PartitionStats> {
        self.parts
            .iter()
            .map(|p| PartitionStats {
                partition: p.p,
                lag: p.lag,
                in_flight: p.held.len(),
                in_flight_bytes: p.held.values().sum(),
                watermark: self.watermark.mark(p.p).copied(),
                completed: p.completed,
                retried: p.retried,
                dead_lettered: p.dead_lettered,
            })
            .collect()
    }

    /// Accounts for one task report.
    pub fn take_report(&mut self, report: Report) {
        match report {
            Report::Retrying {
                part,
                id,
                key,
                attempt,
                error,
                panicked,
            } => {
                self.stats.failed += 1;
                self.stats.retried += 1;
                self.stats.panicked += u64::from(panicked);
                self.parts[part].retried += 1;
                self.parts[part].retries.push((id, attempt + 1));
                let p = self.parts[part].p;
                self.event(Event::HandlerFailed {
                    partition: p,
                    id,
                    key,
                    attempt,
                    error,
                    retry: true,
                });
            }
            Report::Done {
                part,
                id,
                outcome: Some(Outcome::Ok),
            } => {
                self.stats.processed += 1;
                self.parts[part].completed += 1;
                self.parts[part].acks.push(id);
            }
            Report::Done {
                part,
                id,
                outcome:
                    Some(Outcome::Failed {
                        entry,
                        error,
                        panicked,
                    }),
            } => {
                self.stats.processed += 1;
                self.stats.failed += 1;
                self.stats.panicked += u64::from(panicked);
                let p = self.parts[part].p;
                self.event(Event::HandlerFailed {
                    partition: p,
                    id,
                    key: entry.key.clone(),
                    attempt: entry.attempt(),
                    error: error.clone(),
                    retry: false,
                });
                self.parts[part].dead.push(DeadLetter { entry, error });
            }
            Report::Done {
                part,
                id,
                outcome: None,
            } => {
                // Not finished: not acknowledged; it stays pending for a later delivery.
                if let Some(size) = self.parts[part].held.remove(&id) {
                    self.budget.give(size);
                }
            }
        }
    }

    /// Records the retries' attempt numbers, then appends the dead letters and `XACK`s every
    /// finished entry (one pipelined round trip); only then are they done in the watermark and
    /// no longer in flight.
    pub fn flush_acks(&mut self, group: &mut Group) -> Result<(), StreamError> {
        for i in 0..self.parts.len() {
            if self.parts[i].retries.is_empty() {
                continue;
            }
            let retries = std::mem::take(&mut self.parts[i].retries);
            for id in group.set_attempts(&self.parts[i].name, &retries)? {
                self.stats.lost += 1;
                let p = self.parts[i].p;
                self.event(Event::Lost { partition: p, id });
            }
        }
        if self
            .parts
            .iter()
            .all(|p| p.acks.is_empty() && p.dead.is_empty())
        {
            return Ok(());
        }
        let flush: Vec<Flush<'_>> = self
            .parts
            .iter()
            .filter(|p| !p.acks.is_empty() || !p.dead.is_empty())
            .map(|p| Flush {
                stream: &p.name,
                acks: &p.acks,
                dead: &p.dead,
            })
            .collect();
        group.flush(&self.dead_letter, &flush)?;
        for i in 0..self.parts.len() {
            let part = &mut self.parts[i];
            let dead = std::mem::take(&mut part.dead);
            let mut done: Vec<StreamId> = part
                .acks
                .drain(..)
                .chain(dead.iter().map(|d| d.entry.id))
                .collect();
            // In stream order, most completions move the watermark's mark directly (its
            // in-order case); the result does not depend on the order.
            done.sort_unstable();
            for id in done {
                if let Some(size) = part.held.remove(&id) {
                    self.budget.give(size);
                }
                self.watermark.complete(part.p, &id);
                self.stats.acked += 1;
            }
            let p = part.p;
            for d in dead {
                self.stats.dead_lettered += 1;
                self.parts[i].dead_lettered += 1;
                self.event(Event::DeadLettered {
                    partition: p,
                    id: d.entry.id,
                    stream: self.dead_letter.clone(),
                    attempts: d.entry.attempt(),
                });
            }
        }
        Ok(())
    }

    /// Resets the idle time of every held entry still in this consumer's pending list, so no
    /// other consumer's `XAUTOCLAIM` (which needs `claim_idle` of idleness) takes it.
    pub fn refresh_holds(&mut self, group: &mut Group) -> Result<(), StreamError> {
        for i in 0..self.parts.len() {
            let ids: Vec<StreamId> = self.parts[i].held.keys().copied().collect();
            if ids.is_empty() {
                continue;
            }
            for id in group.refresh(&self.parts[i].name, &ids)? {
                self.stats.lost += 1;
                let p = self.parts[i].p;
                self.event(Event::Lost { partition: p, id });
            }
        }
        Ok(())
    }

    /// Takes one delivered entry into the consumer: held, tracked, and either queued for its
    /// handler or (no key, deleted) acknowledged at once. False if it was held already.
    pub fn admit(&mut self, i: usize, raw: RawEntry, attempt: u32) -> bool {
        let part = &mut self.parts[i];
        let id = raw.id;
        if part.held.contains_key(&id) {
            // Already ours (a re-read after a reconnect, or our own entry in a claim scan).
            return false;
        }
        let size = budget::entry_size(raw.fields.as_deref());
        part.held.insert(id, size);
        self.budget.take(size);
        self.stats.peak_in_flight_bytes = self.budget.peak_bytes() as u64;
        self.stats.read += 1;
        // Below the mark: an old entry delivered again; it runs, untracked (the mark stays).
        let _ = self.watermark.track(part.p, id);
        let p = part.p;
        match part::parse(p, raw) {
            Parsed::Run(mut e) => {
                e.set_attempt(attempt);
                part.backlog.push_back(e);
            }
            Parsed::Deleted => {
                part.acks.push(id);
                self.stats.deleted += 1;
                self.event(Event::Deleted { partition: p, id });
            }
            Parsed::MissingKey => {
                part.acks.push(id);
                self.stats.missing_key += 1;
                self.event(Event::MissingKey { partition: p, id });
            }
        }
        true
    }
}
