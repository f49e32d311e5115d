//! The row walk for arrays whose rows are not all back to back: Fortran
//! order, steps, negative strides, broadcasting, permuted axes.
//!
//! The leading axes are first ordered by decreasing stride, so that the last
//! leading axis (the *block axis*) is the one whose neighbouring rows are
//! closest in memory. The array is then cut into 2-D panels (block axis ×
//! row), and each panel is processed in blocks of a few dozen rows:
//!
//! - a panel whose rows lie back to back (as after a step along an outer
//!   axis) is handed to the kernel whole, in one call;
//! - other rows that are contiguous in logical order are handed to the
//!   kernel where they lie, one by one with hints for the rows ahead
//!   ([`RowsAhead`]), unless they are short: short rows are gathered as
//!   below, so that the kernel gets many at a time ([`gathered`]);
//! - otherwise the block is gathered into a small row-major buffer, reused
//!   for every block of the task, by walking memory in order (a cache line
//!   of neighbouring columns at a time when neighbouring rows are closer in
//!   memory than neighbouring elements, as in Fortran order, each column's
//!   piece copied whole through a [`LineTile`]; row by row otherwise);
//!   short rows headed for a contiguous output are gathered straight into
//!   it instead ([`direct_rows`]);
//! - an output whose rows are not contiguous is computed in the buffer and
//!   scattered back in memory order (column by column for Fortran order).
//!
//! The kernel always sees each row's values in logical order, so results
//! are the same bits as on the contiguous path.

use std::cmp::Reverse;
use std::ops::Range;

use ndarray::{s, ArrayView, ArrayView2, ArrayViewMut, ArrayViewMut2, Axis, Ix1, Ix2, IxDyn, Zip};

#[cfg(feature = "rayon")]
use rayon::prelude::*;

use crate::kernel::{cache, Io, Isa};
use crate::scalar::NormScalar;

/// Bytes of row data a gather block holds: as many rows as fit, within
/// [`MIN_BLOCK_ROWS`] and [`MAX_BLOCK_ROWS`] (a 2 MiB L2 cache of one
/// core). More rows per block make each visit to a column read more of it
/// at once; beyond the cache, the block is evicted before the kernel is
/// through with it (PERFORMANCE.md, "Strided arrays").
const BLOCK_BYTES: usize = 1 << 21;

/// The fewest rows in one block: each visit to a column reads at least this
/// many neighbouring elements (two cache lines of `f32`, four of `f64`).
const MIN_BLOCK_ROWS: usize = 32;

/// The most rows in one block.
pub(super) const MAX_BLOCK_ROWS: usize = 64;

/// Bytes of each row a tile of the column-wise walk covers: two cache lines.
const TILE_BYTES: usize = 128;

/// Rows of at most this many bytes are gathered straight into a contiguous
/// output and normalised there, which spares short rows the copy out of
/// the buffer; longer ones go through the buffer, where that copy is a
/// small share of their work (PERFORMANCE.md, "Strided hints").
const DIRECT_ROW_BYTES: usize = 1 << 10;

/// The largest block [`PanelPrefetch`] asks for: with the block being worked
/// on, it must stay in the L2 cache; larger blocks ask for the strips
/// ahead instead ([`STRIPS_AHEAD`]) (PERFORMANCE.md, "Strided arrays").
const PREFETCH_BLOCK_BYTES: usize = 512 << 10;

/// Cache hints for a Fortran-order panel: while block `b` is normalised,
/// the column pieces of block `b + 1` are requested from memory, a few
/// columns per row kernel call so that the requests spread over the
/// block's work. Panels of any other layout, or with blocks too large to
/// stay in L2 next to the current one, get no hints.
#[derive(Clone, Copy)]
struct PanelPrefetch<A> {
    base: *const A,
    column_stride: isize,
    rows: usize,
    d: usize,
    block: usize,
    enabled: bool,
}

impl<A> PanelPrefetch<A> {
    /// Hints for `panel` (rows of length `d` along its second axis), walked
    /// in blocks of `block` rows.
    fn new(panel: &ArrayView2<'_, A>, block: usize) -> Self {
        let (rows, d) = panel.dim();
        let (row_stride, column_stride) = match *panel.strides() {
            [row, column] => (row, column),
            _ => (0, 0),
        };
        PanelPrefetch {
            base: panel.as_ptr(),
            column_stride,
            rows,
            d,
            block,
            enabled: row_stride == 1 && block * d * size_of::<A>() <= PREFETCH_BLOCK_BYTES,
        }
    }

    /// The hints to give while block `index` (of `current` rows) is worked on.
    fn during(self, index: usize, current: usize) -> NextBlock<A> {
        let start = (index + 1) * self.block;
        let count = if self.enabled {
            self.rows.saturating_sub(start).min(self.block)
        } else {
            0
        };
        NextBlock {
            first: self.base.wrapping_add(start),
            column_stride: self.column_stride,
            count,
            columns_per_row: self.d.div_ceil(current.max(1)),
            d: self.d,
        }
    }
}

/// The next block of a panel (rows `start .. start + count`, each column's
/// piece contiguous): `ahead(rows)` asks for the columns that fall to those
/// rows of the current block.
struct NextBlock<A> {
    first: *const A,
    column_stride: isize,
    count: usize,
    columns_per_row: usize,
    d: usize,
}

impl<A> NextBlock<A> {
    fn ahead(&self, rows: Range<usize>) {
        if self.count == 0 {
            return;
        }
        let start = (rows.start * self.columns_per_row).min(self.d);
        let end = (rows.end * self.columns_per_row).min(self.d);
        for column in start..end {
            let piece = self
                .first
                .wrapping_offset(column as isize * self.column_stride);
            cache::for_reading(piece, self.count);
        }
    }

