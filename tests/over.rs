//! The forms over several trailing axes (`_over`): for 2-D to 4-D inputs,
//! every first axis `a` and every memory layout, each gives the bits of the
//! last-axis form on a standard-layout copy reshaped to `(leading, d)`; the
//! training statistics (ONNX's `Mean` and `InvStdDev`) have the leading
//! shape and match an exact reference; bad arguments give typed errors.

mod common;

#[path = "common/exact.rs"]
mod exact;

use common::training::noise;
use common::TestFloat;
use exact::{exact_layer_norm, exact_rms_norm, exact_rstd, exact_stats};
use ndarray::{
    Array, Array1, Array2, ArrayD, ArrayView1, ArrayViewD, ArrayViewMutD, Axis, IxDyn,
    ShapeBuilder, Slice,
};
use ndarray_layernorm::prelude::*;
use ndarray_layernorm::Operand;

const SHAPES: &[&[usize]] = &[
    &[5, 6],
    &[1, 7],
    &[3, 4, 5],
    &[4, 1, 3],
    &[2, 3, 4, 5],
    &[3, 1, 2, 1],
];

/// Values in logical order: a common offset and noise, so that a sum taken
/// in another order shows in the bits.
fn values<A: TestFloat>(shape: &[usize], seed: u64) -> ArrayD<A> {
    let len = shape.iter().product();
    let v = noise(seed, len)
        .into_iter()
        .map(|n| A::from_wide(3.0 + n * 1.5))
        .collect();
    ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
}

fn bits<A: TestFloat>(a: impl IntoIterator<Item = A>) -> Vec<u64> {
    a.into_iter().map(TestFloat::bits).collect()
}

/// The permutations of `n` axes tried as memory orders.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    let mut all = vec![vec![]];
    for _ in 0..n {
        all = all
            .into_iter()
            .flat_map(|p: Vec<usize>| {
                let taken = p.clone();
                (0..n)
                    .filter(move |i| !taken.contains(i))
                    .map(move |i| [p.clone(), vec![i]].concat())
                    .collect::<Vec<_>>()
            })
            .collect();
    }
    all
}

/// Calls `f` with views of `a`'s values in many layouts: C and Fortran
/// order, every order of the axes in memory, a step along each axis,
/// negative strides, and broadcasting along each axis of length 1 of a
/// source whose values repeat along it.
fn for_each_layout<A: TestFloat>(a: &ArrayD<A>, mut f: impl FnMut(&str, ArrayViewD<'_, A>)) {
    let shape = a.shape().to_vec();
    let n = shape.len();
    for perm in permutations(n) {
        let permuted_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let mut store = ArrayD::from_elem(IxDyn(&permuted_shape), A::from_wide(-7.0));
        let mut inverse = vec![0; n];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i;
        }
        store.view_mut().permuted_axes(inverse.clone()).assign(a);
        f(
            &format!("memory order {perm:?}"),
            store.view().permuted_axes(inverse),
        );
    }
    for axis in 0..n {
        let mut wide = shape.clone();
        wide[axis] *= 2;
        let mut store = ArrayD::from_elem(IxDyn(&wide), A::from_wide(-7.0));
        store
            .slice_axis_mut(Axis(axis), Slice::new(0, None, 2))
            .assign(a);
        f(
            &format!("step 2 along axis {axis}"),
            store.slice_axis(Axis(axis), Slice::new(0, None, 2)),
        );
    }
    let mut reversed = a.view();
    for axis in 0..n {
        reversed.invert_axis(Axis(axis));
    }
    let store = reversed.to_owned();
    let mut negative = store.view();
    for axis in 0..n {
        negative.invert_axis(Axis(axis));
    }
    f("negative strides", negative);
}

/// `a`'s values viewed as `(leading, d)`, in a standard-layout copy.
fn flat<A: TestFloat>(a: &ArrayViewD<'_, A>, axis: usize) -> Array2<A> {
    let lead = a.shape()[..axis].iter().product();
    let d = a.shape()[axis..].iter().product();
    Array2::from_shape_vec((lead, d), a.iter().copied().collect()).unwrap()
}

/// The bits of every `_over` result for `x`, and of the reference: the
/// last-axis forms on the standard-layout copy.
#[derive(Debug, PartialEq)]
struct Bits {
    layer_norm: Vec<u64>,
    plain: Vec<u64>,
    rms_norm: Vec<u64>,
    rms_plain: Vec<u64>,
    mean: Vec<u64>,
    rms: Vec<u64>,
    train_mean: Vec<u64>,
    train_rstd: Vec<u64>,
    rrms: Vec<u64>,
    dx: Vec<u64>,
    dgamma: Vec<u64>,
    dbeta: Vec<u64>,
    rms_dx: Vec<u64>,
    rms_dgamma: Vec<u64>,
    leading_shape: Vec<usize>,
}

