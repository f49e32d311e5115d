//! The LayerNorm layer.

use std::borrow::Cow;
use std::marker::PhantomData;

use ndarray::{Array, Array1, ArrayRef, ArrayViewMut1, Dimension, Ix1, RemoveAxis};

use crate::backward::{self, LayerNormGrads, LayerNormStats};
use crate::error::{NormError, Operand};
use crate::kernel::backward::Gain;
use crate::kernel::{Affine, CallParams};
use crate::scalar::{NormEps, NormParam, NormScalar, Wide};
use crate::{check, rows};

/// A LayerNorm layer over the last axis, or over the last axes of a
/// normalised shape ([`with_normalized_shape`](Self::with_normalized_shape)):
/// owns `gamma`, an optional `beta` and `eps`.
///
/// `y = (x - mean) / √(var + eps) · gamma + beta` for every row, or without
/// `+ beta` for a layer without bias (PyTorch's `bias=False`). The layer is
/// plain data: the parameters are read and updated through accessors, and
/// [`forward_train`](Self::forward_train) hands back the statistics that
/// [`backward`](Self::backward) needs, so the caller decides where they live.
///
/// # Examples
///
/// ```
/// use ndarray::array;
/// use ndarray_layernorm::prelude::*;
///
/// let mut norm = LayerNorm::<f64>::new(4);
/// let x = array![[2.0, 4.0, 6.0, 8.0]];
/// let (y, stats) = norm.forward_train(&x)?;
/// let target = array![[-1.0, -1.0, 1.0, 1.0]];
/// let grads = norm.backward(&x, &(&y - &target), &stats)?;
/// norm.gamma_mut().scaled_add(-0.1, &grads.dgamma);
/// if let Some(mut beta) = norm.beta_mut() {
///     beta.scaled_add(-0.1, &grads.dbeta);
/// }
/// # Ok::<(), NormError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNorm<A, P = A> {
    gamma: Array1<P>,
    beta: Option<Array1<P>>,
    /// Exactly the value given (an `f32` `eps` widened).
    eps: f64,
    shape: Vec<usize>,
    input: PhantomData<fn() -> A>,
}

impl<A: NormScalar> LayerNorm<A> {
    /// A layer for rows of length `d` as a fresh model starts it:
    /// `gamma = 1`, `beta = 0`, `eps = 1e-5`. With `d = 0` every input is
    /// refused: rows of no elements with [`NormError::EmptyAxis`], others
    /// with [`NormError::LengthMismatch`].
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::LayerNorm;
    ///
    /// let norm = LayerNorm::<f32>::new(3);
    /// assert_eq!(norm.gamma(), array![1.0, 1.0, 1.0]);
    /// assert_eq!(norm.beta(), Some(&array![0.0, 0.0, 0.0]));
    /// assert_eq!(norm.eps(), 1e-5);
    /// ```
    pub fn new(d: usize) -> Self {
        LayerNorm {
            gamma: Array1::ones(d),
            beta: Some(Array1::zeros(d)),
            eps: A::kept_eps_value(A::kept_eps(1e-5)),
            shape: vec![d],
            input: PhantomData,
        }
    }

    /// A layer without bias for rows of length `d`: `gamma = 1`,
    /// `eps = 1e-5`.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray_layernorm::LayerNorm;
    ///
    /// let norm = LayerNorm::<f64>::without_bias(8);
    /// assert_eq!(norm.beta(), None);
    /// assert_eq!(norm.dim(), 8);
    /// ```
    pub fn without_bias(d: usize) -> Self {
        LayerNorm {
            gamma: Array1::ones(d),
            beta: None,
            eps: A::kept_eps_value(A::kept_eps(1e-5)),
            shape: vec![d],
            input: PhantomData,
        }
    }

    /// A layer with the given parameters (`beta = None`: no bias).
    ///
    /// # Errors
    ///
    /// - [`NormError::LengthMismatch`] with [`Operand::Beta`] if `beta` does
    ///   not have the length of `gamma`.
    /// - [`NormError::InvalidEps`] if `eps` is negative, NaN or infinite.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let norm = LayerNorm::from_parts(array![2.0_f64, 1.0], Some(array![0.5, -0.5]), 1e-5)?;
    /// assert!(norm.forward(&array![[0.0, 4.0]])?.abs_diff_eq(&array![[-1.5, 0.5]], 1e-5));
    /// assert!(LayerNorm::from_parts(array![1.0_f64], None, -1.0).is_err());
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn from_parts<Eps>(
        gamma: Array1<A>,
        beta: Option<Array1<A>>,
        eps: Eps,
    ) -> Result<Self, NormError>
    where
        A: NormEps<Eps>,
    {
        if let Some(beta) = &beta {
            if beta.len() != gamma.len() {
                return Err(NormError::LengthMismatch {
                    operand: Operand::Beta,
                    expected: gamma.len(),
                    found: beta.len(),
                });
            }
        }
        let eps = check::eps::<A, _>(eps)?;
        let shape = vec![gamma.len()];
        Ok(LayerNorm {
            gamma,
            beta,
            eps,
            shape,
            input: PhantomData,
        })
    }

