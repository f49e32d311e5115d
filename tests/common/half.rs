//! Helpers of `tests/half.rs`: the half types as the tests see them, a
//! correctly rounding reference, value classes and comparisons.
#![allow(dead_code)]

use std::fmt::Debug;

use half::{bf16, f16};
use ndarray::{Array, Array1, Array2, ArrayRef, ArrayRef2, Dimension};
use ndarray_layernorm::prelude::*;
use proptest::prelude::*;

use super::exact::{exact_layer_norm, exact_rms_norm};

/// What the tests need to know about a half type.
pub trait Half: Bits + Send + Sync + 'static {
    const NAME: &'static str;
    /// Stored significand bits: 10 (`f16`), 7 (`bf16`).
    const MANT: i32;
    /// The largest finite value, the least positive normal and subnormal.
    const BIG: Self;
    const NORMAL_MIN: Self;
    const SUB_MIN: Self;
    const SEED: u64;
    fn raw(self) -> u16;
    fn from_raw(bits: u16) -> Self;
    /// The value in `f64`, exactly.
    fn wide(self) -> f64;
    /// `half`'s `from_f32`, to nearest even: the half path's last rounding.
    fn round32(v: f32) -> Self;
}

/// Bits to compare results by (all NaNs of a half type or `f32` alike).
pub trait Bits: Copy + Debug {
    fn bits(self) -> u64;
}

impl Bits for f32 {
    fn bits(self) -> u64 {
        u64::from(if self.is_nan() {
            0x7fc0_0000
        } else {
            self.to_bits()
        })
    }
}

impl Bits for f64 {
    fn bits(self) -> u64 {
        self.to_bits()
    }
}

macro_rules! half_type {
    ($t:ident, $mant:expr, $seed:expr) => {
        impl Half for $t {
            const NAME: &'static str = stringify!($t);
            const MANT: i32 = $mant;
            const BIG: Self = $t::MAX;
            const NORMAL_MIN: Self = $t::MIN_POSITIVE;
            const SUB_MIN: Self = $t::MIN_POSITIVE_SUBNORMAL;
            const SEED: u64 = $seed;
            fn raw(self) -> u16 {
                self.to_bits()
            }
            fn from_raw(bits: u16) -> Self {
                $t::from_bits(bits)
            }
            fn wide(self) -> f64 {
                self.to_f64()
            }
            fn round32(v: f32) -> Self {
                $t::from_f32(v)
            }
        }

        impl Bits for $t {
            fn bits(self) -> u64 {
                u64::from(if is_nan(self) { 0x7fff } else { self.to_bits() })
            }
        }
    };
}

half_type!(f16, 10, 0x16);
half_type!(bf16, 7, 0xbf16);

// ---------------------------------------------------------------------------
// Ulps of the half types.

/// The bits as an integer monotonic in the value, `±0` both 0: neighbours
/// differ by 1, across zero too, and ±∞ is one past ±MAX.
pub fn key<H: Half>(h: H) -> i32 {
    i32::from(h.raw() & 0x7fff) * if h.raw() & 0x8000 != 0 { -1 } else { 1 }
}

pub fn is_nan<H: Half>(h: H) -> bool {
    i32::from(h.raw() & 0x7fff) > key(H::BIG) + 1
}

/// `t` rounded to nearest, ties to even, overflowing to ±∞ from MAX plus
/// half its spacing. Not `half`'s `from_f64`, which drops the low 32 bits of
/// the `f64` before rounding (or rounds through `f32` on CPUs with F16C), so
/// that `1 + 2⁻¹¹ + 2⁻⁴⁰` becomes `f16` 1 instead of `1 + 2⁻¹⁰`.
pub fn round_nearest<H: Half>(t: f64) -> H {
    assert!(!t.is_nan(), "no NaN is rounded");
    let (a, top) = (t.abs(), key(H::BIG));
    let value = |k: i32| H::from_raw(k as u16).wide();
    // The largest magnitude at most `a`, by bisection of the keys.
    let (mut lo, mut hi) = (0, top);
    if a >= value(top) {
        lo = top;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        *(if value(mid) <= a { &mut lo } else { &mut hi }) = mid;
    }
    let below = value(lo);
    let above = if lo == top {
        2.0 * below - value(top - 1)
    } else {
        value(lo + 1)
    };
    let midpoint = 0.5 * (below + above); // exact: a dozen significant bits
    let up = a > midpoint || (a == midpoint && lo % 2 == 1);
    let sign = if t.is_sign_negative() { 0x8000 } else { 0 };
    H::from_raw(sign | (lo + i32::from(up)) as u16)
}

