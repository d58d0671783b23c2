//! Configuration of a [`Serializer`].

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::time::Duration;

use crate::error::{BuildError, BuildErrorKind};
use crate::policy::PanicPolicy;
use crate::serializer::Serializer;
use crate::shared::Config;
use crate::state::StateHooks;

/// Configures and builds a [`Serializer`].
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`workers`](Self::workers) | available parallelism | core worker threads, always running |
/// | [`max_workers`](Self::max_workers) | = `workers` | elastic ceiling: extra threads start when every worker is busy or blocked and work waits |
/// | [`worker_keep_alive`](Self::worker_keep_alive) | 10 s | how long an idle extra worker lives |
/// | [`key_idle_timeout`](Self::key_idle_timeout) | 100 ms | how long a drained key keeps its state, for keys that have some (see [`Stats::active_keys`](crate::Stats::active_keys); at most 1,024 idle keys per worker, unless they hold `key_state`; 0 = release at once) |
/// | [`fairness_budget`](Self::fairness_budget) | 64 | tasks of one key a worker runs before it lets other keys go first |
/// | [`capacity`](Self::capacity) | unbounded | queued (not running) tasks; `submit` blocks and `try_submit` refuses when full |
/// | [`thread_name`](Self::thread_name) | `"keyserial"` | worker thread name prefix (`name-0`, `name-1`, …) |
/// | [`panic_policy`](Self::panic_policy) | [`Continue`](PanicPolicy::Continue) | what a panicking task does to its key's later tasks |
/// | [`max_keys`](Self::max_keys) | unbounded | live keys (queued, running, paused or idle-cached); a new key at the limit releases idle keys, then waits (`submit`) or is refused (`try_submit`) |
///
/// ```
/// use std::time::Duration;
/// use keyserial::Builder;
///
/// let s = Builder::<u64>::new()
///     .workers(2)
///     .max_workers(8)
///     .key_idle_timeout(Duration::from_secs(1))
///     .capacity(10_000)
///     .thread_name("orders")
///     .build()
///     .unwrap();
/// s.execute(42, || println!("order 42")).unwrap();
/// ```
pub struct Builder<K, S = ()> {
    workers: Option<usize>,
    max_workers: Option<usize>,
    worker_keep_alive: Duration,
    key_idle_timeout: Duration,
    fairness_budget: usize,
    capacity: Option<usize>,
    thread_name: String,
    panic_policy: PanicPolicy,
    max_keys: Option<usize>,
    /// Feature `tracing`: how spans write a key (`trace_keys`).
    #[cfg(feature = "tracing")]
    key_label: Option<fn(&K) -> String>,
    /// The tokio runtime whose context workers enter while they poll futures.
    #[cfg(feature = "tokio")]
    tokio: Option<tokio::runtime::Handle>,
    /// `key_state` and `on_key_release` (`state.rs`).
    state: StateHooks<K>,
    _key: PhantomData<fn(K)>,
    _state: PhantomData<fn() -> S>,
}

impl<K, S> fmt::Debug for Builder<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("workers", &self.workers)
            .field("max_workers", &self.max_workers)
            .field("worker_keep_alive", &self.worker_keep_alive)
            .field("key_idle_timeout", &self.key_idle_timeout)
            .field("fairness_budget", &self.fairness_budget)
            .field("capacity", &self.capacity)
            .field("thread_name", &self.thread_name)
            .field("panic_policy", &self.panic_policy)
            .field("max_keys", &self.max_keys)
            .field("key_state", &self.state.on)
            .finish()
    }
}

impl<K> Default for Builder<K> {
    fn default() -> Self {
        Builder {
            workers: None,
            max_workers: None,
            worker_keep_alive: Duration::from_secs(10),
            key_idle_timeout: Duration::from_millis(100),
            fairness_budget: 64,
            capacity: None,
            thread_name: "keyserial".to_string(),
            panic_policy: PanicPolicy::Continue,
            max_keys: None,
            #[cfg(feature = "tracing")]
            key_label: None,
            #[cfg(feature = "tokio")]
            tokio: None,
            state: StateHooks::default(),
            _key: PhantomData,
            _state: PhantomData,
        }
    }
}

