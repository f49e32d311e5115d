//! Every worked example of the LayerNorm and RMSNorm lessons, with the
//! lessons' numbers, for `f32` and `f64`, for 1-D, 2-D, 3-D and `IxDyn`
//! arrays, and for the allocating, `_into` and `_inplace` forms, which must
//! agree bit for bit.
//!
//! A number the lessons print with `k` decimals is the true value rounded
//! to `k` decimals, so the tolerance is half a unit of the `k`-th decimal,
//! plus a few roundings of the element type.

mod common;

use common::{bits, ulps, wide, TestFloat, JUNK};
use ndarray::{array, Array, Array1, Array2, Axis, Dimension, RemoveAxis};
use ndarray_layernorm::prelude::*;

fn vector<A: TestFloat>(values: &[f64]) -> Array1<A> {
    values.iter().map(|&v| A::from_wide(v)).collect()
}

fn matrix<A: TestFloat>(rows: &[&[f64]]) -> Array2<A> {
    let d = rows[0].len();
    let flat: Vec<A> = rows
        .iter()
        .flat_map(|r| r.iter())
        .map(|&v| A::from_wide(v))
        .collect();
    Array2::from_shape_vec((rows.len(), d), flat).unwrap()
}

/// Runs `$body` with `$x` bound to the rows of `$rows` (an `Array2`) as a
/// 1-D array (if there is one row), a 2-D array, a 3-D array of shape
/// `(rows, 1, d)` and an `IxDyn` array of shape `[1, rows, d]`.
macro_rules! in_every_dim {
    ($rows:expr, |$x:ident| $body:block) => {{
        let rows: Array2<_> = $rows;
        if rows.nrows() == 1 {
            let $x = rows.row(0).to_owned();
            $body
        }
        {
            let $x = rows.clone();
            $body
        }
        {
            let $x = rows.clone().insert_axis(Axis(1));
            $body
        }
        {
            let $x = rows.clone().insert_axis(Axis(0)).into_dyn();
            $body
        }
    }};
}

/// LayerNorm of `x` by the allocating, `_into` and `_inplace` forms (with
/// `gamma` and `beta` if given, the plain forms otherwise), checked to agree
/// bit for bit; returns the allocating form's result.
fn layer_norm_forms<A: TestFloat, D: Dimension>(
    x: &Array<A, D>,
    affine: Option<(&Array1<A>, &Array1<A>)>,
    eps: A,
) -> Array<A, D> {
    let mut into = Array::from_elem(x.raw_dim(), A::from_wide(JUNK));
    let mut inplace = x.clone();
    let y = match affine {
        Some((gamma, beta)) => {
            x.layer_norm_into(&mut into, gamma, beta, eps).unwrap();
            inplace.layer_norm_inplace(gamma, beta, eps).unwrap();
            x.layer_norm(gamma, beta, eps).unwrap()
        }
        None => {
            x.layer_norm_plain_into(&mut into, eps).unwrap();
            inplace.layer_norm_plain_inplace(eps).unwrap();
            x.layer_norm_plain(eps).unwrap()
        }
    };
    assert_eq!(y.shape(), x.shape());
    assert_eq!(
        bits(&into),
        bits(&y),
        "layer_norm _into differs ({})",
        A::NAME
    );
    assert_eq!(
        bits(&inplace),
        bits(&y),
        "layer_norm _inplace differs ({})",
        A::NAME
    );
    y
}

/// RMSNorm of `x` by the three forms (with `gamma` if given), checked to
/// agree bit for bit; returns the allocating form's result.
fn rms_norm_forms<A: TestFloat, D: Dimension>(
    x: &Array<A, D>,
    gamma: Option<&Array1<A>>,
    eps: A,
) -> Array<A, D> {
    let mut into = Array::from_elem(x.raw_dim(), A::from_wide(JUNK));
    let mut inplace = x.clone();
    let y = match gamma {
        Some(gamma) => {
            x.rms_norm_into(&mut into, gamma, eps).unwrap();
            inplace.rms_norm_inplace(gamma, eps).unwrap();
            x.rms_norm(gamma, eps).unwrap()
        }
        None => {
            x.rms_norm_plain_into(&mut into, eps).unwrap();
            inplace.rms_norm_plain_inplace(eps).unwrap();
            x.rms_norm_plain(eps).unwrap()
        }
    };
    assert_eq!(y.shape(), x.shape());
    assert_eq!(
        bits(&into),
        bits(&y),
        "rms_norm _into differs ({})",
        A::NAME
    );
    assert_eq!(
        bits(&inplace),
        bits(&y),
        "rms_norm _inplace differs ({})",
        A::NAME
    );
    y
}