    /// The same block, without hints.
    fn silenced(self) -> Self {
        NextBlock { count: 0, ..self }
    }
}

/// Bytes of rows per kernel call on a gathered block: [`NextBlock`] hints
/// are given between calls, so that they spread over the block's work.
/// Short rows then reach the kernel many at a time, which takes them 16
/// at once; rows of this size or longer go one per call
/// (PERFORMANCE.md, "Strided hints").
const GROUP_BYTES: usize = 4096;

/// Rows per kernel call on a gathered block, for rows of `d` elements.
fn group_rows<A>(d: usize) -> usize {
    (GROUP_BYTES / (d * size_of::<A>()).max(1)).max(1)
}

/// Runs `kernel` in place on the rows of length `d` of `rows`, a group of
/// [`group_rows`] per call, each call after the hints of its rows.
fn in_groups<A>(rows: &mut [A], d: usize, next: &NextBlock<A>, kernel: &RowKernel<'_, A>) {
    let group_rows = group_rows::<A>(d);
    for (group, rows) in rows.chunks_mut(group_rows * d).enumerate() {
        let count = rows.len() / d;
        next.ahead(group * group_rows..group * group_rows + count);
        kernel(Io::InPlace(rows), count);
    }
}

/// [`in_groups`] from the rows of `input` into those of `output`, streamed
/// with `stream` ([`Io::separate`]).
fn copies_in_groups<A>(
    input: &[A],
    output: &mut [A],
    d: usize,
    next: &NextBlock<A>,
    stream: bool,
    kernel: &RowKernel<'_, A>,
) {
    let group_rows = group_rows::<A>(d);
    let groups = input
        .chunks(group_rows * d)
        .zip(output.chunks_mut(group_rows * d));
    for (group, (input, output)) in groups.enumerate() {
        let count = input.len() / d;
        next.ahead(group * group_rows..group * group_rows + count);
        kernel(Io::separate(input, output, stream), count);
    }
}

/// Whether the rows of a panel whose rows are not back to back are gathered
/// into blocks: when they are not contiguous themselves, or short. The kernel
/// takes contiguous rows where they lie, but one call per row leaves short
/// rows to the one-row path, where a gathered block of rows is normalised 16
/// rows at a time.
fn gathered<A>(x: &ArrayView2<'_, A>) -> bool {
    !rows_contiguous(x.shape(), x.strides()) || x.ncols() * size_of::<A>() <= DIRECT_ROW_BYTES
}

/// Whether the gathered rows of `x` headed for a contiguous output are
/// gathered straight into it and normalised there, rather than through the
/// buffer: rows of at most [`DIRECT_ROW_BYTES`], and in Fortran order only
/// rows that fit in one strip of [`LineTile`]. Longer Fortran-order rows
/// would be written to the output a strip of each row at a time, out of
/// memory order; through the buffer the kernel writes them in order.
/// Gathering short rows straight into the output spares them the copy out
/// of the buffer (PERFORMANCE.md, "Strided hints").
fn direct_rows<A: NormScalar>(x: &ArrayView2<'_, A>) -> bool {
    let d = x.ncols();
    d * size_of::<A>() <= DIRECT_ROW_BYTES
        && (!by_columns(x.strides()) || d <= LineTile::<A>::WIDTH)
}

/// The longest rows [`RowsAhead`] gives hints for: a longer row is a long
/// enough run of memory for the processor's own prefetcher to follow, and
/// a burst of hints for it only competes with that (PERFORMANCE.md,
/// "Strided hints").
const HINT_MAX_ROW_BYTES: usize = 8 << 10;

/// Cache hints for contiguous rows that are not back to back, handed to the
/// kernel one by one: before each row, the row [`cache::rows_ahead`] rows
/// later (and its output) is requested in one burst (the kernel's own walk
/// over back-to-back rows spreads its requests over each output pass, but
/// asks only for rows of its own call). Panels that fit in cache, and rows
/// longer than [`HINT_MAX_ROW_BYTES`], get none; a streamed output gets no
/// hint for writing, since it is not read before it is written.
struct RowsAhead {
    input_step: isize,
    output_step: isize,
    d: usize,
    enabled: bool,
    output_hints: bool,
}

impl RowsAhead {
    fn new<A>(x: &ArrayView2<'_, A>, out: &ArrayView2<'_, A>, stream: bool) -> Self {
        let ahead = cache::rows_ahead::<A>(x.ncols()) as isize;
        let step = |strides: &[isize]| strides.first().copied().unwrap_or(0) * ahead;
        RowsAhead {
            input_step: step(x.strides()),
            output_step: step(out.strides()),
            d: x.ncols(),
            enabled: cache::worth_prefetching(x.len() * size_of::<A>())
                && x.ncols() * size_of::<A>() <= HINT_MAX_ROW_BYTES,
            output_hints: !stream,
        }
    }

    /// Hints for the rows ahead of the row at `input` (output at `output`).
    fn hint<A>(&self, input: *const A, output: *const A) {
        if self.enabled {
            cache::for_reading(input.wrapping_offset(self.input_step), self.d);
            if self.output_hints && output != input {
                cache::for_writing(output.wrapping_offset(self.output_step), self.d);
            }
        }
    }
}

/// Rows per block for rows of `d` elements of `A`.
pub(super) fn block_rows<A>(d: usize) -> usize {
    let row_bytes = d.saturating_mul(std::mem::size_of::<A>()).max(1);
    (BLOCK_BYTES / row_bytes).clamp(MIN_BLOCK_ROWS, MAX_BLOCK_ROWS)
}

