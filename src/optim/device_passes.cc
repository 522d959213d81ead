// LAMB's and Adafactor's passes through a PassLauncher (device_passes.h): the table of a
// step's segments, the host's share of each pass (the runs' sums added into the blocks,
// the factors and moments derived from the exchanged sums), and the host's launcher.
#include "optim/device_passes.h"

#include <cmath>

#include "base/half.h"
#include "optim/adafactor.h"
#include "optim/device_pass_body.h"
#include "optim/lamb.h"
#include "optim/muon.h"
#include "optim/passes.h"

namespace sx {
namespace optim {
namespace {

// The host's fp32 operations (this module builds with -ffp-contract=off: each rounds once).
struct HostOps {
    static float add(float a, float b) { return a + b; }
    static float sub(float a, float b) { return a - b; }
    static float mul(float a, float b) { return a * b; }
    static float div(float a, float b) { return a / b; }
    static float sqrt(float a) { return std::sqrt(a); }
    static uint16_t to16(int32_t dtype, float x) {
        uint16_t h;
        half::from_f32(dtype, &x, &h, 1);
        return h;
    }
};

class HostLauncher final : public PassLauncher {
  public:
    Status launch(PassKernel kernel, const std::vector<PassSegment> &segs, const std::vector<float> &aux,
                  std::vector<double> *out) override {
        uint64_t runs = 0, items = 0;
        for (const PassSegment &s : segs) runs += s.run_count, items += s.column_count;
        const bool columns = kernel == PassKernel::kAdafactorColumns;
        out->assign(!gives_sums(kernel) ? 0 : columns ? items : runs * kRunSums, 0.0);
        double scratch[kRunSums] = {};  // an apply's (whose sums are none)
        for (const PassSegment &s : segs) {
            if (columns) {
                for (uint64_t j = 0; j < s.column_count; ++j)
                    (*out)[s.column_begin + j] = pass_body::adafactor_column_item<HostOps>(s, j);
                continue;
            }
            for (uint64_t j = 0; j < s.run_count; ++j) {
                uint64_t lo, hi;
                pass_run(s, j, &lo, &hi);
                double *acc = out->empty() ? scratch : out->data() + (s.run_begin + j) * kRunSums;
                for (uint64_t i = lo; i < hi; ++i) pass_body::element_at<HostOps>(kernel, s, aux.data(), i, acc);
            }
        }
        return Status::Ok();
    }
};

// Segment s of `in` in the table, its runs and column items numbered after *runs and
// *items (which it advances); constants are the caller's.
PassSegment table_segment(const Segment &seg, const AdafactorShape *factored, uint64_t *runs, uint64_t *items) {
    PassSegment t = {};
    t.param = seg.param;
    t.grad = seg.grad;
    t.state0 = seg.state[0];
    t.state1 = seg.state[1];
    t.compute_out = seg.compute_out;
    t.compute_dtype = seg.compute_dtype;
    t.n = seg.n;
    t.offset = seg.param_offset;
    if (factored && seg.n > 0) {
        t.rows = factored->rows;
        t.cols = factored->cols;
        t.row_count = factored->row_count();
        t.col_count = factored->col_count();
        const uint64_t first_row = t.offset / t.cols, last_row = (t.offset + t.n - 1) / t.cols;
        t.run_count = last_row - first_row + 1;
        const uint64_t blocks = (t.rows + kColumnRows - 1) / kColumnRows;
        t.column_count = (last_row / t.rows - first_row / t.rows + 1) * blocks * t.cols;
    } else {
        t.run_count = (seg.n + kDeviceRun - 1) / kDeviceRun;
    }
    t.run_begin = *runs;
    t.column_begin = *items;
    *runs += t.run_count;
    *items += t.column_count;
    return t;
}

// The runs' sums j (0..kRunSums-1) of table segment t, added in run order.
double run_sum(const PassSegment &t, const std::vector<double> &out, int j) {
    double s = 0.0;
    for (uint64_t r = 0; r < t.run_count; ++r) s += out[(t.run_begin + r) * kRunSums + static_cast<uint64_t>(j)];
    return s;
}

// LAMB (lamb.cc's LambRun, its loops as kernels): the first pass, one exchange of two
// sums per param, the second pass.
class LambDeviceRun final : public ParamPassRun {
  public:
    LambDeviceRun(const PassInput &in, std::unique_ptr<PassLauncher> launcher)
        : in_(in), launcher_(std::move(launcher)) {
        uint64_t runs = 0, items = 0;
        for (size_t s = 0; s < in.num_segs; ++s) {
            const Segment &seg = in.segs[s];
            PassSegment t = table_segment(seg, nullptr, &runs, &items);
            if (seg.n > 0) {
                const LambConsts c = lamb_consts(*seg.hyper, in.grad_scale);
                t.grad_scale = c.grad_scale;
                t.beta1 = c.beta1, t.one_minus_beta1 = c.one_minus_beta1;
                t.beta2 = c.beta2, t.one_minus_beta2 = c.one_minus_beta2;
                t.eps = c.eps, t.decay = c.decay, t.weight_decay = c.weight_decay;
                t.l2 = c.l2;
            }
            table_.push_back(t);
        }
    }
    Status pass(int pass, const double *const *summed, double *const *mine, double *grad_sumsq) override {
        std::vector<double> out;
        if (pass == 0) {
            SX_TRY(launcher_->launch(PassKernel::kLambFirst, table_, {}, &out));
            double g = 0.0;
            for (size_t s = 0; s < in_.num_segs; ++s) {
                double *block = mine[in_.param_of[s]];
                block[0] = run_sum(table_[s], out, 0);
                block[1] = run_sum(table_[s], out, 1);
                g += run_sum(table_[s], out, 2);
            }
            if (grad_sumsq) *grad_sumsq = g;
            return Status::Ok();
        }
        for (size_t s = 0; s < in_.num_segs; ++s) {
            const double *block = summed[in_.param_of[s]];
            if (in_.segs[s].n > 0)
                table_[s].factor = lamb_factor(*in_.segs[s].hyper, in_.segs[s].step, LambSums{block[0], block[1]});
        }
        return launcher_->launch(PassKernel::kLambApply, table_, {}, &out);
    }

