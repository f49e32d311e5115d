#!/usr/bin/env bash
# What this crate costs the release build of a crate that uses it.
#
# Builds two small binaries from scratch, each in a clean target directory,
# with the dependency versions of this repository's Cargo.lock: one calls
# the main forms for f32 and f64 (layer_norm, layer_norm_into,
# layer_norm_plain on IxDyn, rms_norm, rms_norm_inplace, stats,
# layer_norm_backward, rms_norm_backward, add_layer_norm, and over two
# axes layer_norm_over, layer_norm_train_over,
# layer_norm_backward_with_stats_over, rms_norm_over, stats_over), the other a naive
# ndarray LayerNorm without this crate (so that both build ndarray). Then it edits the first one's
# main.rs and times its rebuild. Prints one line of seconds.
#
#   scripts/build-time.sh            # default features
#   FEATURES=half scripts/build-time.sh   # also calls them for f16 and bf16
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
features=${FEATURES:-}

write_crate() { # name, dependency lines, body of main
    mkdir -p "$work/$1/src"
    cat >"$work/$1/Cargo.toml" <<TOML
[package]
name = "$1"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
ndarray = "0.17"
$2

[workspace]
TOML
    cp "$root/Cargo.lock" "$work/$1/Cargo.lock"
    printf '%s\n' "$3" >"$work/$1/src/main.rs"
}

calls='use ndarray::{Array, Array1, Axis, IxDyn};
use ndarray_layernorm::prelude::*;

fn forms<A: NormScalar>(eps: A) -> Result<A, NormError> {
    let x = Array::from_shape_fn((8, 16), |(i, j)| A::from(i * 16 + j).unwrap().sin());
    let gamma = Array1::from_elem(16, A::one());
    let beta = Array1::from_elem(16, A::zero());
    let mut out = x.clone();
    let y = x.layer_norm(&gamma, &beta, eps)?;
    x.layer_norm_into(&mut out, &gamma, &beta, eps)?;
    let dynamic = x.clone().into_dimensionality::<IxDyn>().unwrap().layer_norm_plain(eps)?;
    let r = x.rms_norm(&gamma, eps)?;
    let mut inplace = x.clone();
    inplace.rms_norm_inplace(&gamma, eps)?;
    let (mean, rms) = x.stats()?;
    let grads = x.layer_norm_backward(&y, &gamma, eps)?;
    let rms_grads = x.rms_norm_backward(&r, &gamma, eps)?;
    let (h, sum) = x.add_layer_norm(&out, &gamma, &beta, eps)?;
    let x3 = x.clone().into_shape_with_order((2, 4, 16)).unwrap();
    let (g2, b2) = (Array::from_elem((4, 16), A::one()), Array::from_elem((4, 16), A::zero()));
    let over = x3.layer_norm_over(Axis(1), &g2, &b2, eps)?;
    let (trained, saved) = x3.layer_norm_train_over(Axis(1), &g2, &b2, eps)?;
    let over_grads = x3.layer_norm_backward_with_stats_over(Axis(1), &over, &g2, &saved)?;
    let rms_over = x3.rms_norm_over(Axis(1), &g2, eps)?;
    let (mean_over, _) = x3.stats_over(Axis(1))?;
    Ok(y.sum() + out.sum() + dynamic.sum() + r.sum() + inplace.sum() + mean.sum() + rms.sum()
        + grads.dx.sum() + rms_grads.dx.sum() + h.sum() + sum.sum() + over.sum() + trained.sum()
        + over_grads.dgamma.sum() + rms_over.sum() + mean_over.sum())
}

fn main() -> Result<(), NormError> {
    println!("{} {}", forms(1e-5f32)?, forms(1e-5f64)?);
    Ok(())
}'
plain='use ndarray::{Array, Array1, Axis};

fn forms(eps: f64) -> f64 {
    let x = Array::from_shape_fn((8, 16), |(i, j)| ((i * 16 + j) as f64).sin());
    let mean = x.mean_axis(Axis(1)).unwrap().insert_axis(Axis(1));
    let var = x.var_axis(Axis(1), 0.0).insert_axis(Axis(1));
    let y = (&x - &mean) / (var + eps).mapv(f64::sqrt) * Array1::<f64>::ones(16);
    y.sum()
}

fn main() {
    println!("{}", forms(1e-5));
}'
dependency="ndarray-layernorm = { path = \"$root\"${features:+, features = [\"$features\"]} }"
if [[ $features == *half* ]]; then
    dependency="$dependency
half = \"2\""
    calls=${calls/'forms(1e-5f64)?);'/'forms(1e-5f64)?);
    println!("{} {}", forms(half::f16::from_f32(1e-3))?, forms(half::bf16::from_f32(1e-3))?);'}
fi
write_crate with_crate "$dependency" "$calls"
write_crate without_crate "" "$plain"

build_ms() { # directory: release build, in milliseconds
    local start
    start=$(date +%s%N)
    (cd "$1" && CARGO_TARGET_DIR="$1/target" cargo build --release --quiet)
    echo $((($(date +%s%N) - start) / 1000000))
}

(cd "$work/with_crate" && cargo fetch --quiet)
(cd "$work/without_crate" && cargo fetch --quiet)
with=$(build_ms "$work/with_crate")
without=$(build_ms "$work/without_crate")
sed -i 's/forms(1e-5f32)/forms(1e-6f32)/' "$work/with_crate/src/main.rs"
rebuild=$(build_ms "$work/with_crate")
echo "release build of a crate calling the main forms: $((with / 1000)) s," \
    "$((without / 1000)) s without this crate (+$(((with - without) / 1000)) s);" \
    "rebuild after an edit of its main.rs: $((rebuild / 100 / 10)).$((rebuild / 100 % 10)) s"
