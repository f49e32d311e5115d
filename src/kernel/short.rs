//! Short rows, of at most [`SHORT_ROW`] elements.
//!
//! A short row fills at most one vector, so the lane-parallel kernels of
//! [`super::portable`] would spend most of their time reducing lanes. Short
//! rows use a simpler algorithm instead, written once over [`Arith`] so that
//! it runs on one row at a time (`T = f64`) or on the same element of 16
//! rows at once (`T` a kernel vector, one row per lane), with the same
//! operations in the same order either way, hence the same bits:
//!
//! 1. the compensated sum `S` of the row, element by element (TwoSum), and
//!    its extremes;
//! 2. the mean split as `S / d = base + shift` with Dekker's exact remainder,
//!    as in the long-row kernel (formed without its products where they
//!    cannot change it: `f32` rows whose length is a power of two);
//!    and its second split `nearest + rest` around the double nearest the
//!    mean ([`Split`]);
//! 3. the sum of `((xᵢ - base) - shift)²` (of `xᵢ²` for RMSNorm) in four
//!    partial sums: its terms are never negative, so it needs no compensation;
//! 4. outputs `((xᵢ - nearest) - rest) · inv_std` (`xᵢ · inv_rms`), times
//!    `γᵢ` plus `βᵢ`, each rounded once to the element type.
//!
//! Rows that need care (a NaN or an infinity, all elements equal, `f64`
//! squares that overflow or underflow, an all-zero row under RMSNorm with
//! `eps = 0`) are recognised from the same statistics and handed to the
//! long-row kernel, which handles them all. Which algorithm a row gets
//! depends only on its length and its values, never on the layout, the
//! instruction set or the thread.
//!
//! Sixteen rows go into the lanes one column per vector
//! ([`KernelScalar::load_columns`]: a gather per column where the instruction
//! set has one), and when the quick test of the statistics passes every row
//! (the usual case) the outputs leave the same way; otherwise each row is
//! written on its own; a block of constant rows is filled whole. Rows this
//! short would otherwise spend most of their time moving single elements
//! between rows and lanes and branching on each row's verdict.
//!
//! With AVX-512, blocks of rows of 2, 4, 8 or 16 elements are transposed in
//! registers instead: `d` plain loads, `d · log₂ d` two-register permutes,
//! and the same back, where the gathers and scatters move one element each.
//! Rows of 3, 5, 6 and 7 elements (not 7 for `f64`, where the permutes gain
//! nothing) take two-register permutes too, one per pair of registers that
//! a column or a row touches, blended.
//!
//! With AVX2, blocks of rows of 2, 4, 8 or 16 elements take the same rounds
//! of shuffles, on each half of 8 rows (`f32`) or quarter of 4 (`f64`); the
//! other lengths gather their columns and store them one element at a time
//! (AVX2 has no scatter), and the block tests compare whole registers
//! (PERFORMANCE.md, "Short rows, 16 at a time").

use std::marker::PhantomData;

use super::cache::{self, Ahead};
use super::islands::Island;
use super::portable::{
    centring as long_centring, divide_split, general_row_stats, mean_needs_rescaling,
    rms_scaling as long_rms_scaling, split_from_remainder, two_sum, write_layer_norm,
    write_rms_norm, Centring, Split, EPS_HIDES_TINY, HUGE_MAGNITUDE, TINY_MAGNITUDE, TINY_SQUARES,
};
use super::simd::{Arith, Vector, LANES};
use super::{Affine, Io, Params, RowStats};
use crate::scalar::KernelScalar;

/// Rows of at most this many elements are short.
pub(super) const SHORT_ROW: usize = LANES;

/// What a row's fit is judged from, one row per lane of `T`.
type Check<T> = [T; 4];

/// `Σ ((xᵢ - base) - shift)²` in four partial sums, element `j` going to
/// sum `j % 4`, combined as `(s₀ + s₁) + (s₂ + s₃)`. (Loops, not iterator
/// adapters with closures: a closure is compiled outside the trampoline's
/// target features.)
///
/// The terms are never negative, so nothing cancels: every path from a term
/// to the total passes at most five additions (three within a partial sum
/// of at most four terms, two in the tree), and the relative error is at
/// most `5 · 2⁻⁵³`, less than that of the long-row kernel's blocked sums.
/// Four independent sums also keep four additions in flight.
#[cfg_attr(not(debug_assertions), inline(always))]
fn square_sum<T: Arith>(columns: &[T], base: T, shift: T) -> T {
    let mut partial = [T::splat(0.0); 4];
    let (quads, rest) = columns.as_chunks::<4>();
    for quad in quads {
        for (sum, &x) in partial.iter_mut().zip(quad) {
            *sum = add_centred_square(*sum, x, base, shift);
        }
    }
    for (sum, &x) in partial.iter_mut().zip(rest) {
        *sum = add_centred_square(*sum, x, base, shift);
    }
    (partial[0] + partial[1]) + (partial[2] + partial[3])
}

