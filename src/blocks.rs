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

use ndarray::{ArrayRef, ArrayView1, ArrayViewD, ArrayViewMut1, ArrayViewMutD, Axis, Dimension};

/// Reads an array `rows` rows at a time.
pub(crate) struct RowBlocks<'a, A> {
    d: usize,
    source: Source<'a, A>,
    scratch: Vec<A>,
}

enum Source<'a, A> {
    Slice(&'a [A]),
    Rows(Box<dyn Iterator<Item = ArrayView1<'a, A>> + 'a>),
    Subarrays(Box<dyn Iterator<Item = ArrayViewD<'a, A>> + 'a>),
}

impl<'a, A: Copy + 'a> RowBlocks<'a, A> {
    /// Walks `x`, whose rows have length `d`.
    pub(crate) fn new<D: Dimension>(x: &'a ArrayRef<A, D>, d: usize) -> Self {
        let first = first_row_axis(x.shape(), d);
        let source = match x.as_slice() {
            Some(all) => Source::Slice(all),
            None if first + 1 >= x.ndim() => Source::Rows(Box::new(x.rows().into_iter())),
            None => Source::Subarrays(subarrays(x.view().into_dyn(), first)),
        };
        RowBlocks {
            d,
            source,
            scratch: Vec::new(),
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
            Source::Rows(iter) => {
                self.scratch.clear();
                for row in iter.take(rows) {
                    match row.as_slice() {
                        Some(row) => self.scratch.extend_from_slice(row),
                        None => self.scratch.extend(row.iter().copied()),
                    }
                }
                &self.scratch
            }
            Source::Subarrays(iter) => {
                self.scratch.clear();
                for row in iter.take(rows) {
                    gather(&mut self.scratch, &row);
                }
                &self.scratch
            }
        }
    }
}

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

/// The subarrays of `x` over its axes from `first` on, in logical order.
fn subarrays<'a, A>(
    x: ArrayViewD<'a, A>,
    first: usize,
) -> Box<dyn Iterator<Item = ArrayViewD<'a, A>> + 'a> {
    match first {
        0 => Box::new(std::iter::once(x)),
        _ => Box::new(
            x.into_outer_iter()
                .flat_map(move |inner| subarrays(inner, first - 1)),
        ),
    }
}

/// [`subarrays`] of a mutable view.
fn subarrays_mut<'a, A>(
    x: ArrayViewMutD<'a, A>,
    first: usize,
) -> Box<dyn Iterator<Item = ArrayViewMutD<'a, A>> + 'a> {
    match first {
        0 => Box::new(std::iter::once(x)),
        _ => Box::new(
            x.into_outer_iter_mut()
                .flat_map(move |inner| subarrays_mut(inner, first - 1)),
        ),
    }
}

/// Appends the elements of `row` in logical order, a lane of its last axis
/// at a time.
fn gather<A: Copy>(buf: &mut Vec<A>, row: &ArrayViewD<'_, A>) {
    if let Some(all) = row.as_slice() {
        buf.extend_from_slice(all);
        return;
    }
    for lane in row.lanes(Axis(row.ndim() - 1)) {
        match lane.as_slice() {
            Some(lane) => buf.extend_from_slice(lane),
            None => buf.extend(lane.iter().copied()),
        }
    }
}

/// Writes `values` over the elements of `row` in logical order.
fn scatter_into<A: Copy>(row: &mut ArrayViewMutD<'_, A>, values: &[A]) {
    let last = Axis(row.ndim() - 1);
    let lane_len = row.len_of(last).max(1);
    for (mut lane, values) in row.lanes_mut(last).into_iter().zip(values.chunks(lane_len)) {
        match lane.as_slice_mut() {
            Some(lane) => lane.copy_from_slice(values),
            None => lane.iter_mut().zip(values).for_each(|(out, &v)| *out = v),
        }
    }
}

/// Reads and writes an array `rows` rows at a time. A block handed out holds
/// the array's current values; what the caller leaves in it is the array's
/// new content once the next block is taken or the walker is dropped. Over
/// an array in standard layout, a block is the array's own memory and
/// nothing is copied, so a new output ([`crate::fresh`]) may be walked as
/// long as each block is written before it is read.
pub(crate) struct RowBlocksMut<'a, A: Copy> {
    d: usize,
    target: Target<'a, A>,
    scratch: Vec<A>,
}

enum Target<'a, A> {
    Slice(&'a mut [A]),
    Rows {
        rows: Box<dyn Iterator<Item = ArrayViewMut1<'a, A>> + 'a>,
        pending: Vec<ArrayViewMut1<'a, A>>,
    },
    Subarrays {
        rows: Box<dyn Iterator<Item = ArrayViewMutD<'a, A>> + 'a>,
        pending: Vec<ArrayViewMutD<'a, A>>,
    },
}

impl<'a, A: Copy + 'a> RowBlocksMut<'a, A> {
    /// Walks `x`, whose rows have length `d`.
    pub(crate) fn new<D: Dimension>(x: &'a mut ArrayRef<A, D>, d: usize) -> Self {
        // Tested before borrowing mutably: a borrow returned from one arm of
        // a `match` on `as_slice_mut` would still hold `x` in the other.
        let first = first_row_axis(x.shape(), d);
        let target = if x.as_slice().is_some() {
            Target::Slice(x.as_slice_mut().unwrap_or_default())
        } else if first + 1 >= x.ndim() {
            Target::Rows {
                rows: Box::new(x.rows_mut().into_iter()),
                pending: Vec::new(),
            }
        } else {
            Target::Subarrays {
                rows: subarrays_mut(x.view_mut().into_dyn(), first),
                pending: Vec::new(),
            }
        };
        RowBlocksMut {
            d,
            target,
            scratch: Vec::new(),
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
            Target::Rows {
                rows: iter,
                pending,
            } => {
                scatter(pending, &self.scratch, self.d);
                self.scratch.clear();
                for row in iter.take(rows) {
                    self.scratch.extend(row.iter().copied());
                    pending.push(row);
                }
                &mut self.scratch
            }
            Target::Subarrays {
                rows: iter,
                pending,
            } => {
                scatter_subarrays(pending, &self.scratch, self.d);
                self.scratch.clear();
                for row in iter.take(rows) {
                    gather(&mut self.scratch, &row.view());
                    pending.push(row);
                }
                &mut self.scratch
            }
        }
    }
}

/// Ending the walk writes the last block back.
impl<A: Copy> Drop for RowBlocksMut<'_, A> {
    fn drop(&mut self) {
        match &mut self.target {
            Target::Slice(_) => {}
            Target::Rows { pending, .. } => scatter(pending, &self.scratch, self.d),
            Target::Subarrays { pending, .. } => {
                scatter_subarrays(pending, &self.scratch, self.d);
            }
        }
    }
}

/// Writes the gathered subarrays back to where they came from.
fn scatter_subarrays<A: Copy>(pending: &mut Vec<ArrayViewMutD<'_, A>>, scratch: &[A], d: usize) {
    for (mut row, values) in pending.drain(..).zip(scratch.chunks(d.max(1))) {
        scatter_into(&mut row, values);
    }
}

/// Writes the gathered rows back to the rows they came from.
fn scatter<A: Copy>(pending: &mut Vec<ArrayViewMut1<'_, A>>, scratch: &[A], d: usize) {
    for (mut row, values) in pending.drain(..).zip(scratch.chunks(d.max(1))) {
        for (out, &v) in row.iter_mut().zip(values) {
            *out = v;
        }
    }
}
