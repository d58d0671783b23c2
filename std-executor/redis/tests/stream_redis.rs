//! The stream module against a real `redis-server` that each test starts on a free loopback
//! port (a missing `redis-server` binary fails the test: `.ci/run` installs it). Run with
//! `cargo test -p keyserial-redis --features server-tests --test stream_redis`.
//!
//! The consumer processes are the example CLI itself: `examples/stream_consumer.rs` is compiled
//! into this test binary (`mod cli`) and run in child processes of it (`cli_child`, started with
//! an argument list in `KEYSERIAL_STREAM_CLI`), so a kill is a real SIGKILL of a process that runs
//! exactly the example's code, without a second build of the crate.

#[path = "../examples/stream_consumer.rs"]
#[allow(dead_code)]
mod cli;
mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::children::{
    consumer_args, line_count, read_log, spawn_consumer, wait_output, watermarks,
};
use common::{collect_events, free_port, last_id, pending_count, scratch, RedisServer};
use keyserial_redis::{partition_of, Consumer, Event, Producer, StreamError, StreamId};

// ---------------------------------------------------------------- the CLI in child processes

/// Not a test: the entry point of the child processes (ignored unless asked for by name).
#[test]
#[ignore = "the child-process entry of the CLI tests; runs only with KEYSERIAL_STREAM_CLI set"]
fn cli_child() {
    if let Ok(args) = std::env::var("KEYSERIAL_STREAM_CLI") {
        let code = cli::run(args.split('\n').map(String::from));
        std::process::exit(i32::from(code));
    }
}

// ---------------------------------------------------------------- the big one

