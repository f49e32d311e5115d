//! The parameter-holding layers `LayerNorm` and `RmsNorm`.

mod common;

use common::training::{bits32, bits64, matrix, noise, vector};
use ndarray::{array, s, Array1, Array2, Array3, ArrayD, IxDyn};
use ndarray_layernorm::prelude::*;
use ndarray_layernorm::Operand;
use proptest::prelude::*;

// A layer of no features refuses every input, as its docs say.
#[test]
fn layers_of_no_features_refuse_every_input() {
    let empty = Array2::<f64>::zeros((2, 0));
    let rows = Array2::<f64>::zeros((2, 3));
    let mismatch = Err(NormError::LengthMismatch {
        operand: Operand::Gamma,
        expected: 3,
        found: 0,
    });
    let norm = LayerNorm::<f64>::new(0);
    assert_eq!(norm.forward(&empty), Err(NormError::EmptyAxis));
    assert_eq!(norm.forward(&rows), mismatch);
    let rms = RmsNorm::<f64>::new(0);
    assert_eq!(rms.forward(&empty), Err(NormError::EmptyAxis));
    assert_eq!(rms.forward(&rows), mismatch);
}

#[test]
fn fresh_layers_start_as_a_fresh_model() {
    let norm = LayerNorm::<f32>::new(4);
    assert_eq!(norm.gamma(), Array1::<f32>::ones(4));
    assert_eq!(norm.beta(), Some(&Array1::<f32>::zeros(4)));
    assert_eq!(norm.eps(), 1e-5_f32);
    assert_eq!(norm.dim(), 4);

    let rms = RmsNorm::<f64>::new(4);
    assert_eq!(rms.gamma(), Array1::<f64>::ones(4));
    assert_eq!(rms.eps(), 1e-6);
    assert!(!rms.is_zero_centred());

    let gemma = RmsNorm::<f64>::zero_centred(4);
    assert_eq!(gemma.gamma(), Array1::<f64>::zeros(4));
    assert!(gemma.is_zero_centred());
}

// The seed's worked trace: x = [2, 4, 6, 8], gamma = [2, 1, 1, 0.5],
// beta = [0, 0, 1, 0], eps = 1e-5 gives [-2.6833, -0.4472, 1.4472, 0.6708].
#[test]
fn layer_norm_reproduces_the_seed_trace() {
    let norm = LayerNorm::from_parts(
        array![2.0_f64, 1.0, 1.0, 0.5],
        Some(array![0.0, 0.0, 1.0, 0.0]),
        1e-5,
    )
    .unwrap();
    let y = norm.forward(&array![[2.0, 4.0, 6.0, 8.0]]).unwrap();
    assert!(y.abs_diff_eq(&array![[-2.6833, -0.4472, 1.4472, 0.6708]], 5e-5));
}

