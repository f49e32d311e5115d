//! Block walks over two or three arrays of one shape: hand the kernels
//! consecutive rows as one contiguous slice in logical (row-major) order,
//! whatever the memory layout.
//!
//! A contiguous array is sliced in place; any other layout is gathered into
//! a scratch buffer (and, for outputs, scattered back), so every layout
//! reaches the kernels with the same values in the same order. Rows are
//! always visited in logical order: unlike `Zip`, which may follow the
//! memory order, that order is what the per-feature sums over rows depend
//! on.
//!
//! A row is the vector along the last axis, or, for the `_over` forms, the
//! axes from some `Axis(a)` on taken together in row-major order: the walks
//! find them from the row length `d`, the product of the last axes' lengths.
//! The array is cut into panels of one leading axis, its last, so that the
//! rows of the panels, one panel after the other, are in logical order;
//! a block of rows is copied a run within a panel at a time by the gathered
//! walk's copies ([`crate::rows::GatheredWalks`]).

use std::ops::{Deref, Range};

use ndarray::{ArrayRef, ArrayViewD, ArrayViewMutD, Axis, Dimension, IxDyn, Slice};

use crate::rows::{keep_buffer, panels, take_buffer, Panel, Reorder, RowLayout};
use crate::scalar::NormScalar;

/// The first axis of the rows of `d` elements of an array of `shape`: the
/// last axes whose lengths multiply to `d`.
pub(crate) fn first_row_axis(shape: &[usize], d: usize) -> usize {
    let mut elements = 1;
    for (axis, &len) in shape.iter().enumerate().rev() {
        elements *= len;
        if elements == d {
            return axis;
        }
    }
    0
}

/// The panels of an array (views whose first axis is the last leading one
/// and whose other axes are a row's), in logical order, and the next row.
struct Cursor<V> {
    panels: Vec<V>,
    layout: RowLayout,
    /// Rows per panel.
    panel_rows: usize,
    /// The panel and the row in it where the next block starts.
    next: (usize, usize),
}

impl<V> Cursor<V> {
    /// The runs of rows (panel, rows in it) of the next block of `rows`
    /// rows (fewer at the end).
    fn take(&mut self, rows: usize) -> Vec<(usize, Range<usize>)> {
        let mut runs = Vec::new();
        let mut left = rows;
        while left > 0 && self.next.0 < self.panels.len() {
            let (panel, row) = self.next;
            let count = left.min(self.panel_rows - row);
            runs.push((panel, row..row + count));
            left -= count;
            self.next = if row + count == self.panel_rows {
                (panel + 1, 0)
            } else {
                (panel, row + count)
            };
        }
        runs
    }
}

/// `x` (a view with rows of `d` elements, not empty) cut into panels in
/// logical order, with the layout of their rows.
fn cursor<A: NormScalar, V>(x: V, d: usize) -> Cursor<V>
where
    V: Panel + Reorder + Deref<Target = ArrayRef<A, IxDyn>>,
{
    let mut first = first_row_axis(x.shape(), d);
    let mut x = x;
    // Leading axes that merge into the last one, in logical order, make
    // longer panels; leading axes of length 1 index nothing.
    for take in (0..first.saturating_sub(1)).rev() {
        if !x.merge(take, first - 1) {
            break;
        }
    }
    for axis in (0..first).rev() {
        if x.len_of(Axis(axis)) == 1 {
            x = x.without_axis(axis);
            first -= 1;
        }
    }
    let x = if first == 0 { x.with_block_axis() } else { x };
    let first = first.max(1);
    let panel_rows = x.len_of(Axis(first - 1));
    let mut all = Vec::new();
    panels(x, first, &mut all);
    let layout = A::row_layout(&all[0].view());
    Cursor {
        panels: all,
        layout,
        panel_rows,
        next: (0, 0),
    }
}

/// Reads an array `rows` rows at a time.
pub(crate) struct RowBlocks<'a, A: NormScalar> {
    d: usize,
    source: Source<'a, A>,
    scratch: Vec<A>,
    spare: Vec<A>,
}

enum Source<'a, A> {
    Slice(&'a [A]),
    Panels(Cursor<ArrayViewD<'a, A>>),
}

impl<'a, A: NormScalar> RowBlocks<'a, A> {
    /// Walks `x`, whose rows have length `d`.
    pub(crate) fn new<D: Dimension>(x: &'a ArrayRef<A, D>, d: usize) -> Self {
        let source = match x.as_slice() {
            Some(all) => Source::Slice(all),
            None if x.is_empty() => Source::Slice(&[]),
            None => Source::Panels(cursor(x.view().into_dyn(), d)),
        };
        let gathers = matches!(source, Source::Panels(_));
        RowBlocks {
            d,
            source,
            scratch: if gathers { take_buffer() } else { Vec::new() },
            spare: if gathers { take_buffer() } else { Vec::new() },
        }
    }

    /// The next `rows` rows (fewer at the end, none after it), one after the
    /// other.
    pub(crate) fn next_block(&mut self, rows: usize) -> &[A] {
        match &mut self.source {
            Source::Slice(rest) => {
                let (head, tail) = rest.split_at(rows.saturating_mul(self.d).min(rest.len()));
                *rest = tail;
                head
            }
            Source::Panels(cursor) => {
                let runs = cursor.take(rows);
                let len = gather_runs(cursor, &runs, self.d, &mut self.scratch, &mut self.spare);
                &self.scratch[..len]
            }
        }
    }
}

/// Reads and writes an array `rows` rows at a time. A block handed out holds
/// the array's current values; what the caller leaves in it is the array's
/// new content once the next block is taken or the walker is dropped. Over
/// an array in standard layout, a block is the array's own memory and
/// nothing is copied, so a new output ([`crate::fresh`]) may be walked as
/// long as each block is written before it is read.
pub(crate) struct RowBlocksMut<'a, A: NormScalar> {
    d: usize,
    target: Target<'a, A>,
    scratch: Vec<A>,
    spare: Vec<A>,
}

