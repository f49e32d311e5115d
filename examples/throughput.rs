//! Measures the bandwidth of LayerNorm, RMSNorm and `stats` against a plain
//! copy of the same bytes and against a naive ndarray implementation, and
//! prints one table:
//!
//! ```text
//! cargo run --release --example throughput                # all sections
//! cargo run --release --example throughput out strided    # some of them
//! ```
//!
//! - `GB/s` counts the bytes read and written once each: `x` read once and
//!   the output written once (for `stats`, `x` read and the two results
//!   written).
//! - `vs copy` is the operation's bandwidth over that of `copy_from_slice`
//!   of the same bytes into a preallocated buffer, measured in the same run
//!   on the same threads. With several threads the copy is split into
//!   chunks with rayon, and the faster of that and a one-thread copy is
//!   kept. The allocating forms (`layer_norm`, `rms_norm`) are compared with
//!   "allocate + copy", a fresh array filled by the copy, timed together
//!   (the fastest of a zeroed array, `to_vec` and, on several threads, a
//!   split copy into a zeroed array and rayon's `collect`), since a fresh
//!   output costs a page fault per page either way.
//! - `read (sum of x, baseline)` is no operation of the crate: it sums the
//!   256 MiB input, a plain read of every element, and shows how close to
//!   the copy an operation that only reads (`stats`) can come.
//! - `vs naive` is how many times faster the operation is than the naive
//!   ndarray version (`mean_axis`, `var_axis` and broadcasting, on one
//!   thread), measured in the `cache` section and for d = 4 in `tiny` (it
//!   takes seconds on the 256 MiB inputs); `-` elsewhere.
//! - Every figure is the best of several repetitions (at least two; no new
//!   one starts once 0.3 s went into a measurement).
//!
//! Sections: `out` (out of cache: `x` of 256 MiB, d = 64 to 16384), `cache`
//! (`x` of about 256 KiB, the operation repeated; d = 100 as a row length
//! that is no multiple of 16), `tiny` (d = 1 to 16, many
//! rows, all cores) and `strided` (Fortran-order inputs of 256 MiB, marked
//! `[F]`, and inputs of 128 MiB taking every other element of each row,
//! `[..;2]`, or every other row, `[..;2,]`; compare with the contiguous rows
//! of `out` and `tiny`). `threads` is 1 or all cores
//! (`rayon::ThreadPool::install`). With `--features half`, the section
//! `half` times `f16` and `bf16` rows against `f32` and against converting
//! to `f32` and back (`examples/halves/mod.rs`).
//!
//! Out of cache, the copy is timed again next to every case and the best
//! copy seen so far in the section is the baseline (the machine may be
//! shared, and other work only ever slows a copy down); "allocate + copy"
//! costs a page fault per page, so it is timed once per thread count on
//! the full 256 MiB at the start of the section and scaled to each case's
//! bytes.

use std::error::Error;
use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ndarray::{s, Array1, Array2, ArrayView2, ArrayViewMut2, ShapeBuilder};
use ndarray_layernorm::prelude::*;
use rayon::prelude::*;
use rayon::ThreadPool;

/// Elements per chunk of the parallel copy.
const COPY_CHUNK: usize = 1 << 14;

#[cfg(feature = "half")]
mod halves;
#[path = "../benches/common/naive.rs"]
mod naive;
use naive::{naive_layer_norm, naive_rms_norm, naive_stats, Elem, EPS};

/// Time spent on one measurement after which no more repetitions start
/// (past the first two).
const BUDGET: Duration = Duration::from_millis(300);

/// The best time of up to `reps` runs of `f` (each returning its own
/// duration): at least two, and no new one once [`BUDGET`] is spent.
fn best(reps: usize, mut f: impl FnMut() -> Duration) -> f64 {
    let start = Instant::now();
    let mut best = f64::INFINITY;
    for rep in 0..reps.max(1) {
        if rep >= 2 && start.elapsed() > BUDGET {
            break;
        }
        best = best.min(f().as_secs_f64());
    }
    best
}

/// The best over `reps` of the time of `batch` calls of `call`, each
/// result dropped outside the timing.
fn best_of_batches<R>(reps: usize, batch: usize, call: impl Fn() -> R) -> f64 {
    best(reps, || {
        let mut total = Duration::ZERO;
        for _ in 0..batch {
            let mut result = None;
            total += time(|| result = Some(call()));
            drop(result);
        }
        total
    })
}

