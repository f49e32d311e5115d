//! The result bits of every method do not depend on the memory layout of
//! the input, of the `_into` output, of the `_inplace` array, or of `gamma`
//! and `beta`: C order, Fortran order, stepped slices, negative strides,
//! broadcast views, 3-D and `IxDyn` arrays all give the same bits as the
//! standard-layout 2-D array, for `f32` and `f64`.

mod common;

use common::{
    bits, eps, feature_vector, layouts, outputs, repeated_rows, rows, Layouts, TestFloat,
};
use ndarray::{Array1, Array2, ArrayRef, ArrayView1, RemoveAxis};
use ndarray_layernorm::prelude::*;
use proptest::prelude::*;

/// The operands of one test case.
#[derive(Debug)]
struct Operands<A> {
    gamma: Array1<A>,
    beta: Array1<A>,
    eps: A,
}

/// The bits of every allocating method's result, in logical order.
#[derive(Debug, PartialEq)]
struct Results {
    layer_norm: Vec<u64>,
    layer_norm_plain: Vec<u64>,
    rms_norm: Vec<u64>,
    rms_norm_plain: Vec<u64>,
    mean: Vec<u64>,
    rms: Vec<u64>,
}

fn allocating<A: TestFloat, D: RemoveAxis>(
    x: &ArrayRef<A, D>,
    gamma: &ArrayView1<A>,
    beta: &ArrayView1<A>,
    eps: A,
) -> Results {
    let (mean, rms) = x.stats().unwrap();
    Results {
        layer_norm: bits(&x.layer_norm(gamma, beta, eps).unwrap()),
        layer_norm_plain: bits(&x.layer_norm_plain(eps).unwrap()),
        rms_norm: bits(&x.rms_norm(gamma, eps).unwrap()),
        rms_norm_plain: bits(&x.rms_norm_plain(eps).unwrap()),
        mean: bits(&mean),
        rms: bits(&rms),
    }
}

/// The methods that write into an array.
#[derive(Clone, Copy, Debug)]
enum Writer {
    LayerNorm,
    LayerNormPlain,
    RmsNorm,
    RmsNormPlain,
}

const WRITERS: [Writer; 4] = [
    Writer::LayerNorm,
    Writer::LayerNormPlain,
    Writer::RmsNorm,
    Writer::RmsNormPlain,
];

impl Writer {
    fn expected(self, r: &Results) -> &[u64] {
        match self {
            Writer::LayerNorm => &r.layer_norm,
            Writer::LayerNormPlain => &r.layer_norm_plain,
            Writer::RmsNorm => &r.rms_norm,
            Writer::RmsNormPlain => &r.rms_norm_plain,
        }
    }

    fn into<A: TestFloat, D: RemoveAxis>(
        self,
        x: &ArrayRef<A, D>,
        out: &mut ArrayRef<A, D>,
        p: &Operands<A>,
    ) -> Result<(), NormError> {
        match self {
            Writer::LayerNorm => x.layer_norm_into(out, &p.gamma, &p.beta, p.eps),
            Writer::LayerNormPlain => x.layer_norm_plain_into(out, p.eps),
            Writer::RmsNorm => x.rms_norm_into(out, &p.gamma, p.eps),
            Writer::RmsNormPlain => x.rms_norm_plain_into(out, p.eps),
        }
    }

    fn inplace<A: TestFloat, D: RemoveAxis>(
        self,
        x: &mut ArrayRef<A, D>,
        p: &Operands<A>,
    ) -> Result<(), NormError> {
        match self {
            Writer::LayerNorm => x.layer_norm_inplace(&p.gamma, &p.beta, p.eps),
            Writer::LayerNormPlain => x.layer_norm_plain_inplace(p.eps),
            Writer::RmsNorm => x.rms_norm_inplace(&p.gamma, p.eps),
            Writer::RmsNormPlain => x.rms_norm_plain_inplace(p.eps),
        }
    }
}

/// Every layout of one dimensionality against `reference`: allocating
/// methods and `stats` on every input layout; `_into` from the standard
/// input into every output layout; `_inplace` on every writable layout.
fn check_layouts<A: TestFloat, D: RemoveAxis>(
    label: &str,
    layouts: &Layouts<A, D>,
    p: &Operands<A>,
    reference: &Results,
) -> Result<(), TestCaseError> {
    let (gamma, beta) = (p.gamma.view(), p.beta.view());
    for (name, x) in layouts.views() {
        let got = allocating(&x, &gamma, &beta, p.eps);
        prop_assert_eq!(&got, reference, "{} {} input ({})", label, name, A::NAME);
    }
    let standard = layouts.standard();
    for writer in WRITERS {
        let mut outs = outputs::<A, D>(standard.raw_dim());
        for (name, mut out) in outs.views_mut() {
            writer.into(standard, &mut out, p).unwrap();
            prop_assert_eq!(
                bits(&out),
                writer.expected(reference),
                "{:?}_into {} {} output ({})",
                writer,
                label,
                name,
                A::NAME
            );
        }
        prop_assert!(outs.junk_intact(), "{:?}_into wrote between steps", writer);

        // `_into` from every input layout into a standard output, too.
        for (name, x) in layouts.views() {
            let mut out = outputs::<A, D>(standard.raw_dim());
            let mut views = out.views_mut();
            let (_, target) = &mut views[0];
            writer.into(&x, target, p).unwrap();
            prop_assert_eq!(
                bits(&*target),
                writer.expected(reference),
                "{:?}_into {} {} input ({})",
                writer,
                label,
                name,
                A::NAME
            );
        }

        let mut fresh = Layouts::new(standard);
        for (name, mut y) in fresh.views_mut() {
            writer.inplace(&mut y, p).unwrap();
            prop_assert_eq!(
                bits(&y),
                writer.expected(reference),
                "{:?}_inplace {} {} ({})",
                writer,
                label,
                name,
                A::NAME
            );
        }
        prop_assert!(
            fresh.junk_intact(),
            "{:?}_inplace wrote between steps",
            writer
        );
    }
    Ok(())
}

