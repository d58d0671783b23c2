//! Errors: rejected submissions (the task comes back), task outcomes, bad configuration.

use std::any::Any;
use std::fmt;

/// Why a task did not produce a value.
///
/// ```
/// use keyserial::{Serializer, TaskError};
/// let s: Serializer<u32> = Serializer::new();
/// let h = s.submit(1, || panic!("boom")).unwrap();
/// assert!(matches!(h.join(), Err(TaskError::Panicked(_))));
/// ```
pub enum TaskError {
    /// The task panicked; the payload is the panic's.
    Panicked(Box<dyn Any + Send>),
    /// The task was never run: handed back by `shutdown_now` and then dropped.
    Cancelled,
    /// A `submit_latest` task replaced by a newer `submit_latest` of the same key before it started.
    Superseded,
}

impl TaskError {
    /// The panic message, if the task panicked with a string payload.
    ///
    /// ```
    /// use keyserial::Serializer;
    /// let s: Serializer<u32> = Serializer::new();
    /// let err = s.submit(1, || panic!("boom")).unwrap().join().unwrap_err();
    /// assert_eq!(err.panic_message(), Some("boom"));
    /// ```
    pub fn panic_message(&self) -> Option<&str> {
        match self {
            TaskError::Panicked(p) => p
                .downcast_ref::<&'static str>()
                .copied()
                .or_else(|| p.downcast_ref::<String>().map(String::as_str)),
            _ => None,
        }
    }
}

impl fmt::Debug for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Panicked(_) => match self.panic_message() {
                Some(m) => write!(f, "Panicked({m:?})"),
                None => f.write_str("Panicked(..)"),
            },
            TaskError::Cancelled => f.write_str("Cancelled"),
            TaskError::Superseded => f.write_str("Superseded"),
        }
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Panicked(_) => match self.panic_message() {
                Some(m) => write!(f, "task panicked: {m}"),
                None => f.write_str("task panicked"),
            },
            TaskError::Cancelled => f.write_str("task was cancelled before it started"),
            TaskError::Superseded => f.write_str("task was superseded by a newer submit_latest"),
        }
    }
}

impl std::error::Error for TaskError {}

/// Why a submission was refused.
///
/// ```
/// use keyserial::{RejectReason, Serializer};
/// let s: Serializer<u32> = Serializer::new();
/// s.shutdown();
/// let r = s.execute(1, || ()).unwrap_err();
/// assert_eq!(r.reason, RejectReason::Shutdown);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The serializer is at capacity (`try_submit` only; the blocking calls wait instead).
    Full,
    /// The serializer is shut down.
    Shutdown,
    /// `submit_with_permits` asked for more permits than the semaphore can ever hold.
    TooManyPermits,
    /// `submit_distinct` while the key already has a `submit_distinct` task queued, not started.
    Duplicate,
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RejectReason::Full => "the serializer is at capacity",
            RejectReason::Shutdown => "the serializer is shut down",
            RejectReason::TooManyPermits => "more permits requested than the semaphore holds",
            RejectReason::Duplicate => "the key already has a distinct task queued",
        })
    }
}

/// A refused submission: the reason and the task itself, handed back untouched.
///
/// ```
/// use keyserial::{Builder, RejectReason};
/// let s = Builder::<u32>::new().workers(1).build().unwrap();
/// s.shutdown();
/// let rejected = s.try_submit(1, || 42).unwrap_err();
/// assert_eq!(rejected.reason, RejectReason::Shutdown);
/// assert_eq!((rejected.task)(), 42); // nothing is lost
/// ```
pub struct Rejected<F> {
    /// Why.
    pub reason: RejectReason,
    /// The task, not run.
    pub task: F,
}

impl<F> Rejected<F> {
    /// Takes the task back.
    ///
    /// ```
    /// use keyserial::Serializer;
    /// let s: Serializer<u8> = Serializer::new();
    /// s.shutdown();
    /// let task = s.execute(0, || ()).unwrap_err().into_task();
    /// task();
    /// ```
    pub fn into_task(self) -> F {
        self.task
    }
}

impl<F> fmt::Debug for Rejected<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected")
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

impl<F> fmt::Display for Rejected<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task rejected: {}", self.reason)
    }
}

impl<F> std::error::Error for Rejected<F> {}

/// An invalid [`Builder`](crate::Builder) setting.
///
/// ```
/// use keyserial::Builder;
/// let err = Builder::<u32>::new().workers(0).build().unwrap_err();
/// assert!(err.to_string().contains("workers"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildError {
    pub(crate) message: String,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid keyserial configuration: {}", self.message)
    }
}

impl std::error::Error for BuildError {}