/// True iff `got` is the correctly rounded `truth` or one of its two
/// neighbours (across zero, and ∞ next to MAX).
pub fn within_one_ulp<H: Half>(got: H, truth: f64) -> bool {
    !is_nan(got) && !truth.is_nan() && (key(got) - key(round_nearest::<H>(truth))).abs() <= 1
}

/// `|got - truth|` in units of the spacing at `truth` (∞ counts as one
/// spacing past MAX).
pub fn ulps_from<H: Half>(got: H, truth: f64) -> f64 {
    let value = |k: i32| H::from_raw(k as u16).wide();
    let top = key(H::BIG);
    let k = key(round_nearest::<H>(truth)).abs().min(top - 1);
    let past_top = 2.0 * value(top) - value(top - 1);
    let g = if is_nan(got) || got.wide().is_finite() {
        got.wide()
    } else {
        past_top.copysign(got.wide())
    };
    (g - truth).abs() / (value(k + 1) - value(k))
}

// ---------------------------------------------------------------------------
// Data.

/// SplitMix64, as in `tests/accuracy.rs`, so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [-1, 1).
    pub fn signed(&mut self) -> f64 {
        2.0 * self.unit() - 1.0
    }
    pub fn sign(&mut self) -> f64 {
        self.signed().signum()
    }
    /// Standard normal (Box-Muller).
    pub fn gauss(&mut self) -> f64 {
        let u = 1.0 - self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }
}

/// Kinds of rows, and of the parameters they are normalised with.
#[derive(Clone, Copy, Debug)]
pub enum Class {
    /// Standard normal values.
    Normal,
    /// A large common offset (-3 · 2^(MANT+2)) with noise of ±16 ulps of it.
    Offset,
    /// Magnitudes from 2√MAX to MAX, mixed signs: squares overflow the type.
    Huge,
    /// ±MAX, and values up to it.
    Extremes,
    /// Subnormals only.
    Subnormal,
    /// Subnormals among normals a few times the least normal.
    SubnormalMixed,
    /// Magnitudes over nearly the whole exponent range, mixed signs.
    MixedSigns,
    /// Normal rows, gamma 1 to 4 least normals, beta 0: subnormal outputs.
    TinyGamma,
    /// Mixed-sign rows, a subnormal gamma, beta 0.
    SubnormalGamma,
}

/// The first seven kinds are those of the rows themselves.
pub const CLASSES: [Class; 9] = [
    Class::Normal,
    Class::Offset,
    Class::Huge,
    Class::Extremes,
    Class::Subnormal,
    Class::SubnormalMixed,
    Class::MixedSigns,
    Class::TinyGamma,
    Class::SubnormalGamma,
];
pub const DIMS: [usize; 9] = [1, 2, 3, 15, 16, 17, 64, 768, 3000];
pub const EPS: [f64; 4] = [0.0, 1e-6, 1e-5, 0.25];

impl Class {
    /// One element, before rounding to `H`.
    pub fn value<H: Half>(self, rng: &mut Rng) -> f64 {
        let (big, normal_min, sub) = (H::BIG.wide(), H::NORMAL_MIN.wide(), H::SUB_MIN.wide());
        let subnormal = |rng: &mut Rng| (rng.signed() * (normal_min / sub - 1.0)).round() * sub;
        match self {
            Class::Normal | Class::TinyGamma => rng.gauss(),
            Class::Offset => -3.0 * 2f64.powi(H::MANT + 2) + 128.0 * rng.signed(),
            Class::Huge => rng.sign() * big / (big.sqrt() / 2.0).powf(rng.unit()),
            Class::Extremes => [big, -big, big * rng.signed()][(rng.next() % 3) as usize],
            Class::Subnormal => subnormal(rng),
            Class::SubnormalMixed if rng.next() & 1 == 0 => subnormal(rng),
            Class::SubnormalMixed => 8.0 * normal_min * rng.gauss(),
            Class::MixedSigns | Class::SubnormalGamma => {
                rng.sign() * 10f64.powf((big.log10() - 1.0) * rng.signed())
            }
        }
    }

    /// Gamma and beta for rows of this kind.
    pub fn params<H: Half>(self, rng: &mut Rng, d: usize) -> Params<H> {
        let (normal_min, sub) = (H::NORMAL_MIN.wide(), H::SUB_MIN.wide());
        let (lo, hi, shift) = match self {
            Class::TinyGamma => (normal_min, 4.0 * normal_min, 0.0),
            Class::SubnormalGamma => (sub, normal_min - sub, 0.0),
            _ => (0.25, 3.0, 2.0),
        };
        let gamma: Vec<f64> = (0..d)
            .map(|_| rng.sign() * (lo + (hi - lo) * rng.unit()))
            .collect();
        let beta: Vec<f64> = (0..d).map(|_| shift * rng.signed()).collect();
        Params::new(&gamma, &beta)
    }
}

