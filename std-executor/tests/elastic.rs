//! The elastic pool grows whenever ready work waits while every worker is busy or blocked,
//! whatever the timing of the submits (issue 13: growth used to depend on a submit arriving
//! after the block).
//!
//! Each scenario runs many trials, half of them beside CPU hogs (one spinning thread per core),
//! because the failures were timing-dependent.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use keyserial::{Builder, Serializer};

/// How long a trial may take to see the growth (the promise is ~10 ms; CI machines are slow).
const DEADLINE: Duration = Duration::from_secs(5);

/// A latch that blocking tasks wait on.
#[derive(Default)]
struct Latch {
    open: Mutex<bool>,
    cond: Condvar,
}

impl Latch {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cond.wait(open).unwrap();
        }
    }
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cond.notify_all();
    }
}

/// Opens the latch when dropped, so a failed trial unblocks its tasks and the serializer's
/// drop can join its workers (the failure is reported instead of hanging).
struct OpenOnDrop(Arc<Latch>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// Spinning threads that keep every core busy while alive.
struct Hog {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Hog {
    fn start() -> Hog {
        let stop = Arc::new(AtomicBool::new(false));
        let n = thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                        std::hint::black_box(x);
                    }
                })
            })
            .collect();
        Hog { stop, threads }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }
}

fn elastic() -> Serializer<u32> {
    Builder::new()
        .workers(1)
        .max_workers(3)
        .worker_keep_alive(Duration::from_millis(100))
        .build()
        .unwrap()
}

/// Waits until `cond` holds or the deadline passes; returns how long it took.
fn within(what: &str, trial: usize, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < DEADLINE,
            "trial {trial}: {what} did not happen within {DEADLINE:?}"
        );
        thread::sleep(Duration::from_micros(200));
    }
    start.elapsed()
}

/// Runs `trial` `n` times, the second half beside CPU hogs; returns the slowest growth seen.
fn trials(n: usize, mut trial: impl FnMut(usize) -> Duration) -> Duration {
    let mut slowest = Duration::ZERO;
    for i in 0..n / 2 {
        slowest = slowest.max(trial(i));
    }
    let hog = Hog::start();
    for i in n / 2..n {
        slowest = slowest.max(trial(i));
    }
    drop(hog);
    slowest
}

#[test]
fn a_burst_of_blocking_tasks_grows_the_pool() {
    // The scenario: six keys, each task blocks; all six submitted at once, typically
    // while the only worker is still waking or searching.
    let slowest = trials(200, |trial| {
        let s = elastic();
        let latch = Arc::new(Latch::default());
        let _open = OpenOnDrop(latch.clone());
        let started = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..6)
            .map(|k| {
                let (latch, started) = (latch.clone(), started.clone());
                s.submit(k, move || {
                    started.fetch_add(1, Ordering::SeqCst);
                    latch.wait();
                })
                .unwrap()
            })
            .collect();
        let took = within("growth to 2 workers", trial, || s.stats().workers >= 2);
        within("a second blocking task starting", trial, || {
            started.load(Ordering::SeqCst) >= 2
        });
        latch.open();
        for h in handles {
            h.join().unwrap();
        }
        took
    });
    eprintln!("slowest growth over 200 trials: {slowest:?}");
}

/// Keys 1-4 get `rounds` tasks each, submitted right behind key 0's blocking task while the
/// worker was idle; after the first round key 0 is running (blocked), so the later rounds go to
/// keys that already have work queued (such a submit schedules nothing). Every one of them must
/// run while key 0 still blocks, without any later submit.
fn followers_of_a_blocked_key_run(trials_n: usize, rounds: usize) -> Duration {
    trials(trials_n, |trial| {
        let s = elastic();
        // Let the worker go idle (searching or asleep) before the burst.
        thread::sleep(Duration::from_millis(1));
        let latch = Arc::new(Latch::default());
        let _open = OpenOnDrop(latch.clone());
        let ran = Arc::new(AtomicUsize::new(0));
        let l = latch.clone();
        let blocker = s.submit(0, move || l.wait()).unwrap();
        for round in 0..rounds {
            for k in 1..5 {
                let ran = ran.clone();
                s.execute(k, move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
            }
            if round == 0 && rounds > 1 {
                while s.stats().running == 0 {
                    thread::yield_now();
                }
            }
        }
        let took = within("keys 1-4 running beside the blocked key 0", trial, || {
            ran.load(Ordering::SeqCst) == 4 * rounds
        });
        assert!(!blocker.is_finished());
        latch.open();
        blocker.join().unwrap();
        took
    })
}

#[test]
fn keys_queued_while_idle_run_while_the_first_one_blocks() {
    let slowest = followers_of_a_blocked_key_run(50, 1);
    eprintln!("slowest over 50 trials: {slowest:?}");
}

#[test]
fn submits_to_keys_with_queued_work_are_not_stranded() {
    let slowest = followers_of_a_blocked_key_run(50, 3);
    eprintln!("slowest over 50 trials: {slowest:?}");
}

#[test]
fn extra_workers_stop_at_max_workers_and_leave_after_keep_alive() {
    let s = elastic();
    let latch = Arc::new(Latch::default());
    let _open = OpenOnDrop(latch.clone());
    let handles: Vec<_> = (0..8)
        .map(|k| {
            let latch = latch.clone();
            s.submit(k, move || latch.wait()).unwrap()
        })
        .collect();
    within("growth to max_workers", 0, || s.stats().workers == 3);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(s.stats().workers, 3, "never beyond max_workers");
    latch.open();
    for h in handles {
        h.join().unwrap();
    }
    within("extras leaving after their keep-alive", 0, || {
        s.stats().workers == 1
    });
}

#[test]
fn a_burst_of_sleeping_tasks_grows_a_wide_pool() {
    // Issue 13's new-user case: ten keys submitted up front, each task sleeping 10 ms, with
    // max_workers(16): the pool must grow beyond its two core workers while they sleep.
    let s = Builder::<u32>::new()
        .workers(2)
        .max_workers(16)
        .worker_keep_alive(Duration::from_millis(100))
        .build()
        .unwrap();
    let peak = Arc::new(AtomicUsize::new(0));
    let running = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..10)
        .map(|k| {
            let (peak, running) = (peak.clone(), running.clone());
            s.submit(k, move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                thread::sleep(Duration::from_millis(10));
                running.fetch_sub(1, Ordering::SeqCst);
            })
            .unwrap()
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(
        peak.load(Ordering::SeqCst) > 2,
        "the pool grew while its workers slept (peak {} tasks at once)",
        peak.load(Ordering::SeqCst)
    );
}
