//! Parameter-holding LayerNorm and RMSNorm layers, as a model owns them.
//!
//! A layer normalises the last axis, or, built with a normalised shape of
//! several axes (PyTorch's `normalized_shape`), the last axes of that shape
//! taken together, through the forms over several axes
//! ([`crate::over`]). Its parameters are stored flat, in row-major order.

mod layer_norm;
mod rms_norm;

pub use layer_norm::LayerNorm;
pub use rms_norm::RmsNorm;

use ndarray::{ArrayRef, Axis, Dimension, RemoveAxis};

use crate::backward;
use crate::check;
use crate::error::{NormError, Operand};

/// `shape` as the normalised shape of a layer of `d` parameters.
fn normalized_shape(shape: &[usize], d: usize) -> Result<Vec<usize>, NormError> {
    let elements = shape.iter().try_fold(1_usize, |n, &len| n.checked_mul(len));
    if shape.is_empty() || elements != Some(d) {
        return Err(NormError::TrailingShapeMismatch {
            operand: Operand::Gamma,
            expected: shape.to_vec(),
            found: vec![d],
        });
    }
    Ok(shape.to_vec())
}

/// The length of the rows that a layer over `shape` takes of `x`: its last
/// axis for a layer over one axis, else its last `shape.len()` axes, which
/// must have that shape.
fn rows_of<A, D: Dimension>(x: &ArrayRef<A, D>, shape: &[usize]) -> Result<usize, NormError> {
    if shape.len() <= 1 {
        return check::row_length(x);
    }
    let axis = x.ndim().saturating_sub(shape.len());
    let trailing = &x.shape()[axis..];
    if trailing != shape {
        return Err(NormError::TrailingShapeMismatch {
            operand: Operand::Gamma,
            expected: trailing.to_vec(),
            found: shape.to_vec(),
        });
    }
    check::rows_over(x, Axis(axis))
}

/// [`rows_of`] for a backward call, then the check of `dy`, in the order
/// the errors are documented.
fn backward_rows<A, D: Dimension>(
    x: &ArrayRef<A, D>,
    dy: &ArrayRef<A, D>,
    shape: &[usize],
) -> Result<usize, NormError> {
    let d = rows_of(x, shape)?;
    check::shape_of(Operand::Gradient, x, dy.shape())?;
    Ok(d)
}

/// The index of the statistics of a layer over `k` axes: the input's shape
/// without its last axis, and with the other normalised axes of length 1
/// (their type has one axis fewer than the input's).
fn stats_index<A, D: RemoveAxis>(x: &ArrayRef<A, D>, k: usize) -> D::Smaller {
    let mut index = backward::leading_of(x);
    let n = index.ndim();
    for axis in n.saturating_sub(k.saturating_sub(1))..n {
        index[axis] = 1;
    }
    index
}

/// Checks that statistics whose rows have the index shape `rows` were
/// saved by a layer over `shape`, not by one over other axes of the same
/// input.
fn check_stats_rows<A, D: RemoveAxis>(
    x: &ArrayRef<A, D>,
    shape: &[usize],
    rows: &[usize],
) -> Result<(), NormError> {
    check::saved_rows(x, stats_index(x, shape.len()).slice(), shape, rows)
}