/// Times `f` alone.
fn time(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

/// `dst.copy_from_slice(src)`, split into chunks on the current pool when
/// `parallel`.
fn copy<A: Elem>(dst: &mut [A], src: &[A], parallel: bool) {
    if parallel {
        dst.par_chunks_mut(COPY_CHUNK)
            .zip(src.par_chunks(COPY_CHUNK))
            .for_each(|(d, s)| d.copy_from_slice(s));
    } else {
        dst.copy_from_slice(src);
    }
}

/// Seconds per copy of `src` into `dst` on the current pool: the faster of
/// a one-thread and a split copy, best of `reps` batches of `batch` copies.
fn copy_time<A: Elem>(dst: &mut [A], src: &[A], reps: usize, batch: usize) -> f64 {
    let mut t = best(reps, || {
        time(|| (0..batch).for_each(|_| copy(dst, src, false)))
    });
    if rayon::current_num_threads() > 1 {
        t = t.min(best(reps, || {
            time(|| (0..batch).for_each(|_| copy(dst, src, true)))
        }));
    }
    t / batch as f64
}

/// Sum of `src` in 16 independent lanes: a plain read of every element.
fn sum<A: Elem>(src: &[A]) -> A {
    let mut lanes = [A::zero(); 16];
    let mut chunks = src.chunks_exact(16);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = *lane + v;
        }
    }
    chunks.remainder().iter().fold(A::zero(), |a, &v| a + v)
        + lanes.into_iter().fold(A::zero(), |a, v| a + v)
}

/// Seconds per plain read of `src` (a sum) on the current pool: the faster
/// of a one-thread and a split read, best of `reps`. The ceiling of
/// operations that only read, such as `stats`.
fn read_time<A: Elem>(src: &[A], reps: usize) -> f64 {
    let mut t = best(reps, || {
        time(|| {
            // Both ends opaque, so the sum is neither skipped nor moved
            // out of the timing.
            std::hint::black_box(sum(std::hint::black_box(src)));
        })
    });
    if rayon::current_num_threads() > 1 {
        t = t.min(best(reps, || {
            time(|| {
                let total = std::hint::black_box(src)
                    .par_chunks(COPY_CHUNK)
                    .map(sum)
                    .reduce(A::zero, |a, b| a + b);
                std::hint::black_box(total);
            })
        }));
    }
    t
}

/// Seconds per "allocate + copy" of `src` into a fresh array (the drop is
/// not timed): the fastest of a zeroed array filled by the copy and of an
/// uninitialised one written by it (`to_vec`, and rayon's `collect`, which
/// writes its parts in place, on several threads).
fn alloc_copy_time<A: Elem>(src: &[A], reps: usize, batch: usize) -> f64 {
    let run =
        |allocate_and_copy: &dyn Fn() -> Array1<A>| best_of_batches(reps, batch, allocate_and_copy);
    let zeroed = |parallel: bool| {
        let mut fresh = Array1::<A>::zeros(src.len());
        if let Some(dst) = fresh.as_slice_mut() {
            copy(dst, src, parallel);
        }
        fresh
    };
    let mut t = run(&|| zeroed(false)).min(run(&|| Array1::from(src.to_vec())));
    if rayon::current_num_threads() > 1 {
        t = t.min(run(&|| zeroed(true)));
        t = t.min(run(&|| {
            Array1::from(src.par_iter().copied().collect::<Vec<A>>())
        }));
    }
    t / batch as f64
}

/// One line of the table.
struct Line<'a> {
    op: &'a str,
    dtype: &'a str,
    rows: usize,
    d: usize,
    threads: usize,
    bytes: usize,
    seconds: f64,
    copy_seconds: f64,
    naive_seconds: Option<f64>,
}

fn header() {
    println!(
        "| {:<26} | {:<5} | {:>9} | {:>6} | {:>7} | {:>7} | {:>7} | {:>8} |",
        "op", "dtype", "rows", "d", "threads", "GB/s", "vs copy", "vs naive"
    );
    println!(
        "|{:-<28}|{:-<7}|{:-<11}|{:-<8}|{:-<9}|{:-<9}|{:-<9}|{:-<10}|",
        "", "", "", "", "", "", "", ""
    );
}

