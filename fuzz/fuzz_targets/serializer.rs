//! A real `Serializer<u8>` driven by an input-chosen schedule, checked against a model.
//!
//! One submitting thread (this one) issues at most 64 operations: `submit`, `try_submit`,
//! `execute`, `submit_latest`, `submit_distinct`, `spawn`, tasks that panic or sleep (≤ 1 ms),
//! short sleeps of its own, `shutdown` and `shutdown_now`. Every task carries a *probe* that
//! records, per task id, whether its closure started (and on which thread) or was dropped unrun
//! (and whether that happened while this thread was disposing of a `PendingTask`).
//!
//! At the end (after `shutdown` + `await_termination`, or after `shutdown_now` +
//! `await_termination` + running or dropping every handed-back task) each accepted task must have
//! exactly one fate, and its handle must agree:
//!
//! | fate | probe | handle |
//! |---|---|---|
//! | ran on a worker or ran from a `PendingTask` | started once | `Ok(id)` or `Panicked` |
//! | handed back and dropped | dropped once, in a hand-back | `Cancelled` |
//! | superseded | dropped once, on a worker | `Superseded`; only a `submit_latest` task whose next task of the key is a `submit_latest` too |
//!
//! and per key the tasks that started did so one at a time, in submission order. Rejected tasks
//! must come back intact (never started; dropped once, by us). `stats()` must match the model.
#![no_main]

use std::any::Any;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use keyserial::{Builder, PendingTask, RejectReason, Rejected, Serializer, TaskError, TaskHandle};
use libfuzzer_sys::fuzz_target;

const MAX_OPS: usize = 64;
const KEYS: u8 = 4;
const DEADLINE: Duration = Duration::from_secs(20);

/// The payload of the panics the tasks raise on purpose (the panic hook stays quiet for them).
struct Intentional;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Body {
    Quick,
    Panic,
    /// Sleep: see [`micros`].
    Sleep(u16),
}

/// Mostly very short sleeps (< 64 µs), sometimes up to 1 ms (top bit set): sleeps dominate the
/// time per input, and short ones interleave just as well.
fn micros(x: u16) -> Duration {
    Duration::from_micros(u64::from(if x & 0x8000 != 0 { x % 1000 } else { x % 64 }))
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Submit,
    TrySubmit,
    Execute,
    Latest,
    Distinct,
    Spawn,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    Task(Kind, u8, Body),
    /// The submitting thread sleeps (see [`micros`]).
    Sleep(u16),
    Shutdown,
    ShutdownNow,
}

#[derive(Arbitrary, Debug)]
struct Input {
    workers: u8,
    elastic: bool,
    /// 0 → 0 ms, 1 → 1 ms, otherwise the default (100 ms).
    idle: u8,
    budget: u8,
    /// `None` or 1..=16 queued tasks.
    capacity: Option<u8>,
    /// For each handed-back task (cyclically): run it (true) or drop it (false).
    run_pending: Vec<bool>,
    ops: Vec<Op>,
}

/// What happened to one task's closure.
#[derive(Default)]
struct Record {
    started: AtomicU32,
    started_on_main: AtomicBool,
    dropped_unrun: AtomicU32,
    dropped_in_handback: AtomicBool,
}

struct World {
    records: Vec<Record>,
    /// Per key: the submission index of every task that started, in start order.
    log: Vec<Mutex<Vec<u32>>>,
    running: Vec<AtomicBool>,
    overlaps: AtomicU32,
}

thread_local! {
    /// Set on the submitting thread while it runs or drops a `PendingTask`.
    static IN_HANDBACK: Cell<bool> = const { Cell::new(false) };
    /// The id of the last probe that fired on this thread.
    static LAST_ID: Cell<Option<usize>> = const { Cell::new(None) };
    static IS_MAIN: Cell<bool> = const { Cell::new(false) };
}

struct Probe {
    world: Arc<World>,
    id: usize,
    ran: bool,
}

