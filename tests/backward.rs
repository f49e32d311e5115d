//! Gradients of LayerNorm and RMSNorm: closed forms, finite differences,
//! the identities every gradient satisfies, determinism and errors.

mod common;

use common::training::{bits32, bits64, matrix, mean_rstd, noise, std_dev, vector};
use ndarray::{array, s, Array1, Array2, Array3, ArrayD, ArrayViewMut2, Axis, IxDyn, ShapeBuilder};
use ndarray_layernorm::prelude::*;
use ndarray_layernorm::Operand;
use proptest::prelude::*;

const EPSILONS: [f64; 4] = [0.0, 1e-5, 0.1, 1.0];

// ---------------------------------------------------------------------------
// Closed forms.
//
// LayerNorm: x̂ = (x - x̄)·r with r = 1/√(var + eps), y = γ x̂ + β, g = γ ⊙ dy.
// ∂x̂ⱼ/∂xᵢ = r(δᵢⱼ - 1/d) + (xⱼ - x̄)·∂r/∂xᵢ and ∂r/∂xᵢ = -r³(xᵢ - x̄)/d, so
//   dxᵢ = Σⱼ gⱼ ∂x̂ⱼ/∂xᵢ = r(gᵢ - mean g) - r³(xᵢ - x̄)·mean(g ⊙ (x - x̄))
//       = r(gᵢ - mean g - x̂ᵢ·mean(g ⊙ x̂)).
//
// x = [2, 4, 6, 8], eps = 0 (the seed's row): x̄ = 5, var = 5, r = 1/√5,
// x̂ = [-3, -1, 1, 3]/√5. With γ = 1 and dy = e₀: mean g = 1/4 and
// mean(g ⊙ x̂) = -3/(4√5), so
//   dxᵢ = (1/√5)(gᵢ - 1/4 + 3cᵢ/20) with c = [-3, -1, 1, 3]
//       = (1/√5)·[3/10, -2/5, -1/10, 1/5],
// which sums to 0. Directly: ∂x̂₀/∂x₀ = r(1 - 1/d - x̂₀²/d) = (1/√5)(3/4 - 9/20)
// = (1/√5)(3/10). dγ = dy ⊙ x̂ = [-3/√5, 0, 0, 0], dβ = dy.
// ---------------------------------------------------------------------------

#[test]
fn layer_norm_closed_form_on_the_seed_row() {
    let x = array![[2.0_f64, 4.0, 6.0, 8.0]];
    let dy = array![[1.0, 0.0, 0.0, 0.0]];
    let grads = x
        .layer_norm_backward(&dy, &array![1.0, 1.0, 1.0, 1.0], 0.0)
        .unwrap();
    let s5 = 5.0_f64.sqrt();
    let dx = array![[0.3 / s5, -0.4 / s5, -0.1 / s5, 0.2 / s5]];
    assert!(grads.dx.abs_diff_eq(&dx, 2e-16), "{}", grads.dx);
    assert!(grads
        .dgamma
        .abs_diff_eq(&array![-3.0 / s5, 0.0, 0.0, 0.0], 2e-16));
    assert_eq!(grads.dbeta, array![1.0, 0.0, 0.0, 0.0]);
}

// With γ scaling dy: g = γ ⊙ dy, so γ = [2, 1, 1, 1] and dy = e₀/2 give the
// same g (hence the same dx) as γ = 1 and dy = e₀, but half the dγ and dβ.
#[test]
fn gamma_enters_dx_through_g_only() {
    let x = array![[2.0_f64, 4.0, 6.0, 8.0]];
    let a = x
        .layer_norm_backward(
            &array![[1.0, 0.0, 0.0, 0.0]],
            &array![1.0, 1.0, 1.0, 1.0],
            0.0,
        )
        .unwrap();
    let b = x
        .layer_norm_backward(
            &array![[0.5, 0.0, 0.0, 0.0]],
            &array![2.0, 1.0, 1.0, 1.0],
            0.0,
        )
        .unwrap();
    assert_eq!(bits64(&a.dx), bits64(&b.dx));
    assert_eq!(b.dgamma, &a.dgamma * 0.5);
    assert_eq!(b.dbeta, &a.dbeta * 0.5);
}

// d = 2, eps = 0: x̂ = ±[-1, 1] whatever x, so dx = 0. From the formula with
// g = [a, b]: mean g = (a+b)/2, mean(g ⊙ x̂) = (b-a)/2 and
// dx₀ = a - (a+b)/2 + (b-a)/2 = 0. Binary fractions keep every step exact.
#[test]
fn two_features_without_eps_have_zero_dx() {
    let x = array![[1.0_f64, 3.0], [10.0, -6.0]];
    let dy = array![[0.25, 0.75], [-1.5, 0.125]];
    let grads = x.layer_norm_backward(&dy, &array![1.0, 2.0], 0.0).unwrap();
    assert_eq!(grads.dx, Array2::zeros((2, 2)));
    // x̂ = [-1, 1] and [1, -1]: dγ = [-0.25 - 1.5, 0.75 - 0.125].
    assert_eq!(grads.dgamma, array![-1.75, 0.625]);
}

// A constant row has x̂ = 0 and r = 1/√eps: dx = r(g - mean g).
// x = 7, eps = 0.25: r = 2; g = γ ⊙ dy = [1, 2, 3], mean 2: dx = [-2, 0, 2].
#[test]
fn constant_row_with_eps_has_the_closed_form() {
    let x = array![[7.0_f32, 7.0, 7.0]];
    let dy = array![[1.0, 2.0, 6.0]];
    let grads = x
        .layer_norm_backward(&dy, &array![1.0, 1.0, 0.5], 0.25)
        .unwrap();
    assert_eq!(grads.dx, array![[-2.0, 0.0, 2.0]]);
    assert_eq!(grads.dgamma, array![0.0, 0.0, 0.0]);
    assert_eq!(grads.dbeta, array![1.0, 2.0, 6.0]);
}

// With eps = 0 a constant row sits where the normalisation jumps: no
// derivative in x (NaN), but its output is β whatever γ, so dγ gets 0.
#[test]
fn constant_row_without_eps_has_no_derivative() {
    let x = array![[7.0_f64, 7.0, 7.0], [1.0, 2.0, 3.0]];
    let dy = array![[1.0, 2.0, 3.0], [1.0, 0.0, -1.0]];
    let gamma = array![1.0, 1.0, 1.0];
    let grads = x.layer_norm_backward(&dy, &gamma, 0.0).unwrap();
    assert!(grads.dx.row(0).iter().all(|v| v.is_nan()));
    assert!(grads.dx.row(1).iter().all(|v| v.is_finite()));
    let alone = x
        .slice(s![1..2, ..])
        .layer_norm_backward(&dy.slice(s![1..2, ..]), &gamma, 0.0)
        .unwrap();
    assert_eq!(grads.dgamma, alone.dgamma);
    assert_eq!(grads.dbeta, array![2.0, 2.0, 2.0]);
}

