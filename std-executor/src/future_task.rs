//! Futures as tasks (`submit_async`, `execute_async`): a key's future is polled on the
//! serializer's workers, in the key's order, and while it is pending its key stays owned without
//! holding a worker.
//!
//! # Where a future lives
//!
//! A future task is one allocation, a [`FutureHead`] followed by the future and, for
//! `submit_async`, its handle's state: the head is a chain node (a task `Header` of kind
//! `Future`, with its own task table, `VTable::managed`), a count of references, the wake state,
//! the future type's table and, once started, where its chain lives. The references are the
//! job's (held by whoever owns the node as a `TaskRef`: the submitter, a lane, the chain, a
//! worker, a `PendingTask`) and one per waker; the last one frees the allocation. So the future
//! never moves (it is polled where it was written and dropped there), and a waker that outlives
//! the task (or the serializer) still points at live memory, and does nothing there (below).
//!
//! A future's item always goes onto its key's chain (`route.rs`), like a permit-gated task's: the
//! chain is what keeps the key owned while the future waits. The chain's owner pops the node and
//! polls the future in place, with the slot `RUNNING` as for any task:
//!
//! - **Ready** (or a panic in `poll`, caught): the handle resolves (and the node lets go of the
//!   handle's state), the job's reference is given up (the memory goes with the last waker) and
//!   the chain goes on with its next task.
//! - **Pending**: the worker puts the same node back at the chain's head (`unpop`), records the
//!   node's wake state in the key's entry ([`KeyState::parked_future`], for `shutdown_now`) and
//!   parks the chain with [`WakeState::try_park`]: it stays `ACTIVE`, on no ready queue, so
//!   nothing else of the key starts and later submits queue behind. From the park on, the
//!   worker never touches the chain or the node again; the chain's baton passes to a waker.
//!
//! # The wake state (one word per future, [`WakeState`])
//!
//! ```text
//!  NEW       never polled
//!  POLLING   the chain's owner is polling it
//!  NOTIFIED  woken while POLLING: poll it again
//!  PARKED    pending; its chain is parked, nobody holds its baton but the word
//!  WAKING    a waker took the park and is putting the chain on the global queue
//!  RUNNABLE  the chain is on a ready queue (or with a worker about to poll)
//!  DONE      completed, panicked, cancelled or stolen by shutdown_now (terminal)
//! ```
//!
//! | transition | by |
//! |---|---|
//! | `NEW`/`RUNNABLE`/`NOTIFIED -> POLLING` (CAS) | the chain's owner, before a poll ([`WakeState::begin_poll`]); it waits out `WAKING` (a waker between its push and its mark, a few instructions) |
//! | `NEW`/`RUNNABLE`/`NOTIFIED`/`WAKING` -> itself (CAS) | a waker while a poll is coming: changes nothing, but is an RMW |
//! | `POLLING -> NOTIFIED` (CAS) | a waker during the poll |
//! | `POLLING -> PARKED` (CAS) | the owner after `Pending`, with the node back on the chain ([`WakeState::try_park`]); fails on `NOTIFIED`: the owner still owns the chain and polls again |
//! | `PARKED -> WAKING` (CAS) | a waker ([`WakeState::wake`] returns `true`): it alone holds the baton, pushes the chain onto the global queue, then marks it |
//! | `WAKING -> RUNNABLE` (swap) | that waker, once the chain is on the queue ([`WakeState::scheduled`]) |
//! | `PARKED -> DONE` (CAS) | `shutdown_now` ([`WakeState::steal`]): it holds the baton, drains the chain and cancels the future; it waits out `WAKING`, after which the chain is on the global queue, which it drains later |
//! | `-> DONE` (CAS, waiting out `WAKING`) | the owner at completion, or the holder of the job that cancels the future ([`WakeState::finish`]) |
//!
//! Every access that a waker and the owner race on is an RMW on the word (a wake that changes
//! nothing still CASes the value it read), so they are totally ordered, and each wake either
//! lands during the poll (the owner sees `NOTIFIED` and polls again) or after the park (the waker
//! moves `PARKED -> WAKING` and reschedules). Exactly one party goes on with the future: no wake
//! is lost, and the chain is never scheduled twice, so the future is never polled by two threads
//! at once. A wake that finds a poll coming changes nothing, and that poll's CAS comes after the
//! wake's RMW, so it sees what the waker did before waking (a plain store and a load would be a
//! store-then-load race and a lost wakeup). `WAKING` is never overwritten but by its waker (`begin_poll`, `steal` and `finish` wait it
//! out), so a second waker cannot take the park again before the first one's chain is on the queue, and
//! `shutdown_now` never sees the chain neither parked nor queued. A wake in `DONE` does nothing.
//! Loom: `loom/tests/future.rs`.
//!
//! # What a waker may touch, and why it is there
//!
//! The head's home holds the serializer's shared state (a strong reference, taken at the first
//! poll) and the key's entry. Only the waker that won `PARKED -> WAKING` reads them: the entry is
//! alive because the chain is `ACTIVE` (never retired while its head future is unfinished), the
//! shared state because the node (which the waker's own reference keeps) holds it. Both are
//! written once, by the first poll's owner, before any waker exists. The future, its output and
//! the handle's state are touched only by the holder of the job (the chain's owner, or the user's
//! `PendingTask`), which is unique: no waker ever reaches them.
//!
//! # Shutdown
//!
//! `shutdown` lets started futures finish: a pending future counts as a running task, so the
//! workers stay until it completes. `shutdown_now` first stops every worker (after which no
//! chain is parked or polled anew: parking happens while the worker is `BUSY`, which the stop
//! waits out); then it walks the key table for entries whose [`KeyState::parked_future`] is set
//! (a future parked since its last poll, whose node is still on the chain) and steals each
//! with [`WakeState::steal`]: the started future is cancelled (its handle resolves `Cancelled`)
//! and the tasks behind it are handed back. A future not yet polled is handed back as a
//! [`PendingTask`](crate::PendingTask), whose `run` drives it to completion on the calling thread.
//!
//! [`KeyState::parked_future`]: crate::key::KeyState::parked_future

