//! The shutdown family (`shutdown`, `shutdown_now`, the bounded waits), termination, and
//! dropping a serializer.

use crate::owner::Owned;
use std::hash::Hash;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyserial_core::lane::Phase as LanePhase;

use crate::deferral::Deferral;
use crate::key::{KeyEntry, Runnable};
use crate::lanes::STOPPER;
use crate::pending::PendingTask;
use crate::phase::Stopped;
use crate::state_hold::KeyStateHold;
use crate::sync::Ordering;
use crate::task::{Abandon, Kind, TaskRef};
use crate::worker;

use super::Serializer;

/// `shutdown_now`'s holders of key state, by key hash (`state_hold.rs`).
struct Holds<K>(std::collections::HashMap<u64, Vec<Arc<KeyStateHold<K>>>>);

impl<K> Default for Holds<K> {
    fn default() -> Self {
        Holds(std::collections::HashMap::new())
    }
}

impl<K: Eq> Holds<K> {
    fn add(&mut self, hash: u64, h: Arc<KeyStateHold<K>>) {
        self.0.entry(hash).or_default().push(h);
    }

    /// `key`'s holder (`Some(None)`: none); `None` if the key's `Eq` panicked.
    fn find(&self, hash: u64, key: &K) -> Option<Option<Arc<KeyStateHold<K>>>> {
        let Some(list) = self.0.get(&hash) else {
            return Some(None);
        };
        crate::user::catch(|| list.iter().find(|h| h.key() == key).cloned()).ok()
    }
}

/// Gives each of `tasks` (one key's) a reference to the key's holder.
fn attach<K>(tasks: &mut [PendingTask<K>], h: &Arc<KeyStateHold<K>>) {
    for p in tasks {
        p.set_hold(h);
    }
}

