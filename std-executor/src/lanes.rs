//! Lanes: the front door of every keyed submission.
//!
//! Keys hash onto a fixed number of *lanes* (twice the core workers, a power of two); each lane is
//! a FIFO of items (key and task, [`Stored`]; the owner hashes the key again when it pops it) in
//! submission order, stored in the FIFO's slots themselves (core's [`keyserial_core::fifo`]). A
//! lane is not tied to a thread: any worker may *own* it, and only its owner pops it, under core's
//! lane word ([`keyserial_core::lane`], whose module docs give the ownership protocol and the
//! steal). A plain task of a key that holds no state runs straight from the lane: no key table, no
//! chain, no per-key allocation, and the worker reads tasks in the order they were written, several
//! to a cache line. Keys that need state (a permit wait, a backlog moved off the lane for
//! fairness or shed to an idle worker, and the tasks queued behind one) are *tracked*: the owner
//! routes their items onto the key's chain, in lane order (`route.rs`). A `submit_latest` task
//! does not make its key tracked: its lane item is a cell the task can still be replaced in
//! (`latest_cells.rs`), routed like a plain item once popped. A key whose task blocks is *deferred* when an idle worker takes the lane over
//! (`deferral.rs`): only that key waits.
//!
//! # Waking for a push (no lost wakeup)
//!
//! A submitter pushes its item, then reads the sleep word once, `SeqCst` (`sleep.rs`: how many
//! workers search, how many sleep); on a busy serializer that is all it does, and it reads
//! nothing the workers write per task:
//!
//! - **A worker searches:** nothing to do. A searcher finds the item, or registers as asleep and
//!   then looks again (below).
//! - **Nobody searches or sleeps** (every worker is inside a task or serving a lane): nothing to
//!   wake; every worker looks at the lanes before it sleeps. (The elastic pool hears of it.)
//! - **A worker sleeps and none searches:** it reads the lane's phase (`SeqCst`). `FREE`: nobody will pop
//!   the lane unless a worker comes: it notifies (one wakeup; `sleep.rs`). `OWNED`/`RUNNING`: the
//!   owner pops the item after its current task, so it notifies only if some sleeper is *deep*
//!   (below) and would not notice that owner getting stuck.
//!
//! The pairings (checked by `loom/tests/lanes.rs`). On the workers' side: a write, a `SeqCst`
//! fence, then a look at the lanes' FIFOs. On the submitter's side: the push, whose reserving CAS
//! is `SeqCst` (`Fifo::push`), then `SeqCst` loads, and no fence. Whichever side comes second
//! sees the other's write. Why, in the C++20 model that Rust uses ([atomics.order] p4): say the
//! worker's look misses the push and the submitter's load misses the worker's write. The look
//! reads the tail before the CAS and the worker's fence happens before the look, so the fence
//! precedes the CAS in the single total order `S` (p4.3); the submitter's `SeqCst` load reads
//! before the worker's write, which happens before the fence, so the load precedes the fence in
//! `S` (p4.2); and the CAS precedes the load in `S` (same thread, both `SeqCst`). That is a
//! cycle in `S`, so one of the two sees the other. On x86-64 the CAS is a locked instruction and
//! the loads are plain moves: the submitter pays no fence (a `SeqCst` fence there drains the
//! store buffer, and with it the write miss on the slot just filled). Loom models `SeqCst`
//! accesses as acquire/release only, so under `cfg(loom)` the submitter issues a `SeqCst` fence
//! after its push instead: the models check the protocol with the fence, and the argument above
//! carries it to the fence-free code.
//!
//! - **An owner that finds its lane empty** releases it (`FREE`), fences and looks at the queue
//!   once more, re-acquiring it if it is not empty: either it sees the item or the submitter sees
//!   `FREE`.
//! - **A worker going to sleep** registers in the sleep word (`Sleep::try_sleep`), fences and
//!   looks for a `FREE` lane with items; if there is one it does not park. Either it sees the
//!   item or the submitter sees it asleep.
//! - **An owner may stay inside one task for long.** Idle workers notice that by comparing lanes
//!   at two looks (`worker/steal.rs`): a sleeper whose look found any lane with queued items parks only
//!   for [`POLL`] and looks again; one that found every lane empty registers as a *deep* sleeper
//!   first (`deep += 1`, fence), then looks at the lanes once more. Either the submitter sees
//!   `deep > 0` and notifies, or the sleeper sees the item and only naps.
//!
//! With the elastic pool, a push behind an owner while no worker is idle also stamps the
//! starvation clock (`Shared::starving`), as a ready chain does.
//!
//! # Per-key order
//!
//! A key's items leave its one lane in push order, popped by one owner at a time (ownership
//! passes by Release/Acquire on the lane word). Each is then run directly by the owner, or pushed
//! onto the key's chain, or onto the key's deferral, and each of those runs its items in push
//! order, by one runner at a time; `route.rs` shows that a key is never in two of those places
//! with items at once.
//!
//! # Loom
//!
//! The two halves of "Waking for a push" are the generic functions [`push_then_look`] and
//! [`release_then_look`] (with [`take_if_free`] and [`any_queued`]), which `Lanes` and `Lane`
//! call; under `cfg(loom)` they are exported as `loom_hooks` (through `loom_api::lanes`) and the
//! lane's FIFO is a loom-aware stand-in for core's `Fifo` (see [`Fifo`]), so the models in
//! `loom/tests/lanes.rs` run this very code over core's real lane word.

