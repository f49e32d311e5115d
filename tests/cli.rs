//! The `layernorm` binary, run as a user would: exact standard output,
//! standard error and exit status for the protocol, its errors and options.
//!
//! Expected numbers come from the lessons' worked traces or from closed
//! forms written out here (formatted with std, independently of the tool's
//! own formatter); the property test compares with the library.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use ndarray::{Array1, Array2};
use ndarray_layernorm::prelude::*;
use proptest::prelude::*;

const BIN: &str = env!("CARGO_BIN_EXE_layernorm");
const TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/trace.txt");

/// What a run printed and how it ended.
#[derive(Debug, PartialEq)]
struct Run {
    stdout: String,
    stderr: String,
    code: Option<i32>,
}

fn finish(output: Output) -> Run {
    Run {
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
        code: output.status.code(),
    }
}

/// Runs the binary with `args`, feeding `input` on standard input.
fn layernorm(args: &[&str], input: &[u8]) -> Run {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // Fed from a thread so that a large output cannot block the input.
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let output = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    finish(output)
}

fn ok(stdout: &str) -> Run {
    Run {
        stdout: stdout.into(),
        stderr: String::new(),
        code: Some(0),
    }
}

fn failed(stdout: &str, stderr: &str, code: i32) -> Run {
    Run {
        stdout: stdout.into(),
        stderr: stderr.into(),
        code: Some(code),
    }
}

/// std's `{:.4}` of each value, joined by spaces, with `-0.0000` as `0.0000`.
fn fixed4(values: &[f64]) -> String {
    let cells: Vec<String> = values
        .iter()
        .map(|v| {
            let text = format!("{v:.4}");
            if text == "-0.0000" {
                "0.0000".into()
            } else {
                text
            }
        })
        .collect();
    cells.join(" ") + "\n"
}

/// The seed's LayerNorm line, x = [2, 4, 6, 8], gamma = [2, 1, 1, 0.5],
/// beta = [0, 0, 1, 0], eps = 1e-5, and its answer as the lesson prints it.
const SEED_LN_INPUT: &str = "EPS 1e-5\nGAMMA 2 1 1 0.5\nBETA 0 0 1 0\nLN 2 4 6 8\n";
const SEED_LN: &str = "-2.6833 -0.4472 1.4472 0.6708\n";
/// The seed's RMSNorm example, x = [2, -2, 4, -4]: mean of squares 10.
const SEED_RMS: &str = "0.6325 -0.6325 1.2649 -1.2649\n";