    /// This layer for inputs of the half type `B`, with its parameters
    /// kept in `A` (`f32`): mixed precision, as [`NormParam`] describes.
    /// The gradients of [`backward`](LayerNorm::backward) come back in `A`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "half")] {
    /// use half::bf16;
    /// use ndarray::array;
    /// use ndarray_layernorm::LayerNorm;
    ///
    /// let norm = LayerNorm::<f32>::new(3).for_input::<bf16>();
    /// let x = array![[1.0, 2.0, 4.0]].mapv(bf16::from_f32);
    /// let y = norm.forward(&x)?;
    /// assert_eq!(y.dim(), (1, 3));
    /// assert_eq!(norm.gamma().len(), 3); // still f32
    /// # }
    /// # Ok::<(), ndarray_layernorm::NormError>(())
    /// ```
    pub fn for_input<B>(self) -> LayerNorm<B, A>
    where
        B: NormScalar + NormParam<A>,
    {
        LayerNorm {
            gamma: self.gamma,
            beta: self.beta,
            eps: self.eps,
            shape: self.shape,
            input: PhantomData,
        }
    }
}

impl<A: NormScalar + NormParam<P>, P> LayerNorm<A, P> {
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
    /// let norm = LayerNorm::<f32>::new(4).with_eps(1e-6)?;
    /// assert_eq!(norm.eps(), 1e-6);
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
    /// `shape`, taken together (PyTorch's `normalized_shape`): `gamma` and
    /// `beta` hold the `d` parameters in row-major order of `shape`, whose
    /// lengths must multiply to `d`. The layer then normalises as
    /// [`layer_norm_over`](crate::LayerNormOverExt::layer_norm_over) does.
    ///
    /// # Errors
    ///
    /// [`NormError::TrailingShapeMismatch`] if `shape` has no axis or its
    /// lengths do not multiply to [`dim`](Self::dim).
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{Array, Array3, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// // GroupNorm with one group over (C, H, W) = (2, 3, 3).
    /// let norm = LayerNorm::<f32>::new(18).with_normalized_shape(&[2, 3, 3])?;
    /// let x = Array::from_shape_fn((4, 2, 3, 3), |(n, c, h, w)| (n + c * h + w) as f32);
    /// let y = norm.forward(&x)?;
    /// let (gamma, beta) = (Array3::ones((2, 3, 3)), Array3::zeros((2, 3, 3)));
    /// assert_eq!(y, x.layer_norm_over(Axis(1), &gamma, &beta, 1e-5)?);
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
    /// assert_eq!(LayerNorm::<f64>::new(6).normalized_shape(), &[6]);
    /// let norm = LayerNorm::<f64>::new(6).with_normalized_shape(&[2, 3])?;
    /// assert_eq!(norm.normalized_shape(), &[2, 3]);
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
    /// assert_eq!(ndarray_layernorm::LayerNorm::<f64>::new(768).dim(), 768);
    /// ```
    pub fn dim(&self) -> usize {
        self.gamma.len()
    }

    /// The gain `gamma`.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray_layernorm::LayerNorm;
    ///
    /// assert_eq!(LayerNorm::<f64>::new(2).gamma().sum(), 2.0);
    /// ```
    pub fn gamma(&self) -> &Array1<P> {
        &self.gamma
    }

    /// The gain `gamma`, to update in place (its length stays `d`).
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::LayerNorm;
    ///
    /// let mut norm = LayerNorm::<f64>::new(2);
    /// norm.gamma_mut()[1] = 3.0;
    /// assert_eq!(norm.gamma(), array![1.0, 3.0]);
    /// ```
    pub fn gamma_mut(&mut self) -> ArrayViewMut1<'_, P> {
        self.gamma.view_mut()
    }

    /// The shift `beta`, or `None` for a layer without bias.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray_layernorm::LayerNorm;
    ///
    /// assert!(LayerNorm::<f32>::new(2).beta().is_some());
    /// assert!(LayerNorm::<f32>::without_bias(2).beta().is_none());
    /// ```
    pub fn beta(&self) -> Option<&Array1<P>> {
        self.beta.as_ref()
    }