/// A kernel over a run of rows (`Io`, row count), as the walk calls it.
pub(crate) type RowKernel<'k, A> = dyn Fn(Io<'_, A>, usize) + Sync + 'k;

/// A reduction of one row to two values.
pub(crate) type RowReduction<'k, A> = dyn Fn(&[A]) -> (A, A) + Sync + 'k;

/// The strided walks of the element type `A`, compiled here once per type
/// (the kernels they call are passed as trait objects, one call per block
/// of rows), so that a crate calling the generic API compiles none of them.
#[allow(private_interfaces)]
pub trait StridedWalks<A> {
    /// [`map`] for `A`.
    fn map_strided(
        x: ArrayView<'_, A, IxDyn>,
        out: ArrayViewMut<'_, A, IxDyn>,
        stream: bool,
        kernel: &RowKernel<'_, A>,
    );
    /// [`map_in_place`] for `A`.
    fn map_strided_in_place(x: ArrayViewMut<'_, A, IxDyn>, kernel: &RowKernel<'_, A>);
    /// [`reduce`] for `A`.
    fn reduce_strided(
        x: ArrayView<'_, A, IxDyn>,
        first: ArrayViewMut<'_, A, IxDyn>,
        second: ArrayViewMut<'_, A, IxDyn>,
        reduce: &RowReduction<'_, A>,
    );
}

macro_rules! strided_walks {
    ($($elem:ty),*) => {$(
        #[allow(private_interfaces)]
        impl StridedWalks<$elem> for $elem {
            #[inline(never)]
            fn map_strided(
                x: ArrayView<'_, $elem, IxDyn>,
                out: ArrayViewMut<'_, $elem, IxDyn>,
                stream: bool,
                kernel: &RowKernel<'_, $elem>,
            ) {
                map(x, out, stream, kernel)
            }
            #[inline(never)]
            fn map_strided_in_place(
                x: ArrayViewMut<'_, $elem, IxDyn>,
                kernel: &RowKernel<'_, $elem>,
            ) {
                map_in_place(x, kernel)
            }
            #[inline(never)]
            fn reduce_strided(
                x: ArrayView<'_, $elem, IxDyn>,
                first: ArrayViewMut<'_, $elem, IxDyn>,
                second: ArrayViewMut<'_, $elem, IxDyn>,
                reduce: &RowReduction<'_, $elem>,
            ) {
                self::reduce(x, first, second, reduce)
            }
        }
    )*};
}

strided_walks!(f32, f64);
#[cfg(feature = "half")]
strided_walks!(half::f16, half::bf16);

/// `out[r] = kernel(x[r])` for every row `r` (same shapes). With `stream`,
/// rows written straight into `out` are written past the caches
/// ([`Io::Stream`]) wherever its rows are contiguous.
fn map<A: NormScalar>(
    x: ArrayView<'_, A, IxDyn>,
    out: ArrayViewMut<'_, A, IxDyn>,
    stream: bool,
    kernel: &RowKernel<'_, A>,
) {
    let (x, out) = if x.ndim() == 1 {
        (x.insert_axis(Axis(0)), out.insert_axis(Axis(0)))
    } else {
        (x, out)
    };
    drive(Map {
        x,
        out,
        stream,
        kernel,
    });
}

/// `x[r] = kernel(x[r])` for every row `r`.
fn map_in_place<A: NormScalar>(x: ArrayViewMut<'_, A, IxDyn>, kernel: &RowKernel<'_, A>) {
    let x = if x.ndim() == 1 {
        x.insert_axis(Axis(0))
    } else {
        x
    };
    drive(InPlace { x, kernel });
}

/// `(first[r], second[r]) = reduce(x[r])` for every row `r`; `first` and
/// `second` have the leading shape of `x`.
fn reduce<A: NormScalar>(
    x: ArrayView<'_, A, IxDyn>,
    first: ArrayViewMut<'_, A, IxDyn>,
    second: ArrayViewMut<'_, A, IxDyn>,
    reduce: &RowReduction<'_, A>,
) {
    let (x, first, second) = if x.ndim() == 1 {
        (
            x.insert_axis(Axis(0)),
            first.insert_axis(Axis(0)),
            second.insert_axis(Axis(0)),
        )
    } else {
        (x, first, second)
    };
    drive(Reduce {
        x,
        first,
        second,
        reduce,
    });
}

/// A row operation over operands that share the input's leading axes.
trait Job: Sized + Send {
    type Elem: NormScalar;

    /// The input's shape, at least two axes; the last one holds the rows.
    fn shape(&self) -> &[usize];

    /// The strides that decide the walk order: those of the operand that is
    /// gathered or scattered (the input if its rows are not contiguous, else
    /// the output).
    fn walk_strides(&self) -> &[isize];

    /// Reorders the axes of every operand; `perm` keeps the last axis last.
    fn permuted(self, perm: &[usize]) -> Self;

    /// Splits every operand before `index` along the leading axis `axis`.
    #[cfg_attr(not(feature = "rayon"), allow(dead_code))]
    fn split_at(self, axis: usize, index: usize) -> (Self, Self);

    /// Calls `f` for each index of the first axis (of at least three).
    fn for_each_outer(self, f: impl FnMut(Self));

    /// Processes a two-dimensional operation in blocks of `block` rows.
    fn panel(self, block: usize, scratch: &mut Vec<Self::Elem>);
}