impl<K, S> Serializer<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    /// Stops accepting tasks; queued tasks still run. Idempotent; returns without waiting for
    /// any task (see [`await_termination`](Self::await_termination)), only for the unkeyed and
    /// `submit_latest` submissions already inside a submit call to finish their push, which
    /// never blocks. A submission that returned `Ok` before `shutdown` returned runs (or is
    /// handed back by [`shutdown_now`](Self::shutdown_now)); one that starts after is refused.
    ///
    /// ```
    /// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
    /// s.execute(1, || ()).unwrap();
    /// s.shutdown();
    /// assert!(s.is_shutdown());
    /// assert!(s.execute(1, || ()).is_err());
    /// ```
    pub fn shutdown(&self) {
        let sh = &*self.shared;
        sh.lifecycle().begin_shutdown();
        // Unkeyed and latest submissions are admitted by the gate, keyed ones by their lane
        // (see "Admission"): the lanes close once the gate's last submission has pushed.
        sh.gate().close();
        sh.gate().wait_idle();
        sh.lanes().close();
        if let Some(c) = sh.capacity() {
            c.wake_all();
        }
        sh.sleep().wake_all();
        if sh.lifecycle().live_workers() == 0 {
            sh.lifecycle().set_terminated();
        }
    }

    /// Stops at once: no new tasks, no more queued tasks run; every task that was queued and
    /// not started is handed back (with its key) instead. Tasks already running finish
    /// undisturbed, but the tasks queued behind them are handed back too. Dropping a returned
    /// [`PendingTask`] resolves its handle as [`Cancelled`](crate::TaskError::Cancelled).
    ///
    /// **Order:** each key's tasks come back in their submission order (run them in the order
    /// returned to keep the key's order); the keys are interleaved in no promised order, and
    /// unkeyed tasks anywhere among them. A started future that is pending is not handed back:
    /// it is dropped, and its handle resolves `Cancelled`.
    ///
    /// ```
    /// use keyserial::Builder;
    /// let s = Builder::<u32>::new().workers(1).build().unwrap();
    /// let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// s.execute(0, move || { rx.recv().ok(); }).unwrap();
    /// while s.stats().running == 0 { std::thread::yield_now(); }
    /// for k in 0..3 { s.execute(k, || ()).unwrap(); }
    /// let pending = s.shutdown_now();
    /// assert_eq!(pending.len(), 3);
    /// tx.send(()).unwrap();
    /// ```
    pub fn shutdown_now(&self) -> Vec<PendingTask<K>> {
        let sh = &*self.shared;
        sh.lifecycle().begin_stop();
        let collecting = sh.lifecycle().begin_collecting();
        self.shutdown();
        sh.gate().wait_idle();
        let mut out: Vec<PendingTask<K>> = Vec::new();
        // 1. Workers: stop each one; steal the chains of those inside a task (phase.rs). Every
        //    worker is stopped before any chain is drained: a worker routing a lane's items
        //    pushes onto chains until it stops.
        let mut holds = Holds::default();
        let stolen: Vec<(usize, NonNull<KeyEntry<K>>)> = sh
            .slots()
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.phase.stop() == Stopped::Stole)
            .filter_map(|(i, slot)| {
                NonNull::new(slot.current.load(Ordering::Relaxed) as *mut _).map(|e| (i, e))
            })
            .collect();
        for (i, e) in stolen {
            // Its worker is still inside a task of the chain (perhaps using the key's state):
            // the queued tasks are handed back, the entry is left alone (freed with the table,
            // after every worker is gone), and its state comes to the key's handed-back tasks
            // once the task returned (`state_hold.rs`).
            let lent = &sh.slots()[i].lent;
            self.drain_queued_into(e, lent, i, &mut out, &mut holds);
        }
        // The same for the chains held outside the workers (`baton.rs`): `cancel_key`s and
        // runs of the state tasks it handed back, stopped (waited for while they hold a chain
        // between two steps) and stolen from while inside a task.
        for (hold, e) in sh.outside_holds().stop_all() {
            self.drain_queued_into(e, &hold.lent, hold.lent_mark(), &mut out, &mut holds);
        }
        // What workers handed back of the chains they held (they do so before going idle,
        // which `stop` waited for).
        out.append(&mut sh.lifecycle().take_handed_back());
        // 2. Chains parked on permits or a pause, then those parked on their head future.
        for e in crate::permits::steal_all(sh) {
            // A pause's wait is gone: its id goes too (outside the registry's lock, which a
            // park takes under the key's control lock), or the key's next park would find it.
            // SAFETY: the steal gave us the chain's baton, so the entry is alive.
            unsafe { e.as_ref() }.value().control.forget_wait();
            self.drain_into(e, &mut out, &mut holds);
        }
        for e in self.steal_parked_futures() {
            self.drain_into(e, &mut out, &mut holds);
        }
        // 3. Every queue.
        let mut take = |r| match r {
            Runnable::Chain(e) => self.drain_into(e, &mut out, &mut holds),
            Runnable::Task(t) => out.push(PendingTask::new(None, t)),
        };
        while let Some(r) = worker::steal_into(|| sh.global().steal()) {
            take(r);
        }
        for slot in sh.slots().iter() {
            while let Some(r) = worker::steal_into(|| slot.stealer.steal()) {
                take(r);
            }
        }
        // Per key, a lane's items come after the key's chain. First what workers held of a
        // lane or a deferral when they stopped (a deferral's runner hands back the item it
        // took before the rest of the deferral, which the lane's owner or step 4 takes).
        out.append(&mut sh.lifecycle().take_handed_back_lane_items());
        // 4. The lanes (lanes.rs), each taken for good: a free one at once, one whose owner is
        //    inside a task by a steal that offers the owner "stop" instead of a deferral. An
        //    owned one is being handed back by its owner (stopped above), who then releases
        //    it. A lane's deferred items come before its queued ones: they were popped first.
        if !sh.lanes().stopped.swap(true, Ordering::AcqRel) {
            for l in 0..sh.lanes().len() {
                let lane = sh.lanes().get(l);
                let backoff = crossbeam_utils::Backoff::new();
                loop {
                    let taken = match lane.word.phase() {
                        LanePhase::Free => lane.word.try_acquire(STOPPER),
                        LanePhase::Running => lane.word.watch().is_some_and(|w| {
                            sh.mailbox(w.owner()).is_some_and(|victim| {
                                lane.word
                                    .try_steal(STOPPER, &w, victim, Deferral::stop_sentinel())
                                    .is_ok()
                            })
                        }),
                        LanePhase::Owned => false,
                    };
                    if taken {
                        break;
                    }
                    crate::sync::snooze(&backoff);
                }
                // SAFETY: the loop above took the lane for good (as `STOPPER`): nobody else
                // pops it any more.
                unsafe { worker::lane_items(lane, None, &mut out) };
            }
        }
        // 5. What workers handed back meanwhile: the lanes whose owner left a task after step
        //    1 (step 4 waited for their release).
        out.append(&mut sh.lifecycle().take_handed_back_lane_items());
        out.append(&mut sh.lifecycle().take_handed_back());
        drop(collecting);
        sh.count_handed_back(out.len() as u64);
        if let Some(c) = sh.capacity() {
            for _ in 0..out.len() {
                c.release();
            }
        }
        sh.sleep().wake_all();
        // 6. Key state: the handed-back tasks of a key share its state (`state_hold.rs`).
        let out = if sh.state_hooks().on {
            self.hold_lane_states(out, &mut holds)
        } else {
            out
        };
        out.into_iter()
            .map(|p| p.with_state_hooks(sh.state_hooks()))
            .collect()
    }

    /// `shutdown_now`, once every worker has stopped: the chains parked on their head future,
    /// each taken from its wakers (`future_task.rs`, "Shutdown"). A chain whose waker won is
    /// on the global queue when this returns.
    fn steal_parked_futures(&self) -> Vec<NonNull<KeyEntry<K>>> {
        let sh = &*self.shared;
        let mut stolen = Vec::new();
        let guard = sh.pin();
        sh.table().for_each(&guard, |e| {
            let ks = e.value();
            // Taken out whatever the steal finds: if a waker won, the chain is drained from
            // the global queue next and its future freed, and a later `shutdown_now` must not
            // find the pointer.
            let state = ks
                .parked_future
                .swap(std::ptr::null_mut(), Ordering::Acquire);
            if state.is_null() {
                return;
            }
            // Every worker has stopped (step 1), and a worker clears the pointer before it
            // polls the chain's head future: so the future has been parked since its last poll,
            // and its node, which holds the state, is still on the chain.
            // SAFETY: as just said, the state is alive (only a worker or this call frees it).
            if unsafe { (*state).steal() } {
                stolen.push(NonNull::from(e));
            }
        });
        stolen
    }

    /// `shutdown_now`'s last step, with key state: the tasks handed back from lanes and
    /// deferrals (not from the key's chain, whose holder `drain_into` made) join their key's
    /// holder; a key without one gets one, with the state of its idle entry if it has one
    /// (claimed and released here), else none yet (its first state task makes it). A key
    /// whose `Hash`, `Eq` or `Clone` panics here gets no holder: its state tasks run against
    /// fresh states (`PendingTask::run`).
    fn hold_lane_states(
        &self,
        out: Vec<PendingTask<K>>,
        holds: &mut Holds<K>,
    ) -> Vec<PendingTask<K>> {
        let sh = &*self.shared;
        let guard = sh.pin();
        // How long, in all, to wait for chains about to be let go (`take_idle_state`).
        let mut patience = Duration::from_millis(100);
        out.into_iter()
            .map(|p| {
                let Some(key) = p.key().filter(|_| !p.is_backed()) else {
                    return p;
                };
                let Ok(hash) = crate::user::catch(|| sh.hash_of(key)) else {
                    return p;
                };
                match holds.find(hash, key) {
                    Some(Some(h)) => return p.with_hold(&h),
                    Some(None) => {}
                    None => return p, // its `Eq` panicked
                }
                let state = crate::user::catch(|| sh.table().get(key, &guard))
                    .ok()
                    .flatten()
                    .and_then(|e| self.take_idle_state(e, &mut patience));
                // A holder even for a plain task without state: the key's next tasks find it
                // and do not look for the key's state again (issue "Baton": a `shutdown_now`
                // spun 100 ms per handed-back task of a key whose chain it could not claim).
                let Ok(k) = crate::user::catch(|| key.clone()) else {
                    if let Some(st) = state {
                        sh.state_hooks().release(key, st);
                    }
                    return p;
                };
                let h = KeyStateHold::new(k, sh.state_hooks(), state, None);
                holds.add(hash, h.clone());
                p.with_hold(&h)
            })
            .collect()
    }

    /// The state of `entry`, an idle key's: claims its chain (waiting a little for a holder
    /// about to let go, such as an exiting worker's reaper, which may release the state first,
    /// for at most what is left of `patience`, shared by every key of one `shutdown_now`),
    /// takes the state, then releases and retires the key.
    fn take_idle_state(
        &self,
        entry: &KeyEntry<K>,
        patience: &mut Duration,
    ) -> Option<crate::state::Erased> {
        let ks = entry.value();
        let backoff = crossbeam_utils::Backoff::new();
        let start = Instant::now();
        let deadline = start + *patience;
        let owned = loop {
            if ks.chain.is_retired() || Instant::now() > deadline {
                *patience = patience.saturating_sub(start.elapsed());
                return None;
            }
            if let Some(owned) = Owned::claim(entry) {
                break owned;
            }
            crate::sync::snooze(&backoff);
        };
        let state = owned.take_state();
        // SAFETY: an entry of our table. The chain was claimed idle: empty, and after the
        // stop no push comes, so the release cannot fail.
        if let Err(owned) = unsafe { crate::idle::release_drained(&self.shared, owned) } {
            let _still_queued = owned.into_ptr();
            debug_assert!(false, "a push onto a chain after the stop");
        }
        state
    }

    /// `drain_into` for a chain taken from a worker (or an outside holder, `baton.rs`) still
    /// inside one of its tasks: hands back what is queued and leaves the chain, its entry and
    /// its state as they are. With key state, the key's holder is lent: the worker of slot
    /// `slot` (or the outside holder whose `lent_mark` it is) gives the state to it through `lent` when its
    /// task returns (`state_hold.rs`); made even if nothing is handed back, so that the state
    /// still goes through the hook (when the worker drops the holder).
    fn drain_queued_into(
        &self,
        e: NonNull<KeyEntry<K>>,
        lent: &crate::sync::Mutex<crate::state_hold::Lent<K>>,
        slot: usize,
        out: &mut Vec<PendingTask<K>>,
        holds: &mut Holds<K>,
    ) {
        // SAFETY: `phase.stop` gave us the chain's baton (`Stopped::Stole`): the worker's own
        // token is not used again but to give up the key's state (`stolen_state`).
        let owned = unsafe { Owned::assume(e) };
        // SAFETY: the entry is not freed while the worker runs: nobody retires it (we do not,
        // below: a stolen chain stays with `shutdown_now`).
        let entry = unsafe { e.as_ref() };
        let mut tasks = Vec::new();
        owned.drain_into(&mut tasks);
        let _kept_by_the_stop = owned.into_ptr();
        let start = out.len();
        self.hand_back_drained(entry, tasks, out);
        let sh = &*self.shared;
        if sh.state_hooks().on {
            let Ok(key) = crate::user::catch(|| entry.key().clone()) else {
                return; // its state stays with the worker, and goes with the table
            };
            let h = crate::state_hold::take_lent(lent, key, sh.state_hooks(), sh.id(), slot);
            attach(&mut out[start..], &h);
            // Also for the key's tasks still in its lane, handed back later.
            holds.add(entry.hash(), h);
        }
    }

    /// With key state, the key's state goes to a holder shared by its handed-back tasks, if
    /// there are any (`state_hold.rs`); else it is released here, with the key.
    fn drain_into(
        &self,
        e: NonNull<KeyEntry<K>>,
        out: &mut Vec<PendingTask<K>>,
        holds: &mut Holds<K>,
    ) {
        // SAFETY: the caller took the chain's baton (stolen from a permit wait or an outside
        // holder, or popped from a ready queue).
        let owned = unsafe { Owned::assume(e) };
        // SAFETY: alive while we hold the baton, and after its release under the guard
        // `release_drained` pins first.
        let entry = unsafe { e.as_ref() };
        let mut tasks = Vec::new();
        owned.drain_into(&mut tasks);
        let start = out.len();
        self.hand_back_drained(entry, tasks, out);
        let sh = &*self.shared;
        if sh.state_hooks().on && out.len() > start {
            if let Ok(key) = crate::user::catch(|| entry.key().clone()) {
                let state = owned.take_state();
                let h = KeyStateHold::new(key, sh.state_hooks(), state, None);
                attach(&mut out[start..], &h);
                holds.add(entry.hash(), h);
            }
        }
        // SAFETY: an entry of our table. After the stop no push comes: the drained chain stays
        // empty, and the release cannot fail.
        if let Err(owned) = unsafe { crate::idle::release_drained(&self.shared, owned) } {
            let _still_queued = owned.into_ptr();
            debug_assert!(false, "a push onto a chain after the stop");
        }
    }

    /// The tasks drained from `entry`'s chain, handed back (a started future is cancelled).
    fn hand_back_drained(
        &self,
        entry: &KeyEntry<K>,
        tasks: Vec<TaskRef>,
        out: &mut Vec<PendingTask<K>>,
    ) {
        for t in tasks {
            let Some(t) = self.unless_started_future(t) else {
                // The key's running (pending) future is gone: nothing of it runs any more.
                entry.value().seen.set_running(false);
                continue;
            };
            // The key's `Clone` is user code: a task whose key cannot be cloned is not handed
            // back but resolves `Panicked` with the key's payload (`user.rs`).
            match crate::user::catch(|| entry.key().clone()) {
                Ok(key) => out.push(PendingTask::new(Some(key), t)),
                Err(payload) => {
                    self.shared.count_dropped_outside(1);
                    self.shared.release_slot();
                    t.fail(payload);
                }
            }
        }
    }

    /// `shutdown_now`, for a task drained from a chain: a started future (pending, its chain
    /// parked or stolen) is cancelled, its handle resolves `Cancelled` and it counts as ended;
    /// any other task comes back to be handed back.
    fn unless_started_future(&self, t: TaskRef) -> Option<TaskRef> {
        if t.kind() != Kind::Future {
            return Some(t);
        }
        // SAFETY: nodes of kind `Future` are made only by `future_task::make::<_, K>`.
        if !unsafe { crate::future_task::head_of::<K>(&t) }.started() {
            return Some(t); // never polled: handed back
        }
        self.shared.count_completed_outside();
        t.abandon(Abandon::Cancelled);
        None
    }

    /// Waits until the serializer has terminated (shut down and every worker exited) or
    /// `timeout` passes; returns whether it terminated. A timeout too large to add to the current
    /// time (`Duration::MAX`) means no timeout.
    ///
    /// If it returns `false` after [`shutdown_now`](Self::shutdown_now) (called before or after
    /// this wait), dropping the serializer no longer waits for the threads still inside a task
    /// (see [Dropping](Self#dropping)).
    ///
    /// ```
    /// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
    /// s.execute(1, || ()).unwrap();
    /// s.shutdown();
    /// assert!(s.await_termination(std::time::Duration::from_secs(10)));
    /// assert!(s.is_terminated());
    /// ```
    pub fn await_termination(&self, timeout: Duration) -> bool {
        let done = self.wait_terminated(Instant::now().checked_add(timeout));
        if !done && self.is_shutdown() {
            self.gave_up.store(true, Ordering::Release);
        }
        done
    }

    /// Shuts down and waits at most `timeout` for termination (as tokio's
    /// `Runtime::shutdown_timeout` does); returns whether everything finished in time.
    ///
    /// First as [`shutdown`](Self::shutdown): no new tasks, queued tasks still run. If every
    /// queued task has run and every worker has exited within `timeout`, it returns `true`.
    /// Otherwise, at the deadline it stops as [`shutdown_now`](Self::shutdown_now) does and
    /// **cancels** the tasks that have not started: they are dropped unrun (their handles
    /// resolve [`Cancelled`](crate::TaskError::Cancelled); an [`execute`](Self::execute) task is
    /// simply lost), and it returns `false`. To get those tasks back instead, call `shutdown`,
    /// `await_termination` and `shutdown_now` yourself.
    ///
    /// Worker threads still inside a task at the deadline are **detached**: nothing waits for
    /// them, not this call and not the serializer's `Drop`. Each finishes the task it is in
    /// (its handle resolves then, as usual), starts nothing more, and exits; the serializer's
    /// shared state is freed when the last of them has exited. A task that never returns keeps
    /// its thread forever, but nobody waits for it. A `timeout` too large to add to the current
    /// time (`Duration::MAX`) means no timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyserial::{Builder, TaskError};
    ///
    /// let s = Builder::<&str>::new().workers(1).build().unwrap();
    /// let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// let stuck = s.submit("a", move || { rx.recv().ok(); "finally" }).unwrap();
    /// while s.stats().running == 0 { std::thread::yield_now(); }
    /// let queued = s.submit("b", || "never").unwrap();
    ///
    /// assert!(!s.shutdown_timeout(Duration::from_millis(20)));
    /// assert!(matches!(queued.join(), Err(TaskError::Cancelled)));
    /// drop(s); // returns at once: the stuck thread is detached
    /// tx.send(()).unwrap();
    /// assert_eq!(stuck.join().unwrap(), "finally"); // it still finishes its task
    /// ```
    pub fn shutdown_timeout(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        self.shutdown();
        if self.wait_terminated(deadline) {
            return true;
        }
        self.gave_up.store(true, Ordering::Release);
        drop(self.shutdown_now());
        false
    }

    /// Waits for termination until `deadline` (`None`: without bound).
    fn wait_terminated(&self, deadline: Option<Instant>) -> bool {
        self.shared.lifecycle().wait_terminated(deadline)
    }

    /// Resolves once the serializer has terminated (shut down, and every worker exited): the
    /// async form of [`await_termination`](Self::await_termination) without a timeout, which
    /// never blocks a thread (wrap it in your runtime's timeout for a bound). It does not shut
    /// the serializer down: call [`shutdown`](Self::shutdown) (or drop another handle of it)
    /// first, or it waits for that. Cancel-safe: dropping the future leaves nothing behind but
    /// a kept waker, woken at termination.
    ///
    /// ```
    /// # #[cfg(feature = "tokio")] {
    /// let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    /// rt.block_on(async {
    ///     let s: keyserial::Serializer<u32> = keyserial::Serializer::new();
    ///     let h = s.submit(1, || 7).unwrap();
    ///     s.shutdown();
    ///     s.terminated().await; // the runtime's thread is free meanwhile
    ///     assert!(s.is_terminated());
    ///     assert_eq!(h.await.unwrap(), 7);
    /// });
    /// # }
    /// ```
    pub async fn terminated(&self) {
        std::future::poll_fn(|cx| self.shared.lifecycle().poll_terminated(cx)).await
    }

    /// `true` once [`shutdown`](Self::shutdown) or [`shutdown_now`](Self::shutdown_now) was called.
    ///
    /// ```
    /// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
    /// assert!(!s.is_shutdown());
    /// ```
    pub fn is_shutdown(&self) -> bool {
        self.shared.lifecycle().is_shutdown()
    }

    /// `true` once shut down and every worker has exited.
    ///
    /// ```
    /// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
    /// assert!(!s.is_terminated());
    /// ```
    pub fn is_terminated(&self) -> bool {
        self.shared.lifecycle().is_terminated()
    }
}

