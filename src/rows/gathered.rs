//! The row walk for rows over several axes that no single stride reaches
//! in logical order: the `_over` forms on Fortran order, permuted axes or a
//! view sliced inside the normalised axes. Rows whose axes merge into one
//! stride take the strided walk as rows along one axis instead. The copies
//! here also serve the block walks of training, backward and the fused
//! forms ([`crate::blocks`]) on every layout that is not contiguous.
//!
//! The array is cut into panels of one leading axis (the *block axis*, the
//! leading axis whose neighbouring rows are closest in memory) and each
//! panel into blocks of rows. A block is gathered into a buffer in logical
//! order, handed to the kernel, and, for an output not in standard layout,
//! scattered back. The copies run through a table of the memory offsets of
//! the row's lanes (its runs along the last axis): row by row where rows
//! lie apart, or element by element across the block's rows where
//! neighbouring rows are closer in memory than a lane's elements (Fortran
//! order), so that memory is read in order either way.

use std::cell::RefCell;
use std::thread::LocalKey;

use ndarray::{ArrayBase, ArrayView, ArrayViewMut, Axis, IxDyn, RawData, ShapeBuilder};

#[cfg(feature = "rayon")]
use rayon::prelude::*;

use super::strided::{self, RowKernel, RowReduction, MAX_BLOCK_ROWS};
use crate::kernel::Io;
use crate::scalar::NormScalar;

/// Bytes of rows per gathered block: the block and its output stay in the
/// core's own caches while the kernel runs.
const BLOCK_BYTES: usize = 256 << 10;

/// Bytes of rows per block copied across its rows (rows closer in memory
/// than their elements, as in Fortran order): each visit to an element
/// reads it for many neighbouring rows at once.
const ACROSS_BLOCK_BYTES: usize = 1 << 21;