impl<K> Builder<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A builder with the defaults in the table above.
    ///
    /// ```
    /// let s = keyserial::Builder::<String>::new().build().unwrap();
    /// # drop(s);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }
}

impl<K, S> Builder<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    /// Gives every key a state of type `S2`, made by `init(&key)` just before the key's first
    /// [`submit_with_state`](Serializer::submit_with_state) task runs, handed as `&mut S2` to
    /// that task and every later state task of the key, in the key's order, with no lock (the
    /// key's order is the lock: its tasks never overlap). The key's plain tasks run in the same
    /// order and do not see it. The state lives while the key is live; when the key is released
    /// (`key_idle_timeout` after it drained, an idle key released for
    /// [`max_keys`](Self::max_keys), or termination) it goes to
    /// [`on_key_release`](Builder::on_key_release), or is dropped.
    ///
    /// With `max_keys` and `key_idle_timeout` this is a bounded cache of per-key state, kept in
    /// order: a key's state stays while the key is busy or recently used, and the oldest idle
    /// keys make room (their states go through the hook first). See `examples/ledger.rs`.
    ///
    /// A panic in `init` fails that task's handle `Panicked` and makes no state (the next state
    /// task tries again); a panicking state task leaves the state as it left it.
    ///
    /// ```
    /// use keyserial::Builder;
    /// let s = Builder::<&str>::new().key_state(|_key| 0u64).build().unwrap();
    /// for amount in [5, 10, 20] {
    ///     s.submit_with_state("acct-1", move |balance: &mut u64| *balance += amount).unwrap();
    /// }
    /// let total = s.submit_with_state("acct-1", |balance: &mut u64| *balance).unwrap();
    /// assert_eq!(total.join().unwrap(), 35);
    /// ```
    pub fn key_state<S2, I>(self, init: I) -> Builder<K, S2>
    where
        S2: Send + 'static,
        I: Fn(&K) -> S2 + Send + Sync + 'static,
    {
        Builder {
            workers: self.workers,
            max_workers: self.max_workers,
            worker_keep_alive: self.worker_keep_alive,
            key_idle_timeout: self.key_idle_timeout,
            fairness_budget: self.fairness_budget,
            capacity: self.capacity,
            thread_name: self.thread_name,
            panic_policy: self.panic_policy,
            max_keys: self.max_keys,
            #[cfg(feature = "tracing")]
            key_label: self.key_label,
            #[cfg(feature = "tokio")]
            tokio: self.tokio,
            state: StateHooks {
                init: std::sync::Arc::new(move |k: &K| -> crate::state::Erased {
                    Box::new(init(k))
                }),
                release: None,
                on: true,
            },
            _key: PhantomData,
            _state: PhantomData,
        }
    }

    /// Called with a key and its state when the key is released (see
    /// [`key_state`](Self::key_state)): exactly once per state, on one of the serializer's
    /// threads (or on a submitter releasing an idle key for `max_keys`), before a later task of
    /// the key could make a new state. Never for a key that never made one. A panic in it is
    /// caught and reported by the panic hook; the state is gone.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use keyserial::Builder;
    /// let saved = Arc::new(Mutex::new(Vec::new()));
    /// let sink = saved.clone();
    /// let s = Builder::<u32>::new()
    ///     .key_state(|_| 0u32)
    ///     .on_key_release(move |key, count| sink.lock().unwrap().push((key, count)))
    ///     .build()
    ///     .unwrap();
    /// s.submit_with_state(7, |c: &mut u32| *c += 1).unwrap().join().unwrap();
    /// drop(s); // terminates: every live key's state goes through the hook
    /// assert_eq!(*saved.lock().unwrap(), [(7, 1)]);
    /// ```
    pub fn on_key_release<R>(mut self, release: R) -> Self
    where
        R: Fn(K, S) + Send + Sync + 'static,
    {
        self.state.release = Some(std::sync::Arc::new(
            move |k: K, state: crate::state::Erased| match state.downcast::<S>() {
                Ok(state) => release(k, *state),
                Err(_) => unreachable!("a key's state has the builder's state type"),
            },
        ));
        self
    }

    /// (Cargo feature `tokio`.) Workers enter `handle`'s runtime context while they poll a
    /// [`submit_async`](crate::Serializer::submit_async) future, so tokio's timers, sockets and
    /// other reactor-bound futures work inside it. The runtime must outlive those futures.
    ///
    /// Without it, a serializer built on a thread inside a tokio runtime (in `#[tokio::main]`,
    /// a task, `#[tokio::test]`) uses that runtime (`Handle::current()`); one built outside any
    /// runtime has none, and a future that needs a reactor fails there.
    ///
    /// ```
    /// # #[cfg(feature = "tokio")] {
    /// let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    /// let s = keyserial::Builder::<u32>::new().tokio_handle(rt.handle().clone()).build().unwrap();
    /// let h = s.submit_async(1, async {
    ///     tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    ///     "slept on a keyserial worker"
    /// }).unwrap();
    /// assert_eq!(h.join().unwrap(), "slept on a keyserial worker");
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub fn tokio_handle(mut self, handle: tokio::runtime::Handle) -> Self {
        self.tokio = Some(handle);
        self
    }

    /// (Cargo feature `tracing`.) Spans and events write each key with its `Debug` text
    /// instead of its hash (see the crate docs, "Tracing"). Formats the key of every
    /// submission while a subscriber wants task spans.
    ///
    /// ```
    /// # #[cfg(feature = "tracing")] {
    /// let s = keyserial::Builder::<u32>::new().trace_keys().build().unwrap();
    /// s.submit(7, || ()).unwrap().join().unwrap(); // span `task` with key = 7, if subscribed
    /// # }
    /// ```
    #[cfg(feature = "tracing")]
    pub fn trace_keys(mut self) -> Self
    where
        K: fmt::Debug,
    {
        self.key_label = Some(|k| format!("{k:?}"));
        self
    }

    /// Core worker threads (at least 1).
    ///
    /// ```
    /// let s = keyserial::Builder::<u8>::new().workers(3).build().unwrap();
    /// assert_eq!(s.stats().workers, 3);
    /// ```
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = Some(n);
        self
    }

    /// The most worker threads, core plus elastic (at least `workers`). Set alone, it also caps
    /// the default `workers` (one per core): `max_workers(4)` on an 8-core machine builds 4.
    ///
    /// ```
    /// let s = keyserial::Builder::<u8>::new().workers(1).max_workers(4).build().unwrap();
    /// # drop(s);
    /// ```
    pub fn max_workers(mut self, n: usize) -> Self {
        self.max_workers = Some(n);
        self
    }

    /// How long an idle elastic worker waits for work before it exits.
    ///
    /// ```
    /// let s = keyserial::Builder::<u8>::new()
    ///     .worker_keep_alive(std::time::Duration::from_millis(500))
    ///     .build()
    ///     .unwrap();
    /// # drop(s);
    /// ```
    pub fn worker_keep_alive(mut self, d: Duration) -> Self {
        self.worker_keep_alive = d;
        self
    }

    /// How long a drained key keeps its state before it is released (`Duration::ZERO`: release as
    /// soon as it drains). The timeout is a bounded cache of hot keys' state: each worker keeps at
    /// most 1,024 idle keys and releases the oldest beyond that at once, so a flood of one-shot
    /// keys costs bounded memory and cheap releases, while a working set of hot keys skips
    /// re-creating its state between tasks (measured in the repository's benchmarks: a cap of
    /// 65,536 instead made one million one-shot keys 1.2-2x slower, with a higher peak memory).
    /// With [`key_state`](Self::key_state) the cap does not apply: a key's state lives until
    /// this timeout (or a [`max_keys`](Self::max_keys) budget) releases it, however many keys
    /// are idle.
    ///
    /// ```
    /// let s = keyserial::Builder::<u8>::new()
    ///     .key_idle_timeout(std::time::Duration::ZERO)
    ///     .build()
    ///     .unwrap();
    /// s.submit(1, || ()).unwrap().join().unwrap();
    /// # drop(s);
    /// ```
    pub fn key_idle_timeout(mut self, d: Duration) -> Self {
        self.key_idle_timeout = d;
        self
    }

    /// Tasks of one key a worker runs in a row before other keys get a turn (at least 1).
    ///
    /// ```
    /// let s = keyserial::Builder::<u8>::new().fairness_budget(8).build().unwrap();
    /// # drop(s);
    /// ```
    pub fn fairness_budget(mut self, n: usize) -> Self {
        self.fairness_budget = n;
        self
    }

    /// The most queued (admitted, not started) tasks (at least 1).
    ///
    /// Worth setting when submitters can outrun the workers for long: it bounds the memory the
    /// backlog takes, at a cost in throughput. In the repository's comparison program (its
    /// `keyserial_bounded` row, a bound of 16,384), W7's peak memory with one million keys was
    /// about a fifth of the unbounded serializer's (647 MiB against 3.1 GiB), while W5 (four
    /// producers, Zipf keys) ran at 0.70-0.87x the unbounded rate: every submit and every task
    /// start updates the one capacity word.
    ///
    /// ```
    /// let s = keyserial::Builder::<u8>::new().capacity(1024).build().unwrap();
    /// # drop(s);
    /// ```
    pub fn capacity(mut self, n: usize) -> Self {
        self.capacity = Some(n);
        self
    }

    /// The worker threads' name prefix.
    ///
    /// ```
    /// let s = keyserial::Builder::<u8>::new().thread_name("io").build().unwrap();
    /// let name = s.submit(1, || std::thread::current().name().unwrap().to_string())
    ///     .unwrap().join().unwrap();
    /// assert!(name.starts_with("io-"));
    /// ```
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.thread_name = name.into();
        self
    }

    /// What a panicking task does to its key (default [`PanicPolicy::Continue`]: the key goes
    /// on with its next task). With [`PanicPolicy::PauseKey`] the key is paused, before the
    /// panicking task's handle resolves, until [`Serializer::resume`]: an ordered stream's later
    /// events never run past a failed one (a dead-letter hook: inspect, fix, resume, or
    /// `cancel_key`).
    ///
    /// ```
    /// use keyserial::{Builder, PanicPolicy, TaskError};
    /// let s = Builder::<u32>::new().panic_policy(PanicPolicy::PauseKey).build().unwrap();
    /// let failed = s.submit(7, || -> u32 { panic!("bad event") }).unwrap();
    /// assert!(matches!(failed.join(), Err(TaskError::Panicked(_))));
    /// let next = s.submit(7, || 2).unwrap(); // queued behind the pause
    /// std::thread::sleep(std::time::Duration::from_millis(20));
    /// assert!(!next.is_finished());
    /// s.resume(&7);
    /// assert_eq!(next.join().unwrap(), 2);
    /// ```
    pub fn panic_policy(mut self, policy: PanicPolicy) -> Self {
        self.panic_policy = policy;
        self
    }

    /// At most `n` keys are live at once: queued, running, paused or idle-cached (at least 1).
    /// A submission of a new key at the limit first releases idle-cached keys (oldest first);
    /// if none is idle, `submit` waits until a key is released, `try_submit` hands the task back
    /// with [`RejectReason::TooManyKeys`](crate::RejectReason::TooManyKeys), and a submission
    /// from inside a task is refused the same way (it never waits). Submissions to live keys are
    /// never affected; when capacity is full too, `Full` wins. [`pause`](Serializer::pause) and
    /// [`cancel_key`](Serializer::cancel_key) never fail: a key they make counts, and may take
    /// the count past `n`. So may, by one, a submission of a key whose idle release comes
    /// between the submission's look-up and its push (it is admitted by then, so it is not
    /// refused). [`Stats::active_keys`](crate::Stats::active_keys) is then the budget's exact
    /// count.
    ///
    /// With [`key_idle_timeout`](Self::key_idle_timeout) this makes a bounded cache of keys: a
    /// key stays live for the timeout after its last task, and the oldest idle ones make room.
    /// The budget needs every live key counted, so a serializer with `max_keys` gives each key an
    /// entry and queues its tasks on it straight from the submitter (no lane): submissions cost a
    /// key-table look-up each.
    ///
    /// ```
    /// use keyserial::{Builder, RejectReason};
    /// let s = Builder::<u32>::new().max_keys(1).build().unwrap();
    /// s.pause(&1); // key 1 is live (and holds the only place)
    /// let refused = s.try_submit(2, || "new key").unwrap_err();
    /// assert_eq!(refused.reason, RejectReason::TooManyKeys);
    /// assert_eq!((refused.task)(), "new key"); // handed back whole
    /// let h = s.try_submit(1, || "a live key is never refused").unwrap();
    /// s.resume(&1);
    /// assert_eq!(h.join().unwrap(), "a live key is never refused");
    /// ```
    pub fn max_keys(mut self, n: usize) -> Self {
        self.max_keys = Some(n);
        self
    }

    /// The worker counts (`workers`, `max_workers`) of a valid configuration, or why it is
    /// invalid. `build` calls this first.
    pub(crate) fn checked(&self) -> Result<(usize, usize), BuildError> {
        let err = |kind| Err(BuildError::invalid(kind));
        let cores = || {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        };
        // Only `max_workers` set: the default core count, but never above it.
        let workers = match (self.workers, self.max_workers) {
            (Some(w), _) => w,
            (None, Some(max)) => cores().min(max),
            (None, None) => cores(),
        };
        if workers == 0 {
            return err(BuildErrorKind::ZeroWorkers);
        }
        let max_workers = self.max_workers.unwrap_or(workers);
        if max_workers < workers {
            return Err(BuildError::with_message(
                BuildErrorKind::MaxWorkersBelowWorkers,
                format!("max_workers ({max_workers}) must be at least workers ({workers})"),
            ));
        }
        if max_workers > 4096 {
            return Err(BuildError::with_message(
                BuildErrorKind::TooManyWorkers,
                format!("max_workers ({max_workers}) must be at most 4096"),
            ));
        }
        if self.thread_name.contains('\0') {
            return err(BuildErrorKind::InvalidThreadName);
        }
        if self.fairness_budget == 0 {
            return err(BuildErrorKind::ZeroFairnessBudget);
        }
        if self.capacity == Some(0) {
            return err(BuildErrorKind::ZeroCapacity);
        }
        if self.max_keys == Some(0) {
            return err(BuildErrorKind::ZeroMaxKeys);
        }
        Ok((workers, max_workers))
    }
}

