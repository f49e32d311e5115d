//! Row kernels: every floating-point operation of the crate, applied to one
//! contiguous row at a time.
//!
//! # Numerics
//!
//! Everything is accumulated in `f64`, whatever the element type, so an `f32`
//! row only meets one rounding: the final narrowing of each output.
//!
//! LayerNorm statistics use a corrected two-pass scheme:
//!
//! 1. `base = (Σ x) / d` with a plain lane sum. `base` only needs to be close
//!    to the mean; it is never used as the mean itself.
//! 2. `eᵢ = xᵢ - base` and the *compensated* sums `Σ eᵢ` and `Σ eᵢ²`. The
//!    correction `shift = Σ eᵢ / d` is the part of the mean that `base`
//!    misses, accurate to a few units in the last place of `shift` itself.
//!    Outputs are formed as `(xᵢ - base) - shift`: subtracting the correction
//!    from the deviation keeps the digits that forming a rounded
//!    `base + shift` would throw away (rows like `1e12 + noise`).
//! 3. `var = Σ eᵢ² / d - shift²`. Because `shift` is tiny next to the spread
//!    this subtraction does not cancel; on the rare rows where it would
//!    (`shift²` above 2⁻²⁰ of `Σ eᵢ² / d`), the variance is recomputed
//!    directly as `Σ ((xᵢ - base) - shift)² / d`.
//!
//! `mean(x²) - mean²` is never formed. `eps` sits inside the root:
//! `1 / √(var + eps)`.
//!
//! `f64` rows whose squares overflow, or whose squares underflow while `eps`
//! is too small to hide it, are recomputed on `xᵢ · 2ᵏ`, a power of two that
//! brings the largest magnitude near 1. Multiplying by a power of two is
//! exact, so the recomputation loses nothing. `f32` rows never need it:
//! the square of any `f32` is a normal `f64`.
//!
//! # Summation order
//!
//! Every sum runs over [`LANES`] independent lane accumulators: element `i`
//! always goes to lane `i % LANES`, and the lanes are combined by a fixed
//! halving tree. The order is written into the source, so the result bits do
//! not depend on the target features the compiler uses to vectorise it, on
//! the memory layout of the input, or on the thread that runs the row.
//! No fused multiply-add is used anywhere.

use crate::scalar::NormScalar;

pub(crate) mod backward;

/// Number of independent accumulators of every sum.
pub(crate) const LANES: usize = 8;

type Lanes = [f64; LANES];

/// Below this, a sum of squares may hold subnormal squares and so lose
/// relative accuracy.
const TINY_SQUARES: f64 = 1e-270;

/// An `eps` at or above this outweighs any sum of squares below
/// [`TINY_SQUARES`] by more than 2⁵³, so `var + eps` rounds to `eps` however
/// inaccurate `var` is, and no rescaling is needed.
const EPS_HIDES_TINY: f64 = 1e-240;

/// Above this ratio `shift² / (Σ eᵢ² / d)` the short variance formula would
/// lose more than 2⁻²⁰ of a unit in the last place; recompute instead.
const SHIFT_TOLERANCE: f64 = 1.0 / (1u64 << 20) as f64;

/// One row's input and where its output goes.
pub(crate) enum Io<'a, A> {
    /// Read `input`, write `output` (same length).
    Copy { input: &'a [A], output: &'a mut [A] },
    /// Read and overwrite the same row.
    InPlace(&'a mut [A]),
}

impl<A> Io<'_, A> {
    fn input(&self) -> &[A] {
        match self {
            Io::Copy { input, .. } => input,
            Io::InPlace(row) => row,
        }
    }

    fn output(&mut self) -> &mut [A] {
        match self {
            Io::Copy { output, .. } => output,
            Io::InPlace(row) => row,
        }
    }
}

/// The per-feature affine part applied after normalising.
#[derive(Clone, Copy)]
pub(crate) enum Affine<'a, A> {
    /// `y = n`.
    Identity,
    /// `y = n * gamma`.
    Scale(&'a [A]),
    /// `y = n * gamma + beta`.
    ScaleShift(&'a [A], &'a [A]),
}

