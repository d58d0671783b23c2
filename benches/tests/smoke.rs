//! Every workload, at a tiny size, on every contender in both modes: no order violation, no lost
//! task.

use std::time::Duration;

use keyserial_benches::contenders::{Contender, Visit};
use keyserial_benches::exec::KeyedExecutor;
use keyserial_benches::workloads::{Mode, Outcome, Size, Workload};

struct Run<'a>(&'a Workload, Mode);

impl Visit for Run<'_> {
    type Out = Outcome;
    fn visit<E: KeyedExecutor>(self, exec: &E) -> Outcome {
        self.0.run(exec, self.1, Duration::from_secs(60))
    }
}

#[test]
fn every_workload_on_every_contender() {
    let mut runs = 0;
    for w in Workload::all(Size::Tiny) {
        for (c, mode) in Contender::all()
            .into_iter()
            .flat_map(|c| Mode::ALL.map(|m| (c, m)))
        {
            if c.skip_reason(&w).is_some() {
                continue;
            }
            let out = c.visit(2, &w, Run(&w, mode));
            let what = format!("{} on {} ({})", w.id(), c.id(), mode.id());
            assert!(out.finished, "{what}: did not finish");
            assert_eq!(out.ran, out.expected, "{what}: tasks lost or duplicated");
            assert_eq!(out.ran, w.tasks(), "{what}");
            if c.is_ordered() {
                assert_eq!(out.violations, 0, "{what}: order violated");
            }
            assert_eq!(out.values.len(), w.metrics().len(), "{what}");
            assert!(
                out.values.iter().all(|v| v.is_finite()),
                "{what}: {:?}",
                out.values
            );
            runs += 1;
        }
    }
    assert!(runs >= 2 * 6 * 7, "only {runs} runs");
}

#[test]
fn thread_per_key_is_skipped_for_many_keys() {
    let w = Workload::w3(Size::Full);
    assert_eq!(
        Contender::ThreadPerKey.skip_reason(&w).as_deref(),
        Some("skipped (1000000 threads)")
    );
    assert!(Contender::ThreadPerKey
        .skip_reason(&Workload::w2(Size::Full))
        .is_none());
    assert!(Contender::ThreadPerKey
        .skip_reason(&Workload::w4(Size::Full))
        .is_none());
}

type Held = std::collections::HashMap<u64, Box<dyn FnOnce() + Send>>;

/// An "executor" that runs each pair of a key's tasks in swapped order: the workloads must report
/// it.
struct Swapping {
    held: std::sync::Mutex<Held>,
}

impl KeyedExecutor for Swapping {
    fn name(&self) -> String {
        "swapping".into()
    }
    fn submit<F: FnOnce() + Send + 'static>(&self, key: u64, task: F) {
        let first = self.held.lock().unwrap().remove(&key);
        match first {
            None => {
                self.held.lock().unwrap().insert(key, Box::new(task));
            }
            Some(first) => {
                task();
                first();
            }
        }
    }
    fn wait_idle(&self, _timeout: Duration) -> bool {
        let rest: Vec<_> = self.held.lock().unwrap().drain().collect();
        for (_, t) in rest {
            t();
        }
        true
    }
}

#[test]
fn a_reordering_executor_is_caught() {
    let exec = Swapping {
        held: Default::default(),
    };
    let w = Workload::w2(Size::Tiny);
    for mode in Mode::ALL {
        let out = w.run(&exec, mode, Duration::from_secs(5));
        // Every task runs one place off its turn.
        assert_eq!(out.violations, w.tasks(), "{}", mode.id());
        assert_eq!(out.ran, out.expected);
    }
}

/// An executor that silently drops every tenth task: the workloads must report it.
struct Lossy {
    n: std::sync::atomic::AtomicU64,
}

impl KeyedExecutor for Lossy {
    fn name(&self) -> String {
        "lossy".into()
    }
    fn submit<F: FnOnce() + Send + 'static>(&self, _key: u64, task: F) {
        if self.n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 10 != 9 {
            task();
        }
    }
    fn wait_idle(&self, _timeout: Duration) -> bool {
        true
    }
}

#[test]
fn a_lossy_executor_is_caught() {
    let exec = Lossy {
        n: Default::default(),
    };
    for mode in Mode::ALL {
        let out = Workload::w1(Size::Tiny).run(&exec, mode, Duration::from_secs(5));
        assert!(!out.all_ran());
        assert!(out.ran < out.expected);
    }
}

#[test]
fn w5_keys_belong_to_their_producer_and_follow_zipf() {
    use keyserial_benches::workloads::skew_plan;
    let (owned, tasks) = (25_000, 100_000);
    let plan = skew_plan(2, owned, tasks, 1.0);
    assert_eq!(plan.len(), tasks);
    let mut counts = vec![0u32; owned];
    for &(key, seq) in &plan {
        let k = key as usize;
        assert!(
            (2 * owned..3 * owned).contains(&k),
            "key {k} outside producer 2's share"
        );
        // Sequence numbers count the key's earlier draws.
        assert_eq!(seq, counts[k - 2 * owned]);
        counts[k - 2 * owned] += 1;
    }
    // Zipf(1.0) over 25,000 ranks: rank 1 has p = 1 / H(25,000) ~ 9.3%, rank 2 half of that.
    let p1 = f64::from(counts[0]) / tasks as f64;
    assert!((0.08..0.11).contains(&p1), "rank 1 drew {p1}");
    let r12 = f64::from(counts[0]) / f64::from(counts[1]);
    assert!((1.7..2.3).contains(&r12), "rank 1 / rank 2 = {r12}");
    // The same seed gives the same stream: every contender gets the same keys.
    assert_eq!(skew_plan(2, owned, 1_000, 1.0), plan[..1_000]);
}
