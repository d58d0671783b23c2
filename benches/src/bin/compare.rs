//! `cargo run --release -p keyserial-benches --bin compare`: keyserial against the alternatives, on
//! this machine, in one run. See `--help`.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use keyserial_benches::contenders::{default_workers, Contender, Visit};
use keyserial_benches::exec::KeyedExecutor;
use keyserial_benches::workloads::{Metric, Mode, Outcome, Size, Unit, Workload};

const ABOUT: &str = "keyserial against the executors you would otherwise write, on this machine.";

const AFTER_HELP: &str = "\
WORKLOADS (sizes of --full, the sizes of BENCHMARKS.md's results; the default run's in brackets):
  W1 gatling       16 keys x 5,000 tasks [2,500], round-robin, 1,000 relaxed fetch_add each;
                   wall time
  W2 overhead      1,000 keys x 1,000 empty tasks [300], one submitter; tasks/s
  W3 many keys     1,000,000 distinct keys [500,000] x 1 task; tasks/s and peak RSS growth
  W4 head-of-line  1 slow key (100 tasks [20] x 5 ms sleep) among 1,000 fast keys x 20 empty
                   tasks; p50/p99/max submit-to-start latency of the fast tasks
  W5 skew          4 producer threads x 50,000 tasks [25,000], each producer owning 25,000 of
                   100,000 keys drawn Zipf(1.0), 100 relaxed fetch_add per task; tasks/s,
                   p50/p99 submit-to-start latency
  W6 scale         W2's shape over 1 k, 100 k and 1 M keys, 1 M tasks each [300 k], at least 2
                   per key; tasks/s
  W7 async         100 k and 1 M keys [20 k only] x 10 futures that yield once (the first poll
                   hands the waker to a reactor thread, which wakes it), round-robin, one
                   submitter; tasks/s and peak RSS growth. Run on keyserial (submit_async),
                   tokio_actor and tokio_mutex only: the thread-based designs would hold a
                   thread per pending future

MODES:
  closure  each task is a closure (W7: a future) passed to the executor's submit: keyserial takes
           it as it is, the hand-rolled baselines box it inside submit (timed)
  boxed    every task is a Box<dyn FnOnce() + Send> (W7: a Pin<Box<dyn Future>>) built before the
           timing starts and passed to every contender, keyserial included, the same way

READING THE TABLES:
  Each workload gets one table per mode. The ratio column is row / keyserial on the table's first
  metric. The last line names the best row and gives keyserial / the contender its target is set
  against: the best ORDERED contender (thread_per_key, lanes_1x, lanes_4x, striped, tokio_actor)
  for W1-W6, tokio_actor for W7; then whether that ratio meets the target, or, where none is set,
  whether keyserial is ahead. Ratios are judged as printed (2 decimals). The run ends with every
  verdict side by side (\"Targets\"), in the same words.

Every keyed run is checked: per key, tasks must start in submission order and never overlap, and
every submitted task must run. The program exits with status 1 if any ordered executor violated
order or any executor lost a task. tokio_mutex's order is checked and reported but not promised
(a mutex grants in the order tasks first poll it); the unordered reference is not checked.";

/// Which modes to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    /// Each task a closure passed to submit.
    Closure,
    /// Every task pre-boxed, the same for every contender.
    Boxed,
    /// A table for each.
    Both,
}

impl ModeArg {
    fn modes(self) -> Vec<Mode> {
        match self {
            ModeArg::Closure => vec![Mode::Closure],
            ModeArg::Boxed => vec![Mode::Boxed],
            ModeArg::Both => Mode::ALL.to_vec(),
        }
    }
}

/// `compare`: keyserial against the executors you would otherwise write, on this machine.
#[derive(Parser, Debug)]
#[command(name = "compare", about = ABOUT, after_help = AFTER_HELP)]
struct Cli {
    /// Smaller workloads still, 3 runs a row (W4: 5) within 0.6 s per 3 runs (about 20 s on 2
    /// cores)
    #[arg(long, conflicts_with = "full")]
    quick: bool,

    /// The sizes of BENCHMARKS.md's results (W1 16 x 5,000 tasks, W3 1 M keys, W4's slow key
    /// 100 x 5 ms, W6 1 M tasks per point, W7 also at 1 M keys) and up to 7 runs a row (W1: 5)
    /// within 4 s per 3 runs; about 9 minutes on 2 cores. Without --quick or --full: every
    /// workload smaller, 3 runs a row (W4: 5) within 1.2 s per 3 runs, about a minute
    #[arg(long)]
    full: bool,

    /// How tasks reach the executors (see MODES below)
    #[arg(long, value_enum, default_value_t = ModeArg::Both)]
    mode: ModeArg,

    /// Comma-separated groups or ids to run, e.g. W1,W4 or w6_scale_1m [default: all of W1..W7]
    #[arg(
        long = "workload",
        visible_alias = "workloads",
        value_name = "LIST",
        value_delimiter = ',',
        value_parser = parse_workload
    )]
    workloads: Vec<String>,

    /// Comma-separated executors to run, e.g. keyserial,lanes_1x [default: keyserial and every
    /// design a user would pick instead; not inline or unordered]
    #[arg(
        long = "executor",
        visible_alias = "executors",
        value_name = "LIST",
        value_delimiter = ',',
        value_parser = parse_contender
    )]
    executors: Vec<Contender>,

    /// Also run the two references: inline (the work's own cost, for the "ideal" line) and
    /// unordered (a handoff that keeps no order)
    #[arg(long, conflicts_with = "executors")]
    references: bool,

    /// Exactly N runs per workload, mode and executor; the table shows the median and min-max.
    /// Default: up to 3 runs (W4: 5; with --full 7, W1: 5), but a row skips a run that would
    /// take it past 1.2 s per 3 runs (--quick: 0.6 s, --full: 4 s), so slow rows get 1 or 2
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    repeat: Option<u32>,

    /// Pool threads for every pooled executor [default: available parallelism]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    workers: Option<u32>,

    /// Also write all results as JSON to PATH ('-' for stdout; the tables then go to stderr)
    #[arg(long, value_name = "PATH")]
    json: Option<String>,

    /// How long one run may take before its tasks count as lost
    #[arg(long, value_name = "SECS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,

    /// Passed by `cargo bench`; ignored
    #[arg(long, hide = true)]
    bench: bool,
}

fn parse_contender(id: &str) -> Result<Contender, String> {
    Contender::from_id(id.trim()).ok_or_else(|| {
        let all: Vec<&str> = Contender::all().iter().map(|c| c.id()).collect();
        format!("unknown executor (one of: {})", all.join(", "))
    })
}

fn parse_workload(id: &str) -> Result<String, String> {
    let id = id.trim();
    let known = Workload::all(Size::Full)
        .iter()
        .any(|w| id.eq_ignore_ascii_case(w.group()) || id.eq_ignore_ascii_case(&w.id()));
    if known {
        Ok(id.to_string())
    } else {
        Err("unknown workload (W1..W7, or an id such as w2_overhead or w7_async_1m)".into())
    }
}

