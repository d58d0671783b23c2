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
//!   key is hashed onto one lane for ever; a task is stored in the slot itself when it fits in
//!   [`INLINE_WORDS`] words ([`InlineTask`]), so a closure costs no allocation (BENCHMARKS.md
//!   measures what this costs boxed mode: the slots grow). Lanes are not tied to threads: a worker *owns* at most
//!   one lane at a time and pops it alone; `workers` threads serve the lanes.
//! - **A lane's ownership word** is `keyserial_core::lane::Lane` (its protocol, the handoff and
//!   the loom models are there): `FREE`, `OWNED` (its owner is popping) and `RUNNING` (its owner
//!   is inside a task of key `current`). Per task the owner stores `RUNNING` and, after the task,
//!   CASes it back to `OWNED`: one store and one uncontended RMW per task.
//! - **Stealing.** A worker with nothing to pop looks for a lane in `RUNNING` with tasks waiting.
//!   If the lane's word has not moved for [`STEAL_AFTER`] (its owner is stuck in one task, not
//!   streaming short ones), it offers the old owner a `Deferred` chain for `current`, marked
//!   active, and takes the lane (`Lane::try_steal`): the old owner's CAS after its task fails, it
//!   collects the chain and runs whatever the thief pushed onto it, in order, then deactivates
//!   it. Until then the lane's owner pushes that key's tasks onto the chain instead of running
//!   them: only the stuck key waits, every other key of the lane runs. A deferred chain found
//!   inactive is removed and its key runs from the lane again.
//! - **Order per key.** A key's tasks leave its one lane in FIFO order, popped by one owner at a
//!   time (ownership moves by CAS, Acquire/Release); each runs directly (no other task of the key
//!   is running: the only one that could be is the owner's own previous one) or, while the key
//!   is deferred, through its chain, whose single runner runs them in push order. The compare
//!   program's order check verifies it on every run.
//! - **Sleep.** A worker with nothing to do spins a little (counted as *searching*), then
//!   registers as a sleeper, re-checks every lane, parks. While some lane has tasks queued
//!   behind its owner (which may get stuck in its next task), a sleeper parks for [`POLL`] only
//!   and looks again (a steal needs the lane's word to stand still); only when every lane is
//!   empty does it sleep deeply. A submit wakes one sleeper, unless a worker is searching
//!   (rayon's rule), when its lane is `FREE` or a sleeper sleeps deeply; the check costs one
//!   load while nobody sleeps. A worker that takes a lane wakes one more sleeper while tasks
//!   are still queued anywhere (the other half of the rule: a searcher that suppressed wakes
//!   can take only one lane).
//! - **Affinity and fairness.** Worker `w` serves lanes `l` with `l % workers == w` first, so
//!   while every worker is busy a key's tasks (and its data) stay on one core, as with pinned
//!   lanes; it takes any other free lane with tasks before it sleeps. An owner releases its lane
//!   after [`BUDGET`] tasks and tries its next home lane first, so no lane starves while another
//!   streams.
//!
//! Left out, because they do not change the cost of the paths measured: per-key state for the
//! contract's other submit kinds (latest, distinct, permits), panics, a bound, shutdown's
//! hand-back. The deferral map is a mutex-guarded `HashMap` that only a lane's owner touches;
//! while it is not empty the owner locks it (and sweeps out finished chains) on every pop of
//! that lane, a cost an integrated version would avoid (sweep only on a hit).

use std::collections::{HashMap, VecDeque};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender, TryRecvError};
use crossbeam_utils::sync::{Parker, Unparker};
use crossbeam_utils::{Backoff, CachePadded};
use keyserial_core::lane::{Ended, Lane as LaneWord, Mailbox, Phase, Watch};

use crate::exec::{bucket, Completion, KeyedExecutor, Task};

/// Words of closure an [`InlineTask`] holds without a box.
pub const INLINE_WORDS: usize = 3;

