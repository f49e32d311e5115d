//! The row kernels' arithmetic, written once for every instruction set:
//! each function here is `#[inline(always)]`, so it is compiled anew inside
//! every target-feature trampoline of [`super`].
//!
//! # Numerics
//!
//! Everything is accumulated in `f64`, whatever the element type, so an `f32`
//! row only meets one rounding: the final narrowing of each output.
//!
//! LayerNorm statistics use a corrected two-pass scheme:
//!
//! 1. The compensated sum `S = Σ xᵢ` (TwoSum in every lane, so `S` is kept
//!    as an unevaluated pair good to about 2⁻¹⁰⁶ of `Σ |xᵢ|`), and the mean
//!    split as `S / d = base + shift`: `base` is the rounded quotient and
//!    `shift` the exact remainder `(S - d · base) / d` (Dekker's product
//!    makes `d · base` exact). `shift` is the part of the mean that `base`
//!    misses.
//! 2. Deviations are formed as `(xᵢ - base) - shift`. Subtracting the
//!    correction from the deviation keeps the digits that a rounded
//!    `base + shift` would throw away (rows like `1e12 + noise`), and
//!    outputs near zero keep their relative accuracy.
//! 3. `var = Σ (xᵢ - base)² / d - shift²` with a compensated square sum.
//!    Because `shift` is tiny next to the spread this subtraction does not
//!    cancel; on the rare rows where it would (`shift²` above 2⁻²⁰ of
//!    `Σ (xᵢ - base)² / d`), the variance is recomputed directly as
//!    `Σ ((xᵢ - base) - shift)² / d`.
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

use super::{Affine, Io};
use crate::scalar::NormScalar;

/// Number of independent accumulators of every sum.
pub(super) const LANES: usize = 8;

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

    /// The sum rounded to `f64`.
    #[inline(always)]
    fn total(self) -> f64 {
        let Pair { hi, lo } = self.total_pair();
        hi + lo
    }

    /// Combines the lanes by a fixed halving tree (lane `l` takes lane
    /// `l + w` for `w = LANES/2, LANES/4, …, 1`), keeping the error of each
    /// combination: the sum as `hi + lo`.
    #[inline(always)]
    fn total_pair(self) -> Pair {
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
        let (hi, lo) = two_sum(high[0], low[0]);
        Pair { hi, lo }
    }
}

/// An unevaluated sum `hi + lo` with `|lo|` at most half an ulp of `hi`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Pair {
    pub(super) hi: f64,
    pub(super) lo: f64,
}

impl Pair {
    /// `self / d` as a pair: the high part's remainder is computed exactly
    /// (Dekker's product), so the quotient is good to about 2⁻¹⁰⁴ relative.
    /// Requires `|hi| < 2⁹⁹⁰` so that the splitting cannot overflow.
    #[inline(always)]
    fn divide(self, d: f64) -> Pair {
        let q = self.hi / d;
        let (p, p_err) = two_product(q, d);
        // hi - p is exact: p is within an ulp of hi (Sterbenz).
        let remainder = ((self.hi - p) - p_err) + self.lo;
        Pair {
            hi: q,
            lo: remainder / d,
        }
    }
}

/// Veltkamp's split: `a == hi + lo` with both halves of 26 bits or fewer.
#[inline(always)]
fn split(a: f64) -> (f64, f64) {
    let c = 134_217_729.0 * a; // 2^27 + 1
    let hi = c - (c - a);
    (hi, a - hi)
}

/// Dekker's TwoProduct without FMA: `p + err == a * b` exactly (barring
/// underflow).
#[inline(always)]
fn two_product(a: f64, b: f64) -> (f64, f64) {
    let p = a * b;
    let (a_hi, a_lo) = split(a);
    let (b_hi, b_lo) = split(b);
    let err = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo;
    (p, err)
}

/// Compensated sum, minimum and maximum of a row.
struct Spread {
    sum: Pair,
    min: f64,
    max: f64,
}

impl Spread {
    fn magnitude(&self) -> f64 {
        self.min.abs().max(self.max.abs())
    }
}

#[inline(always)]
fn spread<A: NormScalar, L: Load>(x: &[A], load: L) -> Spread {
    let first = x.first().map_or(0.0, |&v| load.load(v));
    let mut sum = CompensatedSum::new();
    let mut min = [first; LANES];
    let mut max = [first; LANES];
    for_each_lane(x, load, |lane, value| {
        sum.add(lane, value);
        // Written as selects so that they compile to vector min/max.
        min[lane] = if value < min[lane] { value } else { min[lane] };
        max[lane] = if value > max[lane] { value } else { max[lane] };
    });
    Spread {
        sum: sum.total_pair(),
        min: min.iter().fold(first, |a, &b| if b < a { b } else { a }),
        max: max.iter().fold(first, |a, &b| if b > a { b } else { a }),
    }
}