/// `((x - base) - shift)²`.
#[cfg_attr(not(debug_assertions), inline(always))]
fn add_centred_square<T: Arith>(sum: T, x: T, base: T, shift: T) -> T {
    let dev = (x - base) - shift;
    dev.mul_add(dev, sum)
}

/// `S / d = base + shift` with the high part of `S` and the extremes
/// (steps 1 and 2).
///
/// With `exact_quotient` ([`quotient_is_exact`]) the split skips Dekker's
/// products, for the same bits: `hi · (1 / d)` is then exact, so the product
/// `base · d` of [`divide_split`] is `hi` itself, its error term is `+0`, and
/// the exact remainder handed to [`split_from_remainder`] is
/// `(hi - hi) - 0 = +0`. (Where `hi` is infinite or NaN, `lo` is NaN, and so
/// is the rest of the quotient either way.)
#[cfg_attr(not(debug_assertions), inline(always))]
fn mean_split<T: Arith>(columns: &[T], exact_quotient: bool) -> (Split<T>, T, T, T) {
    let first = columns.first().copied().unwrap_or(T::splat(0.0));
    let (mut high, mut low, mut min, mut max) = (first, T::splat(0.0), first, first);
    for &x in columns.iter().skip(1) {
        let (sum, err) = two_sum(high, x);
        high = sum;
        low = low + err;
        min = min.min_select(x);
        max = max.max_select(x);
    }
    let (high, low) = two_sum(high, low);
    let d = columns.len() as f64;
    let split = if exact_quotient {
        split_from_remainder(high * T::splat(1.0 / d), T::splat(0.0), low, d)
    } else {
        divide_split(high, low, d)
    };
    (split, high, min, max)
}

/// Whether [`mean_split`] may divide a short row of `d` elements of `A`
/// without Dekker's products: when `d` is a power of two and the elements
/// are `f32`. Their sum is then a multiple of 2⁻¹⁴⁹ below 2¹³³ in magnitude,
/// or not finite, so that multiplying it by `1 / d` neither underflows nor
/// rounds, and splitting the quotient cannot overflow.
///
/// Dekker's products are a large share of the arithmetic of a row this
/// short, and skipping them where they cannot change the split costs no
/// bit (PERFORMANCE.md, "Exact quotients").
fn quotient_is_exact<A>(d: usize) -> bool {
    size_of::<A>() == size_of::<f32>() && d.is_power_of_two()
}

/// `1 / √(squares · (1 / d) + eps)`. The rounded `1 / d` adds one rounding
/// to the mean square (relative 2⁻⁵³, far below what the outputs carry) and
/// saves a division.
#[cfg_attr(not(debug_assertions), inline(always))]
fn inverse_root<T: Arith>(squares: T, d: usize, eps: f64) -> T {
    T::splat(1.0) / (squares * T::splat(1.0 / d as f64) + T::splat(eps)).sqrt()
}

/// One output element: `n · γⱼ + βⱼ`, `n · γⱼ`, `n · (wⱼ + 1)` or `n`.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn affine_element<A: KernelScalar, T: Arith>(
    n: T,
    affine: Affine<'_, A>,
    j: usize,
) -> T {
    let feature = |v: &[A], default: f64| v.get(j).map_or(default, |v| v.widen());
    match affine {
        Affine::Identity => n,
        Affine::Scale(gamma) => n * T::splat(feature(gamma, 1.0)),
        Affine::ScaleShift(gamma, beta) => {
            n.mul_add(T::splat(feature(gamma, 1.0)), T::splat(feature(beta, 0.0)))
        }
        // As the long-row kernel: `w + 1` formed in f64.
        Affine::OnePlus(w) => n * T::splat(feature(w, 0.0) + 1.0),
    }
}

/// What becomes of one row once its statistics are known.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// The computed outputs are final.
    Normalised,
    /// Every element is equal: the output is [`ShortOp::constant_output`],
    /// exactly as the long-row kernel writes it.
    Constant,
    /// The long-row kernel must handle the row.
    General,
}

