//! Mathematical properties of the normalisations, checked on random rows of
//! `f32` and `f64` against bounds derived from `eps` and the rounding of
//! the element type.
//!
//! # Error budget
//!
//! A computed normalised value `ñ` differs from the exact `n` by at most
//! `E(ñ)`: for `f32`, the crate's 1 ulp of the exactly rounded value plus
//! that rounding (1.5 ulp ≤ 2⁻²²·|n|); for `f64`, the crate's target of
//! 1e-14 relative, or absolute (in units of the row's spread) for outputs
//! near 0, which we take as 2⁻⁴⁶·(|n| + 1) ≈ 1.4e-14·(|n| + 1). Test-side sums in `f64` add at
//! most a few `d·2⁻⁵³` relative.
//!
//! If every `|ñᵢ - nᵢ| ≤ Eᵢ`, then by the triangle inequality for the
//! root-mean-square norm (centring is an orthogonal projection, so it does
//! not increase that norm) the spread and root mean square of `ñ` are within
//! `r = rms(E)` of those of `n`, so a mean square `s²` is within
//! `r·(2s + r)`.

mod common;

use common::{eps, feature_vector, mean_square, rows, two_pass, wide, TestFloat};
use ndarray::{s, Array1, Array2, Axis};
use ndarray_layernorm::prelude::*;
use proptest::prelude::*;

/// Bound on `|ñ - n|` for a computed normalised value `ñ` (see module docs).
fn error_bound<A: TestFloat>(n: f64) -> f64 {
    if A::UNIT > 1e-10 {
        2f64.powi(-22) * n.abs() + 1e-38
    } else {
        2f64.powi(-46) * (n.abs() + 1.0)
    }
}

/// `r·(2s + r)` plus test-side rounding, where `r` is the rms of the error
/// bounds of `values` and `s²` the exact mean square being compared with.
fn mean_square_tolerance<A: TestFloat>(values: &[f64], exact_mean_square: f64) -> f64 {
    let d = values.len() as f64;
    let r = (values
        .iter()
        .map(|&n| error_bound::<A>(n).powi(2))
        .sum::<f64>()
        / d)
        .sqrt();
    r * (2.0 * exact_mean_square.sqrt() + r) + 8.0 * (d + 4.0) * f64::UNIT
}

fn err(e: NormError) -> TestCaseError {
    TestCaseError::fail(format!("unexpected error: {e}"))
}

/// `rows` with a valid `eps`.
fn rows_eps<A: TestFloat>() -> impl Strategy<Value = (Array2<A>, A)> {
    (rows::<A>(), eps::<A>())
}

// ---------------------------------------------------------------------------
// LayerNorm: mean 0 and variance var / (var + eps).

