//! Residual add fused with the normalisation of its sum.

use std::borrow::Cow;

use ndarray::{Array, ArrayRef, ArrayRef1, Dimension};

use crate::blocks::{RowBlocks, RowBlocksMut};
use crate::error::{NormError, Operand};
use crate::fresh::Fresh;
use crate::kernel::backward::BLOCK_ROWS;
use crate::kernel::{Affine, CallParams, Io, Isa};
use crate::scalar::{NormEps, NormParam, NormScalar, Wide, WideParams};
use crate::{check, fresh, sealed};

/// The residual add of a pre-norm transformer block fused with the
/// normalisation that follows it: `h = x + residual`, `y = norm(h)`.
///
/// In the block `h = x + sublayer(norm(x))`, the sum `h` is both the new
/// residual stream and the input of the next norm. These methods read `x`
/// and the residual once, form each row of `h` in the element type (the
/// same rounding as `&x + &residual`) and normalise it while it is in
/// cache, with the kernels of [`LayerNormExt`](crate::LayerNormExt) and
/// [`RmsNormExt`](crate::RmsNormExt). Both results have exactly the bits of
/// the separate add followed by the separate normalisation.
///
/// The `_inplace` forms write `h` over the residual buffer, which is what a
/// residual stream needs.
///
/// Implemented for [`ArrayRef`]; the trait is sealed.
pub trait AddNormExt<A: NormScalar, D: Dimension>: sealed::Sealed {
    /// Returns `(y, h)` with `h = self + residual` and
    /// `y = h.layer_norm(gamma, beta, eps)`.
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Residual`] if
    ///   `residual` does not have the shape of `self`.
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
    /// let x = array![[0.5_f32, 1.0, -0.25]];
    /// let residual = array![[1.5, 1.0, 2.25]];
    /// let (gamma, beta) = (array![1.0, 1.0, 1.0], array![0.0, 0.0, 0.0]);
    /// let (y, h) = x.add_layer_norm(&residual, &gamma, &beta, 1e-5)?;
    /// assert_eq!(h, array![[2.0, 2.0, 2.0]]);
    /// assert_eq!(y, h.layer_norm(&gamma, &beta, 1e-5)?); // a constant row gives beta
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    fn add_layer_norm<P, Eps>(
        &self,
        residual: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        beta: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(Array<A, D>, Array<A, D>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Writes `h = self + residual` over `residual` and returns
    /// `y = h.layer_norm(gamma, beta, eps)`.
    ///
    /// # Errors
    ///
    /// As [`add_layer_norm`](Self::add_layer_norm). On error `residual` is
    /// left untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let mut stream = array![[1.0_f64, 2.0, 3.0, 4.0]];
    /// let sublayer_out = array![[1.0, 2.0, 3.0, 4.0]];
    /// let y = sublayer_out.add_layer_norm_inplace(&mut stream, &array![1.0, 1.0, 1.0, 1.0], &array![0.0, 0.0, 0.0, 0.0], 0.0)?;
    /// assert_eq!(stream, array![[2.0, 4.0, 6.0, 8.0]]);
    /// assert!(y.abs_diff_eq(&array![[-1.3416, -0.4472, 0.4472, 1.3416]], 1e-4));
    /// # Ok::<(), NormError>(())
    /// ```
    fn add_layer_norm_inplace<P, Eps>(
        &self,
        residual: &mut ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        beta: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<Array<A, D>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Returns `(y, h)` with `h = self + residual` and
    /// `y = h.rms_norm(gamma, eps)`.
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::ShapeMismatch`] with [`Operand::Residual`] if
    ///   `residual` does not have the shape of `self`.
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
    /// let x = array![[1.0_f32, -1.0, 2.0, -2.0]];
    /// let residual = array![[1.0, -1.0, 2.0, -2.0]];
    /// let (y, h) = x.add_rms_norm(&residual, &array![1.0, 1.0, 1.0, 1.0], 1e-6)?;
    /// assert_eq!(h, array![[2.0, -2.0, 4.0, -4.0]]);
    /// assert_eq!(y, h.rms_norm(&array![1.0, 1.0, 1.0, 1.0], 1e-6)?);
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    fn add_rms_norm<P, Eps>(
        &self,
        residual: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(Array<A, D>, Array<A, D>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;

    /// Writes `h = self + residual` over `residual` and returns
    /// `y = h.rms_norm(gamma, eps)`.
    ///
    /// # Errors
    ///
    /// As [`add_rms_norm`](Self::add_rms_norm). On error `residual` is left
    /// untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let mut stream = array![[3.0_f64, 0.0]];
    /// let y = array![[0.0, 4.0]].add_rms_norm_inplace(&mut stream, &array![1.0, 1.0], 0.0)?;
    /// assert_eq!(stream, array![[3.0, 4.0]]);
    /// assert!(y.abs_diff_eq(&array![[3.0 / 12.5_f64.sqrt(), 4.0 / 12.5_f64.sqrt()]], 1e-15));
    /// # Ok::<(), NormError>(())
    /// ```
    fn add_rms_norm_inplace<P, Eps>(
        &self,
        residual: &mut ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<Array<A, D>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>;
}

impl<A: NormScalar, D: Dimension> AddNormExt<A, D> for ArrayRef<A, D> {
    fn add_layer_norm<P, Eps>(
        &self,
        residual: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        beta: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(Array<A, D>, Array<A, D>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma, beta, eps) = layer_norm_args(self, residual, gamma, beta, eps)?;
        let params = CallParams::new(Affine::ScaleShift(&gamma, &beta), d, self.len());
        add_norm(self, residual, d, |isa, io| {
            A::layer_norm_rows(isa, io, 1, params.params(), eps)
        })
    }

    fn add_layer_norm_inplace<P, Eps>(
        &self,
        residual: &mut ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        beta: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<Array<A, D>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma, beta, eps) = layer_norm_args(self, residual, gamma, beta, eps)?;
        let params = CallParams::new(Affine::ScaleShift(&gamma, &beta), d, self.len());
        add_norm_inplace(self, residual, d, |isa, io| {
            A::layer_norm_rows(isa, io, 1, params.params(), eps)
        })
    }

    fn add_rms_norm<P, Eps>(
        &self,
        residual: &ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<(Array<A, D>, Array<A, D>), NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma, eps) = rms_norm_args(self, residual, gamma, eps)?;
        let params = CallParams::new(Affine::Scale(&gamma), d, self.len());
        add_norm(self, residual, d, |isa, io| {
            A::rms_norm_rows(isa, io, 1, params.params(), eps)
        })
    }