fn over_bits<A: TestFloat>(
    x: &ArrayViewD<'_, A>,
    dy: &ArrayViewD<'_, A>,
    axis: Axis,
    gamma: &ArrayViewD<'_, A>,
    beta: &ArrayViewD<'_, A>,
    eps: A,
) -> Bits {
    let (mean, rms) = x.stats_over(axis).unwrap();
    let (y, stats) = x.layer_norm_train_over(axis, gamma, beta, eps).unwrap();
    assert_eq!(
        bits(y.iter().copied()),
        bits(x.layer_norm_over(axis, gamma, beta, eps).unwrap())
    );
    let (_, rms_stats) = x.rms_norm_train_over(axis, gamma, eps).unwrap();
    let grads = x.layer_norm_backward_over(axis, dy, gamma, eps).unwrap();
    let saved = x
        .layer_norm_backward_with_stats_over(axis, dy, gamma, &stats)
        .unwrap();
    assert_eq!(
        bits(saved.dx),
        bits(grads.dx.iter().copied()),
        "backward from saved statistics"
    );
    assert_eq!(saved.dgamma, grads.dgamma, "backward from saved statistics");
    let rms_grads = x.rms_norm_backward_over(axis, dy, gamma, eps).unwrap();
    let rms_saved = x
        .rms_norm_backward_with_stats_over(axis, dy, gamma, &rms_stats)
        .unwrap();
    assert_eq!(
        bits(rms_saved.dx),
        bits(rms_grads.dx.iter().copied()),
        "RMSNorm from saved statistics"
    );
    assert_eq!(grads.dgamma.shape(), gamma.shape());
    assert_eq!(mean.shape(), &x.shape()[..axis.index()]);
    Bits {
        layer_norm: bits(y.iter().copied()),
        plain: bits(x.layer_norm_plain_over(axis, eps).unwrap()),
        rms_norm: bits(x.rms_norm_over(axis, gamma, eps).unwrap()),
        rms_plain: bits(x.rms_norm_plain_over(axis, eps).unwrap()),
        mean: bits(mean.iter().copied()),
        rms: bits(rms),
        train_mean: stats.mean().iter().map(|m| m.to_bits()).collect(),
        train_rstd: stats.rstd().iter().map(|m| m.to_bits()).collect(),
        rrms: rms_stats.rrms().iter().map(|m| m.to_bits()).collect(),
        dx: bits(grads.dx),
        dgamma: bits(grads.dgamma),
        dbeta: bits(grads.dbeta),
        rms_dx: bits(rms_grads.dx),
        rms_dgamma: bits(rms_grads.dgamma),
        leading_shape: mean.shape().to_vec(),
    }
}

fn flat_bits<A: TestFloat>(
    x: &Array2<A>,
    dy: &Array2<A>,
    gamma: &ArrayView1<'_, A>,
    beta: &ArrayView1<'_, A>,
    eps: A,
    leading_shape: &[usize],
) -> Bits {
    let (mean, rms) = x.stats().unwrap();
    let (y, stats) = x.layer_norm_train(gamma, beta, eps).unwrap();
    let (_, rms_stats) = x.rms_norm_train(gamma, eps).unwrap();
    let grads = x.layer_norm_backward(dy, gamma, eps).unwrap();
    let rms_grads = x.rms_norm_backward(dy, gamma, eps).unwrap();
    Bits {
        layer_norm: bits(y),
        plain: bits(x.layer_norm_plain(eps).unwrap()),
        rms_norm: bits(x.rms_norm(gamma, eps).unwrap()),
        rms_plain: bits(x.rms_norm_plain(eps).unwrap()),
        mean: bits(mean),
        rms: bits(rms),
        train_mean: stats.mean().iter().map(|m| m.to_bits()).collect(),
        train_rstd: stats.rstd().iter().map(|m| m.to_bits()).collect(),
        rrms: rms_stats.rrms().iter().map(|m| m.to_bits()).collect(),
        dx: bits(grads.dx),
        dgamma: bits(grads.dgamma),
        dbeta: bits(grads.dbeta),
        rms_dx: bits(rms_grads.dx),
        rms_dgamma: bits(rms_grads.dgamma),
        leading_shape: leading_shape.to_vec(),
    }
}

fn every_form_matches_the_reshaped_copy<A: TestFloat>() {
    let mut cases = 0;
    for (s, shape) in SHAPES.iter().enumerate() {
        let x = values::<A>(shape, s as u64);
        let dy = values::<A>(shape, 100 + s as u64);
        for a in 0..shape.len() {
            let axis = Axis(a);
            let trailing = IxDyn(&shape[a..]);
            let gamma = values::<A>(&shape[a..], 200 + a as u64);
            let beta = values::<A>(&shape[a..], 300 + a as u64);
            for eps in [0.0, 1e-5, 0.25] {
                let eps = A::from_wide(eps);
                let (fx, fdy) = (flat(&x.view(), a), flat(&dy.view(), a));
                let (fg, fb) = (gamma.flatten(), beta.flatten());
                let expected = flat_bits(&fx, &fdy, &fg.view(), &fb.view(), eps, &shape[..a]);
                for_each_layout(&x, |name, xv| {
                    let got = over_bits(&xv, &dy.view(), axis, &gamma.view(), &beta.view(), eps);
                    assert_eq!(
                        got,
                        expected,
                        "{} {shape:?} from axis {a}, x in {name}",
                        A::NAME
                    );
                    cases += 1;
                });
                // dy, gamma and beta in other layouts too.
                let mut dy_f = ArrayD::zeros(IxDyn(shape).f());
                dy_f.assign(&dy);
                let mut gamma_f = ArrayD::zeros(trailing.clone().f());
                gamma_f.assign(&gamma);
                let got = over_bits(
                    &x.view(),
                    &dy_f.view(),
                    axis,
                    &gamma_f.view(),
                    &beta.view(),
                    eps,
                );
                assert_eq!(
                    got,
                    expected,
                    "{} {shape:?} from axis {a}, Fortran dy and gamma",
                    A::NAME
                );
            }
        }
    }
    assert!(cases > 500, "only {cases} cases ran");
}

