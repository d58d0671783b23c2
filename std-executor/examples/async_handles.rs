//! Awaiting task handles: a `TaskHandle` is a `Future`, so async code can submit blocking work
//! per key and `.await` the results under any executor. This example uses a ten-line `block_on`
//! so it needs no async runtime.
//!
//! Run with `cargo run -p keyserial --example async_handles`.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use keyserial::{Serializer, TaskError};

/// Runs a future to completion on this thread, parking while it is pending.
fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

async fn handle_device(s: &Serializer<String>, device: &str) -> Result<u64, TaskError> {
    // Three events of one device: they run in order, and we await each one.
    let mut total = 0;
    for reading in 1..=3u64 {
        let d = device.to_string();
        total += s
            .submit(device.to_string(), move || {
                // Blocking work (parsing, a database write...) runs on keyserial's threads.
                let _ = d;
                reading * 10
            })
            .expect("serializer running")
            .await?;
    }
    Ok(total)
}

fn main() {
    let s: Serializer<String> = Serializer::new();
    let results = block_on(async {
        let a = handle_device(&s, "sensor-a").await;
        let b = handle_device(&s, "sensor-b").await;
        // A panicking task resolves its handle with the panic; the key goes on.
        let failed = s
            .submit("sensor-c".to_string(), || -> u64 { panic!("bad frame") })
            .unwrap()
            .await;
        (a, b, failed)
    });
    assert_eq!(results.0.unwrap(), 60);
    assert_eq!(results.1.unwrap(), 60);
    let err = results.2.unwrap_err();
    println!("sensor-a: 60, sensor-b: 60, sensor-c failed: {err}");
}
