//! The naive ndarray normalisations a user would write (`mean_axis`,
//! `var_axis`, broadcasting): the baseline of the criterion benches and of
//! `examples/throughput.rs`, which include this file.

use ndarray::{Array1, Array2, ArrayView2, Axis, ScalarOperand};
use ndarray_layernorm::prelude::*;
use num_traits::FromPrimitive;

/// The `eps` every benchmark uses.
pub const EPS: f64 = 1e-5;

/// An element type with what the naive version needs.
pub trait Elem: NormScalar + FromPrimitive + ScalarOperand + Default {
    /// The name printed in tables and benchmark ids.
    const NAME: &'static str;
}

impl Elem for f32 {
    const NAME: &'static str = "f32";
}

impl Elem for f64 {
    const NAME: &'static str = "f64";
}

/// The naive ndarray LayerNorm.
pub fn naive_layer_norm<A: Elem>(
    x: ArrayView2<'_, A>,
    gamma: &Array1<A>,
    beta: &Array1<A>,
) -> Array2<A> {
    let eps = A::narrow(EPS);
    let mean = x
        .mean_axis(Axis(1))
        .unwrap_or_default()
        .insert_axis(Axis(1));
    let var = x.var_axis(Axis(1), A::zero()).insert_axis(Axis(1));
    (&x - &mean) / (var + eps).mapv(A::sqrt) * gamma + beta
}

/// The naive ndarray RMSNorm.
pub fn naive_rms_norm<A: Elem>(x: ArrayView2<'_, A>, gamma: &Array1<A>) -> Array2<A> {
    let eps = A::narrow(EPS);
    let ms = x.mapv(|v| v * v).mean_axis(Axis(1)).unwrap_or_default();
    &x / (ms + eps).mapv(A::sqrt).insert_axis(Axis(1)) * gamma
}

/// The naive ndarray row statistics.
pub fn naive_stats<A: Elem>(x: ArrayView2<'_, A>) -> (Array1<A>, Array1<A>) {
    let mean = x.mean_axis(Axis(1)).unwrap_or_default();
    let rms = x
        .mapv(|v| v * v)
        .mean_axis(Axis(1))
        .unwrap_or_default()
        .mapv(A::sqrt);
    (mean, rms)
}
