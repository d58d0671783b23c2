//! Type-erased task nodes: one allocation per task (from [`nodes`]'s recycled
//! size classes) holding the chain link, a vtable, the task's kind and the job itself; a
//! permit-gated task's node also carries its permit request (`Gated`).
//!
//! A node is owned by exactly one party at a time: the submitter until its push succeeds; then
//! the place it waits in: a lane's slot (as a [`LaneTask`](crate::lane_task::LaneTask) holding
//! the node, `lane_task.rs`), a latest cell (`latest_cells.rs`), a deferral (`deferral.rs`),
//! the key's chain, or a ready queue (unkeyed tasks); then the worker that popped it, or a
//! [`PendingTask`](crate::PendingTask) after `shutdown_now`. (An `execute` closure small enough
//! is no node at all while it waits in its lane slot: it lives inline there and becomes a node
//! only if it must move onto a chain.) Every path ends in exactly one of [`TaskRef::run`],
//! [`TaskRef::abandon`] or [`TaskRef::fail`], which consume and free the node; a node dropped
//! with its chain is abandoned as `Cancelled`. That is what guarantees that every task either
//! runs once or has its handle resolved (`Cancelled` / `Superseded`, or `Panicked` when its
//! key's code panicked on its way), never both and never neither.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;

use keyserial_core::chain::{Link, Linked};

use crate::error::{PanicPayload, TaskError};
use crate::handle::JoinState;
use crate::nodes;
use crate::semaphore::{Permit, Semaphore};
use crate::sync::Arc;
use crate::user::{self, drop_payload, Payload};

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
    /// A lane item standing for a key's pending `submit_latest` task (`latest_cells.rs`).
    LatestCell,
    /// `submit_async`: a future, polled on its key's chain (`future_task.rs`).
    Future,
    /// `submit_with_state`: runs on its key's chain, with the key's state (`state.rs`).
    State,
}

/// Why a task is abandoned without running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Abandon {
    Cancelled,
    Superseded,
}

/// A job: the user's closure plus how to report its outcome.
///
/// Every method contains the user code it runs (the closure, its captures' and its output's
/// `Drop`s, a waker): none unwinds into the caller (`user.rs`).
pub(crate) trait Job: Send + 'static {
    /// Runs the job, catching a panic, then releases `permit` (if any) *before* reporting the
    /// outcome, so a joiner never sees the task finished while it still holds permits. Returns
    /// `true` if it panicked.
    /// `done(panicked)` runs after the permit is released and before the handle resolves, so
    /// anything it records (the worker's counters) is visible to whoever joins the handle.
    fn run(self, permit: Option<Permit>, done: &dyn Fn(bool)) -> bool;
    /// Drops the job unrun, resolving its handle.
    fn abandon(self, why: Abandon);
    /// Drops the job unrun because user code outside its closure panicked on its way to
    /// running (its key's `Hash`, `Eq` or `Clone`): the handle resolves `Panicked` with that
    /// payload.
    fn fail(self, payload: Payload);
}

/// `execute`: no handle; a panic is counted and its payload dropped.
pub(crate) struct Detached<F>(pub(crate) F);

impl<F: FnOnce() + Send + 'static> Job for Detached<F> {
    fn run(self, permit: Option<Permit>, done: &dyn Fn(bool)) -> bool {
        let result = user::catch(self.0);
        // Releasing permits may run the semaphore's granted callbacks (user code, `user.rs`).
        user::drop_quietly(permit);
        done(result.is_err());
        match result {
            Ok(()) => false,
            Err(payload) => {
                drop_payload(payload);
                true
            }
        }
    }

    fn abandon(self, _why: Abandon) {
        user::drop_quietly(self.0);
    }

    fn fail(self, payload: Payload) {
        user::drop_quietly(self.0);
        drop_payload(payload);
    }
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
        let result = user::catch(f);
        // Releasing permits may run the semaphore's granted callbacks (user code, `user.rs`).
        user::drop_quietly(permit);
        done(result.is_err());
        let panicked = result.is_err();
        state.complete(result.map_err(|p| TaskError::Panicked(PanicPayload::new(p))));
        // With the handle gone, this drops the output (or the payload): user code.
        user::drop_quietly(state);
        panicked
    }

    fn abandon(self, why: Abandon) {
        // The closure (and what it captured) goes before the handle resolves, so a joiner that
        // sees `Superseded`/`Cancelled` also sees the captures released.
        let Joined { f, state } = self;
        user::drop_quietly(f);
        state.complete(Err(match why {
            Abandon::Cancelled => TaskError::Cancelled,
            Abandon::Superseded => TaskError::Superseded,
        }));
        user::drop_quietly(state);
    }

    fn fail(self, payload: Payload) {
        let Joined { f, state } = self;
        user::drop_quietly(f);
        state.complete(Err(TaskError::Panicked(PanicPayload::new(payload))));
        user::drop_quietly(state);
    }
}

