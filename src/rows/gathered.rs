//! The row walk for rows over several axes that no single stride reaches
//! in logical order: the `_over` forms on Fortran order, permuted axes or a
//! view sliced inside the normalised axes.
//!
//! Each block of rows is gathered into a buffer in logical order, a lane
//! of the last axis at a time ([`RowBlocks`]), handed to the kernel, and
//! (for outputs not in standard layout) scattered back. Rows whose axes
//! merge into one stride never come here: they take the strided walk as
//! rows along one axis ([`super::merged_rows`]).

use ndarray::{ArrayView, ArrayViewMut, IxDyn};

use super::strided::{RowKernel, RowReduction};
use crate::blocks::{RowBlocks, RowBlocksMut};
use crate::kernel::Io;
use crate::scalar::NormScalar;

/// The gathered walks of the element type `A`, compiled here once per
/// type, as the strided walks are.
#[allow(private_interfaces)]
pub trait GatheredWalks<A> {
    /// [`map`] for `A`.
    fn map_gathered(
        x: ArrayView<'_, A, IxDyn>,
        out: ArrayViewMut<'_, A, IxDyn>,
        d: usize,
        kernel: &RowKernel<'_, A>,
    );
    /// [`map_in_place`] for `A`.
    fn map_gathered_in_place(x: ArrayViewMut<'_, A, IxDyn>, d: usize, kernel: &RowKernel<'_, A>);
    /// [`reduce`] for `A`.
    fn reduce_gathered(
        x: ArrayView<'_, A, IxDyn>,
        d: usize,
        first: ArrayViewMut<'_, A, IxDyn>,
        second: ArrayViewMut<'_, A, IxDyn>,
        reduce: &RowReduction<'_, A>,
    );
}

macro_rules! gathered_walks {
    ($($elem:ty),*) => {$(
        #[allow(private_interfaces)]
        impl GatheredWalks<$elem> for $elem {
            #[inline(never)]
            fn map_gathered(
                x: ArrayView<'_, $elem, IxDyn>,
                out: ArrayViewMut<'_, $elem, IxDyn>,
                d: usize,
                kernel: &RowKernel<'_, $elem>,
            ) {
                map(x, out, d, kernel)
            }
            #[inline(never)]
            fn map_gathered_in_place(
                x: ArrayViewMut<'_, $elem, IxDyn>,
                d: usize,
                kernel: &RowKernel<'_, $elem>,
            ) {
                map_in_place(x, d, kernel)
            }
            #[inline(never)]
            fn reduce_gathered(
                x: ArrayView<'_, $elem, IxDyn>,
                d: usize,
                first: ArrayViewMut<'_, $elem, IxDyn>,
                second: ArrayViewMut<'_, $elem, IxDyn>,
                reduce: &RowReduction<'_, $elem>,
            ) {
                self::reduce(x, d, first, second, reduce)
            }
        }
    )*};
}

gathered_walks!(f32, f64);

/// `out[r] = kernel(x[r])` for every row `r` of `d` elements (same shapes).
fn map<A: NormScalar>(
    x: ArrayView<'_, A, IxDyn>,
    mut out: ArrayViewMut<'_, A, IxDyn>,
    d: usize,
    kernel: &RowKernel<'_, A>,
) {
    let block = super::gathered_rows::<A>(d);
    let mut xs = RowBlocks::new(&x, d);
    let mut ys = RowBlocksMut::new(&mut out, d);
    loop {
        let input = xs.next_block(block);
        if input.is_empty() {
            break;
        }
        let rows = input.len() / d;
        kernel(Io::separate(input, ys.next_block(block), false), rows);
    }
}

/// Every row `r` of `d` elements of `x` replaced by `kernel(x[r])`.
fn map_in_place<A: NormScalar>(
    mut x: ArrayViewMut<'_, A, IxDyn>,
    d: usize,
    kernel: &RowKernel<'_, A>,
) {
    let block = super::gathered_rows::<A>(d);
    let mut xs = RowBlocksMut::new(&mut x, d);
    loop {
        let rows = xs.next_block(block);
        if rows.is_empty() {
            break;
        }
        let count = rows.len() / d;
        kernel(Io::InPlace(rows), count);
    }
}

/// `(first[r], second[r]) = reduce(x[r])` for every row `r` of `d`
/// elements, the results in arrays of the rows' index shape.
fn reduce<A: NormScalar>(
    x: ArrayView<'_, A, IxDyn>,
    d: usize,
    mut first: ArrayViewMut<'_, A, IxDyn>,
    mut second: ArrayViewMut<'_, A, IxDyn>,
    reduce: &RowReduction<'_, A>,
) {
    let block = super::gathered_rows::<A>(d);
    let mut xs = RowBlocks::new(&x, d);
    let mut results = first.iter_mut().zip(second.iter_mut());
    loop {
        let rows = xs.next_block(block);
        if rows.is_empty() {
            break;
        }
        for (row, (a, b)) in rows.chunks_exact(d).zip(&mut results) {
            (*a, *b) = reduce(row);
        }
    }
}
