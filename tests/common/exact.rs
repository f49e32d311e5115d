//! The exact reference of the accuracy tests, shared with the tests of the
//! forms over several axes. Every finite `f64` is an integer multiple of
//! 2⁻¹⁰⁷⁴, so the statistics and outputs are exact rationals of big
//! integers (see `tests/accuracy.rs`), evaluated to about 2⁻⁶² relative
//! error before one final rounding to `f64`.
#![allow(dead_code)]

use num_bigint::{BigInt, BigUint, Sign};

pub const SCALE_BITS: u64 = 1074;

/// `x · 2¹⁰⁷⁴` as an exact integer.
pub fn exact(x: f64) -> BigInt {
    assert!(x.is_finite());
    let bits = x.to_bits();
    let exponent = ((bits >> 52) & 0x7ff) as i64;
    let fraction = bits & ((1u64 << 52) - 1);
    let (mantissa, shift) = if exponent == 0 {
        (fraction, 0)
    } else {
        (fraction | (1u64 << 52), exponent - 1)
    };
    let magnitude = BigUint::from(mantissa) << (shift as usize);
    let sign = if x.is_sign_negative() {
        Sign::Minus
    } else {
        Sign::Plus
    };
    BigInt::from_biguint(sign, magnitude)
}

/// `q · 2^exp2` rounded to `f64` (relative error below 2⁻⁵²).
pub fn to_f64(q: &BigUint, exp2: i64) -> f64 {
    let bits = q.bits() as i64;
    if bits == 0 {
        return 0.0;
    }
    let shift = (bits - 64).max(0);
    let top = q >> (shift as usize);
    let digits = top.to_u64_digits();
    let head = digits.first().copied().unwrap_or(0) as f64;
    // Multiply by 2^(shift + exp2) in steps that stay exact.
    let mut value = head;
    let mut k = shift + exp2;
    while k > 0 {
        let step = k.min(1000);
        value *= 2f64.powi(step as i32);
        k -= step;
    }
    while k < 0 {
        let step = (-k).min(1000);
        value *= 2f64.powi(-(step as i32));
        k += step;
    }
    value
}

/// `sign · √(num / den)` to about 2⁻⁶² relative error, rounded to `f64`.
pub fn signed_root_of_ratio(sign: Sign, num: &BigUint, den: &BigUint) -> f64 {
    if num.bits() == 0 {
        return 0.0;
    }
    // Choose p so that √(num · 2^2p / den) has about 80 bits.
    let p = 80 - (num.bits() as i64 - den.bits() as i64) / 2;
    let (scaled_num, scaled_den) = if p >= 0 {
        (num << (2 * p as usize), den.clone())
    } else {
        (num.clone(), den << (-2 * p) as usize)
    };
    let root = (scaled_num / scaled_den).sqrt();
    let magnitude = to_f64(&root, -p);
    if sign == Sign::Minus {
        -magnitude
    } else {
        magnitude
    }
}

pub fn exact_layer_norm(x: &[f64], eps: f64) -> Vec<f64> {
    let d = BigInt::from(x.len());
    let xs: Vec<BigInt> = x.iter().map(|&v| exact(v)).collect();
    let sum: BigInt = xs.iter().sum();
    let devs: Vec<BigInt> = xs.iter().map(|xi| &d * xi - &sum).collect();
    let squares: BigInt = devs.iter().map(|n| n * n).sum();
    let denominator = squares + exact(eps) * &d * &d * &d * (BigInt::from(1) << SCALE_BITS);
    let den = denominator.magnitude();
    devs.iter()
        .map(|n| {
            let num = n.magnitude() * n.magnitude() * d.magnitude();
            signed_root_of_ratio(n.sign(), &num, den)
        })
        .collect()
}

pub fn exact_rms_norm(x: &[f64], eps: f64) -> Vec<f64> {
    let d = BigInt::from(x.len());
    let xs: Vec<BigInt> = x.iter().map(|&v| exact(v)).collect();
    let squares: BigInt = xs.iter().map(|v| v * v).sum();
    let denominator = squares + exact(eps) * &d * (BigInt::from(1) << SCALE_BITS);
    let den = denominator.magnitude();
    xs.iter()
        .map(|v| {
            let num = v.magnitude() * v.magnitude() * d.magnitude();
            if den.bits() == 0 {
                0.0 // all-zero row, eps = 0: defined as 0
            } else {
                signed_root_of_ratio(v.sign(), &num, den)
            }
        })
        .collect()
}

pub fn exact_stats(x: &[f64]) -> (f64, f64) {
    let d = BigUint::from(x.len());
    let xs: Vec<BigInt> = x.iter().map(|&v| exact(v)).collect();
    let sum: BigInt = xs.iter().sum();
    let p = 80 - (sum.bits() as i64 - d.bits() as i64);
    let scaled = if p >= 0 {
        sum.magnitude() << (p as usize)
    } else {
        sum.magnitude() >> ((-p) as usize)
    };
    let mean_magnitude = to_f64(&(scaled / &d), -p - SCALE_BITS as i64);
    let mean = if sum.sign() == Sign::Minus {
        -mean_magnitude
    } else {
        mean_magnitude
    };
    let squares: BigInt = xs.iter().map(|v| v * v).sum();
    let den = &d << (2 * SCALE_BITS as usize);
    let rms = signed_root_of_ratio(Sign::Plus, squares.magnitude(), &den);
    (mean, rms)
}

/// `1/√(var + eps)` of a row, from the same exact rationals.
pub fn exact_rstd(x: &[f64], eps: f64) -> f64 {
    let d = BigInt::from(x.len());
    let xs: Vec<BigInt> = x.iter().map(|&v| exact(v)).collect();
    let sum: BigInt = xs.iter().sum();
    let squares: BigInt = xs.iter().map(|xi| (&d * xi - &sum).pow(2)).sum();
    let cube = &d * &d * &d;
    let denominator = squares + exact(eps) * &cube * (BigInt::from(1) << SCALE_BITS);
    let numerator = cube << (2 * SCALE_BITS as usize);
    if denominator.bits() == 0 {
        return f64::INFINITY; // a constant row with eps = 0
    }
    signed_root_of_ratio(Sign::Plus, numerator.magnitude(), denominator.magnitude())
}
