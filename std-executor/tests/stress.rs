//! Stress and fault injection: large storms with panics, sleeps and keys that retire and come back
//! all the time; `shutdown_now` fired from another thread in the middle of storms; idle churn.
//!
//! Every test checks, per task, that it ran exactly once (or was handed back exactly once), per
//! key, that tasks ran one at a time in submission order, and that `stats()` agrees. Waits use
//! generous deadlines and never assert on how long anything took.
//!
//! Sizes are knobs (environment variables, read once per test):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `KEYSERIAL_STRESS_TASKS` | 200,000 | tasks in [`storm_with_panics_sleeps_and_key_churn`] |
//! | `KEYSERIAL_STRESS_KEYS` | 1,000,000 | key space of that storm (half the tasks use a hot set of 1,000 keys) |
//! | `KEYSERIAL_STRESS_ROUNDS` | 40 | rounds of [`shutdown_now_races_a_storm`] |
//!
//! The full-size run (10⁷ tasks over 10⁶ keys) is the ignored test
//! [`storm_ten_million_tasks`]: `cargo test --release -p keyserial --test stress -- --ignored`
//! (about 25 s and 250 MB in release on two shared cores), or set
//! `KEYSERIAL_STRESS_TASKS=10000000` for the default one.
//!
//! Under Miri every size shrinks to a few hundred tasks (about a minute for the file):
//! `MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-permissive-provenance -Zmiri-ignore-leaks"
//! cargo +nightly miri test -p keyserial --test stress`. Tree Borrows and permissive provenance
//! for crossbeam-epoch; ignore-leaks because the key table frees through crossbeam-epoch's global
//! collector, whose last deferred frees (and the `Local`s of exited threads) are never run before
//! the process exits.

use std::panic::{panic_any, take_hook};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use keyserial::{Builder, PendingTask, RejectReason, Serializer, TaskError, TaskHandle};

mod common;
use common::wait_until;

/// Deadline for every wait: far above what any of these runs needs, even in debug builds on a
/// loaded machine (and under Miri).
const PATIENCE: Duration = Duration::from_secs(if cfg!(miri) { 600 } else { 120 });

/// The payload of the panics injected on purpose.
#[derive(Debug)]
struct Boom;

/// Keep the default panic hook for real failures, stay quiet for injected panics.
fn quiet_injected_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<Boom>() {
                prev(info)
            }
        }));
    });
}

fn env_or(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}

/// xorshift64: deterministic per producer, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

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

    /// The check every task runs first (also a panicking one, before it panics).
    fn visit(&self, key: usize, seq: u64, sleep: Option<Duration>) {
        if self.running[key].swap(true, Ordering::AcqRel) {
            self.violations.fetch_add(1, Ordering::Relaxed);
        }
        if self.next[key].load(Ordering::Acquire) != seq {
            self.violations.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(d) = sleep {
            std::thread::sleep(d);
        }
        self.next[key].store(seq + 1, Ordering::Release);
        self.running[key].store(false, Ordering::Release);
        // Release (an RMW, so every increment heads a release sequence): whoever reads the final
        // count with Acquire also sees every `next` store before it.
        self.ran.fetch_add(1, Ordering::AcqRel);
    }
}

/// Sizes of one storm.
struct Storm {
    tasks: usize,
    keys: usize,
    producers: usize,
}

/// What one producer submitted.
#[derive(Default)]
struct Submitted {
    /// Tasks submitted per key (only this producer's keys are non-zero).
    per_key: Vec<(usize, u64)>,
    panics: u64,
    handles: Vec<(TaskHandle<u64>, u64, bool)>,
}

