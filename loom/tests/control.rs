//! Loom models of pausing a key (`std-executor/src/control.rs`, its protocol, and the steps of
//! `key_control.rs`), over the real `Control`, the real core `Chain` and the real wait registry:
//! a worker drains the chain (and puts a popped task back and parks when it finds the key
//! paused), `pause` marks the key and parks an idle chain it claims, `resume` grants the parked
//! chain's wait (the granter then drains, standing in for the worker that picks it up), a router
//! pushes a task (draining if its push activated the chain), and an idle reaper either retires
//! the idle chain or, finding the key paused, claims and parks it.
//!
//! Checked in every interleaving: the chain's baton has at most one holder at a time and is
//! never lost; a task pushed after `pause` returned does not run before a `resume`; every task
//! runs exactly once in push order once the key is resumed; a paused key is never retired
//! behind a pauser's back; and a resume racing `shutdown_now`'s steal of the parked chain hands
//! it to exactly one of them.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

use keyserial::loom_api::{Control, Resumed, WaitRegistry};
use keyserial_core::chain::{BoxNode, Chain, Pushed};

#[derive(Default)]
struct Model {
    control: Control,
    chain: Chain<BoxNode<u32>>,
    waits: WaitRegistry<u32>,
    /// Threads holding the baton right now.
    holders: AtomicUsize,
    /// The tasks that ran, in order.
    ran: Mutex<Vec<u32>>,
    /// A task pushed after a `pause` returned (and before any `resume`) ran.
    ran_while_paused: AtomicBool,
    /// Set by the pauser once `pause` returned (no resume in that model).
    paused_for_good: AtomicBool,
}

/// How `pause` left the chain.
#[derive(Debug, PartialEq, Eq)]
enum Paused {
    /// It claimed the idle chain and parked it (or drained it: resumed meanwhile).
    Claimed,
    /// The chain was owned: its holder parks it.
    Owned,
    /// The chain was retired under it (the executor starts over on the key's new entry).
    SawRetired,
}

impl Model {
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

    /// By the baton's holder: parks if paused (`key_control::park`).
    fn park(&self) -> bool {
        // Given up before the registration can be granted to someone else.
        self.unhold();
        if self.control.park(|| self.waits.register(0).id()) {
            return true;
        }
        self.hold();
        false
    }

    /// The holder drains (`worker/chain.rs`, `run_chain`), holding the baton on entry.
    fn drain(&self) {
        loop {
            // SAFETY: we hold the baton.
            match unsafe { self.chain.pop_value() } {
                Some(v) => {
                    if self.control.is_paused() {
                        // SAFETY: we hold the baton; the node is the one just popped.
                        unsafe { self.chain.unpop(BoxNode::new(v)) };
                        if self.park() {
                            return;
                        }
                        continue;
                    }
                    if v >= 100 && self.paused_for_good.load(Ordering::SeqCst) {
                        self.ran_while_paused.store(true, Ordering::SeqCst);
                    }
                    self.ran.lock().unwrap().push(v);
                }
                None => {
                    if self.control.is_paused() && self.park() {
                        return;
                    }
                    self.unhold();
                    // SAFETY: we held the baton.
                    if unsafe { self.chain.try_release() } {
                        return;
                    }
                    self.hold();
                    thread::yield_now(); // a push between its two steps
                }
            }
        }
    }

    /// `key_control::pause` on one entry.
    fn pause(&self) -> Paused {
        self.control.pause();
        if self.chain.try_claim() {
            self.hold();
            if !self.park() {
                self.drain(); // resumed meanwhile: scheduled (here: drained by us)
            }
            return Paused::Claimed;
        }
        if self.chain.is_retired() {
            Paused::SawRetired
        } else {
            Paused::Owned
        }
    }

    /// `key_control::resume`: the grant's winner schedules (here: drains).
    fn resume(&self) {
        if let Resumed::Parked(id) = self.control.resume() {
            if let Some(w) = self.waits.get(id) {
                let mut won = false;
                self.waits.grant(&w, |_| won = true);
                if won {
                    self.hold();
                    self.drain();
                }
            }
        }
    }

    /// A router pushes task `v`; an activating push schedules (here: drains).
    fn submit(&self, v: u32) {
        match self.chain.push_value(v) {
            Ok(Pushed::Activated) => {
                self.hold();
                self.drain();
            }
            Ok(Pushed::Queued) => {}
            Err(_) => panic!("pushed onto a retired chain"),
        }
    }

