//! Loom models of a key's state held by its handed-back tasks after `shutdown_now`
//! (`std-executor/src/state_hold.rs`, "The holder" and "A state lent to a running task"), over
//! the real `KeyStateHold`, the real `Lent` slot with its (loom) mutex, the real
//! `worker_returns` / `take_lent` hand-over and real `PendingTask`s (their `run` and their
//! drop), through the thin `u32` wrappers of `keyserial::loom_api::state_hold`:
//!
//! 1. the worker whose stolen chain's task returned gives the key's state back while
//!    `shutdown_now` takes the key's holder, in either order: the state arrives in the holder
//!    exactly once (never lost, never left behind in the slot as well), and goes through the
//!    release hook exactly once, also when `shutdown_now` had no task to hand back and dropped
//!    its holder at once (the hook then runs on whichever thread dropped the last reference);
//! 2. a handed-back state task run while the state is still lent waits (on the holder's
//!    condvar) for the worker to give it back: it runs exactly once, against the returned state
//!    (not a fresh one from `init`), and the hook sees what it did (no lost wakeup: loom reports
//!    a run left waiting as a deadlock);
//! 3. the last-drop race: two handed-back tasks of a key, one run and one dropped on two
//!    threads: the hook is called exactly once, with the final state, on either thread, and the
//!    dropped task's closure never runs;
//! 4. all of it at once: the worker's give-back, `shutdown_now`'s take, a run of a state task
//!    and the drop of a plain task of the key: one run, against the returned state, one hook.
//!
//! A leaked holder would leak the loom `Arc` its release hook captures, which loom reports.
//!
//! **What loom cannot check here.** The holder is shared through `std::sync::Arc` (as in the
//! crate), whose counts loom does not model: the threads interleave at the holder's and the
//! slot's mutexes, its condvar and the models' own loom atomics, and the last drop is whichever
//! thread's drop the schedule puts last. Loom threads are coroutines on one OS thread, so they
//! share std thread-locals (the holder's `RUNNING` marks, `state.rs`'s current source): the
//! models run at most one state task at a time, where two racing runs would see each other's
//! marks (a model artefact, not a bug).
#![cfg(loom)]

mod common;

use common::coverage::{assert_all_reached, count};

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

use keyserial::loom_api::state_hold::{take_lent, worker_returns, Hold, Hooks, Slot, SlotIs};

/// The key of every model.
const KEY: u32 = 1;
/// The state the worker gives back (what the key's running task left).
const LENT: u32 = 5;
/// What `init` makes for `KEY` (told apart from `LENT`).
const FRESH: u32 = 100;

/// What the release hook was called with, in order, and on which thread.
#[derive(Default)]
struct Released(Mutex<Vec<(u32, u32, thread::ThreadId)>>);

/// Hooks whose `init` makes `FRESH` and whose release hook records into `released`.
fn hooks(released: &Arc<Released>) -> Hooks {
    let r = released.clone();
    Hooks::new(
        |k| {
            assert_eq!(k, KEY);
            FRESH
        },
        move |k, st| r.0.lock().unwrap().push((k, st, thread::current().id())),
    )
}

impl Released {
    /// The (key, state) pairs released so far.
    fn states(&self) -> Vec<(u32, u32)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|&(k, s, _)| (k, s))
            .collect()
    }

    /// The thread the only release ran on.
    fn thread(&self) -> thread::ThreadId {
        let r = self.0.lock().unwrap();
        assert_eq!(r.len(), 1, "released once");
        r[0].2
    }
}

#[test]
fn the_lent_state_reaches_the_holder_once_in_either_order() {
    static SEEN: [std::sync::atomic::AtomicUsize; 2] = counters!(2);
    loom::model(|| {
        let released = Arc::new(Released::default());
        let hooks = hooks(&released);
        let slot = Arc::new(Slot::new());
        let s = slot.clone();
        // The worker: its task returned and `leave_running` reported the steal.
        let worker = thread::spawn(move || worker_returns(&s, Some(LENT)));
        // `shutdown_now`, for the chain it stole from that worker.
        let hold = take_lent(&slot, KEY, &hooks);
        match hold.peek() {
            (None, true) => count(&SEEN, 0), // still lent: the worker hands it over
            (Some(LENT), false) => count(&SEEN, 1),
            other => panic!("a holder neither lent nor with the state: {other:?}"),
        }
        worker.join().unwrap();
        assert_eq!(hold.peek(), (Some(LENT), false), "the state arrived");
        assert_eq!(slot.is(), SlotIs::Empty, "and is not in the slot as well");
        assert!(released.states().is_empty(), "the holder is alive");
        drop(hold);
        assert_eq!(released.states(), [(KEY, LENT)], "released once");
    });
    assert_all_reached(&SEEN, &["lent when taken", "back when taken"]);
}

#[test]
fn a_holder_dropped_at_once_releases_the_lent_state_once() {
    static SEEN: [std::sync::atomic::AtomicUsize; 2] = counters!(2);
    loom::model(|| {
        let released = Arc::new(Released::default());
        let hooks = hooks(&released);
        let slot = Arc::new(Slot::new());
        let s = slot.clone();
        let worker = thread::spawn(move || {
            worker_returns(&s, Some(LENT));
            thread::current().id()
        });
        // `shutdown_now` makes the holder even with no task to hand back, and drops it.
        drop(take_lent(&slot, KEY, &hooks));
        let worker_id = worker.join().unwrap();
        assert_eq!(slot.is(), SlotIs::Empty);
        assert_eq!(released.states(), [(KEY, LENT)], "released once");
        count(&SEEN, usize::from(released.thread() == worker_id));
    });
    assert_all_reached(&SEEN, &["hook on shutdown_now", "hook on the worker"]);
}

