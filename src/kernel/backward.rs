//! Training kernels: the forward pass that keeps its row statistics and the
//! backward passes of LayerNorm and RMSNorm, a block of rows at a time.
//! Like [`portable`](super::portable), every function here is
//! `#[inline(always)]` and generic over the [`Vector`] type, so the entry
//! points of [`kernel`](super) compile it anew for every instruction set.
//!
//! # Gradients
//!
//! With `n = x̂` the normalised row, `g = γ ⊙ dy` and `r` the row's
//! `1/√(var + eps)` (LayerNorm) or `1/√(mean(x²) + eps)` (RMSNorm):
//!
//! ```text
//! LayerNorm  dxᵢ = r · ((gᵢ - mean(g)) - nᵢ · mean(g ⊙ n))     dγⱼ = Σ dyⱼ nⱼ   dβⱼ = Σ dyⱼ
//! RMSNorm    dxᵢ = r · ( gᵢ            - nᵢ · mean(g ⊙ n))     dγⱼ = Σ dyⱼ nⱼ
//! ```
//!
//! (the sums run over rows). Both are exact for every `eps`: `∂r/∂xᵢ` is
//! `-r³ (xᵢ - x̄) / d` (LayerNorm) or `-r³ xᵢ / d` (RMSNorm), so the chain
//! rule gives `r (gᵢ - mean(g)) - r³ (xᵢ - x̄) · mean(g ⊙ (x - x̄))`, and
//! `n = r (x - x̄)` turns the second term into `r · nᵢ · mean(g ⊙ n)`.
//!
//! # Passes
//!
//! Each row is read twice (three times when backward computes the
//! statistics), from cache after the first time. Pass A forms
//! `eᵢ = xᵢ · scale - base` (RMSNorm: `xᵢ · scale`) and `gᵢ = gainᵢ · dyᵢ`
//! and sums `Σ gᵢ` and `Σ gᵢ eᵢ`; then
//! `Σ gᵢ nᵢ = (Σ gᵢ eᵢ - shift · Σ gᵢ) · inv_std` (RMSNorm:
//! `Σ gᵢ eᵢ · inv_rms`), where `shift` is below the rounding of the mean,
//! so the subtraction does not cancel. Pass B forms
//! `nᵢ = ((xᵢ · scale - nearest) - rest) · inv_std`, the forward kernel's
//! normalised value from its split of the mean around the double nearest it
//! (the `scale = 1` multiplication is exact, so it carries the forward
//! pass's accuracy, also on rows with a large common offset or rescaled
//! rows), writes `dx` and adds `dyᵢ · nᵢ` (and `dyᵢ`) to the per-feature
//! partials. When backward computes the statistics itself, pass 1 of the
//! exact centring comes first and pass A also sums `Σ eᵢ²`, the centring's
//! pass 2, with the same decisions ([`variance`], [`rms_from_squares`]),
//! so the statistics have the bits of those the forward pass saves.
//!
//! Rows are written as they come, not one row behind as the forward
//! kernel's short rows are: running passes 1 and A of the next row before
//! pass B of each row costs `f64` rows and gives `f32` rows nothing
//! (PERFORMANCE.md, "Compiled once per kind of row").
//!
//! The statistics backward uses are those of the exact centring of
//! [`portable`](super::portable) for both element types: an `f32` row,
//! widened exactly, goes through the arithmetic of the `f64` row of the same
//! values, so `f32` gradients are the `f64` gradients rounded once. (The
//! forward output of an `f32` row may come from the certified single
//! precision path; the training forward pass writes that output and saves
//! the exact statistics.)
//!
//! A row has no derivative where the normalisation jumps: a constant row
//! under LayerNorm, or an all-zero row under RMSNorm, when `eps = 0`. Its
//! saved `inv_std` is `+∞`, its `dx` is NaN, and its `n` counts as 0 in
//! `dγ`, as in the forward output.
//!
//! # Summation order
//!
//! `Σ g`, `Σ g ⊙ e` and `Σ e²` are [`BlockedSum`]s: element `i` in lane `i % LANES`,
//! plain sums over blocks of [`BLOCK`] vectors added to a compensated
//! total, the lanes combined by fixed halving trees. Their error, about
//! `(BLOCK + 5) · 2⁻⁵³ · Σ |terms|`, is that of a short plain sum whatever
//! `d`. The per-feature sums over rows are split into blocks of
//! [`BLOCK_ROWS`] consecutive rows: each block adds its rows in order,
//! element by element, into `f64` partials that start at 0, and the blocks'
//! partials are added in block order by [`ColumnSum`], which keeps the
//! rounding error of every addition. No step depends on which thread
//! computes a block, so the bits do not depend on the thread count. The
//! square sum of pass A is that of the forward pass, fused multiply-adds
//! included.

use super::portable::{
    centred_square_sum, centring, centring_first_pass, exact_centring, inverse_root,
    rescaled_centring, rescaled_rms_scaling, rms_from_squares, rms_scaling, two_sum, variance,
    write_layer_norm, write_rms_norm, Blend, BlockedSum, Centring, FirstPass, Plain, Split, Store,
    Streaming, Variance, BLOCK,
};
use super::short::{self, SHORT_ROW};
use std::marker::PhantomData;

use super::islands::Island;
use super::simd::{Portable, Vector, LANES};
use super::{cache, widened_gain, Affine, Io};
use crate::scalar::KernelScalar;

/// One row's `x`, `dy` and gain (the gain padded to whole vectors).
type RowInputs<'a, A> = (&'a [A], &'a [A], &'a [f64]);

/// Rows per block of the per-feature sums over rows.
pub(crate) const BLOCK_ROWS: usize = 64;

/// LayerNorm statistics of one row as backward needs them:
/// `nᵢ = ((xᵢ · scale - nearest) - rest) · inv_std`, with the sums of pass A
/// taken around `base` (the forward kernel's two splits of the `mean`,
/// [`Split`]).
///
/// A constant row has `base = nearest` = its value, `shift = rest = 0`,
/// `scale = 1` and `inv_std = 1/√eps` (`+∞` when `eps = 0`); a row holding
/// a NaN or an infinity is all NaN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RowCentring {
    scale: f64,
    mean: Split<f64>,
    inv_std: f64,
}

impl RowCentring {
    pub(crate) const NOT_FINITE: Self = RowCentring {
        scale: f64::NAN,
        mean: Split::single(f64::NAN, f64::NAN),
        inv_std: f64::NAN,
    };

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn from_centring<A: KernelScalar>(x: &[A], centring: Centring, eps: f64) -> Self {
        match centring {
            Centring::Centred {
                scale,
                mean,
                inv_std,
            } => RowCentring {
                scale,
                mean,
                inv_std,
            },
            Centring::Constant => RowCentring {
                scale: 1.0,
                mean: Split::single(x.first().map_or(f64::NAN, |v| v.widen()), 0.0),
                inv_std: constant_inverse_root(eps),
            },
            Centring::NotFinite => Self::NOT_FINITE,
        }
    }

    /// The row's mean.
    pub(crate) fn mean(self) -> f64 {
        (self.mean.base + self.mean.shift) / self.scale
    }

    /// The row's `1/√(var + eps)`.
    pub(crate) fn rstd(self) -> f64 {
        self.inv_std * self.scale
    }
    /// The bits of every field, for comparisons that must see NaN and -0.
    #[cfg(test)]
    pub(crate) fn to_bits(self) -> [u64; 6] {
        let Split {
            base,
            shift,
            nearest,
            rest,
        } = self.mean;
        [self.scale, base, shift, nearest, rest, self.inv_std].map(f64::to_bits)
    }
}

/// RMSNorm statistics of one row as backward needs them:
/// `nᵢ = (xᵢ · scale) · inv_rms`.
///
/// An all-zero row with `eps = 0` has `inv_rms = +∞`; a row holding a NaN or
/// an infinity is all NaN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RowScaling {
    scale: f64,
    inv_rms: f64,
}

impl RowScaling {
    pub(crate) const NOT_FINITE: Self = RowScaling {
        scale: f64::NAN,
        inv_rms: f64::NAN,
    };

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn from_scaling(scaling: Option<(f64, f64)>) -> Self {
        match scaling {
            // The forward kernel gets 0 for an all-zero row with eps = 0, so
            // that its output is 0; the true 1/rms is +∞.
            Some((scale, inv_rms)) => RowScaling {
                scale,
                inv_rms: if inv_rms == 0.0 {
                    f64::INFINITY
                } else {
                    inv_rms
                },
            },
            None => Self::NOT_FINITE,
        }
    }

    /// The row's `1/√(mean(x²) + eps)`.
    pub(crate) fn rrms(self) -> f64 {
        self.inv_rms * self.scale
    }
    /// The bits of every field.
    #[cfg(test)]
    pub(crate) fn to_bits(self) -> [u64; 2] {
        [self.scale, self.inv_rms].map(f64::to_bits)
    }
}

