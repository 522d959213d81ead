// SX_GROUP_OPENMP_THREADS: refused, before any connection, while no OpenMP runtime is
// loaded (sx never loads one). Once the program has one (as torch has its libgomp), the
// work of a step made on the trainer's thread runs on that thread's OpenMP team: a custom
// optimizer's pieces run inside a parallel region, some on the team's other threads; and
// AdamW, Adafactor and the custom update end on the bits of the same run on the group's
// own pool, two ranks as threads at stages 1-3.
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sx_cmocka.h"
#include "run_ranks.h"
#include "sx/sx.h"

namespace {

#define REQUIRE(call)                                                                                   \
    do {                                                                                                \
        const sx_status_t s_ = (call);                                                                  \
        if (s_ != SX_OK) return std::string(#call) + ": " + sx_status_string(s_) + ": " + sx_last_error_message(); \
    } while (0)

const char *const kRuntimes[] = {"libgomp.so.1", "libomp.so.5", "libomp.so", "libiomp5.so"};

int (*omp_in_parallel_fn)() = nullptr;
int (*omp_thread_num_fn)() = nullptr;

// What the custom update saw: pieces in all, inside a parallel region, and on a team
// thread other than the caller (thread 0).
std::atomic<int> pieces{0}, pieces_in_team{0}, pieces_on_team_workers{0};

// p -= lr * g, counting where it ran.
int32_t recording_update(const sx_optimizer_piece_t *piece) {
    pieces.fetch_add(1);
    if (omp_in_parallel_fn && omp_in_parallel_fn()) {
        pieces_in_team.fetch_add(1);
        if (omp_thread_num_fn() > 0) pieces_on_team_workers.fetch_add(1);
    }
    const float lr = static_cast<float>(piece->hyperparameters[0]);
    for (size_t i = 0; i < piece->n; ++i) piece->param[i] -= lr * (piece->grad[i] * piece->grad_scale);
    return 0;
}

int32_t register_recording() {
    static int32_t id = 0;
    if (id) return id;
    sx_optimizer_hyperparameter_t lr = {"lr", 0.01, 0.0, 0.0};
    sx_optimizer_desc_t d;
    assert_int_equal(sx_optimizer_desc_init(&d, sizeof d), SX_OK);
    d.name = "RecordingSGD";
    d.num_hyperparameters = 1;
    d.hyperparameters = &lr;
    d.update = recording_update;
    assert_int_equal(sx_register_optimizer(&d, &id), SX_OK);
    return id;
}

sx_group_config_t config(const std::string &rv, int rank, int world, int stage, bool openmp) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.stage = stage;
    cfg.num_threads = 2;
    cfg.flags = openmp ? SX_GROUP_OPENMP_THREADS : 0;
    return cfg;
}

bool runtime_loaded() {
    for (const char *name : kRuntimes) {
        void *h = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            dlclose(h);
            return true;
        }
    }
    return false;
}

// Runs first, while this program has loaded no OpenMP runtime.
void test_refused_without_a_runtime(void **) {
    if (runtime_loaded()) skip();  // a library of the build pulled one in: nothing to refuse
    const std::string rv = "local://omp-none-" + std::to_string(getpid());
    sx_group_config_t cfg = config(rv, 0, 1, 2, true);
    sx_shard_group_t *g = reinterpret_cast<sx_shard_group_t *>(0x1);
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_ERR_UNSUPPORTED);
    assert_null(g);
    const std::string msg = sx_last_error_message();
    assert_true(msg.find("SX_GROUP_OPENMP_THREADS") != std::string::npos);
    assert_true(msg.find("no OpenMP runtime is loaded") != std::string::npos);
    assert_true(msg.find("libgomp.so.1") != std::string::npos);
    // Without the flag the same rendezvous makes a group: the refusal left nothing behind.
    cfg.flags = 0;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_OK);
    assert_int_equal(sx_destroy_shard_group(g), SX_OK);
}

const int64_t kVector = 3 * 65536 + 77;  // pieces of 4096 on both pool threads
const int64_t kMatrix[2] = {96, 160};

