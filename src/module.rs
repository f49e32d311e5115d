//! Parameter-holding LayerNorm and RMSNorm layers, as a model owns them.

use std::borrow::Cow;

use ndarray::{Array, Array1, ArrayRef, ArrayViewMut1, Dimension, RemoveAxis};

use crate::backward::{self, LayerNormGrads, LayerNormStats, RmsNormGrads, RmsNormStats};
use crate::error::{NormError, Operand};
use crate::kernel::backward::Gain;
use crate::kernel::{self, Affine, CallParams};
use crate::scalar::NormScalar;
use crate::{check, rows};

/// A LayerNorm layer over the last axis: owns `gamma`, an optional `beta`
/// and `eps`.
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
pub struct LayerNorm<A> {
    gamma: Array1<A>,
    beta: Option<Array1<A>>,
    eps: A,
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
            eps: A::narrow(1e-5),
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
            eps: A::narrow(1e-5),
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
    pub fn from_parts(
        gamma: Array1<A>,
        beta: Option<Array1<A>>,
        eps: A,
    ) -> Result<Self, NormError> {
        if let Some(beta) = &beta {
            if beta.len() != gamma.len() {
                return Err(NormError::LengthMismatch {
                    operand: Operand::Beta,
                    expected: gamma.len(),
                    found: beta.len(),
                });
            }
        }
        check::eps(eps)?;
        Ok(LayerNorm { gamma, beta, eps })
    }

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
    pub fn with_eps(mut self, eps: A) -> Result<Self, NormError> {
        check::eps(eps)?;
        self.eps = eps;
        Ok(self)
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
    pub fn gamma(&self) -> &Array1<A> {
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
    pub fn gamma_mut(&mut self) -> ArrayViewMut1<'_, A> {
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
    pub fn beta(&self) -> Option<&Array1<A>> {
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
    pub fn beta_mut(&mut self) -> Option<ArrayViewMut1<'_, A>> {
        self.beta.as_mut().map(|beta| beta.view_mut())
    }

    /// The `eps` added to the variance.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(ndarray_layernorm::LayerNorm::<f64>::new(2).eps(), 1e-5);
    /// ```
    pub fn eps(&self) -> A {
        self.eps
    }

    /// Normalises every row of `x` (any dimension, last axis of length
    /// [`dim`](Self::dim)), with the bits of
    /// [`layer_norm`](crate::LayerNormExt::layer_norm) (without bias: of
    /// `layer_norm` with `beta = 0`, except that a zero output may keep the
    /// sign of `n · gamma`, `-0.0`).
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if `x` has no axis.
    /// - [`NormError::EmptyAxis`] if its last axis has length 0.
    /// - [`NormError::LengthMismatch`] if its last axis does not have the
    ///   layer's length.
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
            kernel::layer_norm_rows(isa, io, rows, params.params(), args.eps)
        })
    }

    /// Normalises every row as [`forward`](Self::forward) does (the same
    /// bits) and returns the statistics [`backward`](Self::backward) needs.
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
        backward::layer_norm_train(x, args.d, backward::leading_of(x), args.affine(), args.eps)
    }

    /// The gradients for input `x`, output gradient `dy` and the statistics
    /// that [`forward_train`](Self::forward_train) returned for `x`, as
    /// [`layer_norm_backward`](crate::LayerNormBackwardExt::layer_norm_backward)
    /// computes them. For a layer without bias, `dbeta` is the gradient a
    /// bias would get; ignore it.
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if `x` has no axis.
    /// - [`NormError::EmptyAxis`] if its last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Gradient`] if `dy`
    ///   does not have the shape of `x`.
    /// - [`NormError::LengthMismatch`] if the last axis does not have the
    ///   layer's length.
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
    ) -> Result<LayerNormGrads<A, D>, NormError> {
        let (d, gamma) = backward::backward_args(x, dy, &self.gamma)?;
        backward::check_layer_norm_stats(x, stats)?;
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
        let d = check::row_length(x)?;
        let gamma = check::feature_vector(Operand::Gamma, &self.gamma, d)?;
        let beta = match &self.beta {
            Some(beta) => Some(check::feature_vector(Operand::Beta, beta, d)?),
            None => None,
        };
        let eps = check::eps(self.eps)?;
        Ok(LayerNormArgs {
            d,
            gamma,
            beta,
            eps,
        })
    }
}

