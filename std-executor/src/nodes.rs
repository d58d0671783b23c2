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
