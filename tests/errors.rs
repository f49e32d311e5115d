//! Every `NormError` variant from every public method that can return it,
//! the error texts, untouched outputs after an error, empty leading axes,
//! and a property test that no public method panics, whatever its input.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use common::{bits, TestFloat, JUNK};
use ndarray::{
    array, Array, Array0, Array1, Array2, Array3, ArrayD, Dimension, IxDyn, RemoveAxis,
    ShapeBuilder,
};
use ndarray_layernorm::prelude::*;
use ndarray_layernorm::Operand;
use proptest::prelude::*;

/// The public methods, one variant each.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Method {
    LayerNorm,
    LayerNormPlain,
    LayerNormInto,
    LayerNormPlainInto,
    LayerNormInplace,
    LayerNormPlainInplace,
    RmsNorm,
    RmsNormPlain,
    RmsNormInto,
    RmsNormPlainInto,
    RmsNormInplace,
    RmsNormPlainInplace,
    Stats,
}

use Method::*;

const ALL: [Method; 13] = [
    LayerNorm,
    LayerNormPlain,
    LayerNormInto,
    LayerNormPlainInto,
    LayerNormInplace,
    LayerNormPlainInplace,
    RmsNorm,
    RmsNormPlain,
    RmsNormInto,
    RmsNormPlainInto,
    RmsNormInplace,
    RmsNormPlainInplace,
    Stats,
];

impl Method {
    fn takes_gamma(self) -> bool {
        matches!(
            self,
            LayerNorm | LayerNormInto | LayerNormInplace | RmsNorm | RmsNormInto | RmsNormInplace
        )
    }
    fn takes_beta(self) -> bool {
        matches!(self, LayerNorm | LayerNormInto | LayerNormInplace)
    }
    fn takes_eps(self) -> bool {
        self != Stats
    }
    fn takes_output(self) -> bool {
        matches!(
            self,
            LayerNormInto | LayerNormPlainInto | RmsNormInto | RmsNormPlainInto
        )
    }
    fn in_place(self) -> bool {
        matches!(
            self,
            LayerNormInplace | LayerNormPlainInplace | RmsNormInplace | RmsNormPlainInplace
        )
    }
}

/// What a call returned, and the array it may have written (the `_into`
/// output or the `_inplace` array), to compare with its state before.
struct Outcome<A, D> {
    result: Result<(), NormError>,
    written: Option<Array<A, D>>,
    /// Shape of the returned arrays (the result of an allocating form, or
    /// the mean of `stats`), on success.
    shape: Option<Vec<usize>>,
}

/// Calls `method` on `x` with the given operands. `out` is the output of
/// the `_into` forms; the `_inplace` forms work on a copy of `x`.
fn call<A: TestFloat, D: RemoveAxis>(
    method: Method,
    x: &Array<A, D>,
    out: &Array<A, D>,
    gamma: &Array1<A>,
    beta: &Array1<A>,
    eps: A,
) -> Outcome<A, D> {
    let mut written = if method.in_place() {
        Some(x.clone())
    } else if method.takes_output() {
        Some(out.clone())
    } else {
        None
    };
    let shape_of = |r: Result<Array<A, D>, NormError>| match r {
        Ok(y) => (Ok(()), Some(y.shape().to_vec())),
        Err(e) => (Err(e), None),
    };
    let (result, shape) = match (method, written.as_mut()) {
        (LayerNorm, _) => shape_of(x.layer_norm(gamma, beta, eps)),
        (LayerNormPlain, _) => shape_of(x.layer_norm_plain(eps)),
        (RmsNorm, _) => shape_of(x.rms_norm(gamma, eps)),
        (RmsNormPlain, _) => shape_of(x.rms_norm_plain(eps)),
        (Stats, _) => match x.stats() {
            Ok((mean, rms)) => {
                assert_eq!(mean.shape(), rms.shape());
                (Ok(()), Some(mean.shape().to_vec()))
            }
            Err(e) => (Err(e), None),
        },
        (LayerNormInto, Some(o)) => (x.layer_norm_into(o, gamma, beta, eps), None),
        (LayerNormPlainInto, Some(o)) => (x.layer_norm_plain_into(o, eps), None),
        (RmsNormInto, Some(o)) => (x.rms_norm_into(o, gamma, eps), None),
        (RmsNormPlainInto, Some(o)) => (x.rms_norm_plain_into(o, eps), None),
        (LayerNormInplace, Some(y)) => (y.layer_norm_inplace(gamma, beta, eps), None),
        (LayerNormPlainInplace, Some(y)) => (y.layer_norm_plain_inplace(eps), None),
        (RmsNormInplace, Some(y)) => (y.rms_norm_inplace(gamma, eps), None),
        (RmsNormPlainInplace, Some(y)) => (y.rms_norm_plain_inplace(eps), None),
        (_, None) => unreachable!("every writing method has an array to write"),
    };
    Outcome {
        result,
        written,
        shape,
    }
}