/// How a value is read: as is, or times an exact power of two.
trait Load: Copy {
    fn load<A: NormScalar>(self, x: A) -> f64;
}

#[derive(Clone, Copy)]
struct Unscaled;

impl Load for Unscaled {
    #[inline(always)]
    fn load<A: NormScalar>(self, x: A) -> f64 {
        x.widen()
    }
}

#[derive(Clone, Copy)]
struct Scaled(f64);

impl Load for Scaled {
    #[inline(always)]
    fn load<A: NormScalar>(self, x: A) -> f64 {
        x.widen() * self.0
    }
}

/// Feeds element `i` of `x` to `step(i % LANES, value)`, in index order per lane.
#[inline(always)]
fn for_each_lane<A: NormScalar, L: Load>(x: &[A], load: L, mut step: impl FnMut(usize, f64)) {
    let mut chunks = x.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &value) in chunk.iter().enumerate() {
            step(lane, load.load(value));
        }
    }
    for (lane, &value) in chunks.remainder().iter().enumerate() {
        step(lane, load.load(value));
    }
}

/// Adds the lanes by a fixed halving tree: lane `l` takes lane `l + w` for
/// `w = LANES/2, LANES/4, …, 1`.
#[inline(always)]
fn halving_sum(mut lanes: Lanes) -> f64 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for lane in 0..width {
            lanes[lane] += lanes[lane + width];
        }
    }
    lanes[0]
}

/// Knuth's TwoSum: `sum + err == a + b` exactly, whatever the magnitudes.
#[inline(always)]
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let sum = a + b;
    let b_part = sum - a;
    let a_part = sum - b_part;
    (sum, (a - a_part) + (b - b_part))
}

/// Lane-wise compensated (Kahan–Babuška–Neumaier via TwoSum) summation.
///
/// The error of each addition is captured exactly and accumulated
/// separately, so the total is accurate to about one rounding of the result
/// plus `d · 2⁻¹⁰⁶ · Σ|terms|`, independent of the order of magnitudes.
#[derive(Clone, Copy)]
struct CompensatedSum {
    high: Lanes,
    low: Lanes,
}

impl CompensatedSum {
    #[inline(always)]
    fn new() -> Self {
        CompensatedSum {
            high: [0.0; LANES],
            low: [0.0; LANES],
        }
    }

    #[inline(always)]
    fn add(&mut self, lane: usize, value: f64) {
        let (sum, err) = two_sum(self.high[lane], value);
        self.high[lane] = sum;
        self.low[lane] += err;
    }

    /// Combines the lanes by the same halving tree as [`halving_sum`],
    /// keeping the error of each combination.
    #[inline(always)]
    fn total(self) -> f64 {
        let CompensatedSum { mut high, mut low } = self;
        let mut width = LANES;
        while width > 1 {
            width /= 2;
            for lane in 0..width {
                let (sum, err) = two_sum(high[lane], high[lane + width]);
                high[lane] = sum;
                low[lane] = (low[lane] + low[lane + width]) + err;
            }
        }
        high[0] + low[0]
    }
}

/// Plain sum, minimum and maximum of a row.
struct Spread {
    sum: f64,
    min: f64,
    max: f64,
}

#[inline(always)]
fn spread<A: NormScalar, L: Load>(x: &[A], load: L) -> Spread {
    let first = x.first().map_or(0.0, |&v| load.load(v));
    let mut sum = [0.0; LANES];
    let mut min = [first; LANES];
    let mut max = [first; LANES];
    for_each_lane(x, load, |lane, value| {
        sum[lane] += value;
        // Written as selects so that they compile to vector min/max.
        min[lane] = if value < min[lane] { value } else { min[lane] };
        max[lane] = if value > max[lane] { value } else { max[lane] };
    });
    Spread {
        sum: halving_sum(sum),
        min: min.iter().fold(first, |a, &b| if b < a { b } else { a }),
        max: max.iter().fold(first, |a, &b| if b > a { b } else { a }),
    }
}