// RMSNorm: x̂ = x·r, r = 1/√(mean(x²) + eps), ∂r/∂xᵢ = -r³xᵢ/d, so
//   dxᵢ = r gᵢ - r³ xᵢ mean(g ⊙ x) = r(gᵢ - x̂ᵢ mean(g ⊙ x̂)).
// x = [3, 4], eps = 0 (the seed's example): r = 1/√12.5 = √2/5, r² = 2/25.
// dy = e₀, γ = 1: mean(g ⊙ x̂) = 3r/2, dxᵢ = r(gᵢ - 3xᵢr²/2) = r(gᵢ - 3xᵢ/25),
// so dx = r·[16/25, -12/25]. Directly: y₀ = √2·x₀/√(x₀² + x₁²),
// ∂y₀/∂x₀ = √2·x₁²/(x₀² + x₁²)^{3/2} = 16√2/125 = r·16/25.
// dγ = dy ⊙ x̂ = [3r, 0].
/// An infinity in `dy` makes its feature's sums infinite: `dβ` is the sum
/// of `dy`, `dγ` that of `dy · x̂`, and `∞ · 0` is NaN where `x̂ = 0`. A NaN
/// stays in its feature.
#[test]
fn infinite_and_nan_gradients_stay_in_their_feature() {
    // x̂ of [1, 2, 3] is [-√1.5, 0, √1.5] (eps = 0).
    let x = array![[1.0_f64, 2.0, 3.0], [1.0, 2.0, 3.0]];
    let gamma = array![1.0, 1.0, 1.0];
    let dy = array![[f64::INFINITY, f64::INFINITY, 0.0], [0.0, 1.0, 1.0]];
    let grads = x.layer_norm_backward(&dy, &gamma, 0.0).unwrap();
    assert_eq!(grads.dbeta[0], f64::INFINITY);
    assert_eq!(grads.dbeta[1], f64::INFINITY);
    assert_eq!(grads.dbeta[2], 1.0);
    assert_eq!(grads.dgamma[0], f64::NEG_INFINITY);
    assert!(grads.dgamma[1].is_nan());
    assert!((grads.dgamma[2] - 1.5_f64.sqrt()).abs() < 1e-15);
    assert!(grads.dx.row(0).iter().all(|v| v.is_nan()));
    assert!(grads.dx.row(1).iter().all(|v| v.is_finite()));
    let dy = array![[f64::NAN, 0.0, 0.0], [0.0, 1.0, 1.0]];
    let grads = x.layer_norm_backward(&dy, &gamma, 0.0).unwrap();
    assert!(grads.dgamma[0].is_nan() && grads.dbeta[0].is_nan());
    assert_eq!(grads.dbeta.slice(s![1..]), array![1.0, 1.0]);
    assert!(grads.dx.row(0).iter().all(|v| v.is_nan()));
}

#[test]
fn rms_norm_closed_form_on_the_seed_row() {
    let x = array![[3.0_f64, 4.0]];
    let grads = x
        .rms_norm_backward(&array![[1.0, 0.0]], &array![1.0, 1.0], 0.0)
        .unwrap();
    let r = 2.0_f64.sqrt() / 5.0;
    assert!(grads
        .dx
        .abs_diff_eq(&array![[16.0 * r / 25.0, -12.0 * r / 25.0]], 2e-16));
    assert!(grads.dgamma.abs_diff_eq(&array![3.0 * r, 0.0], 2e-16));
}

// An all-zero row: x̂ = 0, r = 1/√eps, dx = r·g. eps = 0.25: dx = 2g.
#[test]
fn rms_norm_zero_row() {
    let x = array![[0.0_f32, 0.0, 0.0]];
    let dy = array![[1.0, -2.0, 0.5]];
    let gamma = array![1.0, 0.5, 4.0];
    let with_eps = x.rms_norm_backward(&dy, &gamma, 0.25).unwrap();
    assert_eq!(with_eps.dx, array![[2.0, -2.0, 4.0]]);
    assert_eq!(with_eps.dgamma, array![0.0, 0.0, 0.0]);
    let without = x.rms_norm_backward(&dy, &gamma, 0.0).unwrap();
    assert!(without.dx.iter().all(|v| v.is_nan()));
    assert_eq!(without.dgamma, array![0.0, 0.0, 0.0]);
}

#[test]
fn nan_poisons_its_row_of_dx_and_dgamma() {
    let x = array![[1.0_f64, f64::NAN, 3.0], [1.0, 2.0, 4.0]];
    let dy = array![[1.0, 1.0, 1.0], [0.5, 0.0, -0.5]];
    let gamma = array![1.0, 1.0, 1.0];
    let grads = x.layer_norm_backward(&dy, &gamma, 1e-5).unwrap();
    assert!(grads.dx.row(0).iter().all(|v| v.is_nan()));
    assert!(grads.dx.row(1).iter().all(|v| v.is_finite()));
    assert!(grads.dgamma.iter().all(|v| v.is_nan()));
    assert_eq!(grads.dbeta, array![1.5, 1.0, 0.5]);
    let rms = x.rms_norm_backward(&dy, &gamma, 1e-5).unwrap();
    assert!(rms.dx.row(0).iter().all(|v| v.is_nan()));
    assert!(rms.dx.row(1).iter().all(|v| v.is_finite()));
}

