//! `submit_distinct`'s claims: the keys that have a distinct task queued and not started.
//!
//! A claim is made at submission (the submitter learns at once whether its task is a
//! duplicate) and released when the task starts or is abandoned, wherever that happens: run
//! straight from a lane, from the key's chain or a deferral, or handed back by `shutdown_now`. A
//! claim therefore lives exactly as long as "queued and not started", independent of whether the
//! key has an entry in the table (a lane item of a key with no state has none). Sharded sets
//! under mutexes: `submit_distinct` is not a hot path, and a lock makes the claim exact.

use std::collections::HashSet;
use std::hash::Hash;

use crossbeam_utils::CachePadded;

use crate::sync::{lock, Mutex};

const SHARDS: usize = 64;

pub(crate) struct Claims<K> {
    shards: Box<[CachePadded<Mutex<HashSet<K>>>]>,
}

impl<K: Hash + Eq + Clone> Claims<K> {
    pub(crate) fn new() -> Self {
        Claims {
            shards: (0..SHARDS)
                .map(|_| CachePadded::new(Mutex::new(HashSet::new())))
                .collect(),
        }
    }

    fn shard(&self, hash: u64) -> &Mutex<HashSet<K>> {
        &self.shards[hash as usize % SHARDS]
    }

    /// Claims `key` (of table hash `hash`); `false` if it is already claimed (a duplicate).
    pub(crate) fn claim(&self, key: &K, hash: u64) -> bool {
        let mut set = lock(self.shard(hash));
        if set.contains(key) {
            return false;
        }
        set.insert(key.clone())
    }

    /// Releases `key`'s claim: its distinct task starts or leaves unrun.
    pub(crate) fn release(&self, key: &K, hash: u64) {
        let removed = lock(self.shard(hash)).remove(key);
        debug_assert!(removed, "a distinct task releases its own claim once");
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_claimed_once_until_released() {
        let c: Claims<&str> = Claims::new();
        assert!(c.claim(&"a", 1));
        assert!(!c.claim(&"a", 1));
        assert!(c.claim(&"b", 2));
        c.release(&"a", 1);
        assert!(c.claim(&"a", 1));
    }
}