    /// The shift `beta`, to update in place, or `None` for a layer without
    /// bias.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::LayerNorm;
    ///
    /// let mut norm = LayerNorm::<f64>::new(2);
    /// if let Some(mut beta) = norm.beta_mut() {
    ///     beta.fill(0.5);
    /// }
    /// assert_eq!(norm.beta(), Some(&array![0.5, 0.5]));
    /// ```
    pub fn beta_mut(&mut self) -> Option<ArrayViewMut1<'_, P>> {
        self.beta.as_mut().map(|beta| beta.view_mut())
    }

    /// The `eps` added to the variance.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(ndarray_layernorm::LayerNorm::<f64>::new(2).eps(), 1e-5);
    /// ```
    pub fn eps(&self) -> A::Eps {
        A::kept_eps(self.eps)
    }

    /// Normalises every row of `x` (any dimension, last axis of length
    /// [`dim`](Self::dim)), with the bits of
    /// [`layer_norm`](crate::LayerNormExt::layer_norm) (without bias: of
    /// `layer_norm` with `beta = 0`, except that a zero output may keep the
    /// sign of `n · gamma`, `-0.0`).
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
    /// use ndarray::{array, Array3};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let norm = LayerNorm::<f64>::new(2);
    /// // mean 3.5, var 0.25: y = ±0.5 / √(0.25 + 1e-5) = ±1 / √1.00004
    /// let y = norm.forward(&array![3.0, 4.0])?;
    /// let expected = 1.0 / 1.00004_f64.sqrt();
    /// assert!(y.abs_diff_eq(&array![-expected, expected], 1e-15));
    /// assert_eq!(norm.forward(&Array3::<f64>::zeros((2, 5, 2)))?.shape(), &[2, 5, 2]);
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn forward<D: Dimension>(&self, x: &ArrayRef<A, D>) -> Result<Array<A, D>, NormError> {
        let args = self.args(x)?;
        let params = CallParams::new(args.affine(), args.d, x.len());
        rows::map_rows(x, args.d, |isa, io, rows| {
            A::layer_norm_rows(isa, io, rows, params.params(), args.eps)
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
    /// let norm = LayerNorm::<f32>::new(3);
    /// let x = array![[1.0, 2.0, 6.0]];
    /// let (y, stats) = norm.forward_train(&x)?;
    /// assert_eq!(y, norm.forward(&x)?);
    /// assert_eq!(stats.mean(), array![3.0]);
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    pub fn forward_train<D: RemoveAxis>(
        &self,
        x: &ArrayRef<A, D>,
    ) -> Result<(Array<A, D>, LayerNormStats<D::Smaller>), NormError> {
        let args = self.args(x)?;
        let index = super::stats_index(x, self.shape.len());
        backward::layer_norm_train(x, args.d, index, args.affine(), args.eps)
    }

    /// The gradients for input `x`, output gradient `dy` and the statistics
    /// that [`forward_train`](Self::forward_train) returned for `x`, as
    /// [`layer_norm_backward`](crate::LayerNormBackwardExt::layer_norm_backward)
    /// computes them. For a layer without bias, `dbeta` is the gradient a
    /// bias would get; ignore it.
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
    /// let norm = LayerNorm::<f64>::new(4);
    /// let x = array![[1.0, -2.0, 0.5, 3.0], [0.0, 1.0, 1.0, 2.0]];
    /// let (_y, stats) = norm.forward_train(&x)?;
    /// let dy = array![[0.1, 0.2, 0.3, 0.4], [1.0, 0.0, 0.0, -1.0]];
    /// let grads = norm.backward(&x, &dy, &stats)?;
    /// assert_eq!(grads, x.layer_norm_backward(&dy, norm.gamma(), 1e-5)?);
    /// # Ok::<(), NormError>(())
    /// ```
    pub fn backward<D: RemoveAxis>(
        &self,
        x: &ArrayRef<A, D>,
        dy: &ArrayRef<A, D>,
        stats: &LayerNormStats<D::Smaller>,
    ) -> Result<LayerNormGrads<A, D, Ix1, P>, NormError> {
        let d = super::backward_rows(x, dy, &self.shape)?;
        let gamma = check::params::<A, _>(Operand::Gamma, &self.gamma, d)?;
        backward::check_layer_norm_stats(x, stats)?;
        super::check_stats_rows(x, &self.shape, stats.rows().shape())?;
        backward::layer_norm_grads(
            x,
            dy,
            d,
            Gain::Gamma(&gamma),
            Some(&backward::in_row_order(stats.rows())),
            0.0,
        )
    }

    /// Validates `x` against the layer, in the order the errors are
    /// documented.
    fn args<D: Dimension>(&self, x: &ArrayRef<A, D>) -> Result<LayerNormArgs<'_, A>, NormError> {
        let d = super::rows_of(x, &self.shape)?;
        let gamma = check::params::<A, _>(Operand::Gamma, &self.gamma, d)?;
        let beta = match &self.beta {
            Some(beta) => Some(check::params::<A, _>(Operand::Beta, beta, d)?),
            None => None,
        };
        let eps = self.eps;
        Ok(LayerNormArgs {
            d,
            gamma,
            beta,
            eps,
        })
    }
}

/// A [`LayerNorm`]'s parameters, validated for one input.
struct LayerNormArgs<'a, A: NormScalar> {
    d: usize,
    gamma: Cow<'a, [Wide<A>]>,
    beta: Option<Cow<'a, [Wide<A>]>>,
    eps: f64,
}

impl<A: NormScalar> LayerNormArgs<'_, A> {
    fn affine(&self) -> Affine<'_, Wide<A>> {
        match &self.beta {
            Some(beta) => Affine::ScaleShift(&self.gamma, beta),
            None => Affine::Scale(&self.gamma),
        }
    }
}
