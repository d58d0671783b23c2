//! `Chain<BoxNode<(bool, u32)>>` against a sequential model, on one thread.
//!
//! The model is a FIFO of the values queued (pushed, not popped), the owner baton, the retired
//! flag and the one node the owner popped and may still `unpop`. Owner-only methods are called
//! only while the model says this thread holds the baton. After every step the chain's snapshot
//! predicates must agree with the model.
#![no_main]

use std::collections::VecDeque;
use std::ptr::NonNull;

use arbitrary::Arbitrary;
use keyserial_core::chain::{BoxNode, Chain, Pushed, Retired};
use libfuzzer_sys::fuzz_target;

type Node = BoxNode<(bool, u32)>;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    /// Push a value; `true` marks it coalescing (a `submit_latest` task).
    Push(bool),
    /// Push several values in a row (cheap way to build long queues).
    PushMany(u8, bool),
    Pop,
    Peek,
    /// Put the node held from the last pop back at the front.
    Unpop,
    PopCoalescing,
    TryRelease,
    TryRetire,
    /// Free the held node (the "task ran").
    Finish,
}

#[derive(Arbitrary, Debug)]
struct Input {
    ops: Vec<Op>,
    /// At the end: drain and release (true) or drop the chain with whatever is queued (false).
    drain_at_end: bool,
}

struct Model {
    queue: VecDeque<(bool, u32)>,
    owned: bool,
    retired: bool,
    /// The node most recently popped by the current owner, not freed or unpopped yet.
    held: Option<(NonNull<Node>, (bool, u32))>,
    next_id: u32,
}

fn coalescing(n: NonNull<Node>) -> bool {
    // SAFETY: the chain calls this only with nodes it owns (popped or queued), all live.
    unsafe { n.as_ref() }.value.0
}

impl Model {
    fn check(&self, chain: &Chain<Node>) {
        assert_eq!(chain.is_retired(), self.retired, "is_retired disagrees");
        assert_eq!(chain.is_active(), self.owned, "is_active disagrees");
        assert_eq!(
            chain.is_idle(),
            !self.owned && !self.retired,
            "is_idle disagrees"
        );
        if !self.owned {
            assert!(
                self.queue.is_empty(),
                "model: unowned chain with queued values"
            );
        }
    }

    fn finish_held(&mut self) {
        if let Some((node, v)) = self.held.take() {
            // SAFETY: a popped node is exclusively ours and came from `BoxNode::new`.
            let got = unsafe { BoxNode::into_value(node) };
            assert_eq!(got, v);
        }
    }

    fn push(&mut self, chain: &Chain<Node>, latest: bool) {
        let v = (latest, self.next_id);
        self.next_id += 1;
        match chain.push_value(v) {
            Err(Retired(back)) => {
                assert!(self.retired, "push refused on a live chain");
                assert_eq!(back, v, "refused push must hand back the value untouched");
            }
            Ok(p) => {
                assert!(!self.retired, "push accepted after retire");
                let expect = if self.owned {
                    Pushed::Queued
                } else {
                    Pushed::Activated
                };
                assert_eq!(p, expect, "Activated exactly when the chain was idle");
                self.owned = true;
                self.queue.push_back(v);
            }
        }
    }

    fn step(&mut self, chain: &Chain<Node>, op: Op) {
        match op {
            Op::Push(latest) => self.push(chain, latest),
            Op::PushMany(n, latest) => {
                for i in 0..(n % 16) {
                    self.push(chain, latest ^ (i % 3 == 2));
                }
            }
            Op::Pop if self.owned => {
                self.finish_held();
                // SAFETY: the model says this thread owns the chain.
                let got = unsafe { chain.pop() };
                match (got, self.queue.pop_front()) {
                    (None, None) => {}
                    (Some(n), Some(v)) => {
                        // SAFETY: popped: ours until freed.
                        assert_eq!(unsafe { n.as_ref() }.value, v, "FIFO order broken");
                        self.held = Some((n, v));
                    }
                    (g, m) => panic!("pop returned {:?}, model expected {m:?}", g.is_some()),
                }
            }
            Op::Peek if self.owned => {
                // SAFETY: owner.
                let got = unsafe { chain.peek() };
                // SAFETY: a peeked node stays valid while queued.
                let got = got.map(|n| unsafe { n.as_ref() }.value);
                assert_eq!(got, self.queue.front().copied(), "peek disagrees");
            }
            Op::Unpop if self.owned => {
                if let Some((node, v)) = self.held.take() {
                    // SAFETY: owner; `node` is the node most recently popped by this owner.
                    unsafe { chain.unpop(node) };
                    self.queue.push_front(v);
                }
            }
            Op::PopCoalescing if self.owned => {
                self.finish_held();
                // SAFETY: owner.
                let got = unsafe { chain.pop_coalescing(coalescing) };
                let expect = self.queue.pop_front();
                match (got, expect) {
                    (None, None) => {}
                    (Some(p), Some(v)) => {
                        // SAFETY: popped: ours until freed.
                        assert_eq!(unsafe { p.node.as_ref() }.value, v, "FIFO order broken");
                        let superseded = v.0 && self.queue.front().is_some_and(|n| n.0);
                        assert_eq!(
                            p.superseded,
                            superseded,
                            "superseded flag wrong for {v:?}, next {:?}",
                            self.queue.front()
                        );
                        self.held = Some((p.node, v));
                    }
                    (g, m) => panic!("pop_coalescing returned {:?}, model {m:?}", g.is_some()),
                }
            }
            Op::TryRelease if self.owned => {
                // SAFETY: owner.
                let released = unsafe { chain.try_release() };
                assert_eq!(
                    released,
                    self.queue.is_empty(),
                    "release iff nothing queued"
                );
                if released {
                    self.owned = false;
                    // No longer the owner: the held node can only be finished now.
                    self.finish_held();
                }
            }
            Op::TryRetire => {
                let retired = chain.try_retire();
                assert_eq!(
                    retired,
                    !self.owned && !self.retired,
                    "retire only from idle"
                );
                if retired {
                    self.retired = true;
                }
            }
            Op::Finish => self.finish_held(),
            // Owner-only operation while the model does not own the chain: skip.
            _ => {}
        }
        self.check(chain);
    }
}

fuzz_target!(|input: Input| {
    let chain: Chain<Node> = Chain::new();
    let mut m = Model {
        queue: VecDeque::new(),
        owned: false,
        retired: false,
        held: None,
        next_id: 0,
    };
    m.check(&chain);
    for &op in input.ops.iter().take(1024) {
        m.step(&chain, op);
    }
    m.finish_held();
    if input.drain_at_end && m.owned {
        // Nothing lost: everything the model has queued comes out, in order.
        // SAFETY: owner.
        while let Some(v) = unsafe { chain.pop_value() } {
            assert_eq!(Some(v), m.queue.pop_front(), "drain order");
        }
        assert!(m.queue.is_empty(), "values lost: {:?}", m.queue);
        // SAFETY: owner.
        assert!(unsafe { chain.try_release() });
        m.owned = false;
        m.check(&chain);
    }
    // Otherwise the chain is dropped with queued nodes (from its owner cursor and/or `first`): the
    // destructor must free every one (LeakSanitizer checks).
    drop(chain);
});
