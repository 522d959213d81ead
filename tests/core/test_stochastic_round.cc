// bf16 params without fp32 masters (sx_param_group_desc_t.bf16_stochastic_round): the
// rounding itself (the vectorised loops against the scalar reference, unbiasedness), the
// same params bit for bit at worlds 1 to 3 and stages 1 to 3 after several AdamW steps
// with bf16 state, no masters in the memory counts, the whole state gathered and
// scattered (the params as "master"), memory copies, and the calls that refuse it; and
// all of it on CUDA groups (the simulated device), keeping their state on the device or
// offloading it to the host, bit for bit a CPU group's, checkpoints saved on one kind of
// group loaded into another.
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "optim/kernels.h"
#include "optim/stochastic_round.h"
#include "sx_cmocka.h"
#include "test_files.h"
#include "test_groups.h"

namespace {

using sx::optim::bf16_round_stochastic;
using sx::optim::random16;
using sx::optim::stochastic_round;
using sx::optim::stochastic_round_key;
using sx::optim::stochastic_round_reference;

float bf16_value(uint16_t h) {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t bf16_nearest(float f) {  // round to nearest even (finite f)
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

float from_bits(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

struct Flavour {
    const char *name;
    void (*round)(const float *x, uint16_t *out, size_t n, uint64_t key, uint64_t first_element);
};
// stochastic_round, and every kernel flavour this CPU runs.
std::vector<Flavour> flavours() {
    namespace in = sx::optim::internal;
    using sx::optim::Isa;
    std::vector<Flavour> f = {{"stochastic_round", &stochastic_round}};
    const Isa best = sx::optim::detect_isa();
    std::vector<Isa> isas = {Isa::kScalar};
    if (best == Isa::kAvx2 || best == Isa::kAvx512) isas.push_back(Isa::kAvx2);
    if (best == Isa::kAvx512) isas.push_back(Isa::kAvx512);
    for (Isa isa : isas) f.push_back({in::kernels_for(isa).name, in::kernels_for(isa).round_stochastic});
    return f;
}

// The update's loops give the reference's bits on awkward sizes and offsets (around each
// flavour's vector width, and counters that wrap), specials included; NaN stays NaN, and
// values bf16 holds exactly are kept.
void test_vector_loops_match_the_reference(void **) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> any_bits;
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, from_bits(0x7F800001u),
                              from_bits(0xFF80FFFFu), from_bits(0x7F7FFFFFu), from_bits(0x00000001u), 1.0f, -3.5f};
    for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 33, 255, 256, 257, 1000, 4095, 4096, 4097}) {
        std::vector<float> x(n);
        for (size_t i = 0; i < n; ++i) x[i] = i < 12 ? specials[i] : from_bits(any_bits(rng));
        for (uint64_t first : {0ull, 3ull, 1000003ull, (1ull << 62) + 5}) {
            const uint64_t key = stochastic_round_key(static_cast<int32_t>(n % 5), static_cast<int64_t>(first + 1));
            std::vector<uint16_t> want(n, 0xAAAA);
            stochastic_round_reference(x.data(), want.data(), n, key, first);
            // The loops the compiler vectorises, then each flavour's the CPU runs (the
            // scalar flavour's are those loops; AVX2's and AVX-512's are hand-written).
            for (const Flavour &f : flavours()) {
                std::vector<uint16_t> got(n, 0x5555);
                f.round(x.data(), got.data(), n, key, first);
                for (size_t i = 0; i < n; ++i) {
                    uint32_t bits;
                    std::memcpy(&bits, &x[i], sizeof bits);
                    if (want[i] != got[i])
                        fail_msg("%s, n %zu first %llu element %zu (x bits 0x%08x): reference 0x%04x, got 0x%04x",
                                 f.name, n, static_cast<unsigned long long>(first), i, bits, want[i], got[i]);
                    if (std::isnan(x[i])) assert_true(std::isnan(bf16_value(got[i])));
                    if ((bits & 0xFFFFu) == 0 && !std::isnan(x[i])) assert_int_equal(got[i], bits >> 16);
                }
            }
        }
    }
}

// The mean of many roundings of x (each element its own bits) lies within 4 standard
// deviations of x: sigma = spacing * sqrt(p (1 - p) / M) <= spacing / (2 sqrt(M)); every
// rounding is one of x's two bf16 neighbours.
void test_rounding_is_unbiased(void **) {
    constexpr size_t M = 1 << 16;
    const float xs[] = {1.0f + 0.1f * 0x1p-7f, 1.0f + 0.5f * 0x1p-7f, -3.0f - 0.9f * 0x1p-6f, 1e-30f * 1.3f, 1234.567f};
    std::vector<float> x(M);
    std::vector<uint16_t> out(M);
    for (float v : xs) {
        std::fill(x.begin(), x.end(), v);
        stochastic_round(x.data(), out.data(), M, stochastic_round_key(3, 11), 17);
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        const float down = bf16_value(static_cast<uint16_t>(bits >> 16));
        const float up = bf16_value(static_cast<uint16_t>((bits >> 16) + 1));
        const double spacing = std::fabs(static_cast<double>(up) - down);
        double sum = 0.0;
        for (size_t i = 0; i < M; ++i) {
            const float r = bf16_value(out[i]);
            if (r != down && r != up) fail_msg("%g rounded to %g, not %g or %g", v, r, down, up);
            sum += r;
        }
        const double mean = sum / M, bound = 4.0 * spacing / (2.0 * std::sqrt(static_cast<double>(M)));
        if (std::fabs(mean - v) > bound)
            fail_msg("%.9g: the mean of %zu roundings is %.9g, %.3g away (bound %.3g)", v, M, mean,
                     std::fabs(mean - v), bound);
    }
    // The bits of one element differ between steps and params (the key changes them).
    assert_true(random16(stochastic_round_key(0, 1), 5) != random16(stochastic_round_key(0, 2), 5) ||
                random16(stochastic_round_key(0, 1), 6) != random16(stochastic_round_key(0, 2), 6));
    assert_true(stochastic_round_key(1, 1) != stochastic_round_key(0, 1));
}

