//! The `half` section of the throughput example (with `--features half`):
//! `f16` and `bf16` rows against `f32` rows of the same shape, and against
//! the route a user would otherwise write (convert to an `f32` array,
//! normalise, convert back).
//!
//! - Out of cache (32 Mi elements: 128 MiB of `f32`, 64 MiB of halves),
//!   the figure is elements per second, in millions, of `layer_norm_into`
//!   and `rms_norm_into` into a preallocated output; `x f32` is the half
//!   type's rate over the `f32` rate, measured in alternating rounds.
//! - In cache (16 Ki elements, repeated), `x convert` is how many times
//!   faster `layer_norm_into` on the half array is than
//!   `mapv(to_f32)`, `layer_norm` on `f32`, `mapv(from_f32)`; `f32 ns` is
//!   the time per element of `layer_norm_into` on the `f32` array, measured
//!   in the same rounds (so once beside each half type).

use std::error::Error;
use std::sync::Mutex;
use std::time::Instant;

use half::{bf16, f16};
use ndarray::{Array1, Array2};
use ndarray_layernorm::prelude::*;
use rayon::ThreadPool;

use super::fill;

/// Rounds of alternating measurements; each figure is the best round.
const ROUNDS: usize = 5;

fn seconds(f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_secs_f64()
}

/// The best times of `calls`, run one after the other in each of
/// [`ROUNDS`] rounds.
fn alternating<const N: usize>(calls: &mut [&mut dyn FnMut(); N]) -> [f64; N] {
    let mut best = [f64::INFINITY; N];
    for _ in 0..ROUNDS {
        for (call, best) in calls.iter_mut().zip(&mut best) {
            *best = best.min(seconds(call));
        }
    }
    best
}

pub fn section(pools: &[(usize, ThreadPool)]) -> Result<(), Box<dyn Error>> {
    println!("\nhalf precision, out of cache: M elements/s, and the half type over f32");
    println!(
        "{:<16} {:>6} {:>7} {:>9} {:>9} {:>7} {:>9} {:>7}",
        "op", "d", "threads", "f32", "f16", "x f32", "bf16", "x f32"
    );
    let len = 32 << 20;
    let wide: Vec<f32> = fill(len);
    for d in [64, 768, 4096] {
        let rows = len / d;
        let x32 = Array2::from_shape_vec((rows, d), wide[..rows * d].to_vec())?;
        let x16 = x32.mapv(f16::from_f32);
        let xb = x32.mapv(bf16::from_f32);
        let gamma = Array1::from_shape_fn(d, |i| 1.0 + (i % 3) as f32 / 4.0);
        let beta = Array1::from_shape_fn(d, |i| (i % 5) as f32 / 8.0);
        let (g16, b16) = (gamma.mapv(f16::from_f32), beta.mapv(f16::from_f32));
        let (gb, bb) = (gamma.mapv(bf16::from_f32), beta.mapv(bf16::from_f32));
        let mut out32 = Array2::<f32>::zeros((rows, d));
        let mut out16 = Array2::<f16>::zeros((rows, d));
        let mut outb = Array2::<bf16>::zeros((rows, d));
        for (threads, pool) in pools {
            for rms in [false, true] {
                let status = Mutex::new(Ok(()));
                let keep = |r: Result<(), NormError>| {
                    if r.is_err() {
                        *status.lock().unwrap_or_else(|e| e.into_inner()) = r;
                    }
                };
                let times = pool.install(|| {
                    alternating(&mut [
                        &mut || {
                            keep(if rms {
                                x32.rms_norm_into(&mut out32, &gamma, 1e-5)
                            } else {
                                x32.layer_norm_into(&mut out32, &gamma, &beta, 1e-5)
                            })
                        },
                        &mut || {
                            keep(if rms {
                                x16.rms_norm_into(&mut out16, &g16, 1e-5)
                            } else {
                                x16.layer_norm_into(&mut out16, &g16, &b16, 1e-5)
                            })
                        },
                        &mut || {
                            keep(if rms {
                                xb.rms_norm_into(&mut outb, &gb, 1e-5)
                            } else {
                                xb.layer_norm_into(&mut outb, &gb, &bb, 1e-5)
                            })
                        },
                    ])
                });
                status.into_inner().unwrap_or_else(|e| e.into_inner())?;
                let rate = |t: f64| (rows * d) as f64 / t / 1e6;
                let op = if rms {
                    "rms_norm_into"
                } else {
                    "layer_norm_into"
                };
                println!(
                    "{:<16} {:>6} {:>7} {:>9.0} {:>9.0} {:>7.2} {:>9.0} {:>7.2}",
                    op,
                    d,
                    threads,
                    rate(times[0]),
                    rate(times[1]),
                    times[0] / times[1],
                    rate(times[2]),
                    times[0] / times[2],
                );
            }
        }
    }

    println!("\nhalf precision, in cache (16 Ki elements, one thread): layer_norm_into over the");
    println!(
        "convert route (mapv to f32, layer_norm, mapv back), and the f32 array's layer_norm_into"
    );
    println!(
        "{:<6} {:>6} {:>12} {:>12} {:>10} {:>8}",
        "type", "d", "ns/elem", "convert ns", "x convert", "f32 ns"
    );
    let len = 16 << 10;
    let wide: Vec<f32> = fill(len);
    let one = &pools[0].1;
    for d in [64, 768, 4096] {
        let rows = len / d;
        let x32 = Array2::from_shape_vec((rows, d), wide[..rows * d].to_vec())?;
        let gamma = Array1::from_shape_fn(d, |i| 1.0 + (i % 3) as f32 / 4.0);
        let beta = Array1::from_shape_fn(d, |i| (i % 5) as f32 / 8.0);
        let (x16, xb) = (x32.mapv(f16::from_f32), x32.mapv(bf16::from_f32));
        one.install(|| -> Result<(), NormError> {
            in_cache(&x16, &x32, &gamma, &beta, "f16", f16::to_f32, f16::from_f32)?;
            in_cache(
                &xb,
                &x32,
                &gamma,
                &beta,
                "bf16",
                bf16::to_f32,
                bf16::from_f32,
            )
        })?;
    }
    Ok(())
}