#[test]
fn every_form_matches_the_reshaped_copy_f32() {
    every_form_matches_the_reshaped_copy::<f32>();
}

#[test]
fn every_form_matches_the_reshaped_copy_f64() {
    every_form_matches_the_reshaped_copy::<f64>();
}

/// The `_into` forms into outputs of every layout, and the `_inplace` forms
/// on every writable layout, give the bits of the allocating forms.
fn writing_forms_match<A: TestFloat>() {
    for (s, shape) in SHAPES.iter().enumerate() {
        let x = values::<A>(shape, 400 + s as u64);
        let dy = values::<A>(shape, 500 + s as u64);
        for a in 0..shape.len() {
            let axis = Axis(a);
            let gamma = values::<A>(&shape[a..], 600);
            let beta = values::<A>(&shape[a..], 700);
            let eps = A::from_wide(1e-5);
            let y = x.layer_norm_over(axis, &gamma, &beta, eps).unwrap();
            let plain = x.layer_norm_plain_over(axis, eps).unwrap();
            let r = x.rms_norm_over(axis, &gamma, eps).unwrap();
            let r_plain = x.rms_norm_plain_over(axis, eps).unwrap();
            let (_, stats) = x.layer_norm_train_over(axis, &gamma, &beta, eps).unwrap();
            let (_, rms_stats) = x.rms_norm_train_over(axis, &gamma, eps).unwrap();
            let grads = x.layer_norm_backward_over(axis, &dy, &gamma, eps).unwrap();
            let rms_grads = x.rms_norm_backward_over(axis, &dy, &gamma, eps).unwrap();
            let zeros = ArrayD::<A>::zeros(IxDyn(shape));
            for_each_layout(&zeros, |name, out| {
                // The layout of `out`, made writable.
                let mut store = out.to_owned();
                let mut check =
                    |write: &dyn Fn(ArrayViewMutD<'_, A>), expected: &ArrayD<A>, what: &str| {
                        let mut target = zeros.clone();
                        let mut view = layout_like(&mut store, &out);
                        write(view.view_mut());
                        target.assign(&view);
                        assert_eq!(
                            bits(target),
                            bits(expected.iter().copied()),
                            "{what} {shape:?} from {a} into {name}"
                        );
                    };
                check(
                    &|mut o| {
                        x.layer_norm_into_over(axis, &mut o, &gamma, &beta, eps)
                            .unwrap()
                    },
                    &y,
                    "layer_norm_into_over",
                );
                check(
                    &|mut o| x.layer_norm_plain_into_over(axis, &mut o, eps).unwrap(),
                    &plain,
                    "layer_norm_plain_into_over",
                );
                check(
                    &|mut o| x.rms_norm_into_over(axis, &mut o, &gamma, eps).unwrap(),
                    &r,
                    "rms_norm_into_over",
                );
                check(
                    &|mut o| x.rms_norm_plain_into_over(axis, &mut o, eps).unwrap(),
                    &r_plain,
                    "rms_norm_plain_into_over",
                );
                check(
                    &|mut o| {
                        o.assign(&x);
                        o.layer_norm_inplace_over(axis, &gamma, &beta, eps).unwrap()
                    },
                    &y,
                    "layer_norm_inplace_over",
                );
                check(
                    &|mut o| {
                        o.assign(&x);
                        o.layer_norm_plain_inplace_over(axis, eps).unwrap()
                    },
                    &plain,
                    "layer_norm_plain_inplace_over",
                );
                check(
                    &|mut o| {
                        o.assign(&x);
                        o.rms_norm_inplace_over(axis, &gamma, eps).unwrap()
                    },
                    &r,
                    "rms_norm_inplace_over",
                );
                check(
                    &|mut o| {
                        o.assign(&x);
                        o.rms_norm_plain_inplace_over(axis, eps).unwrap()
                    },
                    &r_plain,
                    "rms_norm_plain_inplace_over",
                );
                check(
                    &|mut o| {
                        let (dg, db) = x
                            .layer_norm_backward_into_over(axis, &mut o, &dy, &gamma, eps)
                            .unwrap();
                        assert_eq!((dg, db), (grads.dgamma.clone(), grads.dbeta.clone()));
                    },
                    &grads.dx,
                    "layer_norm_backward_into_over",
                );
                check(
                    &|mut o| {
                        let (dg, db) = x
                            .layer_norm_backward_with_stats_into_over(
                                axis, &mut o, &dy, &gamma, &stats,
                            )
                            .unwrap();
                        assert_eq!((dg, db), (grads.dgamma.clone(), grads.dbeta.clone()));
                    },
                    &grads.dx,
                    "layer_norm_backward_with_stats_into_over",
                );
                check(
                    &|mut o| {
                        let dg = x
                            .rms_norm_backward_into_over(axis, &mut o, &dy, &gamma, eps)
                            .unwrap();
                        assert_eq!(dg, rms_grads.dgamma);
                    },
                    &rms_grads.dx,
                    "rms_norm_backward_into_over",
                );
                check(
                    &|mut o| {
                        let dg = x
                            .rms_norm_backward_with_stats_into_over(
                                axis, &mut o, &dy, &gamma, &rms_stats,
                            )
                            .unwrap();
                        assert_eq!(dg, rms_grads.dgamma);
                    },
                    &rms_grads.dx,
                    "rms_norm_backward_with_stats_into_over",
                );
            });
        }
    }
}

