// The step's update of the params whose optimizer looks at the whole param through sums
// over its elements (optim::Needs::kParamReduction): LAMB's norms (lamb.h) and
// Adafactor's norms and row and column means (adafactor.h). A first pass over this rank's
// pieces, one exchange of every such param's partial sums within the shard group, a
// second pass; Adafactor then exchanges its updates' sums of squares and makes a third.
// Each exchange is one all-gather for all params of the step; each rank adds the ranks'
// sums in rank order, so that every rank has the same sums, bit for bit.
#include <algorithm>
#include <deque>
#include <vector>

#include "core/group.h"
#include "optim/adafactor.h"
#include "optim/lamb.h"

namespace sx {
namespace core {
namespace {

// Which sums a param's optimizer exchanges (its row's optim::ParamSums).
optim::ParamSums sums_of(const optim::Hyper &h) { return optim::spec_of(h.kind).param_sums; }

// The segments whose optimizer exchanges sums of kind `sums`.
std::vector<optim::Segment> of_sums(const std::vector<optim::Segment> &segs, optim::ParamSums sums) {
    std::vector<optim::Segment> out;
    for (const optim::Segment &s : segs)
        if (sums_of(*s.hyper) == sums) out.push_back(s);
    return out;
}

}  // namespace

// Every shard-group rank's `width` doubles at `all` (this rank's in its place), added in
// rank order into whole. Collective on the shard group when it has several ranks.
Status ShardGroup::sum_blocks(std::vector<double> &all, size_t width, const char *what, std::vector<double> *whole) {
    const size_t ranks = static_cast<size_t>(mesh_.shard_size());
    if (ranks > 1 && width > 0) {
        SX_TRACE_SPAN(tracer(), "step", what, trace::kNoUnit, all.size() * sizeof(double));
        Status st = mesh_.shard().all_gather(all.data(), width * sizeof(double));
        if (!st.ok()) return fail(st);
    }
    whole->assign(width, 0.0);
    for (size_t r = 0; r < ranks; ++r)
        for (size_t j = 0; j < width; ++j) (*whole)[j] += all[r * width + j];
    return Status::Ok();
}

namespace {

// The params the exchanges cover, in index order (the same list on every rank), and each
// one's block in the first exchange: LAMB's two sums (the param's squares, its
// direction's), Adafactor's optim::AdafactorShape::first_width.
struct Covered {
    std::vector<int32_t> params;
    std::vector<size_t> offset;  // params.size() + 1: block k is [offset[k], offset[k + 1])
    std::vector<optim::AdafactorShape> shapes;  // Adafactor's (LAMB's left default)

