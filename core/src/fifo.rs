//! A lane's FIFO: any thread pushes, one thread at a time pops (the lane's owner, whose turn passes
//! through [`crate::lane`]'s word with Acquire/Release), anyone may check emptiness. Items live in
//! the slots of blocks, in push order, several to a cache line (or one of up to a line): a reader
//! walks memory as it was written, with no node per item and no pointer to chase.
//!
//! # Layout
//!
//! Blocks of [`BLOCK`] slots linked by `next`; a slot is a `tag` word and the item. The *tail* is a
//! position counter plus the block it points into; the *head* likewise, the popper's. Positions run
//! `lap * (BLOCK + 1) + offset`: offsets `0..BLOCK` are slots, and offset `BLOCK` is a gap: the
//! block's last slot was just taken and its taker is installing the next block. A slot holds its
//! item once its tag, the pusher's last store to it, is not 0. The tag is the caller's ([`Tag`],
//! never 0): an item word it would otherwise store inside (a `keyserial` lane's task table pointer,
//! so a 40-byte item and its tag make a 48-byte slot), or [`UNTAGGED`] for the plain
//! [`push`](Fifo::push) and [`pop`](Fifo::pop). Blocks enter clean (below), so no earlier tag
//! shows.
//!
//! A block starts at a cache line (a 64-byte slot is one line, 48-byte slots come four to three
//! lines, alike in every block); its allocation asks only for its own alignment plus room to shift
//! it there (`base` keeps the start), which for items aligned to at most 16 bytes is a plain
//! `malloc`, avoiding glibc's `memalign` (which splits a bigger chunk).
//!
//! # Spare blocks
//!
//! The popper does not free a block it empties: it gives it to a stack of *spares* (`spares`,
//! linked through `next`), whence installers take theirs, so a FIFO that drains and fills in bursts
//! allocates only when its backlog outgrows what it held before.
//!
//! - **Givers push** (the popper, a block it emptied; a pusher, one it allocated for an install it
//!   lost): write the block's `next` (the stack below), then CAS the top to it (Release).
//! - `spare_count` (raised before a give's CAS, lowered after a take's) keeps the stack near
//!   `SPARES` (64 blocks): past it, a losing pusher frees its block and the popper puts its own on
//!   its excess list.
//! - **Only the installer takes**, one at a time: the pusher whose CAS took a block's last slot
//!   pops the stack *after* its CAS (read the top, Acquire; its `next`; CAS the top to that,
//!   Acquire), and each lap's install happens before the position enters the lap (Release/Acquire),
//!   so the next take follows this one. Nobody else pops a block on the stack and its `next` does
//!   not change there, so a top that reads `X` still has `X`'s `next` below: no ABA. A pusher that
//!   sees no spare before its CAS allocates before it (an installer's wait holds up every pusher)
//!   and gives the block if it loses; one that finds the spare it saw gone allocates after.
//!
//! The popper's *excess list* (`excess`, its alone, linked through `next`) holds the blocks it
//! empties while the spares are full, and is freed when a pop finds the FIFO empty: a backlog's
//! blocks go back at once, after it, not one per [`BLOCK`] items during the drain, which keeps
//! glibc's sweep of freed boxed tasks off the drain (measured: run AA, in BENCHMARKS.md's history).
//! After each block it gives up, the popper refills the spares from the list to `SPARES`, for a
//! backlog that grows again. The popper never allocates: only a pusher whose spares ran out does
//! (its backlog outgrew the FIFO's blocks or outran the refills), in its own arena, where it reuses
//! the memory of tasks already run rather than a worker's fresh page (measured: BENCHMARKS.md, runs
//! AC and AD).
//!
//! The list's bound is the backlog's peak: giving up a block with the spares full, the popper reads
//! the tail (on the line it just read the count from) and keeps in `peak` (its own; reset when a
//! pop finds the FIFO empty) the most blocks it has seen in the backlog, this one included. The
//! list holds at most that many, or `EXCESS` (1024 blocks) if more; a block past that is freed. So
//! draining a backlog pushed while the list was empty frees nothing however long it runs (it needs
//! no more than the backlog's blocks when the spares filled), and the list stays within the largest
//! backlog since the FIFO was last found empty. But a new burst may allocate beside the list: installers
//! take only from the spares, refilled one given-up block at a time, so a burst that outruns the
//! popper by more than `SPARES` blocks allocates, and the next drain, past the bound, frees block
//! by block. A FIFO so holds its blocks in use, at most `SPARES` spares and `max(EXCESS, peak)`
//! excess blocks until a pop finds it empty; one never found empty keeps its largest backlog's
//! blocks, as a growable array its capacity.
//!
//! # Clean blocks
//!
//! A block is *clean* when all its tags are 0; only clean blocks enter the FIFO ([`Fifo::new`]'s
//! first, each one an installer links in). A new block is made clean; a spare's installer clears
//! its tags between taking and publishing it (storing the tail block, then moving the position past
//! the gap), with plain stores, as it has the block to itself: it is off the stack, its last user
//! (the popper that gave it up) finished before the give (Release) the take acquired, and nobody
//! reaches it unpublished. Then pushers of the new lap reserve after the position moved (Acquire),
//! so their tag stores follow the clearing; the popper reaches the block through `next`, linked
//! after the clearing and before the installer writes its own slot (the old block's last), and
//! reads `next` after that slot's tag (Acquire), so its tag loads follow the clearing too. A tag
//! the popper reads is so 0 or this lap's. Clearing, the price of a tag that is an item word (8
//! bytes a slot saved), is one installer store per slot, to lines this lap's pushers will write
//! anyway; the popper clears nothing.
//!
//! # Protocol
//!
//! - **Push** (any thread). Read the tail position, then the tail block (both Acquire). At offset
//!   `BLOCK` another pusher is installing: wait and reread. Otherwise reserve the slot by a CAS of
//!   the position `p -> p + 1` (`SeqCst`; a failure rereads both); only after it succeeds does the
//!   pusher touch the block it read. The one that took the last slot (offset `BLOCK - 1`, leaving
//!   the position at the gap) installs the next block ("Spare blocks"), clean ("Clean blocks"): it
//!   stores the tail block (Release), moves the position past the gap to the next lap's offset 0
//!   (Release; nobody else moves it at the gap), links `next` from the old block (Release), then
//!   writes its own slot. Writing a slot: the item (built only now by [`Fifo::push_with`]'s `make`,
//!   which must not unwind: the popper waits for the slot, so unwinding aborts), then the tag
//!   (Release; never 0), the pusher's last access to the block. The block read is the right one:
//!   the tail block is stored *before* the position enters its lap, so a pusher that read position
//!   `p` (Acquire) reads that lap's block or a later one, and a later one means the position moved
//!   on and the CAS from `p` fails. Positions only grow, so a successful CAS from `p` proves the
//!   block is `p`'s.
//! - **Close** (any thread, [`Fifo::close`]): `fetch_or` of the position's top bit (`SeqCst`). A
//!   pusher that reads it refuses, handing its item back unbuilt ([`Fifo::try_push_with`]); a
//!   reserving CAS from a position without the bit fails once it is set, so every reservation
//!   precedes the close in the position's modification order (its item is in) or is refused. The
//!   installer passes the gap with an add, not a store, keeping a close that lands at the gap.
//!   Position comparisons mask the bit off.
//! - **Pop** (only the popper; [`Fifo::pop`] is `unsafe` for that). Empty when the head position
//!   equals the tail's, as the popper last read it (`tail_seen`, its own); it rereads the tail
//!   (Acquire) only if the head caught up with it *and* the head's slot is unwritten (a written
//!   slot proves the tail is past it; blocks enter clean, so no tag is stale): a tail once read
//!   stays reserved, so while items flow the popper does not pull the pushers' line to its core
//!   each pop. Otherwise the slot was reserved: wait for its tag to be non-0 (Acquire: the item
//!   and, for a last slot, `next` are visible), read the item, advance the head (a Release store: a
//!   reader of the old head only thinks the FIFO longer). After a block's last slot, follow `next`
//!   (stored before that slot was written), skip the gap, and give the old block up (to the spares,
//!   else the excess list, else freed).
//! - **Peek** (only the popper, [`Fifo::peek_with`]): read the head's slot as a pop does (its tag
//!   Acquire, non-0, or nothing) and lend the item to the caller's closure, moving nothing (no head
//!   store, no block given up), so the next pop reads the same tag. The closure may neither pop nor
//!   pass the turn, so slot and block outlive it. Loom: `a_peek_sees_what_the_next_pop_takes`.
//!
//! # Why nothing is lost, doubled or freed early
//!
//! - One successful CAS reserves a slot, so one pusher writes it; the popper reads it once, after
//!   its tag (Release/Acquire), and the head passes it. The tag is 0 until then (the block entered
//!   clean), so the popper never reads it early.
//! - Each pusher's items take increasing positions, and the popper reads positions in order: pops
//!   follow the order in which the CASes succeeded, which respects each thread's push order (and
//!   any happens-before order between pushes).
//! - The popper gives a block up (to the spares, its excess list, or the allocator) after reading
//!   all its slots, so after every pusher of it stored its tag, its last access; a pusher whose CAS
//!   failed never touched it. So nobody uses a given-up block until an installer takes it from the
//!   spares (Acquire), cleans it and links it in as new. The excess list, its length and `peak` are
//!   the popper's alone, whose turn passes with Release/Acquire, so `Relaxed` suffices for them;
//!   its `Relaxed` tail read in `retire` only sizes the bound: a stale value keeps or frees one
//!   block more or less, never one in use.
//! - Emptiness, [`Fifo::is_empty`]: two `SeqCst` loads (head, then tail). The reserving CAS is
//!   `SeqCst` too, so a thread that fences `SeqCst` after its push and one that fences before its
//!   emptiness check cannot both miss each other (the lane's wake protocol relies on that, as on
//!   crossbeam's `SegQueue`, whose indices behave alike).
//!
//! The model in `loom/tests/fifo.rs` runs this code with 2-slot blocks: pushers racing across block
//! installs, against a popper, and the popper's turn handed between threads.

