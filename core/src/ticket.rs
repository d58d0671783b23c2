//! Per-key order for tasks that reach their key's chain through a shared queue: a key's
//! [`Tickets`] number its tasks at submission, and a [`TicketChain`] lets its owner run them in
//! ticket order whatever order they arrive in.
//!
//! **A building block**, for an executor whose tasks travel in submission order through one
//! shared queue (so that workers read memory in the order it was written) and only then join
//! their key's chain. Two workers can take two tasks of one key from that queue and push them in
//! either order; the tickets put them back in submission order. The owner methods are `unsafe`
//! for the same reason as [`Chain`]'s: only the holder of the chain's `ACTIVE` baton may call them.
//!
//! # Tickets
//!
//! [`Tickets`] is one word, `(issued << 1) | CLOSED`, changed only by CAS:
//!
//! | operation | who | transition | on failure |
//! |---|---|---|---|
//! | [`issue`](Tickets::issue) | a submitter | `n << 1 -> (n + 1) << 1`, returns ticket `n` | retry; on `CLOSED` returns [`Closed`] |
//! | `try_close` (inside [`TicketChain::try_retire`]) | a retirer | `s << 1 -> s << 1 \| CLOSED` | a ticket was issued since: nothing happens |
//! | `reopen` (inside [`TicketChain::try_retire`]) | the retirer that closed it | `s << 1 \| CLOSED -> s << 1` | — |
//!
//! Tickets wrap around at 2^(usize bits - 1); only equality of tickets (and distance from the due
//! one) is ever used, so fewer than that many tasks of one key in flight at once is all it takes.
//!
//! # Ticket order
//!
//! The owner of a [`TicketChain`] keeps `serving` (the ticket due next) and an *early* list (nodes
//! that arrived before their turn, sorted by ticket, linked through their own [`Link`]s, which
//! are free once the owner has popped them). [`pop`](TicketChain::pop) returns the early head if
//! its ticket is due, else pops the chain: a due node is returned, any other is parked in the early
//! list, and so on until the chain is empty. [`advance`](TicketChain::advance) moves `serving` on
//! once the due node ran. Both fields belong to whoever holds `ACTIVE`, exactly like the chain's
//! owner cursor: the chain's release/acquire hands them to the next owner.
//!
//! An owner may release the chain while early nodes wait. That is safe: a node waits only for a
//! ticket that was issued and has not arrived yet; the node of that ticket is on its way (in the
//! shared queue or being pushed), and its push either lands before the owner's release (which then
//! fails, and the owner pops it) or after it (then it activates the chain, and the new owner finds
//! the early list). So every node runs, once, in ticket order.
//!
//! # Retiring a key
//!
//! A key whose tasks travel through a shared queue may look idle (chain idle) while a task of it
//! is still on its way. [`TicketChain::try_retire`] therefore retires only when every issued ticket
//! was served:
//!
//! 1. the chain is idle (a fast path: it spares closing the counter, which makes submitters
//!    wait, while an owner holds the chain; correctness rests on steps 3 and 4);
//! 2. read `serving` = `s`;
//! 3. `try_close(s)`: succeeds only if exactly `s` tickets were issued. `serving` never exceeds
//!    `issued`, so then all of them ran: nothing is queued, parked or on its way, and from now
//!    on nothing can be issued;
//! 4. retire the chain (`0 -> RETIRED`). This fails only if an owner still holds it (the one that
//!    served the last ticket and has not released yet, seen idle in step 1 before it activated
//!    again, which needs a ticket from before step 3): then `reopen` and report failure.
//!
//! Between steps 3 and 4 [`issue`](Tickets::issue) returns [`Closed`]. A submitter that gets it
//! looks its key up again: if the key's chain is retired it finds (or makes) a fresh entry,
//! otherwise the retire is in flight or was undone and it backs off and tries again. So a submit
//! can wait for a retirer that is descheduled between those two steps, which the ticket-free
//! [`Chain`] never makes a push do; a submitter must not help by retiring the chain itself (the
//! retirer would then reopen a retired key). Neither type can be reset for reuse in fixed
//! storage (there is no `revive`).
//!
//! # Memory ordering
//!
//! | step | ordering | why |
//! |---|---|---|
//! | `issue` CAS | `AcqRel` | more than needed: the protocol uses only the exact value of the word (a close succeeds only on an unchanged count); the node itself is published by the caller's queue and the chain push |
//! | `advance` store / `try_retire`'s load of `serving` | `Release` / `Acquire` | also more than needed (correctness rests on the exact close); it lets a retirer that sees a count see the runs behind it |
//! | `try_close` CAS | `AcqRel` | orders the close against every issue on the word |
//! | `reopen` | `Release` | the word returns to exactly its value before the close (nobody could issue or close meanwhile) |
//! | the early list and `serving` between owners | the chain's own release/acquire | exactly as the chain's owner cursor |
//!
//! Loom models: `loom/tests/ticket.rs` (a review's mutation runs showed that they catch a close
//! that ignores `serving`, a missing `reopen`, retiring the chain before closing, popping in
//! arrival order, and serving an early node that is not due).

