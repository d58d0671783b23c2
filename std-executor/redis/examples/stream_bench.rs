//! The parallel-consumer workload on a Redis stream (BENCHMARKS.md, "Beyond one machine: Redis
//! streams"): 10,000 entries at 10,000 keys in one partition, each with a uniform 0-5 ms of
//! work, consumed by
//! - a plain sequential `XREADGROUP` loop (read a batch, work each entry, `XACK` it);
//! - keyserial's [`Consumer`] with blocking handlers (`thread::sleep` on 64, 128 and 256
//!   workers: the work is sleeping, so what it needs is many waiting threads, not cores);
//! - keyserial's [`Consumer`] with async handlers (`tokio::time::sleep` in `submit_async`
//!   futures, 2 workers);
//!
//! and, at 0 ms of work, 100,000 entries through the blocking consumer, in entries/s beside
//! `redis-benchmark -q -n 100000 XADD s '*' key k data d` on the same server.
//!
//! ```text
//! cargo run --release -p keyserial-redis --example stream_bench -- [--rounds 5]
//! ```
//! It starts its own `redis-server` on a free loopback port (and needs `redis-benchmark`, from
//! the same Debian package). Figures are medians of the rounds; the sequential loop runs once.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyserial::Serializer;
use keyserial_redis::{Consumer, Producer};

#[path = "support/server.rs"]
mod server;
use server::start_server;

const ENTRIES: usize = 10_000;

/// Uniform 0..=5 ms per entry, the same for every mode (splitmix64 from a fixed seed).
fn work_ms(i: usize) -> u64 {
    let mut z = (i as u64)
        .wrapping_add(1)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    z % 6
}

/// A fresh one-partition stream `name:0` with `n` entries, keys `k0..`, data = the work in ms.
fn fill(url: &str, name: &str, n: usize, work: bool) {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    redis::cmd("DEL")
        .arg(format!("{name}:0"))
        .exec(&mut con)
        .unwrap();
    let mut p = Producer::connect(url, name, 1).unwrap();
    let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let datas: Vec<String> = (0..n)
        .map(|i| if work { work_ms(i) } else { 0 }.to_string())
        .collect();
    let batch: Vec<(&[u8], &[u8])> = keys
        .iter()
        .zip(&datas)
        .map(|(k, d)| (k.as_bytes(), d.as_bytes()))
        .collect();
    for chunk in batch.chunks(5000) {
        p.send_batch(chunk).unwrap();
    }
}

fn ms_of(data: &[u8]) -> u64 {
    std::str::from_utf8(data).unwrap().parse().unwrap()
}

/// One stream of an `XREADGROUP` reply: its name and `(id, fields)` entries.
type StreamReply = (String, Vec<(String, Vec<(String, String)>)>);

/// The plain loop: XREADGROUP a batch, run each entry in turn, XACK it.
fn sequential(url: &str, name: &str) -> Duration {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let stream = format!("{name}:0");
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg("seq")
        .arg("0")
        .exec(&mut con)
        .unwrap();
    let start = Instant::now();
    let mut done = 0;
    while done < ENTRIES {
        let reply: Vec<StreamReply> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("seq")
            .arg("c")
            .arg("COUNT")
            .arg(100)
            .arg("STREAMS")
            .arg(&stream)
            .arg(">")
            .query(&mut con)
            .unwrap();
        for (_, entries) in reply {
            for (id, fields) in entries {
                let ms = fields
                    .iter()
                    .find(|(f, _)| f == "data")
                    .map(|(_, v)| ms_of(v.as_bytes()))
                    .unwrap();
                std::thread::sleep(Duration::from_millis(ms));
                redis::cmd("XACK")
                    .arg(&stream)
                    .arg("seq")
                    .arg(&id)
                    .exec(&mut con)
                    .unwrap();
                done += 1;
            }
        }
    }
    start.elapsed()
}

enum Mode {
    Blocking { workers: usize, work: bool },
    Async { rt: tokio::runtime::Handle },
}