/// `1/√eps`, the `1/√(var + eps)` of a constant row (`+∞` for `eps = 0`).
#[cfg_attr(not(debug_assertions), inline(always))]
fn constant_inverse_root(eps: f64) -> f64 {
    if eps > 0.0 {
        1.0 / eps.sqrt()
    } else {
        f64::INFINITY
    }
}

/// How a stored per-feature weight scales the normalised row.
#[derive(Clone, Copy)]
pub(crate) enum Gain<'a, A> {
    /// `y = n · γ`.
    Gamma(&'a [A]),
    /// `y = n · (1 + w)`, with `1 + w` formed in `f64` (zero-centred weights).
    OnePlus(&'a [A]),
}

impl<'a, A: KernelScalar> Gain<'a, A> {
    /// [`widen_into`](Self::widen_into) a new vector.
    #[cfg(test)]
    pub(crate) fn widened(self) -> Vec<f64> {
        let mut gain = LineAligned::zeros(0);
        self.widen_into(&mut gain, 0);
        gain.as_slice().to_vec()
    }

    /// The gains `γ` or `1 + w` in `f64`, followed by zeros
    /// ([`padded_len`]), as the backward kernels take them, into `gain`,
    /// reusing its memory; the gain of feature `first_on_line` starts a
    /// cache line.
    pub(crate) fn widen_into(self, gain: &mut LineAligned, first_on_line: usize) {
        let (Gain::Gamma(weights) | Gain::OnePlus(weights)) = self;
        gain.reset(padded_len(weights.len()), first_on_line);
        let widened = widened_gain(weights, matches!(self, Gain::OnePlus(_)));
        for (slot, value) in gain.as_mut_slice().iter_mut().zip(widened) {
            *slot = value;
        }
    }

    /// The forward pass's affine part for this gain.
    pub(crate) fn affine(self) -> Affine<'a, A> {
        match self {
            Gain::Gamma(gamma) => Affine::Scale(gamma),
            Gain::OnePlus(w) => Affine::OnePlus(w),
        }
    }
}

/// What a backward block reads: `x` and `dy` (the same number of rows of
/// length `d`) and the `d` gains (`γ` or `1 + w`) in `f64`, padded with
/// zeros ([`Gain::widen_into`]); whether the call is large enough to ask
/// the cache for rows ahead ([`cache::worth_prefetching`]), and whether
/// `dx`, the caller's own array too large for any cache, is written past
/// the caches ([`stream`](Self::stream)).
#[derive(Clone, Copy)]
pub(crate) struct Inputs<'a, A> {
    pub(crate) x: &'a [A],
    pub(crate) dy: &'a [A],
    pub(crate) d: usize,
    pub(crate) gain: &'a [f64],
    pub(crate) prefetch: bool,
    /// Every whole 64-byte line of `dx` is written with non-temporal
    /// stores, which do not read the line first (as the forward pass's
    /// `Io::Stream`, and for the same calls: the caller's own `dx`, of
    /// rows long enough, too large for the caches); the same values, the
    /// same bits. A plain store of a line that is not in cache reads it
    /// from memory first, a third transfer per line on top of the copy's
    /// two (PERFORMANCE.md, "Backward passes").
    pub(crate) stream: bool,
}

/// The length of the per-feature buffers of rows of length `d` (the gains
/// and the partials), followed by zeros: whole vectors, plus one more, so
/// that the vectors of a row's body still cover it when they start after
/// a streamed row's head (see [`pass_b`]).
pub(crate) fn padded_len(d: usize) -> usize {
    (d.div_ceil(LANES) + 1) * LANES
}

/// Where a block's row statistics come from.
#[derive(Clone, Copy)]
pub(crate) enum Saved<'a, T> {
    /// Compute each row's statistics with this `eps`.
    Compute(f64),
    /// One saved entry per row of the block, in order.
    Rows(&'a [T]),
}

/// `f64`s laid out on cache lines, in a buffer of their own, so that no
/// vector of them is split between two lines: a vector store that is
/// split costs about twice one that is not, and the partials take one
/// store per vector of every row. Pass B's vectors start at a chosen
/// value (0, or the length of a streamed row's head) and every [`LANES`]
/// values after it: that value starts a line, and so, a vector being two
/// whole lines of `f64`s, do the others.
pub(crate) struct LineAligned {
    buffer: Vec<f64>,
    len: usize,
    /// Values before the first line: `first_on_line % LINE`.
    before_line: usize,
}

impl LineAligned {
    /// `f64`s per cache line.
    const LINE: usize = cache::LINE / size_of::<f64>();

    /// `len` zeros, the first one on a line.
    pub(crate) fn zeros(len: usize) -> Self {
        let mut zeros = LineAligned {
            buffer: Vec::new(),
            len: 0,
            before_line: 0,
        };
        zeros.reset(len, 0);
        zeros
    }

    /// Makes these `len` zeros, reusing their memory, with the value at
    /// `first_on_line` at the start of a line.
    pub(crate) fn reset(&mut self, len: usize, first_on_line: usize) {
        self.buffer.clear();
        self.buffer.resize(len + Self::LINE - 1, 0.0);
        self.len = len;
        self.before_line = first_on_line % Self::LINE;
    }

    /// Makes every value 0, the one at `first_on_line` at the start of a
    /// line.
    pub(crate) fn clear(&mut self, first_on_line: usize) {
        self.before_line = first_on_line % Self::LINE;
        self.as_mut_slice().fill(0.0);
    }

    /// Where the values start in the buffer: `before_line` values before a
    /// line, within the first `LINE - 1` elements (the buffer's allocation
    /// holds `f64`s, so its first line is within those too).
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn start(&self) -> usize {
        let line = self.buffer.as_ptr().align_offset(cache::LINE);
        let line = if line < Self::LINE { line } else { 0 };
        (line + Self::LINE - self.before_line) % Self::LINE
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn as_slice(&self) -> &[f64] {
        let start = self.start();
        &self.buffer[start..start + self.len]
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn as_mut_slice(&mut self) -> &mut [f64] {
        let start = self.start();
        &mut self.buffer[start..start + self.len]
    }
}

/// One block's per-feature partial sums over its rows, each followed by
/// zeros ([`padded_len`]) so that the kernels load and store them as whole
/// vectors. Only the first `d` are the block's sums.
pub(crate) struct Partials {
    pub(crate) dgamma: LineAligned,
    pub(crate) dbeta: LineAligned,
    /// The block's pending line of a streamed `dx` ([`SharedLine`]).
    shared: SharedLine,
}

impl Partials {
    pub(crate) fn new(d: usize) -> Self {
        Partials {
            dgamma: LineAligned::zeros(padded_len(d)),
            dbeta: LineAligned::zeros(padded_len(d)),
            shared: SharedLine::NONE,
        }
    }

    /// Makes these the partials of rows of length `d`, every one at 0,
    /// reusing their memory.
    pub(crate) fn reset(&mut self, d: usize) {
        self.dgamma.reset(padded_len(d), 0);
        self.dbeta.reset(padded_len(d), 0);
    }

    /// Starts a block: every partial at 0, that of feature `first_on_line`
    /// (where the vectors of pass B start, see [`cache::before_first_line`]) at the
    /// start of a cache line.
    pub(crate) fn clear(&mut self, first_on_line: usize) {
        self.dgamma.clear(first_on_line);
        self.dbeta.clear(first_on_line);
    }
}

/// The cache line of a streamed `dx` that a row shares with the next one:
/// the row's last elements (its tail, after its last whole line) and the
/// next row's first (its head, before its first line). Written as two
/// partial vectors with plain stores, that line must first be read from
/// memory, once per row, and the stores behind it wait; instead pass B
/// keeps both parts here and [`backward_rows`] writes the joined line past
/// the caches, as the row's whole lines are. The values are the same, and
/// so are the bits.
///
/// Only where a vector is one line (`f32`: [`LANES`] elements of 4 bytes),
/// so that the kept values fill one vector. The gain is largest where rows
/// are short enough that such lines are frequent (PERFORMANCE.md,
/// "Backward passes").
struct SharedLine {
    /// Whether pass B keeps the row's head in `head` rather than storing it.
    keep_head: bool,
    /// Whether pass B keeps the row's tail in `tail` rather than storing it.
    keep_tail: bool,
    head: [f64; LANES],
    tail: [f64; LANES],
}

impl SharedLine {
    const NONE: Self = SharedLine {
        keep_head: false,
        keep_tail: false,
        head: [0.0; LANES],
        tail: [0.0; LANES],
    };

    /// The line of the previous row's last `tail` elements, `kept` from
    /// its pass B, and this row's head, kept here.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn joined(&self, kept: &[f64; LANES], tail: usize) -> [f64; LANES] {
        let mut line = self.head;
        line.rotate_right(tail);
        line[..tail].copy_from_slice(&kept[..tail]);
        line
    }
}

/// Per-feature totals of the blocks' partial sums, added in block order
/// with the rounding error of each addition kept (TwoSum).
pub(crate) struct ColumnSum {
    high: Vec<f64>,
    low: Vec<f64>,
}

impl ColumnSum {
    pub(crate) fn new(d: usize) -> Self {
        ColumnSum {
            high: vec![0.0; d],
            low: vec![0.0; d],
        }
    }

