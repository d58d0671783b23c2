//! Tasks handed back by `shutdown_now` and `cancel_key`, and where a handed-back state task
//! finds its key's state when it is run (`Backing`: a holder shared by the key's handed-back
//! tasks after `shutdown_now`, `state_hold.rs`; the key's entry, reached with its chain's baton,
//! after `cancel_key`, `handed_back::run_handed_back`; or a fresh state as a last resort).

use std::fmt;

use std::sync::{Arc, Weak};

use crate::state::StateHooks;
use crate::state_hold::KeyStateHold;
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
    /// What a state task runs against (and what a plain task of a key keeps alive).
    state: Backing<K>,
}

/// Runs a state task against its key's state in a serializer: the serializer's shared state,
/// seen from here only through this (`handed_back.rs` implements it with `run_handed_back`).
pub(crate) trait KeyRunner<K>: Send + Sync {
    /// Runs state task `task` against `key`'s state, with the key's chain baton.
    fn run_on_key(&self, key: &K, task: TaskRef);
}

/// Where a handed-back task finds its key's state (`state_hold.rs`, `key_control.rs`).
enum Backing<K> {
    /// Nothing: an unkeyed or plain task, or a serializer without key state.
    None,
    /// `shutdown_now`: the key's state, shared by all its handed-back tasks (plain ones keep
    /// it alive too) and released through the hook after the last of them.
    Hold(Arc<KeyStateHold<K>>),
    /// `cancel_key`: a state task, run against its key's state in the serializer, with the
    /// key's chain baton (`handed_back::run_handed_back`).
    Key {
        runner: Weak<dyn KeyRunner<K>>,
        hooks: StateHooks<K>,
    },
    /// A fresh state made by `init` for this task, released through the hook right after.
    Fresh(StateHooks<K>),
}

impl<K> PendingTask<K> {
    pub(crate) fn new(key: Option<K>, task: TaskRef) -> Self {
        PendingTask {
            key,
            task,
            state: Backing::None,
        }
    }

    /// Whether the task is a state task.
    pub(crate) fn is_state_task(&self) -> bool {
        self.task.kind() == Kind::State
    }

    /// Whether the task has its key's state backing already (a holder, or a way to it).
    pub(crate) fn is_backed(&self) -> bool {
        !matches!(self.state, Backing::None)
    }

    /// A state task's hand-back without its key's state: `run` makes it a fresh one with
    /// `hooks` (see `run`). A task already backed keeps its backing.
    pub(crate) fn with_state_hooks(mut self, hooks: &StateHooks<K>) -> Self {
        if self.is_state_task() && !self.is_backed() && hooks.on {
            self.state = Backing::Fresh(hooks.clone());
        }
        self
    }

    /// `shutdown_now`'s hand-back of a task of the key whose state `hold` holds.
    pub(crate) fn with_hold(mut self, hold: &Arc<KeyStateHold<K>>) -> Self {
        self.set_hold(hold);
        self
    }

    /// [`with_hold`](Self::with_hold) in place.
    pub(crate) fn set_hold(&mut self, hold: &Arc<KeyStateHold<K>>) {
        self.state = Backing::Hold(hold.clone());
    }

    /// `cancel_key`'s hand-back: a state task runs against its key's state through `runner`
    /// (the serializer's shared state, while it lives; else against a fresh state).
    pub(crate) fn with_key_state(
        mut self,
        runner: Weak<dyn KeyRunner<K>>,
        hooks: &StateHooks<K>,
    ) -> Self {
        if self.is_state_task() && hooks.on {
            self.state = Backing::Key {
                runner,
                hooks: hooks.clone(),
            };
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
    /// A state task ([`submit_with_state`](crate::Serializer::submit_with_state)) runs against
    /// its key's state:
    ///
    /// - handed back by [`shutdown_now`](crate::Serializer::shutdown_now): the key's handed-back
    ///   tasks (plain and state) share the key's state, which stays alive until the last of
    ///   them has run or been dropped and then goes through the release hook once, on the
    ///   thread that ran or dropped it. Its state tasks run one at a time against it, in
    ///   whatever order and on whatever threads they are run (the first one makes the state
    ///   with `init` if the key had none). If the key's task was running when `shutdown_now`
    ///   was called, a state task waits for that task to return (and waits forever if it
    ///   never does); run from inside that very task it fails
    ///   [`Panicked`](crate::TaskError::Panicked) instead of waiting for itself, as it does
    ///   when run from inside another handed-back state task of its key.
    /// - handed back by [`cancel_key`](crate::Serializer::cancel_key): it runs on the calling
    ///   thread against the key's state in the serializer, exclusively with the key's own
    ///   tasks: it waits for the key's running task (as `cancel_key` does), and the key's
    ///   later state tasks see what it did. If the key was released meanwhile, it runs against
    ///   the key's new state (made by `init`), which lives on as the key's state and is
    ///   released through the hook when the key is. Once the serializer has been stopped by
    ///   `shutdown_now` or has terminated (or is gone), it runs against a fresh state from
    ///   `init`, released through the hook right after. From inside a task of its own key,
    ///   or on one of the serializer's workers when the key stays busy for about a
    ///   millisecond, it fails `Panicked` (a worker must not wait for another).
    pub fn run(self)
    where
        K: Clone,
    {
        let PendingTask { key, task, state } = self;
        match (state, key) {
            (Backing::Hold(hold), _) => {
                if task.kind() == Kind::State {
                    hold.run(task);
                } else {
                    task.run(None, &|_| {});
                }
                drop(hold); // perhaps the key's last handed-back task: the hook runs here
            }
            (Backing::Key { runner, hooks }, Some(key)) => match runner.upgrade() {
                Some(runner) => runner.run_on_key(&key, task),
                None => run_fresh(&hooks, &key, task),
            },
            (Backing::Fresh(hooks), Some(key)) => run_fresh(&hooks, &key, task),
            _ => {
                task.run(None, &|_| {});
            }
        }
    }
}

/// Runs state task `task` against a fresh state from `init`, then releases it through the hook.
pub(crate) fn run_fresh<K: Clone>(hooks: &StateHooks<K>, key: &K, task: TaskRef) {
    let mut slot = None;
    let mut source = crate::state::EntrySource {
        slot: &mut slot,
        key,
        init: &*hooks.init,
    };
    crate::state::run_with(&mut source, || task.run(None, &|_| {}));
    if let Some(st) = slot {
        hooks.release(key, st);
    }
}

impl<K: fmt::Debug> fmt::Debug for PendingTask<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingTask")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}