/// An infinity in `dy` makes its row of `dx` NaN, as a NaN does, whatever
/// the row length: in the first block of a row, in its only block, or with
/// a partial chunk after it.
#[test]
fn infinite_dy_poisons_its_row_of_dx() {
    for d in [5, 20, 100, 128, 129, 300] {
        for position in [0, d / 2, d - 1] {
            let x = Array2::from_shape_vec((2, d), noise(d as u64, 2 * d)).unwrap();
            let mut dy = Array2::from_shape_vec((2, d), noise(7 + d as u64, 2 * d)).unwrap();
            dy[[0, position]] = f64::INFINITY;
            let gamma = Array1::from_elem(d, 1.5);
            let ln = x.layer_norm_backward(&dy, &gamma, 1e-5).unwrap();
            let rms = x.rms_norm_backward(&dy, &gamma, 1e-5).unwrap();
            for dx in [&ln.dx, &rms.dx] {
                assert!(dx.row(0).iter().all(|v| v.is_nan()), "d {d} at {position}");
                assert!(
                    dx.row(1).iter().all(|v| v.is_finite()),
                    "d {d} at {position}"
                );
            }
            let x32 = x.mapv(|v| v as f32);
            let dy32 = dy.mapv(|v| v as f32);
            let gamma32 = gamma.mapv(|v| v as f32);
            let ln32 = x32.layer_norm_backward(&dy32, &gamma32, 1e-5).unwrap();
            let rms32 = x32.rms_norm_backward(&dy32, &gamma32, 1e-5).unwrap();
            for dx in [&ln32.dx, &rms32.dx] {
                assert!(
                    dx.row(0).iter().all(|v| v.is_nan()),
                    "f32 d {d} at {position}"
                );
                assert!(
                    dx.row(1).iter().all(|v| v.is_finite()),
                    "f32 d {d} at {position}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Finite differences.
//
// The loss is L = Σ dy ⊙ y, whose gradient with respect to y is dy. Each
// partial derivative is estimated by Richardson's extrapolation of central
// differences, fd = (4·c(h/2) - c(h))/3 with c(h) = (L(+h) - L(-h))/(2h),
// whose truncation error is O(h⁴). With h = 1e-3, rows of standard
// deviation ≥ 0.5 (so r ≤ 2) and |x|, |γ|, |β|, |dy| ≤ 2, the fifth
// derivative of L is at most of order d·|g|·r⁵·10³ ≈ 10⁶, giving a
// truncation error below 1e-12·10⁶/480 ≈ 2e-9. Rounding: every evaluation of
// L is off by at most δ = 4·(n + 2)·2⁻⁵³·Σ|dy ⊙ y| (the forward pass is
// within a few units in the last place, plus the sum), which the
// extrapolation turns into 3δ/h. The tolerance is the sum of both, and the
// measured errors stay two orders of magnitude below it.
// ---------------------------------------------------------------------------

const H: f64 = 1e-3;

fn richardson(f: impl Fn(f64) -> f64) -> f64 {
    let central = |h: f64| (f(h) - f(-h)) / (2.0 * h);
    (4.0 * central(H / 2.0) - central(H)) / 3.0
}

fn fd_tolerance(dy: &Array2<f64>, y: &Array2<f64>) -> f64 {
    let n = y.len() as f64;
    let scale: f64 = (dy * y).iter().map(|v| v.abs()).sum::<f64>() + 1.0;
    let delta = 4.0 * (n + 2.0) * f64::EPSILON / 2.0 * scale;
    3.0 * delta / H + 2e-9
}

fn spread_rows(x: &Array2<f64>, min_std: f64) -> bool {
    x.rows()
        .into_iter()
        .all(|r| std_dev(r.as_slice().unwrap()) >= min_std)
}

fn rms_rows(x: &Array2<f64>, min_rms: f64) -> bool {
    x.rows().into_iter().all(|r| {
        let ms = r.iter().map(|v| v * v).sum::<f64>() / r.len() as f64;
        ms.sqrt() >= min_rms
    })
}

/// `(x, dy, gamma, beta, eps)` with 1..=4 rows of 2..=10 features.
fn case() -> impl Strategy<Value = (Array2<f64>, Array2<f64>, Array1<f64>, Array1<f64>, f64)> {
    (matrix(4, 10, -2.0..2.0), 0..EPSILONS.len()).prop_flat_map(|(x, e)| {
        let (rows, d) = x.dim();
        (
            Just(x),
            proptest::collection::vec(-2.0..2.0, rows * d)
                .prop_map(move |v| Array2::from_shape_vec((rows, d), v).unwrap()),
            vector(d, -2.0..2.0),
            vector(d, -2.0..2.0),
            Just(EPSILONS[e]),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn layer_norm_gradients_match_finite_differences((x, dy, gamma, beta, eps) in case()) {
        prop_assume!(x.ncols() >= 2 && spread_rows(&x, 0.5));
        let loss = |x: &Array2<f64>, gamma: &Array1<f64>, beta: &Array1<f64>| {
            (&dy * &x.layer_norm(gamma, beta, eps).unwrap()).sum()
        };
        let y = x.layer_norm(&gamma, &beta, eps).unwrap();
        let tol = fd_tolerance(&dy, &y);
        let grads = x.layer_norm_backward(&dy, &gamma, eps).unwrap();
        for (index, &analytic) in grads.dx.indexed_iter() {
            let fd = richardson(|h| {
                let mut xh = x.clone();
                xh[index] += h;
                loss(&xh, &gamma, &beta)
            });
            prop_assert!((analytic - fd).abs() <= tol, "dx{index:?}: {analytic} vs {fd} (tol {tol})");
        }
        for j in 0..x.ncols() {
            let fd_gamma = richardson(|h| {
                let mut g = gamma.clone();
                g[j] += h;
                loss(&x, &g, &beta)
            });
            let fd_beta = richardson(|h| {
                let mut b = beta.clone();
                b[j] += h;
                loss(&x, &gamma, &b)
            });
            prop_assert!((grads.dgamma[j] - fd_gamma).abs() <= tol);
            prop_assert!((grads.dbeta[j] - fd_beta).abs() <= tol);
        }
    }

    #[test]
    fn rms_norm_gradients_match_finite_differences((x, dy, gamma, _beta, eps) in case()) {
        prop_assume!(rms_rows(&x, 0.5));
        let loss = |x: &Array2<f64>, gamma: &Array1<f64>| {
            (&dy * &x.rms_norm(gamma, eps).unwrap()).sum()
        };
        let y = x.rms_norm(&gamma, eps).unwrap();
        let tol = fd_tolerance(&dy, &y);
        let grads = x.rms_norm_backward(&dy, &gamma, eps).unwrap();
        for (index, &analytic) in grads.dx.indexed_iter() {
            let fd = richardson(|h| {
                let mut xh = x.clone();
                xh[index] += h;
                loss(&xh, &gamma)
            });
            prop_assert!((analytic - fd).abs() <= tol, "dx{index:?}: {analytic} vs {fd} (tol {tol})");
        }
        for j in 0..x.ncols() {
            let fd = richardson(|h| {
                let mut g = gamma.clone();
                g[j] += h;
                loss(&x, &g)
            });
            prop_assert!((grads.dgamma[j] - fd).abs() <= tol);
        }
    }
}

// ---------------------------------------------------------------------------
// Identities.
//
// Σᵢ dxᵢ = r(Σg - d·mean g - Σx̂ᵢ·mean(g ⊙ x̂)) = 0 because Σx̂ = 0.
// Σᵢ dxᵢx̂ᵢ = r·mean(g ⊙ x̂)·(d - Σx̂²), and Σx̂² = d·var·r² = d - d·eps·r², so
// the dot product is d·eps·r³·mean(g ⊙ x̂): 0 for eps = 0.
// Each dxᵢ is within a few roundings of r·(|gᵢ| + |mean g| + |x̂ᵢ·mean(g ⊙ x̂)|),
// so both identities hold to 64·d·2⁻⁵³ times the sum of those magnitudes.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn layer_norm_dx_identities((x, dy, gamma, _beta, eps) in case()) {
        prop_assume!(spread_rows(&x, 1e-3));
        let grads = x.layer_norm_backward(&dy, &gamma, eps).unwrap();
        let d = x.ncols() as f64;
        for ((x, dy), dx) in x.rows().into_iter().zip(dy.rows()).zip(grads.dx.rows()) {
            let (mean, r) = mean_rstd(x.as_slice().unwrap(), eps);
            let xhat: Vec<f64> = x.iter().map(|v| (v - mean) * r).collect();
            let g: Vec<f64> = dy.iter().zip(&gamma).map(|(a, b)| a * b).collect();
            let mean_g = g.iter().sum::<f64>() / d;
            let mean_gx = g.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / d;
            let magnitude: f64 = g
                .iter()
                .zip(&xhat)
                .map(|(g, n)| r * (g.abs() + mean_g.abs() + (n * mean_gx).abs()))
                .sum();
            let tol = 64.0 * d * f64::EPSILON * magnitude * (1.0 + xhat.iter().fold(0.0_f64, |m, v| m.max(v.abs())));
            let sum: f64 = dx.sum();
            prop_assert!(sum.abs() <= tol, "Σ dx = {sum}, tol {tol}");
            let dot: f64 = dx.iter().zip(&xhat).map(|(a, b)| a * b).sum();
            let expected = d * eps * r * r * r * mean_gx;
            prop_assert!((dot - expected).abs() <= tol, "dx·x̂ = {dot}, expected {expected}, tol {tol}");
        }
    }

    #[test]
    fn dbeta_is_the_sum_of_dy_and_dgamma_of_dy_xhat((x, dy, gamma, _beta, eps) in case()) {
        let grads = x.layer_norm_backward(&dy, &gamma, eps).unwrap();
        let xhat = x.layer_norm_plain(eps).unwrap();
        let rows = x.nrows() as f64;
        let tol = |terms: &Array2<f64>| 4.0 * rows * f64::EPSILON * terms.mapv(f64::abs).sum();
        let dbeta = dy.sum_axis(Axis(0));
        prop_assert!(grads.dbeta.abs_diff_eq(&dbeta, tol(&dy)));
        let products = &dy * &xhat;
        prop_assert!(grads.dgamma.abs_diff_eq(&products.sum_axis(Axis(0)), tol(&products) + 1e-15));
        let rms = x.rms_norm_backward(&dy, &gamma, eps).unwrap();
        let products = &dy * &x.rms_norm_plain(eps).unwrap();
        prop_assert!(rms.dgamma.abs_diff_eq(&products.sum_axis(Axis(0)), tol(&products) + 1e-15));
    }

    // f32 rows are widened exactly and go through the same f64 arithmetic, so
    // their gradients are the f64 gradients of the same values, rounded once.
    #[test]
    fn f32_gradients_are_the_f64_gradients_rounded((x, dy, gamma, _beta, eps) in case()) {
        let (x32, dy32, gamma32) = (x.mapv(|v| v as f32), dy.mapv(|v| v as f32), gamma.mapv(|v| v as f32));
        let (x, dy, gamma) = (x32.mapv(f64::from), dy32.mapv(f64::from), gamma32.mapv(f64::from));
        let g32 = x32.layer_norm_backward(&dy32, &gamma32, eps as f32).unwrap();
        let g64 = x.layer_norm_backward(&dy, &gamma, f64::from(eps as f32)).unwrap();
        prop_assert_eq!(bits32(&g32.dx), bits32(&g64.dx.mapv(|v| v as f32)));
        prop_assert_eq!(bits32(&g32.dgamma), bits32(&g64.dgamma.mapv(|v| v as f32)));
        prop_assert_eq!(bits32(&g32.dbeta), bits32(&g64.dbeta.mapv(|v| v as f32)));
        let r32 = x32.rms_norm_backward(&dy32, &gamma32, eps as f32).unwrap();
        let r64 = x.rms_norm_backward(&dy, &gamma, f64::from(eps as f32)).unwrap();
        prop_assert_eq!(bits32(&r32.dx), bits32(&r64.dx.mapv(|v| v as f32)));
        prop_assert_eq!(bits32(&r32.dgamma), bits32(&r64.dgamma.mapv(|v| v as f32)));
    }

    // The training forward gives the forward pass's bits, and backward from
    // its saved statistics gives the bits of the backward that recomputes them.
    #[test]
    fn saved_statistics_give_the_same_bits((x, dy, gamma, beta, eps) in case()) {
        let (y, stats) = x.layer_norm_train(&gamma, &beta, eps).unwrap();
        prop_assert_eq!(bits64(&y), bits64(&x.layer_norm(&gamma, &beta, eps).unwrap()));
        let saved = x.layer_norm_backward_with_stats(&dy, &gamma, &stats).unwrap();
        let fresh = x.layer_norm_backward(&dy, &gamma, eps).unwrap();
        prop_assert_eq!(bits64(&saved.dx), bits64(&fresh.dx));
        prop_assert_eq!(bits64(&saved.dgamma), bits64(&fresh.dgamma));
        prop_assert_eq!(bits64(&saved.dbeta), bits64(&fresh.dbeta));

        let (y, stats) = x.rms_norm_train(&gamma, eps).unwrap();
        prop_assert_eq!(bits64(&y), bits64(&x.rms_norm(&gamma, eps).unwrap()));
        let saved = x.rms_norm_backward_with_stats(&dy, &gamma, &stats).unwrap();
        let fresh = x.rms_norm_backward(&dy, &gamma, eps).unwrap();
        prop_assert_eq!(bits64(&saved.dx), bits64(&fresh.dx));
        prop_assert_eq!(bits64(&saved.dgamma), bits64(&fresh.dgamma));
    }
}

#[test]
fn saved_statistics_are_the_row_mean_and_rstd() {
    let x = array![[1.0_f64, 2.0, 3.0, 4.0], [3.0, 4.0, 0.0, 0.0]];
    let ones = Array1::ones(4);
    let (_, stats) = x.layer_norm_train(&ones, &Array1::zeros(4), 0.5).unwrap();
    assert_eq!(stats.mean(), array![2.5, 1.75]);
    // var = 5/4 and (1.25² + 2.25² + 2·1.75²)/4 = 3.1875: rstd = 1/√(var + 0.5).
    assert!(stats.rstd().abs_diff_eq(
        &array![1.0 / 1.75_f64.sqrt(), 1.0 / 3.6875_f64.sqrt()],
        1e-16
    ));
    let (_, stats) = x.rms_norm_train(&ones, 0.0).unwrap();
    assert!(stats
        .rrms()
        .abs_diff_eq(&array![1.0 / 7.5_f64.sqrt(), 1.0 / 6.25_f64.sqrt()], 1e-16));
}

// ---------------------------------------------------------------------------
// Accuracy on rows the forward pass handles specially.
// ---------------------------------------------------------------------------

// dx does not change when a constant is added to every element of a row.
// With noise on a grid of 2⁻¹⁰, 1e12 + noise is exact in f64; a backward
// that subtracted a mean rounded to one f64 (ulp(1e12) = 2⁻¹³ ≈ 1.2e-4)
// would be off by up to about 1e-4 of the row's scale.
#[test]
fn large_offset_rows_keep_their_accuracy() {
    let d = 32;
    let noise_ = Array2::from_shape_vec(
        (3, d),
        noise(7, 3 * d)
            .into_iter()
            .map(|v| (v * 1024.0).round() / 1024.0)
            .collect(),
    )
    .unwrap();
    let dy = Array2::from_shape_vec((3, d), noise(8, 3 * d)).unwrap();
    let gamma = Array1::from(noise(9, d));
    let shifted = noise_.mapv(|v| v + 1e12);
    assert_eq!(shifted.mapv(|v| v - 1e12), noise_);
    let reference = noise_.layer_norm_backward(&dy, &gamma, 1e-5).unwrap();
    let grads = shifted.layer_norm_backward(&dy, &gamma, 1e-5).unwrap();
    let scale = reference.dx.mapv(f64::abs).sum() / (3 * d) as f64;
    assert!(
        grads.dx.abs_diff_eq(&reference.dx, 1e-14 * scale),
        "max diff {}",
        (&grads.dx - &reference.dx)
            .mapv(f64::abs)
            .fold(0.0, |a: f64, &b| a.max(b))
    );
    assert!(grads.dgamma.abs_diff_eq(&reference.dgamma, 1e-14));
}

// Multiplying a row by 2ᵏ leaves x̂ unchanged and divides dx by 2ᵏ, all
// exactly in binary. Rows near 1e200 (whose squares overflow) and 1e-200
// (whose squares underflow) are rescaled inside by a power of two.
#[test]
fn rescaled_rows_keep_their_accuracy() {
    let x = Array2::from_shape_vec((2, 16), noise(11, 32)).unwrap();
    let dy = Array2::from_shape_vec((2, 16), noise(12, 32)).unwrap();
    let gamma = Array1::from(noise(13, 16));
    let reference = x.layer_norm_backward(&dy, &gamma, 0.0).unwrap();
    let rms_reference = x.rms_norm_backward(&dy, &gamma, 0.0).unwrap();
    for k in [665, -665] {
        let factor = 2.0_f64.powi(k);
        let scaled = x.mapv(|v| v * factor);
        let grads = scaled.layer_norm_backward(&dy, &gamma, 0.0).unwrap();
        let back = grads.dx.mapv(|v| v * factor);
        assert!(back.abs_diff_eq(&reference.dx, 1e-14), "2^{k}");
        assert!(grads.dgamma.abs_diff_eq(&reference.dgamma, 1e-14));
        let rms = scaled.rms_norm_backward(&dy, &gamma, 0.0).unwrap();
        assert!(rms
            .dx
            .mapv(|v| v * factor)
            .abs_diff_eq(&rms_reference.dx, 1e-14));
    }
}

/// The closed form above evaluated in plain `f64` on `(x - x₀) · 2ᵏ`: the
/// difference is exact for rows of nearby values (Sterbenz), and LayerNorm
/// is unchanged by the shift, so `dx` is that row's `dx` times 2ᵏ (eps = 0).
/// Returns `dx` and, per element, the size of the terms it sums.
fn scaled_layer_norm_dx(x: &[f64], dy: &[f64], k: i32) -> (Vec<f64>, Vec<f64>) {
    let factor = 2.0_f64.powi(k);
    let d = x.len() as f64;
    let shifted: Vec<f64> = x.iter().map(|&v| (v - x[0]) * factor).collect();
    let mean = shifted.iter().sum::<f64>() / d;
    let var = shifted
        .iter()
        .map(|&v| (v - mean) * (v - mean))
        .sum::<f64>()
        / d;
    let r = 1.0 / var.sqrt();
    let xhat: Vec<f64> = shifted.iter().map(|&v| (v - mean) * r).collect();
    let mean_g = dy.iter().sum::<f64>() / d;
    let mean_gx = dy.iter().zip(&xhat).map(|(g, h)| g * h).sum::<f64>() / d;
    let dx = dy
        .iter()
        .zip(&xhat)
        .map(|(g, h)| r * (g - mean_g - h * mean_gx) * factor)
        .collect();
    let size = dy
        .iter()
        .zip(&xhat)
        .map(|(g, h)| r * (g.abs() + mean_g.abs() + (h * mean_gx).abs()) * factor)
        .collect();
    (dx, size)
}

/// RMSNorm's closed form, `r(gᵢ - x̂ᵢ·mean(g ⊙ x̂))` with `x̂ = x·r`, on `x · 2ᵏ`.
fn scaled_rms_norm_dx(x: &[f64], dy: &[f64], k: i32) -> (Vec<f64>, Vec<f64>) {
    let factor = 2.0_f64.powi(k);
    let d = x.len() as f64;
    let scaled: Vec<f64> = x.iter().map(|&v| v * factor).collect();
    let r = 1.0 / (scaled.iter().map(|v| v * v).sum::<f64>() / d).sqrt();
    let xhat: Vec<f64> = scaled.iter().map(|&v| v * r).collect();
    let mean_gx = dy.iter().zip(&xhat).map(|(g, h)| g * h).sum::<f64>() / d;
    let dx = dy
        .iter()
        .zip(&xhat)
        .map(|(g, h)| r * (g - h * mean_gx) * factor)
        .collect();
    let size = dy
        .iter()
        .zip(&xhat)
        .map(|(g, h)| r * (g.abs() + (h * mean_gx).abs()) * factor)
        .collect();
    (dx, size)
}

// A row whose spread (or root mean square) lies below the normal range has
// an rstd beyond f64::MAX with eps = 0, yet a finite dx where dy is small:
// dx must come out finite and accurate, not ±∞ or NaN.
#[test]
fn rows_below_the_normal_range_keep_finite_gradients() {
    let ones = |d: usize| Array1::<f64>::ones(d);
    let check = |got: &Array2<f64>, (dx, size): (Vec<f64>, Vec<f64>), what: &str| {
        for ((&g, &t), &s) in got.iter().zip(&dx).zip(&size) {
            assert!(
                g.is_finite() && (g - t).abs() <= 1e-13 * s,
                "{what}: {g:e} vs {t:e}"
            );
        }
    };
    let x = array![[1e-300_f64, 1e-300 + 2e-310, 1e-300 + 6e-310]];
    let dy = array![[1e-5, 0.0, 0.0]];
    let grads = x.layer_norm_backward(&dy, &ones(3), 0.0).unwrap();
    let row = x.row(0).to_vec();
    check(
        &grads.dx,
        scaled_layer_norm_dx(&row, &dy.row(0).to_vec(), 1000),
        "offset",
    );

    let x = array![[1e-310_f64, 3e-310, -2e-310, 5e-310]];
    let dy = array![[1e-10, -2e-10, 3e-10, 0.5e-10]];
    let row = x.row(0).to_vec();
    let dy_row = dy.row(0).to_vec();
    let grads = x.layer_norm_backward(&dy, &ones(4), 0.0).unwrap();
    check(
        &grads.dx,
        scaled_layer_norm_dx(&row, &dy_row, 1000),
        "subnormal",
    );
    let rms = x.rms_norm_backward(&dy, &ones(4), 0.0).unwrap();
    check(
        &rms.dx,
        scaled_rms_norm_dx(&row, &dy_row, 1000),
        "subnormal RMSNorm",
    );
    // The same rows through saved statistics give the same bits.
    let (_, stats) = x
        .layer_norm_train(&ones(4), &Array1::zeros(4), 0.0)
        .unwrap();
    let saved = x
        .layer_norm_backward_with_stats(&dy, &ones(4), &stats)
        .unwrap();
    assert_eq!(bits64(&saved.dx), bits64(&grads.dx));
}

// ---------------------------------------------------------------------------
// Layout, dimension and determinism.
// ---------------------------------------------------------------------------

#[test]
fn gradients_do_not_depend_on_the_layout() {
    let (rows, d) = (70, 9); // more than one block of 64 rows
    let x = Array2::from_shape_vec((rows, d), noise(21, rows * d)).unwrap();
    let dy = Array2::from_shape_vec((rows, d), noise(22, rows * d)).unwrap();
    let gamma = Array1::from(noise(23, d));
    let reference = x.layer_norm_backward(&dy, &gamma, 1e-5).unwrap();
    let rms_reference = x.rms_norm_backward(&dy, &gamma, 1e-5).unwrap();

    let mut fortran = Array2::zeros((rows, d).f());
    fortran.assign(&x);
    let mut wide = Array2::zeros((rows, 2 * d));
    wide.slice_mut(s![.., ..;2]).assign(&dy);
    let mut reversed = Array2::zeros((rows, d));
    reversed.assign(&x.slice(s![.., ..;-1]));
    let gamma_strided = {
        let mut g = Array1::zeros(2 * d);
        g.slice_mut(s![..;2]).assign(&gamma);
        g
    };

    let cases = [
        fortran.layer_norm_backward(&dy, &gamma, 1e-5).unwrap(),
        x.layer_norm_backward(&wide.slice(s![.., ..;2]), &gamma, 1e-5)
            .unwrap(),
        reversed
            .slice(s![.., ..;-1])
            .layer_norm_backward(&dy, &gamma_strided.slice(s![..;2]), 1e-5)
            .unwrap(),
    ];
    for grads in &cases {
        assert_eq!(bits64(&grads.dx), bits64(&reference.dx));
        assert_eq!(bits64(&grads.dgamma), bits64(&reference.dgamma));
        assert_eq!(bits64(&grads.dbeta), bits64(&reference.dbeta));
    }
    let rms = fortran.rms_norm_backward(&dy, &gamma, 1e-5).unwrap();
    assert_eq!(bits64(&rms.dx), bits64(&rms_reference.dx));
    assert_eq!(bits64(&rms.dgamma), bits64(&rms_reference.dgamma));
}

#[test]
fn any_leading_shape_sums_over_every_leading_index() {
    let x = Array3::from_shape_vec((3, 5, 4), noise(31, 60)).unwrap();
    let dy = Array3::from_shape_vec((3, 5, 4), noise(32, 60)).unwrap();
    let gamma = Array1::from(noise(33, 4));
    let flat = x
        .to_shape((15, 4))
        .unwrap()
        .layer_norm_backward(&dy.to_shape((15, 4)).unwrap(), &gamma, 1e-5)
        .unwrap();
    let grads = x.layer_norm_backward(&dy, &gamma, 1e-5).unwrap();
    assert_eq!(grads.dx.shape(), &[3, 5, 4]);
    assert_eq!(bits64(&grads.dx), bits64(&flat.dx));
    assert_eq!(bits64(&grads.dgamma), bits64(&flat.dgamma));
    assert_eq!(bits64(&grads.dbeta), bits64(&flat.dbeta));

    let dynamic = x
        .clone()
        .into_dyn()
        .layer_norm_backward(&dy.clone().into_dyn(), &gamma, 1e-5)
        .unwrap();
    assert_eq!(bits64(&dynamic.dx), bits64(&flat.dx));
    let (_, stats) = x.into_dyn().layer_norm_train(&gamma, &gamma, 1e-5).unwrap();
    assert_eq!(stats.mean().shape(), &[3, 5]);

    // One row: the sums over rows are that row's terms.
    let row = array![1.0_f64, 2.0, 4.0];
    let grads = row
        .layer_norm_backward(&array![1.0, 1.0, 1.0], &array![1.0, 1.0, 1.0], 0.0)
        .unwrap();
    assert_eq!(grads.dbeta, array![1.0, 1.0, 1.0]);
    assert!(grads.dx.iter().all(|v| v.abs() < 1e-15)); // g constant: dx = 0
}

#[test]
fn no_rows_give_empty_dx_and_zero_parameter_gradients() {
    let x = Array2::<f32>::zeros((0, 3));
    let grads = x
        .layer_norm_backward(&x, &array![1.0, 1.0, 1.0], 1e-5)
        .unwrap();
    assert_eq!(grads.dx.shape(), &[0, 3]);
    assert_eq!(grads.dgamma, array![0.0, 0.0, 0.0]);
    assert_eq!(grads.dbeta, array![0.0, 0.0, 0.0]);
}

// dβ accumulates in f64: 50 000 copies of 0.1f32 sum exactly in f64 (each
// block's partial and the total have at most 24 + 16 significant bits), so
// the result is that exact sum rounded once. An f32 running sum drifts.
#[test]
fn parameter_gradients_accumulate_f32_in_f64() {
    let rows = 50_000;
    let x = Array2::from_shape_fn((rows, 2), |(i, j)| (i + 2 * j) as f32);
    let dy = Array2::from_elem((rows, 2), 0.1_f32);
    let grads = x.layer_norm_backward(&dy, &array![1.0, 1.0], 1e-5).unwrap();
    let exact = (f64::from(0.1_f32) * rows as f64) as f32;
    assert_eq!(grads.dbeta, array![exact, exact]);
    let running = (0..rows).fold(0.0_f32, |acc, _| acc + 0.1);
    assert_ne!(running, exact, "the check would not see an f32 accumulator");
}

// The per-feature sums over rows take blocks of 64 rows, each summed from 0
// in row order, and add the blocks with the error of each addition kept, so
// the error does not grow with the number of blocks. Here the first block
// holds 2⁵³, the next four a single 1 each and the last -2⁵³: the exact sum
// is 4, while a running sum over rows loses every 1 (2⁵³ + 1 rounds to 2⁵³).
#[test]
fn block_totals_are_compensated() {
    let rows = 64 * 6;
    let x = Array2::from_shape_fn((rows, 2), |(i, j)| (i + j) as f64);
    let big = 2.0_f64.powi(53);
    let dy = Array2::from_shape_fn((rows, 2), |(i, _)| match (i / 64, i % 64) {
        (0, 0) => big,
        (5, 0) => -big,
        (_, 0) => 1.0,
        _ => 0.0,
    });
    let grads = x.layer_norm_backward(&dy, &array![1.0, 1.0], 1e-5).unwrap();
    assert_eq!(grads.dbeta, array![4.0, 4.0]);
    let running = dy.column(0).iter().fold(0.0, |a, &b| a + b);
    assert_eq!(running, 0.0, "the check would not see a running sum");
}

// A sum over rows that overflows is ±∞, as IEEE addition gives, not NaN:
// the compensation must not form ∞ - ∞.
#[test]
fn overflowing_parameter_gradients_are_infinite() {
    let x = array![[0.0_f64, 1.0], [0.0, 1.0], [0.0, 1.0]];
    let dy = array![[1e308, 1.0], [1e308, 1.0], [-1e308, 1.0]];
    let grads = x.layer_norm_backward(&dy, &array![1.0, 1.0], 1e-5).unwrap();
    // Feature 0: dy sums to ∞ on the way (1e308 + 1e308), and n₀ < 0.
    assert_eq!(grads.dbeta[0], f64::INFINITY);
    assert_eq!(grads.dgamma[0], f64::NEG_INFINITY);
    assert_eq!(grads.dbeta[1], 3.0);
    assert!(grads.dgamma[1].is_finite());
    let rms = x.rms_norm_backward(&dy, &array![1.0, 1.0], 1e-5).unwrap();
    // n₀ = 0: every row adds 1e308 · 0 to dγ₀.
    assert_eq!(rms.dgamma[0], 0.0);
    assert!(rms.dgamma[1].is_finite());
}

// ---------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------

#[test]
fn mismatched_dy_is_rejected_before_anything_else() {
    let x = Array2::<f64>::zeros((2, 3));
    let dy = Array2::<f64>::zeros((3, 2));
    let gamma = array![1.0, 1.0, 1.0];
    let expected = NormError::ShapeMismatch {
        operand: Operand::Gradient,
        expected: vec![2, 3],
        found: vec![3, 2],
    };
    assert_eq!(
        x.layer_norm_backward(&dy, &gamma, 1e-5).unwrap_err(),
        expected
    );
    assert_eq!(
        x.rms_norm_backward(&dy, &gamma, 1e-5).unwrap_err(),
        expected
    );
    // dy is checked before gamma and eps.
    assert_eq!(
        x.layer_norm_backward(&dy, &array![1.0], -1.0).unwrap_err(),
        expected
    );
    assert_eq!(
        expected.to_string(),
        "dy has shape [3, 2], expected [2, 3] (the shape of the input)"
    );
}

#[test]
fn bad_gamma_eps_and_shapes_are_rejected() {
    let x = Array2::<f32>::zeros((2, 3));
    assert_eq!(
        x.layer_norm_backward(&x, &array![1.0, 1.0], 1e-5),
        Err(NormError::LengthMismatch {
            operand: Operand::Gamma,
            expected: 3,
            found: 2
        })
    );
    assert_eq!(
        x.rms_norm_backward(&x, &array![1.0, 1.0, 1.0], f32::NAN)
            .unwrap_err()
            .to_string(),
        "eps must be finite and non-negative, found NaN"
    );
    assert_eq!(
        x.layer_norm_backward(&x, &array![1.0, 1.0, 1.0], -1e-5),
        Err(NormError::InvalidEps {
            eps: f64::from(-1e-5_f32)
        })
    );
    let empty = Array2::<f64>::zeros((2, 0));
    assert_eq!(
        empty.layer_norm_backward(&empty, &array![], 1e-5),
        Err(NormError::EmptyAxis)
    );
    let scalar = ArrayD::<f64>::zeros(IxDyn(&[]));
    assert_eq!(
        scalar.rms_norm_backward(&scalar, &array![], 1e-5),
        Err(NormError::ZeroDimensional)
    );
}

#[test]
fn statistics_of_another_input_shape_are_rejected() {
    let gamma = array![1.0, 1.0, 1.0];
    let x = Array2::<f64>::ones((2, 3));
    let other = Array2::<f64>::ones((4, 3));
    let (_, stats) = other.layer_norm_train(&gamma, &gamma, 1e-5).unwrap();
    let (_, rms_stats) = other.rms_norm_train(&gamma, 1e-5).unwrap();
    let expected = NormError::ShapeMismatch {
        operand: Operand::Stats,
        expected: vec![2, 3],
        found: vec![4, 3],
    };
    assert_eq!(
        x.layer_norm_backward_with_stats(&x, &gamma, &stats)
            .unwrap_err(),
        expected
    );
    assert_eq!(
        x.rms_norm_backward_with_stats(&x, &gamma, &rms_stats)
            .unwrap_err(),
        expected
    );
    assert_eq!(
        expected.to_string(),
        "stats were computed for an input of shape [4, 3], not [2, 3] (the shape of the input)"
    );
    // Same leading shape, other row length.
    let (_, stats) = Array2::<f64>::ones((2, 4))
        .layer_norm_train(
            &array![1.0, 1.0, 1.0, 1.0],
            &array![0.0, 0.0, 0.0, 0.0],
            1e-5,
        )
        .unwrap();
    assert!(matches!(
        x.layer_norm_backward_with_stats(&x, &gamma, &stats),
        Err(NormError::ShapeMismatch {
            operand: Operand::Stats,
            ..
        })
    ));
}

// ---------------------------------------------------------------------------
// The `_into` forms.
// ---------------------------------------------------------------------------

#[test]
fn into_forms_give_the_bits_of_the_allocating_forms_in_any_output_layout() {
    let (rows, d) = (70, 19); // two blocks of rows, a partial vector per row
    let x = Array2::from_shape_vec((rows, d), noise(51, rows * d)).unwrap();
    let dy = Array2::from_shape_vec((rows, d), noise(52, rows * d)).unwrap();
    let gamma = Array1::from(noise(53, d));
    let (_, stats) = x.layer_norm_train(&gamma, &gamma, 1e-5).unwrap();
    let (_, rms_stats) = x.rms_norm_train(&gamma, 1e-5).unwrap();
    let grads = x.layer_norm_backward(&dy, &gamma, 1e-5).unwrap();
    let rms = x.rms_norm_backward(&dy, &gamma, 1e-5).unwrap();

    let mut c_order = Array2::from_elem((rows, d), 7.0);
    let mut fortran = Array2::from_elem((rows, d).f(), 7.0);
    let mut wide = Array2::from_elem((rows, 2 * d), 7.0);
    let mut outputs = [
        c_order.view_mut(),
        fortran.view_mut(),
        wide.slice_mut(s![.., ..;2]),
    ];
    for dx in &mut outputs {
        let (dgamma, dbeta) = x.layer_norm_backward_into(dx, &dy, &gamma, 1e-5).unwrap();
        assert_eq!(bits64(dx), bits64(&grads.dx));
        assert_eq!(bits64(&dgamma), bits64(&grads.dgamma));
        assert_eq!(bits64(&dbeta), bits64(&grads.dbeta));
        dx.fill(7.0);
        let (dgamma, dbeta) = x
            .layer_norm_backward_with_stats_into(dx, &dy, &gamma, &stats)
            .unwrap();
        assert_eq!(bits64(dx), bits64(&grads.dx));
        assert_eq!(bits64(&dgamma), bits64(&grads.dgamma));
        assert_eq!(bits64(&dbeta), bits64(&grads.dbeta));

        dx.fill(7.0);
        let dgamma = x.rms_norm_backward_into(dx, &dy, &gamma, 1e-5).unwrap();
        assert_eq!(bits64(dx), bits64(&rms.dx));
        assert_eq!(bits64(&dgamma), bits64(&rms.dgamma));
        dx.fill(7.0);
        let dgamma = x
            .rms_norm_backward_with_stats_into(dx, &dy, &gamma, &rms_stats)
            .unwrap();
        assert_eq!(bits64(dx), bits64(&rms.dx));
        assert_eq!(bits64(&dgamma), bits64(&rms.dgamma));
    }
    // The columns the strided view skips are untouched.
    assert!(wide.slice(s![.., 1..;2]).iter().all(|&v| v == 7.0));
}

/// Large outputs of long rows that the caller provides are written past
/// the caches (8 MiB and more, rows of 2 KiB and more), from each row's
/// first 64-byte line on; the allocating forms write theirs with plain
/// stores. Both give the same bits, whatever the output's offset from a
/// line.
#[test]
fn large_into_outputs_give_the_bits_of_the_allocating_forms() {
    let (rows, d) = (2 * 1024 + 3, 512); // 8 MiB of f64, rows of 4 KiB
    let n = rows * d;
    let x = Array2::from_shape_vec((rows, d), noise(61, n)).unwrap();
    let dy = Array2::from_shape_vec((rows, d), noise(62, n)).unwrap();
    let gamma = Array1::from(noise(63, d));
    let (_, stats) = x.layer_norm_train(&gamma, &gamma, 1e-5).unwrap();
    let grads = x.layer_norm_backward(&dy, &gamma, 1e-5).unwrap();
    let rms = x.rms_norm_backward(&dy, &gamma, 0.0).unwrap();
    let mut buffer = vec![7.0; n + 8];
    for offset in [0, 3, 5] {
        let mut dx = ArrayViewMut2::from_shape((rows, d), &mut buffer[offset..offset + n]).unwrap();
        let (dgamma, dbeta) = x
            .layer_norm_backward_with_stats_into(&mut dx, &dy, &gamma, &stats)
            .unwrap();
        assert_eq!(bits64(&dx), bits64(&grads.dx), "offset {offset}");
        assert_eq!(bits64(&dgamma), bits64(&grads.dgamma));
        assert_eq!(bits64(&dbeta), bits64(&grads.dbeta));
        let dgamma = x.rms_norm_backward_into(&mut dx, &dy, &gamma, 0.0).unwrap();
        assert_eq!(bits64(&dx), bits64(&rms.dx), "offset {offset}");
        assert_eq!(bits64(&dgamma), bits64(&rms.dgamma));
    }

    let (rows, d) = (1024 + 1, 2048); // 8 MiB of f32, rows of 8 KiB
    let n = rows * d;
    let narrow = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect::<Vec<_>>();
    let x = Array2::from_shape_vec((rows, d), narrow(noise(64, n))).unwrap();
    let dy = Array2::from_shape_vec((rows, d), narrow(noise(65, n))).unwrap();
    let gamma = Array1::from(narrow(noise(66, d)));
    let grads = x.layer_norm_backward(&dy, &gamma, 1e-5).unwrap();
    let mut buffer = vec![7.0_f32; n + 16];
    for offset in [0, 4, 9] {
        let mut dx = ArrayViewMut2::from_shape((rows, d), &mut buffer[offset..offset + n]).unwrap();
        let (dgamma, dbeta) = x
            .layer_norm_backward_into(&mut dx, &dy, &gamma, 1e-5)
            .unwrap();
        assert_eq!(bits32(&dx), bits32(&grads.dx), "f32 offset {offset}");
        assert_eq!(bits32(&dgamma), bits32(&grads.dgamma));
        assert_eq!(bits32(&dbeta), bits32(&grads.dbeta));
    }
}

#[test]
fn into_forms_reject_an_output_of_another_shape_and_leave_it_untouched() {
    let x = Array2::<f32>::ones((2, 3));
    let gamma = array![1.0, 1.0, 1.0];
    let mut dx = Array2::from_elem((3, 2), 5.0_f32);
    let expected = NormError::ShapeMismatch {
        operand: Operand::Output,
        expected: vec![2, 3],
        found: vec![3, 2],
    };
    assert_eq!(
        x.layer_norm_backward_into(&mut dx, &x, &gamma, 1e-5),
        Err(expected.clone())
    );
    assert_eq!(
        x.rms_norm_backward_into(&mut dx, &x, &gamma, 1e-5),
        Err(expected.clone())
    );
    let (_, stats) = x.layer_norm_train(&gamma, &gamma, 1e-5).unwrap();
    assert_eq!(
        x.layer_norm_backward_with_stats_into(&mut dx, &x, &gamma, &stats),
        Err(expected.clone())
    );
    let (_, rms_stats) = x.rms_norm_train(&gamma, 1e-5).unwrap();
    assert_eq!(
        x.rms_norm_backward_with_stats_into(&mut dx, &x, &gamma, &rms_stats),
        Err(expected)
    );
    // dy is checked before the output, the output before eps.
    let mut right = Array2::from_elem((2, 3), 5.0_f32);
    assert!(matches!(
        x.layer_norm_backward_into(&mut right, &dx, &gamma, -1.0),
        Err(NormError::ShapeMismatch {
            operand: Operand::Gradient,
            ..
        })
    ));
    assert!(matches!(
        x.layer_norm_backward_into(&mut dx, &x, &gamma, -1.0),
        Err(NormError::ShapeMismatch {
            operand: Operand::Output,
            ..
        })
    ));
    assert!(dx.iter().chain(&right).all(|&v| v == 5.0));
}

// ---------------------------------------------------------------------------
// Threads. Calls over at least 2¹⁷ elements split their blocks of 64 rows
// over the rayon pool; the per-feature sums must still add the blocks in
// block order, so one thread and two give the same bits.
// ---------------------------------------------------------------------------

/// Runs `f` on a pool of `threads` threads.
#[cfg(feature = "rayon")]
fn on_threads<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

/// Rows of very different offsets and spreads, so that the per-feature sums
/// over rows depend on the order in which they are added.
#[cfg(feature = "rayon")]
fn uneven_rows(seed: u64, rows: usize, d: usize) -> Array2<f64> {
    let values = noise(seed, rows * d);
    Array2::from_shape_fn((rows, d), |(i, j)| {
        let offset = [0.0, 3.0, -1e3, 1e5, 7e-3][i % 5];
        let scale = [1.0, 1e-2, 10.0, 1e4][i % 4];
        offset + scale * values[i * d + j]
    })
}

/// The bits of every result of every backward form (and the training
/// forward passes) on `x`, `dy`, `gamma`.
#[cfg(feature = "rayon")]
fn all_backward_bits<A: NormScalar>(
    x: &Array2<A>,
    dy: &Array2<A>,
    gamma: &Array1<A>,
) -> Vec<Vec<u64>> {
    let bits = |a: &[A]| a.iter().map(|v| v.widen().to_bits()).collect::<Vec<_>>();
    let arr = |a: &ndarray::ArrayRef2<A>| bits(&a.iter().copied().collect::<Vec<_>>());
    let vec = |a: &Array1<A>| bits(a.as_slice().unwrap());
    let eps = A::narrow(1e-5);
    let beta = Array1::from_elem(gamma.len(), A::narrow(0.25));
    let mut out = Vec::new();

    let grads = x.layer_norm_backward(dy, gamma, eps).unwrap();
    out.extend([arr(&grads.dx), vec(&grads.dgamma), vec(&grads.dbeta)]);
    let (y, stats) = x.layer_norm_train(gamma, &beta, eps).unwrap();
    out.push(arr(&y));
    out.push(stats.mean().iter().map(|v| v.to_bits()).collect());
    out.push(stats.rstd().iter().map(|v| v.to_bits()).collect());
    let saved = x.layer_norm_backward_with_stats(dy, gamma, &stats).unwrap();
    out.extend([arr(&saved.dx), vec(&saved.dgamma), vec(&saved.dbeta)]);
    let mut dx = Array2::zeros(x.raw_dim());
    let (dgamma, dbeta) = x.layer_norm_backward_into(&mut dx, dy, gamma, eps).unwrap();
    out.extend([arr(&dx), vec(&dgamma), vec(&dbeta)]);

    let grads = x.rms_norm_backward(dy, gamma, eps).unwrap();
    out.extend([arr(&grads.dx), vec(&grads.dgamma)]);
    let (y, stats) = x.rms_norm_train(gamma, eps).unwrap();
    out.push(arr(&y));
    out.push(stats.rrms().iter().map(|v| v.to_bits()).collect());
    let mut dx = Array2::zeros(x.raw_dim());
    let dgamma = x
        .rms_norm_backward_with_stats_into(&mut dx, dy, gamma, &stats)
        .unwrap();
    out.extend([arr(&dx), vec(&dgamma)]);
    out
}

/// 2¹⁷ elements and more, in blocks of 64 rows with a partial last block,
/// and rows that end in a partial vector.
#[cfg(feature = "rayon")]
#[test]
fn one_and_two_threads_give_the_same_bits() {
    for (rows, d) in [(2100, 64), (150, 900)] {
        assert!(rows * d >= 1 << 17, "large enough to run in parallel");
        let x = uneven_rows(31, rows, d);
        let dy = uneven_rows(32, rows, d);
        let gamma = Array1::from(noise(33, d));
        let one = on_threads(1, || all_backward_bits(&x, &dy, &gamma));
        let two = on_threads(2, || all_backward_bits(&x, &dy, &gamma));
        assert!(one == two, "f64, {rows} × {d}");

        let (x, dy, gamma) = (
            x.mapv(|v| v as f32),
            dy.mapv(|v| v as f32),
            gamma.mapv(|v| v as f32),
        );
        let one = on_threads(1, || all_backward_bits(&x, &dy, &gamma));
        let two = on_threads(2, || all_backward_bits(&x, &dy, &gamma));
        assert!(one == two, "f32, {rows} × {d}");
    }
}

/// A two-thread call in Fortran order (walked on the calling thread) and in
/// C order (split over the pool) gives the same bits.
#[cfg(feature = "rayon")]
#[test]
fn parallel_and_gathered_walks_agree() {
    let (rows, d) = (1100, 120);
    let x = uneven_rows(41, rows, d);
    let dy = uneven_rows(42, rows, d);
    let gamma = Array1::from(noise(43, d));
    let mut fortran = Array2::zeros((rows, d).f());
    fortran.assign(&x);
    let (c, f) = on_threads(2, || {
        (
            x.layer_norm_backward(&dy, &gamma, 1e-5).unwrap(),
            fortran.layer_norm_backward(&dy, &gamma, 1e-5).unwrap(),
        )
    });
    assert_eq!(bits64(&c.dx), bits64(&f.dx));
    assert_eq!(bits64(&c.dgamma), bits64(&f.dgamma));
    assert_eq!(bits64(&c.dbeta), bits64(&f.dbeta));
}

/// The blocks' partials are added in block order on any number of threads,
/// also where that order shows in the bits. Column 0 of `dy` is zero but
/// for the first row of each of five blocks of 64 rows: 2⁶⁰, 1, 2⁻⁵³,
/// 2⁻⁵³, -2⁶⁰, so the blocks' partials of `dβ₀` are those values. Added in
/// that order with TwoSum, the rounding errors 1, 2⁻⁵³, 2⁻⁵³ are summed
/// into the low part, where 1 + 2⁻⁵³ rounds to 1 (a tie, to even) twice,
/// and the high part ends at 0: `dβ₀ = 1`. In the reverse order the errors
/// 2⁻⁵³ + 2⁻⁵³ + 1 = 1 + 2⁻⁵² are exact, so the order is visible.
#[cfg(feature = "rayon")]
#[test]
fn blocks_are_added_in_block_order_on_any_thread_count() {
    let (rows, d) = (5 * 64, 410);
    assert!(rows * d >= 1 << 17, "large enough to run in parallel");
    let x = uneven_rows(51, rows, d);
    let firsts = [
        2f64.powi(60),
        1.0,
        2f64.powi(-53),
        2f64.powi(-53),
        -2f64.powi(60),
    ];
    let mut dy = uneven_rows(52, rows, d);
    for (i, mut row) in dy.rows_mut().into_iter().enumerate() {
        row[0] = if i % 64 == 0 { firsts[i / 64] } else { 0.0 };
    }
    let gamma = Array1::from(noise(53, d));
    for threads in [1, 2] {
        let grads = on_threads(threads, || {
            x.layer_norm_backward(&dy, &gamma, 1e-5).unwrap()
        });
        assert_eq!(grads.dbeta[0], 1.0, "{threads} threads");
    }
}
