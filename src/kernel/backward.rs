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
//! `n` is recomputed from the row's saved statistics with the expression of
//! the forward kernel (`((xᵢ · scale - base) - shift) · inv_std`, where
//! `scale = 1` multiplies exactly), so it carries the forward pass's
//! accuracy, also on rows with a large common offset or rescaled rows.
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
//! `Σ g` and `Σ g ⊙ n` are [`BlockedSum`]s: element `i` in lane `i % LANES`,
//! plain sums over blocks of [`BLOCK`] vectors added to a compensated
//! total, the lanes combined by fixed halving trees. Their error, about
//! `(BLOCK + 5) · 2⁻⁵³ · Σ |terms|`, is that of a short plain sum whatever
//! `d`. The per-feature sums over rows are split into blocks of
//! [`BLOCK_ROWS`] consecutive rows: each block adds its rows in order,
//! element by element, into `f64` partials that start at 0, and the blocks'
//! partials are added in block order by [`ColumnSum`], which keeps the
//! rounding error of every addition. No step depends on which thread
//! computes a block, so the bits do not depend on the thread count. No
//! fused multiply-add is used.

use super::portable::{
    exact_centring, padded, rms_scaling, single_precision_centring, two_sum, write_layer_norm,
    write_rms_norm, Blend, BlockedSum, Centre, Centring, Fold, Normalise, Rescale, BLOCK,
};
use super::simd::{Vector, LANES};
use super::{Affine, Io};
use crate::scalar::NormScalar;

/// Rows per block of the per-feature sums over rows.
pub(crate) const BLOCK_ROWS: usize = 64;

/// LayerNorm statistics of one row as backward needs them:
/// `nᵢ = ((xᵢ · scale - base) - shift) · inv_std`.
///
/// A constant row has `base` = its value, `shift = 0`, `scale = 1` and
/// `inv_std = 1/√eps` (`+∞` when `eps = 0`); a row holding a NaN or an
/// infinity is all NaN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RowCentring {
    scale: f64,
    base: f64,
    shift: f64,
    inv_std: f64,
}

impl RowCentring {
    pub(crate) const NOT_FINITE: Self = RowCentring {
        scale: f64::NAN,
        base: f64::NAN,
        shift: f64::NAN,
        inv_std: f64::NAN,
    };

    #[inline(always)]
    fn from_centring<A: NormScalar>(x: &[A], centring: Centring, eps: f64) -> Self {
        match centring {
            Centring::Centred {
                scale,
                base,
                shift,
                inv_std,
            } => RowCentring {
                scale,
                base,
                shift,
                inv_std,
            },
            Centring::Constant => RowCentring {
                scale: 1.0,
                base: x.first().map_or(f64::NAN, |v| v.widen()),
                shift: 0.0,
                inv_std: constant_inverse_root(eps),
            },
            Centring::NotFinite => Self::NOT_FINITE,
        }
    }

    /// The row's mean.
    pub(crate) fn mean(self) -> f64 {
        (self.base + self.shift) / self.scale
    }