/// `(mean, rms)` of every row, flattened.
fn stats_of<A: TestFloat, D: RemoveAxis>(x: &Array<A, D>) -> (Vec<f64>, Vec<f64>) {
    let (mean, rms) = x.stats().unwrap();
    assert_eq!(mean.len() * x.shape().last().unwrap(), x.len());
    assert_eq!(rms.len(), mean.len());
    (wide(&mean), wide(&rms))
}

/// Asserts that each value could be the lesson's number before it was
/// rounded to `decimals` decimals: `|got - printed| <= 0.5·10^-decimals`,
/// plus four roundings of `A` for the computed value.
fn assert_printed<A: TestFloat>(got: &[f64], printed: &[f64], decimals: i32, what: &str) {
    assert_eq!(got.len(), printed.len(), "{what}: length");
    for (i, (&g, &p)) in got.iter().zip(printed).enumerate() {
        let tol = 0.5 * 10f64.powi(-decimals) + 4.0 * A::UNIT * p.abs().max(1.0);
        assert!(
            (g - p).abs() <= tol,
            "{what} [{i}] ({}): got {g}, the lesson prints {p} ({decimals} decimals)",
            A::NAME
        );
    }
}

fn repeat(row: &[f64], times: usize) -> Vec<f64> {
    row.iter()
        .copied()
        .cycle()
        .take(row.len() * times)
        .collect()
}

// ---------------------------------------------------------------------------
// LayerNorm trace: x = [2, 4, 6, 8], gamma = [2, 1, 1, 0.5], beta = [0, 0, 1, 0],
// eps = 1e-5. mean 5, var 5, sqrt(5.00001) = 2.2361,
// normalised = [-1.3416, -0.4472, 0.4472, 1.3416],
// y = [-2.6833, -0.4472, 1.4472, 0.6708].

fn trace_2468<A: TestFloat>() {
    let gamma = vector::<A>(&[2.0, 1.0, 1.0, 0.5]);
    let beta = vector::<A>(&[0.0, 0.0, 1.0, 0.0]);
    let eps = A::from_wide(1e-5);
    let normalised = [-1.3416, -0.4472, 0.4472, 1.3416];
    let y = [-2.6833, -0.4472, 1.4472, 0.6708];

    // One row, and the same row twice (to see rows are independent).
    for copies in [1, 2] {
        let x = Array2::from_shape_vec((copies, 4), repeat(&[2.0, 4.0, 6.0, 8.0], copies))
            .unwrap()
            .mapv(A::from_wide);
        in_every_dim!(x, |x| {
            let n = layer_norm_forms(&x, None, eps);
            assert_printed::<A>(&wide(&n), &repeat(&normalised, copies), 4, "normalised");
            let out = layer_norm_forms(&x, Some((&gamma, &beta)), eps);
            assert_printed::<A>(&wide(&out), &repeat(&y, copies), 4, "y");

            let (mean, rms) = stats_of(&x);
            // mean = 20 / 4 = 5, exactly representable and exactly computed.
            assert!(mean.iter().all(|&m| m == 5.0), "mean {mean:?}");
            // rms of x itself: sqrt((4 + 16 + 36 + 64) / 4) = sqrt(30).
            for &r in &rms {
                assert!(
                    ulps(A::from_wide(r), A::from_wide(30f64.sqrt())) <= 1,
                    "rms {r}"
                );
            }
        });
    }

    // var = (9 + 1 + 1 + 9) / 4 = 5: the rms of the deviations [-3, -1, 1, 3]
    // is sqrt(5) = 2.2361 (and sqrt(5.00001) prints the same to 4 decimals).
    let deviations = matrix::<A>(&[&[-3.0, -1.0, 1.0, 3.0]]);
    in_every_dim!(deviations, |x| {
        let (mean, rms) = stats_of(&x);
        assert_eq!(mean, vec![0.0]);
        assert_printed::<A>(&rms, &[2.2361], 4, "sqrt(var)");
        let root = (rms[0] * rms[0] + 1e-5).sqrt();
        assert_printed::<A>(&[root], &[2.2361], 4, "sqrt(var + eps)");
    });
}

