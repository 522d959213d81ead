// Adafactor's passes over a rank's segments (adafactor.h). Each pass runs in pieces of
// work whose partial sums are added in a fixed order, so that the sums (and the
// moments every rank derives from them) do not depend on the pool's size.
#include "optim/adafactor.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "base/half.h"
#include "optim/param_passes.h"
#include "optim/passes.h"

namespace sx {
namespace optim {
namespace {


// Columns per task of the first pass's column sums.
constexpr uint64_t kColumnBlock = 64;

// The constants of one param's step, each a Python float rounded to fp32 where a tensor
// op takes it.
struct Consts {
    float grad_scale;  // negated under maximize
    float eps1_sq;     // clamp_(min=eps1 * eps1)
    float decay;       // param.mul_(1 - lr * weight_decay), or 1
    Lerp lerp;         // lerp_(..., step^beta2_decay)
    Consts(const Hyper &h, int64_t step, float scale)
        : grad_scale(h.maximize ? -scale : scale),
          eps1_sq(static_cast<float>(h.eps * h.eps)),
          decay(h.weight_decay != 0.0 ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f),
          lerp(std::pow(static_cast<double>(step), h.beta2_decay)) {}
};

// u = g * rsqrt(max(v, eps1^2)): torch's clamp_ then rsqrt_ (1 / sqrt, two roundings).
inline float direction(float g, float v, float eps1_sq) { return g * (1.0f / std::sqrt(std::max(v, eps1_sq))); }

// fn(i, row, col, len) for each run of segment elements [lo, hi) within one row: local
// index i, the row's index over all the param's matrices, its first column, its length.
template <typename F>
void for_each_row_run(const Segment &seg, const AdafactorShape &sh, size_t lo, size_t hi, F fn) {
    size_t i = lo;
    while (i < hi) {
        const uint64_t e = seg.param_offset + i;
        const uint64_t row = e / sh.cols, col = e % sh.cols;
        const size_t len = static_cast<size_t>(std::min<uint64_t>(hi - i, sh.cols - col));
        fn(i, row, col, len);
        i += len;
    }
}

// --- the first pass ---

// The sums of a run of one row: of the params' squares and the gradients' squares.
SX_PASS_CLONES void run_sums(const float *p, const float *g, size_t n, float scale, double *psq, double *gsq) {
    double ps = 0.0, gs = 0.0;
#pragma omp simd reduction(+ : ps, gs)
    for (size_t k = 0; k < n; ++k) {
        const float x = g[k] * scale;
        ps += static_cast<double>(p[k]) * p[k];
        gs += static_cast<double>(x) * x;
    }
    *psq += ps;
    *gsq += gs;
}

// Columns [c0, c1) of a run of one row: acc[c - c0] += (g * scale)^2.
SX_PASS_CLONES void add_column_squares(const float *g, size_t n, float scale, double *acc) {
#pragma omp simd
    for (size_t k = 0; k < n; ++k) {
        const float x = g[k] * scale;
        acc[k] += static_cast<double>(x) * x;
    }
}

// A piece of the first pass: elements [lo, hi) of segment seg, or (column >= 0) the
// column sums of columns [column, column + kColumnBlock) over the whole segment.
struct FirstPiece {
    size_t seg, lo, hi;
    int64_t column;
};

std::vector<FirstPiece> first_pieces(const Segment *segs, size_t num_segs, const AdafactorParam *params) {
    std::vector<FirstPiece> out;
    for (size_t s = 0; s < num_segs; ++s) {
        const Segment &seg = segs[s];
        const AdafactorShape &sh = params[s].shape;
        if (seg.n == 0) continue;
        if (!sh.factored) {
            for (size_t lo = 0; lo < seg.n; lo += kPassPiece) out.push_back({s, lo, std::min(seg.n, lo + kPassPiece), -1});
            continue;
        }
        // Pieces of whole rows (the segment's first and last may be partial), so that each
        // row's sum is one piece's.
        const uint64_t span = std::max<uint64_t>(1, kPassPiece / sh.cols) * sh.cols;
        size_t lo = 0;
        while (lo < seg.n) {
            const uint64_t e = seg.param_offset + lo;
            const size_t hi = static_cast<size_t>(std::min<uint64_t>(seg.n, (e / span + 1) * span - seg.param_offset));
            out.push_back({s, lo, hi, -1});
            lo = hi;
        }
        for (uint64_t c = 0; c < sh.cols; c += kColumnBlock) out.push_back({s, 0, seg.n, static_cast<int64_t>(c)});
    }
    return out;
}

void first_piece(const Segment &seg, const AdafactorParam &par, const FirstPiece &pc, float scale, double *psq,
                 double *gsq) {
    const AdafactorShape &sh = par.shape;
    if (!sh.factored) {
        run_sums(seg.param + pc.lo, seg.grad + pc.lo, pc.hi - pc.lo, scale, psq, gsq);
        return;
    }
    double *row_sums = par.sums + 1, *col_sums = par.sums + 1 + sh.row_count();
    if (pc.column < 0) {
        for_each_row_run(seg, sh, pc.lo, pc.hi, [&](size_t i, uint64_t row, uint64_t, size_t len) {
            double rs = 0.0;
            run_sums(seg.param + i, seg.grad + i, len, scale, psq, &rs);
            row_sums[row] += rs;
            *gsq += rs;
        });
        return;
    }
    // Columns [c0, c1) of every row the segment covers, row after row: each column's sum
    // in ascending row order, whatever the split.
    const uint64_t c0 = static_cast<uint64_t>(pc.column), c1 = std::min(sh.cols, c0 + kColumnBlock);
    double acc[kColumnBlock];
    uint64_t matrix = UINT64_MAX;
    auto flush = [&] {
        if (matrix == UINT64_MAX) return;
        for (uint64_t c = c0; c < c1; ++c) col_sums[matrix * sh.cols + c] += acc[c - c0];
    };
    for_each_row_run(seg, sh, 0, seg.n, [&](size_t i, uint64_t row, uint64_t col, size_t len) {
        const uint64_t m = row / sh.rows;
        if (m != matrix) {
            flush();
            matrix = m;
            std::fill(acc, acc + kColumnBlock, 0.0);
        }
        const uint64_t lo = std::max(col, c0), hi = std::min<uint64_t>(col + len, c1);
        if (lo < hi) add_column_squares(seg.grad + i + (lo - col), hi - lo, scale, acc + (lo - c0));
    });
    flush();
}

// --- the second and third passes ---

// Elements [lo, hi) of a segment: u's squares summed (second pass: a 1-D param's variance
// lerped first), or the update applied (third pass: factor != 0 or not).
SX_PASS_CLONES void unfactored_range(const Segment &seg, const Consts &c, size_t lo, size_t hi, bool apply,
                                          float factor, double *usq) {
    float *v = seg.state[0], *p = seg.param;
    const float *grad = seg.grad;
    double us = 0.0;
    if (!apply) {
#pragma omp simd reduction(+ : us)
        for (size_t i = lo; i < hi; ++i) {
            const float g = grad[i] * c.grad_scale;
            const float vi = c.lerp(v[i], g * g);
            v[i] = vi;
            const float u = direction(g, vi, c.eps1_sq);
            us += static_cast<double>(u) * u;
        }
        *usq += us;
        return;
    }
#pragma omp simd
    for (size_t i = lo; i < hi; ++i) {
        const float g = grad[i] * c.grad_scale;
        p[i] = p[i] * c.decay + factor * direction(g, v[i], c.eps1_sq);
    }
}

// A run of one row of a factored param: its row_var value r, the matrix's col_var from
// column `col`, its row mean m.
SX_PASS_CLONES void factored_run(float *p, const float *grad, size_t n, const Consts &c, float r,
                                      const float *cv, float m, bool apply, float factor, double *usq) {
    if (!apply) {
        double us = 0.0;
#pragma omp simd reduction(+ : us)
        for (size_t k = 0; k < n; ++k) {
            const float u = direction(grad[k] * c.grad_scale, (r * cv[k]) / m, c.eps1_sq);
            us += static_cast<double>(u) * u;
        }
        *usq += us;
        return;
    }
#pragma omp simd
    for (size_t k = 0; k < n; ++k)
        p[k] = p[k] * c.decay + factor * direction(grad[k] * c.grad_scale, (r * cv[k]) / m, c.eps1_sq);
}

void later_piece(const Segment &seg, const AdafactorParam &par, const Consts &c, size_t lo, size_t hi, bool apply,
                 float factor, double *usq) {
    const AdafactorShape &sh = par.shape;
    if (!sh.factored) {
        unfactored_range(seg, c, lo, hi, apply, factor, usq);
    } else {
        for_each_row_run(seg, sh, lo, hi, [&](size_t i, uint64_t row, uint64_t col, size_t len) {
            const uint64_t m = row / sh.rows;
            factored_run(seg.param + i, seg.grad + i, len, c, par.row_var[row], par.col_var + m * sh.cols + col,
                         par.row_means[m], apply, factor, usq);
        });
    }
    if (apply && seg.compute_out) half::from_f32(seg.compute_dtype, seg.param + lo, seg.compute_out + lo, hi - lo);
}

// The second (apply false) or third pass over every segment.
void later_pass(const Segment *segs, size_t num_segs, const AdafactorParam *params, const float *factors,
                float grad_scale, ThreadPool *pool, double *update_sumsq) {
    const std::vector<PassPiece> pieces = pass_pieces(segs, num_segs);
    std::vector<Consts> consts;
    consts.reserve(num_segs);
    for (size_t s = 0; s < num_segs; ++s)
        consts.emplace_back(segs[s].n > 0 ? *segs[s].hyper : Hyper(), segs[s].step, grad_scale);
    std::vector<double> part(pieces.size(), 0.0);
    const bool apply = factors != nullptr;
    for_each_index(pieces.size(), pool, [&](size_t i) {
        const PassPiece &pc = pieces[i];
        later_piece(segs[pc.seg], params[pc.seg], consts[pc.seg], pc.lo, pc.hi, apply, apply ? factors[pc.seg] : 0.0f,
                    &part[i]);
    });
    if (!update_sumsq) return;
    for (size_t s = 0; s < num_segs; ++s) update_sumsq[s] = 0.0;
    for (size_t i = 0; i < pieces.size(); ++i) update_sumsq[pieces[i].seg] += part[i];
}

}  // namespace

AdafactorShape adafactor_shape(const std::vector<int64_t> &shape) {
    AdafactorShape s;
    for (int64_t e : shape) s.numel *= static_cast<uint64_t>(e);
    s.factored = shape.size() >= 2;
    if (!s.factored) return s;
    s.cols = static_cast<uint64_t>(shape.back());
    s.rows = static_cast<uint64_t>(shape[shape.size() - 2]);
    s.matrices = s.numel / (s.rows * s.cols);
    return s;
}

void adafactor_first_pass(const Segment *segs, size_t num_segs, const AdafactorParam *params, float grad_scale,
                          ThreadPool *pool, double *grad_sumsq) {
    const std::vector<FirstPiece> pieces = first_pieces(segs, num_segs, params);
    // Per piece: the param's squares and the gradients' squares (row pieces and
    // unfactored ones; column pieces add into their columns only).
    std::vector<double> psq(pieces.size(), 0.0), gsq(pieces.size(), 0.0);
    for_each_index(pieces.size(), pool, [&](size_t i) {
        const FirstPiece &pc = pieces[i];
        const Segment &seg = segs[pc.seg];
        const float scale = seg.hyper->maximize ? -grad_scale : grad_scale;
        first_piece(seg, params[pc.seg], pc, scale, &psq[i], &gsq[i]);
    });
    double g = 0.0;
    for (size_t i = 0; i < pieces.size(); ++i) {
        params[pieces[i].seg].sums[0] += psq[i];
        g += gsq[i];
    }
    if (grad_sumsq) *grad_sumsq = g;
}

void adafactor_update_factors(const Hyper &h, int64_t step, const AdafactorShape &sh, const double *whole,
                              float *row_var, float *col_var, float *row_means) {
    const Lerp lerp(std::pow(static_cast<double>(step), h.beta2_decay));
    // vector_norm(grad, dim).square_().div_(extent): fp32 means of the squares.
    const float over_cols = static_cast<float>(sh.cols), over_rows = static_cast<float>(sh.rows);
    for (uint64_t r = 0; r < sh.row_count(); ++r)
        row_var[r] = lerp(row_var[r], static_cast<float>(whole[1 + r]) / over_cols);
    for (uint64_t c = 0; c < sh.col_count(); ++c)
        col_var[c] = lerp(col_var[c], static_cast<float>(whole[1 + sh.row_count() + c]) / over_rows);
    // row_var.mean(dim=-2, keepdim=True).clamp_(min=eps1), per matrix.
    for (uint64_t m = 0; m < sh.matrices; ++m) {
        double sum = 0.0;
        for (uint64_t r = 0; r < sh.rows; ++r) sum += row_var[m * sh.rows + r];
        row_means[m] = std::max(static_cast<float>(sum / static_cast<double>(sh.rows)), static_cast<float>(h.eps));
    }
}

void adafactor_update_whole(const PassParam &param, const AdafactorShape &sh, const double *summed,
                            std::vector<float> *row_means) {
    if (!sh.factored) return;
    std::vector<float> &row_var = *param.whole[0], &col_var = *param.whole[1];
    row_var.resize(sh.row_count(), 0.0f);
    col_var.resize(sh.col_count(), 0.0f);
    row_means->resize(sh.matrices);
    adafactor_update_factors(*param.hyper, param.next_step, sh, summed, row_var.data(), col_var.data(),
                             row_means->data());
}

void adafactor_second_pass(const Segment *segs, size_t num_segs, const AdafactorParam *params, float grad_scale,
                           ThreadPool *pool, double *update_sumsq) {
    later_pass(segs, num_segs, params, nullptr, grad_scale, pool, update_sumsq);
}

float adafactor_factor(const Hyper &h, int64_t step, uint64_t numel, double param_sumsq, double update_sumsq) {
    const double t = static_cast<double>(step), root_numel = std::sqrt(static_cast<double>(numel));
    const double rho = std::min(h.lr, 1.0 / std::sqrt(t));
    // param.norm(2).item() and update.norm(2).item(): fp32 norms, then Python floats.
    const double param_norm = static_cast<float>(std::sqrt(param_sumsq));
    const double update_norm = static_cast<float>(std::sqrt(update_sumsq));
    const double alpha = std::max(h.eps2, param_norm / root_numel) * rho;
    const double denom = std::max(1.0, update_norm / (root_numel * h.d));
    return static_cast<float>(-alpha / denom);
}

void adafactor_third_pass(const Segment *segs, size_t num_segs, const AdafactorParam *params, const float *factors,
                          float grad_scale, ThreadPool *pool) {
    later_pass(segs, num_segs, params, factors, grad_scale, pool, nullptr);
}

void adafactor_reference(const Segment &seg, const AdafactorShape &sh, float *row_var, float *col_var,
                         float grad_scale) {
    const Hyper &h = *seg.hyper;
    const Consts c(h, seg.step, grad_scale);
    std::vector<double> whole(sh.first_width(), 0.0);
    std::vector<float> g(seg.n), u(seg.n);
    for (size_t i = 0; i < seg.n; ++i) {
        g[i] = seg.grad[i] * c.grad_scale;
        whole[0] += static_cast<double>(seg.param[i]) * seg.param[i];
        if (!sh.factored) continue;
        const uint64_t row = i / sh.cols, m = row / sh.rows, col = i % sh.cols;
        whole[1 + row] += static_cast<double>(g[i]) * g[i];
        whole[1 + sh.row_count() + m * sh.cols + col] += static_cast<double>(g[i]) * g[i];
    }
    std::vector<float> means(sh.matrices);
    if (sh.factored) adafactor_update_factors(h, seg.step, sh, whole.data(), row_var, col_var, means.data());
    double usq = 0.0;
    for (size_t i = 0; i < seg.n; ++i) {
        float v;
        if (sh.factored) {
            const uint64_t row = i / sh.cols, m = row / sh.rows, col = i % sh.cols;
            v = (row_var[row] * col_var[m * sh.cols + col]) / means[m];
        } else {
            v = seg.state[0][i] = c.lerp(seg.state[0][i], g[i] * g[i]);
        }
        u[i] = direction(g[i], v, c.eps1_sq);
        usq += static_cast<double>(u[i]) * u[i];
    }
    const float factor = adafactor_factor(h, seg.step, sh.numel, whole[0], usq);
    for (size_t i = 0; i < seg.n; ++i) seg.param[i] = seg.param[i] * c.decay + factor * u[i];
    if (seg.compute_out) half::from_f32(seg.compute_dtype, seg.param, seg.compute_out, seg.n);
}

namespace {

// The step's passes (param_passes.h): the first pass; the first exchange (each param's
// AdafactorShape::first_width sums); every rank's update of every param's factored
// moments, which it keeps whole (its WholeTensors), and the second pass; the second
// exchange (each param's sum of u^2); the third pass.
class AdafactorRun final : public ParamPassRun {
  public:
    explicit AdafactorRun(const PassInput &in)
        : in_(in), shapes_(in.num_params), row_means_(in.num_params), params_(in.num_segs), first_(in.num_params) {
        for (size_t k = 0; k < in.num_params; ++k) shapes_[k] = adafactor_shape(*in.params[k].shape);
        for (size_t s = 0; s < in.num_segs; ++s) params_[s].shape = shapes_[in.param_of[s]];
    }
    Status pass(int pass, const double *const *summed, double *const *mine, double *grad_sumsq) override {
        if (pass == 0) {
            for (size_t s = 0; s < in_.num_segs; ++s) params_[s].sums = mine[in_.param_of[s]];
            adafactor_first_pass(in_.segs, in_.num_segs, params_.data(), in_.grad_scale, in_.pool, grad_sumsq);
        } else if (pass == 1) {
            second(summed, mine);
        } else {
            std::vector<float> factors(in_.num_segs);
            for (size_t s = 0; s < in_.num_segs; ++s) {
                const size_t k = in_.param_of[s];
                factors[s] = adafactor_factor(*in_.segs[s].hyper, in_.segs[s].step, shapes_[k].numel, first_[k][0],
                                              summed[k][0]);
            }
            adafactor_third_pass(in_.segs, in_.num_segs, params_.data(), factors.data(), in_.grad_scale, in_.pool);
        }
        return Status::Ok();
    }

