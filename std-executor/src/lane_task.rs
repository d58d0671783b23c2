//! A lane's item: a key, its hash and its task, stored (without the hash) in the lane FIFO's
//! slot itself.
//!
//! A task is one of two things, told apart by its `ops` table:
//!
//! - **Inline:** an `execute` closure of up to [`WORDS`] words (and word alignment) lives in the
//!   slot's own bytes. Submitting it allocates nothing, and the worker reads it from the line the
//!   submitter wrote, in submission order: no node to allocate, fill, fetch from the other core
//!   and free. A pre-boxed `Box<dyn FnOnce()>` wrapped to count its completion is three words.
//! - **Node:** every other task (a handle's, a permit-gated, latest or distinct task, or a
//!   closure too big to inline) is a task node (`task.rs`), and the slot holds its pointer.
//!
//! A lane's slot holds an item in 48 bytes for a `u64` key: the key and the task's four words
//! ([`Stored`], 40 bytes), and the FIFO's tag word, which is the task's `ops` pointer
//! (`keyserial_core::fifo`, "Layout": the word the pusher stores last, telling the popper the
//! slot is written). The key's hash is not stored: the lane's owner computes it again when it
//! pops the item. Slots so come four to three cache lines. Measured against 64-byte slots (hash
//! stored, and a position stamp beside `ops`), alternating builds (BENCHMARKS.md, "This round"):
//! boxed W3's peak RSS growth fell from 16.7 to 8.9 MiB at the median of 10 alternations of 7
//! runs each, with rates level. (Run M found slots that straddle lines 20% slower on W2 with
//! pre-boxed tasks, but that was inlining into crossbeam's `SegQueue`; here boxed W2 measured
//! level, 1.04x over 8 alternations.)
//!
//! # Looking ahead
//!
//! While a lane's owner runs one item, the next one's task data is usually far away: a
//! pre-boxed task's box was written by another thread long ago. So after a pop the owner peeks
//! at the next item and hints its first word's target into the cache ([`LaneTask::prefetch_parts`],
//! `keyserial_core::prefetch`). For a node that word is the node; for an inline closure it is
//! whatever lies in its first word (Rust does not fix a closure's layout), which for the common
//! task shapes (a boxed closure, an `Arc` or a reference to shared state) is the pointer its
//! body reads first. A word that is no pointer (a number, padding) costs one dropped hint; a
//! closure smaller than a word is not looked at.
//!
//! A task whose key turns out to be tracked (`route.rs`) becomes a node on the way to its chain
//! ([`LaneTask::into_task`]); the cost falls only on keys that need state.

use std::mem::{align_of, size_of, ManuallyDrop, MaybeUninit};

use keyserial_core::fifo::Tag;

use crate::task::{Detached, Job, Kind, TaskRef};

/// Words of a closure stored inline.
pub(crate) const WORDS: usize = 4;

/// The inline bytes of a task.
type Words = MaybeUninit<[usize; WORDS]>;

/// What can be done with the bytes of a [`LaneTask`]; one static table per stored type.
struct Ops {
    /// Runs the task (a panic is caught); `true` if it panicked.
    run: unsafe fn(*mut Words, &dyn Fn(bool)) -> bool,
    /// The task as a node.
    into_task: unsafe fn(*mut Words) -> TaskRef,
    /// Drops the task unrun.
    drop: unsafe fn(*mut Words),
    /// The bytes hold a [`TaskRef`] (whose node knows its kind); otherwise a plain closure.
    node: bool,
    /// The task fills at least a word: worth a [`LaneTask::prefetch_parts`] (see "Looking ahead").
    first_word: bool,
}

/// The table of a stored type `T` (see [`Store`]).
trait Store: Sized {
    const OPS: Ops;
}

/// An inline `execute` closure.
struct Inline<F>(F);

impl<F: FnOnce() + Send + 'static> Store for Inline<F> {
    const OPS: Ops = Ops {
        run: |p, done| {
            // SAFETY: `p` holds an `Inline<F>` (this table's type), read exactly once: the
            // caller (`LaneTask::run`) never uses the bytes again.
            let Inline(f) = unsafe { take::<Inline<F>>(p) };
            Detached(f).run(None, done)
        },
        into_task: |p| {
            // SAFETY: as in `run`.
            let Inline(f) = unsafe { take::<Inline<F>>(p) };
            TaskRef::new(Detached(f), Kind::Plain, None)
        },
        drop: |p| {
            // SAFETY: as in `run`.
            let Inline(f) = unsafe { take::<Inline<F>>(p) };
            // The captures' `Drop` is user code (`user.rs`).
            crate::user::drop_quietly(f);
        },
        node: false,
        first_word: size_of::<F>() >= size_of::<usize>(),
    };
}