#[test]
fn layer_norm_trace_2_4_6_8_f64() {
    trace_2468::<f64>();
}

#[test]
fn layer_norm_trace_2_4_6_8_f32() {
    trace_2468::<f32>();
}

// ---------------------------------------------------------------------------
// RMSNorm trace: x = [2, -2, 4, -4], mean of squares 10,
// y = [0.6325, -0.6325, 1.2649, -1.2649] * gamma.

fn rms_trace<A: TestFloat>() {
    let x = matrix::<A>(&[&[2.0, -2.0, 4.0, -4.0]]);
    let printed = [0.6325, -0.6325, 1.2649, -1.2649];
    let gamma = [2.0, -1.0, 0.5, 1.0];
    let scaled: Vec<f64> = printed.iter().zip(&gamma).map(|(p, g)| p * g).collect();
    // The lesson gives no eps; try none and the usual RMSNorm default 1e-6,
    // which changes the result by about 5e-8 relative.
    for eps in [0.0, 1e-6] {
        let eps = A::from_wide(eps);
        in_every_dim!(x.clone(), |x| {
            let y = rms_norm_forms(&x, None, eps);
            assert_printed::<A>(&wide(&y), &printed, 4, "rms_norm");
            let ones = vector::<A>(&[1.0; 4]);
            let y1 = rms_norm_forms(&x, Some(&ones), eps);
            assert_eq!(bits(&y1), bits(&y), "gamma = 1 must not change the result");
            // Times gamma: each printed value carries 0.5e-4, scaled by |gamma|
            // at most 2, so check to 3 decimals of the product.
            let yg = rms_norm_forms(&x, Some(&vector::<A>(&gamma)), eps);
            assert_printed::<A>(&wide(&yg), &scaled, 3, "rms_norm * gamma");
            // The mean of squares is 10: rms = sqrt(10).
            let (_, rms) = stats_of(&x);
            assert!(ulps(A::from_wide(rms[0]), A::from_wide(10f64.sqrt())) <= 1);
        });
    }
}

#[test]
fn rms_norm_trace_f64() {
    rms_trace::<f64>();
}

#[test]
fn rms_norm_trace_f32() {
    rms_trace::<f32>();
}

// ---------------------------------------------------------------------------
// layer_norm([[1, 2, 3]], [1, 1, 1], [0, 0, 0]) = [[-1.22474, 0, 1.22474]]
// (mean 2, variance 2/3).

fn one_two_three<A: TestFloat>() {
    let x = matrix::<A>(&[&[1.0, 2.0, 3.0]]);
    let gamma = vector::<A>(&[1.0; 3]);
    let beta = vector::<A>(&[0.0; 3]);
    // The example names no eps: both 0 and the default 1e-5 print the same.
    for eps in [0.0, 1e-5] {
        let eps = A::from_wide(eps);
        in_every_dim!(x.clone(), |x| {
            let y = layer_norm_forms(&x, Some((&gamma, &beta)), eps);
            assert_printed::<A>(&wide(&y), &[-1.22474, 0.0, 1.22474], 5, "[1, 2, 3]");
            let plain = layer_norm_forms(&x, None, eps);
            // n·1 + 0 equals n (bits may differ only in the sign of a zero).
            assert_eq!(wide(&plain), wide(&y));
            let (mean, _) = stats_of(&x);
            assert_eq!(mean, vec![2.0]);
            // rms of [-1, 0, 1] is sqrt(2/3), the standard deviation.
            let centred = x.mapv(|v| A::from_wide(v.wide() - 2.0));
            let (_, sd) = stats_of(&centred);
            assert!(ulps(A::from_wide(sd[0]), A::from_wide((2.0f64 / 3.0).sqrt())) <= 1);
        });
    }
}

