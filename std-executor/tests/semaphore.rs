//! The fair semaphore: FIFO with mixed sizes, no barging, all-or-nothing, cancellation, close.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use keyserial::{AcquireError, Semaphore};
use std::sync::mpsc::TryRecvError;
use std::task::Wake;

use keyserial::Permit;

mod common;
use common::wait_until;

/// Queues an `acquire_with` of `n` that records `tag` in `log` when granted; keeps the permit.
fn queue(
    sem: &Semaphore,
    n: usize,
    tag: &'static str,
    log: &Arc<Mutex<Vec<&'static str>>>,
    held: &Arc<Mutex<Vec<keyserial::Permit>>>,
) {
    let (log, held) = (log.clone(), held.clone());
    sem.acquire_with(n, move |r| {
        log.lock().unwrap().push(tag);
        held.lock().unwrap().push(r.unwrap());
    });
}

#[test]
fn grants_in_arrival_order_with_mixed_sizes() {
    let sem = Semaphore::new(5);
    let all = sem.acquire(5).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let held = Arc::new(Mutex::new(Vec::new()));
    queue(&sem, 5, "five", &log, &held);
    queue(&sem, 1, "one", &log, &held);
    queue(&sem, 2, "two", &log, &held);
    let mut all = all;
    // Release one permit at a time: the large head request blocks the small ones behind it.
    for _ in 0..4 {
        drop(all.split(1).unwrap());
        assert!(log.lock().unwrap().is_empty(), "nobody may pass the head");
    }
    drop(all);
    assert_eq!(*log.lock().unwrap(), ["five"]);
    let five = held.lock().unwrap().pop().unwrap();
    drop(five);
    assert_eq!(*log.lock().unwrap(), ["five", "one", "two"]);
    held.lock().unwrap().clear();
    assert_eq!(sem.available(), 5);
}

#[test]
fn no_barging_while_someone_waits() {
    let sem = Semaphore::new(2);
    let held = sem.acquire(2).unwrap();
    let (tx, rx) = mpsc::channel();
    sem.acquire_with(2, move |r| tx.send(r.map(|p| p.count())).unwrap());
    let mut held = held;
    drop(held.split(1).unwrap()); // one free permit, but the waiter needs two
    assert_eq!(sem.try_acquire(1).unwrap_err(), AcquireError::NoPermits);
    drop(held);
    assert_eq!(rx.recv().unwrap(), Ok(2));
    assert_eq!(
        sem.available(),
        2,
        "the callback's permit was dropped inside it"
    );
}

#[test]
fn too_many_and_zero() {
    let sem = Semaphore::new(3);
    assert_eq!(sem.try_acquire(4).unwrap_err(), AcquireError::TooMany);
    assert_eq!(sem.acquire(4).unwrap_err(), AcquireError::TooMany);
    let (tx, rx) = mpsc::channel();
    sem.acquire_with(9, move |r| tx.send(r.err()).unwrap());
    assert_eq!(rx.recv().unwrap(), Some(AcquireError::TooMany));
    let _all = sem.acquire(3).unwrap();
    assert_eq!(
        sem.acquire(0).unwrap().count(),
        0,
        "zero succeeds at once, even when none are free"
    );
    sem.add_permits(2);
    assert!(
        sem.try_acquire(5).is_err(),
        "capacity 5 now, but 3 are held"
    );
    assert_eq!(sem.try_acquire(6).unwrap_err(), AcquireError::TooMany);
}

#[test]
fn a_timed_out_waiter_passes_its_partial_permits_on() {
    let sem = Semaphore::new(3);
    let held = sem.acquire(3).unwrap();
    let mut held = held;
    // The head wants 3 and times out holding a partial assignment; the next wants 2.
    let s2 = sem.clone();
    let head = thread::spawn(move || {
        s2.acquire_timeout(3, Duration::from_millis(100))
            .map(|p| p.count())
    });
    assert!(wait_until(Duration::from_secs(5), || sem
        .try_acquire(1)
        .is_err()));
    thread::sleep(Duration::from_millis(10));
    let (tx, rx) = mpsc::channel();
    sem.acquire_with(2, move |r| tx.send(r.map(|p| p.count())).unwrap());
    drop(held.split(2).unwrap()); // assigned to the head (partial: 2 of 3)
    assert_eq!(head.join().unwrap().unwrap_err(), AcquireError::Timeout);
    // The head's two permits went to the next waiter.
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), Ok(2));
    drop(held);
    assert_eq!(sem.available(), 3);
}