use std::hash::{BuildHasher, Hash};

use crossbeam_utils::CachePadded;
use keyserial_core::lane::{Lane as LaneWord, Phase, Watch};

use crate::deferral::Deferrals;
use crate::lane_task::{Item, LaneTask, Stored, TaskBytes};
use crate::push_marks::{PushMarks, EVERY};
use crate::sleep::Idle;
use crate::sync::{fence, Arc, AtomicBool, AtomicU32, AtomicUsize, Ordering};
use keyserial_core::fifo::Tag;

/// A lane's FIFO: core's [`keyserial_core::fifo::Fifo`] (items stored in blocks of slots, in push
/// order; one popper at a time: the lane's owner).
#[cfg(not(loom))]
pub(crate) type Fifo<T> = keyserial_core::fifo::Fifo<T>;

/// A lane's FIFO under loom: a stand-in with the real FIFO's orderings (`loom_fifo.rs`).
#[cfg(loom)]
pub use crate::loom_fifo::Fifo;

/// What a submitter must do after its push (see "Waking for a push").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterPush {
    /// Nothing: a worker is awake and will look, or the lane's owner will pop the item.
    Nothing,
    /// Wake a sleeper.
    Notify,
    /// Nothing to wake, and every worker is inside a task: the elastic pool's hint.
    AllBusy,
}

/// The submitter's half of "Waking for a push": `push` pushes an item onto the lane of `word`
/// (a push onto its FIFO, `Fifo::try_push_with` or `try_push_tagged`, whose reserving CAS is
/// `SeqCst`; `Err` if the lane is closed), then this reads `idle()` (whether some worker is
/// registered asleep, and whether some worker is searching: one `SeqCst` load of the sleep
/// word) and, only if a worker sleeps and none searches, the lane's phase and `deep`
/// (`SeqCst`). No fence: the push's `SeqCst` CAS pairs with the workers' fences (module docs),
/// except under loom, which needs the fence.
#[inline]
pub fn push_then_look<E>(
    word: &LaneWord,
    push: impl FnOnce() -> Result<(), E>,
    deep: &AtomicUsize,
    idle: impl FnOnce() -> Idle,
) -> Result<AfterPush, E> {
    push()?;
    #[cfg(loom)]
    fence(Ordering::SeqCst);
    Ok(match idle() {
        Idle {
            searching: true, ..
        } => AfterPush::Nothing,
        Idle {
            asleep: false,
            searching: false,
        } => AfterPush::AllBusy,
        Idle {
            asleep: true,
            searching: false,
        } => {
            if word.phase_after_push() == Phase::Free || deep.load(Ordering::SeqCst) > 0 {
                AfterPush::Notify
            } else {
                AfterPush::Nothing
            }
        }
    })
}

