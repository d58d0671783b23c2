//! Issue "Edges", randomised: panics injected at every point where keyserial runs user code
//! outside a task's closure (a key's `Hash`, `Eq` and `Clone` on workers and on submitters, a
//! capture's `Drop`, an output's `Drop`) and in the task body itself, into a random sequence of
//! submissions of every kind, ended by one of the ways to stop a serializer. Afterwards:
//!
//! - it terminated within a timeout, and no stop call panicked in the caller;
//! - every handle resolved (`Ok`, `Panicked`, `Cancelled`, `Superseded`), or the submission
//!   panicked in the caller (its key's code) or was refused and handed the task back; each
//!   outcome agrees with what was injected;
//! - no task body ran twice; no task of a submission that panicked or was refused ran;
//! - per-key order holds for the keys whose `Hash` is consistent and which never panic;
//! - after termination `stats()` shows nothing queued or running, and its `completed -
//!   panicked` counts exactly the tasks that returned normally on a worker;
//! - every capture is dropped exactly once (one whose `Drop` panics counts), and every output
//!   of a task that returned normally exactly once.
//!
//! Each case runs on a thread of its own, waited for with a timeout: a hang fails the case.

use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Once};
use std::thread;
use std::time::Duration;

use keyserial::{Builder, PendingTask, RejectReason, Semaphore, Serializer, TaskError, TaskHandle};
use proptest::prelude::*;

mod common;
use common::wait_until;

/// How long one case may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(10);

/// Waits for termination, joins and drops inside a case.
const PATIENCE: Duration = Duration::from_secs(5);

/// The prefix of every payload injected on purpose.
const EDGE: &str = "edge:";

/// Keys per case (key 0 is always a good one).
const KEYS: usize = 5;

/// The semaphore's permits (a permit-gated task asking for more is refused).
const PERMITS: usize = 2;

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

fn quiet_edge_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if message(info.payload()).is_some_and(|m| m.starts_with(EDGE)) {
                return;
            }
            prev(info)
        }));
    });
}

fn message(p: &(dyn std::any::Any + Send)) -> Option<&str> {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
}

/// The step a case has reached, for the message of a hang.
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

/// Runs `scenario` on a thread of its own, waiting at most `limit` (a hang fails, with the
/// last step reached; the hung thread is left behind).
fn bounded(limit: Duration, scenario: impl FnOnce(&Progress) + Send + 'static) {
    quiet_edge_panics();
    let progress = Progress::default();
    let p = progress.clone();
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("inject case".to_string())
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(|| scenario(&p)));
            let _ = tx.send(r);
        })
        .expect("spawn the case's thread");
    match rx.recv_timeout(limit) {
        Ok(Ok(())) => {}
        Ok(Err(payload)) => resume_unwind(payload),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!(
            "HUNG: the case still runs after {limit:?}; last step reached: {}",
            progress.get()
        ),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the case's thread vanished"),
    }
}

fn unique_name() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("inj{}", N.fetch_add(1, SeqCst))
}

/// Whether the calling thread is one of the serializer `name`'s threads (`{name}-{index}`).
fn on_workers_of(name: &str) -> bool {
    thread::current().name().is_some_and(|n| {
        n.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('-'))
    })
}

/// Drops `x`, whose `Drop` may panic on purpose (our own drop: its panic is ours to ignore).
fn drop_ours<T>(x: T) {
    let _ = catch_unwind(AssertUnwindSafe(move || drop(x)));
}

// ---------------------------------------------------------------------------------------------
// The case
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyOp {
    Hash,
    Eq,
    Clone,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Worker,
    Submitter,
    Anywhere,
}

/// How a key behaves for the whole case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profile {
    /// Consistent, never panics: its tasks' order is checked.
    Good,
    /// `op` panics on `side`, at one call in `every` there.
    Trap { op: KeyOp, side: Side, every: u32 },
    /// `Hash` writes a new value at every call.
    Fickle,
}