  private:
    PassInput in_;
    std::unique_ptr<PassLauncher> launcher_;
    std::vector<PassSegment> table_;
};

// Adafactor (adafactor.cc's AdafactorRun, its loops as kernels): the first pass (the runs'
// sums and the column items'), the first exchange, every param's factored moments
// updated on the host and the second pass over them, the second exchange, the third pass.
class AdafactorDeviceRun final : public ParamPassRun {
  public:
    AdafactorDeviceRun(const PassInput &in, std::unique_ptr<PassLauncher> launcher)
        : in_(in), launcher_(std::move(launcher)), shapes_(in.num_params), row_means_(in.num_params),
          first_(in.num_params, nullptr) {
        for (size_t k = 0; k < in.num_params; ++k) shapes_[k] = adafactor_shape(*in.params[k].shape);
        uint64_t runs = 0, items = 0;
        for (size_t s = 0; s < in.num_segs; ++s) {
            const Segment &seg = in.segs[s];
            const AdafactorShape &sh = shapes_[in.param_of[s]];
            PassSegment t = table_segment(seg, sh.factored ? &sh : nullptr, &runs, &items);
            if (seg.n > 0) {  // adafactor.cc's Consts
                const Hyper &h = *seg.hyper;
                t.grad_scale = h.maximize ? -in.grad_scale : in.grad_scale;
                t.eps1_sq = static_cast<float>(h.eps * h.eps);
                t.decay = h.weight_decay != 0.0 ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
                const Lerp lerp(std::pow(static_cast<double>(seg.step), h.beta2_decay));
                t.lerp_coeff = lerp.coeff;
                t.lerp_from_end = lerp.from_end;
            }
            table_.push_back(t);
        }
    }
    Status pass(int pass, const double *const *summed, double *const *mine, double *grad_sumsq) override {
        if (pass == 0) return first(mine, grad_sumsq);
        std::vector<double> out;
        if (pass == 1) {
            moments(summed);
            SX_TRY(launcher_->launch(PassKernel::kAdafactorSecond, table_, aux_, &out));
            for (size_t s = 0; s < in_.num_segs; ++s) mine[in_.param_of[s]][0] = run_sum(table_[s], out, 0);
            return Status::Ok();
        }
        for (size_t s = 0; s < in_.num_segs; ++s) {
            const size_t k = in_.param_of[s];
            if (in_.segs[s].n > 0)
                table_[s].factor = adafactor_factor(*in_.segs[s].hyper, in_.segs[s].step, shapes_[k].numel,
                                                    first_[k][0], summed[k][0]);
        }
        return launcher_->launch(PassKernel::kAdafactorApply, table_, aux_, &out);
    }