/// Calls `method` and checks that it returns exactly `expected` and leaves
/// the array it writes to untouched.
fn expect_error<A: TestFloat, D: RemoveAxis>(
    method: Method,
    x: &Array<A, D>,
    out: &Array<A, D>,
    gamma: &Array1<A>,
    beta: &Array1<A>,
    eps: A,
    expected: &NormError,
) {
    let outcome = call(method, x, out, gamma, beta, eps);
    assert_eq!(
        outcome.result,
        Err(expected.clone()),
        "{method:?} ({})",
        A::NAME
    );
    if let Some(written) = outcome.written {
        let before = if method.in_place() { x } else { out };
        assert_eq!(
            bits(&written),
            bits(before),
            "{method:?} wrote to its array before failing"
        );
        assert_eq!(written.shape(), before.shape());
    }
}

fn filled<A: TestFloat, D: Dimension>(dim: D) -> Array<A, D> {
    Array::from_elem(dim, A::from_wide(JUNK))
}

/// A 2×3 input with distinct values and the matching operands.
fn sample<A: TestFloat>() -> (Array2<A>, Array1<A>, Array1<A>) {
    let x = array![[1.0, 2.0, 4.0], [-3.0, 0.5, 8.0]].mapv(A::from_wide);
    let gamma = array![1.0, 2.0, 0.5].mapv(A::from_wide);
    let beta = array![0.0, -1.0, 1.0].mapv(A::from_wide);
    (x, gamma, beta)
}

// ---------------------------------------------------------------------------
// LengthMismatch

fn length_mismatch<A: TestFloat>() {
    let (x, gamma, beta) = sample::<A>();
    let eps = A::from_wide(1e-5);
    let out = filled(x.raw_dim());
    for found in [0, 2, 4] {
        let short = Array1::from_elem(found, A::from_wide(1.0));
        for method in ALL.into_iter().filter(|m| m.takes_gamma()) {
            let expected = NormError::LengthMismatch {
                operand: Operand::Gamma,
                expected: 3,
                found,
            };
            expect_error(method, &x, &out, &short, &beta, eps, &expected);
        }
        for method in ALL.into_iter().filter(|m| m.takes_beta()) {
            let expected = NormError::LengthMismatch {
                operand: Operand::Beta,
                expected: 3,
                found,
            };
            expect_error(method, &x, &out, &gamma, &short, eps, &expected);
        }
    }
    // The same through a 3-D array and an IxDyn array: d is the last axis.
    let x3 = Array3::from_elem((2, 2, 5), A::from_wide(1.5));
    let out3 = filled(x3.raw_dim());
    let ones = Array1::from_elem(5, A::from_wide(1.0));
    let expected = NormError::LengthMismatch {
        operand: Operand::Gamma,
        expected: 5,
        found: 3,
    };
    for method in ALL.into_iter().filter(|m| m.takes_gamma()) {
        expect_error(method, &x3, &out3, &gamma, &ones, eps, &expected);
        let xd = x3.clone().into_dyn();
        let outd = out3.clone().into_dyn();
        expect_error(method, &xd, &outd, &gamma, &ones, eps, &expected);
    }
}

#[test]
fn length_mismatch_f64() {
    length_mismatch::<f64>();
}

#[test]
fn length_mismatch_f32() {
    length_mismatch::<f32>();
}

