//! Consumer processes: the example CLI run in child processes of the test binary. A test file
//! that uses these includes the example as `mod cli` and has the `cli_child` entry (see
//! `stream_redis.rs`); the children re-run the test binary with `KEYSERIAL_STREAM_CLI` set.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::Duration;

use keyserial_redis::StreamId;

pub fn cli_command(args: &[String]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "-q",
        "--ignored",
        "--exact",
        "cli_child",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env("KEYSERIAL_STREAM_CLI", args.join("\n"));
    c
}

#[allow(clippy::too_many_arguments)]
pub fn consumer_args(
    url: &str,
    stream: &str,
    partitions: u32,
    name: &str,
    index: u32,
    of: u32,
    log: &Path,
    extra: &[&str],
) -> Vec<String> {
    let mut a: Vec<String> = [
        "--redis",
        url,
        "--stream",
        stream,
        "--partitions",
        &partitions.to_string(),
        "--group",
        "g",
        "--consumer",
        name,
        "--index",
        &index.to_string(),
        "--of",
        &of.to_string(),
        "--log",
        log.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

pub fn spawn_consumer(args: &[String]) -> Child {
    cli_command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

pub fn line_count(path: &Path) -> usize {
    std::fs::read(path).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count())
}

pub fn wait_output(child: Child, limit: Duration) -> Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("consumer process {pid} did not exit within {limit:?}");
        }
    }
}

/// `watermark {p} {id}` lines of a consumer's stdout.
pub fn watermarks(out: &Output) -> BTreeMap<u32, Option<StreamId>> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("watermark "))
        .map(|l| {
            let (p, id) = l.split_once(' ').unwrap();
            (p.parse().unwrap(), id.parse().ok())
        })
        .collect()
}

/// The log's lines as `(partition, id, key)`, in file order.
pub fn read_log(path: &Path) -> Vec<(u32, StreamId, String)> {
    let f = std::fs::File::open(path).unwrap();
    BufReader::new(f)
        .lines()
        .map(|l| {
            let l = l.unwrap();
            let mut it = l.splitn(3, ' ');
            let p = it.next().unwrap().parse().unwrap();
            let id = it.next().unwrap().parse().unwrap();
            let key = it.next().unwrap().to_string();
            (p, id, key)
        })
        .collect()
}
