// CUDA groups that offload their state to the host (SX_OFFLOAD_STATE), on the simulated
// device (SX_SIMULATED_DEVICE: device.h), whose memory every call checks it is handed
// where a device would need it, and whose copies run on a copy thread of its own after an
// injected delay. Ranks are threads over local://.
//
// - Offloaded training equals a CPU group's bit for bit: params after 4 steps at worlds
//   1-3, stages 1-3, fp32 and bf16 params, for AdamW, SGD with momentum, Lion, LAMB,
//   Adafactor, Muon and a custom optimizer (the custom one refused by a CUDA group that
//   keeps its state on the device), with clipping, micro-batches and units signalled
//   ready as the backward goes.
// - A group that keeps its state on the device equals the CPU too, for AdamW, LAMB,
//   Adafactor and Muon (the device passes of optim/device_passes.h).
// - Device memory: an offloaded group's device holds the params and gradients alone (bf16:
//   4 bytes per element, plus one unit's fp32 gradient sum); a group that does not offload
//   holds everything there.
// - Checkpoints of an offloaded group load into CPU groups and into CUDA groups that do
//   not offload, at other world sizes, and train on to the same bits; and back.
// - Memory copies are kept of an offloaded group's state, and sx_regroup restores from them.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#ifdef SX_TEST_CUDA
#include <cuda_runtime.h>
#endif

#include "core/device.h"
#include "custom_adamw.h"
#include "process_ranks.h"
#include "run_ranks.h"
#include "sx/sx.h"
#include "sx_cmocka.h"
#include "test_files.h"
#include "test_groups.h"