fn print(line: Line<'_>) {
    let gbs = line.bytes as f64 / line.seconds / 1e9;
    let naive: Box<dyn Display> = match line.naive_seconds {
        Some(n) => Box::new(format!("{:.1}x", n / line.seconds)),
        None => Box::new("-"),
    };
    println!(
        "| {:<26} | {:<5} | {:>9} | {:>6} | {:>7} | {:>7.2} | {:>6.2}x | {:>8} |",
        line.op,
        line.dtype,
        line.rows,
        line.d,
        line.threads,
        gbs,
        line.copy_seconds / line.seconds,
        naive
    );
}

/// Deterministic values of varied offset and spread.
fn fill<A: Elem>(len: usize) -> Vec<A> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let noise = (state >> 40) as f64 / (1u64 << 24) as f64 - 0.5;
            A::narrow((i % 7) as f64 + noise)
        })
        .collect()
}

/// `values` twice over: storage for the layouts that take every other
/// column or row, copied rather than filled anew to keep the run short.
fn doubled<A: Elem>(values: &[A]) -> Vec<A> {
    [values, values].concat()
}

/// How a case lays out its `rows × d` input.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    C,
    Fortran,
    /// Every other column of a `rows × 2d` C-order array.
    Step2,
    /// Every other row of a `2rows × d` C-order array: each row
    /// contiguous, with a gap of one row after it.
    RowStep2,
}

/// One group of measurements: every form of both norms on `rows × d`
/// elements of `A`, at each thread count.
struct Case<'p> {
    pools: &'p [(usize, ThreadPool)],
    rows: usize,
    d: usize,
    layout: Layout,
    /// Repetitions of each measurement.
    reps: usize,
    /// Calls per repetition (to time small inputs).
    batch: usize,
    /// Which forms to run.
    forms: &'p [Form],
    naive: bool,
    /// Baselines shared by a section: per pool, the best seconds per element
    /// of the copy and of "allocate + copy" seen so far.
    baselines: Option<&'p [Baseline]>,
}

/// The best seconds per element of the copy and of "allocate + copy" seen so
/// far (as `f64` bits, so that a `Case` can be shared with the pools).
struct Baseline {
    copy: AtomicU64,
    alloc: AtomicU64,
}

impl Baseline {
    fn new(copy: f64, alloc: f64) -> Self {
        Baseline {
            copy: AtomicU64::new(copy.to_bits()),
            alloc: AtomicU64::new(alloc.to_bits()),
        }
    }

    /// The best copy time so far, with `fresh` taken into account.
    fn copy(&self, fresh: f64) -> f64 {
        let best = f64::from_bits(self.copy.load(Ordering::Relaxed)).min(fresh);
        self.copy.store(best.to_bits(), Ordering::Relaxed);
        best
    }

    fn alloc(&self) -> f64 {
        f64::from_bits(self.alloc.load(Ordering::Relaxed))
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Form {
    LayerNormInplace,
    LayerNormInto,
    LayerNorm,
    RmsNormInplace,
    RmsNormInto,
    RmsNorm,
    Stats,
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::LayerNormInplace => "layer_norm_inplace",
            Form::LayerNormInto => "layer_norm_into",
            Form::LayerNorm => "layer_norm",
            Form::RmsNormInplace => "rms_norm_inplace",
            Form::RmsNormInto => "rms_norm_into",
            Form::RmsNorm => "rms_norm",
            Form::Stats => "stats",
        }
    }
}

const NORMS: [Form; 6] = [
    Form::LayerNormInplace,
    Form::LayerNormInto,
    Form::LayerNorm,
    Form::RmsNormInplace,
    Form::RmsNormInto,
    Form::RmsNorm,
];

