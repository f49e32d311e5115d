//! The vector type the kernels are written against: [`LANES`] `f64` lanes
//! with lane-wise IEEE arithmetic.
//!
//! Every implementation (the portable array here, and the AVX2 and AVX-512
//! registers of `x86`) performs exactly the same correctly rounded
//! operation in every lane, and element `i` of a chunk always lands in lane
//! `i`. The kernels therefore produce the same bits on every path.

use std::ops::{Add, Div, Mul, Range, Sub};

use super::islands::Islands;
use crate::scalar::KernelScalar;

/// Number of lanes of every vector, and so of every accumulator.
pub(crate) const LANES: usize = 16;

/// One value per lane, in lane order.
pub(crate) type Lanes = [f64; LANES];

/// Lane-wise arithmetic shared by vectors and plain `f64` (the latter for
/// the once-per-row scalar steps). Crate-private like [`Vector`].
pub trait Arith:
    Copy + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self>
{
    /// Every lane set to `value`.
    fn splat(value: f64) -> Self;
    /// Per lane: `if other < self { other } else { self }`.
    fn min_select(self, other: Self) -> Self;
    /// Per lane: `if other > self { other } else { self }`.
    fn max_select(self, other: Self) -> Self;
    /// Per lane: the value with its sign bit cleared.
    fn abs(self) -> Self;
    /// Per lane: the correctly rounded square root.
    fn sqrt(self) -> Self;
    /// Per lane: `self · a + b` rounded once (a fused multiply-add), so the
    /// same bits on every path.
    fn mul_add(self, a: Self, b: Self) -> Self;
}

