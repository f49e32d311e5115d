//! Input validation shared by every public method. All checks run before
//! anything is allocated or written.

use std::borrow::Cow;

use ndarray::{ArrayRef, ArrayRef1, Axis, Dimension};

use crate::error::{NormError, Operand};
use crate::scalar::{NormEps, NormParam, NormScalar, Wide};
use crate::{fresh, rows};

/// The length `d` of the last axis, which every row has.
///
/// Rows that are not contiguous are gathered a block at a time into
/// working memory ([`rows::gathered_rows`]): where that block is large, it
/// is reserved here once and released, so that a row too long to
/// gather (a broadcast view of a vast row, say) gives
/// [`NormError::OutOfMemory`] before anything is written, rather than an
/// aborted process later. (A reservation that succeeds here could still
/// fail later under memory pressure; one of more bytes than the address
/// space holds cannot.)
pub(crate) fn row_length<A, D: Dimension>(x: &ArrayRef<A, D>) -> Result<usize, NormError> {
    let d = match x.shape().last() {
        None => return Err(NormError::ZeroDimensional),
        Some(0) => return Err(NormError::EmptyAxis),
        Some(&d) => d,
    };
    let contiguous_rows = d == 1 || x.strides().last() == Some(&1);
    gathering_fits(x, d, contiguous_rows)?;
    Ok(d)
}

/// The length `d` of the rows of an `_over` call: the product of the
/// lengths of the axes from `axis` to the last, which must hold an element.
/// Reserves the working memory of gathered rows as [`row_length`] does.
pub(crate) fn rows_over<A, D: Dimension>(
    x: &ArrayRef<A, D>,
    axis: Axis,
) -> Result<usize, NormError> {
    let ndim = x.ndim();
    let Some(trailing) = x.shape().get(axis.index()..).filter(|t| !t.is_empty()) else {
        return Err(NormError::AxisOutOfBounds {
            axis: axis.index(),
            ndim,
        });
    };
    // No overflow: ndarray keeps the product of the nonzero lengths within
    // `isize::MAX`, and a zero length makes the product zero.
    let d: usize = trailing.iter().product();
    if d == 0 {
        return Err(NormError::EmptyAxes {
            shape: trailing.to_vec(),
        });
    }
    gathering_fits(x, d, x.is_standard_layout())?;
    Ok(d)
}

/// Reserves once the working memory that gathering rows of `d` elements
/// of `x` takes, when it is large (see [`row_length`]).
fn gathering_fits<A, D: Dimension>(
    x: &ArrayRef<A, D>,
    d: usize,
    contiguous_rows: bool,
) -> Result<(), NormError> {
    let rows = x.len() / d;
    let gathered = rows.min(rows::gathered_rows::<A>(d)).saturating_mul(d);
    if !contiguous_rows && gathered.saturating_mul(size_of::<A>()) > RESERVE_CHECK_BYTES {
        fresh::reserved::<A>(gathered)?;
    }
    Ok(())
}

/// Working memory above this many bytes is reserved once by
/// [`row_length`] before a call starts.
const RESERVE_CHECK_BYTES: usize = 64 << 20;

/// `eps` widened to `f64`, if it is finite and non-negative.
pub(crate) fn eps<A: NormEps<Eps>, Eps>(eps: Eps) -> Result<f64, NormError> {
    valid_eps(A::eps_value(eps))
}

/// `eps`, if it is finite and non-negative.
fn valid_eps(eps: f64) -> Result<f64, NormError> {
    if eps.is_finite() && eps >= 0.0 {
        Ok(eps)
    } else {
        Err(NormError::InvalidEps { eps })
    }
}

/// The elements of `v` as a contiguous slice in logical (row-major) order:
/// borrowed when `v` is in standard layout, gathered once otherwise.
pub(crate) fn logical_order<P: Copy, E: Dimension>(
    v: &ArrayRef<P, E>,
) -> Result<Cow<'_, [P]>, NormError> {
    Ok(match v.as_slice() {
        Some(slice) => Cow::Borrowed(slice),
        None => {
            // Gathered once; a broadcast view of a vast length cannot be.
            let mut copy = fresh::reserved(v.len())?;
            copy.extend(v.iter().copied());
            Cow::Owned(copy)
        }
    })
}

/// A per-feature parameter (`gamma`, `beta`), which must have length `d`,
/// as the kernels of `A` read it: contiguous ([`logical_order`]) and
/// widened where its type is not theirs ([`NormParam`]).
pub(crate) fn params<'a, A: NormScalar + NormParam<P>, P>(
    operand: Operand,
    v: &'a ArrayRef1<P>,
    d: usize,
) -> Result<Cow<'a, [Wide<A>]>, NormError> {
    if v.len() != d {
        return Err(NormError::LengthMismatch {
            operand,
            expected: d,
            found: v.len(),
        });
    }
    A::to_compute(v)
}

/// A per-feature parameter of an `_over` call, which must have the shape of
/// the axes from `axis` on, as the kernels of `A` read it (see [`params`]).
pub(crate) fn trailing_params<'a, A: NormScalar + NormParam<P>, P, D: Dimension, E: Dimension>(
    operand: Operand,
    x: &ArrayRef<A, D>,
    axis: Axis,
    v: &'a ArrayRef<P, E>,
) -> Result<Cow<'a, [Wide<A>]>, NormError> {
    let trailing = &x.shape()[axis.index()..];
    if v.shape() != trailing {
        return Err(NormError::TrailingShapeMismatch {
            operand,
            expected: trailing.to_vec(),
            found: v.shape().to_vec(),
        });
    }
    A::to_compute(v)
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

/// Saved statistics whose rows are indexed by an array of shape `rows` must
/// have been taken over the axes of `x` that the call normalises, which
/// index its rows by the shape `expected` and have the shape `trailing`
/// (statistics of the same input taken over other axes are refused).
pub(crate) fn saved_rows<A, D: Dimension>(
    x: &ArrayRef<A, D>,
    expected: &[usize],
    trailing: &[usize],
    rows: &[usize],
) -> Result<(), NormError> {
    if rows == expected {
        return Ok(());
    }
    // The axes the statistics were taken over: those after as many leading
    // axes as index their rows.
    let count: usize = rows.iter().product();
    let (mut axis, mut leading) = (0, 1);
    while axis < x.ndim() && leading != count {
        leading *= x.shape()[axis];
        axis += 1;
    }
    Err(NormError::TrailingShapeMismatch {
        operand: Operand::Stats,
        expected: trailing.to_vec(),
        found: x.shape()[axis..].to_vec(),
    })
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
