//! Input validation shared by every public method. All checks run before
//! anything is allocated or written.

use std::borrow::Cow;

use ndarray::{ArrayRef, ArrayRef1, Dimension};

use crate::error::{NormError, Operand};
use crate::scalar::NormScalar;

/// The length `d` of the last axis, which every row has.
pub(crate) fn row_length<A, D: Dimension>(x: &ArrayRef<A, D>) -> Result<usize, NormError> {
    match x.shape().last() {
        None => Err(NormError::ZeroDimensional),
        Some(0) => Err(NormError::EmptyAxis),
        Some(&d) => Ok(d),
    }
}

/// `eps` widened to `f64`, if it is finite and non-negative.
pub(crate) fn eps<A: NormScalar>(eps: A) -> Result<f64, NormError> {
    let eps = eps.widen();
    if eps.is_finite() && eps >= 0.0 {
        Ok(eps)
    } else {
        Err(NormError::InvalidEps { eps })
    }
}

/// A per-feature operand of length `d`, as a contiguous slice (borrowed when
/// it already is one, gathered once otherwise).
pub(crate) fn feature_vector<'a, A: NormScalar>(
    operand: Operand,
    v: &'a ArrayRef1<A>,
    d: usize,
) -> Result<Cow<'a, [A]>, NormError> {
    if v.len() != d {
        return Err(NormError::LengthMismatch {
            operand,
            expected: d,
            found: v.len(),
        });
    }
    Ok(match v.as_slice() {
        Some(slice) => Cow::Borrowed(slice),
        None => Cow::Owned(v.to_vec()),
    })
}

/// The output array of an `_into` method must have the input's shape.
pub(crate) fn same_shape<A, D: Dimension>(
    x: &ArrayRef<A, D>,
    out: &ArrayRef<A, D>,
) -> Result<(), NormError> {
    if x.shape() == out.shape() {
        Ok(())
    } else {
        Err(NormError::ShapeMismatch {
            operand: Operand::Output,
            expected: x.shape().to_vec(),
            found: out.shape().to_vec(),
        })
    }
}

/// An array or saved statistics that must belong to an input of `x`'s shape.
pub(crate) fn shape_of<A, D: Dimension>(
    operand: Operand,
    x: &ArrayRef<A, D>,
    found: &[usize],
) -> Result<(), NormError> {
    if x.shape() == found {
        Ok(())
    } else {
        Err(NormError::ShapeMismatch {
            operand,
            expected: x.shape().to_vec(),
            found: found.to_vec(),
        })
    }
}
