//! Work a semaphore operation leaves for after its lock is released: wakes, granted callbacks
//! (user code, run one at a time per thread through a trampoline) and drops.

use super::*;

/// Work to do once the queue lock is released.
pub(super) enum Deferred {
    Wake(Wakeup),
    Call(Callback, Result<Permit, AcquireError>),
    Drop(Callback),
    DropWaker(Waker),
}

impl Deferred {
    pub(super) fn run(self) {
        match self {
            Deferred::Wake(w) => w.wake(),
            Deferred::Call(f, outcome) => f(outcome),
            Deferred::Drop(f) => drop(f),
            Deferred::DropWaker(w) => drop(w),
        }
    }

    #[cfg(not(loom))]
    pub(super) fn is_user_call(&self) -> bool {
        matches!(self, Deferred::Call(..) | Deferred::Drop(_))
    }
}

/// Runs deferred work after the lock is released: wakes at once; callbacks through the per-thread
/// trampoline (see the module docs).
pub(super) fn run_deferred(actions: Vec<Deferred>) {
    if actions.is_empty() {
        return;
    }
    #[cfg(loom)]
    for a in actions {
        a.run();
    }
    #[cfg(not(loom))]
    trampoline::run(actions);
}

#[cfg(not(loom))]
mod trampoline {
    use super::Deferred;
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

    thread_local! {
        /// `Some` while this thread is running granted callbacks: nested grants queue here.
        static PENDING: RefCell<Option<VecDeque<Deferred>>> = const { RefCell::new(None) };
    }

    pub(super) fn run(actions: Vec<Deferred>) {
        let mut calls = VecDeque::new();
        for a in actions {
            if a.is_user_call() {
                calls.push_back(a);
            } else {
                a.run();
            }
        }
        if calls.is_empty() {
            return;
        }
        // Nested inside a callback of this thread? Queue for the outer loop.
        let outer = PENDING.try_with(|p| {
            let mut p = p.borrow_mut();
            match p.as_mut() {
                Some(q) => {
                    q.append(&mut calls);
                    false
                }
                None => {
                    *p = Some(VecDeque::new());
                    true
                }
            }
        });
        match outer {
            Ok(false) => (),
            Ok(true) => {
                let mut panic = None;
                loop {
                    let next = calls.pop_front().or_else(|| {
                        PENDING
                            .try_with(|p| p.borrow_mut().as_mut().and_then(VecDeque::pop_front))
                            .ok()
                            .flatten()
                    });
                    let Some(a) = next else { break };
                    if let Err(p) = catch_unwind(AssertUnwindSafe(|| a.run())) {
                        panic.get_or_insert(p);
                    }
                }
                let _ = PENDING.try_with(|p| *p.borrow_mut() = None);
                if let Some(p) = panic {
                    if !std::thread::panicking() {
                        resume_unwind(p);
                    }
                }
            }
            // Thread-local storage is being torn down: call directly.
            Err(_) => calls.into_iter().for_each(Deferred::run),
        }
    }
}
