//! `cargo run --release -p keyserial-benches --bin compare`: keyserial against the alternatives, on
//! this machine, in one run. See `--help`.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use keyserial_benches::contenders::{default_workers, Contender, Visit};
use keyserial_benches::exec::KeyedExecutor;
use keyserial_benches::work;
use keyserial_benches::workloads::{Metric, Outcome, Size, Unit, Workload};

const HELP: &str = "\
compare: keyserial against the executors you would otherwise write, on this machine.

USAGE:
    cargo run --release -p keyserial-benches --bin compare -- [OPTIONS]

OPTIONS:
    --quick              smaller workloads, run budget 0.6 s per row (about 20 s on 2 cores)
    --full               the issue's exact sizes (W1 16 x 50,000 tasks, W5 2 M tasks, W6 2 M tasks
                         per point); several minutes on 2 cores
    --workload LIST      comma-separated groups or ids to run, e.g. W1,W4 or w6_scale_1m
                         (default: all of W1..W6)
    --executor LIST      comma-separated executors to run (default: all), e.g. keyserial,lanes_1x
    --repeat N           exactly N runs per workload and executor; the table shows the median and
                         min-max. Default: up to 3 runs, but a row stops after the run that takes
                         it past 4 s (0.6 s with --quick), so slow rows get 1 or 2 runs
    --workers N          pool threads for every pooled executor (default: available parallelism)
    --json PATH          also write all results as JSON to PATH ('-' for stdout, tables then go
                         to stderr)
    --timeout SECS       how long one run may take before its tasks count as lost (default: 120)
    -h, --help           this text

WORKLOADS (sizes of --full; the default run cuts the ones marked *):
    W1* gatling        16 keys x 50,000 tasks (default 5,000), round-robin, 1,000 relaxed
                       fetch_add each; wall time
    W2  overhead       1,000 keys x 1,000 empty tasks, one submitter; tasks/s
    W3  many keys      1,000,000 distinct keys x 1 task; tasks/s and peak RSS growth
    W4  head-of-line   1 slow key (100 tasks x 5 ms sleep) among 1,000 fast keys x 20 empty tasks;
                       p50/p99/max submit-to-start latency of the fast tasks
    W5* skew           2 M tasks (default 200 k) of ~1 us, Zipf(1.1) over 100,000 keys,
                       2 submitters; tasks/s, p50/p99 submit-to-start latency
    W6* scale          W2's shape over 1 k, 100 k and 1 M keys, 2 M tasks each (default 1 M, at
                       least 2 per key); tasks/s

Every keyed run is checked: per key, tasks must start in submission order and never overlap, and
every submitted task must run. The program exits with status 1 if any ordered executor violated
order or any executor lost a task (the unordered pool's order is not checked: it is not a
serializer). Ratios are row / keyserial on the table's first metric.
";

struct Args {
    size: Size,
    workloads: Option<Vec<String>>,
    executors: Option<Vec<String>>,
    repeat: usize,
    /// Per-row time budget when `--repeat` was not given.
    budget: Option<Duration>,
    workers: usize,
    json: Option<String>,
    timeout: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        size: Size::Default,
        workloads: None,
        executors: None,
        repeat: 0,
        budget: None,
        workers: default_workers(),
        json: None,
        timeout: Duration::from_secs(120),
    };
    let mut it = std::env::args().skip(1);
    let list = |v: String| -> Vec<String> {
        v.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    };
    while let Some(a) = it.next() {
        let (flag, inline_val) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline_val
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            "--quick" => args.size = Size::Quick,
            "--full" => args.size = Size::Full,
            "--workload" | "--workloads" => args.workloads = Some(list(value(&flag)?)),
            "--executor" | "--executors" => args.executors = Some(list(value(&flag)?)),
            "--repeat" => {
                args.repeat = value(&flag)?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or("--repeat needs a positive number")?;
            }
            "--workers" => {
                args.workers = value(&flag)?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or("--workers needs a positive number")?;
            }
            "--json" => args.json = Some(value(&flag)?),
            "--timeout" => {
                let secs: u64 = value(&flag)?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or("--timeout needs a positive number of seconds")?;
                args.timeout = Duration::from_secs(secs);
            }
            "--bench" => {} // passed by `cargo bench`; ignored
            other => return Err(format!("unknown option {other:?} (see --help)")),
        }
    }
    if args.repeat == 0 {
        args.repeat = 3;
        args.budget = Some(if args.size == Size::Quick {
            Duration::from_millis(600)
        } else {
            Duration::from_secs(4)
        });
    }
    Ok(args)
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
    timeout: Duration,
}