#[test]
fn one_two_three_f64() {
    one_two_three::<f64>();
}

#[test]
fn one_two_three_f32() {
    one_two_three::<f32>();
}

// ---------------------------------------------------------------------------
// layer_norm([[2, 2], [0, 4]], [2, 1], [0.5, -0.5]) = [[0.5, -0.5], [-1.5, 0.499999]]:
// the constant row gives beta. The 0.499999 (not 0.5) shows eps > 0; with
// the default eps = 1e-5, row 2 is [-4, 2] / sqrt(4.00001) + beta.

fn constant_row_gives_beta<A: TestFloat>() {
    let x = matrix::<A>(&[&[2.0, 2.0], &[0.0, 4.0]]);
    let gamma = vector::<A>(&[2.0, 1.0]);
    let beta = vector::<A>(&[0.5, -0.5]);
    let eps = A::from_wide(1e-5);
    let closed = [
        2.0 * -2.0 / 4.00001f64.sqrt() + 0.5,
        2.0 / 4.00001f64.sqrt() - 0.5,
    ];
    in_every_dim!(x.clone(), |x| {
        let y = layer_norm_forms(&x, Some((&gamma, &beta)), eps);
        let y = wide(&y);
        // Row 1 is exactly beta.
        assert_eq!(y[0], 0.5);
        assert_eq!(y[1], -0.5);
        // Row 2 to the lesson's decimals: -1.5 (1 decimal), 0.499999 (6).
        assert_printed::<A>(&y[2..3], &[-1.5], 1, "[0, 4] first");
        assert_printed::<A>(&y[3..4], &[0.499999], 6, "[0, 4] second");
        // And against the closed form, to a few roundings of A.
        for (g, c) in y[2..].iter().zip(closed) {
            assert!((g - c).abs() <= 8.0 * A::UNIT * c.abs(), "{g} vs {c}");
        }
    });
}

#[test]
fn constant_row_gives_beta_f64() {
    constant_row_gives_beta::<f64>();
}

#[test]
fn constant_row_gives_beta_f32() {
    constant_row_gives_beta::<f32>();
}

// ---------------------------------------------------------------------------
// x = [3, 4] without affine transforms or epsilon: LayerNorm gives [-1, 1]
// exactly (mean 3.5, deviations ±0.5, var 0.25, std 0.5, all exact), RMSNorm
// gives [3, 4] / sqrt(12.5).

fn three_four<A: TestFloat>() {
    let x = matrix::<A>(&[&[3.0, 4.0]]);
    let zero = A::from_wide(0.0);
    let s = 12.5f64.sqrt();
    in_every_dim!(x.clone(), |x| {
        let y = layer_norm_forms(&x, None, zero);
        assert_eq!(wide(&y), vec![-1.0, 1.0]);
        let r = rms_norm_forms(&x, None, zero);
        let r = wide(&r);
        // The f64 closed form carries up to 1.5 ulps (one division of a
        // correctly rounded root); allow 2 for f64, and 1 for f32 whose
        // rounding of that value is the exactly rounded result.
        let allowed = if A::UNIT < 1e-10 { 2 } else { 1 };
        for (got, closed) in r.iter().zip([3.0 / s, 4.0 / s]) {
            let u = ulps(A::from_wide(*got), A::from_wide(closed));
            assert!(u <= allowed, "{got} vs {closed}: {u} ulps ({})", A::NAME);
        }
    });
}

#[test]
fn three_four_eps_zero_f64() {
    three_four::<f64>();
}

#[test]
fn three_four_eps_zero_f32() {
    three_four::<f32>();
}

// ---------------------------------------------------------------------------
// x = [1, 2, 3, 4], no eps: mean 2.5, std = sqrt(1.25) = 1.118,
// rms = sqrt(7.5) = 2.7386 (2.739 to 3 decimals),
// LayerNorm [-1.342, -0.447, 0.447, 1.342],
// RMSNorm [0.365, 0.73, 1.095, 1.461] with mean 0.913 and rms 1.

