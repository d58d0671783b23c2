//! The interface every executor under comparison implements, and the pieces they share.
//!
//! [`KeyedExecutor::submit`] is generic over the closure, so an executor that can take a closure as it
//! is (keyserial's `execute(key, F)`) does not pay for a `Box` that the hand-rolled baselines need
//! for their queues ([`Task`]); [`KeyedExecutor::submit_boxed`] is the other way in, the same
//! pre-boxed task for everyone. Waiting for completion is the same for every executor: each one
//! counts submitted and completed tasks in a [`Completion`], a sharded pair of counters that costs a
//! thread-local, uncontended increment on each side of a task.

use std::cell::Cell;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

/// A boxed task, as the baselines queue them.
pub type Task = Box<dyn FnOnce() + Send + 'static>;

/// A boxed future, as the async baselines queue them (W7; its boxed mode builds these before the
/// timing and hands the same box to every contender).
pub type TaskFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// What an executor promises about the order of tasks that share a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderGuarantee {
    /// Tasks of one key run one at a time, in submission order, on pool threads.
    Keyed,
    /// Tasks run on the submitting thread inside `submit` (the work's own cost; ordered trivially,
    /// but only with a single submitting thread, so workloads submit from one thread for it).
    Inline,
    /// No promise at all (the unordered pool: the floor of a handoff, not a serializer).
    Unordered,
}

/// An executor that runs tasks keyed by `u64`.
///
/// Workloads are generic over this trait, so `submit` is monomorphised per executor and closure
/// type: no boxing unless the executor itself boxes.
pub trait KeyedExecutor: Send + Sync {
    /// A short, stable identifier (used as a table row and as a criterion benchmark ID).
    fn name(&self) -> String;

    /// What the executor promises about per-key order.
    fn ordering(&self) -> OrderGuarantee {
        OrderGuarantee::Keyed
    }

    /// Submits `task` under `key`.
    ///
    /// A task the executor refuses must still be accounted for in its [`Completion`] (counted as
    /// completed without running), so that [`wait_idle`](Self::wait_idle) returns and the order
    /// checker reports the task as not run.
    fn submit<F>(&self, key: u64, task: F)
    where
        F: FnOnce() + Send + 'static;

    /// Submits an already boxed `task` under `key` (the compare program's boxed mode, where every
    /// contender gets the same `Box<dyn FnOnce() + Send>`, built before the timing starts).
    ///
    /// The default passes the box to [`submit`](Self::submit) as the closure it is (keyserial's
    /// adapter, the inline row); executors that queue [`Task`]s override it to queue the box itself
    /// rather than box it again.
    fn submit_boxed(&self, key: u64, task: Task) {
        self.submit(key, task);
    }

    /// Submits a future under `key` (W7): it is a task of its key like a closure, and the key's
    /// next task starts only after it completed.
    ///
    /// The default drives it with [`block_on`] inside a closure task, which holds a pool thread
    /// for as long as the future is pending: correct, but what the async contenders exist to
    /// avoid, so W7 runs only on executors that override this (keyserial's `submit_async`, the
    /// tokio contenders).
    fn submit_future<F>(&self, key: u64, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.submit(key, move || block_on(fut));
    }

    /// Submits an already boxed future (W7's boxed mode). The default passes the box on to
    /// [`submit_future`](Self::submit_future) as the future it is.
    fn submit_future_boxed(&self, key: u64, fut: TaskFuture) {
        self.submit_future(key, fut);
    }

    /// Waits until every task submitted so far has finished; `false` if `timeout` passed first.
    ///
    /// Called after every submitting thread has returned from its last `submit`.
    fn wait_idle(&self, timeout: Duration) -> bool;
}

/// The tokio runtime every async contender runs on (`tokio_actor`, `tokio_mutex`,
/// `tokio_chain`, and keyserial's `tokio_handle`): multi-thread, `workers` worker threads, the
/// time driver on (W8's futures sleep on tokio's timer), no I/O driver. One configuration for
/// all, so that no row wins by its runtime; [`describe_tokio_runtime`] says it in the output.
pub fn tokio_runtime(workers: usize, name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .enable_time()
        .thread_name(name)
        .build()
        .expect("tokio runtime")
}

/// [`tokio_runtime`]'s configuration in words, for the compare program's header.
pub fn describe_tokio_runtime(workers: usize) -> String {
    format!(
        "tokio multi-thread runtime, {} worker threads, time driver on",
        workers.max(1)
    )
}

/// Polls `fut` to completion on the calling thread, parking it while the future is pending.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

const SHARDS: usize = 32;

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

#[inline]
fn shard() -> usize {
    SHARD.with(|s| {
        let v = s.get();
        if v != usize::MAX {
            return v;
        }
        let v = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
        s.set(v);
        v
    })
}

/// Counts submitted and completed tasks, sharded by thread so that neither side contends.
///
/// [`submitted`](Self::submitted) is called before a task is handed to the executor and
/// [`completed`](Self::completed) after it ran (or was dropped unrun). [`wait`](Self::wait) is
/// called once all submitters are done, so the submitted total is final and the sum of the
/// completed shards (each monotone, read after the submitted total) reaches it exactly when every
/// task has finished.
pub struct Completion {
    submitted: Box<[CachePadded<AtomicU64>]>,
    completed: Box<[CachePadded<AtomicU64>]>,
}

impl Default for Completion {
    fn default() -> Self {
        Self::new()
    }
}