struct Def {
    const char *name;
    std::vector<int64_t> shape;
    int32_t unit;
};
// Unit 0: one odd-sized param; unit 1: a small one, one over a cast block (4096), and one
// of whole 8-bit blocks (32 of 256: 8-bit state quantizes it, the others keep fp32).
const std::vector<Def> kParams = {{"a", {37, 29}, 0}, {"b", {300}, 1}, {"c", {5001}, 1}, {"d", {32, 256}, 1}};
constexpr int kSteps = 6;

// Where a group runs: a CPU group, or a CUDA group on the simulated device (which
// SX_SIMULATED_DEVICE must name when it is made: SimulatedDevice below) keeping its state
// on the device or offloading it (SX_OFFLOAD_STATE).
enum Device { kCpu = 0, kOnDevice = 1, kOffloaded = 2 };
const char *device_name(int device) {
    return device == kCpu ? "CPU" : device == kOnDevice ? "CUDA (state on the device)" : "CUDA (offloaded)";
}
void configure_device(sx_group_config_t *cfg, int device) {
    cfg->backend = device == kCpu ? SX_BACKEND_CPU : SX_BACKEND_CUDA;
    cfg->offload = device == kOffloaded ? SX_OFFLOAD_STATE : SX_OFFLOAD_NONE;
}
// SX_SIMULATED_DEVICE set while it lives (read when a CUDA group is made).
struct SimulatedDevice {
    SimulatedDevice() { setenv("SX_SIMULATED_DEVICE", "1", 1); }
    ~SimulatedDevice() { unsetenv("SX_SIMULATED_DEVICE"); }
};

int64_t numel(const Def &d) {
    int64_t n = 1;
    for (int64_t e : d.shape) n *= e;
    return n;
}

sx_param_group_desc_t sr_adamw(double lr = 3e-3) {
    sx_param_group_desc_t d;
    sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_ADAMW);
    d.lr = lr;
    d.weight_decay = 0.1;
    d.state_dtype = SX_STATE_BF16;
    d.bf16_stochastic_round = 1;
    return d;
}

sx_shard_group_t *make_group(const std::string &rv, int rank, int world, int stage, double lr, std::string *err,
                             int stochastic_round = 1, int32_t state_dtype = SX_STATE_BF16, int device = kCpu) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    configure_device(&cfg, device);
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.stage = stage;
    cfg.num_threads = 2;
    cfg.reduce_dtype = SX_DTYPE_F32;  // rank 0's gradients + zeros: exact in any order
    sx_shard_group_t *g = nullptr;
    if (sx_create_shard_group(&cfg, &g) != SX_OK) {
        *err = sx_last_error_message();
        return nullptr;
    }
    sx_param_group_desc_t d = sr_adamw(lr);
    d.bf16_stochastic_round = stochastic_round;
    d.state_dtype = state_dtype;
    bool ok = sx_add_param_group(g, &d, nullptr) == SX_OK;
    for (const Def &p : kParams) {
        sx_param_desc_t pd;
        sx_param_desc_init(&pd, sizeof pd);
        pd.name = p.name;
        pd.ndim = static_cast<int32_t>(p.shape.size());
        pd.shape = p.shape.data();
        pd.dtype = SX_DTYPE_BF16;
        pd.unit = p.unit;
        ok = ok && sx_add_param(g, &pd, nullptr) == SX_OK;
    }
    if (!ok || sx_finalize(g) != SX_OK) {
        *err = sx_last_error_message();
        sx_destroy_shard_group(g);
        return nullptr;
    }
    return g;
}

// Calls fn(param index, its bf16 view) for every param, its unit gathered at stage 3.
template <class Fn>
bool each_param(sx_shard_group_t *g, int stage, Fn fn) {
    for (int32_t unit = 0; unit < 2; ++unit) {
        if (stage == 3 && sx_unit_gather(g, unit) != SX_OK) return false;
        for (int32_t p = 0; p < static_cast<int32_t>(kParams.size()); ++p) {
            if (kParams[p].unit != unit) continue;
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            if (sx_param_view(g, p, &v) != SX_OK || v.dtype != SX_DTYPE_BF16) return false;
            fn(p, static_cast<uint16_t *>(v.data));
        }
        if (stage == 3 && sx_unit_release(g, unit) != SX_OK) return false;
    }
    return true;
}

float initial(int32_t p, int64_t i) { return 0.5f * std::sin(0.37f * static_cast<float>(i) + 1.3f * p); }
float gradient(int32_t p, int64_t i, int step) {
    return 0.01f * std::cos(0.11f * static_cast<float>(i * (p + 1)) + 0.7f * step) + 1e-4f * step;
}

// Writes the same initial values on every rank, then kSteps steps whose gradients are
// rank 0's (others' zero, weight 0): every world reduces the same fp32 sums. Returns the
// params' bits (rank 0's), or the error.
// A checkpoint to save after the steps, or to load before them (whose steps then count
// on from the checkpoint's `first`).
struct Checkpoint {
    std::string save, load;
    int first = 1;
    int stochastic_round = 1;  // the group's
    int32_t state_dtype = SX_STATE_BF16;
    // After this many steps (0: never), the whole state is gathered onto rank 0 and
    // scattered back as it came (whole_state_round_trip) before the steps go on.
    int round_trip_after = 0;
    int device = kCpu;  // where the group runs (Device)
};

