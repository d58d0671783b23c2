//! Loom model of a key's state being released while a new state task of the same key arrives
//! (`std-executor/src/state.rs` and `idle.rs`, `reap_with_state`), over the real core `Chain`:
//! the releaser claims the idle chain, takes the state, "calls the hook" (records the value),
//! then retires the chain from owned, or, if a task came meanwhile, hands the chain to a worker
//! (here: drains it itself). A router pushes a state task, draining the chain if its push
//! activated it; the task makes the state if there is none and adds to it. The state lives in a
//! loom `UnsafeCell`, so any access outside the baton is a reported race.
//!
//! Checked in every interleaving: the old state goes through the hook exactly once and before
//! the new state is made, the task runs exactly once (or is bounced by the retired chain, as
//! the executor then takes the key's new entry), and nothing is touched after the retire.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

use keyserial_core::chain::{BoxNode, Chain, Pushed};

struct Key {
    chain: Chain<BoxNode<u32>>,
    state: UnsafeCell<Option<u32>>,
    /// What happened, in order: "release N", "init", "task".
    log: Mutex<Vec<String>>,
    holders: AtomicUsize,
}

impl Key {
    fn hold(&self) {
        assert_eq!(
            self.holders.fetch_add(1, Ordering::SeqCst),
            0,
            "two holders"
        );
    }
    fn unhold(&self) {
        self.holders.fetch_sub(1, Ordering::SeqCst);
    }
    fn log(&self, s: String) {
        self.log.lock().unwrap().push(s);
    }

    /// The chain's owner runs what is queued (state tasks), then releases it.
    fn drain(&self) {
        loop {
            // SAFETY: we hold the baton.
            match unsafe { self.chain.pop_value() } {
                Some(add) => self.state.with_mut(|s| {
                    // SAFETY: the baton makes the state ours.
                    let s = unsafe { &mut *s };
                    if s.is_none() {
                        self.log("init".into());
                        *s = Some(0);
                    }
                    *s.as_mut().unwrap() += add;
                    self.log("task".into());
                }),
                None => {
                    self.unhold();
                    // SAFETY: we held the baton.
                    if unsafe { self.chain.try_release() } {
                        return;
                    }
                    self.hold();
                    thread::yield_now();
                }
            }
        }
    }
}

#[test]
fn a_release_racing_a_new_state_task_of_the_same_key() {
    loom::model(|| {
        let k = Arc::new(Key {
            chain: Chain::new(),
            state: UnsafeCell::new(Some(5)), // the old life's state
            log: Mutex::new(Vec::new()),
            holders: AtomicUsize::new(0),
        });
        let r = k.clone();
        let releaser = thread::spawn(move || {
            if !r.chain.try_claim() {
                return false; // active: not released now
            }
            r.hold();
            // SAFETY: the claim gave us the baton.
            let old = r.state.with_mut(|s| unsafe { (*s).take() });
            if let Some(v) = old {
                r.log(format!("release {v}"));
            }
            r.unhold();
            // SAFETY: we still own the chain.
            if unsafe { r.chain.try_retire_owned() } {
                return true; // retired: nothing may touch the key any more
            }
            r.hold();
            r.drain(); // a task came during the hook: to a worker (us)
            false
        });
        let pushed = k.chain.push_value(1);
        match pushed {
            Ok(Pushed::Activated) => {
                k.hold();
                k.drain();
            }
            Ok(Pushed::Queued) => {} // behind the releaser's claim: it drains
            Err(_) => {}             // retired: the executor takes the key's new entry
        }
        let retired = releaser.join().unwrap();
        let log = k.log.lock().unwrap().clone();
        let released = log.iter().filter(|l| l.starts_with("release")).count();
        let tasks = log.iter().filter(|l| *l == "task").count();
        if pushed.is_err() {
            assert!(retired);
            assert_eq!(log, ["release 5"], "released once, the task bounced");
            return;
        }
        assert_eq!(tasks, 1, "the task ran exactly once: {log:?}");
        assert!(
            released <= 1,
            "the old state released at most once: {log:?}"
        );
        match log.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            // Released first; the task made a fresh state after the hook returned.
            ["release 5", "init", "task"] => assert!(!retired),
            // The task ran against the old state; then it was released and the key retired.
            ["task", "release 6"] => assert!(retired),
            // The releaser found the chain busy: nothing released, the key lives on.
            ["task"] => assert!(!retired),
            _ => panic!("unexpected: {log:?}"),
        }
        assert_eq!(k.holders.load(Ordering::SeqCst), 0);
    });
}
