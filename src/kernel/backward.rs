//! Training kernels: the forward pass that keeps its row statistics, the
//! backward passes of LayerNorm and RMSNorm, and the zero-centred RMSNorm
//! gain `1 + w`. Like the rest of [`kernel`](super), every function works on
//! contiguous rows in logical order and accumulates in `f64`.
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
//! A row has no derivative where the normalisation jumps: a constant row
//! under LayerNorm, or an all-zero row under RMSNorm, when `eps = 0`. Its
//! saved `inv_std` is `+∞`, its `dx` is NaN, and its `n` counts as 0 in
//! `dγ`, as in the forward output.
//!
//! # Summation order
//!
//! `mean(g)` and `mean(g ⊙ n)` are compensated lane sums (element `i` in
//! lane `i % LANES`, lanes combined by the halving tree of
//! [`CompensatedSum`]). The per-feature sums over rows are split into blocks
//! of [`BLOCK_ROWS`] consecutive rows: each block sums its rows in order into
//! plain `f64` partials that start at 0, and the blocks' partials are added
//! in block order by [`ColumnSum`], which keeps the rounding error of every
//! addition. No step depends on which thread computes a block, so the bits
//! do not depend on the thread count. No fused multiply-add is used.

use super::{
    centring, rms_scaling, two_sum, write_row, Affine, Centring, CompensatedSum, Io, LANES,
};
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

    /// The statistics of row `x` (non-empty).
    pub(crate) fn of<A: NormScalar>(x: &[A], eps: f64) -> Self {
        Self::from_centring(x, &centring(x, eps), eps)
    }

    fn from_centring<A: NormScalar>(x: &[A], centring: &Centring, eps: f64) -> Self {
        match *centring {
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

    /// The statistics of row `x` (non-empty).
    pub(crate) fn of<A: NormScalar>(x: &[A], eps: f64) -> Self {
        Self::from_scaling(rms_scaling(x, eps))
    }

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
}

/// `1/√eps`, the `1/√(var + eps)` of a constant row (`+∞` for `eps = 0`).
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

/// Where a block's row statistics come from.
#[derive(Clone, Copy)]
pub(crate) enum Saved<'a, T> {
    /// Compute each row's statistics with this `eps`.
    Compute(f64),
    /// One saved entry per row of the block, in order.
    Rows(&'a [T]),
}

impl<T: Copy> Saved<'_, T> {
    #[inline(always)]
    fn row<A>(self, row: usize, x: &[A], compute: impl Fn(&[A], f64) -> T, missing: T) -> T {
        match self {
            Saved::Compute(eps) => compute(x, eps),
            Saved::Rows(rows) => rows.get(row).copied().unwrap_or(missing),
        }
    }
}

/// One block's per-feature partial sums over its rows.
pub(crate) struct Partials {
    pub(crate) dgamma: Vec<f64>,
    pub(crate) dbeta: Vec<f64>,
}

