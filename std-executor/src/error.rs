//! Errors: rejected submissions (the task comes back), task outcomes, bad configuration.

use std::any::Any;
use std::fmt;

/// Why a task did not produce a value.
///
/// `TaskError` is `Send + Sync + 'static` and implements [`std::error::Error`], so `?` converts it
/// into `Box<dyn Error + Send + Sync>`, `anyhow::Error` or `eyre::Report`. A panic's payload stays
/// reachable through [`into_panic`](Self::into_panic) (as with tokio's `JoinError`), for example
/// to resume the panic on the joining thread.
///
/// ```
/// use keyserial::{Serializer, TaskError};
/// let s: Serializer<u32> = Serializer::new();
/// let h = s.submit(1, || panic!("boom")).unwrap();
/// let err = h.join().unwrap_err();
/// assert!(matches!(err, TaskError::Panicked(_)));
/// assert!(err.is_panic());
/// assert_eq!(err.to_string(), "task panicked: boom");
///
/// fn app(s: &Serializer<u32>) -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
///     Ok(s.submit(2, || 40 + 2).unwrap().join()?)
/// }
/// assert_eq!(app(&s).unwrap(), 42);
/// ```
#[derive(Debug)]
pub enum TaskError {
    /// The task panicked; the payload is the panic's.
    Panicked(PanicPayload),
    /// The task was never run, or a started future was dropped unfinished: the task was handed
    /// back (by `shutdown_now`, `shutdown_timeout` or `cancel_key`) and then dropped; a
    /// `submit_with_permits` task's semaphore was closed while it waited for its permits; a paused
    /// key's queued task at a graceful shutdown (it does not run); or a started, pending future
    /// at `shutdown_now`.
    Cancelled,
    /// A `submit_latest` task replaced by a newer `submit_latest` of the same key before it started.
    Superseded,
}

impl TaskError {
    /// `true` if the task panicked.
    ///
    /// ```
    /// use keyserial::Serializer;
    /// let s: Serializer<u32> = Serializer::new();
    /// assert!(s.submit(1, || panic!("boom")).unwrap().join().unwrap_err().is_panic());
    /// ```
    pub fn is_panic(&self) -> bool {
        matches!(self, TaskError::Panicked(_))
    }

    /// `true` if the task was cancelled (see [`TaskError::Cancelled`] for when).
    ///
    /// ```
    /// assert!(keyserial::TaskError::Cancelled.is_cancelled());
    /// ```
    pub fn is_cancelled(&self) -> bool {
        matches!(self, TaskError::Cancelled)
    }

    /// `true` if a newer `submit_latest` of the same key replaced the task before it started.
    ///
    /// ```
    /// assert!(keyserial::TaskError::Superseded.is_superseded());
    /// ```
    pub fn is_superseded(&self) -> bool {
        matches!(self, TaskError::Superseded)
    }

    /// The panic's payload, to inspect it or to resume the panic with
    /// [`std::panic::resume_unwind`].
    ///
    /// # Panics
    /// If the task did not panic (see [`try_into_panic`](Self::try_into_panic)).
    ///
    /// ```
    /// use keyserial::Serializer;
    /// let s: Serializer<u32> = Serializer::new();
    /// let err = s.submit(1, || std::panic::panic_any(7u8)).unwrap().join().unwrap_err();
    /// assert_eq!(*err.into_panic().downcast::<u8>().unwrap(), 7);
    /// ```
    #[track_caller]
    pub fn into_panic(self) -> Box<dyn Any + Send + 'static> {
        match self.try_into_panic() {
            Ok(payload) => payload,
            Err(e) => panic!("`TaskError::into_panic` on a task that did not panic: {e}"),
        }
    }

    /// The panic's payload, or the error itself if the task did not panic.
    ///
    /// ```
    /// use keyserial::TaskError;
    /// assert!(matches!(TaskError::Cancelled.try_into_panic(), Err(TaskError::Cancelled)));
    /// ```
    pub fn try_into_panic(self) -> Result<Box<dyn Any + Send + 'static>, TaskError> {
        match self {
            TaskError::Panicked(p) => Ok(p.into_panic()),
            other => Err(other),
        }
    }

    /// The panic message, if the task panicked with a string payload (`panic!("...")`).
    ///
    /// ```
    /// use keyserial::Serializer;
    /// let s: Serializer<u32> = Serializer::new();
    /// let err = s.submit(1, || panic!("boom")).unwrap().join().unwrap_err();
    /// assert_eq!(err.panic_message(), Some("boom"));
    /// ```
    pub fn panic_message(&self) -> Option<&str> {
        match self {
            TaskError::Panicked(p) => p.message(),
            _ => None,
        }
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Panicked(p) => match p.message() {
                Some(m) => write!(f, "task panicked: {m}"),
                None => f.write_str("task panicked"),
            },
            TaskError::Cancelled => f.write_str("task was cancelled before it started"),
            TaskError::Superseded => f.write_str("task was superseded by a newer submit_latest"),
        }
    }
}