    fn add_rms_norm_inplace<P, Eps>(
        &self,
        residual: &mut ArrayRef<A, D>,
        gamma: &ArrayRef1<P>,
        eps: Eps,
    ) -> Result<Array<A, D>, NormError>
    where
        A: NormParam<P>,
        A: NormEps<Eps>,
    {
        let (d, gamma, eps) = rms_norm_args(self, residual, gamma, eps)?;
        let params = CallParams::new(Affine::Scale(&gamma), d, self.len());
        add_norm_inplace(self, residual, d, |isa, io| {
            A::rms_norm_rows(isa, io, 1, params.params(), eps)
        })
    }
}

type LayerNormArgs<'a, A> = (usize, Cow<'a, [Wide<A>]>, Cow<'a, [Wide<A>]>, f64);

/// Validates in the order the errors are documented.
fn layer_norm_args<'a, A: NormScalar + NormParam<P> + NormEps<Eps>, D: Dimension, P, Eps>(
    x: &ArrayRef<A, D>,
    residual: &ArrayRef<A, D>,
    gamma: &'a ArrayRef1<P>,
    beta: &'a ArrayRef1<P>,
    eps: Eps,
) -> Result<LayerNormArgs<'a, A>, NormError> {
    let d = check::row_length(x)?;
    check::shape_of(Operand::Residual, x, residual.shape())?;
    let gamma = check::params::<A, _>(Operand::Gamma, gamma, d)?;
    let beta = check::params::<A, _>(Operand::Beta, beta, d)?;
    Ok((d, gamma, beta, check::eps::<A, _>(eps)?))
}

