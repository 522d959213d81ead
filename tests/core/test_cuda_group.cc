// A group on the CUDA backend (one rank) against the same group on the CPU, through the
// public API: every param after every step equal bit for bit (fp32, and bf16 with fp32
// masters, loss scaling and an injected overflow), within 1e-6 once clipping (whose
// norm each backend sums in its own way) is on, the trainer's stream, views on the
// device, a checkpoint saved from the device and loaded on the CPU, and bf16 params
// without masters (bf16_stochastic_round) on the device and offloaded.
//
// Without a CUDA device each test reports why and the program exits with 77, which
// ctest shows as "Skipped" (SKIP_RETURN_CODE).
#include <cuda_runtime.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
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

bool skip_without_device() {
    if (g_have_device) return false;
    std::printf("skipped: no CUDA device (%s)\n", g_no_device_reason.c_str());
    return true;
}

std::string unique(const char *stem) {
    static std::atomic<int> n{0};
    return std::string("local://") + stem + "-" + std::to_string(::getpid()) + "-" + std::to_string(n.fetch_add(1));
}

void ok(sx_status_t s, const char *what) {
    if (s != SX_OK) fail_msg("%s: %s", what, sx_last_error_message());
}

// Awkward sizes across two units and two param groups.
struct P {
    const char *name;
    int64_t n;
    int32_t group, unit;
};
const P kParams[] = {{"w1", 4099, 0, 0}, {"b1", 37, 0, 0}, {"w2", 1000, 1, 1}, {"b2", 3, 0, 1}};
constexpr int kNp = 4;

// stochastic_round: both param groups keep their bf16 params without masters (AdamW's
// moments in bf16).
sx_shard_group_t *make(int32_t backend, int32_t dtype, int32_t grad_dtype, int32_t offload = SX_OFFLOAD_NONE,
                       bool stochastic_round = false) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    const std::string url = unique(backend == SX_BACKEND_CUDA ? "cuda-group" : "cpu-group");
    cfg.rendezvous = url.c_str();
    cfg.rank = 0;
    cfg.world_size = 1;
    cfg.backend = backend;
    cfg.num_threads = 1;
    cfg.grad_dtype = grad_dtype;
    cfg.offload = offload;
    sx_shard_group_t *g = nullptr;
    ok(sx_create_shard_group(&cfg, &g), "sx_create_shard_group");
    sx_param_group_desc_t a, b;
    sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_ADAMW);
    a.lr = 0.01, a.weight_decay = 0.1;
    sx_param_group_desc_init(&b, sizeof b, SX_OPTIM_SGD);
    b.lr = 0.05, b.momentum = 0.9, b.nesterov = 1;
    if (stochastic_round) {
        a.bf16_stochastic_round = b.bf16_stochastic_round = 1;
        a.state_dtype = SX_STATE_BF16;
    }
    ok(sx_add_param_group(g, &a, nullptr), "add_param_group");
    ok(sx_add_param_group(g, &b, nullptr), "add_param_group");
    for (const P &p : kParams) {
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = p.name;
        d.ndim = 1;
        d.shape = &p.n;
        d.dtype = dtype;
        d.param_group = p.group;
        d.unit = p.unit;
        ok(sx_add_param(g, &d, nullptr), "add_param");
    }
    ok(sx_finalize(g), "finalize");
    return g;
}

sx_view_t view(sx_shard_group_t *g, int32_t p, bool grad) {
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    ok(grad ? sx_grad_view(g, p, &v) : sx_param_view(g, p, &v), "view");
    return v;
}

size_t elem_bytes(int32_t dtype) { return dtype == SX_DTYPE_F32 || dtype == 0 ? 4 : 2; }

// The view's bytes, wherever they live.
std::vector<char> get(const sx_view_t &v) {
    std::vector<char> out(static_cast<size_t>(v.numel) * elem_bytes(v.dtype));
    if (v.device == SX_DEVICE_CUDA) {
        if (cudaMemcpy(out.data(), v.data, out.size(), cudaMemcpyDeviceToHost) != cudaSuccess) fail_msg("download");
    } else {
        std::memcpy(out.data(), v.data, out.size());
    }
    return out;
}

void put(const sx_view_t &v, const std::vector<char> &bytes) {
    if (v.device == SX_DEVICE_CUDA) {
        if (cudaMemcpy(v.data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice) != cudaSuccess) fail_msg("upload");
    } else {
        std::memcpy(v.data, bytes.data(), bytes.size());
    }
}

