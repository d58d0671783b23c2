//! Synthetic task bodies.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

/// W1's and W5's task body (the GatlingExecutor benchmark's): `n` relaxed `fetch_add`s on a
/// task-local atomic; returns its final value (`n`).
///
/// One copy, never inlined, and on x86-64 its loop is written out and aligned to 32 bytes, so
/// every contender runs the very same instructions at the same alignment. Inlined, each contender
/// got its own copy of a `black_box(&a).fetch_add(1)` loop wherever its code landed, and on Intel
/// CPUs whose microcode works around the JCC erratum (Skylake-derived Xeons) a copy whose loop
/// branch crosses or ends on a 32-byte boundary runs about 1.5x slower. Measured on such a
/// machine (BENCHMARKS.md, run S): keyserial's copy and the floor's did, tokio's did not, so W1's
/// ratio followed code placement, not scheduling.
#[inline(never)]
pub fn gatling(n: u32) -> u64 {
    let a = AtomicU64::new(0);
    #[cfg(target_arch = "x86_64")]
    if n > 0 {
        // SAFETY: the loop does `n` locked increments of `a`, a live local atomic that nothing
        // else touches (a relaxed `fetch_add(1)` each, as the portable loop below does), and
        // changes nothing else but the counter register and the flags, which it declares.
        unsafe {
            std::arch::asm!(
                ".p2align 5",
                "2:",
                "lock inc qword ptr [{p}]",
                "dec {n:e}",
                "jnz 2b",
                p = in(reg) a.as_ptr(),
                n = inout(reg) n => _,
                options(nostack),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
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