/// A mutable view of `store` (an owned copy of `like`'s values) with the
/// strides of `like` reproduced where possible: the same axis order in
/// memory and the same signs.
fn layout_like<'a, A: TestFloat>(
    store: &'a mut ArrayD<A>,
    like: &ArrayViewD<'_, A>,
) -> ArrayViewMutD<'a, A> {
    // Order the axes of a fresh store by the strides of `like`, then view it
    // back in logical order.
    let n = like.ndim();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(like.strides()[i].unsigned_abs()));
    let shape: Vec<usize> = order.iter().map(|&i| like.shape()[i]).collect();
    let mut inverse = vec![0; n];
    for (i, &p) in order.iter().enumerate() {
        inverse[p] = i;
    }
    *store = ArrayD::zeros(IxDyn(&shape));
    let mut view = store.view_mut().permuted_axes(inverse);
    for axis in 0..n {
        if like.strides()[axis] < 0 {
            view.invert_axis(Axis(axis));
        }
    }
    view
}

#[test]
fn writing_forms_match_f32() {
    writing_forms_match::<f32>();
}

#[test]
fn writing_forms_match_f64() {
    writing_forms_match::<f64>();
}

/// Broadcast inputs: a leading axis and a normalised axis of stride 0.
#[test]
fn broadcast_views_match_the_reshaped_copy() {
    let base = values::<f64>(&[1, 3, 1, 5], 9);
    let x = base.broadcast(IxDyn(&[4, 3, 2, 5])).unwrap();
    let copy = x.to_owned();
    for a in 0..4 {
        let gamma = values::<f64>(&[4, 3, 2, 5][a..], 10);
        let beta = values::<f64>(&[4, 3, 2, 5][a..], 11);
        let axis = Axis(a);
        assert_eq!(
            bits(x.layer_norm_over(axis, &gamma, &beta, 1e-5).unwrap()),
            bits(copy.layer_norm_over(axis, &gamma, &beta, 1e-5).unwrap()),
            "from axis {a}"
        );
        let (m, r) = x.stats_over(axis).unwrap();
        let (cm, cr) = copy.stats_over(axis).unwrap();
        assert_eq!((bits(m), bits(r)), (bits(cm), bits(cr)));
        let dy = values::<f64>(&[4, 3, 2, 5], 12);
        assert_eq!(
            x.rms_norm_backward_over(axis, &dy, &gamma, 1e-6).unwrap(),
            copy.rms_norm_backward_over(axis, &dy, &gamma, 1e-6)
                .unwrap()
        );
    }
}

/// Calls large enough to run on several threads (and a Fortran-order one,
/// gathered), against the reshaped copy.
#[test]
fn large_calls_match_the_reshaped_copy() {
    let shape = [48, 16, 8, 32];
    let x = values::<f32>(&shape, 21);
    let mut f = ArrayD::zeros(IxDyn(&shape).f());
    f.assign(&x);
    let gamma = values::<f32>(&shape[1..], 22);
    let beta = values::<f32>(&shape[1..], 23);
    let fx = flat(&x.view(), 1);
    let expected = fx
        .layer_norm(&gamma.flatten(), &beta.flatten(), 1e-5)
        .unwrap();
    for (name, v) in [("C order", x.view()), ("Fortran order", f.view())] {
        let y = v.layer_norm_over(Axis(1), &gamma, &beta, 1e-5).unwrap();
        assert_eq!(bits(y), bits(expected.iter().copied()), "{name}");
        let (mean, _) = v.stats_over(Axis(1)).unwrap();
        assert_eq!(bits(mean), bits(fx.stats().unwrap().0), "{name}");
        let (y, stats) = v
            .layer_norm_train_over(
                Axis(2),
                &gamma.index_axis(Axis(0), 0),
                &beta.index_axis(Axis(0), 0),
                1e-5,
            )
            .unwrap();
        assert_eq!(stats.mean().shape(), &[48, 16]);
        assert_eq!(
            bits(y),
            bits(
                x.layer_norm_over(
                    Axis(2),
                    &gamma.index_axis(Axis(0), 0),
                    &beta.index_axis(Axis(0), 0),
                    1e-5
                )
                .unwrap()
            )
        );
    }
}