pub fn rows<H: Half>(rng: &mut Rng, class: Class, r: usize, d: usize) -> Array2<H> {
    Array2::from_shape_fn((r, d), |_| round_nearest::<H>(class.value::<H>(rng)))
}

pub fn row_count(d: usize) -> usize {
    match d {
        0..=17 => 3,
        18..=64 => 2,
        _ => 1,
    }
}

/// `v` rounded to `f32`, moved to the next `f32` if `H` holds it (zeros
/// stay zeros): parameters that show whether they are used in full.
pub fn off_grid<H: Half>(v: f64) -> f32 {
    let f = v as f32;
    let held = round_nearest::<H>(f64::from(f)).wide() == f64::from(f);
    if f != 0.0 && held {
        f32::from_bits(f.to_bits() + 1)
    } else {
        f
    }
}

/// `gamma` and `beta` in the half type, and in `f32` values it cannot hold.
#[derive(Clone, Debug)]
pub struct Params<H> {
    pub gh: Array1<H>,
    pub bh: Array1<H>,
    pub g32: Array1<f32>,
    pub b32: Array1<f32>,
}

/// The forward forms; the index is the `form` argument of the helpers.
pub const FORMS: [&str; 6] = [
    "layer_norm",
    "layer_norm, f32 params",
    "layer_norm_plain",
    "rms_norm",
    "rms_norm, f32 params",
    "rms_norm_plain",
];

impl<H: Half> Params<H> {
    pub fn new(gamma: &[f64], beta: &[f64]) -> Self {
        let to_half = |v: &[f64]| v.iter().map(|&v| round_nearest::<H>(v)).collect();
        let to_f32 = |v: &[f64]| v.iter().map(|&v| off_grid::<H>(v)).collect();
        Params {
            gh: to_half(gamma),
            bh: to_half(beta),
            g32: to_f32(gamma),
            b32: to_f32(beta),
        }
    }

    /// Gamma and beta of `form` on the `f32` path: the `f32` ones, or the
    /// half ones widened (exactly).
    pub fn single(&self, form: usize) -> (Array1<f32>, Array1<f32>) {
        match form {
            1 | 4 => (self.g32.clone(), self.b32.clone()),
            _ => (widen32(&self.gh), widen32(&self.bh)),
        }
    }

    /// The true outputs of `form` in logical order, from the exact `n` of
    /// [`exact_rows`]: `n · gamma + beta` in `f64`, far below a half ulp off
    /// (no kind of data has `n · gamma` and `beta` cancelling).
    pub fn truths(&self, form: usize, n: &[Vec<f64>]) -> Vec<f64> {
        let (g, b) = self.single(form);
        let (g, b) = match form {
            0 | 1 => (g.to_vec(), b.to_vec()),
            3 | 4 => (g.to_vec(), vec![0.0; g.len()]),
            _ => (vec![1.0; g.len()], vec![0.0; g.len()]),
        };
        let affine = |(n, (g, b)): (&f64, (&f32, &f32))| n * f64::from(*g) + f64::from(*b);
        n.iter()
            .flat_map(|row| row.iter().zip(g.iter().zip(&b)).map(affine))
            .collect()
    }
}

pub fn wide_of<'a, H: Half + 'a>(values: impl IntoIterator<Item = &'a H>) -> Vec<f64> {
    values.into_iter().map(|v| v.wide()).collect()
}

pub fn widen32<H: Half, D: Dimension>(a: &ArrayRef<H, D>) -> Array<f32, D> {
    a.mapv(|v| v.wide() as f32) // exact
}

/// The exact normalised values `n` of every row.
pub fn exact_rows<H: Half>(x: &ArrayRef2<H>, eps: f64, rms: bool) -> Vec<Vec<f64>> {
    let norm = if rms {
        exact_rms_norm
    } else {
        exact_layer_norm
    };
    x.rows()
        .into_iter()
        .map(|row| norm(&wide_of(row.iter()), eps))
        .collect()
}

/// The `f32` path's result of `form`.
pub fn forward32<H: Half>(form: usize, x: &ArrayRef2<f32>, p: &Params<H>, eps: f32) -> Array2<f32> {
    let (g, b) = p.single(form);
    match form {
        0 | 1 => x.layer_norm(&g, &b, eps),
        2 => x.layer_norm_plain(eps),
        3 | 4 => x.rms_norm(&g, eps),
        _ => x.rms_norm_plain(eps),
    }
    .unwrap()
}

// ---------------------------------------------------------------------------
// Comparisons.