namespace {

enum class Backend { kCpu, kDevice, kOffload };

struct Case {
    int world = 1, stage = 2, dtype = SX_DTYPE_F32;
    int optimizer = SX_OPTIM_ADAMW;  // or the custom one's id
    bool momentum = false;           // SGD's
    double clip = 0.0;
    bool micro_batches = false;  // one sx_accumulate_grads before each step
    bool signalled = false;      // units signalled ready, last first
    bool same_grads = false;     // every rank writes the same gradients (their mean is exact)
    bool freeze = false;         // after step 1, param 'u' frozen and given new values
    bool scaled = false;         // dynamic loss scaling (from 1024, growing every 2 steps)
    int inf_step = -1;           // the step whose gradient on rank 0 holds an inf
    int nonfinite = SX_NONFINITE_DEFAULT;  // the steps' policy
    int steps = 4;
    int shard_size = 0;  // a mesh: shard groups of this many ranks (0: one group of all)
    int state_dtype = SX_STATE_FP32;  // the param group's; 8-bit makes "w" 64 x 64 (16 blocks)
};

struct ParamDef {
    const char *name;
    int64_t rows, cols;
    int unit;
};
const ParamDef kParams[] = {{"w", 12, 10, 0}, {"u", 6, 5, 0}, {"v", 7, 9, 1}};
constexpr int kParamCount = 3, kUnits = 2;

std::string text(const char *what) { return std::string(what) + ": " + sx_last_error_message(); }
#define TRY(call, what)                          \
    do {                                         \
        if ((call) != SX_OK) return text(what);  \
    } while (0)

uint16_t to_bf16(float f) {  // values the test makes are exact in bf16
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return static_cast<uint16_t>(b >> 16);
}

// Deterministic values: exact in bf16 (a multiple of 1/128 in (-1, 1)).
float value(uint64_t seed) {
    seed = (seed ^ (seed >> 31)) * 0x7fb5d329728ea185ull;
    seed = (seed ^ (seed >> 27)) * 0x81dadef4bc2dd44dull;
    return static_cast<float>(static_cast<int>((seed >> 33) % 255) - 127) / 128.0f;
}

// Whether this run is on a real CUDA device (SX_OFFLOAD_TEST_DEVICE=cuda, as
// scripts/gpu-test.sh runs it), not the simulated one.
bool g_real_device = false;

// Copies between the test's host memory and a view's: a real device's, or the host's (a
// simulated device's memory is the host's).
void to_view(const sx_view_t &v, const void *src, size_t bytes) {
#ifdef SX_TEST_CUDA
    if (g_real_device && v.device == SX_DEVICE_CUDA) {
        const cudaError_t e = cudaMemcpy(v.data, src, bytes, cudaMemcpyHostToDevice);
        if (e == cudaSuccess) return;
        std::fprintf(stderr, "copying into a view: %s\n", cudaGetErrorString(e));
        std::abort();
    }
#endif
    std::memcpy(v.data, src, bytes);
}
void from_view(void *dst, const sx_view_t &v, size_t bytes) {
#ifdef SX_TEST_CUDA
    if (g_real_device && v.device == SX_DEVICE_CUDA) {
        const cudaError_t e = cudaMemcpy(dst, v.data, bytes, cudaMemcpyDeviceToHost);
        if (e == cudaSuccess) return;
        std::fprintf(stderr, "copying out of a view: %s\n", cudaGetErrorString(e));
        std::abort();
    }
#endif
    std::memcpy(dst, v.data, bytes);
}

void write_values(const sx_view_t &v, int dtype, uint64_t seed) {
    std::vector<float> f32(dtype == SX_DTYPE_F32 ? v.numel : 0);
    std::vector<uint16_t> b16(dtype == SX_DTYPE_F32 ? 0 : v.numel);
    for (uint64_t i = 0; i < v.numel; ++i) {
        const float f = value(seed * 1000003ull + i);
        if (dtype == SX_DTYPE_F32)
            f32[i] = f;
        else
            b16[i] = to_bf16(f);
    }
    if (dtype == SX_DTYPE_F32)
        to_view(v, f32.data(), f32.size() * sizeof(float));
    else
        to_view(v, b16.data(), b16.size() * sizeof(uint16_t));
}

// cfg of rank `rank` of c on b; rv is borrowed (it must outlive cfg's use).
std::string group_config(const std::string &rv, int rank, const Case &c, Backend b, sx_group_config_t *cfg) {
    sx_group_config_init(cfg, sizeof *cfg);
    cfg->rendezvous = rv.c_str();
    cfg->rank = rank;
    cfg->world_size = c.world;
    cfg->stage = c.stage;
    cfg->num_threads = 1;
    cfg->timeout_ms = 60000;
    cfg->backend = b == Backend::kCpu ? SX_BACKEND_CPU : SX_BACKEND_CUDA;
    cfg->offload = b == Backend::kOffload ? SX_OFFLOAD_STATE : SX_OFFLOAD_NONE;
    cfg->shard_size = c.shard_size;
    return "";
}

// fn(p, view of param p) for every param, unit by unit (stage 3: each gathered for it).
std::string with_param_views(sx_shard_group_t *g, const Case &c, const std::function<void(int, const sx_view_t &)> &fn) {
    for (int u = 0; u < kUnits; ++u) {
        if (c.stage == 3) TRY(sx_unit_gather(g, u), "gather");
        for (int p = 0; p < kParamCount; ++p) {
            if (kParams[p].unit != u) continue;
            sx_view_t v;
            v.struct_size = sizeof v;
            TRY(sx_param_view(g, p, &v), "param_view");
            fn(p, v);
        }
        if (c.stage == 3) TRY(sx_unit_release(g, u), "release");
    }
    return "";
}

// A group of c's params under optimizer c.optimizer, finalized, with the params' starting
// values written (every rank the same).
std::string make_group(const std::string &rv, int rank, const Case &c, Backend b, sx_shard_group_t **out,
                       int memory_copy_interval = 0) {
    sx_group_config_t cfg;
    group_config(rv, rank, c, b, &cfg);
    cfg.memory_copy_interval = memory_copy_interval;
    TRY(sx_create_shard_group(&cfg, out), "create");
    sx_shard_group_t *g = *out;
    sx_param_group_desc_t d;
    sx_param_group_desc_init(&d, sizeof d, c.optimizer);
    d.lr = c.optimizer == SX_OPTIM_SGD ? 0.1 : 0.01;
    d.weight_decay = 0.01;
    if (c.momentum) d.momentum = 0.9;
    d.state_dtype = c.state_dtype;
    TRY(sx_add_param_group(g, &d, nullptr), "add_param_group");
    for (const ParamDef &p : kParams) {
        sx_param_desc_t pd;
        sx_param_desc_init(&pd, sizeof pd);
        const bool blocks = c.state_dtype == SX_STATE_8BIT && &p == &kParams[0];
        const int64_t shape[2] = {blocks ? 64 : p.rows, blocks ? 64 : p.cols};
        pd.name = p.name;
        pd.ndim = 2;
        pd.shape = shape;
        pd.dtype = c.dtype;
        pd.unit = p.unit;
        TRY(sx_add_param(g, &pd, nullptr), "add_param");
    }
    TRY(sx_finalize(g), "finalize");
    return with_param_views(g, c, [&](int p, const sx_view_t &v) { write_values(v, c.dtype, 7 + static_cast<uint64_t>(p)); });
}

// The gradients of micro-batch `mb` of step `step` on `rank`, added into the views.
std::string write_grads(sx_shard_group_t *g, const Case &c, int rank, int step, int mb, int unit) {
    for (int p = 0; p < kParamCount; ++p) {
        if (unit >= 0 && kParams[p].unit != unit) continue;
        sx_view_t v;
        v.struct_size = sizeof v;
        TRY(sx_grad_view(g, p, &v), "grad_view");
        const int from = c.same_grads ? 0 : rank;
        write_values(v, c.dtype, 1000 + static_cast<uint64_t>(((step * 2 + mb) * 8 + from) * 4 + p));
        if (step == c.inf_step && rank == 0 && p == 2 && mb == 0) {
            const float inf = INFINITY;
            const uint16_t inf16 = to_bf16(inf);
            // Its last element (in the last rank's shard).
            sx_view_t last = v;
            last.data = static_cast<char *>(v.data) + (v.numel - 1) * (c.dtype == SX_DTYPE_F32 ? 4 : 2);
            to_view(last, c.dtype == SX_DTYPE_F32 ? static_cast<const void *>(&inf) : &inf16,
                    c.dtype == SX_DTYPE_F32 ? 4 : 2);
        }
    }
    return "";
}

std::string train(sx_shard_group_t *g, const Case &c, int rank, int first_step, int steps) {
    if (c.scaled && first_step == 0) {
        sx_loss_scaling_t ls;
        sx_loss_scaling_init(&ls, sizeof ls);
        ls.mode = SX_LOSS_SCALING_DYNAMIC;
        ls.init_scale = 1024;
        ls.growth_interval = 2;
        TRY(sx_set_loss_scaling(g, &ls), "set_loss_scaling");
    }
    for (int s = first_step; s < first_step + steps; ++s) {
        if (c.micro_batches) {
            std::string e = write_grads(g, c, rank, s, 1, -1);
            if (!e.empty()) return e;
            TRY(sx_accumulate_grads(g), "accumulate_grads");
        }
        if (c.signalled) {
            for (int u = kUnits - 1; u >= 0; --u) {
                std::string e = write_grads(g, c, rank, s, 0, u);
                if (!e.empty()) return e;
                sx_unit_ready_options_t o;
                sx_unit_ready_options_init(&o, sizeof o);
                TRY(sx_unit_grads_ready(g, u, &o), "unit_grads_ready");
            }
        } else {
            std::string e = write_grads(g, c, rank, s, 0, -1);
            if (!e.empty()) return e;
        }
        sx_step_options_t o;
        sx_step_options_init(&o, sizeof o);
        o.max_grad_norm = c.clip;
        o.nonfinite = c.nonfinite;
        sx_step_result_t r;
        sx_step_result_init(&r, sizeof r);
        TRY(sx_step(g, &o, &r), "step");
        // Skipped exactly where an inf was written and the policy or the scaling skips.
        const bool skips = s == c.inf_step && (c.scaled || c.nonfinite == SX_NONFINITE_SKIP);
        if (r.skipped != (skips ? 1 : 0)) return "step " + std::to_string(s) + ": skipped " + std::to_string(r.skipped);
        if (c.scaled) {
            // torch.cuda.amp.GradScaler's: halved at the inf's step, doubled after every 2
            // steps in a row without one.
            double want = 1024;
            for (int k = 0, in_a_row = 0; k <= s; ++k) {
                in_a_row = k == c.inf_step ? 0 : in_a_row + 1;
                want = k == c.inf_step ? want * 0.5 : in_a_row == 2 ? want * 2 : want;
                if (in_a_row == 2) in_a_row = 0;
            }
            double scale = 0;
            TRY(sx_get_loss_scale(g, &scale), "get_loss_scale");
            if (scale != want)
                return "step " + std::to_string(s) + ": loss scale " + std::to_string(scale) + ", not " +
                       std::to_string(want);
        }
        if (c.freeze && s == 1) {
            // The trainer's own values for a frozen param, which the updates must leave.
            TRY(sx_set_trainable(g, 1, 0), "set_trainable");
            std::string e = with_param_views(g, c, [&](int p, const sx_view_t &v) {
                if (p == 1) write_values(v, c.dtype, 99);
            });
            if (!e.empty()) return e;
        }
    }
    return "";
}

// Every param's values, as bits (stage 3: gathered for it).
std::string read_params(sx_shard_group_t *g, const Case &c, std::vector<std::vector<uint8_t>> *out) {
    out->assign(kParamCount, {});
    return with_param_views(g, c, [&](int p, const sx_view_t &v) {
        (*out)[p].resize(v.numel * (c.dtype == SX_DTYPE_F32 ? 4 : 2));
        from_view((*out)[p].data(), v, (*out)[p].size());
    });
}

// A rendezvous name of its own for every group the program makes.
std::string tag() {
    static int made = 0;
    return std::to_string(getpid()) + "-" + std::to_string(++made);
}

// Trains c on backend b; rank 0's params after it.
std::vector<std::vector<uint8_t>> run(const Case &c, Backend b, const std::string &name) {
    std::vector<std::vector<uint8_t>> params;
    const std::string rv = "local://off-" + name + "-" + tag();
    const std::string err = sxtest::run_ranks(c.world, [&](int rank) -> std::string {
        sx_shard_group_t *g = nullptr;
        std::string e = make_group(rv, rank, c, b, &g);
        if (e.empty()) e = train(g, c, rank, 0, c.steps);
        std::vector<std::vector<uint8_t>> mine;
        if (e.empty()) e = read_params(g, c, &mine);
        if (e.empty() && rank == 0) params = mine;
        sx_destroy_shard_group(g);
        return e;
    });
    if (!err.empty()) fail_msg("%s: %s", name.c_str(), err.c_str());
    return params;
}

std::string describe(const Case &c) {
    char buf[192];
    std::snprintf(buf, sizeof buf, "optimizer %d%s world %d stage %d %s%s%s%s%s", c.optimizer,
                  c.momentum ? " (momentum)" : "", c.world, c.stage, c.dtype == SX_DTYPE_F32 ? "fp32" : "bf16",
                  c.clip > 0 ? " clipped" : "", c.micro_batches ? " micro-batches" : "",
                  c.signalled ? " signalled" : "",
                  c.state_dtype == SX_STATE_8BIT   ? " 8-bit state"
                  : c.state_dtype == SX_STATE_BF16 ? " bf16 state"
                                                   : "");
    return buf;
}

// Element i of a param's bytes (fp32 or bf16) as a float.
float element(const std::vector<uint8_t> &bytes, int dtype, size_t i) {
    uint32_t b = 0;
    if (dtype == SX_DTYPE_F32) {
        std::memcpy(&b, bytes.data() + 4 * i, 4);
    } else {
        uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        b = static_cast<uint32_t>(h) << 16;
    }
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}

// Params equal: bit for bit, or (a real device's kernels against the host's, which may
// round otherwise) within 1e-5 of fp32's magnitude, or one bf16 step.
void expect_params_equal(const Case &c, const std::vector<std::vector<uint8_t>> &pa,
                         const std::vector<std::vector<uint8_t>> &pb, bool exact, const std::string &what) {
    for (int p = 0; p < kParamCount; ++p) {
        assert_int_equal(pa[p].size(), pb[p].size());
        if (exact) {
            if (std::memcmp(pa[p].data(), pb[p].data(), pa[p].size()) != 0)
                fail_msg("%s: param '%s' differs from the CPU group's", what.c_str(), kParams[p].name);
            continue;
        }
        // Muon's products on a device are cuBLAS's bf16 ones, summed in its own order.
        const double rel = c.dtype == SX_DTYPE_F32 ? (c.optimizer == SX_OPTIM_MUON ? 1e-4 : 1e-5) : 1.0 / 128;
        for (size_t i = 0; i < pa[p].size() / (c.dtype == SX_DTYPE_F32 ? 4 : 2); ++i) {
            const float x = element(pa[p], c.dtype, i), y = element(pb[p], c.dtype, i);
            if (!(std::fabs(x - y) <= rel * std::max(std::fabs(x), std::fabs(y)) + 1e-7))
                fail_msg("%s: param '%s' element %zu is %.9g, the CPU group's %.9g", what.c_str(), kParams[p].name, i,
                         static_cast<double>(y), static_cast<double>(x));
        }
    }
}

void expect_same(const Case &c, Backend a, Backend b) {
    const std::string what = describe(c);
    const auto pa = run(c, a, "a"), pb = run(c, b, "b");
    expect_params_equal(c, pa, pb, !(g_real_device && (a == Backend::kDevice || b == Backend::kDevice)), what);
    // The run changed the params (the comparison is of something).
    sx_view_t start;
    start.device = SX_DEVICE_CPU;
    std::vector<uint8_t> bytes(pa[0].size());
    start.data = bytes.data();
    start.numel = pa[0].size() / (c.dtype == SX_DTYPE_F32 ? 4 : 2);
    write_values(start, c.dtype, 7);
    assert_true(std::memcmp(bytes.data(), pa[0].data(), bytes.size()) != 0);
}

int custom_id() {
    static int32_t id = -1;
    if (id < 0) assert_int_equal(custom_adamw_register(&id), SX_OK);
    return id;
}

void test_every_optimizer_offloaded_equals_the_cpu(void **) {
    struct Opt {
        int kind;
        bool momentum;
    };
    const Opt opts[] = {{SX_OPTIM_ADAMW, false}, {SX_OPTIM_SGD, true},    {SX_OPTIM_LION, false},
                        {SX_OPTIM_LAMB, false},  {SX_OPTIM_ADAFACTOR, false}, {SX_OPTIM_MUON, false},
                        {custom_id(), false}};
    for (const Opt &o : opts)
        for (int world = 1; world <= 3; ++world)
            for (int stage = 1; stage <= 3; ++stage)
                for (int dtype : {SX_DTYPE_F32, SX_DTYPE_BF16}) {
                    Case c;
                    c.optimizer = o.kind;
                    c.momentum = o.momentum;
                    c.world = world;
                    c.stage = stage;
                    c.dtype = dtype;
                    c.clip = world == 2 ? 0.5 : 0.0;
                    expect_same(c, Backend::kCpu, Backend::kOffload);
                }
}

// Packed optimizer state (bf16 slots, 8-bit codes and scales) on a CUDA group, as a CPU
// group's, bit for bit: offloaded, in host memory and stepped by the CPU kernels; kept on
// the device, in its memory and stepped by its kernels (on a real device the CUDA
// kernels, whose 8-bit blocks are one thread block each; on the simulated one the
// host's). "w" is 16 blocks of 8-bit state, split between ranks at block boundaries.
void test_packed_state_equals_the_cpu(void **) {
    for (Backend b : {Backend::kOffload, Backend::kDevice})
        for (int state : {SX_STATE_BF16, SX_STATE_8BIT})
            for (int optimizer : {SX_OPTIM_ADAMW, SX_OPTIM_SGD})
                for (int world = 1; world <= 3; ++world)
                    for (int stage = 1; stage <= 3; ++stage) {
                        Case c;
                        c.optimizer = optimizer;
                        c.momentum = optimizer == SX_OPTIM_SGD;
                        c.world = world;
                        c.stage = stage;
                        c.dtype = stage == 2 ? SX_DTYPE_BF16 : SX_DTYPE_F32;
                        c.clip = world == 2 ? 0.5 : 0.0;
                        c.signalled = b == Backend::kDevice && stage == 3;
                        c.state_dtype = state;
                        expect_same(c, Backend::kCpu, b);
                    }
}

// A param frozen mid-run keeps the values the trainer gives it: the host's copy of the
// params goes to the device for the updated params alone.
void test_frozen_params_keep_the_trainers_values(void **) {
    for (int stage = 1; stage <= 3; ++stage)
        for (int dtype : {SX_DTYPE_F32, SX_DTYPE_BF16}) {
            Case c;
            c.world = 2;
            c.stage = stage;
            c.dtype = dtype;
            c.freeze = true;
            expect_same(c, Backend::kCpu, Backend::kOffload);
        }
}

// The host's updates overlap the copies: with each copy taking 2 ms, an offloaded step's
// host work (updates of one unit) runs while another unit's gradients come down or its
// params go up, as the simulated device counts.
void test_updates_overlap_the_copies(void **) {
    setenv("SX_SIMULATED_DEVICE", "delay_us=2000", 1);
    uint64_t calls0 = 0, overlapped0 = 0, calls1 = 0, overlapped1 = 0;
    sx::core::simulated_overlap_counts(&calls0, &overlapped0);
    Case c;
    c.steps = 2;
    for (int dtype : {SX_DTYPE_F32, SX_DTYPE_BF16}) {
        c.dtype = dtype;
        expect_same(c, Backend::kCpu, Backend::kOffload);
    }
    sx::core::simulated_overlap_counts(&calls1, &overlapped1);
    setenv("SX_SIMULATED_DEVICE", "delay_us=20", 1);
    assert_true(calls1 > calls0);
    if (overlapped1 == overlapped0)
        fail_msg("none of %llu host calls ran while a copy was in flight",
                 static_cast<unsigned long long>(calls1 - calls0));
}

// The same over NCCL's memory rules (SX_SIMULATED_DEVICE=...,nccl: ranks on separate
// devices, where the transport takes device memory for data and host memory for its small
// all-reduces): host memory handed to the group's communicators (the norm's and the
// optimizers' small exchanges, the custom optimizers' verdicts) is staged through the
// device.
void test_offloaded_over_nccl_rules(void **) {
    setenv("SX_SIMULATED_DEVICE", "delay_us=20,nccl", 1);
    for (int kind : {SX_OPTIM_ADAMW, SX_OPTIM_LAMB, SX_OPTIM_ADAFACTOR, SX_OPTIM_MUON, custom_id()})
        for (int world = 2; world <= 3; ++world)
            for (int stage = 1; stage <= 3; ++stage)
                for (int dtype : {SX_DTYPE_F32, SX_DTYPE_BF16}) {
                    Case c;
                    c.optimizer = kind;
                    c.world = world;
                    c.stage = stage;
                    c.dtype = dtype;
                    c.clip = 0.5;
                    c.signalled = stage == 2;
                    expect_same(c, Backend::kCpu, Backend::kOffload);
                    if (kind == SX_OPTIM_ADAMW) expect_same(c, Backend::kCpu, Backend::kDevice);
                }
    setenv("SX_SIMULATED_DEVICE", "delay_us=20", 1);
}

// Loss scaling and non-finite gradients as on the CPU: an inf in one rank's gradient at
// step 2 skips the step under dynamic loss scaling (which backs off) and under
// SX_NONFINITE_SKIP, and is kept under the default policy (which then writes it).
void test_loss_scaling_and_nonfinite_offloaded(void **) {
    for (int stage = 1; stage <= 3; ++stage)
        for (int variant = 0; variant < 3; ++variant) {
            Case c;
            c.world = 2;
            c.stage = stage;
            c.dtype = SX_DTYPE_BF16;
            c.inf_step = 2;
            c.scaled = variant == 0;
            c.nonfinite = variant == 1 ? SX_NONFINITE_SKIP : SX_NONFINITE_DEFAULT;
            c.clip = variant == 2 ? 0.0 : 1.0;
            c.signalled = stage == 2;
            expect_same(c, Backend::kCpu, Backend::kOffload);
        }
}

void test_micro_batches_and_signals_offloaded(void **) {
    for (int stage = 1; stage <= 3; ++stage)
        for (int dtype : {SX_DTYPE_F32, SX_DTYPE_BF16})
            for (int variant = 0; variant < 3; ++variant) {
                Case c;
                c.world = 2;
                c.stage = stage;
                c.dtype = dtype;
                c.micro_batches = variant != 1;
                c.signalled = variant != 0;
                c.clip = 1.0;
                expect_same(c, Backend::kCpu, Backend::kOffload);
            }
}

// A group of one rank that keeps its state on the device; the caller destroys it.
sx_shard_group_t *one_device_state_rank(const char *name) {
    const std::string rv = std::string("local://off-") + name + "-" + tag();
    Case c;
    sx_group_config_t cfg;
    group_config(rv, 0, c, Backend::kDevice, &cfg);
    sx_shard_group_t *g = nullptr;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_OK);
    return g;
}