use core::fmt;
use core::ptr::{self, NonNull};

use crate::chain::{Chain, Link, Linked, Pushed, Retired};
use crate::sync::{AtomicUsize, Ordering, UnsafeCell};

const CLOSED: usize = 1;
const ONE: usize = 2;

/// What [`Tickets::issue`] returns while the key is being retired.
///
/// ```
/// use keyserial_core::ticket::Closed;
/// let c = Closed;
/// assert_eq!(format!("{c:?}"), "Closed");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Closed;

/// A key's ticket counter (see the [module documentation](self)).
///
/// ```
/// use keyserial_core::ticket::Tickets;
/// let t = Tickets::new();
/// assert_eq!(t.issue(), Ok(0));
/// assert_eq!(t.issue(), Ok(1));
/// assert_eq!(t.issued(), 2);
/// ```
pub struct Tickets {
    word: AtomicUsize,
}

impl Default for Tickets {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Tickets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tickets")
            .field("issued", &self.issued())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Tickets {
    /// No ticket issued yet.
    ///
    /// ```
    /// assert_eq!(keyserial_core::ticket::Tickets::new().issued(), 0);
    /// ```
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Tickets {
            word: AtomicUsize::new(0),
        }
    }

    /// No ticket issued yet.
    #[cfg(loom)]
    pub fn new() -> Self {
        Tickets {
            word: AtomicUsize::new(0),
        }
    }

    /// The next ticket of the key, or [`Closed`] while the key is being retired. Lock-free while
    /// open; a caller that gets [`Closed`] while the chain is not yet retired waits for the retirer
    /// (two steps, see "Retiring a key" in the module docs) and should back off and retry.
    ///
    /// ```
    /// let t = keyserial_core::ticket::Tickets::new();
    /// assert_eq!(t.issue(), Ok(0));
    /// ```
    pub fn issue(&self) -> Result<usize, Closed> {
        let mut cur = self.word.load(Ordering::Relaxed);
        loop {
            if cur & CLOSED != 0 {
                return Err(Closed);
            }
            // Only the exact value matters to the protocol (a close succeeds only on an unchanged
            // count); nothing is published through this word, the node travels through the
            // caller's queue. AcqRel is more than that needs, and is what the loom models check.
            match self.word.compare_exchange_weak(
                cur,
                cur.wrapping_add(ONE),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(cur >> 1),
                Err(actual) => cur = actual,
            }
        }
    }

    /// How many tickets were issued (modulo 2^(usize bits - 1)).
    ///
    /// ```
    /// let t = keyserial_core::ticket::Tickets::new();
    /// let _ = t.issue();
    /// assert_eq!(t.issued(), 1);
    /// ```
    pub fn issued(&self) -> usize {
        self.word.load(Ordering::Acquire) >> 1
    }

