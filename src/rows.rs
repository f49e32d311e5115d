//! The row walk: hands every vector along the last axis to a row kernel as a
//! contiguous slice in logical order, whatever the memory layout.
//!
//! Every layout reaches the same kernel with the same values in the same
//! order, so results are bit-identical across C order, Fortran order, steps,
//! negative strides, broadcasting and `IxDyn`.

use ndarray::{Array, ArrayRef, Axis, Dimension, RemoveAxis, Zip};

use crate::kernel::{Io, Isa};
use crate::scalar::NormScalar;

/// Runs `kernel` on every row of `x`, writing the same row of `out` (same
/// shape, rows of length `d`).
pub(crate) fn map_rows<A: NormScalar, D: Dimension>(
    x: &ArrayRef<A, D>,
    out: &mut ArrayRef<A, D>,
    d: usize,
    kernel: impl Fn(Isa, Io<'_, A>, usize),
) {
    let isa = Isa::detect();
    if let (Some(input), Some(output)) = (x.as_slice(), out.as_slice_mut()) {
        kernel(isa, Io::Copy { input, output }, input.len() / d);
        return;
    }
    let mut scratch = Vec::new();
    Zip::from(x.rows())
        .and(out.rows_mut())
        .for_each(|input, mut output| match output.as_slice_mut() {
            Some(output) => match input.as_slice() {
                Some(input) => kernel(isa, Io::Copy { input, output }, 1),
                None => {
                    // Gather into the output row and normalise it there.
                    for (o, &v) in output.iter_mut().zip(&input) {
                        *o = v;
                    }
                    kernel(isa, Io::InPlace(output), 1);
                }
            },
            None => {
                scratch.clear();
                scratch.extend(input.iter().copied());
                kernel(isa, Io::InPlace(&mut scratch), 1);
                output.assign(&ndarray::aview1(&scratch));
            }
        });
}

/// Runs `kernel` on every row of `x`, overwriting it.
pub(crate) fn map_rows_in_place<A: NormScalar, D: Dimension>(
    x: &mut ArrayRef<A, D>,
    d: usize,
    kernel: impl Fn(Isa, Io<'_, A>, usize),
) {
    let isa = Isa::detect();
    if let Some(all) = x.as_slice_mut() {
        let rows = all.len() / d;
        kernel(isa, Io::InPlace(all), rows);
        return;
    }
    let mut scratch = Vec::new();
    for mut row in x.rows_mut() {
        match row.as_slice_mut() {
            Some(row) => kernel(isa, Io::InPlace(row), 1),
            None => {
                scratch.clear();
                scratch.extend(row.iter().copied());
                kernel(isa, Io::InPlace(&mut scratch), 1);
                row.assign(&ndarray::aview1(&scratch));
            }
        }
    }
}

/// Applies `reduce` to every row of `x`, collecting the two results in
/// arrays of the leading shape.
pub(crate) fn reduce_rows<A: NormScalar, D: RemoveAxis>(
    x: &ArrayRef<A, D>,
    reduce: impl Fn(Isa, &[A]) -> (A, A),
) -> (Array<A, D::Smaller>, Array<A, D::Smaller>) {
    let isa = Isa::detect();
    let leading = x.raw_dim().remove_axis(Axis(x.ndim() - 1));
    let mut first = Array::zeros(leading.clone());
    let mut second = Array::zeros(leading);
    let mut scratch = Vec::new();
    Zip::from(x.rows())
        .and(&mut first)
        .and(&mut second)
        .for_each(|row, a, b| {
            (*a, *b) = match row.as_slice() {
                Some(row) => reduce(isa, row),
                None => {
                    scratch.clear();
                    scratch.extend(row.iter().copied());
                    reduce(isa, &scratch)
                }
            };
        });
    (first, second)
}
