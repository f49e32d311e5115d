//! The kernel pieces that many places call, compiled once per vector type
//! and element type and called rather than inlined.
//!
//! Every kernel is inlined whole into its instruction set's trampoline, so
//! that the vector operations compile to single instructions. A piece that
//! a dozen sites would inline (the output pass of a row, with its loops
//! for every kind of parameters and output, and the statistics of a long
//! row) is instead compiled once, in a function of its own with the same
//! target features, and each site calls it: one call per row, against
//! a build that would otherwise hold each loop a dozen times over.

use super::backward::{self, Partials, RowAhead, RowCentring, RowInputs, RowScaling};
use super::cache::Ahead;
use super::portable::{self, Centring, Store};
use super::simd::Portable;
use super::{Io, Params};
use crate::scalar::NormScalar;

/// The long-row pieces of one vector type; see the module docs.
///
/// Public only because [`Vector`](super::simd::Vector) (reachable through
/// [`NormScalar`]'s hidden methods) requires it; its signatures use
/// crate-private types, so no other crate can call or implement it.
#[allow(private_interfaces, private_bounds)]
pub trait Islands {
    /// LayerNorm statistics of one row: [`portable::centring`].
    fn centring<A: NormScalar>(x: &[A], eps: f64) -> Centring;
    /// RMSNorm scale of one row: [`portable::rms_scaling`].
    fn rms_scaling<A: NormScalar>(x: &[A], eps: f64) -> Option<(f64, f64)>;
    /// LayerNorm's output pass: [`portable::write_layer_norm_pass`].
    fn write_layer_norm<A: NormScalar>(
        io: Io<'_, A>,
        params: Params<'_, A>,
        centring: Centring,
        ahead: Ahead,
    );
    /// RMSNorm's output pass: [`portable::write_rms_norm_pass`].
    fn write_rms_norm<A: NormScalar>(
        io: Io<'_, A>,
        params: Params<'_, A>,
        scaling: Option<(f64, f64)>,
        ahead: Ahead,
    );
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

/// Declares the island functions of a vector type: plain functions for the
/// portable type, `unsafe` target-feature functions for the x86 types.
macro_rules! islands {
    ($(#[$attr:meta])* [$($unsafe:tt)?] $vector:ty) => {
        $(#[$attr])*
        #[inline(never)]
        pub(in crate::kernel) $($unsafe)? fn centring<A: NormScalar>(x: &[A], eps: f64) -> Centring {
            portable::centring::<A, $vector>(x, eps)
        }

        $(#[$attr])*
        #[inline(never)]
        pub(in crate::kernel) $($unsafe)? fn rms_scaling<A: NormScalar>(
            x: &[A],
            eps: f64,
        ) -> Option<(f64, f64)> {
            portable::rms_scaling::<A, $vector>(x, eps)
        }

        $(#[$attr])*
        #[inline(never)]
        pub(in crate::kernel) $($unsafe)? fn write_layer_norm<A: NormScalar>(
            io: Io<'_, A>,
            params: Params<'_, A>,
            centring: Centring,
            ahead: Ahead,
        ) {
            portable::write_layer_norm_pass::<A, $vector>(io, params, centring, ahead)
        }

        $(#[$attr])*
        #[inline(never)]
        pub(in crate::kernel) $($unsafe)? fn write_rms_norm<A: NormScalar>(
            io: Io<'_, A>,
            params: Params<'_, A>,
            scaling: Option<(f64, f64)>,
            ahead: Ahead,
        ) {
            portable::write_rms_norm_pass::<A, $vector>(io, params, scaling, ahead)
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
    };
}

pub(super) use islands;

mod portable_islands {
    use super::*;

    islands!([] Portable);
}

#[allow(private_interfaces, private_bounds)]
impl Islands for Portable {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn centring<A: NormScalar>(x: &[A], eps: f64) -> Centring {
        portable_islands::centring(x, eps)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn rms_scaling<A: NormScalar>(x: &[A], eps: f64) -> Option<(f64, f64)> {
        portable_islands::rms_scaling(x, eps)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn write_layer_norm<A: NormScalar>(
        io: Io<'_, A>,
        params: Params<'_, A>,
        centring: Centring,
        ahead: Ahead,
    ) {
        portable_islands::write_layer_norm(io, params, centring, ahead)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn write_rms_norm<A: NormScalar>(
        io: Io<'_, A>,
        params: Params<'_, A>,
        scaling: Option<(f64, f64)>,
        ahead: Ahead,
    ) {
        portable_islands::write_rms_norm(io, params, scaling, ahead)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn layer_norm_backward_saved<A: NormScalar, S: Store>(
        row: RowInputs<'_, A>,
        dx: &mut [A],
        stats: RowCentring,
        ahead: RowAhead,
        partials: &mut Partials,
    ) {
        portable_islands::layer_norm_backward_saved::<A, S>(row, dx, stats, ahead, partials)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn rms_norm_backward_saved<A: NormScalar, S: Store>(
        row: RowInputs<'_, A>,
        dx: &mut [A],
        stats: RowScaling,
        ahead: RowAhead,
        partials: &mut Partials,
    ) {
        portable_islands::rms_norm_backward_saved::<A, S>(row, dx, stats, ahead, partials)
    }
}
