// LAMB's two passes over a rank's segments (lamb.h), split across the pool in pieces of
// fixed size, so that each segment's sums are added in one order for any thread count.
#include "optim/lamb.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "base/half.h"
#include "optim/param_passes.h"
#include "optim/passes.h"

namespace sx {
namespace optim {
namespace {


// u from the element's moments and param (the same operations in both passes).
inline float direction(const LambConsts &c, float m, float v, float p) {
    float u = m / (std::sqrt(v) + c.eps);
    if (c.l2) u = u + c.weight_decay * p;
    return u;
}

// The two passes' loops are compiled for AVX-512, AVX2 and the baseline, chosen when the
// library loads (target_clones), and vectorised with their sums (omp simd, reordering
// only the double sums). No FMA: the fp32 roundings are the reference's.

// Elements [lo, hi) of seg: the first pass, adding into *sums and *grad_sumsq.
SX_PASS_CLONES void first_range(const Segment &seg, const LambConsts &c, size_t lo, size_t hi, LambSums *sums, double *grad_sumsq) {
    float *p = seg.param, *m = seg.state[0], *v = seg.state[1];
    const float *grad = seg.grad;
    double ps = 0.0, us = 0.0, gs = 0.0;
#pragma omp simd reduction(+ : ps, us, gs)
    for (size_t i = lo; i < hi; ++i) {
        const float g = grad[i] * c.grad_scale;
        const float mi = m[i] * c.beta1 + c.one_minus_beta1 * g;   // exp_avg.mul_(beta1).add_(g, alpha=beta3)
        const float vi = v[i] * c.beta2 + c.one_minus_beta2 * g * g;  // exp_avg_sq.mul_(beta2).addcmul_(g, g, 1-beta2)
        const float pi = p[i] * c.decay;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        const float u = direction(c, mi, vi, pi);
        ps += static_cast<double>(pi) * pi;
        us += static_cast<double>(u) * u;
        gs += static_cast<double>(g) * g;
    }
    sums->param += ps;
    sums->update += us;
    *grad_sumsq += gs;
}

SX_PASS_CLONES void second_range(const Segment &seg, const LambConsts &c, float factor, size_t lo, size_t hi) {
    float *p = seg.param;
    const float *m = seg.state[0], *v = seg.state[1];
#pragma omp simd
    for (size_t i = lo; i < hi; ++i) p[i] = p[i] + factor * direction(c, m[i], v[i], p[i]);
    if (seg.compute_out) half::from_f32(seg.compute_dtype, p + lo, seg.compute_out + lo, hi - lo);
}

}  // namespace

LambConsts lamb_consts(const Hyper &h, float grad_scale) {
    LambConsts c;
    c.grad_scale = h.maximize ? -grad_scale : grad_scale;
    c.beta1 = static_cast<float>(h.beta1);
    c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
    c.beta2 = static_cast<float>(h.beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
    c.eps = static_cast<float>(h.eps);
    const bool decoupled = h.decoupled_weight_decay && h.weight_decay != 0.0;
    c.decay = decoupled ? static_cast<float>(1.0 - h.weight_decay * h.lr) : 1.0f;
    c.l2 = !h.decoupled_weight_decay && h.weight_decay > 0.0;
    c.weight_decay = static_cast<float>(h.weight_decay);
    return c;
}

void lamb_first_pass(const Segment *segs, size_t num_segs, float grad_scale, ThreadPool *pool, LambSums *sums,
                     double *grad_sumsq) {
    const std::vector<PassPiece> pieces = pass_pieces(segs, num_segs);
    std::vector<LambSums> part(pieces.size());
    std::vector<double> grad_part(pieces.size(), 0.0);
    std::vector<LambConsts> consts(num_segs);
    for (size_t s = 0; s < num_segs; ++s)
        if (segs[s].n > 0) consts[s] = lamb_consts(*segs[s].hyper, grad_scale);
    for_each_index(pieces.size(), pool, [&](size_t i) {
        const PassPiece &pc = pieces[i];
        first_range(segs[pc.seg], consts[pc.seg], pc.lo, pc.hi, &part[i], &grad_part[i]);
    });
    for (size_t s = 0; s < num_segs; ++s) sums[s] = LambSums();
    double g = 0.0;
    for (size_t i = 0; i < pieces.size(); ++i) {
        sums[pieces[i].seg].param += part[i].param;
        sums[pieces[i].seg].update += part[i].update;
        g += grad_part[i];
    }
    if (grad_sumsq) *grad_sumsq = g;
}

float lamb_factor(const Hyper &h, int64_t step, const LambSums &whole) {
    // Lamb.step: step_size = lr / debias(beta1, group['step']) (apply_adam_debias, off).
    const double step_size = h.lr / (1.0 - std::pow(h.beta1, static_cast<double>(step)));
    // torch.linalg.norm(p).clamp_(min=0, max=Lamb.clamp) and torch.linalg.norm(update): fp32.
    const float weight_norm = std::min(static_cast<float>(std::sqrt(whole.param)), 10.0f);
    const float update_norm = static_cast<float>(std::sqrt(whole.update));
    // trust_ratio = 1.0 (a Python float) if either is 0, else weight_norm / (p_norm + eps) (fp32)
    if (weight_norm == 0.0f || update_norm == 0.0f) return static_cast<float>(-step_size);
    const float trust = weight_norm / (update_norm + static_cast<float>(h.eps));
    return static_cast<float>(-step_size) * trust;  // -step_size * trust_ratio: an fp32 tensor
}

void lamb_second_pass(const Segment *segs, size_t num_segs, const float *factors, ThreadPool *pool) {
    const std::vector<PassPiece> pieces = pass_pieces(segs, num_segs);
    std::vector<LambConsts> consts(num_segs);
    for (size_t s = 0; s < num_segs; ++s)
        if (segs[s].n > 0) consts[s] = lamb_consts(*segs[s].hyper, 1.0f);
    for_each_index(pieces.size(), pool, [&](size_t i) {
        const PassPiece &pc = pieces[i];
        second_range(segs[pc.seg], consts[pc.seg], factors[pc.seg], pc.lo, pc.hi);
    });
}

void lamb_reference(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    const float gscale = h.maximize ? -grad_scale : grad_scale;
    const float beta1 = static_cast<float>(h.beta1), beta2 = static_cast<float>(h.beta2);
    const float eps = static_cast<float>(h.eps);
    const bool decoupled = h.decoupled_weight_decay != 0;
    std::vector<float> u(seg.n);
    double psq = 0.0, usq = 0.0;
    for (size_t i = 0; i < seg.n; ++i) {
        const float g = seg.grad[i] * gscale;
        float &m = seg.state[0][i], &v = seg.state[1][i];
        m = m * beta1 + static_cast<float>(1.0 - h.beta1) * g;
        v = v * beta2 + static_cast<float>(1.0 - h.beta2) * g * g;
        if (decoupled && h.weight_decay != 0.0) seg.param[i] *= static_cast<float>(1.0 - h.weight_decay * h.lr);
        u[i] = m / (std::sqrt(v) + eps);
        if (!decoupled && h.weight_decay > 0.0) u[i] += static_cast<float>(h.weight_decay) * seg.param[i];
        psq += static_cast<double>(seg.param[i]) * seg.param[i];
        usq += static_cast<double>(u[i]) * u[i];
    }
    const float wn = std::min(static_cast<float>(std::sqrt(psq)), 10.0f), un = static_cast<float>(std::sqrt(usq));
    const double step_size = h.lr / (1.0 - std::pow(h.beta1, static_cast<double>(seg.step)));
    const float factor = wn == 0.0f || un == 0.0f ? static_cast<float>(-step_size)
                                                  : static_cast<float>(-step_size) * (wn / (un + eps));
    for (size_t i = 0; i < seg.n; ++i) seg.param[i] += factor * u[i];
    if (seg.compute_out) half::from_f32(seg.compute_dtype, seg.param, seg.compute_out, seg.n);
}

namespace {

// The step's passes (param_passes.h): the first pass, one exchange of two sums per
// param (its squares, its direction's), the second pass.
class LambRun final : public ParamPassRun {
  public:
    explicit LambRun(const PassInput &in) : in_(in) {}
    Status pass(int pass, const double *const *summed, double *const *mine, double *grad_sumsq) override {
        if (pass == 0) {
            std::vector<LambSums> sums(in_.num_segs);
            lamb_first_pass(in_.segs, in_.num_segs, in_.grad_scale, in_.pool, sums.data(), grad_sumsq);
            for (size_t s = 0; s < in_.num_segs; ++s) {
                double *block = mine[in_.param_of[s]];
                block[0] = sums[s].param;
                block[1] = sums[s].update;
            }
            return Status::Ok();
        }
        std::vector<float> factors(in_.num_segs);
        for (size_t s = 0; s < in_.num_segs; ++s) {
            const double *block = summed[in_.param_of[s]];
            factors[s] = lamb_factor(*in_.segs[s].hyper, in_.segs[s].step, LambSums{block[0], block[1]});
        }
        lamb_second_pass(in_.segs, in_.num_segs, factors.data(), in_.pool);
        return Status::Ok();
    }

  private:
    PassInput in_;
};

uint64_t lamb_block_width(int, const std::vector<int64_t> &) { return 2; }
std::unique_ptr<ParamPassRun> lamb_start(const PassInput &in) { return std::make_unique<LambRun>(in); }

}  // namespace

const ParamPasses kLambPasses = {1, lamb_block_width, lamb_start};

}  // namespace optim
}  // namespace sx