// Whether a CUDA group that keeps its state on the device takes a Muon param group: on a
// real device, where cuBLAS can be opened (the refusal printed where not).
bool device_runs_muon() {
    sx_shard_group_t *g = one_device_state_rank("muon");
    sx_param_group_desc_t d;
    sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_MUON);
    const sx_status_t s = sx_add_param_group(g, &d, nullptr);
    if (s != SX_OK) {
        if (s != SX_ERR_UNSUPPORTED || !std::strstr(sx_last_error_message(), "cuBLAS"))
            fail_msg("%s", sx_last_error_message());
        std::printf("Muon on the device not tested: %s\n", sx_last_error_message());
    }
    sx_destroy_shard_group(g);
    return s == SX_OK;
}

// A group that keeps its state on the device: the elementwise optimizers' kernels, and
// LAMB's, Adafactor's and Muon's device passes (their runs' sums added on the host; on the
// simulated device the kernels' bodies run one element at a time, and Muon's
// Newton-Schulz iterations are the host's), give the CPU's bits (a real device's Muon
// products are cuBLAS's: close to them).
// The passes add their double sums in another order than the CPU's loops, which the
// floats derived from them (29 bits shorter) do not see. A group of one rank hands the
// update its bf16 gradients as they are (the device widens them as it reads them), and
// the elements so widened are counted (simulated device).
void test_device_state_equals_the_cpu(void **) {
    const bool muon = device_runs_muon();
    if (!g_real_device) assert_true(muon);  // the simulated device runs the host's iterations
    for (int kind : {SX_OPTIM_ADAMW, SX_OPTIM_LAMB, SX_OPTIM_ADAFACTOR, SX_OPTIM_MUON})
        for (int world = 1; world <= 3; ++world)
            for (int stage = 1; stage <= 3; ++stage)
                for (int dtype : {SX_DTYPE_F32, SX_DTYPE_BF16}) {
                    if (kind == SX_OPTIM_MUON && !muon) continue;
                    const uint64_t widened = sx::core::simulated_widened_grads();
                    Case c;
                    c.optimizer = kind;
                    c.world = world;
                    c.stage = stage;
                    c.dtype = dtype;
                    c.clip = world != 2 ? 0.5 : 0.0;
                    c.signalled = stage == 2;
                    expect_same(c, Backend::kCpu, Backend::kDevice);
                    // AdamW's bf16 gradients at one rank: the update's own (4 steps, each
                    // of every element); the device passes read fp32 sums.
                    const uint64_t numel = 12 * 10 + 6 * 5 + 7 * 9;
                    const bool fused = kind == SX_OPTIM_ADAMW && world == 1 && dtype == SX_DTYPE_BF16;
                    if (!g_real_device && (sx::core::simulated_widened_grads() - widened >= 4 * numel) != fused)
                        fail_msg("%s: %llu gradients widened by the update", describe(c).c_str(),
                                 static_cast<unsigned long long>(sx::core::simulated_widened_grads() - widened));
                }
    // The 16-bit gradients read as they are under loss scaling, an inf in them, and the
    // nonfinite policies: the same skips and bits as the CPU.
    for (int stage = 1; stage <= 3; ++stage)
        for (int variant = 0; variant < 2; ++variant) {
            Case c;
            c.stage = stage;
            c.dtype = SX_DTYPE_BF16;
            c.inf_step = 2;
            c.scaled = variant == 0;
            c.nonfinite = variant == 1 ? SX_NONFINITE_SKIP : SX_NONFINITE_DEFAULT;
            expect_same(c, Backend::kCpu, Backend::kDevice);
        }
}

