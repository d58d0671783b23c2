//! The synchronisation facade: every atomic and every shared cell of this crate comes from here.
//!
//! Normally the atomics are `portable-atomic`'s (native instructions where the target has them; a
//! critical section, supplied by the final binary, where it does not). Under `cfg(loom)` they are
//! loom's, and so is [`UnsafeCell`], so that the models in `loom/` check this crate's real code rather
//! than a copy of it. Code in this crate never names `core::sync::atomic` or `core::cell::UnsafeCell`
//! directly.

#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use portable_atomic::{AtomicBool, AtomicPtr, AtomicUsize};

#[cfg(loom)]
#[allow(unused_imports)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize};

pub(crate) use core::sync::atomic::Ordering;

/// A cell for data shared between threads whose accesses are ordered by a protocol (for example
/// "only the holder of `ACTIVE` touches it"). All accesses go through [`with`](Self::with) and
/// [`with_mut`](Self::with_mut) so that loom can check them.
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }

    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// A hint inside a wait loop: a CPU pause normally, a yield to the model's scheduler under loom (a
/// loom model whose thread spins without yielding never terminates).
#[inline(always)]
#[allow(dead_code)]
pub(crate) fn spin_hint() {
    #[cfg(not(loom))]
    core::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Stores `value` into `atomic` through a unique borrow: a plain write, no atomic operation
/// (loom checks that no other thread can be accessing it).
#[inline(always)]
#[allow(dead_code)]
pub(crate) fn set_exclusive(atomic: &mut AtomicUsize, value: usize) {
    #[cfg(not(loom))]
    {
        *atomic.get_mut() = value;
    }
    #[cfg(loom)]
    atomic.with_mut(|v| *v = value);
}
