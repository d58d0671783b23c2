//! Where task nodes' memory comes from: four size classes (64, 128, 256 and 512 bytes, 16-byte
//! aligned) served from [slabs](crate::slab) filled in submission order, one bump allocator per
//! thread and class; larger or over-aligned nodes use the global allocator.
//!
//! Why: a node is allocated by the submitting thread and freed by a worker. With glibc that
//! producer/consumer pattern sent every `malloc` and `free` to the locked arena, and magazine
//! caches run dry as soon as the submitter is thousands of tasks ahead of the workers. A slab
//! costs one allocation per 31 to 255 nodes; handing out a node touches no shared memory; a
//! worker's frees into one slab are batched into one `fetch_sub` of its header (see
//! `crate::slab` for the protocol and the memory bound: one live node pins its 16 KiB slab).
//!
//! Class layouts are only ever served from slabs, so [`free`] tells a slab block from a global
//! allocator block by the layout alone. A thread whose thread-local state is gone (during its
//! thread-local destructors) or busy gets a slab of its own for the one block, retired at once,
//! and frees a block with an unbatched `fetch_sub`.
//!
//! Each thread's bump allocators retire their slabs, and its freer flushes its pending count,
//! when its thread-local storage is destroyed; a slab is freed by whoever takes its count to zero,
//! so once every thread that used keyserial has ended and every node is freed, nothing is held
//! but at most `slab::SPARE_SLOTS` empty slabs in a static.

use std::alloc::Layout;
use std::ptr::NonNull;

/// The block sizes of the classes; every class block is [`CLASS_ALIGN`]-aligned.
const CLASS_SIZES: [usize; 4] = [64, 128, 256, 512];
const CLASS_ALIGN: usize = 16;

/// Smallest class able to hold `layout`, if any.
#[inline]
const fn class_of(layout: Layout) -> Option<usize> {
    if layout.align() > CLASS_ALIGN {
        return None;
    }
    let mut i = 0;
    while i < CLASS_SIZES.len() {
        if layout.size() <= CLASS_SIZES[i] {
            return Some(i);
        }
        i += 1;
    }
    None
}

#[cfg(not(loom))]
mod local {
    use std::cell::RefCell;

    use crate::slab::{Bump, Freer};

    use super::CLASS_SIZES;

    /// A thread's allocation and free state. Dropped with the thread's locals: the freer
    /// flushes and the bump allocators retire their slabs.
    pub(super) struct Local {
        pub(super) bumps: [Bump; 4],
        pub(super) freer: Freer,
    }

    thread_local! {
        pub(super) static LOCAL: RefCell<Local> = const {
            RefCell::new(Local {
                bumps: [
                    Bump::new(CLASS_SIZES[0]),
                    Bump::new(CLASS_SIZES[1]),
                    Bump::new(CLASS_SIZES[2]),
                    Bump::new(CLASS_SIZES[3]),
                ],
                freer: Freer::new(),
            })
        };
    }
}

/// Memory for a value of `layout` (not zero-sized).
#[inline]
pub(crate) fn alloc(layout: Layout) -> NonNull<u8> {
    // Nodes and entries always have a header; a constant per call site, so this costs nothing.
    assert!(layout.size() > 0, "nodes are never zero-sized");
    #[cfg(not(loom))]
    if let Some(c) = class_of(layout) {
        if let Ok(Some(p)) =
            local::LOCAL.try_with(|l| l.try_borrow_mut().ok().map(|mut l| l.bumps[c].alloc()))
        {
            return p;
        }
        // No thread-local state: a slab of our own for this one block, retired at once.
        let mut bump = crate::slab::Bump::new(CLASS_SIZES[c]);
        return bump.alloc(); // `bump` retires the slab as it drops
    }
    // SAFETY: `layout` is not zero-sized.
    let p = unsafe { std::alloc::alloc(layout) };
    NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
}

/// Gives back memory from [`alloc`] with the same `layout`.
///
/// # Safety
/// `p` came from [`alloc`]`(layout)` (on any thread), is no longer used, and is freed once.
#[inline]
pub(crate) unsafe fn free(p: NonNull<u8>, layout: Layout) {
    #[cfg(not(loom))]
    if class_of(layout).is_some() {
        let batched = local::LOCAL.try_with(|l| match l.try_borrow_mut() {
            Ok(mut l) => {
                // SAFETY: class layouts are only ever served from slabs (`alloc`); per the
                // contract the block is unused and freed once.
                unsafe { l.freer.free(p) };
                true
            }
            Err(_) => false,
        });
        if batched != Ok(true) {
            // SAFETY: as above, unbatched.
            unsafe { crate::slab::free_one(p) };
        }
        return;
    }
    // SAFETY: `alloc` allocated `p` with `layout` from the global allocator (under loom, or not a
    // class layout) and per the contract nobody uses it any more.
    unsafe { std::alloc::dealloc(p.as_ptr(), layout) }
}