impl std::error::Error for TaskError {}

/// The payload of a task's panic, held so that [`TaskError`] is `Send + Sync`.
///
/// A panic payload is a `Box<dyn Any + Send>`, which is not `Sync`. `PanicPayload` keeps the
/// common string payloads (`panic!("...")`) readable through `&self` ([`message`](Self::message))
/// and gives any other payload back only by value ([`into_panic`](Self::into_panic)), never
/// through a shared reference: that is what makes sharing it between threads sound.
///
/// ```
/// use keyserial::{Serializer, TaskError};
/// let s: Serializer<u32> = Serializer::new();
/// match s.submit(1, || panic!("disk full")).unwrap().join() {
///     Err(TaskError::Panicked(p)) => {
///         assert_eq!(p.message(), Some("disk full"));
///         let payload = p.into_panic(); // e.g. for std::panic::resume_unwind
///         assert_eq!(*payload.downcast::<&str>().unwrap(), "disk full");
///     }
///     _ => unreachable!(),
/// }
/// ```
pub struct PanicPayload(Payload);

enum Payload {
    /// `panic!("literal")`.
    Static(&'static str),
    /// `panic!("formatted {}", x)`.
    Owned(String),
    /// Anything else (`panic_any`).
    Other(ByValue<Box<dyn Any + Send + 'static>>),
}

/// A value reachable only by value, never through `&self`: shared references to it give no
/// access to the value, so it is `Sync` whenever it is `Send` (the idea of `std::sync::Exclusive`).
struct ByValue<T>(T);

// SAFETY: `ByValue` has no method that takes `&self`; its value can only be moved out of an owned
// `ByValue` (`PanicPayload::into_panic`). A `&ByValue<T>` shared between threads therefore lets no
// thread read or write the `T`, so no `Sync` requirement on `T` is needed; moving it between
// threads needs `T: Send`, which the bound keeps.
unsafe impl<T: Send> Sync for ByValue<T> {}

impl PanicPayload {
    pub(crate) fn new(payload: Box<dyn Any + Send + 'static>) -> Self {
        let payload = match payload.downcast::<&'static str>() {
            Ok(s) => Payload::Static(*s),
            Err(payload) => match payload.downcast::<String>() {
                Ok(s) => Payload::Owned(*s),
                Err(payload) => Payload::Other(ByValue(payload)),
            },
        };
        PanicPayload(payload)
    }

    /// The panic message, if the payload is a string (`&'static str` or `String`, as
    /// `panic!` makes).
    ///
    /// ```
    /// use keyserial::{Serializer, TaskError};
    /// let s: Serializer<u32> = Serializer::new();
    /// let Err(TaskError::Panicked(p)) = s.submit(1, || panic!("no {}", 42)).unwrap().join() else {
    ///     unreachable!()
    /// };
    /// assert_eq!(p.message(), Some("no 42"));
    /// ```
    pub fn message(&self) -> Option<&str> {
        match &self.0 {
            Payload::Static(s) => Some(s),
            Payload::Owned(s) => Some(s),
            Payload::Other(_) => None,
        }
    }

    /// The payload as the panic made it, e.g. to resume the panic with
    /// [`std::panic::resume_unwind`] or to downcast it.
    ///
    /// ```
    /// use keyserial::{Serializer, TaskError};
    /// #[derive(Debug, PartialEq)]
    /// struct Fatal(u32);
    /// let s: Serializer<u32> = Serializer::new();
    /// let h = s.submit(1, || std::panic::panic_any(Fatal(3))).unwrap();
    /// let Err(TaskError::Panicked(p)) = h.join() else { unreachable!() };
    /// assert_eq!(p.message(), None);
    /// assert_eq!(*p.into_panic().downcast::<Fatal>().unwrap(), Fatal(3));
    /// ```
    pub fn into_panic(self) -> Box<dyn Any + Send + 'static> {
        match self.0 {
            Payload::Static(s) => Box::new(s),
            Payload::Owned(s) => Box::new(s),
            Payload::Other(ByValue(p)) => p,
        }
    }
}

impl fmt::Debug for PanicPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.message() {
            Some(m) => f.debug_tuple("PanicPayload").field(&m).finish(),
            None => f.write_str("PanicPayload(..)"),
        }
    }
}

impl fmt::Display for PanicPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message().unwrap_or("a non-string panic payload"))
    }
}

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
    /// A new key while [`Builder::max_keys`](crate::Builder::max_keys) keys are live and none is
    /// idle (`try_submit`, or any submission from inside a task: the blocking calls wait).
    TooManyKeys,
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RejectReason::Full => "the serializer is at capacity",
            RejectReason::Shutdown => "the serializer is shut down",
            RejectReason::TooManyPermits => "more permits requested than the semaphore holds",
            RejectReason::Duplicate => "the key already has a distinct task queued",
            RejectReason::TooManyKeys => "the serializer holds its most keys and none is idle",
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

