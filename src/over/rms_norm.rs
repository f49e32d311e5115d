//! RMSNorm over the axes from `Axis(a)` to the last.

use ndarray::{Array, ArrayRef, Axis, Dimension, IxDyn};

use super::layer_norm::{backward_args, shaped};
use crate::backward::{self, Dx, RmsNormGrads, RmsNormStats};
use crate::error::{NormError, Operand};
use crate::kernel::backward::Gain;
use crate::kernel::{Affine, CallParams};
use crate::scalar::{NormEps, NormParam, NormScalar, WideParams};
use crate::{check, rows, sealed};

/// RMS normalisation over several trailing axes: every subarray over the
/// axes from `Axis(a)` to the last is normalised as one row of the product
/// `d` of their lengths (PyTorch's `RMSNorm` with a `normalized_shape` of
/// the last `ndim - a` axes; ONNX's `RMSNormalization` with `axis = a`).
///
/// As [`LayerNormOverExt`](crate::LayerNormOverExt): `gamma` has the shape
/// of the normalised axes, results the input's shape, statistics the
/// leading shape; each method is its counterpart in
/// [`RmsNormExt`](crate::RmsNormExt) or
/// [`RmsNormBackwardExt`](crate::RmsNormBackwardExt) with `_over` appended
/// and the axis first, and gives the same bits as that method on a
/// standard-layout copy reshaped to `(leading, d)`, whatever the layout.
///
/// # Errors
///
/// [`NormError::AxisOutOfBounds`] and [`NormError::EmptyAxes`] first, then
/// as the last-axis counterpart, with [`NormError::TrailingShapeMismatch`]
/// for a `gamma` of another shape than the normalised axes.
///
/// # Examples
///
/// ```
/// use ndarray::{array, Axis};
/// use ndarray_layernorm::prelude::*;
///
/// let x = array![[[3.0_f64, -3.0], [3.0, 3.0]]];
/// let y = x.rms_norm_over(Axis(1), &array![[1.0, 1.0], [2.0, 0.5]], 0.0)?;
/// assert_eq!(y, array![[[1.0, -1.0], [2.0, 0.5]]]); // rms 3
/// # Ok::<(), NormError>(())
/// ```
pub trait RmsNormOverExt<A: NormScalar, D: Dimension>: sealed::Sealed {
    /// Returns `x / √(mean(x²) + eps) · gamma` over the axes from `axis` on,
    /// as a new array in standard layout.
    ///
    /// # Errors
    ///
    /// - [`NormError::AxisOutOfBounds`] if `axis` is not an axis of `self`.
    /// - [`NormError::EmptyAxes`] if an axis from `axis` on has length 0.
    /// - [`NormError::TrailingShapeMismatch`] if `gamma` does not have the
    ///   shape of the axes from `axis` on.
    /// - [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{Array, Array1, Array2, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = Array::from_shape_fn((3, 2, 4), |(i, j, k)| (i + j) as f32 - 0.25 * k as f32);
    /// let gamma = Array2::from_shape_fn((2, 4), |(j, k)| 1.0 + (j * k) as f32);
    /// let y = x.rms_norm_over(Axis(1), &gamma, 1e-6)?;
    /// let flat = x.to_shape((3, 8)).unwrap().rms_norm(&gamma.to_shape(8).unwrap(), 1e-6)?;
    /// assert_eq!(y.to_shape((3, 8)).unwrap(), flat);
    /// # let _ = Array1::<f32>::zeros(0);
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<Array<A, D>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Returns `x / √(mean(x²) + eps)` over the axes from `axis` on
    /// (without `gamma`), as a new array in standard layout.
    ///
    /// # Errors
    ///
    /// - [`NormError::AxisOutOfBounds`] if `axis` is not an axis of `self`.
    /// - [`NormError::EmptyAxes`] if an axis from `axis` on has length 0.
    /// - [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[2.0_f64, -2.0], [2.0, 2.0]];
    /// assert_eq!(x.rms_norm_plain_over(Axis(0), 0.0)?, array![[1.0, -1.0], [1.0, 1.0]]);
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_plain_over<Eps>(&self, axis: Axis, eps: Eps) -> Result<Array<A, D>, NormError>
    where
        A: NormEps<Eps>;

