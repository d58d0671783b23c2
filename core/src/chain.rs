//! A key's task chain: an intrusive multi-producer, single-consumer queue fused with the handoff
//! word that lets exactly one drainer own the key at a time.
//!
//! **A building block**, for keyserial's executor and for anyone writing their own: applications
//! submit through `keyserial::Serializer` instead. Taking, peeking, un-popping and releasing are
//! `unsafe` because only the holder of the chain's `ACTIVE` baton may call them, and pushing a raw
//! node is `unsafe` because the chain takes ownership of it; [`Chain::push_value`] is the safe
//! push for heap nodes.
//!
//! # The state word
//!
//! Each [`Chain`] has one `AtomicUsize`, the *state word*. It is only ever changed by
//! read-modify-write operations (CAS or swap), never by a plain store, so every transition below is
//! atomic with respect to every other and loom can check the protocol without any `SeqCst`
//! store-then-load ("Dekker") reasoning.
//!
//! ```text
//!  bit 0      ACTIVE   exactly one owner holds the chain: it is on a ready queue, being drained,
//!                      or parked by its owner (waiting for permits)
//!  bit 1      RETIRED  terminal: the chain has left (or is leaving) the key table
//!  bits 2..   INBOX    pointer to the newest pushed node (a LIFO stack linked through `Link::next`),
//!                      or null. Nodes are at least 4-byte aligned, so the low two bits are free.
//! ```
//!
//! Legal values: `0` (idle: not owned, nothing queued), `ACTIVE` (owned, inbox empty),
//! `ptr | ACTIVE` (owned, inbox non-empty), `RETIRED` (dead). A non-null inbox without `ACTIVE`, or
//! `RETIRED` with anything else, never occurs: every push sets `ACTIVE`, and retire only starts
//! from `0`.
//!
//! # Transitions and who may make them
//!
//! | operation | who | transition | on failure |
//! |---|---|---|---|
//! | [`push`](Chain::push) | anyone | `s -> node | ACTIVE` (CAS), `node.next = inbox(s)` | retry; on `RETIRED` hand the node back |
//! | take (inside [`pop`](Chain::pop)) | the owner | `ptr | ACTIVE -> ACTIVE` (swap) | — |
//! | [`try_release`](Chain::try_release) | the owner | `ACTIVE -> 0` (CAS) | inbox non-empty: still owner |
//! | [`try_retire`](Chain::try_retire) | anyone | `0 -> RETIRED` (CAS) | chain not idle: nothing happens |
//!
//! *Ownership* of `ACTIVE` is a baton. It is created by the one push that moves the word from `0`
//! to `ACTIVE` ([`Pushed::Activated`]): that pusher, and only it, must hand the chain to a worker
//! (put it on a ready queue). Whoever holds the baton may pass it on (queue → worker → queue …)
//! and is the only party that may touch the chain's private FIFO (the `local` cell) or call the
//! `unsafe` owner methods. The baton disappears only by a successful [`try_release`](Chain::try_release).
//!
//! # Why nothing is lost, run twice, or reordered
//!
//! - **No lost wakeup.** A push either lands before the owner's release CAS (then the CAS sees a
//!   non-null inbox and fails, so the owner keeps the baton and takes the node) or after it (then the
//!   push CAS reads `0`, returns [`Pushed::Activated`] and the pusher schedules the chain). Both are
//!   RMWs on one word, so one of the two orders holds; there is no window in between.
//! - **No double drain.** `ACTIVE` is set by exactly one push from `0` and cleared by exactly one
//!   release; between them pushes see `ACTIVE` and return [`Pushed::Queued`].
//! - **Never onto a retired chain.** Retire only succeeds from `0` (not owned, nothing queued) and
//!   makes the word `RETIRED` forever; a push CAS whose expected value was read before the retire
//!   fails, re-reads `RETIRED`, and hands its node back ([`Retired`]) so the caller can go back to the
//!   key table for a fresh chain. No task is ever left in a retired chain.
//! - **FIFO per key.** The inbox is a LIFO of pushes in the order their CASes succeeded; the owner
//!   takes the whole inbox in one swap and reverses it, so the private FIFO holds pushes in CAS order,
//!   and later takes only append younger pushes behind it.
//!
//! # Memory ordering
//!
//! | step | ordering | why |
//! |---|---|---|
//! | push CAS, success | `AcqRel` | *Release* publishes the node and its `next` to the owner's take. *Acquire* because the push that moves the word from `0` becomes the owner: it must see everything the previous owner did before its release CAS (the private FIFO cell, and whatever per-key state the caller keeps under the baton). A CAS cannot choose its ordering after learning which value it replaced, so every push pays the acquire (free on x86; on weakly ordered targets one acquiring load-exclusive). A `Release` CAS plus an `Acquire` fence taken only on [`Pushed::Activated`] would be equivalent; it is not worth a second pattern to check. |
//! | push CAS, failure | `Relaxed` | a retry publishes nothing yet. A push that meets `RETIRED` acquires nothing either: its node never left this thread, and the caller goes back to the key table, whose own loads acquire the fresh chain. |
//! | take (swap) | `Acquire` | synchronises with every push in the inbox: the pushes are RMWs on one word, so they form one release sequence that the swap reads the end of. |
//! | [`try_release`](Chain::try_release) CAS | `Release` | the next owner (an activating push, or a retirer) acquires it. |
//! | [`try_retire`](Chain::try_retire) CAS | `AcqRel` | acquires the last owner's release, so whoever unlinks and frees the chain after retiring it happens-after the last owner. |
//!
//! Passing the baton on through a ready queue relies on the queue's own release/acquire.
//!
//! # Progress
//!
//! Push is lock-free (a CAS fails only because another push, take, release or retire succeeded);
//! take, release, pop and retire are wait-free. Push is the classic Treiber push, which is immune to
//! ABA: the owner never pops single nodes off the shared stack, it swaps out the whole stack.
//!
//! # Nodes
//!
//! Nodes are intrusive: a type implements [`Linked`] by embedding a [`Link`]. With the `alloc`
//! feature [`BoxNode`] wraps any value in a heap node; without an allocator, [`crate::pool::Pool`]
//! hands out nodes from fixed-capacity storage, and callers may also use their own `static` nodes.

