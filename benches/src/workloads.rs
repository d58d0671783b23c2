//! The workloads W1–W8, generic over the executor.
//!
//! Every task of every workload goes through the [`Checker`]: per key and submitting thread it must
//! start in submission order, never while another task of its key runs, and the tasks run must add
//! up to the tasks submitted. Times are wall times from the first submit to the moment
//! [`KeyedExecutor::wait_idle`] sees the last task finished.
//!
//! | id | what |
//! |---|---|
//! | `w1_gatling` | 16 keys × 5,000 tasks, round-robin; each task does 1,000 relaxed `fetch_add`s on a task-local atomic and bumps its key's counter (GatlingExecutor's own benchmark). Wall time. |
//! | `w2_overhead` | 1,000 keys × 1,000 empty tasks, round-robin, one submitting thread. Tasks/s. |
//! | `w3_many_keys` | 1,000,000 distinct keys × 1 empty task. Tasks/s and the peak RSS growth during the run. |
//! | `w4_head_of_line` | 1 slow key (100 tasks sleeping 5 ms each) interleaved with 1,000 fast keys × 20 empty tasks, all submitted at once. p50/p99/max submit-to-start latency of the fast tasks. |
//! | `w5_skew` | 4 producer threads × 50,000 tasks at once; each producer owns 25,000 of the 100,000 keys and draws its keys from Zipf(1.0) over them; each task does 100 relaxed `fetch_add`s. Tasks/s and submit-to-start latency. |
//! | `w6_scale_*` | W2's shape (empty tasks, round-robin, one submitter) over 1 k, 100 k and 1 M distinct keys, 1 M tasks each (at least 2 per key): how the cost per task grows with the number of keys in play. |
//! | `w8_sleep` | 10,000 keys × 5 futures each, round-robin, one submitter; each future sleeps 1 ms on tokio's timer (`tokio::time::sleep`). p50 and p99 of each future's submission-to-completion latency, and the wall time. Run on keyserial (`execute_async` with a tokio handle), a tokio actor per key and a keyed chain on tokio, all on the same runtime configuration. |
//! | `w7_async_*` | 100 k and 1 M keys × 10 futures each, round-robin, one submitter; each future yields once (its first poll hands its waker to a reactor thread, which wakes it; its second poll completes). Tasks/s and the peak RSS growth during the run. Run only on executors that hold no thread while a future is pending (keyserial's `submit_async`, a tokio actor per key, a tokio `Mutex` per key). |
//!
//! Those are the sizes of BENCHMARKS.md's results ([`Size::Full`], the compare program's
//! `--full`), except W1 (16 × 5,000 tasks there), W5 (4 × 50,000 tasks) and W6 (1 M tasks per
//! point); [`Size::Default`] cuts every workload so that the compare program's default run takes
//! about a minute on 2 cores, with the same tables and verdicts.
//!
//! Every workload runs in two [`Mode`]s: each task a closure handed to the executor's generic
//! `submit` (keyserial takes it as it is, the baselines box it inside `submit`, timed), or every
//! task boxed as a `Box<dyn FnOnce() + Send>` before the timing starts and handed to
//! `submit_boxed`: the same pre-boxed task for every contender. Both modes run the same task
//! bodies; submit-to-start latencies are measured the same way in both (the submitter stamps the
//! task's slot right before its submit).
//!
//! Submission is a burst (as fast as the submitter can go), so latencies include queueing behind
//! earlier tasks; what W4 shows is whose fast tasks wait behind the slow key.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::checker::Checker;
use crate::exec::{KeyedExecutor, OrderGuarantee, StaticRef};
use crate::exec::{Task, TaskFuture};
use crate::rss::RssSampler;
use crate::work;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};

/// How a metric is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A duration in nanoseconds.
    Nanos,
    /// A rate per second.
    PerSec,
    /// A number of bytes.
    Bytes,
}

/// One column of a workload's table.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    /// Stable key (JSON field).
    pub key: &'static str,
    /// Column header.
    pub header: &'static str,
    /// Unit of the values.
    pub unit: Unit,
    /// Whether a larger value is better.
    pub higher_is_better: bool,
}

const WALL: Metric = Metric {
    key: "wall_ns",
    header: "wall time",
    unit: Unit::Nanos,
    higher_is_better: false,
};
const RATE: Metric = Metric {
    key: "tasks_per_s",
    header: "tasks/s",
    unit: Unit::PerSec,
    higher_is_better: true,
};
const RSS: Metric = Metric {
    key: "peak_rss_bytes",
    header: "peak RSS +",
    unit: Unit::Bytes,
    higher_is_better: false,
};
const P50: Metric = Metric {
    key: "latency_p50_ns",
    header: "p50 latency",
    unit: Unit::Nanos,
    higher_is_better: false,
};
const P99: Metric = Metric {
    key: "latency_p99_ns",
    header: "p99 latency",
    unit: Unit::Nanos,
    higher_is_better: false,
};
const DONE_P50: Metric = Metric {
    key: "done_p50_ns",
    header: "p50 latency",
    unit: Unit::Nanos,
    higher_is_better: false,
};
const DONE_P99: Metric = Metric {
    key: "done_p99_ns",
    header: "p99 latency",
    unit: Unit::Nanos,
    higher_is_better: false,
};
const MAX: Metric = Metric {
    key: "latency_max_ns",
    header: "max latency",
    unit: Unit::Nanos,
    higher_is_better: false,
};

/// How big to make the workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// The sizes of BENCHMARKS.md's results (the compare program's `--full`; several minutes on
    /// 2 cores).
    Full,
    /// The compare program's default (about a minute on 2 cores): every workload cut, the same
    /// tables and verdicts.
    Default,
    /// The compare program's `--quick`.
    Quick,
    /// The criterion suite's sizes.
    Bench,
    /// Smoke-test sizes.
    Tiny,
}

