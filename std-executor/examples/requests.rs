//! Per-user request handling: each user's requests are applied in arrival order, different users
//! in parallel, and a slow user delays nobody else.
//!
//! Run with `cargo run --release -p keyserial --example requests`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keyserial::Builder;

/// One account's state; only ever touched by tasks of its own key, so the lock is never contended.
#[derive(Default)]
struct Account {
    balance: i64,
    history: Vec<i64>,
}

fn main() {
    let accounts: Arc<Mutex<HashMap<u32, Arc<Mutex<Account>>>>> = Default::default();
    let account = |user: u32| accounts.lock().unwrap().entry(user).or_default().clone();

    let s = Builder::<u32>::new()
        .thread_name("requests")
        .key_idle_timeout(Duration::from_secs(1))
        .build()
        .expect("start the serializer");

    let started = Instant::now();
    // 1,000 users, 50 requests each, interleaved as they would arrive from the network.
    for request in 0..50i64 {
        for user in 0..1_000u32 {
            let acct = account(user);
            // User 7 is slow: its requests take 2 ms each. Nobody else waits for it.
            let slow = user == 7;
            s.execute(user, move || {
                if slow {
                    std::thread::sleep(Duration::from_millis(2));
                }
                let mut a = acct.lock().unwrap();
                a.balance += request;
                a.history.push(request);
            })
            .expect("serializer is running");
        }
    }
    // A read that sees every earlier request of user 42, in order.
    let acct = account(42);
    let snapshot = s
        .submit(42, move || acct.lock().unwrap().history.clone())
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(snapshot, (0..50).collect::<Vec<_>>());
    println!(
        "user 42 saw its 50 requests in order after {:?}",
        started.elapsed()
    );

    s.shutdown();
    assert!(s.await_termination(Duration::from_secs(30)));
    for (user, acct) in accounts.lock().unwrap().iter() {
        let a = acct.lock().unwrap();
        assert_eq!(a.history, (0..50).collect::<Vec<_>>(), "user {user}");
        assert_eq!(a.balance, (0..50).sum::<i64>());
    }
    let st = s.stats();
    println!(
        "all 1,000 users done in {:?}: {} tasks completed, {} keys still held",
        started.elapsed(),
        st.completed,
        st.active_keys
    );
}
