// The whole optimizer state: gathered onto one rank at world size 3 it equals the
// unsharded reference's state (torch's formulas) after the same steps, and scattered
// into 2 ranks and 1 it continues the run exactly; the "master" of 16-bit params both
// ways; a failing callback anywhere changes nothing and fails every rank; in-place views
// of a rank's own part; the root's memory stays within one param's state (processes).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/half.h"
#include "process_ranks.h"
#include "run_ranks.h"
#include "step_scenario.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

using sxtest::Scenario;

namespace {

// Every param's whole state as a gather delivers it.
struct Whole {
    int64_t step = 0, momentum_steps = 0;
    std::map<std::string, std::vector<float>> tensors;
};
struct WholeState {
    std::vector<Whole> params;
    int calls = 0;
    int fail_at = -1;  // the param whose callback fails (-1: none)
};

sx_status_t collect(sx_param_state_t *st, void *user) {
    WholeState *ws = static_cast<WholeState *>(user);
    ++ws->calls;
    if (st->param == ws->fail_at) return SX_ERR_CANCELLED;
    if (ws->params.size() <= static_cast<size_t>(st->param)) ws->params.resize(static_cast<size_t>(st->param) + 1);
    Whole &w = ws->params[static_cast<size_t>(st->param)];
    w.step = st->step;
    w.momentum_steps = st->momentum_steps;
    w.tensors.clear();
    for (int32_t t = 0; t < st->num_tensors; ++t)
        w.tensors[st->tensor_names[t]].assign(st->tensors[t], st->tensors[t] + st->numel);
    return SX_OK;
}

sx_status_t provide(sx_param_state_t *st, void *user) {
    WholeState *ws = static_cast<WholeState *>(user);
    ++ws->calls;
    if (st->param == ws->fail_at) return SX_ERR_CANCELLED;
    const Whole &w = ws->params.at(static_cast<size_t>(st->param));
    st->step = w.step;
    st->momentum_steps = w.momentum_steps;
    for (int32_t t = 0; t < st->num_tensors; ++t) {
        auto it = w.tensors.find(st->tensor_names[t]);
        if (it == w.tensors.end()) continue;  // zero state
        std::memcpy(st->tensors[t], it->second.data(), st->numel * sizeof(float));
    }
    return SX_OK;
}

std::string text(const char *what, sx_status_t st) {
    return std::string(what) + ": " + sx_status_string(st) + " (" + sx_last_error_message() + ")";
}

// Runs sc on threads; rank 0's final params.
std::vector<std::vector<float>> run(const Scenario &sc, const std::string &name) {
    std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(sc.world));
    std::string err = sxtest::run_ranks(sc.world, [&](int r) {
        return sxtest::rank_run(sc, "local://" + name + "-" + std::to_string(getpid()), r, 60000,
                                &got[static_cast<size_t>(r)]);
    });
    if (!err.empty()) fail_msg("%s: %s", name.c_str(), err.c_str());
    return got[0];
}

// The whole state equals the reference's, tensor by tensor, to 1e-6 relative.
std::string compare_state(const WholeState &ws, const sxtest::ReferenceState &ref, const Scenario &sc) {
    if (ws.params.size() != sc.params.size()) return "the gather delivered " + std::to_string(ws.params.size()) + " params";
    for (size_t p = 0; p < sc.params.size(); ++p) {
        const Whole &w = ws.params[p];
        const sx_param_group_desc_t &g = sc.groups[static_cast<size_t>(sc.params[p].group)];
        std::vector<std::string> names;
        if (g.optimizer == SX_OPTIM_SGD) {
            if (g.momentum != 0) names = {"momentum_buffer"};
        } else {
            names = {"exp_avg", "exp_avg_sq"};
            if (g.amsgrad) names.push_back("max_exp_avg_sq");
        }
        if (w.tensors.size() != names.size())
            return sc.params[p].name + ": " + std::to_string(w.tensors.size()) + " tensors, expected " +
                   std::to_string(names.size());
        if (w.step != ref.steps[p] || w.momentum_steps != ref.momentum_steps[p])
            return sc.params[p].name + ": step counts differ";
        for (size_t k = 0; k < names.size(); ++k) {
            auto it = w.tensors.find(names[k]);
            if (it == w.tensors.end()) return sc.params[p].name + " has no " + names[k];
            const std::string c = sxtest::compare({it->second}, {ref.slots[k][p]}, 1e-6);
            if (!c.empty()) return sc.params[p].name + "." + names[k] + ": " + c;
        }
    }
    return "";
}

