//! Fits `gamma` and `beta` of a `LayerNorm` by gradient descent so that its
//! output matches a target made by another LayerNorm with hidden
//! parameters: `cargo run --release --example train_step`.
//!
//! The loss is the mean squared error `L = mean((y - t)²)`, so the gradient
//! handed to backward is `dy = 2 (y - t) / N`. `y` is linear in `gamma` and
//! `beta`, so the loss is a convex quadratic in them and plain gradient
//! descent drives it to zero.

use std::time::Instant;

use ndarray::{Array1, Array2};
use ndarray_layernorm::prelude::*;

/// Deterministic values in `[-1, 1)` (a 64-bit LCG), so the example needs no
/// random-number crate.
fn values(seed: u64) -> impl FnMut() -> f64 {
    let mut state = seed;
    move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 11) as f64) / ((1u64 << 52) as f64) - 1.0
    }
}

fn main() -> Result<(), NormError> {
    let (rows, d) = (256, 32);
    let mut next = values(1);
    let x = Array2::from_shape_fn((rows, d), |_| 3.0 * next() + 0.5);

    // The target: a LayerNorm with parameters the model does not know.
    let true_gamma = Array1::from_shape_fn(d, |_| 1.0 + next());
    let true_beta = Array1::from_shape_fn(d, |_| 0.5 * next());
    let target = x.layer_norm(&true_gamma, &true_beta, 1e-5)?;

    let mut norm = LayerNorm::<f64>::new(d);
    let n = (rows * d) as f64;
    // L is quadratic in each gamma_j and beta_j with curvature about
    // 2 · rows / N = 2 / d, so a step of 0.1 · d removes about a fifth of
    // the remaining error per step.
    let learning_rate = 0.1 * d as f64;
    let start = Instant::now();
    let mut loss = f64::INFINITY;
    for step in 0..=150 {
        let (y, stats) = norm.forward_train(&x)?;
        let error = &y - &target;
        loss = error.mapv(|e| e * e).sum() / n;
        if step % 10 == 0 {
            println!("step {step:>3}   loss {loss:.3e}");
        }
        let dy = error.mapv(|e| 2.0 * e / n);
        let grads = norm.backward(&x, &dy, &stats)?;
        norm.gamma_mut().scaled_add(-learning_rate, &grads.dgamma);
        if let Some(mut beta) = norm.beta_mut() {
            beta.scaled_add(-learning_rate, &grads.dbeta);
        }
    }
    let elapsed = start.elapsed();

    let gamma_error = (norm.gamma() - &true_gamma)
        .mapv(f64::abs)
        .fold(0.0, |a: f64, &b| a.max(b));
    println!(
        "final loss {loss:.3e} after {:.1} ms; largest gamma error {gamma_error:.1e}",
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}
