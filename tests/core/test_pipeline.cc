// Units as a pipeline: gradients reduced per unit as the trainer signals them
// (sx_unit_grads_ready), params gathered per unit after a deferred step, and stage 3
// (params sharded, gathered around each unit's forward and backward with prefetch).
// Overlapped runs equal the plain ones bit for bit at every stage and world size 1-4,
// stage 3 equals stage 2, and both follow the unsharded reference. Misuse, a peer that
// disagrees, a peer that dies and sx_abort end in a clear error on every rank, never a
// hang; memory at stage 3 stays within its bound; checkpoints move between stages.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "api/handles.h"
#include "core/group.h"
#include "process_ranks.h"
#include "run_ranks.h"
#include "step_scenario.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"
#include "test_files.h"

using sxtest::Scenario;

namespace {

using Params = std::vector<std::vector<float>>;
using sxtest::run_threads;

// Runs sc and checks that every rank's params equal `want` bit for bit (want empty: rank
// 0's become it) and the unsharded reference to 1e-6.
void expect_run(const Scenario &sc, const std::string &name, Params *want) {
    std::vector<Params> got;
    std::string err = run_threads(sc, name, &got);
    if (!err.empty()) fail_msg("%s: %s", name.c_str(), err.c_str());
    if (want->empty()) {
        err = sxtest::compare(got[0], sxtest::reference_run(sc), 1e-6);
        if (!err.empty()) fail_msg("%s against the reference: %s", name.c_str(), err.c_str());
        *want = got[0];
    }
    for (size_t r = 0; r < got.size(); ++r) {
        err = sxtest::compare(got[r], *want, 0.0);
        if (!err.empty()) fail_msg("%s rank %zu is not bit-identical: %s", name.c_str(), r, err.c_str());
    }
}

std::string tag(const char *what, int world, int stage) {
    return std::string(what) + "-w" + std::to_string(world) + "-s" + std::to_string(stage);
}

Scenario eight_units() { return sxtest::eight_unit_scenario(); }

void test_overlap_is_bit_identical_at_every_stage(void **) {
    for (int world = 1; world <= 4; ++world) {
        Params stage2;
        for (int stage = 1; stage <= 3; ++stage) {
            Scenario sc = sxtest::two_group_scenario(SX_OPTIM_ADAMW);
            sc.world = world;
            sc.stage = stage;
            Params want;
            expect_run(sc, tag("plain", world, stage), &want);
            Scenario ov = sc;
            ov.overlap = true;
            expect_run(ov, tag("overlap", world, stage), &want);
            if (stage < 3) {
                ov.defer_gather = true;
                ov.gather_units = true;
                expect_run(ov, tag("deferred", world, stage), &want);
            }
            if (stage == 2) stage2 = want;
            if (stage == 3) {
                std::string err = sxtest::compare(want, stage2, 0.0);
                if (!err.empty()) fail_msg("world %d: stage 3 differs from stage 2: %s", world, err.c_str());
            }
        }
    }
}

void test_sgd_single_micro_batch_and_no_clipping(void **) {
    for (int stage = 1; stage <= 3; ++stage) {
        Scenario sc = sxtest::two_group_scenario(SX_OPTIM_SGD);
        sc.world = 3;
        sc.stage = stage;
        sc.micro_batches = 1;
        sc.max_grad_norm = 0.0;
        Params want;
        expect_run(sc, tag("sgd-plain", 3, stage), &want);
        sc.overlap = true;
        expect_run(sc, tag("sgd-overlap", 3, stage), &want);
    }
}

void test_freezing_with_overlap(void **) {
    for (int world : {2, 3}) {
        for (int stage = 1; stage <= 3; ++stage) {
            for (int32_t opt : {SX_OPTIM_ADAMW, SX_OPTIM_SGD}) {
                Scenario sc = sxtest::two_group_scenario(opt);
                sc.world = world;
                sc.stage = stage;
                sc.trainable = sxtest::freeze_schedule;
                sc.mask_through_pointer = stage != 2;
                const std::string name = tag("freeze", world, stage) + "-" + std::to_string(opt);
                Params want;
                expect_run(sc, name + "-plain", &want);
                sc.overlap = true;
                expect_run(sc, name + "-overlap", &want);
            }
        }
    }
}

// Orders of signals: increasing, a different random order on every rank and micro-batch
// (so the reductions cannot simply follow the signals; at stage 3 on every micro-batch),
// and some units never signalled.
void test_signal_orders(void **) {
    for (int stage = 1; stage <= 3; ++stage) {
        Scenario sc = eight_units();
        sc.world = 3;
        sc.stage = stage;
        Params want;
        expect_run(sc, tag("orders-plain", 3, stage), &want);
        sc.overlap = true;
        sc.signal_order = [](int, int, int, int32_t units) {
            std::vector<int32_t> o;
            for (int32_t u = 0; u < units; ++u) o.push_back(u);
            return o;
        };
        expect_run(sc, tag("increasing", 3, stage), &want);
        // Stage 3 gathers around each unit's backward, and gathers are collective: there
        // the ranks go in one random order.
        sc.signal_order = [stage](int rank, int step, int micro, int32_t units) {
            std::vector<int32_t> o;
            for (int32_t u = 0; u < units; ++u) o.push_back(u);
            std::mt19937 rng(static_cast<uint32_t>((stage == 3 ? 0 : rank) * 1000 + step * 10 + micro));
            std::shuffle(o.begin(), o.end(), rng);
            return o;
        };
        expect_run(sc, tag("random", 3, stage), &want);
        // Units 2 and 5 never signalled; in odd steps' first micro-batch none at all (the
        // trainer still writes their gradients).
        sc.signal_order = [](int, int step, int micro, int32_t units) {
            std::vector<int32_t> o;
            if (step % 2 == 1 && micro == 0) return o;
            for (int32_t u = units - 1; u >= 0; --u)
                if (u != 2 && u != 5) o.push_back(u);
            return o;
        };
        expect_run(sc, tag("partial", 3, stage), &want);
    }
}

// ---------------------------------------------------------------------------------
// Misuse and failures, through groups made here

struct Group {
    sx_shard_group_t *g = nullptr;
    ~Group() { sx_destroy_shard_group(g); }
};

// Rank r of `world` over `rv`: AdamW over 3 units of two params each (unit i: params 2i
// and 2i+1), finalized, params set to a value of the param and element.
std::string make_group(const std::string &rv, int r, int world, int stage, int timeout_ms, Group *out) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = r;
    cfg.world_size = world;
    cfg.stage = stage;
    cfg.num_threads = 1;
    cfg.timeout_ms = timeout_ms;
    if (sx_create_shard_group(&cfg, &out->g) != SX_OK) return std::string("create: ") + sx_last_error_message();
    sx_param_group_desc_t a;
    sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_ADAMW);
    if (sx_add_param_group(out->g, &a, nullptr) != SX_OK) return "add_param_group";
    for (int p = 0; p < 6; ++p) {
        const int64_t shape[1] = {100 + 37 * p};
        const std::string name = "p" + std::to_string(p);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = name.c_str();
        d.ndim = 1;
        d.shape = shape;
        d.unit = p / 2;
        if (sx_add_param(out->g, &d, nullptr) != SX_OK) return std::string("add_param: ") + sx_last_error_message();
    }
    if (sx_finalize(out->g) != SX_OK) return std::string("finalize: ") + sx_last_error_message();
    for (int32_t u = 0; u < 3; ++u) {
        if (stage == 3 && sx_unit_gather(out->g, u) != SX_OK) return std::string("gather: ") + sx_last_error_message();
        for (int32_t p = 2 * u; p < 2 * u + 2; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            if (sx_param_view(out->g, p, &v) != SX_OK) return "param_view";
            for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = 0.001f * static_cast<float>(p * 7 + i % 13);
        }
        if (stage == 3 && sx_unit_release(out->g, u) != SX_OK) return "release";
    }
    return "";
}