impl Probe {
    fn start(&mut self) {
        self.ran = true;
        let r = &self.world.records[self.id];
        r.started.fetch_add(1, Ordering::AcqRel);
        if IS_MAIN.with(Cell::get) {
            r.started_on_main.store(true, Ordering::Release);
        }
        LAST_ID.with(|c| c.set(Some(self.id)));
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if !self.ran {
            let r = &self.world.records[self.id];
            r.dropped_unrun.fetch_add(1, Ordering::AcqRel);
            if IN_HANDBACK.with(Cell::get) {
                r.dropped_in_handback.store(true, Ordering::Release);
            }
            LAST_ID.with(|c| c.set(Some(self.id)));
        }
    }
}

/// What the model knows about one submission.
struct Sub {
    kind: Kind,
    key: Option<u8>,
    body: Body,
    accepted: bool,
    handle: Option<TaskHandle<usize>>,
}

fn make_task(
    world: &Arc<World>,
    id: usize,
    key: Option<u8>,
    seq: u32,
    body: Body,
) -> impl FnOnce() -> usize + Send + 'static {
    let mut probe = Probe {
        world: world.clone(),
        id,
        ran: false,
    };
    move || {
        probe.start();
        let w = probe.world.clone();
        if let Some(k) = key {
            let k = usize::from(k);
            if w.running[k].swap(true, Ordering::AcqRel) {
                w.overlaps.fetch_add(1, Ordering::Relaxed);
            }
            w.log[k].lock().unwrap().push(seq);
        }
        match body {
            Body::Quick => {}
            Body::Sleep(us) => std::thread::sleep(micros(us)),
            Body::Panic => {}
        }
        if let Some(k) = key {
            w.running[usize::from(k)].store(false, Ordering::Release);
        }
        if let Body::Panic = body {
            std::panic::panic_any(Intentional);
        }
        id
    }
}

fn quiet_intentional_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // libfuzzer-sys installed a hook that aborts on any panic; keep it for real ones.
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().is::<Intentional>() {
                return;
            }
            prev(info)
        }));
    });
}

