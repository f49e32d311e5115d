//! The row kernels' arithmetic, written once for every instruction set:
//! each function here is `#[inline(always)]` in optimised builds, so it is
//! compiled anew inside every target-feature trampoline of [`super`]. Debug
//! builds leave them as calls: inlining everything without optimisation
//! gives stack frames of megabytes, more than a worker thread's stack.
//!
//! # Numerics
//!
//! Everything is accumulated in `f64`, whatever the element type, so an `f32`
//! row only meets one rounding: the final narrowing of each output.
//!
//! LayerNorm statistics use a corrected two-pass scheme:
//!
//! 1. The compensated sum `S = Σ xᵢ` (TwoSum in every lane, so `S` is kept
//!    as an unevaluated pair good to about `d · 2⁻¹⁰⁶` of `Σ |xᵢ|`, and exact
//!    when the row's nonzero magnitudes lie within about `2⁵³ / d²` of each
//!    other: the error terms are then multiples of the smallest element's
//!    ulp, and their sums too small to round; an `f32` row whose magnitudes
//!    lie within a factor `2²⁸ / d` of each other takes a plain sum, exact
//!    there, with the same bits), and the mean split as
//!    `S / d = base + shift`: `base` is the rounded quotient and `shift` the
//!    remainder `(S - d · base) / d`, its numerator exact (Dekker's product
//!    makes `d · base` exact). `shift` is the part of the mean that `base`
//!    misses. The outputs take the same mean split around the double
//!    nearest it, `nearest + rest` ([`Split`]).
//! 2. Deviations are formed as `(xᵢ - base) - shift` for the sums, and as
//!    `(xᵢ - nearest) - rest` for the outputs. Subtracting the correction
//!    from the deviation keeps the digits that a rounded mean would throw
//!    away (rows like `1e12 + noise`), and, with `nearest`, outputs near
//!    zero keep their relative accuracy.
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
//! Every sum runs over the [`LANES`] lanes of a [`Vector`]: element `i`
//! always goes to lane `i % LANES`, and the lanes are combined by a fixed
//! halving tree. The order is written into the source, so the result bits do
//! not depend on the instruction set, on the memory layout of the input, or
//! on the thread that runs the row. Fused multiply-adds (square sums, the
//! final `n · γ + β`) round once on every path: hardware FMA on AVX2 and
//! AVX-512, `f64::mul_add` on the portable one.

use super::cache::{self, Ahead};
use super::short::{self, SHORT_ROW};
use super::simd::{Arith, Vector, LANES};
use super::{Affine, Io, Params, RowStats};
use crate::scalar::KernelScalar;

/// Below this, a sum of squares may hold subnormal squares and so lose
/// relative accuracy.
pub(super) const TINY_SQUARES: f64 = 1e-270;

/// An `eps` at or above this outweighs any sum of squares below
/// [`TINY_SQUARES`] by more than 2⁵³, so `var + eps` rounds to `eps` however
/// inaccurate `var` is, and no rescaling is needed.
pub(super) const EPS_HIDES_TINY: f64 = 1e-240;

/// Above this ratio `shift² / (Σ eᵢ² / d)` the short variance formula would
/// lose more than 2⁻²⁰ of a unit in the last place; recompute instead.
const SHIFT_TOLERANCE: f64 = 1.0 / (1u64 << 20) as f64;

/// Magnitudes from which a row is rescaled even if its sums are finite:
/// the exact remainder of the mean's division splits values into halves,
/// which must not overflow.
pub(super) const HUGE_MAGNITUDE: f64 = 1e290;

/// Magnitudes below which a LayerNorm row is rescaled whatever `eps`:
/// 2⁻⁹⁰⁰. The mean split is good to about 2⁻¹⁰⁶ of `Σ |xᵢ|`, but where the
/// row nears the subnormal range its parts (the remainder `shift`, the low
/// half of Dekker's product `d · base`) lose digits to underflow, at most
/// 2⁻¹⁰⁷⁴ each. From 2⁻⁹⁶⁸ up that loss is below the split's own error;
/// below this bound the row is worked on times a power of two instead, which
/// is exact. (`f32` rows never come this low.)
pub(super) const TINY_MAGNITUDE: f64 = f64::from_bits((1023 - 900) << 52);

/// Whether a LayerNorm row whose sum has this high part, and whose largest
/// element has this `magnitude` (at least [`TINY_MAGNITUDE`]), must be
/// worked on times [`tiny_mean_scale`] for its mean's sake.
///
/// A sum that is not zero but below `TINY_MAGNITUDE`, which a row can have
/// however large its elements are (`[1e-60, -1e-60, 1.5e-323, 0]`), gives a
/// mean whose split loses digits to underflow: up to a unit of 2⁻¹⁰⁷⁴
/// each, which the outputs near the mean, `(x - mean) · inv_std`, carry
/// times `inv_std` (there 1e60). Scaled so that its magnitude is about
/// 2¹⁰⁰, the row has a mean whose split keeps its digits (the mean is at
/// least 2⁻¹⁰⁷⁴ / d before scaling) and an `inv_std` far below 1, so the
/// outputs keep their relative accuracy, and subnormal ones their two
/// units. A row of magnitude 2¹⁰⁰ or more already has such an `inv_std`,
/// and so does every row where `eps` is 1 or more; there, a scale of up to
/// 2¹⁰⁰⁰ would instead make the scaled `inv_std`, about
/// `1 / (√eps · scale)`, subnormal. Below 1, `√eps · scale` stays under
/// 2¹⁰⁰⁰.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn mean_needs_rescaling(sum: f64, magnitude: f64, eps: f64) -> bool {
    sum != 0.0 && sum.abs() < TINY_MAGNITUDE && magnitude < TINY_MEAN_MAGNITUDE && eps < 1.0
}

/// The magnitude below which a row with a tiny sum is scaled up, and
/// about which it is put ([`mean_needs_rescaling`]): 2¹⁰⁰. Squares of that
/// size cannot overflow a sum of up to 2⁸⁰⁰ of them.
const TINY_MEAN_MAGNITUDE: f64 = f64::from_bits((1023 + 100) << 52);

/// The power of two that brings `magnitude` (at least [`TINY_MAGNITUDE`],
/// below [`TINY_MEAN_MAGNITUDE`]) into `[2¹⁰⁰, 2¹⁰¹)`: at most 2¹⁰⁰⁰, so
/// the factor is a normal number.
fn tiny_mean_scale(magnitude: f64) -> f64 {
    scale_below(magnitude, 101)
}

/// How a chunk is read: as is, or times an exact power of two.
trait Load: Copy {
    fn load<A: KernelScalar, V: Vector>(self, chunk: &[A; LANES]) -> V;
    /// A row's last, partial chunk, the other lanes zero.
    fn load_partial<A: KernelScalar, V: Vector>(self, tail: &[A]) -> V;
}

#[derive(Clone, Copy)]
struct Unscaled;

impl Load for Unscaled {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load<A: KernelScalar, V: Vector>(self, chunk: &[A; LANES]) -> V {
        A::load(chunk)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_partial<A: KernelScalar, V: Vector>(self, tail: &[A]) -> V {
        A::load_partial(tail)
    }
}

#[derive(Clone, Copy)]
struct Scaled(f64);

impl Load for Scaled {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load<A: KernelScalar, V: Vector>(self, chunk: &[A; LANES]) -> V {
        A::load::<V>(chunk) * V::splat(self.0)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_partial<A: KernelScalar, V: Vector>(self, tail: &[A]) -> V {
        A::load_partial::<V>(tail) * V::splat(self.0)
    }
}

/// Accumulator state that can keep only some lanes of an update.
pub(super) trait Blend: Copy {
    /// Lanes below `active` from `self`, the others from `old`.
    fn blend(self, old: Self, active: usize) -> Self;
}

impl<V: Vector> Blend for V {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn blend(self, old: Self, active: usize) -> Self {
        Vector::blend(self, old, active)
    }
}

impl<P: Blend, Q: Blend> Blend for (P, Q) {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn blend(self, old: Self, active: usize) -> Self {
        (self.0.blend(old.0, active), self.1.blend(old.1, active))
    }
}

/// The least lane of every vector folded in, kept in one register
/// ([`Vector::Part`]): for values that hold no NaN, where the sign of a zero
/// does not matter, so that the order in which lanes meet cannot change it.
#[derive(Clone, Copy)]
struct Least<V: Vector>(V::Part);

impl<V: Vector> Least<V> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn new() -> Self {
        Least(V::part_splat(f64::INFINITY))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn take(self, value: V) -> Self {
        Least(value.min_into(self.0))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn value(self) -> f64 {
        V::part_min(self.0)
    }
}

/// The greatest lane, as [`Least`] keeps the least.
#[derive(Clone, Copy)]
struct Most<V: Vector>(V::Part);

impl<V: Vector> Most<V> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn new() -> Self {
        Most(V::part_splat(f64::NEG_INFINITY))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn take(self, value: V) -> Self {
        Most(value.max_into(self.0))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn value(self) -> f64 {
        V::part_max(self.0)
    }
}

/// Its lanes are no longer those of the row, so a [`Least`] or [`Most`]
/// cannot leave out some: the folds that hold one take a partial chunk in
/// their own [`Fold::step_partial`], padding its unused lanes with a value
/// that cannot change the result (`±∞`), and keep the update whole.
/// Keeping the update is right only when every lane is active; the tests
/// (debug builds) check that no fold reaches this with a partial chunk.
impl<V: Vector> Blend for Least<V> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn blend(self, _old: Self, active: usize) -> Self {
        debug_assert!(
            active >= LANES,
            "a partial chunk must be padded, not blended"
        );
        self
    }
}

impl<V: Vector> Blend for Most<V> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn blend(self, _old: Self, active: usize) -> Self {
        debug_assert!(
            active >= LANES,
            "a partial chunk must be padded, not blended"
        );
        self
    }
}

/// One step of a fold over a row. Written as a struct with an
/// `#[inline(always)]` method rather than as a closure: a closure is compiled
/// on its own, without the trampoline's target features, and the vector
/// instructions inside it would then be calls.
pub(super) trait Fold<V>: Copy {
    type State: Blend;
    fn step(self, state: Self::State, value: V) -> Self::State;
    /// The step of a row's last, partial chunk, `value` padded with zeros:
    /// only its lanes below `active` may count.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step_partial(self, state: Self::State, value: V, active: usize) -> Self::State {
        self.step(state, value).blend(state, active)
    }
    /// Called after every block of [`BLOCK`] vectors, and after the last.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn flush(self, state: Self::State) -> Self::State {
        state
    }
}

