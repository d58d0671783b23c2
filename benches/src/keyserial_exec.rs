//! The keyserial rows: an adapter from [`KeyedExecutor`] to `keyserial::Serializer<u64>`.
//!
//! It uses only the public API contract (DESIGN.md section 3): `Serializer::builder()`,
//! `.workers(n)`, `.tokio_handle(h)`, `.capacity(c)` (the bounded row only), `.build()`, `execute(key,
//! closure)` and `execute_async(key, future)`.
//! The closure is passed on as it is, wrapped only to count its completion: no `Box` (keyserial's
//! own allocation per task is part of what is measured). In the boxed mode the closure is the
//! pre-boxed `Task` itself, passed to `execute` the same way (the default
//! [`KeyedExecutor::submit_boxed`]).
//! Futures (W7, W8) go to `execute_async(key, future)` (no handle, as closures go to `execute`),
//! wrapped only to count their completion. For the workloads of futures the serializer is built
//! with `tokio_handle` (Cargo feature `tokio`) on a runtime of the same configuration as the tokio
//! contenders' ([`tokio_runtime`]), as a tokio application's serializer uses its runtime: W8's
//! futures sleep on its timer. For closures there is no runtime: the rows of W1-W6 are what they
//! were before the runtime existed.
//! Waiting for idle uses the same [`Completion`] counters as every baseline.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keyserial::Serializer;

use tokio::runtime::Runtime;

use crate::exec::{tokio_runtime, Completion, KeyedExecutor, StaticRef};

/// keyserial's `Serializer<u64>` behind the comparison trait.
pub struct KeyserialExec {
    // Declared first, so dropped first: dropping the serializer runs or drops every queued task
    // and joins the workers, after which nothing uses `done` through a `StaticRef`.
    ser: Serializer<u64>,
    done: Arc<Completion>,
    // Dropped after the serializer, so no future outlives the timer it may be registered with.
    _rt: Option<Runtime>,
}

impl KeyserialExec {
    /// A serializer with `workers` worker threads, if `tokio` a tokio runtime handle
    /// ([`tokio_runtime`] with `workers` threads), and, if given, a queue bound of `capacity`
    /// tasks (everything else at its defaults).
    pub fn new(workers: usize, capacity: Option<usize>, tokio: bool) -> Self {
        let rt = tokio.then(|| tokio_runtime(workers, "keyserial-tokio"));
        let mut builder = Serializer::<u64>::builder().workers(workers);
        if let Some(rt) = &rt {
            builder = builder.tokio_handle(rt.handle().clone());
        }
        if let Some(c) = capacity {
            builder = builder.capacity(c);
        }
        let ser = builder.build().expect("valid builder settings");
        KeyserialExec {
            ser,
            done: Arc::new(Completion::new()),
            _rt: rt,
        }
    }
}

impl KeyedExecutor for KeyserialExec {
    fn name(&self) -> String {
        "keyserial".into()
    }

    #[inline]
    fn submit<F>(&self, key: u64, task: F)
    where
        F: FnOnce() + Send + 'static,
    {
        self.done.submitted();
        // SAFETY: `done` is heap-allocated (stable address) and outlives every task: the
        // serializer, which owns the tasks, is dropped before it (field order).
        let done = unsafe { StaticRef::new(&*self.done) };
        if let Err(rejected) = self.ser.execute(key, move || {
            task();
            done.completed();
        }) {
            // Not run: count it as finished so `wait_idle` returns; the checker reports it lost.
            drop(rejected);
            self.done.completed();
        }
    }

    #[inline]
    fn submit_future<F>(&self, key: u64, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.done.submitted();
        // SAFETY: as in `submit`: the serializer, which owns the futures, is dropped first.
        let done = unsafe { StaticRef::new(&*self.done) };
        if let Err(rejected) = self.ser.execute_async(key, async move {
            fut.await;
            done.completed();
        }) {
            drop(rejected);
            self.done.completed();
        }
    }

    fn wait_idle(&self, timeout: Duration) -> bool {
        self.done.wait(timeout)
    }
}
