//! A **prototype of a proposed keyserial design**, not a baseline: hash-onto-lanes transport,
//! with lanes that an idle worker takes over from a worker stuck inside a task, deferring only
//! the stuck task's key.
//!
//! Why it exists: BENCHMARKS.md ("Run G") found that the one design that both reads tasks in
//! submission order (what makes the lanes fast in boxed mode) and pays nothing per key (what
//! makes them fast on new keys) is a lane, and that its price is head-of-line blocking, which
//! issue 14 rules out. This row measures a lane design without that price, with every part that
//! an integrated version would pay per task:
//!
//! - **Lanes.** `lanes` FIFOs of `(key, task)` (crossbeam channels, read in submission order); a
//!   key is hashed onto one lane for ever. Lanes are not tied to threads: a worker *owns* at most
//!   one lane at a time and pops it alone; `workers` threads serve the lanes.
//! - **A lane's state word** `seq << 16 | owner << 2 | phase`, phase one of `FREE`, `OWNED` (its
//!   owner is popping) and `RUNNING` (its owner is inside the task of key `current`). Per task
//!   the owner stores `RUNNING` (Release, after writing `current`) and, after the task, CASes
//!   `RUNNING(seq)` back to `OWNED(seq + 1)`: one store and one uncontended RMW per task.
//! - **Stealing.** A worker with nothing to pop looks for a lane in `RUNNING` with tasks waiting.
//!   If the lane's `seq` has not moved for [`STEAL_AFTER`] (its owner is stuck in one task, not
//!   streaming short ones), it CASes `RUNNING(seq)` to `OWNED(me)` under the lane's handoff
//!   lock, and hands the old owner a [`Deferred`] chain for `current`, marked active: the old
//!   owner's CAS after its task fails, it takes the chain and runs whatever the thief pushed onto
//!   it, in order, then deactivates it. Until then the lane's owner pushes that key's tasks onto
//!   the chain instead of running them: only the stuck key waits, every other key of the lane
//!   runs. A deferred chain found inactive is removed and its key runs from the lane again.
//! - **Order per key.** A key's tasks leave its one lane in FIFO order, popped by one owner at a
//!   time (ownership moves by CAS, Acquire/Release); each runs directly (no other task of the key
//!   is running: the only one that could be is the owner's own previous one) or, while the key
//!   is deferred, through its chain, whose single runner runs them in push order. The compare
//!   program's order check verifies it on every run.
//! - **Sleep.** A worker with nothing to do registers as a sleeper, re-checks every lane, parks.
//!   A submit wakes one sleeper when its lane is `FREE`, or `RUNNING` and its backlog just
//!   reached [`WAKE_BACKLOG`] tasks (a lane that may be stuck); the check costs one load while
//!   nobody sleeps. While some lane has such a backlog, a sleeper parks for [`POLL`] only and
//!   looks again (a steal needs the lane's `seq` to stand still).
//! - **Fairness.** An owner releases its lane after [`BUDGET`] tasks and looks at the others
//!   first, so no lane starves while another streams.
//!
//! Left out, because they do not change the cost of the paths measured: per-key state for the
//! contract's other submit kinds (latest, distinct, permits), panics, a bound, shutdown's
//! hand-back. The deferral map is a mutex-guarded `HashMap` that only a lane's owner touches.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender, TryRecvError};
use crossbeam_utils::sync::{Parker, Unparker};
use crossbeam_utils::{Backoff, CachePadded};

use crate::exec::{bucket, Completion, KeyedExecutor, Task};

/// How long a lane's `seq` must stand still, with tasks waiting, before an idle worker takes it.
pub const STEAL_AFTER: Duration = Duration::from_micros(20);
/// Tasks an owner runs from one lane before it looks at the others.
pub const BUDGET: usize = 256;
/// Backlog of a `RUNNING` lane at which a submit wakes a sleeper to steal it.
pub const WAKE_BACKLOG: usize = 16;
/// How often a sleeper looks again at a lane with a backlog behind a running task.
pub const POLL: Duration = Duration::from_micros(100);

const FREE: u64 = 0;
const OWNED: u64 = 1;
const RUNNING: u64 = 2;

fn pack(seq: u64, owner: usize, phase: u64) -> u64 {
    (seq << 16) | ((owner as u64) << 2) | phase
}
fn phase(s: u64) -> u64 {
    s & 3
}
fn seq(s: u64) -> u64 {
    s >> 16
}

/// A deferred key's tasks, run by the worker that was stuck in the key's task when its lane was
/// taken.
#[derive(Default)]
struct Deferred {
    inner: Mutex<DeferredInner>,
}

#[derive(Default)]
struct DeferredInner {
    queue: VecDeque<Task>,
    /// Its runner has not yet found the queue empty.
    active: bool,
}

