//! A **prototype of a proposed keyserial design**, not a baseline: tasks travel in one global
//! FIFO in submission order and per-key order is kept by tickets (BENCHMARKS.md, "Run F").
//!
//! Why it exists: profiles of keyserial's boxed-mode W2 show its workers spending about 40% of
//! their time walking each key's chain of task nodes, one dependent cache miss per node, because a
//! backlog makes them drain keys one after another (key-major) while tasks were submitted
//! round-robin. Hash-onto-lanes contenders read their queues in submission order, which the
//! hardware prefetcher streams. This row measures what keyserial would gain by consuming in
//! submission order too, with every other part as simple as possible:
//!
//! - **Submit**: find the key's entry in `keyserial_core`'s key table, take the key's next ticket
//!   ([`Tickets::issue`], on a cache line only submitters write), write a node (ticket, entry,
//!   task), push it onto one global crossbeam `Injector`, wake a parked worker if any. The
//!   submitter never touches the key's chain.
//! - **Worker**: take nodes from the global queue in batches of at most 4 (into its own deque,
//!   from which idle siblings steal) and push each onto its key's
//!   [`TicketChain`](keyserial_core::ticket::TicketChain): the push that activates the chain makes
//!   the worker its owner, which runs the key's nodes in ticket order (parking any that arrive
//!   early) and releases it; otherwise the owner runs the node.
//! - Each key's tasks run one at a time in ticket order, and tickets are taken in submission
//!   order: the compare program's order check verifies it on every run.
//!
//! Nodes come from keyserial-core's magazine caches (`recycle`), one block per task. Left out,
//! because it does not change the cost of the paths measured: key retirement (entries live as long
//! as the executor, so memory grows with the keys), a fairness budget, a bound.

use std::alloc::Layout;
use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_deque::{Injector, Steal, Stealer, Worker};
use crossbeam_utils::sync::{Parker, Unparker};
use crossbeam_utils::{Backoff, CachePadded};
use keyserial_core::chain::{Link, Linked, Pushed};
use keyserial_core::recycle::{Cache, Depot};
use keyserial_core::table::{Entry, Retire, Table};
use keyserial_core::ticket::{TicketChain, Ticketed, Tickets};

use crate::exec::{Completion, KeyedExecutor, StaticRef, Task};

/// A key's state: its ticket counter (written by submitters, on its own cache line) and its
/// chain (touched by workers).
struct KeyState {
    tickets: CachePadded<Tickets>,
    chain: TicketChain<Node>,
}

impl KeyState {
    fn new() -> Self {
        KeyState {
            tickets: CachePadded::new(Tickets::new()),
            chain: TicketChain::new(),
        }
    }
}

impl Retire for KeyState {
    fn is_retired(&self) -> bool {
        false // never retired: entries live as long as the table
    }
}

type Keys = Table<u64, KeyState, foldhash::fast::RandomState>;

/// One task on its way: its link, its key's ticket and entry, the task.
#[repr(C)]
struct Node {
    link: Link,
    ticket: usize,
    entry: StaticRef<Entry<u64, KeyState>>,
    task: Task,
}

// SAFETY: `link` is the first field of a `repr(C)` struct, so the casts are exact inverses.
unsafe impl Linked for Node {
    fn link(node: NonNull<Self>) -> NonNull<Link> {
        node.cast()
    }

    unsafe fn from_link(link: NonNull<Link>) -> NonNull<Self> {
        link.cast()
    }

    unsafe fn drop_queued(node: NonNull<Self>) {
        // SAFETY: the chain hands over a node it never uses again; it came from `alloc_node`.
        drop(unsafe { take_node(node) });
    }
}

// SAFETY: the ticket is written before the node is queued and never changed; reading it does not
// touch the link.
unsafe impl Ticketed for Node {
    unsafe fn ticket(node: NonNull<Self>) -> usize {
        // SAFETY: the caller may read the node (trait contract).
        unsafe { node.as_ref() }.ticket
    }
}