/// What panics besides the key, per task.
#[derive(Clone, Copy, Debug, Default)]
struct Inject {
    body: bool,
    capture: bool,
    output: bool,
    slow: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Submit,
    Execute,
    TrySubmit,
    Latest,
    Distinct,
    Permits(usize),
    Spawn,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// A submission: method, key index, injection.
    Task(Method, usize, Inject),
    /// Drops the handle of an earlier task (by index, modulo).
    DropHandle(usize),
    Pause,
    /// Lets the blocker return.
    Release,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Finish {
    ShutdownAwait,
    ShutdownNow { run: bool },
    ShutdownTimeout { ms: u64 },
    Drop,
}

#[derive(Clone, Debug)]
struct Case {
    workers: usize,
    elastic: bool,
    capacity: Option<usize>,
    /// A task that holds a worker until `Step::Release` or the end.
    blocker: bool,
    keys: Vec<Profile>,
    steps: Vec<Step>,
    finish: Finish,
}

// ---------------------------------------------------------------------------------------------
// Keys, captures, outputs
// ---------------------------------------------------------------------------------------------

struct KeyKind {
    profile: Profile,
    /// The serializer's thread name.
    name: String,
    calls: AtomicU32,
}

/// A key; keys of one id share their `KeyKind`.
struct PKey {
    id: u32,
    kind: Arc<KeyKind>,
}

impl std::fmt::Debug for PKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PKey({}, {:?})", self.id, self.kind.profile)
    }
}

impl PKey {
    /// Made without calling `Clone`.
    fn new(id: u32, kind: &Arc<KeyKind>) -> PKey {
        PKey {
            id,
            kind: kind.clone(),
        }
    }

    fn check(&self, op: KeyOp) {
        let Profile::Trap {
            op: trapped,
            side,
            every,
        } = self.kind.profile
        else {
            return;
        };
        if trapped != op || thread::panicking() {
            return;
        }
        let here = match side {
            Side::Worker => on_workers_of(&self.kind.name),
            Side::Submitter => !on_workers_of(&self.kind.name),
            Side::Anywhere => true,
        };
        if here && self.kind.calls.fetch_add(1, SeqCst).is_multiple_of(every) {
            panic!("edge: key {op:?} of key {}", self.id);
        }
    }
}

impl Hash for PKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        if self.kind.profile == Profile::Fickle {
            static STATE: AtomicU64 = AtomicU64::new(1);
            let mut z = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, SeqCst);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            h.write_u64(z ^ (z >> 31));
            return;
        }
        self.check(KeyOp::Hash);
        self.id.hash(h);
    }
}

impl PartialEq for PKey {
    fn eq(&self, other: &PKey) -> bool {
        self.check(KeyOp::Eq);
        self.id == other.id
    }
}

impl Eq for PKey {}

impl Clone for PKey {
    fn clone(&self) -> PKey {
        self.check(KeyOp::Clone);
        PKey::new(self.id, &self.kind)
    }
}

/// What the case records, per task id.
struct World {
    name: String,
    runs: Vec<AtomicU32>,
    drops: Vec<AtomicU32>,
    out_drops: Vec<AtomicU32>,
    /// Tasks that returned normally on one of the serializer's workers.
    ok_on_worker: AtomicU64,
    /// `(key index, sequence number)` of each good key's task, when its body starts.
    log: Mutex<Vec<(usize, u32)>>,
}

struct Capture {
    id: usize,
    panics: bool,
    world: Arc<World>,
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.world.drops[self.id].fetch_add(1, SeqCst);
        if self.panics && !thread::panicking() {
            panic!("edge: capture of task {}", self.id);
        }
    }
}

struct Out {
    id: usize,
    panics: bool,
    world: Arc<World>,
}

impl Out {
    fn defuse(mut self) {
        self.panics = false;
    }
}

impl Drop for Out {
    fn drop(&mut self) {
        self.world.out_drops[self.id].fetch_add(1, SeqCst);
        if self.panics && !thread::panicking() {
            panic!("edge: output of task {}", self.id);
        }
    }
}

