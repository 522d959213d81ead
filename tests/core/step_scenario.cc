#include "step_scenario.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/params.h"
#include "optim/optimizer.h"

namespace sxtest {

uint64_t numel(const ParamDef &p) {
    uint64_t n = 1;
    for (int64_t d : p.shape) n *= static_cast<uint64_t>(d);
    return n;
}

namespace {

uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

bool added_later(const Scenario &sc, int step, int p) {
    return sc.add_after_step > 0 && static_cast<size_t>(p) >= sc.added_params_from && step <= sc.add_after_step;
}

bool is_trainable(const Scenario &sc, int step, int p) {
    return !added_later(sc, step, p) && (!sc.trainable || sc.trainable(step, p));
}

}  // namespace

float initial_value(int p, uint64_t i) {
    return static_cast<float>(static_cast<int64_t>(mix(p * 1000003ull + i) % 2001) - 1000) / 1000.0f;
}

float gradient(int rank, int step, int micro, int p, uint64_t i) {
    uint64_t h = mix((((static_cast<uint64_t>(rank) * 131 + step) * 17 + micro) * 1000003ull + p) *
                         2654435761ull + i);
    return static_cast<float>(static_cast<int64_t>(h % 129) - 64) / 64.0f;
}

sx_param_group_desc_t group_desc(int32_t optimizer, double lr) {
    sx_param_group_desc_t d;
    sx_param_group_desc_init(&d, sizeof d, optimizer);
    d.lr = lr;
    return d;
}

Scenario two_group_scenario(int32_t optimizer) {
    Scenario sc;
    sx_param_group_desc_t a = group_desc(optimizer, 0.01);
    sx_param_group_desc_t b = group_desc(optimizer, 0.003);
    switch (optimizer) {
        case SX_OPTIM_SGD:
            a.momentum = 0.5, a.dampening = 0.1, a.weight_decay = 0.01;
            b.momentum = 0.9, b.nesterov = 1, b.maximize = 1;
            break;
        case SX_OPTIM_ADAM:
            a.weight_decay = 0.01, a.amsgrad = 1;
            b.beta1 = 0.8, b.beta2 = 0.99, b.eps = 1e-6;
            break;
        default:
            a.weight_decay = 0.1;
            b.amsgrad = 1, b.weight_decay = 0.0, b.maximize = 1;
            break;
    }
    sc.groups = {a, b};
    sc.params = {
        {"embed.weight", {13, 7}, 0, 0},
        {"embed.bias", {3}, 1, 0},
        {"block.w", {33, 5}, 1, 1},
        {"block.scale", {}, 0, 1},
        {"head.weight", {1000}, 0, 4},
    };
    sc.max_grad_norm = 5.0;
    return sc;
}

// Freeze "block.w" after step 3 and unfreeze it after step 6; the whole unit 4 is frozen
// for steps 2-5; "embed.bias" starts frozen and is unfrozen at step 5.
Scenario eight_unit_scenario() {
    Scenario sc = two_group_scenario(SX_OPTIM_ADAMW);
    sc.params.clear();
    for (int u = 0; u < 8; ++u) {
        sc.params.push_back({"u" + std::to_string(u) + ".w", {17 + 29 * u, 3}, u % 2, u * 2});
        sc.params.push_back({"u" + std::to_string(u) + ".b", {u + 1}, 0, u * 2});
    }
    sc.steps = 6;
    return sc;
}

Scenario late_group_scenario(int32_t optimizer, int after) {
    Scenario sc = two_group_scenario(optimizer);
    sx_param_group_desc_t c = group_desc(optimizer == SX_OPTIM_SGD ? SX_OPTIM_ADAMW : SX_OPTIM_SGD, 0.02);
    if (optimizer == SX_OPTIM_SGD) {
        c.amsgrad = 1;
    } else {
        c.momentum = 0.7;
    }
    sc.added_groups_from = sc.groups.size();
    sc.added_params_from = sc.params.size();
    sc.groups.push_back(c);
    sc.params.push_back({"late.w", {17, 3}, 2, 5});
    sc.params.push_back({"late.b", {5}, 2, 5});
    sc.params.push_back({"late.extra", {40}, 0, 7});
    sc.add_after_step = after;
    return sc;
}

bool freeze_schedule(int step, int p) {
    if (p == 2) return !(step >= 4 && step <= 6);
    if (p == 4) return !(step >= 2 && step <= 5);
    if (p == 1) return step >= 5;
    return true;
}

std::vector<std::vector<float>> reference_run(const Scenario &sc, ReferenceState *out_state) {
    const size_t np = sc.params.size();
    std::vector<std::vector<float>> w(np), g(np);
    std::vector<std::vector<float>> state[3];
    for (auto &s : state) s.resize(np);
    std::vector<int64_t> steps(np, 0), momentum_steps(np, 0);
    std::vector<sx::optim::Hyper> hyper;
    for (const auto &d : sc.groups) hyper.push_back(sx::core::hyper_from_desc(d));
    for (size_t p = 0; p < np; ++p) {
        const uint64_t n = numel(sc.params[p]);
        w[p].resize(n);
        for (uint64_t i = 0; i < n; ++i) w[p][i] = initial_value(static_cast<int>(p), i);
        g[p].resize(n);
        for (auto &s : state) s[p].assign(n, 0.0f);
    }
    for (int s = 1; s <= sc.steps; ++s) {
        const int world = sc.world_of_step ? sc.world_of_step(s)
                          : s < sc.first_step && sc.world_before > 0 ? sc.world_before
                                                                     : sc.world;
        const float average = 1.0f / static_cast<float>(world);
        for (size_t p = 0; p < np; ++p) {
            const uint64_t n = w[p].size();
            for (uint64_t i = 0; i < n; ++i) {
                float sum = 0.0f;
                for (int r = 0; r < world; ++r)
                    for (int m = 0; m < sc.micro_batches; ++m)
                        sum += gradient(sc.same_grads_on_every_rank ? 0 : r, s, m, static_cast<int>(p), i);
                g[p][i] = sum;
            }
        }
        double coef = 1.0;
        if (sc.max_grad_norm > 0) {
            double sumsq = 0.0;
            for (size_t p = 0; p < np; ++p) {
                if (!is_trainable(sc, s, static_cast<int>(p))) continue;
                for (float v : g[p]) {
                    const double a = static_cast<double>(v * average);
                    sumsq += a * a;
                }
            }
            const double norm = std::sqrt(sumsq);
            coef = std::min(1.0, sc.max_grad_norm / (norm + 1e-6));
        }
        for (size_t p = 0; p < np; ++p) {
            if (!is_trainable(sc, s, static_cast<int>(p))) continue;
            const sx::optim::Hyper &h = hyper[sc.params[p].group];
            sx::optim::Segment seg;
            seg.param = w[p].data();
            seg.grad = g[p].data();
            for (int k = 0; k < 3; ++k) seg.state[k] = state[k][p].data();
            seg.n = w[p].size();
            seg.hyper = &h;
            seg.step = (h.kind == sx::optim::Kind::kSgd ? momentum_steps[p] : steps[p]) + 1;
            sx::optim::reference_update(seg, static_cast<float>(coef / world));
            ++steps[p];
            if (h.kind == sx::optim::Kind::kSgd && h.momentum != 0) ++momentum_steps[p];
        }
    }
    if (out_state) {
        for (int k = 0; k < 3; ++k) out_state->slots[k] = state[k];
        out_state->steps = steps;
        out_state->momentum_steps = momentum_steps;
    }
    return w;
}

namespace {

// One rank's group and the trainer's side of it.
class Trainer {
  public:
    Trainer(const Scenario &sc, int rank) : sc_(sc), rank_(rank) {}
    ~Trainer() { sx_destroy_shard_group(g_); }

