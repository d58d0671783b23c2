//! Owning a key's chain: [`Owned`], the one token of the chain's `ACTIVE` baton, and the only
//! caller of the core chain's owner operations (pop, unpop, release, retire-owned, claim).
//!
//! # The baton and its token
//!
//! A key's chain (core `chain`) has at most one owner: whoever holds its `ACTIVE` baton may pop
//! its tasks, put the last one back, read its head, take the key's state, and give the baton up.
//! Everywhere in the executor, holding the baton is holding an [`Owned`]: the owner operations
//! are its methods, safe because the token is the proof, and the ways to give the baton up
//! consume it. A thread comes to hold it in exactly these ways:
//!
//! - **claim** ([`Owned::claim`]): `CAS(0 -> ACTIVE)` of an idle, empty chain (a reaper, a
//!   pause, `cancel_key`, `shutdown_now` looking for an idle key's state);
//! - **activation**: the push that found the chain idle (`route.rs`), which hands the chain to
//!   a worker through a ready queue;
//! - **hand-over**: whoever held it passed it on ([`Owned::into_ptr`]) into a ready queue, a
//!   parked wait (a permit, a pause, a future's wake state) or a holder's phase word, and the
//!   taker (a worker popping the ready queue, a permit grant, a waker, `resume`, `cancel_key`,
//!   `shutdown_now`'s steal) takes it back with [`Owned::assume`], naming which of these it is.
//!
//! It gives the baton up only by [`Owned::release_if_empty`] (idle again), [`Owned::retire_if_empty`]
//! (retired: the caller unlinks the entry) or a hand-over. A token is never copied, so a chain
//! has one owner at a time; while it is held the entry is not retired, hence alive.

use std::ptr::NonNull;

use crate::key::KeyEntry;
use crate::task::{Kind, TaskRef};

/// The `ACTIVE` baton of one key's chain, held by this thread (see the module docs).
#[must_use = "the baton must be released, retired or handed over"]
pub(crate) struct Owned<K> {
    entry: NonNull<KeyEntry<K>>,
}

impl<K> Owned<K> {
    /// Takes the baton of `entry`'s chain if it is idle and empty (`CAS(0 -> ACTIVE)`).
    #[inline]
    pub(crate) fn claim(entry: &KeyEntry<K>) -> Option<Owned<K>> {
        entry.value().chain.try_claim().then(|| Owned {
            entry: NonNull::from(entry),
        })
    }

    /// The token of a baton this thread already holds.
    ///
    /// # Safety
    ///
    /// The calling thread holds the baton of `entry`'s chain (an activation, or a hand-over it
    /// took: the module docs list them), and no other token of it is alive.
    #[inline]
    pub(crate) unsafe fn assume(entry: NonNull<KeyEntry<K>>) -> Owned<K> {
        Owned { entry }
    }

    /// The entry's address (the same for the entry's whole life).
    #[inline]
    pub(crate) fn ptr(&self) -> NonNull<KeyEntry<K>> {
        self.entry
    }

    /// The entry: alive while its chain is owned (an owned chain is never retired).
    #[inline]
    pub(crate) fn entry(&self) -> &KeyEntry<K> {
        // SAFETY: the baton keeps the entry from being retired, so it stays allocated while
        // this token lives (the module docs).
        unsafe { self.entry.as_ref() }
    }

    /// Takes the oldest queued task, if any (`None` also while a push is half done: core
    /// `chain`, "The pop").
    #[inline]
    pub(crate) fn pop(&self) -> Option<TaskRef> {
        // SAFETY: we own the chain; a popped node is the popper's alone.
        unsafe {
            let n = self.entry().value().chain.pop()?;
            Some(TaskRef::from_raw(n))
        }
    }

    /// Takes the oldest queued task and says whether a newer `submit_latest` task of the key
    /// supersedes it (both keep-latest, the newer right behind it).
    #[inline]
    pub(crate) fn pop_coalescing(&self) -> Option<(TaskRef, bool)> {
        let chain = &self.entry().value().chain;
        // SAFETY: we own the chain (`kind_of` reads a node still queued on it); a popped node
        // is the popper's alone.
        unsafe {
            let p = chain.pop_coalescing(|n| TaskRef::kind_of(n) == Kind::Latest)?;
            Some((TaskRef::from_raw(p.node), p.superseded))
        }
    }

    /// Puts `task` back at the chain's front: it runs next.
    ///
    /// # Safety
    ///
    /// `task` is the task this token popped last (by [`pop`](Self::pop) or
    /// [`pop_coalescing`](Self::pop_coalescing)), and nothing was popped since.
    #[inline]
    pub(crate) unsafe fn put_back(&self, task: TaskRef) {
        // SAFETY: we own the chain, and the caller's contract makes the node the last popped.
        unsafe { self.entry().value().chain.unpop(task.into_raw()) };
    }

    /// Whether a task is queued (one a push finished).
    #[inline]
    pub(crate) fn has_queued(&self) -> bool {
        // SAFETY: we own the chain.
        unsafe { self.entry().value().chain.peek() }.is_some()
    }

    /// Pops every queued task into `out`, in order. It stops at a push that is half done (core
    /// `chain`, "The pop"): after `shutdown_now` stopped every worker (the routers that push
    /// onto chains) none is; `cancel_key` and a graceful shutdown's cancel of paused keys may
    /// leave such a task on the chain, which then runs or is taken later, in order.
    pub(crate) fn drain_into(&self, out: &mut Vec<TaskRef>) {
        while let Some(t) = self.pop() {
            out.push(t);
        }
    }

    /// The key's state, taken out (the owner's to hand over or release).
    #[inline]
    pub(crate) fn take_state(&self) -> Option<crate::state::Erased> {
        // SAFETY: we own the chain, and with it the key's state.
        unsafe { self.entry().value().state.take() }
    }

    /// The key's state slot, for a state task this owner runs.
    #[inline]
    pub(crate) fn state_slot(&mut self) -> &mut Option<crate::state::Erased> {
        // SAFETY: we own the chain, and with it the key's state; `&mut self` keeps this the one
        // borrow through the token.
        unsafe { self.entry().value().state.slot() }
    }

    /// Gives the baton up if nothing is queued (`CAS(ACTIVE -> 0)`); else it is still ours.
    #[inline]
    pub(crate) fn release_if_empty(self) -> Result<(), Owned<K>> {
        // SAFETY: we own the chain.
        if unsafe { self.entry().value().chain.try_release() } {
            Ok(())
        } else {
            Err(self)
        }
    }

    /// Retires the chain if nothing is queued (`CAS(ACTIVE -> RETIRED)`, no release between:
    /// nothing can be pushed in a gap); the caller then unlinks the entry. Else it is still ours.
    #[inline]
    pub(crate) fn retire_if_empty(self) -> Result<(), Owned<K>> {
        // SAFETY: we own the chain.
        if unsafe { self.entry().value().chain.try_retire_owned() } {
            Ok(())
        } else {
            Err(self)
        }
    }

    /// Hands the baton over (a ready queue, a parked wait, a holder's word): its next holder
    /// takes it back with [`assume`](Self::assume).
    #[inline]
    pub(crate) fn into_ptr(self) -> NonNull<KeyEntry<K>> {
        self.entry
    }
}
