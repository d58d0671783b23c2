//! The completion watermark: per partition, the highest ID with every earlier entry done, plus
//! the done set beyond it, in bounded memory.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Why [`Watermark::track`] refused an ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrackError {
    /// The partition already tracks [`Watermark::limit`] IDs (outstanding plus done beyond the
    /// mark): stop reading it until the mark moves.
    Full,
    /// The ID is at or below the partition's mark: every entry up to the mark is already done
    /// (a redelivery of an old entry). It is not tracked; the mark never goes back.
    AtOrBelowMark,
    /// The ID is already tracked (outstanding or done).
    Duplicate,
}

impl fmt::Display for TrackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TrackError::Full => "the partition's watermark is at its limit",
            TrackError::AtOrBelowMark => "the ID is at or below the partition's watermark",
            TrackError::Duplicate => "the ID is already tracked",
        })
    }
}

impl std::error::Error for TrackError {}

#[derive(Clone, Debug)]
struct Part<I> {
    /// Every tracked ID at or below it is done; `None` until the first one is.
    mark: Option<I>,
    /// Tracked, not done (all above `mark`).
    outstanding: BTreeSet<I>,
    /// Done, above the lowest outstanding ID (so they cannot join the mark yet).
    done: BTreeSet<I>,
}

impl<I> Default for Part<I> {
    fn default() -> Self {
        Part {
            mark: None,
            outstanding: BTreeSet::new(),
            done: BTreeSet::new(),
        }
    }
}

/// Completion progress of a partitioned log, engine-agnostic: IDs are any ordered type (Redis
/// [`StreamId`](crate::StreamId)s, Kafka offsets as `u64`).
///
/// Per partition it keeps the **mark**, the highest ID such that every tracked ID up to it is
/// done, and beyond it the outstanding IDs and the **done set** (done, but above an outstanding
/// one). Together they are what a consumer would commit (Kafka: the mark plus the done set, as
/// parallel-consumer encodes it in offset metadata), and what a restarted consumer may skip.
///
/// Memory is bounded: a partition tracks at most [`limit`](Self::limit) IDs (outstanding plus
/// done beyond the mark). At the limit [`track`](Self::track) refuses with [`TrackError::Full`]
/// and [`room`](Self::room) is 0: the reader of that partition pauses until the oldest outstanding
/// entry is done and the mark moves. One slow entry therefore stalls its partition after `limit`
/// later entries instead of growing a map without bound (parallel-consumer's 4 KiB offset-map
/// limit pauses consumption the same way, but without saying so to the reader).
///
/// IDs may be tracked out of order (a redelivered or claimed entry older than newer ones), but
/// never at or below the mark: the mark only moves forward.
///
/// ```
/// use keyserial_redis::{StreamId, Watermark};
/// let mut w = Watermark::new(1000);
/// let (a, b, c) = (StreamId::new(5, 0), StreamId::new(9, 0), StreamId::new(10, 0));
/// for id in [a, b, c] {
///     w.track(0, id).unwrap();
/// }
/// w.complete(0, &b); // done out of order: beyond the mark
/// assert_eq!(w.mark(0), None);
/// assert_eq!(w.done_beyond(0).collect::<Vec<_>>(), [&b]);
/// w.complete(0, &a); // a and b are done: the mark jumps to b
/// assert_eq!(w.mark(0), Some(&b));
/// w.complete(0, &c);
/// assert_eq!(w.mark(0), Some(&c));
/// assert_eq!(w.tracked(0), 0);
/// ```
#[derive(Clone, Debug)]
pub struct Watermark<I> {
    limit: usize,
    parts: BTreeMap<u32, Part<I>>,
}

impl<I: Ord + Clone> Watermark<I> {
    /// A watermark that tracks at most `limit` IDs per partition.
    ///
    /// # Panics
    /// If `limit` is 0 (nothing could ever be read).
    ///
    /// ```
    /// let w = keyserial_redis::Watermark::<u64>::new(4096);
    /// assert_eq!(w.limit(), 4096);
    /// ```
    pub fn new(limit: usize) -> Self {
        assert!(limit > 0, "Watermark::new: the limit must be at least 1");
        Watermark {
            limit,
            parts: BTreeMap::new(),
        }
    }