/// Whether every row of an `n × d` view with these strides is contiguous in
/// logical order.
fn rows_contiguous(shape: &[usize], strides: &[isize]) -> bool {
    match (shape.last(), strides.last()) {
        (Some(&d), Some(&stride)) => d <= 1 || stride == 1,
        _ => true,
    }
}

/// Runs `job`: on the calling thread, or split into tasks on the rayon pool
/// when it is large enough.
fn drive<J: Job>(job: J) {
    let shape = job.shape();
    if shape.contains(&0) {
        return;
    }
    let d = shape.last().copied().unwrap_or(1);
    let block = block_rows::<J::Elem>(d);
    let perm = walk_order(shape, job.walk_strides());
    let job = job.permuted(&perm);
    #[cfg(feature = "rayon")]
    if super::parallel(job.shape().iter().product()) {
        let mut tasks = Vec::new();
        split(job, block, &mut tasks);
        tasks
            .into_par_iter()
            .for_each_init(Vec::new, |scratch, job| walk(job, block, scratch));
        return;
    }
    walk(job, block, &mut Vec::new());
}

/// The axis order to walk in: leading axes of length 1 first, then the
/// others by decreasing stride, so that the last leading axis has the
/// neighbouring rows closest in memory; the row axis stays last.
fn walk_order(shape: &[usize], strides: &[isize]) -> Vec<usize> {
    let n = shape.len();
    let mut perm: Vec<usize> = (0..n.saturating_sub(1)).collect();
    perm.sort_by_key(|&k| (shape[k] > 1, Reverse(strides[k].unsigned_abs())));
    perm.push(n - 1);
    perm
}

/// Cuts `job` into tasks of about [`super::TASK_ELEMS`] elements, along the
/// outermost leading axes first and in whole blocks along the block axis.
#[cfg(feature = "rayon")]
fn split<J: Job>(job: J, block: usize, tasks: &mut Vec<J>) {
    let shape = job.shape();
    let n = shape.len();
    let elems: usize = shape.iter().product();
    let axis = (0..n - 1).find(|&k| shape[k] > 1);
    let cut = match axis {
        Some(k) if elems > super::TASK_ELEMS => {
            let len = shape[k];
            if k + 2 < n {
                Some((k, len / 2))
            } else if len > block {
                // Keep whole blocks: the first part gets a multiple of `block`.
                Some((k, (len / 2).div_ceil(block) * block))
            } else {
                None
            }
        }
        _ => None,
    };
    match cut {
        Some((axis, index)) => {
            let (a, b) = job.split_at(axis, index);
            split(a, block, tasks);
            split(b, block, tasks);
        }
        None => tasks.push(job),
    }
}

/// Processes `job` on the calling thread, panel by panel.
fn walk<J: Job>(job: J, block: usize, scratch: &mut Vec<J::Elem>) {
    if job.shape().len() > 2 {
        job.for_each_outer(|job| walk(job, block, scratch));
    } else {
        job.panel(block, scratch);
    }
}

/// The first `len` elements of `scratch`, grown (once) if needed.
fn buffer<A: NormScalar>(scratch: &mut Vec<A>, len: usize) -> &mut [A] {
    if scratch.len() < len {
        scratch.resize(len, A::zero());
    }
    &mut scratch[..len]
}

/// Whether to walk a `rows × d` block column-wise: when neighbouring rows
/// are closer in memory than neighbouring elements of a row.
fn by_columns(strides: &[isize]) -> bool {
    match strides {
        [row, col] => row.unsigned_abs() < col.unsigned_abs(),
        _ => false,
    }
}

/// `buf` as a row-major `rows × d` array (`rows = buf.len() / d`).
fn matrix<A>(buf: &[A], d: usize) -> ArrayView2<'_, A> {
    let rows = buf.len() / d.max(1);
    match ArrayView2::from_shape((rows, d), &buf[..rows * d]) {
        Ok(view) => view,
        Err(_) => unreachable!("rows * d elements always form a rows × d array"),
    }
}

/// `buf` as a mutable row-major `rows × d` array (`rows = buf.len() / d`).
fn matrix_mut<A>(buf: &mut [A], d: usize) -> ArrayViewMut2<'_, A> {
    let rows = buf.len() / d.max(1);
    match ArrayViewMut2::from_shape((rows, d), &mut buf[..rows * d]) {
        Ok(view) => view,
        Err(_) => unreachable!("rows * d elements always form a rows × d array"),
    }
}

/// `dst = src` for a block of rows, where `dst` has contiguous rows (the
/// buffer, or a contiguous output), reading `src` in memory order.
///
/// When neighbouring rows of `src` are closer than neighbouring elements
/// (Fortran order), the block is copied a strip of columns at a time: with
/// each column's piece contiguous and `dst` one slice, through
/// [`LineTile`]; otherwise in tiles
/// of [`TILE_BYTES`] per row, which `Zip` walks row by row (the buffer's
/// tile leans to C order and the strided one to Fortran order, so the tie
/// goes to C order). Other layouts are copied by one `assign`, row by row.
fn copy_block<A: NormScalar>(dst: &mut ArrayViewMut2<'_, A>, src: &ArrayView2<'_, A>) {
    let d = src.ncols();
    if !by_columns(src.strides()) {
        dst.assign(src);
        return;
    }
    if let (Some(mut tile), Some(rows)) = (LineTile::for_gathering(src), dst.as_slice_mut()) {
        let hints = hints_for_strips::<A>(src.strides(), d, src.len());
        for strip in LineTile::<A>::strips(d) {
            if hints {
                let piece = |column| src.column(column).as_ptr();
                LineTile::ask_ahead(&strip, d, piece, |piece| {
                    cache::for_reading(piece, src.nrows())
                });
            }
            tile.load_columns(src, strip.clone());
            tile.store_rows(rows, d, strip);
        }
    } else {
        let tile = (TILE_BYTES / std::mem::size_of::<A>().max(1)).max(1);
        for start in (0..d).step_by(tile) {
            let columns = s![.., start..(start + tile).min(d)];
            Zip::from(dst.slice_mut(columns))
                .and(src.slice(columns))
                .for_each(|o, &v| *o = v);
        }
    }
}

