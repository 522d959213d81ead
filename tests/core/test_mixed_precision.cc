// Mixed precision through the public API, on real ranks (threads over local://):
// 16-bit params with fp32 masters, 16-bit or fp32 gradients, reduction in the gradients'
// dtype (divided by FSDP's pre-divide factor before, multiplied back after) or in fp32, dynamic and static loss scaling,
// and checkpoints of 16-bit groups loaded at other world sizes and dtypes.
//
// Exactness: gradients are small multiples of 1/64, so every sum any reduction forms
// (in fp32, fp16 or bf16, in any order, divided by the factor 2 of 4 ranks) is exact. The expected
// params then follow from the scalar optimizer reference alone, bit for bit.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "base/half.h"
#include "optim/adafactor.h"
#include "optim/lamb.h"
#include "optim/optimizer.h"
#include "sx/sx.h"
#include "sx_cmocka.h"
#include "test_files.h"
#include "test_groups.h"
#include "view_values.h"

namespace {

namespace half = sx::half;
using sxtest::view_get;
using sxtest::view_put;

// Two params in unit 0 (of the dtype under test) and one fp32 param in unit 1.
struct PDef {
    const char *name;
    int64_t numel;
    int32_t unit;
    bool low;  // of the dtype under test (else fp32)
};
const std::vector<PDef> kParams = {{"w", 1000, 0, true}, {"b", 37, 0, true}, {"fp", 50, 1, false}};

struct Config {
    int world = 1;
    int32_t dtype = SX_DTYPE_BF16;  // of the params marked low (SX_DTYPE_F32: all fp32)
    int32_t grad_dtype = 0;    // sx_group_config_t.grad_dtype
    int32_t reduce_dtype = 0;  // sx_group_config_t.reduce_dtype
    int32_t stage = 2;
    int micro_batches = 1;
    int steps = 3;
    int32_t optimizer = SX_OPTIM_ADAMW;  // its defaults, with lr 0.01
};

std::string err_text(const char *what) { return std::string(what) + ": " + sx_last_error_message(); }

int32_t param_dtype(const Config &c, const PDef &p) { return p.low ? c.dtype : SX_DTYPE_F32; }

float widen(int32_t dtype, uint16_t v) { return dtype == SX_DTYPE_F16 ? half::f16_to_f32(v) : half::bf16_to_f32(v); }

// The gradient rank r contributes to element i of param p at step s, micro-batch m:
// a multiple of 1/64 in [-40/64, 40/64].
float grad_value(int s, int m, int r, size_t p, uint64_t i) {
    const uint64_t h = (static_cast<uint64_t>(s) * 7919 + m * 104729 + r * 1299709 + p * 15485863 + i * 2654435761u) % 81;
    return (static_cast<float>(h) - 40.0f) / 64.0f;
}
float initial_value(size_t p, uint64_t i) { return static_cast<float>((p * 31 + i * 17) % 200) / 100.0f - 1.0f; }

struct Group {
    sx_shard_group_t *g = nullptr;
    ~Group() { sx_destroy_shard_group(g); }
};

std::string make_group(const std::string &rv, int rank, const Config &c, Group *out) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = c.world;
    cfg.num_threads = 1;
    cfg.timeout_ms = 60000;
    cfg.stage = c.stage;
    cfg.grad_dtype = c.grad_dtype;
    cfg.reduce_dtype = c.reduce_dtype;
    if (sx_create_shard_group(&cfg, &out->g) != SX_OK) return err_text("create");
    sx_param_group_desc_t a;
    sx_param_group_desc_init(&a, sizeof a, c.optimizer);
    a.lr = 0.01;
    if (sx_add_param_group(out->g, &a, nullptr) != SX_OK) return err_text("add_param_group");
    for (const PDef &p : kParams) {
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = p.name;
        d.ndim = 1;
        d.shape = &p.numel;
        d.unit = p.unit;
        d.dtype = param_dtype(c, p);
        if (sx_add_param(out->g, &d, nullptr) != SX_OK) return err_text("add_param");
    }
    if (sx_finalize(out->g) != SX_OK) return err_text("finalize");
    return "";
}

