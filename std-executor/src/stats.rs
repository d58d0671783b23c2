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