/// keyserial's consumer until all `n` entries are acknowledged.
fn keyserial_run(url: &str, name: &str, group: &str, n: usize, mode: &Mode) -> Duration {
    let count = Arc::new(AtomicUsize::new(0));
    // Async handlers hold no worker while they wait, so more of them may be in flight.
    let inflight = match mode {
        Mode::Blocking { .. } => 1024,
        Mode::Async { .. } => 4096,
    };
    let mut b = Consumer::builder(url, name, 1, group, "c").max_in_flight(inflight);
    let stop_at = {
        let count = Arc::clone(&count);
        move || count.fetch_add(1, Ordering::Relaxed) + 1
    };
    let start = Instant::now();
    let mut consumer = match mode {
        Mode::Blocking { workers, work } => {
            let work = *work;
            b = b.workers(*workers);
            b.handler(move |e| {
                if work {
                    std::thread::sleep(Duration::from_millis(ms_of(&e.data)));
                }
                stop_at();
            })
            .build()
            .unwrap()
        }
        Mode::Async { rt } => {
            let s = Serializer::<Vec<u8>>::builder()
                .workers(2)
                .capacity(inflight)
                .tokio_handle(rt.clone())
                .build()
                .unwrap();
            b = b.serializer(Arc::new(s));
            let stop_at = Arc::new(stop_at);
            b.async_handler(move |e| {
                let stop_at = Arc::clone(&stop_at);
                async move {
                    tokio::time::sleep(Duration::from_millis(ms_of(&e.data))).await;
                    stop_at();
                }
            })
            .build()
            .unwrap()
        }
    };
    let stop = consumer.stopper();
    let watcher = std::thread::spawn(move || {
        while count.load(Ordering::Relaxed) < n {
            std::thread::sleep(Duration::from_micros(200));
        }
        stop.stop();
    });
    let stats = consumer.run().unwrap();
    let took = start.elapsed();
    watcher.join().unwrap();
    assert_eq!(stats.acked as usize, n, "every entry acknowledged");
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn xadd_rate(port: u16) -> f64 {
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-q",
            "-n",
            "100000",
            "XADD",
            "s",
            "*",
            "key",
            "k",
            "data",
            "d",
        ])
        .output()
        .expect("redis-benchmark (Debian package redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    // "XADD s * key k data d: 123456.79 requests per second, p50=..." (after \r progress lines)
    let line = text.rsplit('\r').next().unwrap_or(&text).to_string();
    let rate = line
        .split(": ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|r| r.parse().ok());
    rate.unwrap_or_else(|| panic!("cannot read redis-benchmark's output: {text:?}"))
}

fn main() {
    let mut rounds = 5usize;
    let mut sequential_too = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if n > 0 => rounds = n,
                _ => {
                    eprintln!("stream_bench: --rounds needs a positive number");
                    std::process::exit(1);
                }
            },
            "--skip-sequential" => sequential_too = false,
            _ => {
                eprintln!("stream_bench: usage: stream_bench [--rounds N] [--skip-sequential]");
                std::process::exit(1);
            }
        }
    }
    let server = start_server();
    let url = format!("redis://127.0.0.1:{}", server.1);
    let total_ms: u64 = (0..ENTRIES).map(work_ms).sum();
    println!("workload: {ENTRIES} entries, {ENTRIES} keys, 1 partition, uniform 0-5 ms (sum {total_ms} ms); parallel-consumer: 2.13 s");

    if sequential_too {
        fill(&url, "seq", ENTRIES, true);
        let seq = sequential(&url, "seq");
        println!(
            "sequential XREADGROUP loop: {:.2} s (1 round)",
            seq.as_secs_f64()
        );
    }

    for workers in [64, 128, 256] {
        let times = (0..rounds)
            .map(|r| {
                fill(&url, "blk", ENTRIES, true);
                keyserial_run(
                    &url,
                    "blk",
                    &format!("g{r}"),
                    ENTRIES,
                    &Mode::Blocking {
                        workers,
                        work: true,
                    },
                )
            })
            .collect();
        let m = median(times);
        println!(
            "keyserial blocking, {workers} workers: median {:.3} s = {:.3} x 2.13 s",
            m.as_secs_f64(),
            m.as_secs_f64() / 2.13
        );
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let times = (0..rounds)
        .map(|r| {
            fill(&url, "asy", ENTRIES, true);
            keyserial_run(
                &url,
                "asy",
                &format!("g{r}"),
                ENTRIES,
                &Mode::Async {
                    rt: rt.handle().clone(),
                },
            )
        })
        .collect();
    let m = median(times);
    println!(
        "keyserial async (2 workers, tokio sleep): median {:.3} s = {:.3} x 2.13 s",
        m.as_secs_f64(),
        m.as_secs_f64() / 2.13
    );

    const ZERO: usize = 100_000;
    let times = (0..rounds)
        .map(|r| {
            fill(&url, "zero", ZERO, false);
            keyserial_run(
                &url,
                "zero",
                &format!("g{r}"),
                ZERO,
                &Mode::Blocking {
                    workers: 2,
                    work: false,
                },
            )
        })
        .collect();
    let m = median(times);
    let ours = ZERO as f64 / m.as_secs_f64();
    let mut rates: Vec<f64> = (0..rounds).map(|_| xadd_rate(server.1)).collect();
    rates.sort_by(f64::total_cmp);
    let xadd = rates[rates.len() / 2];
    println!(
        "0 ms work, {ZERO} entries: keyserial {ours:.0} entries/s; redis-benchmark XADD {xadd:.0}/s; ratio {:.2}",
        ours / xadd
    );
}
