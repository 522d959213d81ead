#!/bin/sh
# The sample_go_finetune test: the service built into the build tree and driven over HTTP
# by test_service.py under a Python with torch, transformers and peft (the sample's own
# `go test`, its backward against finite differences, runs in bindings_go, which needs no
# torch). No network: the
# binding comes from the tree through the module's replace directive.
# The binding finds sx through pkg-config: PKG_CONFIG_PATH names the build tree, whose
# sx.pc has an rpath to the library, so the binary runs without LD_LIBRARY_PATH.
# usage: ctest.sh GO BUILD_ROOT GO_BUILD_DIR BINARY TORCH_PYTHON
set -eu
go=$1 root=$2 build=$3 binary=$4 python=$5
here=$(cd "$(dirname "$0")" && pwd)
export CGO_ENABLED=1 PKG_CONFIG_PATH="$root"
unset CGO_LDFLAGS LD_LIBRARY_PATH
export GOCACHE="$build/gocache" GOPATH="$build/gopath" GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-buildvcs=false \
  GO111MODULE=on HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd "$here"
mkdir -p "$(dirname "$binary")"
"$go" build -o "$binary" .
"$python" "$here/test_service.py" "$binary"