    /// The most IDs a partition tracks.
    ///
    /// ```
    /// assert_eq!(keyserial_redis::Watermark::<u64>::new(8).limit(), 8);
    /// ```
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Starts tracking `id` (read, not yet done) in `partition`.
    ///
    /// # Errors
    /// [`TrackError::Full`] at the limit, [`TrackError::AtOrBelowMark`] for an ID the mark already
    /// covers, [`TrackError::Duplicate`] for an ID already tracked. Nothing changes then.
    ///
    /// ```
    /// use keyserial_redis::{TrackError, Watermark};
    /// let mut w = Watermark::new(1);
    /// w.track(3, 10u64).unwrap();
    /// assert_eq!(w.track(3, 11), Err(TrackError::Full));
    /// w.complete(3, &10);
    /// assert_eq!(w.track(3, 10), Err(TrackError::AtOrBelowMark));
    /// w.track(3, 11).unwrap();
    /// ```
    pub fn track(&mut self, partition: u32, id: I) -> Result<(), TrackError> {
        let part = self.parts.entry(partition).or_default();
        if part.mark.as_ref().is_some_and(|m| id <= *m) {
            return Err(TrackError::AtOrBelowMark);
        }
        if part.done.contains(&id) {
            return Err(TrackError::Duplicate);
        }
        if part.outstanding.len() + part.done.len() >= self.limit {
            return Err(if part.outstanding.contains(&id) {
                TrackError::Duplicate
            } else {
                TrackError::Full
            });
        }
        // Below the limit: one search both checks for a duplicate and inserts.
        if !part.outstanding.insert(id) {
            return Err(TrackError::Duplicate);
        }
        Ok(())
    }

    /// Marks `id` of `partition` done and moves the mark over every done ID below the lowest
    /// outstanding one. Returns whether `id` was outstanding (false: not tracked, or done before).
    ///
    /// ```
    /// let mut w = keyserial_redis::Watermark::new(16);
    /// w.track(0, 1u64).unwrap();
    /// assert!(w.complete(0, &1));
    /// assert!(!w.complete(0, &1));
    /// assert_eq!(w.mark(0), Some(&1));
    /// ```
    pub fn complete(&mut self, partition: u32, id: &I) -> bool {
        let Some(part) = self.parts.get_mut(&partition) else {
            return false;
        };
        if !part.outstanding.remove(id) {
            return false;
        }
        // In order (the common case): nothing done beyond the mark and `id` below every
        // outstanding ID, so the mark moves to `id` (what the loop below would do, without
        // putting it in the done set and taking it out again).
        if part.done.is_empty() && part.outstanding.first().is_none_or(|o| id < o) {
            part.mark = Some(id.clone());
            return true;
        }
        part.done.insert(id.clone());
        // Every done ID below the lowest outstanding one has nothing undone before it.
        while let Some(first) = part.done.first() {
            if part.outstanding.first().is_some_and(|o| o < first) {
                break;
            }
            part.mark = part.done.pop_first();
        }
        true
    }

    /// The partition's mark: every tracked ID up to it is done (`None`: none done yet, or the
    /// partition was never tracked).
    ///
    /// ```
    /// let w = keyserial_redis::Watermark::<u64>::new(16);
    /// assert_eq!(w.mark(7), None);
    /// ```
    pub fn mark(&self, partition: u32) -> Option<&I> {
        self.parts.get(&partition)?.mark.as_ref()
    }