#[test]
fn trace_file_gives_the_worked_traces() {
    let s75 = 7.5_f64.sqrt();
    let s125 = 12.5_f64.sqrt();
    // [0, 4] with gamma [2, 1], beta [0.5, -0.5]: mean 2, var 4.
    let n = 2.0 / (4.0_f64 + 1e-5).sqrt();
    // [1, 2, 3]: mean 2, var 2/3.
    let m = 1.0 / (2.0_f64 / 3.0 + 1e-5).sqrt();
    let expected = [
        SEED_LN.to_string(),
        // The same row normalised, as in the lesson's trace.
        "-1.3416 -0.4472 0.4472 1.3416\n".into(),
        SEED_RMS.into(),
        // [1, 2, 3, 4], eps 0: the lesson's table to 3 decimals is
        // -1.342 -0.447 0.447 1.342 and 0.365 0.73 1.095 1.461.
        "-1.3416 -0.4472 0.4472 1.3416\n".into(),
        fixed4(&[1.0 / s75, 2.0 / s75, 3.0 / s75, 4.0 / s75]),
        // [3, 4], eps 0: LayerNorm [-1, 1], RMSNorm divides by sqrt(12.5).
        "-1.0000 1.0000\n".into(),
        fixed4(&[3.0 / s125, 4.0 / s125]),
        // A constant row gives beta; then [0, 4] (the lesson: [-1.5, 0.499999]).
        "0.5000 -0.5000\n".into(),
        fixed4(&[2.0 * -n + 0.5, n - 0.5]),
        fixed4(&[-m, 0.0, m]),
        "0.1000 0.2000 0.3000\n".into(),
    ]
    .concat();
    assert_eq!(layernorm(&[TRACE], b""), ok(&expected));
    // The comments in the file say the same.
    let file = std::fs::read_to_string(TRACE).unwrap();
    let noted: String = file
        .lines()
        .filter_map(|l| l.strip_prefix("# expected: "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(noted, expected);
}

#[test]
fn seed_ln_and_rms_lines() {
    let input = format!("{SEED_LN_INPUT}EPS 1e-6\nGAMMA 1 1 1 1\nRMS 2 -2 4 -4\n");
    assert_eq!(
        layernorm(&[], input.as_bytes()),
        ok(&[SEED_LN, SEED_RMS].concat())
    );
}

#[test]
fn gamma_applies_to_rms_and_beta_does_not() {
    // y = x / sqrt(10 + 1e-5) * gamma.
    let r = 1.0 / (10.0_f64 + 1e-5).sqrt();
    let input = "GAMMA 2 1 1 0.5\nBETA 9 9 9 9\nRMS 2 -2 4 -4\n";
    let expected = fixed4(&[2.0 * 2.0 * r, -2.0 * r, 4.0 * r, 0.5 * -4.0 * r]);
    assert_eq!(layernorm(&[], input.as_bytes()), ok(&expected));
}

#[test]
fn gamma_redefined_mid_stream() {
    // The seed row under the seed's gamma, then under gamma = 1 with the
    // same beta: the normalised row -1.3416 -0.4472 0.4472 1.3416 plus beta.
    let input = format!("{SEED_LN_INPUT}GAMMA 1 1 1 1\nLN 2 4 6 8\nGAMMA 2 1 1 0.5\nLN 2 4 6 8\n");
    let expected = [SEED_LN, "-1.3416 -0.4472 1.4472 1.3416\n", SEED_LN].concat();
    assert_eq!(layernorm(&[], input.as_bytes()), ok(&expected));
}

#[test]
fn new_row_length_with_new_gamma_and_beta() {
    let input = format!("{SEED_LN_INPUT}GAMMA 1 1\nBETA 0 0\nLN 3 4\n");
    assert_eq!(
        layernorm(&[], input.as_bytes()),
        ok(&[SEED_LN, "-1.0000 1.0000\n"].concat())
    );
}

#[test]
fn defaults_until_set() {
    // gamma = 1, beta = 0, eps = 1e-5 for any row length.
    // [1, 2, 3]: deviations -1 0 1, var 2/3; [3, 4]: deviations ±0.5, var 1/4.
    let m = 1.0 / (2.0_f64 / 3.0 + 1e-5).sqrt();
    let h = 0.5 / (0.25_f64 + 1e-5).sqrt();
    let input = "LN 1 2 3\nln 3 4\n";
    let expected = [fixed4(&[-m, 0.0, m]), fixed4(&[-h, h])].concat();
    assert_eq!(layernorm(&[], input.as_bytes()), ok(&expected));
}

#[test]
fn keywords_any_case_tabs_and_comments() {
    let input = "# a comment\n\n  \t\neps\t1e-5\ngamma 2 1 1 0.5\nBeta 0\t0 1   0\n   # indented\n\tLn 2 4 6 8\t\n";
    assert_eq!(layernorm(&[], input.as_bytes()), ok(SEED_LN));
}

#[test]
fn file_stdin_and_dash_agree() {
    let input = std::fs::read(TRACE).unwrap();
    // With a file named, standard input is not read.
    let from_file = layernorm(&[TRACE], b"LN 1 nonsense\n");
    assert_eq!(from_file.code, Some(0));
    assert!(from_file.stdout.starts_with(SEED_LN));
    assert_eq!(layernorm(&[], &input), from_file);
    assert_eq!(layernorm(&["-"], &input), from_file);
}

#[test]
fn empty_input() {
    assert_eq!(layernorm(&[], b""), ok(""));
    assert_eq!(layernorm(&[], b"# only comments\n\n   \n"), ok(""));
    assert_eq!(layernorm(&[], b"EPS 0\nGAMMA 1 2\nBETA 3 4\n"), ok(""));
}

#[test]
fn crlf_lines() {
    // The seed's gamma stays in force for the RMS row: y = x * gamma / sqrt(10 + 1e-5).
    let input = SEED_LN_INPUT.replace('\n', "\r\n") + "RMS 2 -2 4 -4 \r\n";
    let r = 1.0 / (10.0_f64 + 1e-5).sqrt();
    let expected = SEED_LN.to_string() + &fixed4(&[4.0 * r, -2.0 * r, 4.0 * r, -2.0 * r]);
    assert_eq!(layernorm(&[], input.as_bytes()), ok(&expected));
    // The message names the token without the carriage return.
    assert_eq!(
        layernorm(&[], b"LN 1 x\r\n"),
        failed("", "layernorm: line 1: \"x\" is not a number\n", 1)
    );
}

#[test]
fn last_line_without_newline() {
    let input = SEED_LN_INPUT.trim_end();
    assert_eq!(layernorm(&[], input.as_bytes()), ok(SEED_LN));
}

#[test]
fn nan_and_inf_tokens_give_nan_rows() {
    let input = "LN 1 nan 3\nRMS inf 1\nLN -Infinity 0\nLN 3 4\n";
    let expected = "NaN NaN NaN\nNaN NaN\nNaN NaN\n-1.0000 1.0000\n";
    assert_eq!(layernorm(&[], input.as_bytes()), ok(expected));
}

#[test]
fn never_negative_zero() {
    // A constant row gives exactly beta; -0.00001 and -0 print as 0.0000.
    let input = "BETA -0.00001 -0 -0.00005001\nLN 7 7 7\n";
    assert_eq!(
        layernorm(&[], input.as_bytes()),
        ok("0.0000 0.0000 -0.0001\n")
    );
    let input = "BETA -0.4 -0.6\nLN 1 1\n";
    assert_eq!(
        layernorm(&["--precision", "0"], input.as_bytes()),
        ok("0 -1\n")
    );
}

// ---- errors: message naming the line, exit 1, output before it flushed ----

/// Runs `before` (good lines), then `bad`, then one more good line, and
/// checks that the answers to `before` are out, the message names the bad
/// line's number, and the run stops with status 1.
fn assert_bad_line(before: &str, bad: &str, message: &str) {
    let input = format!("{before}{bad}\nLN 3 4\n");
    let answered = layernorm(&[], before.as_bytes());
    assert_eq!(answered.code, Some(0));
    let line = before.lines().count() + 1;
    assert_eq!(
        layernorm(&[], input.as_bytes()),
        failed(
            &answered.stdout,
            &format!("layernorm: line {line}: {message}\n"),
            1
        ),
        "input {input:?}"
    );
}

#[test]
fn unknown_keyword() {
    assert_bad_line(
        "# header\n\nLN 3 4\n",
        "NORM 1 2",
        "unknown keyword \"NORM\" (expected EPS, GAMMA, BETA, LN or RMS)",
    );
}

#[test]
fn token_not_a_number() {
    assert_bad_line(SEED_LN_INPUT, "LN 2 4 6,5 8", "\"6,5\" is not a number");
    assert_bad_line("", "GAMMA 1 one", "\"one\" is not a number");
    assert_bad_line("", "LN 1 -1e309", "\"-1e309\" is too large for f64");
    assert_bad_line("\n", "EPS 1e", "\"1e\" is not a number");
    assert_bad_line("", "LN 1 \u{3c0}", "\"\u{3c0}\" is not a number");
}

#[test]
fn gamma_and_beta_must_be_finite() {
    assert_bad_line(
        "LN 3 4\n",
        "GAMMA 1 nan",
        "GAMMA values must be finite, found \"nan\"",
    );
    assert_bad_line(
        "",
        "beta 0 -inf",
        "BETA values must be finite, found \"-inf\"",
    );
    // With --keep-going the bad line changes nothing: gamma = 2 stays in
    // force. LN [1, 2] is ∓0.5 / √(0.25 + 1e-5), times 2.
    let n = 0.5 / (0.25_f64 + 1e-5).sqrt();
    assert_eq!(
        layernorm(&["--keep-going"], b"GAMMA 2 2\nGAMMA 1 inf\nLN 1 2\n"),
        failed(
            &fixed4(&[-2.0 * n, 2.0 * n]),
            "layernorm: line 2: GAMMA values must be finite, found \"inf\"\n",
            1
        )
    );
}

#[test]
fn nonzero_numbers_below_the_type_are_bad_lines() {
    // 1e-46 is below half the least f32 subnormal (2^-150, about 7e-46):
    // read as f32 it would be 0, and the row [0, 0] would print beta.
    assert_eq!(
        layernorm(&["--f32"], b"LN 3 4\nLN 1e-46 2e-46\nLN 3 4\n"),
        failed(
            "-1.0000 1.0000\n",
            "layernorm: line 2: \"1e-46\" is too small for f32 (it would read as 0)\n",
            1
        )
    );
    assert_eq!(
        layernorm(&[], b"GAMMA 1e-400 1\n"),
        failed(
            "",
            "layernorm: line 1: \"1e-400\" is too small for f64 (it would read as 0)\n",
            1
        )
    );
    // In f64, 1e-46 is an ordinary number: the row is [1e-46, 2e-46].
    assert_eq!(
        layernorm(&[], b"EPS 0\nLN 1e-46 2e-46\n"),
        ok("-1.0000 1.0000\n")
    );
}

#[test]
fn outputs_beyond_the_type_are_bad_lines() {
    // LN [1, 2] is ∓0.99998; times 1e308 plus 1e308, the second output is
    // 1.99998e308, beyond f64::MAX (1.797e308); the first, 2e303, is not.
    assert_bad_line(
        "GAMMA 1e308 1e308\nBETA 1e308 1e308\n",
        "LN 1 2",
        "the output does not fit in f64 (gamma or beta too large)",
    );
    // The same in f32 with 3e38 (f32::MAX is 3.4e38).
    assert_eq!(
        layernorm(&["--f32"], b"GAMMA 3e38 3e38\nBETA 3e38 3e38\nLN 1 2\n"),
        failed(
            "",
            "layernorm: line 3: the output does not fit in f32 (gamma or beta too large)\n",
            1
        )
    );
    // A row holding an infinity still prints NaN.
    assert_eq!(
        layernorm(&[], b"GAMMA 1e308 1e308\nLN inf 2\n"),
        ok("NaN NaN\n")
    );
}

#[test]
fn a_byte_order_mark_starts_the_input() {
    assert_eq!(
        layernorm(&[], "\u{feff}LN 3 4\n".as_bytes()),
        ok("-1.0000 1.0000\n")
    );
    // Anywhere else it is part of a token.
    assert_bad_line(
        "LN 3 4\n",
        "\u{feff}LN 3 4",
        "unknown keyword \"\\u{feff}LN\" (expected EPS, GAMMA, BETA, LN or RMS)",
    );
}

#[test]
fn help_into_a_closed_pipe_ends_quietly() {
    let mut child = Command::new(BIN)
        .arg("--help")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before the tool has started, so its write finds no reader.
    drop(child.stdout.take());
    let run = finish(child.wait_with_output().unwrap());
    assert_eq!((run.code, run.stderr.as_str()), (Some(0), ""));
}

#[cfg(target_os = "linux")]
#[test]
fn help_reports_a_failed_write() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let output = Command::new(BIN)
        .arg("--help")
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr.starts_with("layernorm: cannot write the output: "),
        "{stderr}"
    );
}

