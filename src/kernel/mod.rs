//! Row kernels: every floating-point operation of the crate, applied to one
//! contiguous row at a time, with the instruction set chosen at run time.
//!
//! The arithmetic is written once, in [`portable`], as `#[inline(always)]`
//! functions generic over a 16-lane [`simd::Vector`]. Each entry point here
//! takes an [`Isa`] (detected once per call by the caller) and runs that one
//! source with the chosen vector type and target features: AVX-512 or AVX2
//! registers on x86-64 through the trampolines of `x86` (AVX2 with FMA), and
//! a plain lane array elsewhere, x86-64 without AVX2 included (which the
//! compiler maps to NEON on aarch64 as far as it can). Every fused
//! multiply-add rounds once on every path (`f64::mul_add` on the lane array)
//! and the summation order is fixed by the source, so every path gives the
//! same bits; the tests compare them, the plain lane array included.

pub(crate) mod backward;
pub(crate) mod cache;
#[cfg(feature = "half")]
mod half;
mod islands;
mod params;
mod portable;
mod short;
pub(crate) mod simd;
mod transpose;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::atomic::{AtomicU8, Ordering};

use crate::scalar::{KernelScalar, NormScalar};
use backward::{Inputs, Partials, RowCentring, RowScaling, Saved};
pub(crate) use params::{CallParams, Params};

/// One row's input and where its output goes.
pub(crate) enum Io<'a, A> {
    /// Read `input`, write `output` (same length).
    Copy { input: &'a [A], output: &'a mut [A] },
    /// Read and overwrite the same row.
    InPlace(&'a mut [A]),
    /// As [`Io::Copy`], for outputs too large to stay in any cache: every
    /// whole 64-byte line of the output is written with non-temporal
    /// stores, which do not read the line first. Same values, same bits.
    Stream { input: &'a [A], output: &'a mut [A] },
}

impl<'a, A> Io<'a, A> {
    /// Read `input`, write `output`: [`Io::Stream`] with `streamed`,
    /// [`Io::Copy`] otherwise.
    pub(crate) fn separate(input: &'a [A], output: &'a mut [A], streamed: bool) -> Self {
        if streamed {
            Io::Stream { input, output }
        } else {
            Io::Copy { input, output }
        }
    }

    fn input(&self) -> &[A] {
        match self {
            Io::Copy { input, .. } | Io::Stream { input, .. } => input,
            Io::InPlace(row) => row,
        }
    }

    fn output(&mut self) -> &mut [A] {
        match self {
            Io::Copy { output, .. } | Io::Stream { output, .. } => output,
            Io::InPlace(row) => row,
        }
    }

    /// The consecutive rows of length `d` (non-zero) of a block of rows.
    fn rows(self, d: usize) -> Rows<'a, A> {
        Rows { rest: self, d }
    }
}

/// The rows of a block, front to back ([`Io::rows`]). A plain struct
/// rather than an adapter chain over the three cases, so that taking the
/// next row compiles to a few instructions in the caller's loop: a chained
/// iterator is left as a call per row, a share of a short row's work that
/// shows (PERFORMANCE.md, "Contiguous arrays").
struct Rows<'a, A> {
    rest: Io<'a, A>,
    d: usize,
}

impl<'a, A> Iterator for Rows<'a, A> {
    type Item = Io<'a, A>;

    #[inline(always)]
    fn next(&mut self) -> Option<Io<'a, A>> {
        let d = self.d;
        if self.rest.input().len() < d {
            return None;
        }
        Some(match &mut self.rest {
            Io::Copy { input, output } => {
                let (input, output) = split_pair(input, output, d);
                Io::Copy { input, output }
            }
            Io::Stream { input, output } => {
                let (input, output) = split_pair(input, output, d);
                Io::Stream { input, output }
            }
            Io::InPlace(rows) => {
                let (row, rest) = std::mem::take(rows).split_at_mut(d);
                *rows = rest;
                Io::InPlace(row)
            }
        })
    }
}

/// The first `d` elements of `input` and `output`, which keep the rest.
#[inline(always)]
fn split_pair<'a, A>(
    input: &mut &'a [A],
    output: &mut &'a mut [A],
    d: usize,
) -> (&'a [A], &'a mut [A]) {
    let (first_input, rest_input) = input.split_at(d);
    let (first_output, rest_output) = std::mem::take(output).split_at_mut(d);
    *input = rest_input;
    *output = rest_output;
    (first_input, first_output)
}

