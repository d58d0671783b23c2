//! The task an entry runs as: its handler, retried with backoff in its key's order, wrapped so
//! that the consumer loop always hears how it ended.
//!
//! # Protocol
//!
//! Every entry is submitted to the serializer as one future under its key. The future runs the
//! handler (a blocking handler is called inside `poll`, on the worker; a panic is caught here and
//! counts as a failure, it never unwinds into the serializer). On a failure with attempts left
//! ([`Entry::attempt`] below `max_attempts`) it sends [`Report::Retrying`] to the loop (which
//! records the next attempt in Redis's delivery count, so a restart goes on counting), waits the
//! backoff on the timer ([`crate::timer`], holding no worker: other keys go on) and runs the
//! handler again. The future holds its key the whole time, so the key's later entries wait
//! behind it, and the entry stays held (its idle time refreshed) until the loop acknowledges it.
//!
//! The future carries a [`DoneGuard`] that sends exactly one [`Report::Done`] when dropped: with
//! the outcome once the handler succeeded or failed for the last time (then with the entry, for
//! the dead-letter stream), without one when the task was dropped unfinished (the serializer was
//! shut down under the consumer), so the loop neither acknowledges an entry that did not finish
//! nor waits for ever for a report.

use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::entry::Entry;
use crate::id::StreamId;
use crate::outcome::BoxError;
use crate::timer;

pub(crate) type BlockingFn = dyn Fn(&Entry) -> Result<(), BoxError> + Send + Sync + 'static;
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
pub(crate) type AsyncFn = dyn Fn(Entry) -> BoxFuture<Result<(), BoxError>> + Send + Sync + 'static;

/// The user's handler, blocking or async.
#[derive(Clone)]
pub(crate) enum Handler {
    Blocking(Arc<BlockingFn>),
    Async(Arc<AsyncFn>),
}

/// How failures are retried: up to `max_attempts` runs in all, waiting `first`, doubling up to
/// `max`, between them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Retry {
    pub max_attempts: u32,
    pub first: Duration,
    pub max: Duration,
}

impl Retry {
    /// The wait after the `failures`-th failure (1-based): `first * 2^(failures-1)`, capped.
    pub fn backoff(&self, failures: u32) -> Duration {
        let doubled = self
            .first
            .checked_mul(1u32 << failures.saturating_sub(1).min(31))
            .unwrap_or(self.max);
        doubled.min(self.max)
    }
}

/// A task built for an entry (its key and future) and refused by a full serializer, kept to be
/// submitted again, in order (boxed only then: the common path submits the future unboxed).
pub(crate) struct Stalled(pub Vec<u8>, pub BoxFuture<()>);

/// How an entry's task ended.
pub(crate) enum Outcome {
    /// The handler succeeded.
    Ok,
    /// The handler failed on its last allowed attempt: to the dead-letter stream.
    Failed {
        entry: Entry,
        error: String,
        panicked: bool,
    },
}

/// A task's report to the consumer loop.
pub(crate) enum Report {
    /// The handler failed on `entry`'s attempt `attempt`; it runs again after the backoff.
    Retrying {
        part: usize,
        id: StreamId,
        key: Vec<u8>,
        attempt: u32,
        error: String,
        panicked: bool,
    },
    /// The task ended: `None` if it was dropped unfinished (not acknowledged).
    Done {
        part: usize,
        id: StreamId,
        outcome: Option<Outcome>,
    },
}

/// Sends the task's [`Report::Done`] when dropped, so a task dropped unfinished reports too.
struct DoneGuard {
    tx: Sender<Report>,
    part: usize,
    id: StreamId,
    outcome: Option<Outcome>,
}

impl DoneGuard {
    /// Reports `outcome` (by dropping the guard).
    fn finish(mut self, outcome: Outcome) {
        self.outcome = Some(outcome);
    }
}

impl Drop for DoneGuard {
    fn drop(&mut self) {
        let _ = self.tx.send(Report::Done {
            part: self.part,
            id: self.id,
            outcome: self.outcome.take(),
        });
    }
}

/// The text of a panic's payload.
fn panic_text(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_string()
    }
}

/// Polls a future, turning a panic in it into an error instead of unwinding.
struct CatchUnwind(BoxFuture<Result<(), BoxError>>);

impl Future for CatchUnwind {
    type Output = Result<(), (String, bool)>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match catch_unwind(AssertUnwindSafe(|| self.0.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(r)) => Poll::Ready(r.map_err(|e| (e.to_string(), false))),
            Err(p) => Poll::Ready(Err((panic_text(&*p), true))),
        }
    }
}

/// One run of the handler on `entry`: `Err((error, panicked))` on a failure.
async fn run_once(handler: &Handler, entry: &Entry) -> Result<(), (String, bool)> {
    match handler {
        Handler::Blocking(h) => match catch_unwind(AssertUnwindSafe(|| h(entry))) {
            Ok(r) => r.map_err(|e| (e.to_string(), false)),
            Err(p) => Err((panic_text(&*p), true)),
        },
        Handler::Async(h) => match catch_unwind(AssertUnwindSafe(|| h(entry.clone()))) {
            Ok(fut) => CatchUnwind(fut).await,
            Err(p) => Err((panic_text(&*p), true)),
        },
    }
}

/// The task for `entry` of the consumer's partition `part`: runs `handler` on it, retries as
/// `retry` says, and reports to `tx`.
pub(crate) fn make(
    handler: &Handler,
    retry: Retry,
    tx: &Sender<Report>,
    part: usize,
    entry: Entry,
) -> (Vec<u8>, impl Future<Output = ()> + Send + 'static) {
    let guard = DoneGuard {
        tx: tx.clone(),
        part,
        id: entry.id,
        outcome: None,
    };
    let key = entry.key.clone();
    let handler = handler.clone();
    let fut = async move {
        let mut entry = entry;
        loop {
            let Err((error, panicked)) = run_once(&handler, &entry).await else {
                guard.finish(Outcome::Ok);
                return;
            };
            let attempt = entry.attempt();
            if attempt >= retry.max_attempts {
                guard.finish(Outcome::Failed {
                    entry,
                    error,
                    panicked,
                });
                return;
            }
            let _ = guard.tx.send(Report::Retrying {
                part,
                id: entry.id,
                key: entry.key.clone(),
                attempt,
                error,
                panicked,
            });
            timer::sleep(retry.backoff(attempt)).await;
            entry.set_attempt(attempt + 1);
        }
    };
    (key, fut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let r = Retry {
            max_attempts: 10,
            first: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let waits: Vec<u128> = (1..=6).map(|n| r.backoff(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(r.backoff(200), Duration::from_secs(1));
    }
}
