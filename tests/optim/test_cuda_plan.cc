// The CUDA launch plan (segment table, chunks, blocks' starting segments) and the
// reference bf16/fp16 conversions the kernel tests use. Both run on the host, so this
// test runs in every CUDA-enabled build, with or without a device.
#include <cmath>
#include <cstdint>
#include <vector>

#include "sx_cmocka.h"

#include "optim/cuda/launch_plan.h"
#include "optim/cuda_test_util.h"
#include "optim/stochastic_round.h"
#include "sx/sx.h"

using sx::optim::Hyper;
using sx::optim::Kind;
using sx::optim::cuda::ComputeDtype;
using sx::optim::cuda::CudaSegment;
using namespace sx::optim::test;
namespace ci = sx::optim::cuda::internal;

namespace {

// ---------------------------------------------------------------- conversions

void test_bf16_rne_hand_values(void **) {
    assert_int_equal(bf16_rne(1.0f), 0x3f80);
    assert_int_equal(bf16_rne(-2.0f), 0xc000);
    assert_int_equal(bf16_rne(-0.0f), 0x8000);
    assert_int_equal(bf16_rne(1.0f + 0x1p-8f), 0x3f80);         // tie, kept part even: down
    assert_int_equal(bf16_rne(1.0f + 3 * 0x1p-8f), 0x3f82);     // tie, kept part odd: up
    assert_int_equal(bf16_rne(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above the tie: up
    assert_int_equal(bf16_rne(3.4028235e38f), 0x7f80);          // FLT_MAX rounds to inf
    assert_int_equal(bf16_rne(INFINITY), 0x7f80);
    assert_true(half_is_nan(bf16_rne(NAN), true));
}

void test_fp16_rne_hand_values(void **) {
    assert_int_equal(fp16_rne(1.0f), 0x3c00);
    assert_int_equal(fp16_rne(-2.0f), 0xc000);
    assert_int_equal(fp16_rne(65504.0f), 0x7bff);               // the largest half
    assert_int_equal(fp16_rne(65519.0f), 0x7bff);
    assert_int_equal(fp16_rne(65520.0f), 0x7c00);               // halfway to 2^16: ties to even = inf
    assert_int_equal(fp16_rne(1.0f + 0x1p-11f), 0x3c00);        // tie: even
    assert_int_equal(fp16_rne(1.0f + 3 * 0x1p-11f), 0x3c02);    // tie: odd rounds up
    assert_int_equal(fp16_rne(2047.0f / 1024.0f + 0x1p-11f), 0x4000);  // carry into the exponent
    assert_int_equal(fp16_rne(0x1p-14f), 0x0400);               // the smallest normal
    assert_int_equal(fp16_rne(0x1p-24f), 0x0001);               // the smallest subnormal
    assert_int_equal(fp16_rne(0x1p-25f), 0x0000);               // tie between 0 and 2^-24: even
    assert_int_equal(fp16_rne(1.5f * 0x1p-25f), 0x0001);
    assert_int_equal(fp16_rne(3 * 0x1p-25f), 0x0002);           // tie at 1.5 units: even (2)
    assert_int_equal(fp16_rne(-INFINITY), 0xfc00);
    assert_true(half_is_nan(fp16_rne(NAN), false));
}

// ---------------------------------------------------------------------- plan

// Fake device addresses: the plan never dereferences them, only looks at alignment.
float *addr(uintptr_t a) { return reinterpret_cast<float *>(a); }

CudaSegment adam_segment(uintptr_t base, size_t n, const Hyper *h, int64_t step) {
    CudaSegment cs;
    cs.seg.param = addr(base);
    cs.seg.grad = addr(base + 0x10000000);
    cs.seg.state[0] = addr(base + 0x20000000);
    cs.seg.state[1] = addr(base + 0x30000000);
    cs.seg.state[2] = addr(base + 0x40000000);
    cs.seg.n = n;
    cs.seg.hyper = h;
    cs.seg.step = step;
    return cs;
}

// Runs the blocks' chunk ranges as the kernel does and counts how often each element
// of each table segment is visited, and in which vector/scalar form.
void check_coverage(const ci::LaunchPlan &plan) {
    uint64_t chunks = 0;
    for (const ci::TableSegment &t : plan.segments) {
        assert_int_equal(t.chunk_begin, chunks);
        assert_true(t.chunk_end > t.chunk_begin);
        assert_int_equal(t.chunk_end - t.chunk_begin, (t.lead + t.n + ci::kChunk - 1) / ci::kChunk);
        assert_true(t.lead < 4);
        if (!t.vector) assert_int_equal(t.lead, 0);
        chunks = t.chunk_end;
    }
    assert_int_equal(plan.total_chunks, chunks);
    if (chunks == 0) {
        assert_int_equal(plan.grid, 0);
        return;
    }
    assert_int_equal(plan.first_segment.size(), plan.grid);
    std::vector<std::vector<int>> seen(plan.segments.size());
    for (size_t s = 0; s < seen.size(); ++s) seen[s].assign(plan.segments[s].n, 0);
    uint64_t previous_end = 0;
    for (uint32_t b = 0; b < plan.grid; ++b) {
        uint64_t c = ci::block_chunk_begin(b, chunks, plan.grid);
        const uint64_t c_end = ci::block_chunk_begin(b + 1, chunks, plan.grid);
        assert_int_equal(c, previous_end);  // blocks' ranges tile [0, chunks)
        assert_true(c_end > c);             // no idle block
        previous_end = c_end;
        uint32_t s = plan.first_segment[b];
        assert_true(plan.segments[s].chunk_begin <= c && c < plan.segments[s].chunk_end);
        for (; c < c_end; ++c) {
            while (plan.segments[s].chunk_end <= c) ++s;
            const ci::TableSegment &t = plan.segments[s];
            const uint64_t first = (c - t.chunk_begin) * ci::kChunk;
            const uint64_t lo = std::max<uint64_t>(first, t.lead);
            const uint64_t hi = std::min<uint64_t>(first + ci::kChunk, t.lead + t.n);
            assert_true(lo < hi);
            for (uint64_t q = lo; q < hi; ++q) ++seen[s][q - t.lead];
        }
    }
    assert_int_equal(previous_end, chunks);
    for (const auto &v : seen)
        for (int k : v) assert_int_equal(k, 1);
}

void test_plan_covers_every_element_once(void **) {
    Hyper h;  // AdamW
    Rng rng(11);
    for (int trial = 0; trial < 60; ++trial) {
        std::vector<CudaSegment> segs;
        const size_t count = 1 + rng.next() % 12;
        uintptr_t base = 0x100000;
        for (size_t i = 0; i < count; ++i) {
            const size_t n = rng.next() % 4 == 0 ? rng.next() % 5 : rng.next() % (5 * ci::kChunk);
            base += 4 * (rng.next() % 4);  // any float position within 16 bytes
            segs.push_back(adam_segment(base, n, &h, 1 + static_cast<int64_t>(rng.next() % 5)));
            base += 4 * n + 64;
        }
        const uint32_t max_grid = 1 + static_cast<uint32_t>(rng.next() % 40);
        ci::LaunchPlan plan;
        assert_true(ci::build_plan(segs.data(), segs.size(), 0.5f, ci::Mode::kUpdate, max_grid, &plan).ok());
        size_t nonempty = 0;
        for (const CudaSegment &cs : segs) nonempty += cs.seg.n > 0;
        assert_int_equal(plan.segments.size(), nonempty);
        assert_true(plan.grid <= max_grid);
        check_coverage(plan);
    }
}

void test_plan_alignment_and_constants(void **) {
    Hyper h;
    h.kind = Kind::kAdam;
    h.amsgrad = true;
    h.weight_decay = 0.1;
    h.maximize = true;
    // All buffers at the same position within 16 bytes (here 2 floats in): vector.
    CudaSegment a = adam_segment(0x1008, 1000, &h, 7);
    // grad one float further than param: one element at a time.
    CudaSegment b = adam_segment(0x9000, 1000, &h, 7);
    b.seg.grad = addr(0x10009004);
    // bf16 output at the matching position within 8 bytes (2 halves in): vector.
    CudaSegment c = adam_segment(0x20008, 1000, &h, 2);
    c.compute_out = reinterpret_cast<void *>(0x50004);
    c.compute_dtype = ComputeDtype::kBf16;
    // fp16 output one half off: one element at a time.
    CudaSegment d = c;
    d.compute_out = reinterpret_cast<void *>(0x50006);
    d.compute_dtype = ComputeDtype::kFp16;
    const CudaSegment segs[] = {a, b, c, d};
    ci::LaunchPlan plan;
    assert_true(ci::build_plan(segs, 4, 0.25f, ci::Mode::kUpdate, 1000, &plan).ok());
    assert_int_equal(plan.segments.size(), 4);
    assert_int_equal(plan.segments[0].vector, 1);
    assert_int_equal(plan.segments[0].lead, 2);
    assert_int_equal(plan.segments[1].vector, 0);
    assert_int_equal(plan.segments[2].vector, 1);
    assert_int_equal(plan.segments[2].out_dtype, static_cast<int>(ComputeDtype::kBf16));
    assert_int_equal(plan.segments[3].vector, 0);
    assert_int_equal(plan.segments[3].out_dtype, static_cast<int>(ComputeDtype::kFp16));
    // The constants are the CPU kernels', per segment (its own step).
    for (int i : {0, 2}) {
        const sx::optim::internal::SegmentConsts want = sx::optim::internal::make_consts(segs[i].seg, 0.25f);
        const sx::optim::internal::SegmentConsts &got = plan.segments[static_cast<size_t>(i)].c;
        assert_true(got.variant == sx::optim::internal::Variant::kAdamAmsgrad);
        assert_true(got.grad_scale == want.grad_scale && got.grad_scale == -0.25f);
        assert_true(got.step_size == want.step_size);
        assert_true(got.bias_correction2_sqrt == want.bias_correction2_sqrt);
        assert_true(got.l2 && got.weight_decay == want.weight_decay);
    }
    assert_true(plan.segments[0].c.step_size != plan.segments[2].c.step_size);  // steps 7 and 2
    check_coverage(plan);

    // Stats only: grad alone decides, other pointers may be null.
    CudaSegment g;
    g.seg.grad = addr(0x3004);
    g.seg.n = 5;
    assert_true(ci::build_plan(&g, 1, 2.0f, ci::Mode::kStats, 8, &plan).ok());
    assert_int_equal(plan.segments.size(), 1);
    assert_int_equal(plan.segments[0].lead, 1);
    assert_true(plan.segments[0].c.grad_scale == 2.0f);
}

// 16-bit gradients (read and widened by the kernel): their position within 8 bytes must
// match the others' within 16 for the vector path; the stats pass takes theirs.
void test_plan_with_16bit_gradients(void **) {
    Hyper h;
    h.kind = Kind::kAdamW;
    auto with16 = [&](uintptr_t param, uintptr_t grad16, int32_t dtype) {
        CudaSegment cs = adam_segment(param, 1000, &h, 3);
        cs.seg.grad = nullptr;
        cs.seg.grad16 = reinterpret_cast<const uint16_t *>(grad16);
        cs.seg.grad_dtype = dtype;
        return cs;
    };
    const CudaSegment segs[] = {with16(0x1008, 0x60004, SX_DTYPE_BF16),  // 2 in, both: vector
                                with16(0x1008, 0x60006, SX_DTYPE_F16),   // 3 halves in: scalar
                                with16(0x1000, 0x60000, SX_DTYPE_F16)};
    ci::LaunchPlan plan;
    assert_true(ci::build_plan(segs, 3, 1.0f, ci::Mode::kUpdate, 1000, &plan).ok());
    assert_int_equal(plan.segments.size(), 3);
    assert_int_equal(plan.segments[0].vector, 1);
    assert_int_equal(plan.segments[0].lead, 2);
    assert_int_equal(plan.segments[0].grad_dtype, static_cast<int>(ComputeDtype::kBf16));
    assert_null(plan.segments[0].grad);
    assert_true(plan.segments[0].grad16 == segs[0].seg.grad16);
    assert_int_equal(plan.segments[1].vector, 0);
    assert_int_equal(plan.segments[2].vector, 1);
    assert_int_equal(plan.segments[2].lead, 0);
    assert_int_equal(plan.segments[2].grad_dtype, static_cast<int>(ComputeDtype::kFp16));
    check_coverage(plan);
    // fp32 gradients say so.
    const CudaSegment plain = adam_segment(0x1000, 10, &h, 1);
    assert_true(ci::build_plan(&plain, 1, 1.0f, ci::Mode::kUpdate, 4, &plan).ok());
    assert_int_equal(plan.segments[0].grad_dtype, static_cast<int>(ComputeDtype::kNone));
    // The stats pass: the gradients' own position.
    CudaSegment g;
    g.seg.grad16 = reinterpret_cast<const uint16_t *>(0x3006);
    g.seg.grad_dtype = SX_DTYPE_BF16;
    g.seg.n = 5;
    assert_true(ci::build_plan(&g, 1, 2.0f, ci::Mode::kStats, 8, &plan).ok());
    assert_int_equal(plan.segments[0].lead, 3);
}

void test_plan_rejects_bad_segments(void **) {
    Hyper adam;
    ci::LaunchPlan plan;
    auto rejects = [&](const CudaSegment &cs, ci::Mode mode) {
        const sx::Status s = ci::build_plan(&cs, 1, 1.0f, mode, 4, &plan);
        if (s.code() != SX_ERR_INVALID_ARGUMENT) fail_msg("accepted a bad segment (code %d)", s.code());
        assert_true(s.message().find("segment 0") != std::string::npos);
    };
    CudaSegment cs = adam_segment(0x1000, 10, &adam, 1);
    cs.seg.state[1] = nullptr;  // Adam needs two slots
    rejects(cs, ci::Mode::kUpdate);
    cs = adam_segment(0x1000, 10, &adam, 0);  // step 0
    rejects(cs, ci::Mode::kUpdate);
    cs = adam_segment(0x1000, 10, nullptr, 1);  // no hyperparameters
    rejects(cs, ci::Mode::kUpdate);
    cs = adam_segment(0x1002, 10, &adam, 1);  // param not float-aligned
    rejects(cs, ci::Mode::kUpdate);
    cs = adam_segment(0x1000, 10, &adam, 1);
    cs.compute_dtype = ComputeDtype::kBf16;  // no output pointer
    rejects(cs, ci::Mode::kUpdate);
    cs.compute_out = reinterpret_cast<void *>(0x5001);  // odd address
    rejects(cs, ci::Mode::kUpdate);
    cs.compute_out = reinterpret_cast<void *>(0x5000);
    cs.compute_dtype = static_cast<ComputeDtype>(9);
    rejects(cs, ci::Mode::kUpdate);
    CudaSegment g;
    g.seg.n = 3;  // no grad
    rejects(g, ci::Mode::kStats);
    g.seg.grad = addr(0x3000);  // both kinds of gradients
    g.seg.grad16 = reinterpret_cast<const uint16_t *>(0x4000);
    g.seg.grad_dtype = SX_DTYPE_BF16;
    rejects(g, ci::Mode::kStats);
    g.seg.grad = nullptr;
    g.seg.grad_dtype = SX_DTYPE_F32;  // 16-bit gradients of no 16-bit dtype
    rejects(g, ci::Mode::kStats);
    g.seg.grad_dtype = SX_DTYPE_BF16;
    g.seg.grad16 = reinterpret_cast<const uint16_t *>(0x4001);  // odd address
    rejects(g, ci::Mode::kStats);
    // Empty segments are skipped unread, even with nothing set.
    CudaSegment empty;
    assert_true(ci::build_plan(&empty, 1, 1.0f, ci::Mode::kUpdate, 4, &plan).ok());
    assert_int_equal(plan.grid, 0);
    assert_int_equal(plan.total_chunks, 0);
}

// Packed state: bf16 and 8-bit segments run one element (or block) at a time, with their
// slots' pointers, dtype, slot count and maps in the table, and make the launch the
// packed kernel's; an 8-bit segment of a part of a block, or without its codes or scales,
// and packed state in the traffic-only pass are refused.
void test_plan_of_packed_state(void **) {
    Hyper adamw = sx::optim::default_hyper(Kind::kAdamW);
    ci::LaunchPlan plan;
    CudaSegment cs[3] = {adam_segment(0x1000, 512, &adamw, 1), adam_segment(0x2000, 100, &adamw, 1),
                         adam_segment(0x3000, 64, &adamw, 1)};
    cs[0].seg.state_dtype = SX_STATE_8BIT;
    cs[1].seg.state_dtype = SX_STATE_BF16;
    for (int k = 0; k < 2; ++k) {
        cs[0].seg.codes[k] = reinterpret_cast<uint8_t *>(0x50000001 + 0x1000 * k);
        cs[0].seg.scales[k] = addr(0x60000000 + 0x1000 * k);
        cs[1].seg.state16[k] = reinterpret_cast<uint16_t *>(0x70000002 + 0x1000 * k);
    }
    assert_true(ci::build_plan(cs, 3, 1.0f, ci::Mode::kUpdate, 8, &plan).ok());
    assert_true(plan.packed);
    const ci::TableSegment &eight = plan.segments[0], &bf16 = plan.segments[1];
    assert_int_equal(eight.state_dtype, SX_STATE_8BIT);
    assert_int_equal(eight.vector, 0);
    assert_int_equal(eight.lead, 0);
    assert_int_equal(eight.slots, 2);
    assert_int_equal(eight.unsigned_maps, 2);  // exp_avg signed, exp_avg_sq unsigned
    assert_ptr_equal(eight.codes[1], cs[0].seg.codes[1]);
    assert_ptr_equal(eight.scales[1], cs[0].seg.scales[1]);
    assert_int_equal(bf16.vector, 0);
    assert_ptr_equal(bf16.state16[1], cs[1].seg.state16[1]);
    assert_int_equal(plan.segments[2].state_dtype, SX_STATE_FP32);
    assert_true(ci::build_plan(&cs[2], 1, 1.0f, ci::Mode::kUpdate, 8, &plan).ok());
    assert_false(plan.packed);
    auto rejects = [&](const CudaSegment &c, ci::Mode mode, const char *what) {
        const sx::Status s = ci::build_plan(&c, 1, 1.0f, mode, 4, &plan);
        if (s.code() != SX_ERR_INVALID_ARGUMENT || s.message().find(what) == std::string::npos)
            fail_msg("want a refusal naming '%s', got code %d: %s", what, s.code(), s.message().c_str());
    };
    rejects(cs[0], ci::Mode::kTrafficOnly, "traffic-only");
    CudaSegment bad = cs[0];
    bad.seg.n = 300;
    rejects(bad, ci::Mode::kUpdate, "whole blocks");
    bad = cs[0];
    bad.seg.scales[1] = nullptr;
    rejects(bad, ci::Mode::kUpdate, "scales[1]");
    bad = cs[1];
    bad.seg.state16[0] = reinterpret_cast<uint16_t *>(0x70000001);
    rejects(bad, ci::Mode::kUpdate, "state16[0]");
    bad.seg.state_dtype = 7;
    rejects(bad, ci::Mode::kUpdate, "state_dtype 7");
}

// bf16_stochastic_round: a segment of bf16 params without an fp32 param runs one element
// at a time, its params the 16-bit output, with the key of its param and step (the host's
// stochastic_round_key) and its offset into the param in the table; one with an fp32
// param, without bf16 params or in the traffic-only pass is refused.
void test_plan_of_stochastically_rounded_params(void **) {
    Hyper adamw = sx::optim::default_hyper(Kind::kAdamW);
    ci::LaunchPlan plan;
    CudaSegment cs = adam_segment(0x1000, 300, &adamw, 4);
    cs.seg.param = nullptr;
    cs.seg.stochastic_round = true;
    cs.seg.param_index = 5;
    cs.seg.param_offset = 1234;
    cs.compute_out = reinterpret_cast<void *>(0x9000002);
    cs.compute_dtype = ComputeDtype::kBf16;
    assert_true(ci::build_plan(&cs, 1, 1.0f, ci::Mode::kUpdate, 8, &plan).ok());
    const ci::TableSegment &t = plan.segments[0];
    assert_int_equal(t.stochastic_round, 1);
    assert_int_equal(t.vector, 0);
    assert_int_equal(t.lead, 0);
    assert_null(t.param);
    assert_ptr_equal(t.out, cs.compute_out);
    assert_int_equal(t.out_dtype, static_cast<int32_t>(ComputeDtype::kBf16));
    assert_true(t.sr_key == sx::optim::stochastic_round_key(5, 4));
    assert_true(t.param_offset == 1234);
    assert_false(plan.packed);
    auto rejects = [&](const CudaSegment &c, ci::Mode mode, const char *what) {
        const sx::Status s = ci::build_plan(&c, 1, 1.0f, mode, 4, &plan);
        if (s.code() != SX_ERR_INVALID_ARGUMENT || s.message().find(what) == std::string::npos)
            fail_msg("want a refusal naming '%s', got code %d: %s", what, s.code(), s.message().c_str());
    };
    rejects(cs, ci::Mode::kTrafficOnly, "traffic-only");
    CudaSegment bad = cs;
    bad.seg.param = addr(0x1000);
    rejects(bad, ci::Mode::kUpdate, "stochastically rounded");
    bad = cs;
    bad.compute_dtype = ComputeDtype::kFp16;
    rejects(bad, ci::Mode::kUpdate, "stochastically rounded");
    bad = cs;
    bad.compute_out = reinterpret_cast<void *>(0x9000001);
    rejects(bad, ci::Mode::kUpdate, "aligned to 2 bytes");
    // The statistics pass reads its gradients alone.
    assert_true(ci::build_plan(&cs, 1, 1.0f, ci::Mode::kStats, 8, &plan).ok());
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rne_hand_values),
        cmocka_unit_test(test_fp16_rne_hand_values),
        cmocka_unit_test(test_plan_covers_every_element_once),
        cmocka_unit_test(test_plan_alignment_and_constants),
        cmocka_unit_test(test_plan_with_16bit_gradients),
        cmocka_unit_test(test_plan_rejects_bad_segments),
        cmocka_unit_test(test_plan_of_packed_state),
        cmocka_unit_test(test_plan_of_stochastically_rounded_params),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