// The expected run: fp32 masters and AdamW state per param, updated by the scalar
// reference with the exact sum of every rank's gradients and the group's scale 1/world;
// a 16-bit param's value is its master rounded.
struct Expected {
    std::vector<std::vector<float>> master, s0, s1, s2;  // the masters and each state slot
    explicit Expected(const Config &c) {
        for (size_t p = 0; p < kParams.size(); ++p) {
            std::vector<float> x(static_cast<size_t>(kParams[p].numel));
            for (uint64_t i = 0; i < x.size(); ++i) {
                x[i] = initial_value(p, i);
                if (kParams[p].low) x[i] = widen(c.dtype, c.dtype == SX_DTYPE_F16 ? half::f32_to_f16(x[i]) : half::f32_to_bf16(x[i]));
            }
            master.push_back(x);
            s0.emplace_back(x.size(), 0.0f);
            s1.emplace_back(x.size(), 0.0f);
            s2.emplace_back(x.size(), 0.0f);
        }
    }
    // Step s's gradients; t is the params' step count after it (s + 1 unless steps were skipped).
    void step(const Config &c, int s, int64_t t = 0) {
        sx::optim::Hyper h = sx::optim::default_hyper(static_cast<sx::optim::Kind>(c.optimizer));
        h.lr = 0.01;
        for (size_t p = 0; p < kParams.size(); ++p) {
            std::vector<float> g(master[p].size(), 0.0f);
            for (uint64_t i = 0; i < g.size(); ++i)
                for (int mb = 0; mb < c.micro_batches; ++mb)
                    for (int r = 0; r < c.world; ++r) g[i] += grad_value(s, mb, r, p, i);
            sx::optim::Segment seg;
            seg.param = master[p].data();
            seg.grad = g.data();
            seg.state[0] = s0[p].data();
            seg.state[1] = s1[p].data();
            seg.state[2] = s2[p].data();
            seg.n = g.size();
            seg.hyper = &h;
            seg.step = t ? t : s + 1;
            seg.mu_product = sx::optim::mu_product_after(h, seg.step);
            if (h.kind == sx::optim::Kind::kLamb)  // the whole param's norms
                sx::optim::lamb_reference(seg, 1.0f / static_cast<float>(c.world));
            else if (h.kind == sx::optim::Kind::kAdafactor)  // 1-D: a variance per element, the norms
                sx::optim::adafactor_reference(seg, sx::optim::adafactor_shape({kParams[p].numel}), nullptr, nullptr,
                                               1.0f / static_cast<float>(c.world));
            else
                sx::optim::reference_update(seg, 1.0f / static_cast<float>(c.world));
        }
    }
    float value(const Config &c, size_t p, uint64_t i) const {
        const float x = master[p][i];
        if (!kParams[p].low) return x;
        return widen(c.dtype, c.dtype == SX_DTYPE_F16 ? half::f32_to_f16(x) : half::f32_to_bf16(x));
    }
};

// Adds rank r's gradients of step s, micro-batch mb, into the grad views (stage 1 keeps
// the earlier micro-batches' there).
std::string write_grads(sx_shard_group_t *g, int s, int mb, int r, float scale = 1.0f) {
    for (size_t p = 0; p < kParams.size(); ++p) {
        sx_view_t gv;
        sx_view_init(&gv, sizeof gv);
        if (sx_grad_view(g, static_cast<int32_t>(p), &gv) != SX_OK) return err_text("grad_view");
        for (uint64_t i = 0; i < gv.numel; ++i) view_put(gv, i, view_get(gv, i) + grad_value(s, mb, r, p, i) * scale);
    }
    return "";
}

// Stage 3: gathers (or releases) both units, so that every param view exists; else nothing.
std::string gather_units(sx_shard_group_t *g, bool release) {
    int32_t stage = 0;
    if (sx_get_stage(g, &stage) != SX_OK) return err_text("get_stage");
    for (int32_t u = 0; u < 2 && stage == 3; ++u)
        if ((release ? sx_unit_release(g, u) : sx_unit_gather(g, u)) != SX_OK) return err_text("unit gather/release");
    return "";
}