/// The owner's half of "Waking for a push": the owner `me` found the lane (`word`, `queue`)
/// empty; releases it, issues a `SeqCst` fence, and looks once more. `true` if an item came
/// meanwhile and `me` owns the lane again.
#[inline]
pub fn release_then_look<T>(word: &LaneWord, queue: &Fifo<T>, me: usize) -> bool {
    word.release(me);
    fence(Ordering::SeqCst);
    !queue.is_empty() && word.try_acquire(me)
}

/// Whether the lane (`word`, `queue`) is `FREE` with items queued.
#[inline]
pub(crate) fn is_free_with_items<T>(word: &LaneWord, queue: &Fifo<T>) -> bool {
    word.phase() == Phase::Free && !queue.is_empty()
}

/// Takes the lane (`word`, `queue`) for `me` if it is `FREE` with items queued.
#[inline]
pub fn take_if_free<T>(word: &LaneWord, queue: &Fifo<T>, me: usize) -> bool {
    is_free_with_items(word, queue) && word.try_acquire(me)
}

/// Whether any of `queues` has items queued.
#[inline]
pub(crate) fn any_queued<'a, T: 'a>(mut queues: impl Iterator<Item = &'a Fifo<T>>) -> bool {
    queues.any(|q| !q.is_empty())
}

/// Hooks for the loom models in `loom/` (only under `cfg(loom)`): the halves of "Waking for a
/// push" that `Lanes::push`, `Lane::release_or_keep`, `Lanes::try_take` and
/// `Lanes::queued_anywhere` are made of, over any item type.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_hooks {
    use keyserial_core::lane::Lane as LaneWord;

    use crate::sync::AtomicUsize;

    pub use super::{
        release_then_look as release_or_keep, take_if_free as try_take, AfterPush, Fifo,
    };

    /// `Lanes::push`'s half of "Waking for a push" over `queue`, for an item without a tag:
    /// `push_then_look` with `Fifo::try_push_with(make)` (`make` handed back if it is closed).
    pub fn push<T, F: FnOnce() -> T>(
        word: &LaneWord,
        queue: &Fifo<T>,
        make: F,
        deep: &AtomicUsize,
        idle: impl FnOnce() -> crate::sleep::Idle,
    ) -> Result<AfterPush, F> {
        super::push_then_look(word, || queue.try_push_with(make), deep, idle)
    }

    /// `Lanes::free_work` over `lanes`: some lane `FREE` with items queued.
    pub fn free_work<T>(lanes: &[(&LaneWord, &Fifo<T>)]) -> bool {
        lanes.iter().any(|(w, q)| super::is_free_with_items(w, q))
    }

    /// `Lanes::queued_anywhere` over `queues`.
    pub fn queued_anywhere<T>(queues: &[&Fifo<T>]) -> bool {
        super::any_queued(queues.iter().copied())
    }
}

/// How long a sleeper naps while some lane has items queued behind a busy owner (it must
/// notice an owner stuck in one task).
pub(crate) const POLL: std::time::Duration = std::time::Duration::from_micros(100);

/// How long a lane's word must stand still in `RUNNING`, with items waiting behind it, before
/// an idle worker takes the lane over: long against a streaming owner's task (which moves the
/// word at every task), short against a blocked one.
pub(crate) const STEAL_AFTER: std::time::Duration = std::time::Duration::from_micros(20);

/// The worker id `shutdown_now` uses to take lanes (never a real worker's).
pub(crate) const STOPPER: usize = keyserial_core::lane::MAX_WORKER;

