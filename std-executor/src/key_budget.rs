//! `Builder::max_keys`: a budget of live keys, and each live key's share of it.
//!
//! # How a serializer with a key budget runs
//!
//! Without a budget a key costs nothing until it needs state (`route.rs`): most keys are never
//! counted anywhere, which is what lets the lanes run plain tasks without a look-up. A budget
//! needs every live key counted, so a serializer built with `max_keys` gives every key an entry
//! (`key.rs`) from its first submission on, and its submitters push keyed tasks straight onto
//! their key's chain instead of into a lane (`serializer/admit.rs`, "With a key budget"): the
//! chain is then the key's one queue, its push the submission's admission (inside the gate, as
//! for unkeyed tasks), and the entry cannot be released while a task is on its way to it (a push
//! onto a retired chain fails, and the submitter goes back to the table). Idle keys wait for
//! their timeout in one FIFO that every worker and submitter shares (`idle.rs`), so that a
//! submitter of a new key at the limit can release the oldest idle key itself.
//!
//! # The budget
//!
//! `live` counts shares: a [`KeyShare`] is taken before a new key's entry is inserted (a
//! submitter: only below `max`; `pause` and `cancel_key`: always, which may exceed the limit,
//! as documented) and given back exactly once, when the entry is retired (`idle.rs`) or, for an
//! entry that was never published or is freed with the table, when it drops. A submitter that
//! finds no room releases idle keys first, then waits (`submit`), or is refused `TooManyKeys`
//! (`try_submit`, and any submission from inside a task, which must never wait). Giving a share
//! back wakes the waiters; they wait with a timeout too, and look again, so a wakeup that came
//! between a waiter's look and its wait costs at most that timeout.

use std::time::Duration;

use crate::sync::{lock, Arc, AtomicBool, AtomicUsize, Condvar, Mutex, Ordering};

/// A serializer's budget of live keys (see the module docs).
#[derive(Debug)]
pub(crate) struct KeyBudget {
    max: usize,
    live: AtomicUsize,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    freed: Condvar,
}

impl KeyBudget {
    pub(crate) fn new(max: usize) -> Arc<KeyBudget> {
        Arc::new(KeyBudget {
            max,
            live: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            lock: Mutex::new(()),
            freed: Condvar::new(),
        })
    }

    /// Live keys (shares taken and not given back).
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// A share if the budget has room.
    pub(crate) fn try_take(this: &Arc<Self>) -> Option<KeyShare> {
        let me: &KeyBudget = this;
        let mut n = me.live.load(Ordering::Relaxed);
        loop {
            if n >= me.max {
                return None;
            }
            match me
                .live
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(KeyShare::of(this.clone())),
                Err(seen) => n = seen,
            }
        }
    }

    /// A share whatever the budget says (`pause`, `cancel_key`, a worker's entry).
    pub(crate) fn force_take(this: &Arc<Self>) -> KeyShare {
        this.live.fetch_add(1, Ordering::AcqRel);
        KeyShare::of(this.clone())
    }

    fn give_back(&self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
        if self.waiters.load(Ordering::Acquire) > 0 {
            let _g = lock(&self.lock);
            self.freed.notify_all();
        }
    }

    /// Waits until a share may have been given back (or `timeout` passed).
    pub(crate) fn wait_a_little(&self, timeout: Duration) {
        self.waiters.fetch_add(1, Ordering::AcqRel);
        let g = lock(&self.lock);
        if self.live.load(Ordering::Acquire) >= self.max {
            #[cfg(not(loom))]
            drop(self.freed.wait_timeout(g, timeout));
            #[cfg(loom)]
            {
                let _ = timeout;
                drop(g);
                loom::thread::yield_now();
            }
        }
        self.waiters.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A live key's share of its serializer's [`KeyBudget`] (or of none), given back once: by
/// [`release`](KeyShare::release) when the key is retired, or when it drops.
#[derive(Debug, Default)]
pub(crate) struct KeyShare {
    budget: Option<Arc<KeyBudget>>,
    released: AtomicBool,
}

impl KeyShare {
    fn of(budget: Arc<KeyBudget>) -> KeyShare {
        KeyShare {
            budget: Some(budget),
            released: AtomicBool::new(false),
        }
    }

    /// No budget: nothing to give back.
    pub(crate) fn none() -> KeyShare {
        KeyShare::default()
    }

    /// Gives the share back now (the key was retired); later calls and the drop do nothing.
    pub(crate) fn release(&self) {
        if let Some(b) = &self.budget {
            if !self.released.swap(true, Ordering::AcqRel) {
                b.give_back();
            }
        }
    }
}

impl Drop for KeyShare {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn shares_are_counted_and_given_back_once() {
        let b = KeyBudget::new(2);
        let s1 = KeyBudget::try_take(&b).unwrap();
        let s2 = KeyBudget::try_take(&b).unwrap();
        assert!(KeyBudget::try_take(&b).is_none());
        let forced = KeyBudget::force_take(&b);
        assert_eq!(b.live(), 3);
        s1.release();
        s1.release();
        drop(s1);
        assert_eq!(b.live(), 2);
        drop(forced);
        assert_eq!(b.live(), 1);
        let s3 = KeyBudget::try_take(&b).unwrap();
        b.wait_a_little(Duration::from_millis(1)); // full: times out
        drop((s2, s3));
        assert_eq!(b.live(), 0);
        KeyShare::none().release();
    }
}
