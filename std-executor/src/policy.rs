//! What a panicking task does to its key.

/// What a panicking task does to its key's later tasks ([`Builder::panic_policy`]).
///
/// [`Builder::panic_policy`]: crate::Builder::panic_policy
///
/// ```
/// use keyserial::{Builder, PanicPolicy};
/// let s = Builder::<u8>::new().panic_policy(PanicPolicy::PauseKey).build().unwrap();
/// # drop(s);
/// assert_eq!(PanicPolicy::default(), PanicPolicy::Continue);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PanicPolicy {
    /// The key goes on with its next task (the handle of the panicking one resolves
    /// [`Panicked`](crate::TaskError::Panicked)).
    #[default]
    Continue,
    /// The key is paused, before the panicking task's handle resolves, until
    /// [`Serializer::resume`](crate::Serializer::resume): none of its later tasks starts
    /// before then.
    PauseKey,
}
