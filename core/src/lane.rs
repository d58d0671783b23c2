//! A lane's ownership word: which worker pops a lane, whether that worker is inside a task, and
//! the steal by which an idle worker relieves an owner stuck in one task.
//!
//! # What a lane is
//!
//! A *lane* is a FIFO of `(key, task)` in submission order that many keys share (an executor
//! hashes each key onto one lane for ever). It is what the hand-rolled "hash onto N threads"
//! design gets right: a worker reads tasks in the order they were written, one cache line carries
//! several of them, and a key costs nothing. What that design gets wrong is head-of-line blocking:
//! a slow task holds back every other key of its lane. Here a lane is not tied to a thread. A
//! worker *owns* at most one lane at a time and pops it alone; while the owner is inside a task,
//! an idle worker may take the lane over, and only the stuck task's key waits (its later tasks are
//! *deferred*: the new owner routes them to a per-key queue that the stuck worker runs when its
//! task returns). This module is the word that makes those transfers safe; the FIFO, the deferred
//! queues and the choice of *when* to steal are the executor's.
//!
//! # The state word
//!
//! One `AtomicUsize`: `seq << (OWNER_BITS + 2) | owner << 2 | phase`.
//!
//! ```text
//!   FREE(seq)            nobody pops the lane
//!   OWNED(w, seq)        worker w pops it; only w writes the word
//!   RUNNING(w, seq)      w is inside the task it popped last; `current` holds that task's key hash
//! ```
//!
//! | transition | by | how | ordering |
//! |---|---|---|---|
//! | `FREE(s) -> OWNED(w, s)` | any worker, [`Lane::try_acquire`] | CAS | Acquire: the previous owner's pops happened before |
//! | `OWNED(w, s) -> FREE(s)` | the owner, [`Lane::release`] | store | Release: this owner's pops happen before the next owner's |
//! | `OWNED(w, s) -> RUNNING(w, s)` | the owner, [`Lane::begin`] | `current` store, then word store | Release: publishes `current` and the pops to a thief |
//! | `RUNNING(w, s) -> OWNED(w, s + 1)` | the owner, [`Lane::end`] | CAS | failure Acquire: sees the thief's offer |
//! | `RUNNING(w, s) -> OWNED(t, s + 1)` | a thief t, [`Lane::try_steal`] | CAS | AcqRel: takes the pops, publishes the offer |
//!
//! Only the owner writes the word while it is `OWNED`, so `release` and `begin` are plain stores.
//! `RUNNING` is the one phase two workers race on: the owner's `end` and a thief's `try_steal` CAS
//! the same value, and exactly one of them wins. `seq` grows by one at every `end` and every steal,
//! so a given `RUNNING(w, s)` value occurs at most once: a thief whose snapshot is stale (the owner
//! finished that task, even if it is now inside another) fails its CAS.
//!
//! # The handoff
//!
//! A stolen owner must learn *what* was deferred (the executor's per-key queue for `current`),
//! and nothing may wait for it. Each worker has a [`Mailbox`]. A thief, having read `current`
//! under the snapshot it will CAS, builds the deferral, **offers it to the owner's mailbox first**
//! (CAS `null -> p`), and only then CASes the word. If the word CAS fails, it withdraws the offer
//! (nobody else can have taken it: the owner collects only after losing the race) and gets `p`
//! back. If the offer fails, another thief is already in the middle of stealing from the same
//! owner, and this one gives up. The owner whose `end` CAS fails collects its mailbox: the offer is
//! there, because the thief made it before the CAS that beat `end` (offer, Release on the thief's
//! CAS, Acquire on `end`'s failed CAS). A worker collects right after losing a lane, before it can
//! own another, so no offer of an earlier steal is ever left in its mailbox. A *stale* thief's
//! offer can sit there briefly (the thief watched task 10, the owner has moved on to task 20,
//! the thief's offer lands, its CAS fails, it withdraws): harmless, since a stolen owner is the
//! only collector, but a second thief arriving in that window finds the mailbox taken and must
//! come back later. (`end`'s success Acquire is not needed, only its failure Acquire; one
//! ordering for both keeps the call simple and costs nothing on x86.)
//!
//! # Why nothing is lost, run twice, or reordered
//!
//! - **One popper.** A lane is popped only in `OWNED` by its owner; `try_acquire` and `try_steal`
//!   are CASes from `FREE` and from `RUNNING`, never from `OWNED`, so they never take a lane from
//!   a worker in the middle of a pop. Every change of owner is a release by the old owner and an
//!   acquire by the new, so the FIFO's consumer side passes hand to hand.
//! - **A key never runs twice at once.** The owner runs a popped task directly only if its key is
//!   not deferred, and the only task of that key that can be running then is the owner's own
//!   previous one, already finished. When a steal takes the lane while its owner runs key `k`, the
//!   thief defers `k` before it pops anything: every later task of `k` goes to `k`'s queue, which
//!   the stuck owner runs, in order, after its task returns.
//! - **The deferral always reaches the stuck owner** (the handoff above); a failed steal changes
//!   nothing and hands the thief its deferral back.
//!
//! # Progress and limits
//!
//! Every operation is one atomic instruction or a CAS that fails only because another worker made
//! progress; no operation waits for another worker. `current` carries a key *hash*: two keys
//! with the same hash are deferred together (ordered, never concurrent, only one waits longer).
//! Owner ids have 14 bits on 64-bit targets and 10 on 32-bit ones (ids `0..=`[`MAX_WORKER`]).
//! `seq` has the rest: 48 bits on 64-bit targets; on 32-bit targets 20, so a thief stalled between its snapshot and its CAS while one owner ran exactly a
//! multiple of 2^20 tasks of one lane would steal from the wrong task; executors there should
//! re-check the snapshot right before the CAS (which `try_steal` does not do for them).
//!
//! Loom models (the real `Lane` and `Mailbox`): `loom/tests/lane.rs`.

