//! Futures as tasks (`submit_async`, `execute_async`): a key's future is polled on the
//! serializer's workers, in the key's order, and while it is pending its key stays owned without
//! holding a worker.
//!
//! # Where a future lives
//!
//! A future task is one reference-counted [`FutureCell`] (a single allocation: the wake state,
//! where its chain lives, the future itself and, for `submit_async`, its handle's state) and a
//! chain node of kind `Future` whose job, an [`AsyncJob`], is a counted reference to the cell.
//! The future never moves: it is polled where it was written and dropped there. Its wakers are
//! counted references to the same cell, so a waker that outlives the task (or the serializer)
//! still points at live memory, and does nothing there (below).
//!
//! A future's item always goes onto its key's chain (`route.rs`), like a permit-gated task's: the
//! chain is what keeps the key owned while the future waits. The chain's owner pops the node and
//! polls the future in place, with the slot `RUNNING` as for any task:
//!
//! - **Ready** (or a panic in `poll`, caught): the handle resolves, the node is freed and the
//!   chain goes on with its next task.
//! - **Pending**: the worker puts the same node back at the chain's head (`unpop`), records the
//!   cell's wake state in the key's entry ([`KeyState::parked_future`], for `shutdown_now`) and
//!   parks the chain with [`WakeState::try_park`]: it stays `ACTIVE`, on no ready queue, so
//!   nothing else of the key starts and later submits queue behind. From the park on, the
//!   worker never touches the chain or the cell again; the chain's baton passes to a waker.
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
//! | `-> DONE` (store) | the owner at completion, or the owner that cancels the future |
//!
//! Every access that a waker and the owner race on is an RMW on the word (a wake that changes
//! nothing still CASes the value it read), so they are totally ordered, and each wake either
//! lands during the poll (the owner sees `NOTIFIED` and polls again) or after the park (the waker
//! moves `PARKED -> WAKING` and reschedules). Exactly one party goes on with the future: no wake
//! is lost, and the chain is never scheduled twice, so the future is never polled by two threads
//! at once. A wake that finds a poll coming changes nothing, and that poll's CAS comes after the
//! wake's RMW, so it sees what the waker did before waking (a plain store and a load would be a
//! store-then-load race and a lost wakeup). `WAKING` is never overwritten but by its waker, so a
//! second waker cannot take the park again before the first one's chain is on the queue, and
//! `shutdown_now` never sees the chain neither parked nor queued. A wake in `DONE` does nothing.
//! Loom: `loom/tests/future.rs`.
//!
//! # What a waker may touch, and why it is there
//!
//! The cell holds the serializer's shared state (a strong reference, taken at the first poll)
//! and the key's entry. Only the waker that won `PARKED -> WAKING` reads them: the entry is alive
//! because the chain is `ACTIVE` (never retired while its head future is unfinished), the shared
//! state because the cell (which the waker's own reference keeps) holds it. Both are written once,
//! by the first poll's owner, before any waker exists. The future, its output and the handle's
//! state are touched only by the holder of the node's [`AsyncJob`] (the chain's owner, or the
//! user's `PendingTask`), which is unique: no waker ever reaches them.
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
use crate::sync::{AtomicU8, Ordering};
use crate::task::{Abandon, Job};
use crate::user::{self, Payload};

const NEW: u8 = 0;
const RUNNABLE: u8 = 1;
const POLLING: u8 = 2;
const NOTIFIED: u8 = 3;
const PARKED: u8 = 4;
const WAKING: u8 = 5;
const DONE: u8 = 6;

/// A future's wake state (see the module docs): the word its wakers, its chain's owner and
/// `shutdown_now` race on.
#[derive(Debug)]
pub struct WakeState(AtomicU8);

impl Default for WakeState {
    fn default() -> Self {
        WakeState::new()
    }
}

impl WakeState {
    /// `NEW`.
    pub fn new() -> WakeState {
        WakeState(AtomicU8::new(NEW))
    }

    /// Whether the future was ever polled by a worker (exact for the holder of its job).
    pub fn started(&self) -> bool {
        self.0.load(Ordering::Acquire) != NEW
    }

