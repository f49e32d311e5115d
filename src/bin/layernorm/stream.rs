//! The line protocol, streamed: reads records one line at a time, keeps
//! `eps`, `gamma` and `beta` in force, and answers every `LN` and `RMS` line
//! with one output line computed by the library.
//!
//! Memory stays flat: the line, the row, the output row and the output text
//! live in buffers that are reused from line to line and only grow to the
//! longest line seen.

use std::fmt;
use std::io::{self, BufRead, Write};

use ndarray::{ArrayView1, ArrayViewMut1};
use ndarray_layernorm::prelude::*;

use crate::format::{self, Notation};
use crate::parse::{self, Keyword, Line, ParseError, Quoted, Value};

/// How to process the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// How output numbers are written.
    pub notation: Notation,
    /// Report a bad line and carry on, rather than stop at it.
    pub keep_going: bool,
}

/// How a run ended.
#[derive(Debug)]
pub struct Report {
    /// Number of lines reported as bad.
    pub bad_lines: u64,
    /// Set if the run stopped because the input or the output failed.
    pub failure: Option<Failure>,
}

/// An I/O failure that stopped a run.
#[derive(Debug)]
pub enum Failure {
    /// Reading the input failed.
    Read(io::Error),
    /// Writing the output failed.
    Write(io::Error),
}

/// Why one line was rejected.
#[derive(Debug)]
enum LineError<'a> {
    Parse(ParseError<'a>),
    /// `EPS` with more than one value.
    EpsCount(usize),
    /// `EPS` with a negative, NaN or infinite value.
    BadEps(&'a [u8]),
    /// `GAMMA` or `BETA` with a NaN or infinite value.
    BadParam(Keyword, &'a [u8]),
    /// An output of a row of finite numbers beyond the type's range (a
    /// large gamma or beta).
    Overflow(&'static str),
    /// The row's length differs from a parameter's.
    RowLength {
        keyword: Keyword,
        found: usize,
        param: Keyword,
        param_len: usize,
        param_line: u64,
    },
    /// The GAMMA and BETA in force have different lengths.
    GammaBeta {
        gamma_len: usize,
        gamma_line: u64,
        beta_len: usize,
        beta_line: u64,
    },
    /// The library refused the row (the checks above should prevent it).
    Library(NormError),
}

impl fmt::Display for LineError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::Parse(e) => e.fmt(f),
            LineError::EpsCount(n) => write!(f, "EPS takes one value, found {n}"),
            LineError::BadEps(token) => write!(
                f,
                "eps must be finite and non-negative, found {}",
                Quoted(token)
            ),
            LineError::BadParam(keyword, token) => {
                write!(f, "{keyword} values must be finite, found {}", Quoted(token))
            }
            LineError::Overflow(name) => write!(
                f,
                "the output does not fit in {name} (gamma or beta too large)"
            ),
            LineError::RowLength {
                keyword,
                found,
                param,
                param_len,
                param_line,
            } => write!(
                f,
                "{keyword} row has {found} values but {param} (line {param_line}) has {param_len}"
            ),
            LineError::GammaBeta {
                gamma_len,
                gamma_line,
                beta_len,
                beta_line,
            } => write!(
                f,
                "GAMMA (line {gamma_line}) has {gamma_len} values but BETA (line {beta_line}) has {beta_len}"
            ),
            LineError::Library(e) => write!(f, "cannot normalise the row: {e}"),
        }
    }
}

impl<'a> From<ParseError<'a>> for LineError<'a> {
    fn from(e: ParseError<'a>) -> Self {
        LineError::Parse(e)
    }
}

/// A GAMMA or BETA vector and the line that set it (`None`: not set, the
/// default for each row's length applies).
struct Param<A> {
    values: Vec<A>,
    line: Option<u64>,
}

impl<A> Param<A> {
    fn new() -> Self {
        Param {
            values: Vec::new(),
            line: None,
        }
    }
}

/// Everything in force between lines, and the reused buffers.
struct State<A: Value> {
    eps: A,
    gamma: Param<A>,
    beta: Param<A>,
    /// The numbers of the current line.
    values: Vec<A>,
    /// The output row.
    out: Vec<A>,
    /// All ones and all zeros, as long as the longest row that needed them.
    ones: Vec<A>,
    zeros: Vec<A>,
    /// The output line's text.
    text: Vec<u8>,
    /// Scratch space for numbers formatted by std.
    scratch: String,
    notation: Notation,
}

