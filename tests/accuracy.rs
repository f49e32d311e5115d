//! Accuracy against an exact reference.
//!
//! Every finite `f64` (and so every `f32`) is an integer multiple of 2⁻¹⁰⁷⁴,
//! so with `Xᵢ = xᵢ · 2¹⁰⁷⁴` (an exact big integer), `S = Σ Xᵢ`,
//! `Nᵢ = d·Xᵢ - S` and `E = eps · 2¹⁰⁷⁴`:
//!
//! ```text
//! LayerNorm:  yᵢ² = Nᵢ² · d / (Σ Nⱼ² + E · d³ · 2¹⁰⁷⁴)
//! RMSNorm:    yᵢ² = Xᵢ² · d / (Σ Xⱼ²  + E · d  · 2¹⁰⁷⁴)
//! mean = S / (d · 2¹⁰⁷⁴),   rms² = Σ Xⱼ² / (d · 2²¹⁴⁸)
//! ```
//!
//! are exact rationals. The reference evaluates them with big integers and
//! an integer square root to about 2⁻⁶² relative error before one final
//! rounding to `f64`, so it is independent of every floating-point choice the
//! crate makes.

use ndarray::{Array1, Array2};
use ndarray_layernorm::prelude::*;
#[path = "common/exact.rs"]
mod exact;

use exact::{exact, exact_layer_norm, exact_rms_norm, exact_stats};
use num_bigint::{BigInt, BigUint};

/// The unit in the last place of `f32` at `truth` rounded to `f32`.
fn f32_ulp_at(truth: f64) -> f64 {
    let rounded = truth as f32;
    if rounded == 0.0 {
        f32::from_bits(1) as f64
    } else {
        let next = f32::from_bits(rounded.abs().to_bits() + 1) as f64;
        next - rounded.abs() as f64
    }
}

/// Distance in units in the last place of `f32` at `truth`.
fn f32_ulps(got: f32, truth: f64) -> f64 {
    (got as f64 - truth).abs() / f32_ulp_at(truth)
}

/// Relative error, measured against `max(|truth|, floor)`.
fn relative(got: f64, truth: f64, floor: f64) -> f64 {
    if got == truth {
        0.0
    } else {
        (got - truth).abs() / truth.abs().max(floor)
    }
}

/// SplitMix64: a tiny deterministic generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn signed_unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Adversarial row families, as `f64` values that are also exact `f32`
/// values when `as_f32` is set.
fn family(rng: &mut Rng, kind: usize, d: usize, as_f32: bool) -> Vec<f64> {
    let round = |v: f64| if as_f32 { v as f32 as f64 } else { v };
    (0..d)
        .map(|_| match kind {
            // Moderate values, mixed signs.
            0 => round(3.0 * rng.signed_unit()),
            // Huge common offset with small noise: 1e8 + noise for f32,
            // 1e12 + noise for f64.
            1 => {
                let offset = if as_f32 { 1e8 } else { 1e12 };
                round(offset + 50.0 * rng.signed_unit())
            }
            // Magnitudes from 1e-30 to 1e30, mixed signs.
            2 => {
                let exponent = rng.below(61) as i32 - 30;
                round(rng.signed_unit() * 10f64.powi(exponent))
            }
            // Near-constant: a few units in the last place around 1.5.
            3 => {
                let base = if as_f32 {
                    1.5f32.to_bits() as u64
                } else {
                    1.5f64.to_bits()
                };
                let v = base + rng.below(4);
                if as_f32 {
                    f32::from_bits(v as u32) as f64
                } else {
                    f64::from_bits(v)
                }
            }
            // Negative offset, noise of one sign.
            4 => round(-1e4 - rng.signed_unit().abs()),
            // Integers at the very edge of the significand: 2⁵² + k for
            // f64 (2²³ + k for f32), where the mean's rounding is as large
            // as the spread itself.
            _ => {
                let edge = if as_f32 {
                    8_388_608.0
                } else {
                    4_503_599_627_370_496.0
                };
                edge + rng.below(3) as f64
            }
        })
        .collect()
}

