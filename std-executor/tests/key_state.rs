//! Issue "Control", per-key state (`Builder::key_state`, `on_key_release`,
//! `submit_with_state`): made lazily in the key's order, the same `&mut S` for the key's state
//! tasks with no lock, released through the hook exactly once per key life.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keyserial::{Builder, PanicPolicy, Serializer, TaskError};

mod common;
use common::{block_worker, wait_until};

const LONG: Duration = Duration::from_secs(10);

/// Everything that happened, in order: `init k`, `task k i`, `plain k i`, `release k value`.
type Log = Arc<Mutex<Vec<String>>>;

fn push(log: &Log, line: String) {
    log.lock().unwrap().push(line);
}

fn ledger(log: &Log, idle: Duration) -> Serializer<u32, Vec<u32>> {
    let (l1, l2) = (log.clone(), log.clone());
    Builder::<u32>::new()
        .workers(2)
        .key_idle_timeout(idle)
        .key_state(move |k: &u32| {
            push(&l1, format!("init {k}"));
            Vec::new()
        })
        .on_key_release(move |k, v: Vec<u32>| push(&l2, format!("release {k} {v:?}")))
        .build()
        .unwrap()
}

#[test]
fn a_state_is_made_in_the_keys_order_and_shared_by_its_state_tasks() {
    let log = Log::default();
    let s = ledger(&log, LONG);
    let l = log.clone();
    s.execute(1, move || push(&l, "plain 1 0".into())).unwrap();
    let mut hs = Vec::new();
    for i in 1..=3u32 {
        let l = log.clone();
        hs.push(
            s.submit_with_state(1, move |v: &mut Vec<u32>| {
                v.push(i);
                push(&l, format!("task 1 {i}"));
                v.len()
            })
            .unwrap(),
        );
        let l = log.clone();
        s.execute(1, move || push(&l, format!("plain 1 {i}")))
            .unwrap();
    }
    let lens: Vec<usize> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(lens, [1, 2, 3], "one state, in order");
    // A key with only plain tasks never makes one.
    s.submit(2, || ()).unwrap().join().unwrap();
    assert!(wait_until(LONG, || log.lock().unwrap().len() == 8));
    assert_eq!(
        *log.lock().unwrap(),
        [
            "plain 1 0",
            "init 1",
            "task 1 1",
            "plain 1 1",
            "task 1 2",
            "plain 1 2",
            "task 1 3",
            "plain 1 3",
        ]
    );
    drop(s);
    let log = log.lock().unwrap();
    assert_eq!(
        log.last().unwrap(),
        "release 1 [1, 2, 3]",
        "released at termination"
    );
    assert!(!log
        .iter()
        .any(|l| l.contains("init 2") || l.contains("release 2")));
}