    Covered(std::vector<int32_t> covered, const std::deque<ParamSpec> &specs, const std::vector<ParamGroup> &groups)
        : params(std::move(covered)), offset(params.size() + 1, 0), shapes(params.size()) {
        for (size_t k = 0; k < params.size(); ++k) {
            const ParamSpec &spec = specs[static_cast<size_t>(params[k])];
            const bool lamb = sums_of(groups[static_cast<size_t>(spec.group)].hyper) == optim::ParamSums::kNorms;
            if (!lamb) shapes[k] = optim::adafactor_shape(spec.shape);
            offset[k + 1] = offset[k] + (lamb ? 2 : shapes[k].first_width());
        }
    }
    size_t width() const { return offset.back(); }
    size_t place(int32_t p) const {
        return static_cast<size_t>(std::lower_bound(params.begin(), params.end(), p) - params.begin());
    }
};

// Adafactor, after the first exchange: every rank moves the factored moments of every
// covered param (it keeps them whole), pieces here or not; row_means[k] gets param k's
// per-matrix means and second[k] its place in the second exchange. Returns that
// exchange's width (the Adafactor params covered).
size_t move_moments(const Covered &c, std::deque<ParamSpec> &specs, const std::vector<ParamGroup> &groups,
                    const std::vector<double> &whole, std::vector<std::vector<float>> *row_means,
                    std::vector<size_t> *second) {
    row_means->assign(c.params.size(), {});
    second->assign(c.params.size(), 0);
    size_t width = 0;
    for (size_t k = 0; k < c.params.size(); ++k) {
        ParamSpec &spec = specs[static_cast<size_t>(c.params[k])];
        const optim::Hyper &h = groups[static_cast<size_t>(spec.group)].hyper;
        if (sums_of(h) != optim::ParamSums::kFactoredMeans) continue;
        (*second)[k] = width++;
        const optim::AdafactorShape &sh = c.shapes[k];
        if (!sh.factored) continue;
        spec.row_var.resize(sh.row_count(), 0.0f);  // zeros before the first update
        spec.col_var.resize(sh.col_count(), 0.0f);
        (*row_means)[k].resize(sh.matrices);
        optim::adafactor_update_factors(h, spec.step + 1, sh, whole.data() + c.offset[k], spec.row_var.data(),
                                        spec.col_var.data(), (*row_means)[k].data());
    }
    return width;
}

}  // namespace

// Collective on the shard group when any trainable unit holds such a param (every rank
// knows: the mask and the param groups agree), else nothing. *sumsq (if not null): the
// sum of squares of these segments' scaled gradients.
Status ShardGroup::update_param_reductions(float grad_scale, double *sumsq) {
    if (sumsq) *sumsq = 0.0;
    const Covered c(units_.params_needing(optim::Needs::kParamReduction), table_.params(), table_.groups());
    if (c.params.empty()) return Status::Ok();
    SX_CHECK(ops_->device() == SX_DEVICE_CPU, SX_ERR_INTERNAL, "an optimizer of per-param sums on a CUDA group");
    trace::Span span(tracer(), "step", "update_param_reductions");
    const size_t ranks = static_cast<size_t>(mesh_.shard_size()), me = static_cast<size_t>(mesh_.shard_rank());

    // First passes: this rank's sums, each in its param's block.
    std::vector<double> all(c.width() * ranks, 0.0);
    double *mine = all.data() + c.width() * me;
    const std::vector<optim::Segment> segs = units_.segments_needing(round_->reduced(), optim::Needs::kParamReduction);
    const std::vector<optim::Segment> lamb = of_sums(segs, optim::ParamSums::kNorms);
    const std::vector<optim::Segment> ada = of_sums(segs, optim::ParamSums::kFactoredMeans);
    double lamb_sumsq = 0.0, ada_sumsq = 0.0;
    std::vector<optim::LambSums> sums(lamb.size());
    optim::lamb_first_pass(lamb.data(), lamb.size(), grad_scale, pool_.get(), sums.data(), sumsq ? &lamb_sumsq : nullptr);
    for (size_t s = 0; s < lamb.size(); ++s) {
        double *block = mine + c.offset[c.place(lamb[s].param_index)];
        block[0] = sums[s].param;
        block[1] = sums[s].update;
    }
    std::vector<optim::AdafactorParam> params(ada.size());
    for (size_t s = 0; s < ada.size(); ++s) {
        const size_t k = c.place(ada[s].param_index);
        params[s].shape = c.shapes[k];
        params[s].sums = mine + c.offset[k];
    }
    optim::adafactor_first_pass(ada.data(), ada.size(), params.data(), grad_scale, pool_.get(),
                                sumsq ? &ada_sumsq : nullptr);
    std::vector<double> whole;
    SX_TRY(sum_blocks(all, c.width(), "param_sums_exchange", &whole));

    // LAMB is done with its second pass.
    std::vector<float> factors(lamb.size());
    for (size_t s = 0; s < lamb.size(); ++s) {
        const double *block = whole.data() + c.offset[c.place(lamb[s].param_index)];
        factors[s] = optim::lamb_factor(*lamb[s].hyper, lamb[s].step, optim::LambSums{block[0], block[1]});
    }
    optim::lamb_second_pass(lamb.data(), lamb.size(), factors.data(), pool_.get());
    span.set_bytes(optim::total_elements(segs) * sizeof(float));
    if (sumsq) *sumsq = lamb_sumsq + ada_sumsq;

    // Adafactor: its moments, the second pass, the exchange of u's sums, the third pass.
    std::vector<std::vector<float>> row_means;
    std::vector<size_t> second;
    const size_t second_width = move_moments(c, table_.params(), table_.groups(), whole, &row_means, &second);
    if (second_width == 0) return Status::Ok();
    for (size_t s = 0; s < ada.size(); ++s) {
        const size_t k = c.place(ada[s].param_index);
        const ParamSpec &spec = table_.params()[static_cast<size_t>(c.params[k])];
        params[s] = {c.shapes[k], nullptr, spec.row_var.data(), spec.col_var.data(), row_means[k].data()};
    }
    std::vector<double> update_sumsq(ada.size(), 0.0), all2(second_width * ranks, 0.0), whole2;
    optim::adafactor_second_pass(ada.data(), ada.size(), params.data(), grad_scale, pool_.get(), update_sumsq.data());
    for (size_t s = 0; s < ada.size(); ++s) all2[second_width * me + second[c.place(ada[s].param_index)]] = update_sumsq[s];
    SX_TRY(sum_blocks(all2, second_width, "update_sums_exchange", &whole2));
    std::vector<float> ada_factors(ada.size());
    for (size_t s = 0; s < ada.size(); ++s) {
        const size_t k = c.place(ada[s].param_index);
        ada_factors[s] = optim::adafactor_factor(*ada[s].hyper, ada[s].step, c.shapes[k].numel, whole[c.offset[k]],
                                                 whole2[second[k]]);
    }
    optim::adafactor_third_pass(ada.data(), ada.size(), params.data(), ada_factors.data(), grad_scale, pool_.get());
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
