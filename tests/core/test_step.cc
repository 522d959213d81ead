// The distributed step against an unsharded single-process reference: world sizes 1-4
// as threads and 2 as processes over tcp:// (stages 1-3, reading each other's flat
// buffers in place through shared memory), and 4 as processes on two simulated hosts
// (shared memory on each, TCP between them), stages 1 and 2, every optimizer, two param
// groups, 3 micro-batches, clipping; freezing and unfreezing mid-run.
#include "sx_cmocka.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "comm/communicator.h"
#include "process_ranks.h"
#include "step_scenario.h"
#include "run_ranks.h"
#include "test_files.h"
#include "view_values.h"

using sxtest::Scenario;

namespace {

void expect_ok(const std::string &err) {
    if (!err.empty()) fail_msg("%s", err.c_str());
}

void run_matrix(int32_t optimizer, const char *tag) {
    for (int world = 1; world <= 4; ++world) {
        for (int stage = 1; stage <= 2; ++stage) {
            Scenario sc = sxtest::two_group_scenario(optimizer);
            sc.world = world;
            sc.stage = stage;
            std::string name = std::string(tag) + "-w" + std::to_string(world) + "-s" + std::to_string(stage);
            std::string err = sxtest::run_threads_and_compare(sc, name, 1e-6);
            if (!err.empty()) fail_msg("%s world %d stage %d: %s", tag, world, stage, err.c_str());
        }
    }
}

void test_sgd_matches_reference(void **) { run_matrix(SX_OPTIM_SGD, "sgd"); }
void test_adam_matches_reference(void **) { run_matrix(SX_OPTIM_ADAM, "adam"); }
void test_adamw_matches_reference(void **) { run_matrix(SX_OPTIM_ADAMW, "adamw"); }

void test_without_clipping_and_single_micro_batch(void **) {
    for (int world : {1, 3}) {
        Scenario sc = sxtest::two_group_scenario(SX_OPTIM_ADAMW);
        sc.world = world;
        sc.max_grad_norm = 0.0;
        sc.micro_batches = 1;
        expect_ok(sxtest::run_threads_and_compare(sc, "noclip-" + std::to_string(world), 1e-6));
    }
}

// Gradient memory per rank at 2 ranks, one fp32 param of 4096 elements (16 KiB of
// gradients; an 8 KiB shard): stages 1 and 2 reduce into the gradient buffer itself, so
// grad_bytes is the buffer alone; a stage-2 group gets its 8 KiB fp32 accumulator at its
// first sx_accumulate_grads (and keeps it); stage 3, and 16-bit gradients at any stage,
// have it from the start.
void test_the_accumulator_exists_only_where_needed(void **) {
    struct Case {
        int stage;
        int32_t dtype;
        uint64_t before, after;  // grad_bytes after sx_finalize and after an accumulation
    };
    const Case cases[] = {{1, SX_DTYPE_F32, 16384, 16384},
                          {2, SX_DTYPE_F32, 16384, 16384 + 8192},
                          {3, SX_DTYPE_F32, 16384 + 8192, 16384 + 8192},
                          {2, SX_DTYPE_BF16, 8192 + 8192, 8192 + 8192}};
    for (const Case &c : cases) {
        const std::string err = sxtest::run_ranks(2, [&](int r) -> std::string {
            sx_group_config_t cfg;
            sx_group_config_init(&cfg, sizeof cfg);
            cfg.backend = SX_BACKEND_CPU;
            const std::string rv = "local://accum-" + std::to_string(c.stage) + "-" + std::to_string(c.dtype) + "-" +
                                   std::to_string(getpid());
            cfg.rendezvous = rv.c_str();
            cfg.rank = r;
            cfg.world_size = 2;
            cfg.stage = c.stage;
            cfg.num_threads = 1;
            sx_shard_group_t *g = nullptr;
            if (sx_create_shard_group(&cfg, &g) != SX_OK) return sx_last_error_message();
            std::string e;
            sx_param_group_desc_t sgd;
            sx_param_group_desc_init(&sgd, sizeof sgd, SX_OPTIM_SGD);
            const int64_t shape[1] = {4096};
            sx_param_desc_t d;
            sx_param_desc_init(&d, sizeof d);
            d.name = "w", d.ndim = 1, d.shape = shape, d.dtype = c.dtype;
            sx_memory_stats_t before, after;
            sx_memory_stats_init(&before, sizeof before);
            sx_memory_stats_init(&after, sizeof after);
            if (sx_add_param_group(g, &sgd, nullptr) != SX_OK || sx_add_param(g, &d, nullptr) != SX_OK ||
                sx_finalize(g) != SX_OK || sx_get_memory_stats(g, &before) != SX_OK ||
                sx_accumulate_grads(g) != SX_OK || sx_step(g, nullptr, nullptr) != SX_OK ||
                sx_get_memory_stats(g, &after) != SX_OK)
                e = sx_last_error_message();
            else if (before.grad_bytes != c.before || after.grad_bytes != c.after)
                e = "grad_bytes " + std::to_string(before.grad_bytes) + " then " + std::to_string(after.grad_bytes) +
                    "; expected " + std::to_string(c.before) + " then " + std::to_string(c.after);
            sx_destroy_shard_group(g);
            return e;
        });
        if (!err.empty()) fail_msg("stage %d, dtype %d: %s", c.stage, c.dtype, err.c_str());
    }
}

// The default step leaves every gradient at zero, at 1, 2 and 3 ranks (stages 1 and 2),
// where the update zeroes the gradients it reads (an fp32 unit whose params are all
// trainable: at one rank its whole buffer, at more its own shard, reduced in place, and
// a pass the peers' shards) and a pass of its own zeroes the others (a bf16 unit, a unit
// with a frozen param). Every byte of every gradient view is checked, twice.
void test_the_default_step_leaves_zero_gradients(void **) {
    struct P {
        const char *name;
        int64_t n;
        int32_t dtype, unit, frozen;
    };
    const P ps[] = {{"a", 70001, SX_DTYPE_F32, 0, 0}, {"b", 333, SX_DTYPE_BF16, 1, 0},
                    {"c", 500, SX_DTYPE_F32, 2, 0}, {"d", 64, SX_DTYPE_F32, 2, 1}};
    for (int world : {1, 2, 3}) {
        for (int stage : {1, 2}) {
            const std::string rv = "local://zero-grads-" + std::to_string(getpid()) + "-" + std::to_string(world) +
                                   "-" + std::to_string(stage);
            const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
                sx_group_config_t cfg;
                sx_group_config_init(&cfg, sizeof cfg);
                cfg.backend = SX_BACKEND_CPU;
                cfg.rendezvous = rv.c_str();
                cfg.rank = rank, cfg.world_size = world, cfg.stage = stage, cfg.num_threads = 2;
                sx_shard_group_t *g = nullptr;
                if (sx_create_shard_group(&cfg, &g) != SX_OK) return sx_last_error_message();
                std::string e;
                sx_param_group_desc_t adamw;
                sx_param_group_desc_init(&adamw, sizeof adamw, SX_OPTIM_ADAMW);
                if (sx_add_param_group(g, &adamw, nullptr) != SX_OK) e = sx_last_error_message();
                for (const P &p : ps) {
                    sx_param_desc_t d;
                    sx_param_desc_init(&d, sizeof d);
                    d.name = p.name, d.ndim = 1, d.shape = &p.n, d.dtype = p.dtype, d.unit = p.unit;
                    d.frozen = p.frozen;
                    if (e.empty() && sx_add_param(g, &d, nullptr) != SX_OK) e = sx_last_error_message();
                }
                if (e.empty() && sx_finalize(g) != SX_OK) e = sx_last_error_message();
                for (float value : {1.0f, 0.25f}) {
                    for (int32_t i = 0; i < 4 && e.empty(); ++i) {
                        sx_view_t v;
                        sx_view_init(&v, sizeof v);
                        if (sx_grad_view(g, i, &v) != SX_OK) e = sx_last_error_message();
                        for (uint64_t k = 0; k < v.numel && e.empty(); ++k) {
                            if (ps[i].dtype == SX_DTYPE_F32) static_cast<float *>(v.data)[k] = value;
                            else static_cast<uint16_t *>(v.data)[k] = 0x3f80;  // bf16 1.0
                        }
                    }
                    if (e.empty() && sx_step(g, nullptr, nullptr) != SX_OK) e = sx_last_error_message();
                    for (int32_t i = 0; i < 4 && e.empty(); ++i) {
                        sx_view_t v;
                        sx_view_init(&v, sizeof v);
                        if (sx_grad_view(g, i, &v) != SX_OK) e = sx_last_error_message();
                        const size_t bytes = v.numel * (ps[i].dtype == SX_DTYPE_F32 ? 4 : 2);
                        for (size_t b = 0; b < bytes && e.empty(); ++b)
                            if (static_cast<const unsigned char *>(v.data)[b] != 0)
                                e = std::string("param '") + ps[i].name + "' (value " + std::to_string(value) +
                                    "): byte " + std::to_string(b) + " of its gradient is not zero after the step";
                    }
                }
                sx_destroy_shard_group(g);
                return e;
            });
            if (!err.empty()) fail_msg("world %d, stage %d: %s", world, stage, err.c_str());
        }
    }
}

