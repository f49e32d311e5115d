//! The per-feature parameters of a call, and their `f64` copy for `f32`
//! calls.
//!
//! The output pass of an `f32` row converts `γ` and `β` to `f64` for every
//! row, two conversions per element next to the one of `x`. A call over
//! many rows converts them once instead, into a buffer that the calling
//! thread keeps for its next call, and every row (on any thread) reads the
//! copy. The converted values are exact, and `1 + w` is formed in `f64` as
//! the row kernels form it, so the outputs keep their bits.
//!
//! The call's size also settles whether its row walk asks the cache for
//! rows ahead.

use std::cell::Cell;

use super::short::SHORT_ROW;
use super::simd::LANES;
use super::{cache, widened_gain, Affine};
use crate::scalar::NormScalar;

/// The parameters the row kernels apply: `affine` as given, and for `f32`
/// calls over many rows the same parameters in `f64`.
#[derive(Clone, Copy)]
pub(crate) struct Params<'a, A> {
    pub(super) affine: Affine<'a, A>,
    /// `affine` in `f64`, with the zero-centred `1 + w` as a plain gain,
    /// each vector followed by a chunk of zeros.
    pub(super) wide: Option<Affine<'a, f64>>,
    /// Whether the row walk asks for rows ahead (see
    /// [`cache::worth_prefetching`]).
    pub(super) prefetch: bool,
}

impl<'a, A> From<Affine<'a, A>> for Params<'a, A> {
    fn from(affine: Affine<'a, A>) -> Self {
        Params {
            affine,
            wide: None,
            prefetch: true,
        }
    }
}

/// The longest row whose parameters are widened. Beyond it the `f64` copy
/// (16 bytes per feature, 32 with `β`) no longer fits in the L1 cache next
/// to the row, and reading it costs more than the conversions it saves
/// (PERFORMANCE.md, "Contiguous arrays").
const WIDE_ROW: usize = 1 << 10;

/// Calls over fewer rows than this convert the parameters in every row: the
/// copy would cost about as much as it saves.
const WIDE_MIN_ROWS: usize = 4;

thread_local! {
    static KEPT: Cell<Vec<f64>> = const { Cell::new(Vec::new()) };
}

/// The parameters of one call over `elements` elements in rows of `d`,
/// widened when that pays. Owns the widened copy, which goes back to the
/// thread's keeping when this is dropped.
pub(crate) struct CallParams<'a, A> {
    affine: Affine<'a, A>,
    prefetch: bool,
    wide: Vec<f64>,
    /// Where `β` starts in `wide` (0 when `wide` holds only `γ`), or `None`
    /// when nothing is widened.
    beta_at: Option<usize>,
}

impl<'a, A: NormScalar> CallParams<'a, A> {
    pub(crate) fn new(affine: Affine<'a, A>, d: usize, elements: usize) -> Self {
        let prefetch = cache::worth_prefetching(elements.saturating_mul(size_of::<A>()));
        let widen = size_of::<A>() == size_of::<f32>()
            && d > SHORT_ROW
            && d <= WIDE_ROW
            && elements / d >= WIDE_MIN_ROWS;
        let (gamma, beta, one_plus) = match affine {
            Affine::Scale(gamma) => (gamma, None, false),
            Affine::ScaleShift(gamma, beta) => (gamma, Some(beta), false),
            Affine::OnePlus(w) => (w, None, true),
            Affine::Identity => (&[][..], None, false),
        };
        if !widen || gamma.is_empty() {
            return CallParams {
                affine,
                prefetch,
                wide: Vec::new(),
                beta_at: None,
            };
        }
        // Taken out while the call runs: a nested call gets its own.
        let mut wide = KEPT.try_with(Cell::take).unwrap_or_default();
        wide.clear();
        // Each vector followed by a chunk of zeros: a row's last, partial
        // chunk then reads its parameters with whole loads, wherever it
        // starts (a streamed row's chunks start at its first aligned
        // element).
        let padded = gamma.len() + LANES;
        // Exactly the room needed, not the doubling of `extend`.
        wide.reserve_exact(padded * (1 + usize::from(beta.is_some())));
        wide.extend(widened_gain(gamma, one_plus));
        wide.resize(padded, 0.0);
        let beta_at = match beta {
            Some(beta) => {
                wide.extend(beta.iter().map(|&b| b.widen()));
                wide.resize(2 * padded, 0.0);
                padded
            }
            None => 0,
        };
        CallParams {
            affine,
            prefetch,
            wide,
            beta_at: Some(beta_at),
        }
    }

    /// What the row kernels take.
    pub(crate) fn params(&self) -> Params<'_, A> {
        let wide = self.beta_at.map(|beta_at| {
            if beta_at == 0 {
                Affine::Scale(&self.wide[..])
            } else {
                let (gamma, beta) = self.wide.split_at(beta_at);
                Affine::ScaleShift(gamma, beta)
            }
        });
        Params {
            affine: self.affine,
            wide,
            prefetch: self.prefetch,
        }
    }
}

impl<A> Drop for CallParams<'_, A> {
    fn drop(&mut self) {
        if self.beta_at.is_some() {
            let wide = std::mem::take(&mut self.wide);
            // Fails only while the thread is being torn down: then the
            // memory is simply freed.
            let _ = KEPT.try_with(|kept| kept.set(wide));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept copy never holds more than `γ` and `β` of the longest row
    /// widened, each with its chunk of zeros (16.25 KiB, as the docs say),
    /// whatever the order of the calls.
    #[test]
    fn the_kept_parameters_stay_within_their_bound() {
        for d in [17, 600, 1000, 1024, 20, 1024, 2000] {
            let gamma = vec![1.5f32; d];
            let beta = vec![-0.5f32; d];
            let call = CallParams::new(Affine::ScaleShift(&gamma, &beta), d, 4 * d);
            assert_eq!(call.beta_at.is_some(), d <= WIDE_ROW, "d {d}");
            drop(call);
            let kept = KEPT.take();
            let bytes = kept.capacity() * size_of::<f64>();
            KEPT.set(kept);
            assert!(
                bytes <= 2 * (WIDE_ROW + LANES) * size_of::<f64>(),
                "d {d}: {bytes}"
            );
        }
        assert_eq!(2 * (WIDE_ROW + LANES) * size_of::<f64>(), 16_640); // 16.25 KiB
    }
}