impl Store for TaskRef {
    const OPS: Ops = Ops {
        run: |p, done| {
            // SAFETY: `p` holds a `TaskRef` (this table's type), read exactly once.
            unsafe { take::<TaskRef>(p) }.run(None, done)
        },
        into_task: |p| {
            // SAFETY: as in `run`.
            unsafe { take::<TaskRef>(p) }
        },
        drop: |p| {
            // SAFETY: as in `run`.
            drop(unsafe { take::<TaskRef>(p) });
        },
        node: true,
        first_word: true,
    };
}

/// What a slot holds once its task was taken out in place (`Lane::for_each_queued`, for
/// `cancel_key`): nothing. Its table is never run (a pop skips it: [`LaneTask::tombstone_tag`]);
/// dropping it drops nothing.
static TOMBSTONE: Ops = Ops {
    run: |_, _| unreachable!("a tombstone is skipped, never run"),
    into_task: |_| unreachable!("a tombstone is skipped, never routed"),
    drop: |_| {},
    node: false,
    first_word: false,
};

/// Whether a `T` fits in [`Words`].
const fn fits<T>() -> bool {
    size_of::<T>() <= size_of::<Words>() && align_of::<T>() <= align_of::<Words>()
}

/// The table a tag stands for ([`LaneTask::into_parts`]).
///
/// # Safety
///
/// `tag` is the address of a `&'static Ops`, as `into_parts` makes it.
#[inline(always)]
unsafe fn ops_of(tag: Tag) -> &'static Ops {
    // SAFETY: the caller's contract: a live, static table.
    unsafe { &*(tag.get() as *const Ops) }
}

/// Moves `value` into the bytes of a task. The caller keeps the bytes with `T`'s table.
fn stash<T: Store>(value: T) -> LaneTask {
    assert!(fits::<T>(), "a stored task fits in its slot");
    let mut data = Words::uninit();
    // SAFETY: `T` fits in `Words` (size and alignment, checked above), and `data` is ours.
    unsafe { data.as_mut_ptr().cast::<T>().write(value) };
    LaneTask { ops: &T::OPS, data }
}

/// Moves the `T` out of the bytes at `p`.
///
/// # Safety
///
/// `p` holds a `T` that [`stash`] wrote and nothing has taken yet; the caller never reads it
/// again.
unsafe fn take<T>(p: *mut Words) -> T {
    // SAFETY: the caller's contract; `stash` wrote a `T` at the start of the (aligned) bytes.
    unsafe { p.cast::<T>().read() }
}

/// A task in a lane's slot (see the module docs). `repr(C)`, `ops` last: a move of an
/// `Option<Item>` tests `ops` (its niche) on its own and copies the rest in aligned 16-byte
/// pieces, each read back from where it was stored (no store-forwarding stall).
#[repr(C)]
pub(crate) struct LaneTask {
    data: Words,
    ops: &'static Ops,
}

// `LaneTask` is `Send` as its parts are (a static table and plain bytes); what the bytes hold
// was `Send` when it went in: `execute` requires `F: Send`, and `TaskRef` is `Send`.

impl LaneTask {
    /// A task node.
    pub(crate) fn node(task: TaskRef) -> LaneTask {
        stash(task)
    }