// A NaN in one rank's gradient. Checked (clipping, SX_NONFINITE_SKIP, SX_NONFINITE_ERROR):
// every rank skips the step, reports it (skipped, nonfinite), keeps its params, and the
// step count stays; ERROR also returns SX_ERR_NONFINITE, and the group goes on. Unchecked
// (no clipping, the default): the update runs and NaN reaches that param, as in torch,
// and nonfinite says so. Ranks that pass different `nonfinite` fail with SX_ERR_MISMATCH.
void test_nonfinite_gradients(void **) {
    for (int stage : {1, 2, 3}) {
        const std::string rv = "local://nonfinite-" + std::to_string(getpid()) + "-" + std::to_string(stage);
        const std::string err = sxtest::run_ranks(2, [&](int rank) -> std::string {
            sx_group_config_t cfg;
            sx_group_config_init(&cfg, sizeof cfg);
            cfg.backend = SX_BACKEND_CPU;
            cfg.rendezvous = rv.c_str();
            cfg.rank = rank, cfg.world_size = 2, cfg.stage = stage, cfg.num_threads = 1;
            sx_shard_group_t *g = nullptr;
            if (sx_create_shard_group(&cfg, &g) != SX_OK) return sx_last_error_message();
            std::string e;
            sx_param_group_desc_t adamw;
            sx_param_group_desc_init(&adamw, sizeof adamw, SX_OPTIM_ADAMW);
            const int64_t n = 1001;
            sx_param_desc_t d;
            sx_param_desc_init(&d, sizeof d);
            d.name = "w", d.ndim = 1, d.shape = &n;
            if (sx_add_param_group(g, &adamw, nullptr) != SX_OK || sx_add_param(g, &d, nullptr) != SX_OK ||
                sx_finalize(g) != SX_OK)
                e = sx_last_error_message();
            // Stage 3: the param is gathered around each use.
            auto values = [&](bool grad) -> std::vector<float> {
                if (stage == 3) sx_unit_gather(g, 0);
                sx_view_t v;
                sx_view_init(&v, sizeof v);
                (grad ? sx_grad_view : sx_param_view)(g, 0, &v);
                std::vector<float> out(static_cast<const float *>(v.data), static_cast<const float *>(v.data) + v.numel);
                if (stage == 3) sx_unit_release(g, 0);
                return out;
            };
            auto step = [&](bool nan, double max_norm, int32_t mode, sx_step_result_t *res) -> sx_status_t {
                if (stage == 3) sx_unit_gather(g, 0);
                sx_view_t v;
                sx_view_init(&v, sizeof v);
                sx_grad_view(g, 0, &v);
                for (uint64_t k = 0; k < v.numel; ++k) static_cast<float *>(v.data)[k] = 0.01f * ((k % 7) + 1);
                if (nan && rank == 1) static_cast<float *>(v.data)[500] = NAN;
                if (stage == 3) sx_unit_release(g, 0);
                sx_step_options_t o;
                sx_step_options_init(&o, sizeof o);
                o.max_grad_norm = max_norm;
                o.nonfinite = mode;
                sx_step_result_init(res, sizeof *res);
                return sx_step(g, &o, res);
            };
            sx_step_result_t r;
            if (e.empty() && step(false, 1.0, SX_NONFINITE_DEFAULT, &r) != SX_OK) e = sx_last_error_message();
            uint64_t count = 1;
            struct Case {
                double max_norm;
                int32_t mode;
                sx_status_t want;
            };
            for (const Case c : {Case{1.0, SX_NONFINITE_DEFAULT, SX_OK}, Case{0.0, SX_NONFINITE_SKIP, SX_OK},
                                 Case{0.0, SX_NONFINITE_ERROR, SX_ERR_NONFINITE}}) {
                if (!e.empty()) break;
                const std::string what = "clip " + std::to_string(c.max_norm) + ", mode " + std::to_string(c.mode);
                const std::vector<float> before = values(false);
                const sx_status_t s = step(true, c.max_norm, c.mode, &r);
                const std::string msg = sx_last_error_message();
                if (s != c.want) e = what + ": returned " + std::to_string(s) + ": " + msg;
                else if (!r.skipped || !r.nonfinite || r.step != count)
                    e = what + ": skipped " + std::to_string(r.skipped) + ", nonfinite " + std::to_string(r.nonfinite) +
                        ", step " + std::to_string(r.step);
                else if (values(false) != before) e = what + ": the params changed";
                else if (s != SX_OK && msg.find("inf or NaN") == std::string::npos) e = what + ": " + msg;
                else if (step(false, c.max_norm, c.mode, &r) != SX_OK || r.step != ++count || r.skipped || r.nonfinite)
                    e = what + ": the next step did not go on: " + sx_last_error_message();
            }
            // Unchecked: the update runs; the NaN reaches the param, and nonfinite says so.
            if (e.empty()) {
                const sx_status_t s = step(true, 0.0, SX_NONFINITE_DEFAULT, &r);
                const std::vector<float> after = values(false);
                if (s != SX_OK || r.skipped || !r.nonfinite || !std::isnan(after[500]))
                    e = "unchecked: status " + std::to_string(s) + ", skipped " + std::to_string(r.skipped) +
                        ", nonfinite " + std::to_string(r.nonfinite);
            }
            // Ranks that pass different modes are told.
            if (e.empty()) {
                const sx_status_t s = step(false, 0.0, rank == 0 ? SX_NONFINITE_SKIP : SX_NONFINITE_DEFAULT, &r);
                if (s != SX_ERR_MISMATCH || !std::strstr(sx_last_error_message(), "nonfinite"))
                    e = std::string("different modes: ") + sx_last_error_message();
            }
            sx_destroy_shard_group(g);
            return e;
        });
        if (!err.empty()) fail_msg("stage %d: %s", stage, err.c_str());
    }
}