// Every param's whole state as a gather gives it: "<param>/<tensor>" -> values, and
// "<param>/step" -> the step count.
using WholeState = std::map<std::string, std::vector<float>>;

sx_status_t gather_into(sx_param_state_t *st, void *user) {
    WholeState &w = *static_cast<WholeState *>(user);
    for (int32_t t = 0; t < st->num_tensors; ++t)
        w[std::string(st->name) + "/" + st->tensor_names[t]].assign(st->tensors[t], st->tensors[t] + st->tensor_numels[t]);
    w[std::string(st->name) + "/step"] = {static_cast<float>(st->step)};
    return SX_OK;
}

sx_status_t scatter_from(sx_param_state_t *st, void *user) {
    const WholeState &w = *static_cast<const WholeState *>(user);
    for (int32_t t = 0; t < st->num_tensors; ++t) {
        auto it = w.find(std::string(st->name) + "/" + st->tensor_names[t]);
        if (it == w.end() || it->second.size() != st->tensor_numels[t]) return SX_ERR_INVALID_ARGUMENT;
        std::memcpy(st->tensors[t], it->second.data(), it->second.size() * sizeof(float));
    }
    st->step = static_cast<int64_t>(w.at(std::string(st->name) + "/step")[0]);
    return SX_OK;
}

// Collective: gather, scatter what came, gather again. "" if the second gather equals the
// first bit for bit and every param's "master" is its bf16 params widened (rank 0's).
std::string whole_state_round_trip(sx_shard_group_t *g, int rank, int stage) {
    WholeState first, again;
    if (sx_gather_optim_state(g, 0, gather_into, &first) != SX_OK ||
        sx_scatter_optim_state(g, 0, scatter_from, &first) != SX_OK ||
        sx_gather_optim_state(g, 0, gather_into, &again) != SX_OK)
        return sx_last_error_message();
    std::string err;
    if (rank == 0 && (first.size() != 4 * kParams.size() || again != first))
        err = "the whole state gathered after scattering it differs from the first gather";
    const bool ok = each_param(g, stage, [&](int32_t p, uint16_t *v) {
        if (rank != 0 || !err.empty()) return;
        const std::vector<float> &m = first[std::string(kParams[p].name) + "/master"];
        for (int64_t i = 0; i < numel(kParams[p]) && err.empty(); ++i)
            if (m.size() != static_cast<size_t>(numel(kParams[p])) || m[i] != bf16_value(v[i]))
                err = std::string("param ") + kParams[p].name + "'s gathered master is not its bf16 params widened";
    });
    return ok ? err : sx_last_error_message();
}

std::string train(int world, int stage, std::vector<std::vector<uint16_t>> *out, int steps = kSteps,
                  double lr = 3e-3, const Checkpoint &ck = Checkpoint()) {
    const std::string rv = "local://sr-train-" + std::to_string(world) + "-" + std::to_string(stage) + "-" +
                           std::to_string(steps) + "-" + std::to_string(lr) + "-" + std::to_string(ck.first) +
                           std::to_string(ck.stochastic_round) + std::to_string(ck.state_dtype) + "-" +
                           std::to_string(ck.round_trip_after) + "-" + std::to_string(ck.device) + "-" +
                           std::to_string(getpid());
    return sxtest::run_ranks(world, [&](int rank) -> std::string {
        std::string err;
        sx_shard_group_t *g = make_group(rv, rank, world, stage, lr, &err, ck.stochastic_round, ck.state_dtype, ck.device);
        if (!g) return err;
        bool ok = each_param(g, stage, [](int32_t p, uint16_t *v) {
            for (int64_t i = 0; i < numel(kParams[p]); ++i) v[i] = bf16_nearest(initial(p, i));
        });
        if (ok && !ck.load.empty()) {
            sx_load_options_t lo;
            sx_load_optim_state_options_init(&lo, sizeof lo);
            lo.path = ck.load.c_str();
            ok = sx_load_optim_state(g, &lo) == SX_OK;
        }
        for (int s = ck.first; ok && s < ck.first + steps; ++s) {
            for (int32_t p = 0; ok && p < static_cast<int32_t>(kParams.size()); ++p) {
                sx_view_t v;
                sx_view_init(&v, sizeof v);
                ok = sx_grad_view(g, p, &v) == SX_OK && v.dtype == SX_DTYPE_BF16;
                uint16_t *grad = ok ? static_cast<uint16_t *>(v.data) : nullptr;
                for (int64_t i = 0; ok && i < numel(kParams[p]); ++i)
                    grad[i] = rank == 0 ? bf16_nearest(gradient(p, i, s)) : 0;
            }
            sx_step_options_t so;
            sx_step_options_init(&so, sizeof so);
            so.weighted = 1;
            so.weight = rank == 0 ? 1.0 : 0.0;
            ok = ok && sx_step(g, &so, nullptr) == SX_OK;
            if (ok && s + 1 - ck.first == ck.round_trip_after) {
                err = whole_state_round_trip(g, rank, stage);
                ok = err.empty();
            }
        }
        if (!err.empty()) {
            sx_destroy_shard_group(g);
            return err;
        }
        if (ok && !ck.save.empty()) ok = sxtest::save_synchronously(g, ck.save) == SX_OK;
        if (ok && rank == 0) {
            out->assign(kParams.size(), {});
            ok = each_param(g, stage, [&](int32_t p, uint16_t *v) { (*out)[p].assign(v, v + numel(kParams[p])); });
        } else if (ok && stage == 3) {
            ok = each_param(g, stage, [](int32_t, uint16_t *) {});  // the gathers are collective
        }
        if (!ok) err = sx_last_error_message();
        sx_destroy_shard_group(g);
        return err;
    });
}

