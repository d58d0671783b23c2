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
//!
//! # Async waiters (`Serializer::reserve`)
//!
//! A `reserve` for a key that is not live waits for a share in a [`RoomQueue`] (`room_queue.rs`
//! gives the protocol); the top bit of `live` (`ASYNC`) says that queue is not empty (set and
//! cleared only under its lock). While it is set a share given back is **handed over** to the
//! oldest async waiter (`live` does not change) instead of freed, and `try_take` sees the budget
//! full (the bit makes `live` look huge), so no new key overtakes a waiter. A waiter also needs
//! idle keys released for it (nobody else releases them before their timeout): when a key goes
//! idle while async waiters wait, the worker wakes the oldest one ([`KeyBudget::nudge`]), which
//! releases the oldest idle key (`idle::release_one_idle`); the share that frees is handed over
//! to the oldest waiter, itself.

use std::time::Duration;

use std::task::{Poll, Waker};

use crate::room_queue::{Enter, RoomQueue, Status, Waiter};
use crate::sync::{lock, Arc, AtomicBool, AtomicUsize, Condvar, Mutex, Ordering};

/// `live`'s top bit: the async waiters' queue is not empty (see "Async waiters").
const ASYNC: usize = 1 << (usize::BITS - 1);

/// A serializer's budget of live keys (see the module docs).
#[derive(Debug)]
pub(crate) struct KeyBudget {
    max: usize,
    live: AtomicUsize,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    freed: Condvar,
    asyncs: RoomQueue,
}

impl KeyBudget {
    pub(crate) fn new(max: usize) -> Arc<KeyBudget> {
        Arc::new(KeyBudget {
            max,
            live: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            lock: Mutex::new(()),
            freed: Condvar::new(),
            asyncs: RoomQueue::new(),
        })
    }

    /// Live keys (shares taken and not given back).
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed) & !ASYNC
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

    /// A share comes back: to the oldest async waiter if there is one (see "Async waiters"),
    /// else to the count, waking the blocked submitters.
    fn give_back(&self) {
        let mut n = self.live.load(Ordering::Acquire);
        loop {
            if n & ASYNC != 0 && n & !ASYNC <= self.max {
                if self.asyncs.hand_over(|| self.clear_async()) {
                    return;
                }
                n = self.live.load(Ordering::Acquire);
                continue;
            }
            match self
                .live
                .compare_exchange_weak(n, n - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(seen) => n = seen,
            }
        }
        if self.waiters.load(Ordering::Acquire) > 0 {
            let _g = lock(&self.lock);
            self.freed.notify_all();
        }
    }

    /// Clears `ASYNC` (under the async queue's lock, which has just become empty).
    fn clear_async(&self) {
        self.live.fetch_and(!ASYNC, Ordering::AcqRel);
    }

    /// A `reserve` future's poll for a share (`me`: its waiter, see `room_queue.rs`): `Ready(Some)`
    /// once a share is the caller's, `Ready(None)` if `closed()` (shutdown) was seen first.
    pub(crate) fn poll_take(
        this: &Arc<Self>,
        me: &mut Option<Arc<Waiter>>,
        waker: &Waker,
        closed: impl FnOnce() -> bool,
    ) -> Poll<Option<KeyShare>> {
        let budget: &KeyBudget = this;
        let polled = budget.asyncs.poll(me, waker, |others_wait| {
            if closed() {
                return Enter::Closed;
            }
            if others_wait {
                return Enter::Wait; // behind them (ASYNC is set)
            }
            let mut n = budget.live.load(Ordering::Acquire);
            loop {
                let (next, outcome) = if n & !ASYNC < budget.max {
                    (n + 1, Enter::Took)
                } else {
                    (n | ASYNC, Enter::Wait)
                };
                match budget.live.compare_exchange_weak(
                    n,
                    next,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return outcome,
                    Err(seen) => n = seen,
                }
            }
        });
        // Taken or handed over: counted in `live` either way, the caller's share now.
        polled.map(|got| got.then(|| KeyShare::of(this.clone())))
    }

    /// Whether `me` is the oldest async waiter (the one to release idle keys for).
    pub(crate) fn is_front(&self, me: &Arc<Waiter>) -> bool {
        self.asyncs.is_front(me)
    }

    /// A `reserve` future dropped while it waited for a share: it leaves the queue, and a share
    /// handed over to it meanwhile goes on to the next waiter.
    pub(crate) fn cancel_take(this: &Arc<Self>, me: Arc<Waiter>) {
        if this.asyncs.cancel(me, || this.clear_async()) == Status::Granted {
            drop(KeyShare::of(this.clone())); // given back: to the next waiter
        }
    }

    /// A key went idle: the oldest async waiter (if any) looks again, to release it.
    pub(crate) fn nudge(&self) {
        if self.live.load(Ordering::Acquire) & ASYNC != 0 {
            self.asyncs.wake_front();
        }
    }

    /// Shutdown: every async waiter is closed.
    pub(crate) fn close_waiters(&self) {
        self.asyncs.close_all(|| self.clear_async());
    }

    /// Waits until a share may have been given back (or `timeout` passed).
    pub(crate) fn wait_a_little(&self, timeout: Duration) {
        self.waiters.fetch_add(1, Ordering::AcqRel);
        let g = lock(&self.lock);
        // With `ASYNC` set, `live` looks full: async waiters come first.
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
