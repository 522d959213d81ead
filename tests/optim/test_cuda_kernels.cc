// The CUDA optimizer kernels against the scalar reference (reference_update), on a
// device. Tolerances: the fp32 update must equal the reference bit for bit (the kernels
// round where it rounds and never fuse a multiply-add, see cuda_kernels.h); the bf16 and
// fp16 outputs must equal round-to-nearest-even of the reference's fp32 param, bit for
// bit; sums of squares (exact squares, in double, of the scaled gradients the update
// uses, each grad*grad_scale rounded to fp32; added in another order than the
// reference's double sum) within a relative 1e-12; non-finite counts exactly. Also the
// cuda module's 16-bit conversions (cuda/elementwise.h) against base/half.h, bit for bit,
// and bf16 params without masters (bf16_stochastic_round) against the CPU kernels.
//
// Without a device every test but one reports itself skipped with the runtime's reason,
// and the program exits with 77, which ctest shows as "Skipped" (SKIP_RETURN_CODE).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "sx_cmocka.h"

#include "base/half.h"
#include "cuda/elementwise.h"
#include "cuda/runtime.h"
#include "optim/cuda_kernels.h"
#include "optim/cuda_test_util.h"
#include "optim/state_codec.h"
#include "sx/sx.h"

using sx::optim::Hyper;
using sx::optim::Kind;
using sx::optim::Segment;
using sx::optim::cuda::ComputeDtype;
using sx::optim::cuda::CudaSegment;
using sx::optim::cuda::GradStats;
using sx::optim::cuda::Workspace;
using namespace sx::optim::test;

namespace {

bool g_have_device = false;
std::string g_no_device_reason;

#define REQUIRE_DEVICE()                                                           \
    do {                                                                           \
        if (!g_have_device) {                                                      \
            print_message("no CUDA device: %s\n", g_no_device_reason.c_str());     \
            skip();                                                                \
        }                                                                          \
    } while (0)

void check_ok(const sx::Status &s, const char *what) {
    if (!s.ok()) fail_msg("%s: %s", what, s.message().c_str());
}

constexpr double kSumsqTolerance = 1e-12;

void assert_close_rel(double got, double want, const char *what) {
    const double err = std::fabs(got - want);
    if (err > kSumsqTolerance * std::fabs(want))
        fail_msg("%s: got %.17g, want %.17g", what, got, want);
}

// A segment's host buffers (reference and result) and their device copies.
struct DeviceSegment {
    SegmentBuffers host;
    DeviceMirror param, grad, state[3];
    sx::cuda::DeviceBuffer out;
    std::vector<uint16_t> out_host;
    size_t out_lead;
    DeviceSegment(size_t n, size_t offset, size_t out_lead_halves) : host(n, offset), out_lead(out_lead_halves) {}

