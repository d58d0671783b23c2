//! Synthetic task bodies.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// W1's task body (the GatlingExecutor benchmark's): `n` relaxed `fetch_add`s on a task-local
/// atomic, kept from being optimised away with `black_box`.
#[inline]
pub fn gatling(n: u32) -> u64 {
    let a = AtomicU64::new(0);
    for _ in 0..n {
        black_box(&a).fetch_add(1, Ordering::Relaxed);
    }
    black_box(a.load(Ordering::Relaxed))
}

/// Spins `iters` rounds of dependent arithmetic (about 1 ns each, see [`iters_per_micro`]).
#[inline]
pub fn spin(iters: u32) -> u64 {
    let mut x = black_box(0x2545_F491_4F6C_DD1Du64);
    for _ in 0..iters {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    black_box(x)
}

/// Number of [`spin`] iterations that take about one microsecond on this machine (measured once,
/// the best of a few tries so a preempted try does not inflate it).
pub fn iters_per_micro() -> u32 {
    static CAL: OnceLock<u32> = OnceLock::new();
    *CAL.get_or_init(|| {
        let probe = 100_000u32;
        let best = (0..5)
            .map(|_| {
                let t = Instant::now();
                spin(probe);
                t.elapsed()
            })
            .min()
            .unwrap_or(Duration::from_micros(100))
            .max(Duration::from_nanos(1));
        ((f64::from(probe) * 1_000.0 / best.as_nanos() as f64).round() as u32).max(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_is_plausible() {
        let n = iters_per_micro();
        assert!(n >= 1);
        let t = Instant::now();
        for _ in 0..1000 {
            spin(n);
        }
        let per = t.elapsed() / 1000;
        // Generous: CI machines are noisy.
        assert!(per < Duration::from_micros(50), "{per:?}");
        assert_eq!(gatling(1000), 1000);
    }
}
