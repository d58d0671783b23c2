//! A lane's task: an `execute` closure of at most two words, stored in the lane's slot itself,
//! or a task node (`task.rs`) for everything else.
//!
//! A lane item is the key plus this task, 32 bytes for a `u64` key: a pre-boxed
//! `Box<dyn FnOnce()>` is two words, and so is a closure capturing two pointers. Stored inline,
//! such a task costs no allocation and no second cache line: the worker reads it from the slot
//! the submitter wrote, in submission order. Anything larger, anything with a handle, and
//! anything that must wait on a chain becomes (or already is) a node.

use std::any::Any;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::task::{drop_payload, Detached, Kind, TaskRef};

type Words = [usize; 2];

/// What an inline closure can be asked to do; one table per closure type.
struct InlineVTable {
    /// Runs the closure (moved out of the words), catching a panic.
    run: unsafe fn(*mut Words) -> Result<(), Box<dyn Any + Send>>,
    /// Drops the closure unrun.
    drop: unsafe fn(*mut Words),
    /// Moves the closure into a task node.
    into_node: unsafe fn(*mut Words) -> TaskRef,
}

struct Inline<F>(F);

impl<F: FnOnce() + Send + 'static> Inline<F> {
    const VTABLE: InlineVTable = InlineVTable {
        run: Self::run,
        drop: Self::drop,
        into_node: Self::into_node,
    };

    /// # Safety
    /// `p` holds an initialised `F`, which the caller never uses again.
    unsafe fn run(p: *mut Words) -> Result<(), Box<dyn Any + Send>> {
        // SAFETY: per the contract, `p` holds an `F`, moved out once here.
        let f = unsafe { p.cast::<F>().read() };
        catch_unwind(AssertUnwindSafe(f))
    }

    /// # Safety
    /// As for `run`.
    unsafe fn drop(p: *mut Words) {
        // SAFETY: per the contract, `p` holds an `F`, dropped once here.
        unsafe { p.cast::<F>().drop_in_place() }
    }

    /// # Safety
    /// As for `run`.
    unsafe fn into_node(p: *mut Words) -> TaskRef {
        // SAFETY: per the contract, `p` holds an `F`, moved out once here.
        let f = unsafe { p.cast::<F>().read() };
        TaskRef::new(Detached(f), Kind::Plain, None)
    }
}

/// A task in a lane's slot (see the module docs).
pub(crate) struct LaneTask {
    /// `None`: `data[0]` is a task node's address.
    inline: Option<&'static InlineVTable>,
    data: MaybeUninit<Words>,
}

// SAFETY: an inline task is built only from an `F: Send` (see `execute`), a node is `Send`.
unsafe impl Send for LaneTask {}

impl LaneTask {
    /// A task node.
    pub(crate) fn node(task: TaskRef) -> LaneTask {
        let mut data = MaybeUninit::<Words>::uninit();
        // SAFETY: `data` is ours and large enough for a pointer; `Drop` and `into_task` take
        // the node back exactly once.
        unsafe {
            data.as_mut_ptr()
                .cast::<usize>()
                .write(task.into_raw().as_ptr() as usize)
        };
        LaneTask { inline: None, data }
    }

    /// `execute`'s closure, inline if it fits in two words, in a node otherwise.
    pub(crate) fn execute<F: FnOnce() + Send + 'static>(f: F) -> LaneTask {
        if size_of::<F>() > size_of::<Words>() || align_of::<F>() > align_of::<Words>() {
            return LaneTask::node(TaskRef::new(Detached(f), Kind::Plain, None));
        }
        let mut data = MaybeUninit::<Words>::uninit();
        // SAFETY: `F` fits in `data`'s size and alignment (checked above); `data` is ours.
        unsafe { data.as_mut_ptr().cast::<F>().write(f) };
        LaneTask {
            inline: Some(&Inline::<F>::VTABLE),
            data,
        }
    }

    /// The node's address, for a node task.
    fn node_ptr(&self) -> Option<std::ptr::NonNull<crate::task::Header>> {
        if self.inline.is_some() {
            return None;
        }
        // SAFETY: a node task's first word is the node's address, written by `node`.
        let addr = unsafe { self.data.as_ptr().cast::<usize>().read() };
        std::ptr::NonNull::new(addr as *mut crate::task::Header)
    }

    /// The kind of submission that made the task (an inline task is a plain `execute`).
    pub(crate) fn kind(&self) -> Kind {
        match self.node_ptr() {
            // SAFETY: the node is live and ours (we hold the task).
            Some(p) => unsafe { TaskRef::kind_of(p) },
            None => Kind::Plain,
        }
    }

    /// The task as a node (an inline closure is moved into a new one).
    pub(crate) fn into_task(self) -> TaskRef {
        let mut me = ManuallyDrop::new(self);
        match me.inline {
            // SAFETY: `data` holds the closure `vt` was made for; `me` is never dropped, so
            // the closure is moved out only here.
            Some(vt) => unsafe { (vt.into_node)(me.data.as_mut_ptr()) },
            // SAFETY: the node is ours, given up by `node` and taken back once here.
            None => unsafe { TaskRef::from_raw(me.node_ptr().expect("a node task")) },
        }
    }

    /// Runs the task (a panic is caught); `done(panicked)` runs before a handle resolves.
    /// Returns `true` if it panicked.
    pub(crate) fn run(self, done: &dyn Fn(bool)) -> bool {
        let mut me = ManuallyDrop::new(self);
        let Some(vt) = me.inline else {
            return ManuallyDrop::into_inner(me).into_task().run(None, done);
        };
        // SAFETY: `data` holds the closure `vt` was made for; `me` is never dropped.
        let result = unsafe { (vt.run)(me.data.as_mut_ptr()) };
        done(result.is_err());
        match result {
            Ok(()) => false,
            Err(payload) => {
                drop_payload(payload);
                true
            }
        }
    }
}

impl Drop for LaneTask {
    fn drop(&mut self) {
        match self.inline {
            // SAFETY: `data` holds the closure `vt` was made for, dropped once here.
            Some(vt) => unsafe { (vt.drop)(self.data.as_mut_ptr()) },
            None => {
                let p = self.node_ptr().expect("a node task");
                // SAFETY: the node is ours; dropping the `TaskRef` abandons it (`Cancelled`).
                drop(unsafe { TaskRef::from_raw(p) });
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn small_closures_are_inline_and_run_or_drop_exactly_once() {
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let t = LaneTask::execute(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        assert!(t.inline.is_some());
        assert_eq!(t.kind(), Kind::Plain);
        assert!(!t.run(&|p| assert!(!p)));
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(Arc::strong_count(&ran), 1, "the capture was consumed");

        let r = ran.clone();
        drop(LaneTask::execute(move || drop(r)));
        assert_eq!(Arc::strong_count(&ran), 1, "dropped unrun");

        let boxed: Box<dyn FnOnce() + Send> = Box::new(|| panic!("boom"));
        let t = LaneTask::execute(boxed);
        assert!(t.inline.is_some(), "a pre-boxed task is two words");
        assert!(t.run(&|p| assert!(p)), "a panic is caught and reported");
    }

    #[test]
    fn large_closures_become_nodes_and_inline_ones_convert() {
        let big = [7u64; 4];
        let t = LaneTask::execute(move || assert_eq!(big[3], 7));
        assert!(t.inline.is_none());
        assert!(!t.run(&|_| {}));

        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let t = LaneTask::execute(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        let node = t.into_task();
        assert_eq!(node.kind(), Kind::Plain);
        node.run(None, &|_| {});
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }
}