  private:
    // The first pass: each param's block gets its segment's sum of squares, its rows'
    // and its columns' sums of squared gradients.
    Status first(double *const *mine, double *grad_sumsq) {
        std::vector<double> runs, columns;
        SX_TRY(launcher_->launch(PassKernel::kAdafactorSums, table_, {}, &runs));
        bool factored = false;
        for (const PassSegment &t : table_) factored = factored || t.column_count > 0;
        if (factored) SX_TRY(launcher_->launch(PassKernel::kAdafactorColumns, table_, {}, &columns));
        double g = 0.0;
        for (size_t s = 0; s < in_.num_segs; ++s) {
            const PassSegment &t = table_[s];
            double *block = mine[in_.param_of[s]];
            block[0] += run_sum(t, runs, 0);
            for (uint64_t r = 0; r < t.run_count; ++r) {
                const double gs = runs[(t.run_begin + r) * kRunSums + 1];
                if (t.cols) block[1 + t.offset / t.cols + r] += gs;
                g += gs;
            }
            if (!t.cols || t.n == 0) continue;
            // Item j: matrix first_matrix + j / (blocks * cols), then its row block, then its column.
            const uint64_t blocks = (t.rows + kColumnRows - 1) / kColumnRows, first_matrix = t.offset / t.cols / t.rows;
            double *col_sums = block + 1 + t.row_count;
            for (uint64_t j = 0; j < t.column_count; ++j) {
                const uint64_t matrix = first_matrix + j / (blocks * t.cols), col = j % t.cols;
                col_sums[matrix * t.cols + col] += columns[t.column_begin + j];
            }
        }
        if (grad_sumsq) *grad_sumsq = g;
        return Status::Ok();
    }

    // Every param's factored moments from its summed block (whether this rank holds a piece
    // of it or not), and the floats the kernels read them from.
    void moments(const double *const *summed) {
        aux_.clear();
        std::vector<uint64_t> at(in_.num_params, 0);
        for (size_t k = 0; k < in_.num_params; ++k) {
            first_[k] = summed[k];
            adafactor_update_whole(in_.params[k], shapes_[k], summed[k], &row_means_[k]);
            if (!shapes_[k].factored) continue;
            at[k] = aux_.size();
            const std::vector<float> &row_var = *in_.params[k].whole[0], &col_var = *in_.params[k].whole[1];
            aux_.insert(aux_.end(), row_var.begin(), row_var.end());
            aux_.insert(aux_.end(), col_var.begin(), col_var.end());
            aux_.insert(aux_.end(), row_means_[k].begin(), row_means_[k].end());
        }
        for (size_t s = 0; s < in_.num_segs; ++s) table_[s].aux = at[in_.param_of[s]];
    }