/// Task `id`'s closure.
fn task(
    world: &Arc<World>,
    id: usize,
    inj: Inject,
    seq: Option<(usize, u32)>,
) -> impl FnOnce() -> Out + Send + 'static {
    let cap = Capture {
        id,
        panics: inj.capture,
        world: world.clone(),
    };
    let w = world.clone();
    move || {
        let cap = cap;
        w.runs[id].fetch_add(1, SeqCst);
        if let Some(e) = seq {
            w.log.lock().unwrap().push(e);
        }
        if inj.slow {
            thread::sleep(Duration::from_millis(2));
        }
        if inj.body {
            panic!("edge: body of task {id}");
        }
        drop(cap);
        if on_workers_of(&w.name) {
            w.ok_on_worker.fetch_add(1, SeqCst);
        }
        Out {
            id,
            panics: inj.output,
            world: w,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
enum Admission {
    Admitted,
    /// (The reason is read through `Debug`, in failure messages.)
    Refused(#[allow(dead_code)] RejectReason),
    /// The submit call itself panicked (the key's code, on the submitting thread).
    SubmitPanicked,
}

struct Rec {
    id: usize,
    method: Method,
    key: Option<usize>,
    inj: Inject,
    admission: Admission,
    handle: Option<TaskHandle<Out>>,
}

enum Sub {
    Handle(TaskHandle<Out>),
    Executed,
    Refused(RejectReason),
}

/// Submits `f` with `method`; a refused task is dropped here.
fn submit(
    s: &Serializer<PKey>,
    method: Method,
    key: Option<PKey>,
    sem: &Semaphore,
    f: impl FnOnce() -> Out + Send + 'static,
) -> Sub {
    fn handle<F>(r: Result<TaskHandle<Out>, keyserial::Rejected<F>>) -> Sub {
        match r {
            Ok(h) => Sub::Handle(h),
            Err(r) => {
                let reason = r.reason;
                drop_ours(r.task);
                Sub::Refused(reason)
            }
        }
    }
    match (method, key) {
        (Method::Spawn, _) => handle(s.spawn(f)),
        (Method::Submit, Some(k)) => handle(s.submit(k, f)),
        (Method::TrySubmit, Some(k)) => handle(s.try_submit(k, f)),
        (Method::Latest, Some(k)) => handle(s.submit_latest(k, f)),
        (Method::Distinct, Some(k)) => handle(s.submit_distinct(k, f)),
        (Method::Permits(n), Some(k)) => handle(s.submit_with_permits(k, sem, n, f)),
        (Method::Execute, Some(k)) => match s.execute(k, move || f().defuse()) {
            Ok(()) => Sub::Executed,
            Err(r) => {
                let reason = r.reason;
                drop_ours(r.task);
                Sub::Refused(reason)
            }
        },
        (m, None) => unreachable!("{m:?} needs a key"),
    }
}

fn run_case(p: &Progress, case: Case) {
    let name = unique_name();
    let mut case = case;
    if case.capacity.is_some() && case.workers == 1 {
        // The only worker blocked while a blocking submit waits for room would wait forever.
        case.blocker = false;
    }
    let tasks = case.steps.len() + 1;
    let world = Arc::new(World {
        name: name.clone(),
        runs: (0..tasks).map(|_| AtomicU32::new(0)).collect(),
        drops: (0..tasks).map(|_| AtomicU32::new(0)).collect(),
        out_drops: (0..tasks).map(|_| AtomicU32::new(0)).collect(),
        ok_on_worker: AtomicU64::new(0),
        log: Mutex::new(Vec::new()),
    });
    let kinds: Vec<Arc<KeyKind>> = case
        .keys
        .iter()
        .map(|&profile| {
            Arc::new(KeyKind {
                profile,
                name: name.clone(),
                calls: AtomicU32::new(0),
            })
        })
        .collect();
    let mut b = Builder::<PKey>::new()
        .workers(case.workers)
        .max_workers(case.workers + if case.elastic { 2 } else { 0 })
        .thread_name(name.clone());
    if let Some(c) = case.capacity {
        b = b.capacity(c);
    }
    let s = b.build().unwrap();
    let sem = Semaphore::new(PERMITS);

    // The blocker: a good key of its own, holding a worker until released.
    let blocker_kind = Arc::new(KeyKind {
        profile: Profile::Good,
        name: name.clone(),
        calls: AtomicU32::new(0),
    });
    let mut release: Option<mpsc::Sender<()>> = None;
    let mut blocker: Option<TaskHandle<()>> = None;
    if case.blocker {
        p.step("start the blocker");
        let (tx, rx) = mpsc::channel::<()>();
        let before = s.stats().running;
        blocker = Some(
            s.submit(PKey::new(999, &blocker_kind), move || {
                let _ = rx.recv();
            })
            .unwrap(),
        );
        assert!(
            wait_until(PATIENCE, || s.stats().running > before),
            "the blocker never started"
        );
        release = Some(tx);
    }

    let mut recs: Vec<Rec> = Vec::new();
    let mut next_seq = vec![0u32; kinds.len()];
    for (i, &step) in case.steps.iter().enumerate() {
        p.step(format!("step {i}: {step:?}"));
        match step {
            Step::Pause => thread::sleep(Duration::from_millis(1)),
            Step::Release => drop(release.take()),
            Step::DropHandle(j) => {
                if !recs.is_empty() {
                    let r = j % recs.len();
                    if let Some(h) = recs[r].handle.take() {
                        // A finished task's output goes with the handle: its Drop may panic
                        // here, on our own thread.
                        if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(h))) {
                            let m = message(&*payload).unwrap_or("").to_string();
                            assert!(
                                recs[r].inj.output
                                    && m == format!("edge: output of task {}", recs[r].id),
                                "dropping task {}'s handle panicked with {m:?}",
                                recs[r].id
                            );
                        }
                    }
                }
            }
            Step::Task(method, k, inj) => {
                let id = recs.len();
                let k = k % kinds.len();
                let inj = Inject {
                    output: inj.output && method != Method::Execute,
                    ..inj
                };
                let keyed = method != Method::Spawn;
                let good = keyed && kinds[k].profile == Profile::Good;
                let seq = good.then(|| (k, next_seq[k]));
                let f = task(&world, id, inj, seq);
                let key = keyed.then(|| PKey::new(k as u32, &kinds[k]));
                let r = catch_unwind(AssertUnwindSafe(|| submit(&s, method, key, &sem, f)));
                let (admission, handle) = match r {
                    Ok(Sub::Handle(h)) => (Admission::Admitted, Some(h)),
                    Ok(Sub::Executed) => (Admission::Admitted, None),
                    Ok(Sub::Refused(reason)) => {
                        let expected = match reason {
                            RejectReason::Full => {
                                method == Method::TrySubmit && case.capacity.is_some()
                            }
                            RejectReason::Duplicate => method == Method::Distinct,
                            RejectReason::TooManyPermits => {
                                matches!(method, Method::Permits(n) if n > PERMITS)
                            }
                            // No key budget in these cases.
                            RejectReason::Shutdown | RejectReason::TooManyKeys => false,
                        };
                        assert!(expected, "task {id}: {method:?} refused: {reason:?}");
                        (Admission::Refused(reason), None)
                    }
                    Err(payload) => {
                        let m = message(&*payload).unwrap_or("").to_string();
                        let from_key = match kinds[k].profile {
                            Profile::Trap { op, side, .. } if keyed => {
                                side != Side::Worker && m == format!("edge: key {op:?} of key {k}")
                            }
                            _ => false,
                        };
                        assert!(
                            from_key,
                            "task {id}: {method:?} of key {k} ({:?}) panicked in the caller: {m:?}",
                            kinds[k].profile
                        );
                        (Admission::SubmitPanicked, None)
                    }
                };
                if good && matches!(admission, Admission::Admitted) {
                    next_seq[k] += 1;
                }
                recs.push(Rec {
                    id,
                    method,
                    key: keyed.then_some(k),
                    inj,
                    admission,
                    handle,
                });
            }
        }
    }

    p.step(format!("finish: {:?}", case.finish));
    let mut pending: Vec<PendingTask<PKey>> = Vec::new();
    let mut s = Some(s);
    let stopped = catch_unwind(AssertUnwindSafe(|| match case.finish {
        Finish::ShutdownAwait => {
            s.as_ref().unwrap().shutdown();
            drop(release.take());
        }
        Finish::ShutdownNow { .. } => {
            pending = s.as_ref().unwrap().shutdown_now();
            drop(release.take());
        }
        Finish::ShutdownTimeout { ms } => {
            let _ = s
                .as_ref()
                .unwrap()
                .shutdown_timeout(Duration::from_millis(ms));
            drop(release.take());
        }
        Finish::Drop => {
            drop(release.take());
            drop(s.take());
        }
    }));
    if let Err(payload) = stopped {
        panic!(
            "{:?} panicked in the caller: {:?}",
            case.finish,
            message(&*payload)
        );
    }
    if let Some(sr) = &s {
        p.step("await termination");
        assert!(
            sr.await_termination(PATIENCE),
            "{:?}: no termination: {:?}",
            case.finish,
            sr.stats()
        );
    }
    if let Finish::ShutdownNow { run } = case.finish {
        p.step(format!(
            "{} the handed-back tasks",
            if run { "run" } else { "drop" }
        ));
        for t in pending.drain(..) {
            let what = format!("{t:?}");
            let r = catch_unwind(AssertUnwindSafe(
                move || {
                    if run {
                        t.run()
                    } else {
                        drop(t)
                    }
                },
            ));
            assert!(
                r.is_ok(),
                "handling the handed-back {what} panicked in the caller"
            );
        }
    }
    if let Some(sr) = s.take() {
        let st = sr.stats();
        assert_eq!(
            (st.queued, st.running),
            (0, 0),
            "stats after termination: {st:?}"
        );
        assert_eq!(
            st.completed.checked_sub(st.panicked),
            // (The blocker, if any, also returned normally on a worker.)
            Some(world.ok_on_worker.load(SeqCst) + blocker.is_some() as u64),
            "completed - panicked counts the tasks that returned normally on a worker: {st:?}"
        );
        p.step("drop the serializer");
        drop(sr);
    }
    if let Some(b) = blocker {
        p.step("join the blocker");
        assert!(b.join().is_ok(), "the blocker was running: it finishes");
    }

    // Every handle resolves, consistently with what was injected.
    let finish = case.finish;
    for rec in recs.iter_mut() {
        let id = rec.id;
        let runs = world.runs[id].load(SeqCst);
        assert!(runs <= 1, "task {id} ran {runs} times");
        let key_trap = rec.key.map(|k| kinds[k].profile);
        match rec.admission {
            Admission::Refused(_) | Admission::SubmitPanicked => {
                assert_eq!(runs, 0, "task {id} ({:?}) ran", rec.admission);
                continue;
            }
            Admission::Admitted => {}
        }
        let Some(h) = rec.handle.take() else { continue };
        p.step(format!("join task {id}"));
        match h.join() {
            Ok(out) => {
                assert_eq!(runs, 1, "task {id} is Ok without running");
                assert!(
                    !rec.inj.body && !rec.inj.capture,
                    "task {id} is Ok: {:?}",
                    rec.inj
                );
                out.defuse();
            }
            Err(TaskError::Panicked(pl)) => {
                let m = pl.message().unwrap_or("").to_string();
                if m == format!("edge: body of task {id}") {
                    assert!(rec.inj.body && runs == 1, "task {id}: {m}");
                } else if m == format!("edge: capture of task {id}") {
                    assert!(
                        rec.inj.capture && !rec.inj.body && runs == 1,
                        "task {id}: {m}"
                    );
                } else {
                    // The key's code failed the task before it ran: on a worker, or (Clone)
                    // while shutdown_now handed its chain back on this thread.
                    let stopping_here = matches!(
                        finish,
                        Finish::ShutdownNow { .. } | Finish::ShutdownTimeout { .. }
                    );
                    let ok = match (key_trap, rec.key) {
                        (Some(Profile::Trap { op, side, .. }), Some(k)) => {
                            m == format!("edge: key {op:?} of key {k}")
                                && (side != Side::Submitter || stopping_here)
                        }
                        _ => false,
                    };
                    assert!(
                        ok,
                        "task {id} ({:?}, key {:?}) panicked with {m:?}",
                        rec.method, key_trap
                    );
                    assert_eq!(runs, 0, "task {id} failed by its key yet ran");
                }
            }
            Err(TaskError::Cancelled) => {
                assert_eq!(runs, 0, "task {id} Cancelled after running");
                assert!(
                    matches!(
                        finish,
                        Finish::ShutdownNow { run: false } | Finish::ShutdownTimeout { .. }
                    ),
                    "task {id} Cancelled after {finish:?}"
                );
            }
            Err(TaskError::Superseded) => {
                assert_eq!(runs, 0, "task {id} Superseded after running");
                assert_eq!(rec.method, Method::Latest, "task {id} Superseded");
            }
        }
    }

    p.step("drops");
    let settled = wait_until(PATIENCE, || {
        world
            .drops
            .iter()
            .take(recs.len())
            .all(|d| d.load(SeqCst) >= 1)
    });
    for rec in &recs {
        let id = rec.id;
        let drops = world.drops[id].load(SeqCst);
        assert!(
            settled && drops == 1,
            "task {id} ({:?}, {:?}, {:?}): its capture was dropped {drops} times",
            rec.method,
            rec.admission,
            rec.inj
        );
        let runs = world.runs[id].load(SeqCst);
        let returned = runs == 1 && !rec.inj.body && !rec.inj.capture;
        let outs = world.out_drops[id].load(SeqCst);
        assert_eq!(
            outs, returned as u32,
            "task {id} ({:?}): its output was dropped {outs} times",
            rec.method
        );
    }

    // Per-key order for the good keys.
    let log = world.log.lock().unwrap();
    for (k, kind) in kinds.iter().enumerate() {
        if kind.profile != Profile::Good {
            continue;
        }
        let seqs: Vec<u32> = log.iter().filter(|e| e.0 == k).map(|e| e.1).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "good key {k} ran out of order: {seqs:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

fn profile() -> impl Strategy<Value = Profile> {
    let op = prop_oneof![Just(KeyOp::Hash), Just(KeyOp::Eq), Just(KeyOp::Clone)];
    let side = prop_oneof![
        Just(Side::Worker),
        Just(Side::Submitter),
        Just(Side::Anywhere)
    ];
    prop_oneof![
        3 => Just(Profile::Good),
        4 => (op, side, 1u32..=3).prop_map(|(op, side, every)| Profile::Trap { op, side, every }),
        1 => Just(Profile::Fickle),
    ]
}

fn inject() -> impl Strategy<Value = Inject> {
    (
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(body, capture, output, slow)| Inject {
            body,
            capture,
            output,
            slow,
        })
}

fn step() -> impl Strategy<Value = Step> {
    let method = prop_oneof![
        4 => Just(Method::Submit),
        2 => Just(Method::Execute),
        2 => Just(Method::TrySubmit),
        3 => Just(Method::Latest),
        2 => Just(Method::Distinct),
        3 => (1..=PERMITS + 1).prop_map(Method::Permits),
        1 => Just(Method::Spawn),
    ];
    prop_oneof![
        12 => (method, 0..KEYS, inject()).prop_map(|(m, k, i)| Step::Task(m, k, i)),
        2 => any::<usize>().prop_map(Step::DropHandle),
        1 => Just(Step::Pause),
        1 => Just(Step::Release),
    ]
}

fn finish() -> impl Strategy<Value = Finish> {
    prop_oneof![
        Just(Finish::ShutdownAwait),
        any::<bool>().prop_map(|run| Finish::ShutdownNow { run }),
        (0u64..30).prop_map(|ms| Finish::ShutdownTimeout { ms }),
        Just(Finish::Drop),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..=2,
        any::<bool>(),
        prop_oneof![Just(None), (2usize..=6).prop_map(Some)],
        any::<bool>(),
        prop::collection::vec(profile(), KEYS - 1),
        prop::collection::vec(step(), 1..40),
        finish(),
    )
        .prop_map(
            |(workers, elastic, capacity, blocker, more, steps, finish)| {
                // Key 0 is always a good key, so that every case checks some order.
                let mut keys = vec![Profile::Good];
                keys.extend(more);
                Case {
                    workers,
                    elastic,
                    capacity,
                    blocker,
                    keys,
                    steps,
                    finish,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        // Shrinking a case that hangs costs a timeout per try: keep it short.
        max_shrink_iters: 32,
        max_shrink_time: 120_000,
        // No regression file next to the tests.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn injected_panics_leave_every_task_accounted_for(case in case()) {
        bounded(LIMIT, move |p| run_case(p, case));
    }
}
