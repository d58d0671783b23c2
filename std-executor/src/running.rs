//! What the worker running on this thread is inside, for the self-wait check
//! (`handle::SelfWait`): a thread-local view of the worker's slot (its running task's key word
//! and its phase) and its serializer's stop flag, set by the worker around its loop. Apart from
//! `worker/`, so that handles (low in the crate) need not import the workers.

use std::cell::{Cell, RefCell};

use crate::phase::Phase;
use crate::sync::{AtomicU64, Ordering};

thread_local! {
    /// The view, while a worker loop runs on this thread.
    static HERE: Cell<Option<Here>> = const { Cell::new(None) };
}

#[derive(Clone, Copy)]
struct Here {
    id: usize,
    key: *const AtomicU64,
    phase: *const Phase,
    stopped: *const dyn Fn() -> bool,
}

/// Clears the view when dropped (the worker loop returned or unwound).
pub(crate) struct Entered(());

impl Drop for Entered {
    fn drop(&mut self) {
        HERE.with(|h| h.set(None));
    }
}

/// Sets this thread's view: serializer `id`'s worker whose running-key word is `key`, whose
/// phase is `phase`, and whose serializer says `stopped()` once `shutdown_now` was called.
///
/// # Safety
/// `key`, `phase` and `stopped` stay alive until the returned guard is dropped.
pub(crate) unsafe fn enter(
    id: usize,
    key: &AtomicU64,
    phase: &Phase,
    stopped: &dyn Fn() -> bool,
) -> Entered {
    // SAFETY: only the lifetime is erased; the caller keeps `stopped` alive until the guard
    // clears the view.
    let stopped: &'static dyn Fn() -> bool = unsafe { std::mem::transmute(stopped) };
    HERE.with(|h| {
        h.set(Some(Here {
            id,
            key,
            phase,
            stopped,
        }))
    });
    Entered(())
}

/// If this thread is one of serializer `id`'s workers inside a keyed task: that task's key word
/// (`hash | 1`, see `Slot::direct_hash`). `None` outside a task, on an unkeyed one, on another
/// serializer's worker, or once `shutdown_now` was called (a queued task may then be handed
/// back and run elsewhere: no verdict).
pub(crate) fn running_key_here(id: usize) -> Option<u64> {
    let here = HERE.with(Cell::get).filter(|h| h.id == id)?;
    // SAFETY: the view points at what `enter`'s caller keeps alive until the view is cleared,
    // and we are on that thread.
    let (key, phase, stopped) = unsafe { (&*here.key, &*here.phase, &*here.stopped) };
    if !phase.is_running() || stopped() {
        return None;
    }
    Some(key.load(Ordering::Relaxed)).filter(|&k| k != 0)
}

thread_local! {
    /// The serializer and slot of the worker running on this thread, and its local deque
    /// (`worker/mod.rs` sets it around its loop).
    static CURRENT: Cell<(usize, usize, *const ())> = const { Cell::new((0, 0, std::ptr::null())) };
}

/// The worker loop on this thread: `(serializer, slot, deque)`, or `(0, 0, null)`.
pub(crate) fn current_worker_raw() -> (usize, usize, *const ()) {
    CURRENT.with(Cell::get)
}

/// Set by the worker loop on entry, cleared (`(0, 0, null)`) before it returns.
pub(crate) fn set_current_worker(current: (usize, usize, *const ())) {
    CURRENT.with(|c| c.set(current));
}

/// The slot of the worker of serializer `id` running on this thread, if any.
pub(crate) fn current_slot(id: usize) -> Option<usize> {
    let (sid, slot, deque) = current_worker_raw();
    (sid == id && !deque.is_null()).then_some(slot)
}

/// `true` if this thread is a worker of serializer `id`.
pub(crate) fn on_worker_of(id: usize) -> bool {
    current_worker_raw().0 == id
}

thread_local! {
    /// The chains this thread holds as an outside holder (`baton.rs`) inside a task (`RUNNING`,
    /// a handed-back state task's run, a release hook): (serializer id, entry address, the
    /// holder's phase word). What the task may do to its key from inside (`cancel_key` takes the
    /// queue at once; a nested run of another state task of the key fails instead of waiting
    /// for itself) is decided here, as a worker's slot decides it for a worker's task.
    static HELD_HERE: RefCell<Vec<(usize, usize, usize)>> = const { RefCell::new(Vec::new()) };
}

/// While alive, [`held_here`] finds the chain (see [`running_here`]).
pub(crate) struct RunningHere(());

impl Drop for RunningHere {
    fn drop(&mut self) {
        HELD_HERE.with(|h| h.borrow_mut().pop());
    }
}

/// An outside holder (`baton.rs`) of serializer `id`'s entry at address `entry`, whose phase
/// word is `phase`, about to run a task of the entry's chain on this thread: marks it until the
/// guard is dropped (before the holder's registration, which owns `phase`).
pub(crate) fn running_here(id: usize, entry: usize, phase: &Phase) -> RunningHere {
    let phase = phase as *const Phase as usize;
    HELD_HERE.with(|h| h.borrow_mut().push((id, entry, phase)));
    RunningHere(())
}

/// The phase word of this thread's outside hold of serializer `id`'s entry at address `entry`,
/// if the thread is inside a task of that chain as an outside holder.
///
/// # Safety
/// The reference is valid while the task runs: the caller must be that task (code running on
/// this thread below the run, which keeps the holder registered until it returns).
pub(crate) unsafe fn held_here<'a>(id: usize, entry: usize) -> Option<&'a Phase> {
    let phase = HELD_HERE.with(|h| {
        h.borrow()
            .iter()
            .rev()
            .find(|&&(i, e, _)| i == id && e == entry)
            .map(|&(_, _, p)| p)
    })?;
    // SAFETY: `running_here`'s guard keeps the address listed only while the holder's
    // registration (which owns the phase through an `Arc`) is alive, below us on this thread.
    Some(unsafe { &*(phase as *const Phase) })
}

/// Whether this thread is inside a task of serializer `id` as the outside holder whose phase
/// word is at address `phase` (a lent state's holder, `state_hold.rs`, names it so).
pub(crate) fn runs_here(id: usize, phase: usize) -> bool {
    HELD_HERE.with(|h| h.borrow().iter().any(|&(i, _, p)| i == id && p == phase))
}