void add_grads(sx_shard_group_t *g, int32_t unit, float value) {
    for (int32_t p = 2 * unit; p < 2 * unit + 2; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        assert_int_equal(sx_grad_view(g, p, &v), SX_OK);
        for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] += value;
    }
}

// Every param's values, read through gathers at stage 3.
std::vector<float> all_values(sx_shard_group_t *g, int stage) {
    std::vector<float> out;
    for (int32_t u = 0; u < 3; ++u) {
        if (stage == 3) assert_int_equal(sx_unit_gather(g, u), SX_OK);
        for (int32_t p = 2 * u; p < 2 * u + 2; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            assert_int_equal(sx_param_view(g, p, &v), SX_OK);
            const float *d = static_cast<const float *>(v.data);
            out.insert(out.end(), d, d + v.numel);
        }
        if (stage == 3) assert_int_equal(sx_unit_release(g, u), SX_OK);
    }
    return out;
}

void test_signal_twice_and_bad_arguments(void **) {
    for (int stage = 1; stage <= 3; ++stage) {
        Group grp;
        std::string err = make_group("local://misuse-" + std::to_string(stage) + "-" + std::to_string(getpid()), 0, 1,
                                     stage, 10000, &grp);
        if (!err.empty()) fail_msg("%s", err.c_str());
        sx_shard_group_t *g = grp.g;
        const std::vector<float> before = all_values(g, stage);
        add_grads(g, 2, 0.5f);
        assert_int_equal(sx_unit_grads_ready(g, 2, nullptr), SX_OK);
        assert_int_equal(sx_unit_grads_ready(g, 2, nullptr), SX_ERR_INVALID_STATE);
        assert_non_null(std::strstr(sx_last_error_message(), "already signalled"));
        assert_int_equal(sx_unit_grads_ready(g, 3, nullptr), SX_ERR_INVALID_ARGUMENT);
        assert_int_equal(sx_unit_grads_ready(g, -1, nullptr), SX_ERR_INVALID_ARGUMENT);
        assert_int_equal(sx_unit_grads_ready(nullptr, 0, nullptr), SX_ERR_INVALID_HANDLE);
        sx_unit_ready_options_t ro;
        sx_unit_ready_options_init(&ro, sizeof ro);
        ro.accumulate = 1;  // unlike the micro-batch's first signal
        assert_int_equal(sx_unit_grads_ready(g, 1, &ro), SX_ERR_INVALID_ARGUMENT);
        assert_non_null(std::strstr(sx_last_error_message(), "accumulate"));
        ro.accumulate = 0;
        ro.struct_size = 3;
        assert_int_equal(sx_unit_grads_ready(g, 1, &ro), SX_ERR_INVALID_ARGUMENT);
        // The misuse changed nothing: the step reduces and updates as usual.
        assert_int_equal(sx_step(g, nullptr, nullptr), SX_OK);
        assert_true(all_values(g, stage) != before);
        assert_int_equal(sx_unit_gather(g, 3), SX_ERR_INVALID_ARGUMENT);
        assert_int_equal(sx_unit_release(g, -1), SX_ERR_INVALID_ARGUMENT);
        if (stage == 3) {
            assert_int_equal(sx_unit_release(g, 0), SX_ERR_INVALID_STATE);
        } else {
            assert_int_equal(sx_unit_gather(g, 0), SX_OK);
            assert_int_equal(sx_unit_release(g, 0), SX_OK);
        }
    }
}