// A mesh of CUDA groups (2 shard groups of 2 ranks, replicas of each other, all on one
// device): each shard group reduces and gathers its own, the replicas all-reduce their
// shards, offloaded or not, at stages 1-3, as CPU groups do; and over NCCL's memory rules
// (the simulated device's stand-in: each rank on a device of its own).
void test_meshes_equal_the_cpu(void **) {
    for (bool nccl : {false, true})
    for (Backend b : {Backend::kDevice, Backend::kOffload})
        for (int stage = 1; stage <= 3; ++stage)
            for (int dtype : {SX_DTYPE_F32, SX_DTYPE_BF16}) {
                if (nccl && (g_real_device || dtype == SX_DTYPE_F32)) continue;
                if (!g_real_device) setenv("SX_SIMULATED_DEVICE", nccl ? "delay_us=20,nccl" : "delay_us=20", 1);
                Case c;
                c.world = 4;
                c.shard_size = 2;
                c.stage = stage;
                c.dtype = dtype;
                c.clip = stage == 2 ? 0.5 : 0.0;
                c.signalled = stage != 1;
                c.optimizer = stage == 3 ? SX_OPTIM_LAMB : SX_OPTIM_ADAMW;
                expect_same(c, Backend::kCpu, b);
            }
    if (!g_real_device) setenv("SX_SIMULATED_DEVICE", "delay_us=20", 1);
}