use core::fmt;
use core::marker::PhantomData;
use core::ptr::{self, NonNull};

use crate::sync::{AtomicUsize, Ordering, UnsafeCell};

/// Bit 0 of the state word: the chain has an owner.
const ACTIVE: usize = 0b01;
/// Bit 1 of the state word: the chain is dead; pushes fail.
const RETIRED: usize = 0b10;
/// The inbox pointer bits of the state word.
const PTR_MASK: usize = !(ACTIVE | RETIRED);

/// The link embedded in every node of a [`Chain`].
///
/// A node type puts a `Link` inside itself and implements [`Linked`] to convert between a pointer
/// to the node and a pointer to its link.
///
/// ```
/// use keyserial_core::chain::Link;
/// let link = Link::new();
/// # let _ = link;
/// ```
pub struct Link {
    /// The next node: towards older pushes while in the inbox, towards younger ones in the private
    /// FIFO. Written by the pusher before its CAS publishes the node, afterwards only by the owner.
    next: UnsafeCell<*mut Link>,
}

impl Link {
    /// A fresh, unlinked link.
    ///
    /// ```
    /// let _link = keyserial_core::chain::Link::new();
    /// ```
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Link {
            next: UnsafeCell::new(ptr::null_mut()),
        }
    }

    /// A fresh, unlinked link.
    #[cfg(loom)]
    pub fn new() -> Self {
        Link {
            next: UnsafeCell::new(ptr::null_mut()),
        }
    }

    /// # Safety
    /// The caller owns `link` (it is not reachable by any other thread right now).
    #[inline]
    pub(crate) unsafe fn set_next(link: NonNull<Link>, next: *mut Link) {
        // SAFETY: the caller owns the node, so no other access to `next` can race with this write.
        unsafe { (*link.as_ptr()).next.with_mut(|p| *p = next) }
    }

    /// # Safety
    /// The caller owns `link`, or it is published to the caller by an acquire of the state word.
    #[inline]
    pub(crate) unsafe fn next(link: NonNull<Link>) -> *mut Link {
        // SAFETY: the node is owned by the caller; its last write happened-before this read.
        unsafe { (*link.as_ptr()).next.with(|p| *p) }
    }
}

impl Default for Link {
    fn default() -> Self {
        Link::new()
    }
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Link")
    }
}

// SAFETY: a Link is only a pointer slot whose accesses are ordered by the chain protocol above.
unsafe impl Send for Link {}
// SAFETY: as above; shared access to `next` happens only under the protocol's ownership rules.
unsafe impl Sync for Link {}

/// A node type that can be queued on a [`Chain`].
///
/// # Safety
///
/// - [`link`](Linked::link) must return a pointer to a [`Link`] that lives inside the node (or at
///   least as long as it), is used by no other chain at the same time, and is aligned to at least 4.
/// - [`from_link`](Linked::from_link) must be the exact inverse of `link`.
///
/// ```
/// use core::ptr::NonNull;
/// use keyserial_core::chain::{Chain, Link, Linked, Pushed};
///
/// #[repr(C)]
/// struct Job { link: Link, id: u32 }
///
/// // SAFETY: `link` is the first field of a `repr(C)` struct, so the casts are exact inverses.
/// unsafe impl Linked for Job {
///     fn link(node: NonNull<Self>) -> NonNull<Link> { node.cast() }
///     unsafe fn from_link(link: NonNull<Link>) -> NonNull<Self> { link.cast() }
/// }
///
/// let mut job = Job { link: Link::new(), id: 7 };
/// let chain: Chain<Job> = Chain::new();
/// // SAFETY: `job` outlives the chain, is queued once and not touched while queued.
/// assert_eq!(unsafe { chain.push(NonNull::from(&mut job)) }.unwrap(), Pushed::Activated);
/// // SAFETY: the push above activated the chain, so this thread owns it.
/// let popped = unsafe { chain.pop() }.unwrap();
/// assert_eq!(unsafe { popped.as_ref() }.id, 7);
/// assert!(unsafe { chain.try_release() });
/// ```
pub unsafe trait Linked {
    /// The link inside `node`. (Implemented in the trait's example above.)
    fn link(node: NonNull<Self>) -> NonNull<Link>;

    /// The node that contains `link`. (Implemented in the trait's example above.)
    ///
    /// # Safety
    /// `link` was returned by [`link`](Linked::link).
    unsafe fn from_link(link: NonNull<Link>) -> NonNull<Self>;

    /// Called once for every node still queued when its chain is dropped. The default does
    /// nothing, which suits caller-owned nodes; heap nodes free themselves.
    ///
    /// # Safety
    /// Called with exclusive ownership of `node`, which is never used again by the chain.
    unsafe fn drop_queued(node: NonNull<Self>) {
        let _ = node;
    }
}

/// What a successful [`Chain::push`] means for the pusher.
///
/// ```
/// use keyserial_core::chain::{BoxNode, Chain, Pushed};
/// let chain: Chain<BoxNode<u8>> = Chain::new();
/// match chain.push_value(1) {
///     // This thread owns the chain now: schedule it (here: drain it at once).
///     // SAFETY: the activating push made this thread the owner.
///     Ok(Pushed::Activated) => unsafe {
///         while let Some(v) = chain.pop_value() { assert_eq!(v, 1) }
///         assert!(chain.try_release());
///     },
///     Ok(Pushed::Queued) => unreachable!("the chain was idle"),
///     Err(_) => unreachable!("the chain is not retired"),
/// }
/// ```
#[must_use = "a pusher that activated the chain must schedule it, or its tasks are never run"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// The chain was idle; this push made it active. The pusher now owns the chain and must hand
    /// it to a worker (a ready queue) or drain it itself.
    Activated,
    /// The chain already had an owner, who will take this node.
    Queued,
}

