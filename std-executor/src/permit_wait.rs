//! The permit-wait hand-off, apart from the serializer: a [`Handoff`] word that decides, by one
//! CAS, whether a parked chain's baton goes to its grant callback or to `shutdown_now`, and the
//! [`WaitRegistry`] of parked waits that `shutdown_now` walks. `permits.rs` describes the whole
//! protocol and names the loom models (`loom/tests/permits.rs`) that check these types.
//!
//! Nothing here knows about chains, semaphores or the serializer: a wait carries an opaque value
//! (the serializer's is the key entry plus the semaphore request), so the loom models drive the
//! real types with a stand-in value.

use std::collections::BTreeMap;

use crate::sync::{lock, Arc, AtomicU8, Mutex, Ordering};

/// The wait is parked; nobody holds the baton yet.
const WAITING: u8 = 0;
/// The grant callback won the baton and is scheduling the chain.
const GRANTED: u8 = 1;
/// The grant callback has put the chain on a ready queue (terminal).
const SCHEDULED: u8 = 2;
/// `shutdown_now` won the baton (terminal).
const STOLEN: u8 = 3;

/// Who took a parked chain's baton.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Winner {
    /// The grant callback: it schedules the chain.
    Grant,
    /// `shutdown_now`: it drains the chain and hands its tasks back; a late grant gives its
    /// permits back.
    Steal,
}

/// A parked chain's hand-off word: `WAITING`, then exactly one of `WAITING -> GRANTED ->
/// SCHEDULED` (the grant callback) or `WAITING -> STOLEN` (`shutdown_now`). Every transition is
/// an RMW.
#[derive(Debug)]
pub struct Handoff(AtomicU8);

impl Default for Handoff {
    fn default() -> Self {
        Handoff::new()
    }
}

impl Handoff {
    /// A word in `WAITING`.
    pub fn new() -> Handoff {
        Handoff(AtomicU8::new(WAITING))
    }

    /// The grant callback's CAS `WAITING -> GRANTED`. [`Winner::Grant`]: the caller holds the
    /// baton, must put the chain on a ready queue and then call [`mark_scheduled`]
    /// (running no user code in between). [`Winner::Steal`]: `shutdown_now` took the chain; the
    /// caller must not touch it (and gives its permits back).
    ///
    /// [`mark_scheduled`]: Handoff::mark_scheduled
    pub fn grant(&self) -> Winner {
        match self
            .0
            .compare_exchange(WAITING, GRANTED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Winner::Grant,
            Err(s) => {
                debug_assert_eq!(s, STOLEN, "a wait is granted at most once");
                Winner::Steal
            }
        }
    }

    /// `GRANTED -> SCHEDULED`, by the grant's winner once the chain is on a ready queue. A
    /// release: a thief that waited in [`wait_scheduled`](Handoff::wait_scheduled) then finds the
    /// chain in the queue.
    pub fn mark_scheduled(&self) {
        let prev = self.0.swap(SCHEDULED, Ordering::AcqRel);
        debug_assert_eq!(
            prev, GRANTED,
            "only the grant's winner marks the wait scheduled"
        );
    }

    /// `shutdown_now`'s CAS `WAITING -> STOLEN`. [`Winner::Steal`]: the caller holds the baton.
    /// [`Winner::Grant`]: a grant won; the chain is on a ready queue once
    /// [`wait_scheduled`](Handoff::wait_scheduled) returns.
    pub fn steal(&self) -> Winner {
        match self
            .0
            .compare_exchange(WAITING, STOLEN, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Winner::Steal,
            Err(_) => Winner::Grant,
        }
    }

    /// Waits while a grant is between its CAS and [`mark_scheduled`](Handoff::mark_scheduled)
    /// (a few steps, no user code). An acquire: afterwards the chain's ready-queue entry is
    /// visible.
    pub fn wait_scheduled(&self) {
        let backoff = crossbeam_utils::Backoff::new();
        while self.0.load(Ordering::Acquire) == GRANTED {
            crate::sync::snooze(&backoff);
        }
    }
}

/// One parked wait: its hand-off word and the caller's value (for the serializer, the key entry
/// and the semaphore request).
#[derive(Debug)]
pub struct PermitWait<T> {
    id: u64,
    handoff: Handoff,
    value: T,
}