#[test]
fn an_idle_key_releases_its_state_once_and_a_new_life_starts_fresh() {
    let log = Log::default();
    let s = ledger(&log, Duration::from_millis(20));
    s.submit_with_state(5, |v: &mut Vec<u32>| v.push(1))
        .unwrap()
        .join()
        .unwrap();
    assert!(wait_until(LONG, || log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l == "release 5 [1]")));
    let n = s
        .submit_with_state(5, |v: &mut Vec<u32>| {
            v.push(2);
            v.len()
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(n, 1, "a fresh state after the release");
    drop(s);
    let log = log.lock().unwrap();
    assert_eq!(
        *log,
        ["init 5", "release 5 [1]", "init 5", "release 5 [2]"],
        "each state released exactly once, the old before the new was made"
    );
}

#[test]
fn a_panic_in_init_fails_the_task_and_the_next_one_tries_again() {
    let tries = Arc::new(AtomicUsize::new(0));
    let t = tries.clone();
    let s = Builder::<u32>::new()
        .key_state(move |_| {
            if t.fetch_add(1, SeqCst) == 0 {
                panic!("init failed");
            }
            10u32
        })
        .build()
        .unwrap();
    let first = s.submit_with_state(1, |n: &mut u32| *n).unwrap();
    assert!(matches!(first.join(), Err(TaskError::Panicked(_))));
    assert_eq!(
        s.submit_with_state(1, |n: &mut u32| *n)
            .unwrap()
            .join()
            .unwrap(),
        10
    );
    assert_eq!(tries.load(SeqCst), 2);
}

#[test]
fn a_panicking_state_task_leaves_the_state_as_it_left_it() {
    // An idle timeout far past the test: the panic's backtrace, printed under a loaded machine,
    // once took longer than the default 100 ms, and the key (its state with it) was released
    // between the two tasks, as documented.
    let s = Builder::<u32>::new()
        .key_idle_timeout(Duration::from_secs(600))
        .key_state(|_| 0u32)
        .build()
        .unwrap();
    let failed = s
        .submit_with_state(1, |n: &mut u32| {
            *n = 7;
            panic!("after the write");
        })
        .unwrap();
    assert!(failed.join().is_err());
    assert_eq!(
        s.submit_with_state(1, |n: &mut u32| *n)
            .unwrap()
            .join()
            .unwrap(),
        7
    );
}

#[test]
fn a_panicking_release_hook_is_contained() {
    let s = Builder::<u32>::new()
        .workers(1)
        .key_idle_timeout(Duration::ZERO)
        .key_state(|_| 0u32)
        .on_key_release(|_, _| panic!("hook failed"))
        .build()
        .unwrap();
    for k in 0..5 {
        s.submit_with_state(k, |n: &mut u32| *n += 1)
            .unwrap()
            .join()
            .unwrap();
    }
    // The worker survived every hook.
    assert_eq!(s.submit(9, || 9).unwrap().join().unwrap(), 9);
    s.shutdown();
    assert!(s.await_termination(LONG));
}

#[test]
fn panic_policy_pause_key_with_state() {
    let s = Builder::<u32>::new()
        .panic_policy(PanicPolicy::PauseKey)
        .key_state(|_| Vec::<u32>::new())
        .build()
        .unwrap();
    let failed = s
        .submit_with_state(1, |_v: &mut Vec<u32>| -> () { panic!("bad") })
        .unwrap();
    let next = s
        .submit_with_state(1, |v: &mut Vec<u32>| v.push(1))
        .unwrap();
    assert!(failed.join().is_err());
    std::thread::sleep(Duration::from_millis(30));
    assert!(!next.is_finished());
    s.resume(&1);
    next.join().unwrap();
}

#[test]
fn a_serializer_without_key_state_gives_unit() {
    let s: Serializer<u32> = Serializer::new();
    let h = s.submit_with_state(1, |unit: &mut ()| *unit).unwrap();
    h.join().unwrap();
    assert!(
        s.try_submit_with_state(1, |_: &mut ()| 2)
            .unwrap()
            .join()
            .unwrap()
            == 2
    );
}

#[test]
fn an_idle_key_released_for_max_keys_releases_its_state_first() {
    let log = Log::default();
    let (l1, l2) = (log.clone(), log.clone());
    let s = Builder::<u32>::new()
        .max_keys(1)
        .key_idle_timeout(LONG)
        .key_state(move |k: &u32| {
            push(&l1, format!("init {k}"));
            0u32
        })
        .on_key_release(move |k, n| push(&l2, format!("release {k} {n}")))
        .build()
        .unwrap();
    s.submit_with_state(1, |n: &mut u32| *n += 5)
        .unwrap()
        .join()
        .unwrap();
    assert!(wait_until(LONG, || s.stats().active_keys == 1));
    s.submit_with_state(2, |n: &mut u32| *n += 1)
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(
        log.lock().unwrap()[..3],
        ["init 1", "release 1 5", "init 2"],
        "key 1's state went through the hook before key 2 took its place"
    );
}

fn ledger_with(log: &Log, idle: Duration, workers: usize) -> Serializer<u32, Vec<u32>> {
    let (l1, l2) = (log.clone(), log.clone());
    Builder::<u32>::new()
        .workers(workers)
        .max_workers(workers)
        .key_idle_timeout(idle)
        .key_state(move |k: &u32| {
            push(&l1, format!("init {k}"));
            Vec::new()
        })
        .on_key_release(move |k, v: Vec<u32>| push(&l2, format!("release {k} {v:?}")))
        .build()
        .unwrap()
}

fn count(log: &Log, line: &str) -> usize {
    log.lock().unwrap().iter().filter(|l| *l == line).count()
}

fn releases(log: &Log, key: u32) -> Vec<String> {
    let prefix = format!("release {key} ");
    log.lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with(&prefix))
        .cloned()
        .collect()
}