#[test]
fn length_mismatch_for_views_of_gamma_and_beta() {
    let x = array![[1.0_f64, 2.0, 3.0]];
    let long = array![1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
    // A view of 3 of the 6 is accepted; the whole is not.
    let stepped = long.slice(ndarray::s![..;2]);
    assert!(x.layer_norm(&stepped, &stepped, 0.0).is_ok());
    assert_eq!(
        x.layer_norm(&long.view(), &stepped, 0.0),
        Err(NormError::LengthMismatch {
            operand: Operand::Gamma,
            expected: 3,
            found: 6
        })
    );
    assert_eq!(
        x.rms_norm(&long.slice(ndarray::s![..;-3]), 0.0),
        Err(NormError::LengthMismatch {
            operand: Operand::Gamma,
            expected: 3,
            found: 2
        })
    );
}

// ---------------------------------------------------------------------------
// ShapeMismatch (the `_into` outputs)

fn shape_mismatch<A: TestFloat>() {
    let (x, gamma, beta) = sample::<A>();
    let eps = A::from_wide(1e-5);
    for wrong in [(3, 2), (2, 4), (1, 3), (0, 3), (2, 0)] {
        let out = filled(ndarray::Ix2(wrong.0, wrong.1));
        let expected = NormError::ShapeMismatch {
            operand: Operand::Output,
            expected: vec![2, 3],
            found: vec![wrong.0, wrong.1],
        };
        for method in ALL.into_iter().filter(|m| m.takes_output()) {
            expect_error(method, &x, &out, &gamma, &beta, eps, &expected);
        }
    }
    // IxDyn: an output of another number of axes, even with as many elements.
    let xd = x.clone().into_dyn();
    for wrong in [vec![2, 3, 1], vec![6], vec![3, 2], vec![]] {
        let out = filled(IxDyn(&wrong));
        let expected = NormError::ShapeMismatch {
            operand: Operand::Output,
            expected: vec![2, 3],
            found: wrong.clone(),
        };
        for method in ALL.into_iter().filter(|m| m.takes_output()) {
            expect_error(method, &xd, &out, &gamma, &beta, eps, &expected);
        }
    }
}

#[test]
fn shape_mismatch_f64() {
    shape_mismatch::<f64>();
}

#[test]
fn shape_mismatch_f32() {
    shape_mismatch::<f32>();
}

/// An output that is a view with the right shape but foreign strides is
/// accepted; a transposed one (wrong shape) is not.
#[test]
fn output_views() {
    let (x, gamma, beta) = sample::<f64>();
    let mut big = Array2::<f64>::from_elem((3, 2), JUNK);
    let mut t = big.view_mut().reversed_axes();
    assert!(x.layer_norm_into(&mut t, &gamma, &beta, 0.0).is_ok());
    let mut wrong = Array2::<f64>::from_elem((2, 3), JUNK);
    let before = bits(&wrong);
    let mut wrong_t = wrong.view_mut().reversed_axes();
    assert_eq!(
        x.rms_norm_plain_into(&mut wrong_t, 0.0),
        Err(NormError::ShapeMismatch {
            operand: Operand::Output,
            expected: vec![2, 3],
            found: vec![3, 2]
        })
    );
    assert_eq!(bits(&wrong), before);
}

// ---------------------------------------------------------------------------
// EmptyAxis and ZeroDimensional

fn empty_axis<A: TestFloat>() {
    let eps = A::from_wide(1e-5);
    let empty = Array1::<A>::zeros(0);
    for method in ALL {
        let x2 = Array2::<A>::zeros((3, 0));
        expect_error(
            method,
            &x2,
            &x2.clone(),
            &empty,
            &empty,
            eps,
            &NormError::EmptyAxis,
        );
        let x1 = Array1::<A>::zeros(0);
        expect_error(
            method,
            &x1,
            &x1.clone(),
            &empty,
            &empty,
            eps,
            &NormError::EmptyAxis,
        );
        let x3 = Array3::<A>::zeros((2, 4, 0));
        expect_error(
            method,
            &x3,
            &x3.clone(),
            &empty,
            &empty,
            eps,
            &NormError::EmptyAxis,
        );
        let xd = ArrayD::<A>::zeros(IxDyn(&[5, 0]));
        expect_error(
            method,
            &xd,
            &xd.clone(),
            &empty,
            &empty,
            eps,
            &NormError::EmptyAxis,
        );
    }
}

#[test]
fn empty_axis_f64() {
    empty_axis::<f64>();
}

#[test]
fn empty_axis_f32() {
    empty_axis::<f32>();
}

fn zero_dimensional<A: TestFloat>() {
    let eps = A::from_wide(1e-5);
    let x = ArrayD::<A>::from_elem(IxDyn(&[]), A::from_wide(3.0));
    assert_eq!(x.ndim(), 0);
    assert_eq!(x.len(), 1);
    // gamma and beta of length 0 and 1: neither is the length of a missing axis.
    for n in [0, 1] {
        let v = Array1::<A>::from_elem(n, A::from_wide(1.0));
        for method in ALL {
            let out = filled(IxDyn(&[]));
            expect_error(method, &x, &out, &v, &v, eps, &NormError::ZeroDimensional);
        }
    }
}

#[test]
fn zero_dimensional_f64() {
    zero_dimensional::<f64>();
}

#[test]
fn zero_dimensional_f32() {
    zero_dimensional::<f32>();
}

/// `Ix0` arrays have no `stats` (it needs an axis to remove), but the
/// normalisations exist for them and refuse them.
#[test]
fn zero_dimensional_ix0() {
    let x = Array0::from_elem((), 2.0_f64);
    let v = array![1.0];
    let zd = Err(NormError::ZeroDimensional);
    assert_eq!(x.layer_norm(&v, &v, 0.0).map(drop), zd);
    assert_eq!(x.layer_norm_plain(0.0).map(drop), zd);
    assert_eq!(x.rms_norm(&v, 0.0).map(drop), zd);
    assert_eq!(x.rms_norm_plain(0.0).map(drop), zd);
    let mut out = Array0::from_elem((), JUNK);
    assert_eq!(x.layer_norm_into(&mut out, &v, &v, 0.0), zd);
    assert_eq!(x.layer_norm_plain_into(&mut out, 0.0), zd);
    assert_eq!(x.rms_norm_into(&mut out, &v, 0.0), zd);
    assert_eq!(x.rms_norm_plain_into(&mut out, 0.0), zd);
    assert_eq!(out[()], JUNK);
    let mut y = x.clone();
    assert_eq!(y.layer_norm_inplace(&v, &v, 0.0), zd);
    assert_eq!(y.layer_norm_plain_inplace(0.0), zd);
    assert_eq!(y.rms_norm_inplace(&v, 0.0), zd);
    assert_eq!(y.rms_norm_plain_inplace(0.0), zd);
    assert_eq!(y[()], 2.0);
}

// ---------------------------------------------------------------------------
// InvalidEps

fn invalid_eps<A: TestFloat>() {
    let (x, gamma, beta) = sample::<A>();
    let out = filled(x.raw_dim());
    let bad = [
        -1e-5,
        -1.0,
        -f64::from(f32::MIN_POSITIVE),
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ];
    for eps in bad.map(A::from_wide) {
        for method in ALL.into_iter().filter(|m| m.takes_eps()) {
            let outcome = call(method, &x, &out, &gamma, &beta, eps);
            match outcome.result {
                Err(NormError::InvalidEps { eps: found }) => {
                    // Stored widened to f64, exactly; NaN is never equal to
                    // itself, so compare bits.
                    assert_eq!(found.to_bits(), eps.wide().to_bits(), "{method:?}");
                }
                other => panic!("{method:?} with eps {eps}: {other:?}"),
            }
            if let Some(w) = outcome.written {
                let before = if method.in_place() { &x } else { &out };
                assert_eq!(bits(&w), bits(before), "{method:?} wrote before failing");
            }
        }
    }
    // A finite negative eps compares equal, so assert_eq! works for it.
    for method in ALL.into_iter().filter(|m| m.takes_eps()) {
        let eps = A::from_wide(-0.5);
        expect_error(
            method,
            &x,
            &out,
            &gamma,
            &beta,
            eps,
            &NormError::InvalidEps { eps: -0.5 },
        );
    }
}

#[test]
fn invalid_eps_f64() {
    invalid_eps::<f64>();
}

#[test]
fn invalid_eps_f32() {
    invalid_eps::<f32>();
}

/// `eps = 0`, `-0.0`, the smallest subnormal and the largest finite value
/// are all accepted; `-0.0` gives the bits of `+0.0`.
fn accepted_eps<A: TestFloat>() {
    let (x, gamma, beta) = sample::<A>();
    let out = filled(x.raw_dim());
    let tiny = A::from_wide(if A::UNIT < 1e-10 {
        f64::from_bits(1)
    } else {
        f64::from(f32::from_bits(1))
    });
    let largest = A::max_value();
    for method in ALL.into_iter().filter(|m| m.takes_eps()) {
        for eps in [A::from_wide(0.0), A::from_wide(-0.0), tiny, largest] {
            let outcome = call(method, &x, &out, &gamma, &beta, eps);
            assert_eq!(outcome.result, Ok(()), "{method:?} eps {eps}");
        }
    }
    let plus = x.layer_norm(&gamma, &beta, A::from_wide(0.0)).unwrap();
    let minus = x.layer_norm(&gamma, &beta, A::from_wide(-0.0)).unwrap();
    assert_eq!(bits(&plus), bits(&minus));
    let plus = x.rms_norm_plain(A::from_wide(0.0)).unwrap();
    let minus = x.rms_norm_plain(A::from_wide(-0.0)).unwrap();
    assert_eq!(bits(&plus), bits(&minus));
    // With the largest eps every output is essentially 0 (|x - mean| <= 8,
    // sqrt(eps) > 1e19); finite in any case.
    let y = x.layer_norm_plain(largest).unwrap();
    assert!(y.iter().all(|v| v.is_finite() && v.wide().abs() < 1e-15));
    let y = x.rms_norm_plain(largest).unwrap();
    assert!(y.iter().all(|v| v.is_finite() && v.wide().abs() < 1e-15));
}

#[test]
fn accepted_eps_f64() {
    accepted_eps::<f64>();
}

#[test]
fn accepted_eps_f32() {
    accepted_eps::<f32>();
}

// ---------------------------------------------------------------------------
// Display, Error, helpers

#[test]
fn display_texts() {
    let cases = [
        (
            NormError::LengthMismatch {
                operand: Operand::Gamma,
                expected: 3,
                found: 2,
            },
            "gamma has length 2, expected 3 (the number of features)",
        ),
        (
            NormError::LengthMismatch {
                operand: Operand::Beta,
                expected: 4,
                found: 0,
            },
            "beta has length 0, expected 4 (the number of features)",
        ),
        (
            NormError::ShapeMismatch {
                operand: Operand::Output,
                expected: vec![2, 3],
                found: vec![3, 2],
            },
            "output has shape [3, 2], expected [2, 3] (the shape of the input)",
        ),
        (NormError::EmptyAxis, "the last axis has length 0"),
        (
            NormError::ZeroDimensional,
            "the input has no axis to normalise (0-dimensional array)",
        ),
        (
            NormError::InvalidEps { eps: -0.5 },
            "eps must be finite and non-negative, found -0.5",
        ),
        (
            NormError::InvalidEps { eps: f64::NAN },
            "eps must be finite and non-negative, found NaN",
        ),
        (
            NormError::InvalidEps { eps: f64::INFINITY },
            "eps must be finite and non-negative, found inf",
        ),
        (
            NormError::InvalidEps {
                eps: f64::NEG_INFINITY,
            },
            "eps must be finite and non-negative, found -inf",
        ),
    ];
    for (error, text) in cases {
        assert_eq!(error.to_string(), text);
        // A std error with no underlying cause, usable as a trait object.
        let dynamic: Box<dyn std::error::Error + Send + Sync> = Box::new(error.clone());
        assert_eq!(dynamic.to_string(), text);
        assert!(dynamic.source().is_none());
    }
    assert_eq!(Operand::Gamma.to_string(), "gamma");
    assert_eq!(Operand::Beta.to_string(), "beta");
    assert_eq!(Operand::Output.to_string(), "output");
}

/// The texts as they come out of real calls, naming the bad argument.
#[test]
fn display_from_calls() {
    let x = array![[1.0_f32, 2.0, 3.0]];
    let e = x
        .layer_norm(&array![1.0, 1.0, 1.0], &Array1::zeros(5), 1e-5)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "beta has length 5, expected 3 (the number of features)"
    );
    let e = x.rms_norm_plain(-2.0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "eps must be finite and non-negative, found -2"
    );
    let mut out = Array3::<f32>::zeros((1, 1, 3));
    let e = x
        .insert_axis(ndarray::Axis(0))
        .layer_norm_plain_into(
            &mut out.view_mut().into_shape_with_order((1, 3, 1)).unwrap(),
            0.0,
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "output has shape [1, 3, 1], expected [1, 1, 3] (the shape of the input)"
    );
}

