//! A lane's item: a key, its hash and its task, a task node (`task.rs`) behind the few
//! operations a lane needs.
//!
//! Measured and not kept: storing an `execute` closure of up to two words in the lane's slot
//! itself. The item grew from 24 to 32 bytes (40-byte queue slots, straddling cache lines), which
//! cost 20% on W2 with pre-boxed tasks (A/B pairs, BENCHMARKS.md), and no `compare` closure fits
//! in two words once it is wrapped to count its completion (a pre-boxed task is two words, plus
//! the counter). A lane with its own FIFO of 32-byte, line-aligned slots could take it up again.

use crate::task::{Kind, TaskRef};

/// A task in a lane's slot (see the module docs).
pub(crate) struct LaneTask(TaskRef);

impl LaneTask {
    /// A task node.
    pub(crate) fn node(task: TaskRef) -> LaneTask {
        LaneTask(task)
    }

    /// `execute`'s closure, in a node.
    pub(crate) fn execute<F: FnOnce() + Send + 'static>(f: F) -> LaneTask {
        LaneTask(TaskRef::new(crate::task::Detached(f), Kind::Plain, None))
    }

    /// The kind of submission that made the task.
    pub(crate) fn kind(&self) -> Kind {
        self.0.kind()
    }

    /// The task as a node.
    pub(crate) fn into_task(self) -> TaskRef {
        self.0
    }

    /// Runs the task (a panic is caught); `done(panicked)` runs before a handle resolves.
    /// Returns `true` if it panicked.
    pub(crate) fn run(self, done: &dyn Fn(bool)) -> bool {
        self.0.run(None, done)
    }
}

/// One keyed submission in a lane: the key, its hash (the table's hasher) and its task; 24
/// bytes for a `u64` key, so the queue's 32-byte slots sit two to a cache line.
pub(crate) struct Item<K> {
    pub(crate) key: K,
    pub(crate) hash: u64,
    pub(crate) task: LaneTask,
}