fn wait_handle(h: &TaskHandle<usize>) {
    let deadline = Instant::now() + DEADLINE;
    while !h.is_finished() {
        assert!(Instant::now() < deadline, "a handle never resolved");
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn is_intentional(p: &(dyn Any + Send)) -> bool {
    p.is::<Intentional>()
}

fuzz_target!(|input: Input| {
    quiet_intentional_panics();
    IS_MAIN.with(|c| c.set(true));
    let workers = usize::from(input.workers % 3) + 1;
    let mut b = Builder::<u8>::new()
        .workers(workers)
        .fairness_budget(usize::from(input.budget % 4) + 1)
        .key_idle_timeout(match input.idle % 4 {
            0 => Duration::ZERO,
            1 => Duration::from_millis(1),
            _ => Duration::from_millis(100),
        });
    if input.elastic {
        b = b
            .max_workers(workers + 1)
            .worker_keep_alive(Duration::from_millis(1));
    }
    let capacity = input.capacity.map(|c| usize::from(c % 16) + 1);
    if let Some(c) = capacity {
        b = b.capacity(c);
    }
    let s: Serializer<u8> = b.build().expect("valid configuration");

    let ops: Vec<Op> = input.ops.iter().copied().take(MAX_OPS).collect();
    let n_tasks = ops.iter().filter(|o| matches!(o, Op::Task(..))).count();
    let world = Arc::new(World {
        records: (0..n_tasks).map(|_| Record::default()).collect(),
        log: (0..KEYS).map(|_| Mutex::new(Vec::new())).collect(),
        running: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
        overlaps: AtomicU32::new(0),
    });
    let mut subs: Vec<Sub> = Vec::new();
    let mut next_seq = [0u32; KEYS as usize];
    // Per key: the last accepted distinct task.
    let mut last_distinct: [Option<usize>; KEYS as usize] = [None; KEYS as usize];
    let mut rejected = 0u64;
    let mut shut = false;
    let mut pending: Option<Vec<PendingTask<u8>>> = None;

    for op in ops {
        match op {
            Op::Task(kind, k, body) => {
                let id = subs.len();
                let key = (kind != Kind::Spawn).then_some(k % KEYS);
                let seq = key.map_or(0, |k| next_seq[usize::from(k)]);
                let task = make_task(&world, id, key, seq, body);
                // For the Full check: tasks accepted so far whose closure had not started.
                let unstarted_before = subs
                    .iter()
                    .enumerate()
                    .filter(|(i, s)| {
                        s.accepted && world.records[*i].started.load(Ordering::Acquire) == 0
                    })
                    .count();
                let distinct_unstarted = key
                    .and_then(|k| last_distinct[usize::from(k)])
                    .is_some_and(|d| world.records[d].started.load(Ordering::Acquire) == 0);
                let r: Result<Option<TaskHandle<usize>>, RejectReason> = match (kind, key) {
                    (Kind::Submit, Some(k)) => s.submit(k, task).map(Some).map_err(reason),
                    (Kind::TrySubmit, Some(k)) => s.try_submit(k, task).map(Some).map_err(reason),
                    (Kind::Execute, Some(k)) => s
                        .execute(k, move || {
                            task();
                        })
                        .map(|()| None)
                        .map_err(reason),
                    (Kind::Latest, Some(k)) => s.submit_latest(k, task).map(Some).map_err(reason),
                    (Kind::Distinct, Some(k)) => {
                        s.submit_distinct(k, task).map(Some).map_err(reason)
                    }
                    (Kind::Spawn, None) => s.spawn(task).map(Some).map_err(reason),
                    _ => unreachable!(),
                };
                let accepted = r.is_ok();
                match r {
                    Ok(handle) => {
                        assert!(!shut, "{kind:?} accepted after shutdown");
                        if let Some(k) = key {
                            next_seq[usize::from(k)] += 1;
                            if kind == Kind::Distinct {
                                last_distinct[usize::from(k)] = Some(id);
                            }
                        }
                        subs.push(Sub {
                            kind,
                            key,
                            body,
                            accepted,
                            handle,
                        });
                    }
                    Err(reason) => {
                        rejected += 1;
                        match reason {
                            RejectReason::Shutdown => assert!(shut, "Shutdown before shutdown"),
                            RejectReason::Full => {
                                assert!(!shut, "Full after shutdown (must be Shutdown)");
                                assert_eq!(kind, Kind::TrySubmit, "only try_submit refuses Full");
                                let cap = capacity.expect("Full without a capacity");
                                assert!(
                                    unstarted_before >= cap,
                                    "Full with only {unstarted_before} queued of {cap}"
                                );
                            }
                            RejectReason::Duplicate => {
                                assert!(!shut);
                                assert_eq!(kind, Kind::Distinct);
                                assert!(
                                    distinct_unstarted,
                                    "Duplicate although the key's last distinct task had started"
                                );
                            }
                            RejectReason::TooManyPermits => {
                                panic!("TooManyPermits without permits")
                            }
                            RejectReason::TooManyKeys => {
                                panic!("TooManyKeys without a key budget")
                            }
                        }
                        subs.push(Sub {
                            kind,
                            key,
                            body,
                            accepted,
                            handle: None,
                        });
                    }
                }
            }
            Op::Sleep(us) => std::thread::sleep(micros(us)),
            Op::Shutdown => {
                s.shutdown();
                shut = true;
                assert!(s.is_shutdown());
            }
            Op::ShutdownNow => {
                let got = s.shutdown_now();
                shut = true;
                assert!(s.is_shutdown());
                pending.get_or_insert_with(Vec::new).extend(got);
            }
        }
    }
    // The closures of rejected tasks came back inside `Rejected` and were dropped there: never
    // started, dropped exactly once, outside any hand-back.

    s.shutdown();
    assert!(s.await_termination(DEADLINE), "did not terminate");
    assert!(s.is_terminated());
    // After termination nothing is left anywhere: a (further) shutdown_now hands back nothing.
    let more = s.shutdown_now();
    assert!(
        more.is_empty(),
        "shutdown_now after termination handed back {} tasks",
        more.len()
    );

    // Worker-side counters are final now; take them before running hand-backs on this thread.
    let st = s.stats();

    // Run or drop every handed-back task, checking its key.
    for (i, p) in pending.unwrap_or_default().into_iter().enumerate() {
        let key = p.key().copied();
        let run = input
            .run_pending
            .get(i % input.run_pending.len().max(1))
            .copied()
            .unwrap_or(true);
        LAST_ID.with(|c| c.set(None));
        IN_HANDBACK.with(|c| c.set(true));
        if run {
            p.run();
        } else {
            drop(p);
        }
        IN_HANDBACK.with(|c| c.set(false));
        let id = LAST_ID
            .with(Cell::get)
            .expect("a PendingTask fired no probe");
        assert!(subs[id].accepted, "a rejected task was handed back");
        assert_eq!(key, subs[id].key, "PendingTask::key() is wrong");
    }

    // Every task: exactly one fate, and the handle agrees.
    let (mut ran_on_workers, mut panicked_on_workers) = (0u64, 0u64);
    let next_kind = next_of_key(&subs);
    for (id, sub) in subs.iter_mut().enumerate() {
        let r = &world.records[id];
        let started = r.started.load(Ordering::Acquire);
        let dropped = r.dropped_unrun.load(Ordering::Acquire);
        let in_handback = r.dropped_in_handback.load(Ordering::Acquire);
        let on_main = r.started_on_main.load(Ordering::Acquire);
        if !sub.accepted {
            assert_eq!(
                (started, dropped, in_handback),
                (0, 1, false),
                "rejected task {id}"
            );
            continue;
        }
        assert_eq!(
            started + dropped,
            1,
            "task {id} ({:?}): started {started}, dropped {dropped}",
            sub.kind
        );
        let panics = matches!(sub.body, Body::Panic);
        if started == 1 && !on_main {
            ran_on_workers += 1;
            panicked_on_workers += u64::from(panics);
        }
        if dropped == 1 && !in_handback {
            // Superseded: only a submit_latest task whose next task of the key is one too.
            assert_eq!(
                sub.kind,
                Kind::Latest,
                "task {id} dropped unrun on a worker"
            );
            assert_eq!(
                next_kind[id],
                Some(Kind::Latest),
                "task {id} superseded without a following latest"
            );
        }
        let Some(h) = sub.handle.take() else {
            continue;
        };
        wait_handle(&h);
        match h.join() {
            Ok(v) => assert!(started == 1 && !panics && v == id, "task {id}: Ok({v})"),
            Err(TaskError::Panicked(p)) => {
                assert!(
                    started == 1 && panics && is_intentional(&*p.into_panic()),
                    "task {id}: Panicked"
                )
            }
            Err(TaskError::Cancelled) => {
                assert!(dropped == 1 && in_handback, "task {id}: Cancelled")
            }
            Err(TaskError::Superseded) => {
                assert!(dropped == 1 && !in_handback, "task {id}: Superseded")
            }
        }
    }

    // Per key: one at a time, in submission order.
    assert_eq!(
        world.overlaps.load(Ordering::Relaxed),
        0,
        "two tasks of one key overlapped"
    );
    for (k, log) in world.log.iter().enumerate() {
        let log = log.lock().unwrap();
        assert!(
            log.windows(2).all(|w| w[0] < w[1]),
            "key {k} ran out of order: {log:?}"
        );
    }

    assert_eq!(st.completed, ran_on_workers, "stats.completed");
    assert_eq!(st.panicked, panicked_on_workers, "stats.panicked");
    assert_eq!(st.rejected, rejected, "stats.rejected");
    assert_eq!(st.queued, 0, "stats.queued after termination");
    assert_eq!(st.running, 0, "stats.running after termination");
    assert_eq!(st.workers, 0, "stats.workers after termination");
    drop(s);
});

/// Drops the rejected task (its probe records the drop) and keeps the reason.
fn reason<F>(r: Rejected<F>) -> RejectReason {
    r.reason
}

/// For each accepted keyed task, the kind of the next accepted task of the same key.
fn next_of_key(subs: &[Sub]) -> Vec<Option<Kind>> {
    let mut next = vec![None; subs.len()];
    let mut last: HashMap<u8, usize> = HashMap::new();
    for (id, sub) in subs.iter().enumerate() {
        if let (true, Some(k)) = (sub.accepted, sub.key) {
            if let Some(prev) = last.insert(k, id) {
                next[prev] = Some(sub.kind);
            }
        }
    }
    next
}