/// Vectors per block of a [`BlockedSum`].
pub(super) const BLOCK: usize = 8;

/// Folds over the row one vector at a time: element `i` goes to lane
/// `i % LANES`. The last, partial chunk is padded with zeros, and only its
/// real lanes keep the update. It belongs to the last block of whole
/// chunks when that block is not full (so no block holds more than
/// [`BLOCK`] vectors), and is a block of its own otherwise: a row of 100
/// elements is one block, one flush.
#[cfg_attr(not(debug_assertions), inline(always))]
fn fold_row<A: KernelScalar, V: Vector, L: Load, F: Fold<V>>(
    x: &[A],
    load: L,
    init: F::State,
    fold: F,
) -> F::State {
    let (chunks, tail) = x.as_chunks::<LANES>();
    let mut state = init;
    for block in chunks.chunks(BLOCK) {
        for chunk in block {
            state = fold.step(state, load.load(chunk));
        }
        if block.len() < BLOCK && !tail.is_empty() {
            // The last block, not full: the partial chunk joins it.
            return fold.flush(fold.step_partial(state, load.load_partial(tail), tail.len()));
        }
        state = fold.flush(state);
    }
    if !tail.is_empty() {
        // `state` was just flushed, so the lanes past `active` only meet
        // zeros in the flush.
        state = fold.flush(fold.step_partial(state, load.load_partial(tail), tail.len()));
    }
    state
}

/// Runs `$step` once for each width of the lane trees, `LANES / 2` down to
/// 1, with `$width` bound to it. The steps are spelt out rather than looped
/// so that each is compiled with its width known: a loop over the widths
/// is left rolled where its body is large (the compensated tree), and the
/// register moves of [`Vector::lanes_from`], of a length known only at run
/// time, become calls to `memcpy`, around which every vector register is
/// saved to the stack and reloaded.
macro_rules! halving_widths {
    ($width:ident => $step:expr) => {{
        const _: () = assert!(LANES == 16, "the widths below halve 16 lanes");
        let $width: usize = 8;
        $step;
        let $width: usize = 4;
        $step;
        let $width: usize = 2;
        $step;
        let $width: usize = 1;
        $step;
    }};
}

/// The lanes added by a fixed halving tree (lane `l` takes lane `l + w` for
/// `w = LANES/2, LANES/4, …, 1`).
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn lane_sum<V: Vector>(mut v: V) -> f64 {
    halving_widths!(width => v = v + v.lanes_from(width));
    v.first_lane()
}

/// Knuth's TwoSum: `sum + err == a + b` exactly, whatever the magnitudes.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn two_sum<T: Arith>(a: T, b: T) -> (T, T) {
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
struct CompensatedSum<V> {
    high: V,
    low: V,
}

impl<V: Vector> CompensatedSum<V> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn new() -> Self {
        CompensatedSum {
            high: V::splat(0.0),
            low: V::splat(0.0),
        }
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn add(self, value: V) -> Self {
        let (high, err) = two_sum(self.high, value);
        CompensatedSum {
            high,
            low: self.low + err,
        }
    }

    /// Combines the lanes by a fixed halving tree (lane `l` takes lane
    /// `l + w` for `w = LANES/2, LANES/4, …, 1`), keeping the error of each
    /// combination: the sum as `hi + lo`.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn total_pair(self) -> Pair {
        let CompensatedSum { mut high, mut low } = self;
        halving_widths!(width => {
            let (sum, err) = two_sum(high, high.lanes_from(width));
            low = (low + low.lanes_from(width)) + err;
            high = sum;
        });
        let (hi, lo) = two_sum(high.first_lane(), low.first_lane());
        Pair { hi, lo }
    }
}

impl<V: Vector> Blend for CompensatedSum<V> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn blend(self, old: Self, active: usize) -> Self {
        CompensatedSum {
            high: self.high.blend(old.high, active),
            low: self.low.blend(old.low, active),
        }
    }
}

/// Plain sums over blocks of [`BLOCK`] vectors, each block's sum then added
/// to a [`CompensatedSum`]: the error is that of summing `BLOCK` terms per
/// lane, about `BLOCK · 2⁻⁵³` of the sum of magnitudes, whatever the row
/// length, at close to the cost of a plain sum.
#[derive(Clone, Copy)]
pub(super) struct BlockedSum<V> {
    block: V,
    total: CompensatedSum<V>,
    /// Whether a block has been added to `total` yet.
    started: bool,
}

impl<V: Vector> BlockedSum<V> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(super) fn new() -> Self {
        BlockedSum {
            block: V::splat(0.0),
            total: CompensatedSum::new(),
            started: false,
        }
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(super) fn add(self, value: V) -> Self {
        BlockedSum {
            block: self.block + value,
            ..self
        }
    }

    /// [`BlockedSum::add`] of `value²`, the square and the addition
    /// rounded once (a fused multiply-add).
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(super) fn add_square(self, value: V) -> Self {
        BlockedSum {
            block: value.mul_add(value, self.block),
            ..self
        }
    }

    /// Adds the block to the total. The first block only starts it:
    /// TwoSum of `0` and `b` is `(0 + b, b - b)` (`+0` for a finite `b`, NaN
    /// for an infinite or NaN one), and that is what the total becomes, the
    /// bits of the full addition at a fraction of its cost. (Backward uses
    /// its sums without testing them, so an infinite term must still leave
    /// a NaN total.)
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(super) fn flush(self) -> Self {
        let total = if self.started {
            self.total.add(self.block)
        } else {
            // TwoSum's error term: `+0` for a finite block, NaN otherwise.
            #[allow(clippy::eq_op)]
            let low = self.block - self.block;
            CompensatedSum {
                high: V::splat(0.0) + self.block,
                low,
            }
        };
        BlockedSum {
            block: V::splat(0.0),
            total,
            started: true,
        }
    }
}

impl<V: Vector> BlockedSum<V> {
    /// The total, with the lanes combined by plain halving trees over the
    /// high and the low parts. For sums of non-negative terms, or wherever a
    /// few more roundings of the sum of magnitudes are affordable: the trees
    /// add at most `⌈log₂ LANES⌉ + 1` of them to the block sums' `BLOCK`.
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(super) fn plain_total(self) -> f64 {
        lane_sum(self.total.high) + lane_sum(self.total.low)
    }
}

impl<V: Vector> Blend for BlockedSum<V> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn blend(self, old: Self, active: usize) -> Self {
        BlockedSum {
            block: self.block.blend(old.block, active),
            total: self.total.blend(old.total, active),
            started: self.started,
        }
    }
}

/// An unevaluated sum `hi + lo`, `|lo|` at most half an ulp of `hi` for a
/// sum and a few ulps for a quotient.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Pair {
    pub(super) hi: f64,
    pub(super) lo: f64,
}

impl Pair {
    /// `self / d` split both ways ([`divide_split`]).
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn divide(self, d: f64) -> Split<f64> {
        divide_split(self.hi, self.lo, d)
    }
}

/// A quotient `(hi + lo) / d` split two ways, per lane ([`divide_split`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Split<T> {
    /// `hi` times the rounded `1 / d`, within two ulps of the quotient.
    pub(super) base: T,
    /// The rest of the quotient beyond `base`, within three roundings.
    pub(super) shift: T,
    /// The double nearest the quotient (at a near-tie possibly its
    /// neighbour across the midpoint).
    pub(super) nearest: T,
    /// The rest of the quotient beyond `nearest`, within three roundings.
    pub(super) rest: T,
}

impl Split<f64> {
    /// One split serving both purposes: `base + shift` for the sums and
    /// the outputs alike.
    pub(super) const fn single(base: f64, shift: f64) -> Self {
        Split {
            base,
            shift,
            nearest: base,
            rest: shift,
        }
    }

    /// The centring of a row with this mean (of the row times `scale`).
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(super) fn centring(self, scale: f64, inv_std: f64) -> Centring {
        Centring::Centred {
            scale,
            mean: self,
            inv_std,
        }
    }
}