/// A workload and its size.
#[derive(Clone, Debug)]
pub enum Workload {
    /// W1: `keys` × `tasks_per_key` tasks, round-robin, `adds` relaxed `fetch_add`s each.
    Gatling {
        /// Number of keys.
        keys: u64,
        /// Tasks per key.
        tasks_per_key: u32,
        /// `fetch_add`s per task.
        adds: u32,
    },
    /// W2 (and W6): `keys` × `tasks_per_key` empty tasks, round-robin, one submitter.
    Overhead {
        /// Number of keys.
        keys: u64,
        /// Tasks per key.
        tasks_per_key: u32,
        /// `true` for a W6 point (only changes the id and title).
        scale: bool,
    },
    /// W3: `keys` distinct keys, one empty task each; tasks/s and peak RSS growth.
    ManyKeys {
        /// Number of keys.
        keys: u64,
    },
    /// W4: one slow key interleaved with many fast keys.
    HeadOfLine {
        /// Tasks of the slow key.
        slow_tasks: u32,
        /// How long each slow task sleeps.
        slow_sleep: Duration,
        /// Number of fast keys.
        fast_keys: u64,
        /// Empty tasks per fast key.
        fast_tasks_per_key: u32,
    },
    /// W5: several producer threads at once, each owning a share of the keys and drawing its
    /// keys from a Zipf distribution over its share.
    Skew {
        /// Number of keys, split evenly over the producers.
        keys: usize,
        /// Producer (submitting) threads.
        producers: usize,
        /// Tasks each producer submits.
        tasks_per_producer: u64,
        /// Zipf exponent.
        exponent: f64,
        /// Relaxed `fetch_add`s per task.
        adds: u32,
    },
    /// W7: `keys` × `futures_per_key` futures that yield once, round-robin, one submitter.
    Async {
        /// Number of keys.
        keys: u64,
        /// Futures per key.
        futures_per_key: u32,
    },
    /// W8: `keys` × `futures_per_key` futures that each sleep `sleep` on tokio's timer,
    /// round-robin, one submitter; submission-to-completion latencies.
    Sleep {
        /// Number of keys.
        keys: u64,
        /// Futures per key.
        futures_per_key: u32,
        /// How long each future sleeps.
        sleep: Duration,
    },
}

/// What one run of a workload measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Wall time from the first submit to the last finish.
    pub elapsed: Duration,
    /// Tasks submitted.
    pub expected: u64,
    /// Tasks the checker saw run.
    pub ran: u64,
    /// Order or overlap violations the checker saw.
    pub violations: u64,
    /// Whether `wait_idle` returned before its timeout.
    pub finished: bool,
    /// One value per [`Workload::metrics`] entry.
    pub values: Vec<f64>,
}

impl Outcome {
    /// Every submitted task ran exactly once and the executor went idle in time.
    pub fn all_ran(&self) -> bool {
        self.finished && self.ran == self.expected
    }
}

fn fmt_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

impl Workload {
    /// W1 (`Full`: 16 × 5,000 tasks of 1,000 `fetch_add`s).
    pub fn w1(size: Size) -> Self {
        let (keys, tasks_per_key, adds) = match size {
            Size::Full => (16, 5_000, 1_000),
            Size::Default => (16, 2_500, 1_000),
            Size::Quick => (16, 1_000, 1_000),
            Size::Bench => (16, 1_000, 1_000),
            Size::Tiny => (4, 50, 10),
        };
        Workload::Gatling {
            keys,
            tasks_per_key,
            adds,
        }
    }

    /// W2 (`Full`: 1,000 keys × 1,000 empty tasks).
    pub fn w2(size: Size) -> Self {
        let (keys, tasks_per_key) = match size {
            Size::Full => (1_000, 1_000),
            Size::Default => (1_000, 300),
            Size::Quick => (1_000, 100),
            Size::Bench => (1_000, 20),
            Size::Tiny => (10, 20),
        };
        Workload::Overhead {
            keys,
            tasks_per_key,
            scale: false,
        }
    }

    /// W3 (`Full`: 1,000,000 keys × 1 task).
    pub fn w3(size: Size) -> Self {
        let keys = match size {
            Size::Full => 1_000_000,
            Size::Default => 500_000,
            Size::Quick => 200_000,
            Size::Bench => 20_000,
            Size::Tiny => 500,
        };
        Workload::ManyKeys { keys }
    }

    /// W4 (`Full`: 1 slow key of 100 × 5 ms among 1,000 fast keys × 20 empty tasks; the
    /// default run's slow key sleeps 20 × 5 ms, still far longer than the fast burst takes).
    pub fn w4(size: Size) -> Self {
        let (slow_tasks, ms, fast_keys, fast_tasks_per_key) = match size {
            Size::Full => (100, 5, 1_000, 20),
            Size::Default => (20, 5, 1_000, 20),
            Size::Quick => (10, 5, 1_000, 5),
            Size::Bench => (10, 1, 200, 5),
            Size::Tiny => (3, 1, 20, 3),
        };
        Workload::HeadOfLine {
            slow_tasks,
            slow_sleep: Duration::from_millis(ms),
            fast_keys,
            fast_tasks_per_key,
        }
    }

    /// W5 (`Full`: 4 producers × 50,000 tasks, each owning 25,000 of 100,000 keys drawn
    /// Zipf(1.0), 100 relaxed `fetch_add`s per task).
    pub fn w5(size: Size) -> Self {
        let (keys, tasks_per_producer) = match size {
            Size::Full => (100_000, 50_000),
            Size::Default => (100_000, 25_000),
            Size::Quick => (100_000, 12_500),
            Size::Bench => (10_000, 5_000),
            Size::Tiny => (400, 500),
        };
        Workload::Skew {
            keys,
            producers: 4,
            tasks_per_producer,
            exponent: 1.0,
            adds: 100,
        }
    }