impl<K, S> Drop for Serializer<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    /// See [Dropping](Serializer#dropping).
    fn drop(&mut self) {
        self.shutdown();
        if worker::on_worker_of(self.shared.id()) {
            return; // dropped inside one of our own tasks: the workers finish on their own
        }
        // On a thread of a tokio runtime, never block it (DESIGN 3.1c): the queued futures may
        // need that very thread (a current-thread runtime's timers); the workers finish the
        // queued tasks in the background and exit, detached.
        #[cfg(feature = "tokio")]
        if tokio::runtime::Handle::try_current().is_ok() {
            drop(self.shared.lifecycle().take_threads());
            return;
        }
        // After shutdown_now and a bounded wait that gave up, nothing queued is left: the threads
        // still alive are inside a task. Detach them rather than wait without bound.
        let detach = self.gave_up.load(Ordering::Acquire) && self.shared.lifecycle().is_stopped();
        if detach {
            crate::supervisor::stop(&self.shared);
        }
        loop {
            let handles: Vec<_> = self.shared.lifecycle().take_threads();
            if handles.is_empty() {
                break;
            }
            for h in handles {
                if detach && !h.is_finished() {
                    drop(h); // detached: it exits once its task returns
                } else {
                    let _ = h.join();
                }
            }
        }
        crate::supervisor::stop(&self.shared);
    }
}