const FAMILIES: usize = 6;
const F64_TOLERANCE: f64 = 2e-15;
const DIMS: [usize; 7] = [1, 2, 3, 7, 64, 129, 1000];
const EPSILONS: [f64; 3] = [0.0, 1e-5, 1.0];

#[test]
fn f32_layer_norm_is_within_one_ulp() {
    let mut rng = Rng(1);
    let mut worst = 0.0f64;
    for kind in 0..FAMILIES {
        for &d in &DIMS {
            for &eps in &EPSILONS {
                for _ in 0..3 {
                    let row = family(&mut rng, kind, d, true);
                    let x = Array1::from_iter(row.iter().map(|&v| v as f32));
                    let got = x.layer_norm_plain(eps as f32).unwrap();
                    let truth = exact_layer_norm(&row, eps as f32 as f64);
                    for (&g, &t) in got.iter().zip(&truth) {
                        let ulps = f32_ulps(g, t);
                        worst = worst.max(ulps);
                        assert!(
                            ulps <= 1.0,
                            "kind {kind} d {d} eps {eps}: {g} vs {t} ({ulps} ulp)"
                        );
                    }
                }
            }
        }
    }
    println!("worst f32 LayerNorm error: {worst:.3} ulp");
}

#[test]
fn f32_rms_norm_and_stats_are_within_one_ulp() {
    let mut rng = Rng(2);
    for kind in 0..FAMILIES {
        for &d in &DIMS {
            for &eps in &EPSILONS {
                let row = family(&mut rng, kind, d, true);
                let x = Array1::from_iter(row.iter().map(|&v| v as f32));
                let got = x.rms_norm_plain(eps as f32).unwrap();
                let truth = exact_rms_norm(&row, eps as f32 as f64);
                for (&g, &t) in got.iter().zip(&truth) {
                    let ulps = f32_ulps(g, t);
                    assert!(
                        ulps <= 1.0,
                        "kind {kind} d {d} eps {eps}: {g} vs {t} ({ulps} ulp)"
                    );
                }
            }
            let row = family(&mut rng, kind, d, true);
            let x = Array2::from_shape_fn((1, d), |(_, j)| row[j] as f32);
            let (mean, rms) = x.stats().unwrap();
            let (true_mean, true_rms) = exact_stats(&row);
            assert!(
                f32_ulps(mean[0], true_mean) <= 1.0,
                "mean {} vs {true_mean}",
                mean[0]
            );
            assert!(
                f32_ulps(rms[0], true_rms) <= 1.0,
                "rms {} vs {true_rms}",
                rms[0]
            );
        }
    }
}

/// `f64`: every output within 2e-15 relative error of the true value
/// (about nine units in the last place), as the docs promise.
#[test]
fn f64_layer_norm_keeps_full_accuracy() {
    let mut rng = Rng(3);
    let mut worst = 0.0f64;
    for kind in 0..FAMILIES {
        for &d in &DIMS {
            for &eps in &EPSILONS {
                let row = family(&mut rng, kind, d, false);
                let got = Array1::from(row.clone()).layer_norm_plain(eps).unwrap();
                let truth = exact_layer_norm(&row, eps);
                for (&g, &t) in got.iter().zip(&truth) {
                    let err = relative(g, t, 0.0);
                    worst = worst.max(err);
                    assert!(
                        err <= F64_TOLERANCE,
                        "kind {kind} d {d} eps {eps}: {g} vs {t}"
                    );
                }
            }
        }
    }
    println!("worst f64 LayerNorm error: {worst:e}");
}