impl Case<'_> {
    fn run<A: Elem>(&self, input: &[A], spare: &mut [A]) -> Result<(), Box<dyn Error>> {
        let (rows, d) = (self.rows, self.d);
        let len = rows * d;
        let elem = std::mem::size_of::<A>();
        let (src, dst) = (&input[..len], &mut spare[..len]);
        let gamma = Array1::from_shape_fn(d, |i| A::narrow(1.0 + (i % 3) as f64 / 4.0));
        let beta = Array1::from_shape_fn(d, |i| A::narrow((i % 5) as f64 / 8.0));
        let eps = A::narrow(EPS);

        let x_storage: Vec<A>;
        let x: ArrayView2<'_, A> = match self.layout {
            Layout::C => ArrayView2::from_shape((rows, d), src)?,
            Layout::Fortran => ArrayView2::from_shape((rows, d).f(), src)?,
            Layout::Step2 => {
                x_storage = doubled(src);
                ArrayView2::from_shape((rows, 2 * d), &x_storage[..])?.slice_move(s![.., ..;2])
            }
            Layout::RowStep2 => {
                x_storage = doubled(src);
                ArrayView2::from_shape((2 * rows, d), &x_storage[..])?.slice_move(s![..;2, ..])
            }
        };
        // The in-place forms work on a copy in the same layout, made only
        // for cases that time them.
        let in_place = self
            .forms
            .iter()
            .any(|form| matches!(form, Form::LayerNormInplace | Form::RmsNormInplace));
        let mut work: Vec<A> = match self.layout {
            _ if !in_place => Vec::new(),
            Layout::Step2 | Layout::RowStep2 => doubled(src),
            _ => src.to_vec(),
        };

        // The naive code gets the op's repetitions and statistic, and, as
        // the op's allocating forms, drops its results outside the timing.
        // It runs on the calling thread: ndarray does not split it.
        let naive_time = |form: Form| -> Option<f64> {
            if !self.naive {
                return None;
            }
            let (reps, batch) = (self.reps, self.batch);
            Some(
                match form {
                    Form::Stats => best_of_batches(reps, batch, || naive_stats(x)),
                    Form::RmsNormInplace | Form::RmsNormInto | Form::RmsNorm => {
                        best_of_batches(reps, batch, || naive_rms_norm(x, &gamma))
                    }
                    _ => best_of_batches(reps, batch, || naive_layer_norm(x, &gamma, &beta)),
                } / batch as f64,
            )
        };
        let naive_ln = naive_time(Form::LayerNorm);
        let naive_rms = naive_time(Form::RmsNorm);
        let naive_stats = if self.forms.contains(&Form::Stats) {
            naive_time(Form::Stats)
        } else {
            None
        };

        // One output for every `_into` form of the case: its pages are
        // faulted in once, rather than once per form (out of cache, 2.3 us
        // per 4 KiB page, outside the timing but not outside the run).
        let into = self
            .forms
            .iter()
            .any(|form| matches!(form, Form::LayerNormInto | Form::RmsNormInto));
        let mut out = Array2::<A>::zeros(if into { (rows, d) } else { (0, d) });
        for (p, (threads, pool)) in self.pools.iter().enumerate() {
            let (copy_s, alloc_s) = match self.baselines.and_then(|b| b.get(p)) {
                Some(best) => {
                    let fresh = pool.install(|| copy_time(dst, src, 2, 1)) / len as f64;
                    (best.copy(fresh) * len as f64, best.alloc() * len as f64)
                }
                None => pool.install(|| {
                    (
                        copy_time(dst, src, self.reps, self.batch),
                        alloc_copy_time(src, self.reps, self.batch),
                    )
                }),
            };
            for &form in self.forms {
                let batch = self.batch;
                let mut work_view: ArrayViewMut2<'_, A> = match self.layout {
                    // No in-place form to time.
                    _ if !in_place => ArrayViewMut2::from_shape((0, d), &mut work[..])?,
                    Layout::C => ArrayViewMut2::from_shape((rows, d), &mut work[..])?,
                    Layout::Fortran => ArrayViewMut2::from_shape((rows, d).f(), &mut work[..])?,
                    Layout::Step2 => ArrayViewMut2::from_shape((rows, 2 * d), &mut work[..])?
                        .slice_move(s![.., ..;2]),
                    Layout::RowStep2 => ArrayViewMut2::from_shape((2 * rows, d), &mut work[..])?
                        .slice_move(s![..;2, ..]),
                };
                let mut status: Result<(), NormError> = Ok(());
                let seconds = pool.install(|| {
                    best(self.reps, || {
                        // Each repetition starts from x again, outside the
                        // timing: repeated in place, the rows would drift
                        // (RMSNorm's towards subnormals) from what is timed.
                        if matches!(form, Form::LayerNormInplace | Form::RmsNormInplace) {
                            work_view.assign(&x);
                        }
                        let mut total = Duration::ZERO;
                        for _ in 0..batch {
                            let mut outcome = Ok(None);
                            total += time(|| {
                                outcome = match form {
                                    Form::LayerNormInplace => work_view
                                        .layer_norm_inplace(&gamma, &beta, eps)
                                        .map(|()| None),
                                    Form::LayerNormInto => x
                                        .layer_norm_into(&mut out, &gamma, &beta, eps)
                                        .map(|()| None),
                                    Form::LayerNorm => x.layer_norm(&gamma, &beta, eps).map(Some),
                                    Form::RmsNormInplace => {
                                        work_view.rms_norm_inplace(&gamma, eps).map(|()| None)
                                    }
                                    Form::RmsNormInto => {
                                        x.rms_norm_into(&mut out, &gamma, eps).map(|()| None)
                                    }
                                    Form::RmsNorm => x.rms_norm(&gamma, eps).map(Some),
                                    Form::Stats => x.stats().map(|_| None),
                                };
                            });
                            // A fresh result is dropped outside the timing.
                            if let Err(e) = outcome {
                                status = Err(e);
                            }
                        }
                        total
                    }) / batch as f64
                });
                status?;
                let allocating = matches!(form, Form::LayerNorm | Form::RmsNorm);
                let (bytes, baseline) = match form {
                    Form::Stats => ((len + 2 * rows) * elem, copy_s),
                    _ if allocating => (2 * len * elem, alloc_s),
                    _ => (2 * len * elem, copy_s),
                };
                let naive = match form {
                    Form::Stats => naive_stats,
                    Form::RmsNormInplace | Form::RmsNormInto | Form::RmsNorm => naive_rms,
                    _ => naive_ln,
                };
                let label = match self.layout {
                    Layout::C => form.name().to_string(),
                    Layout::Fortran => format!("{} [F]", form.name()),
                    Layout::Step2 => format!("{} [..;2]", form.name()),
                    Layout::RowStep2 => format!("{} [..;2,]", form.name()),
                };
                print(Line {
                    op: &label,
                    dtype: A::NAME,
                    rows,
                    d,
                    threads: *threads,
                    bytes,
                    seconds,
                    copy_seconds: if form == Form::Stats {
                        // The copy moves 2 * len elements; scale it to the bytes stats moves.
                        copy_s * bytes as f64 / (2 * len * elem) as f64
                    } else {
                        baseline
                    },
                    naive_seconds: naive,
                });
            }
        }
        Ok(())
    }
}