#[test]
fn shutdown_now_hands_back_the_keys_state_to_its_tasks_and_releases_it_after_the_last_ran() {
    let log = Log::default();
    let s = ledger_with(&log, LONG, 2);
    s.submit_with_state(1, |v: &mut Vec<u32>| v.push(1))
        .unwrap()
        .join()
        .unwrap();
    // A state task of key 1 holds its worker (and the key's state) through shutdown_now.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started) = std::sync::mpsc::channel::<()>();
    let blocker = s
        .submit_with_state(1, move |v: &mut Vec<u32>| {
            v.push(2);
            started_tx.send(()).unwrap();
            rx.recv().ok();
            v.push(3);
        })
        .unwrap();
    // (Not `key_stats(&1).running`: the first task's flag may still be up a moment after its
    // handle resolved.)
    started.recv_timeout(LONG).unwrap();
    let h4 = s
        .submit_with_state(1, |v: &mut Vec<u32>| {
            v.push(4);
            v.clone()
        })
        .unwrap();
    let l = log.clone();
    let plain = s.submit(1, move || push(&l, "plain 1".into())).unwrap();
    let h5 = s
        .submit_with_state(1, |v: &mut Vec<u32>| {
            v.push(5);
            v.clone()
        })
        .unwrap();
    let back = s.shutdown_now();
    assert_eq!(back.len(), 3, "{back:?} {log:?}");
    assert!(back.iter().all(|p| p.key() == Some(&1)));
    let mut back = back.into_iter();
    // Run from another thread before the running task returned: it waits for the key's state.
    let first = back.next().unwrap();
    let runner = std::thread::spawn(move || first.run());
    std::thread::sleep(Duration::from_millis(50));
    assert!(!h4.is_finished(), "waits for the key's running task");
    tx.send(()).unwrap();
    blocker.join().unwrap();
    runner.join().unwrap();
    assert_eq!(
        h4.join().unwrap(),
        [1, 2, 3, 4],
        "the same state, continued"
    );
    assert!(s.await_termination(LONG));
    assert!(
        releases(&log, 1).is_empty(),
        "not at termination: tasks still hold it"
    );
    back.next().unwrap().run();
    plain.join().unwrap();
    assert!(releases(&log, 1).is_empty());
    back.next().unwrap().run();
    assert_eq!(h5.join().unwrap(), [1, 2, 3, 4, 5]);
    assert_eq!(releases(&log, 1), ["release 1 [1, 2, 3, 4, 5]"]);
    drop(s);
    assert_eq!(releases(&log, 1).len(), 1, "released exactly once");
    assert_eq!(count(&log, "init 1"), 1);
}

