// Helpers for the optimizer tests: deterministic random numbers, arrays with guard
// cells around an unaligned window, and bitwise comparison of float arrays.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "optim/kernels.h"
#include "optim/optimizer.h"

namespace sx {
namespace optim {
namespace test {

// xorshift64*: the same sequence on every machine, so failures reproduce.
class Rng {
  public:
    explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() {
        s_ ^= s_ >> 12;
        s_ ^= s_ << 25;
        s_ ^= s_ >> 27;
        return s_ * 0x2545F4914F6CDD1Dull;
    }
    float uniform(float lo, float hi) {
        return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
    }

  private:
    uint64_t s_;
};

// n floats starting `offset` floats past a 64-byte boundary, with kGuard sentinel
// floats on each side that no kernel may touch.
class Guarded {
  public:
    static constexpr size_t kGuard = 32;
    static constexpr float kSentinel = -12345.5f;

    Guarded(size_t n, size_t offset) : n_(n), storage_(n + offset + 2 * kGuard + 16, kSentinel) {
        uintptr_t raw = reinterpret_cast<uintptr_t>(storage_.data());
        size_t skip = ((64 - raw % 64) % 64) / sizeof(float);
        const size_t start = skip + kGuard + offset;
        data_ = storage_.data() + start;
        // Through the vector's iterators: GCC 12 misjudged the bound of a loop over data_.
        std::fill(storage_.begin() + static_cast<ptrdiff_t>(start),
                  storage_.begin() + static_cast<ptrdiff_t>(start + n), 0.0f);
    }
    float *data() { return data_; }
    const float *data() const { return data_; }
    size_t size() const { return n_; }
    void copy_from(const Guarded &o) { std::memcpy(data_, o.data_, n_ * sizeof(float)); }
    // True if every guard cell still holds the sentinel.
    bool guards_intact() const {
        for (size_t i = 1; i <= kGuard; ++i)
            if (!same(data_[-static_cast<ptrdiff_t>(i)], kSentinel) || !same(data_[n_ + i - 1], kSentinel))
                return false;
        return true;
    }
    static bool same(float a, float b) {
        if (a != a && b != b) return true;  // any NaN matches any NaN
        uint32_t x, y;
        std::memcpy(&x, &a, 4);
        std::memcpy(&y, &b, 4);
        return x == y;
    }

  private:
    size_t n_;
    std::vector<float> storage_;
    float *data_;
};

// Number of elements whose bits differ (NaN matches NaN); prints the first.
inline size_t mismatches(const char *what, const float *got, const float *want, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; ++i) {
        if (Guarded::same(got[i], want[i])) continue;
        if (count++ == 0)
            std::fprintf(stderr, "%s[%zu]: got %.9g, want %.9g\n", what, i, static_cast<double>(got[i]),
                         static_cast<double>(want[i]));
    }
    return count;
}

// param, grad and three state slots for one segment.
struct SegmentBuffers {
    Guarded param, grad, state0, state1, state2;
    SegmentBuffers(size_t n, size_t offset)
        : param(n, offset), grad(n, offset), state0(n, offset), state1(n, offset), state2(n, offset) {}
    Guarded &state(int i) { return i == 0 ? state0 : i == 1 ? state1 : state2; }
    Segment segment(const Hyper *h, int64_t step) {
        Segment s;
        s.param = param.data();
        s.grad = grad.data();
        const int slots = state_slots(*h);
        for (int i = 0; i < 3; ++i) s.state[i] = i < slots ? state(i).data() : nullptr;
        s.n = param.size();
        s.hyper = h;
        s.step = step;
        // NAdam: the product a param that took `step` updates holds.
        s.mu_product = mu_product_after(*h, step);
        return s;
    }
    void copy_from(SegmentBuffers &o) {
        param.copy_from(o.param);
        grad.copy_from(o.grad);
        for (int i = 0; i < 3; ++i) state(i).copy_from(o.state(i));
    }
    bool guards_intact() {
        return param.guards_intact() && grad.guards_intact() && state0.guards_intact() &&
               state1.guards_intact() && state2.guards_intact();
    }
    // Differences from o in param and state (0 when identical).
    size_t mismatches_with(SegmentBuffers &o) {
        size_t n = param.size();
        return mismatches("param", param.data(), o.param.data(), n) +
               mismatches("state0", state0.data(), o.state0.data(), n) +
               mismatches("state1", state1.data(), o.state1.data(), n) +
               mismatches("state2", state2.data(), o.state2.data(), n);
    }
};

// The ISAs this CPU can run, scalar first.
inline std::vector<Isa> runnable_isas() {
    std::vector<Isa> isas = {Isa::kScalar};
    const Isa best = detect_isa();
    if (best == Isa::kAvx2 || best == Isa::kAvx512) isas.push_back(Isa::kAvx2);
    if (best == Isa::kAvx512) isas.push_back(Isa::kAvx512);
    return isas;
}

// sum of (grad*scale)^2 in double.
inline double sumsq_double(const float *grad, size_t n, float scale) {
    double s = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double g = static_cast<double>(grad[i]) * static_cast<double>(scale);
        s += g * g;
    }
    return s;
}

// The sum of squares of the gradients as the update scales them (grad*scale rounded to
// fp32, as the update uses it), each square exact in double.
inline double sumsq_of_scaled(const float *grad, size_t n, float scale) {
    double s = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const float g = grad[i] * scale;
        s += static_cast<double>(g) * static_cast<double>(g);
    }
    return s;
}

