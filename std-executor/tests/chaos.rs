//! Model-based chaos test with exact accounting: rounds of random options, random submissions
//! of every kind, random per-key controls and a random ending, each checked against a model of
//! the contract (DESIGN.md sections 3, 3.1 and 3.1b).
//!
//! A round builds a `Serializer<u32, KeyModelState>` with random options (1-4 workers, a key
//! idle timeout of 0, 1 ms, 50 ms or 10 s, perhaps `max_keys` and `capacity`, panic policy
//! `Continue` or `PauseKey`, a counting `init` that sometimes panics, a checking release hook).
//! Producers storm a small key space with `execute`, `submit`, `try_submit`,
//! `submit_with_state`, `try_submit_with_state`, `submit_latest`, `submit_async` and
//! `try_submit_async` (futures that return `Pending` and are woken from a separate waker
//! thread); some tasks panic, some pause/resume/cancel keys themselves, one may spawn a thread
//! that calls `shutdown_now`. A control thread pauses, resumes, cancels keys (running or
//! dropping what `cancel_key` hands back), reads `key_stats`, and may call `shutdown_now` in
//! the middle of the storm. The round ends at random: graceful drop, `shutdown` +
//! `await_termination`, `shutdown_now` (handed-back tasks run or dropped), or
//! `shutdown_timeout` with a short timeout.
//!
//! Then, exactly: every task ran at most once and its captures were dropped exactly once; an
//! accepted task that never ran was handed back and dropped by the test, or is excused by the
//! ending (`shutdown_timeout` cancels, a paused key's tasks resolve `Cancelled` at a graceful
//! shutdown, `shutdown_now` drops a started pending future); every handle resolved, to what
//! the task did; per key, the tasks that ran on workers started in submission order and never
//! overlapped (nor with a handed-back state task); each state task saw exactly the updates of
//! the state tasks before it on the same state; at most one state of a key was alive at a time
//! (until `shutdown_now`); every state made went through the release hook exactly once.
//!
//! Hangs: a watchdog aborts the process, naming the round's seed and every harness thread's
//! current step, if a round runs for more than a minute (five in debug builds).
//!
//! Knobs (environment variables):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `KEYSERIAL_CHAOS_SECS` | 20 | total time of the rounds (each round's storm is 50-400 ms) |
//! | `KEYSERIAL_CHAOS_SEED` | from the clock | the first round's seed (a failure prints its round's seed) |
//! | `KEYSERIAL_CHAOS_KEEP_GOING` | unset | `1`: run every round, print each failure, fail at the end |
//! | `KEYSERIAL_CHAOS_VERBOSE` | unset | `1`: print each round's options as it starts |
//! | `KEYSERIAL_CHAOS_NO_CANCEL_AFTER_STOP` | unset | `1`: no `cancel_key` after `shutdown_now` (it hung before issue "Baton"; kept to bisect) |
//!
//! The long run: `KEYSERIAL_CHAOS_SECS=1800 cargo test --release -p keyserial --test chaos --
//! --nocapture`. A failing round can be replayed (same options and choices; thread timing
//! differs) with `KEYSERIAL_CHAOS_SEED=<seed> KEYSERIAL_CHAOS_SECS=0` (one round).
//!
//! Under Miri: two tiny rounds.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::future::Future;
use std::panic::{panic_any, take_hook};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use keyserial::{Builder, PanicPolicy, PendingTask, Rejected, Serializer, TaskError, TaskHandle};

mod common;
use common::wait_until;

/// Deadline for the bounded waits of the checks (handles resolving, late drops and releases).
const PATIENCE: Duration = Duration::from_secs(if cfg!(miri) { 600 } else { 20 });

/// A round stuck for longer than this aborts the process (see [`watchdog`]).
const ROUND_LIMIT: Duration = Duration::from_secs(if cfg!(miri) {
    3600
} else if cfg!(debug_assertions) {
    300
} else {
    60
});

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

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        let v = v.replace('_', "");
        let parsed = match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => v.parse(),
        };
        parsed.unwrap_or_else(|_| panic!("{name}={v} is not a number"))
    })
}

/// xorshift64: deterministic per seed, no dependency.
#[derive(Clone)]
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
    /// `true` with probability `n / 1000`.
    fn per_mille(&mut self, n: u64) -> bool {
        self.below(1000) < n
    }
    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }
}

// ---------------------------------------------------------------------------------------------
// Watchdog

/// What the watchdog watches: the round's description and deadline, and each harness thread's
/// current step.
struct Watch {
    round: Option<(String, Instant)>,
    steps: BTreeMap<String, String>,
}

fn watch() -> &'static Mutex<Watch> {
    static WATCH: OnceLock<Mutex<Watch>> = OnceLock::new();
    WATCH.get_or_init(|| {
        std::thread::Builder::new()
            .name("chaos-watchdog".into())
            .spawn(watchdog)
            .unwrap();
        Mutex::new(Watch {
            round: None,
            steps: BTreeMap::new(),
        })
    })
}

/// Aborts the process if a round outlives [`ROUND_LIMIT`]: a hang in the serializer (or the
/// harness) must not wait for CI's global timeout, and must name its seed.
fn watchdog() {
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let w = watch().lock().unwrap_or_else(|e| e.into_inner());
        if let Some((round, deadline)) = &w.round {
            if Instant::now() > *deadline {
                eprintln!("\nchaos: HANG: round did not finish within {ROUND_LIMIT:?}\n{round}");
                for (thread, step) in &w.steps {
                    eprintln!("  {thread}: {step}");
                }
                std::process::abort();
            }
        }
    }
}