/// `(hi + lo) / d` as unevaluated sums `base + shift = nearest + rest`,
/// per lane. Requires `|hi| < 2⁹⁹⁰` so that the splitting cannot overflow.
///
/// `base` is `hi` times the rounded `1 / d`, within two ulps of the quotient
/// (the same bits when `d` is a power of two); no division waits on the
/// row's sum (`1 / d` does not depend on it). Its remainder `hi - base · d`
/// is exact: Dekker's product makes `base · d = p + p_err` exactly,
/// `hi - p` is exact because `p` is within a few ulps of `hi` (Sterbenz),
/// and the remainder, a few ulps of `hi` in size and a multiple of
/// `ulp(base)` (for an integer `d` below 2⁵³), needs only a few bits beyond
/// `log₂ d`. [`split_from_remainder`] takes it from there.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn divide_split<T: Arith>(hi: T, lo: T, d: f64) -> Split<T> {
    let base = hi * T::splat(1.0 / d);
    let (p, p_err) = two_product(base, T::splat(d));
    split_from_remainder(base, (hi - p) - p_err, lo, d)
}

/// The [`Split`] of `(hi + lo) / d` from `base` and the exact
/// `remainder = hi - base · d`.
///
/// Adding `lo` and multiplying by the rounded `1 / d` give `shift`, the
/// rest of the quotient within three roundings of itself. Sums over the row
/// are taken around `base`: it is known as soon as the row's sum is, and a
/// few ulps more or less change none of their accuracy.
///
/// The outputs need more near the mean. Where `base` is an ulp off the
/// double `v` nearest the mean, an element equal to `v` gets
/// `(v - base) - shift`, two nearly equal terms, and their difference can
/// be far below the roundings of `shift` (a few 2⁻⁵³ of an ulp): the middle
/// element of `[0, 1, …, 48]` came out as `4e-31 · inv_std` rather than 0,
/// since `1176 · (1 / 49)` rounds to `24 - 2⁻⁴⁸`. So the outputs take the
/// quotient moved once to `nearest = base + shift` rounded, with `rest`
/// formed the same way from `hi - nearest · d = remainder - (nearest - base) · d`,
/// exact again: `nearest - base` is a few ulps of `base` (Sterbenz), its
/// product with `d` needs a few bits beyond `log₂ d`, and the difference is
/// the remainder of a quotient within a few ulps, as above. An element other
/// than `nearest` then lies at least about `|rest|` from the mean, and one
/// equal to it gets `-rest`: both keep the relative accuracy of `rest`.
/// Where `base` is already nearest, `nearest - base` is `+0` and the two
/// splits have the same bits.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn split_from_remainder<T: Arith>(base: T, remainder: T, lo: T, d: f64) -> Split<T> {
    let reciprocal = T::splat(1.0 / d);
    let shift = (remainder + lo) * reciprocal;
    let nearest = base + shift;
    let moved = (nearest - base) * T::splat(d);
    Split {
        base,
        shift,
        nearest,
        rest: ((remainder - moved) + lo) * reciprocal,
    }
}

/// Veltkamp's split: `a == hi + lo` with both halves of 26 bits or fewer.
#[cfg_attr(not(debug_assertions), inline(always))]
fn split<T: Arith>(a: T) -> (T, T) {
    let c = T::splat(134_217_729.0) * a; // 2^27 + 1
    let hi = c - (c - a);
    (hi, a - hi)
}

/// Dekker's TwoProduct without FMA: `p + err == a * b` exactly (barring
/// underflow).
#[cfg_attr(not(debug_assertions), inline(always))]
fn two_product<T: Arith>(a: T, b: T) -> (T, T) {
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
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn magnitude(&self) -> f64 {
        self.min.abs().max(self.max.abs())
    }
}

#[cfg_attr(not(debug_assertions), inline(always))]
fn spread<A: KernelScalar, V: Vector, L: Load>(x: &[A], load: L) -> Spread {
    let init = (CompensatedSum::<V>::new(), (Least::new(), Most::new()));
    let (sum, (min, max)) = fold_row(x, load, init, SpreadFold);
    Spread {
        sum: sum.total_pair(),
        min: min.value(),
        max: max.value(),
    }
}

/// Compensated `Σ xᵢ` with the minimum and maximum. The extremes are read
/// only for rows whose elements are all finite (a NaN or an infinity makes
/// the sum non-finite, and such a row is checked element by element), and
/// only compared with each other or taken as magnitudes, so that the sign
/// of a zero among them does not matter: they are a [`Least`] and a
/// [`Most`].
#[derive(Clone, Copy)]
struct SpreadFold;

impl<V: Vector> Fold<V> for SpreadFold {
    type State = (CompensatedSum<V>, (Least<V>, Most<V>));
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step(self, (sum, (min, max)): Self::State, v: V) -> Self::State {
        (sum.add(v), (min.take(v), max.take(v)))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step_partial(self, (sum, (min, max)): Self::State, v: V, active: usize) -> Self::State {
        let sum = sum.add(v).blend(sum, active);
        let min = min.take(v.blend(V::splat(f64::INFINITY), active));
        let max = max.take(v.blend(V::splat(f64::NEG_INFINITY), active));
        (sum, (min, max))
    }
}

/// [`spread`] of an `f32` row from a plain sum, where that sum is exact
/// and so has the bits of the compensated one; `None` for `f64` rows and
/// where exactness cannot be shown (a zero, NaN or infinity in the row, or
/// magnitudes too far apart).
///
/// Every element of the row is a multiple of `unit`, the `f32` ulp of its
/// smallest non-zero magnitude (`2⁻¹⁴⁹` below the normal range), and so is
/// every partial sum, in whatever order it is taken. With
/// `d · max |xᵢ| ≤ 2⁵² · unit` every partial sum is at most `2⁵² · unit` in
/// magnitude, so every one is a double and every addition is exact: the
/// lane sums, the lane tree and the plain sum give the exact `Σ xᵢ`, and
/// in the compensated sum every error term is `+0` (the operands of each
/// subtraction in [`two_sum`] are then equal) and every partial sum has the
/// same bits (never `-0`, from a start at `+0`): its pair is
/// `(Σ xᵢ, +0)`. At d = 768, every row whose magnitudes lie within a
/// factor 2¹⁸ of the largest qualifies; the others take the compensated
/// pass.
///
/// Per vector this spends two additions and the two operations of the
/// least magnitude where the compensated sum spends six additions, on the
/// adder that bounds the `f32` backward pass computing its statistics
/// (PERFORMANCE.md, "Plain sums where they are exact").
#[cfg_attr(not(debug_assertions), inline(always))]
fn exact_spread_of_single_precision<A: KernelScalar, V: Vector>(x: &[A]) -> Option<Spread> {
    if size_of::<A>() != size_of::<f32>() {
        return None;
    }
    let init = (V::splat(0.0), ((Least::new(), Most::new()), Least::new()));
    let (sum, ((min, max), least_magnitude)) = fold_row(x, Unscaled, init, ExactSpreadFold);
    let sum = lane_sum(sum);
    let least_magnitude = least_magnitude.value();
    let (min, max) = (min.value(), max.value());
    // NaN fails both comparisons; an infinity gives a non-finite sum.
    if !(sum.is_finite() && least_magnitude > 0.0) {
        return None;
    }
    let unit = single_precision_ulp(least_magnitude);
    let magnitude = min.abs().max(max.abs());
    // `d · magnitude` is off by at most a factor `1 ± 2⁻⁵³`, which the bound
    // `2⁵²` rather than `2⁵³` leaves room for.
    let bound = 4_503_599_627_370_496.0 * unit; // 2^52, times a power of two
    (x.len() as f64 * magnitude <= bound).then_some(Spread {
        sum: Pair { hi: sum, lo: 0.0 },
        min,
        max,
    })
}

/// The `f32` ulp of a positive `f32` magnitude held in a double: `2^(e - 23)`
/// for `2^e ≤ magnitude < 2^(e + 1)`, at least `2⁻¹⁴⁹`.
#[cfg_attr(not(debug_assertions), inline(always))]
fn single_precision_ulp(magnitude: f64) -> f64 {
    // `scale_below(magnitude, 1)` is `2⁻ᵉ` (`e` lies far inside its limit
    // of ±1000): the quotient of two powers of two is exact.
    let smallest = f64::from(f32::from_bits(1));
    (f64::from(f32::EPSILON) / scale_below(magnitude, 1)).max(smallest)
}

/// Plain `Σ xᵢ` with the minimum, the maximum and the least magnitude
/// (all three [`Least`] or [`Most`], see [`SpreadFold`]).
#[derive(Clone, Copy)]
struct ExactSpreadFold;

impl<V: Vector> Fold<V> for ExactSpreadFold {
    type State = (V, ((Least<V>, Most<V>), Least<V>));
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step(self, (sum, ((min, max), least)): Self::State, v: V) -> Self::State {
        (sum + v, ((min.take(v), max.take(v)), least.take(v.abs())))
    }
    /// The padding zeros leave the sum as it is (it is never `-0`, see
    /// [`exact_spread_of_single_precision`]) and must not reach the
    /// extremes.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step_partial(self, state: Self::State, v: V, active: usize) -> Self::State {
        let (sum, ((min, max), least)) = state;
        let above = v.blend(V::splat(f64::INFINITY), active);
        let below = v.blend(V::splat(f64::NEG_INFINITY), active);
        (
            sum + v,
            ((min.take(above), max.take(below)), least.take(above.abs())),
        )
    }
}

/// Plain `Σ xᵢ`.
#[derive(Clone, Copy)]
struct PlainSum;

impl<V: Vector> Fold<V> for PlainSum {
    type State = V;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step(self, sum: Self::State, v: V) -> Self::State {
        sum + v
    }
}