#[test]
fn a_dropped_acquire_future_returns_its_permits() {
    let sem = Semaphore::new(2);
    let mut held = sem.acquire(2).unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    {
        let mut fut = pin!(sem.acquire_async(2));
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        drop(held.split(1).unwrap()); // partially assigned to the future
    } // dropped here
    drop(held);
    assert_eq!(sem.available(), 2);
    // A granted-but-never-polled future gives its permits back too.
    let held = sem.acquire(2).unwrap();
    {
        let mut fut = pin!(sem.acquire_async(1));
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        drop(held);
    }
    assert_eq!(sem.available(), 2);
}

#[test]
fn async_acquire_is_woken_on_release() {
    let sem = Semaphore::new(1);
    let held = sem.acquire(1).unwrap();
    struct Flag(AtomicUsize);
    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let flag = Arc::new(Flag(AtomicUsize::new(0)));
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(sem.acquire_async(1));
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    drop(held);
    assert_eq!(flag.0.load(Ordering::SeqCst), 1);
    let Poll::Ready(Ok(p)) = fut.as_mut().poll(&mut cx) else {
        panic!("granted after the wake")
    };
    assert_eq!(p.count(), 1);
}

#[test]
fn close_fails_every_waiter_and_later_acquires() {
    let sem = Semaphore::new(1);
    let held = sem.acquire(1).unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let s = sem.clone();
            thread::spawn(move || s.acquire(1).map(|_| ()))
        })
        .collect();
    thread::sleep(Duration::from_millis(30));
    let (tx, rx) = mpsc::channel();
    sem.acquire_with(1, move |r| tx.send(r.err()).unwrap());
    sem.close();
    for w in waiters {
        assert_eq!(w.join().unwrap().unwrap_err(), AcquireError::Closed);
    }
    assert_eq!(rx.recv().unwrap(), Some(AcquireError::Closed));
    assert_eq!(sem.try_acquire(1).unwrap_err(), AcquireError::Closed);
    drop(held);
    assert_eq!(
        sem.available(),
        1,
        "held permits still come back after close"
    );
}