    /// `execute`'s closure: inline if it fits, in a node otherwise.
    pub(crate) fn execute<F: FnOnce() + Send + 'static>(f: F) -> LaneTask {
        if fits::<Inline<F>>() {
            stash(Inline(f))
        } else {
            stash(TaskRef::new(Detached(f), Kind::Plain, None))
        }
    }

    /// The kind of submission that made the task (an inline task is always `execute`'s).
    #[inline]
    pub(crate) fn kind(&self) -> Kind {
        if self.ops.node {
            // SAFETY: a node table's bytes hold a live `TaskRef`; we only borrow it.
            unsafe { &*self.data.as_ptr().cast::<TaskRef>() }.kind()
        } else {
            Kind::Plain
        }
    }

    /// The task as a node (an inline closure moves into a new one).
    pub(crate) fn into_task(self) -> TaskRef {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this.data` holds what its table expects; `ManuallyDrop` keeps our `Drop` from
        // using the bytes again.
        unsafe { (this.ops.into_task)(&mut this.data) }
    }

    /// Splits the task into its table, as a lane FIFO's slot tag (`keyserial_core::fifo`,
    /// "Layout"), and its bytes, which the slot stores beside the key (see [`Stored`]).
    #[inline(always)]
    pub(crate) fn into_parts(self) -> (Tag, TaskBytes) {
        let this = ManuallyDrop::new(self);
        let tag = Tag::new(this.ops as *const Ops as usize).expect("a reference is never null");
        (tag, TaskBytes(this.data))
    }

    /// The task split by [`into_parts`](Self::into_parts).
    ///
    /// # Safety
    ///
    /// `tag` and `bytes` come from one call of `into_parts`, and neither was used since.
    #[inline(always)]
    pub(crate) unsafe fn from_parts(tag: Tag, bytes: TaskBytes) -> LaneTask {
        // SAFETY: the caller's contract: `tag` is the table `into_parts` made it from.
        let ops = unsafe { ops_of(tag) };
        LaneTask { data: bytes.0, ops }
    }

    /// The tag of a tombstone (a slot whose task was taken out in place).
    #[inline(always)]
    pub(crate) fn tombstone_tag() -> Tag {
        Tag::new(&TOMBSTONE as *const Ops as usize).expect("a reference is never null")
    }

    /// Takes the task out of a lane slot's parts in place, leaving a tombstone (its tag
    /// [`tombstone_tag`](Self::tombstone_tag)); `None` if the slot holds one already.
    ///
    /// # Safety
    ///
    /// `tag` and `bytes` are one task's parts (`into_parts`), still unused, or a tombstone.
    pub(crate) unsafe fn take_in_place(tag: &mut Tag, bytes: &mut TaskBytes) -> Option<LaneTask> {
        if *tag == Self::tombstone_tag() {
            return None;
        }
        let parts = std::mem::replace(bytes, TaskBytes(Words::uninit()));
        let old = std::mem::replace(tag, Self::tombstone_tag());
        // SAFETY: the caller's contract: the parts of one task, unused since; the slot keeps
        // only the tombstone now.
        Some(unsafe { Self::from_parts(old, parts) })
    }

    /// Hints the CPU to fetch what the first word of a task, still split in a lane's slot,
    /// points to (see "Looking ahead"): a node's own line, or the data of a closure that
    /// captured a pointer first.
    ///
    /// # Safety
    ///
    /// `tag` and `bytes` are the parts of one task (`into_parts`), still unused.
    #[inline(always)]
    pub(crate) unsafe fn prefetch_parts(tag: Tag, bytes: &TaskBytes) {
        // SAFETY: the caller's contract: `tag` is the table `into_parts` made it from.
        let ops = unsafe { ops_of(tag) };
        if ops.first_word {
            // SAFETY: `bytes` is four word-aligned words of our own, so its first word is in
            // bounds and aligned; `prefetch_pointee` allows bytes that are padding or were
            // never written, and uses the value only as the address of a hint.
            unsafe { keyserial_core::prefetch::prefetch_pointee(bytes.0.as_ptr().cast()) };
        }
    }

    /// Drops the task unrun because user code on its way to running panicked (its key's
    /// `Hash`, `Eq` or `Clone`): a handle resolves `Panicked` with `payload`.
    #[cold]
    pub(crate) fn fail(self, payload: crate::user::Payload) {
        self.into_task().fail(payload);
    }

    /// Runs the task (a panic is caught); `done(panicked)` runs before a handle resolves.
    /// Returns `true` if it panicked.
    #[inline(always)]
    pub(crate) fn run(self, done: &dyn Fn(bool)) -> bool {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: as in `into_task`.
        unsafe { (this.ops.run)(&mut this.data, done) }
    }
}

impl Drop for LaneTask {
    fn drop(&mut self) {
        // SAFETY: the bytes still hold what the table expects (`run` and `into_task` skip this
        // drop); they are not used again.
        unsafe { (self.ops.drop)(&mut self.data) }
    }
}

/// One keyed submission on its way through a lane: the key, its hash (the table's hasher) and
/// its task.
pub(crate) struct Item<K> {
    pub(crate) key: K,
    pub(crate) hash: u64,
    pub(crate) task: LaneTask,
}

/// A task's bytes without its table ([`LaneTask::into_parts`]): dropping them leaks the task,
/// so they only travel in a lane's slot, whose tag is the table.
pub(crate) struct TaskBytes(Words);

/// What a lane's FIFO slot holds of an [`Item`]: the key and the task's bytes; the task's
/// table is the slot's tag, and the hash is the key's, which the lane's owner computes again
/// when it pops the item (`Lane::pop`; a few multiplications for an integer key). 40 bytes
/// for a `u64` key: with the tag, a 48-byte slot.
#[repr(C)]
pub(crate) struct Stored<K> {
    pub(crate) key: K,
    pub(crate) bytes: TaskBytes,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_small_closure_is_inline_and_runs_once() {
        let ran = Arc::new(AtomicUsize::new(0));
        let drops = Arc::new(AtomicUsize::new(0));
        let (r, guard) = (ran.clone(), Counted(drops.clone()));
        let t = LaneTask::execute(move || {
            let _g = &guard;
            r.fetch_add(1, Ordering::Relaxed);
        });
        assert!(!t.ops.node);
        assert!(t.ops.first_word, "it captured two words");
        assert!(
            !LaneTask::execute(|| {}).ops.first_word,
            "nothing to look at"
        );
        let (tag, bytes) = t.into_parts();
        // SAFETY: one task's parts, unused since.
        unsafe { LaneTask::prefetch_parts(tag, &bytes) };
        // SAFETY: as above.
        let t = unsafe { LaneTask::from_parts(tag, bytes) };
        assert_eq!(t.kind(), Kind::Plain);
        let done = AtomicUsize::new(0);
        assert!(!t.run(&|p| {
            assert!(!p);
            done.fetch_add(1, Ordering::Relaxed);
        }));
        assert_eq!(ran.load(Ordering::Relaxed), 1);
        assert_eq!(drops.load(Ordering::Relaxed), 1);
        assert_eq!(done.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_big_closure_goes_into_a_node() {
        let big = [7u64; 8];
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let t = LaneTask::execute(move || {
            r.fetch_add(big.iter().sum::<u64>() as usize, Ordering::Relaxed);
        });
        assert!(t.ops.node && t.ops.first_word);
        let (tag, bytes) = t.into_parts();
        // SAFETY: one task's parts, unused since.
        unsafe { LaneTask::prefetch_parts(tag, &bytes) };
        // SAFETY: as above.
        let t = unsafe { LaneTask::from_parts(tag, bytes) };
        assert_eq!(t.kind(), Kind::Plain);
        t.into_task().run(None, &|_| {});
        assert_eq!(ran.load(Ordering::Relaxed), 56);
    }

    #[test]
    fn dropped_unrun_or_moved_into_a_node_drops_the_closure_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        let g = Counted(drops.clone());
        drop(LaneTask::execute(move || drop(g)));
        assert_eq!(drops.load(Ordering::Relaxed), 1);
        let g = Counted(drops.clone());
        let node = LaneTask::execute(move || drop(g)).into_task();
        assert_eq!(drops.load(Ordering::Relaxed), 1);
        node.run(None, &|_| {});
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_panicking_inline_task_is_caught_and_reported() {
        let seen = AtomicUsize::new(0);
        let t = LaneTask::execute(|| panic!("boom"));
        assert!(t.run(&|p| {
            assert!(p);
            seen.fetch_add(1, Ordering::Relaxed);
        }));
        assert_eq!(seen.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_stored_item_is_40_bytes_for_an_integer_key() {
        assert_eq!(size_of::<Stored<u64>>(), 40);
    }

    #[test]
    fn a_task_split_into_parts_and_joined_runs_once() {
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let (tag, bytes) = LaneTask::execute(move || {
            r.fetch_add(1, Ordering::Relaxed);
        })
        .into_parts();
        // SAFETY: the parts of one task, unused since.
        unsafe { LaneTask::prefetch_parts(tag, &bytes) };
        // SAFETY: as above.
        let task = unsafe { LaneTask::from_parts(tag, bytes) };
        assert!(!task.run(&|p| assert!(!p)));
        assert_eq!(ran.load(Ordering::Relaxed), 1);
    }
}