    std::string run(const std::string &rendezvous, int timeout_ms, std::vector<std::vector<float>> *final_params) {
        std::string err = setup(rendezvous, timeout_ms);
        if (err.empty() && sc_.after_setup) err = sc_.after_setup(g_, rank_);
        if (err.empty() && !sc_.load_from.empty()) {
            sx_load_options_t lo;
            sx_load_optim_state_options_init(&lo, sizeof lo);
            lo.path = sc_.load_from.c_str();
            lo.flags = sc_.load_flags;
            err = check(sx_load_optim_state(g_, &lo), "sx_load_optim_state");
        }
        for (int s = sc_.first_step; s <= sc_.steps && err.empty(); ++s) err = step(s);
        if (err.empty() && !sc_.save_to.empty()) {
            sx_save_options_t so;
            sx_save_options_init(&so, sizeof so);
            so.path = sc_.save_to.c_str();
            so.synchronous = 1;
            sx_future_t *f = nullptr;
            err = check(sx_save_optim_state(g_, &so, &f), "sx_save_optim_state");
            if (err.empty()) err = check(sx_future_wait(f, -1), "sx_future_wait");
            sx_future_destroy(f);
        }
        if (err.empty() && final_params) err = read_params(final_params);
        return err;
    }

  private:
    bool gathers() const { return sc_.stage == 3 || sc_.gather_units; }