#[test]
fn acquire_with_runs_exactly_once_at_once_or_on_release() {
    let sem = Semaphore::new(1);
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    sem.acquire_with(1, move |p| {
        r.fetch_add(1, Ordering::SeqCst);
        drop(p);
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "free: ran at once");
    let held = sem.acquire(1).unwrap();
    let r = runs.clone();
    sem.acquire_with(1, move |p| {
        r.fetch_add(1, Ordering::SeqCst);
        drop(p);
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(held);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "ran on release, once");
}

#[test]
fn split_and_forget() {
    let sem = Semaphore::new(4);
    let mut p = sem.acquire(4).unwrap();
    let q = p.split(3).unwrap();
    assert!(p.split(2).is_none());
    q.forget();
    drop(p);
    assert_eq!(sem.available(), 1);
    assert_eq!(sem.try_acquire(2).unwrap_err(), AcquireError::TooMany);
}

#[test]
fn eight_threads_never_exceed_the_permits() {
    let sem = Semaphore::new(4);
    let inside = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (sem, inside) = (sem.clone(), inside.clone());
            thread::spawn(move || {
                let mut x = 0x2545_F491_4F6C_DD1Du64 ^ t;
                for _ in 0..1000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let n = 1 + (x % 3) as usize;
                    let p = sem.acquire(n).unwrap();
                    let now = inside.fetch_add(n, Ordering::SeqCst) + n;
                    assert!(now <= 4, "{now} permits held at once");
                    inside.fetch_sub(n, Ordering::SeqCst);
                    drop(p);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(sem.available(), 4);
}

// ---- More of the contract: step-by-step grant order, cancellation, async, stress. ----

/// Waits (without a time bound on correctness; the 10 s cap only turns a hang into a failure)
/// until `f` holds.
fn wait_for(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Starts a thread that acquires `n` permits and sends them back.
fn spawn_acquire(
    sem: &Semaphore,
    n: usize,
    tx: &mpsc::Sender<(char, Result<Permit, AcquireError>)>,
    name: char,
) -> thread::JoinHandle<()> {
    let (sem, tx) = (sem.clone(), tx.clone());
    thread::spawn(move || tx.send((name, sem.acquire(n))).unwrap())
}

struct ThreadWaker(thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A minimal executor: polls the future on this thread, parking between polls.
fn block_on<F: Future>(fut: F) -> F::Output {
    let waker = Waker::from(Arc::new(ThreadWaker(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        thread::park();
    }
}

/// A waker that counts its wakes.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn threads_are_granted_in_arrival_order_step_by_step() {
    let sem = Semaphore::new(5);
    let mut all = sem.try_acquire(5).unwrap();
    let (tx, rx) = mpsc::channel();
    // A wants 5, then B wants 1, then C wants 2: queued in that order.
    let a = spawn_acquire(&sem, 5, &tx, 'A');
    wait_for("A to queue", || sem.waiters() == 1);
    let b = spawn_acquire(&sem, 1, &tx, 'B');
    wait_for("B to queue", || sem.waiters() == 2);
    let c = spawn_acquire(&sem, 2, &tx, 'C');
    wait_for("C to queue", || sem.waiters() == 3);

    // Four single permits go to the head (A, which needs 5): B and C could have been served,
    // but the large request at the head holds them back.
    for _ in 0..4 {
        drop(all.split(1).unwrap());
        assert_eq!(sem.available(), 0);
        assert_eq!(sem.waiters(), 3);
        assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    }
    drop(all); // the fifth completes A
    let (name, a_permit) = rx.recv().unwrap();
    assert_eq!(name, 'A');
    let mut a_permit = a_permit.unwrap();
    assert_eq!(a_permit.count(), 5);
    assert_eq!(sem.waiters(), 2);

    drop(a_permit.split(1).unwrap()); // B (1) is next
    let (name, b_permit) = rx.recv().unwrap();
    assert_eq!((name, b_permit.as_ref().unwrap().count()), ('B', 1));
    assert_eq!(sem.waiters(), 1);

    drop(a_permit.split(1).unwrap()); // C needs 2: one is assigned, it keeps waiting
    assert_eq!(sem.available(), 0);
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    drop(a_permit); // 3 more: C is granted, 2 become free
    let (name, c_permit) = rx.recv().unwrap();
    assert_eq!((name, c_permit.as_ref().unwrap().count()), ('C', 2));
    assert_eq!(sem.waiters(), 0);
    assert_eq!(sem.available(), 2);

    drop((b_permit, c_permit));
    assert_eq!(sem.available(), 5);
    for t in [a, b, c] {
        t.join().unwrap();
    }
}

#[test]
fn no_barging_while_anyone_waits() {
    let sem = Semaphore::new(4);
    let mut held = sem.try_acquire(3).unwrap();
    let (tx, rx) = mpsc::channel();
    // W wants 3: takes the 1 free permit and waits for 2 more.
    let w = spawn_acquire(&sem, 3, &tx, 'W');
    wait_for("W to queue", || sem.waiters() == 1);
    assert_eq!(sem.available(), 0);
    drop(held.split(1).unwrap());
    // Two permits are now held by nobody (both assigned to W), yet nobody may jump the queue.
    assert_eq!(sem.try_acquire(1).unwrap_err(), AcquireError::NoPermits);
    assert_eq!(sem.try_acquire(2).unwrap_err(), AcquireError::NoPermits);
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    // try_acquire(0) is not barging: it takes nothing.
    assert_eq!(sem.try_acquire(0).unwrap().count(), 0);
    drop(held.split(1).unwrap());
    let (_, permit) = rx.recv().unwrap();
    assert_eq!(permit.unwrap().count(), 3);
    drop(held);
    assert_eq!(sem.available(), 4);
    w.join().unwrap();
}

#[test]
fn too_many_is_immediate_and_zero_is_free() {
    let sem = Semaphore::new(2);
    assert_eq!(sem.try_acquire(3).unwrap_err(), AcquireError::TooMany);
    assert_eq!(sem.acquire(3).unwrap_err(), AcquireError::TooMany);
    assert_eq!(
        sem.acquire_timeout(3, Duration::from_secs(60)).unwrap_err(),
        AcquireError::TooMany
    );
    assert_eq!(
        block_on(sem.acquire_async(3)).unwrap_err(),
        AcquireError::TooMany
    );
    let (tx, rx) = mpsc::channel();
    sem.acquire_with(3, move |r| tx.send(r.map(|p| p.count())).unwrap());
    assert_eq!(rx.try_recv().unwrap(), Err(AcquireError::TooMany));

    // n == 0 succeeds at once, even with nothing free and a waiter queued.
    let held = sem.try_acquire(2).unwrap();
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire(2).map(|p| p.count()))
    };
    wait_for("the waiter to queue", || sem.waiters() == 1);
    assert_eq!(sem.acquire(0).unwrap().count(), 0);
    assert_eq!(sem.try_acquire(0).unwrap().count(), 0);
    assert_eq!(block_on(sem.acquire_async(0)).unwrap().count(), 0);
    drop(held);
    assert_eq!(waiter.join().unwrap(), Ok(2));

    // add_permits raises the capacity.
    sem.add_permits(1);
    assert_eq!(sem.try_acquire(3).unwrap().count(), 3);
}

#[test]
fn timeout_hands_a_partial_grant_to_the_next_thread() {
    let sem = Semaphore::new(5);
    let held = sem.try_acquire(4).unwrap();
    let (tx, rx) = mpsc::channel();
    // A wants 5 with a timeout: takes the free permit, waits.
    let a = {
        let (sem, tx) = (sem.clone(), tx.clone());
        thread::spawn(move || {
            tx.send(('A', sem.acquire_timeout(5, Duration::from_millis(300))))
                .unwrap()
        })
    };
    wait_for("A to queue", || sem.waiters() == 1);
    assert_eq!(
        sem.available(),
        0,
        "A holds the free permit as a partial grant"
    );
    // B wants 1 behind A.
    let b = spawn_acquire(&sem, 1, &tx, 'B');
    wait_for("B to queue", || sem.waiters() == 2);
    // A times out: its one permit goes to B.
    let mut results = vec![rx.recv().unwrap(), rx.recv().unwrap()];
    results.sort_by_key(|(name, _)| *name);
    assert_eq!(results[0].1.as_ref().unwrap_err(), &AcquireError::Timeout);
    assert_eq!(results[1].1.as_ref().unwrap().count(), 1);
    assert_eq!(sem.waiters(), 0);
    assert_eq!(sem.available(), 0);
    drop(results);
    drop(held);
    assert_eq!(sem.available(), 5);
    a.join().unwrap();
    b.join().unwrap();
}

#[test]
fn timeout_with_free_permits_succeeds_and_zero_timeout_fails_fast() {
    let sem = Semaphore::new(1);
    assert_eq!(
        sem.acquire_timeout(1, Duration::ZERO).unwrap().count(),
        1,
        "free permits are taken even with a zero timeout"
    );
    let _held = sem.try_acquire(1).unwrap();
    assert_eq!(
        sem.acquire_timeout(1, Duration::ZERO).unwrap_err(),
        AcquireError::Timeout
    );
    assert_eq!(sem.waiters(), 0);
}

#[test]
fn dropped_future_hands_its_permits_to_the_next_waiter() {
    let noop = Waker::from(Arc::new(CountingWaker::default()));
    let mut cx = Context::from_waker(&noop);

    // Dropped while queued with a partial grant: the permit goes to the next waiter.
    let sem = Semaphore::new(3);
    let held = sem.try_acquire(2).unwrap();
    let mut fut = Box::pin(sem.acquire_async(3));
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    assert_eq!(sem.available(), 0);
    let (tx, rx) = mpsc::channel();
    let b = spawn_acquire(&sem, 1, &tx, 'B');
    wait_for("B to queue", || sem.waiters() == 2);
    drop(fut);
    let (_, permit) = rx.recv().unwrap();
    assert_eq!(permit.unwrap().count(), 1);
    b.join().unwrap();
    drop(held);
    assert_eq!(sem.available(), 3);

    // Granted but never polled again: dropping it returns the granted permits.
    let counter = Arc::new(CountingWaker::default());
    let waker = Waker::from(counter.clone());
    let mut cx = Context::from_waker(&waker);
    let held = sem.try_acquire(3).unwrap();
    let mut fut = Box::pin(sem.acquire_async(2));
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    drop(held);
    assert_eq!(counter.0.load(Ordering::SeqCst), 1, "woken once on grant");
    assert_eq!(sem.available(), 1);
    drop(fut);
    assert_eq!(sem.available(), 3);
}

#[test]
fn future_re_polled_with_a_new_waker_wakes_the_new_one() {
    let sem = Semaphore::new(1);
    let held = sem.try_acquire(1).unwrap();
    let first = Arc::new(CountingWaker::default());
    let second = Arc::new(CountingWaker::default());
    let mut fut = Box::pin(sem.acquire_async(1));
    let w1 = Waker::from(first.clone());
    assert!(fut
        .as_mut()
        .poll(&mut Context::from_waker(&w1))
        .is_pending());
    let w2 = Waker::from(second.clone());
    assert!(fut
        .as_mut()
        .poll(&mut Context::from_waker(&w2))
        .is_pending());
    drop(held);
    assert_eq!(first.0.load(Ordering::SeqCst), 0);
    assert_eq!(second.0.load(Ordering::SeqCst), 1);
    match fut.as_mut().poll(&mut Context::from_waker(&w2)) {
        Poll::Ready(Ok(p)) => assert_eq!(p.count(), 1),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn async_acquire_under_a_hand_written_block_on() {
    let sem = Semaphore::new(2);
    let held = sem.try_acquire(2).unwrap();
    let releaser = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        drop(held);
    });
    let permit = block_on(sem.acquire_async(2)).unwrap();
    assert_eq!(permit.count(), 2);
    releaser.join().unwrap();
    drop(permit);
    assert_eq!(sem.available(), 2);

    // Several async waiters on separate threads, all served.
    let done: Vec<_> = (0..4)
        .map(|_| {
            let sem = sem.clone();
            thread::spawn(move || {
                for _ in 0..200 {
                    let p = block_on(sem.acquire_async(2)).unwrap();
                    assert_eq!(p.count(), 2);
                }
            })
        })
        .collect();
    for t in done {
        t.join().unwrap();
    }
    assert_eq!(sem.available(), 2);
}

#[test]
fn close_wakes_every_waiter_with_closed() {
    let sem = Semaphore::new(4);
    let held = sem.try_acquire(3).unwrap();
    let (tx, rx) = mpsc::channel();
    let t1 = spawn_acquire(&sem, 3, &tx, '1'); // gets the free permit as a partial grant
    wait_for("thread 1 to queue", || sem.waiters() == 1);
    let t2 = spawn_acquire(&sem, 1, &tx, '2');
    wait_for("thread 2 to queue", || sem.waiters() == 2);
    let t3 = {
        let (sem, tx) = (sem.clone(), tx.clone());
        thread::spawn(move || {
            tx.send(('3', sem.acquire_timeout(2, Duration::from_secs(60))))
                .unwrap()
        })
    };
    wait_for("thread 3 to queue", || sem.waiters() == 3);
    let counter = Arc::new(CountingWaker::default());
    let waker = Waker::from(counter.clone());
    let mut fut = Box::pin(sem.acquire_async(1));
    assert!(fut
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    let (ctx, crx) = mpsc::channel();
    sem.acquire_with(2, move |r| ctx.send(r.map(|p| p.count())).unwrap());
    assert_eq!(sem.waiters(), 5);

    sem.close();
    assert!(sem.is_closed());
    for _ in 0..3 {
        let (_, r) = rx.recv().unwrap();
        assert_eq!(r.unwrap_err(), AcquireError::Closed);
    }
    assert_eq!(crx.try_recv().unwrap(), Err(AcquireError::Closed));
    assert_eq!(counter.0.load(Ordering::SeqCst), 1);
    match fut.as_mut().poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(r) => assert_eq!(r.unwrap_err(), AcquireError::Closed),
        Poll::Pending => panic!("closed future still pending"),
    }
    assert_eq!(sem.waiters(), 0);
    // The partial grant of thread 1 became free again; held permits still come back.
    assert_eq!(sem.available(), 1);
    drop(held);
    assert_eq!(sem.available(), 4);
    // Every later acquire fails.
    assert_eq!(sem.try_acquire(1).unwrap_err(), AcquireError::Closed);
    assert_eq!(sem.acquire(1).unwrap_err(), AcquireError::Closed);
    assert_eq!(
        block_on(sem.acquire_async(1)).unwrap_err(),
        AcquireError::Closed
    );
    for t in [t1, t2, t3] {
        t.join().unwrap();
    }
}

#[test]
fn acquire_with_grants_callbacks_once_in_fifo_order() {
    let sem = Semaphore::new(2);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let record = |tag: &'static str| {
        let calls = calls.clone();
        move |r: Result<Permit, AcquireError>| {
            calls
                .lock()
                .unwrap()
                .push((tag, r.as_ref().map(Permit::count).map_err(|e| *e)));
            drop(r); // releases the permits at once
        }
    };
    // Available: runs at once, in the caller.
    sem.acquire_with(2, record("now"));
    assert_eq!(*calls.lock().unwrap(), [("now", Ok(2))]);
    assert_eq!(sem.available(), 2);

    // Not available: runs once, on the releasing thread, in FIFO order.
    let held = sem.try_acquire(2).unwrap();
    sem.acquire_with(2, record("later-2"));
    sem.acquire_with(1, record("later-1"));
    assert_eq!(calls.lock().unwrap().len(), 1);
    let releaser = thread::spawn(move || drop(held));
    releaser.join().unwrap();
    assert_eq!(
        *calls.lock().unwrap(),
        [("now", Ok(2)), ("later-2", Ok(2)), ("later-1", Ok(1))]
    );
    assert_eq!(sem.available(), 2);

    // A callback that keeps its permit until another releases it.
    let kept = Arc::new(Mutex::new(None));
    let held = sem.try_acquire(2).unwrap();
    {
        let kept = kept.clone();
        sem.acquire_with(1, move |r| *kept.lock().unwrap() = Some(r.unwrap()));
    }
    drop(held);
    assert_eq!(kept.lock().unwrap().as_ref().unwrap().count(), 1);
    assert_eq!(sem.available(), 1);
    drop(kept.lock().unwrap().take());
    assert_eq!(sem.available(), 2);
}

#[test]
fn a_long_chain_of_callbacks_does_not_grow_the_stack() {
    // Each callback drops its permit, which grants the next: a naive implementation would
    // recurse 100 000 frames deep.
    let sem = Semaphore::new(1);
    let held = sem.try_acquire(1).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..100_000 {
        let ran = ran.clone();
        sem.acquire_with(1, move |r| {
            r.unwrap();
            ran.fetch_add(1, Ordering::Relaxed);
        });
    }
    drop(held);
    assert_eq!(ran.load(Ordering::Relaxed), 100_000);
    assert_eq!(sem.available(), 1);
    assert_eq!(sem.waiters(), 0);
}

#[test]
fn a_panicking_callback_does_not_stop_the_others() {
    let sem = Semaphore::new(1);
    let held = sem.try_acquire(1).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    sem.acquire_with(1, |_| panic!("callback panics"));
    {
        let ran = ran.clone();
        sem.acquire_with(1, move |r| {
            r.unwrap();
            ran.fetch_add(1, Ordering::SeqCst);
        });
    }
    let r = thread::spawn(move || drop(held)).join();
    assert!(r.is_err(), "the panic reaches the releasing thread");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(sem.available(), 1);
}

#[test]
fn forget_shrinks_the_capacity_and_fails_requests_that_no_longer_fit() {
    let sem = Semaphore::new(4);
    let mut p = sem.try_acquire(4).unwrap();
    let q = p.split(2).unwrap();
    let (tx, rx) = mpsc::channel();
    let w = spawn_acquire(&sem, 4, &tx, 'W');
    wait_for("W to queue", || sem.waiters() == 1);
    drop(p.split(1).unwrap()); // assigned to W (1 of 4)
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    // A callback waiter that still fits after the forget, behind W.
    let (ctx, crx) = mpsc::channel();
    sem.acquire_with(2, move |r| ctx.send(r.map(|p| p.count())).unwrap());
    assert_eq!(sem.waiters(), 2);

    q.forget(); // capacity 4 -> 2: W (4) can never be granted
    let (_, r) = rx.recv().unwrap();
    assert_eq!(r.unwrap_err(), AcquireError::TooMany);
    // W's assigned permit went to the next waiter (which needs 2: one more to come).
    assert_eq!(sem.waiters(), 1);
    assert_eq!(crx.try_recv().unwrap_err(), TryRecvError::Empty);
    assert_eq!(sem.try_acquire(3).unwrap_err(), AcquireError::TooMany);
    assert_eq!(sem.acquire(3).unwrap_err(), AcquireError::TooMany);
    drop(p); // the last held permit completes the callback waiter
    assert_eq!(crx.try_recv().unwrap(), Ok(2));
    assert_eq!(sem.available(), 2);
    assert_eq!(sem.waiters(), 0);
    sem.add_permits(2);
    assert_eq!(sem.try_acquire(4).unwrap().count(), 4);
    w.join().unwrap();

    // Forgetting an empty permit changes nothing.
    sem.try_acquire(0).unwrap().forget();
    assert_eq!(sem.try_acquire(4).unwrap().count(), 4);
}

#[test]
fn split_keeps_the_total() {
    let sem = Semaphore::new(4);
    let mut p = sem.try_acquire(4).unwrap();
    assert!(p.split(5).is_none());
    assert_eq!(p.count(), 4);
    let q = p.split(1).unwrap();
    assert_eq!((p.count(), q.count()), (3, 1));
    drop(q);
    assert_eq!(sem.available(), 1);
    let r = p.split(3).unwrap();
    assert_eq!(p.count(), 0);
    drop(p); // empty: returns nothing
    assert_eq!(sem.available(), 1);
    drop(r);
    assert_eq!(sem.available(), 4);
}

#[test]
fn add_permits_serves_waiters_first() {
    let sem = Semaphore::new(0);
    // Capacity 0: any request is TooMany until permits are added.
    assert_eq!(sem.try_acquire(1).unwrap_err(), AcquireError::TooMany);
    sem.add_permits(1);
    let held = sem.try_acquire(1).unwrap();
    let (tx, rx) = mpsc::channel();
    sem.add_permits(2); // capacity 3, 2 free
    let w = spawn_acquire(&sem, 3, &tx, 'W');
    wait_for("W to queue", || sem.waiters() == 1);
    drop(held);
    assert_eq!(rx.recv().unwrap().1.unwrap().count(), 3);
    w.join().unwrap();
    assert_eq!(sem.available(), 3);
}

#[test]
fn permits_and_semaphores_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Semaphore>();
    send_sync::<Permit>();
    send::<keyserial::Acquire>();
    let e: Box<dyn std::error::Error + Send + Sync> = Box::new(AcquireError::Timeout);
    assert_eq!(e.to_string(), "timed out waiting for permits");
}

/// Tiny deterministic generator (no `rand`).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn stress_mixed_acquire_kinds_never_exceed_the_permits() {
    const PERMITS: usize = 4;
    let sem = Semaphore::new(PERMITS);
    let held = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (sem, held, granted) = (sem.clone(), held.clone(), granted.clone());
            thread::spawn(move || {
                let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
                for i in 0..1000 {
                    let n = 1 + (rng.next() % 3) as usize;
                    // Mostly blocking acquires; some of every other kind to stress cancellation.
                    let permit = match rng.next() % 8 {
                        0 => match sem.acquire_timeout(n, Duration::from_micros(50)) {
                            Ok(p) => p,
                            Err(AcquireError::Timeout) => continue,
                            Err(e) => panic!("{e}"),
                        },
                        1 => match sem.try_acquire(n) {
                            Ok(p) => p,
                            Err(AcquireError::NoPermits) => continue,
                            Err(e) => panic!("{e}"),
                        },
                        2 => block_on(sem.acquire_async(n)).unwrap(),
                        3 => {
                            // Start an async acquire, poll it once, and abandon it.
                            let w = Waker::from(Arc::new(CountingWaker::default()));
                            let mut fut = Box::pin(sem.acquire_async(n));
                            if let Poll::Ready(Ok(p)) =
                                fut.as_mut().poll(&mut Context::from_waker(&w))
                            {
                                drop(p);
                            }
                            continue;
                        }
                        _ => sem.acquire(n).unwrap(),
                    };
                    assert_eq!(permit.count(), n);
                    let now = held.fetch_add(n, Ordering::SeqCst) + n;
                    assert!(now <= PERMITS, "{now} permits held at once");
                    if i % 16 == 0 {
                        thread::yield_now();
                    }
                    held.fetch_sub(n, Ordering::SeqCst);
                    granted.fetch_add(1, Ordering::Relaxed);
                    drop(permit);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(granted.load(Ordering::Relaxed) > 0);
    assert_eq!(sem.waiters(), 0);
    assert_eq!(sem.available(), PERMITS);
}