/// With `eᵢ = xᵢ - base`: blocked `Σ eᵢ`, plain `Σ eᵢ²`, and the smallest
/// `eᵢ²`, the squared distance from `base` of the element closest to it.
/// Measuring from `base` rather than from the estimated mean spares the
/// subtraction and the register of the estimate's correction: AVX2 has 16
/// vector registers, and 16 lanes of the two sums with the closest and
/// `base` take ten of them.
#[derive(Clone, Copy)]
struct Deviations<V> {
    base: V,
}

impl<V: Vector> Fold<V> for Deviations<V> {
    /// The squares are never NaN (the row's sum was finite) nor `-0`, so
    /// the closest is a [`Least`].
    type State = ((BlockedSum<V>, V), Least<V>);
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step(self, ((sum, squares), closest): Self::State, v: V) -> Self::State {
        let dev = v - self.base;
        let square = dev * dev;
        ((sum.add(dev), squares + square), closest.take(square))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step_partial(
        self,
        ((sum, squares), closest): Self::State,
        v: V,
        active: usize,
    ) -> Self::State {
        let dev = v - self.base;
        let square = dev * dev;
        let sums = (sum.add(dev), squares + square).blend((sum, squares), active);
        let square = square.blend(V::splat(f64::INFINITY), active);
        (sums, closest.take(square))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn flush(self, ((sum, squares), closest): Self::State) -> Self::State {
        ((sum.flush(), squares), closest)
    }
}

/// The smallest `((xᵢ - base) - shift)²`: the squared distance of the
/// element closest to the mean `base + shift`, as the outputs subtract it.
#[derive(Clone, Copy)]
struct Closest<V> {
    base: V,
    shift: V,
}

impl<V: Vector> Fold<V> for Closest<V> {
    /// As in [`Deviations`], a [`Least`].
    type State = Least<V>;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step(self, closest: Self::State, v: V) -> Self::State {
        let off = (v - self.base) - self.shift;
        closest.take(off * off)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step_partial(self, closest: Self::State, v: V, active: usize) -> Self::State {
        let off = (v - self.base) - self.shift;
        closest.take((off * off).blend(V::splat(f64::INFINITY), active))
    }
}

/// Blocked `Σ ((xᵢ - base) - shift)²`, the subtraction of `shift` skipped
/// when it is zero (subtracting zero is exact, so the bits agree).
#[derive(Clone, Copy)]
struct CentredSquares<V> {
    base: V,
    shift: Option<V>,
}

impl<V: Vector> Fold<V> for CentredSquares<V> {
    type State = BlockedSum<V>;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step(self, squares: Self::State, v: V) -> Self::State {
        let dev = match self.shift {
            Some(shift) => (v - self.base) - shift,
            None => v - self.base,
        };
        squares.add_square(dev)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn flush(self, squares: Self::State) -> Self::State {
        squares.flush()
    }
}

/// `Σ ((xᵢ - base) - shift)²` of an unscaled row, as [`exact_centring`]
/// sums it when the short variance formula would cancel.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn centred_square_sum<A: KernelScalar, V: Vector>(
    x: &[A],
    base: f64,
    shift: f64,
) -> f64 {
    centred_square_sum_with::<A, V, _>(x, Unscaled, base, shift)
}

#[cfg_attr(not(debug_assertions), inline(always))]
fn centred_square_sum_with<A: KernelScalar, V: Vector, L: Load>(
    x: &[A],
    load: L,
    base: f64,
    shift: f64,
) -> f64 {
    let fold = CentredSquares {
        base: V::splat(base),
        shift: (shift != 0.0).then(|| V::splat(shift)),
    };
    fold_row(x, load, BlockedSum::new(), fold).plain_total()
}

/// Blocked `Σ xᵢ²`.
#[derive(Clone, Copy)]
struct Squares;

impl<V: Vector> Fold<V> for Squares {
    type State = BlockedSum<V>;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step(self, squares: Self::State, v: V) -> Self::State {
        squares.add_square(v)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn flush(self, squares: Self::State) -> Self::State {
        squares.flush()
    }
}

#[cfg_attr(not(debug_assertions), inline(always))]
fn square_sum<A: KernelScalar, V: Vector, L: Load>(x: &[A], load: L) -> f64 {
    fold_row(x, load, BlockedSum::<V>::new(), Squares).plain_total()
}

/// Everything `stats` needs in one pass: compensated `Σ xᵢ`, blocked
/// `Σ xᵢ²`, minimum and maximum.
#[derive(Clone, Copy)]
struct StatsFold;

impl<V: Vector> Fold<V> for StatsFold {
    /// The extremes as in [`SpreadFold`]: read where no element is a NaN,
    /// compared or taken as magnitudes.
    type State = ((CompensatedSum<V>, BlockedSum<V>), (Least<V>, Most<V>));
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step(self, ((sum, squares), (min, max)): Self::State, v: V) -> Self::State {
        (
            (sum.add(v), squares.add_square(v)),
            (min.take(v), max.take(v)),
        )
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step_partial(
        self,
        ((sum, squares), (min, max)): Self::State,
        v: V,
        active: usize,
    ) -> Self::State {
        let sums = (sum.add(v), squares.add_square(v)).blend((sum, squares), active);
        let min = min.take(v.blend(V::splat(f64::INFINITY), active));
        let max = max.take(v.blend(V::splat(f64::NEG_INFINITY), active));
        (sums, (min, max))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn flush(self, ((sum, squares), extremes): Self::State) -> Self::State {
        ((sum, squares.flush()), extremes)
    }
}

fn max_abs<A: KernelScalar>(x: &[A]) -> f64 {
    x.iter().fold(0.0, |m: f64, &v| m.max(v.widen().abs()))
}

fn all_finite<A: KernelScalar>(x: &[A]) -> bool {
    x.iter().all(|v| v.is_finite())
}

/// The power of two that brings `magnitude` (finite, positive) into
/// `[1/2, 1)`, limited to `2^±1000` so that the factor itself stays normal.
/// Within that limit the squares of the scaled row can neither overflow nor
/// become subnormal.
fn scale_towards_one(magnitude: f64) -> f64 {
    scale_below(magnitude, 0)
}

/// The power of two that brings `magnitude` (finite, positive) into
/// `[2^(exponent - 1), 2^exponent)`, limited to `2^±1000`.
#[cfg_attr(not(debug_assertions), inline(always))]
fn scale_below(magnitude: f64, exponent: i32) -> f64 {
    let biased_exponent = ((magnitude.to_bits() >> 52) & 0x7ff) as i32;
    let k = (1022 + exponent - biased_exponent).clamp(-1000, 1000);
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// `1 / √(mean_square + eps)` for data that was multiplied by `scale`:
/// `eps` is scaled alike. An all-zero row with `eps = 0` gets 0, so its
/// output is 0 rather than `0 · ∞`.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn inverse_root(mean_square: f64, eps: f64, scale: f64) -> f64 {
    let scaled_eps = eps * scale * scale;
    if scaled_eps.is_finite() {
        let denominator = mean_square + scaled_eps;
        if denominator == 0.0 {
            0.0
        } else if denominator.is_infinite() {
            // Two finite terms whose sum overflows (`eps` near `f64::MAX`):
            // quartered, both exactly, the sum fits.
            0.5 / (mean_square * 0.25 + scaled_eps * 0.25).sqrt()
        } else {
            1.0 / denominator.sqrt()
        }
    } else {
        // eps * scale² overflowed, so eps dwarfs the scaled mean square
        // (at most 4 · 2²⁰², for a row scaled to below 2¹⁰¹): the root is
        // √eps · scale.
        1.0 / eps.sqrt() / scale
    }
}

/// What the output pass of LayerNorm needs for one row.
#[derive(Clone, Copy)]
pub(super) enum Centring {
    /// `nᵢ = ((xᵢ · scale - nearest) - rest) · inv_std` with the `mean` of
    /// the scaled row, the sums over the row taken around its `base`
    /// ([`Split`]; the certified `f32` path has one split, its own, for
    /// both).
    Centred {
        scale: f64,
        mean: Split<f64>,
        inv_std: f64,
    },
    /// Every element equal (and finite): `nᵢ = 0` exactly.
    Constant,
    /// The row holds a NaN or an infinity.
    NotFinite,
}

/// LayerNorm statistics of one row (`x` non-empty).
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn centring<A: KernelScalar, V: Vector>(x: &[A], eps: f64) -> Centring {
    if x.len() <= SHORT_ROW {
        if let Some(centring) = short::centring(x, eps) {
            return centring;
        }
    }
    if size_of::<A>() == size_of::<f32>() {
        if let Some(centring) = single_precision_centring::<A, V>(x, eps) {
            return centring;
        }
    }
    exact_centring::<A, V>(x, eps)
}

/// Unit roundoff of `f64`, 2⁻⁵³.
const UNIT_ROUNDOFF: f64 = f64::EPSILON / 2.0;

/// The fast path for `f32` rows, two cheap passes with a certificate.
///
/// Pass 1 is a plain sum; `base` is its mean rounded to `f32`, so that
/// `xᵢ - base` is usually exact. Pass 2 takes the blocked sum
/// of `eᵢ = xᵢ - base`, the plain sum of `eᵢ²`, and the distance from `base`
/// of the element closest to it. The correction
/// `shift = Σ eᵢ / d` is then known to within
/// `δ = (BLOCK + 9) · 2⁻⁵³ · (rms(e) + |shift|)`: `BLOCK` roundings of the
/// block sums, at most 5 of the lane trees, the roundings of `eᵢ`, of `1 / d`
/// and of the product by it, and one to spare, each bounded through
/// `Σ |eᵢ| ≤ d · rms(e)`. An output `((xᵢ - base) - shift) · inv_std`
/// then has a relative error below 2⁻²⁵ (so it rounds to within one `f32`
/// ulp of the true value) whenever `|xᵢ - mean| ≥ 2²⁶ · δ`.
///
/// The closest element certifies that for the whole row: every element
/// lies at least its distance `r` from a point `c`, so at least
/// `r - |shift - c| - δ` from the mean. Measured from `c = base` in pass 2,
/// that settles every row whose elements keep away from the mean by more
/// than `shift`, which is at most half an `f32` ulp of the mean plus the
/// error of pass 1's estimate. Otherwise a third, read-only pass measures
/// from the mean itself (`c = base + shift`); if even that cannot certify
/// the row (an element sits almost exactly on the mean), `None` hands it to
/// the exact path.
///
/// The variance needs no such care: its relative error, about
/// `(d / LANES + 6 + d · shift² / Σ eᵢ²) · 2⁻⁵³` (the square sum is a plain
/// sum of non-negative terms in each lane, then the lane tree), stays far
/// below `f32` precision.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn single_precision_centring<A: KernelScalar, V: Vector>(
    x: &[A],
    eps: f64,
) -> Option<Centring> {
    let d = x.len() as f64;
    let sum = lane_sum(fold_row(x, Unscaled, V::splat(0.0), PlainSum));
    // f32 values cannot overflow an f64 sum: a non-finite sum means a NaN or
    // an infinity in the row.
    if !sum.is_finite() {
        return Some(Centring::NotFinite);
    }
    let base = A::narrow(sum * (1.0 / d)).widen();
    let fold = Deviations {
        base: V::splat(base),
    };
    let init = ((BlockedSum::new(), V::splat(0.0)), Least::new());
    let ((dev_sum, dev_squares), closest) = fold_row(x, Unscaled, init, fold);
    let squares = lane_sum(dev_squares);
    // `xᵢ - base` is a difference of two f32 values, non-zero unless they
    // are equal, and the square of the smallest non-zero one (2⁻¹⁴⁹) is a
    // normal f64: the square sum is zero exactly when every element equals
    // `base`.
    if squares == 0.0 {
        return Some(Centring::Constant);
    }
    let shift = dev_sum.plain_total() * (1.0 / d);
    let mean_square = squares * (1.0 / d);
    let shift_error =
        (BLOCK as f64 + 9.0) * UNIT_ROUNDOFF * (mean_square.sqrt() + shift.abs()) * (1.0 + 1e-6);
    // The distance a closest element must keep from `c`, `|shift - c|` off
    // the mean. The squares of `f32` differences neither overflow nor
    // underflow (they lie in 2⁻²⁹⁸ to 2²⁵⁸). A measured distance is off by
    // the roundings of `xᵢ - base` (inexact only across more than 29
    // binades), of `- shift` (third pass), of the square and of its root:
    // at most a few units of 2⁻⁵³ of `|off| + |shift|`, which `δ` (itself
    // counting `|shift|`) and the factor `1 + 10⁻⁶` cover with the
    // roundings of the bound itself.
    let needed = |off_mean: f64| (off_mean + shift_error * (1.0 + 67_108_864.0)) * (1.0 + 1e-6);
    let certified = |closest: f64, off_mean: f64| {
        let needed = needed(off_mean);
        !(closest.is_nan() || needed.is_nan() || closest < needed)
    };
    if !certified(closest.value().sqrt(), shift.abs()) {
        let fold = Closest {
            base: V::splat(base),
            shift: V::splat(shift),
        };
        let closest = fold_row(x, Unscaled, Least::new(), fold).value().sqrt();
        if !certified(closest, 0.0) {
            return None;
        }
    }
    let var = (mean_square - shift * shift).max(0.0);
    // The certificate covers the outputs of this split itself.
    Some(Split::single(base, shift).centring(1.0, inverse_root(var, eps, 1.0)))
}

/// LayerNorm statistics with the exact mean split of the module docs.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn exact_centring<A: KernelScalar, V: Vector>(x: &[A], eps: f64) -> Centring {
    match centring_first_pass::<A, V>(x, eps) {
        FirstPass::Finished(centring) => centring,
        FirstPass::Deviations { mean, magnitude } => {
            let Split { base, shift, .. } = mean;
            let d = x.len() as f64;
            let squares = centred_square_sum_with::<A, V, _>(x, Unscaled, base, 0.0);
            let var = match variance(squares, d, shift, eps) {
                Variance::Short(var) => var,
                Variance::Centred => {
                    centred_square_sum_with::<A, V, _>(x, Unscaled, base, shift) / d
                }
                Variance::Rescale => return rescaled_centring::<A, V>(x, eps, magnitude),
            };
            mean.centring(1.0, inverse_root(var, eps, 1.0))
        }
    }
}

/// The outcome of pass 1 of the exact centring.
pub(super) enum FirstPass {
    /// The statistics, without further passes over the unscaled row.
    Finished(Centring),
    /// The mean's [`Split`]: the deviations `xᵢ - base` come next.
    Deviations { mean: Split<f64>, magnitude: f64 },
}

/// Pass 1 of [`exact_centring`]: the compensated sum with the extremes, and
/// the cases it settles (a NaN or an infinity, a constant row, a row that
/// must be rescaled because its sum overflowed, its magnitude is outside
/// [`TINY_MAGNITUDE`] to [`HUGE_MAGNITUDE`] or its mean is far below it,
/// [`mean_needs_rescaling`]).
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn centring_first_pass<A: KernelScalar, V: Vector>(x: &[A], eps: f64) -> FirstPass {
    let spread_ = exact_spread_of_single_precision::<A, V>(x)
        .unwrap_or_else(|| spread::<A, V, _>(x, Unscaled));
    // A finite sum implies finite elements: NaN and ±∞ propagate into it.
    if !spread_.sum.hi.is_finite() && !all_finite(x) {
        return FirstPass::Finished(Centring::NotFinite);
    }
    if spread_.min == spread_.max {
        return FirstPass::Finished(Centring::Constant);
    }
    let magnitude = spread_.magnitude();
    if spread_.sum.hi.is_finite() && (TINY_MAGNITUDE..HUGE_MAGNITUDE).contains(&magnitude) {
        if mean_needs_rescaling(spread_.sum.hi, magnitude, eps) {
            let scale = tiny_mean_scale(magnitude);
            return FirstPass::Finished(centring_times::<A, V>(x, eps, scale));
        }
        return FirstPass::Deviations {
            mean: spread_.sum.divide(x.len() as f64),
            magnitude,
        };
    }
    FirstPass::Finished(rescaled_centring::<A, V>(x, eps, magnitude))
}

/// How the variance follows from `Σ (xᵢ - base)²` of an unscaled row.
pub(super) enum Variance {
    /// `Σ (xᵢ - base)² / d - shift²`.
    Short(f64),
    /// The short formula would cancel: the variance is
    /// `Σ ((xᵢ - base) - shift)² / d`, one more pass.
    Centred,
    /// The squares overflow, or underflow while `eps` is too small to hide
    /// it: the row must be rescaled.
    Rescale,
}

/// Pass 2 of [`exact_centring`] after its sum: see [`Variance`].
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn variance(squares: f64, d: f64, shift: f64, eps: f64) -> Variance {
    if !squares.is_finite() || (squares < TINY_SQUARES && eps < EPS_HIDES_TINY) {
        return Variance::Rescale;
    }
    let mean_square = squares * (1.0 / d);
    if shift * shift <= mean_square * SHIFT_TOLERANCE {
        Variance::Short(mean_square - shift * shift)
    } else {
        Variance::Centred
    }
}

/// [`centring`] of a row whose squares overflow or underflow: computed on
/// `x · 2ᵏ`, the power of two that brings its `magnitude` towards 1
/// ([`centring_times`], out of line).
pub(super) fn rescaled_centring<A: KernelScalar, V: Vector>(
    x: &[A],
    eps: f64,
    magnitude: f64,
) -> Centring {
    centring_times::<A, V>(x, eps, scale_towards_one(magnitude))
}

/// [`centring`] computed on `x · scale`, for a power of two `scale` that
/// overflows no element. Rare, so kept out of line.
#[inline(never)]
fn centring_times<A: KernelScalar, V: Vector>(x: &[A], eps: f64, scale: f64) -> Centring {
    let scaled_sum = spread::<A, V, _>(x, Scaled(scale)).sum;
    centre::<A, V, _>(x, Scaled(scale), scaled_sum, eps, Some(scale)).unwrap_or(Centring::NotFinite)
}

/// Passes 2 and 3 of the scheme in the module docs. `scale` is `None` on the
/// first attempt, which returns `None` when the row needs rescaling
/// ([`exact_centring`] spells that attempt out with [`variance`]).
#[cfg_attr(not(debug_assertions), inline(always))]
fn centre<A: KernelScalar, V: Vector, L: Load>(
    x: &[A],
    load: L,
    sum: Pair,
    eps: f64,
    scale: Option<f64>,
) -> Option<Centring> {
    let d = x.len() as f64;
    let mean = sum.divide(d);
    let Split { base, shift, .. } = mean;
    let squares = centred_square_sum_with::<A, V, L>(x, load, base, 0.0);
    if scale.is_none() && (!squares.is_finite() || (squares < TINY_SQUARES && eps < EPS_HIDES_TINY))
    {
        return None;
    }
    let mean_square = squares * (1.0 / d);
    let var = if shift * shift <= mean_square * SHIFT_TOLERANCE {
        mean_square - shift * shift
    } else {
        centred_square_sum_with::<A, V, L>(x, load, base, shift) / d
    };
    let scale = scale.unwrap_or(1.0);
    Some(mean.centring(scale, inverse_root(var, eps, scale)))
}

/// RMSNorm scale of one row (`x` non-empty): `nᵢ = xᵢ · scale · inv_rms`,
/// or `None` if the row holds a NaN or an infinity.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn rms_scaling<A: KernelScalar, V: Vector>(x: &[A], eps: f64) -> Option<(f64, f64)> {
    if x.len() <= SHORT_ROW {
        if let Some(scaling) = short::rms_scaling(x, eps) {
            return Some(scaling);
        }
    }
    let squares = square_sum::<A, V, _>(x, Unscaled);
    rms_from_squares(squares, x.len() as f64, eps).or_else(|| rescaled_rms_scaling::<A, V>(x, eps))
}

/// [`rms_scaling`] from `Σ xᵢ²` of the unscaled row, or `None` if the row
/// must be rescaled (or holds a NaN or an infinity).
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn rms_from_squares(squares: f64, d: f64, eps: f64) -> Option<(f64, f64)> {
    (squares.is_finite() && !(squares < TINY_SQUARES && eps < EPS_HIDES_TINY))
        .then(|| (1.0, inverse_root(squares * (1.0 / d), eps, 1.0)))
}

/// [`rms_scaling`] of a row whose squares overflow or underflow. Rare.
#[inline(never)]
pub(super) fn rescaled_rms_scaling<A: KernelScalar, V: Vector>(
    x: &[A],
    eps: f64,
) -> Option<(f64, f64)> {
    if !all_finite(x) {
        return None;
    }
    let d = x.len() as f64;
    let magnitude = max_abs(x);
    if magnitude == 0.0 {
        return Some((1.0, inverse_root(0.0, eps, 1.0)));
    }
    let scale = scale_towards_one(magnitude);
    let scaled_squares = square_sum::<A, V, _>(x, Scaled(scale));
    Some((scale, inverse_root(scaled_squares * (1.0 / d), eps, scale)))
}

/// [`RowStats`] of one row (`x` non-empty).
///
/// The mean is the compensated sum divided by `d` with an exact remainder,
/// so it is within about half an ulp of the true mean plus about 2⁻¹⁰⁶ of
/// `Σ |xᵢ|` (the compensated sum's own error over `d`), and its rest
/// beyond that double is known to the same accuracy; the rms is the root
/// of the blocked square sum (short rows: see [`short::row_stats`]). A row
/// holding a NaN or an infinity gets IEEE semantics: the sum of its
/// non-finite elements over `d`, and `√(Σ xᵢ² / d)` (NaN, or ±∞ for
/// infinities of one sign).
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn row_stats<A: KernelScalar, V: Vector>(x: &[A]) -> RowStats {
    if x.len() <= SHORT_ROW {
        return short::row_stats(x);
    }
    general_row_stats::<A, V>(x)
}

/// [`row_stats`] of a row of any length.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn general_row_stats<A: KernelScalar, V: Vector>(x: &[A]) -> RowStats {
    let d = x.len() as f64;
    let init = (
        (CompensatedSum::<V>::new(), BlockedSum::new()),
        (Least::new(), Most::new()),
    );
    let ((sum, squares), (min, max)) = fold_row(x, Unscaled, init, StatsFold);
    let (sum, squares) = (sum.total_pair(), squares.plain_total());
    let (min, max) = (min.value(), max.value());
    if !sum.hi.is_finite() && !all_finite(x) {
        // The sum of the infinities alone: compensation would turn ∞ - ∞
        // into NaN, and a plain sum of every element could meet an
        // overflow of finite ones (+∞) before a -∞.
        let sum: f64 = x.iter().map(|v| v.widen()).filter(|v| !v.is_finite()).sum();
        let squares: f64 = x.iter().map(|v| v.widen() * v.widen()).sum();
        return RowStats {
            mean: sum / d,
            mean_rest: 0.0,
            rms: (squares / d).sqrt(),
        };
    }
    if min == max {
        // Every element equal: the mean is that value, and for zeros the
        // sign of their IEEE sum, negative only if every zero is.
        let mean = if min == 0.0 && x.iter().any(|v| v.is_sign_positive()) {
            0.0
        } else {
            min
        };
        return RowStats {
            mean,
            mean_rest: 0.0,
            rms: min.abs(),
        };
    }
    let magnitude = min.abs().max(max.abs());
    // Rescale where a sum overflowed, the square sum may hold subnormal
    // squares, or the division's exact remainder could overflow.
    if sum.hi.is_finite()
        && magnitude < HUGE_MAGNITUDE
        && squares.is_finite()
        && squares >= TINY_SQUARES
    {
        let mean = sum.divide(d);
        return RowStats {
            mean: mean.nearest,
            mean_rest: mean.rest,
            rms: (squares / d).sqrt(),
        };
    }
    rescaled_row_stats::<A, V>(x, magnitude)
}

/// [`row_stats`] of a row whose sums or squares overflow or underflow. Rare.
#[inline(never)]
fn rescaled_row_stats<A: KernelScalar, V: Vector>(x: &[A], magnitude: f64) -> RowStats {
    let d = x.len() as f64;
    let scale = scale_towards_one(magnitude);
    let mean = spread::<A, V, _>(x, Scaled(scale)).sum.divide(d);
    let squares = square_sum::<A, V, _>(x, Scaled(scale));
    // Dividing by a power of two is exact unless the mean is subnormal,
    // where its rest no longer matters to an `f32`.
    RowStats {
        mean: mean.nearest / scale,
        mean_rest: mean.rest / scale,
        rms: (squares / d).sqrt() / scale,
    }
}

/// Normalisation of one vector of inputs (a struct, not a closure, for the
/// reason given at [`Fold`]).
pub(super) trait Normalise<V>: Copy {
    fn apply(self, x: V) -> V;
}

/// `((x - base) - shift) · inv_std`.
#[derive(Clone, Copy)]
pub(super) struct Centre<V> {
    base: V,
    shift: V,
    inv_std: V,
}

impl<V: Arith> Normalise<V> for Centre<V> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn apply(self, x: V) -> V {
        ((x - self.base) - self.shift) * self.inv_std
    }
}

/// `x · inv_rms`.
#[derive(Clone, Copy)]
pub(super) struct Rescale<V> {
    inv_rms: V,
}

impl<V: Arith> Normalise<V> for Rescale<V> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn apply(self, x: V) -> V {
        x * self.inv_rms
    }
}

