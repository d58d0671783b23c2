//! Order and exclusivity per key, parallelism across keys, nothing lost.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyserial::{Builder, Serializer};

mod common;
use common::wait_until;

/// Per key: the next expected sequence number and a "running" flag. A task checks that it is the
/// next one of its key and that no other task of its key is running.
struct Checker {
    next: Vec<AtomicU64>,
    running: Vec<AtomicBool>,
    violations: AtomicUsize,
    ran: AtomicUsize,
}

impl Checker {
    fn new(keys: usize) -> Arc<Self> {
        Arc::new(Checker {
            next: (0..keys).map(|_| AtomicU64::new(0)).collect(),
            running: (0..keys).map(|_| AtomicBool::new(false)).collect(),
            violations: AtomicUsize::new(0),
            ran: AtomicUsize::new(0),
        })
    }

    fn task(self: &Arc<Self>, key: usize, seq: u64) -> impl FnOnce() + Send + 'static {
        let c = self.clone();
        move || {
            if c.running[key].swap(true, Ordering::AcqRel) {
                c.violations.fetch_add(1, Ordering::Relaxed);
            }
            if c.next[key].load(Ordering::Acquire) != seq {
                c.violations.fetch_add(1, Ordering::Relaxed);
            }
            c.next[key].store(seq + 1, Ordering::Release);
            c.running[key].store(false, Ordering::Release);
            c.ran.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[test]
fn four_producers_200k_tasks_10k_keys_in_order_nothing_lost() {
    const PRODUCERS: usize = 4;
    const PER_PRODUCER: usize = 200_000;
    const KEYS: usize = 10_000;
    let s = Arc::new(Builder::<usize>::new().workers(2).build().unwrap());
    let checker = Checker::new(KEYS);
    // Each producer owns the keys congruent to its index, so per-key submission order is known.
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let s = s.clone();
            let checker = checker.clone();
            std::thread::spawn(move || {
                let mut seq = vec![0u64; KEYS];
                let mut x = 0x9E37_79B9u64 ^ p as u64;
                for _ in 0..PER_PRODUCER {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = (x as usize % (KEYS / PRODUCERS)) * PRODUCERS + p;
                    let t = checker.task(key, seq[key]);
                    seq[key] += 1;
                    s.execute(key, t).unwrap();
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    let total = PRODUCERS * PER_PRODUCER;
    assert!(wait_until(Duration::from_secs(60), || checker
        .ran
        .load(Ordering::Relaxed)
        == total));
    assert_eq!(checker.violations.load(Ordering::Relaxed), 0);
    assert_eq!(s.stats().completed, total as u64);
    s.shutdown();
    assert!(s.await_termination(Duration::from_secs(10)));
}

#[test]
fn submit_handles_return_values_in_order() {
    let s: Serializer<&str> = Builder::new().workers(2).build().unwrap();
    let handles: Vec<_> = (0..1000)
        .map(|i| s.submit("k", move || i).unwrap())
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), i);
    }
}

#[test]
fn a_blocked_key_does_not_stop_other_keys() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let blocked = s.submit(1, move || rx.recv().unwrap()).unwrap();
    let behind = s.submit(1, || "after").unwrap();
    let others: Vec<_> = (2..200).map(|k| s.submit(k, move || k).unwrap()).collect();
    for (i, h) in others.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), i as u32 + 2);
    }
    assert!(!behind.is_finished());
    tx.send(()).unwrap();
    blocked.join().unwrap();
    assert_eq!(behind.join().unwrap(), "after");
}

/// Chains queued on a worker that then blocks must not wait for that task while the other worker
/// stays busy: at its periodic check the busy worker sees that the sibling started no task since
/// the previous check and takes its deque (worker.rs, "Finding work"). Key 2 keeps one worker busy for good with a chain that re-submits itself; key 1's
/// task, on the other worker, queues 50 keys on its own worker's deque and then blocks until they
/// have run.
#[test]
fn chains_behind_a_blocked_task_move_to_a_busy_sibling() {
    let s = Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    fn spin_and_resubmit(s: Arc<Serializer<u32>>, stop: Arc<AtomicBool>) {
        let until = Instant::now() + Duration::from_micros(20);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        if !stop.load(Ordering::Relaxed) {
            let again = s.clone();
            s.execute(2, move || spin_and_resubmit(again, stop))
                .unwrap();
        }
    }
    {
        let (s2, stop2) = (s.clone(), stop.clone());
        s.execute(2, move || spin_and_resubmit(s2, stop2)).unwrap();
    }
    assert!(wait_until(Duration::from_secs(5), || s.stats().running == 1));
    let ran = Arc::new(AtomicUsize::new(0));
    let (s1, ran1) = (s.clone(), ran.clone());
    let blocked = s
        .submit(1, move || {
            for k in 100..150 {
                let ran = ran1.clone();
                s1.execute(k, move || {
                    ran.fetch_add(1, Ordering::Relaxed);
                })
                .unwrap();
            }
            // Blocks this worker until the 50 keys have run elsewhere (or gives up).
            wait_until(Duration::from_secs(10), || {
                ran1.load(Ordering::Relaxed) == 50
            });
            ran1.load(Ordering::Relaxed)
        })
        .unwrap();
    let ran_meanwhile = blocked.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    assert_eq!(
        ran_meanwhile, 50,
        "chains that ran while their worker was blocked"
    );
    assert!(wait_until(Duration::from_secs(5), || ran
        .load(Ordering::Relaxed)
        == 50));
}

#[test]
fn blocked_worker_with_elastic_pool_starts_an_extra_worker() {
    let s = Builder::<u32>::new()
        .workers(1)
        .max_workers(4)
        .worker_keep_alive(Duration::from_millis(200))
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let blocked = s.submit(1, move || rx.recv().unwrap()).unwrap();
    assert!(wait_until(Duration::from_secs(5), || s.stats().running == 1));
    let other = s.submit(2, || 2).unwrap();
    assert_eq!(
        other.join().unwrap(),
        2,
        "key 2 must run while key 1 blocks the only core worker"
    );
    assert!(s.stats().workers >= 2);
    tx.send(()).unwrap();
    blocked.join().unwrap();
    // The extra worker exits after its keep-alive.
    assert!(wait_until(Duration::from_secs(5), || s.stats().workers == 1));
}

#[test]
fn unkeyed_spawn_runs_in_parallel() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let a = {
        let b = barrier.clone();
        s.spawn(move || b.wait()).unwrap()
    };
    let b = {
        let b = barrier.clone();
        s.spawn(move || b.wait()).unwrap()
    };
    a.join().unwrap();
    b.join().unwrap();
}
