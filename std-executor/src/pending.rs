//! Tasks handed back by `shutdown_now`.

use std::fmt;

use crate::state::StateHooks;
use crate::task::{Kind, TaskRef};

/// A task handed back by [`Serializer::shutdown_now`](crate::Serializer::shutdown_now): never started. Run it yourself with
/// [`run`](Self::run), or drop it (its handle, if any, resolves `Cancelled`).
///
/// ```
/// use keyserial::Builder;
/// let s = Builder::<&str>::new().workers(1).build().unwrap();
/// let (tx, rx) = std::sync::mpsc::channel::<()>();
/// s.execute("a", move || { rx.recv().ok(); }).unwrap();
/// while s.stats().running == 0 { std::thread::yield_now(); }
/// let h = s.submit("b", || 5).unwrap();
/// let pending = s.shutdown_now();
/// tx.send(()).unwrap();
/// assert_eq!(pending.len(), 1);
/// assert_eq!(pending[0].key(), Some(&"b"));
/// for p in pending { p.run(); }
/// assert_eq!(h.join().unwrap(), 5);
/// ```
pub struct PendingTask<K> {
    key: Option<K>,
    task: TaskRef,
    /// For a state task: how to make (and release) the state it runs against.
    state: Option<StateHooks<K>>,
}

impl<K> PendingTask<K> {
    pub(crate) fn new(key: Option<K>, task: TaskRef) -> Self {
        PendingTask {
            key,
            task,
            state: None,
        }
    }

    /// A state task's hand-back: `run` makes it a fresh state with `hooks` (see `run`).
    pub(crate) fn with_state_hooks(mut self, hooks: &StateHooks<K>) -> Self {
        if self.task.kind() == Kind::State {
            self.state = Some(hooks.clone());
        }
        self
    }

    /// The task's key; `None` for an unkeyed [`spawn`](crate::Serializer::spawn) task.
    ///
    /// ```
    /// # use keyserial::Builder;
    /// # let s = Builder::<u8>::new().workers(1).build().unwrap();
    /// # let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// # s.execute(0, move || { rx.recv().ok(); }).unwrap();
    /// # while s.stats().running == 0 { std::thread::yield_now(); }
    /// let _ = s.spawn(|| ()).unwrap();
    /// let pending = s.shutdown_now();
    /// assert_eq!(pending[0].key(), None);
    /// # tx.send(()).unwrap();
    /// ```
    pub fn key(&self) -> Option<&K> {
        self.key.as_ref()
    }

    /// Runs the task on the calling thread (a panic is caught and goes to its handle).
    ///
    /// ```
    /// # use keyserial::Builder;
    /// # let s = Builder::<u8>::new().workers(1).build().unwrap();
    /// # let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// # s.execute(0, move || { rx.recv().ok(); }).unwrap();
    /// # while s.stats().running == 0 { std::thread::yield_now(); }
    /// let h = s.submit(1, || "ran later").unwrap();
    /// for p in s.shutdown_now() { p.run(); }
    /// assert_eq!(h.join().unwrap(), "ran later");
    /// # tx.send(()).unwrap();
    /// ```
    ///
    /// A state task ([`submit_with_state`](crate::Serializer::submit_with_state)) runs against a
    /// fresh state made by the serializer's `init` for its key, which then goes through the
    /// release hook (or is dropped).
    pub fn run(self)
    where
        K: Clone,
    {
        let PendingTask { key, task, state } = self;
        match (state, key) {
            (Some(hooks), Some(key)) => {
                let mut slot = None;
                let mut source = crate::state::EntrySource {
                    slot: &mut slot,
                    key: &key,
                    init: &*hooks.init,
                };
                crate::state::run_with(&mut source, || task.run(None, &|_| {}));
                if let Some(st) = slot {
                    hooks.release(&key, st);
                }
            }
            _ => {
                task.run(None, &|_| {});
            }
        }
    }
}

impl<K: fmt::Debug> fmt::Debug for PendingTask<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingTask")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}
