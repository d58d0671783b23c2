//! Kafka's default partitioner: `p = (murmur2(key) & 0x7fffffff) % partitions`.
//!
//! The same function as `org.apache.kafka.common.utils.Utils.murmur2` (MurmurHash2, 32-bit, seed
//! `0x9747b28c`, the key's bytes read as little-endian 4-byte words) followed by Kafka's
//! `toPositive`, so a Kafka producer and this crate's [`Producer`](crate::Producer) put a key in the
//! same partition, and a producer written in another language can compute it too.

/// Kafka's 32-bit MurmurHash2 of `data`, as the Java client computes it (a signed `int` there).
///
/// ```
/// // Kafka's own test vector (UtilsTest.testMurmur2).
/// assert_eq!(keyserial_redis::murmur2(b"foobar"), -790332482);
/// ```
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    // Java's `int length` mixes into the seed; keys longer than i32::MAX bytes do not exist there.
    let mut h: u32 = SEED ^ (data.len() as u32);
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        let mut k = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = words.remainder();
    // Java's switch falls through from case 3 to case 1.
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of `key` among `partitions`: `(murmur2(key) & 0x7fffffff) % partitions`,
/// Kafka's default partitioner for keyed records.
///
/// # Panics
/// If `partitions` is 0.
///
/// ```
/// use keyserial_redis::partition_of;
/// assert_eq!(partition_of(b"foobar", 50), 16);
/// assert!(partition_of(b"user-42", 8) < 8);
/// ```
pub fn partition_of(key: &[u8], partitions: u32) -> u32 {
    assert!(
        partitions > 0,
        "partition_of: partitions must be at least 1"
    );
    ((murmur2(key) as u32) & 0x7fff_ffff) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's `UtilsTest.testMurmur2` vectors (clients/src/test/.../utils/UtilsTest.java).
    #[test]
    fn kafka_murmur2_vectors() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key), want, "{}", String::from_utf8_lossy(key));
        }
    }

    /// Values of Kafka's `Utils.murmur2` that other ports check themselves against (every tail
    /// length 1..=5), and the empty key.
    #[test]
    fn every_tail_length() {
        let cases: [(&[u8], i32); 6] = [
            (b"", 275_646_681),
            (b"1", -1_993_445_489),
            (b"12", 126_087_238),
            (b"123", -267_702_483),
            (b"1234", -1_614_185_708),
            (b"12345", -1_188_365_604),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key), want, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn partition_is_kafkas_to_positive_modulo() {
        // toPositive(-790332482) = 1357151166; % 50 = 16, % 10 = 6.
        assert_eq!(partition_of(b"foobar", 50), 16);
        assert_eq!(partition_of(b"foobar", 10), 6);
        assert_eq!(partition_of(b"anything", 1), 0);
        // A negative hash keeps its low 31 bits (not Java's Math.abs).
        let h = murmur2(b"21");
        assert!(h < 0);
        assert_eq!(partition_of(b"21", 1000), ((h & 0x7fff_ffff) as u32) % 1000);
    }

    #[test]
    #[should_panic(expected = "partitions must be at least 1")]
    fn zero_partitions_panics() {
        partition_of(b"k", 0);
    }
}