/// `producers` threads submit `tasks` tasks: half on a hot set of 1,000 keys, half spread over the
/// whole key space; 1% panic, 1 in 20,000 sleeps 200 µs, 1 in 64 goes through `submit` with a
/// handle. Keys are `key % producers == p` for producer `p`, so per-key order is known. With
/// `key_idle_timeout(0)` every key that drains is retired at once and comes back on its next task.
fn run_storm(cfg: Storm) {
    quiet_injected_panics();
    let s = Arc::new(
        Builder::<u32>::new()
            .workers(2)
            .max_workers(3)
            .worker_keep_alive(Duration::from_millis(50))
            .key_idle_timeout(Duration::ZERO)
            .build()
            .unwrap(),
    );
    let checker = Checker::new(cfg.keys);
    let hot = cfg.keys.min(1000);
    let per_producer = cfg.tasks / cfg.producers;
    let producers: Vec<_> = (0..cfg.producers)
        .map(|p| {
            let (s, checker) = (s.clone(), checker.clone());
            let (keys, producers) = (cfg.keys, cfg.producers);
            std::thread::spawn(move || {
                let mut rng = Rng::new(p as u64 + 1);
                let mut seq = std::collections::HashMap::<usize, u64>::new();
                let mut out = Submitted::default();
                for i in 0..per_producer {
                    let range = if i % 2 == 0 { hot } else { keys };
                    let slots = (range / producers).max(1);
                    let key = rng.below(slots as u64) as usize * producers + p;
                    let key = if key < keys { key } else { p };
                    let n = seq.entry(key).or_insert(0);
                    let my_seq = *n;
                    *n += 1;
                    let roll = rng.below(20_000);
                    let panics = roll < 200;
                    let sleep = (roll == 200).then_some(Duration::from_micros(200));
                    out.panics += u64::from(panics);
                    let c = checker.clone();
                    let task = move || {
                        c.visit(key, my_seq, sleep);
                        if panics {
                            panic_any(Boom);
                        }
                        my_seq
                    };
                    if i % 64 == 0 {
                        let h = s.submit(key as u32, task).expect("accepted while running");
                        out.handles.push((h, my_seq, panics));
                    } else {
                        s.execute(key as u32, move || {
                            task();
                        })
                        .expect("accepted while running");
                    }
                }
                out.per_key = seq.into_iter().collect();
                out
            })
        })
        .collect();
    let results: Vec<Submitted> = producers.into_iter().map(|p| p.join().unwrap()).collect();
    let total = per_producer * cfg.producers;
    let panics: u64 = results.iter().map(|r| r.panics).sum();

    assert!(
        wait_until(PATIENCE, || checker.ran.load(Ordering::Acquire) == total),
        "only {} of {total} tasks ran",
        checker.ran.load(Ordering::Acquire)
    );
    assert!(wait_until(PATIENCE, || {
        let st = s.stats();
        st.completed == total as u64 && st.running == 0
    }));
    assert_eq!(
        checker.violations.load(Ordering::Relaxed),
        0,
        "order/overlap violations"
    );
    for r in &results {
        for &(key, n) in &r.per_key {
            assert_eq!(
                checker.next[key].load(Ordering::Acquire),
                n,
                "key {key}: not every task ran exactly once"
            );
        }
    }
    let st = s.stats();
    assert_eq!(st.completed, total as u64);
    assert_eq!(st.panicked, panics);
    assert_eq!(st.queued, 0);
    assert_eq!(st.running, 0);
    assert_eq!(st.rejected, 0);
    for r in results {
        for (h, seq, panics) in r.handles {
            match h.join() {
                Ok(v) => assert!(!panics && v == seq),
                Err(TaskError::Panicked(p)) => assert!(panics && p.into_panic().is::<Boom>()),
                Err(e) => panic!("handle of task {seq}: {e:?}"),
            }
        }
    }
    // key_idle_timeout(0): every drained key is released.
    assert!(
        wait_until(PATIENCE, || s.stats().active_keys == 0),
        "keys still live: {:?}",
        s.stats()
    );
    s.shutdown();
    assert!(s.await_termination(PATIENCE));
}

/// Default: 200,000 tasks (a few seconds in release, well under 30 s in debug).
#[test]
fn storm_with_panics_sleeps_and_key_churn() {
    let (tasks, keys) = if cfg!(miri) {
        (400, 64)
    } else {
        (200_000, 1_000_000)
    };
    run_storm(Storm {
        tasks: env_or("KEYSERIAL_STRESS_TASKS", tasks),
        keys: env_or("KEYSERIAL_STRESS_KEYS", keys),
        producers: 4,
    });
}

