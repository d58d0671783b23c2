//! `Serializer::reserve` and [`Reservation`]: room under `capacity` and `max_keys` awaited
//! without a thread, then used by a submission that never blocks (DESIGN 3.1c).
//!
//! The room is the same the blocking path takes, on the same accounting: a capacity slot
//! (`capacity.rs`, the slot a queued task holds until it starts) and, for a key that is not live,
//! a share of the key budget (`key_budget.rs`, the share a key's entry holds until it is
//! retired). A reservation holds them; a submission through it hands them to `admit`
//! (`Mode::Reserved`), which gives them to the task and its key's entry, or back if refused (at
//! shutdown); a dropped reservation gives them back. Waiting is in each room's FIFO of async
//! waiters (`room_queue.rs`): first the slot, then (holding it, as a blocking submitter does) the
//! share. A dropped `reserve` future leaves both FIFOs and passes on whatever it was handed.

use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::error::{RejectReason, Rejected};
use crate::handle::TaskHandle;
use crate::key_budget::{KeyBudget, KeyShare};
use crate::room_queue::Waiter;
use crate::sync::Arc;
use crate::task::Kind;

use super::{Mode, Serializer};

impl<K, S> Serializer<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    /// Waits, without blocking a thread, for room for one task of `key` under
    /// [`capacity`](crate::Builder::capacity) and [`max_keys`](crate::Builder::max_keys), and
    /// holds it in a [`Reservation`] until a task is submitted through it (which never blocks
    /// and is never refused for room) or it is dropped (which gives the room back). Without
    /// those bounds it is ready at once. It needs no particular runtime: any executor can
    /// poll it.
    ///
    /// - **Fair**: waiters get room in the order they started waiting; a freed slot (or key
    ///   share) goes straight to the oldest one, never to a later `try_submit`.
    /// - **Cancel-safe**: a dropped `reserve` future holds nothing, and room handed to it
    ///   meanwhile goes on to the next waiter.
    /// - **Live keys**: a `reserve` for a key that is live never waits for key room under
    ///   `max_keys` (only for a capacity slot). For a key that is not, it releases idle keys
    ///   for room as `submit` does; if the key goes idle and is released between `reserve` and
    ///   the submission, the submission still goes in (the key then takes its share over the
    ///   limit, by one).
    /// - **Order**: a task submitted through the reservation is ordered with its key's other
    ///   tasks by the moment it is submitted through it, not by the moment of `reserve`.
    /// - Called from inside one of the serializer's own tasks, it never waits for a capacity
    ///   slot (it takes one over capacity, as `submit` does there).
    ///
    /// A [`shutdown`](Self::shutdown) resolves waiting and later `reserve`s to
    /// `Err(RejectReason::Shutdown)`.
    ///
    /// # Errors
    /// [`RejectReason::Shutdown`] once shut down; nothing else.
    ///
    /// ```
    /// # #[cfg(feature = "tokio")] {
    /// use keyserial::Builder;
    /// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    /// rt.block_on(async {
    ///     let s = Builder::<u32>::new().capacity(64).build().unwrap();
    ///     let mut handles = Vec::new();
    ///     for i in 0..1_000u32 {
    ///         // Waits for room without blocking the runtime's only thread.
    ///         let room = s.reserve(i % 10).await.unwrap();
    ///         handles.push(room.submit(move || i).unwrap());
    ///     }
    ///     for (i, h) in handles.into_iter().enumerate() {
    ///         assert_eq!(h.await.unwrap(), i as u32);
    ///     }
    /// });
    /// # }
    /// ```
    pub async fn reserve(&self, key: K) -> Result<Reservation<'_, K, S>, RejectReason> {
        Reserve {
            serializer: self,
            key: Some(key),
            slot: false,
            slot_waiter: None,
            share: Share::Unknown,
            share_waiter: None,
        }
        .await
    }
}