    /// The chain's owner is about to poll (`NEW`, `RUNNABLE` or `NOTIFIED` -> `POLLING`): an RMW,
    /// so that a wake that found a poll coming (its no-op RMW) is ordered before it and what that
    /// waker did before waking is seen by this poll. Waits while a waker is between its push and
    /// its mark (`WAKING`).
    pub fn begin_poll(&self) {
        let backoff = crossbeam_utils::Backoff::new();
        let mut s = self.0.load(Ordering::Acquire);
        loop {
            if s == WAKING {
                crate::sync::snooze(&backoff);
                s = self.0.load(Ordering::Acquire);
                continue;
            }
            debug_assert!(
                matches!(s, NEW | RUNNABLE | NOTIFIED),
                "polled in state {s}"
            );
            match self
                .0
                .compare_exchange(s, POLLING, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => s = actual,
            }
        }
    }

    /// The owner got `Pending` and put the future back on its chain: `POLLING -> PARKED`.
    /// `false`: a wake came during the poll (`NOTIFIED`); the owner still owns the chain and
    /// polls again. After `true` the caller must not touch the chain or the future.
    #[must_use = "on `false` the future must be polled again"]
    pub fn try_park(&self) -> bool {
        self.0
            .compare_exchange(POLLING, PARKED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// A wake: `true` if this wake took the park (`PARKED -> WAKING`): the caller must put the
    /// chain on a ready queue and then call [`scheduled`](Self::scheduled), running no user code
    /// in between. `false`: nothing to do (a poll is running or coming, or the future is done).
    #[must_use = "on `true` the caller must reschedule the chain"]
    pub fn wake(&self) -> bool {
        let mut s = self.0.load(Ordering::Acquire);
        loop {
            let to = match s {
                POLLING => NOTIFIED,
                PARKED => WAKING,
                // A poll is coming: still an RMW (of the same value), so it is ordered with
                // that poll's `begin_poll` CAS (no store-then-load race between the waker's
                // event and the poller's look at it).
                // (`NEW` too: no waker exists before the first poll, but a wake there is one
                // of a poll coming, like `RUNNABLE`.)
                NEW | RUNNABLE | NOTIFIED | WAKING => s,
                _ => return false, // DONE
            };
            match self
                .0
                .compare_exchange(s, to, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return s == PARKED,
                Err(actual) => s = actual,
            }
        }
    }

    /// `WAKING -> RUNNABLE`, by the waker that took the park, once the chain is on a ready
    /// queue: a release, so whoever sees `RUNNABLE` (`shutdown_now`) finds the chain there.
    pub fn scheduled(&self) {
        let prev = self.0.swap(RUNNABLE, Ordering::AcqRel);
        debug_assert_eq!(prev, WAKING, "only the park's waker marks it scheduled");
    }

    /// `shutdown_now`'s CAS `PARKED -> DONE`: `true` if it took the parked chain's baton (the
    /// future will never be polled again). `false` if the future is not parked: a waker took
    /// the park (waited for until the chain is on the global queue), or it is queued, being
    /// polled, or done.
    pub fn steal(&self) -> bool {
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            match self
                .0
                .compare_exchange(PARKED, DONE, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(WAKING) => crate::sync::snooze(&backoff),
                Err(_) => return false,
            }
        }
    }

    /// Completed or cancelled: later wakes do nothing.
    pub fn finish(&self) {
        self.0.store(DONE, Ordering::Release);
    }
}

/// Where a started future's winning waker puts its chain back: the serializer and the key's
/// entry (see "What a waker may touch").
struct Home<K> {
    shared: Arc<Shared<K>>,
    entry: NonNull<KeyEntry<K>>,
}

/// One future task: its wake state, its home once started, the future (in place, dropped in
/// place) and the handle's state (`None`: `execute_async`, no handle).
pub(crate) struct FutureCell<Fut: Future, K> {
    state: WakeState,
    /// Written once by the first poll's owner, before any waker exists; read by the waker that
    /// took a park.
    home: UnsafeCell<Option<Home<K>>>,
    /// Whether `fut` holds a live future. Touched only by the job's holder.
    live: UnsafeCell<bool>,
    fut: UnsafeCell<MaybeUninit<Fut>>,
    join: Option<crate::sync::Arc<JoinState<Fut::Output>>>,
}

// SAFETY: the future (`Send`), its liveness flag and the handle's state are touched only by the
// unique holder of the job (module docs: "What a waker may touch"), never by two threads at once;
// `home` is written once before any other thread can reach the cell and read-only afterwards,
// and the shared state and entries are `Sync`; the wake state is atomic.
unsafe impl<Fut: Future + Send, K: Send + Sync> Send for FutureCell<Fut, K> where Fut::Output: Send {}
// SAFETY: as above.
unsafe impl<Fut: Future + Send, K: Send + Sync> Sync for FutureCell<Fut, K> where Fut::Output: Send {}

impl<Fut: Future, K> Drop for FutureCell<Fut, K> {
    fn drop(&mut self) {
        if *self.live.get_mut() {
            // Never polled to the end nor cancelled (a job is always finished or abandoned, so
            // this is only a leak-proofing path): drop it in place.
            // SAFETY: `live` says the future is initialised; `&mut self` is exclusive.
            unsafe { self.fut.get_mut().assume_init_drop() };
        }
    }
}

/// Polls a cell's future once with the waker given, reporting completion to the hook.
type PollFn = unsafe fn(*const (), &Waker, &dyn Fn(bool)) -> Poll<bool>;

/// What the type-erased side of a cell can do (one table per future type).
struct CellVTable<K> {
    /// # Safety (all but `waker`)
    /// The pointer is a live cell of this table's type; for `poll`, `cancel`, `fail` and
    /// `set_home` the caller holds the cell's job.
    poll: PollFn,
    cancel: unsafe fn(*const (), Abandon),
    fail: unsafe fn(*const (), Payload),
    set_home: unsafe fn(*const (), Home<K>),
    state: unsafe fn(*const ()) -> *const WakeState,
    /// Releases one counted reference.
    release: unsafe fn(*const ()),
    waker: &'static RawWakerVTable,
}

struct VTableOf<Fut, K>(std::marker::PhantomData<(Fut, K)>);

impl<Fut, K> VTableOf<Fut, K>
where
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    const CELL: CellVTable<K> = CellVTable {
        poll: poll_cell::<Fut, K>,
        cancel: cancel_cell::<Fut, K>,
        fail: fail_cell::<Fut, K>,
        set_home: set_home::<Fut, K>,
        state: state_of::<Fut, K>,
        release: release::<Fut, K>,
        waker: &Self::WAKER,
    };