#[test]
fn shutdown_now_keeps_the_state_alive_for_dropped_and_plain_tasks_until_the_last_is_gone() {
    let log = Log::default();
    let s = ledger_with(&log, LONG, 1);
    s.submit_with_state(1, |v: &mut Vec<u32>| v.push(1))
        .unwrap()
        .join()
        .unwrap();
    // The only worker is held by another key: key 1's tasks stay where they were submitted,
    // and its state idle in its entry.
    let gate = block_worker(&s, 99);
    let h2 = s
        .submit_with_state(1, |v: &mut Vec<u32>| {
            v.push(2);
            v.clone()
        })
        .unwrap();
    let l = log.clone();
    let plain = s.submit(1, move || push(&l, "plain 1".into())).unwrap();
    let h3 = s
        .submit_with_state(1, |v: &mut Vec<u32>| {
            v.push(3);
            v.clone()
        })
        .unwrap();
    let mut back: Vec<_> = s
        .shutdown_now()
        .into_iter()
        .filter(|p| p.key() == Some(&1))
        .collect();
    drop(gate);
    assert!(s.await_termination(LONG));
    assert_eq!(back.len(), 3);
    assert!(
        releases(&log, 1).is_empty(),
        "held by the handed-back tasks"
    );
    let last_state = back.pop().unwrap();
    let plain_task = back.pop().unwrap();
    back.pop().unwrap().run();
    assert_eq!(h2.join().unwrap(), [1, 2], "the key's state, continued");
    drop(last_state);
    assert!(matches!(h3.join(), Err(TaskError::Cancelled)));
    assert!(
        releases(&log, 1).is_empty(),
        "a plain task of the key still keeps it"
    );
    plain_task.run();
    plain.join().unwrap();
    assert_eq!(releases(&log, 1), ["release 1 [1, 2]"]);
    drop(s);
    assert_eq!(releases(&log, 1).len(), 1, "released exactly once");
    assert_eq!(count(&log, "init 1"), 1);
}

#[test]
fn dropping_every_task_handed_back_by_shutdown_now_releases_the_state_once() {
    let log = Log::default();
    let s = ledger_with(&log, LONG, 1);
    s.submit_with_state(1, |v: &mut Vec<u32>| v.push(1))
        .unwrap()
        .join()
        .unwrap();
    let gate = block_worker(&s, 99);
    for i in 2..5 {
        drop(
            s.submit_with_state(1, move |v: &mut Vec<u32>| v.push(i))
                .unwrap(),
        );
    }
    let back = s.shutdown_now();
    drop(gate);
    assert!(s.await_termination(LONG));
    assert!(releases(&log, 1).is_empty());
    drop(back);
    assert_eq!(releases(&log, 1), ["release 1 [1]"]);
    drop(s);
    assert_eq!(releases(&log, 1).len(), 1);
}

#[test]
fn a_state_task_handed_back_by_cancel_key_runs_against_the_keys_live_state() {
    let log = Log::default();
    let s = ledger(&log, LONG);
    s.submit_with_state(1, |v: &mut Vec<u32>| v.push(1))
        .unwrap()
        .join()
        .unwrap();
    s.pause(&1);
    let h2 = s
        .submit_with_state(1, |v: &mut Vec<u32>| {
            v.push(2);
            v.clone()
        })
        .unwrap();
    let h3 = s
        .submit_with_state(1, |v: &mut Vec<u32>| {
            v.push(3);
            v.clone()
        })
        .unwrap();
    let back = s.cancel_key(&1);
    assert_eq!(back.len(), 2);
    let mut back = back.into_iter();
    back.next().unwrap().run();
    assert_eq!(h2.join().unwrap(), [1, 2], "the key's state, live");
    assert!(s.key_stats(&1).unwrap().paused, "still paused");
    s.resume(&1);
    // A running task of the key: the handed-back one waits for it.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, started) = std::sync::mpsc::channel::<()>();
    let blocker = s
        .submit_with_state(1, move |v: &mut Vec<u32>| {
            v.push(4);
            started_tx.send(()).unwrap();
            rx.recv().ok();
            v.push(5);
        })
        .unwrap();
    started.recv_timeout(LONG).unwrap();
    let third = back.next().unwrap();
    let runner = std::thread::spawn(move || third.run());
    std::thread::sleep(Duration::from_millis(50));
    assert!(!h3.is_finished(), "exclusive with the key's running task");
    tx.send(()).unwrap();
    blocker.join().unwrap();
    runner.join().unwrap();
    assert_eq!(h3.join().unwrap(), [1, 2, 4, 5, 3]);
    let later = s
        .submit_with_state(1, |v: &mut Vec<u32>| v.clone())
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(later, [1, 2, 4, 5, 3], "the key's tasks see what it did");
    drop(s);
    assert_eq!(releases(&log, 1), ["release 1 [1, 2, 4, 5, 3]"]);
    assert_eq!(count(&log, "init 1"), 1);
}