/// Compensated `(Σ (xᵢ - base), Σ (xᵢ - base)²)`.
#[inline(always)]
fn deviation_sums<A: NormScalar, L: Load>(x: &[A], load: L, base: f64) -> (f64, f64) {
    let mut sum = CompensatedSum::new();
    let mut squares = CompensatedSum::new();
    for_each_lane(x, load, |lane, value| {
        let dev = value - base;
        sum.add(lane, dev);
        squares.add(lane, dev * dev);
    });
    (sum.total(), squares.total())
}

/// Compensated `Σ ((xᵢ - base) - shift)²`.
#[inline(always)]
fn centred_square_sum<A: NormScalar, L: Load>(x: &[A], load: L, base: f64, shift: f64) -> f64 {
    let mut squares = CompensatedSum::new();
    for_each_lane(x, load, |lane, value| {
        let dev = (value - base) - shift;
        squares.add(lane, dev * dev);
    });
    squares.total()
}

/// Compensated `Σ xᵢ²`.
#[inline(always)]
fn square_sum<A: NormScalar, L: Load>(x: &[A], load: L) -> f64 {
    let mut squares = CompensatedSum::new();
    for_each_lane(x, load, |lane, value| squares.add(lane, value * value));
    squares.total()
}

fn max_abs<A: NormScalar>(x: &[A]) -> f64 {
    x.iter().fold(0.0, |m: f64, &v| m.max(v.widen().abs()))
}

fn all_finite<A: NormScalar>(x: &[A]) -> bool {
    x.iter().all(|v| v.is_finite())
}

