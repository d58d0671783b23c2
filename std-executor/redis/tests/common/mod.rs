//! What the Redis tests share: a real `redis-server` on a free loopback port, started by the
//! test (a missing binary fails it: `.ci/run` installs it), and small readers of its state.
#![allow(dead_code)] // each test file uses some of these

pub mod children;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use keyserial_redis::{Event, StreamId};

// ---------------------------------------------------------------- a real server

pub struct RedisServer {
    pub child: Child,
    pub port: u16,
}

pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port");
    l.local_addr().unwrap().port()
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::start_on(free_port())
    }

    pub fn start_on(port: u16) -> RedisServer {
        Self::start_with(port, None)
    }

    /// With `aof_dir`: an append-only file there, fsynced on every write (a SIGKILL loses
    /// nothing acknowledged); without: no persistence at all.
    pub fn start_with(port: u16, aof_dir: Option<&std::path::Path>) -> RedisServer {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"]);
        match aof_dir {
            Some(dir) => cmd
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                ])
                .arg("--dir")
                .arg(dir),
            None => cmd.args(["--save", "", "--appendonly", "no"]),
        };
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `redis-server` ({e}): these tests need a real Redis server; \
                     install it (Debian: apt-get install -y redis-server; .ci/run does this)"
                )
            });
        let s = RedisServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = redis::Client::open(s.url()).and_then(|c| c.get_connection()) {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return s;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {port} did not come up"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn con(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn pending_count(con: &mut redis::Connection, stream: &str, group: &str) -> i64 {
    let v: redis::Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .query(con)
        .unwrap();
    match v {
        redis::Value::Array(a) => match &a[0] {
            redis::Value::Int(n) => *n,
            other => panic!("XPENDING count: {other:?}"),
        },
        other => panic!("XPENDING: {other:?}"),
    }
}

pub fn last_id(con: &mut redis::Connection, stream: &str) -> Option<StreamId> {
    let v: Vec<(String, HashMap<String, String>)> = redis::cmd("XREVRANGE")
        .arg(stream)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query(con)
        .unwrap();
    v.first().map(|(id, _)| id.parse().unwrap())
}

pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("keyserial-stream-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn collect_events() -> (
    Arc<Mutex<Vec<Event>>>,
    impl Fn(&Event) + Send + Sync + 'static,
) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let e2 = Arc::clone(&events);
    (events, move |e: &Event| e2.lock().unwrap().push(e.clone()))
}

/// Every entry of `stream`, in order, with its fields as text.
pub fn xrange(
    con: &mut redis::Connection,
    stream: &str,
) -> Vec<(StreamId, HashMap<String, String>)> {
    let v: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query(con)
        .unwrap();
    v.into_iter()
        .map(|(id, f)| (id.parse().unwrap(), f))
        .collect()
}

/// Redis's delivery count of one pending entry (`None`: not pending).
pub fn delivery_count(
    con: &mut redis::Connection,
    stream: &str,
    group: &str,
    id: StreamId,
) -> Option<i64> {
    let rows: Vec<(String, String, i64, i64)> = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .arg(id.to_string())
        .arg(id.to_string())
        .arg(1)
        .query(con)
        .unwrap();
    rows.first().map(|r| r.3)
}

/// Waits until `f` holds, at most `limit`; panics with `what` if it does not.
pub fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// Sends `signal` (`STOP`, `CONT`, `KILL`, `TERM`, …) to process `pid`.
pub fn signal(pid: u32, signal: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{signal} {pid}");
}

/// A test knob: the environment variable `name` as a number, or `default`.
pub fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