/// A normalisation of short rows, evaluated on one row (`T = f64`) or on
/// 16 rows at once (`T` a vector). A struct rather than closures, for the
/// reason given at `portable::Fold`.
trait ShortOp<A: KernelScalar>: Copy {
    /// Writes element `j` of every row's output to `outputs[j]` and
    /// returns what [`ShortOp::verdict`] judges.
    fn outputs<T: Arith>(self, columns: &[T], outputs: &mut [T; SHORT_ROW]) -> Check<T>;
    /// What becomes of a row with this check.
    fn verdict(self, check: [f64; 4], d: usize) -> Verdict;
    /// Whether the check of every lane is certainly
    /// [`Verdict::Normalised`]: a quick test of the usual case, which may
    /// answer `false` for rows that [`ShortOp::verdict`] would pass.
    fn all_normalised<V: Vector>(self, check: Check<V>) -> bool;
    /// Whether the check of every lane is certainly [`Verdict::Constant`],
    /// as [`ShortOp::all_normalised`].
    fn all_constant<V: Vector>(self, check: Check<V>) -> bool;
    /// Whether rows of one element, one per lane of `column`, are certainly
    /// [`Verdict::Constant`], known before any statistic is computed.
    fn all_single_constant<V: Vector>(self, column: V) -> bool;
    /// Output element `j` of a constant row.
    fn constant_output(self, j: usize) -> A;
    /// The long-row kernel, for the rows it must handle.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn general<V: Vector>(self, io: Io<'_, A>) {
        let d = io.input().len();
        self.long_rows::<V>(io, d);
    }
    /// [`long_rows`] of this operation, in its [island](LongRows).
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn long_rows<V: Vector>(self, io: Io<'_, A>, d: usize) {
        V::island::<LongRows<A, Self>>((io, d, self));
    }
    /// Whether [`long_rows`] computes each row's statistics before writing
    /// the row before it (for rows of at most [`PIPELINE_MAX_ROW_BYTES`]).
    const PIPELINED: bool;
    /// What the long-row kernel computes of a row before writing it.
    type Stats: Copy;
    /// The long-row kernel's statistics of a row.
    fn stats<V: Vector>(self, x: &[A]) -> Self::Stats;
    /// The long-row kernel's output of a row from its statistics, asking
    /// for the row `ahead` on the way.
    fn write<V: Vector>(self, io: Io<'_, A>, stats: Self::Stats, ahead: Ahead);
    /// Whether the walk over long rows asks for rows ahead.
    fn prefetch(self) -> bool;
}

/// Whether no lane fails the first clause of `LayerNormOp::verdict`: a
/// finite sum, and no magnitude of [`HUGE_MAGNITUDE`] or more.
#[cfg_attr(not(debug_assertions), inline(always))]
fn all_moderate<V: Vector>(sum: V, min: V, max: V) -> bool {
    sum.abs().all_within(0.0, f64::MAX)
        && min
            .abs()
            .max_select(max.abs())
            .all_within(0.0, HUGE_MAGNITUDE.next_down())
}

/// Whether no lane's `sum` is both nonzero and below [`TINY_MAGNITUDE`],
/// for finite `sum`: with `q = min(|sum| · 2⁹⁰⁰, 1)`, exact as
/// `TINY_MAGNITUDE` is 2⁻⁹⁰⁰, `q · (1 - q)` is zero for `sum` zero or at
/// least 2⁻⁹⁰⁰, and otherwise at least 2⁻²²⁷ (`q ≥ 2⁻¹⁷⁴`, `1 - q ≥ 2⁻⁵³`).
/// It passes no row that [`mean_needs_rescaling`] would rescale, and
/// leaves the rows it stops to the verdict of each.
#[cfg_attr(not(debug_assertions), inline(always))]
fn no_tiny_sum<V: Vector>(sum: V) -> bool {
    let q = (sum.abs() * V::splat(1.0 / TINY_MAGNITUDE)).min_select(V::splat(1.0));
    (q * (V::splat(1.0) - q)).all_within(0.0, 0.0)
}

/// The least square sum that [`ShortOp::all_normalised`] passes: tiny
/// squares are handed to the long-row kernel unless `eps` hides them.
#[cfg_attr(not(debug_assertions), inline(always))]
fn squares_floor(eps: f64) -> f64 {
    if eps < EPS_HIDES_TINY {
        TINY_SQUARES
    } else {
        0.0
    }
}

/// The largest square sum that [`ShortOp::all_normalised`] passes:
/// `squares · (1 / d) + eps` cannot overflow while both terms are at most
/// `f64::MAX / 2`, and a larger `eps` sends every block to the verdict of
/// each row.
#[cfg_attr(not(debug_assertions), inline(always))]
fn squares_ceiling(eps: f64) -> f64 {
    if eps <= f64::MAX / 2.0 {
        f64::MAX / 2.0
    } else {
        f64::NEG_INFINITY
    }
}

/// Whether `squares · (1 / d) + eps`, the short kernel's denominator, is
/// finite and not zero.
fn denominator_fits(squares: f64, d: usize, eps: f64) -> bool {
    let denominator = squares * (1.0 / d as f64) + eps;
    denominator != 0.0 && denominator.is_finite()
}

#[derive(Clone, Copy)]
struct LayerNormOp<'a, A> {
    params: Params<'a, A>,
    eps: f64,
}