#[cfg(loom)]
use alloc::boxed::Box;
use core::mem::MaybeUninit;
use core::ptr;

use crossbeam_utils::{Backoff, CachePadded};

use crate::prefetch::{prefetch, prefetch_write};
use crate::sync::{set_exclusive, AtomicPtr, AtomicUsize, Ordering, UnsafeCell};

/// Slots per block: a [`Fifo`] allocates, keeps and frees its memory in blocks of this many
/// items (a slot is one `T` and one tag word), so this is the unit of its memory use. A lane's
/// 40-byte item and its tag make 48-byte slots, so a block is about 3 KiB.
///
/// ```
/// use keyserial_core::fifo::{Fifo, BLOCK};
/// let q = Fifo::new();
/// // A backlog of three blocks' worth of items, popped in push order across the blocks.
/// (0..3 * BLOCK).for_each(|i| q.push(i));
/// // SAFETY: this thread is the only popper.
/// assert!((0..3 * BLOCK).all(|i| unsafe { q.pop() } == Some(i)));
/// ```
#[cfg(not(any(loom, miri)))]
pub const BLOCK: usize = 63;
/// Slots per block (few under Miri, so that its tests cross many blocks, and refill the spares,
/// in little interpreted time).
#[cfg(all(miri, not(loom)))]
pub const BLOCK: usize = 4;
/// Slots per block (small under loom, so that the models cross blocks).
#[cfg(loom)]
pub const BLOCK: usize = 2;

/// At most this many spare blocks are kept (see "Spare blocks"): 192 KiB of 48-byte slots.
#[cfg(not(any(loom, miri)))]
const SPARES: usize = 64;
/// At most this many spare blocks are kept (few under Miri, as [`BLOCK`]).
#[cfg(all(miri, not(loom)))]
const SPARES: usize = 4;
/// At most this many spare blocks are kept (two under loom, so that the models fill the stack).
#[cfg(loom)]
const SPARES: usize = 2;

/// The popper's excess list may always hold this many blocks, and more only up to the
/// backlog's peak (see "Spare blocks"): 3 MiB of 48-byte slots.
#[cfg(not(any(loom, miri)))]
const EXCESS: usize = 1024;
/// The popper's excess list may always hold this many blocks (few under Miri, as [`BLOCK`]).
#[cfg(all(miri, not(loom)))]
const EXCESS: usize = 4;
/// The popper's excess list may always hold this many blocks (under loom: one, so that a model
/// reaches the bound).
#[cfg(loom)]
const EXCESS: usize = 1;

/// Positions per block: the slots and the gap.
const LAP: usize = BLOCK + 1;

/// The tail position's top bit: set by [`Fifo::close`], never cleared. Positions stay below it
/// (2^63 pushes on 64-bit targets; 2^31 on 32-bit ones, where a FIFO must be dropped first).
const CLOSED: usize = 1 << (usize::BITS - 1);

struct Slot<T> {
    /// The item's [`Tag`] once it is written; 0 before (see "Clean blocks").
    tag: AtomicUsize,
    value: UnsafeCell<MaybeUninit<T>>,
}

/// The word a pusher stores last into its slot, which tells the popper that the item is
/// written: the caller's choice, never 0 (see "Layout"), handed back with the item by
/// [`Fifo::pop_tagged`].
///
/// ```
/// use keyserial_core::fifo::{Fifo, Tag};
/// let q = Fifo::new();
/// let tag = Tag::new(0x40).unwrap();
/// assert!(q.try_push_tagged(|| (tag, "item")).is_ok());
/// // SAFETY: this thread is the only popper.
/// assert_eq!(unsafe { q.pop_tagged() }, Some((tag, "item")));
/// ```
pub type Tag = core::num::NonZeroUsize;

/// The tag of an item pushed without one ([`Fifo::push`], [`Fifo::try_push_with`]).
///
/// ```
/// use keyserial_core::fifo::{Fifo, UNTAGGED};
/// let q = Fifo::new();
/// q.push(3);
/// // SAFETY: this thread is the only popper.
/// assert_eq!(unsafe { q.pop_tagged() }, Some((UNTAGGED, 3)));
/// ```
pub const UNTAGGED: Tag = match Tag::new(1) {
    Some(tag) => tag,
    None => unreachable!(),
};

/// A cache line: where a block's slots start (see "Layout").
#[cfg(not(loom))]
const LINE: usize = 64;

// Under loom a block is a `Box` aligned to a line, which is how loom/tests/fifo.rs counts them.
#[repr(C)]
#[cfg_attr(loom, repr(align(64)))]
struct Block<T> {
    slots: [Slot<T>; BLOCK],
    next: AtomicPtr<Block<T>>,
    /// Where the allocation starts: the block itself starts up to `LINE - 1` bytes after it,
    /// at the first line boundary.
    #[cfg(not(loom))]
    base: *mut u8,
}

impl<T> Block<T> {
    /// The layout of a block's allocation: the block and room to move it to a line boundary.
    #[cfg(not(loom))]
    fn layout() -> core::alloc::Layout {
        let align = core::mem::align_of::<Block<T>>();
        let slack = LINE.saturating_sub(align);
        let size = core::mem::size_of::<Block<T>>() + slack;
        match core::alloc::Layout::from_size_align(size, align) {
            Ok(layout) => layout,
            Err(_) => panic!("a FIFO block of {size} bytes"),
        }
    }

    /// A new block, on the heap, starting at a line boundary: clean (every tag 0), no `next`.
    #[cfg(not(loom))]
    fn alloc() -> *mut Block<T> {
        let layout = Self::layout();
        // SAFETY: the layout's size is not zero (a `Block` has a `next` pointer).
        let base = unsafe { alloc::alloc::alloc(layout) };
        if base.is_null() {
            alloc::alloc::handle_alloc_error(layout);
        }
        // The first line boundary at or after `base`, unless the block's own alignment is a
        // line or more (then `base` is aligned already and there is no slack).
        let shift = if layout.align() >= LINE {
            0
        } else {
            (base as usize).wrapping_neg() & (LINE - 1)
        };
        // SAFETY: `base` and the next line boundary are both multiples of `align` (a power of
        // two below `LINE`), so `shift <= LINE - align`, the room the layout added after the
        // block: the block fits in the allocation from `base + shift`, aligned for `Block`.
        let p = unsafe { base.add(shift) }.cast::<Block<T>>();
        for i in 0..BLOCK {
            // SAFETY: `p` is in a fresh allocation, aligned and with room for a `Block`; only
            // the tags, `next` and `base` need values (the items are `MaybeUninit`).
            unsafe { ptr::addr_of_mut!((*p).slots[i].tag).write(AtomicUsize::new(0)) };
        }
        // SAFETY: as above.
        unsafe { ptr::addr_of_mut!((*p).next).write(AtomicPtr::new(ptr::null_mut())) };
        // SAFETY: as above.
        unsafe { ptr::addr_of_mut!((*p).base).write(base) };
        p
    }

    /// A new block, on the heap (loom's atomics must be made by their constructors).
    #[cfg(loom)]
    fn alloc() -> *mut Block<T> {
        Box::into_raw(Box::new(Block {
            slots: core::array::from_fn(|_| Slot {
                tag: AtomicUsize::new(0),
                value: UnsafeCell::new(MaybeUninit::uninit()),
            }),
            next: AtomicPtr::new(ptr::null_mut()),
        }))
    }

