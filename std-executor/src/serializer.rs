//! The serializer: the public face of keyserial.
//!
//! # Admission
//!
//! A submission is *admitted* (it will run or be handed back) at one atomic step, so that
//! `shutdown` can say which submissions got in:
//!
//! - **A keyed task** (`execute`, `submit`, `submit_distinct`, `submit_with_permits`) by the
//!   reserving CAS of its slot in its key's lane (`core::fifo`): no other shared word is
//!   written. `shutdown` closes every lane's FIFO (a `fetch_or` of a bit of its tail position),
//!   so each such CAS comes before the close (the task is in the lane, counted by the lane's
//!   position) or fails and reads the bit (the task is handed back untouched, and a distinct
//!   claim is released).
//! - **An unkeyed task, and a `submit_latest` task** (which may replace its key's pending one
//!   instead of pushing) by the gate (`gate.rs`): `enter` before, `admit` after. A latest task
//!   that pushed leaves the gate uncounted (its lane counts it).
//!
//! `shutdown` closes the gate, waits for the submissions inside it to finish (their pushes
//! cannot be refused: no lane is closed yet), then closes the lanes and only then says so
//! (`Lanes::is_closed`, Release). Admitted = the gate's count + the lanes' positions. A worker
//! leaves on shutdown only after it has seen the lanes closed (Acquire): every admitted keyed
//! task is then visible to its emptiness checks (a reserved slot counts), so none is left
//! behind.

use std::fmt;
use std::hash::Hash;
use std::ptr::NonNull;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_deque::Worker;
use keyserial_core::lane::Phase as LanePhase;

use crate::builder::Builder;
use crate::capacity::Reservation;
use crate::claims::Claim;
use crate::deferral::Deferral;
use crate::error::{BuildError, RejectReason, Rejected};
use crate::handle::{JoinState, OriginCheck, TaskHandle};
use crate::key::{KeyEntry, Runnable};
use crate::lane_task::Item;
use crate::lane_task::LaneTask;
use crate::lanes::STOPPER;
use crate::latest_cells::Offered;
use crate::pending::PendingTask;
use crate::phase::Stopped;
use crate::semaphore::Semaphore;
use crate::shared::{Config, Shared};
use crate::slot::Owned;
use crate::stats::Stats;
use crate::sync::{lock, Ordering, Parker};
use crate::task::{Abandon, Detached, Job, Joined, Kind, TaskRef};
use crate::worker::{self, drain_chain};

/// Runs tasks **in order per key and in parallel across keys** on a small pool of OS threads.
///
/// Tasks submitted with the same key run one at a time, in the order their submissions returned
/// `Ok`; tasks of different keys run in parallel, and a slow or blocked task delays only its own
/// key. Any number of keys may be used; a key that goes quiet is released as soon as it drains,
/// or after [`key_idle_timeout`](Builder::key_idle_timeout).
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
///   and returns, and the workers finish on their own.
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
pub struct Serializer<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    shared: Arc<Shared<K>>,
    /// A bounded wait (`await_termination`, `shutdown_timeout`) gave up after shutdown; with
    /// `shutdown_now` called too, `Drop` detaches the threads still inside a task.
    gave_up: AtomicBool,
}

#[cfg(test)]
impl<K> Serializer<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// The lane a key's submissions go through (tests that need keys sharing a lane).
    pub(crate) fn lane_of(&self, key: &K) -> usize {
        self.shared.lanes.index_of(self.shared.hash_of(key))
    }
}

impl<K> fmt::Debug for Serializer<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
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