/// A push onto a retired chain: the node is handed back untouched. Look the key up again: the
/// table has (or will get) a fresh chain for it.
///
/// ```
/// use keyserial_core::chain::{BoxNode, Chain, Retired};
/// let chain: Chain<BoxNode<&str>> = Chain::new();
/// assert!(chain.try_retire());
/// let Err(Retired(task)) = chain.push_value("job") else { unreachable!() };
/// assert_eq!(task, "job"); // back to the caller, who finds the key's fresh chain
/// ```
#[derive(Debug, PartialEq, Eq)]
pub struct Retired<T>(pub T);

/// A node taken off the chain by [`Chain::pop_coalescing`].
///
/// ```
/// use keyserial_core::chain::{BoxNode, Chain};
/// let chain: Chain<BoxNode<bool>> = Chain::new(); // the value: "coalescing?"
/// let _ = chain.push_value(true);
/// let _ = chain.push_value(true);
/// // SAFETY: this thread activated the chain; the popped nodes came from `push_value`.
/// unsafe {
///     let first = chain.pop_coalescing(|n| n.as_ref().value).unwrap();
///     assert!(first.superseded); // the next push replaces it
///     BoxNode::into_value(first.node);
///     let second = chain.pop_coalescing(|n| n.as_ref().value).unwrap();
///     assert!(!second.superseded);
///     BoxNode::into_value(second.node);
///     assert!(chain.try_release());
/// }
/// ```
#[derive(Debug, PartialEq, Eq)]
pub struct Popped<N> {
    /// The node, now owned by the caller.
    pub node: NonNull<N>,
    /// `true` if the node is coalescing and the very next node (the next push after it) is
    /// coalescing too: the newer one replaces it, so this one must not run.
    pub superseded: bool,
}

/// One key's task chain. See the [module documentation](self) for the protocol.
///
/// Anyone may [`push`](Chain::push) (or [`push_value`](Chain::push_value)) and
/// [`try_retire`](Chain::try_retire). The `unsafe` owner methods ([`pop`](Chain::pop),
/// [`peek`](Chain::peek), [`unpop`](Chain::unpop), [`pop_coalescing`](Chain::pop_coalescing),
/// [`try_release`](Chain::try_release)) are for the code that drives chains, an executor's worker
/// loop, and only while it holds the chain's `ACTIVE` baton.
///
/// ```
/// use keyserial_core::chain::{BoxNode, Chain, Pushed};
///
/// let chain: Chain<BoxNode<u32>> = Chain::new();
/// // Submitters:
/// assert_eq!(chain.push_value(1), Ok(Pushed::Activated)); // this one must schedule the chain
/// assert_eq!(chain.push_value(2), Ok(Pushed::Queued));
/// // The worker that got the chain from the activating pusher drains and releases it:
/// // SAFETY: this thread made the activating push, so it holds the baton.
/// unsafe {
///     loop {
///         while let Some(task) = chain.pop_value() {
///             let _ = task; // run it
///         }
///         if chain.try_release() {
///             break; // nothing was pushed meanwhile
///         }
///     }
/// }
/// // An idle chain may be retired (then unlinked from its table and freed).
/// assert!(chain.try_retire());
/// ```
pub struct Chain<N: Linked> {
    /// The state word: `INBOX | RETIRED | ACTIVE`.
    state: AtomicUsize,
    /// The owner's private FIFO (oldest first), touched only by the holder of `ACTIVE`.
    local: UnsafeCell<*mut Link>,
    _nodes: PhantomData<NonNull<N>>,
}

// SAFETY: the chain hands nodes between threads; that is sound when the nodes themselves are Send.
unsafe impl<N: Linked + Send> Send for Chain<N> {}
// SAFETY: shared access goes through the state word's atomics; `local` is touched only by the
// unique owner of `ACTIVE` (the owner methods are `unsafe` with that precondition).
unsafe impl<N: Linked + Send> Sync for Chain<N> {}

impl<N: Linked> Default for Chain<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<N: Linked> fmt::Debug for Chain<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state.load(Ordering::Relaxed);
        f.debug_struct("Chain")
            .field("active", &(s & ACTIVE != 0))
            .field("retired", &(s & RETIRED != 0))
            .field("inbox_empty", &(s & PTR_MASK == 0))
            .finish()
    }
}

