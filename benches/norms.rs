//! Criterion benchmarks: LayerNorm, RMSNorm and `stats` in every form,
//! against a plain copy of the same bytes and a naive ndarray version.
//!
//! ```text
//! cargo bench --bench norms                       # everything (a few minutes)
//! cargo bench --bench norms -- 'layer_norm/into'  # a filter
//! ```
//!
//! Each group is one operation. Inside it, each benchmark id is
//! `form/dtype/layout/d`: the forms are `into` (`_into` a preallocated
//! output), `inplace` (each call on a fresh copy of the input, made outside
//! the timing), `alloc` (the allocating form), the baseline `copy`
//! (`copy_from_slice` of the same bytes into a preallocated buffer, split
//! over the pool as the operations are) and
//! `naive` (`mean_axis` / `var_axis` / broadcasting). Every input holds
//! about 4 MiB; the layouts are `c` (contiguous), `step2` (`s![.., ..;2]`
//! of a twice-as-wide array), `rowstep2` (`s![..;2, ..]` of a twice-as-tall
//! array: rows contiguous, with gaps) and `f` (Fortran order). Throughput
//! counts the input read once and the output written once. The operations
//! run on rayon's global pool (set `RAYON_NUM_THREADS` to change it).

use std::hint::black_box;
use std::time::Duration;

use criterion::{
    criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use ndarray::{s, Array1, Array2, ArrayView2, ArrayViewMut2, ShapeBuilder};
use ndarray_layernorm::prelude::*;

/// Bytes of input per benchmark.
const INPUT_BYTES: usize = 4 << 20;

/// Elements per task of the parallel copy.
#[cfg(feature = "rayon")]
const COPY_CHUNK: usize = 1 << 16;

/// `dst = src`. With the `rayon` feature and more than one thread in the
/// pool, split into chunks across the pool, as the operations split their
/// rows: the floor of a parallel operation is a parallel copy.
fn copy<A: Copy + Send + Sync>(dst: &mut [A], src: &[A]) {
    #[cfg(feature = "rayon")]
    if rayon::current_num_threads() > 1 {
        use rayon::prelude::*;
        dst.par_chunks_mut(COPY_CHUNK)
            .zip(src.par_chunks(COPY_CHUNK))
            .for_each(|(dst, src)| dst.copy_from_slice(src));
        return;
    }
    dst.copy_from_slice(src);
}

/// Row lengths: a tiny one and the usual model widths.
const DS: [usize; 4] = [4, 64, 768, 4096];

#[path = "common/naive.rs"]
mod naive;
use naive::{naive_layer_norm, naive_rms_norm, naive_stats, Elem, EPS};

#[derive(Clone, Copy, PartialEq)]
enum Op {
    LayerNorm,
    RmsNorm,
    Stats,
}

#[derive(Clone, Copy)]
enum Layout {
    C,
    Step2,
    RowStep2,
    Fortran,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::C => "c",
            Layout::Step2 => "step2",
            Layout::RowStep2 => "rowstep2",
            Layout::Fortran => "f",
        }
    }

    /// Storage for a `rows × d` array in this layout.
    fn storage<A: Elem>(self, rows: usize, d: usize) -> Array2<A> {
        let value = |(i, j): (usize, usize)| A::narrow(((i * 31 + j * 17) % 97) as f64 / 8.0);
        match self {
            Layout::C => Array2::from_shape_fn((rows, d), value),
            Layout::Step2 => Array2::from_shape_fn((rows, 2 * d), value),
            Layout::RowStep2 => Array2::from_shape_fn((2 * rows, d), value),
            Layout::Fortran => Array2::from_shape_fn((rows, d).f(), value),
        }
    }

    fn view<A>(self, storage: &Array2<A>) -> ArrayView2<'_, A> {
        match self {
            Layout::Step2 => storage.slice(s![.., ..;2]),
            Layout::RowStep2 => storage.slice(s![..;2, ..]),
            _ => storage.view(),
        }
    }

    fn view_mut<A>(self, storage: &mut Array2<A>) -> ArrayViewMut2<'_, A> {
        match self {
            Layout::Step2 => storage.slice_mut(s![.., ..;2]),
            Layout::RowStep2 => storage.slice_mut(s![..;2, ..]),
            _ => storage.view_mut(),
        }
    }
}

