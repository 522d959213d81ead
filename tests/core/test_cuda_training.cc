// A character-level language model (samples/c/train_charlm.c's: the embeddings of the
// previous 3 characters, one tanh layer of 128, a softmax over the characters; one unit
// per layer) trained for 200 steps by a one-rank group on the CUDA backend and by the
// same group on the CPU backend, in lockstep: bf16 params with fp32 masters, bf16
// gradients, dynamic loss scaling (an overflow injected at step 60 is skipped by both),
// AdamW, clipping at 1. The model's forward and backward run on the host over copies of
// the views (the device's params copied down, its gradients copied up), so both groups
// see the same arithmetic and differ only in what sx does with it.
//
// Tolerance: the loss at every step within 1% (relative) of the CPU's. The updates are
// torch-exact on both backends, but each adds its clipping norm's squares its own way
// (see test_cuda_group.cc), so the clipping coefficients, and through bf16 rounding the
// params, may part in their last bits; the run prints the largest difference it saw.
// The loss must also fall (the last 20 steps' mean below 0.75 of the first step's), so
// that matching curves are curves of a model that trains.
//
// Then the checkpoints: the device group's state after step 200 saved, loaded into a new
// CPU group, both trained 3 more steps with equal losses; that CPU group's checkpoint
// loaded into a new CUDA group, and again. The loss scale travels with them.
//
// Without a CUDA device the program says why and exits 77 (ctest: Skipped).
#include <cuda_runtime.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/runtime.h"
#include "sx/sx.h"
#include "sx_cmocka.h"
#include "test_files.h"

