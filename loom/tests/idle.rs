//! Loom model of idle release (std-executor/src/idle.rs): a worker releasing a key races the
//! reaper holding the key's idle item. At most one item ever exists (so a key in a reaper's queue
//! is never freed behind its back), a key is retired only idle and empty, and an idle key is never
//! forgotten (it has an item, or is retired).
#![cfg(loom)]

use keyserial::loom_api::{IdleWord, Reap};
use keyserial_core::chain::{BoxNode, Chain, Pushed, Retired};
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

type C = Chain<BoxNode<u32>>;

#[test]
fn release_racing_the_reaper_never_forgets_or_doubles_a_key() {
    loom::model(|| {
        let chain = Arc::new(C::new());
        let idle = Arc::new(IdleWord::new());
        // The key went idle at tick 0: its one item sits in the reaper's queue.
        assert!(idle.released(0));
        let items = Arc::new(AtomicUsize::new(1));
        let bounced = Arc::new(AtomicBool::new(false));
        let ran = Arc::new(AtomicUsize::new(0));

        let worker = {
            let (chain, idle, items, bounced, ran) = (
                chain.clone(),
                idle.clone(),
                items.clone(),
                bounced.clone(),
                ran.clone(),
            );
            thread::spawn(move || match chain.push_value(1) {
                Ok(Pushed::Activated) => {
                    // Run the task, release, then the idle bookkeeping at tick 5.
                    loop {
                        // SAFETY (model): the activating push made us the owner.
                        unsafe {
                            while chain.pop_value().is_some() {
                                ran.fetch_add(1, Ordering::AcqRel);
                            }
                            if chain.try_release() {
                                break;
                            }
                        }
                        // A push between its two steps: the worker would requeue the key.
                        loom::thread::yield_now();
                    }
                    if idle.released(5) {
                        items.fetch_add(1, Ordering::AcqRel);
                    }
                }
                Ok(Pushed::Queued) => unreachable!("nobody else pushes"),
                Err(Retired(_)) => {
                    bounced.fetch_or(true, Ordering::AcqRel); // back to the table for a new chain
                }
            })
        };

        // The reaper pops the item at tick 100 with a timeout of 10.
        items.fetch_sub(1, Ordering::AcqRel);
        let outcome = idle.reap(&chain, 100, 10, false);
        match outcome {
            Reap::Requeue(_) => {
                items.fetch_add(1, Ordering::AcqRel);
            }
            Reap::Retired | Reap::Dropped => {}
        }
        worker.join().unwrap();

        let n = items.load(Ordering::Acquire);
        assert!(n <= 1, "two idle items for one key");
        let (r, b) = (ran.load(Ordering::Acquire), bounced.load(Ordering::Acquire));
        assert_eq!(
            r + b as usize,
            1,
            "the task ran once or bounced to a fresh chain"
        );
        if chain.is_retired() {
            assert_eq!(outcome, Reap::Retired);
            assert_eq!(n, 0, "a retired key keeps no item");
        } else {
            assert!(chain.is_idle(), "nothing is left running");
            assert_eq!(
                n, 1,
                "an idle key must have its item (else it is never released)"
            );
        }
    });
}
