#!/usr/bin/env bash
# Installs the build into a temporary prefix and builds a consumer against it twice:
# with find_package(sx) and with pkg-config, a Go program through the Go binding's
# `#cgo pkg-config: sx` and a Rust one through sx-sys's pkg-config search; runs the
# installed sxckpt and finds sxckpt_torch.py.
# Usage: check.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: check.sh BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > /dev/null
lib=$(ls "$tmp"/prefix/lib*/libsx.so.1 2>/dev/null | head -n 1)
[ -n "$lib" ] || { echo "libsx.so.1 was not installed"; exit 1; }
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libsx.so.1" ] || { echo "SONAME is '$soname', expected libsx.so.1"; exit 1; }
libdir=$(dirname "$lib")
# Every public header is installed, and each compiles alone from the installed prefix
# (sx.h is an umbrella over the topic headers; a topic header left out breaks every consumer).
for h in "$here"/../../include/sx/*.h; do
  name=$(basename "$h")
  [ -f "$tmp/prefix/include/sx/$name" ] || { echo "include/sx/$name was not installed"; exit 1; }
  printf '#include <sx/%s>\n' "$name" |
    cc -std=c99 -pedantic -Wall -Werror -fsyntax-only -I"$tmp/prefix/include" -x c - ||
    { echo "the installed sx/$name does not compile alone"; exit 1; }
done
cmake -S "$here/consumer" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$tmp/prefix" > /dev/null
cmake --build "$tmp/cmake" > /dev/null
LD_LIBRARY_PATH="$libdir" "$tmp/cmake/consumer"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c99 -o "$tmp/pc_consumer" "$here/consumer/main.c" $(pkg-config --cflags --libs sx)
# sx.pc's Libs carry an rpath to the installed library (unless configured
# -DSX_PC_RPATH=OFF): its consumers run without LD_LIBRARY_PATH.
pc_run="env -u LD_LIBRARY_PATH"
if ! grep -q -- "-Wl,-rpath," "$libdir/pkgconfig/sx.pc"; then pc_run="env LD_LIBRARY_PATH=$libdir"; fi
$pc_run "$tmp/pc_consumer"
# The Go binding through `#cgo pkg-config: sx` (no CGO_CFLAGS/CGO_LDFLAGS), and the Rust
# one through sx-sys's pkg-config search (no SX_LIB_DIR), its binary running without
# LD_LIBRARY_PATH. Both build offline from the tree's bindings.
go=$(command -v go || true)
if [ -n "$go" ]; then
  (cd "$here/go_consumer" && env -u CGO_CFLAGS -u CGO_LDFLAGS CGO_ENABLED=1 GOPROXY=off GOTOOLCHAIN=local \
     GOFLAGS=-mod=mod GOCACHE="$tmp/gocache" GOPATH="$tmp/gopath" "$go" build -o "$tmp/go_consumer" .)
  $pc_run "$tmp/go_consumer"
else
  echo "install check: no go on PATH (scripts/install-deps.sh installs golang-go)"; exit 1
fi
cargo=$(command -v cargo || echo "${HOME:-/root}/.cargo/bin/cargo")
[ -x "$cargo" ] || { echo "install check: no cargo (scripts/install-deps.sh installs one)"; exit 1; }
env -u SX_LIB_DIR -u SX_LIBRARY CARGO_TARGET_DIR="$tmp/cargo" "$cargo" build --offline --quiet \
  --manifest-path "$here/rust_consumer/Cargo.toml"
env -u LD_LIBRARY_PATH "$tmp/cargo/debug/sx-install-check"
"$tmp/prefix/bin/sxckpt" --version > /dev/null || { echo "bin/sxckpt was not installed, or does not run"; exit 1; }
[ -f "$tmp/prefix/share/sx/sxckpt_torch.py" ] || { echo "share/sx/sxckpt_torch.py was not installed"; exit 1; }
echo "install check passed (SONAME $soname, every header under include/sx, find_package and pkg-config (its rpath), Go and Rust through pkg-config, bin/sxckpt, share/sx/sxckpt_torch.py)"
