//! Loom model of a deferral (std-executor/src/deferral.rs): the lane's owner diverts a deferred
//! key's items into the deferral while its runner takes them one at a time and closes it when
//! it finds it empty, all over the real `Deferrals`/`Deferral` code (`loom_api::deferral`).
//!
//! **The claim.** Every item the owner pops is either put into the deferral (and then taken by
//! the runner, or handed back by `take_all`) or returned to the owner to route itself, never
//! both and never neither; and a key's order survives the switch back: the items the runner
//! takes are a prefix of the owner's pops, the ones returned to the owner the rest. Why it holds:
//! both sides act under the deferral's lock, and the runner closes the deferral in the same
//! critical section in which it finds it empty, so an item is appended before the close (the
//! runner takes it) or after it (the owner routes it), and after the close every later item is
//! returned too.
//!
//! **Mutation check** (by hand, not kept): letting the owner append to a closed deferral leaves
//! an item in it that nobody runs, and the model fails.

#![cfg(loom)]

use keyserial::loom_api::deferral as hooks;
use loom::thread;

const HASH: u64 = 0xfeed;

#[test]
fn owner_diverts_while_the_runner_drains_and_closes() {
    loom::model(|| {
        let (list, d) = hooks::deferred(HASH);
        let list = std::sync::Arc::new(list);
        let owner = {
            let list = list.clone();
            thread::spawn(move || {
                let mut routed = Vec::new();
                for key in [1u32, 2] {
                    if !hooks::divert(&list, key, HASH) {
                        routed.push(key);
                    }
                }
                routed
            })
        };
        let runner = thread::spawn(move || {
            let mut ran = Vec::new();
            while let Some(key) = hooks::run_step(&d) {
                ran.push(key);
            }
            ran
        });
        let routed = owner.join().unwrap();
        let ran = runner.join().unwrap();
        let left = hooks::take_all(&list);
        let mut all: Vec<u32> = ran.clone();
        all.extend(&left);
        all.extend(&routed);
        assert_eq!(
            all,
            [1, 2],
            "lost, doubled or reordered: ran {ran:?}, left {left:?}, routed {routed:?}"
        );
        assert!(
            left.is_empty(),
            "the runner closed the deferral with items in it: {left:?}"
        );
    });
}