    // "" or what failed, naming the rank.
    std::string check(sx_status_t st, const char *what) const {
        if (st == SX_OK) return "";
        char buf[1024];
        std::snprintf(buf, sizeof buf, "rank %d: %s failed: %s (%s)", rank_, what, sx_status_string(st),
                      sx_last_error_message());
        return buf;
    }

    std::string setup(const std::string &rendezvous, int timeout_ms) {
        sx_group_config_t cfg;
        sx_group_config_init(&cfg, sizeof cfg);
        cfg.rendezvous = rendezvous.c_str();
        cfg.rank = rank_;
        cfg.world_size = sc_.world;
        cfg.stage = sc_.stage;
        cfg.num_threads = 1;
        cfg.timeout_ms = timeout_ms;
        cfg.prefetch_depth = sc_.prefetch_depth;
        cfg.shard_size = sc_.shard_size;
        cfg.grad_predivide_factor = sc_.grad_predivide_factor;
        cfg.backend = sc_.backend;
        std::string err = check(sx_create_shard_group(&cfg, &g_), "sx_create_shard_group");
        const bool later = sc_.add_after_step > 0 && sc_.first_step <= sc_.add_after_step;
        if (err.empty())
            err = add_and_finalize(later ? sc_.added_groups_from : sc_.groups.size(),
                                   later ? sc_.added_params_from : sc_.params.size(), sc_.first_step);
        return err;
    }

    // Registers the param groups and params up to (not including) these counts, beyond
    // those registered already (frozen as at `step`), finalizes, and writes the new
    // params' initial values.
    std::string add_and_finalize(size_t groups, size_t params, int step) {
        std::string err;
        for (size_t i = groups_; i < groups && err.empty(); ++i)
            err = check(sx_add_param_group(g_, &sc_.groups[i], nullptr), "sx_add_param_group");
        const size_t first = np_;
        for (size_t p = first; p < params && err.empty(); ++p) {
            sx_param_desc_t d;
            sx_param_desc_init(&d, sizeof d);
            d.name = sc_.params[p].name.c_str();
            d.ndim = static_cast<int32_t>(sc_.params[p].shape.size());
            d.shape = sc_.params[p].shape.data();
            d.param_group = sc_.params[p].group;
            d.unit = sc_.params[p].unit;
            d.frozen = is_trainable(sc_, step, static_cast<int>(p)) ? 0 : 1;
            int32_t idx = -1;
            err = check(sx_add_param(g_, &d, &idx), "sx_add_param");
            if (err.empty() && idx != static_cast<int32_t>(p)) err = "param index out of order";
        }
        if (!err.empty()) return err;
        groups_ = groups;
        np_ = params;
        const size_t np = np_;
        err = check(sx_finalize(g_), "sx_finalize");
        // The mask may have moved with the params added: fetched again.
        if (err.empty()) err = check(sx_trainable_mask(g_, &mask_, &count_), "sx_trainable_mask");
        if (err.empty()) err = check(sx_get_num_units(g_, &units_), "sx_get_num_units");
        // Unit index of every param: units are numbered in increasing unit id.
        std::vector<int32_t> ids;
        for (int32_t u = 0; u < units_ && err.empty(); ++u) {
            sx_unit_info_t info;
            sx_unit_info_init(&info, sizeof info);
            err = check(sx_get_unit_info(g_, u, &info), "sx_get_unit_info");
            ids.push_back(info.unit);
        }
        unit_of_.assign(np, -1);
        for (size_t p = 0; p < np; ++p)
            for (int32_t u = 0; u < units_; ++u)
                if (ids.size() == static_cast<size_t>(units_) && ids[u] == sc_.params[p].unit) unit_of_[p] = u;
        gdata_.resize(np, nullptr);
        for (size_t p = first; p < np && err.empty(); ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            err = check(sx_grad_view(g_, static_cast<int32_t>(p), &v), "sx_grad_view");
            gdata_[p] = static_cast<float *>(v.data);
        }
        if (err.empty()) err = write_initial_values(first);
        return err;
    }

