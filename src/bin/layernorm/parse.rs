//! Splitting one input line into its keyword and its numbers.
//!
//! A line is bytes, not text: tokens are separated by spaces and tabs, the
//! keyword is matched without regard to ASCII case, and each other token
//! must read as a number of the element type (std's float syntax: decimal
//! and exponent forms, `inf`, `infinity` and `nan` in any case, with an
//! optional sign). Nothing here allocates: numbers go into a caller's
//! buffer, and errors borrow the offending token from the line.

use std::fmt;
use std::str::FromStr;

use ndarray_layernorm::prelude::*;

/// An element type the tool computes in: `f64` (the default) or `f32`.
pub trait Value: NormScalar + FromStr + fmt::LowerExp {
    /// The `eps` in force until an `EPS` line sets one.
    const DEFAULT_EPS: Self;

    /// The type's name in messages.
    const NAME: &'static str;

    /// Widens to `f64`, exactly.
    fn to_f64(self) -> f64;

    /// `± m · 10ᵉ` correctly rounded, when one exact operation gives it:
    /// `m` and `10^|e|` both exact in the type, then one IEEE multiply or
    /// divide, which rounds once (Clinger's fast path). `None` otherwise.
    fn from_decimal(decimal: Decimal) -> Option<Self>;
}

impl Value for f64 {
    const DEFAULT_EPS: Self = 1e-5;
    const NAME: &'static str = "f64";

    fn to_f64(self) -> f64 {
        self
    }

    fn from_decimal(decimal: Decimal) -> Option<Self> {
        const POW10: [f64; 23] = [
            1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
            1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
        ];
        if decimal.mantissa > 1 << 53 {
            return None;
        }
        let m = decimal.mantissa as f64;
        let scale = *POW10.get(decimal.exponent.unsigned_abs() as usize)?;
        let v = if decimal.exponent < 0 {
            m / scale
        } else {
            m * scale
        };
        Some(if decimal.negative { -v } else { v })
    }
}

impl Value for f32 {
    const DEFAULT_EPS: Self = 1e-5;
    const NAME: &'static str = "f32";

    fn to_f64(self) -> f64 {
        f64::from(self)
    }

    fn from_decimal(decimal: Decimal) -> Option<Self> {
        const POW10: [f32; 11] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10];
        if decimal.mantissa > 1 << 24 {
            return None;
        }
        let m = decimal.mantissa as f32;
        let scale = *POW10.get(decimal.exponent.unsigned_abs() as usize)?;
        let v = if decimal.exponent < 0 {
            m / scale
        } else {
            m * scale
        };
        Some(if decimal.negative { -v } else { v })
    }
}

/// A number token of the plain form `[+-]digits[.digits][(e|E)[+-]digits]`
/// (at least one mantissa digit), as `± mantissa · 10^exponent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decimal {
    /// The token starts with `-`.
    pub negative: bool,
    /// All digits before the exponent, the decimal point removed.
    pub mantissa: u64,
    /// The written exponent minus the number of digits after the point.
    pub exponent: i32,
}

/// Reads a token of the plain decimal form. `None` if it has another form
/// (which std may still accept, such as `inf`) or more digits than fit a
/// `u64` or an exponent of more than four digits (which std reads).
pub fn scan_decimal(token: &[u8]) -> Option<Decimal> {
    let (negative, rest) = match token.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, token),
    };
    let mut mantissa = 0_u64;
    let mut digits = 0;
    let mut after_point = None;
    let mut rest = rest;
    while let Some((&b, tail)) = rest.split_first() {
        match b {
            b'0'..=b'9' => {
                mantissa = mantissa.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
                digits += 1;
                if let Some(n) = after_point.as_mut() {
                    *n += 1;
                }
            }
            b'.' if after_point.is_none() => after_point = Some(0_i32),
            _ => break,
        }
        rest = tail;
    }
    if digits == 0 {
        return None;
    }
    let mut exponent = 0_i32;
    if let Some((&(b'e' | b'E'), tail)) = rest.split_first() {
        let (sign, tail) = match tail.split_first() {
            Some((b'-', tail)) => (-1, tail),
            Some((b'+', tail)) => (1, tail),
            _ => (1, tail),
        };
        if tail.is_empty() || tail.len() > 4 || !tail.iter().all(u8::is_ascii_digit) {
            return None;
        }
        exponent = sign * tail.iter().fold(0, |e, &b| e * 10 + i32::from(b - b'0'));
        rest = &[];
    }
    if !rest.is_empty() {
        return None;
    }
    Some(Decimal {
        negative,
        mantissa,
        exponent: exponent - after_point.unwrap_or(0),
    })
}

