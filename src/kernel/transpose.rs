//! Transposing copies: the step between the column pieces of a
//! Fortran-order block and its rows, in both directions, for the row walk of
//! strided arrays.

use super::simd::{transpose_elements, Vector};
use crate::scalar::KernelScalar;

/// `dst[j · dst_lead + i] = src[i · src_lead + j]` for `i < lines` and
/// `j < length`: `lines` lines of `length` elements, each contiguous, copied
/// into `length` lines of `lines` elements. The squares of a cache line of
/// elements on each side move in registers
/// ([`KernelScalar::transpose_square`]), the edges one element at a time.
///
/// Unless `lines` or `length` is zero, `src` holds at least
/// `(lines - 1) · src_lead + length` elements and `dst` at least
/// `(length - 1) · dst_lead + lines`; the lines of each side do not overlap
/// (`src_lead >= length`, `dst_lead >= lines`).
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn transpose_lines<A: KernelScalar, V: Vector>(
    src: &[A],
    src_lead: usize,
    dst: &mut [A],
    dst_lead: usize,
    lines: usize,
    length: usize,
) {
    debug_assert!(lines == 0 || length == 0 || (src_lead >= length && dst_lead >= lines));
    let side = A::SQUARE;
    let whole_lines = lines - lines % side;
    let whole_length = length - length % side;
    for i in (0..whole_lines).step_by(side) {
        for j in (0..whole_length).step_by(side) {
            let from = &src[i * src_lead + j..];
            A::transpose_square::<V>(from, src_lead, &mut dst[j * dst_lead + i..], dst_lead);
        }
    }
    transpose_elements(
        src,
        src_lead,
        dst,
        dst_lead,
        0..whole_lines,
        whole_length..length,
    );
    transpose_elements(src, src_lead, dst, dst_lead, whole_lines..lines, 0..length);
}
