//! A serializer's lifecycle: from running, through `shutdown` (no new tasks) and `shutdown_now`
//! (nothing more starts), to terminated (every worker gone).
//!
//! The two flags and the count of live workers are atomics, because they are read on every
//! submit and by every idle worker. Everything else is cold and sits behind **one** lock
//! ([`Synced`], as tokio keeps its scheduler's rarely touched state): the worker threads' join
//! handles, the tasks workers hand back when `shutdown_now` stops them, the idle keys of
//! elastic workers that exited, the supervisor's unparker and the terminated flag, on whose
//! lock [`Lifecycle::wait_terminated`] waits. The lock is taken at a thread's start and exit, at
//! shutdown, and when the elastic clock starts; never on a task's path, and no other lock of the
//! serializer is taken while it is held (a woken supervisor is unparked after unlocking).
//!
//! Transitions, each once: `shutdown` sets `shutdown` (Release; submitters and workers read it
//! with Acquire); `shutdown_now` sets `stop` first, then does what `shutdown` does; the last
//! worker to exit after `shutdown` (or `shutdown` itself, if no worker is alive) sets
//! `terminated` under the lock and wakes every waiter.

use std::thread::JoinHandle;
use std::time::Instant;

use crate::key::IdleItem;
use crate::pending::PendingTask;
use crate::sync::{lock, AtomicBool, AtomicUsize, Condvar, Mutex, Ordering, Unparker};

/// See the module docs.
pub(crate) struct Lifecycle<K> {
    /// `shutdown` was called (no new tasks; queued ones run).
    shutdown: AtomicBool,
    /// `shutdown_now` was called (nothing more starts).
    stop: AtomicBool,
    /// `shutdown_now` calls that have not yet taken everything they hand back.
    collecting: AtomicUsize,
    live_workers: AtomicUsize,
    synced: Mutex<Synced<K>>,
    /// Signalled when `terminated` is set.
    terminated_cond: Condvar,
}

/// A `shutdown_now` taking what it hands back ([`Lifecycle::begin_collecting`]).
pub(crate) struct Collecting<'a>(&'a AtomicUsize);

impl Drop for Collecting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The lifecycle's cold state, under its one lock.
struct Synced<K> {
    terminated: bool,
    threads: Vec<JoinHandle<()>>,
    /// Tasks handed back by workers that met the stop flag while holding a chain (or an
    /// unkeyed task).
    handback: Vec<PendingTask<K>>,
    /// The same for items a worker held of a lane or a deferral (kept apart: per key, they come
    /// after the key's chain).
    handback_lanes: Vec<PendingTask<K>>,
    /// Idle items of elastic workers that exited; adopted by worker 0.
    orphans: Vec<IdleItem<K>>,
    /// `terminated().await`s waiting (woken once `terminated` is set).
    waiting: Vec<std::task::Waker>,
    supervisor: Option<Unparker>,
}

impl<K> Lifecycle<K> {
    pub(crate) fn new() -> Self {
        Lifecycle {
            shutdown: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            collecting: AtomicUsize::new(0),
            live_workers: AtomicUsize::new(0),
            synced: Mutex::new(Synced {
                terminated: false,
                threads: Vec::new(),
                handback: Vec::new(),
                handback_lanes: Vec::new(),
                orphans: Vec::new(),
                waiting: Vec::new(),
                supervisor: None,
            }),
            terminated_cond: Condvar::new(),
        }
    }

    /// `shutdown` (or `shutdown_now`) was called.
    #[inline]
    pub(crate) fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// `shutdown_now` was called.
    #[inline]
    pub(crate) fn is_stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Marks the serializer shut down (no new tasks).
    pub(crate) fn begin_shutdown(&self) {
        self.shutdown.store(true, Ordering::Release);
    }

