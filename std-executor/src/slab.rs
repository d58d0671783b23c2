//! Slabs of node blocks, filled in submission order (DESIGN.md §4, "Throughput is cache lines per
//! task"): a thread allocates blocks of one size class by bumping through its own [`SLAB`]-byte
//! slab, aligned to its size, so any block finds its slab's header by masking its address.
//!
//! # Protocol
//!
//! A slab's header holds one atomic word, `live`: the number of *references* to the slab still
//! outstanding. A reference is either one block not yet accounted as freed, or the owner's.
//!
//! - **Created** by one thread (its *owner*) with `live = capacity + 1`: every block is paid for
//!   up front, plus one for the owner. The owner then hands out blocks by bumping an offset that
//!   only it knows; handing out a block touches no shared memory at all.
//! - **Retired** by the owner exactly once (when it is full, or when the owner's thread-local
//!   state is torn down): `fetch_sub(1 + blocks never handed out)`. After that the owner never
//!   touches the slab again.
//! - **Block freed** by any thread: the block's 1 is owed to the slab. A freeing thread keeps a
//!   [`Freer`]: the last slab it freed into and how many blocks of it it has freed since its last
//!   flush. It flushes (`fetch_sub(pending)`) when it frees into another slab, when asked to
//!   ([`Freer::flush`], which a worker calls before it parks), and when it is dropped (with its
//!   thread's locals). So two workers freeing the blocks of one slab touch its header line once
//!   per run of consecutive frees into it, not once per block.
//!
//! Every decrement is by references that are no longer used: the owner's after it retired, a
//! block's after the block was freed (its contents are dead). The decrements of a slab sum to
//! exactly `capacity + 1` (each handed-out block is freed once, the owner retires once and pays
//! for the rest), and `live` only ever decreases, so it reaches zero exactly once, and only when
//! nothing refers to the slab any more: **the thread whose `fetch_sub` takes it to zero — and only
//! that thread — frees the slab** (or parks it in one of the global [`SPARES`] slots for the next
//! owner). The `fetch_sub`s are `AcqRel`, so the freer of the slab has seen every other thread's
//! last use of its blocks before it reuses or deallocates the memory.
//!
//! A [`Freer`] holding a pending count for a slab keeps that slab alive (its count is not yet
//! subtracted), so the slab address it remembers can never be freed and reused under it.
//!
//! # Memory
//!
//! One live block pins its whole slab: the worst case is one [`SLAB`] (16 KiB) per live block,
//! 256 times the block for the 64-byte class, 32 times for the 512-byte one. Beyond live blocks a
//! thread holds at most one partly used slab per class it allocates from, and one slab kept alive
//! by its freer's pending count; the global spares hold at most [`SPARE_SLOTS`] empty slabs.
//! In the submit-then-run pattern the slabs are filled in order and emptied in nearly the same
//! order, so the overhead is about one slab per class per thread.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::sync::{AtomicUsize, Ordering};

/// Size and alignment of a slab.
pub const SLAB: usize = 16 * 1024;
/// Bytes before the first block: the header gets a cache line of its own.
const HEADER: usize = 64;

const SLAB_LAYOUT: Layout = match Layout::from_size_align(SLAB, SLAB) {
    Ok(l) => l,
    Err(_) => panic!("bad slab layout"),
};

#[repr(C, align(64))]
struct Header {
    /// Outstanding references: blocks not yet accounted as freed, plus one for the owner until
    /// it retires the slab.
    live: AtomicUsize,
}

/// Blocks of `block` bytes in one slab.
const fn capacity(block: usize) -> usize {
    (SLAB - HEADER) / block
}

/// Empty slabs kept for reuse across threads (each slot holds one or is null). None under Miri:
/// its leak check does not count a static's `AtomicPtr` as keeping a slab reachable, and nothing
/// drains the spares at exit (the process gives them back).
#[cfg(not(loom))]
pub const SPARE_SLOTS: usize = if cfg!(miri) { 0 } else { 4 };
#[cfg(not(loom))]
static SPARES: [std::sync::atomic::AtomicPtr<u8>; SPARE_SLOTS] =
    [const { std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()) }; SPARE_SLOTS];

/// Fresh slab memory (uninitialised header): a spare if there is one, else the allocator's.
fn slab_memory() -> NonNull<u8> {
    #[cfg(not(loom))]
    for s in &SPARES {
        if !s.load(Ordering::Relaxed).is_null() {
            // Acquire: the slab's last user's writes happened before it was parked here.
            if let Some(p) = NonNull::new(s.swap(std::ptr::null_mut(), Ordering::Acquire)) {
                return p;
            }
        }
    }
    // SAFETY: `SLAB_LAYOUT` is not zero-sized.
    let p = unsafe { std::alloc::alloc(SLAB_LAYOUT) };
    let p = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(SLAB_LAYOUT));
    // Frees find the header from a block's address alone: expose the slab's provenance (a
    // pointer-to-integer cast does what `expose_provenance` does).
    let _ = p.as_ptr() as usize;
    p
}