// The same params, bit for bit, at every world size and stage (the steps changed most
// elements, and one step more changes them again).
void test_same_bits_at_every_world_and_stage(void **) {
    std::vector<std::vector<uint16_t>> want;
    std::string err = train(1, 1, &want);
    if (!err.empty()) fail_msg("world 1 stage 1: %s", err.c_str());
    size_t changed = 0, total = 0;
    for (int32_t p = 0; p < static_cast<int32_t>(kParams.size()); ++p)
        for (int64_t i = 0; i < numel(kParams[p]); ++i, ++total) changed += want[p][i] != bf16_nearest(initial(p, i));
    if (changed * 2 < total) fail_msg("only %zu of %zu elements changed in %d steps", changed, total, kSteps);
    const int runs[][2] = {{1, 2}, {1, 3}, {2, 1}, {2, 2}, {2, 3}, {3, 1}, {3, 2}, {3, 3}};
    for (const auto &run : runs) {
        std::vector<std::vector<uint16_t>> got;
        err = train(run[0], run[1], &got);
        if (!err.empty()) fail_msg("world %d stage %d: %s", run[0], run[1], err.c_str());
        for (size_t p = 0; p < kParams.size(); ++p)
            for (size_t i = 0; i < want[p].size(); ++i)
                if (got[p][i] != want[p][i])
                    fail_msg("world %d stage %d: param %s element %zu is 0x%04x, world 1 stage 1's 0x%04x", run[0],
                             run[1], kParams[p].name, i, got[p][i], want[p][i]);
    }
    // One step more changes them again (the bits follow the step count).
    std::vector<std::vector<uint16_t>> more;
    err = train(1, 1, &more, kSteps + 1);
    if (!err.empty()) fail_msg("%s", err.c_str());
    assert_true(more != want);
}

// The same with AdamW's 8-bit state (torchao's blocks, which follow every layout's shards).
void test_same_bits_with_8bit_state(void **) {
    Checkpoint eight;
    eight.state_dtype = SX_STATE_8BIT;
    std::vector<std::vector<uint16_t>> want, got;
    std::string err = train(1, 1, &want, kSteps, 3e-3, eight);
    if (!err.empty()) fail_msg("world 1 stage 1: %s", err.c_str());
    for (const auto &run : {std::make_pair(2, 3), std::make_pair(3, 2)}) {
        err = train(run.first, run.second, &got, kSteps, 3e-3, eight);
        if (!err.empty()) fail_msg("world %d stage %d: %s", run.first, run.second, err.c_str());
        if (got != want) fail_msg("8-bit state, world %d stage %d: the params differ from world 1's", run.first, run.second);
    }
    std::vector<std::vector<uint16_t>> bf16_state;
    err = train(1, 1, &bf16_state);
    if (!err.empty()) fail_msg("%s", err.c_str());
    assert_true(bf16_state[3] != want[3]);  // "d"'s state was 8-bit indeed
}

// Updates far below half a bf16 step (lr 1e-5 against a spacing of 2^-9 near 0.5), which
// rounding to nearest would drop every time, move some elements: with probability about
// |update| / spacing each, so about 0.5% of the elements per step.
void test_small_updates_are_not_lost(void **) {
    std::vector<std::vector<uint16_t>> got;
    const std::string err = train(2, 2, &got, kSteps, 1e-5);
    if (!err.empty()) fail_msg("%s", err.c_str());
    // Elements of magnitude >= 0.25 (spacing >= 2^-10): each update is under a tenth of
    // half a spacing, so rounding to nearest would keep every one of them.
    size_t changed = 0, total = 0;
    for (int32_t p = 0; p < static_cast<int32_t>(kParams.size()); ++p)
        for (int64_t i = 0; i < numel(kParams[p]); ++i) {
            if (std::fabs(initial(p, i)) < 0.25f) continue;
            ++total;
            changed += got[p][i] != bf16_nearest(initial(p, i));
        }
    if (changed < 10 || changed * 10 > total)
        fail_msg("%zu of %zu elements of magnitude >= 0.25 changed in %d steps of lr 1e-5; expected a few percent",
                 changed, total, kSteps);
}

// A checkpoint saved by 3 ranks at stage 2 after 3 steps, loaded by 2 ranks at stage 3 and
// by 1 at stage 1, continues to the same params, bit for bit, as the 6 steps without it
// (its param tensors are the bf16 params widened, and a load rounds them back exactly).
void test_checkpoint_resumes_at_another_world(void **) {
    std::vector<std::vector<uint16_t>> want, got, saved;
    std::string err = train(1, 1, &want);
    if (!err.empty()) fail_msg("%s", err.c_str());
    const std::string tmp = sxtest::make_tmpdir("sr-ckpt"), dir = tmp + "/rounding";
    Checkpoint save;
    save.save = dir;
    err = train(3, 2, &saved, kSteps / 2, 3e-3, save);
    if (!err.empty()) fail_msg("saving: %s", err.c_str());
    for (const auto &run : {std::make_pair(2, 3), std::make_pair(1, 1)}) {
        Checkpoint load;
        load.load = dir;
        load.first = kSteps / 2 + 1;
        err = train(run.first, run.second, &got, kSteps - kSteps / 2, 3e-3, load);
        if (!err.empty()) fail_msg("resuming at world %d stage %d: %s", run.first, run.second, err.c_str());
        if (got != want) fail_msg("resumed at world %d stage %d: the params differ from the run without a checkpoint",
                                  run.first, run.second);
    }
    // A group with masters takes the params as its masters (its first steps from them are
    // those of a group whose masters were the bf16 params); a group without, loading a
    // checkpoint of one with masters, rounds them to nearest: the saved group's params.
    Checkpoint zero_steps;
    zero_steps.load = dir;
    zero_steps.stochastic_round = 0;
    err = train(2, 1, &got, 0, 3e-3, zero_steps);
    if (!err.empty()) fail_msg("loading into a group with masters: %s", err.c_str());
    if (got != saved) fail_msg("a group with masters loaded other params than those saved");
    const std::string mastered = tmp + "/masters";
    Checkpoint save_mastered;
    save_mastered.save = mastered;
    save_mastered.stochastic_round = 0;
    std::vector<std::vector<uint16_t>> mastered_params;
    err = train(2, 2, &mastered_params, 2, 3e-3, save_mastered);
    if (!err.empty()) fail_msg("saving a group with masters: %s", err.c_str());
    Checkpoint into_rounding;
    into_rounding.load = mastered;
    err = train(3, 3, &got, 0, 3e-3, into_rounding);
    if (!err.empty()) fail_msg("loading masters into a group without: %s", err.c_str());
    if (got != mastered_params) fail_msg("a group without masters loaded other params than the saved group's");
    sxtest::remove_tree(tmp);
}