/// The power of two that brings `magnitude` (finite, positive) into
/// `[1/2, 1)`, limited to `2^±1000` so that the factor itself stays normal.
/// Within that limit the squares of the scaled row can neither overflow nor
/// become subnormal.
fn scale_towards_one(magnitude: f64) -> f64 {
    let biased_exponent = ((magnitude.to_bits() >> 52) & 0x7ff) as i32;
    let k = (1022 - biased_exponent).clamp(-1000, 1000);
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// `1 / √(mean_square + eps)` for data that was multiplied by `scale`:
/// `eps` is scaled alike. An all-zero row with `eps = 0` gets 0, so its
/// output is 0 rather than `0 · ∞`.
fn inverse_root(mean_square: f64, eps: f64, scale: f64) -> f64 {
    let scaled_eps = eps * scale * scale;
    if scaled_eps.is_finite() {
        let denominator = mean_square + scaled_eps;
        if denominator == 0.0 {
            0.0
        } else {
            1.0 / denominator.sqrt()
        }
    } else {
        // eps * scale² overflowed, so eps dwarfs the scaled mean square
        // (at most 4 · 2⁰): the root is √eps · scale.
        1.0 / eps.sqrt() / scale
    }
}

/// What the output pass of LayerNorm needs for one row.
pub(crate) enum Centring {
    /// `nᵢ = ((xᵢ · scale - base) - shift) · inv_std`.
    Centred {
        scale: f64,
        base: f64,
        shift: f64,
        inv_std: f64,
    },
    /// Every element equal (and finite): `nᵢ = 0` exactly.
    Constant,
    /// The row holds a NaN or an infinity.
    NotFinite,
}

/// LayerNorm statistics of one row (`x` non-empty).
pub(crate) fn centring<A: NormScalar>(x: &[A], eps: f64) -> Centring {
    let spread_ = spread(x, Unscaled);
    // A finite sum implies finite elements: NaN and ±∞ propagate into it.
    if !spread_.sum.is_finite() && !all_finite(x) {
        return Centring::NotFinite;
    }
    if spread_.min == spread_.max {
        return Centring::Constant;
    }
    if spread_.sum.is_finite() {
        if let Some(centring) = centre(x, Unscaled, spread_.sum, eps, None) {
            return centring;
        }
    }
    let scale = scale_towards_one(spread_.min.abs().max(spread_.max.abs()));
    let scaled_sum = spread(x, Scaled(scale)).sum;
    centre(x, Scaled(scale), scaled_sum, eps, Some(scale)).unwrap_or(Centring::NotFinite)
}

/// Passes 2 and 3 of the scheme in the module docs. `scale` is `None` on the
/// first attempt, which returns `None` when the row needs rescaling.
#[inline(always)]
fn centre<A: NormScalar, L: Load>(
    x: &[A],
    load: L,
    sum: f64,
    eps: f64,
    scale: Option<f64>,
) -> Option<Centring> {
    let d = x.len() as f64;
    let base = sum / d;
    let (dev_sum, dev_squares) = deviation_sums(x, load, base);
    if scale.is_none()
        && (!dev_squares.is_finite() || (dev_squares < TINY_SQUARES && eps < EPS_HIDES_TINY))
    {
        return None;
    }
    let shift = dev_sum / d;
    let mean_square = dev_squares / d;
    let var = if shift * shift <= mean_square * SHIFT_TOLERANCE {
        mean_square - shift * shift
    } else {
        centred_square_sum(x, load, base, shift) / d
    };
    let scale = scale.unwrap_or(1.0);
    Some(Centring::Centred {
        scale,
        base,
        shift,
        inv_std: inverse_root(var, eps, scale),
    })
}

/// RMSNorm scale of one row (`x` non-empty): `nᵢ = xᵢ · scale · inv_rms`,
/// or `None` if the row holds a NaN or an infinity.
pub(crate) fn rms_scaling<A: NormScalar>(x: &[A], eps: f64) -> Option<(f64, f64)> {
    let d = x.len() as f64;
    let squares = square_sum(x, Unscaled);
    if squares.is_finite() && !(squares < TINY_SQUARES && eps < EPS_HIDES_TINY) {
        return Some((1.0, inverse_root(squares / d, eps, 1.0)));
    }
    if !all_finite(x) {
        return None;
    }
    let magnitude = max_abs(x);
    if magnitude == 0.0 {
        return Some((1.0, inverse_root(0.0, eps, 1.0)));
    }
    let scale = scale_towards_one(magnitude);
    let scaled_squares = square_sum(x, Scaled(scale));
    Some((scale, inverse_root(scaled_squares / d, eps, scale)))
}

/// `(mean, rms)` of one row (`x` non-empty), each rounded once from `f64`.
///
/// A row holding a NaN or an infinity gets IEEE semantics: the plain
/// `Σ xᵢ / d` and `√(Σ xᵢ² / d)` (NaN, or ±∞ for infinities of one sign).
pub(crate) fn row_stats<A: NormScalar>(x: &[A]) -> (f64, f64) {
    let d = x.len() as f64;
    let spread_ = spread(x, Unscaled);
    if !spread_.sum.is_finite() && !all_finite(x) {
        return (spread_.sum / d, (square_sum(x, Unscaled) / d).sqrt());
    }
    if spread_.min == spread_.max {
        return (spread_.min, spread_.min.abs());
    }
    let mean = if spread_.sum.is_finite() {
        let base = spread_.sum / d;
        base + deviation_sums(x, Unscaled, base).0 / d
    } else {
        let scale = scale_towards_one(spread_.min.abs().max(spread_.max.abs()));
        let base = spread(x, Scaled(scale)).sum / d;
        (base + deviation_sums(x, Scaled(scale), base).0 / d) / scale
    };
    let squares = square_sum(x, Unscaled);
    let rms = if squares.is_finite() && squares >= TINY_SQUARES {
        (squares / d).sqrt()
    } else {
        let scale = scale_towards_one(max_abs(x));
        (square_sum(x, Scaled(scale)) / d).sqrt() / scale
    };
    (mean, rms)
}

/// Writes `affine(norm(xᵢ))` for every element of the row.
#[inline(always)]
fn write_row<A: NormScalar>(io: Io<'_, A>, affine: Affine<'_, A>, norm: impl Fn(f64) -> f64) {
    match (io, affine) {
        (Io::Copy { input, output }, Affine::Identity) => {
            for (y, &x) in output.iter_mut().zip(input) {
                *y = A::narrow(norm(x.widen()));
            }
        }
        (Io::Copy { input, output }, Affine::Scale(gamma)) => {
            for ((y, &x), &g) in output.iter_mut().zip(input).zip(gamma) {
                *y = A::narrow(norm(x.widen()) * g.widen());
            }
        }
        (Io::Copy { input, output }, Affine::ScaleShift(gamma, beta)) => {
            for (((y, &x), &g), &b) in output.iter_mut().zip(input).zip(gamma).zip(beta) {
                *y = A::narrow(norm(x.widen()) * g.widen() + b.widen());
            }
        }
        (Io::InPlace(row), Affine::Identity) => {
            for y in row.iter_mut() {
                *y = A::narrow(norm(y.widen()));
            }
        }
        (Io::InPlace(row), Affine::Scale(gamma)) => {
            for (y, &g) in row.iter_mut().zip(gamma) {
                *y = A::narrow(norm(y.widen()) * g.widen());
            }
        }
        (Io::InPlace(row), Affine::ScaleShift(gamma, beta)) => {
            for ((y, &g), &b) in row.iter_mut().zip(gamma).zip(beta) {
                *y = A::narrow(norm(y.widen()) * g.widen() + b.widen());
            }
        }
    }
}

/// LayerNorm of one row.
pub(crate) fn layer_norm_row<A: NormScalar>(mut io: Io<'_, A>, affine: Affine<'_, A>, eps: f64) {
    match centring(io.input(), eps) {
        Centring::Centred {
            scale,
            base,
            shift,
            inv_std,
        } => {
            if scale == 1.0 {
                write_row(io, affine, |x| ((x - base) - shift) * inv_std);
            } else {
                write_row(io, affine, |x| ((x * scale - base) - shift) * inv_std);
            }
        }
        // The normalised value is exactly 0, so the output is exactly beta
        // (copied, so that even the sign of a zero beta survives).
        Centring::Constant => match affine {
            Affine::ScaleShift(_, beta) => io.output().copy_from_slice(beta),
            Affine::Identity | Affine::Scale(_) => io.output().fill(A::zero()),
        },
        Centring::NotFinite => io.output().fill(A::nan()),
    }
}

/// RMSNorm of one row.
pub(crate) fn rms_norm_row<A: NormScalar>(mut io: Io<'_, A>, affine: Affine<'_, A>, eps: f64) {
    match rms_scaling(io.input(), eps) {
        Some((scale, inv_rms)) => {
            if scale == 1.0 {
                write_row(io, affine, |x| x * inv_rms);
            } else {
                write_row(io, affine, |x| (x * scale) * inv_rms);
            }
        }
        None => io.output().fill(A::nan()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_sum_is_exact() {
        let (s, e) = two_sum(1e16, 1.0);
        assert_eq!(s, 1e16);
        assert_eq!(e, 1.0);
    }

    #[test]
    fn compensated_sum_keeps_what_plain_sum_drops() {
        let mut sum = CompensatedSum::new();
        for v in [1e16, 1.0, -1e16, 1.0] {
            sum.add(0, v);
        }
        assert_eq!(sum.total(), 2.0);
    }

    const _: () = assert!(EPS_HIDES_TINY / TINY_SQUARES > 1e18); // more than 2⁵³

    #[test]
    fn scale_towards_one_brings_magnitude_into_half_open_unit() {
        for m in [1e-300, 3.0e-10, 0.75, 1.0, 7.0, 1e300] {
            let s = scale_towards_one(m);
            assert!((0.5..1.0).contains(&(m * s)), "{m} * {s}");
        }
        // Clamped at 2^±1000 so that the factor stays a normal number.
        assert_eq!(scale_towards_one(f64::MAX), 2f64.powi(-1000));
        assert_eq!(scale_towards_one(f64::from_bits(1)), 2f64.powi(1000));
    }

    #[test]
    fn row_stats_of_overflowing_row() {
        let (mean, rms) = row_stats(&[1.5e308, 1.5e308, 1.0e308]);
        assert!((mean - 1.0e308 * (4.0 / 3.0)).abs() <= 1e293, "{mean}");
        assert!(rms.is_finite() && rms > 1.3e308);
    }
}
