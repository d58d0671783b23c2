//! Per-key state (`Builder::key_state`, `Serializer::submit_with_state`): what a key's state
//! tasks share, kept in the key's entry and reached with no lock, because the key's order is the
//! lock.
//!
//! # Where the state lives and who touches it
//!
//! A key's state is a type-erased `Box<dyn Any + Send>` in its entry ([`StateCell`]), `None`
//! until the key's first state task runs. State tasks (kind `State`) always go onto their key's
//! chain (`route.rs`), so they run on the chain's owner, which holds the chain's baton; and the
//! cell is touched **only by the holder of the chain's baton**:
//!
//! - the chain's owner, running a state task: it makes the state with `init(&key)` if the cell
//!   is empty ([`Source::state`]; a panicking `init` leaves it empty and fails that task), then
//!   hands the task `&mut S` through [`run_with`] and [`with_current`];
//! - whoever releases the key (`idle.rs`): it claims the idle chain (core `Chain::try_claim`),
//!   takes the state, calls the release hook (or drops the state) *while it holds the chain*,
//!   and only then gives the chain up and retires the key. A state task pushed meanwhile queues
//!   behind the claim and runs after the hook returned, against a fresh state: a key's new state
//!   is made only after its old one's hook returned, and each state goes through the hook once.
//!
//! Two more holders of a key's state, for handed-back tasks:
//!
//! - `shutdown_now`, holding a drained chain's baton, moves the state out of the cell into a
//!   holder shared by the key's handed-back tasks (`state_hold.rs`), so neither the reaper nor
//!   termination releases it. A chain it stole from a worker inside a task is the exception:
//!   it never touches that state; the worker, once its task returned, takes the state out of
//!   the cell (it is its last user) and hands it over through its slot.
//! - a state task handed back by `cancel_key` takes the key's chain baton when it is run
//!   (`handed_back::run_handed_back`) and then touches the cell as the chain's owner would.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::ptr::NonNull;
use std::sync::Arc;

/// A key's state, type-erased.
pub(crate) type Erased = Box<dyn Any + Send>;

/// `Builder::key_state`'s `init` and `on_key_release`'s hook, type-erased.
pub(crate) struct StateHooks<K> {
    pub(crate) init: Arc<dyn Fn(&K) -> Erased + Send + Sync>,
    pub(crate) release: Option<Arc<dyn Fn(K, Erased) + Send + Sync>>,
    /// `key_state` was set: keys may hold a state to release.
    pub(crate) on: bool,
}

impl<K> Clone for StateHooks<K> {
    fn clone(&self) -> Self {
        StateHooks {
            init: self.init.clone(),
            release: self.release.clone(),
            on: self.on,
        }
    }
}

impl<K> Default for StateHooks<K> {
    /// `S = ()`: `submit_with_state` gives `&mut ()`, nothing to release.
    fn default() -> Self {
        StateHooks {
            init: Arc::new(|_| Box::new(())),
            release: None,
            on: false,
        }
    }
}

impl<K: Clone> StateHooks<K> {
    /// Ends a state's life: `on_key_release(key, state)` if there is a hook (a panic in it, or
    /// in the key's `Clone`, is caught and reported by the panic hook), else a drop (its `Drop`
    /// contained the same way).
    pub(crate) fn release(&self, key: &K, state: Erased) {
        match &self.release {
            Some(hook) => match crate::user::catch(|| key.clone()) {
                Ok(key) => {
                    IN_HOOK.with(|h| h.set(h.get() + 1));
                    crate::user::call_quietly(|| hook(key, state));
                    IN_HOOK.with(|h| h.set(h.get() - 1));
                }
                Err(payload) => {
                    crate::user::drop_payload(payload);
                    crate::user::drop_quietly(state);
                }
            },
            None => crate::user::drop_quietly(state),
        }
    }
}

thread_local! {
    /// Release hooks running on this thread (a hook may submit: with a key budget, such a
    /// submission must not wait or release idle keys, whose FIFO the hook's caller may hold).
    static IN_HOOK: Cell<u32> = const { Cell::new(0) };
}

/// Whether the calling thread is inside a release hook.
pub(crate) fn in_release_hook() -> bool {
    IN_HOOK.with(|h| h.get() > 0)
}