#[test]
fn is_shape_error() {
    assert!(NormError::LengthMismatch {
        operand: Operand::Beta,
        expected: 1,
        found: 2
    }
    .is_shape_error());
    assert!(NormError::ShapeMismatch {
        operand: Operand::Output,
        expected: vec![1],
        found: vec![2]
    }
    .is_shape_error());
    assert!(!NormError::EmptyAxis.is_shape_error());
    assert!(!NormError::ZeroDimensional.is_shape_error());
    assert!(!NormError::InvalidEps { eps: -1.0 }.is_shape_error());
}

// ---------------------------------------------------------------------------
// Leading axes of length 0: not an error, an empty result.

fn empty_leading<A: TestFloat>() {
    let eps = A::from_wide(1e-5);
    let g = Array1::from_elem(4, A::from_wide(2.0));
    let b = Array1::from_elem(4, A::from_wide(-1.0));
    let shapes: [&[usize]; 4] = [&[0, 4], &[2, 0, 4], &[0, 0, 4], &[3, 0, 1, 4]];
    for shape in shapes {
        let x = ArrayD::<A>::zeros(IxDyn(shape));
        let out = ArrayD::<A>::zeros(IxDyn(shape));
        for method in ALL {
            let outcome = call(method, &x, &out, &g, &b, eps);
            assert_eq!(outcome.result, Ok(()), "{method:?} {shape:?}");
            let expected = if method == Stats {
                shape[..shape.len() - 1].to_vec()
            } else {
                shape.to_vec()
            };
            if let Some(s) = outcome.shape {
                assert_eq!(s, expected, "{method:?}");
            }
            if let Some(w) = outcome.written {
                assert_eq!(w.shape(), shape);
                assert_eq!(w.len(), 0);
            }
        }
        // The operands are still checked against the last axis.
        let short = Array1::from_elem(3, A::from_wide(1.0));
        for method in ALL.into_iter().filter(|m| m.takes_gamma()) {
            expect_error(
                method,
                &x,
                &out,
                &short,
                &b,
                eps,
                &NormError::LengthMismatch {
                    operand: Operand::Gamma,
                    expected: 4,
                    found: 3,
                },
            );
        }
    }
    // Static dimensions too.
    let x = Array2::<A>::zeros((0, 4));
    assert_eq!(x.layer_norm(&g, &b, eps).unwrap().dim(), (0, 4));
    assert_eq!(x.rms_norm_plain(eps).unwrap().dim(), (0, 4));
    let (mean, rms) = x.stats().unwrap();
    assert_eq!((mean.dim(), rms.dim()), (0, 0));
    let x3 = Array3::<A>::zeros((2, 0, 4));
    let (mean, rms) = x3.stats().unwrap();
    assert_eq!((mean.dim(), rms.dim()), ((2, 0), (2, 0)));
    let mut out = Array3::<A>::zeros((2, 0, 4));
    assert_eq!(x3.layer_norm_plain_into(&mut out, eps), Ok(()));
}

