//! A consumer of a partitioned Redis stream, in per-key order (DESIGN.md section 3.3; tests
//! outside the repository drive this CLI, so its arguments and output are a contract).
//!
//! ```text
//! cargo run --release -p keyserial-redis --example stream_consumer -- \
//!     --redis URL --stream NAME --partitions P --group G --consumer NAME --index I --of N \
//!     --log FILE [--work-ms MAX] [--claim-idle-ms MS] [--exit-when-idle-ms MS] \
//!     [--max-attempts A] [--retry-ms MS] [--reconnect-attempts N] [--drain-ms MS]
//! ```
//!
//! Consumer `I` of `N` owns the partitions `p` of `{NAME}:0..P` with `p % N == I`. Its handler
//! sleeps a uniform random 0..=MAX ms (with `--work-ms`), then appends `{partition} {id} {key}\n`
//! to FILE with one `write` (the file is opened with `O_APPEND`), before the entry is
//! acknowledged. An entry with a field `fail` = N (decimal) makes the handler fail (before the
//! sleep, writing nothing) while its attempt is at most N: it is retried after `--retry-ms`
//! (default 100, doubling up to 10 s), up to `--max-attempts` runs in all (default 3), then
//! appended to the dead-letter stream `{NAME}:dead` and acknowledged. A lost Redis connection is
//! retried for ever (one stderr line per failed attempt), or `--reconnect-attempts N` times in a
//! row before exiting 1. SIGTERM or SIGINT stops it: it reads nothing more, lets the entries in
//! flight finish and acknowledges them within `--drain-ms` (default 30000), prints the
//! watermarks and stats and exits 0; past the deadline it exits 1 (one line) with the rest left
//! pending. With `--exit-when-idle-ms` it exits 0 once nothing was read and nothing was in
//! flight that long, printing `watermark {p} {id}` for each owned partition (`-`: nothing done)
//! and a `stats` line. A bad argument or an unreachable server: exit status 1, one line on
//! stderr.

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::fs::{File, OpenOptions};
use std::hash::BuildHasher;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keyserial_redis::Consumer;

struct Args {
    redis: String,
    stream: String,
    partitions: u32,
    group: String,
    consumer: String,
    index: u32,
    of: u32,
    log: String,
    work_ms: Option<u64>,
    claim_idle_ms: Option<u64>,
    exit_when_idle_ms: Option<u64>,
    max_attempts: Option<u64>,
    retry_ms: Option<u64>,
    reconnect_attempts: Option<u64>,
    drain_ms: Option<u64>,
}

const USAGE: &str = "usage: stream_consumer --redis URL --stream NAME --partitions P --group G --consumer NAME --index I --of N --log FILE [--work-ms MAX] [--claim-idle-ms MS] [--exit-when-idle-ms MS] [--max-attempts A] [--retry-ms MS] [--reconnect-attempts N] [--drain-ms MS]";

fn parse(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut v: [Option<String>; 15] = Default::default();
    const NAMES: [&str; 15] = [
        "--redis",
        "--stream",
        "--partitions",
        "--group",
        "--consumer",
        "--index",
        "--of",
        "--log",
        "--work-ms",
        "--claim-idle-ms",
        "--exit-when-idle-ms",
        "--max-attempts",
        "--retry-ms",
        "--reconnect-attempts",
        "--drain-ms",
    ];
    while let Some(a) = it.next() {
        if a == "--help" || a == "-h" {
            return Ok(None);
        }
        // `--name=value` or `--name value`.
        let (name, inline) = match a.split_once('=') {
            Some((n, val)) if n.starts_with("--") => (n.to_string(), Some(val.to_string())),
            _ => (a.clone(), None),
        };
        let Some(slot) = NAMES.iter().position(|n| *n == name) else {
            return Err(format!("unknown argument {a:?}"));
        };
        let value = match inline {
            Some(val) => val,
            None => it.next().ok_or_else(|| format!("{name} needs a value"))?,
        };
        if v[slot].is_some() {
            return Err(format!("{name} given twice"));
        }
        v[slot] = Some(value);
    }
    let mut take = |i: usize| -> Result<String, String> {
        v[i].take()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("missing {} (see --help)", NAMES[i]))
    };
    fn num<T: std::str::FromStr>(name: &str, s: &str) -> Result<T, String> {
        s.parse()
            .map_err(|_| format!("{name} must be a non-negative integer, got {s:?}"))
    }
    let redis = take(0)?;
    let stream = take(1)?;
    let partitions: u32 = num("--partitions", &take(2)?)?;
    let group = take(3)?;
    let consumer = take(4)?;
    let index: u32 = num("--index", &take(5)?)?;
    let of: u32 = num("--of", &take(6)?)?;
    let log = take(7)?;
    let opt = |s: Option<String>, name: &str| s.map(|s| num::<u64>(name, &s)).transpose();
    let work_ms = opt(v[8].take(), "--work-ms")?;
    let claim_idle_ms = opt(v[9].take(), "--claim-idle-ms")?;
    let exit_when_idle_ms = opt(v[10].take(), "--exit-when-idle-ms")?;
    let max_attempts = opt(v[11].take(), "--max-attempts")?;
    let retry_ms = opt(v[12].take(), "--retry-ms")?;
    let reconnect_attempts = opt(v[13].take(), "--reconnect-attempts")?;
    let drain_ms = opt(v[14].take(), "--drain-ms")?;
    if reconnect_attempts.is_some_and(|a| a > u64::from(u32::MAX)) {
        return Err("--reconnect-attempts must fit 32 bits".into());
    }
    if max_attempts == Some(0) || max_attempts.is_some_and(|a| a > u64::from(u32::MAX)) {
        return Err("--max-attempts must be at least 1 (and fit 32 bits)".into());
    }
    if partitions == 0 {
        return Err("--partitions must be at least 1".into());
    }
    if of == 0 || index >= of {
        return Err(format!("--index {index} must be below --of {of}"));
    }
    if index >= partitions {
        return Err(format!("--index {index} owns no partition of {partitions}"));
    }
    if claim_idle_ms == Some(0) {
        return Err("--claim-idle-ms must be at least 1".into());
    }
    if !redis.starts_with("redis://")
        && !redis.starts_with("rediss://")
        && !redis.starts_with("unix://")
    {
        return Err(format!("--redis must be a redis:// URL, got {redis:?}"));
    }
    Ok(Some(Args {
        redis,
        stream,
        partitions,
        group,
        consumer,
        index,
        of,
        log,
        work_ms,
        claim_idle_ms,
        exit_when_idle_ms,
        max_attempts,
        retry_ms,
        reconnect_attempts,
        drain_ms,
    }))
}