    /// `true` while the key is being retired (or after it was).
    ///
    /// ```
    /// let t = keyserial_core::ticket::Tickets::new();
    /// assert!(!t.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.word.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Closes the counter if exactly `served` tickets were issued. Used by
    /// [`TicketChain::try_retire`]; whoever closed it may [`reopen`](Self::reopen) it.
    fn try_close(&self, served: usize) -> bool {
        let open = (served << 1) & !CLOSED;
        self.word
            .compare_exchange(open, open | CLOSED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Undoes this thread's [`try_close`](Self::try_close).
    fn reopen(&self) {
        let prev = self.word.fetch_and(!CLOSED, Ordering::Release);
        debug_assert!(prev & CLOSED != 0, "reopen of an open counter");
    }
}

/// A node that carries the ticket it was issued.
///
/// # Safety
/// [`ticket`](Ticketed::ticket) returns the same value for a node every time it is called while
/// the node is queued or owned by a chain's owner, and reading it does not touch the node's
/// [`Link`].
///
/// ```
/// use core::ptr::NonNull;
/// use keyserial_core::chain::{Link, Linked};
/// use keyserial_core::ticket::Ticketed;
///
/// #[repr(C)]
/// struct Job { link: Link, ticket: usize }
/// // SAFETY: `link` is the first field of a `repr(C)` struct, so the casts are exact inverses.
/// unsafe impl Linked for Job {
///     fn link(node: NonNull<Self>) -> NonNull<Link> { node.cast() }
///     unsafe fn from_link(link: NonNull<Link>) -> NonNull<Self> { link.cast() }
/// }
/// // SAFETY: the ticket is written before the node is queued and never changed.
/// unsafe impl Ticketed for Job {
///     unsafe fn ticket(node: NonNull<Self>) -> usize {
///         // SAFETY: the caller may read the node (our contract).
///         unsafe { node.as_ref() }.ticket
///     }
/// }
/// ```
pub unsafe trait Ticketed: Linked {
    /// The node's ticket.
    ///
    /// # Safety
    /// `node` is live and the caller may read it: it owns it, or it is queued on a chain the
    /// caller owns.
    unsafe fn ticket(node: NonNull<Self>) -> usize;
}

/// A [`Chain`] whose owner takes nodes in ticket order (see the [module documentation](self)).
///
/// ```
/// use keyserial_core::chain::{BoxNode, Pushed};
/// use keyserial_core::ticket::{TicketChain, Tickets};
///
/// // BoxNode<usize> carries its ticket as its value (see `Ticketed`'s impl for it).
/// let tickets = Tickets::new();
/// let chain: TicketChain<BoxNode<usize>> = TicketChain::new();
/// let (a, b) = (tickets.issue().unwrap(), tickets.issue().unwrap());
/// // Ticket 1 arrives first: it activates the chain, but it is not due yet.
/// // SAFETY: fresh heap nodes, each pushed once; popped nodes are freed with `into_value`.
/// unsafe {
///     assert_eq!(chain.push(BoxNode::new(b)), Ok(Pushed::Activated));
///     assert_eq!(chain.pop(), None); // parked: ticket 0 is due
///     assert_eq!(chain.push(BoxNode::new(a)), Ok(Pushed::Queued));
///     for due in [a, b] {
///         let node = chain.pop().unwrap();
///         assert_eq!(BoxNode::into_value(node), due);
///         chain.advance();
///     }
///     assert!(chain.try_release());
/// }
/// assert!(chain.try_retire(&tickets));
/// ```
pub struct TicketChain<N: Ticketed> {
    chain: Chain<N>,
    /// The ticket due next. Written only by the owner (release), read by retirers (acquire).
    serving: AtomicUsize,
    /// Nodes that arrived before their turn, sorted by ticket; touched only by the owner.
    early: UnsafeCell<*mut Link>,
}

// SAFETY: as for `Chain`: nodes move between threads whole, which is sound when they are Send.
unsafe impl<N: Ticketed + Send> Send for TicketChain<N> {}
// SAFETY: shared access goes through atomics; `early` is touched only by the chain's owner.
unsafe impl<N: Ticketed + Send> Sync for TicketChain<N> {}

impl<N: Ticketed> Default for TicketChain<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<N: Ticketed> fmt::Debug for TicketChain<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TicketChain")
            .field("chain", &self.chain)
            .field("serving", &self.serving())
            .finish()
    }
}