    /// W6's points (`Full`: 1 k, 100 k and 1 M keys, 1 M tasks each; at least 2 tasks per key;
    /// `Quick` drops the 1 M point).
    pub fn w6(size: Size) -> Vec<Self> {
        let (total, keys): (u64, &[u64]) = match size {
            Size::Full => (1_000_000, &[1_000, 100_000, 1_000_000]),
            Size::Default => (300_000, &[1_000, 100_000, 1_000_000]),
            Size::Quick => (100_000, &[1_000, 100_000]),
            Size::Bench => (20_000, &[1_000, 10_000]),
            Size::Tiny => (1_000, &[10, 1_000]),
        };
        keys.iter()
            .map(|&k| Workload::Overhead {
                keys: k,
                tasks_per_key: (total / k).max(2) as u32,
                scale: true,
            })
            .collect()
    }

    /// W7's points (`Full`: 100 k and 1 M keys × 10 futures; `Default` and `Quick` run one
    /// smaller point only).
    pub fn w7(size: Size) -> Vec<Self> {
        let (per_key, keys): (u32, &[u64]) = match size {
            Size::Full => (10, &[100_000, 1_000_000]),
            Size::Default => (10, &[20_000]),
            Size::Quick => (10, &[5_000]),
            Size::Bench => (5, &[10_000]),
            Size::Tiny => (3, &[20, 1_000]),
        };
        keys.iter()
            .map(|&keys| Workload::Async {
                keys,
                futures_per_key: per_key,
            })
            .collect()
    }

    /// W8 (`Full`: 10,000 keys × 5 futures, each a 1 ms tokio sleep; the default run 5,000
    /// keys, `--quick` 2,000).
    pub fn w8(size: Size) -> Self {
        let (keys, futures_per_key) = match size {
            Size::Full => (10_000, 5),
            Size::Default => (5_000, 5),
            Size::Quick => (2_000, 5),
            Size::Bench => (1_000, 5),
            Size::Tiny => (50, 3),
        };
        Workload::Sleep {
            keys,
            futures_per_key,
            sleep: Duration::from_millis(1),
        }
    }

    /// Every workload at `size`, in order W1 … W8.
    pub fn all(size: Size) -> Vec<Self> {
        let mut v = vec![
            Self::w1(size),
            Self::w2(size),
            Self::w3(size),
            Self::w4(size),
            Self::w5(size),
        ];
        v.extend(Self::w6(size));
        v.extend(Self::w7(size));
        v.push(Self::w8(size));
        v
    }

