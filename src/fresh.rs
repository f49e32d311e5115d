//! New output arrays that the row walks fill, allocated without zeroing.
//!
//! A zeroed allocation (`Array::zeros`, that is `calloc`) of memory the
//! allocator reuses is a `memset` of the whole output before the kernel
//! writes it again: one more pass over the output bytes, which leaves an
//! allocating call well behind the same call into a preallocated output.
//! Every allocating form therefore writes into uninitialised memory, which
//! the row walks overwrite element by element before anything reads it
//! (PERFORMANCE.md, "Contiguous arrays").

use std::mem::MaybeUninit;

use ndarray::{Array, ArrayRef, Dimension};

use crate::error::NormError;
use crate::scalar::NormScalar;

/// A new array in standard layout whose elements are not written yet.
pub(crate) struct Fresh<A, D: Dimension>(Array<MaybeUninit<A>, D>);

impl<A: NormScalar, D: Dimension> Fresh<A, D> {
    /// Allocates the array, or reports that the memory cannot be had
    /// (rather than aborting the process, as a failed allocation otherwise
    /// does).
    pub(crate) fn new(shape: D) -> Result<Self, NormError> {
        let mut storage = reserved::<MaybeUninit<A>>(shape.size())?;
        // SAFETY: the capacity holds `shape.size()` elements, and a
        // `MaybeUninit` needs no initialisation.
        unsafe { storage.set_len(shape.size()) };
        if cfg!(debug_assertions) {
            storage.fill(MaybeUninit::new(A::nan()));
        }
        // SAFETY: the vector holds exactly `shape.size()` elements, the
        // length of an array of `shape` in standard layout.
        Ok(Fresh(unsafe {
            Array::from_shape_vec_unchecked(shape, storage)
        }))
    }

    /// The array, with every element written by `fill`; returns it with what
    /// `fill` returns.
    ///
    /// `fill` must write every element and must not read an element before
    /// it has written it. Debug builds (and so the tests) start from NaN in
    /// every element rather than from whatever the memory held, so that an
    /// element left unwritten, or read before it is written, shows as NaN in
    /// the output.
    pub(crate) fn fill_and<R>(
        self,
        fill: impl FnOnce(&mut ArrayRef<A, D>) -> R,
    ) -> (Array<A, D>, R) {
        let mut out = self.0;
        // SAFETY: `out` is an owned array in standard layout, so its raw view
        // covers exactly its own storage, aligned for `A` (`MaybeUninit<A>` has
        // the layout of `A`), and nothing else refers to it while the view
        // lives (it ends with `fill`). Its elements are not initialised yet:
        // this relies on a reference to uninitialised memory being sound as
        // long as nothing reads through it before writing, an assumption the
        // language has not settled either way. `fill` only writes before it
        // reads (the contract above; the row walks write each output row whole
        // before anything reads it).
        let result = fill(&mut unsafe { out.raw_view_mut().cast::<A>().deref_into_view_mut() });
        // SAFETY: `fill` has written every element (the contract above).
        (unsafe { out.assume_init() }, result)
    }

    /// [`Fresh::fill_and`] without a result of `fill`.
    pub(crate) fn fill(self, fill: impl FnOnce(&mut ArrayRef<A, D>)) -> Array<A, D> {
        self.fill_and(fill).0
    }
}

/// A new array of `shape` in standard layout, every element of which
/// `fill` writes ([`Fresh::fill_and`]).
pub(crate) fn array<A: NormScalar, D: Dimension>(
    shape: D,
    fill: impl FnOnce(&mut ArrayRef<A, D>),
) -> Result<Array<A, D>, NormError> {
    Ok(Fresh::new(shape)?.fill(fill))
}

/// [`array()`], with what `fill` returns.
pub(crate) fn array_and<A: NormScalar, D: Dimension, R>(
    shape: D,
    fill: impl FnOnce(&mut ArrayRef<A, D>) -> R,
) -> Result<(Array<A, D>, R), NormError> {
    Ok(Fresh::new(shape)?.fill_and(fill))
}

/// A new array of `shape` with every element `value`, or
/// [`NormError::OutOfMemory`].
pub(crate) fn filled<T: Clone, D: Dimension>(shape: D, value: T) -> Result<Array<T, D>, NormError> {
    let mut storage = reserved::<T>(shape.size())?;
    storage.resize(shape.size(), value);
    // SAFETY: the vector holds exactly `shape.size()` elements, the length
    // of an array of `shape` in standard layout.
    Ok(unsafe { Array::from_shape_vec_unchecked(shape, storage) })
}

/// An empty vector with room for exactly `elements` elements, or
/// [`NormError::OutOfMemory`].
pub(crate) fn reserved<T>(elements: usize) -> Result<Vec<T>, NormError> {
    let mut storage = Vec::new();
    storage
        .try_reserve_exact(elements)
        .map_err(|_| NormError::OutOfMemory {
            elements,
            element_size: size_of::<T>(),
        })?;
    Ok(storage)
}
