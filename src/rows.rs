//! The row walk: hands every vector along the last axis to a row kernel as a
//! contiguous slice in logical order, whatever the memory layout.
//!
//! Every layout reaches the same kernel with the same values in the same
//! order, so results are bit-identical across C order, Fortran order, steps,
//! negative strides, broadcasting and `IxDyn`.
//!
//! Arrays whose rows all lie back to back in logical order (input and output
//! alike) take the contiguous path below: the whole array is one slice cut
//! into rows. Everything else goes through [`strided`], which gathers blocks
//! of rows into a small reused buffer by walking memory in order.
//!
//! A row of the `_over` forms spans the axes from some `Axis(a)` on. Where
//! those axes merge into one stride it is walked as a row along one axis;
//! otherwise each block of rows is gathered in logical order ([`gathered`]).
//!
//! With the `rayon` feature, a call over at least `PARALLEL_MIN_ELEMS`
//! elements splits its rows (never a row) into tasks on the current rayon
//! pool. Each row is still computed by one kernel call, so the output bits do
//! not depend on the number of threads.

mod gathered;
mod strided;

pub use gathered::GatheredWalks;
pub(crate) use gathered::{keep_buffer, panels, take_buffer, Panel, Reorder, RowLayout};
pub use strided::StridedWalks;

use ndarray::{Array, ArrayBase, ArrayRef, Axis, Dimension, IxDyn, RawData};

#[cfg(feature = "rayon")]
use rayon::prelude::*;

use crate::error::NormError;
use crate::fresh;
use crate::kernel::{cache, Io, Isa};
use crate::scalar::NormScalar;

/// Calls over fewer elements than this stay on the calling thread.
///
/// Waking parked workers costs about what one thread needs for a few tens
/// of thousands of elements, so a smaller call would pay more for the
/// wake-up than a second thread saves. From here on, more threads win when
/// the workers are awake and do not lose when they must be woken. Faster
/// row kernels move the break-even point up: re-check it with the in-cache
/// rows of `examples/throughput.rs` (one thread against all) after changing
/// them (PERFORMANCE.md, "Threads").
#[cfg(feature = "rayon")]
pub(crate) const PARALLEL_MIN_ELEMS: usize = 1 << 17;

/// Elements per parallel task (rounded to whole rows, at least one row):
/// large enough that the per-task cost of rayon is lost in the noise, small
/// enough that two threads split any parallel call into many tasks and
/// balance the load.
#[cfg(feature = "rayon")]
const TASK_ELEMS: usize = 1 << 14;

/// Whether a call over `elems` elements runs on the rayon pool.
#[cfg(feature = "rayon")]
fn parallel(elems: usize) -> bool {
    elems >= PARALLEL_MIN_ELEMS && rayon::current_num_threads() > 1
}

/// Rows per task of the contiguous path.
#[cfg(feature = "rayon")]
fn rows_per_task(d: usize) -> usize {
    (TASK_ELEMS / d).max(1)
}

/// Outputs of at least this many bytes are written past the caches
/// ([`Io::Stream`]): four times a 2 MiB per-core L2 cache, beyond what the
/// private caches of current CPUs hold. Plain stores read every output
/// line before overwriting it, so a large output costs three transfers per
/// line instead of the two of a copy.
const STREAM_MIN_BYTES: usize = 8 << 20;

/// Rows shorter than this many bytes are never streamed. A streamed row
/// writes the partial lines at both of its ends with plain stores; with
/// short rows those are a large share of all lines, and the mix of plain
/// and non-temporal stores costs more than plain stores alone. Streaming
/// short rows whole from a staging buffer in L1 costs more still
/// (PERFORMANCE.md, "Streaming stores" and "Tried and left out").
const STREAM_MIN_ROW_BYTES: usize = 2048;

/// Whether a contiguous `output` that the caller provides, of rows of `d`
/// elements, is written past the caches (see [`STREAM_MIN_BYTES`] and
/// [`STREAM_MIN_ROW_BYTES`]).
pub(crate) fn worth_streaming<A>(output: &[A], d: usize) -> bool {
    size_of_val(output) >= STREAM_MIN_BYTES && d * size_of::<A>() >= STREAM_MIN_ROW_BYTES
}