    /// The workload group this belongs to (`W1` … `W8`).
    pub fn group(&self) -> &'static str {
        match self {
            Workload::Gatling { .. } => "W1",
            Workload::Overhead { scale: false, .. } => "W2",
            Workload::ManyKeys { .. } => "W3",
            Workload::HeadOfLine { .. } => "W4",
            Workload::Skew { .. } => "W5",
            Workload::Overhead { scale: true, .. } => "W6",
            Workload::Async { .. } => "W7",
            Workload::Sleep { .. } => "W8",
        }
    }

    /// Runs per row of `compare --full` without `--repeat`: 5 for W1, 7 for the others (the
    /// default run and `--quick` take 3, W4 5: see [`Workload::runs`]).
    ///
    /// W4's figure is a p99 of about 20,000 start latencies on a run whose 500 ms are set by
    /// the slow key, so one run's p99 is a handful of the latest starts and moves by 3-4x
    /// between identical runs (on 2 cores: 1.2-7.6 ms for keyserial and 2.5-8.9 ms for tokio
    /// actors over 15 runs, BENCHMARKS.md run S); a median of 3 then names a different
    /// winner from round to round. W2, W3, W5 and W6 are runs of about 0.1 s, short enough
    /// that one time slice of another program on the machine moves them: one row's runs
    /// spread by up to 40% (W2 boxed, keyserial: 7.17-10.13 M/s in one round of run V, its
    /// contenders alike), so the median of 3 moved a close ratio from round to round by more
    /// than any change being measured. W1's runs take a quarter second each and mostly spread
    /// by a few percent, but about one in nine of them, in any row, takes nearly the
    /// single-core time instead (500-523 ms against 255-345 ms: a worker that got no core for
    /// much of the run; 18 of the 162 W1 runs of every contender but `inline` in the three
    /// rounds of BENCHMARKS.md run AB, each row hit at most once a round). A median of 3 then
    /// takes the slower of the other two: keyserial's closure row had such a run (400 ms and
    /// 516 ms) in two rounds of three there, its median each time its slower normal run. A
    /// median of 5 absorbs two. The runs are short, so the 7 cost a few minutes
    /// in all, and every row of a workload gets the same number, interleaved (the repeats are
    /// the outer loop).
    ///
    /// ```
    /// use keyserial_benches::workloads::{Size, Workload};
    /// assert_eq!(Workload::w4(Size::Default).default_runs(), 7);
    /// assert_eq!(Workload::w2(Size::Default).default_runs(), 7);
    /// assert_eq!(Workload::w1(Size::Default).default_runs(), 5);
    /// ```
    pub fn default_runs(&self) -> usize {
        match self {
            Workload::Gatling { .. } => 5,
            _ => 7,
        }
    }

    /// Runs per row at `size` when `compare` is not given `--repeat`: [`default_runs`] for
    /// `Full`; 3 otherwise, but 5 for W4, whose p99 moves most from run to run. Shorter runs
    /// and fewer of them keep the default run near a minute; a verdict of the default run is
    /// a first look, BENCHMARKS.md's figures are medians of `--full` rounds.
    ///
    /// [`default_runs`]: Workload::default_runs
    ///
    /// ```
    /// use keyserial_benches::workloads::{Size, Workload};
    /// assert_eq!(Workload::w4(Size::Default).runs(Size::Default), 5);
    /// assert_eq!(Workload::w2(Size::Default).runs(Size::Default), 3);
    /// assert_eq!(Workload::w2(Size::Full).runs(Size::Full), 7);
    /// ```
    pub fn runs(&self, size: Size) -> usize {
        match (size, self) {
            (Size::Full, _) => self.default_runs(),
            (_, Workload::HeadOfLine { .. }) => 5,
            _ => 3,
        }
    }

    /// Stable id, e.g. `w2_overhead` or `w6_scale_100k`.
    pub fn id(&self) -> String {
        match self {
            Workload::Gatling { .. } => "w1_gatling".into(),
            Workload::Overhead { scale: false, .. } => "w2_overhead".into(),
            Workload::Overhead {
                scale: true, keys, ..
            } => format!("w6_scale_{}", fmt_count(*keys).to_lowercase()),
            Workload::ManyKeys { .. } => "w3_many_keys".into(),
            Workload::HeadOfLine { .. } => "w4_head_of_line".into(),
            Workload::Skew { .. } => "w5_skew".into(),
            Workload::Async { keys, .. } => {
                format!("w7_async_{}", fmt_count(*keys).to_lowercase())
            }
            Workload::Sleep { .. } => "w8_sleep".into(),
        }
    }

    /// One-line description with the sizes.
    pub fn title(&self) -> String {
        match self {
            Workload::Gatling {
                keys,
                tasks_per_key,
                adds,
            } => format!(
                "W1 gatling: {} keys x {} tasks, round-robin, {} relaxed fetch_add each",
                keys,
                fmt_count(u64::from(*tasks_per_key)),
                fmt_count(u64::from(*adds))
            ),
            Workload::Overhead {
                keys,
                tasks_per_key,
                scale,
            } => format!(
                "{}: {} keys x {} empty tasks, round-robin, 1 submitter",
                if *scale { "W6 scale" } else { "W2 overhead" },
                fmt_count(*keys),
                fmt_count(u64::from(*tasks_per_key))
            ),
            Workload::ManyKeys { keys } => {
                format!("W3 many keys: {} distinct keys x 1 empty task", fmt_count(*keys))
            }
            Workload::HeadOfLine {
                slow_tasks,
                slow_sleep,
                fast_keys,
                fast_tasks_per_key,
            } => format!(
                "W4 head-of-line: 1 slow key ({} tasks x {} ms sleep) among {} fast keys x {} empty tasks",
                slow_tasks,
                slow_sleep.as_millis(),
                fmt_count(*fast_keys),
                fast_tasks_per_key
            ),
            Workload::Skew {
                keys,
                producers,
                tasks_per_producer,
                exponent,
                adds,
            } => format!(
                "W5 skew: {} producers x {} tasks, each owning {} of {} keys drawn Zipf({:.1}), \
                 {} relaxed fetch_add each",
                producers,
                fmt_count(*tasks_per_producer),
                fmt_count((*keys / *producers) as u64),
                fmt_count(*keys as u64),
                exponent,
                adds
            ),
            Workload::Async {
                keys,
                futures_per_key,
            } => format!(
                "W7 async: {} keys x {} futures that yield once (woken from a reactor thread), \
                 round-robin, 1 submitter",
                fmt_count(*keys),
                futures_per_key
            ),
            Workload::Sleep {
                keys,
                futures_per_key,
                sleep,
            } => format!(
                "W8 sleep: {} keys x {} futures, each a {} ms tokio sleep, round-robin, \
                 1 submitter; submission-to-completion latency",
                fmt_count(*keys),
                futures_per_key,
                sleep.as_millis()
            ),
        }
    }

    /// Whether its tasks are futures (W7, W8), which run on the async contenders only.
    pub fn is_async(&self) -> bool {
        matches!(self, Workload::Async { .. } | Workload::Sleep { .. })
    }

    /// Number of distinct keys.
    pub fn keys(&self) -> usize {
        match self {
            Workload::Gatling { keys, .. } | Workload::Overhead { keys, .. } => *keys as usize,
            Workload::ManyKeys { keys } => *keys as usize,
            Workload::HeadOfLine { fast_keys, .. } => *fast_keys as usize + 1,
            Workload::Skew { keys, .. } => *keys,
            Workload::Async { keys, .. } | Workload::Sleep { keys, .. } => *keys as usize,
        }
    }

    /// Number of tasks submitted.
    pub fn tasks(&self) -> u64 {
        match self {
            Workload::Gatling {
                keys,
                tasks_per_key,
                ..
            }
            | Workload::Overhead {
                keys,
                tasks_per_key,
                ..
            } => keys * u64::from(*tasks_per_key),
            Workload::ManyKeys { keys } => *keys,
            Workload::HeadOfLine {
                slow_tasks,
                fast_keys,
                fast_tasks_per_key,
                ..
            } => u64::from(*slow_tasks) + fast_keys * u64::from(*fast_tasks_per_key),
            Workload::Skew {
                producers,
                tasks_per_producer,
                ..
            } => *producers as u64 * tasks_per_producer,
            Workload::Async {
                keys,
                futures_per_key,
            }
            | Workload::Sleep {
                keys,
                futures_per_key,
                ..
            } => keys * u64::from(*futures_per_key),
        }
    }

    /// The columns this workload reports; the first is the one ratios are taken on.
    pub fn metrics(&self) -> Vec<Metric> {
        match self {
            Workload::Gatling { .. } => vec![WALL, RATE],
            Workload::Overhead { .. } => vec![RATE, WALL],
            Workload::ManyKeys { .. } => vec![RATE, RSS],
            Workload::HeadOfLine { .. } => vec![P99, P50, MAX, WALL],
            Workload::Skew { .. } => vec![RATE, P99, P50],
            Workload::Async { .. } => vec![RATE, RSS, WALL],
            Workload::Sleep { .. } => vec![DONE_P50, DONE_P99, WALL],
        }
    }

    /// W1 only: the wall time of the same tasks split evenly by key over `workers` plain threads
    /// (no executor, no submitting thread, no handoff): what the hardware itself allows, measured
    /// in the same run. On 2 vCPUs that floor is itself 1.00-1.25x `inline / 2` (shared caches,
    /// frequency, neighbours), which is why W1 quotes it next to the ideal.
    pub fn measured_floor(&self, workers: usize) -> Option<Duration> {
        let Workload::Gatling {
            keys,
            tasks_per_key,
            adds,
        } = *self
        else {
            return None;
        };
        let workers = workers.max(1) as u64;
        let counters: Vec<AtomicU64> = (0..keys).map(|_| AtomicU64::new(0)).collect();
        let start = Barrier::new(workers as usize + 1);
        let t = std::thread::scope(|scope| {
            for w in 0..workers {
                let (counters, start) = (&counters, &start);
                scope.spawn(move || {
                    start.wait();
                    for _ in 0..tasks_per_key {
                        for k in (w..keys).step_by(workers as usize) {
                            work::gatling(adds);
                            counters[k as usize].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            start.wait();
            Instant::now()
        });
        let elapsed = t.elapsed();
        debug_assert!(counters
            .iter()
            .all(|c| c.load(Ordering::Relaxed) == u64::from(tasks_per_key)));
        Some(elapsed)
    }

    /// Runs the workload once on `exec` in `mode`, waiting at most `timeout` for the tasks to
    /// finish.
    pub fn run<E: KeyedExecutor>(&self, exec: &E, mode: Mode, timeout: Duration) -> Outcome {
        match *self {
            Workload::Gatling {
                keys,
                tasks_per_key,
                adds,
            } => round_robin(
                exec,
                mode,
                keys,
                tasks_per_key,
                move || {
                    work::gatling(adds);
                },
                Layout::WallRate,
                timeout,
            ),
            Workload::Overhead {
                keys,
                tasks_per_key,
                ..
            } => round_robin(
                exec,
                mode,
                keys,
                tasks_per_key,
                || (),
                Layout::RateWall,
                timeout,
            ),
            Workload::ManyKeys { keys } => {
                round_robin(exec, mode, keys, 1, || (), Layout::RateRss, timeout)
            }
            Workload::HeadOfLine {
                slow_tasks,
                slow_sleep,
                fast_keys,
                fast_tasks_per_key,
            } => head_of_line(
                exec,
                mode,
                slow_tasks,
                slow_sleep,
                fast_keys,
                fast_tasks_per_key,
                timeout,
            ),
            Workload::Skew {
                keys,
                producers,
                tasks_per_producer,
                exponent,
                adds,
            } => skew(
                exec,
                mode,
                keys,
                producers,
                tasks_per_producer as usize,
                exponent,
                adds,
                timeout,
            ),
            Workload::Async {
                keys,
                futures_per_key,
            } => async_round_robin(exec, mode, keys, futures_per_key, timeout),
            Workload::Sleep {
                keys,
                futures_per_key,
                sleep,
            } => async_sleep(exec, mode, keys, futures_per_key, sleep, timeout),
        }
    }
}

/// How the tasks reach the executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Each task is a closure handed to the executor's generic [`KeyedExecutor::submit`]:
    /// keyserial's `execute` takes it as it is, the baselines box it inside `submit` (timed).
    Closure,
    /// Every task is boxed as a [`Task`] (`Box<dyn FnOnce() + Send>`) before the timing starts
    /// and handed to [`KeyedExecutor::submit_boxed`]: the same pre-boxed task for every contender.
    Boxed,
}

impl Mode {
    /// Both modes, closure first.
    pub const ALL: [Mode; 2] = [Mode::Closure, Mode::Boxed];

    /// Stable id (`closure`, `boxed`).
    pub fn id(self) -> &'static str {
        match self {
            Mode::Closure => "closure",
            Mode::Boxed => "boxed",
        }
    }

    /// One line on what the mode is.
    pub fn describe(self) -> &'static str {
        match self {
            Mode::Closure => {
                "each task a closure (W7, W8: a future) passed to submit as is (the baselines box it)"
            }
            Mode::Boxed => {
                "every task a Box<dyn FnOnce() + Send> (W7, W8: a Pin<Box<dyn Future>>) built before \
                 the timing, the same for all"
            }
        }
    }
}

/// Marks no task (see [`Batch::submit`]).
const NO_MARK: usize = usize::MAX;

/// One submitting thread's tasks, as `(key, mark, task)` items: made as they are submitted
/// ([`Mode::Closure`]) or all boxed up front ([`Mode::Boxed`]).
struct Batch<I> {
    lazy: Option<I>,
    boxed: Vec<(u64, usize, Task)>,
}

impl<I, T> Batch<I>
where
    I: Iterator<Item = (u64, usize, T)>,
    T: FnOnce() + Send + 'static,
{
    /// Boxes every task now in [`Mode::Boxed`]; keeps the iterator for later otherwise.
    fn new(mode: Mode, items: I) -> Self {
        match mode {
            Mode::Closure => Batch {
                lazy: Some(items),
                boxed: Vec::new(),
            },
            Mode::Boxed => Batch {
                lazy: None,
                boxed: items
                    .map(|(key, mark, task)| (key, mark, Box::new(task) as Task))
                    .collect(),
            },
        }
    }

    /// Submits every task to `exec`, calling `mark(m)` right before the submit of an item whose
    /// mark is not [`NO_MARK`]. The boxed mode's buffer is kept (empty), so that its caller can
    /// free it after the timing.
    #[inline]
    fn submit<E: KeyedExecutor>(&mut self, exec: &E, mark: impl Fn(usize)) {
        if let Some(items) = self.lazy.take() {
            for (key, m, task) in items {
                if m != NO_MARK {
                    mark(m);
                }
                exec.submit(key, task);
            }
        }
        for (key, m, task) in self.boxed.drain(..) {
            if m != NO_MARK {
                mark(m);
            }
            exec.submit_boxed(key, task);
        }
    }
}

/// Drops a run's state, or leaks it if the executor did not go idle in time (a straggling task may
/// still use it).
fn release<S>(state: Box<S>, finished: bool) {
    if !finished {
        Box::leak(state);
    }
}

struct Plain {
    chk: Checker,
}

/// Which values a round-robin run reports, in [`Workload::metrics`] order.
#[derive(Clone, Copy)]
enum Layout {
    /// W1: wall time, tasks/s.
    WallRate,
    /// W2, W6: tasks/s, wall time.
    RateWall,
    /// W3: tasks/s, peak RSS growth.
    RateRss,
}

/// W1, W2, W3, W6: `keys` × `per_key` tasks, round-robin over keys, each running `body`.
fn round_robin<E, B>(
    exec: &E,
    mode: Mode,
    keys: u64,
    per_key: u32,
    body: B,
    layout: Layout,
    timeout: Duration,
) -> Outcome
where
    E: KeyedExecutor,
    B: Fn() + Copy + Send + 'static,
{
    let state = Box::new(Plain {
        chk: Checker::new(keys as usize),
    });
    // SAFETY: `state` lives until every task finished (or is leaked by `release`).
    let r = unsafe { StaticRef::new(&*state) };
    let items = (0..per_key).flat_map(move |seq| {
        (0..keys).map(move |key| (key, NO_MARK, move || r.chk.run(key, 0, seq, body)))
    });
    let mut batch = Batch::new(mode, items);
    // Started after the boxing: in the boxed mode the growth leaves out the tasks' own boxes.
    let sampler =
        matches!(layout, Layout::RateRss).then(|| RssSampler::start(Duration::from_millis(2)));
    let t0 = Instant::now();
    batch.submit(exec, |_| ());
    let finished = exec.wait_idle(timeout);
    let elapsed = t0.elapsed();
    drop(batch);
    let st = &*state;
    let peak = sampler.map(RssSampler::stop);
    let tasks = keys * u64::from(per_key);
    let rate = tasks as f64 / elapsed.as_secs_f64();
    let wall = elapsed.as_nanos() as f64;
    let values = match layout {
        Layout::WallRate => vec![wall, rate],
        Layout::RateRss => vec![rate, peak.unwrap_or(0) as f64],
        Layout::RateWall => vec![rate, wall],
    };
    let out = Outcome {
        elapsed,
        expected: tasks,
        ran: st.chk.ran(),
        violations: st.chk.violations(),
        finished,
        values,
    };
    release(state, finished);
    out
}

/// State of a run that measures submit-to-start latencies: the submitter stamps a task's slot in
/// `sub` right before its submit, the task stamps `start` when it starts (W8's futures: when they
/// complete). The two arrays are
/// written by different threads (submitters, workers) and read only after the run, so the
/// measurement shares no cache line between a submitter and a worker.
struct Timed {
    chk: Checker,
    t0: Instant,
    sub: Box<[AtomicU64]>,
    start: Box<[AtomicU64]>,
}

impl Timed {
    fn new(keys: usize, samples: usize) -> Self {
        let stamps =
            || -> Box<[AtomicU64]> { (0..samples).map(|_| AtomicU64::new(u64::MAX)).collect() };
        Timed {
            chk: Checker::new(keys),
            t0: Instant::now(),
            sub: stamps(),
            start: stamps(),
        }
    }

    #[inline]
    fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    /// Task `i` is about to be submitted.
    #[inline]
    fn mark(&self, i: usize) {
        self.sub[i].store(self.now(), Ordering::Relaxed);
    }

    /// Task `i` starts (W8: completes).
    #[inline]
    fn record(&self, i: usize) {
        self.start[i].store(self.now(), Ordering::Relaxed);
    }

    /// p50, p99 and max of the recorded latencies (tasks that did not start are ignored). Called
    /// after the executor went idle, which orders every stamp before it.
    fn percentiles(&self) -> (f64, f64, f64) {
        let mut v: Vec<u64> = self
            .sub
            .iter()
            .zip(self.start.iter())
            .map(|(s, t)| (s.load(Ordering::Relaxed), t.load(Ordering::Relaxed)))
            .filter(|&(s, t)| s != u64::MAX && t != u64::MAX)
            .map(|(s, t)| t.saturating_sub(s))
            .collect();
        percentiles(&mut v)
    }
}

/// p50, p99 and max of `v` (sorted in place), as f64; zeros for an empty slice.
pub fn percentiles(v: &mut [u64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_unstable();
    let at = |q: usize| v[(v.len() * q / 100).min(v.len() - 1)] as f64;
    (at(50), at(99), v[v.len() - 1] as f64)
}

/// W4: the slow key is key 0; fast keys are `1..=fast_keys`, submitted round-robin, with one slow
/// task before every `fast / slow_tasks` fast tasks.
fn head_of_line<E: KeyedExecutor>(
    exec: &E,
    mode: Mode,
    slow_tasks: u32,
    slow_sleep: Duration,
    fast_keys: u64,
    per_key: u32,
    timeout: Duration,
) -> Outcome {
    let fast = fast_keys as usize * per_key as usize;
    let state = Box::new(Timed::new(fast_keys as usize + 1, fast));
    // SAFETY: `state` lives until every task finished (or is leaked by `release`).
    let r = unsafe { StaticRef::new(&*state) };
    // The submission order: (key, seq, the fast task's latency slot or NO_MARK for a slow task).
    let every = (fast / slow_tasks.max(1) as usize).max(1);
    let mut plan: Vec<(u64, u32, usize)> = Vec::with_capacity(fast + slow_tasks as usize);
    let mut slow_seq = 0u32;
    let mut i = 0usize;
    for seq in 0..per_key {
        for key in 1..=fast_keys {
            if i.is_multiple_of(every) && slow_seq < slow_tasks {
                plan.push((0, slow_seq, NO_MARK));
                slow_seq += 1;
            }
            plan.push((key, seq, i));
            i += 1;
        }
    }
    while slow_seq < slow_tasks {
        plan.push((0, slow_seq, NO_MARK));
        slow_seq += 1;
    }
    let items = plan.iter().map(move |&(key, seq, idx)| {
        let task = move || {
            if idx == NO_MARK {
                r.chk.run(0, 0, seq, || std::thread::sleep(slow_sleep));
            } else {
                r.record(idx);
                r.chk.run(key, 0, seq, || ());
            }
        };
        (key, idx, task)
    });
    let mut batch = Batch::new(mode, items);
    let t0 = Instant::now();
    batch.submit(exec, |i| r.mark(i));
    let finished = exec.wait_idle(timeout);
    let elapsed = t0.elapsed();
    drop(batch);
    let st = &*state;
    let (p50, p99, max) = st.percentiles();
    let out = Outcome {
        elapsed,
        expected: fast as u64 + u64::from(slow_tasks),
        ran: st.chk.ran(),
        violations: st.chk.violations(),
        finished,
        values: vec![p99, p50, max, elapsed.as_nanos() as f64],
    };
    release(state, finished);
    out
}

/// W5's keys for producer `p` of a run where each producer owns `owned` keys: `tasks` draws from
/// Zipf(`exponent`) over the producer's own keys `p * owned ..`, rank 1 (the hottest) first, each
/// with its sequence number for its key. Seeded by `p`, so every contender gets the same stream.
pub fn skew_plan(p: usize, owned: usize, tasks: usize, exponent: f64) -> Vec<(u64, u32)> {
    let zipf = Zipf::new(owned as f64, exponent).expect("a valid Zipf distribution");
    let mut rng = SmallRng::seed_from_u64(0x5EED_0000 + p as u64 * 7919);
    let mut next = vec![0u32; owned];
    let base = (p * owned) as u64;
    (0..tasks)
        .map(|_| {
            // A rank in 1..=owned, as a float.
            let rank = (zipf.sample(&mut rng) as usize).clamp(1, owned);
            let seq = next[rank - 1];
            next[rank - 1] += 1;
            (base + rank as u64 - 1, seq)
        })
        .collect()
}

/// W5: `producers` threads submit at once, each its own [`skew_plan`] (drawn outside the timing).
/// A key belongs to one producer, so its order is checked on one checker lane.
#[allow(clippy::too_many_arguments)]
fn skew<E: KeyedExecutor>(
    exec: &E,
    mode: Mode,
    keys: usize,
    producers: usize,
    per_producer: usize,
    exponent: f64,
    adds: u32,
    timeout: Duration,
) -> Outcome {
    let producers = producers.max(1);
    let owned = (keys / producers).max(1);
    let plans: Vec<Vec<(u64, u32)>> = (0..producers)
        .map(|p| skew_plan(p, owned, per_producer, exponent))
        .collect();
    let total = per_producer * producers;
    let state = Box::new(Timed::new(owned * producers, total));
    // SAFETY: `state` lives until every task finished (or is leaked by `release`).
    let r = unsafe { StaticRef::new(&*state) };
    let task = move |p: usize, i: usize, (key, seq): (u64, u32)| {
        let idx = p * per_producer + i;
        let task = move || {
            r.record(idx);
            r.chk.run(key, 0, seq, || {
                work::gatling(adds);
            });
        };
        (key, idx, task)
    };
    let plans = &plans;
    let t0;
    let batches;
    if exec.ordering() == OrderGuarantee::Inline {
        // Inline runs tasks on the submitting thread: one thread interleaves the producers' streams.
        let items = (0..per_producer)
            .flat_map(move |i| (0..producers).map(move |p| task(p, i, plans[p][i])));
        let mut batch = Batch::new(mode, items);
        t0 = Instant::now();
        batch.submit(exec, |i| r.mark(i));
        batches = Vec::new();
        drop(batch);
    } else {
        let ready: Vec<_> = plans
            .iter()
            .enumerate()
            .map(|(p, plan)| {
                let items = plan.iter().enumerate().map(move |(i, &ks)| task(p, i, ks));
                Batch::new(mode, items)
            })
            .collect();
        let barrier = Barrier::new(producers + 1);
        (t0, batches) = std::thread::scope(|s| {
            let barrier = &barrier;
            let handles: Vec<_> = ready
                .into_iter()
                .map(|mut batch| {
                    s.spawn(move || {
                        barrier.wait();
                        batch.submit(exec, |i| r.mark(i));
                        batch
                    })
                })
                .collect();
            let t0 = Instant::now();
            barrier.wait();
            let done: Vec<_> = handles
                .into_iter()
                .map(|h| h.join().expect("producer thread"))
                .collect();
            (t0, done)
        });
    }
    let finished = exec.wait_idle(timeout);
    let elapsed = t0.elapsed();
    drop(batches);
    let st = &*state;
    let (p50, p99, _) = st.percentiles();
    let out = Outcome {
        elapsed,
        expected: total as u64,
        ran: st.chk.ran(),
        violations: st.chk.violations(),
        finished,
        values: vec![total as f64 / elapsed.as_secs_f64(), p99, p50],
    };
    release(state, finished);
    out
}

/// W7's shared state: the checker and the reactor's queue of wakers.
struct AsyncState {
    chk: Checker,
    reactor: crossbeam_channel::Sender<Waker>,
}

/// W7's future: its first poll enters the checker, hands its waker to the reactor thread and
/// returns `Pending`; the reactor wakes it, and its second poll leaves the checker and completes.
/// The same future, 24 bytes, for every contender.
struct YieldOnce {
    r: StaticRef<AsyncState>,
    key: u64,
    seq: u32,
    yielded: bool,
}

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            self.r.chk.exit(self.key);
            return Poll::Ready(());
        }
        self.yielded = true;
        self.r.chk.enter(self.key, 0, self.seq);
        // The reactor outlives every future of the run (it stops when `AsyncState` is dropped).
        let _ = self.r.reactor.send(cx.waker().clone());
        Poll::Pending
    }
}