std::string set_initial_values(sx_shard_group_t *g, int rank) {
    std::string e = gather_units(g, false);
    if (!e.empty()) return e;
    if (rank == 0) {
        for (size_t p = 0; p < kParams.size(); ++p) {
            sx_view_t pv;
            sx_view_init(&pv, sizeof pv);
            if (sx_param_view(g, static_cast<int32_t>(p), &pv) != SX_OK) return err_text("param_view");
            for (uint64_t i = 0; i < pv.numel; ++i) view_put(pv, i, initial_value(p, i));
        }
    }
    if (sx_broadcast_params(g, 0) != SX_OK) return err_text("broadcast_params");
    return gather_units(g, true);
}

std::string compare_params(sx_shard_group_t *g, const Config &c, const Expected &e, const char *when) {
    std::string gathered = gather_units(g, false);
    if (!gathered.empty()) return gathered;
    for (size_t p = 0; p < kParams.size(); ++p) {
        sx_view_t pv;
        sx_view_init(&pv, sizeof pv);
        if (sx_param_view(g, static_cast<int32_t>(p), &pv) != SX_OK) return err_text("param_view");
        if (pv.dtype != param_dtype(c, kParams[p])) return std::string("param view of ") + kParams[p].name + " has the wrong dtype";
        for (uint64_t i = 0; i < pv.numel; ++i) {
            const float got = view_get(pv, i), want = e.value(c, p, i);
            if (std::memcmp(&got, &want, 4) != 0) {
                char msg[200];
                std::snprintf(msg, sizeof msg, "%s: %s[%llu] = %.9g, expected %.9g", when, kParams[p].name,
                              static_cast<unsigned long long>(i), got, want);
                return msg;
            }
        }
    }
    return gather_units(g, true);
}

std::string config_name(const Config &c) {
    char b[160];
    std::snprintf(b, sizeof b, "%s, world %d, %s params, grads %s, reduce %s, stage %d, %d micro-batches",
                  sx::optim::optimizer_name(c.optimizer).c_str(), c.world,
                  c.dtype == SX_DTYPE_F16 ? "fp16" : "bf16", c.grad_dtype ? "fp32" : "16-bit",
                  c.reduce_dtype ? "fp32" : "16-bit", c.stage, c.micro_batches);
    return b;
}

// Trains c.steps steps on c.world ranks and checks every rank's params after each.
void run_exact(const Config &c) {
    Expected e(c);
    static int serial = 0;
    const std::string rv = "local://mp-" + std::to_string(getpid()) + "-" + std::to_string(++serial);
    std::vector<Expected> per_step;
    for (int s = 0; s < c.steps; ++s) {
        e.step(c, s);
        per_step.push_back(e);
    }
    const std::string err = sxtest::run_ranks(c.world, [&](int r) -> std::string {
        Group grp;
        std::string m = make_group(rv, r, c, &grp);
        if (m.empty()) m = set_initial_values(grp.g, r);
        for (int s = 0; s < c.steps && m.empty(); ++s) {
            for (int mb = 0; mb < c.micro_batches && m.empty(); ++mb) {
                m = write_grads(grp.g, s, mb, r);
                if (m.empty() && mb + 1 < c.micro_batches && sx_accumulate_grads(grp.g) != SX_OK)
                    m = err_text("accumulate_grads");
            }
            sx_step_result_t res;
            sx_step_result_init(&res, sizeof res);
            if (m.empty() && sx_step(grp.g, nullptr, &res) != SX_OK) m = err_text("step");
            if (m.empty() && (res.skipped || res.loss_scale != 1.0)) m = "unexpected skip or loss scale";
            if (m.empty()) m = compare_params(grp.g, c, per_step[static_cast<size_t>(s)], ("step " + std::to_string(s + 1)).c_str());
        }
        return m;
    });
    if (!err.empty()) {
        std::fprintf(stderr, "ERROR: %s: %s\n", config_name(c).c_str(), err.c_str());
        fail();
    }
}

