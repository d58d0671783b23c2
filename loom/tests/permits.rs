//! Loom models of the permit-wait hand-off (std-executor/src/permit_wait.rs, used by
//! std-executor/src/permits.rs), over the real `Handoff` word and `WaitRegistry`, reached through
//! the crate's `cfg(loom)`-only `loom_api` module.
//!
//! The serializer's side is played by stand-ins: a wait's value is a key id; the "chain's baton"
//! is an owner counter per key (a second owner fails the model); the semaphore's permit is a
//! count of free permits plus a count of permits stored in head tasks; the ready queue is a
//! lock-free slot array (a push fills a slot with a release store; the drain reads the slots with
//! plain acquire loads, so it can miss a push that does not happen-before it, as a drain of the
//! real crossbeam queues could). As in `permits.rs`, a grant callback already holds its permit when
//! it runs, and dropping it on a lost race gives it back.
//!
//! The models' own flags are set with RMWs, never plain stores (see `executor.rs`).
#![cfg(loom)]

use keyserial::loom_api::{PermitWait, WaitRegistry, Winner};
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// A multi-producer, single-consumer ready queue of key ids with room for `cap` pushes.
struct ReadyQueue {
    next: AtomicUsize,
    /// `key + 1`, or 0 while empty.
    slots: Vec<AtomicUsize>,
}

