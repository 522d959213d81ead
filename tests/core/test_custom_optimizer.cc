// Custom optimizers through the public API: AdamW written in C (custom_adamw.c) matches
// sx's own AdamW bit for bit at worlds 1-3 and stages 1-3 (param groups, a schedule,
// clipping, freezing, a unit shared with a built-in optimizer's params), through a
// checkpoint loaded into another world size and stage and through a whole-state gather;
// a failing update changes nothing on any rank; bad registrations change nothing; over
// 16-bit params' masters the pass rounds as sx's kernel does.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "sx_cmocka.h"
#include "test_files.h"
#include "custom_adamw.h"
#include "run_ranks.h"
#include "base/half.h"
#include "optim/custom.h"
#include "optim/thread_pool.h"
#include "sx/sx.h"

namespace {

const int64_t kSizes[] = {37, 101, 16, 5};  // awkward sizes, split across ranks
constexpr int kParams = 4;

int32_t custom_id() {
    int32_t id = 0;
    assert_int_equal(custom_adamw_register(&id), SX_OK);
    return id;
}

std::string tag(const char *what) {
    static std::atomic<int> n{0};
    return std::string("local://custom-") + what + "-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

#define REQUIRE(call)                                                                                   \
    do {                                                                                                \
        const sx_status_t s_ = (call);                                                                  \
        if (s_ != SX_OK) return std::string(#call) + ": " + sx_status_string(s_) + ": " + sx_last_error_message(); \
    } while (0)

// A group of `world` ranks at `stage`: param group 0 uses `optimizer` (AdamW's
// hyperparameters), param group 1 SGD with momentum; params 0-2 in unit 0 (param 1 in
// group 1: a unit shared by both), param 3 in unit 1.
std::string make_group(const std::string &rv, int rank, int world, int stage, int32_t optimizer,
                       sx_shard_group_t **out) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.stage = stage;
    cfg.num_threads = 2;
    REQUIRE(sx_create_shard_group(&cfg, out));
    sx_shard_group_t *g = *out;
    sx_param_group_desc_t d;
    REQUIRE(sx_param_group_desc_init(&d, sizeof d, optimizer));
    d.lr = 0.01;
    d.beta2 = 0.99;
    d.weight_decay = 0.1;
    REQUIRE(sx_add_param_group(g, &d, nullptr));
    REQUIRE(sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_SGD));
    d.lr = 0.05;
    d.momentum = 0.9;
    REQUIRE(sx_add_param_group(g, &d, nullptr));
    for (int p = 0; p < kParams; ++p) {
        sx_param_desc_t pd;
        sx_param_desc_init(&pd, sizeof pd);
        const std::string name = "p" + std::to_string(p);
        pd.name = name.c_str();
        pd.ndim = 1;
        pd.shape = &kSizes[p];
        pd.param_group = p == 1 ? 1 : 0;
        pd.unit = p == 3 ? 1 : 0;
        REQUIRE(sx_add_param(g, &pd, nullptr));
    }
    REQUIRE(sx_finalize(g));
    // Stage 3: values exist while their unit is gathered (then nothing at stages 1, 2).
    REQUIRE(sx_unit_gather(g, 0));
    REQUIRE(sx_unit_gather(g, 1));
    for (int p = 0; p < kParams; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        REQUIRE(sx_param_view(g, p, &v));
        for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = std::sin(0.37f * (i + 1) + p);
    }
    REQUIRE(sx_unit_release(g, 0));
    REQUIRE(sx_unit_release(g, 1));
    return "";
}

// Step `step` of the schedule: gradients that differ per rank, lr decayed, clipping on
// even steps, param 2 frozen at steps 3 and 4.
std::string train_step(sx_shard_group_t *g, int rank, int step, sx_status_t *status = nullptr) {
    REQUIRE(sx_set_trainable(g, 2, step == 3 || step == 4 ? 0 : 1));
    for (int p = 0; p < kParams; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        REQUIRE(sx_grad_view(g, p, &v));
        for (uint64_t i = 0; i < v.numel; ++i)
            static_cast<float *>(v.data)[i] = std::cos(0.11f * (i + 3) * (rank + 1) + 0.7f * step + p);
    }
    REQUIRE(sx_set_lr(g, 0, 0.01 / (1 + step)));
    sx_step_options_t o;
    sx_step_options_init(&o, sizeof o);
    if (step % 2 == 0) o.max_grad_norm = 1.0;
    const sx_status_t s = sx_step(g, &o, nullptr);
    if (status) {
        *status = s;
        return "";
    }
    if (s != SX_OK) return std::string("sx_step: ") + sx_last_error_message();
    return "";
}

// Every param's full values and this rank's exp_avg and exp_avg_sq of group-0 params.
std::string snapshot(sx_shard_group_t *g, std::vector<float> *out) {
    out->clear();
    REQUIRE(sx_unit_gather(g, 0));
    REQUIRE(sx_unit_gather(g, 1));
    for (int p = 0; p < kParams; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        REQUIRE(sx_param_view(g, p, &v));
        out->insert(out->end(), static_cast<float *>(v.data), static_cast<float *>(v.data) + v.numel);
        for (const char *slot : {"exp_avg", "exp_avg_sq"}) {
            if (p == 1) break;
            REQUIRE(sx_state_view(g, p, slot, &v));
            if (v.numel) out->insert(out->end(), static_cast<float *>(v.data), static_cast<float *>(v.data) + v.numel);
        }
    }
    REQUIRE(sx_unit_release(g, 0));
    REQUIRE(sx_unit_release(g, 1));
    return "";
}

// Two rank threads meet: each arrives, and waits until `count` arrivals happened.
void meet(std::atomic<int> *arrived, int count) {
    ++*arrived;
    while (arrived->load() < count) usleep(1000);
}

// A synchronous save into `dir`, and a load from it: "" or what failed.
std::string save(sx_shard_group_t *g, const std::string &dir) {
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    so.path = dir.c_str();
    so.synchronous = 1;
    sx_future_t *f = nullptr;
    std::string e;
    if (sx_save_optim_state(g, &so, &f) != SX_OK || sx_future_wait(f, -1) != SX_OK)
        e = std::string("save: ") + sx_last_error_message();
    sx_future_destroy(f);
    return e;
}

std::string load(sx_shard_group_t *g, const std::string &dir) {
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = dir.c_str();
    if (sx_load_optim_state(g, &lo) != SX_OK) return std::string("load: ") + sx_last_error_message();
    return "";
}

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void test_custom_adamw_matches_builtin(void **) {
    int32_t in_place = 0;
    assert_int_equal(custom_adamw_register_in_place(&in_place), SX_OK);
    for (const int32_t id : {custom_id(), in_place})
    for (int world = 1; world <= 3; ++world)
        for (int stage = 1; stage <= 3; ++stage) {
            const std::string rv_c = tag("c"), rv_b = tag("b");
            const std::string root = sxtest::make_tmpdir("custom-ckpt");
            const std::string dir = root + "/ck";
            const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
                sx_shard_group_t *c = nullptr, *b = nullptr;
                std::string e = make_group(rv_c, rank, world, stage, id, &c);
                if (e.empty()) e = make_group(rv_b, rank, world, stage, SX_OPTIM_ADAMW, &b);
                for (int step = 1; step <= 6 && e.empty(); ++step) {
                    e = train_step(c, rank, step);
                    if (e.empty()) e = train_step(b, rank, step);
                    std::vector<float> sc, sb;
                    if (e.empty()) e = snapshot(c, &sc);
                    if (e.empty()) e = snapshot(b, &sb);
                    if (e.empty() && !same_bits(sc, sb))
                        e = "custom AdamW differs from sx's AdamW after step " + std::to_string(step);
                }
                // The custom group's checkpoint: saved here, loaded below at another world size.
                if (e.empty()) e = save(c, dir);
                // sx's AdamW cannot load it: the message names both optimizers.
                if (e.empty()) {
                    sx_load_options_t lo;
                    sx_load_optim_state_options_init(&lo, sizeof lo);
                    lo.path = dir.c_str();
                    if (sx_load_optim_state(b, &lo) != SX_ERR_MISMATCH ||
                        !std::strstr(sx_last_error_message(), "AdamW here but the custom optimizer 'CAdamW"))
                        e = std::string("loading a CAdamW checkpoint into AdamW: ") + sx_last_error_message();
                }
                sx_destroy_shard_group(c);
                sx_destroy_shard_group(b);
                return e;
            });
            if (!err.empty()) fail_msg("optimizer %d world %d stage %d: %s", id, world, stage, err.c_str());