/// The settings of one run, from the command line.
struct Args {
    size: Size,
    modes: Vec<Mode>,
    workloads: Option<Vec<String>>,
    executors: Option<Vec<Contender>>,
    /// Also run the references (`inline`, `unordered`) when `--executor` is not given.
    references: bool,
    /// Runs per row: `--repeat`, or the workload's default ([`Args::runs_for`]).
    repeat: usize,
    /// Per-row time budget of 3 runs when `--repeat` was not given: a row skips a run that would
    /// take it past it (judged by its runs so far).
    budget: Option<Duration>,
    workers: usize,
    json: Option<String>,
    timeout: Duration,
}

impl From<Cli> for Args {
    fn from(cli: Cli) -> Self {
        let size = if cli.quick {
            Size::Quick
        } else if cli.full {
            Size::Full
        } else {
            Size::Default
        };
        let (repeat, budget) = match cli.repeat {
            Some(n) => (n as usize, None),
            None => (
                3,
                Some(match size {
                    Size::Quick => Duration::from_millis(600),
                    Size::Full => Duration::from_secs(4),
                    _ => Duration::from_millis(1_200),
                }),
            ),
        };
        Args {
            size,
            modes: cli.mode.modes(),
            workloads: (!cli.workloads.is_empty()).then_some(cli.workloads),
            executors: (!cli.executors.is_empty()).then_some(cli.executors),
            references: cli.references,
            repeat,
            budget,
            workers: cli.workers.map_or_else(default_workers, |n| n as usize),
            json: cli.json,
            timeout: Duration::from_secs(cli.timeout),
        }
    }
}

impl Args {
    /// Runs per row of workload `w`: `--repeat` if given, else the workload's default at this
    /// size ([`Workload::runs`]: 3, W4 5; with `--full` 7, W1 5).
    fn runs_for(&self, w: &Workload) -> usize {
        if self.budget.is_some() {
            w.runs(self.size)
        } else {
            self.repeat
        }
    }

    /// The time budget of a row of `w` (default runs only): `budget` per 3 runs.
    fn budget_for(&self, w: &Workload) -> Option<Duration> {
        self.budget.map(|b| b * self.runs_for(w) as u32 / 3)
    }
}

/// All runs of one contender on one workload.
struct Row {
    contender: Contender,
    skipped: Option<String>,
    runs: Vec<Outcome>,
    /// Wall time spent on this row (runs plus building and dropping the executor).
    spent: Duration,
}

impl Row {
    fn metric(&self, i: usize) -> Vec<f64> {
        self.runs.iter().map(|o| o.values[i]).collect()
    }

    fn median(&self, i: usize) -> Option<f64> {
        median(self.metric(i))
    }

    fn min_max(&self, i: usize) -> Option<(f64, f64)> {
        let v = self.metric(i);
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (!v.is_empty()).then_some((min, max))
    }

    fn violations(&self) -> u64 {
        self.runs.iter().map(|o| o.violations).sum()
    }

    fn all_ran(&self) -> bool {
        self.runs.iter().all(Outcome::all_ran)
    }

    /// Whether this row makes the whole run fail.
    fn failed(&self) -> bool {
        !self.all_ran() || (self.contender.is_ordered() && self.violations() > 0)
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn fmt_value(unit: Unit, v: f64) -> String {
    match unit {
        Unit::Nanos => {
            if v < 1e3 {
                format!("{v:.0} ns")
            } else if v < 1e6 {
                format!("{:.1} us", v / 1e3)
            } else if v < 1e9 {
                format!("{:.1} ms", v / 1e6)
            } else {
                format!("{:.2} s", v / 1e9)
            }
        }
        Unit::PerSec => {
            if v >= 1e6 {
                format!("{:.2} M/s", v / 1e6)
            } else if v >= 1e3 {
                format!("{:.1} k/s", v / 1e3)
            } else {
                format!("{v:.0} /s")
            }
        }
        Unit::Bytes => {
            if v >= 1024.0 * 1024.0 {
                format!("{:.1} MiB", v / (1024.0 * 1024.0))
            } else {
                format!("{:.0} KiB", v / 1024.0)
            }
        }
    }
}

struct RunOne<'a> {
    w: &'a Workload,
    mode: Mode,
    timeout: Duration,
}

impl Visit for RunOne<'_> {
    type Out = Outcome;
    fn visit<E: KeyedExecutor>(self, exec: &E) -> Outcome {
        self.w.run(exec, self.mode, self.timeout)
    }
}

/// One workload in one mode: a table.
struct Table {
    w: Workload,
    mode: Mode,
    rows: Vec<Row>,
    /// W1's measured floor in nanoseconds (see [`Workload::measured_floor`]), else `None`.
    floor: Option<f64>,
}

/// Who keyserial is measured against in a table's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Against {
    /// The best [ordered baseline](Contender::is_ordered_baseline) of the table, on the first
    /// metric (W1-W6).
    BestOrdered,
    /// One contender, named by the target (W7: the tokio actor per key).
    Row(Contender),
}

impl Against {
    fn of(w: &Workload) -> Against {
        if w.group() == "W7" {
            Against::Row(Contender::TokioActor)
        } else {
            Against::BestOrdered
        }
    }

    fn label(self) -> String {
        match self {
            Against::BestOrdered => "best ordered".into(),
            Against::Row(c) => c.id().into(),
        }
    }
}

/// A target: keyserial / the table's reference on one metric, bounded.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Target {
    /// Index into the workload's metrics.
    metric: usize,
    bound: f64,
    /// The ratio must be at least `bound` (throughput) or at most (times, memory).
    at_least: bool,
    /// Where the target was set, if not at this table's size (e.g. W7's memory at 1 M keys).
    set_at: Option<&'static str>,
}

impl Target {
    /// `>= 1.50x`.
    fn bound_text(&self) -> String {
        format!(
            "{} {:.2}x",
            if self.at_least { ">=" } else { "<=" },
            self.bound
        )
    }

    /// Whether `ratio` meets the target, read to the two decimals it is printed with (so that
    /// a printed 1.00x against `>= 1.00x` is met, wherever it is printed).
    fn met(&self, ratio: f64) -> bool {
        let r = round2(ratio);
        if self.at_least {
            r >= self.bound
        } else {
            r <= self.bound
        }
    }
}

/// `v` rounded to two decimals, as `{:.2}` prints it.
fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// The targets of workload `w`, on keyserial / [`Against::of`]`(w)`.
fn targets(w: &Workload) -> Vec<Target> {
    let t = |metric, bound, at_least| Target {
        metric,
        bound,
        at_least,
        set_at: None,
    };
    match w.group() {
        "W1" => vec![t(0, 1.03, false)],
        "W2" => vec![t(0, 1.0, true)],
        "W3" => vec![t(0, 0.6, true)],
        "W4" => vec![t(0, 1.0, false)],
        "W5" => vec![t(0, 1.0, true)],
        "W7" => vec![
            t(0, 1.5, true),
            Target {
                set_at: (w.keys() != 1_000_000).then_some("1M keys"),
                ..t(1, 0.1, false)
            },
        ],
        _ => vec![],
    }
}