/// Records this harness thread's current step (shown if the watchdog fires).
fn step(who: &str, what: impl Into<String>) {
    let mut w = watch().lock().unwrap_or_else(|e| e.into_inner());
    w.steps.insert(who.to_string(), what.into());
}

// ---------------------------------------------------------------------------------------------
// The model

thread_local! {
    /// Set while the test runs or drops handed-back `PendingTask`s on this thread.
    static HARNESS: Cell<bool> = const { Cell::new(false) };
}

/// How a round ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// Drop the serializer (graceful).
    Drop,
    /// `shutdown`, then `await_termination`.
    ShutdownAwait,
    /// `shutdown_now`; the handed-back tasks are run or dropped; `await_termination`.
    ShutdownNow,
    /// `shutdown_timeout` with a short timeout.
    ShutdownTimeout(Duration),
}

/// A round's random choices.
#[derive(Clone, Debug)]
struct Opts {
    seed: u64,
    workers: usize,
    key_idle_timeout: Duration,
    max_keys: Option<usize>,
    capacity: Option<usize>,
    pause_key_policy: bool,
    keys: u32,
    producers: usize,
    /// Per mille of tasks that panic.
    panics: u64,
    /// Per mille of `init` calls that panic.
    init_panics: u64,
    /// Per mille of tasks that call a per-key control themselves.
    task_controls: u64,
    storm: Duration,
    ending: Ending,
    /// The control thread calls `shutdown_now` this far into the storm.
    control_shutdown_now: Option<Duration>,
    /// One task (the first to roll it) spawns a thread that calls `shutdown_now`.
    task_shutdown_now: bool,
    /// Resume every key before a graceful ending (else paused keys stay paused).
    resume_before_end: bool,
    max_tasks_per_producer: usize,
}

impl Opts {
    fn random(seed: u64) -> Opts {
        let mut r = Rng::new(seed);
        let keys = r.pick(&[16, 32, 64]);
        let ending = match r.below(4) {
            0 => Ending::Drop,
            1 => Ending::ShutdownAwait,
            2 => Ending::ShutdownNow,
            _ => Ending::ShutdownTimeout(Duration::from_millis(r.below(20))),
        };
        let storm = if cfg!(miri) {
            Duration::from_millis(20)
        } else {
            Duration::from_millis(50 + r.below(350))
        };
        Opts {
            seed,
            workers: 1 + r.below(4) as usize,
            key_idle_timeout: r.pick(&[
                Duration::ZERO,
                Duration::from_millis(1),
                Duration::from_millis(50),
                Duration::from_secs(10),
            ]),
            max_keys: r.per_mille(400).then(|| 8 + r.below(33) as usize),
            capacity: r.per_mille(300).then(|| 4 + r.below(200) as usize),
            pause_key_policy: r.per_mille(500),
            keys,
            producers: 2 + r.below(3) as usize,
            panics: r.pick(&[0, 5, 20, 50]),
            init_panics: r.pick(&[0, 0, 10, 50]),
            task_controls: r.pick(&[0, 5, 20]),
            storm,
            ending,
            control_shutdown_now: r
                .per_mille(150)
                .then(|| storm.mul_f64(r.below(100) as f64 / 100.0)),
            task_shutdown_now: r.per_mille(100),
            resume_before_end: r.per_mille(500),
            max_tasks_per_producer: if cfg!(miri) { 25 } else { 30_000 },
        }
    }
}

/// What a key's state holds: enough to check it is the key's own, current, complete state.
#[derive(Debug)]
struct KeyModelState {
    key: u32,
    /// Which `init` of the key made it (1, 2, ...).
    generation: u64,
    /// State tasks that ran against it.
    ran: u64,
    /// The sequence number of the last state task that ran on a worker.
    last_seq: Option<u64>,
}

/// The model of one key's states: what `init` made and the hook released.
#[derive(Default)]
struct StateModel {
    inits: u64,
    init_panics: u64,
    releases: u64,
    /// (generation, state tasks run against it) of each state alive.
    alive: Vec<(u64, u64)>,
}

/// The model of one key.
struct KeyModel {
    /// The next sequence number; held across the submit call so that sequence order is the
    /// order in which the key's submissions returned `Ok`.
    submit: Mutex<u64>,
    /// A task (or a started future, or a handed-back state task) of the key runs.
    running: AtomicBool,
    /// The sequence of the last task that started on a worker (-1: none).
    last_started: AtomicI64,
    /// The key may have been paused (by the control thread, a task or `PauseKey`).
    ever_paused: AtomicBool,
    states: Mutex<StateModel>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Execute,
    Submit,
    TrySubmit,
    State,
    TryState,
    Latest,
    Async,
    TryAsync,
}

impl Kind {
    fn is_state(self) -> bool {
        matches!(self, Kind::State | Kind::TryState)
    }
    fn is_future(self) -> bool {
        matches!(self, Kind::Async | Kind::TryAsync)
    }
}

/// One task's record.
struct Rec {
    id: u64,
    key: u32,
    seq: u64,
    kind: Kind,
    panics: bool,
    /// Times its body started (a future: its first poll).
    runs: AtomicU32,
    /// It ran to its end (a future: completed; a panicking one: reached its panic).
    completed: AtomicBool,
    /// Drops of its captures.
    drops: AtomicU32,
    /// It ran as a handed-back task, on the test's thread.
    handed_run: AtomicBool,
    /// The test dropped it as a handed-back task.
    harness_dropped: AtomicBool,
    /// The submit refused it (it came back in `Rejected`).
    rejected: AtomicBool,
}

