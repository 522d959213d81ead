#!/usr/bin/env bash
# Runs sx's GPU tests, the CPU suite and the GPU benchmark on a machine with a GPU, from a
# build made on another machine. That machine has CUDA, NCCL and the driver but none of
# the Debian libraries sx links (libuv, gloo, isal, cmocka, ...), so:
#
#   scripts/gpu-test.sh pack [BUILD_DIR] [BUNDLE_DIR]
#       on the build machine (a CUDA-enabled build, SX_WITH_CUDA=ON or AUTO with nvcc
#       and NCCL found): copies the GPU tests, every compiled program of the ctest suite
#       and bench_sx of BUILD_DIR (build/release), debug sections stripped, and every
#       shared library they load, as ldd finds them, except the C library's own (libc,
#       libm, ld-linux, ...) and the driver's (libcuda, libnvidia-*), into BUNDLE_DIR
#       (build/gpu-bundle) as one xz-compressed tar (bundle.tar.xz) beside the suite's
#       run list (suite.json, from ctest). libstdc++ and libgcc_s travel too: the
#       programs were built against them.
#   scripts/gpu-test.sh run [BUNDLE_DIR] [OUT_DIR]
#       on the GPU machine (or anywhere, to see the GPU tests skip): unpacks the bundle
#       and runs, each program under its own time limit, with LD_LIBRARY_PATH set to the
#       bundle's lib/:
#         1. the GPU tests (test_cuda_kernels, test_cuda_plan, test_nccl, test_cuda_group,
#            test_cuda_pipeline, test_cuda_training), and test_offload on the device
#            (SX_OFFLOAD_TEST_DEVICE=cuda: offloaded state, several ranks on the one
#            device, as threads and as processes, meshes, LAMB's, Adafactor's and
#            Muon's device passes, and bf16 and 8-bit optimizer state kept on the device
#            (test_cuda_kernels compares those kernels with the CPU's bit for bit, and
#            the update of bf16 params without masters, bf16_stochastic_round, too),
#            equal to CPU groups; Muon's products need the
#            machine's cuBLAS, libcublas.so.13 or SX_CUBLAS_LIBRARY, which the bundle
#            does not carry: without it test_offload says Muon was not tested);
#         2. compute-sanitizer's memcheck and racecheck over the GPU tests (see
#            memchecked and racechecked), where the machine has compute-sanitizer;
#         3. the compiled programs of the ctest suite (the CPU suite, run against this
#            CUDA-enabled build on a machine with a device), several at a time;
#         4. bench_sx's gpu_adamw, gpu_step and gpu_offload sections and bench/torch_adamw.py (the
#            system's python3: torch needs its own libstdc++).
#       Logs go to OUT_DIR ($OUT where set, else build/gpu-out): summary.txt, gpu-tests.log,
#       sanitizer.log, suite.log, bench.log. Exits 1 if a test failed. The time limits, in
#       seconds, can be lowered to fit a short lease: SX_GPU_TEST_LIMIT (each GPU test, 300),
#       SX_GPU_SANITIZER_LIMIT (each sanitizer run, 240), SX_GPU_BENCH_LIMIT (each benchmark,
#       300).
#
# Tests exit 0 (passed), 77 (skipped: no CUDA device, with the reason) or anything
# else (failed).
set -euo pipefail
cd "$(dirname "$0")/.."

gpu_tests=(tests/optim/test_cuda_kernels tests/optim/test_cuda_plan tests/comm/test_nccl tests/core/test_cuda_group
           tests/core/test_cuda_pipeline tests/core/test_cuda_training)
# The GPU tests compute-sanitizer runs (test_cuda_plan is host code only): memcheck over
# all of them; racecheck (shared-memory hazards, which only the kernels' block sums can
# have) over all but test_cuda_pipeline, whose hundreds of small steps run the same
# kernels as test_cuda_group's and take racecheck more than 4 minutes.
memchecked=(tests/optim/test_cuda_kernels tests/comm/test_nccl tests/core/test_cuda_group tests/core/test_cuda_pipeline
            tests/core/test_cuda_training)
racechecked=(tests/optim/test_cuda_kernels tests/comm/test_nccl tests/core/test_cuda_group tests/core/test_cuda_training)
bench=bench/bench_sx