#[test]
fn empty_leading_axes_f64() {
    empty_leading::<f64>();
}

#[test]
fn empty_leading_axes_f32() {
    empty_leading::<f32>();
}

// ---------------------------------------------------------------------------
// No public method panics, on any shape, operand lengths, eps or values.

/// Values that stress the arithmetic: zeros of both signs, subnormals,
/// extremes, infinities and NaN, beside ordinary ones.
fn nasty<A: TestFloat>() -> impl Strategy<Value = A> {
    const SPECIAL: [f64; 17] = [
        0.0,
        -0.0,
        1.0,
        -2.5,
        1e-310,
        -1e-45,
        1e-200,
        1e30,
        -1e38,
        3e38,
        1e200,
        -1.7e308,
        f64::MAX,
        f64::MIN_POSITIVE,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    prop_oneof![
        3 => -100.0..100.0_f64,
        2 => prop::sample::select(&SPECIAL[..]),
    ]
    .prop_map(A::from_wide)
}

/// `eps` values, good and bad.
fn any_eps<A: TestFloat>() -> impl Strategy<Value = A> {
    const POOL: [f64; 13] = [
        0.0,
        -0.0,
        1e-5,
        1.0,
        1e-310,
        f64::MAX,
        3e38,
        -1e-5,
        -1e-310,
        f64::MIN,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ];
    prop::sample::select(&POOL[..]).prop_map(A::from_wide)
}

#[derive(Debug)]
struct Case<A> {
    x: ArrayD<A>,
    out_shape: Vec<usize>,
    gamma: Array1<A>,
    beta: Array1<A>,
    eps: A,
}

fn case<A: TestFloat>() -> impl Strategy<Value = Case<A>> {
    // Leading axes of length 0 to 3, then (mostly) a last axis of 0 to 20,
    // past the kernel's 8 lanes; no axis at all now and then.
    let leading = prop::collection::vec(0usize..=3, 0..=3);
    let last = prop_oneof![1 => Just(None), 9 => (0usize..=20).prop_map(Some)];
    // Operand lengths: mostly right, sometimes anything.
    let length = || prop_oneof![3 => Just(None), 1 => (0usize..=21).prop_map(Some)];
    let out = prop_oneof![
        3 => Just(None),
        1 => prop::collection::vec(0usize..=4, 0..=3).prop_map(Some),
    ];
    (leading, last, length(), length(), out).prop_flat_map(|(mut shape, last, gl, bl, out)| {
        shape.extend(last);
        let d = shape.last().copied().unwrap_or(0);
        let n: usize = shape.iter().product();
        let out_shape = out.unwrap_or_else(|| shape.clone());
        (
            prop::collection::vec(nasty::<A>(), n),
            prop::collection::vec(nasty::<A>(), gl.unwrap_or(d)),
            prop::collection::vec(nasty::<A>(), bl.unwrap_or(d)),
            any_eps::<A>(),
        )
            .prop_map(move |(v, g, b, eps)| Case {
                x: ArrayD::from_shape_vec(IxDyn(&shape), v).unwrap(),
                out_shape: out_shape.clone(),
                gamma: Array1::from_vec(g),
                beta: Array1::from_vec(b),
                eps,
            })
    })
}

/// The errors `method` may report for `case`: every fault that is present.
/// An empty list means the call must succeed.
fn faults<A: TestFloat>(method: Method, case: &Case<A>) -> Vec<NormError> {
    let mut faults = Vec::new();
    // With d = 0, operands of another length are faults as well as the
    // empty axis; either may be reported.
    let d = match case.x.shape().last() {
        None => {
            faults.push(NormError::ZeroDimensional);
            None
        }
        Some(&d) => {
            if d == 0 {
                faults.push(NormError::EmptyAxis);
            }
            Some(d)
        }
    };
    if let Some(d) = d {
        if method.takes_gamma() && case.gamma.len() != d {
            faults.push(NormError::LengthMismatch {
                operand: Operand::Gamma,
                expected: d,
                found: case.gamma.len(),
            });
        }
        if method.takes_beta() && case.beta.len() != d {
            faults.push(NormError::LengthMismatch {
                operand: Operand::Beta,
                expected: d,
                found: case.beta.len(),
            });
        }
    }
    if method.takes_output() && case.out_shape != case.x.shape() {
        faults.push(NormError::ShapeMismatch {
            operand: Operand::Output,
            expected: case.x.shape().to_vec(),
            found: case.out_shape.clone(),
        });
    }
    faults
}

/// Runs every method on `case` with standard-layout arrays, then with
/// Fortran-order input and output (rows that are not contiguous).
fn never_panics<A: TestFloat>(case: &Case<A>) -> Result<(), TestCaseError> {
    let standard = ArrayD::from_elem(IxDyn(&case.out_shape), A::from_wide(JUNK));
    let mut fortran_x = ArrayD::from_elem(case.x.raw_dim().f(), A::from_wide(JUNK));
    fortran_x.assign(&case.x);
    let fortran_out = ArrayD::from_elem(IxDyn(&case.out_shape).f(), A::from_wide(JUNK));
    never_panics_on(case, &case.x, &standard)?;
    never_panics_on(case, &fortran_x, &fortran_out)
}

fn never_panics_on<A: TestFloat>(
    case: &Case<A>,
    x: &ArrayD<A>,
    out: &ArrayD<A>,
) -> Result<(), TestCaseError> {
    for method in ALL {
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            call(method, x, out, &case.gamma, &case.beta, case.eps)
        }));
        let Ok(outcome) = outcome else {
            return Err(TestCaseError::fail(format!("{method:?} panicked")));
        };
        let faults = faults(method, case);
        let eps_bad = method.takes_eps() && {
            let e = case.eps.wide();
            !(e.is_finite() && e >= 0.0)
        };
        match &outcome.result {
            Ok(()) => prop_assert!(
                faults.is_empty() && !eps_bad,
                "{method:?} accepted bad input: {faults:?}, eps {}",
                case.eps
            ),
            Err(NormError::InvalidEps { eps }) => {
                prop_assert!(eps_bad, "{method:?}: eps {} is valid", case.eps);
                prop_assert_eq!(eps.to_bits(), case.eps.wide().to_bits());
            }
            Err(e) => prop_assert!(
                faults.contains(e),
                "{method:?}: {e:?} is none of the faults {faults:?}"
            ),
        }
        if outcome.result.is_err() {
            if let Some(w) = &outcome.written {
                let before = if method.in_place() { x } else { out };
                prop_assert_eq!(bits(w), bits(before), "{:?} wrote before failing", method);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_method_panics_f64(case in case::<f64>()) {
        never_panics(&case)?;
    }

    #[test]
    fn no_method_panics_f32(case in case::<f32>()) {
        never_panics(&case)?;
    }
}

/// A broadcast view of a vast shape: every allocating form reports
/// `OutOfMemory` instead of aborting the process, and so does any call
/// whose working memory (gathered rows, a copy of a strided `gamma`)
/// cannot be had. The results would take
/// 2⁵⁰ bytes (beyond the address space of a 64-bit process today, so no
/// allocator can give them, whatever it overcommits) or, at 2⁶⁵ bytes,
/// more than an allocation may hold.
#[test]
fn vast_results_are_out_of_memory() {
    let row = Array1::<f32>::from_shape_fn(16, |j| j as f32);
    let (gamma, beta) = (Array1::ones(16), Array1::zeros(16));
    let x = row.broadcast((1usize << 44, 16)).unwrap();
    let rows_out = NormError::OutOfMemory {
        elements: 1 << 48,
        element_size: 4,
    };
    assert_eq!(x.layer_norm(&gamma, &beta, 1e-5).unwrap_err(), rows_out);
    assert_eq!(x.layer_norm_plain(1e-5).unwrap_err(), rows_out);
    assert_eq!(x.rms_norm(&gamma, 1e-5).unwrap_err(), rows_out);
    assert_eq!(x.rms_norm_plain(1e-5).unwrap_err(), rows_out);
    assert_eq!(
        x.add_layer_norm(&x, &gamma, &beta, 1e-5).unwrap_err(),
        rows_out
    );
    assert_eq!(x.add_rms_norm(&x, &gamma, 1e-5).unwrap_err(), rows_out);
    assert_eq!(
        x.layer_norm_backward(&x, &gamma, 1e-5).unwrap_err(),
        rows_out
    );
    assert_eq!(x.rms_norm_backward(&x, &gamma, 1e-5).unwrap_err(), rows_out);
    assert!(matches!(
        x.layer_norm_train(&gamma, &beta, 1e-5),
        Err(NormError::OutOfMemory { .. })
    ));
    assert!(matches!(
        x.rms_norm_train(&gamma, 1e-5),
        Err(NormError::OutOfMemory { .. })
    ));
    let layer = ndarray_layernorm::LayerNorm::<f32>::new(16);
    assert_eq!(layer.forward(&x).unwrap_err(), rows_out);
    let layer = ndarray_layernorm::RmsNorm::<f32>::new(16);
    assert_eq!(layer.forward(&x).unwrap_err(), rows_out);
    assert_eq!(
        rows_out.to_string(),
        "cannot allocate the result: 281474976710656 elements of 4 bytes"
    );

    // `stats` allocates the leading shape only: rows of one element.
    let column = Array1::<f32>::ones(1);
    let tall = column.broadcast((1usize << 48, 1)).unwrap();
    let stats_out = NormError::OutOfMemory {
        elements: 1 << 48,
        element_size: 4,
    };
    assert_eq!(tall.stats().unwrap_err(), stats_out);

    // A vast broadcast row must be gathered to be summed: its working
    // memory cannot be had, whatever the size of the result.
    let one = Array1::<f32>::ones(1);
    let vast_row = one.broadcast((1, 1usize << 46)).unwrap();
    let gather_out = NormError::OutOfMemory {
        elements: 1 << 46,
        element_size: 4,
    };
    assert_eq!(vast_row.stats().unwrap_err(), gather_out);
    let mut out = Array2::<f32>::zeros((1, 4));
    let short_row = one.broadcast((1, 4)).unwrap();
    assert!(short_row.layer_norm_plain_into(&mut out, 0.0).is_ok());
    let one = Array1::<f64>::ones(1);
    let longest_row = one.broadcast((1, 1usize << 61)).unwrap();
    assert!(matches!(
        longest_row.stats(),
        Err(NormError::OutOfMemory { .. })
    ));

    // A vast strided gamma cannot be gathered either.
    let gain = Array1::<f32>::ones(1);
    let vast_gamma = gain.broadcast(1usize << 46).unwrap();
    let no_rows = Array2::<f32>::zeros((0, 1usize << 46));
    assert_eq!(no_rows.rms_norm(&vast_gamma, 1e-5).unwrap_err(), gather_out);

    // 2⁶² elements of 8 bytes overflow any allocation's size.
    let wide = Array1::<f64>::ones(2);
    let overflow = wide.broadcast((1usize << 61, 2)).unwrap();
    assert_eq!(
        overflow.layer_norm_plain(0.0).unwrap_err(),
        NormError::OutOfMemory {
            elements: 1 << 62,
            element_size: 8,
        }
    );
}
