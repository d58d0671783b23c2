//! A serializer without an allocator: [`FixedSerializer`] runs tasks in order per key over
//! fixed-capacity storage, driven by whoever calls [`run`](FixedSerializer::run) (a main loop,
//! several cores, interrupt handlers).
//!
//! # Progress
//!
//! No operation waits for another thread or handler to finish a step. Every multi-step change
//! that others may observe half-done is either completed by whoever finds it half-done (an insert
//! in the key table, a push onto the ready ring) or stepped around: a `run` that meets a chain push
//! between its two steps (see [`crate::chain`], "The pop") ends its turn and puts the key back on
//! the ring until the pusher finishes. So an interrupt handler that preempts any call on the same
//! core completes its own call.
//!
//! | operation | guarantee | why |
//! |---|---|---|
//! | [`queued`](FixedSerializer::queued), [`live_keys`](FixedSerializer::live_keys) | wait-free | one load |
//! | [`submit`](FixedSerializer::submit) | lock-free | a `CAS` retries only because another call's `CAS` on the same word succeeded (task pool, key table, chain push, ready ring); at most `KEYS` probes per scan |
//! | [`run`](FixedSerializer::run) | lock-free, plus the time `f` takes | ready-ring pop and requeue are lock-free; the chain's pop, release and retire are wait-free (none waits for a half-done push); freeing a task node is a lock-free push |
//!
//! None of them is wait-free in general: an unbounded stream of successful operations by others
//! can keep one `CAS` retrying. A key whose task is running (its `run` call preempted, say) is not
//! a wait: other `run` calls serve other keys or return 0.
//!
//! # Structure
//!
//! - **Tasks**: a [`Pool<T, TASKS>`](crate::pool::Pool) of nodes (lock-free, generation-tagged
//!   free list): `TASKS` is exact and any key may hold all of them.
//! - **Per-key queue**: each key slot holds a [`Chain`](crate::chain::Chain) over pool nodes, the
//!   same `ACTIVE`/`RETIRED` handoff word as the `alloc` build (see [`crate::chain`]).
//! - **Key table** (`table.rs`): `KEYS` slots with a per-slot word (state, hash tag, pin count)
//!   and a one-word insert descriptor that serialises new keys with helping. Its protocol is
//!   below.
//! - **Ready ring** (`ready.rs`): `KEYS` one-word cells, FIFO, where a cell `CAS` is the
//!   linearisation point of both push and pop; it never fills because a key is in it at most
//!   once.
//!
//! The hasher for `K` is [hash32](https://docs.rs/hash32)'s FNV-1a, the one
//! [heapless](https://docs.rs/heapless) uses. heapless itself is not a dependency: its
//! containers are not used for the shared structures on purpose: they are single-owner, and its
//! MPMC queue needs a power-of-two size and publishes a claimed cell in a second step (a stopped
//! producer makes the queue look empty or full to others). The table, the ring, the pool and the
//! chain are this crate's own so that the loom models in `loom/tests/fixed.rs` check them through
//! the crate's `sync` facade. `run` hands tasks to `f` one at a time, so it needs no batch buffer.
//!
//! # Protocol
//!
//! **submit(key, task)**: allocate a task node (none free: `TasksFull`, the task handed back);
//! find the key's `LIVE` slot and pin it, or insert the key (no room: `KeysFull`, node freed and
//! the task handed back); push the node onto the slot's chain. If the push moved the chain from
//! idle to `ACTIVE` (the caller now holds its baton), push the slot onto the ready ring. If the
//! chain was `RETIRED` meanwhile, help mark the slot `DEAD` and start again from the lookup.
//!
//! **run(budget, f)**: pop a slot from the ready ring (its baton comes with it); pop up to
//! `budget` tasks from its chain, freeing each node before calling `f(&key, task)`; then, holding
//! a pin: if tasks remain, push the slot back at the end of the ring; else release the chain
//! (`ACTIVE -> 0`, fails if something was pushed meanwhile: then requeue) and retire it
//! (`0 -> RETIRED`), which marks the slot `DEAD` and frees it once unpinned. The end of the turn
//! runs in a drop guard, so it also happens when `f` unwinds.
//!
//! **Why nothing is lost, run twice, or reordered.**
//! - One slot per key: only the candidate in the insert descriptor can become `LIVE`, after a
//!   scan that found no `LIVE` slot for its key (see `table.rs`).
//! - A push lands on a chain only while the slot is `LIVE` and pinned, so never on a slot that was
//!   reused for another key; a push onto a retired chain fails and goes back to the table.
//! - The chain's handoff word gives exactly one baton per active chain (one drainer, FIFO order)
//!   and no lost wakeup (release fails if anything was pushed); see [`crate::chain`].
//! - A slot is in the ready ring at most once (only the baton holder pushes it), the ring is FIFO,
//!   so ready keys are served in the order they became ready.
//! - A slot's chain is retired only idle and empty, so no task is left in a freed slot.
//!
//! # Capacity and limits
//! - `KEYS` is the number of keys that can be live at once, `TASKS` the number of queued tasks;
//!   both exact, any size from 1 (0 fails to compile). A key stays live while its last task runs
//!   and frees its slot when that task returns (or unwinds) with nothing queued.
//! - Transient `KeysFull` with fewer than `KEYS` live keys: while another call's insert of the
//!   same new key is in flight at the limit (its reservation counts), or while a preempted call
//!   still pins a retired slot in the middle of a key comparison (`table.rs`, "Capacity").
//! - If `K`'s `Hash`, `Eq`, `Clone` or `Drop` unwinds inside `submit`, the slot it was touching
//!   may stay reserved (a leak of one key slot, never unsoundness).
//! - Dropping the serializer drops its queued tasks and its keys.