/// ONNX's `Mean` and `InvStdDev`, and the outputs, against the exact
/// reference for `f64` inputs of 2 to 4 axes, every `axis`, several `eps`.
#[test]
fn statistics_and_outputs_match_the_exact_reference() {
    let mut worst = (0.0f64, 0.0f64, 0.0f64);
    for (s, shape) in SHAPES.iter().enumerate() {
        let mut x = values::<f64>(shape, 800 + s as u64);
        // Rows with a large common offset, whose naive sums lose digits.
        x.iter_mut().step_by(3).for_each(|v| *v += 1e9);
        for a in 0..shape.len() {
            let axis = Axis(a);
            let ones = ArrayD::<f64>::ones(IxDyn(&shape[a..]));
            let zeros = ArrayD::<f64>::zeros(IxDyn(&shape[a..]));
            for eps in [0.0, 1e-12, 1e-5, 1.0] {
                let (y, stats) = x.layer_norm_train_over(axis, &ones, &zeros, eps).unwrap();
                let r = x.rms_norm_over(axis, &ones, eps).unwrap();
                let (mean, rstd) = (stats.mean(), stats.rstd());
                assert_eq!(mean.shape(), &shape[..a]);
                assert_eq!(rstd.shape(), &shape[..a]);
                let rows = flat(&x.view(), a);
                let (ys, rs) = (flat(&y.view(), a), flat(&r.view(), a));
                for (i, row) in rows.rows().into_iter().enumerate() {
                    let row = row.to_vec();
                    let (true_mean, _) = exact_stats(&row);
                    let got_mean = mean.as_slice().unwrap()[i];
                    let mean_err = (got_mean - true_mean).abs() / true_mean.abs();
                    assert!(
                        mean_err <= f64::EPSILON / 2.0,
                        "{shape:?} from {a}: mean {got_mean} vs {true_mean}"
                    );
                    let true_rstd = exact_rstd(&row, eps);
                    let got_rstd = rstd.as_slice().unwrap()[i];
                    if true_rstd.is_finite() {
                        let rstd_err = (got_rstd - true_rstd).abs() / true_rstd;
                        assert!(
                            rstd_err <= 2e-16 * 4.0,
                            "{shape:?} from {a} eps {eps}: rstd {got_rstd} vs {true_rstd}"
                        );
                        worst.1 = worst.1.max(rstd_err);
                    } else {
                        assert_eq!(got_rstd, f64::INFINITY);
                    }
                    worst.0 = worst.0.max(mean_err);
                    for (out, truth) in [
                        (ys.row(i), exact_layer_norm(&row, eps)),
                        (rs.row(i), exact_rms_norm(&row, eps)),
                    ] {
                        for (&g, &t) in out.iter().zip(&truth) {
                            let err = if g == t { 0.0 } else { (g - t).abs() / t.abs() };
                            assert!(err <= 2e-15, "{shape:?} from {a} eps {eps}: {g} vs {t}");
                            worst.2 = worst.2.max(err);
                        }
                    }
                }
            }
        }
    }
    println!(
        "worst relative error: mean {:e}, rstd {:e}, outputs {:e}",
        worst.0, worst.1, worst.2
    );
}

/// `f32` outputs over several axes are within one ulp of the exactly
/// rounded value.
#[test]
fn f32_outputs_are_within_one_ulp() {
    let mut worst = 0.0f64;
    for (s, shape) in SHAPES.iter().enumerate() {
        let x = values::<f32>(shape, 900 + s as u64).mapv(|v| v * 1e3 + 1e4);
        let mut f = ArrayD::zeros(IxDyn(shape).f());
        f.assign(&x);
        for a in 0..shape.len() {
            let y = f.layer_norm_plain_over(Axis(a), 1e-5).unwrap();
            let rows = flat(&x.view(), a);
            let ys = flat(&y.view(), a);
            for (row, out) in rows.rows().into_iter().zip(ys.rows()) {
                let wide: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
                for (&g, &t) in out
                    .iter()
                    .zip(&exact_layer_norm(&wide, f64::from(1e-5_f32)))
                {
                    let rounded = t as f32;
                    let ulp = (f32::from_bits(rounded.abs().to_bits() + 1) - rounded.abs()) as f64;
                    let err = (f64::from(g) - t).abs() / ulp;
                    assert!(err <= 1.0, "{shape:?} from {a}: {g} vs {t}");
                    worst = worst.max(err);
                }
            }
        }
    }
    println!("worst f32 error over several axes: {worst:.3} ulp");
}

#[test]
fn a_constant_subarray_gives_beta_and_nan_stays_in_its_row() {
    let mut x = Array::from_elem((3, 2, 2), 7.5_f32);
    x[[1, 0, 1]] = f32::NAN;
    x[[2, 1, 0]] = 1.0;
    let beta = Array2::from_shape_fn((2, 2), |(i, j)| (i * 2 + j) as f32);
    let y = x
        .layer_norm_over(Axis(1), &Array2::ones((2, 2)), &beta, 1e-5)
        .unwrap();
    assert_eq!(y.index_axis(Axis(0), 0), beta);
    assert!(y.index_axis(Axis(0), 1).iter().all(|v| v.is_nan()));
    assert!(y.index_axis(Axis(0), 2).iter().all(|v| v.is_finite()));
}