impl<K> Serializer<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A serializer with the default settings (one worker per available core).
    ///
    /// # Panics
    /// If the operating system refuses to start the worker threads (see [`Builder::build`] for
    /// a `Result` instead).
    ///
    /// ```
    /// let s: keyserial::Serializer<u64> = keyserial::Serializer::new();
    /// assert!(s.stats().workers >= 1);
    /// ```
    pub fn new() -> Self {
        Builder::new()
            .build()
            .expect("keyserial: could not start worker threads")
    }

    /// A [`Builder`] to configure a serializer.
    ///
    /// ```
    /// let s = keyserial::Serializer::<u64>::builder().workers(2).build().unwrap();
    /// assert_eq!(s.stats().workers, 2);
    /// ```
    pub fn builder() -> Builder<K> {
        Builder::new()
    }

    pub(crate) fn start(
        b: Builder<K>,
        workers: usize,
        max_workers: usize,
    ) -> std::io::Result<Self> {
        let parkers: Vec<Parker> = (0..max_workers).map(|_| Parker::new()).collect();
        let unparkers = parkers.iter().map(|p| p.unparker().clone()).collect();
        let deques: Vec<Worker<Runnable<K>>> =
            (0..max_workers).map(|_| Worker::new_fifo()).collect();
        let config = Config {
            workers,
            max_workers,
            worker_keep_alive: b.worker_keep_alive,
            key_idle_timeout: b.key_idle_timeout,
            fairness_budget: b.fairness_budget,
            thread_name: b.thread_name,
        };
        let owned = deques
            .into_iter()
            .zip(parkers)
            .map(|(deque, parker)| Owned { deque, parker })
            .collect();
        let shared = Arc::new(Shared::new(config, b.capacity, unparkers, owned));
        let serializer = Serializer {
            shared,
            gave_up: AtomicBool::new(false),
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
        self.admit(Some(key), Kind::Plain, Mode::Block, |_| {
            LaneTask::execute(slot.take().expect("built once"))
        })
        .map_err(|reason| Rejected {
            reason,
            task: slot.take().expect("refused before the task was built"),
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
            self.shared.rejected.fetch_add(1, Ordering::Relaxed);
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

    fn submit_joined<F, T>(
        &self,
        key: Option<K>,
        task: F,
        kind: Kind,
        mode: Mode,
        permits: Option<(Semaphore, usize)>,
    ) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        debug_assert!(kind != Kind::Distinct, "distinct tasks carry their claim");
        self.submit_job(key, task, kind, mode, permits, |f, _| f)
    }

    /// `submit_joined` for any job closure `G` made from the user's `F` and, for a distinct
    /// task, its key's claim (`wrap`, called only once the task is sure to be admitted).
    fn submit_job<F, T, G>(
        &self,
        key: Option<K>,
        task: F,
        kind: Kind,
        mode: Mode,
        permits: Option<(Semaphore, usize)>,
        wrap: impl FnOnce(F, Option<Claim<K>>) -> G,
    ) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        G: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let mut slot = Some(task);
        let mut handle = None;
        let mut permits = permits;
        let mut origin = Some(self.origin_of(key.as_ref(), kind));
        self.admit(key, kind, mode, |claim| {
            let state = JoinState::new(origin.take().unwrap_or_default());
            handle = Some(TaskHandle::new(state.clone()));
            let job = Joined {
                f: wrap(slot.take().expect("built once"), claim),
                state,
            };
            LaneTask::node(TaskRef::new(job, kind, permits.take()))
        })
        .map(|()| handle.take().expect("handle made with the task"))
        .map_err(|reason| Rejected {
            reason,
            task: slot.take().expect("refused before the task was built"),
        })
    }

    /// The one admission path: capacity, then the admission itself (see "Admission" in the
    /// module docs), the distinct claim, the push. `build` makes the task (given its claim, for
    /// a distinct task); it runs only once the task is sure to be accepted, so a refusal hands
    /// back the untouched closure, and it runs no user code (it is called with a lane slot
    /// reserved, which must be filled).
    ///
    /// The key's `Hash`, `Eq` and `Clone` run here, on the caller's thread, before anything is
    /// admitted: a panic in them reaches the caller, and the capacity slot (a
    /// [`Reservation`]), a distinct claim and a gate ticket are all given back as it unwinds.
    fn admit(
        &self,
        key: Option<K>,
        kind: Kind,
        mode: Mode,
        build: impl FnOnce(Option<Claim<K>>) -> LaneTask,
    ) -> Result<(), RejectReason> {
        let sh = &*self.shared;
        let refuse = |reason| {
            sh.rejected.fetch_add(1, Ordering::Relaxed);
            Err(reason)
        };
        if sh.shutdown.load(Ordering::Acquire) {
            return refuse(RejectReason::Shutdown);
        }
        let reservation = match &sh.capacity {
            None => Reservation::unlimited(),
            Some(cap) => {
                let ok = if worker::current_worker::<K>(sh.id).is_some() {
                    cap.force_reserve();
                    true
                } else if mode == Mode::Try {
                    cap.try_reserve()
                } else {
                    cap.reserve(|| sh.gate.is_closed() || sh.shutdown.load(Ordering::Acquire))
                };
                if !ok {
                    let shut = sh.shutdown.load(Ordering::Acquire);
                    let reason = if shut {
                        RejectReason::Shutdown
                    } else {
                        RejectReason::Full
                    };
                    return refuse(reason);
                }
                Reservation::taken(cap)
            }
        };
        let Some(key) = key else {
            // An unkeyed task is admitted by the gate.
            let Some(ticket) = sh.gate.enter() else {
                return refuse(RejectReason::Shutdown);
            };
            let local = worker::current_worker::<K>(sh.id).map(|(_, d)| d);
            sh.schedule(Runnable::Task(build(None).into_task()), local);
            reservation.keep();
            ticket.admit();
            return Ok(());
        };
        let hash = sh.hash_of(&key);
        if kind == Kind::Latest {
            return self.admit_latest(key, hash, build, reservation, refuse);
        }
        // Keep-first: a `submit_distinct` claims its key until its task starts (`claims.rs`).
        let claim = if kind == Kind::Distinct {
            match sh.claims.claim(&key, hash) {
                Some(claim) => Some(claim),
                None => return refuse(RejectReason::Duplicate),
            }
        } else {
            None
        };
        // Every keyed task enters through its key's lane, in submission order (`lanes.rs`),
        // and is admitted by the reservation of its slot. The item is built in that slot once
        // reserved (`Fifo::try_push_tagged`): key clones and hashing, which run user code that
        // may panic, come before. (The lane's owner hashes the key again when it pops it,
        // `Lane::pop`.)
        let mut parts = Some((key, claim));
        let pushed = sh.push_keyed(hash, || {
            let (key, claim) = parts.take().expect("built once");
            Item {
                key,
                hash,
                task: build(claim),
            }
        });
        if pushed.is_err() {
            // The key and the claim (released as it drops) go back with the refusal.
            drop(parts);
            return refuse(RejectReason::Shutdown);
        }
        reservation.keep();
        sh.latest.seal(hash);
        Ok(())
    }

    /// `admit` for a `submit_latest` task: it may replace its key's pending one instead of
    /// being pushed (`latest_cells.rs`), so it is admitted by the gate, and its push (when
    /// there is one) cannot be refused: lanes close only once the gate is idle.
    fn admit_latest(
        &self,
        key: K,
        hash: u64,
        build: impl FnOnce(Option<Claim<K>>) -> LaneTask,
        reservation: Reservation<'_>,
        refuse: impl Fn(RejectReason) -> Result<(), RejectReason>,
    ) -> Result<(), RejectReason> {
        let sh = &*self.shared;
        let Some(ticket) = sh.gate.enter() else {
            return refuse(RejectReason::Shutdown);
        };
        // The key's `Clone` for the lane item, before anything is offered (user code: a
        // panic here gives back the ticket and the reservation).
        let mut lane_key = Some(key.clone());
        let task = build(None);
        let push = |cell| {
            let key = lane_key.take().expect("pushed once");
            let pushed = sh.push_keyed(hash, || Item {
                key,
                hash,
                task: LaneTask::node(cell),
            });
            assert!(pushed.is_ok(), "a lane closed while the gate was open");
        };
        let offered = sh.latest.offer(key, hash, task.into_task(), push);
        // Unused when the task replaced its key's pending one: the user's `Drop`, contained.
        crate::user::drop_quietly(lane_key);
        match offered {
            Offered::Replaced(old) => {
                old.abandon(Abandon::Superseded);
                sh.dropped_outside.fetch_add(1, Ordering::AcqRel);
                // The replaced task's slot is the new task's: give back the one reserved.
                drop(reservation);
                // No push: the gate counts this one.
                ticket.admit();
            }
            // Pushed: its lane counts it.
            Offered::Pushed => {
                reservation.keep();
                drop(ticket);
            }
        }
        Ok(())
    }

    /// Debug builds: what a handle needs to catch a join on a later task of the caller's own
    /// key ([`TaskHandle::join`]). Not for `submit_latest` tasks, which can also resolve by being
    /// superseded while the caller waits.
    #[cfg(debug_assertions)]
    fn origin_of(&self, key: Option<&K>, kind: Kind) -> OriginCheck {
        let key = key.filter(|_| kind != Kind::Latest)?.clone();
        Some(Box::new(KeyOrigin {
            id: self.shared.id,
            shared: Arc::downgrade(&self.shared),
            key,
        }))
    }

    /// Release builds keep nothing for the check.
    #[cfg(not(debug_assertions))]
    #[inline(always)]
    fn origin_of(&self, _key: Option<&K>, _kind: Kind) -> OriginCheck {}

    /// Stops accepting tasks; queued tasks still run. Idempotent; returns without waiting for
    /// any task (see [`await_termination`](Self::await_termination)), only for the unkeyed and
    /// `submit_latest` submissions already inside a submit call to finish their push, which
    /// never blocks. A submission that returned `Ok` before `shutdown` returned runs (or is
    /// handed back by [`shutdown_now`](Self::shutdown_now)); one that starts after is refused.
    ///
    /// ```
    /// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
    /// s.execute(1, || ()).unwrap();
    /// s.shutdown();
    /// assert!(s.is_shutdown());
    /// assert!(s.execute(1, || ()).is_err());
    /// ```
    pub fn shutdown(&self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::Release);
        // Unkeyed and latest submissions are admitted by the gate, keyed ones by their lane
        // (see "Admission"): the lanes close once the gate's last submission has pushed.
        sh.gate.close();
        sh.gate.wait_idle();
        sh.lanes.close();
        if let Some(c) = &sh.capacity {
            c.wake_all();
        }
        sh.sleep.wake_all();
        if sh.live_workers.load(Ordering::Acquire) == 0 {
            sh.set_terminated();
        }
    }

    /// Stops at once: no new tasks, no more queued tasks run; every task that was queued and
    /// not started is handed back (with its key) instead. Tasks already running finish
    /// undisturbed, but the tasks queued behind them are handed back too. Dropping a returned
    /// [`PendingTask`] resolves its handle as [`Cancelled`](crate::TaskError::Cancelled).
    ///
    /// ```
    /// use keyserial::Builder;
    /// let s = Builder::<u32>::new().workers(1).build().unwrap();
    /// let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// s.execute(0, move || { rx.recv().ok(); }).unwrap();
    /// while s.stats().running == 0 { std::thread::yield_now(); }
    /// for k in 0..3 { s.execute(k, || ()).unwrap(); }
    /// let pending = s.shutdown_now();
    /// assert_eq!(pending.len(), 3);
    /// tx.send(()).unwrap();
    /// ```
    pub fn shutdown_now(&self) -> Vec<PendingTask<K>> {
        let sh = &*self.shared;
        sh.stop.store(true, Ordering::Release);
        self.shutdown();
        sh.gate.wait_idle();
        let mut out: Vec<PendingTask<K>> = Vec::new();
        // 1. Workers: stop each one; steal the chains of those inside a task (phase.rs). Every
        //    worker is stopped before any chain is drained: a worker routing a lane's items
        //    pushes onto chains until it stops.
        let stolen: Vec<NonNull<KeyEntry<K>>> = sh
            .slots
            .iter()
            .filter(|slot| slot.phase.stop() == Stopped::Stole)
            .filter_map(|slot| NonNull::new(slot.current.load(Ordering::Relaxed) as *mut _))
            .collect();
        for e in stolen {
            self.drain_into(e, &mut out);
        }
        // What workers handed back of the chains they held (they do so before going idle,
        // which `stop` waited for).
        out.append(&mut lock(&sh.handback));
        // 2. Chains parked on permits.
        for e in crate::permits::steal_all(sh) {
            self.drain_into(e, &mut out);
        }
        // 3. Every queue.
        let mut take = |r| match r {
            Runnable::Chain(e) => self.drain_into(e, &mut out),
            Runnable::Task(t) => out.push(PendingTask::new(None, t)),
        };
        while let Some(r) = worker::steal_into(|| sh.global.steal()) {
            take(r);
        }
        for slot in sh.slots.iter() {
            while let Some(r) = worker::steal_into(|| slot.stealer.steal()) {
                take(r);
            }
        }
        // Per key, a lane's items come after the key's chain. First what workers held of a
        // lane or a deferral when they stopped (a deferral's runner hands back the item it
        // took before the rest of the deferral, which the lane's owner or step 4 takes).
        out.append(&mut lock(&sh.handback_lanes));
        // 4. The lanes (lanes.rs), each taken for good: a free one at once, one whose owner is
        //    inside a task by a steal that offers the owner "stop" instead of a deferral. An
        //    owned one is being handed back by its owner (stopped above), who then releases
        //    it. A lane's deferred items come before its queued ones: they were popped first.
        if !sh.lanes.stopped.swap(true, Ordering::AcqRel) {
            for l in 0..sh.lanes.len() {
                let lane = sh.lanes.get(l);
                let backoff = crossbeam_utils::Backoff::new();
                loop {
                    let taken = match lane.word.phase() {
                        LanePhase::Free => lane.word.try_acquire(STOPPER),
                        LanePhase::Running => lane.word.watch().is_some_and(|w| {
                            sh.mailboxes.get(w.owner()).is_some_and(|victim| {
                                lane.word
                                    .try_steal(STOPPER, &w, victim, Deferral::stop_sentinel())
                                    .is_ok()
                            })
                        }),
                        LanePhase::Owned => false,
                    };
                    if taken {
                        break;
                    }
                    crate::sync::snooze(&backoff);
                }
                let items = lane.deferrals.take_all();
                out.extend(
                    items
                        .into_iter()
                        .map(|i| PendingTask::new(Some(i.key), i.task.into_task())),
                );
                // SAFETY: the loop above took the lane for good (as `STOPPER`): nobody else
                // pops it any more.
                while let Some((key, task)) = unsafe { lane.pop_unhashed() } {
                    out.push(PendingTask::new(Some(key), task.into_task()));
                }
            }
        }
        // 5. What workers handed back meanwhile: the lanes whose owner left a task after step
        //    1 (step 4 waited for their release).
        out.append(&mut lock(&sh.handback_lanes));
        out.append(&mut lock(&sh.handback));
        sh.handed_back.fetch_add(out.len() as u64, Ordering::AcqRel);
        if let Some(c) = &sh.capacity {
            for _ in 0..out.len() {
                c.release();
            }
        }
        sh.sleep.wake_all();
        out
    }

    fn drain_into(&self, e: NonNull<KeyEntry<K>>, out: &mut Vec<PendingTask<K>>) {
        // SAFETY: the caller took the chain's baton (stolen from a worker, a permit wait or a
        // ready queue), so the entry is alive and the chain is ours.
        let entry = unsafe { e.as_ref() };
        let mut tasks = Vec::new();
        // SAFETY: as above.
        unsafe { drain_chain(entry, &mut tasks) };
        for t in tasks {
            // The key's `Clone` is user code: a task whose key cannot be cloned is not handed
            // back but resolves `Panicked` with the key's payload (`user.rs`).
            match crate::user::catch(|| entry.key().clone()) {
                Ok(key) => out.push(PendingTask::new(Some(key), t)),
                Err(payload) => {
                    self.shared.dropped_outside.fetch_add(1, Ordering::AcqRel);
                    if let Some(c) = &self.shared.capacity {
                        c.release();
                    }
                    t.fail(payload);
                }
            }
        }
        // SAFETY: as above: we own the drained chain, and it is an entry of our table.
        unsafe { crate::idle::release_drained(&self.shared, e) };
    }

    /// Waits until the serializer has terminated (shut down and every worker exited) or
    /// `timeout` passes; returns whether it terminated. A timeout too large to add to the current
    /// time (`Duration::MAX`) means no timeout.
    ///
    /// If it returns `false` after [`shutdown_now`](Self::shutdown_now) (called before or after
    /// this wait), dropping the serializer no longer waits for the threads still inside a task
    /// (see [Dropping](Self#dropping)).
    ///
    /// ```
    /// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
    /// s.execute(1, || ()).unwrap();
    /// s.shutdown();
    /// assert!(s.await_termination(std::time::Duration::from_secs(10)));
    /// assert!(s.is_terminated());
    /// ```
    pub fn await_termination(&self, timeout: Duration) -> bool {
        let done = self.wait_terminated(Instant::now().checked_add(timeout));
        if !done && self.is_shutdown() {
            self.gave_up.store(true, Ordering::Release);
        }
        done
    }

    /// Shuts down and waits at most `timeout` for termination (as tokio's
    /// `Runtime::shutdown_timeout` does); returns whether everything finished in time.
    ///
    /// First as [`shutdown`](Self::shutdown): no new tasks, queued tasks still run. If every
    /// queued task has run and every worker has exited within `timeout`, it returns `true`.
    /// Otherwise, at the deadline it stops as [`shutdown_now`](Self::shutdown_now) does and
    /// **cancels** the tasks that have not started: they are dropped unrun (their handles
    /// resolve [`Cancelled`](crate::TaskError::Cancelled); an [`execute`](Self::execute) task is
    /// simply lost), and it returns `false`. To get those tasks back instead, call `shutdown`,
    /// `await_termination` and `shutdown_now` yourself.
    ///
    /// Worker threads still inside a task at the deadline are **detached**: nothing waits for
    /// them, not this call and not the serializer's `Drop`. Each finishes the task it is in
    /// (its handle resolves then, as usual), starts nothing more, and exits; the serializer's
    /// shared state is freed when the last of them has exited. A task that never returns keeps
    /// its thread forever, but nobody waits for it. A `timeout` too large to add to the current
    /// time (`Duration::MAX`) means no timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyserial::{Builder, TaskError};
    ///
    /// let s = Builder::<&str>::new().workers(1).build().unwrap();
    /// let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// let stuck = s.submit("a", move || { rx.recv().ok(); "finally" }).unwrap();
    /// while s.stats().running == 0 { std::thread::yield_now(); }
    /// let queued = s.submit("b", || "never").unwrap();
    ///
    /// assert!(!s.shutdown_timeout(Duration::from_millis(20)));
    /// assert!(matches!(queued.join(), Err(TaskError::Cancelled)));
    /// drop(s); // returns at once: the stuck thread is detached
    /// tx.send(()).unwrap();
    /// assert_eq!(stuck.join().unwrap(), "finally"); // it still finishes its task
    /// ```
    pub fn shutdown_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        self.shutdown();
        if self.wait_terminated(deadline) {
            return true;
        }
        self.gave_up.store(true, Ordering::Release);
        drop(self.shutdown_now());
        false
    }

    /// Waits for termination until `deadline` (`None`: without bound).
    fn wait_terminated(&self, deadline: Option<Instant>) -> bool {
        let cond = &self.shared.terminated_cond;
        let mut t = lock(&self.shared.terminated);
        while !*t {
            t = match deadline {
                None => cond.wait(t).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return false;
                    }
                    cond.wait_timeout(t, deadline - now)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0)
                }
            };
        }
        true
    }

    /// `true` once [`shutdown`](Self::shutdown) or [`shutdown_now`](Self::shutdown_now) was called.
    ///
    /// ```
    /// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
    /// assert!(!s.is_shutdown());
    /// ```
    pub fn is_shutdown(&self) -> bool {
        self.shared.shutdown.load(Ordering::Acquire)
    }

    /// `true` once shut down and every worker has exited.
    ///
    /// ```
    /// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
    /// assert!(!s.is_terminated());
    /// ```
    pub fn is_terminated(&self) -> bool {
        *lock(&self.shared.terminated)
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
        let (mut started, mut completed, mut panicked, mut dropped) = (0u64, 0u64, 0u64, 0u64);
        for s in sh.slots.iter() {
            started += s.counters.started.load(Ordering::Acquire);
            completed += s.counters.completed.load(Ordering::Acquire);
            panicked += s.counters.panicked.load(Ordering::Acquire);
            dropped += s.counters.dropped.load(Ordering::Acquire);
        }
        dropped += sh.dropped_outside.load(Ordering::Acquire);
        let admitted = sh.admitted();
        let handed = sh.handed_back.load(Ordering::Acquire);
        Stats {
            workers: sh.live_workers.load(Ordering::Acquire),
            active_keys: sh.table.len(),
            queued: admitted.saturating_sub(started + dropped + handed) as usize,
            running: started.saturating_sub(completed) as usize,
            completed,
            panicked,
            rejected: sh.rejected.load(Ordering::Relaxed),
        }
    }
}

