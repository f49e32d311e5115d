//! Gradients of LayerNorm and RMSNorm, and the forward forms that keep what
//! the gradients need.

use std::borrow::Cow;

use ndarray::{Array, Array1, ArrayRef, ArrayRef1, Axis, Dimension, Ix1, RemoveAxis};

use crate::blocks::{RowBlocks, RowBlocksMut};
use crate::error::{NormError, Operand};
use crate::kernel::backward::{
    ColumnSum, Gain, Inputs, LineAligned, Partials, RowCentring, RowScaling, Saved, BLOCK_ROWS,
};
use crate::kernel::{cache, Affine, Isa};
use crate::scalar::{NormEps, NormParam, NormScalar, Wide, WideParams};
use crate::{check, fresh, rows, sealed};

#[cfg(feature = "rayon")]
use rayon::prelude::*;

/// The gradients of a LayerNorm with respect to its input and parameters.
///
/// # Examples
///
/// ```
/// use ndarray::array;
/// use ndarray_layernorm::prelude::*;
///
/// let x = array![[1.0_f64, 3.0], [5.0, 2.0]];
/// let dy = array![[1.0, 0.0], [0.5, 0.5]];
/// let LayerNormGrads { dx, dgamma, dbeta } =
///     x.layer_norm_backward(&dy, &array![1.0, 1.0], 0.0)?;
/// assert_eq!(dx.shape(), x.shape());
/// assert_eq!(dbeta, array![1.5, 0.5]); // the sum of dy over rows
/// # let _ = dgamma;
/// # Ok::<(), NormError>(())
/// ```
///
/// `E` is the shape of `gamma`: one axis for the last-axis forms, the shape
/// of the axes normalised over for the `_over` forms
/// ([`LayerNormOverExt`](crate::LayerNormOverExt)). `G` is the element type
/// of `gamma` ([`NormParam`]): the input's own, or `f32` for half inputs
/// with `f32` parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormGrads<A, D: Dimension, E: Dimension = Ix1, G = A> {
    /// The gradient with respect to the input, of the input's shape.
    pub dx: Array<A, D>,
    /// The gradient with respect to `gamma`: `Σ dy ⊙ x̂` over every row.
    pub dgamma: Array<G, E>,
    /// The gradient with respect to `beta`: `Σ dy` over every row.
    pub dbeta: Array<G, E>,
}

/// The gradients of an RMSNorm with respect to its input and gain.
///
/// # Examples
///
/// ```
/// use ndarray::array;
/// use ndarray_layernorm::prelude::*;
///
/// let x = array![[3.0_f64, 4.0]];
/// let RmsNormGrads { dx, dgamma } =
///     x.rms_norm_backward(&array![[1.0, 0.0]], &array![1.0, 1.0], 0.0)?;
/// // x̂ = x / √12.5, so dgamma = dy ⊙ x̂.
/// assert!(dgamma.abs_diff_eq(&array![3.0 / 12.5_f64.sqrt(), 0.0], 1e-15));
/// # let _ = dx;
/// # Ok::<(), NormError>(())
/// ```
///
/// `E` is the shape of `gamma` and `G` its element type, as for
/// [`LayerNormGrads`].
#[derive(Clone, Debug, PartialEq)]
pub struct RmsNormGrads<A, D: Dimension, E: Dimension = Ix1, G = A> {
    /// The gradient with respect to the input, of the input's shape.
    pub dx: Array<A, D>,
    /// The gradient with respect to `gamma`: `Σ dy ⊙ x̂` over every row.
    pub dgamma: Array<G, E>,
}

/// What a LayerNorm backward pass needs of each row, saved by the forward
/// pass: the mean and `rstd = 1/√(var + eps)`, in `f64`.
///
/// `D` is the shape of the rows' index (the input's shape without its last
/// axis). Internally the mean keeps the compensated two-part form of the
/// forward pass, and rescaled rows keep their scale, so backward loses none
/// of the forward pass's accuracy; [`mean`](Self::mean) and
/// [`rstd`](Self::rstd) show the values rounded to `f64`.
///
/// A row holding a NaN or an infinity has NaN statistics. A constant row
/// has `rstd = 1/√eps`, `+∞` when `eps = 0`.
///
/// # Examples
///
/// ```
/// use ndarray::array;
/// use ndarray_layernorm::prelude::*;
///
/// let x = array![[2.0_f64, 4.0, 6.0, 8.0], [7.0, 7.0, 7.0, 7.0]];
/// let (_y, stats) = x.layer_norm_train(&array![1.0, 1.0, 1.0, 1.0], &array![0.0, 0.0, 0.0, 0.0], 0.0)?;
/// assert_eq!(stats.mean(), array![5.0, 7.0]);
/// assert_eq!(stats.rstd(), array![1.0 / 5.0_f64.sqrt(), f64::INFINITY]);
/// assert_eq!(stats.input_shape(), &[2, 4]);
/// # Ok::<(), NormError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormStats<D: Dimension> {
    input_shape: Vec<usize>,
    rows: Array<RowCentring, D>,
}

impl<D: Dimension> LayerNormStats<D> {
    /// The mean of every row.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let (_y, stats) = array![1.0_f32, 2.0].layer_norm_train(&array![1.0, 1.0], &array![0.0, 0.0], 1e-5)?;
    /// assert_eq!(stats.mean().into_scalar(), 1.5);
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn mean(&self) -> Array<f64, D> {
        self.rows.map(|row| row.mean())
    }

    /// `1/√(var + eps)` of every row.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let (_y, stats) = array![[1.0_f32, 3.0]].layer_norm_train(&array![1.0, 1.0], &array![0.0, 0.0], 0.0)?;
    /// assert_eq!(stats.rstd(), array![1.0]); // var = 1
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn rstd(&self) -> Array<f64, D> {
        self.rows.map(|row| row.rstd())
    }

    /// The shape of the input the statistics were computed for.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array3};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = Array3::<f64>::ones((2, 3, 4));
    /// let (_y, stats) = x.layer_norm_train(&array![1.0, 1.0, 1.0, 1.0], &array![0.0, 0.0, 0.0, 0.0], 1e-5)?;
    /// assert_eq!(stats.input_shape(), &[2, 3, 4]);
    /// assert_eq!(stats.mean().shape(), &[2, 3]);
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn input_shape(&self) -> &[usize] {
        &self.input_shape
    }

    pub(crate) fn rows(&self) -> &Array<RowCentring, D> {
        &self.rows
    }
}

