//! `ndarray-layernorm` against the code a user would otherwise run, in one
//! run on one machine: the naive ndarray code (`mean_axis`, `var_axis`,
//! broadcasting), a hand-written row loop, and `candle-nn`'s
//! `ops::layer_norm` / `ops::rms_norm`, each as throughput relative to a
//! copy of the same bytes, then each peer's worst error in ulps.
//!
//! Run it from this directory (its own workspace, so the crate's
//! `cargo test` never builds candle):
//!
//! ```text
//! cargo run --release              # x of 256 MiB out of cache; about 8 minutes
//! cargo run --release -- --quick   # x of 32 MiB out of cache; a smoke test
//! ```
//!
//! `PEERS_QUICK=1` does what `--quick` does.
//!
//! What is timed:
//!
//! - **this crate**: `layer_norm_into` / `rms_norm_into` into a
//!   preallocated output;
//! - **naive ndarray**: `mean_axis`, `var_axis` and broadcasting, which
//!   allocate their result (ndarray runs them on the calling thread);
//! - **row loop**: a two-pass loop over rows, accumulating in the element
//!   type (`f32` sums for `f32`; for `f16` and `bf16` in `f32`, as
//!   candle-nn does), into a preallocated output, split over the threads
//!   with rayon's `par_chunks_mut`, as a user would write it;
//! - **candle-nn**: `candle_nn::ops::layer_norm` / `rms_norm` on a CPU
//!   `Tensor` built beforehand from the same values; only the op is timed
//!   (it allocates its result). Those ops take `f32`, `f16` and `bf16`
//!   only; where they reject `f64`, the `f64` cells time
//!   `ops::layer_norm_slow` / `rms_norm_slow` (tensor ops) instead and are
//!   marked `†`;
//! - **copy**, the unit: `copy_from_slice` of the input into a preallocated
//!   buffer of its size; at several threads the faster of one such copy and
//!   one split in chunks over the threads.
//!
//! Threads: every measurement runs inside `rayon::ThreadPool::install` of a
//! pool of 1 thread or of all the machine's threads. candle-nn's CPU ops
//! split their rows with rayon's `par_chunks` on the *current* pool (its
//! tensor ops too), so `install` confines candle to the same threads as this
//! crate and the row loop; candle's own pool (`Device::with_context`) is not
//! used. The naive ndarray code is single-threaded whatever the pool.
//!
//! Every figure is the best of several timings (`std::time::Instant`), with
//! a time budget per cell: in cache the operation is repeated on `x` of
//! about 256 KiB, out of cache it runs once per timing on `x` of 256 MiB
//! (32 MiB with `--quick`). A ratio is the copy's time over the operation's:
//! 1.00 runs as fast as the copy, 0.50 at half its speed.
//!
//! Accuracy (the same in both modes): on 64 rows of each length, of values
//! `u` and `1e4 + u` (`100 + u` for `f16` and `bf16`, which hold no
//! fraction at `1e4`) with `u` uniform in `[-1, 1)`, each peer's worst
//! distance in ulps from this crate's output, which is within 1 ulp of the
//! exact value for `f32` (a few for `f64`; the correctly rounded value or a
//! neighbour for the half types). Every call uses `eps = 1e-5` rounded to
//! `f32`, since candle-nn takes `eps` as an `f32` (this bench passes it to
//! this crate as an `f32` for the half types too).

use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor, WithDType};
use half::{bf16, f16};
use ndarray::{Array1, Array2, ArrayView2, ArrayViewMut2, Axis};
use ndarray_layernorm::prelude::*;
use num_traits::{Float, FromPrimitive, One, Zero};
use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};

/// The `eps` of every call: `1e-5` rounded to `f32`, so that every peer
/// solves the same problem (candle-nn takes `eps` as an `f32`, also for
/// `f64` tensors).
const EPS: f64 = 1e-5_f32 as f64;
/// Bytes of `x` in cache.
const IN_CACHE: usize = 256 << 10;
/// Row lengths.
const DIMS: [usize; 3] = [64, 768, 4096];
/// Elements per chunk of the split copy.
const COPY_CHUNK: usize = 1 << 14;
/// Rows per length of the accuracy check.
const ACCURACY_ROWS: usize = 64;