/// `norm(x · scale)`, for rows computed on `x · 2ᵏ`. Rows with a scale of 1
/// use `norm` alone: multiplying by 1 is exact, so the bits agree.
#[derive(Clone, Copy)]
pub(super) struct ScaledInput<V, N> {
    scale: V,
    norm: N,
}

impl<V: Arith, N: Normalise<V>> Normalise<V> for ScaledInput<V, N> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn apply(self, x: V) -> V {
        self.norm.apply(x * self.scale)
    }
}

/// [`write_row`] one element at a time in `f64`, for the rare rows computed
/// on `x · 2ᵏ`: the same operations in the same order as the chunk loops,
/// so the same bits, without vector loops compiled for such rows.
#[cfg_attr(not(debug_assertions), inline(always))]
fn write_elements<A: KernelScalar, N: Normalise<f64>>(
    io: Io<'_, A>,
    affine: Affine<'_, A>,
    norm: N,
) {
    let output =
        |j: usize, x: A| A::narrow(short::affine_element(norm.apply(x.widen()), affine, j));
    match io {
        Io::Copy { input, output: out } | Io::Stream { input, output: out } => {
            for (j, (y, &x)) in out.iter_mut().zip(input).enumerate() {
                *y = output(j, x);
            }
        }
        Io::InPlace(row) => {
            for (j, y) in row.iter_mut().enumerate() {
                *y = output(j, *y);
            }
        }
    }
}