    void upload(size_t offset) {
        check_ok(param.upload(host.param, offset), "upload param");
        check_ok(grad.upload(host.grad, offset), "upload grad");
        for (int k = 0; k < 3; ++k) check_ok(state[k].upload(host.state(k), offset), "upload state");
        check_ok(out.allocate((host.param.size() + out_lead + 8) * 2, "out"), "allocate out");
        check_ok(out.fill_bytes(0xA5), "poison out");
    }
    void download() {
        check_ok(param.download(host.param), "download param");
        check_ok(grad.download(host.grad), "download grad");
        for (int k = 0; k < 3; ++k) check_ok(state[k].download(host.state(k)), "download state");
        out_host.assign(host.param.size() + out_lead + 8, 0);
        check_ok(out.download(out_host.data(), out_host.size() * 2), "download out");
    }
    CudaSegment segment(const Hyper *h, int64_t step, ComputeDtype dtype) {
        CudaSegment cs;
        cs.seg.param = param.data();
        cs.seg.grad = grad.data();
        const int slots = sx::optim::state_slots(*h);
        for (int k = 0; k < 3; ++k) cs.seg.state[k] = k < slots ? state[k].data() : nullptr;
        cs.seg.n = host.param.size();
        cs.seg.hyper = h;
        cs.seg.step = step;
        cs.seg.mu_product = sx::optim::mu_product_after(*h, step);  // NAdam: as a param that took `step` updates
        cs.compute_dtype = dtype;
        if (dtype != ComputeDtype::kNone) cs.compute_out = out.as<uint16_t>() + out_lead;
        return cs;
    }
};

// The device output against RNE of the reference params; the halves around it untouched.
size_t out_mismatches(const DeviceSegment &d, const float *want_param, ComputeDtype dtype) {
    const size_t n = d.host.param.size();
    const bool bf16 = dtype == ComputeDtype::kBf16;
    size_t bad = 0;
    for (size_t i = 0; i < d.out_host.size(); ++i) {
        const uint16_t got = d.out_host[i];
        const bool inside = dtype != ComputeDtype::kNone && i >= d.out_lead && i < d.out_lead + n;
        if (!inside) {
            if (got != 0xA5A5) ++bad;
            continue;
        }
        const float p = want_param[i - d.out_lead];
        const uint16_t want = bf16 ? bf16_rne(p) : fp16_rne(p);
        const bool same = std::isnan(p) ? half_is_nan(got, bf16) : got == want;
        if (!same && bad++ == 0)
            std::fprintf(stderr, "out[%zu]: got 0x%04x, want 0x%04x (param %.9g)\n", i - d.out_lead, got, want,
                         static_cast<double>(p));
    }
    return bad;
}

// One segment through fused_update and through reference_update, from fresh state
// (steps 1-3) and from random state (steps 10, 11); every bit compared.
void check_single(Workspace &ws, const Hyper &h, size_t n, size_t offset, ComputeDtype dtype, size_t out_lead,
                  float scale) {
    DeviceSegment dev(n, offset, out_lead);
    SegmentBuffers ref(n, offset);
    Rng rng(n * 31 + offset * 7 + static_cast<uint64_t>(dtype));
    const int64_t starts[2] = {1, 10};
    const int counts[2] = {3, 2};
    for (int phase = 0; phase < 2; ++phase) {
        fill(ref, rng, h, phase == 0);
        dev.host.copy_from(ref);
        dev.upload(offset);
        for (int k = 0; k < counts[phase]; ++k) {
            const int64_t step = starts[phase] + k;
            if (k > 0) {
                new_grads(ref, dev.host, rng);
                check_ok(dev.grad.upload(dev.host.grad, offset), "upload grad");
            }
            const double want_sumsq = sumsq_of_scaled(ref.grad.data(), n, scale);
            Segment rs = ref.segment(&h, step);
            sx::optim::reference_update(rs, scale);
            const CudaSegment cs = dev.segment(&h, step, dtype);
            check_ok(ws.fused_update(&cs, 1, scale, nullptr, true), "fused_update");
            GradStats st;
            check_ok(ws.read_stats(nullptr, &st), "read_stats");
            dev.download();
            const size_t bad = dev.host.mismatches_with(ref) + out_mismatches(dev, ref.param.data(), dtype);
            if (bad != 0 || !dev.host.guards_intact())
                fail_msg("kind %d mom %g nesterov %d wd %g amsgrad %d maximize %d beta1 %g dtype %d: n %zu "
                         "offset %zu out_lead %zu step %lld: %zu mismatches, guards %s",
                         static_cast<int>(h.kind), h.momentum, h.nesterov, h.weight_decay, h.amsgrad, h.maximize,
                         h.beta1, static_cast<int>(dtype), n, offset, out_lead, static_cast<long long>(step), bad,
                         dev.host.guards_intact() ? "intact" : "overwritten");
            if (n == 0)
                assert_true(st.sumsq == 0.0);
            else
                assert_close_rel(st.sumsq, want_sumsq, "fused sum of squares");
            assert_true(st.nonfinite == 0.0);
        }
    }
}

void test_update_matches_reference(void **) {
    REQUIRE_DEVICE();
    Workspace ws;
    const size_t lengths[] = {0, 1, 3, 4, 5, 1023, 1025, 2048, 4099, 9000};
    const ComputeDtype dtypes[] = {ComputeDtype::kNone, ComputeDtype::kBf16, ComputeDtype::kFp16};
    const std::vector<Hyper> configs = all_configs();
    for (size_t c = 0; c < configs.size(); ++c) {
        const float scale = c % 2 ? 0.37f : 1.0f;
        for (size_t n : lengths)
            for (size_t offset = 0; offset < 4; ++offset) {
                const ComputeDtype dtype = dtypes[(c + n + offset) % 3];
                // The output at the matching position (vector path), and for some one
                // half off (element by element).
                check_single(ws, configs[c], n, offset, dtype, offset % 4, scale);
                if (offset == 1) check_single(ws, configs[c], n, offset, dtype, 2, scale);
            }
    }
}

// Buffers of one segment at different positions within 16 bytes: no float4 path.
void test_mixed_alignment(void **) {
    REQUIRE_DEVICE();
    Workspace ws;
    Hyper h;
    h.kind = Kind::kAdamW;
    h.weight_decay = 0.01;
    const size_t n = 5001;
    SegmentBuffers ref(n, 0);
    DeviceSegment dev(n, 0, 0);
    Rng rng(77);
    fill(ref, rng, h, false);
    dev.host.copy_from(ref);
    // Device copies at offsets 1 (param), 2 (grad), 3 (states).
    check_ok(dev.param.upload(dev.host.param, 1), "upload");
    check_ok(dev.grad.upload(dev.host.grad, 2), "upload");
    for (int k = 0; k < 3; ++k) check_ok(dev.state[k].upload(dev.host.state(k), 3), "upload");
    check_ok(dev.out.allocate((n + 8) * 2, "out"), "allocate");
    check_ok(dev.out.fill_bytes(0xA5), "poison");
    Segment rs = ref.segment(&h, 3);
    sx::optim::reference_update(rs, 1.0f);
    const CudaSegment cs = dev.segment(&h, 3, ComputeDtype::kBf16);
    check_ok(ws.fused_update(&cs, 1, 1.0f, nullptr, false), "fused_update");
    dev.download();
    assert_int_equal(dev.host.mismatches_with(ref) + out_mismatches(dev, ref.param.data(), ComputeDtype::kBf16), 0);
    assert_true(dev.host.guards_intact());
}

// Many segments with their own hyperparameters, steps and outputs, in one launch.
void test_multi_segment_one_launch(void **) {
    REQUIRE_DEVICE();
    const size_t lengths[] = {33, 0, 4099, 1, 1000, 17, 2049, 16, 15, 20000, 3, 1023};
    const size_t count = sizeof lengths / sizeof lengths[0];
    const std::vector<Hyper> configs = all_configs();
    std::vector<Hyper> hypers;
    std::vector<std::unique_ptr<DeviceSegment>> devs;
    std::vector<std::unique_ptr<SegmentBuffers>> refs;
    std::vector<int64_t> steps;
    Rng rng(123);
    for (size_t i = 0; i < count; ++i) {
        hypers.push_back(configs[(i * 7 + 3) % configs.size()]);
        steps.push_back(1 + static_cast<int64_t>(i % 4));
    }
    for (size_t i = 0; i < count; ++i) {
        refs.emplace_back(new SegmentBuffers(lengths[i], i % 4));
        devs.emplace_back(new DeviceSegment(lengths[i], i % 4, i % 4));
        fill(*refs[i], rng, hypers[i], false);
        devs[i]->host.copy_from(*refs[i]);
        devs[i]->upload(i % 4);
    }
    Workspace ws;
    const float scale = 0.5f;
    for (int round = 0; round < 3; ++round) {
        std::vector<CudaSegment> segs;
        double want = 0.0;
        for (size_t i = 0; i < count; ++i) {
            if (round > 0) {
                new_grads(*refs[i], devs[i]->host, rng);
                check_ok(devs[i]->grad.upload(devs[i]->host.grad, i % 4), "upload grad");
            }
            want += sumsq_of_scaled(refs[i]->grad.data(), lengths[i], scale);
            Segment rs = refs[i]->segment(&hypers[i], steps[i]);
            sx::optim::reference_update(rs, scale);
            segs.push_back(devs[i]->segment(&hypers[i], steps[i], static_cast<ComputeDtype>(i % 3)));
        }
        check_ok(ws.fused_update(segs.data(), segs.size(), scale, nullptr, true), "fused_update");
        GradStats st;
        check_ok(ws.read_stats(nullptr, &st), "read_stats");
        assert_close_rel(st.sumsq, want, "multi-segment sum of squares");
        for (size_t i = 0; i < count; ++i) {
            devs[i]->download();
            const size_t bad = devs[i]->host.mismatches_with(*refs[i]) +
                               out_mismatches(*devs[i], refs[i]->param.data(), static_cast<ComputeDtype>(i % 3));
            if (bad != 0 || !devs[i]->host.guards_intact())
                fail_msg("round %d segment %zu (n %zu): %zu mismatches", round, i, lengths[i], bad);
        }
        for (int64_t &s : steps) ++s;
    }
    std::printf("# grid of %u blocks\n", ws.grid_size());
}

// grad_stats alone: awkward lengths and starts, big values, inf and NaN counted, the
// same bits on every run.
void test_grad_stats(void **) {
    REQUIRE_DEVICE();
    Workspace ws;
    const size_t lengths[] = {0, 1, 3, 4, 5, 1023, 1025, 100003};
    for (size_t n : lengths) {
        for (size_t offset = 0; offset < 4; ++offset) {
            Guarded g(n, offset);
            Rng rng(n + offset);
            for (size_t i = 0; i < n; ++i) g.data()[i] = rng.uniform(-3.0f, 3.0f) * (i % 3 ? 1.0f : 1e6f);
            DeviceMirror d;
            check_ok(d.upload(g, offset), "upload");
            CudaSegment cs;
            cs.seg.grad = d.data();
            cs.seg.n = n;
            check_ok(ws.grad_stats(&cs, 1, 0.25f, nullptr), "grad_stats");
            GradStats a, b;
            check_ok(ws.read_stats(nullptr, &a), "read_stats");
            check_ok(ws.grad_stats(&cs, 1, 0.25f, nullptr), "grad_stats again");
            check_ok(ws.read_stats(nullptr, &b), "read_stats");
            const double want = sumsq_double(g.data(), n, 0.25f);
            if (n == 0) assert_true(a.sumsq == 0.0);
            else assert_close_rel(a.sumsq, want, "grad_stats sum of squares");
            assert_memory_equal(&a.sumsq, &b.sumsq, sizeof(double));  // reproducible
            assert_true(a.nonfinite == 0.0);
            if (n < 5) continue;
            g.data()[0] = INFINITY;
            g.data()[n / 2] = NAN;
            g.data()[n - 1] = -INFINITY;
            check_ok(d.upload(g, offset), "upload");
            cs.seg.grad = d.data();  // upload allocates anew
            check_ok(ws.grad_stats(&cs, 1, 0.25f, nullptr), "grad_stats");
            check_ok(ws.read_stats(nullptr, &a), "read_stats");
            assert_true(a.nonfinite == 3.0);
            assert_true(std::isnan(a.sumsq));
        }
    }
    // A finite gradient that overflows once scaled counts as non-finite.
    Guarded big(10, 0);
    for (size_t i = 0; i < 10; ++i) big.data()[i] = 1.0f;
    big.data()[4] = 3e38f;
    DeviceMirror d;
    check_ok(d.upload(big, 0), "upload");
    CudaSegment cs;
    cs.seg.grad = d.data();
    cs.seg.n = 10;
    check_ok(ws.grad_stats(&cs, 1, 4.0f, nullptr), "grad_stats");
    GradStats st;
    check_ok(ws.read_stats(nullptr, &st), "read_stats");
    assert_true(st.nonfinite == 1.0);
    assert_true(std::isinf(st.sumsq));
    assert_non_null(ws.stats_device());
}

// n floats on the device at `offset` elements past a 256-byte boundary (and their host values).
struct OnDevice {
    sx::cuda::DeviceBuffer buf;
    size_t offset;
    OnDevice(const void *host, size_t bytes, size_t offset_bytes) : offset(offset_bytes) {
        check_ok(buf.allocate(bytes + offset_bytes + 64, "a test buffer"), "allocate");
        check_ok(buf.upload(host, bytes, offset_bytes), "upload");
    }
    template <typename T>
    T *at() const { return reinterpret_cast<T *>(buf.as<char>() + offset); }
};

// 16-bit gradients that the update reads and widens itself (Segment::grad16) give the bits
// of the same gradients widened to fp32 first: params, moments, bf16 output and the
// statistics, in both 16-bit dtypes, at every alignment, with an inf among them too.
void test_16bit_gradients_match_fp32(void **) {
    REQUIRE_DEVICE();
    Workspace ws;
    Hyper h = sx::optim::default_hyper(Kind::kAdamW);
    h.weight_decay = 0.01;
    for (int32_t dtype : {SX_DTYPE_BF16, SX_DTYPE_F16})
        for (size_t n : {1, 5, 1023, 4099, 9000})
            for (size_t offset = 0; offset < 4; ++offset) {
                Rng rng(n * 13 + offset + static_cast<size_t>(dtype));
                std::vector<float> p(n), m(n), v(n), g(n);
                std::vector<uint16_t> g16(n);
                for (size_t i = 0; i < n; ++i) {
                    p[i] = rng.uniform(-1.0f, 1.0f), m[i] = rng.uniform(-0.1f, 0.1f), v[i] = rng.uniform(0.0f, 0.01f);
                    const float x = rng.uniform(-2.0f, 2.0f);
                    sx::half::from_f32(dtype, &x, &g16[i], 1);
                }
                if (n > 1000) g16[n / 3] = dtype == SX_DTYPE_BF16 ? 0x7f80 : 0x7c00;  // +inf
                sx::half::to_f32(dtype, g16.data(), g.data(), n);
                GradStats stats[2], pre[2];
                std::vector<float> out_p[2], out_m[2], out_v[2];
                std::vector<uint16_t> out16[2];
                for (int way = 0; way < 2; ++way) {
                    OnDevice dp(p.data(), n * 4, offset * 4), dm(m.data(), n * 4, offset * 4),
                        dv(v.data(), n * 4, offset * 4), dg(g.data(), n * 4, offset * 4),
                        dg16(g16.data(), n * 2, offset * 2), dout(g16.data(), n * 2, offset * 2);
                    CudaSegment cs;
                    cs.seg.param = dp.at<float>();
                    if (way == 0) {
                        cs.seg.grad = dg.at<float>();
                    } else {
                        cs.seg.grad16 = dg16.at<uint16_t>();
                        cs.seg.grad_dtype = dtype;
                    }
                    cs.seg.state[0] = dm.at<float>();
                    cs.seg.state[1] = dv.at<float>();
                    cs.seg.n = n;
                    cs.seg.hyper = &h;
                    cs.seg.step = 3;
                    cs.compute_out = dout.at<uint16_t>();
                    cs.compute_dtype = ComputeDtype::kBf16;
                    check_ok(ws.grad_stats(&cs, 1, 0.5f, nullptr), "grad_stats");
                    check_ok(ws.read_stats(nullptr, &pre[way]), "read_stats");
                    check_ok(ws.fused_update(&cs, 1, 0.5f, nullptr, true), "fused_update");
                    check_ok(ws.read_stats(nullptr, &stats[way]), "read_stats");
                    out_p[way].resize(n), out_m[way].resize(n), out_v[way].resize(n), out16[way].resize(n);
                    check_ok(dp.buf.download(out_p[way].data(), n * 4, offset * 4), "download");
                    check_ok(dm.buf.download(out_m[way].data(), n * 4, offset * 4), "download");
                    check_ok(dv.buf.download(out_v[way].data(), n * 4, offset * 4), "download");
                    check_ok(dout.buf.download(out16[way].data(), n * 2, offset * 2), "download");
                }
                if (std::memcmp(out_p[0].data(), out_p[1].data(), n * 4) != 0 ||
                    std::memcmp(out_m[0].data(), out_m[1].data(), n * 4) != 0 ||
                    std::memcmp(out_v[0].data(), out_v[1].data(), n * 4) != 0 ||
                    std::memcmp(out16[0].data(), out16[1].data(), n * 2) != 0)
                    fail_msg("dtype %d n %zu offset %zu: the update of 16-bit gradients differs from fp32's", dtype, n,
                             offset);
                assert_memory_equal(&stats[0], &stats[1], sizeof(GradStats));
                assert_memory_equal(&pre[0], &pre[1], sizeof(GradStats));
                assert_true(pre[1].nonfinite == (n > 1000 ? 1.0 : 0.0));
            }
}

// Where there is no device, a launch fails with SX_ERR_UNSUPPORTED and the runtime's
// reason instead of crashing; the library was loaded and ran without a driver.
void test_without_device_launch_fails_cleanly(void **) {
    if (g_have_device) {
        print_message("a CUDA device is present: nothing to check here\n");
        skip();
    }
    Workspace ws;
    float dummy[4] = {0, 0, 0, 0};
    CudaSegment cs;
    cs.seg.grad = dummy;
    cs.seg.n = 4;
    const sx::Status s = ws.grad_stats(&cs, 1, 1.0f, nullptr);
    assert_int_equal(s.code(), SX_ERR_UNSUPPORTED);
    std::printf("# %s\n", s.message().c_str());
    sx::cuda::DeviceBuffer b;
    assert_int_equal(b.allocate(64, "probe").code(), SX_ERR_UNSUPPORTED);
    assert_null(b.data());
    GradStats st;
    assert_int_equal(ws.read_stats(nullptr, &st).code(), SX_ERR_INVALID_STATE);
}

// The 16-bit conversions against base/half.h, bit for bit: every 16-bit pattern widened
// (NaNs stay NaN), and added into an accumulator; fp32 values of every kind narrowed
// (ties to even, subnormals, overflow to inf; NaN stays NaN, its payload aside); and a
// scaling of every pattern. Lengths that leave a partial block.
void test_conversions_match_half(void **) {
    REQUIRE_DEVICE();
    for (int32_t dtype : {SX_DTYPE_BF16, SX_DTYPE_F16}) {
        const size_t n = 65536 + 37;
        std::vector<uint16_t> bits(n);
        for (size_t i = 0; i < n; ++i) bits[i] = static_cast<uint16_t>(i * 40503u);
        std::vector<float> acc(n);
        for (size_t i = 0; i < n; ++i) acc[i] = 0.25f * static_cast<float>(i % 13) - 1.0f;
        sx::cuda::DeviceBuffer d16, d32;
        check_ok(d16.allocate(n * 2, "16-bit"), "allocate");
        check_ok(d32.allocate(n * 4, "fp32"), "allocate");
        auto same = [](float a, float b) { return std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, 4) == 0; };
        for (bool accumulate : {false, true}) {
            check_ok(d16.upload(bits.data(), n * 2), "upload");
            check_ok(d32.upload(acc.data(), n * 4), "upload");
            check_ok(sx::cuda::widen(dtype, d16.as<uint16_t>(), d32.as<float>(), n, 1.0f, accumulate, nullptr),
                     "widen");
            std::vector<float> got(n), want = acc;
            check_ok(d32.download(got.data(), n * 4), "download");
            if (accumulate) {
                sx::half::add_to_f32(dtype, bits.data(), want.data(), n);
            } else {
                sx::half::to_f32(dtype, bits.data(), want.data(), n);
            }
            for (size_t i = 0; i < n; ++i)
                if (!same(got[i], want[i])) fail_msg("widen dtype %d element %zu: %a, want %a", dtype, i, got[i], want[i]);
        }
        // Narrowing: fp32 values near every 16-bit pattern (exact, halfway, just off) and a spread.
        std::vector<float> wide(n);
        sx::half::to_f32(dtype, bits.data(), wide.data(), n);
        for (size_t i = 0; i < n; ++i) {
            uint32_t u;
            std::memcpy(&u, &wide[i], 4);
            u += static_cast<uint32_t>((i % 3) * (dtype == SX_DTYPE_BF16 ? 0x8000u : 0x1000u)) - (i % 5 == 0 ? 1u : 0u);
            std::memcpy(&wide[i], &u, 4);
        }
        check_ok(d32.upload(wide.data(), n * 4), "upload");
        check_ok(sx::cuda::narrow(dtype, d32.as<float>(), d16.as<uint16_t>(), n, nullptr), "narrow");
        std::vector<uint16_t> got16(n), want16(n);
        check_ok(d16.download(got16.data(), n * 2), "download");
        sx::half::from_f32(dtype, wide.data(), want16.data(), n);
        auto same16 = [&](uint16_t a, uint16_t b) {
            float fa, fb;
            sx::half::to_f32(dtype, &a, &fa, 1);
            sx::half::to_f32(dtype, &b, &fb, 1);
            return std::isnan(fa) ? std::isnan(fb) : a == b;
        };
        for (size_t i = 0; i < n; ++i)
            if (!same16(got16[i], want16[i]))
                fail_msg("narrow dtype %d element %zu (%a): 0x%04x, want 0x%04x", dtype, i, wide[i], got16[i], want16[i]);
        // Scaling every pattern by 1/sqrt(3), rounded back.
        const float factor = 1.0f / std::sqrt(3.0f);
        check_ok(d16.upload(bits.data(), n * 2), "upload");
        check_ok(sx::cuda::scale16(dtype, d16.as<uint16_t>(), factor, n, nullptr), "scale16");
        check_ok(d16.download(got16.data(), n * 2), "download");
        want16 = bits;
        sx::half::scale(dtype, want16.data(), factor, n);
        for (size_t i = 0; i < n; ++i)
            if (!same16(got16[i], want16[i]))
                fail_msg("scale16 dtype %d element %zu: 0x%04x, want 0x%04x", dtype, i, got16[i], want16[i]);
    }
}