/// The settings of one run.
struct Mode {
    /// Bytes of `x` out of cache.
    out_of_cache: usize,
    /// Time budget of one cell in cache.
    budget_in: Duration,
    /// Time budget of one cell out of cache.
    budget_out: Duration,
}

impl Mode {
    fn new(quick: bool) -> Mode {
        if quick {
            Mode {
                out_of_cache: 32 << 20,
                budget_in: Duration::from_millis(60),
                budget_out: Duration::from_millis(200),
            }
        } else {
            Mode {
                out_of_cache: 256 << 20,
                budget_in: Duration::from_millis(150),
                budget_out: Duration::from_millis(600),
            }
        }
    }
}

/// An element type: what this crate, ndarray and candle need of it.
trait Elem: NormScalar + Float + FromPrimitive + WithDType + Default + Send + Sync {
    const NAME: &'static str;
    /// The type a hand-written row loop sums in: the element type itself,
    /// and `f32` for the half types (as candle-nn and PyTorch do).
    type Sum: Float + FromPrimitive + Send + Sync;
    /// The type this bench passes `eps` to this crate in: the element type,
    /// and `f32` for the half types (as candle-nn takes it), so that every
    /// peer gets `1e-5` rounded to `f32`.
    type EpsType: Copy;
    const EPS: Self::EpsType;
    fn to_sum(self) -> Self::Sum;
    fn from_sum(sum: Self::Sum) -> Self;
    /// The float's bits as an integer that orders like the float (`-0.0`
    /// and `0.0` alike), so that the difference of two is their distance
    /// in ulps.
    fn ordered(self) -> i128;
}

impl Elem for f32 {
    const NAME: &'static str = "f32";
    type Sum = f32;
    type EpsType = f32;
    const EPS: f32 = EPS as f32;
    fn to_sum(self) -> f32 {
        self
    }
    fn from_sum(sum: f32) -> f32 {
        sum
    }
    fn ordered(self) -> i128 {
        let bits = self.to_bits() as i32;
        i128::from(if bits < 0 { i32::MIN - bits } else { bits })
    }
}

impl Elem for f64 {
    const NAME: &'static str = "f64";
    type Sum = f64;
    type EpsType = f64;
    const EPS: f64 = EPS;
    fn to_sum(self) -> f64 {
        self
    }
    fn from_sum(sum: f64) -> f64 {
        sum
    }
    fn ordered(self) -> i128 {
        let bits = self.to_bits() as i64;
        i128::from(if bits < 0 { i64::MIN - bits } else { bits })
    }
}

macro_rules! half_elem {
    ($($half:ident),*) => {$(
        impl Elem for $half {
            const NAME: &'static str = stringify!($half);
            type Sum = f32;
            type EpsType = f32;
            const EPS: f32 = EPS as f32;
            fn ordered(self) -> i128 {
                let bits = self.to_bits() as i16;
                i128::from(if bits < 0 { i16::MIN - bits } else { bits })
            }
            fn to_sum(self) -> f32 {
                self.to_f32()
            }
            fn from_sum(sum: f32) -> $half {
                $half::from_f32(sum)
            }
        }
    )*};
}

half_elem!(f16, bf16);

fn of<A: Elem>(v: f64) -> A {
    <A as WithDType>::from_f64(v)
}

/// Distance of two values in ulps: infinite where exactly one is NaN, or
/// exactly one is finite (a peer's sum that overflowed to infinity).
fn ulps<A: Elem>(a: A, b: A) -> f64 {
    if a.is_nan() != b.is_nan() || a.is_finite() != b.is_finite() {
        f64::INFINITY
    } else if a.is_nan() {
        0.0
    } else {
        (a.ordered() - b.ordered()).unsigned_abs() as f64
    }
}

/// SplitMix64: uniform values in `[-1, 1)`.
struct Random(u64);