/// Everything a round shares.
struct Model {
    opts: Opts,
    keys: Vec<KeyModel>,
    recs: Mutex<Vec<Arc<Rec>>>,
    next_id: AtomicU64,
    violations: Mutex<Vec<String>>,
    /// `shutdown_now` was called (from anywhere).
    stopped_now: AtomicBool,
    /// The test called `shutdown`, dropped the serializer or called `shutdown_timeout`.
    graceful: AtomicBool,
    init_calls: AtomicU64,
    /// The serializer, for tasks that control keys themselves.
    serializer: OnceLock<Weak<Serializer<u32, KeyModelState>>>,
    /// Where tasks and spawned threads send what `cancel_key` / `shutdown_now` handed back.
    pending_tx: crossbeam_channel::Sender<Vec<PendingTask<u32>>>,
    pending_rx: crossbeam_channel::Receiver<Vec<PendingTask<u32>>>,
    /// Where futures send their wakers.
    waker_tx: crossbeam_channel::Sender<Waker>,
    task_shutdown_now_taken: AtomicBool,
    spawned: Mutex<Vec<JoinHandle<()>>>,
}

impl Model {
    fn fail(&self, msg: String) {
        let mut v = self.violations.lock().unwrap();
        if v.len() < 200 {
            v.push(msg);
        }
    }

    fn key(&self, k: u32) -> &KeyModel {
        &self.keys[k as usize]
    }

    fn serializer(&self) -> Option<Arc<Serializer<u32, KeyModelState>>> {
        self.serializer.get().and_then(Weak::upgrade)
    }

    /// `init`: counts, sometimes panics, checks no other state of the key is alive.
    fn init(&self, key: u32) -> KeyModelState {
        let n = self.init_calls.fetch_add(1, Ordering::Relaxed);
        let mut st = self.key(key).states.lock().unwrap();
        if self.opts.init_panics > 0
            && Rng::new(self.opts.seed ^ n.wrapping_mul(0x5851_F42D))
                .per_mille(self.opts.init_panics)
        {
            st.init_panics += 1;
            drop(st);
            if self.opts.pause_key_policy {
                // A panicking `init` fails its task: `PanicPolicy::PauseKey` pauses the key.
                self.key(key).ever_paused.store(true, Ordering::SeqCst);
            }
            panic_any(Boom);
        }
        st.inits += 1;
        let generation = st.inits;
        if !st.alive.is_empty() && !self.stopped_now.load(Ordering::SeqCst) {
            let alive = st.alive.clone();
            drop(st);
            self.fail(format!(
                "key {key}: init made state #{generation} while {alive:?} (generation, ran) \
                 is alive and not released"
            ));
            st = self.key(key).states.lock().unwrap();
        }
        st.alive.push((generation, 0));
        KeyModelState {
            key,
            generation,
            ran: 0,
            last_seq: None,
        }
    }

    /// The release hook: the state is alive, its key's, and saw every update made to it.
    fn release(&self, key: u32, state: KeyModelState) {
        let mut st = self.key(key).states.lock().unwrap();
        st.releases += 1;
        let pos = st.alive.iter().position(|&(g, _)| g == state.generation);
        let msg = match pos {
            None => Some(format!(
                "key {key}: released state #{} that is not alive (released twice?)",
                state.generation
            )),
            Some(i) => {
                let (_, ran) = st.alive.swap_remove(i);
                (ran != state.ran || state.key != key).then(|| {
                    format!("key {key}: released state {state:?}, but {ran} state tasks ran on it")
                })
            }
        };
        drop(st);
        if let Some(m) = msg {
            self.fail(m);
        }
    }
}

/// A task's capture: counts its drops.
struct Token {
    rec: Arc<Rec>,
    model: Arc<Model>,
}

impl Drop for Token {
    fn drop(&mut self) {
        let n = self.rec.drops.fetch_add(1, Ordering::AcqRel);
        if n != 0 {
            self.model.fail(format!(
                "task {} ({:?}, key {}): captures dropped {} times",
                self.rec.id,
                self.rec.kind,
                self.rec.key,
                n + 1
            ));
        }
        if HARNESS.with(Cell::get) && self.rec.runs.load(Ordering::Acquire) == 0 {
            self.rec.harness_dropped.store(true, Ordering::Release);
        }
    }
}

impl Token {
    /// The checks at the start of a task's body; whether it took the key's running flag.
    fn begin(&self) -> bool {
        let (rec, m) = (&*self.rec, &*self.model);
        let km = m.key(rec.key);
        if rec.runs.fetch_add(1, Ordering::AcqRel) != 0 {
            m.fail(format!("task {} ({:?}): ran twice", rec.id, rec.kind));
        }
        let harness = HARNESS.with(Cell::get);
        if harness {
            rec.handed_run.store(true, Ordering::Release);
        }
        // A plain handed-back task runs on our thread whenever we like; a state task runs
        // exclusively with its key's tasks, until a stop: after `shutdown_now` a handed-back
        // task may run beside its key's task that was running when the serializer stopped
        // (DESIGN 3.1b promises the state, not that wait: the state is lent or fresh).
        let flag = !harness || (rec.kind.is_state() && !m.stopped_now.load(Ordering::SeqCst));
        if flag && km.running.swap(true, Ordering::AcqRel) {
            m.fail(format!(
                "task {} ({:?}, key {}, seq {}{}): started while another task of its key runs",
                rec.id,
                rec.kind,
                rec.key,
                rec.seq,
                if harness { ", handed back" } else { "" }
            ));
        }
        if !harness {
            let last = km.last_started.swap(rec.seq as i64, Ordering::AcqRel);
            if last >= rec.seq as i64 {
                m.fail(format!(
                    "task {} ({:?}, key {}): seq {} started after seq {last}",
                    rec.id, rec.kind, rec.key, rec.seq
                ));
            }
        }
        flag
    }