impl Arith for f64 {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn splat(value: f64) -> Self {
        value
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn min_select(self, other: Self) -> Self {
        if other < self {
            other
        } else {
            self
        }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn max_select(self, other: Self) -> Self {
        if other > self {
            other
        } else {
            self
        }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn abs(self) -> Self {
        f64::abs(self)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn mul_add(self, a: Self, b: Self) -> Self {
        f64::mul_add(self, a, b)
    }
}

/// A vector of [`LANES`] lanes that loads and stores the element types.
///
/// This is a `pub` trait in a private module so that the sealed
/// `KernelScalar` can name it; it is not reachable from outside the crate.
pub trait Vector: Arith + Islands {
    /// The lanes as an array.
    fn to_lanes(self) -> Lanes;
    /// A vector from an array of lanes.
    fn from_lanes(lanes: &Lanes) -> Self;
    /// Loads 16 `f64`.
    fn load_f64(chunk: &[f64; LANES]) -> Self;
    /// Loads 16 `f32`, widened exactly.
    fn load_f32(chunk: &[f32; LANES]) -> Self;
    /// Stores 16 `f64`.
    fn store_f64(self, chunk: &mut [f64; LANES]);
    /// Stores 16 `f32`, each rounded to nearest (ties to even).
    fn store_f32(self, chunk: &mut [f32; LANES]);
    /// Loads the `f64` of `tail` (shorter than a chunk) into the first
    /// lanes; the other lanes hold zero. Reads nothing past `tail`.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_partial_f64(tail: &[f64]) -> Self {
        through_chunk::load_f64(tail)
    }
    /// [`Vector::load_partial_f64`] of `f32`, widened exactly.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_partial_f32(tail: &[f32]) -> Self {
        through_chunk::load_f32(tail)
    }
    /// Stores the first `tail.len()` lanes (fewer than a chunk) into
    /// `tail`. Writes nothing past `tail`.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store_partial_f64(self, tail: &mut [f64]) {
        through_chunk::store_f64(self, tail)
    }
    /// [`Vector::store_partial_f64`] into `f32`, each rounded to nearest
    /// (ties to even).
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store_partial_f32(self, tail: &mut [f32]) {
        through_chunk::store_f32(self, tail)
    }
    /// Lane 0.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn first_lane(self) -> f64 {
        self.to_lanes()[0]
    }
    /// Stores 16 `f64` past the caches (non-temporal stores) where the
    /// vector type has them and `chunk` starts on a 64-byte line; a plain
    /// store otherwise. The stored values are those of [`Vector::store_f64`].
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn stream_f64(self, chunk: &mut [f64; LANES]) {
        self.store_f64(chunk)
    }
    /// Stores 16 `f32` as [`Vector::store_f32`] does, past the caches where
    /// possible (see [`Vector::stream_f64`]).
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn stream_f32(self, chunk: &mut [f32; LANES]) {
        self.store_f32(chunk)
    }
    /// Whether every lane lies in `low ..= high` (false for a NaN lane).
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn all_within(self, low: f64, high: f64) -> bool {
        self.to_lanes()
            .iter()
            .all(|&lane| lane >= low && lane <= high)
    }
    /// Element `j` of each of 16 consecutive rows of `d` elements, widened
    /// exactly: lane `l` holds `rows[l · d + j]`. Lanes whose element lies
    /// past the end of `rows` hold zero.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_column_f32(rows: &[f32], j: usize, d: usize) -> Self {
        Self::from_lanes(&column_lanes(rows, j, d))
    }
    /// [`Vector::load_column_f32`] of `f64` rows.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_column_f64(rows: &[f64], j: usize, d: usize) -> Self {
        Self::from_lanes(&column_lanes(rows, j, d))
    }
    /// Stores lane `l`, rounded to nearest (ties to even), as element `j`
    /// of row `l` of 16 consecutive rows of `d` elements: `rows[l · d + j]`.
    /// Lanes whose element lies past the end of `rows` are dropped.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store_column_f32(self, rows: &mut [f32], j: usize, d: usize) {
        store_column_lanes(self.to_lanes(), rows, j, d);
    }
    /// [`Vector::store_column_f32`] into `f64` rows.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store_column_f64(self, rows: &mut [f64], j: usize, d: usize) {
        store_column_lanes(self.to_lanes(), rows, j, d);
    }
    /// Every column `j < d` of 16 consecutive rows of `d` elements
    /// (`d <= LANES`) into `columns[j]`, as [`Vector::load_column_f32`].
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_columns_f32(rows: &[f32], d: usize, columns: &mut [Self; LANES]) {
        column_by_column::load_f32(rows, d, columns)
    }
    /// [`Vector::load_columns_f32`] of `f64` rows.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_columns_f64(rows: &[f64], d: usize, columns: &mut [Self; LANES]) {
        column_by_column::load_f64(rows, d, columns)
    }
    /// The inverse of [`Vector::load_columns_f32`]: `columns[j]` for every
    /// `j < d` as [`Vector::store_column_f32`] stores it.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store_columns_f32(columns: &[Self; LANES], rows: &mut [f32], d: usize) {
        column_by_column::store_f32(columns, rows, d)
    }
    /// [`Vector::store_columns_f32`] into `f64` rows.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store_columns_f64(columns: &[Self; LANES], rows: &mut [f64], d: usize) {
        column_by_column::store_f64(columns, rows, d)
    }
    /// Copies a square of 16 lines of 16 `f32`, transposed: element `j` of
    /// line `i`, `src[i · src_lead + j]`, to `dst[j · dst_lead + i]`. The
    /// slices hold at least `15 · lead + 16` elements. One element at a time
    /// here; in registers where a vector type has the permutes for it.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn transpose_square_f32(src: &[f32], src_lead: usize, dst: &mut [f32], dst_lead: usize) {
        transpose_elements(src, src_lead, dst, dst_lead, 0..16, 0..16);
    }
    /// [`Vector::transpose_square_f32`] for a square of 8 lines of 8 `f64`
    /// (slices of at least `7 · lead + 8` elements).
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn transpose_square_f64(src: &[f64], src_lead: usize, dst: &mut [f64], dst_lead: usize) {
        transpose_elements(src, src_lead, dst, dst_lead, 0..8, 0..8);
    }
    /// Lanes `width .. 2 · width` moved down to `0 .. width`, for `width`
    /// a power of two below `LANES`; the other lanes hold arbitrary values.
    /// One step of the halving tree that reduces a vector to one lane.
    fn lanes_from(self, width: usize) -> Self;

    /// One register of the vector (the whole vector where it is a plain
    /// array), for the reductions whose result does not depend on the order
    /// in which the lanes meet: the least and the greatest of values that
    /// hold no NaN, where the sign of a zero does not matter. Folding a
    /// vector into one register as it is read keeps such an accumulator to
    /// one register where the vector is several, which leaves the others to
    /// the sums beside it.
    type Part: Copy;
    /// Every lane of a part set to `value`.
    fn part_splat(value: f64) -> Self::Part;
    /// The least of `part` and of every lane of `self`, lane by lane of the
    /// part.
    fn min_into(self, part: Self::Part) -> Self::Part;
    /// The greatest of `part` and of every lane of `self`, likewise.
    fn max_into(self, part: Self::Part) -> Self::Part;
    /// The least lane of a part.
    fn part_min(part: Self::Part) -> f64;
    /// The greatest lane of a part.
    fn part_max(part: Self::Part) -> f64;

    /// Lanes below `active` from `self`, the others from `old`.
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn blend(self, old: Self, active: usize) -> Self {
        let new = self.to_lanes();
        let mut lanes = old.to_lanes();
        for (lane, value) in lanes.iter_mut().zip(new).take(active) {
            *lane = value;
        }
        Self::from_lanes(&lanes)
    }
}