    fn ran(&self) -> Vec<u32> {
        self.ran.lock().unwrap().clone()
    }

    /// After the model: nothing holds the baton, nothing is parked, the chain is idle.
    fn assert_settled(&self) {
        assert_eq!(self.holders.load(Ordering::SeqCst), 0);
        assert!(self.waits.is_empty(), "a parked wait was left behind");
        assert!(self.chain.is_idle() || self.chain.is_retired());
    }
}

/// A model whose chain is owned by the main thread with `tasks` queued (as a worker that just
/// took it from a ready queue).
fn owned_with(tasks: &[u32]) -> Arc<Model> {
    let m = Arc::new(Model::default());
    for &t in tasks {
        let _ = m.chain.push_value(t);
    }
    m
}

#[test]
fn a_task_pushed_after_pause_returned_waits_for_resume() {
    loom::model(|| {
        let m = owned_with(&[0]);
        m.hold();
        let p = m.clone();
        let pauser = thread::spawn(move || {
            p.pause();
            p.paused_for_good.store(true, Ordering::SeqCst);
            p.submit(100); // after pause returned, as a router would route it
        });
        m.drain();
        pauser.join().unwrap();
        assert!(!m.ran_while_paused.load(Ordering::SeqCst));
        assert!(!m.ran().contains(&100), "ran before resume");
        // Whoever held the chain last parked it: resuming runs the held task once.
        assert_eq!(
            m.waits.len(),
            1,
            "the paused key's chain is parked exactly once"
        );
        m.resume();
        assert_eq!(m.ran(), [0, 100]);
        m.assert_settled();
    });
}

#[test]
fn pause_racing_resume_and_a_drain_loses_and_doubles_nothing() {
    loom::model(|| {
        let m = owned_with(&[0, 1]);
        m.hold();
        let (p, r) = (m.clone(), m.clone());
        let pauser = thread::spawn(move || {
            p.pause();
        });
        let resumer = thread::spawn(move || r.resume());
        m.drain();
        pauser.join().unwrap();
        resumer.join().unwrap();
        // The resume may have come before the pause: resume once more.
        m.resume();
        assert_eq!(m.ran(), [0, 1]);
        m.assert_settled();
    });
}

#[test]
fn pause_of_an_idle_key_racing_an_activating_push() {
    loom::model(|| {
        let m = Arc::new(Model::default());
        let p = m.clone();
        let pauser = thread::spawn(move || {
            assert_ne!(p.pause(), Paused::SawRetired);
        });
        m.submit(0);
        pauser.join().unwrap();
        // The key is paused: the task did not run, or ran before the pause took effect.
        let before = m.ran();
        assert!(before.is_empty() || before == [0]);
        m.resume();
        assert_eq!(m.ran(), [0]);
        m.assert_settled();
    });
}

#[test]
fn an_idle_reaper_never_retires_a_key_behind_a_pausers_back() {
    loom::model(|| {
        let m = Arc::new(Model::default());
        let p = m.clone();
        let pauser = thread::spawn(move || p.pause());
        // The reaper of the idle key (`idle.rs`): retire unless paused; a paused idle key is
        // claimed and parked instead.
        let retired = if m.control.may_retire() {
            m.chain.try_retire()
        } else {
            if m.chain.try_claim() {
                m.hold();
                if !m.park() {
                    m.drain();
                }
            }
            false
        };
        let paused = pauser.join().unwrap();
        if retired {
            assert_eq!(
                paused,
                Paused::SawRetired,
                "a pause was lost with a retired key"
            );
        } else {
            assert_eq!(m.waits.len(), 1, "the paused idle key is parked");
            m.resume();
            m.assert_settled();
        }
    });
}

#[test]
fn resume_racing_shutdown_now_hands_the_parked_chain_to_exactly_one() {
    loom::model(|| {
        let m = owned_with(&[0]);
        m.hold();
        m.control.pause();
        m.drain(); // parks at once: the key was paused before the pop
        assert_eq!(m.waits.len(), 1);
        let r = m.clone();
        let resumer = thread::spawn(move || r.resume());
        let mut stolen = 0;
        m.waits.steal_all(|_| stolen += 1);
        if stolen == 1 {
            // shutdown_now holds the baton: it drains what the chain holds and hands it back.
            m.control.forget_wait();
            m.hold();
            // SAFETY: the steal gave us the baton.
            let back = unsafe { m.chain.pop_value() };
            assert_eq!(back, Some(0));
            m.unhold();
            // SAFETY: as above.
            assert!(unsafe { m.chain.try_release() });
        }
        resumer.join().unwrap();
        let ran = m.ran();
        match stolen {
            1 => assert!(ran.is_empty(), "a stolen chain's task also ran"),
            _ => assert_eq!(ran, [0]),
        }
        m.assert_settled();
    });
}