    PassInput in_;
    std::unique_ptr<PassLauncher> launcher_;
    std::vector<AdafactorShape> shapes_;         // per param
    std::vector<std::vector<float>> row_means_;  // per param: per matrix
    std::vector<const double *> first_;          // per param: its first exchange's block, summed
    std::vector<PassSegment> table_;             // per segment
    std::vector<float> aux_;                     // the moments the second and third passes read
};

// The passes read fp32 gradients alone (a segment's grad16 is the elementwise update's).
Status check_gradients(const Segment *segs, size_t num_segs) {
    for (size_t s = 0; s < num_segs; ++s)
        SX_CHECK(segs[s].n == 0 || (segs[s].grad != nullptr && segs[s].grad16 == nullptr), SX_ERR_INTERNAL,
                 "segment %zu of the device passes has no fp32 gradient (16-bit ones are the elementwise update's)", s);
    return Status::Ok();
}

}  // namespace

Status device_muon_momentum(PassLauncher &launcher, const Segment *segs, size_t num_segs, float grad_scale,
                            float *const *pieces, double *grad_sumsq) {
    SX_TRY(check_gradients(segs, num_segs));
    std::vector<PassSegment> table;
    uint64_t runs = 0, items = 0;
    for (size_t s = 0; s < num_segs; ++s) {
        PassSegment t = table_segment(segs[s], nullptr, &runs, &items);
        t.pieces = pieces[s];
        t.grad_scale = grad_scale;
        if (segs[s].n > 0) {  // muon.cc's Lerps: into the buffer, and Nesterov's
            const Hyper &h = *segs[s].hyper;
            const Lerp into_buf(1.0 - h.momentum), nesterov(h.momentum);
            t.lerp_coeff = into_buf.coeff;
            t.lerp_from_end = into_buf.from_end;
            t.nesterov_coeff = nesterov.coeff;
            t.nesterov_from_end = nesterov.from_end;
            t.nesterov = h.nesterov ? 1 : 0;
        }
        table.push_back(t);
    }
    std::vector<double> out;
    SX_TRY(launcher.launch(PassKernel::kMuonMomentum, table, {}, &out));
    if (grad_sumsq) {
        double g = 0.0;
        for (const PassSegment &t : table) g += run_sum(t, out, 0);
        *grad_sumsq = g;
    }
    return Status::Ok();
}

Status device_muon_apply(PassLauncher &launcher, const Segment *segs, size_t num_segs,
                         const std::vector<int64_t> *const *shapes, const float *const *pieces) {
    std::vector<PassSegment> table;
    uint64_t runs = 0, items = 0;
    for (size_t s = 0; s < num_segs; ++s) {
        PassSegment t = table_segment(segs[s], nullptr, &runs, &items);
        t.pieces = const_cast<float *>(pieces[s]);  // read only by the apply
        if (segs[s].n > 0) {  // muon.cc's muon_apply
            const Hyper &h = *segs[s].hyper;
            t.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
            t.factor = static_cast<float>(-muon_adjusted_lr(h, (*shapes[s])[0], (*shapes[s])[1]));
        }
        table.push_back(t);
    }
    std::vector<double> out;
    return launcher.launch(PassKernel::kMuonApply, table, {}, &out);
}

std::unique_ptr<PassLauncher> make_host_pass_launcher() { return std::unique_ptr<PassLauncher>(new HostLauncher()); }

Status start_device_passes(Kind kind, const PassInput &in, std::unique_ptr<PassLauncher> launcher,
                           std::unique_ptr<ParamPassRun> *out) {
    SX_TRY(check_gradients(in.segs, in.num_segs));
    if (kind == Kind::kLamb) {
        *out = std::make_unique<LambDeviceRun>(in, std::move(launcher));
    } else if (kind == Kind::kAdafactor) {
        *out = std::make_unique<AdafactorDeviceRun>(in, std::move(launcher));
    } else {
        return SX_ERROR(SX_ERR_UNSUPPORTED, "%s has no device passes", optimizer_name(static_cast<int32_t>(kind)).c_str());
    }
    return Status::Ok();
}

}  // namespace optim
}  // namespace sx