/// One lane: its ownership word, its FIFO and the keys deferred from it.
pub(crate) struct Lane<K> {
    pub(crate) word: CachePadded<LaneWord>,
    /// Every item on it is pushed by [`Lanes::push`], with its task's table as the slot's tag
    /// ([`LaneTask::into_parts`]), which [`Lane::pop`] turns back into the table: an untagged
    /// push would hand `pop` a tag that is no table. Private, so only this module reaches the
    /// FIFO, and in it only `Lanes::push` pushes (the rest of the crate sees the lane through
    /// `Lane`'s and `Lanes`' methods, none of which pushes).
    queue: Fifo<Stored<K>>,
    /// Keys whose items go to a deferral (only the lane's owner touches it).
    pub(crate) deferrals: Deferrals<K>,
    /// The key table's hasher: a popped item's hash is its key's, computed again (see
    /// [`Stored`]).
    hasher: KeyHasher,
    /// By when its items were pushed (`push_marks.rs`): the age of a task still in the lane.
    marks: PushMarks,
}

impl<K> Drop for Lane<K> {
    fn drop(&mut self) {
        // The FIFO would drop its slots' `Stored` items, whose task bytes alone leak the task:
        // join each to its tag first.
        // SAFETY: `&mut self`: the only popper.
        while let Some((tag, stored)) = unsafe { self.queue.pop_tagged() } {
            // SAFETY: `Lanes::push` stored a task's parts as the tag and the bytes; popped once.
            drop(unsafe { LaneTask::from_parts(tag, stored.bytes) });
        }
    }
}

impl<K> Lane<K> {
    /// The time (on `clock`, the serializer's milliseconds) by which the lane's item of index
    /// `index` had been pushed: never earlier than the truth, so `now - pushed_by` never
    /// overstates how long it has waited (`push_marks.rs`). Marks the lane now if no mark
    /// covers the item yet.
    pub(crate) fn pushed_by(&self, index: u64, clock: impl FnOnce() -> u64) -> u64 {
        if let Some(ms) = self.marks.pushed_by(index) {
            return ms;
        }
        // The count before the clock: every item below it was pushed by `ms`; the item was
        // pushed before this call, so it is below.
        let n = self.queue.pushed() as u64;
        let ms = clock();
        debug_assert!(n > index, "item {index} not pushed ({n} pushed)");
        self.marks.note(n, ms);
        ms
    }

    /// Marks the lane at `clock`'s time if it holds items (`push_marks.rs`, "Who marks").
    pub(crate) fn mark(&self, clock: impl FnOnce() -> u64) {
        if self.queue.is_empty() {
            return;
        }
        let n = self.queue.pushed() as u64;
        let ms = clock();
        if self.marks.is_due(ms) {
            self.marks.note(n, ms);
        }
    }
}

/// A task still in its lane's slot, seen by [`Lane::for_each_queued`].
pub(crate) struct QueuedTask<'a> {
    tag: &'a mut Tag,
    bytes: &'a mut TaskBytes,
}

impl QueuedTask<'_> {
    /// Takes the task out of the slot, leaving a tombstone.
    pub(crate) fn take(self) -> LaneTask {
        // SAFETY: `for_each_queued` hands out only a slot holding one task's parts (never a
        // tombstone), unused since they were pushed, to the lane's owner, the one thread that
        // touches a written slot; the tombstone left behind is skipped by every pop.
        unsafe { LaneTask::take_in_place(self.tag, self.bytes) }
            .expect("for_each_queued skips tombstones")
    }
}

/// The key table's hasher (`shared.rs`), which the lanes share.
pub(crate) type KeyHasher = foldhash::fast::RandomState;

