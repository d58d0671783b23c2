//! A key's chain baton held from outside the workers: by `cancel_key` while it takes the key's
//! queued tasks, and by a state task that `cancel_key` handed back while `PendingTask::run`
//! runs it (`handed_back.rs`). Such a holder is stopped and stolen from by `shutdown_now`
//! exactly as a worker is: it has a [`Phase`] word of its own, in one registry
//! ([`OutsideHolds`]) that `shutdown_now` walks beside the worker slots.
//!
//! # Why a registry
//!
//! A chain whose baton is held outside a worker is in no ready queue, no parked wait and no
//! worker slot: before this registry, `shutdown_now` could not find it (the tasks queued behind
//! a handed-back run were neither run nor handed back), a `cancel_key` after `shutdown_now`
//! waited for good on a chain `shutdown_now` had stolen from a worker (nobody would ever give
//! it back), and a `cancel_key` that a key's own task made raced `shutdown_now`'s steal of the
//! same chain (both popped it: tasks handed back twice, freed twice).
//!
//! # Protocol
//!
//! A holder registers ([`OutsideHolds::register`]); the registry refuses once `shutdown_now`
//! has closed it, and then the holder takes nothing (everything queued is `shutdown_now`'s to
//! hand back). A registered holder moves its phase word as a worker does (`phase.rs`):
//!
//! - `IDLE -> BUSY` before each attempt to take the baton (a steal from a parked wait, a claim
//!   of an idle chain, `key_control::hold_chain`); if the attempt fails it goes back to `IDLE`
//!   and tries again later. `enter_busy` fails once `shutdown_now` stopped it: it gives up,
//!   holding nothing.
//! - while `BUSY` with the baton it takes what it came for and gives the chain back (parked,
//!   or on a ready queue) **before** it leaves `BUSY`: `shutdown_now`, which waits while a
//!   holder is `BUSY` before it walks the parked waits and the ready queues, finds the chain
//!   there.
//! - a handed-back run enters `RUNNING` for the user's task; `shutdown_now` may then steal the
//!   chain (`STOLEN`) and hand back what is queued behind the task, exactly as from a worker;
//!   the key's state comes back through the holder's `lent` slot (`state_hold.rs`).
//!
//! So each chain's baton has one holder at a time, and `shutdown_now` ends holding, or having
//! handed over, every baton: nothing queued is missed, nothing is taken twice.
//!
//! Loom models: `loom/tests/baton.rs`, over this registry (through `loom_hooks`), the real
//! `Phase` and core chain: a `cancel_key` holder racing `shutdown_now`'s close and stop, a
//! handed-back run stolen from while `RUNNING`, `cancel_key` from inside its key's own task
//! (`Phase::suspend_running`), and a hold's parked chain at a graceful shutdown.

use std::ptr::NonNull;

use crate::key::KeyEntry;
use crate::phase::{Phase, Stopped};
use crate::state_hold::Lent;
use crate::sync::{lock, Arc, AtomicUsize, Mutex, Ordering};

/// One registered holder outside the workers.
pub(crate) struct OutsideHold<K> {
    /// As a worker slot's phase (`phase.rs`).
    pub(crate) phase: Phase,
    /// The entry whose chain it holds while `RUNNING` (0: none), for `shutdown_now`'s steal.
    current: AtomicUsize,
    /// A stolen chain's key state on its way to the key's handed-back tasks.
    pub(crate) lent: Mutex<Lent<K>>,
}

impl<K> OutsideHold<K> {
    /// How a state lent to this holder names it (`state_hold.rs`): its phase word's address,
    /// never a worker slot's index (those are small numbers; this is a heap address).
    pub(crate) fn lent_mark(&self) -> usize {
        &self.phase as *const Phase as usize
    }

    /// Before entering `RUNNING` with `entry`'s chain.
    pub(crate) fn set_current(&self, entry: NonNull<KeyEntry<K>>) {
        self.current
            .store(entry.as_ptr() as usize, Ordering::Relaxed);
    }
}

/// A holder `shutdown_now` stole a chain from, and the chain's entry ([`OutsideHolds::stop_all`]).
pub(crate) type StoleFrom<K> = (Arc<OutsideHold<K>>, NonNull<KeyEntry<K>>);

struct Inner<K> {
    /// `shutdown_now` walked the registry: nobody registers any more.
    closed: bool,
    holds: Vec<Arc<OutsideHold<K>>>,
}

/// The registry of outside holders (see the module docs).
pub(crate) struct OutsideHolds<K> {
    inner: Mutex<Inner<K>>,
}