const NODE_DEPOT: usize = 64;
static NODES: Depot<NODE_DEPOT> = Depot::new(Layout::new::<Node>());

thread_local! {
    static CACHE: RefCell<Cache<'static, NODE_DEPOT>> = const { RefCell::new(Cache::new(&NODES)) };
}

fn alloc_node(node: Node) -> NonNull<Node> {
    let p = CACHE
        .try_with(|c| c.borrow_mut().alloc())
        .unwrap_or_else(|_| {
            // SAFETY: `Node` is not zero-sized.
            NonNull::new(unsafe { std::alloc::alloc(NODES.layout()) }).expect("out of memory")
        })
        .cast::<Node>();
    // SAFETY: a fresh block of the depot's layout (at least a `Node`, aligned for it).
    unsafe { p.as_ptr().write(node) };
    p
}

/// Moves the node's contents out and gives its block back.
///
/// # Safety
/// `node` came from [`alloc_node`], is owned by the caller, and is not used again.
unsafe fn take_node(node: NonNull<Node>) -> Node {
    // SAFETY: per the contract the node is live and ours.
    let value = unsafe { node.as_ptr().read() };
    let block = node.cast::<u8>();
    let freed = CACHE.try_with(|c| {
        // SAFETY: the block came from a cache over `NODES` (or the global allocator with its
        // layout) and is no longer used.
        unsafe { c.borrow_mut().free(block) }
    });
    if freed.is_err() {
        // SAFETY: as above, through the global allocator with the depot's layout.
        unsafe { std::alloc::dealloc(block.as_ptr(), NODES.layout()) };
    }
    value
}

/// A node pointer on its way through the queues.
struct Transit(NonNull<Node>);
// SAFETY: a node is owned by exactly one party at a time, and its task is Send.
unsafe impl Send for Transit {}

struct Shared {
    keys: Keys,
    global: Injector<Transit>,
    stealers: Vec<Stealer<Transit>>,
    unparkers: Vec<Unparker>,
    sleeping: CachePadded<AtomicUsize>,
    next_wake: AtomicUsize,
    stop: AtomicBool,
    done: Arc<Completion>,
}

/// The prototype executor (see the module docs).
pub struct FifoTickets {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl FifoTickets {
    /// Starts `workers` worker threads.
    pub fn new(workers: usize) -> Self {
        let workers = workers.max(1);
        let deques: Vec<Worker<Transit>> = (0..workers).map(|_| Worker::new_fifo()).collect();
        let parkers: Vec<Parker> = (0..workers).map(|_| Parker::new()).collect();
        let shared = Arc::new(Shared {
            keys: Table::with_hasher_and_collector(
                foldhash::fast::RandomState::default(),
                crossbeam_epoch::default_collector().clone(),
            ),
            global: Injector::new(),
            stealers: deques.iter().map(Worker::stealer).collect(),
            unparkers: parkers.iter().map(|p| p.unparker().clone()).collect(),
            sleeping: CachePadded::new(AtomicUsize::new(0)),
            next_wake: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            done: Arc::new(Completion::new()),
        });
        let threads = deques
            .into_iter()
            .zip(parkers)
            .enumerate()
            .map(|(i, (deque, parker))| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("fifo-tickets-{i}"))
                    .spawn(move || worker_loop(&s, i, &deque, &parker))
                    .expect("spawn worker")
            })
            .collect();
        FifoTickets { shared, threads }
    }
}

fn find(s: &Shared, index: usize, deque: &Worker<Transit>) -> Option<Transit> {
    if let Some(t) = deque.pop() {
        return Some(t);
    }
    loop {
        match s.global.steal_batch_with_limit_and_pop(deque, 4) {
            Steal::Success(t) => return Some(t),
            Steal::Retry => continue,
            Steal::Empty => break,
        }
    }
    let n = s.stealers.len();
    for k in 1..n {
        loop {
            match s.stealers[(index + k) % n].steal_batch_and_pop(deque) {
                Steal::Success(t) => return Some(t),
                Steal::Retry => continue,
                Steal::Empty => break,
            }
        }
    }
    None
}

