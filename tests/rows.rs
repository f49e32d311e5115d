//! The row walk on one thread (with or without the `rayon` feature): every
//! layout gives each row the result that row gives on its own, as a
//! contiguous one-row array, bit for bit. Shapes are small, so no call
//! leaves the calling thread, except in the last test, which checks the
//! streamed writes of large outputs.

use ndarray::{s, Array, Array1, Array2, ArrayD, ArrayView, ArrayViewMut, Dimension, IxDyn};
use ndarray::{RemoveAxis, ShapeBuilder};
use ndarray_layernorm::prelude::*;

fn values<D: Dimension>(shape: D) -> Array<f64, D> {
    let mut state = 0x853c_49e6_748f_ea9bu64;
    Array::from_shape_simple_fn(shape, || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 3.0
    })
}

fn bits<'a>(values: impl IntoIterator<Item = &'a f64>) -> Vec<u64> {
    values.into_iter().map(|v| v.to_bits()).collect()
}

/// LayerNorm, RMSNorm and stats of `x`, each in logical order.
fn outputs<D: RemoveAxis>(x: ArrayView<'_, f64, D>) -> [Vec<u64>; 4] {
    let d = x.shape().last().copied().unwrap();
    let gamma = Array1::from_shape_fn(d, |i| 1.0 + i as f64 / 8.0);
    let beta = Array1::from_shape_fn(d, |i| i as f64 / 4.0 - 0.5);
    let (mean, rms) = x.stats().unwrap();
    [
        bits(&x.layer_norm(&gamma, &beta, 1e-5).unwrap()),
        bits(&x.rms_norm_plain(1e-6).unwrap()),
        bits(&mean),
        bits(&rms),
    ]
}

/// The same, one row at a time.
fn per_row<D: RemoveAxis>(x: ArrayView<'_, f64, D>) -> [Vec<u64>; 4] {
    let mut all: [Vec<u64>; 4] = Default::default();
    for row in x.rows() {
        let row: Array1<f64> = row.to_owned();
        for (all, one) in all.iter_mut().zip(outputs(row.view())) {
            all.extend(one);
        }
    }
    all
}

/// The `_into` and `_inplace` forms written through `target`, a view of
/// another layout, read back in logical order.
fn written<D: RemoveAxis>(
    x: ArrayView<'_, f64, D>,
    mut target: ArrayViewMut<'_, f64, D>,
) -> [Vec<u64>; 2] {
    x.layer_norm_plain_into(&mut target, 1e-5).unwrap();
    let into = bits(&target);
    target.assign(&x);
    target.rms_norm_plain_inplace(1e-6).unwrap();
    [into, bits(&target)]
}

fn check_2d(rows: usize, d: usize) {
    let a: Array2<f64> = values(ndarray::Ix2(rows, d));
    let expected = per_row(a.view());
    let fortran = {
        let mut f = Array2::zeros((rows, d).f());
        f.assign(&a);
        f
    };
    let mut wide = Array2::from_elem((rows, 2 * d), 7.0);
    wide.slice_mut(s![.., ..;2]).assign(&a);
    let mut wide_f = Array2::from_elem((rows, 2 * d).f(), 7.0);
    wide_f.slice_mut(s![.., ..;2]).assign(&a);
    let mut reversed = a.clone();
    reversed.slice_mut(s![..;-1, ..;-1]).assign(&a);

    let views = [
        ("C", a.view()),
        ("Fortran", fortran.view()),
        ("step", wide.slice(s![.., ..;2])),
        ("Fortran step", wide_f.slice(s![.., ..;2])),
        ("reversed", reversed.slice(s![..;-1, ..;-1])),
    ];
    for (name, view) in &views {
        assert!(outputs(view.view()) == expected, "{name}, {rows} x {d}");
    }

    // Every input layout written into every output layout.
    let plain = {
        let (mut ln, mut rms) = (Vec::new(), Vec::new());
        for row in a.rows() {
            ln.extend(bits(&row.layer_norm_plain(1e-5).unwrap()));
            rms.extend(bits(&row.rms_norm_plain(1e-6).unwrap()));
        }
        [ln, rms]
    };
    for (input, view) in &views {
        let mut out_f = Array2::zeros((rows, d).f());
        let mut out_wide = Array2::from_elem((rows, 2 * d), 7.0);
        let mut out_rev = Array2::zeros((rows, d));
        let targets = [
            ("Fortran", out_f.view_mut()),
            ("step", out_wide.slice_mut(s![.., ..;2])),
            ("reversed", out_rev.slice_mut(s![..;-1, ..;-1])),
        ];
        for (output, target) in targets {
            assert!(
                written(view.view(), target) == plain,
                "{input} into {output}, {rows} x {d}"
            );
        }
        assert!(
            out_wide.slice(s![.., 1..;2]).iter().all(|&v| v == 7.0),
            "{input}: gaps written"
        );
    }

    // A broadcast input: every row the first one.
    let first = a.row(0);
    let broadcast = first.broadcast((rows, d)).unwrap();
    assert!(
        outputs(broadcast) == per_row(broadcast),
        "broadcast, {rows} x {d}"
    );
}

#[test]
fn two_dimensional_layouts() {
    for (rows, d) in [(1, 1), (3, 1), (1, 9), (7, 5), (33, 67), (130, 3), (65, 16)] {
        check_2d(rows, d);
    }
}