namespace {

bool g_have_device = false;
std::string g_no_device_reason;

constexpr int kContext = 3, kEmbed = 16, kHidden = 128, kBatch = 64, kSteps = 200, kOverflowStep = 60;
constexpr int kIn = kContext * kEmbed;

void ok(sx_status_t s, const char *what) {
    if (s != SX_OK) fail_msg("%s: %s", what, sx_last_error_message());
}

uint64_t next(uint64_t *s) {  // splitmix64
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
float uniform(uint64_t *s) { return static_cast<float>((next(s) >> 40) * (1.0 / 16777216.0)); }

// A text of words drawn with fixed odds (something a model of 3 characters can learn),
// as indices into its alphabet.
struct Text {
    std::vector<uint8_t> ids;
    int vocab = 0;
};
Text make_text() {
    static const char *words[] = {"the ", "of ", "and ", "to ", "a ", "in ", "program ", "license ",
                                  "work ", "you ", "any ", "this ", "or ", "that ", "is ", "copy ",
                                  "free ", "software ", "source ", "code ", "may ", "not ", "by ", "with "};
    uint64_t s = 42;
    std::string text;
    while (text.size() < 200000) {
        const uint64_t r = next(&s) % 100;
        text += words[r < 40 ? r % 6 : r % 24];
    }
    Text t;
    int index[256];
    std::memset(index, -1, sizeof index);
    for (unsigned char c : text) {
        if (index[c] < 0) index[c] = t.vocab++;
        t.ids.push_back(static_cast<uint8_t>(index[c]));
    }
    return t;
}

// bf16 <-> fp32 on the host (round to nearest even; the tests' values are finite).
float from_bf16(uint16_t h) {
    const uint32_t b = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
uint16_t to_bf16(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40u);
    return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

enum { kE, kW1, kB1, kW2, kB2, kParams };

// One group and the host copies of its params and gradients (fp32 values of the bf16s).
struct Model {
    sx_shard_group_t *g = nullptr;
    bool device = false;
    int vocab = 0;
    std::vector<float> p[kParams], grad[kParams];
    ~Model() { sx_destroy_shard_group(g); }

    int64_t numel(int k) const {
        const int64_t n[kParams] = {int64_t(vocab) * kEmbed, int64_t(kIn) * kHidden, kHidden,
                                    int64_t(kHidden) * vocab, vocab};
        return n[k];
    }

    sx_view_t view(int k, bool is_grad) const {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        ok(is_grad ? sx_grad_view(g, k, &v) : sx_param_view(g, k, &v), "view");
        if (v.dtype != SX_DTYPE_BF16) fail_msg("the views should be bf16");
        if ((v.device == SX_DEVICE_CUDA) != device) fail_msg("a view is not on the group's backend");
        return v;
    }
    void copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) const {
        if (!device) {
            std::memcpy(dst, src, bytes);
        } else if (cudaMemcpy(dst, src, bytes, kind) != cudaSuccess) {
            fail_msg("cudaMemcpy");
        }
    }
    void download_params() {
        for (int k = 0; k < kParams; ++k) {
            std::vector<uint16_t> h(static_cast<size_t>(numel(k)));
            copy(h.data(), view(k, false).data, h.size() * 2, cudaMemcpyDeviceToHost);
            p[k].resize(h.size());
            for (size_t i = 0; i < h.size(); ++i) p[k][i] = from_bf16(h[i]);
        }
    }
    void upload(bool is_grad, const std::vector<float> *values, float scale) {
        for (int k = 0; k < kParams; ++k) {
            std::vector<uint16_t> h(values[k].size());
            for (size_t i = 0; i < h.size(); ++i) h[i] = to_bf16(values[k][i] * scale);
            copy(view(k, is_grad).data, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
        }
    }
};

void make(Model *m, bool device, int vocab) {
    static std::atomic<int> n{0};
    m->device = device;
    m->vocab = vocab;
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    const std::string url = "local://charlm-" + std::to_string(::getpid()) + "-" + std::to_string(n.fetch_add(1));
    cfg.rendezvous = url.c_str();
    cfg.world_size = 1;
    cfg.backend = device ? SX_BACKEND_CUDA : SX_BACKEND_CPU;
    cfg.num_threads = 1;
    ok(sx_create_shard_group(&cfg, &m->g), "sx_create_shard_group");
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    pg.lr = 3e-3;
    pg.weight_decay = 0.01;
    ok(sx_add_param_group(m->g, &pg, nullptr), "sx_add_param_group");
    const char *names[kParams] = {"embed", "w1", "b1", "w2", "b2"};
    const int units[kParams] = {0, 1, 1, 2, 2};
    for (int k = 0; k < kParams; ++k) {
        const int64_t n = m->numel(k);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = names[k];
        d.ndim = 1;
        d.shape = &n;
        d.dtype = SX_DTYPE_BF16;
        d.unit = units[k];
        ok(sx_add_param(m->g, &d, nullptr), "sx_add_param");
    }
    ok(sx_finalize(m->g), "sx_finalize");
    sx_loss_scaling_t ls;
    sx_loss_scaling_init(&ls, sizeof ls);
    ls.mode = SX_LOSS_SCALING_DYNAMIC;
    ls.init_scale = 4096;
    ls.growth_interval = 40;
    ok(sx_set_loss_scaling(m->g, &ls), "sx_set_loss_scaling");
}

void init_params(Model *m) {
    uint64_t s = 7;
    const float scale[kParams] = {1.0f, 1.0f / std::sqrt(float(kIn)), 0.0f, 1.0f / std::sqrt(float(kHidden)), 0.0f};
    for (int k = 0; k < kParams; ++k) {
        m->p[k].resize(static_cast<size_t>(m->numel(k)));
        for (float &x : m->p[k]) x = scale[k] * (2.0f * uniform(&s) - 1.0f);
    }
    m->upload(false, m->p, 1.0f);
}

// The mean cross-entropy over the batch of step `step`, and its gradients in m->grad.
double forward_backward(Model *m, const Text &text, int step) {
    const int V = m->vocab;
    for (int k = 0; k < kParams; ++k) m->grad[k].assign(m->p[k].size(), 0.0f);
    uint64_t s = 1000003ull * static_cast<uint64_t>(step);
    double loss = 0.0;
    std::vector<float> x(kIn), h(kHidden), logits(V), dh(kHidden);
    for (int b = 0; b < kBatch; ++b) {
        const size_t at = kContext + next(&s) % (text.ids.size() - kContext);
        const uint8_t *ctx = &text.ids[at - kContext];
        const int target = text.ids[at];
        for (int c = 0; c < kContext; ++c)
            for (int e = 0; e < kEmbed; ++e) x[c * kEmbed + e] = m->p[kE][ctx[c] * kEmbed + e];
        for (int j = 0; j < kHidden; ++j) {
            float a = m->p[kB1][j];
            for (int i = 0; i < kIn; ++i) a += x[i] * m->p[kW1][i * kHidden + j];
            h[j] = std::tanh(a);
        }
        float mx = -INFINITY;
        for (int v = 0; v < V; ++v) {
            float a = m->p[kB2][v];
            for (int j = 0; j < kHidden; ++j) a += h[j] * m->p[kW2][j * V + v];
            logits[v] = a;
            mx = std::fmax(mx, a);
        }
        double z = 0.0;
        for (int v = 0; v < V; ++v) z += std::exp(static_cast<double>(logits[v] - mx));
        loss += std::log(z) - (logits[target] - mx);
        // Backward of the mean: dlogits = (softmax - onehot) / batch.
        std::fill(dh.begin(), dh.end(), 0.0f);
        for (int v = 0; v < V; ++v) {
            const float d = static_cast<float>((std::exp(static_cast<double>(logits[v] - mx)) / z - (v == target)) / kBatch);
            m->grad[kB2][v] += d;
            for (int j = 0; j < kHidden; ++j) {
                m->grad[kW2][j * V + v] += h[j] * d;
                dh[j] += m->p[kW2][j * V + v] * d;
            }
        }
        for (int j = 0; j < kHidden; ++j) {
            const float d = dh[j] * (1.0f - h[j] * h[j]);
            m->grad[kB1][j] += d;
            for (int i = 0; i < kIn; ++i) {
                m->grad[kW1][i * kHidden + j] += x[i] * d;
                m->grad[kE][ctx[i / kEmbed] * kEmbed + i % kEmbed] += m->p[kW1][i * kHidden + j] * d;
            }
        }
    }
    return loss / kBatch;
}

struct StepOut {
    double loss, scale;
    sx_step_result_t res;
};

// One training step of m on step `step`'s batch: the loss before it and the step's result.
StepOut train_step(Model *m, const Text &text, int step, bool overflow) {
    StepOut out;
    ok(sx_get_loss_scale(m->g, &out.scale), "sx_get_loss_scale");
    m->download_params();
    out.loss = forward_backward(m, text, step);
    if (overflow) m->grad[kW2][5] = INFINITY;
    m->upload(true, m->grad, static_cast<float>(out.scale));  // backward of the scaled loss
    sx_step_options_t so;
    sx_step_options_init(&so, sizeof so);
    so.max_grad_norm = 1.0;
    sx_step_result_init(&out.res, sizeof out.res);
    ok(sx_step(m->g, &so, &out.res), "sx_step");
    return out;
}

void expect_same_step(const StepOut &dev, const StepOut &cpu, int step, double rel_tol, double *worst) {
    const double d = std::fabs(dev.loss - cpu.loss) / cpu.loss;
    *worst = std::fmax(*worst, d);
    if (!(d <= rel_tol))
        fail_msg("step %d: loss %.9g on the device, %.9g on the CPU (%.3g apart, over %.3g)", step, dev.loss, cpu.loss,
                 d, rel_tol);
    if (dev.res.skipped != cpu.res.skipped || dev.scale != cpu.scale || dev.res.loss_scale != cpu.res.loss_scale)
        fail_msg("step %d: skipped %d and loss scale %g on the device, skipped %d and scale %g on the CPU", step,
                 dev.res.skipped, dev.res.loss_scale, cpu.res.skipped, cpu.res.loss_scale);
}

void save(Model *m, const std::string &path) {
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    so.path = path.c_str();
    so.synchronous = 1;
    sx_future_t *f = nullptr;
    ok(sx_save_optim_state(m->g, &so, &f), "sx_save_optim_state");
    ok(sx_future_wait(f, -1), "sx_future_wait");
    sx_future_destroy(f);
}

void load(Model *m, const std::string &path) {
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    ok(sx_load_optim_state(m->g, &lo), "sx_load_optim_state");
}

void test_charlm_on_the_device_follows_the_cpu(void **) {
    if (!g_have_device) {
        std::printf("skipped: no CUDA device (%s)\n", g_no_device_reason.c_str());
        return;
    }
    const Text text = make_text();
    Model dev, cpu;
    make(&dev, true, text.vocab);
    make(&cpu, false, text.vocab);
    init_params(&dev);
    init_params(&cpu);
    double worst = 0.0, first = 0.0, last20 = 0.0;
    int skipped = 0;
    for (int s = 1; s <= kSteps; ++s) {
        const StepOut a = train_step(&dev, text, s, s == kOverflowStep), b = train_step(&cpu, text, s, s == kOverflowStep);
        expect_same_step(a, b, s, 1e-2, &worst);
        skipped += a.res.skipped;
        if (s == 1) first = a.loss;
        if (s > kSteps - 20) last20 += a.loss / 20;
        if (s == 1 || s % 25 == 0)
            std::printf("# step %3d: loss %.6f (device) %.6f (cpu), scale %g\n", s, a.loss, b.loss, a.scale);
    }
    std::printf("# %d steps: largest relative loss difference %.3g; loss %.4f -> %.4f (last 20); %d skipped\n", kSteps,
                worst, first, last20, skipped);
    assert_int_equal(skipped, 1);  // the injected overflow, and nothing else
    if (!(last20 < 0.75 * first)) fail_msg("the model did not train: loss %.4f -> %.4f", first, last20);

    // The device's checkpoint on the CPU, and the CPU's on the device.
    const std::string dir = sxtest::make_tmpdir("cuda-charlm");
    save(&dev, dir + "/from-device");
    Model cpu2;
    make(&cpu2, false, text.vocab);
    load(&cpu2, dir + "/from-device");
    for (int s = kSteps + 1; s <= kSteps + 3; ++s) {
        const StepOut a = train_step(&dev, text, s, false), b = train_step(&cpu2, text, s, false);
        expect_same_step(a, b, s, 1e-5, &worst);
    }
    save(&cpu2, dir + "/from-cpu");
    Model dev2;
    make(&dev2, true, text.vocab);
    load(&dev2, dir + "/from-cpu");
    for (int s = kSteps + 4; s <= kSteps + 6; ++s) {
        const StepOut a = train_step(&dev2, text, s, false), b = train_step(&cpu2, text, s, false);
        expect_same_step(a, b, s, 1e-5, &worst);
    }
    sxtest::remove_tree(dir);
}

}  // namespace

int main() {
    g_have_device = sx::cuda::device_available(&g_no_device_reason);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_charlm_on_the_device_follows_the_cpu),
    };
    const int failed = cmocka_run_group_tests(tests, nullptr, nullptr);
    if (failed == 0 && !g_have_device) return 77;  // ctest: Skipped
    return failed;
}