impl Visit for RunOne<'_> {
    type Out = Outcome;
    fn visit<E: KeyedExecutor>(self, exec: &E) -> Outcome {
        self.w.run(exec, self.timeout)
    }
}

/// `floor`: W1's measured floor (nanoseconds, see [`Workload::measured_floor`]).
fn render_table(w: &Workload, rows: &[Row], workers: usize, floor: Option<f64>) -> String {
    let metrics = w.metrics();
    let primary = metrics[0];
    let ks = rows
        .iter()
        .find(|r| r.contender == Contender::Keyserial)
        .and_then(|r| r.median(0));
    let mut out = String::new();
    let _ = writeln!(out, "\n{}", w.title());
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
        line.push(if r.contender.is_ordered() {
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
    // The ideal: the work's own cost spread over every worker.
    if let Some(inline) = rows
        .iter()
        .find(|r| r.contender == Contender::Inline)
        .and_then(|r| r.median(0))
    {
        let ideal = match (primary.unit, primary.higher_is_better) {
            (Unit::PerSec, true) => Some(inline * workers as f64),
            (Unit::Nanos, false) if primary.key == "wall_ns" => Some(inline / workers as f64),
            _ => None,
        };
        if let Some(ideal) = ideal {
            let _ = writeln!(
                out,
                "  ideal (inline spread over {workers} workers): {}",
                fmt_value(primary.unit, ideal)
            );
            if let (Some(floor), Some(ks)) = (
                floor,
                rows.iter()
                    .find(|r| r.contender == Contender::Keyserial)
                    .and_then(|r| r.median(0)),
            ) {
                let _ = writeln!(
                    out,
                    "  measured floor (the same tasks split by key over {workers} plain threads, \
                     no executor): {} = {:.2}x ideal; keyserial {:.2}x ideal, {:.2}x the floor",
                    fmt_value(primary.unit, floor),
                    floor / ideal,
                    ks / ideal,
                    ks / floor
                );
            }
        }
    }
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

/// `results`: each workload, its rows, and W1's measured floor in nanoseconds (else `None`).
fn render_json(args: &Args, results: &[(Workload, Vec<Row>, Option<f64>)], ok: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{{");
    let _ = writeln!(o, "  \"workers\": {},", args.workers);
    let _ = writeln!(o, "  \"repeat\": {},", args.repeat);
    let _ = writeln!(o, "  \"quick\": {},", args.size == Size::Quick);
    let _ = writeln!(o, "  \"ok\": {ok},");
    let _ = writeln!(o, "  \"workloads\": [");
    for (wi, (w, rows, floor)) in results.iter().enumerate() {
        let metrics = w.metrics();
        let ks = rows
            .iter()
            .find(|r| r.contender == Contender::Keyserial)
            .and_then(|r| r.median(0));
        let _ = writeln!(o, "    {{");
        let _ = writeln!(o, "      \"id\": {},", json_str(&w.id()));
        let _ = writeln!(o, "      \"title\": {},", json_str(&w.title()));
        let _ = writeln!(o, "      \"keys\": {},", w.keys());
        let _ = writeln!(o, "      \"tasks\": {},", w.tasks());
        let _ = writeln!(o, "      \"primary\": {},", json_str(metrics[0].key));
        if let Some(f) = floor {
            let _ = writeln!(o, "      \"measured_floor_ns\": {},", json_num(*f));
        }
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
        let _ = writeln!(o, "    }}{}", if wi + 1 < results.len() { "," } else { "" });
    }
    let _ = writeln!(o, "  ]");
    let _ = writeln!(o, "}}");
    o
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
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("compare: {e}");
            return ExitCode::from(2);
        }
    };
    let workloads: Vec<Workload> = Workload::all(args.size)
        .into_iter()
        .filter(|w| selected(w, &args.workloads))
        .collect();
    if workloads.is_empty() {
        eprintln!("compare: no workload matches {:?}", args.workloads);
        return ExitCode::from(2);
    }
    let contenders: Vec<Contender> = match &args.executors {
        None => Contender::all(),
        Some(list) => {
            let mut v = Vec::new();
            for id in list {
                match Contender::from_id(id) {
                    Some(c) => v.push(c),
                    None => {
                        eprintln!("compare: unknown executor {id:?}");
                        return ExitCode::from(2);
                    }
                }
            }
            v
        }
    };
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
        "keyserial compare: {} workers ({} cores available), {}{} run{} per row, {} sizes\n",
        args.workers,
        cores,
        if args.budget.is_some() { "up to " } else { "" },
        args.repeat,
        if args.repeat == 1 { "" } else { "s" },
        match args.size {
            Size::Quick => "--quick",
            Size::Full => "--full (the issue's)",
            _ => "default",
        }
    );
    if !Contender::keyserial_available() {
        head.push_str("  (the keyserial row is not built in yet: baselines only)\n");
    }
    for c in &contenders {
        let _ = writeln!(head, "  {:<15} {}", c.id(), c.describe(args.workers));
    }
    emit(&head);

    // Calibrate W5's spin loop while the machine is quiet.
    let _ = work::iters_per_micro();

    let plan: Vec<(usize, Contender)> = workloads
        .iter()
        .enumerate()
        .flat_map(|(wi, w)| {
            contenders
                .iter()
                .filter(move |c| c.skip_reason(w).is_none())
                .map(move |&c| (wi, c))
        })
        .collect();
    let pb = ProgressBar::new((plan.len() * args.repeat) as u64);
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:32}] {pos}/{len} {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.enable_steady_tick(Duration::from_millis(200));

    let started = Instant::now();
    let mut results: Vec<(Workload, Vec<Row>, Option<f64>)> = Vec::new();
    let mut failed = false;
    for w in &workloads {
        let mut rows: Vec<Row> = contenders
            .iter()
            .map(|&c| Row {
                contender: c,
                skipped: c.skip_reason(w),
                runs: Vec::new(),
                spent: Duration::ZERO,
            })
            .collect();
        let mut floor = Vec::new();
        // Repeats are the outer loop, so that drift on the machine spreads over every row.
        for rep in 0..args.repeat {
            if let Some(f) = w.measured_floor(args.workers) {
                floor.push(f.as_nanos() as f64);
            }
            for row in rows.iter_mut().filter(|r| r.skipped.is_none()) {
                if let (Some(budget), Some(per_run)) =
                    (args.budget, row.spent.checked_div(row.runs.len() as u32))
                {
                    if row.spent + per_run > budget {
                        pb.inc(1);
                        continue;
                    }
                }
                pb.set_message(format!(
                    "{} | {} | run {}/{}",
                    w.id(),
                    row.contender.id(),
                    rep + 1,
                    args.repeat
                ));
                let t = Instant::now();
                let out = row.contender.visit(
                    args.workers,
                    RunOne {
                        w,
                        timeout: args.timeout,
                    },
                );
                row.spent += t.elapsed();
                row.runs.push(out);
                pb.inc(1);
            }
        }
        failed |= rows.iter().any(Row::failed);
        let floor = median(floor);
        let table = render_table(w, &rows, args.workers, floor);
        pb.suspend(|| emit(&table));
        results.push((w.clone(), rows, floor));
    }
    pb.finish_and_clear();

    let keyed_runs: usize = results
        .iter()
        .flat_map(|(_, rows, _)| rows.iter())
        .filter(|r| r.contender.is_ordered())
        .map(|r| r.runs.len())
        .sum();
    let violations: u64 = results
        .iter()
        .flat_map(|(_, rows, _)| rows.iter())
        .filter(|r| r.contender.is_ordered())
        .map(Row::violations)
        .sum();
    let lost = results
        .iter()
        .flat_map(|(_, rows, _)| rows.iter())
        .filter(|r| !r.all_ran())
        .map(|r| r.contender.id())
        .collect::<Vec<_>>();
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
        let json = render_json(&args, &results, !failed);
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
        let t = render_table(&w, &rows, 2, None);
        assert!(t.contains("keyserial") && t.contains("1.00x"), "{t}");
        assert!(t.contains("skipped (5 threads)"), "{t}");
        let args = Args {
            size: Size::Tiny,
            workloads: None,
            executors: None,
            repeat: 1,
            budget: None,
            workers: 2,
            json: None,
            timeout: Duration::from_secs(1),
        };
        let j = render_json(&args, &[(w, rows, Some(1.0e8))], true);
        assert!(j.contains("\"executor\": \"striped\""), "{j}");
        assert!(j.contains("\"skipped\": \"skipped (5 threads)\""), "{j}");
        assert!(j.contains("\"measured_floor_ns\": 100000000"), "{j}");
        assert_eq!(json_str("a\"b\\\n"), "\"a\\\"b\\\\\\n\"");
    }
}