// Two ranks at `stage`: AdamW (param "a"), the recording SGD ("b"), Adafactor ("m"), in
// two units; 4 steps with gradients that differ per rank. *out: the params after, per
// rank, concatenated.
std::string train(int rank, int stage, bool openmp, const std::string &rv, std::vector<float> *out) {
    sx_group_config_t cfg = config(rv, rank, 2, stage, openmp);
    sx_shard_group_t *g = nullptr;
    REQUIRE(sx_create_shard_group(&cfg, &g));
    const int32_t optimizers[3] = {SX_OPTIM_ADAMW, register_recording(), SX_OPTIM_ADAFACTOR};
    for (int32_t opt : optimizers) {
        sx_param_group_desc_t d;
        REQUIRE(sx_param_group_desc_init(&d, sizeof d, opt));
        d.lr = 0.01;
        REQUIRE(sx_add_param_group(g, &d, nullptr));
    }
    const char *names[3] = {"a", "b", "m"};
    for (int p = 0; p < 3; ++p) {
        sx_param_desc_t pd;
        sx_param_desc_init(&pd, sizeof pd);
        pd.name = names[p];
        pd.ndim = p == 2 ? 2 : 1;
        pd.shape = p == 2 ? kMatrix : &kVector;
        pd.param_group = p;
        pd.unit = p == 2 ? 1 : 0;
        REQUIRE(sx_add_param(g, &pd, nullptr));
    }
    REQUIRE(sx_finalize(g));
    for (int step = 0; step < 4; ++step) {
        for (int32_t unit = 0; unit < 2; ++unit) REQUIRE(sx_unit_gather(g, unit));
        for (int p = 0; p < 3; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            REQUIRE(sx_grad_view(g, p, &v));
            float *grad = static_cast<float *>(v.data);
            for (uint64_t i = 0; i < v.numel; ++i) grad[i] = std::cos(0.013f * (i + 1) * (rank + 1) + 0.5f * step + p);
        }
        for (int32_t unit = 0; unit < 2; ++unit) REQUIRE(sx_unit_release(g, unit));
        REQUIRE(sx_step(g, nullptr, nullptr));
    }
    for (int32_t unit = 0; unit < 2; ++unit) REQUIRE(sx_unit_gather(g, unit));
    for (int p = 0; p < 3; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        REQUIRE(sx_param_view(g, p, &v));
        const float *values = static_cast<const float *>(v.data);
        out->insert(out->end(), values, values + v.numel);
    }
    for (int32_t unit = 0; unit < 2; ++unit) REQUIRE(sx_unit_release(g, unit));
    REQUIRE(sx_destroy_shard_group(g));
    return "";
}

void test_steps_on_the_callers_team(void **) {
    // The program loads an OpenMP runtime, as torch does; sx finds it. The team is never
    // declined for starting late (on a busy machine it would be: openmp_team.h).
    setenv("SX_OPENMP_LATE_START_US", "0", 1);
    void *gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL);
    assert_non_null(gomp);
    omp_in_parallel_fn = reinterpret_cast<int (*)()>(dlsym(gomp, "omp_in_parallel"));
    omp_thread_num_fn = reinterpret_cast<int (*)()>(dlsym(gomp, "omp_get_thread_num"));
    assert_non_null(omp_in_parallel_fn);
    assert_non_null(omp_thread_num_fn);
    for (int stage = 1; stage <= 3; ++stage) {
        std::vector<float> params[2][2];  // [openmp][rank]
        for (int openmp = 0; openmp < 2; ++openmp) {
            pieces = pieces_in_team = pieces_on_team_workers = 0;
            const std::string rv = "local://omp-" + std::to_string(stage) + "-" + std::to_string(openmp) + "-" +
                                   std::to_string(getpid());
            const std::string err = sxtest::run_ranks(2, [&](int r) { return train(r, stage, openmp, rv, &params[openmp][r]); });
            if (!err.empty()) fail_msg("stage %d, openmp %d: %s", stage, openmp, err.c_str());
            assert_true(pieces.load() > 0);
            if (openmp) {
                // Every piece ran in a parallel region, and some on the team's workers.
                assert_int_equal(pieces_in_team.load(), pieces.load());
                assert_true(pieces_on_team_workers.load() > 0);
            } else {
                assert_int_equal(pieces_in_team.load(), 0);
            }
        }
        for (int r = 0; r < 2; ++r) {
            assert_int_equal(params[0][r].size(), params[1][r].size());
            assert_int_equal(params[0][r].size(), static_cast<size_t>(kVector * 2 + kMatrix[0] * kMatrix[1]));
            assert_memory_equal(params[0][r].data(), params[1][r].data(), params[0][r].size() * sizeof(float));
        }
        assert_memory_equal(params[1][0].data(), params[1][1].data(), params[1][0].size() * sizeof(float));
    }
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_without_a_runtime),
        cmocka_unit_test(test_steps_on_the_callers_team),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