/// What an RMSNorm backward pass needs of each row, saved by the forward
/// pass: `rrms = 1/√(mean(x²) + eps)`, in `f64`.
///
/// `D` is the shape of the rows' index (the input's shape without its last
/// axis). Rescaled rows keep their scale internally, so backward loses none
/// of the forward pass's accuracy. A row holding a NaN or an infinity has
/// NaN statistics; an all-zero row has `rrms = 1/√eps`, `+∞` when
/// `eps = 0`.
///
/// # Examples
///
/// ```
/// use ndarray::array;
/// use ndarray_layernorm::prelude::*;
///
/// let x = array![[3.0_f64, 4.0], [0.0, 0.0]];
/// let (_y, stats) = x.rms_norm_train(&array![1.0, 1.0], 0.0)?;
/// assert_eq!(stats.rrms(), array![1.0 / 12.5_f64.sqrt(), f64::INFINITY]);
/// # Ok::<(), NormError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RmsNormStats<D: Dimension> {
    input_shape: Vec<usize>,
    rows: Array<RowScaling, D>,
}

impl<D: Dimension> RmsNormStats<D> {
    /// `1/√(mean(x²) + eps)` of every row.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let (_y, stats) = array![[2.0_f32, -2.0]].rms_norm_train(&array![1.0, 1.0], 0.0)?;
    /// assert_eq!(stats.rrms(), array![0.5]);
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn rrms(&self) -> Array<f64, D> {
        self.rows.map(|row| row.rrms())
    }

    /// The shape of the input the statistics were computed for.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array2};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = Array2::<f32>::ones((5, 3));
    /// let (_y, stats) = x.rms_norm_train(&array![1.0, 1.0, 1.0], 1e-6)?;
    /// assert_eq!(stats.input_shape(), &[5, 3]);
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn input_shape(&self) -> &[usize] {
        &self.input_shape
    }

    pub(crate) fn rows(&self) -> &Array<RowScaling, D> {
        &self.rows
    }
}

/// LayerNorm for training: the forward pass that keeps each row's
/// statistics, and the gradients.
///
/// For a row `x` with `x̂ = (x - x̄) · rstd`, `rstd = 1/√(var + eps)`,
/// output `y = γ ⊙ x̂ + β` and `g = γ ⊙ dy`, where `dy` is the gradient of
/// the loss with respect to `y`:
///
/// ```text
/// dxᵢ = rstd · (gᵢ - mean(g) - x̂ᵢ · mean(g ⊙ x̂))      (exact for every eps)
/// dγ  = Σ dy ⊙ x̂        dβ = Σ dy                     (sums over every row)
/// ```
///
/// # Accuracy and determinism
///
/// Everything is accumulated in `f64` (row sums compensated) and each
/// output is rounded once to `A`, so `f32` gradients are the `f64`
/// gradients of the same data, rounded. `dγ` and `dβ` add the rows in
/// blocks of 64 in a fixed order, with the rounding error of every
/// block's addition kept: the bits do not depend on the memory layout or
/// on how many threads run the blocks. A sum that overflows on the way is
/// `±∞`, as plain addition gives.
///
/// A NaN or an infinity in a row of `x` gives NaN in that row of `dx` and
/// in every element of `dγ` (`dβ` does not depend on `x`). A NaN in `dy`
/// gives NaN in that row of `dx` and in that feature's element of `dγ` and
/// `dβ`; an infinity gives NaN in that row of `dx` too, but that feature's
/// elements of `dγ` and `dβ` are infinite (NaN where infinities of both
/// signs meet, and in `dγ` where `x̂ = 0`). With `eps = 0` a
/// constant row has no
/// derivative: its `dx` is NaN, while `dγ`, `dβ` stay finite (its output
/// is `β` whatever `γ`). Without rows (a leading axis of length 0), `dx`
/// is empty and `dγ`, `dβ` are zeros.
///
/// Implemented for [`ArrayRef`], so every owned array and view has these
/// methods. The trait is sealed.
pub trait LayerNormBackwardExt<A: NormScalar, D: Dimension>: sealed::Sealed {
    /// Returns the gradients of `y = layer_norm(x, gamma, beta, eps)` for
    /// the loss whose gradient with respect to `y` is `dy` (`beta` does not
    /// enter them).
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Gradient`] if `dy`
    ///   does not have the shape of `self`.
    /// - [`NormError::LengthMismatch`] if `gamma` does not have the length
    ///   of the last axis.
    /// - [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// // mean 5, var 5, x̂ = [-3, -1, 1, 3] / √5
    /// let x = array![[2.0_f64, 4.0, 6.0, 8.0]];
    /// let grads = x.layer_norm_backward(&array![[1.0, 0.0, 0.0, 0.0]], &array![1.0, 1.0, 1.0, 1.0], 0.0)?;
    /// let s5 = 5.0_f64.sqrt();
    /// assert!(grads.dx.abs_diff_eq(&array![[0.3 / s5, -0.4 / s5, -0.1 / s5, 0.2 / s5]], 1e-15));
    /// assert!(grads.dgamma.abs_diff_eq(&array![-3.0 / s5, 0.0, 0.0, 0.0], 1e-15));
    /// assert_eq!(grads.dbeta, array![1.0, 0.0, 0.0, 0.0]);
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_backward<P, Eps>(
        &self,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<LayerNormGrads<A, D, Ix1, P>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Returns [`layer_norm`](crate::LayerNormExt::layer_norm) of every row
    /// (the same bits) together with the statistics that
    /// [`layer_norm_backward_with_stats`](Self::layer_norm_backward_with_stats)
    /// needs.
    ///
    /// # Errors
    ///
    /// As [`layer_norm`](crate::LayerNormExt::layer_norm).
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[1.0_f32, 2.0, 3.0], [4.0, 0.0, 2.0]];
    /// let (gamma, beta) = (array![1.0, 2.0, 0.5], array![0.0, 0.1, 0.2]);
    /// let (y, stats) = x.layer_norm_train(&gamma, &beta, 1e-5)?;
    /// assert_eq!(y, x.layer_norm(&gamma, &beta, 1e-5)?);
    /// assert_eq!(stats.mean(), array![2.0, 2.0]);
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    fn layer_norm_train<P, Eps>(
        &self,
        gamma: &ArrayRef1<P>,
        beta: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(Array<A, D>, LayerNormStats<D::Smaller>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
        D: RemoveAxis;

    /// Returns the gradients as [`layer_norm_backward`](Self::layer_norm_backward)
    /// does (the same bits), from the statistics that
    /// [`layer_norm_train`](Self::layer_norm_train) saved for this input
    /// instead of recomputing them. `eps` is the one they were saved with.
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Gradient`] if `dy`
    ///   does not have the shape of `self`.
    /// - [`NormError::LengthMismatch`] if `gamma` does not have the length
    ///   of the last axis.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Stats`] if `stats`
    ///   were computed for an input of another shape.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[1.0_f64, 2.0, 4.0], [3.0, -1.0, 0.5]];
    /// let (gamma, beta) = (array![1.0, 0.5, 2.0], array![0.0, 0.0, 0.0]);
    /// let (y, stats) = x.layer_norm_train(&gamma, &beta, 1e-5)?;
    /// let dy = &y - &array![[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]; // d/dy of ½‖y - t‖²
    /// let grads = x.layer_norm_backward_with_stats(&dy, &gamma, &stats)?;
    /// assert_eq!(grads, x.layer_norm_backward(&dy, &gamma, 1e-5)?);
    /// # Ok::<(), NormError>(())
    /// ```
    fn layer_norm_backward_with_stats<P>(
        &self,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        stats: &LayerNormStats<D::Smaller>,
    ) -> Result<LayerNormGrads<A, D, Ix1, P>, NormError>
    where
        A: NormParam<P>,
        D: RemoveAxis;

    /// Writes `dx` into `dx` (an array of the input's shape, any layout)
    /// and returns `(dgamma, dbeta)`, with the bits of
    /// [`layer_norm_backward`](Self::layer_norm_backward). Nothing of the
    /// input's size is allocated, so a training loop can reuse its gradient
    /// buffer.
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Gradient`] if `dy`
    ///   does not have the shape of `self`.
    /// - [`NormError::LengthMismatch`] if `gamma` does not have the length
    ///   of the last axis.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Output`] if `dx` does
    ///   not have the shape of `self`.
    /// - [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    ///
    /// On error `dx` is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array2};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[2.0_f64, 4.0, 6.0, 8.0]];
    /// let (dy, gamma) = (array![[1.0, 0.0, 0.0, 0.0]], array![1.0, 1.0, 1.0, 1.0]);
    /// let mut dx = Array2::zeros((1, 4));
    /// let (dgamma, dbeta) = x.layer_norm_backward_into(&mut dx, &dy, &gamma, 0.0)?;
    /// let grads = x.layer_norm_backward(&dy, &gamma, 0.0)?;
    /// assert_eq!((dx, dgamma, dbeta), (grads.dx, grads.dgamma, grads.dbeta));
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    fn layer_norm_backward_into<P, Eps>(
        &self,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(Array1<P>, Array1<P>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Writes `dx` into `dx` and returns `(dgamma, dbeta)`, from the
    /// statistics that [`layer_norm_train`](Self::layer_norm_train) saved,
    /// with the bits of
    /// [`layer_norm_backward_with_stats`](Self::layer_norm_backward_with_stats).
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Gradient`] if `dy`
    ///   does not have the shape of `self`.
    /// - [`NormError::LengthMismatch`] if `gamma` does not have the length
    ///   of the last axis.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Output`] if `dx` does
    ///   not have the shape of `self`.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Stats`] if `stats`
    ///   were computed for an input of another shape.
    ///
    /// On error `dx` is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array2};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[1.0_f32, 2.0, 4.0], [3.0, -1.0, 0.5]];
    /// let (gamma, beta) = (array![1.0, 0.5, 2.0], array![0.0, 0.0, 0.0]);
    /// let (y, stats) = x.layer_norm_train(&gamma, &beta, 1e-5)?;
    /// let mut dx = Array2::zeros((2, 3));
    /// let (dgamma, dbeta) = x.layer_norm_backward_with_stats_into(&mut dx, &y, &gamma, &stats)?;
    /// assert_eq!(dx, x.layer_norm_backward(&y, &gamma, 1e-5)?.dx);
    /// # let _ = (dgamma, dbeta);
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    fn layer_norm_backward_with_stats_into<P>(
        &self,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        stats: &LayerNormStats<D::Smaller>,
    ) -> Result<(Array1<P>, Array1<P>), NormError>
    where
        A: NormParam<P>,
        D: RemoveAxis;
}

