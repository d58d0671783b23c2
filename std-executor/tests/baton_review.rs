//! Issue "Baton", from a review of the outside-holds change (`baton.rs`): reproductions of what
//! it found (each failed on the change as first written, the first and last; or already on 84c9b8b), public API
//! only. A call that may hang runs on a thread of its own, watched with a timeout, so that the
//! test fails instead of hanging (the hung thread is left behind).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keyserial::{Builder, PendingTask, Serializer, TaskError};

mod common;
use common::within;

/// A state task, boxed.
type StateTask = Box<dyn FnOnce(&mut u32) -> u32 + Send>;

/// How long a call that should return at once may take before it counts as hung.
const HANG: Duration = Duration::from_secs(3);

struct Probe(Arc<AtomicUsize>);
impl Drop for Probe {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

type S = Arc<Serializer<u32, u32>>;

fn state_serializer() -> S {
    Arc::new(
        Builder::<u32>::new()
            .workers(2)
            .key_state(|_| 0u32)
            .build()
            .unwrap(),
    )
}

/// Hands back `tasks` state tasks of key 1 with `cancel_key` (queued behind a pause), then
/// resumes the key. The returned tasks run through `handed_back.rs` (an outside holder).
fn handed_back_state_tasks(
    s: &S,
    tasks: Vec<StateTask>,
) -> (Vec<PendingTask<u32>>, Vec<keyserial::TaskHandle<u32>>) {
    s.pause(&1);
    let hs: Vec<_> = tasks
        .into_iter()
        .map(|t| s.submit_with_state(1, t).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(30)); // let a worker route them onto the chain
    let back = s.cancel_key(&1);
    s.resume(&1);
    (back, hs)
}

/// Finding 1. `shutdown_now` called from inside a state task that `cancel_key` handed back
/// (run by `PendingTask::run`, an outside holder `RUNNING` with the key's chain) steals the
/// chain from that very holder (`stop_all`); the key's state task queued behind it is handed
/// back with a holder *lent* to "slot `usize::MAX`" (`drain_queued_into`, `take_lent`). Running
/// that task from inside the running one (same thread) waits on the holder's condvar for the
/// state that only this thread gives back, after it returns: `KeyStateHold::run`'s
/// "would wait for itself" check compares `current_slot(id) == Some(slot)`, which never
/// matches `usize::MAX` (and is `None` off a worker). The same nesting on a worker fails the
/// task `Panicked` instead.
#[test]
fn shutdown_now_inside_a_handed_back_run_then_the_keys_next_state_task_fails_instead_of_hanging() {
    let s = state_serializer();
    let s2 = s.clone();
    let (report_tx, report_rx) = mpsc::channel::<(usize, &'static str)>();
    let a: Box<dyn FnOnce(&mut u32) -> u32 + Send> = Box::new(move |n: &mut u32| {
        *n += 1;
        // Queued behind us on the key's (held) chain.
        let b = s2.submit_with_state(1, |n: &mut u32| {
            *n += 10;
            *n
        });
        std::thread::sleep(Duration::from_millis(30));
        let back = s2.shutdown_now();
        let len = back.len();
        report_tx.send((len, "shutdown_now returned")).unwrap();
        for p in back {
            p.run(); // the key's state task: hangs here
        }
        report_tx.send((len, "ran what came back")).unwrap();
        drop(b);
        *n
    });
    let (mut back, _hs) = handed_back_state_tasks(&s, vec![a]);
    assert_eq!(back.len(), 1, "cancel_key hands back the state task");
    let p = back.pop().unwrap();
    let ran = within(HANG, move || p.run());
    let msgs: Vec<_> = report_rx.try_iter().collect();
    assert!(
        ran.is_some(),
        "PendingTask::run of a cancel_key-handed-back state task hung: it called shutdown_now \
         and ran the key's state task that came back ({msgs:?})"
    );
}

/// Finding 2. `cancel_key(&k)` from inside a state task of `k` that `cancel_key` handed back,
/// run on a thread that is not a worker: the module docs say "from inside that very task it
/// takes the queue at once", but `owns_chain_here` only recognises a worker's slot, so the
/// inner `cancel_key` registers a second outside holder and `hold_chain` waits, without bound
/// (not on a worker), for the baton the same thread holds.
#[test]
fn cancel_key_inside_a_handed_back_state_task_of_its_key_returns() {
    let s = state_serializer();
    let s2 = s.clone();
    let (report_tx, report_rx) = mpsc::channel::<usize>();
    let dropped = Arc::new(AtomicUsize::new(0));
    let probe = Probe(dropped.clone());
    let a: Box<dyn FnOnce(&mut u32) -> u32 + Send> = Box::new(move |n: &mut u32| {
        let x = s2
            .submit(1, move || {
                let _p = probe;
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let got = s2.cancel_key(&1);
        report_tx.send(got.len()).unwrap();
        drop(got);
        let _ = x.join();
        *n
    });
    let (mut back, _hs) = handed_back_state_tasks(&s, vec![a]);
    assert_eq!(back.len(), 1);
    let p = back.pop().unwrap();
    let ran = within(HANG, move || p.run());
    assert!(
        ran.is_some(),
        "cancel_key from inside a handed-back state task of the same key hung (inner \
         cancel_key returned: {:?})",
        report_rx.try_recv().ok()
    );
    assert_eq!(report_rx.try_recv().ok(), Some(1));
    assert_eq!(dropped.load(SeqCst), 1);
}

/// Finding 3. `PendingTask::run` of a state task that `cancel_key` handed back, from inside
/// another handed-back state task of the same key, off a worker: handed_back.rs documents
/// "from inside a task of its own key (the chain's owner on this thread) it could only wait for
/// itself; [it fails] the task Panicked", but the check (`owns_chain_here`) only sees a
/// worker's slot: the nested run's `hold_chain` waits without bound for the outer run's baton.
#[test]
fn a_nested_run_of_a_handed_back_state_task_of_the_same_key_fails_instead_of_hanging() {
    let s = state_serializer();
    let inner: Arc<Mutex<Option<PendingTask<u32>>>> = Arc::new(Mutex::new(None));
    let inner2 = inner.clone();
    let a: Box<dyn FnOnce(&mut u32) -> u32 + Send> = Box::new(move |n: &mut u32| {
        *n += 1;
        let b = inner2.lock().unwrap().take().expect("B handed over");
        b.run(); // expected: fails B Panicked ("would wait for itself"); hangs
        *n
    });
    let b: Box<dyn FnOnce(&mut u32) -> u32 + Send> = Box::new(|n: &mut u32| {
        *n += 10;
        *n
    });
    let (back, hs) = handed_back_state_tasks(&s, vec![a, b]);
    assert_eq!(back.len(), 2);
    let mut back = back.into_iter();
    let pa = back.next().unwrap();
    *inner.lock().unwrap() = back.next();
    let ran = within(HANG, move || pa.run());
    assert!(
        ran.is_some(),
        "a handed-back state task run from inside another of its key hung"
    );
    let mut hs = hs.into_iter();
    assert_eq!(hs.next().unwrap().join().ok(), Some(1));
    assert!(matches!(
        hs.next().unwrap().join(),
        Err(TaskError::Panicked(_))
    ));
}

/// Finding 4. At a graceful shutdown, a handed-back state task's run ends in `give_back`,
/// which releases the (empty, unpaused) key through `release_drained` and so calls the user's
/// `on_key_release` hook while the holder is still `BUSY`. A `shutdown_now` meanwhile
/// (`stop_all` -> `Phase::stop`) spins until the hook returns: here 1.5 s for a "stop at
/// once", and for good if the hook waits for anything that `shutdown_now` returning would
/// bring (or calls `shutdown_now` itself).
#[test]
fn shutdown_now_does_not_wait_for_a_release_hook_run_by_a_handed_back_run() {
    let (in_hook_tx, in_hook_rx) = mpsc::channel::<()>();
    let in_hook_tx = Mutex::new(in_hook_tx);
    let released = Arc::new(AtomicUsize::new(0));
    let rel = released.clone();
    let s: S = Arc::new(
        Builder::<u32>::new()
            .workers(2)
            .key_state(|_| 0u32)
            .on_key_release(move |_k, _st| {
                let _ = in_hook_tx.lock().unwrap().send(());
                std::thread::sleep(Duration::from_millis(1500));
                rel.fetch_add(1, SeqCst);
            })
            .build()
            .unwrap(),
    );
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let a: Box<dyn FnOnce(&mut u32) -> u32 + Send> = Box::new(move |n: &mut u32| {
        let _ = go_rx.recv();
        *n += 1;
        *n
    });
    let (mut back, hs) = handed_back_state_tasks(&s, vec![a]);
    assert_eq!(back.len(), 1);
    let p = back.pop().unwrap();
    let runner = std::thread::spawn(move || p.run());
    std::thread::sleep(Duration::from_millis(30));
    s.shutdown();
    go_tx.send(()).unwrap();
    in_hook_rx
        .recv_timeout(HANG)
        .expect("the hook runs at the run's give-back");
    let t0 = Instant::now();
    let s2 = s.clone();
    let back = within(HANG, move || s2.shutdown_now().len());
    let took = t0.elapsed();
    runner.join().unwrap();
    assert_eq!(back, Some(0));
    assert_eq!(hs.into_iter().next().unwrap().join().ok(), Some(1));
    assert_eq!(released.load(SeqCst), 1);
    assert!(
        took < Duration::from_millis(500),
        "shutdown_now took {took:?}: it waited for the user's release hook"
    );
}
