//! Loom models of the chain handoff (core/src/chain.rs), over the real code.
#![cfg(loom)]

use keyserial_core::chain::{BoxNode, Chain, Pushed, Retired};
use loom::sync::Arc;
use loom::thread;

type C = Chain<BoxNode<u32>>;

/// Drains everything while owning the chain, then releases; returns what it took.
fn drain_and_release(c: &C) -> Vec<u32> {
    let mut out = Vec::new();
    loop {
        // SAFETY: the caller owns the chain.
        unsafe {
            while let Some(v) = c.pop_value() {
                out.push(v);
            }
            if c.try_release() {
                return out;
            }
        }
    }
}

#[test]
fn two_pushers_on_an_idle_chain_exactly_one_schedules() {
    loom::model(|| {
        let c = Arc::new(C::new());
        let pushers: Vec<_> = (0..2)
            .map(|i| {
                let c = c.clone();
                thread::spawn(move || c.push_value(i).unwrap() == Pushed::Activated)
            })
            .collect();
        let activations: usize = pushers
            .into_iter()
            .map(|h| h.join().unwrap() as usize)
            .sum();
        assert_eq!(activations, 1);
        let mut got = drain_and_release(&c);
        got.sort();
        assert_eq!(got, [0, 1]);
        assert!(c.is_idle());
    });
}

#[test]
fn push_racing_the_drainers_release_is_never_stranded() {
    loom::model(|| {
        let c = Arc::new(C::new());
        assert_eq!(c.push_value(0), Ok(Pushed::Activated)); // this thread owns the chain
        let c2 = c.clone();
        let pusher = thread::spawn(move || c2.push_value(1).unwrap());
        let mut got = drain_and_release(&c);
        if pusher.join().unwrap() == Pushed::Activated {
            // The push landed after the release: the pusher owns the chain and must drain it.
            got.extend(drain_and_release(&c));
        }
        assert_eq!(got, [0, 1], "both tasks taken, in push order");
        assert!(c.is_idle());
    });
}

#[test]
fn owner_hands_off_to_a_second_drainer_without_double_drain() {
    // Two pushers race the owner; whoever activates drains on its own thread. A per-chain
    // "draining" flag catches two drainers at once.
    loom::model(|| {
        use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let c = Arc::new(C::new());
        let draining = Arc::new(AtomicBool::new(false));
        let taken = Arc::new(AtomicUsize::new(0));
        let run = |c: Arc<C>, draining: Arc<AtomicBool>, taken: Arc<AtomicUsize>, v: u32| {
            move || {
                if c.push_value(v).unwrap() == Pushed::Activated {
                    assert!(!draining.swap(true, Ordering::AcqRel), "two drainers");
                    let mut n = 0;
                    loop {
                        // SAFETY: the activating push made this thread the owner.
                        unsafe {
                            while c.pop_value().is_some() {
                                n += 1;
                            }
                            draining.store(false, Ordering::Release);
                            if c.try_release() {
                                break;
                            }
                            assert!(!draining.swap(true, Ordering::AcqRel), "two drainers");
                        }
                    }
                    taken.fetch_add(n, Ordering::AcqRel);
                }
            }
        };
        let a = thread::spawn(run(c.clone(), draining.clone(), taken.clone(), 1));
        let b = thread::spawn(run(c.clone(), draining.clone(), taken.clone(), 2));
        run(c.clone(), draining.clone(), taken.clone(), 3)();
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(
            taken.load(Ordering::Acquire),
            3,
            "every push taken exactly once"
        );
        assert!(c.is_idle());
    });
}

#[test]
fn push_racing_retire_never_lands_on_a_retired_chain() {
    loom::model(|| {
        let c = Arc::new(C::new());
        let c2 = c.clone();
        let pusher = thread::spawn(move || c2.push_value(7));
        let retired = c.try_retire();
        match (retired, pusher.join().unwrap()) {
            // Retire won: the push bounced with its task (the caller goes back to the table).
            (true, Err(Retired(7))) => assert!(c.is_retired()),
            // Push won: retire failed on a non-idle chain, and the pusher owns it.
            (false, Ok(Pushed::Activated)) => {
                assert_eq!(drain_and_release(&c), [7]);
                assert!(c.try_retire());
            }
            other => panic!("impossible outcome {other:?}"),
        }
    });
}

#[test]
fn retire_racing_an_owner_release_and_a_push() {
    // The owner releases while a pusher pushes and a third thread tries to retire: the task is
    // either drained or bounced, never stranded on a retired chain.
    loom::model(|| {
        let c = Arc::new(C::new());
        assert_eq!(c.push_value(0), Ok(Pushed::Activated));
        let (c1, c2) = (c.clone(), c.clone());
        let pusher = thread::spawn(move || c1.push_value(1));
        let retirer = thread::spawn(move || c2.try_retire());
        let mut got = drain_and_release(&c);
        let pushed = pusher.join().unwrap();
        let retired = retirer.join().unwrap();
        match pushed {
            Ok(Pushed::Activated) => got.extend(drain_and_release(&c)),
            Ok(Pushed::Queued) => {}
            Err(Retired(v)) => {
                assert!(retired);
                got.push(v); // bounced: the caller keeps it
            }
        }
        got.sort();
        assert_eq!(got, [0, 1]);
        if retired {
            assert!(c.is_retired());
        }
    });
}