    bool on_device() const { return sc_.backend == SX_BACKEND_CUDA; }

    // fn over n floats of a view: in place on the host; on a device, over a host copy
    // that is written back afterwards.
    std::string through_host(float *view, uint64_t n, const std::function<void(float *)> &fn) {
        if (!on_device()) {
            fn(view);
            return "";
        }
        std::vector<float> host(n);
        if (!sc_.device_copy(host.data(), view, n * sizeof(float), false)) return "copying a view to the host failed";
        fn(host.data());
        if (!sc_.device_copy(view, host.data(), n * sizeof(float), true)) return "copying a view to the device failed";
        return "";
    }

    // The params of unit u (every param where u < 0), with their views, through fn.
    std::string with_params(int32_t u, const std::function<void(size_t p, float *data, uint64_t n)> &fn,
                            size_t from = 0) {
        for (size_t p = from; p < np_; ++p) {
            if (u >= 0 && unit_of_[p] != u) continue;
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            std::string err = check(sx_param_view(g_, static_cast<int32_t>(p), &v), "sx_param_view");
            if (!err.empty()) return err;
            if (v.numel != numel(sc_.params[p])) return "view numel mismatch";
            if (on_device() != (v.device == SX_DEVICE_CUDA)) return "the view is not on the scenario's backend";
            err = through_host(static_cast<float *>(v.data), v.numel,
                               [&](float *data) { fn(p, data, v.numel); });
            if (!err.empty()) return err;
        }
        return "";
    }

    // Each unit's params through fn, gathered around it where the scenario gathers.
    std::string each_unit(const std::function<void(size_t p, float *data, uint64_t n)> &fn, size_t from = 0) {
        if (!gathers()) return with_params(-1, fn, from);
        for (int32_t u = 0; u < units_; ++u) {
            std::string err = check(sx_unit_gather(g_, u), "sx_unit_gather");
            if (err.empty()) err = with_params(u, fn, from);
            if (err.empty()) err = check(sx_unit_release(g_, u), "sx_unit_release");
            if (!err.empty()) return err;
        }
        return "";
    }

    std::string write_initial_values(size_t from) {
        return each_unit(
            [](size_t p, float *d, uint64_t n) {
                for (uint64_t i = 0; i < n; ++i) d[i] = initial_value(static_cast<int>(p), i);
            },
            from);
    }

    std::string read_params(std::vector<std::vector<float>> *out) {
        out->assign(sc_.params.size(), {});
        return each_unit([&](size_t p, float *d, uint64_t n) { (*out)[p].assign(d, d + n); });
    }

    std::string add_gradients(int s, int m, int32_t unit) {
        for (size_t p = 0; p < np_; ++p) {
            if (unit >= 0 && unit_of_[p] != unit) continue;
            const uint64_t n = numel(sc_.params[p]);
            const int r = sc_.same_grads_on_every_rank ? 0 : rank_;
            std::string err = through_host(gdata_[p], n, [&](float *g) {
                for (uint64_t i = 0; i < n; ++i) g[i] += gradient(r, s, m, static_cast<int>(p), i);
            });
            if (!err.empty()) return err;
        }
        return "";
    }

    // A forward's gathers: every unit in increasing index, its params read, released.
    std::string forward() {
        for (int32_t u = 0; u < units_; ++u) {
            std::string err = check(sx_unit_gather(g_, u), "sx_unit_gather");
            if (err.empty()) err = with_params(u, [](size_t, float *, uint64_t) {});
            if (err.empty()) err = check(sx_unit_release(g_, u), "sx_unit_release");
            if (!err.empty()) return err;
        }
        return "";
    }