/// A task stored in the lane's slot itself when it fits in [`INLINE_WORDS`] words (a
/// pre-boxed `Task` always does: it is two words), boxed otherwise: a submitted closure costs no
/// allocation, as keyserial's task nodes do not, and the worker reads it from the slot it was
/// written to, in submission order.
pub struct InlineTask {
    /// Moves the closure out of `data` and runs it (`true`), or drops it unrun (`false`).
    act: unsafe fn(*mut u8, bool),
    data: MaybeUninit<[usize; INLINE_WORDS]>,
}

// SAFETY: an `InlineTask` is only built from an `F: Send` (see `new`), and owns it.
unsafe impl Send for InlineTask {}

/// # Safety
/// `p` points to an initialised `F` that is not used again afterwards.
unsafe fn act_inline<F: FnOnce()>(p: *mut u8, run: bool) {
    if run {
        // SAFETY: per the contract, `p` holds an `F`, read once and moved out here.
        let f = unsafe { p.cast::<F>().read() };
        f();
    } else {
        // SAFETY: per the contract, `p` holds an `F`, dropped once here.
        unsafe { p.cast::<F>().drop_in_place() };
    }
}

impl InlineTask {
    /// Stores `f` inline if it fits, boxed (two words, inline) otherwise.
    pub fn new<F: FnOnce() + Send + 'static>(f: F) -> Self {
        if size_of::<F>() > size_of::<[usize; INLINE_WORDS]>()
            || align_of::<F>() > align_of::<usize>()
        {
            let boxed: Task = Box::new(f);
            return Self::new(boxed);
        }
        let mut data = MaybeUninit::<[usize; INLINE_WORDS]>::uninit();
        // SAFETY: `F` fits in `data`'s size and alignment (checked above); `data` is ours.
        unsafe { data.as_mut_ptr().cast::<F>().write(f) };
        InlineTask {
            act: act_inline::<F>,
            data,
        }
    }

    /// Runs the task.
    pub fn run(self) {
        let mut me = ManuallyDrop::new(self);
        let act = me.act;
        // SAFETY: `data` holds the closure `act` was made for; `me` is never dropped, so the
        // closure moved out by `act` is not dropped again.
        unsafe { act(me.data.as_mut_ptr().cast(), true) };
    }
}

impl Drop for InlineTask {
    fn drop(&mut self) {
        // SAFETY: `data` holds the closure `act` was made for, not yet moved out (`run`
        // forgets `self`).
        unsafe { (self.act)(self.data.as_mut_ptr().cast(), false) };
    }
}

/// How long a lane's `seq` must stand still, with tasks waiting, before an idle worker takes it.
pub const STEAL_AFTER: Duration = Duration::from_micros(20);
/// Tasks an owner runs from one lane before it looks at the others.
pub const BUDGET: usize = 256;
/// Yields an idle worker makes (after crossbeam's `Backoff` is done spinning) before it
/// sleeps: a submitter that keeps a worker just busy would otherwise pay a futex wake every
/// few tasks.
pub const SPIN_YIELDS: u32 = 32;
/// How often a sleeper looks again at a lane with a backlog behind a running task.
pub const POLL: Duration = Duration::from_micros(100);

/// A deferred key's tasks, run by the worker that was stuck in the key's task when its lane was
/// taken.
#[derive(Default)]
struct Deferred {
    inner: Mutex<DeferredInner>,
}

#[derive(Default)]
struct DeferredInner {
    queue: VecDeque<InlineTask>,
    /// Its runner has not yet found the queue empty.
    active: bool,
}

struct Lane {
    /// Who pops the lane, and the key of the task its owner is inside.
    word: CachePadded<LaneWord>,
    tx: Sender<(u64, InlineTask)>,
    rx: Receiver<(u64, InlineTask)>,
    /// Keys of this lane whose tasks go to a chain: only the lane's owner touches it.
    deferred: Mutex<HashMap<u64, Arc<Deferred>>>,
    /// `deferred.len()`, read on the fast path without the lock (owner only).
    deferred_len: AtomicUsize,
}