void test_masters_updated_exactly(void **) {
    for (int32_t dtype : {SX_DTYPE_BF16, SX_DTYPE_F16})
        for (int world : {1, 4})
            for (int32_t reduce : {0, SX_DTYPE_F32})
                for (int32_t stage : {1, 2, 3}) {
                    Config c;
                    c.dtype = dtype, c.world = world, c.reduce_dtype = reduce, c.stage = stage;
                    c.micro_batches = stage >= 2 && world == 4 ? 2 : 1;
                    run_exact(c);
                }
}

// Every optimizer of the table keeps its fp32 masters and rounds them into the 16-bit
// params the same way.
void test_every_optimizer_with_masters(void **) {
    size_t count = 0;
    const sx::optim::OptimizerSpec *rows = sx::optim::all_optimizers(&count);
    for (size_t k = 0; k < count; ++k) {
        // Muon takes 2-D params: bindings/python/tests_torch/check_muon.py runs it with
        // bf16 params and fp32 masters.
        if (rows[k].kind == sx::optim::Kind::kMuon) continue;
        Config c;
        c.optimizer = static_cast<int32_t>(rows[k].kind);
        c.dtype = k % 2 ? SX_DTYPE_F16 : SX_DTYPE_BF16;
        c.world = 2 + static_cast<int>(k % 2);
        c.stage = 1 + static_cast<int32_t>(k % 3);
        c.steps = 4;
        run_exact(c);
    }
}

void test_fp32_grads_for_16bit_params(void **) {
    for (int32_t stage : {1, 2, 3}) {
        Config c;
        c.world = 3;
        c.grad_dtype = SX_DTYPE_F32;
        c.stage = stage;
        c.micro_batches = 2;
        run_exact(c);
    }
}

// 4 ranks each add 20000 to one fp16 gradient: their sum, 80000, is past fp16's
// largest value (65504), but each is divided by 2 (FSDP's factor for 4 ranks) before the
// fp16 sum and the sum multiplied back in fp32, so the average is exact and the step is
// not lost.
void test_fp16_sum_is_pre_and_post_divided(void **) {
    const std::string rv = "local://mp-div-" + std::to_string(getpid());
    Config c;
    c.world = 4;
    c.dtype = SX_DTYPE_F16;
    std::vector<double> norms(4, 0.0);
    const std::string err = sxtest::run_ranks(4, [&](int r) -> std::string {
        Group grp;
        std::string m = make_group(rv, r, c, &grp);
        if (!m.empty()) return m;
        sx_view_t gv;
        sx_view_init(&gv, sizeof gv);
        if (sx_grad_view(grp.g, 0, &gv) != SX_OK) return err_text("grad_view");
        view_put(gv, 5, 20000.0f);
        sx_step_result_t res;
        sx_step_result_init(&res, sizeof res);
        if (sx_step(grp.g, nullptr, &res) != SX_OK) return err_text("step");
        norms[static_cast<size_t>(r)] = res.grad_norm;
        return "";
    });
    assert_string_equal(err.c_str(), "");
    for (double n : norms) assert_true(n == 20000.0);  // the averaged gradient's norm
}

