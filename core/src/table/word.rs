//! The words the trie is made of: a slot's [`Word`] (empty, or a pointer tagged with what it points
//! to), the atomic [`Slot`] that holds one, and the [`Home`] word that names a slot.

use crate::sync::{AtomicUsize, Ordering};

/// The low bits of a [`Word`] that say what its pointer points to.
const TAG_MASK: usize = 0b11;
pub(super) const LEAF: usize = 0b00;
pub(super) const INNER: usize = 0b01;
pub(super) const COLL: usize = 0b10;

/// What a slot holds: `0` (empty), or the address of an entry (`LEAF`), an inner node (`INNER`)
/// or a collision node (`COLL`) with the tag in its low two bits (every target is at least
/// 4-byte aligned).
///
/// Pointers become words with `as usize` casts, which expose their provenance, and come back from
/// the integer: a pointer rebuilt from a word loaded from the table carries the provenance of the
/// allocation it was published with (never one derived from a shared reference), which is what may
/// free it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Word(usize);

/// The four shapes of a [`Word`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Kind {
    Empty,
    Leaf,
    Inner,
    Collision,
}

impl Word {
    /// The empty slot.
    pub(super) const EMPTY: Word = Word(0);

    pub(super) fn tagged(addr: usize, tag: usize) -> Word {
        debug_assert!(addr != 0 && addr & TAG_MASK == 0, "misaligned or null node");
        Word(addr | tag)
    }

    /// What the word holds.
    pub(super) fn kind(self) -> Kind {
        match self.0 & TAG_MASK {
            _ if self.0 == 0 => Kind::Empty,
            LEAF => Kind::Leaf,
            INNER => Kind::Inner,
            _ => Kind::Collision,
        }
    }

    /// `true` for the empty slot.
    pub(super) fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub(super) fn addr(self) -> usize {
        self.0 & !TAG_MASK
    }
}

/// An atomic slot of the trie (a root slot or a slot of an inner node), holding a [`Word`].
#[repr(transparent)]
pub(super) struct Slot(AtomicUsize);

impl Slot {
    /// An empty slot.
    pub(super) fn new() -> Slot {
        Slot(AtomicUsize::new(0))
    }

    /// The word in the slot. Acquire when the caller will follow the pointer into a node
    /// published by another thread.
    pub(super) fn load(&self, order: Ordering) -> Word {
        Word(self.0.load(order))
    }

    /// A plain store, only for slots of private (unpublished) nodes.
    pub(super) fn store_private(&self, word: Word) {
        self.0.store(word.0, Ordering::Relaxed)
    }

    /// `CAS(current -> new)`, `AcqRel` (publishes what `new` points to, acquires what the slot
    /// held). Every change of a published slot goes through here.
    pub(super) fn cas(&self, current: Word, new: Word) -> Result<(), Word> {
        self.0
            .compare_exchange(current.0, new.0, Ordering::AcqRel, Ordering::Acquire)
            .map(drop)
            .map_err(Word)
    }
}

/// A *home word* names one slot of the table: [`Home::ROOT`] for the root slot of the hash at
/// hand, else the address of an inner node ORed with the slot's index in it (inner nodes are
/// 16-byte aligned, so the index fits in the low 4 bits). See "Home slots" in the module docs.
/// (Its ties to inner nodes, like [`Word`]'s typed constructors, are in `node.rs`, so that this
/// file knows no node type.)
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Home(pub(super) usize);

impl Home {
    /// The root slot of the hash at hand.
    pub(super) const ROOT: Home = Home(0);

    /// The raw bits, for an atomic home cell.
    pub(super) fn to_bits(self) -> usize {
        self.0
    }

    /// A home from [`to_bits`](Self::to_bits).
    pub(super) fn from_bits(bits: usize) -> Home {
        Home(bits)
    }
}
