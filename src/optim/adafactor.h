// Adafactor (Shazeer and Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear
// Memory Cost"), as torch.optim.Adafactor computes it (its single-tensor path, the one
// it takes on the CPU). For a param p of step t (1 for its first update), gradient g
// (negated under maximize), eps1 = eps, in fp32 where torch's tensor ops are:
//
//   beta2_t' = t^beta2_decay (1 - beta2_t)     rho = min(lr, 1 / sqrt(t))
//   alpha = max(eps2, ||p|| / sqrt(numel)) * rho               (p before the decay)
//   p = p * (1 - lr * wd)
//   two or more dims, per matrix of the last two ([..., R, C]):
//     row_var = lerp(row_var, mean over each row of g^2, beta2_t')        [..., R, 1]
//     col_var = lerp(col_var, mean over each column of g^2, beta2_t')     [..., 1, C]
//     v = (row_var[r] * col_var[c]) / max(mean of row_var over R, eps1)
//   otherwise: variance = lerp(variance, g^2, beta2_t'), v = variance
//   u = g * rsqrt(max(v, eps1^2))
//   p = p - (alpha / max(1, ||u|| / (sqrt(numel) * d))) * u
//
// Over a sharded param that takes three passes over a rank's pieces around two
// exchanges in the shard group (core/param_reductions.cc): the first pass sums the
// param's squares and the squared gradient over each row and column the piece covers (a
// piece may start and end mid-row); the first exchange adds them over the ranks, and
// every rank updates row_var and col_var, which it keeps whole; the second pass writes a
// 1-D param's variance and sums u^2; the second exchange adds those; the third pass
// applies the update, u recomputed from the same values (the same fp32 operations, so
// the same u, bit for bit). Sums are in double, added in a fixed order for any thread
// count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optim/optimizer.h"
#include "optim/param_passes.h"

namespace sx {
namespace optim {

class ThreadPool;

// How Adafactor sees a param's shape: factored (two or more dims) into `matrices`
// matrices of rows x cols (the last two extents), or not (numel elements).
struct AdafactorShape {
    bool factored = false;
    uint64_t numel = 1;
    uint64_t matrices = 1, rows = 1, cols = 1;
    uint64_t row_count() const { return factored ? matrices * rows : 0; }  // row_var's values
    uint64_t col_count() const { return factored ? matrices * cols : 0; }  // col_var's values
    // The doubles of the param's block in the first exchange: its squares' sum, then each
    // row's and each column's sum of squared gradients.
    uint64_t first_width() const { return 1 + row_count() + col_count(); }
};
AdafactorShape adafactor_shape(const std::vector<int64_t> &shape);

// One segment's param as the passes need it: its shape, its first-exchange block (this
// rank's partial sums in the first pass; in the second and third, nothing), and its
// factored moments (whole, as every rank keeps them; null when not factored).
struct AdafactorParam {
    AdafactorShape shape;
    double *sums = nullptr;
    const float *row_var = nullptr, *col_var = nullptr;
    // Per matrix: max(mean of its row_var, eps1), in fp32 (adafactor_row_means).
    const float *row_means = nullptr;
};

// The first pass over every segment (hyper->kind == kAdafactor): params[s].sums gets
// segment s's sums added (the block must start zeroed; a param has at most one segment
// per rank); *grad_sumsq (if not null) the sum of (grad * grad_scale)^2. Reads only.
void adafactor_first_pass(const Segment *segs, size_t num_segs, const AdafactorParam *params, float grad_scale,
                          ThreadPool *pool, double *grad_sumsq);

// A factored param's moments from its whole sums (the first exchange's block added over
// the ranks) at step `step`: row_var and col_var lerped towards the means of the squared
// gradient, then row_means[m] = max(mean of matrix m's row_var, eps1).
void adafactor_update_factors(const Hyper &h, int64_t step, const AdafactorShape &shape, const double *whole,
                              float *row_var, float *col_var, float *row_means);

// A step's param (of shape sh, factored): its factored moments, which every rank keeps
// whole (its WholeTensors, sized at its first update), updated from its first exchange's
// block added over the ranks, `summed` (adafactor_update_factors), and *row_means its
// matrices' means. Nothing for a param that is not factored.
void adafactor_update_whole(const PassParam &param, const AdafactorShape &sh, const double *summed,
                            std::vector<float> *row_means);

// The second pass: a 1-D param's variance lerped (its segment's state slot 0), and
// update_sumsq[s] the sum of u^2 over segment s.
void adafactor_second_pass(const Segment *segs, size_t num_segs, const AdafactorParam *params, float grad_scale,
                           ThreadPool *pool, double *update_sumsq);

// The factor a param's u is added with, -alpha / max(1, ||u|| / (sqrt(numel) d)), from
// its whole sums of squares (param before decay, u) at step `step`, as torch computes it.
float adafactor_factor(const Hyper &h, int64_t step, uint64_t numel, double param_sumsq, double update_sumsq);

// The third pass: p = p * (1 - lr * wd) + factors[s] * u over segment s; 16-bit params
// (compute_out) rounded from the result.
void adafactor_third_pass(const Segment *segs, size_t num_segs, const AdafactorParam *params, const float *factors,
                          float grad_scale, ThreadPool *pool);

// Reference: the whole param in one segment (seg.step its step), one element at a time:
// row_var and col_var (factored; else seg.state[0], the variance) updated in place.
void adafactor_reference(const Segment &seg, const AdafactorShape &shape, float *row_var, float *col_var,
                         float grad_scale);

}  // namespace optim
}  // namespace sx
