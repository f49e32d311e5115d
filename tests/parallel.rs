//! The parallel row walk: every method gives the same bits on one thread and
//! on two, in every layout, for arrays large enough to be split into
//! parallel tasks; and each row's result is the one the same row gives on
//! its own (a one-row contiguous call, which never leaves the calling
//! thread).

#![cfg(feature = "rayon")]

use std::sync::OnceLock;

use ndarray::{s, Array, Array1, Array2, Array3, ArrayViewMut, Dimension, RemoveAxis};
use ndarray::{ArrayView, ShapeBuilder};
use ndarray_layernorm::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};

/// A value no output reaches: marks the storage an operation must not touch.
const SENTINEL: f64 = 12345.0;

fn pool(threads: usize) -> &'static ThreadPool {
    static POOLS: OnceLock<(ThreadPool, ThreadPool)> = OnceLock::new();
    let pools = POOLS.get_or_init(|| {
        let build = |n| ThreadPoolBuilder::new().num_threads(n).build().unwrap();
        (build(1), build(2))
    });
    match threads {
        1 => &pools.0,
        _ => &pools.1,
    }
}

/// Deterministic rows of varied offset and spread.
fn data<A: NormScalar, D: Dimension>(shape: D) -> Array<A, D> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let d = shape.slice().last().copied().unwrap_or(1);
    let mut i = 0usize;
    Array::from_shape_simple_fn(shape, || {
        let row = i / d;
        i += 1;
        let offset = [0.0, 3.0, -1e3, 1e5][row % 4];
        let scale = [1.0, 1e-2, 10.0][row % 3];
        A::narrow(offset + scale * next())
    })
}

fn bits<'a, A: NormScalar>(values: impl IntoIterator<Item = &'a A>) -> Vec<u64> {
    values.into_iter().map(|v| v.widen().to_bits()).collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    LayerNorm,
    LayerNormPlain,
    LayerNormInto,
    LayerNormPlainInto,
    LayerNormInplace,
    LayerNormPlainInplace,
    RmsNorm,
    RmsNormPlain,
    RmsNormInto,
    RmsNormPlainInto,
    RmsNormInplace,
    RmsNormPlainInplace,
    Stats,
}

const OPS: [Op; 13] = [
    Op::LayerNorm,
    Op::LayerNormPlain,
    Op::LayerNormInto,
    Op::LayerNormPlainInto,
    Op::LayerNormInplace,
    Op::LayerNormPlainInplace,
    Op::RmsNorm,
    Op::RmsNormPlain,
    Op::RmsNormInto,
    Op::RmsNormPlainInto,
    Op::RmsNormInplace,
    Op::RmsNormPlainInplace,
    Op::Stats,
];

impl Op {
    fn in_place(self) -> bool {
        matches!(
            self,
            Op::LayerNormInplace
                | Op::LayerNormPlainInplace
                | Op::RmsNormInplace
                | Op::RmsNormPlainInplace
        )
    }
}

/// `gamma` and `beta` for rows of length `d`.
fn affine<A: NormScalar>(d: usize) -> (Array1<A>, Array1<A>) {
    let gamma = Array1::from_shape_fn(d, |i| A::narrow(0.5 + (i % 7) as f64 / 4.0));
    let beta = Array1::from_shape_fn(d, |i| A::narrow((i % 5) as f64 / 8.0 - 0.25));
    (gamma, beta)
}

