//! Where task nodes' memory comes from: four size classes (64, 128, 256 and 512 bytes, 16-byte
//! aligned) recycled through keyserial-core's magazine caches ([`keyserial_core::recycle`]), one
//! cache per thread and class; larger or over-aligned nodes use the global allocator.
//!
//! Why: a node is allocated by the submitting thread and freed by a worker. With glibc that
//! producer/consumer pattern sent every `malloc` and `free` to the locked arena
//! (`_int_malloc` + `malloc_consolidate` were a third of the submitter's time in W2); here freed
//! nodes go back to the submitter in batches of [`BATCH`](keyserial_core::recycle::BATCH). Memory
//! held is bounded: two magazines per thread and class plus 64 shared ones per class.
//!
//! A thread whose cache is gone (during its thread-local destructors) or busy falls back to the
//! global allocator with the class's layout, so any block can always be freed either way.
//!
//! The depots are statics, so they are never dropped; instead each depot counts the caches that
//! use it and the last one to go (a thread's cache is dropped with its thread-local storage)
//! frees every block the depot holds (`keyserial_core::recycle`, "When the depot gives its
//! memory back"). While threads that used keyserial are alive the depots hold at most 64
//! magazines of 32 blocks per class; once they have all ended, nothing. That is what keeps this
//! crate's tests clean under Miri's leak check without `-Zmiri-ignore-leaks`. (A thread whose
//! thread-local destructors never run, such as one still running at process exit, keeps its own
//! two magazines and its depot users; the system takes them back with the process.)

use std::alloc::Layout;
use std::ptr::NonNull;

/// The block sizes of the classes; every class block is [`CLASS_ALIGN`]-aligned.
const CLASS_SIZES: [usize; 4] = [64, 128, 256, 512];
const CLASS_ALIGN: usize = 16;

/// The layout of every block of the class of `size`.
const fn class_layout(size: usize) -> Layout {
    match Layout::from_size_align(size, CLASS_ALIGN) {
        Ok(l) => l,
        Err(_) => panic!("bad class layout"),
    }
}

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
mod cached {
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

/// The layout actually allocated for `layout`.
#[inline]
fn block_layout(layout: Layout) -> Layout {
    match class_of(layout) {
        Some(c) => class_layout(CLASS_SIZES[c]),
        None => layout,
    }
}

/// Memory for a value of `layout` (not zero-sized).
#[inline]
pub(crate) fn alloc(layout: Layout) -> NonNull<u8> {
    // Nodes and entries always have a header; a constant per call site, so this costs nothing.
    assert!(layout.size() > 0, "nodes are never zero-sized");
    #[cfg(not(loom))]
    if let Some(c) = class_of(layout) {
        if let Ok(Some(p)) = cached::CACHES.try_with(|caches| {
            caches
                .try_borrow_mut()
                .ok()
                .map(|mut caches| caches[c].alloc())
        }) {
            return p;
        }
    }
    let block = block_layout(layout);
    // SAFETY: `block` is not zero-sized (neither is `layout`, and classes are at least 64 bytes).
    let p = unsafe { std::alloc::alloc(block) };
    NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(block))
}

