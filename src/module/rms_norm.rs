//! The RMSNorm layer.

use std::marker::PhantomData;

use ndarray::{Array, Array1, ArrayRef, ArrayViewMut1, Dimension, Ix1, RemoveAxis};

use crate::backward::{self, RmsNormGrads, RmsNormStats};
use crate::error::{NormError, Operand};
use crate::kernel::backward::Gain;
use crate::kernel::CallParams;
use crate::scalar::{NormEps, NormParam, NormScalar, Wide, WideParams};
use crate::{check, rows};

/// An RMSNorm layer over the last axis, or over the last axes of a
/// normalised shape ([`with_normalized_shape`](Self::with_normalized_shape)):
/// owns `gamma` and `eps`.
///
/// `y = x / √(mean(x²) + eps) · gamma` for every row. In the zero-centred
/// parametrisation of Gemma-style models ([`zero_centred`](Self::zero_centred))
/// the stored weight `w` starts at 0 and the gain is `1 + w`, formed in
/// `f64`: `y = x / √(mean(x²) + eps) · (1 + w)`. The layer is plain data,
/// like [`LayerNorm`](crate::LayerNorm).
///
/// # Examples
///
/// ```
/// use ndarray::array;
/// use ndarray_layernorm::prelude::*;
///
/// let x = array![[2.0_f32, -2.0, 4.0, -4.0]];
/// let llama = RmsNorm::<f32>::new(4);
/// let gemma = RmsNorm::<f32>::zero_centred(4);
/// assert_eq!(llama.forward(&x)?, gemma.forward(&x)?); // gamma = 1 and 1 + w = 1
/// # Ok::<(), NormError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RmsNorm<A, P = A> {
    gamma: Array1<P>,
    /// Exactly the value given (an `f32` `eps` widened).
    eps: f64,
    zero_centred: bool,
    shape: Vec<usize>,
    input: PhantomData<fn() -> A>,
}

impl<A: NormScalar> RmsNorm<A> {
    /// A layer for rows of length `d` as a fresh model starts it:
    /// `gamma = 1`, `eps = 1e-6`. With `d = 0` every input is refused, as
    /// for [`LayerNorm::new`](crate::LayerNorm::new).
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::RmsNorm;
    ///
    /// let norm = RmsNorm::<f64>::new(2);
    /// assert_eq!(norm.gamma(), array![1.0, 1.0]);
    /// assert_eq!(norm.eps(), 1e-6);
    /// assert!(!norm.is_zero_centred());
    /// ```
    pub fn new(d: usize) -> Self {
        RmsNorm {
            gamma: Array1::ones(d),
            eps: A::kept_eps_value(A::kept_eps(1e-6)),
            zero_centred: false,
            shape: vec![d],
            input: PhantomData,
        }
    }

    /// A zero-centred layer for rows of length `d`, as a fresh Gemma-style
    /// model starts it: weight `w = 0` (gain `1 + w = 1`), `eps = 1e-6`.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::RmsNorm;
    ///
    /// let norm = RmsNorm::<f32>::zero_centred(2);
    /// assert_eq!(norm.gamma(), array![0.0, 0.0]); // w; the gain is 1 + w
    /// assert!(norm.is_zero_centred());
    /// ```
    pub fn zero_centred(d: usize) -> Self {
        RmsNorm {
            gamma: Array1::zeros(d),
            eps: A::kept_eps_value(A::kept_eps(1e-6)),
            zero_centred: true,
            shape: vec![d],
            input: PhantomData,
        }
    }

    /// A layer with gain `gamma`.
    ///
    /// # Errors
    ///
    /// [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let norm = RmsNorm::from_parts(array![2.0_f64, 2.0], 0.0)?;
    /// assert_eq!(norm.forward(&array![3.0, -3.0])?, array![2.0, -2.0]);
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn from_parts<Eps>(gamma: Array1<A>, eps: Eps) -> Result<Self, NormError>
    where
        A: NormEps<Eps>,
    {
        let eps = check::eps::<A, _>(eps)?;
        Ok(RmsNorm {
            shape: vec![gamma.len()],
            input: PhantomData,
            gamma,
            eps,
            zero_centred: false,
        })
    }

    /// A zero-centred layer with weight `w`: the gain is `1 + w`.
    ///
    /// # Errors
    ///
    /// [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let norm = RmsNorm::from_parts_zero_centred(array![1.0_f64, -0.5], 0.0)?;
    /// assert_eq!(norm.forward(&array![3.0, -3.0])?, array![2.0, -0.5]);
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn from_parts_zero_centred<Eps>(w: Array1<A>, eps: Eps) -> Result<Self, NormError>
    where
        A: NormEps<Eps>,
    {
        let eps = check::eps::<A, _>(eps)?;
        Ok(RmsNorm {
            shape: vec![w.len()],
            input: PhantomData,
            gamma: w,
            eps,
            zero_centred: true,
        })
    }