    const WAKER: RawWakerVTable = RawWakerVTable::new(
        waker_clone::<Fut, K>,
        waker_wake::<Fut, K>,
        waker_wake_by_ref::<Fut, K>,
        waker_drop::<Fut, K>,
    );
}

/// The cell behind `p`.
///
/// # Safety
/// `p` came from `Arc::into_raw` of an `Arc<FutureCell<Fut, K>>` and a counted reference is held.
unsafe fn cell<'a, Fut: Future, K>(p: *const ()) -> &'a FutureCell<Fut, K> {
    // SAFETY: per the contract.
    unsafe { &*p.cast::<FutureCell<Fut, K>>() }
}

/// Ends the future in place (its `Drop` is user code: caught) and marks it gone.
///
/// # Safety
/// The caller holds the cell's job.
unsafe fn drop_future<Fut: Future, K>(c: &FutureCell<Fut, K>) {
    // SAFETY: the job's holder alone touches `live` and `fut`.
    unsafe {
        if !std::mem::replace(&mut *c.live.get(), false) {
            return;
        }
        let fut = (*c.fut.get()).as_mut_ptr();
        user::call_quietly(|| std::ptr::drop_in_place(fut));
    }
}

unsafe fn poll_cell<Fut, K>(p: *const (), waker: &Waker, done: &dyn Fn(bool)) -> Poll<bool>
where
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    // SAFETY: per the table's contract.
    let c = unsafe { cell::<Fut, K>(p) };
    // SAFETY: the job's holder alone touches `live` and `fut`.
    if !unsafe { *c.live.get() } {
        return Poll::Ready(false); // done already (never polled again by the protocol)
    }
    // SAFETY: the future is live, lives in the cell's allocation (which never moves) and is
    // dropped there: pinned for its whole life. The job's holder alone touches it.
    let fut = unsafe { Pin::new_unchecked((*c.fut.get()).assume_init_mut()) };
    // The future's `poll` is user code: caught.
    let result = match user::catch(|| fut.poll(&mut Context::from_waker(waker))) {
        Ok(Poll::Pending) => return Poll::Pending,
        Ok(Poll::Ready(v)) => Ok(v),
        Err(p) => Err(TaskError::Panicked(PanicPayload::new(p))),
    };
    // The finished future's `Drop` is user code too.
    // SAFETY: we hold the job.
    unsafe { drop_future(c) };
    let panicked = result.is_err();
    done(panicked);
    match &c.join {
        Some(join) => join.complete(result),
        // `execute_async`: no handle; a panic was counted by `done`, its payload is dropped
        // (and the output, `()`, is nothing).
        None => {
            if let Err(TaskError::Panicked(payload)) = result {
                user::drop_quietly(payload);
            }
        }
    }
    Poll::Ready(panicked)
}

