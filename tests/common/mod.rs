//! Helpers shared by the integration tests: the element types under test,
//! proptest strategies for rows of `f32`/`f64`, the same logical array in
//! many memory layouts, and bit-level comparisons.
//!
//! Every test file includes this module and uses only part of it.
#![allow(dead_code)]

use std::ops::RangeInclusive;

use ndarray::{
    Array, Array1, Array2, Array3, ArrayD, ArrayView, ArrayViewMut, Axis, Dimension, IxDyn,
    ShapeBuilder, Slice,
};
use ndarray_layernorm::prelude::*;
use proptest::prelude::*;

pub mod training;

/// Lengths of the last axis drawn by the strategies.
pub const DIM: RangeInclusive<usize> = 1..=64;

/// Numbers of rows drawn by the strategies.
pub const ROWS: RangeInclusive<usize> = 1..=6;

/// Written where a method must not write: odd columns of the stepped
/// layout and the initial contents of `_into` outputs.
pub const JUNK: f64 = -999.125;

/// The element types under test, with what the tests need to know about
/// them. `f32` values are built by rounding `f64` values.
pub trait TestFloat: NormScalar {
    /// The name printed in failure messages.
    const NAME: &'static str;
    /// Unit roundoff: half the distance from 1 to the next value (2⁻²⁴, 2⁻⁵³).
    const UNIT: f64;
    /// Common offsets of the "large offset" rows: big next to the noise in
    /// [-1, 1] but with ulps well below it.
    const OFFSETS: &'static [f64];
    /// A finite value whose square overflows this type.
    const HUGE: f64;
    /// Rounds an `f64` to this type (exact for `f64`).
    fn from_wide(v: f64) -> Self;
    /// Converts to `f64`, exactly.
    fn wide(self) -> f64;
    /// The IEEE bits, widened to `u64`.
    fn bits(self) -> u64;
    /// The bits as an integer that is monotonic in the value, with
    /// `-0.0` and `+0.0` both mapped to 0 (consecutive floats differ by 1).
    fn ordered(self) -> i64;
}

impl TestFloat for f32 {
    const NAME: &'static str = "f32";
    const UNIT: f64 = 1.0 / (1u64 << 24) as f64;
    const OFFSETS: &'static [f64] = &[1e3, -1e4, 2.5e5];
    const HUGE: f64 = 1e30;
    fn from_wide(v: f64) -> Self {
        v as f32
    }
    fn wide(self) -> f64 {
        f64::from(self)
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
    fn ordered(self) -> i64 {
        let magnitude = i64::from(self.to_bits() & 0x7fff_ffff);
        if self.is_sign_negative() {
            -magnitude
        } else {
            magnitude
        }
    }
}

impl TestFloat for f64 {
    const NAME: &'static str = "f64";
    const UNIT: f64 = 1.0 / (1u64 << 53) as f64;
    const OFFSETS: &'static [f64] = &[1e6, -1e9, 3e12];
    const HUGE: f64 = 1e200;
    fn from_wide(v: f64) -> Self {
        v
    }
    fn wide(self) -> f64 {
        self
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
    fn ordered(self) -> i64 {
        // The magnitude bits fit in 63 bits, so the cast is lossless.
        let magnitude = (self.to_bits() & 0x7fff_ffff_ffff_ffff) as i64;
        if self.is_sign_negative() {
            -magnitude
        } else {
            magnitude
        }
    }
}

/// Distance in units in the last place between `a` and `b`, from their
/// bits (`u64::MAX` if either is NaN; `-0.0` and `+0.0` are 0 apart).
pub fn ulps<A: TestFloat>(a: A, b: A) -> u64 {
    if a.is_nan() || b.is_nan() {
        return u64::MAX;
    }
    a.ordered().abs_diff(b.ordered())
}

/// The bits of every element, in logical order.
pub fn bits<'a, A: TestFloat + 'a>(values: impl IntoIterator<Item = &'a A>) -> Vec<u64> {
    values.into_iter().map(|&v| v.bits()).collect()
}

/// Every element widened to `f64`, in logical order.
pub fn wide<'a, A: TestFloat + 'a>(values: impl IntoIterator<Item = &'a A>) -> Vec<f64> {
    values.into_iter().map(|&v| v.wide()).collect()
}

/// Mean and population variance by a two-pass sum in `f64`, after
/// subtracting the first element (exact for rows near a common offset), so
/// that a large offset does not spoil the variance.
pub fn two_pass(x: &[f64]) -> (f64, f64) {
    let d = x.len() as f64;
    let origin = x[0];
    let shifted_mean = x.iter().map(|&v| v - origin).sum::<f64>() / d;
    let var = x
        .iter()
        .map(|&v| {
            let e = (v - origin) - shifted_mean;
            e * e
        })
        .sum::<f64>()
        / d;
    (origin + shifted_mean, var)
}

/// Mean of the squares, summed in `f64`.
pub fn mean_square(x: &[f64]) -> f64 {
    x.iter().map(|&v| v * v).sum::<f64>() / x.len() as f64
}

/// Kinds of values in a generated row.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// Uniform in [-10, 10].
    Moderate,
    /// One of [`TestFloat::OFFSETS`] plus noise uniform in [-1, 1].
    Offset,
    /// Random sign times a magnitude from 1e-3 to 1e4.
    Mixed,
}

pub fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![Just(Kind::Moderate), Just(Kind::Offset), Just(Kind::Mixed)]
}