/// RMSNorm for training: the forward pass that keeps each row's statistics,
/// and the gradients.
///
/// For a row `x` with `x̂ = x · rrms`, `rrms = 1/√(mean(x²) + eps)`, output
/// `y = γ ⊙ x̂` and `g = γ ⊙ dy`, where `dy` is the gradient of the loss
/// with respect to `y`:
///
/// ```text
/// dxᵢ = rrms · (gᵢ - x̂ᵢ · mean(g ⊙ x̂))      (exact for every eps)
/// dγ  = Σ dy ⊙ x̂                            (sum over every row)
/// ```
///
/// Accuracy and determinism are as for [`LayerNormBackwardExt`]: `f64`
/// accumulation, one rounding per output, `dγ` summed in a fixed block
/// order. A row holding a NaN or an infinity gives NaN in its row of `dx`
/// and in `dγ`; with `eps = 0` an all-zero row has no derivative (its `dx`
/// is NaN, its output 0 whatever finite `γ`).
///
/// Implemented for [`ArrayRef`]; the trait is sealed.
pub trait RmsNormBackwardExt<A: NormScalar, D: Dimension>: sealed::Sealed {
    /// Returns the gradients of `y = rms_norm(x, gamma, eps)` for the loss
    /// whose gradient with respect to `y` is `dy`.
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Gradient`] if `dy`
    ///   does not have the shape of `self`.
    /// - [`NormError::LengthMismatch`] if `gamma` does not have the length
    ///   of the last axis.
    /// - [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// // rrms = 1/√12.5 = √2/5: dx = rrms · (dy - x̂ · mean(dy ⊙ x̂)) = rrms · [16, -12] / 25
    /// let x = array![[3.0_f64, 4.0]];
    /// let grads = x.rms_norm_backward(&array![[1.0, 0.0]], &array![1.0, 1.0], 0.0)?;
    /// let r = 2.0_f64.sqrt() / 5.0;
    /// assert!(grads.dx.abs_diff_eq(&array![[16.0 * r / 25.0, -12.0 * r / 25.0]], 1e-15));
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_backward<P, Eps>(
        &self,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<RmsNormGrads<A, D, Ix1, P>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Returns [`rms_norm`](crate::RmsNormExt::rms_norm) of every row (the
    /// same bits) together with the statistics that
    /// [`rms_norm_backward_with_stats`](Self::rms_norm_backward_with_stats)
    /// needs.
    ///
    /// # Errors
    ///
    /// As [`rms_norm`](crate::RmsNormExt::rms_norm).
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[2.0_f32, -2.0, 4.0, -4.0]];
    /// let (y, stats) = x.rms_norm_train(&array![1.0, 1.0, 1.0, 1.0], 1e-6)?;
    /// assert_eq!(y, x.rms_norm(&array![1.0, 1.0, 1.0, 1.0], 1e-6)?);
    /// assert!((stats.rrms()[0] - 1.0 / 10.000001_f64.sqrt()).abs() < 1e-15);
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    fn rms_norm_train<P, Eps>(
        &self,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(Array<A, D>, RmsNormStats<D::Smaller>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
        D: RemoveAxis;

    /// Returns the gradients as [`rms_norm_backward`](Self::rms_norm_backward)
    /// does (the same bits), from the statistics that
    /// [`rms_norm_train`](Self::rms_norm_train) saved for this input.
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Gradient`] if `dy`
    ///   does not have the shape of `self`.
    /// - [`NormError::LengthMismatch`] if `gamma` does not have the length
    ///   of the last axis.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Stats`] if `stats`
    ///   were computed for an input of another shape.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[0.5_f32, -1.0, 2.0]];
    /// let gamma = array![1.0, 2.0, 0.5];
    /// let (_y, stats) = x.rms_norm_train(&gamma, 1e-6)?;
    /// let dy = array![[0.1, 0.2, -0.3]];
    /// let grads = x.rms_norm_backward_with_stats(&dy, &gamma, &stats)?;
    /// assert_eq!(grads, x.rms_norm_backward(&dy, &gamma, 1e-6)?);
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_backward_with_stats<P>(
        &self,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        stats: &RmsNormStats<D::Smaller>,
    ) -> Result<RmsNormGrads<A, D, Ix1, P>, NormError>
    where
        A: NormParam<P>,
        D: RemoveAxis;

    /// Writes `dx` into `dx` (an array of the input's shape, any layout)
    /// and returns `dgamma`, with the bits of
    /// [`rms_norm_backward`](Self::rms_norm_backward). Nothing of the
    /// input's size is allocated.
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Gradient`] if `dy`
    ///   does not have the shape of `self`.
    /// - [`NormError::LengthMismatch`] if `gamma` does not have the length
    ///   of the last axis.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Output`] if `dx` does
    ///   not have the shape of `self`.
    /// - [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    ///
    /// On error `dx` is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array2};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[3.0_f64, 4.0]];
    /// let mut dx = Array2::zeros((1, 2));
    /// let dgamma = x.rms_norm_backward_into(&mut dx, &array![[1.0, 0.0]], &array![1.0, 1.0], 0.0)?;
    /// let r = 2.0_f64.sqrt() / 5.0; // 1/√12.5
    /// assert!(dx.abs_diff_eq(&array![[16.0 * r / 25.0, -12.0 * r / 25.0]], 1e-15));
    /// assert!(dgamma.abs_diff_eq(&array![3.0 * r, 0.0], 1e-15));
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_backward_into<P, Eps>(
        &self,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<Array1<P>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Writes `dx` into `dx` and returns `dgamma`, from the statistics that
    /// [`rms_norm_train`](Self::rms_norm_train) saved, with the bits of
    /// [`rms_norm_backward_with_stats`](Self::rms_norm_backward_with_stats).
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Gradient`] if `dy`
    ///   does not have the shape of `self`.
    /// - [`NormError::LengthMismatch`] if `gamma` does not have the length
    ///   of the last axis.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Output`] if `dx` does
    ///   not have the shape of `self`.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Stats`] if `stats`
    ///   were computed for an input of another shape.
    ///
    /// On error `dx` is left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Array2};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[0.5_f32, -1.0, 2.0]];
    /// let gamma = array![1.0, 2.0, 0.5];
    /// let (_y, stats) = x.rms_norm_train(&gamma, 1e-6)?;
    /// let dy = array![[0.1, 0.2, -0.3]];
    /// let mut dx = Array2::zeros((1, 3));
    /// let dgamma = x.rms_norm_backward_with_stats_into(&mut dx, &dy, &gamma, &stats)?;
    /// let grads = x.rms_norm_backward(&dy, &gamma, 1e-6)?;
    /// assert_eq!((dx, dgamma), (grads.dx, grads.dgamma));
    /// # Ok::<(), NormError>(())
    /// ```
    fn rms_norm_backward_with_stats_into<P>(
        &self,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        stats: &RmsNormStats<D::Smaller>,
    ) -> Result<Array1<P>, NormError>
    where
        A: NormParam<P>,
        D: RemoveAxis;
}