/// 100,000 entries over 10,000 keys in 8 partitions, two consumer processes; consumer 1 is
/// SIGKILLed mid-run, restarted under the same name (it re-reads its own pending entries),
/// SIGKILLed again and restarted under a new name (it takes the dead name's entries over with
/// XAUTOCLAIM after claim_idle). Every entry runs at least once, each key's entries first run
/// in stream order, duplicates stay within the in-flight bound per kill, the watermarks reach
/// each partition's last entry, and nothing is left pending.
#[test]
fn two_processes_survive_sigkill_and_restart() {
    const ENTRIES: usize = 100_000;
    const KEYS: usize = 10_000;
    const P: u32 = 8;
    const IN_FLIGHT: usize = 1024; // the CLI's max_in_flight (the library default)
    let started = Instant::now();
    let server = RedisServer::start();
    let url = server.url();
    let dir = scratch("kill");
    let logs = [dir.join("c0.log"), dir.join("c1.log")];

    // Half the entries before the consumers start, half while they run.
    let mut producer = Producer::connect(&url, "big", P).unwrap();
    let produce = |producer: &mut Producer, range: std::ops::Range<usize>| {
        let keys: Vec<String> = range.clone().map(|i| format!("k{}", i % KEYS)).collect();
        let datas: Vec<String> = range.map(|i| format!("{i}")).collect();
        let batch: Vec<(&[u8], &[u8])> = keys
            .iter()
            .zip(&datas)
            .map(|(k, d)| (k.as_bytes(), d.as_bytes()))
            .collect();
        for chunk in batch.chunks(2000) {
            producer.send_batch(chunk).unwrap();
        }
    };
    produce(&mut producer, 0..ENTRIES / 2);

    let extra = [
        "--work-ms",
        "3",
        "--claim-idle-ms",
        "1000",
        "--exit-when-idle-ms",
        "2000",
    ];
    let c0 = spawn_consumer(&consumer_args(&url, "big", P, "c0", 0, 2, &logs[0], &extra));
    let mut c1 = spawn_consumer(&consumer_args(&url, "big", P, "c1", 1, 2, &logs[1], &extra));
    produce(&mut producer, ENTRIES / 2..ENTRIES);

    // Kill consumer 1 twice, each time once it has logged another ~12,000 lines.
    let mut kills = 0;
    for (next_name, threshold) in [("c1", 12_000), ("c1-new", 24_000)] {
        let deadline = Instant::now() + Duration::from_secs(60);
        while line_count(&logs[1]) < threshold {
            assert!(
                Instant::now() < deadline,
                "consumer 1 stalled at {} lines",
                line_count(&logs[1])
            );
            thread::sleep(Duration::from_millis(5));
        }
        c1.kill().unwrap(); // SIGKILL
        c1.wait().unwrap();
        kills += 1;
        c1 = spawn_consumer(&consumer_args(
            &url, "big", P, next_name, 1, 2, &logs[1], &extra,
        ));
    }
    let out0 = wait_output(c0, Duration::from_secs(90));
    let out1 = wait_output(c1, Duration::from_secs(90));
    assert!(
        out0.status.success(),
        "consumer 0: {:?} {}",
        out0.status,
        String::from_utf8_lossy(&out0.stderr)
    );
    assert!(
        out1.status.success(),
        "consumer 1: {:?} {}",
        out1.status,
        String::from_utf8_lossy(&out1.stderr)
    );

    // What was produced, per partition in stream order.
    let mut con = server.con();
    let mut produced: HashMap<(u32, StreamId), String> = HashMap::new();
    for p in 0..P {
        let stream = format!("big:{p}");
        let entries: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
            .arg(&stream)
            .arg("-")
            .arg("+")
            .query(&mut con)
            .unwrap();
        for (id, fields) in entries {
            let key = fields["key"].clone();
            assert_eq!(
                partition_of(key.as_bytes(), P),
                p,
                "the producer's partition rule"
            );
            produced.insert((p, id.parse().unwrap()), key);
        }
        assert_eq!(
            pending_count(&mut con, &stream, "g"),
            0,
            "{stream}: entries left pending"
        );
    }
    assert_eq!(produced.len(), ENTRIES);

    let mut seen: HashSet<(u32, StreamId)> = HashSet::new();
    let mut duplicates = [0usize; 2];
    for (c, log) in logs.iter().enumerate() {
        // Per key, the IDs in order of their first processing.
        let mut last_first: HashMap<String, StreamId> = HashMap::new();
        for (p, id, key) in read_log(log) {
            assert_eq!(p % 2, c as u32, "consumer {c} processed partition {p}");
            assert_eq!(
                produced.get(&(p, id)),
                Some(&key),
                "a logged entry that was not produced"
            );
            if !seen.insert((p, id)) {
                duplicates[c] += 1;
                continue;
            }
            if let Some(prev) = last_first.insert(key.clone(), id) {
                assert!(prev < id, "key {key}: {id} first ran after {prev}");
            }
        }
    }
    assert_eq!(
        seen.len(),
        ENTRIES,
        "entries never processed: {}",
        ENTRIES - seen.len()
    );
    assert_eq!(duplicates[0], 0, "consumer 0 was never killed");
    assert!(
        duplicates[1] <= kills * IN_FLIGHT,
        "{} duplicates after {kills} kills, bound {}",
        duplicates[1],
        kills * IN_FLIGHT
    );
    // The final processes' watermarks reach each partition's last entry.
    for (out, c) in [(&out0, 0u32), (&out1, 1)] {
        let marks = watermarks(out);
        let owned: Vec<u32> = (c..P).step_by(2).collect();
        assert_eq!(marks.keys().copied().collect::<Vec<_>>(), owned);
        for p in owned {
            assert_eq!(
                marks[&p],
                last_id(&mut con, &format!("big:{p}")),
                "partition {p}'s watermark"
            );
        }
    }
    let claimed: u64 = String::from_utf8_lossy(&out1.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("stats "))
        .and_then(|s| s.split(' ').find_map(|kv| kv.strip_prefix("claimed=")))
        .and_then(|n| n.parse().ok())
        .expect("a stats line");
    assert!(
        claimed > 0,
        "the consumer restarted under a new name took nothing over"
    );
    eprintln!(
        "100,000 entries, {kills} kills: {} duplicates (bound {}), {claimed} taken over, {:.1} s",
        duplicates[1],
        kills * IN_FLIGHT,
        started.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------- claim safety

/// Runs a consumer on a thread; its handler records `(consumer, id)` after sleeping `work`.
fn run_recording(
    url: &str,
    stream: &str,
    name: &str,
    claim_idle: Duration,
    work: Duration,
    log: Arc<Mutex<Vec<(String, StreamId)>>>,
) -> thread::JoinHandle<Result<keyserial_redis::ConsumerStats, StreamError>> {
    let b = Consumer::builder(url, stream, 1, "g", name)
        .claim_idle(claim_idle)
        .block(Duration::from_millis(20))
        .exit_when_idle(Duration::from_millis(600))
        .workers(2);
    let who = name.to_string();
    let mut c = b
        .handler(move |e| {
            thread::sleep(work);
            log.lock().unwrap().push((who.clone(), e.id));
        })
        .build()
        .unwrap();
    thread::spawn(move || c.run())
}

/// 12 entries of one key, 100 ms of work each: consumer `a` holds the last ones in its queue
/// for over a second, far past `claim_idle` (300 ms). Consumer `b` (same partition, another
/// name: a take-over candidate) starts while they wait. `a_idle` is `a`'s own `claim_idle` (its
/// hold refresh runs every quarter of it). Returns (runs per ID, b's claims).
fn held_entries_scenario(a_idle: Duration) -> (BTreeMap<StreamId, Vec<String>>, u64) {
    let server = RedisServer::start();
    let url = server.url();
    let mut p = Producer::connect(&url, "held", 1).unwrap();
    let ids: Vec<StreamId> = (0..12)
        .map(|i| p.send(b"slow", format!("{i}").as_bytes()).unwrap())
        .collect();
    let log = Arc::new(Mutex::new(Vec::new()));
    let idle = Duration::from_millis(300);
    let a = run_recording(
        &url,
        "held",
        "a",
        a_idle,
        Duration::from_millis(100),
        Arc::clone(&log),
    );
    // Let `a` read everything and start on it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while log.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline);
        thread::sleep(Duration::from_millis(5));
    }
    let b = run_recording(&url, "held", "b", idle, Duration::ZERO, Arc::clone(&log));
    a.join().unwrap().unwrap();
    let b_stats = b.join().unwrap().unwrap();
    let mut con = server.con();
    assert_eq!(pending_count(&mut con, "held:0", "g"), 0);
    let mut runs: BTreeMap<StreamId, Vec<String>> =
        ids.iter().map(|id| (*id, Vec::new())).collect();
    for (who, id) in log.lock().unwrap().iter() {
        runs.get_mut(id).expect("a produced id").push(who.clone());
    }
    (runs, b_stats.claimed)
}

/// Dapr 4599: entries waiting in a live consumer's queue age in Redis's pending list. With the
/// hold refresh, another consumer's XAUTOCLAIM never takes them: every entry runs once, on `a`.
#[test]
fn claim_idle_never_takes_a_held_entry() {
    let (runs, claimed) = held_entries_scenario(Duration::from_millis(300));
    assert_eq!(claimed, 0, "b claimed entries that a still held");
    for (id, who) in &runs {
        assert_eq!(who, &["a".to_string()], "entry {id} ran on {who:?}");
    }
}

/// The control: the same schedule with `a` refreshing only every 15 s (its `claim_idle` is 60 s,
/// far above `b`'s) lets `b` claim entries `a` still holds, and they run twice. (So the test
/// above does detect the bug.)
#[test]
fn without_the_refresh_held_entries_are_claimed_and_run_twice() {
    let (runs, claimed) = held_entries_scenario(Duration::from_secs(60));
    assert!(
        claimed > 0,
        "b claimed nothing: the schedule does not exercise claiming"
    );
    assert!(
        runs.values().any(|who| who.len() > 1),
        "no entry ran twice: {runs:?}"
    );
}

// ---------------------------------------------------------------- bad input

/// An entry without a `key` field is acknowledged and reported, and the key's later entries
/// still run (it blocks nothing).
#[test]
fn entry_without_key_is_acked_and_reported() {
    let server = RedisServer::start();
    let url = server.url();
    let mut con = server.con();
    let mut p = Producer::connect(&url, "nokey", 1).unwrap();
    let first = p.send(b"k", b"1").unwrap();
    let bad: String = redis::cmd("XADD")
        .arg("nokey:0")
        .arg("*")
        .arg("data")
        .arg("x")
        .query(&mut con)
        .unwrap();
    let bad: StreamId = bad.parse().unwrap();
    let last = p.send(b"k", b"2").unwrap();
    let (events, on_event) = collect_events();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let r2 = Arc::clone(&ran);
    let mut c = Consumer::builder(&url, "nokey", 1, "g", "c")
        .exit_when_idle(Duration::from_millis(300))
        .on_event(on_event)
        .handler(move |e| r2.lock().unwrap().push((e.id, e.data.clone())))
        .build()
        .unwrap();
    let stats = c.run().unwrap();
    assert_eq!(
        *ran.lock().unwrap(),
        [(first, b"1".to_vec()), (last, b"2".to_vec())]
    );
    assert_eq!(
        *events.lock().unwrap(),
        [Event::MissingKey {
            partition: 0,
            id: bad
        }]
    );
    assert_eq!((stats.missing_key, stats.acked), (1, 3));
    assert_eq!(c.watermark().mark(0), Some(&last));
    assert_eq!(pending_count(&mut con, "nokey:0", "g"), 0);
}

/// Explicit IDs (`XADD s 1700000000000-7 …`) are ordered numerically (9-0 before 10-0), other
/// fields are passed through, and the watermark ends at the largest.
#[test]
fn explicit_ids_run_in_numeric_order() {
    let server = RedisServer::start();
    let url = server.url();
    let mut p = Producer::connect(&url, "explicit", 1).unwrap();
    let ids = [
        StreamId::new(5, 1),
        StreamId::new(9, 0),
        StreamId::new(10, 0),
        StreamId::new(1_700_000_000_000, 7),
    ];
    for (i, id) in ids.iter().enumerate() {
        let got = p
            .send_fields(
                Some(*id),
                b"k",
                format!("{i}").as_bytes(),
                &[(b"extra", b"yes")],
            )
            .unwrap();
        assert_eq!(got, *id);
    }
    // An ID below the stream's top is the server's error, not a silent reorder.
    assert!(matches!(
        p.send_with_id(StreamId::new(6, 0), b"k", b"late"),
        Err(StreamError::Redis(_))
    ));
    let ran = Arc::new(Mutex::new(Vec::new()));
    let r2 = Arc::clone(&ran);
    let mut c = Consumer::builder(&url, "explicit", 1, "g", "c")
        .exit_when_idle(Duration::from_millis(300))
        .handler(move |e| {
            assert_eq!(e.field(b"extra"), Some(&b"yes"[..]));
            r2.lock().unwrap().push(e.id)
        })
        .build()
        .unwrap();
    c.run().unwrap();
    assert_eq!(*ran.lock().unwrap(), ids);
    assert_eq!(c.watermark().mark(0), Some(&ids[3]));
}

/// A pending entry deleted from the stream (XDEL) comes back from the pending list without a
/// body: the restarted consumer acknowledges it (reported) instead of leaving it stuck, then
/// runs the rest of its own pending entries before new ones.
#[test]
fn restart_rereads_own_pending_and_acks_deleted_ones() {
    let server = RedisServer::start();
    let url = server.url();
    let mut con = server.con();
    let mut p = Producer::connect(&url, "own", 1).unwrap();
    let a = p.send(b"k", b"a").unwrap();
    let b = p.send(b"k", b"b").unwrap();
    // A consumer "c" read both and died before acknowledging them.
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("own:0")
        .arg("g")
        .arg("0")
        .exec(&mut con)
        .unwrap();
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("g")
        .arg("c")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg("own:0")
        .arg(">")
        .query(&mut con)
        .unwrap();
    let _: i64 = redis::cmd("XDEL")
        .arg("own:0")
        .arg(a.to_string())
        .query(&mut con)
        .unwrap();
    let c_new = p.send(b"k", b"c").unwrap();
    let (events, on_event) = collect_events();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let r2 = Arc::clone(&ran);
    let mut c = Consumer::builder(&url, "own", 1, "g", "c")
        .exit_when_idle(Duration::from_millis(300))
        .on_event(on_event)
        .handler(move |e| r2.lock().unwrap().push(e.id))
        .build()
        .unwrap();
    let stats = c.run().unwrap();
    assert_eq!(*ran.lock().unwrap(), [b, c_new]);
    assert_eq!(
        *events.lock().unwrap(),
        [Event::Deleted {
            partition: 0,
            id: a
        }]
    );
    assert_eq!(stats.deleted, 1);
    assert_eq!(pending_count(&mut con, "own:0", "g"), 0);
}

/// A lost server is retried with backoff, then `run` fails with `ConnectionLost`, and nothing
/// that did not complete is acknowledged.
#[test]
fn lost_server_is_an_error_after_the_retry_limit() {
    let mut server = RedisServer::start();
    let url = server.url();
    let mut c = Consumer::builder(&url, "lost", 1, "g", "c")
        .reconnect(3, Duration::from_millis(20), Duration::from_millis(50))
        .handler(|_| ())
        .build()
        .unwrap();
    let run = thread::spawn(move || c.run());
    thread::sleep(Duration::from_millis(200));
    let _ = server.child.kill();
    let _ = server.child.wait();
    let started = Instant::now();
    let res = run.join().unwrap();
    assert!(
        matches!(res, Err(StreamError::ConnectionLost { attempts: 3, .. })),
        "{res:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// The CLI: a bad argument or an unreachable server exits 1 at once with one line on stderr.
#[test]
fn cli_bad_argument_or_unreachable_server_exits_1() {
    let dir = scratch("cli");
    let log = dir.join("log");
    let dead = format!("redis://127.0.0.1:{}", free_port());
    let good = consumer_args(&dead, "s", 4, "c", 0, 1, &log, &[]);
    let mut cases: Vec<(&str, Vec<String>)> = vec![("unreachable server", good.clone())];
    let mut with = |what: &'static str, from: &str, to: &str| {
        let mut a = good.clone();
        let i = a.iter().position(|s| s == from).unwrap();
        a[i + 1] = to.to_string();
        cases.push((what, a));
    };
    with("non-numeric partitions", "--partitions", "eight");
    with("zero partitions", "--partitions", "0");
    with("index not below of", "--index", "1");
    with("not a redis URL", "--redis", "http://x");
    let mut unknown = good.clone();
    unknown.push("--frobnicate".into());
    cases.push(("unknown argument", unknown));
    for (what, flag, value) in [
        ("zero max attempts", "--max-attempts", "0"),
        ("non-numeric retry", "--retry-ms", "soon"),
        ("non-numeric drain", "--drain-ms", "-1"),
        (
            "non-numeric reconnect attempts",
            "--reconnect-attempts",
            "many",
        ),
    ] {
        let mut a = good.clone();
        a.extend([flag.to_string(), value.to_string()]);
        cases.push((what, a));
    }
    let mut missing_value = good.clone();
    missing_value.push("--work-ms".into());
    cases.push(("option without value", missing_value));
    cases.push(("missing --log", good[..good.len() - 2].to_vec()));
    for (what, args) in cases {
        let started = Instant::now();
        let out = wait_output(spawn_consumer(&args), Duration::from_secs(20));
        // At once: reconnecting for ever is for a connection lost while running.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: took {:?}",
            started.elapsed()
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {:?} {err}", out.status);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{what}: stderr {err:?}");
        assert!(lines[0].starts_with("stream_consumer: "), "{what}: {err:?}");
    }
}

/// The CLI's `fail` field: an entry fails while its attempt is at most `fail`; with
/// `--max-attempts 3 --retry-ms 10`, `fail` 0, 1 and 2 succeed (logged once each, after the
/// key's earlier entries), 3 and 7 go to `{stream}:dead` with 3 attempts and are not logged,
/// and nothing is left pending.
#[test]
fn cli_fail_field_retries_then_dead_letters() {
    let server = RedisServer::start();
    let url = server.url();
    let mut con = server.con();
    let dir = scratch("fail");
    let log = dir.join("log");
    let mut p = Producer::connect(&url, "cf", 2).unwrap();
    let mut want_logged = Vec::new();
    let mut want_dead = Vec::new();
    for i in 0..40u32 {
        let key = format!("k{}", i % 4);
        let fail = [0u32, 1, 2, 3, 7][(i % 5) as usize];
        let id = p
            .send_fields(
                None,
                key.as_bytes(),
                b"d",
                &[(b"fail", fail.to_string().as_bytes())],
            )
            .unwrap();
        let part = partition_of(key.as_bytes(), 2);
        if fail < 3 {
            want_logged.push((part, id, key));
        } else {
            want_dead.push((part, id));
        }
    }
    let args = consumer_args(
        &url,
        "cf",
        2,
        "c",
        0,
        1,
        &log,
        &[
            "--max-attempts",
            "3",
            "--retry-ms",
            "10",
            "--exit-when-idle-ms",
            "500",
        ],
    );
    let out = wait_output(spawn_consumer(&args), Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut logged = read_log(&log);
    // Per key, in stream order.
    let mut last: HashMap<String, StreamId> = HashMap::new();
    for (_, id, key) in &logged {
        if let Some(prev) = last.insert(key.clone(), *id) {
            assert!(prev < *id, "key {key}: {id} after {prev}");
        }
    }
    logged.sort();
    want_logged.sort();
    assert_eq!(
        logged, want_logged,
        "exactly the entries failing < 3 times, once each"
    );
    let mut dead: Vec<(u32, StreamId)> = common::xrange(&mut con, "cf:dead")
        .into_iter()
        .map(|(_, f)| {
            assert_eq!(f["attempts"], "3");
            assert_eq!(f["error"], format!("fail={}, attempt 3", f["fail"]));
            let p = f["source_stream"]
                .strip_prefix("cf:")
                .unwrap()
                .parse()
                .unwrap();
            (p, f["source_id"].parse().unwrap())
        })
        .collect();
    dead.sort();
    want_dead.sort();
    assert_eq!(dead, want_dead);
    for p in 0..2 {
        assert_eq!(pending_count(&mut con, &format!("cf:{p}"), "g"), 0);
    }
    let stats = String::from_utf8_lossy(&out.stdout);
    assert!(
        stats.contains(&format!("dead_lettered={}", want_dead.len())),
        "{stats}"
    );
}