    /// Frees `block`.
    ///
    /// # Safety
    ///
    /// `block` came from [`Block::alloc`] and nobody uses it any more.
    #[cfg(not(loom))]
    unsafe fn free(block: *mut Block<T>) {
        // SAFETY: the caller's contract: `alloc` wrote `base`, the start of the allocation it
        // made with `layout()`.
        unsafe { alloc::alloc::dealloc((*block).base, Self::layout()) };
    }

    /// Frees `block`.
    ///
    /// # Safety
    ///
    /// `block` came from [`Block::alloc`] and nobody uses it any more.
    #[cfg(loom)]
    unsafe fn free(block: *mut Block<T>) {
        // SAFETY: the caller's contract; under loom `alloc` made it with `Box`.
        drop(unsafe { Box::from_raw(block) });
    }

    /// Frees every block of the list that starts at `first` (null: none), linked through
    /// `next`.
    ///
    /// # Safety
    ///
    /// Each block of the list came from [`Block::alloc`], and nobody uses any of them any more.
    unsafe fn free_list(first: *mut Block<T>) {
        let mut block = first;
        while !block.is_null() {
            // SAFETY: the caller's contract: live, and its `next` is the one below it.
            let below = unsafe { (*block).next.load(Ordering::Relaxed) };
            // SAFETY: the caller's contract; `below` was read first.
            unsafe { Block::free(block) };
            block = below;
        }
    }

    /// Makes `block` clean: every tag 0 (see "Clean blocks").
    ///
    /// # Safety
    ///
    /// `block` is live, and the caller has it to itself: nobody else can reach it, and its
    /// last user's accesses happen before this call.
    unsafe fn clean(block: *mut Block<T>) {
        // SAFETY: the caller's contract: live and ours alone, so a unique borrow of its slots
        // is sound while it lasts.
        let slots = unsafe { &mut (*block).slots };
        for slot in slots.iter_mut() {
            set_exclusive(&mut slot.tag, 0);
        }
    }
}

/// A position and the block it points into.
struct End<T> {
    index: AtomicUsize,
    block: AtomicPtr<Block<T>>,
}

/// The head, and the last tail the popper read (see "Protocol").
struct Head<T> {
    end: End<T>,
    tail_seen: AtomicUsize,
    /// Blocks the popper emptied while the spares were full, linked through `next`: the
    /// popper's alone, freed when it next finds the FIFO empty (see "Spare blocks").
    excess: AtomicPtr<Block<T>>,
    /// How many blocks the excess list holds (the popper's alone).
    excess_len: AtomicUsize,
    /// The most blocks the popper has seen in the backlog (the one it gives up included) since a
    /// pop last found the FIFO empty (its own): with [`EXCESS`], the excess list's bound.
    peak: AtomicUsize,
}

/// The tail, and the stack of spare blocks (see "Spare blocks").
struct Tail<T> {
    end: End<T>,
    /// The top spare, or null.
    spares: AtomicPtr<Block<T>>,
    /// How many spares: at least the stack's height (raised before a give, lowered after a take).
    spare_count: AtomicUsize,
}

/// A multi-pusher, one-popper-at-a-time FIFO with items stored in blocks of slots (see the
/// module docs).
///
/// ```
/// use keyserial_core::fifo::Fifo;
/// let q = Fifo::new();
/// q.push(1);
/// q.push(2);
/// assert!(!q.is_empty());
/// // SAFETY: this thread is the only popper.
/// assert_eq!(unsafe { q.pop() }, Some(1));
/// assert_eq!(unsafe { q.pop() }, Some(2));
/// assert_eq!(unsafe { q.pop() }, None);
/// assert!(q.is_empty());
/// ```
pub struct Fifo<T> {
    head: CachePadded<Head<T>>,
    tail: CachePadded<Tail<T>>,
}

// SAFETY: items move between threads (pushed on one, popped on another), so `T: Send` is needed
// and enough: no `&T` is ever shared, and the blocks are reached only through the protocol.
unsafe impl<T: Send> Send for Fifo<T> {}
// SAFETY: as above; every shared access is an atomic or a slot access ordered by the protocol.
unsafe impl<T: Send> Sync for Fifo<T> {}

impl<T> Default for Fifo<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Fifo<T> {
    /// An empty FIFO (one block allocated).
    ///
    /// ```
    /// let q: keyserial_core::fifo::Fifo<u8> = keyserial_core::fifo::Fifo::new();
    /// assert!(q.is_empty());
    /// ```
    pub fn new() -> Fifo<T> {
        let block = Block::alloc();
        Fifo {
            head: CachePadded::new(Head {
                end: End {
                    index: AtomicUsize::new(0),
                    block: AtomicPtr::new(block),
                },
                tail_seen: AtomicUsize::new(0),
                excess: AtomicPtr::new(ptr::null_mut()),
                excess_len: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
            }),
            tail: CachePadded::new(Tail {
                end: End {
                    index: AtomicUsize::new(0),
                    block: AtomicPtr::new(block),
                },
                spares: AtomicPtr::new(ptr::null_mut()),
                spare_count: AtomicUsize::new(0),
            }),
        }
    }

    /// Appends `value` (any thread). Lock-free except that a pusher waits while another one,
    /// which took a block's last slot, installs the next block (two stores).
    ///
    /// ```
    /// let q = keyserial_core::fifo::Fifo::new();
    /// q.push("a");
    /// assert_eq!(q.len(), 1);
    /// ```
    ///
    /// # Panics
    ///
    /// If the FIFO was closed ([`Fifo::close`]); [`Fifo::try_push_with`] hands the item back
    /// instead.
    pub fn push(&self, value: T) {
        self.push_with(move || value);
    }

    /// Appends the item `make` returns, calling it only once the item's slot is reserved, so
    /// that the item is built where it is stored (nothing to copy in from the caller's frame).
    ///
    /// `make` must not unwind: the popper waits for the reserved slot, so a `make` that panics
    /// aborts the process instead.
    ///
    /// ```
    /// let q = keyserial_core::fifo::Fifo::new();
    /// q.push_with(|| [7u64; 4]);
    /// // SAFETY: the only popper.
    /// assert_eq!(unsafe { q.pop() }, Some([7; 4]));
    /// ```
    ///
    /// # Panics
    ///
    /// If the FIFO was closed ([`Fifo::close`]), without calling `make`.
    #[inline]
    pub fn push_with(&self, make: impl FnOnce() -> T) {
        if self.try_push_with(make).is_err() {
            panic!("push onto a closed Fifo");
        }
    }

    /// [`push_with`](Self::push_with), or, once the FIFO is closed ([`Fifo::close`]), `make`
    /// handed back uncalled. A push whose slot was reserved before the close is in the FIFO.
    ///
    /// ```
    /// let q = keyserial_core::fifo::Fifo::new();
    /// assert!(q.try_push_with(|| 1).is_ok());
    /// q.close();
    /// let back = q.try_push_with(|| 2).err().expect("closed");
    /// assert_eq!(back(), 2);
    /// // SAFETY: the only popper.
    /// assert_eq!(unsafe { q.pop() }, Some(1));
    /// ```
    #[inline]
    pub fn try_push_with<F: FnOnce() -> T>(&self, make: F) -> Result<(), F> {
        let Some(slot) = self.reserve() else {
            return Err(make);
        };
        Self::write(slot, || (UNTAGGED, make()));
        Ok(())
    }

    /// [`try_push_with`](Self::try_push_with) for an item with its own [`Tag`]: `make` returns
    /// both, and [`pop_tagged`](Self::pop_tagged) hands both back. (The tag is stored last, as
    /// the slot's "written" mark, so the item need not hold that word itself; see "Layout".)
    ///
    /// ```
    /// use keyserial_core::fifo::{Fifo, Tag};
    /// let q = Fifo::new();
    /// let tag = Tag::new(8).unwrap();
    /// assert!(q.try_push_tagged(|| (tag, [1u64, 2])).is_ok());
    /// // SAFETY: this thread is the only popper.
    /// assert_eq!(unsafe { q.peek_tagged(|t, v| (t, v[1])) }, Some((tag, 2)));
    /// // SAFETY: as above.
    /// assert_eq!(unsafe { q.pop_tagged() }, Some((tag, [1, 2])));
    /// ```
    #[inline]
    pub fn try_push_tagged<F: FnOnce() -> (Tag, T)>(&self, make: F) -> Result<(), F> {
        let Some(slot) = self.reserve() else {
            return Err(make);
        };
        Self::write(slot, make);
        Ok(())
    }

