//! Cache hints for the row walk.
//!
//! While one row is being normalised, the next one is requested from
//! memory, so that its first pass finds it in cache instead of waiting on
//! every line. A prefetch is only a hint: it never faults, never changes a
//! value and is not a memory access of the program, so the pointers need
//! not be valid. Targets without the instruction get no-ops.
//!
//! Outputs too large for any cache are written with non-temporal stores
//! (see [`super::Io::Stream`]), which skip reading each output line before
//! overwriting it; [`after_streaming`] orders them before whatever follows.

/// How far ahead of the current row the walk prefetches, in bytes at
/// least. One row ahead is enough for long rows; for short ones (d = 64 is
/// 256 or 512 bytes) the next row would arrive too late, so the hint goes
/// to the row about 4 KiB ahead, by which time it has arrived; further
/// ahead is slower (PERFORMANCE.md, "Rows ahead").
const PREFETCH_DISTANCE: usize = 4096;

/// Calls that read fewer bytes than this get no hints: their rows (and
/// outputs, at most as large again) fit in the L2 cache of one core, where
/// hints only compete with the row's own loads (PERFORMANCE.md, "Rows
/// ahead").
const PREFETCH_MIN_BYTES: usize = 1 << 20;

/// Whether a call reading `bytes` bytes of input asks for rows ahead.
pub(crate) fn worth_prefetching(bytes: usize) -> bool {
    bytes >= PREFETCH_MIN_BYTES
}

/// How many rows of `d` elements ahead of the current one to prefetch.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(crate) fn rows_ahead<A>(d: usize) -> usize {
    (PREFETCH_DISTANCE / (d * size_of::<A>()).max(1)).max(1)
}

/// Bytes per cache line on the targets that have prefetch hints.
pub(crate) const LINE: usize = 64;

/// The row ahead that a row's output pass asks for, a chunk at a time:
/// while the output pass writes the chunk at element `j` of its row, it
/// asks for element `j` of the input `elements` further on (and, for an
/// output that is read before it is written, of the output), so that the
/// requests go out spread over the pass, a line or two per chunk, instead
/// of in a burst. (A hint never faults, but one past the rows of the call
/// would fetch lines nobody reads: the walk over rows longer than
/// [`SHORT_ROW`](super::short::SHORT_ROW) asks only for its own rows.) Rows
/// of the rare paths (constant, not finite, rescaled) write without asking;
/// the processor's own prefetcher still follows the walk.
///
/// Spread over the output pass, the requests keep the memory busy while
/// the row is worked on, which a burst before each row does not; calls
/// that fit in cache send none (PERFORMANCE.md, "Rows ahead").
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ahead {
    /// How many elements ahead; 0 asks for nothing.
    elements: usize,
    /// Whether the output's lines ahead are asked for too.
    output: bool,
}

impl Ahead {
    /// Asks for nothing.
    pub(crate) const NONE: Self = Ahead {
        elements: 0,
        output: false,
    };

    /// Asks for the input `elements` ahead, and for the output too when
    /// `output` (a separate output written with plain stores).
    pub(crate) fn new(elements: usize, output: bool) -> Self {
        Ahead { elements, output }
    }

    /// Asks for the `len` elements `self.elements` ahead of `input` (and
    /// of `output`).
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(crate) fn ask<A>(self, input: *const A, output: *const A, len: usize) {
        if self.elements != 0 {
            for_reading(input.wrapping_add(self.elements), len);
            if self.output {
                for_writing(output.wrapping_add(self.elements), len);
            }
        }
    }
}

/// How many elements of `output` come before its first cache line (at most
/// all of them): the head that a streamed row writes with plain stores, so
/// that the rest starts on a line.
pub(crate) fn before_first_line<A>(output: &[A]) -> usize {
    output.as_ptr().align_offset(LINE).min(output.len())
}

/// Asks for the `len` elements from `start` to be brought into cache for
/// reading.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(crate) fn for_reading<A>(start: *const A, len: usize) {
    for line in lines(start, len) {
        hint_read(line);
    }
}

/// Asks for the `len` elements from `start` to be brought into the L2 cache
/// (not L1) for reading: for rows that are read a while later, when their
/// lines in L1 would crowd out the lines in use.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(crate) fn into_l2_for_reading<A>(start: *const A, len: usize) {
    for line in lines(start, len) {
        hint_read_l2(line);
    }
}

/// Asks for the `len` elements from `start` to be brought into cache for
/// writing (read for ownership ahead of the stores).
#[cfg_attr(not(debug_assertions), inline(always))]
pub(crate) fn for_writing<A>(start: *const A, len: usize) {
    for line in lines(start, len) {
        hint_write(line);
    }
}

/// One address in each cache line of the `len` elements from `start`.
#[cfg_attr(not(debug_assertions), inline(always))]
fn lines<A>(start: *const A, len: usize) -> impl Iterator<Item = *const u8> {
    let start = start.cast::<u8>();
    (0..len * size_of::<A>())
        .step_by(LINE)
        .map(move |offset| start.wrapping_add(offset))
}

#[cfg(target_arch = "x86_64")]
#[cfg_attr(not(debug_assertions), inline(always))]
fn hint_read(line: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: `prefetcht0` is part of SSE, which every x86-64 CPU has, and
    // it neither faults nor accesses memory architecturally, whatever the
    // address (see the module docs).
    unsafe { _mm_prefetch::<_MM_HINT_T0>(line.cast::<i8>()) }
}

#[cfg(target_arch = "x86_64")]
#[cfg_attr(not(debug_assertions), inline(always))]
fn hint_read_l2(line: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    // SAFETY: as for `hint_read`.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(line.cast::<i8>()) }
}

#[cfg(target_arch = "x86_64")]
#[cfg_attr(not(debug_assertions), inline(always))]
fn hint_write(line: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
    // SAFETY: as for `hint_read`; CPUs without `prefetchw` execute it as a
    // no-op.
    unsafe { _mm_prefetch::<_MM_HINT_ET0>(line.cast::<i8>()) }
}

#[cfg(not(target_arch = "x86_64"))]
#[cfg_attr(not(debug_assertions), inline(always))]
fn hint_read(_line: *const u8) {}

#[cfg(not(target_arch = "x86_64"))]
#[cfg_attr(not(debug_assertions), inline(always))]
fn hint_read_l2(_line: *const u8) {}

#[cfg(not(target_arch = "x86_64"))]
#[cfg_attr(not(debug_assertions), inline(always))]
fn hint_write(_line: *const u8) {}

/// Makes the non-temporal stores issued so far ordered before every later
/// store, as plain stores are (`sfence`), so that other threads that
/// synchronise with this one afterwards see them.
#[cfg_attr(not(debug_assertions), inline(always))]
pub(super) fn after_streaming() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` is part of SSE, which every x86-64 CPU has.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    }
}