// ------------------------------------------------- packed state (state_codec.h)

// One segment of packed state on the host (the CPU kernels' operands) and its device copy.
struct PackedCase {
    int32_t dtype;  // SX_STATE_BF16 or SX_STATE_8BIT
    size_t n;
    std::vector<float> param, grad;
    std::vector<uint16_t> state16[3];
    std::vector<uint8_t> codes[3];
    std::vector<float> scales[3];
    sx::cuda::DeviceBuffer d_param, d_grad, d_state[3], d_scales[3];

    PackedCase(int32_t dtype_, size_t n_) : dtype(dtype_), n(n_), param(n_), grad(n_) {
        for (int k = 0; k < 3; ++k) {
            state16[k].assign(dtype == SX_STATE_BF16 ? n : 0, 0);
            codes[k].assign(dtype == SX_STATE_8BIT ? n : 0, 0);
            scales[k].assign(dtype == SX_STATE_8BIT ? n / sx::optim::kQuantBlock : 0, 0.0f);
        }
    }
    size_t slot_bytes() const { return dtype == SX_STATE_BF16 ? n * 2 : n; }
    void *slot_host(int k) { return dtype == SX_STATE_BF16 ? static_cast<void *>(state16[k].data()) : codes[k].data(); }
    void upload() {
        check_ok(d_param.allocate(n * 4, "param"), "allocate");
        check_ok(d_param.upload(param.data(), n * 4), "upload param");
        check_ok(d_grad.allocate(n * 4, "grad"), "allocate");
        check_ok(d_grad.upload(grad.data(), n * 4), "upload grad");
        for (int k = 0; k < 3; ++k) {
            check_ok(d_state[k].allocate(slot_bytes(), "slot"), "allocate");
            check_ok(d_state[k].upload(slot_host(k), slot_bytes()), "upload slot");
            if (scales[k].empty()) continue;
            check_ok(d_scales[k].allocate(scales[k].size() * 4, "scales"), "allocate");
            check_ok(d_scales[k].upload(scales[k].data(), scales[k].size() * 4), "upload scales");
        }
    }
    // The segment over the host's buffers (device: false) or the device's.
    Segment segment(const Hyper *h, int64_t step, bool device) {
        Segment seg;
        seg.param = device ? d_param.as<float>() : param.data();
        seg.grad = device ? d_grad.as<float>() : grad.data();
        seg.n = n;
        seg.hyper = h;
        seg.step = step;
        seg.state_dtype = dtype;
        for (int k = 0; k < sx::optim::state_slots(*h); ++k) {
            if (dtype == SX_STATE_BF16) {
                seg.state16[k] = device ? d_state[k].as<uint16_t>() : state16[k].data();
            } else {
                seg.codes[k] = device ? d_state[k].as<uint8_t>() : codes[k].data();
                seg.scales[k] = device ? d_scales[k].as<float>() : scales[k].data();
            }
        }
        return seg;
    }
    // Whether the device's buffers hold the host's bytes (NaN scales compared as bits:
    // both sides write 0x7fc00000).
    bool device_equals_host(const Hyper &h, std::string *what) {
        std::vector<char> got(n * 4);
        check_ok(d_param.download(got.data(), n * 4), "download param");
        if (std::memcmp(got.data(), param.data(), n * 4) != 0) return *what = "param", false;
        for (int k = 0; k < sx::optim::state_slots(h); ++k) {
            check_ok(d_state[k].download(got.data(), slot_bytes()), "download slot");
            if (std::memcmp(got.data(), slot_host(k), slot_bytes()) != 0) return *what = "slot " + std::to_string(k), false;
            if (scales[k].empty()) continue;
            check_ok(d_scales[k].download(got.data(), scales[k].size() * 4), "download scales");
            if (std::memcmp(got.data(), scales[k].data(), scales[k].size() * 4) != 0)
                return *what = "scales of slot " + std::to_string(k), false;
        }
        return true;
    }
};

