//! A key's task chain: an intrusive multi-producer, single-consumer queue fused with the handoff
//! word that lets exactly one drainer own the key at a time.
//!
//! **A building block**, for keyserial's executor and for anyone writing their own: applications
//! submit through `keyserial::Serializer` instead. Taking, peeking, un-popping and releasing are
//! `unsafe` because only the holder of the chain's `ACTIVE` baton may call them, and pushing a raw
//! node is `unsafe` because the chain takes ownership of it; [`Chain::push_value`] is the safe
//! push for heap nodes.
//!
//! # Shape
//!
//! The nodes form one forward-linked list, oldest first, in the order their pushes succeeded:
//! each push appends at the *tail* and then links the previous tail's [`Link`] to itself (the
//! queue of Dmitry Vyukov's intrusive MPSC design). The owner reads the list front to back, one
//! node at a time, and knows the next node while it runs the current one, so it can fetch it
//! ahead. (An earlier version pushed onto a LIFO stack that the owner reversed before it could
//! pop anything: a walk of dependent cache misses over the whole backlog before the first task
//! ran. BENCHMARKS.md, run J, measures the difference.)
//!
//! Three places hold the list:
//!
//! ```text
//!  state  (atomic)   TAIL | RETIRED | ACTIVE   the newest node, and the handoff bits (below)
//!  first  (atomic)   the node pushed when TAIL was null: the list's start after an empty spell
//!  head   (owner's)  the oldest node not yet popped (0: the list continues at `first`);
//!                    bit 0 THEN_FIRST: this node was un-popped after it emptied the list, so the
//!                    list continues at `first` after it
//! ```
//!
//! # The state word
//!
//! ```text
//!  bit 0      ACTIVE   exactly one owner holds the chain: it is on a ready queue, being drained,
//!                      or parked by its owner (waiting for permits)
//!  bit 1      RETIRED  terminal: the chain has left (or is leaving) the key table
//!  bits 2..   TAIL     the newest pushed node that may still get a successor, or null. Nodes are at
//!                      least 4-byte aligned, so the low two bits are free.
//! ```
//!
//! Legal values: `0` (idle: not owned, nothing queued), `ACTIVE` (owned, no node can get a
//! successor), `ptr | ACTIVE` (owned, `ptr` is the newest node), `RETIRED` (dead). A non-null tail
//! without `ACTIVE`, or `RETIRED` with anything else, never occurs: every push sets `ACTIVE`, and
//! retire only starts from `0`. The word is only changed by read-modify-write operations (CAS or
//! swap), so every transition below is atomic with respect to every other, and no step relies on
//! a store followed by a load of another location (the "Dekker" pattern loom cannot prove).
//!
//! # Transitions and who may make them
//!
//! | operation | who | transition | then |
//! |---|---|---|---|
//! | [`push`](Chain::push) | anyone | `t | a -> node | ACTIVE` (CAS; fails on `RETIRED`: the node is handed back) | link: `t.next = node`, or `first = node` if `t` was null |
//! | pop of the last node | the owner | `node | ACTIVE -> ACTIVE` (CAS, the *swing*) | if it fails, a push replaced `node` and is about to link behind it: wait for the link |
//! | [`try_release`](Chain::try_release) | the owner | `ACTIVE -> 0` (CAS) | fails if a node is queued: still the owner |
//! | [`try_retire`](Chain::try_retire) | anyone | `0 -> RETIRED` (CAS) | fails unless idle |
//! | [`try_claim`](Chain::try_claim) | anyone | `0 -> ACTIVE` (CAS) | fails unless idle: the caller holds the baton of an empty chain |
//! | [`try_retire_owned`](Chain::try_retire_owned) | the owner | `ACTIVE -> RETIRED` (CAS) | fails if a node is queued: still the owner |
//!
//! *Ownership* of `ACTIVE` is a baton. It is created by the one push that moves the word from `0`
//! to `ACTIVE` ([`Pushed::Activated`]): that pusher, and only it, must hand the chain to a worker
//! (put it on a ready queue). A [`try_claim`](Chain::try_claim) creates it too, for a chain with
//! nothing queued: an executor holds an idle key that way without a task (a paused key). Whoever holds the baton may pass it on (queue → worker → queue …)
//! and is the only party that may touch `head`, take `first`, or call the `unsafe` owner methods.
//! The baton disappears only by a successful [`try_release`](Chain::try_release).
//!
//! # The pop
//!
//! The owner pops node `n` (taken from `head`, or from `first` when `head` is 0) only once it
//! knows what follows it: either `n.next` is set, or the swing CAS took `n` out of the tail, so
//! that no push will ever write `n.next`. Only then is `n` handed to the caller, who may free it.
//! Between a push's CAS and its link store, `n.next` (or `first`) is not written yet although a
//! node follows. The owner does not wait for that store: [`pop`](Chain::pop) and
//! [`peek`](Chain::peek) return `None` and leave `n` at the front, and
//! [`try_release`](Chain::try_release) fails because the tail is not null. An executor then
//! puts the chain back on its ready queue and comes back to it; the pusher may be preempted
//! there, or be the very code an interrupt handler that owns the chain interrupted, so waiting
//! could last a time slice or forever.
//!
//! # Why nothing is lost, run twice, reordered, or touched after it is freed
//!
//! - **No lost wakeup.** A push either lands before the owner's release CAS (then the CAS sees a
//!   non-null tail and fails, so the owner keeps the baton and takes the node) or after it (then the
//!   push CAS reads `0`, returns [`Pushed::Activated`] and the pusher schedules the chain). Both are
//!   RMWs on one word, so one of the two orders holds; there is no window in between.
//! - **No double drain.** `ACTIVE` is set by exactly one push from `0` and cleared by exactly one
//!   release; between them pushes see `ACTIVE` and return [`Pushed::Queued`].
//! - **Never onto a retired chain.** Retire only succeeds from `0` (not owned, nothing queued) and
//!   makes the word `RETIRED` forever; a push CAS whose expected value was read before the retire
//!   fails, re-reads `RETIRED`, and hands its node back ([`Retired`]) so the caller can go back to the
//!   key table for a fresh chain. No task is ever left in a retired chain.
//! - **FIFO per key.** The tail CASes order the pushes; each push links exactly its predecessor in
//!   that order (the node its CAS replaced) to itself, or, when it replaced a null tail, becomes
//!   `first`, which the owner reads only after it has popped everything before. So the list is the
//!   pushes in CAS order, and the owner reads it front to back.
//! - **No write to a freed node.** A push writes `t.next` only for the `t` its CAS replaced; the
//!   owner does not hand `t` out before that write is visible (it waits for it, see above), and
//!   after a successful swing no CAS can replace `t` any more. A push writes `first` only after
//!   replacing a null tail, which leaves a non-null tail, so the chain can be neither released nor
//!   retired (nor, therefore, freed) before the owner has read `first`.
//! - **`first` is never overwritten unread.** It is written only by a push that replaced a null
//!   tail; the tail becomes null again only by the owner's swing, and the owner clears `first`
//!   (having read it) before the pops that lead to that swing.
//!
//! # Memory ordering
//!
//! | step | ordering | why |
//! |---|---|---|
//! | push CAS, success | `AcqRel` | *Acquire*: the push that moves the word from `0` becomes the owner and must see everything the previous owner did before its release CAS (`head`, and whatever per-key state the caller keeps under the baton); a push that replaced a null tail writes `first`, which must come after the owner's clearing of it (sequenced before the swing that the CAS reads); and a push that replaced tail `t` writes `t.next`, which must come after `t`'s own pusher cleared it. *Release*: that clearing of `t.next`, sequenced before `t`'s CAS, must happen-before the next pusher's link store into it; otherwise the null could land after the link in `t.next`'s modification order and the node would be lost. (Loom never delays a store, so it cannot catch a weakening here; the argument is this row.) A CAS cannot choose its ordering after learning which value it replaced, so every push pays both (free on x86; on weakly ordered targets an acquiring load-exclusive and a releasing store-exclusive). |
//! | push CAS, failure | `Relaxed` | a retry publishes nothing yet. A push that meets `RETIRED` acquires nothing either: its node never left this thread. |
//! | link store (`t.next` or `first`) | `Release` | publishes the node (its contents and its cleared `next`) to the owner. |
//! | owner's load of `n.next` / `first` | `Acquire` | pairs with the link store. |
//! | swing CAS, success | `Release` | the next push to replace the null tail acquires it (see the push row); failure `Relaxed`, the owner then acquires the link. |
//! | [`try_release`](Chain::try_release) CAS | `Release` | the next owner (an activating push, or a retirer) acquires it. |
//! | [`try_claim`](Chain::try_claim) CAS | `Acquire` | the claimer becomes the owner, as an activating push does: it must see the last owner's release. |
//! | [`try_retire_owned`](Chain::try_retire_owned) CAS | `AcqRel` | as `try_retire`: whoever frees the chain after it happens-after every earlier owner and pusher. |
//! | [`try_retire`](Chain::try_retire) CAS | `AcqRel` | acquires the last owner's release, so whoever unlinks and frees the chain after retiring it happens-after the last owner. |
//!
//! Passing the baton on through a ready queue relies on the queue's own release/acquire.
//!
//! # Progress
//!
//! Push is lock-free (its CAS fails only because another push, swing, release or retire
//! succeeded) and its link store follows unconditionally. Every owner operation (pop, peek, the
//! coalescing pop, unpop, release) and retire is wait-free: none waits for a pusher (see "The
//! pop"); a key whose next push is half done is put back on the ready queue, and only that key
//! waits.
//! No step depends on a node's address being unique over time (no ABA): a CAS on the tail compares
//! against the current tail, which is a live, unpopped node whatever its history.
//!
//! # Nodes
//!
//! Nodes are intrusive: a type implements [`Linked`] by embedding a [`Link`]. With the `alloc`
//! feature [`BoxNode`] wraps any value in a heap node; without an allocator, [`crate::pool::Pool`]
//! hands out nodes from fixed-capacity storage, and callers may also use their own `static` nodes.
//!
//! Loom models (the real code): `loom/tests/chain.rs`.

