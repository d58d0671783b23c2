//! The public API's rough edges: huge timeouts, errors usable with `?`, matchable build errors,
//! bounded shutdown, and the documented ways to share a serializer.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use keyserial::{Builder, Serializer};

mod common;
use common::{block_worker, wait_until};

#[test]
fn await_termination_with_duration_max_waits_without_bound() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let release = block_worker(&s, 1);
    let queued = s.submit(1, || 7).unwrap();
    s.shutdown();
    let opener = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        release.send(()).unwrap();
    });
    // Used to panic: "overflow when adding duration to instant".
    assert!(s.await_termination(Duration::MAX));
    assert!(s.is_terminated());
    assert_eq!(queued.join().unwrap(), 7);
    // Already terminated: returns at once, whatever the timeout.
    assert!(s.await_termination(Duration::MAX));
    assert!(s.await_termination(Duration::ZERO));
    opener.join().unwrap();
}

fn assert_error_send_sync<T: Send + Sync + std::error::Error + 'static>() {}

#[test]
fn errors_are_send_sync_static_errors() {
    assert_error_send_sync::<keyserial::TaskError>();
    assert_error_send_sync::<keyserial::BuildError>();
    assert_error_send_sync::<keyserial::Rejected<fn()>>();
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<keyserial::PanicPayload>();
}

/// What `anyhow::Result` / `eyre::Result` code does with `?`: convert into a boxed
/// `Error + Send + Sync` (anyhow and eyre require exactly these bounds).
fn app(s: &Serializer<u32>, fail: bool) -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
    let input = std::hint::black_box(7);
    let h = s.submit(1, move || {
        if fail {
            panic!("bad input {input}"); // a formatted message: a `String` payload
        }
        42
    })?;
    let v = h.join()?;
    Ok(v)
}

#[test]
fn task_errors_convert_with_question_mark_and_keep_the_payload() {
    let s: Serializer<u32> = Builder::new().workers(1).build().unwrap();
    assert_eq!(app(&s, false).unwrap(), 42);
    let err = app(&s, true).unwrap_err();
    assert_eq!(err.to_string(), "task panicked: bad input 7");
    let err = err.downcast::<keyserial::TaskError>().unwrap();
    assert!(err.is_panic());
    assert_eq!(err.panic_message(), Some("bad input 7"));
    let payload = err.into_panic();
    assert_eq!(payload.downcast_ref::<String>().unwrap(), "bad input 7");

    // A non-string payload: reachable by value, not printed.
    #[derive(Debug, PartialEq)]
    struct Code(u16);
    let err = s
        .submit(2, || std::panic::panic_any(Code(503)))
        .unwrap()
        .join()
        .unwrap_err();
    assert_eq!(err.to_string(), "task panicked");
    assert_eq!(err.panic_message(), None);
    assert_eq!(*err.into_panic().downcast::<Code>().unwrap(), Code(503));

    // The payload can resume the panic on the joining thread.
    let err = s.submit(3, || panic!("again")).unwrap().join().unwrap_err();
    let payload = std::panic::AssertUnwindSafe(err.into_panic());
    let resumed = std::panic::catch_unwind(move || std::panic::resume_unwind({ payload }.0));
    assert_eq!(*resumed.unwrap_err().downcast::<&str>().unwrap(), "again");

    // Handles of tasks that did not panic have no payload.
    assert!(keyserial::TaskError::Cancelled
        .try_into_panic()
        .unwrap_err()
        .is_cancelled());
}

#[test]
fn max_workers_alone_caps_the_default_worker_count() {
    // Whatever the core count, `max_workers(1)` alone builds one worker, not an error.
    let s = Builder::<u8>::new().max_workers(1).build().unwrap();
    assert_eq!(s.stats().workers, 1);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let s = Builder::<u8>::new().max_workers(64).build().unwrap();
    assert_eq!(s.stats().workers, cores.min(64));
}

#[test]
fn each_invalid_builder_value_has_its_own_build_error_kind() {
    use keyserial::BuildErrorKind as Kind;
    let cases = [
        (
            Builder::<u8>::new().workers(0),
            Kind::ZeroWorkers,
            "workers must be at least 1",
        ),
        (
            Builder::<u8>::new().workers(4).max_workers(2),
            Kind::MaxWorkersBelowWorkers,
            "max_workers (2) must be at least workers (4)",
        ),
        (
            Builder::<u8>::new().workers(1).max_workers(5000),
            Kind::TooManyWorkers,
            "max_workers (5000) must be at most 4096",
        ),
        (
            Builder::<u8>::new().capacity(0),
            Kind::ZeroCapacity,
            "capacity must be at least 1",
        ),
        (
            Builder::<u8>::new().fairness_budget(0),
            Kind::ZeroFairnessBudget,
            "fairness_budget must be at least 1",
        ),
        (
            Builder::<u8>::new().thread_name("a\0b"),
            Kind::InvalidThreadName,
            "thread_name must not contain a NUL byte",
        ),
    ];
    for (builder, kind, message) in cases {
        let err = builder.build().unwrap_err();
        assert_eq!(err.kind(), kind, "{err}");
        assert_eq!(
            err.to_string(),
            format!("invalid keyserial configuration: {message}")
        );
        assert!(std::error::Error::source(&err).is_none());
        assert_eq!(err.clone(), err);
    }
    // The first invalid setting wins; valid edge values build.
    let err = Builder::<u8>::new()
        .workers(0)
        .capacity(0)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), Kind::ZeroWorkers);
    let ok = Builder::<u8>::new()
        .workers(1)
        .max_workers(1)
        .capacity(1)
        .fairness_budget(1)
        .build();
    assert!(ok.is_ok());
}