// Every specialisation the kernels have, and each hyperparameter that changes the maths.
inline std::vector<Hyper> all_configs() {
    std::vector<Hyper> v;
    auto sgd = [&](double lr, double mom, double damp, double wd, bool nesterov, bool maximize) {
        Hyper h;
        h.kind = Kind::kSgd;
        h.lr = lr;
        h.momentum = mom;
        h.dampening = damp;
        h.weight_decay = wd;
        h.nesterov = nesterov;
        h.maximize = maximize;
        v.push_back(h);
    };
    sgd(0.1, 0, 0, 0, false, false);
    sgd(0.1, 0, 0, 0.01, false, false);
    sgd(0.05, 0, 0, 0, false, true);
    sgd(0.1, 0.9, 0, 0, false, false);
    sgd(0.1, 0.9, 0.1, 0.05, false, false);
    sgd(0.1, 0.9, 0, 0.01, true, false);
    sgd(0.02, 0.5, 0, 0, true, true);
    sgd(0.1, 0.8, 0.3, 0.02, false, true);
    auto adam = [&](Kind kind, double lr, double wd, bool amsgrad, bool maximize, double beta1,
                    double beta2, double eps) {
        Hyper h;
        h.kind = kind;
        h.lr = lr;
        h.weight_decay = wd;
        h.amsgrad = amsgrad;
        h.maximize = maximize;
        h.beta1 = beta1;
        h.beta2 = beta2;
        h.eps = eps;
        v.push_back(h);
    };
    for (Kind k : {Kind::kAdam, Kind::kAdamW}) {
        adam(k, 1e-3, 0, false, false, 0.9, 0.999, 1e-8);
        adam(k, 1e-2, 0.1, false, false, 0.9, 0.999, 1e-8);
        adam(k, 1e-2, 0, true, false, 0.9, 0.999, 1e-8);
        adam(k, 1e-2, 0.05, true, true, 0.9, 0.99, 1e-6);
        adam(k, 3e-3, 0.01, false, true, 0.3, 0.95, 1e-8);  // lerp weight 0.7: other branch
        // Of an 8-bit group (torchao's formulas), on fp32 slots here: a param torchao
        // leaves unquantized, or the slots decoded (test_state_codec.cc packs them).
        for (int i = 0; i < 3; ++i) {
            adam(k, i == 0 ? 1e-3 : 1e-2, i == 0 ? 0.0 : 0.1, i == 1, i == 2, i == 2 ? 0.3 : 0.9, 0.999, 1e-8);
            v.back().state_dtype = SX_STATE_8BIT;
        }
    }
    // The other rows of the optimizer table, each option that changes the maths.
    auto row = [&](Kind kind, auto set) {
        Hyper h = default_hyper(kind);
        set(h);
        v.push_back(h);
    };
    row(Kind::kAdagrad, [](Hyper &) {});
    row(Kind::kAdagrad, [](Hyper &h) { h.weight_decay = 0.1, h.lr_decay = 0.01, h.initial_accumulator_value = 0.2, h.maximize = true; });
    row(Kind::kRmsprop, [](Hyper &) {});
    row(Kind::kRmsprop, [](Hyper &h) { h.momentum = 0.9, h.weight_decay = 0.01; });
    row(Kind::kRmsprop, [](Hyper &h) { h.centered = true, h.alpha = 0.9, h.maximize = true; });
    row(Kind::kRmsprop, [](Hyper &h) { h.centered = true, h.momentum = 0.5, h.alpha = 0.3; });  // lerp's other branch
    row(Kind::kAdamax, [](Hyper &) {});
    row(Kind::kAdamax, [](Hyper &h) { h.weight_decay = 0.1, h.beta1 = 0.3, h.maximize = true; });
    row(Kind::kNadam, [](Hyper &) {});
    row(Kind::kNadam, [](Hyper &h) { h.weight_decay = 0.1, h.momentum_decay = 0.01; });
    row(Kind::kNadam, [](Hyper &h) { h.weight_decay = 0.1, h.decoupled_weight_decay = true, h.maximize = true; });
    row(Kind::kRadam, [](Hyper &) {});  // rho_t > 5 from step 6: both variants in 1..3 and 10..11
    row(Kind::kRadam, [](Hyper &h) { h.weight_decay = 0.1, h.beta2 = 0.99; });
    row(Kind::kRadam, [](Hyper &h) { h.weight_decay = 0.1, h.decoupled_weight_decay = true, h.maximize = true; });
    row(Kind::kLion, [](Hyper &) {});
    row(Kind::kLion, [](Hyper &h) { h.weight_decay = 0.5, h.lr = 0.01, h.beta1 = 0.95, h.maximize = true; });
    row(Kind::kAdemamix, [](Hyper &) {});
    row(Kind::kAdemamix, [](Hyper &h) { h.weight_decay = 0.1, h.maximize = true, h.beta3 = 0.3; });  // slow lerp's other branch
    row(Kind::kAdemamix, [](Hyper &h) { h.weight_decay = 0.1, h.decoupled_weight_decay = true, h.t_alpha_beta3 = 7; });
    return v;
}