impl<T> PermitWait<T> {
    /// The value given to [`WaitRegistry::register`].
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The wait's id (from 1, in registration order).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The wait's hand-off word.
    #[cfg(any(loom, test))]
    pub fn handoff(&self) -> &Handoff {
        &self.handoff
    }
}

/// The registry's map. Ordered by id (registration order), so `steal_all` walks the waits in a
/// fixed order: a `HashMap`'s per-instance random seed would make every loom execution walk
/// them differently, which loom rejects as a non-deterministic model.
struct Waits<T> {
    next: u64,
    map: BTreeMap<u64, Arc<PermitWait<T>>>,
}

/// The waits parked on permits: a wait is in the registry from [`register`] until its grant has
/// scheduled the chain ([`grant`]) or `shutdown_now` stole it ([`steal_all`]).
///
/// [`register`]: WaitRegistry::register
/// [`grant`]: WaitRegistry::grant
/// [`steal_all`]: WaitRegistry::steal_all
pub struct WaitRegistry<T> {
    waits: Mutex<Waits<T>>,
}

impl<T> Default for WaitRegistry<T> {
    fn default() -> Self {
        WaitRegistry::new()
    }
}

impl<T> WaitRegistry<T> {
    /// An empty registry.
    pub fn new() -> WaitRegistry<T> {
        WaitRegistry {
            waits: Mutex::new(Waits {
                next: 0,
                map: BTreeMap::new(),
            }),
        }
    }

    /// Records a new wait in `WAITING`, carrying `value`; from the moment the caller hands the
    /// returned wait to a grant callback, the chain's baton belongs to the wait.
    pub fn register(&self, value: T) -> Arc<PermitWait<T>> {
        let mut w = lock(&self.waits);
        w.next += 1;
        let wait = Arc::new(PermitWait {
            id: w.next,
            handoff: Handoff::new(),
            value,
        });
        w.map.insert(wait.id, wait.clone());
        wait
    }

    /// The grant callback's side: if the grant wins the baton ([`Handoff::grant`]), calls
    /// `schedule` with the wait's value (it puts the chain on a ready queue and must not wait for
    /// `shutdown_now`), marks the wait `SCHEDULED` and removes it. Returns who won; on
    /// [`Winner::Steal`] nothing is called.
    pub fn grant(&self, wait: &PermitWait<T>, schedule: impl FnOnce(&T)) -> Winner {
        if wait.handoff.grant() == Winner::Steal {
            return Winner::Steal;
        }
        schedule(&wait.value);
        wait.handoff.mark_scheduled();
        self.remove(wait);
        Winner::Grant
    }

    /// The registered wait with id `id`, if it is still registered.
    pub fn get(&self, id: u64) -> Option<Arc<PermitWait<T>>> {
        lock(&self.waits).map.get(&id).cloned()
    }

    /// The first registered wait whose value passes `which`.
    pub fn find(&self, which: impl Fn(&T) -> bool) -> Option<Arc<PermitWait<T>>> {
        lock(&self.waits)
            .map
            .values()
            .find(|w| which(&w.value))
            .cloned()
    }

    /// `shutdown_now`'s side for one wait (`cancel_key`'s, too): `true` if it stole the baton
    /// (the wait is removed); `false` if a grant won (waited for until its chain is on a ready
    /// queue).
    pub fn steal_one(&self, wait: &PermitWait<T>) -> bool {
        match wait.handoff.steal() {
            Winner::Steal => {
                self.remove(wait);
                true
            }
            Winner::Grant => {
                wait.handoff.wait_scheduled();
                false
            }
        }
    }

    /// Removes `wait` from the registry; `false` if it was not there (any more).
    pub fn remove(&self, wait: &PermitWait<T>) -> bool {
        lock(&self.waits).map.remove(&wait.id).is_some()
    }

    /// `shutdown_now`'s side: tries to steal every registered wait. A stolen wait is removed and
    /// `stolen` is called with its value (the caller now holds the chain's baton); a wait whose
    /// grant won is waited for until its chain is on a ready queue. Returns how many waits were
    /// found granted (and waited for). Waits registered after this call started are not seen.
    pub fn steal_all(&self, stolen: impl FnMut(&T)) -> usize {
        self.steal_where(|_| true, stolen)
    }