use core::fmt;
use core::marker::PhantomData;
use core::ptr::{self, NonNull};

use crate::prefetch::prefetch;
use crate::sync::{AtomicPtr, AtomicUsize, Ordering, UnsafeCell};

/// Bit 0 of the state word: the chain has an owner.
const ACTIVE: usize = 0b01;
/// Bit 1 of the state word: the chain is dead; pushes fail.
const RETIRED: usize = 0b10;
/// The tail pointer bits of the state word.
const PTR_MASK: usize = !(ACTIVE | RETIRED);
/// Bit 0 of the owner's `head` word: the list continues at `first` after this node.
const THEN_FIRST: usize = 0b01;

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
    /// The next younger node, or null. Cleared by the pusher before its CAS publishes the node;
    /// written once more by the push that comes next (see the module docs); owners of a node that
    /// is on no chain may use it freely.
    next: AtomicPtr<Link>,
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
            next: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// A fresh, unlinked link.
    #[cfg(loom)]
    pub fn new() -> Self {
        Link {
            next: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// Sets `next` outside any chain protocol (a private list of nodes the caller owns).
    ///
    /// # Safety
    /// `link` points to a live `Link` that the caller owns (it is not queued on any chain).
    #[inline]
    pub(crate) unsafe fn set_next(link: NonNull<Link>, next: *mut Link) {
        // SAFETY: the caller guarantees `link` is live; nobody else uses it.
        unsafe { link.as_ref() }.next.store(next, Ordering::Relaxed)
    }

    /// Reads `next` outside any chain protocol (a private list of nodes the caller owns).
    ///
    /// # Safety
    /// `link` points to a live `Link` that the caller owns (it is not queued on any chain).
    #[inline]
    pub(crate) unsafe fn next(link: NonNull<Link>) -> *mut Link {
        // SAFETY: the caller guarantees `link` is live; its last write happened-before this read.
        unsafe { link.as_ref() }.next.load(Ordering::Relaxed)
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
    /// The state word: `TAIL | RETIRED | ACTIVE`.
    state: AtomicUsize,
    /// The node pushed onto a null tail, until the owner takes it.
    first: AtomicPtr<Link>,
    /// The owner's cursor: the oldest node not yet popped (`| THEN_FIRST`), or 0 for "continue
    /// at `first`". Touched only by the holder of `ACTIVE`.
    head: UnsafeCell<usize>,
    _nodes: PhantomData<NonNull<N>>,
}

// SAFETY: the chain hands nodes between threads; that is sound when the nodes themselves are Send.
unsafe impl<N: Linked + Send> Send for Chain<N> {}
// SAFETY: shared access goes through the atomics; `head` is touched only by the
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
            .field("tail_empty", &(s & PTR_MASK == 0))
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
            first: AtomicPtr::new(ptr::null_mut()),
            head: UnsafeCell::new(0),
            _nodes: PhantomData,
        }
    }

    /// An idle, empty chain.
    #[cfg(loom)]
    pub fn new() -> Self {
        Chain {
            state: AtomicUsize::new(0),
            first: AtomicPtr::new(ptr::null_mut()),
            head: UnsafeCell::new(0),
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
        // SAFETY: the caller handed the node over (our contract) and it is not published yet, so
        // this thread owns it exclusively. Relaxed: our CAS (release) orders it before the next
        // pusher's link store into this node, and our link store (release) publishes it.
        unsafe { Link::set_next(link, ptr::null_mut()) };
        let new = link.as_ptr() as usize | ACTIVE;
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            if cur & RETIRED != 0 {
                return Err(Retired(node));
            }
            // AcqRel on success, Relaxed on failure: see "Memory ordering" in the module docs.
            match self
                .state
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(prev) => {
                    match NonNull::new((prev & PTR_MASK) as *mut Link) {
                        // SAFETY: `tail` was the tail until our CAS replaced it, so the owner has
                        // not swung it out and cannot hand it out (and let it be freed) before
                        // this store is visible: it waits for exactly this link ("The pop").
                        Some(tail) => unsafe { tail.as_ref() }
                            .next
                            .store(link.as_ptr(), Ordering::Release),
                        // We replaced a null tail: the chain stays owned and non-empty until the
                        // owner has read `first`, so `self` is alive here.
                        None => self.first.store(link.as_ptr(), Ordering::Release),
                    }
                    return Ok(if prev & ACTIVE == 0 {
                        Pushed::Activated
                    } else {
                        Pushed::Queued
                    });
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Takes the oldest node. Returns `None` when nothing can be taken now: nothing is queued, or
    /// the push of the next node is between its two steps (see "The pop" in the module docs). The
    /// caller still owns the chain and should [`try_release`](Self::try_release) it, which fails
    /// in the second case; an executor then puts the chain back on its ready queue rather than
    /// wait for the pusher. Wait-free.
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
        // SAFETY: the caller owns the chain, hence `head`.
        let head = unsafe { self.head() };
        let node = match NonNull::new((head & !THEN_FIRST) as *mut Link) {
            Some(node) if head & THEN_FIRST != 0 => {
                // An un-popped node whose successor is whatever `first` gets.
                // SAFETY: as above.
                unsafe { self.set_head(0) };
                // SAFETY: every node on the chain came from `N::link` when it was pushed.
                return Some(unsafe { N::from_link(node) });
            }
            Some(node) => node,
            // SAFETY: the caller owns the chain.
            None => unsafe { self.take_first() }?,
        };
        // SAFETY: `node` is queued and ours to pop: it stays valid until we hand it out.
        let Some(next) = (unsafe { self.successor(node) }) else {
            // Its successor's push is between its two steps: keep `node` queued, at the front.
            // SAFETY: the caller owns the chain, hence `head`.
            unsafe { self.set_head(node.as_ptr() as usize) };
            return None;
        };
        // SAFETY: the caller owns the chain, hence `head`.
        unsafe { self.set_head(next as usize) };
        // The next pop reads `next`'s line (its link and its contents): start fetching it now,
        // while the caller runs this node.
        prefetch(next);
        // SAFETY: every node on the chain came from `N::link` when it was pushed.
        Some(unsafe { N::from_link(node) })
    }

    /// The oldest queued node without taking it; `None` when nothing is queued, or when that
    /// node's own push is between its two steps (it replaced a null tail and has not stored
    /// `first` yet). Unlike [`pop`](Self::pop) it does not need the node's successor, so it may
    /// return a node that `pop` cannot hand out yet. Wait-free.
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
        // SAFETY: the caller owns the chain, hence `head`.
        let head = unsafe { self.head() };
        let node = match NonNull::new((head & !THEN_FIRST) as *mut Link) {
            Some(node) => node,
            None => {
                // SAFETY: the caller owns the chain.
                let first = unsafe { self.take_first() }?;
                // SAFETY: as above; `first`'s successor is found through its own link.
                unsafe { self.set_head(first.as_ptr() as usize) };
                first
            }
        };
        // SAFETY: every node on the chain came from `N::link` when it was pushed.
        Some(unsafe { N::from_link(node) })
    }

    /// # Safety
    /// The caller owns the chain.
    #[inline(always)]
    unsafe fn head(&self) -> usize {
        // SAFETY: only the owner touches `head`, and the caller is the owner.
        self.head.with(|h| unsafe { *h })
    }

    /// # Safety
    /// The caller owns the chain.
    #[inline(always)]
    unsafe fn set_head(&self, head: usize) {
        // SAFETY: only the owner touches `head`, and the caller is the owner.
        self.head.with_mut(|h| unsafe { *h = head })
    }

    /// Takes the node a push put into `first` (the list's start after the tail was null), or
    /// `None` if there is none yet: nothing is queued, or a push replaced the null tail and has not
    /// stored `first` yet.
    ///
    /// # Safety
    /// The caller owns the chain and `head` is 0 (everything before `first` was popped).
    unsafe fn take_first(&self) -> Option<NonNull<Link>> {
        let first = NonNull::new(self.first.load(Ordering::Acquire))?;
        // Cleared before the pops that lead to the next swing (module docs: `first` is never
        // overwritten unread).
        self.first.store(ptr::null_mut(), Ordering::Relaxed);
        Some(first)
    }

    /// What follows `node` (the oldest queued node, being popped): `Some(next)`, or `Some(null)`
    /// if `node` was the tail, which this call then swings out so that no push can link behind
    /// it; `None` if a push replaced `node` as the tail but has not linked it yet.
    ///
    /// # Safety
    /// The caller owns the chain and `node` is its oldest queued node.
    unsafe fn successor(&self, node: NonNull<Link>) -> Option<*mut Link> {
        // SAFETY: `node` is queued, so it is live; only the push that replaced it as the tail
        // writes its `next`, and that store is atomic.
        let link = unsafe { node.as_ref() };
        let next = link.next.load(Ordering::Acquire);
        if !next.is_null() {
            return Some(next);
        }
        let tail = node.as_ptr() as usize | ACTIVE;
        match self
            .state
            .compare_exchange(tail, ACTIVE, Ordering::Release, Ordering::Relaxed)
        {
            Ok(_) => Some(ptr::null_mut()),
            // A push replaced `node` as the tail in between: its link may have landed since.
            Err(_) => NonNull::new(link.next.load(Ordering::Acquire)).map(NonNull::as_ptr),
        }
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
        // `head` holds what follows `node` now: its successor, the node a later `peek` took from
        // `first`, or 0 if the list goes on at `first` after it.
        // SAFETY: the caller owns the chain, and no push writes `node.next` any more (its pop
        // found its successor or swung it out of the tail).
        unsafe {
            let head = self.head();
            debug_assert_eq!(
                head & THEN_FIRST,
                0,
                "unpop of a node that was not popped last"
            );
            if head == 0 {
                self.set_head(link.as_ptr() as usize | THEN_FIRST);
            } else {
                Link::set_next(link, head as *mut Link);
                self.set_head(link.as_ptr() as usize);
            }
        }
    }

    /// Pops the oldest node and tells whether it is superseded under keep-latest coalescing: a
    /// node for which `is_coalescing` is true is superseded when the next node queued after it is
    /// coalescing too. "Next" means the next push whose link was visible at the check; a push
    /// that comes later (or is still between its two steps) finds this node already started.
    /// Returns `None` where [`pop`](Self::pop) does. Wait-free apart from `is_coalescing`.
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
        // SAFETY: the caller owns the chain, hence `head`. (A non-zero `head` is a queued node.)
        if unsafe { self.head() } != 0 {
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

    /// Takes the baton of an idle chain with nothing queued: `CAS(0 -> ACTIVE)`. Returns `true` if
    /// this call made the caller the chain's owner (as an activating push would, but with the
    /// chain empty); `false` if the chain is owned, non-empty or retired. While the caller holds
    /// the baton, pushes queue behind it and the chain cannot be retired; the caller gives it up
    /// as any owner does ([`try_release`](Chain::try_release), or by handing the chain to a
    /// worker). Wait-free.
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode, Pushed};
    /// let chain: Chain<BoxNode<u8>> = Chain::new();
    /// assert!(chain.try_claim());
    /// assert!(!chain.try_claim()); // owned
    /// assert!(!chain.try_retire()); // an owned chain stays live
    /// assert_eq!(chain.push_value(1), Ok(Pushed::Queued)); // queued behind the claim
    /// // SAFETY: the claim made us the owner.
    /// unsafe {
    ///     assert_eq!(chain.pop_value(), Some(1));
    ///     assert!(chain.try_release());
    /// }
    /// ```
    #[must_use = "if the claim succeeded the caller owns the chain"]
    pub fn try_claim(&self) -> bool {
        self.state
            .compare_exchange(0, ACTIVE, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// The owner retires its empty chain without giving it up first: `CAS(ACTIVE -> RETIRED)`,
    /// so that nothing can be pushed between the owner's last look and the retire (a release
    /// followed by [`try_retire`](Chain::try_retire) leaves that window open). Returns `true` if
    /// the chain is retired (the baton is gone; the caller unlinks and frees it); `false` if a
    /// node is queued, and the caller still owns the chain. Wait-free.
    ///
    /// ```
    /// # use keyserial_core::chain::{Chain, BoxNode, Retired};
    /// let chain: Chain<BoxNode<u8>> = Chain::new();
    /// assert!(chain.try_claim());
    /// // SAFETY: the claim made us the owner.
    /// assert!(unsafe { chain.try_retire_owned() });
    /// assert_eq!(chain.push_value(1), Err(Retired(1)));
    /// ```
    ///
    /// # Safety
    /// The caller owns the chain (holds its `ACTIVE` baton).
    #[must_use = "a retired chain must be unlinked and freed by the caller"]
    pub unsafe fn try_retire_owned(&self) -> bool {
        // SAFETY: the caller owns the chain, hence `head`.
        if unsafe { self.head() } != 0 {
            return false;
        }
        self.state
            .compare_exchange(ACTIVE, RETIRED, Ordering::AcqRel, Ordering::Relaxed)
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

    /// `true` if `node` is the chain's tail: the most recent push, so that nothing was pushed
    /// after it, and not popped yet (the owner pops the tail only after swinging it out). A node
    /// the owner has only peeked at still counts. A snapshot; only addresses are compared, `node`
    /// is not read. A coalescing submitter uses this to tell that a queued node
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
        // The list runs from `head`, and from `first` if `head` is 0 or marked `THEN_FIRST`
        // (otherwise `first` is null). Every push has returned, so every link is written.
        let head = self.head.with_mut(|h| {
            // SAFETY: `&mut self` gives exclusive access to the owner's cell.
            unsafe { *h }
        });
        let first = self.first.load(Ordering::Relaxed);
        for start in [(head & !THEN_FIRST) as *mut Link, first] {
            let mut cur = start;
            while let Some(node) = NonNull::new(cur) {
                // SAFETY: exclusive access (`&mut self`); each node is visited once (a `THEN_FIRST`
                // node's `next` is null) and never used by the chain again.
                unsafe {
                    cur = Link::next(node);
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
            let _ = c.push_value(2); // queued while we own the chain
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
        unsafe { assert!(c.peek().is_some()) }; // takes `first` into the owner's cursor
        for _ in 0..2 {
            let _ = c.push_value(token.clone()); // and two more are linked behind
        }
        assert_eq!(Arc::strong_count(&token), 6);
        drop(c);
        assert_eq!(Arc::strong_count(&token), 1);
    }

    #[test]
    fn unpop_of_the_last_node_keeps_it_before_later_pushes() {
        let c: Chain<BoxNode<u32>> = Chain::new();
        let _ = c.push_value(1);
        // SAFETY: this test thread made the push that activated the chain, so it owns the chain;
        // the un-popped node is the one just popped.
        unsafe {
            let one = c.pop().unwrap(); // the tail: the pop swings it out
            assert_eq!(c.push_value(2), Ok(Pushed::Queued)); // goes to `first`
            c.unpop(one);
            assert!(!c.try_release());
            assert_eq!(c.pop_value(), Some(1));
            let two = c.pop().unwrap();
            c.unpop(two); // followed by its successor link this time
            assert_eq!(c.push_value(3), Ok(Pushed::Queued));
            assert_eq!(c.pop_value(), Some(2));
            assert_eq!(c.pop_value(), Some(3));
            assert_eq!(c.pop_value(), None);
            assert!(c.try_release());
        }
    }

    #[test]
    fn unpop_after_a_peek_took_first_keeps_both_nodes_in_order() {
        let c: Chain<BoxNode<(bool, u32)>> = Chain::new();
        // SAFETY: called only on nodes queued in a chain this test owns.
        let latest = |n: NonNull<BoxNode<(bool, u32)>>| unsafe { n.as_ref() }.value.0;
        let _ = c.push_value((false, 1));
        // SAFETY: this test thread activated the chain; each un-popped node is the one just popped.
        unsafe {
            let one = c.pop().unwrap(); // swung out of the tail
            let _ = c.push_value((false, 2)); // goes to `first`
            assert!(c.peek().is_some()); // takes `first` into the cursor
            c.unpop(one);
            assert_eq!(c.pop_value(), Some((false, 1)));
            assert_eq!(c.pop_value(), Some((false, 2)));
            assert_eq!(c.pop_value(), None);
            assert!(c.try_release());
            // The same through the coalescing pop, whose check peeks.
            let _ = c.push_value((true, 3));
            let three = c.pop().unwrap();
            let _ = c.push_value((false, 4));
            c.unpop(three);
            let p = c.pop_coalescing(latest).unwrap(); // peeks 4 while deciding
            assert!(!p.superseded);
            c.unpop(p.node);
            assert_eq!(c.pop_value(), Some((true, 3)));
            assert_eq!(c.pop_value(), Some((false, 4)));
            assert!(c.try_release());
        }
    }

    #[test]
    fn drop_frees_an_unpopped_node_and_what_follows_it() {
        let token = Arc::new(());
        let c: Chain<BoxNode<Arc<()>>> = Chain::new();
        let _ = c.push_value(token.clone());
        // SAFETY: this test thread activated the chain; the un-popped node is the one just popped.
        unsafe {
            let n = c.pop().unwrap();
            let _ = c.push_value(token.clone());
            let _ = c.push_value(token.clone());
            c.unpop(n);
        }
        assert_eq!(Arc::strong_count(&token), 4);
        drop(c);
        assert_eq!(Arc::strong_count(&token), 1);
    }

    #[test]
    fn is_newest_holds_until_the_tail_is_popped() {
        let c: Chain<BoxNode<u8>> = Chain::new();
        let a = BoxNode::new(1);
        // SAFETY: a fresh node, owned by the chain from now on; this thread activates the chain.
        unsafe {
            let _ = c.push(a);
            assert!(c.is_newest(a.as_ref()));
            assert_eq!(c.peek(), Some(a)); // looked at, not popped: still the newest push
            assert!(c.is_newest(a.as_ref()));
            let popped = c.pop().unwrap();
            assert!(!c.is_newest(popped.as_ref()));
            BoxNode::into_value(popped);
            assert!(c.try_release());
        }
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
            let _ = c.push_value((true, 2)); // pushed before 1 starts
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