#[test]
fn axis_zero_normalises_everything_and_the_last_axis_is_the_last_axis_form() {
    let x = values::<f64>(&[3, 4, 5], 31);
    let (mean, _) = x.stats_over(Axis(0)).unwrap();
    assert_eq!(mean.ndim(), 0);
    let all = Array1::from(x.iter().copied().collect::<Vec<_>>());
    assert_eq!(mean.first(), all.stats().unwrap().0.first());
    let gamma = values::<f64>(&[5], 32);
    let beta = values::<f64>(&[5], 33);
    let g1 = gamma.clone().into_dimensionality::<ndarray::Ix1>().unwrap();
    let b1 = beta.clone().into_dimensionality::<ndarray::Ix1>().unwrap();
    assert_eq!(
        x.layer_norm_over(Axis(2), &gamma, &beta, 1e-5).unwrap(),
        x.layer_norm(&g1, &b1, 1e-5).unwrap()
    );
}

#[test]
fn errors_name_the_axis_and_both_shapes() {
    let x = values::<f64>(&[2, 3, 4], 41);
    let g = ArrayD::<f64>::ones(IxDyn(&[3, 4]));
    let b = ArrayD::<f64>::zeros(IxDyn(&[3, 4]));
    assert_eq!(
        x.layer_norm_over(Axis(3), &g, &b, 1e-5),
        Err(NormError::AxisOutOfBounds { axis: 3, ndim: 3 })
    );
    let scalar = ArrayD::<f64>::zeros(IxDyn(&[]));
    assert_eq!(
        scalar.stats_over(Axis(0)),
        Err(NormError::AxisOutOfBounds { axis: 0, ndim: 0 })
    );
    let wrong = Array2::<f64>::ones((4, 3));
    let err = x
        .layer_norm_over(Axis(1), &wrong, &wrong, 1e-5)
        .unwrap_err();
    assert_eq!(
        err,
        NormError::TrailingShapeMismatch {
            operand: Operand::Gamma,
            expected: vec![3, 4],
            found: vec![4, 3]
        }
    );
    assert!(err.is_shape_error());
    assert_eq!(
        err.to_string(),
        "gamma has shape [4, 3], expected [3, 4] (the shape of the axes normalised over)"
    );
    assert_eq!(
        x.rms_norm_over(Axis(2), &g, 1e-6),
        Err(NormError::TrailingShapeMismatch {
            operand: Operand::Gamma,
            expected: vec![4],
            found: vec![3, 4]
        })
    );
    let beta1 = Array1::<f64>::zeros(12);
    assert!(matches!(
        x.layer_norm_over(Axis(1), &g, &beta1.into_dyn(), 1e-5),
        Err(NormError::TrailingShapeMismatch {
            operand: Operand::Beta,
            ..
        })
    ));
    let empty = ArrayD::<f64>::zeros(IxDyn(&[2, 0, 3]));
    let err = empty.layer_norm_plain_over(Axis(1), 1e-5).unwrap_err();
    assert_eq!(err, NormError::EmptyAxes { shape: vec![0, 3] });
    assert_eq!(
        err.to_string(),
        "the axes to normalise over, of shape [0, 3], hold no element"
    );
    // No rows is fine: an empty result.
    let no_rows = ArrayD::<f64>::zeros(IxDyn(&[0, 3, 4]));
    assert_eq!(
        no_rows
            .layer_norm_over(Axis(1), &g, &b, 1e-5)
            .unwrap()
            .shape(),
        &[0, 3, 4]
    );
    assert!(matches!(
        x.layer_norm_over(Axis(1), &g, &b, -1.0),
        Err(NormError::InvalidEps { .. })
    ));
    // Statistics saved from another axis.
    let (_, stats) = x
        .layer_norm_train_over(
            Axis(2),
            &g.index_axis(Axis(0), 0),
            &b.index_axis(Axis(0), 0),
            1e-5,
        )
        .unwrap();
    assert_eq!(
        x.layer_norm_backward_with_stats_over(Axis(1), &x, &g, &stats),
        Err(NormError::TrailingShapeMismatch {
            operand: Operand::Stats,
            expected: vec![3, 4],
            found: vec![4]
        })
    );
    let other = values::<f64>(&[3, 3, 4], 42);
    let (_, stats) = other.layer_norm_train_over(Axis(1), &g, &b, 1e-5).unwrap();
    assert!(matches!(
        x.layer_norm_backward_with_stats_over(Axis(1), &x, &g, &stats),
        Err(NormError::ShapeMismatch {
            operand: Operand::Stats,
            ..
        })
    ));
}

#[test]
fn on_error_outputs_are_untouched() {
    let x = values::<f32>(&[2, 3, 4], 51);
    let g = ArrayD::<f32>::ones(IxDyn(&[3, 4]));
    let mut out = ArrayD::<f32>::from_elem(IxDyn(&[2, 3, 4]), 9.0);
    let before = out.clone();
    assert!(x
        .layer_norm_into_over(Axis(1), &mut out, &g, &g, f32::NAN)
        .is_err());
    assert!(x.rms_norm_into_over(Axis(0), &mut out, &g, 1e-6).is_err());
    let mut short = ArrayD::<f32>::zeros(IxDyn(&[2, 3, 5]));
    assert!(matches!(
        x.layer_norm_plain_into_over(Axis(1), &mut short, 1e-5),
        Err(NormError::ShapeMismatch {
            operand: Operand::Output,
            ..
        })
    ));
    assert!(out.layer_norm_inplace_over(Axis(2), &g, &g, 1e-5).is_err());
    assert!(x
        .layer_norm_backward_into_over(
            Axis(1),
            &mut out,
            &x.slice_axis(Axis(2), Slice::from(..3)).to_owned(),
            &g,
            1e-5
        )
        .is_err());
    assert_eq!(out, before);
}