/// The partial-chunk moves of [`Vector`] through a whole chunk on the
/// stack, padded with zeros: the moves of every vector type, and of the
/// chunks whose masked moves would reach into another page (see
/// [`chunk_stays_in_page`]).
pub(crate) mod through_chunk {
    use super::{Vector, LANES};

    #[cfg_attr(not(debug_assertions), inline(always))]
    fn padded<T: Copy + Default>(tail: &[T]) -> [T; LANES] {
        let mut chunk = [T::default(); LANES];
        chunk[..tail.len()].copy_from_slice(tail);
        chunk
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn load_f64<V: Vector>(tail: &[f64]) -> V {
        V::load_f64(&padded(tail))
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn load_f32<V: Vector>(tail: &[f32]) -> V {
        V::load_f32(&padded(tail))
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn store_f64<V: Vector>(value: V, tail: &mut [f64]) {
        let mut chunk = [0.0; LANES];
        value.store_f64(&mut chunk);
        tail.copy_from_slice(&chunk[..tail.len()]);
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn store_f32<V: Vector>(value: V, tail: &mut [f32]) {
        let mut chunk = [0.0; LANES];
        value.store_f32(&mut chunk);
        tail.copy_from_slice(&chunk[..tail.len()]);
    }
}

/// Bytes of the smallest page on the targets with masked moves.
const PAGE: usize = 4096;

/// Whether a whole chunk that starts where `tail` starts ends on the page
/// of `tail`'s last element, so that masked moves of `tail` touch no page
/// the slice does not. Where the off lanes of a masked move lie on another
/// page, the processor must make sure they cannot fault, which can take a
/// microcode assist on every row: far more than the stack copy this asks
/// for (PERFORMANCE.md, "Row tails").
#[cfg_attr(not(debug_assertions), inline(always))]
pub(crate) fn chunk_stays_in_page<T>(tail: &[T]) -> bool {
    let start = tail.as_ptr() as usize;
    let last = start + (tail.len().max(1) * size_of::<T>() - 1);
    let chunk_last = start + (LANES * size_of::<T>() - 1);
    last / PAGE == chunk_last / PAGE
}

/// The block column moves of [`Vector`] one column at a time, through its
/// column methods: the moves of every vector type, and of the blocks a type
/// has no faster move for.
pub(crate) mod column_by_column {
    use super::{Vector, LANES};

    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn load_f32<V: Vector>(rows: &[f32], d: usize, columns: &mut [V; LANES]) {
        for (j, column) in columns.iter_mut().enumerate().take(d) {
            *column = V::load_column_f32(rows, j, d);
        }
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn load_f64<V: Vector>(rows: &[f64], d: usize, columns: &mut [V; LANES]) {
        for (j, column) in columns.iter_mut().enumerate().take(d) {
            *column = V::load_column_f64(rows, j, d);
        }
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn store_f32<V: Vector>(columns: &[V; LANES], rows: &mut [f32], d: usize) {
        for (j, column) in columns.iter().enumerate().take(d) {
            column.store_column_f32(rows, j, d);
        }
    }

    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn store_f64<V: Vector>(columns: &[V; LANES], rows: &mut [f64], d: usize) {
        for (j, column) in columns.iter().enumerate().take(d) {
            column.store_column_f64(rows, j, d);
        }
    }
}

/// `dst[j · dst_lead + i] = src[i · src_lead + j]` for the `lines` `i` and
/// `elements` `j` given, one element at a time: the transposing copies of
/// every vector type without a faster one, and the edges of larger ones.
/// The side whose lines lie further apart is walked line by line, so that
/// each of its lines is read or written in one run.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(crate) fn transpose_elements<T: Copy>(
    src: &[T],
    src_lead: usize,
    dst: &mut [T],
    dst_lead: usize,
    lines: Range<usize>,
    elements: Range<usize>,
) {
    if lines.is_empty() || elements.is_empty() {
        return;
    }
    if dst_lead > src_lead {
        for j in elements {
            let line = &mut dst[j * dst_lead..];
            for i in lines.clone() {
                line[i] = src[i * src_lead + j];
            }
        }
    } else {
        for i in lines {
            let line = &src[i * src_lead..];
            for j in elements.clone() {
                dst[j * dst_lead + i] = line[j];
            }
        }
    }
}

/// `rows[l · d + j]` widened in lane `l` (zero past the end of `rows`): the
/// column loads of every vector type without a faster one.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(crate) fn column_lanes<A: KernelScalar>(rows: &[A], j: usize, d: usize) -> Lanes {
    let mut lanes = [0.0; LANES];
    for (l, lane) in lanes.iter_mut().enumerate() {
        if let Some(&x) = rows.get(l * d + j) {
            *lane = x.widen();
        }
    }
    lanes
}

/// Stores lane `l`, rounded once, as `rows[l · d + j]` (dropped past the end
/// of `rows`): the column stores of every vector type without a faster one.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(crate) fn store_column_lanes<A: KernelScalar>(
    lanes: Lanes,
    rows: &mut [A],
    j: usize,
    d: usize,
) {
    for (l, value) in lanes.into_iter().enumerate() {
        if let Some(y) = rows.get_mut(l * d + j) {
            *y = A::narrow(value);
        }
    }
}

/// The portable vector: a plain array, one scalar operation per lane.
#[derive(Clone, Copy)]
pub(crate) struct Portable(Lanes);

impl Add for Portable {
    type Output = Self;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn add(self, other: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l] + other.0[l]))
    }
}

