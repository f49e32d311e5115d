//! Half precision inputs (`f16`, `bf16`), with `gamma` and `beta` of the
//! input's type or of `f32` (mixed precision).
//!
//! Outputs are checked against the exact big-integer reference of
//! `tests/accuracy.rs` on rows from every corner of both formats: each is
//! within one ulp of the correctly rounded true value (a half row is widened
//! exactly to `f32`, normalised by the `f32` path and rounded again: two
//! roundings). By that design a half result also has the bits of the `f32`
//! result on the widened row, rounded. `cargo test --features half --test
//! half -- --nocapture` prints the worst distances in ulps.

#![cfg(feature = "half")]

#[path = "common/exact.rs"]
mod exact;
#[path = "common/half.rs"]
mod helpers;

use exact::{exact_rstd, exact_stats};
use half::{bf16, f16};
use ndarray::{s, Array, Array1, Array2, ArrayRef, ArrayRef2, Axis, Dimension, ShapeBuilder};
use ndarray_layernorm::prelude::*;
use proptest::prelude::*;

use helpers::*;
#[test]
fn round_nearest_rounds_hand_checked_cases_to_nearest_even() {
    let p = |e: i32| 2f64.powi(e);
    for (t, bits) in [
        (1.0, 0x3c00),
        (1.0 + p(-11), 0x3c00),             // a tie: to the even 1
        (1.0 + 3.0 * p(-11), 0x3c02),       // a tie: to the even 1 + 2⁻⁹
        (1.0 + p(-11) + p(-40), 0x3c01),    // just past the tie
        (-(1.0 + p(-11) - p(-40)), 0xbc00), // just short of it
        (65519.99, 0x7bff),                 // MAX + 15.99
        (65520.0, 0x7c00),                  // MAX + 16, a tie: to the even ∞
        (-1e9, 0xfc00),
        (p(-25), 0x0000), // half the least subnormal: to the even 0
        (3.0 * p(-25), 0x0002),
        (-p(-26), 0x8000),
    ] {
        assert_eq!(round_nearest::<f16>(t).to_bits(), bits, "f16 {t:e}");
    }
    for (t, bits) in [
        (1.0 + p(-8), 0x3f80),
        (1.0 + 3.0 * p(-8), 0x3f82),
        (p(128) - p(119), 0x7f80), // MAX + half its spacing: to ∞
        (p(-134), 0x0000),
        (-p(-133), 0x8001),
    ] {
        assert_eq!(round_nearest::<bf16>(t).to_bits(), bits, "bf16 {t:e}");
    }
}

#[test]
fn within_one_ulp_accepts_the_rounded_value_and_its_neighbours_only() {
    let h = f16::from_bits;
    for (bits, truth, accepted) in [
        (0x3c00, 1.0, true),
        (0x3c01, 1.0, true),
        (0x3bff, 1.0, true), // next down, in the binade below
        (0x3c02, 1.0, false),
        (0x3bfe, 1.0, false),
        (0x8001, 0.0, true), // ±0 are one value, between ±least subnormal
        (0x0001, -1e-12, true),
        (0x8000, 1e-12, true),
        (0x0002, 0.0, false),
        (0x8001, 2f64.powi(-24), false),
        (0x7c00, 65504.0, true), // ∞ next to MAX, both ways
        (0x7bff, 1e6, true),
        (0x7c00, 65000.0, false),
        (0xfc00, 65504.0, false),
        (0x7e00, 1.0, false), // NaN
    ] {
        assert_eq!(within_one_ulp(h(bits), truth), accepted, "{bits:#x}");
    }
    assert!(within_one_ulp(bf16::from_bits(0x3f81), 1.0));
    assert!(!within_one_ulp(bf16::from_bits(0x3f82), 1.0));
    assert!(within_one_ulp(bf16::INFINITY, bf16::MAX.to_f64()));
    assert_eq!(ulps_from(h(0x3c01), 1.0), 1.0);
    assert_eq!(ulps_from(h(0x3c00), 1.0 + 2f64.powi(-12)), 0.25);
    assert_eq!(ulps_from(h(0x3bff), 1.0), 0.5);
    assert_eq!(ulps_from(h(0x0001), 0.0), 1.0);
    assert_eq!(ulps_from(f16::INFINITY, 65504.0), 1.0);
}