/// Runs `kernel` on every row of `x` (rows of length `d`), writing the same
/// row of a new array of `x`'s shape ([`fresh::array`]): with plain stores,
/// never past the caches. Each row of the output is written whole before
/// anything reads it, as [`fresh::array`] requires.
///
/// Streaming a large new output pays where the allocator reuses memory and
/// costs where it maps it afresh: each fresh page faults on its first
/// touch and the operating system zeroes it into the cache, where plain
/// stores then find its lines. Which of the two a call gets is the
/// allocator's choice (PERFORMANCE.md, "Streaming stores").
pub(crate) fn map_rows<A: NormScalar, D: Dimension>(
    x: &ArrayRef<A, D>,
    d: usize,
    kernel: impl Fn(Isa, Io<'_, A>, usize) + Sync,
) -> Result<Array<A, D>, NormError> {
    fresh::array(x.raw_dim(), |out| map_rows_with(x, out, d, false, kernel))
}

/// [`map_rows`] into an output `out` of `x`'s shape that the caller
/// provides: a large one is written past the caches ([`Io::Stream`]) when
/// its rows are long enough.
pub(crate) fn map_rows_into<A: NormScalar, D: Dimension>(
    x: &ArrayRef<A, D>,
    out: &mut ArrayRef<A, D>,
    d: usize,
    kernel: impl Fn(Isa, Io<'_, A>, usize) + Sync,
) {
    map_rows_with(x, out, d, true, kernel);
}

fn map_rows_with<A: NormScalar, D: Dimension>(
    x: &ArrayRef<A, D>,
    out: &mut ArrayRef<A, D>,
    d: usize,
    may_stream: bool,
    kernel: impl Fn(Isa, Io<'_, A>, usize) + Sync,
) {
    let isa = Isa::detect();
    let on_rows = |io: Io<'_, A>, count: usize| kernel(isa, io, count);
    // Only a contiguous output is streamed, whatever the layout of `x`.
    let streamed = may_stream
        && out
            .as_slice()
            .is_some_and(|output| worth_streaming(output, d));
    if let (Some(input), Some(output)) = (x.as_slice(), out.as_slice_mut()) {
        // A block of consecutive rows goes to the kernel in one call.
        let rows = |input: &[A], output: &mut [A]| {
            kernel(isa, Io::separate(input, output, streamed), input.len() / d);
        };
        #[cfg(feature = "rayon")]
        if parallel(input.len()) {
            let group = rows_per_task(d) * d;
            input
                .par_chunks(group)
                .zip(output.par_chunks_mut(group))
                .for_each(|(input, output)| rows(input, output));
            return;
        }
        rows(input, output);
        return;
    }
    let first = first_row_axis(x.shape(), d);
    let (x, out) = (x.view().into_dyn(), out.view_mut().into_dyn());
    if merges(&x, first) && merges(&out, first) {
        A::map_strided(
            merged_rows(x, first),
            merged_rows(out, first),
            streamed,
            &on_rows,
        );
    } else {
        A::map_gathered(x, out, d, &on_rows);
    }
}

pub(crate) use crate::blocks::first_row_axis;

/// A standard-layout view of one result per row, in the shape `index`
/// (of as many elements).
fn reshaped<'a, A, S: Dimension>(
    results: ndarray::ArrayViewMut<'a, A, S>,
    index: IxDyn,
) -> ndarray::ArrayViewMut<'a, A, IxDyn> {
    let len = results.len();
    results
        .into_shape_with_order(index)
        .unwrap_or_else(|_| unreachable!("{len} results, one per row"))
}

/// Whether the axes of `x` from `first` on merge into one axis whose
/// elements are in logical (row-major) order (as `merge_axes` decides).
fn merges<S: RawData>(x: &ArrayBase<S, IxDyn>, first: usize) -> bool {
    let (shape, strides) = (x.shape(), x.strides());
    let last = shape.len() - 1;
    let (mut len, mut stride) = (shape[last], strides[last]);
    for axis in (first..last).rev() {
        let (take_len, take_stride) = (shape[axis], strides[axis]);
        if take_len > 1 && len > 1 && take_stride != len as isize * stride {
            return false;
        }
        if len <= 1 {
            stride = take_stride;
        }
        len *= take_len;
    }
    true
}

/// `x` with its axes from `first` on merged into one, its last (which
/// [`merges`] must allow).
fn merged_rows<S: RawData>(mut x: ArrayBase<S, IxDyn>, first: usize) -> ArrayBase<S, IxDyn> {
    let last = x.ndim() - 1;
    for axis in (first..last).rev() {
        let merged = x.merge_axes(Axis(axis), Axis(last));
        debug_assert!(merged);
    }
    for _ in first..last {
        x = x.index_axis_move(Axis(first), 0);
    }
    x
}

/// Runs `kernel` on every row of `x`, overwriting it.
pub(crate) fn map_rows_in_place<A: NormScalar, D: Dimension>(
    x: &mut ArrayRef<A, D>,
    d: usize,
    kernel: impl Fn(Isa, Io<'_, A>, usize) + Sync,
) {
    let isa = Isa::detect();
    let on_rows = |io: Io<'_, A>, count: usize| kernel(isa, io, count);
    if let Some(all) = x.as_slice_mut() {
        // A block of consecutive rows goes to the kernel in one call.
        let rows = |all: &mut [A]| {
            let count = all.len() / d;
            kernel(isa, Io::InPlace(all), count);
        };
        #[cfg(feature = "rayon")]
        if parallel(all.len()) {
            all.par_chunks_mut(rows_per_task(d) * d).for_each(rows);
            return;
        }
        rows(all);
        return;
    }
    let first = first_row_axis(x.shape(), d);
    let x = x.view_mut().into_dyn();
    if merges(&x, first) {
        A::map_strided_in_place(merged_rows(x, first), &on_rows);
    } else {
        A::map_gathered_in_place(x, d, &on_rows);
    }
}

/// Two arrays of one result per row.
type RowResults<A, S> = (Array<A, S>, Array<A, S>);

/// The most rows of `d` elements of `A` that the row walks gather into
/// working memory at a time (the walks of the fused forms and of backward
/// take up to twice as many).
pub(crate) fn gathered_rows<A>(d: usize) -> usize {
    strided::block_rows::<A>(d)
}

/// Applies `reduce` to every row of `d` elements of `x`, collecting the two
/// results in arrays of the `leading` shape (the rows' index).
pub(crate) fn reduce_rows<A: NormScalar, D: Dimension, S: Dimension>(
    x: &ArrayRef<A, D>,
    d: usize,
    leading: S,
    reduce: impl Fn(Isa, &[A]) -> (A, A) + Sync,
) -> Result<RowResults<A, S>, NormError> {
    let isa = Isa::detect();
    let reduce = |row: &[A]| reduce(isa, row);
    let mut first = fresh::filled(leading.clone(), A::zero())?;
    let mut second = fresh::filled(leading, A::zero())?;
    if let (Some(input), Some(a), Some(b)) =
        (x.as_slice(), first.as_slice_mut(), second.as_slice_mut())
    {
        let prefetch = cache::worth_prefetching(size_of_val(input));
        let rows = |input: &[A], a: &mut [A], b: &mut [A]| {
            let ahead = cache::rows_ahead::<A>(d);
            for (index, ((row, a), b)) in input.chunks_exact(d).zip(a).zip(b).enumerate() {
                let next = input.get((index + ahead) * d..(index + ahead + 1) * d);
                if let (true, Some(next)) = (prefetch, next) {
                    cache::for_reading(next.as_ptr(), d);
                }
                (*a, *b) = reduce(row);
            }
        };
        #[cfg(feature = "rayon")]
        if parallel(input.len()) {
            let group = rows_per_task(d);
            input
                .par_chunks(group * d)
                .zip(a.par_chunks_mut(group))
                .zip(b.par_chunks_mut(group))
                .for_each(|((input, a), b)| rows(input, a, b));
            return Ok((first, second));
        }
        rows(input, a, b);
        return Ok((first, second));
    }
    let axis = first_row_axis(x.shape(), d);
    // The rows' index as the walk sees it: without the axes of length 1
    // that the caller counts among the leading ones and the walk among a
    // row's (the results are in standard layout, so this is a reshape).
    let index = IxDyn(&x.shape()[..axis]);
    let (a, b) = (
        reshaped(first.view_mut(), index.clone()),
        reshaped(second.view_mut(), index),
    );
    let x = x.view().into_dyn();
    if merges(&x, axis) {
        A::reduce_strided(merged_rows(x, axis), a, b, &reduce);
    } else {
        A::reduce_gathered(x, d, a, b, &reduce);
    }
    Ok((first, second))
}