#[test]
fn f64_offset_rows_keep_the_noise() {
    // 1e12 + noise: a naive mean(x²) - mean² loses every digit here.
    let mut rng = Rng(4);
    for &d in &[16, 768, 4096] {
        let row: Vec<f64> = (0..d).map(|_| 1e12 + rng.signed_unit()).collect();
        let got = Array1::from(row.clone()).layer_norm_plain(0.0).unwrap();
        let truth = exact_layer_norm(&row, 0.0);
        for (&g, &t) in got.iter().zip(&truth) {
            assert!(relative(g, t, 0.0) <= F64_TOLERANCE, "d {d}: {g} vs {t}");
        }
    }
}

/// An `eps` near `f64::MAX` next to a variance of 1e306: `var + eps`
/// overflows although both are finite, and once made every output 0.
#[test]
fn f64_eps_whose_sum_with_the_variance_overflows() {
    for &d in &[1, 2, 3, 5, 16, 17, 18, 100] {
        for &eps in &[f64::MAX, 1.7e308, f64::MAX / 2.0] {
            let row: Vec<f64> = (0..d)
                .map(|i| if i % 2 == 0 { 1e153 } else { -9e152 })
                .collect();
            let x = Array1::from(row.clone());
            let got = x.layer_norm_plain(eps).unwrap();
            for (&g, &t) in got.iter().zip(&exact_layer_norm(&row, eps)) {
                assert!(
                    relative(g, t, 0.0) <= F64_TOLERANCE,
                    "d {d} eps {eps}: {g} vs {t}"
                );
            }
            let got = x.rms_norm_plain(eps).unwrap();
            for (&g, &t) in got.iter().zip(&exact_rms_norm(&row, eps)) {
                assert!(
                    relative(g, t, 0.0) <= F64_TOLERANCE,
                    "RMS d {d} eps {eps}: {g} vs {t}"
                );
            }
        }
    }
}

/// `[0, 1, …, d - 1]` for odd `d`: the middle element is the mean, so its
/// output is exactly 0 (and its gradient's `x̂` too), though `Σ xᵢ / d`
/// rounded through `1 / d` misses it for some `d` (`1176 · (1 / 49)` is
/// `24 - 2⁻⁴⁸`).
#[test]
fn the_middle_of_a_symmetric_row_is_exactly_zero() {
    for d in (3..400).step_by(2) {
        let row: Vec<f64> = (0..d).map(|i| i as f64).collect();
        let truth = exact_layer_norm(&row, 1e-5);
        assert_eq!(truth[d / 2], 0.0);
        let x = Array2::from_shape_vec((1, d), row.clone()).unwrap();
        let got = x.layer_norm_plain(1e-5).unwrap();
        assert_eq!(got[[0, d / 2]].to_bits(), 0, "d {d}: {}", got[[0, d / 2]]);
        let narrow = x.mapv(|v| v as f32).layer_norm_plain(1e-5).unwrap();
        assert_eq!(narrow[[0, d / 2]].to_bits(), 0, "f32, d {d}");
        // One row: dγⱼ = dyⱼ · x̂ⱼ.
        let ones = Array2::ones((1, d));
        let grads = x
            .layer_norm_backward(&ones, &Array1::ones(d), 1e-5)
            .unwrap();
        assert_eq!(grads.dgamma[d / 2].to_bits(), 0, "dγ, d {d}");
        for (&g, &t) in got.iter().zip(&truth) {
            assert!(relative(g, t, 0.0) <= F64_TOLERANCE, "d {d}: {g} vs {t}");
        }
    }
}