/// Compensated `Σ (xᵢ - base)²`.
#[inline(always)]
fn deviation_square_sum<A: NormScalar, L: Load>(x: &[A], load: L, base: f64) -> f64 {
    let mut squares = CompensatedSum::new();
    for_each_lane(x, load, |lane, value| {
        let dev = value - base;
        squares.add(lane, dev * dev);
    });
    squares.total()
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

#[inline(always)]
fn max_abs<A: NormScalar>(x: &[A]) -> f64 {
    x.iter().fold(0.0, |m: f64, &v| m.max(v.widen().abs()))
}

#[inline(always)]
fn all_finite<A: NormScalar>(x: &[A]) -> bool {
    x.iter().all(|v| v.is_finite())
}

/// Magnitudes from which a row is rescaled even if its sums are finite:
/// the exact remainder of the mean's division splits values into halves,
/// which must not overflow.
const HUGE_MAGNITUDE: f64 = 1e290;

/// The power of two that brings `magnitude` (finite, positive) into
/// `[1/2, 1)`, limited to `2^±1000` so that the factor itself stays normal.
/// Within that limit the squares of the scaled row can neither overflow nor
/// become subnormal.
#[inline(always)]
fn scale_towards_one(magnitude: f64) -> f64 {
    let biased_exponent = ((magnitude.to_bits() >> 52) & 0x7ff) as i32;
    let k = (1022 - biased_exponent).clamp(-1000, 1000);
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// `1 / √(mean_square + eps)` for data that was multiplied by `scale`:
/// `eps` is scaled alike. An all-zero row with `eps = 0` gets 0, so its
/// output is 0 rather than `0 · ∞`.
#[inline(always)]
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
pub(super) enum Centring {
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
#[inline(always)]
pub(super) fn centring<A: NormScalar>(x: &[A], eps: f64) -> Centring {
    let spread_ = spread(x, Unscaled);
    // A finite sum implies finite elements: NaN and ±∞ propagate into it.
    if !spread_.sum.hi.is_finite() && !all_finite(x) {
        return Centring::NotFinite;
    }
    if spread_.min == spread_.max {
        return Centring::Constant;
    }
    if spread_.sum.hi.is_finite() && spread_.magnitude() < HUGE_MAGNITUDE {
        if let Some(centring) = centre(x, Unscaled, spread_.sum, eps, None) {
            return centring;
        }
    }
    let scale = scale_towards_one(spread_.magnitude());
    let scaled_sum = spread(x, Scaled(scale)).sum;
    centre(x, Scaled(scale), scaled_sum, eps, Some(scale)).unwrap_or(Centring::NotFinite)
}

/// Passes 2 and 3 of the scheme in the module docs. `scale` is `None` on the
/// first attempt, which returns `None` when the row needs rescaling.
#[inline(always)]
fn centre<A: NormScalar, L: Load>(
    x: &[A],
    load: L,
    sum: Pair,
    eps: f64,
    scale: Option<f64>,
) -> Option<Centring> {
    let d = x.len() as f64;
    let Pair {
        hi: base,
        lo: shift,
    } = sum.divide(d);
    let squares = deviation_square_sum(x, load, base);
    if scale.is_none() && (!squares.is_finite() || (squares < TINY_SQUARES && eps < EPS_HIDES_TINY))
    {
        return None;
    }
    let mean_square = squares / d;
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
#[inline(always)]
pub(super) fn rms_scaling<A: NormScalar>(x: &[A], eps: f64) -> Option<(f64, f64)> {
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

/// `(mean, rms)` of one row (`x` non-empty).
///
/// The mean is the compensated sum divided by `d` with an exact remainder,
/// so it is within about half an ulp of the true mean; the rms is the root
/// of the compensated square sum. A row holding a NaN or an infinity gets
/// IEEE semantics: the plain `Σ xᵢ / d` and `√(Σ xᵢ² / d)` (NaN, or ±∞ for
/// infinities of one sign).
#[inline(always)]
pub(super) fn row_stats<A: NormScalar>(x: &[A]) -> (f64, f64) {
    let d = x.len() as f64;
    let spread_ = spread(x, Unscaled);
    if !spread_.sum.hi.is_finite() && !all_finite(x) {
        return (spread_.sum.hi / d, (square_sum(x, Unscaled) / d).sqrt());
    }
    if spread_.min == spread_.max {
        return (spread_.min, spread_.min.abs());
    }
    let squares = square_sum(x, Unscaled);
    // Rescale where a sum overflowed, the square sum may hold subnormal
    // squares, or the division's exact remainder could overflow.
    if spread_.sum.hi.is_finite()
        && spread_.magnitude() < HUGE_MAGNITUDE
        && squares.is_finite()
        && squares >= TINY_SQUARES
    {
        let mean = spread_.sum.divide(d);
        return (mean.hi + mean.lo, (squares / d).sqrt());
    }
    let scale = scale_towards_one(spread_.magnitude());
    let mean = spread(x, Scaled(scale)).sum.divide(d);
    let squares = square_sum(x, Scaled(scale));
    ((mean.hi + mean.lo) / scale, (squares / d).sqrt() / scale)
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
#[inline(always)]
pub(super) fn layer_norm_row<A: NormScalar>(mut io: Io<'_, A>, affine: Affine<'_, A>, eps: f64) {
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
#[inline(always)]
pub(super) fn rms_norm_row<A: NormScalar>(mut io: Io<'_, A>, affine: Affine<'_, A>, eps: f64) {
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
