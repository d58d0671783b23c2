//! A Redis stream entry ID, `ms-seq`, ordered numerically.

use std::fmt;
use std::str::FromStr;

/// A Redis stream entry ID: milliseconds and a sequence number, written `ms-seq`.
///
/// IDs compare numerically, milliseconds first (`9-0 < 10-0`, which their text does not), and
/// explicit IDs (`XADD s 1700000000000-7 …`) are as valid as generated ones.
///
/// ```
/// use keyserial_redis::StreamId;
/// let a: StreamId = "9-5".parse().unwrap();
/// let b: StreamId = "10-0".parse().unwrap();
/// assert!(a < b);
/// assert_eq!(b.to_string(), "10-0");
/// assert!("10".parse::<StreamId>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId {
    /// The milliseconds part.
    pub ms: u64,
    /// The sequence part.
    pub seq: u64,
}

impl StreamId {
    /// `0-0`, below every entry.
    ///
    /// ```
    /// assert_eq!(keyserial_redis::StreamId::ZERO.to_string(), "0-0");
    /// ```
    pub const ZERO: StreamId = StreamId { ms: 0, seq: 0 };

    /// The ID `ms-seq`.
    ///
    /// ```
    /// let id = keyserial_redis::StreamId::new(1_700_000_000_000, 7);
    /// assert_eq!(id.to_string(), "1700000000000-7");
    /// ```
    pub const fn new(ms: u64, seq: u64) -> Self {
        StreamId { ms, seq }
    }

    /// Parses an ID from Redis's bytes.
    ///
    /// ```
    /// use keyserial_redis::StreamId;
    /// assert_eq!(StreamId::from_bytes(b"3-4"), Some(StreamId::new(3, 4)));
    /// assert_eq!(StreamId::from_bytes(b"3-"), None);
    /// ```
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        // The same text as `FromStr` accepts (two non-empty runs of ASCII digits, each a `u64`,
        // joined by one `-`), parsed without going through `str` (once per entry read).
        let dash = b.iter().position(|&c| c == b'-')?;
        Some(StreamId {
            ms: decimal(&b[..dash])?,
            seq: decimal(&b[dash + 1..])?,
        })
    }

    /// Writes `ms-seq` into `buf` (the longest ID, two `u64::MAX`, is 41 bytes) and returns
    /// the bytes written: an ID as a command argument without a `String` (once per entry
    /// acknowledged).
    pub(crate) fn write_to(self, buf: &mut [u8; 41]) -> &[u8] {
        let mut at = buf.len();
        for (k, mut n) in [self.seq, self.ms].into_iter().enumerate() {
            if k == 1 {
                at -= 1;
                buf[at] = b'-';
            }
            loop {
                at -= 1;
                buf[at] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
        }
        &buf[at..]
    }
}

/// A non-empty run of ASCII digits as a `u64` (`None` if it is anything else or overflows).
fn decimal(b: &[u8]) -> Option<u64> {
    if b.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &c in b {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some(n)
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 41];
        let text = self.write_to(&mut buf);
        // Only ASCII digits and `-` were written.
        f.write_str(std::str::from_utf8(text).map_err(|_| fmt::Error)?)
    }
}

/// The text was not `ms-seq` with two decimal `u64`s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseIdError(String);

impl fmt::Display for ParseIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a stream entry ID (ms-seq): {:?}", self.0)
    }
}

impl std::error::Error for ParseIdError {}

impl FromStr for StreamId {
    type Err = ParseIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseIdError(s.to_string());
        let (ms, seq) = s.split_once('-').ok_or_else(err)?;
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(ms) || !digits(seq) {
            return Err(err());
        }
        Ok(StreamId {
            ms: ms.parse().map_err(|_| err())?,
            seq: seq.parse().map_err(|_| err())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_order_not_text_order() {
        let ids = [
            "0-1",
            "9-0",
            "9-10",
            "10-0",
            "1700000000000-7",
            "1700000000000-10",
        ];
        let parsed: Vec<StreamId> = ids.iter().map(|s| s.parse().unwrap()).collect();
        assert!(parsed.windows(2).all(|w| w[0] < w[1]));
        assert!("9-10" < "9-2" && StreamId::new(9, 10) > StreamId::new(9, 2));
        for (s, id) in ids.iter().zip(&parsed) {
            assert_eq!(&id.to_string(), s);
        }
    }

    #[test]
    fn rejects_bad_text() {
        for bad in [
            "",
            "1",
            "-1",
            "1-",
            "a-1",
            "1-b",
            "1-2-3",
            "+1-2",
            "1 -2",
            "18446744073709551616-0",
        ] {
            assert!(bad.parse::<StreamId>().is_err(), "{bad:?}");
        }
        assert_eq!(
            "18446744073709551615-18446744073709551615".parse::<StreamId>(),
            Ok(StreamId::new(u64::MAX, u64::MAX))
        );
    }

    #[test]
    fn bytes_parse_and_write_as_text_does() {
        for text in [
            "",
            "1",
            "-1",
            "1-",
            "a-1",
            "1-b",
            "1-2-3",
            "+1-2",
            "1-+2",
            "1 -2",
            "0-0",
            "9-10",
            "1700000000000-7",
            "18446744073709551616-0",
            "0-18446744073709551616",
            "18446744073709551615-18446744073709551615",
            "00012-003",
        ] {
            let parsed = text.parse::<StreamId>().ok();
            assert_eq!(StreamId::from_bytes(text.as_bytes()), parsed, "{text:?}");
            if let Some(id) = parsed {
                let mut buf = [0u8; 41];
                assert_eq!(
                    id.write_to(&mut buf),
                    format!("{}-{}", id.ms, id.seq).as_bytes()
                );
                assert_eq!(id.to_string(), format!("{}-{}", id.ms, id.seq));
            }
        }
        assert_eq!(StreamId::from_bytes(b"\xff-1"), None);
    }
}