// Gathering the whole state and scattering it back mid-run changes nothing: the params
// (widened exactly as "master", rounded back to themselves), the moments and the step
// counts that key the random bits come back bit for bit, and the run ends where one
// without the round trip does, at every world size and stage.
void test_whole_state_round_trip(void **) {
    std::vector<std::vector<uint16_t>> want, got;
    std::string err = train(1, 1, &want);
    if (!err.empty()) fail_msg("%s", err.c_str());
    Checkpoint trip;
    trip.round_trip_after = kSteps / 2;
    for (const auto &run : {std::make_pair(1, 1), std::make_pair(2, 2), std::make_pair(3, 3), std::make_pair(2, 1)}) {
        err = train(run.first, run.second, &got, kSteps, 3e-3, trip);
        if (!err.empty()) fail_msg("world %d stage %d: %s", run.first, run.second, err.c_str());
        if (got != want) fail_msg("world %d stage %d: the params after a whole-state round trip differ", run.first,
                                  run.second);
    }
}

// bf16 params, bf16 grads, AdamW with bf16 moments: the optimizer bytes are the moments'
// 4 per element, divided by the world size; a group with masters holds 4 more.
// The same on CUDA groups, their state on the device or offloaded (where the params' shard
// on the host, which the host's update steps, counts as params).
void test_no_masters_in_memory(void **) {
    constexpr int64_t kN = 1 << 16;  // a multiple of every alignment: no padding
    SimulatedDevice sim;
    for (int device : {kCpu, kOnDevice, kOffloaded}) {
    for (int sr : {1, 0}) {
        for (int world : {1, 2}) {
            const std::string rv = "local://sr-mem-" + std::to_string(sr) + "-" + std::to_string(world) + "-" +
                                   std::to_string(device) + "-" + std::to_string(getpid());
            const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
                sx_group_config_t cfg;
                sx_group_config_init(&cfg, sizeof cfg);
                configure_device(&cfg, device);
                cfg.rendezvous = rv.c_str();
                cfg.rank = rank;
                cfg.world_size = world;
                cfg.num_threads = 1;
                sx_shard_group_t *g = nullptr;
                if (sx_create_shard_group(&cfg, &g) != SX_OK) return sx_last_error_message();
                sx_param_group_desc_t d = sr_adamw();
                d.bf16_stochastic_round = sr;
                sx_param_desc_t pd;
                sx_param_desc_init(&pd, sizeof pd);
                pd.name = "w";
                pd.ndim = 1;
                pd.shape = &kN;
                pd.dtype = SX_DTYPE_BF16;
                sx_memory_stats_t m;
                sx_memory_stats_init(&m, sizeof m);
                std::string out;
                if (sx_add_param_group(g, &d, nullptr) != SX_OK || sx_add_param(g, &pd, nullptr) != SX_OK ||
                    sx_finalize(g) != SX_OK || sx_step(g, nullptr, nullptr) != SX_OK ||
                    sx_get_memory_stats(g, &m) != SX_OK)
                    out = sx_last_error_message();
                const uint64_t want = (sr ? 4u : 8u) * static_cast<uint64_t>(kN) / static_cast<uint64_t>(world);
                const uint64_t params = 2u * kN + (device == kOffloaded ? 2u * kN / world : 0u);
                // (A CUDA group's params are the device's: device_bytes counts them.)
                if (out.empty() && (m.optimizer_bytes != want || m.unsharded_optimizer_bytes != want * world ||
                                    m.param_bytes != params || (m.device_bytes >= 2u * kN) != (device != kCpu)))
                    out = std::string(device_name(device)) + ": bf16_stochastic_round " + std::to_string(sr) +
                          " world " + std::to_string(world) +
                          ": optimizer bytes " + std::to_string(m.optimizer_bytes) + " (unsharded " +
                          std::to_string(m.unsharded_optimizer_bytes) + "), expected " + std::to_string(want) +
                          "; param bytes " + std::to_string(m.param_bytes) + ", device bytes " +
                          std::to_string(m.device_bytes);
                sx_destroy_shard_group(g);
                return out;
            });
            if (!err.empty()) fail_msg("%s", err.c_str());
        }
    }
    }
}

bool says(const char *what) { return std::strstr(sx_last_error_message(), what) != nullptr; }

sx_shard_group_t *bare_group(const std::string &tag, int memory_copies = 0, int device = kCpu) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    const std::string rv = "local://" + tag + "-" + std::to_string(getpid());
    cfg.rendezvous = rv.c_str();
    cfg.world_size = 1;
    cfg.num_threads = 1;
    cfg.memory_copy_interval = memory_copies;
    configure_device(&cfg, device);
    sx_shard_group_t *g = nullptr;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_OK);
    return g;
}