    /// The done IDs beyond the mark, in order (each is above an outstanding one).
    ///
    /// ```
    /// let mut w = keyserial_redis::Watermark::new(16);
    /// w.track(0, 1u64).unwrap();
    /// w.track(0, 2).unwrap();
    /// w.complete(0, &2);
    /// assert_eq!(w.done_beyond(0).copied().collect::<Vec<_>>(), [2]);
    /// ```
    pub fn done_beyond(&self, partition: u32) -> impl Iterator<Item = &I> + '_ {
        self.parts
            .get(&partition)
            .into_iter()
            .flat_map(|p| p.done.iter())
    }

    /// How many tracked IDs of the partition are not done.
    ///
    /// ```
    /// let mut w = keyserial_redis::Watermark::new(16);
    /// w.track(0, 1u64).unwrap();
    /// assert_eq!(w.outstanding(0), 1);
    /// ```
    pub fn outstanding(&self, partition: u32) -> usize {
        self.parts
            .get(&partition)
            .map_or(0, |p| p.outstanding.len())
    }

    /// How many IDs the partition tracks (outstanding plus done beyond the mark), at most
    /// [`limit`](Self::limit).
    ///
    /// ```
    /// let mut w = keyserial_redis::Watermark::new(16);
    /// w.track(0, 1u64).unwrap();
    /// w.track(0, 2).unwrap();
    /// w.complete(0, &2);
    /// assert_eq!(w.tracked(0), 2);
    /// ```
    pub fn tracked(&self, partition: u32) -> usize {
        self.parts
            .get(&partition)
            .map_or(0, |p| p.outstanding.len() + p.done.len())
    }

    /// How many more IDs the partition can track now (0: pause reading it).
    ///
    /// ```
    /// let mut w = keyserial_redis::Watermark::new(2);
    /// w.track(0, 1u64).unwrap();
    /// assert_eq!(w.room(0), 1);
    /// assert_eq!(w.room(1), 2);
    /// ```
    pub fn room(&self, partition: u32) -> usize {
        self.limit - self.tracked(partition)
    }

    /// The partitions tracked so far, in order.
    ///
    /// ```
    /// let mut w = keyserial_redis::Watermark::new(2);
    /// w.track(4, 1u64).unwrap();
    /// w.track(1, 1u64).unwrap();
    /// assert_eq!(w.partitions().collect::<Vec<_>>(), [1, 4]);
    /// ```
    pub fn partitions(&self) -> impl Iterator<Item = u32> + '_ {
        self.parts.keys().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StreamId;
    use proptest::prelude::*;

    #[test]
    fn redis_ids_compare_numerically() {
        let mut w = Watermark::new(8);
        let small = StreamId::new(9, 0);
        let big = StreamId::new(10, 0); // "10-0" < "9-0" as text
        w.track(0, small).unwrap();
        w.track(0, big).unwrap();
        w.complete(0, &big);
        assert_eq!(w.mark(0), None);
        w.complete(0, &small);
        assert_eq!(w.mark(0), Some(&big));
    }

    #[test]
    fn a_slow_entry_pauses_its_partition_only() {
        let mut w = Watermark::new(3);
        for id in 1..=3u64 {
            w.track(0, id).unwrap();
        }
        w.complete(0, &2);
        w.complete(0, &3);
        assert_eq!(w.room(0), 0);
        assert_eq!(w.track(0, 4), Err(TrackError::Full));
        assert_eq!(w.room(1), 3);
        w.track(1, 100).unwrap();
        w.complete(0, &1);
        assert_eq!(w.mark(0), Some(&3));
        assert_eq!(w.room(0), 3);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Track(u32, u16),
        Complete(u32, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..3u32, any::<u16>()).prop_map(|(p, id)| Op::Track(p, id % 512)),
            (0..3u32, any::<usize>()).prop_map(|(p, i)| Op::Complete(p, i)),
        ]
    }

    proptest! {
        /// Against a model that remembers every accepted ID forever: the mark is the highest
        /// accepted ID with every accepted ID up to it done, the done set is exactly the done IDs
        /// above it, and nothing is tracked beyond the limit.
        #[test]
        fn matches_the_model(limit in 1usize..40, ops in proptest::collection::vec(op(), 0..400)) {
            let mut w = Watermark::new(limit);
            // partition -> id -> done
            let mut model: BTreeMap<u32, BTreeMap<u16, bool>> = BTreeMap::new();
            let mut marks: BTreeMap<u32, u16> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Track(p, id) => {
                        let m = model.entry(p).or_default();
                        let mark = marks.get(&p).copied();
                        let live = m.iter().filter(|(k, done)| !**done || Some(**k) > mark).count();
                        let want = if mark.is_some_and(|mk| id <= mk) {
                            Err(TrackError::AtOrBelowMark)
                        } else if m.contains_key(&id) {
                            Err(TrackError::Duplicate)
                        } else if live >= limit {
                            Err(TrackError::Full)
                        } else {
                            Ok(())
                        };
                        prop_assert_eq!(w.track(p, id), want);
                        if want.is_ok() {
                            m.insert(id, false);
                        }
                    }
                    Op::Complete(p, i) => {
                        let m = model.entry(p).or_default();
                        let open: Vec<u16> = m.iter().filter(|(_, d)| !**d).map(|(k, _)| *k).collect();
                        if open.is_empty() {
                            prop_assert!(!w.complete(p, &9999));
                            continue;
                        }
                        let id = open[i % open.len()];
                        prop_assert!(w.complete(p, &id));
                        prop_assert!(!w.complete(p, &id));
                        m.insert(id, true);
                        // The highest accepted ID with every accepted ID up to it done.
                        let mut mark = marks.get(&p).copied();
                        for (k, done) in m.iter() {
                            if !*done { break; }
                            mark = Some(mark.map_or(*k, |mk| mk.max(*k)));
                        }
                        if let Some(mk) = mark { marks.insert(p, mk); }
                    }
                }
                for (p, m) in &model {
                    let mark = marks.get(p).copied();
                    prop_assert_eq!(w.mark(*p).copied(), mark);
                    let done: Vec<u16> = m.iter().filter(|(k, d)| **d && Some(**k) > mark).map(|(k, _)| *k).collect();
                    prop_assert_eq!(w.done_beyond(*p).copied().collect::<Vec<_>>(), done.clone());
                    let open = m.values().filter(|d| !**d).count();
                    prop_assert_eq!(w.outstanding(*p), open);
                    prop_assert_eq!(w.tracked(*p), open + done.len());
                    prop_assert!(w.tracked(*p) <= limit);
                }
            }
        }
    }
}
