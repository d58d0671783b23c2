//! Criterion suite: the per-task paths underneath the workloads.
//!
//! Ids are `<path>/<implementation>`, stable for `--save-baseline`. The baselines' versions of
//! each path are here; keyserial-core's own versions go in [`core_paths`] (see the marked spot).
//!
//! | group | what one iteration is |
//! |---|---|
//! | `push_drain` | enqueue one task for a key and take it back out as the key's runner would |
//! | `table_hit`, `table_miss` | look up a key in a table of 100,000 keys that has / lacks it |
//! | `table_retire_backlog` | insert a new key and retire + unlink the oldest of 262,144 live ones |
//! | `handoff` | put one ready item on a queue and take it off (single thread: the queue's own cost) |
//! | `semaphore` | acquire and release one permit, uncontended |
//! | `task_box` | box a task closure and call it (what every boxed baseline pays per task) |
//! | `cross_thread_alloc` | allocate a 64-byte block (a task node) on one thread and free it on another |

use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use keyserial_benches::exec::{KeyMap, Task};

const TABLE_KEYS: u64 = 100_000;

fn config<'c>(c: &'c mut Criterion, name: &str) -> BenchmarkGroup<'c, WallTime> {
    let mut g = c.benchmark_group(name);
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    g
}

/// `push_drain/striped_map`: the striped baseline's per-task path without threads: lock the global
/// map, append to the key's queue (creating it), then lock again, pop, and remove the empty queue.
/// `push_drain/crossbeam_channel`: a lane's path: send a boxed task, receive it.
fn push_drain(c: &mut Criterion) {
    let mut g = config(c, "push_drain");
    let map: Mutex<KeyMap<VecDeque<Task>>> = Mutex::new(KeyMap::default());
    let mut key = 0u64;
    g.bench_function("striped_map", |b| {
        b.iter(|| {
            key = (key + 1) % 1024;
            {
                let mut m = map.lock().unwrap();
                match m.entry(key) {
                    Entry::Occupied(mut e) => e.get_mut().push_back(Box::new(|| ())),
                    Entry::Vacant(e) => e
                        .insert(VecDeque::with_capacity(4))
                        .push_back(Box::new(|| ())),
                }
            }
            let task = {
                let mut m = map.lock().unwrap();
                let t = m.get_mut(&key).and_then(VecDeque::pop_front);
                m.remove(&key);
                t
            };
            if let Some(t) = task {
                t();
            }
        })
    });
    let (tx, rx) = crossbeam_channel::unbounded::<Task>();
    g.bench_function("crossbeam_channel", |b| {
        b.iter(|| {
            tx.send(Box::new(|| ())).unwrap();
            (rx.recv().unwrap())();
        })
    });
    g.finish();
}

/// `table_hit/mutex_hashmap`, `table_miss/mutex_hashmap`: the baselines' key table (a `HashMap`
/// behind a `Mutex`, as in thread-per-key, striped and the tokio actor's shards).
fn table(c: &mut Criterion) {
    let map: Mutex<KeyMap<u64>> = Mutex::new((0..TABLE_KEYS).map(|k| (k, k)).collect());
    let mut i = 0u64;
    let mut g = config(c, "table_hit");
    g.bench_function("mutex_hashmap", |b| {
        b.iter(|| {
            i = (i + 7919) % TABLE_KEYS;
            black_box(map.lock().unwrap().get(&black_box(i)).copied())
        })
    });
    g.finish();
    let mut g = config(c, "table_miss");
    g.bench_function("mutex_hashmap", |b| {
        b.iter(|| {
            i = (i + 7919) % TABLE_KEYS;
            black_box(map.lock().unwrap().get(&black_box(i + TABLE_KEYS)).copied())
        })
    });
    g.finish();
}

/// `handoff/crossbeam_channel`: the ready channel of the striped baseline (a key in, a key out).
fn handoff(c: &mut Criterion) {
    let mut g = config(c, "handoff");
    let (tx, rx) = crossbeam_channel::unbounded::<u64>();
    g.bench_function("crossbeam_channel", |b| {
        b.iter(|| {
            tx.send(black_box(1)).unwrap();
            black_box(rx.recv().unwrap())
        })
    });
    g.finish();
}

/// A counting semaphore as one would hand-roll it: a `Mutex<usize>` and a `Condvar`.
struct MutexSemaphore {
    permits: Mutex<usize>,
    freed: Condvar,
}

impl MutexSemaphore {
    fn acquire(&self) {
        let mut p = self.permits.lock().unwrap();
        while *p == 0 {
            p = self.freed.wait(p).unwrap();
        }
        *p -= 1;
    }

    fn release(&self) {
        *self.permits.lock().unwrap() += 1;
        self.freed.notify_one();
    }
}

/// `semaphore/mutex_condvar`: acquire + release of one permit, uncontended.
fn semaphore(c: &mut Criterion) {
    let mut g = config(c, "semaphore");
    let s = MutexSemaphore {
        permits: Mutex::new(4),
        freed: Condvar::new(),
    };
    g.bench_function("mutex_condvar", |b| {
        b.iter(|| {
            s.acquire();
            s.release();
        })
    });
    g.finish();
}

