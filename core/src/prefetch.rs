//! Cache hints: ask the CPU to start fetching a line that will be read soon.
//!
//! A lane's owner runs one task and then reads the next item (its slot, then the task's own data).
//! Both lines were written by another thread, often long ago, so each read is a miss that the
//! task's own work could have hidden: hint them one task ahead and the miss overlaps the task
//! before. Measured (BENCHMARKS.md, "This round (runs V and W)"), with pre-boxed 100-add tasks from
//! 4 producers: the first read of each task's box was 29% of the task call's samples; hinted one
//! item ahead it left the profile. The worker's loop then waited on the next slot's stamp (now its
//! tag) instead (45% of its samples); with the slot after hinted too, the loop fell from 606 to 345
//! samples.
//!
//! A hint changes no value and never faults, even for an address that maps nothing (the CPU
//! drops it), so the crate's own `prefetch` and `prefetch_write` take any pointer (they are
//! crate-private: the FIFO and the chain hint their own lines). [`prefetch_pointee`] reads a word
//! to learn its address, so it must be allowed to read that word; it is public for executors
//! that look ahead into their own items, as keyserial's lanes do. On targets without a prefetch
//! instruction we know (anything but x86-64 and AArch64), under Miri and under loom, all three
//! do nothing.

use core::mem::MaybeUninit;

/// Hints the CPU to fetch the cache line holding `p` for reading. No effect on the program's
/// meaning, never faults, whatever `p` is.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    // SAFETY: `prefetcht0` only hints the cache: it reads no register but `p`, writes nothing,
    // and does not fault for any address.
    unsafe {
        core::arch::asm!("prefetcht0 byte ptr [{p}]", p = in(reg) p,
            options(nostack, readonly, preserves_flags));
    }
    #[cfg(all(target_arch = "aarch64", not(miri), not(loom)))]
    // SAFETY: as above, for `prfm` (a hint that never faults).
    unsafe {
        core::arch::asm!("prfm pldl1keep, [{p}]", p = in(reg) p,
            options(nostack, readonly, preserves_flags));
    }
    #[cfg(any(miri, loom, not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
    let _ = p;
}

/// Hints the CPU to bring the line holding `p` into this core's cache for writing, as
/// [`prefetch`] (any address is fine).
#[inline(always)]
#[cfg_attr(not(feature = "alloc"), allow(dead_code))] // only the FIFO (`alloc`) writes ahead
pub(crate) fn prefetch_write<T>(p: *const T) {
    // (`_mm_prefetch` with the write hint compiles to a plain read prefetch unless the crate is
    // built for `prfchw`, hence the instruction itself.)
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    // SAFETY: `prefetchw` changes neither memory nor registers nor flags, and does not fault on
    // any address (x86-64 CPUs without it run it as a no-op: it is in the reserved-NOP space).
    unsafe {
        core::arch::asm!("prefetchw [{p}]", p = in(reg) p,
            options(nostack, preserves_flags, readonly));
    }
    #[cfg(all(target_arch = "aarch64", not(miri), not(loom)))]
    // SAFETY: as above, for `prfm` with the store hint.
    unsafe {
        core::arch::asm!("prfm pstl1keep, [{p}]", p = in(reg) p,
            options(nostack, readonly, preserves_flags));
    }
    #[cfg(any(miri, loom, not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
    let _ = p;
}

/// Reads the word at `word` and hints the CPU to fetch the line it points to, as
/// a read hint: for data reached through a pointer stored in a slot (a task's first captured
/// word, which for a boxed or `Arc`'d closure is its data). The word may hold anything, even
/// a value that is no address or bytes never written: it is only used as a hint, inside one
/// instruction sequence, and never reaches Rust code.
///
/// # Safety
///
/// `word` is aligned and valid for reading a `usize`'s bytes (initialized or not).
///
/// ```
/// use core::mem::MaybeUninit;
/// let data = Box::new([7u8; 64]);
/// let word = MaybeUninit::new(&*data as *const [u8; 64] as usize);
/// // SAFETY: `word` is a live, aligned local.
/// unsafe { keyserial_core::prefetch::prefetch_pointee(&word) };
/// assert_eq!(data[0], 7);
/// ```
#[inline(always)]
pub unsafe fn prefetch_pointee(word: *const MaybeUninit<usize>) {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    // SAFETY: the caller lets us read the word; the loaded value only feeds the hint, which
    // writes nothing and does not fault for any address.
    unsafe {
        core::arch::asm!("mov {t}, qword ptr [{w}]", "prefetcht0 byte ptr [{t}]",
            w = in(reg) word, t = out(reg) _, options(nostack, readonly, preserves_flags));
    }
    #[cfg(all(target_arch = "aarch64", not(miri), not(loom)))]
    // SAFETY: as above, for `ldr` and `prfm`.
    unsafe {
        core::arch::asm!("ldr {t}, [{w}]", "prfm pldl1keep, [{t}]",
            w = in(reg) word, t = out(reg) _, options(nostack, readonly, preserves_flags));
    }
    #[cfg(any(miri, loom, not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
    let _ = word;
}