    /// This layer for inputs of the half type `B`, with its parameters
    /// kept in `A` (`f32`): mixed precision, as [`NormParam`] describes.
    /// The gradients of [`backward`](RmsNorm::backward) come back in `A`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "half")] {
    /// use half::bf16;
    /// use ndarray::array;
    /// use ndarray_layernorm::RmsNorm;
    ///
    /// let norm = RmsNorm::<f32>::new(3).for_input::<bf16>();
    /// let x = array![[1.0, 2.0, 4.0]].mapv(bf16::from_f32);
    /// let y = norm.forward(&x)?;
    /// assert_eq!(y.dim(), (1, 3));
    /// assert_eq!(norm.gamma().len(), 3); // still f32
    /// # }
    /// # Ok::<(), ndarray_layernorm::NormError>(())
    /// ```
    pub fn for_input<B>(self) -> RmsNorm<B, A>
    where
        B: NormScalar + NormParam<A>,
    {
        RmsNorm {
            gamma: self.gamma,
            eps: self.eps,
            zero_centred: self.zero_centred,
            shape: self.shape,
            input: PhantomData,
        }
    }
}

impl<A: NormScalar + NormParam<P>, P> RmsNorm<A, P> {
    /// The same layer with another `eps`.
    ///
    /// # Errors
    ///
    /// [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let norm = RmsNorm::<f64>::new(4).with_eps(1e-5)?;
    /// assert_eq!(norm.eps(), 1e-5);
    /// assert!(RmsNorm::<f64>::new(4).with_eps(f64::NAN).is_err());
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn with_eps<Eps>(mut self, eps: Eps) -> Result<Self, NormError>
    where
        A: NormEps<Eps>,
    {
        let eps = check::eps::<A, _>(eps)?;
        self.eps = eps;
        Ok(self)
    }

    /// The same layer over the last `shape.len()` axes of its inputs, of
    /// `shape`, taken together (PyTorch's `normalized_shape`): the stored
    /// weight holds the `d` parameters in row-major order of `shape`, whose
    /// lengths must multiply to `d`. The layer then normalises as
    /// [`rms_norm_over`](crate::RmsNormOverExt::rms_norm_over) does.
    ///
    /// # Errors
    ///
    /// [`NormError::TrailingShapeMismatch`] if `shape` has no axis or its
    /// lengths do not multiply to [`dim`](Self::dim).
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{Array, Array2, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let norm = RmsNorm::<f64>::new(6).with_normalized_shape(&[2, 3])?;
    /// let x = Array::from_shape_fn((5, 2, 3), |(i, j, k)| (i + j) as f64 - k as f64);
    /// let y = norm.forward(&x)?;
    /// assert_eq!(y, x.rms_norm_over(Axis(1), &Array2::ones((2, 3)), 1e-6)?);
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn with_normalized_shape(mut self, shape: &[usize]) -> Result<Self, NormError> {
        self.shape = super::normalized_shape(shape, self.dim())?;
        Ok(self)
    }

    /// The shape of the axes the layer normalises: `[d]` unless set by
    /// [`with_normalized_shape`](Self::with_normalized_shape).
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let norm = RmsNorm::<f32>::zero_centred(8).with_normalized_shape(&[2, 2, 2])?;
    /// assert_eq!(norm.normalized_shape(), &[2, 2, 2]);
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn normalized_shape(&self) -> &[usize] {
        &self.shape
    }

    /// The length `d` of the rows the layer normalises.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(ndarray_layernorm::RmsNorm::<f32>::new(64).dim(), 64);
    /// ```
    pub fn dim(&self) -> usize {
        self.gamma.len()
    }

    /// The stored weight: the gain `gamma`, or `w` of the gain `1 + w` for
    /// a zero-centred layer.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray_layernorm::RmsNorm;
    ///
    /// assert_eq!(RmsNorm::<f64>::new(3).gamma().sum(), 3.0);
    /// assert_eq!(RmsNorm::<f64>::zero_centred(3).gamma().sum(), 0.0);
    /// ```
    pub fn gamma(&self) -> &Array1<P> {
        &self.gamma
    }

    /// The stored weight, to update in place (its length stays `d`).
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::RmsNorm;
    ///
    /// let mut norm = RmsNorm::<f32>::new(2);
    /// norm.gamma_mut().fill(0.5);
    /// assert_eq!(norm.gamma(), array![0.5, 0.5]);
    /// ```
    pub fn gamma_mut(&mut self) -> ArrayViewMut1<'_, P> {
        self.gamma.view_mut()
    }

    /// The `eps` added to the mean square.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(ndarray_layernorm::RmsNorm::<f32>::new(2).eps(), 1e-6);
    /// ```
    pub fn eps(&self) -> A::Eps {
        A::kept_eps(self.eps)
    }

    /// Whether the gain is `1 + w` (zero-centred) rather than `gamma`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(ndarray_layernorm::RmsNorm::<f64>::zero_centred(2).is_zero_centred());
    /// ```
    pub fn is_zero_centred(&self) -> bool {
        self.zero_centred
    }

