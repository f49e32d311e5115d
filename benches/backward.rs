//! LayerNorm and RMSNorm backward against the memory traffic they cannot
//! avoid: read `x` and `dy`, write `dx`.
//!
//! `cargo bench --bench backward`. Each group reports bytes per second over
//! those `3 · n · size_of::<A>()` bytes, for
//! - `copy`: `dx = x + dy` into a buffer allocated once, the floor of the
//!   `_into` forms, which write into a caller's buffer. Its plain stores
//!   read each line of `dx` before writing it, while the `_into` forms
//!   write a `dx` of 8 MiB or more, in rows of 2 KiB or more (d = 768 and
//!   4096 here), with non-temporal stores that do not: there the ratios
//!   flatter the backward passes by up to 4/3;
//! - `alloc_copy`: the same into a fresh `Array::zeros`, the floor of the
//!   allocating forms, which return `dx` in a new array;
//! - `layer_norm_backward` (statistics recomputed), its `_into` form, and
//!   `layer_norm_backward_with_stats(_into)` (statistics saved by the
//!   forward pass);
//! - `rms_norm_backward` and its `_into` form.
//!
//! With the `rayon` feature the backward passes split large calls over
//! rayon's global pool (set `RAYON_NUM_THREADS` to change it), and so do
//! both copies whenever the pool has more than one thread: each op is
//! compared with a copy on as many threads.
//!
//! Each array holds 256 MiB (2²⁶ elements in f32, 2²⁵ in f64), in rows of
//! d ∈ {64, 768, 4096}: out of cache, as in the `out` section of
//! `examples/throughput.rs`. (Arrays of 16 MiB would sit in the last-level
//! cache of many servers, and measure that cache instead of memory.) The
//! ratios to the copies are what to compare: on a shared machine the
//! absolute figures move with the load, the ratios much less.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ndarray::{Array1, Array2};
use ndarray_layernorm::prelude::*;

/// Bytes per array.
const ARRAY_BYTES: usize = 256 << 20;

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

/// Elements per task of the split copy.
#[cfg(feature = "rayon")]
const COPY_CHUNK: usize = 1 << 16;

/// `out = x + dy`, element by element: reads and writes the bytes backward
/// must touch. With the `rayon` feature and more than one thread in the
/// pool, split into chunks across the pool, as the backward passes split
/// their rows: the floor of a parallel op is a parallel copy.
fn copy<A: NormScalar>(out: &mut Array2<A>, x: &Array2<A>, dy: &Array2<A>) {
    let (Some(out), Some(x), Some(dy)) = (out.as_slice_mut(), x.as_slice(), dy.as_slice()) else {
        unreachable!("standard layout")
    };
    let add = |out: &mut [A], x: &[A], dy: &[A]| {
        for ((o, &a), &b) in out.iter_mut().zip(x).zip(dy) {
            *o = a + b;
        }
    };
    #[cfg(feature = "rayon")]
    if rayon::current_num_threads() > 1 {
        use rayon::prelude::*;
        out.par_chunks_mut(COPY_CHUNK)
            .zip(x.par_chunks(COPY_CHUNK))
            .zip(dy.par_chunks(COPY_CHUNK))
            .for_each(|((out, x), dy)| add(out, x, dy));
        return;
    }
    add(out, x, dy);
}

fn group<A: NormScalar>(c: &mut Criterion, name: &str) {
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
        let rows = ARRAY_BYTES / size_of::<A>() / d;
        let x = Array2::from_shape_vec((rows, d), narrow(&values(1, rows * d)))
            .expect("rows * d elements");
        let dy = Array2::from_shape_vec((rows, d), narrow(&values(2, rows * d)))
            .expect("rows * d elements");
        let gamma = Array1::from_vec(narrow(&values(3, d)));
        let beta = Array1::zeros(d);
        let eps = A::from(1e-5).unwrap_or_else(A::zero);
        let (_, stats) = x.layer_norm_train(&gamma, &beta, eps).expect("valid");
        let (_, rms_stats) = x.rms_norm_train(&gamma, eps).expect("valid");
        group.throughput(Throughput::Bytes(
            (3 * rows * d * std::mem::size_of::<A>()) as u64,
        ));

        let mut dx = Array2::<A>::zeros((rows, d));
        group.bench_function(BenchmarkId::new("copy", d), |b| {
            b.iter(|| {
                copy(&mut dx, &x, &dy);
                black_box(&dx);
            })
        });
        group.bench_function(BenchmarkId::new("alloc_copy", d), |b| {
            b.iter(|| {
                let mut out = Array2::<A>::zeros((rows, d));
                copy(&mut out, &x, &dy);
                black_box(out)
            })
        });
        group.bench_function(BenchmarkId::new("layer_norm_backward", d), |b| {
            b.iter(|| black_box(x.layer_norm_backward(&dy, &gamma, eps).expect("valid")))
        });
        group.bench_function(BenchmarkId::new("layer_norm_backward_into", d), |b| {
            b.iter(|| {
                black_box(
                    x.layer_norm_backward_into(&mut dx, &dy, &gamma, eps)
                        .expect("valid"),
                )
            })
        });
        group.bench_function(BenchmarkId::new("layer_norm_backward_with_stats", d), |b| {
            b.iter(|| {
                black_box(
                    x.layer_norm_backward_with_stats(&dy, &gamma, &stats)
                        .expect("valid"),
                )
            })
        });
        group.bench_function(
            BenchmarkId::new("layer_norm_backward_with_stats_into", d),
            |b| {
                b.iter(|| {
                    black_box(
                        x.layer_norm_backward_with_stats_into(&mut dx, &dy, &gamma, &stats)
                            .expect("valid"),
                    )
                })
            },
        );
        group.bench_function(BenchmarkId::new("rms_norm_backward", d), |b| {
            b.iter(|| black_box(x.rms_norm_backward(&dy, &gamma, eps).expect("valid")))
        });
        group.bench_function(BenchmarkId::new("rms_norm_backward_into", d), |b| {
            b.iter(|| {
                black_box(
                    x.rms_norm_backward_into(&mut dx, &dy, &gamma, eps)
                        .expect("valid"),
                )
            })
        });
        group.bench_function(
            BenchmarkId::new("rms_norm_backward_with_stats_into", d),
            |b| {
                b.iter(|| {
                    black_box(
                        x.rms_norm_backward_with_stats_into(&mut dx, &dy, &gamma, &rms_stats)
                            .expect("valid"),
                    )
                })
            },
        );
    }
    group.finish();
}

fn backward(c: &mut Criterion) {
    group::<f32>(c, "f32");
    group::<f64>(c, "f64");
}

criterion_group!(benches, backward);
criterion_main!(benches);