    /// Writes the item `make` returns into `slot`, reserved by this pusher, then its tag.
    #[inline(always)]
    fn write(slot: &Slot<T>, make: impl FnOnce() -> (Tag, T)) {
        let bomb = AbortOnUnwind;
        let (tag, value) = make();
        core::mem::forget(bomb);
        slot.value.with_mut(|p| {
            // SAFETY: `reserve` made the slot ours alone; nobody else reads or writes it until
            // its tag says it is written.
            unsafe { (*p).write(value) };
        });
        slot.tag.store(tag.get(), Ordering::Release);
    }

    /// Closes the FIFO to pushes (any thread; idempotent): every push whose reservation comes
    /// after this in the tail's modification order is refused. Pops go on.
    ///
    /// ```
    /// let q: keyserial_core::fifo::Fifo<u8> = keyserial_core::fifo::Fifo::new();
    /// q.close();
    /// assert!(q.is_closed() && q.try_push_with(|| 1).is_err());
    /// ```
    pub fn close(&self) {
        self.tail.end.index.fetch_or(CLOSED, Ordering::SeqCst);
    }

    /// Whether [`close`](Self::close) was called (a snapshot; once `true`, it stays `true`).
    ///
    /// ```
    /// let q = keyserial_core::fifo::Fifo::new();
    /// q.push(1);
    /// assert!(!q.is_closed());
    /// q.close();
    /// assert!(q.is_closed());
    /// // Closing refuses pushes only: what was queued still pops.
    /// // SAFETY: this thread is the only popper.
    /// assert_eq!(unsafe { q.pop() }, Some(1));
    /// assert!(q.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.tail.end.index.load(Ordering::SeqCst) & CLOSED != 0
    }

    /// How many items were ever pushed (reserved, counting pushes still writing): a snapshot.
    ///
    /// ```
    /// let q = keyserial_core::fifo::Fifo::new();
    /// (0..100).for_each(|i| q.push(i));
    /// // SAFETY: the only popper.
    /// unsafe { q.pop() };
    /// assert_eq!(q.pushed(), 100);
    /// ```
    pub fn pushed(&self) -> usize {
        slots_before(self.tail.end.index.load(Ordering::Acquire) & !CLOSED)
    }

    /// How many items the popper has taken so far (tombstoned ones too): the index, in push
    /// order, of the oldest item still queued. Exact for the popper; a snapshot for others.
    ///
    /// ```
    /// let q = keyserial_core::fifo::Fifo::new();
    /// (0..100).for_each(|i| q.push(i));
    /// // SAFETY: the only popper.
    /// unsafe { q.pop() };
    /// assert_eq!(q.popped(), 1);
    /// ```
    pub fn popped(&self) -> usize {
        slots_before(self.head.end.index.load(Ordering::Acquire))
    }

    /// Reserves the next slot (see "Protocol"), or `None` once the FIFO is closed. Lock-free except
    /// that a pusher waits while another one, which took a block's last slot, installs the next
    /// block (two stores).
    ///
    /// Inline, the common case: an open FIFO, a slot that is not its block's last, and a CAS
    /// that succeeds at the first try. Anything else starts over in
    /// [`reserve_slow`](Self::reserve_slow), out of line.
    #[inline]
    fn reserve(&self) -> Option<&Slot<T>> {
        let tail = self.tail.end.index.load(Ordering::Acquire);
        let block = self.tail.end.block.load(Ordering::Acquire);
        let offset = tail % LAP;
        if tail & CLOSED == 0
            && offset + 1 < BLOCK
            && self
                .tail
                .end
                .index
                .compare_exchange_weak(tail, tail + 1, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
        {
            // SAFETY: our CAS from `tail` succeeded, so `block` is `tail`'s block (module docs),
            // live until the popper has read slot `offset`; `offset + 1 < BLOCK` is in bounds.
            let next_slot = unsafe { ptr::addr_of!((*block).slots[offset + 1]) };
            // The next push's slot: ask for its line now (as in `reserve_slow`).
            prefetch_write(next_slot);
            // SAFETY: as above; slot `offset` is ours alone until we store its tag.
            return Some(unsafe { &(*block).slots[offset] });
        }
        self.reserve_slow()
    }

    /// [`reserve`](Self::reserve) from the start, every case: a closed FIFO, a block's last
    /// slot (whose taker installs the next block), the gap, and CASes that fail.
    #[inline(never)]
    fn reserve_slow(&self) -> Option<&Slot<T>> {
        let backoff = Backoff::new();
        let mut tail = self.tail.end.index.load(Ordering::Acquire);
        let mut block = self.tail.end.block.load(Ordering::Acquire);
        let mut next: *mut Block<T> = ptr::null_mut();
        loop {
            if tail & CLOSED != 0 {
                if !next.is_null() {
                    // SAFETY: allocated below for a last slot we did not get; never published.
                    unsafe { self.give_block(next) };
                }
                return None;
            }
            let offset = tail % LAP;
            if offset == BLOCK {
                // The next block is being installed.
                snooze(&backoff);
                tail = self.tail.end.index.load(Ordering::Acquire);
                block = self.tail.end.block.load(Ordering::Acquire);
                continue;
            }
            if offset + 1 == BLOCK
                && next.is_null()
                && self.tail.spares.load(Ordering::Relaxed).is_null()
            {
                // No spare to take after the CAS: allocate before it, while nobody waits.
                next = Block::alloc();
            }
            match self.tail.end.index.compare_exchange_weak(
                tail,
                tail + 1,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if offset + 1 == BLOCK {
                        let new = if next.is_null() {
                            // SAFETY: our CAS took the block's last slot: we are its installer.
                            unsafe { self.take_spare() }
                        } else {
                            core::mem::replace(&mut next, ptr::null_mut())
                        };
                        self.tail.end.block.store(new, Ordering::Release);
                        // Past the gap. Nobody else moves the position while it is at the gap,
                        // but `close` may set its top bit: an add keeps it.
                        self.tail.end.index.fetch_add(1, Ordering::Release);
                        // SAFETY: our CAS from `tail` succeeded, so `block` is `tail`'s block
                        // (module docs), and it is not given up before the popper reads our slot,
                        // which we have not written yet.
                        unsafe { (*block).next.store(new, Ordering::Release) };
                    } else if !next.is_null() {
                        // SAFETY: allocated above for a last slot we did not get; never
                        // published.
                        unsafe { self.give_block(next) };
                    }
                    if offset + 1 < BLOCK {
                        // The next push's slot: ask for its line now, so that its write does
                        // not wait for the line to leave the popper's cache.
                        // SAFETY: `block` is live (above) and `offset + 1 < BLOCK`: an address
                        // in bounds; nothing is read.
                        let next_slot = unsafe { ptr::addr_of!((*block).slots[offset + 1]) };
                        prefetch_write(next_slot);
                    }
                    // SAFETY: as above, `block` is live until the popper has read slot
                    // `offset`, which is ours alone: the CAS reserved it, and the popper reads
                    // it only after its tag.
                    return Some(unsafe { &(*block).slots[offset] });
                }
                Err(t) => {
                    tail = t;
                    block = self.tail.end.block.load(Ordering::Acquire);
                    backoff.spin();
                }
            }
        }
    }

    /// The installer's next block, clean: the top spare, cleaned, or a new block if there is
    /// none.
    ///
    /// # Safety
    ///
    /// The caller is the installer of the next block: its CAS took a block's last slot (so
    /// takes happen one at a time, each before the next; see "Spare blocks").
    unsafe fn take_spare(&self) -> *mut Block<T> {
        let mut top = self.tail.spares.load(Ordering::Acquire);
        loop {
            if top.is_null() {
                return Block::alloc();
            }
            // SAFETY: `top` is on the stack and stays there until we take it (only installers
            // take, one at a time): live, and its `next` (written before the give's Release CAS,
            // which our Acquire read) is the spare below it.
            let below = unsafe { (*top).next.load(Ordering::Relaxed) };
            match self.tail.spares.compare_exchange_weak(
                top,
                below,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(t) => top = t,
            }
        }
        self.tail.spare_count.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: the spare is ours now, and whoever gave it up had finished with it (its
        // Release CAS, our Acquire); nobody else reaches it until we publish it.
        unsafe { (*top).next.store(ptr::null_mut(), Ordering::Relaxed) };
        // SAFETY: as above (see "Clean blocks").
        unsafe { Block::clean(top) };
        top
    }

    /// The popper, after giving up a block: tops the spares up from its excess list to
    /// [`SPARES`], so that a backlog that grows again takes the blocks kept (see "Spare
    /// blocks").
    ///
    /// # Safety
    ///
    /// The caller is the popper (the excess list is its alone).
    unsafe fn refill_spares(&self) {
        loop {
            let excess = self.head.excess.load(Ordering::Relaxed);
            if excess.is_null() || self.tail.spare_count.load(Ordering::Relaxed) >= SPARES {
                return;
            }
            // SAFETY: the excess list is the popper's alone and holds live blocks that nobody
            // else refers to; each one's `next` is the one below it.
            let below = unsafe { (*excess).next.load(Ordering::Relaxed) };
            self.head.excess.store(below, Ordering::Relaxed);
            let len = self.head.excess_len.load(Ordering::Relaxed);
            self.head.excess_len.store(len - 1, Ordering::Relaxed);
            // SAFETY: off the excess list: used by nobody.
            unsafe { self.give_block(excess) };
        }
    }

    /// The popper's block `block`, which it emptied: to the spares; when they are full, to the
    /// excess list, freed once the FIFO is found empty; when that is full too, freed (see
    /// "Spare blocks").
    ///
    /// # Safety
    ///
    /// The caller is the popper, and nobody uses `block` any more.
    unsafe fn retire(&self, block: *mut Block<T>) {
        if self.tail.spare_count.load(Ordering::Relaxed) < SPARES {
            // SAFETY: the caller's contract (`give_block` frees it if the spares are full).
            unsafe { self.give_block(block) };
            return;
        }
        // The backlog in blocks, `block` (which the head just left) included: a snapshot, from
        // the tail's line, just read for the spares' count. Its peak bounds the excess list.
        let ahead = (self.tail.end.index.load(Ordering::Relaxed) & !CLOSED)
            .saturating_sub(self.head.end.index.load(Ordering::Relaxed))
            / LAP
            + 1;
        let mut peak = self.head.peak.load(Ordering::Relaxed);
        if ahead > peak {
            peak = ahead;
            self.head.peak.store(peak, Ordering::Relaxed);
        }
        let len = self.head.excess_len.load(Ordering::Relaxed);
        if len >= EXCESS.max(peak) {
            // SAFETY: the caller's contract (`give_block` gives it to the spares if an installer
            // took one since, else frees it).
            unsafe { self.give_block(block) };
            return;
        }
        let below = self.head.excess.load(Ordering::Relaxed);
        // SAFETY: nobody else refers to `block` (the caller's contract).
        unsafe { (*block).next.store(below, Ordering::Relaxed) };
        self.head.excess.store(block, Ordering::Relaxed);
        self.head.excess_len.store(len + 1, Ordering::Relaxed);
    }

    /// Frees the excess list (see "Spare blocks").
    ///
    /// # Safety
    ///
    /// The caller is the popper, or the FIFO's owner in `drop`.
    #[cold]
    #[inline(never)]
    unsafe fn free_excess(&self) {
        self.head.excess_len.store(0, Ordering::Relaxed);
        self.head.peak.store(0, Ordering::Relaxed);
        let list = self.head.excess.swap(ptr::null_mut(), Ordering::Relaxed);
        // SAFETY: the excess list's blocks are live, referred to by nobody else (the popper's
        // alone), linked through `next`, and off the list now.
        unsafe { Block::free_list(list) };
    }

    /// Gives `block` to the spares, or frees it if they are full.
    ///
    /// # Safety
    ///
    /// `block` came from [`Block::alloc`] (perhaps by way of the spares), and nobody uses it
    /// any more.
    unsafe fn give_block(&self, block: *mut Block<T>) {
        if self.tail.spare_count.load(Ordering::Relaxed) >= SPARES {
            // SAFETY: the caller's contract.
            unsafe { Block::free(block) };
            return;
        }
        self.tail.spare_count.fetch_add(1, Ordering::Relaxed);
        let mut top = self.tail.spares.load(Ordering::Relaxed);
        loop {
            // SAFETY: `block` is ours until the CAS below publishes it.
            unsafe { (*block).next.store(top, Ordering::Relaxed) };
            match self.tail.spares.compare_exchange_weak(
                top,
                block,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(t) => top = t,
            }
        }
    }

    /// Takes the oldest item, if any.
    ///
    /// # Safety
    ///
    /// At most one thread pops at a time, and each pop happens before the next one (for
    /// example: one thread pops; or the right to pop passes between threads with Release and
    /// Acquire, as a lane's ownership does). [`Drop`] counts as a pop.
    ///
    /// ```
    /// let q = keyserial_core::fifo::Fifo::new();
    /// q.push(7);
    /// // SAFETY: the only popper.
    /// assert_eq!(unsafe { q.pop() }, Some(7));
    /// ```
    pub unsafe fn pop(&self) -> Option<T> {
        // SAFETY: the caller's contract.
        unsafe { self.take(true) }.map(|(_, value)| value)
    }

    /// [`pop`](Self::pop), with the item's [`Tag`] ([`UNTAGGED`] if it was pushed without
    /// one).
    ///
    /// # Safety
    ///
    /// As [`pop`](Self::pop).
    ///
    /// ```
    /// use keyserial_core::fifo::{Fifo, Tag};
    /// let q = Fifo::new();
    /// let tag = Tag::new(5).unwrap();
    /// assert!(q.try_push_tagged(|| (tag, 'x')).is_ok());
    /// // SAFETY: the only popper.
    /// assert_eq!(unsafe { q.pop_tagged() }, Some((tag, 'x')));
    /// ```
    #[inline]
    pub unsafe fn pop_tagged(&self) -> Option<(Tag, T)> {
        // SAFETY: the caller's contract.
        unsafe { self.take(true) }
    }

    /// Calls `f` with the item at the head, if its pusher has finished writing it, and leaves
    /// it there: the next [`pop`](Self::pop) returns it. A popper looks ahead this way to start
    /// fetching what the item points to while it still works on the item before (see
    /// [`crate::prefetch`]); when the item is there, the slot after it is hinted too, so that
    /// the next look finds its line fetched. Only then, as a cheap sign of a backlog: while
    /// items arrive one at a time, the slot after may be the one a pusher is about to write,
    /// and a read hint would pull its line away from that pusher. (A written head does not
    /// prove the next slot written; the hint is measured, not guaranteed, to help.)
    ///
    /// # Safety
    ///
    /// As [`pop`](Self::pop): only the popper may call it. And `f`, which borrows the item in
    /// its slot, must not pop from this FIFO or pass on the popper's turn (either could move the
    /// item out, or give up its block, while the borrow lives).
    ///
    /// ```
    /// use keyserial_core::fifo::Fifo;
    /// let q = Fifo::new();
    /// q.push(5);
    /// // SAFETY: this thread is the only popper.
    /// assert_eq!(unsafe { q.peek_with(|v| *v) }, Some(5));
    /// assert_eq!(unsafe { q.pop() }, Some(5));
    /// assert_eq!(unsafe { q.peek_with(|v| *v) }, None);
    /// ```
    #[inline]
    pub unsafe fn peek_with<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        // SAFETY: the caller's contract.
        unsafe { self.peek_tagged(|_, value| f(value)) }
    }

    /// [`peek_with`](Self::peek_with), with the item's [`Tag`].
    ///
    /// # Safety
    ///
    /// As [`peek_with`](Self::peek_with).
    ///
    /// ```
    /// use keyserial_core::fifo::{Fifo, UNTAGGED};
    /// let q = Fifo::new();
    /// q.push(5);
    /// // SAFETY: this thread is the only popper.
    /// assert_eq!(unsafe { q.peek_tagged(|t, v| (t, *v)) }, Some((UNTAGGED, 5)));
    /// ```
    #[inline]
    pub unsafe fn peek_tagged<R>(&self, f: impl FnOnce(Tag, &T) -> R) -> Option<R> {
        let head = self.head.end.index.load(Ordering::Relaxed);
        let block = self.head.end.block.load(Ordering::Relaxed);
        let offset = head % LAP;
        // SAFETY: as in `take`: the head's block is live while the popper (the caller) looks,
        // and `offset < BLOCK`.
        let slot = unsafe { &(*block).slots[offset] };
        let tag = Tag::new(slot.tag.load(Ordering::Acquire))?;
        if offset + 1 < BLOCK {
            // SAFETY: the head's block is live and `offset + 1 < BLOCK`: an address in bounds;
            // nothing is read.
            let next_slot = unsafe { ptr::addr_of!((*block).slots[offset + 1]) };
            prefetch(next_slot);
        }
        Some(slot.value.with(|p| {
            // SAFETY: the tag (Acquire) shows this lap's write (the block entered clean); only
            // the popper reads the slot, unread until its next pop, and `f`'s borrow ends first
            // (it may neither pop nor pass on the turn: the caller's contract).
            f(tag, unsafe { (*p).assume_init_ref() })
        }))
    }

    /// Visits, oldest first, every item whose push had reserved its slot when the call began
    /// (waiting, as a pop does, for a pusher still writing one), without taking any: `f` gets
    /// each item's tag and the item itself, and may change both in place (the popper's right:
    /// nobody else reads or writes a slot once it is written). A new tag must never be 0, which
    /// [`Tag`] rules out, and must stand for the new item as the caller's tags do. Items pushed
    /// after the call began are not visited.
    ///
    /// # Safety
    ///
    /// As [`pop`](Self::pop): only the popper may call it. And `f` must not pop from this FIFO
    /// or pass on the popper's turn.
    ///
    /// ```
    /// use keyserial_core::fifo::{Fifo, Tag};
    /// let q = Fifo::new();
    /// for i in 1..=5u32 {
    ///     q.push(i);
    /// }
    /// let mut seen = Vec::new();
    /// // SAFETY: this thread is the only popper; the closure neither pops nor passes the turn.
    /// unsafe {
    ///     q.for_each_queued_mut(|tag, v| {
    ///         seen.push(*v);
    ///         if *v % 2 == 0 {
    ///             *v *= 10; // changed in place
    ///             *tag = Tag::new(7).unwrap();
    ///         }
    ///     })
    /// };
    /// assert_eq!(seen, [1, 2, 3, 4, 5]);
    /// // SAFETY: as above.
    /// let popped: Vec<_> = std::iter::from_fn(|| unsafe { q.pop_tagged() }).collect();
    /// assert_eq!(popped.iter().map(|(_, v)| *v).collect::<Vec<_>>(), [1, 20, 3, 40, 5]);
    /// assert_eq!(popped[1].0.get(), 7);
    /// ```
    pub unsafe fn for_each_queued_mut(&self, mut f: impl FnMut(&mut Tag, &mut T)) {
        // Everything below `tail` was reserved before this load: those slots are visited. The
        // head's block and every block after it up to the tail's stay live while the popper
        // (the caller) does not pop: only the popper gives blocks up.
        let tail = self.tail.end.index.load(Ordering::Acquire) & !CLOSED;
        let mut pos = self.head.end.index.load(Ordering::Relaxed);
        let mut block = self.head.end.block.load(Ordering::Relaxed);
        while pos < tail {
            let offset = pos % LAP;
            debug_assert!(offset < BLOCK, "the walk skips every gap");
            // SAFETY: `block` is the block of position `pos` (the head's, or the `next` of the
            // block before, read after its last slot's tag), live as said above; `offset <
            // BLOCK`.
            let slot = unsafe { &(*block).slots[offset] };
            let backoff = Backoff::new();
            let mut tag = loop {
                // Reserved (below the tail) but perhaps not written yet: wait, as `take` does.
                if let Some(tag) = Tag::new(slot.tag.load(Ordering::Acquire)) {
                    break tag;
                }
                snooze(&backoff);
            };
            let before = tag;
            slot.value.with_mut(|p| {
                // SAFETY: the tag (Acquire) shows this lap's write; the slot is the popper's
                // alone from then on, and the caller is the popper; the borrow ends here.
                f(&mut tag, unsafe { (*p).assume_init_mut() })
            });
            if tag != before {
                // Only the popper reads a written slot's tag, and it is this thread.
                slot.tag.store(tag.get(), Ordering::Relaxed);
            }
            if offset + 1 == BLOCK {
                // The next block's `next` was stored before this last slot's tag, which we
                // acquired (as in `take`); read only if the walk goes on into it.
                // SAFETY: `block` is live (above).
                block = unsafe { (*block).next.load(Ordering::Acquire) };
                pos += 2; // past the gap
            } else {
                pos += 1;
            }
        }
    }

    /// `pop`; only if `refill` (not when dropping) does it refill the spares after a block it
    /// empties and free the excess list when it finds the FIFO empty.
    ///
    /// # Safety
    ///
    /// As [`pop`](Self::pop).
    #[inline(always)]
    unsafe fn take(&self, refill: bool) -> Option<(Tag, T)> {
        // The head is the popper's alone (the caller's contract); the tail is read Acquire,
        // and only once the head has reached the tail read last and the head's slot is not
        // written yet.
        let head = self.head.end.index.load(Ordering::Relaxed);
        let block = self.head.end.block.load(Ordering::Relaxed);
        let offset = head % LAP;
        // SAFETY: the head's block is live until the popper frees it below, and only the popper
        // does; it is the block of the head's position (installed before the popper moved into
        // it), and `offset < BLOCK` (the head never rests on the gap).
        let slot = unsafe { &(*block).slots[offset] };
        // (`>=`: a tail read at a block's gap is one position behind the head that skipped it.)
        if head >= self.head.tail_seen.load(Ordering::Relaxed)
            && slot.tag.load(Ordering::Acquire) == 0
        {
            // Not written: reserved by a pusher still writing it, or not reserved at all.
            let tail = self.tail.end.index.load(Ordering::Acquire) & !CLOSED;
            if head == tail {
                if refill
                    && (!self.head.excess.load(Ordering::Relaxed).is_null()
                        || self.head.peak.load(Ordering::Relaxed) != 0)
                {
                    // The popper found the FIFO empty: the backlog that filled the excess list
                    // is gone.
                    // SAFETY: the popper (the caller's contract).
                    unsafe { self.free_excess() };
                }
                return None;
            }
            debug_assert!(head < tail, "the head passed the tail");
            self.head.tail_seen.store(tail, Ordering::Relaxed);
        }
        let backoff = Backoff::new();
        let tag = loop {
            if let Some(tag) = Tag::new(slot.tag.load(Ordering::Acquire)) {
                break tag;
            }
            // Reserved (the tail is past it) but its pusher has not finished writing.
            snooze(&backoff);
        };
        let value = slot.value.with(|p| {
            // SAFETY: the tag (Acquire) shows the pusher's write (the block entered clean, so a
            // tag that is not 0 is this lap's); the slot is read once, here, and never again
            // (the head moves past it).
            unsafe { (*p).assume_init_read() }
        });
        if offset + 1 == BLOCK {
            // SAFETY: still live (given up just below); `next` was stored before the last slot's
            // tag, which we acquired.
            let next = unsafe { (*block).next.load(Ordering::Acquire) };
            self.head.end.block.store(next, Ordering::Relaxed);
            self.head.end.index.store(head + 2, Ordering::Release);
            // SAFETY: every slot of `block` was read, so every pusher of it has finished
            // (module docs), the tail points past it, and the head now points to `next`: nobody
            // refers to it. We are the popper (the caller's contract).
            unsafe { self.retire(block) };
            if refill {
                // SAFETY: the popper.
                unsafe { self.refill_spares() };
            }
        } else {
            self.head.end.index.store(head + 1, Ordering::Release);
        }
        Some((tag, value))
    }

    /// Whether it holds no item: a snapshot (any thread). Items being pushed count once their
    /// slot is reserved.
    ///
    /// ```
    /// let q = keyserial_core::fifo::Fifo::new();
    /// assert!(q.is_empty());
    /// q.push(());
    /// assert!(!q.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        let head = self.head.end.index.load(Ordering::SeqCst);
        head == self.tail.end.index.load(Ordering::SeqCst) & !CLOSED
    }

    /// How many items it holds: a snapshot (any thread).
    ///
    /// ```
    /// let q = keyserial_core::fifo::Fifo::new();
    /// (0..100).for_each(|i| q.push(i));
    /// assert_eq!(q.len(), 100);
    /// ```
    pub fn len(&self) -> usize {
        let head = self.head.end.index.load(Ordering::SeqCst);
        let tail = self.tail.end.index.load(Ordering::SeqCst) & !CLOSED;
        slots_before(tail).saturating_sub(slots_before(head))
    }
}