#[test]
fn a_state_task_handed_back_by_cancel_key_after_its_key_was_released_gets_a_fresh_state() {
    let log = Log::default();
    let s = ledger(&log, Duration::from_millis(10));
    s.submit_with_state(1, |v: &mut Vec<u32>| v.push(0))
        .unwrap()
        .join()
        .unwrap();
    s.pause(&1);
    let h = s
        .submit_with_state(1, |v: &mut Vec<u32>| {
            v.push(1);
            v.clone()
        })
        .unwrap();
    let back = s.cancel_key(&1);
    assert_eq!(back.len(), 1);
    s.resume(&1);
    assert!(wait_until(LONG, || releases(&log, 1).len() == 1));
    assert!(wait_until(LONG, || s.key_stats(&1).is_none()));
    back.into_iter().for_each(|p| p.run());
    assert_eq!(h.join().unwrap(), [1], "a fresh state from init");
    assert!(wait_until(LONG, || releases(&log, 1).len() == 2));
    drop(s);
    assert_eq!(releases(&log, 1), ["release 1 [0]", "release 1 [1]"]);
    assert_eq!(count(&log, "init 1"), 2);
}

#[test]
fn a_handed_back_state_task_run_inside_its_own_keys_task_fails_instead_of_hanging() {
    let log = Log::default();
    let s = Arc::new(ledger(&log, LONG));
    s.pause(&1);
    let h = s
        .submit_with_state(1, |v: &mut Vec<u32>| v.push(1))
        .unwrap();
    let back = s.cancel_key(&1);
    s.resume(&1);
    let inner = s
        .submit_with_state(1, move |_: &mut Vec<u32>| {
            back.into_iter().for_each(|p| p.run());
        })
        .unwrap();
    inner.join().unwrap();
    assert!(matches!(h.join(), Err(TaskError::Panicked(_))));
}

#[test]
fn many_keys_count_without_a_lock_and_every_state_is_released_once() {
    const KEYS: u32 = 64;
    const PER_KEY: u32 = 200;
    let released = Arc::new(Mutex::new(Vec::new()));
    let r = released.clone();
    let s = Arc::new(
        Builder::<u32>::new()
            .workers(2)
            .key_idle_timeout(Duration::from_millis(1))
            .key_state(|_| 0u64)
            .on_key_release(move |k, n| r.lock().unwrap().push((k, n)))
            .build()
            .unwrap(),
    );
    let submitters: Vec<_> = (0..2)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for _ in 0..PER_KEY {
                    for k in (t * KEYS / 2)..((t + 1) * KEYS / 2) {
                        drop(s.submit_with_state(k, |n: &mut u64| *n += 1).unwrap());
                    }
                }
            })
        })
        .collect();
    for t in submitters {
        t.join().unwrap();
    }
    let s = Arc::into_inner(s).unwrap();
    drop(s);
    // Keys may have been released (and started afresh) several times: the released counts of
    // each key add up to its tasks.
    let mut per_key = vec![0u64; KEYS as usize];
    for (k, n) in released.lock().unwrap().iter() {
        per_key[*k as usize] += n;
    }
    assert!(
        per_key.iter().all(|&n| n == u64::from(PER_KEY)),
        "{per_key:?}"
    );
}
