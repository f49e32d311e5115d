//! Per-row statistics along the last axis.

use ndarray::{Array, ArrayD, ArrayRef, Axis, Dimension, RemoveAxis};

use crate::error::NormError;
use crate::kernel::Isa;
use crate::scalar::NormScalar;
use crate::{check, over, rows, sealed};

/// Mean and root mean square of every vector along the last axis, or
/// ([`stats_over`](RowStatsExt::stats_over)) of every subarray over the last
/// few axes.
///
/// Implemented for [`ArrayRef`], so every owned array and view of `f32` or
/// `f64` has it. The trait is sealed.
pub trait RowStatsExt<A: NormScalar, D: Dimension>: sealed::Sealed {
    /// Returns `(mean, rms)` of every row, each an array of the leading shape
    /// (the input's shape without its last axis):
    ///
    /// ```text
    ///        1   d                  ⎛ 1   d     ⎞½
    /// x̄ =  ―   ∑ xᵢ,     rms(x) =  ⎜ ―   ∑ xᵢ² ⎟
    ///        d  i=1                 ⎝ d  i=1    ⎠
    /// ```
    ///
    /// Both are accumulated in `f64`. The mean comes from a compensated sum
    /// divided with an exact remainder, rounded to the element type once.
    /// That sum is good to about `d · 2⁻¹⁰⁶` of `Σ |xᵢ|`, so the
    /// mean is within about half an ulp unless the row cancels far below
    /// that (`[1e20, 1, 1e-20, -1e20, -1]` gives 0, not 2e-21); an `f32`
    /// mean is correctly rounded wherever the sum is exact, which it is
    /// unless the row's nonzero magnitudes lie more than about `2⁸⁰ / d²`
    /// apart. The rms is of `x` itself, not of `x - x̄`: the root of a square
    /// sum (whose terms cannot cancel) taken in short plain sums, rescaled by
    /// a power of two where `f64` squares would overflow or underflow (an
    /// `f32` rms is its `f64` value rounded, within about half an ulp). A row
    /// holding a NaN or an infinity follows IEEE arithmetic: NaN, or ±∞
    /// where all infinities share a sign.
    ///
    /// # Errors
    ///
    /// - [`NormError::ZeroDimensional`] if the array has no axis.
    /// - [`NormError::EmptyAxis`] if the last axis has length 0.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::array;
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[1.0_f64, 2.0, 3.0, 4.0], [3.0, 4.0, 0.0, 0.0]];
    /// let (mean, rms) = x.stats()?;
    /// assert_eq!(mean, array![2.5, 1.75]);
    /// assert!(rms.abs_diff_eq(&array![7.5_f64.sqrt(), 6.25_f64.sqrt()], 1e-15));
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    fn stats(&self) -> Result<(Array<A, D::Smaller>, Array<A, D::Smaller>), NormError>
    where
        D: RemoveAxis;

    /// Returns `(mean, rms)` over the axes from `axis` to the last, taken
    /// together as one row (as [`LayerNormOverExt`](crate::LayerNormOverExt)
    /// takes them), each an array of the leading shape (the axes before
    /// `axis`): the bits of [`stats`](Self::stats) on a standard-layout
    /// copy reshaped to `(leading, d)`.
    ///
    /// # Errors
    ///
    /// - [`NormError::AxisOutOfBounds`] if `axis` is not an axis of `self`.
    /// - [`NormError::EmptyAxes`] if an axis from `axis` on has length 0.
    /// - [`NormError::OutOfMemory`] if the result cannot be allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use ndarray::{array, Axis};
    /// use ndarray_layernorm::prelude::*;
    ///
    /// let x = array![[[1.0_f64, 2.0], [3.0, 6.0]], [[3.0, 4.0], [0.0, 0.0]]];
    /// let (mean, rms) = x.stats_over(Axis(1))?;
    /// assert_eq!(mean, array![3.0, 1.75].into_dyn());
    /// assert_eq!(rms, array![12.5_f64.sqrt(), 6.25_f64.sqrt()].into_dyn());
    /// # Ok::<(), NormError>(())
    /// ```
    #[allow(clippy::type_complexity)]
    fn stats_over(&self, axis: Axis) -> Result<(ArrayD<A>, ArrayD<A>), NormError>;
}

impl<A: NormScalar, D: Dimension> RowStatsExt<A, D> for ArrayRef<A, D> {
    fn stats(&self) -> Result<(Array<A, D::Smaller>, Array<A, D::Smaller>), NormError>
    where
        D: RemoveAxis,
    {
        let d = check::row_length(self)?;
        let leading = self.raw_dim().remove_axis(Axis(self.ndim() - 1));
        rows::reduce_rows(self, d, leading, mean_and_rms)
    }

    fn stats_over(&self, axis: Axis) -> Result<(ArrayD<A>, ArrayD<A>), NormError> {
        let d = check::rows_over(self, axis)?;
        rows::reduce_rows(self, d, over::leading(self, axis), mean_and_rms)
    }
}

/// The mean and the rms of one row, each rounded once.
fn mean_and_rms<A: NormScalar>(isa: Isa, row: &[A]) -> (A, A) {
    let stats = A::row_stats(isa, row);
    (
        A::narrow_sum(stats.mean, stats.mean_rest),
        A::narrow(stats.rms),
    )
}