// Deterministic values in the view's dtype: fp32 bits, or the top half of them (bf16).
std::vector<char> values(const sx_view_t &v, int seed, float scale) {
    std::vector<char> out(static_cast<size_t>(v.numel) * elem_bytes(v.dtype));
    for (uint64_t i = 0; i < v.numel; ++i) {
        const float x = scale * std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(seed));
        if (elem_bytes(v.dtype) == 4) {
            std::memcpy(out.data() + 4 * i, &x, 4);
        } else {
            uint32_t bits;
            std::memcpy(&bits, &x, 4);
            const uint16_t h = static_cast<uint16_t>(bits >> 16);
            std::memcpy(out.data() + 2 * i, &h, 2);
        }
    }
    return out;
}

void same_params(sx_shard_group_t *a, sx_shard_group_t *b, const char *when) {
    for (int32_t p = 0; p < kNp; ++p)
        if (get(view(a, p, false)) != get(view(b, p, false)))
            fail_msg("%s: param %s differs between the CUDA and the CPU group", when, kParams[p].name);
}

void init_both(sx_shard_group_t *cuda, sx_shard_group_t *cpu) {
    for (int32_t p = 0; p < kNp; ++p) {
        const std::vector<char> v = values(view(cpu, p, false), p, 0.5f);
        put(view(cpu, p, false), v);
        put(view(cuda, p, false), v);
    }
}

void grads_both(sx_shard_group_t *cuda, sx_shard_group_t *cpu, int step, float scale) {
    for (int32_t p = 0; p < kNp; ++p) {
        const std::vector<char> v = values(view(cpu, p, true), 100 * step + p, scale);
        put(view(cpu, p, true), v);
        put(view(cuda, p, true), v);
    }
}

sx_step_result_t step(sx_shard_group_t *g, double max_norm, void *stream) {
    sx_step_options_t o;
    sx_step_options_init(&o, sizeof o);
    o.max_grad_norm = max_norm;
    o.stream = stream;
    sx_step_result_t r;
    sx_step_result_init(&r, sizeof r);
    ok(sx_step(g, &o, &r), "sx_step");
    return r;
}

// fp32 params within rel_tol of the CPU group's (relative to max(|cpu|, 1e-3)).
void close_params(sx_shard_group_t *a, sx_shard_group_t *b, double rel_tol, const char *when) {
    for (int32_t p = 0; p < kNp; ++p) {
        const std::vector<char> x = get(view(a, p, false)), y = get(view(b, p, false));
        for (size_t i = 0; i + 4 <= x.size(); i += 4) {
            float u, w;
            std::memcpy(&u, x.data() + i, 4);
            std::memcpy(&w, y.data() + i, 4);
            if (!(std::fabs(u - w) <= rel_tol * std::fmax(std::fabs(w), 1e-3f)))
                fail_msg("%s: param %s element %zu: %.9g on the device, %.9g on the CPU", when, kParams[p].name,
                         i / 4, u, w);
        }
    }
}

// Steps 1-3 are not clipped: every param equals the CPU's bit for bit, since both
// backends' updates round as torch does, element for element. Steps 4-6 clip: the
// global norm then comes from each backend's sum of squares, exact squares added in
// double on the device, and on the CPU in fp32 over blocks of 1024 elements (within a
// few 1e-6 relative), so the clipping coefficients may differ in their last bits and
// the params are compared within 1e-6.
void test_fp32_steps_match_the_cpu(void **) {
    if (skip_without_device()) return;
    sx_shard_group_t *cuda = make(SX_BACKEND_CUDA, SX_DTYPE_F32, 0), *cpu = make(SX_BACKEND_CPU, SX_DTYPE_F32, 0);
    assert_int_equal(view(cuda, 0, false).device, SX_DEVICE_CUDA);
    assert_int_equal(view(cuda, 0, true).device, SX_DEVICE_CUDA);
    init_both(cuda, cpu);
    cudaStream_t trainer = nullptr;
    assert_int_equal(cudaStreamCreate(&trainer), cudaSuccess);
    for (int s = 1; s <= 6; ++s) {
        grads_both(cuda, cpu, s, 1.0f);
        const double max_norm = s >= 4 ? 0.5 : 0.0;
        const sx_step_result_t rc = step(cuda, max_norm, s == 2 ? trainer : nullptr), rh = step(cpu, max_norm, nullptr);
        if (!(std::fabs(rc.grad_norm - rh.grad_norm) <= 1e-5 * rh.grad_norm))
            fail_msg("step %d: gradient norm %.17g on the device, %.17g on the CPU", s, rc.grad_norm, rh.grad_norm);
        assert_true(rh.grad_norm > 1.0);  // so that steps 4-6 do clip
        assert_int_equal(rc.step, rh.step);
        const std::string when = "step " + std::to_string(s);
        if (s <= 3)
            same_params(cuda, cpu, when.c_str());
        else
            close_params(cuda, cpu, 1e-6, when.c_str());
        // The default step zeroes the gradients on the device too.
        for (int32_t p = 0; p < kNp; ++p) {
            const std::vector<char> g = get(view(cuda, p, true));
            for (char c : g)
                if (c != 0) fail_msg("step %d: the gradients of %s were not zeroed", s, kParams[p].name);
        }
    }
    cudaStreamDestroy(trainer);
    sx_destroy_shard_group(cuda);
    sx_destroy_shard_group(cpu);
}

