//! LayerNorm, RMSNorm and their statistics along the last axis (or the last
//! few axes) of any [`ndarray`] array, for `f32` and `f64` (and, with the
//! `half` feature, `half::f16` and `half::bf16`), accurate to within an ulp
//! (`f32`, the half types) or a few (`f64`).
//!
//! Bring the extension traits into scope and call them on any owned array
//! or view, of any dimension `(…, d)` and any memory layout:
//!
//! ```
//! use ndarray::array;
//! use ndarray_layernorm::prelude::*;
//!
//! let x = array![[2.0_f32, 4.0, 6.0, 8.0], [7.0, 7.0, 7.0, 7.0]];
//! let gamma = array![2.0, 1.0, 1.0, 0.5];
//! let beta = array![0.0, 0.0, 1.0, 0.0];
//!
//! let y = x.layer_norm(&gamma, &beta, 1e-5)?;
//! assert!(y.row(0).abs_diff_eq(&array![-2.6833, -0.4472, 1.4472, 0.6708], 1e-4));
//! assert_eq!(y.row(1), beta); // a constant row gives beta, bit for bit
//!
//! let r = x.rms_norm(&array![1.0, 1.0, 1.0, 1.0], 1e-6)?;
//! let (mean, rms) = x.stats()?;
//! assert_eq!(mean, array![5.0, 7.0]);
//! # let _ = (r, rms);
//! # Ok::<(), NormError>(())
//! ```
//!
//! | trait | methods |
//! |---|---|
//! | [`LayerNormExt`] | `layer_norm`, `layer_norm_plain`, and their `_into` and `_inplace` forms |
//! | [`RmsNormExt`] | `rms_norm`, `rms_norm_plain`, and their `_into` and `_inplace` forms |
//! | [`RowStatsExt`] | `stats`: `(mean, rms)` of every row; `stats_over` |
//! | [`LayerNormBackwardExt`] | `layer_norm_backward`, `layer_norm_train`, `layer_norm_backward_with_stats`, and the `_into` forms of the two backward passes |
//! | [`RmsNormBackwardExt`] | `rms_norm_backward`, `rms_norm_train`, `rms_norm_backward_with_stats`, and the `_into` forms of the two backward passes |
//! | [`AddNormExt`] | `add_layer_norm`, `add_rms_norm` (residual add fused with the norm) and their `_inplace` forms |
//! | [`LayerNormOverExt`], [`RmsNormOverExt`] | every LayerNorm and RMSNorm method above with `_over` appended: over the axes from `Axis(a)` to the last (PyTorch's `normalized_shape`, ONNX's `axis`) |
//!
//! For training, the layers [`LayerNorm`] and [`RmsNorm`] own their
//! parameters and offer `forward`, `forward_train` and `backward`.
//!
//! To normalise several trailing axes together, as one row of the product
//! of their lengths, call the `_over` form with the first of them:
//!
//! ```
//! use ndarray::{Array, Array2, Axis};
//! use ndarray_layernorm::prelude::*;
//!
//! let x = Array::from_shape_fn((2, 3, 4), |(i, j, k)| (i + j * k) as f64);
//! let (gamma, beta) = (Array2::ones((3, 4)), Array2::zeros((3, 4)));
//! let y = x.layer_norm_over(Axis(1), &gamma, &beta, 1e-5)?; // each x[i] as one row of 12
//! let (mean, _rms) = x.stats_over(Axis(1))?;
//! assert_eq!(mean.shape(), &[2]);
//! # let _ = y;
//! # Ok::<(), NormError>(())
//! ```
//!
//! The `_plain` forms leave out `gamma` and `beta`. The `_into` forms write
//! into a caller's array of the input's shape and the `_inplace` forms
//! overwrite the input, so a hot loop need not allocate.
//!
//! # Accuracy
//!
//! - Statistics are accumulated in `f64` for both element types, with a
//!   corrected two-pass algorithm and compensated sums. `mean(x²) - mean²`
//!   is never formed; the variance divides by `d`; `eps` sits inside the
//!   root.
//! - Each `f32` output is within one unit in the last place of the exactly
//!   rounded true value, including rows like `1e8 + noise` and rows mixing
//!   magnitudes from `1e-30` to `1e30`.
//! - Each `f64` output is within a few units in the last place of the true
//!   value (relative error at most 2e-15 against an exact reference), also
//!   near zero, on rows with a large common offset (`1e12 + noise`), on
//!   rows whose squares overflow or underflow (`1e200`, `1e-200`) and on
//!   rows near the subnormal range (`1e-310`, whatever `eps`), which are
//!   rescaled by an exact power of two. Values below the normal range are
//!   held to multiples of 2⁻¹⁰⁷⁴: such an output, or such an `n` before
//!   `gamma` scales it, is good to two of those units. A row whose sum
//!   falls below 2⁻⁹⁰⁰ while its elements do not
//!   (`[1e-60, -1e-60, 1.5e-323, 0]`) is scaled up by a power of two as
//!   well, so that the outputs near its mean keep these bounds.
//! - Both rest on the mean, taken from a compensated sum good to about
//!   `d · 2⁻¹⁰⁶` of `Σ |xᵢ|`, and exact whenever the row's nonzero magnitudes
//!   lie within about `2⁵³ / d²` of each other, and in other rows too.
//!   Where the sum is exact, every output keeps these bounds, also that of
//!   an element at or a hair from the mean (the middle of `[0, 1, …, 48]`
//!   comes out exactly 0). Where it is not, an output whose element lies
//!   within about `d · 2⁻⁵³` times the row's mean magnitude of the mean can
//!   lose its relative accuracy (in `[1e20, 1, 1e-20, -1e20, -1]`, mean
//!   2e-21, the middle output comes out 25% high).
//! - Both hold for the normalised value `n` and for `n · gamma`. A shift
//!   `beta` is added to `n · gamma` in `f64`, so an output with `beta` is
//!   also off by up to 2e-15 of `|n · gamma|`: more than an ulp only where
//!   `n · gamma` and `beta` nearly cancel. For `f32` rows, whose `f64` `n`
//!   is good to about `(d / 32 + 8) · 2⁻⁵³`, the bound is that times
//!   `|n · gamma|` (above 2e-15 from about d = 350).
//! - Each `f16` or `bf16` output is the `f32` result on the exactly widened
//!   row, rounded to the half type: the correctly rounded value or a
//!   neighbour, also for rows whose squares overflow the half type, and for
//!   subnormal inputs and outputs. Their parameters may be `f32`
//!   ([`NormParam`]) and their `eps` an `f64` ([`NormEps`]):
//!
//! ```
//! # #[cfg(feature = "half")] {
//! use half::bf16;
//! use ndarray::array;
//! use ndarray_layernorm::prelude::*;
//!
//! let x = array![[1.0, 2.0, 4.0, 8.0]].mapv(bf16::from_f32);
//! let (gamma, beta) = (array![1.0_f32, 1.0, 1.0, 1.0], array![0.0_f32, 0.0, 0.0, 0.0]);
//! let y = x.layer_norm(&gamma, &beta, 1e-6)?; // eps: an f64
//! let (_, stats) = x.layer_norm_train(&gamma, &beta, 1e-6)?;
//! let grads = x.layer_norm_backward_with_stats(&y, &gamma, &stats)?;
//! let dgamma: ndarray::Array1<f32> = grads.dgamma; // in the parameters' type
//! # let _ = dgamma;
//! # }
//! # Ok::<(), ndarray_layernorm::NormError>(())
//! ```
//! - A row whose elements are all equal gives exactly `beta` (zeros for the
//!   plain form) for every `eps ≥ 0`; an all-zero row gives zeros under
//!   RMSNorm (`0 · gamma`, so where `gamma` is finite). A NaN or infinity
//!   poisons its own row only.
//! - The result bits do not depend on the memory layout: C or Fortran
//!   order, steps, negative strides, broadcast views and `IxDyn` all give the
//!   same bits.
//!
//! # Threads
//!
//! With the default `rayon` feature, calls over large arrays (128 Ki
//! elements or more) split their rows over rayon's global pool; set
//! `RAYON_NUM_THREADS`, or call inside `rayon::ThreadPool::install`, to
//! choose the threads. A row is never split, so the result bits do not
//! depend on the number of threads. The fused [`AddNormExt`] methods always
//! run on the calling thread.
//! Without the feature every call runs on the calling thread.
//!
//! # Errors
//!
//! Bad input never panics: every method returns a [`NormError`] for a
//! `gamma`/`beta`/output of the wrong length or shape, an empty last axis,
//! a 0-dimensional array or an `eps` that is negative or not finite (and, for
//! the `_over` forms, an axis out of range, axes without elements or a
//! `gamma`/`beta` of another shape than theirs). Leading
//! axes of length 0 are fine and give an empty result. A result that cannot
//! be allocated (of a broadcast view of a vast shape, say) is
//! [`NormError::OutOfMemory`] rather than an aborted process.