/// How many slots come before position `index`.
fn slots_before(index: usize) -> usize {
    index / LAP * BLOCK + (index % LAP).min(BLOCK)
}

/// Aborts the process if dropped during unwinding (a panic while panicking aborts): held across
/// a `push_with` caller's `make`, after which a reserved slot must be written.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        panic!("a FIFO item's constructor unwound with its slot reserved");
    }
}

/// One step of a wait: crossbeam's backoff normally, a yield to the model's scheduler under loom.
fn snooze(backoff: &Backoff) {
    #[cfg(not(loom))]
    backoff.snooze();
    #[cfg(loom)]
    {
        let _ = backoff;
        loom::thread::yield_now();
    }
}

impl<T> Drop for Fifo<T> {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other thread pushes or pops any more.
        // (Without refilling: the spares are about to be freed.)
        while unsafe { self.take(false) }.is_some() {}
        // SAFETY: as above.
        unsafe { self.free_excess() };
        // Empty: the head and the tail share one block, which nobody else refers to.
        let block = self.head.end.block.load(Ordering::Relaxed);
        // SAFETY: allocated by `Block::alloc`, live (`pop` never gives up the head's block),
        // and no longer reachable by anyone.
        unsafe { Block::free(block) };
        let spares = self.tail.spares.load(Ordering::Relaxed);
        // SAFETY: the spares are live, linked through `next`, and no longer reachable by anyone.
        unsafe { Block::free_list(spares) };
    }
}