#[test]
fn shutdown_timeout_returns_true_when_everything_finishes_in_time() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let handles: Vec<_> = (0..100u32)
        .map(|i| s.submit(i % 7, move || i).unwrap())
        .collect();
    assert!(s.shutdown_timeout(Duration::from_secs(10)));
    assert!(s.is_terminated());
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), i as u32);
    }
    assert!(s.execute(1, || ()).is_err());
    assert!(s.shutdown_timeout(Duration::MAX), "idempotent");
}

#[test]
fn shutdown_timeout_cancels_what_has_not_started_and_detaches_stuck_threads() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    let stuck = s
        .submit(1, move || {
            rx.recv().ok();
            "finished"
        })
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || s.stats().running == 1));
    let behind = s.submit(1, || "behind the stuck task").unwrap();
    let other = s.submit(2, || "another key").unwrap();
    assert_eq!(other.join().unwrap(), "another key");

    let t = Instant::now();
    assert!(!s.shutdown_timeout(Duration::from_millis(50)));
    assert!(t.elapsed() >= Duration::from_millis(50));
    assert!(matches!(
        behind.join(),
        Err(keyserial::TaskError::Cancelled)
    ));
    assert!(!stuck.is_finished());

    let t = Instant::now();
    drop(s);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "drop waited for the detached thread"
    );
    // The detached thread finishes its task, and the handle resolves as usual.
    tx.send(()).unwrap();
    assert_eq!(stuck.join().unwrap(), "finished");
}

#[test]
fn drop_after_shutdown_now_and_a_failed_await_termination_does_not_wait() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    let stuck = s
        .submit(1, move || {
            rx.recv().ok();
            5
        })
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || s.stats().running == 1));
    let queued = s.submit(2, || 6).unwrap();
    let pending = s.shutdown_now();
    assert_eq!(pending.len(), 1);
    for p in pending {
        p.run();
    }
    assert_eq!(queued.join().unwrap(), 6);
    assert!(!s.await_termination(Duration::from_millis(20)));
    let t = Instant::now();
    drop(s);
    assert!(t.elapsed() < Duration::from_secs(2));
    tx.send(()).unwrap();
    assert_eq!(stuck.join().unwrap(), 5);
}

#[test]
fn drop_without_a_failed_bounded_wait_still_waits_for_running_tasks() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    let release = block_worker(&s, 1);
    s.execute(1, move || {
        flag.store(true, std::sync::atomic::Ordering::SeqCst)
    })
    .unwrap();
    let opener = thread::spawn(move || {
        thread::sleep(Duration::from_millis(30));
        release.send(()).unwrap();
    });
    // A failed wait without shutdown_now: drop stays graceful (queued tasks run, threads joined).
    s.shutdown();
    assert!(!s.await_termination(Duration::ZERO));
    drop(s);
    assert!(done.load(std::sync::atomic::Ordering::SeqCst));
    opener.join().unwrap();
}

/// A task that joins a later task of its own key would wait forever; every build turns that
/// into a panic of the joining task (caught like any task panic; `tests/self_wait.rs` has the
/// other ways of waiting).
#[test]
fn joining_a_later_task_of_the_same_key_from_inside_a_task_is_caught() {
    let s = std::sync::Arc::new(Builder::<u32>::new().workers(2).build().unwrap());
    let inner = s.clone();
    let outer = s
        .submit(1, move || {
            let later = inner.submit(1, || "later").unwrap();
            later.join().map_err(|e| e.to_string())
        })
        .unwrap();
    let err = outer.join().unwrap_err();
    let msg = err.panic_message().unwrap();
    assert!(msg.contains("its own key"), "{msg}");

    // Other keys, and finished tasks of the same key, may be joined from inside a task.
    let inner = s.clone();
    let ok = s
        .submit(1, move || {
            let other = inner.submit(2, || 2).unwrap().join().unwrap();
            let (tx, rx) = mpsc::channel();
            inner.execute(3, move || tx.send(()).unwrap()).unwrap();
            rx.recv().unwrap();
            other
        })
        .unwrap();
    assert_eq!(ok.join().unwrap(), 2);
    // The same key's task from outside any task: fine.
    assert_eq!(s.submit(1, || 1).unwrap().join().unwrap(), 1);
}