use std::alloc::Layout;
use std::cell::UnsafeCell;
use std::future::Future;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};

use crate::error::{PanicPayload, TaskError};
use crate::handle::JoinState;
use crate::key::{KeyEntry, Runnable};
use crate::semaphore::Permit;
use crate::shared::Shared;
use crate::sync::{AtomicUsize, Ordering};
use crate::task::{Abandon, Header, Kind, TaskRef, VTable};
use crate::user::{self, Payload};
use crate::wake_state::WakeState;

/// Where a started future's winning waker puts its chain back: the serializer and the key's
/// entry (see "What a waker may touch").
struct Home<K> {
    shared: Arc<Shared<K>>,
    entry: NonNull<KeyEntry<K>>,
}

/// The front of every future node, whatever its future's type: the task header (so the node
/// is a chain node), the count of references (the job's, while it lasts, and one per waker), the
/// wake state, the future type's table and the home once started. `repr(C)`, and the first
/// field of [`FutureNode`], so a node's pointer is a pointer to its head.
#[repr(C)]
pub(crate) struct FutureHead<K: 'static> {
    header: Header,
    refs: AtomicUsize,
    state: WakeState,
    cell: &'static CellVTable<K>,
    /// Written once by the first poll's owner, before any waker exists; read by the waker that
    /// took a park.
    home: UnsafeCell<Option<Home<K>>>,
}

/// One future task in one allocation: its head, the future (in place, dropped in place) and the
/// handle's state (`None`: `execute_async`, no handle).
#[repr(C)]
struct FutureNode<Fut: Future, K: 'static> {
    head: FutureHead<K>,
    /// Whether `fut` holds a live future. Touched only by the job's holder.
    live: UnsafeCell<bool>,
    fut: UnsafeCell<MaybeUninit<Fut>>,
    /// Taken (and the reference dropped) when the job ends, so that neither the handle's state
    /// nor an output nobody joins outlives the task while a waker keeps the node. Touched only
    /// by the job's holder.
    join: UnsafeCell<Option<crate::sync::Arc<JoinState<Fut::Output>>>>,
}

