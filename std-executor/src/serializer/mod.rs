//! The serializer: the public face of keyserial (the type, its construction, its submit
//! methods and its counters).
//!
//! Rooms: [`admit`] (how a submission is admitted: capacity, the claim, the push, and the
//! debug self-wait check's origin) and [`shutdown`] (the shutdown family, termination and
//! `Drop`).

mod admit;
mod keys;
mod shutdown;

use std::fmt;
use std::hash::Hash;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crossbeam_deque::Worker;

use crate::error::{RejectReason, Rejected};
use crate::handle::TaskHandle;
use crate::key::Runnable;
use crate::lane_task::LaneTask;
use crate::pending::PendingTask;
use crate::semaphore::Semaphore;
use crate::shared::{Config, Shared};
use crate::slot::Owned;
use crate::stats::Stats;
use crate::sync::Parker;
use crate::task::{Detached, Job, Kind};
use crate::worker::{self};

/// Runs tasks **in order per key and in parallel across keys** on a small pool of OS threads.
///
/// Tasks submitted with the same key run one at a time, in the order their submissions returned
/// `Ok`; tasks of different keys run in parallel, and a slow or blocked task delays only its own
/// key. Everything a task of a key did (every write, to any memory) happens-before the key's
/// next task starts, on whatever thread it runs: a key's tasks may share plain data, as if one
/// thread ran them in turn (as the per-key state of
/// [`key_state`](crate::Builder::key_state) does). Any number of keys may be used; a key that goes quiet is released as soon as it drains,
/// or after [`key_idle_timeout`](crate::Builder::key_idle_timeout).
///
/// Two ways to lose that order or that progress (see the [crate docs](crate)): a closure that
/// returns a future (`|| async { .. }`) only *creates* the future, whose body then runs out of
/// order; and a task that waits for a later task of its own key never finishes. Share a
/// serializer by reference (`std::thread::scope`) or through an `Arc`.
///
/// # Panics in user code
///
/// A panic in a task resolves its handle [`Panicked`](crate::TaskError::Panicked) (an
/// [`execute`](Self::execute) task's is counted in [`Stats::panicked`]); the worker and the key
/// go on. The same holds for every other piece of user code the serializer calls:
///
/// - **`Drop`s**: a task's output dropped because its handle is gone, a capture dropped because
///   its task was superseded, cancelled or handed back and dropped, a panic payload, a waker,
///   a semaphore's granted callback. A panic there is caught and reported only by the panic
///   hook's message; the handle resolves as it would have (the task's value, `Superseded`,
///   `Cancelled`).
/// - **The key's `Hash`, `Eq` and `Clone`**, on the submitting thread: the panic reaches the
///   caller of `submit` (as with a `HashMap`), and nothing is admitted or kept (no capacity
///   slot, no distinct claim).
/// - **The key's `Hash`, `Eq` and `Clone`** on a worker (a worker hashes a key again when it
///   takes the key's task, and looks a key up when the key has a chain: a permit wait, a
///   backlog), or when [`shutdown_now`](Self::shutdown_now) clones a key to hand its task
///   back: that task's handle resolves `Panicked` with the key's payload (counted in
///   `completed` and `panicked`; a handed-back one is not in `shutdown_now`'s list), and
///   everything else goes on.
/// - **An inconsistent key** (a `Hash` that does not agree with `Eq`, or with itself over
///   time): as for a `HashMap`, the key's order and its exclusion mean nothing any more, but
///   every task still runs once or has its handle resolved. Not contained: a key whose `Drop`
///   panics when the serializer frees its state.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use keyserial::Serializer;
///
/// static ARMED: AtomicBool = AtomicBool::new(false);
/// struct Loud;
/// impl Drop for Loud {
///     fn drop(&mut self) {
///         if ARMED.load(Ordering::SeqCst) { panic!("dropped loudly"); }
///     }
/// }
/// # std::panic::set_hook(Box::new(|_| {}));
/// let s: Serializer<u8> = Serializer::new();
/// ARMED.store(true, Ordering::SeqCst);
/// drop(s.submit(1, || Loud).unwrap()); // nobody wants the output: dropped on the worker
/// assert_eq!(s.submit(1, || "still here").unwrap().join().unwrap(), "still here");
/// ARMED.store(false, Ordering::SeqCst);
/// ```
///
/// # Dropping
///
/// Dropping the serializer shuts it down gracefully, as [`shutdown`](Self::shutdown) does: queued
/// tasks still run, and `drop` returns once every worker thread has exited and been joined. So
/// it waits, without bound, for the tasks that are running and queued. Exceptions:
///
/// - after [`shutdown_now`](Self::shutdown_now), nothing queued is left to run; `drop` waits
///   for the tasks still running, without bound, unless a bounded wait has already given up:
/// - if `shutdown_now` was called and [`await_termination`](Self::await_termination) returned
///   `false` after `shutdown` (or [`shutdown_timeout`](Self::shutdown_timeout) returned `false`,
///   which includes both), `drop` joins the threads that have exited and **detaches** the rest
///   without waiting: each finishes the task it is in (its handle resolves then), starts nothing
///   more and exits;
/// - dropped inside one of its own tasks, `drop` cannot wait for its own thread: it shuts down
///   and returns, and the workers finish on their own;
/// - (Cargo feature `tokio`) dropped on a thread inside a tokio runtime (a task, `block_on`,
///   `spawn_blocking`), `drop` never blocks that thread (the queued futures may need it): it
///   shuts down gracefully and returns, and the workers finish the queued tasks in the
///   background, then exit. Nothing waits for them: to be sure they ran (before `main` returns,
///   or before the runtime shuts down, after which a queued future that needs its timer fails),
///   call [`shutdown`](Self::shutdown) and await [`terminated`](Self::terminated) first.
///
/// To bound the wait, use `shutdown_timeout` before dropping.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use keyserial::Serializer;
///
/// let s: Serializer<&str> = Serializer::new();
/// let log = Arc::new(Mutex::new(Vec::new()));
/// for i in 0..5 {
///     let log = log.clone();
///     s.execute("alice", move || log.lock().unwrap().push(i)).unwrap();
/// }
/// s.submit("bob", || ()).unwrap().join().unwrap();
/// s.shutdown();
/// assert!(s.await_termination(std::time::Duration::from_secs(10)));
/// assert_eq!(*log.lock().unwrap(), [0, 1, 2, 3, 4]); // alice's tasks, in order
/// ```
pub struct Serializer<K, S = ()>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    shared: Arc<Shared<K>>,
    /// A bounded wait (`await_termination`, `shutdown_timeout`) gave up after shutdown; with
    /// `shutdown_now` called too, `Drop` detaches the threads still inside a task.
    gave_up: AtomicBool,
    /// The type of its keys' state (`Builder::key_state`; `()` without).
    _state: std::marker::PhantomData<fn() -> S>,
}