// Gradients of step `step`: mostly in (-1, 1) at several magnitudes, with awkward blocks
// (8-bit: block 1 all zero, block 2's largest magnitude negative, the last block a NaN
// and an inf; bf16: the same positions).
void packed_grads(PackedCase &pc, Rng &rng, int64_t step) {
    const size_t b = sx::optim::kQuantBlock;
    for (size_t i = 0; i < pc.n; ++i) {
        const float mag = (i / 37) % 3 == 0 ? 1e-3f : (i / 37) % 3 == 1 ? 1.0f : 30.0f;
        pc.grad[i] = mag * rng.uniform(-1.0f, 1.0f);
    }
    if (pc.n >= 3 * b) {
        for (size_t i = b; i < 2 * b; ++i) pc.grad[i] = 0.0f;
        pc.grad[2 * b + 5] = -100.0f;  // the extreme of block 2, negative
    }
    if (step == 3 && pc.n >= 2 * b) {
        pc.grad[pc.n - 3] = NAN;
        pc.grad[pc.n - 7] = -INFINITY;
    }
}

// The CUDA kernels' update of packed state (bf16 slots, 8-bit blocks) equals the CPU
// kernels', bit for bit: params, slots, scales, for SGD with momentum (its first step
// writes the buffer unread), Adam, AdamW (8-bit: torchao's Adam), amsgrad, RMSprop
// centered with momentum (three slots) and Lion, over several steps, at sizes of one
// block, several, and more than a chunk of the launch, with gradients that make blocks of
// zeros, blocks whose extreme is negative and NaN and inf (their blocks' scales NaN).
// Several segments, packed and fp32, go in one launch too.
void test_packed_state_matches_the_cpu(void **) {
    REQUIRE_DEVICE();
    Workspace ws;
    std::vector<Hyper> hypers;
    Hyper h = sx::optim::default_hyper(Kind::kSgd);
    h.lr = 0.1, h.momentum = 0.9, h.weight_decay = 0.01;
    hypers.push_back(h);
    for (Kind kind : {Kind::kAdam, Kind::kAdamW}) {
        h = sx::optim::default_hyper(kind);
        h.lr = 0.01, h.weight_decay = 0.01;
        hypers.push_back(h);
        h.amsgrad = true;
        hypers.push_back(h);
    }
    h = sx::optim::default_hyper(Kind::kRmsprop);
    h.centered = true, h.momentum = 0.5;
    hypers.push_back(h);
    hypers.push_back(sx::optim::default_hyper(Kind::kLion));
    for (int32_t dtype : {SX_STATE_BF16, SX_STATE_8BIT})
        for (Hyper hp : hypers)
            for (size_t n : {size_t(256), size_t(256 * 3), size_t(256 * 9), size_t(256 * 17 + (dtype == SX_STATE_BF16 ? 5 : 0))}) {
                hp.state_dtype = dtype;
                PackedCase pc(dtype, n);
                Rng rng(n * 13 + static_cast<uint64_t>(hp.kind) * 7 + static_cast<uint64_t>(dtype));
                for (size_t i = 0; i < n; ++i) pc.param[i] = rng.uniform(-1.0f, 1.0f);
                packed_grads(pc, rng, 1);
                pc.upload();
                for (int64_t step = 1; step <= 4; ++step) {
                    if (step > 1) {
                        packed_grads(pc, rng, step);
                        check_ok(pc.d_grad.upload(pc.grad.data(), n * 4), "upload grad");
                    }
                    Segment host = pc.segment(&hp, step, false);
                    double want = 0.0;
                    sx::optim::fused_update(&host, 1, 0.5f, nullptr, sx::optim::Isa::kAuto, &want);
                    CudaSegment cs;
                    cs.seg = pc.segment(&hp, step, true);
                    check_ok(ws.fused_update(&cs, 1, 0.5f, nullptr, true), "fused_update");
                    std::string what;
                    if (!pc.device_equals_host(hp, &what))
                        fail_msg("kind %d amsgrad %d state_dtype %d n %zu step %lld: %s differs from the CPU's",
                                 static_cast<int>(hp.kind), hp.amsgrad, dtype, n, static_cast<long long>(step),
                                 what.c_str());
                }
            }
}