impl<K: Hash> Lane<K> {
    /// Takes the lane's oldest item, if any, with its key's hash computed again (the slot does
    /// not store it: 48-byte slots instead of 56, see `lane_task.rs`; this is the one place
    /// that hashes a key a second time). The submitter hashed the key, or the key it cloned
    /// this one from, with the same hasher, so for a key type whose `Hash` is deterministic and
    /// agrees with its `Clone` (as every `HashMap` key's must) the two agree; for one whose
    /// `Hash` does not, the item may go to another key's chain or deferral: order and overlap
    /// then mean nothing for that key, as for a `HashMap`, and nothing is lost.
    ///
    /// The `Hash` is user code (`user.rs`): if it panics, the item's key is dropped, its task
    /// goes to `failed` (to be failed with the payload, out of line) and the next item is
    /// popped; the lane is as it would be after any pop. (The return type stays an
    /// `Option<Item>`, whose move the hot loop is laid out for, `lane_task.rs`.)
    ///
    /// # Safety
    ///
    /// The caller owns the lane (its word names the caller as owner, or it is being dropped):
    /// the lane word passes ownership with Release/Acquire, which is what the FIFO's one
    /// popper at a time needs.
    #[inline(always)]
    pub(crate) unsafe fn pop(&self, failed: impl FnMut(KeyPanicked)) -> Option<Item<K>> {
        let mut failed = failed;
        loop {
            // SAFETY: the caller's contract.
            let (key, task) = unsafe { self.pop_unhashed() }?;
            match crate::user::catch(|| self.hasher.hash_one(&key)) {
                Ok(hash) => return Some(Item { key, hash, task }),
                Err(payload) => {
                    crate::user::drop_quietly(key);
                    failed(KeyPanicked { task, payload });
                }
            }
        }
    }

    /// Takes the lane's oldest item, if any, without hashing its key (`shutdown_now` and a
    /// stopped owner hand items back: no hash needed, no user code run).
    ///
    /// # Safety
    ///
    /// As [`pop`](Self::pop).
    #[inline(always)]
    pub(crate) unsafe fn pop_unhashed(&self) -> Option<(K, LaneTask)> {
        loop {
            // SAFETY: the caller owns the lane, so it is the FIFO's only popper (above).
            let (tag, Stored { key, bytes }) = unsafe { self.queue.pop_tagged() }?;
            if tag == LaneTask::tombstone_tag() {
                // Its task was taken out in place (`for_each_queued`): only the key is left.
                crate::user::drop_quietly(key);
                continue;
            }
            // SAFETY: `Lanes::push` stored a task's parts as the tag and the bytes; popped once.
            let task = unsafe { LaneTask::from_parts(tag, bytes) };
            return Some((key, task));
        }
    }