impl<K> Drop for Serializer<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// See [Dropping](Serializer#dropping).
    fn drop(&mut self) {
        self.shutdown();
        if worker::on_worker_of(self.shared.id) {
            return; // dropped inside one of our own tasks: the workers finish on their own
        }
        // After shutdown_now and a bounded wait that gave up, nothing queued is left: the threads
        // still alive are inside a task. Detach them rather than wait without bound.
        let detach =
            self.gave_up.load(Ordering::Acquire) && self.shared.stop.load(Ordering::Acquire);
        if detach {
            crate::supervisor::stop(&self.shared);
        }
        loop {
            let handles: Vec<_> = lock(&self.shared.threads).drain(..).collect();
            if handles.is_empty() {
                break;
            }
            for h in handles {
                if detach && !h.is_finished() {
                    drop(h); // detached: it exits once its task returns
                } else {
                    let _ = h.join();
                }
            }
        }
        crate::supervisor::stop(&self.shared);
    }
}

impl<K> Builder<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Checks the settings and starts the serializer's threads.
    ///
    /// # Errors
    /// A [`BuildError`] whose [`kind`](BuildError::kind) says what is wrong: `workers(0)`
    /// ([`ZeroWorkers`](crate::BuildErrorKind::ZeroWorkers)), `max_workers` below `workers`
    /// ([`MaxWorkersBelowWorkers`](crate::BuildErrorKind::MaxWorkersBelowWorkers)), more than 4,096
    /// threads ([`TooManyWorkers`](crate::BuildErrorKind::TooManyWorkers)), `fairness_budget(0)`
    /// ([`ZeroFairnessBudget`](crate::BuildErrorKind::ZeroFairnessBudget)), `capacity(0)`
    /// ([`ZeroCapacity`](crate::BuildErrorKind::ZeroCapacity)), or a thread the operating system would
    /// not start ([`ThreadSpawn`](crate::BuildErrorKind::ThreadSpawn)).
    ///
    /// ```
    /// use keyserial::{BuildErrorKind, Builder};
    /// let err = Builder::<u8>::new().workers(2).max_workers(1).build().unwrap_err();
    /// assert_eq!(err.kind(), BuildErrorKind::MaxWorkersBelowWorkers);
    /// assert!(err.to_string().contains("max_workers"));
    /// ```
    pub fn build(self) -> Result<Serializer<K>, BuildError> {
        let (workers, max_workers) = self.checked()?;
        Serializer::start(self, workers, max_workers).map_err(BuildError::spawn)
    }
}

