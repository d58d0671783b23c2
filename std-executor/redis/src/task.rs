//! The task an entry runs as: its handler, wrapped so that the consumer loop always hears how it
//! ended.
//!
//! # Protocol
//!
//! Every entry submitted to the serializer carries a [`DoneGuard`]. The guard sends exactly one
//! [`Done`] to the consumer loop when it is dropped: with an outcome once the handler ran (it
//! returned or panicked: a panic is caught here and never unwinds into the serializer), without
//! one when the task was dropped unrun (the serializer was shut down under the consumer), so the
//! loop neither acknowledges an entry that did not run nor waits for ever for a report. The
//! guard moves into the task; whichever way the task ends, the report is sent once.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::entry::Entry;
use crate::id::StreamId;

pub(crate) type BlockingFn = dyn Fn(&Entry) + Send + Sync + 'static;
pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
pub(crate) type AsyncFn = dyn Fn(Entry) -> BoxFuture + Send + Sync + 'static;

/// The user's handler, blocking or async.
#[derive(Clone)]
pub(crate) enum Handler {
    Blocking(Arc<BlockingFn>),
    Async(Arc<AsyncFn>),
}

/// A task built for an entry, not yet accepted by the serializer (kept to be submitted again,
/// in order, when the serializer is full).
pub(crate) enum Stalled {
    Blocking(Vec<u8>, Box<dyn FnOnce() + Send + 'static>),
    Async(Vec<u8>, BoxFuture),
}

/// A finished (or abandoned) task's report to the consumer loop.
pub(crate) struct Done {
    /// The index of the entry's partition among the consumer's.
    pub part: usize,
    pub id: StreamId,
    /// `Some(panicked)`: the task completed; `None`: dropped without running (serializer shut
    /// down under the consumer), so not acknowledged.
    pub outcome: Option<bool>,
    pub key: Vec<u8>,
}

/// Sends the task's [`Done`] when dropped, so a task that is dropped unrun reports too.
pub(crate) struct DoneGuard {
    tx: Sender<Done>,
    part: usize,
    id: StreamId,
    outcome: Option<bool>,
    key: Vec<u8>,
}

impl Drop for DoneGuard {
    fn drop(&mut self) {
        let _ = self.tx.send(Done {
            part: self.part,
            id: self.id,
            outcome: self.outcome,
            key: std::mem::take(&mut self.key),
        });
    }
}

/// Polls the handler's future, turning a panic in it into a report instead of unwinding.
struct Guarded {
    fut: BoxFuture,
    guard: Option<DoneGuard>,
}

impl Future for Guarded {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        match catch_unwind(AssertUnwindSafe(|| this.fut.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(())) => {
                if let Some(mut g) = this.guard.take() {
                    g.outcome = Some(false);
                }
                Poll::Ready(())
            }
            Err(_) => {
                if let Some(mut g) = this.guard.take() {
                    g.outcome = Some(true);
                }
                Poll::Ready(())
            }
        }
    }
}

/// The task for `entry` of the consumer's partition `part`: runs `handler` on it and reports to
/// `tx`.
pub(crate) fn make(handler: &Handler, tx: &Sender<Done>, part: usize, entry: Entry) -> Stalled {
    let mut guard = DoneGuard {
        tx: tx.clone(),
        part,
        id: entry.id,
        outcome: None,
        key: Vec::new(),
    };
    let key = entry.key.clone();
    match handler {
        Handler::Blocking(h) => {
            let h = Arc::clone(h);
            Stalled::Blocking(
                key,
                Box::new(move || {
                    // The whole guard moves in (and reports when this closure ends or is
                    // dropped unrun).
                    let mut g = guard;
                    let panicked = catch_unwind(AssertUnwindSafe(|| h(&entry))).is_err();
                    if panicked {
                        g.key = entry.key;
                    }
                    g.outcome = Some(panicked);
                }),
            )
        }
        Handler::Async(h) => {
            let h = Arc::clone(h);
            guard.key = entry.key.clone();
            Stalled::Async(
                key,
                Box::pin(async move {
                    let fut: BoxFuture = Box::pin(async move { h(entry).await });
                    Guarded {
                        fut,
                        guard: Some(guard),
                    }
                    .await
                }),
            )
        }
    }
}
