//! A tokio-based per-user request handler: every request awaits a simulated I/O call (a tokio
//! timer), each user's requests are handled in arrival order, users in parallel, and no worker
//! thread is held while a request waits for its I/O.
//!
//! Run with `cargo run --release -p keyserial --features tokio --example async_requests`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keyserial::Builder;

/// A simulated I/O call: a database round trip of `ms` milliseconds.
async fn save(user: u32, request: u32, ms: u64) -> (u32, u32) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    (user, request)
}

fn main() {
    // The runtime whose reactor the futures' timers and sockets use; keyserial's workers poll the
    // futures and enter this runtime's context while they do.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("start tokio");
    let s = Builder::<u32>::new()
        .thread_name("async-requests")
        .tokio_handle(rt.handle().clone())
        .build()
        .expect("start the serializer");

    let log: Arc<Mutex<HashMap<u32, Vec<u32>>>> = Default::default();
    let started = Instant::now();
    let mut handles = Vec::new();
    // 200 users, 10 requests each, interleaved as they would arrive; a later request of a user
    // waits less, so only the per-user order keeps them in arrival order.
    for request in 0..10u32 {
        for user in 0..200u32 {
            let log = log.clone();
            let ms = 10 - u64::from(request);
            handles.push(
                s.submit_async(user, async move {
                    let (user, request) = save(user, request, ms).await;
                    log.lock().unwrap().entry(user).or_default().push(request);
                })
                .expect("submit"),
            );
        }
    }
    for h in handles {
        h.join().expect("a request failed");
    }
    let elapsed = started.elapsed();
    let log = log.lock().unwrap();
    let in_order = log.values().all(|r| r.windows(2).all(|w| w[0] < w[1]));
    println!(
        "{} users x 10 requests, each awaiting 1-10 ms of I/O: {:.0?} on {} workers; every \
         user's requests in arrival order: {in_order}",
        log.len(),
        elapsed,
        s.stats().workers,
    );
    println!(
        "(holding a worker per waiting request, 2,000 requests of 5.5 ms on average would take \
         about {:.0?})",
        Duration::from_micros(2_000 * 5_500 / s.stats().workers as u64)
    );
    assert!(in_order, "per-user order was broken");
}