/// `cancel_key` on the model (`serializer/keys.rs` and `key_control::hold_chain`): hold the
/// key, wait until the chain is parked (then steal the wait) or idle (then claim it), take what
/// it holds, let go and give the chain back. Returns the tasks it took.
fn cancel(m: &Model) -> Vec<u32> {
    m.control.hold();
    loop {
        if let Some(id) = m.control.wait_id() {
            if let Some(w) = m.waits.get(id) {
                if m.waits.steal_one(&w) {
                    m.control.forget_wait();
                    break;
                }
            }
        } else if m.chain.try_claim() {
            break;
        }
        thread::yield_now(); // the chain's owner is inside a task, or a grant is on its way
    }
    m.hold();
    let mut taken = Vec::new();
    // SAFETY: we hold the baton.
    while let Some(v) = unsafe { m.chain.pop_value() } {
        taken.push(v);
    }
    m.control.unhold();
    // Given back: parked if the key is still paused by someone, else drained (empty).
    if !m.park() {
        m.drain();
    }
    taken
}

#[test]
fn cancel_key_racing_a_worker_draining_the_chain_takes_each_task_once() {
    loom::model(|| {
        let m = owned_with(&[0, 1]);
        m.hold();
        let c = m.clone();
        let canceller = thread::spawn(move || cancel(&c));
        m.drain();
        let taken = canceller.join().unwrap();
        let ran = m.ran();
        // Each task ran or was taken, exactly once, and what ran came first (in order).
        let mut all: Vec<u32> = ran.iter().chain(&taken).copied().collect();
        assert_eq!(all, [0, 1], "ran {ran:?}, taken {taken:?}");
        all.sort_unstable();
        m.assert_settled();
    });
}

#[test]
fn cancel_key_racing_a_push_and_a_resume_of_a_paused_key() {
    loom::model(|| {
        let m = Arc::new(Model::default());
        m.pause();
        let (c, r) = (m.clone(), m.clone());
        let canceller = thread::spawn(move || cancel(&c));
        let resumer = thread::spawn(move || r.resume());
        m.submit(0);
        let taken = canceller.join().unwrap();
        resumer.join().unwrap();
        let ran = m.ran();
        let mut all: Vec<u32> = ran.iter().chain(&taken).copied().collect();
        all.sort_unstable();
        assert!(all.is_empty() || all == [0], "ran {ran:?}, taken {taken:?}");
        // If the task is neither run nor taken, it waits on the chain parked by a pause the
        // resume came before: resuming again runs it.
        if all.is_empty() {
            m.resume();
            assert_eq!(m.ran(), [0]);
        }
        m.assert_settled();
    });
}

#[test]
fn a_release_with_key_state_never_retires_a_key_behind_a_pausers_back() {
    // The idle release of a key with state (`idle.rs`, `reap_with_state`): claim the idle
    // chain, release the state (here: nothing to model), then retire from owned under the
    // control lock unless paused (`Control::retire_unless_paused`), else park the chain.
    loom::model(|| {
        let m = Arc::new(Model::default());
        let p = m.clone();
        let pauser = thread::spawn(move || p.pause());
        let mut retired = false;
        if m.chain.try_claim() {
            m.hold();
            // SAFETY (inside the closure): we own the chain (claimed above).
            match m
                .control
                .retire_unless_paused(|| unsafe { m.chain.try_retire_owned() })
            {
                Some(true) => {
                    m.unhold();
                    retired = true;
                }
                Some(false) => m.drain(),
                None => {
                    if !m.park() {
                        m.drain();
                    }
                }
            }
        }
        let paused = pauser.join().unwrap();
        if retired {
            assert_eq!(
                paused,
                Paused::SawRetired,
                "a pause was lost with a retired key"
            );
        } else {
            assert_eq!(m.waits.len(), 1, "the paused key's chain is parked");
            m.resume();
            m.assert_settled();
        }
    });
}