impl Random {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

fn random_vec<A: Elem>(len: usize, seed: u64, offset: f64) -> Vec<A> {
    let mut random = Random(seed);
    (0..len).map(|_| of(offset + random.next())).collect()
}

/// The parameters of a call: `gamma = 1 + u / 10`, `beta = u / 10`.
fn params<A: Elem>(d: usize) -> (Array1<A>, Array1<A>) {
    let mut random = Random(d as u64);
    let gamma = Array1::from_shape_fn(d, |_| of(1.0 + 0.1 * random.next()));
    let beta = Array1::from_shape_fn(d, |_| of(0.1 * random.next()));
    (gamma, beta)
}

// ---------------------------------------------------------------- the peers

/// The naive ndarray LayerNorm.
fn naive_layer_norm<A: Elem>(
    x: ArrayView2<'_, A>,
    gamma: &Array1<A>,
    beta: &Array1<A>,
    eps: A,
) -> Array2<A> {
    let mean = x.mean_axis(Axis(1)).unwrap().insert_axis(Axis(1));
    let var = x.var_axis(Axis(1), A::zero()).insert_axis(Axis(1));
    (&x - &mean) / var.mapv(|v| (v + eps).sqrt()) * gamma + beta
}

/// The naive ndarray RMSNorm.
fn naive_rms_norm<A: Elem>(x: ArrayView2<'_, A>, gamma: &Array1<A>, eps: A) -> Array2<A> {
    let mean_square = x.mapv(|v| v * v).mean_axis(Axis(1)).unwrap();
    &x / mean_square.mapv(|v| (v + eps).sqrt()).insert_axis(Axis(1)) * gamma
}

/// A hand-written LayerNorm: two passes over each row, sums in
/// [`Elem::Sum`].
fn loop_layer_norm<A: Elem>(x: &[A], y: &mut [A], d: usize, gamma: &[A], beta: &[A]) {
    let n = A::Sum::from_usize(d).unwrap();
    let eps = A::Sum::from_f64(EPS).unwrap();
    y.par_chunks_mut(d).zip(x.par_chunks(d)).for_each(|(y, x)| {
        let mean = x.iter().fold(A::Sum::zero(), |s, &v| s + v.to_sum()) / n;
        let var = x.iter().fold(A::Sum::zero(), |s, &v| {
            let dev = v.to_sum() - mean;
            s + dev * dev
        }) / n;
        let inv_std = A::Sum::one() / (var + eps).sqrt();
        for (((y, &v), &g), &b) in y.iter_mut().zip(x).zip(gamma).zip(beta) {
            *y = A::from_sum((v.to_sum() - mean) * inv_std * g.to_sum() + b.to_sum());
        }
    });
}

/// A hand-written RMSNorm: one pass for the mean square, one for the
/// output, sums in [`Elem::Sum`].
fn loop_rms_norm<A: Elem>(x: &[A], y: &mut [A], d: usize, gamma: &[A]) {
    let n = A::Sum::from_usize(d).unwrap();
    let eps = A::Sum::from_f64(EPS).unwrap();
    y.par_chunks_mut(d).zip(x.par_chunks(d)).for_each(|(y, x)| {
        let mean_square = x
            .iter()
            .fold(A::Sum::zero(), |s, &v| s + v.to_sum() * v.to_sum())
            / n;
        let inv_rms = A::Sum::one() / (mean_square + eps).sqrt();
        for ((y, &v), &g) in y.iter_mut().zip(x).zip(gamma) {
            *y = A::from_sum(v.to_sum() * inv_rms * g.to_sum());
        }
    });
}

/// candle-nn's ops, or their `_slow` tensor forms where the element type
/// is refused.
#[derive(Clone, Copy)]
struct Candle {
    /// `ops::layer_norm` / `ops::rms_norm` take this element type.
    fused: bool,
}

impl Candle {
    /// Whether candle-nn's fused ops accept `A`, tried on one row.
    fn probe<A: Elem>() -> (Candle, Option<String>) {
        let x = Tensor::from_slice(&[of::<A>(1.0), of(2.0)], (1, 2), &Device::Cpu).unwrap();
        let w = Tensor::from_slice(&[of::<A>(1.0), of(1.0)], 2, &Device::Cpu).unwrap();
        let ln = candle_nn::ops::layer_norm(&x, &w, &w, 1e-5);
        let rms = candle_nn::ops::rms_norm(&x, &w, 1e-5);
        match (ln, rms) {
            (Ok(_), Ok(_)) => (Candle { fused: true }, None),
            // The message's first line: candle appends a backtrace when
            // RUST_BACKTRACE is set.
            (Err(e), _) | (_, Err(e)) => {
                let message = e.to_string();
                let first = message
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_string();
                (Candle { fused: false }, Some(first))
            }
        }
    }

    fn mark(self) -> &'static str {
        if self.fused {
            ""
        } else {
            " †"
        }
    }

