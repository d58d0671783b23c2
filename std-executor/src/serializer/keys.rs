//! Per-key control: pausing and resuming a key (`control.rs` has the protocol).

use std::hash::Hash;

use super::Serializer;

impl<K> Serializer<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// Pauses `key`: none of its tasks starts after this returns, until [`resume`](Self::resume).
    /// The task of the key that is running (or being started) as `pause` is called finishes;
    /// later submissions are accepted and queue behind the pause; other keys go on. Pausing a
    /// key with no tasks works too: the key stays live (it is never idle-released while paused,
    /// and counts in [`Stats::active_keys`](crate::Stats::active_keys)). Pausing a paused key
    /// does nothing. A paused key holds no worker thread.
    ///
    /// At [`shutdown`](Self::shutdown), a paused key's queued tasks do not run: their handles
    /// resolve [`Cancelled`](crate::TaskError::Cancelled) when the serializer terminates
    /// ([`shutdown_now`](Self::shutdown_now) hands them back, like any queued task).
    ///
    /// Runs the key's `Hash` and `Eq` (and `Clone`, the first time) on the calling thread.
    ///
    /// ```
    /// use std::time::Duration;
    /// let s: keyserial::Serializer<&str> = keyserial::Serializer::new();
    /// s.pause(&"alice");
    /// let h = s.submit("alice", || "ran after resume").unwrap();
    /// let other = s.submit("bob", || "bob is not paused").unwrap();
    /// assert_eq!(other.join().unwrap(), "bob is not paused");
    /// std::thread::sleep(Duration::from_millis(20));
    /// assert!(!h.is_finished());
    /// s.resume(&"alice");
    /// assert_eq!(h.join().unwrap(), "ran after resume");
    /// ```
    pub fn pause(&self, key: &K) {
        crate::key_control::pause(&self.shared, key);
    }

    /// Resumes a paused `key`: its queued tasks start again, in order. Resuming a key that is
    /// not paused (or not live) does nothing.
    ///
    /// ```
    /// let s: keyserial::Serializer<u32> = keyserial::Serializer::new();
    /// s.resume(&1); // not paused: nothing happens
    /// s.pause(&1);
    /// let h = s.submit(1, || 5).unwrap();
    /// s.resume(&1);
    /// assert_eq!(h.join().unwrap(), 5);
    /// ```
    pub fn resume(&self, key: &K) {
        crate::key_control::resume(&self.shared, key);
    }
}