/// One in-cache line: the half type's `layer_norm_into` (with `f32`
/// parameters) against the convert route, and `x32`'s `layer_norm_into`.
fn in_cache<H: NormScalar + NormParam<f32> + NormEps<f64>>(
    x: &Array2<H>,
    x32: &Array2<f32>,
    gamma: &Array1<f32>,
    beta: &Array1<f32>,
    name: &str,
    widen: fn(H) -> f32,
    narrow: fn(f32) -> H,
) -> Result<(), NormError> {
    let (rows, d) = x.dim();
    let mut out = Array2::<H>::zeros((rows, d));
    let mut out32 = Array2::<f32>::zeros((rows, d));
    let batch = 50;
    let (mut status, mut status32) = (Ok(()), Ok(()));
    let [ours, route, wide] = alternating(&mut [
        &mut || {
            for _ in 0..batch {
                if let Err(e) = x.layer_norm_into(&mut out, gamma, beta, 1e-5_f64) {
                    status = Err(e);
                }
            }
        },
        &mut || {
            for _ in 0..batch {
                let y = x
                    .mapv(widen)
                    .layer_norm(gamma, beta, 1e-5_f32)
                    .map(|y| y.mapv(narrow));
                drop(y);
            }
        },
        &mut || {
            for _ in 0..batch {
                if let Err(e) = x32.layer_norm_into(&mut out32, gamma, beta, 1e-5) {
                    status32 = Err(e);
                }
            }
        },
    ]);
    status?;
    status32?;
    let per = |t: f64| t / batch as f64 / (rows * d) as f64 * 1e9;
    println!(
        "{:<6} {:>6} {:>12.2} {:>12.2} {:>10.2} {:>8.2}",
        name,
        d,
        per(ours),
        per(route),
        route / ours,
        per(wide)
    );
    Ok(())
}