impl<N: Ticketed> TicketChain<N> {
    /// An idle chain serving ticket 0.
    ///
    /// ```
    /// # use keyserial_core::{chain::BoxNode, ticket::TicketChain};
    /// let c: TicketChain<BoxNode<usize>> = TicketChain::new();
    /// assert_eq!(c.serving(), 0);
    /// ```
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        TicketChain {
            chain: Chain::new(),
            serving: AtomicUsize::new(0),
            early: UnsafeCell::new(ptr::null_mut()),
        }
    }

    /// An idle chain serving ticket 0.
    #[cfg(loom)]
    pub fn new() -> Self {
        TicketChain {
            chain: Chain::new(),
            serving: AtomicUsize::new(0),
            early: UnsafeCell::new(ptr::null_mut()),
        }
    }

    /// `true` if nobody owns the chain and nothing is queued on it (nodes may still be parked
    /// early, or on their way: see [`try_retire`](Self::try_retire) for when a key is done).
    ///
    /// ```
    /// # use keyserial_core::{chain::BoxNode, ticket::TicketChain};
    /// let c: TicketChain<BoxNode<usize>> = TicketChain::new();
    /// assert!(c.is_idle());
    /// ```
    pub fn is_idle(&self) -> bool {
        self.chain.is_idle()
    }

    /// `true` once the chain is retired (pushes are handed back).
    ///
    /// ```
    /// # use keyserial_core::{chain::BoxNode, ticket::{TicketChain, Tickets}};
    /// let c: TicketChain<BoxNode<usize>> = TicketChain::new();
    /// assert!(c.try_retire(&Tickets::new()));
    /// assert!(c.is_retired());
    /// ```
    pub fn is_retired(&self) -> bool {
        self.chain.is_retired()
    }

    /// The ticket due next.
    ///
    /// ```
    /// # use keyserial_core::{chain::BoxNode, ticket::TicketChain};
    /// let c: TicketChain<BoxNode<usize>> = TicketChain::new();
    /// assert_eq!(c.serving(), 0);
    /// ```
    pub fn serving(&self) -> usize {
        self.serving.load(Ordering::Acquire)
    }

    /// Appends `node`, exactly as [`Chain::push`] (same result, same hand-back on a retired
    /// chain). Lock-free.
    ///
    /// # Safety
    /// As for [`Chain::push`]; in addition `node`'s ticket was issued by the key's [`Tickets`]
    /// and no other node with that ticket is ever pushed.
    ///
    /// ```
    /// # use keyserial_core::{chain::{BoxNode, Pushed}, ticket::TicketChain};
    /// let c: TicketChain<BoxNode<usize>> = TicketChain::new();
    /// // SAFETY: a fresh heap node with ticket 0, pushed once.
    /// assert_eq!(unsafe { c.push(BoxNode::new(0)) }, Ok(Pushed::Activated));
    /// # unsafe { keyserial_core::chain::BoxNode::into_value(c.pop().unwrap()); c.advance(); assert!(c.try_release()); }
    /// ```
    pub unsafe fn push(&self, node: NonNull<N>) -> Result<Pushed, Retired<NonNull<N>>> {
        // SAFETY: forwarded contract.
        unsafe { self.chain.push(node) }
    }

    /// The node whose ticket is due, if it has arrived; nodes that arrived early are parked until
    /// their turn. `None` means the due node is not here: the caller still owns the chain and
    /// should [`try_release`](Self::try_release) it (which also fails while the push of the
    /// chain's next node is half done: [`Chain::pop`](crate::chain::Chain::pop)). Wait-free
    /// apart from parking, which walks the early list (short: nodes arrive nearly in order).
    ///
    /// # Safety
    /// The caller owns the chain.
    ///
    /// ```
    /// # use keyserial_core::{chain::BoxNode, ticket::TicketChain};
    /// let c: TicketChain<BoxNode<usize>> = TicketChain::new();
    /// // SAFETY: fresh nodes, tickets 0 and 1, pushed once; the first push made us the owner.
    /// unsafe {
    ///     let _ = c.push(BoxNode::new(0)).unwrap();
    ///     let _ = c.push(BoxNode::new(1)).unwrap();
    ///     assert_eq!(BoxNode::into_value(c.pop().unwrap()), 0);
    ///     c.advance();
    ///     assert_eq!(BoxNode::into_value(c.pop().unwrap()), 1);
    ///     c.advance();
    ///     assert!(c.pop().is_none());
    ///     assert!(c.try_release());
    /// }
    /// ```
    pub unsafe fn pop(&self) -> Option<NonNull<N>> {
        let due = self.serving.load(Ordering::Relaxed);
        // SAFETY: the caller owns the chain, hence the early list and its nodes.
        unsafe {
            if let Some(head) = self.early_head() {
                if N::ticket(N::from_link(head)) == due {
                    self.set_early(Link::next(head));
                    return Some(N::from_link(head));
                }
            }
            loop {
                let node = self.chain.pop()?;
                let ticket = N::ticket(node);
                if ticket == due {
                    return Some(node);
                }
                self.park(node, ticket, due);
            }
        }
    }

    /// Puts back the node the owner just popped and did not run (it is due, so it is popped
    /// first again). Wait-free.
    ///
    /// # Safety
    /// The caller owns the chain, and `node` is the node it most recently popped and has not
    /// [`advance`](Self::advance)d past.
    ///
    /// ```
    /// # use keyserial_core::{chain::BoxNode, ticket::TicketChain};
    /// let c: TicketChain<BoxNode<usize>> = TicketChain::new();
    /// // SAFETY: a fresh node with ticket 0; we own the chain after its push.
    /// unsafe {
    ///     let _ = c.push(BoxNode::new(0)).unwrap();
    ///     let n = c.pop().unwrap();
    ///     c.unpop(n);
    ///     assert_eq!(c.pop(), Some(n));
    ///     BoxNode::into_value(n);
    ///     c.advance();
    ///     assert!(c.try_release());
    /// }
    /// ```
    pub unsafe fn unpop(&self, node: NonNull<N>) {
        // SAFETY: the caller owns the chain and the node; the node's link is free.
        unsafe {
            debug_assert_eq!(N::ticket(node), self.serving.load(Ordering::Relaxed));
            let link = N::link(node);
            Link::set_next(
                link,
                self.early_head().map_or(ptr::null_mut(), NonNull::as_ptr),
            );
            self.set_early(link.as_ptr());
        }
    }

    /// The due node ran (or was disposed of): the next ticket is due. Wait-free.
    ///
    /// # Safety
    /// The caller owns the chain and has just taken the due node from [`pop`](Self::pop).
    ///
    /// ```
    /// # use keyserial_core::{chain::BoxNode, ticket::TicketChain};
    /// let c: TicketChain<BoxNode<usize>> = TicketChain::new();
    /// // SAFETY: a fresh node with ticket 0; we own the chain after its push.
    /// unsafe {
    ///     let _ = c.push(BoxNode::new(0)).unwrap();
    ///     BoxNode::into_value(c.pop().unwrap());
    ///     c.advance();
    ///     assert!(c.try_release());
    /// }
    /// assert_eq!(c.serving(), 1);
    /// ```
    pub unsafe fn advance(&self) {
        let due = self.serving.load(Ordering::Relaxed);
        // Release: a retirer that reads the new value (after the chain's release) sees the run.
        self.serving
            .store(due.wrapping_add(1) & (usize::MAX >> 1), Ordering::Release);
    }

    /// Gives up ownership if nothing was pushed meanwhile, exactly as [`Chain::try_release`];
    /// early nodes may stay parked (their predecessor is on its way and will activate the chain).
    /// Refuses (returns `false`, still the owner) while the due node is parked, as after
    /// [`unpop`](Self::unpop).
    ///
    /// # Safety
    /// The caller owns the chain, and [`pop`](Self::pop) has just returned `None`.
    ///
    /// ```
    /// # use keyserial_core::{chain::BoxNode, ticket::TicketChain};
    /// let c: TicketChain<BoxNode<usize>> = TicketChain::new();
    /// // SAFETY: ticket 1 arrives alone and activates the chain, which this thread then owns.
    /// unsafe {
    ///     let _ = c.push(BoxNode::new(1)).unwrap();
    ///     assert!(c.pop().is_none()); // ticket 0 is due and not here
    ///     assert!(c.try_release()); // released with ticket 1 parked
    /// }
    /// # unsafe { let _ = c.push(BoxNode::new(0)).unwrap(); for _ in 0..2 { BoxNode::into_value(c.pop().unwrap()); c.advance(); } assert!(c.try_release()); }
    /// ```
    pub unsafe fn try_release(&self) -> bool {
        // A due node parked by `unpop` must be popped first: releasing over it would leave the key
        // waiting for a ticket that is already here.
        // SAFETY: the caller owns the chain, hence the early list.
        if let Some(head) = unsafe { self.early_head() } {
            // SAFETY: as above; parked nodes are the owner's.
            let due = unsafe { N::ticket(N::from_link(head)) };
            if due == self.serving.load(Ordering::Relaxed) {
                return false;
            }
        }
        // SAFETY: forwarded contract.
        unsafe { self.chain.try_release() }
    }

    /// Retires the key if it is idle and every ticket issued by `tickets` was served (see
    /// "Retiring a key" in the module docs); afterwards `tickets` stays closed and pushes fail.
    /// Wait-free.
    ///
    /// `tickets` must be the counter that numbers this chain's nodes.
    ///
    /// ```
    /// # use keyserial_core::{chain::BoxNode, ticket::{Closed, TicketChain, Tickets}};
    /// let tickets = Tickets::new();
    /// let c: TicketChain<BoxNode<usize>> = TicketChain::new();
    /// let t = tickets.issue().unwrap();
    /// assert!(!c.try_retire(&tickets)); // ticket 0 is on its way
    /// // SAFETY: ticket 0's node, pushed once; we own the chain after the push.
    /// unsafe {
    ///     let _ = c.push(BoxNode::new(t)).unwrap();
    ///     BoxNode::into_value(c.pop().unwrap());
    ///     c.advance();
    ///     assert!(c.try_release());
    /// }
    /// assert!(c.try_retire(&tickets));
    /// assert_eq!(tickets.issue(), Err(Closed));
    /// ```
    pub fn try_retire(&self, tickets: &Tickets) -> bool {
        if !self.chain.is_idle() {
            return false;
        }
        let served = self.serving.load(Ordering::Acquire);
        if !tickets.try_close(served) {
            return false;
        }
        if self.chain.try_retire() {
            return true;
        }
        tickets.reopen();
        false
    }

    /// # Safety
    /// The caller owns the chain.
    unsafe fn early_head(&self) -> Option<NonNull<Link>> {
        // SAFETY: only the owner touches `early`.
        NonNull::new(self.early.with(|e| unsafe { *e }))
    }

    /// # Safety
    /// The caller owns the chain.
    unsafe fn set_early(&self, head: *mut Link) {
        // SAFETY: only the owner touches `early`.
        self.early.with_mut(|e| unsafe { *e = head });
    }

    /// Inserts `node` (not due: `ticket` is later than `due`) into the early list, sorted by
    /// distance from `due`.
    ///
    /// # Safety
    /// The caller owns the chain and `node`.
    unsafe fn park(&self, node: NonNull<N>, ticket: usize, due: usize) {
        let dist = |t: usize| t.wrapping_sub(due) & (usize::MAX >> 1);
        let d = dist(ticket);
        let link = N::link(node);
        // SAFETY: the owner owns every node of the early list and the new node.
        unsafe {
            let mut prev: Option<NonNull<Link>> = None;
            let mut cur = self.early_head();
            while let Some(c) = cur {
                if dist(N::ticket(N::from_link(c))) > d {
                    break;
                }
                prev = Some(c);
                cur = NonNull::new(Link::next(c));
            }
            Link::set_next(link, cur.map_or(ptr::null_mut(), NonNull::as_ptr));
            match prev {
                None => self.set_early(link.as_ptr()),
                Some(p) => Link::set_next(p, link.as_ptr()),
            }
        }
    }
}