/// `n` values of one kind, rounded to `A`.
pub fn values<A: TestFloat>(kind: Kind, n: usize) -> BoxedStrategy<Vec<A>> {
    let wide = match kind {
        Kind::Moderate => prop::collection::vec(-10.0..=10.0_f64, n).boxed(),
        Kind::Offset => (
            prop::sample::select(A::OFFSETS),
            prop::collection::vec(-1.0..=1.0_f64, n),
        )
            .prop_map(|(offset, noise)| noise.into_iter().map(|e| offset + e).collect())
            .boxed(),
        Kind::Mixed => prop::collection::vec((any::<bool>(), 1.0..10.0_f64, -3i32..=3), n)
            .prop_map(|v| {
                v.into_iter()
                    .map(|(negative, m, e)| {
                        let v = m * 10f64.powi(e);
                        if negative {
                            -v
                        } else {
                            v
                        }
                    })
                    .collect()
            })
            .boxed(),
    };
    wide.prop_map(|v| v.into_iter().map(A::from_wide).collect())
        .boxed()
}

/// An array of shape `(rows, d)`, `rows` in [`ROWS`], `d` in [`DIM`], every
/// row of one kind.
pub fn rows<A: TestFloat>() -> impl Strategy<Value = Array2<A>> {
    (ROWS, DIM, kind()).prop_flat_map(|(r, d, kind)| {
        values::<A>(kind, r * d)
            .prop_map(move |v| Array2::from_shape_vec((r, d), v).expect("r * d values"))
    })
}

/// `f64` rows for [`rows`].
pub fn rows_f64() -> impl Strategy<Value = Array2<f64>> {
    rows::<f64>()
}

/// `f32` rows for [`rows`].
pub fn rows_f32() -> impl Strategy<Value = Array2<f32>> {
    rows::<f32>()
}

/// An array of shape `(rows, d)` whose rows are all equal (so it is also a
/// broadcast of one row).
pub fn repeated_rows<A: TestFloat>() -> impl Strategy<Value = Array2<A>> {
    (ROWS, DIM, kind()).prop_flat_map(|(r, d, kind)| {
        values::<A>(kind, d).prop_map(move |row| {
            Array1::from_vec(row)
                .broadcast((r, d))
                .expect("a row broadcasts to (r, d)")
                .to_owned()
        })
    })
}

/// A per-feature vector (`gamma` or `beta`) of length `d`, with values in
/// [-3, 3] and some exact zeros of both signs.
pub fn feature_vector<A: TestFloat>(d: usize) -> impl Strategy<Value = Array1<A>> {
    prop::collection::vec(
        prop_oneof![
            6 => -3.0..=3.0_f64,
            1 => Just(0.0),
            1 => Just(-0.0),
        ],
        d,
    )
    .prop_map(|v| v.into_iter().map(A::from_wide).collect())
}

