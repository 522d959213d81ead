// The step's update of the params whose optimizer looks at the whole param through sums
// over its elements (optim::Needs::kParamReduction: LAMB's norms): a first pass over this
// rank's pieces, one exchange of every such param's partial sums within the shard group,
// and a second pass with each param's factor.
#include <algorithm>
#include <vector>

#include "core/group.h"
#include "optim/lamb.h"

namespace sx {
namespace core {

// Collective on the shard group when any trainable unit holds such a param (every rank
// knows: the mask and the param groups agree), else nothing. *sumsq (if not null): the
// sum of squares of these segments' scaled gradients.
Status ShardGroup::update_param_reductions(float grad_scale, double *sumsq) {
    if (sumsq) *sumsq = 0.0;
    // The params the exchange covers, in index order: the same list on every rank, each
    // with two sums (the param's squares, its direction's squares).
    const std::vector<int32_t> covered = units_.params_needing(optim::Needs::kParamReduction);
    if (covered.empty()) return Status::Ok();
    SX_CHECK(ops_->device() == SX_DEVICE_CPU, SX_ERR_INTERNAL, "an optimizer of per-param sums on a CUDA group");
    trace::Span span(tracer(), "step", "update_param_reductions");

    const std::vector<optim::Segment> segs = units_.segments_needing(round_->reduced(), optim::Needs::kParamReduction);
    std::vector<optim::LambSums> sums(segs.size());
    optim::lamb_first_pass(segs.data(), segs.size(), grad_scale, pool_.get(), sums.data(), sumsq);

    // This rank's sums at each covered param's place (a param has at most one segment per
    // rank), then every shard-group rank's, added in rank order: the same sums on each.
    const size_t width = 2 * covered.size();
    const auto place = [&](int32_t p) {
        return static_cast<size_t>(std::lower_bound(covered.begin(), covered.end(), p) - covered.begin());
    };
    const size_t ranks = static_cast<size_t>(mesh_.shard_size());
    std::vector<double> all(width * ranks, 0.0);
    double *mine = all.data() + width * static_cast<size_t>(mesh_.shard_rank());
    for (size_t s = 0; s < segs.size(); ++s) {
        const size_t k = place(segs[s].param_index);
        mine[2 * k] = sums[s].param;
        mine[2 * k + 1] = sums[s].update;
    }
    if (ranks > 1) {
        SX_TRACE_SPAN(tracer(), "step", "param_sums_exchange", trace::kNoUnit, all.size() * sizeof(double));
        Status st = mesh_.shard().all_gather(all.data(), width * sizeof(double));
        if (!st.ok()) return fail(st);
    }
    std::vector<float> factors(segs.size());
    for (size_t s = 0; s < segs.size(); ++s) {
        const size_t k = place(segs[s].param_index);
        optim::LambSums whole;
        for (size_t r = 0; r < ranks; ++r) {
            whole.param += all[r * width + 2 * k];
            whole.update += all[r * width + 2 * k + 1];
        }
        factors[s] = optim::lamb_factor(*segs[s].hyper, segs[s].step, whole);
    }
    optim::lamb_second_pass(segs.data(), segs.size(), factors.data(), pool_.get());
    span.set_bytes(optim::total_elements(segs) * sizeof(float));
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