impl Sub for Portable {
    type Output = Self;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn sub(self, other: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l] - other.0[l]))
    }
}

impl Mul for Portable {
    type Output = Self;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn mul(self, other: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l] * other.0[l]))
    }
}

impl Div for Portable {
    type Output = Self;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn div(self, other: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l] / other.0[l]))
    }
}

impl Arith for Portable {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn splat(value: f64) -> Self {
        Portable([value; LANES])
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn min_select(self, other: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l].min_select(other.0[l])))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn max_select(self, other: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l].max_select(other.0[l])))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn abs(self) -> Self {
        Portable(self.0.map(f64::abs))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn sqrt(self) -> Self {
        Portable(self.0.map(f64::sqrt))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn mul_add(self, a: Self, b: Self) -> Self {
        Portable(std::array::from_fn(|l| self.0[l].mul_add(a.0[l], b.0[l])))
    }
}

impl Vector for Portable {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn to_lanes(self) -> Lanes {
        self.0
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn from_lanes(lanes: &Lanes) -> Self {
        Portable(*lanes)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_f64(chunk: &[f64; LANES]) -> Self {
        Portable(*chunk)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn load_f32(chunk: &[f32; LANES]) -> Self {
        Portable(std::array::from_fn(|l| f64::from(chunk[l])))
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store_f64(self, chunk: &mut [f64; LANES]) {
        *chunk = self.0;
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn store_f32(self, chunk: &mut [f32; LANES]) {
        for (out, value) in chunk.iter_mut().zip(self.0) {
            *out = value as f32;
        }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn lanes_from(self, width: usize) -> Self {
        let mut lanes = self.0;
        lanes.copy_within(width..2 * width, 0);
        Portable(lanes)
    }
    type Part = Self;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn part_splat(value: f64) -> Self {
        Self::splat(value)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn min_into(self, part: Self) -> Self {
        part.min_select(self)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn max_into(self, part: Self) -> Self {
        part.max_select(self)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn part_min(part: Self) -> f64 {
        least_lane(part, LANES)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn part_max(part: Self) -> f64 {
        greatest_lane(part, LANES)
    }
}

/// The least of lanes `0 .. width` of `vector` (`width` a power of two), by
/// halving steps as in the lane trees ([`Vector::lanes_from`]) rather than a
/// chain of `width - 1`: the reduction of a [`Vector::Part`].
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn least_lane<V: Vector>(mut vector: V, width: usize) -> f64 {
    let mut step = width / 2;
    while step >= 1 {
        vector = vector.min_select(vector.lanes_from(step));
        step /= 2;
    }
    vector.first_lane()
}

/// The greatest of lanes `0 .. width` of `vector`, as [`least_lane`].
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn greatest_lane<V: Vector>(mut vector: V, width: usize) -> f64 {
    let mut step = width / 2;
    while step >= 1 {
        vector = vector.max_select(vector.lanes_from(step));
        step /= 2;
    }
    vector.first_lane()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_that_reach_into_another_page_are_told_apart() {
        let buffer = vec![0.0f64; 2 * PAGE / size_of::<f64>()];
        let base = buffer.as_ptr() as usize;
        // A page boundary with at least a chunk of the buffer on each side.
        let boundary = ((base + LANES * size_of::<f64>()) / PAGE + 1) * PAGE;
        let at = (boundary - base) / size_of::<f64>();
        // Tails that end before the boundary: only a chunk that ends there
        // stays on its page.
        assert!(chunk_stays_in_page(&buffer[at - LANES..at - 1]));
        assert!(!chunk_stays_in_page(&buffer[at - LANES + 1..at - 1]));
        assert!(!chunk_stays_in_page(&buffer[at - 3..at]));
        assert!(!chunk_stays_in_page(&buffer[at - 1..at - 1]));
        // Tails that reach past it: the chunk ends on the last element's page.
        assert!(chunk_stays_in_page(&buffer[at - 2..at + 2]));
        assert!(chunk_stays_in_page(&buffer[at..at + 1]));
        assert!(chunk_stays_in_page(&buffer[at..at]));
    }
}
