#!/bin/sh
# The bindings_rust test: the crates' tests, the custom optimizer example, then the
# sample, built into the build tree and compared with the C reference.
# usage: ctest.sh CARGO SX_LIB_DIR SX_LAYOUT_JSON BUILD_DIR SAMPLE_OUT C_REFERENCE
set -eu
cargo=$1 lib_dir=$2 layout=$3 build=$4 sample_out=$5 ref=$6
here=$(cd "$(dirname "$0")" && pwd)
export SX_LIB_DIR="$lib_dir" SX_LAYOUT_JSON="$layout"
# The rustc beside the configured cargo, not whichever is first on PATH (Debian's cargo
# with rustup's rustc, or the reverse, is a pairing nobody tested); RUSTC set wins.
if [ -z "${RUSTC:-}" ] && [ -x "$(dirname "$cargo")/rustc" ]; then
  export RUSTC="$(dirname "$cargo")/rustc"
fi
"$cargo" --version
"${RUSTC:-rustc}" --version
CARGO_TARGET_DIR="$build/target" "$cargo" test --offline -j 2 --manifest-path "$here/Cargo.toml"
# The custom optimizer sample: Lion in Rust against the built-in Lion, bit for bit.
CARGO_TARGET_DIR="$build/target" "$cargo" run --offline -j 2 --manifest-path "$here/Cargo.toml" --example custom_lion
CARGO_TARGET_DIR="$build/sample-target" "$cargo" build --offline -j 2 --release \
  --manifest-path "$here/../../samples/rust/Cargo.toml"
mkdir -p "$(dirname "$sample_out")"
cp "$build/sample-target/release/train_linreg" "$sample_out"
"$here/../compare_linreg.sh" "$ref" "$sample_out"