// A launch of 8-bit, bf16 and fp32 segments together: each as the CPU updates it, and the
// statistics over all of them.
void test_packed_and_fp32_segments_in_one_launch(void **) {
    REQUIRE_DEVICE();
    Workspace ws;
    Hyper h = sx::optim::default_hyper(Kind::kAdamW);
    h.weight_decay = 0.01;
    Hyper h8 = h, h16 = h;
    h8.state_dtype = SX_STATE_8BIT;
    h16.state_dtype = SX_STATE_BF16;
    PackedCase a(SX_STATE_8BIT, 256 * 10), b(SX_STATE_BF16, 1001), c(SX_STATE_8BIT, 256 * 2);
    Rng rng(5);
    for (PackedCase *pc : {&a, &b, &c}) {
        for (size_t i = 0; i < pc->n; ++i) pc->param[i] = rng.uniform(-1.0f, 1.0f);
        packed_grads(*pc, rng, 2);
        pc->upload();
    }
    // An fp32 segment: c's param with fp32 slots, as a param too small for 8 bits keeps.
    std::vector<float> p32(300), g32(300), m32(300, 0.0f), v32(300, 0.0f);
    for (size_t i = 0; i < 300; ++i) p32[i] = rng.uniform(-1.0f, 1.0f), g32[i] = rng.uniform(-0.5f, 0.5f);
    OnDevice dp(p32.data(), 1200, 0), dg(g32.data(), 1200, 0), dm(m32.data(), 1200, 0), dv(v32.data(), 1200, 0);
    for (int64_t step = 1; step <= 2; ++step) {
        Segment host[4] = {a.segment(&h8, step, false), b.segment(&h16, step, false), c.segment(&h8, step, false), {}};
        host[3].param = p32.data(), host[3].grad = g32.data(), host[3].n = 300, host[3].hyper = &h8, host[3].step = step;
        host[3].state[0] = m32.data(), host[3].state[1] = v32.data();
        double want = 0.0;
        sx::optim::fused_update(host, 4, 1.0f, nullptr, sx::optim::Isa::kAuto, &want);
        CudaSegment cs[4];
        cs[0].seg = a.segment(&h8, step, true), cs[1].seg = b.segment(&h16, step, true), cs[2].seg = c.segment(&h8, step, true);
        cs[3].seg = host[3];
        cs[3].seg.param = dp.at<float>(), cs[3].seg.grad = dg.at<float>();
        cs[3].seg.state[0] = dm.at<float>(), cs[3].seg.state[1] = dv.at<float>();
        check_ok(ws.fused_update(cs, 4, 1.0f, nullptr, true), "fused_update");
        GradStats st;
        check_ok(ws.read_stats(nullptr, &st), "read_stats");
        std::string what;
        if (!a.device_equals_host(h8, &what) || !b.device_equals_host(h16, &what) || !c.device_equals_host(h8, &what))
            fail_msg("step %lld: %s differs from the CPU's", static_cast<long long>(step), what.c_str());
        std::vector<float> got(300);
        check_ok(dp.buf.download(got.data(), 1200), "download");
        assert_memory_equal(got.data(), p32.data(), 1200);
        assert_true(st.nonfinite == 0.0);
        assert_close_rel(st.sumsq, want, "sum of squares");
    }
}

