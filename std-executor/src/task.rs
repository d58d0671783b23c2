//! Type-erased task nodes: one heap allocation per task holding the chain link, a vtable, the
//! task's kind and the job itself.
//!
//! A node is owned by exactly one party at a time: the submitter until its push succeeds, then
//! the key's chain (or a ready queue, for unkeyed tasks), then the worker that popped it, or a
//! [`PendingTask`](crate::PendingTask) after `shutdown_now`. Every path ends in exactly one of
//! [`TaskRef::run`] or [`TaskRef::abandon`], which consume and free the node; a node dropped
//! with its chain is abandoned as `Cancelled`. That is what guarantees that every task either
//! runs once or has its handle resolved (`Cancelled` / `Superseded`), never both and never neither.

use std::any::Any;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use keyserial_core::chain::{Link, Linked};

use crate::handle::JoinState;
use crate::semaphore::{Permit, Semaphore};
use crate::sync::Arc;
use crate::TaskError;

/// What kind of submission made the node; the drainer treats each kind differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `submit` / `execute` / `spawn`.
    Plain,
    /// `submit_latest`: superseded by an immediately following `submit_latest`.
    Latest,
    /// `submit_distinct`: at most one queued per key.
    Distinct,
    /// `submit_with_permits`: runs only once it holds its permits.
    Permits,
}

/// Why a task is abandoned without running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Abandon {
    Cancelled,
    Superseded,
}

/// A job: the user's closure plus how to report its outcome.
pub(crate) trait Job: Send + 'static {
    /// Runs the job, catching a panic, then releases `permit` (if any) *before* reporting the
    /// outcome, so a joiner never sees the task finished while it still holds permits. Returns
    /// `true` if it panicked.
    /// `done(panicked)` runs after the permit is released and before the handle resolves, so
    /// anything it records (the worker's counters) is visible to whoever joins the handle.
    fn run(self, permit: Option<Permit>, done: &dyn Fn(bool)) -> bool;
    /// Drops the job unrun, resolving its handle.
    fn abandon(self, why: Abandon);
}

/// `execute`: no handle; a panic is counted and its payload dropped.
pub(crate) struct Detached<F>(pub(crate) F);

impl<F: FnOnce() + Send + 'static> Job for Detached<F> {
    fn run(self, permit: Option<Permit>, done: &dyn Fn(bool)) -> bool {
        let result = catch_unwind(AssertUnwindSafe(self.0));
        drop(permit);
        done(result.is_err());
        match result {
            Ok(()) => false,
            Err(payload) => {
                drop_payload(payload);
                true
            }
        }
    }

    fn abandon(self, _why: Abandon) {}
}

/// `submit` and friends: the outcome goes to the handle.
pub(crate) struct Joined<F, T> {
    pub(crate) f: F,
    pub(crate) state: Arc<JoinState<T>>,
}

impl<F, T> Job for Joined<F, T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    fn run(self, permit: Option<Permit>, done: &dyn Fn(bool)) -> bool {
        let Joined { f, state } = self;
        let result = catch_unwind(AssertUnwindSafe(f));
        drop(permit);
        done(result.is_err());
        match result {
            Ok(v) => {
                state.complete(Ok(v));
                false
            }
            Err(payload) => {
                state.complete(Err(TaskError::Panicked(payload)));
                true
            }
        }
    }

    fn abandon(self, why: Abandon) {
        self.state.complete(Err(match why {
            Abandon::Cancelled => TaskError::Cancelled,
            Abandon::Superseded => TaskError::Superseded,
        }));
    }
}

/// Drops a panic payload, swallowing a panic from the payload's own destructor.
pub(crate) fn drop_payload(payload: Box<dyn Any + Send>) {
    let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
}

/// Runs a node's job, given the permits it holds and the completion hook.
type RunFn = unsafe fn(NonNull<Header>, Option<Permit>, &dyn Fn(bool)) -> bool;

struct VTable {
    run: RunFn,
    abandon: unsafe fn(NonNull<Header>, Abandon),
    permits: unsafe fn(NonNull<Header>) -> Option<(Semaphore, usize)>,
}

struct VTableOf<J>(std::marker::PhantomData<J>);

impl<J: Job> VTableOf<J> {
    const VTABLE: VTable = VTable {
        run: run_node::<J>,
        abandon: abandon_node::<J>,
        permits: permits_of::<J>,
    };
}

/// The type-erased front of every node.
#[repr(C)]
pub(crate) struct Header {
    link: Link,
    vtable: &'static VTable,
    kind: Kind,
    /// Permit-gated tasks: the permits granted while the chain was parked. Touched only by the
    /// owner of the node (the chain's owner, or the grant callback while the chain is parked).
    granted: Option<Permit>,
}

// SAFETY: `link` is the first field of a `repr(C)` struct, so the casts are exact inverses;
// a Link is pointer-aligned.
unsafe impl Linked for Header {
    fn link(node: NonNull<Self>) -> NonNull<Link> {
        node.cast()
    }

    unsafe fn from_link(link: NonNull<Link>) -> NonNull<Self> {
        link.cast()
    }

    unsafe fn drop_queued(node: NonNull<Self>) {
        // SAFETY: the chain hands over exclusive ownership of a node it never gives out again.
        unsafe { TaskRef::from_raw(node) }.abandon(Abandon::Cancelled);
    }
}

#[repr(C)]
struct Node<J> {
    header: Header,
    job: J,
    permits: Option<(Semaphore, usize)>,
}