/// Writes `affine(norm(xᵢ))` for every element of the row, each rounded
/// once to the element type.
///
/// The kind of parameters (in `f64` where the call widened them, see
/// [`Params`]), the kind of input and the kind of store are settled here,
/// once per row, so that each chunk loop below is compiled
/// for one combination and holds no branch but its own.
///
/// Each output depends on its own input and features only, so the chunks
/// may start anywhere: a streamed row ([`Io::Stream`]) writes the elements
/// before its output's first 64-byte boundary with plain stores and the
/// rest in chunks that start on that boundary, which lets their whole lines
/// go past the caches.
#[cfg_attr(not(debug_assertions), inline(always))]
fn write_row<A: KernelScalar, V: Vector, N: Normalise<V>>(
    io: Io<'_, A>,
    params: Params<'_, A>,
    norm: N,
    ahead: Ahead,
) {
    match params.wide {
        Some(Affine::Scale(gamma)) => return write_with(io, Gain::<_, false>(gamma), norm, ahead),
        Some(Affine::ScaleShift(gamma, beta)) => {
            return write_with(io, GainShift(gamma, beta), norm, ahead)
        }
        Some(Affine::Identity | Affine::OnePlus(_)) | None => {}
    }
    match params.affine {
        Affine::Identity => write_with(io, NoParams, norm, ahead),
        Affine::Scale(gamma) => write_with(io, Gain::<_, false>(gamma), norm, ahead),
        Affine::ScaleShift(gamma, beta) => write_with(io, GainShift(gamma, beta), norm, ahead),
        Affine::OnePlus(weights) => write_with(io, Gain::<_, true>(weights), norm, ahead),
    }
}