impl<N: Ticketed> Drop for TicketChain<N> {
    fn drop(&mut self) {
        // `&mut self`: every parked node is ours. (The chain drops its own queued nodes.)
        let mut head = self.early.with_mut(|e| {
            // SAFETY: exclusive access.
            unsafe { core::mem::replace(&mut *e, ptr::null_mut()) }
        });
        while let Some(link) = NonNull::new(head) {
            // SAFETY: exclusive access; each parked node is visited once and never used again.
            unsafe {
                head = Link::next(link);
                N::drop_queued(N::from_link(link));
            }
        }
    }
}

#[cfg(feature = "alloc")]
// SAFETY: a `BoxNode<usize>`'s value is its ticket, written before it is queued and never changed;
// reading it does not touch the link.
unsafe impl Ticketed for crate::chain::BoxNode<usize> {
    unsafe fn ticket(node: NonNull<Self>) -> usize {
        // SAFETY: the caller may read the node (trait contract).
        unsafe { node.as_ref() }.value
    }
}

#[cfg(all(test, feature = "alloc"))]
mod tests {
    use super::*;
    use crate::chain::BoxNode;
    use std::vec::Vec;

    type C = TicketChain<BoxNode<usize>>;

    /// Owner loop: pops in ticket order, records, advances; releases when the due ticket is
    /// missing. Returns what ran.
    ///
    /// # Safety
    /// The caller owns the chain.
    unsafe fn drain(c: &C) -> Vec<usize> {
        let mut ran = Vec::new();
        loop {
            // SAFETY: we own the chain; popped nodes are heap nodes we free here.
            unsafe {
                while let Some(n) = c.pop() {
                    ran.push(BoxNode::into_value(n));
                    c.advance();
                }
                if c.try_release() {
                    return ran;
                }
            }
        }
    }