// A trainer that keeps its params in one array (llm.c): a packed layout (alignment 1)
// puts them one after the other in one unit, and sx_unit_view gives that block, params
// and gradients, behind one pointer each. 3 ranks (shards start mid-param) train through
// the unit views alone, fp32 and bf16, and end bit for bit where the default layout's
// per-param views do; the packed checkpoint loads into 2 ranks at the default alignment.
// The packed test's params: p0..p3 of kPackedSizes elements of `dtype`, in one unit, in
// one AdamW param group (lr 0.01). Returns the error, or "".
constexpr int64_t kPackedSizes[] = {5, 7, 3, 11};
constexpr int kPackedParams = 4;
std::string add_packed_test_params(sx_shard_group_t *g, int32_t dtype) {
    sx_param_group_desc_t adamw;
    sx_param_group_desc_init(&adamw, sizeof adamw, SX_OPTIM_ADAMW);
    adamw.lr = 0.01;
    if (sx_add_param_group(g, &adamw, nullptr) != SX_OK) return sx_last_error_message();
    for (int p = 0; p < kPackedParams; ++p) {
        const std::string name = "p" + std::to_string(p);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = name.c_str(), d.ndim = 1, d.shape = &kPackedSizes[p], d.dtype = dtype;
        if (sx_add_param(g, &d, nullptr) != SX_OK) return sx_last_error_message();
    }
    return "";
}

