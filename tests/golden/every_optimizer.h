// The model behind the format-3.0 goldens (tests/golden/v3.0/every-optimizer-*): one
// param group of every built-in optimizer and one of a registered (custom) optimizer,
// each with hyperparameters away from their defaults, and every value, state tensor and
// step count a formula of (param, tensor name, element), so that a test can check a load
// without keeping the expected values anywhere but here. Written and checked through the
// public API only. Changing anything in this file invalidates the committed checkpoints:
// never do; add a new model and new goldens instead.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sx/sx.h"

namespace sxgolden3 {

struct GroupDef {
    int32_t optimizer;  // SX_OPTIM_*, or kCustom for the registered one
    std::vector<std::pair<int32_t, double>> hypers;  // SX_HP_* key, value (set after sx_add_param_group)
};

constexpr int32_t kCustom = -1;
constexpr const char *kCustomName = "sxgolden.scaled_sgd";
constexpr int kSteps = 6;  // real steps taken before the state is written by formula
constexpr const char *kUserBlob = "golden v3.0 every optimizer";

inline const std::vector<GroupDef> &groups() {
    static const std::vector<GroupDef> g = {
        {SX_OPTIM_SGD, {{SX_HP_LR, 0.1}, {SX_HP_MOMENTUM, 0.8}, {SX_HP_DAMPENING, 0.1}, {SX_HP_WEIGHT_DECAY, 0.01}}},
        {SX_OPTIM_ADAM, {{SX_HP_LR, 0.003}, {SX_HP_AMSGRAD, 1}, {SX_HP_BETA1, 0.85}}},
        {SX_OPTIM_ADAMW, {{SX_HP_LR, 0.002}, {SX_HP_WEIGHT_DECAY, 0.05}, {SX_HP_EPS, 1e-7}}},
        {SX_OPTIM_ADAGRAD, {{SX_HP_LR, 0.05}, {SX_HP_LR_DECAY, 0.01}, {SX_HP_INITIAL_ACCUMULATOR_VALUE, 0.1}}},
        {SX_OPTIM_RMSPROP, {{SX_HP_ALPHA, 0.9}, {SX_HP_MOMENTUM, 0.5}, {SX_HP_CENTERED, 1}}},
        {SX_OPTIM_ADAMAX, {{SX_HP_BETA2, 0.99}}},
        {SX_OPTIM_NADAM, {{SX_HP_MOMENTUM_DECAY, 0.005}, {SX_HP_DECOUPLED_WEIGHT_DECAY, 1}, {SX_HP_WEIGHT_DECAY, 0.01}}},
        {SX_OPTIM_RADAM, {{SX_HP_DECOUPLED_WEIGHT_DECAY, 1}, {SX_HP_WEIGHT_DECAY, 0.01}}},
        {SX_OPTIM_LION, {{SX_HP_LR, 1e-4}, {SX_HP_BETA1, 0.95}}},
        {SX_OPTIM_LAMB, {{SX_HP_LR, 0.01}, {SX_HP_WEIGHT_DECAY, 0.01}}},
        {SX_OPTIM_MUON, {{SX_HP_LR, 0.02}, {SX_HP_MOMENTUM, 0.9}, {SX_HP_NS_STEPS, 4}}},
        {SX_OPTIM_ADAFACTOR, {{SX_HP_LR, 0.01}, {SX_HP_BETA2_DECAY, -0.7}, {SX_HP_D, 1.2}, {SX_HP_EPS2, 0.002}}},
        {SX_OPTIM_ADEMAMIX, {{SX_HP_ALPHA, 2.0}, {SX_HP_BETA3, 0.999}, {SX_HP_T_ALPHA_BETA3, 7}}},
        {kCustom, {{SX_HP_LR, 0.1}, {SX_HP_CUSTOM + 0, 0.5}}},
    };
    return g;
}

struct ParamDef {
    std::string name;
    std::vector<int64_t> shape;
    int group;
    int unit;
};

// Per group a matrix (Adafactor's of three dimensions, factored) and, but for Muon, a
// vector; groups spread over three units, the registered optimizer's alone in a fourth.
inline const std::vector<ParamDef> &params() {
    static const std::vector<ParamDef> p = [] {
        std::vector<ParamDef> out;
        for (int g = 0; g < static_cast<int>(groups().size()); ++g) {
            const int32_t opt = groups()[static_cast<size_t>(g)].optimizer;
            const int unit = opt == kCustom ? 3 : g % 3;
            const std::string prefix = "g" + std::to_string(g);
            if (opt == SX_OPTIM_ADAFACTOR)
                out.push_back({prefix + ".w", {2, 3, 4}, g, unit});
            else
                out.push_back({prefix + ".w", {3 + g % 4, 5}, g, unit});
            if (opt != SX_OPTIM_MUON) out.push_back({prefix + ".b", {7 + g}, g, unit});
        }
        return out;
    }();
    return p;
}

// Tensors whose values must be >= 0 (second moments, sums of squares, norms).
inline bool non_negative(const std::string &tensor) {
    for (const char *n : {"exp_avg_sq", "max_exp_avg_sq", "sum", "square_avg", "exp_inf", "variance", "row_var",
                          "col_var"})
        if (tensor == n) return true;
    return false;
}

// Element i of param p's tensor `tensor` ("param" for its values).
inline float value(int p, const std::string &tensor, uint64_t i) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the name
    for (char c : tensor) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    const int64_t v = static_cast<int64_t>((i * 2654435761ull + static_cast<uint64_t>(p) * 97 + h % 1009) % 2001) - 1000;
    const float x = static_cast<float>(v) / 1024.0f;
    return non_negative(tensor) ? x * x : x;
}

inline int64_t step_of(int p) { return 1 + p % kSteps; }
inline double mu_product_of(int p) { return static_cast<double>(0.75f + 0.01f * static_cast<float>(p)); }

// The gradient of element i of param p at step s of the steps taken before the state is
// written (their only lasting effect: the group's and the checkpoint's step counts).
inline float grad_of(int p, int s, uint64_t i) {
    return static_cast<float>(static_cast<int64_t>((i * 7 + static_cast<uint64_t>(p) * 3 + static_cast<uint64_t>(s)) % 11) - 5) /
           64.0f;
}

// The registered optimizer: SGD scaled by its own "scale", keeping a velocity and a trace.
inline int32_t scaled_sgd(const sx_optimizer_piece_t *piece) {
    const double lr = piece->hyperparameters[0], scale = piece->hyperparameters[1];
    for (size_t i = 0; i < piece->n; ++i) {
        const float g = piece->grad[i] * piece->grad_scale;
        piece->state[0][i] = 0.9f * piece->state[0][i] + g;
        piece->state[1][i] += g * g;
        piece->param[i] -= static_cast<float>(lr * scale) * piece->state[0][i];
    }
    return 0;
}

// Registers it (the same description on every call: the same id). Returns its id, or -1.
inline int32_t register_custom() {
    static const char *const slots[] = {"velocity", "trace"};
    static const sx_optimizer_hyperparameter_t hypers[] = {{"lr", 0.01, 0, 0}, {"scale", 1.0, 0.0, 10.0}};
    sx_optimizer_desc_t d;
    sx_optimizer_desc_init(&d, sizeof d);
    d.name = kCustomName;
    d.num_slots = 2;
    d.slot_names = slots;
    d.num_hyperparameters = 2;
    d.hyperparameters = hypers;
    d.update = scaled_sgd;
    int32_t id = -1;
    return sx_register_optimizer(&d, &id) == SX_OK ? id : -1;
}

}  // namespace sxgolden3