#[test]
fn invalid_utf8_is_named_byte_by_byte() {
    assert_eq!(
        layernorm(&[], b"LN 3 4\nLN 1 \xff\xfe2\n"),
        failed(
            "-1.0000 1.0000\n",
            "layernorm: line 2: \"\\xff\\xfe2\" is not a number\n",
            1
        )
    );
}

#[test]
fn row_length_differs_from_gamma() {
    assert_bad_line(
        "GAMMA 1 1 1\n# d = 3 from here\n",
        "LN 1 2",
        "LN row has 2 values but GAMMA (line 1) has 3",
    );
    assert_bad_line(
        "GAMMA 1 1 1\n",
        "RMS 1 2 3 4",
        "RMS row has 4 values but GAMMA (line 1) has 3",
    );
}

#[test]
fn row_length_differs_from_beta() {
    assert_bad_line(
        "LN 3 4\nBETA 0 0 0\n",
        "LN 1 2",
        "LN row has 2 values but BETA (line 2) has 3",
    );
}

#[test]
fn gamma_and_beta_lengths_differ() {
    assert_bad_line(
        "GAMMA 1 1\nBETA 0 0 0\n",
        "LN 1 2",
        "GAMMA (line 1) has 2 values but BETA (line 2) has 3",
    );
}