/// Copies the rows of `src` into `dst` (row-major, `src.len()` elements).
pub(super) fn gather<A: NormScalar>(src: &ArrayView2<'_, A>, dst: &mut [A]) {
    let d = src.ncols();
    copy_block(&mut matrix_mut(dst, d), src);
}

/// Copies `src` (row-major, `dst.len()` elements) into the rows of `dst`,
/// writing `dst` in memory order: column by column when neighbouring rows
/// are closer than neighbouring elements, so that each column's piece is
/// written as whole cache lines, row by row otherwise.
///
/// Column by column, where the [`LineTile`] is transposed in registers, a
/// strip of the buffer's rows is transposed into the tile and each column
/// piece is written from it in one run; otherwise each column is copied
/// element by element, which writes each column's piece in one run too and
/// spares the tile's extra copy (PERFORMANCE.md, "Strided arrays").
pub(super) fn scatter<A: NormScalar>(src: &[A], dst: &mut ArrayViewMut2<'_, A>) {
    let d = dst.ncols();
    if !by_columns(dst.strides()) {
        dst.assign(&matrix(src, d));
    } else if let Some(mut tile) = LineTile::for_scattering(dst) {
        let hints = hints_for_strips::<A>(dst.strides(), d, dst.len());
        for strip in LineTile::<A>::strips(d) {
            if hints {
                let piece = |column| dst.column(column).as_ptr();
                LineTile::ask_ahead(&strip, d, piece, |piece| {
                    cache::for_writing(piece, dst.nrows())
                });
            }
            tile.load_rows(src, d, strip.clone());
            tile.store_columns(dst, strip);
        }
    } else {
        Zip::from(dst.columns_mut())
            .and(matrix(src, d).columns())
            .for_each(|mut dst, src| dst.assign(&src));
    }
}

/// The largest block gathered through a [`LineTile`] moved element by
/// element (instruction sets without the register transposes; with them,
/// every block goes through the tile). Element by element, larger blocks
/// are slower through the tile than through `Zip` tiles: their rows lie
/// 16 KiB and more apart in the buffer, and a strip writes a line into each
/// of them in turn. With the transposes in registers and the
/// [`STRIPS_AHEAD`] hints, the tile pays at every size (PERFORMANCE.md,
/// "Strided arrays").
const SMALL_BLOCK_BYTES: usize = 512 << 10;

/// How many strips ahead of the one being copied the column pieces are
/// asked for, while a block goes through a [`LineTile`] (read when
/// gathering, for writing when scattering): blocks too large for
/// [`PanelPrefetch`] would otherwise wait on memory for every column piece.
/// One strip ahead gives the lines time to arrive; further ahead gains
/// nothing (PERFORMANCE.md, "Strided hints").
const STRIPS_AHEAD: usize = 1;

/// Whether the strips of a block of `len` elements whose column pieces lie
/// `strides[1]` apart get hints: when the panel they span (rows of `d`
/// elements) is larger than a call that the kernel asks hints for, and the
/// block too large for [`PanelPrefetch`] to have asked for it already: the
/// hints of both for one block only compete with each other.
fn hints_for_strips<A>(strides: &[isize], d: usize, len: usize) -> bool {
    let column_stride = strides.get(1).map_or(0, |stride| stride.unsigned_abs());
    let span = column_stride
        .saturating_mul(d)
        .saturating_mul(size_of::<A>());
    cache::worth_prefetching(span) && len * size_of::<A>() > PREFETCH_BLOCK_BYTES
}

/// Columns a [`LineTile`] holds at most: a cache line of `f32`.
const LINE_TILE_COLUMNS: usize = 16;

/// A strip of a block's columns, one cache line of them, held column after
/// column on the stack: the transposing step between the block's column
/// pieces (contiguous, as in Fortran order) and its rows.
///
/// Each column piece is read whole, as one run of memory, instead of one
/// element per row visit; the transposition then happens between the tile,
/// which sits in L1, and whole cache lines of the rows, by the kernel's
/// [`Kernels::transpose_lines`](crate::kernel::Kernels::transpose_lines): squares of a cache line each way in registers where
/// the instruction set allows (AVX-512, AVX2), element by element elsewhere
/// and at the edges. Scattering goes the other way through the same tile.
///
/// Even with element-wise moves, the tile beats the `Zip` tiles of
/// [`copy_block`] on blocks that stay in cache; see [`SMALL_BLOCK_BYTES`]
/// for larger ones.
struct LineTile<A> {
    /// `columns[k][r]`: element `r` of the strip's column `k`.
    columns: [[A; MAX_BLOCK_ROWS]; LINE_TILE_COLUMNS],
    /// Rows of the block (the length of each column piece).
    rows: usize,
    /// The instruction set of the transposing copies.
    isa: Isa,
}

impl<A: NormScalar> LineTile<A> {
    /// Columns of a strip: a cache line of elements.
    const WIDTH: usize = {
        let per_line = 64 / size_of::<A>();
        if per_line == 0 {
            1
        } else if per_line > LINE_TILE_COLUMNS {
            LINE_TILE_COLUMNS
        } else {
            per_line
        }
    };