    /// Makes this the sum of no blocks for `d` features, reusing its
    /// memory.
    pub(crate) fn reset(&mut self, d: usize) {
        for part in [&mut self.high, &mut self.low] {
            part.clear();
            part.resize(d, 0.0);
        }
    }

    /// Adds the next block's partials (the first `d` of them).
    pub(crate) fn add(&mut self, partial: &[f64]) {
        for ((high, low), &p) in self.high.iter_mut().zip(&mut self.low).zip(partial) {
            let (sum, err) = two_sum(*high, p);
            *high = sum;
            // An infinite sum has no rounding error to keep: its error term
            // would be ∞ - ∞, and would turn an overflow into NaN.
            if sum.is_finite() {
                *low += err;
            }
        }
    }

    /// The totals, each rounded once by `narrow`.
    pub(crate) fn total<G>(&self, narrow: impl Fn(f64) -> G) -> Vec<G> {
        self.high
            .iter()
            .zip(&self.low)
            .map(|(&high, &low)| narrow(high + low))
            .collect()
    }
}

/// LayerNorm of a block of rows into `y`, saving each row's statistics.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn layer_norm_train_block<A: KernelScalar, V: Vector>(
    x: &[A],
    y: &mut [A],
    d: usize,
    affine: Affine<'_, A>,
    eps: f64,
    stats: &mut [RowCentring],
) {
    if d == 0 {
        return;
    }
    let rows = x.chunks_exact(d).zip(y.chunks_exact_mut(d));
    for ((x, y), slot) in rows.zip(stats) {
        let exact = exact_centring::<A, V>(x, eps);
        // The forward kernel's choice, so that `y` has its bits: the exact
        // centring itself for long f64 rows, else what `centring` picks.
        let forward = if size_of::<A>() == size_of::<f32>() || d <= SHORT_ROW {
            centring::<A, V>(x, eps)
        } else {
            exact
        };
        let io = Io::Copy {
            input: x,
            output: y,
        };
        write_layer_norm::<A, V>(io, affine.into(), forward, cache::Ahead::NONE);
        *slot = RowCentring::from_centring(x, exact, eps);
    }
}

/// RMSNorm of a block of rows into `y`, saving each row's statistics.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn rms_norm_train_block<A: KernelScalar, V: Vector>(
    x: &[A],
    y: &mut [A],
    d: usize,
    affine: Affine<'_, A>,
    eps: f64,
    stats: &mut [RowScaling],
) {
    if d == 0 {
        return;
    }
    let rows = x.chunks_exact(d).zip(y.chunks_exact_mut(d));
    for ((x, y), slot) in rows.zip(stats) {
        let scaling = rms_scaling::<A, V>(x, eps);
        let io = Io::Copy {
            input: x,
            output: y,
        };
        write_rms_norm::<A, V>(io, affine.into(), scaling, cache::Ahead::NONE);
        *slot = RowScaling::from_scaling(scaling);
    }
}

/// How pass A turns a vector of `x` into the deviation `e` (a struct, not
/// a closure, for the reason given at [`Fold`](super::portable)).
trait Deviate<V>: Copy {
    fn deviation(self, x: V) -> V;
}

/// LayerNorm's `e = x · scale - base`. Without `SCALED` the scale is 1 and
/// the multiplication is skipped (exact, so the bits agree).
///
/// Whether a row is scaled is a type, not a test in each chunk: each row
/// chooses once ([`is_scaled`]), and the loops over its chunks hold no
/// branch. With the test inside, the AVX2 build of pass A kept one of its
/// accumulator registers on the stack, loaded and stored again in every
/// chunk.
#[derive(Clone, Copy)]
struct FromBase<V, const SCALED: bool> {
    scale: V,
    base: V,
}

impl<V: Vector, const SCALED: bool> FromBase<V, SCALED> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn new(scale: f64, base: f64) -> Self {
        FromBase {
            scale: V::splat(scale),
            base: V::splat(base),
        }
    }
}

impl<V: Vector, const SCALED: bool> Deviate<V> for FromBase<V, SCALED> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn deviation(self, x: V) -> V {
        if SCALED {
            x * self.scale - self.base
        } else {
            x - self.base
        }
    }
}

/// RMSNorm's `e = x · scale`, skipped without `SCALED` (see [`FromBase`]).
#[derive(Clone, Copy)]
struct Scaled<V, const SCALED: bool> {
    scale: V,
}

impl<V: Vector, const SCALED: bool> Scaled<V, SCALED> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn new(scale: f64) -> Self {
        Scaled {
            scale: V::splat(scale),
        }
    }
}

impl<V: Vector, const SCALED: bool> Deviate<V> for Scaled<V, SCALED> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn deviation(self, x: V) -> V {
        if SCALED {
            x * self.scale
        } else {
            x
        }
    }
}

/// Whether a row's data is multiplied by `scale` (a power of two other than
/// 1, for a row that was rescaled) before its deviations are taken.
#[cfg_attr(not(debug_assertions), inline(always))]
fn is_scaled(scale: f64) -> bool {
    scale != 1.0
}

/// The row sums of pass A: `Σ gᵢ`, `Σ gᵢ eᵢ` and `Σ eᵢ²`, each a
/// [`BlockedSum`] (element `i` in lane `i % LANES`).
type RowSums<V> = ((BlockedSum<V>, BlockedSum<V>), BlockedSum<V>);

/// Pass A over a row: reads `x` and `dy` and returns the row sums;
/// `Σ gᵢ` only if `G_SUM`, `Σ eᵢ²` only if `SQUARES` (the others stay 0).
/// With an `ahead` ([`RowAhead`]), asks for the `x` and `dy` lines
/// that far ahead of each vector, as pass B does.
/// The order is that of `fold_row`: a flush after every [`BLOCK`] vectors,
/// the last partial chunk padded with zeros and only its real lanes kept,
/// in the last block when that is not full.
/// `gain` is padded to whole vectors.
///
/// Pass B reads the row again (from cache) rather than terms kept from
/// pass A: the kernel is limited by its stores, and a scratch row of terms
/// adds stores of its own, however small it is (PERFORMANCE.md, "Tried and
/// left out").
#[cfg_attr(not(debug_assertions), inline(always))]
fn pass_a<A: KernelScalar, V: Vector, E: Deviate<V>, const G_SUM: bool, const SQUARES: bool>(
    (x, dy, gain): (&[A], &[A], &[f64]),
    deviate: E,
    ahead: RowAhead,
) -> RowSums<V> {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn step<V: Vector, const G_SUM: bool, const SQUARES: bool>(
        ((g_sum, ge_sum), squares): RowSums<V>,
        (e, dy, gain): (V, V, V),
    ) -> RowSums<V> {
        let g = gain * dy;
        let g_sum = if G_SUM { g_sum.add(g) } else { g_sum };
        let squares = if SQUARES {
            squares.add_square(e)
        } else {
            squares
        };
        ((g_sum, ge_sum.add(g * e)), squares)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn flush<V: Vector>(((g_sum, ge_sum), squares): RowSums<V>) -> RowSums<V> {
        ((g_sum.flush(), ge_sum.flush()), squares.flush())
    }
    /// The last, partial chunk's `(e, dy, gain)`.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn tail_values<A: KernelScalar, V: Vector, E: Deviate<V>>(
        (x, dy, gain): (&[A], &[A], &[f64; LANES]),
        deviate: E,
    ) -> (V, V, V) {
        (
            deviate.deviation(A::load_partial(x)),
            A::load_partial(dy),
            V::load_f64(gain),
        )
    }

    let (x_chunks, x_tail) = x.as_chunks::<LANES>();
    let (dy_chunks, dy_tail) = dy.as_chunks::<LANES>();
    // One more gain vector than whole `x` vectors when a partial one ends
    // the row: the zips below stop at the shorter side.
    let (gain_chunks, _) = gain.as_chunks::<LANES>();
    let zero = BlockedSum::new();
    let mut sums = ((zero, zero), zero);
    // The partial chunk, with the padded gain vector after the whole ones.
    let tail = match gain_chunks.get(x_chunks.len()) {
        Some(gain) if !x_tail.is_empty() => Some((x_tail, dy_tail, gain)),
        _ => None,
    };
    // Slices of one length, zipped by value: the loop is a plain index
    // loop with its state in registers.
    let blocks = x_chunks.chunks(BLOCK).zip(dy_chunks.chunks(BLOCK));
    for ((x, dy), gain) in blocks.zip(gain_chunks.chunks(BLOCK)) {
        for ((x, dy), gain) in x.iter().zip(dy).zip(gain) {
            prefetch_inputs(ahead, x, dy);
            let values = (
                deviate.deviation(A::load(x)),
                A::load(dy),
                V::load_f64(gain),
            );
            sums = step::<V, G_SUM, SQUARES>(sums, values);
        }
        if let (true, Some(tail)) = (x.len() < BLOCK, tail) {
            let update = step::<V, G_SUM, SQUARES>(sums, tail_values(tail, deviate));
            return flush(update.blend(sums, x_tail.len()));
        }
        sums = flush(sums);
    }
    if let Some(tail) = tail {
        let update = flush(step::<V, G_SUM, SQUARES>(sums, tail_values(tail, deviate)));
        sums = update.blend(sums, x_tail.len());
    }
    sums
}