/// `task_box/box_dyn_fnonce`: what a baseline pays to queue a closure of the workloads' size.
fn task_box(c: &mut Criterion) {
    let mut g = config(c, "task_box");
    let mut n = 0u64;
    g.bench_function("box_dyn_fnonce", |b| {
        b.iter(|| {
            n += 1;
            let (k, s) = (black_box(n), black_box(n as u32));
            let t: Task = Box::new(move || {
                black_box((k, s));
            });
            black_box(t)();
        })
    });
    g.finish();
}

/// keyserial-core's versions of the paths above, under the same group names with the id
/// `keyserial`, so each group compares the core with the baselines:
///
/// - `push_drain/keyserial`: push one task onto an idle key's chain (idle -> active, the task
///   boxed in its node), then, as the owner, pop it, run it and release the chain (-> idle).
/// - `push_drain/keyserial_queued`: the same push onto a chain that is already active (the common
///   case under load: one CAS, no scheduling), then pop it.
/// - `table_hit/keyserial`, `table_miss/keyserial`: `Table::get` in a table of `TABLE_KEYS` keys,
///   under a pinned guard.
/// - `table_insert_retire/keyserial`: a key's whole life: insert, retire, unlink, batched free.
/// - `table_retire_backlog/keyserial_search`, `.../keyserial_home`: the same with 262,144 keys
///   between a key's insert and its retirement (a W3 backlog), unlinked by search or from home.
/// - `handoff/keyserial_bounded`: the core's bounded ready queue.
/// - `semaphore/keyserial`: `keyserial::Semaphore` acquire + release of one permit, uncontended.
fn core_paths(c: &mut Criterion) {
    use keyserial_core::chain::{BoxNode, Chain};
    use keyserial_core::ready::BoundedQueue;
    use keyserial_core::table::Table;
    use std::collections::hash_map::RandomState;

    let mut g = config(c, "push_drain");
    let chain: Chain<BoxNode<Task>> = Chain::new();
    g.bench_function("keyserial", |b| {
        b.iter(|| {
            let _ = chain.push_value(Box::new(|| ()));
            // SAFETY: the push activated the chain (it was idle), so this thread owns it.
            unsafe {
                (chain.pop_value().unwrap())();
                assert!(chain.try_release());
            }
        })
    });
    let active: Chain<BoxNode<Task>> = Chain::new();
    let _ = active.push_value(Box::new(|| ())); // activated: this thread owns it from here on
    g.bench_function("keyserial_queued", |b| {
        b.iter(|| {
            let _ = active.push_value(Box::new(|| ()));
            // SAFETY: this thread owns the chain (activated above, never released).
            unsafe { (active.pop_value().unwrap())() };
        })
    });
    g.finish();

    let table: Table<u64, Chain<BoxNode<Task>>, RandomState> =
        Table::with_hasher(RandomState::new());
    let handle = table.register();
    {
        let guard = handle.pin();
        for k in 0..TABLE_KEYS {
            table.get_or_insert_with(k, Chain::new, &guard);
        }
    }
    let mut i = 0u64;
    let mut g = config(c, "table_hit");
    g.bench_function("keyserial", |b| {
        let guard = handle.pin();
        b.iter(|| {
            i = (i + 7919) % TABLE_KEYS;
            black_box(table.get(&black_box(i), &guard).is_some())
        })
    });
    g.finish();
    let mut g = config(c, "table_miss");
    g.bench_function("keyserial", |b| {
        let guard = handle.pin();
        b.iter(|| {
            i = (i + 7919) % TABLE_KEYS;
            black_box(table.get(&black_box(i + TABLE_KEYS), &guard).is_some())
        })
    });
    g.finish();
    let mut g = config(c, "table_insert_retire");
    let mut next = 10 * TABLE_KEYS;
    let mut garbage = Vec::new();
    g.bench_function("keyserial", |b| {
        b.iter(|| {
            let guard = handle.pin();
            next += 1;
            let e = table.get_or_insert_with(next, Chain::new, &guard);
            assert!(e.value().try_retire());
            garbage.extend(table.unlink_take(e, &guard));
            if garbage.len() == 64 {
                table.defer_free(std::mem::take(&mut garbage), &guard);
            }
        })
    });
    table.defer_free(std::mem::take(&mut garbage), &handle.pin());
    g.finish();

    // A backlog of one-shot keys, as when one submitter outruns the workers (W3): each
    // iteration inserts a new key and retires the oldest of BACKLOG live ones, whose path has
    // long left the caches. `keyserial_search` unlinks by walking the path again,
    // `keyserial_home` through the entry's home slot (what the executor does).
    const BACKLOG: usize = 262_144;
    let mut g = config(c, "table_retire_backlog");
    for home in [false, true] {
        let backlog: Table<u64, Chain<BoxNode<Task>>, RandomState> =
            Table::with_hasher(RandomState::new());
        let h = backlog.register();
        let mut fifo: VecDeque<*const keyserial_core::table::Entry<u64, Chain<BoxNode<Task>>>> =
            VecDeque::with_capacity(BACKLOG + 1);
        let mut key = 0u64;
        {
            let guard = h.pin();
            for _ in 0..BACKLOG {
                key += 1;
                fifo.push_back(backlog.get_or_insert_with(key, Chain::new, &guard));
            }
        }
        let mut garbage = Vec::new();
        let mut step = || {
            let guard = h.pin();
            key += 1;
            fifo.push_back(backlog.get_or_insert_with(key, Chain::new, &guard));
            let oldest = fifo.pop_front().unwrap();
            // SAFETY: only this loop retires entries, so the oldest is still in the table
            // (alive), whatever guard it was found under.
            let e = unsafe { &*oldest };
            let taken = if home {
                // SAFETY: `e` came from `backlog`; `try_retire` succeeds only on the transition.
                unsafe { backlog.retire_take(e, &guard, |c| c.try_retire()) }
            } else {
                assert!(e.value().try_retire());
                backlog.unlink_take(e, &guard)
            };
            garbage.extend(taken);
            if garbage.len() == 64 {
                backlog.defer_free(std::mem::take(&mut garbage), &guard);
            }
        };
        // One full turn first, so that the keys retired while measuring were inserted into a
        // table of the steady size (as in a long-running backlog), not while it filled.
        for _ in 0..BACKLOG {
            step();
        }
        let id = if home {
            "keyserial_home"
        } else {
            "keyserial_search"
        };
        g.bench_function(id, |b| b.iter(&mut step));
        backlog.defer_free(std::mem::take(&mut garbage), &h.pin());
    }
    g.finish();

    let mut g = config(c, "handoff");
    let bounded: BoundedQueue<u64, 256> = BoundedQueue::new();
    g.bench_function("keyserial_bounded", |b| {
        b.iter(|| {
            bounded.push(black_box(1)).unwrap();
            black_box(bounded.pop().unwrap())
        })
    });
    g.finish();

    let mut g = config(c, "semaphore");
    let sem = keyserial::Semaphore::new(4);
    g.bench_function("keyserial", |b| {
        b.iter(|| drop(black_box(sem.acquire(1).unwrap())))
    });
    g.finish();
}