    #[test]
    fn every_arrival_order_of_five_runs_in_ticket_order() {
        // All 120 orders of 5 tickets; each push that activates drains.
        let mut perm: Vec<usize> = (0..5).collect();
        let mut count = 0;
        loop {
            let tickets = Tickets::new();
            let c = C::new();
            for _ in 0..5 {
                tickets.issue().unwrap();
            }
            let mut ran = Vec::new();
            for &t in &perm {
                // SAFETY: each ticket's node is pushed once; an activating push owns the chain.
                unsafe {
                    if c.push(BoxNode::new(t)).unwrap() == Pushed::Activated {
                        ran.extend(drain(&c));
                    }
                }
            }
            assert_eq!(ran, (0..5).collect::<Vec<_>>(), "arrival order {perm:?}");
            assert!(c.try_retire(&tickets));
            count += 1;
            // next permutation
            let Some(i) = (0..4).rev().find(|&i| perm[i] < perm[i + 1]) else {
                break;
            };
            let j = (i + 1..5).rev().find(|&j| perm[j] > perm[i]).unwrap();
            perm.swap(i, j);
            perm[i + 1..].reverse();
        }
        assert_eq!(count, 120);
    }

    #[test]
    fn retire_waits_for_tickets_on_their_way_and_closes_the_counter() {
        let tickets = Tickets::new();
        let c = C::new();
        assert!(c.try_retire(&Tickets::new()), "fresh and idle");
        let c = C::new();
        let t0 = tickets.issue().unwrap();
        assert!(!c.try_retire(&tickets), "ticket 0 is on its way");
        assert!(
            !tickets.is_closed(),
            "a failed retire leaves the counter open"
        );
        // SAFETY: ticket 0's node, pushed once; the push makes us the owner.
        unsafe {
            assert_eq!(c.push(BoxNode::new(t0)), Ok(Pushed::Activated));
            assert!(!c.try_retire(&tickets), "owned");
            assert!(!tickets.is_closed(), "reopened after the chain refused");
            assert_eq!(drain(&c), [0]);
        }
        assert!(c.try_retire(&tickets));
        assert_eq!(tickets.issue(), Err(Closed));
        // A retired chain hands pushes back.
        let n = BoxNode::new(7);
        // SAFETY: a fresh node, handed back untouched by the retired chain and freed here.
        match unsafe { c.push(n) } {
            Err(Retired(back)) => unsafe {
                BoxNode::into_value(back);
            },
            Ok(_) => panic!("pushed onto a retired chain"),
        }
    }