impl<A: NormScalar, D: Dimension> LayerNormBackwardExt<A, D> for ArrayRef<A, D> {
    fn layer_norm_backward<P, Eps>(
        &self,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<LayerNormGrads<A, D, Ix1, P>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma) = backward_args(self, dy, gamma)?;
        let eps = check::eps::<A, _>(eps)?;
        layer_norm_grads(self, dy, d, Gain::Gamma(&gamma), None, eps)
    }

    fn layer_norm_train<P, Eps>(
        &self,
        gamma: &ArrayRef1<P>,
        beta: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(Array<A, D>, LayerNormStats<D::Smaller>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
        D: RemoveAxis,
    {
        let d = check::row_length(self)?;
        let gamma = check::params::<A, _>(Operand::Gamma, gamma, d)?;
        let beta = check::params::<A, _>(Operand::Beta, beta, d)?;
        let eps = check::eps::<A, _>(eps)?;
        let leading = leading_of(self);
        layer_norm_train(self, d, leading, Affine::ScaleShift(&gamma, &beta), eps)
    }

    fn layer_norm_backward_with_stats<P>(
        &self,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        stats: &LayerNormStats<D::Smaller>,
    ) -> Result<LayerNormGrads<A, D, Ix1, P>, NormError>
    where
        A: NormParam<P>,
        D: RemoveAxis,
    {
        let (d, gamma) = backward_args(self, dy, gamma)?;
        check::shape_of(Operand::Stats, self, &stats.input_shape)?;
        check_last_axis_rows(self, stats.rows.shape())?;
        layer_norm_grads(
            self,
            dy,
            d,
            Gain::Gamma(&gamma),
            Some(&in_row_order(&stats.rows)),
            0.0,
        )
    }

    fn layer_norm_backward_into<P, Eps>(
        &self,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(Array1<P>, Array1<P>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma) = backward_args(self, dy, gamma)?;
        check::same_shape(self, dx)?;
        let eps = check::eps::<A, _>(eps)?;
        Ok(layer_norm_grads_into(
            self,
            dy,
            Dx::Callers(dx),
            d,
            Gain::Gamma(&gamma),
            None,
            eps,
        ))
    }

    fn layer_norm_backward_with_stats_into<P>(
        &self,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        stats: &LayerNormStats<D::Smaller>,
    ) -> Result<(Array1<P>, Array1<P>), NormError>
    where
        A: NormParam<P>,
        D: RemoveAxis,
    {
        let (d, gamma) = backward_args(self, dy, gamma)?;
        check::same_shape(self, dx)?;
        check::shape_of(Operand::Stats, self, &stats.input_shape)?;
        check_last_axis_rows(self, stats.rows.shape())?;
        Ok(layer_norm_grads_into(
            self,
            dy,
            Dx::Callers(dx),
            d,
            Gain::Gamma(&gamma),
            Some(&in_row_order(&stats.rows)),
            0.0,
        ))
    }
}

impl<A: NormScalar, D: Dimension> RmsNormBackwardExt<A, D> for ArrayRef<A, D> {
    fn rms_norm_backward<P, Eps>(
        &self,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<RmsNormGrads<A, D, Ix1, P>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma) = backward_args(self, dy, gamma)?;
        let eps = check::eps::<A, _>(eps)?;
        rms_norm_grads(self, dy, d, Gain::Gamma(&gamma), None, eps)
    }

    fn rms_norm_train<P, Eps>(
        &self,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(Array<A, D>, RmsNormStats<D::Smaller>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
        D: RemoveAxis,
    {
        let d = check::row_length(self)?;
        let gamma = check::params::<A, _>(Operand::Gamma, gamma, d)?;
        let eps = check::eps::<A, _>(eps)?;
        rms_norm_train(self, d, leading_of(self), Gain::Gamma(&gamma), eps)
    }

    fn rms_norm_backward_with_stats<P>(
        &self,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        stats: &RmsNormStats<D::Smaller>,
    ) -> Result<RmsNormGrads<A, D, Ix1, P>, NormError>
    where
        A: NormParam<P>,
        D: RemoveAxis,
    {
        let (d, gamma) = backward_args(self, dy, gamma)?;
        check::shape_of(Operand::Stats, self, &stats.input_shape)?;
        check_last_axis_rows(self, stats.rows.shape())?;
        rms_norm_grads(
            self,
            dy,
            d,
            Gain::Gamma(&gamma),
            Some(&in_row_order(&stats.rows)),
            0.0,
        )
    }

    fn rms_norm_backward_into<P, Eps>(
        &self,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<Array1<P>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma) = backward_args(self, dy, gamma)?;
        check::same_shape(self, dx)?;
        let eps = check::eps::<A, _>(eps)?;
        Ok(rms_norm_grads_into(
            self,
            dy,
            Dx::Callers(dx),
            d,
            Gain::Gamma(&gamma),
            None,
            eps,
        ))
    }

    fn rms_norm_backward_with_stats_into<P>(
        &self,
        dx: &mut ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        stats: &RmsNormStats<D::Smaller>,
    ) -> Result<Array1<P>, NormError>
    where
        A: NormParam<P>,
        D: RemoveAxis,
    {
        let (d, gamma) = backward_args(self, dy, gamma)?;
        check::same_shape(self, dx)?;
        check::shape_of(Operand::Stats, self, &stats.input_shape)?;
        check_last_axis_rows(self, stats.rows.shape())?;
        Ok(rms_norm_grads_into(
            self,
            dy,
            Dx::Callers(dx),
            d,
            Gain::Gamma(&gamma),
            Some(&in_row_order(&stats.rows)),
            0.0,
        ))
    }
}

/// Validates the input, `dy` and `gamma`, in the order the errors are
/// documented.
pub(crate) fn backward_args<'a, A: NormScalar + NormParam<P>, D: Dimension, P>(
    x: &ArrayRef<A, D>,
    dy: &ArrayRef<A, D>,
    gamma: &'a ArrayRef1<P>,
) -> Result<(usize, WideParams<'a, A>), NormError> {
    let d = check::row_length(x)?;
    check::shape_of(Operand::Gradient, x, dy.shape())?;
    let gamma = check::params::<A, _>(Operand::Gamma, gamma, d)?;
    Ok((d, gamma))
}

