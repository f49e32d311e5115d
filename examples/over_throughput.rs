//! Throughput of the forms over several trailing axes (`_over`) against the
//! last-axis form on the same elements, for several memory layouts:
//!
//! ```text
//! cargo run --release --example over_throughput
//! ```
//!
//! Each case normalises an `(n, …)` `f32` array over the axes from
//! `Axis(1)` on, into a preallocated output in standard layout
//! (`layer_norm_into_over`), and the table gives its time against
//! `layer_norm_into` on the same values as a standard-layout `(n, d)`
//! array (`vs last axis`, above 1 is slower), timed in alternation with
//! it, best of several repetitions:
//!
//! - `C`: standard layout, which reaches the last-axis walk unchanged;
//! - `F`: Fortran order, whose rows are gathered a block at a time;
//! - `permuted`: stored with the normalised axes in reverse order (each row
//!   in one block of memory, no axis in logical order);
//! - `sliced`: every other index of the first normalised axis of an array
//!   twice as long (each lane of the last axis contiguous).
//!
//! `in cache` arrays hold 256 KiB, `out of cache` ones 128 MiB; `threads`
//! is 1 or all cores (`rayon::ThreadPool::install`).

use std::time::Instant;

use ndarray::{Array2, ArrayD, ArrayViewD, Axis, IxDyn, ShapeBuilder, Slice};
use ndarray_layernorm::prelude::*;

/// A layout of the input.
#[derive(Clone, Copy)]
enum Layout {
    C,
    F,
    Permuted,
    Sliced,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::C => "C",
            Layout::F => "F",
            Layout::Permuted => "permuted",
            Layout::Sliced => "sliced",
        }
    }

    /// Storage holding `x`'s values in this layout.
    fn store(self, x: &ArrayD<f32>) -> ArrayD<f32> {
        let shape = x.shape();
        match self {
            Layout::C => x.clone(),
            Layout::F => {
                let mut f = ArrayD::zeros(IxDyn(shape).f());
                f.assign(x);
                f
            }
            Layout::Permuted => {
                let order = self.order(shape.len());
                let mut p = x
                    .view()
                    .permuted_axes(order)
                    .as_standard_layout()
                    .into_owned();
                p.view_mut()
                    .permuted_axes(inverse(&self.order(shape.len())))
                    .assign(x);
                p
            }
            Layout::Sliced => {
                let mut wide_shape = shape.to_vec();
                wide_shape[1] *= 2;
                let mut wide = ArrayD::zeros(IxDyn(&wide_shape));
                wide.slice_axis_mut(Axis(1), Slice::new(0, None, 2))
                    .assign(x);
                wide
            }
        }
    }

    /// The view of `store` that holds the logical array.
    fn view(self, store: &ArrayD<f32>) -> ArrayViewD<'_, f32> {
        match self {
            Layout::C | Layout::F => store.view(),
            Layout::Permuted => store
                .view()
                .permuted_axes(inverse(&self.order(store.ndim()))),
            Layout::Sliced => store.slice_axis(Axis(1), Slice::new(0, None, 2)),
        }
    }

    /// The memory order of the axes of the permuted layout: the first axis,
    /// then the others reversed.
    fn order(self, n: usize) -> Vec<usize> {
        std::iter::once(0).chain((1..n).rev()).collect()
    }
}

fn inverse(order: &[usize]) -> Vec<usize> {
    let mut inverse = vec![0; order.len()];
    for (i, &p) in order.iter().enumerate() {
        inverse[p] = i;
    }
    inverse
}

/// The best of `reps` runs of `f`, in seconds.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> Result<(), NormError> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{:<14} {:<16} {:<9} {:>7} {:>8} {:>16}",
        "where", "shape", "layout", "threads", "GB/s", "vs last axis"
    );
    for (place, bytes, reps) in [("in cache", 256 << 10, 200), ("out of cache", 128 << 20, 4)] {
        for trailing in [&[12, 64][..], &[4, 4, 4], &[32, 16, 16]] {
            let d: usize = trailing.iter().product();
            let n = (bytes / 4 / d).max(1);
            let shape: Vec<usize> = std::iter::once(n).chain(trailing.iter().copied()).collect();
            let x = ArrayD::from_shape_fn(IxDyn(&shape), |i| {
                (i.slice().iter().sum::<usize>() % 13) as f32 * 0.25 - 1.0
            });
            let gamma = ArrayD::from_elem(IxDyn(trailing), 1.5_f32);
            let beta = ArrayD::from_elem(IxDyn(trailing), 0.25_f32);
            let flat = Array2::from_shape_vec((n, d), x.iter().copied().collect()).expect("n · d");
            let (g1, b1) = (gamma.flatten(), beta.flatten());
            let mut out = ArrayD::zeros(IxDyn(&shape));
            let mut flat_out = Array2::zeros((n, d));
            for layout in [Layout::C, Layout::F, Layout::Permuted, Layout::Sliced] {
                let store = layout.store(&x);
                let xv = layout.view(&store);
                for threads in [1, cores] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .expect("a thread pool");
                    let (mut over, mut last) = (f64::INFINITY, f64::INFINITY);
                    pool.install(|| -> Result<(), NormError> {
                        // Alternate the two, so that both see the same machine.
                        for _ in 0..3 {
                            over = over.min(best(reps, || {
                                xv.layer_norm_into_over(Axis(1), &mut out, &gamma, &beta, 1e-5)
                                    .expect("valid arguments");
                            }));
                            last = last.min(best(reps, || {
                                flat.layer_norm_into(&mut flat_out, &g1, &b1, 1e-5)
                                    .expect("valid arguments");
                            }));
                        }
                        Ok(())
                    })?;
                    assert_eq!(out.as_slice(), flat_out.as_slice(), "the same bits");
                    println!(
                        "{:<14} {:<16} {:<9} {:>7} {:>8.2} {:>16.2}",
                        place,
                        format!("{shape:?}"),
                        layout.name(),
                        threads,
                        (2 * n * d * 4) as f64 / over / 1e9,
                        over / last,
                    );
                }
            }
        }
    }
    Ok(())
}