/// Validates in the order the errors are documented.
fn rms_norm_args<'a, A: NormScalar + NormParam<P> + NormEps<Eps>, D: Dimension, P, Eps>(
    x: &ArrayRef<A, D>,
    residual: &ArrayRef<A, D>,
    gamma: &'a ArrayRef1<P>,
    eps: Eps,
) -> Result<(usize, WideParams<'a, A>, f64), NormError> {
    let d = check::row_length(x)?;
    check::shape_of(Operand::Residual, x, residual.shape())?;
    let gamma = check::params::<A, _>(Operand::Gamma, gamma, d)?;
    Ok((d, gamma, check::eps::<A, _>(eps)?))
}

/// `h = x + r` element by element, rounded in the element type.
#[inline(always)]
fn add_row<A: NormScalar>(x: &[A], r: &[A], h: &mut [A]) {
    for ((h, &x), &r) in h.iter_mut().zip(x).zip(r) {
        *h = x + r;
    }
}

/// `(y, h)`: the normalisation of `h = x + residual`, and `h`.
type NormAndSum<A, D> = (Array<A, D>, Array<A, D>);

/// Returns `(norm(x + residual), x + residual)`, one row at a time.
fn add_norm<A: NormScalar, D: Dimension>(
    x: &ArrayRef<A, D>,
    residual: &ArrayRef<A, D>,
    d: usize,
    norm: impl Fn(Isa, Io<'_, A>),
) -> Result<NormAndSum<A, D>, NormError> {
    let isa = Isa::detect();
    // Both arrays are had before either is written.
    let (y, h) = (Fresh::new(x.raw_dim())?, Fresh::new(x.raw_dim())?);
    Ok(y.fill_and(|y| {
        h.fill(|h| {
            let mut xs = RowBlocks::new(x, d);
            let mut rs = RowBlocks::new(residual, d);
            let mut ys = RowBlocksMut::new(y, d);
            let mut hs = RowBlocksMut::new(h, d);
            loop {
                let x_block = xs.next_block(BLOCK_ROWS);
                if x_block.is_empty() {
                    break;
                }
                let r_block = rs.next_block(BLOCK_ROWS);
                let h_block = hs.next_block(BLOCK_ROWS);
                let y_block = ys.next_block(BLOCK_ROWS);
                let inputs = x_block.chunks_exact(d).zip(r_block.chunks_exact(d));
                let outputs = h_block.chunks_exact_mut(d).zip(y_block.chunks_exact_mut(d));
                for ((x, r), (h, y)) in inputs.zip(outputs) {
                    add_row(x, r, h);
                    norm(
                        isa,
                        Io::Copy {
                            input: h,
                            output: y,
                        },
                    );
                }
            }
        })
    }))
}

/// Writes `x + residual` over `residual` and returns its normalisation, one
/// row at a time.
fn add_norm_inplace<A: NormScalar, D: Dimension>(
    x: &ArrayRef<A, D>,
    residual: &mut ArrayRef<A, D>,
    d: usize,
    norm: impl Fn(Isa, Io<'_, A>),
) -> Result<Array<A, D>, NormError> {
    let isa = Isa::detect();
    fresh::array(x.raw_dim(), |y| {
        let mut xs = RowBlocks::new(x, d);
        let mut rs = RowBlocksMut::new(residual, d);
        let mut ys = RowBlocksMut::new(y, d);
        loop {
            let x_block = xs.next_block(BLOCK_ROWS);
            if x_block.is_empty() {
                break;
            }
            let r_block = rs.next_block(BLOCK_ROWS);
            let y_block = ys.next_block(BLOCK_ROWS);
            let rows = x_block.chunks_exact(d).zip(r_block.chunks_exact_mut(d));
            for ((x, r), y) in rows.zip(y_block.chunks_exact_mut(d)) {
                for (r, &x) in r.iter_mut().zip(x) {
                    *r = x + *r;
                }
                norm(
                    isa,
                    Io::Copy {
                        input: r,
                        output: y,
                    },
                );
            }
        }
    })
}