/// The sections to run: all, or those named on the command line.
struct Sections(Vec<String>);

impl Sections {
    fn wants(&self, name: &str) -> bool {
        self.0.is_empty() || self.0.iter().any(|s| s == name)
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let start = Instant::now();
    let wanted = Sections(std::env::args().skip(1).collect());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut pools = Vec::new();
    for threads in [1, cores] {
        if pools.iter().all(|&(t, _)| t != threads) {
            pools.push((
                threads,
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()?,
            ));
        }
    }

    println!(
        "{cores} cores; sections (pick with arguments): out (x of 256 MiB), \
         cache (x of about 256 KiB), tiny (d = 1..16), strided (Fortran order, steps), \
         half (with --features half)"
    );
    header();
    sections::<f32>(&pools, &wanted)?;
    sections::<f64>(&pools, &wanted)?;
    #[cfg(feature = "half")]
    if wanted.wants("half") {
        halves::section(&pools)?;
    }
    println!("\n(total {:.1} s)", start.elapsed().as_secs_f64());
    Ok(())
}

fn sections<A: Elem>(
    pools: &[(usize, ThreadPool)],
    wanted: &Sections,
) -> Result<(), Box<dyn Error>> {
    let all_cores = &pools[pools.len() - 1..];
    let elem = std::mem::size_of::<A>();
    let big = (256 << 20) / elem;
    let input: Vec<A> = fill(big);
    let mut spare: Vec<A> = vec![A::zero(); big];
    let base = |pools, rows, d, layout, forms| Case {
        pools,
        rows,
        d,
        layout,
        // Out of cache, best of two: with a third the whole run takes over a
        // minute on a loaded machine.
        reps: 2,
        batch: 1,
        forms,
        naive: false,
        baselines: None,
    };

    // The out-of-cache baselines move 256 MiB whatever d is: measure them
    // once per thread count, per element.
    let mut big_baselines = Vec::new();
    if wanted.wants("out") || wanted.wants("strided") {
        for (_, pool) in pools {
            let (copy, alloc) = pool.install(|| {
                (
                    copy_time(&mut spare, &input, 2, 1),
                    alloc_copy_time(&input, 2, 1),
                )
            });
            big_baselines.push(Baseline::new(copy / big as f64, alloc / big as f64));
        }
    }
    let big_baselines = Some(&big_baselines[..]);

    if wanted.wants("out") {
        for d in [64, 768, 4096, 16384] {
            let case = Case {
                baselines: big_baselines,
                ..base(pools, big / d, d, Layout::C, &NORMS)
            };
            case.run(&input, &mut spare)?;
        }
        let stats = Case {
            baselines: big_baselines,
            ..base(pools, big / 768, 768, Layout::C, &[Form::Stats])
        };
        stats.run(&input, &mut spare)?;
        // What a pure read of the same 256 MiB reaches against the copy:
        // the ceiling of `stats`, which only reads.
        for (p, (threads, pool)) in pools.iter().enumerate() {
            let (read_seconds, copy_seconds) =
                pool.install(|| (read_time(&input, 2), copy_time(&mut spare, &input, 2, 1)));
            let per_element = copy_seconds / big as f64;
            let copy_seconds = big_baselines
                .and_then(|b| b.get(p))
                .map_or(per_element, |best| best.copy(per_element))
                * big as f64;
            print(Line {
                op: "read (sum of x, baseline)",
                dtype: A::NAME,
                rows: big / 768,
                d: 768,
                threads: *threads,
                bytes: big * elem,
                seconds: read_seconds,
                // The copy moves twice the bytes; scale it to one read.
                copy_seconds: copy_seconds / 2.0,
                naive_seconds: None,
            });
        }
    }

    if wanted.wants("cache") {
        // d = 100: rows that end in a partial chunk of the kernels' 16 lanes.
        for d in [64, 100, 768, 4096, 16384] {
            let rows = ((256 << 10) / elem / d).max(1);
            let case = Case {
                reps: 5,
                batch: (16 << 20) / (rows * d * elem),
                naive: true,
                ..base(pools, rows, d, Layout::C, &NORMS)
            };
            case.run(&input, &mut spare)?;
        }
    }

    if wanted.wants("tiny") {
        // Many tiny rows: x of 32 MiB.
        for d in [1, 2, 3, 4, 8, 13, 16] {
            let rows = (32 << 20) / elem / d;
            let case = Case {
                naive: d == 4,
                ..base(
                    all_cores,
                    rows,
                    d,
                    Layout::C,
                    &[Form::LayerNormInto, Form::RmsNormInto],
                )
            };
            case.run(&input, &mut spare)?;
        }
    }

    if wanted.wants("strided") {
        // Out of cache, against the contiguous rows of the "out" section.
        for d in [64, 768, 4096, 16384] {
            let case = Case {
                baselines: big_baselines,
                ..base(pools, big / d, d, Layout::Fortran, &[Form::LayerNormInto])
            };
            case.run(&input, &mut spare)?;
        }
        for (layout, forms) in [
            (Layout::Fortran, &[Form::LayerNormInplace][..]),
            (Layout::Step2, &[Form::LayerNormInto][..]),
        ] {
            let rows = if layout == Layout::Step2 {
                big / 2 / 768
            } else {
                big / 768
            };
            let case = Case {
                baselines: big_baselines,
                ..base(pools, rows, 768, layout, forms)
            };
            case.run(&input, &mut spare)?;
        }
        // Every other row: short rows, and rows of 3 KiB.
        for (d, forms) in [
            (8, &[Form::LayerNormInto, Form::LayerNormInplace][..]),
            (768, &[Form::LayerNormInto][..]),
        ] {
            let case = Case {
                baselines: big_baselines,
                ..base(pools, big / 2 / d, d, Layout::RowStep2, forms)
            };
            case.run(&input, &mut spare)?;
        }
    }
    Ok(())
}
