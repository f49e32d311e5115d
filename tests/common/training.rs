//! Helpers of the training tests: strategies, bit comparison and
//! reference statistics.

#![allow(dead_code)] // each test file uses a different subset

use ndarray::{Array1, Array2, ArrayRef, Dimension};
use proptest::prelude::*;

/// A `rows × d` array of values in `range`, for `rows` in `1..=max_rows` and
/// `d` in `1..=max_d`.
pub fn matrix(
    max_rows: usize,
    max_d: usize,
    range: std::ops::Range<f64>,
) -> impl Strategy<Value = Array2<f64>> {
    (1..=max_rows, 1..=max_d).prop_flat_map(move |(rows, d)| {
        proptest::collection::vec(range.clone(), rows * d)
            .prop_map(move |v| Array2::from_shape_vec((rows, d), v).unwrap())
    })
}

/// A vector of `d` values in `range`.
pub fn vector(d: usize, range: std::ops::Range<f64>) -> impl Strategy<Value = Array1<f64>> {
    proptest::collection::vec(range, d).prop_map(Array1::from)
}

/// The bits of every element, so that NaN, -0.0 and +0.0 compare exactly.
pub fn bits64<D: Dimension>(a: &ArrayRef<f64, D>) -> Vec<u64> {
    a.iter().map(|v| v.to_bits()).collect()
}

/// The bits of every element.
pub fn bits32<D: Dimension>(a: &ArrayRef<f32, D>) -> Vec<u32> {
    a.iter().map(|v| v.to_bits()).collect()
}

/// Mean and `1/√(var + eps)` of one row by the textbook two-pass formula.
pub fn mean_rstd(row: &[f64], eps: f64) -> (f64, f64) {
    let d = row.len() as f64;
    let mean = row.iter().sum::<f64>() / d;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d;
    (mean, 1.0 / (var + eps).sqrt())
}

/// The population standard deviation of one row.
pub fn std_dev(row: &[f64]) -> f64 {
    let (_, rstd) = mean_rstd(row, 0.0);
    1.0 / rstd
}

/// A deterministic pseudo-random sequence in `[-1, 1)` (64-bit LCG), for
/// tests that need more values than proptest should generate.
pub fn noise(seed: u64, n: usize) -> Vec<f64> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64) / ((1u64 << 52) as f64) - 1.0
        })
        .collect()
}
