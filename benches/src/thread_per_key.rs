//! Baseline: one OS thread per key, each with its own channel.
//!
//! The first answer many people write: a map from key to a dedicated thread's sender, the thread
//! started on the key's first task. Order per key is the channel's FIFO order. It costs a thread
//! (stack, scheduler entry, a context switch per handoff) per key and never gives one back while
//! running, so the compare program only runs it where the number of keys is small.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{unbounded, Sender};

use crate::exec::{Completion, KeyMap, KeyedExecutor, Task};

struct Inner {
    senders: KeyMap<Sender<Task>>,
    threads: Vec<JoinHandle<()>>,
}

/// One thread per key.
pub struct ThreadPerKey {
    inner: Mutex<Inner>,
    done: Arc<Completion>,
}

impl Default for ThreadPerKey {
    fn default() -> Self {
        Self::new()
    }
}

impl ThreadPerKey {
    /// No threads yet; each key's thread starts with its first task.
    pub fn new() -> Self {
        ThreadPerKey {
            inner: Mutex::new(Inner {
                senders: KeyMap::default(),
                threads: Vec::new(),
            }),
            done: Arc::new(Completion::new()),
        }
    }

    /// Number of threads started so far.
    pub fn threads(&self) -> usize {
        self.inner.lock().unwrap().threads.len()
    }
}

impl KeyedExecutor for ThreadPerKey {
    fn name(&self) -> String {
        "thread_per_key".into()
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
        let mut inner = self.inner.lock().unwrap();
        let Inner { senders, threads } = &mut *inner;
        let tx = senders.entry(key).or_insert_with(|| {
            let (tx, rx) = unbounded::<Task>();
            let done = self.done.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("key-{key}"))
                    .spawn(move || {
                        for task in rx {
                            task();
                            done.completed();
                        }
                    })
                    .expect("spawn key thread"),
            );
            tx
        });
        if tx.send(task).is_err() {
            self.done.completed();
        }
    }

    fn wait_idle(&self, timeout: Duration) -> bool {
        self.done.wait(timeout)
    }
}

impl Drop for ThreadPerKey {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        inner.senders.clear();
        for t in inner.threads.drain(..) {
            let _ = t.join();
        }
    }
}