// ---------------------------------------------------------------------------

/// A float literal is an `f64` and means that value: `1e-6` is not rounded
/// to `f16` (to `17 · 2⁻²⁴ ≈ 1.0133e-6`) first. On this row, of variance
/// about 1.25e-6, the two give outputs several ulps apart.
#[test]
fn f16_eps_literal_means_the_f64_value() {
    let row = [-1.5e-3, -5e-4, 5e-4, 1.5e-3].map(round_nearest::<f16>);
    let x = Array2::from_shape_vec((1, 4), row.to_vec()).unwrap();
    let eps16 = round_nearest::<f16>(1e-6);
    assert_eq!(eps16.to_f64(), 17.0 * 2f64.powi(-24));
    // The keys of the exactly rounded outputs for `eps`.
    let keys = |eps: f64, rms: bool| -> Vec<i32> {
        let truth = exact_rows(&x, eps, rms).concat();
        truth
            .into_iter()
            .map(|t| key(round_nearest::<f16>(t)))
            .collect()
    };
    // Every output within one ulp of the exact reference for `eps`.
    let fits = |y: &Array2<f16>, eps: f64, rms: bool| {
        let truth = exact_rows(&x, eps, rms).concat();
        y.iter().zip(truth).all(|(&g, t)| within_one_ulp(g, t))
    };
    let layer_norm = [x.layer_norm_plain(1e-6), x.layer_norm_plain(eps16)];
    let rms_norm = [x.rms_norm_plain(1e-6), x.rms_norm_plain(eps16)];
    for (rms, [literal, typed]) in [(false, layer_norm), (true, rms_norm)] {
        let (literal, typed) = (literal.unwrap(), typed.unwrap());
        let (meant, rounded) = (keys(1e-6, rms), keys(eps16.to_f64(), rms));
        let gap = meant.iter().zip(rounded).map(|(a, b)| (a - b).abs()).max();
        assert!(gap >= Some(3), "rms {rms}: references {gap:?} ulps apart");
        assert!(fits(&literal, 1e-6, rms), "rms {rms}: 1e-6 gave {literal}");
        assert!(
            !fits(&literal, eps16.to_f64(), rms),
            "rms {rms}: 1e-6 acted as {eps16}"
        );
        assert!(
            fits(&typed, eps16.to_f64(), rms),
            "rms {rms}: {eps16} gave {typed}"
        );
    }
    let single = x.layer_norm_plain(1e-6_f32).unwrap();
    assert!(
        fits(&single, f64::from(1e-6_f32), false),
        "1e-6_f32 gave {single}"
    );
}

// ---------------------------------------------------------------------------
// The same tests for both types (rustfmt leaves the body of this macro call
// alone; it is kept in its style by hand).

/// Instantiates the items it is given once per half type, as `H`.
macro_rules! for_both_types {
    ($($items:tt)*) => {
        mod f16_suite { use super::*; type H = f16; $($items)* }
        mod bf16_suite { use super::*; type H = bf16; $($items)* }
    };
}