/// Rows `[v, (d - 1) · v, t, 0, …]` with `t` far below an ulp of `v`: the
/// sum `d · v + t` is exact, the mean `v + t / d` a hair from the element
/// `v`, whose output `-t / d / std` needs the mean's tail to its own
/// accuracy, not to an ulp of the mean. (Where the first rounded quotient
/// is an ulp off `v`, a split that kept it lost every digit of that
/// output; this test failed that way before the quotient was moved to the
/// double nearest the mean.)
#[test]
fn an_element_a_hair_from_the_mean_keeps_its_accuracy() {
    let mut rng = Rng(11);
    let dims = [3, 5, 6, 7, 11, 13, 17, 49, 100, 1000];
    for round in 0..60 {
        for &d in &dims {
            // A significand of 40 bits (f64) or 12 (f32), so that
            // `(d - 1) · v` and `d · v` are exact.
            let bits = if round % 2 == 0 { 40 } else { 12 };
            let significand = (1u64 << bits) + rng.below(1 << bits);
            let exponent = rng.below(40) as i32 - 20 - bits;
            let v = significand as f64 * 2f64.powi(exponent);
            let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
            let t = sign * v * 2f64.powi(-60 - rng.below(40) as i32);
            let mut row = vec![0.0; d];
            row[0] = v;
            row[1] = (d - 1) as f64 * v;
            row[2] = t as f32 as f64;
            let truth = exact_layer_norm(&row, 0.0);
            if bits == 40 {
                let got = Array1::from(row.clone()).layer_norm_plain(0.0).unwrap();
                for (&g, &t) in got.iter().zip(&truth) {
                    assert!(relative(g, t, 0.0) <= F64_TOLERANCE, "{row:?}: {g} vs {t}");
                }
                let (mean, _) = Array2::from_shape_vec((1, d), row.clone())
                    .unwrap()
                    .stats()
                    .unwrap();
                let (true_mean, _) = exact_stats(&row);
                assert!(
                    relative(mean[0], true_mean, 0.0) <= F64_TOLERANCE,
                    "{row:?}"
                );
            } else {
                let x = Array1::from_iter(row.iter().map(|&v| v as f32));
                let got = x.layer_norm_plain(0.0).unwrap();
                for (&g, &t) in got.iter().zip(&truth) {
                    assert!(f32_ulps(g, t) <= 1.0, "{row:?}: {g} vs {t}");
                }
            }
        }
    }
}

#[test]
fn f64_rows_whose_squares_overflow_or_underflow() {
    let mut rng = Rng(5);
    for &magnitude in &[1e200, 1e300, 1.7e308, 1e-200, 1e-300, 1e-310] {
        for &d in &[2, 5, 64, 333] {
            let row: Vec<f64> = (0..d).map(|_| magnitude * rng.signed_unit()).collect();
            let x = Array1::from(row.clone());
            for (got, truth) in [
                (
                    x.layer_norm_plain(0.0).unwrap(),
                    exact_layer_norm(&row, 0.0),
                ),
                (x.rms_norm_plain(0.0).unwrap(), exact_rms_norm(&row, 0.0)),
            ] {
                for (&g, &t) in got.iter().zip(&truth) {
                    assert!(
                        relative(g, t, 0.0) <= F64_TOLERANCE,
                        "{magnitude} d {d}: {g} vs {t}"
                    );
                }
            }
            let (mean, rms) = x.view().insert_axis(ndarray::Axis(0)).stats().unwrap();
            let (true_mean, true_rms) = exact_stats(&row);
            // Subnormal means carry fewer significant bits: there, allow one
            // unit of 2⁻¹⁰⁷⁴ per element instead.
            let mean_tolerance = (1e-15 * true_mean.abs()).max(d as f64 * f64::from_bits(1));
            assert!(
                (mean[0] - true_mean).abs() <= mean_tolerance,
                "{} vs {true_mean}",
                mean[0]
            );
            assert!(
                relative(rms[0], true_rms, 0.0) <= F64_TOLERANCE,
                "{} vs {true_rms}",
                rms[0]
            );
        }
    }
    // With eps = 1e-5 the tiny rows are dominated by eps: y = dev / √eps,
    // about 1e-198, and every output keeps its own relative accuracy.
    let row: Vec<f64> = (0..50).map(|_| 1e-200 * rng.signed_unit()).collect();
    let got = Array1::from(row.clone()).layer_norm_plain(1e-5).unwrap();
    let truth = exact_layer_norm(&row, 1e-5);
    for (&g, &t) in got.iter().zip(&truth) {
        assert!(relative(g, t, 0.0) <= F64_TOLERANCE, "{g} vs {t}");
    }
}