    fn layer_norm(self, x: &Tensor, gamma: &Tensor, beta: &Tensor) -> Tensor {
        let eps = EPS as f32;
        if self.fused {
            candle_nn::ops::layer_norm(x, gamma, beta, eps).expect("candle layer_norm")
        } else {
            candle_nn::ops::layer_norm_slow(x, gamma, beta, eps).expect("candle layer_norm_slow")
        }
    }

    fn rms_norm(self, x: &Tensor, gamma: &Tensor) -> Tensor {
        let eps = EPS as f32;
        if self.fused {
            candle_nn::ops::rms_norm(x, gamma, eps).expect("candle rms_norm")
        } else {
            candle_nn::ops::rms_norm_slow(x, gamma, eps).expect("candle rms_norm_slow")
        }
    }
}

fn tensor<A: Elem>(values: &[A], rows: usize, d: usize) -> Tensor {
    Tensor::from_slice(values, (rows, d), &Device::Cpu).expect("candle tensor")
}

fn vector_tensor<A: Elem>(values: &Array1<A>) -> Tensor {
    Tensor::from_slice(values.as_slice().unwrap(), values.len(), &Device::Cpu)
        .expect("candle tensor")
}

fn tensor_values<A: Elem>(t: &Tensor) -> Vec<A> {
    t.flatten_all()
        .and_then(|t| t.to_vec1::<A>())
        .expect("candle values")
}

// ------------------------------------------------------------------- timing

/// How a cell is timed.
#[derive(Clone, Copy)]
struct Timing {
    budget: Duration,
    /// Repeat the operation within a timing until it lasts this long (in
    /// cache); `None`: one call per timing (out of cache).
    repeat_to: Option<Duration>,
}

/// Seconds per call of `f`: the best of timings until the budget is spent,
/// at least 3 (2 out of cache). What `f` returns is dropped after the
/// clock stops, except within repeated calls.
fn best<R>(timing: Timing, mut f: impl FnMut() -> R) -> f64 {
    let once = |f: &mut dyn FnMut() -> R| {
        let start = Instant::now();
        let result = f();
        let elapsed = start.elapsed();
        drop(black_box(result));
        elapsed.as_secs_f64()
    };
    let first = once(&mut f);
    let reps = match timing.repeat_to {
        Some(target) => {
            ((target.as_secs_f64() / first.max(1e-9)).ceil() as usize).clamp(1, 100_000)
        }
        None => 1,
    };
    let min_timings = if timing.repeat_to.is_some() { 3 } else { 2 };
    let start = Instant::now();
    let mut best = if reps == 1 { first } else { f64::INFINITY };
    let mut count = usize::from(reps == 1);
    while count < min_timings || start.elapsed() < timing.budget {
        let t = if reps == 1 {
            once(&mut f)
        } else {
            let start = Instant::now();
            for _ in 0..reps {
                black_box(f());
            }
            start.elapsed().as_secs_f64() / reps as f64
        };
        best = best.min(t);
        count += 1;
    }
    best
}

/// Seconds per copy of `x` into `y`: one `copy_from_slice`, and on several
/// threads also one split over them; the faster.
fn copy_time<A: Elem>(pool: &ThreadPool, timing: Timing, x: &[A], y: &mut [A]) -> f64 {
    pool.install(|| {
        let single = best(timing, || y.copy_from_slice(black_box(x)));
        if pool.current_num_threads() == 1 {
            return single;
        }
        let split = best(timing, || {
            y.par_chunks_mut(COPY_CHUNK)
                .zip(x.par_chunks(COPY_CHUNK))
                .for_each(|(y, x)| y.copy_from_slice(x))
        });
        single.min(split)
    })
}

// -------------------------------------------------------------------- table

/// Times of one row of the table: LayerNorm and RMSNorm, each peer.
struct Times {
    copy: f64,
    layer_norm: [f64; 4],
    rms_norm: [f64; 4],
}

/// Everything one table row needs: `rows` rows of length `d`.
struct Case<'a, A: Elem> {
    x: &'a [A],
    y: &'a mut [A],
    d: usize,
    gamma: &'a Array1<A>,
    beta: &'a Array1<A>,
    tensors: &'a (Tensor, Tensor, Tensor),
    candle: Candle,
}