/// Gives back a slab whose count reached zero.
///
/// # Safety
/// `h` is a slab's header whose `live` this thread just took to zero (nobody else refers to it).
unsafe fn release_memory(h: NonNull<Header>) {
    // SAFETY: per the contract the header is ours alone; dropping it ends its atomic (a no-op
    // for std's, the end of the object for loom's).
    unsafe { std::ptr::drop_in_place(h.as_ptr()) };
    let p = h.cast::<u8>();
    #[cfg(not(loom))]
    for s in &SPARES {
        if s.load(Ordering::Relaxed).is_null()
            && s.compare_exchange(
                std::ptr::null_mut(),
                p.as_ptr(),
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            return;
        }
    }
    // SAFETY: allocated in `slab_memory` with `SLAB_LAYOUT` (a spare was too), unused now.
    unsafe { std::alloc::dealloc(p.as_ptr(), SLAB_LAYOUT) };
}

/// Subtracts `n` references from the slab at `h`; frees it if that was the last. Returns whether
/// this call freed it.
///
/// # Safety
/// The caller holds `n >= 1` of the slab's references (blocks it has freed, or the owner's) and
/// gives them up here.
unsafe fn release(h: NonNull<Header>, n: usize) -> bool {
    // SAFETY: the slab is alive while the caller holds references to it. AcqRel: our uses of the
    // blocks happen before the freer's reuse (Release), and the freer sees everyone's (Acquire).
    let before = unsafe { (*h.as_ptr()).live.fetch_sub(n, Ordering::AcqRel) };
    debug_assert!(before >= n, "slab count underflow");
    if before == n {
        // SAFETY: we took `live` to zero: no block, owner or freer refers to the slab any more.
        unsafe { release_memory(h) };
        true
    } else {
        false
    }
}

/// The slab header of a block handed out by some [`Bump`].
fn header_of(p: NonNull<u8>) -> NonNull<Header> {
    let addr = p.as_ptr() as usize & !(SLAB - 1);
    // The slab's provenance was exposed in `slab_memory`; an integer-to-pointer cast is
    // what `with_exposed_provenance_mut` does.
    let h = addr as *mut Header;
    // SAFETY: a block is never at the slab's address (the header is), so `addr` is nonzero.
    unsafe { NonNull::new_unchecked(h) }
}

/// An owner's allocation state for one block size: the current slab (if any) and the offset of
/// its next block.
pub struct Bump {
    block: usize,
    slab: Option<NonNull<Header>>,
    next: usize,
}

impl Bump {
    /// A bump allocator of `block`-byte blocks (a multiple of 16, at least 16, at most a
    /// quarter of a slab); no slab until the first allocation.
    pub const fn new(block: usize) -> Self {
        assert!(block >= 16 && block.is_multiple_of(16) && block <= SLAB / 4);
        Bump {
            block,
            slab: None,
            next: 0,
        }
    }

    /// A block of `block` bytes, 16-byte aligned, in a slab: free it with [`Freer::free`] or
    /// [`free_one`] on any thread.
    #[inline]
    pub fn alloc(&mut self) -> NonNull<u8> {
        match self.slab {
            Some(h) if self.next + self.block <= SLAB => {
                let off = self.next;
                self.next += self.block;
                // SAFETY: `off + block <= SLAB`: inside the slab's allocation.
                unsafe { h.cast::<u8>().add(off) }
            }
            _ => self.alloc_slow(),
        }
    }

    #[cold]
    fn alloc_slow(&mut self) -> NonNull<u8> {
        self.retire();
        let p = slab_memory();
        let h = p.cast::<Header>();
        // SAFETY: fresh slab memory, ours alone; the header fits before the first block.
        unsafe {
            h.as_ptr().write(Header {
                live: AtomicUsize::new(capacity(self.block) + 1),
            })
        };
        self.slab = Some(h);
        self.next = HEADER + self.block;
        // SAFETY: HEADER + block <= SLAB.
        unsafe { p.add(HEADER) }
    }

    /// Gives up the current slab (if any): its owner reference and the blocks never handed out.
    /// Returns whether that freed it (every block handed out was already freed).
    pub fn retire(&mut self) -> bool {
        let Some(h) = self.slab.take() else {
            return false;
        };
        let unused = (SLAB - self.next) / self.block;
        // SAFETY: the owner's reference and those of the `unused` blocks never handed out are
        // ours; we never touch the slab again (`slab` is `None` now).
        unsafe { release(h, 1 + unused) }
    }
}

impl Drop for Bump {
    fn drop(&mut self) {
        self.retire();
    }
}

