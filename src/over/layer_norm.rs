//! LayerNorm over the axes from `Axis(a)` to the last.

use std::borrow::Cow;

use ndarray::{Array, ArrayRef, Axis, Dimension, Ix1, IxDyn};

use crate::backward::{self, Dx, LayerNormGrads, LayerNormStats};
use crate::error::{NormError, Operand};
use crate::kernel::backward::Gain;
use crate::kernel::{Affine, CallParams};
use crate::scalar::{NormEps, NormParam, NormScalar, Wide, WideParams};
use crate::{check, rows, sealed};

/// Layer normalisation over several trailing axes: every subarray over the
/// axes from `Axis(a)` to the last is normalised as one row of the product
/// `d` of their lengths (PyTorch's `normalized_shape` of the last
/// `ndim - a` axes; ONNX's `axis = a`).
///
/// `gamma` and `beta` have the shape of those axes, in any layout and of
/// any [`Dimension`] type (`IxDyn` too). Results have the input's shape;
/// statistics have the leading shape (the axes before `a`). Each method is
/// its last-axis counterpart in [`LayerNormExt`](crate::LayerNormExt) or
/// [`LayerNormBackwardExt`](crate::LayerNormBackwardExt) with `_over`
/// appended and the axis first, and gives the same bits as that method on a
/// standard-layout copy reshaped to `(leading, d)`, whatever the layout of
/// the input. `Axis(ndim - 1)` is the last-axis form itself.
///
/// The rows are not copied as a whole: where the normalised axes merge into
/// one stride (standard layout, steps along the leading axes) they are
/// walked as rows along one axis; otherwise (Fortran order, permuted axes)
/// each block of rows is gathered in logical order into a small buffer.
///
/// # Errors
///
/// Every method checks, before anything else:
///
/// - [`NormError::AxisOutOfBounds`] if `a` is not below the number of axes;
/// - [`NormError::EmptyAxes`] if an axis from `a` on has length 0;
///
/// then as its last-axis counterpart, with
/// [`NormError::TrailingShapeMismatch`] (naming both shapes) for a `gamma`
/// or `beta` that does not have the shape of the axes from `a` on.
///
/// # Examples
///
/// GroupNorm with one group: an `(N, C, H, W)` batch normalised over
/// `(C, H, W)`.
///
/// ```
/// use ndarray::{Array, Array1, Array3, Axis};
/// use ndarray_layernorm::prelude::*;
///
/// let x = Array::from_shape_fn((2, 3, 4, 4), |(n, c, h, w)| (n + 2 * c + h * w) as f32);
/// let gamma = Array3::from_elem((3, 4, 4), 0.5);
/// let beta = Array3::zeros((3, 4, 4));
/// let y = x.layer_norm_over(Axis(1), &gamma, &beta, 1e-5)?;
///
/// // The same bits as the last-axis form on rows of 3 · 4 · 4 = 48.
/// let rows = x.to_shape((2, 48)).unwrap();
/// let flat = rows.layer_norm(&Array1::from_elem(48, 0.5), &Array1::zeros(48), 1e-5)?;
/// assert_eq!(y.to_shape((2, 48)).unwrap(), flat);
///
/// // Fortran order gives the same bits too.
/// let t = x.t();
/// let f = t.as_standard_layout().reversed_axes();
/// assert_eq!(f.layer_norm_over(Axis(1), &gamma, &beta, 1e-5)?, y);
/// # Ok::<(), NormError>(())
/// ```
pub trait LayerNormOverExt<A: NormScalar, D: Dimension>: sealed::Sealed {
    /// Returns the layer normalisation over the axes from `axis` on, as a
    /// new array in standard layout:
    /// [`layer_norm`](crate::LayerNormExt::layer_norm) over several axes.
    ///
    /// # Errors
    ///
    /// - [`NormError::AxisOutOfBounds`] if `axis` is not an axis of `self`.
    /// - [`NormError::EmptyAxes`] if an axis from `axis` on has length 0.
    /// - [`NormError::TrailingShapeMismatch`] if `gamma` or `beta` does not
    ///   have the shape of the axes from `axis` on.
    /// - [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[[1.0_f64, 2.0], [3.0, 4.0]], [[5.0, 5.0], [5.0, 5.0]]];
    /// let (gamma, beta) = (array![[1.0, 1.0], [1.0, 1.0]], array![[0.0, 0.0], [0.0, 1.0]]);
    /// let y = x.layer_norm_over(Axis(1), &gamma, &beta, 0.0)?;
    /// let s = 1.25_f64.sqrt(); // mean 2.5, var 1.25
    /// assert!(y.abs_diff_eq(&array![[[-1.5 / s, -0.5 / s], [0.5 / s, 1.0 + 1.5 / s]], [[0.0, 0.0], [0.0, 1.0]]], 1e-15));
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        gamma: &ArrayRef<P, E>,
        beta: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<Array<A, D>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Returns `(x - mean) / √(var + eps)` over the axes from `axis` on
    /// (without `gamma` and `beta`), as a new array in standard layout.
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
    /// let x = array![[3.0_f64, 4.0], [3.0, 4.0]];
    /// assert_eq!(x.layer_norm_plain_over(Axis(0), 0.0)?, array![[-1.0, 1.0], [-1.0, 1.0]]);
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_plain_over<Eps>(&self, axis: Axis, eps: Eps) -> Result<Array<A, D>, NormError>
    where
        A: NormEps<Eps>;