// Where a consolidation happens or a scattered state continues: the ranks, the mesh
// (shard_size; 0: flat) and the root.
struct Place {
    int world, shard_size, root;
};

// Trained at `at` for 6 steps, the state gathered onto its root equals the reference's;
// scattered from each of `into`'s roots with the params' values, training goes on as the
// reference that changed its world size at that step.
void consolidate_and_continue(int32_t opt, int stage, Place at, const std::vector<Place> &into) {
    Scenario a = sxtest::two_group_scenario(opt);
    a.world = at.world;
    a.shard_size = at.shard_size;
    a.stage = stage;
    a.steps = 6;
    WholeState whole;
    a.after_step = [&](sx_shard_group_t *g, int rank, int step) -> std::string {
        if (step != a.steps) return "";
        const sx_status_t st = sx_gather_optim_state(g, at.root, rank == at.root ? collect : nullptr, &whole);
        return st == SX_OK ? "" : text("sx_gather_optim_state", st);
    };
    const std::string tag = std::to_string(opt) + "-" + std::to_string(stage) + "-" + std::to_string(at.world) + "x" +
                            std::to_string(at.shard_size);
    const std::vector<std::vector<float>> values = run(a, "whole-save-" + tag);
    sxtest::ReferenceState ref;
    const std::vector<std::vector<float>> want = sxtest::reference_run(a, &ref);
    std::string err = sxtest::compare(values, want, 1e-6);
    if (err.empty()) err = compare_state(whole, ref, a);
    if (!err.empty()) fail_msg("optimizer %d stage %d, the state gathered at %s: %s", opt, stage, tag.c_str(), err.c_str());
    assert_int_equal(whole.calls, static_cast<int>(a.params.size()));

    for (const Place &p : into) {
        Scenario b = a;
        b.after_step = nullptr;
        b.world = p.world;
        b.shard_size = p.shard_size;
        b.world_before = at.world;
        b.first_step = 7;
        b.steps = 10;
        WholeState given = whole;
        b.after_setup = [&](sx_shard_group_t *g, int rank) -> std::string {
            // The values of step 6, through gathered units at stage 3.
            int32_t units = 0;
            sx_get_num_units(g, &units);
            for (int32_t u = 0; u < units && stage == 3; ++u) sx_unit_gather(g, u);
            for (size_t q = 0; q < values.size(); ++q) {
                sx_view_t v;
                sx_view_init(&v, sizeof v);
                if (sx_param_view(g, static_cast<int32_t>(q), &v) != SX_OK) return text("view", SX_ERR_INTERNAL);
                std::memcpy(v.data, values[q].data(), values[q].size() * sizeof(float));
            }
            for (int32_t u = 0; u < units && stage == 3; ++u) sx_unit_release(g, u);
            const sx_status_t st = sx_scatter_optim_state(g, p.root, rank == p.root ? provide : nullptr, &given);
            return st == SX_OK ? "" : text("sx_scatter_optim_state", st);
        };
        const std::string where = std::to_string(p.world) + "x" + std::to_string(p.shard_size) + "-" +
                                  std::to_string(p.root);
        err = sxtest::run_threads_and_compare(b, "whole-load-" + tag + "-" + where + "-" + std::to_string(getpid()),
                                              1e-6);
        if (!err.empty())
            fail_msg("optimizer %d stage %d, gathered at %s, continued at %s: %s", opt, stage, tag.c_str(),
                     where.c_str(), err.c_str());
    }
}

// Consolidated at world size 3 after 6 steps, the state equals the reference's; scattered
// into 2 ranks and into 1, with the params' values, training goes on as the reference
// that changed its world size at that step.
void test_consolidate_at_3_and_continue_at_2_and_1(void **) {
    for (int32_t opt : {SX_OPTIM_ADAMW, SX_OPTIM_SGD, SX_OPTIM_ADAM})
        for (int stage = 1; stage <= 3; ++stage) consolidate_and_continue(opt, stage, {3, 0, 1}, {{2, 0, 0}, {1, 0, 0}});
}