void test_views_exist_only_while_gathered(void **) {
    Group grp;
    std::string err = make_group("local://views-" + std::to_string(getpid()), 0, 1, 3, 10000, &grp);
    if (!err.empty()) fail_msg("%s", err.c_str());
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    assert_int_equal(sx_param_view(grp.g, 2, &v), SX_ERR_INVALID_STATE);
    assert_non_null(std::strstr(sx_last_error_message(), "not gathered"));
    assert_int_equal(sx_unit_gather(grp.g, 1), SX_OK);
    assert_int_equal(sx_unit_gather(grp.g, 1), SX_OK);  // nested
    assert_int_equal(sx_param_view(grp.g, 2, &v), SX_OK);
    assert_int_equal(sx_param_view(grp.g, 0, &v), SX_ERR_INVALID_STATE);  // unit 0 is not gathered
    assert_int_equal(sx_unit_release(grp.g, 1), SX_OK);
    assert_int_equal(sx_param_view(grp.g, 3, &v), SX_OK);  // one gather still holds it
    const sx_view_t kept = v;
    assert_int_equal(sx_unit_release(grp.g, 1), SX_OK);
    assert_int_equal(sx_param_view(grp.g, 3, &v), SX_ERR_INVALID_STATE);
    assert_int_equal(sx_unit_release(grp.g, 1), SX_ERR_INVALID_STATE);
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
    // Debug builds mark the memory of a released unit (on the gather channel, after its
    // copy back into the shard): a view kept past the release is poisoned under
    // AddressSanitizer, and reads NaN (all bits set) otherwise.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    const float *stale = static_cast<const float *>(kept.data);
    auto marked = [&] {
#if defined(__SANITIZE_ADDRESS__)
        return __asan_address_is_poisoned(stale) && __asan_address_is_poisoned(stale + kept.numel - 1);
#else
        const volatile uint32_t *w = reinterpret_cast<const volatile uint32_t *>(stale);
        for (uint64_t i = 0; i < kept.numel; ++i)
            if (w[i] != 0xffffffffu) return false;
        return true;
#endif
    };
    while (!marked() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    assert_true(marked());
#else
    (void)kept;  // release builds leave released memory as it is
#endif
    // Grad views are whole at every stage.
    assert_int_equal(sx_grad_view(grp.g, 3, &v), SX_OK);
}

// The reductions run while the trainer is outside sx: once every rank has signalled
// every unit, they all complete before any rank calls sx_step (at stage 1 for the last
// micro-batch only: intermediate ones stay in place until the step).
void test_reductions_run_before_the_step(void **) {
    for (int stage = 1; stage <= 3; ++stage) {
        const std::string rv = "local://early-" + std::to_string(stage) + "-" + std::to_string(getpid());
        std::string err = sxtest::run_ranks(3, [&](int r) -> std::string {
            Group grp;
            std::string e = make_group(rv, r, 3, stage, 20000, &grp);
            if (!e.empty()) return e;
            const sx::core::ShardGroup &impl = *grp.g->impl;
            const uint64_t before = impl.reductions_run();
            for (int32_t u = 0; u < 3; ++u) {
                add_grads(grp.g, u, 0.5f);
                if (sx_unit_grads_ready(grp.g, u, nullptr) != SX_OK) return "signal";
            }
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
            while (impl.reductions_run() < before + 3 && std::chrono::steady_clock::now() < deadline)
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
            if (impl.reductions_run() != before + 3)
                return std::to_string(impl.reductions_run() - before) + " of 3 reductions ran before sx_step";
            return sx_step(grp.g, nullptr, nullptr) == SX_OK ? "" : "step";
        });
        if (!err.empty()) fail_msg("stage %d: %s", stage, err.c_str());
    }
}

// Stage 3 prefetches along the last step's order of gathers: after sx_unit_gather(u),
// the next prefetch_depth units of that order are gathered too (param_bytes shows them),
// and none with SX_PREFETCH_NONE.
void test_prefetch_follows_the_last_order(void **) {
    for (int depth : {SX_PREFETCH_NONE, 1, 2}) {
        const std::string rv = "local://prefetch-" + std::to_string(depth + 1) + "-" + std::to_string(getpid());
        std::string err = sxtest::run_ranks(2, [&](int r) -> std::string {
            sx_group_config_t cfg;
            sx_group_config_init(&cfg, sizeof cfg);
            cfg.backend = SX_BACKEND_CPU;
            cfg.rendezvous = rv.c_str();
            cfg.rank = r;
            cfg.world_size = 2;
            cfg.stage = 3;
            cfg.num_threads = 1;
            cfg.prefetch_depth = depth;
            Group grp;
            if (sx_create_shard_group(&cfg, &grp.g) != SX_OK) return "create";
            sx_param_group_desc_t a;
            sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_SGD);
            sx_add_param_group(grp.g, &a, nullptr);
            const int64_t shape[1] = {1024};
            for (int32_t u = 0; u < 4; ++u) {
                const std::string name = "w" + std::to_string(u);
                sx_param_desc_t d;
                sx_param_desc_init(&d, sizeof d);
                d.name = name.c_str();
                d.ndim = 1;
                d.shape = shape;
                d.unit = u;
                if (sx_add_param(grp.g, &d, nullptr) != SX_OK) return "add_param";
            }
            if (sx_finalize(grp.g) != SX_OK) return "finalize";
            auto bytes = [&] {
                sx_memory_stats_t ms;
                sx_memory_stats_init(&ms, sizeof ms);
                sx_get_memory_stats(grp.g, &ms);
                return ms.param_bytes;
            };
            const uint64_t shards = bytes(), unit = 2 * shards / 4;  // 4 units, each 2 shards
            // A step whose forward goes 3, 1, 0, 2: the order the next step prefetches.
            const int32_t order[4] = {3, 1, 0, 2};
            for (int32_t u : order) {
                if (sx_unit_gather(grp.g, u) != SX_OK || sx_unit_release(grp.g, u) != SX_OK) return "forward";
            }
            if (sx_step(grp.g, nullptr, nullptr) != SX_OK) return std::string("step: ") + sx_last_error_message();
            // The step prefetched the first `depth` units of the next forward, and kept
            // nothing else.
            const uint64_t ahead = depth < 0 ? 0 : static_cast<uint64_t>(depth);
            if (bytes() != shards + ahead * unit)
                return "after the step: " + std::to_string(bytes()) + " param bytes, expected " +
                       std::to_string(shards + ahead * unit);
            if (sx_unit_gather(grp.g, 3) != SX_OK) return "gather";
            if (bytes() != shards + (1 + ahead) * unit)
                return "holding unit 3: " + std::to_string(bytes()) + " param bytes, expected " +
                       std::to_string(shards + (1 + ahead) * unit);
            // Unit 1 is next in the order: prefetched (depth > 0), released from the
            // prefetch once gathered and released.
            if (sx_unit_release(grp.g, 3) != SX_OK || sx_unit_gather(grp.g, 1) != SX_OK) return "gather 1";
            if (bytes() > shards + (1 + ahead) * unit) return "more than the bound after unit 1";
            return sx_unit_release(grp.g, 1) == SX_OK ? "" : "release 1";
        });
        if (!err.empty()) fail_msg("prefetch depth %d: %s", depth, err.c_str());
    }
}

