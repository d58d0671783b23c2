//! Baseline: run every task on the submitting thread, inside `submit`.
//!
//! This is the work's own cost with no handoff at all: `inline time / cores` is the ideal any pool
//! could reach. Workloads submit from a single thread for it (see
//! [`crate::exec::OrderGuarantee::Inline`]), so its per-key order holds.

use std::time::Duration;

use crate::exec::{KeyedExecutor, OrderGuarantee};

/// Runs tasks inline.
#[derive(Debug, Default)]
pub struct Inline;

impl Inline {
    /// A new inline "executor".
    pub fn new() -> Self {
        Inline
    }
}

impl KeyedExecutor for Inline {
    fn name(&self) -> String {
        "inline".into()
    }

    fn ordering(&self) -> OrderGuarantee {
        OrderGuarantee::Inline
    }

    #[inline]
    fn submit<F>(&self, _key: u64, task: F)
    where
        F: FnOnce() + Send + 'static,
    {
        task();
    }

    fn wait_idle(&self, _timeout: Duration) -> bool {
        true
    }
}