/// An owned, type-erased task node. Dropping it abandons the task as `Cancelled`.
pub(crate) struct TaskRef(NonNull<Header>);

// SAFETY: every job is `Send` (the `Job` bound), and a TaskRef is the node's unique owner.
unsafe impl Send for TaskRef {}

impl fmt::Debug for TaskRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskRef")
            .field("kind", &self.kind())
            .finish()
    }
}

impl TaskRef {
    pub(crate) fn new<J: Job>(job: J, kind: Kind, permits: Option<(Semaphore, usize)>) -> TaskRef {
        let node = Box::new(Node {
            header: Header {
                link: Link::new(),
                vtable: &VTableOf::<J>::VTABLE,
                kind,
                granted: None,
            },
            job,
            permits,
        });
        TaskRef(NonNull::from(Box::leak(node)).cast())
    }

    /// Takes ownership of a node that was queued.
    ///
    /// # Safety
    /// `ptr` came from [`TaskRef::into_raw`] and the caller is now its unique owner.
    pub(crate) unsafe fn from_raw(ptr: NonNull<Header>) -> TaskRef {
        TaskRef(ptr)
    }

    /// Gives up ownership (to a chain or queue).
    pub(crate) fn into_raw(self) -> NonNull<Header> {
        let p = self.0;
        std::mem::forget(self);
        p
    }

    fn header(&self) -> &Header {
        // SAFETY: we own a live node.
        unsafe { self.0.as_ref() }
    }

    pub(crate) fn kind(&self) -> Kind {
        self.header().kind
    }

    /// The kind of a queued node, read by the chain's owner (who may look at queued nodes).
    ///
    /// # Safety
    /// The node is live and the caller owns the chain it is queued on.
    pub(crate) unsafe fn kind_of(ptr: NonNull<Header>) -> Kind {
        // SAFETY: per the contract.
        unsafe { ptr.as_ref() }.kind
    }

    /// The semaphore and permit count of a permit-gated task.
    pub(crate) fn permits(&self) -> Option<(Semaphore, usize)> {
        // SAFETY: the vtable matches the node's job type.
        unsafe { (self.header().vtable.permits)(self.0) }
    }

    /// Stores permits granted while the task waited.
    pub(crate) fn set_granted(&mut self, permit: Permit) {
        // SAFETY: we own the node exclusively (`&mut self`).
        unsafe { (*self.0.as_ptr()).granted = Some(permit) }
    }

    /// Takes the permits granted while the task waited, if any.
    pub(crate) fn take_granted(&mut self) -> Option<Permit> {
        // SAFETY: we own the node exclusively (`&mut self`).
        unsafe { (*self.0.as_ptr()).granted.take() }
    }

    /// Runs the task (a panic is caught) and frees the node. Returns `true` if it panicked.
    /// `permit` is held while the task runs and released when it ends; `done` runs before the
    /// task's handle resolves.
    pub(crate) fn run(mut self, permit: Option<Permit>, done: &dyn Fn(bool)) -> bool {
        let held = permit.or_else(|| self.take_granted());
        let p = self.into_raw();
        // SAFETY: the vtable matches the node; ownership passes to `run_node`, which frees it.
        unsafe { (p.as_ref().vtable.run)(p, held, done) }
    }

    /// Takes the job back out of a node that was never run (a refused submission), without
    /// resolving anything: the caller hands the closure back to the user.
    ///
    /// # Safety
    /// `J` is the job type the node was created with.
    pub(crate) unsafe fn into_job<J: Job>(self) -> J {
        let p = self.into_raw();
        // SAFETY: per the contract the node is a `Node<J>` made by `TaskRef::new`, and we own it.
        let node = unsafe { Box::from_raw(p.cast::<Node<J>>().as_ptr()) };
        let Node { header, job, .. } = *node;
        drop(header.granted);
        job
    }

    /// Frees the node without running it, resolving its handle.
    pub(crate) fn abandon(self, why: Abandon) {
        let p = self.into_raw();
        // SAFETY: as in `run`.
        unsafe { (p.as_ref().vtable.abandon)(p, why) }
    }
}

impl Drop for TaskRef {
    fn drop(&mut self) {
        let p = self.0;
        // SAFETY: a dropped TaskRef still owns its node; abandon consumes and frees it.
        unsafe { (p.as_ref().vtable.abandon)(p, Abandon::Cancelled) }
    }
}

unsafe fn run_node<J: Job>(
    p: NonNull<Header>,
    permit: Option<Permit>,
    done: &dyn Fn(bool),
) -> bool {
    // SAFETY: `p` is the header of a `Node<J>` made by `TaskRef::new` (the vtable is per J) and
    // ownership was passed to us.
    let node = unsafe { Box::from_raw(p.cast::<Node<J>>().as_ptr()) };
    let Node { header, job, .. } = *node;
    debug_assert!(
        header.granted.is_none(),
        "granted permits are passed in by TaskRef::run"
    );
    job.run(permit, done)
}

unsafe fn abandon_node<J: Job>(p: NonNull<Header>, why: Abandon) {
    // SAFETY: as in `run_node`.
    let node = unsafe { Box::from_raw(p.cast::<Node<J>>().as_ptr()) };
    let Node { header, job, .. } = *node;
    drop(header.granted);
    job.abandon(why)
}

unsafe fn permits_of<J: Job>(p: NonNull<Header>) -> Option<(Semaphore, usize)> {
    // SAFETY: as in `run_node`, but only borrowed.
    unsafe { p.cast::<Node<J>>().as_ref() }.permits.clone()
}
