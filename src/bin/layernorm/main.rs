//! `layernorm`: LayerNorm and RMSNorm of rows read line by line.
//!
//! Reads a file (or standard input) of records, one a line:
//!
//! ```text
//! EPS 1e-5
//! GAMMA 2 1 1 0.5
//! BETA 0 0 1 0
//! LN 2 4 6 8        -> -2.6833 -0.4472 1.4472 0.6708
//! RMS 2 -2 4 -4     -> RMSNorm of the row, times gamma
//! ```
//!
//! and answers every `LN` and `RMS` line with one output line, computed by
//! the `ndarray_layernorm` library. Run `layernorm --help` for the details.

mod args;
mod format;
mod parse;
mod stream;

use std::fs::File;
use std::io::{self, BufRead, BufReader, ErrorKind, Write};
use std::process::ExitCode;

use crate::args::{Command, Config, Input};
use crate::stream::{Failure, Options};

/// Bytes buffered on each side: large enough that system calls do not
/// show in the profile.
const BUFFER: usize = 1 << 17;

const HELP: &str = "\
Usage: layernorm [OPTIONS] [FILE]

LayerNorm and RMSNorm of rows, read line by line from FILE (or standard
input when FILE is absent or -), one output line per LN or RMS line.

Records, one a line (keywords in any case, tokens separated by spaces or
tabs, blank lines and lines starting with # skipped):
  EPS v             set eps (default 1e-5; finite and non-negative)
  GAMMA v1 ... vd   set the gain (until set: all ones)
  BETA v1 ... vd    set the shift (until set: all zeros)
  LN x1 ... xd      print (x - mean) / sqrt(var + eps) * gamma + beta
  RMS x1 ... xd     print x / sqrt(mean(x^2) + eps) * gamma (no beta)
Numbers take the decimal and exponent forms, inf and nan; a row holding
inf or nan prints NaN. A number the type cannot hold (1e39 or 1e-46 with
--f32: it would read as inf or 0) is a bad line. GAMMA and BETA must be
finite, and a row whose output would not fit in the type (too large a gamma
or beta) is a bad line.

Options:
  --precision N   print N decimals (0 to 40; default 4); never -0.0000
  --exact         print the shortest text that reads back as the same number
  --f32           compute in f32 (default f64)
  --keep-going    report every bad line, answer the good ones
  -h, --help      print this help
  -V, --version   print the version

Exit status: 0 if every line was good; 1 if a line was bad (reported as
'layernorm: line N: ...' on standard error, after the answers to the lines
before it); 2 if the input could not be read, the output not written (a
closed pipe instead ends the run quietly), or the options are wrong.
";

fn main() -> ExitCode {
    match args::parse(std::env::args_os().skip(1)) {
        Ok(Command::Help) => print(HELP),
        Ok(Command::Version) => print(&format!("layernorm {}\n", env!("CARGO_PKG_VERSION"))),
        Ok(Command::Run(config)) => run(&config),
        Err(message) => {
            complain(format_args!(
                "{message}\nTry 'layernorm --help' for more information."
            ));
            ExitCode::from(2)
        }
    }
}

/// Writes `layernorm: <message>` to standard error. Unlike `eprintln!`,
/// does not panic if standard error is gone.
fn complain(message: std::fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "layernorm: {message}");
}

/// Writes `text` (the help or the version) to standard output, with the
/// exit status of a run: a closed pipe ends it quietly, any other failure
/// is reported.
fn print(text: &str) -> ExitCode {
    let mut stdout = io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            complain(format_args!("cannot write the output: {e}"));
            ExitCode::from(2)
        }
    }
}

fn run(config: &Config) -> ExitCode {
    let (name, mut input): (_, Box<dyn BufRead>) = match &config.input {
        Input::Stdin => (
            "standard input".into(),
            Box::new(BufReader::with_capacity(BUFFER, io::stdin().lock())),
        ),
        Input::File(path) => match File::open(path) {
            Ok(file) => (
                path.display().to_string(),
                Box::new(BufReader::with_capacity(BUFFER, file)),
            ),
            Err(e) => {
                complain(format_args!("cannot read {}: {e}", path.display()));
                return ExitCode::from(2);
            }
        },
    };
    let mut output = io::BufWriter::with_capacity(BUFFER, io::stdout().lock());
    let mut errors = io::stderr().lock();
    let options = Options {
        notation: config.notation,
        keep_going: config.keep_going,
    };
    let report = if config.f32 {
        stream::run::<f32>(&mut input, &mut output, &mut errors, options)
    } else {
        stream::run::<f64>(&mut input, &mut output, &mut errors, options)
    };
    match report.failure {
        Some(Failure::Read(e)) => {
            complain(format_args!("cannot read {name}: {e}"));
            ExitCode::from(2)
        }
        // The reader went away (`layernorm big.txt | head`): stop quietly.
        Some(Failure::Write(e)) if e.kind() == ErrorKind::BrokenPipe => {
            ExitCode::from(u8::from(report.bad_lines > 0))
        }
        Some(Failure::Write(e)) => {
            complain(format_args!("cannot write the output: {e}"));
            ExitCode::from(2)
        }
        None if report.bad_lines > 0 => ExitCode::from(1),
        None => ExitCode::SUCCESS,
    }
}
