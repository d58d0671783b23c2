//! The consumer at 0 ms of work against a plain loop (BENCHMARKS.md, "Beyond one machine"):
//! 200,000 entries over 10,000 keys in 8 partitions of a local `redis-server`, each entry's
//! handler appending `{partition} {id} {key}\n` to a log file with one `write` (the CLI's
//! handler, `examples/stream_consumer.rs`), by
//! - a plain loop on one connection: `XREADGROUP COUNT 256` over all 8 partitions, the entries
//!   written one by one, one pipelined `XACK` round trip per batch;
//! - one [`Consumer`] with the CLI's settings (4 workers, the default bounds);
//! - two consumers (`index(0, 2)` and `index(1, 2)`), each on its own thread and serializer.
//!
//! ```text
//! cargo run --release -p keyserial-redis --example cli_bench -- [--rounds 3]
//! ```
//! It starts its own `redis-server` on a free loopback port. Each figure is the median of the
//! rounds, each round on fresh streams; the time runs from the first read to the last
//! acknowledgement (read from the statistics handle).
//!
//! For profiling (`valgrind --tool=callgrind`): `KEYSERIAL_BENCH_ENTRIES=N` consumes N entries
//! instead of 200,000, and `KEYSERIAL_BENCH_ONLY=fill|plain|one|two` runs only that part
//! (`fill`: the producer alone, to subtract).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use keyserial_redis::{Consumer, Entry, Producer};

#[path = "support/server.rs"]
mod server;
use server::start_server;

