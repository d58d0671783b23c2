//! Criterion suite: the per-task paths underneath the workloads.
//!
//! Ids are `<path>/<implementation>`, stable for `--save-baseline`. The baselines' versions of
//! each path are here; keyserial-core's own versions go in [`core_paths`] (see the marked spot).
//!
//! | group | what one iteration is |
//! |---|---|
//! | `push_drain` | enqueue one task for a key and take it back out as the key's runner would |
//! | `table_hit`, `table_miss` | look up a key in a table of 100,000 keys that has / lacks it |
//! | `handoff` | put one ready item on a queue and take it off (single thread: the queue's own cost) |
//! | `semaphore` | acquire and release one permit, uncontended |
//! | `task_box` | box a task closure and call it (what every boxed baseline pays per task) |

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

// ---------------------------------------------------------------------------------------------
// CORE MICRO PATHS: keyserial-core's versions of the paths above, to be filled in against the
// core API (the lead owns it). Use the same group names with the implementation id `keyserial`
// so each group compares core with the baselines, e.g.:
//   push_drain/keyserial   chain: push_value one task onto a key's chain (idle -> active), then as
//                          the owner pop_value it and release the chain (active -> idle)
//   table_hit/keyserial    table: get() of a present key in a table of TABLE_KEYS keys (with a
//   table_miss/keyserial   pinned epoch guard), and of an absent key
//   handoff/keyserial      ready queue: push one chain pointer, pop it (bounded and unbounded)
//   semaphore/keyserial    keyserial::Semaphore (or core's PermitCounter): acquire + release one
//                          permit, uncontended
// ---------------------------------------------------------------------------------------------
fn core_paths(_c: &mut Criterion) {}

criterion_group!(benches, push_drain, table, handoff, semaphore, task_box, core_paths);
criterion_main!(benches);
