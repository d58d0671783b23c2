//! What can go wrong in the stream module.

use std::fmt;

/// An error of the stream module's producer or consumer.
///
/// ```
/// use keyserial_redis::StreamError;
/// let e = StreamError::Config("partitions must be at least 1".into());
/// assert_eq!(e.to_string(), "bad configuration: partitions must be at least 1");
/// ```
#[derive(Debug)]
pub enum StreamError {
    /// The configuration is invalid (the message says which setting and why).
    Config(String),
    /// The first connection to the server failed: the server is unreachable or refused us.
    Connect(redis::RedisError),
    /// An established connection was lost and every reconnect attempt failed.
    ConnectionLost {
        /// Reconnect attempts made.
        attempts: u32,
        /// The last attempt's error.
        last: redis::RedisError,
    },
    /// The server answered a command with an error (not a connection problem).
    Redis(redis::RedisError),
    /// The server's reply did not have the shape the command documents.
    Protocol(String),
    /// The serializer the consumer submits to was shut down under it.
    SerializerShutdown,
    /// A stopped consumer's in-flight entries did not all finish within the drain deadline
    /// ([`ConsumerBuilder::drain_timeout`](crate::ConsumerBuilder::drain_timeout)); those left
    /// stay pending (this consumer name re-reads them on restart).
    DrainTimeout {
        /// Entries still in flight at the deadline.
        left: usize,
    },
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::Config(m) => write!(f, "bad configuration: {m}"),
            StreamError::Connect(e) => write!(f, "cannot connect to redis: {e}"),
            StreamError::ConnectionLost { attempts, last } => {
                write!(
                    f,
                    "lost the redis connection ({attempts} reconnect attempts failed, last: {e})",
                    e = last
                )
            }
            StreamError::Redis(e) => write!(f, "redis error: {e}"),
            StreamError::Protocol(m) => write!(f, "unexpected redis reply: {m}"),
            StreamError::SerializerShutdown => f.write_str("the serializer was shut down"),
            StreamError::DrainTimeout { left } => write!(
                f,
                "stopping: {left} entries still in flight at the drain deadline (left pending)"
            ),
        }
    }
}

impl std::error::Error for StreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StreamError::Connect(e) | StreamError::Redis(e) => Some(e),
            StreamError::ConnectionLost { last, .. } => Some(last),
            _ => None,
        }
    }
}