/// W7: `keys` × `per_key` [`YieldOnce`] futures, round-robin over keys, one submitter; a reactor
/// thread wakes each future once. Tasks/s and the peak RSS growth (sampled from before the first
/// submit to the last completion; in the boxed mode the boxes are made before it starts).
fn async_round_robin<E: KeyedExecutor>(
    exec: &E,
    mode: Mode,
    keys: u64,
    per_key: u32,
    timeout: Duration,
) -> Outcome {
    let (tx, rx) = crossbeam_channel::unbounded::<Waker>();
    let reactor = std::thread::Builder::new()
        .name("w7-reactor".into())
        .spawn(move || {
            for waker in rx {
                waker.wake();
            }
        })
        .expect("spawn the reactor");
    let state = Box::new(AsyncState {
        chk: Checker::new(keys as usize),
        reactor: tx,
    });
    // SAFETY: `state` lives until every future finished (or is leaked by `release`).
    let r = unsafe { StaticRef::new(&*state) };
    let futures = move || {
        (0..per_key).flat_map(move |seq| {
            (0..keys).map(move |key| {
                (
                    key,
                    YieldOnce {
                        r,
                        key,
                        seq,
                        yielded: false,
                    },
                )
            })
        })
    };
    let mut boxed: Vec<(u64, TaskFuture)> = match mode {
        Mode::Closure => Vec::new(),
        Mode::Boxed => futures()
            .map(|(key, f)| (key, Box::pin(f) as TaskFuture))
            .collect(),
    };
    let sampler = RssSampler::start(Duration::from_millis(2));
    let t0 = Instant::now();
    match mode {
        Mode::Closure => {
            for (key, f) in futures() {
                exec.submit_future(key, f);
            }
        }
        Mode::Boxed => {
            for (key, f) in boxed.drain(..) {
                exec.submit_future_boxed(key, f);
            }
        }
    }
    let finished = exec.wait_idle(timeout);
    let elapsed = t0.elapsed();
    let peak = sampler.stop();
    drop(boxed);
    let st = &*state;
    let tasks = keys * u64::from(per_key);
    let out = Outcome {
        elapsed,
        expected: tasks,
        ran: st.chk.ran(),
        violations: st.chk.violations(),
        finished,
        values: vec![
            tasks as f64 / elapsed.as_secs_f64(),
            peak as f64,
            elapsed.as_nanos() as f64,
        ],
    };
    release(state, finished);
    if finished {
        // The state (the reactor's sender) is gone: the reactor's loop ends.
        let _ = reactor.join();
    }
    out
}

