//! Target-feature trampolines for x86-64: the portable kernels compiled with
//! AVX2 or AVX-512 enabled. Each trampoline only calls the portable
//! function, whose body (all `#[inline(always)]`) is then generated for those
//! features.

pub(super) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

pub(super) fn has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512bw")
}

macro_rules! trampolines {
    ($features:literal) => {
        use super::super::portable;
        use super::super::{Affine, Io};
        use crate::scalar::NormScalar;

        /// # Safety
        /// The CPU must support the module's target features.
        #[target_feature(enable = $features)]
        pub(in crate::kernel) unsafe fn layer_norm_row<A: NormScalar>(
            io: Io<'_, A>,
            affine: Affine<'_, A>,
            eps: f64,
        ) {
            portable::layer_norm_row(io, affine, eps)
        }

        /// # Safety
        /// The CPU must support the module's target features.
        #[target_feature(enable = $features)]
        pub(in crate::kernel) unsafe fn rms_norm_row<A: NormScalar>(
            io: Io<'_, A>,
            affine: Affine<'_, A>,
            eps: f64,
        ) {
            portable::rms_norm_row(io, affine, eps)
        }

        /// # Safety
        /// The CPU must support the module's target features.
        #[target_feature(enable = $features)]
        pub(in crate::kernel) unsafe fn row_stats<A: NormScalar>(x: &[A]) -> (f64, f64) {
            portable::row_stats(x)
        }
    };
}

pub(super) mod avx2 {
    trampolines!("avx2");
}

pub(super) mod avx512 {
    trampolines!("avx512f,avx512vl,avx512dq,avx512bw");
}