enum Target<'a, A> {
    Slice(&'a mut [A]),
    Panels {
        cursor: Cursor<ArrayViewMutD<'a, A>>,
        /// The runs of the block handed out last.
        pending: Vec<(usize, Range<usize>)>,
    },
}

impl<'a, A: NormScalar> RowBlocksMut<'a, A> {
    /// Walks `x`, whose rows have length `d`.
    pub(crate) fn new<D: Dimension>(x: &'a mut ArrayRef<A, D>, d: usize) -> Self {
        // Tested before borrowing mutably: a borrow returned from one arm of
        // a `match` on `as_slice_mut` would still hold `x` in the other.
        let target = if x.as_slice().is_some() || x.is_empty() {
            Target::Slice(x.as_slice_mut().unwrap_or_default())
        } else {
            Target::Panels {
                cursor: cursor(x.view_mut().into_dyn(), d),
                pending: Vec::new(),
            }
        };
        let gathers = matches!(target, Target::Panels { .. });
        RowBlocksMut {
            d,
            target,
            scratch: if gathers { take_buffer() } else { Vec::new() },
            spare: if gathers { take_buffer() } else { Vec::new() },
        }
    }

    /// The next `rows` rows (fewer at the end, none after it), one after the
    /// other.
    pub(crate) fn next_block(&mut self, rows: usize) -> &mut [A] {
        match &mut self.target {
            Target::Slice(rest) => {
                let all = std::mem::take(rest);
                let len = rows.saturating_mul(self.d).min(all.len());
                let (head, tail) = all.split_at_mut(len);
                *rest = tail;
                head
            }
            Target::Panels { cursor, pending } => {
                write_back(cursor, pending, &self.scratch, &mut self.spare);
                *pending = cursor.take(rows);
                let len = gather_runs(cursor, pending, self.d, &mut self.scratch, &mut self.spare);
                &mut self.scratch[..len]
            }
        }
    }
}

/// Ending the walk writes the last block back, and keeps the buffers.
impl<A: NormScalar> Drop for RowBlocksMut<'_, A> {
    fn drop(&mut self) {
        if let Target::Panels { cursor, pending } = &mut self.target {
            write_back(cursor, pending, &self.scratch, &mut self.spare);
            keep_buffer(std::mem::take(&mut self.scratch));
            keep_buffer(std::mem::take(&mut self.spare));
        }
    }
}

/// Ending the walk keeps the buffers.
impl<A: NormScalar> Drop for RowBlocks<'_, A> {
    fn drop(&mut self) {
        if matches!(self.source, Source::Panels(_)) {
            keep_buffer(std::mem::take(&mut self.scratch));
            keep_buffer(std::mem::take(&mut self.spare));
        }
    }
}

/// Gathers the rows (of `d` elements) of `runs` into the front of `scratch` (grown as
/// needed, never shrunk), one after the other; returns their element count.
fn gather_runs<A: NormScalar, V: Deref<Target = ArrayRef<A, IxDyn>>>(
    cursor: &Cursor<V>,
    runs: &[(usize, Range<usize>)],
    d: usize,
    scratch: &mut Vec<A>,
    spare: &mut Vec<A>,
) -> usize {
    let len = runs.iter().map(|(_, range)| range.len()).sum::<usize>() * d;
    if scratch.len() < len {
        scratch.resize(len, A::zero());
    }
    // Pieces of at most `PIECE_ROWS` rows, each with its part of `scratch`.
    let mut pieces = Vec::new();
    let mut rest = &mut scratch[..len];
    for (panel, range) in runs {
        for start in range.clone().step_by(PIECE_ROWS) {
            let rows = start..(start + PIECE_ROWS).min(range.end);
            let (buf, tail) = std::mem::take(&mut rest).split_at_mut(rows.len() * d);
            rest = tail;
            let block = cursor.panels[*panel].slice_axis(Axis(0), Slice::from(rows));
            pieces.push((block, buf));
        }
    }
    // A wave of blocks of the training and backward walks (more than one
    // block's rows) is gathered by the pool, a piece per task.
    let parallel = len > PIECE_ROWS * d;
    A::gather_pieces(pieces, &cursor.layout, parallel, spare);
    len
}

/// Rows gathered by one task of a parallel gather: one backward block.
const PIECE_ROWS: usize = 64;

/// Writes the rows of the `pending` runs, gathered in `scratch`, back to
/// their panels.
fn write_back<A: NormScalar>(
    cursor: &mut Cursor<ArrayViewMutD<'_, A>>,
    pending: &mut Vec<(usize, Range<usize>)>,
    scratch: &[A],
    spare: &mut Vec<A>,
) {
    let mut at = 0;
    for (panel, range) in pending.drain(..) {
        let mut block = cursor.panels[panel].slice_axis_mut(Axis(0), Slice::from(range));
        let len = block.len();
        A::scatter_rows(&scratch[at..at + len], &cursor.layout, &mut block, spare);
        at += len;
    }
}