sx_status_t add(sx_shard_group_t *g, const char *name, int32_t dtype, int32_t group, int32_t unit) {
    static const int64_t shape[1] = {64};
    sx_param_desc_t pd;
    sx_param_desc_init(&pd, sizeof pd);
    pd.name = name;
    pd.ndim = 1;
    pd.shape = shape;
    pd.dtype = dtype;
    pd.param_group = group;
    pd.unit = unit;
    return sx_add_param(g, &pd, nullptr);
}

// Optimizers that are not elementwise refuse it at the descriptor; memory copies carry it.
void test_descriptor_refusals(void **) {
    sx_shard_group_t *g = bare_group("sr-desc");
    for (int32_t opt : {SX_OPTIM_LAMB, SX_OPTIM_MUON, SX_OPTIM_ADAFACTOR}) {
        sx_param_group_desc_t d;
        sx_param_group_desc_init(&d, sizeof d, opt);
        d.bf16_stochastic_round = 1;
        assert_int_equal(sx_add_param_group(g, &d, nullptr), SX_ERR_INVALID_ARGUMENT);
        assert_true(says("bf16_stochastic_round"));
    }
    sx_param_group_desc_t d = sr_adamw();
    d.bf16_stochastic_round = 2;
    assert_int_equal(sx_add_param_group(g, &d, nullptr), SX_ERR_INVALID_ARGUMENT);
    int32_t groups = -1;
    assert_int_equal(sx_get_num_param_groups(g, &groups), SX_OK);
    assert_int_equal(groups, 0);
    // Before sx_finalize it may be set by key; after, it is fixed.
    sx_param_group_desc_t plain = sr_adamw();
    plain.bf16_stochastic_round = 0;
    assert_int_equal(sx_add_param_group(g, &plain, nullptr), SX_OK);
    assert_int_equal(sx_set_hyperparameter(g, 0, SX_HP_BF16_STOCHASTIC_ROUND, 1), SX_OK);
    assert_int_equal(add(g, "w", SX_DTYPE_BF16, 0, 0), SX_OK);
    assert_int_equal(sx_finalize(g), SX_OK);
    assert_int_equal(sx_set_hyperparameter(g, 0, SX_HP_BF16_STOCHASTIC_ROUND, 0), SX_ERR_INVALID_STATE);
    double value = -1;
    assert_int_equal(sx_get_hyperparameter(g, 0, SX_HP_BF16_STOCHASTIC_ROUND, &value), SX_OK);
    assert_true(value == 1.0);
    sx_destroy_shard_group(g);
    // Memory copies carry it: a copy holds the bf16 params (2 bytes each) and the bf16
    // moments (4), two copies of one rank's shard of 64 elements.
    g = bare_group("sr-copies", 1);
    d = sr_adamw();
    assert_int_equal(sx_add_param_group(g, &d, nullptr), SX_OK);
    assert_int_equal(add(g, "w", SX_DTYPE_BF16, 0, 0), SX_OK);
    assert_int_equal(sx_finalize(g), SX_OK);
    assert_int_equal(sx_step(g, nullptr, nullptr), SX_OK);
    assert_int_equal(sx_step(g, nullptr, nullptr), SX_OK);
    sx_memory_stats_t m;
    sx_memory_stats_init(&m, sizeof m);
    assert_int_equal(sx_get_memory_stats(g, &m), SX_OK);
    assert_int_equal(m.memory_copy_bytes, 2 * m.param_bytes + 2 * m.optimizer_bytes);
    sx_destroy_shard_group(g);
}

int32_t no_update(const sx_optimizer_piece_t *) { return 0; }

// A custom optimizer is refused even where it takes the key as its own hyperparameter.
void test_custom_refusal(void **) {
    sx_optimizer_hyperparameter_t hp[2] = {{"lr", 0.1, 0, 0}, {"bf16_stochastic_round", 0, 0, 1}};
    sx_optimizer_desc_t od;
    sx_optimizer_desc_init(&od, sizeof od);
    od.name = "sr_probe";
    od.num_hyperparameters = 2;
    od.hyperparameters = hp;
    od.update = no_update;
    int32_t id = -1;
    assert_int_equal(sx_register_optimizer(&od, &id), SX_OK);
    sx_shard_group_t *g = bare_group("sr-custom");
    sx_param_group_desc_t d;
    sx_param_group_desc_init(&d, sizeof d, id);
    d.bf16_stochastic_round = 1;
    assert_int_equal(sx_add_param_group(g, &d, nullptr), SX_ERR_INVALID_ARGUMENT);
    assert_true(says("sr_probe") && says("bf16_stochastic_round"));
    sx_destroy_shard_group(g);
}

// Compares a run's params with `want` (the CPU group's at world 1, stage 1).
void expect_same_params(const std::vector<std::vector<uint16_t>> &want, const std::vector<std::vector<uint16_t>> &got,
                        const char *what) {
    for (size_t p = 0; p < kParams.size(); ++p)
        for (size_t i = 0; i < want[p].size(); ++i)
            if (got.size() != want.size() || got[p].size() != want[p].size() || got[p][i] != want[p][i])
                fail_msg("%s: param %s element %zu is 0x%04x, a CPU group's 0x%04x", what, kParams[p].name, i,
                         got.size() == want.size() && i < got[p].size() ? got[p][i] : 0, want[p][i]);
}