impl<T> core::fmt::Debug for Fifo<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Fifo").field("len", &self.len()).finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize as StdCount;
    use std::sync::Arc;
    use std::vec::Vec;

    #[test]
    fn for_each_queued_mut_visits_across_blocks_and_changes_in_place() {
        let q = Fifo::new();
        let n = 3 * BLOCK + 2;
        for i in 0..n {
            q.push(i);
        }
        // SAFETY: the only popper (this thread).
        for _ in 0..BLOCK / 2 + 1 {
            unsafe { q.pop() };
        }
        let first = BLOCK / 2 + 1;
        let mut seen = Vec::new();
        // SAFETY: as above; the closure neither pops nor passes the turn.
        unsafe {
            q.for_each_queued_mut(|tag, v| {
                seen.push(*v);
                if *v % 3 == 0 {
                    *v += 1000;
                    *tag = Tag::new(2).unwrap();
                }
            })
        };
        assert_eq!(seen, (first..n).collect::<Vec<_>>());
        // Pushed after the walk: not visited by it, popped after the others.
        q.push(n);
        for i in first..=n {
            // SAFETY: as above.
            let (tag, v) = unsafe { q.pop_tagged() }.unwrap();
            if i % 3 == 0 && i < n {
                assert_eq!((tag.get(), v), (2, i + 1000));
            } else {
                assert_eq!((tag, v), (UNTAGGED, i));
            }
        }
        // SAFETY: as above.
        assert_eq!(unsafe { q.pop() }, None);
        // An empty FIFO: nothing to visit.
        // SAFETY: as above.
        unsafe { q.for_each_queued_mut(|_, _| unreachable!()) };
    }

    #[test]
    fn close_refuses_later_pushes_and_keeps_earlier_ones() {
        extern crate std;
        use std::sync::Arc;
        use std::vec::Vec;
        let q = Arc::new(Fifo::new());
        // Two pushers race a close; whatever each got in is popped, in its order, once.
        let pushers: Vec<_> = (0..2usize)
            .map(|t| {
                let q = q.clone();
                std::thread::spawn(move || {
                    let mut n = 0;
                    while n < 3 * BLOCK && q.try_push_with(|| (t, n)).is_ok() {
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        std::thread::yield_now();
        q.close();
        let got: Vec<usize> = pushers.into_iter().map(|p| p.join().unwrap()).collect();
        assert!(q.is_closed());
        assert!(q.try_push_with(|| (9, 9)).is_err());
        assert_eq!(q.pushed(), got[0] + got[1]);
        let mut next = [0usize; 2];
        // SAFETY: the only popper.
        while let Some((t, i)) = unsafe { q.pop() } {
            assert_eq!(i, next[t]);
            next[t] += 1;
        }
        assert_eq!(next.to_vec(), got);
        assert!(q.is_empty());
    }

    #[test]
    fn peek_sees_the_next_pop_across_blocks_and_racing_pushers() {
        let q = Arc::new(Fifo::new());
        let n = 3 * BLOCK + 5;
        let pusher = {
            let q = q.clone();
            std::thread::spawn(move || (0..n).for_each(|i| q.push(i)))
        };
        let mut next = 0;
        while next < n {
            // SAFETY: this thread is the only popper.
            let peeked = unsafe { q.peek_with(|v| *v) };
            // SAFETY: as above.
            match (peeked, unsafe { q.pop() }) {
                (Some(p), popped) => assert_eq!((p, popped), (next, Some(next))),
                // Not written when we looked; the pop may find it since.
                (None, Some(v)) => assert_eq!(v, next),
                (None, None) => {
                    std::thread::yield_now();
                    continue;
                }
            }
            next += 1;
        }
        pusher.join().unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { q.peek_with(|v| *v) }, None);
    }

    #[test]
    fn keeps_order_across_blocks() {
        let q = Fifo::new();
        let n = 3 * BLOCK + 5;
        for i in 0..n {
            q.push(i);
            assert_eq!(q.len(), i + 1);
        }
        for i in 0..n {
            // SAFETY: the only popper.
            assert_eq!(unsafe { q.pop() }, Some(i));
        }
        // SAFETY: the only popper.
        assert_eq!(unsafe { q.pop() }, None);
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn interleaved_push_and_pop_cross_blocks() {
        let q = Fifo::new();
        let mut model = std::collections::VecDeque::new();
        for i in 0..4 * BLOCK {
            q.push(2 * i);
            q.push(2 * i + 1);
            model.extend([2 * i, 2 * i + 1]);
            // SAFETY: the only popper.
            assert_eq!(unsafe { q.pop() }, model.pop_front());
            assert_eq!(q.len(), model.len());
        }
        while let Some(v) = model.pop_front() {
            // SAFETY: the only popper.
            assert_eq!(unsafe { q.pop() }, Some(v));
        }
        assert!(q.is_empty());
    }

    #[test]
    fn a_reused_block_is_cleaned_before_it_is_installed() {
        // Push one, pop one: the popper gives up each block to the spares, and the next
        // installer takes it back, tags from the previous lap and all, and must clear them:
        // a stale tag would make the empty pop below read the previous lap's item.
        let q = Fifo::new();
        for i in 0..10 * BLOCK {
            q.push(i);
            // SAFETY: the only popper.
            assert_eq!(unsafe { q.pop() }, Some(i));
            // SAFETY: the only popper.
            assert_eq!(unsafe { q.pop() }, None);
        }
        assert!(!q.tail.spares.load(Ordering::Relaxed).is_null());
        let spares = q.tail.spare_count.load(Ordering::Relaxed);
        assert_eq!(
            spares, 1,
            "the one block given up, taken back and given up again"
        );
    }

    #[test]
    fn spares_are_kept_up_to_the_bound_and_reused() {
        // A backlog of many blocks, drained: `SPARES` of its blocks are kept as spares, the
        // rest wait on the excess list until the popper finds the FIFO empty, and a second
        // backlog of that size takes the spares back.
        let q = Fifo::new();
        let n = (SPARES + 4) * BLOCK;
        let excess_len = |q: &Fifo<usize>| {
            let (mut len, mut b) = (0, q.head.excess.load(Ordering::Relaxed));
            while !b.is_null() {
                len += 1;
                // SAFETY: on the excess list, live; nobody pushes or pops meanwhile.
                b = unsafe { (*b).next.load(Ordering::Relaxed) };
            }
            len
        };
        let round = |q: &Fifo<usize>| {
            (0..n).for_each(|i| q.push(i));
            for i in 0..n {
                // SAFETY: the only popper.
                assert_eq!(unsafe { q.pop() }, Some(i));
            }
            // Every block but the head's was given up: the spares are full, the rest waits.
            assert_eq!(q.tail.spare_count.load(Ordering::Relaxed), SPARES);
            assert_eq!(excess_len(q), n / BLOCK - SPARES);
            // SAFETY: the only popper.
            assert_eq!(unsafe { q.pop() }, None);
            assert_eq!(excess_len(q), 0, "found empty: the excess list is freed");
        };
        round(&q);
        let mut height = 0;
        let mut top = q.tail.spares.load(Ordering::Relaxed);
        while !top.is_null() {
            height += 1;
            // SAFETY: a spare, live; nobody pushes or pops meanwhile.
            top = unsafe { (*top).next.load(Ordering::Relaxed) };
        }
        assert_eq!(height, SPARES);
        round(&q);
        assert_eq!(q.tail.spare_count.load(Ordering::Relaxed), SPARES);
        assert!(q.is_empty());
    }

    #[test]
    fn the_excess_list_is_bounded_by_the_peak_and_refills_the_spares() {
        // Bursts of more blocks than the spares and `EXCESS` hold, each pushed whole before the
        // popper drains it, on a FIFO never found empty: the first drain keeps every block past
        // the spares (it frees nothing), and the excess list never holds more than the peak, so
        // bursts that outrun the spares (and allocate beside the list) do not pile blocks up.
        let q = Fifo::new();
        let blocks = SPARES + EXCESS + 3;
        let n = blocks * BLOCK;
        let mut next = (0, 0);
        for round in 0..3 {
            (0..n).for_each(|_| {
                q.push(next.0);
                next.0 += 1;
            });
            // Drain all but one item: the FIFO is never found empty.
            while next.1 + 1 < next.0 {
                // SAFETY: the only popper.
                assert_eq!(unsafe { q.pop() }, Some(next.1));
                next.1 += 1;
            }
            let peak = q.head.peak.load(Ordering::Relaxed);
            // (Seen at the first block given up with the spares full: at most `SPARES` in.)
            assert!(
                (blocks - SPARES - 1..=blocks + 1).contains(&peak),
                "peak {peak}"
            );
            let excess = q.head.excess_len.load(Ordering::Relaxed);
            if round == 0 {
                // The head is in the last block: all the others were given up, and past the
                // spares every one waits on the excess list.
                assert_eq!(excess, blocks - 1 - SPARES, "the first drain kept them all");
            }
            assert!(
                excess <= peak,
                "{excess} excess blocks past the peak {peak}"
            );
            assert_eq!(q.tail.spare_count.load(Ordering::Relaxed), SPARES);
        }
        // A smaller burst before the FIFO is found empty: the installers take spares, and each
        // block the popper gives up tops the spares up from the excess list again.
        let burst = (SPARES / 2 + 1) * BLOCK;
        let excess = q.head.excess_len.load(Ordering::Relaxed);
        (0..burst).for_each(|i| q.push(next.0 + i));
        let spares = q.tail.spare_count.load(Ordering::Relaxed);
        assert!(spares < SPARES, "{spares} spares");
        for i in next.1..next.1 + BLOCK {
            // SAFETY: the only popper.
            assert_eq!(unsafe { q.pop() }, Some(i));
        }
        assert_eq!(q.tail.spare_count.load(Ordering::Relaxed), SPARES);
        assert!(q.head.excess_len.load(Ordering::Relaxed) < excess);
        for i in next.1 + BLOCK..next.0 + burst {
            // SAFETY: the only popper.
            assert_eq!(unsafe { q.pop() }, Some(i));
        }
        // Found empty: the excess list is freed and the peak forgotten.
        // SAFETY: the only popper.
        assert_eq!(unsafe { q.pop() }, None);
        assert_eq!(q.head.excess_len.load(Ordering::Relaxed), 0);
        assert_eq!(q.head.peak.load(Ordering::Relaxed), 0);
        assert!(q.head.excess.load(Ordering::Relaxed).is_null());
    }

    #[test]
    fn blocks_start_at_a_line_whatever_the_item() {
        #[repr(align(128))]
        struct Wide(#[allow(dead_code)] u8);
        fn check<T>(make: impl Fn(usize) -> T) {
            let q = Fifo::new();
            // Several blocks, so that several allocations are looked at.
            for i in 0..3 * BLOCK {
                q.push(make(i));
                let block = q.tail.end.block.load(Ordering::Relaxed) as usize;
                assert_eq!(block % LINE, 0, "a block at {block:#x}");
                assert_eq!(block % core::mem::align_of::<Block<T>>(), 0);
            }
        }
        check(|i| i as u8);
        check(|i| [i as u8; 56]);
        check(|i| Wide(i as u8));
    }

    #[test]
    fn a_dropped_fifo_frees_its_excess_blocks() {
        // Dropped with a drained backlog's blocks still on the excess list (Miri reports a
        // leak if any block is not freed).
        let q = Fifo::new();
        let n = (SPARES + 2) * BLOCK + 1;
        (0..n).for_each(|i| q.push(i));
        for i in 0..n - 1 {
            // SAFETY: the only popper.
            assert_eq!(unsafe { q.pop() }, Some(i));
        }
        assert!(!q.head.excess.load(Ordering::Relaxed).is_null());
        drop(q);
    }

    #[test]
    fn installers_allocate_and_the_popper_only_recycles() {
        // The first install finds no spare and allocates; the popper gives the emptied block to
        // the spares and allocates none of its own; the next install takes that block back.
        let q = Fifo::new();
        (0..BLOCK + 1).for_each(|i| q.push(i));
        // The second block was allocated by its installer: no spare existed, and none appeared.
        assert!(q.tail.spares.load(Ordering::Relaxed).is_null());
        assert_eq!(q.tail.spare_count.load(Ordering::Relaxed), 0);
        let first = q.head.end.block.load(Ordering::Relaxed);
        assert_ne!(q.tail.end.block.load(Ordering::Relaxed), first);
        for i in 0..BLOCK {
            // SAFETY: the only popper.
            assert_eq!(unsafe { q.pop() }, Some(i));
        }
        assert_eq!(q.tail.spare_count.load(Ordering::Relaxed), 1);
        assert_eq!(q.tail.spares.load(Ordering::Relaxed), first);
        (0..BLOCK).for_each(|i| q.push(BLOCK + 1 + i));
        assert_eq!(q.tail.spare_count.load(Ordering::Relaxed), 0);
        assert_eq!(q.tail.end.block.load(Ordering::Relaxed), first);
        for i in BLOCK..2 * BLOCK + 1 {
            // SAFETY: the only popper.
            assert_eq!(unsafe { q.pop() }, Some(i));
        }
    }

    #[test]
    fn push_with_builds_the_item_once_its_slot_is_reserved() {
        let q = Fifo::new();
        for i in 0..2 * BLOCK + 1 {
            // The slot is reserved (counted) before the item exists.
            q.push_with(|| {
                assert_eq!(q.len(), i + 1);
                i
            });
        }
        for i in 0..2 * BLOCK + 1 {
            // SAFETY: the only popper.
            assert_eq!(unsafe { q.pop() }, Some(i));
        }
    }

    struct Counted(Arc<StdCount>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn drop_drops_every_item_left_once() {
        let drops = Arc::new(StdCount::new(0));
        let q = Fifo::new();
        for _ in 0..2 * BLOCK + 3 {
            q.push(Counted(drops.clone()));
        }
        // SAFETY: the only popper.
        drop(unsafe { q.pop() });
        assert_eq!(drops.load(std::sync::atomic::Ordering::Relaxed), 1);
        drop(q);
        assert_eq!(
            drops.load(std::sync::atomic::Ordering::Relaxed),
            2 * BLOCK + 3
        );
    }

    #[test]
    fn zero_sized_items() {
        let q = Fifo::new();
        (0..BLOCK + 1).for_each(|_| q.push(()));
        assert_eq!(q.len(), BLOCK + 1);
        // SAFETY: the only popper.
        while unsafe { q.pop() }.is_some() {}
        assert!(q.is_empty());
    }

    /// The tag of `(t, i)`: distinct per item, never 0.
    fn tag_of(t: usize, i: usize) -> Tag {
        Tag::new((i << 1 | t) + 1).unwrap()
    }

    /// Two pushers against a popper, blocks reused many times over: each pusher's items come
    /// out in its order, once each. `tagged`: each item is pushed with its own tag, and every
    /// pop and peek must see that tag, never one left from a block's earlier lap; otherwise
    /// plain pushes and pops.
    fn two_pushers_against_a_popper(tagged: bool) {
        let per = if cfg!(miri) { 3 * BLOCK + 2 } else { 50_000 };
        let q = Arc::new(Fifo::new());
        let pushers: Vec<_> = (0..2)
            .map(|t| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for i in 0..per {
                        if tagged {
                            assert!(q.try_push_tagged(|| (tag_of(t, i), (t, i))).is_ok());
                        } else {
                            q.push((t, i));
                        }
                    }
                })
            })
            .collect();
        let mut next = [0usize; 2];
        let mut got = 0;
        while got < 2 * per {
            if tagged {
                // SAFETY: this thread is the only popper; the closure only reads.
                let peeked = unsafe { q.peek_tagged(|tag, &(t, i)| (tag, tag_of(t, i))) };
                if let Some((tag, want)) = peeked {
                    assert_eq!(tag, want);
                }
            }
            // SAFETY: as above.
            if let Some((tag, (t, i))) = unsafe { q.pop_tagged() } {
                let want = if tagged { tag_of(t, i) } else { UNTAGGED };
                assert_eq!(tag, want);
                assert_eq!(i, next[t], "pusher {t} out of order");
                next[t] += 1;
                got += 1;
            } else {
                std::thread::yield_now();
            }
        }
        pushers.into_iter().for_each(|p| p.join().unwrap());
        assert!(q.is_empty());
        assert_eq!(next, [per, per]);
    }

    #[test]
    fn concurrent_pushers_keep_their_order_against_a_popper() {
        two_pushers_against_a_popper(false);
    }

    #[test]
    fn tags_come_back_with_their_items_across_reused_blocks() {
        two_pushers_against_a_popper(true);
    }

    #[test]
    fn untagged_items_pop_with_the_untagged_tag() {
        let q = Fifo::new();
        q.push(1);
        assert!(q.try_push_tagged(|| (Tag::new(9).unwrap(), 2)).is_ok());
        assert!(q.try_push_with(|| 3).is_ok());
        // SAFETY: the only popper.
        let got: Vec<_> = core::iter::from_fn(|| unsafe { q.pop_tagged() }).collect();
        assert_eq!(
            got,
            [(UNTAGGED, 1), (Tag::new(9).unwrap(), 2), (UNTAGGED, 3)]
        );
    }
}