// Dynamic loss scaling on 2 ranks with fp16 gradients: an inf on one rank skips the
// step on both (nothing changes), halves the scale; growth_interval good steps double it.
void test_dynamic_loss_scaling_skips_and_recovers(void **) {
  for (int32_t stage : {2, 3}) {
    const std::string rv = "local://mp-scale-" + std::to_string(stage) + "-" + std::to_string(getpid());
    Config c;
    c.world = 2;
    c.stage = stage;
    c.dtype = SX_DTYPE_F16;
    // The run of the expected model: steps 0, 2, 3 are taken (1 is skipped).
    Expected e(c);
    std::vector<Expected> after;
    c.reduce_dtype = SX_DTYPE_F32;  // the fp32 reduction of 16-bit gradients
    int64_t t = 0;
    for (int s : {0, 2, 3}) {
        e.step(c, s, ++t);
        after.push_back(e);
    }
    const std::string err = sxtest::run_ranks(2, [&](int r) -> std::string {
        Group grp;
        std::string m = make_group(rv, r, c, &grp);
        if (m.empty()) m = set_initial_values(grp.g, r);
        if (!m.empty()) return m;
        sx_loss_scaling_t ls;
        sx_loss_scaling_init(&ls, sizeof ls);
        ls.mode = SX_LOSS_SCALING_DYNAMIC;
        ls.init_scale = 1024;
        ls.growth_interval = 2;
        if (sx_set_loss_scaling(grp.g, &ls) != SX_OK) return err_text("set_loss_scaling");
        double scale = 0;
        if (sx_get_loss_scale(grp.g, &scale) != SX_OK || scale != 1024) return "initial scale is not 1024";
        const double want_scale[4] = {1024, 512, 512, 1024};
        const bool want_skip[4] = {false, true, false, false};
        size_t taken = 0;
        for (int s = 0; s < 4; ++s) {
            // The trainer's backward runs on the scaled loss: its gradients are scaled.
            m = write_grads(grp.g, s, 0, r, static_cast<float>(scale));
            if (!m.empty()) return m;
            if (s == 1 && r == 1) {
                sx_view_t gv;
                sx_view_init(&gv, sizeof gv);
                sx_grad_view(grp.g, 1, &gv);
                view_put(gv, 3, INFINITY);
            }
            sx_step_result_t res;
            sx_step_result_init(&res, sizeof res);
            if (sx_step(grp.g, nullptr, &res) != SX_OK) return err_text("step");
            if ((res.skipped != 0) != want_skip[s]) return "step " + std::to_string(s) + ": skipped = " + std::to_string(res.skipped);
            if (res.loss_scale != want_scale[s]) return "step " + std::to_string(s) + ": scale " + std::to_string(res.loss_scale);
            if (sx_get_loss_scale(grp.g, &scale) != SX_OK || scale != want_scale[s]) return "sx_get_loss_scale disagrees";
            if (res.step != taken + (want_skip[s] ? 0 : 1)) return "step count " + std::to_string(res.step);
            if (!want_skip[s]) ++taken;
            // A skipped step changes nothing: the params are those after the last taken one.
            m = compare_params(grp.g, c, after[taken - 1], ("step " + std::to_string(s)).c_str());
            if (!m.empty()) return m;
        }
        return "";
    });
    if (!err.empty()) std::fprintf(stderr, "ERROR: stage %d: %s\n", stage, err.c_str());
    assert_string_equal(err.c_str(), "");
  }
}

// Static scaling divides by the scale and never skips; a bad setting is refused and
// changes nothing.
void test_static_loss_scaling_and_bad_settings(void **) {
    Config c;
    Expected e(c);
    e.step(c, 0);
    const std::string rv = "local://mp-static-" + std::to_string(getpid());
    Group grp;
    assert_string_equal(make_group(rv, 0, c, &grp).c_str(), "");
    assert_string_equal(set_initial_values(grp.g, 0).c_str(), "");
    sx_loss_scaling_t ls;
    sx_loss_scaling_init(&ls, sizeof ls);
    ls.mode = SX_LOSS_SCALING_STATIC;
    ls.init_scale = 256;
    assert_int_equal(sx_set_loss_scaling(grp.g, &ls), SX_OK);
    sx_loss_scaling_t bad = ls;
    bad.backoff_factor = 1.5;
    assert_int_equal(sx_set_loss_scaling(grp.g, &bad), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "backoff_factor"));
    bad = ls;
    bad.mode = 7;
    assert_int_equal(sx_set_loss_scaling(grp.g, &bad), SX_ERR_INVALID_ARGUMENT);
    double scale = 0;
    assert_int_equal(sx_get_loss_scale(grp.g, &scale), SX_OK);
    assert_true(scale == 256);
    assert_string_equal(write_grads(grp.g, 0, 0, 0, 256.0f).c_str(), "");
    sx_step_result_t res;
    sx_step_result_init(&res, sizeof res);
    assert_int_equal(sx_step(grp.g, nullptr, &res), SX_OK);
    assert_int_equal(res.skipped, 0);
    assert_true(res.loss_scale == 256);
    assert_string_equal(compare_params(grp.g, c, e, "static").c_str(), "");
}

