//! A key's state after `shutdown_now` handed its tasks back (DESIGN 3.1b): a holder that the
//! key's handed-back tasks share, which runs their state tasks against the key's state and
//! releases it through the hook once the last of them has run or been dropped.
//!
//! # The holder
//!
//! [`KeyStateHold`] has the key, the state (`None` until a state task needs it, then made by
//! `init` for that task, as in the key's entry) and the hooks, behind one mutex. `shutdown_now`
//! makes one per key whose tasks it hands back, when it can take the key's state (see below),
//! and every [`PendingTask`](crate::PendingTask) of the key, plain or state, holds an `Arc` of
//! it. Who may do what:
//!
//! - a `PendingTask::run` of a **state task** locks the holder and runs the task against the
//!   state under the lock: the key's handed-back state tasks are exclusive with each other, run
//!   in whatever order and on whatever threads the user picks. A plain task does not lock it.
//! - the **last `Arc` dropped** (a task run or dropped, in any order) drops the holder, whose
//!   `Drop` calls the release hook with the state, if one was ever made: exactly once, on the
//!   thread that runs or drops the key's last handed-back task. Nothing else releases it: the
//!   key's entry no longer has the state (it was moved here while `shutdown_now` held the
//!   chain's baton), so neither the idle reaper nor termination sees it.
//!
//! # A state lent to a running task
//!
//! When `shutdown_now` steals a chain from a worker inside one of its tasks (`phase.rs`,
//! `Stopped::Stole`), the key's state may be in use by that task: nobody may touch it until the
//! task returns. The holder is then made **lent** (`Inner::lent`: which worker has it), and the
//! state comes back through the worker's slot ([`Lent`], one mutex):
//!
//! - the worker, when its task returned and `leave_running` reported the steal, takes the state
//!   out of the entry (it is the state's last user; `shutdown_now` never touches the state of a
//!   stolen chain) and, under the slot's lock, gives it to the holder found there
//!   ([`Lent::Waiting`]: `give_back`, which wakes waiting runs), or, if `shutdown_now` has not
//!   come that far, leaves it there ([`Lent::Returned`]);
//! - `shutdown_now`, under the same lock, takes a returned state into a new holder, or leaves a
//!   lent holder for the worker ([`Lent::Waiting`]). One lock, one order: the state is handed
//!   over exactly once, and the slot's `Arc` keeps the holder (and so its hook) alive until it
//!   has arrived.
//!
//! A state task run meanwhile waits (on a condvar) until the state is back: it is exclusive with
//! the key's running task, as the key's order would make it. From inside that very task (the
//! thread of the worker that has it), waiting could never end: the task fails `Panicked`
//! instead, with a message that says so. So does a state task run from inside another
//! handed-back state task of the same key (the holder's lock is not re-entrant). A worker whose
//! task never returns never gives the state back; its key's handed-back state tasks then wait
//! with it (documented on `PendingTask::run`).
//!
//! Loom: `loom/tests/state_hold.rs` (the hand-over in either order, a run waiting for the lent
//! state, the last-drop race), over the real types through `loom_hooks` (`cfg(loom)` only).

use std::cell::RefCell;
use std::sync::Arc;

use crate::state::{Erased, StateHooks};
use crate::sync::{lock, Condvar, Mutex};
use crate::task::TaskRef;

/// `StateHooks::release` for one `K`, its `Clone` bound taken where it is known.
type Release<K> = Box<dyn Fn(&K, Erased) + Send + Sync>;

/// A key's state shared by its handed-back tasks (see the module docs).
pub(crate) struct KeyStateHold<K> {
    key: K,
    init: Arc<dyn Fn(&K) -> Erased + Send + Sync>,
    /// `StateHooks::release`, with the key's `Clone` bound taken at construction.
    release: Release<K>,
    inner: Mutex<Inner>,
    back: Condvar,
}

struct Inner {
    state: Option<Erased>,
    /// The state is still with the worker of slot `.1` of serializer `.0`, inside the key's
    /// running task.
    lent: Option<(usize, usize)>,
}

/// A worker slot's side of a lent state (see the module docs).
#[derive(Default)]
pub(crate) enum Lent<K> {
    /// Nothing lent.
    #[default]
    Empty,
    /// `shutdown_now` left this holder for the state.
    Waiting(Arc<KeyStateHold<K>>),
    /// The worker left the state here before `shutdown_now` came for it.
    Returned(Option<Erased>),
}