impl<A: Value> State<A> {
    fn new(notation: Notation) -> Self {
        State {
            eps: A::DEFAULT_EPS,
            gamma: Param::new(),
            beta: Param::new(),
            values: Vec::new(),
            out: Vec::new(),
            ones: Vec::new(),
            zeros: Vec::new(),
            text: Vec::new(),
            scratch: String::new(),
            notation,
        }
    }

    /// Handles line `number` (with its terminator). Returns whether
    /// `self.text` holds an output line to write.
    fn line<'a>(&mut self, line: &'a [u8], number: u64) -> Result<bool, LineError<'a>> {
        let mut line = parse::content(line);
        if number == 1 {
            // A byte-order mark, as some editors write at the start of a file.
            line = line.strip_prefix("\u{feff}".as_bytes()).unwrap_or(line);
        }
        let keyword = match parse::parse_line(line, &mut self.values)? {
            Line::Skip => return Ok(false),
            Line::Record(keyword) => keyword,
        };
        match keyword {
            Keyword::Eps => {
                let &[eps] = self.values.as_slice() else {
                    return Err(LineError::EpsCount(self.values.len()));
                };
                if !(eps.is_finite() && eps >= A::zero()) {
                    let token = parse::tokens(line).nth(1).unwrap_or_default();
                    return Err(LineError::BadEps(token));
                }
                self.eps = eps;
                Ok(false)
            }
            Keyword::Gamma | Keyword::Beta => {
                if let Some(at) = self.values.iter().position(|v| !v.is_finite()) {
                    let token = parse::tokens(line).nth(at + 1).unwrap_or_default();
                    return Err(LineError::BadParam(keyword, token));
                }
                let param = if keyword == Keyword::Gamma {
                    &mut self.gamma
                } else {
                    &mut self.beta
                };
                // The old vector's buffer becomes the next line's.
                std::mem::swap(&mut param.values, &mut self.values);
                param.line = Some(number);
                Ok(false)
            }
            Keyword::Ln | Keyword::Rms => {
                self.check_lengths(keyword)?;
                self.normalise(keyword).map_err(LineError::Library)?;
                // Gamma and beta are finite, so an infinite output of a
                // finite row overflowed.
                let overflowed = self.out.iter().any(|v| v.is_infinite());
                if overflowed && self.values.iter().all(|v| v.is_finite()) {
                    return Err(LineError::Overflow(A::NAME));
                }
                self.render();
                Ok(true)
            }
        }
    }

    /// The row's length must match each parameter that applies and is set.
    fn check_lengths(&self, keyword: Keyword) -> Result<(), LineError<'static>> {
        let d = self.values.len();
        let uses_beta = keyword == Keyword::Ln;
        if let (Some(gamma_line), Some(beta_line), true) =
            (self.gamma.line, self.beta.line, uses_beta)
        {
            if self.gamma.values.len() != self.beta.values.len() {
                return Err(LineError::GammaBeta {
                    gamma_len: self.gamma.values.len(),
                    gamma_line,
                    beta_len: self.beta.values.len(),
                    beta_line,
                });
            }
        }
        let params = [
            (Keyword::Gamma, &self.gamma, true),
            (Keyword::Beta, &self.beta, uses_beta),
        ];
        for (name, param, applies) in params {
            if let (Some(line), true) = (param.line, applies) {
                if param.values.len() != d {
                    return Err(LineError::RowLength {
                        keyword,
                        found: d,
                        param: name,
                        param_len: param.values.len(),
                        param_line: line,
                    });
                }
            }
        }
        Ok(())
    }

    /// Computes the row into `self.out` with the library.
    fn normalise(&mut self, keyword: Keyword) -> Result<(), NormError> {
        let d = self.values.len();
        let x = ArrayView1::from(self.values.as_slice());
        self.out.resize(d, A::zero());
        let mut y = ArrayViewMut1::from(self.out.as_mut_slice());
        let gamma = self.gamma.line.map(|_| self.gamma.values.as_slice());
        let beta = self.beta.line.map(|_| self.beta.values.as_slice());
        match keyword {
            Keyword::Rms => match gamma {
                None => x.rms_norm_plain_into(&mut y, self.eps),
                Some(gamma) => x.rms_norm_into(&mut y, &ArrayView1::from(gamma), self.eps),
            },
            _ => match (gamma, beta) {
                (None, None) => x.layer_norm_plain_into(&mut y, self.eps),
                (gamma, beta) => {
                    let gamma = gamma.unwrap_or_else(|| filled(&mut self.ones, d, A::one()));
                    let beta = beta.unwrap_or_else(|| filled(&mut self.zeros, d, A::zero()));
                    x.layer_norm_into(
                        &mut y,
                        &ArrayView1::from(gamma),
                        &ArrayView1::from(beta),
                        self.eps,
                    )
                }
            },
        }
    }

    /// Writes `self.out` as one output line into `self.text`.
    fn render(&mut self) {
        self.text.clear();
        for (i, &v) in self.out.iter().enumerate() {
            if i > 0 {
                self.text.push(b' ');
            }
            format::push(&mut self.text, v, self.notation, &mut self.scratch);
        }
        self.text.push(b'\n');
    }
}