fn layout_invariance<A: TestFloat>(a: &Array2<A>, p: &Operands<A>) -> Result<(), TestCaseError> {
    let all = layouts(a);
    let (gamma, beta) = (p.gamma.view(), p.beta.view());
    let reference = allocating(all.d2.standard(), &gamma, &beta, p.eps);

    // gamma and beta in other layouts: stepped and reversed views.
    let d = p.gamma.len();
    let mut wide_gamma = Array1::from_elem(2 * d, A::from_wide(common::JUNK));
    wide_gamma.slice_mut(ndarray::s![..;2]).assign(&p.gamma);
    let reversed_beta: Array1<A> = p.beta.iter().rev().copied().collect();
    let stepped_gamma = wide_gamma.slice(ndarray::s![..;2]);
    let negative_beta = reversed_beta.slice(ndarray::s![..;-1]);
    let got = allocating(all.d2.standard(), &stepped_gamma, &negative_beta, p.eps);
    prop_assert_eq!(&got, &reference, "gamma/beta views ({})", A::NAME);

    check_layouts("2-D", &all.d2, p, &reference)?;
    check_layouts("3-D", &all.d3, p, &reference)?;
    check_layouts("IxDyn", &all.dyn_, p, &reference)?;
    Ok(())
}

fn case<A: TestFloat>(
    arrays: impl Strategy<Value = Array2<A>>,
) -> impl Strategy<Value = (Array2<A>, Operands<A>)> {
    (arrays, eps::<A>()).prop_flat_map(|(a, eps)| {
        let d = a.ncols();
        (feature_vector::<A>(d), feature_vector::<A>(d))
            .prop_map(move |(gamma, beta)| (a.clone(), Operands { gamma, beta, eps }))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn layouts_agree_bit_for_bit_f64((a, p) in case(rows::<f64>())) {
        layout_invariance(&a, &p)?;
    }

    #[test]
    fn layouts_agree_bit_for_bit_f32((a, p) in case(rows::<f32>())) {
        layout_invariance(&a, &p)?;
    }

    /// Arrays whose rows are all equal, so that a broadcast view of one row
    /// is among the layouts.
    #[test]
    fn broadcast_agrees_bit_for_bit_f64((a, p) in case(repeated_rows::<f64>())) {
        prop_assert!(layouts(&a).d2.has_broadcast());
        layout_invariance(&a, &p)?;
    }

    #[test]
    fn broadcast_agrees_bit_for_bit_f32((a, p) in case(repeated_rows::<f32>())) {
        prop_assert!(layouts(&a).d3.has_broadcast());
        layout_invariance(&a, &p)?;
    }
}

/// Rows with NaN and infinities give the same bits in every layout too.
#[test]
fn non_finite_rows_agree_across_layouts() {
    let a = ndarray::array![
        [1.0_f64, f64::NAN, 3.0, 4.0],
        [f64::INFINITY, 1.0, 2.0, 3.0],
        [5.0, 5.0, 5.0, 5.0],
        [1e300, -1e300, 1e-300, 0.0],
    ];
    let p = Operands {
        gamma: ndarray::array![1.0, -2.0, 0.5, 3.0],
        beta: ndarray::array![0.0, -0.0, 1.0, -1.0],
        eps: 1e-5,
    };
    let reference = allocating(&a, &p.gamma.view(), &p.beta.view(), p.eps);
    let all = layouts(&a);
    check_layouts("2-D", &all.d2, &p, &reference).unwrap();
    check_layouts("3-D", &all.d3, &p, &reference).unwrap();
    check_layouts("IxDyn", &all.dyn_, &p, &reference).unwrap();
}

/// Arrays taller than the row walk's gathered blocks (32 - 64 rows) and its
/// groups of rows per kernel call, which the proptests above, with at most
/// 6 rows, never reach: several whole blocks and groups, and a partial one
/// at the end.
#[test]
fn tall_arrays_agree_across_layouts() {
    fn check<A: TestFloat>(rows: usize, d: usize) {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ (rows * 131 + d) as u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let a = Array2::from_shape_fn((rows, d), |_| A::from_wide(3.0 + next()));
        let p = Operands {
            gamma: Array1::from_shape_fn(d, |j| A::from_wide(1.0 + j as f64 / 8.0)),
            beta: Array1::from_shape_fn(d, |j| A::from_wide(j as f64 / 16.0 - 1.0)),
            eps: A::from_wide(1e-5),
        };
        layout_invariance(&a, &p).unwrap();
    }
    // 70 rows of 2100: Fortran-order blocks of 64 rows over 512 KiB, which
    // take the transposing tile only where it moves squares in registers.
    for (rows, d) in [(130, 16), (100, 37), (67, 70), (200, 20), (70, 2100)] {
        check::<f32>(rows, d);
        check::<f64>(rows, d);
    }
}
