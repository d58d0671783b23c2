//! Baseline for futures (W7): a tokio `Mutex` per key.
//!
//! A sharded map key → `Arc<tokio::sync::Mutex<()>>` (created on the key's first future, never
//! removed); every submitted future is `tokio::spawn`ed as a task of its own that locks its key's
//! mutex, awaits the future and unlocks. The runtime is [`tokio_runtime`] (`worker_threads = workers`).
//!
//! That gives mutual exclusion per key, but not submission order: tokio's mutex is fair (FIFO)
//! in the order tasks *first poll* `lock()`, and the runtime polls spawned tasks in roughly,
//! not exactly, the order they were spawned (a worker takes a batch from the shared queue; another
//! worker may poll a later batch first, or steal). Its rows are order-checked like every other
//! and its violations reported, but they do not fail the run: this is what the straightforward
//! version does, and seeing it reorder is part of the comparison.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use tokio::runtime::Runtime;

use crate::exec::{bucket, tokio_runtime, Completion, KeyMap, KeyedExecutor, TaskFuture};

const SHARDS: usize = 64;

type Shard = CachePadded<Mutex<KeyMap<Arc<tokio::sync::Mutex<()>>>>>;

/// A tokio `Mutex` per key; each future a spawned task that holds its key's mutex.
pub struct TokioMutex {
    shards: Box<[Shard]>,
    done: Arc<Completion>,
    rt: Option<Runtime>,
}

impl TokioMutex {
    /// A runtime with `workers` worker threads ([`tokio_runtime`]).
    pub fn new(workers: usize) -> Self {
        let rt = tokio_runtime(workers, "tokio-mutex");
        TokioMutex {
            shards: (0..SHARDS)
                .map(|_| CachePadded::new(Mutex::new(KeyMap::default())))
                .collect(),
            done: Arc::new(Completion::new()),
            rt: Some(rt),
        }
    }

    fn mutex_of(&self, key: u64) -> Arc<tokio::sync::Mutex<()>> {
        let mut shard = self.shards[bucket(key, SHARDS)].lock().unwrap();
        shard.entry(key).or_default().clone()
    }
}

impl KeyedExecutor for TokioMutex {
    fn name(&self) -> String {
        "tokio_mutex".into()
    }

    /// A closure holds its key's mutex while it runs, on a runtime worker (not used by the
    /// workloads: this contender runs W7 only).
    fn submit<F>(&self, key: u64, task: F)
    where
        F: FnOnce() + Send + 'static,
    {
        let m = self.mutex_of(key);
        self.done.submitted();
        let done = self.done.clone();
        let rt = self.rt.as_ref().expect("runtime alive while submitting");
        rt.spawn(async move {
            let _held = m.lock().await;
            task();
            done.completed();
        });
    }

    #[inline]
    fn submit_future<F>(&self, key: u64, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let m = self.mutex_of(key);
        self.done.submitted();
        let done = self.done.clone();
        let rt = self.rt.as_ref().expect("runtime alive while submitting");
        rt.spawn(async move {
            let _held = m.lock().await;
            fut.await;
            done.completed();
        });
    }

    #[inline]
    fn submit_future_boxed(&self, key: u64, fut: TaskFuture) {
        self.submit_future(key, fut);
    }

    fn wait_idle(&self, timeout: Duration) -> bool {
        self.done.wait(timeout)
    }
}

impl Drop for TokioMutex {
    fn drop(&mut self) {
        for shard in self.shards.iter() {
            shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(30));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::block_on;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn futures_of_a_key_never_overlap() {
        let m = TokioMutex::new(2);
        let inside = Arc::new(AtomicU32::new(0));
        let ran = Arc::new(AtomicU32::new(0));
        for _ in 0..200 {
            let (inside, ran) = (inside.clone(), ran.clone());
            m.submit_future(7, async move {
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                ran.fetch_add(1, Ordering::SeqCst);
            });
        }
        assert!(m.wait_idle(Duration::from_secs(10)));
        assert_eq!(ran.load(Ordering::SeqCst), 200);
        // A closure task too.
        let r = ran.clone();
        m.submit(7, move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        assert!(m.wait_idle(Duration::from_secs(10)));
        assert_eq!(block_on(async { ran.load(Ordering::SeqCst) }), 201);
    }
}