/// Valid values of `eps`, from 0 to large.
pub fn eps<A: TestFloat>() -> impl Strategy<Value = A> {
    prop::sample::select(&[0.0, 1e-12, 1e-5, 1e-2, 1.0, 100.0][..]).prop_map(A::from_wide)
}

/// The same logical array in several memory layouts, all of dimension `D`.
///
/// `views` yields, always, C order, Fortran order, a stepped slice of an
/// array with twice as many columns (`s![.., ..;2]` along the last axis),
/// the first half of the columns of such an array (`s![.., ..d]`: each row
/// contiguous, with a gap after it), every other index of the first axis
/// (`s![..;2, ..]`: rows contiguous, and in 3-D each panel too) and a view
/// with every axis reversed (negative strides) of a reversed copy; and when
/// every row is equal, also a broadcast view of that one row.
pub struct Layouts<A, D: Dimension> {
    c: Array<A, D>,
    f: Array<A, D>,
    wide: Array<A, D>,
    apart: Array<A, D>,
    alternate: Array<A, D>,
    reversed: Array<A, D>,
    row: Option<Array1<A>>,
}

impl<A: TestFloat, D: Dimension> Layouts<A, D> {
    /// The layouts of `a` (any layout).
    pub fn new(a: &Array<A, D>) -> Self {
        let dim = a.raw_dim();
        let junk = A::from_wide(JUNK);
        let c = Array::from_shape_vec(dim.clone(), a.iter().copied().collect())
            .expect("as many values as elements");
        let mut f = Array::from_elem(dim.clone().f(), junk);
        f.assign(a);

        let last = Axis(a.ndim() - 1);
        let mut wide_dim = dim.clone();
        wide_dim[last.index()] *= 2;
        let mut wide = Array::from_elem(wide_dim, junk);
        wide.slice_axis_mut(last, Slice::new(0, None, 2)).assign(a);
        let mut apart = Array::from_elem(wide.raw_dim(), junk);
        apart.slice_axis_mut(last, first_half(a, last)).assign(a);

        let mut tall_dim = dim.clone();
        tall_dim[0] *= 2;
        let mut alternate = Array::from_elem(tall_dim, junk);
        alternate
            .slice_axis_mut(Axis(0), Slice::new(0, None, 2))
            .assign(a);

        let mut flipped = a.view();
        for axis in 0..a.ndim() {
            flipped.invert_axis(Axis(axis));
        }
        let reversed = Array::from_shape_vec(dim, flipped.iter().copied().collect())
            .expect("as many values as elements");

        let row = a
            .rows()
            .into_iter()
            .next()
            .filter(|first| a.rows().into_iter().all(|r| bits(r) == bits(first)))
            .map(|first| first.to_owned());

        Layouts {
            c,
            f,
            wide,
            apart,
            alternate,
            reversed,
            row,
        }
    }

    /// The array in standard (C) layout.
    pub fn standard(&self) -> &Array<A, D> {
        &self.c
    }