void test_packed_layout_and_unit_views(void **) {
    const int64_t *sizes = kPackedSizes;
    const int np = kPackedParams;
    const std::string dir = sxtest::make_tmpdir("packed");
    for (int32_t dtype : {SX_DTYPE_F32, SX_DTYPE_BF16}) {
        std::vector<float> result[2][3];
        for (int packed = 0; packed < 2; ++packed) {
            const std::string rv = "local://packed-" + std::to_string(getpid()) + "-" + std::to_string(dtype) + "-" +
                                   std::to_string(packed);
            const std::string err = sxtest::run_ranks(3, [&](int rank) -> std::string {
                sx_group_config_t cfg;
                sx_group_config_init(&cfg, sizeof cfg);
                cfg.backend = SX_BACKEND_CPU;
                cfg.rendezvous = rv.c_str();
                cfg.rank = rank, cfg.world_size = 3, cfg.num_threads = 1;
                cfg.alignment = packed ? 1 : 0;
                sx_shard_group_t *g = nullptr;
                if (sx_create_shard_group(&cfg, &g) != SX_OK) return sx_last_error_message();
                std::string e = add_packed_test_params(g, dtype);
                if (e.empty() && sx_finalize(g) != SX_OK) e = sx_last_error_message();
                // Where each param starts: packed, right after the one before.
                std::vector<uint64_t> offset(np);
                for (int p = 0; p < np && e.empty(); ++p) {
                    sx_param_info_t info;
                    sx_param_info_init(&info, sizeof info);
                    sx_get_param_info(g, p, &info);
                    offset[p] = info.offset_in_unit;
                    if (packed && offset[p] != (p ? offset[p - 1] + sizes[p - 1] : 0))
                        e = "param " + std::to_string(p) + " is not packed: offset " + std::to_string(offset[p]);
                }
                sx_view_t pv, gv, first;
                sx_view_init(&pv, sizeof pv), sx_view_init(&gv, sizeof gv), sx_view_init(&first, sizeof first);
                if (e.empty() && (sx_unit_view(g, 0, 0, &pv) != SX_OK || sx_unit_view(g, 0, 1, &gv) != SX_OK ||
                                  sx_param_view(g, 0, &first) != SX_OK))
                    e = std::string("views: ") + sx_last_error_message();
                if (e.empty() && (pv.data != first.data || pv.dtype != dtype || pv.numel < 26 || pv.numel % 3 != 0))
                    e = "the unit's param view is not the block of its params";
                if (e.empty() && packed && pv.numel != 27) e = "packed: " + std::to_string(pv.numel) + " elements";
                // Initial values and gradients through the unit views alone.
                for (int p = 0; p < np && e.empty(); ++p)
                    for (int64_t i = 0; i < sizes[p]; ++i) sxtest::view_put(pv, offset[p] + i, 0.5f - 0.03125f * (p + i));
                for (int s = 1; s <= 4 && e.empty(); ++s) {
                    for (int p = 0; p < np; ++p)
                        for (int64_t i = 0; i < sizes[p]; ++i)
                            sxtest::view_put(gv, offset[p] + i, 0.0625f * ((s + p + i + rank) % 5) - 0.125f);
                    if (sx_step(g, nullptr, nullptr) != SX_OK) e = std::string("step: ") + sx_last_error_message();
                }
                for (int p = 0; p < np && e.empty(); ++p)
                    for (int64_t i = 0; i < sizes[p]; ++i) result[packed][rank].push_back(sxtest::view_get(pv, offset[p] + i));
                if (e.empty() && packed) {
                    sx_save_options_t so;
                    sx_save_options_init(&so, sizeof so);
                    const std::string path = dir + "/packed-" + std::to_string(dtype);
                    so.path = path.c_str();
                    so.synchronous = 1;
                    sx_future_t *f = nullptr;
                    if (sx_save_optim_state(g, &so, &f) != SX_OK || sx_future_wait(f, -1) != SX_OK)
                        e = std::string("save: ") + sx_last_error_message();
                    sx_future_destroy(f);
                }
                sx_destroy_shard_group(g);
                return e;
            });
            if (!err.empty()) fail_msg("dtype %d, packed %d: %s", dtype, packed, err.c_str());
        }
        for (int r = 0; r < 3; ++r)
            if (result[1][r] != result[0][0]) fail_msg("dtype %d: the packed run differs on rank %d", dtype, r);
        // The packed checkpoint into 2 ranks at the default alignment: the same values.
        const std::string rv = "local://packed-load-" + std::to_string(getpid()) + "-" + std::to_string(dtype);
        const std::string err = sxtest::run_ranks(2, [&](int rank) -> std::string {
            sx_group_config_t cfg;
            sx_group_config_init(&cfg, sizeof cfg);
            cfg.backend = SX_BACKEND_CPU;
            cfg.rendezvous = rv.c_str();
            cfg.rank = rank, cfg.world_size = 2, cfg.num_threads = 1;
            sx_shard_group_t *g = nullptr;
            if (sx_create_shard_group(&cfg, &g) != SX_OK) return sx_last_error_message();
            std::string e = add_packed_test_params(g, dtype);
            sx_load_options_t lo;
            sx_load_optim_state_options_init(&lo, sizeof lo);
            const std::string path = dir + "/packed-" + std::to_string(dtype);
            lo.path = path.c_str();
            if (e.empty() && (sx_finalize(g) != SX_OK || sx_load_optim_state(g, &lo) != SX_OK))
                e = std::string("load: ") + sx_last_error_message();
            std::vector<float> got;
            for (int p = 0; p < np && e.empty(); ++p) {
                sx_view_t v;
                sx_view_init(&v, sizeof v);
                sx_param_view(g, p, &v);
                for (uint64_t i = 0; i < v.numel; ++i) got.push_back(sxtest::view_get(v, i));
            }
            if (e.empty() && got != result[1][0]) e = "the packed checkpoint loaded other values";
            sx_destroy_shard_group(g);
            return e;
        });
        if (!err.empty()) fail_msg("dtype %d, loading the packed checkpoint: %s", dtype, err.c_str());
    }
    sxtest::remove_tree(dir);
}