for_both_types! {
    fn forward(form: usize, x: &ArrayRef2<H>, p: &Params<H>, eps: f64) -> Array2<H> {
        match form {
            0 => x.layer_norm(&p.gh, &p.bh, eps),
            1 => x.layer_norm(&p.g32, &p.b32, eps),
            2 => x.layer_norm_plain(eps),
            3 => x.rms_norm(&p.gh, eps),
            4 => x.rms_norm(&p.g32, eps),
            _ => x.rms_norm_plain(eps),
        }
        .unwrap()
    }

    fn forward_into(form: usize, x: &ArrayRef2<H>, out: &mut ArrayRef2<H>, p: &Params<H>) {
        let eps = 1e-5_f64;
        match form {
            0 => x.layer_norm_into(out, &p.gh, &p.bh, eps),
            1 => x.layer_norm_into(out, &p.g32, &p.b32, eps),
            2 => x.layer_norm_plain_into(out, eps),
            3 => x.rms_norm_into(out, &p.gh, eps),
            4 => x.rms_norm_into(out, &p.g32, eps),
            _ => x.rms_norm_plain_into(out, eps),
        }
        .unwrap()
    }

    fn forward_inplace(form: usize, x: &mut ArrayRef2<H>, p: &Params<H>) {
        let eps = 1e-5_f64;
        match form {
            0 => x.layer_norm_inplace(&p.gh, &p.bh, eps),
            1 => x.layer_norm_inplace(&p.g32, &p.b32, eps),
            2 => x.layer_norm_plain_inplace(eps),
            3 => x.rms_norm_inplace(&p.gh, eps),
            4 => x.rms_norm_inplace(&p.g32, eps),
            _ => x.rms_norm_plain_inplace(eps),
        }
        .unwrap()
    }

    fn narrow<D: Dimension>(a: &ArrayRef<f32, D>) -> Array<H, D> {
        a.mapv(H::round32)
    }

    /// Every eps for short rows, fewer for long ones (the reference is slow).
    #[test]
    fn forward_outputs_are_within_one_ulp_of_the_exact_reference() {
        let mut rng = Rng(H::SEED);
        let mut worst = [0.0f64; 6];
        for (c, class) in CLASSES.into_iter().enumerate() {
            for d in DIMS {
                let x = rows::<H>(&mut rng, class, row_count(d), d);
                let p = class.params::<H>(&mut rng, d);
                let count = if d <= 64 { 4 } else if d <= 1000 { 2 } else { 1 };
                for eps in (c..c + count).map(|i| EPS[i % 4]) {
                    let n = [exact_rows(&x, eps, false), exact_rows(&x, eps, true)];
                    for (form, worst) in worst.iter_mut().enumerate() {
                        let truth = p.truths(form, &n[form / 3]);
                        let what = format!("{class:?} d {d} eps {eps:e} {}", FORMS[form]);
                        let got = forward(form, &x, &p, eps);
                        *worst = worst.max(assert_within_one_ulp(&got, &truth, &what));
                    }
                }
            }
        }
        for (form, worst) in FORMS.into_iter().zip(worst) {
            println!("{}: worst {form}: {worst:.3} ulp", H::NAME);
        }
    }

    #[test]
    fn stats_are_within_one_ulp_of_the_exactly_rounded_mean_and_rms() {
        let mut rng = Rng(H::SEED ^ 1);
        for class in CLASSES {
            for d in DIMS {
                let x = rows::<H>(&mut rng, class, row_count(d), d);
                let (mean, rms) = x.stats().unwrap();
                for ((row, m), r) in x.rows().into_iter().zip(mean).zip(rms) {
                    let (tm, tr) = exact_stats(&wide_of(row.iter()));
                    let what = format!("{class:?} d {d}: mean {m:?}, rms {r:?}");
                    assert!(within_one_ulp(m, tm), "{what}, truth {tm:e}");
                    assert!(within_one_ulp(r, tr), "{what}, truth {tr:e}");
                }
            }
        }
    }

    #[test]
    fn into_inplace_and_other_layouts_give_the_bits_of_the_allocating_form() {
        let mut rng = Rng(H::SEED ^ 2);
        let (r, d) = (5, 40);
        let x = rows::<H>(&mut rng, Class::Offset, r, d);
        let p = Class::Normal.params::<H>(&mut rng, d);
        let junk = round_nearest::<H>(-999.0);
        let mut fortran = Array2::from_elem(x.raw_dim().f(), junk);
        fortran.assign(&x);
        let mut spread = Array2::from_elem((r, 2 * d), junk);
        spread.slice_mut(s![.., ..;2]).assign(&x);
        let stepped = spread.slice(s![.., ..;2]);
        for (form, name) in FORMS.into_iter().enumerate() {
            let what = |how: &str| format!("{name}, {how}");
            let want = forward(form, &x, &p, 1e-5);
            same(&forward(form, &fortran, &p, 1e-5), &want, &what("Fortran order"));
            same(&forward(form, &stepped, &p, 1e-5), &want, &what("stepped"));
            let mut out = Array2::from_elem(x.raw_dim(), junk);
            forward_into(form, &x, &mut out, &p);
            same(&out, &want, &what("_into"));
            let mut out = Array2::from_elem(x.raw_dim().f(), junk);
            forward_into(form, &stepped, &mut out, &p);
            same(&out, &want, &what("_into, from stepped to Fortran order"));
            let mut inplace = x.clone();
            forward_inplace(form, &mut inplace, &p);
            same(&inplace, &want, &what("_inplace"));
            let mut inplace = spread.clone();
            forward_inplace(form, &mut inplace.slice_mut(s![.., ..;2]), &p);
            same(&inplace.slice(s![.., ..;2]), &want, &what("_inplace, stepped"));
            same(&inplace.slice(s![.., 1..;2]), &stepped.mapv(|_| junk), &what("between steps"));
        }
        let (mean, rms) = x.stats().unwrap();
        for (how, v) in [("Fortran order", fortran.view()), ("stepped", stepped)] {
            let (m, r) = v.stats().unwrap();
            same(&m, &mean, &format!("stats mean, {how}"));
            same(&r, &rms, &format!("stats rms, {how}"));
        }
    }

    #[test]
    fn over_forms_give_the_bits_of_the_reshaped_last_axis_form() {
        let mut rng = Rng(H::SEED ^ 3);
        let eps = 1e-5_f64;
        let x = rows::<H>(&mut rng, Class::Normal, 4, 30).into_shape_with_order((4, 3, 10));
        let x = x.unwrap();
        let p = Class::Normal.params::<H>(&mut rng, 30);
        let (gh, bh) = (p.gh.to_shape((3, 10)).unwrap(), p.bh.to_shape((3, 10)).unwrap());
        let (g32, b32) = (p.g32.to_shape((3, 10)).unwrap(), p.b32.to_shape((3, 10)).unwrap());
        let mut fortran = Array::from_elem(x.raw_dim().f(), round_nearest::<H>(0.0));
        fortran.assign(&x);
        let flat = x.to_shape((4, 30)).unwrap();
        for (layout, v) in [("C order", x.view()), ("Fortran order", fortran.view())] {
            let over = [
                v.layer_norm_over(Axis(1), &gh, &bh, eps),
                v.layer_norm_over(Axis(1), &g32, &b32, eps),
                v.layer_norm_plain_over(Axis(1), eps),
                v.rms_norm_over(Axis(1), &gh, eps),
                v.rms_norm_over(Axis(1), &g32, eps),
                v.rms_norm_plain_over(Axis(1), eps),
            ];
            for ((form, name), y) in FORMS.into_iter().enumerate().zip(over) {
                let want = forward(form, &flat, &p, eps);
                same(&y.unwrap(), &want, &format!("{layout}: {name}_over"));
            }
            let ((m, r), (fm, fr)) = (v.stats_over(Axis(1)).unwrap(), flat.stats().unwrap());
            same(&m, &fm, &format!("{layout}: stats_over mean"));
            same(&r, &fr, &format!("{layout}: stats_over rms"));
        }
    }

    #[test]
    fn constant_rows_give_beta_and_zero_rows_zeros_exactly() {
        let mut rng = Rng(H::SEED ^ 4);
        let d = 19;
        let p = Class::Normal.params::<H>(&mut rng, d);
        let b32 = p.b32.mapv(|b| round_nearest::<H>(f64::from(b)));
        // The last two rows are zeros, where RMSNorm gives zeros.
        let constants = [H::BIG.wide(), -1.5, 3.0 * H::SUB_MIN.wide(), 0.0, -0.0];
        let x = Array2::from_shape_fn((5, d), |(i, _)| round_nearest::<H>(constants[i]));
        for eps in EPS {
            let what = |s: String| format!("eps {eps:e}: {s}");
            let (y, y32) = (forward(0, &x, &p, eps), forward(1, &x, &p, eps));
            let plain = forward(2, &x, &p, eps);
            for (i, c) in constants.into_iter().enumerate() {
                same(&y.row(i), &p.bh, &what(format!("row of {c:e}")));
                same(&y32.row(i), &b32, &what(format!("row of {c:e}, f32 beta rounded")));
                assert!(plain.row(i).iter().all(|v| v.raw() == 0), "{}", what(format!("{c:e}")));
            }
            for (form, name) in FORMS.into_iter().enumerate().skip(3) {
                let zeros = forward(form, &x, &p, eps).slice(s![3.., ..]).mapv(key);
                assert!(zeros.iter().all(|&k| k == 0), "{}", what(format!("{name}: {zeros}")));
            }
        }
    }

    #[test]
    fn a_nan_or_an_infinity_poisons_only_its_own_row() {
        let mut rng = Rng(H::SEED ^ 5);
        let d = 33;
        let clean = rows::<H>(&mut rng, Class::Normal, 3, d);
        let p = Class::Normal.params::<H>(&mut rng, d);
        let bad = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY].map(H::round32);
        for (form, name) in FORMS.into_iter().enumerate() {
            let want = forward(form, &clean, &p, 1e-5);
            for (b, col) in bad.into_iter().flat_map(|b| [(b, 0), (b, 16), (b, d - 1)]) {
                let mut x = clean.clone();
                x[[1, col]] = b;
                let y = forward(form, &x, &p, 1e-5);
                let what = format!("{name} with {b:?} at {col}");
                assert!(y.row(1).iter().all(|&v| is_nan(v)), "{what}: {}", y.row(1));
                same(&y.select(Axis(0), &[0, 2]), &want.select(Axis(0), &[0, 2]), &what);
            }
        }
    }

    /// The design identity: a half row is widened exactly to `f32`, normalised
    /// by the `f32` path (with the `f32` parameters, or the half ones widened)
    /// and the `f32` results rounded to the half type: the half results are
    /// the `f32` path's bits, rounded. The saved statistics are the `f32`
    /// path's, and `dgamma`, `dbeta` in `f32` have its bits. Reductions to
    /// the half type (`stats`; `dgamma`, `dbeta` for half parameters) are
    /// rounded once from the same `f64` sums: within one ulp of the `f32`
    /// path's results rounded again.
    fn agrees_with_f32(x: &Array2<H>, dy: &Array2<H>, p: &Params<H>, eps: f32, what: &str) {
        let (x32, dy32, (gh32, _)) = (widen32(x), widen32(dy), p.single(0));
        let e = f64::from(eps);
        let w = |s: &str| format!("{what}: {s}");
        for (form, name) in FORMS.into_iter().enumerate() {
            same(&forward(form, x, p, e), &narrow(&forward32(form, &x32, p, eps)), &w(name));
        }
        let ((mean, rms), (mean32, rms32)) = (x.stats().unwrap(), x32.stats().unwrap());
        near(&mean, &narrow(&mean32), &w("stats mean"));
        near(&rms, &narrow(&rms32), &w("stats rms"));

        let (y, st) = x.layer_norm_train(&p.g32, &p.b32, eps).unwrap();
        let (y32, st32) = x32.layer_norm_train(&p.g32, &p.b32, eps).unwrap();
        same(&y, &forward(1, x, p, e), &w("layer_norm_train y"));
        same(&y, &narrow(&y32), &w("layer_norm_train y, f32 path"));
        same(&st.mean(), &st32.mean(), &w("mean()"));
        same(&st.rstd(), &st32.rstd(), &w("rstd()"));
        for ((row, m), r) in x.rows().into_iter().zip(st.mean()).zip(st.rstd()) {
            let xs = wide_of(row.iter());
            let (tm, tr) = (exact_stats(&xs).0, exact_rstd(&xs, e));
            let msg = w(&format!("mean() {m:e}, rstd() {r:e}; exact {tm:e}, {tr:e}"));
            assert!(close(m, tm) && close(r, tr), "{msg}");
        }
        let (yr, sr) = x.rms_norm_train(&p.gh, eps).unwrap();
        let (yr32, sr32) = x32.rms_norm_train(&gh32, eps).unwrap();
        same(&yr, &forward(3, x, p, e), &w("rms_norm_train y"));
        same(&yr, &narrow(&yr32), &w("rms_norm_train y, f32 path"));
        same(&sr.rrms(), &sr32.rrms(), &w("rrms()"));

        let g = x.layer_norm_backward(dy, &p.g32, eps).unwrap();
        let g32 = x32.layer_norm_backward(&dy32, &p.g32, eps).unwrap();
        same(&g.dx, &narrow(&g32.dx), &w("dx, f32 params"));
        same(&g.dgamma, &g32.dgamma, &w("dgamma, f32"));
        same(&g.dbeta, &g32.dbeta, &w("dbeta, f32"));
        let saved = x.layer_norm_backward_with_stats(dy, &p.g32, &st).unwrap();
        same(&saved.dx, &g.dx, &w("dx from saved stats"));
        same(&saved.dgamma, &g.dgamma, &w("dgamma from saved stats"));
        let g = x.layer_norm_backward(dy, &p.gh, eps).unwrap();
        let g32 = x32.layer_norm_backward(&dy32, &gh32, eps).unwrap();
        same(&g.dx, &narrow(&g32.dx), &w("dx"));
        near(&g.dgamma, &narrow(&g32.dgamma), &w("dgamma"));
        near(&g.dbeta, &narrow(&g32.dbeta), &w("dbeta"));

        let g = x.rms_norm_backward(dy, &p.g32, eps).unwrap();
        let g32 = x32.rms_norm_backward(&dy32, &p.g32, eps).unwrap();
        same(&g.dx, &narrow(&g32.dx), &w("rms dx, f32 params"));
        same(&g.dgamma, &g32.dgamma, &w("rms dgamma, f32"));
        let g = x.rms_norm_backward(dy, &p.gh, eps).unwrap();
        let g32 = x32.rms_norm_backward(&dy32, &gh32, eps).unwrap();
        same(&g.dx, &narrow(&g32.dx), &w("rms dx"));
        near(&g.dgamma, &narrow(&g32.dgamma), &w("rms dgamma"));
        let saved = x.rms_norm_backward_with_stats(dy, &p.gh, &sr).unwrap();
        same(&saved.dx, &g.dx, &w("rms dx from saved stats"));
    }

    #[test]
    fn results_are_the_f32_path_results_on_the_widened_input_rounded() {
        let mut rng = Rng(H::SEED ^ 6);
        for class in CLASSES {
            for d in [1, 3, 16, 17, 100, 768] {
                let x = rows::<H>(&mut rng, class, row_count(d), d);
                let dy = rows::<H>(&mut rng, Class::Normal, row_count(d), d);
                let p = class.params::<H>(&mut rng, d);
                for eps in [0.0, 1e-5, 0.25] {
                    agrees_with_f32(&x, &dy, &p, eps, &format!("{class:?} d {d} eps {eps}"));
                }
            }
        }
    }

    #[test]
    fn fused_add_norm_is_the_rounded_add_then_the_norm() {
        let mut rng = Rng(H::SEED ^ 7);
        // Multiples of 1/64 below 4 in magnitude: exact in H, and so is their
        // sum in f32, so every way of adding rounds alike.
        let mut grid = || {
            let v = Array2::from_shape_fn((6, 24), |_| (256.0 * rng.signed()).round() / 64.0);
            v.mapv(round_nearest::<H>)
        };
        let (x, residual) = (grid(), grid());
        let p = Class::Normal.params::<H>(&mut rng, 24);
        let h = &x + &residual;
        let (y, sum) = x.add_layer_norm(&residual, &p.g32, &p.b32, 1e-5_f64).unwrap();
        same(&sum, &h, "add_layer_norm h");
        same(&y, &h.layer_norm(&p.g32, &p.b32, 1e-5_f64).unwrap(), "add_layer_norm y");
        let (y, sum) = x.add_rms_norm(&residual, &p.gh, 1e-5_f64).unwrap();
        same(&sum, &h, "add_rms_norm h");
        same(&y, &h.rms_norm(&p.gh, 1e-5_f64).unwrap(), "add_rms_norm y");
    }

    /// `gamma = 1 + u/2`, `beta = u/4` in `f32`, with `u` the half type's ulp
    /// at 1: on the row [-1, 1] (n = ±1 exactly) the true outputs -1 - u/4 and
    /// 1 + 3u/4 round to -1 and 1 + u; gamma rounded to the half type first
    /// (to 1, a tie) would give 1 instead.
    #[test]
    fn f32_parameters_are_used_at_full_precision() {
        let u = 2f32.powi(-H::MANT);
        let x = Array2::from_shape_fn((1, 2), |(_, j)| round_nearest::<H>(2.0 * j as f64 - 1.0));
        let (gamma, beta) = (Array1::from_elem(2, 1.0 + u / 2.0), Array1::from_elem(2, u / 4.0));
        let want = Array1::from_vec(vec![-1.0, 1.0 + f64::from(u)]).mapv(round_nearest::<H>);
        same(&x.layer_norm(&gamma, &beta, 0.0_f64).unwrap(), &want, "1 + u/2, u/4");
    }

    #[cfg(feature = "rayon")]
    #[test]
    fn one_and_two_threads_give_the_same_bits() {
        let mut rng = Rng(H::SEED ^ 8);
        let (r, d) = (300, 1024);
        let x = Array2::from_shape_fn((r, d), |(i, _)| CLASSES[i % 7].value::<H>(&mut rng));
        let x = x.mapv(round_nearest::<H>);
        let dy = rows::<H>(&mut rng, Class::Normal, r, d);
        let p = Class::Normal.params::<H>(&mut rng, d);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let mut all: Vec<_> = (0..6).map(|f| bits_of(&forward(f, &x, &p, 1e-5))).collect();
                let (mean, rms) = x.stats().unwrap();
                let g = x.layer_norm_backward(&dy, &p.g32, 1e-5_f64).unwrap();
                let gr = x.rms_norm_backward(&dy, &p.gh, 1e-5_f64).unwrap();
                all.extend([bits_of(&mean), bits_of(&rms), bits_of(&g.dx), bits_of(&gr.dx)]);
                all.extend([bits_of(&g.dgamma), bits_of(&g.dbeta), bits_of(&gr.dgamma)]);
                all
            })
        };
        assert!(run(1) == run(2), "{}: one thread and two give other bits", H::NAME);
    }

    #[test]
    fn layers_match_the_trait_forms() {
        let mut rng = Rng(H::SEED ^ 9);
        let d = 48;
        let x = rows::<H>(&mut rng, Class::Offset, 5, d);
        let dy = rows::<H>(&mut rng, Class::Normal, 5, d);
        let p = Class::Normal.params::<H>(&mut rng, d);

        // Half parameters; eps kept as the f64 1e-5, not rounded to H.
        let mut ln = LayerNorm::<H>::new(d);
        assert_eq!(ln.eps(), 1e-5);
        ln.gamma_mut().assign(&p.gh);
        ln.beta_mut().unwrap().assign(&p.bh);
        let y = x.layer_norm(&p.gh, &p.bh, 1e-5_f64).unwrap();
        same(&ln.forward(&x).unwrap(), &y, "LayerNorm forward");
        let (yt, st) = ln.forward_train(&x).unwrap();
        same(&yt, &y, "LayerNorm forward_train");
        let g = ln.backward(&x, &dy, &st).unwrap();
        let t = x.layer_norm_backward(&dy, &p.gh, 1e-5_f64).unwrap();
        same(&g.dx, &t.dx, "LayerNorm dx");
        same(&g.dgamma, &t.dgamma, "LayerNorm dgamma");
        same(&g.dbeta, &t.dbeta, "LayerNorm dbeta");

        // f32 parameters for H activations, and f32 gradients.
        let mut ln32 = LayerNorm::<f32>::new(d);
        ln32.gamma_mut().assign(&p.g32);
        ln32.beta_mut().unwrap().assign(&p.b32);
        let ln = ln32.for_input::<H>();
        let y = x.layer_norm(&p.g32, &p.b32, ln.eps()).unwrap();
        same(&ln.forward(&x).unwrap(), &y, "LayerNorm<_, f32> forward");
        let (yt, st) = ln.forward_train(&x).unwrap();
        same(&yt, &y, "LayerNorm<_, f32> forward_train");
        let g = ln.backward(&x, &dy, &st).unwrap();
        let t = x.layer_norm_backward(&dy, &p.g32, ln.eps()).unwrap();
        let (dgamma, dbeta): (&Array1<f32>, &Array1<f32>) = (&g.dgamma, &g.dbeta);
        same(&g.dx, &t.dx, "LayerNorm<_, f32> dx");
        same(dgamma, &t.dgamma, "LayerNorm<_, f32> dgamma");
        same(dbeta, &t.dbeta, "LayerNorm<_, f32> dbeta");

        let mut rms = RmsNorm::<H>::new(d);
        assert_eq!(rms.eps(), 1e-6);
        rms.gamma_mut().assign(&p.gh);
        let y = x.rms_norm(&p.gh, 1e-6_f64).unwrap();
        same(&rms.forward(&x).unwrap(), &y, "RmsNorm forward");
        let (yt, st) = rms.forward_train(&x).unwrap();
        same(&yt, &y, "RmsNorm forward_train");
        let g = rms.backward(&x, &dy, &st).unwrap();
        let t = x.rms_norm_backward(&dy, &p.gh, 1e-6_f64).unwrap();
        same(&g.dx, &t.dx, "RmsNorm dx");
        same(&g.dgamma, &t.dgamma, "RmsNorm dgamma");

        let mut rms32 = RmsNorm::<f32>::new(d);
        rms32.gamma_mut().assign(&p.g32);
        let rms = rms32.for_input::<H>();
        let y = x.rms_norm(&p.g32, rms.eps()).unwrap();
        same(&rms.forward(&x).unwrap(), &y, "RmsNorm<_, f32> forward");
        let (yt, st) = rms.forward_train(&x).unwrap();
        same(&yt, &y, "RmsNorm<_, f32> forward_train");
        let g = rms.backward(&x, &dy, &st).unwrap();
        let t = x.rms_norm_backward(&dy, &p.g32, rms.eps()).unwrap();
        let dgamma: &Array1<f32> = &g.dgamma;
        same(&g.dx, &t.dx, "RmsNorm<_, f32> dx");
        same(dgamma, &t.dgamma, "RmsNorm<_, f32> dgamma");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn layer_norm_plain_has_mean_0_and_variance_1(x in half_rows::<H>()) {
            let y = x.layer_norm_plain(0.0_f64).unwrap();
            let slack = moment_slack::<H>();
            for (row_x, row_y) in x.rows().into_iter().zip(y.rows()) {
                let xs = wide_of(row_x.iter());
                if xs.iter().all(|&v| v == xs[0]) {
                    continue; // a constant row: the next test
                }
                let n = wide_of(row_y.iter());
                let d = n.len() as f64;
                let mean = n.iter().sum::<f64>() / d;
                let var = n.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d;
                prop_assert!(mean.abs() <= slack, "mean {mean:e} of {n:?}");
                prop_assert!((var - 1.0).abs() <= slack * (2.0 + slack), "var {var} of {n:?}");
            }
        }

        #[test]
        fn a_constant_row_gives_exactly_beta((c, gamma, beta, eps) in constant_case::<H>()) {
            let x = Array2::from_elem((2, gamma.len()), round_nearest::<H>(c));
            let p = Params::<H>::new(&gamma, &beta);
            let b32 = p.b32.mapv(|b| round_nearest::<H>(f64::from(b)));
            let (y, y32) = (forward(0, &x, &p, eps), forward(1, &x, &p, eps));
            let plain = forward(2, &x, &p, eps);
            for i in 0..2 {
                prop_assert_eq!(bits_of(&y.row(i)), bits_of(&p.bh));
                prop_assert_eq!(bits_of(&y32.row(i)), bits_of(&b32));
                prop_assert!(plain.row(i).iter().all(|v| v.raw() == 0));
            }
        }
    }
}