struct Shared {
    lanes: Box<[Lane]>,
    done: Completion,
    sleeping: CachePadded<AtomicUsize>,
    /// Workers spinning for work: a submit wakes nobody while one is (rayon's rule).
    searching: CachePadded<AtomicUsize>,
    /// Sleepers parked without a timeout (no lane had work when they looked).
    deep: CachePadded<AtomicUsize>,
    /// Its own line: sleepers lock it, and the fields above are read on every submit.
    sleepers: CachePadded<Mutex<Vec<usize>>>,
    unparkers: Box<[Unparker]>,
    /// Per worker: the deferral a thief hands the worker it took a lane from.
    mailboxes: Box<[CachePadded<Mailbox<Deferred>>]>,
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
                        word: CachePadded::new(LaneWord::new()),
                        tx,
                        rx,
                        deferred: Mutex::new(HashMap::new()),
                        deferred_len: AtomicUsize::new(0),
                    }
                })
                .collect(),
            done: Completion::new(),
            sleeping: CachePadded::new(AtomicUsize::new(0)),
            searching: CachePadded::new(AtomicUsize::new(0)),
            deep: CachePadded::new(AtomicUsize::new(0)),
            sleepers: CachePadded::new(Mutex::new(Vec::new())),
            unparkers: parkers.iter().map(|p| p.unparker().clone()).collect(),
            mailboxes: (0..workers)
                .map(|_| CachePadded::new(Mailbox::new()))
                .collect(),
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

    fn submit(&self, key: u64, task: InlineTask) {
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
        if self.sleeping.load(Ordering::Relaxed) > 0 && self.searching.load(Ordering::Relaxed) == 0
        {
            // A FREE lane needs a worker. A task queued behind an owner needs a sleeper that
            // watches for the owner getting stuck: one that polls is already doing so, one in
            // a deep sleep must be woken.
            if lane.word.phase() == Phase::Free || self.deep.load(Ordering::Relaxed) > 0 {
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
        let workers = self.shared.mailboxes.len();
        // Home lanes first (a key's data stays on one core while every worker is busy), then
        // the others (no lane waits while a worker could take it).
        let (home, away): (Vec<usize>, Vec<usize>) = (0..n).partition(|l| l % workers == self.me);
        let mut turn = 0;
        loop {
            let found = self.acquire_free(&home, turn, &away).or_else(|| {
                if self.spin_for_work() {
                    return None;
                }
                let (l, w) = self.stuck_lane()?;
                self.steal(l, w).then_some(l)
            });
            if let Some(l) = found {
                // The other half of rayon's rule: a worker that found work wakes one more
                // sleeper while work is still queued (other lanes, or behind this one in case
                // its next task gets stuck).
                if self.shared.sleeping.load(Ordering::SeqCst) > 0 && self.queued_anywhere() {
                    self.shared.wake_one();
                }
                if let (LeftLane::Budget, Some(i)) =
                    (self.serve(l), home.iter().position(|&h| h == l))
                {
                    turn = i + 1;
                }
                continue;
            }
            if self.free_work() {
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

    /// A `FREE` lane with tasks, taken (`OWNED` by this worker): the home lanes from `turn` on,
    /// then the others.
    fn acquire_free(&self, home: &[usize], turn: usize, away: &[usize]) -> Option<usize> {
        let homes = (0..home.len()).map(|i| home[(turn + i) % home.len()]);
        homes.chain(away.iter().copied()).find(|&l| {
            let lane = &self.shared.lanes[l];
            lane.word.phase() == Phase::Free
                && !lane.rx.is_empty()
                && lane.word.try_acquire(self.me)
        })
    }

    /// Spins a little before sleeping, as a channel's receiver does; `true` if work showed up.
    ///
    /// While it spins it counts as searching, and submits wake nobody: it will see their tasks.
    /// It stops counting before it looks for the last time (a sleeper's registration then
    /// re-checks, so a submit that saw it searching is not lost).
    fn spin_for_work(&self) -> bool {
        let searching = &self.shared.searching;
        searching.fetch_add(1, Ordering::SeqCst);
        let backoff = Backoff::new();
        let mut yields = 0;
        while yields < SPIN_YIELDS {
            if self.free_work() {
                searching.fetch_sub(1, Ordering::SeqCst);
                return true;
            }
            if backoff.is_completed() {
                std::thread::yield_now();
                yields += 1;
            } else {
                backoff.snooze();
            }
        }
        searching.fetch_sub(1, Ordering::SeqCst);
        self.free_work()
    }

    /// A lane whose owner has been inside one task for [`STEAL_AFTER`] with tasks waiting.
    fn stuck_lane(&self) -> Option<(usize, Watch)> {
        let lanes = &self.shared.lanes;
        let seen: Vec<Option<Watch>> = lanes
            .iter()
            .map(|l| l.word.watch().filter(|_| !l.rx.is_empty()))
            .collect();
        if seen.iter().all(Option::is_none) {
            return None;
        }
        let t0 = Instant::now();
        while t0.elapsed() < STEAL_AFTER {
            std::hint::spin_loop();
        }
        seen.iter().enumerate().find_map(|(l, w)| {
            let w = (*w)?;
            lanes[l].word.is_still(&w).then_some((l, w))
        })
    }

    /// Takes lane `l` from its owner, stuck in the task `w` saw, deferring that task's key.
    fn steal(&self, l: usize, w: Watch) -> bool {
        let lane = &self.shared.lanes[l];
        let chain = Arc::new(Deferred {
            inner: Mutex::new(DeferredInner {
                queue: VecDeque::new(),
                active: true,
            }),
        });
        // The lane word carries a raw pointer to one strong count; the victim takes it back.
        let p = NonNull::new(Arc::into_raw(chain.clone()).cast_mut()).expect("non-null");
        let victim = &self.shared.mailboxes[w.owner()];
        if let Err(p) = lane.word.try_steal(self.me, &w, victim, p) {
            // SAFETY: `p` came from `Arc::into_raw` above and was handed back unused.
            drop(unsafe { Arc::from_raw(p.as_ptr()) });
            return false;
        }
        let mut map = lane.deferred.lock().unwrap();
        let old = map.insert(w.key_hash() as u64, chain);
        debug_assert!(old.is_none(), "a key running directly has no chain");
        lane.deferred_len.store(map.len(), Ordering::Relaxed);
        true
    }

    /// Runs lane `l`, which this worker owns (`OWNED`), until it is empty, its budget is spent,
    /// or it is taken.
    fn serve(&self, l: usize) -> LeftLane {
        let lane = &self.shared.lanes[l];
        let mut ran = 0;
        loop {
            if ran == BUDGET {
                lane.word.release(self.me);
                return LeftLane::Budget;
            }
            let (key, task) = match lane.rx.try_recv() {
                Ok(item) => item,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {
                    lane.word.release(self.me);
                    // Pairs with a submit's fence: it sees FREE and wakes someone, or this sees
                    // its task.
                    fence(Ordering::SeqCst);
                    if !lane.rx.is_empty() && lane.word.try_acquire(self.me) {
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
            let run = lane.word.begin(self.me, key as usize);
            task.run();
            self.shared.done.completed();
            match lane.word.end(run, &self.shared.mailboxes[self.me]) {
                Ended::Kept => {}
                Ended::Stolen(p) => {
                    // SAFETY: the thief made `p` with `Arc::into_raw` and gave up its claim.
                    let chain = unsafe { Arc::from_raw(p.as_ptr().cast_const()) };
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
            task.run();
            self.shared.done.completed();
        }
    }

    fn free_work(&self) -> bool {
        self.shared
            .lanes
            .iter()
            .any(|l| l.word.phase() == Phase::Free && !l.rx.is_empty())
    }

    /// Whether any lane has tasks queued (behind an owner, since no lane is free with work
    /// when this is asked): its owner may get stuck in a task, so a sleeper must keep looking.
    fn queued_anywhere(&self) -> bool {
        self.shared.lanes.iter().any(|l| !l.rx.is_empty())
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
        if self.queued_anywhere() {
            self.parker.park_timeout(POLL);
            self.deregister();
            return;
        }
        // A deep sleep: a submit behind a running task wakes it (see `Shared::submit`).
        sh.deep.fetch_add(1, Ordering::SeqCst);
        if self.queued_anywhere() || self.free_work() {
            self.deregister();
        } else {
            self.parker.park();
        }
        sh.deep.fetch_sub(1, Ordering::SeqCst);
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
        self.shared.submit(key, InlineTask::new(task));
    }

    #[inline]
    fn submit_boxed(&self, key: u64, task: Task) {
        self.shared.submit(key, InlineTask::new(task));
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

    /// A value that counts its drops.
    struct Counted(Arc<AtomicU32>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn inline_tasks_run_or_drop_exactly_once_small_or_boxed() {
        let ran = Arc::new(AtomicU32::new(0));
        let drops = Arc::new(AtomicU32::new(0));
        let small = {
            let (ran, c) = (ran.clone(), Counted(drops.clone()));
            InlineTask::new(move || {
                let _c = c;
                ran.fetch_add(1, Ordering::Relaxed);
            })
        };
        let big = {
            let (ran, c, pad) = (ran.clone(), Counted(drops.clone()), [7u64; 8]);
            InlineTask::new(move || {
                let _c = c;
                ran.fetch_add(pad.iter().sum::<u64>() as u32, Ordering::Relaxed);
            })
        };
        let unrun = {
            let c = Counted(drops.clone());
            InlineTask::new(move || drop(c))
        };
        small.run();
        big.run();
        drop(unrun);
        assert_eq!(ran.load(Ordering::Relaxed), 1 + 56);
        assert_eq!(
            drops.load(Ordering::Relaxed),
            3,
            "each closure dropped once"
        );
    }

    /// Both workers asleep when a burst arrives whose first task blocks: the other keys must
    /// all run while it blocks. (The lost wake W4 found, where one worker searched through the
    /// whole burst so no submit woke the other, depends on thread timing this test does not
    /// control: it reproduced in 5 of 16 `compare` W4 runs before the fix, 0 of 40 after; this
    /// test passes either way and guards the property, not that race.)
    #[test]
    fn a_burst_behind_a_blocking_task_runs_while_it_blocks() {
        for _ in 0..20 {
            let exec = StealLanes::new(2, 4);
            std::thread::sleep(Duration::from_millis(5));
            let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(0);
            let fast_done = Arc::new(AtomicU32::new(0));
            exec.submit(0, move || release_rx.recv().unwrap());
            for i in 0..400u64 {
                let fast_done = fast_done.clone();
                exec.submit(1 + i % 100, move || {
                    fast_done.fetch_add(1, Ordering::Relaxed);
                });
            }
            let t0 = Instant::now();
            while fast_done.load(Ordering::Relaxed) < 400 {
                assert!(
                    t0.elapsed() < Duration::from_secs(5),
                    "fast keys waited behind key 0"
                );
                std::thread::sleep(Duration::from_micros(200));
            }
            release_tx.send(()).unwrap();
            assert!(exec.wait_idle(Duration::from_secs(10)));
        }
    }

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
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "fast keys waited behind key 0"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            log.lock().unwrap().is_empty(),
            "key 0 ran past its blocked task"
        );
        release_tx.send(()).unwrap();
        assert!(exec.wait_idle(Duration::from_secs(10)));
        assert_eq!(*log.lock().unwrap(), vec![0, 1, 2, 3]);
    }
}