/// A key's state cell in its entry (see the module docs for who may touch it).
#[derive(Default)]
pub(crate) struct StateCell(UnsafeCell<Option<Erased>>);

// SAFETY: the cell is read and written only by the holder of its key's chain baton, which
// passes between threads with Release/Acquire (core `chain`); the state is `Send`.
unsafe impl Sync for StateCell {}

impl StateCell {
    /// Takes the state out.
    ///
    /// # Safety
    /// The caller holds the key's chain baton.
    pub(crate) unsafe fn take(&self) -> Option<Erased> {
        // SAFETY: the caller's contract: nobody else touches the cell meanwhile.
        unsafe { (*self.0.get()).take() }
    }

    /// The cell itself.
    ///
    /// # Safety
    /// The caller holds the key's chain baton for as long as it uses the reference.
    // The baton, not the borrow, makes the access exclusive (as for a `Mutex` guard).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slot(&self) -> &mut Option<Erased> {
        // SAFETY: the caller's contract.
        unsafe { &mut *self.0.get() }
    }
}

/// Where a running state task finds its state.
pub(crate) trait Source {
    /// The state, made by `init` first if there is none (which may panic: then there is still
    /// none).
    fn state(&mut self) -> &mut (dyn Any + Send);
}

/// A key's state in its entry's cell, for the chain's owner.
pub(crate) struct EntrySource<'a, K> {
    pub(crate) slot: &'a mut Option<Erased>,
    pub(crate) key: &'a K,
    pub(crate) init: &'a (dyn Fn(&K) -> Erased + Send + Sync),
}

impl<K> Source for EntrySource<'_, K> {
    fn state(&mut self) -> &mut (dyn Any + Send) {
        if self.slot.is_none() {
            *self.slot = Some((self.init)(self.key));
        }
        self.slot.as_mut().expect("made above").as_mut()
    }
}

thread_local! {
    /// The state the state task running on this thread uses (set by [`run_with`]).
    static CURRENT: Cell<Option<NonNull<dyn Source>>> = const { Cell::new(None) };
}

/// Runs `f` (a state task's run) with `source` as the state it reaches through
/// [`with_current`].
pub(crate) fn run_with<R>(source: &mut dyn Source, f: impl FnOnce() -> R) -> R {
    let ptr: NonNull<dyn Source + '_> = NonNull::from(source);
    // SAFETY: only the lifetime is erased; `CURRENT` holds the pointer only while `f` runs
    // (restored by `Restore` below, also when `f` unwinds), and `source` outlives `f`.
    let ptr: NonNull<dyn Source> = unsafe { std::mem::transmute(ptr) };
    struct Restore(Option<NonNull<dyn Source>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(Some(ptr))));
    f()
}

/// Inside a state task: calls `f` with the key's state (made by `init` if it has none yet).
///
/// # Panics
/// Outside a state task's run, or when `init` panics (the task then fails `Panicked`, and
/// the key has no state yet).
pub(crate) fn with_current<S: 'static, R>(f: impl FnOnce(&mut S) -> R) -> R {
    // Taken out while `f` runs, so that nothing `f` does can reach the same state twice.
    let ptr = CURRENT
        .with(|c| c.take())
        .expect("a state task runs with its key's state");
    struct Restore(NonNull<dyn Source>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(Some(self.0)));
        }
    }
    let _restore = Restore(ptr);
    // SAFETY: `run_with` set the pointer to a source that lives while the task runs, and the
    // pointer is out of `CURRENT` while we use it: this is the only reference.
    let source = unsafe { &mut *ptr.as_ptr() };
    let state = source
        .state()
        .downcast_mut::<S>()
        .expect("a key's state has the serializer's state type");
    f(state)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_state_is_made_once_and_reached_by_its_tasks() {
        let init = |k: &u32| -> Erased { Box::new(*k * 10) };
        let mut slot = None;
        for add in [1, 2] {
            let mut src = EntrySource {
                slot: &mut slot,
                key: &4,
                init: &init,
            };
            run_with(&mut src, || with_current(|s: &mut u32| *s += add));
        }
        assert_eq!(*slot.unwrap().downcast::<u32>().unwrap(), 43);
        let panicked = std::panic::catch_unwind(|| with_current(|_: &mut u32| ()));
        assert!(panicked.is_err(), "no state outside a state task");
    }
}
