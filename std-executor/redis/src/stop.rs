//! Stopping a running consumer from another thread: a flag the consumer loop reads once per
//! round.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Stops a running [`Consumer`](crate::Consumer) from another thread ([`Consumer::stopper`](crate::Consumer::stopper)).
///
/// ```no_run
/// # let mut c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 1, "g", "c")
/// #     .handler(|_| ()).build()?;
/// let stop = c.stopper();
/// std::thread::spawn(move || {
///     std::thread::sleep(std::time::Duration::from_secs(5));
///     stop.stop();
/// });
/// c.run()?;
/// # Ok::<(), keyserial_redis::StreamError>(())
/// ```
#[derive(Clone, Debug)]
pub struct StopHandle(pub(crate) Arc<AtomicBool>);

impl StopHandle {
    /// Asks the consumer to stop: it reads nothing more, lets submitted tasks finish and
    /// acknowledges them, leaves entries it read but had not submitted pending (this consumer
    /// name re-reads them on restart), and `run` returns `Ok`; if in-flight entries do not all
    /// finish within the drain deadline
    /// ([`drain_timeout`](crate::ConsumerBuilder::drain_timeout), default 30 s), `run` returns
    /// [`StreamError::DrainTimeout`](crate::StreamError::DrainTimeout) with the rest pending.
    /// Safe to call from a signal-watching thread, any number of times.
    ///
    /// ```no_run
    /// # let c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 1, "g", "c")
    /// #     .handler(|_| ()).build()?;
    /// c.stopper().stop();
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn stop(&self) {
        self.0.store(true, Ordering::Release);
    }
}

impl StopHandle {
    /// Whether [`stop`](Self::stop) was called.
    ///
    /// ```no_run
    /// # let c = keyserial_redis::Consumer::builder("redis://127.0.0.1", "s", 1, "g", "c")
    /// #     .handler(|_| ()).build()?;
    /// let stop = c.stopper();
    /// assert!(!stop.is_stopped());
    /// # Ok::<(), keyserial_redis::StreamError>(())
    /// ```
    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
