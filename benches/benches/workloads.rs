//! Criterion suite: W1–W8 at small sizes ([`Size::Bench`]) on every contender.
//!
//! Benchmark ids are `<workload>/<executor>`, e.g. `w2_overhead/keyserial` or
//! `w6_scale_10k/striped`, stable across runs so that `--save-baseline` / `--baseline` compare
//! like with like. The measured time is the workload's wall time (first submit to last finish);
//! building and dropping the executor is not timed. Tasks are passed as closures
//! ([`Mode::Closure`]); the compare program also runs the pre-boxed mode. Every run is
//! order-checked and panics on a violation or a lost task.
//!
//! `cargo bench -p keyserial-benches --bench workloads -- --quick` takes a couple of minutes.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use keyserial_benches::contenders::{default_workers, Contender, Visit};
use keyserial_benches::exec::KeyedExecutor;
use keyserial_benches::workloads::{Mode, Size, Workload};

struct Timed<'a> {
    w: &'a Workload,
    contender: Contender,
    iters: u64,
}

impl Visit for Timed<'_> {
    type Out = Duration;
    fn visit<E: KeyedExecutor>(self, exec: &E) -> Duration {
        let mut total = Duration::ZERO;
        for _ in 0..self.iters {
            let out = self.w.run(exec, Mode::Closure, Duration::from_secs(60));
            assert!(
                out.all_ran(),
                "{} on {}: {} of {} tasks ran",
                self.w.id(),
                self.contender.id(),
                out.ran,
                out.expected
            );
            if self.contender.is_ordered() {
                assert_eq!(
                    out.violations,
                    0,
                    "{} on {}: order violated",
                    self.w.id(),
                    self.contender.id()
                );
            }
            total += out.elapsed;
        }
        total
    }
}

fn workloads(c: &mut Criterion) {
    let workers = default_workers();
    for w in Workload::all(Size::Bench) {
        let mut group = c.benchmark_group(w.id());
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2))
            .throughput(Throughput::Elements(w.tasks()));
        for contender in Contender::all() {
            if contender.skip_reason(&w).is_some() {
                continue;
            }
            group.bench_function(contender.id(), |b| {
                b.iter_custom(|iters| {
                    contender.visit(
                        workers,
                        &w,
                        Timed {
                            w: &w,
                            contender,
                            iters,
                        },
                    )
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, workloads);
criterion_main!(benches);