    #[test]
    fn retire_refuses_an_owned_chain_that_served_everything() {
        let tickets = Tickets::new();
        let c = C::new();
        let t = tickets.issue().unwrap();
        // SAFETY: ticket 0's node; the push makes us the owner.
        unsafe {
            assert_eq!(c.push(BoxNode::new(t)), Ok(Pushed::Activated));
            BoxNode::into_value(c.pop().unwrap());
            c.advance();
            // Everything served, but we still own it: no retire, counter still open.
            assert!(!c.try_retire(&tickets));
            assert_eq!(tickets.issue(), Ok(1));
            assert_eq!(c.push(BoxNode::new(1)), Ok(Pushed::Queued));
            assert_eq!(drain(&c), [1]);
        }
        assert!(c.try_retire(&tickets));
    }

    #[test]
    fn dropping_a_chain_frees_parked_and_queued_nodes() {
        // Miri's leak check is the assertion here.
        let c = C::new();
        // SAFETY: fresh nodes with tickets 2, 1, 3; the first push makes us the owner.
        unsafe {
            assert_eq!(c.push(BoxNode::new(2)), Ok(Pushed::Activated));
            assert!(c.pop().is_none());
            assert_eq!(c.push(BoxNode::new(1)), Ok(Pushed::Queued));
            assert!(c.pop().is_none());
            assert_eq!(c.push(BoxNode::new(3)), Ok(Pushed::Queued));
        }
        drop(c);
    }

