//! Loom models of the no-allocator serializer (core/src/fixed): the key table's insert descriptor,
//! pins and slot reuse, the ready ring, over the real code through core's `sync` facade.
//!
//! In the models with a runner thread, the submit runs on the main thread, so first; when it
//! finds the key table full it has only loaded the table's words, and loom 0.7 can hide a load
//! that a later thread's load-then-write follows (it keeps only the last access of each atomic
//! for its race check, tokio-rs/loom#392). Coverage counters (std statics, outside the model)
//! check that both outcomes of each raced submit were reached.
#![cfg(loom)]

use std::sync::atomic::AtomicUsize as StdAtomicUsize;
use std::sync::atomic::Ordering as StdOrdering;

use keyserial_core::fixed::{FixedSerializer, RefuseReason};
use loom::sync::Arc;
use loom::thread;

fn drain<const K: usize, const T: usize>(s: &FixedSerializer<u8, u8, K, T>) -> Vec<(u8, u8)> {
    let mut out = Vec::new();
    while s.run(4, |k, t| out.push((*k, t))) > 0 {}
    out
}

/// Counts a raced submit's outcome: `[refused, accepted]`.
fn count(outcomes: &[StdAtomicUsize; 2], accepted: bool) {
    outcomes[usize::from(accepted)].fetch_add(1, StdOrdering::Relaxed);
}

/// Both outcomes of the raced submit were reached.
fn assert_both(outcomes: &[StdAtomicUsize; 2]) {
    let [refused, accepted] = outcomes.each_ref().map(|o| o.load(StdOrdering::Relaxed));
    assert!(
        refused > 0 && accepted > 0,
        "the submit was refused in {refused} and accepted in {accepted} executions: one side unexplored"
    );
}

/// A key's last task retires its slot while another thread inserts a new key, which can only get
/// a slot once the old one is freed (KEYS = 1): reuse must not mix the keys or lose a task.
#[test]
fn insert_racing_retire_and_slot_reuse() {
    static OUTCOMES: [StdAtomicUsize; 2] = [StdAtomicUsize::new(0), StdAtomicUsize::new(0)];
    loom::model(|| {
        let s = Arc::new(FixedSerializer::<u8, u8, 1, 2>::new());
        s.submit(1, 10).unwrap();
        let runner = {
            let s = s.clone();
            thread::spawn(move || {
                let mut seen = Vec::new();
                s.run(1, |k, t| seen.push((*k, t)));
                seen
            })
        };
        let inserted = s.submit(2, 20);
        let mut seen = runner.join().unwrap();
        seen.extend(drain(&s));
        count(&OUTCOMES, inserted.is_ok());
        match inserted {
            Ok(()) => {
                seen.sort();
                assert_eq!(seen, [(1, 10), (2, 20)]);
            }
            Err(refused) => {
                assert_eq!((refused.reason, refused.task), (RefuseReason::KeysFull, 20));
                assert_eq!(seen, [(1, 10)]);
            }
        }
        assert_eq!((s.queued(), s.live_keys()), (0, 0));
        // The slot is reusable afterwards.
        s.submit(3, 30).unwrap();
        assert_eq!(drain(&s), [(3, 30)]);
    });
    assert_both(&OUTCOMES);
}

/// Two submitters of one new key (room for two keys): exactly one slot, one chain, both tasks in
/// it, in the order their submits took effect.
#[test]
fn two_submitters_of_one_new_key() {
    loom::model(|| {
        let s = Arc::new(FixedSerializer::<u8, u8, 2, 2>::new());
        let other = {
            let s = s.clone();
            thread::spawn(move || s.submit(7, 2).unwrap())
        };
        s.submit(7, 1).unwrap();
        other.join().unwrap();
        assert_eq!(s.live_keys(), 1);
        let mut seen = Vec::new();
        // One chain holds both: a single turn with budget 2 runs them.
        assert_eq!(s.run(2, |k, t| seen.push((*k, t))), 2);
        seen.sort();
        assert_eq!(seen, [(7, 1), (7, 2)]);
        assert_eq!((s.queued(), s.live_keys()), (0, 0));
    });
}

/// `run` finishes a key's last task and releases/retires it while a submit of the same key comes
/// in: the new task runs exactly once, after the old one, whether it joined the old chain or
/// made the key live again.
#[test]
fn run_racing_submit_on_an_emptying_key() {
    static OUTCOMES: [StdAtomicUsize; 2] = [StdAtomicUsize::new(0), StdAtomicUsize::new(0)];
    loom::model(|| {
        let s = Arc::new(FixedSerializer::<u8, u8, 1, 2>::new());
        s.submit(1, 10).unwrap();
        let runner = {
            let s = s.clone();
            thread::spawn(move || {
                let mut seen = Vec::new();
                s.run(2, |k, t| seen.push((*k, t)));
                seen
            })
        };
        let submitted = s.submit(1, 11);
        let mut seen = runner.join().unwrap();
        seen.extend(drain(&s));
        count(&OUTCOMES, submitted.is_ok());
        match submitted {
            Ok(()) => assert_eq!(seen, [(1, 10), (1, 11)]),
            // Documented transient: the runner still pinned the retired slot while we looked.
            Err(refused) => {
                assert_eq!(refused.reason, RefuseReason::KeysFull);
                assert_eq!(seen, [(1, 10)]);
            }
        }
        assert_eq!((s.queued(), s.live_keys()), (0, 0));
    });
    assert_both(&OUTCOMES);
}