/// Debug builds: the serializer and key of a handle's task (see [`crate::handle::Origin`]).
#[cfg(debug_assertions)]
struct KeyOrigin<K> {
    id: usize,
    shared: std::sync::Weak<Shared<K>>,
    key: K,
}

#[cfg(debug_assertions)]
impl<K> crate::handle::Origin for KeyOrigin<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    fn running_same_key_here(&self) -> bool {
        // Cheap exits first: most joins happen outside the serializer's workers.
        if !worker::on_worker_of(self.id) {
            return false;
        }
        let Some(sh) = self.shared.upgrade() else {
            return false;
        };
        let Some((slot, _)) = worker::current_worker::<K>(sh.id) else {
            return false;
        };
        // After shutdown_now a queued task may be handed back and run elsewhere: no verdict.
        if sh.stop.load(Ordering::Acquire) {
            return false;
        }
        let slot = &sh.slots[slot];
        // Only this thread moves its slot in and out of RUNNING and sets `current` before each
        // task: RUNNING here means we are inside a task of the chain at `current`.
        if !slot.phase.is_running() {
            return false;
        }
        let Some(entry) = NonNull::new(slot.current.load(Ordering::Relaxed) as *mut KeyEntry<K>)
        else {
            // A task run straight from a lane or a deferral (its key), or an unkeyed one (0).
            let direct = slot.direct_key.load(Ordering::Relaxed) as *const K;
            // SAFETY: this thread's worker stored the address of the running task's key, which
            // lives in its stack frame until the task returns; we are inside that task.
            return !direct.is_null() && unsafe { &*direct } == &self.key;
        };
        // SAFETY: this thread's worker runs a task of this entry's chain (RUNNING, set here), so
        // the chain is active and the entry live; a stolen active chain's entry is freed only
        // with the table, which `sh` keeps alive.
        let same = unsafe { entry.as_ref() }.key() == &self.key;
        same && !sh.stop.load(Ordering::Acquire)
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