/// LayerNorm statistics of short rows of `A`: `(mean, inv_std, check)`.
/// The squares are summed around `base + shift`, the outputs take
/// `nearest + rest` ([`Split`]).
#[cfg_attr(not(debug_assertions), inline(always))]
fn layer_norm_stats<A, T: Arith>(columns: &[T], eps: f64) -> (Split<T>, T, Check<T>) {
    let exact_quotient = quotient_is_exact::<A>(columns.len());
    let (mean, sum, min, max) = mean_split(columns, exact_quotient);
    let squares = square_sum(columns, mean.base, mean.shift);
    let inv_std = inverse_root(squares, columns.len(), eps);
    (mean, inv_std, [sum, min, max, squares])
}

/// The statistics of one short row as the long-row kernel's [`Centring`],
/// or `None` where the long-row kernel must compute them. Writing the row
/// from them gives exactly the bits of the short path.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn centring<A: KernelScalar>(x: &[A], eps: f64) -> Option<Centring> {
    let (values, d) = widened(x);
    let (mean, inv_std, check) = layer_norm_stats::<A, f64>(values.get(..d)?, eps);
    let op = LayerNormOp::<A> {
        params: Affine::Identity.into(),
        eps,
    };
    match op.verdict(check, d) {
        Verdict::Normalised => Some(mean.centring(1.0, inv_std)),
        Verdict::Constant => Some(Centring::Constant),
        Verdict::General => None,
    }
}

/// The RMSNorm scale of one short row as the long-row kernel's
/// `(scale, inv_rms)`, or `None` where the long-row kernel must compute it.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn rms_scaling<A: KernelScalar>(x: &[A], eps: f64) -> Option<(f64, f64)> {
    let (values, d) = widened(x);
    let zero = 0.0;
    let squares = square_sum(values.get(..d)?, zero, zero);
    let op = RmsNormOp::<A> {
        params: Affine::Identity.into(),
        eps,
    };
    (op.verdict([squares, zero, zero, zero], d) == Verdict::Normalised)
        .then(|| (1.0, inverse_root(squares, d, eps)))
}

/// A short row widened to `f64`, with its length.
#[cfg_attr(not(debug_assertions), inline(always))]
fn widened<A: KernelScalar>(x: &[A]) -> ([f64; SHORT_ROW], usize) {
    let mut values = [0.0f64; SHORT_ROW];
    for (slot, &v) in values.iter_mut().zip(x) {
        *slot = v.widen();
    }
    (values, x.len().min(SHORT_ROW))
}