/// The shape of the rows' index of the last-axis forms: `x`'s without its
/// last axis.
pub(crate) fn leading_of<A, D: RemoveAxis>(x: &ArrayRef<A, D>) -> D::Smaller {
    x.raw_dim().remove_axis(Axis(x.ndim().saturating_sub(1)))
}

/// Checks that statistics indexed by `rows` were taken over the last axis
/// of `x` (not saved by a form over several axes of the same input).
fn check_last_axis_rows<A, D: RemoveAxis>(
    x: &ArrayRef<A, D>,
    rows: &[usize],
) -> Result<(), NormError> {
    let last = x.ndim().saturating_sub(1);
    check::saved_rows(x, leading_of(x).slice(), &x.shape()[last..], rows)
}

/// Checks that `stats` belong to an input of `x`'s shape.
pub(crate) fn check_layer_norm_stats<A, D: RemoveAxis>(
    x: &ArrayRef<A, D>,
    stats: &LayerNormStats<D::Smaller>,
) -> Result<(), NormError> {
    check::shape_of(Operand::Stats, x, &stats.input_shape)
}

/// Checks that `stats` belong to an input of `x`'s shape.
pub(crate) fn check_rms_norm_stats<A, D: RemoveAxis>(
    x: &ArrayRef<A, D>,
    stats: &RmsNormStats<D::Smaller>,
) -> Result<(), NormError> {
    check::shape_of(Operand::Stats, x, &stats.input_shape)
}

/// LayerNorm of `x` (validated, rows of length `d`) with its statistics,
/// in an array of the `leading` shape (the rows' index).
pub(crate) fn layer_norm_train<A: NormScalar, D: Dimension, S: Dimension>(
    x: &ArrayRef<A, D>,
    d: usize,
    leading: S,
    affine: Affine<'_, Wide<A>>,
    eps: f64,
) -> Trained<A, D, LayerNormStats<S>> {
    let (y, rows) = train_rows(
        x,
        d,
        leading,
        RowCentring::NOT_FINITE,
        |isa, x, y, stats| A::layer_norm_train_block(isa, x, y, d, affine, eps, stats),
    )?;
    let stats = LayerNormStats {
        input_shape: x.shape().to_vec(),
        rows,
    };
    Ok((y, stats))
}

/// RMSNorm of `x` (validated, rows of length `d`) with its statistics, in
/// an array of the `leading` shape (the rows' index).
pub(crate) fn rms_norm_train<A: NormScalar, D: Dimension, S: Dimension>(
    x: &ArrayRef<A, D>,
    d: usize,
    leading: S,
    gain: Gain<'_, Wide<A>>,
    eps: f64,
) -> Trained<A, D, RmsNormStats<S>> {
    let (y, rows) = train_rows(x, d, leading, RowScaling::NOT_FINITE, |isa, x, y, stats| {
        A::rms_norm_train_block(isa, x, y, d, gain.affine(), eps, stats)
    })?;
    let stats = RmsNormStats {
        input_shape: x.shape().to_vec(),
        rows,
    };
    Ok((y, stats))
}

/// A normalised array with what the training forward pass keeps of it.
type Trained<A, D, S> = Result<(Array<A, D>, S), NormError>;