    /// A state task's check and update of its state.
    fn on_state(&self, state: &mut KeyModelState) {
        let (rec, m) = (&*self.rec, &*self.model);
        let harness = HARNESS.with(Cell::get);
        let mut st = m.key(rec.key).states.lock().unwrap();
        let entry = st.alive.iter_mut().find(|(g, _)| *g == state.generation);
        let msg = match entry {
            None => Some(format!(
                "task {} (key {}): runs against state {state:?}, which is not alive",
                rec.id, rec.key
            )),
            Some((_, ran)) => {
                let bad = *ran != state.ran || state.key != rec.key;
                let msg = bad.then(|| {
                    format!(
                        "task {} (key {}, seq {}): state {state:?}, but {ran} state tasks ran on it",
                        rec.id, rec.key, rec.seq
                    )
                });
                *ran += 1;
                msg
            }
        };
        drop(st);
        state.ran += 1;
        if let Some(m2) = msg {
            m.fail(m2);
        }
        if !harness {
            if let Some(last) = state.last_seq {
                if last >= rec.seq {
                    m.fail(format!(
                        "task {} (key {}): state task seq {} after state task seq {last}",
                        rec.id, rec.key, rec.seq
                    ));
                }
            }
            state.last_seq = Some(rec.seq);
        }
    }

    /// The end of a task's body: per-key controls, perhaps a spawned `shutdown_now`, perhaps
    /// the injected panic.
    fn finish(&self, flag: bool, rng_seed: u64) {
        let (rec, m) = (&*self.rec, &*self.model);
        let km = m.key(rec.key);
        let harness = HARNESS.with(Cell::get);
        let mut r = Rng::new(rng_seed);
        if r.per_mille(20) {
            std::thread::sleep(Duration::from_micros(r.below(200)));
        }
        if !harness && r.per_mille(m.opts.task_controls) {
            if let Some(s) = m.serializer() {
                let k = if r.per_mille(500) {
                    rec.key
                } else {
                    r.below(u64::from(m.opts.keys)) as u32
                };
                match r.below(4) {
                    0 => {
                        m.key(k).ever_paused.store(true, Ordering::SeqCst);
                        s.pause(&k);
                    }
                    1 => s.resume(&k),
                    2 => {
                        let back = s.cancel_key(&k);
                        if !back.is_empty() {
                            let _ = m.pending_tx.send(back);
                        }
                    }
                    _ => {
                        let _ = s.key_stats(&k);
                    }
                }
            }
        }
        if !harness
            && m.opts.task_shutdown_now
            && r.per_mille(5)
            && !m.task_shutdown_now_taken.swap(true, Ordering::SeqCst)
        {
            let model = self.model.clone();
            let t = std::thread::spawn(move || {
                if let Some(s) = model.serializer() {
                    model.stopped_now.store(true, Ordering::SeqCst);
                    let back = s.shutdown_now();
                    let _ = model.pending_tx.send(back);
                }
            });
            m.spawned.lock().unwrap().push(t);
        }
        rec.completed.store(true, Ordering::Release);
        if rec.panics {
            if m.opts.pause_key_policy {
                km.ever_paused.store(true, Ordering::SeqCst);
            }
            if flag {
                km.running.store(false, Ordering::Release);
            }
            panic_any(Boom);
        }
        if flag {
            km.running.store(false, Ordering::Release);
        }
    }
}

/// A future that is pending `pendings` times; each time it hands a waker to the waker thread
/// (sometimes it also wakes itself at once).
struct ChaosFuture {
    tok: Token,
    pendings: u32,
    started: bool,
    flag: bool,
    done: bool,
    wake_self: bool,
}

impl Future for ChaosFuture {
    type Output = u64;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u64> {
        let this = &mut *self;
        if this.done {
            this.tok.model.fail(format!(
                "future {}: polled after completion",
                this.tok.rec.id
            ));
            return Poll::Pending;
        }
        if !this.started {
            this.started = true;
            this.flag = this.tok.begin();
        }
        if this.pendings > 0 {
            this.pendings -= 1;
            if this.wake_self && this.pendings.is_multiple_of(2) {
                cx.waker().wake_by_ref();
            }
            let _ = this.tok.model.waker_tx.send(cx.waker().clone());
            return Poll::Pending;
        }
        this.done = true;
        let id = this.tok.rec.id;
        this.tok.finish(this.flag, id);
        Poll::Ready(id)
    }
}

impl Drop for ChaosFuture {
    fn drop(&mut self) {
        // Dropped started and unfinished (shutdown_now cancels a pending future): the key's
        // running flag goes with it.
        if self.started && !self.done && self.flag {
            self.tok
                .model
                .key(self.tok.rec.key)
                .running
                .store(false, Ordering::Release);
        }
    }
}

