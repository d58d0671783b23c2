//! Backpressure: a bound on queued (admitted, not yet started) tasks.
//!
//! # Protocol
//!
//! One word: `queued` in the low 40 bits and the number of blocked submitters (`waiters`) above.
//! Only RMWs touch it:
//!
//! - **reserve** (submit): CAS `queued + 1` while `queued < capacity`. Over capacity, a blocking
//!   submitter locks the mutex, CASes `waiters + 1` *only if still full* (else retries reserve),
//!   and waits on the condvar; when woken it CASes `waiters - 1` under the lock and retries.
//! - **release** (a task started, was dropped or handed back): `prev = fetch_sub(1)`; if `prev`
//!   shows waiters, lock the mutex and `notify_all`.
//!
//! A waiter registers (RMW) under the lock and waits atomically releasing it; a releaser's
//! `fetch_sub` either precedes the registration (then the registering CAS sees room and does not
//! wait) or follows it (then it sees `waiters > 0` and notifies under the lock, after the waiter
//! is inside `wait`). So no wakeup is lost. Shutdown notifies all waiters, who then see the gate
//! closed.

use std::time::Duration;

use crate::sync::{lock, AtomicU64, Condvar, Mutex, Ordering};

const QUEUED_MASK: u64 = (1 << 40) - 1;
const WAITER: u64 = 1 << 40;

pub struct Capacity {
    limit: u64,
    word: AtomicU64,
    mutex: Mutex<()>,
    cond: Condvar,
}

impl Capacity {
    pub fn new(limit: usize) -> Capacity {
        Capacity {
            limit: (limit as u64).min(QUEUED_MASK),
            word: AtomicU64::new(0),
            mutex: Mutex::new(()),
            cond: Condvar::new(),
        }
    }

    /// Takes one slot if there is room.
    pub fn try_reserve(&self) -> bool {
        let mut cur = self.word.load(Ordering::Relaxed);
        loop {
            if cur & QUEUED_MASK >= self.limit {
                return false;
            }
            match self
                .word
                .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Takes one slot even over the limit (a submit from inside a running task).
    pub fn force_reserve(&self) {
        self.word.fetch_add(1, Ordering::AcqRel);
    }

    /// Blocks until a slot is taken or `give_up()` returns `true` (checked after every wakeup).
    /// Returns whether a slot was taken.
    pub fn reserve(&self, give_up: impl Fn() -> bool) -> bool {
        loop {
            if self.try_reserve() {
                return true;
            }
            if give_up() {
                return false;
            }
            let guard = lock(&self.mutex);
            // Register as a waiter only while still full.
            let mut cur = self.word.load(Ordering::Acquire);
            let registered = loop {
                if cur & QUEUED_MASK < self.limit {
                    break false;
                }
                match self.word.compare_exchange_weak(
                    cur,
                    cur + WAITER,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break true,
                    Err(actual) => cur = actual,
                }
            };
            if !registered {
                continue;
            }
            if give_up() {
                self.word.fetch_sub(WAITER, Ordering::AcqRel);
                return false;
            }
            #[cfg(not(loom))]
            let guard = self
                .cond
                .wait_timeout(guard, Duration::from_millis(100))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
            #[cfg(loom)]
            let guard = {
                let _ = Duration::ZERO;
                self.cond.wait(guard).unwrap()
            };
            self.word.fetch_sub(WAITER, Ordering::AcqRel);
            drop(guard);
        }
    }

    /// Gives one slot back (the task started, or left without running).
    pub fn release(&self) {
        let prev = self.word.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(prev & QUEUED_MASK > 0);
        if prev >= WAITER {
            let _g = lock(&self.mutex);
            self.cond.notify_all();
        }
    }

    /// Wakes every blocked submitter (shutdown).
    pub fn wake_all(&self) {
        let _g = lock(&self.mutex);
        self.cond.notify_all();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn blocks_when_full_until_a_release() {
        let c = Arc::new(Capacity::new(1));
        assert!(c.try_reserve());
        assert!(!c.try_reserve());
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.reserve(|| false));
        std::thread::sleep(Duration::from_millis(20));
        c.release();
        assert!(t.join().unwrap());
        c.force_reserve();
        c.release();
        c.release();
        assert!(c.try_reserve());
    }

    #[test]
    fn gives_up_on_request() {
        let c = Capacity::new(1);
        assert!(c.try_reserve());
        assert!(!c.reserve(|| true));
    }
}