unsafe fn cancel_cell<Fut: Future, K>(p: *const (), why: Abandon) {
    // SAFETY: per the table's contract.
    let c = unsafe { cell::<Fut, K>(p) };
    // SAFETY: we hold the job.
    unsafe { drop_future(c) };
    if let Some(join) = &c.join {
        join.complete(Err(match why {
            Abandon::Cancelled => TaskError::Cancelled,
            Abandon::Superseded => TaskError::Superseded,
        }));
    }
}

unsafe fn fail_cell<Fut: Future, K>(p: *const (), payload: Payload) {
    // SAFETY: per the table's contract.
    let c = unsafe { cell::<Fut, K>(p) };
    // SAFETY: we hold the job.
    unsafe { drop_future(c) };
    match &c.join {
        Some(join) => join.complete(Err(TaskError::Panicked(PanicPayload::new(payload)))),
        None => user::drop_payload(payload),
    }
}

unsafe fn set_home<Fut: Future, K>(p: *const (), home: Home<K>) {
    // SAFETY: per the table's contract.
    let c = unsafe { cell::<Fut, K>(p) };
    // SAFETY: the first poll's owner writes it before any waker exists (module docs).
    unsafe { *c.home.get() = Some(home) };
}

unsafe fn state_of<Fut: Future, K>(p: *const ()) -> *const WakeState {
    // SAFETY: per the table's contract.
    &unsafe { cell::<Fut, K>(p) }.state
}

unsafe fn release<Fut: Future, K>(p: *const ()) {
    // SAFETY: per the table's contract: we give up the counted reference we held. The last one
    // frees the cell, dropping the shared state's reference (perhaps the serializer's last).
    drop(unsafe { Arc::from_raw(p.cast::<FutureCell<Fut, K>>()) });
}

/// A wake of the cell behind `p` (see "The wake state").
///
/// # Safety
/// As for [`cell`].
unsafe fn wake_cell<Fut: Future, K>(p: *const ())
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: per the contract.
    let c = unsafe { cell::<Fut, K>(p) };
    if !c.state.wake() {
        return;
    }
    // This wake took the park: it holds the chain's baton. `home` was written before the first
    // park (whose Release the wake's CAS acquired) and is never written again.
    // SAFETY: as above.
    let Some(home) = (unsafe { &*c.home.get() }) else {
        debug_assert!(false, "a parked future has a home");
        return;
    };
    home.shared.global().push(Runnable::Chain(home.entry));
    c.state.scheduled();
    // The chain is on the queue: wake a worker for it. The shared state is ours through the
    // cell's reference, whatever happens to the chain from here.
    home.shared.notify();
}

unsafe fn waker_clone<Fut, K>(p: *const ()) -> RawWaker
where
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: a waker holds a counted reference from `Arc::into_raw` (or borrows the job's).
    unsafe { Arc::increment_strong_count(p.cast::<FutureCell<Fut, K>>()) };
    RawWaker::new(p, VTableOf::<Fut, K>::CELL.waker)
}

unsafe fn waker_wake<Fut, K>(p: *const ())
where
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: the waker's own counted reference, given up after the wake.
    unsafe {
        wake_cell::<Fut, K>(p);
        release::<Fut, K>(p);
    }
}

unsafe fn waker_wake_by_ref<Fut, K>(p: *const ())
where
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: the waker holds a counted reference.
    unsafe { wake_cell::<Fut, K>(p) };
}

unsafe fn waker_drop<Fut, K>(p: *const ())
where
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    // SAFETY: the waker's own counted reference.
    unsafe { release::<Fut, K>(p) };
}

/// A future task's job (the node of a `submit_async` or `execute_async`): a counted reference
/// to its cell. Its holder alone may poll, cancel or fail the future.
pub(crate) struct AsyncJob<K: 'static> {
    cell: NonNull<()>,
    vtable: &'static CellVTable<K>,
}