/// Gives back memory from [`alloc`] with the same `layout`.
///
/// # Safety
/// `p` came from [`alloc`]`(layout)` (on any thread), is no longer used, and is freed once.
#[inline]
pub(crate) unsafe fn free(p: NonNull<u8>, layout: Layout) {
    #[cfg(not(loom))]
    if let Some(c) = class_of(layout) {
        let cached = cached::CACHES.try_with(|caches| match caches.try_borrow_mut() {
            Ok(mut caches) => {
                // SAFETY: a block of class `c`'s layout, from a cache over `DEPOTS[c]` or from
                // the global allocator with that layout (`alloc`'s fallback): both are what
                // `Cache::free` accepts; per the contract it is unused and freed once.
                unsafe { caches[c].free(p) };
                true
            }
            Err(_) => false,
        });
        if cached == Ok(true) {
            return;
        }
    }
    // SAFETY: `alloc` allocated `p` with `block_layout(layout)` (the class layout, from a cache
    // or the global allocator) and per the contract nobody uses it any more.
    unsafe { std::alloc::dealloc(p.as_ptr(), block_layout(layout)) }
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

    /// With the thread's caches borrowed (a free from inside an allocation, say) `alloc` and
    /// `free` fall back to the global allocator with the class layout, and either kind of block
    /// can later be freed the other way.
    #[test]
    fn a_busy_cache_falls_back_to_the_global_allocator() {
        let layout = Layout::new::<[u64; 6]>();
        let cached = alloc(layout);
        fill(cached, layout.size(), 1);
        let (fallback, also_fallback) = cached::CACHES.with(|caches| {
            let _busy = caches.borrow_mut();
            let a = alloc(layout);
            let b = alloc(layout);
            fill(a, layout.size(), 2);
            fill(b, layout.size(), 3);
            // A cached block freed while the cache is busy goes to the global allocator.
            check(cached, layout.size(), 1);
            // SAFETY: from `alloc(layout)`, freed once.
            unsafe { free(cached, layout) };
            // A fallback block freed the same way.
            // SAFETY: as above.
            unsafe { free(b, layout) };
            (a, b.as_ptr() as usize)
        });
        assert_ne!(fallback.as_ptr() as usize, also_fallback);
        check(fallback, layout.size(), 2);
        // A fallback block freed into the cache, then handed out again from it.
        // SAFETY: from `alloc(layout)`, freed once.
        unsafe { free(fallback, layout) };
        let again = alloc(layout);
        assert_eq!(
            again, fallback,
            "the cache reuses the block it was just given"
        );
        // SAFETY: as above.
        unsafe { free(again, layout) };
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

    /// A thread's caches are torn down with its thread-local storage: their magazines go to the
    /// depot, where another thread's cache picks them up; and once the last cache over a depot
    /// is gone the depot holds nothing (so no block is left behind at exit).
    #[test]
    fn caches_torn_down_at_thread_exit_hand_their_blocks_on() {
        let _only_us = LAST_CLASS.lock().unwrap_or_else(|e| e.into_inner());
        const CLASS: usize = 3;
        let layout = Layout::new::<[u8; 512]>();
        assert_eq!(class_of(layout), Some(CLASS));
        let depot = &cached::DEPOTS[CLASS];
        let batch = keyserial_core::recycle::BATCH;
        assert_eq!(
            depot.magazines(),
            0,
            "no thread uses this class between the tests"
        );

        let user = std::thread::spawn(move || {
            // Become a user of the depot: free enough blocks to rotate a magazine.
            let mine: Vec<_> = (0..2 * batch + 1).map(|_| alloc(layout)).collect();
            for b in mine {
                // SAFETY: from `alloc(layout)`, freed once.
                unsafe { free(b, layout) };
            }
            // Blocks for another thread to free and take down with it.
            let given: Vec<_> = (0..3 * batch).map(|_| Block(alloc(layout))).collect();
            let given_at: HashSet<usize> = given.iter().map(|b| b.0.as_ptr() as usize).collect();
            std::thread::spawn(move || {
                for b in given {
                    fill(b.0, layout.size(), 0xEE);
                    // SAFETY: from `alloc(layout)`, handed over whole, freed once.
                    unsafe { free(b.0, layout) };
                }
            })
            .join()
            .unwrap();
            // The other thread's whole cache is in the depot now: three magazines.
            assert_eq!(depot.magazines(), 3);
            // This thread's cache is empty (`given` took its blocks and the magazine it had
            // rotated into the depot), so its next allocations take the depot's three
            // magazines: every given block comes back.
            let back: Vec<_> = (0..3 * batch + 1).map(|_| alloc(layout)).collect();
            let back_at: HashSet<usize> = back.iter().map(|p| p.as_ptr() as usize).collect();
            assert!(
                given_at.is_subset(&back_at),
                "the exited thread's blocks came back"
            );
            for b in back {
                // SAFETY: from `alloc(layout)`, freed once.
                unsafe { free(b, layout) };
            }
        });
        user.join().unwrap();
        assert_eq!(
            depot.magazines(),
            0,
            "the last user's exit emptied the depot"
        );
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