impl<Fut: Future, K: 'static> Drop for FutureNode<Fut, K> {
    fn drop(&mut self) {
        if *self.live.get_mut() {
            // Never polled to the end nor cancelled (every job ends in `run`, `abandon` or
            // `fail`, so this only guards against a leak): drop it in place.
            // SAFETY: `live` says the future is initialised; `&mut self` is exclusive.
            unsafe { self.fut.get_mut().assume_init_drop() };
        }
    }
}

/// Polls a node's future once with the waker given, reporting completion to the hook.
type PollFn<K> = unsafe fn(NonNull<FutureHead<K>>, &Waker, &dyn Fn(bool)) -> Poll<bool>;

/// What depends on the future's type (one table per type).
///
/// # Safety (every entry)
/// The pointer is a live node of this table's future type; for `poll`, `cancel` and `fail` the
/// caller holds the node's job; for `dealloc` the last reference was just given up.
struct CellVTable<K: 'static> {
    poll: PollFn<K>,
    cancel: unsafe fn(NonNull<FutureHead<K>>, Abandon),
    fail: unsafe fn(NonNull<FutureHead<K>>, Payload),
    dealloc: unsafe fn(NonNull<FutureHead<K>>),
}

struct CellOf<Fut, K>(std::marker::PhantomData<(Fut, K)>);

impl<Fut, K> CellOf<Fut, K>
where
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    const CELL: CellVTable<K> = CellVTable {
        poll: poll_node::<Fut, K>,
        cancel: cancel_node::<Fut, K>,
        fail: fail_node::<Fut, K>,
        dealloc: dealloc_node::<Fut, K>,
    };
}

/// The node behind a head.
///
/// # Safety
/// `p` is the head of a live `FutureNode<Fut, K>`.
unsafe fn node<'a, Fut: Future, K>(p: NonNull<FutureHead<K>>) -> &'a FutureNode<Fut, K> {
    // SAFETY: per the contract; the head is the node's first field (`repr(C)`).
    unsafe { p.cast::<FutureNode<Fut, K>>().as_ref() }
}

/// Ends the future in place (its `Drop` is user code: caught) and marks it gone.
///
/// # Safety
/// The caller holds the node's job.
unsafe fn drop_future<Fut: Future, K>(n: &FutureNode<Fut, K>) {
    // SAFETY: the job's holder alone touches `live` and `fut`.
    unsafe {
        if !std::mem::replace(&mut *n.live.get(), false) {
            return;
        }
        let fut = (*n.fut.get()).as_mut_ptr();
        user::call_quietly(|| std::ptr::drop_in_place(fut));
    }
}

unsafe fn poll_node<Fut, K>(
    p: NonNull<FutureHead<K>>,
    waker: &Waker,
    done: &dyn Fn(bool),
) -> Poll<bool>
where
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    // SAFETY: per the table's contract.
    let n = unsafe { node::<Fut, K>(p) };
    // SAFETY: the job's holder alone touches `live` and `fut`.
    if !unsafe { *n.live.get() } {
        return Poll::Ready(false); // done already (never polled again by the protocol)
    }
    // SAFETY: the future is live, lives in the node's memory (which never moves) and is dropped
    // there: pinned for its whole life. The job's holder alone touches it.
    let fut = unsafe { Pin::new_unchecked((*n.fut.get()).assume_init_mut()) };
    // The future's `poll` is user code: caught.
    let result = match user::catch(|| fut.poll(&mut Context::from_waker(waker))) {
        Ok(Poll::Pending) => return Poll::Pending,
        Ok(Poll::Ready(v)) => Ok(v),
        Err(p) => Err(TaskError::Panicked(PanicPayload::new(p))),
    };
    // The finished future's `Drop` is user code too.
    // SAFETY: we hold the job.
    unsafe { drop_future(n) };
    let panicked = result.is_err();
    done(panicked);
    // SAFETY: we hold the job.
    match unsafe { (*n.join.get()).take() } {
        Some(join) => {
            join.complete(result);
            // With the handle gone, this drops the output (or the payload): user code.
            user::drop_quietly(join);
        }
        // `execute_async`: no handle; a panic was counted by `done`; what is left (the
        // payload, or the output) is dropped here, quietly.
        None => user::drop_quietly(result),
    }
    Poll::Ready(panicked)
}