pack() {
    local build=${1:-build/release} bundle=${2:-build/gpu-bundle}
    build=$(cd "$build" && pwd)
    local stage
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' RETURN
    mkdir -p "$stage/bin" "$stage/lib"
    # The suite's compiled programs (and their arguments, working directories, time limits)
    # from ctest; tests that run Python, Go, Rust or shell drivers stay on the build machine.
    ctest --test-dir "$build" --show-only=json-v1 > "$stage/ctest.json"
    python3 scripts/bundle_suite.py list "$stage/ctest.json" "$build" "$PWD" > "$stage/suite.json"
    local programs=()
    for p in "${gpu_tests[@]}" "$bench"; do
        [[ -x $build/$p ]] || { echo "gpu-test: $build/$p is missing; build it first (cmake --build $build --target $(basename "$p"))" >&2; exit 1; }
        programs+=("$build/$p")
    done
    while read -r p; do programs+=("$build/$p"); done < <(python3 scripts/bundle_suite.py programs "$stage/suite.json")
    local p
    for p in $(printf '%s\n' "${programs[@]}" | sort -u); do
        mkdir -p "$stage/bin/$(dirname "${p#"$build"/}")"
        strip --strip-debug -o "$stage/bin/${p#"$build"/}" "$p"
    done
    # Every library a program loads, by the path ldd resolved, minus glibc's and the driver's.
    if ldd "${programs[@]}" | grep -q 'not found'; then
        echo "gpu-test: some library was not found by ldd:" >&2
        ldd "${programs[@]}" | grep 'not found' >&2
        exit 1
    fi
    ldd "${programs[@]}" | awk '/=> \// { print $3 }' | sort -u |
        grep -v -E '/(libc|libm|libdl|librt|libpthread|libresolv|ld-linux[^/]*|libcuda|libnvidia[^/]*)\.so' |
        while read -r lib; do
            strip --strip-debug -o "$stage/lib/$(basename "$lib")" "$lib"
        done
    rm -rf "$bundle"
    mkdir -p "$bundle"
    cp "$stage/suite.json" "$bundle/suite.json"
    tar -C "$stage" -cf - bin lib | xz -T0 -6 > "$bundle/bundle.tar.xz"
    echo "gpu-test: packed $(find "$stage/bin" -type f | wc -l) programs and $(ls "$stage/lib" | wc -l) libraries" \
         "into $bundle: $(du -sh "$bundle" | cut -f1) ($(du -sb "$bundle" | cut -f1) bytes)"
}

# Runs "$@" under `timeout`, its output to the log; records "NAME: passed|skipped|FAILED".
run_one() {
    local log=$1 limit=$2 name=$3
    shift 3
    local rc=0
    echo "== $name ==" >> "$log"
    timeout --kill-after=10 "$limit" "$@" >> "$log" 2>&1 || rc=$?
    case $rc in
        0) echo "$name: passed" ;;
        77) echo "$name: skipped (see its output for why)" ;;
        124|137) echo "$name: FAILED (over its ${limit}s limit)" ;;
        *) echo "$name: FAILED (exit $rc)" ;;
    esac
}

