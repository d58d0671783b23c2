//! The queue of async waiters for room (`Serializer::reserve`): a FIFO of tasks waiting, without
//! a thread, for a capacity slot (`capacity.rs`) or a share of the key budget (`key_budget.rs`).
//! A freed unit of room is **handed over** to the oldest waiter, never put back where a newcomer
//! could take it first, so waiters are served in arrival order.
//!
//! # Protocol
//!
//! One mutex guards the FIFO and every waiter's [`Status`]. The room's owner (the capacity word,
//! the budget's count) keeps a *waiters* flag in its own atomic word, set and cleared only under
//! this mutex, and set exactly while the FIFO is not empty. Each waiter is an `Arc<Waiter>` shared
//! by its future and (while it waits) the FIFO:
//!
//! ```text
//!  (none) --enter: room free, FIFO empty--> took the room (no waiter made)
//!  (none) --enter: no room, or FIFO not empty--> Waiting (pushed at the back; flag set)
//!  Waiting --hand_over (a releaser)--> Granted (popped; the releaser's unit is now its)
//!  Waiting --close_all (shutdown)--> Closed (popped)
//!  Waiting --cancel (its future dropped)--> gone (removed)
//!  Granted --poll--> the future has the room;  Granted --cancel--> the room is released again
//! ```
//!
//! - **enter** (the future's first poll), under the lock: with other waiters in the FIFO it goes
//!   behind them; else the owner's `enter` closure tries to take a unit (a CAS while there is
//!   room) or sets the flag *only while still full* (a CAS on the same word). So a release either
//!   comes before that CAS (the CAS sees the room and takes it) or after it (the releaser sees
//!   the flag and hands over under the lock, after the push): no unit is freed past a waiter.
//! - **hand_over** (a releaser that saw the flag): under the lock, pops the front waiter, marks it
//!   `Granted` (the unit goes from the releaser to it: the owner's count does not change) and
//!   clears the flag if the FIFO is now empty; it wakes the waiter after the unlock. If the FIFO
//!   was empty (the flag was cleared meanwhile), it does nothing and the releaser retries its
//!   ordinary release, which then sees the flag clear.
//! - **cancel** (a waiting future dropped): under the lock, a `Waiting` waiter leaves the FIFO
//!   (the flag is cleared if it was the last); a `Granted` one holds a unit it never used, which
//!   the caller releases again, so it goes to the next waiter: a wake-up received and not used
//!   is passed on, never lost.
//! - **close_all** (shutdown): under the lock, every waiter becomes `Closed` and is woken; the
//!   flag is cleared. The owner's `enter` checks shutdown under the same lock, so a waiter is
//!   either there to be closed or sees the shutdown when it enters.
//! - **wake_front**: wakes the oldest waiter without granting it anything (the budget: a key went
//!   idle, and the waiter may release it for itself; see `key_budget.rs`).
//!
//! Every status change happens under the lock, and the waker is taken and called after it, so
//! a waiter that polls again sees the outcome of every change that woke it. Nothing is lost: a
//! unit is always counted by exactly one of the owner's word (free), a waiter marked `Granted`, or
//! a holder (a `Reservation`, a queued task).

use std::collections::VecDeque;
use std::task::{Poll, Waker};

use crate::sync::{lock, Arc, Mutex};

/// Where a waiter stands (changed only under the queue's lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// In the FIFO.
    Waiting,
    /// Popped by a releaser: a unit of room is this waiter's.
    Granted,
    /// Popped by shutdown: no room, ever.
    Closed,
}

/// What the owner's `enter` closure decided for a new waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Enter {
    /// It took a unit of room at once.
    Took,
    /// Shut down: no room.
    Closed,
    /// It must wait (the owner's flag is set).
    Wait,
}

/// A waiter, shared by its future and, while it waits, the FIFO.
pub(crate) struct Waiter {
    state: Mutex<WaiterState>,
}

struct WaiterState {
    status: Status,
    waker: Option<Waker>,
}

/// The FIFO of async waiters for one kind of room (see the module docs).
pub(crate) struct RoomQueue {
    fifo: Mutex<VecDeque<Arc<Waiter>>>,
}

impl std::fmt::Debug for RoomQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoomQueue").finish_non_exhaustive()
    }
}