// SAFETY: the cell is `Send + Sync` for the future types `AsyncJob::new` accepts.
unsafe impl<K: Send + Sync> Send for AsyncJob<K> {}

impl<K> AsyncJob<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// The job of `fut`, whose outcome goes to `join` (`None`: no handle, for `execute_async`,
    /// where a panic is counted and its payload dropped).
    pub(crate) fn new<Fut>(fut: Fut, join: Option<crate::sync::Arc<JoinState<Fut::Output>>>) -> Self
    where
        Fut: Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        let cell = Arc::new(FutureCell::<Fut, K> {
            state: WakeState::new(),
            home: UnsafeCell::new(None),
            live: UnsafeCell::new(true),
            fut: UnsafeCell::new(MaybeUninit::new(fut)),
            join,
        });
        let p = Arc::into_raw(cell).cast_mut().cast::<()>();
        AsyncJob {
            // SAFETY: `Arc::into_raw` never returns null.
            cell: unsafe { NonNull::new_unchecked(p) },
            vtable: &VTableOf::<Fut, K>::CELL,
        }
    }

    /// The future's wake state.
    pub(crate) fn state(&self) -> &WakeState {
        // SAFETY: we hold a counted reference, so the cell (and its state) lives as long as we do.
        unsafe { &*(self.vtable.state)(self.cell.as_ptr()) }
    }

    /// Whether a worker ever polled the future.
    pub(crate) fn started(&self) -> bool {
        self.state().started()
    }

    /// The first poll's owner, before that poll: where a winning waker puts the chain back.
    pub(crate) fn set_home(&self, shared: &Arc<Shared<K>>, entry: NonNull<KeyEntry<K>>) {
        debug_assert!(!self.started());
        let home = Home {
            shared: shared.clone(),
            entry,
        };
        // SAFETY: we hold the job, and no waker exists before the first poll.
        unsafe { (self.vtable.set_home)(self.cell.as_ptr(), home) };
    }

    /// Polls the future once with the cell's own waker (a worker, holding the chain). `Ready`
    /// once it is done (`done(panicked)` ran and the handle resolved).
    pub(crate) fn poll_here(&self, done: &dyn Fn(bool)) -> Poll<bool> {
        // A waker borrowing the job's counted reference: never dropped, so it gives nothing back.
        // SAFETY: the vtable's functions match the cell's type and keep the reference counts.
        let waker = ManuallyDrop::new(unsafe {
            Waker::from_raw(RawWaker::new(self.cell.as_ptr(), self.vtable.waker))
        });
        self.poll_with(&waker, done)
    }

    fn poll_with(&self, waker: &Waker, done: &dyn Fn(bool)) -> Poll<bool> {
        // SAFETY: we hold the job, and the table matches the cell.
        unsafe { (self.vtable.poll)(self.cell.as_ptr(), waker, done) }
    }
}

impl<K: 'static> Drop for AsyncJob<K> {
    fn drop(&mut self) {
        let (p, release) = (self.cell.as_ptr(), self.vtable.release);
        // Freeing the cell may drop the serializer's shared state (the last reference), whose
        // `Drop` drops what is left in it: user code, caught.
        // SAFETY: we give up the counted reference the job held.
        user::call_quietly(|| unsafe { release(p) });
    }
}

impl<K> Job for AsyncJob<K>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Drives the future to completion on the calling thread (a handed-back future's
    /// `PendingTask::run`), parking the thread while it is pending.
    fn run(self, permit: Option<Permit>, done: &dyn Fn(bool)) -> bool {
        user::drop_quietly(permit);
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let panicked = loop {
            match self.poll_with(&waker, done) {
                Poll::Ready(panicked) => break panicked,
                Poll::Pending => std::thread::park(),
            }
        };
        self.state().finish();
        panicked
    }

    fn abandon(self, why: Abandon) {
        // SAFETY: we hold the job.
        unsafe { (self.vtable.cancel)(self.cell.as_ptr(), why) };
        self.state().finish();
    }

    fn fail(self, payload: Payload) {
        // SAFETY: we hold the job.
        unsafe { (self.vtable.fail)(self.cell.as_ptr(), payload) };
        self.state().finish();
    }
}

/// Unparks the thread that drives a handed-back future.
struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}