/// The record types of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keyword {
    /// `EPS v`: sets eps.
    Eps,
    /// `GAMMA v1 … vd`: sets the gain.
    Gamma,
    /// `BETA v1 … vd`: sets the shift.
    Beta,
    /// `LN x1 … xd`: answers with the LayerNorm of the row.
    Ln,
    /// `RMS x1 … xd`: answers with the RMSNorm of the row.
    Rms,
}

impl Keyword {
    const ALL: [Keyword; 5] = [
        Keyword::Eps,
        Keyword::Gamma,
        Keyword::Beta,
        Keyword::Ln,
        Keyword::Rms,
    ];

    /// The keyword as written in the protocol.
    pub fn name(self) -> &'static str {
        match self {
            Keyword::Eps => "EPS",
            Keyword::Gamma => "GAMMA",
            Keyword::Beta => "BETA",
            Keyword::Ln => "LN",
            Keyword::Rms => "RMS",
        }
    }

    fn from_token(token: &[u8]) -> Option<Keyword> {
        Keyword::ALL
            .into_iter()
            .find(|k| token.eq_ignore_ascii_case(k.name().as_bytes()))
    }
}

impl fmt::Display for Keyword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a well-formed line holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Line {
    /// A blank line or a comment.
    Skip,
    /// A keyword; its numbers are in the caller's buffer.
    Record(Keyword),
}

/// Why a line could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParseError<'a> {
    /// The first token is not one of the keywords.
    UnknownKeyword(&'a [u8]),
    /// A token after the keyword does not read as a number.
    NotANumber(&'a [u8]),
    /// A token writes a finite number beyond the largest of the element
    /// type (named), which would otherwise read as an infinity.
    TooLarge(&'a [u8], &'static str),
    /// A token writes a nonzero number of at most half the least subnormal of
    /// the element type (named), which would otherwise read as zero.
    TooSmall(&'a [u8], &'static str),
    /// The keyword is alone on its line.
    NoValues(Keyword),
}

impl fmt::Display for ParseError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ParseError::UnknownKeyword(token) => write!(
                f,
                "unknown keyword {} (expected EPS, GAMMA, BETA, LN or RMS)",
                Quoted(token)
            ),
            ParseError::NotANumber(token) => write!(f, "{} is not a number", Quoted(token)),
            ParseError::TooLarge(token, name) => {
                write!(f, "{} is too large for {name}", Quoted(token))
            }
            ParseError::TooSmall(token, name) => {
                write!(
                    f,
                    "{} is too small for {name} (it would read as 0)",
                    Quoted(token)
                )
            }
            ParseError::NoValues(keyword) => write!(f, "{keyword} has no values"),
        }
    }
}

/// The line without its terminator: one trailing `\n`, then one `\r`.
pub fn content(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The tokens of a line (without its terminator): the runs of bytes
/// between spaces and tabs.
pub fn tokens(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|&b| b == b' ' || b == b'\t')
        .filter(|token| !token.is_empty())
}

