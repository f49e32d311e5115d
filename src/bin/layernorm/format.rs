//! Writing output numbers.
//!
//! Fixed notation (`--precision N`, 4 by default) gives exactly the text of
//! std's `format!("{:.N}", v)`, except that a value that rounds to zero is
//! never shown with a minus sign. The common case is done without the
//! formatting machinery: `|v| · 10ᴺ` is rounded to an integer and its digits
//! written directly. The product `s` is the float nearest the exact
//! `t = |v| · 10ᴺ`, and below 2⁵² every half-integer is a float; rounding
//! to nearest is monotone, so no half-integer lies strictly between `s` and
//! `t`. Hence `s` rounds to the same integer as `t` unless `s` is itself a
//! half-integer (then `t` may be a tie or lie on either side of one). Those
//! rare values, and everything too large for the integer path, go through
//! std. The unit tests check the equivalence on random and near-tie values.
//!
//! Exact notation (`--exact`) prints the shortest text that reads back as
//! the same number: std's shortest round-trip digits, positional or with an
//! exponent, whichever is shorter (positional on a tie).

use std::fmt::Write as _;

use crate::parse::Value;

/// How output numbers are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notation {
    /// This many decimals, rounded to nearest (ties as std).
    Fixed(usize),
    /// The shortest text that reads back as the same value of the element type.
    Exact,
}

/// Powers of ten up to the largest handled without std: all exact in `f64`
/// and in `u64`.
const POW10: [u64; 16] = [
    1,
    10,
    100,
    1_000,
    10_000,
    100_000,
    1_000_000,
    10_000_000,
    100_000_000,
    1_000_000_000,
    10_000_000_000,
    100_000_000_000,
    1_000_000_000_000,
    10_000_000_000_000,
    100_000_000_000_000,
    1_000_000_000_000_000,
];

/// Products `|v| · 10ᴺ` at or above this go through std. Below it every
/// half-integer is a float, the fractional part `s - ⌊s⌋` is exact, and the
/// rounded integer converts to `u64` exactly.
const FAST_LIMIT: f64 = 1e15;

/// Appends `v` to `out` in `notation`; `scratch` is a reused buffer for the
/// std fallback.
pub fn push<A: Value>(out: &mut Vec<u8>, v: A, notation: Notation, scratch: &mut String) {
    match notation {
        Notation::Fixed(precision) => push_fixed(out, v.to_f64(), precision, scratch),
        Notation::Exact => push_exact(out, v, scratch),
    }
}

/// Appends `v` with `precision` decimals: std's `{:.precision}` text, but
/// `0.0000` where std would write `-0.0000`. An `f32` is passed widened,
/// which is exact, so its decimal expansion is the same.
pub fn push_fixed(out: &mut Vec<u8>, v: f64, precision: usize, scratch: &mut String) {
    if let Some(&scale) = POW10.get(precision) {
        let s = v.abs() * scale as f64;
        // False for NaN and infinities.
        if s < FAST_LIMIT {
            // Truncation is the floor here (s ≥ 0), and exact below 1e15.
            let floor = s as u64;
            let frac = s - floor as f64;
            if frac != 0.5 {
                let n = floor + u64::from(frac > 0.5);
                push_scaled(out, n, precision, n != 0 && v < 0.0);
                return;
            }
        }
    }
    scratch.clear();
    // Writing to a String cannot fail.
    let _ = write!(scratch, "{v:.precision$}");
    let text = match scratch.strip_prefix('-') {
        Some(rest) if rest.bytes().all(|b| b == b'0' || b == b'.') => rest,
        _ => scratch.as_str(),
    };
    out.extend_from_slice(text.as_bytes());
}

