//! The element types the crate accepts.

use std::fmt::{Debug, Display};

use num_traits::Float;

use crate::kernel::simd::{Vector, LANES};
use crate::kernel::Kernels;
use crate::rows::{GatheredWalks, StridedWalks};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// An element type the normalisations are defined for: `f32` or `f64`.
///
/// All statistics are accumulated in `f64` whatever the element type, so an
/// `f32` result carries a single rounding to `f32`, at the very end. The
/// trait is sealed:
/// the accuracy guarantees are proved for these two types only, so no other
/// crate can implement it.
///
/// # Examples
///
/// ```
/// use ndarray::{Array2, ArrayRef2};
/// use ndarray_layernorm::prelude::*;
///
/// fn centred<A: NormScalar>(x: &ArrayRef2<A>) -> Result<Array2<A>, NormError> {
///     x.layer_norm_plain(A::zero())
/// }
/// let y = centred(&ndarray::array![[3.0_f32, 4.0]])?;
/// assert_eq!(y, ndarray::array![[-1.0_f32, 1.0]]);
/// # Ok::<(), NormError>(())
/// ```
pub trait NormScalar:
    Float
    + Debug
    + Display
    + Send
    + Sync
    + 'static
    + sealed::Sealed
    + Kernels<Self>
    + StridedWalks<Self>
    + GatheredWalks<Self>
{
    /// Converts to the accumulation type. Exact.
    #[doc(hidden)]
    fn widen(self) -> f64;
    /// Rounds an accumulated value to the element type (round to nearest, ties to even).
    #[doc(hidden)]
    fn narrow(value: f64) -> Self;
    /// Rounds the unevaluated sum `hi + lo` to the element type once, where
    /// `hi` is the double nearest the sum (so `|lo|` is at most half an
    /// ulp of `hi`).
    #[doc(hidden)]
    fn narrow_sum(hi: f64, lo: f64) -> Self;
    /// Loads a chunk into a kernel vector, widening exactly.
    #[doc(hidden)]
    fn load<V: Vector>(chunk: &[Self; LANES]) -> V;
    /// Stores a kernel vector, rounding each lane once.
    #[doc(hidden)]
    fn store<V: Vector>(value: V, chunk: &mut [Self; LANES]);
    /// Loads a row's last, partial chunk into the first lanes of a kernel
    /// vector, widening exactly; the other lanes hold zero.
    #[doc(hidden)]
    fn load_partial<V: Vector>(tail: &[Self]) -> V;
    /// Stores the first `tail.len()` lanes of a kernel vector into a row's
    /// last, partial chunk, rounding each once.
    #[doc(hidden)]
    fn store_partial<V: Vector>(value: V, tail: &mut [Self]);
    /// Stores a kernel vector as [`NormScalar::store`] does, past the caches
    /// where the vector type allows it.
    #[doc(hidden)]
    fn stream<V: Vector>(value: V, chunk: &mut [Self; LANES]);
    /// Loads element `j` of 16 consecutive rows of `d` elements into the
    /// lanes of `columns[j]`, for every `j < d`, widening exactly.
    #[doc(hidden)]
    fn load_columns<V: Vector>(rows: &[Self], d: usize, columns: &mut [V; LANES]);
    /// Stores the lanes of `columns[j]` as element `j` of 16 consecutive
    /// rows of `d` elements, for every `j < d`, rounding each lane once.
    #[doc(hidden)]
    fn store_columns<V: Vector>(columns: &[V; LANES], rows: &mut [Self], d: usize);
    /// Copies a square of [`NormScalar::SQUARE`] lines of as many elements
    /// (a cache line each), transposed: `src[i · src_lead + j]` to
    /// `dst[j · dst_lead + i]`.
    #[doc(hidden)]
    fn transpose_square<V: Vector>(
        src: &[Self],
        src_lead: usize,
        dst: &mut [Self],
        dst_lead: usize,
    );
    /// Elements in a 64-byte cache line: the side of the squares of
    /// [`NormScalar::transpose_square`].
    #[doc(hidden)]
    const SQUARE: usize = 64 / size_of::<Self>();
}