/// One vector of a row's `dx` in pass B (a struct, not a closure).
trait Gradient<V>: Copy {
    /// Whether the row adds `dy` to `dβ`.
    const WITH_BETA: bool;
    /// `(dx, n)` from a vector of deviations and of `g`.
    fn apply(self, e: V, g: V) -> (V, V);
}

/// LayerNorm: `n = (e - shift) · inv_std`,
/// `dx = ((g - mean(g)) - n · mean(g ⊙ n)) · rstd`.
#[derive(Clone, Copy)]
struct LayerNormGradient<V> {
    shift: V,
    inv_std: V,
    mean_g: V,
    mean_gn: V,
    rstd: V,
}

impl<V: Vector> Gradient<V> for LayerNormGradient<V> {
    const WITH_BETA: bool = true;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn apply(self, e: V, g: V) -> (V, V) {
        let n = (e - self.shift) * self.inv_std;
        (((g - self.mean_g) - n * self.mean_gn) * self.rstd, n)
    }
}

/// RMSNorm: `n = e · inv_rms`, `dx = (g - n · mean(g ⊙ n)) · rrms`.
#[derive(Clone, Copy)]
struct RmsNormGradient<V> {
    inv_rms: V,
    mean_gn: V,
    rrms: V,
}

impl<V: Vector> Gradient<V> for RmsNormGradient<V> {
    const WITH_BETA: bool = false;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn apply(self, e: V, g: V) -> (V, V) {
        let n = e * self.inv_rms;
        ((g - n * self.mean_gn) * self.rrms, n)
    }
}

/// A rescaled row (see [`RowCentring`]) whose `rstd = inv_std · scale`
/// overflows although its `dx` need not: its spread (LayerNorm) or root
/// mean square (RMSNorm) lies below the normal range, with `eps = 0`. `G`
/// forms `dx` with `inv_std` for `rstd`, and the power of two `scale` comes
/// after, so that `dx` overflows only where its value does. Wherever
/// `inv_std · scale` is finite, multiplying by `scale` first or last gives
/// the same bits, so only these rows take this form.
#[derive(Clone, Copy)]
struct ScaledLast<G, V> {
    gradient: G,
    scale: V,
}

impl<V: Vector, G: Gradient<V>> Gradient<V> for ScaledLast<G, V> {
    const WITH_BETA: bool = G::WITH_BETA;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn apply(self, e: V, g: V) -> (V, V) {
        let (dx, n) = self.gradient.apply(e, g);
        (dx * self.scale, n)
    }
}

/// The factor of a row's `dx`, `inv · scale` (`rstd` or `rrms`), where it
/// is finite; otherwise `inv`, with the `scale` to apply last
/// ([`ScaledLast`]).
#[cfg_attr(not(debug_assertions), inline(always))]
fn dx_factor(inv: f64, scale: f64) -> (f64, Option<f64>) {
    let factor = inv * scale;
    if factor.is_finite() {
        (factor, None)
    } else {
        (inv, Some(scale))
    }
}

/// [`pass_b`] with `gradient`, and with the scale `last` of [`dx_factor`]
/// applied after it where there is one.
#[cfg_attr(not(debug_assertions), inline(always))]
fn scaled_pass_b<A: KernelScalar, V: Vector, E: Deviate<V>, G: Gradient<V>, S: Store>(
    row: (&[A], &[A], &[f64]),
    dx: &mut [A],
    ahead: RowAhead,
    partials: &mut Partials,
    deviate: E,
    gradient: G,
    last: Option<f64>,
) {
    match last {
        None => pass_b::<A, V, E, G, S>(row, dx, ahead, partials, deviate, gradient),
        Some(scale) => {
            let gradient = ScaledLast {
                gradient,
                scale: V::splat(scale),
            };
            pass_b::<A, V, E, _, S>(row, dx, ahead, partials, deviate, gradient);
        }
    }
}

/// A row without a derivative (`eps = 0` and a constant, or all-zero, row):
/// `dx` is NaN, and the normalised output, 0 whatever the gain, adds
/// `dy · 0` to `dγ` (0, or NaN for a non-finite `dy`).
#[derive(Clone, Copy)]
struct Singular<const WITH_BETA: bool>;

impl<V: Vector, const WITH_BETA: bool> Gradient<V> for Singular<WITH_BETA> {
    const WITH_BETA: bool = WITH_BETA;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn apply(self, _e: V, _g: V) -> (V, V) {
        (V::splat(f64::NAN), V::splat(0.0))
    }
}

/// How far ahead pass B asks the cache for rows, in elements from each
/// chunk it works on (`None` in calls that fit in cache).
///
/// Passes 1 and A of a row are the first to read it; out of cache they
/// wait for memory, while pass B of an earlier row works from cache. Asked
/// for during that pass B, the row [`cache::rows_ahead`] ahead (about 4 KiB
/// on, so that short rows are asked for early enough; it may lie in the next
/// block, or past the end, which a hint allows) is in L2 when its turn
/// comes, and the lines of its `dx` are owned, so that the stores do not
/// wait for them. Into L2 rather than L1: the row is read a while later,
/// and its lines in L1 would crowd out those of the rows in use, which
/// long `f32` rows feel most.
///
/// Pass A asks for the same lines as pass B: with the hints in pass B
/// alone, the row ahead is still on its way from memory when its turn
/// comes wherever the row's arithmetic is short next to its bytes.
///
/// A streamed `dx` ([`Inputs::stream`]) gets no hint: its lines are not
/// read, and a hint would fetch the very lines the stores bypass
/// (PERFORMANCE.md, "Backward passes").
///
/// The forward walk's [`cache::Ahead`] is the same idea for one input
/// asked into L1; backward keeps its own for its two inputs asked into L2.
type RowAhead = Option<usize>;

/// The [`RowAhead`] of a block's rows.
#[cfg_attr(not(debug_assertions), inline(always))]
fn ahead<A>(inputs: &Inputs<'_, A>) -> RowAhead {
    let d = inputs.d;
    inputs
        .prefetch
        .then(|| cache::rows_ahead::<A>(d).saturating_mul(d))
}

/// Asks the cache for the lines `ahead` elements past a vector of `x` and
/// of `dy` (to read, into L2) when there is such a distance.
#[cfg_attr(not(debug_assertions), inline(always))]
fn prefetch_inputs<A>(ahead: RowAhead, x: &[A; LANES], dy: &[A; LANES]) {
    if let Some(offset) = ahead {
        cache::into_l2_for_reading(x.as_ptr().wrapping_add(offset), LANES);
        cache::into_l2_for_reading(dy.as_ptr().wrapping_add(offset), LANES);
    }
}

/// [`prefetch_inputs`], and the lines of `dx` as far ahead (to write)
/// unless `S` stores past the caches.
#[cfg_attr(not(debug_assertions), inline(always))]
fn prefetch<A, S: Store>(ahead: RowAhead, x: &[A; LANES], dy: &[A; LANES], dx: &[A; LANES]) {
    prefetch_inputs(ahead, x, dy);
    if let (Some(offset), false) = (ahead, S::PAST_CACHES) {
        cache::for_writing(dx.as_ptr().wrapping_add(offset), LANES);
    }
}