// CUDA groups (the simulated device, whose update runs the CPU kernels over its memory
// as a device's runs its own: the same hash, the same arithmetic; the device kernel
// itself is test_cuda_kernels' on a GPU), keeping their state on the device or
// offloading it to the host (the bf16 params' shard stepped there and copied up), end
// with a CPU group's params bit for bit at worlds 1 to 3 and stages 1 to 3, with bf16,
// 8-bit and fp32 state.
void test_cuda_groups_match_a_cpu_group(void **) {
    SimulatedDevice sim;
    std::vector<std::vector<uint16_t>> want, got;
    for (int32_t state : {SX_STATE_BF16, SX_STATE_8BIT, SX_STATE_FP32}) {
        Checkpoint run;
        run.state_dtype = state;
        std::string err = train(1, 1, &want, kSteps, 3e-3, run);
        if (!err.empty()) fail_msg("CPU: %s", err.c_str());
        const int runs[][2] = {{1, 1}, {2, 2}, {3, 3}, {3, 1}, {2, 3}};
        for (int device : {kOnDevice, kOffloaded})
            for (size_t r = 0; r < (state == SX_STATE_BF16 ? 5u : 2u); ++r) {
                run.device = device;
                err = train(runs[r][0], runs[r][1], &got, kSteps, 3e-3, run);
                const std::string what = std::string(device_name(device)) + ", state dtype " + std::to_string(state) +
                                         ", world " + std::to_string(runs[r][0]) + " stage " +
                                         std::to_string(runs[r][1]);
                if (!err.empty()) fail_msg("%s: %s", what.c_str(), err.c_str());
                expect_same_params(want, got, what.c_str());
            }
    }
}

// Checkpoints go between CPU and CUDA groups at any world size: saved by a CUDA group
// after 3 steps (state on the device, or offloaded), loaded into a CPU group and into
// the other kind of CUDA group, and saved by a CPU group and loaded into both kinds, each
// continues to the params of the 6 steps without a checkpoint, bit for bit.
void test_checkpoints_between_cpu_and_cuda_groups(void **) {
    SimulatedDevice sim;
    std::vector<std::vector<uint16_t>> want, got, saved;
    std::string err = train(1, 1, &want);
    if (!err.empty()) fail_msg("%s", err.c_str());
    const std::string tmp = sxtest::make_tmpdir("sr-cuda-ckpt");
    struct Leg {
        int save_device, save_world, save_stage, load_device, load_world, load_stage;
    };
    const Leg legs[] = {{kOnDevice, 3, 2, kCpu, 2, 3},       {kOffloaded, 2, 1, kCpu, 3, 2},
                        {kCpu, 3, 3, kOnDevice, 2, 1},       {kCpu, 2, 2, kOffloaded, 3, 3},
                        {kOnDevice, 2, 3, kOffloaded, 1, 1}, {kOffloaded, 3, 3, kOnDevice, 2, 2}};
    int k = 0;
    for (const Leg &leg : legs) {
        const std::string dir = tmp + "/leg" + std::to_string(k++);
        Checkpoint save;
        save.save = dir;
        save.device = leg.save_device;
        err = train(leg.save_world, leg.save_stage, &saved, kSteps / 2, 3e-3, save);
        if (!err.empty()) fail_msg("saving on a %s group: %s", device_name(leg.save_device), err.c_str());
        Checkpoint load;
        load.load = dir;
        load.first = kSteps / 2 + 1;
        load.device = leg.load_device;
        err = train(leg.load_world, leg.load_stage, &got, kSteps - kSteps / 2, 3e-3, load);
        const std::string what = std::string("saved by a ") + device_name(leg.save_device) + " group of " +
                                 std::to_string(leg.save_world) + " at stage " + std::to_string(leg.save_stage) +
                                 ", resumed by a " + device_name(leg.load_device) + " group of " +
                                 std::to_string(leg.load_world) + " at stage " + std::to_string(leg.load_stage);
        if (!err.empty()) fail_msg("%s: %s", what.c_str(), err.c_str());
        expect_same_params(want, got, what.c_str());
    }
    sxtest::remove_tree(tmp);
}

// The whole state gathered and scattered back mid-run on CUDA groups changes nothing:
// they end where a CPU group without the round trip does.
void test_whole_state_round_trip_on_cuda_groups(void **) {
    SimulatedDevice sim;
    std::vector<std::vector<uint16_t>> want, got;
    std::string err = train(1, 1, &want);
    if (!err.empty()) fail_msg("%s", err.c_str());
    Checkpoint trip;
    trip.round_trip_after = kSteps / 2;
    for (int device : {kOnDevice, kOffloaded})
        for (const auto &run : {std::make_pair(1, 1), std::make_pair(2, 2), std::make_pair(3, 3)}) {
            trip.device = device;
            err = train(run.first, run.second, &got, kSteps, 3e-3, trip);
            const std::string what = std::string(device_name(device)) + ", world " + std::to_string(run.first) +
                                     " stage " + std::to_string(run.second) + ", a whole-state round trip";
            if (!err.empty()) fail_msg("%s: %s", what.c_str(), err.c_str());
            expect_same_params(want, got, what.c_str());
        }
}

// sx_finalize refuses a param not bf16, and a unit that mixes groups with and without it,
// naming the params.
void test_finalize_refusals(void **) {
    sx_shard_group_t *g = bare_group("sr-fin-dtype");
    sx_param_group_desc_t d = sr_adamw();
    assert_int_equal(sx_add_param_group(g, &d, nullptr), SX_OK);
    assert_int_equal(add(g, "fp32_weight", SX_DTYPE_F32, 0, 0), SX_OK);
    assert_int_equal(sx_finalize(g), SX_ERR_INVALID_ARGUMENT);
    assert_true(says("'fp32_weight'"));
    sx_destroy_shard_group(g);
    g = bare_group("sr-fin-mix");
    sx_param_group_desc_t plain = sr_adamw();
    plain.bf16_stochastic_round = 0;
    assert_int_equal(sx_add_param_group(g, &d, nullptr), SX_OK);
    assert_int_equal(sx_add_param_group(g, &plain, nullptr), SX_OK);
    assert_int_equal(add(g, "rounded", SX_DTYPE_BF16, 0, 4), SX_OK);
    assert_int_equal(add(g, "mastered", SX_DTYPE_BF16, 1, 4), SX_OK);
    assert_int_equal(sx_finalize(g), SX_ERR_INVALID_ARGUMENT);
    assert_true(says("'rounded'") && says("'mastered'"));
    sx_destroy_shard_group(g);
}