fn measure<A>(pool: &ThreadPool, timing: Timing, case: &mut Case<'_, A>) -> Times
where
    A: Elem + NormEps<A::EpsType>,
{
    let (x, d, candle) = (case.x, case.d, case.candle);
    let (gamma, beta) = (case.gamma, case.beta);
    let (cx, cg, cb) = case.tensors;
    let y = &mut *case.y;
    let rows = x.len() / d;
    let eps: A = of(EPS);
    let view = ArrayView2::from_shape((rows, d), x).unwrap();
    let (g, b) = (gamma.as_slice().unwrap(), beta.as_slice().unwrap());
    let before = copy_time(pool, timing, x, y);
    let layer_norm = pool.install(|| {
        [
            best(timing, || {
                let mut out = ArrayViewMut2::from_shape((rows, d), &mut *y).unwrap();
                view.layer_norm_into(&mut out, gamma, beta, A::EPS)
                    .expect("layer_norm_into");
            }),
            best(timing, || naive_layer_norm(view, gamma, beta, eps)),
            best(timing, || loop_layer_norm(x, y, d, g, b)),
            best(timing, || candle.layer_norm(cx, cg, cb)),
        ]
    });
    let rms_norm = pool.install(|| {
        [
            best(timing, || {
                let mut out = ArrayViewMut2::from_shape((rows, d), &mut *y).unwrap();
                view.rms_norm_into(&mut out, gamma, A::EPS)
                    .expect("rms_norm_into");
            }),
            best(timing, || naive_rms_norm(view, gamma, eps)),
            best(timing, || loop_rms_norm(x, y, d, g)),
            best(timing, || candle.rms_norm(cx, cg)),
        ]
    });
    let after = copy_time(pool, timing, x, y);
    Times {
        copy: before.min(after),
        layer_norm,
        rms_norm,
    }
}

fn size(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", (bytes as f64 / (1 << 20) as f64).round())
    } else {
        format!("{} KiB", (bytes as f64 / 1024.0).round())
    }
}

/// The copy's time over the operation's: two decimals, or three below
/// 0.01 (the half types' peers).
fn ratio(copy: f64, op: f64) -> String {
    let ratio = copy / op;
    if ratio >= 0.01 {
        format!("{ratio:.2}")
    } else if ratio >= 0.001 {
        format!("{ratio:.3}")
    } else {
        "< 0.001".to_string()
    }
}

fn line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// The table's rows for element type `A`.
fn rows_of<A>(mode: &Mode, pools: &[ThreadPool])
where
    A: Elem + NormEps<A::EpsType>,
{
    let (candle, _) = Candle::probe::<A>();
    let elements = mode.out_of_cache / size_of::<A>();
    let x = random_vec::<A>(elements, 1, 0.0);
    // Written once, so that no timing pays its page faults.
    let mut y = vec![A::one(); elements];
    for in_cache in [true, false] {
        for d in DIMS {
            let rows = if in_cache {
                (IN_CACHE / size_of::<A>() / d).max(1)
            } else {
                elements / d
            };
            let x = &x[..rows * d];
            let y = &mut y[..rows * d];
            let (gamma, beta) = params::<A>(d);
            let tensors = (
                tensor(x, rows, d),
                vector_tensor(&gamma),
                vector_tensor(&beta),
            );
            let timing = if in_cache {
                Timing {
                    budget: mode.budget_in,
                    repeat_to: Some(Duration::from_millis(2)),
                }
            } else {
                Timing {
                    budget: mode.budget_out,
                    repeat_to: None,
                }
            };
            let mut case = Case {
                x,
                y,
                d,
                gamma: &gamma,
                beta: &beta,
                tensors: &tensors,
                candle,
            };
            for pool in pools {
                let t = measure(pool, timing, &mut case);
                let cells: Vec<String> = t
                    .layer_norm
                    .iter()
                    .map(|&op| ratio(t.copy, op))
                    .chain(t.rms_norm.iter().map(|&op| ratio(t.copy, op)))
                    .enumerate()
                    .map(|(i, cell)| {
                        if i % 4 == 3 {
                            cell + candle.mark()
                        } else {
                            cell
                        }
                    })
                    .collect();
                line(&format!(
                    "| {} | {} | {} | {} | {} |",
                    A::NAME,
                    d,
                    size(size_of_val(x)),
                    pool.current_num_threads(),
                    cells.join(" | ")
                ));
            }
        }
    }
}

// ----------------------------------------------------------------- accuracy

