//! The kernels of the half types (`half::f16`, `half::bf16`): each block of
//! rows is widened exactly to `f32` in a buffer the thread keeps, computed
//! by the `f32` kernels, and rounded back once per element. No kernel body
//! is compiled for the half types themselves.
//!
//! The `f32` result is within an `f32` ulp of the exactly rounded value, so
//! its rounding to the half type is the correctly rounded half value or a
//! neighbour. Blocks are cut by row count alone (the same for every layout
//! and thread count), so the bits do not depend on either.

use std::cell::Cell;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::backward::{Inputs, Partials, RowCentring, RowScaling, Saved};
use super::{Affine, Io, Isa, Kernels, Params, RowStats};

/// Elements per widened block: rows are widened this many at a time (at
/// least one row), so that the `f32` copies stay in the L1 or L2 cache.
const BLOCK_ELEMS: usize = 4096;

thread_local! {
    static KEPT: Cell<[Vec<f32>; 3]> = const { Cell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// Runs `f` with three `f32` buffers the thread keeps between calls.
fn with_buffers<R>(f: impl FnOnce(&mut [Vec<f32>; 3]) -> R) -> R {
    // Taken out while `f` runs: a nested call gets buffers of its own.
    let mut buffers = KEPT.try_with(Cell::take).unwrap_or_default();
    let result = f(&mut buffers);
    let _ = KEPT.try_with(|kept| kept.set(buffers));
    result
}

/// Rows per widened block for rows of `d` elements.
fn block_rows(d: usize) -> usize {
    (BLOCK_ELEMS / d.max(1)).max(1)
}

/// Exact widening and correctly rounded narrowing of a half type's slices.
trait Half: Copy + Default + 'static
where
    [Self]: HalfFloatSliceExt,
{
    fn widen_into(src: &[Self], dst: &mut Vec<f32>) {
        dst.clear();
        dst.resize(src.len(), 0.0);
        src.convert_to_f32_slice(dst);
    }
    fn narrow_from(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
}

impl Half for f16 {}
impl Half for bf16 {}

/// Applies `kernel` to the rows of `io` (rows of `d` elements) through
/// widened blocks: `kernel(block, rows)` normalises `rows` rows of `block`
/// in place.
fn map_widened<H: Half>(mut io: Io<'_, H>, d: usize, kernel: impl Fn(&mut [f32], usize))
where
    [H]: HalfFloatSliceExt,
{
    let step = block_rows(d) * d;
    with_buffers(|[wide, ..]| {
        let total = io.input().len();
        let mut at = 0;
        while at < total {
            let end = (at + step).min(total);
            H::widen_into(&io.input()[at..end], wide);
            kernel(wide, (end - at) / d);
            H::narrow_from(wide, &mut io.output()[at..end]);
            at = end;
        }
    });
}

macro_rules! half_kernels {
    ($($half:ty),*) => {$(
        #[allow(private_interfaces)]
        impl Kernels for $half {
            type Compute = f32;

            fn layer_norm_rows(
                isa: Isa,
                io: Io<'_, Self>,
                rows: usize,
                params: Params<'_, f32>,
                eps: f64,
            ) {
                let d = io.input().len() / rows.max(1);
                map_widened(io, d, |block, rows| {
                    f32::layer_norm_rows(isa, Io::InPlace(block), rows, params, eps)
                });
            }

            fn rms_norm_rows(
                isa: Isa,
                io: Io<'_, Self>,
                rows: usize,
                params: Params<'_, f32>,
                eps: f64,
            ) {
                let d = io.input().len() / rows.max(1);
                map_widened(io, d, |block, rows| {
                    f32::rms_norm_rows(isa, Io::InPlace(block), rows, params, eps)
                });
            }

            fn row_stats(isa: Isa, x: &[Self]) -> RowStats {
                with_buffers(|[wide, ..]| {
                    <$half>::widen_into(x, wide);
                    f32::row_stats(isa, wide)
                })
            }

            fn transpose_lines(
                _isa: Isa,
                src: &[Self],
                src_lead: usize,
                dst: &mut [Self],
                dst_lead: usize,
                lines: usize,
                length: usize,
            ) {
                for i in 0..lines {
                    for j in 0..length {
                        dst[j * dst_lead + i] = src[i * src_lead + j];
                    }
                }
            }

            fn layer_norm_train_block(
                isa: Isa,
                x: &[Self],
                y: &mut [Self],
                d: usize,
                affine: Affine<'_, f32>,
                eps: f64,
                stats: &mut [RowCentring],
            ) {
                train_widened(x, y, d, stats, |x, y, stats| {
                    f32::layer_norm_train_block(isa, x, y, d, affine, eps, stats)
                });
            }

            fn rms_norm_train_block(
                isa: Isa,
                x: &[Self],
                y: &mut [Self],
                d: usize,
                affine: Affine<'_, f32>,
                eps: f64,
                stats: &mut [RowScaling],
            ) {
                train_widened(x, y, d, stats, |x, y, stats| {
                    f32::rms_norm_train_block(isa, x, y, d, affine, eps, stats)
                });
            }

            fn layer_norm_backward_block(
                isa: Isa,
                inputs: Inputs<'_, Self>,
                dx: &mut [Self],
                saved: Saved<'_, RowCentring>,
                partials: &mut Partials,
            ) {
                backward_widened(inputs, dx, saved, partials, |inputs, dx, saved, partials| {
                    f32::layer_norm_backward_block(isa, inputs, dx, saved, partials)
                });
            }

            fn rms_norm_backward_block(
                isa: Isa,
                inputs: Inputs<'_, Self>,
                dx: &mut [Self],
                saved: Saved<'_, RowScaling>,
                partials: &mut Partials,
            ) {
                backward_widened(inputs, dx, saved, partials, |inputs, dx, saved, partials| {
                    f32::rms_norm_backward_block(isa, inputs, dx, saved, partials)
                });
            }
        }
    )*};
}

half_kernels!(f16, bf16);

/// A training block through widened blocks of rows: `kernel(x, y, stats)`
/// normalises the widened rows `x` into `y`, saving one entry per row.
fn train_widened<H: Half, T>(
    x: &[H],
    y: &mut [H],
    d: usize,
    stats: &mut [T],
    kernel: impl Fn(&[f32], &mut [f32], &mut [T]),
) where
    [H]: HalfFloatSliceExt,
{
    let rows = block_rows(d);
    with_buffers(|[wide_x, wide_y, _]| {
        let pieces = x.chunks(rows * d).zip(y.chunks_mut(rows * d));
        for ((x, y), stats) in pieces.zip(stats.chunks_mut(rows)) {
            H::widen_into(x, wide_x);
            wide_y.clear();
            wide_y.resize(x.len(), 0.0);
            kernel(wide_x, wide_y, stats);
            H::narrow_from(wide_y, y);
        }
    });
}

/// A backward block through widened blocks of rows, whose partials are
/// added in row order as the `f32` kernel adds them.
fn backward_widened<H: Half, T>(
    inputs: Inputs<'_, H>,
    dx: &mut [H],
    saved: Saved<'_, T>,
    partials: &mut Partials,
    kernel: impl Fn(Inputs<'_, f32>, &mut [f32], Saved<'_, T>, &mut Partials),
) where
    [H]: HalfFloatSliceExt,
{
    let d = inputs.d;
    let rows = block_rows(d);
    with_buffers(|[wide_x, wide_dy, wide_dx]| {
        let pieces = inputs.x.chunks(rows * d).zip(inputs.dy.chunks(rows * d));
        for (block, ((x, dy), dx)) in pieces.zip(dx.chunks_mut(rows * d)).enumerate() {
            H::widen_into(x, wide_x);
            H::widen_into(dy, wide_dy);
            wide_dx.clear();
            wide_dx.resize(x.len(), 0.0);
            let saved = match saved {
                Saved::Compute(eps) => Saved::Compute(eps),
                Saved::Rows(all) => Saved::Rows(all.get(block * rows..).unwrap_or_default()),
            };
            let widened = Inputs {
                x: wide_x,
                dy: wide_dy,
                d,
                gain: inputs.gain,
                prefetch: false,
                stream: false,
            };
            kernel(widened, wide_dx, saved, partials);
            H::narrow_from(wide_dx, dx);
        }
    });
}
