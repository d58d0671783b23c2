//! Helpers shared by the integration tests (each test file includes this with `mod common;`).
#![allow(dead_code)] // each test file uses only some of them

use std::hash::Hash;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use keyserial::Serializer;

/// Polls `f` every millisecond until it holds or `timeout` passes; whether it held.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    f()
}

/// Occupies a worker with a task of `key` until the returned sender is used or dropped (waits
/// until the task is running).
pub fn block_worker<K, S>(s: &Serializer<K, S>, key: K) -> mpsc::Sender<()>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: Send + 'static,
{
    let (tx, rx) = mpsc::channel::<()>();
    let before = s.stats().running;
    s.execute(key, move || {
        let _ = rx.recv();
    })
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || s.stats().running > before),
        "the blocking task started"
    );
    tx
}

/// Runs `f` on a thread of its own; its result, or `None` if it did not return within `limit`
/// (a call that may hang fails its test instead of hanging it; the hung thread is left behind).
pub fn within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}