impl ReadyQueue {
    fn new(cap: usize) -> ReadyQueue {
        ReadyQueue {
            next: AtomicUsize::new(0),
            slots: (0..cap).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    fn push(&self, key: usize) {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.slots[i].store(key + 1, Ordering::Release);
    }

    /// Takes what the caller can see: a push that does not happen-before this may be missed.
    fn drain(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for slot in &self.slots {
            let v = slot.load(Ordering::Acquire);
            if v != 0 {
                slot.store(0, Ordering::Relaxed);
                out.push(v - 1);
            }
        }
        out
    }
}

/// The serializer-side stand-in shared by the parties of one model.
struct World {
    registry: WaitRegistry<usize>,
    /// Owners of each key's baton (index: key id); never above 1.
    owners: Vec<AtomicUsize>,
    /// The ready queue.
    ready: ReadyQueue,
    /// Free permits of the semaphore.
    free: AtomicUsize,
    /// Permits stored in head tasks by winning grants.
    held: AtomicUsize,
}

impl World {
    fn new(keys: usize) -> Arc<World> {
        Arc::new(World {
            registry: WaitRegistry::new(),
            owners: (0..keys).map(|_| AtomicUsize::new(0)).collect(),
            ready: ReadyQueue::new(keys),
            free: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
        })
    }

    fn take_baton(&self, key: usize) {
        let before = self.owners[key].fetch_add(1, Ordering::AcqRel);
        assert_eq!(before, 0, "key {key}'s baton taken twice");
    }

    /// The grant callback of `wait`, holding one permit, exactly as `permits::on_grant` calls
    /// the registry: on a win the permit goes into the head task and the chain onto the ready
    /// queue; on a loss the permit is dropped (back to the semaphore). `before_push` runs
    /// between winning and pushing.
    fn grant(&self, wait: &PermitWait<usize>, before_push: impl FnOnce()) -> Winner {
        let won = self.registry.grant(wait, |&key| {
            self.take_baton(key);
            self.held.fetch_add(1, Ordering::AcqRel);
            before_push();
            self.ready.push(key);
        });
        if won == Winner::Steal {
            self.free.fetch_add(1, Ordering::AcqRel);
        }
        won
    }

    /// `shutdown_now`'s steps 2 and 3: steal every parked chain, then empty the ready queue.
    /// Returns (stolen keys, keys found on the ready queue, waits found granted).
    fn shutdown_now(&self) -> (Vec<usize>, Vec<usize>, usize) {
        let mut stolen = Vec::new();
        let granted = self.registry.steal_all(|&key| {
            self.take_baton(key);
            stolen.push(key);
        });
        let found = self.ready.drain();
        (stolen, found, granted)
    }
}

#[test]
fn grant_racing_steal_hands_the_baton_to_exactly_one() {
    loom::model(|| {
        let world = World::new(1);
        let wait = world.registry.register(0);
        let granter = {
            let world = world.clone();
            thread::spawn(move || world.grant(&wait, || ()))
        };
        let (stolen, found, granted) = world.shutdown_now();
        let won = granter.join().unwrap();
        // One owner, whoever it was.
        assert_eq!(world.owners[0].load(Ordering::Acquire), 1);
        match won {
            Winner::Steal => {
                assert_eq!(stolen, [0]);
                assert_eq!(granted, 0);
                // The late grant gave its permit back; no task holds one; nothing was scheduled.
                assert_eq!(world.free.load(Ordering::Acquire), 1);
                assert_eq!(world.held.load(Ordering::Acquire), 0);
                assert!(found.is_empty());
                assert!(world.ready.drain().is_empty());
            }
            Winner::Grant => {
                assert!(stolen.is_empty());
                assert!(granted <= 1);
                // The head task holds the permit, and steal_all returned only once the chain
                // was on the ready queue, so the drain found it, once.
                assert_eq!(found, [0]);
                assert_eq!(world.held.load(Ordering::Acquire), 1);
                assert_eq!(world.free.load(Ordering::Acquire), 0);
            }
        }
        assert!(world.registry.is_empty(), "every wait left the registry");
    });
}

/// Executions of the model below in which `steal_all` met a grant between its CAS and
/// `mark_scheduled` (a plain std counter across executions).
static WAITED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[test]
fn steal_finding_granted_waits_until_the_chain_is_scheduled() {
    loom::model(|| {
        let world = World::new(1);
        let wait = world.registry.register(0);
        // The grant, once it won, pushes only after shutdown_now has started: a steal_all that
        // returned without waiting for SCHEDULED would drain an empty queue and lose the chain.
        let stealing = Arc::new(AtomicBool::new(false));
        let granter = {
            let (world, stealing) = (world.clone(), stealing.clone());
            thread::spawn(move || {
                world.grant(&wait, || {
                    while !stealing.load(Ordering::Acquire) {
                        thread::yield_now();
                    }
                })
            })
        };
        stealing.fetch_or(true, Ordering::AcqRel);
        // Not joined yet: shutdown_now drains the queue right after steal_all returns.
        let (stolen, found, granted) = world.shutdown_now();
        if stolen.is_empty() {
            assert_eq!(
                found,
                [0],
                "a granted chain is on the ready queue when steal_all returns"
            );
            if granted == 1 {
                WAITED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        } else {
            assert_eq!(stolen, [0]);
            assert!(found.is_empty());
        }
        let won = granter.join().unwrap();
        assert_eq!(won == Winner::Steal, !stolen.is_empty());
        assert_eq!(world.owners[0].load(Ordering::Acquire), 1);
        assert_eq!(
            world.free.load(Ordering::Acquire) + world.held.load(Ordering::Acquire),
            1,
            "the permit is neither lost nor doubled"
        );
        assert!(world.registry.is_empty());
    });
    assert!(
        WAITED.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the model explored steal_all waiting for a grant"
    );
}

#[test]
fn grants_racing_steal_all_handle_every_wait_once() {
    loom::model(|| {
        let world = World::new(2);
        let waits = [world.registry.register(0), world.registry.register(1)];
        let granters: Vec<_> = waits
            .into_iter()
            .map(|wait| {
                let world = world.clone();
                thread::spawn(move || world.grant(&wait, || ()))
            })
            .collect();
        let (stolen, found, _) = world.shutdown_now();
        // Before joining: every key is stolen or already on the ready queue, once.
        let mut all: Vec<usize> = stolen.iter().chain(found.iter()).copied().collect();
        all.sort();
        assert_eq!(all, [0, 1], "stolen {stolen:?}, scheduled {found:?}");
        let lost: usize = granters
            .into_iter()
            .map(|g| (g.join().unwrap() == Winner::Steal) as usize)
            .sum();
        assert_eq!(lost, stolen.len());
        assert_eq!(world.free.load(Ordering::Acquire), stolen.len());
        assert_eq!(world.held.load(Ordering::Acquire), found.len());
        for key in 0..2 {
            assert_eq!(world.owners[key].load(Ordering::Acquire), 1);
        }
        assert!(world.registry.is_empty(), "every wait left the registry");
    });
}