/// Rows near the subnormal range keep their accuracy whatever `eps`: their
/// mean's parts would lose digits to underflow, even where `eps` hides the
/// variance. Outputs may be subnormal, so the tolerance has an absolute
/// part of two units of 2⁻¹⁰⁷⁴ (the reference rounds twice there).
#[test]
fn f64_tiny_rows_keep_their_mean_whatever_eps() {
    let mut rng = Rng(11);
    let unit = f64::from_bits(1);
    for &magnitude in &[1e-280, 1e-300, 1e-310, 1e-320] {
        for &d in &[2, 3, 5, 16, 17, 64, 333] {
            let row: Vec<f64> = (0..d).map(|_| magnitude * rng.signed_unit()).collect();
            let x = Array1::from(row.clone());
            for &eps in &[1e-240, 1e-200, 1e-5, 1.0] {
                let truth = exact_layer_norm(&row, eps);
                // The training forward takes the statistics that backward
                // saves and recomputes: the same rescaling must reach them.
                let (trained, _) = x
                    .layer_norm_train(&Array1::ones(d), &Array1::zeros(d), eps)
                    .unwrap();
                for got in [x.layer_norm_plain(eps).unwrap(), trained] {
                    for (&g, &t) in got.iter().zip(&truth) {
                        assert!(
                            (g - t).abs() <= F64_TOLERANCE * t.abs() + 2.0 * unit,
                            "{magnitude:e} d {d} eps {eps:e}: {g:e} vs {t:e}"
                        );
                    }
                }
            }
        }
    }
    // The smallest subnormal next to zero: the mean is 2⁻¹⁰⁷⁵, half a unit,
    // so the deviations are ±2⁻¹⁰⁷⁵ and, with var = 2⁻²¹⁵⁰ hidden by
    // eps = 1e-200, the outputs ±2⁻¹⁰⁷⁵ / √1e-200 = ±2⁻¹⁰⁷⁴ · 1e100 / 2.
    let got = ndarray::array![unit, 0.0].layer_norm_plain(1e-200).unwrap();
    let expected = unit * 1e100 / 2.0;
    for (&g, sign) in got.iter().zip([1.0, -1.0]) {
        assert!(
            (g - sign * expected).abs() <= 1e-15 * expected,
            "{g} vs {}",
            sign * expected
        );
    }
}