/// Pass B over a row: writes `dx` and adds `dyᵢ · nᵢ` to `dgamma[i]` (and
/// `dyᵢ` to `dbeta[i]` where the gradient says so), element by element.
/// `e` and `g` are formed as in pass A.
///
/// Each element's step depends on that element and feature only, so the
/// vectors may start anywhere in the row: a streamed row
/// ([`Inputs::stream`], `S` = [`Streaming`]) takes the elements before
/// `dx`'s first line as a head, alone in a partial vector, and the rest in
/// vectors that start on that line, whose whole lines then go past the
/// caches. The per-feature buffers hold a vector more than the row needs
/// ([`padded_len`]), so those vectors still cover the row. The head, and
/// the partial vector that ends the row, are stored with plain stores, or
/// kept in `partials` where [`backward_rows`] joins them into one line
/// ([`SharedLine`]).
#[cfg_attr(not(debug_assertions), inline(always))]
fn pass_b<A: KernelScalar, V: Vector, E: Deviate<V>, G: Gradient<V>, S: Store>(
    (x, dy, gain): (&[A], &[A], &[f64]),
    dx: &mut [A],
    ahead: RowAhead,
    partials: &mut Partials,
    deviate: E,
    gradient: G,
) {
    let Partials {
        dgamma,
        dbeta,
        shared,
    } = partials;
    let (dgamma, dbeta) = (dgamma.as_mut_slice(), dbeta.as_mut_slice());
    let row = (x, dy, gain);
    let kept_tail = shared.keep_tail.then_some(&mut shared.tail);
    if !S::PAST_CACHES {
        let partials = (dgamma, dbeta);
        let edge = (deviate, gradient, kept_tail);
        return pass_b_body::<A, V, E, G, S>(row, dx, ahead, partials, edge);
    }
    let head = cache::before_first_line(dx);
    if head > 0 {
        let chunks = (
            gain.first_chunk::<LANES>(),
            dgamma.first_chunk_mut::<LANES>(),
            dbeta.first_chunk_mut::<LANES>(),
        );
        if let (Some(g), Some(dgamma), Some(dbeta)) = chunks {
            let row = (&x[..head], &dy[..head], g);
            let value = partial_vector(row, (dgamma, dbeta), deviate, gradient);
            if shared.keep_head {
                value.store_f64(&mut shared.head);
            } else {
                A::store_partial(value, &mut dx[..head]);
            }
        }
    }
    let rest = (&x[head..], &dy[head..], &gain[head..]);
    let partials = (&mut dgamma[head..], &mut dbeta[head..]);
    let dx = &mut dx[head..];
    let edge = (deviate, gradient, kept_tail);
    pass_b_body::<A, V, E, G, S>(rest, dx, ahead, partials, edge);
}

/// [`pass_b`] from the first element that starts a vector, whole vectors
/// of `dx` stored by `S`.
#[cfg_attr(not(debug_assertions), inline(always))]
fn pass_b_body<A: KernelScalar, V: Vector, E: Deviate<V>, G: Gradient<V>, S: Store>(
    (x, dy, gain): (&[A], &[A], &[f64]),
    dx: &mut [A],
    ahead: RowAhead,
    (dgamma, dbeta): (&mut [f64], &mut [f64]),
    (deviate, gradient, kept_tail): (E, G, Option<&mut [f64; LANES]>),
) {
    let (dgamma, _) = dgamma.as_chunks_mut::<LANES>();
    let (dbeta, _) = dbeta.as_chunks_mut::<LANES>();
    let (gain, _) = gain.as_chunks::<LANES>();
    let (x_chunks, x_tail) = x.as_chunks::<LANES>();
    let (dy_chunks, dy_tail) = dy.as_chunks::<LANES>();
    let (dx_chunks, dx_tail) = dx.as_chunks_mut::<LANES>();
    let whole = x_chunks.len();
    {
        // Slice iterators zipped by value: a plain index loop with its
        // state in registers.
        let sums = gain.iter().zip(dgamma.iter_mut()).zip(dbeta.iter_mut());
        let rows = dx_chunks.iter_mut().zip(x_chunks).zip(dy_chunks);
        for (((dx, x), dy), ((g, dgamma), dbeta)) in rows.zip(sums) {
            prefetch::<A, S>(ahead, x, dy, dx);
            let dy = A::load::<V>(dy);
            let e = deviate.deviation(A::load(x));
            let (value, n) = gradient.apply(e, V::load_f64(g) * dy);
            S::store(value, dx);
            accumulate::<V, G>(dy, n, dgamma, dbeta);
        }
    }
    if dx_tail.is_empty() {
        return;
    }
    // Present: the buffers are padded for it (`padded_len`).
    debug_assert!(gain.len() > whole && dgamma.len() > whole);
    if let (Some(g), Some(dgamma), Some(dbeta)) =
        (gain.get(whole), dgamma.get_mut(whole), dbeta.get_mut(whole))
    {
        let value = partial_vector((x_tail, dy_tail, g), (dgamma, dbeta), deviate, gradient);
        match kept_tail {
            Some(kept) => value.store_f64(kept),
            None => A::store_partial(value, dx_tail),
        }
    }
}

/// Pass B over fewer elements than a vector (a streamed row's head, or a
/// row's last, partial chunk), with the vector of gains and partials that
/// starts at its first one: returns their `dx` in the first lanes, for the
/// caller to store. Only the elements' own partials change: past a
/// head come the features of the row's body, where the unused lanes'
/// `0 · n` could be NaN (`n` is infinite for `x = 0` on a constant row of
/// huge values with a tiny `eps`).
#[cfg_attr(not(debug_assertions), inline(always))]
fn partial_vector<A: KernelScalar, V: Vector, E: Deviate<V>, G: Gradient<V>>(
    (x, dy, gain): (&[A], &[A], &[f64; LANES]),
    (dgamma, dbeta): (&mut [f64; LANES], &mut [f64; LANES]),
    deviate: E,
    gradient: G,
) -> V {
    let dy = A::load_partial::<V>(dy);
    let e = deviate.deviation(A::load_partial(x));
    let (value, n) = gradient.apply(e, V::load_f64(gain) * dy);
    let active = x.len();
    let old = V::load_f64(dgamma);
    (old + dy * n).blend(old, active).store_f64(dgamma);
    if G::WITH_BETA {
        let old = V::load_f64(dbeta);
        (old + dy).blend(old, active).store_f64(dbeta);
    }
    value
}

/// `dgamma += dy · n` and, where the gradient says so, `dbeta += dy`.
#[cfg_attr(not(debug_assertions), inline(always))]
fn accumulate<V: Vector, G: Gradient<V>>(
    dy: V,
    n: V,
    dgamma: &mut [f64; LANES],
    dbeta: &mut [f64; LANES],
) {
    (V::load_f64(dgamma) + dy * n).store_f64(dgamma);
    if G::WITH_BETA {
        (V::load_f64(dbeta) + dy).store_f64(dbeta);
    }
}

/// LayerNorm backward of a block of rows (`dx` holds as many rows as
/// `inputs`): writes `dx` and adds each row's `dy ⊙ n` and `dy` to
/// `partials` in row order.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn layer_norm_backward_block<A: KernelScalar, V: Vector>(
    inputs: Inputs<'_, A>,
    dx: &mut [A],
    saved: Saved<'_, RowCentring>,
    partials: &mut Partials,
) {
    backward_block::<A, V, _>(inputs, dx, saved, partials);
}

/// The backward block kernel of the norm whose statistics are `T`, with
/// the kind of store for `dx` chosen once per block, so that each row loop
/// is compiled for one.
#[cfg_attr(not(debug_assertions), inline(always))]
fn backward_block<A: KernelScalar, V: Vector, T: BackwardRow>(
    inputs: Inputs<'_, A>,
    dx: &mut [A],
    saved: Saved<'_, T>,
    partials: &mut Partials,
) {
    if inputs.stream {
        backward_rows::<A, V, Streaming, _>(inputs, dx, saved, partials);
        cache::after_streaming();
    } else {
        backward_rows::<A, V, Plain, _>(inputs, dx, saved, partials);
    }
}

/// Saved statistics of a row, and the backward kernel of the norm they
/// belong to: [`RowCentring`] for LayerNorm, [`RowScaling`] for RMSNorm.
// A trait rather than a closure: a closure that the optimiser keeps out
// of line is compiled without the instruction set of the kernel that
// calls it, and then every vector intrinsic in it becomes a call.
trait BackwardRow: Copy {
    /// Backward of row `index` of a block, with its statistics `saved` or
    /// computed.
    fn backward_row<A: KernelScalar, V: Vector, S: Store>(
        saved: Saved<'_, Self>,
        index: usize,
        row: (&[A], &[A], &[f64]),
        dx: &mut [A],
        ahead: RowAhead,
        partials: &mut Partials,
    );
    /// The power of two the row was rescaled by (1 for most rows).
    fn scale(self) -> f64;
    /// Backward of a row from these statistics, its data multiplied by
    /// [`BackwardRow::scale`] if `SCALED` (which must be [`is_scaled`] of it).
    fn backward_from_saved<A: KernelScalar, V: Vector, S: Store, const SCALED: bool>(
        self,
        row: RowInputs<'_, A>,
        dx: &mut [A],
        ahead: RowAhead,
        partials: &mut Partials,
    );
}

