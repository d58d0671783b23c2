//! `submit_async` with Cargo feature `tokio`: workers enter the given runtime's context while
//! they poll, so tokio's timers and sockets work inside the futures, in each key's order.
#![cfg(feature = "tokio")]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keyserial::Builder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn tokio_timers_work_inside_futures_and_keep_each_keys_order() {
    let rt = runtime();
    // One worker: if a sleeping future held it, the keys' sleeps would add up.
    let s = Builder::<u32>::new()
        .workers(1)
        .tokio_handle(rt.handle().clone())
        .build()
        .unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut handles = Vec::new();
    for key in 0..8u32 {
        for i in 0..3u32 {
            let log = log.clone();
            // Later tasks sleep less: only the key's order keeps them in submission order.
            let ms = 25 - 10 * i as u64;
            handles.push(
                s.submit_async(key, async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    log.lock().unwrap().push((key, i));
                })
                .unwrap(),
            );
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    let elapsed = start.elapsed();
    let log = log.lock().unwrap();
    for key in 0..8u32 {
        let seen: Vec<u32> = log
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|&(_, i)| i)
            .collect();
        assert_eq!(seen, [0, 1, 2], "key {key} in order");
    }
    // Each key sleeps 45 ms in all, the 8 keys side by side on the one worker: about 45 ms.
    // Holding the worker while asleep would take 8 x 45 = 360 ms.
    assert!(elapsed < Duration::from_millis(250), "{elapsed:?}");
}

#[test]
fn a_loopback_tcp_echo_inside_a_keys_future() {
    let rt = runtime();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let server = rt.spawn(async move {
        for _ in 0..3 {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 64];
            let n = sock.read(&mut buf).await.unwrap();
            sock.write_all(&buf[..n]).await.unwrap();
        }
    });
    let s = Builder::<&str>::new()
        .workers(1)
        .tokio_handle(rt.handle().clone())
        .build()
        .unwrap();
    let handles: Vec<_> = ["one", "two", "three"]
        .into_iter()
        .map(|msg| {
            s.submit_async("conn", async move {
                let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
                c.write_all(msg.as_bytes()).await.unwrap();
                let mut back = Vec::new();
                c.read_to_end(&mut back).await.unwrap();
                String::from_utf8(back).unwrap()
            })
            .unwrap()
        })
        .collect();
    let echoed: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(echoed, ["one", "two", "three"]);
    rt.block_on(server).unwrap();
}

/// Issue "Async": built inside a runtime without `tokio_handle`, a serializer uses that runtime
/// (its futures may sleep on tokio's timer); dropped on the runtime's only thread while a queued
/// future still needs that thread's timer, the drop returns at once and the future completes.
/// (Before: every future failed "there is no reactor running", and such a drop hung.)
#[tokio::test(flavor = "current_thread")]
async fn a_serializer_built_in_a_runtime_uses_it_and_its_drop_never_blocks_it() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let first = s
        .submit_async(1, async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            "slept"
        })
        .unwrap();
    assert_eq!(first.await.unwrap(), "slept");
    let queued: Vec<_> = (0..3u64)
        .map(|i| {
            s.submit_async(2, async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                i
            })
            .unwrap()
        })
        .collect();
    let start = Instant::now();
    drop(s);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "the drop blocked the runtime"
    );
    for (i, h) in queued.into_iter().enumerate() {
        assert_eq!(
            h.await.unwrap(),
            i as u64,
            "queued futures finish after the drop"
        );
    }
}

/// Issue "Async": `terminated().await` resolves once the serializer terminated, without
/// blocking the runtime's only thread (its queued futures need that thread's timer meanwhile);
/// a second waiter and a dropped, re-made one are woken too.
#[tokio::test(flavor = "current_thread")]
async fn terminated_resolves_without_blocking_the_runtime() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let hs: Vec<_> = (0..4u32)
        .map(|k| {
            s.submit_async(k, async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                k
            })
            .unwrap()
        })
        .collect();
    // A waiter dropped before termination leaves nothing that matters behind.
    let early = tokio::time::timeout(Duration::from_millis(1), s.terminated()).await;
    assert!(early.is_err(), "not shut down yet");
    s.shutdown();
    let (a, b) = tokio::join!(s.terminated(), s.terminated());
    let _ = (a, b);
    assert!(s.is_terminated());
    for (k, h) in hs.into_iter().enumerate() {
        assert_eq!(h.await.unwrap(), k as u32);
    }
    s.terminated().await; // at once, once terminated
}
