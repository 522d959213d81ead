#!/usr/bin/env bash
# Installs what sx builds, tests and runs with, from Debian 12's packages (as root, or
# through sudo), the Go and Rust toolchains of the bindings included. The CUDA toolkit
# and NCCL are optional and not installed here. libopenblas-serial-dev (Muon's products) is
# optional to the build, which falls back to sx's own product without it; it is installed
# here so that the tests, the benchmarks and the wheel use it.
set -euo pipefail
pkgs=(build-essential cmake pkg-config git iproute2 universal-ctags
      libuv1-dev libgloo-dev libcmocka-dev libisal-dev
      libopenblas-serial-dev
      libflatbuffers-dev flatbuffers-compiler
      abigail-tools python3 python3-numpy python3-venv
      golang-go)
# The Rust binding's tests need a cargo: rustup's (~/.cargo/bin) if there is one, else
# Debian's.
if ! command -v cargo > /dev/null && [ ! -x "${HOME:-/root}/.cargo/bin/cargo" ]; then
  pkgs+=(cargo)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update
  $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi
# The Python binding's tests run under the python3 on PATH (scripts/test.sh hands it to
# CMake). Debian's gets numpy from python3-numpy above; another interpreter (pyenv, a
# venv) gets it from PyPI.
if ! python3 -c 'import numpy' 2>/dev/null; then
  python3 -m pip install --quiet numpy \
    || python3 -m pip install --quiet --break-system-packages numpy
fi
