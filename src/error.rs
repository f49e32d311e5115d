//! The error type of every fallible operation in the crate.

use std::error::Error;
use std::fmt;

/// An operand of a normalisation call other than the input array itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operand {
    /// The per-feature gain `gamma`.
    Gamma,
    /// The per-feature shift `beta`.
    Beta,
    /// A caller-provided output array.
    Output,
    /// The gradient `dy` of the loss with respect to the output.
    Gradient,
    /// The residual added to the input by the fused forms.
    Residual,
    /// The statistics saved by a training forward pass.
    Stats,
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operand::Gamma => "gamma",
            Operand::Beta => "beta",
            Operand::Output => "output",
            Operand::Gradient => "dy",
            Operand::Residual => "residual",
            Operand::Stats => "stats",
        })
    }
}

/// Why a normalisation or statistics call was rejected.
///
/// Every check runs before any output is written or allocated, so an
/// `Err` leaves in-place and output arrays untouched.
///
/// # Examples
///
/// ```
/// use ndarray::array;
/// use ndarray_layernorm::prelude::*;
/// use ndarray_layernorm::Operand;
///
/// let x = array![[1.0_f64, 2.0, 3.0]];
/// let err = x.layer_norm(&array![1.0, 1.0], &array![0.0, 0.0, 0.0], 1e-5).unwrap_err();
/// assert_eq!(
///     err,
///     NormError::LengthMismatch { operand: Operand::Gamma, expected: 3, found: 2 }
/// );
/// assert_eq!(err.to_string(), "gamma has length 2, expected 3 (the number of features)");
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum NormError {
    /// `gamma` or `beta` does not have the number of features `d`: the
    /// length of the input's last axis, or of `gamma` when a layer is built
    /// from its parts.
    LengthMismatch {
        /// Which operand has the wrong length.
        operand: Operand,
        /// The number of features.
        expected: usize,
        /// The operand's length.
        found: usize,
    },
    /// An array that must have the input's shape does not.
    ShapeMismatch {
        /// Which operand has the wrong shape.
        operand: Operand,
        /// The input's shape.
        expected: Vec<usize>,
        /// The operand's shape (for [`Operand::Stats`], the shape of the
        /// input the statistics were computed for).
        found: Vec<usize>,
    },
    /// The last axis has length 0, so a row has no mean or scale.
    EmptyAxis,
    /// An `_over` call: the axes normalised over (from `Axis(a)` to the
    /// last) hold no element, so a row has no mean or scale.
    EmptyAxes {
        /// The shape of the axes normalised over.
        shape: Vec<usize>,
    },
    /// An `_over` call: the first axis to normalise over is not an axis of
    /// the input.
    AxisOutOfBounds {
        /// The first axis to normalise over.
        axis: usize,
        /// The number of axes of the input.
        ndim: usize,
    },
    /// An `_over` call or a layer over several axes: `gamma` or `beta` does
    /// not have the shape of the axes normalised over (for a layer: its
    /// normalised shape is not that of the input's last axes, or does not
    /// hold as many elements as its parameters); or saved statistics were
    /// taken over other axes ([`Operand::Stats`]).
    TrailingShapeMismatch {
        /// Which operand has the wrong shape.
        operand: Operand,
        /// The shape of the axes normalised over.
        expected: Vec<usize>,
        /// The operand's shape.
        found: Vec<usize>,
    },
    /// The input has no axis at all (a 0-dimensional `IxDyn` array).
    ZeroDimensional,
    /// `eps` is negative, NaN or infinite. Stored widened to `f64`
    /// (exact for `f32`).
    InvalidEps {
        /// The rejected value.
        eps: f64,
    },
    /// The memory for a new result array, or for the working memory a call
    /// needs (a block of gathered rows, a copy of a strided `gamma`), could
    /// not be had: more bytes than an allocation may hold, or more than the
    /// allocator would give (as for a broadcast view of a vast shape).
    /// Nothing was computed or written.
    OutOfMemory {
        /// The number of elements of the result.
        elements: usize,
        /// The size of one element in bytes.
        element_size: usize,
    },
}

impl NormError {
    /// True for [`NormError::LengthMismatch`], [`NormError::ShapeMismatch`]
    /// and [`NormError::TrailingShapeMismatch`].
    pub fn is_shape_error(&self) -> bool {
        matches!(
            self,
            NormError::LengthMismatch { .. }
                | NormError::ShapeMismatch { .. }
                | NormError::TrailingShapeMismatch { .. }
        )
    }
}

impl fmt::Display for NormError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NormError::LengthMismatch {
                operand,
                expected,
                found,
            } => write!(
                f,
                "{operand} has length {found}, expected {expected} (the number of features)"
            ),
            NormError::ShapeMismatch {
                operand: Operand::Stats,
                expected,
                found,
            } => write!(
                f,
                "stats were computed for an input of shape {found:?}, not {expected:?} (the shape of the input)"
            ),
            NormError::ShapeMismatch {
                operand,
                expected,
                found,
            } => write!(
                f,
                "{operand} has shape {found:?}, expected {expected:?} (the shape of the input)"
            ),
            NormError::EmptyAxis => f.write_str("the last axis has length 0"),
            NormError::EmptyAxes { shape } => {
                write!(f, "the axes to normalise over, of shape {shape:?}, hold no element")
            }
            NormError::AxisOutOfBounds { axis, ndim } => write!(
                f,
                "cannot normalise from axis {axis}: the input has {ndim} axes"
            ),
            NormError::TrailingShapeMismatch {
                operand,
                expected,
                found,
            } => write!(
                f,
                "{operand} has shape {found:?}, expected {expected:?} (the shape of the axes normalised over)"
            ),
            NormError::ZeroDimensional => {
                f.write_str("the input has no axis to normalise (0-dimensional array)")
            }
            NormError::InvalidEps { eps } => {
                write!(f, "eps must be finite and non-negative, found {eps}")
            }
            NormError::OutOfMemory {
                elements,
                element_size,
            } => write!(
                f,
                "cannot allocate the result: {elements} elements of {element_size} bytes"
            ),
        }
    }
}

impl Error for NormError {}