/// The LayerNorm gradients of validated arguments, from `saved` statistics
/// or, without them, from statistics computed with `eps`.
pub(crate) fn layer_norm_grads<A: NormScalar + NormParam<P>, D: Dimension, P>(
    x: &ArrayRef<A, D>,
    dy: &ArrayRef<A, D>,
    d: usize,
    gain: Gain<'_, Wide<A>>,
    saved: Option<&[RowCentring]>,
    eps: f64,
) -> Result<LayerNormGrads<A, D, Ix1, P>, NormError> {
    let (dx, (dgamma, dbeta)) = fresh::array_and(x.raw_dim(), |dx| {
        layer_norm_grads_into(x, dy, Dx::Fresh(dx), d, gain, saved, eps)
    })?;
    Ok(LayerNormGrads { dx, dgamma, dbeta })
}

/// The array that backward writes `dx` into (validated, of the input's
/// shape).
pub(crate) enum Dx<'a, A, D> {
    /// Just allocated ([`fresh`]): written with plain stores, as the
    /// forward pass's allocating forms write theirs.
    Fresh(&'a mut ArrayRef<A, D>),
    /// The caller's own: written past the caches when it is large
    /// ([`rows::worth_streaming`], [`Inputs::stream`]).
    Callers(&'a mut ArrayRef<A, D>),
}

/// [`layer_norm_grads`] with `dx` written into `dx`; returns
/// `(dgamma, dbeta)`.
pub(crate) fn layer_norm_grads_into<A: NormScalar + NormParam<P>, D: Dimension, P>(
    x: &ArrayRef<A, D>,
    dy: &ArrayRef<A, D>,
    dx: Dx<'_, A, D>,
    d: usize,
    gain: Gain<'_, Wide<A>>,
    saved: Option<&[RowCentring]>,
    eps: f64,
) -> (Array1<P>, Array1<P>) {
    backward_blocks(x, dy, dx, d, gain, |isa, first, inputs, dx, partials| {
        let saved = match saved {
            Some(rows) => Saved::Rows(rows.get(first..).unwrap_or_default()),
            None => Saved::Compute(eps),
        };
        A::layer_norm_backward_block(isa, inputs, dx, saved, partials);
    })
}

/// The RMSNorm gradients of validated arguments, from `saved` statistics
/// or, without them, from statistics computed with `eps`.
pub(crate) fn rms_norm_grads<A: NormScalar + NormParam<P>, D: Dimension, P>(
    x: &ArrayRef<A, D>,
    dy: &ArrayRef<A, D>,
    d: usize,
    gain: Gain<'_, Wide<A>>,
    saved: Option<&[RowScaling]>,
    eps: f64,
) -> Result<RmsNormGrads<A, D, Ix1, P>, NormError> {
    let (dx, dgamma) = fresh::array_and(x.raw_dim(), |dx| {
        rms_norm_grads_into(x, dy, Dx::Fresh(dx), d, gain, saved, eps)
    })?;
    Ok(RmsNormGrads { dx, dgamma })
}

/// [`rms_norm_grads`] with `dx` written into `dx`; returns `dgamma`.
pub(crate) fn rms_norm_grads_into<A: NormScalar + NormParam<P>, D: Dimension, P>(
    x: &ArrayRef<A, D>,
    dy: &ArrayRef<A, D>,
    dx: Dx<'_, A, D>,
    d: usize,
    gain: Gain<'_, Wide<A>>,
    saved: Option<&[RowScaling]>,
    eps: f64,
) -> Array1<P> {
    let (dgamma, _) = backward_blocks(x, dy, dx, d, gain, |isa, first, inputs, dx, partials| {
        let saved = match saved {
            Some(rows) => Saved::Rows(rows.get(first..).unwrap_or_default()),
            None => Saved::Compute(eps),
        };
        A::rms_norm_backward_block(isa, inputs, dx, saved, partials);
    });
    dgamma
}

/// The saved entries in row order (borrowed: the arrays are built in
/// standard layout).
pub(crate) fn in_row_order<T: Copy, S: Dimension>(rows: &Array<T, S>) -> Cow<'_, [T]> {
    match rows.as_slice() {
        Some(rows) => Cow::Borrowed(rows),
        None => Cow::Owned(rows.iter().copied().collect()),
    }
}

/// Runs `block(isa, x, y, stats)` on [`BLOCK_ROWS`] rows at a time,
/// collecting the rows' statistics in an array of the `leading` shape
/// (first filled with `placeholder`).
fn train_rows<A: NormScalar, D: Dimension, S: Dimension, T: Copy + Send>(
    x: &ArrayRef<A, D>,
    d: usize,
    leading: S,
    placeholder: T,
    block: impl Fn(Isa, &[A], &mut [A], &mut [T]) + Sync,
) -> Trained<A, D, Array<T, S>> {
    let isa = Isa::detect();
    let mut stats = fresh::filled(leading, placeholder)?;
    let y = fresh::array(x.raw_dim(), |y| {
        let Some(slots) = stats.as_slice_mut() else {
            unreachable!("a new array is in standard layout");
        };
        // Each block writes only its own rows and statistics: any thread may
        // compute it.
        if let (Some(x), Some(y)) = (x.as_slice(), y.as_slice_mut()) {
            train_blocks(isa, (x, y, slots), d, parallel(x.len()), &block);
            return;
        }
        // Other layouts: gathered a wave of blocks at a time, whose blocks
        // the pool shares.
        let wave = wave_rows(x.len(), d);
        let mut xs = RowBlocks::new(x, d);
        let mut ys = RowBlocksMut::new(y, d);
        let mut slots = slots;
        loop {
            let x_wave = xs.next_block(wave);
            if x_wave.is_empty() {
                break;
            }
            let (wave_slots, rest) = std::mem::take(&mut slots).split_at_mut(x_wave.len() / d);
            slots = rest;
            let io = (x_wave, ys.next_block(wave), wave_slots);
            train_blocks(isa, io, d, wave > BLOCK_ROWS, &block);
        }
    })?;
    Ok((y, stats))
}

/// Runs `block` on the consecutive rows of `x` (rows of `d` elements),
/// [`BLOCK_ROWS`] at a time, writing `y` and one statistic per row: on the
/// rayon pool with `parallel`.
fn train_blocks<A: NormScalar, T: Copy + Send>(
    isa: Isa,
    (x, y, slots): (&[A], &mut [A], &mut [T]),
    d: usize,
    parallel: bool,
    block: &(impl Fn(Isa, &[A], &mut [A], &mut [T]) + Sync),
) {
    let block_len = BLOCK_ROWS * d;
    #[cfg(feature = "rayon")]
    if parallel {
        x.par_chunks(block_len)
            .zip(y.par_chunks_mut(block_len))
            .zip(slots.par_chunks_mut(BLOCK_ROWS))
            .with_min_len(blocks_per_task(d))
            .for_each(|((x, y), slots)| block(isa, x, y, slots));
        return;
    }
    let _ = parallel;
    let blocks = x.chunks(block_len).zip(y.chunks_mut(block_len));
    for ((x, y), slots) in blocks.zip(slots.chunks_mut(BLOCK_ROWS)) {
        block(isa, x, y, slots);
    }
}