    /// A tile to gather `block` through, when its column pieces are
    /// contiguous, it has at most [`MAX_BLOCK_ROWS`] rows and, unless the
    /// tile is transposed in registers, at most [`SMALL_BLOCK_BYTES`].
    fn for_gathering(block: &ArrayView2<'_, A>) -> Option<Self> {
        let tile = Self::for_rows(block.strides(), block.nrows())?;
        (tile.isa.transposes_in_registers() || block.len() * size_of::<A>() <= SMALL_BLOCK_BYTES)
            .then_some(tile)
    }

    /// A tile to scatter into `block` through, when it is transposed in
    /// registers and the block's column pieces are contiguous, at most
    /// [`MAX_BLOCK_ROWS`] long.
    fn for_scattering(block: &ArrayViewMut2<'_, A>) -> Option<Self> {
        Self::for_rows(block.strides(), block.nrows())
            .filter(|tile| tile.isa.transposes_in_registers())
    }

    fn for_rows(strides: &[isize], rows: usize) -> Option<Self> {
        let contiguous_columns = strides.first() == Some(&1);
        (contiguous_columns && (1..=MAX_BLOCK_ROWS).contains(&rows)).then(|| LineTile {
            columns: [[A::zero(); MAX_BLOCK_ROWS]; LINE_TILE_COLUMNS],
            rows,
            isa: Isa::detect(),
        })
    }

    /// The column ranges of the strips of rows of `d` elements.
    fn strips(d: usize) -> impl Iterator<Item = Range<usize>> {
        (0..d)
            .step_by(Self::WIDTH)
            .map(move |start| start..(start + Self::WIDTH).min(d))
    }

    /// Gives `hint` the start of each column piece (`piece(column)`) of the
    /// strip [`STRIPS_AHEAD`] strips after `strip`, in rows of `d` elements.
    fn ask_ahead(
        strip: &Range<usize>,
        d: usize,
        piece: impl Fn(usize) -> *const A,
        hint: impl Fn(*const A),
    ) {
        let skip = STRIPS_AHEAD * Self::WIDTH;
        for column in (strip.start + skip).min(d)..(strip.end + skip).min(d) {
            hint(piece(column));
        }
    }

    /// Copies the column pieces of `strip` into the tile.
    fn load_columns(&mut self, src: &ArrayView2<'_, A>, strip: Range<usize>) {
        let rows = self.rows;
        for (column, held) in strip.zip(&mut self.columns) {
            let piece = src.column(column);
            match piece.to_slice() {
                Some(piece) => copy_piece(&mut held[..rows], piece),
                None => held.iter_mut().zip(piece).for_each(|(h, &v)| *h = v),
            }
        }
    }

    /// Writes the tile into `strip` of the rows of `d` elements in `rows`.
    fn store_rows(&self, rows: &mut [A], d: usize, strip: Range<usize>) {
        let tile = self.columns.as_flattened();
        let rows = &mut rows[strip.start..];
        A::transpose_lines(
            self.isa,
            tile,
            MAX_BLOCK_ROWS,
            rows,
            d,
            strip.len(),
            self.rows,
        );
    }

    /// Reads `strip` of the rows of `d` elements in `rows` into the tile.
    fn load_rows(&mut self, rows: &[A], d: usize, strip: Range<usize>) {
        let tile = self.columns.as_flattened_mut();
        let rows = &rows[strip.start..];
        A::transpose_lines(
            self.isa,
            rows,
            d,
            tile,
            MAX_BLOCK_ROWS,
            self.rows,
            strip.len(),
        );
    }

    /// Writes the tile's columns into the column pieces of `strip` of `dst`.
    fn store_columns(&self, dst: &mut ArrayViewMut2<'_, A>, strip: Range<usize>) {
        let rows = self.rows;
        for (column, held) in strip.zip(&self.columns) {
            let mut piece = dst.column_mut(column);
            match piece.as_slice_mut() {
                Some(piece) => copy_piece(piece, &held[..rows]),
                None => piece.iter_mut().zip(held).for_each(|(p, &h)| *p = h),
            }
        }
    }
}

/// `dst.copy_from_slice(src)`, with the length known at compile time when it
/// is a full block's column piece, so that the copy is inlined rather than a
/// call.
#[inline(always)]
fn copy_piece<A: Copy>(dst: &mut [A], src: &[A]) {
    match (
        <&mut [A; MAX_BLOCK_ROWS]>::try_from(&mut *dst),
        <&[A; MAX_BLOCK_ROWS]>::try_from(src),
    ) {
        (Ok(dst), Ok(src)) => *dst = *src,
        _ => dst.copy_from_slice(src),
    }
}

/// Both operands of a job as two-dimensional views (`walk` only hands over
/// two-dimensional panels).
fn two_d<V, W>(a: Result<V, ndarray::ShapeError>, b: Result<W, ndarray::ShapeError>) -> (V, W) {
    match (a, b) {
        (Ok(a), Ok(b)) => (a, b),
        _ => unreachable!("the row walk hands over two-dimensional panels only"),
    }
}

/// `out[r] = kernel(x[r])`.
struct Map<'a, 'k, A> {
    x: ArrayView<'a, A, IxDyn>,
    out: ArrayViewMut<'a, A, IxDyn>,
    /// Whether output rows written where they lie are streamed.
    stream: bool,
    kernel: &'k RowKernel<'k, A>,
}

impl<A: NormScalar> Job for Map<'_, '_, A> {
    type Elem = A;

    fn shape(&self) -> &[usize] {
        self.x.shape()
    }

