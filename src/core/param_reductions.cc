// The step's update of the params whose optimizer looks at the whole param through sums
// over its elements (optim::Needs::kParamReduction): LAMB's norms (lamb.h) and
// Adafactor's norms and row and column means (adafactor.h). A first pass over this rank's
// pieces, one exchange of every such param's partial sums within the shard group, a
// second pass; Adafactor then exchanges its updates' sums of squares and makes a third.
// Each exchange is one all-gather for all params of the step; each rank adds the ranks'
// sums in rank order, so that every rank has the same sums, bit for bit.
#include <algorithm>
#include <vector>

#include "core/group.h"
#include "optim/adafactor.h"
#include "optim/lamb.h"

namespace sx {
namespace core {
namespace {

// The segments of one optimizer, and where each came from in the step's list.
std::vector<optim::Segment> of_kind(const std::vector<optim::Segment> &segs, optim::Kind kind) {
    std::vector<optim::Segment> out;
    for (const optim::Segment &s : segs)
        if (s.hyper->kind == kind) out.push_back(s);
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

// Collective on the shard group when any trainable unit holds such a param (every rank
// knows: the mask and the param groups agree), else nothing. *sumsq (if not null): the
// sum of squares of these segments' scaled gradients.
Status ShardGroup::update_param_reductions(float grad_scale, double *sumsq) {
    if (sumsq) *sumsq = 0.0;
    // The params the exchanges cover, in index order: the same list on every rank.
    const std::vector<int32_t> covered = units_.params_needing(optim::Needs::kParamReduction);
    if (covered.empty()) return Status::Ok();
    SX_CHECK(ops_->device() == SX_DEVICE_CPU, SX_ERR_INTERNAL, "an optimizer of per-param sums on a CUDA group");
    trace::Span span(tracer(), "step", "update_param_reductions");

    // Each covered param's block in the first exchange: LAMB's two sums (the param's
    // squares, its direction's), Adafactor's optim::AdafactorShape::first_width.
    std::vector<size_t> offset(covered.size() + 1, 0);
    std::vector<optim::AdafactorShape> shapes(covered.size());
    for (size_t k = 0; k < covered.size(); ++k) {
        const ParamSpec &spec = table_.params()[covered[k]];
        const bool lamb = table_.groups()[spec.group].hyper.kind == optim::Kind::kLamb;
        if (!lamb) shapes[k] = optim::adafactor_shape(spec.shape);
        offset[k + 1] = offset[k] + (lamb ? 2 : shapes[k].first_width());
    }
    const auto place = [&](int32_t p) {
        return static_cast<size_t>(std::lower_bound(covered.begin(), covered.end(), p) - covered.begin());
    };
    const size_t width = offset.back(), ranks = static_cast<size_t>(mesh_.shard_size());
    std::vector<double> all(width * ranks, 0.0);
    double *mine = all.data() + width * static_cast<size_t>(mesh_.shard_rank());

    const std::vector<optim::Segment> segs = units_.segments_needing(round_->reduced(), optim::Needs::kParamReduction);
    const std::vector<optim::Segment> lamb = of_kind(segs, optim::Kind::kLamb);
    const std::vector<optim::Segment> ada = of_kind(segs, optim::Kind::kAdafactor);
    double lamb_sumsq = 0.0, ada_sumsq = 0.0;
    std::vector<optim::LambSums> sums(lamb.size());
    optim::lamb_first_pass(lamb.data(), lamb.size(), grad_scale, pool_.get(), sums.data(), sumsq ? &lamb_sumsq : nullptr);
    for (size_t s = 0; s < lamb.size(); ++s) {
        double *block = mine + offset[place(lamb[s].param_index)];
        block[0] = sums[s].param;
        block[1] = sums[s].update;
    }
    std::vector<optim::AdafactorParam> params(ada.size());
    for (size_t s = 0; s < ada.size(); ++s) {
        const size_t k = place(ada[s].param_index);
        params[s].shape = shapes[k];
        params[s].sums = mine + offset[k];
    }
    optim::adafactor_first_pass(ada.data(), ada.size(), params.data(), grad_scale, pool_.get(),
                                sumsq ? &ada_sumsq : nullptr);
    std::vector<double> whole;
    SX_TRY(sum_blocks(all, width, "param_sums_exchange", &whole));

    std::vector<float> factors(lamb.size());
    for (size_t s = 0; s < lamb.size(); ++s) {
        const double *block = whole.data() + offset[place(lamb[s].param_index)];
        factors[s] = optim::lamb_factor(*lamb[s].hyper, lamb[s].step, optim::LambSums{block[0], block[1]});
    }
    optim::lamb_second_pass(lamb.data(), lamb.size(), factors.data(), pool_.get());

    // Adafactor: every rank moves every covered factored param's moments (it keeps them
    // whole), pieces here or not; then u's sums of squares are exchanged.
    std::vector<std::vector<float>> row_means(covered.size());
    std::vector<size_t> second(covered.size(), 0);  // place in the second exchange
    size_t second_width = 0;
    for (size_t k = 0; k < covered.size(); ++k) {
        ParamSpec &spec = table_.params()[covered[k]];
        const optim::Hyper &h = table_.groups()[spec.group].hyper;
        if (h.kind != optim::Kind::kAdafactor) continue;
        second[k] = second_width++;
        if (!shapes[k].factored) continue;
        spec.row_var.resize(shapes[k].row_count(), 0.0f);  // zeros before the first update
        spec.col_var.resize(shapes[k].col_count(), 0.0f);
        row_means[k].resize(shapes[k].matrices);
        optim::adafactor_update_factors(h, spec.step + 1, shapes[k], whole.data() + offset[k], spec.row_var.data(),
                                        spec.col_var.data(), row_means[k].data());
    }
    if (second_width == 0) {
        span.set_bytes(optim::total_elements(segs) * sizeof(float));
        if (sumsq) *sumsq = lamb_sumsq;
        return Status::Ok();
    }
    for (size_t s = 0; s < ada.size(); ++s) {
        const size_t k = place(ada[s].param_index);
        const ParamSpec &spec = table_.params()[covered[k]];
        params[s].sums = nullptr;
        params[s].row_var = spec.row_var.data();
        params[s].col_var = spec.col_var.data();
        params[s].row_means = row_means[k].data();
    }
    std::vector<double> update_sumsq(ada.size(), 0.0);
    optim::adafactor_second_pass(ada.data(), ada.size(), params.data(), grad_scale, pool_.get(), update_sumsq.data());
    std::vector<double> all2(second_width * ranks, 0.0), whole2;
    for (size_t s = 0; s < ada.size(); ++s)
        all2[second_width * static_cast<size_t>(mesh_.shard_rank()) + second[place(ada[s].param_index)]] =
            update_sumsq[s];
    SX_TRY(sum_blocks(all2, second_width, "update_sums_exchange", &whole2));
    std::vector<float> ada_factors(ada.size());
    for (size_t s = 0; s < ada.size(); ++s) {
        const size_t k = place(ada[s].param_index);
        ada_factors[s] = optim::adafactor_factor(*ada[s].hyper, ada[s].step, shapes[k].numel, whole[offset[k]],
                                                 whole2[second[k]]);
    }
    optim::adafactor_third_pass(ada.data(), ada.size(), params.data(), ada_factors.data(), grad_scale, pool_.get());
    span.set_bytes(optim::total_elements(segs) * sizeof(float));
    if (sumsq) *sumsq = lamb_sumsq + ada_sumsq;
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