impl<N: Linked> Chain<N> {
    /// An idle, empty chain.
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode};
    /// let chain: Chain<BoxNode<u32>> = Chain::new();
    /// assert!(chain.is_idle());
    /// ```
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Chain {
            state: AtomicUsize::new(0),
            local: UnsafeCell::new(ptr::null_mut()),
            _nodes: PhantomData,
        }
    }

    /// An idle, empty chain.
    #[cfg(loom)]
    pub fn new() -> Self {
        Chain {
            state: AtomicUsize::new(0),
            local: UnsafeCell::new(ptr::null_mut()),
            _nodes: PhantomData,
        }
    }

    /// Makes a retired (or never used) chain idle again, so that fixed storage can hold a new
    /// key's chain: `RETIRED -> 0`. Wait-free.
    ///
    /// # Safety
    /// The caller has exclusive use of the chain: it is retired or idle and empty, and no other
    /// thread may still push to it with a view of the state word taken before this call (the
    /// storage's own protocol guarantees that, for example by a pin count that is zero; see
    /// [`crate::fixed`]). Otherwise a stale push could land on the new incarnation.
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode};
    /// let chain: Chain<BoxNode<u8>> = Chain::new();
    /// assert!(chain.try_retire());
    /// // SAFETY: retired, and no other thread can see this chain.
    /// unsafe { chain.revive() };
    /// assert!(chain.is_idle());
    /// ```
    pub unsafe fn revive(&self) {
        let prev = self.state.swap(0, Ordering::Relaxed);
        debug_assert!(prev == RETIRED || prev == 0, "revive of a live chain");
    }

    /// Appends `node`. Lock-free; one CAS when uncontended.
    ///
    /// On success the chain owns the node until the owner pops it. If the result is
    /// [`Pushed::Activated`] the caller now owns the chain and must schedule it.
    /// On a retired chain the node is handed back in [`Retired`], untouched, and is the caller's
    /// again.
    ///
    /// For heap nodes the safe [`push_value`](Chain::push_value) (`alloc` feature) does the
    /// allocation and this call in one step.
    ///
    /// # Safety
    /// `node` is handed over to the chain, so:
    /// - it points to a live `N`, which the caller owns exclusively: it is not queued on any
    ///   chain (this one included) and no other code reads or writes it, its [`Link`] above all,
    ///   until the chain's owner pops it or the chain's `Drop` passes it to
    ///   [`Linked::drop_queued`];
    /// - it stays valid (not moved, not freed) until then;
    /// - it is a node that `N`'s [`drop_queued`](Linked::drop_queued) accepts, and that whoever
    ///   pops it knows how to dispose of (a [`BoxNode`] from [`BoxNode::new`], a
    ///   [`PoolNode`](crate::pool::PoolNode) from [`Pool::alloc`](crate::pool::Pool::alloc)).
    ///
    /// ```
    /// use core::ptr::NonNull;
    /// use keyserial_core::chain::{Chain, Link, Linked, Pushed};
    ///
    /// #[repr(C)]
    /// struct Job { link: Link, id: u32 }
    /// // SAFETY: `link` is the first field of a `repr(C)` struct, so the casts are exact inverses.
    /// unsafe impl Linked for Job {
    ///     fn link(node: NonNull<Self>) -> NonNull<Link> { node.cast() }
    ///     unsafe fn from_link(link: NonNull<Link>) -> NonNull<Self> { link.cast() }
    /// }
    ///
    /// let mut a = Job { link: Link::new(), id: 1 };
    /// let mut b = Job { link: Link::new(), id: 2 };
    /// let chain: Chain<Job> = Chain::new();
    /// // SAFETY: `a` and `b` outlive the chain, are queued once each, and are not touched while
    /// // queued; `Job`'s default `drop_queued` does nothing, which suits stack nodes.
    /// unsafe {
    ///     assert_eq!(chain.push(NonNull::from(&mut a)), Ok(Pushed::Activated));
    ///     assert_eq!(chain.push(NonNull::from(&mut b)), Ok(Pushed::Queued));
    /// }
    /// // SAFETY: the first push activated the chain, so this thread owns it.
    /// unsafe {
    ///     assert_eq!(chain.pop().unwrap().as_ref().id, 1);
    ///     assert_eq!(chain.pop().unwrap().as_ref().id, 2);
    ///     assert!(chain.try_release());
    /// }
    /// ```
    pub unsafe fn push(&self, node: NonNull<N>) -> Result<Pushed, Retired<NonNull<N>>> {
        let link = N::link(node);
        debug_assert_eq!(
            link.as_ptr() as usize & !PTR_MASK,
            0,
            "Link must be 4-aligned"
        );
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            if cur & RETIRED != 0 {
                return Err(Retired(node));
            }
            // SAFETY: the caller handed the node over (our contract) and it is not published
            // yet (our CAS below has not succeeded), so this thread owns it exclusively.
            unsafe { Link::set_next(link, (cur & PTR_MASK) as *mut Link) };
            let new = link.as_ptr() as usize | ACTIVE;
            // AcqRel on success: Release publishes the node (and `next`) to the owner's take;
            // Acquire because a push that activates becomes the owner and must see the previous
            // owner's writes (its release CAS). Relaxed on failure: a retry re-publishes, and a
            // bounce on RETIRED hands back a node that never left this thread. See "Memory
            // ordering" in the module docs.
            match self
                .state
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(prev) if prev & ACTIVE == 0 => return Ok(Pushed::Activated),
                Ok(_) => return Ok(Pushed::Queued),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Takes the oldest node, refilling the private FIFO from the inbox when it is empty.
    /// Returns `None` when nothing is queued; the caller still owns the chain and should
    /// [`try_release`](Self::try_release) it. Wait-free.
    ///
    /// # Safety
    /// The caller owns the chain (holds `ACTIVE`).
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode, Pushed};
    /// let chain: Chain<BoxNode<u8>> = Chain::new();
    /// let _ = chain.push_value(1);
    /// let _ = chain.push_value(2);
    /// // SAFETY: the first push activated the chain; this thread owns it.
    /// unsafe {
    ///     assert_eq!(chain.pop_value(), Some(1));
    ///     assert_eq!(chain.pop_value(), Some(2));
    ///     assert_eq!(chain.pop_value(), None);
    ///     assert!(chain.try_release());
    /// }
    /// ```
    pub unsafe fn pop(&self) -> Option<NonNull<N>> {
        // SAFETY: the caller owns the chain.
        let head = unsafe { self.peek_link() }?;
        // SAFETY: the caller owns the chain and so the private FIFO and every node in it.
        unsafe {
            let next = Link::next(head);
            self.local.with_mut(|l| *l = next);
            // The next pop reads `next`'s link, which a long backlog has often evicted since the
            // take walked it: start fetching it now, while the caller runs this node's task.
            prefetch(next);
            Some(N::from_link(head))
        }
    }

    /// The oldest queued node without taking it (refilling the private FIFO from the inbox if
    /// needed). Wait-free.
    ///
    /// # Safety
    /// The caller owns the chain. The returned pointer stays valid while the node is queued.
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode};
    /// let chain: Chain<BoxNode<u8>> = Chain::new();
    /// let _ = chain.push_value(9);
    /// // SAFETY: this thread activated the chain.
    /// unsafe {
    ///     assert!(chain.peek().is_some());
    ///     assert_eq!(chain.pop_value(), Some(9));
    ///     assert!(chain.peek().is_none());
    ///     assert!(chain.try_release());
    /// }
    /// ```
    pub unsafe fn peek(&self) -> Option<NonNull<N>> {
        // SAFETY: forwarded precondition.
        unsafe { self.peek_link() }.map(|l| {
            // SAFETY: `l` came from `N::link` when it was pushed.
            unsafe { N::from_link(l) }
        })
    }

    /// # Safety
    /// The caller owns the chain.
    unsafe fn peek_link(&self) -> Option<NonNull<Link>> {
        let local = self.local.with(|l| {
            // SAFETY: only the owner touches `local`, and the caller is the owner.
            unsafe { *l }
        });
        if let Some(head) = NonNull::new(local) {
            return Some(head);
        }
        // Take the whole inbox, leaving ACTIVE (we still own the chain).
        let prev = self.state.swap(ACTIVE, Ordering::Acquire);
        debug_assert!(
            prev & ACTIVE != 0 && prev & RETIRED == 0,
            "pop without owning the chain"
        );
        let mut inbox = (prev & PTR_MASK) as *mut Link;
        // Reverse newest-first into oldest-first.
        let mut fifo: *mut Link = ptr::null_mut();
        while let Some(node) = NonNull::new(inbox) {
            // SAFETY: the swap (acquire) made every node of the inbox ours; their `next` fields
            // were written before the pushes (release) that published them.
            unsafe {
                inbox = Link::next(node);
                Link::set_next(node, fifo);
            }
            fifo = node.as_ptr();
        }
        // SAFETY: only the owner touches `local`.
        self.local.with_mut(|l| unsafe { *l = fifo });
        NonNull::new(fifo)
    }

    /// Puts a node the owner popped but did not run back at the front, so it is the next one
    /// popped (for example a task that must wait for permits). Wait-free.
    ///
    /// # Safety
    /// The caller owns the chain, and `node` is the node most recently popped from it by the
    /// current owner and not pushed anywhere since.
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode};
    /// let chain: Chain<BoxNode<u8>> = Chain::new();
    /// let _ = chain.push_value(1);
    /// let _ = chain.push_value(2);
    /// // SAFETY: this thread activated the chain; the node was just popped from it.
    /// unsafe {
    ///     let first = chain.pop().unwrap();
    ///     chain.unpop(first);
    ///     assert_eq!(chain.pop_value(), Some(1));
    ///     assert_eq!(chain.pop_value(), Some(2));
    ///     assert!(chain.try_release());
    /// }
    /// ```
    pub unsafe fn unpop(&self, node: NonNull<N>) {
        let link = N::link(node);
        // SAFETY: the caller owns the chain, its private FIFO and the node.
        unsafe {
            let head = self.local.with(|l| *l);
            Link::set_next(link, head);
            self.local.with_mut(|l| *l = link.as_ptr());
        }
    }

    /// Pops the oldest node and tells whether it is superseded under keep-latest coalescing: a
    /// node for which `is_coalescing` is true is superseded when the next node queued after it is
    /// coalescing too. The check refills from the inbox, so "next" means the next push that had
    /// succeeded by now; a push that comes later finds this node already started. Wait-free
    /// apart from `is_coalescing`.
    ///
    /// # Safety
    /// The caller owns the chain.
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode};
    /// let chain: Chain<BoxNode<(bool, u8)>> = Chain::new();
    /// for item in [(false, 1), (true, 2), (true, 3), (false, 4)] {
    ///     let _ = chain.push_value(item);
    /// }
    /// let latest = |n: core::ptr::NonNull<BoxNode<(bool, u8)>>| unsafe { n.as_ref() }.value.0;
    /// let mut ran = Vec::new();
    /// // SAFETY: this thread activated the chain.
    /// unsafe {
    ///     while let Some(p) = chain.pop_coalescing(latest) {
    ///         let node = BoxNode::into_value(p.node);
    ///         if !p.superseded { ran.push(node.1) }
    ///     }
    ///     assert!(chain.try_release());
    /// }
    /// assert_eq!(ran, [1, 3, 4]);
    /// ```
    pub unsafe fn pop_coalescing(
        &self,
        mut is_coalescing: impl FnMut(NonNull<N>) -> bool,
    ) -> Option<Popped<N>> {
        // SAFETY: forwarded precondition.
        let node = unsafe { self.pop() }?;
        let superseded = is_coalescing(node)
            // SAFETY: forwarded precondition.
            && unsafe { self.peek() }.is_some_and(&mut is_coalescing);
        Some(Popped { node, superseded })
    }

    /// Gives up ownership if nothing is queued: `CAS(ACTIVE -> 0)`. Returns `true` if released
    /// (the caller must not touch the chain's owner state again, and the chain may be retired and
    /// freed by others from now on, subject to the caller's reclamation scheme). Returns `false`
    /// if something is queued: the caller still owns the chain and must drain or reschedule it.
    /// Wait-free.
    ///
    /// # Safety
    /// The caller owns the chain.
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode};
    /// let chain: Chain<BoxNode<u8>> = Chain::new();
    /// let _ = chain.push_value(1);
    /// // SAFETY: this thread activated the chain.
    /// unsafe {
    ///     assert!(!chain.try_release()); // 1 is still queued
    ///     assert_eq!(chain.pop_value(), Some(1));
    ///     assert!(chain.try_release());
    /// }
    /// assert!(chain.is_idle());
    /// ```
    #[must_use = "if the release failed the caller still owns the chain"]
    pub unsafe fn try_release(&self) -> bool {
        // SAFETY: only the owner touches `local`.
        let local_empty = self.local.with(|l| unsafe { *l }).is_null();
        if !local_empty {
            return false;
        }
        self.state
            .compare_exchange(ACTIVE, 0, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Retires an idle, empty chain: `CAS(0 -> RETIRED)`. Returns `true` if this call retired it;
    /// from then on every push fails with [`Retired`] and the caller is responsible for unlinking
    /// and freeing the chain. Returns `false` if the chain is owned, non-empty or already retired.
    /// Wait-free.
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode, Retired};
    /// let chain: Chain<BoxNode<u8>> = Chain::new();
    /// assert!(chain.try_retire());
    /// assert!(chain.is_retired());
    /// assert_eq!(chain.push_value(1), Err(Retired(1)));
    /// ```
    #[must_use = "a retired chain must be unlinked and freed by the caller"]
    pub fn try_retire(&self) -> bool {
        self.state
            .compare_exchange(0, RETIRED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// `true` if the chain has no owner and nothing queued (a snapshot).
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode};
    /// assert!(Chain::<BoxNode<u8>>::new().is_idle());
    /// ```
    pub fn is_idle(&self) -> bool {
        self.state.load(Ordering::Acquire) == 0
    }

    /// `true` if `node` is the most recent push and still waiting in the inbox, so that nothing
    /// was pushed after it and the owner has not taken it yet (a snapshot; only addresses are
    /// compared, `node` is not read). A coalescing submitter uses this to tell that a queued node
    /// is the key's immediately preceding submission and has not started.
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode};
    /// let chain: Chain<BoxNode<u8>> = Chain::new();
    /// let a = BoxNode::new(1);
    /// // SAFETY: `a` is a fresh node that the chain owns from now on (freed by the drain below).
    /// let _ = unsafe { chain.push(a) };
    /// // SAFETY: `a` stays allocated while it is queued.
    /// let a = unsafe { a.as_ref() };
    /// assert!(chain.is_newest(a));
    /// let _ = chain.push_value(2);
    /// assert!(!chain.is_newest(a));
    /// # unsafe { while chain.pop_value().is_some() {} let _ = chain.try_release(); }
    /// ```
    pub fn is_newest(&self, node: &N) -> bool {
        self.state.load(Ordering::Acquire) & PTR_MASK
            == N::link(NonNull::from(node)).as_ptr() as usize
    }

    /// `true` once the chain is retired (terminal).
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode};
    /// let c = Chain::<BoxNode<u8>>::new();
    /// assert!(!c.is_retired());
    /// ```
    pub fn is_retired(&self) -> bool {
        self.state.load(Ordering::Acquire) & RETIRED != 0
    }

    /// `true` while the chain has an owner (a snapshot).
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode};
    /// let c = Chain::<BoxNode<u8>>::new();
    /// let _ = c.push_value(1);
    /// assert!(c.is_active());
    /// # unsafe { c.pop_value(); let _ = c.try_release(); }
    /// ```
    pub fn is_active(&self) -> bool {
        self.state.load(Ordering::Acquire) & ACTIVE != 0
    }
}