/// A row whose elements are far above the subnormal range can still have
/// a mean below it: `[v, -v, t, 0, …]` with `t` subnormal. The outputs near
/// the mean, `-(t / d) / std` and `(t - t / d) / std`, are normal numbers,
/// and keep the relative accuracy of every other output.
#[test]
fn f64_rows_whose_mean_is_far_below_their_elements() {
    let mut rng = Rng(31);
    let unit = f64::from_bits(1);
    // Rows of magnitude 1 or more are not scaled down for their mean's
    // sake, which would make their small elements subnormal.
    let large = [2f64.powi(100), 2f64.powi(102), 1.0];
    let near_tiny = [2f64.powi(-500), 2f64.powi(-890), 3.0 * 2f64.powi(-901)];
    let small = [1e-60, 1e-150, 1e-250, 1e-290];
    for &v in small.iter().chain(&large).chain(&near_tiny) {
        for &d in &[3, 4, 5, 16, 17, 64, 100, 512] {
            for &t in &[
                unit,
                3.0 * unit,
                1e-320,
                1e-310,
                1e-300,
                1.973317922366116e-279,
            ] {
                let mut row = vec![0.0; d];
                row[0] = v * (1.0 + rng.signed_unit() / 4.0);
                row[1] = -row[0];
                row[2] = t;
                for i in (1..d).rev() {
                    row.swap(i, rng.below(i as u64 + 1) as usize);
                }
                let x = Array1::from(row.clone());
                // A large eps makes the outputs small; scaled up, they
                // would be subnormal.
                for &eps in &[0.0, 1e-200, 0.5, 1e20, 1e300] {
                    let truth = exact_layer_norm(&row, eps);
                    let (trained, _) = x
                        .layer_norm_train(&Array1::ones(d), &Array1::zeros(d), eps)
                        .unwrap();
                    // Many rows at once take the short kernel's quick test.
                    let rows =
                        Array2::from_shape_fn(
                            (17, d),
                            |(r, j)| if r == 5 { row[j] } else { j as f64 },
                        );
                    for got in [
                        x.layer_norm_plain(eps).unwrap(),
                        trained,
                        rows.layer_norm_plain(eps).unwrap().row(5).to_owned(),
                    ] {
                        for (&g, &t) in got.iter().zip(&truth) {
                            assert!(
                                (g - t).abs() <= F64_TOLERANCE * t.abs() + 2.0 * unit,
                                "{row:?} eps {eps:e}: {g:e} vs {t:e}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// With a shift `beta`, LayerNorm's output is `n · gamma + beta` formed in
/// `f64`: within the final rounding (one `f32` ulp, or 2e-15 relative for
/// `f64`) plus 2e-15 of `|n · gamma|` of the true value, also where `beta`
/// cancels most of `n · gamma`. The reference adds the exact `n`, rounded to
/// `f64`, to `beta` with two roundings of `2⁻⁵³ · |n · gamma|` at most,
/// which the tolerance allows for besides.
#[test]
fn shifted_outputs_stay_within_the_stated_bound() {
    let mut rng = Rng(12);
    for kind in 0..FAMILIES {
        for &d in &[2, 3, 7, 64, 129] {
            let row = family(&mut rng, kind, d, true);
            let n = exact_layer_norm(&row, 0.0);
            // Beta cancels the leading digits of element `j`'s n · gamma.
            let j = rng.below(d as u64) as usize;
            let gamma: Vec<f32> = (0..d)
                .map(|_| (1.0 + 0.5 * rng.signed_unit()) as f32)
                .collect();
            let beta: Vec<f32> = (0..d)
                .map(|k| {
                    let product = n[k] * f64::from(gamma[k]);
                    if k == j {
                        -product as f32
                    } else {
                        (0.1 * rng.signed_unit()) as f32
                    }
                })
                .collect();
            let x32 = Array1::from_iter(row.iter().map(|&v| v as f32));
            let got32 = x32
                .layer_norm(
                    &Array1::from(gamma.clone()),
                    &Array1::from(beta.clone()),
                    0.0,
                )
                .unwrap();
            let x64 = Array1::from(row.clone());
            let gamma64 = Array1::from_iter(gamma.iter().map(|&g| f64::from(g)));
            let beta64 = Array1::from_iter(beta.iter().map(|&b| f64::from(b)));
            let got64 = x64.layer_norm(&gamma64, &beta64, 0.0).unwrap();
            for k in 0..d {
                let product = (n[k] * gamma64[k]).abs();
                let truth = n[k] * gamma64[k] + beta64[k];
                let slack = (2e-15 + 5e-16) * product;
                let error32 = (f64::from(got32[k]) - truth).abs();
                assert!(
                    error32 <= f32_ulp_at(truth) + slack,
                    "f32 kind {kind} d {d} k {k}: {} vs {truth:e}",
                    got32[k]
                );
                let error64 = (got64[k] - truth).abs();
                assert!(
                    error64 <= F64_TOLERANCE * truth.abs() + slack,
                    "f64 kind {kind} d {d} k {k}: {:e} vs {truth:e}",
                    got64[k]
                );
            }
        }
    }
}

#[test]
fn f64_rms_norm_and_stats() {
    let mut rng = Rng(6);
    for kind in 0..FAMILIES {
        for &d in &DIMS {
            for &eps in &EPSILONS {
                let row = family(&mut rng, kind, d, false);
                let got = Array1::from(row.clone()).rms_norm_plain(eps).unwrap();
                let truth = exact_rms_norm(&row, eps);
                for (&g, &t) in got.iter().zip(&truth) {
                    assert!(
                        relative(g, t, 0.0) <= F64_TOLERANCE,
                        "kind {kind} d {d}: {g} vs {t}"
                    );
                }
            }
            let row = family(&mut rng, kind, d, false);
            let (mean, rms) = Array2::from_shape_vec((1, d), row.clone())
                .unwrap()
                .stats()
                .unwrap();
            let (true_mean, true_rms) = exact_stats(&row);
            assert!(
                relative(mean[0], true_mean, 0.0) <= 1e-15,
                "{} vs {true_mean}",
                mean[0]
            );
            assert!(
                relative(rms[0], true_rms, 0.0) <= 1e-15,
                "{} vs {true_rms}",
                rms[0]
            );
        }
    }
}

#[test]
fn reference_reproduces_the_seed_trace() {
    // The seed's [2, 4, 6, 8] trace with eps = 1e-5: -1.3416, -0.4472, 0.4472, 1.3416.
    let y = exact_layer_norm(&[2.0, 4.0, 6.0, 8.0], 1e-5);
    let expected = [-1.3416, -0.4472, 0.4472, 1.3416];
    for (a, b) in y.iter().zip(expected) {
        assert!((a - b).abs() < 5e-5);
    }
    // [3, 4] without eps is exactly [-1, 1]; RMS of [2, -2, 4, -4] is √10.
    assert_eq!(exact_layer_norm(&[3.0, 4.0], 0.0), vec![-1.0, 1.0]);
    let (mean, rms) = exact_stats(&[2.0, -2.0, 4.0, -4.0]);
    assert_eq!(mean, 0.0);
    assert!((rms - 10f64.sqrt()).abs() < 1e-15);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Random rows at random scales and offsets, with an affine part:
    /// `y = γ · n + β` carries only the two roundings of its own arithmetic.
    #[test]
    fn random_rows_match_the_reference(
        row in proptest::collection::vec(-1.0f64..1.0, 1..200),
        scale_exponent in -40i32..40,
        offset in -1e6f64..1e6,
        eps_choice in 0usize..3,
        gamma_beta in proptest::collection::vec((-3.0f64..3.0, -3.0f64..3.0), 200),
    ) {
        let scale = 2f64.powi(scale_exponent);
        let row: Vec<f64> = row.iter().map(|v| offset * scale + v * scale).collect();
        let eps = [0.0, 1e-5, 1.0][eps_choice] * scale * scale;
        let d = row.len();
        let gamma = Array1::from_iter(gamma_beta.iter().take(d).map(|p| p.0));
        let beta = Array1::from_iter(gamma_beta.iter().take(d).map(|p| p.1));
        let x = Array1::from(row.clone());
        let truth = exact_layer_norm(&row, eps);
        let plain = x.layer_norm_plain(eps).unwrap();
        let affine = x.layer_norm(&gamma, &beta, eps).unwrap();
        for i in 0..d {
            proptest::prop_assert!(relative(plain[i], truth[i], 0.0) <= F64_TOLERANCE);
            let expected = gamma[i] * truth[i] + beta[i];
            let bound = 4.0 * f64::EPSILON * ((gamma[i] * truth[i]).abs() + beta[i].abs());
            proptest::prop_assert!((affine[i] - expected).abs() <= bound);
        }
        let truth = exact_rms_norm(&row, eps);
        let rms = x.rms_norm(&gamma, eps).unwrap();
        for i in 0..d {
            let expected = gamma[i] * truth[i];
            proptest::prop_assert!(relative(rms[i], expected, 0.0) <= F64_TOLERANCE);
        }
    }
}

/// The mean of an `f32` row rounded once to `f32`, ties to even, from the
/// exact sum: the `f32` within a few ulps of an estimate whose distance
/// `|S - d · C|` (both times 2¹⁰⁷⁴) is smallest.
fn correctly_rounded_f32_mean(row: &[f32]) -> f32 {
    let d = row.len();
    let sum: BigInt = row.iter().map(|&v| exact(f64::from(v))).sum();
    let estimate = (row.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64) as f32;
    let mut candidate = estimate;
    for _ in 0..4 {
        candidate = candidate.next_down();
    }
    let mut best: Option<(BigUint, f32, usize)> = None;
    for step in 0..9 {
        let distance = (&sum - exact(f64::from(candidate)) * BigInt::from(d))
            .magnitude()
            .clone();
        let better = match &best {
            None => true,
            Some((least, chosen, _)) => {
                distance < *least
                    || (distance == *least
                        && candidate.to_bits() & 1 == 0
                        && chosen.to_bits() & 1 == 1)
            }
        };
        if better {
            best = Some((distance, candidate, step));
        }
        candidate = candidate.next_up();
    }
    let (_, chosen, step) = best.unwrap();
    assert!(
        step != 0 && step != 8,
        "{row:?}: the estimate is too far off"
    );
    chosen
}

#[test]
fn f32_means_are_rounded_once() {
    // (1 + 2⁻²⁴ + 2⁻¹⁰⁰) / 4 lies just above the midpoint of the `f32`
    // values 1/4 and (1 + 2⁻²³)/4; its nearest `f64` is that midpoint.
    let x = ndarray::array![[1.0f32, 2f32.powi(-24), 2f32.powi(-100), 0.0]];
    let (mean, _) = x.stats().unwrap();
    assert_eq!(mean[0], 0.25 * (1.0 + f32::EPSILON));

    // Rows of d = 4k summing to d · m + t, with m = a + ½ the midpoint of
    // the `f32` values a and a + 1 (2²³ ≤ a < 2²⁴): d - 2 elements a + 1,
    // one 2a + 2 - d/2 (even, so an `f32`) and a small t. Their mean
    // m + t / d is within half an `f64` ulp of m for the smaller t, and
    // rounds away from the even neighbour for one sign of t.
    let mut rng = Rng(29);
    for &d in &[4usize, 8, 12, 16, 20, 64, 100, 1000] {
        for _ in 0..40 {
            let a = ((1u64 << 23) + rng.below(1 << 23)) as f64;
            let scale = 2f64.powi(rng.below(120) as i32 - 60);
            let small =
                2f64.powi(-(rng.below(60) as i32)) * if rng.below(2) == 0 { 1.0 } else { -1.0 };
            let t = if rng.below(8) == 0 { 0.0 } else { small };
            let mut row = vec![((a + 1.0) * scale) as f32; d - 2];
            row.push(((2.0 * a + 2.0 - (d / 2) as f64) * scale) as f32);
            row.push((t * scale) as f32);
            for i in (1..d).rev() {
                row.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let truth = correctly_rounded_f32_mean(&row);
            let (mean, _) = Array2::from_shape_vec((1, d), row.clone())
                .unwrap()
                .stats()
                .unwrap();
            assert_eq!(
                mean[0].to_bits(),
                truth.to_bits(),
                "d {d}, t {t}: {} vs {truth}",
                mean[0]
            );
        }
    }

    // And ordinary rows.
    for &d in &[1usize, 2, 3, 7, 16, 17, 33, 100, 777] {
        for _ in 0..40 {
            let row: Vec<f32> = (0..d).map(|_| (rng.signed_unit() * 100.0) as f32).collect();
            let truth = correctly_rounded_f32_mean(&row);
            let (mean, _) = Array2::from_shape_vec((1, d), row.clone())
                .unwrap()
                .stats()
                .unwrap();
            assert_eq!(mean[0].to_bits(), truth.to_bits(), "d {d}: {row:?}");
        }
    }
}