struct LaneHot {
    state: AtomicU64,
    /// The key of the task the owner is running (valid while `RUNNING`).
    current: AtomicU64,
}

struct Lane {
    hot: CachePadded<LaneHot>,
    tx: Sender<(u64, Task)>,
    rx: Receiver<(u64, Task)>,
    /// Keys of this lane whose tasks go to a chain: only the lane's owner touches it.
    deferred: Mutex<HashMap<u64, Arc<Deferred>>>,
    /// `deferred.len()`, read on the fast path without the lock (owner only).
    deferred_len: AtomicUsize,
    /// The chain a thief hands the owner it took the lane from.
    handoff: Mutex<Option<Arc<Deferred>>>,
}

struct Shared {
    lanes: Box<[Lane]>,
    done: Completion,
    sleeping: CachePadded<AtomicUsize>,
    sleepers: Mutex<Vec<usize>>,
    unparkers: Box<[Unparker]>,
    stop: AtomicBool,
}

/// Lanes with stealing of stuck lanes (a prototype; see the module docs).
pub struct StealLanes {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl StealLanes {
    /// Starts `workers` threads serving `lanes` lanes.
    pub fn new(workers: usize, lanes: usize) -> Self {
        assert!(workers > 0 && lanes > 0, "at least one worker and one lane");
        let parkers: Vec<Parker> = (0..workers).map(|_| Parker::new()).collect();
        let shared = Arc::new(Shared {
            lanes: (0..lanes)
                .map(|_| {
                    let (tx, rx) = unbounded();
                    Lane {
                        hot: CachePadded::new(LaneHot {
                            state: AtomicU64::new(pack(0, 0, FREE)),
                            current: AtomicU64::new(0),
                        }),
                        tx,
                        rx,
                        deferred: Mutex::new(HashMap::new()),
                        deferred_len: AtomicUsize::new(0),
                        handoff: Mutex::new(None),
                    }
                })
                .collect(),
            done: Completion::new(),
            sleeping: CachePadded::new(AtomicUsize::new(0)),
            sleepers: Mutex::new(Vec::new()),
            unparkers: parkers.iter().map(|p| p.unparker().clone()).collect(),
            stop: AtomicBool::new(false),
        });
        let threads = parkers
            .into_iter()
            .enumerate()
            .map(|(i, parker)| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("steal-lanes-{i}"))
                    .spawn(move || {
                        WorkerLoop {
                            me: i,
                            shared,
                            parker,
                        }
                        .run()
                    })
                    .expect("spawn worker")
            })
            .collect();
        StealLanes { shared, threads }
    }
}

impl Shared {
    fn wake_one(&self) {
        let id = self.sleepers.lock().unwrap().pop();
        if let Some(id) = id {
            self.sleeping.fetch_sub(1, Ordering::SeqCst);
            self.unparkers[id].unpark();
        }
    }

    fn submit(&self, key: u64, task: Task) {
        self.done.submitted();
        let lane = &self.lanes[bucket(key, self.lanes.len())];
        if lane.tx.send((key, task)).is_err() {
            self.done.completed();
            return;
        }
        // Pairs with a sleeper's registration (SeqCst RMW) and its re-check of every lane, and
        // with an owner's release (store FREE, fence, re-check its lane): either they see this
        // task or this sees them.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) > 0 {
            let s = lane.hot.state.load(Ordering::Relaxed);
            // Once per backlog: a sleeper that finds the lane progressing polls it from then on.
            let stuck = phase(s) == RUNNING && lane.rx.len() == WAKE_BACKLOG;
            if phase(s) == FREE || stuck {
                self.wake_one();
            }
        }
    }
}

struct WorkerLoop {
    me: usize,
    shared: Arc<Shared>,
    parker: Parker,
}

/// Why a worker stopped serving a lane.
enum LeftLane {
    /// Empty and released.
    Empty,
    /// Budget spent, released.
    Budget,
    /// Taken by a thief while this worker ran a task (the deferred chain was run).
    Stolen,
}

impl WorkerLoop {
    fn run(self) {
        let n = self.shared.lanes.len();
        let mut next = self.me % n;
        loop {
            if let Some(l) = self.acquire_free(next) {
                next = match self.serve(l) {
                    LeftLane::Budget => (l + 1) % n,
                    _ => l,
                };
                continue;
            }
            if self.spin_for_work() {
                continue;
            }
            if let Some((l, s)) = self.stuck_lane() {
                if self.steal(l, s) {
                    next = match self.serve(l) {
                        LeftLane::Budget => (l + 1) % n,
                        _ => l,
                    };
                }
                continue;
            }
            if self.shared.stop.load(Ordering::Acquire) && self.all_empty() {
                return;
            }
            self.sleep();
        }
    }