unsafe fn cancel_node<Fut: Future, K>(p: NonNull<FutureHead<K>>, why: Abandon) {
    // SAFETY: per the table's contract.
    let n = unsafe { node::<Fut, K>(p) };
    // SAFETY: we hold the job.
    unsafe { drop_future(n) };
    // SAFETY: we hold the job.
    if let Some(join) = unsafe { (*n.join.get()).take() } {
        join.complete(Err(match why {
            Abandon::Cancelled => TaskError::Cancelled,
            Abandon::Superseded => TaskError::Superseded,
        }));
        user::drop_quietly(join);
    }
}

unsafe fn fail_node<Fut: Future, K>(p: NonNull<FutureHead<K>>, payload: Payload) {
    // SAFETY: per the table's contract.
    let n = unsafe { node::<Fut, K>(p) };
    // SAFETY: we hold the job.
    unsafe { drop_future(n) };
    // SAFETY: we hold the job.
    match unsafe { (*n.join.get()).take() } {
        Some(join) => {
            join.complete(Err(TaskError::Panicked(PanicPayload::new(payload))));
            user::drop_quietly(join);
        }
        None => user::drop_payload(payload),
    }
}

unsafe fn dealloc_node<Fut: Future, K>(p: NonNull<FutureHead<K>>) {
    let n = p.cast::<FutureNode<Fut, K>>();
    // A panic in a field's `Drop` (the shared state's, perhaps the serializer's last reference)
    // still lets the other fields drop, and the memory is freed all the same.
    // SAFETY: per the table's contract nobody refers to the node any more: drop what it still
    // holds (the home's shared state; a live future or the handle's state, never).
    let dropped = user::catch(|| unsafe { std::ptr::drop_in_place(n.as_ptr()) });
    // SAFETY: as above; `make` allocated it with this layout.
    unsafe { std::alloc::dealloc(n.as_ptr().cast(), Layout::new::<FutureNode<Fut, K>>()) };
    if let Err(payload) = dropped {
        user::drop_payload(payload);
    }
}

/// The head of a future node owned by `task`, reached through the task's own pointer, not
/// through a reference (so a waker made from it, which may free the node, does not carry a
/// shared borrow's permissions; chains keep node pointers as integers, so this is the
/// provenance the node's last push exposed).
///
/// # Safety
/// `task` is of kind `Future` (made by [`make`] with this `K`).
pub(crate) unsafe fn head_of<K>(task: &TaskRef) -> FutureRef<'_, K> {
    debug_assert_eq!(task.kind(), Kind::Future);
    FutureRef {
        // The header is the head's first field (`repr(C)`).
        p: task.as_ptr().cast(),
        _task: std::marker::PhantomData,
    }
}

/// A future node borrowed from the `TaskRef` that holds its job.
pub(crate) struct FutureRef<'a, K: 'static> {
    p: NonNull<FutureHead<K>>,
    _task: std::marker::PhantomData<&'a TaskRef>,
}

/// A future task's node: `fut`, whose outcome goes to `join` (`None`: no handle, for
/// `execute_async`, where a panic is counted and its payload dropped).
pub(crate) fn make<Fut, K>(
    fut: Fut,
    join: Option<crate::sync::Arc<JoinState<Fut::Output>>>,
) -> TaskRef
where
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // From the global allocator, not `nodes.rs`'s slabs: a future node lives from its submit
    // to its completion (and while wakers hold it), and in W7 slabs pinned by such nodes doubled
    // the peak RSS (411-420 MiB against 212-215 MiB at 100 k keys, same rate within the noise).
    let layout = Layout::new::<FutureNode<Fut, K>>();
    // SAFETY: the layout is not zero-sized (the head alone is not).
    let raw = unsafe { std::alloc::alloc(layout) };
    let Some(p) = NonNull::new(raw.cast::<FutureNode<Fut, K>>()) else {
        std::alloc::handle_alloc_error(layout)
    };
    // SAFETY: `p` is fresh memory with the node's size and alignment.
    unsafe {
        p.as_ptr().write(FutureNode {
            head: FutureHead {
                header: Header::new(&TaskOf::<K>::TASK, Kind::Future),
                refs: AtomicUsize::new(1), // the job's
                state: WakeState::new(),
                cell: &CellOf::<Fut, K>::CELL,
                home: UnsafeCell::new(None),
            },
            live: UnsafeCell::new(true),
            fut: UnsafeCell::new(MaybeUninit::new(fut)),
            join: UnsafeCell::new(join),
        })
    };
    // SAFETY: a new node, ours alone; its table (`TaskOf`) ends the job and gives the node up.
    unsafe { TaskRef::from_raw(p.cast()) }
}