#![doc(test(attr(deny(warnings))))]

mod backward;
mod blocks;
mod check;
mod error;
mod fresh;
mod fused;
mod kernel;
mod layer_norm;
mod module;
mod over;
mod rms_norm;
mod rows;
mod scalar;
mod stats;

pub use crate::error::{NormError, Operand};
pub use crate::layer_norm::LayerNormExt;
pub use crate::rms_norm::RmsNormExt;
pub use crate::scalar::{NormEps, NormParam, NormScalar};
pub use crate::stats::RowStatsExt;

pub use crate::backward::{
    LayerNormBackwardExt, LayerNormGrads, LayerNormStats, RmsNormBackwardExt, RmsNormGrads,
    RmsNormStats,
};
pub use crate::fused::AddNormExt;
pub use crate::module::{LayerNorm, RmsNorm};
pub use crate::over::{LayerNormOverExt, RmsNormOverExt};

/// Everything needed to call the normalisations: the extension traits, the
/// element trait and the error type.
///
/// ```
/// use ndarray_layernorm::prelude::*;
///
/// let y = ndarray::array![3.0_f64, 4.0].layer_norm_plain(0.0)?;
/// assert_eq!(y, ndarray::array![-1.0, 1.0]);
/// # Ok::<(), NormError>(())
/// ```
pub mod prelude {
    pub use crate::error::NormError;
    pub use crate::layer_norm::LayerNormExt;
    pub use crate::rms_norm::RmsNormExt;
    pub use crate::scalar::{NormEps, NormParam, NormScalar};
    pub use crate::stats::RowStatsExt;

    pub use crate::backward::{
        LayerNormBackwardExt, LayerNormGrads, LayerNormStats, RmsNormBackwardExt, RmsNormGrads,
        RmsNormStats,
    };
    pub use crate::fused::AddNormExt;
    pub use crate::module::{LayerNorm, RmsNorm};
    pub use crate::over::{LayerNormOverExt, RmsNormOverExt};
}

mod sealed {
    /// Keeps the extension traits implementable by this crate only, so that
    /// methods can be added without a breaking release.
    pub trait Sealed {}

    impl<A, D: ndarray::Dimension> Sealed for ndarray::ArrayRef<A, D> {}
}
