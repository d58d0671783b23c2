//! Handler failures against a real `redis-server` (started by each test, see `common`): errors
//! and panics are retried with backoff in their key's order, then appended to the dead-letter
//! stream and acknowledged, with exact accounting of every run.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{collect_events, delivery_count, pending_count, wait_until, xrange, RedisServer};
use keyserial_redis::{Consumer, Entry, Event, Producer, StreamId};

/// One handler run: which entry, its attempt, and whether it succeeded.
#[derive(Clone, Debug)]
struct Run {
    key: String,
    partition: u32,
    id: StreamId,
    attempt: u32,
    ok: bool,
    at: Instant,
}

/// Keeps the planned panics off stderr (other panics still print).
fn quiet_planned_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let planned = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("planned panic"));
            if !planned {
                default(info);
            }
        }));
    });
}

/// The entry's plan, from its data: `ok`, `err:N` (an `Err` while attempt <= N) or
/// `panic:N` (a panic while attempt <= N).
fn decide(e: &Entry) -> Result<(), String> {
    let data = String::from_utf8_lossy(&e.data).to_string();
    let (how, n) = match data.split_once(':') {
        Some((how, n)) => (how.to_string(), n.parse::<u32>().unwrap()),
        None => return Ok(()),
    };
    if e.attempt() > n {
        return Ok(());
    }
    if how == "panic" {
        panic!("planned panic of {} at attempt {}", e.id, e.attempt());
    }
    Err(format!(
        "planned error of {} at attempt {}",
        e.id,
        e.attempt()
    ))
}

