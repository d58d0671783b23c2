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
//! - **Submit**: find the key's entry in `keyserial_core`'s key table, take the next ticket of the
//!   key (`issued.fetch_add(1)`), push `(entry, ticket, task)` onto one global crossbeam
//!   `Injector`, wake a parked worker if any.
//! - **Worker**: take items from the global queue in batches of at most 4 (into its own deque,
//!   from which idle siblings steal), and for each item lock the key's small state: if the key is
//!   free and the ticket is the one it serves next, mark it busy and run the task; otherwise park
//!   the task in the key's state. After a task the worker serves the next ticket itself if it is
//!   parked, else frees the key.
//! - Each key's tasks run one at a time in ticket order, and tickets are taken in submission
//!   order: the compare program's order check verifies it on every run.
//!
//! Left out, because it does not change the cost of the paths measured: key retirement (entries
//! live as long as the executor, so W3's memory grows with its keys), a fairness budget, a bound.
//! The per-key state is a `Mutex` (two uncontended lock/unlock pairs per task, about the RMWs a
//! lock-free version would need).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_deque::{Injector, Steal, Stealer, Worker};
use crossbeam_utils::sync::{Parker, Unparker};
use crossbeam_utils::{Backoff, CachePadded};
use keyserial_core::table::{Entry, Retire, Table};

use crate::exec::{Completion, KeyedExecutor, StaticRef, Task};

/// A key's state. `issued` is written only by submitters, the rest only by workers: they sit on
/// separate cache lines.
struct KeyState {
    issued: CachePadded<AtomicU64>,
    turn: Mutex<Turn>,
}

#[derive(Default)]
struct Turn {
    /// The ticket allowed to start next.
    serving: u64,
    /// A task of the key is running.
    busy: bool,
    /// Tasks that arrived before their turn, by ticket.
    parked: BTreeMap<u64, Task>,
}

impl KeyState {
    fn new() -> Self {
        KeyState {
            issued: CachePadded::new(AtomicU64::new(0)),
            turn: Mutex::new(Turn::default()),
        }
    }
}

impl Retire for KeyState {
    fn is_retired(&self) -> bool {
        false // never retired: entries live as long as the table
    }
}

type Keys = Table<u64, KeyState, foldhash::fast::RandomState>;

/// One queued task: its key's entry (alive as long as the table), its ticket, the task.
struct Item {
    entry: StaticRef<Entry<u64, KeyState>>,
    ticket: u64,
    task: Task,
}

struct Shared {
    keys: Keys,
    global: Injector<Item>,
    stealers: Vec<Stealer<Item>>,
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
        let deques: Vec<Worker<Item>> = (0..workers).map(|_| Worker::new_fifo()).collect();
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

fn find(s: &Shared, index: usize, deque: &Worker<Item>) -> Option<Item> {
    if let Some(item) = deque.pop() {
        return Some(item);
    }
    loop {
        match s.global.steal_batch_with_limit_and_pop(deque, 4) {
            Steal::Success(item) => return Some(item),
            Steal::Retry => continue,
            Steal::Empty => break,
        }
    }
    let n = s.stealers.len();
    for k in 1..n {
        loop {
            match s.stealers[(index + k) % n].steal_batch_and_pop(deque) {
                Steal::Success(item) => return Some(item),
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

fn worker_loop(s: &Shared, index: usize, deque: &Worker<Item>, parker: &Parker) {
    let backoff = Backoff::new();
    loop {
        if let Some(item) = find(s, index, deque) {
            backoff.reset();
            run_item(s, item);
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

fn run_item(s: &Shared, item: Item) {
    let state = item.entry.value();
    {
        let mut turn = state.turn.lock().unwrap_or_else(|e| e.into_inner());
        if turn.busy || turn.serving != item.ticket {
            turn.parked.insert(item.ticket, item.task);
            return;
        }
        turn.busy = true;
    }
    let mut task = item.task;
    loop {
        task();
        s.done.completed();
        let mut turn = state.turn.lock().unwrap_or_else(|e| e.into_inner());
        turn.serving += 1;
        let next = turn.serving;
        match turn.parked.remove(&next) {
            Some(t) => task = t,
            None => {
                turn.busy = false;
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
        let ticket = entry.value().issued.fetch_add(1, Ordering::Relaxed);
        // SAFETY: entries are never retired or unlinked, so each lives as long as the table,
        // which outlives every queued item (the workers drain the queues before `Drop` returns).
        let entry = unsafe { StaticRef::new(entry) };
        s.global.push(Item {
            entry,
            ticket,
            task,
        });
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