/// Frees one block at once (no batching): for threads without a [`Freer`]. Returns whether
/// that freed its slab.
///
/// # Safety
/// `p` came from some [`Bump::alloc`], is no longer used by anyone, and is freed once.
pub unsafe fn free_one(p: NonNull<u8>) -> bool {
    // SAFETY: the block's reference is ours to give up (contract).
    unsafe { release(header_of(p), 1) }
}

/// A freeing thread's batch: the slab it last freed into and how many blocks of it it has freed
/// without telling the slab yet.
pub struct Freer {
    slab: Option<NonNull<Header>>,
    pending: usize,
}

impl Default for Freer {
    fn default() -> Self {
        Self::new()
    }
}

impl Freer {
    pub const fn new() -> Self {
        Freer {
            slab: None,
            pending: 0,
        }
    }

    /// Frees a block; returns whether that freed a slab (the previous one, when this flushed it).
    ///
    /// # Safety
    /// `p` came from some [`Bump::alloc`], is no longer used by anyone, and is freed once.
    #[inline]
    pub unsafe fn free(&mut self, p: NonNull<u8>) -> bool {
        let h = header_of(p);
        if self.slab == Some(h) {
            // At most the slab's capacity: each block is freed once, and the slab stays alive
            // (our pending count is part of `live`) until we flush.
            self.pending += 1;
            false
        } else {
            let freed = self.flush();
            self.slab = Some(h);
            self.pending = 1;
            freed
        }
    }

    /// Tells the last slab about the blocks freed into it; returns whether that freed it.
    pub fn flush(&mut self) -> bool {
        match self.slab.take() {
            // SAFETY: `pending` blocks of slab `h` were freed through `free` (whose contract
            // makes their references ours) and not yet subtracted.
            Some(h) => unsafe { release(h, std::mem::take(&mut self.pending)) },
            None => false,
        }
    }
}

impl Drop for Freer {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    struct Block(NonNull<u8>);
    // SAFETY: whoever holds the `Block` owns the block.
    unsafe impl Send for Block {}

    #[test]
    fn blocks_are_distinct_aligned_and_in_their_slab() {
        for block in [64usize, 128, 256, 512] {
            let mut bump = Bump::new(block);
            let n = capacity(block) + 3;
            let blocks: Vec<_> = (0..n).map(|_| bump.alloc()).collect();
            let mut seen = std::collections::HashSet::new();
            for (i, &b) in blocks.iter().enumerate() {
                assert_eq!(b.as_ptr() as usize % 16, 0);
                assert!(seen.insert(b.as_ptr() as usize));
                let h = header_of(b).as_ptr() as usize;
                assert!(b.as_ptr() as usize >= h + HEADER);
                assert!(b.as_ptr() as usize + block <= h + SLAB);
                // SAFETY: a fresh block of `block` bytes.
                unsafe { b.as_ptr().write_bytes(i as u8, block) };
            }
            let mut freer = Freer::new();
            let mut freed = 0;
            for b in blocks {
                // SAFETY: from `bump.alloc()`, freed once.
                freed += unsafe { freer.free(b) } as usize;
            }
            // The first slab was retired when full: freeing its blocks freed it.
            assert_eq!(freed, 1);
            assert!(!freer.flush(), "the owner still holds the second slab");
            assert!(bump.retire(), "retiring an emptied slab frees it");
        }
    }

    /// Exactly one party frees a slab, after every block in it is freed, whatever the order.
    #[test]
    fn the_last_reference_frees_the_slab_exactly_once() {
        let block = 512;
        let mut bump = Bump::new(block);
        let blocks: Vec<_> = (0..5).map(|_| Block(bump.alloc())).collect();
        // Owner retires first: 5 blocks still live.
        assert!(!bump.retire());
        let (a, b): (Vec<_>, Vec<_>) = blocks
            .into_iter()
            .enumerate()
            .partition(|(i, _)| i % 2 == 0);
        let spawn = |v: Vec<(usize, Block)>| {
            std::thread::spawn(move || {
                let mut f = Freer::new();
                let mut freed = 0;
                for (_, b) in v {
                    // SAFETY: from `bump.alloc()`, handed over whole, freed once.
                    freed += unsafe { f.free(b.0) } as usize;
                }
                freed + f.flush() as usize
            })
        };
        let (ta, tb) = (spawn(a), spawn(b));
        assert_eq!(ta.join().unwrap() + tb.join().unwrap(), 1);
    }

    #[test]
    fn free_one_and_a_late_owner() {
        let mut bump = Bump::new(64);
        let x = bump.alloc();
        let y = bump.alloc();
        // SAFETY: from `bump.alloc()`, freed once.
        assert!(!unsafe { free_one(x) });
        // SAFETY: as above.
        assert!(!unsafe { free_one(y) });
        assert!(bump.retire(), "the owner was the last reference");
        assert!(!bump.retire(), "nothing left to retire");
    }
}