/// Wakes the wakers futures hand it, a little later (and sometimes twice), until `stop`.
fn waker_thread(rx: crossbeam_channel::Receiver<Waker>, stop: Arc<AtomicBool>, seed: u64) {
    let mut r = Rng::new(seed);
    let mut held: Vec<(Instant, Waker)> = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_micros(100)) {
            Ok(w) => {
                let due = Instant::now() + Duration::from_micros(r.below(500));
                held.push((due, w));
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        }
        let now = Instant::now();
        let stopping = stop.load(Ordering::SeqCst);
        let mut i = 0;
        while i < held.len() {
            if stopping || held[i].0 <= now {
                let (_, w) = held.swap_remove(i);
                if r.per_mille(200) {
                    w.wake_by_ref();
                }
                w.wake();
            } else {
                i += 1;
            }
        }
        if stopping && held.is_empty() && rx.is_empty() {
            break;
        }
    }
}

/// Runs or drops handed-back tasks on this thread (marked as the test's).
fn consume(r: &mut Rng, pending: Vec<PendingTask<u32>>) {
    HARNESS.with(|h| h.set(true));
    for p in pending {
        if r.per_mille(500) {
            p.run();
        } else {
            drop(p);
        }
    }
    HARNESS.with(|h| h.set(false));
}

type Ser = Serializer<u32, KeyModelState>;

/// What a producer keeps: each accepted task with a handle.
type Handles = Vec<(Arc<Rec>, TaskHandle<u64>)>;

fn new_rec(m: &Model, key: u32, seq: u64, kind: Kind, panics: bool) -> Arc<Rec> {
    let rec = Arc::new(Rec {
        id: m.next_id.fetch_add(1, Ordering::Relaxed),
        key,
        seq,
        kind,
        panics,
        runs: AtomicU32::new(0),
        completed: AtomicBool::new(false),
        drops: AtomicU32::new(0),
        handed_run: AtomicBool::new(false),
        harness_dropped: AtomicBool::new(false),
        rejected: AtomicBool::new(false),
    });
    m.recs.lock().unwrap().push(rec.clone());
    rec
}

/// A plain task's body.
fn plain_task(tok: Token, seed: u64) -> impl FnOnce() -> u64 + Send + 'static {
    move || {
        let flag = tok.begin();
        tok.finish(flag, seed);
        tok.rec.id
    }
}

/// Marks a refused task and drops it.
fn refused<F>(rec: &Rec, e: Rejected<F>) {
    rec.rejected.store(true, Ordering::Release);
    drop(e.task);
}