    /// Writes the layer normalisation over the axes from `axis` on into
    /// `out`, which must have the shape of `self` (any layout).
    ///
    /// # Errors
    ///
    /// As [`layer_norm_over`](Self::layer_norm_over), and
    /// [`NormError::ShapeMismatch`] if `out` does not have the shape of
    /// `self`. On error `out` is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{Array2, Array3, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = Array3::from_shape_fn((4, 2, 3), |(i, j, k)| (i * j + k) as f32);
    /// let (gamma, beta) = (Array2::ones((2, 3)), Array2::zeros((2, 3)));
    /// let mut out = Array3::zeros((4, 2, 3));
    /// x.layer_norm_into_over(Axis(1), &mut out, &gamma, &beta, 1e-5)?;
    /// assert_eq!(out, x.layer_norm_over(Axis(1), &gamma, &beta, 1e-5)?);
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_into_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        out: &mut ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        beta: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Writes `(x - mean) / √(var + eps)` over the axes from `axis` on into
    /// `out`, which must have the shape of `self`.
    ///
    /// # Errors
    ///
    /// As [`layer_norm_plain_over`](Self::layer_norm_plain_over), and
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
    /// array![[3.0_f64], [4.0]].layer_norm_plain_into_over(Axis(0), &mut out, 0.0)?;
    /// assert_eq!(out, array![[-1.0], [1.0]]);
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_plain_into_over<Eps>(
        &self,
        axis: Axis,
        out: &mut ArrayRef<A, D>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormEps<Eps>;

    /// Replaces every subarray over the axes from `axis` on by its layer
    /// normalisation.
    ///
    /// # Errors
    ///
    /// As [`layer_norm_over`](Self::layer_norm_over). On error the array
    /// is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let mut x = array![[[2.0_f64, 2.0], [2.0, 2.0]]];
    /// let beta = array![[0.5, -0.5], [1.0, 0.0]];
    /// x.layer_norm_inplace_over(Axis(1), &array![[1.0, 1.0], [1.0, 1.0]], &beta, 1e-5)?;
    /// assert_eq!(x, array![[[0.5, -0.5], [1.0, 0.0]]]); // a constant row gives beta
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_inplace_over<E: Dimension, P, Eps>(
        &mut self,
        axis: Axis,
        gamma: &ArrayRef<P, E>,
        beta: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Replaces every subarray over the axes from `axis` on by
    /// `(x - mean) / √(var + eps)`.
    ///
    /// # Errors
    ///
    /// As [`layer_norm_plain_over`](Self::layer_norm_plain_over). On error
    /// the array is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let mut x = array![[1.0_f64, 3.0], [1.0, 3.0]];
    /// x.layer_norm_plain_inplace_over(Axis(0), 0.0)?;
    /// assert_eq!(x, array![[-1.0, 1.0], [-1.0, 1.0]]);
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_plain_inplace_over<Eps>(&mut self, axis: Axis, eps: Eps) -> Result<(), NormError>
    where
        A: NormEps<Eps>;

    /// Returns [`layer_norm_over`](Self::layer_norm_over) (the same bits)
    /// and the statistics that
    /// [`layer_norm_backward_with_stats_over`](Self::layer_norm_backward_with_stats_over)
    /// needs: ONNX's `Mean` and `InvStdDev`, whose
    /// [`mean`](LayerNormStats::mean) and [`rstd`](LayerNormStats::rstd)
    /// have the leading shape (the axes before `axis`).
    ///
    /// # Errors
    ///
    /// As [`layer_norm_over`](Self::layer_norm_over).
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array2, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[[1.0_f64, 1.0], [5.0, 5.0]], [[0.0, 0.0], [4.0, 4.0]]];
    /// let (gamma, beta) = (Array2::ones((2, 2)), Array2::zeros((2, 2)));
    /// let (y, stats) = x.layer_norm_train_over(Axis(1), &gamma, &beta, 0.0)?;
    /// assert_eq!(y, x.layer_norm_over(Axis(1), &gamma, &beta, 0.0)?);
    /// assert_eq!(stats.mean(), array![3.0, 2.0].into_dyn());
    /// assert_eq!(stats.rstd(), array![0.5, 0.5].into_dyn()); // var 4 in both rows
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    fn layer_norm_train_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        gamma: &ArrayRef<P, E>,
        beta: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(Array<A, D>, LayerNormStats<IxDyn>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Returns the gradients of
    /// [`layer_norm_over`](Self::layer_norm_over) for the output gradient
    /// `dy`, with `dgamma` and `dbeta` of the shape of `gamma`:
    /// [`layer_norm_backward`](crate::LayerNormBackwardExt::layer_norm_backward)
    /// over several axes.
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
    /// use ndarray::{Array1, Array2, Array3, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = Array3::from_shape_fn((3, 2, 2), |(i, j, k)| (i + 3 * j * k) as f64);
    /// let dy = Array3::from_shape_fn((3, 2, 2), |(i, j, k)| (i + j) as f64 - k as f64);
    /// let gamma = Array2::from_shape_fn((2, 2), |(j, k)| 1.0 + (j + k) as f64);
    /// let grads = x.layer_norm_backward_over(Axis(1), &dy, &gamma, 1e-5)?;
    /// assert_eq!(grads.dgamma.shape(), &[2, 2]);
    ///
    /// let flat = x.to_shape((3, 4)).unwrap().layer_norm_backward(
    ///     &dy.to_shape((3, 4)).unwrap(),
    ///     &gamma.to_shape(4).unwrap(),
    ///     1e-5,
    /// )?;
    /// assert_eq!(grads.dx.to_shape((3, 4)).unwrap(), flat.dx);
    /// assert_eq!(grads.dbeta.to_shape(4).unwrap(), flat.dbeta);
    /// # let _ = Array1::<f64>::zeros(0);
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_backward_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<LayerNormGrads<A, D, E, P>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Returns the gradients as
    /// [`layer_norm_backward_over`](Self::layer_norm_backward_over) does
    /// (the same bits), from the statistics that
    /// [`layer_norm_train_over`](Self::layer_norm_train_over) saved for
    /// this input and `axis`.
    ///
    /// # Errors
    ///
    /// As [`layer_norm_backward_over`](Self::layer_norm_backward_over)
    /// without the check of `eps`, and [`NormError::ShapeMismatch`] with
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
    /// let x = Array3::from_shape_fn((3, 2, 2), |(i, j, k)| (i * j) as f32 - k as f32);
    /// let (gamma, beta) = (Array2::from_elem((2, 2), 1.5), Array2::zeros((2, 2)));
    /// let (y, stats) = x.layer_norm_train_over(Axis(1), &gamma, &beta, 1e-5)?;
    /// let grads = x.layer_norm_backward_with_stats_over(Axis(1), &y, &gamma, &stats)?;
    /// assert_eq!(grads, x.layer_norm_backward_over(Axis(1), &y, &gamma, 1e-5)?);
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_backward_with_stats_over<E: Dimension, P>(
        &self,
        axis: Axis,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        stats: &LayerNormStats<IxDyn>,
    ) -> Result<LayerNormGrads<A, D, E, P>, NormError>
    where
        A: NormParam<P>;

    /// Writes `dx` into `dx` (an array of the input's shape, any layout)
    /// and returns `(dgamma, dbeta)` of the shape of `gamma`, with the bits
    /// of [`layer_norm_backward_over`](Self::layer_norm_backward_over).
    ///
    /// # Errors
    ///
    /// As [`layer_norm_backward_over`](Self::layer_norm_backward_over), and
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
    /// let x = Array3::from_shape_fn((2, 2, 3), |(i, j, k)| (i + j * k) as f64);
    /// let (dy, gamma) = (Array3::ones((2, 2, 3)) - &x, Array2::ones((2, 3)));
    /// let mut dx = Array3::zeros((2, 2, 3));
    /// let (dgamma, dbeta) = x.layer_norm_backward_into_over(Axis(1), &mut dx, &dy, &gamma, 0.0)?;
    /// let grads = x.layer_norm_backward_over(Axis(1), &dy, &gamma, 0.0)?;
    /// assert_eq!((dx, dgamma, dbeta), (grads.dx, grads.dgamma, grads.dbeta));
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    fn layer_norm_backward_into_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(Array<P, E>, Array<P, E>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Writes `dx` into `dx` and returns `(dgamma, dbeta)`, from the
    /// statistics that [`layer_norm_train_over`](Self::layer_norm_train_over)
    /// saved, with the bits of
    /// [`layer_norm_backward_with_stats_over`](Self::layer_norm_backward_with_stats_over).
    ///
    /// # Errors
    ///
    /// As [`layer_norm_backward_with_stats_over`](Self::layer_norm_backward_with_stats_over),
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
    /// let x = Array3::from_shape_fn((2, 2, 3), |(i, j, k)| (i + j * k) as f32);
    /// let (gamma, beta) = (Array2::ones((2, 3)), Array2::zeros((2, 3)));
    /// let (y, stats) = x.layer_norm_train_over(Axis(1), &gamma, &beta, 1e-5)?;
    /// let mut dx = Array3::zeros((2, 2, 3));
    /// x.layer_norm_backward_with_stats_into_over(Axis(1), &mut dx, &y, &gamma, &stats)?;
    /// assert_eq!(dx, x.layer_norm_backward_over(Axis(1), &y, &gamma, 1e-5)?.dx);
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    fn layer_norm_backward_with_stats_into_over<E: Dimension, P>(
        &self,
        axis: Axis,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        stats: &LayerNormStats<IxDyn>,
    ) -> Result<(Array<P, E>, Array<P, E>), NormError>
    where
        A: NormParam<P>;
}

impl<A: NormScalar, D: Dimension> LayerNormOverExt<A, D> for ArrayRef<A, D> {
    fn layer_norm_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        gamma: &ArrayRef<P, E>,
        beta: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<Array<A, D>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let args = OverArgs::new(self, axis, gamma, beta, eps)?;
        let (params, eps) = (args.params(self.len()), args.eps);
        rows::map_rows(self, args.d, |isa, io, rows| {
            A::layer_norm_rows(isa, io, rows, params.params(), eps)
        })
    }

    fn layer_norm_plain_over<Eps>(&self, axis: Axis, eps: Eps) -> Result<Array<A, D>, NormError>
    where
        A: NormEps<Eps>,
    {
        let d = check::rows_over(self, axis)?;
        let eps = check::eps::<A, _>(eps)?;
        let plain = CallParams::new(Affine::Identity, d, self.len());
        rows::map_rows(self, d, |isa, io, rows| {
            A::layer_norm_rows(isa, io, rows, plain.params(), eps)
        })
    }

    fn layer_norm_into_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        out: &mut ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        beta: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let args = OverArgs::new(self, axis, gamma, beta, eps)?;
        check::same_shape(self, out)?;
        let (params, eps) = (args.params(self.len()), args.eps);
        rows::map_rows_into(self, out, args.d, |isa, io, rows| {
            A::layer_norm_rows(isa, io, rows, params.params(), eps)
        });
        Ok(())
    }

    fn layer_norm_plain_into_over<Eps>(
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
            A::layer_norm_rows(isa, io, rows, plain.params(), eps)
        });
        Ok(())
    }

    fn layer_norm_inplace_over<E: Dimension, P, Eps>(
        &mut self,
        axis: Axis,
        gamma: &ArrayRef<P, E>,
        beta: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let args = OverArgs::new(self, axis, gamma, beta, eps)?;
        let (params, eps) = (args.params(self.len()), args.eps);
        rows::map_rows_in_place(self, args.d, |isa, io, rows| {
            A::layer_norm_rows(isa, io, rows, params.params(), eps)
        });
        Ok(())
    }

    fn layer_norm_plain_inplace_over<Eps>(&mut self, axis: Axis, eps: Eps) -> Result<(), NormError>
    where
        A: NormEps<Eps>,
    {
        let d = check::rows_over(self, axis)?;
        let eps = check::eps::<A, _>(eps)?;
        let plain = CallParams::new(Affine::Identity, d, self.len());
        rows::map_rows_in_place(self, d, |isa, io, rows| {
            A::layer_norm_rows(isa, io, rows, plain.params(), eps)
        });
        Ok(())
    }

    fn layer_norm_train_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        gamma: &ArrayRef<P, E>,
        beta: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(Array<A, D>, LayerNormStats<IxDyn>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let args = OverArgs::new(self, axis, gamma, beta, eps)?;
        let affine = Affine::ScaleShift(&args.gamma, &args.beta);
        let leading = super::leading(self, axis);
        backward::layer_norm_train(self, args.d, leading, affine, args.eps)
    }

    fn layer_norm_backward_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<LayerNormGrads<A, D, E, P>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gain) = backward_args(self, axis, dy, gamma)?;
        let eps = check::eps::<A, _>(eps)?;
        let grads = backward::layer_norm_grads(self, dy, d, Gain::Gamma(&gain), None, eps)?;
        shaped_grads(grads, gamma)
    }

    fn layer_norm_backward_with_stats_over<E: Dimension, P>(
        &self,
        axis: Axis,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        stats: &LayerNormStats<IxDyn>,
    ) -> Result<LayerNormGrads<A, D, E, P>, NormError>
    where
        A: NormParam<P>,
    {
        let (d, gain) = backward_args(self, axis, dy, gamma)?;
        super::check_stats(self, axis, stats.input_shape(), stats.rows().shape())?;
        let saved = backward::in_row_order(stats.rows());
        let grads = backward::layer_norm_grads(self, dy, d, Gain::Gamma(&gain), Some(&saved), 0.0)?;
        shaped_grads(grads, gamma)
    }

    fn layer_norm_backward_into_over<E: Dimension, P, Eps>(
        &self,
        axis: Axis,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<(Array<P, E>, Array<P, E>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gain) = backward_args(self, axis, dy, gamma)?;
        check::same_shape(self, dx)?;
        let eps = check::eps::<A, _>(eps)?;
        let (dgamma, dbeta) = backward::layer_norm_grads_into(
            self,
            dy,
            Dx::Callers(dx),
            d,
            Gain::Gamma(&gain),
            None,
            eps,
        );
        Ok((shaped(dgamma, gamma), shaped(dbeta, gamma)))
    }

    fn layer_norm_backward_with_stats_into_over<E: Dimension, P>(
        &self,
        axis: Axis,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef<P, E>,
        stats: &LayerNormStats<IxDyn>,
    ) -> Result<(Array<P, E>, Array<P, E>), NormError>
    where
        A: NormParam<P>,
    {
        let (d, gain) = backward_args(self, axis, dy, gamma)?;
        check::same_shape(self, dx)?;
        super::check_stats(self, axis, stats.input_shape(), stats.rows().shape())?;
        let saved = backward::in_row_order(stats.rows());
        let (dgamma, dbeta) = backward::layer_norm_grads_into(
            self,
            dy,
            Dx::Callers(dx),
            d,
            Gain::Gamma(&gain),
            Some(&saved),
            0.0,
        );
        Ok((shaped(dgamma, gamma), shaped(dbeta, gamma)))
    }
}