impl<A: KernelScalar> ShortOp<A> for LayerNormOp<'_, A> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn outputs<T: Arith>(self, columns: &[T], outputs: &mut [T; SHORT_ROW]) -> Check<T> {
        let (mean, inv_std, check) = layer_norm_stats::<A, T>(columns, self.eps);
        let Split { nearest, rest, .. } = mean;
        for (j, (out, &x)) in outputs.iter_mut().zip(columns).enumerate() {
            *out = affine_element(((x - nearest) - rest) * inv_std, self.params.affine, j);
        }
        check
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn verdict(self, [sum, min, max, squares]: [f64; 4], d: usize) -> Verdict {
        let magnitude = min.abs().max(max.abs());
        if !sum.is_finite() || magnitude >= HUGE_MAGNITUDE {
            Verdict::General
        } else if min == max {
            Verdict::Constant
        } else if magnitude < TINY_MAGNITUDE || mean_needs_rescaling(sum, magnitude, self.eps) {
            Verdict::General
        } else if squares.is_finite()
            && !(squares < TINY_SQUARES && self.eps < EPS_HIDES_TINY)
            && denominator_fits(squares, d, self.eps)
        {
            Verdict::Normalised
        } else {
            Verdict::General
        }
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn all_normalised<V: Vector>(self, [sum, min, max, squares]: Check<V>) -> bool {
        // Each test implies its clause of `verdict`: `max - min > 0` (so
        // `min != max`), for `f64` rows a magnitude of at least
        // `TINY_MAGNITUDE` and a sum that is zero or not tiny (no `f32` row
        // comes below either), and squares that are finite and, unless
        // `eps` hides them, not tiny, nor so large that the denominator
        // could overflow (its zero needs `min == max`).
        all_moderate(sum, min, max)
            && (max - min).all_within(f64::from_bits(1), f64::INFINITY)
            && (size_of::<A>() == size_of::<f32>()
                || (min
                    .abs()
                    .max_select(max.abs())
                    .all_within(TINY_MAGNITUDE, f64::INFINITY)
                    && no_tiny_sum(sum)))
            && squares.all_within(squares_floor(self.eps), squares_ceiling(self.eps))
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn all_single_constant<V: Vector>(self, column: V) -> bool {
        // A row of one element is its own mean, minimum and maximum: the
        // clauses of `all_constant` reduce to a magnitude below
        // `HUGE_MAGNITUDE` (so finite).
        column.abs().all_within(0.0, HUGE_MAGNITUDE.next_down())
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn all_constant<V: Vector>(self, [sum, min, max, _]: Check<V>) -> bool {
        all_moderate(sum, min, max) && (max - min).all_within(0.0, 0.0)
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn constant_output(self, j: usize) -> A {
        match self.params.affine {
            Affine::ScaleShift(_, beta) => beta.get(j).copied().unwrap_or(A::zero()),
            Affine::Identity | Affine::Scale(_) | Affine::OnePlus(_) => A::zero(),
        }
    }

    const PIPELINED: bool = true;
    type Stats = Centring;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn stats<V: Vector>(self, x: &[A]) -> Centring {
        long_centring::<A, V>(x, self.eps)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn write<V: Vector>(self, io: Io<'_, A>, stats: Centring, ahead: Ahead) {
        write_layer_norm::<A, V>(io, self.params, stats, ahead);
    }

    fn prefetch(self) -> bool {
        self.params.prefetch
    }
}

#[derive(Clone, Copy)]
struct RmsNormOp<'a, A> {
    params: Params<'a, A>,
    eps: f64,
}

impl<A: KernelScalar> ShortOp<A> for RmsNormOp<'_, A> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn outputs<T: Arith>(self, columns: &[T], outputs: &mut [T; SHORT_ROW]) -> Check<T> {
        let zero = T::splat(0.0);
        let squares = square_sum(columns, zero, zero);
        let inv_rms = inverse_root(squares, columns.len(), self.eps);
        for (j, (out, &x)) in outputs.iter_mut().zip(columns).enumerate() {
            *out = affine_element(x * inv_rms, self.params.affine, j);
        }
        [squares, zero, zero, zero]
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn verdict(self, [squares, ..]: [f64; 4], d: usize) -> Verdict {
        let fits = squares.is_finite()
            && !(squares < TINY_SQUARES && self.eps < EPS_HIDES_TINY)
            && denominator_fits(squares, d, self.eps);
        if fits {
            Verdict::Normalised
        } else {
            Verdict::General
        }
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn all_normalised<V: Vector>(self, [squares, ..]: Check<V>) -> bool {
        // Finite squares, not tiny unless `eps` hides them; either way
        // `squares · (1 / d) + eps` is then positive, since `eps` is
        // finite and not negative (checked before any kernel runs), and
        // finite below the ceiling.
        squares.all_within(squares_floor(self.eps), squares_ceiling(self.eps))
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn all_constant<V: Vector>(self, _check: Check<V>) -> bool {
        false
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn all_single_constant<V: Vector>(self, _column: V) -> bool {
        false
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn constant_output(self, _j: usize) -> A {
        A::zero()
    }

    // See `PIPELINE_MAX_ROW_BYTES` for why only `f32` rows.
    const PIPELINED: bool = size_of::<A>() == size_of::<f32>();
    type Stats = Option<(f64, f64)>;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn stats<V: Vector>(self, x: &[A]) -> Option<(f64, f64)> {
        long_rms_scaling::<A, V>(x, self.eps)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn write<V: Vector>(self, io: Io<'_, A>, stats: Option<(f64, f64)>, ahead: Ahead) {
        write_rms_norm::<A, V>(io, self.params, stats, ahead);
    }

    fn prefetch(self) -> bool {
        self.params.prefetch
    }
}

/// LayerNorm of the `rows` consecutive rows of `io`.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn layer_norm_rows<A: KernelScalar, V: Vector>(
    io: Io<'_, A>,
    rows: usize,
    params: Params<'_, A>,
    eps: f64,
) {
    for_rows::<A, V, _>(io, rows, LayerNormOp { params, eps });
}

/// RMSNorm of the `rows` consecutive rows of `io`.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn rms_norm_rows<A: KernelScalar, V: Vector>(
    io: Io<'_, A>,
    rows: usize,
    params: Params<'_, A>,
    eps: f64,
) {
    for_rows::<A, V, _>(io, rows, RmsNormOp { params, eps });
}

/// Rows of at most this many bytes are pipelined by [`long_rows`] when the
/// operation asks for it ([`ShortOp::PIPELINED`]) or, in place, when they
/// end inside a cache line.
///
/// A short row's statistics end in a long chain of dependent steps (lane
/// trees, the division of the mean, the square root), during which the
/// row's own output pass must wait. Computing the next row's statistics
/// first gives the processor independent work to overlap with that chain.
/// In longer rows the chain is a small share of the time.
///
/// RMSNorm's chain is shorter (no mean split), and only its `f32` rows
/// gain from the overlap; `f64` RMSNorm rows lose, and are not pipelined,
/// with one exception.
///
/// In place, a row whose length is not a whole number of cache lines
/// shares its last line with the next row, whose first load then follows
/// closely on the store of the previous row's tail (the likely reason why
/// such rows are slow when written as they come). Pipelined, the
/// statistics of the next row come between them. The test is the line,
/// not the vector: rows of whole lines that end in a partial vector gain
/// nothing. Every operation pipelines such rows in place (PERFORMANCE.md,
/// "Short rows, 16 at a time").
const PIPELINE_MAX_ROW_BYTES: usize = 1024;

/// Runs `op` on rows longer than [`SHORT_ROW`], one by one, asking for
/// the row about 4 KiB ahead, or the next one for longer rows
/// ([`cache::rows_ahead`]) (and, when the output is separate and written
/// with plain stores, its destination) to be brought into cache while the
/// current one is written: each chunk of the output pass asks for the same
/// chunk of that row ([`Ahead`]). Short enough rows of a pipelined
/// operation (and, in place, short rows that end inside a cache line) are
/// written one row behind: each row's statistics are computed before the
/// previous row is written (same arithmetic per row, so the same bits).
///
/// Compiled once per operation in its [island](LongRows), which
/// [`ShortOp::long_rows`] calls.
#[cfg_attr(not(debug_assertions), inline(always))]
fn long_rows<A: KernelScalar, V: Vector, Op: ShortOp<A>>(io: Io<'_, A>, d: usize, op: Op) {
    let streamed = matches!(io, Io::Stream { .. });
    // A streamed output is not read before it is written.
    let hint_output = matches!(io, Io::Copy { .. });
    let row_bytes = d * size_of::<A>();
    // In place, a row whose end does not close a cache line shares that line
    // with the next row (see `PIPELINE_MAX_ROW_BYTES`).
    let shares_lines = matches!(io, Io::InPlace(_)) && !row_bytes.is_multiple_of(cache::LINE);
    let pipelined = (Op::PIPELINED || shares_lines) && row_bytes <= PIPELINE_MAX_ROW_BYTES;
    // Only rows of this call are asked for: a call may hold one row of a
    // strided walk, or a block of a gather buffer, whose neighbours in
    // memory are not the next rows.
    let rows_ahead = cache::rows_ahead::<A>(d);
    let hinted_rows = if op.prefetch() {
        (io.input().len() / d).saturating_sub(rows_ahead)
    } else {
        0
    };
    let ahead = |row: usize| {
        if row < hinted_rows {
            Ahead::new(rows_ahead * d, hint_output)
        } else {
            Ahead::NONE
        }
    };
    // One site each for the statistics and the output pass, which are
    // inlined here: a row is written as it comes, or one row behind when
    // pipelined, and the step after the last row writes the one pending.
    let mut rows = io.rows(d).enumerate();
    let mut pending = None;
    loop {
        let current = rows.next().map(|(row, io)| {
            let stats = op.stats::<V>(io.input());
            (io, stats, row)
        });
        let last = current.is_none();
        let ready = if pipelined {
            std::mem::replace(&mut pending, current)
        } else {
            current
        };
        if let Some((io, stats, row)) = ready {
            op.write::<V>(io, stats, ahead(row));
        }
        if last {
            break;
        }
    }
    if streamed {
        cache::after_streaming();
    }
}

/// [`long_rows`] of one operation, as an [`Island`]: its output loops are
/// compiled once per vector type, however many places hand rows to it.
struct LongRows<A, Op>(PhantomData<(A, Op)>);

impl<A: KernelScalar, Op: ShortOp<A>> Island for LongRows<A, Op> {
    type Args<'a> = (Io<'a, A>, usize, Op);
    type Output = ();
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn run<V: Vector>((io, d, op): Self::Args<'_>) {
        long_rows::<A, V, Op>(io, d, op);
    }
}

/// Runs `op` on every row: short rows 16 at a time with vectors and the
/// rest of them one by one, longer rows one by one in the long-row kernel.
#[cfg_attr(not(debug_assertions), inline(always))]
fn for_rows<A: KernelScalar, V: Vector, Op: ShortOp<A>>(io: Io<'_, A>, rows: usize, op: Op) {
    let d = io.input().len() / rows.max(1);
    if d == 0 {
        return;
    }
    if d > SHORT_ROW {
        op.long_rows::<V>(io, d);
        return;
    }
    let block = d * LANES;
    // The block about 4 KiB ahead (and its destination, even when streamed:
    // short rows are written with plain stores) is requested while this
    // one is worked on. Hints past the end never fault, and in a contiguous
    // array they reach the rows of the next call, which the same thread
    // usually takes next: bounding them to this call's blocks would leave
    // the first blocks of every call waiting on memory, which the rows of
    // one or two elements, with the least arithmetic per byte, feel most.
    let ahead = cache::rows_ahead::<A>(block) * block;
    let prefetch = op.prefetch();
    // Short rows are written with plain stores; one loop serves separate
    // outputs and rows normalised in place (`source` `None`), so that the
    // block kernel, with its moves between rows and lanes for every row
    // length, is compiled once per operation.
    let (source, destination) = match io {
        Io::Copy { input, output } | Io::Stream { input, output } => (Some(input), output),
        Io::InPlace(rows) => (None, rows),
    };
    let mut sources = source.map(|source| source.chunks_exact(block));
    let mut destinations = destination.chunks_exact_mut(block);
    let mut scratch = Scratch::new();
    for destination in &mut destinations {
        let source = sources.as_mut().and_then(Iterator::next);
        if prefetch {
            let input = source.map_or(destination.as_ptr(), <[A]>::as_ptr);
            cache::for_reading(input.wrapping_add(ahead), block);
            if source.is_some() {
                cache::for_writing(destination.as_ptr().wrapping_add(ahead), block);
            }
        }
        sixteen_rows::<A, V, Op>(source, destination, d, op, &mut scratch);
    }
    let rows = destinations.into_remainder().chunks_exact_mut(d);
    match sources.map(|sources| sources.remainder().chunks_exact(d)) {
        Some(inputs) => {
            for (input, output) in inputs.zip(rows) {
                one_row::<A, V, Op>(Io::Copy { input, output }, op);
            }
        }
        None => rows.for_each(|row| one_row::<A, V, Op>(Io::InPlace(row), op)),
    }
}

/// One short row, in `f64`.
#[cfg_attr(not(debug_assertions), inline(always))]
fn one_row<A: KernelScalar, V: Vector, Op: ShortOp<A>>(mut io: Io<'_, A>, op: Op) {
    let mut columns = [0.0f64; SHORT_ROW];
    let d = io.input().len().min(SHORT_ROW);
    for (slot, &x) in columns.iter_mut().zip(io.input()) {
        *slot = x.widen();
    }
    let mut outputs = [0.0f64; SHORT_ROW];
    let check = op.outputs(&columns[..d], &mut outputs);
    match op.verdict(check, d) {
        Verdict::Normalised => {
            for (y, &value) in io.output().iter_mut().zip(&outputs) {
                *y = A::narrow(value);
            }
        }
        Verdict::Constant => {
            for (j, y) in io.output().iter_mut().enumerate() {
                *y = op.constant_output(j);
            }
        }
        Verdict::General => op.general::<V>(io),
    }
}

/// Buffers of [`sixteen_rows`], reused from block to block.
struct Scratch<V> {
    /// `lanes[j][r]` is element `j` of row `r`.
    lanes: [[f64; LANES]; SHORT_ROW],
    columns: [V; SHORT_ROW],
    outputs: [V; SHORT_ROW],
}

impl<V: Vector> Scratch<V> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn new() -> Self {
        Scratch {
            lanes: [[0.0; LANES]; SHORT_ROW],
            columns: [V::splat(0.0); SHORT_ROW],
            outputs: [V::splat(0.0); SHORT_ROW],
        }
    }
}

/// Row `r` of length `d` of a block.
#[cfg_attr(not(debug_assertions), inline(always))]
fn row_of<A>(block: &[A], r: usize, d: usize) -> &[A] {
    block.get(r * d..(r + 1) * d).unwrap_or(&[])
}

/// Sixteen short rows of length `d`, one per lane. `source` is `None` when
/// the rows are normalised in place. When every row is normalised by the
/// vector pass (the usual case), its outputs go straight from the lanes to
/// the rows; otherwise each row is written on its own, and the rows that
/// the vector pass cannot finish are handed to the long-row kernel.
#[cfg_attr(not(debug_assertions), inline(always))]
fn sixteen_rows<A: KernelScalar, V: Vector, Op: ShortOp<A>>(
    source: Option<&[A]>,
    destination: &mut [A],
    d: usize,
    op: Op,
    scratch: &mut Scratch<V>,
) {
    load_columns(source.unwrap_or(&*destination), d, &mut scratch.columns);
    if d == 1 && op.all_single_constant(scratch.columns[0]) {
        fill_constant(op, destination, d);
        return;
    }
    let columns = scratch.columns.get(..d).unwrap_or(&[]);
    let check = op.outputs(columns, &mut scratch.outputs);
    if op.all_normalised(check) {
        store_columns(&scratch.outputs, d, destination);
        return;
    }
    if op.all_constant(check) {
        fill_constant(op, destination, d);
        return;
    }
    let check = [
        check[0].to_lanes(),
        check[1].to_lanes(),
        check[2].to_lanes(),
        check[3].to_lanes(),
    ];
    let mut verdicts = [Verdict::General; LANES];
    for (r, verdict) in verdicts.iter_mut().enumerate() {
        *verdict = op.verdict([check[0][r], check[1][r], check[2][r], check[3][r]], d);
    }
    // Transpose back, then write row by row.
    for (lane_values, output) in scratch.lanes.iter_mut().zip(&scratch.outputs).take(d) {
        *lane_values = output.to_lanes();
    }
    for (r, verdict) in verdicts.into_iter().enumerate() {
        let Some(row) = destination.get_mut(r * d..(r + 1) * d) else {
            continue;
        };
        match verdict {
            Verdict::Normalised => {
                for (y, lane_values) in row.iter_mut().zip(&scratch.lanes) {
                    *y = A::narrow(lane_values[r]);
                }
            }
            Verdict::Constant => fill_constant(op, row, d),
            Verdict::General => match source {
                Some(source) => op.general::<V>(Io::Copy {
                    input: row_of(source, r, d),
                    output: row,
                }),
                None => op.general::<V>(Io::InPlace(row)),
            },
        }
    }
}

/// Element `j` of the 16 rows of length `d` in `rows`, widened, into
/// `columns[j]`. Rows of one element are one contiguous column: a plain
/// load.
#[cfg_attr(not(debug_assertions), inline(always))]
fn load_columns<A: KernelScalar, V: Vector>(rows: &[A], d: usize, columns: &mut [V; SHORT_ROW]) {
    match <&[A; LANES]>::try_from(rows) {
        Ok(column) if d == 1 => columns[0] = A::load(column),
        _ => A::load_columns(rows, d, columns),
    }
}

/// The inverse of [`load_columns`]: `columns[j]`, rounded, into element
/// `j` of the 16 rows of length `d` in `rows`.
#[cfg_attr(not(debug_assertions), inline(always))]
fn store_columns<A: KernelScalar, V: Vector>(columns: &[V; SHORT_ROW], d: usize, rows: &mut [A]) {
    match <&mut [A; LANES]>::try_from(&mut *rows) {
        Ok(column) if d == 1 => A::store(columns[0], column),
        _ => A::store_columns(columns, rows, d),
    }
}

/// Writes [`ShortOp::constant_output`] to every row of `destination`.
#[cfg_attr(not(debug_assertions), inline(always))]
fn fill_constant<A: KernelScalar, Op: ShortOp<A>>(op: Op, destination: &mut [A], d: usize) {
    let mut constant = [A::zero(); SHORT_ROW];
    for (j, y) in constant.iter_mut().enumerate().take(d) {
        *y = op.constant_output(j);
    }
    for row in destination.chunks_exact_mut(d) {
        row.copy_from_slice(&constant[..d]);
    }
}

/// [`RowStats`] of one short row.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn row_stats<A: KernelScalar>(x: &[A]) -> RowStats {
    let (values, d) = widened(x);
    let columns = values.get(..d).unwrap_or(&[]);
    let (mean, _, min, max) = mean_split(columns, quotient_is_exact::<A>(d));
    let squares = square_sum(columns, 0.0, 0.0);
    let fits = mean.base.is_finite()
        && min != max
        && min.abs().max(max.abs()) < HUGE_MAGNITUDE
        && squares.is_finite()
        && squares >= TINY_SQUARES;
    if fits {
        RowStats {
            mean: mean.nearest,
            mean_rest: mean.rest,
            rms: (squares / d as f64).sqrt(),
        }
    } else {
        // The long-row kernel handles every special row; the vector type
        // is irrelevant for a row this short.
        general_row_stats::<A, super::simd::Portable>(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f32` values of every kind a row may hold: zeros of both signs,
    /// subnormals, the extremes, infinities, NaN, and a spread of ordinary
    /// values.
    fn f32_values() -> Vec<f32> {
        let mut values = vec![
            0.0,
            -0.0,
            f32::from_bits(1),
            -f32::from_bits(1),
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1.0,
            -1.0,
            3.0,
            1e8,
            -1e-30,
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..64 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let exponent = (state % 60) as i32 - 30;
            let mantissa = ((state >> 20) % 2000) as f32 / 1000.0 - 1.0;
            values.push(mantissa * 2f32.powi(exponent));
        }
        values
    }

    #[test]
    fn exact_quotient_splits_f32_rows_as_dekker_does() {
        let values = f32_values();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for d in [1, 2, 4, 8, 16] {
            assert!(quotient_is_exact::<f32>(d));
            for _ in 0..4000 {
                let row: Vec<f64> = (0..d)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        f64::from(values[(state >> 33) as usize % values.len()])
                    })
                    .collect();
                let quick = mean_split(&row, true);
                let dekker = mean_split(&row, false);
                let (quick, dekker) = (quick.0, dekker.0);
                let parts = [
                    (quick.base, dekker.base),
                    (quick.shift, dekker.shift),
                    (quick.nearest, dekker.nearest),
                    (quick.rest, dekker.rest),
                ];
                for (quick, dekker) in parts {
                    assert!(
                        quick.to_bits() == dekker.to_bits() || (quick.is_nan() && dekker.is_nan()),
                        "{row:?}: {quick:e} against {dekker:e}"
                    );
                }
            }
        }
        assert!(!quotient_is_exact::<f32>(3));
        assert!(!quotient_is_exact::<f64>(4));
    }
}