/// 8 keys × 12 entries, a third failing 1, 2 or 5 times (errors and panics mixed), max 3
/// attempts: every run is accounted for, a key's entries (all their attempts) run in stream
/// order, entries failing 5 times are in the dead-letter stream with their fields and nothing
/// else is, and nothing is left pending.
fn failures_scenario(async_handler: bool) {
    quiet_planned_panics();
    let server = RedisServer::start();
    let url = server.url();
    let mut con = server.con();
    let mut producer = Producer::connect(&url, "f", 2).unwrap();
    // Per (partition, ID): IDs repeat across partition streams.
    let mut plan: HashMap<(u32, StreamId), (String, String)> = HashMap::new();
    for i in 0..96u32 {
        let key = format!("k{}", i % 8);
        let data = match i % 9 {
            1 => "err:1".to_string(),
            4 => "panic:2".to_string(),
            7 => "err:5".to_string(),
            8 => "panic:5".to_string(),
            _ => "ok".to_string(),
        };
        let id = producer
            .send_fields(None, key.as_bytes(), data.as_bytes(), &[(b"trace", b"t")])
            .unwrap();
        let p = keyserial_redis::partition_of(key.as_bytes(), 2);
        plan.insert((p, id), (key, data));
    }
    let runs = Arc::new(Mutex::new(Vec::<Run>::new()));
    let (events, on_event) = collect_events();
    let b = Consumer::builder(&url, "f", 2, "g", "c")
        .workers(2)
        .retry(3, Duration::from_millis(5), Duration::from_millis(20))
        .exit_when_idle(Duration::from_millis(400))
        .on_event(on_event);
    let r2 = Arc::clone(&runs);
    let record = move |e: &Entry, ok: bool| {
        r2.lock().unwrap().push(Run {
            key: String::from_utf8_lossy(&e.key).to_string(),
            partition: e.partition,
            id: e.id,
            attempt: e.attempt(),
            ok,
            at: Instant::now(),
        })
    };
    let b = if async_handler {
        b.async_handler(move |e: Entry| {
            let record = record.clone();
            async move {
                // Recorded before a panic too (the panic is the decision's).
                let r = std::panic::catch_unwind(|| decide(&e));
                record(&e, matches!(r, Ok(Ok(()))));
                match r {
                    Ok(r) => r,
                    Err(p) => std::panic::resume_unwind(p),
                }
            }
        })
    } else {
        b.handler(move |e: &Entry| {
            let r = std::panic::catch_unwind(|| decide(e));
            record(e, matches!(r, Ok(Ok(()))));
            match r {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            }
        })
    };
    let mut c = b.build().unwrap();
    let stats = c.run().unwrap();
    let runs = runs.lock().unwrap().clone();

    // Exact runs per entry: ok → 1 (attempt 1); err:1 → 2; panic:2 → 3; *:5 → 3, all failed.
    let mut per_id: BTreeMap<(u32, StreamId), Vec<&Run>> = BTreeMap::new();
    for r in &runs {
        per_id.entry((r.partition, r.id)).or_default().push(r);
    }
    assert_eq!(per_id.len(), plan.len(), "every entry ran");
    let (mut failed, mut dead, mut panics) = (0u64, Vec::new(), 0u64);
    for (id, rs) in &per_id {
        let data = &plan[id].1;
        let want: Vec<(u32, bool)> = match data.as_str() {
            "ok" => vec![(1, true)],
            "err:1" => vec![(1, false), (2, true)],
            "panic:2" => vec![(1, false), (2, false), (3, true)],
            _ => vec![(1, false), (2, false), (3, false)],
        };
        let got: Vec<(u32, bool)> = rs.iter().map(|r| (r.attempt, r.ok)).collect();
        assert_eq!(got, want, "entry {id:?} ({data})");
        failed += want.iter().filter(|w| !w.1).count() as u64;
        if data.starts_with("panic") {
            panics += want.iter().filter(|w| !w.1).count() as u64;
        }
        if data.ends_with(":5") {
            dead.push(*id);
        }
    }
    // Per key, runs (every attempt) in stream order: a later entry never ran before an
    // earlier entry's last run.
    let mut last: HashMap<&str, StreamId> = HashMap::new();
    for r in &runs {
        if let Some(prev) = last.insert(&r.key, r.id) {
            assert!(prev <= r.id, "key {}: {} ran after {}", r.key, r.id, prev);
        }
    }
    // Backoff between attempts: at least the configured wait (5, then 10 ms).
    for rs in per_id.values() {
        for (w, pair) in rs.windows(2).enumerate() {
            let gap = pair[1].at - pair[0].at;
            let want = Duration::from_millis(5 << w);
            assert!(gap >= want, "retry after {gap:?}, backoff {want:?}");
        }
    }
    // The dead-letter stream: exactly the entries failing 5 times, with their fields.
    let dl = xrange(&mut con, "f:dead");
    let source = |f: &HashMap<String, String>| -> (u32, StreamId) {
        let p = f["source_stream"]
            .strip_prefix("f:")
            .unwrap()
            .parse()
            .unwrap();
        (p, f["source_id"].parse().unwrap())
    };
    let mut dl_ids: Vec<(u32, StreamId)> = dl.iter().map(|(_, f)| source(f)).collect();
    dl_ids.sort();
    assert_eq!(dl_ids, dead);
    for (_, f) in &dl {
        let (p, id) = source(f);
        let (key, data) = &plan[&(p, id)];
        assert_eq!(&f["key"], key);
        assert_eq!(&f["data"], data);
        assert_eq!(f["trace"], "t", "other fields pass through");
        assert_eq!(f["attempts"], "3");
        assert_eq!(
            f["source_stream"],
            format!("f:{}", keyserial_redis::partition_of(key.as_bytes(), 2))
        );
        let want = if data.starts_with("panic") {
            format!("panicked: planned panic of {id} at attempt 3")
        } else {
            format!("planned error of {id} at attempt 3")
        };
        assert_eq!(f["error"], want);
    }
    assert_eq!(pending_count(&mut con, "f:0", "g"), 0);
    assert_eq!(pending_count(&mut con, "f:1", "g"), 0);
    assert_eq!(stats.failed, failed);
    assert_eq!(stats.panicked, panics);
    assert_eq!(stats.retried, failed - dead.len() as u64);
    assert_eq!(stats.dead_lettered, dead.len() as u64);
    assert_eq!(stats.acked, plan.len() as u64);
    assert_eq!(stats.processed, plan.len() as u64);
    let events = events.lock().unwrap();
    let dl_events = events
        .iter()
        .filter(|e| matches!(e, Event::DeadLettered { .. }))
        .count();
    let fail_events = events
        .iter()
        .filter(|e| matches!(e, Event::HandlerFailed { .. }))
        .count();
    assert_eq!(dl_events, dead.len());
    assert_eq!(fail_events as u64, failed);
}

#[test]
fn blocking_handler_failures_retry_in_key_order_then_dead_letter() {
    failures_scenario(false);
}

#[test]
fn async_handler_failures_retry_in_key_order_then_dead_letter() {
    failures_scenario(true);
}

