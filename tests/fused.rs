//! The residual add fused with the normalisation gives the bits of the add
//! followed by the normalisation.

mod common;

use common::training::{bits32, bits64, matrix, noise, vector};
use ndarray::{array, s, Array1, Array2, Array3, ShapeBuilder};
use ndarray_layernorm::prelude::*;
use ndarray_layernorm::Operand;
use proptest::prelude::*;

type Case = (Array2<f64>, Array2<f64>, Array1<f64>, Array1<f64>);

/// `(x, residual, gamma, beta)`; the residual is large next to x, as in a
/// residual stream, so that the add rounds.
fn case() -> impl Strategy<Value = Case> {
    matrix(6, 20, -1.0..1.0).prop_flat_map(|x| {
        let (rows, d) = x.dim();
        (
            Just(x),
            proptest::collection::vec(-100.0..100.0, rows * d)
                .prop_map(move |v| Array2::from_shape_vec((rows, d), v).unwrap()),
            vector(d, -2.0..2.0),
            vector(d, -1.0..1.0),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn fused_forms_give_the_bits_of_add_then_normalise((x, r, gamma, beta) in case()) {
        let h = &x + &r;
        let (y, h_fused) = x.add_layer_norm(&r, &gamma, &beta, 1e-5).unwrap();
        prop_assert_eq!(bits64(&h_fused), bits64(&h));
        prop_assert_eq!(bits64(&y), bits64(&h.layer_norm(&gamma, &beta, 1e-5).unwrap()));
        let (y, h_fused) = x.add_rms_norm(&r, &gamma, 1e-6).unwrap();
        prop_assert_eq!(bits64(&h_fused), bits64(&h));
        prop_assert_eq!(bits64(&y), bits64(&h.rms_norm(&gamma, 1e-6).unwrap()));

        let mut stream = r.clone();
        let y = x.add_layer_norm_inplace(&mut stream, &gamma, &beta, 1e-5).unwrap();
        prop_assert_eq!(bits64(&stream), bits64(&h));
        prop_assert_eq!(bits64(&y), bits64(&h.layer_norm(&gamma, &beta, 1e-5).unwrap()));
        let mut stream = r.clone();
        let y = x.add_rms_norm_inplace(&mut stream, &gamma, 1e-6).unwrap();
        prop_assert_eq!(bits64(&stream), bits64(&h));
        prop_assert_eq!(bits64(&y), bits64(&h.rms_norm(&gamma, 1e-6).unwrap()));
    }

    // In f32 the add rounds to f32, exactly as `&x + &residual` does.
    #[test]
    fn fused_forms_round_the_sum_in_f32((x, r, gamma, beta) in case()) {
        let (x, r) = (x.mapv(|v| v as f32), r.mapv(|v| v as f32));
        let (gamma, beta) = (gamma.mapv(|v| v as f32), beta.mapv(|v| v as f32));
        let h = &x + &r;
        let (y, h_fused) = x.add_layer_norm(&r, &gamma, &beta, 1e-5).unwrap();
        prop_assert_eq!(bits32(&h_fused), bits32(&h));
        prop_assert_eq!(bits32(&y), bits32(&h.layer_norm(&gamma, &beta, 1e-5).unwrap()));
        let mut stream = r.clone();
        let y = x.add_rms_norm_inplace(&mut stream, &gamma, 1e-6).unwrap();
        prop_assert_eq!(bits32(&stream), bits32(&h));
        prop_assert_eq!(bits32(&y), bits32(&h.rms_norm(&gamma, 1e-6).unwrap()));
    }
}

#[test]
fn fused_forms_work_for_any_layout_and_dimension() {
    let (rows, d) = (70, 12); // more than one block of rows
    let x = Array2::from_shape_vec((rows, d), noise(61, rows * d)).unwrap();
    let r = Array2::from_shape_vec((rows, d), noise(62, rows * d)).unwrap();
    let gamma = Array1::from(noise(63, d));
    let beta = Array1::from(noise(64, d));
    let h = &x + &r;
    let expected = h.layer_norm(&gamma, &beta, 1e-5).unwrap();

    // A Fortran-order residual buffer updated in place, and an x read
    // through a stepped view.
    let mut stream = Array2::zeros((rows, d).f());
    stream.assign(&r);
    let mut wide = Array2::zeros((rows, 2 * d));
    wide.slice_mut(s![.., ..;2]).assign(&x);
    let y = wide
        .slice(s![.., ..;2])
        .add_layer_norm_inplace(&mut stream, &gamma, &beta, 1e-5)
        .unwrap();
    assert_eq!(bits64(&y), bits64(&expected));
    assert_eq!(bits64(&stream), bits64(&h));

    // A reversed residual view, read only.
    let mut reversed = Array2::zeros((rows, d));
    reversed.assign(&r.slice(s![.., ..;-1]));
    let (y, h_fused) = x
        .add_layer_norm(&reversed.slice(s![.., ..;-1]), &gamma, &beta, 1e-5)
        .unwrap();
    assert_eq!(bits64(&y), bits64(&expected));
    assert_eq!(bits64(&h_fused), bits64(&h));

    // Three dimensions, and a stepped view as the in-place residual.
    let x3 = Array3::from_shape_vec((2, 3, 4), noise(65, 24)).unwrap();
    let mut big = Array3::from_shape_vec((2, 3, 8), noise(66, 48)).unwrap();
    let r3 = big.slice(s![.., .., ..;2]).to_owned();
    let ones = Array1::ones(4);
    let y = x3
        .add_rms_norm_inplace(&mut big.slice_mut(s![.., .., ..;2]), &ones, 1e-6)
        .unwrap();
    let h3 = &x3 + &r3;
    assert_eq!(bits64(&y), bits64(&h3.rms_norm(&ones, 1e-6).unwrap()));
    assert_eq!(bits64(&big.slice(s![.., .., ..;2])), bits64(&h3));
    // The elements between the steps are untouched.
    let untouched = Array3::from_shape_vec((2, 3, 8), noise(66, 48)).unwrap();
    assert_eq!(
        big.slice(s![.., .., 1..;2]),
        untouched.slice(s![.., .., 1..;2])
    );
}

#[test]
fn mismatched_residual_is_rejected_and_left_untouched() {
    let x = Array2::<f64>::ones((2, 3));
    let mut residual = Array2::<f64>::from_elem((3, 3), 7.0);
    let gamma = array![1.0, 1.0, 1.0];
    let expected = NormError::ShapeMismatch {
        operand: Operand::Residual,
        expected: vec![2, 3],
        found: vec![3, 3],
    };
    assert_eq!(
        x.add_layer_norm(&residual, &gamma, &gamma, 1e-5)
            .unwrap_err(),
        expected
    );
    assert_eq!(
        x.add_rms_norm(&residual, &gamma, 1e-5).unwrap_err(),
        expected
    );
    assert_eq!(
        x.add_layer_norm_inplace(&mut residual, &gamma, &gamma, 1e-5)
            .unwrap_err(),
        expected
    );
    assert_eq!(
        x.add_rms_norm_inplace(&mut residual, &gamma, 1e-5)
            .unwrap_err(),
        expected
    );
    assert_eq!(residual, Array2::from_elem((3, 3), 7.0));
    assert_eq!(
        expected.to_string(),
        "residual has shape [3, 3], expected [2, 3] (the shape of the input)"
    );

    // Bad gamma or eps: the residual buffer is not written either.
    let mut residual = Array2::<f64>::from_elem((2, 3), 7.0);
    assert!(x
        .add_layer_norm_inplace(&mut residual, &array![1.0], &gamma, 1e-5)
        .is_err());
    assert!(x.add_rms_norm_inplace(&mut residual, &gamma, -1.0).is_err());
    assert_eq!(residual, Array2::from_elem((2, 3), 7.0));
}
