//! Synthetic task bodies.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

/// W1's and W5's task body (the GatlingExecutor benchmark's): `n` relaxed `fetch_add`s on a
/// task-local atomic, kept from being optimised away with `black_box`.
#[inline]
pub fn gatling(n: u32) -> u64 {
    let a = AtomicU64::new(0);
    for _ in 0..n {
        black_box(&a).fetch_add(1, Ordering::Relaxed);
    }
    black_box(a.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gatling_adds() {
        assert_eq!(gatling(1000), 1000);
        assert_eq!(gatling(0), 0);
    }
}