void test_bf16_with_loss_scaling_matches_the_cpu(void **) {
    if (skip_without_device()) return;
    sx_shard_group_t *cuda = make(SX_BACKEND_CUDA, SX_DTYPE_BF16, 0), *cpu = make(SX_BACKEND_CPU, SX_DTYPE_BF16, 0);
    for (sx_shard_group_t *g : {cuda, cpu}) {
        sx_loss_scaling_t ls;
        sx_loss_scaling_init(&ls, sizeof ls);
        ls.mode = SX_LOSS_SCALING_DYNAMIC;
        ls.init_scale = 1024;
        ls.growth_interval = 2;
        ok(sx_set_loss_scaling(g, &ls), "sx_set_loss_scaling");
    }
    init_both(cuda, cpu);
    for (int s = 1; s <= 6; ++s) {
        grads_both(cuda, cpu, s, 1024.0f);
        if (s == 3) {  // an overflow in one gradient: skipped on both, the scale backs off
            const sx_view_t gv = view(cpu, 2, true);
            std::vector<char> bytes = get(gv);
            const uint16_t inf = 0x7f80;
            std::memcpy(bytes.data() + 2 * 17, &inf, 2);
            put(gv, bytes);
            put(view(cuda, 2, true), bytes);
        }
        const sx_step_result_t rc = step(cuda, 0.0, nullptr), rh = step(cpu, 0.0, nullptr);
        assert_int_equal(rc.skipped, rh.skipped);
        assert_int_equal(rc.skipped, s == 3 ? 1 : 0);
        assert_true(rc.loss_scale == rh.loss_scale);
        same_params(cuda, cpu, ("bf16 step " + std::to_string(s)).c_str());
    }
    sx_destroy_shard_group(cuda);
    sx_destroy_shard_group(cpu);
}

// bf16 params without masters (bf16_stochastic_round): a CUDA group's update kernel,
// and an offloaded group's host update of the params' shard copied to the host, give a
// CPU group's params bit for bit, step after step (one rank: the device's update reads
// the bf16 gradients as they are).
void test_stochastic_round_matches_the_cpu(void **) {
    if (skip_without_device()) return;
    for (int32_t offload : {SX_OFFLOAD_NONE, SX_OFFLOAD_STATE}) {
        sx_shard_group_t *cuda = make(SX_BACKEND_CUDA, SX_DTYPE_BF16, 0, offload, true),
                         *cpu = make(SX_BACKEND_CPU, SX_DTYPE_BF16, 0, SX_OFFLOAD_NONE, true);
        init_both(cuda, cpu);
        for (int s = 1; s <= 4; ++s) {
            grads_both(cuda, cpu, s, 1.0f);
            step(cuda, 0.0, nullptr);
            step(cpu, 0.0, nullptr);
            const std::string when = std::string(offload ? "offloaded" : "on the device") + ", step " + std::to_string(s);
            same_params(cuda, cpu, when.c_str());
        }
        sx_destroy_shard_group(cuda);
        sx_destroy_shard_group(cpu);
    }
}

void test_saved_on_the_device_loads_on_the_cpu(void **) {
    if (skip_without_device()) return;
    const std::string dir = sxtest::make_tmpdir("cuda-group");
    const std::string path = dir + "/ck";
    sx_shard_group_t *cuda = make(SX_BACKEND_CUDA, SX_DTYPE_F32, 0), *cpu = make(SX_BACKEND_CPU, SX_DTYPE_F32, 0);
    init_both(cuda, cpu);
    for (int s = 1; s <= 2; ++s) {
        grads_both(cuda, cpu, s, 1.0f);
        step(cuda, 0.0, nullptr);
    }
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    so.path = path.c_str();
    so.synchronous = 1;
    sx_future_t *f = nullptr;
    ok(sx_save_optim_state(cuda, &so, &f), "sx_save_optim_state");
    ok(sx_future_wait(f, -1), "sx_future_wait");
    sx_future_destroy(f);
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    ok(sx_load_optim_state(cpu, &lo), "sx_load_optim_state on the CPU");
    same_params(cuda, cpu, "after the load");
    for (int s = 3; s <= 4; ++s) {
        grads_both(cuda, cpu, s, 1.0f);
        step(cuda, 0.0, nullptr);
        step(cpu, 0.0, nullptr);
        same_params(cuda, cpu, ("trained on, step " + std::to_string(s)).c_str());
    }
    // And back: the CPU's checkpoint into the device group.
    const std::string back = dir + "/back";
    so.path = back.c_str();
    ok(sx_save_optim_state(cpu, &so, &f), "sx_save_optim_state");
    ok(sx_future_wait(f, -1), "sx_future_wait");
    sx_future_destroy(f);
    lo.path = back.c_str();
    ok(sx_load_optim_state(cuda, &lo), "sx_load_optim_state on the device");
    grads_both(cuda, cpu, 5, 1.0f);
    step(cuda, 0.0, nullptr);
    step(cpu, 0.0, nullptr);
    same_params(cuda, cpu, "after loading back");
    sx_destroy_shard_group(cuda);
    sx_destroy_shard_group(cpu);
    sxtest::remove_tree(dir);
}

