//! Coverage counters shared by the loom models: std statics, outside the model, that count
//! which interesting outcome each execution reached, so a model can check it reached them all.

use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};

/// A fresh set of coverage counters.
#[macro_export]
macro_rules! counters {
    ($n:literal) => {
        [const { std::sync::atomic::AtomicUsize::new(0) }; $n]
    };
}

/// Counts one execution under `outcome`.
pub fn count(counters: &[StdAtomicUsize], outcome: usize) {
    counters[outcome].fetch_add(1, StdOrdering::Relaxed);
}

/// Every outcome was reached at least once; `names` labels them for the failure message. Prints
/// the executions per outcome (visible with `--nocapture`).
pub fn assert_all_reached(counters: &[StdAtomicUsize], names: &[&str]) {
    let seen: Vec<usize> = counters
        .iter()
        .map(|c| c.load(StdOrdering::Relaxed))
        .collect();
    eprintln!(
        "{} executions: {:?}",
        seen.iter().sum::<usize>(),
        names.iter().zip(&seen).collect::<Vec<_>>()
    );
    for (n, name) in seen.iter().zip(names) {
        assert!(*n > 0, "never reached `{name}`: {names:?} = {seen:?}");
    }
}