/// The long run of the issue: 10⁷ tasks, 4 producers, 10⁶ keys.
#[test]
#[ignore = "long: 10^7 tasks; run with --release -- --ignored"]
fn storm_ten_million_tasks() {
    run_storm(Storm {
        tasks: 10_000_000,
        keys: 1_000_000,
        producers: 4,
    });
}

/// One task of the shutdown race: counts its runs, and its drops without running.
struct Probe {
    runs: AtomicU32,
    drops: AtomicU32,
    on_worker: AtomicBool,
}

struct Tracked {
    probe: Arc<Probe>,
    ran: bool,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.ran {
            self.probe.drops.fetch_add(1, Ordering::AcqRel);
        }
    }
}

thread_local! {
    static ON_TEST_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Many rounds: two producers storm a small key set (execute, submit with handles, 1% panics,
/// 0.5% sleep 100 µs)
/// until a third thread calls `shutdown_now` at a random moment. Then every accepted task ran
/// exactly once on a worker or was handed back exactly once; per key, the tasks that ran are a
/// prefix of its submissions and the handed-back ones the rest, in order; half the handed-back
/// tasks are run here, the other half dropped (their handles resolve `Cancelled`).
#[test]
fn shutdown_now_races_a_storm() {
    quiet_injected_panics();
    ON_TEST_THREAD.with(|c| c.set(true));
    let rounds = env_or("KEYSERIAL_STRESS_ROUNDS", if cfg!(miri) { 2 } else { 40 });
    let per_producer: u32 = if cfg!(miri) { 60 } else { 20_000 };
    const KEYS: u32 = 16;
    let (mut total_ran, mut total_back) = (0, 0);
    for round in 0..rounds {
        let mut b = Builder::<u32>::new().workers(2);
        if round % 2 == 0 {
            b = b.key_idle_timeout(Duration::ZERO);
        }
        if round % 3 == 0 {
            b = b.max_workers(3);
        }
        if round % 4 == 1 {
            b = b.fairness_budget(1);
        }
        let s = Arc::new(b.build().unwrap());
        // (key, seq, probe, handle, panics) per accepted task.
        type Accepted = Vec<(u32, u64, Arc<Probe>, Option<TaskHandle<u64>>, bool)>;
        let order: Arc<Vec<Mutex<Vec<u64>>>> =
            Arc::new((0..KEYS).map(|_| Mutex::new(Vec::new())).collect());
        let producers: Vec<_> = (0..2u32)
            .map(|p| {
                let (s, order) = (s.clone(), order.clone());
                std::thread::spawn(move || -> Accepted {
                    let mut rng = Rng::new(u64::from(round as u32 * 2 + p + 1));
                    let mut seq = [0u64; KEYS as usize];
                    let mut accepted: Accepted = Vec::new();
                    for i in 0..per_producer {
                        let key = rng.below(u64::from(KEYS / 2)) as u32 * 2 + p;
                        let my_seq = seq[key as usize];
                        let probe = Arc::new(Probe {
                            runs: AtomicU32::new(0),
                            drops: AtomicU32::new(0),
                            on_worker: AtomicBool::new(false),
                        });
                        let mut tracked = Tracked {
                            probe: probe.clone(),
                            ran: false,
                        };
                        let panics = rng.below(100) == 0;
                        // Some slow tasks, so that queues build up and shutdown_now often finds
                        // workers inside a task (their chains are stolen).
                        let sleepy = rng.below(200) == 0;
                        let order = order.clone();
                        let mut task = move || {
                            tracked.ran = true;
                            tracked.probe.runs.fetch_add(1, Ordering::AcqRel);
                            if !ON_TEST_THREAD.with(|c| c.get()) {
                                tracked.probe.on_worker.store(true, Ordering::Release);
                            }
                            order[key as usize].lock().unwrap().push(my_seq);
                            if sleepy {
                                std::thread::sleep(Duration::from_micros(100));
                            }
                            if panics {
                                panic_any(Boom);
                            }
                            my_seq
                        };
                        let handle = if i % 3 == 0 {
                            match s.submit(key, task) {
                                Ok(h) => Some(h),
                                Err(r) => {
                                    assert_eq!(r.reason, RejectReason::Shutdown);
                                    drop(r.task);
                                    assert_eq!(probe.drops.load(Ordering::Acquire), 1);
                                    break;
                                }
                            }
                        } else {
                            match s.execute(key, move || {
                                task();
                            }) {
                                Ok(()) => None,
                                Err(r) => {
                                    assert_eq!(r.reason, RejectReason::Shutdown);
                                    break;
                                }
                            }
                        };
                        seq[key as usize] += 1;
                        accepted.push((key, my_seq, probe, handle, panics));
                    }
                    accepted
                })
            })
            .collect();
        let mut rng = Rng::new(round as u64 + 1000);
        std::thread::sleep(Duration::from_micros(rng.below(3000)));
        let pending: Vec<PendingTask<u32>> = s.shutdown_now();
        let accepted: Vec<_> = producers
            .into_iter()
            .flat_map(|p| p.join().unwrap())
            .collect();
        assert!(
            s.await_termination(PATIENCE),
            "round {round}: no termination"
        );
        let st = s.stats();
        assert_eq!((st.queued, st.running), (0, 0), "round {round}: {st:?}");
        let on_workers = accepted
            .iter()
            .filter(|a| a.2.runs.load(Ordering::Acquire) == 1)
            .count();
        assert_eq!(st.completed, on_workers as u64, "round {round}");

        // Per key, what ran on the workers is a prefix of the key's submissions.
        let mut ran_per_key = [0u64; KEYS as usize];
        for (k, log) in order.iter().enumerate() {
            let log = log.lock().unwrap();
            assert!(
                log.iter().copied().eq(0..log.len() as u64),
                "round {round}, key {k}: ran out of order: {log:?}"
            );
            ran_per_key[k] = log.len() as u64;
        }

        // The hand-back: run every other one, drop the rest; keys and order must fit.
        let handed = pending.len();
        let mut next_back = ran_per_key;
        for (i, p) in pending.into_iter().enumerate() {
            let k = *p.key().expect("only keyed tasks were submitted");
            let before = order[k as usize].lock().unwrap().len();
            if i % 2 == 0 {
                p.run();
                let log = order[k as usize].lock().unwrap();
                assert_eq!(log.len(), before + 1);
                assert_eq!(
                    log[before], next_back[k as usize],
                    "round {round}, key {k}: hand-back out of order"
                );
            } else {
                drop(p);
            }
            next_back[k as usize] += 1;
        }
        let mut per_key_accepted = [0u64; KEYS as usize];
        for a in &accepted {
            per_key_accepted[a.0 as usize] += 1;
        }
        assert_eq!(
            next_back, per_key_accepted,
            "round {round}: a key lost or gained tasks"
        );

        // Every accepted task: exactly one fate, and its handle agrees.
        let mut back = 0;
        for (key, seq, probe, _, _) in accepted.iter() {
            let runs = probe.runs.load(Ordering::Acquire);
            let drops = probe.drops.load(Ordering::Acquire);
            let on_worker = probe.on_worker.load(Ordering::Acquire);
            assert_eq!(
                runs + drops,
                1,
                "round {round}: key {key} task {seq}: {runs} runs, {drops} drops"
            );
            back += usize::from(!on_worker);
        }
        assert_eq!(
            back, handed,
            "round {round}: handed back {handed}, model {back}"
        );
        assert_eq!(on_workers + handed, accepted.len(), "round {round}");
        total_ran += on_workers;
        total_back += handed;
        for (key, seq, probe, handle, panics) in accepted {
            let Some(h) = handle else { continue };
            let ran = probe.runs.load(Ordering::Acquire) == 1;
            match h.join() {
                Ok(v) => assert!(
                    ran && !panics && v == seq,
                    "round {round} key {key}: Ok({v})"
                ),
                Err(TaskError::Panicked(p)) => {
                    assert!(ran && panics && p.into_panic().is::<Boom>())
                }
                Err(TaskError::Cancelled) => assert!(!ran, "round {round}: Cancelled but ran"),
                Err(e) => panic!("round {round}: unexpected {e:?}"),
            }
        }
    }
    // For humans (`--nocapture`): how much each side of the race got.
    eprintln!("{rounds} rounds: {total_ran} tasks ran on workers, {total_back} handed back");
}

/// A small key set hammered by four submitters while keys retire and come back constantly
/// (timeouts 0 and 5 ms): first bursts with yields in between, then rounds in which every key
/// is released completely before the next round brings it back.
#[test]
fn idle_churn_keys_retire_and_come_back() {
    quiet_injected_panics();
    const KEYS: usize = 8;
    const SUBMITTERS: usize = 4;
    let (bursts, rounds) = if cfg!(miri) { (4, 2) } else { (400, 30) };
    for timeout in [Duration::ZERO, Duration::from_millis(5)] {
        let s: Arc<Serializer<usize>> = Arc::new(
            Builder::new()
                .workers(2)
                .key_idle_timeout(timeout)
                .build()
                .unwrap(),
        );
        let checker = Checker::new(KEYS);
        let seqs: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        // Submitter p owns keys p and p + SUBMITTERS.
        let submit_burst = |s: &Serializer<usize>,
                            checker: &Arc<Checker>,
                            seqs: &[AtomicU64],
                            p: usize,
                            rng: &mut Rng| {
            let n = 1 + rng.below(8) as usize;
            for _ in 0..n {
                let key = p + SUBMITTERS * rng.below(2) as usize;
                let seq = seqs[key].fetch_add(1, Ordering::Relaxed);
                let c = checker.clone();
                s.execute(key, move || c.visit(key, seq, None)).unwrap();
            }
        };
        let submitters: Vec<_> = (0..SUBMITTERS)
            .map(|p| {
                let (s, checker, seqs) = (s.clone(), checker.clone(), seqs.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng::new(p as u64 + 7);
                    for _ in 0..bursts {
                        submit_burst(&s, &checker, &seqs, p, &mut rng);
                        for _ in 0..rng.below(50) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for t in submitters {
            t.join().unwrap();
        }
        let mut rng = Rng::new(99);
        for _ in 0..rounds {
            assert!(
                wait_until(PATIENCE, || s.stats().active_keys == 0),
                "timeout {timeout:?}: keys not released: {:?}",
                s.stats()
            );
            for p in 0..SUBMITTERS {
                submit_burst(&s, &checker, &seqs, p, &mut rng);
            }
        }
        let total: u64 = seqs.iter().map(|a| a.load(Ordering::Relaxed)).sum();
        assert!(
            wait_until(PATIENCE, || checker.ran.load(Ordering::Acquire) as u64
                == total),
            "timeout {timeout:?}: {} of {total} ran",
            checker.ran.load(Ordering::Acquire)
        );
        assert_eq!(
            checker.violations.load(Ordering::Relaxed),
            0,
            "timeout {timeout:?}"
        );
        for k in 0..KEYS {
            assert_eq!(
                checker.next[k].load(Ordering::Acquire),
                seqs[k].load(Ordering::Relaxed),
                "timeout {timeout:?}, key {k}"
            );
        }
        assert!(
            wait_until(PATIENCE, || s.stats().active_keys == 0),
            "timeout {timeout:?}: keys not released at the end: {:?}",
            s.stats()
        );
        let st = s.stats();
        assert_eq!((st.completed, st.queued, st.running), (total, 0, 0));
        s.shutdown();
        assert!(s.await_termination(PATIENCE));
    }
}

/// Keep-first across key retirement (`key_idle_timeout(0)`): while a key's distinct task D is
/// queued behind a blocker, no other `submit_distinct` of that key may be accepted.
///
/// One thread runs rounds: submit a blocker P, then `submit_distinct` D (accepted only if no
/// distinct task is queued), then release P. Four threads hammer `submit_distinct` on the same
/// key. A hammer task that was accepted *before* round r's blocker was released but runs *after*
/// round r's D started was queued behind D while D was queued and not started: a duplicate that
/// keep-first must refuse.
///
/// Regression test for a bug found while writing these tests: `Serializer::admit` claimed the
/// distinct flag on the entry it looked up, and if that chain was retired before the push
/// (`Retired`) it retried on the fresh entry with `distinct.store(true)` instead of a
/// compare-exchange, pushing a second distinct task next to one already queued there.
#[test]
fn submit_distinct_keeps_the_first_across_key_retirement() {
    let rounds = env_or("KEYSERIAL_STRESS_ROUNDS", if cfg!(miri) { 5 } else { 1000 }) as u64;
    let s = Arc::new(
        Builder::<u32>::new()
            .workers(2)
            .key_idle_timeout(Duration::ZERO)
            .build()
            .unwrap(),
    );
    let released = Arc::new(AtomicU64::new(0)); // last round whose blocker was released
    let d_started = Arc::new(AtomicU64::new(0)); // last round whose D started
    let stop = Arc::new(AtomicBool::new(false));
    let hammers: Vec<_> = (0..4)
        .map(|_| {
            let (s, released, d_started, stop) =
                (s.clone(), released.clone(), d_started.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut duplicates, mut accepted) = (0u64, 0u64);
                while !stop.load(Ordering::SeqCst) {
                    let seen = d_started.clone();
                    match s.submit_distinct(7, move || seen.load(Ordering::SeqCst)) {
                        Ok(h) => {
                            let released_at_return = released.load(Ordering::SeqCst);
                            accepted += 1;
                            let started_after = h.join().unwrap();
                            if started_after > released_at_return {
                                duplicates += 1;
                            }
                        }
                        Err(r) => assert_eq!(r.reason, RejectReason::Duplicate),
                    }
                }
                (duplicates, accepted)
            })
        })
        .collect();
    let mut d_accepted = 0;
    for round in 1..=rounds {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let blocker = s
            .submit(7, move || {
                let _ = rx.recv();
            })
            .unwrap();
        let started = d_started.clone();
        let d = s.submit_distinct(7, move || {
            started.store(round, Ordering::SeqCst);
            0
        });
        std::thread::yield_now();
        released.store(round, Ordering::SeqCst);
        tx.send(()).unwrap();
        blocker.join().unwrap();
        match d {
            Ok(h) => {
                d_accepted += 1;
                h.join().unwrap();
            }
            Err(r) => assert_eq!(r.reason, RejectReason::Duplicate),
        }
    }
    stop.store(true, Ordering::SeqCst);
    let (mut duplicates, mut accepted) = (0, 0);
    for h in hammers {
        let (d, a) = h.join().unwrap();
        duplicates += d;
        accepted += a;
    }
    eprintln!("{rounds} rounds, {d_accepted} D accepted, {accepted} hammer tasks accepted");
    assert_eq!(
        duplicates, 0,
        "{duplicates} distinct tasks were accepted while another distinct task of the key was queued"
    );
    s.shutdown();
    assert!(s.await_termination(PATIENCE));
}

/// `shutdown_now` while distinct tasks wait on their keys' chains (a permit-gated task gives each
/// key a chain): a worker that meets the stop puts the chain back for a sibling not yet stopped,
/// so a distinct task's claim is released when the task starts, never twice (a second release
/// used to kill a worker in debug builds and hang `shutdown_now`).
#[test]
fn shutdown_now_with_distinct_tasks_queued_on_chains() {
    let rounds = env_or("KEYSERIAL_STRESS_ROUNDS", if cfg!(miri) { 2 } else { 100 });
    for round in 0..rounds {
        let s = Arc::new(Builder::<u32>::new().workers(4).build().unwrap());
        let sem = keyserial::Semaphore::new(1 << 20);
        let submitter = {
            let (s, sem) = (s.clone(), sem.clone());
            std::thread::spawn(move || {
                for i in 0u32.. {
                    let k = i % 64;
                    if s.submit_with_permits(k, &sem, 1, || ()).is_err() {
                        break;
                    }
                    let _ = s.submit_distinct(k, || ());
                }
            })
        };
        std::thread::sleep(Duration::from_millis(2));
        let (tx, rx) = std::sync::mpsc::channel();
        let stopper = s.clone();
        std::thread::spawn(move || {
            let _ = tx.send(stopper.shutdown_now().len());
        });
        assert!(
            rx.recv_timeout(PATIENCE).is_ok(),
            "round {round}: shutdown_now did not return"
        );
        submitter.join().unwrap();
        assert!(
            s.await_termination(PATIENCE),
            "round {round}: no termination"
        );
    }
}