impl BackwardRow for RowCentring {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn backward_row<A: KernelScalar, V: Vector, S: Store>(
        saved: Saved<'_, Self>,
        index: usize,
        row: (&[A], &[A], &[f64]),
        dx: &mut [A],
        ahead: RowAhead,
        partials: &mut Partials,
    ) {
        match saved {
            Saved::Compute(eps) => {
                layer_norm_backward_row::<A, V, S>(row, dx, eps, ahead, partials);
            }
            Saved::Rows(rows) => {
                let stats = rows.get(index).copied().unwrap_or(RowCentring::NOT_FINITE);
                backward_saved::<A, V, S, _>(row, dx, stats, ahead, partials);
            }
        }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn scale(self) -> f64 {
        self.scale
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn backward_from_saved<A: KernelScalar, V: Vector, S: Store, const SCALED: bool>(
        self,
        row: RowInputs<'_, A>,
        dx: &mut [A],
        ahead: RowAhead,
        partials: &mut Partials,
    ) {
        let deviate = FromBase::<V, SCALED>::new(self.scale, self.mean.base);
        let (sums, _) = pass_a::<A, V, _, true, false>(row, deviate, ahead);
        layer_norm_pass_b::<A, V, S, SCALED>(row, dx, self, sums, ahead, partials);
    }
}

impl BackwardRow for RowScaling {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn backward_row<A: KernelScalar, V: Vector, S: Store>(
        saved: Saved<'_, Self>,
        index: usize,
        row: (&[A], &[A], &[f64]),
        dx: &mut [A],
        ahead: RowAhead,
        partials: &mut Partials,
    ) {
        match saved {
            Saved::Compute(eps) => rms_norm_backward_row::<A, V, S>(row, dx, eps, ahead, partials),
            Saved::Rows(rows) => {
                let stats = rows.get(index).copied().unwrap_or(RowScaling::NOT_FINITE);
                backward_saved::<A, V, S, _>(row, dx, stats, ahead, partials);
            }
        }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn scale(self) -> f64 {
        self.scale
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn backward_from_saved<A: KernelScalar, V: Vector, S: Store, const SCALED: bool>(
        self,
        row: RowInputs<'_, A>,
        dx: &mut [A],
        ahead: RowAhead,
        partials: &mut Partials,
    ) {
        let deviate = Scaled::<V, SCALED>::new(self.scale);
        let ((_, gx_sum), _) = pass_a::<A, V, _, false, false>(row, deviate, ahead);
        rms_norm_pass_b::<A, V, S, SCALED>(row, dx, self, gx_sum, ahead, partials);
    }
}

/// Backward of each row of a block, in order, with `dx` stored by `S`.
/// Where `S` streams `dx` and a vector is one cache line, the line each
/// row shares with the next is kept by pass B and written here, joined
/// ([`SharedLine`]); the block's first head and last tail, whose lines it
/// shares with other blocks, are stored by pass B.
#[cfg_attr(not(debug_assertions), inline(always))]
fn backward_rows<A: KernelScalar, V: Vector, S: Store, T: BackwardRow>(
    inputs: Inputs<'_, A>,
    dx: &mut [A],
    saved: Saved<'_, T>,
    partials: &mut Partials,
) {
    let ahead = ahead(&inputs);
    let Inputs { x, dy, d, gain, .. } = inputs;
    if d == 0 {
        return;
    }
    let rows = (x.len() / d).min(dy.len() / d).min(dx.len() / d);
    // Every row of `LANES` or more elements holds the start of a line, and
    // a row's tail starts on one: a kept tail and the next row's head, which
    // ends where a line starts, make up exactly one line.
    let joins_lines = S::PAST_CACHES && size_of::<A>() * LANES == cache::LINE && d >= LANES;
    let mut kept_tail = 0;
    for index in 0..rows {
        let start = index * d;
        let row = (&x[start..start + d], &dy[start..start + d], gain);
        let row_dx = &mut dx[start..start + d];
        let tail = if joins_lines {
            (d - cache::before_first_line(row_dx)) % LANES
        } else {
            0
        };
        // This row's pass B may keep its own tail in its place.
        let previous_tail = (kept_tail > 0).then_some(partials.shared.tail);
        partials.shared.keep_head = kept_tail > 0;
        partials.shared.keep_tail = tail > 0 && index + 1 < rows;
        T::backward_row::<A, V, S>(saved, index, row, row_dx, ahead, partials);
        if let Some(previous_tail) = previous_tail {
            let line = partials.shared.joined(&previous_tail, kept_tail);
            let line_start = start - kept_tail;
            if let Some(line_dx) = dx[line_start..].first_chunk_mut::<LANES>() {
                S::store(V::load_f64(&line), line_dx);
            }
        }
        kept_tail = if partials.shared.keep_tail { tail } else { 0 };
    }
}

/// LayerNorm backward of one row, its statistics computed on the way: pass
/// 1 of the exact centring, then pass A also sums `Σ (xᵢ - base)²`, the
/// centring's pass 2, so the statistics (those of
/// [`exact_centring`](super::portable)) cost one pass over the row.
// Out of line in unoptimised builds only: there every vector temporary
// gets its own stack slot, and a trampoline holding all the row kernels
// would outgrow a test thread's stack. Optimised builds inline everything.
#[cfg_attr(debug_assertions, inline(never))]
#[cfg_attr(not(debug_assertions), inline(always))]
fn layer_norm_backward_row<A: KernelScalar, V: Vector, S: Store>(
    row: (&[A], &[A], &[f64]),
    dx: &mut [A],
    eps: f64,
    ahead: RowAhead,
    partials: &mut Partials,
) {
    let x = row.0;
    let (mean, magnitude) = match centring_first_pass::<A, V>(x, eps) {
        FirstPass::Finished(centring) => {
            let stats = RowCentring::from_centring(x, centring, eps);
            return backward_saved::<A, V, S, _>(row, dx, stats, ahead, partials);
        }
        FirstPass::Deviations { mean, magnitude } => (mean, magnitude),
    };
    let (base, shift) = (mean.base, mean.shift);
    let deviate = FromBase::<V, false>::new(1.0, base);
    let ((g_sum, ge_sum), squares) = pass_a::<A, V, _, true, true>(row, deviate, ahead);
    let d = x.len() as f64;
    let var = match variance(squares.plain_total(), d, shift, eps) {
        Variance::Short(var) => var,
        Variance::Centred => centred_square_sum::<A, V>(x, base, shift) / d,
        Variance::Rescale => {
            let stats =
                RowCentring::from_centring(x, rescaled_centring::<A, V>(x, eps, magnitude), eps);
            return backward_saved::<A, V, S, _>(row, dx, stats, ahead, partials);
        }
    };
    let stats = RowCentring::from_centring(x, mean.centring(1.0, inverse_root(var, eps, 1.0)), eps);
    // Statistics of the unscaled row: scale 1.
    layer_norm_pass_b::<A, V, S, false>(row, dx, stats, (g_sum, ge_sum), ahead, partials);
}

/// Backward of one row from its saved statistics `stats`, in its
/// [island](FromSaved).
#[cfg_attr(not(debug_assertions), inline(always))]
fn backward_saved<A: KernelScalar, V: Vector, S: Store, T: BackwardRow>(
    row: RowInputs<'_, A>,
    dx: &mut [A],
    stats: T,
    ahead: RowAhead,
    partials: &mut Partials,
) {
    V::island::<FromSaved<A, S, T>>((row, dx, stats, ahead, partials));
}

/// [`BackwardRow::backward_from_saved`] as an [`Island`]: called from three sites
/// per kernel, compiled once per vector type, store kind and norm. A
/// rescaled row (rare: its squares overflow or underflow) takes the
/// portable path, which has the same bits, so that no vector body is
/// compiled for it.
struct FromSaved<A, S, T>(PhantomData<(A, S, T)>);

impl<A: KernelScalar, S: Store, T: BackwardRow> Island for FromSaved<A, S, T> {
    type Args<'a> = (RowInputs<'a, A>, &'a mut [A], T, RowAhead, &'a mut Partials);
    type Output = ();
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn run<V: Vector>((row, dx, stats, ahead, partials): Self::Args<'_>) {
        if is_scaled(stats.scale()) {
            rescaled_from_saved::<A, S, T>(row, dx, stats, ahead, partials);
        } else {
            stats.backward_from_saved::<A, V, S, false>(row, dx, ahead, partials);
        }
    }
}

/// [`BackwardRow::backward_from_saved`] of a rescaled row, on the portable path.
#[inline(never)]
fn rescaled_from_saved<A: KernelScalar, S: Store, T: BackwardRow>(
    row: RowInputs<'_, A>,
    dx: &mut [A],
    stats: T,
    ahead: RowAhead,
    partials: &mut Partials,
) {
    stats.backward_from_saved::<A, Portable, S, true>(row, dx, ahead, partials);
}

#[cfg_attr(not(debug_assertions), inline(always))]
fn layer_norm_pass_b<A: KernelScalar, V: Vector, S: Store, const SCALED: bool>(
    row: (&[A], &[A], &[f64]),
    dx: &mut [A],
    stats: RowCentring,
    (g_sum, ge_sum): (BlockedSum<V>, BlockedSum<V>),
    ahead: RowAhead,
    partials: &mut Partials,
) {
    let RowCentring {
        scale,
        mean:
            Split {
                shift,
                nearest,
                rest,
                ..
            },
        inv_std,
    } = stats;
    debug_assert_eq!(SCALED, is_scaled(scale));
    let deviate = FromBase::<V, SCALED>::new(scale, nearest);
    if inv_std.is_infinite() {
        return pass_b::<A, V, _, _, S>(row, dx, ahead, partials, deviate, Singular::<true>);
    }
    let d = dx.len();
    let g_total = g_sum.plain_total();
    let gn_total = (ge_sum.plain_total() - shift * g_total) * inv_std;
    let (rstd, last) = dx_factor(inv_std, scale);
    // With a scale of 1, `dx_factor` is `inv_std` itself, finite here.
    debug_assert!(SCALED || last.is_none());
    let gradient = LayerNormGradient {
        shift: V::splat(rest),
        inv_std: V::splat(inv_std),
        mean_g: V::splat(mean_over(g_total, d)),
        mean_gn: V::splat(mean_over(gn_total, d)),
        rstd: V::splat(rstd),
    };
    scaled_pass_b::<A, V, _, _, S>(row, dx, ahead, partials, deviate, gradient, last);
}

/// `total / d`, the mean of a row's terms. Where `d` is a power of two, as
/// a multiplication by `2⁻ᵏ = 1/d`: both operations round the same real
/// number, so the bits are those of the division, also below the normal
/// range. The division's latency sits on the path from pass A's sums to
/// every vector of pass B, once per row, which short rows feel.
#[cfg_attr(not(debug_assertions), inline(always))]
fn mean_over(total: f64, d: usize) -> f64 {
    if d.is_power_of_two() {
        // 2⁻ᵏ for k < 64: a normal f64, built exactly from its exponent.
        let reciprocal = f64::from_bits(u64::from(1023 - d.trailing_zeros()) << 52);
        total * reciprocal
    } else {
        total / d as f64
    }
}

/// RMSNorm backward of a block of rows: writes `dx` and adds each row's
/// `dy ⊙ n` to `partials.dgamma` in row order.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn rms_norm_backward_block<A: KernelScalar, V: Vector>(
    inputs: Inputs<'_, A>,
    dx: &mut [A],
    saved: Saved<'_, RowScaling>,
    partials: &mut Partials,
) {
    backward_block::<A, V, _>(inputs, dx, saved, partials);
}

/// RMSNorm backward of one row, its statistics computed on the way: pass A
/// also sums `Σ xᵢ²`, which is all that [`rms_scaling`] needs of a row that
/// is not rescaled.
// See `layer_norm_backward_row`.
#[cfg_attr(debug_assertions, inline(never))]
#[cfg_attr(not(debug_assertions), inline(always))]
fn rms_norm_backward_row<A: KernelScalar, V: Vector, S: Store>(
    row: (&[A], &[A], &[f64]),
    dx: &mut [A],
    eps: f64,
    ahead: RowAhead,
    partials: &mut Partials,
) {
    let x = row.0;
    let deviate = Scaled::<V, false>::new(1.0);
    let ((_, gx_sum), squares) = pass_a::<A, V, _, false, true>(row, deviate, ahead);
    // Below, the scale of every `Some` scaling is 1.
    if x.len() <= SHORT_ROW {
        // Short rows: the forward kernel's own scale where it has one (see
        // `rms_scaling`), so that it has the bits the training forward saves.
        if let Some(scaling) = short::rms_scaling(x, eps) {
            let stats = RowScaling::from_scaling(Some(scaling));
            rms_norm_pass_b::<A, V, S, false>(row, dx, stats, gx_sum, ahead, partials);
            return;
        }
    }
    match rms_from_squares(squares.plain_total(), x.len() as f64, eps) {
        Some(scaling) => {
            let stats = RowScaling::from_scaling(Some(scaling));
            rms_norm_pass_b::<A, V, S, false>(row, dx, stats, gx_sum, ahead, partials);
        }
        None => {
            let stats = RowScaling::from_scaling(rescaled_rms_scaling::<A, V>(x, eps));
            backward_saved::<A, V, S, _>(row, dx, stats, ahead, partials);
        }
    }
}

#[cfg_attr(not(debug_assertions), inline(always))]
fn rms_norm_pass_b<A: KernelScalar, V: Vector, S: Store, const SCALED: bool>(
    row: (&[A], &[A], &[f64]),
    dx: &mut [A],
    stats: RowScaling,
    gx_sum: BlockedSum<V>,
    ahead: RowAhead,
    partials: &mut Partials,
) {
    let RowScaling { scale, inv_rms } = stats;
    debug_assert_eq!(SCALED, is_scaled(scale));
    let deviate = Scaled::<V, SCALED>::new(scale);
    if inv_rms.is_infinite() {
        return pass_b::<A, V, _, _, S>(row, dx, ahead, partials, deviate, Singular::<false>);
    }
    let gn_total = gx_sum.plain_total() * inv_rms;
    let (rrms, last) = dx_factor(inv_rms, scale);
    // With a scale of 1, `dx_factor` is `inv_rms` itself, finite here.
    debug_assert!(SCALED || last.is_none());
    let gradient = RmsNormGradient {
        inv_rms: V::splat(inv_rms),
        mean_gn: V::splat(mean_over(gn_total, dx.len())),
        rrms: V::splat(rrms),
    };
    if SCALED {
        scaled_pass_b::<A, V, _, _, S>(row, dx, ahead, partials, deviate, gradient, last);
    } else {
        pass_b::<A, V, _, _, S>(row, dx, ahead, partials, deviate, gradient);
    }
}

#[cfg(test)]
mod tests {
    use super::super::simd::Portable;
    use super::*;

    #[test]
    fn means_over_powers_of_two_have_the_bits_of_the_division() {
        let totals = [
            0.1,
            -7.25e300,
            3.0e-310,
            -f64::MIN_POSITIVE,
            f64::from_bits(1),
            1.0 / 3.0,
            f64::MAX,
            f64::INFINITY,
            -0.0,
        ];
        for k in 0..usize::BITS {
            let d = 1usize << k;
            for total in totals {
                let divided = total / d as f64;
                assert_eq!(
                    mean_over(total, d).to_bits(),
                    divided.to_bits(),
                    "{total} / {d}"
                );
            }
        }
        assert!(mean_over(f64::NAN, 64).is_nan());
        assert_eq!(mean_over(1.0, 768).to_bits(), (1.0f64 / 768.0).to_bits());
    }

    #[test]
    fn column_sum_keeps_what_plain_sum_drops() {
        let mut sum = ColumnSum::new(1);
        for v in [1e16, 1.0, -1e16, 1.0] {
            sum.add(&[v]);
        }
        assert_eq!(sum.total(|v| v), vec![2.0]);
    }

    #[test]
    fn constant_row_keeps_its_value_as_mean() {
        // 0.1 + 0.1 + 0.1 = 0.30000000000000004 in f64, so a mean formed as
        // sum / d would not be 0.1.
        let stats = |x: &[f64], eps| {
            RowCentring::from_centring(x, exact_centring::<f64, Portable>(x, eps), eps)
        };
        assert_eq!(stats(&[0.1, 0.1, 0.1], 0.25).mean(), 0.1);
        assert_eq!(stats(&[0.1, 0.1, 0.1], 0.25).rstd(), 2.0);
        assert_eq!(stats(&[0.1; 3], 0.0).rstd(), f64::INFINITY);
    }

    #[test]
    fn zero_row_without_eps_has_infinite_inverse_rms() {
        let rrms =
            |eps| RowScaling::from_scaling(rms_scaling::<f32, Portable>(&[0.0; 4], eps)).rrms();
        assert_eq!(rrms(0.0), f64::INFINITY);
        assert_eq!(rrms(0.25), 2.0);
    }

    #[test]
    fn partials_cover_the_row_in_whole_vectors_after_any_head() {
        for d in [1, 2, LANES - 1, LANES, LANES + 1, 3 * LANES + 5, 1000] {
            let partials = Partials::new(d);
            let len = partials.dgamma.as_slice().len();
            assert_eq!(len, partials.dbeta.as_slice().len());
            assert_eq!(len % LANES, 0, "d {d}");
            // A streamed row's head is shorter than a vector.
            for head in 0..LANES.min(d + 1) {
                let body = (d - head).div_ceil(LANES) * LANES;
                assert!(head + body <= len, "d {d} head {head}");
            }
        }
    }

    #[test]
    fn line_aligned_values_start_on_a_line_and_are_zeros() {
        let mut values = LineAligned::zeros(3);
        for len in [0, 1, 16, 17, 1000, 5, 100_000] {
            values.as_mut_slice().fill(1.0);
            values.reset(len, 0);
            let slice = values.as_slice();
            assert_eq!(slice.len(), len);
            assert_eq!(slice.as_ptr() as usize % cache::LINE, 0, "len {len}");
            assert!(slice.iter().all(|&v| v == 0.0));
        }
        for first in 0..2 * LANES {
            for clear in [true, false] {
                values.as_mut_slice().fill(1.0);
                if clear {
                    values.clear(first);
                } else {
                    values.reset(40, first);
                }
                let slice = values.as_slice();
                assert_eq!(slice.len(), if clear { 100_000 } else { 40 });
                let line = slice.as_ptr().wrapping_add(first) as usize % cache::LINE;
                assert_eq!(line, 0, "first {first}, clear {clear}");
                assert!(slice.iter().all(|&v| v == 0.0));
            }
            values.reset(100_000, 0);
        }
    }

    /// The row sums of pass A are blocked sums. Terms `g` = 2⁵³ then
    /// ones: lane 0 gets elements 0, 16, 32, …, and its first block sum
    /// (8 vectors) loses the 7 ones after 2⁵³ (2⁵³ + 1 rounds to 2⁵³); the
    /// blocks' totals are compensated, so every other one is kept.
    #[test]
    fn row_sums_lose_at_most_a_block_per_lane() {
        let d = 16 * LANES * BLOCK; // 16 blocks of 8 vectors
        let big = 2.0_f64.powi(53);
        let dy: Vec<f64> = (0..d).map(|i| if i == 0 { big } else { 1.0 }).collect();
        let x = vec![0.0; d];
        let gain = Gain::Gamma(&vec![1.0; d]).widened();
        let deviate = FromBase::<Portable, false>::new(1.0, 0.0);
        let row = (&x[..], &dy[..], &gain[..]);
        let ((g_sum, _), _) = pass_a::<f64, Portable, _, true, false>(row, deviate, None);
        assert_eq!(g_sum.plain_total(), big + (d - 1 - (BLOCK - 1)) as f64);
    }

    /// The sums of pass A keep only the real lanes of the last, partial
    /// chunk.
    #[test]
    fn pass_a_sums_every_element_once() {
        let d = 2 * LANES + 3;
        let x: Vec<f64> = (0..d).map(|i| (i % 5) as f64).collect();
        let dy: Vec<f64> = (0..d).map(|i| i as f64 - 4.0).collect();
        let weights: Vec<f64> = (0..d).map(|i| 0.5 + (i % 3) as f64).collect();
        let gain = Gain::Gamma(&weights).widened();
        let deviate = FromBase::<Portable, false>::new(1.0, 2.0);
        let row = (&x[..], &dy[..], &gain[..]);
        let ((g_sum, ge_sum), squares) = pass_a::<f64, Portable, _, true, true>(row, deviate, None);
        // Small integers and halves: every sum is exact.
        let terms = x.iter().zip(&dy).zip(&weights);
        let (mut g_exact, mut ge_exact, mut squares_exact) = (0.0, 0.0, 0.0);
        for ((&x, &dy), &w) in terms {
            g_exact += w * dy;
            ge_exact += w * dy * (x - 2.0);
            squares_exact += (x - 2.0) * (x - 2.0);
        }
        assert_eq!(g_sum.plain_total(), g_exact);
        assert_eq!(ge_sum.plain_total(), ge_exact);
        assert_eq!(squares.plain_total(), squares_exact);
    }

    /// Pass A sums `Σ eᵢ²` in the order of the forward kernel's
    /// [`centred_square_sum`], so its statistics have the same bits: on
    /// rows whose sums round differently in another order, with the
    /// partial chunk a block of its own, in a block that is not full, or
    /// absent.
    #[test]
    fn pass_a_squares_are_summed_in_the_forward_order() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let lengths = [
            3 * LANES + 5,
            LANES * BLOCK + 3 * LANES + 5,
            2 * LANES * BLOCK + 5,
            2 * LANES * BLOCK,
        ];
        // Many rows of each length: another order moves the last bit of
        // only some of them.
        for d in lengths.into_iter().flat_map(|d| [d; 50]) {
            let x: Vec<f64> = (0..d)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 11) as f64 / (1u64 << 53) as f64 * 3.0 - 1.0
                })
                .collect();
            let dy = vec![1.0; d];
            let gain = Gain::Gamma(&vec![1.0; d]).widened();
            let base = 0.25;
            let deviate = FromBase::<Portable, false>::new(1.0, base);
            let row = (&x[..], &dy[..], &gain[..]);
            let (_, squares) = pass_a::<f64, Portable, _, true, true>(row, deviate, None);
            let forward = centred_square_sum::<f64, Portable>(&x, base, 0.0);
            assert_eq!(
                squares.plain_total().to_bits(),
                forward.to_bits(),
                "d = {d}"
            );
        }
    }

    /// Backward that computes the statistics on the way gives the bits of
    /// backward from the exact centring's statistics, also on a row where
    /// the variance needs the centring's extra pass (a large `shift` next to
    /// a tiny spread).
    #[test]
    fn fused_statistics_are_the_exact_centring() {
        let d = 2 * LANES * BLOCK + 5;
        let x: Vec<f64> = (0..d)
            .map(|i| 1.0 + (i % 7) as f64 * 2f64.powi(-50))
            .collect();
        let dy: Vec<f64> = (0..d).map(|i| (i % 11) as f64 - 5.0).collect();
        let gain = Gain::Gamma(&vec![1.5; d]).widened();
        let FirstPass::Deviations { mean, .. } = centring_first_pass::<f64, Portable>(&x, 0.0)
        else {
            panic!("an ordinary row");
        };
        let (base, shift) = (mean.base, mean.shift);
        let deviate = FromBase::<Portable, false>::new(1.0, base);
        let (_, squares) = pass_a::<f64, Portable, _, true, true>((&x, &dy, &gain), deviate, None);
        let branch = variance(squares.plain_total(), d as f64, shift, 0.0);
        assert!(
            matches!(branch, Variance::Centred),
            "the short formula would do"
        );

        let stats = [RowCentring::from_centring(
            &x,
            exact_centring::<f64, Portable>(&x, 0.0),
            0.0,
        )];
        let inputs = Inputs {
            x: &x,
            dy: &dy,
            d,
            gain: &gain,
            prefetch: false,
            stream: false,
        };
        let run = |saved| {
            let mut dx = vec![0.0; d];
            let mut partials = Partials::new(d);
            layer_norm_backward_block::<f64, Portable>(inputs, &mut dx, saved, &mut partials);
            let bits = |v: &[f64]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let (dgamma, dbeta) = (partials.dgamma.as_slice(), partials.dbeta.as_slice());
            (bits(&dx), bits(dgamma), bits(dbeta))
        };
        assert_eq!(run(Saved::Compute(0.0)), run(Saved::Rows(&stats)));
    }

    /// A streamed row's head shares a vector with the first features of
    /// its body, whose partials it must leave alone. Here the head's unused
    /// lanes (`x = 0`, `dy = 0`) have `n = (0 - 10³⁰⁰) · 10¹⁵⁰ = -∞`, and
    /// `0 · -∞` is NaN.
    #[test]
    fn streamed_head_adds_nothing_to_the_features_after_it() {
        let d = 3 * LANES;
        let x = vec![1e300; d];
        let dy: Vec<f64> = (0..d).map(|i| i as f64 - 20.0).collect();
        let gain = Gain::Gamma(&vec![1.0; d]).widened();
        let mut buffer = vec![0.0; d + LANES];
        let offset = (1..LANES)
            .find(|&offset| cache::before_first_line(&buffer[offset..offset + d]) > 0)
            .unwrap();
        let dx = &mut buffer[offset..offset + d];
        let head = cache::before_first_line(dx);
        let inputs = Inputs {
            x: &x,
            dy: &dy,
            d,
            gain: &gain,
            prefetch: false,
            stream: true,
        };
        let mut partials = Partials::new(d);
        partials.clear(head);
        // A constant row: n = 0 for every real element, so dγ = 0, dβ = dy.
        layer_norm_backward_block::<f64, Portable>(
            inputs,
            dx,
            Saved::Compute(1e-300),
            &mut partials,
        );
        assert!(
            partials.dgamma.as_slice()[..d].iter().all(|&v| v == 0.0),
            "head {head}"
        );
        assert_eq!(partials.dbeta.as_slice()[..d], dy);
    }

    #[test]
    fn gains_are_widened_and_padded() {
        let w = [0.5_f32, -2.0, 3e-8];
        let plain = Gain::Gamma(&w).widened();
        assert_eq!(plain.len(), padded_len(w.len()));
        assert_eq!(plain[..3], [0.5, -2.0, f64::from(3e-8_f32)]);
        assert!(plain[3..].iter().all(|&v| v == 0.0));
        let one_plus = Gain::OnePlus(&w).widened();
        assert_eq!(one_plus[..3], [1.5, -1.0, 1.0 + f64::from(3e-8_f32)]);
        assert!(one_plus[3..].iter().all(|&v| v == 0.0));
    }
}