fn producer(s: Arc<Ser>, m: Arc<Model>, p: usize, stop: Arc<AtomicBool>) -> Handles {
    let me = format!("producer {p}");
    let mut r = Rng::new(m.opts.seed ^ (p as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F));
    let mut handles = Handles::new();
    for i in 0..m.opts.max_tasks_per_producer {
        if stop.load(Ordering::Relaxed) || s.is_shutdown() {
            break;
        }
        let key = r.below(u64::from(m.opts.keys)) as u32;
        let kind = match r.below(16) {
            0..=2 => Kind::Execute,
            3..=4 => Kind::Submit,
            5 => Kind::TrySubmit,
            6..=8 => Kind::State,
            9 => Kind::TryState,
            10..=11 => Kind::Latest,
            12..=14 => Kind::Async,
            _ => Kind::TryAsync,
        };
        let panics = r.per_mille(m.opts.panics);
        let task_seed = r.next();
        let km = m.key(key);
        step(&me, format!("submit {kind:?} to key {key}"));
        let mut next = km.submit.lock().unwrap();
        let seq = *next;
        *next += 1;
        let rec = new_rec(&m, key, seq, kind, panics);
        let tok = Token {
            rec: rec.clone(),
            model: m.clone(),
        };
        let handle = match kind {
            Kind::Execute => match s.execute(key, move || {
                plain_task(tok, task_seed)();
            }) {
                Ok(()) => None,
                Err(e) => {
                    refused(&rec, e);
                    None
                }
            },
            Kind::Submit | Kind::TrySubmit | Kind::Latest => {
                let plain = plain_task(tok, task_seed);
                let res = match kind {
                    Kind::Submit => s.submit(key, plain),
                    Kind::TrySubmit => s.try_submit(key, plain),
                    _ => s.submit_latest(key, plain),
                };
                res.map_err(|e| refused(&rec, e)).ok()
            }
            Kind::State | Kind::TryState => {
                let task = move |st: &mut KeyModelState| {
                    let flag = tok.begin();
                    tok.on_state(st);
                    tok.finish(flag, task_seed);
                    tok.rec.id
                };
                let res = if kind == Kind::State {
                    s.submit_with_state(key, task)
                } else {
                    s.try_submit_with_state(key, task)
                };
                res.map_err(|e| refused(&rec, e)).ok()
            }
            Kind::Async | Kind::TryAsync => {
                let fut = ChaosFuture {
                    tok,
                    pendings: r.below(3) as u32,
                    started: false,
                    flag: false,
                    done: false,
                    wake_self: r.per_mille(300),
                };
                let res = if kind == Kind::Async {
                    s.submit_async(key, fut)
                } else {
                    s.try_submit_async(key, fut)
                };
                res.map_err(|e| refused(&rec, e)).ok()
            }
        };
        drop(next);
        if let Some(h) = handle {
            handles.push((rec, h));
        }
        if r.per_mille(50) {
            std::thread::yield_now();
        }
        // Keep the backlog near a thousand tasks: enough to race over, few enough that the
        // handed-back ones (futures among them wait for the waker thread) run quickly.
        if i % 64 == 0 && s.stats().queued > 1000 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    step(&me, "done");
    handles
}

/// Pauses, resumes, cancels keys and reads their stats at random until `stop`; resumes every
/// key every 2 ms (so that `PauseKey` and blocked submitters cannot stall the round); perhaps
/// calls `shutdown_now` in the middle of the storm.
fn control(s: Arc<Ser>, m: Arc<Model>, stop: Arc<AtomicBool>, start: Instant) {
    let me = "control";
    let mut r = Rng::new(m.opts.seed ^ 0xC047_2001);
    let mut last_resume_all = Instant::now();
    let mut stopped = false;
    let no_cancel_after_stop = env_u64("KEYSERIAL_CHAOS_NO_CANCEL_AFTER_STOP").unwrap_or(0) != 0;
    while !stop.load(Ordering::Relaxed) {
        if let Some(at) = m.opts.control_shutdown_now {
            if !stopped && start.elapsed() >= at {
                stopped = true;
                step(me, "shutdown_now mid-storm");
                m.stopped_now.store(true, Ordering::SeqCst);
                let back = s.shutdown_now();
                step(me, "consume shutdown_now's tasks");
                consume(&mut r, back);
            }
        }
        let k = r.below(u64::from(m.opts.keys)) as u32;
        match r.below(10) {
            0 | 1 => {
                step(me, format!("pause {k}"));
                m.key(k).ever_paused.store(true, Ordering::SeqCst);
                s.pause(&k);
            }
            2 | 3 => {
                step(me, format!("resume {k}"));
                s.resume(&k);
            }
            4 | 5 if !(no_cancel_after_stop && m.stopped_now.load(Ordering::SeqCst)) => {
                step(me, format!("cancel_key {k}"));
                let back = s.cancel_key(&k);
                step(me, format!("consume cancel_key {k}'s {} tasks", back.len()));
                consume(&mut r, back);
            }
            6 => {
                step(me, format!("key_stats {k}"));
                let _ = s.key_stats(&k);
            }
            7 => {
                step(me, "busiest_keys");
                let _ = s.busiest_keys(4);
            }
            8 => {
                let _ = s.stats();
            }
            _ => {}
        }
        while let Ok(back) = m.pending_rx.try_recv() {
            step(me, "consume tasks' hand-backs");
            consume(&mut r, back);
        }
        if last_resume_all.elapsed() >= Duration::from_millis(2) {
            step(me, "resume all");
            for k in 0..m.opts.keys {
                s.resume(&k);
            }
            last_resume_all = Instant::now();
        }
        if r.per_mille(300) {
            std::thread::sleep(Duration::from_micros(r.below(300)));
        }
    }
    step(me, "done");
}

/// Takes the serializer out of its `Arc` (waiting for threads that hold it for a moment).
fn unwrap_arc(mut s: Arc<Ser>) -> Ser {
    loop {
        match Arc::try_unwrap(s) {
            Ok(s) => return s,
            Err(back) => {
                s = back;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// One round; the contract violations found.
fn round(opts: &Opts) -> Vec<String> {
    let me = "main";
    {
        let mut w = watch().lock().unwrap();
        let desc = format!("seed {:#x}: {opts:?}", opts.seed);
        w.round = Some((desc, Instant::now() + ROUND_LIMIT));
        w.steps.clear();
    }
    step(me, "build");
    let (pending_tx, pending_rx) = crossbeam_channel::unbounded();
    let (waker_tx, waker_rx) = crossbeam_channel::unbounded();
    let m = Arc::new(Model {
        opts: opts.clone(),
        keys: (0..opts.keys)
            .map(|_| KeyModel {
                submit: Mutex::new(0),
                running: AtomicBool::new(false),
                last_started: AtomicI64::new(-1),
                ever_paused: AtomicBool::new(false),
                states: Mutex::new(StateModel::default()),
            })
            .collect(),
        recs: Mutex::new(Vec::new()),
        next_id: AtomicU64::new(0),
        violations: Mutex::new(Vec::new()),
        stopped_now: AtomicBool::new(false),
        graceful: AtomicBool::new(false),
        init_calls: AtomicU64::new(0),
        serializer: OnceLock::new(),
        pending_tx,
        pending_rx,
        waker_tx,
        task_shutdown_now_taken: AtomicBool::new(false),
        spawned: Mutex::new(Vec::new()),
    });
    let (mi, mr) = (m.clone(), m.clone());
    let mut b = Builder::<u32>::new()
        .key_state(move |k: &u32| mi.init(*k))
        .on_key_release(move |k, st| mr.release(k, st))
        .workers(opts.workers)
        .key_idle_timeout(opts.key_idle_timeout)
        .panic_policy(if opts.pause_key_policy {
            PanicPolicy::PauseKey
        } else {
            PanicPolicy::Continue
        });
    if let Some(n) = opts.max_keys {
        b = b.max_keys(n);
    }
    if let Some(n) = opts.capacity {
        b = b.capacity(n);
    }
    let s = Arc::new(b.build().unwrap());
    m.serializer.set(Arc::downgrade(&s)).unwrap();
    let mut r = Rng::new(opts.seed ^ 0x0E_0D);

    let waker_stop = Arc::new(AtomicBool::new(false));
    let waker = {
        let stop = waker_stop.clone();
        let seed = opts.seed;
        std::thread::spawn(move || waker_thread(waker_rx, stop, seed))
    };
    let start = Instant::now();
    let stop_producers = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..opts.producers)
        .map(|p| {
            let (s, m, stop) = (s.clone(), m.clone(), stop_producers.clone());
            std::thread::spawn(move || producer(s, m, p, stop))
        })
        .collect();
    let stop_control = Arc::new(AtomicBool::new(false));
    let ctl = {
        let (s, m, stop) = (s.clone(), m.clone(), stop_control.clone());
        std::thread::spawn(move || control(s, m, stop, start))
    };

    step(me, "storm");
    std::thread::sleep(opts.storm);
    step(me, "join producers");
    stop_producers.store(true, Ordering::Relaxed);
    let mut handles = Handles::new();
    for p in producers {
        handles.extend(p.join().expect("producer panicked"));
    }
    step(me, "join control");
    stop_control.store(true, Ordering::Relaxed);
    ctl.join().expect("control thread panicked");
    while let Ok(back) = m.pending_rx.try_recv() {
        step(me, "consume hand-backs");
        consume(&mut r, back);
    }

    // The ending.
    let graceful = !matches!(opts.ending, Ending::ShutdownNow);
    if graceful && opts.resume_before_end {
        step(me, "resume all before the end");
        for k in 0..opts.keys {
            s.resume(&k);
        }
    }
    step(me, format!("ending {:?}", opts.ending));
    let mut s = Some(s);
    match opts.ending {
        Ending::Drop => {
            m.graceful.store(true, Ordering::SeqCst);
            step(me, "graceful drop: wait for the last Arc");
            let owned = unwrap_arc(s.take().unwrap());
            step(me, "graceful drop");
            drop(owned);
        }
        Ending::ShutdownAwait => {
            m.graceful.store(true, Ordering::SeqCst);
            let s = s.as_ref().unwrap();
            s.shutdown();
            step(me, "await_termination after shutdown");
            if !s.await_termination(PATIENCE) {
                m.fail(format!("shutdown: not terminated after {PATIENCE:?}"));
            } else {
                let st = s.stats();
                if st.queued != 0 || st.running != 0 {
                    m.fail(format!("terminated, but stats say {st:?}"));
                }
            }
        }
        Ending::ShutdownNow => {
            let s = s.as_ref().unwrap();
            m.stopped_now.store(true, Ordering::SeqCst);
            let back = s.shutdown_now();
            step(me, "consume shutdown_now's tasks");
            consume(&mut r, back);
            step(me, "await_termination after shutdown_now");
            if !s.await_termination(PATIENCE) {
                m.fail(format!("shutdown_now: not terminated after {PATIENCE:?}"));
            }
        }
        Ending::ShutdownTimeout(t) => {
            m.graceful.store(true, Ordering::SeqCst);
            // It may stop as shutdown_now does: cancel_key's hand-backs run after it get fresh
            // states, perhaps while the key's own is still lent to a detached worker.
            m.stopped_now.store(true, Ordering::SeqCst);
            let s = s.as_ref().unwrap();
            step(me, format!("shutdown_timeout({t:?})"));
            let _ = s.shutdown_timeout(t);
        }
    }
    loop {
        let spawned = std::mem::take(&mut *m.spawned.lock().unwrap());
        if spawned.is_empty() {
            break;
        }
        step(me, "join threads spawned by tasks");
        for t in spawned {
            t.join().expect("spawned thread panicked");
        }
    }
    while let Ok(back) = m.pending_rx.try_recv() {
        step(me, "consume late hand-backs");
        consume(&mut r, back);
    }
    if let Some(s) = s.take() {
        step(me, "drop the serializer");
        drop(unwrap_arc(s));
    }
    while let Ok(back) = m.pending_rx.try_recv() {
        step(me, "consume last hand-backs");
        consume(&mut r, back);
    }

    step(me, "wait for handles");
    if !wait_until(PATIENCE, || handles.iter().all(|(_, h)| h.is_finished())) {
        let open: Vec<_> = handles
            .iter()
            .filter(|(_, h)| !h.is_finished())
            .map(|(rec, _)| (rec.id, rec.kind, rec.key, rec.runs.load(Ordering::Acquire)))
            .collect();
        m.fail(format!(
            "{} handles unresolved after termination (id, kind, key, runs): {:?}",
            open.len(),
            &open[..open.len().min(10)]
        ));
    }
    step(me, "stop the waker thread");
    waker_stop.store(true, Ordering::SeqCst);
    waker.join().expect("waker thread panicked");

    step(me, "check");
    check(&m, handles);
    step(me, "round over");
    let v = std::mem::take(&mut *m.violations.lock().unwrap());
    watch().lock().unwrap().round = None;
    v
}

/// The accounting at the end of a round.
fn check(m: &Model, handles: Handles) {
    let recs = std::mem::take(&mut *m.recs.lock().unwrap());
    if !wait_until(PATIENCE, || {
        recs.iter().all(|r| r.drops.load(Ordering::Acquire) >= 1)
    }) {
        let leaked: Vec<_> = recs
            .iter()
            .filter(|r| r.drops.load(Ordering::Acquire) == 0)
            .map(|r| (r.id, r.kind, r.key, r.runs.load(Ordering::Acquire)))
            .collect();
        m.fail(format!(
            "{} tasks never dropped (id, kind, key, runs): {:?}",
            leaked.len(),
            &leaked[..leaked.len().min(10)]
        ));
    }
    let all_released = wait_until(PATIENCE, || {
        m.keys.iter().all(|k| {
            let st = k.states.lock().unwrap();
            st.inits == st.releases && st.alive.is_empty()
        })
    });
    if !all_released {
        for (i, k) in m.keys.iter().enumerate() {
            let st = k.states.lock().unwrap();
            if st.inits != st.releases || !st.alive.is_empty() {
                m.fail(format!(
                    "key {i}: {} states made, {} released, alive (generation, ran): {:?}",
                    st.inits, st.releases, st.alive
                ));
            }
        }
    }

    let timeout_ending = matches!(m.opts.ending, Ending::ShutdownTimeout(_));
    let stopped_now = m.stopped_now.load(Ordering::SeqCst) || timeout_ending;
    let graceful = m.graceful.load(Ordering::SeqCst);
    // Why an accepted task may not have run.
    let unrun_excuse = |rec: &Rec| -> Option<&'static str> {
        if rec.harness_dropped.load(Ordering::Acquire) {
            Some("handed back and dropped")
        } else if timeout_ending {
            Some("cancelled by shutdown_timeout")
        } else if graceful && m.key(rec.key).ever_paused.load(Ordering::SeqCst) {
            Some("paused key at shutdown")
        } else {
            None
        }
    };
    let mut handled = vec![false; recs.len()];
    for (rec, h) in handles {
        handled[rec.id as usize] = true;
        let runs = rec.runs.load(Ordering::Acquire);
        let completed = rec.completed.load(Ordering::Acquire);
        let what = format!(
            "task {} ({:?}, key {}, seq {}, panics {}, runs {runs}, completed {completed}, \
             handed back and run {}, handed back and dropped {})",
            rec.id,
            rec.kind,
            rec.key,
            rec.seq,
            rec.panics,
            rec.handed_run.load(Ordering::Acquire),
            rec.harness_dropped.load(Ordering::Acquire),
        );
        if !h.is_finished() {
            continue; // reported above
        }
        let res = h.join();
        let outcome = match &res {
            Ok(v) => format!("Ok({v})"),
            Err(e) => format!("{e:?}"),
        };
        let ok = match res {
            Ok(v) => v == rec.id && runs == 1 && completed && !rec.panics,
            Err(TaskError::Panicked(p)) => {
                p.into_panic().is::<Boom>()
                    && ((runs == 1 && completed && rec.panics)
                        || (runs == 0
                            && rec.kind.is_state()
                            && m.key(rec.key).states.lock().unwrap().init_panics > 0))
            }
            Err(TaskError::Cancelled) => {
                (runs == 0 && unrun_excuse(&rec).is_some())
                    || (rec.kind.is_future() && runs == 1 && !completed && stopped_now)
            }
            Err(TaskError::Superseded) => rec.kind == Kind::Latest && runs == 0,
        };
        if !ok {
            m.fail(format!(
                "{what}: handle resolved {outcome}; key ever paused {}",
                m.key(rec.key).ever_paused.load(Ordering::SeqCst)
            ));
        }
    }
    for rec in &recs {
        let runs = rec.runs.load(Ordering::Acquire);
        // Drops: twice is reported by the token when it happens, never above (a leak).
        if rec.rejected.load(Ordering::Acquire) {
            if runs != 0 || handled[rec.id as usize] {
                m.fail(format!("task {}: refused, yet ran or has a handle", rec.id));
            }
            continue;
        }
        if !handled[rec.id as usize] && runs == 0 && unrun_excuse(rec).is_none() {
            m.fail(format!(
                "task {} ({:?}, key {}, seq {}): accepted, never ran, never handed back \
                 (lost); ending {:?}, shutdown_now called {}",
                rec.id,
                rec.kind,
                rec.key,
                rec.seq,
                m.opts.ending,
                m.stopped_now.load(Ordering::SeqCst)
            ));
        }
    }
}

/// Rounds until `KEYSERIAL_CHAOS_SECS` have passed (see the file's docs).
#[test]
fn chaos_rounds() {
    quiet_injected_panics();
    let secs = env_u64("KEYSERIAL_CHAOS_SECS").unwrap_or(20);
    let keep_going = env_u64("KEYSERIAL_CHAOS_KEEP_GOING").unwrap_or(0) != 0;
    let verbose = env_u64("KEYSERIAL_CHAOS_VERBOSE").unwrap_or(0) != 0;
    let mut seed = env_u64("KEYSERIAL_CHAOS_SEED").unwrap_or_else(|| {
        if cfg!(miri) {
            return 0x5EED; // no clock under Miri's isolation
        }
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let start = Instant::now();
    let mut rounds = 0u64;
    let mut failures = Vec::new();
    loop {
        let opts = Opts::random(seed);
        if verbose {
            eprintln!("chaos round {} seed {seed:#x}: {opts:?}", rounds + 1);
        }
        let t = Instant::now();
        let violations = round(&opts);
        rounds += 1;
        eprintln!(
            "chaos round {rounds} seed {seed:#x}: {} in {:?}",
            if violations.is_empty() {
                "ok"
            } else {
                "FAILED"
            },
            t.elapsed()
        );
        if !violations.is_empty() {
            let report = format!(
                "chaos: round {rounds} failed; replay with KEYSERIAL_CHAOS_SEED={seed:#x} \
                 KEYSERIAL_CHAOS_SECS=0\n{opts:#?}\n{} violations, first ones:\n  {}",
                violations.len(),
                violations[..violations.len().min(20)].join("\n  ")
            );
            if keep_going {
                eprintln!("{report}");
                failures.push((seed, violations[0].clone()));
            } else {
                panic!("{report}");
            }
        }
        seed = Rng::new(seed).next();
        let enough = if cfg!(miri) {
            rounds >= 2
        } else {
            start.elapsed() >= Duration::from_secs(secs)
        };
        if enough {
            break;
        }
    }
    eprintln!(
        "chaos: {rounds} rounds in {:?}, {} failed",
        start.elapsed(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "chaos: {} of {rounds} rounds failed: {failures:#?}",
        failures.len()
    );
}