use core::marker::PhantomData;
use core::ptr::{self, NonNull};

use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// Bits of the state word that hold the owner's worker id.
const OWNER_BITS: u32 = if usize::BITS >= 64 { 14 } else { 10 };
/// The largest worker id a lane can record: an executor numbers its workers `0..=MAX_WORKER`
/// (16383 on 64-bit targets, 1023 on 32-bit ones), and the methods that take a worker id `me`
/// panic above it. An id no worker uses (`MAX_WORKER` itself, say) can mark a lane taken for
/// good, as keyserial's shutdown does.
///
/// ```
/// use keyserial_core::lane::{Lane, MAX_WORKER};
/// let lane = Lane::new();
/// assert!(lane.try_acquire(MAX_WORKER));
/// // Nobody else takes the lane until its owner releases it.
/// assert!(!lane.try_acquire(0));
/// ```
pub const MAX_WORKER: usize = (1 << OWNER_BITS) - 1;

const PHASE_MASK: usize = 0b11;
const FREE: usize = 0;
const OWNED: usize = 1;
const RUNNING: usize = 2;
const SEQ_SHIFT: u32 = OWNER_BITS + 2;

const fn pack(seq: usize, owner: usize, phase: usize) -> usize {
    (seq << SEQ_SHIFT) | (owner << 2) | phase
}
const fn owner_of(s: usize) -> usize {
    (s >> 2) & MAX_WORKER
}
const fn seq_of(s: usize) -> usize {
    s >> SEQ_SHIFT
}

/// What a lane's word says right now (a snapshot; see [`Lane::phase`]).
///
/// ```
/// use keyserial_core::lane::{Ended, Lane, Mailbox, Phase};
/// let lane = Lane::new();
/// let mine: Mailbox<()> = Mailbox::new();
/// assert_eq!(lane.phase(), Phase::Free);
/// assert!(lane.try_acquire(0));
/// assert_eq!(lane.phase(), Phase::Owned);
/// let run = lane.begin(0, 5);
/// assert_eq!(lane.phase(), Phase::Running);
/// assert!(matches!(lane.end(run, &mine), Ended::Kept));
/// lane.release(0);
/// assert_eq!(lane.phase(), Phase::Free);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Nobody pops the lane: [`Lane::try_acquire`] may take it.
    Free,
    /// Its owner is popping it.
    Owned,
    /// Its owner is inside a task: [`Lane::try_steal`] may take it.
    Running,
}

