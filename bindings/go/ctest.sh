#!/bin/sh
# The bindings_go test: `go test` of package sx, the custom optimizer example, then the
# sample, built into the build tree and compared with the C reference. No network:
# modules come from the tree.
# The binding finds sx through pkg-config: PKG_CONFIG_PATH names the sx.pc of this build
# tree (its header and library where they are, not installed); the rpath lets the test
# binaries run from here.
# usage: ctest.sh GO PKG_CONFIG_DIR SX_LIB_DIR SX_LAYOUT_JSON BUILD_DIR SAMPLE_OUT C_REFERENCE
set -eu
go=$1 pc_dir=$2 lib_dir=$3 layout=$4 build=$5 sample_out=$6 ref=$7
here=$(cd "$(dirname "$0")" && pwd)
export CGO_ENABLED=1 PKG_CONFIG_PATH="$pc_dir" CGO_LDFLAGS="-Wl,-rpath,$lib_dir"
export SX_LAYOUT_JSON="$layout" GOCACHE="$build/gocache" GOPATH="$build/gopath" GOTOOLCHAIN=local \
  GOPROXY=off GOFLAGS=-buildvcs=false GO111MODULE=on
"$go" version
cd "$here" && "$go" vet ./... && "$go" test -count=1 ./...
# The custom optimizer sample: Lion in Go against the built-in Lion, bit for bit.
cd "$here" && "$go" run ./examples/custom_lion
mkdir -p "$(dirname "$sample_out")"
cd "$here/../../samples/go" && "$go" build -o "$sample_out" .
"$here/../compare_linreg.sh" "$ref" "$sample_out"
