//! Issue "Baton": each failure the issue lists, as a test (each was checked to fail on the
//! main of the filing, 84c9b8b, as its comment says).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use keyserial::Builder;

/// Per-key state loses updates: concurrent producers of `submit_with_state` on many keys, no
/// other option; every key's state must be made once and see every update. On 84c9b8b: `init`
/// ran again for live keys in every run (4 producers), balances wrong.
#[test]
fn key_state_never_loses_an_update_under_concurrent_producers() {
    #[derive(Default)]
    struct Account {
        balance: u64,
        count: u64,
        next: [u64; 4],
    }
    const KEYS: u64 = if cfg!(miri) { 8 } else { 10_000 };
    const PER: u64 = if cfg!(miri) { 50 } else { 100_000 };
    let inits = Arc::new(AtomicUsize::new(0));
    let i2 = inits.clone();
    let s = Builder::<u64>::new()
        .workers(4)
        .key_idle_timeout(Duration::from_secs(600))
        .key_state(move |_k: &u64| {
            i2.fetch_add(1, SeqCst);
            Account::default()
        })
        .build()
        .unwrap();
    let bad = Arc::new(AtomicU64::new(0));
    std::thread::scope(|scope| {
        for p in 0..4usize {
            let s = &s;
            let bad = bad.clone();
            scope.spawn(move || {
                for i in 0..PER {
                    let k = (i * 7 + p as u64 * 13) % KEYS;
                    let seq = i;
                    let bad = bad.clone();
                    drop(s.submit_with_state(k, move |a: &mut Account| {
                        if a.next[p] > seq {
                            bad.fetch_add(1, SeqCst);
                        }
                        a.next[p] = seq + 1;
                        a.balance += 1;
                        a.count += 1;
                    }));
                }
            });
        }
    });
    let total: u64 = (0..KEYS)
        .map(|k| {
            s.submit_with_state(k, |a: &mut Account| a.balance)
                .unwrap()
                .join()
                .unwrap()
        })
        .sum();
    assert_eq!(
        bad.load(SeqCst),
        0,
        "a producer's updates seen out of order"
    );
    assert_eq!(
        inits.load(SeqCst),
        KEYS as usize,
        "a live key's state made again"
    );
    assert_eq!(total, 4 * PER);
}