/// Rows per block for rows of `d` elements of `A`, copied as `layout` and
/// `row_step` decide ([`across_rows`]).
fn block_rows<A>(d: usize, row_step: isize, layout: &RowLayout) -> usize {
    let bytes = if across_rows(row_step, layout) {
        ACROSS_BLOCK_BYTES
    } else {
        BLOCK_BYTES
    };
    let rows = (bytes / (d * size_of::<A>()).max(1)).clamp(16, 4096);
    if across_rows(row_step, layout) && layout.permuted.is_some() {
        rows.min(MAX_BLOCK_ROWS)
    } else {
        rows
    }
}

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
    /// [`RowLayout::of`] for `A`.
    fn row_layout(panel: &ArrayView<'_, A, IxDyn>) -> RowLayout;
    /// [`gather`] for `A`, with its working memory in `spare`.
    fn gather_rows(
        block: &ArrayView<'_, A, IxDyn>,
        layout: &RowLayout,
        buf: &mut [A],
        spare: &mut Vec<A>,
    );
    /// [`scatter`] for `A`, with its working memory in `spare`.
    fn scatter_rows(
        buf: &[A],
        layout: &RowLayout,
        block: &mut ArrayViewMut<'_, A, IxDyn>,
        spare: &mut Vec<A>,
    );
    /// [`gather`] of each block into its buffer, on the pool when
    /// `parallel` and the blocks are large enough to share.
    fn gather_pieces(
        pieces: Vec<(ArrayView<'_, A, IxDyn>, &mut [A])>,
        layout: &RowLayout,
        parallel: bool,
        spare: &mut Vec<A>,
    );
    /// The buffers this thread keeps between calls ([`take_buffer`],
    /// [`keep_buffer`]).
    fn kept_buffers() -> &'static LocalKey<RefCell<Vec<Vec<A>>>>;
}

/// Elements from which the blocks of [`gather_pieces`] are gathered by the
/// pool.
#[cfg(feature = "rayon")]
const PARALLEL_GATHER_ELEMS: usize = 1 << 16;

/// [`GatheredWalks::gather_pieces`].
fn gather_pieces<A: NormScalar>(
    pieces: Vec<(ArrayView<'_, A, IxDyn>, &mut [A])>,
    layout: &RowLayout,
    parallel: bool,
    spare: &mut Vec<A>,
) {
    let copy = |(block, buf): (ArrayView<'_, A, IxDyn>, &mut [A]), spare: &mut Vec<A>| {
        gather(&block, layout, buf, buffer(spare, buf.len()));
    };
    #[cfg(feature = "rayon")]
    {
        let len: usize = pieces.iter().map(|(block, _)| block.len()).sum();
        if parallel && len >= PARALLEL_GATHER_ELEMS && rayon::current_num_threads() > 1 {
            pieces
                .into_par_iter()
                .for_each_init(Kept::new, |kept, piece| copy(piece, &mut kept.0));
            return;
        }
    }
    let _ = parallel;
    for piece in pieces {
        copy(piece, spare);
    }
}

/// A buffer for gathered blocks: one this thread kept from an earlier
/// call ([`keep_buffer`]) if any, else a new one.
pub(crate) fn take_buffer<A: NormScalar>() -> Vec<A> {
    A::kept_buffers()
        .try_with(|kept| kept.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// A buffer of [`take_buffer`] that goes back to its thread's
/// ([`keep_buffer`]) when dropped: the working memory of a task on the pool.
#[cfg(feature = "rayon")]
pub(crate) struct Kept<A: NormScalar>(pub(crate) Vec<A>);

#[cfg(feature = "rayon")]
impl<A: NormScalar> Kept<A> {
    pub(crate) fn new() -> Self {
        Kept(take_buffer())
    }
}

#[cfg(feature = "rayon")]
impl<A: NormScalar> Drop for Kept<A> {
    fn drop(&mut self) {
        keep_buffer(std::mem::take(&mut self.0));
    }
}

/// Keeps `buf` for a later call on this thread (a few, of up to
/// [`KEPT_BYTES`] each).
pub(crate) fn keep_buffer<A: NormScalar>(buf: Vec<A>) {
    let _ = A::kept_buffers().try_with(|kept| {
        let mut kept = kept.borrow_mut();
        if size_of_val(buf.as_slice()) <= KEPT_BYTES && kept.len() < KEPT_BUFFERS {
            kept.push(buf);
        }
    });
}

/// The largest buffer a thread keeps between calls. Blocks of gathered
/// rows take hundreds of KiB, which the allocator maps afresh (and the
/// system zeroes page by page) on every call unless they are kept.
const KEPT_BYTES: usize = 8 << 20;

/// How many buffers a thread keeps: those of the three or four walks of
/// one backward or fused call.
const KEPT_BUFFERS: usize = 8;

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
            #[inline(never)]
            fn row_layout(panel: &ArrayView<'_, $elem, IxDyn>) -> RowLayout {
                RowLayout::of(panel)
            }
            #[inline(never)]
            fn gather_rows(
                block: &ArrayView<'_, $elem, IxDyn>,
                layout: &RowLayout,
                buf: &mut [$elem],
                spare: &mut Vec<$elem>,
            ) {
                gather(block, layout, buf, buffer(spare, buf.len()))
            }
            #[inline(never)]
            fn scatter_rows(
                buf: &[$elem],
                layout: &RowLayout,
                block: &mut ArrayViewMut<'_, $elem, IxDyn>,
                spare: &mut Vec<$elem>,
            ) {
                scatter(buf, layout, block, buffer(spare, buf.len()))
            }
            #[inline(never)]
            fn gather_pieces(
                pieces: Vec<(ArrayView<'_, $elem, IxDyn>, &mut [$elem])>,
                layout: &RowLayout,
                parallel: bool,
                spare: &mut Vec<$elem>,
            ) {
                gather_pieces(pieces, layout, parallel, spare)
            }
            fn kept_buffers() -> &'static LocalKey<RefCell<Vec<Vec<$elem>>>> {
                thread_local! {
                    static KEPT: RefCell<Vec<Vec<$elem>>> = const { RefCell::new(Vec::new()) };
                }
                &KEPT
            }
        }
    )*};
}

gathered_walks!(f32, f64);
#[cfg(feature = "half")]
gathered_walks!(half::f16, half::bf16);

/// How the rows of an array are laid out: the lanes of a row and the
/// memory offset of each, the same for every row of the array.
pub(crate) struct RowLayout {
    /// The memory offset of the first element of each lane, relative to
    /// the row's first element, in logical order.
    lanes: Vec<isize>,
    /// The length of a lane (of the last axis).
    lane_len: usize,
    /// The memory step between a lane's elements.
    lane_step: isize,
    /// Where the row's elements, in memory order, step evenly.
    permuted: Option<Permuted>,
}