void test_bad_mixed_precision_configs(void **) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    const std::string rv = "local://mp-bad-" + std::to_string(getpid());
    cfg.rendezvous = rv.c_str();
    cfg.world_size = 1;
    cfg.grad_dtype = SX_DTYPE_BF16;
    sx_shard_group_t *g = nullptr;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "grad_dtype"));
    cfg.grad_dtype = 0;
    cfg.reduce_dtype = SX_DTYPE_F16;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "reduce_dtype"));
    cfg.reduce_dtype = 0;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_OK);
    sx_param_group_desc_t a;
    sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_ADAMW);
    assert_int_equal(sx_add_param_group(g, &a, nullptr), SX_OK);
    const int64_t n = 10;
    sx_param_desc_t d;
    sx_param_desc_init(&d, sizeof d);
    d.ndim = 1;
    d.shape = &n;
    d.name = "half";
    d.dtype = SX_DTYPE_F16;
    assert_int_equal(sx_add_param(g, &d, nullptr), SX_OK);
    d.name = "full";
    d.dtype = SX_DTYPE_F32;
    assert_int_equal(sx_add_param(g, &d, nullptr), SX_OK);
    // One unit, two dtypes: refused at finalize, naming both params.
    assert_int_equal(sx_finalize(g), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "'half'"));
    assert_non_null(std::strstr(sx_last_error_message(), "'full'"));
    sx_destroy_shard_group(g);
}

// 16-bit params cost 2 bytes in the flat buffers; their fp32 masters count as
// optimizer state.
void test_memory_of_16bit_params(void **) {
    Config c;
    Group grp;
    const std::string rv = "local://mp-mem-" + std::to_string(getpid());
    assert_string_equal(make_group(rv, 0, c, &grp).c_str(), "");
    sx_memory_stats_t st;
    sx_memory_stats_init(&st, sizeof st);
    assert_int_equal(sx_get_memory_stats(grp.g, &st), SX_OK);
    // Unit 0: w (1000) at 0, b (37) at 1024 (64-byte alignment = 32 bf16 elements), padded
    // to 1088 bf16; unit 1: 50 fp32 padded to 64.
    assert_int_equal(st.param_bytes, 1088 * 2 + 64 * 4);
    // AdamW: master + 2 states for unit 0, 2 states for unit 1.
    assert_int_equal(st.optimizer_bytes, 3 * 1088 * 4 + 2 * 64 * 4);
    assert_int_equal(st.unsharded_optimizer_bytes, 3 * 1061 * 4 + 2 * 50 * 4);
}

// A checkpoint of a bf16 group holds its fp32 masters: loaded at another world size
// it continues exactly; loaded into an fp32 group it gives the masters as params.
// A group of c.world ranks (this one r) from the initial values, trained `steps` steps.
std::string trained_group(const std::string &rv, int r, const Config &c, int steps, Group *grp) {
    std::string m = make_group(rv, r, c, grp);
    if (m.empty()) m = set_initial_values(grp->g, r);
    for (int s = 0; s < steps && m.empty(); ++s) {
        m = write_grads(grp->g, s, 0, r);
        if (m.empty() && sx_step(grp->g, nullptr, nullptr) != SX_OK) m = err_text("step");
    }
    return m;
}

// Loads the checkpoint at `path` into grp (rank r), which must give `want`; then the params must
// equal `now`, and after step s (of the expected run on c.world ranks) `next`.
std::string load_then_step(Group &grp, int r, const std::string &path, sx_status_t want, const Config &c,
                           const Expected &now, int s, const Expected &next, const std::string &what) {
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    if (sx_load_optim_state(grp.g, &lo) != want) return what + ": " + err_text("load");
    std::string m = compare_params(grp.g, c, now, ("after " + what).c_str());
    if (m.empty()) m = write_grads(grp.g, s, 0, r);
    if (m.empty() && sx_step(grp.g, nullptr, nullptr) != SX_OK) m = err_text("step");
    if (m.empty()) m = compare_params(grp.g, c, next, ("the step after " + what).c_str());
    return m;
}