/// The reason alone is an error too (`Send + Sync + 'static` whatever the task), for `?` into
/// error types that need `Sync` (`anyhow::Error`, `Box<dyn Error + Send + Sync>`) when the task
/// is not `Sync`:
///
/// ```
/// use keyserial::{RejectReason, Serializer};
/// fn run(s: &Serializer<u8>) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
///     let cell = std::cell::Cell::new(1); // the closure is not `Sync`, so neither is `Rejected<F>`
///     s.submit(1, move || cell.get()).map_err(RejectReason::from)?;
///     Ok(())
/// }
/// let s: Serializer<u8> = Serializer::new();
/// s.shutdown();
/// assert_eq!(run(&s).unwrap_err().to_string(), "the serializer is shut down");
/// ```
impl std::error::Error for RejectReason {}

impl<F> From<Rejected<F>> for RejectReason {
    /// The reason, dropping the task.
    fn from(r: Rejected<F>) -> RejectReason {
        r.reason
    }
}

/// Why [`Builder::build`](crate::Builder::build) failed: an invalid setting, or the operating
/// system refused to start a thread. Match on [`kind`](Self::kind); the message
/// ([`Display`](fmt::Display)) says the same in words.
///
/// ```
/// use keyserial::{BuildErrorKind, Builder};
/// let err = Builder::<u32>::new().workers(0).build().unwrap_err();
/// assert_eq!(err.kind(), BuildErrorKind::ZeroWorkers);
/// assert!(err.to_string().contains("workers must be at least 1"));
/// ```
#[derive(Clone, Debug)]
pub struct BuildError {
    kind: BuildErrorKind,
    message: String,
    source: Option<std::sync::Arc<std::io::Error>>,
}

/// The cause of a [`BuildError`]. New causes may be added (`#[non_exhaustive]`).
///
/// ```
/// use keyserial::{BuildErrorKind, Builder};
/// let err = Builder::<u32>::new().workers(4).max_workers(2).build().unwrap_err();
/// match err.kind() {
///     BuildErrorKind::MaxWorkersBelowWorkers => {} // raise max_workers
///     other => panic!("unexpected {other:?}"),
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BuildErrorKind {
    /// `workers(0)`: at least one worker is needed.
    ZeroWorkers,
    /// `max_workers` below `workers`.
    MaxWorkersBelowWorkers,
    /// `max_workers` (or `workers`) above the supported 4,096 threads.
    TooManyWorkers,
    /// `fairness_budget(0)`: a worker must run at least one task of a key per turn.
    ZeroFairnessBudget,
    /// `capacity(0)`: at least one task must fit.
    ZeroCapacity,
    /// The operating system refused to start a worker thread; [`source`](std::error::Error::source)
    /// is the `io::Error`.
    ThreadSpawn,
    /// `thread_name` contains a NUL byte, which no thread name may hold.
    InvalidThreadName,
    /// `max_keys(0)`: at least one key must be able to live.
    ZeroMaxKeys,
}

impl BuildError {
    pub(crate) fn invalid(kind: BuildErrorKind) -> Self {
        let message = match kind {
            BuildErrorKind::ZeroWorkers => "workers must be at least 1",
            BuildErrorKind::MaxWorkersBelowWorkers => "max_workers must be at least workers",
            BuildErrorKind::TooManyWorkers => "max_workers must be at most 4096",
            BuildErrorKind::ZeroFairnessBudget => "fairness_budget must be at least 1",
            BuildErrorKind::ZeroCapacity => "capacity must be at least 1",
            BuildErrorKind::ThreadSpawn => "could not start worker threads",
            BuildErrorKind::InvalidThreadName => "thread_name must not contain a NUL byte",
            BuildErrorKind::ZeroMaxKeys => "max_keys must be at least 1",
        };
        Self::with_message(kind, message.to_string())
    }

    /// An invalid setting, with a message that names the values involved.
    pub(crate) fn with_message(kind: BuildErrorKind, message: String) -> Self {
        BuildError {
            kind,
            message,
            source: None,
        }
    }

    pub(crate) fn spawn(e: std::io::Error) -> Self {
        BuildError {
            kind: BuildErrorKind::ThreadSpawn,
            message: format!("could not start worker threads: {e}"),
            source: Some(std::sync::Arc::new(e)),
        }
    }

    /// What was wrong.
    ///
    /// ```
    /// use keyserial::{BuildErrorKind, Builder};
    /// let err = Builder::<u32>::new().capacity(0).build().unwrap_err();
    /// assert_eq!(err.kind(), BuildErrorKind::ZeroCapacity);
    /// ```
    pub fn kind(&self) -> BuildErrorKind {
        self.kind
    }
}

impl PartialEq for BuildError {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.message == other.message
    }
}

impl Eq for BuildError {}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid keyserial configuration: {}", self.message)
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