#[test]
fn a_run_waits_for_the_lent_state_and_runs_once_against_it() {
    static SEEN: [std::sync::atomic::AtomicUsize; 2] = counters!(2);
    loom::model(|| {
        let released = Arc::new(Released::default());
        let hooks = hooks(&released);
        let slot = Arc::new(Slot::new());
        let s = slot.clone();
        let worker = thread::spawn(move || worker_returns(&s, Some(LENT)));
        let hold = take_lent(&slot, KEY, &hooks);
        let ran = Arc::new(AtomicUsize::new(0));
        let saw = Arc::new(AtomicUsize::new(0));
        let (r, w) = (ran.clone(), saw.clone());
        let task = hold.state_task(move |st| {
            r.fetch_add(1, Ordering::SeqCst);
            w.store(*st as usize, Ordering::SeqCst);
            *st += 1;
        });
        // Lent here, the run below waits unless loom switches to the worker at its lock.
        count(&SEEN, usize::from(hold.peek().1));
        drop(hold); // `shutdown_now` returned: the task keeps the holder
        task.run(); // the user runs it: waits while the state is lent
        assert_eq!(ran.load(Ordering::SeqCst), 1, "ran exactly once");
        assert_eq!(
            saw.load(Ordering::SeqCst),
            LENT as usize,
            "against the returned state, not a fresh one"
        );
        worker.join().unwrap();
        assert_eq!(slot.is(), SlotIs::Empty);
        // Here always on the runner: the worker drops its reference right after `give_back`
        // with no loom step between (an unlock and a notify are none), so in these schedules
        // it never outlives the run. The worker's last drop is in the model above.
        assert_eq!(
            released.states(),
            [(KEY, LENT + 1)],
            "released once, as left"
        );
    });
    assert_all_reached(&SEEN, &["back before the run", "lent at the run"]);
}

/// Sets its counter when dropped: a closure that captured it is gone.
struct DropMark(Arc<AtomicUsize>);

impl Drop for DropMark {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The last-drop race: the holder of `initial` with a state task run on one thread and another
/// task (a state task if `drop_state_task`, else a plain one) dropped on another.
fn last_drop(initial: Option<u32>, drop_state_task: bool) {
    // Per call (the two callers run side by side under `cargo test`).
    let seen = std::sync::Arc::new(counters!(2));
    let counters = seen.clone();
    loom::model(move || {
        let released = Arc::new(Released::default());
        let hooks = hooks(&released);
        let hold = Hold::new(KEY, &hooks, initial);
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let run = hold.state_task(move |st| {
            r.fetch_add(1, Ordering::SeqCst);
            *st += 1;
        });
        let dropped_ran = Arc::new(AtomicUsize::new(0));
        let gone = Arc::new(AtomicUsize::new(0));
        let (dr, mark) = (dropped_ran.clone(), DropMark(gone.clone()));
        let dropped = if drop_state_task {
            hold.state_task(move |_| {
                let _mark = mark;
                dr.fetch_add(1, Ordering::SeqCst);
            })
        } else {
            hold.plain_task(move || {
                let _mark = mark;
                dr.fetch_add(1, Ordering::SeqCst);
            })
        };
        drop(hold); // `shutdown_now` returned its tasks
        let runner = thread::spawn(move || {
            run.run();
            thread::current().id()
        });
        let dropper = thread::spawn(move || drop(dropped));
        let runner_id = runner.join().unwrap();
        dropper.join().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the run ran once");
        assert_eq!(
            dropped_ran.load(Ordering::SeqCst),
            0,
            "the dropped never ran"
        );
        assert_eq!(gone.load(Ordering::SeqCst), 1, "its closure was dropped");
        let last = initial.unwrap_or(FRESH) + 1;
        assert_eq!(released.states(), [(KEY, last)], "released once, final");
        count(&*counters, usize::from(released.thread() == runner_id));
    });
    assert_all_reached(&*seen, &["hook on the dropper", "hook on the runner"]);
}

#[test]
fn the_last_of_a_run_and_a_dropped_state_task_releases_once() {
    last_drop(Some(LENT), true);
}

#[test]
fn the_last_of_a_run_making_the_state_and_a_dropped_plain_task_releases_once() {
    last_drop(None, false);
}

#[test]
fn the_whole_hand_over_with_a_run_and_a_drop_releases_once() {
    static SEEN: [std::sync::atomic::AtomicUsize; 2] = counters!(2);
    loom::model(|| {
        let released = Arc::new(Released::default());
        let hooks = hooks(&released);
        let slot = Arc::new(Slot::new());
        let s = slot.clone();
        let worker = thread::spawn(move || worker_returns(&s, Some(LENT)));
        let hold = take_lent(&slot, KEY, &hooks);
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let run = hold.state_task(move |st| {
            r.fetch_add(1, Ordering::SeqCst);
            *st += 1;
        });
        let dropped = hold.plain_task(|| panic!("a dropped task never runs"));
        drop(hold);
        let runner = thread::spawn(move || {
            run.run();
            thread::current().id()
        });
        let dropper = thread::spawn(move || drop(dropped));
        let runner_id = runner.join().unwrap();
        dropper.join().unwrap();
        worker.join().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1, "ran exactly once");
        assert_eq!(slot.is(), SlotIs::Empty);
        assert_eq!(
            released.states(),
            [(KEY, LENT + 1)],
            "released once, as left"
        );
        count(&SEEN, usize::from(released.thread() == runner_id));
    });
    assert_all_reached(&SEEN, &["hook on the dropper", "hook on the runner"]);
}
