//! RMSNorm along the last axis.

use ndarray::{Array, ArrayRef, ArrayRef1, Dimension};

use crate::error::{NormError, Operand};
use crate::kernel::{Affine, CallParams};
use crate::scalar::{NormEps, NormParam, NormScalar, WideParams};
use crate::{check, rows, sealed};

/// Root-mean-square normalisation of every vector along the last axis of an
/// array (the normalisation of Llama-style models).
///
/// For an array of shape `(…, d)`, each of its rows `x` of length `d` becomes
///
/// ```text
///               xᵢ                        1   d
/// yᵢ = γᵢ ―――――――――――――――――,    ms(x) = ―   ∑ xᵢ²
///         √(ms(x) + eps)                  d  i=1
/// ```
///
/// There is no centring (the mean is not subtracted) and no shift. The
/// `_plain` forms leave out `γ` without building a vector of ones.
///
/// Implemented for [`ArrayRef`], so every owned array and view of `f32` or
/// `f64`, of any dimension and layout, has these methods. The trait is
/// sealed.
///
/// # Accuracy
///
/// The mean square is accumulated in `f64` with compensated sums. An `f32`
/// output is within one unit in the last place of the exactly rounded
/// result, an `f64` output within a few. `f64` rows whose squares overflow
/// or underflow (`1e200`, `1e-200`) are rescaled by a power of two, exactly,
/// and stay accurate. An all-zero row gives zeros (`0 · gamma`, so where
/// `gamma` is finite), also with `eps = 0`. A
/// row holding a NaN or an infinity gives NaN in that row only. The result
/// bits do not depend on the memory layout.
pub trait RmsNormExt<A: NormScalar, D: Dimension>: sealed::Sealed {
    /// Returns `x / √(mean(x²) + eps) · gamma` of every row, as a new array
    /// in standard (row-major) layout.
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::LengthMismatch`] if `gamma` does not have the length of
    ///   the last axis.
    /// - [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[2.0_f64, -2.0, 4.0, -4.0]];
    /// let y = x.rms_norm(&array![1.0, 1.0, 1.0, 1.0], 1e-6)?;
    /// assert!(y.abs_diff_eq(&array![[0.6325, -0.6325, 1.2649, -1.2649]], 1e-4));
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm<P, Eps>(&self, gamma: &ArrayRef1<P>, eps: Eps) -> Result<Array<A, D>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Returns `x / √(mean(x²) + eps)` of every row (RMSNorm without
    /// `gamma`), as a new array in standard layout.
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
    /// let x = array![[3.0_f64, 4.0], [0.0, 0.0]];
    /// let y = x.rms_norm_plain(0.0)?;
    /// let s = 12.5_f64.sqrt();
    /// assert!(y.abs_diff_eq(&array![[3.0 / s, 4.0 / s], [0.0, 0.0]], 1e-15));
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_plain<Eps>(&self, eps: Eps) -> Result<Array<A, D>, NormError>
    where
        A: NormEps<Eps>;

    /// Writes the RMS normalisation of every row into `out`, which must have
    /// the shape of `self` (any layout). Allocates nothing when `self` and
    /// `out` are in standard (row-major) layout and `gamma` contiguous,
    /// except that an `f32` call over at least 4 rows of 17 to 1024 features
    /// converts `gamma` to `f64` into a buffer of at most 8.125 KiB, which the
    /// calling thread allocates on its first such call and keeps for later
    /// ones.
    ///
    /// # Errors
    ///
    /// As [`rms_norm`](RmsNormExt::rms_norm), and
    /// [`NormError::ShapeMismatch`] if `out` does not have the shape of
    /// `self`. On error `out` is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array2};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[1.0_f32, 2.0, 3.0, 4.0]];
    /// let mut out = Array2::zeros((1, 4));
    /// x.rms_norm_into(&mut out, &array![1.0, 1.0, 1.0, 1.0], 0.0)?;
    /// assert!(out.abs_diff_eq(&array![[0.3651, 0.7303, 1.0954, 1.4606]], 1e-4));
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_into<P, Eps>(
        &self,
        out: &mut ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Writes `x / √(mean(x²) + eps)` of every row into `out`, which must
    /// have the shape of `self`.
    ///
    /// # Errors
    ///
    /// As [`rms_norm_plain`](RmsNormExt::rms_norm_plain), and
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
    /// x.rms_norm_plain_into(&mut out, 0.0)?;
    /// assert!((out[0] - 0.8485281374238571).abs() < 1e-15);
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_plain_into<Eps>(&self, out: &mut ArrayRef<A, D>, eps: Eps) -> Result<(), NormError>
    where
        A: NormEps<Eps>;

    /// Replaces every row by its RMS normalisation. Allocates nothing when
    /// `self` is in standard (row-major) layout and `gamma` contiguous,
    /// except that an `f32` call over at least 4 rows of 17 to 1024 features
    /// converts `gamma` to `f64` into a buffer of at most 8.125 KiB, which the
    /// calling thread allocates on its first such call and keeps for later
    /// ones.
    ///
    /// # Errors
    ///
    /// As [`rms_norm`](RmsNormExt::rms_norm). On error the array is left
    /// untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let mut x = array![[2.0_f64, -2.0, 4.0, -4.0]];
    /// x.rms_norm_inplace(&array![2.0, 2.0, 1.0, 1.0], 1e-6)?;
    /// assert!(x.abs_diff_eq(&array![[1.2649, -1.2649, 1.2649, -1.2649]], 1e-4));
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_inplace<P, Eps>(&mut self, gamma: &ArrayRef1<P>, eps: Eps) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Replaces every row by `x / √(mean(x²) + eps)`.
    ///
    /// # Errors
    ///
    /// As [`rms_norm_plain`](RmsNormExt::rms_norm_plain). On error the array
    /// is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let mut x = array![1e200_f64, -1e200];
    /// x.rms_norm_plain_inplace(0.0)?; // x² overflows f64; the result does not
    /// assert!(x.abs_diff_eq(&array![1.0, -1.0], 1e-15));
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_plain_inplace<Eps>(&mut self, eps: Eps) -> Result<(), NormError>
    where
        A: NormEps<Eps>;
}

impl<A: NormScalar, D: Dimension> RmsNormExt<A, D> for ArrayRef<A, D> {
    fn rms_norm<P, Eps>(&self, gamma: &ArrayRef1<P>, eps: Eps) -> Result<Array<A, D>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma, eps) = scale_args(self, gamma, eps)?;
        let params = CallParams::new(Affine::Scale(&gamma), d, self.len());
        rows::map_rows(self, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, params.params(), eps)
        })
    }

    fn rms_norm_plain<Eps>(&self, eps: Eps) -> Result<Array<A, D>, NormError>
    where
        A: NormEps<Eps>,
    {
        let d = check::row_length(self)?;
        let eps = check::eps::<A, _>(eps)?;
        let plain = CallParams::new(Affine::Identity, d, self.len());
        rows::map_rows(self, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, plain.params(), eps)
        })
    }

    fn rms_norm_into<P, Eps>(
        &self,
        out: &mut ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma, eps) = scale_args(self, gamma, eps)?;
        check::same_shape(self, out)?;
        let params = CallParams::new(Affine::Scale(&gamma), d, self.len());
        rows::map_rows_into(self, out, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, params.params(), eps)
        });
        Ok(())
    }

    fn rms_norm_plain_into<Eps>(&self, out: &mut ArrayRef<A, D>, eps: Eps) -> Result<(), NormError>
    where
        A: NormEps<Eps>,
    {
        let d = check::row_length(self)?;
        let eps = check::eps::<A, _>(eps)?;
        check::same_shape(self, out)?;
        let plain = CallParams::new(Affine::Identity, d, self.len());
        rows::map_rows_into(self, out, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, plain.params(), eps)
        });
        Ok(())
    }

    fn rms_norm_inplace<P, Eps>(&mut self, gamma: &ArrayRef1<P>, eps: Eps) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma, eps) = scale_args(self, gamma, eps)?;
        let params = CallParams::new(Affine::Scale(&gamma), d, self.len());
        rows::map_rows_in_place(self, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, params.params(), eps)
        });
        Ok(())
    }

    fn rms_norm_plain_inplace<Eps>(&mut self, eps: Eps) -> Result<(), NormError>
    where
        A: NormEps<Eps>,
    {
        let d = check::row_length(self)?;
        let eps = check::eps::<A, _>(eps)?;
        let plain = CallParams::new(Affine::Identity, d, self.len());
        rows::map_rows_in_place(self, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, plain.params(), eps)
        });
        Ok(())
    }
}

/// Validates the arguments of the forms with `gamma`, in the order the
/// errors are documented.
fn scale_args<'a, A: NormScalar + NormParam<P> + NormEps<Eps>, D: Dimension, P, Eps>(
    x: &ArrayRef<A, D>,
    gamma: &'a ArrayRef1<P>,
    eps: Eps,
) -> Result<(usize, WideParams<'a, A>, f64), NormError> {
    let d = check::row_length(x)?;
    let gamma = check::params::<A, _>(Operand::Gamma, gamma, d)?;
    Ok((d, gamma, check::eps::<A, _>(eps)?))
}
