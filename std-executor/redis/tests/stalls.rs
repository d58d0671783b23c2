//! Redis stalls (SIGSTOP) under a running consumer, against a real `redis-server` started by
//! the test: every entry is processed, once, each key's entries first in stream order, nothing
//! is left pending.
//!
//! A stall longer than the consumer's command timeout makes it give up on a reply; the server
//! may still execute that command when it resumes (a read then delivers entries to this
//! consumer that it never saw). The test uses a short command timeout (300 ms) so that 1 s
//! stalls exercise this cheaply; `KEYSERIAL_REDIS_STALLS=N` (default 6) sets how many stalls
//! one run makes, `KEYSERIAL_REDIS_STALL_ROUNDS=R` (default 1) repeats the whole run (the bug
//! it guards against was intermittent: run e.g. `KEYSERIAL_REDIS_STALL_ROUNDS=10` when touching
//! the read or reconnect paths).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{knob, pending_count, signal, RedisServer};
use keyserial_redis::{Consumer, Entry, Event, Producer, StreamId};

const P: u32 = 4;

fn stall_round(round: u64, stalls: u64) {
    const ENTRIES: usize = 20_000;
    const KEYS: usize = 100;
    let server = RedisServer::start();
    let url = server.url();
    let mut producer = Producer::connect(&url, "st", P).unwrap();
    let keys: Vec<String> = (0..ENTRIES).map(|i| format!("k{}", i % KEYS)).collect();
    let batch: Vec<(&[u8], &[u8])> = keys.iter().map(|k| (k.as_bytes(), &b"d"[..])).collect();
    for chunk in batch.chunks(2000) {
        producer.send_batch(chunk).unwrap();
    }
    let log = Arc::new(Mutex::new(Vec::<(u32, StreamId, String)>::with_capacity(
        ENTRIES,
    )));
    let done = Arc::new(AtomicUsize::new(0));
    let reconnects = Arc::new(AtomicUsize::new(0));
    let (l2, d2, r2) = (Arc::clone(&log), Arc::clone(&done), Arc::clone(&reconnects));
    let mut c = Consumer::builder(&url, "st", P, "g", "c")
        .workers(8)
        .max_in_flight(256)
        .batch(64)
        .block(Duration::from_millis(50))
        .command_timeout(Duration::from_millis(300))
        .reconnect(
            u32::MAX,
            Duration::from_millis(20),
            Duration::from_millis(200),
        )
        .exit_when_idle(Duration::from_millis(1500))
        .on_event(move |e| {
            if matches!(e, Event::Reconnected) {
                r2.fetch_add(1, Ordering::Relaxed);
            }
        })
        .handler(move |e: &Entry| {
            thread::sleep(Duration::from_micros(knob(
                "KEYSERIAL_REDIS_STALL_WORK_US",
                0,
            )));
            let key = String::from_utf8_lossy(&e.key).to_string();
            l2.lock().unwrap().push((e.partition, e.id, key));
            d2.fetch_add(1, Ordering::Relaxed);
        })
        .build()
        .unwrap();
    let run = thread::spawn(move || c.run());
    let pid = server.child.id();
    let started = Instant::now();
    for s in 0..stalls {
        // Stall at a different point of the work each time (reads, acks, refreshes).
        let target = (s as usize + 1) * ENTRIES / (stalls as usize + 2);
        while done.load(Ordering::Relaxed) < target {
            assert!(started.elapsed() < Duration::from_secs(120), "no progress");
            thread::sleep(Duration::from_millis(1));
        }
        signal(pid, "STOP");
        thread::sleep(Duration::from_millis(1000));
        signal(pid, "CONT");
    }
    let stats = run.join().unwrap().unwrap();
    let mut con = server.con();
    let mut produced: HashMap<(u32, StreamId), String> = HashMap::new();
    for p in 0..P {
        let stream = format!("st:{p}");
        for (id, f) in common::xrange(&mut con, &stream) {
            produced.insert((p, id), f["key"].clone());
        }
        assert_eq!(
            pending_count(&mut con, &stream, "g"),
            0,
            "{stream}: pending left"
        );
    }
    assert_eq!(produced.len(), ENTRIES);
    let log = log.lock().unwrap();
    let mut seen = HashSet::new();
    let mut duplicates = 0;
    let mut last_first: HashMap<&str, StreamId> = HashMap::new();
    let mut violations = Vec::new();
    for (p, id, key) in log.iter() {
        assert_eq!(
            produced.get(&(*p, *id)),
            Some(key),
            "a run of an entry never produced"
        );
        if !seen.insert((*p, *id)) {
            duplicates += 1;
            continue;
        }
        if let Some(prev) = last_first.insert(key, *id) {
            if prev > *id {
                violations.push(format!("key {key}: {id} first ran after {prev}"));
            }
        }
    }
    eprintln!(
        "round {round}: {stalls} stalls, {} reconnects, {duplicates} duplicates, {} order violations, {:.1} s",
        reconnects.load(Ordering::Relaxed),
        violations.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(seen.len(), ENTRIES, "entries never processed");
    assert_eq!(duplicates, 0, "entries processed twice without a crash");
    assert_eq!(stats.acked, ENTRIES as u64);
    assert!(
        reconnects.load(Ordering::Relaxed) > 0,
        "no stall was long enough to lose a reply"
    );
}

#[test]
fn order_holds_across_redis_stalls() {
    let stalls = knob("KEYSERIAL_REDIS_STALLS", 6);
    for round in 0..knob("KEYSERIAL_REDIS_STALL_ROUNDS", 1) {
        stall_round(round, stalls);
    }
}