/// Runs `op` on `x` (in place for the `_inplace` forms) and returns the bits
/// of its outputs, each in logical order.
fn run<A: NormScalar, D: RemoveAxis>(op: Op, mut x: ArrayViewMut<'_, A, D>) -> Vec<Vec<u64>> {
    let d = x.shape().last().copied().unwrap();
    let (gamma, beta) = affine::<A>(d);
    let eps = A::narrow(1e-5);
    let mut out = Array::zeros(x.raw_dim());
    let y = match op {
        Op::LayerNorm => x.layer_norm(&gamma, &beta, eps).unwrap(),
        Op::LayerNormPlain => x.layer_norm_plain(eps).unwrap(),
        Op::LayerNormInto => {
            x.layer_norm_into(&mut out, &gamma, &beta, eps).unwrap();
            out
        }
        Op::LayerNormPlainInto => {
            x.layer_norm_plain_into(&mut out, eps).unwrap();
            out
        }
        Op::LayerNormInplace => {
            x.layer_norm_inplace(&gamma, &beta, eps).unwrap();
            x.to_owned()
        }
        Op::LayerNormPlainInplace => {
            x.layer_norm_plain_inplace(eps).unwrap();
            x.to_owned()
        }
        Op::RmsNorm => x.rms_norm(&gamma, eps).unwrap(),
        Op::RmsNormPlain => x.rms_norm_plain(eps).unwrap(),
        Op::RmsNormInto => {
            x.rms_norm_into(&mut out, &gamma, eps).unwrap();
            out
        }
        Op::RmsNormPlainInto => {
            x.rms_norm_plain_into(&mut out, eps).unwrap();
            out
        }
        Op::RmsNormInplace => {
            x.rms_norm_inplace(&gamma, eps).unwrap();
            x.to_owned()
        }
        Op::RmsNormPlainInplace => {
            x.rms_norm_plain_inplace(eps).unwrap();
            x.to_owned()
        }
        Op::Stats => {
            let (mean, rms) = x.stats().unwrap();
            return vec![bits(&mean), bits(&rms)];
        }
    };
    vec![bits(&y)]
}

/// The outputs of `op` computed one row at a time, each row a contiguous
/// one-row array of its own, concatenated in logical order.
fn per_row<A: NormScalar, D: RemoveAxis>(op: Op, x: &Array<A, D>) -> Vec<Vec<u64>> {
    let mut outputs: Vec<Vec<u64>> = Vec::new();
    for row in x.rows() {
        let mut row: Array1<A> = row.to_owned();
        let results = run(op, row.view_mut());
        outputs.resize(results.len(), Vec::new());
        for (all, one) in outputs.iter_mut().zip(results) {
            all.extend(one);
        }
    }
    outputs
}

/// How the logical `n × d` array is laid out in memory.
#[derive(Clone, Copy, Debug)]
enum Layout {
    C,
    Fortran,
    /// Every other column of a C-order `n × 2d` array.
    StepCols,
    /// Every other column of a Fortran-order `n × 2d` array.
    FortranStepCols,
    /// Columns reversed (stride -1 along the rows).
    RevCols,
    /// Rows in reverse order (contiguous rows, negative row stride).
    RevRows,
    /// Fortran order with reversed columns.
    FortranRevCols,
}

/// The layouts every method is checked in (tests/rows.rs covers more
/// combinations on one thread).
const LAYOUTS: [Layout; 5] = [
    Layout::C,
    Layout::Fortran,
    Layout::StepCols,
    Layout::RevCols,
    Layout::RevRows,
];

/// The layouts the outputs of `_into` are checked in.
const OUTPUT_LAYOUTS: [Layout; 7] = [
    Layout::C,
    Layout::Fortran,
    Layout::StepCols,
    Layout::FortranStepCols,
    Layout::RevCols,
    Layout::RevRows,
    Layout::FortranRevCols,
];

/// Storage filled with [`SENTINEL`] plus the slice of it that is the view.
struct Placed<A> {
    storage: Array2<A>,
    layout: Layout,
}

impl<A: NormScalar> Placed<A> {
    fn new(a: &Array2<A>, layout: Layout) -> Self {
        let (n, d) = a.dim();
        let sentinel = A::narrow(SENTINEL);
        let storage = match layout {
            Layout::C | Layout::RevCols | Layout::RevRows => Array2::from_elem((n, d), sentinel),
            Layout::Fortran | Layout::FortranRevCols => Array2::from_elem((n, d).f(), sentinel),
            Layout::StepCols => Array2::from_elem((n, 2 * d), sentinel),
            Layout::FortranStepCols => Array2::from_elem((n, 2 * d).f(), sentinel),
        };
        let mut placed = Placed { storage, layout };
        placed.view_mut().assign(a);
        placed
    }

