//! The element types the crate accepts.

use std::fmt::{Debug, Display};

use num_traits::Float;

use crate::kernel::simd::{Vector, LANES};

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
pub trait NormScalar: Float + Debug + Display + Send + Sync + 'static + sealed::Sealed {
    /// Converts to the accumulation type. Exact.
    #[doc(hidden)]
    fn widen(self) -> f64;
    /// Rounds an accumulated value to the element type (round to nearest, ties to even).
    #[doc(hidden)]
    fn narrow(value: f64) -> Self;
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
