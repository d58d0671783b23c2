//! `cargo run --release -p keyserial-benches --bin compare`: keyserial against the alternatives, on
//! this machine, in one run. See `--help`.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use keyserial_benches::contenders::{default_workers, Contender, Visit};
use keyserial_benches::exec::{describe_tokio_runtime, KeyedExecutor};
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
                   submitter; tasks/s and peak RSS growth. Run on keyserial (execute_async),
                   keyserial_bounded, tokio_actor, tokio_mutex and tokio_chain only: the
                   thread-based designs would hold a thread per pending future
  W8 sleep         10,000 keys [5,000] x 5 futures, each a 1 ms tokio::time::sleep,
                   round-robin, one submitter; p50/p99 submission-to-completion latency and
                   wall time. Run on keyserial (execute_async, tokio_handle), tokio_actor and
                   tokio_chain, each on the same tokio runtime configuration (multi-thread,
                   one worker thread per --workers, time driver on; printed in the header)

MODES:
  closure  each task is a closure (W7, W8: a future) passed to the executor's submit: keyserial
           takes it as it is, the hand-rolled baselines box it inside submit (timed)
  boxed    every task is a Box<dyn FnOnce() + Send> (W7, W8: a Pin<Box<dyn Future>>) built before
           the timing starts and passed to every contender, keyserial included, the same way

READING THE TABLES:
  Each workload gets one table per mode: every row's median (and min - max) on the table's first
  metric, its ratio to keyserial's (row / keyserial), and the other metrics' medians. The last
  line is the verdict: keyserial against the best alternative, the best contender in the table
  that keeps per-key order (thread_per_key, lanes_1x, lanes_4x, striped, tokio_actor,
  tokio_chain), in a user's words: \"keyserial 1.30x faster than the best alternative,
  tokio_actor\" or \"tokio_chain 1.20x faster than keyserial here\" (\"faster\": a higher rate or
  a lower time or latency), with both medians, then the other latencies and memory the same way.
  The run ends with every verdict, one line per table (\"Verdicts\").

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
    /// 100 x 5 ms, W6 1 M tasks per point, W7 also at 1 M keys, W8 10,000 keys) and up to 7
    /// runs a row (W1: 5)
    /// within 4 s per 3 runs; about 10 minutes on 2 cores. Without --quick or --full: every
    /// workload smaller, 3 runs a row (W4: 5) within 1.2 s per 3 runs, about a minute
    #[arg(long)]
    full: bool,

    /// How tasks reach the executors (see MODES below)
    #[arg(long, value_enum, default_value_t = ModeArg::Both)]
    mode: ModeArg,

    /// Comma-separated groups or ids to run, e.g. W1,W4 or w6_scale_1m [default: all of W1..W8]
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
        Err("unknown workload (W1..W8, or an id such as w2_overhead or w7_async_1m)".into())
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

/// `v` rounded to two decimals, as `{:.2}` prints it.
fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// The word for "better" on metric `m`: a rate, a time or a latency is "faster", memory "less
/// memory".
fn better_word(m: &Metric) -> &'static str {
    match m.unit {
        Unit::Bytes => "less memory",
        Unit::PerSec | Unit::Nanos => "faster",
    }
}

/// Who is ahead on metric `m` between keyserial (`k`) and contender `c` (`b`), and by how
/// much, as a user reads it: "keyserial 1.30x faster", "tokio_chain 1.20x faster", or
/// "level" when the two medians are within what two decimals show.
fn who_is_ahead(m: &Metric, k: f64, c: Contender, b: f64) -> Option<(Option<Contender>, f64)> {
    if !(k > 0.0 && b > 0.0) {
        return None;
    }
    // How many times better keyserial is: above 1 keyserial is ahead.
    let adv = if m.higher_is_better { k / b } else { b / k };
    Some(if round2(adv) == 1.0 {
        (None, 1.0)
    } else if adv > 1.0 {
        (Some(Contender::Keyserial), adv)
    } else {
        (Some(c), 1.0 / adv)
    })
}

