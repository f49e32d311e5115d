//! Normalisation over several trailing axes: the axes from `Axis(a)` to the
//! last, taken together as one row of the product of their lengths, as
//! PyTorch's `normalized_shape` and ONNX's `axis` define it.
//!
//! The rows reach the same kernels as those of the last-axis forms, through
//! the same row walks ([`crate::rows`], [`crate::blocks`]), which find a
//! row's axes from its length. So a call gives the bits of the last-axis
//! form on a standard-layout copy reshaped to `(leading, d)`.

mod layer_norm;
mod rms_norm;

pub use layer_norm::LayerNormOverExt;
pub use rms_norm::RmsNormOverExt;

use ndarray::{ArrayRef, Axis, Dimension, IxDyn};

use crate::check;
use crate::error::{NormError, Operand};

/// The shape of the rows' index of a call from `axis`: the axes before it.
pub(crate) fn leading<A, D: Dimension>(x: &ArrayRef<A, D>, axis: Axis) -> IxDyn {
    IxDyn(&x.shape()[..axis.index()])
}

/// Checks that statistics saved for an input of `input_shape`, with rows
/// indexed by `rows_shape`, belong to `x` normalised from `axis`.
pub(crate) fn check_stats<A, D: Dimension>(
    x: &ArrayRef<A, D>,
    axis: Axis,
    input_shape: &[usize],
    rows_shape: &[usize],
) -> Result<(), NormError> {
    if input_shape != x.shape() {
        return Err(NormError::ShapeMismatch {
            operand: Operand::Stats,
            expected: x.shape().to_vec(),
            found: input_shape.to_vec(),
        });
    }
    let (leading, trailing) = x.shape().split_at(axis.index());
    check::saved_rows(x, leading, trailing, rows_shape)
}
