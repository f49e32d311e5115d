//! The command line.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::format::Notation;

/// Largest `--precision` accepted.
pub const MAX_PRECISION: usize = 40;

/// Decimals printed when neither `--precision` nor `--exact` is given.
pub const DEFAULT_PRECISION: usize = 4;

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// Print the help text.
    Help,
    /// Print the version.
    Version,
    /// Process an input.
    Run(Config),
}

/// Where records are read from.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// Standard input (no file named, or `-`).
    Stdin,
    /// A named file.
    File(PathBuf),
}

/// A run's settings.
#[derive(Debug, PartialEq, Eq)]
pub struct Config {
    /// Where records come from.
    pub input: Input,
    /// How numbers are written.
    pub notation: Notation,
    /// Compute in `f32` rather than `f64`.
    pub f32: bool,
    /// Report bad lines and carry on.
    pub keep_going: bool,
}

/// Reads the arguments (without the program name).
///
/// # Errors
///
/// A message for an unknown option, a missing or bad `--precision` value,
/// `--precision` together with `--exact`, or more than one input.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, String> {
    let mut args = args.into_iter();
    let mut input = None;
    let mut precision = None;
    let mut exact = false;
    let mut f32 = false;
    let mut keep_going = false;
    let mut options_done = false;
    while let Some(arg) = args.next() {
        let is_option = !options_done && arg.len() > 1 && arg.as_encoded_bytes()[0] == b'-';
        if !is_option {
            if let Some(first) = input.replace(arg.clone()) {
                return Err(format!(
                    "expected at most one input file, found {} and {}",
                    first.to_string_lossy(),
                    arg.to_string_lossy()
                ));
            }
            continue;
        }
        let text = arg.to_string_lossy();
        let (name, inline_value) = match text.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (text.as_ref(), None),
        };
        if inline_value.is_some() && name != "--precision" {
            return Err(format!("option {name} takes no value"));
        }
        match name {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--" => options_done = true,
            "--exact" => exact = true,
            "--f32" => f32 = true,
            "--keep-going" => keep_going = true,
            "--precision" => {
                let value = match inline_value {
                    Some(value) => value,
                    None => match args.next() {
                        Some(value) => value.to_string_lossy().into_owned(),
                        None => return Err("--precision needs a value".to_string()),
                    },
                };
                // Digits only: `usize::from_str` would also take "+3".
                let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
                precision = Some(
                    digits
                        .then(|| value.parse::<usize>().ok())
                        .flatten()
                        .filter(|&p| p <= MAX_PRECISION)
                        .ok_or_else(|| {
                            format!(
                                "--precision takes a whole number from 0 to {MAX_PRECISION}, found \"{value}\""
                            )
                        })?,
                );
            }
            _ => return Err(format!("unknown option {name}")),
        }
    }
    let notation = match (exact, precision) {
        (true, Some(_)) => return Err("--exact and --precision cannot be combined".to_string()),
        (true, None) => Notation::Exact,
        (false, precision) => Notation::Fixed(precision.unwrap_or(DEFAULT_PRECISION)),
    };
    let input = match input {
        Some(name) if name != "-" => Input::File(PathBuf::from(name)),
        _ => Input::Stdin,
    };
    Ok(Command::Run(Config {
        input,
        notation,
        f32,
        keep_going,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_strs(args: &[&str]) -> Result<Command, String> {
        parse(args.iter().map(OsString::from))
    }

    fn run(input: Input, notation: Notation, f32: bool, keep_going: bool) -> Command {
        Command::Run(Config {
            input,
            notation,
            f32,
            keep_going,
        })
    }

    #[test]
    fn defaults() {
        let expected = run(Input::Stdin, Notation::Fixed(4), false, false);
        assert_eq!(parse_strs(&[]), Ok(expected));
        let expected = run(Input::Stdin, Notation::Fixed(4), false, false);
        assert_eq!(parse_strs(&["-"]), Ok(expected));
    }

    #[test]
    fn every_option() {
        assert_eq!(
            parse_strs(&["--f32", "--precision", "7", "--keep-going", "in.txt"]),
            Ok(run(
                Input::File("in.txt".into()),
                Notation::Fixed(7),
                true,
                true
            ))
        );
        assert_eq!(
            parse_strs(&["--precision=0", "in.txt"]),
            Ok(run(
                Input::File("in.txt".into()),
                Notation::Fixed(0),
                false,
                false
            ))
        );
        assert_eq!(
            parse_strs(&["--exact", "--", "-weird"]),
            Ok(run(
                Input::File("-weird".into()),
                Notation::Exact,
                false,
                false
            ))
        );
        assert_eq!(parse_strs(&["x", "--help"]), Ok(Command::Help));
        assert_eq!(parse_strs(&["-V"]), Ok(Command::Version));
    }

    #[test]
    fn usage_errors() {
        assert_eq!(parse_strs(&["--fast"]), Err("unknown option --fast".into()));
        assert_eq!(parse_strs(&["-x"]), Err("unknown option -x".into()));
        assert_eq!(
            parse_strs(&["--f32=1"]),
            Err("option --f32 takes no value".into())
        );
        assert_eq!(
            parse_strs(&["--precision"]),
            Err("--precision needs a value".into())
        );
        assert_eq!(
            parse_strs(&["--precision", "41"]),
            Err("--precision takes a whole number from 0 to 40, found \"41\"".into())
        );
        for bad in ["-1", "+3", " 3", ""] {
            assert_eq!(
                parse_strs(&[&format!("--precision={bad}")]),
                Err(format!(
                    "--precision takes a whole number from 0 to 40, found \"{bad}\""
                ))
            );
        }
        assert_eq!(
            parse_strs(&["--exact", "--precision", "3"]),
            Err("--exact and --precision cannot be combined".into())
        );
        assert_eq!(
            parse_strs(&["a", "b"]),
            Err("expected at most one input file, found a and b".into())
        );
    }
}