impl<N: Linked> Drop for Chain<N> {
    fn drop(&mut self) {
        // `&mut self`: no other thread can touch the chain; every queued node is ours. (An atomic
        // load rather than `get_mut`, so that loom models, which cannot see the epoch
        // reclamation's own synchronisation, do not flag the destructor.)
        let state = self.state.load(Ordering::Relaxed);
        let mut inbox = (state & PTR_MASK) as *mut Link;
        // SAFETY: `&mut self` gives exclusive access to the private FIFO cell.
        let mut local = self.local.with_mut(|l| unsafe { *l });
        // Drop the private FIFO first (older), then the inbox.
        for list in [&mut local, &mut inbox] {
            while let Some(node) = NonNull::new(*list) {
                // SAFETY: exclusive access (`&mut self`); each node is visited once and never used
                // by the chain again.
                unsafe {
                    *list = Link::next(node);
                    N::drop_queued(N::from_link(node));
                }
            }
        }
    }
}

#[cfg(feature = "alloc")]
pub use boxed::BoxNode;

#[cfg(feature = "alloc")]
mod boxed {
    use super::{Chain, Link, Linked, Pushed, Retired};
    use alloc::boxed::Box;
    use core::ptr::NonNull;

    /// A heap node holding one value: the simplest [`Linked`] type (`alloc` feature).
    ///
    /// ```
    /// use keyserial_core::chain::{BoxNode, Chain};
    /// let chain: Chain<BoxNode<String>> = Chain::new();
    /// let _ = chain.push_value("hello".to_string());
    /// // SAFETY: the push activated the chain, so this thread owns it.
    /// assert_eq!(unsafe { chain.pop_value() }.as_deref(), Some("hello"));
    /// # assert!(unsafe { chain.try_release() });
    /// ```
    #[repr(C)]
    pub struct BoxNode<T> {
        link: Link,
        /// The queued value.
        pub value: T,
    }

