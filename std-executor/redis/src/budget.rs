//! What may be in flight: entries read and not yet acknowledged, bounded in number and in
//! bytes.
//!
//! # Protocol
//!
//! Every entry is counted from the read that delivered it ([`Budget::take`], with its size:
//! its fields' bytes plus a small overhead) to its acknowledgement or release
//! ([`Budget::give`]). A read asks each stream for at most [`Budget::per_stream`] entries: the
//! entries left under `max_entries`, and the bytes left under `max_bytes` divided by the size
//! of the largest recent entry (a maximum that decays by 1/64 per entry, so one outlier does
//! not slow reads for ever). No read is sent while the bytes are at the limit; before any
//! entry was seen, a read asks each stream for one entry. So the bytes in flight stay below
//! `max_bytes` plus, at most, one entry larger than the recent ones per stream read at once.

/// Entries and bytes in flight, and their limits.
#[derive(Debug)]
pub(crate) struct Budget {
    max_entries: usize,
    max_bytes: usize,
    entries: usize,
    bytes: usize,
    /// The largest recent entry's size (0: none seen yet).
    recent_max: usize,
    /// The most bytes ever in flight.
    peak_bytes: usize,
}

/// The size an entry counts for: its fields' bytes plus a little for its ID and bookkeeping.
pub(crate) fn entry_size(fields: Option<&[(Vec<u8>, Vec<u8>)]>) -> usize {
    64 + fields.map_or(0, |f| f.iter().map(|(k, v)| k.len() + v.len()).sum())
}

impl Budget {
    pub fn new(max_entries: usize, max_bytes: usize) -> Budget {
        Budget {
            max_entries,
            max_bytes,
            entries: 0,
            bytes: 0,
            recent_max: 0,
            peak_bytes: 0,
        }
    }

    /// An entry of `size` bytes was delivered.
    pub fn take(&mut self, size: usize) {
        self.entries += 1;
        self.bytes += size;
        self.peak_bytes = self.peak_bytes.max(self.bytes);
        self.recent_max = size.max(self.recent_max - self.recent_max / 64);
    }

    /// An entry of `size` bytes was acknowledged or let go.
    pub fn give(&mut self, size: usize) {
        self.entries -= 1;
        self.bytes -= size;
    }

    pub fn entries(&self) -> usize {
        self.entries
    }

    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn peak_bytes(&self) -> usize {
        self.peak_bytes
    }

    /// Entries that may still be read, by count alone.
    pub fn entry_room(&self) -> usize {
        self.max_entries.saturating_sub(self.entries)
    }

    /// How many entries one read may ask of each of `streams` streams (at most `batch`).
    pub fn per_stream(&self, streams: usize, batch: usize) -> usize {
        let streams = streams.max(1);
        let room = self.entry_room();
        if room == 0 || self.bytes >= self.max_bytes {
            return 0;
        }
        let by_entries = (room / streams).max(1);
        let by_bytes = match self.recent_max {
            0 => 1,
            m => ((self.max_bytes - self.bytes) / m / streams).max(1),
        };
        by_entries.min(by_bytes).min(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_shrink_with_the_bytes_left() {
        let mut b = Budget::new(1000, 10_000);
        assert_eq!(
            b.per_stream(2, 256),
            1,
            "nothing seen: one entry per stream"
        );
        b.take(1000);
        // 9,000 bytes left, entries of about 1,000, over 3 streams: 3 each.
        assert_eq!(b.per_stream(3, 256), 3);
        for _ in 0..9 {
            b.take(1000);
        }
        assert_eq!(b.bytes(), 10_000);
        assert_eq!(b.per_stream(1, 256), 0, "at the limit: no read");
        b.give(1000);
        assert_eq!(b.per_stream(1, 256), 1);
        assert_eq!(b.peak_bytes(), 10_000);
    }

    #[test]
    fn entry_count_and_batch_bound_too() {
        let mut b = Budget::new(10, usize::MAX);
        b.take(100);
        assert_eq!(b.per_stream(1, 4), 4);
        assert_eq!(b.per_stream(3, 256), 3);
        for _ in 0..9 {
            b.take(100);
        }
        assert_eq!(b.per_stream(1, 256), 0);
    }

    #[test]
    fn one_outlier_decays() {
        let mut b = Budget::new(100_000, 1 << 20);
        b.take(500_000);
        b.give(500_000);
        assert_eq!(b.per_stream(1, 256), 2);
        for _ in 0..500 {
            b.take(100);
            b.give(100);
        }
        assert_eq!(b.per_stream(1, 256), 256);
    }
}
