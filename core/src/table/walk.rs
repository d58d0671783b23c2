//! The walk down a key's path, written once: lookups, inserts and unlinks all [`descend`] through
//! inner nodes to the slot where the key's path ends, and differ only in what they do there.

use crossbeam_epoch::Guard;

use super::entry::Entry;
use super::node::Node;
use super::node::{Collision, Inner};
use super::word::{Slot, Word};
use super::{NODE_BITS, ROOT_BITS};
use crate::sync::Ordering;

/// One step of a walk: a slot, and the inner node that contains it (`None` for a root slot).
#[derive(Clone, Copy)]
pub(super) struct Step<'g> {
    pub(super) slot: &'g Slot,
    pub(super) node: Option<&'g Inner>,
}

/// What a walk keeps of the way it came.
pub(super) trait Trail<'g> {
    /// The current step.
    fn top(&self) -> Step<'g>;
    /// How many inner nodes lie above the current slot.
    fn depth(&self) -> u32;
    /// Moves down into a slot of the inner node held by the current slot.
    fn enter(&mut self, step: Step<'g>);

    /// The hash bit where the level below the current slot starts.
    fn shift(&self) -> u32 {
        ROOT_BITS + self.depth() * NODE_BITS
    }
}

/// A trail that keeps only where it is (lookups never go back up).
pub(super) struct Cursor<'g> {
    step: Step<'g>,
    depth: u32,
}

impl<'g> Cursor<'g> {
    pub(super) fn new(root: &'g Slot) -> Self {
        Cursor {
            step: Step {
                slot: root,
                node: None,
            },
            depth: 0,
        }
    }
}

impl<'g> Trail<'g> for Cursor<'g> {
    fn top(&self) -> Step<'g> {
        self.step
    }
    fn depth(&self) -> u32 {
        self.depth
    }
    fn enter(&mut self, step: Step<'g>) {
        self.step = step;
        self.depth += 1;
    }
}

/// Root slot plus at most 16 levels (13 with the real root of 12 bits, 16 under loom's 2): 64
/// hash bits, then a collision node.
const MAX_STEPS: usize = 18;

/// The whole path from the root to the current slot, kept by inserts and unlinks to unlink nodes
/// that empty out on the way back up.
pub(super) struct Path<'g> {
    steps: [Option<Step<'g>>; MAX_STEPS],
    len: usize,
}

impl<'g> Path<'g> {
    pub(super) fn new(root: &'g Slot) -> Self {
        let mut steps = [None; MAX_STEPS];
        steps[0] = Some(Step {
            slot: root,
            node: None,
        });
        Path { steps, len: 1 }
    }

    /// Goes back up one step and returns the step left; `None` at the root slot.
    pub(super) fn pop(&mut self) -> Option<Step<'g>> {
        if self.len <= 1 {
            return None;
        }
        self.len -= 1;
        self.steps[self.len].take()
    }
}

impl<'g> Trail<'g> for Path<'g> {
    fn top(&self) -> Step<'g> {
        self.steps[self.len - 1].expect("path is never empty")
    }
    fn depth(&self) -> u32 {
        self.len as u32 - 1
    }
    fn enter(&mut self, step: Step<'g>) {
        self.steps[self.len] = Some(step);
        self.len += 1;
    }
}

/// Where the path of a hash ends: the word in the last slot, which is never an inner node.
pub(super) enum Stop<'g, K, V> {
    /// An empty slot.
    Empty,
    /// A leaf: its word and its entry (of any key: compare before use).
    Leaf(Word, &'g Entry<K, V>),
    /// A collision node: its word and the node.
    Collision(Word, &'g Collision<K, V>),
}

/// Walks from the trail's current slot down the path of `hash` through inner nodes, entering
/// each, to the first slot that holds no inner node, and returns what that slot holds (loaded with
/// `Acquire`, so what it points to is visible).
///
/// # Safety
/// The trail's current slot is a slot of a table whose memory `guard` protects (pinned from that
/// table's collector), holding entries of type `Entry<K, V>`. Then everything the walk returns or
/// enters was published while `guard` was pinned, and stays allocated for `'g`.
pub(super) unsafe fn descend<'g, K, V>(
    trail: &mut impl Trail<'g>,
    hash: u64,
    _guard: &'g Guard,
) -> Stop<'g, K, V> {
    loop {
        let word = trail.top().slot.load(Ordering::Acquire);
        // SAFETY: `word` was loaded from a slot of the table (contract) while `guard` is pinned;
        // what it points to is freed only after it is unlinked and every guard pinned before
        // that is dropped.
        match unsafe { word.node::<'g, K, V>() } {
            Node::Empty => return Stop::Empty,
            Node::Leaf(e) => return Stop::Leaf(word, e),
            Node::Collision(c) => return Stop::Collision(word, c),
            Node::Inner(inner) => {
                // No frozen check here (it would touch the occupancy line on every level): a
                // frozen node has only empty slots, so an insert finds out when its `reserve`
                // fails, and an unlink cannot find its entry there.
                let slot = inner.slot(hash, trail.shift());
                trail.enter(Step {
                    slot,
                    node: Some(inner),
                });
            }
        }
    }
}