/// Runs a node's job, given the permits it holds and the completion hook.
pub(crate) type RunFn = unsafe fn(NonNull<Header>, Option<Permit>, &dyn Fn(bool)) -> bool;

/// What a node's type does (one table per job type; a future's node has its own, made by
/// [`VTable::managed`]).
pub(crate) struct VTable {
    run: RunFn,
    abandon: unsafe fn(NonNull<Header>, Abandon),
    fail: unsafe fn(NonNull<Header>, Payload),
    /// The semaphore and count a permit-gated task needs (`None` for every other task).
    permits: unsafe fn(NonNull<Header>) -> Option<(Semaphore, usize)>,
    /// Where a permit-gated task keeps the permits granted while it waited.
    granted: unsafe fn(NonNull<Header>) -> Option<NonNull<Option<Permit>>>,
    /// The node is a `Node<J, Gated>` (else a `Node<J, ()>`).
    gated: bool,
}

impl VTable {
    /// The table of a node that manages its own job and memory (a future's, `future_task.rs`,
    /// whose memory outlives the job while wakers refer to it): `run`, `abandon` and `fail`
    /// each end the job and give up the node; it asks for no permits.
    pub(crate) const fn managed(
        run: RunFn,
        abandon: unsafe fn(NonNull<Header>, Abandon),
        fail: unsafe fn(NonNull<Header>, Payload),
    ) -> VTable {
        VTable {
            run,
            abandon,
            fail,
            permits: no_permits,
            granted: no_granted,
            gated: false,
        }
    }
}

unsafe fn no_permits(_: NonNull<Header>) -> Option<(Semaphore, usize)> {
    None
}

unsafe fn no_granted(_: NonNull<Header>) -> Option<NonNull<Option<Permit>>> {
    None
}

struct VTableOf<J, X>(std::marker::PhantomData<(J, X)>);

impl<J: Job, X: Extra> VTableOf<J, X> {
    const VTABLE: VTable = VTable {
        run: run_node::<J, X>,
        abandon: abandon_node::<J, X>,
        fail: fail_node::<J, X>,
        permits: permits_of::<J, X>,
        granted: granted_of::<J, X>,
        gated: X::GATED,
    };
}

/// The type-erased front of every node.
#[repr(C)]
pub(crate) struct Header {
    link: Link,
    vtable: &'static VTable,
    kind: Kind,
}

impl Header {
    /// The header of a node with its own table ([`VTable::managed`]).
    pub(crate) fn new(vtable: &'static VTable, kind: Kind) -> Header {
        Header {
            link: Link::new(),
            vtable,
            kind,
        }
    }
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
        // SAFETY: the chain hands over a live node it never gives out again: ours alone.
        unsafe { TaskRef::from_raw(node) }.abandon(Abandon::Cancelled);
    }
}

/// What a node carries besides its job: nothing for most tasks (a node is then its header plus
/// the closure: 24 bytes of overhead), the permit request for permit-gated ones.
trait Extra: Send + 'static {
    const GATED: bool;
    fn permits(&self) -> Option<(Semaphore, usize)>;
    fn granted(&mut self) -> Option<&mut Option<Permit>>;
}

impl Extra for () {
    const GATED: bool = false;
    fn permits(&self) -> Option<(Semaphore, usize)> {
        None
    }
    fn granted(&mut self) -> Option<&mut Option<Permit>> {
        None
    }
}

/// A permit-gated task's extra state.
struct Gated {
    wants: (Semaphore, usize),
    /// The permits granted while the chain was parked. Touched only by the owner of the node
    /// (the chain's owner, or the grant callback while the chain is parked).
    granted: Option<Permit>,
}

impl Extra for Gated {
    const GATED: bool = true;
    fn permits(&self) -> Option<(Semaphore, usize)> {
        Some(self.wants.clone())
    }
    fn granted(&mut self) -> Option<&mut Option<Permit>> {
        Some(&mut self.granted)
    }
}