fn bench_op<A: Elem>(c: &mut Criterion, op: Op) {
    let name = match op {
        Op::LayerNorm => "layer_norm",
        Op::RmsNorm => "rms_norm",
        Op::Stats => "stats",
    };
    let mut group = c.benchmark_group(name);
    group.sampling_mode(SamplingMode::Flat);
    let size = std::mem::size_of::<A>();
    for d in DS {
        let rows = INPUT_BYTES / size / d;
        let len = rows * d;
        let gamma = Array1::from_shape_fn(d, |i| A::narrow(1.0 + (i % 3) as f64 / 4.0));
        let beta = Array1::from_shape_fn(d, |i| A::narrow((i % 5) as f64 / 8.0));
        let eps = A::narrow(EPS);
        let src = vec![A::narrow(0.5); len];
        let mut dst = vec![A::zero(); len];
        let mut out = Array2::<A>::zeros((rows, d));
        for layout in [Layout::C, Layout::Step2, Layout::RowStep2, Layout::Fortran] {
            let storage = layout.storage::<A>(rows, d);
            let x = layout.view(&storage);
            let id =
                |form: &str| BenchmarkId::new(form, format!("{}/{}/{d}", A::NAME, layout.name()));
            // The copy moves `x` once each way; so do the norms, while
            // `stats` reads `x` and writes two values per row.
            let copy_bytes = 2 * len * size;
            let op_bytes = match op {
                Op::Stats => (len + 2 * rows) * size,
                _ => copy_bytes,
            };
            group.throughput(Throughput::Bytes(copy_bytes as u64));
            group.bench_function(id("copy"), |b| b.iter(|| copy(&mut dst, black_box(&src))));
            group.throughput(Throughput::Bytes(op_bytes as u64));
            match op {
                Op::LayerNorm => {
                    group.bench_function(id("naive"), |b| {
                        b.iter(|| naive_layer_norm(black_box(x), &gamma, &beta))
                    });
                    group.bench_function(id("into"), |b| {
                        b.iter(|| x.layer_norm_into(&mut out, &gamma, &beta, eps))
                    });
                    group.bench_function(id("inplace"), |b| {
                        b.iter_batched_ref(
                            || storage.clone(),
                            |work| layout.view_mut(work).layer_norm_inplace(&gamma, &beta, eps),
                            BatchSize::LargeInput,
                        )
                    });
                    group.bench_function(id("alloc"), |b| {
                        b.iter(|| x.layer_norm(&gamma, &beta, eps))
                    });
                }
                Op::RmsNorm => {
                    group.bench_function(id("naive"), |b| {
                        b.iter(|| naive_rms_norm(black_box(x), &gamma))
                    });
                    group.bench_function(id("into"), |b| {
                        b.iter(|| x.rms_norm_into(&mut out, &gamma, eps))
                    });
                    group.bench_function(id("inplace"), |b| {
                        b.iter_batched_ref(
                            || storage.clone(),
                            |work| layout.view_mut(work).rms_norm_inplace(&gamma, eps),
                            BatchSize::LargeInput,
                        )
                    });
                    group.bench_function(id("alloc"), |b| b.iter(|| x.rms_norm(&gamma, eps)));
                }
                Op::Stats => {
                    group.bench_function(id("naive"), |b| b.iter(|| naive_stats(black_box(x))));
                    group.bench_function(id("stats"), |b| b.iter(|| black_box(x).stats()));
                }
            }
        }
    }
    group.finish();
}

fn layer_norm(c: &mut Criterion) {
    bench_op::<f32>(c, Op::LayerNorm);
    bench_op::<f64>(c, Op::LayerNorm);
}

fn rms_norm(c: &mut Criterion) {
    bench_op::<f32>(c, Op::RmsNorm);
    bench_op::<f64>(c, Op::RmsNorm);
}

fn stats(c: &mut Criterion) {
    bench_op::<f32>(c, Op::Stats);
    bench_op::<f64>(c, Op::Stats);
}

/// Short measurements, few bootstrap resamples and no plots, so that the
/// whole file runs in a few minutes.
fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_millis(300))
        .nresamples(2000)
        .without_plots()
}

criterion_group! {
    name = benches;
    config = config();
    targets = layer_norm, rms_norm, stats
}
criterion_main!(benches);