/// A lane's ownership word (see the module docs).
///
/// ```
/// use keyserial_core::lane::{Ended, Lane, Mailbox};
///
/// let lane = Lane::new();
/// let mine: Mailbox<u32> = Mailbox::new();
/// assert!(lane.try_acquire(0));
/// let run = lane.begin(0, 42); // about to run a task of key hash 42
/// // ... run the task ...
/// assert!(matches!(lane.end(run, &mine), Ended::Kept));
/// lane.release(0);
/// ```
#[derive(Debug)]
pub struct Lane {
    state: AtomicUsize,
    current: AtomicUsize,
}

impl Default for Lane {
    fn default() -> Self {
        Self::new()
    }
}

/// The owner's proof that it called [`Lane::begin`]; [`Lane::end`] consumes it.
///
/// It is not `Clone`, so each `begin` is ended exactly once.
///
/// ```
/// use keyserial_core::lane::{Ended, Lane, Mailbox};
/// let lane = Lane::new();
/// let mine: Mailbox<()> = Mailbox::new();
/// assert!(lane.try_acquire(3));
/// let run = lane.begin(3, 9);
/// assert!(matches!(lane.end(run, &mine), Ended::Kept));
/// ```
#[must_use = "a running lane must be ended"]
#[derive(Debug)]
pub struct Running {
    state: usize,
}

/// A snapshot of a lane whose owner was inside a task, from [`Lane::watch`]: what a thief checks
/// again ([`Lane::is_still`]) and hands to [`Lane::try_steal`].
///
/// ```
/// use keyserial_core::lane::Lane;
/// let lane = Lane::new();
/// assert!(lane.try_acquire(0));
/// assert!(lane.watch().is_none()); // owned, but not inside a task
/// let _run = lane.begin(0, 11);
/// let w = lane.watch().unwrap();
/// assert_eq!((w.owner(), w.key_hash()), (0, 11));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watch {
    state: usize,
    key_hash: usize,
}

impl Watch {
    /// The worker that was inside the task (whose [`Mailbox`] a steal offers to).
    ///
    /// ```
    /// use keyserial_core::lane::Lane;
    /// let lane = Lane::new();
    /// assert!(lane.try_acquire(2));
    /// let _run = lane.begin(2, 0);
    /// assert_eq!(lane.watch().unwrap().owner(), 2);
    /// ```
    #[inline]
    pub fn owner(&self) -> usize {
        owner_of(self.state)
    }

    /// The key hash of the task it was inside: the key a steal must defer.
    ///
    /// ```
    /// use keyserial_core::lane::Lane;
    /// let lane = Lane::new();
    /// assert!(lane.try_acquire(0));
    /// let _run = lane.begin(0, 0xfeed);
    /// assert_eq!(lane.watch().unwrap().key_hash(), 0xfeed);
    /// ```
    #[inline]
    pub fn key_hash(&self) -> usize {
        self.key_hash
    }
}

/// How [`Lane::end`] found the lane.
///
/// ```
/// use core::ptr::NonNull;
/// use keyserial_core::lane::{Ended, Lane, Mailbox};
/// let lane = Lane::new();
/// let (box0, mut deferral) = (Mailbox::new(), 0u8);
/// assert!(lane.try_acquire(0));
/// let run = lane.begin(0, 1);
/// // Nobody stole: the owner keeps the lane.
/// assert!(matches!(lane.end(run, &box0), Ended::Kept));
/// let run = lane.begin(0, 1);
/// let w = lane.watch().unwrap();
/// assert!(lane.try_steal(1, &w, &box0, NonNull::from(&mut deferral)).is_ok());
/// // Worker 1 stole it: worker 0 gets the deferral and no longer owns the lane.
/// assert!(matches!(lane.end(run, &box0), Ended::Stolen(_)));
/// assert!(box0.is_empty());
/// ```
#[derive(Debug)]
pub enum Ended<T> {
    /// Still this worker's (`OWNED`): pop on.
    Kept,
    /// Taken by a thief while the task ran: the lane is no longer this worker's, and here is the
    /// deferral the thief built for the task's key (collected from this worker's mailbox).
    Stolen(NonNull<T>),
}