/// Allocates `iters` blocks on this thread with `alloc` and frees them on a second thread with
/// the freer that `make_freer` builds there, handing them over in batches of 256 (a submitter
/// and a worker: the pattern of task nodes). Returns the producer's wall time.
fn producer_consumer(
    iters: u64,
    mut alloc: impl FnMut() -> usize,
    make_freer: fn() -> Box<dyn FnMut(usize)>,
) -> Duration {
    let (tx, rx) = crossbeam_channel::bounded::<Vec<usize>>(4);
    let consumer = std::thread::spawn(move || {
        let mut free = make_freer();
        for batch in rx {
            for p in batch {
                free(p);
            }
        }
    });
    let start = std::time::Instant::now();
    let mut batch = Vec::with_capacity(256);
    for _ in 0..iters {
        batch.push(black_box(alloc()));
        if batch.len() == 256 {
            tx.send(std::mem::replace(&mut batch, Vec::with_capacity(256)))
                .unwrap();
        }
    }
    tx.send(batch).unwrap();
    drop(tx);
    consumer.join().unwrap();
    start.elapsed()
}

/// `cross_thread_alloc/global_allocator`: `Box<[u8; 64]>` allocated here, freed on another
/// thread. `cross_thread_alloc/keyserial_recycle`: the same blocks through keyserial-core's
/// magazine caches (one cache per thread over a shared depot), as the executor allocates nodes.
fn cross_thread_alloc(c: &mut Criterion) {
    use keyserial_core::recycle::{Cache, Depot};
    use std::alloc::Layout;
    static DEPOT: Depot<64> = Depot::new(Layout::new::<[u8; 64]>());

    let mut g = config(c, "cross_thread_alloc");
    g.bench_function("global_allocator", |b| {
        b.iter_custom(|iters| {
            producer_consumer(
                iters,
                || Box::into_raw(Box::new([0u8; 64])) as usize,
                || {
                    // SAFETY: every pointer is a `Box<[u8; 64]>` made above, freed once.
                    Box::new(|p| drop(unsafe { Box::from_raw(p as *mut [u8; 64]) }))
                },
            )
        })
    });
    g.bench_function("keyserial_recycle", |b| {
        let mut cache = Cache::new(&DEPOT);
        b.iter_custom(|iters| {
            producer_consumer(
                iters,
                || {
                    let p = cache.alloc();
                    // SAFETY: a block of 64 bytes, ours; written as a node would be.
                    unsafe { p.as_ptr().write_bytes(0, 64) };
                    p.as_ptr() as usize
                },
                || {
                    let mut cache = Cache::new(&DEPOT);
                    Box::new(move |p| {
                        let p = std::ptr::NonNull::new(p as *mut u8).unwrap();
                        // SAFETY: a block of DEPOT's class allocated above, freed once.
                        unsafe { cache.free(p) }
                    })
                },
            )
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    push_drain,
    table,
    handoff,
    semaphore,
    task_box,
    cross_thread_alloc,
    core_paths
);
criterion_main!(benches);