fn moments<A: TestFloat>(x: &Array2<A>, eps: A) -> Result<(), TestCaseError> {
    let y = x.layer_norm_plain(eps).map_err(err)?;
    let eps = eps.wide();
    for (row_x, row_y) in x.rows().into_iter().zip(y.rows()) {
        let xs = wide(row_x);
        let n = wide(row_y);
        let d = n.len() as f64;
        let (_, var) = two_pass(&xs);
        if var == 0.0 {
            // A constant row: exact zeros (checked in detail below).
            prop_assert!(n.iter().all(|&v| v == 0.0), "constant row gave {n:?}");
            continue;
        }
        // The exact outputs have mean 0; each is off by at most E.
        let mean = n.iter().sum::<f64>() / d;
        let mean_tol = n.iter().map(|&v| error_bound::<A>(v)).sum::<f64>() / d
            + 4.0 * d * f64::UNIT * n.iter().map(|v| v.abs()).sum::<f64>() / d;
        prop_assert!(
            mean.abs() <= mean_tol,
            "{}: mean {mean:e} > {mean_tol:e}",
            A::NAME
        );
        // The exact outputs have variance var / (var + eps).
        let expected = var / (var + eps);
        let (_, var_out) = two_pass(&n);
        let tol = mean_square_tolerance::<A>(&n, expected);
        prop_assert!(
            (var_out - expected).abs() <= tol,
            "{}: variance {var_out} vs {expected} (var {var:e}, eps {eps:e}): off by {:e} > {tol:e}",
            A::NAME,
            (var_out - expected).abs()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn layer_norm_mean_0_variance_1_f64((x, eps) in rows_eps::<f64>()) {
        moments(&x, eps)?;
    }

    #[test]
    fn layer_norm_mean_0_variance_1_f32((x, eps) in rows_eps::<f32>()) {
        moments(&x, eps)?;
    }
}

/// The bound is tight enough to see the classic mistakes: `eps` outside the
/// root, or dividing the variance by `d - 1`, on a row like the lesson's.
#[test]
fn moments_bound_catches_classic_mistakes() {
    let x = [2.0, 4.0, 6.0, 8.0];
    let (_, var) = two_pass(&x);
    assert_eq!(var, 5.0);
    let eps = 1e-2;
    let right = var / (var + eps);
    let eps_outside = var / (var.sqrt() + eps).powi(2);
    let unbiased = (var * 4.0 / 3.0) / (var * 4.0 / 3.0 + eps) * 0.75;
    let n: Vec<f64> = x.iter().map(|v| (v - 5.0) / (var + eps).sqrt()).collect();
    let tol = mean_square_tolerance::<f32>(&n, right);
    assert!((right - eps_outside).abs() > 100.0 * tol);
    assert!((right - unbiased).abs() > 100.0 * tol);
}

// ---------------------------------------------------------------------------
// A constant row gives exactly beta, for every eps >= 0.

fn constant_case<A: TestFloat>() -> impl Strategy<Value = (Array2<A>, Array1<A>, Array1<A>, A)> {
    let constant = prop_oneof![
        4 => -1e3..1e3_f64,
        1 => prop::sample::select(&[0.0, -0.0, 1e-300, -3e-40, 1e30, -3e38, 1e300, f64::MAX][..]),
    ];
    (
        prop::collection::vec(constant, 1..=5),
        common::DIM,
        prop::sample::select(&[0.0, 1e-5, 1.0][..]),
    )
        .prop_flat_map(|(constants, d, eps)| {
            let x =
                Array2::from_shape_fn((constants.len(), d), |(i, _)| A::from_wide(constants[i]));
            (
                Just(x),
                feature_vector::<A>(d),
                feature_vector::<A>(d),
                Just(A::from_wide(eps)),
            )
        })
}

fn constant_rows<A: TestFloat>(
    x: &Array2<A>,
    gamma: &Array1<A>,
    beta: &Array1<A>,
    eps: A,
) -> Result<(), TestCaseError> {
    // Constants that overflow A became infinities: those rows are not finite
    // constants, and give NaN (checked elsewhere); keep the finite ones.
    let finite: Vec<usize> = (0..x.nrows()).filter(|&i| x[[i, 0]].is_finite()).collect();
    let x = x.select(Axis(0), &finite);
    if x.nrows() == 0 {
        return Ok(());
    }
    let y = x.layer_norm(gamma, beta, eps).map_err(err)?;
    let mut inplace = x.clone();
    inplace.layer_norm_inplace(gamma, beta, eps).map_err(err)?;
    let plain = x.layer_norm_plain(eps).map_err(err)?;
    for i in 0..x.nrows() {
        for (j, (&got, &b)) in y.row(i).iter().zip(beta).enumerate() {
            prop_assert_eq!(got.bits(), b.bits(), "row {} col {}", i, j);
        }
        for (&got, &b) in inplace.row(i).iter().zip(beta) {
            prop_assert_eq!(got.bits(), b.bits());
        }
        // (x - mean) is +0 exactly, so the plain output is +0.
        for &got in plain.row(i) {
            prop_assert_eq!(got.bits(), 0);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn constant_row_gives_exactly_beta_f64((x, g, b, eps) in constant_case::<f64>()) {
        constant_rows(&x, &g, &b, eps)?;
    }

    #[test]
    fn constant_row_gives_exactly_beta_f32((x, g, b, eps) in constant_case::<f32>()) {
        constant_rows(&x, &g, &b, eps)?;
    }
}

// ---------------------------------------------------------------------------
// RMSNorm: root mean square ms / (ms + eps); all-zero rows give zeros.

fn unit_rms<A: TestFloat>(x: &Array2<A>, eps: A) -> Result<(), TestCaseError> {
    let y = x.rms_norm_plain(eps).map_err(err)?;
    let eps = eps.wide();
    for (row_x, row_y) in x.rows().into_iter().zip(y.rows()) {
        let ms = mean_square(&wide(row_x));
        let n = wide(row_y);
        if ms == 0.0 {
            prop_assert!(n.iter().all(|&v| v == 0.0));
            continue;
        }
        let expected = ms / (ms + eps);
        let got = mean_square(&n);
        let tol = mean_square_tolerance::<A>(&n, expected);
        prop_assert!(
            (got - expected).abs() <= tol,
            "{}: mean square {got} vs {expected} (ms {ms:e}, eps {eps:e})",
            A::NAME
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn rms_norm_has_rms_1_f64((x, eps) in rows_eps::<f64>()) {
        unit_rms(&x, eps)?;
    }

    #[test]
    fn rms_norm_has_rms_1_f32((x, eps) in rows_eps::<f32>()) {
        unit_rms(&x, eps)?;
    }
}

fn zero_rows<A: TestFloat>(
    signs: &[bool],
    rows: usize,
    gamma: &Array1<A>,
    eps: A,
) -> Result<(), TestCaseError> {
    let d = gamma.len();
    let x = Array2::from_shape_fn((rows, d), |(i, j)| {
        A::from_wide(if signs[(i * d + j) % signs.len()] {
            -0.0
        } else {
            0.0
        })
    });
    let plain = x.rms_norm_plain(eps).map_err(err)?;
    let scaled = x.rms_norm(gamma, eps).map_err(err)?;
    let mut inplace = x.clone();
    inplace.rms_norm_inplace(gamma, eps).map_err(err)?;
    for v in plain.iter().chain(&scaled).chain(&inplace) {
        prop_assert!(v.wide() == 0.0, "{} (eps {})", v, eps);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn rms_norm_of_zeros_is_zeros_f64(
        signs in prop::collection::vec(any::<bool>(), 1..8),
        rows in 1usize..4,
        gamma in common::DIM.prop_flat_map(feature_vector::<f64>),
        eps in prop::sample::select(&[0.0, 1e-300, 1e-6, 1.0][..]),
    ) {
        zero_rows(&signs, rows, &gamma, eps)?;
    }

    #[test]
    fn rms_norm_of_zeros_is_zeros_f32(
        signs in prop::collection::vec(any::<bool>(), 1..8),
        rows in 1usize..4,
        gamma in common::DIM.prop_flat_map(feature_vector::<f32>),
        eps in prop::sample::select(&[0.0, 1e-40, 1e-6, 1.0][..]),
    ) {
        zero_rows(&signs, rows, &gamma, eps)?;
    }
}

// ---------------------------------------------------------------------------
// Invariance under x -> a·x + b, a > 0.

/// With eps = 0 and any `a > 0`, `b`: `x' = fl(a·x + b)` differs from the
/// exact `z = a·x + b` by `Δ`, `|Δᵢ| ≤ D`. Since `z` normalises to exactly
/// `n`, the normalisation `n'` of `x'` satisfies
/// `|n'ᵢ - nᵢ| ≤ D·(|nᵢ| + 2) / σ'` (σ' the spread of `x'`), plus the
/// errors `E` of both computed results.
fn affine_invariance<A: TestFloat>(x: &Array2<A>, a: f64, b: f64) -> Result<(), TestCaseError> {
    let zero = A::from_wide(0.0);
    let moved = x.mapv(|v| A::from_wide(a * v.wide() + b));
    let y = x.layer_norm_plain(zero).map_err(err)?;
    let y_moved = moved.layer_norm_plain(zero).map_err(err)?;
    for i in 0..x.nrows() {
        let (_, var) = two_pass(&wide(x.row(i)));
        let xs_moved = wide(moved.row(i));
        let (_, var_moved) = two_pass(&xs_moved);
        if var == 0.0 || var_moved == 0.0 {
            continue;
        }
        // Two roundings of A (a·x, then + b), each at most UNIT of its result.
        let delta = x
            .row(i)
            .iter()
            .zip(&xs_moved)
            .map(|(v, m)| 2.0 * A::UNIT * ((a * v.wide()).abs() + m.abs()))
            .fold(0.0, f64::max);
        // The test's spread carries a relative error far below 1%.
        let spread = var_moved.sqrt() * 0.99;
        for (&n, &n_moved) in y.row(i).iter().zip(y_moved.row(i)) {
            let (n, n_moved) = (n.wide(), n_moved.wide());
            let tol = delta * (n.abs() + error_bound::<A>(n) + 2.0) / spread
                + error_bound::<A>(n)
                + error_bound::<A>(n_moved);
            prop_assert!(
                (n - n_moved).abs() <= tol,
                "{}: a = {a}, b = {b}: {n} vs {n_moved}, tol {tol:e}",
                A::NAME
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn layer_norm_invariant_under_affine_maps_f64(
        x in rows::<f64>(), a in 0.01..100.0_f64, b in -1e3..1e3_f64,
    ) {
        affine_invariance(&x, a, b)?;
    }

    #[test]
    fn layer_norm_invariant_under_affine_maps_f32(
        x in rows::<f32>(), a in 0.01..100.0_f64, b in -1e3..1e3_f64,
    ) {
        affine_invariance(&x, a, b)?;
    }
}

/// Rows of integers in [-2¹⁵, 2¹⁵], scaled by `2^k` and shifted by an
/// integer multiple of `2^k`: exact in `f32` and `f64`, so the exact outputs
/// are equal, also with `eps` scaled by `4^k` (also exact), for LayerNorm,
/// and for RMSNorm without the shift.
fn exact_scaling<A: TestFloat>(
    x: &Array2<A>,
    k: i32,
    shift: i32,
    eps: f64,
) -> Result<(), TestCaseError> {
    let a = 2f64.powi(k);
    let b = f64::from(shift) * a;
    let eps_a = A::from_wide(eps * a * a);
    let eps = A::from_wide(eps);
    prop_assert_eq!(eps_a.wide(), eps.wide() * a * a, "eps·a² must be exact");
    let moved = x.mapv(|v| A::from_wide(a * v.wide() + b));
    prop_assert!(moved
        .iter()
        .zip(x)
        .all(|(m, v)| m.wide() == a * v.wide() + b));
    let scaled = x.mapv(|v| A::from_wide(a * v.wide()));

    let pairs = [
        (x.layer_norm_plain(eps), moved.layer_norm_plain(eps_a)),
        (x.rms_norm_plain(eps), scaled.rms_norm_plain(eps_a)),
    ];
    for (name, (y, y_moved)) in ["layer_norm", "rms_norm"].iter().zip(pairs) {
        let (y, y_moved) = (y.map_err(err)?, y_moved.map_err(err)?);
        for (&n, &m) in y.iter().zip(&y_moved) {
            let (n, m) = (n.wide(), m.wide());
            let tol = error_bound::<A>(n) + error_bound::<A>(m);
            prop_assert!(
                (n - m).abs() <= tol,
                "{} {}: k = {}, shift = {}: {} vs {}",
                name,
                A::NAME,
                k,
                shift,
                n,
                m
            );
        }
    }
    Ok(())
}

fn integer_rows<A: TestFloat>() -> impl Strategy<Value = Array2<A>> {
    (common::ROWS, common::DIM).prop_flat_map(|(r, d)| {
        prop::collection::vec(-(1i32 << 15)..=(1 << 15), r * d).prop_map(move |v| {
            Array2::from_shape_vec(
                (r, d),
                v.into_iter().map(|i| A::from_wide(f64::from(i))).collect(),
            )
            .unwrap()
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn exact_rescaling_f64(
        x in integer_rows::<f64>(), k in -20i32..=20, shift in -(1i32 << 20)..=(1 << 20),
        eps in prop::sample::select(&[0.0, 1.0, 0.25, 1024.0][..]),
    ) {
        exact_scaling(&x, k, shift, eps)?;
    }

    #[test]
    fn exact_rescaling_f32(
        x in integer_rows::<f32>(), k in -20i32..=20, shift in -(1i32 << 7)..=(1 << 7),
        eps in prop::sample::select(&[0.0, 1.0, 0.25, 1024.0][..]),
    ) {
        exact_scaling(&x, k, shift, eps)?;
    }
}

// ---------------------------------------------------------------------------
// NaN or infinity in one row: NaN in that row, the other rows bit-identical
// to the result without the bad row.

fn poisoned<A: TestFloat>(
    x: &Array2<A>,
    row: usize,
    col: usize,
    bad: f64,
    eps: A,
    gamma: &Array1<A>,
    beta: &Array1<A>,
) -> Result<(), TestCaseError> {
    let (r, d) = x.dim();
    let (row, col) = (row % r, col % d);
    let mut with_bad = x.clone();
    with_bad[[row, col]] = A::from_wide(bad);
    let others: Vec<usize> = (0..r).filter(|&i| i != row).collect();
    let without = x.select(Axis(0), &others);

    let results = |m: &Array2<A>| -> Result<Vec<Array2<A>>, NormError> {
        let mut ln_inplace = m.clone();
        ln_inplace.layer_norm_inplace(gamma, beta, eps)?;
        let mut rms_inplace = m.clone();
        rms_inplace.rms_norm_plain_inplace(eps)?;
        Ok(vec![
            m.layer_norm(gamma, beta, eps)?,
            m.layer_norm_plain(eps)?,
            ln_inplace,
            m.rms_norm(gamma, eps)?,
            m.rms_norm_plain(eps)?,
            rms_inplace,
        ])
    };
    let bad_results = results(&with_bad).map_err(err)?;
    let good_results = results(&without).map_err(err)?;
    for (k, (y_bad, y_good)) in bad_results.iter().zip(&good_results).enumerate() {
        prop_assert!(
            y_bad.row(row).iter().all(|v| v.is_nan()),
            "result {} ({}): row with {} gave {:?}",
            k,
            A::NAME,
            bad,
            y_bad.row(row)
        );
        let rest = y_bad.select(Axis(0), &others);
        prop_assert_eq!(common::bits(&rest), common::bits(y_good), "result {}", k);
    }

    // stats follows IEEE arithmetic in the bad row: NaN for a NaN, the
    // infinity itself for the mean otherwise, and +inf for the rms (the
    // squares of ±inf are +inf).
    let (mean_bad, rms_bad) = with_bad.stats().map_err(err)?;
    let (mean_good, rms_good) = without.stats().map_err(err)?;
    let (m, q) = (mean_bad[row].wide(), rms_bad[row].wide());
    if bad.is_nan() {
        prop_assert!(m.is_nan() && q.is_nan(), "stats {m} {q}");
    } else {
        prop_assert_eq!(m, bad);
        prop_assert_eq!(q, f64::INFINITY, "rms");
    }
    let others_mean = mean_bad.select(Axis(0), &others);
    let others_rms = rms_bad.select(Axis(0), &others);
    prop_assert_eq!(common::bits(&others_mean), common::bits(&mean_good));
    prop_assert_eq!(common::bits(&others_rms), common::bits(&rms_good));
    Ok(())
}

fn poison_case<A: TestFloat>(
) -> impl Strategy<Value = (Array2<A>, usize, usize, f64, A, Array1<A>, Array1<A>)> {
    (common::ROWS, common::DIM, common::kind()).prop_flat_map(|(r, d, kind)| {
        (
            common::values::<A>(kind, (r + 1) * d)
                .prop_map(move |v| Array2::from_shape_vec((r + 1, d), v).unwrap()),
            0..=r,
            0..d,
            prop::sample::select(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY][..]),
            eps::<A>(),
            feature_vector::<A>(d),
            feature_vector::<A>(d),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn nan_or_inf_poisons_its_row_only_f64(
        (x, row, col, bad, eps, g, b) in poison_case::<f64>(),
    ) {
        poisoned(&x, row, col, bad, eps, &g, &b)?;
    }

    #[test]
    fn nan_or_inf_poisons_its_row_only_f32(
        (x, row, col, bad, eps, g, b) in poison_case::<f32>(),
    ) {
        poisoned(&x, row, col, bad, eps, &g, &b)?;
    }
}

/// A row with infinities of both signs has a NaN mean; any row with a NaN
/// or an infinity normalises to NaN, and the other rows are untouched.
#[test]
fn mixed_non_finite_rows() {
    let x = ndarray::array![
        [1.0_f64, f64::INFINITY, f64::NEG_INFINITY],
        [f64::NAN, f64::INFINITY, 1.0],
        [1.0, 2.0, 3.0]
    ];
    let (mean, rms) = x.stats().unwrap();
    assert!(mean[0].is_nan() && !rms[0].is_finite());
    assert!(mean[1].is_nan() && rms[1].is_nan());
    assert_eq!(mean[2], 2.0);
    assert!(common::ulps(rms[2], (14.0f64 / 3.0).sqrt()) <= 1);
    for y in [
        x.layer_norm_plain(0.0).unwrap(),
        x.rms_norm_plain(0.0).unwrap(),
    ] {
        assert!(y.slice(s![..2, ..]).iter().all(|v| v.is_nan()));
        assert!(y.row(2).iter().all(|v| v.is_finite()));
    }
}

/// The mean of zeros has the sign of their IEEE sum: negative only when
/// every zero is, whatever their order.
#[test]
fn stats_of_signed_zeros() {
    for d in [2, 3, 20] {
        for negatives in 0..=d {
            for first_negative in [true, false] {
                let row: Vec<f64> = (0..d)
                    .map(|j| {
                        let negative = if first_negative {
                            j < negatives
                        } else {
                            j >= d - negatives
                        };
                        if negative {
                            -0.0
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let x = ndarray::Array2::from_shape_vec((1, d), row.clone()).unwrap();
                let (mean, rms) = x.stats().unwrap();
                let x32 = x.mapv(|v| v as f32);
                let (mean32, _) = x32.stats().unwrap();
                let all_negative = negatives == d;
                assert_eq!(mean[0], 0.0);
                assert_eq!(mean[0].is_sign_negative(), all_negative, "{row:?}");
                assert_eq!(mean32[0].is_sign_negative(), all_negative, "{row:?}");
                assert!(rms[0] == 0.0 && rms[0].is_sign_positive());
            }
        }
    }
}

/// One infinity in a row whose finite elements overflow on the way: the
/// mean is that infinity (the finite elements' overflow meets no infinity
/// of the other sign), at every row length.
#[test]
fn stats_of_an_infinity_next_to_an_overflowing_sum() {
    for d in [3, 20, 40] {
        let mut row = vec![1e308_f64; d];
        row[d - 1] = f64::NEG_INFINITY;
        let mirrored: Vec<f64> = row.iter().map(|v| -v).collect();
        let x = ndarray::Array2::from_shape_vec((2, d), [row, mirrored].concat()).unwrap();
        let (mean, rms) = x.stats().unwrap();
        assert_eq!(mean.to_vec(), [f64::NEG_INFINITY, f64::INFINITY], "d {d}");
        assert_eq!(rms.to_vec(), [f64::INFINITY, f64::INFINITY], "d {d}");
    }
}

/// `stats` documents IEEE results for rows holding infinities: the squares
/// of ±inf are +inf, so the rms is +inf whatever the signs.
#[test]
fn stats_rms_of_infinite_row_is_inf() {
    let rows = ndarray::array![
        [f64::INFINITY, 1.0],
        [2.0, f64::NEG_INFINITY],
        [f64::INFINITY, f64::NEG_INFINITY]
    ];
    let (_, rms) = rows.stats().unwrap();
    assert_eq!(rms.to_vec(), vec![f64::INFINITY; 3]);
    let (_, rms) = ndarray::array![f32::INFINITY].stats().unwrap();
    assert_eq!(rms[()], f32::INFINITY);
}

// ---------------------------------------------------------------------------
// stats agrees with a simple f64 two-pass mean and a plain root mean square.

fn stats_agree<A: TestFloat>(x: &Array2<A>) -> Result<(), TestCaseError> {
    let (mean, rms) = x.stats().map_err(err)?;
    prop_assert_eq!(mean.len(), x.nrows());
    for (i, row) in x.rows().into_iter().enumerate() {
        let xs = wide(row);
        let d = xs.len() as f64;
        let (ref_mean, _) = two_pass(&xs);
        let ref_rms = mean_square(&xs).sqrt();
        let abs_sum = xs.iter().map(|v| v.abs()).sum::<f64>() / d;
        // The reference sums the shifted values x - x[0], which can be as
        // large as |x| + |x[0]|.
        let shifted_sum = xs.iter().map(|v| (v - xs[0]).abs()).sum::<f64>() / d;
        // One rounding to A of the result (twice for margin) plus the
        // reference's own error: d roundings of the sum of the shifted
        // values, and those of forming them and of adding x[0] back.
        let mean_tol =
            2.0 * A::UNIT * ref_mean.abs() + 2.0 * (d + 2.0) * f64::UNIT * (abs_sum + shifted_sum);
        let rms_tol = (2.0 * A::UNIT + 2.0 * (d + 4.0) * f64::UNIT) * ref_rms;
        let (m, q) = (mean[i].wide(), rms[i].wide());
        prop_assert!(
            (m - ref_mean).abs() <= mean_tol,
            "{}: mean {m} vs {ref_mean}",
            A::NAME
        );
        prop_assert!(
            (q - ref_rms).abs() <= rms_tol,
            "{}: rms {q} vs {ref_rms}",
            A::NAME
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn stats_agree_with_two_pass_f64(x in rows::<f64>()) {
        stats_agree(&x)?;
    }

    #[test]
    fn stats_agree_with_two_pass_f32(x in rows::<f32>()) {
        stats_agree(&x)?;
    }
}

// ---------------------------------------------------------------------------
// gamma = 1, beta = 0 changes nothing.

fn unit_affine<A: TestFloat>(x: &Array2<A>, eps: A) -> Result<(), TestCaseError> {
    let d = x.ncols();
    let ones = Array1::from_elem(d, A::from_wide(1.0));
    let zeros = Array1::from_elem(d, A::from_wide(0.0));
    let a = x.layer_norm(&ones, &zeros, eps).map_err(err)?;
    let b = x.layer_norm_plain(eps).map_err(err)?;
    // n·1 + 0 == n (a -0.0 may become +0.0, which compares equal).
    prop_assert_eq!(wide(&a), wide(&b));
    let a = x.rms_norm(&ones, eps).map_err(err)?;
    let b = x.rms_norm_plain(eps).map_err(err)?;
    prop_assert_eq!(common::bits(&a), common::bits(&b));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn unit_gamma_zero_beta_is_plain_f64((x, eps) in rows_eps::<f64>()) {
        unit_affine(&x, eps)?;
    }

    #[test]
    fn unit_gamma_zero_beta_is_plain_f32((x, eps) in rows_eps::<f32>()) {
        unit_affine(&x, eps)?;
    }
}
