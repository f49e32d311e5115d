//! The kernel pieces that several places call, compiled once per vector
//! type and element type and called rather than inlined.
//!
//! Every kernel is inlined whole into its instruction set's trampoline, so
//! that the vector operations compile to single instructions. A piece that
//! several sites would inline (the loop over long rows, with a row's
//! statistics and its output loops for every kind of parameters and
//! output; the backward of a row from saved statistics) is instead
//! compiled once, in a function of its own with the same target features,
//! and each site calls it: one call per block of rows, or per row in
//! backward, against a build that would otherwise hold each loop several
//! times over (PERFORMANCE.md, "Build time").

use super::backward::{self, Partials, RowAhead, RowCentring, RowInputs, RowScaling};
use super::portable::Store;
use super::short;
use super::simd::Portable;
use super::{Io, Params};
use crate::scalar::NormScalar;

/// The islands of one vector type; see the module docs.
///
/// Public only because [`Vector`](super::simd::Vector) (reachable through
/// [`NormScalar`]'s hidden methods) requires it; its signatures use
/// crate-private types, so no other crate can call or implement it.
#[allow(private_interfaces, private_bounds)]
pub trait Islands {
    /// LayerNorm of rows longer than 16 elements:
    /// [`short::layer_norm_long_rows`].
    fn layer_norm_long_rows<A: NormScalar>(
        io: Io<'_, A>,
        d: usize,
        params: Params<'_, A>,
        eps: f64,
    );
    /// RMSNorm of rows longer than 16 elements: [`short::rms_norm_long_rows`].
    fn rms_norm_long_rows<A: NormScalar>(io: Io<'_, A>, d: usize, params: Params<'_, A>, eps: f64);
    /// LayerNorm backward of a row from its statistics:
    /// [`backward::layer_norm_backward_saved_pass`].
    fn layer_norm_backward_saved<A: NormScalar, S: Store>(
        row: RowInputs<'_, A>,
        dx: &mut [A],
        stats: RowCentring,
        ahead: RowAhead,
        partials: &mut Partials,
    );
    /// RMSNorm backward of a row from its statistics:
    /// [`backward::rms_norm_backward_saved_pass`].
    fn rms_norm_backward_saved<A: NormScalar, S: Store>(
        row: RowInputs<'_, A>,
        dx: &mut [A],
        stats: RowScaling,
        ahead: RowAhead,
        partials: &mut Partials,
    );
}

/// Declares the island functions of `$vector` in the current module (plain
/// functions for the portable type, `unsafe` target-feature functions for
/// the x86 types) and implements [`Islands`] for it by calling them.
macro_rules! islands {
    ($(#[$attr:meta])* [$($unsafe:tt)?] $vector:ty) => {
        $(#[$attr])*
        #[inline(never)]
        pub(in crate::kernel) $($unsafe)? fn layer_norm_long_rows<A: NormScalar>(
            io: Io<'_, A>,
            d: usize,
            params: Params<'_, A>,
            eps: f64,
        ) {
            short::layer_norm_long_rows::<A, $vector>(io, d, params, eps)
        }

        $(#[$attr])*
        #[inline(never)]
        pub(in crate::kernel) $($unsafe)? fn rms_norm_long_rows<A: NormScalar>(
            io: Io<'_, A>,
            d: usize,
            params: Params<'_, A>,
            eps: f64,
        ) {
            short::rms_norm_long_rows::<A, $vector>(io, d, params, eps)
        }

        $(#[$attr])*
        #[inline(never)]
        pub(in crate::kernel) $($unsafe)? fn layer_norm_backward_saved<A: NormScalar, S: Store>(
            row: RowInputs<'_, A>,
            dx: &mut [A],
            stats: RowCentring,
            ahead: RowAhead,
            partials: &mut Partials,
        ) {
            backward::layer_norm_backward_saved_pass::<A, $vector, S>(row, dx, stats, ahead, partials)
        }

        $(#[$attr])*
        #[inline(never)]
        pub(in crate::kernel) $($unsafe)? fn rms_norm_backward_saved<A: NormScalar, S: Store>(
            row: RowInputs<'_, A>,
            dx: &mut [A],
            stats: RowScaling,
            ahead: RowAhead,
            partials: &mut Partials,
        ) {
            backward::rms_norm_backward_saved_pass::<A, $vector, S>(row, dx, stats, ahead, partials)
        }

        // SAFETY (of every `unsafe` block below, where the functions are
        // `unsafe`): a value of an x86 vector type only exists inside its
        // trampolines, which run after feature detection.
        #[allow(private_interfaces, private_bounds, unused_unsafe)]
        impl Islands for $vector {
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn layer_norm_long_rows<A: NormScalar>(
                io: Io<'_, A>,
                d: usize,
                params: Params<'_, A>,
                eps: f64,
            ) {
                // SAFETY: see above.
                unsafe { layer_norm_long_rows(io, d, params, eps) }
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn rms_norm_long_rows<A: NormScalar>(
                io: Io<'_, A>,
                d: usize,
                params: Params<'_, A>,
                eps: f64,
            ) {
                // SAFETY: see above.
                unsafe { rms_norm_long_rows(io, d, params, eps) }
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn layer_norm_backward_saved<A: NormScalar, S: Store>(
                row: RowInputs<'_, A>,
                dx: &mut [A],
                stats: RowCentring,
                ahead: RowAhead,
                partials: &mut Partials,
            ) {
                // SAFETY: see above.
                unsafe { layer_norm_backward_saved::<A, S>(row, dx, stats, ahead, partials) }
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn rms_norm_backward_saved<A: NormScalar, S: Store>(
                row: RowInputs<'_, A>,
                dx: &mut [A],
                stats: RowScaling,
                ahead: RowAhead,
                partials: &mut Partials,
            ) {
                // SAFETY: see above.
                unsafe { rms_norm_backward_saved::<A, S>(row, dx, stats, ahead, partials) }
            }
        }
    };
}

pub(super) use islands;

mod portable_islands {
    use super::*;

    islands!([] Portable);
}