    fn walk_strides(&self) -> &[isize] {
        if rows_contiguous(self.x.shape(), self.x.strides()) {
            self.out.strides()
        } else {
            self.x.strides()
        }
    }

    fn permuted(self, perm: &[usize]) -> Self {
        Map {
            x: self.x.permuted_axes(perm),
            out: self.out.permuted_axes(perm),
            ..self
        }
    }

    fn split_at(self, axis: usize, index: usize) -> (Self, Self) {
        let (x1, x2) = self.x.split_at(Axis(axis), index);
        let (o1, o2) = self.out.split_at(Axis(axis), index);
        let (stream, kernel) = (self.stream, self.kernel);
        (
            Map {
                x: x1,
                out: o1,
                stream,
                kernel,
            },
            Map {
                x: x2,
                out: o2,
                stream,
                kernel,
            },
        )
    }

    fn for_each_outer(self, mut f: impl FnMut(Self)) {
        let (stream, kernel) = (self.stream, self.kernel);
        for (x, out) in self.x.into_outer_iter().zip(self.out.into_outer_iter_mut()) {
            f(Map {
                x,
                out,
                stream,
                kernel,
            });
        }
    }

    fn panel(self, block: usize, scratch: &mut Vec<A>) {
        let (x, mut out) = two_d(
            self.x.into_dimensionality::<Ix2>(),
            self.out.into_dimensionality::<Ix2>(),
        );
        let kernel = self.kernel;
        let d = x.ncols();
        let stream = self.stream;
        if let (Some(input), Some(output)) = (x.as_slice(), out.as_slice_mut()) {
            kernel(Io::separate(input, output, stream), x.nrows());
            return;
        }
        let gather_in = gathered(&x.view());
        let scatter_out = !rows_contiguous(out.shape(), out.strides());
        let prefetch = PanelPrefetch::new(&x, block);
        let ahead = RowsAhead::new(&x.view(), &out.view(), stream);
        for (index, (x, mut out)) in x
            .axis_chunks_iter(Axis(0), block)
            .zip(out.axis_chunks_iter_mut(Axis(0), block))
            .enumerate()
        {
            let next = prefetch.during(index, x.nrows());
            match (gather_in, scatter_out) {
                (false, false) => {
                    for (input, mut output) in x.rows().into_iter().zip(out.rows_mut()) {
                        ahead.hint(input.as_ptr(), output.as_ptr());
                        match (input.to_slice(), output.as_slice_mut()) {
                            (Some(input), Some(output)) => {
                                kernel(Io::separate(input, output, stream), 1)
                            }
                            _ => {
                                // Not reached: both rows were found contiguous.
                                let row = buffer(scratch, d);
                                gather(&input.insert_axis(Axis(0)), row);
                                kernel(Io::InPlace(row), 1);
                                scatter(row, &mut output.insert_axis(Axis(0)));
                            }
                        }
                    }
                }
                (true, false) if direct_rows::<A>(&x.view()) => {
                    // Short rows: gather straight into the output rows and
                    // normalise them there.
                    copy_block(&mut out, &x);
                    if let Some(rows) = out.as_slice_mut() {
                        // No hints for the next block here: on rows this
                        // short they cost more than they save
                        // (PERFORMANCE.md, "Strided hints").
                        in_groups(rows, d, &next.silenced(), kernel);
                        continue;
                    }
                    for mut output in out.rows_mut() {
                        match output.as_slice_mut() {
                            Some(output) => kernel(Io::InPlace(output), 1),
                            None => {
                                // Not reached: the output rows were found contiguous.
                                let row = buffer(scratch, d);
                                gather(&output.view().insert_axis(Axis(0)), row);
                                kernel(Io::InPlace(row), 1);
                                scatter(row, &mut output.insert_axis(Axis(0)));
                            }
                        }
                    }
                }
                (true, false) => {
                    let buf = buffer(scratch, x.len());
                    gather(&x, buf);
                    if let Some(output) = out.as_slice_mut() {
                        copies_in_groups(buf, output, d, &next, stream, kernel);
                        continue;
                    }
                    let rows = buf.chunks_exact(d).zip(out.rows_mut());
                    for (row, (input, mut output)) in rows.enumerate() {
                        next.ahead(row..row + 1);
                        match output.as_slice_mut() {
                            Some(output) => kernel(Io::separate(input, output, stream), 1),
                            None => {
                                // Not reached: the output rows were found contiguous.
                                let mut row = input.to_vec();
                                kernel(Io::InPlace(&mut row), 1);
                                scatter(&row, &mut output.insert_axis(Axis(0)));
                            }
                        }
                    }
                }
                (false, true) => {
                    let buf = buffer(scratch, x.len());
                    for (input, output) in x.rows().into_iter().zip(buf.chunks_exact_mut(d)) {
                        match input.to_slice() {
                            Some(input) => kernel(Io::Copy { input, output }, 1),
                            None => {
                                // Not reached: the input rows were found contiguous.
                                gather(&input.insert_axis(Axis(0)), output);
                                kernel(Io::InPlace(output), 1);
                            }
                        }
                    }
                    scatter(buf, &mut out);
                }
                (true, true) => {
                    let buf = buffer(scratch, x.len());
                    gather(&x, buf);
                    in_groups(buf, d, &next, kernel);
                    scatter(buf, &mut out);
                }
            }
        }
    }
}

/// `x[r] = kernel(x[r])`.
struct InPlace<'a, 'k, A> {
    x: ArrayViewMut<'a, A, IxDyn>,
    kernel: &'k RowKernel<'k, A>,
}

impl<A: NormScalar> Job for InPlace<'_, '_, A> {
    type Elem = A;