// On meshes: gathered onto rank 3 of a 2 x 2 mesh (the second replica group), scattered
// from rank 4 of a 3 x 2 mesh (6 ranks) and from rank 1 of 2 flat ranks.
void test_consolidate_and_scatter_on_meshes(void **) {
    for (int stage = 1; stage <= 3; ++stage)
        consolidate_and_continue(SX_OPTIM_ADAMW, stage, {4, 2, 3}, {{6, 3, 4}, {2, 0, 1}});
    consolidate_and_continue(SX_OPTIM_SGD, 2, {4, 1, 2}, {{4, 2, 1}});
}

// A group of two ranks with one bf16 param (AdamW) and one fp32 param (SGD with
// momentum), after `steps` steps of known gradients.
struct Pair {
    sx_shard_group_t *g = nullptr;
    ~Pair() { sx_destroy_shard_group(g); }
};

std::string make_pair(const std::string &rv, int rank, int steps, Pair *out) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = 2;
    cfg.num_threads = 1;
    cfg.timeout_ms = 20000;
    if (sx_create_shard_group(&cfg, &out->g) != SX_OK) return text("create", SX_ERR_INTERNAL);
    sx_param_group_desc_t a, b;
    sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_ADAMW);
    sx_param_group_desc_init(&b, sizeof b, SX_OPTIM_SGD);
    b.momentum = 0.9;
    sx_add_param_group(out->g, &a, nullptr);
    sx_add_param_group(out->g, &b, nullptr);
    const int64_t shapes[3] = {301, 77, 5};
    const char *names[3] = {"half", "full", "late"};
    for (int p = 0; p < 3; ++p) {
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = names[p];
        d.ndim = 1;
        d.shape = &shapes[p];
        d.dtype = p == 0 ? SX_DTYPE_BF16 : SX_DTYPE_F32;
        d.param_group = p == 1 ? 1 : 0;
        d.unit = p;
        d.frozen = p == 2;  // never trainable: no state
        if (sx_add_param(out->g, &d, nullptr) != SX_OK) return text("add_param", SX_ERR_INTERNAL);
    }
    if (sx_finalize(out->g) != SX_OK) return text("finalize", SX_ERR_INTERNAL);
    for (int s = 1; s <= steps; ++s) {
        for (int32_t p = 0; p < 2; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            sx_grad_view(out->g, p, &v);
            for (uint64_t i = 0; i < v.numel; ++i) {
                const float x = static_cast<float>((static_cast<int>(i) * 7 + s * 3 + rank) % 13 - 6) / 16.0f;
                if (p == 0)
                    static_cast<uint16_t *>(v.data)[i] = sx::half::f32_to_bf16(x);
                else
                    static_cast<float *>(v.data)[i] = x;
            }
        }
        if (sx_step(out->g, nullptr, nullptr) != SX_OK) return text("step", SX_ERR_INTERNAL);
    }
    return "";
}