/// Worst ulps of each peer (naive, loop, candle) against this crate, for
/// LayerNorm and RMSNorm, over rows of every length of [`DIMS`] with values
/// `offset + u`, `u` uniform in `[-1, 1)`.
fn accuracy<A>(offset: f64) -> [[f64; 3]; 2]
where
    A: Elem + NormEps<A::EpsType>,
{
    let (candle, _) = Candle::probe::<A>();
    let mut worst = [[0.0_f64; 3]; 2];
    for d in DIMS {
        let values = random_vec::<A>(ACCURACY_ROWS * d, 7 + d as u64, offset);
        let x = ArrayView2::from_shape((ACCURACY_ROWS, d), &values[..]).unwrap();
        let (gamma, beta) = params::<A>(d);
        let eps: A = of(EPS);
        let tensors = (
            tensor(&values, ACCURACY_ROWS, d),
            vector_tensor(&gamma),
            vector_tensor(&beta),
        );
        let mut y = vec![A::zero(); values.len()];

        let ours = x.layer_norm(&gamma, &beta, A::EPS).expect("layer_norm");
        let ours = ours.as_slice().unwrap();
        loop_layer_norm(
            &values,
            &mut y,
            d,
            gamma.as_slice().unwrap(),
            beta.as_slice().unwrap(),
        );
        let peers = [
            naive_layer_norm(x, &gamma, &beta, eps)
                .iter()
                .copied()
                .collect(),
            y.clone(),
            tensor_values(&candle.layer_norm(&tensors.0, &tensors.1, &tensors.2)),
        ];
        for (w, peer) in worst[0].iter_mut().zip(&peers) {
            *w = peer
                .iter()
                .zip(ours)
                .map(|(&p, &o)| ulps(p, o))
                .fold(*w, f64::max);
        }

        let ours = x.rms_norm(&gamma, A::EPS).expect("rms_norm");
        let ours = ours.as_slice().unwrap();
        loop_rms_norm(&values, &mut y, d, gamma.as_slice().unwrap());
        let peers = [
            naive_rms_norm(x, &gamma, eps).iter().copied().collect(),
            y.clone(),
            tensor_values(&candle.rms_norm(&tensors.0, &tensors.1)),
        ];
        for (w, peer) in worst[1].iter_mut().zip(&peers) {
            *w = peer
                .iter()
                .zip(ours)
                .map(|(&p, &o)| ulps(p, o))
                .fold(*w, f64::max);
        }
    }
    worst
}

fn ulp_cell(u: f64) -> String {
    if u.is_infinite() {
        "non-finite".to_string()
    } else if u < 10_000.0 {
        format!("{u}")
    } else {
        format!("{u:.1e}")
    }
}

/// One table of worst ulps: for each of two types, LayerNorm and RMSNorm
/// on rows `u` and `offset + u`; `marks` follow the candle-nn cells of
/// each type.
fn accuracy_table(
    types: [(&str, &str); 2],
    first: [[[f64; 3]; 2]; 2],
    second: [[[f64; 3]; 2]; 2],
    marks: [&str; 2],
) {
    let mut header = String::from("| peer |");
    for (name, offset) in types {
        for op in ["LN", "RMS"] {
            header += &format!(" {name} {op}, u | {name} {op}, {offset} + u |");
        }
    }
    line(&header);
    line(&format!("|---|{}", "---|".repeat(8)));
    let columns = [first, second];
    for (peer, name) in ["naive ndarray", "row loop", "candle-nn"]
        .iter()
        .enumerate()
    {
        let mut cells = Vec::new();
        for (ty, pair) in columns.iter().enumerate() {
            for op in 0..2 {
                for data in pair {
                    let cell = ulp_cell(data[op][peer]);
                    cells.push(if peer == 2 { cell + marks[ty] } else { cell });
                }
            }
        }
        line(&format!("| {name} | {} |", cells.join(" | ")));
    }
}

// --------------------------------------------------------------------- main

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string())
}

