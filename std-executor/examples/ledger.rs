//! A per-account ledger whose balances live in keyserial's per-key state: each operation
//! changes its account's balance through `&mut`, with no lock and no shared map of balances.
//! Each account's operations run in order (the order is the lock), many accounts in parallel,
//! and with `max_keys` plus `key_idle_timeout` the live balances are a bounded, ordered cache:
//! an account's balance is loaded from the store when its first operation runs and written back
//! when the account goes idle or makes room for another.
//!
//! ```text
//! cargo run --release -p keyserial --example ledger
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keyserial::Builder;

/// An account while it is live.
struct Account {
    balance: i64,
}

/// Stands for the database: touched once per account life (load, write back), never per
/// operation. (A real service would call its store here.)
type Store = Arc<Mutex<HashMap<u64, i64>>>;

/// The operations: `(account, amount)`, deposits and withdrawals.
fn operations(n: usize, accounts: u64) -> Vec<(u64, i64)> {
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % accounts, (seed >> 32) as i64 % 50 - 25)
        })
        .collect()
}

/// No overdraft: a withdrawal that would take the balance below 0 is refused.
fn apply(balance: &mut i64, amount: i64) -> bool {
    if *balance + amount < 0 {
        return false;
    }
    *balance += amount;
    true
}

fn main() {
    const ACCOUNTS: u64 = 10_000;
    const OPS: usize = 200_000;
    const OPENING: i64 = 100;
    let ops = operations(OPS, ACCOUNTS);
    let store: Store = Arc::default();
    let (load, save) = (store.clone(), store.clone());
    let ledger = Builder::<u64>::new()
        .max_keys(1_000) // at most 1,000 accounts in memory at once
        .key_idle_timeout(Duration::from_millis(50))
        .key_state(move |account: &u64| Account {
            balance: *load.lock().unwrap().get(account).unwrap_or(&OPENING),
        })
        .on_key_release(move |account, state: Account| {
            save.lock().unwrap().insert(account, state.balance);
        })
        .build()
        .expect("a ledger");

    let start = Instant::now();
    let mut refusals = Vec::with_capacity(OPS);
    for &(account, amount) in &ops {
        let refused = ledger
            .submit_with_state(account, move |a: &mut Account| {
                !apply(&mut a.balance, amount)
            })
            .expect("accepted");
        refusals.push(refused);
    }
    let refused = refusals
        .into_iter()
        .map(|h| h.join().expect("ran"))
        .filter(|&r| r)
        .count();
    drop(ledger); // every live account's balance goes through the hook
    let elapsed = start.elapsed();

    // The same operations one by one, in order, on one thread: per-account order makes the
    // results identical.
    let mut expected: HashMap<u64, i64> = HashMap::new();
    let mut expected_refused = 0;
    for &(account, amount) in &ops {
        if !apply(expected.entry(account).or_insert(OPENING), amount) {
            expected_refused += 1;
        }
    }
    let store = store.lock().unwrap();
    assert_eq!(
        *store, expected,
        "every account's balance, as if run one by one"
    );
    assert_eq!(refused, expected_refused);
    println!(
        "{OPS} operations on {} accounts in {elapsed:.0?} ({:.2} M ops/s), at most 1,000 \
         accounts live at once; {refused} refused for want of funds; every balance matches a \
         one-by-one replay",
        store.len(),
        OPS as f64 / elapsed.as_secs_f64() / 1e6,
    );
}