void test_checkpoint_of_16bit_group(void **) {
    const std::string dir = sxtest::make_tmpdir("mp-ckpt");
    const std::string path = dir + "/ck";
    Config c2;
    c2.world = 2;
    c2.reduce_dtype = SX_DTYPE_F32;  // the fp32 reduction of 16-bit gradients
    Expected e(c2);
    for (int s = 0; s < 2; ++s) e.step(c2, s);
    const std::string rv = "local://mp-ck-" + std::to_string(getpid());
    std::string err = sxtest::run_ranks(2, [&](int r) -> std::string {
        Group grp;
        const std::string m = trained_group(rv + "-save", r, c2, 2, &grp);
        if (!m.empty()) return m;
        sx_save_options_t so;
        sx_save_options_init(&so, sizeof so);
        so.path = path.c_str();
        so.synchronous = 1;
        sx_future_t *f = nullptr;
        if (sx_save_optim_state(grp.g, &so, &f) != SX_OK) return err_text("save");
        const sx_status_t st = sx_future_wait(f, -1);
        sx_future_destroy(f);
        return st == SX_OK ? "" : "save failed";
    });
    assert_string_equal(err.c_str(), "");

    // Into 3 bf16 ranks: the params are the masters rounded, and one more step on 3
    // ranks follows the expected run continued on 3.
    Config c3 = c2;
    c3.world = 3;
    Expected e3 = e;
    e3.step(c3, 2);
    err = sxtest::run_ranks(3, [&](int r) -> std::string {
        Group grp;
        std::string m = make_group(rv + "-load3", r, c3, &grp);
        if (!m.empty()) return m;
        return load_then_step(grp, r, path, SX_OK, c3, e, 2, e3, "the load");
    });
    if (!err.empty()) std::fprintf(stderr, "ERROR: %s\n", err.c_str());
    assert_string_equal(err.c_str(), "");

    // Into one fp32 rank: its params are the bf16 group's fp32 masters, bit for bit.
    Config f32;
    f32.dtype = SX_DTYPE_F32;
    Group grp;
    assert_string_equal(make_group(rv + "-f32", 0, f32, &grp).c_str(), "");
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    assert_int_equal(sx_load_optim_state(grp.g, &lo), SX_OK);
    for (size_t p = 0; p < kParams.size(); ++p) {
        sx_view_t pv;
        sx_view_init(&pv, sizeof pv);
        assert_int_equal(sx_param_view(grp.g, static_cast<int32_t>(p), &pv), SX_OK);
        assert_int_equal(pv.dtype, SX_DTYPE_F32);
        assert_memory_equal(pv.data, e.master[p].data(), e.master[p].size() * sizeof(float));
    }

    // A load that fails on rank 1 of 2 bf16 ranks, at a state (the last chunk of its file,
    // read after the ranks gathered the new values), leaves both as they were: their
    // params, and their masters, which the step after shows.
    const std::string shard = path + "/shard-00001-of-00002.bin";
    std::string bytes = sxtest::read_file(shard);
    assert_true(bytes.size() > 0);
    bytes.back() = static_cast<char>(bytes.back() ^ 0x10);
    assert_true(sxtest::write_file(shard, bytes));
    Expected ahead = e;  // the group trains one step past the checkpoint
    ahead.step(c2, 2);
    Expected after = ahead;
    after.step(c2, 3);
    err = sxtest::run_ranks(2, [&](int r) -> std::string {
        Group g2;
        std::string m = trained_group(rv + "-fail", r, c2, 3, &g2);
        if (!m.empty()) return m;
        return load_then_step(g2, r, path, SX_ERR_CORRUPT, c2, ahead, 3, after, "a failed load");
    });
    if (!err.empty()) std::fprintf(stderr, "ERROR: %s\n", err.c_str());
    assert_string_equal(err.c_str(), "");
    sxtest::remove_tree(dir);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_masters_updated_exactly),
        cmocka_unit_test(test_fp32_grads_for_16bit_params),
        cmocka_unit_test(test_fp16_sum_is_pre_and_post_divided),
        cmocka_unit_test(test_dynamic_loss_scaling_skips_and_recovers),
        cmocka_unit_test(test_static_loss_scaling_and_bad_settings),
        cmocka_unit_test(test_bad_mixed_precision_configs),
        cmocka_unit_test(test_every_optimizer_with_masters),
        cmocka_unit_test(test_memory_of_16bit_params),
        cmocka_unit_test(test_checkpoint_of_16bit_group),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