/// Where a `reserve` stands with the key budget.
enum Share {
    /// Not looked at yet (or no budget).
    Unknown,
    /// Needs none (no budget, or the key is live).
    NotNeeded,
    /// Holds one.
    Held(KeyShare),
}

/// The `reserve` future (see the module docs): what it holds, given back if dropped.
struct Reserve<'a, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    serializer: &'a Serializer<K, S>,
    key: Option<K>,
    /// A capacity slot is ours.
    slot: bool,
    slot_waiter: Option<Arc<Waiter>>,
    share: Share,
    share_waiter: Option<Arc<Waiter>>,
}

impl<K, S> Unpin for Reserve<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
}

impl<'a, K, S> Future for Reserve<'a, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    type Output = Result<Reservation<'a, K, S>, RejectReason>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let sh = &*this.serializer.shared;
        let closed = || sh.lifecycle().is_shutdown();
        if closed() {
            this.give_back();
            return Poll::Ready(Err(RejectReason::Shutdown));
        }
        if let (Some(cap), false) = (sh.capacity(), this.slot) {
            if crate::worker::current_worker::<K>(sh.id()).is_some() {
                // Inside one of its own tasks: never waits (as `submit` there).
                cap.force_reserve();
                this.slot = true;
            } else {
                match cap.poll_reserve(&mut this.slot_waiter, cx.waker(), closed) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(false) => return Poll::Ready(Err(RejectReason::Shutdown)),
                    Poll::Ready(true) => this.slot = true,
                }
            }
        }
        if let Some(budget) = sh.budget() {
            loop {
                if matches!(this.share, Share::NotNeeded | Share::Held(_)) {
                    break;
                }
                if this.key_is_live() {
                    // Live (from the start, or since): no key room needed; a share handed to
                    // our waiter meanwhile goes on to the next one.
                    if let Some(w) = this.share_waiter.take() {
                        KeyBudget::cancel_take(budget, w);
                    }
                    this.share = Share::NotNeeded;
                    break;
                }
                match KeyBudget::poll_take(budget, &mut this.share_waiter, cx.waker(), closed) {
                    Poll::Ready(Some(share)) => this.share = Share::Held(share),
                    Poll::Ready(None) => {
                        this.give_back();
                        return Poll::Ready(Err(RejectReason::Shutdown));
                    }
                    Poll::Pending => {
                        // The oldest waiter releases idle keys for room, as `submit` does (the
                        // freed share is handed over to it); nobody else would before their
                        // timeout. Not from inside a release hook (its caller may hold the
                        // idle FIFO).
                        let front = this
                            .share_waiter
                            .as_ref()
                            .is_some_and(|w| budget.is_front(w));
                        if front
                            && !crate::state::in_release_hook()
                            && crate::idle::release_one_idle(sh)
                        {
                            continue;
                        }
                        return Poll::Pending;
                    }
                }
            }
        }
        let share = match std::mem::replace(&mut this.share, Share::NotNeeded) {
            Share::Held(share) => Some(share),
            Share::Unknown | Share::NotNeeded => None,
        };
        let slot = std::mem::replace(&mut this.slot, false);
        Poll::Ready(Ok(Reservation {
            serializer: this.serializer,
            key: this.key.take(),
            slot,
            share,
        }))
    }
}

impl<K, S> Reserve<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    /// Whether the key is live now (runs its `Hash` and `Eq`: user code).
    fn key_is_live(&self) -> bool {
        let sh = &*self.serializer.shared;
        let key = self.key.as_ref().expect("a reserve's key until it is done");
        let guard = sh.pin();
        super::admit::live_entry(sh, key, &guard).is_some()
    }

    /// Leaves both FIFOs and gives back what we hold (room handed to us goes to the next
    /// waiter).
    fn give_back(&mut self) {
        let sh = &*self.serializer.shared;
        if let Some(cap) = sh.capacity() {
            if let Some(w) = self.slot_waiter.take() {
                cap.cancel_reserve(w);
            }
            if std::mem::replace(&mut self.slot, false) {
                cap.release();
            }
        }
        if let (Some(budget), Some(w)) = (sh.budget(), self.share_waiter.take()) {
            KeyBudget::cancel_take(budget, w);
        }
        // A share held goes back as it drops.
        self.share = Share::NotNeeded;
    }
}

