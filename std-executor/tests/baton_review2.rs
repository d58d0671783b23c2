//! Issue "Baton", a second review of caa55a4..cf5c166: reproductions of what it found, public
//! API only. A call that may hang runs on a thread of its own, watched with a timeout, so that
//! the test fails instead of hanging (the hung thread is left behind).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

/// Where the hook finds its serializer.
type Slot = Mutex<Option<Arc<Serializer<u32, u32>>>>;

use keyserial::{Builder, Serializer};

mod common;
use common::within;

/// How long a call that should return at once may take before it counts as hung.
const HANG: Duration = Duration::from_secs(3);

/// Finding 1 (handed_back.rs `give_back`, 4096e91). At a graceful shutdown, a state task that
/// `cancel_key` handed back, run by `PendingTask::run`, releases its key's state through the
/// hook itself (`give_back`: chain empty, not paused), with the holder `RUNNING` and the key's
/// chain baton still held, but without `running_here` (HELD_HERE is popped before
/// `give_back`). A `cancel_key` of the key from inside that hook is then neither `Mine` nor
/// able to take the baton: it registers a second outside holder and `hold_chain` waits without
/// bound (not on a worker) for a baton its own thread holds. `PendingTask::run` never returns.
#[test]
fn cancel_key_from_the_release_hook_of_a_handed_back_run_returns() {
    static S: OnceLock<Slot> = OnceLock::new();
    let slot = S.get_or_init(|| Mutex::new(None));
    let hooked = Arc::new(AtomicUsize::new(0));
    let h2 = hooked.clone();
    let s: Arc<Serializer<u32, u32>> = Arc::new(
        Builder::<u32>::new()
            .workers(2)
            .key_idle_timeout(Duration::from_secs(60))
            .key_state(|_| 0u32)
            .on_key_release(move |k, _st| {
                h2.fetch_add(1, SeqCst);
                // R2_CONTROL set: the same hook without the call (the test then passes).
                if k == 1 && std::env::var_os("R2_CONTROL").is_none() {
                    let s = S.get().unwrap().lock().unwrap().clone();
                    if let Some(s) = s {
                        let back = s.cancel_key(&1);
                        assert!(back.is_empty());
                    }
                }
            })
            .build()
            .unwrap(),
    );
    *slot.lock().unwrap() = Some(s.clone());
    // The key's state exists (and stays: no idle release for a minute).
    assert_eq!(
        s.submit_with_state(1, |n: &mut u32| {
            *n += 1;
            *n
        })
        .unwrap()
        .join()
        .unwrap(),
        1
    );
    // A state task of key 1 handed back by cancel_key.
    s.pause(&1);
    let h = s
        .submit_with_state(1, |n: &mut u32| {
            *n += 1;
            *n
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let mut back = s.cancel_key(&1);
    s.resume(&1);
    assert_eq!(back.len(), 1);
    // Keep the serializer from terminating (a handed-back run after termination runs fresh).
    let tx = common::block_worker(&s, 2);
    s.shutdown();
    let p = back.pop().unwrap();
    let ran = within(HANG, move || p.run());
    let _ = tx.send(());
    *slot.lock().unwrap() = None;
    assert!(
        ran.is_some(),
        "PendingTask::run hung: the release hook it ran at a graceful shutdown called \
         cancel_key of its key, which waits for the baton its own thread holds (hooks run: {})",
        hooked.load(SeqCst)
    );
    assert_eq!(h.join().unwrap(), 2, "ran against the key's state");
}

/// Finding 2 (worker/park.rs `should_exit_on_shutdown`, 8f84fab). At a graceful shutdown a
/// worker cancels a paused key's queued tasks `BUSY` (`cancel_paused`), and so drops the
/// user's closures (user `Drop` code) while `BUSY`. A `Drop` that calls `shutdown_now` (here on
/// the worker's own thread) then waits in `Phase::stop` for its own slot to leave `BUSY`:
/// forever. The serializer never terminates. Before 8f84fab the drop ran `IDLE` and returned.
/// (A `Drop` that merely blocks on something a concurrent `shutdown_now` caller holds
/// deadlocks the same way.)
#[test]
fn shutdown_now_from_the_drop_of_a_paused_keys_cancelled_task_returns() {
    struct Guard(Arc<Serializer<u32>>, Arc<AtomicUsize>);
    impl Drop for Guard {
        fn drop(&mut self) {
            // R2_CONTROL set: the same drop without the call (the test then passes).
            if std::env::var_os("R2_CONTROL").is_some() {
                self.1.fetch_add(1, SeqCst);
                return;
            }
            let back = self.0.shutdown_now();
            drop(back);
            self.1.fetch_add(1, SeqCst);
        }
    }
    let s: Arc<Serializer<u32>> = Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
    let dropped = Arc::new(AtomicUsize::new(0));
    s.pause(&1);
    let g = Guard(s.clone(), dropped.clone());
    let h = s
        .submit(1, move || {
            let _g = &g;
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(30));
    s.shutdown();
    let s2 = s.clone();
    let terminated = within(Duration::from_secs(10), move || {
        s2.await_termination(Duration::from_secs(5))
    });
    assert_eq!(
        terminated,
        Some(true),
        "the serializer did not terminate: a cancelled paused task's Drop called shutdown_now \
         on the worker that was cancelling it BUSY (drops done: {})",
        dropped.load(SeqCst)
    );
    assert_eq!(dropped.load(SeqCst), 1);
    assert!(matches!(h.join(), Err(keyserial::TaskError::Cancelled)));
}

/// A future that blocks its worker in `poll` until told to go on.
struct Blocking(Mutex<mpsc::Receiver<()>>, Arc<AtomicUsize>);
impl Future for Blocking {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        self.1.fetch_add(1, SeqCst);
        let _ = self.0.lock().unwrap().recv();
        Poll::Ready(())
    }
}

/// Finding 3 (key_control.rs `release_paused_states`, 09cedda). An exiting worker (here: one
/// woken by `shutdown_now`) takes a paused key's state out of its entry under `pause_sweep`,
/// parks the chain again and runs the hook *after* letting go. A `shutdown_now` that takes the
/// pause's wait in between hands the key's queued state task back with no state (the cell is
/// empty), and `PendingTask::run` makes a new state with `init` while the old state's hook is
/// still running: DESIGN 3.1b, "A new state for the key is made only after the old one's hook
/// returned". (The task also runs against a fresh state instead of the key's.) Widened here by
/// a `shutdown_now` slowed in its step 1 (it hands back many futures queued behind a running
/// one) and a slow hook.
#[test]
fn a_paused_keys_state_is_hooked_before_a_new_one_is_made_at_shutdown_now() {
    let mut seen = Vec::new();
    for round in 0..6 {
        let hook_started = Arc::new(AtomicUsize::new(0));
        let hook_done = Arc::new(AtomicUsize::new(0));
        let inits = Arc::new(AtomicUsize::new(0));
        let early = Arc::new(AtomicUsize::new(0));
        let (hs, hd, i2, e2) = (
            hook_started.clone(),
            hook_done.clone(),
            inits.clone(),
            early.clone(),
        );
        let (hs2, hd2) = (hook_started.clone(), hook_done.clone());
        let s: Serializer<u32, u32> = Builder::<u32>::new()
            .workers(2)
            .key_idle_timeout(Duration::from_secs(60))
            .capacity(1 << 20)
            .key_state(move |k: &u32| {
                if *k == 1 {
                    i2.fetch_add(1, SeqCst);
                    if hs2.load(SeqCst) > hd2.load(SeqCst) {
                        e2.fetch_add(1, SeqCst); // the old state's hook has not returned
                    }
                }
                0u32
            })
            .on_key_release(move |k, _| {
                if k == 1 {
                    hs.fetch_add(1, SeqCst);
                    std::thread::sleep(Duration::from_millis(300));
                    hd.fetch_add(1, SeqCst);
                }
            })
            .build()
            .unwrap();
        assert_eq!(
            s.submit_with_state(1, |n: &mut u32| {
                *n += 1;
                *n
            })
            .unwrap()
            .join()
            .unwrap(),
            1
        );
        s.pause(&1);
        let t1 = s
            .submit_with_state(1, |n: &mut u32| {
                *n += 1;
                *n
            })
            .unwrap();
        // Key 2: a future that holds a worker, many queued behind it on the key's chain.
        let (tx, rx) = mpsc::channel::<()>();
        let polled = Arc::new(AtomicUsize::new(0));
        let _b = s
            .submit_async(2, Blocking(Mutex::new(rx), polled.clone()))
            .unwrap();
        assert!(common::wait_until(Duration::from_secs(5), || polled
            .load(SeqCst)
            == 1));
        for _ in 0..60_000 {
            std::mem::forget(s.submit_async(2, async {}).unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
        let back = s.shutdown_now();
        let _ = tx.send(());
        let mut ran = 0;
        for p in back {
            if p.key() == Some(&1) {
                p.run();
                ran += 1;
            }
        }
        let r = t1.join();
        drop(s);
        seen.push((
            round,
            ran,
            inits.load(SeqCst),
            early.load(SeqCst),
            format!("{r:?}"),
        ));
        if early.load(SeqCst) != 0 {
            break;
        }
    }
    assert!(
        seen.iter().all(|s| s.3 == 0),
        "a new state of key 1 was made (init) while its old state's hook was still running: \
         (round, key-1 tasks handed back, inits, inits during the hook, t1) = {seen:?}"
    );
}