impl<K> FutureRef<'_, K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    fn head(&self) -> &FutureHead<K> {
        // SAFETY: the borrowed `TaskRef` holds the job's reference: the node is alive.
        unsafe { self.p.as_ref() }
    }

    /// The future's wake state.
    pub(crate) fn state(&self) -> &WakeState {
        &self.head().state
    }

    /// Whether a worker ever polled the future.
    pub(crate) fn started(&self) -> bool {
        self.state().started()
    }

    /// The first poll's owner, holding the job, before that poll: where a winning waker puts
    /// the chain back.
    pub(crate) fn set_home(&self, shared: &Arc<Shared<K>>, entry: NonNull<KeyEntry<K>>) {
        debug_assert!(!self.started());
        let home = Home {
            shared: shared.clone(),
            entry,
        };
        // SAFETY: the job's holder writes it before the first poll, before any waker exists
        // (module docs, "What a waker may touch").
        unsafe { *self.head().home.get() = Some(home) };
    }

    /// Polls the future once with the node's own waker (a worker holding the job and the
    /// chain). `Ready` once it is done (`done(panicked)` ran and the handle resolved).
    pub(crate) fn poll_here(&self, done: &dyn Fn(bool)) -> Poll<bool> {
        // A waker borrowing the job's reference: never dropped, so it gives nothing back.
        // SAFETY: the waker table matches the node and keeps the reference count.
        let waker = ManuallyDrop::new(unsafe {
            Waker::from_raw(RawWaker::new(self.p.as_ptr().cast(), &WakerOf::<K>::WAKER))
        });
        // SAFETY: we borrow the job's holder.
        unsafe { poll_with(self.p, &waker, done) }
    }
}

/// Polls the future of the node behind `p` once with `waker`.
///
/// # Safety
/// The caller holds the node's job.
unsafe fn poll_with<K>(
    p: NonNull<FutureHead<K>>,
    waker: &Waker,
    done: &dyn Fn(bool),
) -> Poll<bool> {
    // SAFETY: per the contract the node is alive, and its table matches it.
    unsafe { (p.as_ref().cell.poll)(p, waker, done) }
}

/// Gives up one reference to the node behind `p`; the last one frees it (dropping the home's
/// shared state: perhaps the serializer's last reference, whose `Drop` is user code, caught).
///
/// # Safety
/// `p` is a live future node's head and the caller holds one of its references.
unsafe fn release<K: 'static>(p: NonNull<FutureHead<K>>) {
    // SAFETY: per the contract the node is alive while we hold our reference.
    let head = unsafe { p.as_ref() };
    // As `Arc`: a release decrement, and the last one acquires every other's before freeing.
    if head.refs.fetch_sub(1, Ordering::Release) != 1 {
        return;
    }
    crate::sync::fence(Ordering::Acquire);
    let dealloc = head.cell.dealloc;
    // SAFETY: ours was the last reference.
    user::call_quietly(|| unsafe { dealloc(p) });
}

/// The task table of every future node of key type `K` (`TaskRef` side).
struct TaskOf<K>(std::marker::PhantomData<K>);

impl<K> TaskOf<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    const TASK: VTable = VTable::managed(run_task::<K>, abandon_task::<K>, fail_task::<K>);
}

/// `PendingTask::run` of a handed-back future: drives it to completion on the calling thread,
/// parking the thread while it is pending.
unsafe fn run_task<K>(p: NonNull<Header>, permit: Option<Permit>, done: &dyn Fn(bool)) -> bool
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    user::drop_quietly(permit);
    let p = p.cast::<FutureHead<K>>();
    // SAFETY: the caller passed us the job: the node is alive until we release it.
    let head = unsafe { p.as_ref() };
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let panicked = loop {
        // SAFETY: we hold the job.
        match unsafe { poll_with(p, &waker, done) } {
            Poll::Ready(panicked) => break panicked,
            Poll::Pending => std::thread::park(),
        }
    };
    head.state.finish();
    // SAFETY: the job's reference, given up.
    unsafe { release(p) };
    panicked
}

