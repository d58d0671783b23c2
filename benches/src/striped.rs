//! Baseline: a global `Mutex<HashMap<K, VecDeque<Task>>>` and a fixed pool (the
//! StripedExecutorService design).
//!
//! A key whose queue is non-empty is *scheduled*: its key sits once on a shared ready channel or is
//! being run by one worker. `submit` locks the map; if the key has an entry (scheduled or running)
//! it appends the task, otherwise it creates the entry and sends the key to the ready channel. A
//! worker that receives a key runs its tasks one by one, re-locking the map to pop each, and removes
//! the entry (under the lock) when it finds the queue empty; a submit after that schedules the key
//! afresh. The entry stays while its last task runs, so a concurrent submit never schedules the key
//! twice: per-key order and mutual exclusion follow from the one lock.
//!
//! Every submit and every task start takes the one global lock, which is the cost this design pays
//! for its simplicity; idle keys are removed, so the map does not grow with keys ever seen.

use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{unbounded, Sender};

use crate::exec::{Completion, KeyMap, KeyedExecutor, Task};

struct Shared {
    queues: Mutex<KeyMap<VecDeque<Task>>>,
    done: Completion,
}

/// Global map of per-key queues plus a pool draining scheduled keys.
pub struct Striped {
    shared: Arc<Shared>,
    ready: Option<Sender<u64>>,
    threads: Vec<JoinHandle<()>>,
}

impl Striped {
    /// Starts `workers` threads.
    pub fn new(workers: usize) -> Self {
        assert!(workers > 0, "at least one worker");
        let shared = Arc::new(Shared {
            queues: Mutex::new(KeyMap::default()),
            done: Completion::new(),
        });
        let (tx, rx) = unbounded::<u64>();
        let threads = (0..workers)
            .map(|i| {
                let rx = rx.clone();
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("striped-{i}"))
                    .spawn(move || {
                        for key in rx {
                            run_key(&shared, key);
                        }
                    })
                    .expect("spawn worker")
            })
            .collect();
        Striped {
            shared,
            ready: Some(tx),
            threads,
        }
    }
}

/// Runs a scheduled key's tasks until its queue is empty, then unschedules it.
fn run_key(shared: &Shared, key: u64) {
    loop {
        let task = {
            let mut queues = shared.queues.lock().unwrap();
            match queues.get_mut(&key).and_then(VecDeque::pop_front) {
                Some(task) => task,
                None => {
                    queues.remove(&key);
                    return;
                }
            }
        };
        task();
        shared.done.completed();
    }
}

impl KeyedExecutor for Striped {
    fn name(&self) -> String {
        "striped".into()
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
        self.shared.done.submitted();
        let schedule = {
            let mut queues = self.shared.queues.lock().unwrap();
            match queues.entry(key) {
                Entry::Occupied(mut e) => {
                    e.get_mut().push_back(task);
                    false
                }
                Entry::Vacant(e) => {
                    e.insert(VecDeque::with_capacity(4)).push_back(task);
                    true
                }
            }
        };
        if schedule {
            let sent = self.ready.as_ref().is_some_and(|r| r.send(key).is_ok());
            if !sent {
                // Only possible while dropping; account for the stranded task.
                if let Some(q) = self.shared.queues.lock().unwrap().remove(&key) {
                    for _ in q {
                        self.shared.done.completed();
                    }
                }
            }
        }
    }

    fn wait_idle(&self, timeout: Duration) -> bool {
        self.shared.done.wait(timeout)
    }
}

impl Drop for Striped {
    fn drop(&mut self) {
        drop(self.ready.take());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