/// Fewer rows make the column pieces of a [`Permuted`] copy too short to
/// pay for its second pass.
const PERMUTED_MIN_ROWS: usize = 32;

/// A row whose elements, sorted by memory offset, lie `step` apart: a
/// strided run of memory in an order other than the logical one (Fortran
/// order). Blocks of such rows are copied as a matrix of rows in memory
/// order, by the strided walk's copies (a column piece at a time,
/// transposed in registers), and each row then put in logical order in
/// cache.
struct Permuted {
    /// The offset of the element first in memory.
    first: isize,
    /// The memory step between the elements in memory order (positive).
    step: isize,
    /// For each element in logical order, its place in memory order.
    place: Vec<usize>,
    /// Whether memory order is the logical order (a single strided axis).
    in_order: bool,
}

impl Permuted {
    /// The layout of rows over the axes of `shape` and `strides`, if their
    /// elements step evenly in memory: when the axes, by increasing stride,
    /// each step over all the elements of those before (a mixed radix);
    /// `offsets` are the elements' offsets in logical order.
    fn new(
        shape: &[usize],
        strides: &[isize],
        offsets: impl Iterator<Item = isize>,
    ) -> Option<Self> {
        let mut axes: Vec<(usize, usize)> = shape
            .iter()
            .zip(strides)
            .filter(|&(&len, _)| len > 1)
            .map(|(&len, &stride)| (len, stride.unsigned_abs()))
            .collect();
        axes.sort_unstable_by_key(|&(_, stride)| stride);
        let step = axes.first()?.1;
        let mut spanned = step;
        for &(len, stride) in &axes {
            if stride != spanned {
                return None;
            }
            spanned = spanned.checked_mul(len)?;
        }
        let first: isize = shape
            .iter()
            .zip(strides)
            .map(|(&len, &stride)| stride.min(0) * (len as isize - 1))
            .sum();
        let step = isize::try_from(step).ok().filter(|&step| step > 0)?;
        let place: Vec<usize> = offsets.map(|o| ((o - first) / step) as usize).collect();
        let in_order = place.iter().enumerate().all(|(j, &k)| j == k);
        Some(Permuted {
            first,
            step,
            place,
            in_order,
        })
    }

    /// `block` (whose rows have this layout) as a matrix of rows with the
    /// elements in memory order, when its rows step forward in memory.
    fn matrix<'a, A>(&self, block: &Block<'a, A>) -> Option<ndarray::ArrayView2<'a, A>> {
        let (rows, row_step) = (block.len_of(Axis(0)), block.strides()[0]);
        let shape =
            (rows, self.place.len()).strides((usize::try_from(row_step).ok()?, self.step as usize));
        // SAFETY: the elements `(r, k)` of the matrix, at
        // `first + r · row_step + k · step`, are the elements of `block`:
        // row `r` of the block holds exactly the offsets `first + k · step`
        // (this layout was built from its row axes), each one element of the
        // view, which lives for `'a`.
        Some(unsafe {
            ndarray::ArrayView2::from_shape_ptr(shape, block.as_ptr().offset(self.first))
        })
    }

    /// `block` as [`matrix`](Self::matrix), writable.
    fn matrix_mut<'a, A>(
        &self,
        block: &'a mut ArrayViewMut<'_, A, IxDyn>,
    ) -> Option<ndarray::ArrayViewMut2<'a, A>> {
        let (rows, row_step) = (block.len_of(Axis(0)), block.strides()[0]);
        let shape =
            (rows, self.place.len()).strides((usize::try_from(row_step).ok()?, self.step as usize));
        // SAFETY: as in `matrix`, the matrix's elements are those of the
        // mutable view `block`, which it borrows for its life.
        Some(unsafe {
            ndarray::ArrayViewMut2::from_shape_ptr(shape, block.as_mut_ptr().offset(self.first))
        })
    }
}

