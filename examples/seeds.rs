//! Prints the worked traces of the LayerNorm and RMSNorm lessons, computed by
//! the crate: `cargo run --release --example seeds`.

use ndarray::{array, Array1};
use ndarray_layernorm::prelude::*;

fn show(label: &str, values: impl IntoIterator<Item = f64>) {
    let cells: Vec<String> = values.into_iter().map(|v| format!("{v:.4}")).collect();
    println!("  {label:<28} [{}]", cells.join(", "));
}

fn main() -> Result<(), NormError> {
    println!(
        "LayerNorm, x = [2, 4, 6, 8], gamma = [2, 1, 1, 0.5], beta = [0, 0, 1, 0], eps = 1e-5"
    );
    let x = array![2.0_f64, 4.0, 6.0, 8.0];
    let (mean, rms) = x.stats()?;
    println!("  mean = {}, rms = {:.4}", mean.sum(), rms.sum());
    show("normalised", x.layer_norm_plain(1e-5)?);
    show(
        "y",
        x.layer_norm(
            &array![2.0, 1.0, 1.0, 0.5],
            &array![0.0, 0.0, 1.0, 0.0],
            1e-5,
        )?,
    );

    println!("\nA constant row gives beta: x = [7, 7, 7], beta = [0.1, 0.2, 0.3]");
    let beta = array![0.1, 0.2, 0.3];
    show(
        "y",
        array![7.0, 7.0, 7.0].layer_norm(&Array1::ones(3), &beta, 1e-5)?,
    );

    println!("\nRMSNorm, x = [2, -2, 4, -4], eps = 1e-6 (mean of squares 10)");
    show("y", array![2.0_f64, -2.0, 4.0, -4.0].rms_norm_plain(1e-6)?);

    println!("\nBoth ways, x = [1, 2, 3, 4], eps = 0");
    let x = array![1.0_f64, 2.0, 3.0, 4.0];
    let (mean, rms) = x.stats()?;
    println!("  mean = {}, rms = {:.4}", mean.sum(), rms.sum());
    show("LayerNorm", x.layer_norm_plain(0.0)?);
    show("RMSNorm", x.rms_norm_plain(0.0)?);

    println!("\nAny leading shape: x = [[1, 2, 3]], gamma = 1, beta = 0, eps = 1e-5");
    show("y", array![[1.0, 2.0, 3.0]].layer_norm_plain(1e-5)?);
    println!("x = [[2, 2], [0, 4]], gamma = [2, 1], beta = [0.5, -0.5], eps = 1e-5");
    let y =
        array![[2.0, 2.0], [0.0, 4.0]].layer_norm(&array![2.0, 1.0], &array![0.5, -0.5], 1e-5)?;
    for row in y.rows() {
        show("y row", row.iter().copied());
    }

    println!("\nWithout eps, x = [3, 4]: LayerNorm gives [-1, 1], RMSNorm divides by sqrt(12.5)");
    show("LayerNorm", array![3.0, 4.0].layer_norm_plain(0.0)?);
    show("RMSNorm", array![3.0, 4.0].rms_norm_plain(0.0)?);
    Ok(())
}