    /// Visits every item queued in the lane, oldest first, in place (tombstones skipped): `f`
    /// gets the item's key and its task still in the slot, which it may take out
    /// ([`QueuedTask::take`], leaving a tombstone that a pop skips).
    ///
    /// # Safety
    ///
    /// As [`pop`](Self::pop): the caller owns the lane. `f` must not pop the lane or give it up.
    pub(crate) unsafe fn for_each_queued(&self, mut f: impl FnMut(&K, QueuedTask<'_>)) {
        // SAFETY: the caller's contract.
        unsafe { self.for_each_queued_at(|k, _, t| f(k, t)) };
    }

    /// As [`for_each_queued`](Self::for_each_queued), with each item's index in push order
    /// (the `i`-th item ever pushed to the lane), for [`pushed_by`](Self::pushed_by).
    ///
    /// # Safety
    ///
    /// As [`for_each_queued`](Self::for_each_queued).
    pub(crate) unsafe fn for_each_queued_at(&self, mut f: impl FnMut(&K, u64, QueuedTask<'_>)) {
        // The caller is the popper: the head does not move under the walk, which visits every
        // slot from it on (tombstones too), one index each.
        let mut index = self.queue.popped() as u64;
        // SAFETY: the caller owns the lane (the FIFO's only popper); the closure neither pops
        // nor passes the turn.
        unsafe {
            self.queue.for_each_queued_mut(|tag, stored| {
                if *tag != LaneTask::tombstone_tag() {
                    f(
                        &stored.key,
                        index,
                        QueuedTask {
                            tag,
                            bytes: &mut stored.bytes,
                        },
                    );
                }
                index += 1;
            })
        };
    }

    /// The owner, for an item it just popped: into its key's open deferral (`None`, with the
    /// time its push is known by) or back to be routed (see [`Deferrals::divert`]).
    #[inline]
    pub(crate) fn divert(
        &self,
        item: Item<K>,
        hash: u64,
        clock: impl FnOnce() -> u64,
    ) -> Option<Item<K>> {
        // The popper just took the item: the oldest index left is one past it.
        let index = || self.queue.popped() as u64 - 1;
        self.deferrals
            .divert(item, hash, || self.pushed_by(index(), clock))
    }

    /// Hints the CPU to fetch the next item's task data (`lane_task.rs`, "Looking ahead"),
    /// if the next item is written.
    ///
    /// # Safety
    ///
    /// As [`pop`](Self::pop): the caller owns the lane.
    #[inline(always)]
    pub(crate) unsafe fn look_ahead(&self) {
        // SAFETY: the caller owns the lane, so it is the FIFO's only popper; the closure only
        // hints the cache (it neither pops nor passes the lane on).
        // The tag and bytes are one task's parts (`Lanes::push`), only looked at.
        unsafe {
            self.queue
                .peek_tagged(|tag, stored| LaneTask::prefetch_parts(tag, &stored.bytes))
        };
    }

    /// Whether the lane holds no item (a snapshot).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// How many items the lane holds (a snapshot).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// The owner `me` found the lane empty: releases it, then looks once more (see "Waking for
    /// a push"); `true` if an item came meanwhile and `me` owns the lane again.
    pub(crate) fn release_or_keep(&self, me: usize) -> bool {
        release_then_look(&self.word, &self.queue, me)
    }
}

/// Live key-table entries per lane, counted in [`BUCKETS`] buckets by key hash: a plain item
/// whose bucket counts 0 in its lane belongs to no tracked key, and the lane's owner runs it
/// without looking at the table. Raised when a key's state is made, lowered when it is freed
/// (`KeyState`'s drop), so a bucket never reads 0 while a key of it is tracked. One tracked key
/// (a permit wait, a hot or shed key) sends 1 in [`BUCKETS`] of its lane's other keys through the
/// table, not all of them. Measured (1 M empty tasks over 1,000 keys, 2 workers, with 8 hot keys
/// kept tracked beside them): with one count per lane the 8 tracked keys slowed the run by
/// 1.04-1.20x (median 1.15x over 6 runs); with buckets by 0.95-1.14x (median 1.00x), and the run
/// without tracked keys is level (8 alternating runs). The protocol is the single count's, per
/// bucket: the same party raises a bucket before it makes the state and reads it before it runs
/// an item directly.
pub(crate) struct Tracked {
    counts: Box<[CachePadded<[AtomicU32; BUCKETS]>]>,
}

/// Buckets of a lane's tracked count (see [`Tracked`]).
pub(crate) const BUCKETS: usize = 64;

/// The bucket of key hash `hash`: bits 24-29, below the lane index's (40 and up), so the keys
/// of one lane spread over every bucket. (The table's trie reaches these bits only at depth 4,
/// which costs nothing here: a bucket only filters which items look the table up.)
#[inline]
pub(crate) fn bucket(hash: u64) -> usize {
    (hash >> 24) as usize % BUCKETS
}

impl Tracked {
    fn new(lanes: usize) -> Tracked {
        Tracked {
            counts: (0..lanes)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU32::new(0))))
                .collect(),
        }
    }

    fn raise(&self, lane: usize, hash: u64) {
        self.counts[lane][bucket(hash)].fetch_add(1, Ordering::Relaxed);
    }

    fn lower(&self, lane: usize, hash: u64) {
        self.counts[lane][bucket(hash)].fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether a key of hash `hash` in lane `lane` may be tracked. The count is raised by the
    /// router (or a deferral's runner, see `route.rs`) before it makes the key's state, and
    /// either that is this thread or its raise happened before this read (lane ownership or a
    /// deferral's lock passes from one to the other): never a stale 0 while a key of the bucket
    /// is tracked.
    #[inline]
    pub(crate) fn any(&self, lane: usize, hash: u64) -> bool {
        self.counts[lane][bucket(hash)].load(Ordering::Relaxed) != 0
    }
}