/// Reads one line (without its terminator). On success the numbers after
/// the keyword replace the contents of `values`; on error `values` holds
/// an unspecified prefix of them.
///
/// # Errors
///
/// An unknown keyword, a token that is not a number or writes a finite
/// number too large for `A` or a nonzero one that `A` would read as zero,
/// or a keyword without values; each names what is wrong.
pub fn parse_line<'a, A: Value>(
    line: &'a [u8],
    values: &mut Vec<A>,
) -> Result<Line, ParseError<'a>> {
    values.clear();
    let mut tokens = tokens(line);
    let Some(first) = tokens.next() else {
        return Ok(Line::Skip);
    };
    if first.starts_with(b"#") {
        return Ok(Line::Skip);
    }
    let keyword = Keyword::from_token(first).ok_or(ParseError::UnknownKeyword(first))?;
    for token in tokens {
        let value: A = number(token).ok_or(ParseError::NotANumber(token))?;
        let read = value.to_f64();
        if read.is_infinite() && !names_infinity(token) {
            return Err(ParseError::TooLarge(token, A::NAME));
        }
        if read == 0.0 && names_nonzero(token) {
            return Err(ParseError::TooSmall(token, A::NAME));
        }
        values.push(value);
    }
    if values.is_empty() {
        return Err(ParseError::NoValues(keyword));
    }
    Ok(Line::Record(keyword))
}

/// Whether a token spells an infinity (`inf` or `infinity`, any case, with
/// an optional sign) rather than a finite number that overflows.
fn names_infinity(token: &[u8]) -> bool {
    let unsigned = token
        .strip_prefix(b"+")
        .or(token.strip_prefix(b"-"))
        .unwrap_or(token);
    unsigned.eq_ignore_ascii_case(b"inf") || unsigned.eq_ignore_ascii_case(b"infinity")
}

/// Whether a token that reads as a number writes a nonzero one: a digit
/// other than 0 before its exponent (`nan` and `inf` never read as zero).
fn names_nonzero(token: &[u8]) -> bool {
    token
        .iter()
        .take_while(|&&b| !matches!(b, b'e' | b'E'))
        .any(|b| matches!(b, b'1'..=b'9'))
}

/// A token read as a number, if it is one: the fast path for plain
/// decimals, std's parser for everything else. Both round correctly, so
/// they agree wherever the fast path applies.
pub fn number<A: Value>(token: &[u8]) -> Option<A> {
    if let Some(v) = scan_decimal(token).and_then(A::from_decimal) {
        return Some(v);
    }
    std::str::from_utf8(token).ok()?.parse().ok()
}

/// Longest stretch of a token quoted in a message, in characters.
const QUOTE_LIMIT: usize = 40;