// Without masters, a state view of "master" is this rank's piece of the bf16 params
// themselves (SX_DTYPE_BF16, in place; offloaded, their copy on the host that the step
// updates, holding the same bits), and a scatter's "master" is rounded to nearest even
// into the params, as a load rounds a checkpoint's fp32 values; on CPU and CUDA groups.
void master_view_and_scatter(int device) {
    sx_param_group_desc_t d = sr_adamw();
    d.state_dtype = SX_STATE_FP32;
    sx_shard_group_t *g = bare_group("sr-calls-" + std::to_string(device), 0, device);
    assert_int_equal(sx_add_param_group(g, &d, nullptr), SX_OK);
    assert_int_equal(add(g, "w", SX_DTYPE_BF16, 0, 0), SX_OK);
    assert_int_equal(sx_finalize(g), SX_OK);
    assert_int_equal(sx_step(g, nullptr, nullptr), SX_OK);
    sx_view_t pv, view;
    sx_view_init(&pv, sizeof pv);
    sx_view_init(&view, sizeof view);
    assert_int_equal(sx_param_view(g, 0, &pv), SX_OK);
    assert_int_equal(sx_state_view(g, 0, "master", &view), SX_OK);
    assert_int_equal(view.dtype, SX_DTYPE_BF16);
    assert_int_equal(view.numel, 64);
    if (device == kOffloaded)
        assert_memory_equal(view.data, pv.data, 64 * sizeof(uint16_t));
    else
        assert_ptr_equal(view.data, pv.data);
    assert_int_equal(sx_state_view(g, 0, "exp_avg", &view), SX_OK);
    assert_int_equal(view.dtype, SX_DTYPE_F32);
    // Values between bf16's steps (1/128 apart in [1, 2)): the params take the nearest,
    // ties to even.
    auto value = [](int64_t i) { return 1.0f + static_cast<float>(i) / 512.0f; };
    WholeState w;
    w["w/exp_avg"].assign(64, 0.5f);
    w["w/exp_avg_sq"].assign(64, 0.25f);
    w["w/step"] = {7.0f};
    for (int64_t i = 0; i < 64; ++i) w["w/master"].push_back(value(i));
    assert_int_equal(sx_scatter_optim_state(g, 0, scatter_from, &w), SX_OK);
    assert_int_equal(sx_param_view(g, 0, &pv), SX_OK);
    for (int64_t i = 0; i < 64; ++i)
        if (static_cast<uint16_t *>(pv.data)[i] != bf16_nearest(value(i)))
            fail_msg("element %lld: 0x%04x, not %g rounded to nearest (0x%04x)", static_cast<long long>(i),
                     static_cast<uint16_t *>(pv.data)[i], value(i), bf16_nearest(value(i)));
    WholeState back;
    assert_int_equal(sx_gather_optim_state(g, 0, gather_into, &back), SX_OK);
    assert_true(back["w/exp_avg"] == w["w/exp_avg"] && back["w/step"] == w["w/step"]);
    assert_int_equal(sx_step(g, nullptr, nullptr), SX_OK);  // the group goes on
    // ... from the scattered params: the master view shows them after the step too.
    assert_int_equal(sx_param_view(g, 0, &pv), SX_OK);
    assert_int_equal(sx_state_view(g, 0, "master", &view), SX_OK);
    assert_memory_equal(view.data, pv.data, 64 * sizeof(uint16_t));
    // The trainer's own params, broadcast: the view (offloaded, the host's copy, taken
    // from the device again) and the next step start from them.
    std::vector<uint16_t> fresh(64);
    for (int64_t i = 0; i < 64; ++i) fresh[i] = bf16_nearest(0.25f + static_cast<float>(i) / 1024.0f);
    std::memcpy(pv.data, fresh.data(), 64 * sizeof(uint16_t));
    assert_int_equal(sx_broadcast_params(g, 0), SX_OK);
    assert_int_equal(sx_state_view(g, 0, "master", &view), SX_OK);
    assert_memory_equal(view.data, fresh.data(), 64 * sizeof(uint16_t));
    sx_destroy_shard_group(g);
}

void test_master_view_and_scatter(void **) {
    SimulatedDevice sim;
    for (int device : {kCpu, kOnDevice, kOffloaded}) master_view_and_scatter(device);
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vector_loops_match_the_reference),
        cmocka_unit_test(test_rounding_is_unbiased),
        cmocka_unit_test(test_same_bits_at_every_world_and_stage),
        cmocka_unit_test(test_same_bits_with_8bit_state),
        cmocka_unit_test(test_small_updates_are_not_lost),
        cmocka_unit_test(test_checkpoint_resumes_at_another_world),
        cmocka_unit_test(test_no_masters_in_memory),
        cmocka_unit_test(test_descriptor_refusals),
        cmocka_unit_test(test_finalize_refusals),
        cmocka_unit_test(test_master_view_and_scatter),
        cmocka_unit_test(test_whole_state_round_trip),
        cmocka_unit_test(test_custom_refusal),
        cmocka_unit_test(test_cuda_groups_match_a_cpu_group),
        cmocka_unit_test(test_checkpoints_between_cpu_and_cuda_groups),
        cmocka_unit_test(test_whole_state_round_trip_on_cuda_groups),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