/// A [`LayerNorm`]'s parameters, validated for one input.
struct LayerNormArgs<'a, A: Clone> {
    d: usize,
    gamma: Cow<'a, [A]>,
    beta: Option<Cow<'a, [A]>>,
    eps: f64,
}

impl<A: NormScalar> LayerNormArgs<'_, A> {
    fn affine(&self) -> Affine<'_, A> {
        match &self.beta {
            Some(beta) => Affine::ScaleShift(&self.gamma, beta),
            None => Affine::Scale(&self.gamma),
        }
    }
}

/// An RMSNorm layer over the last axis: owns `gamma` and `eps`.
///
/// `y = x / √(mean(x²) + eps) · gamma` for every row. In the zero-centred
/// parametrisation of Gemma-style models ([`zero_centred`](Self::zero_centred))
/// the stored weight `w` starts at 0 and the gain is `1 + w`, formed in
/// `f64`: `y = x / √(mean(x²) + eps) · (1 + w)`. The layer is plain data,
/// like [`LayerNorm`].
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
pub struct RmsNorm<A> {
    gamma: Array1<A>,
    eps: A,
    zero_centred: bool,
}

impl<A: NormScalar> RmsNorm<A> {
    /// A layer for rows of length `d` as a fresh model starts it:
    /// `gamma = 1`, `eps = 1e-6`. With `d = 0` every input is refused, as
    /// for [`LayerNorm::new`].
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
            eps: A::narrow(1e-6),
            zero_centred: false,
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
            eps: A::narrow(1e-6),
            zero_centred: true,
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
    pub fn from_parts(gamma: Array1<A>, eps: A) -> Result<Self, NormError> {
        check::eps(eps)?;
        Ok(RmsNorm {
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
    pub fn from_parts_zero_centred(w: Array1<A>, eps: A) -> Result<Self, NormError> {
        check::eps(eps)?;
        Ok(RmsNorm {
            gamma: w,
            eps,
            zero_centred: true,
        })
    }

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
    pub fn with_eps(mut self, eps: A) -> Result<Self, NormError> {
        check::eps(eps)?;
        self.eps = eps;
        Ok(self)
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
    pub fn gamma(&self) -> &Array1<A> {
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
    pub fn gamma_mut(&mut self) -> ArrayViewMut1<'_, A> {
        self.gamma.view_mut()
    }

    /// The `eps` added to the mean square.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(ndarray_layernorm::RmsNorm::<f32>::new(2).eps(), 1e-6);
    /// ```
    pub fn eps(&self) -> A {
        self.eps
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
    /// - [`NormError::ZeroDimensional`] if `x` has no axis.
    /// - [`NormError::EmptyAxis`] if its last axis has length 0.
    /// - [`NormError::LengthMismatch`] if its last axis does not have the
    ///   layer's length.
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
            kernel::rms_norm_rows(isa, io, rows, params.params(), eps)
        })
    }

    /// Normalises every row as [`forward`](Self::forward) does (the same
    /// bits) and returns the statistics [`backward`](Self::backward) needs.
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
        backward::rms_norm_train(x, d, backward::leading_of(x), self.gain(&weights), eps)
    }

    /// The gradients for input `x`, output gradient `dy` and the statistics
    /// that [`forward_train`](Self::forward_train) returned for `x`.
    /// `dgamma` is the gradient with respect to the stored weight (`w` for
    /// a zero-centred layer, whose gain `1 + w` has the same gradient).
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if `x` has no axis.
    /// - [`NormError::EmptyAxis`] if its last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Gradient`] if `dy`
    ///   does not have the shape of `x`.
    /// - [`NormError::LengthMismatch`] if the last axis does not have the
    ///   layer's length.
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
    ) -> Result<RmsNormGrads<A, D>, NormError> {
        let (d, weights) = backward::backward_args(x, dy, &self.gamma)?;
        backward::check_rms_norm_stats(x, stats)?;
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
    ) -> Result<(usize, Cow<'_, [A]>, f64), NormError> {
        let d = check::row_length(x)?;
        let weights = check::feature_vector(Operand::Gamma, &self.gamma, d)?;
        Ok((d, weights, check::eps(self.eps)?))
    }

    fn gain<'a>(&self, weights: &'a [A]) -> Gain<'a, A> {
        if self.zero_centred {
            Gain::OnePlus(weights)
        } else {
            Gain::Gamma(weights)
        }
    }
}