impl RoomQueue {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        RoomQueue {
            fifo: Mutex::new(VecDeque::new()),
        }
    }

    /// A waiting future's poll. `me` is its waiter (`None` before its first poll; set when it
    /// starts to wait, taken when it is done). `enter(others_wait)` runs under the lock on the
    /// first poll: it returns `Wait` when `others_wait` (the flag is set already), else it takes
    /// a unit or sets the owner's flag while still full. `Ready(true)`: a unit is the caller's;
    /// `Ready(false)`: closed.
    pub(crate) fn poll(
        &self,
        me: &mut Option<Arc<Waiter>>,
        waker: &Waker,
        enter: impl FnOnce(bool) -> Enter,
    ) -> Poll<bool> {
        let mut fifo = lock(&self.fifo);
        if let Some(w) = me {
            let mut st = lock(&w.state);
            return match st.status {
                Status::Waiting => {
                    if !st.waker.as_ref().is_some_and(|old| old.will_wake(waker)) {
                        st.waker = Some(waker.clone());
                    }
                    Poll::Pending
                }
                done => {
                    drop(st);
                    *me = None;
                    Poll::Ready(done == Status::Granted)
                }
            };
        }
        match enter(!fifo.is_empty()) {
            Enter::Took => Poll::Ready(true),
            Enter::Closed => Poll::Ready(false),
            Enter::Wait => {
                let w = Arc::new(Waiter {
                    state: Mutex::new(WaiterState {
                        status: Status::Waiting,
                        waker: Some(waker.clone()),
                    }),
                });
                fifo.push_back(w.clone());
                *me = Some(w);
                Poll::Pending
            }
        }
    }

    /// A releaser that saw the owner's flag: grants its unit to the oldest waiter (`true`), or,
    /// with nobody waiting any more, does nothing (`false`: release it the ordinary way).
    /// `clear` clears the owner's flag; it runs under the lock when the FIFO becomes empty.
    pub(crate) fn hand_over(&self, clear: impl FnOnce()) -> bool {
        let mut fifo = lock(&self.fifo);
        let Some(w) = fifo.pop_front() else {
            return false;
        };
        if fifo.is_empty() {
            clear();
        }
        let waker = {
            let mut st = lock(&w.state);
            debug_assert_eq!(st.status, Status::Waiting);
            st.status = Status::Granted;
            st.waker.take()
        };
        drop(fifo);
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }

    /// A dropped future's waiter leaves: its status when it left. `Granted`: the caller holds a
    /// unit it must release again (so that it goes to the next waiter). `clear` as for
    /// [`hand_over`](Self::hand_over).
    pub(crate) fn cancel(&self, me: Arc<Waiter>, clear: impl FnOnce()) -> Status {
        let mut fifo = lock(&self.fifo);
        let status = lock(&me.state).status;
        if status == Status::Waiting {
            fifo.retain(|w| !Arc::ptr_eq(w, &me));
            if fifo.is_empty() {
                clear();
            }
        }
        status
    }

    /// Shutdown: every waiter is closed and woken. `clear` as for [`hand_over`](Self::hand_over).
    pub(crate) fn close_all(&self, clear: impl FnOnce()) {
        let mut fifo = lock(&self.fifo);
        if fifo.is_empty() {
            return;
        }
        let wakers: Vec<Waker> = fifo
            .drain(..)
            .filter_map(|w| {
                let mut st = lock(&w.state);
                st.status = Status::Closed;
                st.waker.take()
            })
            .collect();
        clear();
        drop(fifo);
        for w in wakers {
            w.wake();
        }
    }

    /// Wakes the oldest waiter without granting it anything (it looks again).
    pub(crate) fn wake_front(&self) {
        let fifo = lock(&self.fifo);
        let waker = fifo.front().and_then(|w| lock(&w.state).waker.clone());
        drop(fifo);
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Whether `me` is the oldest waiter.
    pub(crate) fn is_front(&self, me: &Arc<Waiter>) -> bool {
        lock(&self.fifo).front().is_some_and(|w| Arc::ptr_eq(w, me))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::task::Wake;

    /// A waker that counts its wakes.
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn counting() -> (std::sync::Arc<Count>, Waker) {
        let c = std::sync::Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    #[test]
    fn waiters_are_granted_in_arrival_order_and_the_flag_follows_the_fifo() {
        let q = RoomQueue::new();
        let flag = AtomicBool::new(false);
        let set = |others: bool| {
            if !others {
                flag.store(true, Ordering::SeqCst);
            }
            Enter::Wait
        };
        let (wa, a_waker) = counting();
        let (wb, b_waker) = counting();
        let (mut a, mut b) = (None, None);
        assert_eq!(q.poll(&mut a, &a_waker, set), Poll::Pending);
        assert_eq!(
            q.poll(&mut b, &b_waker, |others| {
                assert!(others, "b comes behind a");
                Enter::Wait
            }),
            Poll::Pending
        );
        assert!(flag.load(Ordering::SeqCst));
        assert!(q.is_front(a.as_ref().unwrap()));
        // Polling again changes nothing.
        assert_eq!(q.poll(&mut b, &b_waker, |_| unreachable!()), Poll::Pending);
        assert!(q.hand_over(|| flag.store(false, Ordering::SeqCst)));
        assert_eq!(wa.0.load(Ordering::SeqCst), 1, "a woken");
        assert_eq!(wb.0.load(Ordering::SeqCst), 0);
        assert!(flag.load(Ordering::SeqCst), "b still waits");
        assert_eq!(
            q.poll(&mut a, &a_waker, |_| unreachable!()),
            Poll::Ready(true)
        );
        assert!(a.is_none());
        assert!(q.hand_over(|| flag.store(false, Ordering::SeqCst)));
        assert!(!flag.load(Ordering::SeqCst), "empty: cleared");
        assert_eq!(
            q.poll(&mut b, &b_waker, |_| unreachable!()),
            Poll::Ready(true)
        );
        assert!(!q.hand_over(|| unreachable!()), "nobody left");
    }

    #[test]
    fn a_cancelled_waiter_leaves_and_a_granted_one_reports_its_unit() {
        let q = RoomQueue::new();
        let (_, w) = counting();
        let (mut a, mut b) = (None, None);
        assert_eq!(q.poll(&mut a, &w, |_| Enter::Wait), Poll::Pending);
        assert_eq!(q.poll(&mut b, &w, |_| Enter::Wait), Poll::Pending);
        let cleared = AtomicBool::new(false);
        // a is granted and dropped before it polls: the caller must pass its unit on.
        assert!(q.hand_over(|| unreachable!()));
        assert_eq!(
            q.cancel(a.take().unwrap(), || unreachable!()),
            Status::Granted
        );
        // b leaves while waiting: the FIFO is empty, the flag cleared.
        assert_eq!(
            q.cancel(b.take().unwrap(), || cleared.store(true, Ordering::SeqCst)),
            Status::Waiting
        );
        assert!(cleared.load(Ordering::SeqCst));
        assert!(!q.hand_over(|| unreachable!()));
    }

    #[test]
    fn close_all_closes_and_wakes_every_waiter_and_enter_decides_without_waiting() {
        let q = RoomQueue::new();
        let (c, w) = counting();
        let mut ws: Vec<Option<Arc<Waiter>>> = (0..3).map(|_| None).collect();
        for me in &mut ws {
            assert_eq!(q.poll(me, &w, |_| Enter::Wait), Poll::Pending);
        }
        q.wake_front();
        assert_eq!(
            c.0.load(Ordering::SeqCst),
            1,
            "the front one, nothing granted"
        );
        let cleared = AtomicBool::new(false);
        q.close_all(|| cleared.store(true, Ordering::SeqCst));
        assert_eq!(c.0.load(Ordering::SeqCst), 4);
        assert!(cleared.load(Ordering::SeqCst));
        for me in &mut ws {
            assert_eq!(q.poll(me, &w, |_| unreachable!()), Poll::Ready(false));
        }
        let mut fresh = None;
        assert_eq!(q.poll(&mut fresh, &w, |_| Enter::Took), Poll::Ready(true));
        assert_eq!(
            q.poll(&mut fresh, &w, |_| Enter::Closed),
            Poll::Ready(false)
        );
        assert!(fresh.is_none());
    }

    #[test]
    fn threads_releasing_and_cancelling_lose_no_unit() {
        // Units counted in `free` (the owner's word, simplified to a mutex here); 4 waiters,
        // 2 units, waiters cancel half-way through; at the end every unit is back.
        use std::sync::Mutex as StdMutex;
        let q = std::sync::Arc::new(RoomQueue::new());
        let free = std::sync::Arc::new(StdMutex::new((0usize, false))); // (free units, flag)
        let release = {
            let (q, free) = (q.clone(), free.clone());
            move || loop {
                let flag = free.lock().unwrap().1;
                if flag && q.hand_over(|| free.lock().unwrap().1 = false) {
                    return;
                }
                let mut f = free.lock().unwrap();
                if !f.1 {
                    f.0 += 1;
                    return;
                }
            }
        };
        let (_, w) = counting();
        let mut handles = Vec::new();
        for i in 0..4 {
            let (q, free, w, release) = (q.clone(), free.clone(), w.clone(), release.clone());
            handles.push(std::thread::spawn(move || {
                let mut me = None;
                let enter = |others: bool| {
                    let mut f = free.lock().unwrap();
                    if !others && f.0 > 0 {
                        f.0 -= 1;
                        Enter::Took
                    } else {
                        f.1 = true;
                        Enter::Wait
                    }
                };
                let mut got = q.poll(&mut me, &w, enter) == Poll::Ready(true);
                let mut spins = 0;
                while !got && spins < 50 && i % 2 == 0 {
                    std::thread::yield_now();
                    got = q.poll(&mut me, &w, |_| unreachable!()) == Poll::Ready(true);
                    spins += 1;
                }
                if got {
                    release(); // used, and given back
                } else {
                    // Gave up waiting (or, for the odd ones, at once): a unit granted meanwhile
                    // is passed on.
                    let me = me.take().unwrap();
                    if q.cancel(me, || free.lock().unwrap().1 = false) == Status::Granted {
                        release();
                    }
                }
            }));
        }
        release();
        release();
        for h in handles {
            h.join().unwrap();
        }
        let f = free.lock().unwrap();
        assert_eq!(*f, (2, false), "both units back, nobody waiting");
    }
}