impl Lane {
    /// A free lane (`const`, so lanes can live in a `static`).
    ///
    /// ```
    /// use keyserial_core::lane::{Lane, Phase};
    /// static LANES: [Lane; 2] = [Lane::new(), Lane::new()];
    /// assert!(LANES.iter().all(|l| l.phase() == Phase::Free));
    /// ```
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Lane {
            state: AtomicUsize::new(pack(0, 0, FREE)),
            current: AtomicUsize::new(0),
        }
    }

    /// A free lane.
    #[cfg(loom)]
    pub fn new() -> Self {
        Lane {
            state: AtomicUsize::new(pack(0, 0, FREE)),
            current: AtomicUsize::new(0),
        }
    }

    /// The phase right now (Relaxed: for choosing which lane to try, never as a proof).
    ///
    /// ```
    /// use keyserial_core::lane::{Lane, Phase};
    /// let lanes = [Lane::new(), Lane::new()];
    /// assert!(lanes[0].try_acquire(0));
    /// // An idle worker picks a lane nobody pops, then tries to take it.
    /// let free = lanes.iter().position(|l| l.phase() == Phase::Free).unwrap();
    /// assert_eq!(free, 1);
    /// assert!(lanes[free].try_acquire(1));
    /// ```
    #[inline]
    pub fn phase(&self) -> Phase {
        match self.state.load(Ordering::Relaxed) & PHASE_MASK {
            FREE => Phase::Free,
            OWNED => Phase::Owned,
            _ => Phase::Running,
        }
    }

    /// The phase right now, read `SeqCst`: for a submitter's check after its push, which pairs
    /// with an owner's [`release`](Self::release) without a fence on the submitter's side (see
    /// `release`).
    ///
    /// ```
    /// use keyserial_core::fifo::Fifo;
    /// use keyserial_core::lane::{Lane, Phase};
    /// let (lane, queue) = (Lane::new(), Fifo::new());
    /// // A submitter pushes, then finds nobody serving the lane: it must get a worker to take it.
    /// queue.push("task");
    /// if lane.phase_after_push() == Phase::Free {
    ///     assert!(lane.try_acquire(0)); // (or wake a worker that does)
    /// }
    /// assert_eq!(lane.phase(), Phase::Owned);
    /// ```
    #[inline]
    pub fn phase_after_push(&self) -> Phase {
        match self.state.load(Ordering::SeqCst) & PHASE_MASK {
            FREE => Phase::Free,
            OWNED => Phase::Owned,
            _ => Phase::Running,
        }
    }

    /// Takes a free lane for worker `me` (`me <= MAX_WORKER`); `false` if it is not free.
    ///
    /// On success everything the previous owner did before its [`release`](Self::release)
    /// happens before what `me` does next.
    ///
    /// # Panics
    ///
    /// If `me` is above [`MAX_WORKER`].
    ///
    /// ```
    /// use keyserial_core::lane::Lane;
    /// let lane = Lane::new();
    /// assert!(lane.try_acquire(0));
    /// assert!(!lane.try_acquire(1)); // worker 0 owns it
    /// lane.release(0);
    /// assert!(lane.try_acquire(1));
    /// ```
    #[inline]
    pub fn try_acquire(&self, me: usize) -> bool {
        assert!(me <= MAX_WORKER, "worker id out of range");
        let s = self.state.load(Ordering::Relaxed);
        s & PHASE_MASK == FREE
            && self
                .state
                .compare_exchange(
                    s,
                    pack(seq_of(s), me, OWNED),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// The owner `me` stops popping the lane.
    ///
    /// A submitter that pushes to the lane and then finds it `FREE` must make sure some worker
    /// takes it; the usual pairing is: the pusher pushes, fences (SeqCst), reads the phase; the
    /// owner releases, fences (SeqCst), and checks its FIFO once more (taking the lane back with
    /// `try_acquire` if it is not empty). Then at least one of them sees the other. A pusher
    /// whose push ends in a `SeqCst` RMW (core's `Fifo`) may instead skip its fence and read the
    /// phase `SeqCst` ([`phase_after_push`](Self::phase_after_push)): the owner's fence is then
    /// ordered against both of the pusher's accesses in the single `SeqCst` order.
    ///
    /// ```
    /// use core::sync::atomic::{fence, Ordering};
    /// use keyserial_core::fifo::Fifo;
    /// use keyserial_core::lane::Lane;
    /// let (lane, queue) = (Lane::new(), Fifo::<u32>::new());
    /// assert!(lane.try_acquire(0));
    /// // The owner found its FIFO empty: it lets the lane go, then looks once more.
    /// lane.release(0);
    /// fence(Ordering::SeqCst);
    /// if !queue.is_empty() && lane.try_acquire(0) {
    ///     // a push raced with the release: serve it
    /// }
    /// ```
    #[inline]
    pub fn release(&self, me: usize) {
        let s = self.state.load(Ordering::Relaxed);
        debug_assert_eq!(
            (s & PHASE_MASK, owner_of(s)),
            (OWNED, me),
            "release by a non-owner"
        );
        self.state
            .store(pack(seq_of(s), me, FREE), Ordering::Release);
    }

    /// The owner `me` is about to run a task whose key hashes to `key_hash`: from now until
    /// [`end`](Self::end), an idle worker may take the lane.
    ///
    /// `me` must be the owner (checked in debug builds).
    ///
    /// ```
    /// use keyserial_core::lane::{Lane, Phase};
    /// let lane = Lane::new();
    /// assert!(lane.try_acquire(0));
    /// let run = lane.begin(0, 77);
    /// assert_eq!(lane.phase(), Phase::Running);
    /// # let _ = lane.end(run, &keyserial_core::lane::Mailbox::<()>::new());
    /// ```
    #[inline]
    pub fn begin(&self, me: usize, key_hash: usize) -> Running {
        let s = self.state.load(Ordering::Relaxed);
        debug_assert_eq!(
            (s & PHASE_MASK, owner_of(s)),
            (OWNED, me),
            "begin by a non-owner"
        );
        let running = pack(seq_of(s), me, RUNNING);
        self.current.store(key_hash, Ordering::Relaxed);
        // Release: a thief that reads this value also reads `current` and this owner's pops.
        self.state.store(running, Ordering::Release);
        Running { state: running }
    }

    /// The owner's task returned: keeps the lane, or learns that it was stolen and collects, from
    /// `mine` (this worker's mailbox), the deferral the thief offered.
    ///
    /// On [`Ended::Stolen`] the lane belongs to the thief: the old owner runs the deferred tasks
    /// of its key and must not pop the lane again until it takes it anew.
    ///
    /// ```
    /// use keyserial_core::lane::{Ended, Lane, Mailbox, Phase};
    /// let (lane, mine) = (Lane::new(), Mailbox::<()>::new());
    /// assert!(lane.try_acquire(0));
    /// let run = lane.begin(0, 4);
    /// // ... the task runs ...
    /// assert!(matches!(lane.end(run, &mine), Ended::Kept));
    /// assert_eq!(lane.phase(), Phase::Owned); // pop on
    /// ```
    #[inline]
    pub fn end<T>(&self, run: Running, mine: &Mailbox<T>) -> Ended<T> {
        let owned = pack(seq_of(run.state) + 1, owner_of(run.state), OWNED);
        // Failure Acquire: pairs with the thief's Release CAS, so the offer it made before that
        // CAS is visible to the collect below.
        match self
            .state
            .compare_exchange(run.state, owned, Ordering::Acquire, Ordering::Acquire)
        {
            Ok(_) => Ended::Kept,
            Err(_) => match mine.collect() {
                Some(p) => Ended::Stolen(p),
                // A thief always offers before its CAS, and nothing else takes the offer.
                None => unreachable!("a stolen lane's owner found no offer"),
            },
        }
    }

    /// A snapshot of the lane if its owner is inside a task, with that task's key hash.
    ///
    /// ```
    /// use keyserial_core::lane::Lane;
    /// let lane = Lane::new();
    /// assert_eq!(lane.watch(), None); // free
    /// assert!(lane.try_acquire(0));
    /// let _run = lane.begin(0, 21);
    /// assert_eq!(lane.watch().map(|w| w.key_hash()), Some(21));
    /// ```
    #[inline]
    pub fn watch(&self) -> Option<Watch> {
        // Acquire: pairs with `begin`'s Release, so `current` below is the value written for
        // this very task (any later write comes after a transition that changes the word).
        let s = self.state.load(Ordering::Acquire);
        (s & PHASE_MASK == RUNNING).then(|| Watch {
            state: s,
            key_hash: self.current.load(Ordering::Relaxed),
        })
    }

    /// Whether the lane is still exactly as `w` saw it (the same task still running): a thief
    /// watches, waits a while, and steals only from an owner still inside that one task.
    ///
    /// ```
    /// use keyserial_core::lane::{Lane, Mailbox};
    /// let (lane, mine) = (Lane::new(), Mailbox::<()>::new());
    /// assert!(lane.try_acquire(0));
    /// let run = lane.begin(0, 1);
    /// let w = lane.watch().unwrap();
    /// assert!(lane.is_still(&w));
    /// let _ = lane.end(run, &mine);
    /// let _run = lane.begin(0, 1); // the next task, even of the same key
    /// assert!(!lane.is_still(&w));
    /// ```
    #[inline]
    pub fn is_still(&self, w: &Watch) -> bool {
        self.state.load(Ordering::Relaxed) == w.state
    }

    /// Worker `me` takes the lane from the owner `w` saw inside a task, handing that owner
    /// `deferral` (built for `w.key_hash()`) through `victim`, the owner's mailbox.
    ///
    /// `Ok`: the lane is `OWNED` by `me`, the old owner will collect `deferral` when its task
    /// returns, and `me` must route every task of `w.key_hash()` to it until the old owner is
    /// done with it. `Err(deferral)`: nothing changed (the task ended, or another thief is
    /// stealing from the same owner); the deferral is the caller's again.
    ///
    /// # Panics
    ///
    /// If `me` is above [`MAX_WORKER`].
    ///
    /// ```
    /// use core::ptr::NonNull;
    /// use keyserial_core::lane::{Lane, Mailbox, Phase};
    /// let (lane, owners_box) = (Lane::new(), Mailbox::new());
    /// let mut deferral = [0u64; 2]; // the executor's per-key queue, say
    /// assert!(lane.try_acquire(0));
    /// let run = lane.begin(0, 8);
    /// let w = lane.watch().unwrap();
    /// let _ = lane.end(run, &owners_box); // the task returned first:
    /// let p = NonNull::from(&mut deferral);
    /// assert_eq!(lane.try_steal(1, &w, &owners_box, p), Err(p)); // a stale watch fails
    /// let _run = lane.begin(0, 8);
    /// let w = lane.watch().unwrap();
    /// assert_eq!(lane.try_steal(1, &w, &owners_box, p), Ok(()));
    /// assert_eq!(lane.phase(), Phase::Owned); // by worker 1 now
    /// assert!(!owners_box.is_empty()); // the deferral waits for worker 0
    /// ```
    #[inline]
    pub fn try_steal<T>(
        &self,
        me: usize,
        w: &Watch,
        victim: &Mailbox<T>,
        deferral: NonNull<T>,
    ) -> Result<(), NonNull<T>> {
        assert!(me <= MAX_WORKER, "worker id out of range");
        if !victim.offer(deferral) {
            return Err(deferral);
        }
        let stolen = pack(seq_of(w.state) + 1, me, OWNED);
        // Acquire: the old owner's pops; Release: the offer above, for its `end`.
        match self
            .state
            .compare_exchange(w.state, stolen, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => Ok(()),
            Err(_) => {
                let back = victim.withdraw(deferral);
                debug_assert!(back, "only a stolen owner collects an offer");
                Err(deferral)
            }
        }
    }
}

/// A worker's mailbox for the deferral of a steal (see the module docs, "The handoff").
///
/// It holds at most one pointer and never dereferences it: what the pointer means, and who frees
/// it, is the executor's business.
///
/// ```
/// use core::ptr::NonNull;
/// use keyserial_core::lane::{Ended, Lane, Mailbox};
///
/// let lane = Lane::new();
/// let owners_box: Mailbox<u32> = Mailbox::new();
/// assert!(lane.try_acquire(0));
/// let run = lane.begin(0, 7);
/// // Worker 1 finds worker 0 stuck in key hash 7's task and takes the lane.
/// let seen = lane.watch().unwrap();
/// assert_eq!((seen.owner(), seen.key_hash()), (0, 7));
/// let mut deferred_of_7 = 0u32;
/// let p = NonNull::from(&mut deferred_of_7);
/// assert!(lane.try_steal(1, &seen, &owners_box, p).is_ok());
/// // Worker 0's task returns: the lane is gone, the deferral is waiting.
/// match lane.end(run, &owners_box) {
///     Ended::Stolen(q) => assert_eq!(q, p),
///     Ended::Kept => unreachable!(),
/// }
/// ```
#[derive(Debug)]
pub struct Mailbox<T> {
    slot: AtomicPtr<T>,
    _owns: PhantomData<NonNull<T>>,
}

impl<T> Default for Mailbox<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Mailbox<T> {
    /// An empty mailbox (`const`, so one per worker can live in a `static`).
    ///
    /// ```
    /// use keyserial_core::lane::Mailbox;
    /// static BOXES: [Mailbox<u8>; 2] = [Mailbox::new(), Mailbox::new()];
    /// assert!(BOXES.iter().all(Mailbox::is_empty));
    /// ```
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Mailbox {
            slot: AtomicPtr::new(ptr::null_mut()),
            _owns: PhantomData,
        }
    }

    /// An empty mailbox.
    #[cfg(loom)]
    pub fn new() -> Self {
        Mailbox {
            slot: AtomicPtr::new(ptr::null_mut()),
            _owns: PhantomData,
        }
    }

    /// Puts `p` in the empty mailbox (Release: what `p` points to is published with it).
    #[inline]
    fn offer(&self, p: NonNull<T>) -> bool {
        self.slot
            .compare_exchange(
                ptr::null_mut(),
                p.as_ptr(),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Takes `p` back if it is still there.
    #[inline]
    fn withdraw(&self, p: NonNull<T>) -> bool {
        self.slot
            .compare_exchange(
                p.as_ptr(),
                ptr::null_mut(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Empties the mailbox (Acquire: pairs with the offer).
    #[inline]
    fn collect(&self) -> Option<NonNull<T>> {
        NonNull::new(self.slot.swap(ptr::null_mut(), Ordering::Acquire))
    }

    /// Whether the mailbox is empty, that is holds no thief's offer (a snapshot, for assertions
    /// and tests).
    ///
    /// ```
    /// use core::ptr::NonNull;
    /// use keyserial_core::lane::{Ended, Lane, Mailbox};
    /// let (lane, owners_box) = (Lane::new(), Mailbox::new());
    /// let mut deferral = 0u32;
    /// assert!(lane.try_acquire(0));
    /// let run = lane.begin(0, 3);
    /// let w = lane.watch().unwrap();
    /// assert!(lane.try_steal(1, &w, &owners_box, NonNull::from(&mut deferral)).is_ok());
    /// assert!(!owners_box.is_empty());
    /// assert!(matches!(lane.end(run, &owners_box), Ended::Stolen(_)));
    /// assert!(owners_box.is_empty()); // collected
    /// ```
    pub fn is_empty(&self) -> bool {
        self.slot.load(Ordering::Relaxed).is_null()
    }
}

// SAFETY: a mailbox only moves a pointer between threads and never dereferences it; whether the
// pointee may be used on the receiving thread is the contract of whoever offers it, exactly as
// for an `AtomicPtr<T>`, which is `Send + Sync` for every `T`.
unsafe impl<T> Send for Mailbox<T> {}
// SAFETY: as above: every access is one atomic operation on the pointer word.
unsafe impl<T> Sync for Mailbox<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn deferral(v: &mut u32) -> NonNull<u32> {
        NonNull::from(v)
    }

    #[test]
    fn acquire_release_and_a_kept_task() {
        let lane = Lane::new();
        let mine = Mailbox::<u32>::new();
        assert_eq!(lane.phase(), Phase::Free);
        assert!(lane.try_acquire(3));
        assert!(!lane.try_acquire(4), "an owned lane is not free");
        assert_eq!(lane.phase(), Phase::Owned);
        let run = lane.begin(3, 9);
        assert_eq!(lane.phase(), Phase::Running);
        assert!(!lane.try_acquire(4), "a running lane is not free");
        assert!(matches!(lane.end(run, &mine), Ended::Kept));
        assert_eq!(lane.phase(), Phase::Owned);
        lane.release(3);
        assert!(lane.try_acquire(4));
    }

    #[test]
    fn a_steal_hands_the_deferral_to_the_stuck_owner() {
        let lane = Lane::new();
        let boxes = [Mailbox::<u32>::new(), Mailbox::new()];
        assert!(lane.try_acquire(0));
        let run = lane.begin(0, 5);
        let w = lane.watch().expect("running");
        assert_eq!((w.owner(), w.key_hash()), (0, 5));
        assert!(lane.is_still(&w));
        let mut d = 0;
        let p = deferral(&mut d);
        assert!(lane.try_steal(1, &w, &boxes[w.owner()], p).is_ok());
        assert!(!lane.is_still(&w));
        assert_eq!(lane.phase(), Phase::Owned);
        match lane.end(run, &boxes[0]) {
            Ended::Stolen(q) => assert_eq!(q, p),
            Ended::Kept => panic!("the lane was stolen"),
        }
        assert!(boxes[0].is_empty(), "collected");
        // The thief owns it now: it runs tasks and releases it like any owner.
        let run = lane.begin(1, 6);
        assert!(matches!(lane.end(run, &boxes[1]), Ended::Kept));
        lane.release(1);
        assert_eq!(lane.phase(), Phase::Free);
    }

    #[test]
    fn a_stale_watch_cannot_steal_a_later_task() {
        let lane = Lane::new();
        let boxes = [Mailbox::<u32>::new(), Mailbox::new()];
        assert!(lane.try_acquire(0));
        let run = lane.begin(0, 1);
        let w = lane.watch().unwrap();
        assert!(matches!(lane.end(run, &boxes[0]), Ended::Kept));
        // The owner is inside another task now, in the same phase as the snapshot saw.
        let run = lane.begin(0, 1);
        let mut d = 0;
        let p = deferral(&mut d);
        assert_eq!(lane.try_steal(1, &w, &boxes[0], p), Err(p));
        assert!(boxes[0].is_empty(), "the failed steal withdrew its offer");
        assert!(matches!(lane.end(run, &boxes[0]), Ended::Kept));
    }

    #[test]
    fn a_second_thief_gives_up_while_the_first_steals() {
        let lane = Lane::new();
        let boxes = [Mailbox::<u32>::new(), Mailbox::new(), Mailbox::new()];
        assert!(lane.try_acquire(0));
        let run = lane.begin(0, 8);
        let w = lane.watch().unwrap();
        let (mut a, mut b) = (0, 0);
        let (pa, pb) = (deferral(&mut a), deferral(&mut b));
        // Thief 1's offer is in; thief 2 finds the mailbox taken and leaves the lane alone.
        assert!(boxes[0].offer(pa));
        assert_eq!(lane.try_steal(2, &w, &boxes[0], pb), Err(pb));
        assert_eq!(lane.phase(), Phase::Running);
        assert!(boxes[0].withdraw(pa));
        assert!(matches!(lane.end(run, &boxes[0]), Ended::Kept));
    }

    #[test]
    fn watch_sees_only_running_lanes() {
        let lane = Lane::new();
        assert!(lane.watch().is_none());
        assert!(lane.try_acquire(MAX_WORKER));
        assert!(lane.watch().is_none());
        let mine = Mailbox::<u32>::new();
        let run = lane.begin(MAX_WORKER, usize::MAX);
        let w = lane.watch().unwrap();
        assert_eq!((w.owner(), w.key_hash()), (MAX_WORKER, usize::MAX));
        assert!(matches!(lane.end(run, &mine), Ended::Kept));
    }
}
