//! Baseline: an unordered pool of `workers` threads fed by one crossbeam channel.
//!
//! Not a serializer: tasks of one key may run at the same time and in any order. It is the floor of
//! a cross-thread handoff (one channel send, one receive, one boxed task), so the compare program
//! reports its order "violations" as n/a.

use std::thread::JoinHandle;
use std::time::Duration;

use std::sync::Arc;

use crossbeam_channel::{unbounded, Sender};

use crate::exec::{Completion, KeyedExecutor, OrderGuarantee, Task};

/// A plain thread pool on a shared MPMC channel.
pub struct Unordered {
    tx: Option<Sender<Task>>,
    threads: Vec<JoinHandle<()>>,
    done: Arc<Completion>,
}

impl Unordered {
    /// Starts `workers` threads.
    pub fn new(workers: usize) -> Self {
        let (tx, rx) = unbounded::<Task>();
        let done = Arc::new(Completion::new());
        let threads = (0..workers)
            .map(|i| {
                let rx = rx.clone();
                let done = done.clone();
                std::thread::Builder::new()
                    .name(format!("unordered-{i}"))
                    .spawn(move || {
                        for task in rx {
                            task();
                            done.completed();
                        }
                    })
                    .expect("spawn worker")
            })
            .collect();
        Unordered {
            tx: Some(tx),
            threads,
            done,
        }
    }
}

impl KeyedExecutor for Unordered {
    fn name(&self) -> String {
        "unordered".into()
    }

    fn ordering(&self) -> OrderGuarantee {
        OrderGuarantee::Unordered
    }

    #[inline]
    fn submit<F>(&self, key: u64, task: F)
    where
        F: FnOnce() + Send + 'static,
    {
        self.submit_boxed(key, Box::new(task));
    }

    #[inline]
    fn submit_boxed(&self, _key: u64, task: Task) {
        self.done.submitted();
        if let Some(tx) = &self.tx {
            if let Err(e) = tx.send(task) {
                drop(e);
                self.done.completed();
            }
        }
    }

    fn wait_idle(&self, timeout: Duration) -> bool {
        self.done.wait(timeout)
    }
}

impl Drop for Unordered {
    fn drop(&mut self) {
        drop(self.tx.take());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