mod ready;
mod table;

#[cfg(test)]
mod tests;

use core::fmt;
use core::hash::Hash;

use crate::chain::{Pushed, Retired};
use crate::pool::Pool;
use crate::sync::{AtomicUsize, Ordering};

use ready::ReadyRing;
use table::{hash_of, Inserted, Table};

/// Why [`FixedSerializer::submit`] refused a task.
///
/// ```
/// use keyserial_core::fixed::{FixedSerializer, RefuseReason};
/// let s: FixedSerializer<u8, u8, 1, 1> = FixedSerializer::new();
/// s.submit(1, 10).unwrap();
/// assert_eq!(s.submit(1, 11).unwrap_err().reason, RefuseReason::TasksFull);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseReason {
    /// `TASKS` tasks are queued.
    TasksFull,
    /// `KEYS` keys are live and the task's key is not one of them.
    KeysFull,
}

/// A task that [`FixedSerializer::submit`] did not queue, handed back whole.
///
/// ```
/// use keyserial_core::fixed::{FixedSerializer, RefuseReason};
/// let s: FixedSerializer<u8, &str, 1, 4> = FixedSerializer::new();
/// s.submit(1, "a").unwrap();
/// let refused = s.submit(2, "b").unwrap_err();
/// assert_eq!((refused.reason, refused.task), (RefuseReason::KeysFull, "b"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused<T> {
    /// Why it was refused.
    pub reason: RefuseReason,
    /// The task, untouched.
    pub task: T,
}

/// Runs tasks of type `T` in order per key `K`, at most `KEYS` live keys and `TASKS` queued
/// tasks, without an allocator. See the [module docs](self) for the protocol and guarantees.
///
/// ```
/// use keyserial_core::fixed::FixedSerializer;
///
/// #[derive(Debug, PartialEq)]
/// enum Cmd { On, Off }
///
/// static SERIAL: FixedSerializer<u8, Cmd, 16, 64> = FixedSerializer::new();
///
/// // Producers (threads, cores, interrupt handlers):
/// SERIAL.submit(3, Cmd::On).unwrap();
/// SERIAL.submit(3, Cmd::Off).unwrap();
/// // A driver loop:
/// let mut seen = Vec::new();
/// while SERIAL.run(8, |key, cmd| seen.push((*key, cmd))) > 0 {}
/// assert_eq!(seen, [(3, Cmd::On), (3, Cmd::Off)]);
/// assert_eq!(SERIAL.live_keys(), 0);
/// ```
pub struct FixedSerializer<K, T, const KEYS: usize, const TASKS: usize> {
    // Dropped first: the chains drop their queued tasks, which live in `tasks`.
    table: Table<K, T, KEYS>,
    tasks: Pool<T, TASKS>,
    ready: ReadyRing<KEYS>,
    queued: AtomicUsize,
}

