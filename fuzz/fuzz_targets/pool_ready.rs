//! The no-alloc pieces against simple models, on one thread:
//!
//! - `Pool<Box<u32>, 8>`: alloc / free / read, and pool nodes queued on a `Chain`, against a list
//!   of allocated slots (alloc succeeds iff fewer than `N` are out; no slot is handed out twice).
//! - `BoundedQueue<Box<u32>, 8>` and `BoundedQueue<Box<u32>, 2>` against a `VecDeque` with the same
//!   capacity, many times around the ring (positions wrap the cells).
//!
//! Values are boxed so that a value read twice (double free) or never dropped (leak) is caught by
//! the sanitizers, not only by the model.
#![no_main]

use std::collections::VecDeque;
use std::ptr::NonNull;

use arbitrary::Arbitrary;
use keyserial_core::chain::{Chain, Pushed};
use keyserial_core::pool::{Pool, PoolNode};
use keyserial_core::ready::BoundedQueue;
use libfuzzer_sys::fuzz_target;

const POOL: usize = 8;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    Alloc,
    /// Free the i-th allocated node (modulo the number allocated).
    Free(u8),
    /// Read the i-th allocated node's value in place.
    Read(u8),
    /// Move the i-th allocated node onto the chain.
    ChainPush(u8),
    /// Pop the chain's oldest node back into the allocated list.
    ChainPop,
    /// Push onto queue 0 (capacity 8) or 1 (capacity 2).
    QPush(bool),
    QPop(bool),
    /// Push then pop `n % 32` times on the big queue: walks the ring without filling it.
    QCycle(u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    ops: Vec<Op>,
}

struct Queues {
    big: BoundedQueue<Box<u32>, 8>,
    small: BoundedQueue<Box<u32>, 2>,
    model: [VecDeque<u32>; 2],
}

impl Queues {
    fn push(&mut self, small: bool, v: u32) {
        let i = usize::from(small);
        let cap = if small { 2 } else { 8 };
        let r = if small {
            self.small.push(Box::new(v))
        } else {
            self.big.push(Box::new(v))
        };
        match r {
            Ok(()) => {
                assert!(self.model[i].len() < cap, "push accepted past capacity");
                self.model[i].push_back(v);
            }
            Err(back) => {
                assert_eq!(self.model[i].len(), cap, "push refused below capacity");
                assert_eq!(*back, v, "refused value must come back untouched");
            }
        }
        self.check();
    }

    fn pop(&mut self, small: bool) {
        let i = usize::from(small);
        let got = if small {
            self.small.pop()
        } else {
            self.big.pop()
        };
        assert_eq!(
            got.map(|b| *b),
            self.model[i].pop_front(),
            "queue FIFO broken"
        );
        self.check();
    }

    fn check(&self) {
        assert_eq!(self.big.len(), self.model[0].len());
        assert_eq!(self.small.len(), self.model[1].len());
        assert_eq!(self.big.is_empty(), self.model[0].is_empty());
        assert_eq!(self.small.is_empty(), self.model[1].is_empty());
    }
}

fuzz_target!(|input: Input| {
    let pool: Pool<Box<u32>, POOL> = Pool::new();
    assert_eq!(pool.capacity(), POOL);
    let chain: Chain<PoolNode<Box<u32>>> = Chain::new();
    // Allocated and not on the chain: (node, value).
    let mut out: Vec<(NonNull<PoolNode<Box<u32>>>, u32)> = Vec::new();
    // On the chain, oldest first.
    let mut queued: VecDeque<(NonNull<PoolNode<Box<u32>>>, u32)> = VecDeque::new();
    let mut chain_owned = false;
    let mut q = Queues {
        big: BoundedQueue::new(),
        small: BoundedQueue::new(),
        model: [VecDeque::new(), VecDeque::new()],
    };
    let mut next = 0u32;

    for &op in input.ops.iter().take(4096) {
        match op {
            Op::Alloc => {
                next += 1;
                let allocated = out.len() + queued.len();
                match pool.alloc(Box::new(next)) {
                    Ok(node) => {
                        assert!(allocated < POOL, "alloc succeeded with every slot in use");
                        let all = out.iter().chain(queued.iter());
                        assert!(all.map(|e| e.0).all(|n| n != node), "slot handed out twice");
                        // SAFETY: just allocated.
                        assert_eq!(**unsafe { PoolNode::value(node) }, next);
                        out.push((node, next));
                    }
                    Err(back) => {
                        assert_eq!(allocated, POOL, "alloc failed with a free slot");
                        assert_eq!(*back, next);
                    }
                }
            }
            Op::Free(i) if !out.is_empty() => {
                let (node, v) = out.swap_remove(usize::from(i) % out.len());
                // SAFETY: allocated from this pool, not queued, never used again.
                assert_eq!(*unsafe { pool.free(node) }, v);
            }
            Op::Read(i) if !out.is_empty() => {
                let (node, v) = out[usize::from(i) % out.len()];
                // SAFETY: allocated and owned by us.
                assert_eq!(**unsafe { PoolNode::value(node) }, v);
            }
            Op::ChainPush(i) if !out.is_empty() => {
                let (node, v) = out.swap_remove(usize::from(i) % out.len());
                // SAFETY: allocated from this pool, owned by us (removed from `out`), and
                // untouched while queued; the pool outlives the chain.
                let p = unsafe { chain.push(node) }.expect("the chain is never retired here");
                assert_eq!(p == Pushed::Activated, !chain_owned);
                chain_owned = true;
                queued.push_back((node, v));
            }
            Op::ChainPop if chain_owned => {
                // SAFETY: we activated the chain and have not released it.
                match unsafe { chain.pop() } {
                    Some(node) => {
                        let (want, v) = queued.pop_front().expect("chain had more than the model");
                        assert_eq!(node, want, "chain order broken");
                        // SAFETY: popped: ours.
                        assert_eq!(**unsafe { PoolNode::value(node) }, v);
                        out.push((node, v));
                    }
                    None => {
                        assert!(queued.is_empty(), "chain lost nodes");
                        // SAFETY: owner.
                        assert!(unsafe { chain.try_release() });
                        chain_owned = false;
                    }
                }
            }
            Op::QPush(small) => {
                next += 1;
                q.push(small, next);
            }
            Op::QPop(small) => q.pop(small),
            Op::QCycle(n) => {
                for _ in 0..n % 32 {
                    next += 1;
                    q.push(false, next);
                    q.pop(false);
                }
            }
            _ => {}
        }
    }

    // Drain the chain into the allocated list, then free everything: the pool is full again.
    if chain_owned {
        // SAFETY: owner.
        while let Some(node) = unsafe { chain.pop() } {
            let (want, v) = queued.pop_front().expect("chain had more than the model");
            assert_eq!(node, want);
            out.push((node, v));
        }
        // SAFETY: owner.
        assert!(unsafe { chain.try_release() });
    }
    assert!(queued.is_empty());
    for (node, v) in out.drain(..) {
        // SAFETY: allocated from this pool, not queued.
        assert_eq!(*unsafe { pool.free(node) }, v);
    }
    let again: Vec<_> = (0..POOL as u32)
        .map(|i| pool.alloc(Box::new(i)).unwrap())
        .collect();
    assert!(pool.alloc(Box::new(0)).is_err(), "more than N slots");
    for n in again {
        // SAFETY: as above.
        drop(unsafe { pool.free(n) });
    }
    // The queues are dropped with values inside: their destructors free them (LeakSanitizer).
    drop(q);
});