/// A key's claim on its lane's tracked count: made with the key's state, dropped with it.
pub(crate) struct TrackToken {
    tracked: Arc<Tracked>,
    lane: usize,
    hash: u64,
}

impl TrackToken {
    pub(crate) fn new(tracked: &Arc<Tracked>, lane: usize, hash: u64) -> TrackToken {
        tracked.raise(lane, hash);
        TrackToken {
            tracked: tracked.clone(),
            lane,
            hash,
        }
    }
}

impl Drop for TrackToken {
    fn drop(&mut self) {
        self.tracked.lower(self.lane, self.hash);
    }
}

/// A popped item whose key's `Hash` panicked when the lane's owner hashed it again
/// ([`Lane::pop`]): its task, to be failed with the payload.
pub(crate) struct KeyPanicked {
    pub(crate) task: LaneTask,
    pub(crate) payload: crate::user::Payload,
}

/// A push refused because the lanes are closed (see "Admission"); its item was never built.
#[derive(Debug)]
pub(crate) struct Closed;

/// The lanes of one serializer.
pub(crate) struct Lanes<K> {
    lanes: Box<[Lane<K>]>,
    mask: usize,
    pub(crate) tracked: Arc<Tracked>,
    /// Sleepers parked until woken (no lane had items when they looked); see the module docs.
    pub(crate) deep: CachePadded<AtomicUsize>,
    /// `shutdown_now` has taken every lane for good.
    pub(crate) stopped: AtomicBool,
    /// Every lane's FIFO is closed (`close`).
    closed: AtomicBool,
    /// The serializer's clock's zero ([`now_ms`](Self::now_ms)).
    start: std::time::Instant,
}

impl<K> Lanes<K> {
    /// `n` lanes (a power of two), whose items' keys hash with `hasher` (the key table's).
    pub(crate) fn new(n: usize, hasher: &KeyHasher) -> Lanes<K> {
        assert!(n.is_power_of_two(), "a power of two lanes");
        Lanes {
            lanes: (0..n)
                .map(|_| Lane {
                    word: CachePadded::new(LaneWord::new()),
                    queue: Fifo::new(),
                    deferrals: Deferrals::new(),
                    hasher: hasher.clone(),
                    marks: PushMarks::default(),
                })
                .collect(),
            mask: n - 1,
            tracked: Arc::new(Tracked::new(n)),
            deep: CachePadded::new(AtomicUsize::new(0)),
            stopped: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            start: std::time::Instant::now(),
        }
    }

