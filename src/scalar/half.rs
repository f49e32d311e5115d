//! `half::f16` and `half::bf16` as element types: their rows are computed
//! by the `f32` kernels ([`Kernels::Compute`](crate::kernel::Kernels)).

use std::borrow::Cow;

use half::{bf16, f16};
use ndarray::{ArrayRef, Dimension};

use super::{NormEps, NormParam, NormScalar};
use crate::check;
use crate::error::NormError;

/// `value` rounded to `f32` toward zero, with the last bit set if that
/// lost anything ("round to odd"), where `value` stands for `hi + lo`
/// with `|lo|` at most half an ulp of `hi`. Rounding this once more to a
/// type of at most 11 significant bits (both half types) gives the
/// correctly rounded `hi + lo`: `f32` carries more than two bits beyond
/// them, also in the subnormal range of `bf16`, which is that of `f32`.
fn round_to_odd(hi: f64, lo: f64) -> f32 {
    if !hi.is_finite() {
        return hi as f32;
    }
    let nearest = hi as f32;
    let back = f64::from(nearest);
    // The exact value's distance from `nearest`, by sign: `hi` is the
    // double nearest it, so `hi` and `lo` settle the side.
    let above = if back == hi { lo > 0.0 } else { hi > back };
    let below = if back == hi { lo < 0.0 } else { hi < back };
    if !above && !below {
        return nearest;
    }
    // Truncate toward zero: step back from `nearest` if it lies beyond.
    let beyond = if nearest > 0.0 || (nearest == 0.0 && above) {
        below
    } else {
        above
    };
    let truncated = if (beyond && nearest != 0.0) || nearest.is_infinite() {
        f32::from_bits(nearest.to_bits() - 1)
    } else {
        nearest
    };
    let bits = if truncated == 0.0 {
        // Below the smallest subnormal: the odd neighbour of zero, with the
        // value's sign (that of `hi`, or of `lo` where `hi` is 0).
        let negative = if hi != 0.0 { hi < 0.0 } else { lo < 0.0 };
        if negative {
            (1 << 31) | 1
        } else {
            1
        }
    } else {
        truncated.to_bits() | 1
    };
    f32::from_bits(bits)
}

macro_rules! half_scalar {
    ($($half:ident),*) => {$(
        impl NormScalar for $half {
            type Eps = f64;

            fn widen(self) -> f64 {
                f64::from(self.to_f32())
            }
            fn narrow(value: f64) -> Self {
                $half::from_f32(round_to_odd(value, 0.0))
            }
            fn narrow_sum(hi: f64, lo: f64) -> Self {
                $half::from_f32(round_to_odd(hi, lo))
            }
            fn kept_eps(eps: f64) -> f64 {
                eps
            }
            fn kept_eps_value(eps: f64) -> f64 {
                eps
            }
        }

        impl NormParam<$half> for $half {
            fn to_compute<E: Dimension>(
                v: &ArrayRef<$half, E>,
            ) -> Result<Cow<'_, [f32]>, NormError> {
                let mut wide = crate::fresh::reserved(v.len())?;
                wide.extend(v.iter().map(|value| value.to_f32()));
                Ok(Cow::Owned(wide))
            }
            fn narrow_grad(value: f64) -> $half {
                <$half as NormScalar>::narrow(value)
            }
        }

        impl NormParam<f32> for $half {
            fn to_compute<E: Dimension>(v: &ArrayRef<f32, E>) -> Result<Cow<'_, [f32]>, NormError> {
                check::logical_order(v)
            }
            fn narrow_grad(value: f64) -> f32 {
                <f32 as NormScalar>::narrow(value)
            }
        }

        impl NormEps<$half> for $half {
            fn eps_value(eps: $half) -> f64 {
                eps.widen()
            }
        }

        impl NormEps<f32> for $half {
            fn eps_value(eps: f32) -> f64 {
                f64::from(eps)
            }
        }

        impl NormEps<f64> for $half {
            fn eps_value(eps: f64) -> f64 {
                eps
            }
        }
    )*};
}

half_scalar!(f16, bf16);

#[cfg(test)]
mod tests {
    use super::*;

    /// For every pair of neighbouring finite values of `H` (all 2¹⁶ bit
    /// patterns), points just short of and just beyond their midpoint,
    /// given through `hi` alone or through `lo`, round as exact arithmetic
    /// says: toward the nearer neighbour.
    fn check_midpoints<H: NormScalar>(from_bits: fn(u16) -> H) {
        for bits in 0..u16::MAX {
            let (a, b) = (from_bits(bits).widen(), from_bits(bits + 1).widen());
            if !a.is_finite() || !b.is_finite() || a.is_sign_negative() != b.is_sign_negative() {
                continue;
            }
            let mid = (a + b) / 2.0;
            let nudge = mid.abs() * f64::EPSILON;
            let (near_a, near_b) = if a < b {
                (-nudge, nudge)
            } else {
                (nudge, -nudge)
            };
            let same = |got: H, want: f64| {
                assert_eq!(got.widen().to_bits(), want.to_bits(), "between {a} and {b}")
            };
            same(H::narrow(mid + near_a), a);
            same(H::narrow(mid + near_b), b);
            same(H::narrow_sum(mid, near_a / 4.0), a);
            same(H::narrow_sum(mid, near_b / 4.0), b);
            // Exactly at the midpoint: ties to even.
            let even = if bits % 2 == 0 { a } else { b };
            same(H::narrow(mid), even);
        }
    }

    /// Values below the smallest `f32` subnormal keep their sign: they round
    /// to a zero of that sign in both half types.
    #[test]
    fn values_below_every_subnormal_keep_their_sign() {
        for (hi, lo) in [
            (1e-45, 0.0),
            (-1e-45, 0.0),
            (2f64.powi(-149), -1e-60),
            (0.0, 1e-300),
            (0.0, -1e-300),
        ] {
            let negative = if hi != 0.0 { hi < 0.0 } else { lo < 0.0 };
            for got in [
                f16::narrow_sum(hi, lo).to_f64(),
                bf16::narrow_sum(hi, lo).to_f64(),
            ] {
                assert_eq!(got, 0.0, "{hi:e} + {lo:e}");
                assert_eq!(got.is_sign_negative(), negative, "{hi:e} + {lo:e}");
            }
        }
    }

    #[test]
    fn f16_narrowing_rounds_correctly_at_every_midpoint() {
        check_midpoints(f16::from_bits);
    }

    #[test]
    fn bf16_narrowing_rounds_correctly_at_every_midpoint() {
        check_midpoints(bf16::from_bits);
    }
}