    /// Writes [`rms_norm_over`](Self::rms_norm_over) into `out`, which must
    /// have the shape of `self` (any layout).
    ///
    /// # Errors
    ///
    /// As [`rms_norm_over`](Self::rms_norm_over), and
    /// [`NormError::ShapeMismatch`] if `out` does not have the shape of
    /// `self`. On error `out` is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array3, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[[3.0_f32, 4.0]], [[1.0, -1.0]]];
    /// let mut out = Array3::zeros((2, 1, 2));
    /// x.rms_norm_into_over(Axis(1), &mut out, &array![[1.0, 2.0]], 0.0)?;
    /// let s = 12.5_f32.sqrt();
    /// assert!(out.abs_diff_eq(&array![[[3.0 / s, 8.0 / s]], [[1.0, -2.0]]], 1e-6));
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_into_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        out: &mut ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Writes [`rms_norm_plain_over`](Self::rms_norm_plain_over) into
    /// `out`, which must have the shape of `self`.
    ///
    /// # Errors
    ///
    /// As [`rms_norm_plain_over`](Self::rms_norm_plain_over), and
    /// [`NormError::ShapeMismatch`] if `out` does not have the shape of
    /// `self`. On error `out` is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array2, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let mut out = Array2::zeros((2, 1));
    /// array![[-5.0_f64], [5.0]].rms_norm_plain_into_over(Axis(0), &mut out, 0.0)?;
    /// assert_eq!(out, array![[-1.0], [1.0]]);
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_plain_into_over<Eps>(
        &self,
        axis: Axis,
        out: &mut ArrayRef<A, D>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormEps<Eps>;

    /// Replaces every subarray over the axes from `axis` on by its RMS
    /// normalisation.
    ///
    /// # Errors
    ///
    /// As [`rms_norm_over`](Self::rms_norm_over). On error the array is
    /// left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let mut x = array![[[4.0_f64, -4.0], [4.0, 4.0]]];
    /// x.rms_norm_inplace_over(Axis(1), &array![[1.0, 1.0], [0.5, 0.5]], 0.0)?;
    /// assert_eq!(x, array![[[1.0, -1.0], [0.5, 0.5]]]);
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_inplace_over<E: Dimension, P, Eps>(
        &mut self,
        axis: Axis,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Replaces every subarray over the axes from `axis` on by
    /// `x / √(mean(x²) + eps)`.
    ///
    /// # Errors
    ///
    /// As [`rms_norm_plain_over`](Self::rms_norm_plain_over). On error the
    /// array is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let mut x = array![[[2.0_f64, 2.0], [-2.0, 2.0]]];
    /// x.rms_norm_plain_inplace_over(Axis(0), 0.0)?;
    /// assert_eq!(x, array![[[1.0, 1.0], [-1.0, 1.0]]]);
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_plain_inplace_over<Eps>(&mut self, axis: Axis, eps: Eps) -> Result<(), NormError>
    where
        A: NormEps<Eps>;

    /// Returns [`rms_norm_over`](Self::rms_norm_over) (the same bits) and
    /// the statistics that
    /// [`rms_norm_backward_with_stats_over`](Self::rms_norm_backward_with_stats_over)
    /// needs, whose [`rrms`](RmsNormStats::rrms) has the leading shape.
    ///
    /// # Errors
    ///
    /// As [`rms_norm_over`](Self::rms_norm_over).
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array2, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[[2.0_f64, -2.0], [2.0, 2.0]], [[0.5, 0.5], [-0.5, 0.5]]];
    /// let (y, stats) = x.rms_norm_train_over(Axis(1), &Array2::ones((2, 2)), 0.0)?;
    /// assert_eq!(y, x.rms_norm_plain_over(Axis(1), 0.0)?);
    /// assert_eq!(stats.rrms(), array![0.5, 2.0].into_dyn());
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    fn rms_norm_train_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(Array<A, D>, RmsNormStats<IxDyn>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Returns the gradients of [`rms_norm_over`](Self::rms_norm_over) for
    /// the output gradient `dy`, with `dgamma` of the shape of `gamma`.
    ///
    /// # Errors
    ///
    /// - [`NormError::AxisOutOfBounds`] if `axis` is not an axis of `self`.
    /// - [`NormError::EmptyAxes`] if an axis from `axis` on has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Gradient`] if `dy`
    ///   does not have the shape of `self`.
    /// - [`NormError::TrailingShapeMismatch`] if `gamma` does not have the
    ///   shape of the axes from `axis` on.
    /// - [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{Array2, Array3, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = Array3::from_shape_fn((3, 2, 2), |(i, j, k)| 1.0 + (i + 2 * j) as f64 - k as f64);
    /// let dy = Array3::from_elem((3, 2, 2), 0.25);
    /// let gamma = Array2::from_elem((2, 2), 2.0);
    /// let grads = x.rms_norm_backward_over(Axis(1), &dy, &gamma, 1e-6)?;
    /// let flat = x.to_shape((3, 4)).unwrap().rms_norm_backward(
    ///     &dy.to_shape((3, 4)).unwrap(),
    ///     &gamma.to_shape(4).unwrap(),
    ///     1e-6,
    /// )?;
    /// assert_eq!(grads.dx.to_shape((3, 4)).unwrap(), flat.dx);
    /// assert_eq!(grads.dgamma.to_shape(4).unwrap(), flat.dgamma);
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_backward_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<RmsNormGrads<A, D, E, P>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Returns the gradients as
    /// [`rms_norm_backward_over`](Self::rms_norm_backward_over) does (the
    /// same bits), from the statistics that
    /// [`rms_norm_train_over`](Self::rms_norm_train_over) saved for this
    /// input and `axis`.
    ///
    /// # Errors
    ///
    /// As [`rms_norm_backward_over`](Self::rms_norm_backward_over) without
    /// the check of `eps`, and [`NormError::ShapeMismatch`] with
    /// [`Operand::Stats`] if `stats` were computed for an input of another
    /// shape, [`NormError::TrailingShapeMismatch`] with [`Operand::Stats`]
    /// if they were computed from another axis.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{Array2, Array3, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = Array3::from_shape_fn((2, 2, 3), |(i, j, k)| (i + j + k) as f32);
    /// let gamma = Array2::from_elem((2, 3), 0.5);
    /// let (y, stats) = x.rms_norm_train_over(Axis(1), &gamma, 1e-6)?;
    /// let grads = x.rms_norm_backward_with_stats_over(Axis(1), &y, &gamma, &stats)?;
    /// assert_eq!(grads, x.rms_norm_backward_over(Axis(1), &y, &gamma, 1e-6)?);
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_backward_with_stats_over<E: Dimension, P>(
        &self,
        axis: Axis,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        stats: &RmsNormStats<IxDyn>,
    ) -> Result<RmsNormGrads<A, D, E, P>, NormError>
    where
        A: NormParam<P>;

    /// Writes `dx` into `dx` (an array of the input's shape, any layout)
    /// and returns `dgamma` of the shape of `gamma`, with the bits of
    /// [`rms_norm_backward_over`](Self::rms_norm_backward_over).
    ///
    /// # Errors
    ///
    /// As [`rms_norm_backward_over`](Self::rms_norm_backward_over), and
    /// [`NormError::ShapeMismatch`] with [`Operand::Output`] if `dx` does
    /// not have the shape of `self` (checked after `gamma`). On error `dx`
    /// is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{Array2, Array3, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = Array3::from_shape_fn((2, 2, 3), |(i, j, k)| (i + j * k) as f64 - 1.0);
    /// let (dy, gamma) = (Array3::ones((2, 2, 3)), Array2::ones((2, 3)));
    /// let mut dx = Array3::zeros((2, 2, 3));
    /// let dgamma = x.rms_norm_backward_into_over(Axis(1), &mut dx, &dy, &gamma, 0.0)?;
    /// let grads = x.rms_norm_backward_over(Axis(1), &dy, &gamma, 0.0)?;
    /// assert_eq!((dx, dgamma), (grads.dx, grads.dgamma));
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_backward_into_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<Array<P, E>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Writes `dx` into `dx` and returns `dgamma`, from the statistics that
    /// [`rms_norm_train_over`](Self::rms_norm_train_over) saved, with the
    /// bits of
    /// [`rms_norm_backward_with_stats_over`](Self::rms_norm_backward_with_stats_over).
    ///
    /// # Errors
    ///
    /// As [`rms_norm_backward_with_stats_over`](Self::rms_norm_backward_with_stats_over),
    /// and [`NormError::ShapeMismatch`] with [`Operand::Output`] if `dx`
    /// does not have the shape of `self` (checked after `gamma`). On error
    /// `dx` is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{Array2, Array3, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = Array3::from_shape_fn((2, 2, 3), |(i, j, k)| (i + j * k) as f32 + 0.5);
    /// let gamma = Array2::ones((2, 3));
    /// let (y, stats) = x.rms_norm_train_over(Axis(1), &gamma, 1e-6)?;
    /// let mut dx = Array3::zeros((2, 2, 3));
    /// x.rms_norm_backward_with_stats_into_over(Axis(1), &mut dx, &y, &gamma, &stats)?;
    /// assert_eq!(dx, x.rms_norm_backward_over(Axis(1), &y, &gamma, 1e-6)?.dx);
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_backward_with_stats_into_over<E: Dimension, P>(
        &self,
        axis: Axis,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        stats: &RmsNormStats<IxDyn>,
    ) -> Result<Array<P, E>, NormError>
    where
        A: NormParam<P>;
}

impl<A: NormScalar, D: Dimension> RmsNormOverExt<A, D> for ArrayRef<A, D> {
    fn rms_norm_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<Array<A, D>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma, eps) = scale_args(self, axis, gamma, eps)?;
        let params = CallParams::new(Affine::Scale(&gamma), d, self.len());
        rows::map_rows(self, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, params.params(), eps)
        })
    }

    fn rms_norm_plain_over<Eps>(&self, axis: Axis, eps: Eps) -> Result<Array<A, D>, NormError>
    where
        A: NormEps<Eps>,
    {
        let d = check::rows_over(self, axis)?;
        let eps = check::eps::<A, _>(eps)?;
        let plain = CallParams::new(Affine::Identity, d, self.len());
        rows::map_rows(self, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, plain.params(), eps)
        })
    }

    fn rms_norm_into_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        out: &mut ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma, eps) = scale_args(self, axis, gamma, eps)?;
        check::same_shape(self, out)?;
        let params = CallParams::new(Affine::Scale(&gamma), d, self.len());
        rows::map_rows_into(self, out, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, params.params(), eps)
        });
        Ok(())
    }

    fn rms_norm_plain_into_over<Eps>(
        &self,
        axis: Axis,
        out: &mut ArrayRef<A, D>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormEps<Eps>,
    {
        let d = check::rows_over(self, axis)?;
        let eps = check::eps::<A, _>(eps)?;
        check::same_shape(self, out)?;
        let plain = CallParams::new(Affine::Identity, d, self.len());
        rows::map_rows_into(self, out, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, plain.params(), eps)
        });
        Ok(())
    }

    fn rms_norm_inplace_over<E: Dimension, P, Eps>(
        &mut self,
        axis: Axis,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma, eps) = scale_args(self, axis, gamma, eps)?;
        let params = CallParams::new(Affine::Scale(&gamma), d, self.len());
        rows::map_rows_in_place(self, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, params.params(), eps)
        });
        Ok(())
    }

    fn rms_norm_plain_inplace_over<Eps>(&mut self, axis: Axis, eps: Eps) -> Result<(), NormError>
    where
        A: NormEps<Eps>,
    {
        let d = check::rows_over(self, axis)?;
        let eps = check::eps::<A, _>(eps)?;
        let plain = CallParams::new(Affine::Identity, d, self.len());
        rows::map_rows_in_place(self, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, plain.params(), eps)
        });
        Ok(())
    }

    fn rms_norm_train_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(Array<A, D>, RmsNormStats<IxDyn>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma, eps) = scale_args(self, axis, gamma, eps)?;
        let leading = super::leading(self, axis);
        backward::rms_norm_train(self, d, leading, Gain::Gamma(&gamma), eps)
    }

    fn rms_norm_backward_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<RmsNormGrads<A, D, E, P>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gain) = backward_args(self, axis, dy, gamma)?;
        let eps = check::eps::<A, _>(eps)?;
        let grads = backward::rms_norm_grads(self, dy, d, Gain::Gamma(&gain), None, eps)?;
        Ok(RmsNormGrads {
            dx: grads.dx,
            dgamma: shaped(grads.dgamma, gamma),
        })
    }

    fn rms_norm_backward_with_stats_over<E: Dimension, P>(
        &self,
        axis: Axis,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        stats: &RmsNormStats<IxDyn>,
    ) -> Result<RmsNormGrads<A, D, E, P>, NormError>
    where
        A: NormParam<P>,
    {
        let (d, gain) = backward_args(self, axis, dy, gamma)?;
        super::check_stats(self, axis, stats.input_shape(), stats.rows().shape())?;
        let saved = backward::in_row_order(stats.rows());
        let grads = backward::rms_norm_grads(self, dy, d, Gain::Gamma(&gain), Some(&saved), 0.0)?;
        Ok(RmsNormGrads {
            dx: grads.dx,
            dgamma: shaped(grads.dgamma, gamma),
        })
    }

    fn rms_norm_backward_into_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<Array<P, E>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gain) = backward_args(self, axis, dy, gamma)?;
        check::same_shape(self, dx)?;
        let eps = check::eps::<A, _>(eps)?;
        let dgamma = backward::rms_norm_grads_into(
            self,
            dy,
            Dx::Callers(dx),
            d,
            Gain::Gamma(&gain),
            None,
            eps,
        );
        Ok(shaped(dgamma, gamma))
    }

    fn rms_norm_backward_with_stats_into_over<E: Dimension, P>(
        &self,
        axis: Axis,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        stats: &RmsNormStats<IxDyn>,
    ) -> Result<Array<P, E>, NormError>
    where
        A: NormParam<P>,
    {
        let (d, gain) = backward_args(self, axis, dy, gamma)?;
        check::same_shape(self, dx)?;
        super::check_stats(self, axis, stats.input_shape(), stats.rows().shape())?;
        let saved = backward::in_row_order(stats.rows());
        let dgamma = backward::rms_norm_grads_into(
            self,
            dy,
            Dx::Callers(dx),
            d,
            Gain::Gamma(&gain),
            Some(&saved),
            0.0,
        );
        Ok(shaped(dgamma, gamma))
    }
}

/// Validates the arguments of the forms with `gamma`, in the order the
/// errors are documented.
fn scale_args<
    'a,
    A: NormScalar + NormParam<P> + NormEps<Eps>,
    D: Dimension,
    E: Dimension,
    P,
    Eps,
>(
    x: &ArrayRef<A, D>,
    axis: Axis,
    gamma: &'a ArrayRef<P, E>,
    eps: Eps,
) -> Result<(usize, WideParams<'a, A>, f64), NormError> {
    let d = check::rows_over(x, axis)?;
    let gamma = check::trailing_params(Operand::Gamma, x, axis, gamma)?;
    Ok((d, gamma, check::eps::<A, _>(eps)?))
}