    fn view_mut(&mut self) -> ArrayViewMut<'_, A, ndarray::Ix2> {
        match self.layout {
            Layout::C | Layout::Fortran => self.storage.view_mut(),
            Layout::StepCols | Layout::FortranStepCols => self.storage.slice_mut(s![.., ..;2]),
            Layout::RevCols | Layout::FortranRevCols => self.storage.slice_mut(s![.., ..;-1]),
            Layout::RevRows => self.storage.slice_mut(s![..;-1, ..]),
        }
    }

    /// Storage elements outside the view that no longer hold the sentinel.
    fn touched_gaps(&self) -> usize {
        let sentinel = A::narrow(SENTINEL);
        let (n, d2) = self.storage.dim();
        match self.layout {
            Layout::StepCols | Layout::FortranStepCols => {
                let gaps = self.storage.slice(s![.., 1..;2]);
                assert_eq!(gaps.len(), n * d2 / 2);
                gaps.iter().filter(|&&v| v != sentinel).count()
            }
            _ => 0,
        }
    }
}

/// Checks every method on `a` in every layout, at one and two threads,
/// against the row-by-row results.
fn check_all_layouts<A: NormScalar>(a: &Array2<A>) {
    for op in OPS {
        let expected = per_row(op, a);
        for layout in LAYOUTS {
            for threads in [1, 2] {
                let mut placed = Placed::new(a, layout);
                let got = pool(threads).install(|| run(op, placed.view_mut()));
                assert!(
                    got == expected,
                    "{op:?}, {layout:?}, {threads} thread(s), shape {:?}",
                    a.dim()
                );
                assert_eq!(placed.touched_gaps(), 0, "{op:?}, {layout:?}");
            }
        }
        if !op.in_place() {
            // A broadcast view: every row is the first one.
            let first = a.row(0);
            let view = first.broadcast(a.dim()).unwrap();
            let expected = per_row(op, &view.to_owned());
            for threads in [1, 2] {
                let got = pool(threads).install(|| run_view(op, view));
                assert!(got == expected, "{op:?}, broadcast, {threads} thread(s)");
            }
        }
    }
}

/// [`run`] for a read-only view (the broadcast case).
fn run_view<A: NormScalar>(op: Op, x: ArrayView<'_, A, ndarray::Ix2>) -> Vec<Vec<u64>> {
    let d = x.ncols();
    let (gamma, beta) = affine::<A>(d);
    let eps = A::narrow(1e-5);
    let mut out = Array2::zeros(x.raw_dim());
    let y = match op {
        Op::LayerNorm => x.layer_norm(&gamma, &beta, eps).unwrap(),
        Op::LayerNormPlain => x.layer_norm_plain(eps).unwrap(),
        Op::LayerNormInto => {
            x.layer_norm_into(&mut out, &gamma, &beta, eps).unwrap();
            out
        }
        Op::LayerNormPlainInto => {
            x.layer_norm_plain_into(&mut out, eps).unwrap();
            out
        }
        Op::RmsNorm => x.rms_norm(&gamma, eps).unwrap(),
        Op::RmsNormPlain => x.rms_norm_plain(eps).unwrap(),
        Op::RmsNormInto => {
            x.rms_norm_into(&mut out, &gamma, eps).unwrap();
            out
        }
        Op::RmsNormPlainInto => {
            x.rms_norm_plain_into(&mut out, eps).unwrap();
            out
        }
        Op::Stats => {
            let (mean, rms) = x.stats().unwrap();
            return vec![bits(&mean), bits(&rms)];
        }
        _ => unreachable!("in-place forms need a mutable array"),
    };
    vec![bits(&y)]
}

