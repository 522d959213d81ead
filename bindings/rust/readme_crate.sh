#!/bin/sh
# The bindings_rust_readme test: a newcomer's crate, outside the tree, made of the files
# that README.md ("Your own crate") gives between its `<!-- readme-crate: PATH -->` and
# `<!-- /readme-crate -->` marks (so this fails when the README drifts), built with
# `cargo build --offline` and only the environment the README names, then run without
# LD_LIBRARY_PATH. Built three ways: SX_LIB_DIR of the build tree (as the README says),
# then against a directory holding only libsx's versioned names, through SX_LIBRARY
# naming libsx.so.1 and through SX_LIB_DIR.
# usage: readme_crate.sh CARGO SX_LIB_DIR
set -eu
cargo=$1 lib_dir=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
readme=$here/README.md
if [ -z "${RUSTC:-}" ] && [ -x "$(dirname "$cargo")/rustc" ]; then
  rustc_env="RUSTC=$(dirname "$cargo")/rustc"
else
  rustc_env="RUSTC=${RUSTC:-rustc}"
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sx-readme-crate.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
crate=$tmp/crate

# Every marked file, its fence lines dropped, SX_SOURCE replaced by this checkout.
files=$(sed -n 's/^<!-- readme-crate: \(.*\) -->$/\1/p' "$readme")
for f in Cargo.toml build.rs src/main.rs; do
  echo "$files" | grep -qx "$f" || { echo "README.md marks no readme-crate file $f" >&2; exit 1; }
done
for f in $files; do
  mkdir -p "$(dirname "$crate/$f")"
  awk -v f="$f" -v root="$root" '
    $0 == "<!-- readme-crate: " f " -->" { on = 1; n++; next }
    on && $0 == "<!-- /readme-crate -->" { on = 0; next }
    on && /^```/ { fence++; next }
    on { gsub(/SX_SOURCE/, root); print }
    END { if (n != 1 || on || fence != 2) { print "README.md: readme-crate " f ": " n " blocks, " fence " fences" > "/dev/stderr"; exit 1 } }
  ' "$readme" > "$crate/$f"
done
echo "README crate: $files"

# The README's environment only: SX_LIB_DIR (or SX_LIBRARY), nothing of the caller's.
build_and_run() {
  (cd "$crate" && env -u LD_LIBRARY_PATH -u SX_LIB_DIR -u SX_LIBRARY -u SX_LAYOUT_JSON -u PKG_CONFIG_PATH \
     -u RUSTFLAGS -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET_DIR "$rustc_env" "$@" \
     "$cargo" build --offline -j 2)
  out=$(env -u LD_LIBRARY_PATH "$crate/target/debug/sx-example")
  echo "$out"
  echo "$out" | grep -q '^loss .* -> .* over 300 steps$'
}
echo "== SX_LIB_DIR=$lib_dir"
build_and_run SX_LIB_DIR="$lib_dir"

# Only versioned names (a packager's runtime directory): no libsx.so to -lsx.
real=$(readlink -f "$lib_dir/libsx.so.1")
mkdir "$tmp/lib"
cp "$real" "$tmp/lib/$(basename "$real")"
ln -s "$(basename "$real")" "$tmp/lib/libsx.so.1"
echo "== SX_LIBRARY=$tmp/lib/libsx.so.1 ($(ls "$tmp/lib" | tr '\n' ' '))"
build_and_run SX_LIBRARY="$tmp/lib/libsx.so.1"
readelf -d "$crate/target/debug/sx-example" | grep -q "R.*PATH.*$tmp/lib" \
  || { echo "the binary's rpath is not $tmp/lib" >&2; readelf -d "$crate/target/debug/sx-example" >&2; exit 1; }
echo "== SX_LIB_DIR=$tmp/lib"
build_and_run SX_LIB_DIR="$tmp/lib"
echo "README crate built and ran"
