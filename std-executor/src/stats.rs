//! Counters of a serializer.

/// A snapshot of a [`Serializer`](crate::Serializer)'s counters, from
/// [`Serializer::stats`](crate::Serializer::stats). Under concurrency the fields are read one
/// after another, so they are each exact but not one consistent instant.
///
/// ```
/// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
/// s.submit(1, || ()).unwrap().join().unwrap();
/// let st = s.stats();
/// assert_eq!((st.completed, st.queued, st.running), (1, 0, 0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Live worker threads (core plus elastic).
    pub workers: usize,
    /// Keys that currently hold state (an entry with a chain), including idle ones not yet
    /// released. A key holds state only while it needs it (a permit-gated task, a backlog that
    /// was moved off its lane): plain tasks of a key run straight from its lane and make none.
    pub active_keys: usize,
    /// Tasks admitted and not yet started.
    pub queued: usize,
    /// Tasks running now (a started future that is pending counts as running).
    pub running: usize,
    /// Tasks that finished running (panicked ones included, and started futures that
    /// `shutdown_now` cancelled).
    pub completed: u64,
    /// Tasks that panicked, and tasks failed because their key's `Hash`, `Eq` or `Clone`
    /// panicked on a worker (see [Panics in user code](crate::Serializer#panics-in-user-code)).
    pub panicked: u64,
    /// Submissions refused (shutdown, full, duplicate, too many permits).
    pub rejected: u64,
}

/// One key's state, from [`Serializer::key_stats`](crate::Serializer::key_stats) and
/// [`Serializer::busiest_keys`](crate::Serializer::busiest_keys): a snapshot, each field exact
/// on its own (not one instant).
///
/// ```
/// let s: keyserial::Serializer<u8> = keyserial::Serializer::new();
/// s.pause(&1);
/// s.execute(1, || ()).unwrap();
/// let st = s.key_stats(&1).unwrap();
/// assert_eq!((st.queued, st.running, st.paused), (1, false, true));
/// assert_eq!(s.key_stats(&2), None); // not live
/// # s.resume(&1);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyStats {
    /// The key's tasks admitted and not yet started.
    pub queued: usize,
    /// A task of the key is running (a started future that is pending counts as running).
    pub running: bool,
    /// The key is paused ([`Serializer::pause`](crate::Serializer::pause)).
    pub paused: bool,
    /// How long the key's oldest admitted, not-started task has waited, wherever it waits (the
    /// lane it shares with other keys, behind the key's own running task, or the key's own
    /// queue); `None` if none waits. Never more than the truth, and within about a millisecond
    /// of it while a worker is free to look at the lanes (when every worker is inside a long
    /// task, to within the time the next 64 submits to the key's lane took, or the moment of
    /// this call): tasks carry no clock of their own, the lanes keep a few marks of when they
    /// were filled instead.
    pub oldest_queued: Option<std::time::Duration>,
}