    /// Marks it stopped (`shutdown_now`: nothing more starts), before shutting it down.
    pub(crate) fn begin_stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// A `shutdown_now` begins taking what it hands back (before it closes the outside holds,
    /// `baton.rs`); the guard says it is done, also if it unwinds.
    pub(crate) fn begin_collecting(&self) -> Collecting<'_> {
        self.collecting.fetch_add(1, Ordering::AcqRel);
        Collecting(&self.collecting)
    }

    /// Waits until no `shutdown_now` is taking what it hands back (a stopped serializer, whose
    /// outside holds are closed: the call that closed them counts until its guard is dropped).
    /// It waits for no task and no worker (`shutdown_now`'s steps wait only for holders between
    /// two steps), so this returns soon.
    pub(crate) fn wait_collected(&self) {
        debug_assert!(self.is_stopped());
        let backoff = crossbeam_utils::Backoff::new();
        while self.collecting.load(Ordering::Acquire) != 0 {
            crate::sync::snooze(&backoff);
        }
    }

    /// Worker threads alive now.
    pub(crate) fn live_workers(&self) -> usize {
        self.live_workers.load(Ordering::Acquire)
    }

    /// A worker is about to start.
    pub(crate) fn worker_started(&self) {
        self.live_workers.fetch_add(1, Ordering::AcqRel);
    }

    /// A worker ended (or failed to start); returns how many are left.
    pub(crate) fn worker_ended(&self) -> usize {
        self.live_workers.fetch_sub(1, Ordering::AcqRel) - 1
    }

    /// Keeps a started thread's handle (forgetting those of threads that have finished).
    pub(crate) fn add_thread(&self, handle: JoinHandle<()>) {
        let mut s = lock(&self.synced);
        s.threads.retain(|h| !h.is_finished());
        s.threads.push(handle);
    }

    /// Every kept thread handle, to join or detach (the caller does that without the lock).
    pub(crate) fn take_threads(&self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut lock(&self.synced).threads)
    }

    /// A stopped worker hands back an unkeyed task or a chain's tasks.
    pub(crate) fn hand_back(&self, task: PendingTask<K>) {
        lock(&self.synced).handback.push(task);
    }

    /// A stopped worker hands back the items it held of a lane or a deferral, in order.
    pub(crate) fn hand_back_lane_items(&self, items: &mut Vec<PendingTask<K>>) {
        lock(&self.synced).handback_lanes.append(items);
    }

    /// What workers handed back of chains and unkeyed tasks so far (`shutdown_now`).
    pub(crate) fn take_handed_back(&self) -> Vec<PendingTask<K>> {
        std::mem::take(&mut lock(&self.synced).handback)
    }

    /// What workers handed back of lanes and deferrals so far (`shutdown_now`).
    pub(crate) fn take_handed_back_lane_items(&self) -> Vec<PendingTask<K>> {
        std::mem::take(&mut lock(&self.synced).handback_lanes)
    }

    /// An exiting elastic worker leaves its idle keys for worker 0.
    pub(crate) fn orphan(&self, items: Vec<IdleItem<K>>) {
        lock(&self.synced).orphans.extend(items);
    }

    /// Worker 0 takes the idle keys elastic workers left.
    pub(crate) fn adopt_orphans(&self) -> Vec<IdleItem<K>> {
        std::mem::take(&mut lock(&self.synced).orphans)
    }

    /// The supervisor thread registers its unparker.
    pub(crate) fn set_supervisor(&self, unparker: Unparker) {
        lock(&self.synced).supervisor = Some(unparker);
    }

    /// Wakes the supervisor, if there is one (unparked after unlocking).
    pub(crate) fn wake_supervisor(&self) {
        let u = lock(&self.synced).supervisor.clone();
        if let Some(u) = u {
            u.unpark();
        }
    }

    /// Marks termination and wakes everyone waiting for it, and the supervisor.
    pub(crate) fn set_terminated(&self) {
        let (supervisor, waiting) = {
            let mut s = lock(&self.synced);
            s.terminated = true;
            (s.supervisor.clone(), std::mem::take(&mut s.waiting))
        };
        self.terminated_cond.notify_all();
        for w in waiting {
            w.wake();
        }
        if let Some(u) = supervisor {
            u.unpark();
        }
    }

    /// `Ready` once terminated; else keeps `cx`'s waker for [`set_terminated`](Self::set_terminated).
    pub(crate) fn poll_terminated(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let mut s = lock(&self.synced);
        if s.terminated {
            return std::task::Poll::Ready(());
        }
        if !s.waiting.iter().any(|w| w.will_wake(cx.waker())) {
            s.waiting.push(cx.waker().clone());
        }
        std::task::Poll::Pending
    }

    /// Shut down and every worker exited.
    pub(crate) fn is_terminated(&self) -> bool {
        lock(&self.synced).terminated
    }

    /// Waits for termination until `deadline` (`None`: without bound); whether it came.
    pub(crate) fn wait_terminated(&self, deadline: Option<Instant>) -> bool {
        let mut s = lock(&self.synced);
        while !s.terminated {
            s = match deadline {
                None => self
                    .terminated_cond
                    .wait(s)
                    .unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return false;
                    }
                    self.terminated_cond
                        .wait_timeout(s, deadline - now)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0)
                }
            };
        }
        true
    }
}