void test_freeze_and_unfreeze(void **) {
    for (int world : {1, 2, 3}) {
        for (int stage = 1; stage <= 2; ++stage) {
            for (int32_t opt : {SX_OPTIM_ADAMW, SX_OPTIM_SGD}) {
                Scenario sc = sxtest::two_group_scenario(opt);
                sc.world = world;
                sc.stage = stage;
                sc.trainable = sxtest::freeze_schedule;
                sc.mask_through_pointer = (world + stage) % 2 == 0;
                std::string name = "freeze-" + std::to_string(world) + "-" + std::to_string(stage) +
                                   "-" + std::to_string(opt);
                std::string err = sxtest::run_threads_and_compare(sc, name, 1e-6);
                if (!err.empty())
                    fail_msg("world %d stage %d optimizer %d: %s", world, stage, opt, err.c_str());
            }
        }
    }
}

// A param group (and params in new units, one of them in an old group) added after
// sx_finalize, at step 5, at world sizes 1-4 and stages 1-3: equal to the reference
// that starts updating them at step 6 with fresh state, as torch's add_param_group does.
void test_param_groups_added_at_run_time(void **) {
    for (int32_t opt : {SX_OPTIM_ADAMW, SX_OPTIM_SGD}) {
        for (int world = 1; world <= 4; ++world) {
            for (int stage = 1; stage <= 3; ++stage) {
                Scenario sc = sxtest::late_group_scenario(opt, 5);
                sc.world = world;
                sc.stage = stage;
                sc.steps = 9;
                const std::string name = "late-" + std::to_string(opt) + "-" + std::to_string(world) + "-" +
                                         std::to_string(stage);
                std::string err = sxtest::run_threads_and_compare(sc, name, 1e-6);
                if (!err.empty()) fail_msg("optimizer %d world %d stage %d: %s", opt, world, stage, err.c_str());
            }
        }
    }
    // The added group changes the trajectory of what it holds (the test could fail).
    Scenario a = sxtest::late_group_scenario(SX_OPTIM_ADAMW, 5), b = a;
    a.steps = b.steps = 9;
    b.add_after_step = 0;
    assert_true(sxtest::reference_run(a)[5] != sxtest::reference_run(b)[5]);
}

