//! What a handler returns: `()` (it cannot fail, except by panicking) or `Result<(), E>`.

use std::error::Error;

/// A handler's error, boxed.
pub type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// The return type of a consumer's handler (or the output of an async handler's future): `()`
/// for a handler that cannot fail (but may panic), or `Result<(), E>` with
/// `E: Into<Box<dyn Error + Send + Sync>>` (a `String`, a `&'static str`, any error type). An
/// `Err` or a panic is a failure: the entry is run again after a backoff, then sent to the
/// dead-letter stream (see [`ConsumerBuilder::retry`](crate::ConsumerBuilder::retry)).
///
/// ```
/// use keyserial_redis::HandlerResult;
/// assert!(().into_result().is_ok());
/// let failed: Result<(), String> = Err("no such account".into());
/// assert_eq!(failed.into_result().unwrap_err().to_string(), "no such account");
/// ```
pub trait HandlerResult: Send + 'static {
    /// `Ok(())` for a success, the error for a failure.
    ///
    /// ```
    /// use keyserial_redis::HandlerResult;
    /// let r: Result<(), &'static str> = Ok(());
    /// assert!(r.into_result().is_ok());
    /// ```
    fn into_result(self) -> Result<(), BoxError>;
}

impl HandlerResult for () {
    fn into_result(self) -> Result<(), BoxError> {
        Ok(())
    }
}

impl<E: Into<BoxError> + Send + 'static> HandlerResult for Result<(), E> {
    fn into_result(self) -> Result<(), BoxError> {
        self.map_err(Into::into)
    }
}