#[test]
fn bad_eps() {
    let message = |token: &str| format!("eps must be finite and non-negative, found \"{token}\"");
    for token in ["-1e-5", "nan", "inf"] {
        assert_bad_line("LN 3 4\n", &format!("EPS {token}"), &message(token));
    }
    assert_bad_line("LN 3 4\n", "EPS 1e400", "\"1e400\" is too large for f64");
    assert_bad_line("", "EPS 1e-5 1e-6", "EPS takes one value, found 2");
}

#[test]
fn keyword_without_values() {
    for keyword in ["EPS", "GAMMA", "BETA", "LN", "RMS"] {
        assert_bad_line(
            "LN 3 4\n",
            &format!("{} \t", keyword.to_lowercase()),
            &format!("{keyword} has no values"),
        );
    }
}

#[test]
fn output_before_an_error_is_flushed() {
    // More output than any buffer holds, then a bad line.
    let good = "LN 3 4\n".repeat(50_000);
    let input = format!("{good}LN 3 x\n");
    let run = layernorm(&[], input.as_bytes());
    assert_eq!(run.stdout, "-1.0000 1.0000\n".repeat(50_000));
    assert_eq!(run.stderr, "layernorm: line 50001: \"x\" is not a number\n");
    assert_eq!(run.code, Some(1));
}

