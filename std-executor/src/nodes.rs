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

/// The key table's entries do **not** come from slabs: a key may live for hours while the task
/// nodes around it come and go, and one long-lived entry would pin a whole 16 KiB slab. They use
/// the same four classes through keyserial-core's magazine caches instead (a key is created on the
/// submitting thread and freed on whichever thread runs the epoch's deferred frees; freed blocks
/// travel back in batches of [`BATCH`](keyserial_core::recycle::BATCH), and the memory held is
/// bounded: two magazines per thread and class plus 64 shared ones).
/// The depots are statics that count their caches; the last cache to go empties its depot
/// (`keyserial_core::recycle`, "When the depot gives its memory back").
pub(crate) struct Recycled;

const fn class_layout(size: usize) -> Layout {
    match Layout::from_size_align(size, CLASS_ALIGN) {
        Ok(l) => l,
        Err(_) => panic!("bad class layout"),
    }
}

/// The layout actually allocated for an entry of `layout`.
#[inline]
fn entry_block_layout(layout: Layout) -> Layout {
    match class_of(layout) {
        Some(c) => class_layout(CLASS_SIZES[c]),
        None => layout,
    }
}

#[cfg(not(loom))]
mod magazines {
    use std::cell::RefCell;

    use keyserial_core::recycle::{Cache, Depot};

    use super::{class_layout, CLASS_SIZES};

    /// Magazines kept per class beyond the threads' own.
    const DEPOT_MAGAZINES: usize = 64;

    pub(super) static DEPOTS: [Depot<DEPOT_MAGAZINES>; 4] = [
        Depot::new(class_layout(CLASS_SIZES[0])),
        Depot::new(class_layout(CLASS_SIZES[1])),
        Depot::new(class_layout(CLASS_SIZES[2])),
        Depot::new(class_layout(CLASS_SIZES[3])),
    ];

    thread_local! {
        pub(super) static CACHES: RefCell<[Cache<'static, DEPOT_MAGAZINES>; 4]> = const {
            RefCell::new([
                Cache::new(&DEPOTS[0]),
                Cache::new(&DEPOTS[1]),
                Cache::new(&DEPOTS[2]),
                Cache::new(&DEPOTS[3]),
            ])
        };
    }
}

// SAFETY: `alloc` returns memory valid for `layout` (a class block of at least its size and
// alignment, from a magazine or the global allocator, or the global allocator's block for
// `layout`), and `free` accepts any of them with the same layout on any thread.
unsafe impl keyserial_core::table::EntryAlloc for Recycled {
    #[inline]
    fn alloc(layout: Layout) -> NonNull<u8> {
        assert!(layout.size() > 0, "entries are never zero-sized");
        #[cfg(not(loom))]
        if let Some(c) = class_of(layout) {
            if let Ok(Some(p)) = magazines::CACHES.try_with(|caches| {
                caches
                    .try_borrow_mut()
                    .ok()
                    .map(|mut caches| caches[c].alloc())
            }) {
                return p;
            }
        }
        let block = entry_block_layout(layout);
        // SAFETY: `block` is not zero-sized (neither is `layout`; classes are 64 bytes or more).
        let p = unsafe { std::alloc::alloc(block) };
        NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(block))
    }

    #[inline]
    unsafe fn free(block: NonNull<u8>, layout: Layout) {
        #[cfg(not(loom))]
        if let Some(c) = class_of(layout) {
            let cached = magazines::CACHES.try_with(|caches| match caches.try_borrow_mut() {
                Ok(mut caches) => {
                    // SAFETY: a class-`c` block from a cache over `DEPOTS[c]` or the global
                    // allocator (`alloc`'s fallback), as `Cache::free` accepts; unused and freed
                    // once per `EntryAlloc::free`'s contract.
                    unsafe { caches[c].free(block) };
                    true
                }
                Err(_) => false,
            });
            if cached == Ok(true) {
                return;
            }
        }
        // SAFETY: `alloc` allocated `block` with `entry_block_layout(layout)` (a magazine's class
        // block or the global allocator's), and per the contract nobody uses it any more.
        unsafe { std::alloc::dealloc(block.as_ptr(), entry_block_layout(layout)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_from_magazines_and_go_back_on_any_thread() {
        use keyserial_core::table::EntryAlloc;
        let layout = Layout::from_size_align(100, 8).unwrap();
        let n = if cfg!(miri) { 70 } else { 1_000 };
        let blocks: Vec<usize> = (0..n)
            .map(|i| {
                let p = Recycled::alloc(layout);
                // SAFETY: a fresh block of at least 100 bytes.
                unsafe { p.as_ptr().write_bytes(i as u8, 100) };
                p.as_ptr() as usize
            })
            .collect();
        let distinct: std::collections::HashSet<_> = blocks.iter().collect();
        assert_eq!(distinct.len(), n, "no block handed out twice");
        std::thread::spawn(move || {
            for b in blocks {
                let p = NonNull::new(b as *mut u8).unwrap();
                // SAFETY: each block came from `Recycled::alloc(layout)` and is freed once.
                unsafe { Recycled::free(p, layout) };
            }
        })
        .join()
        .unwrap();
        // What the other thread freed comes back here through the depot.
        let p = Recycled::alloc(layout);
        // SAFETY: from `alloc(layout)`, freed once.
        unsafe { Recycled::free(p, layout) };
    }
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
