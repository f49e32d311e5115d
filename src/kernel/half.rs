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
use super::simd::transpose_elements;
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
    // A buffer grown for very long rows is freed rather than kept.
    for buffer in &mut buffers {
        if buffer.capacity() > KEPT_MAX {
            *buffer = Vec::new();
        }
    }
    let _ = KEPT.try_with(|kept| kept.set(buffers));
    result
}

/// The largest buffer a thread keeps after a call, in elements (256 KiB).
const KEPT_MAX: usize = 1 << 16;

/// The first `len` elements of `buffer`, grown to hold them but never
/// cleared: every caller overwrites them.
fn room(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    &mut buffer[..len]
}

/// Rows per widened block for rows of `d` elements.
fn block_rows(d: usize) -> usize {
    (BLOCK_ELEMS / d.max(1)).max(1)
}

/// Exact widening and correctly rounded narrowing of a half type's slices,
/// with the conversion instructions of the instruction set.
trait Half: Copy + 'static {
    /// `src` widened into the first `src.len()` elements of `buffer`
    /// ([`room`]), which it returns.
    fn widen_into<'b>(isa: Isa, src: &[Self], buffer: &'b mut Vec<f32>) -> &'b mut [f32] {
        let wide = room(buffer, src.len());
        Self::widen(isa, src, wide);
        wide
    }
    fn widen(isa: Isa, src: &[Self], dst: &mut [f32]);
    fn narrow(isa: Isa, src: &[f32], dst: &mut [Self]);
}

impl Half for f16 {
    fn widen(isa: Isa, src: &[Self], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 {
            // SAFETY: `Isa::Avx512` is only detected with AVX-512 F.
            return unsafe { convert::f16_to_f32_avx512(src, dst) };
        }
        let _ = isa;
        src.convert_to_f32_slice(dst);
    }
    fn narrow(isa: Isa, src: &[f32], dst: &mut [Self]) {
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 {
            // SAFETY: `Isa::Avx512` is only detected with AVX-512 F.
            return unsafe { convert::f32_to_f16_avx512(src, dst) };
        }
        let _ = isa;
        dst.convert_from_f32_slice(src);
    }
}

impl Half for bf16 {
    fn widen(isa: Isa, src: &[Self], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        match isa {
            // SAFETY: `Isa::Avx512` is only detected with AVX-512 F/VL/BW.
            Isa::Avx512 => return unsafe { convert::bf16_to_f32_avx512(src, dst) },
            // SAFETY: `Isa::Avx2` is only detected with AVX2.
            Isa::Avx2 => return unsafe { convert::bf16_to_f32_avx2(src, dst) },
            Isa::Portable => {}
        }
        let _ = isa;
        convert::bf16_to_f32(src, dst);
    }
    fn narrow(isa: Isa, src: &[f32], dst: &mut [Self]) {
        #[cfg(target_arch = "x86_64")]
        match isa {
            // SAFETY: `Isa::Avx512` is only detected with AVX-512 F/VL/BW.
            Isa::Avx512 => return unsafe { convert::f32_to_bf16_avx512(src, dst) },
            // SAFETY: `Isa::Avx2` is only detected with AVX2.
            Isa::Avx2 => return unsafe { convert::f32_to_bf16_avx2(src, dst) },
            Isa::Portable => {}
        }
        let _ = isa;
        convert::f32_to_bf16(src, dst);
    }
}

/// The conversion loops. `bf16` is the top half of an `f32`, so its
/// conversions are integer operations that the compiler vectorises for
/// each target feature set; `f16` takes `vcvtph2ps` / `vcvtps2ph` (AVX-512
/// F), sixteen elements per instruction, and elsewhere the `half` crate's
/// slice conversions, which use F16C where the CPU has it. (AVX-512 BF16's
/// `vcvtneps2bf16` flushes subnormals to zero, so it is not used.)
mod convert {
    use half::bf16;

