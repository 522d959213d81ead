// What the step's passes over whole params see of the shard group (step_passes.h).
#include "core/step_passes.h"

#include <algorithm>

#include "core/stepper.h"

namespace sx {
namespace core {

StepPasses Stepper::step_passes() {
    StepPasses c;
    c.units = &units_;
    c.reduced = &round_->reduced();
    c.table = &table_;
    c.layout = &layout_;
    c.shard = &mesh_.shard();
    c.shard_size = mesh_.shard_size();
    c.shard_rank = mesh_.shard_rank();
    c.pool = pool_.get();
    c.tracer = tracer();
    c.fail = [this](Status s) { return fail(std::move(s)); };  // PartRefs::fail: the group's
    return c;
}

std::vector<OptimizerSegments> by_optimizer(std::vector<optim::Segment> *segs) {
    // SX_OPTIM_* order is the table's.
    const auto kind = [](const optim::Segment &s) { return static_cast<int32_t>(s.hyper->kind); };
    std::stable_sort(segs->begin(), segs->end(),
                     [&](const optim::Segment &a, const optim::Segment &b) { return kind(a) < kind(b); });
    std::vector<OptimizerSegments> out;
    for (size_t s = 0; s < segs->size(); ++s) {
        if (out.empty() || kind((*segs)[out.back().begin]) != kind((*segs)[s]))
            out.push_back({&optim::spec_of((*segs)[s].hyper->kind), s, s});
        out.back().end = s + 1;
    }
    return out;
}

}  // namespace core
}  // namespace sx