run() {
    local bundle=${1:-build/gpu-bundle} out=${2:-${OUT:-build/gpu-out}}
    [[ -f $bundle/bundle.tar.xz ]] || { echo "gpu-test: no bundle at $bundle (run '$0 pack' on the build machine)" >&2; exit 1; }
    bundle=$(cd "$bundle" && pwd)
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    local dir
    dir=$(mktemp -d)
    xz -dc "$bundle/bundle.tar.xz" | tar -C "$dir" -xf -
    export LD_LIBRARY_PATH="$dir/lib"
    local summary="$out/summary.txt"
    : > "$summary"
    {
        date -u
        command -v nvidia-smi > /dev/null && nvidia-smi -L || echo "no nvidia-smi here"
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null || true
    } | tee -a "$summary"
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
    echo "NCCL: ${NCCL_LIBRARY:-libnccl.so.2 as the dynamic loader finds it}" | tee -a "$summary"

    echo "-- GPU tests" | tee -a "$summary"
    local t
    for t in "${gpu_tests[@]}"; do
        [[ -x $dir/bin/$t ]] || { echo "$(basename "$t"): FAILED (not in the bundle)" | tee -a "$summary"; continue; }
        run_one "$out/gpu-tests.log" "${SX_GPU_TEST_LIMIT:-300}" "$(basename "$t")" "$dir/bin/$t" | tee -a "$summary"
    done
    # The offload tests, which the CPU suite runs on the simulated device, on this one.
    t=tests/core/test_offload
    if [[ -x $dir/bin/$t ]]; then
        run_one "$out/gpu-tests.log" "${SX_GPU_TEST_LIMIT:-300}" "test_offload (on the device)" \
            env SX_OFFLOAD_TEST_DEVICE=cuda "$dir/bin/$t" | tee -a "$summary"
    else
        echo "test_offload (on the device): FAILED (not in the bundle)" | tee -a "$summary"
    fi

    # The CPU suite runs on the host's cores meanwhile (it uses no device).
    python3 scripts/bundle_suite.py run "$bundle/suite.json" "$dir/bin" "$PWD" "$out/suite.log" > "$out/suite.txt" 2>&1 &
    local suite_pid=$!

    local cs
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
    if [[ -n $cs ]] && nvidia-smi -L > /dev/null 2>&1; then
        echo "-- compute-sanitizer ($cs)" | tee -a "$summary"
        # All at once (the device has room for them, and each is slowed many times over),
        # each into its own log, gathered in order when they are done.
        local tool logs=() names=() pids=() k=0
        for tool in memcheck racecheck; do
            local list=("${memchecked[@]}")
            [[ $tool == racecheck ]] && list=("${racechecked[@]}")
            for t in "${list[@]}"; do
                [[ -x $dir/bin/$t ]] || continue
                # NCCL looks for its kernels for this device with cudaFuncGetAttributes and
                # takes "no kernel image" for an answer; memcheck would count each as an error.
                local api_errors=()
                [[ $t == */test_nccl ]] && api_errors=(--report-api-errors no)
                names+=("$tool $(basename "$t")")
                logs+=("$dir/sanitizer-$k.log")
                run_one "$dir/sanitizer-$k.log" "${SX_GPU_SANITIZER_LIMIT:-240}" "$tool $(basename "$t")" "$cs" --tool "$tool" --error-exitcode 99 \
                    --target-processes all "${api_errors[@]}" "$dir/bin/$t" > "$dir/sanitizer-$k.verdict" &
                pids+=($!)
                k=$((k + 1))
            done
        done
        for ((k = 0; k < ${#pids[@]}; k++)); do
            wait "${pids[$k]}" || true
            cat "${logs[$k]}" >> "$out/sanitizer.log"
            cat "$dir/sanitizer-$k.verdict" | tee -a "$summary"
        done
    else
        echo "-- compute-sanitizer: not run (no compute-sanitizer or no device here)" | tee -a "$summary"
    fi

    echo "-- the ctest suite's compiled programs" | tee -a "$summary"
    wait "$suite_pid" || true
    cat "$out/suite.txt" | tee -a "$summary"
    rm -f "$out/suite.txt"

    echo "-- benchmarks" | tee -a "$summary"
    local rc=0
    timeout "${SX_GPU_BENCH_LIMIT:-300}" "$dir/bin/bench/bench_sx" gpu_adamw gpu_step gpu_offload > "$out/bench.log" 2>&1 || rc=$?
    grep -v '^{' "$out/bench.log" | tee -a "$summary" || true
    echo "bench_sx gpu_adamw gpu_step gpu_offload: exit $rc" | tee -a "$summary"
    rc=0
    if command -v python3 > /dev/null; then
        env -u LD_LIBRARY_PATH timeout "${SX_GPU_BENCH_LIMIT:-300}" python3 bench/torch_adamw.py >> "$out/bench.log" 2>&1 || rc=$?
        grep torch_adamw "$out/bench.log" | grep -v '^{' | tee -a "$summary" || true
        echo "torch_adamw.py: exit $rc" | tee -a "$summary"
    fi
    grep '^{' "$out/bench.log" >> "$summary" || true
    rm -rf "$dir"
    echo "== failures ==" | tee -a "$summary"
    if grep -q 'FAILED' "$summary"; then
        grep 'FAILED' "$summary"
        return 1
    fi
    echo "none" | tee -a "$summary"
}

case ${1:-} in
    pack) shift; pack "$@" ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 pack [BUILD_DIR] [BUNDLE_DIR] | run [BUNDLE_DIR] [OUT_DIR]" >&2; exit 2 ;;
esac