    /// The row's `1/√(var + eps)`.
    pub(crate) fn rstd(self) -> f64 {
        self.inv_std * self.scale
    }
    /// The bits of every field, for comparisons that must see NaN and -0.
    #[cfg(test)]
    pub(crate) fn to_bits(self) -> [u64; 4] {
        [self.scale, self.base, self.shift, self.inv_std].map(f64::to_bits)
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

    #[inline(always)]
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
#[inline(always)]
fn constant_inverse_root(eps: f64) -> f64 {
    if eps > 0.0 {
        1.0 / eps.sqrt()
    } else {
        f64::INFINITY
    }
}

/// Row statistics that backward can compute itself.
pub(crate) trait RowStatistics: Copy {
    /// The statistics of a row that has none.
    const MISSING: Self;
    /// The statistics of row `x` (non-empty).
    fn compute<A: NormScalar, V: Vector>(x: &[A], eps: f64) -> Self;
}

impl RowStatistics for RowCentring {
    const MISSING: Self = RowCentring::NOT_FINITE;
    // See `layer_norm_backward_row`.
    #[cfg_attr(debug_assertions, inline(never))]
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn compute<A: NormScalar, V: Vector>(x: &[A], eps: f64) -> Self {
        Self::from_centring(x, exact_centring::<A, V>(x, eps), eps)
    }
}

impl RowStatistics for RowScaling {
    const MISSING: Self = RowScaling::NOT_FINITE;
    #[inline(always)]
    fn compute<A: NormScalar, V: Vector>(x: &[A], eps: f64) -> Self {
        Self::from_scaling(rms_scaling::<A, V>(x, eps))
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

impl<'a, A> Gain<'a, A> {
    /// The forward pass's affine part for this gain.
    pub(crate) fn affine(self) -> Affine<'a, A> {
        match self {
            Gain::Gamma(gamma) => Affine::Scale(gamma),
            Gain::OnePlus(w) => Affine::OnePlus(w),
        }
    }
}

/// Where a block's row statistics come from.
#[derive(Clone, Copy)]
pub(crate) enum Saved<'a, T> {
    /// Compute each row's statistics with this `eps`.
    Compute(f64),
    /// One saved entry per row of the block, in order.
    Rows(&'a [T]),
}

impl<T: RowStatistics> Saved<'_, T> {
    #[inline(always)]
    fn row<A: NormScalar, V: Vector>(self, row: usize, x: &[A]) -> T {
        match self {
            Saved::Compute(eps) => T::compute::<A, V>(x, eps),
            Saved::Rows(rows) => rows.get(row).copied().unwrap_or(T::MISSING),
        }
    }
}

/// One block's per-feature partial sums over its rows, each padded with
/// zeros to whole vectors so that the kernels load and store them as such.
pub(crate) struct Partials {
    pub(crate) dgamma: Vec<f64>,
    pub(crate) dbeta: Vec<f64>,
}

impl Partials {
    pub(crate) fn new(d: usize) -> Self {
        let padded = d.div_ceil(LANES) * LANES;
        Partials {
            dgamma: vec![0.0; padded],
            dbeta: vec![0.0; padded],
        }
    }

    /// Starts a block: every partial at 0.
    pub(crate) fn clear(&mut self) {
        self.dgamma.fill(0.0);
        self.dbeta.fill(0.0);
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

    /// Adds the next block's partials (the first `d` of them).
    pub(crate) fn add(&mut self, partial: &[f64]) {
        for ((high, low), &p) in self.high.iter_mut().zip(&mut self.low).zip(partial) {
            let (sum, err) = two_sum(*high, p);
            *high = sum;
            *low += err;
        }
    }

    /// The totals, each rounded once to `A`.
    pub(crate) fn total<A: NormScalar>(&self) -> Vec<A> {
        self.high
            .iter()
            .zip(&self.low)
            .map(|(&high, &low)| A::narrow(high + low))
            .collect()
    }
}

/// LayerNorm of a block of rows into `y`, saving each row's statistics.
#[inline(always)]
pub(super) fn layer_norm_train_block<A: NormScalar, V: Vector>(
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
        // The forward kernel's choice, so that `y` has its bits.
        let forward = if size_of::<A>() == size_of::<f32>() {
            single_precision_centring::<A, V>(x, eps).unwrap_or(exact)
        } else {
            exact
        };
        let io = Io::Copy {
            input: x,
            output: y,
        };
        write_layer_norm::<A, V>(io, affine, forward);
        *slot = RowCentring::from_centring(x, exact, eps);
    }
}

/// RMSNorm of a block of rows into `y`, saving each row's statistics.
#[inline(always)]
pub(super) fn rms_norm_train_block<A: NormScalar, V: Vector>(
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
        write_rms_norm::<A, V>(io, affine, scaling);
        *slot = RowScaling::from_scaling(scaling);
    }
}

/// How the stored weight becomes the gain (a type, so that the kernels are
/// compiled once per kind without a branch per element).
trait Weight: Copy {
    fn gain<V: Vector>(self, w: V) -> V;
}

/// The weight is the gain `γ`.
#[derive(Clone, Copy)]
struct AsIs;

impl Weight for AsIs {
    #[inline(always)]
    fn gain<V: Vector>(self, w: V) -> V {
        w
    }
}

/// The gain is `1 + w`.
#[derive(Clone, Copy)]
struct OnePlus;

impl Weight for OnePlus {
    #[inline(always)]
    fn gain<V: Vector>(self, w: V) -> V {
        w + V::splat(1.0)
    }
}

/// Folds over three rows of one length at once (`x`, `dy` and the weights),
/// in the order of [`fold_row`](super::portable): element `i` in lane
/// `i % LANES`, a flush after every [`BLOCK`] vectors, the last partial
/// chunk padded with zeros and only its real lanes kept.
#[inline(always)]
fn fold_rows<A: NormScalar, V: Vector, F: Fold<(V, V, V)>>(
    x: &[A],
    dy: &[A],
    w: &[A],
    init: F::State,
    fold: F,
) -> F::State {
    let (x_chunks, x_tail) = x.as_chunks::<LANES>();
    let (dy_chunks, dy_tail) = dy.as_chunks::<LANES>();
    let (w_chunks, w_tail) = w.as_chunks::<LANES>();
    let mut state = init;
    let blocks = x_chunks
        .chunks(BLOCK)
        .zip(dy_chunks.chunks(BLOCK))
        .zip(w_chunks.chunks(BLOCK));
    for ((x, dy), w) in blocks {
        for ((x, dy), w) in x.iter().zip(dy).zip(w) {
            state = fold.step(state, (A::load(x), A::load(dy), A::load(w)));
        }
        state = fold.flush(state);
    }
    if !x_tail.is_empty() {
        let values = (
            A::load(&padded(x_tail)),
            A::load(&padded(dy_tail)),
            A::load(&padded(w_tail)),
        );
        let update = fold.flush(fold.step(state, values));
        state = update.blend(state, x_tail.len());
    }
    state
}

/// Blocked `Σ gᵢ` and `Σ gᵢ nᵢ` of a LayerNorm row.
#[derive(Clone, Copy)]
struct LayerNormSums<V, W> {
    norm: Centre<V>,
    weight: W,
}

impl<V: Vector, W: Weight> Fold<(V, V, V)> for LayerNormSums<V, W> {
    type State = (BlockedSum<V>, BlockedSum<V>);
    #[inline(always)]
    fn step(self, (g_sum, gn_sum): Self::State, (x, dy, w): (V, V, V)) -> Self::State {
        let g = self.weight.gain(w) * dy;
        (g_sum.add(g), gn_sum.add(g * self.norm.apply(x)))
    }
    #[inline(always)]
    fn flush(self, (g_sum, gn_sum): Self::State) -> Self::State {
        (g_sum.flush(), gn_sum.flush())
    }
}

/// Blocked `Σ gᵢ nᵢ` of an RMSNorm row.
#[derive(Clone, Copy)]
struct RmsNormSums<V, W> {
    norm: Rescale<V>,
    weight: W,
}

impl<V: Vector, W: Weight> Fold<(V, V, V)> for RmsNormSums<V, W> {
    type State = BlockedSum<V>;
    #[inline(always)]
    fn step(self, gn_sum: Self::State, (x, dy, w): (V, V, V)) -> Self::State {
        gn_sum.add((self.weight.gain(w) * dy) * self.norm.apply(x))
    }
    #[inline(always)]
    fn flush(self, gn_sum: Self::State) -> Self::State {
        gn_sum.flush()
    }
}

/// One vector of a row's gradient (a struct, not a closure, for the reason
/// given at [`Fold`]).
trait Gradient<V>: Copy {
    /// Whether the row adds `dy` to `dβ`.
    const WITH_BETA: bool;
    /// `(dx, n)` for one vector of `x`, `dy` and the weights.
    fn apply(self, x: V, dy: V, w: V) -> (V, V);
}

/// `dxᵢ = ((gᵢ - mean(g)) - nᵢ · mean(g ⊙ n)) · rstd`.
#[derive(Clone, Copy)]
struct LayerNormGradient<V, W> {
    norm: Centre<V>,
    weight: W,
    mean_g: V,
    mean_gn: V,
    rstd: V,
}

impl<V: Vector, W: Weight> Gradient<V> for LayerNormGradient<V, W> {
    const WITH_BETA: bool = true;
    #[inline(always)]
    fn apply(self, x: V, dy: V, w: V) -> (V, V) {
        let n = self.norm.apply(x);
        let g = self.weight.gain(w) * dy;
        (((g - self.mean_g) - n * self.mean_gn) * self.rstd, n)
    }
}

/// `dxᵢ = (gᵢ - nᵢ · mean(g ⊙ n)) · rrms`.
#[derive(Clone, Copy)]
struct RmsNormGradient<V, W> {
    norm: Rescale<V>,
    weight: W,
    mean_gn: V,
    rrms: V,
}

impl<V: Vector, W: Weight> Gradient<V> for RmsNormGradient<V, W> {
    const WITH_BETA: bool = false;
    #[inline(always)]
    fn apply(self, x: V, dy: V, w: V) -> (V, V) {
        let n = self.norm.apply(x);
        let g = self.weight.gain(w) * dy;
        ((g - n * self.mean_gn) * self.rrms, n)
    }
}

/// A row without a derivative (`eps = 0` and a constant, or all-zero, row):
/// `dx` is NaN, and the normalised output, 0 whatever the gain, adds
/// `dy · 0` to `dγ` (0, or NaN for a non-finite `dy`).
#[derive(Clone, Copy)]
struct Singular<const WITH_BETA: bool>;

impl<V: Vector, const WITH_BETA: bool> Gradient<V> for Singular<WITH_BETA> {
    const WITH_BETA: bool = WITH_BETA;
    #[inline(always)]
    fn apply(self, _x: V, _dy: V, _w: V) -> (V, V) {
        (V::splat(f64::NAN), V::splat(0.0))
    }
}

/// Writes a row's `dx` and adds `dyᵢ · nᵢ` to `dgamma[i]` (and `dyᵢ` to
/// `dbeta[i]` where the gradient says so). `dgamma` and `dbeta` are
/// [`Partials`], padded to whole vectors; the last, partial chunk of the row
/// is padded with zeros and only its real elements of `dx` are written.
#[inline(always)]
fn write_gradient<A: NormScalar, V: Vector, G: Gradient<V>>(
    (x, dy, w): (&[A], &[A], &[A]),
    dx: &mut [A],
    partials: &mut Partials,
    gradient: G,
) {
    let (x_chunks, x_tail) = x.as_chunks::<LANES>();
    let (dy_chunks, dy_tail) = dy.as_chunks::<LANES>();
    let (w_chunks, w_tail) = w.as_chunks::<LANES>();
    let (dx_chunks, dx_tail) = dx.as_chunks_mut::<LANES>();
    let (dgamma, _) = partials.dgamma.as_chunks_mut::<LANES>();
    let (dbeta, _) = partials.dbeta.as_chunks_mut::<LANES>();
    let mut sums = dgamma.iter_mut().zip(dbeta.iter_mut());
    let inputs = x_chunks.iter().zip(dy_chunks).zip(w_chunks);
    for ((((x, dy), w), dx), (dgamma, dbeta)) in inputs.zip(dx_chunks).zip(&mut sums) {
        let dy = A::load::<V>(dy);
        let (value, n) = gradient.apply(A::load(x), dy, A::load(w));
        A::store(value, dx);
        accumulate::<V, G>(dy, n, dgamma, dbeta);
    }
    if dx_tail.is_empty() {
        return;
    }
    if let Some((dgamma, dbeta)) = sums.next() {
        let dy = A::load::<V>(&padded(dy_tail));
        let (value, n) = gradient.apply(A::load(&padded(x_tail)), dy, A::load(&padded(w_tail)));
        let mut chunk = [A::zero(); LANES];
        A::store(value, &mut chunk);
        for (out, value) in dx_tail.iter_mut().zip(chunk) {
            *out = value;
        }
        accumulate::<V, G>(dy, n, dgamma, dbeta);
    }
}

/// `dgamma += dy · n` and, for LayerNorm, `dbeta += dy`, one vector each.
#[inline(always)]
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

/// LayerNorm backward of a block of rows (`x`, `dy`, `dx` hold the same
/// number of rows of length `d = gain`'s length): writes `dx` and adds each
/// row's `dy ⊙ n` and `dy` to `partials` in row order.
#[inline(always)]
pub(super) fn layer_norm_backward_block<A: NormScalar, V: Vector>(
    x: &[A],
    dy: &[A],
    dx: &mut [A],
    gain: Gain<'_, A>,
    saved: Saved<'_, RowCentring>,
    partials: &mut Partials,
) {
    match gain {
        Gain::Gamma(w) => layer_norm_backward_rows::<A, V, _>(x, dy, dx, w, AsIs, saved, partials),
        Gain::OnePlus(w) => {
            layer_norm_backward_rows::<A, V, _>(x, dy, dx, w, OnePlus, saved, partials)
        }
    }
}

#[inline(always)]
fn layer_norm_backward_rows<A: NormScalar, V: Vector, W: Weight>(
    x: &[A],
    dy: &[A],
    dx: &mut [A],
    weights: &[A],
    weight: W,
    saved: Saved<'_, RowCentring>,
    partials: &mut Partials,
) {
    let d = weights.len();
    if d == 0 {
        return;
    }
    let rows = x.chunks_exact(d).zip(dy.chunks_exact(d));
    for (row, ((x, dy), dx)) in rows.zip(dx.chunks_exact_mut(d)).enumerate() {
        let stats = saved.row::<A, V>(row, x);
        layer_norm_backward_row::<A, V, W>((x, dy, weights), dx, weight, stats, partials);
    }
}

// Out of line in unoptimised builds only: there every vector temporary
// gets its own stack slot, and a trampoline holding all the row kernels
// would outgrow a test thread's stack. Optimised builds inline everything.
#[cfg_attr(debug_assertions, inline(never))]
#[cfg_attr(not(debug_assertions), inline(always))]
fn layer_norm_backward_row<A: NormScalar, V: Vector, W: Weight>(
    (x, dy, weights): (&[A], &[A], &[A]),
    dx: &mut [A],
    weight: W,
    stats: RowCentring,
    partials: &mut Partials,
) {
    let RowCentring {
        scale,
        base,
        shift,
        inv_std,
    } = stats;
    if inv_std.is_infinite() {
        write_gradient::<A, V, _>((x, dy, weights), dx, partials, Singular::<true>);
        return;
    }
    let norm = Centre::<V>::new(scale, base, shift, inv_std);
    let init = (BlockedSum::new(), BlockedSum::new());
    let (g_sum, gn_sum) = fold_rows(x, dy, weights, init, LayerNormSums { norm, weight });
    let d = x.len() as f64;
    let gradient = LayerNormGradient {
        norm,
        weight,
        mean_g: V::splat(g_sum.plain_total() / d),
        mean_gn: V::splat(gn_sum.plain_total() / d),
        rstd: V::splat(inv_std * scale),
    };
    write_gradient::<A, V, _>((x, dy, weights), dx, partials, gradient);
}

/// RMSNorm backward of a block of rows: writes `dx` and adds each row's
/// `dy ⊙ n` to `partials.dgamma` in row order.
#[inline(always)]
pub(super) fn rms_norm_backward_block<A: NormScalar, V: Vector>(
    x: &[A],
    dy: &[A],
    dx: &mut [A],
    gain: Gain<'_, A>,
    saved: Saved<'_, RowScaling>,
    partials: &mut Partials,
) {
    match gain {
        Gain::Gamma(w) => rms_norm_backward_rows::<A, V, _>(x, dy, dx, w, AsIs, saved, partials),
        Gain::OnePlus(w) => {
            rms_norm_backward_rows::<A, V, _>(x, dy, dx, w, OnePlus, saved, partials)
        }
    }
}

#[inline(always)]
fn rms_norm_backward_rows<A: NormScalar, V: Vector, W: Weight>(
    x: &[A],
    dy: &[A],
    dx: &mut [A],
    weights: &[A],
    weight: W,
    saved: Saved<'_, RowScaling>,
    partials: &mut Partials,
) {
    let d = weights.len();
    if d == 0 {
        return;
    }
    let rows = x.chunks_exact(d).zip(dy.chunks_exact(d));
    for (row, ((x, dy), dx)) in rows.zip(dx.chunks_exact_mut(d)).enumerate() {
        let stats = saved.row::<A, V>(row, x);
        rms_norm_backward_row::<A, V, W>((x, dy, weights), dx, weight, stats, partials);
    }
}

// Out of line in unoptimised builds only: there every vector temporary
// gets its own stack slot, and a trampoline holding all the row kernels
// would outgrow a test thread's stack. Optimised builds inline everything.
#[cfg_attr(debug_assertions, inline(never))]
#[cfg_attr(not(debug_assertions), inline(always))]
fn rms_norm_backward_row<A: NormScalar, V: Vector, W: Weight>(
    (x, dy, weights): (&[A], &[A], &[A]),
    dx: &mut [A],
    weight: W,
    stats: RowScaling,
    partials: &mut Partials,
) {
    let RowScaling { scale, inv_rms } = stats;
    if inv_rms.is_infinite() {
        write_gradient::<A, V, _>((x, dy, weights), dx, partials, Singular::<false>);
        return;
    }
    let norm = Rescale::<V>::new(scale, inv_rms);
    let gn_sum = fold_rows(
        x,
        dy,
        weights,
        BlockedSum::new(),
        RmsNormSums { norm, weight },
    );
    let gradient = RmsNormGradient {
        norm,
        weight,
        mean_gn: V::splat(gn_sum.plain_total() / x.len() as f64),
        rrms: V::splat(inv_rms * scale),
    };
    write_gradient::<A, V, _>((x, dy, weights), dx, partials, gradient);
}

#[cfg(test)]
mod tests {
    use super::super::simd::Portable;
    use super::*;