// Seed 002: RMSNorm of [2, -2, 4, -4] (mean of squares 10) is
// [0.6325, -0.6325, 1.2649, -1.2649].
#[test]
fn rms_norm_reproduces_the_seed_trace() {
    let y = RmsNorm::<f32>::new(4)
        .forward(&array![2.0, -2.0, 4.0, -4.0])
        .unwrap();
    assert!(y.abs_diff_eq(&array![0.6325, -0.6325, 1.2649, -1.2649], 1e-4));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn layers_give_the_bits_of_the_extension_traits(
        (x, gamma, beta, dy) in matrix(5, 12, -3.0..3.0).prop_flat_map(|x| {
            let (rows, d) = x.dim();
            (Just(x), vector(d, -2.0..2.0), vector(d, -1.0..1.0), matrix_of(rows, d))
        })
    ) {
        let norm = LayerNorm::from_parts(gamma.clone(), Some(beta.clone()), 1e-5).unwrap();
        let y = norm.forward(&x).unwrap();
        prop_assert_eq!(bits64(&y), bits64(&x.layer_norm(&gamma, &beta, 1e-5).unwrap()));
        let (y_train, stats) = norm.forward_train(&x).unwrap();
        prop_assert_eq!(bits64(&y_train), bits64(&y));
        let grads = norm.backward(&x, &dy, &stats).unwrap();
        let expected = x.layer_norm_backward(&dy, &gamma, 1e-5).unwrap();
        prop_assert_eq!(bits64(&grads.dx), bits64(&expected.dx));
        prop_assert_eq!(bits64(&grads.dgamma), bits64(&expected.dgamma));
        prop_assert_eq!(bits64(&grads.dbeta), bits64(&expected.dbeta));

        // Without bias: the output lacks beta and the gradients do not
        // depend on it.
        let plain = LayerNorm::from_parts(gamma.clone(), None, 1e-5).unwrap();
        let zero_beta = Array1::zeros(gamma.len());
        prop_assert_eq!(plain.forward(&x).unwrap(), x.layer_norm(&gamma, &zero_beta, 1e-5).unwrap());
        let (y_plain, stats) = plain.forward_train(&x).unwrap();
        prop_assert_eq!(bits64(&y_plain), bits64(&plain.forward(&x).unwrap()));
        let grads = plain.backward(&x, &dy, &stats).unwrap();
        prop_assert_eq!(bits64(&grads.dx), bits64(&expected.dx));
        prop_assert_eq!(bits64(&grads.dgamma), bits64(&expected.dgamma));

        let rms = RmsNorm::from_parts(gamma.clone(), 1e-6).unwrap();
        let y = rms.forward(&x).unwrap();
        prop_assert_eq!(bits64(&y), bits64(&x.rms_norm(&gamma, 1e-6).unwrap()));
        let (y_train, stats) = rms.forward_train(&x).unwrap();
        prop_assert_eq!(bits64(&y_train), bits64(&y));
        let grads = rms.backward(&x, &dy, &stats).unwrap();
        let expected = x.rms_norm_backward(&dy, &gamma, 1e-6).unwrap();
        prop_assert_eq!(bits64(&grads.dx), bits64(&expected.dx));
        prop_assert_eq!(bits64(&grads.dgamma), bits64(&expected.dgamma));
    }

    // With w on a grid of 1/8 in [-1, 1], 1 + w is exact in f32, so the
    // zero-centred layer must agree bit for bit with the plain one whose
    // gamma is 1 + w; dγ and dw are the same gradient.
    #[test]
    fn zero_centred_layer_is_the_plain_layer_with_one_plus_w(
        (x, w, dy) in matrix(5, 12, -3.0..3.0).prop_flat_map(|x| {
            let (rows, d) = x.dim();
            (Just(x), proptest::collection::vec(-8_i8..=8, d), matrix_of(rows, d))
        })
    ) {
        let x = x.mapv(|v| v as f32);
        let dy = dy.mapv(|v| v as f32);
        let w = Array1::from_iter(w.iter().map(|&k| f32::from(k) / 8.0));
        let gemma = RmsNorm::from_parts_zero_centred(w.clone(), 1e-6).unwrap();
        let plain = RmsNorm::from_parts(w.mapv(|v| 1.0 + v), 1e-6).unwrap();
        let y = gemma.forward(&x).unwrap();
        prop_assert_eq!(bits32(&y), bits32(&plain.forward(&x).unwrap()));
        let (y_train, stats) = gemma.forward_train(&x).unwrap();
        prop_assert_eq!(bits32(&y_train), bits32(&y));
        let grads = gemma.backward(&x, &dy, &stats).unwrap();
        let (_, plain_stats) = plain.forward_train(&x).unwrap();
        let expected = plain.backward(&x, &dy, &plain_stats).unwrap();
        prop_assert_eq!(bits32(&grads.dx), bits32(&expected.dx));
        prop_assert_eq!(bits32(&grads.dgamma), bits32(&expected.dgamma));
    }
}

fn matrix_of(rows: usize, d: usize) -> impl Strategy<Value = Array2<f64>> {
    proptest::collection::vec(-1.0..1.0, rows * d)
        .prop_map(move |v| Array2::from_shape_vec((rows, d), v).unwrap())
}

// 1 + 3e-8 rounds to 1 in f32 (half an ulp of 1 is 6e-8), but not in f64.
// The zero-centred gain is formed in f64, so the f32 output is the f64
// output of the same data rounded once, and differs from gamma = 1 on some
// elements.
#[test]
fn zero_centred_gain_is_formed_in_f64() {
    let (rows, d) = (40, 25);
    let x32 = Array2::from_shape_vec((rows, d), noise(41, rows * d))
        .unwrap()
        .mapv(|v| v as f32);
    let w = 3e-8_f32;
    assert_eq!(1.0 + w, 1.0);
    let gemma32 = RmsNorm::from_parts_zero_centred(Array1::from_elem(d, w), 1e-6).unwrap();
    let gemma64 =
        RmsNorm::from_parts_zero_centred(Array1::from_elem(d, f64::from(w)), f64::from(1e-6_f32))
            .unwrap();
    let y32 = gemma32.forward(&x32).unwrap();
    let y64 = gemma64.forward(&x32.mapv(f64::from)).unwrap();
    assert_eq!(bits32(&y32), bits32(&y64.mapv(|v| v as f32)));
    let ones = RmsNorm::<f32>::new(d).forward(&x32).unwrap();
    let differing = y32.iter().zip(&ones).filter(|(a, b)| a != b).count();
    assert!(differing > 0, "1 + w was rounded to f32");
}