#[test]
fn keep_going_reports_every_bad_line() {
    let input = "\
GAMMA 1 1
LN 3 4
LN 3 x
GAMMA 2 2 bad
RMS 1 2 3
FOO
EPS 1e6 x
EPS -1
LN 3 4
";
    // The bad GAMMA and EPS lines change nothing: the last row still has
    // gamma = 1 and eps = 1e-5, so it prints as the second line does.
    let expected_err = "\
layernorm: line 3: \"x\" is not a number
layernorm: line 4: \"bad\" is not a number
layernorm: line 5: RMS row has 3 values but GAMMA (line 1) has 2
layernorm: line 6: unknown keyword \"FOO\" (expected EPS, GAMMA, BETA, LN or RMS)
layernorm: line 7: \"x\" is not a number
layernorm: line 8: eps must be finite and non-negative, found \"-1\"
";
    assert_eq!(
        layernorm(&["--keep-going"], input.as_bytes()),
        failed("-1.0000 1.0000\n-1.0000 1.0000\n", expected_err, 1)
    );
    // Without it, the run stops at line 3.
    assert_eq!(
        layernorm(&[], input.as_bytes()),
        failed(
            "-1.0000 1.0000\n",
            "layernorm: line 3: \"x\" is not a number\n",
            1
        )
    );
}

#[test]
fn keep_going_with_only_good_lines_succeeds() {
    assert_eq!(
        layernorm(&["--keep-going"], SEED_LN_INPUT.as_bytes()),
        ok(SEED_LN)
    );
}

// ---- files ----