// Stages 1 and 2: a deferred step gathers the units in the reverse of the agreed order of
// reductions, which rank 0's signals at the step set: a backward that went 1, 0, 2
// (rank 1 signalling in another order) has its next forward's units gathered 2, 0, 1;
// without signals, in increasing unit index.
void test_deferred_gathers_follow_the_forward(void **) {
    for (int stage = 1; stage <= 2; ++stage) {
        const std::string rv = "local://deferred-order-" + std::to_string(stage) + "-" + std::to_string(getpid());
        std::string err = sxtest::run_ranks(2, [&](int r) -> std::string {
            Group grp;
            std::string e = make_group(rv, r, 2, stage, 20000, &grp);
            if (!e.empty()) return e;
            const sx::core::ShardGroup &impl = *grp.g->impl;
            sx_step_options_t o;
            sx_step_options_init(&o, sizeof o);
            o.defer_gather = 1;
            if (sx_step(grp.g, &o, nullptr) != SX_OK) return std::string("step: ") + sx_last_error_message();
            if (impl.deferred_gather_order() != std::vector<int32_t>({0, 1, 2}))
                return "without signals the deferred gathers did not go in increasing unit index";
            for (int32_t u = 0; u < 3; ++u)
                if (sx_unit_gather(grp.g, u) != SX_OK) return "wait";
            const int32_t order[2][3] = {{1, 0, 2}, {2, 1, 0}};
            for (int32_t u : order[r]) {
                add_grads(grp.g, u, 0.25f);
                if (sx_unit_grads_ready(grp.g, u, nullptr) != SX_OK) return "signal";
            }
            if (sx_step(grp.g, &o, nullptr) != SX_OK) return std::string("step: ") + sx_last_error_message();
            if (impl.deferred_gather_order() != std::vector<int32_t>({2, 0, 1}))
                return "the deferred gathers did not follow the reverse of rank 0's backward";
            for (int32_t u = 0; u < 3; ++u)
                if (sx_unit_gather(grp.g, u) != SX_OK) return "wait";
            return "";
        });
        if (!err.empty()) fail_msg("stage %d: %s", stage, err.c_str());
    }
}