    impl<T> BoxNode<T> {
        /// Allocates a node holding `value`.
        ///
        /// ```
        /// let node = keyserial_core::chain::BoxNode::new(5u8);
        /// // SAFETY: `node` came from `BoxNode::new` and is not queued.
        /// assert_eq!(unsafe { keyserial_core::chain::BoxNode::into_value(node) }, 5);
        /// ```
        pub fn new(value: T) -> NonNull<Self> {
            NonNull::from(Box::leak(Box::new(BoxNode {
                link: Link::new(),
                value,
            })))
        }

        /// Frees the node and returns its value.
        ///
        /// # Safety
        /// `node` came from [`BoxNode::new`], is not queued on any chain, and is not used again.
        ///
        /// ```
        /// use keyserial_core::chain::{BoxNode, Chain};
        /// let chain: Chain<BoxNode<String>> = Chain::new();
        /// let _ = chain.push_value("x".to_string());
        /// // SAFETY: this thread activated the chain; the popped node is a `BoxNode::new` node
        /// // no chain holds any more.
        /// unsafe {
        ///     let node = chain.pop().unwrap();
        ///     assert_eq!(BoxNode::into_value(node), "x");
        ///     assert!(chain.try_release());
        /// }
        /// ```
        pub unsafe fn into_value(node: NonNull<Self>) -> T {
            // SAFETY: per the contract the node is a leaked Box that nobody else references.
            unsafe { Box::from_raw(node.as_ptr()) }.value
        }
    }

