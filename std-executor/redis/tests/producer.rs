//! The producer against a real `redis-server` started by the test (see `common`): a retried
//! append is never stored twice, also when the server stalls (SIGSTOP) mid-batch, and
//! `max_len` trims approximately.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{signal, wait_until, xrange, RedisServer};
use keyserial_redis::{Event, Producer};

/// 30,000 entries in batches of 500 over 8 partitions while the server is stopped three times
/// for 1 s, longer than the producer's command timeout (300 ms): each stall loses a reply and
/// the batch is sent again. Every entry is stored exactly once, in send order per partition,
/// with the IDs `send_batch` returned.
#[test]
fn retried_appends_are_stored_once_across_stalls() {
    const ENTRIES: usize = 30_000;
    const P: u32 = 8;
    let server = RedisServer::start();
    let url = server.url();
    let sent = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let f2 = Arc::clone(&failures);
    let mut producer = Producer::connect(&url, "ps", P)
        .unwrap()
        .command_timeout(Duration::from_millis(300))
        .on_event(move |e| {
            if matches!(e, Event::ConnectionFailed { .. }) {
                f2.fetch_add(1, Ordering::Relaxed);
            }
        });
    let s2 = Arc::clone(&sent);
    let done = Arc::new(AtomicBool::new(false));
    let d2 = Arc::clone(&done);
    let sender = thread::spawn(move || {
        let mut returned = HashMap::new();
        for start in (0..ENTRIES).step_by(500) {
            let keys: Vec<String> = (start..start + 500)
                .map(|i| format!("k{}", i % 97))
                .collect();
            let datas: Vec<String> = (start..start + 500).map(|i| i.to_string()).collect();
            let batch: Vec<(&[u8], &[u8])> = keys
                .iter()
                .zip(&datas)
                .map(|(k, d)| (k.as_bytes(), d.as_bytes()))
                .collect();
            let ids = producer.send_batch(&batch).unwrap();
            for (i, id) in ids.into_iter().enumerate() {
                returned.insert(start + i, id);
            }
            s2.fetch_add(500, Ordering::Relaxed);
            // Keep batches going during the stalls.
            thread::sleep(Duration::from_millis(2));
        }
        d2.store(true, Ordering::Relaxed);
        returned
    });
    let pid = server.child.id();
    for target in [ENTRIES / 4, ENTRIES / 2, 3 * ENTRIES / 4] {
        wait_until(Duration::from_secs(60), "the producer's progress", || {
            sent.load(Ordering::Relaxed) >= target
        });
        signal(pid, "STOP");
        thread::sleep(Duration::from_millis(1000));
        signal(pid, "CONT");
    }
    let returned = sender.join().unwrap();
    assert!(done.load(Ordering::Relaxed));
    let mut con = server.con();
    let mut stored: HashMap<usize, usize> = HashMap::new();
    let mut total = 0;
    for p in 0..P {
        let mut last_data = None;
        for (id, f) in xrange(&mut con, &format!("ps:{p}")) {
            let i: usize = f["data"].parse().unwrap();
            assert_eq!(f["key"], format!("k{}", i % 97));
            assert_eq!(returned[&i], id, "entry {i}: the ID send_batch returned");
            assert!(
                last_data < Some(i),
                "partition {p}: {i} stored after {last_data:?}"
            );
            last_data = Some(i);
            *stored.entry(i).or_default() += 1;
            total += 1;
        }
    }
    let twice = stored.values().filter(|&&n| n > 1).count();
    eprintln!(
        "{total} stored for {ENTRIES} sent, {twice} twice, {} failed attempts",
        failures.load(Ordering::Relaxed)
    );
    assert!(
        failures.load(Ordering::Relaxed) >= 3,
        "the stalls did not lose a reply"
    );
    assert_eq!(twice, 0, "entries stored twice");
    assert_eq!(stored.len(), ENTRIES, "entries never stored");
    assert_eq!(total, ENTRIES);
}

/// `max_len(Some(n))` keeps each partition stream at about `n` entries (Redis trims whole
/// nodes of 100 entries, so between `n` and `n` plus a node); without it nothing is trimmed.
#[test]
fn max_len_trims_approximately() {
    let server = RedisServer::start();
    let url = server.url();
    let mut trimmed = Producer::connect(&url, "ml", 1)
        .unwrap()
        .max_len(Some(1000));
    let mut kept = Producer::connect(&url, "keep", 1).unwrap();
    let keys: Vec<String> = (0..5000).map(|i| format!("k{i}")).collect();
    let batch: Vec<(&[u8], &[u8])> = keys.iter().map(|k| (k.as_bytes(), &b"d"[..])).collect();
    for chunk in batch.chunks(250) {
        trimmed.send_batch(chunk).unwrap();
        kept.send_batch(chunk).unwrap();
    }
    let mut con = server.con();
    let len: usize = redis::cmd("XLEN").arg("ml:0").query(&mut con).unwrap();
    assert!((1000..=1100).contains(&len), "XLEN {len}");
    let len: usize = redis::cmd("XLEN").arg("keep:0").query(&mut con).unwrap();
    assert_eq!(len, 5000);
    // The newest entries are the ones kept.
    let last = xrange(&mut con, "ml:0").pop().unwrap().1;
    assert_eq!(last["key"], "k4999");
}