  private:
    // Every param's moments (zeros before its first update), pieces here or not; then the
    // second pass, each segment's sum of u^2 its param's block.
    void second(const double *const *summed, double *const *mine) {
        for (size_t k = 0; k < in_.num_params; ++k) {
            first_[k] = summed[k];
            adafactor_update_whole(in_.params[k], shapes_[k], summed[k], &row_means_[k]);
        }
        for (size_t s = 0; s < in_.num_segs; ++s) {
            const size_t k = in_.param_of[s];
            params_[s] = {shapes_[k], nullptr, in_.params[k].whole[0]->data(), in_.params[k].whole[1]->data(),
                          row_means_[k].data()};
        }
        std::vector<double> update_sumsq(in_.num_segs, 0.0);
        adafactor_second_pass(in_.segs, in_.num_segs, params_.data(), in_.grad_scale, in_.pool, update_sumsq.data());
        for (size_t s = 0; s < in_.num_segs; ++s) mine[in_.param_of[s]][0] = update_sumsq[s];
    }

    PassInput in_;
    std::vector<AdafactorShape> shapes_;       // per param
    std::vector<std::vector<float>> row_means_;  // per param: per matrix (adafactor_update_factors)
    std::vector<AdafactorParam> params_;       // per segment
    std::vector<const double *> first_;        // per param: its block of the first exchange, summed
};

uint64_t adafactor_block_width(int e, const std::vector<int64_t> &shape) {
    return e == 0 ? adafactor_shape(shape).first_width() : 1;
}
std::unique_ptr<ParamPassRun> adafactor_start(const PassInput &in) { return std::make_unique<AdafactorRun>(in); }

// row_var's values (t 0) or col_var's (t 1).
uint64_t moments_numel(int t, const std::vector<int64_t> &shape) {
    const AdafactorShape sh = adafactor_shape(shape);
    return t == 0 ? sh.row_count() : sh.col_count();
}
bool mean_of_squares(float v) { return std::isfinite(v) && v >= 0.0f; }

}  // namespace

const ParamPasses kAdafactorPasses = {2, adafactor_block_width, adafactor_start};
const WholeTensors kAdafactorWholeTensors = {
    2, {"row_var", "col_var"}, moments_numel, mean_of_squares,
    "Adafactor's factored moments are means of squares, finite and >= 0"};

}  // namespace optim
}  // namespace sx