impl<K: Hash + Eq + Clone, T, const KEYS: usize, const TASKS: usize>
    FixedSerializer<K, T, KEYS, TASKS>
{
    const CHECK: () = {
        assert!(KEYS > 0, "FixedSerializer: KEYS must be at least 1");
        assert!(TASKS > 0, "FixedSerializer: TASKS must be at least 1");
        assert!(
            KEYS <= 1 << 16,
            "FixedSerializer: KEYS must be at most 65536"
        );
        assert!(
            usize::BITS >= 32,
            "FixedSerializer needs a 32-bit or wider target"
        );
    };

    /// An empty serializer; `const`, so it can be a `static`. `KEYS` or `TASKS` of 0 fails to
    /// compile.
    ///
    /// ```
    /// use keyserial_core::fixed::FixedSerializer;
    /// static S: FixedSerializer<u32, fn(), 8, 32> = FixedSerializer::new();
    /// assert_eq!(S.queued(), 0);
    /// ```
    ///
    /// ```compile_fail
    /// use keyserial_core::fixed::FixedSerializer;
    /// static S: FixedSerializer<u32, fn(), 0, 32> = FixedSerializer::new();
    /// ```
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK;
        FixedSerializer {
            table: Table::new(),
            tasks: Pool::new(),
            ready: ReadyRing::new(),
            queued: AtomicUsize::new(0),
        }
    }

    /// An empty serializer (loom build: not `const`).
    #[cfg(loom)]
    pub fn new() -> Self {
        #[allow(clippy::let_unit_value)]
        let () = Self::CHECK;
        FixedSerializer {
            table: Table::new(),
            tasks: Pool::new(),
            ready: ReadyRing::new(),
            queued: AtomicUsize::new(0),
        }
    }

    /// Queues `task` behind every task of `key` submitted before it returned. Lock-free; callable
    /// from any thread, core or interrupt handler, and from inside `run`'s `f`. A refused task is
    /// handed back in [`Refused`].
    ///
    /// ```
    /// use keyserial_core::fixed::{FixedSerializer, RefuseReason};
    /// let s: FixedSerializer<&str, u32, 2, 2> = FixedSerializer::new();
    /// s.submit("a", 1).unwrap();
    /// s.submit("b", 2).unwrap();
    /// let back = s.submit("a", 3).unwrap_err();
    /// assert_eq!((back.reason, back.task), (RefuseReason::TasksFull, 3));
    /// ```
    pub fn submit(&self, key: K, task: T) -> Result<(), Refused<T>> {
        let node = match self.tasks.alloc(task) {
            Ok(node) => node,
            Err(task) => {
                return Err(Refused {
                    reason: RefuseReason::TasksFull,
                    task,
                })
            }
        };
        self.queued.fetch_add(1, Ordering::Relaxed);
        let hash = hash_of(&key);
        loop {
            let i = match self.table.find(&key, hash) {
                Some(i) => i,
                None => match self.table.insert(&key, hash) {
                    Inserted::Live(i) => i,
                    Inserted::Exists => continue,
                    Inserted::Full => {
                        self.queued.fetch_sub(1, Ordering::Relaxed);
                        // SAFETY: the node came from this pool and was never pushed.
                        let task = unsafe { self.tasks.free(node) };
                        return Err(Refused {
                            reason: RefuseReason::KeysFull,
                            task,
                        });
                    }
                },
            };
            let chain = &self.table.slot(i).chain;
            // SAFETY: a fresh node of our pool, owned by this call, pushed once; the pool lives
            // as long as the chain (both are fields of `self`).
            match unsafe { chain.push(node) } {
                Ok(pushed) => {
                    if pushed == Pushed::Activated {
                        self.ready.push(i);
                    }
                    self.table.unpin(i);
                    return Ok(());
                }
                Err(Retired(_)) => {
                    // The key's last task finished after our lookup: its slot is leaving.
                    self.table.mark_dead(i);
                    self.table.unpin(i);
                }
            }
        }
    }

    /// Takes the key that became ready first, hands up to `budget` of its tasks to `f` in
    /// submission order, then releases the key (freeing its slot if nothing is queued) or
    /// requeues it at the back. Returns how many tasks ran (0: nothing was ready, or `budget` was
    /// 0). Lock-free apart from `f`, which may call [`submit`](Self::submit) and `run` on this
    /// serializer. If `f` unwinds, the key is released and its other tasks stay queued.
    ///
    /// ```
    /// use keyserial_core::fixed::FixedSerializer;
    /// let s: FixedSerializer<u8, u32, 4, 8> = FixedSerializer::new();
    /// for t in 0..3 {
    ///     s.submit(1, t).unwrap();
    /// }
    /// s.submit(2, 9).unwrap();
    /// let mut log = Vec::new();
    /// assert_eq!(s.run(2, |k, t| log.push((*k, t))), 2); // key 1, budget 2
    /// assert_eq!(s.run(2, |k, t| log.push((*k, t))), 1); // key 2
    /// assert_eq!(s.run(2, |k, t| log.push((*k, t))), 1); // key 1 again
    /// assert_eq!(s.run(2, |k, t| log.push((*k, t))), 0);
    /// assert_eq!(log, [(1, 0), (1, 1), (2, 9), (1, 2)]);
    /// ```
    pub fn run<F: FnMut(&K, T)>(&self, budget: usize, mut f: F) -> usize {
        if budget == 0 {
            return 0;
        }
        let Some(i) = self.ready.pop() else {
            return 0;
        };
        let slot = self.table.slot(i);
        let mut turn = Turn {
            owner: self,
            slot: i,
            ran: 0,
            released: false,
        };
        // SAFETY: popping the slot from the ring handed us its chain's baton, which keeps the
        // slot LIVE (retire needs an idle chain) and its key in place until we give it up.
        let key = unsafe { slot.key() };
        let mut stalled = false;
        while turn.ran < budget {
            // SAFETY: we hold the chain's baton.
            match unsafe { slot.chain.pop() } {
                Some(node) => {
                    stalled = false;
                    // SAFETY: the node came from our pool and is no longer queued.
                    let task = unsafe { self.tasks.free(node) };
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                    turn.ran += 1;
                    f(key, task);
                }
                None if self.release(i) => {
                    turn.released = true;
                    break;
                }
                // Twice nothing to pop, yet a push is queued: it is between its two steps,
                // perhaps in the very code this call interrupted (core `chain`, "The pop").
                // End the turn rather than wait for it: `Turn` puts the key back on the ring.
                None if stalled => break,
                None => stalled = true,
            }
        }
        turn.ran
    }

    /// The number of queued tasks, not yet handed to `f` (a snapshot). Wait-free.
    ///
    /// ```
    /// let s: keyserial_core::fixed::FixedSerializer<u8, (), 2, 4> = Default::default();
    /// s.submit(0, ()).unwrap();
    /// assert_eq!(s.queued(), 1);
    /// ```
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// The number of live keys: keys with queued or running tasks, plus inserts in flight (a
    /// snapshot). Wait-free.
    ///
    /// ```
    /// let s: keyserial_core::fixed::FixedSerializer<u8, (), 2, 4> = Default::default();
    /// s.submit(0, ()).unwrap();
    /// s.submit(0, ()).unwrap();
    /// assert_eq!(s.live_keys(), 1);
    /// while s.run(1, |_, _| {}) > 0 {}
    /// assert_eq!(s.live_keys(), 0);
    /// ```
    pub fn live_keys(&self) -> usize {
        self.table.live()
    }

    /// Gives up slot `i`'s baton if its chain is empty, and retires the key. Returns `false`
    /// (baton still held) if tasks are queued. The caller holds the baton.
    fn release(&self, i: usize) -> bool {
        let slot = self.table.slot(i);
        // Pin first: once released, the slot may be retired and reused by others at any time.
        self.table.pin_held(i);
        // SAFETY: the caller holds the baton.
        let released = unsafe { slot.chain.try_release() };
        if released && slot.chain.try_retire() {
            self.table.mark_dead(i);
        }
        self.table.unpin(i);
        released
    }

    /// Ends a turn that did not release the key: requeue it if tasks remain, else release it.
    fn finish(&self, i: usize) {
        let slot = self.table.slot(i);
        // SAFETY: the caller holds the baton.
        if unsafe { slot.chain.peek() }.is_some() || !self.release(i) {
            self.ready.push(i);
        }
    }
}

/// One `run` turn: ends it (requeue or release) when dropped, also while `f` unwinds.
struct Turn<'a, K: Hash + Eq + Clone, T, const KEYS: usize, const TASKS: usize> {
    owner: &'a FixedSerializer<K, T, KEYS, TASKS>,
    slot: usize,
    ran: usize,
    released: bool,
}

impl<K: Hash + Eq + Clone, T, const KEYS: usize, const TASKS: usize> Drop
    for Turn<'_, K, T, KEYS, TASKS>
{
    fn drop(&mut self) {
        if !self.released {
            self.owner.finish(self.slot);
        }
    }
}

impl<K: Hash + Eq + Clone, T, const KEYS: usize, const TASKS: usize> Default
    for FixedSerializer<K, T, KEYS, TASKS>
{
    fn default() -> Self {
        Self::new()
    }
}

impl<K, T, const KEYS: usize, const TASKS: usize> fmt::Debug
    for FixedSerializer<K, T, KEYS, TASKS>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FixedSerializer")
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .field("keys", &KEYS)
            .field("tasks", &TASKS)
            .finish()
    }
}
