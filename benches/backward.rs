//! LayerNorm and RMSNorm backward against the memory traffic they cannot
//! avoid: read `x` and `dy`, write `dx`.
//!
//! `cargo bench --bench backward`. Each group reports bytes per second over
//! those `3 · n · size_of::<A>()` bytes, for
//! - `copy`: `dx = x + dy` into a buffer allocated once (the bandwidth floor),
//! - `copy_alloc`: the same into a freshly allocated array, as the
//!   gradients are returned,
//! - `layer_norm_backward` (statistics recomputed),
//! - `layer_norm_backward_with_stats` (statistics from the forward pass),
//! - `rms_norm_backward`.
//!
//! The arrays hold 2²² elements (16 MiB per array in f32), well beyond the
//! L2 cache, in rows of d ∈ {64, 768, 4096}.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ndarray::{Array1, Array2, Zip};
use ndarray_layernorm::prelude::*;

const ELEMENTS: usize = 1 << 22;

fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64) / ((1u64 << 52) as f64) - 1.0
        })
        .collect()
}

fn group<A: NormScalar + std::ops::Add<Output = A>>(c: &mut Criterion, name: &str) {
    let mut group = c.benchmark_group(format!("backward_{name}"));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let narrow = |v: &[f64]| {
        v.iter()
            .map(|&v| A::from(v).unwrap_or_else(A::zero))
            .collect()
    };
    for d in [64, 768, 4096] {
        let rows = ELEMENTS / d;
        let x = Array2::from_shape_vec((rows, d), narrow(&values(1, rows * d)))
            .expect("rows * d elements");
        let dy = Array2::from_shape_vec((rows, d), narrow(&values(2, rows * d)))
            .expect("rows * d elements");
        let gamma = Array1::from_vec(narrow(&values(3, d)));
        let beta = Array1::zeros(d);
        let eps = A::from(1e-5).unwrap_or_else(A::zero);
        let (_, stats) = x.layer_norm_train(&gamma, &beta, eps).expect("valid");
        group.throughput(Throughput::Bytes(
            (3 * rows * d * std::mem::size_of::<A>()) as u64,
        ));

        let mut dx = Array2::<A>::zeros((rows, d));
        group.bench_function(BenchmarkId::new("copy", d), |b| {
            b.iter(|| {
                Zip::from(&mut dx)
                    .and(&x)
                    .and(&dy)
                    .for_each(|o, &a, &b| *o = a + b);
                black_box(&dx);
            })
        });
        group.bench_function(BenchmarkId::new("copy_alloc", d), |b| {
            b.iter(|| black_box(Zip::from(&x).and(&dy).map_collect(|&a, &b| a + b)))
        });
        group.bench_function(BenchmarkId::new("layer_norm_backward", d), |b| {
            b.iter(|| black_box(x.layer_norm_backward(&dy, &gamma, eps).expect("valid")))
        });
        group.bench_function(BenchmarkId::new("layer_norm_backward_with_stats", d), |b| {
            b.iter(|| {
                black_box(
                    x.layer_norm_backward_with_stats(&dy, &gamma, &stats)
                        .expect("valid"),
                )
            })
        });
        group.bench_function(BenchmarkId::new("rms_norm_backward", d), |b| {
            b.iter(|| black_box(x.rms_norm_backward(&dy, &gamma, eps).expect("valid")))
        });
    }
    group.finish();
}

fn backward(c: &mut Criterion) {
    group::<f32>(c, "f32");
    group::<f64>(c, "f64");
}

criterion_group!(benches, backward);
criterion_main!(benches);