// Checkpoints around a param group added at run time (after step 5, by 2 ranks): the one
// saved before it lacks the new params and loads into the grown group (4 ranks, every
// param registered at once) only with SX_LOAD_ALLOW_MISSING; both it and the one saved
// after continue the uninterrupted run exactly. (Every rank adds the same gradients and
// the world sizes are powers of two, so the averages are exact at every size.)
void test_checkpoints_around_an_added_param_group(void **) {
    const std::string dir = sxtest::make_tmpdir("late-group");
    sxtest::Scenario full = sxtest::late_group_scenario(SX_OPTIM_ADAMW, 5);
    full.same_grads_on_every_rank = true;  // the trajectory does not depend on the world size
    full.steps = 11;
    sxtest::Scenario save = full;
    save.world = 2;
    save.steps = 8;
    save.after_step = [&](sx_shard_group_t *g, int, int step) -> std::string {
        if (step != 5 && step != 8) return "";
        const std::string path = dir + "/step" + std::to_string(step);
        sx_save_options_t so;
        sx_save_options_init(&so, sizeof so);
        so.path = path.c_str();
        so.synchronous = 1;
        sx_future_t *f = nullptr;
        sx_status_t st = sx_save_optim_state(g, &so, &f);
        if (st == SX_OK) st = sx_future_wait(f, -1);
        sx_future_destroy(f);
        return st == SX_OK ? "" : std::string("save: ") + sx_last_error_message();
    };
    std::string err = sxtest::run_threads_and_compare(save, "late-save-" + std::to_string(::getpid()), 1e-6);
    if (!err.empty()) fail_msg("the run that saves: %s", err.c_str());

    sxtest::Scenario after = full;
    after.world = 4;
    after.first_step = 9;
    after.load_from = dir + "/step8";
    err = sxtest::run_threads_and_compare(after, "late-after-" + std::to_string(::getpid()), 1e-6);
    if (!err.empty()) fail_msg("continued from the checkpoint saved after the group was added: %s", err.c_str());

    sxtest::Scenario before = full;
    before.world = 4;
    before.first_step = 6;
    before.load_from = dir + "/step5";
    err = sxtest::run_threads_and_compare(before, "late-strict-" + std::to_string(::getpid()), 1e-6);
    if (err.find("late.w") == std::string::npos || err.find("allow missing") == std::string::npos)
        fail_msg("a checkpoint without the added params loaded without SX_LOAD_ALLOW_MISSING: %s", err.c_str());
    before.load_flags = SX_LOAD_ALLOW_MISSING;
    err = sxtest::run_threads_and_compare(before, "late-before-" + std::to_string(::getpid()), 1e-6);
    if (!err.empty()) fail_msg("continued from the checkpoint saved before the group was added: %s", err.c_str());
    sxtest::remove_tree(dir);
}

