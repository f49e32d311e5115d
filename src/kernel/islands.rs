//! The kernel pieces that several places call, compiled once per vector
//! type and element type and called rather than inlined.
//!
//! Every kernel is inlined whole into its instruction set's trampoline, so
//! that the vector operations compile to single instructions. A piece that
//! several sites would inline (the loop over long rows, with a row's
//! statistics and its output loops for every kind of parameters and
//! output; the backward of a row from saved statistics) is instead an
//! [`Island`]: compiled once per vector type, in a function of its own with
//! the trampoline's target features, which each site calls (once per call
//! of the kernel, or per row in backward) (PERFORMANCE.md, "Build time").

use super::simd::{Portable, Vector};

/// A kernel piece compiled in a function of its own per vector type.
pub(crate) trait Island {
    /// What the piece takes.
    type Args<'a>;
    /// What it returns.
    type Output;
    /// The piece, compiled for `V` (inlined into [`Islands::island`]).
    fn run<V: Vector>(args: Self::Args<'_>) -> Self::Output;
}

/// Runs [`Island`]s compiled for one vector type.
///
/// Public only because [`Vector`] (reachable through
/// [`KernelScalar`](crate::scalar::KernelScalar)'s hidden methods) requires it; its
/// bound is crate-private, so no other crate can call or implement it.
#[allow(private_bounds, private_interfaces)]
pub trait Islands {
    /// `I::run` compiled for this vector type, called rather than inlined.
    fn island<I: Island>(args: I::Args<'_>) -> I::Output;
}

/// Declares the island function of the vector type `$vector` (a plain
/// function for the portable type, an `unsafe` target-feature function
/// for the x86 types) and implements [`Islands`] for it by calling it.
macro_rules! islands {
    ($(#[$attr:meta])* [$($unsafe:tt)?] $vector:ty) => {
        $(#[$attr])*
        #[inline(never)]
        pub(in crate::kernel) $($unsafe)? fn island<I: $crate::kernel::islands::Island>(
            args: I::Args<'_>,
        ) -> I::Output {
            I::run::<$vector>(args)
        }

        #[allow(private_bounds, private_interfaces, unused_unsafe)]
        impl $crate::kernel::islands::Islands for $vector {
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn island<I: $crate::kernel::islands::Island>(args: I::Args<'_>) -> I::Output {
                // SAFETY: where `island` is a target-feature function, a
                // value of its vector type only exists inside the
                // trampolines, which run after feature detection.
                unsafe { island::<I>(args) }
            }
        }
    };
}

pub(super) use islands;

mod portable_island {
    use super::*;

    islands!([] Portable);
}