thread_local! {
    /// The holders whose state a task runs against on this thread (a nested run of the same
    /// key's state task would wait for itself).
    static RUNNING: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Fails `task` `Panicked` with `why` (a state task that cannot get its key's state).
pub(crate) fn fail(task: TaskRef, why: &'static str) {
    task.fail(Box::new(why));
}

impl<K: Clone + 'static> KeyStateHold<K> {
    /// A holder of `state`, or (`lent`: serializer id, slot) of the state a worker still has.
    pub(crate) fn new(
        key: K,
        hooks: &StateHooks<K>,
        state: Option<Erased>,
        lent: Option<(usize, usize)>,
    ) -> Arc<Self> {
        let h = hooks.clone();
        Arc::new(KeyStateHold {
            key,
            init: hooks.init.clone(),
            release: Box::new(move |k, st| h.release(k, st)),
            inner: Mutex::new(Inner { state, lent }),
            back: Condvar::new(),
        })
    }
}

impl<K> KeyStateHold<K> {
    /// The key.
    pub(crate) fn key(&self) -> &K {
        &self.key
    }

    /// The worker that had the state lent gives it back.
    pub(crate) fn give_back(&self, state: Option<Erased>) {
        let mut i = lock(&self.inner);
        i.state = state;
        i.lent = None;
        drop(i);
        self.back.notify_all();
    }

    /// Runs state task `task` against the state (made by `init` first if there is none), under
    /// the holder's lock, once the state is back from a worker it was lent to.
    pub(crate) fn run(&self, task: TaskRef) {
        let me = self as *const Self as usize;
        if RUNNING.with(|r| r.borrow().contains(&me)) {
            return fail(
                task,
                "a handed-back state task was run from inside another handed-back state task \
                 of its key: it would wait for itself",
            );
        }
        let mut i = lock(&self.inner);
        while let Some((id, slot)) = i.lent {
            if crate::running::current_slot(id) == Some(slot) || crate::running::runs_here(id, slot)
            {
                drop(i);
                return fail(
                    task,
                    "a handed-back state task was run from inside its key's running task, \
                     which has the key's state: it would wait for itself",
                );
            }
            i = self.back.wait(i).unwrap_or_else(|e| e.into_inner());
        }
        struct Unmark(usize);
        impl Drop for Unmark {
            fn drop(&mut self) {
                RUNNING.with(|r| r.borrow_mut().retain(|&p| p != self.0));
            }
        }
        RUNNING.with(|r| r.borrow_mut().push(me));
        let _unmark = Unmark(me);
        let inner = &mut *i;
        let mut source = crate::state::EntrySource {
            slot: &mut inner.state,
            key: &self.key,
            init: &*self.init,
        };
        // The task's panics (and `init`'s) are caught inside `run`: nothing unwinds here with
        // the lock held.
        crate::state::run_with(&mut source, || task.run(None, &|_| {}));
    }
}

impl<K> Drop for KeyStateHold<K> {
    /// The key's last handed-back task has run or been dropped: the state (if one was made)
    /// goes through the hook.
    fn drop(&mut self) {
        let i = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        debug_assert!(
            i.lent.is_none(),
            "a lent holder is kept by the worker's slot"
        );
        if let Some(st) = i.state.take() {
            (self.release)(&self.key, st);
        }
    }
}

/// The worker of a slot whose chain `shutdown_now` stole, once its task returned: hands the
/// key's state (taken out of the entry by the caller) to the holder waiting in `lent`, or leaves
/// it there.
pub(crate) fn worker_returns<K>(lent: &Mutex<Lent<K>>, state: Option<Erased>) {
    let mut l = lock(lent);
    match std::mem::take(&mut *l) {
        Lent::Waiting(h) => {
            drop(l);
            h.give_back(state);
            drop(h); // perhaps the last reference: the hook runs here, on the worker
        }
        Lent::Empty | Lent::Returned(_) => *l = Lent::Returned(state),
    }
}

/// `shutdown_now`, for a chain it stole from slot `slot` of serializer `id`: the key's holder,
/// with the state the worker returned, or lent until it does.
pub(crate) fn take_lent<K: Clone + 'static>(
    lent: &Mutex<Lent<K>>,
    key: K,
    hooks: &StateHooks<K>,
    id: usize,
    slot: usize,
) -> Arc<KeyStateHold<K>> {
    let mut l = lock(lent);
    match std::mem::take(&mut *l) {
        Lent::Returned(state) => KeyStateHold::new(key, hooks, state, None),
        Lent::Empty | Lent::Waiting(_) => {
            let h = KeyStateHold::new(key, hooks, None, Some((id, slot)));
            *l = Lent::Waiting(h.clone());
            h
        }
    }
}