void test_freezing_changes_the_trajectory(void **) {
    // Guard against a schedule that has no effect: the reference with and without
    // freezing must differ for the frozen params.
    Scenario a = sxtest::two_group_scenario(SX_OPTIM_ADAMW), b = a;
    b.trainable = sxtest::freeze_schedule;
    auto ra = sxtest::reference_run(a), rb = sxtest::reference_run(b);
    assert_true(ra[2] != rb[2]);
    assert_true(ra[4] != rb[4]);
    assert_true(ra[1] != rb[1]);
}

void test_processes_over_tcp(void **) {
    for (int stage = 1; stage <= 3; ++stage) {
        std::string err = sxtest::run_process_ranks(2, {"--scenario", "adamw", "--stage", std::to_string(stage)},
                                                    60);
        if (!err.empty()) fail_msg("stage %d: %s", stage, err.c_str());
    }
}

// Four processes on two simulated hosts (SX_HOST_ID: ranks 0 and 2 on one, 1 and 3 on
// the other, so that a host's ranks are not contiguous): the world's communicator
// combines through shared memory on each host and through TCP between host peers.
void test_processes_on_two_hosts(void **) {
    for (int stage = 1; stage <= 2; ++stage) {
        std::string err = sxtest::run_process_ranks(
            4, {"--scenario", "adamw", "--stage", std::to_string(stage), "--hosts", "1"}, 90);
        if (!err.empty()) fail_msg("stage %d: %s", stage, err.c_str());
    }
}

