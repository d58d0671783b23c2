//! The distinct job queue: uniqueness, order, failure restores positions, close, many threads.

use std::collections::HashSet;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use keyserial::DistinctQueue;

#[test]
fn unique_across_queued_and_in_progress() {
    let q = DistinctQueue::new();
    assert!(q.add(1));
    assert!(!q.add(1), "queued");
    let b = q.take(1).unwrap();
    assert!(!q.add(1), "in progress");
    assert_eq!(q.in_progress(), vec![1]);
    b.complete();
    assert!(q.add(1), "completed items may come again");
}

#[test]
fn take_returns_the_oldest_in_order_and_fail_restores_positions() {
    let q = DistinctQueue::new();
    q.add_all(1..=5);
    let a = q.take(2).unwrap();
    assert_eq!(&*a, [1, 2]);
    let b = q.take(0).unwrap(); // 0 counts as 1
    assert_eq!(&*b, [3]);
    q.add_all([6, 7]);
    a.fail();
    assert_eq!(
        q.queued(),
        vec![1, 2, 4, 5, 6, 7],
        "back where they were, ahead of 6 and 7"
    );
    b.fail();
    assert_eq!(q.queued(), vec![1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(q.len(), 7);
}

#[test]
fn a_batch_dropped_while_panicking_goes_back() {
    let q = DistinctQueue::new();
    q.add_all(["a", "b"]);
    let q2 = q.clone();
    let r = thread::spawn(move || {
        let _batch = q2.take(1).unwrap();
        panic!("worker crashed");
    })
    .join();
    assert!(r.is_err());
    assert_eq!(q.queued(), vec!["a", "b"]);
    assert!(q.in_progress().is_empty());
}

#[test]
fn close_wakes_takers_and_drains() {
    let q: DistinctQueue<u32> = DistinctQueue::new();
    let q2 = q.clone();
    let blocked = thread::spawn(move || q2.take(1).map(|b| b.to_vec()));
    thread::sleep(Duration::from_millis(20));
    q.close();
    assert_eq!(blocked.join().unwrap(), None);
    assert!(!q.add(1));
    let q = DistinctQueue::new();
    q.add_all([1, 2]);
    q.close();
    let b = q.take(5).unwrap();
    assert_eq!(&*b, [1, 2]);
    b.fail();
    assert_eq!(
        q.take(5).unwrap().to_vec(),
        vec![1, 2],
        "failed work returns after close too"
    );
}

#[test]
fn take_timeout_and_take_async() {
    let q = DistinctQueue::new();
    assert!(q.take_timeout(1, Duration::from_millis(5)).is_none());
    let mut cx = Context::from_waker(Waker::noop());
    let mut fut = pin!(q.take_async(3));
    assert!(fut.as_mut().poll(&mut cx).is_pending());
    q.add_all([9, 8]);
    let Poll::Ready(Some(b)) = fut.as_mut().poll(&mut cx) else {
        panic!("ready after add")
    };
    assert_eq!(&*b, [9, 8]);
}

#[test]
fn four_producers_four_consumers_random_failures_each_item_completed_once() {
    const PER_PRODUCER: u64 = 5_000;
    let q = DistinctQueue::new();
    let completed = Arc::new(Mutex::new(Vec::new()));
    let producers: Vec<_> = (0..4u64)
        .map(|p| {
            let q = q.clone();
            thread::spawn(move || {
                for i in 0..PER_PRODUCER {
                    // Each item is offered twice: the second is a duplicate unless the first
                    // already completed, in which case it is a new job of the same name.
                    q.add(p * PER_PRODUCER + i);
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..4u64)
        .map(|c| {
            let (q, completed) = (q.clone(), completed.clone());
            thread::spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ c;
                while let Some(batch) = q.take(1 + (x % 8) as usize) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if x.is_multiple_of(5) {
                        batch.fail(); // 20% of batches fail and come back
                    } else {
                        completed.lock().unwrap().extend(batch.iter().copied());
                        batch.complete();
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    // Wait until everything is done, then close so the consumers stop.
    while !(q.is_empty() && q.in_progress().is_empty()) {
        thread::sleep(Duration::from_millis(1));
    }
    q.close();
    for c in consumers {
        c.join().unwrap();
    }
    let done = completed.lock().unwrap();
    let unique: HashSet<u64> = done.iter().copied().collect();
    assert_eq!(done.len(), unique.len(), "no item completed twice");
    assert_eq!(unique.len() as u64, 4 * PER_PRODUCER, "no item lost");
}

// ---- More of the contract: wakeups, async, close details, a stress test with overlapping items.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::task::Wake;
use std::time::Instant;

struct ThreadWaker(thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A minimal executor: polls on this thread, parking between polls.
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

#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl CountingWaker {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn add_all_returns_the_rejected_items_in_order() {
    let q = DistinctQueue::new();
    assert!(q.add("x"));
    let b = q.take(1).unwrap(); // "x" in progress
    assert_eq!(q.add_all(["a", "x", "b", "a", "c"]), vec!["x", "a"]);
    assert_eq!(q.queued(), vec!["a", "b", "c"]);
    assert_eq!(q.in_progress(), vec!["x"]);
    assert_eq!(q.len(), 3);
    assert!(!q.is_empty());
    b.complete();
    q.close();
    assert_eq!(q.add_all(["d", "e"]), vec!["d", "e"]);
}

#[test]
fn failed_batches_keep_their_relative_order_with_other_batches() {
    let q = DistinctQueue::new();
    q.add_all(0..10);
    let a = q.take(3).unwrap(); // 0 1 2
    let b = q.take(3).unwrap(); // 3 4 5
    let c = q.take(3).unwrap(); // 6 7 8
    assert_eq!(q.in_progress(), (0..9).collect::<Vec<_>>());
    q.add(10);
    b.complete();
    c.fail();
    a.fail();
    assert_eq!(q.queued(), vec![0, 1, 2, 6, 7, 8, 9, 10]);
    // Completed items may come back, at the back.
    assert!(q.add(4));
    assert_eq!(q.queued(), vec![0, 1, 2, 6, 7, 8, 9, 10, 4]);
    assert_eq!(&*q.try_take(100).unwrap(), [0, 1, 2, 6, 7, 8, 9, 10, 4]);
}

#[test]
fn take_timeout_gets_an_item_added_while_it_waits() {
    let q = DistinctQueue::new();
    let taker = {
        let q = q.clone();
        thread::spawn(move || {
            q.take_timeout(4, Duration::from_secs(30))
                .map(|b| b.to_vec())
        })
    };
    thread::sleep(Duration::from_millis(10));
    q.add(7);
    assert_eq!(taker.join().unwrap(), Some(vec![7]));
    assert_eq!(
        q.in_progress(),
        Vec::<i32>::new(),
        "the dropped batch went back"
    );
    assert_eq!(q.queued(), vec![7]);
    // An expired wait leaves nothing behind: the next add is taken by the next taker.
    assert!(q.take(1).is_some());
    let empty: DistinctQueue<u8> = DistinctQueue::new();
    let start = Instant::now();
    assert!(empty.take_timeout(1, Duration::from_millis(20)).is_none());
    assert!(start.elapsed() >= Duration::from_millis(20));
}

#[test]
fn blocked_takers_are_all_woken_by_enough_items() {
    let q = DistinctQueue::new();
    let (tx, rx) = mpsc::channel();
    let takers: Vec<_> = (0..3)
        .map(|_| {
            let (q, tx) = (q.clone(), tx.clone());
            thread::spawn(move || {
                let b = q.take(1).unwrap();
                tx.send(b[0]).unwrap();
                b.complete();
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(20)); // let them block (not needed for correctness)
    assert!(q.add_all([1, 2, 3]).is_empty());
    let mut got: Vec<i32> = (0..3).map(|_| rx.recv().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, [1, 2, 3]);
    for t in takers {
        t.join().unwrap();
    }
}

#[test]
fn take_async_under_a_hand_written_block_on() {
    let q = DistinctQueue::new();
    let producer = {
        let q = q.clone();
        thread::spawn(move || {
            for i in 0..100 {
                q.add(i);
                if i % 10 == 0 {
                    thread::sleep(Duration::from_millis(1));
                }
            }
            q.close();
        })
    };
    let mut seen = Vec::new();
    while let Some(b) = block_on(q.take_async(7)) {
        assert!(b.len() <= 7);
        seen.extend(b.iter().copied());
        b.complete();
    }
    producer.join().unwrap();
    assert_eq!(seen, (0..100).collect::<Vec<_>>());
}

#[test]
fn a_dropped_take_future_passes_its_wakeup_on() {
    let q = DistinctQueue::new();
    let (wa, wb) = (
        Arc::new(CountingWaker::default()),
        Arc::new(CountingWaker::default()),
    );
    let (ka, kb) = (Waker::from(wa.clone()), Waker::from(wb.clone()));
    let mut a = Box::pin(q.take_async(1));
    let mut b = Box::pin(q.take_async(1));
    assert!(a.as_mut().poll(&mut Context::from_waker(&ka)).is_pending());
    assert!(b.as_mut().poll(&mut Context::from_waker(&kb)).is_pending());
    q.add(1);
    assert_eq!(
        (wa.count(), wb.count()),
        (1, 0),
        "one item wakes one taker, the oldest"
    );
    drop(a); // woken but never polled: the wakeup must reach b
    assert_eq!(wb.count(), 1);
    match b.as_mut().poll(&mut Context::from_waker(&kb)) {
        Poll::Ready(Some(batch)) => {
            assert_eq!(&*batch, [1]);
            batch.complete();
        }
        _ => panic!("b should get the item"),
    }
    // A future dropped while still registered consumes nothing.
    let mut c = Box::pin(q.take_async(1));
    let wc = Arc::new(CountingWaker::default());
    let kc = Waker::from(wc.clone());
    assert!(c.as_mut().poll(&mut Context::from_waker(&kc)).is_pending());
    drop(c);
    assert!(q.add(2));
    assert_eq!(wc.count(), 0);
    assert_eq!(q.queued(), vec![2]);
}

#[test]
fn a_take_that_leaves_items_passes_the_wakeup_on() {
    // One add_all of two items wakes both waiting takers; even if one of them took both, the
    // other would simply register again. Here each takes one.
    let q = DistinctQueue::new();
    let (wa, wb) = (
        Arc::new(CountingWaker::default()),
        Arc::new(CountingWaker::default()),
    );
    let (ka, kb) = (Waker::from(wa.clone()), Waker::from(wb.clone()));
    let mut a = Box::pin(q.take_async(1));
    let mut b = Box::pin(q.take_async(1));
    assert!(a.as_mut().poll(&mut Context::from_waker(&ka)).is_pending());
    assert!(b.as_mut().poll(&mut Context::from_waker(&kb)).is_pending());
    // A barging try_take between the add and the woken taker leaves one item: still delivered.
    q.add(1);
    q.add(2);
    assert_eq!((wa.count(), wb.count()), (1, 1));
    let stolen = q.try_take(1).unwrap();
    assert_eq!(&*stolen, [1]);
    let Poll::Ready(Some(x)) = a.as_mut().poll(&mut Context::from_waker(&ka)) else {
        panic!("a gets the remaining item")
    };
    assert_eq!(&*x, [2]);
    // b finds nothing and waits again, keeping its place; the next item wakes it.
    assert!(b.as_mut().poll(&mut Context::from_waker(&kb)).is_pending());
    q.add(3);
    assert_eq!(wb.count(), 2);
    let Poll::Ready(Some(y)) = b.as_mut().poll(&mut Context::from_waker(&kb)) else {
        panic!("b gets the next item")
    };
    assert_eq!(&*y, [3]);
    drop((stolen, x, y));
}

#[test]
fn close_resolves_waiting_futures_and_leaves_in_progress_batches_usable() {
    let q: DistinctQueue<u8> = DistinctQueue::new();
    let w = Arc::new(CountingWaker::default());
    let k = Waker::from(w.clone());
    let mut fut = Box::pin(q.take_async(1));
    assert!(fut.as_mut().poll(&mut Context::from_waker(&k)).is_pending());
    q.close();
    assert_eq!(w.count(), 1);
    assert!(matches!(
        fut.as_mut().poll(&mut Context::from_waker(&k)),
        Poll::Ready(None)
    ));

    let q = DistinctQueue::new();
    q.add_all([1, 2, 3]);
    let b = q.take(2).unwrap();
    q.close();
    assert!(!q.add(9));
    assert!(!q.add(1), "closed (and in progress)");
    let rest = q.take(5).unwrap();
    assert_eq!(&*rest, [3]);
    rest.complete();
    // Closed and nothing queued: None, even though a batch is in progress.
    assert!(q.take(1).is_none());
    assert!(q.try_take(1).is_none());
    assert!(block_on(q.take_async(1)).is_none());
    b.fail();
    assert_eq!(
        &*q.take(5).unwrap(),
        [1, 2],
        "failed after close: back, and takeable"
    );
}

#[test]
fn queues_and_batches_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<DistinctQueue<String>>();
    send::<keyserial::Batch<String>>();
    send::<keyserial::Take<String>>();
    let q: DistinctQueue<String> = Default::default();
    assert!(q.add("a".to_string()));
    assert!(format!("{q:?}").contains("queued: 1"));
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Producers add from an overlapping key space (so duplicates and re-adds of completed items
/// happen all the time); consumers take with every kind of take, fail batches at random, and
/// check that no item is ever held by two of them at once. At the end every accepted add was
/// completed exactly once.
#[test]
fn stress_overlapping_items_every_accepted_add_completed_exactly_once() {
    const KEYS: u64 = 300;
    const ADDS_PER_PRODUCER: usize = 5_000;
    let q: DistinctQueue<u64> = DistinctQueue::new();
    let accepted = Arc::new(Mutex::new(HashMap::<u64, usize>::new()));
    let completed = Arc::new(Mutex::new(HashMap::<u64, usize>::new()));
    let holding = Arc::new(Mutex::new(HashSet::<u64>::new()));
    let accepted_total = Arc::new(AtomicUsize::new(0));
    let completed_total = Arc::new(AtomicUsize::new(0));
    let producers_done = Arc::new(AtomicBool::new(false));

    let maybe_close = {
        let (q, accepted_total, completed_total, producers_done) = (
            q.clone(),
            accepted_total.clone(),
            completed_total.clone(),
            producers_done.clone(),
        );
        move || {
            if producers_done.load(Ordering::SeqCst)
                && completed_total.load(Ordering::SeqCst) == accepted_total.load(Ordering::SeqCst)
            {
                q.close();
            }
        }
    };

    let producers: Vec<_> = (0..4u64)
        .map(|p| {
            let (q, accepted, accepted_total) =
                (q.clone(), accepted.clone(), accepted_total.clone());
            thread::spawn(move || {
                let mut rng = XorShift(0x1234_5678_9ABC_DEF1 ^ ((p + 1) * 7919));
                for i in 0..ADDS_PER_PRODUCER {
                    let item = rng.next() % KEYS;
                    // Count before adding: a consumer may complete it at once.
                    let mut acc = accepted.lock().unwrap();
                    if q.add(item) {
                        *acc.entry(item).or_default() += 1;
                        accepted_total.fetch_add(1, Ordering::SeqCst);
                    }
                    drop(acc);
                    if i % 64 == 0 {
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();

    let consumers: Vec<_> = (0..4u64)
        .map(|c| {
            let (q, completed, holding, completed_total, maybe_close) = (
                q.clone(),
                completed.clone(),
                holding.clone(),
                completed_total.clone(),
                maybe_close.clone(),
            );
            thread::spawn(move || {
                let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (c + 1));
                loop {
                    let max = 1 + (rng.next() % 5) as usize;
                    let batch = match rng.next() % 4 {
                        0 => block_on(q.take_async(max)),
                        // Timed out (or closed and empty): fall back to a blocking take.
                        1 => q
                            .take_timeout(max, Duration::from_millis(1))
                            .or_else(|| q.take(max)),
                        2 => q.try_take(max).or_else(|| q.take(max)),
                        _ => q.take(max),
                    };
                    let Some(batch) = batch else { break };
                    assert!(!batch.is_empty() && batch.len() <= max);
                    {
                        let mut h = holding.lock().unwrap();
                        for item in batch.iter() {
                            assert!(h.insert(*item), "item {item} held twice at once");
                        }
                    }
                    let fail = rng.next().is_multiple_of(5);
                    {
                        let mut h = holding.lock().unwrap();
                        for item in batch.iter() {
                            h.remove(item);
                        }
                    }
                    if fail {
                        batch.fail();
                    } else {
                        let n = batch.len();
                        {
                            let mut done = completed.lock().unwrap();
                            for item in batch.iter() {
                                *done.entry(*item).or_default() += 1;
                            }
                        }
                        batch.complete();
                        completed_total.fetch_add(n, Ordering::SeqCst);
                        maybe_close();
                    }
                }
            })
        })
        .collect();

    for p in producers {
        p.join().unwrap();
    }
    producers_done.store(true, Ordering::SeqCst);
    maybe_close();
    for c in consumers {
        c.join().unwrap();
    }
    let accepted = accepted.lock().unwrap();
    let completed = completed.lock().unwrap();
    assert!(accepted_total.load(Ordering::SeqCst) > KEYS as usize);
    assert_eq!(
        *accepted, *completed,
        "every accepted add completed exactly once"
    );
    assert!(q.is_empty());
    assert!(q.in_progress().is_empty());
}