impl Partials {
    pub(crate) fn new(d: usize) -> Self {
        Partials {
            dgamma: vec![0.0; d],
            dbeta: vec![0.0; d],
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

    /// Adds the next block's partials.
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

/// Compensated lane sums of `K` terms of the elements of three rows:
/// `term(aᵢ, bᵢ, cᵢ)[k]` goes to lane `i % LANES` of sum `k`, in index
/// order per lane, and the lanes are combined by [`CompensatedSum::total`].
///
/// Each full chunk of `LANES` elements first computes all its terms, then
/// adds them lane by lane; the split lets the compiler vectorise both steps
/// without changing the order of any addition.
#[inline(always)]
fn compensated_sums3<A: NormScalar, const K: usize>(
    a: &[A],
    b: &[A],
    c: &[A],
    term: impl Fn(f64, f64, f64) -> [f64; K],
) -> [f64; K] {
    let mut sums = [CompensatedSum::new(); K];
    let mut a_chunks = a.chunks_exact(LANES);
    let mut b_chunks = b.chunks_exact(LANES);
    let mut c_chunks = c.chunks_exact(LANES);
    for ((a, b), c) in (&mut a_chunks).zip(&mut b_chunks).zip(&mut c_chunks) {
        let mut terms = [[0.0; LANES]; K];
        for (lane, ((&a, &b), &c)) in a.iter().zip(b).zip(c).enumerate() {
            let t = term(a.widen(), b.widen(), c.widen());
            for (terms, t) in terms.iter_mut().zip(t) {
                terms[lane] = t;
            }
        }
        for (sum, terms) in sums.iter_mut().zip(&terms) {
            for (lane, &t) in terms.iter().enumerate() {
                sum.add(lane, t);
            }
        }
    }
    let tail = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .zip(c_chunks.remainder());
    for (lane, ((&a, &b), &c)) in tail.enumerate() {
        let t = term(a.widen(), b.widen(), c.widen());
        for (sum, t) in sums.iter_mut().zip(t) {
            sum.add(lane, t);
        }
    }
    sums.map(CompensatedSum::total)
}

/// LayerNorm of one row into `y`, returning the statistics backward needs.
/// The output has the bits of [`layer_norm_row`](super::layer_norm_row).
pub(crate) fn layer_norm_train_row<A: NormScalar>(
    x: &[A],
    y: &mut [A],
    affine: Affine<'_, A>,
    eps: f64,
) -> RowCentring {
    let centring_ = centring(x, eps);
    match centring_ {
        Centring::Centred {
            scale,
            base,
            shift,
            inv_std,
        } => {
            let io = Io::Copy {
                input: x,
                output: &mut *y,
            };
            if scale == 1.0 {
                write_row(io, affine, |x| ((x - base) - shift) * inv_std);
            } else {
                write_row(io, affine, |x| ((x * scale - base) - shift) * inv_std);
            }
        }
        Centring::Constant => match affine {
            Affine::ScaleShift(_, beta) => y.copy_from_slice(beta),
            Affine::Identity | Affine::Scale(_) => y.fill(A::zero()),
        },
        Centring::NotFinite => y.fill(A::nan()),
    }
    RowCentring::from_centring(x, &centring_, eps)
}

/// RMSNorm of one row into `y`, returning the statistics backward needs.
/// With [`Gain::Gamma`] the output has the bits of
/// [`rms_norm_row`](super::rms_norm_row).
pub(crate) fn rms_norm_train_row<A: NormScalar>(
    x: &[A],
    y: &mut [A],
    gain: Gain<'_, A>,
    eps: f64,
) -> RowScaling {
    let scaling = rms_scaling(x, eps);
    rms_write(
        Io::Copy {
            input: x,
            output: y,
        },
        gain,
        scaling,
    );
    RowScaling::from_scaling(scaling)
}

/// RMSNorm of one row with the zero-centred gain: `yᵢ = nᵢ · (1 + wᵢ)`.
pub(crate) fn rms_norm_one_plus_row<A: NormScalar>(io: Io<'_, A>, w: &[A], eps: f64) {
    let scaling = rms_scaling(io.input(), eps);
    rms_write(io, Gain::OnePlus(w), scaling);
}

/// Writes RMSNorm's output for the row's scaling (`None`: NaN row), with the
/// normalisation expressions of the forward kernel.
fn rms_write<A: NormScalar>(mut io: Io<'_, A>, gain: Gain<'_, A>, scaling: Option<(f64, f64)>) {
    let Some((scale, inv_rms)) = scaling else {
        io.output().fill(A::nan());
        return;
    };
    match gain {
        Gain::Gamma(gamma) => {
            let affine = Affine::Scale(gamma);
            if scale == 1.0 {
                write_row(io, affine, |x| x * inv_rms);
            } else {
                write_row(io, affine, |x| (x * scale) * inv_rms);
            }
        }
        Gain::OnePlus(w) => {
            let norm = |x: f64| (x * scale) * inv_rms;
            match io {
                Io::Copy { input, output } => {
                    for ((y, &x), &w) in output.iter_mut().zip(input).zip(w) {
                        *y = A::narrow(norm(x.widen()) * (1.0 + w.widen()));
                    }
                }
                Io::InPlace(row) => {
                    for (y, &w) in row.iter_mut().zip(w) {
                        *y = A::narrow(norm(y.widen()) * (1.0 + w.widen()));
                    }
                }
            }
        }
    }
}

/// LayerNorm backward of a block of rows (`x`, `dy`, `dx` hold the same
/// number of rows of length `d = gain`'s length): writes `dx` and adds each
/// row's `dy ⊙ n` and `dy` to `partials` in row order.
pub(crate) fn layer_norm_backward_block<A: NormScalar>(
    x: &[A],
    dy: &[A],
    dx: &mut [A],
    gain: Gain<'_, A>,
    saved: Saved<'_, RowCentring>,
    partials: &mut Partials,
) {
    let (weights, one_plus) = match gain {
        Gain::Gamma(w) => (w, false),
        Gain::OnePlus(w) => (w, true),
    };
    let d = weights.len();
    if d == 0 {
        return;
    }
    let rows = x.chunks_exact(d).zip(dy.chunks_exact(d));
    for (row, ((x, dy), dx)) in rows.zip(dx.chunks_exact_mut(d)).enumerate() {
        let stats = saved.row(row, x, RowCentring::of, RowCentring::NOT_FINITE);
        let sums = (&mut partials.dgamma[..], &mut partials.dbeta[..]);
        if one_plus {
            layer_norm_backward_row(x, dy, dx, weights, |w| 1.0 + w, stats, sums);
        } else {
            layer_norm_backward_row(x, dy, dx, weights, |w| w, stats, sums);
        }
    }
}

#[inline(always)]
fn layer_norm_backward_row<A: NormScalar>(
    x: &[A],
    dy: &[A],
    dx: &mut [A],
    weights: &[A],
    gain: impl Fn(f64) -> f64,
    stats: RowCentring,
    (dgamma, dbeta): (&mut [f64], &mut [f64]),
) {
    let RowCentring {
        scale,
        base,
        shift,
        inv_std,
    } = stats;
    if inv_std.is_infinite() {
        singular_row(dy, dx, dgamma);
        for (db, &dy) in dbeta.iter_mut().zip(dy) {
            *db += dy.widen();
        }
        return;
    }
    let norm = |x: f64| ((x * scale - base) - shift) * inv_std;
    let [sum_g, sum_gn] = compensated_sums3(x, dy, weights, |x, dy, w| {
        let g = gain(w) * dy;
        [g, g * norm(x)]
    });
    let d = x.len() as f64;
    let mean_g = sum_g / d;
    let mean_gn = sum_gn / d;
    let rstd = inv_std * scale;
    let columns = dgamma.iter_mut().zip(dbeta.iter_mut());
    let elements = dx.iter_mut().zip(x).zip(dy).zip(weights);
    for ((((dx, &x), &dy), &w), (dg, db)) in elements.zip(columns) {
        let (n, dy) = (norm(x.widen()), dy.widen());
        let g = gain(w.widen()) * dy;
        *dx = A::narrow(((g - mean_g) - n * mean_gn) * rstd);
        *dg += dy * n;
        *db += dy;
    }
}

/// RMSNorm backward of a block of rows: writes `dx` and adds each row's
/// `dy ⊙ n` to `partials.dgamma` in row order.
pub(crate) fn rms_norm_backward_block<A: NormScalar>(
    x: &[A],
    dy: &[A],
    dx: &mut [A],
    gain: Gain<'_, A>,
    saved: Saved<'_, RowScaling>,
    partials: &mut Partials,
) {
    let (weights, one_plus) = match gain {
        Gain::Gamma(w) => (w, false),
        Gain::OnePlus(w) => (w, true),
    };
    let d = weights.len();
    if d == 0 {
        return;
    }
    let rows = x.chunks_exact(d).zip(dy.chunks_exact(d));
    for (row, ((x, dy), dx)) in rows.zip(dx.chunks_exact_mut(d)).enumerate() {
        let stats = saved.row(row, x, RowScaling::of, RowScaling::NOT_FINITE);
        let dgamma = &mut partials.dgamma[..];
        if one_plus {
            rms_norm_backward_row(x, dy, dx, weights, |w| 1.0 + w, stats, dgamma);
        } else {
            rms_norm_backward_row(x, dy, dx, weights, |w| w, stats, dgamma);
        }
    }
}

#[inline(always)]
fn rms_norm_backward_row<A: NormScalar>(
    x: &[A],
    dy: &[A],
    dx: &mut [A],
    weights: &[A],
    gain: impl Fn(f64) -> f64,
    stats: RowScaling,
    dgamma: &mut [f64],
) {
    let RowScaling { scale, inv_rms } = stats;
    if inv_rms.is_infinite() {
        singular_row(dy, dx, dgamma);
        return;
    }
    let norm = |x: f64| (x * scale) * inv_rms;
    let [sum_gn] = compensated_sums3(x, dy, weights, |x, dy, w| [(gain(w) * dy) * norm(x)]);
    let mean_gn = sum_gn / x.len() as f64;
    let rrms = inv_rms * scale;
    let elements = dx.iter_mut().zip(x).zip(dy).zip(weights);
    for ((((dx, &x), &dy), &w), dg) in elements.zip(dgamma.iter_mut()) {
        let (n, dy) = (norm(x.widen()), dy.widen());
        let g = gain(w.widen()) * dy;
        *dx = A::narrow((g - n * mean_gn) * rrms);
        *dg += dy * n;
    }
}

/// A row without a derivative (`eps = 0` and a constant, or all-zero, row):
/// `dx` is NaN, and the normalised output, 0 whatever the gain, adds
/// `dy · 0` to `dγ` (0, or NaN for a non-finite `dy`).
fn singular_row<A: NormScalar>(dy: &[A], dx: &mut [A], dgamma: &mut [f64]) {
    dx.fill(A::nan());
    for (dg, &dy) in dgamma.iter_mut().zip(dy) {
        *dg += dy.widen() * 0.0;
    }
}

#[cfg(test)]
mod tests {
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
        let stats = RowCentring::of(&[0.1_f64, 0.1, 0.1], 0.25);
        assert_eq!(stats.mean(), 0.1);
        assert_eq!(stats.rstd(), 2.0);
        assert_eq!(RowCentring::of(&[0.1_f64; 3], 0.0).rstd(), f64::INFINITY);
    }

    #[test]
    fn zero_row_without_eps_has_infinite_inverse_rms() {
        assert_eq!(RowScaling::of(&[0.0_f32; 4], 0.0).rrms(), f64::INFINITY);
        assert_eq!(RowScaling::of(&[0.0_f32; 4], 0.25).rrms(), 2.0);
    }

    #[test]
    fn sums_of_three_rows_follow_the_lane_order() {
        // Terms 2⁵³ then 1, 1, …: lane 0 receives elements 0, 8, 16, so its
        // plain sum loses the ones after 2⁵³ but the compensated sum keeps
        // them; elements 1..7 and 9.. land in other lanes.
        let big = 2.0_f64.powi(53);
        let a: Vec<f64> = (0..19).map(|i| if i == 0 { big } else { 1.0 }).collect();
        let ones = vec![1.0; 19];
        let [sum, count] = compensated_sums3(&a, &ones, &ones, |a, b, c| [a * b, b * c]);
        assert_eq!(sum, big + 18.0);
        assert_eq!(count, 19.0);
        // The same order as feeding each element to lane i % LANES.
        let mut reference = CompensatedSum::new();
        for (i, &v) in a.iter().enumerate() {
            reference.add(i % LANES, v);
        }
        assert_eq!(sum.to_bits(), reference.total().to_bits());
    }
}