    // One micro-batch's backward: the trainer adds into the grad views (frozen params
    // included, which sx ignores). Overlapped or at stage 3, unit by unit: gathered (stage
    // 3), its gradients added, signalled ready (overlap), released.
    std::string backward(int s, int m) {
        if (!sc_.overlap && sc_.stage != 3) return add_gradients(s, m, -1);
        std::vector<int32_t> order;
        if (sc_.signal_order) {
            order = sc_.signal_order(rank_, s, m, units_);
        } else {
            for (int32_t u = units_ - 1; u >= 0; --u) order.push_back(u);
        }
        // The units the order leaves out get their gradients last, unsignalled.
        const size_t signalled = order.size();
        for (int32_t u = units_ - 1; u >= 0; --u)
            if (std::find(order.begin(), order.end(), u) == order.end()) order.push_back(u);
        sx_unit_ready_options_t ro;
        sx_unit_ready_options_init(&ro, sizeof ro);
        ro.accumulate = m + 1 < sc_.micro_batches ? 1 : 0;
        for (size_t k = 0; k < order.size(); ++k) {
            const int32_t u = order[k];
            std::string err;
            if (sc_.stage == 3) err = check(sx_unit_gather(g_, u), "sx_unit_gather");
            if (err.empty()) err = add_gradients(s, m, u);
            if (err.empty() && sc_.overlap && k < signalled)
                err = check(sx_unit_grads_ready(g_, u, &ro), "sx_unit_grads_ready");
            if (err.empty() && sc_.stage == 3) err = check(sx_unit_release(g_, u), "sx_unit_release");
            if (!err.empty()) return err;
        }
        return "";
    }

    std::string step(int s) {
        std::string err;
        if (sc_.add_after_step > 0 && s == sc_.add_after_step + 1 && np_ < sc_.params.size())
            err = add_and_finalize(sc_.groups.size(), sc_.params.size(), s);
        const size_t np = np_;
        for (size_t p = 0; p < np && err.empty(); ++p) {
            const bool t = is_trainable(sc_, s, static_cast<int>(p));
            if (sc_.mask_through_pointer)
                mask_[p] = t ? 1 : 0;
            else
                err = check(sx_set_trainable(g_, static_cast<int32_t>(p), t ? 1 : 0), "sx_set_trainable");
        }
        for (int m = 0; m < sc_.micro_batches && err.empty(); ++m) {
            if (gathers()) err = forward();
            if (err.empty()) err = backward(s, m);
            if (err.empty() && m + 1 < sc_.micro_batches) err = check(sx_accumulate_grads(g_), "sx_accumulate_grads");
        }
        if (!err.empty()) return err;
        sx_step_options_t opt;
        sx_step_options_init(&opt, sizeof opt);
        opt.max_grad_norm = sc_.max_grad_norm;
        opt.defer_gather = sc_.defer_gather ? 1 : 0;
        sx_step_result_t res;
        sx_step_result_init(&res, sizeof res);
        err = check(sx_step(g_, &opt, &res), "sx_step");
        if (!err.empty()) return err;
        // One more than the last step's (a load sets it; a scatter of whole state does not).
        if (last_step_ && res.step != last_step_ + 1) return "step count in the result is wrong";
        if (!last_step_ && sc_.load_from.empty() && !sc_.after_setup && res.step != static_cast<uint64_t>(s))
            return "step count in the result is wrong";
        last_step_ = res.step;
        for (size_t p = 0; p < np && err.empty(); ++p) {
            bool zero = true;
            err = through_host(gdata_[p], numel(sc_.params[p]), [&](float *g) {
                for (uint64_t i = 0; i < numel(sc_.params[p]); ++i) zero = zero && g[i] == 0.0f;
            });
            if (err.empty() && !zero) err = "gradients were not zeroed after the step";
        }
        if (!err.empty()) return err;
        if (sc_.after_step) err = sc_.after_step(g_, rank_, s);
        return err;
    }