/// Tells the slab this thread last freed into about the blocks freed since (a worker calls this
/// before it parks, so an idle worker does not keep a slab alive).
#[inline]
pub(crate) fn flush() {
    #[cfg(not(loom))]
    let _ = local::LOCAL.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.freer.flush();
        }
    });
}

/// The key table's entries come from the same recycled classes (a key is created on the
/// submitting thread and freed on whichever thread runs the epoch's deferred frees: the same
/// producer/consumer pattern as task nodes).
pub(crate) struct Recycled;

// SAFETY: `alloc` returns memory valid for `layout` (a class block of at least its size and
// alignment, or the global allocator's block), and `free` accepts any of them with the same
// layout on any thread (see `free`'s contract).
unsafe impl keyserial_core::table::EntryAlloc for Recycled {
    #[inline]
    fn alloc(layout: Layout) -> NonNull<u8> {
        alloc(layout)
    }

    #[inline]
    unsafe fn free(block: NonNull<u8>, layout: Layout) {
        // SAFETY: per `EntryAlloc::free`'s contract the block came from `alloc(layout)`.
        unsafe { free(block, layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Mutex;

    /// The 512-byte class is reserved for the tests of this module (no other test makes nodes or
    /// key entries that large); they take this lock so that the one counting its depot's
    /// magazines sees no other thread's.
    static LAST_CLASS: Mutex<()> = Mutex::new(());

    /// A block on its way to another thread.
    struct Block(NonNull<u8>);
    // SAFETY: whoever holds the `Block` owns the block.
    unsafe impl Send for Block {}

    fn fill(p: NonNull<u8>, len: usize, v: u8) {
        // SAFETY: callers pass a block of at least `len` bytes that they own.
        unsafe { p.as_ptr().write_bytes(v, len) };
    }

    fn check(p: NonNull<u8>, len: usize, v: u8) {
        // SAFETY: callers pass a block of at least `len` initialised bytes that they own.
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), len) };
        // One slice comparison (a memcmp, cheap under Miri) rather than a byte loop.
        assert!(bytes == vec![v; len], "a block was overwritten while owned");
    }

    #[test]
    fn every_class_and_the_fallback_hand_out_aligned_distinct_blocks() {
        let _last_class = LAST_CLASS.lock().unwrap_or_else(|e| e.into_inner());
        let layouts = [
            Layout::from_size_align(1, 1).unwrap(),
            Layout::from_size_align(64, 8).unwrap(),
            Layout::from_size_align(65, 16).unwrap(),
            Layout::from_size_align(256, 4).unwrap(),
            Layout::from_size_align(300, 16).unwrap(),
            Layout::from_size_align(513, 8).unwrap(),
            Layout::from_size_align(48, 64).unwrap(), // over-aligned: the global allocator
            Layout::from_size_align(4096, 4096).unwrap(),
        ];
        let per = if cfg!(miri) { 3 } else { 40 };
        let mut held = Vec::new();
        for (i, &l) in layouts.iter().enumerate() {
            for _ in 0..per {
                let p = alloc(l);
                assert_eq!(p.as_ptr() as usize % l.align(), 0, "{l:?} misaligned");
                fill(p, l.size(), i as u8);
                held.push((p, l, i as u8));
            }
        }
        let distinct: HashSet<usize> = held.iter().map(|(p, ..)| p.as_ptr() as usize).collect();
        assert_eq!(distinct.len(), held.len());
        for (p, l, v) in held {
            check(p, l.size(), v);
            // SAFETY: from `alloc(l)`, freed once.
            unsafe { free(p, l) };
        }
    }

    /// With the thread's state borrowed (a free from inside an allocation, say) `alloc` gets a
    /// slab of its own and `free` an unbatched decrement; either kind of block can later be
    /// freed the other way.
    #[test]
    fn a_busy_thread_state_falls_back_to_unbatched_slabs() {
        let layout = Layout::new::<[u64; 6]>();
        let batched = alloc(layout);
        fill(batched, layout.size(), 1);
        let (fallback, other) = local::LOCAL.with(|l| {
            let _busy = l.borrow_mut();
            let a = alloc(layout);
            let b = alloc(layout);
            fill(a, layout.size(), 2);
            fill(b, layout.size(), 3);
            check(batched, layout.size(), 1);
            // SAFETY: from `alloc(layout)`, freed once.
            unsafe { free(batched, layout) };
            // SAFETY: as above.
            unsafe { free(b, layout) };
            (a, b.as_ptr() as usize)
        });
        assert_ne!(fallback.as_ptr() as usize, other);
        check(fallback, layout.size(), 2);
        // SAFETY: from `alloc(layout)`, freed once.
        unsafe { free(fallback, layout) };
        flush();
    }