    /// Milliseconds since the lanes were made (the serializer's clock: the idle and elastic
    /// clocks and the marks of `push_marks.rs` all read it); never 0.
    pub(crate) fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }

    /// Closes every lane to pushes (see "Admission"), then says so (`is_closed`).
    pub(crate) fn close(&self) {
        for lane in self.lanes.iter() {
            lane.queue.close();
        }
        self.closed.store(true, Ordering::Release);
    }

    /// Whether `close` has finished: every push from now on is refused, and every push it let
    /// in is counted in the lanes' positions (`pushed`) and visible to their emptiness checks.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Items ever pushed onto the lanes (each counted once its slot is reserved).
    pub(crate) fn pushed(&self) -> u64 {
        self.lanes.iter().map(|l| l.queue.pushed() as u64).sum()
    }

    /// How many lanes there are.
    pub(crate) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// The lane of a key hash.
    pub(crate) fn index_of(&self, hash: u64) -> usize {
        // The high bits: the table's trie indexes with the low ones.
        (hash >> 40) as usize & self.mask
    }

    pub(crate) fn get(&self, l: usize) -> &Lane<K> {
        &self.lanes[l]
    }

    /// Pushes the item `make` builds onto the lane of `hash`; says whether to wake a worker (see "Waking for a push" in
    /// the module docs). `idle`: someone asleep, someone searching (the sleep word, read once).
    /// A closed lane refuses the push and drops `make` uncalled.
    #[inline]
    pub(crate) fn push(
        &self,
        hash: u64,
        make: impl FnOnce() -> Item<K>,
        idle: impl FnOnce() -> Idle,
    ) -> Result<AfterPush, Closed> {
        let lane = &self.lanes[self.index_of(hash)];
        let stored = move || {
            let Item { key, hash: _, task } = make();
            let (tag, bytes) = task.into_parts();
            (tag, Stored { key, bytes })
        };
        let push = || lane.queue.try_push_tagged(stored);
        match push_then_look(&lane.word, push, &self.deep, idle) {
            Ok(after) => {
                if lane.queue.pushed().is_multiple_of(EVERY) {
                    self.mark_after_push(lane);
                }
                Ok(after)
            }
            Err(_unbuilt) => Err(Closed),
        }
    }

    /// Marks every lane holding items (`push_marks.rs`, "Who marks").
    pub(crate) fn mark_waiting(&self) {
        for lane in self.lanes.iter() {
            lane.mark(|| self.now_ms());
        }
    }

    /// One push in [`EVERY`] marks its lane (`push_marks.rs`).
    #[cold]
    #[inline(never)]
    fn mark_after_push(&self, lane: &Lane<K>) {
        lane.mark(|| self.now_ms());
    }

    /// A lane that is `FREE` with items queued, taken by worker `me`: its home lanes first
    /// (`home = (mine, of)`: lanes `l` with `l % of == mine`), starting with the one after
    /// the home lane it served last (`turn`), then the others. (A worker whose home lanes never
    /// run dry leaves the others to their home workers; a lane left waiting that way is taken by
    /// `WorkerLoop::lane_stuck_since_last_look`.)
    pub(crate) fn acquire_free(
        &self,
        me: usize,
        home: Option<(usize, usize)>,
        turn: usize,
    ) -> Option<usize> {
        let n = self.lanes.len();
        if let Some((mine, of)) = home.filter(|&(mine, _)| mine < n) {
            let count = (n - mine).div_ceil(of);
            if let Some(l) = (0..count)
                .map(|i| mine + ((turn + i) % count) * of)
                .find(|&l| self.try_take(l, me))
            {
                return Some(l);
            }
        }
        (0..n).find(|&l| self.try_take(l, me))
    }

    /// Takes lane `l` for `me` if it is `FREE` with items queued.
    pub(crate) fn try_take(&self, l: usize, me: usize) -> bool {
        let lane = &self.lanes[l];
        take_if_free(&lane.word, &lane.queue, me)
    }

    /// Whether a lane other than `l` is `FREE` with items queued (work for another worker).
    pub(crate) fn free_work_except(&self, l: usize) -> bool {
        self.lanes
            .iter()
            .enumerate()
            .any(|(i, lane)| i != l && is_free_with_items(&lane.word, &lane.queue))
    }

    /// Whether some lane is `FREE` with items queued.
    pub(crate) fn free_work(&self) -> bool {
        self.free_work_except(usize::MAX)
    }

    /// Whether any lane has items queued (perhaps behind an owner that may get stuck).
    pub(crate) fn queued_anywhere(&self) -> bool {
        any_queued(self.lanes.iter().map(|l| &l.queue))
    }

    /// Lanes whose owner is inside a task with items waiting behind it, as seen now.
    pub(crate) fn watch_busy(&self) -> Vec<(usize, Watch)> {
        self.lanes
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.queue.is_empty())
            .filter_map(|(i, l)| l.word.watch().map(|w| (i, w)))
            .collect()
    }
}