impl<K> Default for OutsideHolds<K> {
    fn default() -> Self {
        OutsideHolds {
            inner: Mutex::new(Inner {
                closed: false,
                holds: Vec::new(),
            }),
        }
    }
}

/// A registration, removed from the registry when dropped.
pub(crate) struct Registered<'a, K> {
    holds: &'a OutsideHolds<K>,
    hold: Arc<OutsideHold<K>>,
}

impl<K> std::ops::Deref for Registered<'_, K> {
    type Target = OutsideHold<K>;
    fn deref(&self) -> &OutsideHold<K> {
        &self.hold
    }
}

impl<K> Drop for Registered<'_, K> {
    fn drop(&mut self) {
        let mut i = lock(&self.holds.inner);
        if let Some(at) = i.holds.iter().position(|h| Arc::ptr_eq(h, &self.hold)) {
            i.holds.swap_remove(at);
        }
    }
}

impl<K> OutsideHolds<K> {
    /// Registers a holder (its phase `IDLE`); `None` once `shutdown_now` closed the registry.
    pub(crate) fn register(&self) -> Option<Registered<'_, K>> {
        let mut i = lock(&self.inner);
        if i.closed {
            return None;
        }
        let hold = Arc::new(OutsideHold {
            phase: Phase::new(),
            current: AtomicUsize::new(0),
            lent: Mutex::new(Lent::Empty),
        });
        i.holds.push(hold.clone());
        Some(Registered { holds: self, hold })
    }

    /// `shutdown_now`: closes the registry and stops every holder in it (`Phase::stop`: waits
    /// while one is `BUSY`); returns the holders it stole a chain from (inside a task), each
    /// with that chain's entry.
    pub(crate) fn stop_all(&self) -> Vec<StoleFrom<K>> {
        let holds = {
            let mut i = lock(&self.inner);
            i.closed = true;
            i.holds.clone()
        };
        holds
            .into_iter()
            .filter(|h| h.phase.stop() == Stopped::Stole)
            .filter_map(|h| {
                let e = NonNull::new(h.current.load(Ordering::Relaxed) as *mut KeyEntry<K>)?;
                Some((h, e))
            })
            .collect()
    }
}

/// Thin wrappers over the registry for the loom models (`loom/tests/baton.rs`), `cfg(loom)`
/// only: a holder's chain is named by a non-zero tag instead of a key entry (the models have
/// no table; the tag is never dereferenced).
#[cfg(loom)]
pub mod loom_hooks {
    use std::ptr::NonNull;

    use super::{OutsideHolds, Registered};
    use crate::key::KeyEntry;
    use crate::phase::Phase;

    /// The registry of outside holders ([`OutsideHolds`]).
    #[derive(Default)]
    pub struct Holds(OutsideHolds<u32>);

    /// A registration ([`Registered`]), removed from the registry when dropped.
    pub struct Hold<'a>(Registered<'a, u32>);

    impl Holds {
        /// An open registry.
        pub fn new() -> Holds {
            Holds::default()
        }

        /// [`OutsideHolds::register`]: `None` once [`stop_all`](Holds::stop_all) closed it.
        pub fn register(&self) -> Option<Hold<'_>> {
            self.0.register().map(Hold)
        }

        /// [`OutsideHolds::stop_all`]: the tags of the chains it stole (holders inside a task).
        pub fn stop_all(&self) -> Vec<usize> {
            self.0
                .stop_all()
                .into_iter()
                .map(|(_, e)| e.as_ptr() as usize)
                .collect()
        }
    }

    impl Hold<'_> {
        /// The holder's phase word.
        pub fn phase(&self) -> &Phase {
            &self.0.phase
        }

        /// [`OutsideHold::set_current`](super::OutsideHold::set_current) with chain `tag`
        /// (non-zero).
        pub fn set_current(&self, tag: usize) {
            let e = NonNull::new(tag as *mut KeyEntry<u32>).expect("a non-zero tag");
            self.0.set_current(e);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_closed_registry_refuses_and_a_dropped_registration_leaves() {
        let holds: OutsideHolds<u32> = OutsideHolds::default();
        let a = holds.register().expect("open");
        let b = holds.register().expect("open");
        drop(b);
        assert_eq!(lock(&holds.inner).holds.len(), 1);
        assert!(a.phase.enter_busy());
        assert!(!a.phase.leave_busy(), "not stopped yet");
        assert!(holds.stop_all().is_empty(), "idle: nothing stolen");
        assert!(holds.register().is_none(), "closed");
        assert!(!a.phase.enter_busy(), "stopped");
        drop(a);
        assert!(lock(&holds.inner).holds.is_empty());
    }
}