fn one_to_four<A: TestFloat>() {
    let x = matrix::<A>(&[&[1.0, 2.0, 3.0, 4.0]]);
    let zero = A::from_wide(0.0);
    in_every_dim!(x.clone(), |x| {
        let (mean, rms) = stats_of(&x);
        assert_eq!(mean, vec![2.5]);
        assert_printed::<A>(&rms, &[2.7386], 4, "rms");
        assert_printed::<A>(&rms, &[2.739], 3, "rms");
        assert!(ulps(A::from_wide(rms[0]), A::from_wide(7.5f64.sqrt())) <= 1);

        let centred = x.mapv(|v| A::from_wide(v.wide() - 2.5));
        let (_, sd) = stats_of(&centred);
        assert_printed::<A>(&sd, &[1.118], 3, "std");

        let ln = layer_norm_forms(&x, None, zero);
        assert_printed::<A>(&wide(&ln)[..1], &[-1.342], 3, "LayerNorm first output");
        assert_printed::<A>(&wide(&ln), &[-1.342, -0.447, 0.447, 1.342], 3, "LayerNorm");

        let rn = rms_norm_forms(&x, None, zero);
        assert_printed::<A>(&wide(&rn)[..1], &[0.365], 3, "RMSNorm first output");
        assert_printed::<A>(&wide(&rn), &[0.365, 0.73, 1.095, 1.461], 3, "RMSNorm");

        // RMSNorm's output: mean 0.913, root mean square 1; LayerNorm's: mean 0.
        let (rn_mean, rn_rms) = stats_of(&rn);
        assert_printed::<A>(&rn_mean, &[0.913], 3, "mean of RMSNorm output");
        // Each output carries at most 1.5 ulps (2^-22.4 relative) and the
        // rms half an ulp more: 8 roundings is a safe bound.
        assert!((rn_rms[0] - 1.0).abs() <= 8.0 * A::UNIT, "{rn_rms:?}");
        let (ln_mean, ln_rms) = stats_of(&ln);
        assert!(ln_mean[0].abs() <= 8.0 * A::UNIT, "{ln_mean:?}");
        assert!((ln_rms[0] - 1.0).abs() <= 8.0 * A::UNIT, "{ln_rms:?}");
    });
}

#[test]
fn one_to_four_f64() {
    one_to_four::<f64>();
}

#[test]
fn one_to_four_f32() {
    one_to_four::<f32>();
}

// ---------------------------------------------------------------------------
// A constant vector like [7, 7, 7] normalises to all zeros, and the output is
// then exactly beta.

fn seven_seven_seven<A: TestFloat>() {
    let x = matrix::<A>(&[&[7.0, 7.0, 7.0]]);
    let gamma = vector::<A>(&[2.0, -1.0, 0.5]);
    let beta = vector::<A>(&[1.5, -0.0, -2.0]);
    for eps in [0.0, 1e-5] {
        let eps = A::from_wide(eps);
        in_every_dim!(x.clone(), |x| {
            // (x - mean) is +0 exactly, and 0 / positive is +0.
            let plain = layer_norm_forms(&x, None, eps);
            assert_eq!(bits(&plain), bits(&vector::<A>(&[0.0; 3])));
            let y = layer_norm_forms(&x, Some((&gamma, &beta)), eps);
            assert_eq!(bits(&y), bits(&beta), "exactly beta, -0.0 included");
        });
    }
}

#[test]
fn seven_seven_seven_f64() {
    seven_seven_seven::<f64>();
}

#[test]
fn seven_seven_seven_f32() {
    seven_seven_seven::<f32>();
}

/// The lessons' examples as a batch: rows of different examples side by side
/// in one array give each row's own result (LayerNorm is per row, unlike
/// BatchNorm).
#[test]
fn rows_are_independent() {
    let batch = array![
        [2.0_f64, 4.0, 6.0, 8.0],
        [1.0, 2.0, 3.0, 4.0],
        [7.0, 7.0, 7.0, 7.0]
    ];
    let all = batch.layer_norm_plain(1e-5).unwrap();
    for (i, row) in batch.rows().into_iter().enumerate() {
        let alone = row.layer_norm_plain(1e-5).unwrap();
        assert_eq!(bits(all.row(i)), bits(&alone));
    }
}