thread_local! {
    static RNG: Cell<u64> = Cell::new(RandomState::new().hash_one(std::thread::current().id()) | 1);
}

/// Uniform in `0..=max` (splitmix64, then a widening multiply: bias below 2^-60).
fn uniform(max: u64) -> u64 {
    RNG.with(|s| {
        let mut z = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(z);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((u128::from(z) * (u128::from(max) + 1)) >> 64) as u64
    })
}

fn main() -> ExitCode {
    ExitCode::from(run(std::env::args().skip(1)))
}

/// The whole program, from its arguments to its exit status (`tests/stream_redis.rs` runs this
/// same file in child processes of the test binary).
pub fn run(argv: impl Iterator<Item = String>) -> u8 {
    let args = match parse(argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return 0;
        }
        Err(m) => {
            eprintln!("stream_consumer: {m}");
            return 1;
        }
    };
    let log: Arc<File> = match OpenOptions::new().append(true).create(true).open(&args.log) {
        Ok(f) => Arc::new(f),
        Err(e) => {
            eprintln!("stream_consumer: cannot open --log {:?}: {e}", args.log);
            return 1;
        }
    };
    let work_ms = args.work_ms;
    let mut b = Consumer::builder(
        &args.redis,
        &args.stream,
        args.partitions,
        &args.group,
        &args.consumer,
    )
    .index(args.index, args.of)
    // Handlers that sleep need many waiting workers; 64 keep 64 entries' work going at once.
    .workers(if work_ms.is_some_and(|m| m > 0) {
        64
    } else {
        4
    })
    .handler(move |e| -> Result<(), String> {
        // `fail` = N: fail while the attempt is at most N.
        if let Some(n) = e.field(b"fail") {
            let n: u64 = std::str::from_utf8(n)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("entry {}: fail field is not a number", e.id))?;
            if u64::from(e.attempt()) <= n {
                return Err(format!("fail={n}, attempt {}", e.attempt()));
            }
        }
        if let Some(max) = work_ms {
            std::thread::sleep(Duration::from_millis(uniform(max)));
        }
        let mut line = format!("{} {} ", e.partition, e.id).into_bytes();
        line.extend_from_slice(&e.key);
        line.push(b'\n');
        // One write on an O_APPEND file: the line lands whole, before the entry is acked.
        match (&*log).write(&line) {
            Ok(n) if n == line.len() => {}
            Ok(n) => {
                eprintln!(
                    "stream_consumer: short write to the log ({n} of {} bytes)",
                    line.len()
                );
                std::process::exit(1);
            }
            Err(err) => {
                eprintln!("stream_consumer: cannot write the log: {err}");
                std::process::exit(1);
            }
        }
        Ok(())
    });
    let first = Duration::from_millis(args.retry_ms.unwrap_or(100));
    b = b.retry(
        args.max_attempts.map_or(3, |a| a as u32),
        first,
        first.max(Duration::from_secs(10)),
    );
    if let Some(n) = args.reconnect_attempts {
        b = b.reconnect(n as u32, Duration::from_millis(50), Duration::from_secs(2));
    }
    b = b.drain_timeout(Duration::from_millis(args.drain_ms.unwrap_or(30_000)));
    if let Some(ms) = args.claim_idle_ms {
        b = b.claim_idle(Duration::from_millis(ms));
    }
    if let Some(ms) = args.exit_when_idle_ms {
        b = b.exit_when_idle(Duration::from_millis(ms));
    }
    let mut consumer = match b.build() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("stream_consumer: {e}");
            return 1;
        }
    };
    // SIGTERM and SIGINT set a flag; a watcher turns it into a stop (a drain).
    let signalled = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&signalled)) {
            eprintln!("stream_consumer: cannot handle signal {sig}: {e}");
            return 1;
        }
    }
    let stopper = consumer.stopper();
    std::thread::spawn(move || loop {
        if signalled.load(Ordering::Relaxed) {
            stopper.stop();
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    });
    let stats = match consumer.run() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stream_consumer: {e}");
            return 1;
        }
    };
    let mut out = std::io::stdout().lock();
    for p in consumer.owned() {
        match consumer.watermark().mark(p) {
            Some(id) => writeln!(out, "watermark {p} {id}"),
            None => writeln!(out, "watermark {p} -"),
        }
        .ok();
    }
    writeln!(
        out,
        "stats read={} acked={} claimed={} missing_key={} deleted={} panicked={} lost={} failed={} retried={} dead_lettered={}",
        stats.read,
        stats.acked,
        stats.claimed,
        stats.missing_key,
        stats.deleted,
        stats.panicked,
        stats.lost,
        stats.failed,
        stats.retried,
        stats.dead_lettered
    )
    .ok();
    out.flush().ok();
    0
}
