//! Permit-gated tasks: `Serializer::submit_with_permits`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keyserial::{Builder, RejectReason, Semaphore, TaskError};

mod common;
use common::wait_until;

#[test]
fn a_waiting_key_parks_without_blocking_the_only_worker() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let sem = Semaphore::new(2);
    let held = sem.try_acquire(2).unwrap(); // nobody else can get permits now
    let order = Arc::new(Mutex::new(Vec::new()));
    let log = |v: &'static str| {
        let order = order.clone();
        move || order.lock().unwrap().push(v)
    };
    let gated = s.submit_with_permits(1, &sem, 1, log("gated")).unwrap();
    let behind = s.submit(1, log("behind gated")).unwrap();
    // Other keys keep running on the single worker while key 1 waits.
    for k in 2..50 {
        assert_eq!(s.submit(k, move || k).unwrap().join().unwrap(), k);
    }
    assert!(!gated.is_finished() && !behind.is_finished());
    drop(held);
    gated.join().unwrap();
    behind.join().unwrap();
    assert_eq!(*order.lock().unwrap(), ["gated", "behind gated"]);
    assert!(wait_until(Duration::from_secs(5), || sem.available() == 2));
}

#[test]
fn permits_are_held_while_running_and_released_on_panic() {
    let s = Builder::<u32>::new().workers(2).build().unwrap();
    let sem = Semaphore::new(3);
    let seen = {
        let sem = sem.clone();
        s.submit_with_permits(1, &sem.clone(), 3, move || sem.available())
            .unwrap()
            .join()
            .unwrap()
    };
    assert_eq!(seen, 0, "all three permits held while running");
    assert_eq!(sem.available(), 3, "released when it ended");
    let err = s
        .submit_with_permits(1, &sem, 2, || -> () { panic!("boom") })
        .unwrap()
        .join()
        .unwrap_err();
    assert!(matches!(err, TaskError::Panicked(_)));
    assert_eq!(sem.available(), 3, "released after a panic too");
}

#[test]
fn more_permits_than_the_semaphore_holds_is_rejected() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let sem = Semaphore::new(2);
    let r = s.submit_with_permits(1, &sem, 3, || 7).unwrap_err();
    assert_eq!(r.reason, RejectReason::TooManyPermits);
    assert_eq!((r.task)(), 7);
}

#[test]
fn gated_tasks_of_many_keys_never_exceed_the_permits() {
    let s = Builder::<u32>::new()
        .workers(2)
        .max_workers(4)
        .build()
        .unwrap();
    let sem = Semaphore::new(2);
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..200u32)
        .map(|i| {
            let (inside, max_inside) = (inside.clone(), max_inside.clone());
            s.submit_with_permits(i % 10, &sem, 1 + (i as usize % 2), move || {
                let now = inside.fetch_add(1, Ordering::AcqRel) + 1;
                max_inside.fetch_max(now, Ordering::AcqRel);
                std::thread::sleep(Duration::from_micros(50));
                inside.fetch_sub(1, Ordering::AcqRel);
                i
            })
            .unwrap()
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(h.join().unwrap(), i as u32);
    }
    assert!(max_inside.load(Ordering::Acquire) <= 2);
    assert_eq!(sem.available(), 2);
}

#[test]
fn shutdown_now_hands_back_tasks_waiting_for_permits() {
    let s = Builder::<u32>::new().workers(1).build().unwrap();
    let sem = Semaphore::new(1);
    let held = sem.try_acquire(1).unwrap();
    let gated = s.submit_with_permits(1, &sem, 1, || "ran").unwrap();
    let behind = s.submit(1, || "behind").unwrap();
    // Let the worker reach the gated task and park the key.
    assert!(wait_until(Duration::from_secs(5), || s.stats().queued == 2
        && s.stats().running == 0));
    std::thread::sleep(Duration::from_millis(20));
    let pending = s.shutdown_now();
    assert_eq!(pending.len(), 2);
    assert!(pending.iter().all(|p| p.key() == Some(&1)));
    drop(held); // a grant arriving now must not run anything
    drop(pending);
    assert!(matches!(gated.join(), Err(TaskError::Cancelled)));
    assert!(matches!(behind.join(), Err(TaskError::Cancelled)));
    assert!(s.await_termination(Duration::from_secs(10)));
    assert!(wait_until(Duration::from_secs(5), || sem.available() == 1));
}