// After a refused step: a step where every rank signals every unit works, counts as the
// first, and updates the params (*after) from `before`.
std::string goes_on(sx_shard_group_t *g, int stage, const std::vector<float> &before, std::vector<float> *after) {
    for (int32_t u = 2; u >= 0; --u) {
        add_grads(g, u, 0.125f);
        if (sx_unit_grads_ready(g, u, nullptr) != SX_OK) return std::string("signal after: ") + sx_last_error_message();
    }
    sx_step_result_t res;
    sx_step_result_init(&res, sizeof res);
    if (sx_step(g, nullptr, &res) != SX_OK) return std::string("step after: ") + sx_last_error_message();
    if (res.step != 1) return "the failed step was counted";
    *after = all_values(g, stage);
    if (*after == before) return "the step after did not update";
    return "";
}

// Two ranks at stages 2 and 3 whose step `differ` makes them take differently: every
// rank's sx_step fails with SX_ERR_MISMATCH well within the timeout, saying `words`;
// nothing changes; and after `mend` the group goes on.
void refused_then_goes_on(const char *name, const std::function<sx_status_t(sx_shard_group_t *, int)> &differ,
                          const char *words, const std::function<std::string(sx_shard_group_t *, int)> &mend) {
    for (int stage = 2; stage <= 3; ++stage) {
        const std::string rv = std::string("local://") + name + "-" + std::to_string(stage) + "-" + std::to_string(getpid());
        std::vector<std::vector<float>> after(2);
        std::string err = sxtest::run_ranks(2, [&](int r) -> std::string {
            Group grp;
            std::string e = make_group(rv, r, 2, stage, 20000, &grp);
            if (!e.empty()) return e;
            sx_shard_group_t *g = grp.g;
            const std::vector<float> before = all_values(g, stage);
            const auto t0 = std::chrono::steady_clock::now();
            const sx_status_t st = differ(g, r);
            const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (st != SX_ERR_MISMATCH) return std::string("sx_step returned ") + sx_status_string(st);
            if (!std::strstr(sx_last_error_message(), "sx_step") || !std::strstr(sx_last_error_message(), words))
                return std::string("message: ") + sx_last_error_message();
            if (secs > 10.0) return "the mismatch took " + std::to_string(secs) + " s";
            if (all_values(g, stage) != before) return "a failed step changed the params";
            e = mend(g, r);
            if (!e.empty()) return e;
            // The group goes on: a step where both signal every unit.
            return goes_on(g, stage, before, &after[static_cast<size_t>(r)]);
        });
        if (!err.empty()) fail_msg("%s, stage %d: %s", name, stage, err.c_str());
        assert_true(after[0] == after[1]);
    }
}

