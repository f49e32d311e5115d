//! x86-64: the kernel vector as AVX2 and AVX-512 registers, and the
//! target-feature trampolines that compile the portable kernels for each.
//!
//! Each vector type holds the 16 lanes of [`Vector`] in as many registers as
//! it takes (4 AVX2, 2 AVX-512), lane `l` in register `l / width`,
//! element `l % width`, and maps every lane operation to the one instruction
//! that performs it: `addpd`, `subpd`, `mulpd`, `minpd`/`maxpd` (whose "second
//! operand unless the first is smaller/larger" rule is exactly
//! [`Arith::min_select`] / [`Arith::max_select`] with the operands swapped),
//! `divpd`, `sqrtpd` and `vfmadd` (correctly rounded, as IEEE requires), `cvtps2pd`
//! (exact) and `cvtpd2ps` (round to nearest). So every type gives
//! the bits of the portable array. (The one exception, [`Vector::Part`]'s
//! least and greatest lanes, combines lanes in an order of its own, which
//! can change the sign of a zero result or which NaN wins; its callers read
//! them only where neither can occur or matter.)
//!
//! The vector types are private to the kernels. Their methods, and the
//! private helpers below that they call (the `Register` impls and the
//! column moves of short rows), execute the instructions of their feature
//! set, so they must only run inside the trampolines below, which are only
//! called after feature detection; that is the safety argument of every
//! `unsafe` block in this file.

use std::arch::x86_64::*;
use std::ops::{Add, Div, Mul, Sub};

use super::simd::{
    chunk_stays_in_page, column_by_column, column_lanes, greatest_lane, least_lane,
    store_column_lanes, through_chunk, transpose_elements, Arith, Lanes, Vector, LANES,
};

pub(super) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

pub(super) fn has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512bw")
}

/// `$function::<D, _>($first, $second)` for whole blocks of rows of `D` elements
/// that move between rows and columns in registers: the powers of two by
/// [`ByRounds`], the lengths listed by [`ByPermutes`]; `$otherwise` for
/// every other block.
macro_rules! in_registers {
    (
        $d:expr, $whole:expr, $function:ident($first:expr, $second:expr),
        [$($length:literal),*], $otherwise:block
    ) => {
        match ($d, $whole) {
            (2, true) => $function::<2, ByRounds>($first, $second),
            (4, true) => $function::<4, ByRounds>($first, $second),
            (8, true) => $function::<8, ByRounds>($first, $second),
            (16, true) => $function::<16, ByRounds>($first, $second),
            $(($length, true) => $function::<$length, ByPermutes>($first, $second),)*
            _ => $otherwise,
        }
    };
}

