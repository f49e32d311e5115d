//! Throughput of the `layernorm` command-line tool's streaming loop (parse,
//! normalise, format) on rows of d = 768, in MB of input text per second on
//! one core:
//!
//! ```sh
//! cargo run --release --example cli_throughput
//! ```
//!
//! It builds the input in memory and runs the very code of the binary (its
//! modules are compiled in here), writing to a sink, so neither the disk nor
//! a pipe is measured. To time the real binary on the same kind of input,
//! write it to a file first:
//!
//! ```sh
//! cargo run --release --example cli_throughput -- --write /tmp/rows.txt 100
//! time target/release/layernorm /tmp/rows.txt > /dev/null
//! ```

#[path = "../src/bin/layernorm/format.rs"]
mod format;
#[path = "../src/bin/layernorm/parse.rs"]
mod parse;
#[path = "../src/bin/layernorm/stream.rs"]
mod stream;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::time::Instant;

use format::Notation;
use stream::{Failure, Options};

/// Row length of the benchmark (GPT-2 small's hidden size).
const D: usize = 768;

/// A small deterministic generator (xorshift64*), so runs are comparable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-3, 3).
    fn value(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 6.0 - 3.0
    }
}

/// Writes about `bytes` of input: a GAMMA and a BETA line, then LN and RMS
/// rows (3 to 1) of `D` values with 6 decimals, like activations dumped
/// from a model. Returns the number of bytes written.
fn generate(out: &mut impl Write, bytes: usize) -> io::Result<usize> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut line = String::new();
    let mut written = 0;
    let mut row = 0;
    while written < bytes {
        line.clear();
        line.push_str(match row {
            0 => "GAMMA",
            1 => "BETA",
            r if r % 4 == 0 => "RMS",
            _ => "LN",
        });
        for _ in 0..D {
            let v = rng.value();
            let v = if row == 0 { 1.0 + v / 10.0 } else { v };
            line.push_str(&format!(" {v:.6}"));
        }
        line.push('\n');
        out.write_all(line.as_bytes())?;
        written += line.len();
        row += 1;
    }
    Ok(written)
}

/// Best of `repeats` runs, in MB (10⁶ bytes) of input per second.
fn measure<A: parse::Value>(input: &[u8], notation: Notation, repeats: usize) -> io::Result<f64> {
    let options = Options {
        notation,
        keep_going: false,
    };
    let mut best = f64::INFINITY;
    for _ in 0..repeats {
        let start = Instant::now();
        let report = stream::run::<A>(&mut &input[..], &mut io::sink(), &mut io::stderr(), options);
        let seconds = start.elapsed().as_secs_f64();
        if let Some(Failure::Read(e) | Failure::Write(e)) = report.failure {
            return Err(e);
        }
        assert_eq!(report.bad_lines, 0, "the generated input is valid");
        best = best.min(seconds);
    }
    Ok(input.len() as f64 / best / 1e6)
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, path, megabytes] = args.as_slice() {
        if flag == "--write" {
            let megabytes: usize = megabytes.parse().map_err(io::Error::other)?;
            let mut file = BufWriter::new(File::create(path)?);
            let written = generate(&mut file, megabytes * 1_000_000)?;
            file.flush()?;
            println!("wrote {written} bytes of d = {D} rows to {path}");
            return Ok(());
        }
    }
    if !args.is_empty() {
        eprintln!("usage: cli_throughput [--write PATH MEGABYTES]");
        std::process::exit(2);
    }

    let mut input = Vec::new();
    generate(&mut input, 64_000_000)?;
    let rows = input.iter().filter(|&&b| b == b'\n').count();
    println!(
        "input: {:.1} MB, {rows} lines of d = {D} (values with 6 decimals)",
        input.len() as f64 / 1e6
    );
    println!("{:<28} {:>10}", "mode", "MB/s");
    for (label, notation, f32) in [
        ("f64, --precision 4", Notation::Fixed(4), false),
        ("f32, --precision 4", Notation::Fixed(4), true),
        ("f64, --exact", Notation::Exact, false),
    ] {
        let rate = if f32 {
            measure::<f32>(&input, notation, 3)?
        } else {
            measure::<f64>(&input, notation, 3)?
        };
        println!("{label:<28} {rate:>10.0}");
    }
    Ok(())
}