    // SAFETY: `link` is the first field of a `repr(C)` struct, so the pointer casts are exact
    // inverses; a Link is pointer-aligned (at least 4 on every supported target).
    unsafe impl<T> Linked for BoxNode<T> {
        fn link(node: NonNull<Self>) -> NonNull<Link> {
            node.cast()
        }

        unsafe fn from_link(link: NonNull<Link>) -> NonNull<Self> {
            link.cast()
        }

        unsafe fn drop_queued(node: NonNull<Self>) {
            // SAFETY: the chain hands us exclusive ownership of a node made by `BoxNode::new`.
            drop(unsafe { Box::from_raw(node.as_ptr()) });
        }
    }

    impl<T> Chain<BoxNode<T>> {
        /// Boxes `value` and pushes it; see [`Chain::push`]. On a retired chain the value comes back.
        ///
        /// ```
        /// # use keyserial_core::chain::{BoxNode, Chain, Pushed};
        /// let chain: Chain<BoxNode<u8>> = Chain::new();
        /// assert_eq!(chain.push_value(1), Ok(Pushed::Activated));
        /// # unsafe { chain.pop_value(); assert!(chain.try_release()); }
        /// ```
        pub fn push_value(&self, value: T) -> Result<Pushed, Retired<T>> {
            // SAFETY: a fresh node from `BoxNode::new`, owned by nobody else, which
            // `BoxNode::drop_queued` and `pop_value` free as the Box it is.
            unsafe { self.push(BoxNode::new(value)) }.map_err(|Retired(node)| {
                // SAFETY: the push failed, so the node was never published; we still own it.
                Retired(unsafe { BoxNode::into_value(node) })
            })
        }

        /// Pops the oldest value; see [`Chain::pop`].
        ///
        /// # Safety
        /// The caller owns the chain.
        ///
        /// ```
        /// # use keyserial_core::chain::{BoxNode, Chain};
        /// let chain: Chain<BoxNode<u8>> = Chain::new();
        /// let _ = chain.push_value(3);
        /// // SAFETY: this thread activated the chain.
        /// assert_eq!(unsafe { chain.pop_value() }, Some(3));
        /// # assert!(unsafe { chain.try_release() });
        /// ```
        pub unsafe fn pop_value(&self) -> Option<T> {
            // SAFETY: forwarded precondition; a popped node is exclusively ours and was made by
            // `BoxNode::new` (`push`'s contract; `push_value` does exactly that).
            unsafe { self.pop().map(|n| BoxNode::into_value(n)) }
        }
    }
}