/// 200,000, or `KEYSERIAL_BENCH_ENTRIES`.
fn entries() -> usize {
    std::env::var("KEYSERIAL_BENCH_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
}

/// Whether this part runs (all unless `KEYSERIAL_BENCH_ONLY` names another).
fn runs(part: &str) -> bool {
    std::env::var("KEYSERIAL_BENCH_ONLY").map_or(true, |only| only == part)
}
const KEYS: usize = 10_000;
const P: u32 = 8;

/// Fresh streams `{name}:0..8` with the entries.
fn fill(url: &str, name: &str) {
    let mut p = Producer::connect(url, name, P).unwrap();
    let keys: Vec<String> = (0..entries()).map(|i| format!("k{}", i % KEYS)).collect();
    let batch: Vec<(&[u8], &[u8])> = keys.iter().map(|k| (k.as_bytes(), &b"d"[..])).collect();
    for chunk in batch.chunks(5000) {
        p.send_batch(chunk).unwrap();
    }
}

fn log_file(path: &Path) -> Arc<File> {
    let _ = std::fs::remove_file(path);
    Arc::new(
        OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .unwrap(),
    )
}

/// The CLI's log write: one `write` of the whole line.
fn write_line(log: &File, partition: u32, id: &str, key: &[u8]) {
    let mut line = format!("{partition} {id} ").into_bytes();
    line.extend_from_slice(key);
    line.push(b'\n');
    let n = (&*log).write(&line).unwrap();
    assert_eq!(n, line.len());
}

/// One stream of an `XREADGROUP` reply: its name and `(id, fields)` entries.
type StreamReply = (String, Vec<(String, Vec<(Vec<u8>, Vec<u8>)>)>);

/// The plain loop; returns its time.
fn plain(url: &str, name: &str, log: &Path) -> Duration {
    let log = log_file(log);
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let streams: Vec<String> = (0..P).map(|p| format!("{name}:{p}")).collect();
    for s in &streams {
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(s)
            .arg("plain")
            .arg("0")
            .exec(&mut con)
            .unwrap();
    }
    let start = Instant::now();
    let mut done = 0;
    while done < entries() {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP").arg("plain").arg("c").arg("COUNT").arg(256);
        cmd.arg("STREAMS").arg(&streams);
        for _ in &streams {
            cmd.arg(">");
        }
        let reply: Vec<StreamReply> = cmd.query(&mut con).unwrap();
        let mut pipe = redis::pipe();
        for (stream, entries) in reply {
            let p: u32 = stream.rsplit(':').next().unwrap().parse().unwrap();
            let mut ack = redis::cmd("XACK");
            ack.arg(&stream).arg("plain");
            for (id, fields) in &entries {
                let key = &fields.iter().find(|(f, _)| f == b"key").unwrap().1;
                write_line(&log, p, id, key);
                ack.arg(id);
            }
            done += entries.len();
            pipe.add_command(ack).ignore();
        }
        pipe.exec(&mut con).unwrap();
    }
    start.elapsed()
}

/// `of` consumers of group `group` (the CLI's handler and settings), each on its own thread;
/// returns the time until all entries are acknowledged.
fn consumers(url: &str, name: &str, group: &str, of: u32, log: &Path) -> Duration {
    let log = log_file(log);
    let mut built = Vec::new();
    for i in 0..of {
        let log = Arc::clone(&log);
        let c = Consumer::builder(url, name, P, group, &format!("c{i}"))
            .index(i, of)
            .workers(workers())
            .handler(move |e: &Entry| write_line(&log, e.partition, &e.id.to_string(), &e.key))
            .build()
            .unwrap();
        built.push(c);
    }
    let handles: Vec<_> = built.iter().map(|c| c.stats_handle()).collect();
    let stops: Vec<_> = built.iter().map(|c| c.stopper()).collect();
    let start = Instant::now();
    let threads: Vec<_> = built
        .into_iter()
        .map(|mut c| thread::spawn(move || c.run().unwrap()))
        .collect();
    let acked = || -> u64 { handles.iter().map(|h| h.snapshot().totals.acked).sum() };
    while acked() < entries() as u64 {
        thread::sleep(Duration::from_millis(1));
    }
    let took = start.elapsed();
    for s in stops {
        s.stop();
    }
    for t in threads {
        t.join().unwrap();
    }
    took
}

/// The CLI's 4 workers, or `KEYSERIAL_BENCH_WORKERS`.
fn workers() -> usize {
    std::env::var("KEYSERIAL_BENCH_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut rounds = 3usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next().and_then(|n| n.parse().ok())) {
            ("--rounds", Some(n)) if n > 0 => rounds = n,
            _ => {
                eprintln!("cli_bench: usage: cli_bench [--rounds N]");
                std::process::exit(1);
            }
        }
    }
    let server = start_server();
    let url = format!("redis://127.0.0.1:{}", server.1);
    let dir = std::env::temp_dir().join(format!("keyserial-cli-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    let n = entries();
    println!("workload: {n} entries, {KEYS} keys, {P} partitions, 0 ms of work, a log write each; {cores} cores");
    let (mut t_plain, mut t_one, mut t_two) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let name = format!("cb{r}");
        fill(&url, &name);
        if runs("plain") {
            t_plain.push(plain(&url, &name, &dir.join("plain.log")));
        }
        if runs("one") {
            t_one.push(consumers(&url, &name, "one", 1, &dir.join("one.log")));
        }
        if runs("two") {
            t_two.push(consumers(&url, &name, "two", 2, &dir.join("two.log")));
        }
        let mut con = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        for p in 0..P {
            redis::cmd("DEL")
                .arg(format!("{name}:{p}"))
                .exec(&mut con)
                .unwrap();
        }
    }
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    if t_plain.is_empty() || t_one.is_empty() || t_two.is_empty() {
        for (what, t) in [
            ("plain loop", t_plain),
            ("one consumer", t_one),
            ("two consumers", t_two),
        ] {
            if !t.is_empty() {
                println!("{what}: {:.0} entries/s", rate(median(t)));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let (plain, one, two) = (
        rate(median(t_plain)),
        rate(median(t_one)),
        rate(median(t_two)),
    );
    println!("plain loop: {plain:.0} entries/s");
    println!(
        "one consumer: {one:.0} entries/s = {:.2} x the plain loop (target >= 0.9)",
        one / plain
    );
    println!(
        "two consumers: {two:.0} entries/s = {:.2} x one (target >= 1.6, with a core each)",
        two / one
    );
    let _ = std::fs::remove_dir_all(&dir);
}