/// W8's future `idx` (task `seq` of `key`): enters the checker, sleeps `sleep` on tokio's timer
/// (the executor polls it inside a tokio runtime), stamps its completion and leaves the checker.
async fn sleeper(r: StaticRef<Timed>, key: u64, seq: u32, idx: usize, sleep: Duration) {
    r.chk.enter(key, 0, seq);
    tokio::time::sleep(sleep).await;
    r.record(idx);
    r.chk.exit(key);
}

/// W8: `keys` × `per_key` [`sleeper`] futures, round-robin over keys, one submitter, which
/// stamps each future's submission right before its submit. p50 and p99 of the
/// submission-to-completion latencies, and the wall time to the last completion.
fn async_sleep<E: KeyedExecutor>(
    exec: &E,
    mode: Mode,
    keys: u64,
    per_key: u32,
    sleep: Duration,
    timeout: Duration,
) -> Outcome {
    let tasks = keys * u64::from(per_key);
    let state = Box::new(Timed::new(keys as usize, tasks as usize));
    // SAFETY: `state` lives until every future finished (or is leaked by `release`).
    let r = unsafe { StaticRef::new(&*state) };
    let plan = move || {
        (0..per_key).flat_map(move |seq| {
            (0..keys).map(move |key| {
                let idx = (u64::from(seq) * keys + key) as usize;
                (key, idx, sleeper(r, key, seq, idx, sleep))
            })
        })
    };
    let mut boxed: Vec<(u64, usize, TaskFuture)> = match mode {
        Mode::Closure => Vec::new(),
        Mode::Boxed => plan()
            .map(|(key, idx, f)| (key, idx, Box::pin(f) as TaskFuture))
            .collect(),
    };
    let t0 = Instant::now();
    match mode {
        Mode::Closure => {
            for (key, idx, f) in plan() {
                r.mark(idx);
                exec.submit_future(key, f);
            }
        }
        Mode::Boxed => {
            for (key, idx, f) in boxed.drain(..) {
                r.mark(idx);
                exec.submit_future_boxed(key, f);
            }
        }
    }
    let finished = exec.wait_idle(timeout);
    let elapsed = t0.elapsed();
    drop(boxed);
    let st = &*state;
    let (p50, p99, _) = st.percentiles();
    let out = Outcome {
        elapsed,
        expected: tasks,
        ran: st.chk.ran(),
        violations: st.chk.violations(),
        finished,
        values: vec![p50, p99, elapsed.as_nanos() as f64],
    };
    release(state, finished);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_set() {
        let mut v: Vec<u64> = (1..=100).rev().collect();
        let (p50, p99, max) = percentiles(&mut v);
        assert_eq!((p50, p99, max), (51.0, 100.0, 100.0));
        assert_eq!(percentiles(&mut []), (0.0, 0.0, 0.0));
    }

    #[test]
    fn ids_are_stable() {
        let ids: Vec<String> = Workload::all(Size::Full).iter().map(Workload::id).collect();
        assert_eq!(
            ids,
            [
                "w1_gatling",
                "w2_overhead",
                "w3_many_keys",
                "w4_head_of_line",
                "w5_skew",
                "w6_scale_1k",
                "w6_scale_100k",
                "w6_scale_1m",
                "w7_async_100k",
                "w7_async_1m",
                "w8_sleep"
            ]
        );
        assert_eq!(Workload::w1(Size::Full).tasks(), 80_000);
        assert_eq!(Workload::w4(Size::Full).tasks(), 20_100);
        assert_eq!(Workload::w4(Size::Full).keys(), 1_001);
        assert_eq!(Workload::w5(Size::Full).tasks(), 200_000);
        assert_eq!(Workload::w5(Size::Full).keys(), 100_000);
        let w6: Vec<u64> = Workload::w6(Size::Full)
            .iter()
            .map(Workload::tasks)
            .collect();
        assert_eq!(w6, [1_000_000, 1_000_000, 2_000_000]);
        let w7: Vec<u64> = Workload::w7(Size::Full)
            .iter()
            .map(Workload::tasks)
            .collect();
        assert_eq!(w7, [1_000_000, 10_000_000]);
        assert_eq!(Workload::w8(Size::Full).tasks(), 50_000);
        assert_eq!(Workload::w8(Size::Full).keys(), 10_000);
    }
}