// Ranks naming different roots disagree; the gather delivers "master" for the bf16
// param (whose rounding is the param), nothing for a param that never had state; views of a rank's own part equal the gathered
// state's slice; a seed written through a view shows in the next gather; a scatter of
// changed masters changes the bf16 params on every rank.
void test_masters_and_views(void **) {
    const std::string rv = "local://whole-views-" + std::to_string(getpid());
    const std::string err = sxtest::run_ranks(2, [&](int r) -> std::string {
        Pair pr;
        std::string e = make_pair(rv, r, 3, &pr);
        if (!e.empty()) return e;
        sx_shard_group_t *g = pr.g;
        // Ranks that name different roots disagree, and every one is told so.
        WholeState ws;
        sx_status_t st = sx_gather_optim_state(g, r, collect, &ws);
        if (st != SX_ERR_MISMATCH || !std::strstr(sx_last_error_message(), "root"))
            return text("two roots", st);
        // A root without a callback fails the call on every rank (the others do not wait).
        if ((st = sx_gather_optim_state(g, 0, nullptr, nullptr)) != SX_ERR_INVALID_ARGUMENT)
            return text("a gather with no callback on the root", st);
        if ((st = sx_scatter_optim_state(g, 1, nullptr, nullptr)) != SX_ERR_INVALID_ARGUMENT)
            return text("a scatter with no callback on the root", st);
        st = sx_gather_optim_state(g, 0, r == 0 ? collect : nullptr, &ws);
        if (st != SX_OK) return text("gather", st);
        if (r == 0) {
            if (ws.params.size() != 3) return "not every param was delivered";
            const Whole &half = ws.params[0], &full = ws.params[1], &late = ws.params[2];
            if (half.tensors.size() != 3 || !half.tensors.count("master") || !half.tensors.count("exp_avg"))
                return "the bf16 param's tensors are not exp_avg, exp_avg_sq and master";
            if (full.tensors.size() != 1 || !full.tensors.count("momentum_buffer") || full.momentum_steps != 3)
                return "the fp32 SGD param's state is not its momentum buffer after 3 updates";
            if (!late.tensors.empty() || late.step != 0) return "a param that never had state delivered some";
            if (half.step != 3) return "the bf16 param's step count is not 3";
        }
        // This rank's own parts in place, against the gathered state (rank 0 has it).
        sx_param_info_t info;
        sx_param_info_init(&info, sizeof info);
        sx_get_param_info(g, 1, &info);
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        if ((st = sx_state_view(g, 1, "momentum_buffer", &v)) != SX_OK) return text("state view", st);
        if (v.numel != info.shard_end - info.shard_begin || v.dtype != SX_DTYPE_F32) return "the view's extent";
        if (r == 0)
            for (uint64_t i = 0; i < v.numel; ++i)
                if (static_cast<float *>(v.data)[i] != ws.params[1].tensors["momentum_buffer"][info.shard_begin + i])
                    return "the view differs from the gathered state";
        // A seed through the view shows in the next gather.
        for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = 0.25f * static_cast<float>(r + 1);
        if ((st = sx_state_view(g, 1, "exp_avg", &v)) != SX_ERR_INVALID_ARGUMENT ||
            !std::strstr(sx_last_error_message(), "momentum_buffer"))
            return text("an SGD param's exp_avg", st);
        if ((st = sx_state_view(g, 2, "exp_avg", &v)) != SX_ERR_INVALID_STATE) return text("a param without state", st);
        if ((st = sx_state_view(g, 1, "master", &v)) != SX_ERR_INVALID_ARGUMENT) return text("an fp32 param's master", st);
        if ((st = sx_state_view(g, 0, "master", &v)) != SX_OK) return text("the bf16 master", st);
        if ((st = sx_state_view(g, 7, "exp_avg", &v)) != SX_ERR_INVALID_ARGUMENT) return text("param 7", st);
        WholeState again;
        st = sx_gather_optim_state(g, 1, r == 1 ? collect : nullptr, &again);
        if (st != SX_OK) return text("gather again", st);
        if (r == 1) {
            sx_get_param_info(g, 1, &info);  // rank 1's part; rank 0 holds the rest
            const std::vector<float> &m = again.params[1].tensors["momentum_buffer"];
            for (size_t i = 0; i < m.size(); ++i) {
                const float want = i >= info.shard_begin && i < info.shard_end ? 0.5f : 0.25f;
                if (m[i] != want) return "a seed written through a view did not show in the gather";
            }
        }
        // Scatter masters shifted by 1: every rank's bf16 param is the rounding of them.
        if (r == 0)
            for (float &x : ws.params[0].tensors["master"]) x += 1.0f;
        st = sx_scatter_optim_state(g, 0, r == 0 ? provide : nullptr, &ws);
        if (st != SX_OK) return text("scatter", st);
        WholeState after;
        st = sx_gather_optim_state(g, 0, r == 0 ? collect : nullptr, &after);
        if (st != SX_OK) return text("gather after", st);
        sx_param_view(g, 0, &v);
        if (r == 0) {
            const std::vector<float> &m = after.params[0].tensors["master"];
            if (m != ws.params[0].tensors["master"]) return "the scattered masters did not arrive";
            for (size_t i = 0; i < m.size(); ++i) {
                uint32_t bits;
                std::memcpy(&bits, &m[i], 4);
                const uint16_t want = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
                if (static_cast<uint16_t *>(v.data)[i] != want) return "a bf16 param is not its new master rounded";
            }
        }
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// A view of a 16-bit param's "master" before the first step shows the params widened
// (the masters are fixed then, as the first step would), and what is written into it is
// what the step updates: an fp32 seed finer than bf16 survives the step, and the params
// become its rounding.
void test_masters_seeded_through_a_view(void **) {
    const std::string rv = "local://master-seed-" + std::to_string(getpid());
    const std::string err = sxtest::run_ranks(2, [&](int r) -> std::string {
        Pair pr;
        std::string e = make_pair(rv, r, 0, &pr);
        if (!e.empty()) return e;
        sx_shard_group_t *g = pr.g;
        sx_view_t pv, mv;
        sx_view_init(&pv, sizeof pv);
        sx_view_init(&mv, sizeof mv);
        sx_param_view(g, 0, &pv);
        auto value = [](uint64_t i) { return 1.0f + static_cast<float>(i % 17) / 8.0f; };
        for (uint64_t i = 0; i < pv.numel; ++i) static_cast<uint16_t *>(pv.data)[i] = sx::half::f32_to_bf16(value(i));
        sx_status_t st = sx_state_view(g, 0, "master", &mv);
        if (st != SX_OK) return text("the master view before the first step", st);
        sx_param_info_t info;
        sx_param_info_init(&info, sizeof info);
        sx_get_param_info(g, 0, &info);
        if (mv.numel != info.shard_end - info.shard_begin || mv.numel == 0) return "the master view's extent";
        float *m = static_cast<float *>(mv.data);
        for (uint64_t i = 0; i < mv.numel; ++i)
            if (m[i] != value(info.shard_begin + i)) return "the master view does not show the params widened";
        // Seeds between bf16's steps (1/128 apart at 1..2, 1/64 at 2..4): not the params'.
        const float fine = 1.0f / 1024.0f;
        for (uint64_t i = 0; i < mv.numel; ++i) m[i] = value(info.shard_begin + i) + fine;
        // A step with zero gradients: AdamW moves a master by its weight decay alone,
        // lr x wd = 1e-5 of it, far less than the seed's offset.
        if ((st = sx_step(g, nullptr, nullptr)) != SX_OK) return text("step", st);
        if ((st = sx_state_view(g, 0, "master", &mv)) != SX_OK) return text("the master view after the step", st);
        m = static_cast<float *>(mv.data);
        for (uint64_t i = 0; i < mv.numel; ++i) {
            const float seed = value(info.shard_begin + i) + fine;
            if (std::fabs(m[i] - seed) > 2e-5f * seed) return "the seeded master was not what the step updated";
            if (static_cast<uint16_t *>(pv.data)[info.shard_begin + i] != sx::half::f32_to_bf16(m[i]))
                return "a bf16 param is not its master rounded after the step";
        }
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// A callback that fails: a scatter fails on every rank at the root's failing param and
// changes nothing on any; a gather fails on every rank.
void test_a_failing_callback_changes_nothing(void **) {
    // Three ranks through the scenario machinery: state after 4 steps, then a scatter whose
    // root fails at param 3, then a gather whose root fails at param 1.
    Scenario sc = sxtest::two_group_scenario(SX_OPTIM_ADAMW);
    sc.world = 3;
    sc.steps = 4;
    std::vector<WholeState> before(3), after(3);
    std::vector<std::string> messages(3);
    std::mutex mu;
    sc.after_step = [&](sx_shard_group_t *g, int rank, int step) -> std::string {
        if (step != sc.steps) return "";
        WholeState &b = before[static_cast<size_t>(rank)];
        sx_status_t st = sx_gather_optim_state(g, 2, rank == 2 ? collect : nullptr, &b);
        if (st != SX_OK) return text("gather", st);
        WholeState bad = b;
        bad.calls = 0;
        bad.fail_at = 3;
        for (auto &p : bad.params)
            for (auto &t : p.tensors)
                for (float &x : t.second) x += 100.0f;
        st = sx_scatter_optim_state(g, 2, rank == 2 ? provide : nullptr, &bad);
        if (st == SX_OK) return "a scatter whose callback failed succeeded";
        {
            std::lock_guard<std::mutex> lock(mu);
            messages[static_cast<size_t>(rank)] = sx_last_error_message();
        }
        if (rank == 2 && bad.calls != 4) return "the root's callback was called after it failed";
        WholeState &a = after[static_cast<size_t>(rank)];
        st = sx_gather_optim_state(g, 2, rank == 2 ? collect : nullptr, &a);
        if (st != SX_OK) return text("gather after", st);
        WholeState failing;
        failing.fail_at = 1;
        st = sx_gather_optim_state(g, 2, rank == 2 ? collect : nullptr, &failing);
        if (st != SX_ERR_CANCELLED) return text("a gather whose callback failed", st);
        if (rank == 2 && failing.calls != 2) return "the gather's callback was called after it failed";
        return "";
    };
    const std::string e = sxtest::run_threads_and_compare(sc, "whole-fail-run-" + std::to_string(getpid()), 1e-6);
    if (!e.empty()) fail_msg("%s", e.c_str());
    assert_int_equal(before[2].params.size(), after[2].params.size());
    for (size_t p = 0; p < before[2].params.size(); ++p) {
        assert_true(before[2].params[p].tensors == after[2].params[p].tensors);
        assert_true(before[2].params[p].step == after[2].params[p].step);
    }
    for (int r = 0; r < 3; ++r) {
        if (!std::strstr(messages[r].c_str(), "embed.bias") && !std::strstr(messages[r].c_str(), "block.scale") &&
            !std::strstr(messages[r].c_str(), "callback"))
            fail_msg("rank %d's message does not say what failed: %s", r, messages[r].c_str());
    }
}

// ---------------------------------------------------------------------------------
// The root's memory (ranks as processes): 12 params of 256 Ki elements with AdamW, 2 MiB
// of state each, 24 MiB in all; the root's peak resident memory during a gather grows by
// less than one param's state plus a slack, where holding the whole state would take 24.

uint64_t status_kib(const char *key) {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.compare(0, std::strlen(key), key) == 0) return std::strtoull(line.c_str() + std::strlen(key), nullptr, 10);
    return 0;
}

int child_main(int argc, char **argv) {
    sxtest::ChildArgs args;
    if (!sxtest::parse_child_args(argc, argv, &args)) return 2;
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = args.rendezvous.c_str();
    cfg.rank = args.rank;
    cfg.world_size = args.world;
    cfg.num_threads = 1;
    cfg.timeout_ms = 60000;
    sx_shard_group_t *g = nullptr;
    if (sx_create_shard_group(&cfg, &g) != SX_OK) return 3;
    sx_param_group_desc_t a;
    sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_ADAMW);
    sx_add_param_group(g, &a, nullptr);
    const int64_t n = 256 * 1024;
    for (int p = 0; p < 12; ++p) {
        const std::string name = "w" + std::to_string(p);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = name.c_str();
        d.ndim = 1;
        d.shape = &n;
        d.unit = p;
        sx_add_param(g, &d, nullptr);
    }
    if (sx_finalize(g) != SX_OK || sx_step(g, nullptr, nullptr) != SX_OK) return 4;
    struct Sums {
        int params = 0;
        double total = 0;
    } sums;
    auto sum = [](sx_param_state_t *st, void *user) -> sx_status_t {
        Sums *s = static_cast<Sums *>(user);
        ++s->params;
        for (int32_t t = 0; t < st->num_tensors; ++t)
            for (uint64_t i = 0; i < st->numel; ++i) s->total += st->tensors[t][i];
        return SX_OK;
    };
    // The peak so far is forgotten (Linux: "5" to clear_refs resets VmHWM to VmRSS).
    std::ofstream("/proc/self/clear_refs") << "5";
    const uint64_t rss = status_kib("VmRSS:");
    const sx_status_t st = sx_gather_optim_state(g, 0, args.rank == 0 ? +sum : nullptr, &sums);
    const uint64_t growth = status_kib("VmHWM:") - rss;
    sx_destroy_shard_group(g);
    if (st != SX_OK) {
        std::fprintf(stderr, "rank %d: gather: %s\n", args.rank, sx_last_error_message());
        return 5;
    }
    if (args.rank != 0) return 0;
    const uint64_t one_param_kib = 2 * 256 * 4, slack_kib = 4 * 1024;
    std::printf("root: %d params gathered, peak resident memory grew by %llu KiB (one param's state: %llu KiB)\n",
                sums.params, static_cast<unsigned long long>(growth), static_cast<unsigned long long>(one_param_kib));
    if (sums.params != 12) return 6;
    return growth <= one_param_kib + slack_kib ? 0 : 7;
}

void test_the_roots_memory_stays_within_one_param(void **) {
    std::vector<sxtest::ProcessResult> results;
    const std::string err = sxtest::run_process_ranks(3, {}, 120, &results);
    if (!err.empty()) fail_msg("%s (root exit code %d: 7 = over the bound)", err.c_str(), results.empty() ? -1 : results[0].exit_code);
}

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_consolidate_at_3_and_continue_at_2_and_1),
        cmocka_unit_test(test_consolidate_and_scatter_on_meshes),
        cmocka_unit_test(test_masters_and_views),
        cmocka_unit_test(test_masters_seeded_through_a_view),
        cmocka_unit_test(test_a_failing_callback_changes_nothing),
        cmocka_unit_test(test_the_roots_memory_stays_within_one_param),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