/// A key waiting out a long backoff holds no worker: on one worker, another key's entries run
/// meanwhile; the retried key's next entry waits for the retry. The retry's attempt is in
/// Redis's delivery count before it runs.
#[test]
fn a_backoff_holds_its_key_not_a_worker() {
    let server = RedisServer::start();
    let url = server.url();
    let mut con = server.con();
    let mut p = Producer::connect(&url, "b", 1).unwrap();
    let slow = p.send(b"slow", b"err:1").unwrap();
    let after = p.send(b"slow", b"ok").unwrap();
    let others: Vec<StreamId> = (0..5)
        .map(|i| p.send(format!("o{i}").as_bytes(), b"ok").unwrap())
        .collect();
    let log = Arc::new(Mutex::new(Vec::new()));
    let l2 = Arc::clone(&log);
    let mut c = Consumer::builder(&url, "b", 1, "g", "c")
        .workers(1)
        .retry(2, Duration::from_millis(600), Duration::from_millis(600))
        .exit_when_idle(Duration::from_millis(300))
        .on_event(|_| ())
        .handler(move |e: &Entry| {
            let r = decide(e);
            l2.lock().unwrap().push((e.id, e.attempt(), r.is_ok()));
            r
        })
        .build()
        .unwrap();
    let run = thread::spawn(move || c.run());
    // During the backoff: the first attempt failed, the others ran, and Redis counts 2.
    wait_until(Duration::from_secs(5), "the other keys", || {
        log.lock().unwrap().len() == 1 + others.len()
    });
    wait_until(Duration::from_millis(500), "the recorded attempt", || {
        delivery_count(&mut con, "b:0", "g", slow) == Some(2)
    });
    assert_eq!(delivery_count(&mut con, "b:0", "g", after), Some(1));
    run.join().unwrap().unwrap();
    let log = log.lock().unwrap();
    // Every other key ran during the backoff (before the retry); the retry before the key's
    // next entry. (Keys may start in any order among themselves.)
    let pos = |x: (StreamId, u32, bool)| log.iter().position(|l| *l == x).unwrap();
    assert_eq!(log.len(), 3 + others.len());
    let (first, retry, next) = (
        pos((slow, 1, false)),
        pos((slow, 2, true)),
        pos((after, 1, true)),
    );
    assert!(first < retry && retry < next, "{log:?}");
    for id in &others {
        assert!(pos((*id, 1, true)) < retry, "{log:?}");
    }
    assert_eq!(pending_count(&mut con, "b:0", "g"), 0);
    assert!(xrange(&mut con, "b:dead").is_empty());
}

/// `Entry::attempt` counts earlier deliveries: entries another run of this consumer name read
/// (and did not acknowledge) come back with attempt 2, and one failing once more then is
/// dead-lettered with `max_attempts` 2.
#[test]
fn attempt_counts_earlier_deliveries() {
    let server = RedisServer::start();
    let url = server.url();
    let mut con = server.con();
    let mut p = Producer::connect(&url, "a", 1).unwrap();
    let a = p.send(b"k", b"ok").unwrap();
    let b = p.send(b"k", b"err:9").unwrap();
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("a:0")
        .arg("g")
        .arg("0")
        .exec(&mut con)
        .unwrap();
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("g")
        .arg("c")
        .arg("STREAMS")
        .arg("a:0")
        .arg(">")
        .query(&mut con)
        .unwrap();
    let c_id = p.send(b"k", b"ok").unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let l2 = Arc::clone(&log);
    let mut c = Consumer::builder(&url, "a", 1, "g", "c")
        .retry(2, Duration::from_millis(1), Duration::from_millis(1))
        .exit_when_idle(Duration::from_millis(300))
        .on_event(|_| ())
        .handler(move |e: &Entry| {
            l2.lock().unwrap().push((e.id, e.attempt()));
            decide(e)
        })
        .build()
        .unwrap();
    let stats = c.run().unwrap();
    assert_eq!(*log.lock().unwrap(), [(a, 2), (b, 2), (c_id, 1)]);
    assert_eq!(stats.dead_lettered, 1);
    let dl = xrange(&mut con, "a:dead");
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].1["source_id"], b.to_string());
    assert_eq!(dl[0].1["attempts"], "2");
    assert_eq!(pending_count(&mut con, "a:0", "g"), 0);
}