// Ranks that signal different units.
void test_ranks_signalling_different_units(void **) {
    refused_then_goes_on(
        "differ",
        [](sx_shard_group_t *g, int r) {
            for (int32_t u = 0; u < 3; ++u) add_grads(g, u, 0.25f * static_cast<float>(r + 1));
            const sx_status_t s = sx_unit_grads_ready(g, r, nullptr);
            return s != SX_OK ? s : sx_step(g, nullptr, nullptr);
        },
        "the units signalled ready: {0} on rank 0, {1} on rank 1",
        [](sx_shard_group_t *, int) { return std::string(); });
}

// Ranks whose rounds open on different trainable params (rank 1 froze one, and unfreezes
// it after): the round's opening agreement, which over shared memory rides on its first
// reduce-scatter, names the param.
void test_ranks_opening_rounds_differently(void **) {
    refused_then_goes_on(
        "opening",
        [](sx_shard_group_t *g, int r) {
            sx_status_t s = r == 1 ? sx_set_trainable(g, 0, 0) : SX_OK;
            for (int32_t u = 2; u >= 0 && s == SX_OK; --u) {
                add_grads(g, u, 0.25f * static_cast<float>(r + 1));
                s = sx_unit_grads_ready(g, u, nullptr);
            }
            return s != SX_OK ? s : sx_step(g, nullptr, nullptr);
        },
        "trainable: yes on rank 0, no on rank 1",
        [](sx_shard_group_t *g, int r) {
            return r == 1 && sx_set_trainable(g, 0, 1) != SX_OK ? std::string("unfreeze") : std::string();
        });
}

