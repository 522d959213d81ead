// The per-param sums of LAMB and Adafactor (core/param_reductions.cc) over a group's own
// Gloo mesh (SX_TRANSPORT_TCP) and over shared memory: 3 ranks as threads over local://,
// stages 1 and 2, a few steps of gradients of wide exponents and both signs on params cut
// across the ranks, so that the per-param sums depend on the order they are added in. The params after the
// steps are the same bits on both transports, and each transport's exchanges hold the same
// bytes per rank (the all-reduce's one block of sums; an all-gather would hold 3 of them),
// read from the step's trace (spans param_sums_exchange and update_sums_exchange). The sums
// are of squares: another order would change their last bits, which the floats derived
// from them rarely see; test_comm_ordered_sum checks the order itself.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm_test_util.h"
#include "trace_spans.h"
#include "sx/sx.h"

namespace {

constexpr int kRanks = 3, kSteps = 4;
// {101, 1}: a vector; {700, 1400}: Adafactor's row and column sums pass 16 KiB, so that its
// first exchange over TCP goes in parts (LAMB's, a few doubles per param, through rank 0).
const int64_t kShapes[][2] = {{37, 29}, {64, 5}, {101, 1}, {3, 200}, {700, 1400}};

std::string failed(const char *what, sx_status_t s) {
    return std::string(what) + ": " + sx_status_string(s) + ": " + sx_last_error_message();
}

// Rank r's gradient element i at step t: exponents 2^-20 to 2^20, both signs, on one rank
// per element (zero on the others), so that the gradients' reduce-scatter is exact on
// both transports (their float sums are in orders of their own) and the params differ
// only where the per-param sums, each rank's pieces' sums in double, are added in
// another order.
float grad(int r, size_t i, int t) {
    if (static_cast<int>((i / 3 + static_cast<size_t>(t)) % kRanks) != r) return 0.0f;
    const uint64_t h = (static_cast<uint64_t>(r + 1) * 0x9E3779B97F4A7C15ull) ^ ((i + 1) * 0xBF58476D1CE4E5B9ull) ^
                       (static_cast<uint64_t>(t + 1) * 0x94D049BB133111EBull);
    const uint64_t x = h ^ (h >> 31);
    const float m = static_cast<float>(x % 1000003) / 1000003.0f + 0.5f;
    return std::ldexp((x >> 40) & 1 ? -m : m, static_cast<int>((x >> 20) % 41) - 20);
}

struct Run {
    std::vector<std::vector<uint32_t>> params;  // per rank, every param's bits in order
    std::vector<double> exchanged;              // per rank, the two exchanges' bytes
};

// kSteps steps of `optimizer` at `stage` over `transport`.
Run train(int32_t optimizer, int stage, int32_t transport) {
    Run run;
    run.params.resize(kRanks);
    run.exchanged.resize(kRanks);
    sxtest::TempDir dir;
    const std::string trace = dir.path() + "/trace.json";
    const std::string url = "local://" + sxtest::unique_name("param-sums") + "-" + std::to_string(optimizer) + "-" +
                            std::to_string(stage) + "-" + std::to_string(transport);
    sxtest::run_ranks(kRanks, [&](int r) -> std::string {
        sx_group_config_t cfg;
        sx_group_config_init(&cfg, sizeof cfg);
        cfg.rendezvous = url.c_str();
        cfg.rank = r;
        cfg.world_size = kRanks;
        cfg.stage = stage;
        cfg.transport = transport;
        cfg.trace_path = trace.c_str();
        cfg.num_threads = 1;
        cfg.timeout_ms = 60000;
        sx_shard_group_t *g = nullptr;
        sx_status_t s = sx_create_shard_group(&cfg, &g);
        if (s != SX_OK) return failed("sx_create_shard_group", s);
        sx_param_group_desc_t pd;
        sx_param_group_desc_init(&pd, sizeof pd, optimizer);
        pd.weight_decay = 0.01;
        s = sx_add_param_group(g, &pd, nullptr);
        for (size_t k = 0; s == SX_OK && k < sizeof kShapes / sizeof kShapes[0]; ++k) {
            const std::string name = "p" + std::to_string(k);
            sx_param_desc_t d;
            sx_param_desc_init(&d, sizeof d);
            d.name = name.c_str();
            d.ndim = kShapes[k][1] == 1 ? 1 : 2;
            d.shape = kShapes[k];
            s = sx_add_param(g, &d, nullptr);
        }
        if (s == SX_OK) s = sx_finalize(g);
        const int32_t count = static_cast<int32_t>(sizeof kShapes / sizeof kShapes[0]);
        for (int32_t k = 0; s == SX_OK && k < count; ++k) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            s = sx_param_view(g, k, &v);
            for (uint64_t i = 0; s == SX_OK && i < v.numel; ++i)
                static_cast<float *>(v.data)[i] = 0.25f + 0.001f * static_cast<float>((i * 7 + k) % 101);
        }
        for (int t = 0; s == SX_OK && t < kSteps; ++t) {
            for (int32_t k = 0, at = 0; s == SX_OK && k < count; ++k) {
                sx_view_t v;
                sx_view_init(&v, sizeof v);
                s = sx_grad_view(g, k, &v);
                for (uint64_t i = 0; s == SX_OK && i < v.numel; ++i)
                    static_cast<float *>(v.data)[i] = grad(r, static_cast<size_t>(at) + i, t);
                at += static_cast<int32_t>(v.numel);
            }
            if (s == SX_OK) s = sx_step(g, nullptr, nullptr);
        }
        for (int32_t k = 0; s == SX_OK && k < count; ++k) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            s = sx_param_view(g, k, &v);
            const uint32_t *bits = static_cast<const uint32_t *>(v.data);
            if (s == SX_OK) run.params[static_cast<size_t>(r)].insert(run.params[static_cast<size_t>(r)].end(), bits,
                                                                     bits + v.numel);
        }
        const sx_status_t destroyed = sx_destroy_shard_group(g);
        if (s != SX_OK) return failed("a group call", s);
        if (destroyed != SX_OK) return failed("sx_destroy_shard_group", destroyed);
        const std::string path = dir.path() + "/trace.rank" + std::to_string(r) + ".json";
        run.exchanged[static_cast<size_t>(r)] =
            sxtest::span_bytes(path, "param_sums_exchange") + sxtest::span_bytes(path, "update_sums_exchange");
        return "";
    });
    return run;
}