impl Completion {
    /// Zeroed counters.
    pub fn new() -> Self {
        let mk = || {
            (0..SHARDS)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect()
        };
        Completion {
            submitted: mk(),
            completed: mk(),
        }
    }

    /// Records one task handed to the executor.
    #[inline]
    pub fn submitted(&self) {
        self.submitted[shard()].fetch_add(1, Ordering::Relaxed);
    }

    /// Records one task finished (its effects are published to [`wait`](Self::wait)).
    #[inline]
    pub fn completed(&self) {
        self.completed[shard()].fetch_add(1, Ordering::Release);
    }

    fn sum(v: &[CachePadded<AtomicU64>]) -> u64 {
        v.iter().map(|c| c.load(Ordering::Acquire)).sum()
    }

    /// Number of tasks not yet completed (exact only when no submitter is running).
    pub fn pending(&self) -> u64 {
        let s = Self::sum(&self.submitted);
        s.saturating_sub(Self::sum(&self.completed))
    }

    /// Waits until every submitted task completed; `false` on timeout.
    ///
    /// Polls with sleeps rather than spinning: on a machine with few cores a spinning waiter
    /// would take a core from the workers it waits for. Each wakeup also preempts a worker, so
    /// the sleeps follow the remaining work: about a quarter of the estimated time left (from the
    /// rate observed since the wait began), between 5 µs and 2 ms. A fixed 100 µs poll cost every
    /// contender 5-10% of W1's wall time on 2 cores; this one wakes a few dozen times per run and
    /// is late by at most a quarter of the estimate, which shrinks to 5 µs as the work ends.
    pub fn wait(&self, timeout: Duration) -> bool {
        let start = Instant::now();
        let target = Self::sum(&self.submitted);
        let done_at_start = Self::sum(&self.completed);
        let mut pause = Duration::from_micros(5);
        loop {
            let done = Self::sum(&self.completed);
            if done >= target {
                return true;
            }
            let elapsed = start.elapsed();
            if elapsed > timeout {
                return false;
            }
            let progressed = done - done_at_start;
            pause = if progressed == 0 {
                (pause * 2).min(Duration::from_millis(1))
            } else {
                let left = elapsed.as_secs_f64() * (target - done) as f64 / progressed as f64;
                Duration::from_secs_f64(left / 4.0)
                    .clamp(Duration::from_micros(5), Duration::from_millis(2))
            };
            std::thread::sleep(pause);
        }
    }
}

/// A `Copy`, `'static` pointer to a value that the creator keeps alive until no task can use it.
///
/// Tasks must be `'static`, but cloning an `Arc` into every task would add a contended reference
/// count (one cache line bounced between the submitter and the workers per task) to every executor
/// alike and blur the comparison. The workloads and the keyserial adapter instead hand tasks a
/// `StaticRef` to state that provably outlives them: a workload waits until every task finished (and
/// leaks its state if they did not in time), and the adapter drops the executor, which runs or drops
/// every queued task and joins its threads, before the state.
pub struct StaticRef<T: ?Sized>(NonNull<T>);

impl<T: ?Sized> StaticRef<T> {
    /// Wraps `value`.
    ///
    /// # Safety
    /// `value` must stay alive (not moved, not dropped) for as long as any copy of the returned
    /// `StaticRef` is dereferenced.
    pub unsafe fn new(value: &T) -> Self {
        StaticRef(NonNull::from(value))
    }
}

impl<T: ?Sized> Clone for StaticRef<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized> Copy for StaticRef<T> {}

impl<T: ?Sized> std::ops::Deref for StaticRef<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: `new`'s contract: the pointee outlives every dereference.
        unsafe { self.0.as_ref() }
    }
}

// SAFETY: a `StaticRef<T>` is a shared reference; sending or sharing it is sound when `&T` may be
// shared across threads, i.e. `T: Sync`.
unsafe impl<T: ?Sized + Sync> Send for StaticRef<T> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Sync> Sync for StaticRef<T> {}

/// A fast multiplicative hasher for `u64` keys (FxHash's constant), used by every baseline's map so
/// that no baseline pays for SipHash where a hand-rolled one would not.
#[derive(Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// `BuildHasher` for [`KeyHasher`].
pub type BuildKeyHasher = BuildHasherDefault<KeyHasher>;

/// A `HashMap` keyed by `u64` with [`KeyHasher`].
pub type KeyMap<V> = std::collections::HashMap<u64, V, BuildKeyHasher>;

/// Spreads a key over `n` buckets (lanes, shards) with a multiplicative hash, so that consecutive
/// keys do not all land on neighbouring buckets in lock-step.
#[inline]
pub fn bucket(key: u64, n: usize) -> usize {
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // Multiply-shift range reduction on the high bits.
    (((h >> 32) * n as u64) >> 32) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn completion_waits_for_every_task() {
        let c = Arc::new(Completion::new());
        for _ in 0..100 {
            c.submitted();
        }
        assert!(!c.wait(Duration::from_millis(5)));
        assert_eq!(c.pending(), 100);
        let c2 = c.clone();
        let t = std::thread::spawn(move || {
            for _ in 0..100 {
                c2.completed();
            }
        });
        assert!(c.wait(Duration::from_secs(10)));
        t.join().unwrap();
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn bucket_is_in_range_and_spreads() {
        let mut hits = [0usize; 8];
        for k in 0..8000u64 {
            let b = bucket(k, 8);
            hits[b] += 1;
        }
        for h in hits {
            assert!((800..1200).contains(&h), "{hits:?}");
        }
    }
}