// Six processes, each on a host of its own (SX_HOST_ID), on Gloo's sparse mesh
// (SX_GLOO_MESH=sparse: each rank paired with 4 of the 5 others, the collectives through
// the ring, trees and the chain): stages 1 to 3, with clipping, match the reference.
void test_processes_on_a_sparse_gloo_mesh(void **) {
    for (int stage = 1; stage <= 3; ++stage) {
        std::string err = sxtest::run_process_ranks(
            6, {"--scenario", "adamw", "--stage", std::to_string(stage), "--mesh", "sparse"}, 90);
        if (!err.empty()) fail_msg("stage %d: %s", stage, err.c_str());
    }
}

// Child process role: one rank of a tcp:// run; exits 0 if its params match the reference
// (and, with --hosts, if its group's communicator was the hierarchical one; with --mesh
// sparse, if its Gloo mesh was sparse).
int child_main(int argc, char **argv) {
    sxtest::ChildArgs args;
    if (!sxtest::parse_child_args(argc, argv, &args)) return 2;
    const bool hosts = args.get("--hosts", "0") == "1", sparse = args.get("--mesh", "") == "sparse";
    static bool hierarchical = false, sparse_mesh = false;
    if (hosts) ::setenv("SX_HOST_ID", ("host-" + std::to_string(args.rank % 2)).c_str(), 1);
    if (sparse) {
        ::setenv("SX_HOST_ID", ("host-" + std::to_string(args.rank)).c_str(), 1);
        ::setenv("SX_GLOO_MESH", "sparse", 1);
    }
    if (hosts || sparse)
        sx_set_log_callback(
            [](int32_t, const char *message, void *) {
                if (std::strstr(message, "through TCP with its host peers")) hierarchical = true;
                if (std::strstr(message, "(sparse mesh,")) sparse_mesh = true;
            },
            nullptr, SX_LOG_DEBUG);
    Scenario sc = sxtest::two_group_scenario(SX_OPTIM_ADAMW);
    sc.world = args.world;
    sc.stage = std::atoi(args.get("--stage", "2").c_str());
    std::vector<std::vector<float>> got;
    std::string err = sxtest::rank_run(sc, args.rendezvous, args.rank, 30000, &got);
    if (err.empty()) err = sxtest::compare(got, sxtest::reference_run(sc), 1e-6);
    if (err.empty() && hosts && !hierarchical) err = "the group's communicator was not the hierarchical one";
    if (err.empty() && sparse && !sparse_mesh) err = "the group's Gloo mesh was not sparse";
    // Processes of one host read each other's flat buffers where they lie.
    if (err.empty() && !hosts && !sparse && sx::comm::collectives_in_place() == 0)
        err = "no collective read the peers' buffers in place";
    if (!err.empty()) {
        std::fprintf(stderr, "rank %d: %s\n", args.rank, err.c_str());
        return 1;
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_matches_reference),
        cmocka_unit_test(test_adam_matches_reference),
        cmocka_unit_test(test_adamw_matches_reference),
        cmocka_unit_test(test_without_clipping_and_single_micro_batch),
        cmocka_unit_test(test_the_accumulator_exists_only_where_needed),
        cmocka_unit_test(test_the_default_step_leaves_zero_gradients),
        cmocka_unit_test(test_nonfinite_gradients),
        cmocka_unit_test(test_packed_layout_and_unit_views),
        cmocka_unit_test(test_freeze_and_unfreeze),
        cmocka_unit_test(test_freezing_changes_the_trajectory),
        cmocka_unit_test(test_param_groups_added_at_run_time),
        cmocka_unit_test(test_checkpoints_around_an_added_param_group),
        cmocka_unit_test(test_processes_over_tcp),
        cmocka_unit_test(test_processes_on_two_hosts),
        cmocka_unit_test(test_processes_on_a_sparse_gloo_mesh),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
