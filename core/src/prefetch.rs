//! Cache hints: ask the CPU to start fetching a line that will be read soon.
//!
//! A lane's owner runs one task and then reads the next item (its slot, then the task's own
//! data). Both lines were written by another thread, often long ago, so each read is a miss
//! that the task's own work could have hidden: hint them one task ahead and the miss overlaps
//! the task before. Measured (BENCHMARKS.md, "This round (runs V and W)"), with pre-boxed
//! 100-add tasks from 4 producers: the first read of each task's box was 29% of the task
//! call's samples; hinted one item ahead it left the profile. The worker's loop then waited on
//! the next slot's stamp instead (45% of its samples); with the slot after hinted too, the
//! loop fell from 606 to 345 samples.
//!
//! A hint changes no value and never faults, even for an address that maps nothing (the CPU
//! drops it), so [`prefetch`] is safe for any pointer. [`prefetch_pointee`] reads a word to
//! learn its address, so it must be allowed to read that word. On targets without a prefetch
//! instruction we know (anything but x86-64 and AArch64), and under Miri, both do nothing.

use core::mem::MaybeUninit;

/// Hints the CPU to fetch the cache line holding `p` for reading. No effect on the program's
/// meaning, never faults, whatever `p` is.
///
/// ```
/// let data = [1u64; 8];
/// keyserial_core::prefetch::prefetch(data.as_ptr());
/// assert_eq!(data[0], 1);
/// ```
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `prefetcht0` only hints the cache: it reads no register but `p`, writes nothing,
    // and does not fault for any address.
    unsafe {
        core::arch::asm!("prefetcht0 byte ptr [{p}]", p = in(reg) p,
            options(nostack, readonly, preserves_flags));
    }
    #[cfg(all(target_arch = "aarch64", not(miri)))]
    // SAFETY: as above, for `prfm` (a hint that never faults).
    unsafe {
        core::arch::asm!("prfm pldl1keep, [{p}]", p = in(reg) p,
            options(nostack, readonly, preserves_flags));
    }
    #[cfg(any(miri, not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
    let _ = p;
}

/// Reads the word at `word` and hints the CPU to fetch the line it points to, as
/// [`prefetch`]: for data reached through a pointer stored in a slot (a task's first captured
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
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: the caller lets us read the word; the loaded value only feeds the hint, which
    // writes nothing and does not fault for any address.
    unsafe {
        core::arch::asm!("mov {t}, qword ptr [{w}]", "prefetcht0 byte ptr [{t}]",
            w = in(reg) word, t = out(reg) _, options(nostack, readonly, preserves_flags));
    }
    #[cfg(all(target_arch = "aarch64", not(miri)))]
    // SAFETY: as above, for `ldr` and `prfm`.
    unsafe {
        core::arch::asm!("ldr {t}, [{w}]", "prfm pldl1keep, [{t}]",
            w = in(reg) word, t = out(reg) _, options(nostack, readonly, preserves_flags));
    }
    #[cfg(any(miri, not(any(target_arch = "x86_64", target_arch = "aarch64"))))]
    let _ = word;
}