impl RowLayout {
    /// The layout of rows over the axes of `shape` and `strides` (the
    /// trailing axes of an array, with at least one element). Axes that
    /// merge into longer lanes are merged.
    fn new(shape: &[usize], strides: &[isize]) -> Self {
        // Merge from the last axis outwards while an axis steps over whole
        // lanes of the next.
        let mut axes: Vec<(usize, isize)> =
            shape.iter().copied().zip(strides.iter().copied()).collect();
        while let [.., (outer_len, outer_step), (lane_len, lane_step)] = axes[..] {
            let merged = if lane_len == 1 {
                (outer_len, outer_step)
            } else if outer_len == 1 || outer_step == lane_len as isize * lane_step {
                (outer_len * lane_len, lane_step)
            } else {
                break;
            };
            axes.truncate(axes.len() - 2);
            axes.push(merged);
        }
        let (lane_len, lane_step) = axes.pop().unwrap_or((1, 1));
        let mut lanes = vec![0_isize];
        for (len, stride) in axes {
            lanes = lanes
                .iter()
                .flat_map(|&start| (0..len as isize).map(move |i| start + i * stride))
                .collect();
        }
        RowLayout {
            lanes,
            lane_len,
            lane_step,
            permuted: None,
        }
    }

    /// The layout of the rows of `view`, whose first axis is the block
    /// axis and whose other axes are a row's. Rows copied across a block
    /// of at least [`PERMUTED_MIN_ROWS`] are taken as [`Permuted`] where
    /// they step evenly.
    fn of<A>(view: &ArrayView<'_, A, IxDyn>) -> Self {
        let (shape, strides) = (&view.shape()[1..], &view.strides()[1..]);
        let mut layout = RowLayout::new(shape, strides);
        let rows = view.len_of(Axis(0));
        if across_rows(view.strides()[0], &layout) && rows >= PERMUTED_MIN_ROWS {
            layout.permuted = Permuted::new(shape, strides, layout.offsets());
        }
        layout
    }

    /// The memory offsets of a row's elements in logical order.
    fn offsets(&self) -> impl Iterator<Item = isize> + '_ {
        let (len, step) = (self.lane_len as isize, self.lane_step);
        self.lanes
            .iter()
            .flat_map(move |&start| (0..len).map(move |i| start + i * step))
    }

    /// The smallest memory step between elements of a row.
    fn min_step(&self) -> usize {
        let across = self.lanes.windows(2).map(|w| (w[1] - w[0]).unsigned_abs());
        let along = (self.lane_len > 1).then_some(self.lane_step.unsigned_abs());
        across.chain(along).min().unwrap_or(usize::MAX)
    }
}

/// A block of rows: a view whose first axis is the block axis and whose
/// other axes are a row's.
type Block<'a, A> = ArrayView<'a, A, IxDyn>;

/// Whether to copy a block element by element across its rows: when the
/// rows are closer in memory than the elements of a row.
fn across_rows(row_step: isize, layout: &RowLayout) -> bool {
    row_step.unsigned_abs() < layout.min_step()
}

/// Copies the rows of `block` (rows of `layout`) into `buf`, one after the
/// other in logical order.
fn gather<A: NormScalar>(block: &Block<'_, A>, layout: &RowLayout, buf: &mut [A], spare: &mut [A]) {
    let row_step = block.strides()[0];
    let d = layout.lanes.len() * layout.lane_len;
    let base = block.as_ptr();
    let permuted = layout
        .permuted
        .as_ref()
        .filter(|_| across_rows(row_step, layout));
    if let Some((permuted, matrix)) = permuted.and_then(|p| Some((p, p.matrix(block)?))) {
        if permuted.in_order {
            strided::gather(&matrix, buf);
            return;
        }
        strided::gather(&matrix, spare);
        for (row, in_memory) in buf.chunks_exact_mut(d).zip(spare.chunks_exact(d)) {
            for (slot, &k) in row.iter_mut().zip(&permuted.place) {
                // SAFETY: `place` is a permutation of `0..d` (each element's
                // rank in memory order) and `in_memory` holds `d` elements.
                *slot = unsafe { *in_memory.get_unchecked(k) };
            }
        }
        return;
    }
    if across_rows(row_step, layout) {
        for (j, o) in layout.offsets().enumerate() {
            // SAFETY: `o` is the offset of an element of the block's first
            // row (`layout` was built from the strides of the view's row
            // axes) and each step of `row_step` moves to the same element
            // of the next row, for as many rows as `buf` holds, which are
            // the block's rows: each read is of an element of the view.
            let mut from = unsafe { base.offset(o) };
            for slot in buf[j..].iter_mut().step_by(d) {
                // SAFETY: see above.
                *slot = unsafe { *from };
                from = from.wrapping_offset(row_step);
            }
        }
        return;
    }
    for (r, row) in buf.chunks_exact_mut(d).enumerate() {
        let row_base = base.wrapping_offset(r as isize * row_step);
        for (&start, lane) in layout
            .lanes
            .iter()
            .zip(row.chunks_exact_mut(layout.lane_len))
        {
            let first = row_base.wrapping_offset(start);
            if layout.lane_step == 1 {
                // SAFETY: the lane's elements lie back to back from `first`,
                // an element of the view's row `r` (as above).
                lane.copy_from_slice(unsafe { std::slice::from_raw_parts(first, lane.len()) });
            } else {
                for (i, slot) in lane.iter_mut().enumerate() {
                    // SAFETY: the `i`-th element of the lane, as above.
                    *slot = unsafe { *first.offset(i as isize * layout.lane_step) };
                }
            }
        }
    }
}