    #[inline(always)]
    pub(super) fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits(u32::from(s.to_bits()) << 16);
        }
    }

    /// Round to nearest, ties to even, on the bits; a NaN stays a (quiet)
    /// NaN. Subnormals round like every other value, as they share
    /// `f32`'s exponent range.
    #[inline(always)]
    pub(super) fn f32_to_bf16(src: &[f32], dst: &mut [bf16]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            let bits = s.to_bits();
            // Wraps only for NaNs, which take `quiet` instead.
            let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
            let nan = (bits & 0x7fff_ffff) > 0x7f80_0000;
            let quiet = (bits >> 16) | 0x40;
            *d = bf16::from_bits(if nan { quiet } else { rounded } as u16);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn bf16_to_f32_avx2(src: &[bf16], dst: &mut [f32]) {
        bf16_to_f32(src, dst)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn f32_to_bf16_avx2(src: &[f32], dst: &mut [bf16]) {
        f32_to_bf16(src, dst)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn bf16_to_f32_avx512(src: &[bf16], dst: &mut [f32]) {
        bf16_to_f32(src, dst)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn f32_to_bf16_avx512(src: &[f32], dst: &mut [bf16]) {
        f32_to_bf16(src, dst)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn f16_to_f32_avx512(src: &[half::f16], dst: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = src.len().min(dst.len());
        let whole = n / 16 * 16;
        for at in (0..whole).step_by(16) {
            // SAFETY: `at + 16 <= n`, within both slices; unaligned loads
            // and stores.
            unsafe {
                let halves = _mm256_loadu_si256(src.as_ptr().add(at).cast());
                _mm512_storeu_ps(dst.as_mut_ptr().add(at), _mm512_cvtph_ps(halves));
            }
        }
        for (d, s) in dst[whole..n].iter_mut().zip(&src[whole..n]) {
            *d = s.to_f32();
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn f32_to_f16_avx512(src: &[f32], dst: &mut [half::f16]) {
        use std::arch::x86_64::*;
        let n = src.len().min(dst.len());
        let whole = n / 16 * 16;
        for at in (0..whole).step_by(16) {
            // SAFETY: as in `f16_to_f32_avx512`. `vcvtps2ph` rounds to
            // nearest, ties to even, also into subnormals and infinity.
            unsafe {
                let wide = _mm512_loadu_ps(src.as_ptr().add(at));
                let halves = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(wide);
                _mm256_storeu_si256(dst.as_mut_ptr().add(at).cast(), halves);
            }
        }
        for (d, &s) in dst[whole..n].iter_mut().zip(&src[whole..n]) {
            *d = half::f16::from_f32(s);
        }
    }
}

/// Applies `kernel` to the rows of `io` (rows of `d` elements) through
/// widened blocks: `kernel(block, rows)` normalises `rows` rows of `block`
/// in place.
fn map_widened<H: Half>(isa: Isa, mut io: Io<'_, H>, d: usize, kernel: impl Fn(&mut [f32], usize)) {
    if d == 0 {
        return;
    }
    let step = block_rows(d) * d;
    with_buffers(|[wide, ..]| {
        let total = io.input().len();
        let mut at = 0;
        while at < total {
            let end = (at + step).min(total);
            let block = H::widen_into(isa, &io.input()[at..end], wide);
            kernel(block, (end - at) / d);
            H::narrow(isa, block, &mut io.output()[at..end]);
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
                map_widened(isa, io, d, |block, rows| {
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
                map_widened(isa, io, d, |block, rows| {
                    f32::rms_norm_rows(isa, Io::InPlace(block), rows, params, eps)
                });
            }

            fn row_stats(isa: Isa, x: &[Self]) -> RowStats {
                with_buffers(|[wide, ..]| {
                    f32::row_stats(isa, <$half>::widen_into(isa, x, wide))
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
                transpose_elements(src, src_lead, dst, dst_lead, 0..lines, 0..length);
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
                train_widened(isa, x, y, d, stats, |x, y, stats| {
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
                train_widened(isa, x, y, d, stats, |x, y, stats| {
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
                backward_widened(isa, inputs, dx, saved, partials, |inputs, dx, saved, partials| {
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
                backward_widened(isa, inputs, dx, saved, partials, |inputs, dx, saved, partials| {
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
    isa: Isa,
    x: &[H],
    y: &mut [H],
    d: usize,
    stats: &mut [T],
    kernel: impl Fn(&[f32], &mut [f32], &mut [T]),
) {
    if d == 0 {
        return;
    }
    let rows = block_rows(d);
    with_buffers(|[wide_x, wide_y, _]| {
        let pieces = x.chunks(rows * d).zip(y.chunks_mut(rows * d));
        for ((x, y), stats) in pieces.zip(stats.chunks_mut(rows)) {
            let wide_x = H::widen_into(isa, x, wide_x);
            let wide_y = room(wide_y, x.len());
            kernel(wide_x, wide_y, stats);
            H::narrow(isa, wide_y, y);
        }
    });
}

/// A backward block through widened blocks of rows, whose partials are
/// added in row order as the `f32` kernel adds them.
fn backward_widened<H: Half, T>(
    isa: Isa,
    inputs: Inputs<'_, H>,
    dx: &mut [H],
    saved: Saved<'_, T>,
    partials: &mut Partials,
    kernel: impl Fn(Inputs<'_, f32>, &mut [f32], Saved<'_, T>, &mut Partials),
) {
    let d = inputs.d;
    if d == 0 {
        return;
    }
    let rows = block_rows(d);
    with_buffers(|[wide_x, wide_dy, wide_dx]| {
        let pieces = inputs.x.chunks(rows * d).zip(inputs.dy.chunks(rows * d));
        for (block, ((x, dy), dx)) in pieces.zip(dx.chunks_mut(rows * d)).enumerate() {
            let wide_x = H::widen_into(isa, x, wide_x);
            let wide_dy = H::widen_into(isa, dy, wide_dy);
            let wide_dx = room(wide_dx, x.len());
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
            H::narrow(isa, wide_dx, dx);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f32` values that test a narrowing: every half value, the midpoints
    /// of neighbours and values a hair either side, zeros, infinities,
    /// NaNs and `f32` subnormals.
    fn narrowing_inputs(widen: impl Fn(u16) -> f32) -> Vec<f32> {
        let mut values = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(u32::MAX),
            f32::from_bits(0xffff_8000),
            f32::from_bits(0x7fff_ffff),
        ];
        values.extend([
            f32::from_bits(1),
            f32::from_bits(0x7f_ffff),
            f32::MAX,
            -f32::MAX,
        ]);
        for bits in 0..u16::MAX {
            let (a, b) = (widen(bits), widen(bits + 1));
            values.push(a);
            if a.is_finite() && b.is_finite() && a.is_sign_negative() == b.is_sign_negative() {
                let mid = ((f64::from(a) + f64::from(b)) / 2.0) as f32;
                values.extend([mid, mid.next_up(), mid.next_down()]);
            }
        }
        values
    }

    /// Every instruction set converts as the portable code does, and the
    /// portable code as the `half` crate does (NaNs compared as NaNs).
    fn check_paths<H: Half + PartialEq + std::fmt::Debug>(
        from_bits: fn(u16) -> H,
        to_bits: fn(H) -> u16,
        reference_narrow: fn(f32) -> H,
    ) {
        let all: Vec<H> = (0..=u16::MAX).map(from_bits).collect();
        let inputs = narrowing_inputs(|b| {
            let mut out = [0.0];
            H::widen(Isa::Portable, &[from_bits(b)], &mut out);
            out[0]
        });
        let mut portable_wide = vec![0.0; all.len()];
        H::widen(Isa::Portable, &all, &mut portable_wide);
        let mut portable_narrow = vec![from_bits(0); inputs.len()];
        H::narrow(Isa::Portable, &inputs, &mut portable_narrow);
        for (&got, &input) in portable_narrow.iter().zip(&inputs) {
            let want = reference_narrow(input);
            let both_nan =
                input.is_nan() && to_bits(got) & 0x7fff > to_bits(reference_narrow(f32::INFINITY));
            assert!(both_nan || to_bits(got) == to_bits(want), "{input:e}");
        }
        for isa in Isa::available() {
            let mut wide = vec![0.0; all.len()];
            H::widen(isa, &all, &mut wide);
            for (a, b) in wide.iter().zip(&portable_wide) {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{isa:?}"
                );
            }
            let mut narrow = vec![from_bits(0); inputs.len()];
            H::narrow(isa, &inputs, &mut narrow);
            for ((&a, &b), input) in narrow.iter().zip(&portable_narrow).zip(&inputs) {
                let nan = input.is_nan();
                assert!(to_bits(a) == to_bits(b) || nan, "{isa:?} {input:e}");
            }
        }
    }

    #[test]
    fn f16_conversions_agree_on_every_instruction_set() {
        check_paths(f16::from_bits, f16::to_bits, f16::from_f32);
    }

    #[test]
    fn bf16_conversions_agree_on_every_instruction_set() {
        check_paths(bf16::from_bits, bf16::to_bits, bf16::from_f32);
    }
}
