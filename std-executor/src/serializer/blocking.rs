//! The blocking calls on a thread inside a tokio runtime (DESIGN 3.1c): with `capacity` or
//! `max_keys`, a blocking submission there could stop the runtime for good (the futures that
//! would free the room need that very thread's timer or I/O driver), so it panics at once,
//! before anything is admitted, whether or not it would have waited, as tokio's
//! `blocking_send` does. `await_termination` there panics the same way. Without the `tokio`
//! feature nothing here is compiled in: there is no runtime to tell.

use std::hash::Hash;

use super::Serializer;

/// The panic of a blocking submission on a bounded serializer inside a tokio runtime.
pub(super) const BLOCKING_SUBMIT_IN_RUNTIME: &str = "keyserial: a blocking submission (`submit`, \
    `execute`, `spawn`, `submit_async`, `submit_with_state`, ...) on a serializer built with \
    `capacity` or `max_keys` was called on a thread inside a tokio runtime, where waiting for \
    room could block the runtime for good. Use `reserve(..).await` and submit through the \
    `Reservation` it gives, or the `try_` form (`try_submit`, `try_submit_async`, \
    `try_submit_with_state`), which never blocks.";

/// The panic of `await_termination` inside a tokio runtime.
pub(super) const AWAIT_TERMINATION_IN_RUNTIME: &str = "keyserial: `await_termination` was \
    called on a thread inside a tokio runtime, where it could block the runtime for good (the \
    queued futures may need that thread). Use `terminated().await` instead (with \
    `tokio::time::timeout` for a bound).";

/// Whether the calling thread is inside a tokio runtime (a task, `block_on`, `spawn_blocking`).
pub(super) fn in_tokio_runtime() -> bool {
    #[cfg(feature = "tokio")]
    {
        tokio::runtime::Handle::try_current().is_ok()
    }
    #[cfg(not(feature = "tokio"))]
    {
        false
    }
}

impl<K, S> Serializer<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    /// Panics if a blocking submission must not be made here: the serializer has `capacity` or
    /// `max_keys`, the caller is not one of its own tasks (which never block), and the thread
    /// is inside a tokio runtime.
    pub(super) fn forbid_blocking_submit_in_runtime(&self) {
        let sh = &*self.shared;
        if (sh.capacity().is_some() || sh.budget().is_some())
            && in_tokio_runtime()
            && crate::worker::current_worker::<K>(sh.id()).is_none()
        {
            panic!("{BLOCKING_SUBMIT_IN_RUNTIME}");
        }
    }

    /// Panics if `await_termination` is called on a thread inside a tokio runtime.
    pub(super) fn forbid_await_termination_in_runtime(&self) {
        if in_tokio_runtime() && crate::worker::current_worker::<K>(self.shared.id()).is_none() {
            panic!("{AWAIT_TERMINATION_IN_RUNTIME}");
        }
    }
}