    /// [`steal_all`](WaitRegistry::steal_all) for the waits whose value passes `which` only.
    pub fn steal_where(&self, which: impl Fn(&T) -> bool, mut stolen: impl FnMut(&T)) -> usize {
        let waits: Vec<Arc<PermitWait<T>>> = lock(&self.waits)
            .map
            .values()
            .filter(|w| which(&w.value))
            .cloned()
            .collect();
        let mut granted = 0;
        for w in waits {
            match w.handoff.steal() {
                Winner::Steal => {
                    self.remove(&w);
                    stolen(&w.value);
                }
                Winner::Grant => {
                    w.handoff.wait_scheduled();
                    granted += 1;
                }
            }
        }
        granted
    }

    /// How many waits are registered.
    #[cfg(any(loom, test))]
    pub fn len(&self) -> usize {
        lock(&self.waits).map.len()
    }

    /// `true` if no wait is registered.
    #[cfg(any(loom, test))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_grant_schedules_and_unregisters() {
        let r = WaitRegistry::new();
        let w = r.register(7u32);
        assert_eq!(r.len(), 1);
        let mut scheduled = None;
        assert_eq!(r.grant(&w, |v| scheduled = Some(*v)), Winner::Grant);
        assert_eq!(scheduled, Some(7));
        assert!(r.is_empty());
        // A later shutdown_now finds nothing to steal.
        assert_eq!(r.steal_all(|_| unreachable!()), 0);
    }

    #[test]
    fn a_steal_takes_the_baton_and_a_late_grant_loses() {
        let r = WaitRegistry::new();
        let (a, b) = (r.register(1u32), r.register(2u32));
        assert_ne!(a.id, b.id);
        let mut stolen = Vec::new();
        assert_eq!(r.steal_all(|v| stolen.push(*v)), 0);
        stolen.sort();
        assert_eq!(stolen, [1, 2]);
        assert!(r.is_empty());
        assert_eq!(r.grant(&a, |_| unreachable!()), Winner::Steal);
        assert_eq!(b.handoff().grant(), Winner::Steal);
    }

    #[test]
    fn a_steal_after_the_grant_cas_waits_for_scheduled() {
        let h = Handoff::new();
        assert_eq!(h.grant(), Winner::Grant);
        assert_eq!(h.steal(), Winner::Grant);
        h.mark_scheduled();
        h.wait_scheduled(); // returns at once
        assert_eq!(h.steal(), Winner::Grant);
        assert!(!WaitRegistry::<u8>::default().remove(&PermitWait {
            id: 1,
            handoff: Handoff::default(),
            value: 0,
        }));
    }
}

/// The executor's waits: each carries the parked key and its semaphore-side request.
mod parked {
    use std::ptr::NonNull;

    use super::WaitRegistry;
    use crate::key::KeyEntry;
    use crate::semaphore::WaiterToken;
    use crate::sync::Mutex;

    /// What a permit wait carries: the parked key and its semaphore-side request.
    pub(crate) struct Parked<K> {
        pub(crate) entry: NonNull<KeyEntry<K>>,
        /// The semaphore-side request, so `shutdown_now` can withdraw it from the queue.
        pub(crate) token: Mutex<Option<WaiterToken>>,
        /// What the chain waits for.
        pub(crate) why: ParkedFor,
    }

    /// What a parked chain waits for.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum ParkedFor {
        /// Its head task's permits (`permits.rs`).
        Permits,
        /// The key's `resume` (`control.rs`).
        Pause,
    }

    // SAFETY: the entry pointer is only dereferenced by whoever holds the chain's baton (decided by
    // the wait's hand-off CAS); entries are Sync.
    unsafe impl<K: Send + Sync> Send for Parked<K> {}
    // SAFETY: as above.
    unsafe impl<K: Send + Sync> Sync for Parked<K> {}

    /// The serializer's registry of chains parked on permits.
    pub(crate) type PermitWaits<K> = WaitRegistry<Parked<K>>;
}
pub(crate) use parked::{Parked, ParkedFor, PermitWaits};