/// Rows per wave of gathered blocks for a call over `elements` elements in
/// rows of `d`: one block on a single thread; on the pool, enough blocks to
/// share while the wave's buffers stay within [`GATHERED_WAVE_ELEMS`].
fn wave_rows(elements: usize, d: usize) -> usize {
    if !parallel(elements) || d > MAX_WAVE_ROW {
        return BLOCK_ROWS;
    }
    (GATHERED_WAVE_ELEMS / (BLOCK_ROWS * d)).max(2) * BLOCK_ROWS
}

/// The longest rows gathered in waves: two blocks of them, the fewest a
/// wave shares, hold 1 Mi elements per array.
const MAX_WAVE_ROW: usize = 1 << 13;

/// Elements per gathered wave: its `x`, `dy` and `dx` buffers stay in the
/// caches while the pool works on its blocks.
const GATHERED_WAVE_ELEMS: usize = 1 << 18;

/// The block callback of [`backward_blocks`]: `(isa, first_row, inputs, dx,
/// partials)`.
trait BackwardBlock<A>: Fn(Isa, usize, Inputs<'_, A>, &mut [A], &mut Partials) + Sync {}

impl<A, F: Fn(Isa, usize, Inputs<'_, A>, &mut [A], &mut Partials) + Sync> BackwardBlock<A> for F {}

/// The backward row walk: hands `block(isa, first_row, inputs, dx,
/// partials)` [`BLOCK_ROWS`] consecutive rows at a time (in logical order,
/// contiguous, whatever the layout) with the widened `gain`, `partials` at
/// 0, then adds the blocks' partials to the totals in block order.
///
/// Each block depends only on its own rows, so with the `rayon` feature a
/// large contiguous call computes its blocks on the current pool (see
/// [`parallel_blocks`]) and adds their partials afterwards, still one after
/// the other in block order: the bits do not depend on the thread count.
fn backward_blocks<A: NormScalar + NormParam<P>, D: Dimension, P>(
    x: &ArrayRef<A, D>,
    dy: &ArrayRef<A, D>,
    dx: Dx<'_, A, D>,
    d: usize,
    gain: Gain<'_, Wide<A>>,
    block: impl BackwardBlock<A>,
) -> (Array1<P>, Array1<P>) {
    let isa = Isa::detect();
    let (dx, may_stream) = match dx {
        Dx::Fresh(dx) => (dx, false),
        Dx::Callers(dx) => (dx, true),
    };
    Scratch::with(d, |scratch| {
        let Scratch {
            gain: widened,
            partials,
            dgamma,
            dbeta,
        } = scratch;
        // Gathered blocks of other layouts lie in a scratch buffer, which
        // has nothing ahead of it to ask for, and stays in cache.
        let contiguous =
            x.is_standard_layout() && dy.is_standard_layout() && dx.is_standard_layout();
        let prefetch = contiguous && cache::worth_prefetching(2 * x.len() * size_of::<A>());
        let streamed = match dx.as_slice() {
            // Half rows reach the kernels through widened buffers in cache,
            // which are never streamed: their `dx` is written from there.
            Some(dx)
                if contiguous
                    && may_stream
                    && size_of::<A>() == size_of::<Wide<A>>()
                    && rows::worth_streaming(dx, d) =>
            {
                Some(dx)
            }
            _ => None,
        };
        // Every block starts `BLOCK_ROWS · d` elements on, a whole number
        // of lines: its first row has the head of the call's first row.
        let head = streamed.map_or(0, cache::before_first_line);
        let stream = streamed.is_some();
        gain.widen_into(widened, head);
        let gain = widened.as_slice();
        #[cfg(feature = "rayon")]
        if parallel(x.len()) {
            if let (Some(x), Some(dy), Some(dx)) = (x.as_slice(), dy.as_slice(), dx.as_slice_mut())
            {
                let totals = (&mut *dgamma, &mut *dbeta);
                let inputs = Inputs {
                    x,
                    dy,
                    d,
                    gain,
                    prefetch,
                    stream,
                };
                parallel_blocks(isa, (inputs, dx), head, &block, totals);
                return (
                    Array1::from(dgamma.total(<A as NormParam<P>>::narrow_grad)),
                    Array1::from(dbeta.total(<A as NormParam<P>>::narrow_grad)),
                );
            }
        }
        // Other layouts: gathered a wave of blocks at a time, whose blocks
        // the pool shares (their partials still added in block order).
        let wave = wave_rows(x.len(), d);
        let mut xs = RowBlocks::new(x, d);
        let mut dys = RowBlocks::new(dy, d);
        let mut dxs = RowBlocksMut::new(dx, d);
        let mut first = 0;
        loop {
            let x_wave = xs.next_block(wave);
            if x_wave.is_empty() {
                break;
            }
            let inputs = Inputs {
                x: x_wave,
                dy: dys.next_block(wave),
                d,
                gain,
                prefetch,
                stream,
            };
            let dx_wave = dxs.next_block(wave);
            #[cfg(feature = "rayon")]
            if wave > BLOCK_ROWS {
                let shifted =
                    |isa, row, inputs: Inputs<'_, A>, dx: &mut [A], partials: &mut Partials| {
                        block(isa, first + row, inputs, dx, partials);
                    };
                parallel_blocks(
                    isa,
                    (inputs, dx_wave),
                    head,
                    &shifted,
                    (&mut *dgamma, &mut *dbeta),
                );
                first += wave;
                continue;
            }
            partials.clear(head);
            block(isa, first, inputs, dx_wave, partials);
            dgamma.add(partials.dgamma.as_slice());
            dbeta.add(partials.dbeta.as_slice());
            first += BLOCK_ROWS;
        }
        drop(dxs);
        (
            Array1::from(dgamma.total(<A as NormParam<P>>::narrow_grad)),
            Array1::from(dbeta.total(<A as NormParam<P>>::narrow_grad)),
        )
    })
}

/// The working memory of a backward call: the widened gain, one block's
/// partials and the totals. Each thread keeps the last one it used, for
/// rows of up to [`Scratch::KEPT_ROW`] elements, so that repeated calls
/// (a training loop) allocate nothing but their results.
struct Scratch {
    gain: LineAligned,
    partials: Partials,
    dgamma: ColumnSum,
    dbeta: ColumnSum,
}

thread_local! {
    static SCRATCH: std::cell::Cell<Option<Box<Scratch>>> = const { std::cell::Cell::new(None) };
}

impl Scratch {
    /// The longest row whose working memory a thread keeps (about
    /// `7 · 8 · KEPT_ROW` bytes).
    const KEPT_ROW: usize = 1 << 14;

    /// Runs `f` with working memory for rows of length `d`, all zero: this
    /// thread's kept one if any (taken out while `f` runs, so a nested call
    /// gets its own), else a new one.
    fn with<R>(d: usize, f: impl FnOnce(&mut Scratch) -> R) -> R {
        let kept = SCRATCH.try_with(std::cell::Cell::take).ok().flatten();
        let mut scratch = match kept {
            Some(mut scratch) => {
                scratch.partials.reset(d);
                scratch.dgamma.reset(d);
                scratch.dbeta.reset(d);
                scratch
            }
            None => Box::new(Scratch {
                gain: LineAligned::zeros(0),
                partials: Partials::new(d),
                dgamma: ColumnSum::new(d),
                dbeta: ColumnSum::new(d),
            }),
        };
        let result = f(&mut scratch);
        if d <= Self::KEPT_ROW {
            // Fails only while the thread is being torn down: then the
            // memory is simply freed.
            let _ = SCRATCH.try_with(|kept| kept.set(Some(scratch)));
        }
        result
    }
}

/// Elements per parallel task of the block walks (rounded to whole blocks,
/// at least one): enough that rayon's per-task cost is lost in the noise.
#[cfg(feature = "rayon")]
const TASK_ELEMS: usize = 1 << 14;

/// Elements per wave of [`parallel_blocks`] (rounded to whole blocks, at
/// least [`MIN_WAVE_BLOCKS`]): the partials of a wave's blocks are kept
/// until the wave ends, about 1/128 of the wave's elements in `f64` for
/// each of `dγ` and `dβ`, so waves bound that memory.
#[cfg(all(feature = "rayon", not(test)))]
const WAVE_ELEMS: usize = 1 << 21;

/// Small waves in unit tests, so that a small call runs several.
#[cfg(all(feature = "rayon", test))]
const WAVE_ELEMS: usize = 1 << 12;

/// Blocks per wave at least, so that very long rows still give every
/// thread work.
#[cfg(feature = "rayon")]
const MIN_WAVE_BLOCKS: usize = 16;

/// Whether a call over `elems` elements runs on the rayon pool: the
/// threshold of the forward row walk.
#[cfg(feature = "rayon")]
fn parallel(elems: usize) -> bool {
    elems >= crate::rows::PARALLEL_MIN_ELEMS && rayon::current_num_threads() > 1
}

/// Without the `rayon` feature every call runs on the calling thread.
#[cfg(not(feature = "rayon"))]
fn parallel(_elems: usize) -> bool {
    false
}

/// Blocks per parallel task for rows of length `d`.
#[cfg(feature = "rayon")]
fn blocks_per_task(d: usize) -> usize {
    (TASK_ELEMS / (BLOCK_ROWS * d).max(1)).max(1)
}

/// The backward walk of contiguous arrays on the current rayon pool: in
/// waves of consecutive blocks, each block's partials computed by any
/// thread into its own slot (which starts a line at feature `head`, see
/// [`Partials::clear`]), then the wave's slots added to `totals` in block
/// order.
#[cfg(feature = "rayon")]
fn parallel_blocks<A: NormScalar>(
    isa: Isa,
    (inputs, dx): (Inputs<'_, A>, &mut [A]),
    head: usize,
    block: &impl BackwardBlock<A>,
    (dgamma, dbeta): (&mut ColumnSum, &mut ColumnSum),
) {
    let Inputs {
        x,
        dy,
        d,
        gain,
        prefetch,
        stream,
    } = inputs;
    let block_len = BLOCK_ROWS * d.max(1);
    let wave = (WAVE_ELEMS / block_len).max(MIN_WAVE_BLOCKS);
    let slots = wave.min(x.len().div_ceil(block_len));
    let mut partials: Vec<Partials> = (0..slots).map(|_| Partials::new(d)).collect();
    let wave_len = wave * block_len;
    let waves = x.chunks(wave_len).zip(dy.chunks(wave_len));
    for (index, ((x, dy), dx)) in waves.zip(dx.chunks_mut(wave_len)).enumerate() {
        let first = index * wave * BLOCK_ROWS;
        let blocks = x.par_chunks(block_len).zip(dy.par_chunks(block_len));
        blocks
            .zip(dx.par_chunks_mut(block_len))
            .zip(partials.par_iter_mut())
            .enumerate()
            .with_min_len(blocks_per_task(d))
            .for_each(|(i, (((x, dy), dx), partials))| {
                partials.clear(head);
                let inputs = Inputs {
                    x,
                    dy,
                    d,
                    gain,
                    prefetch,
                    stream,
                };
                block(isa, first + i * BLOCK_ROWS, inputs, dx, partials);
            });
        for partials in partials.iter().take(x.len().div_ceil(block_len)) {
            dgamma.add(partials.dgamma.as_slice());
            dbeta.add(partials.dbeta.as_slice());
        }
    }
}

#[cfg(all(test, feature = "rayon"))]
mod tests {
    use ndarray::Array2;

    use super::*;

    /// Rows of very different sizes, so that the per-feature sums depend on
    /// the order of their terms.
    fn uneven(seed: u64, rows: usize, d: usize) -> Array2<f64> {
        let mut state = seed;
        Array2::from_shape_fn((rows, d), |(i, _)| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let unit = (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
            [1.0, 1e-3, 1e4, 1e8][i % 4] * unit + [0.0, -2e3][i % 2]
        })
    }

    /// A parallel call of many waves (small in unit tests), each of several
    /// tasks, gives the bits of the one-thread walk.
    #[test]
    fn waves_of_blocks_give_the_one_thread_bits() {
        let (rows, d) = ((1 << 17) / 8 + 37, 8);
        assert!(rows * d >= crate::rows::PARALLEL_MIN_ELEMS);
        assert!(rows / BLOCK_ROWS > 8 * MIN_WAVE_BLOCKS, "several waves");
        let x = uneven(1, rows, d);
        let dy = uneven(2, rows, d);
        let gain: Vec<f64> = (0..d).map(|i| 0.5 + i as f64).collect();
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let grads = layer_norm_grads(&x, &dy, d, Gain::Gamma(&gain), None, 1e-5).unwrap();
                let rms = rms_norm_grads(&x, &dy, d, Gain::OnePlus(&gain), None, 0.0).unwrap();
                let bits = |a: &[f64]| a.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                [
                    bits(grads.dx.as_slice().unwrap()),
                    bits(grads.dgamma.as_slice().unwrap()),
                    bits(grads.dbeta.as_slice().unwrap()),
                    bits(rms.dx.as_slice().unwrap()),
                    bits(rms.dgamma.as_slice().unwrap()),
                ]
            })
        };
        assert_eq!(run(1), run(2));
    }
}
