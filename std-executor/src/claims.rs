//! `submit_distinct`'s claims: the keys that have a distinct task queued and not started.
//!
//! A claim is made at submission (the submitter learns at once whether its task is a
//! duplicate) and is a [`Claim`] value that the task's closure carries: it is released when
//! the closure starts (the first thing the distinct task does) or is dropped unrun, wherever
//! that happens: run from a lane, a chain or a deferral, superseded or cancelled, handed back
//! by `shutdown_now` and then run or dropped. So a claim lives exactly as long as "queued and
//! not started", and no code path has to remember to release it.
//!
//! Sharded maps `submitter's key hash -> [(key, claim id)]` under mutexes: `submit_distinct`
//! is not a hot path, and a lock makes the claim exact. The key's own `Hash` is never called
//! here (the submitter's hash picks the bucket), and a release finds its entry by id, so it
//! calls none of the key's code either (only the stored clone's `Drop`, outside the lock and
//! guarded, `user.rs`). A claim runs the key's `Eq` and `Clone` under the shard lock, because
//! the check and the insert must be one step; both come before any change, so a panic in them
//! leaves the map as it was.
//!
//! A key whose `Hash` is inconsistent may get two claims (its two submissions hash apart):
//! one duplicate is accepted, nothing is lost.

use std::collections::HashMap;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::sync::{lock, Mutex};

const SHARDS: usize = 64;

struct Shard<K> {
    claimed: HashMap<u64, Vec<(K, u64)>>,
    /// The id of the next claim made in this shard.
    next: u64,
}

pub(crate) struct Claims<K> {
    shards: Box<[CachePadded<Mutex<Shard<K>>>]>,
}

/// A key's claim, held by its distinct task until it starts or is dropped.
pub(crate) struct Claim<K> {
    claims: Arc<Claims<K>>,
    hash: u64,
    id: u64,
}

impl<K: Eq + Clone> Claims<K> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Claims {
            shards: (0..SHARDS)
                .map(|_| {
                    CachePadded::new(Mutex::new(Shard {
                        claimed: HashMap::new(),
                        next: 0,
                    }))
                })
                .collect(),
        })
    }

    /// Claims `key` (of submitter's hash `hash`); `None` if it is already claimed (a
    /// duplicate). Runs the key's `Eq` and `Clone` under the shard's lock, before any change.
    pub(crate) fn claim(self: &Arc<Self>, key: &K, hash: u64) -> Option<Claim<K>> {
        let mut shard = lock(self.shard(hash));
        if let Some(bucket) = shard.claimed.get(&hash) {
            if bucket.iter().any(|(k, _)| k == key) {
                return None;
            }
        }
        let key = key.clone();
        let id = shard.next;
        shard.next += 1;
        shard.claimed.entry(hash).or_default().push((key, id));
        Some(Claim {
            claims: self.clone(),
            hash,
            id,
        })
    }

    /// How many keys are claimed (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| lock(s).claimed.values().map(Vec::len).sum::<usize>())
            .sum()
    }
}

impl<K> Drop for Claim<K> {
    fn drop(&mut self) {
        let removed = {
            let mut shard = lock(self.claims.shard(self.hash));
            let bucket = shard.claimed.get_mut(&self.hash);
            let removed = bucket.and_then(|b| {
                let i = b.iter().position(|(_, id)| *id == self.id)?;
                Some(b.swap_remove(i))
            });
            if shard.claimed.get(&self.hash).is_some_and(Vec::is_empty) {
                shard.claimed.remove(&self.hash);
            }
            removed
        };
        // The stored clone's `Drop` is the user's: outside the lock, guarded.
        crate::user::drop_quietly(removed);
    }
}

impl<K> Claims<K> {
    fn shard(&self, hash: u64) -> &Mutex<Shard<K>> {
        &self.shards[hash as usize % SHARDS]
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_claimed_once_until_its_claim_is_dropped() {
        let c: Arc<Claims<&str>> = Claims::new();
        let a = c.claim(&"a", 1).expect("first claim");
        assert!(c.claim(&"a", 1).is_none(), "a duplicate");
        let b = c.claim(&"b", 1).expect("another key of the same hash");
        assert_eq!(c.len(), 2);
        drop(a);
        assert_eq!(c.len(), 1);
        let a2 = c.claim(&"a", 1).expect("claimable again");
        drop(b);
        drop(a2);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn a_panicking_eq_or_clone_leaves_the_claims_as_they_were() {
        crate::test_util::quiet_panics();
        #[derive(PartialEq, Eq)]
        struct Evil(u8);
        impl Clone for Evil {
            fn clone(&self) -> Self {
                if self.0 == 2 {
                    crate::test_util::quiet_panic(2)
                }
                Evil(self.0)
            }
        }
        let c: Arc<Claims<Evil>> = Claims::new();
        let one = c.claim(&Evil(1), 5).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c.claim(&Evil(2), 5)));
        assert!(r.is_err());
        assert_eq!(c.len(), 1, "nothing inserted");
        assert!(
            c.claim(&Evil(1), 5).is_none(),
            "the lock still works and the claim holds"
        );
        drop(one);
        assert_eq!(c.len(), 0);
    }
}