unsafe fn abandon_task<K>(p: NonNull<Header>, why: Abandon)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let p = p.cast::<FutureHead<K>>();
    // SAFETY: the caller passed us the job: the node is alive until we release it.
    let head = unsafe { p.as_ref() };
    // Done first: a wake from the future's own `Drop` then does nothing.
    head.state.finish();
    // SAFETY: we hold the job.
    unsafe { (head.cell.cancel)(p, why) };
    // SAFETY: the job's reference, given up.
    unsafe { release(p) };
}

unsafe fn fail_task<K>(p: NonNull<Header>, payload: Payload)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let p = p.cast::<FutureHead<K>>();
    // SAFETY: the caller passed us the job: the node is alive until we release it.
    let head = unsafe { p.as_ref() };
    head.state.finish();
    // SAFETY: we hold the job.
    unsafe { (head.cell.fail)(p, payload) };
    // SAFETY: the job's reference, given up.
    unsafe { release(p) };
}

/// Frees the job of a future node whose future completed in a worker's poll (its handle has
/// resolved): the job's reference is given up, nothing else is done.
pub(crate) fn finish_completed<K>(task: TaskRef)
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    debug_assert_eq!(task.kind(), Kind::Future);
    let p = task.into_raw().cast::<FutureHead<K>>();
    // SAFETY: `task` held the job's reference of a future node, given up here.
    unsafe { release(p) };
}

/// The waker table of every future node of key type `K`: a waker is a counted reference to the
/// node.
struct WakerOf<K>(std::marker::PhantomData<K>);

impl<K> WakerOf<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    const WAKER: RawWakerVTable = RawWakerVTable::new(
        waker_clone::<K>,
        waker_wake::<K>,
        waker_wake_by_ref::<K>,
        waker_drop::<K>,
    );
}

/// A wake of the node behind `p` (see "The wake state").
///
/// # Safety
/// `p` is a live future node's head and the caller holds one of its references.
unsafe fn wake_node<K>(p: *const ())
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: per the contract.
    let head = unsafe { &*p.cast::<FutureHead<K>>() };
    if !head.state.wake() {
        return;
    }
    // This wake took the park: it holds the chain's baton. `home` was written before the first
    // park (whose Release the wake's CAS acquired) and is never written again.
    // SAFETY: as above.
    let Some(home) = (unsafe { &*head.home.get() }) else {
        // Unreachable (the first poll's owner sets the home before it can park); if it were
        // not, the future could never be rescheduled: end it, rather than leave `WAKING` for
        // `begin_poll` or `steal` to wait on for ever.
        debug_assert!(false, "a parked future has a home");
        head.state.abandon_wake();
        return;
    };
    home.shared.global().push(Runnable::Chain(home.entry));
    head.state.scheduled();
    // The chain is on the queue: wake a worker for it. The shared state is ours through the
    // node's home, which our reference keeps, whatever happens to the chain from here.
    home.shared.notify();
}

unsafe fn waker_clone<K>(p: *const ()) -> RawWaker
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: a waker (or the job's borrowed one) holds a reference: the node is alive.
    let head = unsafe { &*p.cast::<FutureHead<K>>() };
    // As `Arc`: a relaxed increment (the new reference is made from one we hold), and an abort
    // rather than an overflow.
    if head.refs.fetch_add(1, Ordering::Relaxed) > isize::MAX as usize {
        std::process::abort();
    }
    RawWaker::new(p, &WakerOf::<K>::WAKER)
}

unsafe fn waker_wake<K>(p: *const ())
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: the waker's own reference, given up after the wake.
    unsafe {
        wake_node::<K>(p);
        release::<K>(NonNull::new_unchecked(p.cast_mut()).cast());
    }
}

unsafe fn waker_wake_by_ref<K>(p: *const ())
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: the waker holds a reference.
    unsafe { wake_node::<K>(p) };
}

unsafe fn waker_drop<K>(p: *const ())
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: the waker's own reference, given up.
    unsafe { release::<K>(NonNull::new_unchecked(p.cast_mut()).cast()) };
}

/// Unparks the thread that drives a handed-back future.
struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}