#[test]
fn layers_work_on_any_dimension() {
    let norm = LayerNorm::<f64>::new(3);
    let x = Array3::from_shape_vec((2, 4, 3), noise(51, 24)).unwrap();
    let y = norm.forward(&x).unwrap();
    assert_eq!(
        bits64(&y),
        bits64(
            &x.layer_norm(&Array1::ones(3), &Array1::zeros(3), 1e-5)
                .unwrap()
        )
    );
    let (_, stats) = norm.forward_train(&x).unwrap();
    assert_eq!(stats.mean().shape(), &[2, 4]);
    let dy = Array3::from_shape_vec((2, 4, 3), noise(52, 24)).unwrap();
    let grads = norm.backward(&x, &dy, &stats).unwrap();
    assert_eq!(grads.dx.shape(), &[2, 4, 3]);

    let x1 = array![1.0_f32, 5.0, 3.0];
    let (y1, stats) = RmsNorm::<f32>::new(3).forward_train(&x1).unwrap();
    assert_eq!(y1, x1.rms_norm(&Array1::ones(3), 1e-6).unwrap());
    assert_eq!(stats.rrms().ndim(), 0);

    let xd = ArrayD::from_shape_vec(IxDyn(&[2, 1, 3]), noise(53, 6)).unwrap();
    assert_eq!(norm.forward(&xd).unwrap().shape(), &[2, 1, 3]);
    // A strided view works too, with the same bits.
    let wide = Array2::from_shape_vec((4, 6), noise(54, 24)).unwrap();
    let view = wide.slice(s![.., ..;2]);
    assert_eq!(
        bits64(&norm.forward(&view).unwrap()),
        bits64(&norm.forward(&view.to_owned()).unwrap())
    );
}

#[test]
fn parameters_update_through_accessors() {
    let mut norm = LayerNorm::<f64>::new(2);
    norm.gamma_mut().assign(&array![2.0, 3.0]);
    if let Some(mut beta) = norm.beta_mut() {
        beta.assign(&array![0.5, -0.5]);
    }
    let norm = norm.with_eps(0.0).unwrap();
    // x̂ = [-1, 1]: y = [-2 + 0.5, 3 - 0.5].
    assert_eq!(norm.forward(&array![1.0, 3.0]).unwrap(), array![-1.5, 2.5]);
    assert!(LayerNorm::<f64>::without_bias(2).beta_mut().is_none());

    let mut rms = RmsNorm::<f32>::zero_centred(2).with_eps(0.0).unwrap();
    rms.gamma_mut().assign(&array![1.0, -0.5]);
    // x / rms = [1, -1]; gain 1 + w = [2, 0.5].
    assert_eq!(rms.forward(&array![3.0, -3.0]).unwrap(), array![2.0, -0.5]);
}

#[test]
fn bad_parameters_and_inputs_are_rejected() {
    assert_eq!(
        LayerNorm::from_parts(array![1.0_f64, 1.0], Some(array![0.0]), 1e-5),
        Err(NormError::LengthMismatch {
            operand: Operand::Beta,
            expected: 2,
            found: 1
        })
    );
    assert_eq!(
        LayerNorm::from_parts(array![1.0_f32], None, -1.0),
        Err(NormError::InvalidEps { eps: -1.0 })
    );
    assert!(RmsNorm::from_parts(array![1.0_f64], f64::INFINITY).is_err());
    assert!(RmsNorm::from_parts_zero_centred(array![0.0_f64], f64::NAN).is_err());
    assert!(LayerNorm::<f64>::new(2).with_eps(-0.5).is_err());

    let norm = LayerNorm::<f64>::new(3);
    let x = Array2::<f64>::zeros((2, 4));
    assert_eq!(
        norm.forward(&x),
        Err(NormError::LengthMismatch {
            operand: Operand::Gamma,
            expected: 4,
            found: 3
        })
    );
    assert_eq!(
        RmsNorm::<f64>::new(3).forward_train(&x).unwrap_err(),
        NormError::LengthMismatch {
            operand: Operand::Gamma,
            expected: 4,
            found: 3
        }
    );
    assert_eq!(
        norm.forward(&ArrayD::<f64>::zeros(IxDyn(&[]))),
        Err(NormError::ZeroDimensional)
    );

    let x = Array2::<f64>::ones((2, 3));
    let (_, stats) = norm.forward_train(&x).unwrap();
    assert_eq!(
        norm.backward(&x, &Array2::zeros((2, 2)), &stats)
            .unwrap_err(),
        NormError::ShapeMismatch {
            operand: Operand::Gradient,
            expected: vec![2, 3],
            found: vec![2, 2]
        }
    );
    let other = Array2::<f64>::ones((3, 3));
    assert_eq!(
        norm.backward(&other, &other, &stats).unwrap_err(),
        NormError::ShapeMismatch {
            operand: Operand::Stats,
            expected: vec![3, 3],
            found: vec![2, 3]
        }
    );
    let rms = RmsNorm::<f64>::new(3);
    let (_, rms_stats) = rms.forward_train(&x).unwrap();
    assert!(rms.backward(&other, &other, &rms_stats).is_err());
}