/// Writes the rows in `buf` over those of `block` (the inverse of
/// [`gather`]).
fn scatter<A: NormScalar>(
    buf: &[A],
    layout: &RowLayout,
    block: &mut ArrayViewMut<'_, A, IxDyn>,
    spare: &mut [A],
) {
    let row_step = block.strides()[0];
    let d = layout.lanes.len() * layout.lane_len;
    let permuted = layout
        .permuted
        .as_ref()
        .filter(|_| across_rows(row_step, layout));
    if let Some(permuted) = permuted {
        if let Some(mut matrix) = permuted.matrix_mut(block) {
            if permuted.in_order {
                strided::scatter(buf, &mut matrix);
                return;
            }
            for (in_memory, row) in spare.chunks_exact_mut(d).zip(buf.chunks_exact(d)) {
                for (&value, &k) in row.iter().zip(&permuted.place) {
                    in_memory[k] = value;
                }
            }
            strided::scatter(spare, &mut matrix);
            return;
        }
    }
    let base = block.as_mut_ptr();
    // The writes reach the same elements as the reads of `gather`, of a
    // mutable view, which no other reference reaches while it lives.
    if across_rows(row_step, layout) {
        for (j, o) in layout.offsets().enumerate() {
            let mut to = base.wrapping_offset(o);
            for &value in buf[j..].iter().step_by(d) {
                // SAFETY: an element of the view, as in `gather`.
                unsafe { *to = value };
                to = to.wrapping_offset(row_step);
            }
        }
        return;
    }
    for (r, row) in buf.chunks_exact(d).enumerate() {
        let row_base = base.wrapping_offset(r as isize * row_step);
        for (&start, lane) in layout.lanes.iter().zip(row.chunks_exact(layout.lane_len)) {
            let first = row_base.wrapping_offset(start);
            if layout.lane_step == 1 {
                // SAFETY: the lane's elements lie back to back from `first`,
                // elements of the view that nothing else refers to.
                unsafe { std::slice::from_raw_parts_mut(first, lane.len()) }.copy_from_slice(lane);
            } else {
                for (i, &value) in lane.iter().enumerate() {
                    // SAFETY: the `i`-th element of the lane, as above.
                    unsafe { *first.offset(i as isize * layout.lane_step) = value };
                }
            }
        }
    }
}

/// The order of the leading axes (those before `first`) in which to cut
/// panels: the block axis, whose neighbouring rows are closest in memory,
/// last; the row axes stay in place after them.
fn panel_order(shape: &[usize], strides: &[isize], first: usize) -> Vec<usize> {
    let mut leading: Vec<usize> = (0..first).collect();
    leading.sort_by_key(|&k| (shape[k] > 1, std::cmp::Reverse(strides[k].unsigned_abs())));
    leading.extend(first..shape.len());
    leading
}

/// The first panel of `view` (axes in [`panel_order`], `first` leading
/// ones, at least one), whose layout all panels share.
fn panel_view<'a, A>(view: &ArrayView<'a, A, IxDyn>, first: usize) -> ArrayView<'a, A, IxDyn> {
    let mut panel = view.clone();
    for _ in 1..first {
        panel = panel.index_axis_move(Axis(0), 0);
    }
    panel
}