#[cfg(all(test, feature = "alloc"))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::vec::Vec;

    #[test]
    fn first_push_activates_later_ones_queue() {
        let c: Chain<BoxNode<u32>> = Chain::new();
        assert_eq!(c.push_value(1), Ok(Pushed::Activated));
        assert_eq!(c.push_value(2), Ok(Pushed::Queued));
        assert!(c.is_active());
        // SAFETY: this test thread made the push that activated the chain, so it owns the chain.
        unsafe {
            assert_eq!(c.pop_value(), Some(1));
            assert_eq!(c.push_value(3), Ok(Pushed::Queued));
            assert_eq!(c.pop_value(), Some(2));
            assert_eq!(c.pop_value(), Some(3));
            assert_eq!(c.pop_value(), None);
            assert!(c.try_release());
        }
        assert!(c.is_idle());
        assert_eq!(c.push_value(4), Ok(Pushed::Activated));
        // SAFETY: this test thread made the push that activated the chain, so it owns the chain.
        unsafe {
            assert_eq!(c.pop_value(), Some(4));
            assert!(c.try_release());
        }
    }

    #[test]
    fn release_fails_while_anything_is_queued() {
        let c: Chain<BoxNode<u32>> = Chain::new();
        let _ = c.push_value(1);
        // SAFETY: this test thread made the push that activated the chain, so it owns the chain.
        unsafe {
            assert_eq!(c.pop_value(), Some(1));
            let _ = c.push_value(2); // lands in the inbox while we own the chain
            assert!(!c.try_release());
            assert_eq!(c.pop_value(), Some(2));
            assert!(c.try_release());
        }
    }

    #[test]
    fn retire_only_from_idle_and_is_terminal() {
        let c: Chain<BoxNode<u32>> = Chain::new();
        let _ = c.push_value(1);
        assert!(!c.try_retire(), "active chain must not retire");
        // SAFETY: this test thread made the push that activated the chain, so it owns the chain.
        unsafe {
            c.pop_value();
            assert!(c.try_release());
        }
        assert!(c.try_retire());
        assert!(!c.try_retire(), "retire happens once");
        assert_eq!(c.push_value(5), Err(Retired(5)));
        assert!(c.is_retired() && !c.is_active() && !c.is_idle());
    }

    #[test]
    fn fifo_across_many_refills() {
        let c: Chain<BoxNode<u32>> = Chain::new();
        let mut next_push = 0;
        let mut next_pop = 0;
        for round in 0..50u32 {
            for _ in 0..(round % 7) + 1 {
                let _ = c.push_value(next_push);
                next_push += 1;
            }
            for _ in 0..(round % 5) {
                // SAFETY: this test thread made the push that activated the chain, so it owns the chain.
                if let Some(v) = unsafe { c.pop_value() } {
                    assert_eq!(v, next_pop);
                    next_pop += 1;
                }
            }
        }
        // SAFETY: this test thread made the push that activated the chain, so it owns the chain.
        while let Some(v) = unsafe { c.pop_value() } {
            assert_eq!(v, next_pop);
            next_pop += 1;
        }
        assert_eq!(next_pop, next_push);
        // SAFETY: this test thread made the push that activated the chain, so it owns the chain.
        assert!(unsafe { c.try_release() });
    }

    #[test]
    fn drop_frees_queued_nodes_in_both_lists() {
        let token = Arc::new(());
        let c: Chain<BoxNode<Arc<()>>> = Chain::new();
        for _ in 0..3 {
            let _ = c.push_value(token.clone());
        }
        // SAFETY: this test thread made the push that activated the chain, so it owns the chain.
        unsafe { assert!(c.peek().is_some()) }; // moves the inbox into the private FIFO
        for _ in 0..2 {
            let _ = c.push_value(token.clone()); // and two more stay in the inbox
        }
        assert_eq!(Arc::strong_count(&token), 6);
        drop(c);
        assert_eq!(Arc::strong_count(&token), 1);
    }

    #[test]
    fn coalescing_skips_only_a_directly_followed_latest() {
        // (is_latest, id)
        let c: Chain<BoxNode<(bool, u32)>> = Chain::new();
        let items = [
            (true, 0),
            (true, 1),
            (false, 2),
            (true, 3),
            (false, 4),
            (true, 5),
            (true, 6),
            (true, 7),
        ];
        for it in items {
            let _ = c.push_value(it);
        }
        // SAFETY: called only on nodes queued in a chain this test owns.
        let latest = |n: NonNull<BoxNode<(bool, u32)>>| unsafe { n.as_ref() }.value.0;
        let mut ran = Vec::new();
        let mut superseded = Vec::new();
        // SAFETY: this test thread made the push that activated the chain, so it owns the chain.
        unsafe {
            while let Some(p) = c.pop_coalescing(latest) {
                let v = BoxNode::into_value(p.node).1;
                if p.superseded {
                    superseded.push(v)
                } else {
                    ran.push(v)
                }
            }
            assert!(c.try_release());
        }
        assert_eq!(ran, [1, 2, 3, 4, 7]);
        assert_eq!(superseded, [0, 5, 6]);
    }

    #[test]
    fn coalescing_sees_pushes_made_after_the_first_take() {
        let c: Chain<BoxNode<(bool, u32)>> = Chain::new();
        let _ = c.push_value((true, 1));
        // SAFETY: called only on nodes queued in a chain this test owns.
        let latest = |n: NonNull<BoxNode<(bool, u32)>>| unsafe { n.as_ref() }.value.0;
        // SAFETY: this test thread made the push that activated the chain, so it owns the chain.
        unsafe {
            assert!(c.peek().is_some()); // node 1 is now in the private FIFO
            let _ = c.push_value((true, 2)); // pushed into the inbox before 1 starts
            let p = c.pop_coalescing(latest).unwrap();
            assert!(p.superseded);
            let _ = BoxNode::into_value(p.node);
            let p = c.pop_coalescing(latest).unwrap();
            assert!(!p.superseded);
            assert_eq!(BoxNode::into_value(p.node).1, 2);
            assert!(c.try_release());
        }
    }

    #[test]
    fn concurrent_pushers_one_drainer_lose_nothing_and_keep_order() {
        use std::sync::atomic::{AtomicUsize as StdAtomic, Ordering as O};
        use std::thread;
        const PUSHERS: usize = 3;
        #[cfg(miri)]
        const PER: usize = 50;
        #[cfg(not(miri))]
        const PER: usize = 20_000;
        let chain: Arc<Chain<BoxNode<(usize, usize)>>> = Arc::new(Chain::new());
        let activations = Arc::new(StdAtomic::new(0));
        // The "ready queue": whoever activates hands the chain over through this channel.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let handles: Vec<_> = (0..PUSHERS)
            .map(|p| {
                let chain = chain.clone();
                let tx = tx.clone();
                let activations = activations.clone();
                thread::spawn(move || {
                    for i in 0..PER {
                        if chain.push_value((p, i)).unwrap() == Pushed::Activated {
                            activations.fetch_add(1, O::Relaxed);
                            tx.send(()).unwrap();
                        }
                    }
                })
            })
            .collect();
        drop(tx);
        let mut last = [None::<usize>; PUSHERS];
        let mut seen = 0;
        let mut drains = 0;
        while rx.recv().is_ok() {
            drains += 1;
            // We own the chain now: drain until a release succeeds.
            loop {
                // SAFETY: this thread received the chain's baton through the channel, so it owns the chain.
                while let Some((p, i)) = unsafe { chain.pop_value() } {
                    assert!(last[p].map_or(i == 0, |l| i == l + 1), "order broken");
                    last[p] = Some(i);
                    seen += 1;
                }
                // SAFETY: as above: this thread owns the chain.
                if unsafe { chain.try_release() } {
                    break;
                }
            }
        }
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(seen, PUSHERS * PER);
        assert_eq!(drains, activations.load(O::Relaxed));
        assert!(chain.is_idle());
    }
}

/// Asks the CPU to start fetching the cache line at `p` (x86-64 only; nothing under Miri or loom,
/// or on other targets). A hint: it never faults and changes no program state, whatever `p` is.
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    // SAFETY: a prefetch never faults and has no effect on the program's state, whatever the
    // address (null included); SSE is part of the x86-64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(loom))))]
    let _ = p;
}