// Shapes with more elements than the parallel threshold (131 072), row counts
// that are not multiples of the gather block, and rows from tiny to long.

#[test]
fn medium_rows_f64() {
    check_all_layouts(&data::<f64, _>(ndarray::Ix2(2003, 67)));
}

#[test]
fn medium_rows_f32() {
    check_all_layouts(&data::<f32, _>(ndarray::Ix2(2003, 67)));
}

#[test]
fn long_rows_f64() {
    check_all_layouts(&data::<f64, _>(ndarray::Ix2(53, 2500)));
}

#[test]
fn long_rows_f32() {
    check_all_layouts(&data::<f32, _>(ndarray::Ix2(53, 2500)));
}

#[test]
fn tiny_rows_f32() {
    check_all_layouts(&data::<f32, _>(ndarray::Ix2(26_215, 5)));
}

#[test]
fn tiny_rows_f64() {
    check_all_layouts(&data::<f64, _>(ndarray::Ix2(16_411, 8)));
}

#[test]
fn one_long_strided_row() {
    // One row cannot be split: it stays one task however many threads run.
    check_all_layouts(&data::<f64, _>(ndarray::Ix2(1, 140_001)));
}

/// A 3-D array in the layouts of a permuted (batch, seq, d) tensor.
#[test]
fn three_dimensional_layouts() {
    let a: Array3<f32> = data(ndarray::Ix3(29, 61, 77));
    for op in OPS {
        let expected = per_row(op, &a);
        // (axes of the storage, permutation giving back the logical axes)
        for perm in [[0, 1, 2], [1, 0, 2], [2, 1, 0], [1, 2, 0], [2, 0, 1]] {
            let (p, q, r) = (a.shape()[perm[0]], a.shape()[perm[1]], a.shape()[perm[2]]);
            let mut storage = Array3::<f32>::zeros((p, q, r));
            let mut inverse = [0; 3];
            for (k, &axis) in perm.iter().enumerate() {
                inverse[axis] = k;
            }
            storage.view_mut().permuted_axes(inverse).assign(&a);
            for threads in [1, 2] {
                let mut copy = storage.clone();
                let view = copy.view_mut().permuted_axes(inverse);
                assert_eq!(view.shape(), a.shape());
                let got = pool(threads).install(|| run(op, view));
                assert!(
                    got == expected,
                    "{op:?}, storage axes {perm:?}, {threads} thread(s)"
                );
            }
        }
    }
}

/// `_into` writes outputs of every layout correctly, and touches nothing
/// between the elements of a stepped output.
#[test]
fn strided_outputs_of_into() {
    let a: Array2<f64> = data(ndarray::Ix2(2003, 67));
    let (gamma, beta) = affine::<f64>(67);
    let expected_ln = per_row(Op::LayerNormInto, &a);
    let expected_rms = per_row(Op::RmsNormPlainInto, &a);
    for input in [Layout::C, Layout::Fortran, Layout::StepCols] {
        let mut x = Placed::new(&a, input);
        for output in OUTPUT_LAYOUTS {
            for threads in [1, 2] {
                let mut out = Placed::new(&Array2::zeros(a.dim()), output);
                pool(threads).install(|| {
                    x.view_mut()
                        .layer_norm_into(&mut out.view_mut(), &gamma, &beta, 1e-5)
                        .unwrap()
                });
                let what = format!("{input:?} into {output:?}, {threads} thread(s)");
                assert!(vec![bits(&out.view_mut())] == expected_ln, "{what}");
                assert_eq!(out.touched_gaps(), 0, "{what}");

                let mut out = Placed::new(&Array2::zeros(a.dim()), output);
                pool(threads).install(|| {
                    x.view_mut()
                        .rms_norm_plain_into(&mut out.view_mut(), 1e-5)
                        .unwrap()
                });
                assert!(vec![bits(&out.view_mut())] == expected_rms, "{what}");
                assert_eq!(out.touched_gaps(), 0, "{what}");
            }
        }
    }
}
