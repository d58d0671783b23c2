//! Issue "Edges": user code that panics *outside* a task's closure (a task's output or a
//! capture panicking in `Drop`, a key whose `Hash`, `Eq` or `Clone` panics on a worker or on the
//! submitting thread, a key whose `Hash` is inconsistent) must not kill a worker, leak capacity,
//! hang shutdown or reach a caller that did nothing wrong.
//!
//! Every scenario runs on a thread of its own and is waited for with a timeout ([`bounded`]):
//! a hang fails its test with the last step it reached instead of blocking the suite. The panics
//! injected on purpose carry a payload starting with `"edge:"`, which the panic hook installed by
//! [`quiet_edge_panics`] keeps quiet; every other panic is reported as usual.

use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Once};
use std::thread;
use std::time::Duration;

use keyserial::{Builder, RejectReason, Semaphore, Serializer, TaskError, TaskHandle};

mod common;
use common::wait_until;

/// How long a scenario may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(20);

/// The prefix of every payload injected on purpose.
const EDGE: &str = "edge:";

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// Keeps the default hook for real failures; stays quiet for the panics injected on purpose.
fn quiet_edge_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let p = info.payload();
            let msg = p
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| p.downcast_ref::<String>().map(String::as_str));
            if msg.is_some_and(|m| m.starts_with(EDGE)) {
                return;
            }
            prev(info)
        }));
    });
}

/// The step a scenario has reached, for the message of a hang.
#[derive(Clone, Default)]
struct Progress(Arc<Mutex<String>>);

impl Progress {
    fn step(&self, s: impl Into<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = s.into();
    }

    fn get(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Runs `scenario` on a thread of its own and waits at most `limit` for it: a panic in it is
/// this test's failure, and so is a hang (reported with the last step it reached; the hung
/// thread is left behind).
fn bounded(what: &str, limit: Duration, scenario: impl FnOnce(&Progress) + Send + 'static) {
    quiet_edge_panics();
    let progress = Progress::default();
    let p = progress.clone();
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name(format!("scenario {what}"))
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(|| scenario(&p)));
            let _ = tx.send(r);
        })
        .expect("spawn the scenario thread");
    match rx.recv_timeout(limit) {
        Ok(Ok(())) => {}
        Ok(Err(payload)) => resume_unwind(payload),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!(
            "{what}: HUNG, still running after {limit:?}; last step reached: {}",
            progress.get()
        ),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            panic!("{what}: the scenario thread vanished without a result")
        }
    }
}

/// A thread name prefix no other serializer of this process uses.
fn unique_name() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("edge{}", N.fetch_add(1, SeqCst))
}

/// Whether the calling thread is a worker of the serializer named `name` (its threads are
/// `{name}-{index}`).
fn on_workers_of(name: &str) -> bool {
    thread::current().name().is_some_and(|n| {
        n.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('-'))
    })
}

/// Occupies a worker with a task of `key` until the returned sender is used or dropped.
fn block_worker<K>(s: &Serializer<K>, key: K) -> (mpsc::Sender<()>, TaskHandle<()>)
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    let before = s.stats().running;
    let (tx, rx) = mpsc::channel::<()>();
    let h = s
        .submit(key, move || {
            let _ = rx.recv();
        })
        .expect("the blocker is accepted");
    assert!(
        wait_until(Duration::from_secs(5), || s.stats().running > before),
        "the blocking task never started"
    );
    (tx, h)
}

/// Panics (with an `"edge:"` payload) when dropped, unless the thread is already unwinding;
/// counts its drops either way.
struct PanicOnDrop {
    what: &'static str,
    drops: Arc<AtomicUsize>,
}

impl PanicOnDrop {
    fn new(what: &'static str, drops: &Arc<AtomicUsize>) -> Self {
        PanicOnDrop {
            what,
            drops: drops.clone(),
        }
    }
}

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        self.drops.fetch_add(1, SeqCst);
        if !thread::panicking() {
            panic!("edge: {} panics in Drop", self.what);
        }
    }
}

/// Counts its drops (a closure's capture, to see that a closure is dropped exactly once).
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

