//! Baseline: a tokio actor per key.
//!
//! Each key gets an unbounded `tokio::sync::mpsc` channel and a spawned task that receives and runs
//! the key's tasks in order; a sharded `Mutex<HashMap<u64, UnboundedSender>>` finds a key's sender
//! (created, with its actor, on the key's first task). The runtime is [`tokio_runtime`] (`worker_threads = workers`).
//! Tasks are plain closures run on the runtime's workers, as they would be in an application that
//! moved its per-key work onto tokio. Actors live until the executor is dropped (the map never
//! shrinks), which is what a straightforward version does; it costs a task and a channel per key.
//!
//! Futures (W7) go to actors of their own, in a second map: a key's actor receives boxed futures
//! and awaits each before taking the next, so a pending future holds its key, not a worker.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use tokio::runtime::Runtime;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::exec::{bucket, tokio_runtime, Completion, KeyMap, KeyedExecutor, Task, TaskFuture};

const SHARDS: usize = 64;

/// One shard of a key → actor map.
type Shard<T> = CachePadded<Mutex<KeyMap<UnboundedSender<T>>>>;

fn shards<T>() -> Box<[Shard<T>]> {
    (0..SHARDS)
        .map(|_| CachePadded::new(Mutex::new(KeyMap::default())))
        .collect()
}

/// An actor (channel + spawned task) per key on a multi-thread tokio runtime.
pub struct TokioActor {
    shards: Box<[Shard<Task>]>,
    /// The actors of futures (W7).
    future_shards: Box<[Shard<TaskFuture>]>,
    done: Arc<Completion>,
    rt: Option<Runtime>,
}

impl TokioActor {
    /// A runtime with `workers` worker threads ([`tokio_runtime`]).
    pub fn new(workers: usize) -> Self {
        let rt = tokio_runtime(workers, "tokio-actor");
        TokioActor {
            shards: shards(),
            future_shards: shards(),
            done: Arc::new(Completion::new()),
            rt: Some(rt),
        }
    }
}

impl KeyedExecutor for TokioActor {
    fn name(&self) -> String {
        "tokio_actor".into()
    }

    #[inline]
    fn submit<F>(&self, key: u64, task: F)
    where
        F: FnOnce() + Send + 'static,
    {
        self.submit_boxed(key, Box::new(task));
    }

    #[inline]
    fn submit_boxed(&self, key: u64, task: Task) {
        self.done.submitted();
        let mut shard = self.shards[bucket(key, SHARDS)].lock().unwrap();
        let tx = shard.entry(key).or_insert_with(|| {
            let (tx, mut rx) = unbounded_channel::<Task>();
            let done = self.done.clone();
            let rt = self.rt.as_ref().expect("runtime alive while submitting");
            rt.spawn(async move {
                while let Some(task) = rx.recv().await {
                    task();
                    done.completed();
                }
            });
            tx
        });
        if tx.send(task).is_err() {
            self.done.completed();
        }
    }

    #[inline]
    fn submit_future<F>(&self, key: u64, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.submit_future_boxed(key, Box::pin(fut));
    }

    #[inline]
    fn submit_future_boxed(&self, key: u64, fut: TaskFuture) {
        self.done.submitted();
        let mut shard = self.future_shards[bucket(key, SHARDS)].lock().unwrap();
        let tx = shard.entry(key).or_insert_with(|| {
            let (tx, mut rx) = unbounded_channel::<TaskFuture>();
            let done = self.done.clone();
            let rt = self.rt.as_ref().expect("runtime alive while submitting");
            rt.spawn(async move {
                while let Some(fut) = rx.recv().await {
                    fut.await;
                    done.completed();
                }
            });
            tx
        });
        if tx.send(fut).is_err() {
            self.done.completed();
        }
    }

    fn wait_idle(&self, timeout: Duration) -> bool {
        self.done.wait(timeout)
    }
}

impl Drop for TokioActor {
    fn drop(&mut self) {
        for shard in self.shards.iter() {
            shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
        for shard in self.future_shards.iter() {
            shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(30));
        }
    }
}