/// Layers built with a normalised shape normalise as the `_over` forms do,
/// in every layout; their statistics keep the normalised axes with length 1.
#[test]
fn layers_over_a_normalised_shape() {
    let x = values::<f64>(&[2, 3, 4], 61);
    let dy = values::<f64>(&[2, 3, 4], 62);
    let gamma = values::<f64>(&[3, 4], 63);
    let beta = values::<f64>(&[3, 4], 64);
    let norm = LayerNorm::from_parts(
        gamma.flatten().to_owned(),
        Some(beta.flatten().to_owned()),
        1e-5,
    )
    .unwrap()
    .with_normalized_shape(&[3, 4])
    .unwrap();
    assert_eq!(norm.normalized_shape(), &[3, 4]);
    let expected = x.layer_norm_over(Axis(1), &gamma, &beta, 1e-5).unwrap();
    for_each_layout(&x, |name, xv| {
        assert_eq!(
            bits(norm.forward(&xv).unwrap()),
            bits(expected.iter().copied()),
            "{name}"
        );
    });
    let (y, stats) = norm.forward_train(&x).unwrap();
    assert_eq!(y, expected);
    assert_eq!(stats.mean().shape(), &[2, 1]);
    let (_, over_stats) = x
        .layer_norm_train_over(Axis(1), &gamma, &beta, 1e-5)
        .unwrap();
    assert_eq!(
        stats.mean().iter().collect::<Vec<_>>(),
        over_stats.mean().iter().collect::<Vec<_>>()
    );
    let grads = norm.backward(&x, &dy, &stats).unwrap();
    let over = x
        .layer_norm_backward_over(Axis(1), &dy, &gamma, 1e-5)
        .unwrap();
    assert_eq!(grads.dx, over.dx);
    assert_eq!(grads.dgamma, over.dgamma.flatten());
    assert_eq!(grads.dbeta, over.dbeta.flatten());

    let rms = RmsNorm::from_parts_zero_centred(gamma.flatten().to_owned(), 1e-6)
        .unwrap()
        .with_normalized_shape(&[3, 4])
        .unwrap();
    let gain = gamma.mapv(|w| 1.0 + w);
    let r = x.rms_norm_over(Axis(1), &gain, 1e-6).unwrap();
    let (ry, rstats) = rms.forward_train(&x).unwrap();
    assert_eq!((rms.forward(&x).unwrap(), ry), (r.clone(), r));
    assert_eq!(rstats.rrms().shape(), &[2, 1]);
    let rgrads = rms.backward(&x, &dy, &rstats).unwrap();
    assert_eq!(
        rgrads.dx,
        x.rms_norm_backward_over(Axis(1), &dy, &gain, 1e-6)
            .unwrap()
            .dx
    );

    // A 4-D input and a layer over three axes.
    let x4 = values::<f32>(&[3, 2, 2, 5], 65);
    let norm4 = LayerNorm::<f32>::new(20)
        .with_normalized_shape(&[2, 2, 5])
        .unwrap();
    let (y4, stats4) = norm4.forward_train(&x4).unwrap();
    assert_eq!(stats4.rstd().shape(), &[3, 1, 1]);
    let ones = ArrayD::<f32>::ones(IxDyn(&[2, 2, 5]));
    assert_eq!(
        y4,
        x4.layer_norm_over(Axis(1), &ones, &ones.mapv(|_| 0.0), 1e-5)
            .unwrap()
    );
}

#[test]
fn layer_shape_errors() {
    assert_eq!(
        LayerNorm::<f64>::new(12).with_normalized_shape(&[5]),
        Err(NormError::TrailingShapeMismatch {
            operand: Operand::Gamma,
            expected: vec![5],
            found: vec![12]
        })
    );
    assert!(RmsNorm::<f64>::new(1).with_normalized_shape(&[]).is_err());
    assert!(RmsNorm::<f64>::new(4)
        .with_normalized_shape(&[usize::MAX, 2])
        .is_err());
    let norm = LayerNorm::<f64>::new(12)
        .with_normalized_shape(&[3, 4])
        .unwrap();
    assert_eq!(
        norm.forward(&ArrayD::<f64>::zeros(IxDyn(&[2, 4, 3]))),
        Err(NormError::TrailingShapeMismatch {
            operand: Operand::Gamma,
            expected: vec![4, 3],
            found: vec![3, 4]
        })
    );
    assert_eq!(
        norm.forward(&Array1::<f64>::zeros(12)),
        Err(NormError::TrailingShapeMismatch {
            operand: Operand::Gamma,
            expected: vec![12],
            found: vec![3, 4]
        })
    );
    // Statistics of a layer over the last axis only, for the same input.
    let x = values::<f64>(&[2, 3, 4], 71);
    let last = LayerNorm::<f64>::new(4);
    let (_, stats) = last.forward_train(&x).unwrap();
    assert_eq!(
        norm.backward(&x, &x, &stats),
        Err(NormError::TrailingShapeMismatch {
            operand: Operand::Stats,
            expected: vec![3, 4],
            found: vec![4]
        })
    );
    let (_, stats) = norm.forward_train(&x).unwrap();
    assert!(matches!(
        last.backward(&x, &x, &stats),
        Err(NormError::TrailingShapeMismatch {
            operand: Operand::Stats,
            ..
        })
    ));
}