/// A token shown in a message: in double quotes, with control characters,
/// quotes and backslashes escaped as Rust would, bytes that are not UTF-8
/// as `\xNN`, and anything past [`QUOTE_LIMIT`] characters cut to `...`.
pub struct Quoted<'a>(pub &'a [u8]);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        let mut shown = 0;
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                if shown == QUOTE_LIMIT {
                    return f.write_str("...\"");
                }
                write!(f, "{}", c.escape_debug())?;
                shown += 1;
            }
            for byte in chunk.invalid() {
                if shown == QUOTE_LIMIT {
                    return f.write_str("...\"");
                }
                write!(f, "\\x{byte:02x}")?;
                shown += 1;
            }
        }
        f.write_str("\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(line: &str) -> (Result<Line, String>, Vec<f64>) {
        let mut values = Vec::new();
        let result = parse_line::<f64>(line.as_bytes(), &mut values).map_err(|e| e.to_string());
        (result, values)
    }

    #[test]
    fn keywords_are_case_insensitive() {
        for (text, keyword) in [
            ("eps 1", Keyword::Eps),
            ("Gamma 1", Keyword::Gamma),
            ("bEtA 1", Keyword::Beta),
            ("ln 1", Keyword::Ln),
            ("Rms 1", Keyword::Rms),
        ] {
            assert_eq!(parse(text), (Ok(Line::Record(keyword)), vec![1.0]));
        }
    }

    #[test]
    fn spaces_and_tabs_separate_tokens() {
        assert_eq!(
            parse("\t LN\t2  4\t\t6 8 \t"),
            (Ok(Line::Record(Keyword::Ln)), vec![2.0, 4.0, 6.0, 8.0])
        );
    }

    #[test]
    fn blank_and_comment_lines_are_skipped() {
        for text in ["", "   ", "\t", "#", "# LN 1 2", "#LN", "  # indented"] {
            assert_eq!(parse(text), (Ok(Line::Skip), vec![]), "{text:?}");
        }
    }

    #[test]
    fn numbers_take_std_float_forms() {
        let (result, values) = parse("LN 1 -2.5 +3 .5 6. 1e3 -1E-2 2.5e+1");
        assert_eq!(result, Ok(Line::Record(Keyword::Ln)));
        assert_eq!(values, [1.0, -2.5, 3.0, 0.5, 6.0, 1000.0, -0.01, 25.0]);
        let (result, values) = parse("LN inf -Infinity NaN nan");
        assert_eq!(result, Ok(Line::Record(Keyword::Ln)));
        assert_eq!(values[..2], [f64::INFINITY, f64::NEG_INFINITY]);
        assert!(values[2].is_nan() && values[3].is_nan());
    }

    #[test]
    fn f32_tokens_are_rounded_once() {
        // Just above 1 + 2^-24, the midpoint between the f32 values 1 and
        // 1 + 2^-23. Rounded to f64 first it lands on the midpoint and then
        // ties to 1; read directly as f32 it rounds up, as it must.
        let token = "1.00000005960464477539062501";
        assert_eq!(token.parse::<f64>().unwrap() as f32, 1.0);
        let mut values = Vec::new();
        let text = format!("LN {token}");
        let line = parse_line::<f32>(text.as_bytes(), &mut values);
        assert_eq!(line, Ok(Line::Record(Keyword::Ln)));
        assert_eq!(values, [1.0 + f32::EPSILON]);
    }

    #[test]
    fn finite_tokens_beyond_the_type_are_refused() {
        let mut values = Vec::new();
        let line = parse_line::<f32>(b"GAMMA 1 1e39", &mut values);
        assert_eq!(line, Err(ParseError::TooLarge(b"1e39", "f32")));
        assert_eq!(
            line.map_err(|e| e.to_string()),
            Err("\"1e39\" is too large for f32".into())
        );
        // The largest f32, and what rounds to it, still read; so do the
        // infinities written as such.
        let line = parse_line::<f32>(b"LN 3.4028235e38 -3.40282356e38 inf -INFINITY", &mut values);
        assert_eq!(line, Ok(Line::Record(Keyword::Ln)));
        assert_eq!(
            values,
            [f32::MAX, -f32::MAX, f32::INFINITY, f32::NEG_INFINITY]
        );
        let line = parse_line::<f64>(b"LN 1e39 +Inf", &mut Vec::new());
        assert_eq!(line, Ok(Line::Record(Keyword::Ln)));
    }

    #[test]
    fn nonzero_tokens_below_the_type_are_refused() {
        let mut values = Vec::new();
        // Half the least f32 subnormal (2^-150, about 7.0e-46) and less
        // round to zero.
        let line = parse_line::<f32>(b"LN 1e-46 2e-46", &mut values);
        assert_eq!(line, Err(ParseError::TooSmall(b"1e-46", "f32")));
        assert_eq!(
            line.map_err(|e| e.to_string()),
            Err("\"1e-46\" is too small for f32 (it would read as 0)".into())
        );
        let mut doubles = Vec::new();
        let line = parse_line::<f64>(b"GAMMA 1 -0.00001e-320", &mut doubles);
        assert_eq!(line, Err(ParseError::TooSmall(b"-0.00001e-320", "f64")));
        // Subnormals that the type holds still read, and so do zeros
        // written in any form.
        let line = parse_line::<f32>(b"LN 1e-45 -0 0.000e-99 0E5 .0", &mut values);
        assert_eq!(line, Ok(Line::Record(Keyword::Ln)));
        assert_eq!(values[0], f32::from_bits(1));
        assert!(values[1..].iter().all(|&v| v == 0.0));
        let line = parse_line::<f64>(b"LN 1e-46 5e-324", &mut doubles);
        assert_eq!(line, Ok(Line::Record(Keyword::Ln)));
        assert_eq!(doubles, [1e-46, f64::from_bits(1)]);
    }

    #[test]
    fn errors_name_the_token() {
        assert_eq!(
            parse("LNX 1").0,
            Err("unknown keyword \"LNX\" (expected EPS, GAMMA, BETA, LN or RMS)".into())
        );
        assert_eq!(parse("LN 1 x2 3").0, Err("\"x2\" is not a number".into()));
        assert_eq!(parse("LN 1 1,5").0, Err("\"1,5\" is not a number".into()));
        assert_eq!(
            parse("LN 1 1e309").0,
            Err("\"1e309\" is too large for f64".into())
        );
        assert_eq!(
            parse("EPS -2e308").0,
            Err("\"-2e308\" is too large for f64".into())
        );
        assert_eq!(parse("gamma").0, Err("GAMMA has no values".into()));
        assert_eq!(parse("RMS  \t").0, Err("RMS has no values".into()));
    }

    #[test]
    fn quoted_tokens_are_escaped_and_cut() {
        assert_eq!(Quoted(b"a\"b\\c").to_string(), r#""a\"b\\c""#);
        assert_eq!(Quoted(b"\x01\xffz").to_string(), r#""\u{1}\xffz""#);
        assert_eq!(Quoted("πr".as_bytes()).to_string(), "\"πr\"");
        let long = [b'7'; 50];
        assert_eq!(
            Quoted(&long).to_string(),
            format!("\"{}...\"", "7".repeat(40))
        );
    }

    #[test]
    fn content_strips_one_terminator() {
        assert_eq!(content(b"LN 1\r\n"), b"LN 1");
        assert_eq!(content(b"LN 1\n"), b"LN 1");
        assert_eq!(content(b"LN 1\r"), b"LN 1");
        assert_eq!(content(b"LN 1"), b"LN 1");
        assert_eq!(content(b"LN 1\r\r\n"), b"LN 1\r");
    }

    /// Tokens that look like the protocol, and some that only nearly do.
    fn token() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("LN".to_string()),
            Just("rms".to_string()),
            Just("GAMMA".to_string()),
            Just("beta".to_string()),
            Just("EPS".to_string()),
            Just("#".to_string()),
            Just("nan".to_string()),
            Just("-inf".to_string()),
            any::<f64>().prop_map(|v| v.to_string()),
            any::<f32>().prop_map(|v| format!("{v:e}")),
            "[-+.eE0-9]{1,6}",
            "[ \t\r#a-zA-Z]{1,3}",
            any::<char>().prop_map(String::from),
        ]
    }

    #[test]
    fn scan_reads_plain_decimals() {
        let d = |negative, mantissa, exponent| {
            Some(Decimal {
                negative,
                mantissa,
                exponent,
            })
        };
        assert_eq!(scan_decimal(b"-2.6833"), d(true, 26833, -4));
        assert_eq!(scan_decimal(b"+12"), d(false, 12, 0));
        assert_eq!(scan_decimal(b".5e3"), d(false, 5, 2));
        assert_eq!(scan_decimal(b"5.E-3"), d(false, 5, -3));
        assert_eq!(scan_decimal(b"0.000"), d(false, 0, -3));
        for other in [
            &b""[..],
            b"-",
            b".",
            b"e5",
            b"1e",
            b"1e+",
            b"1e12345",
            b"1.2.3",
            b"1,5",
            b"inf",
            b"nan",
            b"--1",
            b"1 ",
            b"99999999999999999999",
        ] {
            assert_eq!(scan_decimal(other), None, "{}", Quoted(other));
        }
    }

    #[test]
    fn fast_path_bounds() {
        let f64_of = |token: &[u8]| scan_decimal(token).and_then(f64::from_decimal);
        let f32_of = |token: &[u8]| scan_decimal(token).and_then(f32::from_decimal);
        assert_eq!(f64_of(b"9007199254740992"), Some(9_007_199_254_740_992.0));
        assert_eq!(f64_of(b"9007199254740993"), None);
        assert_eq!(f64_of(b"1e22"), Some(1e22));
        assert_eq!(f64_of(b"1e23"), None);
        assert_eq!(f64_of(b"-0.0"), Some(-0.0));
        assert!(f64_of(b"-0.0").unwrap().is_sign_negative());
        assert_eq!(f32_of(b"16777216"), Some(16_777_216.0));
        assert_eq!(f32_of(b"16777217"), None);
        assert_eq!(f32_of(b"1e-11"), None);
        // Past the bounds, one more rounding (of the mantissa) would make
        // these differ from the correctly rounded value; std reads them.
        for token in ["41190101579062074e-7", "0.00012026814"] {
            assert_eq!(number::<f64>(token.as_bytes()), token.parse().ok());
        }
        for token in ["-43342153E-9", "0.00012026814"] {
            assert_eq!(number::<f32>(token.as_bytes()), token.parse().ok());
        }
    }

    /// Plain decimal tokens of every length and exponent, around the fast
    /// path's bounds.
    fn decimal_token() -> impl Strategy<Value = String> {
        prop_oneof![
            (
                "[-+]?[0-9]{1,20}",
                "(\\.[0-9]{0,20})?",
                "([eE][-+]?[0-9]{1,3})?"
            )
                .prop_map(|(a, b, c)| a + &b + &c),
            (any::<f64>(), 0_usize..25).prop_map(|(v, p)| format!("{v:.p$}")),
            any::<f64>().prop_map(|v| format!("{v:e}")),
            any::<f32>().prop_map(|v| v.to_string()),
            // Mantissas and exponents on both sides of the f64 and f32 bounds.
            ((1_u64 << 50)..(1 << 58), -25_i32..=25).prop_map(|(m, e)| format!("{m}e{e}")),
            ((1_u64 << 21)..(1 << 27), -13_i32..=13).prop_map(|(m, e)| format!("-{m}E{e}")),
        ]
    }

    proptest! {
        #[test]
        fn numbers_equal_std(token in decimal_token()) {
            let read64 = number::<f64>(token.as_bytes());
            let std64 = token.parse::<f64>().ok();
            prop_assert_eq!(read64.map(f64::to_bits), std64.map(f64::to_bits));
            let read32 = number::<f32>(token.as_bytes());
            let std32 = token.parse::<f32>().ok();
            prop_assert_eq!(read32.map(f32::to_bits), std32.map(f32::to_bits));
        }

        #[test]
        fn arbitrary_bytes_never_panic(line in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut values = Vec::new();
            let _ = parse_line::<f64>(&line, &mut values);
            let _ = parse_line::<f32>(&line, &mut Vec::new());
            if let Err(e) = parse_line::<f64>(&line, &mut values) {
                let _ = e.to_string();
            }
        }

        #[test]
        fn token_soup_never_panics(soup in proptest::collection::vec(token(), 0..12), sep in "[ \t]{1,2}") {
            let line = soup.join(&sep);
            let mut values = Vec::new();
            match parse_line::<f64>(line.as_bytes(), &mut values) {
                Ok(Line::Record(_)) => prop_assert!(!values.is_empty()),
                Ok(Line::Skip) => prop_assert!(values.is_empty()),
                Err(e) => prop_assert!(e.to_string().len() < 200),
            }
        }

        #[test]
        fn written_numbers_read_back(values in proptest::collection::vec(any::<f64>(), 1..20)) {
            let line = format!("LN {}", values.iter().map(|v| format!("{v:e}")).collect::<Vec<_>>().join(" "));
            let mut read = Vec::new();
            prop_assert_eq!(parse_line::<f64>(line.as_bytes(), &mut read), Ok(Line::Record(Keyword::Ln)));
            prop_assert_eq!(read.len(), values.len());
            for (r, v) in read.iter().zip(&values) {
                prop_assert!(r.to_bits() == v.to_bits() || (r.is_nan() && v.is_nan()));
            }
        }
    }
}
