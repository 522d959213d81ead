#!/usr/bin/env bash
# Runs sx's GPU tests and GPU benchmark on a machine with a GPU, from a build made on
# another machine. That machine has CUDA, NCCL and the driver but none of the Debian
# libraries sx links (libuv, gloo, isal, cmocka, ...), so:
#
#   scripts/gpu-test.sh pack [BUILD_DIR] [BUNDLE_DIR]
#       on the build machine: copies the test and bench programs of BUILD_DIR
#       (build/release) and every shared library they load, as ldd finds them, except
#       the C library's own (libc, libm, ld-linux, ...) and the driver's (libcuda,
#       libnvidia-*), into BUNDLE_DIR (build/gpu-bundle), debug sections stripped.
#       libstdc++ and libgcc_s travel too: the programs were built against them.
#   scripts/gpu-test.sh run [BUNDLE_DIR]
#       on the GPU machine (or anywhere, to see the tests skip): runs the bundle's
#       tests with LD_LIBRARY_PATH set to its lib/, then the gpu_adamw section of
#       bench_sx and bench/torch_adamw.py (with the system's libraries: torch needs
#       its own libstdc++), and prints a summary. Exits 1 if a test failed.
#
# Tests exit 0 (passed), 77 (skipped: no CUDA device, with the reason) or anything
# else (failed).
set -euo pipefail
cd "$(dirname "$0")/.."

tests=(tests/optim/test_cuda_kernels tests/optim/test_cuda_plan tests/optim/test_optim_kernels tests/comm/test_nccl tests/core/test_cuda_group)
bench=bench/bench_sx

pack() {
    local build=${1:-build/release} bundle=${2:-build/gpu-bundle}
    local programs=()
    for p in "${tests[@]}" "$bench"; do
        [[ -x $build/$p ]] || { echo "gpu-test: $build/$p is missing; build it first (cmake --build $build --target $(basename "$p"))" >&2; exit 1; }
        programs+=("$build/$p")
    done
    rm -rf "$bundle"
    mkdir -p "$bundle/bin" "$bundle/lib"
    for p in "${programs[@]}"; do
        strip --strip-debug -o "$bundle/bin/$(basename "$p")" "$p"
    done
    # Every library a program loads, by the path ldd resolved, minus glibc's and the driver's.
    ldd "${programs[@]}" | awk '/=> \// { print $3 }' | sort -u |
        grep -v -E '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*|libcuda|libnvidia[^/]*)\.so' |
        while read -r lib; do
            strip --strip-debug -o "$bundle/lib/$(basename "$lib")" "$lib"
        done
    if grep -q -l 'not found' <(ldd "${programs[@]}"); then
        echo "gpu-test: some library was not found by ldd:" >&2
        ldd "${programs[@]}" | grep 'not found' >&2
        exit 1
    fi
    echo "gpu-test: packed $(ls "$bundle/bin" | wc -l) programs and $(ls "$bundle/lib" | wc -l) libraries" \
         "into $bundle: $(du -sh "$bundle" | cut -f1) ($(du -sb "$bundle" | cut -f1) bytes)"
    ls "$bundle/lib"
}

run() {
    local bundle=${1:-build/gpu-bundle}
    [[ -d $bundle/bin ]] || { echo "gpu-test: no bundle at $bundle (run '$0 pack' on the build machine)" >&2; exit 1; }
    bundle=$(cd "$bundle" && pwd)
    command -v nvidia-smi > /dev/null && nvidia-smi -L || echo "gpu-test: no nvidia-smi here"
    # libsx opens NCCL at run time (libnccl.so.2 on the loader's path, or NCCL_LIBRARY):
    # point it at this machine's NCCL where the loader would not find it by itself.
    if [[ -z ${NCCL_LIBRARY:-} ]] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2 '; then
        local found pip_nccl
        pip_nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null || true)
        for found in /usr/local/cuda/lib64/libnccl.so.2 /usr/local/cuda/lib/libnccl.so.2 \
                     /usr/local/cuda/targets/*/lib/libnccl.so.2 "$pip_nccl/lib/libnccl.so.2"; do
            if [[ -e $found ]]; then
                export NCCL_LIBRARY=$found
                break
            fi
        done
    fi
    echo "gpu-test: NCCL: ${NCCL_LIBRARY:-libnccl.so.2 as the dynamic loader finds it}"
    local summary=() failed=0
    for t in "${tests[@]}"; do
        local name rc=0
        name=$(basename "$t")
        echo "== $name =="
        LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/$name" || rc=$?
        case $rc in
            0) summary+=("$name: passed") ;;
            77) summary+=("$name: skipped (see its output for why)") ;;
            *) summary+=("$name: FAILED (exit $rc)"); failed=1 ;;
        esac
    done
    echo "== bench_sx gpu_adamw =="
    local rc=0
    LD_LIBRARY_PATH="$bundle/lib" "$bundle/bin/bench_sx" gpu_adamw || rc=$?
    summary+=("bench_sx gpu_adamw: exit $rc")
    echo "== bench/torch_adamw.py =="
    rc=0
    if command -v python3 > /dev/null; then
        python3 bench/torch_adamw.py || rc=$?
        summary+=("torch_adamw.py: exit $rc")
    else
        summary+=("torch_adamw.py: no python3 here")
    fi
    echo "== summary =="
    printf '  %s\n' "${summary[@]}"
    return $failed
}

case ${1:-} in
    pack) shift; pack "$@" ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 pack [BUILD_DIR] [BUNDLE_DIR] | run [BUNDLE_DIR]" >&2; exit 2 ;;
esac