/// One thread and two give the same bits, in standard layout and in Fortran
/// order (gathered), for the forward, statistics and backward forms.
#[cfg(feature = "rayon")]
#[test]
fn thread_count_does_not_change_the_bits() {
    let shape = [64, 8, 16, 32];
    let x = values::<f64>(&shape, 81);
    let dy = values::<f64>(&shape, 82);
    let mut f = ArrayD::zeros(IxDyn(&shape).f());
    f.assign(&x);
    let gamma = values::<f64>(&shape[1..], 83);
    let beta = values::<f64>(&shape[1..], 84);
    let run = |threads: usize, x: &ArrayD<f64>| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let y = x.layer_norm_over(Axis(1), &gamma, &beta, 1e-5).unwrap();
            let (mean, rms) = x.stats_over(Axis(1)).unwrap();
            let grads = x
                .layer_norm_backward_over(Axis(1), &dy, &gamma, 1e-5)
                .unwrap();
            let (trained, stats) = x
                .layer_norm_train_over(Axis(1), &gamma, &beta, 1e-5)
                .unwrap();
            let mut dx = ArrayD::zeros(IxDyn(&shape).f());
            let dgamma = x
                .rms_norm_backward_into_over(Axis(1), &mut dx, &dy, &gamma, 1e-6)
                .unwrap();
            let rstd: Vec<u64> = stats.rstd().iter().map(|v| v.to_bits()).collect();
            let saved = x
                .layer_norm_backward_with_stats_over(Axis(1), &dy, &gamma, &stats)
                .unwrap();
            assert_eq!(bits(saved.dx), bits(grads.dx.iter().copied()));
            (
                (bits(y), bits(mean), bits(rms), bits(trained), rstd),
                (bits(grads.dx), bits(grads.dgamma), bits(dx), bits(dgamma)),
            )
        })
    };
    for (name, input) in [("C order", &x), ("Fortran order", &f)] {
        assert_eq!(run(1, input), run(2, input), "{name}");
    }
    assert_eq!(run(1, &x), run(2, &f));
}

/// Statistics of the same input taken over other axes are refused by every
/// form that takes saved statistics, whatever their type lets through.
#[test]
fn statistics_over_other_axes_are_refused() {
    let x = values::<f64>(&[2, 3, 4], 91);
    let g2 = ArrayD::<f64>::ones(IxDyn(&[3, 4]));
    let g1 = Array1::<f64>::ones(4);
    let other = NormError::TrailingShapeMismatch {
        operand: Operand::Stats,
        expected: vec![4],
        found: vec![3, 4],
    };
    // `_over` statistics from Axis(1) with the last-axis form (IxDyn: the
    // types agree).
    let (_, stats) = x.layer_norm_train_over(Axis(1), &g2, &g2, 1e-5).unwrap();
    assert_eq!(
        x.layer_norm_backward_with_stats(&x, &g1, &stats),
        Err(other.clone())
    );
    let mut dx = ArrayD::zeros(IxDyn(&[2, 3, 4]));
    assert_eq!(
        x.layer_norm_backward_with_stats_into(&mut dx, &x, &g1, &stats),
        Err(other)
    );
    let (_, rms_stats) = x.rms_norm_train_over(Axis(1), &g2, 1e-6).unwrap();
    assert!(x.rms_norm_backward_with_stats(&x, &g1, &rms_stats).is_err());
    assert!(x
        .rms_norm_backward_with_stats_into(&mut dx, &x, &g1, &rms_stats)
        .is_err());
    assert!(dx.iter().all(|&v| v == 0.0), "dx untouched");
    // A layer's statistics over (3, 4), shape (2, 1), with a form from Axis(2).
    let layer = LayerNorm::<f64>::new(12)
        .with_normalized_shape(&[3, 4])
        .unwrap();
    let (_, layer_stats) = layer.forward_train(&x).unwrap();
    assert_eq!(
        x.layer_norm_backward_with_stats_over(Axis(2), &x, &g1.clone().into_dyn(), &layer_stats),
        Err(NormError::TrailingShapeMismatch {
            operand: Operand::Stats,
            expected: vec![4],
            found: vec![3, 4],
        })
    );
    // And the last-axis statistics with the form from Axis(1).
    let (_, last) = x.layer_norm_train(&g1, &g1, 1e-5).unwrap();
    assert!(matches!(
        x.layer_norm_backward_with_stats_over(Axis(1), &x, &g2, &last),
        Err(NormError::TrailingShapeMismatch {
            operand: Operand::Stats,
            ..
        })
    ));
}