    /// Normalises every row of `x` (any dimension, last axis of length
    /// [`dim`](Self::dim)). With a plain gain the result has the bits of
    /// [`rms_norm`](crate::RmsNormExt::rms_norm).
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if `x` has no axis (a layer over one axis).
    /// - [`NormError::EmptyAxis`] if its last axis has length 0.
    /// - [`NormError::LengthMismatch`] if its last axis does not have the
    ///   layer's length.
    ///   For a layer over several axes
    ///   ([`with_normalized_shape`](Self::with_normalized_shape)):
    ///   [`NormError::TrailingShapeMismatch`] if the last axes of `x` do not
    ///   have its normalised shape, [`NormError::EmptyAxes`] if they hold no
    ///   element.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let norm = RmsNorm::<f64>::new(2).with_eps(0.0)?;
    /// assert_eq!(norm.forward(&array![[[3.0, -3.0]]])?, array![[[1.0, -1.0]]]);
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn forward<D: Dimension>(&self, x: &ArrayRef<A, D>) -> Result<Array<A, D>, NormError> {
        let (d, weights, eps) = self.args(x)?;
        let params = CallParams::new(self.gain(&weights).affine(), d, x.len());
        rows::map_rows(x, d, |isa, io, rows| {
            A::rms_norm_rows(isa, io, rows, params.params(), eps)
        })
    }

    /// Normalises every row as [`forward`](Self::forward) does (the same
    /// bits) and returns the statistics [`backward`](Self::backward) needs.
    /// Their index is the input's shape without its last axis; for a layer
    /// over `k > 1` axes, the other `k - 1` normalised axes are kept with
    /// length 1 (an input `(N, C, H, W)` and a layer over `(C, H, W)` give
    /// statistics of shape `(N, 1, 1)`), so that their type follows the
    /// input's. The `_over` forms give them the leading shape `(N,)`.
    ///
    /// # Errors
    ///
    /// As [`forward`](Self::forward).
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let norm = RmsNorm::<f32>::zero_centred(2);
    /// let x = array![[3.0, 4.0]];
    /// let (y, stats) = norm.forward_train(&x)?;
    /// assert_eq!(y, norm.forward(&x)?);
    /// assert_eq!(stats.rrms().shape(), &[1]);
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    pub fn forward_train<D: RemoveAxis>(
        &self,
        x: &ArrayRef<A, D>,
    ) -> Result<(Array<A, D>, RmsNormStats<D::Smaller>), NormError> {
        let (d, weights, eps) = self.args(x)?;
        let index = super::stats_index(x, self.shape.len());
        backward::rms_norm_train(x, d, index, self.gain(&weights), eps)
    }

    /// The gradients for input `x`, output gradient `dy` and the statistics
    /// that [`forward_train`](Self::forward_train) returned for `x`.
    /// `dgamma` is the gradient with respect to the stored weight (`w` for
    /// a zero-centred layer, whose gain `1 + w` has the same gradient).
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if `x` has no axis (a layer over one axis).
    /// - [`NormError::EmptyAxis`] if its last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Gradient`] if `dy`
    ///   does not have the shape of `x`.
    /// - [`NormError::LengthMismatch`] if the last axis does not have the
    ///   layer's length.
    ///   For a layer over several axes
    ///   ([`with_normalized_shape`](Self::with_normalized_shape)):
    ///   [`NormError::TrailingShapeMismatch`] if the last axes of `x` do not
    ///   have its normalised shape, [`NormError::EmptyAxes`] if they hold no
    ///   element.
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
    /// let norm = RmsNorm::<f64>::new(3);
    /// let x = array![[1.0, -2.0, 2.0]];
    /// let (_y, stats) = norm.forward_train(&x)?;
    /// let dy = array![[0.5, 0.0, -0.5]];
    /// let grads = norm.backward(&x, &dy, &stats)?;
    /// assert_eq!(grads, x.rms_norm_backward(&dy, norm.gamma(), 1e-6)?);
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn backward<D: RemoveAxis>(
        &self,
        x: &ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        stats: &RmsNormStats<D::Smaller>,
    ) -> Result<RmsNormGrads<A, D, Ix1, P>, NormError> {
        let d = super::backward_rows(x, dy, &self.shape)?;
        let weights = check::params::<A, _>(Operand::Gamma, &self.gamma, d)?;
        backward::check_rms_norm_stats(x, stats)?;
        super::check_stats_rows(x, &self.shape, stats.rows().shape())?;
        backward::rms_norm_grads(
            x,
            dy,
            d,
            self.gain(&weights),
            Some(&backward::in_row_order(stats.rows())),
            0.0,
        )
    }

    /// Validates `x` against the layer, in the order the errors are
    /// documented: `(d, weights, eps)`.
    fn args<D: Dimension>(
        &self,
        x: &ArrayRef<A, D>,
    ) -> Result<(usize, WideParams<'_, A>, f64), NormError> {
        let d = super::rows_of(x, &self.shape)?;
        let weights = check::params::<A, _>(Operand::Gamma, &self.gamma, d)?;
        Ok((d, weights, self.eps))
    }

    fn gain<'a>(&self, weights: &'a [Wide<A>]) -> Gain<'a, Wide<A>> {
        if self.zero_centred {
            Gain::OnePlus(weights)
        } else {
            Gain::Gamma(weights)
        }
    }
}
