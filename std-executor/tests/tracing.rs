//! Cargo feature `tracing`: a span per task (key, queue wait, run time) and events for the
//! per-key controls, refusals and key releases. Run with
//! `cargo test -p keyserial --features tracing --test tracing`.
#![cfg(feature = "tracing")]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keyserial::{Builder, RejectReason};
use tracing_subscriber::fmt::format::FmtSpan;

mod common;
use common::block_worker;

/// Everything the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
    fn lines_with(&self, what: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(what))
            .map(String::from)
            .collect()
    }
}

/// One test: the subscriber is global (workers are other threads), set once.
#[test]
fn spans_and_events() {
    let out = Captured::default();
    let writer = out.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    // A span per task, with the key's Debug text, its queue wait and its run time.
    let s = Builder::<u32>::new()
        .workers(2)
        .key_idle_timeout(Duration::ZERO)
        .trace_keys()
        .build()
        .unwrap();
    s.submit(7, || std::thread::sleep(Duration::from_millis(2)))
        .unwrap()
        .join()
        .unwrap();
    s.execute(7, || ()).unwrap();
    assert_eq!(s.submit_async(8, async { 8 }).unwrap().join().unwrap(), 8);
    std::thread::sleep(Duration::from_millis(20));
    let closes = out.lines_with("task");
    let seven: Vec<_> = closes.iter().filter(|l| l.contains("key=7")).collect();
    assert!(seven.len() >= 2, "a span per task of key 7: {closes:#?}");
    assert!(
        seven
            .iter()
            .all(|l| l.contains("wait_us=") && l.contains("run_us=")),
        "{seven:#?}"
    );
    let slow = seven
        .iter()
        .filter_map(|l| l.split("run_us=").nth(1))
        .filter_map(|v| {
            let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u64>().ok()
        })
        .max()
        .unwrap();
    assert!(slow >= 2_000, "the 2 ms task's run time: {slow} us");
    assert!(
        closes
            .iter()
            .any(|l| l.contains("key=8") && l.contains("run_us=")),
        "a future's span"
    );

    // Events: pause, resume, cancel_key (with what it handed back), a refusal, a key release.
    s.pause(&9);
    s.resume(&9);
    let gate = block_worker(&s, 3);
    s.execute(3, || ()).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let back = s.cancel_key(&3);
    drop(gate);
    drop(back);
    s.shutdown();
    assert_eq!(
        s.try_submit(1, || ()).unwrap_err().reason,
        RejectReason::Shutdown
    );
    assert!(s.await_termination(Duration::from_secs(10)));
    let text = out.text();
    for what in ["pause", "resume", "cancel_key", "rejected", "key released"] {
        assert!(text.contains(what), "no `{what}` event in:\n{text}");
    }
    assert!(out
        .lines_with("cancel_key")
        .iter()
        .any(|l| l.contains("key=3") && l.contains("tasks=1")));
    assert!(out
        .lines_with("rejected")
        .iter()
        .any(|l| l.contains("shut down")));

    // Without `trace_keys`, spans name the key by its hash.
    let h = Builder::<String>::new().workers(1).build().unwrap();
    h.submit("x".to_string(), || ()).unwrap().join().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        out.lines_with("task").iter().any(|l| l.contains("key=#")),
        "{}",
        out.text()
    );
}