    #[test]
    fn column_sum_keeps_what_plain_sum_drops() {
        let mut sum = ColumnSum::new(1);
        for v in [1e16, 1.0, -1e16, 1.0] {
            sum.add(&[v]);
        }
        assert_eq!(sum.total::<f64>(), vec![2.0]);
    }

    #[test]
    fn constant_row_keeps_its_value_as_mean() {
        // 0.1 + 0.1 + 0.1 = 0.30000000000000004 in f64, so a mean formed as
        // sum / d would not be 0.1.
        let stats = RowCentring::compute::<f64, Portable>(&[0.1, 0.1, 0.1], 0.25);
        assert_eq!(stats.mean(), 0.1);
        assert_eq!(stats.rstd(), 2.0);
        let singular = RowCentring::compute::<f64, Portable>(&[0.1; 3], 0.0);
        assert_eq!(singular.rstd(), f64::INFINITY);
    }

    #[test]
    fn zero_row_without_eps_has_infinite_inverse_rms() {
        let rrms = |eps| RowScaling::compute::<f32, Portable>(&[0.0; 4], eps).rrms();
        assert_eq!(rrms(0.0), f64::INFINITY);
        assert_eq!(rrms(0.25), 2.0);
    }

    #[test]
    fn partials_are_padded_to_whole_vectors() {
        for (d, padded) in [(1, LANES), (LANES, LANES), (LANES + 1, 2 * LANES)] {
            let partials = Partials::new(d);
            assert_eq!(partials.dgamma.len(), padded);
            assert_eq!(partials.dbeta.len(), padded);
        }
    }