/// [`write_row`] with the parameters settled.
#[cfg_attr(not(debug_assertions), inline(always))]
fn write_with<A: KernelScalar, V: Vector, N: Normalise<V>, F: Features>(
    io: Io<'_, A>,
    features: F,
    norm: N,
    ahead: Ahead,
) {
    match io {
        Io::Copy { input, output } => {
            write_chunks::<A, V, N, F, Plain>(input, output, features, norm, ahead);
        }
        Io::InPlace(row) => write_chunks_in_place::<A, V, N, F>(row, features, norm, ahead),
        Io::Stream { input, output } => {
            let head = cache::before_first_line(output);
            let (head_input, input) = input.split_at(head);
            let (head_output, output) = output.split_at_mut(head);
            // Fewer than a chunk's elements: written as a row's last chunk is.
            write_tail::<A, V, N, F>(head_input, head_output, 0, features, norm);
            let (_, features) = features.split_at(head);
            write_chunks::<A, V, N, F, Streaming>(input, output, features, norm, ahead);
        }
    }
}

/// The per-feature step after normalising, as chunks of [`LANES`] features.
trait Features: Copy {
    /// The features before `at` and from `at` on (`at` at most the row
    /// length).
    fn split_at(self, at: usize) -> (Self, Self);
    /// `n` at the chunk of features `chunk`.
    fn apply<V: Vector, C: FeatureChunk>(self, n: V, chunk: C) -> V;
}

/// Which chunk of a per-feature vector a [`Features`] step reads, and how.
trait FeatureChunk: Copy {
    fn load<P: KernelScalar, V: Vector>(self, v: &[P]) -> V;
}

/// The whole chunk that starts at feature `.0`.
#[derive(Clone, Copy)]
struct Whole(usize);

impl FeatureChunk for Whole {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load<P: KernelScalar, V: Vector>(self, v: &[P]) -> V {
        P::load(&v[self.0..self.0 + LANES].as_chunks::<LANES>().0[0])
    }
}

/// The `count` features from `start` on (fewer than a chunk), in the first
/// lanes. Read with a whole load where the vector holds a whole chunk from
/// `start` on (the widened parameters are padded with a chunk for this),
/// the other lanes' outputs being dropped.
#[derive(Clone, Copy)]
struct Partial {
    start: usize,
    count: usize,
}

impl FeatureChunk for Partial {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load<P: KernelScalar, V: Vector>(self, v: &[P]) -> V {
        let Partial { start, count } = self;
        match v[start..].as_chunks::<LANES>().0.first() {
            Some(chunk) => P::load(chunk),
            None => P::load_partial(&v[start..start + count]),
        }
    }
}

/// `y = n`.
#[derive(Clone, Copy)]
struct NoParams;

impl Features for NoParams {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn split_at(self, _at: usize) -> (Self, Self) {
        (NoParams, NoParams)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn apply<V: Vector, C: FeatureChunk>(self, n: V, _chunk: C) -> V {
        n
    }
}

/// `y = n · γ`, or with `ONE_PLUS` the zero-centred `y = n · (1 + w)`,
/// `1 + w` formed in `f64`.
#[derive(Clone, Copy)]
struct Gain<'a, P, const ONE_PLUS: bool>(&'a [P]);

impl<P: KernelScalar, const ONE_PLUS: bool> Features for Gain<'_, P, ONE_PLUS> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn split_at(self, at: usize) -> (Self, Self) {
        let (head, rest) = self.0.split_at(at);
        (Gain(head), Gain(rest))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn apply<V: Vector, C: FeatureChunk>(self, n: V, chunk: C) -> V {
        let weight = chunk.load::<P, V>(self.0);
        if ONE_PLUS {
            n * (weight + V::splat(1.0))
        } else {
            n * weight
        }
    }
}

/// `y = n · γ + β`.
#[derive(Clone, Copy)]
struct GainShift<'a, P>(&'a [P], &'a [P]);

impl<P: KernelScalar> Features for GainShift<'_, P> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn split_at(self, at: usize) -> (Self, Self) {
        let (gamma_head, gamma_rest) = self.0.split_at(at);
        let (beta_head, beta_rest) = self.1.split_at(at);
        (
            GainShift(gamma_head, beta_head),
            GainShift(gamma_rest, beta_rest),
        )
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn apply<V: Vector, C: FeatureChunk>(self, n: V, chunk: C) -> V {
        n.mul_add(chunk.load::<P, V>(self.0), chunk.load::<P, V>(self.1))
    }
}

/// How [`write_chunks`] (and backward's pass B) stores a whole chunk.
pub(super) trait Store {
    /// Whether the stores go past the caches, so that asking the cache for
    /// the lines they write would only fetch lines they bypass.
    const PAST_CACHES: bool;
    fn store<A: KernelScalar, V: Vector>(value: V, chunk: &mut [A; LANES]);
}

/// Plain stores.
pub(super) struct Plain;

impl Store for Plain {
    const PAST_CACHES: bool = false;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store<A: KernelScalar, V: Vector>(value: V, chunk: &mut [A; LANES]) {
        A::store(value, chunk)
    }
}

/// Non-temporal stores where the chunk is aligned for them.
pub(super) struct Streaming;

impl Store for Streaming {
    const PAST_CACHES: bool = true;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store<A: KernelScalar, V: Vector>(value: V, chunk: &mut [A; LANES]) {
        A::stream(value, chunk)
    }
}

/// [`write_row`] from `input` into `output` (a row, or part of one:
/// `features` starts at the same feature), whole chunks stored by `S`; the
/// last, partial chunk is loaded padded with zeros and only its real
/// elements are written.
#[cfg_attr(not(debug_assertions), inline(always))]
fn write_chunks<A: KernelScalar, V: Vector, N: Normalise<V>, F: Features, S: Store>(
    input: &[A],
    output: &mut [A],
    features: F,
    norm: N,
    ahead: Ahead,
) {
    let (sources, source_tail) = input.as_chunks::<LANES>();
    let (destinations, destination_tail) = output.as_chunks_mut::<LANES>();
    for (k, (destination, source)) in destinations.iter_mut().zip(sources).enumerate() {
        ahead.ask(source.as_ptr(), destination.as_ptr(), LANES);
        let value = features.apply(norm.apply(A::load::<V>(source)), Whole(k * LANES));
        S::store::<A, V>(value, destination);
    }
    ahead.ask(
        source_tail.as_ptr(),
        destination_tail.as_ptr(),
        source_tail.len(),
    );
    let start = destinations.len() * LANES;
    write_tail::<A, V, N, F>(source_tail, destination_tail, start, features, norm);
}

/// [`write_chunks`] of a row normalised in place, with plain stores.
#[cfg_attr(not(debug_assertions), inline(always))]
fn write_chunks_in_place<A: KernelScalar, V: Vector, N: Normalise<V>, F: Features>(
    row: &mut [A],
    features: F,
    norm: N,
    ahead: Ahead,
) {
    let (chunks, tail) = row.as_chunks_mut::<LANES>();
    for (k, chunk) in chunks.iter_mut().enumerate() {
        ahead.ask(chunk.as_ptr(), chunk.as_ptr(), LANES);
        let value = features.apply(norm.apply(A::load::<V>(chunk)), Whole(k * LANES));
        A::store::<V>(value, chunk);
    }
    if !tail.is_empty() {
        ahead.ask(tail.as_ptr(), tail.as_ptr(), tail.len());
        let start = chunks.len() * LANES;
        let value = tail_value::<A, V, N, F>(tail, start, features, norm);
        A::store_partial(value, tail);
    }
}

/// The last, partial chunk of a row: `source` into `destination` (of the
/// same length, fewer than a chunk, possibly none), which start at feature
/// `start`.
#[cfg_attr(not(debug_assertions), inline(always))]
fn write_tail<A: KernelScalar, V: Vector, N: Normalise<V>, F: Features>(
    source: &[A],
    destination: &mut [A],
    start: usize,
    features: F,
    norm: N,
) {
    if !destination.is_empty() {
        let value = tail_value::<A, V, N, F>(source, start, features, norm);
        A::store_partial(value, destination);
    }
}

/// The outputs of a partial chunk `source` that starts at feature `start`,
/// in its first lanes.
#[cfg_attr(not(debug_assertions), inline(always))]
fn tail_value<A: KernelScalar, V: Vector, N: Normalise<V>, F: Features>(
    source: &[A],
    start: usize,
    features: F,
    norm: N,
) -> V {
    let chunk = Partial {
        start,
        count: source.len(),
    };
    features.apply(norm.apply(A::load_partial::<V>(source)), chunk)
}

/// LayerNorm of `rows` consecutive rows of `io`: short rows sixteen at a
/// time, longer rows one by one.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn layer_norm_rows<A: KernelScalar, V: Vector>(
    io: Io<'_, A>,
    rows: usize,
    params: Params<'_, A>,
    eps: f64,
) {
    short::layer_norm_rows::<A, V>(io, rows, params, eps);
}