/// Splits `view` (axes already in [`panel_order`], `first` leading ones,
/// at least one) into panels of one leading axis.
pub(crate) fn panels<V: Panel>(view: V, first: usize, out: &mut Vec<V>) {
    if first <= 1 {
        out.push(view);
    } else {
        view.for_each_outer(|inner| panels(inner, first - 1, out));
    }
}

/// The views that [`panels`] cuts.
pub(crate) trait Panel: Sized {
    fn for_each_outer(self, f: impl FnMut(Self));
}

impl<A> Panel for ArrayView<'_, A, IxDyn> {
    fn for_each_outer(self, f: impl FnMut(Self)) {
        self.into_outer_iter().for_each(f);
    }
}

impl<A> Panel for ArrayViewMut<'_, A, IxDyn> {
    fn for_each_outer(self, f: impl FnMut(Self)) {
        self.into_outer_iter_mut().for_each(f);
    }
}

/// `view` with its axes in panel order and, if it has no leading axis, a
/// block axis of length 1.
fn ordered<V: Reorder>(view: V, order: &[usize], first: usize) -> V {
    let view = view.permute(order);
    if first == 0 {
        view.with_block_axis()
    } else {
        view
    }
}

/// The reshaping [`ordered`] does.
pub(crate) trait Reorder: Sized {
    fn permute(self, order: &[usize]) -> Self;
    fn with_block_axis(self) -> Self;
    /// Without `axis`, which has length 1.
    fn without_axis(self, axis: usize) -> Self;
    /// `merge_axes(take, into)`.
    fn merge(&mut self, take: usize, into: usize) -> bool;
}

impl<S: RawData> Reorder for ArrayBase<S, IxDyn> {
    fn permute(self, order: &[usize]) -> Self {
        self.permuted_axes(order)
    }
    fn with_block_axis(self) -> Self {
        self.insert_axis(Axis(0))
    }
    fn without_axis(self, axis: usize) -> Self {
        self.index_axis_move(Axis(axis), 0)
    }
    fn merge(&mut self, take: usize, into: usize) -> bool {
        self.merge_axes(Axis(take), Axis(into))
    }
}

/// Runs `task` on every item of `tasks` with a reused buffer: on the rayon
/// pool when the call covers `elements` elements enough for it.
fn run<T: Send, A: NormScalar>(
    tasks: Vec<T>,
    elements: usize,
    task: impl Fn(T, &mut Vec<A>) + Sync,
) {
    #[cfg(feature = "rayon")]
    if super::parallel(elements) {
        tasks
            .into_par_iter()
            .for_each_init(Kept::new, |buf, t| task(t, &mut buf.0));
        return;
    }
    let _ = elements;
    let mut buf = take_buffer();
    for t in tasks {
        task(t, &mut buf);
    }
    keep_buffer(buf);
}

/// A buffer of `len` elements from `buf` (grown as needed).
fn buffer<A: NormScalar>(buf: &mut Vec<A>, len: usize) -> &mut [A] {
    if buf.len() < len {
        buf.resize(len, A::zero());
    }
    &mut buf[..len]
}

/// Two buffers of `len` elements from `buf`: the block's rows and room
/// for the copies of [`Permuted`] rows.
fn buffers<A: NormScalar>(buf: &mut Vec<A>, len: usize) -> (&mut [A], &mut [A]) {
    if buf.len() < 2 * len {
        buf.resize(2 * len, A::zero());
    }
    buf[..2 * len].split_at_mut(len)
}