#[test]
fn missing_file() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/no/such/file.txt");
    let reason = std::fs::File::open(path).unwrap_err().to_string();
    assert_eq!(
        layernorm(&[path], b"LN 3 4\n"),
        failed("", &format!("layernorm: cannot read {path}: {reason}\n"), 2)
    );
}

#[test]
fn unreadable_input() {
    // A directory opens but cannot be read.
    let dir = env!("CARGO_MANIFEST_DIR");
    let reason = std::fs::read(dir).unwrap_err().to_string();
    assert_eq!(
        layernorm(&[dir], b""),
        failed("", &format!("layernorm: cannot read {dir}: {reason}\n"), 2)
    );
}

#[test]
fn closed_output_stops_quietly() {
    let mut child = Command::new(BIN)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let line = "LN 3 4\n".repeat(1000);
        for _ in 0..1000 {
            if stdin.write_all(line.as_bytes()).is_err() {
                break;
            }
        }
    });
    let run = finish(child.wait_with_output().unwrap());
    feeder.join().unwrap();
    assert_eq!(run, ok(""));
}

// ---- options ----

#[test]
fn precision() {
    let input = SEED_LN_INPUT.as_bytes();
    assert_eq!(
        layernorm(&["--precision", "2"], input),
        ok("-2.68 -0.45 1.45 0.67\n")
    );
    assert_eq!(layernorm(&["--precision=0"], input), ok("-3 0 1 1\n"));
    // Closed form of the seed row: n = (x - 5) / sqrt(5.00001).
    let s = (5.0_f64 + 1e-5).sqrt();
    let y = [2.0 * -3.0 / s, -1.0 / s, 1.0 / s + 1.0, 0.5 * 3.0 / s];
    let cells: Vec<String> = y.iter().map(|v| format!("{v:.9}")).collect();
    assert_eq!(
        layernorm(&["--precision", "9"], input),
        ok(&(cells.join(" ") + "\n"))
    );
}

#[test]
fn exact_round_trips() {
    // [3, 4] with eps 0 is exactly [-1, 1]; [1, 2, 3] is ±sqrt(3/2).
    let input = b"EPS 0\nLN 3 4\nLN 1 2 3\n";
    let run = layernorm(&["--exact"], input);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines[0], "-1 1");
    let x = ndarray::array![1.0_f64, 2.0, 3.0]
        .layer_norm_plain(0.0)
        .unwrap();
    let shown: Vec<f64> = lines[1].split(' ').map(|t| t.parse().unwrap()).collect();
    assert_eq!(shown, x.to_vec());
    assert!((shown[2] - 1.5_f64.sqrt()).abs() < 1e-15);
    assert_eq!((run.stderr.as_str(), run.code), ("", Some(0)));
}

#[test]
fn f32_computes_in_f32() {
    assert_eq!(layernorm(&["--f32"], SEED_LN_INPUT.as_bytes()), ok(SEED_LN));
    // The exact output is the f32 result: its shortest digits, reading back
    // as the library's f32 value.
    let run = layernorm(&["--f32", "--exact"], b"LN 1 2 3\n");
    let want = ndarray::array![1.0_f32, 2.0, 3.0]
        .layer_norm_plain(1e-5)
        .unwrap();
    let shown: Vec<f32> = run
        .stdout
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(shown, want.to_vec());
    assert_eq!(run.stdout, format!("{} 0 {}\n", want[0], want[2]));
    // The f64 answer has more digits.
    let run64 = layernorm(&["--exact"], b"LN 1 2 3\n");
    assert!(run64.stdout.len() > run.stdout.len());
    // A number that f64 holds but f32 does not is a bad line under --f32,
    // after the answers to the lines before it.
    let input = b"LN 1 2\nLN 1 1e39\n";
    let answered = layernorm(&["--f32"], b"LN 1 2\n");
    assert_eq!(
        layernorm(&["--f32"], input),
        failed(
            &answered.stdout,
            "layernorm: line 2: \"1e39\" is too large for f32\n",
            1
        )
    );
    assert_eq!(layernorm(&[], input).code, Some(0));
}

