#include "every_optimizer_io.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "every_optimizer.h"

namespace sxgolden3 {
namespace {

std::string failed(const char *what) { return std::string(what) + ": " + sx_last_error_message(); }

int32_t optimizer_of(int p) { return groups()[static_cast<size_t>(params()[static_cast<size_t>(p)].group)].optimizer; }

// The steps param group k took: the steps taken before the state was written; but LAMB
// and AdEMAMix count theirs per group (their bias corrections' t), which a scatter sets
// to the most any of the group's params was given.
int64_t group_steps(size_t k) {
    const int32_t opt = groups()[k].optimizer;
    if (opt != SX_OPTIM_LAMB && opt != SX_OPTIM_ADEMAMIX) return kSteps;
    int64_t most = 0;
    for (size_t q = 0; q < params().size(); ++q)
        if (params()[q].group == static_cast<int>(k)) most = std::max(most, step_of(static_cast<int>(q)));
    return most;
}

// A group of the model on `rank`: the registered optimizer, the param groups with their
// hyperparameters, the params, finalized. "" or what failed.
std::string build(const std::string &rv, int rank, int world, int stage, int shard, bool split_units,
                  sx_shard_group_t **out) {
    const int32_t custom = register_custom();
    if (custom < 0) return failed("sx_register_optimizer");
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.stage = stage;
    cfg.shard_size = shard;
    cfg.num_threads = 1;
    if (sx_create_shard_group(&cfg, out) != SX_OK) return failed("sx_create_shard_group");
    sx_shard_group_t *g = *out;
    for (size_t k = 0; k < groups().size(); ++k) {
        const GroupDef &def = groups()[k];
        sx_param_group_desc_t d;
        sx_param_group_desc_init(&d, sizeof d, def.optimizer == kCustom ? custom : def.optimizer);
        if (sx_add_param_group(g, &d, nullptr) != SX_OK) return failed("sx_add_param_group");
        for (const auto &kv : def.hypers)
            if (sx_set_hyperparameter(g, static_cast<int32_t>(k), kv.first, kv.second) != SX_OK)
                return failed("sx_set_hyperparameter");
    }
    for (size_t p = 0; p < params().size(); ++p) {
        const ParamDef &def = params()[p];
        sx_param_desc_t pd;
        sx_param_desc_init(&pd, sizeof pd);
        pd.name = def.name.c_str();
        pd.ndim = static_cast<int32_t>(def.shape.size());
        pd.shape = def.shape.data();
        pd.param_group = def.group;
        pd.unit = split_units ? static_cast<int32_t>(p) : def.unit;
        if (sx_add_param(g, &pd, nullptr) != SX_OK) return failed("sx_add_param");
    }
    return sx_finalize(g) == SX_OK ? "" : failed("sx_finalize");
}

// Stage 3: gathers (or releases) every unit, so that the params' views exist.
std::string all_units(sx_shard_group_t *g, int stage, bool gather) {
    int32_t units = 0;
    sx_get_num_units(g, &units);
    for (int32_t u = 0; u < units && stage == 3; ++u)
        if ((gather ? sx_unit_gather(g, u) : sx_unit_release(g, u)) != SX_OK) return failed("sx_unit_gather/release");
    return "";
}

// Scatter: every param's state, step counts and mu_product by formula.
sx_status_t fill_state(sx_param_state_t *st, void *) {
    for (int32_t k = 0; k < st->num_tensors; ++k)
        for (uint64_t i = 0; i < st->tensor_numels[k]; ++i) st->tensors[k][i] = value(st->param, st->tensor_names[k], i);
    st->step = step_of(st->param);
    st->momentum_steps = optimizer_of(st->param) == SX_OPTIM_SGD ? st->step : 0;
    st->mu_product = optimizer_of(st->param) == SX_OPTIM_NADAM ? mu_product_of(st->param) : 0.0;
    return SX_OK;
}

std::string write_rank(const std::string &out, int rank, int world, int stage, int shard) {
    sx_shard_group_t *g = nullptr;
    std::string e = build("local://golden3-write", rank, world, stage, shard, false, &g);
    // Steps first (the checkpoint's and the groups' step counts), then every value and
    // state by formula.
    for (int s = 1; s <= kSteps && e.empty(); ++s) {
        for (size_t p = 0; p < params().size(); ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            sx_grad_view(g, static_cast<int32_t>(p), &v);  // a view of every param after sx_finalize
            for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = grad_of(static_cast<int>(p), s, i);
        }
        if (sx_step(g, nullptr, nullptr) != SX_OK) e = failed("sx_step");
    }
    if (e.empty() && sx_scatter_optim_state(g, 0, rank == 0 ? fill_state : nullptr, nullptr) != SX_OK)
        e = failed("sx_scatter_optim_state");
    if (e.empty()) e = all_units(g, stage, true);
    for (size_t p = 0; p < params().size() && e.empty(); ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        if (sx_param_view(g, static_cast<int32_t>(p), &v) != SX_OK) e = failed("sx_param_view");
        for (uint64_t i = 0; e.empty() && i < v.numel; ++i)
            static_cast<float *>(v.data)[i] = value(static_cast<int>(p), "param", i);
    }
    if (e.empty()) e = all_units(g, stage, false);
    if (e.empty()) {
        sx_save_options_t so;
        sx_save_options_init(&so, sizeof so);
        so.path = out.c_str();
        so.user_blob = kUserBlob;
        so.user_blob_size = std::strlen(kUserBlob);
        so.synchronous = 1;
        sx_future_t *f = nullptr;
        if (sx_save_optim_state(g, &so, &f) != SX_OK || sx_future_wait(f, -1) != SX_OK)
            e = std::string("save: ") + (f ? sx_future_error_message(f) : sx_last_error_message());
        sx_future_destroy(f);
    }
    sx_destroy_shard_group(g);
    return e;
}

// Gather: every tensor a param keeps, each equal to its formula, and its step counts.
sx_status_t check_state(sx_param_state_t *st, void *user) {
    std::string &e = *static_cast<std::string *>(user);
    const int p = st->param;
    std::vector<std::string> names(st->tensor_names, st->tensor_names + st->num_tensors), want = expected_tensors(p);
    std::sort(names.begin(), names.end());
    std::sort(want.begin(), want.end());
    if (names != want) e = params()[static_cast<size_t>(p)].name + " keeps other state tensors than it was saved with";
    for (int32_t k = 0; k < st->num_tensors && e.empty(); ++k)
        for (uint64_t i = 0; i < st->tensor_numels[k]; ++i)
            if (st->tensors[k][i] != value(p, st->tensor_names[k], i)) {
                e = std::string("state ") + st->tensor_names[k] + " of " + params()[static_cast<size_t>(p)].name +
                    " differs at " + std::to_string(i);
                break;
            }
    const bool sgd = optimizer_of(p) == SX_OPTIM_SGD, nadam = optimizer_of(p) == SX_OPTIM_NADAM;
    if (e.empty() && (st->step != step_of(p) || st->momentum_steps != (sgd ? st->step : 0)))
        e = "the step counts of " + params()[static_cast<size_t>(p)].name + " differ";
    if (e.empty() && nadam && st->mu_product != mu_product_of(p))
        e = "the mu_product of " + params()[static_cast<size_t>(p)].name + " differs";
    return e.empty() ? SX_OK : SX_ERR_CORRUPT;
}

std::string check_rank(sx_shard_group_t *g, const std::string &dir, int rank, int stage) {
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = dir.c_str();
    if (sx_load_optim_state(g, &lo) != SX_OK) return failed("sx_load_optim_state");
    std::string e = all_units(g, stage, true);
    for (size_t p = 0; p < params().size() && e.empty(); ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        if (sx_param_view(g, static_cast<int32_t>(p), &v) != SX_OK) e = failed("sx_param_view");
        for (uint64_t i = 0; i < v.numel && e.empty(); ++i)
            if (static_cast<float *>(v.data)[i] != value(static_cast<int>(p), "param", i))
                e = "the value of " + params()[p].name + " differs";
    }
    const std::string released = all_units(g, stage, false);
    if (e.empty()) e = released;
    for (size_t k = 0; k < groups().size() && e.empty(); ++k)
        for (const auto &kv : groups()[k].hypers) {
            double got = 0;
            if (sx_get_hyperparameter(g, static_cast<int32_t>(k), kv.first, &got) != SX_OK || got != kv.second)
                e = "hyperparameter " + std::to_string(kv.first) + " of param group " + std::to_string(k) + " differs";
        }
    for (size_t k = 0; k < groups().size() && e.empty(); ++k) {
        int64_t steps = -1;
        if (sx_get_param_group_steps(g, static_cast<int32_t>(k), &steps) != SX_OK || steps != group_steps(k))
            e = "the step count of param group " + std::to_string(k) + " differs";
    }
    std::string state_error;
    if (sx_gather_optim_state(g, 0, rank == 0 ? check_state : nullptr, &state_error) != SX_OK && e.empty())
        e = state_error.empty() ? failed("sx_gather_optim_state") : state_error;
    return e;
}

}  // namespace

std::vector<std::string> expected_tensors(int p) {
    const ParamDef &def = params()[static_cast<size_t>(p)];
    switch (optimizer_of(p)) {
        case SX_OPTIM_SGD: return {"momentum_buffer"};
        case SX_OPTIM_ADAM: return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
        case SX_OPTIM_ADAGRAD: return {"sum"};
        case SX_OPTIM_RMSPROP: return {"square_avg", "momentum_buffer", "grad_avg"};
        case SX_OPTIM_ADAMAX: return {"exp_avg", "exp_inf"};
        case SX_OPTIM_LION: return {"exp_avg"};
        case SX_OPTIM_MUON: return {"momentum_buffer"};
        case SX_OPTIM_ADAFACTOR:
            return def.shape.size() >= 2 ? std::vector<std::string>{"row_var", "col_var"}
                                         : std::vector<std::string>{"variance"};
        case SX_OPTIM_ADEMAMIX: return {"exp_avg", "exp_avg_sq", "exp_avg_slow"};
        case kCustom: return {"velocity", "trace"};
        default: return {"exp_avg", "exp_avg_sq"};  // AdamW, NAdam, RAdam, Lamb
    }
}

std::string write(const std::string &out, int world, int stage, int shard) {
    std::vector<std::string> errs(static_cast<size_t>(world));
    std::vector<std::thread> ts;
    for (int r = 0; r < world; ++r)
        ts.emplace_back([&, r] { errs[static_cast<size_t>(r)] = write_rank(out, r, world, stage, shard); });
    for (auto &t : ts) t.join();
    for (int r = 0; r < world; ++r)
        if (!errs[static_cast<size_t>(r)].empty()) return "rank " + std::to_string(r) + ": " + errs[static_cast<size_t>(r)];
    return "";
}

std::string load_and_check(const std::string &dir, int world, int shard, int stage, bool split_units) {
    std::vector<std::string> errs(static_cast<size_t>(world));
    std::vector<std::thread> ts;
    const std::string rv = "local://golden3-" + std::to_string(world) + "x" + std::to_string(shard) +
                           (split_units ? "s" : "") + "-" + std::to_string(stage);
    for (int r = 0; r < world; ++r)
        ts.emplace_back([&, r] {
            sx_shard_group_t *g = nullptr;
            std::string &e = errs[static_cast<size_t>(r)];
            e = build(rv, r, world, stage, shard, split_units, &g);
            if (e.empty()) e = check_rank(g, dir, r, stage);
            sx_destroy_shard_group(g);
        });
    for (auto &t : ts) t.join();
    for (int r = 0; r < world; ++r)
        if (!errs[static_cast<size_t>(r)].empty()) return "rank " + std::to_string(r) + ": " + errs[static_cast<size_t>(r)];
    return "";
}

}  // namespace sxgolden3