            // Loaded at another world size and stage: resharded, with the hyperparameters
            // restored, it trains on (test_custom_checkpoint_resumes_exactly checks the values).
            const int world2 = world % 3 + 1, stage2 = stage % 3 + 1;
            const std::string rv_c2 = tag("c2");
            const std::string err2 = sxtest::run_ranks(world2, [&](int rank) -> std::string {
                sx_shard_group_t *c = nullptr;
                std::string e = make_group(rv_c2, rank, world2, stage2, id, &c);
                if (e.empty()) e = load(c, dir);
                double lr = 0;
                if (e.empty() && (sx_get_hyperparameter(c, 0, SX_HP_LR, &lr) != SX_OK || lr != 0.01 / 7))
                    e = "the loaded lr is " + std::to_string(lr);
                for (int step = 7; step <= 8 && e.empty(); ++step) e = train_step(c, rank, step);
                sx_destroy_shard_group(c);
                return e;
            });
            sxtest::remove_tree(root);
            if (!err2.empty()) fail_msg("world %d stage %d -> world %d stage %d: %s", world, stage, world2, stage2,
                                        err2.c_str());
        }
}

// Resuming through a checkpoint equals training on: custom AdamW saved at world 2 stage
// 2 and loaded at stage 1, after 2 more steps, equals sx's AdamW trained 8 steps at
// stage 3 (the gradients differ per rank, so the world size stays).
void test_custom_checkpoint_resumes_exactly(void **) {
    const int32_t id = custom_id();
    const std::string root = sxtest::make_tmpdir("custom-resume");
    const std::string dir = root + "/ck";
    const std::string rv1 = tag("r1");
    std::string err = sxtest::run_ranks(2, [&](int rank) -> std::string {
        sx_shard_group_t *c = nullptr;
        std::string e = make_group(rv1, rank, 2, 2, id, &c);
        for (int step = 1; step <= 6 && e.empty(); ++step) e = train_step(c, rank, step);
        if (e.empty()) e = save(c, dir);
        sx_destroy_shard_group(c);
        return e;
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
    const std::string rv2 = tag("r2"), rv3 = tag("r3");
    std::vector<float> resumed, straight;
    err = sxtest::run_ranks(2, [&](int rank) -> std::string {
        sx_shard_group_t *c = nullptr;
        std::string e = make_group(rv2, rank, 2, 1, id, &c);
        if (e.empty()) e = load(c, dir);
        for (int step = 7; step <= 8 && e.empty(); ++step) e = train_step(c, rank, step);
        std::vector<float> s;
        if (e.empty()) e = snapshot(c, &s);
        if (rank == 0) resumed = s;
        sx_destroy_shard_group(c);
        return e;
    });
    if (!err.empty()) fail_msg("resumed: %s", err.c_str());
    err = sxtest::run_ranks(2, [&](int rank) -> std::string {
        sx_shard_group_t *b = nullptr;
        std::string e = make_group(rv3, rank, 2, 3, SX_OPTIM_ADAMW, &b);
        for (int step = 1; step <= 8 && e.empty(); ++step) e = train_step(b, rank, step);
        std::vector<float> s;
        if (e.empty()) e = snapshot(b, &s);
        if (rank == 0) straight = s;
        sx_destroy_shard_group(b);
        return e;
    });
    sxtest::remove_tree(root);
    if (!err.empty()) fail_msg("straight: %s", err.c_str());
    assert_true(same_bits(resumed, straight));
}

// The whole state, gathered on rank 0, names the custom optimizer's slots and holds
// what the built-in's holds.
struct Gathered {
    std::vector<std::string> names;
    std::vector<float> values;
};

sx_status_t collect(sx_param_state_t *st, void *user) {
    Gathered *g = static_cast<Gathered *>(user);
    for (int32_t t = 0; t < st->num_tensors; ++t) {
        g->names.push_back(std::string(st->name) + "." + st->tensor_names[t]);
        g->values.insert(g->values.end(), st->tensors[t], st->tensors[t] + st->numel);
    }
    return SX_OK;
}

void test_custom_whole_state(void **) {
    const int32_t id = custom_id();
    Gathered gc, gb;
    for (int which = 0; which < 2; ++which) {
        const std::string rv = tag("w");
        Gathered &out = which == 0 ? gc : gb;
        const std::string err = sxtest::run_ranks(3, [&](int rank) -> std::string {
            sx_shard_group_t *g = nullptr;
            std::string e = make_group(rv, rank, 3, 2, which == 0 ? id : SX_OPTIM_ADAMW, &g);
            for (int step = 1; step <= 3 && e.empty(); ++step) e = train_step(g, rank, step);
            if (e.empty() && sx_gather_optim_state(g, 0, rank == 0 ? collect : nullptr, &out) != SX_OK)
                e = std::string("gather: ") + sx_last_error_message();
            sx_destroy_shard_group(g);
            return e;
        });
        if (!err.empty()) fail_msg("%s", err.c_str());
    }
    assert_true(gc.names == gb.names);
    assert_true(std::find(gc.names.begin(), gc.names.end(), "p0.exp_avg_sq") != gc.names.end());
    assert_true(same_bits(gc.values, gb.values));
}

// An update that fails on one rank fails the step on every rank and changes nothing;
// the next step goes on as if the failed one had not been tried.
void test_failed_update_changes_nothing(void **) {
    const int32_t id = custom_id();
    const std::string rv_c = tag("f"), rv_b = tag("fb");
    std::atomic<int> arrived{0};
    const std::string err = sxtest::run_ranks(2, [&](int rank) -> std::string {
        sx_shard_group_t *c = nullptr, *b = nullptr;
        std::string e = make_group(rv_c, rank, 2, 2, id, &c);
        if (e.empty()) e = make_group(rv_b, rank, 2, 2, SX_OPTIM_ADAMW, &b);
        for (int step = 1; step <= 2 && e.empty(); ++step) {
            e = train_step(c, rank, step);
            if (e.empty()) e = train_step(b, rank, step);
        }
        std::vector<float> before, after;
        if (e.empty()) e = snapshot(c, &before);
        // Param 3 (unit 1's 5 elements) lies in rank 0's shard only: its update fails
        // there, and only there; rank 1's succeeds, and is undone all the same.
        meet(&arrived, 2);
        if (rank == 0) custom_adamw_fail_on(3);
        meet(&arrived, 4);
        sx_status_t s = SX_OK;
        if (e.empty()) e = train_step(c, rank, 3, &s);
        const std::string msg = sx_last_error_message();
        meet(&arrived, 6);
        if (rank == 0) custom_adamw_fail_on(-1);
        if (e.empty() && s != SX_ERR_OPTIMIZER) e = "the failed step returned " + std::string(sx_status_string(s));
        if (e.empty() && msg.find("changed nothing on any rank") == std::string::npos)
            e = "the failed step's message: " + msg;
        // The failing rank's message carries what the update wrote.
        if (e.empty() && rank == 0 && msg.find("returned 42 updating param 'p3' on rank 0: param 3 told to fail") ==
                                          std::string::npos)
            e = "the failing rank's message: " + msg;
        if (e.empty()) e = snapshot(c, &after);
        if (e.empty() && !same_bits(before, after)) e = "the failed step changed params or state";
        // Both go on with step 4's gradients: equal again.
        if (e.empty()) e = train_step(c, rank, 4);
        if (e.empty()) e = train_step(b, rank, 4);
        std::vector<float> sc, sb;
        if (e.empty()) e = snapshot(c, &sc);
        if (e.empty()) e = snapshot(b, &sb);
        if (e.empty() && !same_bits(sc, sb)) e = "after the failed step, the custom run differs";
        sx_destroy_shard_group(c);
        sx_destroy_shard_group(b);
        return e;
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// Bytes of a view (fp32 or 16-bit).
size_t view_bytes(const sx_view_t &v) { return v.numel * (v.dtype == SX_DTYPE_F32 ? 4 : 2); }

// A failure in a late piece, after the pieces before it (on both pool threads) were
// updated: world 3, an fp32 param and a bf16 one (its fp32 masters double-buffered too)
// in two units, each rank's shard many pieces long. Failing on rank 2 (the last piece of
// its pass) and then on rank 0 (the last piece of its first thread's run), the steps
// change nothing on any rank, neither params nor masters nor slots, and the run goes on
// as one that never tried them.
void test_failure_in_a_late_piece_changes_nothing(void **) {
    const int32_t id = custom_id();
    const int64_t sizes[] = {60011, 30013};
    const std::string rv_t = tag("late"), rv_r = tag("late-ref");
    std::atomic<int> arrived{0};
    const auto make = [&](const std::string &rv, int rank, sx_shard_group_t **out) -> std::string {
        sx_group_config_t cfg;
        sx_group_config_init(&cfg, sizeof cfg);
        cfg.backend = SX_BACKEND_CPU;
        cfg.rendezvous = rv.c_str();
        cfg.rank = rank;
        cfg.world_size = 3;
        cfg.stage = 2;
        cfg.num_threads = 2;
        REQUIRE(sx_create_shard_group(&cfg, out));
        sx_param_group_desc_t d;
        REQUIRE(sx_param_group_desc_init(&d, sizeof d, id));
        d.lr = 0.01;
        d.weight_decay = 0.1;
        REQUIRE(sx_add_param_group(*out, &d, nullptr));
        for (int p = 0; p < 2; ++p) {
            sx_param_desc_t pd;
            sx_param_desc_init(&pd, sizeof pd);
            const std::string name = "w" + std::to_string(p);
            pd.name = name.c_str();
            pd.ndim = 1;
            pd.shape = &sizes[p];
            pd.dtype = p == 0 ? SX_DTYPE_F32 : SX_DTYPE_BF16;
            pd.unit = p;
            REQUIRE(sx_add_param(*out, &pd, nullptr));
        }
        REQUIRE(sx_finalize(*out));
        return "";
    };
    const auto step = [&](sx_shard_group_t *g, int rank, int k, sx_status_t *status) -> std::string {
        for (int p = 0; p < 2; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            REQUIRE(sx_grad_view(g, p, &v));
            for (uint64_t i = 0; i < v.numel; ++i) {
                const float x = std::cos(0.013f * i * (rank + 1) + 0.7f * k + p);
                if (v.dtype == SX_DTYPE_F32)
                    static_cast<float *>(v.data)[i] = x;
                else
                    sx::half::from_f32(v.dtype, &x, static_cast<uint16_t *>(v.data) + i, 1);
            }
        }
        *status = sx_step(g, nullptr, nullptr);
        return "";
    };
    // The params whole, and this rank's masters and slots.
    const auto state = [&](sx_shard_group_t *g, std::vector<char> *out) -> std::string {
        out->clear();
        for (int p = 0; p < 2; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            REQUIRE(sx_param_view(g, p, &v));
            out->insert(out->end(), static_cast<char *>(v.data), static_cast<char *>(v.data) + view_bytes(v));
            for (const char *slot : {"exp_avg", "exp_avg_sq", "master"}) {
                if (p == 0 && std::strcmp(slot, "master") == 0) continue;
                REQUIRE(sx_state_view(g, p, slot, &v));
                out->insert(out->end(), static_cast<char *>(v.data), static_cast<char *>(v.data) + view_bytes(v));
            }
        }
        return "";
    };
    const std::string err = sxtest::run_ranks(3, [&](int rank) -> std::string {
        sx_shard_group_t *t = nullptr, *r = nullptr;
        std::string e = make(rv_t, rank, &t);
        if (e.empty()) e = make(rv_r, rank, &r);
        sx_status_t s = SX_OK;
        for (int k = 1; k <= 2 && e.empty(); ++k) {
            e = step(t, rank, k, &s);
            if (e.empty() && s != SX_OK) e = std::string("step: ") + sx_last_error_message();
            if (e.empty()) e = step(r, rank, k, &s);
            if (e.empty() && s != SX_OK) e = std::string("reference step: ") + sx_last_error_message();
        }
        std::vector<char> before, after;
        if (e.empty()) e = state(t, &before);
        // w1's last element lies in rank 2's shard (the last piece of its pass); w0's
        // element 15000 in rank 0's (the last piece of its first thread's run).
        const struct {
            int32_t param;
            uint64_t offset;
            int rank;
        } fails[] = {{1, 30012, 2}, {0, 15000, 0}};
        int n = 0;
        for (const auto &f : fails) {
            meet(&arrived, 3 * ++n);
            if (rank == 0) custom_adamw_fail_at(f.param, f.offset);
            meet(&arrived, 3 * ++n);
            if (e.empty()) e = step(t, rank, 3, &s);
            const std::string msg = sx_last_error_message();
            meet(&arrived, 3 * ++n);
            if (rank == 0) custom_adamw_fail_at(-1, 0);
            if (e.empty() && s != SX_ERR_OPTIMIZER)
                e = "the step failing on rank " + std::to_string(f.rank) + " returned " + sx_status_string(s);
            if (e.empty() && rank == f.rank && msg.find("returned 43") == std::string::npos)
                e = "the failing rank's message: " + msg;
            if (e.empty() && rank != f.rank && msg.find("on 1 other rank") == std::string::npos)
                e = "a peer's message: " + msg;
            if (e.empty()) e = state(t, &after);
            if (e.empty() && after != before)
                e = "the step failing on rank " + std::to_string(f.rank) + " changed params, masters or slots";
        }
        if (e.empty()) e = step(t, rank, 4, &s);
        if (e.empty() && s != SX_OK) e = std::string("step 4: ") + sx_last_error_message();
        if (e.empty()) e = step(r, rank, 4, &s);
        if (e.empty() && s != SX_OK) e = std::string("reference step 4: ") + sx_last_error_message();
        std::vector<char> st, sr;
        if (e.empty()) e = state(t, &st);
        if (e.empty()) e = state(r, &sr);
        if (e.empty() && st != sr) e = "after the failed steps, the run differs from one that never tried them";
        sx_destroy_shard_group(t);
        sx_destroy_shard_group(r);
        return e;
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// Registered SX_OPTIMIZER_IN_PLACE, a failing update cannot be undone: the step fails
// and so does the group, on the failing rank at once and on its peer at its next
// exchange.
void test_failed_in_place_update_fails_the_group(void **) {
    int32_t id = 0;
    assert_int_equal(custom_adamw_register_in_place(&id), SX_OK);
    const std::string rv = tag("fi");
    std::atomic<int> arrived{0};
    const std::string err = sxtest::run_ranks(2, [&](int rank) -> std::string {
        sx_shard_group_t *c = nullptr;
        std::string e = make_group(rv, rank, 2, 2, id, &c);
        if (e.empty()) e = train_step(c, rank, 1);
        meet(&arrived, 2);
        if (rank == 0) custom_adamw_fail_on(3);  // in rank 0's shard
        meet(&arrived, 4);
        sx_status_t s = SX_OK;
        if (e.empty()) e = train_step(c, rank, 2, &s);
        const std::string msg = sx_last_error_message();
        meet(&arrived, 6);
        if (rank == 0) custom_adamw_fail_on(-1);
        if (e.empty() && rank == 0 && (s != SX_ERR_OPTIMIZER || msg.find("the group has failed") == std::string::npos))
            e = "the failing rank's step: " + std::string(sx_status_string(s)) + ": " + msg;
        if (e.empty() && s == SX_OK) e = "the step succeeded on rank " + std::to_string(rank);
        if (e.empty() && rank == 0 && train_step(c, rank, 3, &s).empty() && s != SX_ERR_GROUP_FAILED)
            e = "after the failure, sx_step returned " + std::string(sx_status_string(s));
        sx_destroy_shard_group(c);
        return e;
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// Mixed precision: over fp32 masters, the custom AdamW's pass rounds the params into
// their bf16 copy as sx's own kernel does, bit for bit; undone, the bf16 copy is the old
// params' again.
void test_custom_update_rounds_masters(void **) {
    using namespace sx::optim;
    const int32_t id = custom_id();
    const size_t n = 10007;  // pieces of 4096 and a tail
    const Hyper builtin = default_hyper(Kind::kAdamW), custom = default_hyper(static_cast<Kind>(id));
    std::vector<float> p0(n), g(n), m0(n), v0(n);
    for (size_t i = 0; i < n; ++i) {
        p0[i] = std::sin(0.1f * i);
        g[i] = std::cos(0.37f * i);
        m0[i] = 0.01f * std::sin(0.3f * i);
        v0[i] = 0.001f * (1.0f + std::cos(0.7f * i));
    }
    std::vector<float> pb = p0, mb = m0, vb = v0, pc = p0, mc(n), vc(n), undo(n);
    std::vector<uint16_t> ob(n), oc(n);
    Segment sb;
    sb.param = pb.data();
    sb.grad = g.data();
    sb.state[0] = mb.data();
    sb.state[1] = vb.data();
    sb.n = n;
    sb.hyper = &builtin;
    sb.step = 3;
    sb.compute_out = ob.data();
    sb.compute_dtype = SX_DTYPE_BF16;
    Segment sc = sb;
    sc.param = pc.data();
    sc.state[0] = mc.data();
    sc.state[1] = vc.data();
    sc.state_in[0] = m0.data();
    sc.state_in[1] = v0.data();
    sc.undo = undo.data();
    sc.hyper = &custom;
    sc.compute_out = oc.data();
    sc.param_index = 0;
    ThreadPool pool(2);
    fused_update(&sb, 1, 0.5f, &pool, Isa::kAuto, nullptr);
    CustomFailure failure;
    assert_true(custom_update(&sc, 1, 0.5f, &pool, nullptr, &failure));
    assert_memory_equal(pb.data(), pc.data(), n * sizeof(float));
    assert_memory_equal(mb.data(), mc.data(), n * sizeof(float));
    assert_memory_equal(vb.data(), vc.data(), n * sizeof(float));
    assert_memory_equal(ob.data(), oc.data(), n * sizeof(uint16_t));
    assert_memory_equal(m0.data(), sc.state_in[0], n * sizeof(float));  // the old slots stay
    undo_double_buffered(&sc, 1, &pool);
    assert_memory_equal(pc.data(), p0.data(), n * sizeof(float));
    std::vector<uint16_t> rounded(n);
    sx::half::from_f32(SX_DTYPE_BF16, p0.data(), rounded.data(), n);
    assert_memory_equal(oc.data(), rounded.data(), n * sizeof(uint16_t));
}

// Ranks whose param group uses different custom optimizers disagree, and are told so.
void test_ranks_with_other_custom_optimizers_disagree(void **) {
    int32_t in_place = 0;
    assert_int_equal(custom_adamw_register_in_place(&in_place), SX_OK);
    const int32_t id = custom_id();
    const std::string rv = tag("dis");
    const std::string err = sxtest::run_ranks(2, [&](int rank) -> std::string {
        sx_shard_group_t *g = nullptr;
        const std::string e = make_group(rv, rank, 2, 2, rank == 0 ? id : in_place, &g);
        sx_destroy_shard_group(g);
        if (e.find("SX_ERR_MISMATCH") == std::string::npos ||
            e.find("optimizer: CAdamW on rank 0, CAdamWInPlace on rank 1") == std::string::npos)
            return "expected the ranks' disagreement, got: " + (e.empty() ? std::string("success") : e);
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

int32_t noop(const sx_optimizer_piece_t *) { return 0; }

void test_bad_registrations(void **) {
    const char *slots[] = {"m", "m"};
    sx_optimizer_hyperparameter_t hp[2] = {{"lr", 1e-3, 0, 0}, {"trust", 5.0, 0, 1}};
    sx_optimizer_desc_t d;
    int32_t id = -1;
    auto fresh = [&](const char *name) {
        assert_int_equal(sx_optimizer_desc_init(&d, sizeof d), SX_OK);
        d.name = name;
        d.update = noop;
    };
    auto refused = [&](sx_status_t want, const char *needle) {
        id = -1;
        assert_int_equal(sx_register_optimizer(&d, &id), want);
        if (!std::strstr(sx_last_error_message(), needle)) fail_msg("message '%s' lacks '%s'", sx_last_error_message(), needle);
        assert_int_equal(id, -1);
    };
    fresh("Bad");
    d.update = nullptr;
    refused(SX_ERR_INVALID_ARGUMENT, "update is NULL");
    {
        // A newer caller's struct, with a field this library does not know set.
        struct {
            sx_optimizer_desc_t d;
            uint64_t tail;
        } newer;
        std::memset(&newer, 0, sizeof newer);
        assert_int_equal(sx_optimizer_desc_init(&newer.d, sizeof newer.d), SX_OK);
        newer.d.name = "Bad";
        newer.d.update = noop;
        newer.d.struct_size = sizeof newer;
        newer.tail = 1;
        id = -1;
        assert_int_equal(sx_register_optimizer(&newer.d, &id), SX_ERR_INVALID_ARGUMENT);
        assert_non_null(std::strstr(sx_last_error_message(), "newer sx.h"));
        assert_int_equal(id, -1);
    }
    fresh("Bad");
    d.num_slots = 2;
    d.slot_names = slots;
    refused(SX_ERR_INVALID_ARGUMENT, "slot names must differ");
    fresh("Bad");
    d.flags = 0x2;
    refused(SX_ERR_INVALID_ARGUMENT, "the known flags are SX_OPTIMIZER_IN_PLACE");
    fresh("Bad name");
    refused(SX_ERR_INVALID_ARGUMENT, "desc->name 'Bad name' has ' '");
    fresh("adamw");
    refused(SX_ERR_INVALID_ARGUMENT, "sx's own AdamW");
    fresh("Bad");
    d.num_hyperparameters = 2;
    d.hyperparameters = hp;  // trust's default 5 lies outside [0, 1]
    refused(SX_ERR_INVALID_ARGUMENT, "default 5 lies outside [0, 1]");
    hp[1].default_value = 0.5;
    hp[0].default_value = -1;
    refused(SX_ERR_INVALID_ARGUMENT, "'lr': its default -1 must be >= 0");
    hp[0].default_value = 1e-3;
    // Registered: the same description again is the same id; another under the name is not.
    assert_int_equal(sx_register_optimizer(&d, &id), SX_OK);
    assert_true(id >= SX_OPTIM_CUSTOM_FIRST);
    int32_t again = -1;
    assert_int_equal(sx_register_optimizer(&d, &again), SX_OK);
    assert_int_equal(again, id);
    const int32_t registered = id;
    hp[1].default_value = 0.25;
    refused(SX_ERR_ALREADY_EXISTS, "another description");
    id = registered;

    // Its own hyperparameter: SX_HP_CUSTOM + 0, within its range; built-ins have none.
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    const std::string rv = tag("hp");
    cfg.rendezvous = rv.c_str();
    cfg.world_size = 1;
    cfg.backend = SX_BACKEND_CPU;  // custom optimizers run on the host (a CUDA group refuses them)
    sx_shard_group_t *g = nullptr;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_OK);
    sx_param_group_desc_t pd;
    assert_int_equal(sx_param_group_desc_init(&pd, sizeof pd, id), SX_OK);
    assert_true(pd.lr == 1e-3 && pd.optimizer == id);
    pd.beta1 = 0.5;  // not one of its hyperparameters
    assert_int_equal(sx_add_param_group(g, &pd, nullptr), SX_ERR_INVALID_ARGUMENT);
    pd.beta1 = 0;
    assert_int_equal(sx_add_param_group(g, &pd, nullptr), SX_OK);
    double v = 0;
    assert_int_equal(sx_get_hyperparameter(g, 0, SX_HP_CUSTOM, &v), SX_OK);
    assert_true(v == 0.5);
    assert_int_equal(sx_set_hyperparameter(g, 0, SX_HP_CUSTOM, 0.75), SX_OK);
    assert_int_equal(sx_set_hyperparameter(g, 0, SX_HP_CUSTOM, 2.0), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "trust = 2"));
    assert_int_equal(sx_get_hyperparameter(g, 0, SX_HP_CUSTOM, &v), SX_OK);
    assert_true(v == 0.75);
    assert_int_equal(sx_set_hyperparameter(g, 0, SX_HP_CUSTOM + 1, 0.1), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "has 1 hyperparameter of its own"));
    assert_int_equal(sx_param_group_desc_init(&pd, sizeof pd, SX_OPTIM_SGD), SX_OK);
    assert_int_equal(sx_add_param_group(g, &pd, nullptr), SX_OK);
    assert_int_equal(sx_set_hyperparameter(g, 1, SX_HP_CUSTOM, 0.1), SX_ERR_INVALID_ARGUMENT);
    assert_int_equal(sx_param_group_desc_init(&pd, sizeof pd, SX_OPTIM_CUSTOM_FIRST + 63), SX_ERR_INVALID_ARGUMENT);
    sx_destroy_shard_group(g);
}

// A unit holds params of one pass: a custom optimizer's (double-buffered) and LAMB's (two
// passes around the exchange of its norms) cannot share one; in two units they train.
void test_custom_and_lamb_share_no_unit(void **) {
    int32_t id = -1;
    assert_int_equal(custom_adamw_register(&id), SX_OK);
    for (int32_t lamb_unit : {0, 1}) {
        sx_group_config_t cfg;
        sx_group_config_init(&cfg, sizeof cfg);
        const std::string rv = tag("lamb-unit");
        cfg.rendezvous = rv.c_str();
        cfg.world_size = 1;
        cfg.backend = SX_BACKEND_CPU;
        sx_shard_group_t *g = nullptr;
        assert_int_equal(sx_create_shard_group(&cfg, &g), SX_OK);
        sx_param_group_desc_t pd;
        assert_int_equal(sx_param_group_desc_init(&pd, sizeof pd, id), SX_OK);
        assert_int_equal(sx_add_param_group(g, &pd, nullptr), SX_OK);
        assert_int_equal(sx_param_group_desc_init(&pd, sizeof pd, SX_OPTIM_LAMB), SX_OK);
        assert_int_equal(sx_add_param_group(g, &pd, nullptr), SX_OK);
        const int64_t shape = 10;
        const char *names[] = {"w", "v"};
        for (int k = 0; k < 2; ++k) {
            sx_param_desc_t d;
            sx_param_desc_init(&d, sizeof d);
            d.name = names[k];
            d.ndim = 1;
            d.shape = &shape;
            d.param_group = k;
            d.unit = k == 0 ? 0 : lamb_unit;
            assert_int_equal(sx_add_param(g, &d, nullptr), SX_OK);
        }
        if (lamb_unit == 0) {
            assert_int_equal(sx_finalize(g), SX_ERR_INVALID_ARGUMENT);
            assert_non_null(std::strstr(sx_last_error_message(), "unit 0 holds param 'w' of the custom optimizer 'CAdamW' "
                                                                 "and param 'v' of Lamb"));
        } else {
            assert_int_equal(sx_finalize(g), SX_OK);
            assert_int_equal(sx_step(g, nullptr, nullptr), SX_OK);
        }
        sx_destroy_shard_group(g);
    }
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_registrations),
        cmocka_unit_test(test_custom_update_rounds_masters),
        cmocka_unit_test(test_ranks_with_other_custom_optimizers_disagree),
        cmocka_unit_test(test_failed_update_changes_nothing),
        cmocka_unit_test(test_failure_in_a_late_piece_changes_nothing),
        cmocka_unit_test(test_failed_in_place_update_fails_the_group),
        cmocka_unit_test(test_custom_whole_state),
        cmocka_unit_test(test_custom_checkpoint_resumes_exactly),
        cmocka_unit_test(test_custom_adamw_matches_builtin),
        cmocka_unit_test(test_custom_and_lamb_share_no_unit),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
