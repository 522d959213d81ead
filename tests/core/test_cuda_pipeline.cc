// Units as a pipeline and ZeRO stage 3 on the CUDA backend, through the scenarios of
// test_pipeline and test_step (step_scenario.h), whose trainer reaches the device views
// through cudaMemcpy: one rank on one device (NCCL runs one rank per device, and the
// machines these tests run on have one). Plain, overlapped (units signalled ready one by
// one, in the backward's and in random orders) and deferred-gather steps at stages 1-3,
// stage 3's gathers around each unit's forward and backward with prefetch, freezing,
// param groups added while training, and checkpoints that move a run between the device
// and 2 CPU ranks and between stages. Every run follows the unsharded reference to 1e-6
// and equals the same scenario on the CPU backend bit for bit (within 1e-6 where it clips:
// the backends add their sums of squares differently, see test_cuda_group.cc).
//
// Without a CUDA device the program says why and exits 77 (ctest: Skipped).
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda/runtime.h"
#include "step_scenario.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"
#include "test_files.h"

using sxtest::Scenario;

namespace {

using Params = std::vector<std::vector<float>>;

bool g_have_device = false;
std::string g_no_device_reason;

bool skip_without_device() {
    if (g_have_device) return false;
    std::printf("skipped: no CUDA device (%s)\n", g_no_device_reason.c_str());
    return true;
}

bool cuda_copy(void *dst, const void *src, size_t bytes, bool to_device) {
    return cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost) == cudaSuccess;
}

Scenario on_device(Scenario sc) {
    sc.backend = SX_BACKEND_CUDA;
    sc.device_copy = cuda_copy;
    return sc;
}

// Runs sc (one rank) on the device and checks its params against the reference (1e-6)
// and against `cpu` (the same scenario's params on the CPU backend; computed here when
// empty): bit for bit, or within 1e-6 where sc clips.
void expect_device_run(const Scenario &sc, const std::string &name, Params *cpu) {
    std::vector<Params> got;
    if (cpu->empty()) {
        std::string err = sxtest::run_threads(sc, name + "-cpu", &got);
        if (!err.empty()) fail_msg("%s on the CPU: %s", name.c_str(), err.c_str());
        *cpu = got[0];
    }
    std::string err = sxtest::run_threads(on_device(sc), name + "-cuda", &got);
    if (!err.empty()) fail_msg("%s on the device: %s", name.c_str(), err.c_str());
    err = sxtest::compare(got[0], sxtest::reference_run(sc), 1e-6);
    if (!err.empty()) fail_msg("%s on the device, against the reference: %s", name.c_str(), err.c_str());
    err = sxtest::compare(got[0], *cpu, sc.max_grad_norm > 0 ? 1e-6 : 0.0);
    if (!err.empty()) fail_msg("%s on the device, against the CPU backend: %s", name.c_str(), err.c_str());
}

std::string tag(const char *what, int stage, int32_t opt) {
    return std::string(what) + "-s" + std::to_string(stage) + "-o" + std::to_string(opt) + "-" +
           std::to_string(getpid());
}

void test_plain_overlapped_and_deferred_steps(void **) {
    if (skip_without_device()) return;
    for (int32_t opt : {SX_OPTIM_ADAMW, SX_OPTIM_SGD, SX_OPTIM_ADAM}) {
        for (int stage = 1; stage <= 3; ++stage) {
            for (double clip : {0.0, 5.0}) {
                Scenario sc = sxtest::two_group_scenario(opt);
                sc.stage = stage;
                sc.max_grad_norm = clip;
                const std::string name = tag(clip > 0 ? "clipped" : "plain", stage, opt);
                Params cpu;  // plain, overlapped and deferred runs all equal the plain CPU run
                expect_device_run(sc, name, &cpu);
                sc.overlap = true;
                expect_device_run(sc, name + "-overlap", &cpu);
                if (stage < 3) {
                    sc.defer_gather = true;
                    sc.gather_units = true;
                    expect_device_run(sc, name + "-deferred", &cpu);
                }
            }
        }
    }
}

// Eight units of unlike sizes at stage 3, signalled in a random order every micro-batch
// (some never), gathered around forward and backward with prefetch depths 0-2.
void test_stage3_orders_and_prefetch(void **) {
    if (skip_without_device()) return;
    Scenario sc = sxtest::eight_unit_scenario();
    sc.max_grad_norm = 0.0;
    sc.stage = 3;
    sc.overlap = true;
    Params cpu;
    for (int depth : {SX_PREFETCH_NONE, 1, 2}) {
        sc.prefetch_depth = depth;
        sc.signal_order = [](int, int step, int micro, int32_t units) {
            std::vector<int32_t> o;
            for (int32_t u = 0; u < units; ++u)
                if (u != 5) o.push_back(u);
            std::mt19937 rng(static_cast<uint32_t>(step * 10 + micro));
            std::shuffle(o.begin(), o.end(), rng);
            return o;
        };
        expect_device_run(sc, "orders-" + std::to_string(depth + 1) + "-" + std::to_string(getpid()), &cpu);
    }
}

void test_freezing_and_groups_added_while_training(void **) {
    if (skip_without_device()) return;
    for (int stage = 1; stage <= 3; ++stage) {
        for (int32_t opt : {SX_OPTIM_ADAMW, SX_OPTIM_SGD}) {
            Scenario sc = sxtest::two_group_scenario(opt);
            sc.stage = stage;
            sc.trainable = sxtest::freeze_schedule;
            sc.overlap = stage != 2;
            Params cpu;
            expect_device_run(sc, tag("freeze", stage, opt), &cpu);
            Scenario late = sxtest::late_group_scenario(opt, 4);
            late.stage = stage;
            late.overlap = stage == 3;
            Params cpu_late;
            expect_device_run(late, tag("late", stage, opt), &cpu_late);
        }
    }
}

// Stage 3 on the device for steps 1-4, 2 CPU ranks at stage 1 for 5-8, the device at
// stage 2 for 9-12: every leg loads the one before's checkpoint, and the end equals the
// run that never stopped.
void test_checkpoints_between_the_device_and_the_cpu(void **) {
    if (skip_without_device()) return;
    const std::string dir = sxtest::make_tmpdir("cuda-pipeline-ckpt");
    Scenario sc = on_device(sxtest::two_group_scenario(SX_OPTIM_ADAMW));
    sc.same_grads_on_every_rank = true;
    sc.steps = 12;
    const Params want = sxtest::reference_run(sc);
    const std::string err = sxtest::run_legs(
        sc, {{1, 0, 3, 1, 4, SX_BACKEND_CUDA}, {2, 0, 1, 5, 8, SX_BACKEND_CPU}, {1, 0, 2, 9, 12, SX_BACKEND_CUDA}}, dir,
        "cuda-legs-" + std::to_string(getpid()), want, 1e-6);
    if (!err.empty()) fail_msg("%s", err.c_str());
    sxtest::remove_tree(dir);
}

}  // namespace

int main() {
    g_have_device = sx::cuda::device_available(&g_no_device_reason);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_overlapped_and_deferred_steps),
        cmocka_unit_test(test_stage3_orders_and_prefetch),
        cmocka_unit_test(test_freezing_and_groups_added_while_training),
        cmocka_unit_test(test_checkpoints_between_the_device_and_the_cpu),
    };
    const int failed = cmocka_run_group_tests(tests, nullptr, nullptr);
    if (failed == 0 && !g_have_device) return 77;  // ctest: Skipped
    return failed;
}