/// The holder and a worker slot's [`Lent`] for the loom models (`loom/tests/state_hold.rs`),
/// over the real types, for `u32` keys and `u32` states: thin wrappers that only box and unbox
/// the state, so that the models need none of the crate's private types.
#[cfg(loom)]
pub mod loom_hooks {
    use std::sync::Arc;

    use super::{KeyStateHold, Lent};
    use crate::state::{Erased, StateHooks};
    use crate::sync::{lock, Mutex};
    use crate::task::{Detached, Kind, TaskRef};
    use crate::PendingTask;

    /// The serializer id and slot a lent holder names: no loom thread is a worker (the
    /// worker's thread-local slot is unset), so a run never takes itself for the key's task.
    const LENT_TO: (usize, usize) = (0, 0);

    /// `Builder::key_state`'s `init` and `on_key_release`'s hook, for `u32` states.
    pub struct Hooks(StateHooks<u32>);

    impl Hooks {
        /// `init(key)` makes a key's state; `release(key, state)` is the release hook.
        pub fn new(
            init: impl Fn(u32) -> u32 + Send + Sync + 'static,
            release: impl Fn(u32, u32) + Send + Sync + 'static,
        ) -> Hooks {
            Hooks(StateHooks {
                init: Arc::new(move |k: &u32| -> Erased { Box::new(init(*k)) }),
                release: Some(Arc::new(move |k, st: Erased| {
                    release(k, *st.downcast::<u32>().expect("a u32 state"))
                })),
                on: true,
            })
        }
    }

    /// A worker slot's side of a lent state (`Slot::lent`).
    pub struct Slot(Mutex<Lent<u32>>);

    /// What a slot holds, as the models see it.
    #[derive(Debug, PartialEq, Eq)]
    pub enum SlotIs {
        /// `Lent::Empty`.
        Empty,
        /// `Lent::Waiting`: a holder waits for the state.
        Waiting,
        /// `Lent::Returned` with this state.
        Returned(Option<u32>),
    }

    impl Slot {
        /// A slot with nothing lent (`Lent::Empty`), as a worker's slot starts.
        #[allow(clippy::new_without_default)]
        pub fn new() -> Slot {
            Slot(Mutex::new(Lent::Empty))
        }

        /// What the slot holds now.
        pub fn is(&self) -> SlotIs {
            match &*lock(&self.0) {
                Lent::Empty => SlotIs::Empty,
                Lent::Waiting(_) => SlotIs::Waiting,
                Lent::Returned(st) => SlotIs::Returned(st.as_ref().map(unbox)),
            }
        }
    }

    fn unbox(st: &Erased) -> u32 {
        *st.downcast_ref::<u32>().expect("a u32 state")
    }

    /// A key's holder, as `shutdown_now` keeps it (one `Arc`).
    #[derive(Clone)]
    pub struct Hold(Arc<KeyStateHold<u32>>);

    impl Hold {
        /// A holder of `state` (`shutdown_now` for a chain it drained: nothing lent).
        pub fn new(key: u32, hooks: &Hooks, state: Option<u32>) -> Hold {
            let state = state.map(|s| Box::new(s) as Erased);
            Hold(KeyStateHold::new(key, &hooks.0, state, None))
        }

        /// The state it holds now, and whether it is still lent to a worker.
        pub fn peek(&self) -> (Option<u32>, bool) {
            let i = lock(&self.0.inner);
            (i.state.as_ref().map(unbox), i.lent.is_some())
        }

        /// A handed-back state task of the key (as `shutdown_now` attaches it to the holder):
        /// run, it calls `f` with the key's state (`submit_with_state`'s closure).
        pub fn state_task(&self, f: impl FnOnce(&mut u32) + Send + 'static) -> PendingTask<u32> {
            let job = Detached(move || crate::state::with_current(f));
            let task = TaskRef::new(job, Kind::State, None);
            PendingTask::new(Some(*self.0.key()), task).with_hold(&self.0)
        }