    fn all_empty(&self) -> bool {
        self.shared.lanes.iter().all(|l| l.rx.is_empty())
    }

    /// A `FREE` lane with tasks, taken (`OWNED` by this worker), searching from `start`.
    fn acquire_free(&self, start: usize) -> Option<usize> {
        let n = self.shared.lanes.len();
        for i in 0..n {
            let l = (start + i) % n;
            let lane = &self.shared.lanes[l];
            let s = lane.hot.state.load(Ordering::Relaxed);
            if phase(s) == FREE
                && !lane.rx.is_empty()
                && lane
                    .hot
                    .state
                    .compare_exchange(
                        s,
                        pack(seq(s), self.me, OWNED),
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                return Some(l);
            }
        }
        None
    }

    /// Spins a little before sleeping, as a channel's receiver does; `true` if work showed up.
    fn spin_for_work(&self) -> bool {
        let backoff = Backoff::new();
        while !backoff.is_completed() {
            if self
                .shared
                .lanes
                .iter()
                .any(|l| phase(l.hot.state.load(Ordering::Relaxed)) == FREE && !l.rx.is_empty())
            {
                return true;
            }
            backoff.snooze();
        }
        false
    }

    /// A lane whose owner has been inside one task for [`STEAL_AFTER`] with tasks waiting.
    fn stuck_lane(&self) -> Option<(usize, u64)> {
        let lanes = &self.shared.lanes;
        let seen: Vec<Option<u64>> = lanes
            .iter()
            .map(|l| {
                let s = l.hot.state.load(Ordering::Relaxed);
                (phase(s) == RUNNING && !l.rx.is_empty()).then_some(s)
            })
            .collect();
        if seen.iter().all(Option::is_none) {
            return None;
        }
        let t0 = Instant::now();
        while t0.elapsed() < STEAL_AFTER {
            std::hint::spin_loop();
        }
        seen.iter().enumerate().find_map(|(l, s)| {
            let s = (*s)?;
            (lanes[l].hot.state.load(Ordering::Relaxed) == s).then_some((l, s))
        })
    }