    #[test]
    fn unpop_puts_the_due_node_first_again() {
        let c = C::new();
        // SAFETY: tickets 1 then 0 arrive; we own the chain after the first push.
        unsafe {
            assert_eq!(c.push(BoxNode::new(1)), Ok(Pushed::Activated));
            assert!(c.pop().is_none());
            assert_eq!(c.push(BoxNode::new(0)), Ok(Pushed::Queued));
            let n = c.pop().unwrap();
            assert_eq!(n.as_ref().value, 0);
            c.unpop(n);
            assert!(
                !c.try_release(),
                "the due node is parked: still ours to pop"
            );
            assert_eq!(c.pop(), Some(n));
            BoxNode::into_value(n);
            c.advance();
            assert_eq!(BoxNode::into_value(c.pop().unwrap()), 1);
            c.advance();
            assert!(c.try_release());
        }
    }

    #[test]
    fn tickets_wrap_around_without_losing_order() {
        let c = C::new();
        let start = (usize::MAX >> 1) - 1; // the last two tickets before wrapping to 0
        c.serving.store(start, Ordering::Relaxed);
        let order = [0usize, start + 1, start];
        // SAFETY: each node pushed once; the first push makes us the owner.
        unsafe {
            let mut ran = Vec::new();
            for t in order {
                if c.push(BoxNode::new(t)).unwrap() == Pushed::Activated {
                    ran.extend(drain(&c));
                }
            }
            assert!(c.is_idle());
            assert_eq!(ran, [start, start + 1, 0]);
        }
    }
}
