//! Throughput of the forms over several trailing axes (`_over`) against the
//! last-axis form on the same elements, for several memory layouts:
//!
//! ```text
//! cargo run --release --example over_throughput
//! ```
//!
//! ```text
//! cargo run --release --example over_throughput forward   # one form
//! ```
//!
//! Each case normalises an `(n, …)` `f32` array over the axes from
//! `Axis(1)` on, into a preallocated output in standard layout
//! (`layer_norm_into_over`; `backward`: `layer_norm_backward_into_over`,
//! `dy` in the layout of `x`), and the table gives its time against the
//! last-axis form (`layer_norm_into`, `layer_norm_backward_into`) on the
//! same values as standard-layout `(n, d)` arrays (`vs last axis`, above 1
//! is slower), timed in alternation with it, best of several repetitions.
//! `GB/s` counts each array read or written once. The layouts:
//!
//! - `C`: standard layout, which reaches the last-axis walk unchanged;
//! - `F`: Fortran order, whose rows are gathered a block at a time;
//! - `permuted`: stored with the normalised axes in reverse order (each row
//!   in one block of memory, no axis in logical order);
//! - `sliced`: every other index of the first normalised axis of an array
//!   twice as long (each lane of the last axis contiguous).
//!
//! For Fortran order, `last axis F` gives the time of `layer_norm_into` on
//! the `(n, d)` array in Fortran order against the same baseline: what the
//! layout costs the last-axis form.
//!
//! `in cache` arrays hold 256 KiB, `out of cache` ones 128 MiB; `threads`
//! is 1 or all cores (`rayon::ThreadPool::install`).

use std::time::Instant;

use ndarray::{Array2, ArrayD, ArrayViewD, Axis, Dimension, IxDyn, ShapeBuilder, Slice};
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

/// The forms measured.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// `layer_norm_into_over` against `layer_norm_into`.
    Forward,
    /// `layer_norm_backward_into_over` against `layer_norm_backward_into`,
    /// with `dy` in the layout of `x`.
    Backward,
}

fn main() -> Result<(), NormError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let forms: Vec<Form> = [("forward", Form::Forward), ("backward", Form::Backward)]
        .into_iter()
        .filter(|(name, _)| args.is_empty() || args.iter().any(|a| a == name))
        .map(|(_, form)| form)
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{:<9} {:<13} {:<18} {:<9} {:>7} {:>7} {:>13} {:>12}",
        "form", "where", "shape", "layout", "threads", "GB/s", "vs last axis", "last axis F"
    );
    for form in forms {
        for (place, bytes, reps) in [("in cache", 256 << 10, 200), ("out of cache", 128 << 20, 4)] {
            for trailing in [&[12, 64][..], &[4, 4, 4], &[32, 16, 16]] {
                measure(form, place, bytes, reps, trailing, cores)?;
            }
        }
    }
    Ok(())
}

/// Measures `form` on arrays of about `bytes` whose rows have the shape
/// `trailing`, in every layout, on one thread and on `cores`.
fn measure(
    form: Form,
    place: &str,
    bytes: usize,
    reps: usize,
    trailing: &[usize],
    cores: usize,
) -> Result<(), NormError> {
    let d: usize = trailing.iter().product();
    let n = (bytes / 4 / d).max(1);
    let shape: Vec<usize> = std::iter::once(n).chain(trailing.iter().copied()).collect();
    let x = ArrayD::from_shape_fn(IxDyn(&shape), |i| {
        (i.slice().iter().sum::<usize>() % 13) as f32 * 0.25 - 1.0
    });
    let dy = x.mapv(|v| 0.5 - v * v);
    let gamma = ArrayD::from_elem(IxDyn(trailing), 1.5_f32);
    let beta = ArrayD::from_elem(IxDyn(trailing), 0.25_f32);
    let rows = |a: &ArrayD<f32>| {
        Array2::from_shape_vec((n, d), a.iter().copied().collect()).expect("n · d values")
    };
    let (flat, flat_dy) = (rows(&x), rows(&dy));
    let (g1, b1) = (gamma.flatten(), beta.flatten());
    let mut out = ArrayD::zeros(IxDyn(&shape));
    let mut flat_out = Array2::zeros((n, d));
    let arrays = if form == Form::Forward { 2 } else { 3 };
    for layout in [Layout::C, Layout::F, Layout::Permuted, Layout::Sliced] {
        let (store, dy_store) = (layout.store(&x), layout.store(&dy));
        let (xv, dyv) = (layout.view(&store), layout.view(&dy_store));
        let over = |out: &mut ArrayD<f32>| match form {
            Form::Forward => xv.layer_norm_into_over(Axis(1), out, &gamma, &beta, 1e-5),
            Form::Backward => xv
                .layer_norm_backward_into_over(Axis(1), out, &dyv, &gamma, 1e-5)
                .map(drop),
        };
        let last = |x: &Array2<f32>, dy: &Array2<f32>, out: &mut Array2<f32>| match form {
            Form::Forward => x.layer_norm_into(out, &g1, &b1, 1e-5),
            Form::Backward => x.layer_norm_backward_into(out, dy, &g1, 1e-5).map(drop),
        };
        // The last-axis form on the same layout, where it has one.
        let in_fortran = |a: &Array2<f32>| {
            let mut f = Array2::zeros((n, d).f());
            f.assign(a);
            f
        };
        let fortran =
            (matches!(layout, Layout::F)).then(|| (in_fortran(&flat), in_fortran(&flat_dy)));
        for threads in [1, cores] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            let (mut over_s, mut last_s, mut fortran_s) =
                (f64::INFINITY, f64::INFINITY, f64::INFINITY);
            pool.install(|| -> Result<(), NormError> {
                // Alternate them, so that all see the same machine.
                for _ in 0..3 {
                    over_s = over_s.min(best(reps, || over(&mut out).expect("valid arguments")));
                    last_s = last_s.min(best(reps, || {
                        last(&flat, &flat_dy, &mut flat_out).expect("valid arguments")
                    }));
                    if let Some((fx, fdy)) = &fortran {
                        fortran_s = fortran_s.min(best(reps, || {
                            last(fx, fdy, &mut flat_out).expect("valid arguments")
                        }));
                    }
                }
                Ok(())
            })?;
            over(&mut out)?;
            last(&flat, &flat_dy, &mut flat_out)?;
            assert_eq!(out.as_slice(), flat_out.as_slice(), "the same bits");
            println!(
                "{:<9} {:<13} {:<18} {:<9} {:>7} {:>7.2} {:>13.2} {:>12}",
                if form == Form::Forward {
                    "forward"
                } else {
                    "backward"
                },
                place,
                format!("{shape:?}"),
                layout.name(),
                threads,
                (arrays * n * d * 4) as f64 / over_s / 1e9,
                over_s / last_s,
                if fortran.is_some() {
                    format!("{:.2}", fortran_s / last_s)
                } else {
                    "-".into()
                },
            );
        }
    }
    Ok(())
}
