//! Baseline: static lanes, the common hand-rolled serializer.
//!
//! `lanes` single-thread workers, each with its own crossbeam channel; a key is hashed onto one lane
//! for ever. Order per key is the lane's FIFO order. Cheap and simple, but a slow task blocks every
//! other key of its lane (head-of-line blocking), and a hot key cannot use more than its lane.
//! The compare program runs it with `lanes = workers` and `lanes = 4 × workers`.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{unbounded, Sender};

use crate::exec::{bucket, Completion, KeyedExecutor, Task};

/// Keys hashed onto single-thread lanes.
pub struct Lanes {
    name: String,
    senders: Vec<Sender<Task>>,
    threads: Vec<JoinHandle<()>>,
    done: Arc<Completion>,
}

impl Lanes {
    /// Starts `lanes` worker threads; `name` is the row name (e.g. `lanes_1x`).
    pub fn new(name: impl Into<String>, lanes: usize) -> Self {
        assert!(lanes > 0, "at least one lane");
        let done = Arc::new(Completion::new());
        let mut senders = Vec::with_capacity(lanes);
        let mut threads = Vec::with_capacity(lanes);
        for i in 0..lanes {
            let (tx, rx) = unbounded::<Task>();
            let done = done.clone();
            senders.push(tx);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("lane-{i}"))
                    .spawn(move || {
                        for task in rx {
                            task();
                            done.completed();
                        }
                    })
                    .expect("spawn lane"),
            );
        }
        Lanes {
            name: name.into(),
            senders,
            threads,
            done,
        }
    }
}

impl KeyedExecutor for Lanes {
    fn name(&self) -> String {
        self.name.clone()
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
        let lane = &self.senders[bucket(key, self.senders.len())];
        if lane.send(task).is_err() {
            self.done.completed();
        }
    }

    fn wait_idle(&self, timeout: Duration) -> bool {
        self.done.wait(timeout)
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        self.senders.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
