// The optimizer kernels against the scalar reference, and the reference against values
// worked out by hand from torch.optim's documented formulas.
//
// The kernels round exactly where the reference does (kernel_body.h), so every flavour
// must reproduce the reference bit for bit: any difference is a bug, not noise. Only
// sums of squares, which are accumulated in a different order, get a tolerance.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
}

#include "base/half.h"
#include "optim/kernels.h"
#include "optim/optimizer.h"
#include "optim/thread_pool.h"
#include "optim/optim_test_util.h"

using sx::optim::Hyper;
using sx::optim::Isa;
using sx::optim::Kind;
using sx::optim::Segment;
using sx::optim::ThreadPool;
using namespace sx::optim::test;
namespace in = sx::optim::internal;

namespace {

// The 3-thread pool the tests share. It lives outside the test functions: a failed
// assertion leaves a test by longjmp, which would skip a local pool's destructor and
// leave its threads waiting on a condition variable in a dead stack frame.
ThreadPool *g_three = nullptr;

// Relative difference of a sum of squares from its double reference. Each float lane
// adds at most kSumBlock/16 squares before the block goes into a double, which bounds
// the relative error by about 64 * 2^-24 = 4e-6.
constexpr double kSumsqTolerance = 5e-6;

void assert_close_rel(double got, double want, double tol, const char *what) {
    const double err = std::fabs(got - want);
    if (err > tol * std::fabs(want)) {
        fail_msg("%s: got %.17g, want %.17g (relative error %.3g > %.3g)", what, got, want,
                 want != 0 ? err / std::fabs(want) : err, tol);
    }
}

// ------------------------------------------------------------------ hand values

// One element through reference_update for each of `grads`; returns param after each.
struct Trace {
    std::vector<float> param, s0, s1, s2;
};
Trace run_reference(const Hyper &h, float p0, const std::vector<float> &grads) {
    float p = p0, g = 0, st[3] = {0, 0, 0};
    Trace t;
    for (size_t k = 0; k < grads.size(); ++k) {
        g = grads[k];
        Segment s;
        s.param = &p;
        s.grad = &g;
        s.state[0] = &st[0];
        s.state[1] = &st[1];
        s.state[2] = &st[2];
        s.n = 1;
        s.hyper = &h;
        s.step = static_cast<int64_t>(k) + 1;
        sx::optim::reference_update(s, 1.0f);
        t.param.push_back(p);
        t.s0.push_back(st[0]);
        t.s1.push_back(st[1]);
        t.s2.push_back(st[2]);
    }
    return t;
}

// Expected values below come from the formulas in the brief's order, evaluated in
// double (Python floats), e.g. for SGD with momentum 0.9, dampening 0.1, wd 0.01,
// lr 0.1, p = 1, grads 0.5 then -0.25:
//   step 1: g = 0.5 + 0.01*1 = 0.51; buf = g = 0.51; p = 1 - 0.1*0.51 = 0.949
//   step 2: g = -0.25 + 0.01*0.949 = -0.24051; buf = 0.9*0.51 + 0.9*g = 0.242541;
//           p = 0.949 - 0.1*0.242541 = 0.9247459
// The reference computes in float, hence the tolerance of a few float ulps.
constexpr double kHandTolerance = 1e-6;

void test_reference_sgd_hand_values(void **) {
    Hyper h;
    h.kind = Kind::kSgd;
    h.lr = 0.1;
    h.momentum = 0.9;
    h.dampening = 0.1;
    h.weight_decay = 0.01;
    Trace t = run_reference(h, 1.0f, {0.5f, -0.25f});
    assert_close_rel(t.param[0], 0.949, kHandTolerance, "sgd momentum step 1 param");
    assert_close_rel(t.s0[0], 0.51, kHandTolerance, "sgd momentum step 1 buf");
    assert_close_rel(t.param[1], 0.9247459, kHandTolerance, "sgd momentum step 2 param");
    assert_close_rel(t.s0[1], 0.242541, kHandTolerance, "sgd momentum step 2 buf");

    // nesterov, maximize: g = -0.5; buf = -0.5; g + 0.9*buf = -0.95; p = 1.095
    // step 2: g = 0.25; buf = 0.9*-0.5 + 0.25 = -0.2; g = 0.25 - 0.18 = 0.07; p = 1.088
    Hyper n;
    n.kind = Kind::kSgd;
    n.lr = 0.1;
    n.momentum = 0.9;
    n.nesterov = true;
    n.maximize = true;
    t = run_reference(n, 1.0f, {0.5f, -0.25f});
    assert_close_rel(t.param[0], 1.095, kHandTolerance, "sgd nesterov step 1 param");
    assert_close_rel(t.param[1], 1.088, kHandTolerance, "sgd nesterov step 2 param");
    assert_close_rel(t.s0[1], -0.2, kHandTolerance, "sgd nesterov step 2 buf");

    // no momentum, wd 0.1, p = 2: p = 2 - 0.1*(0.5 + 0.2) = 1.93;
    // then 1.93 - 0.1*(-0.25 + 0.193) = 1.9357
    Hyper plain;
    plain.kind = Kind::kSgd;
    plain.lr = 0.1;
    plain.weight_decay = 0.1;
    t = run_reference(plain, 2.0f, {0.5f, -0.25f});
    assert_close_rel(t.param[0], 1.93, kHandTolerance, "sgd plain step 1");
    assert_close_rel(t.param[1], 1.9357, kHandTolerance, "sgd plain step 2");
}

void test_reference_adam_hand_values(void **) {
    // Adam, L2 weight decay 0.1, lr 0.1, betas (0.9, 0.999), p = 1, grads 0.5, -0.25:
    //   step 1: g = 0.6; m = 0.06; v = 0.00036; bc1 = 0.1, bc2 = 0.001;
    //           p = 1 - (0.1/0.1) * 0.06 / (sqrt(0.00036)/sqrt(0.001) + 1e-8)
    Hyper h;
    h.kind = Kind::kAdam;
    h.lr = 0.1;
    h.weight_decay = 0.1;
    Trace t = run_reference(h, 1.0f, {0.5f, -0.25f});
    assert_close_rel(t.param[0], 0.9000000016666666, kHandTolerance, "adam step 1 param");
    assert_close_rel(t.s0[0], 0.06, kHandTolerance, "adam step 1 exp_avg");
    assert_close_rel(t.s1[0], 0.00036, kHandTolerance, "adam step 1 exp_avg_sq");
    assert_close_rel(t.param[1], 0.8544413674617625, kHandTolerance, "adam step 2 param");
    assert_close_rel(t.s0[1], 0.03800000001666665, kHandTolerance, "adam step 2 exp_avg");
    assert_close_rel(t.s1[1], 0.00038523999994666703, kHandTolerance, "adam step 2 exp_avg_sq");

    // amsgrad with grads 1, 0.01: v falls at step 2 (0.0009991 < 0.001), so the
    // denominator keeps max_exp_avg_sq = 0.001 and the result differs from plain Adam.
    Hyper a;
    a.kind = Kind::kAdam;
    a.lr = 0.1;
    a.amsgrad = true;
    t = run_reference(a, 1.0f, {1.0f, 0.01f});
    assert_close_rel(t.param[0], 0.900000001, kHandTolerance, "amsgrad step 1 param");
    assert_close_rel(t.param[1], 0.8322835510128204, kHandTolerance, "amsgrad step 2 param");
    assert_close_rel(t.s1[1], 0.000999100000000001, kHandTolerance, "amsgrad step 2 exp_avg_sq");
    assert_close_rel(t.s2[1], 0.0010000000000000009, kHandTolerance, "amsgrad step 2 max_exp_avg_sq");
    a.amsgrad = false;
    t = run_reference(a, 1.0f, {1.0f, 0.01f});
    assert_close_rel(t.param[1], 0.832253058026447, kHandTolerance, "adam (no amsgrad) step 2 param");
}

void test_reference_adamw_hand_values(void **) {
    // AdamW, wd 0.1, lr 0.1: p = 1*(1 - 0.01) = 0.99 first, then Adam without L2:
    //   step 1: m = 0.05, v = 0.00025, p = 0.99 - 1 * 0.05 / (0.5 + 1e-8)
    Hyper h;
    h.kind = Kind::kAdamW;
    h.lr = 0.1;
    h.weight_decay = 0.1;
    Trace t = run_reference(h, 1.0f, {0.5f, -0.25f});
    assert_close_rel(t.param[0], 0.890000002, kHandTolerance, "adamw step 1 param");
    assert_close_rel(t.param[1], 0.8544662986878463, kHandTolerance, "adamw step 2 param");
    assert_close_rel(t.s0[1], 0.019999999999999997, kHandTolerance, "adamw step 2 exp_avg");
    assert_close_rel(t.s1[1], 0.0003122500000000003, kHandTolerance, "adamw step 2 exp_avg_sq");

    // maximize and beta1 = 0.3 (lerp weight 0.7 >= 0.5: torch's other lerp branch)
    h.beta1 = 0.3;
    h.maximize = true;
    t = run_reference(h, 1.0f, {0.5f, -0.25f});
    assert_close_rel(t.param[0], 1.0899999980000001, kHandTolerance, "adamw maximize step 1");
    assert_close_rel(t.s0[0], -0.35, kHandTolerance, "adamw maximize step 1 exp_avg");
    assert_close_rel(t.param[1], 1.0596369071526572, kHandTolerance, "adamw maximize step 2");
    assert_close_rel(t.s0[1], 0.07, kHandTolerance, "adamw maximize step 2 exp_avg");
}

void test_state_slots(void **) {
    Hyper h;
    h.kind = Kind::kSgd;
    assert_int_equal(sx::optim::state_slots(h), 0);
    h.momentum = 0.9;
    assert_int_equal(sx::optim::state_slots(h), 1);
    h.kind = Kind::kAdam;
    assert_int_equal(sx::optim::state_slots(h), 2);
    h.amsgrad = true;
    assert_int_equal(sx::optim::state_slots(h), 3);
    h.kind = Kind::kAdamW;
    assert_int_equal(sx::optim::state_slots(h), 3);
}

// ------------------------------------------------------------ kernel vs reference

// Steps one segment with the reference and with `isa` through the public entry point,
// from fresh state (steps 1, 2, 3) and from random state (steps 10, 11), and requires
// identical bits after every step, untouched guard cells, and the sum of squares.
void check_single(const Hyper &h, Isa isa, size_t n, size_t offset, float scale) {
    SegmentBuffers ref(n, offset), got(n, offset);
    Rng rng(n * 131 + offset * 7 + static_cast<uint64_t>(isa));
    const int64_t starts[2] = {1, 10};
    const int counts[2] = {3, 2};
    for (int phase = 0; phase < 2; ++phase) {
        fill(ref, rng, h, phase == 0);
        got.copy_from(ref);
        for (int k = 0; k < counts[phase]; ++k) {
            const int64_t step = starts[phase] + k;
            if (k > 0) new_grads(ref, got, rng);
            Segment rs = ref.segment(&h, step), gs = got.segment(&h, step);
            const double want_sumsq = sumsq_double(ref.grad.data(), n, scale);
            sx::optim::reference_update(rs, scale);
            double sumsq = -1.0;
            sx::optim::fused_update(&gs, 1, scale, nullptr, isa, &sumsq);
            const size_t bad = got.mismatches_with(ref);
            if (bad != 0 || !got.guards_intact())
                fail_msg("%s kind %d mom %g nesterov %d wd %g amsgrad %d maximize %d beta1 %g: "
                         "n %zu offset %zu step %lld: %zu mismatches, guards %s",
                         sx::optim::isa_name(isa), static_cast<int>(h.kind), h.momentum, h.nesterov,
                         h.weight_decay, h.amsgrad, h.maximize, h.beta1, n, offset,
                         static_cast<long long>(step), bad, got.guards_intact() ? "intact" : "overwritten");
            assert_close_rel(sumsq, want_sumsq, kSumsqTolerance, "fused sum of squares");
        }
    }
}

void test_kernels_match_reference(void **) {
    const size_t lengths[] = {0, 1, 7, 15, 16, 17, 33, 1000, 4099};
    const std::vector<Hyper> configs = all_configs();
    for (Isa isa : runnable_isas()) {
        for (size_t c = 0; c < configs.size(); ++c) {
            const float scale = c % 2 ? 0.37f : 1.0f;
            for (size_t n : lengths)
                for (size_t offset = 0; offset < 4; ++offset) check_single(configs[c], isa, n, offset, scale);
        }
    }
}

// amsgrad keeps torch.maximum's NaN rule: NaN in either operand gives NaN.
void test_amsgrad_nan_propagates(void **) {
    Hyper h;
    h.kind = Kind::kAdam;
    h.amsgrad = true;
    const size_t n = 37;
    for (Isa isa : runnable_isas()) {
        SegmentBuffers ref(n, 1), got(n, 1);
        Rng rng(5);
        fill(ref, rng, h, false);
        for (size_t i = 0; i < n; i += 5) ref.state2.data()[i] = NAN;      // max_exp_avg_sq
        for (size_t i = 2; i < n; i += 7) ref.state1.data()[i] = NAN;      // exp_avg_sq
        got.copy_from(ref);
        Segment rs = ref.segment(&h, 4), gs = got.segment(&h, 4);
        sx::optim::reference_update(rs, 1.0f);
        sx::optim::fused_update(&gs, 1, 1.0f, nullptr, isa, nullptr);
        for (size_t i = 0; i < n; i += 5) assert_true(std::isnan(got.state2.data()[i]));
        for (size_t i = 2; i < n; i += 7) assert_true(std::isnan(got.state2.data()[i]));
        assert_int_equal(got.mismatches_with(ref), 0);
    }
}

// ------------------------------------------------------------- several segments

// Segments laid out one after another in flat buffers, as a shard is, with gaps of
// 0..3 floats so that each starts unaligned; every segment has its own hyperparameters
// and step count.
struct Layout {
    std::vector<size_t> lengths, starts;
    size_t total = 0;
    explicit Layout(const std::vector<size_t> &ls) : lengths(ls) {
        size_t pos = 0;
        for (size_t i = 0; i < ls.size(); ++i) {
            pos += i % 4;
            starts.push_back(pos);
            pos += ls[i];
        }
        total = pos;
    }
    std::vector<Segment> segments(SegmentBuffers &b, const std::vector<Hyper> &h,
                                  const std::vector<int64_t> &steps) const {
        std::vector<Segment> segs;
        for (size_t i = 0; i < lengths.size(); ++i) {
            Segment s = b.segment(&h[i], steps[i]);
            s.param += starts[i];
            s.grad += starts[i];
            for (float *&st : s.state)
                if (st) st += starts[i];
            s.n = lengths[i];
            segs.push_back(s);
        }
        return segs;
    }
};

// Runs the multi-segment update with `k` split across `pool` (threshold 1 element, so
// even small segments are split) and compares with the reference, segment by segment.
void check_multi(const in::KernelTable &k, ThreadPool *pool, const Layout &layout,
                 const std::vector<Hyper> &hypers, std::vector<int64_t> steps, size_t min_per_thread) {
    SegmentBuffers ref(layout.total, 1), got(layout.total, 1);
    Rng rng(layout.total + static_cast<uint64_t>(pool ? pool->size() : 0));
    Hyper fill_h;  // zero Adam state; momentum buffers random (steps > 1 below)
    fill(ref, rng, fill_h, false);
    got.copy_from(ref);
    const float scale = 0.5f;
    for (int round = 0; round < 3; ++round) {
        if (round > 0) new_grads(ref, got, rng);
        std::vector<Segment> rs = layout.segments(ref, hypers, steps);
        std::vector<Segment> gs = layout.segments(got, hypers, steps);
        double want = 0.0;
        for (const Segment &s : rs) {
            want += sumsq_double(s.grad, s.n, scale);
            sx::optim::reference_update(s, scale);
        }
        double sumsq = -1.0;
        in::fused_update_with(k, gs.data(), gs.size(), scale, pool, min_per_thread, &sumsq);
        const size_t bad = got.mismatches_with(ref);
        if (bad != 0 || !got.guards_intact())
            fail_msg("%s, %d threads, round %d: %zu mismatches, guards %s", k.name,
                     pool ? pool->size() : 1, round, bad, got.guards_intact() ? "intact" : "overwritten");
        assert_close_rel(sumsq, want, kSumsqTolerance, "multi-segment fused sum of squares");
        const double alone = in::sum_of_squares_with(k, gs.data(), gs.size(), scale, pool, min_per_thread);
        assert_close_rel(alone, want, kSumsqTolerance, "multi-segment sum_of_squares");
        for (int64_t &s : steps) ++s;
    }
}

std::vector<Hyper> mixed_hypers(size_t count) {
    const std::vector<Hyper> configs = all_configs();
    std::vector<Hyper> h;
    for (size_t i = 0; i < count; ++i) h.push_back(configs[(i * 7 + 3) % configs.size()]);
    return h;
}

void test_multi_segment_threads(void **) {
    const Layout layout({33, 0, 4099, 1, 1000, 17, 7, 16, 15, 2050});
    const std::vector<Hyper> hypers = mixed_hypers(layout.lengths.size());
    // Steps differ by segment: some at their first step (momentum buffers created),
    // others later.
    const std::vector<int64_t> steps = {1, 1, 2, 1, 5, 3, 1, 9, 2, 1};
    for (Isa isa : runnable_isas()) {
        const in::KernelTable &k = in::kernels_for(isa);
        check_multi(k, nullptr, layout, hypers, steps, 1);
        check_multi(k, g_three, layout, hypers, steps, 1);
    }
}

// The sum of squares over parts that the pool's threads take in any order (run_open):
// the same bits at every call with a pool of a given size, whichever thread took which
// part, here with a worker delayed by a busy loop on some calls.
void test_split_sums_do_not_depend_on_who_takes_the_parts(void **) {
    const Layout layout({33, 0, 40999, 1, 10000, 17, 7, 16, 15, 20500});
    const std::vector<Hyper> hypers = mixed_hypers(layout.lengths.size());
    SegmentBuffers b(layout.total, 1);
    Rng rng(99);
    fill(b, rng, Hyper(), false);
    const std::vector<Segment> gs = layout.segments(b, hypers, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
    const in::KernelTable &k = in::kernels_for(runnable_isas().back());
    const double first = in::sum_of_squares_with(k, gs.data(), gs.size(), 0.5f, g_three, 1);
    std::atomic<bool> busy{false};
    std::thread hog([&] {  // takes a processor now and then, so that workers wake late
        for (int i = 0; i < 400; ++i) {
            const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(i % 3 ? 50 : 500);
            while (std::chrono::steady_clock::now() < until) busy.store(!busy.load());
            std::this_thread::yield();
        }
    });
    int differ = 0;
    for (int i = 0; i < 200; ++i) {
        const double again = in::sum_of_squares_with(k, gs.data(), gs.size(), 0.5f, g_three, 1);
        if (std::memcmp(&again, &first, sizeof(double)) != 0) ++differ;
    }
    hog.join();
    if (differ) fail_msg("%d of 200 sums differ from the first in their bits", differ);
}

// Segments with a 16-bit compute copy (mixed precision): the fp32 values are exactly the
// reference's, the copy is each of them rounded to nearest even, block by block across
// thread splits that fall anywhere, and nothing outside the segments is written.
void test_compute_copy(void **) {
    const Layout layout({1, 4095, 4097, 9000, 33});
    Hyper h;
    h.kind = sx::optim::Kind::kAdamW;
    h.weight_decay = 0.01;
    const std::vector<Hyper> hypers(layout.lengths.size(), h);
    for (int32_t dtype : {SX_DTYPE_BF16, SX_DTYPE_F16}) {
        for (Isa isa : runnable_isas()) {
            const in::KernelTable &k = in::kernels_for(isa);
            SegmentBuffers ref(layout.total, 1), got(layout.total, 1);
            Rng rng(layout.total + static_cast<uint64_t>(dtype));
            fill(ref, rng, h, true);
            got.copy_from(ref);
            constexpr uint16_t kGuard16 = 0xdead;
            std::vector<uint16_t> copy(layout.total + 2, kGuard16);
            std::vector<Segment> rs = layout.segments(ref, hypers, {1, 1, 1, 1, 1});
            std::vector<Segment> gs = layout.segments(got, hypers, {1, 1, 1, 1, 1});
            for (size_t i = 0; i < gs.size(); ++i) {
                gs[i].compute_out = copy.data() + 1 + layout.starts[i];
                gs[i].compute_dtype = dtype;
            }
            for (const Segment &seg : rs) sx::optim::reference_update(seg, 0.5f);
            in::fused_update_with(k, gs.data(), gs.size(), 0.5f, g_three, 1, nullptr);
            assert_int_equal(got.mismatches_with(ref), 0);
            assert_true(got.guards_intact());
            size_t written = 0;
            for (size_t i = 0; i < gs.size(); ++i) {
                for (size_t e = 0; e < gs[i].n; ++e, ++written) {
                    const float p = gs[i].param[e];
                    const uint16_t want = dtype == SX_DTYPE_BF16 ? sx::half::f32_to_bf16(p) : sx::half::f32_to_f16(p);
                    if (gs[i].compute_out[e] != want)
                        fail_msg("%s dtype %d: segment %zu element %zu: copy 0x%04x, expected 0x%04x", k.name, dtype, i,
                                 e, gs[i].compute_out[e], want);
                }
            }
            size_t untouched = 0;
            for (uint16_t c : copy) untouched += c == kGuard16;
            assert_int_equal(untouched, copy.size() - written);  // gaps between segments and both ends
        }
    }
}

// Segment.zero_grad: the update zeroes each gradient as it reads it, every flavour and
// optimizer, on awkward lengths split over threads, and updates exactly as without it
// (params, states and the sum of squares); the gradient buffers' guards stay intact.
void test_update_zeroes_the_gradients_it_reads(void **) {
    const Layout layout({1, 17, 4095, 4097, 33});
    for (const Hyper &h : all_configs()) {
        const std::vector<Hyper> hypers(layout.lengths.size(), h);
        for (Isa isa : runnable_isas()) {
            const in::KernelTable &k = in::kernels_for(isa);
            SegmentBuffers ref(layout.total, 1), got(layout.total, 1);
            Rng rng(layout.total + 7);
            fill(ref, rng, h, false);
            got.copy_from(ref);
            std::vector<Segment> rs = layout.segments(ref, hypers, {3, 3, 3, 3, 3});
            std::vector<Segment> gs = layout.segments(got, hypers, {3, 3, 3, 3, 3});
            for (Segment &seg : gs) seg.zero_grad = const_cast<float *>(seg.grad);
            double want = 0, have = 0;
            in::fused_update_with(k, rs.data(), rs.size(), 0.5f, g_three, 1, &want);
            in::fused_update_with(k, gs.data(), gs.size(), 0.5f, g_three, 1, &have);
            assert_int_equal(got.mismatches_with(ref), 0);
            assert_true(have == want);
            assert_true(got.guards_intact());
            size_t nonzero = 0, was_nonzero = 0;
            for (size_t i = 0; i < gs.size(); ++i)
                for (size_t e = 0; e < gs[i].n; ++e) {
                    nonzero += gs[i].grad[e] != 0.0f;
                    was_nonzero += rs[i].grad[e] != 0.0f;
                }
            if (nonzero != 0) fail_msg("%s: %zu gradients left unzeroed", k.name, nonzero);
            assert_true(was_nonzero > 0);  // the reference's gradients were not zero to begin with
        }
    }
}

// The public entry points with a pool: large enough that they split across 3 threads.
void test_public_entry_points_split(void **) {
    const Layout layout({70001, 3, 50007, 40000});
    assert_int_equal(in::threads_for(layout.total, nullptr, in::kMinElementsPerThread), 1);
    ThreadPool &three = *g_three;
    assert_int_equal(in::threads_for(layout.total, &three, in::kMinElementsPerThread), 3);
    const std::vector<Hyper> hypers = mixed_hypers(layout.lengths.size());
    const std::vector<int64_t> steps = {2, 1, 4, 7};
    for (Isa isa : runnable_isas()) {
        SegmentBuffers ref(layout.total, 2), got(layout.total, 2);
        Rng rng(99);
        Hyper fill_h;
        fill(ref, rng, fill_h, false);
        got.copy_from(ref);
        std::vector<Segment> rs = layout.segments(ref, hypers, steps);
        std::vector<Segment> gs = layout.segments(got, hypers, steps);
        double want = 0.0;
        for (const Segment &s : rs) {
            want += sumsq_double(s.grad, s.n, 2.0f);
            sx::optim::reference_update(s, 2.0f);
        }
        const double before = sx::optim::sum_of_squares(gs.data(), gs.size(), 2.0f, &three, isa);
        assert_close_rel(before, want, kSumsqTolerance, "public sum_of_squares");
        double sumsq = 0.0;
        sx::optim::fused_update(gs.data(), gs.size(), 2.0f, &three, isa, &sumsq);
        assert_int_equal(got.mismatches_with(ref), 0);
        assert_true(got.guards_intact());
        assert_close_rel(sumsq, want, kSumsqTolerance, "public fused sum of squares");
    }
    // No segments at all: nothing to do, and the sum is zero.
    double sumsq = -1.0;
    sx::optim::fused_update(nullptr, 0, 1.0f, &three, Isa::kAuto, &sumsq);
    assert_true(sumsq == 0.0);
}

// Sums of squares alone on awkward lengths and starts, large values (no overflow of
// the float lanes for values far below FLT_MAX^0.5) and a long input.
void test_sum_of_squares(void **) {
    const size_t lengths[] = {0, 1, 7, 15, 16, 17, 31, 32, 33, 1000, 1024, 1025, 4099, 100003};
    ThreadPool &three = *g_three;
    for (Isa isa : runnable_isas()) {
        const in::KernelTable &k = in::kernels_for(isa);
        for (size_t n : lengths) {
            for (size_t offset = 0; offset < 4; ++offset) {
                Guarded g(n, offset);
                Rng rng(n + offset);
                for (size_t i = 0; i < n; ++i) g.data()[i] = rng.uniform(-3.0f, 3.0f) * (i % 3 ? 1.0f : 1e6f);
                const double want = sumsq_double(g.data(), n, 0.25f);
                const double direct = k.sum_of_squares(g.data(), n, 0.25f);
                if (n == 0) assert_true(direct == 0.0);
                else assert_close_rel(direct, want, kSumsqTolerance, "sum_of_squares kernel");
                Segment s;
                s.grad = g.data();
                s.n = n;
                for (ThreadPool *pool : {static_cast<ThreadPool *>(nullptr), &three}) {
                    const double split = in::sum_of_squares_with(k, &s, 1, 0.25f, pool, 1);
                    if (n == 0) assert_true(split == 0.0);
                    else assert_close_rel(split, want, kSumsqTolerance, "split sum_of_squares");
                }
            }
        }
    }
}

// The float lanes restart every kSumBlock elements. One square of 2^24 at the end of
// block 0 followed by 2^20 ones: a lane that kept summing in float would round every
// later +1 away (2^24 + 1 is not a float) and lose about 1/16 (AVX-512) of the ones,
// a relative error near 4e-3; restarted lanes lose at most a rounding of the block
// holding the big square.
void test_sum_of_squares_restarts_float_lanes(void **) {
    const size_t n = size_t(1) << 20;
    Guarded g(n, 0);
    for (size_t i = 0; i < n; ++i) g.data()[i] = 1.0f;
    g.data()[in::kSumBlock - 1] = 4096.0f;
    const double want = 16777216.0 + static_cast<double>(n - 1);
    Hyper h;
    h.kind = Kind::kSgd;
    h.lr = 0.0;
    Guarded param(n, 0);
    Segment s;
    s.param = param.data();
    s.grad = g.data();
    s.n = n;
    s.hyper = &h;
    for (Isa isa : runnable_isas()) {
        const in::KernelTable &k = in::kernels_for(isa);
        assert_close_rel(k.sum_of_squares(g.data(), n, 1.0f), want, 1e-6, "sum_of_squares, big square");
        double fused = 0.0;
        in::fused_update_with(k, &s, 1, 1.0f, nullptr, in::kMinElementsPerThread, &fused);
        assert_close_rel(fused, want, 1e-6, "fused sum of squares, big square");
    }
}

// ------------------------------------------------------------- split and dispatch

void test_partition(void **) {
    Rng rng(3);
    for (int trial = 0; trial < 200; ++trial) {
        std::vector<size_t> lengths(1 + rng.next() % 6);
        for (size_t &l : lengths) l = rng.next() % 4 == 0 ? 0 : rng.next() % 3000;
        std::vector<Segment> segs(lengths.size());
        size_t total = 0;
        for (size_t i = 0; i < segs.size(); ++i) {
            segs[i].n = lengths[i];
            total += lengths[i];
        }
        const int parts = 1 + static_cast<int>(rng.next() % 5);
        const std::vector<in::Cut> cuts = in::partition(segs.data(), segs.size(), parts);
        assert_int_equal(cuts.size(), static_cast<size_t>(parts) + 1);
        assert_int_equal(cuts.front().segment, 0);
        assert_int_equal(cuts.front().offset, 0);
        assert_int_equal(cuts.back().segment, segs.size());
        assert_int_equal(cuts.back().offset, 0);
        // Every element in exactly one part; parts in order; inner cuts on the grain.
        std::vector<std::vector<int>> owner(segs.size());
        for (size_t i = 0; i < segs.size(); ++i) owner[i].assign(segs[i].n, -1);
        size_t last_seg = 0, last_off = 0;
        for (int t = 0; t < parts; ++t) {
            const in::Cut &c = cuts[t];
            assert_true(c.segment > last_seg || (c.segment == last_seg && c.offset >= last_off));
            last_seg = c.segment;
            last_off = c.offset;
            assert_int_equal(c.offset % in::kSplitGrain, 0);
            size_t count = 0;
            in::for_each_piece(segs.data(), cuts[t], cuts[t + 1], [&](size_t s, size_t b, size_t e) {
                for (size_t i = b; i < e; ++i) {
                    assert_int_equal(owner[s][i], -1);
                    owner[s][i] = t;
                }
                count += e - b;
            });
            // About total/parts each: off by less than a grain per cut.
            const double share = static_cast<double>(total) / parts;
            assert_true(std::fabs(static_cast<double>(count) - share) <= 2.0 * in::kSplitGrain + 1);
        }
        for (const auto &o : owner)
            for (int t : o) assert_true(t >= 0);
    }
}

void test_isa_selection(void **) {
    const Isa best = sx::optim::detect_isa();
    assert_true(best == Isa::kScalar || best == Isa::kAvx2 || best == Isa::kAvx512);
    assert_true(in::resolve_isa(Isa::kAuto) == best);
    assert_true(in::resolve_isa(Isa::kScalar) == Isa::kScalar);
    // Asking for more than the CPU has falls back to the best it has.
    for (Isa want : {Isa::kAvx2, Isa::kAvx512}) {
        const Isa got = in::resolve_isa(want);
        assert_true(static_cast<int>(got) <= static_cast<int>(best));
        assert_true(static_cast<int>(got) <= static_cast<int>(want));
        if (static_cast<int>(want) <= static_cast<int>(best)) assert_true(got == want);
    }
    assert_string_equal(sx::optim::isa_name(Isa::kScalar), "scalar");
    assert_string_equal(sx::optim::isa_name(Isa::kAvx2), "avx2");
    assert_string_equal(sx::optim::isa_name(Isa::kAvx512), "avx512");
    assert_string_equal(in::kernels_for(best).name, sx::optim::isa_name(best));
    std::printf("# detected ISA: %s\n", sx::optim::isa_name(best));
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_slots),
        cmocka_unit_test(test_reference_sgd_hand_values),
        cmocka_unit_test(test_reference_adam_hand_values),
        cmocka_unit_test(test_reference_adamw_hand_values),
        cmocka_unit_test(test_isa_selection),
        cmocka_unit_test(test_partition),
        cmocka_unit_test(test_kernels_match_reference),
        cmocka_unit_test(test_amsgrad_nan_propagates),
        cmocka_unit_test(test_multi_segment_threads),
        cmocka_unit_test(test_split_sums_do_not_depend_on_who_takes_the_parts),
        cmocka_unit_test(test_compute_copy),
        cmocka_unit_test(test_update_zeroes_the_gradients_it_reads),
        cmocka_unit_test(test_public_entry_points_split),
        cmocka_unit_test(test_sum_of_squares),
        cmocka_unit_test(test_sum_of_squares_restarts_float_lanes),
    };
    ThreadPool three(3);
    g_three = &three;
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