/// The first `d` elements of `buffer`, all equal to `value` (the buffer
/// only ever holds `value`, and grows as needed).
fn filled<A: Copy>(buffer: &mut Vec<A>, d: usize, value: A) -> &[A] {
    if buffer.len() < d {
        buffer.resize(d, value);
    }
    &buffer[..d]
}

/// Runs the protocol over `input`, writing answers to `output` and one
/// `layernorm: line N: …` message per bad line to `errors`.
///
/// Stops at the first bad line unless `options.keep_going`; `output` is
/// flushed before each message, so every answer to the lines before a bad
/// one is out first.
pub fn run<A: Value>(
    input: &mut impl BufRead,
    output: &mut impl Write,
    errors: &mut impl Write,
    options: Options,
) -> Report {
    let mut state = State::<A>::new(options.notation);
    let mut line = Vec::new();
    let mut number = 0_u64;
    let mut bad_lines = 0_u64;
    let mut message = String::new();
    let failure = loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) => break output.flush().err().map(Failure::Write),
            Ok(_) => {}
            Err(e) => {
                // Keep what was answered; the read error is what gets reported.
                let _ = output.flush();
                break Some(Failure::Read(e));
            }
        }
        number += 1;
        match state.line(&line, number) {
            Ok(false) => {}
            Ok(true) => {
                if let Err(e) = output.write_all(&state.text) {
                    break Some(Failure::Write(e));
                }
            }
            Err(e) => {
                bad_lines += 1;
                if let Err(e) = output.flush() {
                    break Some(Failure::Write(e));
                }
                message.clear();
                {
                    use std::fmt::Write as _;
                    let _ = writeln!(message, "layernorm: line {number}: {e}");
                }
                // Nothing better to do if stderr itself fails.
                let _ = errors.write_all(message.as_bytes());
                if !options.keep_going {
                    break None;
                }
            }
        }
    };
    Report { bad_lines, failure }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array1, Array2};
    use proptest::prelude::*;

    /// Runs the protocol over `input`; returns stdout, stderr and the report.
    fn run_on<A: Value>(input: &[u8], options: Options) -> (String, String, Report) {
        let mut output = Vec::new();
        let mut errors = Vec::new();
        let report = run::<A>(&mut &input[..], &mut output, &mut errors, options);
        let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
        (text(output), text(errors), report)
    }

    const FIXED4: Options = Options {
        notation: Notation::Fixed(4),
        keep_going: false,
    };

    #[test]
    fn seed_trace() {
        let input = b"EPS 1e-5\nGAMMA 2 1 1 0.5\nBETA 0 0 1 0\nLN 2 4 6 8\n";
        let (out, err, report) = run_on::<f64>(input, FIXED4);
        assert_eq!(out, "-2.6833 -0.4472 1.4472 0.6708\n");
        assert_eq!(err, "");
        assert_eq!(report.bad_lines, 0);
        assert!(report.failure.is_none());
    }

    #[test]
    fn a_bad_line_stops_after_the_answers_before_it() {
        let input = b"LN 3 4\nLN 3 x\nLN 3 4\n";
        let (out, err, report) = run_on::<f64>(input, FIXED4);
        assert_eq!(out, "-1.0000 1.0000\n");
        assert_eq!(err, "layernorm: line 2: \"x\" is not a number\n");
        assert_eq!(report.bad_lines, 1);
    }

    #[test]
    fn rms_ignores_beta() {
        // BETA of another length is not in force for RMS rows.
        let input = b"GAMMA 1 1\nBETA 0 0 0\nRMS 3 4\nLN 3 4\n";
        let (out, err, report) = run_on::<f64>(input, FIXED4);
        // 3 / sqrt(12.5 + 1e-5) and 4 / sqrt(12.5 + 1e-5).
        assert_eq!(out, "0.8485 1.1314\n");
        assert_eq!(
            err,
            "layernorm: line 4: GAMMA (line 1) has 2 values but BETA (line 2) has 3\n"
        );
        assert_eq!(report.bad_lines, 1);
    }

    #[test]
    fn read_errors_stop_the_run() {
        struct Broken;
        impl io::Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("disk on fire"))
            }
        }
        let mut input = io::BufReader::new(Broken);
        let report = run::<f64>(&mut input, &mut Vec::new(), &mut Vec::new(), FIXED4);
        assert!(
            matches!(report.failure, Some(Failure::Read(e)) if e.to_string() == "disk on fire")
        );
    }

    /// A file the protocol accepts, and what the library makes of it.
    #[derive(Clone, Debug)]
    enum Op {
        Eps(f64),
        Gamma(Vec<f64>),
        Beta(Vec<f64>),
        Ln(Vec<f64>),
        Rms(Vec<f64>),
        Comment,
    }

    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            20 => -1e3_f64..1e3,
            2 => any::<f64>().prop_filter("finite", |v| v.is_finite()),
            1 => Just(f64::NAN),
            1 => Just(f64::INFINITY),
        ]
    }

    fn op(d: usize) -> impl Strategy<Value = Op> {
        let row = move || proptest::collection::vec(value(), d);
        let finite = move || proptest::collection::vec(-10.0_f64..10.0, d);
        prop_oneof![
            1 => (0.0_f64..1e-2).prop_map(Op::Eps),
            1 => finite().prop_map(Op::Gamma),
            1 => finite().prop_map(Op::Beta),
            4 => row().prop_map(Op::Ln),
            3 => row().prop_map(Op::Rms),
            1 => Just(Op::Comment),
        ]
    }

    fn file() -> impl Strategy<Value = Vec<Op>> {
        (1_usize..12).prop_flat_map(|d| proptest::collection::vec(op(d), 0..24))
    }

    fn line(keyword: &str, values: &[f64], f32: bool) -> String {
        let mut line = keyword.to_string();
        for &v in values {
            // Shortest round-trip text of the element type.
            if f32 {
                line += &format!(" {:e}", v as f32);
            } else {
                line += &format!(" {v:e}");
            }
        }
        line + "\n"
    }

    /// The protocol's answers, computed with the library on whole arrays.
    fn expected<A: Value>(ops: &[Op], narrow: impl Fn(f64) -> A) -> Vec<Vec<A>> {
        let mut eps = A::DEFAULT_EPS;
        let mut gamma: Option<Array1<A>> = None;
        let mut beta: Option<Array1<A>> = None;
        let mut answers = Vec::new();
        let to_array = |v: &[f64]| v.iter().map(|&x| narrow(x)).collect::<Array1<A>>();
        for op in ops {
            match op {
                Op::Eps(e) => eps = narrow(*e),
                Op::Gamma(g) => gamma = Some(to_array(g)),
                Op::Beta(b) => beta = Some(to_array(b)),
                Op::Comment => {}
                Op::Ln(x) | Op::Rms(x) => {
                    let d = x.len();
                    let x = to_array(x).into_shape_with_order((1, d)).unwrap();
                    let y: Array2<A> = match (op, &gamma, &beta) {
                        (Op::Rms(_), None, _) => x.rms_norm_plain(eps),
                        (Op::Rms(_), Some(g), _) => x.rms_norm(g, eps),
                        (_, None, None) => x.layer_norm_plain(eps),
                        (_, g, b) => x.layer_norm(
                            &g.clone().unwrap_or_else(|| Array1::ones(d)),
                            &b.clone().unwrap_or_else(|| Array1::zeros(d)),
                            eps,
                        ),
                    }
                    .unwrap();
                    answers.push(y.iter().copied().collect());
                }
            }
        }
        answers
    }

    fn same<A: Value>(got: A, want: A) -> bool {
        got == want || (got.is_nan() && want.is_nan())
    }

    fn check_against_library<A: Value>(ops: &[Op], f32: bool, narrow: impl Fn(f64) -> A) {
        let mut input = String::new();
        for op in ops {
            input += &match op {
                Op::Eps(e) => line("EPS", &[*e], f32),
                Op::Gamma(g) => line("GAMMA", g, f32),
                Op::Beta(b) => line("beta", b, f32),
                Op::Ln(x) => line("LN", x, f32),
                Op::Rms(x) => line("rms", x, f32),
                Op::Comment => "# a comment\n\n".to_string(),
            };
        }
        let options = Options {
            notation: Notation::Exact,
            keep_going: false,
        };
        let (out, err, report) = run_on::<A>(input.as_bytes(), options);
        assert_eq!(err, "");
        assert_eq!(report.bad_lines, 0);
        let want = expected(ops, narrow);
        let got: Vec<Vec<A>> = out
            .lines()
            .map(|l| l.split(' ').map(|t| t.parse().ok().unwrap()).collect())
            .collect();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.len(), w.len());
            assert!(
                g.iter().zip(w).all(|(&a, &b)| same(a, b)),
                "got {g:?}, want {w:?}"
            );
        }
    }

    /// Bytes and tokens the protocol knows, mixed with noise.
    fn soup() -> impl Strategy<Value = Vec<u8>> {
        let token = prop_oneof![
            Just(b"LN".to_vec()),
            Just(b"RMS".to_vec()),
            Just(b"gamma".to_vec()),
            Just(b"BETA".to_vec()),
            Just(b"eps".to_vec()),
            Just(b"#".to_vec()),
            Just(b"\n".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(b"nan".to_vec()),
            Just(b"-inf".to_vec()),
            Just(b"-1".to_vec()),
            Just(b"0".to_vec()),
            (-5.0_f64..5.0).prop_map(|v| v.to_string().into_bytes()),
            any::<f64>().prop_map(|v| format!("{v:e}").into_bytes()),
            proptest::collection::vec(any::<u8>(), 1..4),
        ];
        proptest::collection::vec(token, 0..60).prop_map(|tokens| tokens.join(&b' '))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..400), keep_going: bool) {
            for notation in [Notation::Fixed(4), Notation::Exact] {
                let options = Options { notation, keep_going };
                let (_, err, report) = run_on::<f64>(&input, options);
                prop_assert_eq!(err.lines().count() as u64, report.bad_lines);
                let _ = run_on::<f32>(&input, options);
            }
        }

        #[test]
        fn token_soup_never_panics(input in soup(), keep_going: bool) {
            let options = Options { notation: Notation::Fixed(4), keep_going };
            let (out, err, report) = run_on::<f64>(&input, options);
            prop_assert!(report.failure.is_none());
            prop_assert_eq!(err.lines().count() as u64, report.bad_lines);
            prop_assert!(keep_going || report.bad_lines <= 1);
            for message in err.lines() {
                prop_assert!(message.starts_with("layernorm: line "));
            }
            // One output line per good LN/RMS line, each a list of numbers.
            for l in out.lines() {
                prop_assert!(l.split(' ').all(|t| t == "NaN" || t.contains("inf") || t.parse::<f64>().is_ok()));
            }
            let _ = run_on::<f32>(&input, options);
        }

        #[test]
        fn valid_files_match_the_library_f64(ops in file()) {
            check_against_library::<f64>(&ops, false, |v| v);
        }

        #[test]
        fn valid_files_match_the_library_f32(ops in file()) {
            check_against_library::<f32>(&ops, true, |v| v as f32);
        }
    }
}