#[cfg(test)]
impl<K, S> Serializer<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    /// The lane a key's submissions go through (tests that need keys sharing a lane).
    pub(crate) fn lane_of(&self, key: &K) -> usize {
        self.shared.lanes().index_of(self.shared.hash_of(key))
    }
}

impl<K, S> fmt::Debug for Serializer<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Serializer")
            .field("stats", &self.stats())
            .finish()
    }
}

impl<K> Default for Serializer<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

/// How a submission behaves when the serializer is at capacity.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Block,
    Try,
}

impl<K, S> Serializer<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    /// Starts a serializer with the checked settings `config` and queue bound `capacity`
    /// (`Builder::build`).
    pub(crate) fn start(
        config: Config,
        capacity: Option<usize>,
        labeler: crate::trace::Labeler<K>,
        state: crate::state::StateHooks<K>,
    ) -> std::io::Result<Self> {
        let (workers, max_workers) = (config.workers, config.max_workers);
        let parkers: Vec<Parker> = (0..max_workers).map(|_| Parker::new()).collect();
        let unparkers = parkers.iter().map(|p| p.unparker().clone()).collect();
        let deques: Vec<Worker<Runnable<K>>> =
            (0..max_workers).map(|_| Worker::new_fifo()).collect();
        let owned = deques
            .into_iter()
            .zip(parkers)
            .map(|(deque, parker)| Owned { deque, parker })
            .collect();
        let shared = Arc::new(Shared::new(
            config, capacity, unparkers, owned, labeler, state,
        ));
        let serializer = Serializer {
            shared,
            gave_up: AtomicBool::new(false),
            _state: std::marker::PhantomData,
        };
        for i in 0..workers {
            worker::spawn(&serializer.shared, i)?;
        }
        if max_workers > workers {
            crate::supervisor::spawn(&serializer.shared)?;
        }
        Ok(serializer)
    }

    /// Submits `task` for `key` and returns a handle to its result. Blocks while the serializer
    /// is at capacity (never when called from inside one of its own tasks).
    ///
    /// # Errors
    /// `Rejected { reason: Shutdown, task }` after [`shutdown`](Self::shutdown).
    ///
    /// ```
    /// let s: keyserial::Serializer<u32> = keyserial::Serializer::new();
    /// let h = s.submit(7, || 6 * 7).unwrap();
    /// assert_eq!(h.join().unwrap(), 42);
    /// ```
    pub fn submit<F, T>(&self, key: K, task: F) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.submit_joined(Some(key), task, Kind::Plain, Mode::Block, None)
    }

    /// Like [`submit`](Self::submit) but never blocks: at capacity the task comes back in
    /// `Rejected { reason: Full, task }`.
    ///
    /// ```
    /// use keyserial::{Builder, RejectReason};
    /// let s = Builder::<u32>::new().workers(1).capacity(1).build().unwrap();
    /// let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// let blocker = s.submit(1, move || { rx.recv().ok(); }).unwrap();
    /// while s.stats().running == 0 { std::thread::yield_now(); }
    /// let queued = s.try_submit(1, || ()).unwrap();              // fills the one slot
    /// let full = s.try_submit(2, || ()).unwrap_err();
    /// assert_eq!(full.reason, RejectReason::Full);
    /// tx.send(()).unwrap();
    /// blocker.join().unwrap();
    /// queued.join().unwrap();
    /// ```
    pub fn try_submit<F, T>(&self, key: K, task: F) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.submit_joined(Some(key), task, Kind::Plain, Mode::Try, None)
    }

    /// Submits `task` for `key` without a handle (the cheapest submission). Blocks while at
    /// capacity, like [`submit`](Self::submit). A panic in the task is counted in
    /// [`Stats::panicked`] and the key goes on.
    ///
    /// ```
    /// let s: keyserial::Serializer<u32> = keyserial::Serializer::new();
    /// s.execute(1, || println!("hello from key 1")).unwrap();
    /// ```
    pub fn execute<F>(&self, key: K, task: F) -> Result<(), Rejected<F>>
    where
        F: FnOnce() + Send + 'static,
    {
        let mut slot = Some(task);
        let sh = &*self.shared;
        let origin = crate::trace::origin(sh.labeler(), Some(&key), |k| sh.hash_of(k));
        self.admit(Some(key), Kind::Plain, Mode::Block, |_| {
            LaneTask::execute(crate::trace::wrap(origin, slot.take().expect("built once")))
        })
        .map_err(|reason| Rejected {
            reason,
            task: slot.take().expect("refused before the task was built"),
        })
    }

    /// Submits `task` for `key` with the key's state (see
    /// [`Builder::key_state`](crate::Builder::key_state)): the task gets `&mut S`, made by
    /// `init(&key)` just before the key's first state task runs, the same value for every later
    /// state task of the key, in the key's order (interleaved in order with its plain tasks,
    /// which do not see it). No lock: the key's tasks never overlap. On a serializer without
    /// `key_state`, `S` is `()`. Blocks while the serializer is at capacity, as
    /// [`submit`](Self::submit) does.
    ///
    /// A handed-back state task (from [`shutdown_now`](Self::shutdown_now) or
    /// [`cancel_key`](Self::cancel_key)) runs, when its [`PendingTask`] is run, against its
    /// key's state (see [`PendingTask::run`] for the details). Futures do not
    /// take state: a state task can hand what a future needs to `submit_async` (clone it out).
    ///
    /// # Errors
    /// As [`submit`](Self::submit).
    ///
    /// ```
    /// use keyserial::Builder;
    /// let s = Builder::<&str>::new().key_state(|_| Vec::new()).build().unwrap();
    /// s.submit_with_state("log", |v: &mut Vec<u32>| v.push(1)).unwrap();
    /// s.execute("log", || ()).unwrap(); // a plain task, in the same order
    /// let seen = s.submit_with_state("log", |v: &mut Vec<u32>| { v.push(2); v.clone() });
    /// assert_eq!(seen.unwrap().join().unwrap(), [1, 2]);
    /// ```
    pub fn submit_with_state<F, T>(&self, key: K, task: F) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce(&mut S) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.submit_job(Some(key), task, Kind::State, Mode::Block, None, |f, _| {
            move || crate::state::with_current(f)
        })
    }

    /// [`submit_with_state`](Self::submit_with_state) that never blocks: at capacity it hands
    /// the task back with [`RejectReason::Full`].
    ///
    /// ```
    /// use keyserial::Builder;
    /// let s = Builder::<u8>::new().key_state(|_| 0u8).build().unwrap();
    /// let h = s.try_submit_with_state(1, |n: &mut u8| { *n += 1; *n }).unwrap();
    /// assert_eq!(h.join().unwrap(), 1);
    /// ```
    pub fn try_submit_with_state<F, T>(&self, key: K, task: F) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce(&mut S) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.submit_job(Some(key), task, Kind::State, Mode::Try, None, |f, _| {
            move || crate::state::with_current(f)
        })
    }

    /// Keep-latest coalescing: if the key's immediately preceding submission is a
    /// `submit_latest` task that has not started, that task is replaced (its handle resolves
    /// [`TaskError::Superseded`](crate::TaskError::Superseded)) and this one takes its place.
    /// The newest always runs.
    ///
    /// "Not started" means "not yet taken by a worker": a worker takes a pending latest task
    /// (and from then on it cannot be replaced) a little before it runs it, so a predecessor
    /// taken just before this call returned may still run, a few microseconds after it. A task
    /// it replaces is dropped on the calling thread, its captures' `Drop` included (a panic
    /// there is contained: the replaced handle still resolves `Superseded`).
    ///
    /// ```
    /// use keyserial::{Builder, TaskError};
    /// let s = Builder::<&str>::new().workers(1).build().unwrap();
    /// let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// let gate = s.submit("ui", move || { rx.recv().ok(); }).unwrap();
    /// let old = s.submit_latest("ui", || "frame 1").unwrap();
    /// let new = s.submit_latest("ui", || "frame 2").unwrap();
    /// tx.send(()).unwrap();
    /// gate.join().unwrap();
    /// assert!(matches!(old.join(), Err(TaskError::Superseded)));
    /// assert_eq!(new.join().unwrap(), "frame 2");
    /// ```
    pub fn submit_latest<F, T>(&self, key: K, task: F) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.submit_joined(Some(key), task, Kind::Latest, Mode::Block, None)
    }

    /// Keep-first: if the key already has a `submit_distinct` task queued and not started, this
    /// one is refused with `Rejected { reason: Duplicate, task }`; once that task starts, a new
    /// one is accepted.
    ///
    /// ```
    /// use keyserial::{Builder, RejectReason};
    /// let s = Builder::<&str>::new().workers(1).build().unwrap();
    /// let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// let gate = s.submit("index", move || { rx.recv().ok(); }).unwrap();
    /// let first = s.submit_distinct("index", || "rebuilt").unwrap();
    /// let dup = s.submit_distinct("index", || "rebuilt again").unwrap_err();
    /// assert_eq!(dup.reason, RejectReason::Duplicate);
    /// tx.send(()).unwrap();
    /// gate.join().unwrap();
    /// assert_eq!(first.join().unwrap(), "rebuilt");
    /// ```
    pub fn submit_distinct<F, T>(&self, key: K, task: F) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.submit_job(
            Some(key),
            task,
            Kind::Distinct,
            Mode::Block,
            None,
            |f, claim| {
                let claim = claim.expect("a distinct task has its claim");
                move || {
                    // Started: a new distinct task of the key is accepted from now on.
                    drop(claim);
                    f()
                }
            },
        )
    }

    /// Submits a task that starts only once it holds `n` permits of `sem`, holds them while it
    /// runs and releases them when it ends (also on panic). No worker blocks while it waits: the
    /// key's chain is parked until the grant, later tasks of the key wait behind it, and other
    /// keys keep running.
    ///
    /// # Errors
    /// `TooManyPermits` if `n` exceeds the semaphore's capacity; `Shutdown` after shutdown.
    ///
    /// ```
    /// use keyserial::{Semaphore, Serializer};
    /// let s: Serializer<u32> = Serializer::new();
    /// let db = Semaphore::new(2); // at most two connections
    /// let h = s.submit_with_permits(1, &db, 2, || "query done").unwrap();
    /// assert_eq!(h.join().unwrap(), "query done");
    /// assert_eq!(db.available(), 2);
    /// ```
    pub fn submit_with_permits<F, T>(
        &self,
        key: K,
        sem: &Semaphore,
        n: usize,
        task: F,
    ) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        if n > sem.capacity() {
            self.shared.count_rejected();
            return Err(Rejected {
                reason: RejectReason::TooManyPermits,
                task,
            });
        }
        self.submit_joined(
            Some(key),
            task,
            Kind::Permits,
            Mode::Block,
            Some((sem.clone(), n)),
        )
    }

    /// Submits a future as a task of `key`: it runs in the key's order like a closure (the
    /// key's next task, closure or future, starts only after it completes), polled on the
    /// serializer's workers. While it is pending **no worker is held**: the key stays owned and
    /// its waker, from any thread and any number of times, puts the key back on a ready queue.
    /// A panic in `poll` resolves the handle `Panicked` and the key goes on. Blocks while at
    /// capacity, like [`submit`](Self::submit).
    ///
    /// `shutdown` lets started futures finish; [`shutdown_now`](Self::shutdown_now) hands back
    /// futures not yet polled (their [`PendingTask::run`] drives them to completion on the
    /// calling thread) and drops started ones, whose handles resolve
    /// [`Cancelled`](crate::TaskError::Cancelled). For tokio's timers and sockets inside the
    /// future, give the builder a runtime handle (Cargo feature `tokio`,
    /// `Builder::tokio_handle`); a handed-back future's `run` happens outside it (enter it
    /// first, `Handle::enter`, and call `run` off the runtime's own threads: it parks the
    /// calling thread while the future waits). A waker the future hands out keeps a little of
    /// the serializer's memory (the task's allocation, and the shared state it points to) until
    /// the waker is dropped; waking it after the task ended does nothing.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use keyserial::Serializer;
    ///
    /// let s: Serializer<&str> = Serializer::new();
    /// let log = Arc::new(Mutex::new(Vec::new()));
    /// let (l1, l2) = (log.clone(), log.clone());
    /// let a = s.submit_async("alice", async move { l1.lock().unwrap().push("async first") }).unwrap();
    /// let b = s.submit("alice", move || l2.lock().unwrap().push("then the closure")).unwrap();
    /// b.join().unwrap();
    /// a.join().unwrap();
    /// assert_eq!(*log.lock().unwrap(), ["async first", "then the closure"]);
    /// ```
    ///
    /// # Errors
    /// `Rejected { reason: Shutdown, task }` after [`shutdown`](Self::shutdown), with the future.
    pub fn submit_async<Fut>(
        &self,
        key: K,
        fut: Fut,
    ) -> Result<TaskHandle<Fut::Output>, Rejected<Fut>>
    where
        Fut: std::future::Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        self.submit_future(key, fut, Mode::Block)
    }

    /// Like [`submit_async`](Self::submit_async) but never blocks: at capacity the future comes
    /// back in `Rejected { reason: Full, task }`.
    ///
    /// ```
    /// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
    /// let h = s.try_submit_async(1, async { 6 * 7 }).unwrap();
    /// assert_eq!(h.join().unwrap(), 42);
    /// ```
    pub fn try_submit_async<Fut>(
        &self,
        key: K,
        fut: Fut,
    ) -> Result<TaskHandle<Fut::Output>, Rejected<Fut>>
    where
        Fut: std::future::Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        self.submit_future(key, fut, Mode::Try)
    }

    /// Submits a future for `key` without a handle: [`submit_async`](Self::submit_async) as
    /// [`execute`](Self::execute) is to [`submit`](Self::submit) (the cheapest way to run a
    /// future in its key's order; one allocation per future). Blocks while at capacity. A panic
    /// in `poll` is counted in [`Stats::panicked`] and the key goes on.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    /// let s: keyserial::Serializer<u32> = keyserial::Serializer::new();
    /// let n = Arc::new(AtomicU32::new(0));
    /// for _ in 0..3 {
    ///     let n = n.clone();
    ///     s.execute_async(1, async move { n.fetch_add(1, Ordering::Relaxed); }).unwrap();
    /// }
    /// s.shutdown();
    /// assert!(s.await_termination(std::time::Duration::from_secs(10)));
    /// assert_eq!(n.load(Ordering::Relaxed), 3);
    /// ```
    ///
    /// # Errors
    /// `Rejected { reason: Shutdown, task }` after [`shutdown`](Self::shutdown), with the future.
    pub fn execute_async<Fut>(&self, key: K, fut: Fut) -> Result<(), Rejected<Fut>>
    where
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.execute_future(key, fut)
    }

    /// Runs an unkeyed task: never serialized with anything. Blocks while at capacity.
    ///
    /// ```
    /// let s: keyserial::Serializer<u32> = keyserial::Serializer::new();
    /// assert_eq!(s.spawn(|| 1 + 1).unwrap().join().unwrap(), 2);
    /// ```
    pub fn spawn<F, T>(&self, task: F) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.submit_joined(None, task, Kind::Plain, Mode::Block, None)
    }

    /// A snapshot of the counters (cheap: a few relaxed loads per worker slot).
    ///
    /// ```
    /// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
    /// s.submit(1, || ()).unwrap().join().unwrap();
    /// let st = s.stats();
    /// assert_eq!(st.completed, 1);
    /// assert_eq!(st.panicked, 0);
    /// ```
    pub fn stats(&self) -> Stats {
        let sh = &*self.shared;
        let t = sh.tally();
        Stats {
            workers: sh.lifecycle().live_workers(),
            // With a key budget, the keys it counts (`key_budget.rs`): exact, where the
            // table's length is a sum of sharded counters read one after another.
            active_keys: sh.budget().map_or_else(|| sh.table().len(), |b| b.live()),
            queued: t
                .admitted
                .saturating_sub(t.started + t.dropped + t.handed_back) as usize,
            running: t.started.saturating_sub(t.completed) as usize,
            completed: t.completed,
            panicked: t.panicked,
            rejected: t.rejected,
        }
    }
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Serializer<String>>();
    fn send<T: Send>() {}
    send::<PendingTask<String>>();
    send::<TaskHandle<String>>();
    let _ = |j: Detached<fn()>| j.run(None, &|_| {});
}