/// `out[r] = kernel(x[r])` for every row `r` of `d` elements (same shapes).
fn map<A: NormScalar>(
    x: ArrayView<'_, A, IxDyn>,
    out: ArrayViewMut<'_, A, IxDyn>,
    d: usize,
    kernel: &RowKernel<'_, A>,
) {
    if x.is_empty() {
        return;
    }
    let first = super::first_row_axis(x.shape(), d);
    let order = panel_order(x.shape(), x.strides(), first);
    let (x, out) = (ordered(x, &order, first), ordered(out, &order, first));
    let first = first.max(1);
    let source = RowLayout::of(&panel_view(&x, first));
    let target = RowLayout::of(&panel_view(&out.view(), first));
    let block = block_rows::<A>(d, x.strides()[first - 1], &source);
    let (mut xs, mut outs) = (Vec::new(), Vec::new());
    panels(x, first, &mut xs);
    panels(out, first, &mut outs);
    let tasks: Vec<_> = xs
        .into_iter()
        .zip(outs)
        .flat_map(|(x, out)| {
            x.into_axis_chunks_iter(Axis(0), block)
                .zip(out.into_axis_chunks_iter_mut(Axis(0), block))
        })
        .collect();
    let elements = tasks.iter().map(|(x, _)| x.len()).sum();
    run(tasks, elements, |(x, mut out), buf: &mut Vec<A>| {
        let rows = x.len_of(Axis(0));
        let (input, spare) = buffers(buf, rows * d);
        gather(&x, &source, input, spare);
        match out.as_slice_mut() {
            Some(output) => kernel(Io::separate(input, output, false), rows),
            None => {
                kernel(Io::InPlace(input), rows);
                scatter(input, &target, &mut out, spare);
            }
        }
    });
}

/// Every row `r` of `d` elements of `x` replaced by `kernel(x[r])`.
fn map_in_place<A: NormScalar>(x: ArrayViewMut<'_, A, IxDyn>, d: usize, kernel: &RowKernel<'_, A>) {
    if x.is_empty() {
        return;
    }
    let first = super::first_row_axis(x.shape(), d);
    let order = panel_order(x.shape(), x.strides(), first);
    let x = ordered(x, &order, first);
    let first = first.max(1);
    let layout = RowLayout::of(&panel_view(&x.view(), first));
    let block = block_rows::<A>(d, x.strides()[first - 1], &layout);
    let mut xs = Vec::new();
    panels(x, first, &mut xs);
    let tasks: Vec<_> = xs
        .into_iter()
        .flat_map(|x| x.into_axis_chunks_iter_mut(Axis(0), block))
        .collect();
    let elements = tasks.iter().map(|x| x.len()).sum();
    run(tasks, elements, |mut x, buf: &mut Vec<A>| {
        let rows = x.len_of(Axis(0));
        let (values, spare) = buffers(buf, rows * d);
        gather(&x.view(), &layout, values, spare);
        kernel(Io::InPlace(values), rows);
        scatter(values, &layout, &mut x, spare);
    });
}

/// `(first[r], second[r]) = reduce(x[r])` for every row `r` of `d`
/// elements, the results in arrays of the rows' index shape.
fn reduce<A: NormScalar>(
    x: ArrayView<'_, A, IxDyn>,
    d: usize,
    first: ArrayViewMut<'_, A, IxDyn>,
    second: ArrayViewMut<'_, A, IxDyn>,
    reduce: &RowReduction<'_, A>,
) {
    if x.is_empty() {
        return;
    }
    let axis = super::first_row_axis(x.shape(), d);
    let order = panel_order(x.shape(), x.strides(), axis);
    let leading = &order[..axis];
    let x = ordered(x, &order, axis);
    let (first, second) = (
        ordered(first, leading, axis),
        ordered(second, leading, axis),
    );
    let axis = axis.max(1);
    let layout = RowLayout::of(&panel_view(&x, axis));
    let block = block_rows::<A>(d, x.strides()[axis - 1], &layout);
    let (mut xs, mut firsts, mut seconds) = (Vec::new(), Vec::new(), Vec::new());
    panels(x, axis, &mut xs);
    panels(first, axis, &mut firsts);
    panels(second, axis, &mut seconds);
    let tasks: Vec<_> = xs
        .into_iter()
        .zip(firsts.into_iter().zip(seconds))
        .flat_map(|(x, (a, b))| {
            let a = a.into_axis_chunks_iter_mut(Axis(0), block);
            x.into_axis_chunks_iter(Axis(0), block)
                .zip(a.zip(b.into_axis_chunks_iter_mut(Axis(0), block)))
        })
        .collect();
    let elements = tasks.iter().map(|(x, _)| x.len()).sum();
    run(tasks, elements, |(x, (mut a, mut b)), buf: &mut Vec<A>| {
        let rows = x.len_of(Axis(0));
        let (values, spare) = buffers(buf, rows * d);
        gather(&x, &layout, values, spare);
        for ((row, a), b) in values.chunks_exact(d).zip(a.iter_mut()).zip(b.iter_mut()) {
            (*a, *b) = reduce(row);
        }
    });
}