    /// Takes lane `l` from its owner, stuck in the task it started at state `s`.
    fn steal(&self, l: usize, s: u64) -> bool {
        let lane = &self.shared.lanes[l];
        let mut handoff = lane.handoff.lock().unwrap();
        // Acquire: the owner's Release store of `RUNNING` (after its write of `current`).
        if lane
            .hot
            .state
            .compare_exchange(
                s,
                pack(seq(s) + 1, self.me, OWNED),
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        // The owner writes `current` only after a successful CAS of its own, which now fails.
        let key = lane.hot.current.load(Ordering::Relaxed);
        let chain = Arc::new(Deferred {
            inner: Mutex::new(DeferredInner {
                queue: VecDeque::new(),
                active: true,
            }),
        });
        *handoff = Some(chain.clone());
        drop(handoff);
        let mut map = lane.deferred.lock().unwrap();
        let old = map.insert(key, chain);
        debug_assert!(old.is_none(), "a key running directly has no chain");
        lane.deferred_len.store(map.len(), Ordering::Relaxed);
        true
    }

    /// Runs lane `l`, which this worker owns (`OWNED`), until it is empty, its budget is spent,
    /// or it is taken.
    fn serve(&self, l: usize) -> LeftLane {
        let lane = &self.shared.lanes[l];
        let mut s = lane.hot.state.load(Ordering::Relaxed);
        debug_assert_eq!(phase(s), OWNED);
        let mut ran = 0;
        loop {
            if ran == BUDGET {
                lane.hot
                    .state
                    .store(pack(seq(s), self.me, FREE), Ordering::Release);
                return LeftLane::Budget;
            }
            let (key, task) = match lane.rx.try_recv() {
                Ok(item) => item,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {
                    lane.hot
                        .state
                        .store(pack(seq(s), self.me, FREE), Ordering::Release);
                    // Pairs with a submit's fence: it sees FREE and wakes someone, or this sees
                    // its task.
                    fence(Ordering::SeqCst);
                    if !lane.rx.is_empty()
                        && lane
                            .hot
                            .state
                            .compare_exchange(
                                pack(seq(s), self.me, FREE),
                                pack(seq(s), self.me, OWNED),
                                Ordering::Acquire,
                                Ordering::Relaxed,
                            )
                            .is_ok()
                    {
                        continue;
                    }
                    return LeftLane::Empty;
                }
            };
            ran += 1;
            if lane.deferred_len.load(Ordering::Relaxed) != 0 {
                let mut map = lane.deferred.lock().unwrap();
                if let Some(chain) = map.get(&key) {
                    let mut g = chain.inner.lock().unwrap();
                    if g.active {
                        g.queue.push_back(task);
                        continue;
                    }
                    drop(g);
                    map.remove(&key);
                }
                // Forget chains whose runner is done (their keys run from the lane again).
                map.retain(|_, c| c.inner.lock().unwrap().active);
                lane.deferred_len.store(map.len(), Ordering::Relaxed);
            }
            lane.hot.current.store(key, Ordering::Relaxed);
            lane.hot
                .state
                .store(pack(seq(s), self.me, RUNNING), Ordering::Release);
            task();
            self.shared.done.completed();
            let next = pack(seq(s) + 1, self.me, OWNED);
            match lane.hot.state.compare_exchange(
                pack(seq(s), self.me, RUNNING),
                next,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => s = next,
                Err(_) => {
                    let chain = lane.handoff.lock().unwrap().take();
                    let chain = chain.expect("a thief leaves a chain for the key it deferred");
                    self.run_deferred(&chain);
                    return LeftLane::Stolen;
                }
            }
        }
    }

    /// Runs a deferred key's tasks until its chain is empty, then deactivates it.
    fn run_deferred(&self, chain: &Deferred) {
        loop {
            let task = {
                let mut g = chain.inner.lock().unwrap();
                match g.queue.pop_front() {
                    Some(t) => t,
                    None => {
                        g.active = false;
                        return;
                    }
                }
            };
            task();
            self.shared.done.completed();
        }
    }

    fn free_work(&self) -> bool {
        self.shared
            .lanes
            .iter()
            .any(|l| phase(l.hot.state.load(Ordering::Relaxed)) == FREE && !l.rx.is_empty())
    }

    fn backlog_behind_a_task(&self) -> bool {
        self.shared.lanes.iter().any(|l| {
            phase(l.hot.state.load(Ordering::Relaxed)) == RUNNING && l.rx.len() >= WAKE_BACKLOG
        })
    }

    /// Leaves the sleepers' list if a waker has not already taken this worker off it.
    fn deregister(&self) {
        let sh = &self.shared;
        let mut list = sh.sleepers.lock().unwrap();
        if let Some(i) = list.iter().position(|&w| w == self.me) {
            list.swap_remove(i);
            sh.sleeping.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Parks until woken; while a lane has a backlog behind a running task, only for [`POLL`],
    /// to look at it again (it may be stuck by then).
    fn sleep(&self) {
        let sh = &self.shared;
        sh.sleepers.lock().unwrap().push(self.me);
        sh.sleeping.fetch_add(1, Ordering::SeqCst);
        if sh.stop.load(Ordering::Acquire) || self.free_work() {
            self.deregister();
            return;
        }
        if self.backlog_behind_a_task() {
            self.parker.park_timeout(POLL);
            self.deregister();
        } else {
            self.parker.park();
        }
    }
}

impl KeyedExecutor for StealLanes {
    fn name(&self) -> String {
        "steal_lanes".into()
    }

    #[inline]
    fn submit<F>(&self, key: u64, task: F)
    where
        F: FnOnce() + Send + 'static,
    {
        self.shared.submit(key, Box::new(task));
    }

    #[inline]
    fn submit_boxed(&self, key: u64, task: Task) {
        self.shared.submit(key, task);
    }

    fn wait_idle(&self, timeout: Duration) -> bool {
        self.shared.done.wait(timeout)
    }
}

impl Drop for StealLanes {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for u in self.shared.unparkers.iter() {
            u.unpark();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// One lane, two workers: a task that blocks its owner must not hold back the lane's other
    /// keys, and the blocked key's later tasks still run after it, in order.
    #[test]
    fn a_stuck_lane_is_taken_and_only_its_key_waits() {
        let exec = StealLanes::new(2, 1);
        let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(0);
        let log = Arc::new(Mutex::new(Vec::new()));
        let fast_done = Arc::new(AtomicU32::new(0));
        {
            let log = log.clone();
            exec.submit(0, move || {
                release_rx.recv().unwrap();
                log.lock().unwrap().push(0);
            });
        }
        for i in 1..=3u32 {
            let log = log.clone();
            exec.submit(0, move || log.lock().unwrap().push(i));
        }
        for k in 1..=100u64 {
            let fast_done = fast_done.clone();
            exec.submit(k, move || {
                fast_done.fetch_add(1, Ordering::Relaxed);
            });
        }
        // Every fast task runs while key 0's first task is still blocked.
        let t0 = Instant::now();
        while fast_done.load(Ordering::Relaxed) < 100 {
            assert!(t0.elapsed() < Duration::from_secs(10), "fast keys waited behind key 0");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(log.lock().unwrap().is_empty(), "key 0 ran past its blocked task");
        release_tx.send(()).unwrap();
        assert!(exec.wait_idle(Duration::from_secs(10)));
        assert_eq!(*log.lock().unwrap(), vec![0, 1, 2, 3]);
    }
}