impl<K, S> Drop for Reserve<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    fn drop(&mut self) {
        self.give_back();
    }
}

/// Room for one task of a key, from [`Serializer::reserve`]: a capacity slot and, for a key
/// that was not live, a share of `max_keys`. Submitting through it never blocks and is never
/// refused for room (only at shutdown, meanwhile); dropping it gives the room back.
///
/// ```
/// # #[cfg(feature = "tokio")] {
/// use keyserial::Builder;
/// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// rt.block_on(async {
///     let s = Builder::<&str>::new().capacity(1).build().unwrap();
///     let room = s.reserve("alice").await.unwrap();
///     assert_eq!(room.key(), &"alice");
///     drop(room); // gives the slot back
///     let room = s.reserve("alice").await.unwrap();
///     assert_eq!(room.submit(|| 7).unwrap().await.unwrap(), 7);
/// });
/// # }
/// ```
#[must_use = "dropping a reservation gives its room back"]
pub struct Reservation<'a, K, S = ()>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    serializer: &'a Serializer<K, S>,
    /// Taken by the submission.
    key: Option<K>,
    /// A capacity slot is held.
    slot: bool,
    share: Option<KeyShare>,
}

impl<K, S> std::fmt::Debug for Reservation<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + std::fmt::Debug + 'static,
    S: Send + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<K, S> Reservation<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    /// The key the room is for.
    ///
    /// ```
    /// # #[cfg(feature = "tokio")] {
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
    /// assert_eq!(s.reserve(3).await.unwrap().key(), &3);
    /// # });
    /// # }
    /// ```
    pub fn key(&self) -> &K {
        self.key
            .as_ref()
            .expect("a reservation's key until it is used")
    }

    /// The key and the room, for `admit` (which gives the room to the task or back).
    fn take(&mut self) -> (&Serializer<K, S>, K, Mode) {
        self.slot = false; // `admit` has it now (`Mode::Reserved`)
        let key = self.key.take().expect("a reservation is used once");
        (self.serializer, key, Mode::Reserved(self.share.take()))
    }

    /// Submits `task` as [`Serializer::submit`] does, with the reserved room: never blocks.
    ///
    /// # Errors
    /// `Rejected { reason: Shutdown, task }` if the serializer was shut down since `reserve`.
    ///
    /// ```
    /// # #[cfg(feature = "tokio")] {
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let s = keyserial::Builder::<u8>::new().capacity(8).build().unwrap();
    /// let h = s.reserve(1).await.unwrap().submit(|| 6 * 7).unwrap();
    /// assert_eq!(h.await.unwrap(), 42);
    /// # });
    /// # }
    /// ```
    pub fn submit<F, T>(mut self, task: F) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let (s, key, mode) = self.take();
        s.submit_joined(Some(key), task, Kind::Plain, mode, None)
    }

    /// Submits `task` without a handle, as [`Serializer::execute`] does, with the reserved
    /// room: never blocks.
    ///
    /// # Errors
    /// `Rejected { reason: Shutdown, task }` if the serializer was shut down since `reserve`.
    ///
    /// ```
    /// # #[cfg(feature = "tokio")] {
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let s = keyserial::Builder::<u8>::new().capacity(8).build().unwrap();
    /// s.reserve(1).await.unwrap().execute(|| println!("in key 1's order")).unwrap();
    /// # });
    /// # }
    /// ```
    pub fn execute<F>(mut self, task: F) -> Result<(), Rejected<F>>
    where
        F: FnOnce() + Send + 'static,
    {
        let (s, key, mode) = self.take();
        s.execute_with(key, task, mode)
    }

    /// Submits a future, as [`Serializer::submit_async`] does, with the reserved room: never
    /// blocks.
    ///
    /// # Errors
    /// `Rejected { reason: Shutdown, task }` if the serializer was shut down since `reserve`.
    ///
    /// ```
    /// # #[cfg(feature = "tokio")] {
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let s = keyserial::Builder::<u8>::new().capacity(8).build().unwrap();
    /// let h = s.reserve(1).await.unwrap().submit_async(async { "done" }).unwrap();
    /// assert_eq!(h.await.unwrap(), "done");
    /// # });
    /// # }
    /// ```
    pub fn submit_async<Fut>(mut self, fut: Fut) -> Result<TaskHandle<Fut::Output>, Rejected<Fut>>
    where
        Fut: Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        let (s, key, mode) = self.take();
        s.submit_future(key, fut, mode)
    }

    /// Submits a future without a handle, as [`Serializer::execute_async`] does, with the
    /// reserved room: never blocks.
    ///
    /// # Errors
    /// `Rejected { reason: Shutdown, task }` if the serializer was shut down since `reserve`.
    ///
    /// ```
    /// # #[cfg(feature = "tokio")] {
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let s = keyserial::Builder::<u8>::new().capacity(8).build().unwrap();
    /// s.reserve(1).await.unwrap().execute_async(async {}).unwrap();
    /// # });
    /// # }
    /// ```
    pub fn execute_async<Fut>(mut self, fut: Fut) -> Result<(), Rejected<Fut>>
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (s, key, mode) = self.take();
        s.execute_future(key, fut, mode)
    }

    /// Submits a state task, as [`Serializer::submit_with_state`] does, with the reserved
    /// room: never blocks.
    ///
    /// # Errors
    /// `Rejected { reason: Shutdown, task }` if the serializer was shut down since `reserve`.
    ///
    /// ```
    /// # #[cfg(feature = "tokio")] {
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let s = keyserial::Builder::<u8>::new().capacity(8).key_state(|_| 0u32).build().unwrap();
    /// let h = s.reserve(1).await.unwrap().submit_with_state(|n: &mut u32| { *n += 1; *n }).unwrap();
    /// assert_eq!(h.await.unwrap(), 1);
    /// # });
    /// # }
    /// ```
    pub fn submit_with_state<F, T>(mut self, task: F) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce(&mut S) -> T + Send + 'static,
        T: Send + 'static,
    {
        let (s, key, mode) = self.take();
        s.submit_job(Some(key), task, Kind::State, mode, None, |f, _| {
            move || crate::state::with_current(f)
        })
    }
}