/// Who won a table, and keyserial against its reference.
struct Verdict {
    metrics: Vec<Metric>,
    /// Who keyserial is measured against.
    against: Against,
    /// The best row on the first metric, of every row but the references (`inline`,
    /// `unordered`).
    winner: Option<(Contender, f64)>,
    /// The reference row and its median on the first metric.
    reference: Option<(Contender, f64)>,
    /// keyserial's (default row) median on the first metric.
    keyserial: Option<f64>,
    /// keyserial / the reference, per metric (medians; the reference chosen on the first
    /// metric).
    ratios: Vec<Option<f64>>,
    /// Both medians behind each ratio: (keyserial, reference).
    pairs: Vec<Option<(f64, f64)>>,
    /// keyserial / each other ordered row on the first metric, where the reference is one
    /// named row (W7: the tokio mutex per key beside the tokio actor per key).
    others: Vec<(Contender, f64)>,
    targets: Vec<Target>,
}

impl Verdict {
    fn of(t: &Table) -> Self {
        let metrics = t.w.metrics();
        let higher = metrics[0].higher_is_better;
        let better = |a: f64, b: f64| if higher { a > b } else { a < b };
        let median_of = |c: Contender| {
            t.rows
                .iter()
                .find(|r| r.contender == c && r.skipped.is_none())
                .and_then(|r| r.median(0))
                .filter(|m| m.is_finite())
        };
        let best = |keep: &dyn Fn(Contender) -> bool| {
            t.rows
                .iter()
                .filter(|r| r.skipped.is_none() && keep(r.contender))
                .filter_map(|r| median_of(r.contender).map(|m| (r.contender, m)))
                .fold(None, |acc: Option<(Contender, f64)>, (c, m)| match acc {
                    Some((_, a)) if !better(m, a) => acc,
                    _ => Some((c, m)),
                })
        };
        let against = Against::of(&t.w);
        let winner = best(&|c| !c.is_reference());
        let reference = match against {
            Against::BestOrdered => best(&|c| c.is_ordered_baseline()),
            Against::Row(c) => median_of(c).map(|m| (c, m)),
        };
        let row_of = |c: Contender| {
            t.rows
                .iter()
                .find(|r| r.contender == c && r.skipped.is_none())
        };
        let ks_row = row_of(Contender::Keyserial);
        let ref_row = reference.and_then(|(c, _)| row_of(c));
        let pairs: Vec<Option<(f64, f64)>> = (0..metrics.len())
            .map(|i| match (ks_row, ref_row) {
                (Some(k), Some(b)) => Some((k.median(i)?, b.median(i)?)),
                _ => None,
            })
            .collect();
        let ratios = pairs
            .iter()
            .map(|p| p.and_then(|(k, b)| (b > 0.0).then_some(k / b)))
            .collect();
        let keyserial = median_of(Contender::Keyserial);
        let others = match (against, keyserial) {
            (Against::Row(named), Some(k)) => t
                .rows
                .iter()
                .filter(|r| {
                    r.contender != named
                        && r.contender.is_order_checked()
                        && !r.contender.is_reference()
                        && !matches!(
                            r.contender,
                            Contender::Keyserial | Contender::KeyserialBounded
                        )
                })
                .filter_map(|r| median_of(r.contender).map(|m| (r.contender, k / m)))
                .collect(),
            _ => vec![],
        };
        Verdict {
            keyserial,
            metrics,
            against,
            winner,
            reference,
            ratios,
            pairs,
            others,
            targets: targets(&t.w),
        }
    }

    /// keyserial / the reference on the first metric.
    fn ratio(&self) -> Option<f64> {
        self.ratios[0]
    }

    /// keyserial / the reference on metric `i`, and whether it meets each target on it.
    fn judged(&self, i: usize) -> Option<(f64, Vec<(Target, bool)>)> {
        let r = self.ratios.get(i).copied().flatten()?;
        let t = self
            .targets
            .iter()
            .filter(|t| t.metric == i)
            .map(|t| (*t, t.met(r)))
            .collect();
        Some((r, t))
    }

    /// Whether keyserial is ahead of its reference on the first metric (`Some(true)`), level
    /// (`None`: 1.00x as printed) or behind (`Some(false)`).
    fn ahead(&self) -> Option<bool> {
        let r = round2(self.ratio()?);
        if r == 1.0 {
            return None;
        }
        Some((r > 1.0) == self.metrics[0].higher_is_better)
    }