void test_device_state_refuses_host_optimizers(void **) {
    sx_shard_group_t *g = one_device_state_rank("refuse");
    sx_param_group_desc_t d;
    sx_param_group_desc_init(&d, sizeof d, custom_id());
    assert_int_equal(sx_add_param_group(g, &d, nullptr), SX_ERR_UNSUPPORTED);
    assert_non_null(std::strstr(sx_last_error_message(), "SX_OFFLOAD_STATE"));
    sx_destroy_shard_group(g);
    // A bad offload setting names itself.
    const std::string rv2 = "local://off-refuse-" + tag();
    Case c;
    sx_group_config_t cfg;
    group_config(rv2, 0, c, Backend::kOffload, &cfg);
    cfg.offload = 7;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_ERR_INVALID_ARGUMENT);
    if (!std::strstr(sx_last_error_message(), "offload 7")) fail_msg("%s", sx_last_error_message());
}

void test_device_bytes(void **) {
    for (int stage : {2, 3})
    for (Backend b : {Backend::kOffload, Backend::kDevice, Backend::kCpu}) {
        const std::string rv = "local://off-bytes-" + std::to_string(static_cast<int>(b)) + "-" + tag();
        Case c;
        c.world = 2;
        c.stage = stage;
        c.dtype = SX_DTYPE_BF16;
        std::vector<sx_memory_stats_t> stats(2);
        std::vector<std::vector<uint64_t>> padded(2), shard(2);
        const std::string err = sxtest::run_ranks(2, [&](int rank) -> std::string {
            sx_shard_group_t *g = nullptr;
            std::string e = make_group(rv, rank, c, b, &g);
            if (e.empty()) e = train(g, c, rank, 0, 1);
            if (e.empty()) {
                stats[rank].struct_size = sizeof stats[rank];
                if (sx_get_memory_stats(g, &stats[rank]) != SX_OK) e = text("memory_stats");
            }
            for (int u = 0; u < kUnits && e.empty(); ++u) {
                sx_unit_info_t info;
                sx_unit_info_init(&info, sizeof info);
                if (sx_get_unit_info(g, u, &info) != SX_OK) e = text("unit_info");
                padded[rank].push_back(info.padded_numel);
                shard[rank].push_back(info.shard_numel);
            }
            sx_destroy_shard_group(g);
            return e;
        });
        if (!err.empty()) fail_msg("%s", err.c_str());
        const sx_memory_stats_t &m = stats[0];
        uint64_t elements = 0, most_shard = 0, shards = 0;
        for (int u = 0; u < kUnits; ++u) {
            elements += padded[0][u];
            shards += shard[0][u];
            most_shard = std::max<uint64_t>(most_shard, shard[0][u]);
        }
        if (b == Backend::kCpu) {
            assert_int_equal(m.device_bytes, 0);
        } else if (b == Backend::kDevice) {
            assert_int_equal(m.device_bytes, m.param_bytes + m.grad_bytes + m.optimizer_bytes);
        } else if (stage == 2) {
            // bf16 params and gradients (2 + 2 bytes per element) and two units' fp32 sums
            // of their 16-bit gradients (one copied down while the next is reduced): the
            // rest is on the host.
            assert_int_equal(m.device_bytes, 4 * elements + 2 * 4 * most_shard);
        } else {
            // Stage 3: the gradients, the two sums and the units gathered now (param_bytes
            // but for this rank's own shard of the params, which is on the host).
            assert_int_equal(m.device_bytes, 2 * elements + 2 * 4 * most_shard + m.param_bytes - 2 * shards);
            assert_true(m.param_bytes > 2 * shards);  // a unit is gathered (the prefetch)
            assert_true(m.optimizer_bytes >= 3 * 4 * (elements / 2));  // masters + 2 slots, on the host
        }
    }
}

