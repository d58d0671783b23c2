//! A worker slot: what the serializer keeps of each worker (the stealing end of its deque, its
//! phase, its counters), and what a worker thread owns while it runs in the slot.

use crossbeam_deque::{Stealer, Worker};
use crossbeam_utils::CachePadded;

use crate::key::Runnable;
use crate::phase::Phase;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering, Parker};

/// Counters a worker slot writes (single writer at a time) and anyone reads.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) started: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) panicked: AtomicU64,
    /// Tasks that left without running: superseded, or cancelled (closed semaphore).
    pub(crate) dropped: AtomicU64,
}

impl Counters {
    /// Single-writer increment: a load and a store, no RMW on the hot path.
    #[inline]
    pub(crate) fn bump(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Release);
    }
}

/// One worker slot: the stealing end of its local queue, its phase and its counters. Slots
/// `0..workers` are the core workers; the rest are for elastic extras.
pub(crate) struct Slot<K> {
    pub(crate) stealer: Stealer<Runnable<K>>,
    /// The slot's local deque while no thread owns the slot.
    pub(crate) local: Mutex<Option<Owned<K>>>,
    pub(crate) phase: CachePadded<Phase>,
    /// The entry whose chain the slot's worker is running (valid while `RUNNING`).
    pub(crate) current: AtomicUsize,
    /// The key of the task the worker runs, as its tagged hash (`hash | 1`; 0: an unkeyed
    /// task), valid while `RUNNING`: `key_stats`' `running` (for a task run straight from a lane
    /// or a deferral, `current` 0) and the self-wait check (`handle::SelfWait`).
    pub(crate) direct_hash: AtomicU64,
    pub(crate) counters: CachePadded<Counters>,
    /// A thread currently owns this slot.
    pub(crate) alive: AtomicBool,
    /// The state of a key whose chain `shutdown_now` stole from this slot's worker, on its way
    /// to the key's handed-back tasks (`state_hold.rs`, "A state lent to a running task").
    pub(crate) lent: Mutex<crate::state_hold::Lent<K>>,
}

/// What the thread running in a slot owns: its local deque and its parker. Kept in the slot's
/// `local` while no thread runs there (elastic slots are reused).
pub(crate) struct Owned<K> {
    pub(crate) deque: Worker<Runnable<K>>,
    pub(crate) parker: Parker,
}