#[track_caller]
fn assert_panicked<T: std::fmt::Debug>(r: Result<T, TaskError>, prefix: &str, what: &str) {
    match r {
        Err(TaskError::Panicked(p)) => {
            let m = p.message().unwrap_or("<no message>");
            assert!(
                m.starts_with(prefix),
                "{what}: panicked with {m:?}, expected a payload starting with {prefix:?}"
            );
        }
        other => panic!("{what}: expected Err(Panicked({prefix}..)), got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Keys whose Hash, Eq or Clone panics
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Hash,
    Eq,
    Clone,
}

/// On which threads a trap fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// Only on the serializer's worker threads.
    Worker,
    /// Only on other threads (the submitting side).
    Submitter,
    /// On any thread.
    Anywhere,
}

/// Makes a key's `op` panic on `side` while armed.
#[derive(Debug)]
struct Trap {
    op: Op,
    side: Side,
    /// The serializer's thread name.
    name: String,
    armed: AtomicBool,
    fired: AtomicUsize,
}

impl Trap {
    fn new(op: Op, side: Side, name: &str, armed: bool) -> Arc<Trap> {
        Arc::new(Trap {
            op,
            side,
            name: name.to_string(),
            armed: AtomicBool::new(armed),
            fired: AtomicUsize::new(0),
        })
    }

    fn arm(&self, on: bool) {
        self.armed.store(on, SeqCst);
    }

    fn check(&self, op: Op) {
        if self.op != op || !self.armed.load(SeqCst) {
            return;
        }
        let here = match self.side {
            Side::Worker => on_workers_of(&self.name),
            Side::Submitter => !on_workers_of(&self.name),
            Side::Anywhere => true,
        };
        if here && !thread::panicking() {
            self.fired.fetch_add(1, SeqCst);
            panic!("edge: key {op:?} panicked");
        }
    }
}

/// A key: its id, and maybe a trap. Keys of one id share their trap.
#[derive(Debug)]
struct Key {
    id: u32,
    trap: Option<Arc<Trap>>,
}

impl Key {
    fn good(id: u32) -> Key {
        Key { id, trap: None }
    }

    /// A trapped key, made without calling `Clone`.
    fn bad(id: u32, trap: &Arc<Trap>) -> Key {
        Key {
            id,
            trap: Some(trap.clone()),
        }
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        if let Some(t) = &self.trap {
            t.check(Op::Hash);
        }
        self.id.hash(h);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        if let Some(t) = self.trap.as_ref().or(other.trap.as_ref()) {
            t.check(Op::Eq);
        }
        self.id == other.id
    }
}

impl Eq for Key {}

impl Clone for Key {
    fn clone(&self) -> Key {
        if let Some(t) = &self.trap {
            t.check(Op::Clone);
        }
        Key {
            id: self.id,
            trap: self.trap.clone(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A task's output that panics in Drop, its handle dropped
// ---------------------------------------------------------------------------------------------

/// `n` tasks of key 3 whose output panics in `Drop`, each handle dropped before its task ran.
fn output_panics_in_drop(p: &Progress, max_workers: usize, n: usize) {
    let name = unique_name();
    let s = Builder::<u32>::new()
        .workers(1)
        .max_workers(max_workers)
        .thread_name(name.clone())
        .build()
        .unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    p.step("hold key 3 so that every handle is dropped before its task runs");
    let (tx, rx) = mpsc::channel::<()>();
    let gate = s
        .submit(3, move || {
            let _ = rx.recv();
        })
        .unwrap();
    for _ in 0..n {
        let d = drops.clone();
        drop(
            s.submit(3, move || PanicOnDrop::new("an output", &d))
                .unwrap(),
        );
    }
    tx.send(()).unwrap();
    p.step("the gate task");
    gate.join().unwrap();
    p.step("key 3's next task (a worker dropped the panicking outputs)");
    assert_eq!(s.submit(3, || 7u32).unwrap().join().unwrap(), 7);
    p.step("another key");
    assert_eq!(s.submit(4, || 8u32).unwrap().join().unwrap(), 8);
    assert!(
        wait_until(Duration::from_secs(5), || drops.load(SeqCst) == n),
        "every output is dropped once: {} of {n}",
        drops.load(SeqCst)
    );
    p.step("a task still runs on a worker thread");
    let ran_on = s
        .submit(3, || thread::current().name().map(str::to_string))
        .unwrap()
        .join()
        .unwrap();
    assert!(
        ran_on.as_deref().is_some_and(on_workers_of_name(&name)),
        "ran on {ran_on:?}"
    );
    let st = s.stats();
    if max_workers == 1 {
        assert_eq!(st.workers, 1, "the worker is still counted: {st:?}");
    } else {
        assert!((1..=max_workers).contains(&st.workers), "{st:?}");
    }
    p.step("shutdown + await_termination(2 s)");
    s.shutdown();
    assert!(
        s.await_termination(Duration::from_secs(2)),
        "await_termination after shutdown: {:?}",
        s.stats()
    );
    let st = s.stats();
    assert_eq!((st.workers, st.queued, st.running), (0, 0, 0), "{st:?}");
    // The gate, the n tasks (they returned normally: their outputs panicked afterwards), 7, 8
    // and the thread-name probe.
    assert_eq!(st.completed, n as u64 + 4, "{st:?}");
    assert_eq!(
        st.panicked, 0,
        "an output's Drop is not the task's panic: {st:?}"
    );
    p.step("drop the serializer");
    drop(s);
}

fn on_workers_of_name(name: &str) -> impl Fn(&str) -> bool + '_ {
    move |n: &str| {
        n.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('-'))
    }
}

#[test]
fn output_panicking_in_drop_with_its_handle_dropped_leaves_the_worker_alive() {
    bounded("output drop, 1 worker", LIMIT, |p| {
        output_panics_in_drop(p, 1, 1)
    });
}

#[test]
fn output_panicking_in_drop_with_its_handle_dropped_elastic_pool() {
    bounded("output drop, max_workers(4)", LIMIT, |p| {
        output_panics_in_drop(p, 4, 1)
    });
}

#[test]
fn two_outputs_panicking_in_drop_with_their_handles_dropped() {
    bounded("two output drops", LIMIT, |p| {
        output_panics_in_drop(p, 1, 2)
    });
}

// ---------------------------------------------------------------------------------------------
// 2. A capture that panics in Drop when its task is abandoned unrun
// ---------------------------------------------------------------------------------------------

#[test]
fn superseding_a_latest_task_whose_capture_panics_in_drop() {
    bounded("superseded capture", LIMIT, |p| {
        let s = Builder::<u32>::new()
            .workers(1)
            .capacity(2)
            .thread_name(unique_name())
            .build()
            .unwrap();
        let (release, blocker) = block_worker(&s, 0);
        let drops = Arc::new(AtomicUsize::new(0));
        let cap = PanicOnDrop::new("a superseded capture", &drops);
        let old = s
            .submit_latest(5, move || {
                let _keep = &cap;
                1u32
            })
            .unwrap();
        p.step("the replacing submit_latest");
        let new = catch_unwind(AssertUnwindSafe(|| s.submit_latest(5, || 2u32)))
            .expect("submit_latest panicked in the caller: the task it replaced has a capture that panics in Drop")
            .expect("the replacement is accepted");
        assert!(old.is_finished(), "the replaced handle resolves at once");
        assert!(
            matches!(old.join(), Err(TaskError::Superseded)),
            "the replaced task is Superseded"
        );
        assert_eq!(drops.load(SeqCst), 1, "the capture is dropped once");
        assert_eq!(s.stats().queued, 1, "only the replacement is queued");
        // One slot is the replacement's; the other is free.
        p.step("capacity with the replacement queued");
        let t1 = s
            .try_submit(6, || 6u32)
            .expect("a slot is free next to the replacement");
        let full = s.try_submit(7, || 7u32).unwrap_err();
        assert_eq!(
            full.reason,
            RejectReason::Full,
            "capacity 2: the replacement and t1"
        );
        assert_eq!(s.stats().queued, 2);
        release.send(()).unwrap();
        p.step("drain");
        blocker.join().unwrap();
        assert_eq!(new.join().unwrap(), 2);
        assert_eq!(t1.join().unwrap(), 6);
        p.step("capacity whole again");
        let (release, blocker) = block_worker(&s, 0);
        let a = s.try_submit(8, || 8u32).expect("first of two slots");
        let b = s.try_submit(9, || 9u32).expect("second of two slots");
        let full = s.try_submit(10, || 10u32).unwrap_err();
        assert_eq!(full.reason, RejectReason::Full);
        release.send(()).unwrap();
        blocker.join().unwrap();
        assert_eq!((a.join().unwrap(), b.join().unwrap()), (8, 9));
        s.shutdown();
        assert!(s.await_termination(Duration::from_secs(5)));
        let st = s.stats();
        assert_eq!((st.queued, st.running), (0, 0), "{st:?}");
        // Two blockers, the replacement, t1, a, b; the superseded task never ran.
        assert_eq!((st.completed, st.panicked), (6, 0), "{st:?}");
    });
}

#[test]
fn coalescing_two_latest_tasks_on_a_chain_drops_a_panicking_capture_on_the_worker() {
    bounded("coalesced capture", LIMIT, |p| {
        let s = Builder::<u32>::new()
            .workers(1)
            .thread_name(unique_name())
            .build()
            .unwrap();
        let sem = Semaphore::new(1);
        let permit = sem.try_acquire(1).unwrap();
        p.step("a permit-gated task parks key 9's chain");
        let gated = s.submit_with_permits(9, &sem, 1, || "gated").unwrap();
        assert!(
            wait_until(Duration::from_secs(5), || sem.waiters() == 1),
            "the permit-gated task never waited for its permit"
        );
        let drops = Arc::new(AtomicUsize::new(0));
        let cap = PanicOnDrop::new("a coalesced capture", &drops);
        let first = s
            .submit_latest(9, move || {
                let _keep = &cap;
                1u32
            })
            .unwrap();
        // The worker routes the first onto key 9's chain (behind the parked task) before the
        // second is submitted, so the second does not replace it at submission.
        thread::sleep(Duration::from_millis(250));
        let second = s.submit_latest(9, || 2u32).unwrap();
        thread::sleep(Duration::from_millis(250));
        assert!(
            !first.is_finished(),
            "the first latest task was replaced at submission: this test did not reach the chain's coalescing"
        );
        p.step("grant the permit: the worker coalesces the two latest tasks");
        drop(permit);
        assert_eq!(gated.join().unwrap(), "gated");
        assert!(
            matches!(first.join(), Err(TaskError::Superseded)),
            "the older of two queued latest tasks is Superseded"
        );
        assert_eq!(second.join().unwrap(), 2);
        assert_eq!(drops.load(SeqCst), 1, "the capture is dropped once");
        p.step("the worker is alive");
        assert_eq!(s.submit(10, || 10u32).unwrap().join().unwrap(), 10);
        assert_eq!(s.stats().workers, 1);
        p.step("shutdown_now");
        let pending = s.shutdown_now();
        assert!(pending.is_empty(), "nothing was left queued: {pending:?}");
        assert!(s.await_termination(Duration::from_secs(5)));
        let st = s.stats();
        assert_eq!((st.queued, st.running), (0, 0), "{st:?}");
        assert_eq!((st.completed, st.panicked), (3, 0), "{st:?}");
        assert_eq!(sem.available(), 1);
    });
}

#[test]
fn dropping_handed_back_tasks_whose_captures_panic_in_drop() {
    bounded("dropped PendingTask", LIMIT, |p| {
        let s = Builder::<u32>::new()
            .workers(1)
            .thread_name(unique_name())
            .build()
            .unwrap();
        let (release, blocker) = block_worker(&s, 0);
        let drops = Arc::new(AtomicUsize::new(0));
        let (c1, c2, c3) = (
            PanicOnDrop::new("a handed-back capture", &drops),
            PanicOnDrop::new("a handed-back capture", &drops),
            PanicOnDrop::new("a handed-back capture", &drops),
        );
        let submitted = s
            .submit(7, move || {
                let _keep = &c1;
                7u32
            })
            .unwrap();
        s.execute(8, move || {
            let _keep = &c2;
        })
        .unwrap();
        let spawned = s
            .spawn(move || {
                let _keep = &c3;
                9u32
            })
            .unwrap();
        p.step("shutdown_now");
        let pending =
            catch_unwind(AssertUnwindSafe(|| s.shutdown_now())).expect("shutdown_now panicked");
        assert_eq!(pending.len(), 3, "{pending:?}");
        p.step("drop the handed-back tasks");
        for t in pending {
            let what = format!("{t:?}");
            assert!(
                catch_unwind(AssertUnwindSafe(move || drop(t))).is_ok(),
                "dropping {what} panicked in the caller (its capture panics in Drop)"
            );
        }
        assert_eq!(drops.load(SeqCst), 3, "each capture dropped once");
        assert!(matches!(submitted.join(), Err(TaskError::Cancelled)));
        assert!(matches!(spawned.join(), Err(TaskError::Cancelled)));
        release.send(()).unwrap();
        blocker.join().unwrap();
        assert!(s.await_termination(Duration::from_secs(5)));
        let st = s.stats();
        assert_eq!((st.queued, st.running, st.completed), (0, 0, 1), "{st:?}");
    });
}

#[test]
fn shutdown_timeout_cancelling_tasks_whose_captures_panic_in_drop() {
    bounded("shutdown_timeout cancel", LIMIT, |p| {
        let s = Builder::<u32>::new()
            .workers(1)
            .thread_name(unique_name())
            .build()
            .unwrap();
        let (release, blocker) = block_worker(&s, 0);
        let drops = Arc::new(AtomicUsize::new(0));
        let (c1, c2) = (
            PanicOnDrop::new("a cancelled capture", &drops),
            PanicOnDrop::new("a cancelled capture", &drops),
        );
        let queued = s
            .submit(7, move || {
                let _keep = &c1;
                7u32
            })
            .unwrap();
        s.execute(8, move || {
            let _keep = &c2;
        })
        .unwrap();
        p.step("shutdown_timeout(50 ms) with the worker blocked");
        let finished = catch_unwind(AssertUnwindSafe(|| {
            s.shutdown_timeout(Duration::from_millis(50))
        }))
        .expect("shutdown_timeout panicked in the caller (a cancelled capture panics in Drop)");
        assert!(!finished, "the blocker still runs");
        assert!(matches!(queued.join(), Err(TaskError::Cancelled)));
        assert_eq!(drops.load(SeqCst), 2, "each capture dropped once");
        release.send(()).unwrap();
        p.step("the detached blocker finishes");
        blocker.join().unwrap();
        assert!(s.await_termination(Duration::from_secs(5)));
        let st = s.stats();
        assert_eq!((st.queued, st.running, st.completed), (0, 0, 1), "{st:?}");
        p.step("drop the serializer");
        drop(s);
    });
}

// ---------------------------------------------------------------------------------------------
// 3. A key whose Hash, Eq or Clone panics on a worker thread
// ---------------------------------------------------------------------------------------------

/// Keys that never panic, submitted around the bad key's tasks (with one worker there are two
/// lanes: many of them share the bad key's lane).
const GOOD_KEYS: u32 = 32;
const BAD: u32 = 1000;

/// The good keys' tasks of one round, each logging `(key, round)`; their handles.
fn good_round(
    s: &Serializer<Key>,
    round: u32,
    log: &Arc<Mutex<Vec<(u32, u32)>>>,
    out: &mut Vec<(TaskHandle<u32>, u32)>,
) {
    for k in 0..GOOD_KEYS {
        let log = log.clone();
        let h = s
            .submit(Key::good(k), move || {
                log.lock().unwrap().push((k, round));
                k * 100 + round
            })
            .unwrap();
        out.push((h, k * 100 + round));
    }
}

/// Every good task returned its value, and each good key's tasks ran in submission order.
fn check_good(good: Vec<(TaskHandle<u32>, u32)>, log: &Mutex<Vec<(u32, u32)>>, rounds: u32) {
    for (h, v) in good {
        match h.join() {
            Ok(got) => assert_eq!(got, v),
            Err(e) => panic!("a good key's task (value {v}) failed: {e:?}"),
        }
    }
    let log = log.lock().unwrap();
    for k in 0..GOOD_KEYS {
        let rounds_run: Vec<u32> = log
            .iter()
            .filter(|(key, _)| *key == k)
            .map(|e| e.1)
            .collect();
        assert_eq!(
            rounds_run,
            (0..rounds).collect::<Vec<_>>(),
            "key {k}'s order"
        );
    }
}

/// The end of a worker-side scenario: everything joined, the worker alive, `shutdown_now`
/// returns nothing, termination, exact stats.
fn finish_worker_side(s: Serializer<Key>, completed: u64, panicked: u64) {
    assert_eq!(s.stats().workers, 1, "the worker is alive");
    let pending = s.shutdown_now();
    assert!(pending.is_empty(), "nothing was left queued: {pending:?}");
    assert!(
        s.await_termination(Duration::from_secs(5)),
        "{:?}",
        s.stats()
    );
    let st = s.stats();
    assert_eq!((st.workers, st.queued, st.running), (0, 0, 0), "{st:?}");
    assert_eq!(
        (st.completed, st.panicked),
        (completed, panicked),
        "completed counts every task, the key-failed ones as panicked: {st:?}"
    );
    drop(s);
}

#[test]
fn key_hash_panicking_on_a_worker_fails_only_that_keys_tasks() {
    bounded("Hash on a worker", LIMIT, |p| {
        let name = unique_name();
        let s = Builder::<Key>::new()
            .workers(1)
            .thread_name(name.clone())
            .build()
            .unwrap();
        let trap = Trap::new(Op::Hash, Side::Worker, &name, true);
        let sem = Semaphore::new(1);
        let log = Arc::new(Mutex::new(Vec::new()));
        let bad_runs = Arc::new(AtomicUsize::new(0));
        let exec_drops = Arc::new(AtomicUsize::new(0));
        let (mut good, mut bad) = (Vec::new(), Vec::new());
        const ROUNDS: u32 = 4;
        for round in 0..ROUNDS {
            p.step(format!("submit round {round}"));
            good_round(&s, round, &log, &mut good);
            // Every kind of keyed submission: the worker hashes each when it pops it.
            let key = Key::bad(BAD, &trap);
            let r = bad_runs.clone();
            let f = move || {
                r.fetch_add(1, SeqCst);
                round
            };
            let h = match round {
                0 => s.submit(key, f),
                1 => s.submit_distinct(key, f),
                2 => s.submit_latest(key, f),
                _ => s.submit_with_permits(key, &sem, 1, f),
            };
            bad.push(h.unwrap());
            let (r, d) = (bad_runs.clone(), DropCount(exec_drops.clone()));
            s.execute(Key::bad(BAD, &trap), move || {
                let _keep = &d;
                r.fetch_add(1, SeqCst);
            })
            .unwrap();
        }
        p.step("join the bad key's tasks");
        for (i, h) in bad.into_iter().enumerate() {
            assert_panicked(h.join(), "edge: key Hash", &format!("bad task {i}"));
        }
        p.step("join the good keys' tasks");
        check_good(good, &log, ROUNDS);
        assert!(
            wait_until(Duration::from_secs(5), || exec_drops.load(SeqCst)
                == ROUNDS as usize),
            "each failed execute's closure is dropped"
        );
        assert_eq!(bad_runs.load(SeqCst), 0, "no task of the bad key ran");
        assert!(trap.fired.load(SeqCst) >= 2 * ROUNDS as usize);
        p.step("shutdown_now");
        let tasks = (GOOD_KEYS * ROUNDS) as u64 + 2 * ROUNDS as u64;
        finish_worker_side(s, tasks, 2 * ROUNDS as u64);
        assert_eq!(sem.available(), 1);
    });
}

#[test]
fn key_eq_panicking_on_a_worker_fails_only_that_keys_tasks() {
    bounded("Eq on a worker", LIMIT, |p| {
        let name = unique_name();
        let s = Builder::<Key>::new()
            .workers(1)
            .thread_name(name.clone())
            .build()
            .unwrap();
        let trap = Trap::new(Op::Eq, Side::Worker, &name, true);
        let sem = Semaphore::new(1);
        let permit = sem.try_acquire(1).unwrap();
        p.step("a permit-gated task makes the bad key tracked");
        let gated = s
            .submit_with_permits(Key::bad(BAD, &trap), &sem, 1, || 7u32)
            .unwrap();
        assert!(
            wait_until(Duration::from_secs(5), || sem.waiters() == 1
                || gated.is_finished()),
            "the permit-gated task neither parked nor finished"
        );
        assert!(
            !gated.is_finished(),
            "making the key's entry compares no keys: it parks"
        );
        let log = Arc::new(Mutex::new(Vec::new()));
        let bad_runs = Arc::new(AtomicUsize::new(0));
        let exec_drops = Arc::new(AtomicUsize::new(0));
        let (mut good, mut bad) = (Vec::new(), Vec::new());
        const ROUNDS: u32 = 3;
        for round in 0..ROUNDS {
            p.step(format!("submit round {round}"));
            good_round(&s, round, &log, &mut good);
            // The router looks the tracked key up in the table: Eq.
            let r = bad_runs.clone();
            bad.push(
                s.submit(Key::bad(BAD, &trap), move || {
                    r.fetch_add(1, SeqCst);
                    round
                })
                .unwrap(),
            );
            let (r, d) = (bad_runs.clone(), DropCount(exec_drops.clone()));
            s.execute(Key::bad(BAD, &trap), move || {
                let _keep = &d;
                r.fetch_add(1, SeqCst);
            })
            .unwrap();
        }
        p.step("join the bad key's routed tasks");
        for (i, h) in bad.into_iter().enumerate() {
            assert_panicked(h.join(), "edge: key Eq", &format!("bad task {i}"));
        }
        p.step("join the good keys' tasks");
        check_good(good, &log, ROUNDS);
        assert!(
            wait_until(Duration::from_secs(5), || exec_drops.load(SeqCst)
                == ROUNDS as usize),
            "each failed execute's closure is dropped"
        );
        assert_eq!(bad_runs.load(SeqCst), 0);
        p.step("grant the permit");
        drop(permit);
        assert_eq!(gated.join().unwrap(), 7, "the parked task itself is fine");
        let tasks = (GOOD_KEYS * ROUNDS) as u64 + 2 * ROUNDS as u64 + 1;
        finish_worker_side(s, tasks, 2 * ROUNDS as u64);
        assert_eq!(sem.available(), 1);
    });
}

#[test]
fn key_clone_panicking_on_a_worker_fails_only_that_keys_tracked_tasks() {
    bounded("Clone on a worker", LIMIT, |p| {
        let name = unique_name();
        let s = Builder::<Key>::new()
            .workers(1)
            .thread_name(name.clone())
            .build()
            .unwrap();
        let trap = Trap::new(Op::Clone, Side::Worker, &name, true);
        let sem = Semaphore::new(1);
        let log = Arc::new(Mutex::new(Vec::new()));
        let gated_runs = Arc::new(AtomicUsize::new(0));
        let (mut good, mut gated, mut plain) = (Vec::new(), Vec::new(), Vec::new());
        const ROUNDS: u32 = 3;
        for round in 0..ROUNDS {
            p.step(format!("submit round {round}"));
            good_round(&s, round, &log, &mut good);
            // A permit-gated task needs its key's entry: the worker clones the key into the
            // table.
            let r = gated_runs.clone();
            gated.push(
                s.submit_with_permits(Key::bad(BAD, &trap), &sem, 1, move || {
                    r.fetch_add(1, SeqCst);
                    round
                })
                .unwrap(),
            );
            // A plain task of the (untracked) key runs straight from its lane: no Clone there.
            plain.push(s.submit(Key::bad(BAD, &trap), move || round).unwrap());
        }
        p.step("join the bad key's permit-gated tasks");
        for (i, h) in gated.into_iter().enumerate() {
            assert_panicked(h.join(), "edge: key Clone", &format!("gated task {i}"));
        }
        assert_eq!(gated_runs.load(SeqCst), 0);
        p.step("join the bad key's plain tasks");
        for (round, h) in plain.into_iter().enumerate() {
            assert_eq!(
                h.join().unwrap(),
                round as u32,
                "a plain task of the key goes on"
            );
        }
        p.step("join the good keys' tasks");
        check_good(good, &log, ROUNDS);
        let tasks = (GOOD_KEYS * ROUNDS) as u64 + 2 * ROUNDS as u64;
        finish_worker_side(s, tasks, ROUNDS as u64);
        assert_eq!(sem.available(), 1);
    });
}

#[test]
fn key_clone_panicking_while_shutdown_now_hands_back_its_chain() {
    bounded("Clone during shutdown_now", LIMIT, |p| {
        let name = unique_name();
        let s = Builder::<Key>::new()
            .workers(1)
            .thread_name(name.clone())
            .build()
            .unwrap();
        let trap = Trap::new(Op::Clone, Side::Anywhere, &name, false);
        let sem = Semaphore::new(1);
        let permit = sem.try_acquire(1).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        p.step("park the bad key's chain on a permit");
        let r = ran.clone();
        let gated = s
            .submit_with_permits(Key::bad(BAD, &trap), &sem, 1, move || {
                r.fetch_add(1, SeqCst);
                1u32
            })
            .unwrap();
        assert!(wait_until(Duration::from_secs(5), || sem.waiters() == 1));
        let behind: Vec<TaskHandle<u32>> = (0..2)
            .map(|i| {
                let r = ran.clone();
                s.submit(Key::bad(BAD, &trap), move || {
                    r.fetch_add(1, SeqCst);
                    10 + i
                })
                .unwrap()
            })
            .collect();
        // The worker routes them onto the key's chain, behind the parked task.
        thread::sleep(Duration::from_millis(250));
        p.step("block the worker, queue good tasks in the lanes");
        let (release, blocker) = block_worker(&s, Key::good(0));
        let good: Vec<(TaskHandle<u32>, u32)> = (1..=4)
            .map(|k| (s.submit(Key::good(k), move || k).unwrap(), k))
            .collect();
        let spawned = s.spawn(|| 99u32).unwrap();
        p.step("shutdown_now with the bad key's Clone armed");
        trap.arm(true);
        let pending = catch_unwind(AssertUnwindSafe(|| s.shutdown_now()));
        trap.arm(false);
        let pending = pending
            .expect("shutdown_now panicked (the key's Clone panicked handing back its chain)");
        assert!(
            trap.fired.load(SeqCst) >= 1,
            "the hand-back cloned the bad key"
        );
        let mut ids: Vec<Option<u32>> = pending.iter().map(|t| t.key().map(|k| k.id)).collect();
        ids.sort();
        assert_eq!(
            ids,
            vec![None, Some(1), Some(2), Some(3), Some(4)],
            "exactly the good and unkeyed tasks are handed back; the bad key's are not"
        );
        p.step("the bad key's tasks resolve");
        assert_panicked(gated.join(), "edge: key Clone", "the parked task");
        for (i, h) in behind.into_iter().enumerate() {
            assert_panicked(h.join(), "edge: key Clone", &format!("queued task {i}"));
        }
        assert_eq!(ran.load(SeqCst), 0);
        p.step("run the handed-back tasks");
        for t in pending {
            t.run();
        }
        for (h, k) in good {
            assert_eq!(h.join().unwrap(), k);
        }
        assert_eq!(spawned.join().unwrap(), 99);
        release.send(()).unwrap();
        blocker.join().unwrap();
        assert!(s.await_termination(Duration::from_secs(5)));
        let st = s.stats();
        assert_eq!((st.queued, st.running), (0, 0), "{st:?}");
        drop(permit);
        assert_eq!(sem.available(), 1);
        assert_eq!(sem.waiters(), 0, "the parked wait was withdrawn");
    });
}

// ---------------------------------------------------------------------------------------------
// 4. The key's Hash, Eq or Clone panicking on the submitting thread
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Submit,
    Execute,
    TrySubmit,
    Latest,
    Distinct,
    Permits,
}

const METHODS: [Method; 6] = [
    Method::Submit,
    Method::Execute,
    Method::TrySubmit,
    Method::Latest,
    Method::Distinct,
    Method::Permits,
];

/// Submits `v` with `m`: `Ok(Some(handle))`, `Ok(None)` for an accepted `execute`, or the
/// reason of a refusal (the task comes back and is dropped here). `capture` rides in the task.
fn call(
    s: &Serializer<Key>,
    m: Method,
    key: Key,
    sem: &Semaphore,
    v: u32,
    capture: DropCount,
) -> Result<Option<TaskHandle<u32>>, RejectReason> {
    let f = move || {
        let _keep = &capture;
        v
    };
    match m {
        Method::Submit => s.submit(key, f).map(Some).map_err(|r| r.reason),
        Method::Execute => s
            .execute(key, move || {
                f();
            })
            .map(|()| None)
            .map_err(|r| r.reason),
        Method::TrySubmit => s.try_submit(key, f).map(Some).map_err(|r| r.reason),
        Method::Latest => s.submit_latest(key, f).map(Some).map_err(|r| r.reason),
        Method::Distinct => s.submit_distinct(key, f).map(Some).map_err(|r| r.reason),
        Method::Permits => s
            .submit_with_permits(key, sem, 1, f)
            .map(Some)
            .map_err(|r| r.reason),
    }
}

/// Two submissions with `m` of a key whose `op` panics on the submitting thread, with
/// `capacity(2)` and the worker blocked; then checks that nothing leaked. Returns how many of
/// the two panicked (a method that does not call `op` on the submitting thread is admitted
/// once, and the probe stops).
fn probe_submitter_side(p: &Progress, op: Op, m: Method) -> usize {
    let name = unique_name();
    let s = Builder::<Key>::new()
        .workers(1)
        .capacity(2)
        .thread_name(name.clone())
        .build()
        .unwrap();
    let trap = Trap::new(op, Side::Submitter, &name, false);
    let sem = Semaphore::new(1);
    let drops = Arc::new(AtomicUsize::new(0));
    let (mut made, mut refused) = (0usize, 0usize);
    let (release, blocker) = block_worker(&s, Key::good(0));
    let mut handles: Vec<(TaskHandle<u32>, u32)> = Vec::new();
    let mut executes = 0usize;
    if op == Op::Eq && matches!(m, Method::Latest | Method::Distinct) {
        // A pending latest (distinct) task of the key: the next one compares keys with it.
        made += 1;
        let h = call(
            &s,
            m,
            Key::bad(1, &trap),
            &sem,
            100,
            DropCount(drops.clone()),
        )
        .expect("the first task of the key is accepted")
        .expect("a handle");
        handles.push((h, 100));
    }
    trap.arm(true);
    let mut panics = 0;
    for attempt in 0..2u32 {
        p.step(format!(
            "{m:?} of a key whose {op:?} panics, attempt {attempt}"
        ));
        made += 1;
        let r = catch_unwind(AssertUnwindSafe(|| {
            call(
                &s,
                m,
                Key::bad(1, &trap),
                &sem,
                10 + attempt,
                DropCount(drops.clone()),
            )
        }));
        match r {
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_default();
                assert_eq!(
                    msg,
                    format!("edge: key {op:?} panicked"),
                    "{m:?}: the key's own panic"
                );
                panics += 1;
            }
            Ok(Ok(Some(h))) => {
                handles.push((h, 10 + attempt));
                break;
            }
            Ok(Ok(None)) => {
                executes += 1;
                break;
            }
            Ok(Err(reason)) => {
                assert_eq!(
                    (m, reason),
                    (Method::Distinct, RejectReason::Duplicate),
                    "the only refusal expected here"
                );
                refused += 1;
                break;
            }
        }
    }
    trap.arm(false);
    p.step(format!(
        "{m:?}/{op:?}: the closures of refused or panicked submissions"
    ));
    // A task superseded by the probe dropped its closure too.
    let abandoned = handles.iter().filter(|(h, _)| h.is_finished()).count();
    assert_eq!(
        drops.load(SeqCst),
        panics + refused + abandoned,
        "{m:?}/{op:?}: each closure of a submission that panicked or was refused is dropped once"
    );
    let queued = handles.iter().filter(|(h, _)| !h.is_finished()).count() + executes;
    assert_eq!(
        s.stats().queued,
        queued,
        "{m:?}/{op:?}: stats().queued after {panics} panics"
    );
    p.step(format!("{m:?}/{op:?}: capacity"));
    let free = 2usize.checked_sub(queued).expect("at most two queued");
    let mut extra = Vec::new();
    for i in 0..free {
        made += 1;
        let d = DropCount(drops.clone());
        let h = s.try_submit(Key::good(2), move || {
            let _keep = &d;
            200 + i as u32
        });
        let h = h.unwrap_or_else(|r| {
            panic!(
                "{m:?}/{op:?}: capacity leaked by {panics} panicking submits: try_submit {} of {free} refused ({:?})",
                i + 1,
                r.reason
            )
        });
        extra.push((h, 200 + i as u32));
    }
    let full = s.try_submit(Key::good(3), || 0u32).unwrap_err();
    assert_eq!(
        full.reason,
        RejectReason::Full,
        "{m:?}/{op:?}: the third is refused"
    );
    assert_eq!(s.stats().queued, 2);
    p.step(format!("{m:?}/{op:?}: drain"));
    release.send(()).unwrap();
    blocker.join().unwrap();
    for (h, v) in handles.into_iter().chain(extra) {
        match h.join() {
            Ok(got) => assert_eq!(got, v),
            // The probe replaced the key's pending latest task.
            Err(TaskError::Superseded) if m == Method::Latest && v == 100 => {}
            other => panic!("{m:?}/{op:?}: task {v}: {other:?}"),
        }
    }
    s.shutdown();
    assert!(
        s.await_termination(Duration::from_secs(5)),
        "{m:?}/{op:?}: {:?}",
        s.stats()
    );
    let st = s.stats();
    assert_eq!((st.queued, st.running), (0, 0), "{m:?}/{op:?}: {st:?}");
    drop(s);
    assert_eq!(
        drops.load(SeqCst),
        made,
        "{m:?}/{op:?}: every closure dropped once"
    );
    panics
}

/// Probes every method with `op`; returns how many submissions panicked, per method.
fn submitter_side(p: &Progress, op: Op) -> Vec<(Method, usize)> {
    METHODS
        .iter()
        .map(|&m| (m, probe_submitter_side(p, op, m)))
        .collect()
}

#[test]
fn key_hash_panicking_on_the_submitter_leaks_no_capacity() {
    bounded("Hash on the submitter", LIMIT * 2, |p| {
        let panics = submitter_side(p, Op::Hash);
        // Every keyed submission hashes its key on the submitting thread.
        for (m, n) in &panics {
            assert_eq!(*n, 2, "{m:?} hashes the key: {panics:?}");
        }
    });
}

#[test]
fn key_eq_panicking_on_the_submitter_leaks_no_capacity() {
    bounded("Eq on the submitter", LIMIT * 2, |p| {
        let panics = submitter_side(p, Op::Eq);
        // Keep-latest and keep-first compare the key with their pending task's.
        for (m, n) in &panics {
            if matches!(m, Method::Latest | Method::Distinct) {
                assert_eq!(*n, 2, "{m:?} compares keys: {panics:?}");
            }
        }
    });
}

#[test]
fn key_clone_panicking_on_the_submitter_leaks_no_capacity() {
    bounded("Clone on the submitter", LIMIT * 2, |p| {
        let panics = submitter_side(p, Op::Clone);
        // Keep-latest keeps a copy of the key beside the lane's, keep-first one in its claim.
        for (m, n) in &panics {
            if matches!(m, Method::Latest | Method::Distinct) {
                assert_eq!(*n, 2, "{m:?} clones the key: {panics:?}");
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// 5. An inconsistent Hash
// ---------------------------------------------------------------------------------------------

/// A key whose `Hash` writes a different value at every call.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fickle(u32);

impl Hash for Fickle {
    fn hash<H: Hasher>(&self, h: &mut H) {
        static STATE: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
        // splitmix64 of a global counter: a new value each call.
        let mut z = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, SeqCst);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h.write_u64(z ^ (z >> 31) ^ self.0 as u64);
    }
}

#[test]
fn inconsistent_hash_kills_no_worker_and_loses_no_task() {
    bounded("inconsistent Hash", LIMIT, |p| {
        let s = Builder::<Fickle>::new()
            .workers(2)
            .thread_name(unique_name())
            .build()
            .unwrap();
        let sem = Semaphore::new(2);
        let executed = Arc::new(AtomicUsize::new(0));
        let (mut submitted, mut distinct, mut latest) = (Vec::new(), Vec::new(), Vec::new());
        let mut executes = 0usize;
        let mut duplicates = 0usize;
        const N: u32 = 600;
        p.step("submit");
        for i in 0..N {
            let key = Fickle(i % 8);
            match i % 5 {
                0 => submitted.push((s.submit(key, move || i).unwrap(), i)),
                1 => match s.submit_distinct(key, move || i) {
                    Ok(h) => distinct.push((h, i)),
                    Err(r) => {
                        assert_eq!(r.reason, RejectReason::Duplicate);
                        duplicates += 1;
                    }
                },
                2 => latest.push((s.submit_latest(key, move || i).unwrap(), i)),
                3 => {
                    let e = executed.clone();
                    s.execute(key, move || {
                        e.fetch_add(1, SeqCst);
                    })
                    .unwrap();
                    executes += 1;
                }
                _ => submitted.push((s.submit_with_permits(key, &sem, 1, move || i).unwrap(), i)),
            }
            if i % 50 == 0 {
                thread::sleep(Duration::from_millis(1));
            }
        }
        p.step("join");
        let mut ran = 0u64;
        for (h, v) in submitted.into_iter().chain(distinct) {
            assert_eq!(h.join().unwrap(), v);
            ran += 1;
        }
        for (h, v) in latest {
            match h.join() {
                Ok(got) => {
                    assert_eq!(got, v);
                    ran += 1;
                }
                Err(TaskError::Superseded) => {}
                Err(e) => panic!("latest task {v}: {e:?}"),
            }
        }
        assert!(
            wait_until(Duration::from_secs(5), || executed.load(SeqCst) == executes),
            "every execute ran: {} of {executes}",
            executed.load(SeqCst)
        );
        ran += executes as u64;
        let _ = duplicates;
        assert_eq!(s.stats().workers, 2, "no worker died");
        p.step("shutdown + await_termination");
        s.shutdown();
        assert!(
            s.await_termination(Duration::from_secs(10)),
            "{:?}",
            s.stats()
        );
        let st = s.stats();
        assert_eq!((st.workers, st.queued, st.running), (0, 0, 0), "{st:?}");
        assert_eq!((st.completed, st.panicked), (ran, 0), "{st:?}");
        assert_eq!(sem.available(), 2);
        p.step("drop");
        drop(s);
    });
}
