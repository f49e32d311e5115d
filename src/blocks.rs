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

use ndarray::{ArrayRef, ArrayView1, ArrayViewMut1, Dimension};

/// Reads an array `rows` rows at a time.
pub(crate) struct RowBlocks<'a, A> {
    d: usize,
    source: Source<'a, A>,
    scratch: Vec<A>,
}

enum Source<'a, A> {
    Slice(&'a [A]),
    Rows(Box<dyn Iterator<Item = ArrayView1<'a, A>> + 'a>),
}

impl<'a, A: Copy + 'a> RowBlocks<'a, A> {
    /// Walks `x`, whose rows have length `d`.
    pub(crate) fn new<D: Dimension>(x: &'a ArrayRef<A, D>, d: usize) -> Self {
        let source = match x.as_slice() {
            Some(all) => Source::Slice(all),
            None => Source::Rows(Box::new(x.rows().into_iter())),
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
}

impl<'a, A: Copy + 'a> RowBlocksMut<'a, A> {
    /// Walks `x`, whose rows have length `d`.
    pub(crate) fn new<D: Dimension>(x: &'a mut ArrayRef<A, D>, d: usize) -> Self {
        // Tested before borrowing mutably: a borrow returned from one arm of
        // a `match` on `as_slice_mut` would still hold `x` in the other.
        let target = if x.as_slice().is_some() {
            Target::Slice(x.as_slice_mut().unwrap_or_default())
        } else {
            Target::Rows {
                rows: Box::new(x.rows_mut().into_iter()),
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
        }
    }
}

/// Ending the walk writes the last block back.
impl<A: Copy> Drop for RowBlocksMut<'_, A> {
    fn drop(&mut self) {
        if let Target::Rows { pending, .. } = &mut self.target {
            scatter(pending, &self.scratch, self.d);
        }
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
