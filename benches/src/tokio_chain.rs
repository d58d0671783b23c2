//! Baseline for futures (W7, W8): a keyed chain on tokio.
//!
//! A sharded map key → queue of boxed futures. The first future of an idle key (a key not in the
//! map) inserts an empty queue for it and spawns one tokio task, the key's *drainer*, with that
//! future; later futures of the key are pushed onto its queue. The drainer awaits its future,
//! then takes the next one off the queue, and so on; when it finds the queue empty it removes the
//! key from the map and ends. The runtime is [`tokio_runtime`] (`workers` worker threads).
//!
//! The race between a drainer finding the queue empty and a new submit is closed by the shard
//! lock: a submit pushes onto the queue, or inserts the key and spawns a drainer, under the lock;
//! a drainer pops, or removes the key, under the same lock. So "the key is in the map" and "the
//! key has a live drainer" are the same fact: a future pushed onto a queue is always taken by
//! that queue's drainer (none is stranded), and a key never has two drainers.
//!
//! Unlike the tokio actor per key, a quiet key costs nothing (its entry goes with its last
//! future), and there is no channel: one `VecDeque` per busy key.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use tokio::runtime::Runtime;

use crate::exec::{bucket, tokio_runtime, Completion, KeyMap, KeyedExecutor, TaskFuture};

const SHARDS: usize = 64;

/// One shard of the key → queue map.
type Shard = CachePadded<Mutex<KeyMap<VecDeque<TaskFuture>>>>;

/// What the submitters and the drainers share.
struct Chains {
    shards: Box<[Shard]>,
    done: Completion,
}

impl Chains {
    fn shard(&self, key: u64) -> &Shard {
        &self.shards[bucket(key, SHARDS)]
    }

    /// Queues `fut` behind the key's drainer, or, if the key has none, registers the key and
    /// gives the future back for a new drainer to start with.
    fn enqueue(&self, key: u64, fut: TaskFuture) -> Option<TaskFuture> {
        let mut shard = self.shard(key).lock().unwrap();
        match shard.get_mut(&key) {
            Some(queue) => {
                queue.push_back(fut);
                None
            }
            None => {
                shard.insert(key, VecDeque::new());
                Some(fut)
            }
        }
    }

    /// The key's next future, or `None` after removing the key (its drainer then ends).
    fn next(&self, key: u64) -> Option<TaskFuture> {
        let mut shard = self.shard(key).lock().unwrap();
        let queue = shard
            .get_mut(&key)
            .expect("a draining key stays in the map");
        let next = queue.pop_front();
        if next.is_none() {
            shard.remove(&key);
        }
        next
    }

    /// The key's drainer: runs `first`, then every future queued behind it, in order.
    async fn drain(self: Arc<Self>, key: u64, first: TaskFuture) {
        let mut fut = first;
        loop {
            fut.await;
            self.done.completed();
            match self.next(key) {
                Some(next) => fut = next,
                None => return,
            }
        }
    }
}

/// A keyed chain on tokio: a sharded map key → queue of boxed futures, one drainer task per
/// busy key.
pub struct TokioChain {
    chains: Arc<Chains>,
    rt: Option<Runtime>,
}

impl TokioChain {
    /// A runtime with `workers` worker threads ([`tokio_runtime`]).
    pub fn new(workers: usize) -> Self {
        TokioChain {
            chains: Arc::new(Chains {
                shards: (0..SHARDS)
                    .map(|_| CachePadded::new(Mutex::new(KeyMap::default())))
                    .collect(),
                done: Completion::new(),
            }),
            rt: Some(tokio_runtime(workers, "tokio-chain")),
        }
    }
}

impl KeyedExecutor for TokioChain {
    fn name(&self) -> String {
        "tokio_chain".into()
    }

    /// A closure is a future that runs it, on a runtime worker, in its key's chain (not used by
    /// the workloads: this contender runs W7 and W8 only).
    fn submit<F>(&self, key: u64, task: F)
    where
        F: FnOnce() + Send + 'static,
    {
        self.submit_future_boxed(key, Box::pin(async move { task() }));
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
        self.chains.done.submitted();
        if let Some(first) = self.chains.enqueue(key, fut) {
            let rt = self.rt.as_ref().expect("runtime alive while submitting");
            rt.spawn(self.chains.clone().drain(key, first));
        }
    }

    fn wait_idle(&self, timeout: Duration) -> bool {
        self.chains.done.wait(timeout)
    }
}

impl Drop for TokioChain {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(30));
        }
        for shard in self.chains.shards.iter() {
            shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn a_keys_futures_run_in_order_and_its_entry_goes_with_the_last() {
        let c = TokioChain::new(2);
        let seen = Arc::new(Mutex::new(Vec::new()));
        for i in 0..200u32 {
            let seen = seen.clone();
            c.submit_future(7, async move {
                tokio::task::yield_now().await;
                seen.lock().unwrap().push(i);
            });
        }
        assert!(c.wait_idle(Duration::from_secs(10)));
        assert_eq!(*seen.lock().unwrap(), (0..200).collect::<Vec<_>>());
        // The drainer removes the key after the future it counted completed: wait for it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while c.chains.shard(7).lock().unwrap().contains_key(&7) {
            assert!(std::time::Instant::now() < deadline, "key 7 never removed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_submit_racing_the_drainers_last_look_is_not_stranded() {
        // One future a key at a time, each submitted as the previous one completes: the drainer
        // is often at its last look at the queue when the next submit comes.
        let c = TokioChain::new(2);
        let ran = Arc::new(AtomicU32::new(0));
        for i in 0..2_000u32 {
            let ran = ran.clone();
            c.submit(u64::from(i % 3), move || {
                ran.fetch_add(1, Ordering::SeqCst);
            });
            if i % 7 == 0 {
                assert!(c.wait_idle(Duration::from_secs(10)));
            }
        }
        assert!(c.wait_idle(Duration::from_secs(10)));
        assert_eq!(ran.load(Ordering::SeqCst), 2_000);
    }
}