impl<K, S> Reservation<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    /// Submits a future that owns its key's state while it runs, as
    /// [`Serializer::submit_async_with_state`] does, with the reserved room: never blocks.
    ///
    /// # Errors
    /// `Rejected { reason: Shutdown, task }` if the serializer was shut down since `reserve`.
    ///
    /// ```
    /// # #[cfg(feature = "tokio")] {
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// let s = keyserial::Builder::<u8>::new().capacity(8).key_state(|_| 0u32).build().unwrap();
    /// let room = s.reserve(1).await.unwrap();
    /// let h = room.submit_async_with_state(|n: u32| async move { (n + 1, n + 1) }).unwrap();
    /// assert_eq!(h.await.unwrap(), 1);
    /// # });
    /// # }
    /// ```
    pub fn submit_async_with_state<F, Fut, T>(mut self, f: F) -> Result<TaskHandle<T>, Rejected<F>>
    where
        F: FnOnce(S) -> Fut + Send + 'static,
        Fut: Future<Output = (S, T)> + Send + 'static,
        T: Send + 'static,
    {
        let (s, key, mode) = self.take();
        s.submit_future_of(key, f, super::state_future, true, mode)
    }
}

impl<K, S> Drop for Reservation<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    /// Gives the room back: the slot to the next waiter (or the count), the share likewise.
    fn drop(&mut self) {
        if self.slot {
            if let Some(cap) = self.serializer.shared.capacity() {
                cap.release();
            }
        }
    }
}