// Fills a segment's buffers. fresh: the state torch would create (zeros), except an
// SGD momentum buffer, which holds NaN because step 1 must overwrite it unread.
inline void fill(SegmentBuffers &b, Rng &rng, const Hyper &h, bool fresh) {
    const size_t n = b.param.size();
    for (size_t i = 0; i < n; ++i) {
        b.param.data()[i] = rng.uniform(-1.0f, 1.0f);
        b.grad.data()[i] = rng.uniform(-1.0f, 1.0f);
        if (fresh) {
            // What step 1 overwrites unread is NaN (SGD's momentum buffer, Adagrad's sum).
            const bool unread = h.kind == Kind::kSgd || h.kind == Kind::kAdagrad;
            b.state0.data()[i] = unread ? NAN : 0.0f;
            b.state1.data()[i] = 0.0f;
            b.state2.data()[i] = 0.0f;
        } else if (h.kind == Kind::kAdagrad || h.kind == Kind::kRmsprop) {
            // sum / square_avg above every grad_avg^2; momentum_buffer and grad_avg signed.
            b.state0.data()[i] = rng.uniform(0.001f, 0.01f);
            b.state1.data()[i] = rng.uniform(-0.03f, 0.03f);
            b.state2.data()[i] = rng.uniform(-0.03f, 0.03f);
        } else {
            b.state0.data()[i] = rng.uniform(-0.1f, 0.1f);
            b.state1.data()[i] = rng.uniform(0.0f, 0.01f);
            b.state2.data()[i] = rng.uniform(0.0f, 0.02f);  // above or below the new v
        }
    }
}

inline void new_grads(SegmentBuffers &a, SegmentBuffers &b, Rng &rng) {
    for (size_t i = 0; i < a.grad.size(); ++i) a.grad.data()[i] = b.grad.data()[i] = rng.uniform(-2.0f, 2.0f);
}

}  // namespace test
}  // namespace optim
}  // namespace sx
