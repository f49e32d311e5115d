//! The element types the crate accepts, and the kernels' view of them.

use std::borrow::Cow;
use std::fmt::{Debug, Display};

use ndarray::{ArrayRef, Dimension};
use num_traits::Float;

use crate::check;
use crate::error::NormError;

use crate::kernel::simd::{Vector, LANES};
use crate::kernel::Kernels;
use crate::rows::{GatheredWalks, StridedWalks};

#[cfg(feature = "half")]
mod half;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    #[cfg(feature = "half")]
    impl Sealed for half::f16 {}
    #[cfg(feature = "half")]
    impl Sealed for half::bf16 {}
}

/// An element type the normalisations are defined for: `f32` or `f64`, and
/// with the `half` feature `half::f16` and `half::bf16`.
///
/// All statistics are accumulated in `f64` whatever the element type, so an
/// `f32` result carries a single rounding to `f32`, at the very end. A half
/// row is widened exactly to `f32` in cache and normalised by the `f32`
/// kernels; its output is that `f32` result rounded to the half type. The
/// trait is sealed: the accuracy guarantees are proved for these types
/// only, so no other crate can implement it.
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
    + Kernels
    + StridedWalks<Self>
    + GatheredWalks<Self>
    + NormParam<Self>
    + NormEps<Self>
{
    /// The type a layer keeps its `eps` in: the element type itself for
    /// `f32` and `f64`, `f64` for the half types, whose own precision cannot
    /// hold `1e-6`.
    type Eps: Copy + Debug + PartialEq + Send + Sync + 'static;
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
    /// `eps` as a layer keeps it.
    #[doc(hidden)]
    fn kept_eps(eps: f64) -> Self::Eps;
    /// A kept `eps`, exactly, in `f64`.
    #[doc(hidden)]
    fn kept_eps_value(eps: Self::Eps) -> f64;
}

/// `A: NormParam<P>`: inputs of element type `A` take `gamma` and `beta`
/// of element type `P`. `P` is `A` itself, and for the half types also
/// `f32` (mixed precision: half activations with `f32` parameters, widened
/// exactly, never rounded to the half type). The gradients `dgamma` and
/// `dbeta` come back in `P`.
///
/// The trait is sealed. Since it is implemented on the input's type, the
/// parameters' type follows from the input's where only one fits:
/// `x.layer_norm(&Array1::ones(d), &Array1::zeros(d), 1e-5)` on an `f32`
/// array takes `f32` parameters.
///
/// # Examples
///
/// ```
/// use ndarray::{array, Array1, Array2, ArrayRef2};
/// use ndarray_layernorm::prelude::*;
///
/// fn scaled<A, P>(x: &ArrayRef2<A>, gamma: &Array1<P>) -> Result<Array2<A>, NormError>
/// where
///     A: NormScalar + NormParam<P>,
/// {
///     x.rms_norm(gamma, A::zero())
/// }
/// let y = scaled(&array![[3.0_f32, 4.0]], &array![1.0, 2.0])?;
/// assert!(y.abs_diff_eq(&array![[0.8485, 2.2627]], 1e-4));
/// # Ok::<(), NormError>(())
/// ```
pub trait NormParam<P>: sealed::Sealed {
    /// The parameters `v` (of any shape) in logical order, as the kernels
    /// of `Self` take them: borrowed where they already have that type and
    /// layout, gathered or widened exactly otherwise.
    #[doc(hidden)]
    fn to_compute<E: Dimension>(v: &ArrayRef<P, E>) -> Result<Cow<'_, [Wide<Self>]>, NormError>
    where
        Self: Kernels;
    /// Rounds an accumulated gradient to the parameters' type once.
    #[doc(hidden)]
    fn narrow_grad(value: f64) -> P;
}

/// `A: NormEps<E>`: inputs of element type `A` take `eps` as an `E`. `E` is
/// `A` itself, and for the half types also `f32` and `f64`, so that `1e-6`
/// (not representable in `f16`) means that value: a float literal is an
/// `f64` for half inputs, and the input's own type for `f32` and `f64`.
///
/// The trait is sealed.
///
/// # Examples
///
/// ```
/// use ndarray::array;
/// use ndarray_layernorm::prelude::*;
///
/// let x = array![[1.0_f32, 2.0, 3.0]];
/// let y = x.layer_norm_plain(1e-5)?; // an f32 eps for an f32 input
/// # let _ = y;
/// # Ok::<(), NormError>(())
/// ```
pub trait NormEps<E>: sealed::Sealed {
    /// `eps`, exactly, in `f64`.
    #[doc(hidden)]
    fn eps_value(eps: E) -> f64;
}

/// The element type of the kernels that normalise rows of `A`: `A` itself
/// for `f32` and `f64`, `f32` for the half types.
pub(crate) type Wide<A> = <A as Kernels>::Compute;

/// Per-feature parameters as the kernels of `A` read them.
pub(crate) type WideParams<'a, A> = Cow<'a, [Wide<A>]>;

/// An element type the row kernels compute on directly (`f32`, `f64`):
/// how its chunks move to and from the kernel vector.
#[doc(hidden)]
pub trait KernelScalar: NormScalar + Kernels<Compute = Self> {
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
    /// Stores a kernel vector as [`KernelScalar::store`] does, past the caches
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
    /// Copies a square of [`KernelScalar::SQUARE`] lines of as many elements
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
    /// [`KernelScalar::transpose_square`].
    #[doc(hidden)]
    const SQUARE: usize = 64 / size_of::<Self>();
}

impl NormScalar for f32 {
    type Eps = f32;

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
    fn kept_eps(eps: f64) -> Self {
        eps as f32
    }
    fn kept_eps_value(eps: Self) -> f64 {
        f64::from(eps)
    }
}

impl KernelScalar for f32 {
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

impl NormParam<f32> for f32 {
    fn to_compute<E: Dimension>(v: &ArrayRef<Self, E>) -> Result<Cow<'_, [Self]>, NormError> {
        check::logical_order(v)
    }
    fn narrow_grad(value: f64) -> Self {
        Self::narrow(value)
    }
}

impl NormEps<f32> for f32 {
    fn eps_value(eps: Self) -> f64 {
        f64::from(eps)
    }
}

impl NormScalar for f64 {
    type Eps = f64;

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
    fn kept_eps(eps: f64) -> Self {
        eps
    }
    fn kept_eps_value(eps: Self) -> f64 {
        eps
    }
}

impl KernelScalar for f64 {
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

impl NormParam<f64> for f64 {
    fn to_compute<E: Dimension>(v: &ArrayRef<Self, E>) -> Result<Cow<'_, [Self]>, NormError> {
        check::logical_order(v)
    }
    fn narrow_grad(value: f64) -> Self {
        Self::narrow(value)
    }
}

impl NormEps<f64> for f64 {
    fn eps_value(eps: Self) -> f64 {
        eps
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
