//! The synchronisation facade of the std crate: `std::sync` normally, loom's under `cfg(loom)`, so
//! the loom models in `loom/` can check this crate's protocols (semaphore grant/cancel, distinct
//! queue, the permit-wait hand-off).
#![allow(unused_imports)]

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Locks a mutex, ignoring poisoning: every critical section in this crate leaves its data
/// consistent before it can panic. User code runs under one of our locks only where the check
/// and the change must be one step, and there before anything changes (`user.rs` lists them:
/// a key's `Eq`/`Clone` in `claims.rs` and `latest_cells.rs`, the routing under a deferral's
/// lock, whose user code is caught before it can unwind).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(loom))]
    {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(loom)]
    {
        m.lock().unwrap()
    }
}

#[cfg(not(loom))]
pub(crate) use crossbeam_utils::sync::{Parker, Unparker};

#[cfg(loom)]
pub use loom_parker::{Parker, Unparker};

/// A parker for loom models: a flag under a mutex and a condvar. Timeouts are modelled as
/// spurious returns (loom has no clock), which every caller must tolerate anyway.
#[cfg(loom)]
pub mod loom_parker {
    use loom::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    struct Inner {
        notified: Mutex<bool>,
        cond: Condvar,
    }

    pub struct Parker {
        unparker: Unparker,
    }

    #[derive(Clone)]
    pub struct Unparker {
        inner: Arc<Inner>,
    }

    impl Parker {
        #[allow(clippy::new_without_default)]
        pub fn new() -> Parker {
            Parker {
                unparker: Unparker {
                    inner: Arc::new(Inner {
                        notified: Mutex::new(false),
                        cond: Condvar::new(),
                    }),
                },
            }
        }

        pub fn unparker(&self) -> &Unparker {
            &self.unparker
        }

        pub fn park(&self) {
            let inner = &self.unparker.inner;
            let mut n = inner.notified.lock().unwrap();
            while !*n {
                n = inner.cond.wait(n).unwrap();
            }
            *n = false;
        }

        pub fn park_timeout(&self, _timeout: Duration) {
            let mut n = self.unparker.inner.notified.lock().unwrap();
            *n = false;
        }
    }

    impl Unparker {
        pub fn unpark(&self) {
            *self.inner.notified.lock().unwrap() = true;
            self.inner.cond.notify_one();
        }
    }
}

/// How to wake a waiter of the semaphore or the distinct queue once its turn came: a parked
/// thread or a pending future's task. Callers take it out of their queue under their lock and call
/// [`wake`](Self::wake) after unlocking.
pub(crate) enum Wakeup {
    /// A thread parked on the matching `Parker`.
    Thread(Unparker),
    /// An async task.
    Task(std::task::Waker),
}

impl Wakeup {
    /// Wakes the waiter.
    pub(crate) fn wake(self) {
        match self {
            Wakeup::Thread(u) => u.unpark(),
            Wakeup::Task(w) => w.wake(),
        }
    }
}

/// One step of a wait loop: crossbeam's exponential backoff normally, a yield to the model's
/// scheduler under loom (a loom thread that spins without yielding never lets the others run).
pub(crate) fn snooze(backoff: &crossbeam_utils::Backoff) {
    #[cfg(not(loom))]
    backoff.snooze();
    #[cfg(loom)]
    {
        let _ = backoff;
        loom::thread::yield_now();
    }
}
