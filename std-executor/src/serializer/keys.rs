//! Per-key control and visibility: pausing, resuming and cancelling a key (`control.rs` and
//! `key_control.rs` have the protocol), and what a key holds (`KeyStats`).
//!
//! A key's not-started tasks are in up to three places (`route.rs`): its lane (shared with
//! other keys, in submission order), a deferral of its lane (behind a task of the key that held
//! the lane's former owner) and its chain (its own queue). Looking at the first two needs the
//! lane's ownership: these methods take it for a moment (`inspect.rs`), never for longer than a
//! walk of the lane. The chain's tasks are counted by those who push and take them (`key.rs`,
//! `Seen`), and taken, by `cancel_key`, with the chain's baton (`key_control::hold_chain`).

use crate::owner::Owned;
use std::hash::Hash;
use std::ptr::NonNull;
use std::time::Duration;

use super::Serializer;
use crate::key::KeyEntry;
use crate::key_control::{running_direct, Held};
use crate::lane_task::LaneTask;
use crate::pending::PendingTask;
use crate::stats::KeyStats;
use crate::task::TaskRef;
use crate::user;

impl<K, S> Serializer<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    /// Pauses `key`: none of its tasks starts after this returns, until [`resume`](Self::resume).
    /// The task of the key that is running (or being started) as `pause` is called finishes;
    /// later submissions are accepted and queue behind the pause; other keys go on. Pausing a
    /// key with no tasks works too: the key stays live (it is never idle-released while paused,
    /// and counts in [`Stats::active_keys`](crate::Stats::active_keys)). Pausing a paused key
    /// does nothing. A paused key holds no worker thread.
    ///
    /// At [`shutdown`](Self::shutdown), a paused key's queued tasks do not run: their handles
    /// resolve [`Cancelled`](crate::TaskError::Cancelled) when the serializer terminates
    /// ([`shutdown_now`](Self::shutdown_now) hands them back, like any queued task).
    ///
    /// Runs the key's `Hash` and `Eq` (and `Clone`, the first time) on the calling thread.
    ///
    /// ```
    /// use std::time::Duration;
    /// let s: keyserial::Serializer<&str> = keyserial::Serializer::new();
    /// s.pause(&"alice");
    /// let h = s.submit("alice", || "ran after resume").unwrap();
    /// let other = s.submit("bob", || "bob is not paused").unwrap();
    /// assert_eq!(other.join().unwrap(), "bob is not paused");
    /// std::thread::sleep(Duration::from_millis(20));
    /// assert!(!h.is_finished());
    /// s.resume(&"alice");
    /// assert_eq!(h.join().unwrap(), "ran after resume");
    /// ```
    pub fn pause(&self, key: &K) {
        let sh = &*self.shared;
        crate::trace::control(sh.labeler(), "pause", key, || sh.hash_of(key), 0);
        crate::key_control::pause(sh, key);
    }

    /// Resumes a paused `key`: its queued tasks start again, in order. Resuming a key that is
    /// not paused (or not live) does nothing.
    ///
    /// ```
    /// let s: keyserial::Serializer<u32> = keyserial::Serializer::new();
    /// s.resume(&1); // not paused: nothing happens
    /// s.pause(&1);
    /// let h = s.submit(1, || 5).unwrap();
    /// s.resume(&1);
    /// assert_eq!(h.join().unwrap(), 5);
    /// ```
    pub fn resume(&self, key: &K) {
        let sh = &*self.shared;
        crate::trace::control(sh.labeler(), "resume", key, || sh.hash_of(key), 0);
        crate::key_control::resume(sh, key);
    }

    /// What `key` holds now: its queued tasks, whether one runs, whether it is paused, how long
    /// its tasks have waited (see [`KeyStats`]); `None` if the key is not live (nothing queued
    /// or running, not paused, no idle-cached state). No global lock: it looks at the key's
    /// entry and takes the key's lane for a moment, walking what the lane holds (`O(queued in
    /// the lane)`, comparing keys with `Eq`). The key's `Hash` and `Eq` run on the calling
    /// thread; a panic in them reaches the caller and changes nothing.
    ///
    /// ```
    /// use std::sync::mpsc;
    /// let s: keyserial::Serializer<u32> = keyserial::Serializer::new();
    /// let (tx, rx) = mpsc::channel::<()>();
    /// s.execute(7, move || { rx.recv().ok(); }).unwrap();
    /// for _ in 0..3 {
    ///     s.execute(7, || ()).unwrap();
    /// }
    /// while !s.key_stats(&7).unwrap().running { std::thread::yield_now(); }
    /// let st = s.key_stats(&7).unwrap();
    /// assert_eq!((st.queued, st.running, st.paused), (3, true, false));
    /// tx.send(()).unwrap();
    /// ```
    pub fn key_stats(&self, key: &K) -> Option<KeyStats> {
        let sh = &*self.shared;
        let hash = sh.hash_of(key);
        let l = sh.lanes().index_of(hash);
        let running_here = running_direct(sh, l, hash);
        let mut waiting = 0;
        // By when the key's oldest task outside its chain was pushed (the deferral's items
        // came from the lane before the lane's: its first, else the lane's first).
        let mut first_pushed_by: Option<u64> = None;
        crate::inspect::with_lane(sh, l, |lane| {
            lane.deferrals.visit_hash(
                hash,
                |item, by| {
                    if item.key == *key {
                        waiting += 1;
                        first_pushed_by.get_or_insert(by);
                    }
                    false
                },
                |_| {},
            );
            let mut first_index = None;
            // SAFETY: `with_lane` made this thread the lane's owner; the closure only reads.
            unsafe {
                lane.for_each_queued_at(|k, index, _| {
                    if k == key {
                        waiting += 1;
                        first_index.get_or_insert(index);
                    }
                })
            };
            if let (None, Some(index)) = (first_pushed_by, first_index) {
                first_pushed_by = Some(lane.pushed_by(index, || sh.now_ms()));
            }
        });
        let guard = sh.pin();
        let entry = sh
            .table()
            .get(key, &guard)
            .filter(|e| !e.value().chain.is_retired());
        let (chained, since, chain_running, paused) = match entry {
            Some(e) => {
                let (q, since, running) = e.value().seen.get();
                (q, since, running, e.value().control.is_paused_by_user())
            }
            None => (0, 0, false, false),
        };
        let running = running_here || chain_running || running_direct(sh, l, hash);
        if entry.is_none() && waiting == 0 && !running {
            return None;
        }
        // Each is a time by which some queued task of the key had been pushed (never later
        // than the truth), so the earliest is a lower bound of the oldest one's age. The chain's
        // are older than the rest (items reach it from the lane, in order), but its time is
        // when the first of them reached the chain, not when it was submitted: both count.
        // Both clocks read a whole millisecond past the instant (`now_ms`): now's floor, so a
        // whole-ms age never exceeds the truth.
        let now = sh.now_ms() - 1;
        let by = [
            (since != 0 && chained != 0).then_some(since),
            first_pushed_by,
        ]
        .into_iter()
        .flatten()
        .min();
        Some(KeyStats {
            queued: waiting + chained,
            running,
            paused,
            oldest_queued: by.map(|by| Duration::from_millis(now.saturating_sub(by))),
        })
    }

    /// The `n` live keys with the most queued tasks, most first (ties in any order), each with
    /// its [`KeyStats`]; keys with nothing queued are not listed. It takes each lane for a
    /// moment in turn and walks the key table (no global lock; `O(queued + live keys)`, cloning
    /// each listed key), so it suits a monitoring call, not a hot path.
    ///
    /// ```
    /// let s: keyserial::Serializer<&str> = keyserial::Serializer::new();
    /// s.pause(&"hot");
    /// s.pause(&"warm");
    /// for _ in 0..5 { s.execute("hot", || ()).unwrap(); }
    /// for _ in 0..2 { s.execute("warm", || ()).unwrap(); }
    /// let top = s.busiest_keys(1);
    /// assert_eq!(top.len(), 1);
    /// assert_eq!((top[0].0, top[0].1.queued), ("hot", 5));
    /// # s.resume(&"hot"); s.resume(&"warm");
    /// ```
    pub fn busiest_keys(&self, n: usize) -> Vec<(K, KeyStats)> {
        use std::collections::HashMap;
        let sh = &*self.shared;
        if n == 0 {
            return Vec::new();
        }
        let mut queued: HashMap<K, usize> = HashMap::new();
        for l in 0..sh.lanes().len() {
            crate::inspect::with_lane(sh, l, |lane| {
                lane.deferrals
                    .visit_all(|item| *queued.entry(item.key.clone()).or_default() += 1);
                // SAFETY: `with_lane` made this thread the lane's owner; the closure only reads.
                unsafe { lane.for_each_queued(|k, _| *queued.entry(k.clone()).or_default() += 1) };
            });
        }
        let guard = sh.pin();
        sh.table().for_each(&guard, |e| {
            let (q, _, _) = e.value().seen.get();
            if q != 0 && !e.value().chain.is_retired() {
                *queued.entry(e.key().clone()).or_default() += q;
            }
        });
        let mut top: Vec<(K, usize)> = queued.into_iter().collect();
        top.sort_unstable_by_key(|&(_, q)| std::cmp::Reverse(q));
        top.truncate(n);
        top.into_iter()
            .filter_map(|(k, _)| {
                let st = self.key_stats(&k)?;
                (st.queued > 0).then_some((k, st))
            })
            .collect()
    }

    /// Removes `key`'s tasks that have not started and hands them back, in submission order,
    /// as [`PendingTask`]s (run one to run its task here, drop it to resolve its handle
    /// [`Cancelled`](crate::TaskError::Cancelled)). The key's running task goes on, and later
    /// submissions are accepted as usual; a paused key stays paused. A started future that is
    /// pending is the key's running task: it stays.
    ///
    /// A task that waits in the key's own queue (a backlog, behind a permit-gated or async task)
    /// is taken with the queue's baton, which the key's running task holds when it runs from
    /// that queue: `cancel_key` then waits for that task to return, or for a pending future to
    /// complete (never for other keys' tasks; from inside that very task it takes the queue at
    /// once). Called from inside another task of the serializer, it never waits for long: if
    /// the key's queue stays held by another worker for about a millisecond, it takes nothing
    /// and returns an empty `Vec`. After [`shutdown_now`](Self::shutdown_now) (or while it runs)
    /// it takes nothing and returns an empty `Vec` at once: `shutdown_now` hands back every
    /// queued task.
    ///
    /// ```
    /// use std::sync::mpsc;
    /// let s: keyserial::Serializer<u32> = keyserial::Serializer::new();
    /// let (tx, rx) = mpsc::channel::<()>();
    /// s.execute(1, move || { rx.recv().ok(); }).unwrap();
    /// while s.stats().running == 0 { std::thread::yield_now(); }
    /// let queued: Vec<_> = (0..3).map(|i| s.submit(1, move || i).unwrap()).collect();
    /// let back = s.cancel_key(&1); // the running task goes on
    /// # assert!(back.iter().all(|p| p.key() == Some(&1)));
    /// assert_eq!(back.len(), 3);
    /// tx.send(()).unwrap();
    /// // Run the first here, drop the rest: their handles say Cancelled.
    /// let mut back = back.into_iter();
    /// back.next().unwrap().run();
    /// drop(back);
    /// let results: Vec<_> = queued.into_iter().map(|h| h.join()).collect();
    /// assert_eq!(results[0].as_ref().ok(), Some(&0));
    /// assert!(results[1..].iter().all(|r| matches!(r, Err(keyserial::TaskError::Cancelled))));
    /// ```
    pub fn cancel_key(&self, key: &K) -> Vec<PendingTask<K>> {
        let sh = &*self.shared;
        let hash = sh.hash_of(key);
        let l = sh.lanes().index_of(hash);
        let guard = sh.pin();
        // Hold the key: from now on a worker that drains its chain parks it at its next pop.
        let entry = loop {
            let e = crate::route::entry_for(sh, key, l, hash, &guard);
            e.value().control.hold();
            if !e.value().chain.is_retired() {
                break e;
            }
            e.value().control.unhold(); // released under us: again, on its new entry
        };
        let ks = entry.value();
        let on_worker = crate::worker::on_worker_of(sh.id());
        // Who takes the key's chain (`baton.rs`): this worker, from inside a task of the key's
        // own chain (its phase suspended from `RUNNING` meanwhile, so that `shutdown_now` does
        // not steal the chain under us), or a registered outside holder.
        let mine = crate::key_control::owns_chain_here(sh, entry)
            .then(|| crate::running::current_slot(sh.id()))
            .flatten()
            .map(|i| &*sh.slots()[i].phase)
            // SAFETY: we are code of the task the hold runs (on this thread, below its run).
            .or_else(|| unsafe {
                crate::running::held_here(sh.id(), entry as *const KeyEntry<K> as usize)
            });
        let mut registration = None;
        let held = match mine {
            // SAFETY: the owner is this thread, inside the key's task, its phase suspended: its
            // own token is not used until the task returns, and this one is given back first.
            Some(phase) if phase.suspend_running() => {
                Held::Mine(unsafe { Owned::assume(NonNull::from(entry)) })
            }
            Some(_) => Held::Stopped, // `shutdown_now` stole the chain: its queue is handed back
            None => match sh.outside_holds().register() {
                None => Held::Stopped,
                Some(r) => {
                    // SAFETY: `entry` is our table's, kept allocated by `guard`.
                    let h = unsafe { crate::key_control::hold_chain(sh, entry, &r, on_worker) };
                    registration = Some(r);
                    h
                }
            },
        };
        if matches!(held, Held::Busy | Held::Stopped) {
            // From a worker, behind another worker's hold of the key's queue, or after
            // `shutdown_now` (which hands back everything queued): nothing taken.
            ks.control.unhold();
            crate::trace::control(sh.labeler(), "cancel_key", key, || hash, 0);
            return Vec::new();
        }
        let mut from_chain: Vec<TaskRef> = Vec::new();
        let mut from_lane: Vec<LaneTask> = Vec::new();
        // Everything of the key that has not started is now in the chain (ours to pop), the
        // lane's deferrals or the lane: take the lane, so that nothing moves meanwhile.
        let drain_chain = |from_chain: &mut Vec<TaskRef>| {
            if let Held::Baton(owned) | Held::Mine(owned) = &held {
                owned.drain_into(from_chain);
            }
        };
        let mut from_deferral: Vec<LaneTask> = Vec::new();
        let walked = crate::inspect::with_lane(sh, l, |lane| {
            // The key's `Eq` is user code: a panic stops the walk, and is raised below, once
            // the key is given back.
            user::catch(|| {
                // The deferrals first: their runner routes items onto the chain under each
                // deferral's lock, so once these are out, the chain gets nothing more of them.
                lane.deferrals.visit_hash(
                    hash,
                    |item, _| item.key == *key,
                    |item| from_deferral.push(item.task),
                );
                drain_chain(&mut from_chain);
                // SAFETY: `with_lane` made this thread the lane's owner; the closure takes
                // tasks out in place and neither pops nor gives the lane up.
                unsafe {
                    lane.for_each_queued(|k, t| {
                        if k == key {
                            from_lane.push(t.take());
                        }
                    })
                };
            })
        });
        if walked.is_none() {
            // `shutdown_now` has the lanes (and hands back what they hold); the chain is ours.
            drain_chain(&mut from_chain);
        }
        // Handed back in the key's order: chain, deferral, lane.
        from_deferral.append(&mut from_lane);
        let from_lane = from_deferral;
        ks.seen.left(from_chain.len());
        // Give the chain back (never one parked for a pending future: that is the key's
        // running task, waited for by `hold_chain`): a key paused by the user parks; otherwise
        // a worker releases the (empty) chain. Before leaving `BUSY` (`baton.rs`): a
        // `shutdown_now` waiting for us then finds the chain parked or queued.
        ks.control.unhold();
        match held {
            Held::Baton(owned) => {
                crate::key_control::park_or_schedule(sh, owned);
                if let Some(r) = &registration {
                    r.phase.leave_busy();
                }
            }
            Held::Mine(lent) => {
                let _back_to_the_task_owner = lent.into_ptr();
                if let Some(phase) = mine {
                    phase.resume_running();
                }
            }
            Held::Retired | Held::Busy | Held::Stopped => {}
        }
        drop(registration);
        if let Some(Err(payload)) = walked {
            // The key's `Eq` panicked in the walk: what was taken resolves `Cancelled` (as if
            // handed back and dropped), and the panic reaches the caller.
            let taken = from_chain.len() + from_lane.len();
            sh.count_dropped_outside(taken as u64);
            for _ in 0..taken {
                sh.release_slot();
            }
            from_chain
                .into_iter()
                .for_each(|t| t.abandon(crate::task::Abandon::Cancelled));
            from_lane.into_iter().for_each(user::drop_quietly);
            std::panic::resume_unwind(payload);
        }
        let n = from_chain.len() + from_lane.len();
        let mut out = Vec::with_capacity(n);
        for t in from_chain
            .into_iter()
            .chain(from_lane.into_iter().map(LaneTask::into_task))
        {
            match user::catch(|| key.clone()) {
                Ok(k) => {
                    let runner: std::sync::Weak<dyn crate::pending::KeyRunner<K>> =
                        std::sync::Arc::downgrade(&self.shared) as _;
                    out.push(PendingTask::new(Some(k), t).with_key_state(runner, sh.state_hooks()))
                }
                Err(payload) => {
                    sh.count_dropped_outside(1);
                    sh.release_slot();
                    t.fail(payload);
                }
            }
        }
        sh.count_handed_back(out.len() as u64);
        for _ in 0..out.len() {
            sh.release_slot();
        }
        crate::trace::control(sh.labeler(), "cancel_key", key, || hash, out.len());
        out
    }
}