// ------------------------------------------------- bf16 params without masters

// One segment of bf16 params that the update rounds stochastically (bf16_stochastic_round:
// no fp32 param; the bf16 params are the compute output), with fp32, bf16 or 8-bit state
// and fp32 or bf16 gradients, on the host and on the device.
struct RoundedCase {
    int32_t dtype;  // the slots' SX_STATE_*
    size_t n;
    bool grads16;
    std::vector<uint16_t> params, grad16;
    std::vector<float> grad;
    std::vector<char> slot[3];
    std::vector<float> scales[3];
    sx::cuda::DeviceBuffer d_params, d_grad, d_slot[3], d_scales[3];

    RoundedCase(int32_t dtype_, size_t n_, bool grads16_) : dtype(dtype_), n(n_), grads16(grads16_), params(n_), grad16(n_), grad(n_) {
        for (int k = 0; k < 3; ++k) {
            slot[k].assign(slot_bytes(), 0);
            scales[k].assign(dtype == SX_STATE_8BIT ? n / sx::optim::kQuantBlock : 0, 0.0f);
        }
    }
    size_t slot_bytes() const { return dtype == SX_STATE_FP32 ? n * 4 : dtype == SX_STATE_BF16 ? n * 2 : n; }
    void upload_grads() {
        if (grads16)
            check_ok(d_grad.upload(grad16.data(), n * 2), "upload grad16");
        else
            check_ok(d_grad.upload(grad.data(), n * 4), "upload grad");
    }
    void upload() {
        check_ok(d_params.allocate(n * 2, "params"), "allocate");
        check_ok(d_params.upload(params.data(), n * 2), "upload params");
        check_ok(d_grad.allocate(n * 4, "grad"), "allocate");
        upload_grads();
        for (int k = 0; k < 3; ++k) {
            check_ok(d_slot[k].allocate(slot_bytes(), "slot"), "allocate");
            check_ok(d_slot[k].upload(slot[k].data(), slot_bytes()), "upload slot");
            if (scales[k].empty()) continue;
            check_ok(d_scales[k].allocate(scales[k].size() * 4, "scales"), "allocate");
            check_ok(d_scales[k].upload(scales[k].data(), scales[k].size() * 4), "upload scales");
        }
    }
    // The host's segment (the CPU kernels' operands), or the device's.
    Segment segment(const Hyper *h, int64_t step, int32_t param, uint64_t offset, bool device) {
        Segment seg;
        seg.stochastic_round = true;
        seg.compute_out = device ? nullptr : params.data();
        seg.compute_dtype = device ? 0 : SX_DTYPE_BF16;
        // The host's kernels read fp32 gradients: the bf16 ones widened (exactly).
        seg.grad = device && grads16 ? nullptr : device ? d_grad.as<float>() : grad.data();
        if (device && grads16) {
            seg.grad16 = d_grad.as<uint16_t>();
            seg.grad_dtype = SX_DTYPE_BF16;
        }
        seg.n = n;
        seg.hyper = h;
        seg.step = step;
        seg.param_index = param;
        seg.param_offset = offset;
        seg.state_dtype = dtype;
        for (int k = 0; k < sx::optim::state_slots(*h); ++k) {
            char *bytes = device ? d_slot[k].as<char>() : slot[k].data();
            if (dtype == SX_STATE_FP32) seg.state[k] = reinterpret_cast<float *>(bytes);
            if (dtype == SX_STATE_BF16) seg.state16[k] = reinterpret_cast<uint16_t *>(bytes);
            if (dtype == SX_STATE_8BIT) {
                seg.codes[k] = reinterpret_cast<uint8_t *>(bytes);
                seg.scales[k] = device ? d_scales[k].as<float>() : scales[k].data();
            }
        }
        return seg;
    }
    bool device_equals_host(const Hyper &h, std::string *what) {
        std::vector<char> got(std::max(n * 4, slot_bytes()));
        check_ok(d_params.download(got.data(), n * 2), "download params");
        if (std::memcmp(got.data(), params.data(), n * 2) != 0) return *what = "params", false;
        for (int k = 0; k < sx::optim::state_slots(h); ++k) {
            check_ok(d_slot[k].download(got.data(), slot_bytes()), "download slot");
            if (std::memcmp(got.data(), slot[k].data(), slot_bytes()) != 0) return *what = "slot " + std::to_string(k), false;
            if (scales[k].empty()) continue;
            check_ok(d_scales[k].download(got.data(), scales[k].size() * 4), "download scales");
            if (std::memcmp(got.data(), scales[k].data(), scales[k].size() * 4) != 0)
                return *what = "scales of slot " + std::to_string(k), false;
        }
        return true;
    }
    // Gradients of a step: bf16 values (so that fp32 and bf16 gradients are the same numbers).
    void new_grads(Rng &rng) {
        for (size_t i = 0; i < n; ++i) {
            const float mag = (i / 37) % 3 == 0 ? 1e-3f : (i / 37) % 3 == 1 ? 0.1f : 3.0f;
            grad16[i] = bf16_rne(mag * rng.uniform(-1.0f, 1.0f));
            const uint32_t bits = static_cast<uint32_t>(grad16[i]) << 16;
            std::memcpy(&grad[i], &bits, 4);
        }
    }
};