// Runs fn(rank, group) on c.world ranks of a new group of c on backend b, after `load` (if
// not empty) was loaded into it; rank 0's params after fn.
std::vector<std::vector<uint8_t>> with_group(const Case &c, Backend b, const std::string &load,
                                             const std::function<std::string(int, sx_shard_group_t *)> &fn) {
    std::vector<std::vector<uint8_t>> params;
    const std::string rv = "local://off-ck-" + tag();
    const std::string err = sxtest::run_ranks(c.world, [&](int rank) -> std::string {
        sx_shard_group_t *g = nullptr;
        std::string e = make_group(rv, rank, c, b, &g);
        if (e.empty() && !load.empty()) {
            sx_load_options_t lo;
            sx_load_optim_state_options_init(&lo, sizeof lo);
            lo.path = load.c_str();
            if (sx_load_optim_state(g, &lo) != SX_OK) e = text("load");
        }
        if (e.empty()) e = fn(rank, g);
        std::vector<std::vector<uint8_t>> mine;
        if (e.empty()) e = read_params(g, c, &mine);
        if (e.empty() && rank == 0) params = mine;
        sx_destroy_shard_group(g);
        return e;
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
    return params;
}

std::string save(sx_shard_group_t *g, const std::string &path) {
    return sxtest::save_synchronously(g, path) == SX_OK ? "" : text("save");
}

void expect_params(const std::vector<std::vector<uint8_t>> &want, const std::vector<std::vector<uint8_t>> &got,
                   const char *what) {
    for (int p = 0; p < kParamCount; ++p)
        if (want[p] != got[p]) fail_msg("%s: param '%s' differs from the uninterrupted run's", what, kParams[p].name);
}

// The run the checkpoint tests save: 2 ranks at stage 2, bf16 params.
Case saved_case(int state_dtype) {
    Case c;
    c.world = 2;
    c.stage = 2;
    c.dtype = SX_DTYPE_BF16;
    c.state_dtype = state_dtype;
    return c;
}

// A resume of a checkpoint in a group of `backend`, at another world size and stage.
struct Resume {
    Backend backend;
    int world, stage;
    const char *what;
};

// Each resume (where `compared` takes its backend) of checkpoint `path`, trained 2 steps
// more as `after` says, gives the uninterrupted run's params.
void expect_resumes(const std::vector<std::vector<uint8_t>> &uninterrupted, const Case &after, const std::string &path,
                    const std::vector<Resume> &resumes, const std::function<bool(Backend)> &compared) {
    for (const Resume &r : resumes) {
        if (!compared(r.backend)) continue;
        Case rc = after;
        rc.world = r.world;
        rc.stage = r.stage;
        expect_params(uninterrupted,
                      with_group(rc, r.backend, path, [&](int rank, sx_shard_group_t *g) { return train(g, rc, rank, 3, 2); }),
                      r.what);
    }
}

// An offloaded group's checkpoint (2 ranks, stage 2, bf16) resumes in CPU groups and in a
// CUDA group that keeps its state on the device, at other world sizes and stages, and a
// CPU group's checkpoint of it resumes in an offloaded group: the same bits as the run
// that went on. The gradients after the save are the same on every rank, so that their
// mean is exact at any world size.
void test_checkpoints_move_between_offloaded_and_other_groups(void **) {
    const std::string dir = sxtest::make_tmpdir("offload");
    const std::string a = dir + "/a", b = dir + "/b";
    const Case c = saved_case(SX_STATE_FP32);
    Case after = c;
    after.same_grads = true;
    const auto uninterrupted = with_group(c, Backend::kOffload, "", [&](int rank, sx_shard_group_t *g) {
        std::string e = train(g, c, rank, 0, 3);
        if (e.empty()) e = save(g, a);
        return e.empty() ? train(g, after, rank, 3, 2) : e;
    });
    // A real device's kernels round as torch's CUDA ones do, not bit for bit as the host's.
    expect_resumes(uninterrupted, after, a,
                   {Resume{Backend::kCpu, 1, 1, "a CPU group of 1 rank at stage 1"},
                    Resume{Backend::kCpu, 4, 3, "a CPU group of 4 ranks at stage 3"},
                    Resume{Backend::kDevice, 1, 2, "a CUDA group that keeps its state on the device"},
                    Resume{Backend::kOffload, 4, 1, "an offloaded group of 4 ranks at stage 1"}},
                   [](Backend b) { return !(g_real_device && b == Backend::kDevice); });
    // And back: a CPU group's save of the loaded state resumes in an offloaded group.
    Case cpu = after;
    cpu.world = 1;
    with_group(cpu, Backend::kCpu, a, [&](int, sx_shard_group_t *g) { return save(g, b); });
    Case back = after;
    back.stage = 3;
    expect_params(uninterrupted,
                  with_group(back, Backend::kOffload, b, [&](int rank, sx_shard_group_t *g) { return train(g, back, rank, 3, 2); }),
                  "an offloaded group from a CPU group's checkpoint");
    sxtest::remove_tree(dir);
}

// A device-state group's packed state (2 ranks, stage 2, 8-bit and bf16) saves with its
// codes and scales read back from the device, and loads into CPU groups and into device
// groups at other world sizes and stages (1 and 4: the mean of equal bf16 gradients is
// exact there), which train on to the same bits as the run that went on; a CPU group's checkpoint of it loads back into a device group. Its memory stats
// count the packed slots on the device.
void test_packed_checkpoints_move_between_device_and_cpu(void **) {
    for (int state : {SX_STATE_8BIT, SX_STATE_BF16}) {
        const std::string dir = sxtest::make_tmpdir("offload-packed");
        const std::string a = dir + "/a", b = dir + "/b";
        const Case c = saved_case(state);
        Case after = c;
        after.same_grads = true;
        std::vector<sx_memory_stats_t> stats(2);
        const auto uninterrupted = with_group(c, Backend::kDevice, "", [&](int rank, sx_shard_group_t *g) {
            std::string e = train(g, c, rank, 0, 3);
            stats[rank].struct_size = sizeof stats[rank];
            if (e.empty() && sx_get_memory_stats(g, &stats[rank]) != SX_OK) e = text("memory_stats");
            if (e.empty()) e = save(g, a);
            return e.empty() ? train(g, after, rank, 3, 2) : e;
        });
        const sx_memory_stats_t &m = stats[0];
        assert_int_equal(m.device_bytes, m.param_bytes + m.grad_bytes + m.optimizer_bytes);
        // A real device's run is compared with device runs alone, as above.
        expect_resumes(uninterrupted, after, a,
                       {Resume{Backend::kCpu, 1, 1, "a CPU group of 1 rank at stage 1"},
                        Resume{Backend::kCpu, 4, 3, "a CPU group of 4 ranks at stage 3"},
                        Resume{Backend::kDevice, 4, 1, "a device-state group of 4 ranks at stage 1"},
                        Resume{Backend::kOffload, 1, 3, "an offloaded group of 1 rank at stage 3"}},
                       [](Backend b) { return !g_real_device || b == Backend::kDevice; });
        Case cpu = after;
        cpu.world = 4;
        cpu.stage = 1;
        with_group(cpu, Backend::kCpu, a, [&](int, sx_shard_group_t *g) { return save(g, b); });
        Case back = after;
        back.stage = 3;
        expect_params(uninterrupted,
                      with_group(back, Backend::kDevice, b,
                                 [&](int rank, sx_shard_group_t *g) { return train(g, back, rank, 3, 2); }),
                      "a device-state group from a CPU group's checkpoint");
        sxtest::remove_tree(dir);
    }
}

// Memory copies of a CUDA group's state are in host memory, whether the state is there
// (offloaded) or on the device (copied down on the device's copy engine): each rank holds
// at least its own copy of its shard (sx_regroup from them: test_regroup).
void test_memory_copies_of_cuda_groups(void **) {
    for (Backend b : {Backend::kOffload, Backend::kDevice}) {
        Case c;
        c.world = 3;
        std::vector<uint64_t> copy_bytes(3), optimizer_bytes(3);
        const std::string rv = "local://off-copies-" + tag();
        const std::string err = sxtest::run_ranks(3, [&](int rank) -> std::string {
            sx_shard_group_t *g = nullptr;
            std::string e = make_group(rv, rank, c, b, &g, 1);
            if (e.empty()) e = train(g, c, rank, 0, 2);
            sx_memory_stats_t m;
            m.struct_size = sizeof m;
            if (e.empty() && sx_get_memory_stats(g, &m) != SX_OK) e = text("memory_stats");
            copy_bytes[rank] = m.memory_copy_bytes;
            optimizer_bytes[rank] = m.optimizer_bytes;
            sx_destroy_shard_group(g);
            return e;
        });
        if (!err.empty()) fail_msg("%s", err.c_str());
        for (int r = 0; r < 3; ++r) assert_true(optimizer_bytes[r] > 0 && copy_bytes[r] >= optimizer_bytes[r]);
    }
}

// The case the process ranks run: 3 processes over tcp:// at stage 3, bf16, LAMB.
Case process_case() {
    Case c;
    c.world = 3;
    c.stage = 3;
    c.dtype = SX_DTYPE_BF16;
    c.optimizer = SX_OPTIM_LAMB;
    c.clip = 1.0;
    return c;
}

// A rank of test_ranks_as_processes: its offloaded group trains the case; rank 0 writes
// its params into the file `out`.
int child_main(int argc, char **argv) {
    sxtest::ChildArgs a;
    if (!sxtest::parse_child_args(argc, argv, &a)) return 2;
    const Case c = process_case();
    sx_shard_group_t *g = nullptr;
    std::string e = make_group(a.rendezvous, a.rank, c, Backend::kOffload, &g);
    if (e.empty()) e = train(g, c, a.rank, 0, c.steps);
    std::vector<std::vector<uint8_t>> params;
    if (e.empty()) e = read_params(g, c, &params);
    sx_destroy_shard_group(g);
    if (!e.empty()) {
        std::fprintf(stderr, "rank %d: %s\n", a.rank, e.c_str());
        return 1;
    }
    std::string bytes;
    for (const std::vector<uint8_t> &p : params) bytes.append(p.begin(), p.end());
    return a.rank != 0 || sxtest::write_file(a.get("out", ""), bytes) ? 0 : 1;
}

// Ranks as processes over tcp:// (shared memory between them, staged from the simulated
// device): the same bits as CPU ranks that are threads.
void test_ranks_as_processes(void **) {
    const std::string dir = sxtest::make_tmpdir("offload-ranks");
    const std::string out = dir + "/params";
    const std::string err = sxtest::run_process_ranks(3, {"out", out}, 120);
    if (!err.empty()) fail_msg("%s", err.c_str());
    const auto want = run(process_case(), Backend::kCpu, "proc");
    std::string bytes;
    for (const std::vector<uint8_t> &p : want) bytes.append(p.begin(), p.end());
    assert_true(sxtest::read_file(out) == bytes);
    sxtest::remove_tree(dir);
}

}  // namespace

// On a real device (SX_OFFLOAD_TEST_DEVICE=cuda): the tests whose groups it runs as the
// simulated device does (a device-state group's CUDA kernels and passes against the CPU's
// too). The others count the simulated device's overlap, or stand in for NCCL.
int run_on_a_real_device() {
#ifndef SX_TEST_CUDA
    std::printf("SX_OFFLOAD_TEST_DEVICE=cuda: this build has no CUDA\n");
    return 77;
#else
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        std::printf("SX_OFFLOAD_TEST_DEVICE=cuda: no CUDA device here\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_optimizer_offloaded_equals_the_cpu),
        cmocka_unit_test(test_packed_state_equals_the_cpu),
        cmocka_unit_test(test_micro_batches_and_signals_offloaded),
        cmocka_unit_test(test_loss_scaling_and_nonfinite_offloaded),
        cmocka_unit_test(test_frozen_params_keep_the_trainers_values),
        cmocka_unit_test(test_device_state_equals_the_cpu),
        cmocka_unit_test(test_meshes_equal_the_cpu),
        cmocka_unit_test(test_device_state_refuses_host_optimizers),
        cmocka_unit_test(test_device_bytes),
        cmocka_unit_test(test_checkpoints_move_between_offloaded_and_other_groups),
        cmocka_unit_test(test_packed_checkpoints_move_between_device_and_cpu),
        cmocka_unit_test(test_memory_copies_of_cuda_groups),
        cmocka_unit_test(test_ranks_as_processes),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
#endif
}

int main(int argc, char **argv) {
    const char *device = std::getenv("SX_OFFLOAD_TEST_DEVICE");
    g_real_device = device && std::strcmp(device, "cuda") == 0;
    // Otherwise every CUDA group of this program runs on the simulated device, its copies
    // delayed.
    if (!g_real_device) setenv("SX_SIMULATED_DEVICE", "delay_us=20", 1);
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    if (g_real_device) return run_on_a_real_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_optimizer_offloaded_equals_the_cpu),
        cmocka_unit_test(test_packed_state_equals_the_cpu),
        cmocka_unit_test(test_micro_batches_and_signals_offloaded),
        cmocka_unit_test(test_loss_scaling_and_nonfinite_offloaded),
        cmocka_unit_test(test_offloaded_over_nccl_rules),
        cmocka_unit_test(test_updates_overlap_the_copies),
        cmocka_unit_test(test_frozen_params_keep_the_trainers_values),
        cmocka_unit_test(test_device_state_equals_the_cpu),
        cmocka_unit_test(test_meshes_equal_the_cpu),
        cmocka_unit_test(test_device_state_refuses_host_optimizers),
        cmocka_unit_test(test_device_bytes),
        cmocka_unit_test(test_checkpoints_move_between_offloaded_and_other_groups),
        cmocka_unit_test(test_packed_checkpoints_move_between_device_and_cpu),
        cmocka_unit_test(test_memory_copies_of_cuda_groups),
        cmocka_unit_test(test_ranks_as_processes),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