impl<K, S> Builder<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
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
    /// not start ([`ThreadSpawn`](crate::BuildErrorKind::ThreadSpawn)), or a `thread_name` with a NUL byte
    /// ([`InvalidThreadName`](crate::BuildErrorKind::InvalidThreadName)). A bound error names the
    /// values involved.
    ///
    /// ```
    /// use keyserial::{BuildErrorKind, Builder};
    /// let err = Builder::<u8>::new().workers(2).max_workers(1).build().unwrap_err();
    /// assert_eq!(err.kind(), BuildErrorKind::MaxWorkersBelowWorkers);
    /// assert!(err.to_string().contains("max_workers"));
    /// ```
    pub fn build(self) -> Result<Serializer<K, S>, BuildError> {
        let (workers, max_workers) = self.checked()?;
        let config = Config {
            workers,
            max_workers,
            worker_keep_alive: self.worker_keep_alive,
            key_idle_timeout: self.key_idle_timeout,
            fairness_budget: self.fairness_budget,
            thread_name: self.thread_name,
            panic_policy: self.panic_policy,
            max_keys: self.max_keys,
            // Inside a tokio runtime and without a handle given: that runtime (DESIGN 3.1c, a
            // tokio user's defaults must just work).
            #[cfg(feature = "tokio")]
            tokio: self
                .tokio
                .or_else(|| tokio::runtime::Handle::try_current().ok()),
        };
        #[cfg(feature = "tracing")]
        let labeler = crate::trace::Labeler(self.key_label);
        #[cfg(not(feature = "tracing"))]
        let labeler = crate::trace::Labeler::default();
        Serializer::start(config, self.capacity, labeler, self.state).map_err(BuildError::spawn)
    }
}

/// The two ways to a serializer, on `Serializer` (here, beside the builder they use, so that the
/// serializer's own module does not depend on the builder).
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
}