/// The `_into` backward forms return `dgamma` and `dbeta` in the
/// parameters' type too, with the bits of the allocating forms.
#[test]
fn backward_into_returns_gradients_in_the_parameters_type() {
    let x = Array2::from_shape_fn((5, 7), |(i, j)| {
        bf16::from_f32((i * 7 + j) as f32 * 0.37 - 3.0)
    });
    let dy = x.mapv(|v| bf16::from_f32(v.to_f32() * 0.5 + 0.25));
    let gamma = Array1::from_shape_fn(7, |j| 1.0f32 + j as f32 / 3.0);
    let mut dx = Array2::from_elem((5, 7), bf16::ZERO);
    let grads = x.layer_norm_backward(&dy, &gamma, 1e-5).unwrap();
    let (dgamma, dbeta): (Array1<f32>, Array1<f32>) = x
        .layer_norm_backward_into(&mut dx, &dy, &gamma, 1e-5)
        .unwrap();
    assert_eq!(dx, grads.dx);
    assert_eq!((dgamma, dbeta), (grads.dgamma, grads.dbeta));
    let rms = x.rms_norm_backward(&dy, &gamma, 1e-5).unwrap();
    let dgamma: Array1<f32> = x
        .rms_norm_backward_into(&mut dx, &dy, &gamma, 1e-5)
        .unwrap();
    assert_eq!(dx, rms.dx);
    assert_eq!(dgamma, rms.dgamma);
}