impl NormScalar for f32 {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn widen(self) -> f64 {
        f64::from(self)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn narrow(value: f64) -> Self {
        value as f32
    }
    /// `hi as f32` is `hi + lo` rounded once unless `hi` lies exactly
    /// halfway between two `f32` values (or between `±f32::MAX` and the
    /// overflow to `±∞`), where the rounding of `hi` alone goes to the even
    /// one: `lo` then says which side the sum is on. (`hi` cannot be a tie
    /// of `f32` and `lo` reach the next one: an `f32` ulp is 2²⁹ `f64` ulps.)
    fn narrow_sum(hi: f64, lo: f64) -> Self {
        let rounded = hi as f32;
        let back = f64::from(rounded);
        if back == hi || lo == 0.0 || !hi.is_finite() {
            return rounded;
        }
        let (below, above) = if back < hi {
            (rounded, rounded.next_up())
        } else {
            (rounded.next_down(), rounded)
        };
        // The midpoint of two adjacent `f32` values is exact in `f64`; past
        // `f32::MAX`, rounding overflows from `MAX` plus half its ulp, 2¹⁰³.
        let overflow = f64::from(f32::MAX) + 2f64.powi(103);
        let midpoint = if above == f32::INFINITY {
            overflow
        } else if below == f32::NEG_INFINITY {
            -overflow
        } else {
            (f64::from(below) + f64::from(above)) * 0.5
        };
        match (hi == midpoint, lo > 0.0) {
            (false, _) => rounded,
            (true, true) => above,
            (true, false) => below,
        }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load<V: Vector>(chunk: &[Self; LANES]) -> V {
        V::load_f32(chunk)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store<V: Vector>(value: V, chunk: &mut [Self; LANES]) {
        value.store_f32(chunk)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_partial<V: Vector>(tail: &[Self]) -> V {
        V::load_partial_f32(tail)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store_partial<V: Vector>(value: V, tail: &mut [Self]) {
        value.store_partial_f32(tail)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn stream<V: Vector>(value: V, chunk: &mut [Self; LANES]) {
        value.stream_f32(chunk)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_columns<V: Vector>(rows: &[Self], d: usize, columns: &mut [V; LANES]) {
        V::load_columns_f32(rows, d, columns)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store_columns<V: Vector>(columns: &[V; LANES], rows: &mut [Self], d: usize) {
        V::store_columns_f32(columns, rows, d)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn transpose_square<V: Vector>(
        src: &[Self],
        src_lead: usize,
        dst: &mut [Self],
        dst_lead: usize,
    ) {
        V::transpose_square_f32(src, src_lead, dst, dst_lead)
    }
}

impl NormScalar for f64 {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn widen(self) -> f64 {
        self
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn narrow(value: f64) -> Self {
        value
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn narrow_sum(hi: f64, _lo: f64) -> Self {
        hi
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load<V: Vector>(chunk: &[Self; LANES]) -> V {
        V::load_f64(chunk)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store<V: Vector>(value: V, chunk: &mut [Self; LANES]) {
        value.store_f64(chunk)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_partial<V: Vector>(tail: &[Self]) -> V {
        V::load_partial_f64(tail)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store_partial<V: Vector>(value: V, tail: &mut [Self]) {
        value.store_partial_f64(tail)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn stream<V: Vector>(value: V, chunk: &mut [Self; LANES]) {
        value.stream_f64(chunk)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_columns<V: Vector>(rows: &[Self], d: usize, columns: &mut [V; LANES]) {
        V::load_columns_f64(rows, d, columns)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store_columns<V: Vector>(columns: &[V; LANES], rows: &mut [Self], d: usize) {
        V::store_columns_f64(columns, rows, d)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn transpose_square<V: Vector>(
        src: &[Self],
        src_lead: usize,
        dst: &mut [Self],
        dst_lead: usize,
    ) {
        V::transpose_square_f64(src, src_lead, dst, dst_lead)
    }
}

#[cfg(test)]
mod tests {
    use super::NormScalar;

    #[test]
    fn narrow_sum_settles_f32_ties_by_the_rest() {
        let tiny = f32::from_bits(1);
        // Midpoints between normal, subnormal and the largest values.
        for (below, above) in [
            (1.0f32, 1.0f32.next_up()),
            (-(1.0f32.next_up()), -1.0),
            (tiny, 2.0 * tiny),
            (0.0, tiny),
            (f32::MAX.next_down(), f32::MAX),
        ] {
            let midpoint = (f64::from(below) + f64::from(above)) / 2.0;
            let ulp = midpoint.abs() * f64::EPSILON;
            assert_eq!(f32::narrow_sum(midpoint, ulp / 4.0), above);
            assert_eq!(f32::narrow_sum(midpoint, -ulp / 4.0), below);
            assert_eq!(f32::narrow_sum(midpoint, 0.0), midpoint as f32);
            // Off the midpoint, the rest changes nothing.
            let off = midpoint + ulp;
            assert_eq!(f32::narrow_sum(off, -ulp / 4.0), off as f32);
        }
        // Halfway between the largest value and the overflow.
        let overflow = f64::from(f32::MAX) + 2f64.powi(103);
        assert_eq!(f32::narrow_sum(overflow, -1e20), f32::MAX);
        assert_eq!(f32::narrow_sum(overflow, 1e20), f32::INFINITY);
        assert_eq!(f32::narrow_sum(-overflow, 1e20), -f32::MAX);
        assert_eq!(f32::narrow_sum(-overflow, -1e20), f32::NEG_INFINITY);
        assert!(f32::narrow_sum(f64::NAN, 1.0).is_nan());
        assert_eq!(f32::narrow_sum(f64::INFINITY, -1.0), f32::INFINITY);
    }
}