/// The statistics handle, read from another thread while `run` runs: per partition it shows
/// lag and in-flight entries during the run, and at the end exactly the completed, retried and
/// dead-lettered entries of each partition, the watermark at the partition's last entry, and
/// no lag.
#[test]
fn stats_handle_reads_a_running_consumer() {
    let server = RedisServer::start();
    let url = server.url();
    let mut con = server.con();
    let mut p = Producer::connect(&url, "sh", 2).unwrap();
    // Per partition: (completed, retried, dead-lettered) expected.
    let mut want: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
    let mut last: BTreeMap<u32, StreamId> = BTreeMap::new();
    for i in 0..2000u32 {
        let key = format!("k{}", i % 40);
        let data = match i % 100 {
            0 => "err:1",
            50 => "err:9",
            _ => "ok",
        };
        let id = p.send(key.as_bytes(), data.as_bytes()).unwrap();
        let part = keyserial_redis::partition_of(key.as_bytes(), 2);
        last.insert(part, id);
        let w = want.entry(part).or_default();
        match data {
            "ok" => w.0 += 1,
            "err:1" => {
                w.0 += 1;
                w.1 += 1;
            }
            _ => {
                w.1 += 1;
                w.2 += 1;
            }
        }
    }
    let mut c = Consumer::builder(&url, "sh", 2, "g", "c")
        .workers(4)
        .max_in_flight(64)
        .retry(2, Duration::from_millis(5), Duration::from_millis(5))
        .exit_when_idle(Duration::from_millis(300))
        .on_event(|_| ())
        .handler(|e: &Entry| {
            thread::sleep(Duration::from_micros(300));
            decide(e)
        })
        .build()
        .unwrap();
    let handle = c.stats_handle();
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let w2 = Arc::clone(&watching);
    let h2 = handle.clone();
    let watcher = thread::spawn(move || {
        let (mut saw_lag, mut saw_in_flight, mut snapshots) = (false, false, 0);
        while w2.load(std::sync::atomic::Ordering::Relaxed) {
            let s = h2.snapshot();
            saw_lag |= s.partitions.iter().any(|p| p.lag.is_some_and(|l| l > 0));
            saw_in_flight |= s.partitions.iter().any(|p| p.in_flight > 0);
            snapshots += 1;
            thread::sleep(Duration::from_millis(1));
        }
        (saw_lag, saw_in_flight, snapshots)
    });
    let stats = c.run().unwrap();
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let (saw_lag, saw_in_flight, snapshots) = watcher.join().unwrap();
    assert!(snapshots > 10);
    assert!(saw_in_flight, "no snapshot showed entries in flight");
    assert!(saw_lag, "no snapshot showed the group behind the stream");
    let end = handle.snapshot();
    assert_eq!(end.totals, stats);
    assert_eq!(end.partitions.len(), 2);
    for ps in &end.partitions {
        let w = want[&ps.partition];
        assert_eq!(
            (ps.completed, ps.retried, ps.dead_lettered),
            w,
            "partition {}",
            ps.partition
        );
        assert_eq!(ps.in_flight, 0);
        assert_eq!(ps.watermark, Some(last[&ps.partition]));
        assert_eq!(ps.lag, Some(0));
    }
    assert_eq!(pending_count(&mut con, "sh:0", "g"), 0);
}

/// Runs 40 entries of 1 MB over 2 partitions with a slow handler; returns the consumer's peak
/// bytes in flight.
fn big_entries_peak(limit: Option<usize>) -> u64 {
    let server = RedisServer::start();
    let url = server.url();
    let mut p = Producer::connect(&url, "big", 2).unwrap();
    let data = vec![b'x'; 1 << 20];
    for i in 0..40 {
        p.send(format!("k{i}").as_bytes(), &data).unwrap();
    }
    let mut b = Consumer::builder(&url, "big", 2, "g", "c")
        .workers(8)
        .exit_when_idle(Duration::from_millis(300))
        .handler(|e: &Entry| {
            assert_eq!(e.data.len(), 1 << 20);
            thread::sleep(Duration::from_millis(20));
        });
    if let Some(n) = limit {
        b = b.max_in_flight_bytes(n);
    }
    let stats = b.build().unwrap().run().unwrap();
    assert_eq!(stats.acked, 40);
    stats.peak_in_flight_bytes
}

/// In flight is bounded in bytes: with a 4 MiB limit, 1 MB entries are read a few at a time
/// (the peak stays under the limit plus one entry per partition); without it, all at once.
#[test]
fn in_flight_is_bounded_in_bytes() {
    let entry = (1 << 20) + 64 + 3 + 4 + 3; // data, overhead, "key", "data", the key
    let bounded = big_entries_peak(Some(4 << 20));
    assert!(
        bounded <= (4 << 20) + 2 * entry as u64,
        "peak {bounded} bytes in flight, limit 4 MiB"
    );
    let unbounded = big_entries_peak(None);
    assert!(
        unbounded > 8 << 20,
        "the control read only {unbounded} bytes at once"
    );
    eprintln!(
        "peak in flight: {bounded} bytes with a 4 MiB limit, {unbounded} with the default 64 MiB"
    );
}