    const Scenario &sc_;
    const int rank_;
    sx_shard_group_t *g_ = nullptr;
    uint8_t *mask_ = nullptr;
    int32_t count_ = 0;
    int32_t units_ = 0;
    size_t groups_ = 0, np_ = 0;    // param groups and params registered
    uint64_t last_step_ = 0;        // the step count the last step reported
    std::vector<int32_t> unit_of_;  // per param: its unit's index
    std::vector<float *> gdata_;
};

}  // namespace

std::string rank_run(const Scenario &sc, const std::string &rendezvous, int rank, int timeout_ms,
                     std::vector<std::vector<float>> *final_params) {
    Trainer t(sc, rank);
    return t.run(rendezvous, timeout_ms, final_params);
}

std::string compare(const std::vector<std::vector<float>> &got,
                    const std::vector<std::vector<float>> &want, double rel_tol) {
    if (got.size() != want.size()) return "different number of params";
    for (size_t p = 0; p < got.size(); ++p) {
        if (got[p].size() != want[p].size()) return "different param sizes";
        for (size_t i = 0; i < got[p].size(); ++i) {
            const double a = got[p][i], b = want[p][i];
            const double scale = std::max(std::fabs(b), 1e-3);
            if (!(std::fabs(a - b) <= rel_tol * scale)) {
                char buf[256];
                std::snprintf(buf, sizeof buf, "param %zu element %zu: got %.9g, reference %.9g", p,
                              i, a, b);
                return buf;
            }
        }
    }
    return "";
}

std::string run_threads(const Scenario &sc, const std::string &name, std::vector<std::vector<std::vector<float>>> *out) {
    out->assign(static_cast<size_t>(sc.world), {});
    std::vector<std::string> errs(static_cast<size_t>(sc.world));
    std::vector<std::thread> threads;
    const std::string rv = "local://" + name + "-" + std::to_string(getpid());
    for (int r = 0; r < sc.world; ++r)
        threads.emplace_back([&, r] { errs[r] = rank_run(sc, rv, r, 60000, &(*out)[static_cast<size_t>(r)]); });
    for (auto &t : threads) t.join();
    for (int r = 0; r < sc.world; ++r)
        if (!errs[r].empty()) return "rank " + std::to_string(r) + ": " + errs[r];
    return "";
}

std::string run_threads_and_compare(const Scenario &sc, const std::string &name, double rel_tol) {
    const std::vector<std::vector<float>> want = reference_run(sc);
    std::vector<std::string> errs(sc.world);
    std::vector<std::vector<std::vector<float>>> got(sc.world);
    std::vector<std::thread> threads;
    for (int r = 0; r < sc.world; ++r)
        threads.emplace_back([&, r] { errs[r] = rank_run(sc, "local://" + name, r, 60000, &got[r]); });
    for (auto &t : threads) t.join();
    for (int r = 0; r < sc.world; ++r) {
        if (!errs[r].empty()) return errs[r];
        std::string c = compare(got[r], want, rel_tol);
        if (!c.empty()) return "rank " + std::to_string(r) + ": " + c;
    }
    // The reference must actually have moved the params: a run that updates nothing
    // would otherwise pass against a reference that also updates nothing.
    bool moved = false;
    for (size_t p = 0; p < want.size(); ++p)
        for (size_t i = 0; i < want[p].size(); ++i) moved |= want[p][i] != initial_value(static_cast<int>(p), i);
    if (!moved) return "the reference did not move any param";
    return "";
}

std::string run_legs(const Scenario &sc, const std::vector<Leg> &legs, const std::string &dir,
                     const std::string &name, const std::vector<std::vector<float>> &want, double rel_tol) {
    std::vector<std::vector<std::vector<float>>> got;
    for (size_t k = 0; k < legs.size(); ++k) {
        Scenario leg = sc;
        leg.world = legs[k].world;
        leg.shard_size = legs[k].shard_size;
        leg.stage = legs[k].stage;
        if (legs[k].backend != 0) leg.backend = legs[k].backend;
        leg.overlap = legs[k].stage == 3;
        leg.gather_units = leg.overlap;
        leg.first_step = legs[k].first;
        leg.steps = legs[k].last;
        if (k > 0) leg.load_from = dir + "/leg" + std::to_string(k - 1);
        if (k + 1 < legs.size()) leg.save_to = dir + "/leg" + std::to_string(k);
        got.assign(static_cast<size_t>(leg.world), {});
        std::vector<std::string> errs(static_cast<size_t>(leg.world));
        std::vector<std::thread> threads;
        const std::string rv = "local://" + name + "-" + std::to_string(k);
        for (int r = 0; r < leg.world; ++r)
            threads.emplace_back([&, r] { errs[r] = rank_run(leg, rv, r, 60000, &got[r]); });
        for (auto &t : threads) t.join();
        for (const std::string &e : errs)
            if (!e.empty()) return "leg " + std::to_string(k) + ": " + e;
    }
    for (size_t r = 0; r < got.size(); ++r) {
        const std::string c = compare(got[r], want, rel_tol);
        if (!c.empty()) return "rank " + std::to_string(r) + " after the last leg: " + c;
    }
    return "";
}

}  // namespace sxtest