    /// `Σ gᵢ` of a LayerNorm row goes through the blocked sum: with
    /// `n = 0` (x constant, eps > 0) the row sums are `Σ g` and 0, and
    /// `dx = rstd · (g - mean(g))`. Terms 2⁵³ then ones: lane 0 gets
    /// elements 0, 16, 32, …, whose plain sum would lose the ones after
    /// 2⁵³ within a block; the block sums do too, but only within one
    /// block of 8 vectors per lane, and the blocks' totals are compensated.
    #[test]
    fn row_sums_lose_at_most_a_block_per_lane() {
        let d = 16 * LANES * BLOCK; // 16 blocks of 8 vectors
        let big = 2.0_f64.powi(53);
        let dy: Vec<f64> = (0..d).map(|i| if i == 0 { big } else { 1.0 }).collect();
        let x = vec![3.0; d];
        let w = vec![1.0; d];
        let fold = LayerNormSums {
            norm: Centre::<Portable>::new(1.0, 3.0, 0.0, 2.0),
            weight: AsIs,
        };
        let init = (BlockedSum::new(), BlockedSum::new());
        let (g_sum, gn_sum) = fold_rows(&x, &dy, &w, init, fold);
        assert_eq!(gn_sum.plain_total(), 0.0);
        // Lane 0 of the first block adds 2⁵³ + 1 + … (7 ones, all lost);
        // every other term is kept.
        assert_eq!(g_sum.plain_total(), big + (d - 1 - (BLOCK - 1)) as f64);
    }
}
