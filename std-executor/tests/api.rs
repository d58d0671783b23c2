//! The public API's rough edges: huge timeouts, errors usable with `?`, matchable build errors,
//! bounded shutdown, and the documented ways to share a serializer.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use keyserial::{Builder, Serializer};

fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        thread::sleep(Duration::from_millis(1));
    }
    f()
}

/// Occupies a worker with a task of `key` until the returned sender is used or dropped.
fn block_worker(s: &Serializer<u32>, key: u32) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let before = s.stats().running;
    s.execute(key, move || {
        let _ = rx.recv();
    })
    .unwrap();
    assert!(wait_until(Duration::from_secs(5), || s.stats().running > before));
    tx
}

#[test]
fn await_termination_with_duration_max_waits_without_bound() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let release = block_worker(&s, 1);
    let queued = s.submit(1, || 7).unwrap();
    s.shutdown();
    let opener = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        release.send(()).unwrap();
    });
    // Used to panic: "overflow when adding duration to instant".
    assert!(s.await_termination(Duration::MAX));
    assert!(s.is_terminated());
    assert_eq!(queued.join().unwrap(), 7);
    // Already terminated: returns at once, whatever the timeout.
    assert!(s.await_termination(Duration::MAX));
    assert!(s.await_termination(Duration::ZERO));
    opener.join().unwrap();
}