/// Defines a vector type of `$count` registers of `$width` lanes, with
/// masked moves of partial chunks where `partial` gives them.
macro_rules! vector_type {
    (
        $(#[$doc:meta])*
        $name:ident, $register:ty, $width:literal, $count:literal,
        add: $add:ident, sub: $sub:ident, mul: $mul:ident, div: $div:ident,
        min: $min:ident, max: $max:ident, andnot: $andnot:ident, sqrt: $sqrt:ident, fma: $fma:ident,
        splat: $splat:ident, load: $load:ident, store: $store:ident,
        load_f32: |$load_src:ident| $load_f32:expr,
        store_f32: |$store_value:ident, $store_dst:ident| $store_f32:expr,
        stream: $stream:ident,
        stream_f32: |$stream_low:ident, $stream_high:ident, $stream_dst:ident| $stream_f32:expr,
        within_register: |$reg:ident, $half:ident| $within:expr,
        first: $first:ident,
        $(partial: {
            mask: $mask:ident, mask_f32: $mask_f32:ident,
            load: |$load_first:ident, $load_mask:ident| $load_partial:expr,
            load_f32: |$load32_first:ident, $load32_mask:ident| $load_partial_f32:expr,
            store: |$store_first:ident, $store_mask:ident, $store_partial_value:ident|
                $store_partial:expr,
            store_f32: |$store32_first:ident, $store32_mask:ident, $store32_value:ident|
                $store_partial_f32:expr,
            blend: |$blend_mask:ident, $blend_old:ident, $blend_new:ident| $blend:expr,
        },)?
        overrides: { $($overrides:tt)* } $(,)?
    ) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub(super) struct $name([$register; $count]);

        // Streamed `f32` chunks narrow their registers in pairs.
        const _: () = assert!($count % 2 == 0);

        // No closures below: an intrinsic inlines only into code compiled
        // with its features, and a closure body is compiled without them.

        impl Add for $name {
            type Output = Self;
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn add(self, other: Self) -> Self {
                let mut out = self.0;
                for i in 0..$count {
                    // SAFETY: see the module docs: only reached with the features enabled.
                    out[i] = unsafe { $add(self.0[i], other.0[i]) };
                }
                $name(out)
            }
        }

        impl Sub for $name {
            type Output = Self;
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn sub(self, other: Self) -> Self {
                let mut out = self.0;
                for i in 0..$count {
                    // SAFETY: see the module docs: only reached with the features enabled.
                    out[i] = unsafe { $sub(self.0[i], other.0[i]) };
                }
                $name(out)
            }
        }

        impl Mul for $name {
            type Output = Self;
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn mul(self, other: Self) -> Self {
                let mut out = self.0;
                for i in 0..$count {
                    // SAFETY: see the module docs: only reached with the features enabled.
                    out[i] = unsafe { $mul(self.0[i], other.0[i]) };
                }
                $name(out)
            }
        }

        impl Div for $name {
            type Output = Self;
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn div(self, other: Self) -> Self {
                let mut out = self.0;
                for i in 0..$count {
                    // SAFETY: see the module docs: only reached with the features enabled.
                    out[i] = unsafe { $div(self.0[i], other.0[i]) };
                }
                $name(out)
            }
        }

        impl Arith for $name {
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn splat(value: f64) -> Self {
                // SAFETY: see the module docs: only reached with the features enabled.
                $name([unsafe { $splat(value) }; $count])
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn min_select(self, other: Self) -> Self {
                let mut out = self.0;
                for i in 0..$count {
                    // SAFETY: see the module docs: only reached with the features enabled.
                    // min(other, self) = if other < self { other } else { self }.
                    out[i] = unsafe { $min(other.0[i], self.0[i]) };
                }
                $name(out)
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn max_select(self, other: Self) -> Self {
                let mut out = self.0;
                for i in 0..$count {
                    // SAFETY: see the module docs: only reached with the features enabled.
                    // max(other, self) = if other > self { other } else { self }.
                    out[i] = unsafe { $max(other.0[i], self.0[i]) };
                }
                $name(out)
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn abs(self) -> Self {
                let sign = Self::splat(-0.0);
                let mut out = self.0;
                for i in 0..$count {
                    // SAFETY: see the module docs: only reached with the features enabled.
                    // andnot(sign, x) clears the sign bit.
                    out[i] = unsafe { $andnot(sign.0[i], self.0[i]) };
                }
                $name(out)
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn sqrt(self) -> Self {
                let mut out = self.0;
                for i in 0..$count {
                    // SAFETY: see the module docs: only reached with the features enabled.
                    out[i] = unsafe { $sqrt(self.0[i]) };
                }
                $name(out)
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn mul_add(self, a: Self, b: Self) -> Self {
                let mut out = self.0;
                for i in 0..$count {
                    // SAFETY: see the module docs: only reached with the features enabled.
                    out[i] = unsafe { $fma(self.0[i], a.0[i], b.0[i]) };
                }
                $name(out)
            }
        }

        impl Vector for $name {
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn to_lanes(self) -> Lanes {
                let mut lanes = [0.0; LANES];
                self.store_f64(&mut lanes);
                lanes
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn from_lanes(lanes: &Lanes) -> Self {
                Self::load_f64(lanes)
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn load_f64(chunk: &[f64; LANES]) -> Self {
                let mut out = Self::splat(0.0).0;
                for i in 0..$count {
                    // SAFETY: `i * $width + $width <= LANES`, so the read stays
                    // inside `chunk`; unaligned loads; features: module docs.
                    out[i] = unsafe { $load(chunk.as_ptr().add(i * $width)) };
                }
                $name(out)
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn load_f32(chunk: &[f32; LANES]) -> Self {
                let mut out = Self::splat(0.0).0;
                for i in 0..$count {
                    // SAFETY: `i * $width + $width <= LANES`, so the read stays
                    // inside `chunk`; unaligned loads; features: module docs.
                    out[i] = unsafe {
                        let $load_src = chunk.as_ptr().add(i * $width);
                        $load_f32
                    };
                }
                $name(out)
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn store_f64(self, chunk: &mut [f64; LANES]) {
                for (i, &register) in self.0.iter().enumerate() {
                    // SAFETY: `i * $width + $width <= LANES`, so the write stays
                    // inside `chunk`; unaligned stores; features: module docs.
                    unsafe { $store(chunk.as_mut_ptr().add(i * $width), register) }
                }
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn store_f32(self, chunk: &mut [f32; LANES]) {
                for (i, &$store_value) in self.0.iter().enumerate() {
                    // SAFETY: `i * $width + $width <= LANES`, so the write stays
                    // inside `chunk`; unaligned stores; features: module docs.
                    unsafe {
                        let $store_dst = chunk.as_mut_ptr().add(i * $width);
                        $store_f32
                    }
                }
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn stream_f64(self, chunk: &mut [f64; LANES]) {
                if chunk.as_ptr() as usize % 64 != 0 {
                    return self.store_f64(chunk);
                }
                for (i, &register) in self.0.iter().enumerate() {
                    // SAFETY: `i * $width + $width <= LANES`, so the write stays
                    // inside `chunk`; `chunk` starts on a 64-byte boundary and
                    // each register is `8 · $width` bytes, so every address is
                    // aligned as the non-temporal store requires; features:
                    // module docs.
                    unsafe { $stream(chunk.as_mut_ptr().add(i * $width), register) }
                }
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn stream_f32(self, chunk: &mut [f32; LANES]) {
                if chunk.as_ptr() as usize % 64 != 0 {
                    return self.store_f32(chunk);
                }
                for (i, pair) in self.0.chunks_exact(2).enumerate() {
                    let ($stream_low, $stream_high) = (pair[0], pair[1]);
                    // SAFETY: as in `stream_f64`, with pairs of registers
                    // of `8 · $width` bytes once narrowed.
                    unsafe {
                        let $stream_dst = chunk.as_mut_ptr().add(i * 2 * $width);
                        $stream_f32
                    }
                }
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn lanes_from(self, width: usize) -> Self {
                let mut out = self.0;
                if width >= $width {
                    // Whole registers move down.
                    let registers = width / $width;
                    out[..registers].copy_from_slice(&self.0[registers..2 * registers]);
                } else {
                    // Within the first register: lanes `half .. 2 · half` to `0 .. half`.
                    let ($reg, $half) = (self.0[0], width);
                    // SAFETY: see the module docs: only reached with the features enabled.
                    out[0] = unsafe { $within };
                }
                $name(out)
            }

            #[cfg_attr(not(debug_assertions), inline(always))]
            fn first_lane(self) -> f64 {
                // SAFETY: see the module docs: only reached with the features enabled.
                unsafe { $first(self.0[0]) }
            }

            type Part = $register;
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn part_splat(value: f64) -> $register {
                Self::splat(value).0[0]
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn min_into(self, part: $register) -> $register {
                // The registers in pairs, then the pairs' results, so that
                // the accumulator waits for one instruction per vector.
                let mut registers = self.0;
                let mut count = $count;
                while count > 1 {
                    count /= 2;
                    for i in 0..count {
                        // SAFETY: see the module docs: only reached with the features enabled.
                        registers[i] = unsafe { $min(registers[i], registers[i + count]) };
                    }
                }
                // SAFETY: as above.
                unsafe { $min(registers[0], part) }
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn max_into(self, part: $register) -> $register {
                let mut registers = self.0;
                let mut count = $count;
                while count > 1 {
                    count /= 2;
                    for i in 0..count {
                        // SAFETY: see the module docs: only reached with the features enabled.
                        registers[i] = unsafe { $max(registers[i], registers[i + count]) };
                    }
                }
                // SAFETY: as above.
                unsafe { $max(registers[0], part) }
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn part_min(part: $register) -> f64 {
                // Every register a copy of the part; the halving steps stay
                // within the first.
                least_lane($name([part; $count]), $width)
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn part_max(part: $register) -> f64 {
                greatest_lane($name([part; $count]), $width)
            }

            // A row's last, partial chunk by masked moves, which fault on and
            // write no memory outside the mask, rather than through a padded
            // copy on the stack (whose scalar stores a vector load cannot take
            // forwarded). Registers wholly past the tail are not moved, and
            // tails whose masked-off lanes would lie on another page take the
            // copy (see `chunk_stays_in_page`).
            $(
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn load_partial_f64(tail: &[f64]) -> Self {
                debug_assert!(tail.len() < LANES);
                if !chunk_stays_in_page(tail) {
                    return through_chunk::load_f64(tail);
                }
                let mut out = Self::splat(0.0).0;
                for (i, register) in out.iter_mut().enumerate() {
                    if $width * i >= tail.len() {
                        break;
                    }
                    // SAFETY: `$width · i < tail.len()`, so the pointer lies
                    // inside `tail`; the masked load reads only the lanes
                    // below `tail.len()`, all inside `tail`, and lanes that
                    // are off never fault; features: module docs.
                    *register = unsafe {
                        let $load_first = tail.as_ptr().add($width * i);
                        let $load_mask = $mask(tail.len(), i);
                        $load_partial
                    };
                }
                $name(out)
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn load_partial_f32(tail: &[f32]) -> Self {
                debug_assert!(tail.len() < LANES);
                if !chunk_stays_in_page(tail) {
                    return through_chunk::load_f32(tail);
                }
                let mut out = Self::splat(0.0).0;
                for (i, register) in out.iter_mut().enumerate() {
                    if $width * i >= tail.len() {
                        break;
                    }
                    // SAFETY: as in `load_partial_f64`.
                    *register = unsafe {
                        let $load32_first = tail.as_ptr().add($width * i);
                        let $load32_mask = $mask_f32(tail.len(), i);
                        $load_partial_f32
                    };
                }
                $name(out)
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn store_partial_f64(self, tail: &mut [f64]) {
                debug_assert!(tail.len() < LANES);
                if !chunk_stays_in_page(tail) {
                    return through_chunk::store_f64(self, tail);
                }
                for (i, &$store_partial_value) in self.0.iter().enumerate() {
                    if $width * i >= tail.len() {
                        break;
                    }
                    // SAFETY: as in `load_partial_f64`: only the lanes below
                    // `tail.len()` are written, all inside `tail`.
                    unsafe {
                        let $store_first = tail.as_mut_ptr().add($width * i);
                        let $store_mask = $mask(tail.len(), i);
                        $store_partial
                    }
                }
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn store_partial_f32(self, tail: &mut [f32]) {
                debug_assert!(tail.len() < LANES);
                if !chunk_stays_in_page(tail) {
                    return through_chunk::store_f32(self, tail);
                }
                for (i, &$store32_value) in self.0.iter().enumerate() {
                    if $width * i >= tail.len() {
                        break;
                    }
                    // SAFETY: as in `store_partial_f64`.
                    unsafe {
                        let $store32_first = tail.as_mut_ptr().add($width * i);
                        let $store32_mask = $mask_f32(tail.len(), i);
                        $store_partial_f32
                    }
                }
            }
            #[cfg_attr(not(debug_assertions), inline(always))]
            fn blend(self, old: Self, active: usize) -> Self {
                let mut out = old.0;
                for (i, register) in out.iter_mut().enumerate() {
                    // SAFETY: see the module docs: only reached with the
                    // features enabled.
                    *register = unsafe {
                        let ($blend_mask, $blend_old, $blend_new) =
                            ($mask(active, i), *register, self.0[i]);
                        $blend
                    };
                }
                $name(out)
            }
            )?

            $($overrides)*
        }
    };
}

vector_type! {
    /// 16 lanes in 4 AVX registers.
    Avx2, __m256d, 4, 4,
    add: _mm256_add_pd, sub: _mm256_sub_pd, mul: _mm256_mul_pd, div: _mm256_div_pd,
    min: _mm256_min_pd, max: _mm256_max_pd, andnot: _mm256_andnot_pd, sqrt: _mm256_sqrt_pd, fma: _mm256_fmadd_pd,
    splat: _mm256_set1_pd, load: _mm256_loadu_pd, store: _mm256_storeu_pd,
    load_f32: |src| _mm256_cvtps_pd(_mm_loadu_ps(src)),
    store_f32: |value, dst| _mm_storeu_ps(dst, _mm256_cvtpd_ps(value)),
    stream: _mm256_stream_pd,
    stream_f32: |low, high, dst| _mm256_stream_ps(dst, _mm256_set_m128(_mm256_cvtpd_ps(high), _mm256_cvtpd_ps(low))),
    within_register: |register, half| match half {
        2 => _mm256_permute2f128_pd::<0x01>(register, register),
        _ => _mm256_permute_pd::<0b0101>(register),
    },
    first: _mm256_cvtsd_f64,
    partial: {
        mask: avx2_mask, mask_f32: avx2_mask_32,
        load: |first, mask| _mm256_maskload_pd(first, mask),
        load_f32: |first, mask| _mm256_cvtps_pd(_mm_maskload_ps(first, mask)),
        store: |first, mask, value| _mm256_maskstore_pd(first, mask, value),
        store_f32: |first, mask, value| _mm_maskstore_ps(first, mask, _mm256_cvtpd_ps(value)),
        blend: |mask, old, new| _mm256_blendv_pd(old, new, _mm256_castsi256_pd(mask)),
    },
    // The squares of Fortran-order blocks, and blocks of 16 short rows whose
    // length is a power of two, move between rows and columns in registers.
    // AVX2 has neither the two-register permutes that AVX-512 uses for the
    // other lengths nor scatters: their columns are gathered, and stored
    // one element at a time.
    overrides: {
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn all_within(self, low: f64, high: f64) -> bool {
            // SAFETY: see the module docs: only reached with the features enabled.
            // Ordered comparisons: false for a NaN lane.
            unsafe {
                let (low, high) = (_mm256_set1_pd(low), _mm256_set1_pd(high));
                let mut inside = _mm256_cmp_pd::<_CMP_EQ_OQ>(low, low);
                for register in self.0 {
                    let above = _mm256_cmp_pd::<_CMP_GE_OQ>(register, low);
                    let below = _mm256_cmp_pd::<_CMP_LE_OQ>(register, high);
                    inside = _mm256_and_pd(inside, _mm256_and_pd(above, below));
                }
                _mm256_movemask_pd(inside) == 0b1111
            }
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn load_column_f32(rows: &[f32], j: usize, d: usize) -> Self {
            if !column_fits(rows.len(), j, d) {
                return Self::from_lanes(&column_lanes(rows, j, d));
            }
            // SAFETY: `column_fits`: every offset `l · d + j` (l < 16) is
            // inside `rows` and fits an `i32`; features: module docs.
            unsafe {
                let start = rows.as_ptr().add(j);
                let (first, second) = avx2_column_offsets(d);
                let first = _mm256_i32gather_ps::<4>(start, first);
                let second = _mm256_i32gather_ps::<4>(start, second);
                Avx2([
                    _mm256_cvtps_pd(_mm256_castps256_ps128(first)),
                    _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(first)),
                    _mm256_cvtps_pd(_mm256_castps256_ps128(second)),
                    _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(second)),
                ])
            }
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn load_column_f64(rows: &[f64], j: usize, d: usize) -> Self {
            if !column_fits(rows.len(), j, d) {
                return Self::from_lanes(&column_lanes(rows, j, d));
            }
            // SAFETY: as in `load_column_f32`.
            unsafe {
                let start = rows.as_ptr().add(j);
                let (first, second) = avx2_column_offsets(d);
                Avx2([
                    _mm256_i32gather_pd::<8>(start, _mm256_castsi256_si128(first)),
                    _mm256_i32gather_pd::<8>(start, _mm256_extracti128_si256::<1>(first)),
                    _mm256_i32gather_pd::<8>(start, _mm256_castsi256_si128(second)),
                    _mm256_i32gather_pd::<8>(start, _mm256_extracti128_si256::<1>(second)),
                ])
            }
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn transpose_square_f32(src: &[f32], src_lead: usize, dst: &mut [f32], dst_lead: usize) {
            if !square_fits(src.len(), src_lead, 16) || !square_fits(dst.len(), dst_lead, 16) {
                return transpose_elements(src, src_lead, dst, dst_lead, 0..16, 0..16);
            }
            for (i, j) in [(0, 0), (0, 8), (8, 0), (8, 8)] {
                // SAFETY: `square_fits`: lines `i .. i + 8` of `src`, 8
                // elements from column `j`, and lines `j .. j + 8` of `dst`,
                // 8 from `i`, lie inside the squares checked; features:
                // module docs.
                unsafe {
                    let mut lines = [_mm256_setzero_ps(); 8];
                    for (k, line) in lines.iter_mut().enumerate() {
                        *line = _mm256_loadu_ps(src.as_ptr().add((i + k) * src_lead + j));
                    }
                    for (k, line) in transpose_8x8(lines).into_iter().enumerate() {
                        _mm256_storeu_ps(dst.as_mut_ptr().add((j + k) * dst_lead + i), line);
                    }
                }
            }
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn transpose_square_f64(src: &[f64], src_lead: usize, dst: &mut [f64], dst_lead: usize) {
            if !square_fits(src.len(), src_lead, 8) || !square_fits(dst.len(), dst_lead, 8) {
                return transpose_elements(src, src_lead, dst, dst_lead, 0..8, 0..8);
            }
            for (i, j) in [(0, 0), (0, 4), (4, 0), (4, 4)] {
                // SAFETY: as in `transpose_square_f32`, for quarters of 4
                // lines of 4 of a square of 8.
                unsafe {
                    let mut lines = [_mm256_setzero_pd(); 4];
                    for (k, line) in lines.iter_mut().enumerate() {
                        *line = _mm256_loadu_pd(src.as_ptr().add((i + k) * src_lead + j));
                    }
                    for (k, line) in transpose_4x4(lines).into_iter().enumerate() {
                        _mm256_storeu_pd(dst.as_mut_ptr().add((j + k) * dst_lead + i), line);
                    }
                }
            }
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn load_columns_f32(rows: &[f32], d: usize, columns: &mut [Self; LANES]) {
            let whole = rows.len() == LANES * d;
            in_registers!(d, whole, avx2_load_f32_columns(rows, columns), [], {
                column_by_column::load_f32(rows, d, columns)
            })
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn load_columns_f64(rows: &[f64], d: usize, columns: &mut [Self; LANES]) {
            let whole = rows.len() == LANES * d;
            in_registers!(d, whole, avx2_load_f64_columns(rows, columns), [], {
                column_by_column::load_f64(rows, d, columns)
            })
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn store_columns_f32(columns: &[Self; LANES], rows: &mut [f32], d: usize) {
            let whole = rows.len() == LANES * d;
            in_registers!(d, whole, avx2_store_f32_columns(columns, rows), [], {
                column_by_column::store_f32(columns, rows, d)
            })
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn store_columns_f64(columns: &[Self; LANES], rows: &mut [f64], d: usize) {
            let whole = rows.len() == LANES * d;
            in_registers!(d, whole, avx2_store_f64_columns(columns, rows), [], {
                column_by_column::store_f64(columns, rows, d)
            })
        }
    },
}

vector_type! {
    /// 16 lanes in 2 AVX-512 registers.
    Avx512, __m512d, 8, 2,
    add: _mm512_add_pd, sub: _mm512_sub_pd, mul: _mm512_mul_pd, div: _mm512_div_pd,
    min: _mm512_min_pd, max: _mm512_max_pd, andnot: _mm512_andnot_pd, sqrt: _mm512_sqrt_pd, fma: _mm512_fmadd_pd,
    splat: _mm512_set1_pd, load: _mm512_loadu_pd, store: _mm512_storeu_pd,
    load_f32: |src| _mm512_cvtps_pd(_mm256_loadu_ps(src)),
    store_f32: |value, dst| _mm256_storeu_ps(dst, _mm512_cvtpd_ps(value)),
    stream: _mm512_stream_pd,
    stream_f32: |low, high, dst| _mm512_stream_ps(dst, _mm512_insertf32x8::<1>(_mm512_castps256_ps512(_mm512_cvtpd_ps(low)), _mm512_cvtpd_ps(high))),
    within_register: |register, half| match half {
        4 => _mm512_shuffle_f64x2::<0xEE>(register, register),
        2 => _mm512_shuffle_f64x2::<0x01>(register, register),
        _ => _mm512_permute_pd::<0x55>(register),
    },
    first: _mm512_cvtsd_f64,
    partial: {
        mask: avx512_mask, mask_f32: avx512_mask,
        load: |first, mask| _mm512_maskz_loadu_pd(mask, first),
        load_f32: |first, mask| _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mask, first)),
        store: |first, mask, value| _mm512_mask_storeu_pd(first, mask, value),
        store_f32: |first, mask, value| _mm256_mask_storeu_ps(first, mask, _mm512_cvtpd_ps(value)),
        blend: |mask, old, new| _mm512_mask_blend_pd(mask, old, new),
    },
    // Column moves of short rows: gathers and scatters with the offsets
    // `l · d` from element `j` (one instruction per 16 `f32` or 8 `f64`
    // lanes, where the portable column moves one element at a time), and
    // register moves of whole blocks below.
    overrides: {
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn all_within(self, low: f64, high: f64) -> bool {
            // SAFETY: see the module docs: only reached with the features enabled.
            // Ordered comparisons: false for a NaN lane.
            unsafe {
                let (low, high) = (_mm512_set1_pd(low), _mm512_set1_pd(high));
                let mut inside = 0xFF;
                for register in self.0 {
                    inside &= _mm512_cmp_pd_mask::<_CMP_GE_OQ>(register, low)
                        & _mm512_cmp_pd_mask::<_CMP_LE_OQ>(register, high);
                }
                inside == 0xFF
            }
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn load_column_f32(rows: &[f32], j: usize, d: usize) -> Self {
            if !column_fits(rows.len(), j, d) {
                return Self::from_lanes(&column_lanes(rows, j, d));
            }
            // SAFETY: `column_fits`: every offset `l · d + j` (l < 16) is
            // inside `rows` and fits an `i32`; features: module docs.
            unsafe {
                let wide = _mm512_i32gather_ps::<4>(column_offsets(d), rows.as_ptr().add(j));
                let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(wide));
                Avx512([
                    _mm512_cvtps_pd(_mm512_castps512_ps256(wide)),
                    _mm512_cvtps_pd(_mm256_castpd_ps(high)),
                ])
            }
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn load_column_f64(rows: &[f64], j: usize, d: usize) -> Self {
            if !column_fits(rows.len(), j, d) {
                return Self::from_lanes(&column_lanes(rows, j, d));
            }
            // SAFETY: as in `load_column_f32`.
            unsafe {
                let offsets = column_offsets(d);
                let start = rows.as_ptr().add(j);
                Avx512([
                    _mm512_i32gather_pd::<8>(_mm512_castsi512_si256(offsets), start),
                    _mm512_i32gather_pd::<8>(_mm512_extracti64x4_epi64::<1>(offsets), start),
                ])
            }
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn store_column_f32(self, rows: &mut [f32], j: usize, d: usize) {
            if !column_fits(rows.len(), j, d) {
                return store_column_lanes(self.to_lanes(), rows, j, d);
            }
            // SAFETY: as in `load_column_f32`; the offsets are distinct, so
            // no two lanes write the same element.
            unsafe {
                let low = _mm512_cvtpd_ps(self.0[0]);
                let high = _mm512_cvtpd_ps(self.0[1]);
                let narrow = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(low), high);
                _mm512_i32scatter_ps::<4>(rows.as_mut_ptr().add(j), column_offsets(d), narrow);
            }
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn store_column_f64(self, rows: &mut [f64], j: usize, d: usize) {
            if !column_fits(rows.len(), j, d) {
                return store_column_lanes(self.to_lanes(), rows, j, d);
            }
            // SAFETY: as in `store_column_f32`.
            unsafe {
                let offsets = column_offsets(d);
                let start = rows.as_mut_ptr().add(j);
                _mm512_i32scatter_pd::<8>(start, _mm512_castsi512_si256(offsets), self.0[0]);
                _mm512_i32scatter_pd::<8>(start, _mm512_extracti64x4_epi64::<1>(offsets), self.0[1]);
            }
        }
        // A square of a cache line of elements each way moves in registers
        // by the rounds of `rows_to_columns`: 16 `f32` lines, or 8 `f64`.
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn transpose_square_f32(src: &[f32], src_lead: usize, dst: &mut [f32], dst_lead: usize) {
            if !square_fits(src.len(), src_lead, 16) || !square_fits(dst.len(), dst_lead, 16) {
                return transpose_elements(src, src_lead, dst, dst_lead, 0..16, 0..16);
            }
            // SAFETY: `square_fits`: line `i < 16` of either slice, 16
            // elements from `i · lead`, lies inside it; features: module docs.
            unsafe {
                let mut lines = [_mm512_setzero_ps(); 16];
                for (i, line) in lines.iter_mut().enumerate() {
                    *line = _mm512_loadu_ps(src.as_ptr().add(i * src_lead));
                }
                for (j, line) in rows_to_columns(lines).into_iter().enumerate() {
                    _mm512_storeu_ps(dst.as_mut_ptr().add(j * dst_lead), line);
                }
            }
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn transpose_square_f64(src: &[f64], src_lead: usize, dst: &mut [f64], dst_lead: usize) {
            if !square_fits(src.len(), src_lead, 8) || !square_fits(dst.len(), dst_lead, 8) {
                return transpose_elements(src, src_lead, dst, dst_lead, 0..8, 0..8);
            }
            // SAFETY: as in `transpose_square_f32`, for 8 lines of 8.
            unsafe {
                let mut lines = [_mm512_setzero_pd(); 8];
                for (i, line) in lines.iter_mut().enumerate() {
                    *line = _mm512_loadu_pd(src.as_ptr().add(i * src_lead));
                }
                for (j, line) in rows_to_columns(lines).into_iter().enumerate() {
                    _mm512_storeu_pd(dst.as_mut_ptr().add(j * dst_lead), line);
                }
            }
        }
        // Whole blocks of 16 rows of 2 to 8 elements or of 16 are moved
        // between rows and columns in registers (`rows_to_columns` for
        // powers of two, the permutes of `BlockPermutes` otherwise)
        // instead of gathered and scattered one column at a time. Rows of
        // 9 to 15 elements keep the gathers: a column then touches up to 8
        // register pairs, and the permutes and blends cost more than the
        // gathers they replace. So do `f64` rows of 7, where the permutes
        // gain nothing (PERFORMANCE.md, "Short rows, 16 at a time").
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn load_columns_f32(rows: &[f32], d: usize, columns: &mut [Self; LANES]) {
            let whole = rows.len() == LANES * d;
            in_registers!(d, whole, load_f32_columns(rows, columns), [3, 5, 6, 7], {
                column_by_column::load_f32(rows, d, columns)
            })
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn load_columns_f64(rows: &[f64], d: usize, columns: &mut [Self; LANES]) {
            let whole = rows.len() == LANES * d;
            in_registers!(d, whole, load_f64_columns(rows, columns), [3, 5, 6], {
                column_by_column::load_f64(rows, d, columns)
            })
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn store_columns_f32(columns: &[Self; LANES], rows: &mut [f32], d: usize) {
            let whole = rows.len() == LANES * d;
            in_registers!(d, whole, store_f32_columns(columns, rows), [3, 5, 6, 7], {
                column_by_column::store_f32(columns, rows, d)
            })
        }
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn store_columns_f64(columns: &[Self; LANES], rows: &mut [f64], d: usize) {
            let whole = rows.len() == LANES * d;
            in_registers!(d, whole, store_f64_columns(columns, rows), [3, 5, 6], {
                column_by_column::store_f64(columns, rows, d)
            })
        }
    },
}

/// An AVX-512 or AVX2 register of `f32` or `f64` lanes, as the column
/// moves of short rows ([`ColumnMoves`]) handle them.
trait Register: Copy {
    /// Lanes per register.
    const WIDTH: usize;
    /// Every lane zero.
    fn zero() -> Self;
    /// The even elements of `self` followed by `next`, and the odd ones.
    fn split_even_odd(self, next: Self) -> (Self, Self);
    /// The inverse of [`Register::split_even_odd`].
    fn interleave(even: Self, odd: Self) -> (Self, Self);
}

/// A [`Register`] with a permute across two registers (AVX-512's
/// `vpermt2ps`/`vpermt2pd`), which [`ByPermutes`] needs.
trait PermuteRegister: Register {
    /// `onto`, with each lane `i` set in `lanes` replaced by element
    /// `indices[i]` of `self` followed by `next`.
    fn permute_onto(self, next: Self, indices: &[i32; 16], lanes: u16, onto: Self) -> Self;
}

impl Register for __m512 {
    const WIDTH: usize = 16;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn zero() -> Self {
        // SAFETY: only reached from the methods of `Avx512`: module docs.
        unsafe { _mm512_setzero_ps() }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn split_even_odd(self, next: Self) -> (Self, Self) {
        // SAFETY: as in `zero`.
        unsafe {
            let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
            (
                _mm512_permutex2var_ps(self, even, next),
                _mm512_permutex2var_ps(self, odd, next),
            )
        }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn interleave(even: Self, odd: Self) -> (Self, Self) {
        // SAFETY: as in `zero`.
        unsafe {
            let low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            let high =
                _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
            (
                _mm512_permutex2var_ps(even, low, odd),
                _mm512_permutex2var_ps(even, high, odd),
            )
        }
    }
}

impl PermuteRegister for __m512 {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn permute_onto(self, next: Self, indices: &[i32; 16], lanes: u16, onto: Self) -> Self {
        // SAFETY: as in `zero`; the load reads the whole array.
        unsafe {
            let indices = _mm512_loadu_si512(indices.as_ptr().cast());
            _mm512_mask_blend_ps(lanes, onto, _mm512_permutex2var_ps(self, indices, next))
        }
    }
}

impl Register for __m512d {
    const WIDTH: usize = 8;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn zero() -> Self {
        // SAFETY: as for `__m512`.
        unsafe { _mm512_setzero_pd() }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn split_even_odd(self, next: Self) -> (Self, Self) {
        // SAFETY: as for `__m512`.
        unsafe {
            let even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
            let odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
            (
                _mm512_permutex2var_pd(self, even, next),
                _mm512_permutex2var_pd(self, odd, next),
            )
        }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn interleave(even: Self, odd: Self) -> (Self, Self) {
        // SAFETY: as for `__m512`.
        unsafe {
            let low = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
            let high = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
            (
                _mm512_permutex2var_pd(even, low, odd),
                _mm512_permutex2var_pd(even, high, odd),
            )
        }
    }
}

impl PermuteRegister for __m512d {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn permute_onto(self, next: Self, indices: &[i32; 16], lanes: u16, onto: Self) -> Self {
        // SAFETY: as for `__m512`; the load reads the first half of the array.
        unsafe {
            let indices = _mm512_cvtepi32_epi64(_mm256_loadu_si256(indices.as_ptr().cast()));
            _mm512_mask_blend_pd(
                lanes as u8,
                onto,
                _mm512_permutex2var_pd(self, indices, next),
            )
        }
    }
}

impl Register for __m256 {
    const WIDTH: usize = 8;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn zero() -> Self {
        // SAFETY: only reached from the methods of `Avx2`: module docs.
        unsafe { _mm256_setzero_ps() }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn split_even_odd(self, next: Self) -> (Self, Self) {
        // SAFETY: as in `zero`.
        unsafe {
            // Within each 128-bit half, `a0 a2 b0 b2 | a4 a6 b4 b6` (and the
            // odd elements alike); the pairs then move into order.
            let even = _mm256_castps_pd(_mm256_shuffle_ps::<0b10_00_10_00>(self, next));
            let odd = _mm256_castps_pd(_mm256_shuffle_ps::<0b11_01_11_01>(self, next));
            (
                _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(even)),
                _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(odd)),
            )
        }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn interleave(even: Self, odd: Self) -> (Self, Self) {
        // SAFETY: as in `zero`.
        unsafe {
            // `e0 o0 e1 o1 | e4 o4 e5 o5` and `e2 o2 e3 o3 | e6 o6 e7 o7`.
            let low = _mm256_unpacklo_ps(even, odd);
            let high = _mm256_unpackhi_ps(even, odd);
            (
                _mm256_permute2f128_ps::<0x20>(low, high),
                _mm256_permute2f128_ps::<0x31>(low, high),
            )
        }
    }
}

impl Register for __m256d {
    const WIDTH: usize = 4;
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn zero() -> Self {
        // SAFETY: as for `__m256`.
        unsafe { _mm256_setzero_pd() }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn split_even_odd(self, next: Self) -> (Self, Self) {
        // SAFETY: as for `__m256`.
        unsafe {
            // `a0 b0 a2 b2` and `a1 b1 a3 b3`, then the middle two swapped.
            let even = _mm256_unpacklo_pd(self, next);
            let odd = _mm256_unpackhi_pd(self, next);
            (
                _mm256_permute4x64_pd::<0b11_01_10_00>(even),
                _mm256_permute4x64_pd::<0b11_01_10_00>(odd),
            )
        }
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn interleave(even: Self, odd: Self) -> (Self, Self) {
        // SAFETY: as for `__m256`.
        unsafe {
            // `e0 e2 e1 e3` and `o0 o2 o1 o3`, then paired up within halves.
            let even = _mm256_permute4x64_pd::<0b11_01_10_00>(even);
            let odd = _mm256_permute4x64_pd::<0b11_01_10_00>(odd);
            (_mm256_unpacklo_pd(even, odd), _mm256_unpackhi_pd(even, odd))
        }
    }
}

/// 8 lines of 8 `f32` transposed: register `j` of the result holds
/// element `j` of every line, in line order. Three rounds of shuffles
/// (pairs of lines, pairs of pairs, halves), 24 in all: the rounds of
/// [`rows_to_columns`] would take 48 here, half of them across the
/// register's 128-bit halves, so the squares of Fortran-order tiles take
/// this classic transpose (and [`transpose_4x4`], 8 shuffles against 16).
#[cfg_attr(not(debug_assertions), inline(always))]
fn transpose_8x8(lines: [__m256; 8]) -> [__m256; 8] {
    // SAFETY: only reached from the methods of `Avx2`: module docs.
    unsafe {
        // Lines 2k and 2k + 1 interleaved: `l0 m0 l1 m1 | l4 m4 l5 m5` and
        // `l2 m2 l3 m3 | l6 m6 l7 m7`.
        let mut pairs = [_mm256_setzero_ps(); 8];
        for k in 0..4 {
            pairs[2 * k] = _mm256_unpacklo_ps(lines[2 * k], lines[2 * k + 1]);
            pairs[2 * k + 1] = _mm256_unpackhi_ps(lines[2 * k], lines[2 * k + 1]);
        }
        // Four lines' elements `c` (halves: `c` and `c + 4`), lines
        // 0 - 3 in quads 0 - 3, lines 4 - 7 in quads 4 - 7.
        let mut quads = [_mm256_setzero_ps(); 8];
        for half in 0..2 {
            let (p, q) = (4 * half, 4 * half + 2);
            quads[4 * half] = _mm256_shuffle_ps::<0b01_00_01_00>(pairs[p], pairs[q]);
            quads[4 * half + 1] = _mm256_shuffle_ps::<0b11_10_11_10>(pairs[p], pairs[q]);
            quads[4 * half + 2] = _mm256_shuffle_ps::<0b01_00_01_00>(pairs[p + 1], pairs[q + 1]);
            quads[4 * half + 3] = _mm256_shuffle_ps::<0b11_10_11_10>(pairs[p + 1], pairs[q + 1]);
        }
        let mut columns = [_mm256_setzero_ps(); 8];
        for c in 0..4 {
            columns[c] = _mm256_permute2f128_ps::<0x20>(quads[c], quads[c + 4]);
            columns[c + 4] = _mm256_permute2f128_ps::<0x31>(quads[c], quads[c + 4]);
        }
        columns
    }
}

/// 4 lines of 4 `f64` transposed, as [`transpose_8x8`] does for `f32`.
#[cfg_attr(not(debug_assertions), inline(always))]
fn transpose_4x4(lines: [__m256d; 4]) -> [__m256d; 4] {
    // SAFETY: only reached from the methods of `Avx2`: module docs.
    unsafe {
        // `l0 m0 l2 m2` and `l1 m1 l3 m3` for lines 0, 1 and for 2, 3.
        let low = _mm256_unpacklo_pd(lines[0], lines[1]);
        let high = _mm256_unpackhi_pd(lines[0], lines[1]);
        let next_low = _mm256_unpacklo_pd(lines[2], lines[3]);
        let next_high = _mm256_unpackhi_pd(lines[2], lines[3]);
        [
            _mm256_permute2f128_pd::<0x20>(low, next_low),
            _mm256_permute2f128_pd::<0x20>(high, next_high),
            _mm256_permute2f128_pd::<0x31>(low, next_low),
            _mm256_permute2f128_pd::<0x31>(high, next_high),
        ]
    }
}

/// Transposes rows of `D` elements (`D` = 2, 4, 8 or 16) that fill `D`
/// registers in row order, so that register `j` holds element `j` of every
/// row, in row order.
///
/// Each of the `log₂ D` rounds splits every pair of neighbouring registers
/// into its even and its odd elements, the even halves first. Element
/// `r · D + j` (row `r`, column `j`) thereby sheds one bit of `j` from its
/// position within the rows per round and gains it in the register index,
/// so after the last round register `j` holds the elements `r · D + j` in
/// increasing `r`: column `j`. `blocks_of_rows_give_the_bits_of_single_rows`
/// checks the outcome against rows taken one by one, bit for bit.
#[cfg_attr(not(debug_assertions), inline(always))]
fn rows_to_columns<R: Register, const D: usize>(mut registers: [R; D]) -> [R; D] {
    let mut width = D;
    while width > 1 {
        let mut next = registers;
        for i in 0..D / 2 {
            let (even, odd) = registers[2 * i].split_even_odd(registers[2 * i + 1]);
            next[i] = even;
            next[D / 2 + i] = odd;
        }
        registers = next;
        width /= 2;
    }
    registers
}

/// The inverse of [`rows_to_columns`]: each round undoes one of its rounds.
#[cfg_attr(not(debug_assertions), inline(always))]
fn columns_to_rows<R: Register, const D: usize>(mut registers: [R; D]) -> [R; D] {
    let mut width = D;
    while width > 1 {
        let mut next = registers;
        for i in 0..D / 2 {
            let (low, high) = R::interleave(registers[i], registers[D / 2 + i]);
            next[2 * i] = low;
            next[2 * i + 1] = high;
        }
        registers = next;
        width /= 2;
    }
    registers
}

/// How rows of `D` elements, as many as a register of `R` has lanes, move
/// between rows and columns in registers.
trait ColumnMoves<R, const D: usize> {
    /// Registers of rows in order (as many rows as a register has lanes)
    /// to columns.
    fn columns(rows: [R; D]) -> [R; D];
    /// The inverse of [`ColumnMoves::columns`].
    fn rows(columns: [R; D]) -> [R; D];
}

/// [`rows_to_columns`] and back, for `D` a power of two.
struct ByRounds;

impl<R: Register, const D: usize> ColumnMoves<R, D> for ByRounds {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn columns(rows: [R; D]) -> [R; D] {
        const { assert!(D.is_power_of_two()) };
        rows_to_columns(rows)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn rows(columns: [R; D]) -> [R; D] {
        const { assert!(D.is_power_of_two()) };
        columns_to_rows(columns)
    }
}

/// The permutes of [`BlockPermutes`], for any `D`.
struct ByPermutes;

impl<R: PermuteRegister, const D: usize> ColumnMoves<R, D> for ByPermutes {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn columns(rows: [R; D]) -> [R; D] {
        let table = if R::WIDTH == 16 {
            &BlockPermutes::<D>::LOAD_16
        } else {
            &BlockPermutes::<D>::LOAD_8
        };
        permute_pairs(&rows, table)
    }
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn rows(columns: [R; D]) -> [R; D] {
        let table = if R::WIDTH == 16 {
            &BlockPermutes::<D>::STORE_16
        } else {
            &BlockPermutes::<D>::STORE_8
        };
        permute_pairs(&columns, table)
    }
}

/// [`Vector::load_columns_f32`] of `rows`, 16 rows of `D` elements.
#[cfg_attr(not(debug_assertions), inline(always))]
fn load_f32_columns<const D: usize, M: ColumnMoves<__m512, D>>(
    rows: &[f32],
    columns: &mut [Avx512; LANES],
) {
    // SAFETY: only reached from the methods of `Avx512` (module docs).
    let mut registers = unsafe { [_mm512_setzero_ps(); D] };
    for (register, chunk) in registers.iter_mut().zip(rows.as_chunks::<16>().0) {
        // SAFETY: features as above; the load reads one whole chunk.
        *register = unsafe { _mm512_loadu_ps(chunk.as_ptr()) };
    }
    for (column, register) in columns.iter_mut().zip(M::columns(registers)) {
        // SAFETY: features as above; no memory is accessed.
        *column = unsafe {
            let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(register));
            Avx512([
                _mm512_cvtps_pd(_mm512_castps512_ps256(register)),
                _mm512_cvtps_pd(_mm256_castpd_ps(high)),
            ])
        };
    }
}

/// [`Vector::load_columns_f64`] of `rows`, 16 rows of `D` elements: rows
/// 0 - 7 and 8 - 15 are transposed apart, into the two registers of each
/// column.
#[cfg_attr(not(debug_assertions), inline(always))]
fn load_f64_columns<const D: usize, M: ColumnMoves<__m512d, D>>(
    rows: &[f64],
    columns: &mut [Avx512; LANES],
) {
    // SAFETY: as in `load_f32_columns`.
    let mut registers = unsafe { [[_mm512_setzero_pd(); D]; 2] };
    let (chunks, _) = rows.as_chunks::<8>();
    for (half, half_chunks) in registers.iter_mut().zip(chunks.chunks(D)) {
        for (register, chunk) in half.iter_mut().zip(half_chunks) {
            // SAFETY: as in `load_f32_columns`.
            *register = unsafe { _mm512_loadu_pd(chunk.as_ptr()) };
        }
    }
    let [first, second] = registers;
    let pairs = M::columns(first).into_iter().zip(M::columns(second));
    for (column, (low, high)) in columns.iter_mut().zip(pairs) {
        *column = Avx512([low, high]);
    }
}

/// [`Vector::store_columns_f32`] into `rows`, 16 rows of `D` elements.
#[cfg_attr(not(debug_assertions), inline(always))]
fn store_f32_columns<const D: usize, M: ColumnMoves<__m512, D>>(
    columns: &[Avx512; LANES],
    rows: &mut [f32],
) {
    // SAFETY: as in `load_f32_columns`.
    let mut registers = unsafe { [_mm512_setzero_ps(); D] };
    for (register, column) in registers.iter_mut().zip(columns) {
        // SAFETY: as in `load_f32_columns`.
        *register = unsafe {
            let low = _mm512_cvtpd_ps(column.0[0]);
            let high = _mm512_cvtpd_ps(column.0[1]);
            _mm512_insertf32x8::<1>(_mm512_castps256_ps512(low), high)
        };
    }
    let chunks = rows.as_chunks_mut::<16>().0;
    for (chunk, register) in chunks.iter_mut().zip(M::rows(registers)) {
        // SAFETY: features as above; the store writes one whole chunk.
        unsafe { _mm512_storeu_ps(chunk.as_mut_ptr(), register) };
    }
}

/// [`Vector::store_columns_f64`] into `rows`, 16 rows of `D` elements.
#[cfg_attr(not(debug_assertions), inline(always))]
fn store_f64_columns<const D: usize, M: ColumnMoves<__m512d, D>>(
    columns: &[Avx512; LANES],
    rows: &mut [f64],
) {
    // SAFETY: as in `store_f32_columns`.
    let mut registers = unsafe { [[_mm512_setzero_pd(); D]; 2] };
    for (j, column) in columns.iter().enumerate().take(D) {
        registers[0][j] = column.0[0];
        registers[1][j] = column.0[1];
    }
    let chunks = rows.as_chunks_mut::<8>().0;
    for (half_chunks, half) in chunks.chunks_mut(D).zip(registers) {
        for (chunk, register) in half_chunks.iter_mut().zip(M::rows(half)) {
            // SAFETY: as in `store_f32_columns`.
            unsafe { _mm512_storeu_pd(chunk.as_mut_ptr(), register) };
        }
    }
}

/// [`Vector::load_columns_f32`] with AVX2, 16 rows of `D` elements: rows
/// 0 - 7 and 8 - 15 are transposed apart, and each half of a column widens
/// into two registers.
#[cfg_attr(not(debug_assertions), inline(always))]
fn avx2_load_f32_columns<const D: usize, M: ColumnMoves<__m256, D>>(
    rows: &[f32],
    columns: &mut [Avx2; LANES],
) {
    // SAFETY: only reached from the methods of `Avx2` (module docs).
    let mut registers = unsafe { [[_mm256_setzero_ps(); D]; 2] };
    let (chunks, _) = rows.as_chunks::<8>();
    for (half, half_chunks) in registers.iter_mut().zip(chunks.chunks(D)) {
        for (register, chunk) in half.iter_mut().zip(half_chunks) {
            // SAFETY: features as above; the load reads one whole chunk.
            *register = unsafe { _mm256_loadu_ps(chunk.as_ptr()) };
        }
    }
    let [first, second] = registers;
    let pairs = M::columns(first).into_iter().zip(M::columns(second));
    for (column, (low, high)) in columns.iter_mut().zip(pairs) {
        // SAFETY: features as above; no memory is accessed.
        *column = unsafe {
            Avx2([
                _mm256_cvtps_pd(_mm256_castps256_ps128(low)),
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(low)),
                _mm256_cvtps_pd(_mm256_castps256_ps128(high)),
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(high)),
            ])
        };
    }
}

/// [`Vector::load_columns_f64`] with AVX2, 16 rows of `D` elements: each
/// quarter of 4 rows is transposed on its own, into one register of each
/// column.
#[cfg_attr(not(debug_assertions), inline(always))]
fn avx2_load_f64_columns<const D: usize, M: ColumnMoves<__m256d, D>>(
    rows: &[f64],
    columns: &mut [Avx2; LANES],
) {
    // SAFETY: as in `avx2_load_f32_columns`.
    let mut registers = unsafe { [[_mm256_setzero_pd(); D]; 4] };
    let (chunks, _) = rows.as_chunks::<4>();
    for (quarter, quarter_chunks) in registers.iter_mut().zip(chunks.chunks(D)) {
        for (register, chunk) in quarter.iter_mut().zip(quarter_chunks) {
            // SAFETY: as in `avx2_load_f32_columns`.
            *register = unsafe { _mm256_loadu_pd(chunk.as_ptr()) };
        }
    }
    let mut quarters = registers;
    for quarter in &mut quarters {
        *quarter = M::columns(*quarter);
    }
    for (j, column) in columns.iter_mut().enumerate().take(D) {
        *column = Avx2([
            quarters[0][j],
            quarters[1][j],
            quarters[2][j],
            quarters[3][j],
        ]);
    }
}

/// [`Vector::store_columns_f32`] with AVX2, into 16 rows of `D` elements.
#[cfg_attr(not(debug_assertions), inline(always))]
fn avx2_store_f32_columns<const D: usize, M: ColumnMoves<__m256, D>>(
    columns: &[Avx2; LANES],
    rows: &mut [f32],
) {
    // SAFETY: as in `avx2_load_f32_columns`.
    let mut registers = unsafe { [[_mm256_setzero_ps(); D]; 2] };
    for (j, column) in columns.iter().enumerate().take(D) {
        for (half, pair) in registers.iter_mut().zip(column.0.as_chunks::<2>().0) {
            // SAFETY: as in `avx2_load_f32_columns`.
            half[j] = unsafe {
                let low = _mm256_cvtpd_ps(pair[0]);
                _mm256_insertf128_ps::<1>(_mm256_castps128_ps256(low), _mm256_cvtpd_ps(pair[1]))
            };
        }
    }
    let chunks = rows.as_chunks_mut::<8>().0;
    for (half_chunks, half) in chunks.chunks_mut(D).zip(registers) {
        for (chunk, register) in half_chunks.iter_mut().zip(M::rows(half)) {
            // SAFETY: features as above; the store writes one whole chunk.
            unsafe { _mm256_storeu_ps(chunk.as_mut_ptr(), register) };
        }
    }
}

/// [`Vector::store_columns_f64`] with AVX2, into 16 rows of `D` elements.
#[cfg_attr(not(debug_assertions), inline(always))]
fn avx2_store_f64_columns<const D: usize, M: ColumnMoves<__m256d, D>>(
    columns: &[Avx2; LANES],
    rows: &mut [f64],
) {
    // SAFETY: as in `avx2_load_f32_columns`.
    let mut registers = unsafe { [[_mm256_setzero_pd(); D]; 4] };
    for (j, column) in columns.iter().enumerate().take(D) {
        for (quarter, &register) in registers.iter_mut().zip(&column.0) {
            quarter[j] = register;
        }
    }
    let chunks = rows.as_chunks_mut::<4>().0;
    for (quarter_chunks, quarter) in chunks.chunks_mut(D).zip(registers) {
        for (chunk, register) in quarter_chunks.iter_mut().zip(M::rows(quarter)) {
            // SAFETY: as in `avx2_store_f32_columns`.
            unsafe { _mm256_storeu_pd(chunk.as_mut_ptr(), register) };
        }
    }
}

/// One two-register permute: its indices (the first 8 for registers of
/// 8 lanes), and the lanes of the result it provides (a bit per lane).
type Permute = ([i32; 16], u16);

/// For rows of `D` elements, the permutes that move a block of 16 rows
/// between row order and columns, in registers of 16 lanes (`f32`) or of
/// 8 (`f64`, each half of 8 rows on its own): `LOAD_*[j][p]` takes column
/// `j`'s lanes out of registers `2p` and `2p + 1` of the rows, `STORE_*[k][q]`
/// takes row register `k`'s elements out of columns `2q` and `2q + 1`.
/// Computed at compile time.
struct BlockPermutes<const D: usize>;

impl<const D: usize> BlockPermutes<D> {
    const LOAD_16: [[Permute; 8]; 16] = load_permutes(D, 16);
    const STORE_16: [[Permute; 8]; 16] = store_permutes(D, 16);
    const LOAD_8: [[Permute; 8]; 16] = load_permutes(D, 8);
    const STORE_8: [[Permute; 8]; 16] = store_permutes(D, 8);
}

/// Lane `l` of column `j` is element `e = l · d + j`: lane
/// `e % (2 · lanes)` of register pair `e / (2 · lanes)`.
const fn load_permutes(d: usize, lanes: usize) -> [[Permute; 8]; 16] {
    let mut table = [[([0; 16], 0); 8]; 16];
    let mut j = 0;
    while j < d {
        let mut l = 0;
        while l < lanes {
            let e = l * d + j;
            let pair = e / (2 * lanes);
            table[j][pair].0[l] = (e % (2 * lanes)) as i32;
            table[j][pair].1 |= 1 << l;
            l += 1;
        }
        j += 1;
    }
    table
}

/// Lane `i` of row register `k` is element `e = lanes · k + i`: lane
/// `e / d` of column `e % d`, the first or second of pair `(e % d) / 2`.
const fn store_permutes(d: usize, lanes: usize) -> [[Permute; 8]; 16] {
    let mut table = [[([0; 16], 0); 8]; 16];
    let mut k = 0;
    while k < d {
        let mut i = 0;
        while i < lanes {
            let e = lanes * k + i;
            let (column, lane) = (e % d, e / d);
            table[k][column / 2].0[i] = (lane + lanes * (column % 2)) as i32;
            table[k][column / 2].1 |= 1 << i;
            i += 1;
        }
        k += 1;
    }
    table
}

/// Each of `D` outputs assembled from pairs of `D` inputs by the permutes of
/// `table` (one row of it per output), blended by their lanes.
#[cfg_attr(not(debug_assertions), inline(always))]
fn permute_pairs<R: PermuteRegister, const D: usize>(
    inputs: &[R; D],
    table: &[[Permute; 8]; 16],
) -> [R; D] {
    let mut outputs = [R::zero(); D];
    for (output, permutes) in outputs.iter_mut().zip(table) {
        for (pair, (indices, lanes)) in permutes.iter().enumerate().take(D.div_ceil(2)) {
            if *lanes != 0 {
                // For odd `D` the last pair is one register: its indices
                // all fall in the first half, so any second register does.
                let second = inputs[(2 * pair + 1).min(D - 1)];
                *output = inputs[2 * pair].permute_onto(second, indices, *lanes, *output);
            }
        }
    }
    outputs
}

/// The lanes of register `register` (of 8) that lie below lane `count`.
#[cfg_attr(not(debug_assertions), inline(always))]
fn avx512_mask(count: usize, register: usize) -> __mmask8 {
    let below = count.saturating_sub(8 * register).min(8);
    ((1u16 << below) - 1) as __mmask8
}

/// The lanes of register `register` (of 4 `f64`) that lie below lane
/// `count`: all bits set in those lanes, none in the others.
#[cfg_attr(not(debug_assertions), inline(always))]
fn avx2_mask(count: usize, register: usize) -> __m256i {
    let below = count.saturating_sub(4 * register).min(4) as i64;
    // SAFETY: see the module docs: only reached with the features enabled.
    unsafe { _mm256_cmpgt_epi64(_mm256_set1_epi64x(below), _mm256_setr_epi64x(0, 1, 2, 3)) }
}

/// [`avx2_mask`] for the 4 `f32` that widen into that register.
#[cfg_attr(not(debug_assertions), inline(always))]
fn avx2_mask_32(count: usize, register: usize) -> __m128i {
    let below = count.saturating_sub(4 * register).min(4) as i32;
    // SAFETY: see the module docs: only reached with the features enabled.
    unsafe { _mm_cmpgt_epi32(_mm_set1_epi32(below), _mm_setr_epi32(0, 1, 2, 3)) }
}

/// Whether the 16 elements `l · d + j` of a column lie inside rows of
/// `len` elements and their offsets fit an `i32`, as the gathers and
/// scatters of [`Avx512`] and the gathers of [`Avx2`] need.
#[cfg_attr(not(debug_assertions), inline(always))]
fn column_fits(len: usize, j: usize, d: usize) -> bool {
    j < d && d <= LANES && (LANES - 1) * d + j < len
}

/// Whether `side` lines of `side` elements, `lead` apart, fit in a slice
/// of `len` elements.
fn square_fits(len: usize, lead: usize, side: usize) -> bool {
    (side - 1)
        .checked_mul(lead)
        .and_then(|start| start.checked_add(side))
        .is_some_and(|needed| needed <= len)
}

/// The offsets `l · d` of lanes `l = 0 .. 16`, for `d <= LANES` (checked
/// by [`column_fits`]), so the products are small.
#[cfg_attr(not(debug_assertions), inline(always))]
fn column_offsets(d: usize) -> __m512i {
    // SAFETY: only called by the methods of `Avx512`: see the module docs.
    unsafe {
        let lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        _mm512_mullo_epi32(lanes, _mm512_set1_epi32(d as i32))
    }
}

/// The offsets `l · d` of lanes `l = 0 .. 8` and `8 .. 16`, for `d <=
/// LANES` (checked by [`column_fits`]), so the products are small.
#[cfg_attr(not(debug_assertions), inline(always))]
fn avx2_column_offsets(d: usize) -> (__m256i, __m256i) {
    // SAFETY: only called by the methods of `Avx2`: see the module docs.
    unsafe {
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let first = _mm256_mullo_epi32(lanes, _mm256_set1_epi32(d as i32));
        (
            first,
            _mm256_add_epi32(first, _mm256_set1_epi32(8 * d as i32)),
        )
    }
}

/// Declares the trampolines of one feature set: each compiles a portable
/// kernel for that set's vector type.
macro_rules! trampolines {
    ($features:literal, $vector:ty) => {
        use super::super::backward::{self, Inputs, Partials, RowCentring, RowScaling, Saved};
        use super::super::islands::islands;
        use super::super::portable;
        use super::super::transpose;
        use super::super::{Affine, Io, Params, RowStats};
        use crate::scalar::KernelScalar;

        islands!(
            /// # Safety
            /// The CPU must support the module's target features.
            #[target_feature(enable = $features)]
            [unsafe] $vector
        );

        /// # Safety
        /// The CPU must support the module's target features.
        #[target_feature(enable = $features)]
        pub(in crate::kernel) unsafe fn layer_norm_rows<A: KernelScalar>(
            io: Io<'_, A>,
            rows: usize,
            params: Params<'_, A>,
            eps: f64,
        ) {
            portable::layer_norm_rows::<A, $vector>(io, rows, params, eps)
        }

        /// # Safety
        /// The CPU must support the module's target features.
        #[target_feature(enable = $features)]
        pub(in crate::kernel) unsafe fn rms_norm_rows<A: KernelScalar>(
            io: Io<'_, A>,
            rows: usize,
            params: Params<'_, A>,
            eps: f64,
        ) {
            portable::rms_norm_rows::<A, $vector>(io, rows, params, eps)
        }

        /// # Safety
        /// The CPU must support the module's target features.
        #[target_feature(enable = $features)]
        pub(in crate::kernel) unsafe fn transpose_lines<A: KernelScalar>(
            src: &[A],
            src_lead: usize,
            dst: &mut [A],
            dst_lead: usize,
            lines: usize,
            length: usize,
        ) {
            transpose::transpose_lines::<A, $vector>(src, src_lead, dst, dst_lead, lines, length)
        }

        /// # Safety
        /// The CPU must support the module's target features.
        #[target_feature(enable = $features)]
        pub(in crate::kernel) unsafe fn row_stats<A: KernelScalar>(x: &[A]) -> RowStats {
            portable::row_stats::<A, $vector>(x)
        }

        /// # Safety
        /// The CPU must support the module's target features.
        #[target_feature(enable = $features)]
        pub(in crate::kernel) unsafe fn layer_norm_train_block<A: KernelScalar>(
            x: &[A],
            y: &mut [A],
            d: usize,
            affine: Affine<'_, A>,
            eps: f64,
            stats: &mut [RowCentring],
        ) {
            backward::layer_norm_train_block::<A, $vector>(x, y, d, affine, eps, stats)
        }

        /// # Safety
        /// The CPU must support the module's target features.
        #[target_feature(enable = $features)]
        pub(in crate::kernel) unsafe fn rms_norm_train_block<A: KernelScalar>(
            x: &[A],
            y: &mut [A],
            d: usize,
            affine: Affine<'_, A>,
            eps: f64,
            stats: &mut [RowScaling],
        ) {
            backward::rms_norm_train_block::<A, $vector>(x, y, d, affine, eps, stats)
        }

        /// # Safety
        /// The CPU must support the module's target features.
        #[target_feature(enable = $features)]
        pub(in crate::kernel) unsafe fn layer_norm_backward_block<A: KernelScalar>(
            inputs: Inputs<'_, A>,
            dx: &mut [A],
            saved: Saved<'_, RowCentring>,
            partials: &mut Partials,
        ) {
            backward::layer_norm_backward_block::<A, $vector>(inputs, dx, saved, partials)
        }

        /// # Safety
        /// The CPU must support the module's target features.
        #[target_feature(enable = $features)]
        pub(in crate::kernel) unsafe fn rms_norm_backward_block<A: KernelScalar>(
            inputs: Inputs<'_, A>,
            dx: &mut [A],
            saved: Saved<'_, RowScaling>,
            partials: &mut Partials,
        ) {
            backward::rms_norm_backward_block::<A, $vector>(inputs, dx, saved, partials)
        }
    };
}

pub(super) mod avx2 {
    trampolines!("avx2,fma", super::Avx2);
}

pub(super) mod avx512 {
    trampolines!("avx512f,avx512vl,avx512dq,avx512bw", super::Avx512);
}