/// Writes LayerNorm's output for the row's `centring`, asking for the
/// row `ahead` on the way.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn write_layer_norm<A: KernelScalar, V: Vector>(
    mut io: Io<'_, A>,
    params: Params<'_, A>,
    centring: Centring,
    ahead: Ahead,
) {
    match centring {
        Centring::Centred {
            scale,
            mean: Split { nearest, rest, .. },
            inv_std,
        } => {
            if scale == 1.0 {
                let centre = Centre::<V> {
                    base: V::splat(nearest),
                    shift: V::splat(rest),
                    inv_std: V::splat(inv_std),
                };
                write_row(io, params, centre, ahead);
            } else {
                let norm = Centre {
                    base: nearest,
                    shift: rest,
                    inv_std,
                };
                write_elements(io, params.affine, ScaledInput { scale, norm });
            }
        }
        // The normalised value is exactly 0, so the output is exactly beta
        // (copied, so that even the sign of a zero beta survives).
        Centring::Constant => match params.affine {
            Affine::ScaleShift(_, beta) => io.output().copy_from_slice(beta),
            Affine::Identity | Affine::Scale(_) | Affine::OnePlus(_) => io.output().fill(A::zero()),
        },
        Centring::NotFinite => io.output().fill(A::nan()),
    }
}

/// RMSNorm of `rows` consecutive rows of `io`: short rows sixteen at a
/// time, longer rows one by one.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn rms_norm_rows<A: KernelScalar, V: Vector>(
    io: Io<'_, A>,
    rows: usize,
    params: Params<'_, A>,
    eps: f64,
) {
    short::rms_norm_rows::<A, V>(io, rows, params, eps);
}

/// Writes RMSNorm's output for the row's scaling (`None`: the row holds a
/// NaN or an infinity), asking for the row `ahead` on the way.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn write_rms_norm<A: KernelScalar, V: Vector>(
    mut io: Io<'_, A>,
    params: Params<'_, A>,
    scaling: Option<(f64, f64)>,
    ahead: Ahead,
) {
    match scaling {
        Some((scale, inv_rms)) => {
            if scale == 1.0 {
                let inv_rms = V::splat(inv_rms);
                write_row(io, params, Rescale { inv_rms }, ahead);
            } else {
                let norm = Rescale { inv_rms };
                write_elements(io, params.affine, ScaledInput { scale, norm });
            }
        }
        None => io.output().fill(A::nan()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::simd::Portable;
    use super::*;

    #[test]
    fn two_sum_is_exact() {
        let (s, e) = two_sum(1e16, 1.0);
        assert_eq!(s, 1e16);
        assert_eq!(e, 1.0);
    }

    #[test]
    fn compensated_sum_keeps_what_plain_sum_drops() {
        let mut sum = CompensatedSum::<Portable>::new();
        for v in [1e16, 1.0, -1e16, 1.0] {
            sum = sum.add(Portable::splat(v));
        }
        let Pair { hi, lo } = sum.total_pair();
        assert_eq!((hi, lo), (2.0 * LANES as f64, 0.0));
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

    /// Deterministic rows of `d` values `offset + noise`, noise in ±1.
    fn noisy_rows(d: usize, offset: f32) -> Vec<Vec<f32>> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        (0..50)
            .map(|_| {
                (0..d)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        offset + ((state >> 40) as f32 / (1u32 << 24) as f32 - 0.5)
                    })
                    .collect()
            })
            .collect()
    }

    fn layer_norm_with<F: Fn(&[f32]) -> Centring>(x: &[f32], centring: F) -> Vec<f32> {
        let mut out = vec![0.0; x.len()];
        match centring(x) {
            Centring::Centred {
                mean: Split { nearest, rest, .. },
                inv_std,
                ..
            } => {
                for (y, &v) in out.iter_mut().zip(x) {
                    *y = (((v as f64 - nearest) - rest) * inv_std) as f32;
                }
            }
            _ => panic!("not a centred row"),
        }
        out
    }

    /// Rows of every length class, their magnitudes spread over up to 40
    /// binades, some around a large offset, some cancelling: wherever the
    /// plain sum is certified, the spread has the bits of the compensated
    /// one, and both outcomes occur.
    #[test]
    fn certified_single_precision_spread_has_the_compensated_bits() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let bits = |s: &Spread| [s.sum.hi, s.sum.lo, s.min, s.max].map(f64::to_bits);
        let (mut certified, mut handed_over) = (0, 0);
        for d in [1, 2, 3, 15, 16, 17, 64, 100, 129, 768, 1000, 4096] {
            for binades in [0, 6, 12, 20, 28, 40] {
                for offset in [0.0, 3.0, 1e4] {
                    let row: Vec<f32> = (0..d)
                        .map(|_| {
                            let r = next();
                            let mantissa = 1.0 + (r >> 40) as f32 / (1u32 << 24) as f32;
                            let sign = if r & 1 == 0 { 1.0 } else { -1.0 };
                            let binade = ((r >> 8) % (binades + 1)) as i32;
                            offset + sign * mantissa * 2f32.powi(-binade)
                        })
                        .collect();
                    let compensated = spread::<f32, Portable, _>(&row, Unscaled);
                    match exact_spread_of_single_precision::<f32, Portable>(&row) {
                        Some(exact) => {
                            certified += 1;
                            assert_eq!(bits(&exact), bits(&compensated), "d {d} {row:?}");
                            assert_eq!(exact.sum.lo, 0.0);
                        }
                        None => handed_over += 1,
                    }
                }
            }
        }
        assert!(
            certified > 100 && handed_over > 20,
            "{certified} {handed_over}"
        );
    }

    #[test]
    fn single_precision_spread_hands_over_what_a_plain_sum_would_round() {
        // 1 + 2⁻⁶⁰ is not a double; 2⁻⁶⁰ is far below the ulp of 1.
        let tiny = 2f32.powi(-60);
        assert!(exact_spread_of_single_precision::<f32, Portable>(&[1.0, tiny]).is_none());
        // A zero hides the least magnitude; NaN and infinities are not summed.
        for odd in [0.0, f32::NAN, f32::INFINITY] {
            let row = [1.0, odd, 2.0];
            assert!(exact_spread_of_single_precision::<f32, Portable>(&row).is_none());
        }
        // Sixteen elements spaced by the ulp of the least: exact, and certified.
        let row: Vec<f32> = (0..16).map(|i| 1.0 + i as f32 * f32::EPSILON).collect();
        let exact = exact_spread_of_single_precision::<f32, Portable>(&row).unwrap();
        assert_eq!(exact.sum.hi, 16.0 + 120.0 * f64::from(f32::EPSILON));
    }

    #[test]
    fn single_precision_ulp_is_the_spacing_of_f32_values() {
        for v in [
            1.0f32,
            1.5,
            3.0,
            1e-30,
            1e30,
            f32::MIN_POSITIVE,
            1e-40,
            1e-45,
        ] {
            let spacing = f64::from(f32::from_bits(v.to_bits() + 1)) - f64::from(v);
            assert_eq!(single_precision_ulp(f64::from(v)), spacing, "{v}");
        }
    }

    #[test]
    fn single_precision_fast_path_certifies_ordinary_rows_and_agrees() {
        // At offset 1e4 the elements lie on the `f32` grid of 2⁻¹⁰ there, and
        // many rows hold one equal to `base`, which pass 2 cannot certify:
        // those rows are certified by the third pass, from the mean.
        for d in [7, 64, 768, 4096] {
            for offset in [0.0, 3.0, 1e4] {
                for row in noisy_rows(d, offset) {
                    let fast = single_precision_centring::<f32, Portable>(&row, 1e-5);
                    assert!(fast.is_some(), "d {d} offset {offset}: not certified");
                    let fast = layer_norm_with(&row, |x| {
                        single_precision_centring::<f32, Portable>(x, 1e-5).unwrap()
                    });
                    let exact = layer_norm_with(&row, |x| exact_centring::<f32, Portable>(x, 1e-5));
                    for (a, b) in fast.iter().zip(&exact) {
                        let ulps = (a.to_bits() as i64 - b.to_bits() as i64).abs();
                        assert!(ulps <= 1, "d {d} offset {offset}: {a} vs {b}");
                    }
                }
            }
        }
    }

    #[test]
    fn single_precision_fast_path_hands_over_an_element_on_the_mean() {
        // The middle element is exactly the mean: its output must be 0, which
        // only the exact path guarantees.
        let row = [1.0f32, 2.0, 3.0];
        assert!(single_precision_centring::<f32, Portable>(&row, 0.0).is_none());
        assert_eq!(
            layer_norm_with(&row, |x| centring::<f32, Portable>(x, 0.0))[1],
            0.0
        );
    }

    #[test]
    fn row_stats_of_overflowing_row() {
        let RowStats { mean, rms, .. } = row_stats::<f64, Portable>(&[1.5e308, 1.5e308, 1.0e308]);
        assert!((mean - 1.0e308 * (4.0 / 3.0)).abs() <= 1e293, "{mean}");
        assert!(rms.is_finite() && rms > 1.3e308);
    }

    #[test]
    fn row_stats_of_infinite_row_follows_ieee() {
        let RowStats { mean, rms, .. } = row_stats::<f64, Portable>(&[1.0, f64::INFINITY]);
        assert_eq!((mean, rms), (f64::INFINITY, f64::INFINITY));
        let RowStats { mean, rms, .. } = row_stats::<f32, Portable>(&[f32::NEG_INFINITY, 2.0]);
        assert_eq!((mean, rms), (f64::NEG_INFINITY, f64::INFINITY));
    }
}
