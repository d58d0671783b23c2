//! A key's state in the table (its chain and idle word), and what a ready queue
//! carries: a key's chain or an unkeyed task.

use std::ptr::NonNull;

use keyserial_core::chain::Chain;
use keyserial_core::table::{Entry, Retire};

use crate::control::Control;
use crate::idle_word::IdleWord;
use crate::key_budget::KeyShare;
use crate::lanes::TrackToken;
use crate::sync::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use crate::task::{Header, TaskRef};

/// Per-key state of a *tracked* key (`lanes.rs`): the key's chain plus what the executor keeps
/// per key.
pub(crate) struct KeyState {
    pub(crate) chain: Chain<Header>,
    /// Idle bookkeeping (see `idle_word.rs`).
    pub(crate) idle: IdleWord,
    /// The key was shed to an idle worker (`worker/serve.rs`, "Sharing a lane with an idle worker"):
    /// its plain items go onto its chain even while the chain is idle (`route.rs`). Read and
    /// written only by the key's router; a stale read only changes which order-safe path an
    /// item takes.
    pub(crate) shed: AtomicBool,
    /// Whether the key is paused, and the wait that holds its parked chain (`control.rs`).
    pub(crate) control: Control,
    /// What `key_stats` reads of the chain (`serializer/keys.rs`).
    pub(crate) seen: Seen,
    /// The key's state (`state.rs`: only the chain's baton holder touches it).
    pub(crate) state: crate::state::StateCell,
    /// The key's share of the serializer's key budget (`key_budget.rs`), given back when the
    /// key is retired.
    pub(crate) share: KeyShare,
    /// The wake state of the chain's head future while it is parked (`future_task.rs`,
    /// "Shutdown"): set by the chain's owner just before it parks, cleared by the next owner
    /// before it polls and taken out by `shutdown_now`'s walk (whether its steal wins or not).
    /// Read only by `shutdown_now`, once every worker has stopped.
    pub(crate) parked_future: AtomicPtr<crate::wake_state::WakeState>,
    /// Counts the key in its lane's tracked keys while the state lives.
    _track: TrackToken,
}

impl KeyState {
    pub(crate) fn new(track: TrackToken, share: KeyShare) -> KeyState {
        KeyState {
            chain: Chain::new(),
            idle: IdleWord::new(),
            shed: AtomicBool::new(false),
            control: Control::new(),
            seen: Seen::default(),
            state: crate::state::StateCell::default(),
            share,
            parked_future: AtomicPtr::new(std::ptr::null_mut()),
            _track: track,
        }
    }
}

/// What `key_stats` reads of a key's chain, kept by those who push and take its tasks: relaxed
/// counters, each exact on its own, read as one snapshot (not one instant).
#[derive(Default)]
pub(crate) struct Seen {
    /// Tasks pushed onto the chain that have not left it (started, dropped, handed back).
    queued: AtomicUsize,
    /// Since when (`Shared::now_ms`) the chain has held queued tasks without a break; 0: none.
    since: AtomicU64,
    /// A task of the key runs from the chain, or a started future of it is pending.
    running: AtomicBool,
}

impl Seen {
    /// A task was pushed onto the chain at `now` (called only if it was empty, see
    /// [`pushed`](Self::pushed)).
    #[inline]
    pub(crate) fn pushed(&self, now: impl FnOnce() -> u64) {
        if self.queued.fetch_add(1, Ordering::Relaxed) == 0 {
            self.since.store(now(), Ordering::Relaxed);
        }
    }

    /// `n` tasks left the chain (started, dropped, handed back).
    #[inline]
    pub(crate) fn left(&self, n: usize) {
        if n != 0 && self.queued.fetch_sub(n, Ordering::Relaxed) == n {
            self.since.store(0, Ordering::Relaxed);
        }
    }

    /// A task of the key starts (`true`) or ends (`false`) on the chain.
    #[inline]
    pub(crate) fn set_running(&self, running: bool) {
        self.running.store(running, Ordering::Relaxed);
    }

    /// `(queued, since, running)`.
    pub(crate) fn get(&self) -> (usize, u64, bool) {
        (
            self.queued.load(Ordering::Relaxed),
            self.since.load(Ordering::Relaxed),
            self.running.load(Ordering::Relaxed),
        )
    }
}

impl Retire for KeyState {
    fn is_retired(&self) -> bool {
        self.chain.is_retired()
    }
}

pub(crate) type KeyEntry<K> = Entry<K, KeyState>;

/// Something a worker can run: a key's chain (owned through its `ACTIVE` baton) or an unkeyed
/// task.
pub(crate) enum Runnable<K> {
    Chain(NonNull<KeyEntry<K>>),
    Task(TaskRef),
}

// SAFETY: a `Runnable::Chain` carries the chain's ACTIVE baton between threads; the entry is
// Sync (K: Sync) and stays allocated while the baton is held (an active chain is never retired).
unsafe impl<K: Send + Sync> Send for Runnable<K> {}

/// An idle chain waiting for its timeout (see `idle.rs`).
pub(crate) struct IdleItem<K> {
    pub(crate) entry: NonNull<KeyEntry<K>>,
    pub(crate) deadline: u64,
}

// SAFETY: the entry stays allocated while it is in an idle queue (only the queue's owner may
// retire it), and entries are Sync.
unsafe impl<K: Send + Sync> Send for IdleItem<K> {}