void compare(int32_t optimizer) {
    for (int stage : {1, 2}) {
        const Run shm = train(optimizer, stage, SX_TRANSPORT_AUTO);
        const Run tcp = train(optimizer, stage, SX_TRANSPORT_TCP);
        for (int r = 0; r < kRanks; ++r) {
            const size_t q = static_cast<size_t>(r);
            assert_true(!shm.params[q].empty());
            assert_true(shm.params[q] == shm.params[0]);  // every rank holds the same params
            if (shm.params[q] != tcp.params[q]) {
                size_t i = 0;
                while (shm.params[q][i] == tcp.params[q][i]) ++i;
                fail_msg("optimizer %d, stage %d, rank %d: element %zu is 0x%08x over TCP, 0x%08x over shared memory",
                         optimizer, stage, r, i, tcp.params[q][i], shm.params[q][i]);
            }
            if (!(shm.exchanged[q] > 0.0) || tcp.exchanged[q] != shm.exchanged[q])
                fail_msg("optimizer %d, stage %d, rank %d: the sums' exchanges held %.0f bytes over TCP, %.0f over "
                         "shared memory",
                         optimizer, stage, r, tcp.exchanged[q], shm.exchanged[q]);
        }
    }
}

void test_lamb(void **) { compare(SX_OPTIM_LAMB); }
void test_adafactor(void **) { compare(SX_OPTIM_ADAFACTOR); }

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lamb),
        cmocka_unit_test(test_adafactor),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