fn has_work(s: &Shared) -> bool {
    !s.global.is_empty() || s.stealers.iter().any(|st| !st.is_empty())
}

fn worker_loop(s: &Shared, index: usize, deque: &Worker<Transit>, parker: &Parker) {
    let backoff = Backoff::new();
    loop {
        if let Some(Transit(node)) = find(s, index, deque) {
            backoff.reset();
            arrive(s, node);
            continue;
        }
        if s.stop.load(Ordering::Acquire) && !has_work(s) {
            return;
        }
        if !backoff.is_completed() {
            backoff.snooze();
            continue;
        }
        // Announce the sleep, then look once more: a submit either sees the count (and wakes
        // someone) or pushed before this last look (SeqCst on both sides).
        s.sleeping.fetch_add(1, Ordering::SeqCst);
        if !has_work(s) && !s.stop.load(Ordering::SeqCst) {
            parker.park_timeout(Duration::from_millis(50));
        }
        s.sleeping.fetch_sub(1, Ordering::SeqCst);
        backoff.reset();
    }
}

/// A node reached a worker: push it onto its key's chain; if that made us the owner, run the
/// key's nodes in ticket order and release it.
fn arrive(s: &Shared, node: NonNull<Node>) {
    // SAFETY: the node is ours until pushed; its entry lives as long as the table.
    let entry = unsafe { node.as_ref() }.entry;
    let chain = &entry.value().chain;
    // SAFETY: a node we own, with a ticket from its key's counter, pushed once; entries are never
    // retired here, so the push cannot bounce.
    match unsafe { chain.push(node) } {
        Ok(Pushed::Activated) => {}
        Ok(Pushed::Queued) => return,
        Err(_) => unreachable!("the prototype never retires a key"),
    }
    loop {
        // SAFETY: the activating push made us the owner; popped nodes are ours.
        unsafe {
            while let Some(n) = chain.pop() {
                let Node { task, .. } = take_node(n);
                task();
                s.done.completed();
                chain.advance();
            }
            if chain.try_release() {
                return;
            }
        }
    }
}

impl KeyedExecutor for FifoTickets {
    fn name(&self) -> String {
        "fifo_tickets".into()
    }

    #[inline]
    fn submit<F>(&self, key: u64, task: F)
    where
        F: FnOnce() + Send + 'static,
    {
        self.submit_boxed(key, Box::new(task));
    }

    #[inline]
    fn submit_boxed(&self, key: u64, task: Task) {
        let s = &*self.shared;
        s.done.submitted();
        let guard = crossbeam_epoch::pin();
        let entry = match s.keys.get(&key, &guard) {
            Some(e) => e,
            None => s.keys.get_or_insert_cloned(&key, KeyState::new, &guard),
        };
        let ticket = entry
            .value()
            .tickets
            .issue()
            .expect("the prototype never closes a key's tickets");
        // SAFETY: entries are never retired or unlinked, so each lives as long as the table,
        // which outlives every queued node (the workers drain the queues before `Drop` returns).
        let entry = unsafe { StaticRef::new(entry) };
        let node = alloc_node(Node {
            link: Link::new(),
            ticket,
            entry,
            task,
        });
        s.global.push(Transit(node));
        // The push's own stores are not SeqCst: the fence orders it before the load, against a
        // worker's SeqCst announcement followed by its last look (a Dekker pair).
        std::sync::atomic::fence(Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let n = s.unparkers.len();
            let i = s.next_wake.fetch_add(1, Ordering::Relaxed) % n;
            s.unparkers[i].unpark();
        }
    }

    fn wait_idle(&self, timeout: Duration) -> bool {
        self.shared.done.wait(timeout)
    }
}

impl Drop for FifoTickets {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for u in &self.shared.unparkers {
            u.unpark();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