void test_bad_device_ordinal(void **) {
    if (skip_without_device()) return;
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    const std::string url = unique("cuda-bad");
    cfg.rendezvous = url.c_str();
    cfg.world_size = 1;
    cfg.backend = SX_BACKEND_CUDA;
    cfg.device_ordinal = 1 << 20;
    sx_shard_group_t *g = nullptr;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_ERR_INVALID_ARGUMENT);
    assert_null(g);
    assert_non_null(std::strstr(sx_last_error_message(), "device_ordinal"));
}

int32_t plain_sgd(const sx_optimizer_piece_t *piece) {
    for (size_t i = 0; i < piece->n; ++i) piece->param[i] -= 0.1f * piece->grad[i] * piece->grad_scale;
    return 0;
}

// Custom optimizers run on the host: a CUDA group that keeps its state on the device
// refuses a param group that uses one, naming it and SX_OFFLOAD_STATE, and keeps working.
// LAMB, Adafactor and Muon run on the device (Muon where cuBLAS can be opened; else its
// refusal says so).
void test_custom_optimizer_is_refused(void **) {
    if (skip_without_device()) return;
    sx_optimizer_desc_t d;
    ok(sx_optimizer_desc_init(&d, sizeof d), "sx_optimizer_desc_init");
    d.name = "HostOnlySGD";
    d.update = plain_sgd;
    int32_t id = -1;
    ok(sx_register_optimizer(&d, &id), "sx_register_optimizer");
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    const std::string url = unique("cuda-custom");
    cfg.rendezvous = url.c_str();
    cfg.world_size = 1;
    cfg.backend = SX_BACKEND_CUDA;
    sx_shard_group_t *g = nullptr;
    ok(sx_create_shard_group(&cfg, &g), "sx_create_shard_group");
    sx_param_group_desc_t pd;
    ok(sx_param_group_desc_init(&pd, sizeof pd, id), "sx_param_group_desc_init");
    assert_int_equal(sx_add_param_group(g, &pd, nullptr), SX_ERR_UNSUPPORTED);
    assert_non_null(std::strstr(sx_last_error_message(), "'HostOnlySGD' runs on the host only"));
    assert_non_null(std::strstr(sx_last_error_message(), "SX_OFFLOAD_STATE"));
    for (int32_t kind : {SX_OPTIM_LAMB, SX_OPTIM_ADAFACTOR}) {
        ok(sx_param_group_desc_init(&pd, sizeof pd, kind), "sx_param_group_desc_init");
        ok(sx_add_param_group(g, &pd, nullptr), "sx_add_param_group of LAMB or Adafactor");
    }
    int32_t groups = 2;
    ok(sx_param_group_desc_init(&pd, sizeof pd, SX_OPTIM_MUON), "sx_param_group_desc_init");
    const sx_status_t muon = sx_add_param_group(g, &pd, nullptr);
    if (muon == SX_OK)
        ++groups;
    else if (muon != SX_ERR_UNSUPPORTED || !std::strstr(sx_last_error_message(), "Muon"))
        fail_msg("Muon on the device: %d, %s", muon, sx_last_error_message());
    ok(sx_param_group_desc_init(&pd, sizeof pd, SX_OPTIM_ADAMW), "sx_param_group_desc_init");
    int32_t index = -1;
    ok(sx_add_param_group(g, &pd, &index), "sx_add_param_group after the refusal");
    assert_int_equal(index, groups);
    sx_destroy_shard_group(g);
}

}  // namespace

int main() {
    g_have_device = sx::cuda::device_available(&g_no_device_reason);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_steps_match_the_cpu),
        cmocka_unit_test(test_bf16_with_loss_scaling_matches_the_cpu),
        cmocka_unit_test(test_saved_on_the_device_loads_on_the_cpu),
        cmocka_unit_test(test_stochastic_round_matches_the_cpu),
        cmocka_unit_test(test_bad_device_ordinal),
        cmocka_unit_test(test_custom_optimizer_is_refused),
    };
    const int failed = cmocka_run_group_tests(tests, nullptr, nullptr);
    if (failed == 0 && !g_have_device) return 77;  // ctest: Skipped
    return failed;
}