/// Who won a table, and keyserial against the best alternative.
struct Verdict {
    metrics: Vec<Metric>,
    /// The best row on the first metric, of every row but the references (`inline`,
    /// `unordered`).
    winner: Option<(Contender, f64)>,
    /// The best alternative: the best [ordered baseline](Contender::is_ordered_baseline) of the
    /// table on the first metric (a design a user would write instead, keeping per-key order),
    /// with its median.
    best_alt: Option<(Contender, f64)>,
    /// keyserial's (default row) median on the first metric.
    keyserial: Option<f64>,
    /// Both medians on each metric: (keyserial, the best alternative).
    pairs: Vec<Option<(f64, f64)>>,
}

impl Verdict {
    fn of(t: &Table) -> Self {
        let metrics = t.w.metrics();
        let higher = metrics[0].higher_is_better;
        let better = |a: f64, b: f64| if higher { a > b } else { a < b };
        let row_of = |c: Contender| {
            t.rows
                .iter()
                .find(|r| r.contender == c && r.skipped.is_none())
        };
        let median_of = |c: Contender| {
            row_of(c)
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
        let winner = best(&|c| !c.is_reference());
        let best_alt = best(&|c| c.is_ordered_baseline());
        let ks_row = row_of(Contender::Keyserial);
        let alt_row = best_alt.and_then(|(c, _)| row_of(c));
        let pairs = (0..metrics.len())
            .map(|i| match (ks_row, alt_row) {
                (Some(k), Some(b)) => Some((k.median(i)?, b.median(i)?)),
                _ => None,
            })
            .collect();
        Verdict {
            keyserial: median_of(Contender::Keyserial),
            metrics,
            winner,
            best_alt,
            pairs,
        }
    }

    /// keyserial / the best alternative on the first metric.
    fn ratio(&self) -> Option<f64> {
        let (k, b) = self.pairs[0]?;
        (b > 0.0).then_some(k / b)
    }

    /// Who is ahead on metric `i` (`None` in the first field: level), and by how much.
    fn ahead_on(&self, i: usize) -> Option<(Option<Contender>, f64)> {
        let (k, b) = self.pairs.get(i).copied().flatten()?;
        who_is_ahead(&self.metrics[i], k, self.best_alt?.0, b)
    }

    /// Whether keyserial is ahead of the best alternative on the first metric (`Some(true)`),
    /// level (`None`: 1.00x as printed) or behind (`Some(false)`).
    fn ahead(&self) -> Option<bool> {
        let (who, _) = self.ahead_on(0)?;
        who.map(|c| c == Contender::Keyserial)
    }

    /// The verdict in one sentence, without the figures: "keyserial 1.30x faster than the best
    /// alternative, tokio_actor", "tokio_chain 1.20x faster than keyserial here", "keyserial
    /// level with lanes_1x".
    fn sentence(&self) -> String {
        let Some(alt) = self.best_alt.map(|(c, _)| c.id()) else {
            return if self.keyserial.is_some() {
                "no alternative run".into()
            } else {
                "keyserial not run".into()
            };
        };
        let m = &self.metrics[0];
        match self.ahead_on(0) {
            None if self.keyserial.is_none() => "keyserial not run".into(),
            None => "no verdict (a median of zero)".into(),
            Some((None, _)) => format!("keyserial level with the best alternative, {alt}"),
            Some((Some(Contender::Keyserial), x)) => format!(
                "keyserial {x:.2}x {} than the best alternative, {alt}",
                better_word(m)
            ),
            Some((Some(_), x)) => format!("{alt} {x:.2}x {} than keyserial here", better_word(m)),
        }
    }

    /// The figures behind metric `i`'s comparison: "p99 latency: keyserial 4.1 ms, tokio_chain
    /// 2.0 ms".
    fn figures(&self, i: usize) -> Option<String> {
        let (k, b) = self.pairs.get(i).copied().flatten()?;
        let (c, _) = self.best_alt?;
        let m = &self.metrics[i];
        Some(format!(
            "{}: keyserial {}, {} {}",
            m.header,
            fmt_value(m.unit, k),
            c.id(),
            fmt_value(m.unit, b)
        ))
    }

    /// The table's last line: the sentence with its figures, then the secondary latencies and
    /// memory the same way, then the best row overall if it is neither side (a row that keeps
    /// no promised order, or keyserial's bounded row).
    fn line(&self) -> String {
        let mut s = format!("  => {}", self.sentence());
        if let Some(f) = self.figures(0) {
            let _ = write!(s, " ({f})");
        }
        for (i, m) in self.metrics.iter().enumerate().skip(1) {
            let shown = m.unit == Unit::Bytes || m.key.contains("p50") || m.key.contains("p99");
            let (Some(f), Some((who, x))) = (self.figures(i).filter(|_| shown), self.ahead_on(i))
            else {
                continue;
            };
            let reading = match who {
                None => "level".to_string(),
                Some(c) => format!("{} {x:.2}x {}", c.id(), better_word(m)),
            };
            let _ = write!(s, "; {f}: {reading}");
        }
        if let Some((w, v)) = self.winner {
            let sides = [Some(Contender::Keyserial), self.best_alt.map(|(c, _)| c)];
            if !sides.contains(&Some(w)) {
                let m = &self.metrics[0];
                let _ = write!(s, "; best row overall: {} {}", w.id(), fmt_value(m.unit, v));
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

/// The run's last lines: every table's verdict, one line per workload and mode, in the words of
/// the table's last line; then how keyserial's W6 rate holds up as the keys grow.
fn render_summary(tables: &[Table], modes: &[Mode]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nVerdicts: keyserial against the best alternative that keeps per-key order (the best of \
         thread_per_key, lanes_1x,\n  lanes_4x, striped, tokio_actor and tokio_chain in that \
         table), medians of this run's rows"
    );
    let width = tables.iter().map(|t| t.w.id().len()).max().unwrap_or(0);
    for t in tables {
        let _ = writeln!(
            out,
            "  {:<width$}  {:<7}  {}",
            t.w.id(),
            t.mode.id(),
            Verdict::of(t).sentence()
        );
    }
    for &m in modes {
        if let Some((r, hi, lo)) = w6_scaling(tables, m) {
            let _ = writeln!(
                out,
                "  W6 [{}]: keyserial's rate at {} keys is {r:.2}x its rate at {} keys",
                m.id(),
                fmt_keys(hi),
                fmt_keys(lo)
            );
        }
    }
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
    let ratios = |i: usize| v.pairs[i].and_then(|(k, b)| (b > 0.0).then_some(k / b));
    let f = [
        format!("\"winner\": {}", id(v.winner)),
        format!("\"winner_value\": {}", val(v.winner)),
        format!("\"against\": {}", json_str("best ordered")),
        // The best alternative: the best contender that keeps per-key order.
        format!("\"best_ordered\": {}", id(v.best_alt)),
        format!("\"best_ordered_value\": {}", val(v.best_alt)),
        format!("\"keyserial_value\": {}", json_opt(v.keyserial)),
        format!("\"higher_is_better\": {}", v.metrics[0].higher_is_better),
        format!("\"keyserial_to_best_ordered\": {}", json_opt(v.ratio())),
        format!(
            "\"keyserial_to_best_ordered_by_metric\": {}",
            json_metrics(&v.metrics, ratios)
        ),
        format!(
            "\"keyserial_ahead\": {}",
            v.ahead().map_or("null".into(), |b| b.to_string())
        ),
        format!("\"sentence\": {}", json_str(&v.sentence())),
    ];
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
    if workloads.iter().any(|w| matches!(w.group(), "W7" | "W8")) {
        let _ = writeln!(
            head,
            "  W7, W8: every tokio row (and keyserial's tokio_handle) runs on a {}",
            describe_tokio_runtime(args.workers)
        );
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
                        w,
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
    fn the_verdict_leaves_inline_out_and_names_the_best_alternative() {
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
        assert_eq!(v.best_alt.map(|w| w.0), Some(Contender::Lanes4x));
        assert_eq!(v.ratio(), Some(5.0 / 8.0));
        assert_eq!(v.ahead(), Some(false));
        assert_eq!(v.sentence(), "lanes_4x 1.60x faster than keyserial here");
        let line = v.line();
        assert!(
            line.contains("(tasks/s: keyserial 5 /s, lanes_4x 8 /s)"),
            "{line}"
        );
        assert!(!line.contains("target"), "{line}");
        // W1: wall time, lower is better.
        let t = w1_table(10.0, 11.0);
        let v = Verdict::of(&t);
        assert_eq!(v.best_alt.map(|w| w.0), Some(Contender::TokioActor));
        assert_eq!(v.ahead(), Some(true));
        assert_eq!(
            v.sentence(),
            "keyserial 1.10x faster than the best alternative, tokio_actor"
        );
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
    fn a_tables_line_and_the_summary_say_the_same() {
        for (k, says) in [
            (
                100.4,
                "keyserial level with the best alternative, tokio_actor",
            ),
            (
                97.0,
                "keyserial 1.03x faster than the best alternative, tokio_actor",
            ),
            (103.6, "tokio_actor 1.04x faster than keyserial here"),
        ] {
            let t = w1_table(k, 100.0);
            let line = Verdict::of(&t).line();
            let summary = render_summary(std::slice::from_ref(&t), &[Mode::Closure]);
            assert!(line.contains(says), "{k}: {line}");
            assert!(summary.contains(says), "{k}: {summary}");
            assert!(!summary.contains("target") && !summary.contains("MISSED"));
        }
    }

    #[test]
    fn w7_names_the_best_ordered_tokio_design_and_compares_memory() {
        const MIB: f64 = 1024.0 * 1024.0;
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
                r(Contender::Keyserial, 3.0, 5.0 * MIB),
                r(Contender::TokioActor, 2.0, 100.0 * MIB),
                r(Contender::TokioChain, 2.5, 10.0 * MIB),
                r(Contender::TokioMutex, 4.0, 50.0 * MIB),
            ],
            floor: None,
        };
        let v = Verdict::of(&t);
        // tokio_mutex keeps no promised order: the best row, not the best alternative.
        assert_eq!(v.best_alt.map(|w| w.0), Some(Contender::TokioChain));
        assert_eq!(v.winner.map(|w| w.0), Some(Contender::TokioMutex));
        let line = v.line();
        assert!(
            line.contains("keyserial 1.20x faster than the best alternative, tokio_chain"),
            "{line}"
        );
        assert!(
            line.contains(
                "peak RSS +: keyserial 5.0 MiB, tokio_chain 10.0 MiB: keyserial 2.00x less memory"
            ),
            "{line}"
        );
        assert!(line.contains("best row overall: tokio_mutex"), "{line}");
    }

    #[test]
    fn w8_is_read_on_both_latencies() {
        let w = Workload::w8(Size::Tiny);
        let r = |c, p50: f64, p99: f64| {
            let mut o = outcome(10, 0);
            o.values = vec![p50, p99, 1e9];
            row(c, vec![o])
        };
        let t = Table {
            w,
            mode: Mode::Closure,
            rows: vec![
                r(Contender::Keyserial, 4e6, 9e6),
                r(Contender::TokioActor, 3e6, 6e6),
                r(Contender::TokioChain, 2e6, 3e6),
            ],
            floor: None,
        };
        let line = Verdict::of(&t).line();
        assert!(
            line.contains("tokio_chain 2.00x faster than keyserial here (p50 latency: keyserial 4.0 ms, tokio_chain 2.0 ms)"),
            "{line}"
        );
        assert!(
            line.contains(
                "p99 latency: keyserial 9.0 ms, tokio_chain 3.0 ms: tokio_chain 3.00x faster"
            ),
            "{line}"
        );
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
        assert!(
            t.contains("=> keyserial level with the best alternative, striped"),
            "{t}"
        );
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
            s.contains("w2_overhead")
                && s.contains("keyserial level with the best alternative, striped"),
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