fn instruction_sets() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512vl");
        let avx2 = is_x86_feature_detected!("avx2");
        format!(
            "AVX-512: {}, AVX2: {}",
            if avx512 { "yes" } else { "no" },
            if avx2 { "yes" } else { "no" }
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

fn main() {
    let start = Instant::now();
    let args: Vec<String> = std::env::args().collect();
    let mut quick = std::env::var_os("PEERS_QUICK").is_some_and(|v| !v.is_empty() && v != "0");
    for arg in &args[1..] {
        match arg.as_str() {
            "--quick" => quick = true,
            "-h" | "--help" => {
                println!(
                    "usage: peers [--quick]   (see the doc comment of benches/peers/src/main.rs)"
                );
                return;
            }
            other => {
                eprintln!("peers: unknown argument {other}; usage: peers [--quick]");
                std::process::exit(2);
            }
        }
    }
    let mode = Mode::new(quick);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut counts = vec![1];
    if threads > 1 {
        counts.push(threads);
    }
    let pools: Vec<ThreadPool> = counts
        .iter()
        .map(|&n| {
            ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .expect("thread pool")
        })
        .collect();

    line(&format!(
        "Machine: {} ({threads} threads; {})",
        cpu_name(),
        instruction_sets()
    ));
    let program = std::path::Path::new(&args[0]).file_name().map_or_else(
        || args[0].clone(),
        |name| name.to_string_lossy().into_owned(),
    );
    let command: Vec<&str> = std::iter::once(program.as_str())
        .chain(args[1..].iter().map(String::as_str))
        .collect();
    line(&format!("Command: {}", command.join(" ")));
    line(&format!(
        "x: about {} in cache (repeated), {} out of cache; eps = 1e-5 rounded to f32; best of several timings per cell.",
        size(IN_CACHE),
        size(mode.out_of_cache)
    ));
    line("");
    line("Throughput relative to `copy_from_slice` of the same bytes into a preallocated buffer (copy = 1.00, higher is faster):");
    line("");
    line("| type | d | x | threads | LayerNorm: this crate | naive ndarray | row loop | candle-nn | RMSNorm: this crate | naive ndarray | row loop | candle-nn |");
    line("|---|---|---|---|---|---|---|---|---|---|---|---|");
    rows_of::<f32>(&mode, &pools);
    rows_of::<f64>(&mode, &pools);
    rows_of::<f16>(&mode, &pools);
    rows_of::<bf16>(&mode, &pools);
    line("");
    let (candle, refusal) = Candle::probe::<f64>();
    if !candle.fused {
        line(&format!(
            "† candle-nn's `ops::layer_norm` / `ops::rms_norm` refuse f64 (\"{}\"): these cells time `ops::layer_norm_slow` / `ops::rms_norm_slow`.",
            refusal.unwrap_or_default()
        ));
    }
    line("this crate: `layer_norm_into` / `rms_norm_into`; naive ndarray: `mean_axis`, `var_axis`, broadcasting (one thread); row loop: two passes per row, sums in the element type (`f32` for `f16`, `bf16`), `par_chunks_mut`; candle-nn: the op on a CPU `Tensor` of the same values.");
    line("");
    line(&format!(
        "Worst error in ulps against this crate's output (itself within 1 ulp of the exact value for f32, a few for f64), d = 64, 768, 4096, {ACCURACY_ROWS} rows each, gamma = 1 + u/10, beta = u/10, u uniform in [-1, 1). The largest errors fall on outputs near zero, where an error small next to the row's spread is many ulps of the output; non-finite: the peer returned NaN or an infinity where this crate's output is finite."
    ));
    line("");
    let f64_mark = candle.mark();
    accuracy_table(
        [("f32", "1e4"), ("f64", "1e4")],
        [accuracy::<f32>(0.0), accuracy::<f32>(1e4)],
        [accuracy::<f64>(0.0), accuracy::<f64>(1e4)],
        ["", f64_mark],
    );
    line("");
    line("The half types against this crate's output (itself the correctly rounded value or a neighbour): the same rows with an offset of 100, where `f16` still holds `u` to 5 bits and `bf16` to 2; the naive code computes in the half type, the row loop sums in `f32`.");
    line("");
    accuracy_table(
        [("f16", "100"), ("bf16", "100")],
        [accuracy::<f16>(0.0), accuracy::<f16>(100.0)],
        [accuracy::<bf16>(0.0), accuracy::<bf16>(100.0)],
        [
            Candle::probe::<f16>().0.mark(),
            Candle::probe::<bf16>().0.mark(),
        ],
    );
    line("");
    line(&format!(
        "(run took {:.0} s)",
        start.elapsed().as_secs_f64()
    ));
}