#[test]
fn help_and_version() {
    let help = layernorm(&["--help"], b"");
    assert_eq!((help.code, help.stderr.as_str()), (Some(0), ""));
    assert!(help
        .stdout
        .starts_with("Usage: layernorm [OPTIONS] [FILE]\n"));
    for option in [
        "--precision N",
        "--exact",
        "--f32",
        "--keep-going",
        "--version",
    ] {
        assert!(help.stdout.contains(option), "{option}");
    }
    assert_eq!(layernorm(&["-h"], b""), help);
    assert_eq!(
        layernorm(&["--version"], b""),
        ok(&format!("layernorm {}\n", env!("CARGO_PKG_VERSION")))
    );
}

#[test]
fn usage_errors_exit_2() {
    let hint = "Try 'layernorm --help' for more information.\n";
    for (args, message) in [
        (&["--fast"][..], "unknown option --fast"),
        (
            &["--precision", "x"],
            "--precision takes a whole number from 0 to 40, found \"x\"",
        ),
        (&["--precision"], "--precision needs a value"),
        (
            &["--exact", "--precision", "3"],
            "--exact and --precision cannot be combined",
        ),
        (
            &["a.txt", "b.txt"],
            "expected at most one input file, found a.txt and b.txt",
        ),
    ] {
        assert_eq!(
            layernorm(args, b"LN 3 4\n"),
            failed("", &format!("layernorm: {message}\n{hint}"), 2),
            "{args:?}"
        );
    }
}

// ---- generated files against the library ----

/// A line of a valid file: the keyword and its values.
fn record(d: usize) -> impl Strategy<Value = (&'static str, Vec<f64>)> {
    let values = move |range: std::ops::Range<f64>| proptest::collection::vec(range, d);
    prop_oneof![
        (0.0_f64..1e-2).prop_map(|e| ("EPS", vec![e])),
        values(-5.0..5.0).prop_map(|v| ("GAMMA", v)),
        values(-5.0..5.0).prop_map(|v| ("BETA", v)),
        values(-1e3..1e3).prop_map(|v| ("LN", v)),
        values(-1e3..1e3).prop_map(|v| ("RMS", v)),
    ]
}

fn file() -> impl Strategy<Value = Vec<(&'static str, Vec<f64>)>> {
    (1_usize..40).prop_flat_map(|d| proptest::collection::vec(record(d), 1..30))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn generated_files_match_the_library(records in file()) {
        let mut input = String::new();
        for (keyword, values) in &records {
            input += keyword;
            for v in values {
                input += &format!(" {v:e}");
            }
            input += "\n";
        }
        let run = layernorm(&["--exact"], input.as_bytes());
        prop_assert_eq!(run.code, Some(0));
        prop_assert_eq!(run.stderr, "");

        let mut eps = 1e-5;
        let mut gamma: Option<Array1<f64>> = None;
        let mut beta: Option<Array1<f64>> = None;
        let mut rows = run.stdout.lines();
        for (keyword, values) in &records {
            let v = Array1::from(values.clone());
            let d = v.len();
            match *keyword {
                "EPS" => eps = values[0],
                "GAMMA" => gamma = Some(v),
                "BETA" => beta = Some(v),
                _ => {
                    let x: Array2<f64> = v.into_shape_with_order((1, d)).unwrap();
                    let ones = Array1::ones(d);
                    let zeros = Array1::zeros(d);
                    let want = if *keyword == "RMS" {
                        x.rms_norm(gamma.as_ref().unwrap_or(&ones), eps)
                    } else {
                        x.layer_norm(gamma.as_ref().unwrap_or(&ones), beta.as_ref().unwrap_or(&zeros), eps)
                    }
                    .unwrap();
                    let shown: Vec<f64> = rows
                        .next()
                        .unwrap()
                        .split(' ')
                        .map(|t| t.parse().unwrap())
                        .collect();
                    prop_assert_eq!(&shown[..], want.as_slice().unwrap());
                }
            }
        }
        prop_assert_eq!(rows.next(), None);
    }
}