pub fn bits_of<T: Bits, D: Dimension>(a: &ArrayRef<T, D>) -> Vec<u64> {
    a.iter().map(|&v| v.bits()).collect()
}

/// Asserts the same bits in logical order, naming the first difference.
#[track_caller]
pub fn same<T: Bits, D: Dimension, E: Dimension>(
    got: &ArrayRef<T, D>,
    want: &ArrayRef<T, E>,
    what: &str,
) {
    let (got, want) = (bits_of(got), bits_of(want));
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        let differ = (0..got.len()).filter(|&i| got[i] != want[i]).count();
        let (g, w) = (got[i], want[i]);
        panic!("{what}: element {i} is {g:#x}, not {w:#x} ({differ} differ)");
    }
}

/// Asserts every element within one ulp of `want`'s (NaN where it is NaN).
#[track_caller]
pub fn near<H: Half, D: Dimension>(got: &ArrayRef<H, D>, want: &ArrayRef<H, D>, what: &str) {
    for (i, (&g, &w)) in got.iter().zip(want.iter()).enumerate() {
        let ok = if is_nan(w) {
            is_nan(g)
        } else {
            !is_nan(g) && (key(g) - key(w)).abs() <= 1
        };
        assert!(ok, "{what}: element {i} is {g:?}, not {w:?} or a neighbour");
    }
}

/// Asserts every output within one ulp of its truth; returns the largest
/// distance in ulps.
#[track_caller]
pub fn assert_within_one_ulp<H: Half>(got: &ArrayRef2<H>, truth: &[f64], what: &str) -> f64 {
    assert_eq!(got.len(), truth.len());
    let mut worst = 0.0f64;
    for (i, (&g, &t)) in got.iter().zip(truth).enumerate() {
        assert!(
            within_one_ulp(g, t),
            "{what}: element {i} is {g:?}, truth {t:e}"
        );
        worst = worst.max(ulps_from(g, t));
    }
    worst
}

/// Within 1e-15 relative (equal where the truth is 0 or infinite).
pub fn close(got: f64, truth: f64) -> bool {
    got == truth || (got - truth).abs() <= 1e-15 * truth.abs()
}

/// Bound on `|mean|` and on `|sd - 1|` of a row of `layer_norm_plain(0)`
/// whose outputs are within one ulp of the correctly rounded `n`. Each is
/// then within 1.5 ulp of `n`, at most `1.5 · u · (1 + u/2) · |n|` with
/// `u = 2^-MANT`, plus 1.5 least subnormals; the exact `n` have mean 0 and
/// rms 1, and by the triangle inequality of the rms the mean and sd are off
/// by at most the rms of those bounds. (Tighter than `d · u`.)
pub fn moment_slack<H: Half>() -> f64 {
    let u = 2f64.powi(-H::MANT);
    1.5 * u * (1.0 + u / 2.0) + 1.5 * H::SUB_MIN.wide() + 1e-12
}

/// Rows of `H`: noise in [-1, 1) plus an offset of 0, 3 or -20, times a
/// power of two over nearly the whole range (subnormal rows included).
pub fn half_rows<H: Half>() -> impl Strategy<Value = Array2<H>> {
    let offsets = prop::sample::select([0.0, 3.0, -20.0].to_vec());
    let top = H::BIG.wide().log2() as i32 - 5;
    (1usize..=3, 2usize..=64, -top - 10..=top, offsets).prop_flat_map(|(r, d, e, o)| {
        prop::collection::vec(-1.0..1.0f64, r * d).prop_map(move |noise| {
            let scaled = |(i, j): (usize, usize)| (o + noise[i * d + j]) * 2f64.powi(e);
            Array2::from_shape_fn((r, d), |at| round_nearest::<H>(scaled(at)))
        })
    })
}

/// A constant, gamma and beta (with zeros of both signs), and eps.
pub fn constant_case<H: Half>() -> impl Strategy<Value = (f64, Vec<f64>, Vec<f64>, f64)> {
    let (big, sub) = (H::BIG.wide(), H::SUB_MIN.wide());
    let constant = prop_oneof![
        -1e4..1e4f64,
        Just(big),
        Just(-big),
        (1.0..100.0f64).prop_map(move |k| k.round() * sub),
        Just(0.0),
        Just(-0.0),
    ];
    let feature = prop_oneof![6 => -3.0..3.0f64, 1 => Just(0.0), 1 => Just(-0.0)].boxed();
    let eps = prop::sample::select(EPS.to_vec());
    (constant, 1usize..=48, eps).prop_flat_map(move |(c, d, eps)| {
        let vector = prop::collection::vec(feature.clone(), d);
        (Just(c), vector.clone(), vector, Just(eps))
    })
}