/// The per-feature affine part applied after normalising.
#[derive(Clone, Copy)]
pub(crate) enum Affine<'a, A> {
    /// `y = n`.
    Identity,
    /// `y = n * gamma`.
    Scale(&'a [A]),
    /// `y = n * gamma + beta`.
    ScaleShift(&'a [A], &'a [A]),
    /// `y = n * (1 + w)`, the zero-centred gain, with `1 + w` formed in
    /// `f64`.
    OnePlus(&'a [A]),
}

/// Per-feature weights in `f64`: `γ` as given, or with `one_plus` the
/// zero-centred gain `1 + w`, formed in `f64` as every kernel forms it. The
/// one place where stored weights are widened for the kernels, so that the
/// forward and backward passes agree on every bit of the gain.
pub(crate) fn widened_gain<A: NormScalar>(
    weights: &[A],
    one_plus: bool,
) -> impl Iterator<Item = f64> + '_ {
    weights
        .iter()
        .map(move |w| if one_plus { 1.0 + w.widen() } else { w.widen() })
}

/// The instruction sets the kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// The plain lane array, one scalar operation per lane (auto-vectorised
    /// where the compiler manages): every target's baseline, and the
    /// reference the tests compare every other path with.
    Portable,
    /// AVX2 (x86-64).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 F/VL/DQ/BW (x86-64).
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// The detected [`Isa`], cached: 0 = not yet detected.
static DETECTED: AtomicU8 = AtomicU8::new(0);

impl Isa {
    /// The best instruction set this CPU supports, or the best up to the one
    /// named by the environment variable `NDARRAY_LAYERNORM_ISA`
    /// (`portable`, `avx2` or `avx512`), which lets a run measure or check
    /// one path against another; the bits are the same on every path.
    /// Detection runs once per process; afterwards this is one relaxed
    /// atomic load.
    pub(crate) fn detect() -> Isa {
        match DETECTED.load(Ordering::Relaxed) {
            0 => {
                let cap = std::env::var("NDARRAY_LAYERNORM_ISA").ok();
                let isa = Isa::best_up_to(&Isa::available(), cap.as_deref());
                DETECTED.store(isa.code(), Ordering::Relaxed);
                isa
            }
            code => Isa::from_code(code),
        }
    }

    /// The last of `available` (worst first) that is no better than the
    /// instruction set `cap` names; the last of all when `cap` is `None` or
    /// names none.
    fn best_up_to(available: &[Isa], cap: Option<&str>) -> Isa {
        const NAMES: [&str; 3] = ["portable", "avx2", "avx512"];
        let limit = cap.and_then(|cap| {
            let cap = cap.trim();
            NAMES.iter().position(|name| cap.eq_ignore_ascii_case(name))
        });
        available
            .iter()
            .copied()
            .rfind(|isa| limit.is_none_or(|limit| isa.rank() <= limit))
            .unwrap_or(Isa::Portable)
    }

    /// The place of this instruction set in `portable`, `avx2`, `avx512`.
    fn rank(self) -> usize {
        match self {
            Isa::Portable => 0,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => 1,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => 2,
        }
    }

    /// Every instruction set this CPU supports, worst first.
    pub(crate) fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut isas = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if x86::has_avx2() {
                isas.push(Isa::Avx2);
            }
            if x86::has_avx512() {
                isas.push(Isa::Avx512);
            }
        }
        isas
    }

    /// Whether [`Kernels::transpose_lines`] moves whole squares in registers on
    /// this instruction set, rather than one element at a time.
    pub(crate) fn transposes_in_registers(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if matches!(self, Isa::Avx2 | Isa::Avx512) {
            return true;
        }
        false
    }

    fn code(self) -> u8 {
        match self {
            Isa::Portable => 1,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => 2,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => 3,
        }
    }

    fn from_code(code: u8) -> Isa {
        match code {
            #[cfg(target_arch = "x86_64")]
            2 => Isa::Avx2,
            #[cfg(target_arch = "x86_64")]
            3 => Isa::Avx512,
            _ => Isa::Portable,
        }
    }
}

/// The mean and root mean square of one row, in `f64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RowStats {
    /// The double nearest the mean.
    pub(crate) mean: f64,
    /// The rest of the mean beyond `mean` (0 where it is not known), which
    /// settles the rounding to `f32` where `mean` is a tie of it
    /// ([`NormScalar::narrow_sum`]).
    pub(crate) mean_rest: f64,
    pub(crate) rms: f64,
}