// bf16_stochastic_round's update on the device equals the CPU kernels', bit for bit: the
// bf16 params (widened, updated, rounded with the same hash of param, step and element)
// and the slots, for AdamW, SGD with momentum and Lion, with fp32, bf16 and 8-bit state,
// fp32 and bf16 gradients, over several steps, at sizes of one block, several, and more
// than a chunk of the launch, at offsets into the param (the element index keys the bits);
// and one launch of several such segments beside an fp32 one.
void test_stochastic_round_matches_the_cpu(void **) {
    REQUIRE_DEVICE();
    Workspace ws;
    std::vector<Hyper> hypers;
    Hyper h = sx::optim::default_hyper(Kind::kAdamW);
    h.lr = 3e-3, h.weight_decay = 0.1;
    hypers.push_back(h);
    h = sx::optim::default_hyper(Kind::kSgd);
    h.lr = 0.05, h.momentum = 0.9;
    hypers.push_back(h);
    hypers.push_back(sx::optim::default_hyper(Kind::kLion));
    for (int32_t dtype : {SX_STATE_FP32, SX_STATE_BF16, SX_STATE_8BIT})
        for (Hyper hp : hypers)
            for (size_t n : {size_t(256), size_t(256 * 9), size_t(256 * 17)})
                for (bool grads16 : {false, true}) {
                    hp.state_dtype = dtype;
                    const size_t size = dtype == SX_STATE_8BIT ? n : n + 5;
                    const uint64_t offset = dtype == SX_STATE_8BIT ? 256 * 3 : 1000003;
                    RoundedCase rc(dtype, size, grads16);
                    Rng rng(size * 17 + static_cast<uint64_t>(hp.kind) * 5 + static_cast<uint64_t>(dtype));
                    for (size_t i = 0; i < size; ++i) rc.params[i] = bf16_rne(rng.uniform(-1.0f, 1.0f));
                    rc.new_grads(rng);
                    rc.upload();
                    for (int64_t step = 1; step <= 4; ++step) {
                        if (step > 1) {
                            rc.new_grads(rng);
                            rc.upload_grads();
                        }
                        Segment host = rc.segment(&hp, step, 7, offset, false);
                        double want = 0.0;
                        sx::optim::fused_update(&host, 1, 0.5f, nullptr, sx::optim::Isa::kAuto, &want);
                        CudaSegment cs;
                        cs.seg = rc.segment(&hp, step, 7, offset, true);
                        cs.compute_out = rc.d_params.as<uint16_t>();
                        cs.compute_dtype = ComputeDtype::kBf16;
                        check_ok(ws.fused_update(&cs, 1, 0.5f, nullptr, true), "fused_update");
                        GradStats st;
                        check_ok(ws.read_stats(nullptr, &st), "read_stats");
                        assert_close_rel(st.sumsq, want, "sum of squares");
                        std::string what;
                        if (!rc.device_equals_host(hp, &what))
                            fail_msg("kind %d state_dtype %d n %zu grads16 %d step %lld: %s differ from the CPU's",
                                     static_cast<int>(hp.kind), dtype, size, grads16, static_cast<long long>(step),
                                     what.c_str());
                    }
                }
    // Segments of two params and an fp32 one in one launch: each as on the host.
    Hyper h16 = hypers[0];
    h16.state_dtype = SX_STATE_BF16;
    Hyper h8 = hypers[0];
    h8.state_dtype = SX_STATE_8BIT;
    RoundedCase a(SX_STATE_BF16, 3001, false), b(SX_STATE_8BIT, 256 * 5, false);
    Rng rng(11);
    for (RoundedCase *rc : {&a, &b}) {
        for (size_t i = 0; i < rc->n; ++i) rc->params[i] = bf16_rne(rng.uniform(-1.0f, 1.0f));
        rc->new_grads(rng);
        rc->upload();
    }
    for (int64_t step = 1; step <= 2; ++step) {
        Segment host[2] = {a.segment(&h16, step, 0, 17, false), b.segment(&h8, step, 1, 0, false)};
        sx::optim::fused_update(host, 2, 1.0f, nullptr, sx::optim::Isa::kAuto, nullptr);
        CudaSegment cs[2];
        cs[0].seg = a.segment(&h16, step, 0, 17, true), cs[1].seg = b.segment(&h8, step, 1, 0, true);
        cs[0].compute_out = a.d_params.as<uint16_t>(), cs[1].compute_out = b.d_params.as<uint16_t>();
        cs[0].compute_dtype = cs[1].compute_dtype = ComputeDtype::kBf16;
        check_ok(ws.fused_update(cs, 2, 1.0f, nullptr, false), "fused_update");
        std::string what;
        if (!a.device_equals_host(h16, &what) || !b.device_equals_host(h8, &what))
            fail_msg("one launch, step %lld: %s differ from the CPU's", static_cast<long long>(step), what.c_str());
    }
}

}  // namespace

int main(void) {
    g_have_device = sx::cuda::device_available(&g_no_device_reason);
    if (!g_have_device) std::printf("# no CUDA device: %s\n", g_no_device_reason.c_str());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_update_matches_reference),
        cmocka_unit_test(test_mixed_alignment),
        cmocka_unit_test(test_multi_segment_one_launch),
        cmocka_unit_test(test_grad_stats),
        cmocka_unit_test(test_16bit_gradients_match_fp32),
        cmocka_unit_test(test_conversions_match_half),
        cmocka_unit_test(test_packed_state_matches_the_cpu),
        cmocka_unit_test(test_packed_and_fp32_segments_in_one_launch),
        cmocka_unit_test(test_stochastic_round_matches_the_cpu),
        cmocka_unit_test(test_without_device_launch_fails_cleanly),
    };
    const int failed = cmocka_run_group_tests(tests, nullptr, nullptr);
    if (failed == 0 && !g_have_device) return 77;  // ctest: Skipped
    return failed;
}