#[test]
fn one_dimensional_strided_rows() {
    let a: Array1<f64> = values(ndarray::Ix1(2 * 37));
    for view in [a.slice(s![..;2]), a.slice(s![..;-3]), a.slice(s![5..;-1])] {
        let owned = view.to_owned();
        assert!(outputs(view) == outputs(owned.view()));
    }
}

/// Five axes (an `IxDyn` shape held on the heap), every leading axis
/// permuted into memory in a different order.
#[test]
fn many_axes_permuted() {
    let shape = [3, 2, 4, 5, 6];
    let a: ArrayD<f64> = values(IxDyn(&shape));
    let expected = per_row(a.view());
    for perm in [
        [0, 1, 2, 3, 4],
        [4, 3, 2, 1, 0],
        [2, 0, 4, 1, 3],
        [1, 3, 0, 2, 4],
    ] {
        // Storage with axes in the order `perm`, viewed back in logical order.
        let stored_shape: Vec<usize> = perm.iter().map(|&k| shape[k]).collect();
        let mut storage = ArrayD::<f64>::zeros(IxDyn(&stored_shape));
        let mut inverse = [0; 5];
        for (k, &axis) in perm.iter().enumerate() {
            inverse[axis] = k;
        }
        storage.view_mut().permuted_axes(&inverse[..]).assign(&a);
        let view = storage.view().permuted_axes(&inverse[..]);
        assert_eq!(view.shape(), &shape);
        assert!(outputs(view) == expected, "storage axes {perm:?}");
    }
}

#[test]
fn empty_leading_axes_in_any_layout() {
    let fortran = Array2::<f64>::zeros((0, 4).f());
    let stepped = Array2::<f64>::zeros((0, 8));
    for view in [fortran.view(), stepped.slice(s![.., ..;2])] {
        let y = view.layer_norm_plain(1e-5).unwrap();
        assert_eq!(y.shape(), &[0, 4]);
        let (mean, rms) = view.stats().unwrap();
        assert_eq!((mean.len(), rms.len()), (0, 0));
    }
}

/// Outputs of 8 MiB and more, with rows of 2 KiB and more, are written past
/// the caches by the `_into` forms; the allocating forms write the same
/// values with plain stores. Every alignment of the output within a cache
/// line gives the same bits.
#[test]
fn large_outputs_written_past_the_caches() {
    let (rows, d) = (1040, 1030); // 8.2 MiB of f64, rows of 8 KiB
    let x = values(ndarray::Ix2(rows, d));
    let x32 = x.mapv(|v| v as f32);
    let gamma = Array1::from_shape_fn(d, |i| 1.0 + i as f64 / 8.0);
    let beta = Array1::from_shape_fn(d, |i| i as f64 / 4.0 - 0.5);
    let expected_ln = bits(&x.layer_norm(&gamma, &beta, 1e-5).unwrap());
    let expected_rms = bits(&x.rms_norm(&gamma, 1e-6).unwrap());
    let (gamma32, beta32) = (gamma.mapv(|v| v as f32), beta.mapv(|v| v as f32));
    let expected32: Vec<u32> = x32
        .layer_norm(&gamma32, &beta32, 1e-5)
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    let mut buffer = vec![0.0f64; rows * d + 8];
    let mut buffer32 = vec![0.0f32; 2 * rows * d + 16];
    for offset in [0, 1, 3, 7] {
        let mut out =
            ndarray::ArrayViewMut2::from_shape((rows, d), &mut buffer[offset..][..rows * d])
                .unwrap();
        x.layer_norm_into(&mut out, &gamma, &beta, 1e-5).unwrap();
        assert_eq!(bits(&out), expected_ln, "layer_norm_into, offset {offset}");
        x.rms_norm_into(&mut out, &gamma, 1e-6).unwrap();
        assert_eq!(bits(&out), expected_rms, "rms_norm_into, offset {offset}");
        // Strided inputs write the rows of a contiguous output the same way:
        // Fortran order gathered a block at a time, and every other row.
        let mut fortran = Array2::zeros((rows, d).f());
        fortran.assign(&x);
        fortran
            .layer_norm_into(&mut out, &gamma, &beta, 1e-5)
            .unwrap();
        assert_eq!(bits(&out), expected_ln, "Fortran order, offset {offset}");
        let mut spaced = Array2::from_elem((2 * rows, d), 7.0);
        spaced.slice_mut(s![..;2, ..]).assign(&x);
        spaced
            .slice(s![..;2, ..])
            .layer_norm_into(&mut out, &gamma, &beta, 1e-5)
            .unwrap();
        assert_eq!(bits(&out), expected_ln, "every other row, offset {offset}");
        // f32: twice the rows, so that the output is still 8 MiB.
        let x32 = ndarray::concatenate![ndarray::Axis(0), x32, x32];
        let storage = &mut buffer32[2 * offset..][..2 * rows * d];
        let mut out32 = ndarray::ArrayViewMut2::from_shape((2 * rows, d), storage).unwrap();
        x32.layer_norm_into(&mut out32, &gamma32, &beta32, 1e-5)
            .unwrap();
        let got: Vec<u32> = out32.iter().map(|v| v.to_bits()).collect();
        assert_eq!(
            got[..rows * d],
            expected32[..],
            "f32 layer_norm_into, offset {offset}"
        );
        assert_eq!(
            got[rows * d..],
            expected32[..],
            "f32 second half, offset {offset}"
        );
    }
}