/// Declares the kernel entry points. Each is compiled here, once per
/// element type, as a method of [`Kernels`] that dispatches on the
/// [`Isa`], so that a crate calling the generic API never compiles a
/// kernel itself. In the signatures, `Self` is the element type and
/// `Self::Compute` the type of the parameters the kernels read.
macro_rules! kernels {
    ($(
        $(#[$doc:meta])*
        fn $name:ident in $module:ident ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;
    )*) => {
        /// The kernel entry points of an element type (see [`kernels!`]).
        ///
        /// A supertrait of the sealed [`NormScalar`]: it must be public for
        /// that, but its signatures use crate-private types, so no other
        /// crate can call or implement it.
        #[allow(private_interfaces)]
        pub trait Kernels: Sized {
            /// The type the kernels compute on: the element type itself for
            /// `f32` and `f64`; `f32` for the half types, whose rows are
            /// widened to it in cache.
            type Compute: KernelScalar;
            $(
                $(#[$doc])*
                fn $name(isa: Isa, $($arg: $ty),*) $(-> $ret)?;
            )*
        }

        kernels!(@impl f32_kernels f32, $($name in $module ($($arg: $ty),*) $(-> $ret)?;)*);
        kernels!(@impl f64_kernels f64, $($name in $module ($($arg: $ty),*) $(-> $ret)?;)*);
    };
    (@impl $types:ident $elem:ty, $($name:ident in $module:ident ($($arg:ident: $ty:ty),*) $(-> $ret:ty)?;)*) => {
        mod $types {
            use super::*;

            type A = $elem;

            #[allow(private_interfaces)]
            impl Kernels for A {
                type Compute = A;
            $(
                #[inline(never)]
                fn $name(isa: Isa, $($arg: $ty),*) $(-> $ret)? {
                    match isa {
                        Isa::Portable => $module::$name::<A, simd::Portable>($($arg),*),
                        // SAFETY: `Isa::Avx2` is only constructed after
                        // `is_x86_feature_detected!` confirmed AVX2 on this CPU.
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx2 => unsafe { x86::avx2::$name::<A>($($arg),*) },
                        // SAFETY: `Isa::Avx512` is only constructed after
                        // `is_x86_feature_detected!` confirmed AVX-512 F/VL/DQ/BW.
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx512 => unsafe { x86::avx512::$name::<A>($($arg),*) },
                    }
                }
            )*
            }
        }
    };
}

kernels! {
    /// LayerNorm of `rows` consecutive rows (a block of a contiguous array).
    fn layer_norm_rows in portable(io: Io<'_, Self>, rows: usize, params: Params<'_, Self::Compute>, eps: f64);
    /// RMSNorm of `rows` consecutive rows (a block of a contiguous array).
    fn rms_norm_rows in portable(io: Io<'_, Self>, rows: usize, params: Params<'_, Self::Compute>, eps: f64);
    /// [`RowStats`] of one (non-empty) row.
    fn row_stats in portable(x: &[Self]) -> RowStats;
    /// `dst[j · dst_lead + i] = src[i · src_lead + j]` for `i < lines`,
    /// `j < length`: see [`transpose::transpose_lines`].
    fn transpose_lines in transpose(
        src: &[Self],
        src_lead: usize,
        dst: &mut [Self],
        dst_lead: usize,
        lines: usize,
        length: usize,
    );
    /// LayerNorm of a block of rows of length `d` (`x` and `y` of the same
    /// length), with the bits of [`Kernels::layer_norm_rows`], saving each
    /// row's statistics in `stats` (one entry per row).
    fn layer_norm_train_block in backward(
        x: &[Self],
        y: &mut [Self],
        d: usize,
        affine: Affine<'_, Self::Compute>,
        eps: f64,
        stats: &mut [RowCentring],
    );
    /// RMSNorm of a block of rows of length `d`, with the bits of
    /// [`Kernels::rms_norm_rows`], saving each row's statistics in `stats`.
    fn rms_norm_train_block in backward(
        x: &[Self],
        y: &mut [Self],
        d: usize,
        affine: Affine<'_, Self::Compute>,
        eps: f64,
        stats: &mut [RowScaling],
    );
    /// LayerNorm backward of a block of rows: writes `dx` and adds each
    /// row's `dy ⊙ n` and `dy` to `partials`, in row order.
    fn layer_norm_backward_block in backward(
        inputs: Inputs<'_, Self>,
        dx: &mut [Self],
        saved: Saved<'_, RowCentring>,
        partials: &mut Partials,
    );
    /// RMSNorm backward of a block of rows: writes `dx` and adds each row's
    /// `dy ⊙ n` to `partials.dgamma`, in row order.
    fn rms_norm_backward_block in backward(
        inputs: Inputs<'_, Self>,
        dx: &mut [Self],
        saved: Saved<'_, RowScaling>,
        partials: &mut Partials,
    );
}

#[cfg(test)]
mod tests {
    use super::backward::Gain;
    use super::simd::LANES;
    use super::*;

    /// Rows of awkward lengths and values, deterministic.
    fn rows() -> Vec<Vec<f64>> {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let mut rows = Vec::new();
        for d in [1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 768, 1025] {
            for (scale, offset) in [(1.0, 0.0), (1e-3, 1e8), (1e150, 0.0), (1e-160, 0.0)] {
                rows.push((0..d).map(|_| offset + scale * next()).collect());
            }
            rows.push(vec![0.25; d]);
        }
        rows
    }

    fn assert_same_bits<A: KernelScalar>(a: &[A], b: &[A], what: &str) {
        let equal = a
            .iter()
            .zip(b)
            .all(|(x, y)| x.widen().to_bits() == y.widen().to_bits());
        assert!(equal, "{what}: {a:?} vs {b:?}");
    }

    fn check_all_paths<A: KernelScalar>(row: &[A]) {
        let d = row.len();
        let gamma: Vec<A> = (0..d).map(|i| A::narrow(0.5 + i as f64 / 7.0)).collect();
        let beta: Vec<A> = (0..d).map(|i| A::narrow(i as f64 / 3.0 - 1.0)).collect();
        let run = |isa: Isa| {
            let mut ln = vec![A::zero(); d];
            A::layer_norm_rows(
                isa,
                Io::Copy {
                    input: row,
                    output: &mut ln,
                },
                1,
                Affine::ScaleShift(&gamma, &beta).into(),
                1e-5,
            );
            let mut rms = row.to_vec();
            let gain = Affine::Scale(&gamma).into();
            A::rms_norm_rows(isa, Io::InPlace(&mut rms), 1, gain, 0.0);
            (ln, rms, A::row_stats(isa, row))
        };
        let baseline = run(Isa::Portable);
        for isa in Isa::available() {
            let other = run(isa);
            assert_same_bits(&baseline.0, &other.0, &format!("layer_norm {isa:?}"));
            assert_same_bits(&baseline.1, &other.1, &format!("rms_norm {isa:?}"));
            let bits = |stats: RowStats| [stats.mean, stats.mean_rest, stats.rms].map(f64::to_bits);
            assert_eq!(bits(baseline.2), bits(other.2), "stats {isa:?}");
        }
    }

    /// Rows whose last chunk ends at every position up to a chunk before
    /// a page boundary, so that their tails take both the masked moves and
    /// the stack copy of the vector types that have both.
    #[test]
    fn tails_next_to_a_page_boundary_give_the_same_bits() {
        const PAGE: usize = 4096;
        for row in rows().into_iter().filter(|row| row.len() % LANES != 0) {
            let d = row.len();
            let narrow: Vec<f32> = row.iter().map(|&v| v as f32).collect();
            let mut wide = vec![0.0; 2 * d + PAGE];
            let mut single = vec![0.0f32; 2 * d + PAGE];
            // The first page boundary with the row and a chunk before it.
            let boundary = |base: usize| ((base + d * 8 + LANES * 8) / PAGE + 1) * PAGE;
            let wide_end = (boundary(wide.as_ptr() as usize) - wide.as_ptr() as usize) / 8;
            let single_end = (boundary(single.as_ptr() as usize) - single.as_ptr() as usize) / 4;
            for gap in 0..LANES {
                let place = wide_end - gap - d..wide_end - gap;
                wide[place.clone()].copy_from_slice(&row);
                check_all_paths(&wide[place]);
                let place = single_end - gap - d..single_end - gap;
                single[place.clone()].copy_from_slice(&narrow);
                check_all_paths(&single[place]);
            }
        }
    }

    #[test]
    fn the_environment_caps_the_instruction_set() {
        let all = Isa::available();
        let best = *all.last().unwrap();
        assert_eq!(Isa::best_up_to(&all, None), best);
        assert_eq!(Isa::best_up_to(&all, Some("no such set")), best);
        assert_eq!(Isa::best_up_to(&all, Some("portable")), Isa::Portable);
        assert_eq!(Isa::best_up_to(&all, Some(" Portable ")), Isa::Portable);
        #[cfg(target_arch = "x86_64")]
        {
            let sets = [Isa::Portable, Isa::Avx2, Isa::Avx512];
            assert_eq!(Isa::best_up_to(&sets, Some("avx2")), Isa::Avx2);
            assert_eq!(Isa::best_up_to(&sets, Some("avx512")), Isa::Avx512);
            // A cap above what the CPU has changes nothing.
            assert_eq!(Isa::best_up_to(&sets[..2], Some("avx512")), Isa::Avx2);
        }
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        println!("instruction sets on this CPU: {:?}", Isa::available());
        for row in rows() {
            check_all_paths(&row);
            let narrow: Vec<f32> = row.iter().map(|&v| v as f32).collect();
            check_all_paths(&narrow);
        }
    }

    /// A slab of `rows` rows of length `d`, some of them special (constant,
    /// holding a NaN, huge, tiny), the rest random.
    fn slab(rows: usize, d: usize) -> Vec<f64> {
        let mut next = random(d);
        let mut values = Vec::with_capacity(rows * d);
        for r in 0..rows {
            for j in 0..d {
                values.push(match r % 7 {
                    1 => 3.25,
                    2 if j == d / 2 => f64::NAN,
                    3 => 1e300 * next(),
                    4 => 1e-300 * next(),
                    5 => 1e8 + next(),
                    _ => next(),
                });
            }
        }
        values
    }

    /// Uniform values in `-0.5 .. 0.5`, seeded by `d`.
    fn random(d: usize) -> impl FnMut() -> f64 {
        let mut state = 0x1234_5678_9abc_def1u64 ^ (d as u64);
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        }
    }

    fn check_blocks<A: KernelScalar>(values: &[f64], rows: usize, d: usize) {
        let x: Vec<A> = values.iter().map(|&v| A::narrow(v)).collect();
        let gamma: Vec<A> = (0..d).map(|i| A::narrow(0.5 + i as f64 / 7.0)).collect();
        let beta: Vec<A> = (0..d).map(|i| A::narrow(i as f64 / 3.0 - 1.0)).collect();
        for isa in Isa::available() {
            for eps in [0.0, 1e-5] {
                // The blocks take the parameters as a call does (widened to
                // f64 where that pays), single rows as given.
                let call = CallParams::new(Affine::ScaleShift(&gamma, &beta), d, x.len());
                let (params, affine) = (call.params(), Affine::ScaleShift(&gamma, &beta).into());
                let mut block = vec![A::zero(); x.len()];
                A::layer_norm_rows(
                    isa,
                    Io::Copy {
                        input: &x,
                        output: &mut block,
                    },
                    rows,
                    params,
                    eps,
                );
                let mut in_place = x.clone();
                A::layer_norm_rows(isa, Io::InPlace(&mut in_place), rows, params, eps);
                let mut one_by_one = vec![A::zero(); x.len()];
                for (input, output) in x.chunks(d).zip(one_by_one.chunks_mut(d)) {
                    A::layer_norm_rows(isa, Io::Copy { input, output }, 1, affine, eps);
                }
                assert_same_bits(
                    &block,
                    &one_by_one,
                    &format!("layer_norm_rows {isa:?} d {d}"),
                );
                assert_same_bits(&in_place, &one_by_one, &format!("in place {isa:?} d {d}"));
                // Streamed outputs at every alignment within a 64-byte line,
                // between guard elements that must stay as they were.
                let guard = A::narrow(-7.5);
                for offset in 0..64 / size_of::<A>() {
                    let end = offset + x.len();
                    let mut buffer = vec![guard; end + LANES];
                    let output = &mut buffer[offset..end];
                    let io = Io::Stream { input: &x, output };
                    A::layer_norm_rows(isa, io, rows, params, eps);
                    let what = format!("streamed {isa:?} d {d} offset {offset}");
                    assert_same_bits(&buffer[offset..end], &one_by_one, &what);
                    let mut guards = buffer[..offset].iter().chain(&buffer[end..]);
                    assert!(guards.all(|&v| v == guard), "{what}: wrote outside");
                }
                let mut buffer = vec![guard; x.len() + LANES];
                let mut input = x.clone();
                input.extend(std::iter::repeat_n(guard, LANES));
                let (copied, in_place) = (&mut buffer[..x.len()], &mut input[..x.len()]);
                A::layer_norm_rows(
                    isa,
                    Io::Copy {
                        input: &x,
                        output: copied,
                    },
                    rows,
                    params,
                    eps,
                );
                A::layer_norm_rows(isa, Io::InPlace(in_place), rows, params, eps);
                let what = format!("layer_norm_rows {isa:?} d {d}");
                assert_same_bits(&buffer[..x.len()], &one_by_one, &what);
                assert_same_bits(&input[..x.len()], &one_by_one, &what);
                let mut guards = buffer[x.len()..].iter().chain(&input[x.len()..]);
                assert!(guards.all(|&v| v == guard), "{what}: wrote past the end");

                for gain in [Affine::Scale(&gamma[..]), Affine::OnePlus(&gamma[..])] {
                    let call = CallParams::new(gain, d, x.len());
                    let mut block = vec![A::zero(); x.len()];
                    A::rms_norm_rows(
                        isa,
                        Io::Copy {
                            input: &x,
                            output: &mut block,
                        },
                        rows,
                        call.params(),
                        eps,
                    );
                    let mut one_by_one = vec![A::zero(); x.len()];
                    for (input, output) in x.chunks(d).zip(one_by_one.chunks_mut(d)) {
                        A::rms_norm_rows(isa, Io::Copy { input, output }, 1, gain.into(), eps);
                    }
                    let what = format!("rms_norm_rows {isa:?} d {d}");
                    assert_same_bits(&block, &one_by_one, &what);
                    let mut in_place = x.clone();
                    A::rms_norm_rows(isa, Io::InPlace(&mut in_place), rows, call.params(), eps);
                    let what = format!("rms in place {isa:?} d {d}");
                    assert_same_bits(&in_place, &one_by_one, &what);
                    let end = 3 + x.len();
                    let mut buffer = vec![guard; end + LANES];
                    let io = Io::Stream {
                        input: &x,
                        output: &mut buffer[3..end],
                    };
                    A::rms_norm_rows(isa, io, rows, call.params(), eps);
                    let what = format!("streamed rms {isa:?} d {d}");
                    assert_same_bits(&buffer[3..end], &one_by_one, &what);
                    let mut guards = buffer[..3].iter().chain(&buffer[end..]);
                    assert!(guards.all(|&v| v == guard), "{what}: wrote outside");
                }
            }
        }
    }

    #[test]
    fn blocks_of_rows_give_the_bits_of_single_rows() {
        for d in [1, 2, 3, 4, 5, 6, 7, 8, 15, 16, 17, 40, 100] {
            // Two blocks of 16 and a remainder. Mixed blocks, whose special
            // rows the vector pass leaves to the long-row kernel; blocks of
            // ordinary rows only, which it writes whole; blocks of constant
            // rows only.
            let rows = 37;
            let mut next = random(d);
            let ordinary: Vec<f64> = (0..rows * d).map(|_| next() * 8.0 + 1.0).collect();
            let constant: Vec<f64> = (0..rows * d)
                .map(|k| (k / d) as f64 * 0.375 - 5.0)
                .collect();
            for values in [slab(rows, d), ordinary, constant] {
                check_blocks::<f64>(&values, rows, d);
                check_blocks::<f32>(&values, rows, d);
            }
            // Blocks of ordinary rows but one, whose elements alternate in
            // sign at an edge of the quick block tests: the blocks must go
            // to the per-row verdicts, or agree with them.
            let edges = [
                1e290,
                1e290f64.next_down(),
                0.0,
                5e-324,
                f64::INFINITY,
                f64::NAN,
            ];
            let edge_rows = simd::LANES * edges.len() + 3;
            let mut edged: Vec<f64> = (0..edge_rows * d).map(|_| next() * 8.0 + 1.0).collect();
            for (block, &edge) in edges.iter().enumerate() {
                let row = block * simd::LANES + block % simd::LANES;
                for (j, x) in edged[row * d..(row + 1) * d].iter_mut().enumerate() {
                    *x = if j % 2 == 0 { edge } else { -edge };
                }
            }
            check_blocks::<f64>(&edged, edge_rows, d);
            check_blocks::<f32>(&edged, edge_rows, d);
        }
    }

    /// Everything the training kernels produce for one block, as bits.
    #[derive(Debug, PartialEq)]
    struct TrainingBits {
        forward: Vec<u64>,
        stats: Vec<u64>,
        dx: Vec<u64>,
        dgamma: Vec<u64>,
        dbeta: Vec<u64>,
    }

    fn bits_of<A: KernelScalar>(values: &[A]) -> Vec<u64> {
        values.iter().map(|v| v.widen().to_bits()).collect()
    }

    /// A backward block kernel with its instruction set and saved
    /// statistics settled.
    type BackwardKernel<'k, A> = dyn Fn(Inputs<'_, A>, &mut [A], &mut Partials) + 'k;

    /// One backward call of `kernel`: `dx` written `offset` elements into a
    /// buffer between guard values, which must stay as they were, with the
    /// partials started as the row walk starts them; the bits of `dx`, `dγ`
    /// and `dβ`.
    fn backward_bits<A: KernelScalar>(
        inputs: Inputs<'_, A>,
        offset: usize,
        kernel: &BackwardKernel<'_, A>,
    ) -> [Vec<u64>; 3] {
        let (len, d) = (inputs.x.len(), inputs.d);
        let guard = A::narrow(-7.5);
        let mut buffer = vec![guard; offset + len + LANES];
        let (before, rest) = buffer.split_at_mut(offset);
        let (dx, after) = rest.split_at_mut(len);
        let mut partials = Partials::new(d);
        partials.clear(if inputs.stream {
            cache::before_first_line(dx)
        } else {
            0
        });
        kernel(inputs, dx, &mut partials);
        let mut guards = before.iter().chain(after.iter());
        assert!(guards.all(|&v| v == guard), "wrote outside dx at {offset}");
        [
            bits_of(dx),
            bits_of(&partials.dgamma.as_slice()[..d]),
            bits_of(&partials.dbeta.as_slice()[..d]),
        ]
    }

    /// Runs every training kernel on `block` (rows of length `d`) with one
    /// instruction set: the forward passes that save statistics, and the
    /// backward passes from saved and from recomputed statistics, with both
    /// kinds of gain.
    fn run_training<A: KernelScalar>(isa: Isa, block: &[A], d: usize, eps: f64) -> TrainingBits {
        let rows = block.len() / d;
        let gamma: Vec<A> = (0..d).map(|i| A::narrow(0.5 + i as f64 / 7.0)).collect();
        let beta: Vec<A> = (0..d).map(|i| A::narrow(i as f64 / 3.0 - 1.0)).collect();
        let dy: Vec<A> = (0..block.len())
            .map(|i| A::narrow(((i * 37) % 23) as f64 / 11.0 - 1.0))
            .collect();
        let mut bits = TrainingBits {
            forward: Vec::new(),
            stats: Vec::new(),
            dx: Vec::new(),
            dgamma: Vec::new(),
            dbeta: Vec::new(),
        };
        let mut y = vec![A::zero(); block.len()];
        let mut centring = vec![RowCentring::NOT_FINITE; rows];
        let affine = Affine::ScaleShift(&gamma, &beta);
        A::layer_norm_train_block(isa, block, &mut y, d, affine, eps, &mut centring);
        bits.forward.extend(bits_of(&y));
        bits.stats.extend(centring.iter().flat_map(|s| s.to_bits()));
        let mut scaling = vec![RowScaling::NOT_FINITE; rows];
        for affine in [Affine::Scale(&gamma[..]), Affine::OnePlus(&gamma)] {
            A::rms_norm_train_block(isa, block, &mut y, d, affine, eps, &mut scaling);
            bits.forward.extend(bits_of(&y));
            bits.stats.extend(scaling.iter().flat_map(|s| s.to_bits()));
        }
        // Statistics recomputed and saved by the forward pass must give the
        // same bits, and so must `dx` streamed at every alignment within a
        // 64-byte line.
        let grads = |bits: &mut TrainingBits,
                     kernel: &BackwardKernel<'_, A>,
                     gain: &[f64],
                     recomputed: bool| {
            let inputs = Inputs {
                x: block,
                dy: &dy,
                d,
                gain,
                // Hints past the block's end are allowed, and change
                // no bits.
                prefetch: true,
                stream: false,
            };
            let [dx, dgamma, dbeta] = backward_bits(inputs, 0, kernel);
            for offset in 0..64 / size_of::<A>() {
                let streamed = Inputs {
                    stream: true,
                    ..inputs
                };
                let what = format!("{isa:?} d {d}: streamed at {offset}");
                assert_eq!(
                    backward_bits(streamed, offset, kernel),
                    [&dx, &dgamma, &dbeta].map(Clone::clone),
                    "{what}"
                );
            }
            if !recomputed {
                let n = dx.len();
                assert_eq!(
                    bits.dx[bits.dx.len() - n..],
                    dx,
                    "{isa:?}: saved vs recomputed"
                );
                assert_eq!(bits.dgamma[bits.dgamma.len() - d..], dgamma);
                assert_eq!(bits.dbeta[bits.dbeta.len() - d..], dbeta);
            }
            bits.dx.extend(dx);
            bits.dgamma.extend(dgamma);
            bits.dbeta.extend(dbeta);
        };
        for gain in [Gain::Gamma(&gamma[..]), Gain::OnePlus(&gamma)] {
            let gain = gain.widened();
            for saved in [Saved::Compute(eps), Saved::Rows(&centring)] {
                let kernel = |inputs: Inputs<'_, A>, dx: &mut [A], partials: &mut Partials| {
                    A::layer_norm_backward_block(isa, inputs, dx, saved, partials);
                };
                grads(
                    &mut bits,
                    &kernel,
                    &gain,
                    matches!(saved, Saved::Compute(_)),
                );
            }
            for saved in [Saved::Compute(eps), Saved::Rows(&scaling)] {
                let kernel = |inputs: Inputs<'_, A>, dx: &mut [A], partials: &mut Partials| {
                    A::rms_norm_backward_block(isa, inputs, dx, saved, partials);
                };
                grads(
                    &mut bits,
                    &kernel,
                    &gain,
                    matches!(saved, Saved::Compute(_)),
                );
            }
        }
        bits
    }

    #[test]
    fn every_instruction_set_gives_the_same_training_bits() {
        // Blocks of the rows above, one block per length: rows with an
        // offset, huge and tiny rows (rescaled inside), a constant row (with
        // eps = 0 it has no derivative), plus an all-zero row and a row
        // holding a NaN.
        let rows = rows();
        for d in [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 768, 1025] {
            let mut block: Vec<f64> = rows
                .iter()
                .filter(|row| row.len() == d)
                .flatten()
                .copied()
                .collect();
            block.extend(std::iter::repeat_n(0.0, d));
            block.extend((0..d).map(|i| if i == d / 2 { f64::NAN } else { i as f64 }));
            let narrow: Vec<f32> = block.iter().map(|&v| v as f32).collect();
            for eps in [0.0, 1e-5] {
                let reference = run_training(Isa::Portable, &block, d, eps);
                let reference32 = run_training(Isa::Portable, &narrow, d, eps);
                for isa in Isa::available() {
                    let other = run_training(isa, &block, d, eps);
                    assert!(reference == other, "f64 d {d} eps {eps}: {isa:?}");
                    let other = run_training(isa, &narrow, d, eps);
                    assert!(reference32 == other, "f32 d {d} eps {eps}: {isa:?}");
                }
            }
        }
    }

    /// Every instruction set copies every element to its transposed place,
    /// squares and edges alike, and leaves the rest of `dst` alone.
    fn check_transpose<A: KernelScalar>() {
        for (lines, length) in [
            (1, 1),
            (3, 5),
            (8, 8),
            (16, 16),
            (17, 33),
            (64, 16),
            (21, 40),
            (40, 21),
            (0, 5),
            (5, 0),
        ] {
            for (src_pad, dst_pad) in [(0, 0), (3, 7)] {
                let (src_lead, dst_lead) = (length + src_pad, lines + dst_pad);
                let src: Vec<A> = (0..lines * src_lead)
                    .map(|k| A::narrow(k as f64 + 0.5))
                    .collect();
                let sentinel = A::narrow(-1.0);
                for isa in Isa::available() {
                    let mut dst = vec![sentinel; length * dst_lead];
                    A::transpose_lines(isa, &src, src_lead, &mut dst, dst_lead, lines, length);
                    for (k, &value) in dst.iter().enumerate() {
                        let (j, i) = (k / dst_lead, k % dst_lead);
                        let expected = if i < lines {
                            src[i * src_lead + j]
                        } else {
                            sentinel
                        };
                        assert!(
                            value == expected,
                            "{isa:?} {lines} x {length}, leads {src_lead} {dst_lead}: \
                             dst[{k}] = {value:?}, expected {expected:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn transposing_copies_move_every_element() {
        check_transpose::<f32>();
        check_transpose::<f64>();
    }

    #[test]
    fn detection_is_cached_and_consistent() {
        let first = Isa::detect();
        assert_eq!(first, Isa::detect());
        assert!(Isa::available().contains(&first));
    }
}
