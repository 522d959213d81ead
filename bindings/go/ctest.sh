#!/bin/sh
# The bindings_go test: `go test` of package sx, the custom optimizer example, then the
# samples, built into the build tree and compared with the C reference, and the README's
# first program in a module of its own (newcomer.sh). No network: modules come from the
# tree.
# The binding finds sx through pkg-config: PKG_CONFIG_PATH names the build tree, whose
# sx.pc has the header and the library where they are (not installed) and an rpath to the
# library, so that the test binaries run from here without LD_LIBRARY_PATH.
# usage: ctest.sh GO BUILD_ROOT SX_LAYOUT_JSON GO_BUILD_DIR SAMPLE_OUT C_REFERENCE
set -eu
go=$1 root=$2 layout=$3 build=$4 sample_out=$5 ref=$6
here=$(cd "$(dirname "$0")" && pwd)
export CGO_ENABLED=1 PKG_CONFIG_PATH="$root"
unset CGO_LDFLAGS LD_LIBRARY_PATH
export SX_LAYOUT_JSON="$layout" GOCACHE="$build/gocache" GOPATH="$build/gopath" GOTOOLCHAIN=local \
  GOPROXY=off GOFLAGS=-buildvcs=false GO111MODULE=on
"$go" version
# The Go sources are as gofmt writes them (the binding and both samples).
gofmt=$(dirname "$go")/gofmt
[ -x "$gofmt" ] || gofmt=gofmt
unformatted=$("$gofmt" -l "$here" "$here/../../samples/go" "$here/../../samples/go-finetune")
if [ -n "$unformatted" ]; then
  echo "bindings_go: not gofmt-formatted (run gofmt -w on them): $unformatted" >&2
  exit 1
fi
cd "$here" && "$go" vet ./... && "$go" test -count=1 ./...
# The custom optimizer sample: Lion in Go against the built-in Lion, bit for bit.
cd "$here" && "$go" run ./examples/custom_lion
mkdir -p "$(dirname "$sample_out")"
cd "$here/../../samples/go" && "$go" build -o "$sample_out" .
"$here/../compare_linreg.sh" "$ref" "$sample_out"
# The fine-tune service sample's own tests (its backward against finite differences);
# sample_go_finetune drives the service itself over HTTP.
cd "$here/../../samples/go-finetune" && "$go" vet . && "$go" test -count=1 .
# A newcomer's path: README.md's first program, in a fresh module outside the tree.
"$here/newcomer.sh" "$go" "$(cd "$here/../.." && pwd)" "$root" "$GOCACHE"