    fn shape(&self) -> &[usize] {
        self.x.shape()
    }

    fn walk_strides(&self) -> &[isize] {
        self.x.strides()
    }

    fn permuted(self, perm: &[usize]) -> Self {
        InPlace {
            x: self.x.permuted_axes(perm),
            kernel: self.kernel,
        }
    }

    fn split_at(self, axis: usize, index: usize) -> (Self, Self) {
        let (x1, x2) = self.x.split_at(Axis(axis), index);
        let kernel = self.kernel;
        (InPlace { x: x1, kernel }, InPlace { x: x2, kernel })
    }

    fn for_each_outer(self, mut f: impl FnMut(Self)) {
        let kernel = self.kernel;
        for x in self.x.into_outer_iter_mut() {
            f(InPlace { x, kernel });
        }
    }

    fn panel(self, block: usize, scratch: &mut Vec<A>) {
        let (mut x, ()) = two_d(self.x.into_dimensionality::<Ix2>(), Ok(()));
        let kernel = self.kernel;
        let d = x.ncols();
        let rows = x.nrows();
        if let Some(all) = x.as_slice_mut() {
            kernel(Io::InPlace(all), rows);
            return;
        }
        let gathered = gathered(&x.view());
        let prefetch = PanelPrefetch::new(&x.view(), block);
        let ahead = RowsAhead::new(&x.view(), &x.view(), false);
        for (index, mut x) in x.axis_chunks_iter_mut(Axis(0), block).enumerate() {
            let next = prefetch.during(index, x.nrows());
            if gathered {
                let buf = buffer(scratch, x.len());
                gather(&x.view(), buf);
                in_groups(buf, d, &next, kernel);
                scatter(buf, &mut x);
            } else {
                for mut row in x.rows_mut() {
                    ahead.hint(row.as_ptr(), row.as_ptr());
                    match row.as_slice_mut() {
                        Some(row) => kernel(Io::InPlace(row), 1),
                        None => {
                            // Not reached: the rows were found contiguous.
                            let tmp = buffer(scratch, d);
                            let mut row = row.insert_axis(Axis(0));
                            gather(&row.view(), tmp);
                            kernel(Io::InPlace(tmp), 1);
                            scatter(tmp, &mut row);
                        }
                    }
                }
            }
        }
    }
}

/// `(first[r], second[r]) = reduce(x[r])`.
struct Reduce<'a, 'k, A> {
    x: ArrayView<'a, A, IxDyn>,
    first: ArrayViewMut<'a, A, IxDyn>,
    second: ArrayViewMut<'a, A, IxDyn>,
    reduce: &'k RowReduction<'k, A>,
}

impl<A: NormScalar> Job for Reduce<'_, '_, A> {
    type Elem = A;

    fn shape(&self) -> &[usize] {
        self.x.shape()
    }

    fn walk_strides(&self) -> &[isize] {
        self.x.strides()
    }

    fn permuted(self, perm: &[usize]) -> Self {
        let leading = &perm[..perm.len() - 1];
        Reduce {
            x: self.x.permuted_axes(perm),
            first: self.first.permuted_axes(leading),
            second: self.second.permuted_axes(leading),
            reduce: self.reduce,
        }
    }

    fn split_at(self, axis: usize, index: usize) -> (Self, Self) {
        let (x1, x2) = self.x.split_at(Axis(axis), index);
        let (a1, a2) = self.first.split_at(Axis(axis), index);
        let (b1, b2) = self.second.split_at(Axis(axis), index);
        let reduce = self.reduce;
        (
            Reduce {
                x: x1,
                first: a1,
                second: b1,
                reduce,
            },
            Reduce {
                x: x2,
                first: a2,
                second: b2,
                reduce,
            },
        )
    }

    fn for_each_outer(self, mut f: impl FnMut(Self)) {
        let reduce = self.reduce;
        let outer = self
            .x
            .into_outer_iter()
            .zip(self.first.into_outer_iter_mut())
            .zip(self.second.into_outer_iter_mut());
        for ((x, first), second) in outer {
            f(Reduce {
                x,
                first,
                second,
                reduce,
            });
        }
    }

    fn panel(self, block: usize, scratch: &mut Vec<A>) {
        let (x, mut first) = two_d(
            self.x.into_dimensionality::<Ix2>(),
            self.first.into_dimensionality::<Ix1>(),
        );
        let (mut second, ()) = two_d(self.second.into_dimensionality::<Ix1>(), Ok(()));
        let reduce = self.reduce;
        let d = x.ncols();
        let gathered = !rows_contiguous(x.shape(), x.strides());
        let blocks = x
            .axis_chunks_iter(Axis(0), block)
            .zip(first.axis_chunks_iter_mut(Axis(0), block))
            .zip(second.axis_chunks_iter_mut(Axis(0), block));
        for ((x, mut first), mut second) in blocks {
            let results = first.iter_mut().zip(second.iter_mut());
            if gathered {
                let buf = buffer(scratch, x.len());
                gather(&x, buf);
                for (row, (a, b)) in buf.chunks_exact(d).zip(results) {
                    (*a, *b) = reduce(row);
                }
            } else {
                for (row, (a, b)) in x.rows().into_iter().zip(results) {
                    (*a, *b) = match row.to_slice() {
                        Some(row) => reduce(row),
                        None => {
                            // Not reached: the rows were found contiguous.
                            let tmp = buffer(scratch, d);
                            gather(&row.insert_axis(Axis(0)), tmp);
                            reduce(tmp)
                        }
                    };
                }
            }
        }
    }
}