    #[test]
    fn blocks_allocated_on_many_threads_are_freed_on_others() {
        let layout = Layout::new::<[u8; 200]>();
        let (threads, per) = if cfg!(miri) { (2, 40) } else { (4, 1000) };
        let (tx, rx) = std::sync::mpsc::channel::<(Block, u8)>();
        let freer = std::thread::spawn(move || {
            let mut seen = 0;
            for (b, v) in rx {
                check(b.0, layout.size(), v);
                // SAFETY: from `alloc(layout)` on its producer, handed over whole, freed once.
                unsafe { free(b.0, layout) };
                seen += 1;
            }
            seen
        });
        let producers: Vec<_> = (0..threads)
            .map(|t| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for round in 0..2 {
                        let v = (t * 2 + round) as u8;
                        let blocks: Vec<_> = (0..per).map(|_| alloc(layout)).collect();
                        let distinct: HashSet<usize> =
                            blocks.iter().map(|p| p.as_ptr() as usize).collect();
                        assert_eq!(distinct.len(), per, "no block handed out twice");
                        for b in blocks {
                            fill(b, layout.size(), v);
                            tx.send((Block(b), v)).unwrap();
                        }
                    }
                })
            })
            .collect();
        drop(tx);
        for p in producers {
            p.join().unwrap();
        }
        assert_eq!(freer.join().unwrap(), threads * per * 2);
    }

    /// A block freed from a thread-local destructor that runs after the thread's caches are
    /// gone (TLS destructors run in reverse order of registration) takes the fallback path, and
    /// one allocated there can be freed anywhere.
    #[test]
    fn alloc_and_free_after_the_caches_are_destroyed() {
        struct FreeOnExit(Option<NonNull<u8>>);
        impl Drop for FreeOnExit {
            fn drop(&mut self) {
                let layout = Layout::new::<[u64; 4]>();
                if let Some(p) = self.0.take() {
                    // SAFETY: allocated below with `layout`, freed once.
                    unsafe { free(p, layout) };
                }
                let q = alloc(layout);
                // SAFETY: from `alloc(layout)` just now, freed once.
                unsafe { free(q, layout) };
            }
        }
        thread_local! {
            static LATE: std::cell::RefCell<FreeOnExit> =
                const { std::cell::RefCell::new(FreeOnExit(None)) };
        }
        std::thread::spawn(|| {
            // Registered first, so destroyed last: after CACHES.
            LATE.with(|_| ());
            let p = alloc(Layout::new::<[u64; 4]>());
            LATE.with(|l| l.borrow_mut().0 = Some(p));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn classes() {
        assert_eq!(class_of(Layout::new::<[u8; 1]>()), Some(0));
        assert_eq!(class_of(Layout::new::<[u8; 64]>()), Some(0));
        assert_eq!(class_of(Layout::new::<[u8; 65]>()), Some(1));
        assert_eq!(class_of(Layout::new::<[u8; 512]>()), Some(3));
        assert_eq!(class_of(Layout::new::<[u8; 513]>()), None);
        #[repr(align(32))]
        struct Wide(#[allow(dead_code)] [u8; 32]);
        assert_eq!(class_of(Layout::new::<Wide>()), None);
    }

    #[test]
    fn alloc_free_round_trip_across_threads() {
        let layout = Layout::new::<[u64; 10]>();
        let blocks: Vec<usize> = (0..200)
            .map(|i| {
                let p = alloc(layout);
                // SAFETY: a fresh block of at least `layout`.
                unsafe { p.as_ptr().cast::<[u64; 10]>().write([i; 10]) };
                p.as_ptr() as usize
            })
            .collect();
        let mut distinct = blocks.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), blocks.len());
        std::thread::spawn(move || {
            for (i, b) in blocks.into_iter().enumerate() {
                let p = NonNull::new(b as *mut u8).unwrap();
                // SAFETY: written above, handed over whole to this thread.
                assert_eq!(
                    unsafe { p.as_ptr().cast::<[u64; 10]>().read() },
                    [i as u64; 10]
                );
                // SAFETY: from `alloc(layout)`, freed once.
                unsafe { free(p, layout) };
            }
        })
        .join()
        .unwrap();
        let big = Layout::new::<[u8; 4096]>();
        let p = alloc(big);
        // SAFETY: from `alloc(big)`, freed once.
        unsafe { free(p, big) };
    }
}