#[repr(C)]
struct Node<J, X> {
    header: Header,
    job: J,
    extra: X,
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
        match permits {
            None => Self::with_extra(job, kind, ()),
            Some(wants) => Self::with_extra(
                job,
                kind,
                Gated {
                    wants,
                    granted: None,
                },
            ),
        }
    }

    fn with_extra<J: Job, X: Extra>(job: J, kind: Kind, extra: X) -> TaskRef {
        let p = nodes::alloc(Layout::new::<Node<J, X>>()).cast::<Node<J, X>>();
        // SAFETY: `p` is fresh memory with at least `Node<J, X>`'s size and alignment.
        unsafe {
            p.as_ptr().write(Node {
                header: Header {
                    link: Link::new(),
                    vtable: &VTableOf::<J, X>::VTABLE,
                    kind,
                },
                job,
                extra,
            })
        };
        TaskRef(p.cast())
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

    /// The node, still owned by `self` (for a node kind that knows its own layout).
    pub(crate) fn as_ptr(&self) -> NonNull<Header> {
        self.0
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

    /// Stores permits granted while the task waited (only permit-gated tasks get any; for
    /// another task the permits are released at once).
    pub(crate) fn set_granted(&mut self, permit: Permit) {
        // SAFETY: the vtable matches the node; we own it exclusively (`&mut self`).
        match unsafe { (self.header().vtable.granted)(self.0) } {
            // SAFETY: the slot lives in our node and nothing else refers to it.
            Some(slot) => unsafe { *slot.as_ptr() = Some(permit) },
            None => debug_assert!(false, "permits granted to a task that asked for none"),
        }
    }

    /// Takes the permits granted while the task waited, if any.
    pub(crate) fn take_granted(&mut self) -> Option<Permit> {
        if !self.header().vtable.gated {
            return None; // every plain task, on the hot path: no indirect call
        }
        // SAFETY: the vtable matches the node; we own it exclusively (`&mut self`).
        let slot = unsafe { (self.header().vtable.granted)(self.0) }?;
        // SAFETY: the slot lives in our node and nothing else refers to it.
        unsafe { (*slot.as_ptr()).take() }
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
        // SAFETY: we own a live node.
        let gated = unsafe { p.as_ref() }.vtable.gated;
        // SAFETY: per the contract the node is a `Node<J, _>` made by `TaskRef::new`, gated
        // exactly when its vtable says so, and we own it.
        unsafe {
            if gated {
                take_node::<J, Gated>(p).job
            } else {
                take_node::<J, ()>(p).job
            }
        }
    }

    /// Frees the node without running it, resolving its handle `Panicked` with `payload`: user
    /// code on the task's way to running (its key's `Hash`, `Eq` or `Clone`) panicked.
    pub(crate) fn fail(self, payload: Payload) {
        let p = self.into_raw();
        // SAFETY: as in `run`.
        unsafe { (p.as_ref().vtable.fail)(p, payload) }
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

unsafe fn run_node<J: Job, X: Extra>(
    p: NonNull<Header>,
    permit: Option<Permit>,
    done: &dyn Fn(bool),
) -> bool {
    // SAFETY: `p` is the header of a `Node<J, X>` made by `TaskRef::new` (the vtable is per
    // `(J, X)`) and ownership was passed to us.
    let Node { job, mut extra, .. } = unsafe { take_node::<J, X>(p) };
    debug_assert!(
        !matches!(extra.granted(), Some(Some(_))),
        "granted permits are passed in by TaskRef::run"
    );
    user::drop_quietly(extra); // granted permits: as in `Job::run`
    job.run(permit, done)
}

unsafe fn abandon_node<J: Job, X: Extra>(p: NonNull<Header>, why: Abandon) {
    // SAFETY: as in `run_node`.
    let Node { job, extra, .. } = unsafe { take_node::<J, X>(p) };
    user::drop_quietly(extra); // granted permits: as in `Job::run`
    job.abandon(why)
}

/// Moves a node out of its memory and frees the memory.
///
/// # Safety
/// `p` is the header of a live `Node<J, X>` made by [`TaskRef::new`], owned by the caller, and
/// not used again.
unsafe fn take_node<J: Job, X: Extra>(p: NonNull<Header>) -> Node<J, X> {
    let p = p.cast::<Node<J, X>>();
    // SAFETY: per the contract the node is initialised and ours; reading moves it out.
    let node = unsafe { p.as_ptr().read() };
    // SAFETY: `TaskRef::with_extra` got the memory from `nodes::alloc` with this layout; it is
    // uninitialised again after the read above and nobody else refers to it.
    unsafe { nodes::free(p.cast(), Layout::new::<Node<J, X>>()) };
    node
}

unsafe fn fail_node<J: Job, X: Extra>(p: NonNull<Header>, payload: Payload) {
    // SAFETY: as in `run_node`.
    let Node { job, extra, .. } = unsafe { take_node::<J, X>(p) };
    user::drop_quietly(extra); // granted permits: as in `Job::run`
    job.fail(payload)
}

unsafe fn permits_of<J: Job, X: Extra>(p: NonNull<Header>) -> Option<(Semaphore, usize)> {
    // SAFETY: as in `run_node`, but only borrowed.
    unsafe { p.cast::<Node<J, X>>().as_ref() }.extra.permits()
}

unsafe fn granted_of<J: Job, X: Extra>(p: NonNull<Header>) -> Option<NonNull<Option<Permit>>> {
    // SAFETY: as in `run_node`; the caller owns the node exclusively, so a unique borrow of its
    // extra state for the duration of this call is sound.
    let node = unsafe { &mut *p.cast::<Node<J, X>>().as_ptr() };
    node.extra.granted().map(NonNull::from)
}

#[cfg(test)]
mod tests;