// sx_abort while a reduction waits for a peer that never comes: it returns, and so do
// sx_step and sx_destroy_shard_group, long before the timeout.
void test_abort_during_inflight_reductions(void **) {
    const std::string rv = "local://abort-" + std::to_string(getpid());
    std::atomic<bool> done{false};
    std::string err = sxtest::run_ranks(2, [&](int r) -> std::string {
        Group grp;
        std::string e = make_group(rv, r, 2, 2, 60000, &grp);
        if (!e.empty()) return e;
        if (r == 1) {  // never steps, and stays connected until rank 0 is done
            while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
            return "";
        }
        struct Done {
            std::atomic<bool> &d;
            ~Done() { d = true; }
        } mark{done};
        const auto t0 = std::chrono::steady_clock::now();
        for (int32_t u = 2; u >= 0; --u) {
            add_grads(grp.g, u, 1.0f);
            if (sx_unit_grads_ready(grp.g, u, nullptr) != SX_OK) return "signal";
        }
        std::thread aborter([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            sx_abort(grp.g);
        });
        const sx_status_t st = sx_step(grp.g, nullptr, nullptr);
        aborter.join();
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (st == SX_OK) return "sx_step succeeded without its peer";
        if (secs > 20.0) return "sx_step returned after " + std::to_string(secs) + " s";
        if (sx_step(grp.g, nullptr, nullptr) != SX_ERR_GROUP_FAILED) return "the aborted group still steps";
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// A rank that dies (SIGKILL) mid-backward, its reductions in flight, or mid-forward at
// stage 3: the other fails with a clear error within the timeout.
void test_dead_rank_over_tcp(void **) {
    for (const char *when : {"backward", "forward"}) {
        std::vector<sxtest::ProcessResult> res;
        std::string err = sxtest::run_process_ranks(2, {"--when", when}, 60, &res);
        assert_int_equal(res.size(), 2);
        if (res[0].exit_code != 0) fail_msg("%s: the survivor: %s", when, err.c_str());
        assert_int_equal(res[1].signal, SIGKILL);
    }
}

int child_main(int argc, char **argv) {
    sxtest::ChildArgs args;
    if (!sxtest::parse_child_args(argc, argv, &args)) return 2;
    const std::string when = args.get("--when", "backward");
    const int stage = when == "forward" ? 3 : 2;
    Group grp;
    std::string err = make_group(args.rendezvous, args.rank, args.world, stage, 4000, &grp);
    if (!err.empty()) {
        std::fprintf(stderr, "rank %d: %s\n", args.rank, err.c_str());
        return 1;
    }
    sx_shard_group_t *g = grp.g;
    // One whole step first, so that the peer dies in the second.
    for (int s = 0; s < 2; ++s) {
        const auto t0 = std::chrono::steady_clock::now();
        sx_status_t st = SX_OK;
        for (int32_t u = 0; u < 3 && st == SX_OK; ++u) {
            if (stage == 3) st = sx_unit_gather(g, u);
            if (s == 1 && args.rank == 1 && u == 1 && when == "forward") raise(SIGKILL);
            if (st == SX_OK && stage == 3) st = sx_unit_release(g, u);
        }
        for (int32_t u = 2; u >= 0 && st == SX_OK; --u) {
            if (stage == 3) st = sx_unit_gather(g, u);
            add_grads(g, u, 0.5f);
            if (st == SX_OK) st = sx_unit_grads_ready(g, u, nullptr);
            if (s == 1 && args.rank == 1 && u == 1 && when == "backward") raise(SIGKILL);
            if (st == SX_OK && stage == 3) st = sx_unit_release(g, u);
        }
        if (st == SX_OK) st = sx_step(g, nullptr, nullptr);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s == 0 && st != SX_OK) {
            std::fprintf(stderr, "rank %d: the first step failed: %s\n", args.rank, sx_last_error_message());
            return 1;
        }
        if (s == 1) {
            if (st != SX_ERR_COMM && st != SX_ERR_TIMEOUT && st != SX_ERR_GROUP_FAILED) {
                std::fprintf(stderr, "rank 0: the step with a dead peer returned %s\n", sx_status_string(st));
                return 1;
            }
            if (secs > 30.0) {
                std::fprintf(stderr, "rank 0: the failure took %.1f s\n", secs);
                return 1;
            }
        }
    }
    return 0;
}

// Stage 3 holds param bytes of its shards plus at most (units the trainer holds gathered
// + prefetch depth) gathered units, through 20 steps.
void test_stage3_memory_bound(void **) {
    for (int depth : {SX_PREFETCH_NONE, 1, 2}) {
        Scenario sc = eight_units();
        sc.world = 4;
        sc.stage = 3;
        sc.steps = 20;
        sc.micro_batches = 2;
        sc.overlap = true;
        sc.prefetch_depth = depth;
        sc.after_step = [depth](sx_shard_group_t *g, int, int) -> std::string {
            int32_t units = 0;
            sx_get_num_units(g, &units);
            // Between steps: the shards, and the next forward's first `depth` units (the
            // forward goes 0, 1, ...), prefetched by the step.
            uint64_t shards = 0, largest = 0, ahead = 0;
            for (int32_t u = 0; u < units; ++u) {
                sx_unit_info_t info;
                sx_unit_info_init(&info, sizeof info);
                sx_get_unit_info(g, u, &info);
                shards += info.shard_numel * sizeof(float);
                largest = std::max<uint64_t>(largest, info.padded_numel * sizeof(float));
                if (u < depth) ahead += info.padded_numel * sizeof(float);
            }
            sx_memory_stats_t ms;
            sx_memory_stats_init(&ms, sizeof ms);
            if (sx_get_memory_stats(g, &ms) != SX_OK) return "memory stats";
            const uint64_t in_flight = 1 + static_cast<uint64_t>(depth < 0 ? 0 : depth);
            if (ms.param_bytes != shards + ahead)
                return "between steps the rank holds " + std::to_string(ms.param_bytes) + " param bytes, its shards " +
                       std::to_string(shards) + " and the units prefetched " + std::to_string(ahead);
            if (ms.peak_param_bytes > shards + in_flight * largest)
                return "peak " + std::to_string(ms.peak_param_bytes) + " > bound " + std::to_string(shards + in_flight * largest);
            if (ms.peak_param_bytes <= shards) return "the peak never counted a gathered unit";
            return "";
        };
        Params want;
        expect_run(sc, "memory-" + std::to_string(depth), &want);
    }
}

// Stage 3's sx_broadcast_params sends the units root holds gathered: every rank gathers
// (collectively), writes values of its own, and root 1's reach every rank's shard.
void test_stage3_broadcast(void **) {
    const std::string rv = "local://bcast-" + std::to_string(getpid());
    std::vector<std::vector<float>> seen(3);
    std::string err = sxtest::run_ranks(3, [&](int r) -> std::string {
        Group grp;
        std::string e = make_group(rv, r, 3, 3, 20000, &grp);
        if (!e.empty()) return e;
        for (int32_t u = 0; u < 3; ++u) {
            if (sx_unit_gather(grp.g, u) != SX_OK) return std::string("gather: ") + sx_last_error_message();
            for (int32_t p = 2 * u; p < 2 * u + 2; ++p) {
                sx_view_t v;
                sx_view_init(&v, sizeof v);
                if (sx_param_view(grp.g, p, &v) != SX_OK) return "view";
                for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = static_cast<float>(10 * r + i % 5);
            }
        }
        if (sx_broadcast_params(grp.g, 1) != SX_OK) return std::string("broadcast: ") + sx_last_error_message();
        for (int32_t u = 0; u < 3; ++u)
            if (sx_unit_release(grp.g, u) != SX_OK) return "release";
        seen[static_cast<size_t>(r)] = all_values(grp.g, 3);
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
    assert_true(seen[0] == seen[1]);
    assert_true(seen[2] == seen[1]);
    assert_true(seen[0][0] == 10.0f && seen[0][3] == 13.0f);
}

// A checkpoint saved at stage 3 by 3 ranks loads at stage 1 on 2 ranks, whose save loads
// at stage 3 on 4; the three legs follow the run that never stopped.
void test_checkpoints_between_stages(void **) {
    const std::string dir = sxtest::make_tmpdir("pipeline-ckpt");
    Scenario sc = sxtest::two_group_scenario(SX_OPTIM_ADAMW);
    sc.same_grads_on_every_rank = true;
    sc.steps = 12;
    Params want;
    {
        Scenario whole = sc;
        whole.world = 1;
        expect_run(whole, "ckpt-whole", &want);
    }
    const std::string err = sxtest::run_legs(sc, {{3, 0, 3, 1, 4}, {2, 0, 1, 5, 8}, {4, 0, 3, 9, 12}}, dir,
                                             "ckpt-legs-" + std::to_string(getpid()), want, 1e-6);
    if (!err.empty()) fail_msg("%s", err.c_str());
    sxtest::remove_tree(dir);
}

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overlap_is_bit_identical_at_every_stage),
        cmocka_unit_test(test_sgd_single_micro_batch_and_no_clipping),
        cmocka_unit_test(test_freezing_with_overlap),
        cmocka_unit_test(test_signal_orders),
        cmocka_unit_test(test_signal_twice_and_bad_arguments),
        cmocka_unit_test(test_views_exist_only_while_gathered),
        cmocka_unit_test(test_reductions_run_before_the_step),
        cmocka_unit_test(test_prefetch_follows_the_last_order),
        cmocka_unit_test(test_deferred_gathers_follow_the_forward),
        cmocka_unit_test(test_ranks_signalling_different_units),
        cmocka_unit_test(test_ranks_opening_rounds_differently),
        cmocka_unit_test(test_abort_during_inflight_reductions),
        cmocka_unit_test(test_dead_rank_over_tcp),
        cmocka_unit_test(test_stage3_memory_bound),
        cmocka_unit_test(test_stage3_broadcast),
        cmocka_unit_test(test_checkpoints_between_stages),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
