//! The trie's interior: [`Inner`] nodes with their occupancy count (reserve, release, freeze) and
//! immutable [`Collision`] lists.

use alloc::boxed::Box;
use alloc::vec::Vec;

use crossbeam_epoch::Guard;

use super::entry::Entry;
use super::word::{Home, Kind, Slot, Word, COLL, INNER, LEAF};
use super::FANOUT;
use crate::sync::{AtomicUsize, Ordering};

/// Occupancy bit of an inner node: the node is empty forever and must be unlinked.
pub(super) const FROZEN: usize = 1 << (usize::BITS - 1);

/// An inner node: 16 slots indexed by the next 4 bits of the hash, and an occupancy count (see
/// "Shrinking" in the module docs).
#[repr(align(16))]
pub(super) struct Inner {
    pub(super) occupancy: AtomicUsize,
    /// The home of the slot that holds this node: nodes never move, so it is fixed at creation
    /// (while the node is private) and is the only slot the node is unlinked from.
    pub(super) parent: Home,
    pub(super) slots: [Slot; FANOUT],
}

impl Inner {
    /// A private, empty node that will be published in the slot `parent` names.
    pub(super) fn new(parent: Home) -> Box<Inner> {
        Box::new(Inner {
            occupancy: AtomicUsize::new(0),
            parent,
            slots: core::array::from_fn(|_| Slot::new()),
        })
    }

    /// The slot of `hash` in this node, whose level starts at bit `shift`.
    pub(super) fn slot(&self, hash: u64, shift: u32) -> &Slot {
        &self.slots[super::index(hash, shift)]
    }

    /// Reserves room for one more occupied slot; fails once the node is frozen.
    pub(super) fn reserve(&self) -> bool {
        let mut cur = self.occupancy.load(Ordering::Acquire);
        loop {
            if cur & FROZEN != 0 {
                return false;
            }
            match self.occupancy.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Gives back one reservation or occupied slot. Returns `true` if this call froze the node
    /// (it became empty): the caller must then unlink it from its parent.
    pub(super) fn release(&self) -> bool {
        let prev = self.occupancy.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(prev & !FROZEN > 0);
        prev == 1
            && self
                .occupancy
                .compare_exchange(0, FROZEN, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    pub(super) fn is_frozen(&self) -> bool {
        self.occupancy.load(Ordering::Acquire) & FROZEN != 0
    }
}

/// An immutable list of entries whose keys share one full 64-bit hash.
pub(super) struct Collision<K, V> {
    pub(super) entries: Vec<*const Entry<K, V>>,
}

/// Replaces the collision node `old` in `slot` by one listing `entries`: the slot becomes empty if
/// the list is empty, a leaf if it holds one entry. On success the old node's free is deferred
/// (the entries it listed are not freed: they live on in the new list, or their remover frees
/// them) and the new word is returned; on failure (`old` is no longer in the slot) the new node,
/// never published, is freed at once.
///
/// # Safety
/// `old` is a collision node of `Entry<K, V>` read from `slot` under `guard`, and `guard` is
/// pinned from the collector that protects `slot`'s table.
pub(super) unsafe fn replace_collision<K, V>(
    slot: &Slot,
    old: Word,
    entries: Vec<*const Entry<K, V>>,
    guard: &Guard,
) -> Result<Word, ()> {
    let new = match entries.len() {
        0 => Word::EMPTY,
        1 => Word::leaf(entries[0]),
        _ => Word::collision(Box::into_raw(Box::new(Collision { entries }))),
    };
    if slot.cas(old, new).is_err() {
        if new.kind() == Kind::Collision {
            // SAFETY: made just above and never published.
            drop(unsafe { Box::from_raw(new.collision_node::<K, V>() as *mut Collision<K, V>) });
        }
        return Err(());
    }
    let p = old.collision_node::<K, V>() as *mut Collision<K, V>;
    // SAFETY: our CAS unpublished `old` (contract: a collision node of this table), so no new
    // reader reaches it and the free waits for every guard that could have; the node holds only
    // raw pointers (entries are freed separately).
    unsafe { guard.defer_unchecked(move || drop(Box::from_raw(p))) };
    Ok(new)
}

/// A [`Word`] decoded into a reference to what it points to.
pub(super) enum Node<'a, K, V> {
    Empty,
    Leaf(&'a Entry<K, V>),
    Inner(&'a Inner),
    Collision(&'a Collision<K, V>),
}

/// The typed side of [`Word`]: which node type each tag stands for.
impl Word {
    /// A leaf: the entry `e`.
    pub(super) fn leaf<K, V>(e: *const Entry<K, V>) -> Word {
        Word::tagged(e as usize, LEAF)
    }

    /// An inner node.
    pub(super) fn inner(n: *const Inner) -> Word {
        Word::tagged(n as usize, INNER)
    }

    /// A collision node.
    pub(super) fn collision<K, V>(c: *const Collision<K, V>) -> Word {
        Word::tagged(c as usize, COLL)
    }

    /// The entry of a leaf word.
    pub(super) fn entry<K, V>(self) -> *const Entry<K, V> {
        debug_assert_eq!(self.kind(), Kind::Leaf);
        self.addr() as *const Entry<K, V>
    }

    /// The node of an inner word.
    pub(super) fn inner_node(self) -> *const Inner {
        debug_assert_eq!(self.kind(), Kind::Inner);
        self.addr() as *const Inner
    }

    /// The node of a collision word.
    pub(super) fn collision_node<K, V>(self) -> *const Collision<K, V> {
        debug_assert_eq!(self.kind(), Kind::Collision);
        self.addr() as *const Collision<K, V>
    }

    /// The word as a reference to what it points to.
    ///
    /// # Safety
    /// Whatever the word points to stays allocated for `'a`: it is private to the caller, or the
    /// word was loaded from the table while a guard was pinned that outlives `'a`.
    pub(super) unsafe fn node<'a, K, V>(self) -> Node<'a, K, V> {
        match self.kind() {
            Kind::Empty => Node::Empty,
            // SAFETY: per the contract the entry is allocated for 'a; the tag says it is one.
            Kind::Leaf => Node::Leaf(unsafe { &*self.entry::<K, V>() }),
            // SAFETY: as above, for an inner node.
            Kind::Inner => Node::Inner(unsafe { &*self.inner_node() }),
            // SAFETY: as above, for a collision node.
            Kind::Collision => Node::Collision(unsafe { &*self.collision_node::<K, V>() }),
        }
    }
}

/// The typed side of [`Home`]: homes name slots of inner nodes.
impl Home {
    /// The home of `slot`, a slot of `node` (`None`: a root slot).
    pub(super) fn of(slot: &Slot, node: Option<&Inner>) -> Home {
        match node {
            None => Home::ROOT,
            Some(n) => {
                let base = n.slots.as_ptr() as usize;
                let index = (slot as *const Slot as usize - base) / core::mem::size_of::<Slot>();
                debug_assert!(index < FANOUT);
                Home(n as *const Inner as usize | index)
            }
        }
    }

    /// The inner node this home names and the slot's index in it; `None` for [`Home::ROOT`].
    pub(super) fn node(self) -> Option<(*const Inner, usize)> {
        if self == Home::ROOT {
            return None;
        }
        Some((
            (self.0 & !(FANOUT - 1)) as *const Inner,
            self.0 & (FANOUT - 1),
        ))
    }
}