/// Appends `±n / 10ᵖ` with `p = precision` decimals (at most 15, and
/// `n < 10¹⁶`), built right to left in a stack buffer and copied once.
fn push_scaled(out: &mut Vec<u8>, n: u64, precision: usize, negative: bool) {
    // Sign, 16 integer digits, point, 15 decimals.
    let mut text = [0_u8; 33];
    let mut start = text.len();
    let mut rest = n;
    for _ in 0..precision {
        start -= 1;
        text[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    if precision > 0 {
        start -= 1;
        text[start] = b'.';
    }
    loop {
        start -= 1;
        text[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if negative {
        start -= 1;
        text[start] = b'-';
    }
    out.extend_from_slice(&text[start..]);
}

/// Appends the shortest text that reads back as `v`: std's shortest
/// round-trip digits in positional form, or in exponent form when that is
/// shorter (`1e-7` rather than `0.0000001`); positional on a tie.
///
/// The digits are produced once, by std's `{:e}`; the positional form, the
/// text of std's `{}`, is laid out from them.
pub fn push_exact<A: Value>(out: &mut Vec<u8>, v: A, scratch: &mut String) {
    scratch.clear();
    let _ = write!(scratch, "{v:e}");
    let text = scratch.as_bytes();
    // `[-]d[.ddd]e[-]k` for finite values; `NaN`, `inf`, `-inf` otherwise.
    let Some(e) = text.iter().position(|&b| b == b'e') else {
        out.extend_from_slice(text);
        return;
    };
    let (mantissa, exponent) = (&text[..e], &text[e + 1..]);
    let (sign, mantissa) = match mantissa.split_first() {
        Some((b'-', rest)) => (&b"-"[..], rest),
        _ => (&b""[..], mantissa),
    };
    let (lead, rest) = mantissa.split_at(1.min(mantissa.len()));
    let rest = rest.strip_prefix(b".").unwrap_or(rest);
    // Written by std, so always a small integer; bail out to it otherwise.
    let Some(k) = std::str::from_utf8(exponent)
        .ok()
        .and_then(|k| k.parse::<i64>().ok())
    else {
        out.extend_from_slice(text);
        return;
    };
    let digits = 1 + rest.len() as i64;
    // Length of the positional form, without the sign.
    let positional = if k >= digits - 1 {
        k + 1
    } else if k >= 0 {
        digits + 1
    } else {
        digits + 1 - k
    };
    if ((text.len() - sign.len()) as i64) < positional {
        out.extend_from_slice(text);
    } else {
        out.extend_from_slice(sign);
        if k >= digits - 1 {
            out.extend_from_slice(lead);
            out.extend_from_slice(rest);
            out.resize(out.len() + (k - (digits - 1)) as usize, b'0');
        } else if k >= 0 {
            let split = k as usize;
            out.extend_from_slice(lead);
            out.extend_from_slice(&rest[..split]);
            out.push(b'.');
            out.extend_from_slice(&rest[split..]);
        } else {
            out.extend_from_slice(b"0.");
            out.resize(out.len() + (-k - 1) as usize, b'0');
            out.extend_from_slice(lead);
            out.extend_from_slice(rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fixed(v: f64, precision: usize) -> String {
        let mut out = Vec::new();
        push_fixed(&mut out, v, precision, &mut String::new());
        String::from_utf8(out).unwrap()
    }

    fn exact<A: Value>(v: A) -> String {
        let mut out = Vec::new();
        push_exact(&mut out, v, &mut String::new());
        String::from_utf8(out).unwrap()
    }

    /// std's fixed notation with the one rule the tool adds: no `-0.000`.
    fn reference(text: String) -> String {
        match text.strip_prefix('-') {
            Some(rest) if rest.bytes().all(|b| b == b'0' || b == b'.') => rest.to_string(),
            _ => text,
        }
    }

    #[test]
    fn seed_values_at_four_decimals() {
        // The LayerNorm trace of the lesson in closed form: x = [2, 4, 6, 8]
        // has mean 5 and variance 5; gamma = [2, 1, 1, 0.5], beta = [0, 0, 1, 0].
        let inv = 1.0 / (5.0_f64 + 1e-5).sqrt();
        let y = [2.0 * -3.0 * inv, -inv, inv + 1.0, 0.5 * 3.0 * inv];
        let text: Vec<String> = y.iter().map(|&v| fixed(v, 4)).collect();
        assert_eq!(text, ["-2.6833", "-0.4472", "1.4472", "0.6708"]);
    }

    #[test]
    fn no_negative_zero() {
        assert_eq!(fixed(-0.0, 4), "0.0000");
        assert_eq!(fixed(-0.00004, 4), "0.0000");
        assert_eq!(fixed(-0.00005000001, 4), "-0.0001");
        assert_eq!(fixed(-0.4, 0), "0");
        assert_eq!(fixed(-1e-300, 30), "0.000000000000000000000000000000");
        assert_eq!(fixed(-0.0, 20), "0.00000000000000000000");
    }

    #[test]
    fn ties_and_edges_match_std() {
        // Exact decimal ties go through std, which rounds them to even.
        assert_eq!(fixed(0.5, 0), "0");
        assert_eq!(fixed(1.5, 0), "2");
        assert_eq!(fixed(2.5, 0), "2");
        assert_eq!(fixed(0.125, 2), "0.12");
        assert_eq!(fixed(0.375, 2), "0.38");
        // 1.00005 is stored just below the tie, so it rounds down.
        assert_eq!(fixed(1.00005, 4), format!("{:.4}", 1.00005_f64));
        assert_eq!(fixed(f64::NAN, 4), "NaN");
        assert_eq!(fixed(f64::INFINITY, 4), "inf");
        assert_eq!(fixed(f64::NEG_INFINITY, 4), "-inf");
        assert_eq!(fixed(1e300, 2), format!("{:.2}", 1e300_f64));
        assert_eq!(fixed(123.456, 0), "123");
        assert_eq!(fixed(0.0, 0), "0");
        assert_eq!(fixed(9.99995, 4), format!("{:.4}", 9.99995_f64));
        assert_eq!(fixed(5e-324, 4), "0.0000");
        // |v| · 10ᵖ lands exactly on a half-integer although v is no tie:
        // std must decide these.
        assert_eq!(fixed(527_724.442_611_149_5, 9), "527724.442611150");
        assert_eq!(fixed(-527_724.442_611_149_5, 9), "-527724.442611150");
        let v = -4652.015_f32;
        let mut out = Vec::new();
        push(&mut out, v, Notation::Fixed(10), &mut String::new());
        assert_eq!(String::from_utf8(out).unwrap(), format!("{v:.10}"));
    }

    #[test]
    fn scaled_integers() {
        for (n, precision, negative, text) in [
            (0, 0, false, "0"),
            (0, 4, false, "0.0000"),
            (7, 0, true, "-7"),
            (42, 4, false, "0.0042"),
            (26833, 4, true, "-2.6833"),
            (100, 1, false, "10.0"),
            (9_999_999_999_999_999, 0, true, "-9999999999999999"),
            (9_999_999_999_999_999, 15, true, "-9.999999999999999"),
            (1, 15, false, "0.000000000000001"),
        ] {
            let mut out = Vec::new();
            push_scaled(&mut out, n, precision, negative);
            assert_eq!(String::from_utf8(out).unwrap(), text);
        }
    }

    #[test]
    fn exact_picks_the_shorter_notation() {
        assert_eq!(exact(0.5_f64), "0.5");
        assert_eq!(exact(1e-7_f64), "1e-7");
        assert_eq!(exact(0.0001_f64), "1e-4");
        assert_eq!(exact(100.0_f64), "100");
        assert_eq!(exact(1e21_f64), "1e21");
        assert_eq!(exact(-0.1_f32), "-0.1");
        assert_eq!(exact(f64::NAN), "NaN");
        assert_eq!(exact(f64::NEG_INFINITY), "-inf");
        assert_eq!(exact(-0.0_f64), "-0");
        assert_eq!(exact(0.0_f64), "0");
        assert_eq!(exact(123.456_f64), "123.456");
        assert_eq!(exact(-1.5e300_f64), "-1.5e300");
        assert_eq!(exact(1.25e-5_f64), "1.25e-5");
        assert_eq!(exact(0.00125_f64), "0.00125");
        assert_eq!(exact(12_500_f64), "12500");
        assert_eq!(exact(125_000_f64), "125000"); // a tie: positional
        assert_eq!(exact(1_250_000_f64), "1.25e6");
        assert_eq!(exact(f64::MIN_POSITIVE), "2.2250738585072014e-308");
    }

    /// Values at or next to a decimal tie `(k + 1/2) / 10ᵖ`, where a sloppy
    /// rounding would go wrong.
    fn near_tie() -> impl Strategy<Value = (f64, usize)> {
        (
            0_u64..2_000_000_000,
            0_usize..=15,
            -3_i64..=3,
            any::<bool>(),
        )
            .prop_map(|(k, p, step, negative)| {
                let tie = (k as f64 + 0.5) / 10f64.powi(p as i32);
                let bits = (tie.to_bits() as i64 + step) as u64;
                let v = f64::from_bits(bits);
                (if negative { -v } else { v }, p)
            })
    }

    proptest! {
        #[test]
        fn fixed_matches_std_on_any_bits(bits in any::<u64>(), p in 0_usize..=20) {
            let v = f64::from_bits(bits);
            prop_assert_eq!(fixed(v, p), reference(format!("{v:.p$}")));
        }

        #[test]
        fn fixed_matches_std_on_moderate_values(v in -1e6_f64..1e6, p in 0_usize..=16) {
            prop_assert_eq!(fixed(v, p), reference(format!("{v:.p$}")));
        }

        #[test]
        fn fixed_matches_std_near_ties((v, p) in near_tie()) {
            prop_assert_eq!(fixed(v, p), reference(format!("{v:.p$}")));
        }

        #[test]
        fn fixed_matches_std_for_f32(v in any::<f32>(), p in 0_usize..=12) {
            let mut out = Vec::new();
            push(&mut out, v, Notation::Fixed(p), &mut String::new());
            prop_assert_eq!(String::from_utf8(out).unwrap(), reference(format!("{v:.p$}")));
        }

        #[test]
        fn exact_is_the_shorter_of_std_forms(bits in any::<u64>(), bits32 in any::<u32>(), small in -1e-3_f64..1e3) {
            fn shorter(positional: String, exponent: String) -> String {
                if exponent.len() < positional.len() { exponent } else { positional }
            }
            for v in [f64::from_bits(bits), small] {
                prop_assert_eq!(exact(v), shorter(format!("{v}"), format!("{v:e}")));
            }
            let v = f32::from_bits(bits32);
            prop_assert_eq!(exact(v), shorter(format!("{v}"), format!("{v:e}")));
        }

        #[test]
        fn exact_reads_back(bits in any::<u64>(), bits32 in any::<u32>()) {
            let v = f64::from_bits(bits);
            let back: f64 = exact(v).parse().unwrap();
            prop_assert!(back.to_bits() == v.to_bits() || (v.is_nan() && back.is_nan()));
            let v = f32::from_bits(bits32);
            let back: f32 = exact(v).parse().unwrap();
            prop_assert!(back.to_bits() == v.to_bits() || (v.is_nan() && back.is_nan()));
        }
    }
}