/// Validates the input, `dy` and `gamma` of a backward call over the axes
/// from `axis` on, in the order the errors are documented.
pub(super) fn backward_args<'a, A: NormScalar + NormParam<P>, D: Dimension, E: Dimension, P>(
    x: &ArrayRef<A, D>,
    axis: Axis,
    dy: &ArrayRef<A, D>,
    gamma: &'a ArrayRef<P, E>,
) -> Result<(usize, WideParams<'a, A>), NormError> {
    let d = check::rows_over(x, axis)?;
    check::shape_of(Operand::Gradient, x, dy.shape())?;
    let gamma = check::trailing_params(Operand::Gamma, x, axis, gamma)?;
    Ok((d, gamma))
}

/// A per-feature gradient, computed in row-major order, in the shape of
/// `gamma`.
pub(super) fn shaped<G, P, E: Dimension>(
    grad: ndarray::Array1<G>,
    gamma: &ArrayRef<P, E>,
) -> Array<G, E> {
    let len = grad.len();
    grad.into_shape_with_order(gamma.raw_dim())
        .unwrap_or_else(|_| unreachable!("a gradient of {len} elements has the shape of gamma"))
}

fn shaped_grads<A, D: Dimension, E: Dimension, P>(
    grads: LayerNormGrads<A, D, Ix1, P>,
    gamma: &ArrayRef<P, E>,
) -> Result<LayerNormGrads<A, D, E, P>, NormError> {
    Ok(LayerNormGrads {
        dx: grads.dx,
        dgamma: shaped(grads.dgamma, gamma),
        dbeta: shaped(grads.dbeta, gamma),
    })
}

/// The validated arguments of the affine forms over several axes.
struct OverArgs<'a, A: NormScalar> {
    d: usize,
    gamma: Cow<'a, [Wide<A>]>,
    beta: Cow<'a, [Wide<A>]>,
    eps: f64,
}

impl<'a, A: NormScalar> OverArgs<'a, A> {
    /// Checks in the order the errors are documented.
    fn new<D: Dimension, E: Dimension, P, Eps>(
        x: &ArrayRef<A, D>,
        axis: Axis,
        gamma: &'a ArrayRef<P, E>,
        beta: &'a ArrayRef<P, E>,
        eps: Eps,
    ) -> Result<Self, NormError>
    where
        A: NormParam<P> + NormEps<Eps>,
    {
        let d = check::rows_over(x, axis)?;
        Ok(OverArgs {
            d,
            gamma: check::trailing_params(Operand::Gamma, x, axis, gamma)?,
            beta: check::trailing_params(Operand::Beta, x, axis, beta)?,
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
