//! `FixedSerializer` against a sequential model, on one thread: submit, run with any budget,
//! re-entrant submit / run from inside a task, tasks that unwind.
//!
//! The model: per key a FIFO of queued tasks, a FIFO of ready keys, the set of keys whose turn is
//! running. A submit is refused with `TasksFull` when `TASKS` tasks are queued, with `KeysFull`
//! when the key is not live and `KEYS` keys are; a key becomes ready when its first task arrives
//! while it is neither queued nor running; a turn takes the first ready key, runs up to `budget`
//! tasks (including ones submitted meanwhile), then requeues the key at the back if tasks remain,
//! else frees it (also when a task unwinds). Every run's `(key, task)` sequence, every refusal,
//! `queued()` and `live_keys()` must match. Tasks are boxed so a double drop or a leak is caught
//! by the sanitizers.
#![no_main]

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};

use arbitrary::Arbitrary;
use keyserial_core::fixed::{FixedSerializer, RefuseReason};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Inner {
    Nothing,
    Submit(u8),
    Run(u8),
    Panic,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    Submit(u8),
    /// Run with `budget % 5`; at the first task, do `Inner`.
    Run(u8, Inner),
}

#[derive(Arbitrary, Debug)]
struct Input {
    small: bool,
    ops: Vec<Op>,
}

#[derive(Default)]
struct Model {
    queues: HashMap<u8, VecDeque<u32>>,
    ready: VecDeque<u8>,
    running: Vec<u8>,
    next: u32,
}

impl Model {
    fn queued(&self) -> usize {
        self.queues.values().map(VecDeque::len).sum()
    }
    fn is_live(&self, k: u8) -> bool {
        self.queues.get(&k).is_some_and(|q| !q.is_empty()) || self.running.contains(&k)
    }
    fn live(&self) -> usize {
        let mut keys: Vec<u8> = self
            .queues
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(k, _)| *k)
            .collect();
        keys.extend(self.running.iter().copied());
        keys.sort();
        keys.dedup();
        keys.len()
    }
}

struct Harness<'a, const K: usize, const T: usize> {
    s: &'a FixedSerializer<u8, Box<u32>, K, T>,
    m: Model,
}

impl<const K: usize, const T: usize> Harness<'_, K, T> {
    fn check_counts(&self) {
        assert_eq!(self.s.queued(), self.m.queued(), "queued");
        assert_eq!(self.s.live_keys(), self.m.live(), "live_keys");
    }

    fn submit(&mut self, key: u8) {
        let key = key % 6;
        let id = self.m.next;
        self.m.next += 1;
        let expect = if self.m.queued() == T {
            Some(RefuseReason::TasksFull)
        } else if !self.m.is_live(key) && self.m.live() == K {
            Some(RefuseReason::KeysFull)
        } else {
            None
        };
        match (self.s.submit(key, Box::new(id)), expect) {
            (Ok(()), None) => {
                let was_idle = !self.m.is_live(key);
                self.m.queues.entry(key).or_default().push_back(id);
                if was_idle {
                    self.m.ready.push_back(key);
                }
            }
            (Err(r), Some(reason)) => {
                assert_eq!(r.reason, reason);
                assert_eq!(*r.task, id, "the refused task comes back whole");
            }
            (got, want) => panic!(
                "submit({key}): got {:?}, want {want:?}",
                got.map_err(|r| r.reason)
            ),
        }
        self.check_counts();
    }

    fn run(&mut self, budget: u8, inner: Inner) {
        let budget = usize::from(budget % 5);
        let expected: Option<u8> = if budget == 0 {
            None
        } else {
            self.m.ready.pop_front()
        };
        let mut log: Vec<(u8, u32)> = Vec::new();
        let mut first = true;
        let h = &mut *self;
        let log_ref = &mut log;
        let result = catch_unwind(AssertUnwindSafe(|| {
            let log = log_ref;
            let s = h.s;
            if let Some(k) = expected {
                h.m.running.push(k);
            }
            s.run(budget, |key, task| {
                let k = expected.expect("ran although the model has nothing ready");
                assert_eq!(*key, k, "ready order");
                let want = h.m.queues.get_mut(&k).and_then(VecDeque::pop_front);
                assert_eq!(Some(*task), want, "per-key order");
                log.push((*key, *task));
                if std::mem::take(&mut first) {
                    match inner {
                        Inner::Nothing => {}
                        Inner::Submit(key) => h.submit(key),
                        Inner::Run(b) => h.run(b, Inner::Nothing),
                        // `resume_unwind` skips the panic hook (libfuzzer-sys aborts in it).
                        Inner::Panic => std::panic::resume_unwind(Box::new("task unwinds")),
                    }
                }
            })
        }));
        // End of the turn in the model: requeue if tasks remain, else the key is free.
        if let Some(k) = expected {
            self.m.running.retain(|r| *r != k);
            if self.m.queues.get(&k).is_some_and(|q| !q.is_empty()) {
                self.m.ready.push_back(k);
            }
        }
        match result {
            Ok(n) => {
                assert_eq!(n, log.len());
                assert!(n <= budget);
                if let Some(k) = expected {
                    // The turn ended early only because the key ran dry.
                    let left = self.m.queues.get(&k).map_or(0, VecDeque::len);
                    assert!(
                        n == budget || left == 0,
                        "turn ended with budget and tasks left"
                    );
                }
            }
            Err(_) => assert!(matches!(inner, Inner::Panic)),
        }
        self.check_counts();
    }
}

fn drive<const K: usize, const T: usize>(ops: &[Op]) {
    let s: FixedSerializer<u8, Box<u32>, K, T> = FixedSerializer::new();
    let mut h = Harness {
        s: &s,
        m: Model::default(),
    };
    for op in ops.iter().take(256) {
        match *op {
            Op::Submit(k) => h.submit(k),
            Op::Run(b, inner) => h.run(b, inner),
        }
    }
    // Drop with tasks still queued: the sanitizers check they are dropped once.
}

fuzz_target!(|input: Input| {
    if input.small {
        drive::<1, 2>(&input.ops);
    } else {
        drive::<3, 5>(&input.ops);
    }
});