    /// What a ratio on metric `i` means: met / MISSED for each of its targets, else ahead /
    /// level / behind (first metric only).
    fn reading(&self, i: usize) -> String {
        let Some((_, judged)) = self.judged(i) else {
            return String::new();
        };
        if judged.is_empty() {
            if i != 0 {
                return String::new();
            }
            return match self.ahead() {
                Some(true) => "keyserial ahead (no target)".into(),
                Some(false) => "keyserial behind (no target)".into(),
                None => "level (no target)".into(),
            };
        }
        judged
            .iter()
            .map(|(t, ok)| {
                format!(
                    "target {}{}: {}",
                    t.bound_text(),
                    t.set_at.map_or(String::new(), |s| format!(" (set at {s})")),
                    if *ok { "met" } else { "MISSED" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The table's last line: what keyserial is compared with, on which metric, the ratio and
    /// its reading, in the same words as the summary.
    fn line(&self) -> String {
        let p = self.metrics[0];
        let mut s = String::from("  => ");
        if let Some((c, v)) = self.winner {
            let _ = write!(s, "best row: {} {}; ", c.id(), fmt_value(p.unit, v));
        }
        match (self.keyserial, self.reference, self.ratio()) {
            (Some(k), Some((c, b)), Some(r)) => {
                let named = match self.against {
                    Against::BestOrdered => format!("best ordered contender ({})", c.id()),
                    Against::Row(c) => c.id().to_string(),
                };
                let _ = write!(
                    s,
                    "keyserial / {named}: {} / {} = {:.2}x {} ({} is better); {}",
                    fmt_value(p.unit, k),
                    fmt_value(p.unit, b),
                    r,
                    p.header,
                    if p.higher_is_better {
                        "higher"
                    } else {
                        "lower"
                    },
                    self.reading(0)
                );
                for (i, m) in self.metrics.iter().enumerate().skip(1) {
                    let Some((k, b)) = self.pairs[i] else {
                        continue;
                    };
                    let judged = self.targets.iter().any(|t| t.metric == i);
                    match m.key {
                        // A memory figure without a target: both sides, no ratio (a ratio of
                        // two small growths says little).
                        "peak_rss_bytes" if !judged => {
                            let _ = write!(
                                s,
                                "; {} {} vs {}",
                                m.header,
                                fmt_value(m.unit, k),
                                fmt_value(m.unit, b)
                            );
                        }
                        "peak_rss_bytes" | "latency_p50_ns" => {
                            let reading = self.reading(i);
                            let _ = write!(
                                s,
                                "; {} {} / {} = {:.2}x{}",
                                m.header,
                                fmt_value(m.unit, k),
                                fmt_value(m.unit, b),
                                if b > 0.0 { k / b } else { f64::NAN },
                                if reading.is_empty() {
                                    String::new()
                                } else {
                                    format!(", {reading}")
                                }
                            );
                        }
                        _ => {}
                    }
                }
                for (c, r) in &self.others {
                    let _ = write!(s, "; keyserial / {}: {r:.2}x {}", c.id(), p.header);
                }
            }
            (None, _, _) => s.push_str("keyserial not run"),
            _ => {
                let _ = write!(s, "{} not run", self.against.label());
            }
        }
        s
    }
}

fn render_table(t: &Table, workers: usize) -> String {
    let (w, rows, floor) = (&t.w, &t.rows[..], t.floor);
    let metrics = w.metrics();
    let primary = metrics[0];
    let ks = rows
        .iter()
        .find(|r| r.contender == Contender::Keyserial)
        .and_then(|r| r.median(0));
    let mut out = String::new();
    let _ = writeln!(out, "\n{} [{} tasks]", w.title(), t.mode.id());
    let _ = writeln!(
        out,
        "  {}: {} is better; ratio = row / keyserial",
        primary.header,
        if primary.higher_is_better {
            "higher"
        } else {
            "lower"
        }
    );
    let mut header = vec![
        "executor".to_string(),
        format!("{} (median)", primary.header),
        "min - max".to_string(),
        "ratio".to_string(),
    ];
    header.insert(1, "runs".into());
    header.extend(metrics[1..].iter().map(|m| m.header.to_string()));
    header.push("violations".into());
    header.push("all ran".into());
    let mut table = vec![header];
    for r in rows {
        let mut line = vec![r.contender.id().to_string(), r.runs.len().to_string()];
        if let Some(why) = &r.skipped {
            line.truncate(1);
            line.push(why.clone());
            line.resize(table[0].len(), String::new());
            table.push(line);
            continue;
        }
        let med = r.median(0).unwrap_or(f64::NAN);
        line.push(fmt_value(primary.unit, med));
        let (lo, hi) = r.min_max(0).unwrap_or((f64::NAN, f64::NAN));
        line.push(format!(
            "{} - {}",
            fmt_value(primary.unit, lo),
            fmt_value(primary.unit, hi)
        ));
        line.push(match ks {
            Some(k) if k > 0.0 && med / k < 0.01 => "<0.01x".into(),
            Some(k) if k > 0.0 => format!("{:.2}x", med / k),
            _ => "-".into(),
        });
        for (i, m) in metrics.iter().enumerate().skip(1) {
            line.push(fmt_value(m.unit, r.median(i).unwrap_or(f64::NAN)));
        }
        line.push(if r.contender.is_order_checked() {
            r.violations().to_string()
        } else {
            "n/a".into()
        });
        line.push(if r.all_ran() { "yes" } else { "NO" }.into());
        table.push(line);
    }
    let cols = table[0].len();
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            table
                .iter()
                .enumerate()
                .filter(|(n, l)| c == 0 || *n == 0 || !l[3].is_empty())
                .map(|(_, l)| l)
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (n, line) in table.iter().enumerate() {
        let mut s = String::from("  ");
        for (c, cell) in line.iter().enumerate() {
            if c == 1 && line[3].is_empty() && n > 0 {
                // A skipped row: one cell spanning the rest.
                s.push_str(cell);
                break;
            }
            let pad = widths[c].saturating_sub(cell.chars().count());
            if c == 0 {
                s.push_str(cell);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            }
            s.push_str("  ");
        }
        let _ = writeln!(out, "{}", s.trim_end());
    }
    // The ideal: the work's own cost spread over every worker (with the `inline` reference).
    let ideal = rows
        .iter()
        .find(|r| r.contender == Contender::Inline)
        .and_then(|r| r.median(0))
        .and_then(|inline| match (primary.unit, primary.higher_is_better) {
            (Unit::PerSec, true) => Some(inline * workers as f64),
            (Unit::Nanos, false) if primary.key == "wall_ns" => Some(inline / workers as f64),
            _ => None,
        });
    if let Some(ideal) = ideal {
        let _ = writeln!(
            out,
            "  ideal (inline spread over {workers} workers): {}",
            fmt_value(primary.unit, ideal)
        );
    }
    if let (Some(floor), Some(ks)) = (floor, ks) {
        let _ = write!(
            out,
            "  measured floor (the same tasks split by key over {workers} plain threads, no \
             executor): {}",
            fmt_value(primary.unit, floor)
        );
        if let Some(ideal) = ideal {
            let _ = write!(
                out,
                " = {:.2}x ideal; keyserial {:.2}x ideal,",
                floor / ideal,
                ks / ideal
            );
        } else {
            out.push(';');
        }
        let _ = writeln!(out, " keyserial {:.2}x the floor", ks / floor);
    }
    // Rows whose order is checked but not promised: say what the check found.
    for r in rows
        .iter()
        .filter(|r| r.skipped.is_none() && r.contender.is_order_checked())
        .filter(|r| !r.contender.is_ordered())
    {
        let v = r.violations();
        let runs = r.runs.len();
        let _ = if v > 0 {
            writeln!(
                out,
                "  {}: REORDERED: {v} order violations in {runs} runs (a mutex per key excludes, \
                 but grants in the order tasks first poll it, which the runtime does not keep to \
                 spawn order; not counted as a failure of the run)",
                r.contender.id()
            )
        } else {
            writeln!(
                out,
                "  {}: 0 order violations in {runs} runs (kept here, not promised: its lock order \
                 is the order tasks first poll it)",
                r.contender.id()
            )
        };
    }
    let _ = writeln!(out, "{}", Verdict::of(t).line());
    out
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

fn json_metrics(metrics: &[Metric], value: impl Fn(usize) -> Option<f64>) -> String {
    let fields: Vec<String> = metrics
        .iter()
        .enumerate()
        .map(|(i, m)| {
            format!(
                "{}: {}",
                json_str(m.key),
                value(i).map_or("null".into(), json_num)
            )
        })
        .collect();
    format!("{{{}}}", fields.join(", "))
}

/// W6's target: keyserial's rate at the most keys / at the fewest keys.
const W6_SCALING: Target = Target {
    metric: 0,
    bound: 0.5,
    at_least: true,
    set_at: None,
};

/// W6's scaling in `mode`: keyserial's rate at the most keys / at the fewest, with both key counts.
fn w6_scaling(tables: &[Table], mode: Mode) -> Option<(f64, usize, usize)> {
    let points: Vec<(usize, f64)> = tables
        .iter()
        .filter(|t| t.mode == mode && t.w.group() == "W6")
        .filter_map(|t| Some((t.w.keys(), Verdict::of(t).keyserial?)))
        .collect();
    let lo = points.iter().min_by_key(|p| p.0)?;
    let hi = points.iter().max_by_key(|p| p.0)?;
    (hi.0 > lo.0 && lo.1 > 0.0).then(|| (hi.1 / lo.1, hi.0, lo.0))
}

/// The run's last table: every verdict of the run, one line per workload and metric judged,
/// a column per mode, each cell read the same way as the table's last line.
fn render_summary(tables: &[Table], modes: &[Mode]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nTargets: keyserial / the contender named, medians of this run's rows, each ratio read \
         to the 2 decimals printed\n  (throughput: higher is better, the target a floor; time \
         and memory: lower is better, the target a ceiling;\n  \"best ordered\" is the best of \
         thread_per_key, lanes_1x, lanes_4x, striped and tokio_actor in that table)"
    );
    let mut lines = vec![{
        let mut h = vec!["workload".to_string(), "metric".into(), "against".into()];
        h.extend(modes.iter().map(|m| m.id().to_string()));
        h.push("target".into());
        h
    }];
    let mut ids: Vec<(String, Workload)> = Vec::new();
    for t in tables {
        if !ids.iter().any(|(id, _)| *id == t.w.id()) {
            ids.push((t.w.id(), t.w.clone()));
        }
    }
    for (id, w) in &ids {
        let metrics = w.metrics();
        let tgts = targets(w);
        // The first metric always; others where a target is set on them.
        let mut judged: Vec<usize> = vec![0];
        judged.extend(tgts.iter().map(|t| t.metric).filter(|&i| i != 0));
        judged.dedup();
        for i in judged {
            let mut line = vec![
                id.clone(),
                metrics[i].header.to_string(),
                Against::of(w).label(),
            ];
            for &m in modes {
                let cell = tables
                    .iter()
                    .find(|t| t.mode == m && t.w.id() == *id)
                    .and_then(|t| {
                        let v = Verdict::of(t);
                        let (r, judged) = v.judged(i)?;
                        let who = match v.against {
                            Against::BestOrdered => v
                                .reference
                                .map_or(String::new(), |(c, _)| format!(" {}", c.id())),
                            Against::Row(_) => String::new(),
                        };
                        let reading = if judged.is_empty() {
                            match v.ahead() {
                                Some(true) => "ahead",
                                Some(false) => "behind",
                                None => "level",
                            }
                        } else if judged.iter().all(|(_, ok)| *ok) {
                            "met"
                        } else {
                            "MISSED"
                        };
                        Some(format!("{r:.2}x{who}: {reading}"))
                    })
                    .unwrap_or_else(|| "-".into());
                line.push(cell);
            }
            let t: Vec<String> = tgts
                .iter()
                .filter(|t| t.metric == i)
                .map(|t| {
                    format!(
                        "{}{}",
                        t.bound_text(),
                        t.set_at.map_or(String::new(), |s| format!(" (set at {s})"))
                    )
                })
                .collect();
            line.push(if t.is_empty() {
                "none".into()
            } else {
                t.join(", ")
            });
            lines.push(line);
        }
    }
    let scaling: Vec<Option<(f64, usize, usize)>> =
        modes.iter().map(|&m| w6_scaling(tables, m)).collect();
    if let Some((_, hi, lo)) = scaling.iter().flatten().next() {
        let mut line = vec![
            format!("W6 {} / {} keys", fmt_keys(*hi), fmt_keys(*lo)),
            "tasks/s".into(),
            format!("keyserial at {} keys", fmt_keys(*lo)),
        ];
        for s in &scaling {
            line.push(s.map_or("-".into(), |(r, _, _)| {
                format!(
                    "{r:.2}x: {}",
                    if W6_SCALING.met(r) { "met" } else { "MISSED" }
                )
            }));
        }
        line.push(format!("{} (set at 1M / 1k keys)", W6_SCALING.bound_text()));
        lines.push(line);
    }
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|c| lines.iter().map(|l| l[c].len()).max().unwrap_or(0))
        .collect();
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "  {}", cells.join("  ").trim_end());
    }
    let missed = lines
        .iter()
        .skip(1)
        .any(|l| l.iter().any(|c| c.ends_with("MISSED")));
    let _ = writeln!(
        out,
        "  {}",
        if missed {
            "some targets MISSED (see the rows above)"
        } else {
            "every target met"
        }
    );
    out
}

fn fmt_keys(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

fn json_opt(v: Option<f64>) -> String {
    v.map_or("null".into(), json_num)
}

/// The verdict of a table as a JSON object.
fn json_verdict(t: &Table) -> String {
    let v = Verdict::of(t);
    let id = |c: Option<(Contender, f64)>| c.map_or("null".into(), |(c, _)| json_str(c.id()));
    let val = |c: Option<(Contender, f64)>| json_opt(c.map(|(_, v)| v));
    let mut f = vec![
        format!("\"winner\": {}", id(v.winner)),
        format!("\"winner_value\": {}", val(v.winner)),
        format!("\"against\": {}", json_str(&v.against.label())),
        // The reference row (the best ordered contender, or the row the target names).
        format!("\"best_ordered\": {}", id(v.reference)),
        format!("\"best_ordered_value\": {}", val(v.reference)),
        format!("\"keyserial_value\": {}", json_opt(v.keyserial)),
        format!("\"higher_is_better\": {}", v.metrics[0].higher_is_better),
        format!("\"keyserial_to_best_ordered\": {}", json_opt(v.ratio())),
        format!(
            "\"keyserial_to_best_ordered_by_metric\": {}",
            json_metrics(&v.metrics, |i| v.ratios[i])
        ),
        format!(
            "\"keyserial_ahead\": {}",
            v.ahead().map_or("null".into(), |b| b.to_string())
        ),
    ];
    let judged: Vec<String> = v
        .targets
        .iter()
        .map(|t| {
            format!(
                "{{\"metric\": {}, \"target\": {}, \"met\": {}}}",
                json_str(v.metrics[t.metric].key),
                json_str(&t.bound_text()),
                v.ratios[t.metric].map_or("null".into(), |r| t.met(r).to_string())
            )
        })
        .collect();
    f.push(format!("\"targets\": [{}]", judged.join(", ")));
    format!("{{{}}}", f.join(", "))
}

fn render_json(args: &Args, tables: &[Table], ok: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{{");
    let _ = writeln!(o, "  \"workers\": {},", args.workers);
    let _ = writeln!(o, "  \"repeat\": {},", args.repeat);
    let _ = writeln!(o, "  \"quick\": {},", args.size == Size::Quick);
    let _ = writeln!(
        o,
        "  \"size\": {},",
        json_str(match args.size {
            Size::Quick => "quick",
            Size::Full => "full",
            _ => "default",
        })
    );
    let modes: Vec<String> = args.modes.iter().map(|m| json_str(m.id())).collect();
    let _ = writeln!(o, "  \"modes\": [{}],", modes.join(", "));
    let _ = writeln!(o, "  \"ok\": {ok},");
    let scaling: Vec<String> = args
        .modes
        .iter()
        .filter_map(|&m| {
            w6_scaling(tables, m).map(|(r, _, _)| format!("{}: {}", json_str(m.id()), json_num(r)))
        })
        .collect();
    let _ = writeln!(
        o,
        "  \"w6_keyserial_rate_most_to_fewest_keys\": {{{}}},",
        scaling.join(", ")
    );
    let _ = writeln!(o, "  \"workloads\": [");
    for (wi, t) in tables.iter().enumerate() {
        let (w, rows, floor) = (&t.w, &t.rows, t.floor);
        let metrics = w.metrics();
        let ks = rows
            .iter()
            .find(|r| r.contender == Contender::Keyserial)
            .and_then(|r| r.median(0));
        let _ = writeln!(o, "    {{");
        let _ = writeln!(o, "      \"id\": {},", json_str(&w.id()));
        let _ = writeln!(o, "      \"mode\": {},", json_str(t.mode.id()));
        let _ = writeln!(o, "      \"title\": {},", json_str(&w.title()));
        let _ = writeln!(o, "      \"keys\": {},", w.keys());
        let _ = writeln!(o, "      \"tasks\": {},", w.tasks());
        let _ = writeln!(o, "      \"primary\": {},", json_str(metrics[0].key));
        if let Some(f) = floor {
            let _ = writeln!(o, "      \"measured_floor_ns\": {},", json_num(f));
        }
        let _ = writeln!(o, "      \"verdict\": {},", json_verdict(t));
        let _ = writeln!(o, "      \"rows\": [");
        for (ri, r) in rows.iter().enumerate() {
            let mut fields = vec![format!("\"executor\": {}", json_str(r.contender.id()))];
            match &r.skipped {
                Some(why) => fields.push(format!("\"skipped\": {}", json_str(why))),
                None => {
                    fields.push(format!(
                        "\"median\": {}",
                        json_metrics(&metrics, |i| r.median(i))
                    ));
                    fields.push(format!(
                        "\"min\": {}",
                        json_metrics(&metrics, |i| r.min_max(i).map(|m| m.0))
                    ));
                    fields.push(format!(
                        "\"max\": {}",
                        json_metrics(&metrics, |i| r.min_max(i).map(|m| m.1))
                    ));
                    let runs: Vec<String> = r
                        .runs
                        .iter()
                        .map(|run| json_metrics(&metrics, |i| run.values.get(i).copied()))
                        .collect();
                    fields.push(format!("\"runs\": [{}]", runs.join(", ")));
                    let ratio = match (ks, r.median(0)) {
                        (Some(k), Some(m)) if k > 0.0 => json_num(m / k),
                        _ => "null".into(),
                    };
                    fields.push(format!("\"ratio_to_keyserial\": {ratio}"));
                    fields.push(format!("\"order_checked\": {}", r.contender.is_ordered()));
                    fields.push(format!("\"violations\": {}", r.violations()));
                    fields.push(format!("\"all_ran\": {}", r.all_ran()));
                }
            }
            let _ = writeln!(
                o,
                "        {{{}}}{}",
                fields.join(", "),
                if ri + 1 < rows.len() { "," } else { "" }
            );
        }
        let _ = writeln!(o, "      ]");
        let _ = writeln!(o, "    }}{}", if wi + 1 < tables.len() { "," } else { "" });
    }
    let _ = writeln!(o, "  ]");
    let _ = writeln!(o, "}}");
    o
}

/// The header's account of the runs per row, e.g. "up to 3 runs per row (W4: 5; a row stops
/// early past 4 s per 3 runs)" or "3 runs per row".
fn runs_text(args: &Args, workloads: &[Workload]) -> String {
    let mut counts: Vec<(usize, Vec<&'static str>)> = Vec::new();
    for w in workloads {
        let n = args.runs_for(w);
        match counts.iter_mut().find(|(c, _)| *c == n) {
            Some((_, groups)) => {
                if !groups.contains(&w.group()) {
                    groups.push(w.group());
                }
            }
            None => counts.push((n, vec![w.group()])),
        }
    }
    // The count most workload groups have is the rule; the others are named.
    counts.sort_by_key(|(n, groups)| (std::cmp::Reverse(groups.len()), *n));
    let Some(((main, _), rest)) = counts.split_first() else {
        return "no runs".into();
    };
    let mut s = format!(
        "{}{main} run{} per row",
        if args.budget.is_some() { "up to " } else { "" },
        if *main == 1 { "" } else { "s" }
    );
    let mut notes: Vec<String> = rest
        .iter()
        .map(|(n, groups)| format!("{}: {n}", groups.join(", ")))
        .collect();
    if let Some(b) = args.budget {
        notes.push(format!(
            "a row skips a run that would take it past {:.1} s per 3 runs",
            b.as_secs_f64()
        ));
    }
    if !notes.is_empty() {
        let _ = write!(s, " ({})", notes.join("; "));
    }
    s
}

fn selected(workload: &Workload, filter: &Option<Vec<String>>) -> bool {
    match filter {
        None => true,
        Some(list) => list.iter().any(|f| {
            f.eq_ignore_ascii_case(workload.group()) || f.eq_ignore_ascii_case(&workload.id())
        }),
    }
}

fn main() -> ExitCode {
    let args = Args::from(Cli::parse());
    let workloads: Vec<Workload> = Workload::all(args.size)
        .into_iter()
        .filter(|w| selected(w, &args.workloads))
        .collect();
    if workloads.is_empty() {
        eprintln!(
            "compare: no workload of this size matches {:?}",
            args.workloads
        );
        return ExitCode::from(2);
    }
    let contenders: Vec<Contender> = args.executors.clone().unwrap_or_else(|| {
        let mut v = Contender::picks();
        if args.references {
            v.extend(Contender::all().into_iter().filter(|c| c.is_reference()));
        }
        v
    });
    // Tables go to stdout, unless stdout carries the JSON.
    let json_to_stdout = args.json.as_deref() == Some("-");
    let emit = |s: &str| {
        if json_to_stdout {
            eprint!("{s}");
        } else {
            print!("{s}");
        }
    };

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut head = format!(
        "keyserial compare: {} workers ({} cores available), {} sizes, {}\n",
        args.workers,
        cores,
        match args.size {
            Size::Quick => "--quick",
            Size::Full => "--full (BENCHMARKS.md's)",
            _ => "default",
        },
        runs_text(&args, &workloads)
    );
    if !Contender::keyserial_available() {
        head.push_str("  (the keyserial row is not built in yet: baselines only)\n");
    }
    // Only the contenders that run on some selected workload.
    for c in contenders
        .iter()
        .filter(|c| workloads.iter().any(|w| c.runs_on(w)))
    {
        let _ = writeln!(head, "  {:<17} {}", c.id(), c.describe(args.workers));
    }
    for m in &args.modes {
        let _ = writeln!(head, "  [{} tasks] {}", m.id(), m.describe());
    }
    emit(&head);

    let plan: usize = workloads
        .iter()
        .map(|w| {
            contenders
                .iter()
                .filter(|c| c.skip_reason(w).is_none())
                .count()
                * args.runs_for(w)
        })
        .sum();
    let pb = ProgressBar::new((plan * args.modes.len()) as u64);
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:32}] {pos}/{len} {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.enable_steady_tick(Duration::from_millis(200));

    let started = Instant::now();
    let mut tables: Vec<Table> = Vec::new();
    for w in &workloads {
        let mut group: Vec<Table> = args
            .modes
            .iter()
            .map(|&mode| Table {
                w: w.clone(),
                mode,
                rows: contenders
                    .iter()
                    .filter(|c| c.runs_on(w))
                    .map(|&c| Row {
                        contender: c,
                        skipped: c.skip_reason(w),
                        runs: Vec::new(),
                        spent: Duration::ZERO,
                    })
                    .collect(),
                floor: None,
            })
            .collect();
        let mut floor = Vec::new();
        // Repeats are the outer loop and the modes alternate inside it, so that drift on the
        // machine spreads over every row of both tables.
        let (runs, budget) = (args.runs_for(w), args.budget_for(w));
        for rep in 0..runs {
            if let Some(f) = w.measured_floor(args.workers) {
                floor.push(f.as_nanos() as f64);
            }
            for t in &mut group {
                let mode = t.mode;
                for row in t.rows.iter_mut().filter(|r| r.skipped.is_none()) {
                    if let (Some(budget), Some(per_run)) =
                        (budget, row.spent.checked_div(row.runs.len() as u32))
                    {
                        if row.spent + per_run > budget {
                            pb.inc(1);
                            continue;
                        }
                    }
                    pb.set_message(format!(
                        "{} | {} | {} | run {}/{}",
                        w.id(),
                        mode.id(),
                        row.contender.id(),
                        rep + 1,
                        runs
                    ));
                    let t0 = Instant::now();
                    let out = row.contender.visit(
                        args.workers,
                        RunOne {
                            w,
                            mode,
                            timeout: args.timeout,
                        },
                    );
                    row.spent += t0.elapsed();
                    row.runs.push(out);
                    pb.inc(1);
                }
            }
        }
        let floor = median(floor);
        for mut t in group {
            t.floor = floor;
            let table = render_table(&t, args.workers);
            pb.suspend(|| emit(&table));
            tables.push(t);
        }
    }
    pb.finish_and_clear();

    let rows = || tables.iter().flat_map(|t| t.rows.iter());
    let failed = rows().any(Row::failed);
    let keyed_runs: usize = rows()
        .filter(|r| r.contender.is_ordered())
        .map(|r| r.runs.len())
        .sum();
    let violations: u64 = rows()
        .filter(|r| r.contender.is_ordered())
        .map(Row::violations)
        .sum();
    let mut lost: Vec<&str> = rows()
        .filter(|r| !r.all_ran())
        .map(|r| r.contender.id())
        .collect();
    lost.dedup();
    emit(&render_summary(&tables, &args.modes));
    emit(&format!(
        "\norder check: {violations} violations in {keyed_runs} keyed runs; every task ran: {}\n\
         total time {:.1} s\n",
        if lost.is_empty() {
            "yes".to_string()
        } else {
            format!("NO ({})", lost.join(", "))
        },
        started.elapsed().as_secs_f64()
    ));

    if let Some(path) = &args.json {
        let json = render_json(&args, &tables, !failed);
        if path == "-" {
            print!("{json}");
        } else if let Err(e) = std::fs::write(path, json) {
            eprintln!("compare: cannot write {path}: {e}");
            return ExitCode::from(2);
        }
    }
    if failed {
        eprintln!("compare: FAILED: an executor violated per-key order or lost tasks");
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(ran: u64, violations: u64) -> Outcome {
        Outcome {
            elapsed: Duration::from_millis(1),
            expected: 10,
            ran,
            violations,
            finished: true,
            values: vec![1.0, 2.0],
        }
    }

    fn row(contender: Contender, runs: Vec<Outcome>) -> Row {
        Row {
            contender,
            skipped: None,
            runs,
            spent: Duration::ZERO,
        }
    }

    fn valued(contender: Contender, primary: f64) -> Row {
        let mut o = outcome(10, 0);
        o.values = vec![primary, 1.0];
        row(contender, vec![o])
    }

    #[test]
    fn a_violation_or_a_lost_task_fails_the_run() {
        assert!(!row(Contender::Striped, vec![outcome(10, 0), outcome(10, 0)]).failed());
        assert!(row(Contender::Striped, vec![outcome(10, 0), outcome(10, 1)]).failed());
        assert!(row(Contender::Keyserial, vec![outcome(9, 0)]).failed());
        // The unordered pool's order is not checked, but its lost tasks are.
        assert!(!row(Contender::Unordered, vec![outcome(10, 5)]).failed());
        assert!(row(Contender::Unordered, vec![outcome(9, 0)]).failed());
        let mut late = outcome(10, 0);
        late.finished = false;
        assert!(row(Contender::Lanes1x, vec![late]).failed());
    }

    #[test]
    fn median_and_units() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
        assert_eq!(fmt_value(Unit::Nanos, 1_500_000.0), "1.5 ms");
        assert_eq!(fmt_value(Unit::PerSec, 2_500_000.0), "2.50 M/s");
        assert_eq!(fmt_value(Unit::Bytes, 3.0 * 1024.0 * 1024.0), "3.0 MiB");
    }

    #[test]
    fn the_verdict_leaves_inline_out_and_takes_the_best_ordered() {
        // W2: tasks/s, higher is better.
        let t = Table {
            w: Workload::w2(Size::Tiny),
            mode: Mode::Boxed,
            rows: vec![
                valued(Contender::Keyserial, 5.0),
                valued(Contender::Inline, 100.0),
                valued(Contender::Lanes4x, 8.0),
                valued(Contender::Striped, 2.0),
                valued(Contender::Unordered, 9.0),
            ],
            floor: None,
        };
        let v = Verdict::of(&t);
        // The references (inline, unordered) are never the best row.
        assert_eq!(v.winner.map(|w| w.0), Some(Contender::Lanes4x));
        assert_eq!(v.reference.map(|w| w.0), Some(Contender::Lanes4x));
        assert_eq!(v.ratio(), Some(5.0 / 8.0));
        assert_eq!(v.ahead(), Some(false));
        let line = v.line();
        assert!(line.contains("best row: lanes_4x"), "{line}");
        assert!(
            line.contains("keyserial / best ordered contender (lanes_4x)"),
            "{line}"
        );
        assert!(line.contains("0.62x") || line.contains("0.63x"), "{line}");
        assert!(line.contains("target >= 1.00x: MISSED"), "{line}");
        // W1: wall time, lower is better.
        let t = Table {
            w: Workload::w1(Size::Tiny),
            mode: Mode::Closure,
            rows: vec![
                valued(Contender::Keyserial, 10.0),
                valued(Contender::Inline, 1.0),
                valued(Contender::TokioActor, 11.0),
                valued(Contender::Lanes1x, 12.0),
            ],
            floor: None,
        };
        let v = Verdict::of(&t);
        assert_eq!(v.winner.map(|w| w.0), Some(Contender::Keyserial));
        assert_eq!(v.reference.map(|w| w.0), Some(Contender::TokioActor));
        assert_eq!(v.ahead(), Some(true));
        assert!(v.line().contains("target <= 1.03x: met"), "{}", v.line());
    }

    fn w1_table(keyserial: f64, tokio: f64) -> Table {
        Table {
            w: Workload::w1(Size::Tiny),
            mode: Mode::Closure,
            rows: vec![
                valued(Contender::Keyserial, keyserial),
                valued(Contender::TokioActor, tokio),
            ],
            floor: None,
        }
    }

    #[test]
    fn a_tables_line_and_the_summary_read_a_ratio_alike() {
        // W1 at 1.004x (printed 1.00x) and at 1.02x: within the <= 1.03x target, in both places.
        for (k, ok) in [(100.4, true), (102.0, true), (103.4, true), (103.6, false)] {
            let t = w1_table(k, 100.0);
            let line = Verdict::of(&t).line();
            let summary = render_summary(std::slice::from_ref(&t), &[Mode::Closure]);
            let (l, s) = if ok {
                ("target <= 1.03x: met", "tokio_actor: met")
            } else {
                ("target <= 1.03x: MISSED", "tokio_actor: MISSED")
            };
            assert!(line.contains(l), "{k}: {line}");
            assert!(summary.contains(s), "{k}: {summary}");
            assert!(!line.contains("behind") && !summary.contains("behind"));
        }
        // A throughput printed as 1.00x meets >= 1.00x, whichever side of 1 it was.
        let t = Target {
            metric: 0,
            bound: 1.0,
            at_least: true,
            set_at: None,
        };
        assert!(t.met(0.996) && t.met(1.0) && !t.met(0.994));
    }

    #[test]
    fn w7_is_judged_against_the_tokio_actor_on_rate_and_memory() {
        let w = Workload::w7(Size::Tiny).remove(0);
        let r = |c, rate: f64, rss: f64| {
            let mut o = outcome(10, 0);
            o.values = vec![rate, rss, 1.0];
            row(c, vec![o])
        };
        let t = Table {
            w,
            mode: Mode::Closure,
            rows: vec![
                r(Contender::Keyserial, 3.0, 5.0),
                r(Contender::TokioActor, 2.0, 100.0),
                r(Contender::TokioMutex, 4.0, 50.0),
            ],
            floor: None,
        };
        let v = Verdict::of(&t);
        assert_eq!(v.reference.map(|w| w.0), Some(Contender::TokioActor));
        assert_eq!(v.ratio(), Some(1.5));
        let line = v.line();
        assert!(line.contains("keyserial / tokio_actor: "), "{line}");
        assert!(line.contains("target >= 1.50x: met"), "{line}");
        assert!(line.contains("= 0.05x, target <= 0.10x"), "{line}");
        assert!(line.contains("keyserial / tokio_mutex: 0.75x"), "{line}");
        let s = render_summary(std::slice::from_ref(&t), &[Mode::Closure]);
        assert!(s.contains("1.50x: met") && s.contains("0.05x: met"), "{s}");
        assert!(s.contains("every target met"), "{s}");
    }

    #[test]
    fn table_and_json_render() {
        let w = Workload::w2(Size::Tiny);
        let rows = vec![
            row(Contender::Keyserial, vec![outcome(10, 0)]),
            row(Contender::Striped, vec![outcome(10, 0)]),
            Row {
                contender: Contender::ThreadPerKey,
                skipped: Some("skipped (5 threads)".into()),
                runs: vec![],
                spent: Duration::ZERO,
            },
        ];
        let table = Table {
            w,
            mode: Mode::Boxed,
            rows,
            floor: Some(1.0e8),
        };
        let t = render_table(&table, 2);
        assert!(t.contains("keyserial") && t.contains("1.00x"), "{t}");
        assert!(t.contains("skipped (5 threads)"), "{t}");
        assert!(t.contains("[boxed tasks]"), "{t}");
        assert!(t.contains("=> best row: "), "{t}");
        let args = Args {
            size: Size::Tiny,
            modes: vec![Mode::Boxed],
            workloads: None,
            executors: None,
            references: false,
            repeat: 1,
            budget: None,
            workers: 2,
            json: None,
            timeout: Duration::from_secs(1),
        };
        let tables = [table];
        let j = render_json(&args, &tables, true);
        assert!(j.contains("\"executor\": \"striped\""), "{j}");
        assert!(j.contains("\"mode\": \"boxed\""), "{j}");
        assert!(j.contains("\"keyserial_to_best_ordered\": 1"), "{j}");
        assert!(j.contains("\"skipped\": \"skipped (5 threads)\""), "{j}");
        assert!(j.contains("\"measured_floor_ns\": 100000000"), "{j}");
        assert_eq!(json_str("a\"b\\\n"), "\"a\\\"b\\\\\\n\"");
        let s = render_summary(&tables, &args.modes);
        assert!(
            s.contains("w2_overhead") && s.contains("1.00x striped: met"),
            "{s}"
        );
    }

    #[test]
    fn the_executors_are_the_rows_a_user_would_pick() {
        let ids: Vec<&str> = Contender::all().iter().map(|c| c.id()).collect();
        assert_eq!(
            ids,
            [
                "keyserial",
                "keyserial_bounded",
                "inline",
                "thread_per_key",
                "lanes_1x",
                "lanes_4x",
                "striped",
                "tokio_actor",
                "tokio_mutex",
                "tokio_chain",
                "unordered",
            ]
        );
        let picks: Vec<&str> = Contender::picks().iter().map(|c| c.id()).collect();
        assert!(!picks.contains(&"inline") && !picks.contains(&"unordered"));
        assert_eq!(picks.len(), ids.len() - 2);
        for c in Contender::all() {
            assert_eq!(Contender::from_id(c.id()), Some(c));
        }
        for gone in ["fifo_tickets", "steal_lanes"] {
            assert!(Cli::try_parse_from(["compare", "--executor", gone]).is_err());
        }
    }

    #[test]
    fn the_header_states_the_runs_each_row_gets() {
        let text = |argv: &[&str]| {
            let a = Args::from(Cli::parse_from(argv));
            let ws: Vec<Workload> = Workload::all(a.size)
                .into_iter()
                .filter(|w| selected(w, &a.workloads))
                .collect();
            for w in &ws {
                // What the header says is what the loop runs.
                let expected = if a.budget.is_some() {
                    w.runs(a.size)
                } else {
                    a.repeat
                };
                assert_eq!(a.runs_for(w), expected);
            }
            runs_text(&a, &ws)
        };
        assert_eq!(
            text(&["compare"]),
            "up to 3 runs per row (W4: 5; a row skips a run that would take it past 1.2 s per 3 runs)"
        );
        assert_eq!(
            text(&["compare", "--full"]),
            "up to 7 runs per row (W1: 5; a row skips a run that would take it past 4.0 s per 3 runs)"
        );
        assert_eq!(text(&["compare", "--repeat", "2"]), "2 runs per row");
        assert_eq!(
            text(&["compare", "--workload", "W4"]),
            "up to 5 runs per row (a row skips a run that would take it past 1.2 s per 3 runs)"
        );
    }

    #[test]
    fn the_command_line_parses() {
        <Cli as clap::CommandFactory>::command().debug_assert();
        let a = Args::from(Cli::parse_from(["compare"]));
        assert_eq!(a.modes, Mode::ALL);
        assert_eq!((a.repeat, a.size), (3, Size::Default));
        let a = Args::from(Cli::parse_from([
            "compare",
            "--quick",
            "--mode",
            "boxed",
            "--workload",
            "W2,w6_scale_1k",
            "--executor=keyserial,lanes_1x",
            "--repeat",
            "2",
        ]));
        assert_eq!(a.modes, [Mode::Boxed]);
        assert_eq!(a.size, Size::Quick);
        assert_eq!(a.repeat, 2);
        assert!(a.budget.is_none());
        assert_eq!(a.workloads.as_deref().map(<[String]>::len), Some(2));
        assert_eq!(
            a.executors,
            Some(vec![Contender::Keyserial, Contender::Lanes1x])
        );
        assert!(Cli::try_parse_from(["compare", "--executor", "nope"]).is_err());
        assert!(Cli::try_parse_from(["compare", "--workload", "W9"]).is_err());
        assert!(Cli::try_parse_from(["compare", "--repeat", "0"]).is_err());
        assert!(Cli::try_parse_from(["compare", "--quick", "--full"]).is_err());
    }
}