        /// A handed-back plain task of the key (it keeps the holder alive, and does not lock it).
        pub fn plain_task(&self, f: impl FnOnce() + Send + 'static) -> PendingTask<u32> {
            let task = TaskRef::new(Detached(f), Kind::Plain, None);
            PendingTask::new(Some(*self.0.key()), task).with_hold(&self.0)
        }
    }

    /// [`worker_returns`](super::worker_returns): the worker whose task returned hands `state`
    /// over through `slot`.
    pub fn worker_returns(slot: &Slot, state: Option<u32>) {
        super::worker_returns(&slot.0, state.map(|s| Box::new(s) as Erased));
    }

    /// [`take_lent`](super::take_lent): `shutdown_now` takes key `key`'s holder through `slot`.
    pub fn take_lent(slot: &Slot, key: u32, hooks: &Hooks) -> Hold {
        Hold(super::take_lent(
            &slot.0, key, &hooks.0, LENT_TO.0, LENT_TO.1,
        ))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    fn hooks(released: Arc<AtomicUsize>) -> StateHooks<u32> {
        StateHooks {
            init: Arc::new(|k: &u32| -> Erased { Box::new(*k * 10) }),
            release: Some(Arc::new(move |_k, st: Erased| {
                released.fetch_add(*st.downcast::<u32>().unwrap() as usize, SeqCst);
            })),
            on: true,
        }
    }

    #[test]
    fn the_hook_runs_once_when_the_last_reference_goes() {
        let released = Arc::new(AtomicUsize::new(0));
        let h = KeyStateHold::new(4, &hooks(released.clone()), None, None);
        let other = h.clone();
        drop(h);
        assert_eq!(released.load(SeqCst), 0, "no state made: no hook");
        {
            let mut i = lock(&other.inner);
            i.state = Some(Box::new(7u32));
        }
        drop(other);
        assert_eq!(released.load(SeqCst), 7);
    }

    #[test]
    fn a_state_returned_before_or_after_shutdown_now_reaches_the_holder() {
        for worker_first in [true, false] {
            let released = Arc::new(AtomicUsize::new(0));
            let hooks = hooks(released.clone());
            let lent: Mutex<Lent<u32>> = Mutex::new(Lent::Empty);
            let h = if worker_first {
                worker_returns(&lent, Some(Box::new(5u32)));
                take_lent(&lent, 1, &hooks, 0, 0)
            } else {
                let h = take_lent(&lent, 1, &hooks, 0, 0);
                assert!(lock(&h.inner).lent.is_some());
                worker_returns(&lent, Some(Box::new(5u32)));
                h
            };
            assert!(matches!(*lock(&lent), Lent::Empty));
            assert!(lock(&h.inner).lent.is_none());
            assert_eq!(released.load(SeqCst), 0);
            drop(h);
            assert_eq!(
                released.load(SeqCst),
                5,
                "released once, by the last holder"
            );
        }
    }

    #[test]
    fn a_state_task_run_waits_for_the_lent_state_and_the_hook_sees_what_it_did() {
        use crate::task::{Detached, Kind};
        let released = Arc::new(AtomicUsize::new(0));
        let hooks = hooks(released.clone());
        let lent: Mutex<Lent<u32>> = Mutex::new(Lent::Empty);
        let h = take_lent(&lent, 1, &hooks, 0, 0);
        let saw = Arc::new(AtomicUsize::new(0));
        let w = saw.clone();
        let job = Detached(move || {
            crate::state::with_current(|st: &mut u32| {
                w.store(*st as usize, SeqCst);
                *st += 1;
            })
        });
        let task =
            crate::PendingTask::new(Some(1), TaskRef::new(job, Kind::State, None)).with_hold(&h);
        drop(h);
        std::thread::scope(|s| {
            let runner = s.spawn(move || task.run()); // waits while the state is lent
            worker_returns(&lent, Some(Box::new(5u32)));
            runner.join().unwrap();
        });
        assert_eq!(saw.load(SeqCst), 5, "ran against the returned state");
        assert_eq!(
            released.load(SeqCst),
            6,
            "released once, as the task left it"
        );
        assert!(matches!(*lock(&lent), Lent::Empty));
    }
}