    fn stepped(&self) -> ArrayView<'_, A, D> {
        let last = Axis(self.c.ndim() - 1);
        self.wide.slice_axis(last, Slice::new(0, None, 2))
    }

    fn rows_apart(&self) -> ArrayView<'_, A, D> {
        let last = Axis(self.c.ndim() - 1);
        self.apart.slice_axis(last, first_half(&self.c, last))
    }

    fn every_other(&self) -> ArrayView<'_, A, D> {
        self.alternate.slice_axis(Axis(0), Slice::new(0, None, 2))
    }

    fn negative(&self) -> ArrayView<'_, A, D> {
        let mut v = self.reversed.view();
        for axis in 0..v.ndim() {
            v.invert_axis(Axis(axis));
        }
        v
    }

    /// Read-only views of every layout, each with the logical values of
    /// the array it was built from.
    pub fn views(&self) -> Vec<(&'static str, ArrayView<'_, A, D>)> {
        let mut views = vec![
            ("C order", self.c.view()),
            ("Fortran order", self.f.view()),
            ("stepped slice", self.stepped()),
            ("rows apart", self.rows_apart()),
            ("every other row", self.every_other()),
            ("negative strides", self.negative()),
        ];
        if let Some(row) = &self.row {
            let b = row
                .broadcast(self.c.raw_dim())
                .expect("every row equals `row`");
            views.push(("broadcast", b));
        }
        views
    }

    /// True when the array has a broadcast layout (all rows equal).
    pub fn has_broadcast(&self) -> bool {
        self.row.is_some()
    }

    /// Mutable views of every layout that can be written (all but the
    /// broadcast), each with the logical values of the original array.
    pub fn views_mut(&mut self) -> Vec<(&'static str, ArrayViewMut<'_, A, D>)> {
        let last = Axis(self.c.ndim() - 1);
        let mut negative = self.reversed.view_mut();
        for axis in 0..negative.ndim() {
            negative.invert_axis(Axis(axis));
        }
        let half = first_half(&self.c, last);
        vec![
            ("C order", self.c.view_mut()),
            ("Fortran order", self.f.view_mut()),
            (
                "stepped slice",
                self.wide.slice_axis_mut(last, Slice::new(0, None, 2)),
            ),
            ("rows apart", self.apart.slice_axis_mut(last, half)),
            (
                "every other row",
                self.alternate
                    .slice_axis_mut(Axis(0), Slice::new(0, None, 2)),
            ),
            ("negative strides", negative),
        ]
    }

    /// True when the positions of the backing arrays outside the strided
    /// layouts (the odd positions along the last axis of the stepped one,
    /// the second half of the columns behind the rows apart, the odd
    /// indices of the first axis behind every other row) still hold
    /// [`JUNK`].
    pub fn junk_intact(&self) -> bool {
        let last = Axis(self.c.ndim() - 1);
        let junk = A::from_wide(JUNK).bits();
        let len = self.c.len_of(last) as isize;
        let untouched = [
            self.wide.slice_axis(last, Slice::new(1, None, 2)),
            self.apart.slice_axis(last, Slice::new(len, None, 1)),
            self.alternate.slice_axis(Axis(0), Slice::new(1, None, 2)),
        ];
        untouched
            .iter()
            .all(|view| view.iter().all(|v| v.bits() == junk))
    }
}

/// The first `a.len_of(axis)` indices of an axis twice as long.
fn first_half<A, D: Dimension>(a: &Array<A, D>, axis: Axis) -> Slice {
    Slice::new(0, Some(a.len_of(axis) as isize), 1)
}

/// Arrays of shape `dim` in several layouts, filled with [`JUNK`], to
/// receive the output of an `_into` method.
pub fn outputs<A: TestFloat, D: Dimension>(dim: D) -> Layouts<A, D> {
    Layouts::new(&Array::from_elem(dim, A::from_wide(JUNK)))
}

/// The same logical array as `a` in every layout of [`Layouts`], as 2-D
/// arrays, as 3-D arrays (`(2, rows / 2, d)` for an even number of rows,
/// `(rows, 1, d)` otherwise) and as `IxDyn` arrays of shape `[1, rows, d]`.
pub struct AllLayouts<A> {
    pub d2: Layouts<A, ndarray::Ix2>,
    pub d3: Layouts<A, ndarray::Ix3>,
    pub dyn_: Layouts<A, IxDyn>,
}

/// See [`AllLayouts`].
pub fn layouts<A: TestFloat>(a: &Array2<A>) -> AllLayouts<A> {
    let (r, d) = a.dim();
    let shape3 = if r % 2 == 0 { (2, r / 2, d) } else { (r, 1, d) };
    let values: Vec<A> = a.iter().copied().collect();
    let a3 = Array3::from_shape_vec(shape3, values.clone()).expect("r * d values");
    let ad = ArrayD::from_shape_vec(IxDyn(&[1, r, d]), values).expect("r * d values");
    AllLayouts {
        d2: Layouts::new(a),
        d3: Layouts::new(&a3),
        dyn_: Layouts::new(&ad),
    }
}
