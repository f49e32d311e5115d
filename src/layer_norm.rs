//! LayerNorm along the last axis.

use std::borrow::Cow;

use ndarray::{Array, ArrayRef, ArrayRef1, Dimension};

use crate::error::{NormError, Operand};
use crate::kernel::{Affine, CallParams};
use crate::scalar::{NormEps, NormParam, NormScalar, Wide};
use crate::{check, rows, sealed};

/// Layer normalisation of every vector along the last axis of an array.
///
/// For an array of shape `(…, d)`, each of its rows `x` of length `d` becomes
///
/// ```text
///          xᵢ - x̄                      1   d             1   d
/// yᵢ = ―――――――――――――― γᵢ + βᵢ,    x̄ = ―   ∑ xᵢ,   σ² = ―   ∑ (xᵢ - x̄)²
///        √(σ² + eps)                   d  i=1            d  i=1
/// ```
///
/// with the population variance (divide by `d`, not `d - 1`) and `eps`
/// inside the root. The `_plain` forms leave out `γ` and `β` (as if
/// `γ = 1, β = 0`) without building those vectors.
///
/// Implemented for [`ArrayRef`], so every owned array, view, `ArcArray` and
/// `CowArray` of `f32` or `f64`, of any dimension and memory layout, has
/// these methods. The trait is sealed.
///
/// # Accuracy
///
/// Statistics are accumulated in `f64` with a corrected two-pass algorithm
/// and compensated sums; `mean(x²) - mean²` is never formed. An `f32`
/// output is within one unit in the last place of the exactly rounded
/// result; an `f64` output is within a few units in the last place of the
/// true value (relative error at most 2e-15 against an exact reference),
/// also for outputs near zero, for rows with a large common offset
/// (`1e12 + noise`), for rows whose squares overflow or underflow
/// (`1e200`, `1e-200`) and for rows near the subnormal range (where values
/// below the normal range, outputs or `n` itself, are good to two units of
/// 2⁻¹⁰⁷⁴). With a shift `beta`, added to `n · gamma` in `f64`, the output
/// is also off by up to 2e-15 of `|n · gamma|` (`f32` rows: about
/// `(d / 32 + 8) · 2⁻⁵³` of it), which exceeds an ulp only where the two
/// nearly cancel. The mean's sum is exact whenever the row's nonzero magnitudes lie
/// within about `2⁵³ / d²` of each other (and in other rows too), and then
/// every output keeps these bounds, also at the mean itself (a row whose
/// sum falls below 2⁻⁹⁰⁰ while its elements do not is scaled up for it); otherwise it is
/// good to about `d · 2⁻¹⁰⁶` of `Σ |xᵢ|`, and an output whose element lies
/// within about `d · 2⁻⁵³` times the row's mean magnitude of the mean can
/// lose its relative accuracy (`[1e20, 1, 1e-20, -1e20, -1]`). A row whose
/// elements are all equal gives exactly `beta`, for every `eps ≥ 0`. A row
/// holding a NaN or an infinity gives NaN in that row only. The result bits
/// do not depend on the memory layout.
pub trait LayerNormExt<A: NormScalar, D: Dimension>: sealed::Sealed {
    /// Returns the layer normalisation `(x - mean) / √(var + eps) · gamma + beta`
    /// of every row, as a new array in standard (row-major) layout.
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::LengthMismatch`] if `gamma` or `beta` does not have the
    ///   length of the last axis.
    /// - [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[2.0_f64, 4.0, 6.0, 8.0]];
    /// let gamma = array![2.0, 1.0, 1.0, 0.5];
    /// let beta = array![0.0, 0.0, 1.0, 0.0];
    /// let y = x.layer_norm(&gamma, &beta, 1e-5)?;
    /// let expected = array![[-2.6833, -0.4472, 1.4472, 0.6708]];
    /// assert!(y.abs_diff_eq(&expected, 5e-5));
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm<P, Eps>(
        &self,
        gamma: &ArrayRef1<P>,
        beta: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<Array<A, D>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Returns `(x - mean) / √(var + eps)` of every row (LayerNorm without
    /// `gamma` and `beta`), as a new array in standard layout.
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[3.0_f64, 4.0], [7.0, 7.0]];
    /// let y = x.layer_norm_plain(0.0)?;
    /// assert_eq!(y, array![[-1.0, 1.0], [0.0, 0.0]]);
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_plain<Eps>(&self, eps: Eps) -> Result<Array<A, D>, NormError>
    where
        A: NormEps<Eps>;

    /// Writes the layer normalisation of every row into `out`, which must
    /// have the shape of `self` (any layout). Allocates nothing when `self`
    /// and `out` are in standard (row-major) layout and `gamma`, `beta`
    /// contiguous, except that an `f32` call over at least 4 rows of 17 to
    /// 1024 features converts `gamma` and `beta` to `f64` into a buffer of at
    /// most 16.25 KiB, which the calling thread allocates on its first such
    /// call and keeps for later ones.
    ///
    /// # Errors
    ///
    /// As [`layer_norm`](LayerNormExt::layer_norm), and
    /// [`NormError::ShapeMismatch`] if `out` does not have the shape of
    /// `self`. On error `out` is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array2};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[1.0_f32, 2.0, 3.0]];
    /// let mut out = Array2::zeros((1, 3));
    /// x.layer_norm_into(&mut out, &array![1.0, 1.0, 1.0], &array![0.0, 0.0, 0.0], 1e-5)?;
    /// assert!(out.abs_diff_eq(&array![[-1.22474, 0.0, 1.22474]], 1e-4));
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_into<P, Eps>(
        &self,
        out: &mut ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        beta: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Writes `(x - mean) / √(var + eps)` of every row into `out`, which
    /// must have the shape of `self`.
    ///
    /// # Errors
    ///
    /// As [`layer_norm_plain`](LayerNormExt::layer_norm_plain), and
    /// [`NormError::ShapeMismatch`] if `out` does not have the shape of
    /// `self`. On error `out` is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array1};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![3.0_f64, 4.0];
    /// let mut out = Array1::zeros(2);
    /// x.layer_norm_plain_into(&mut out, 0.0)?;
    /// assert_eq!(out, array![-1.0, 1.0]);
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_plain_into<Eps>(
        &self,
        out: &mut ArrayRef<A, D>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormEps<Eps>;

    /// Replaces every row by its layer normalisation. Allocates nothing
    /// when `self` is in standard (row-major) layout and `gamma`, `beta`
    /// contiguous, except that an `f32` call over at least 4 rows of 17 to
    /// 1024 features converts `gamma` and `beta` to `f64` into a buffer of at
    /// most 16.25 KiB, which the calling thread allocates on its first such
    /// call and keeps for later ones.
    ///
    /// # Errors
    ///
    /// As [`layer_norm`](LayerNormExt::layer_norm). On error the array is
    /// left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let mut x = array![[2.0_f64, 2.0], [0.0, 4.0]];
    /// x.layer_norm_inplace(&array![2.0, 1.0], &array![0.5, -0.5], 1e-5)?;
    /// assert_eq!(x.row(0), array![0.5, -0.5]); // a constant row gives beta exactly
    /// assert!(x.row(1).abs_diff_eq(&array![-1.5, 0.5], 1e-5));
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_inplace<P, Eps>(
        &mut self,
        gamma: &ArrayRef1<P>,
        beta: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Replaces every row by `(x - mean) / √(var + eps)`.
    ///
    /// # Errors
    ///
    /// As [`layer_norm_plain`](LayerNormExt::layer_norm_plain). On error the
    /// array is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let mut x = array![[1.0_f64, 2.0, 3.0, 4.0]];
    /// x.layer_norm_plain_inplace(0.0)?;
    /// assert!(x.abs_diff_eq(&array![[-1.3416, -0.4472, 0.4472, 1.3416]], 1e-4));
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_plain_inplace<Eps>(&mut self, eps: Eps) -> Result<(), NormError>
    where
        A: NormEps<Eps>;
}

impl<A: NormScalar, D: Dimension> LayerNormExt<A, D> for ArrayRef<A, D> {
    fn layer_norm<P, Eps>(
        &self,
        gamma: &ArrayRef1<P>,
        beta: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<Array<A, D>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let args = AffineArgs::new(self, gamma, beta, eps)?;
        let (params, eps) = (args.params(self.len()), args.eps);
        rows::map_rows(self, args.d, |isa, io, rows| {
            A::layer_norm_rows(isa, io, rows, params.params(), eps)
        })
    }

    fn layer_norm_plain<Eps>(&self, eps: Eps) -> Result<Array<A, D>, NormError>
    where
        A: NormEps<Eps>,
    {
        let d = check::row_length(self)?;
        let eps = check::eps::<A, _>(eps)?;
        let plain = CallParams::new(Affine::Identity, d, self.len());
        rows::map_rows(self, d, |isa, io, rows| {
            A::layer_norm_rows(isa, io, rows, plain.params(), eps)
        })
    }

    fn layer_norm_into<P, Eps>(
        &self,
        out: &mut ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        beta: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let args = AffineArgs::new(self, gamma, beta, eps)?;
        check::same_shape(self, out)?;
        let (params, eps) = (args.params(self.len()), args.eps);
        rows::map_rows_into(self, out, args.d, |isa, io, rows| {
            A::layer_norm_rows(isa, io, rows, params.params(), eps)
        });
        Ok(())
    }

    fn layer_norm_plain_into<Eps>(
        &self,
        out: &mut ArrayRef<A, D>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormEps<Eps>,
    {
        let d = check::row_length(self)?;
        let eps = check::eps::<A, _>(eps)?;
        check::same_shape(self, out)?;
        let plain = CallParams::new(Affine::Identity, d, self.len());
        rows::map_rows_into(self, out, d, |isa, io, rows| {
            A::layer_norm_rows(isa, io, rows, plain.params(), eps)
        });
        Ok(())
    }

    fn layer_norm_inplace<P, Eps>(
        &mut self,
        gamma: &ArrayRef1<P>,
        beta: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let args = AffineArgs::new(self, gamma, beta, eps)?;
        let (params, eps) = (args.params(self.len()), args.eps);
        rows::map_rows_in_place(self, args.d, |isa, io, rows| {
            A::layer_norm_rows(isa, io, rows, params.params(), eps)
        });
        Ok(())
    }

    fn layer_norm_plain_inplace<Eps>(&mut self, eps: Eps) -> Result<(), NormError>
    where
        A: NormEps<Eps>,
    {
        let d = check::row_length(self)?;
        let eps = check::eps::<A, _>(eps)?;
        let plain = CallParams::new(Affine::Identity, d, self.len());
        rows::map_rows_in_place(self, d, |isa, io, rows| {
            A::layer_norm_rows(isa, io, rows, plain.params(), eps)
        });
        Ok(())
    }
}

/// The validated arguments of the affine forms.
struct AffineArgs<'a, A: NormScalar> {
    d: usize,
    gamma: Cow<'a, [Wide<A>]>,
    beta: Cow<'a, [Wide<A>]>,
    eps: f64,
}

impl<'a, A: NormScalar> AffineArgs<'a, A> {
    /// Checks in the order the errors are documented.
    fn new<D: Dimension, P, Eps>(
        x: &ArrayRef<A, D>,
        gamma: &'a ArrayRef1<P>,
        beta: &'a ArrayRef1<P>,
        eps: Eps,
    ) -> Result<Self, NormError>
    where
        A: NormParam<P> + NormEps<Eps>,
    {
        let d = check::row_length(x)?;
        Ok(AffineArgs {
            d,
            gamma: check::params::<A, _>(Operand::Gamma, gamma, d)?,
            beta: check::params::<A, _>(Operand::Beta, beta, d)?,
            eps: check::eps::<A, _>(eps)?,
        })
    }

    /// The parameters of a call over `elements` elements.
    fn params(&self, elements: usize) -> CallParams<'_, Wide<A>> {
        CallParams::new(
            Affine::ScaleShift(&self.gamma, &self.beta),
            self.d,
            elements,
        )
    }
}
