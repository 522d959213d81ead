// The step's updates of the params whose optimizer looks at whole params, outside
// ShardGroup: through sums over every element of a param (optim::Needs::kParamReduction,
// param_reductions.cc) and through a param's whole matrix on one rank
// (optim::Needs::kWholeParam, whole_params.cc). Each asks the optimizer's row how
// (optim/param_passes.h), never which optimizer it is; what they need of the shard group
// comes in a StepPasses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "base/status.h"
#include "base/trace.h"
#include "comm/communicator.h"
#include "core/layout.h"
#include "core/param_table.h"
#include "core/units.h"
#include "optim/optimizer.h"
#include "optim/thread_pool.h"

namespace sx {
namespace core {

// What the passes of one step see of the shard group (Stepper::step_passes).
struct StepPasses {
    const Units *units = nullptr;
    const std::vector<float *> *reduced = nullptr;  // each unit's reduced gradient shard
    ParamTable *table = nullptr;  // the params (whose whole tensors the passes write) and groups
    const Layout *layout = nullptr;
    comm::Communicator *shard = nullptr;  // the shard group's; used only when it has several ranks
    int shard_size = 1, shard_rank = 0;
    optim::ThreadPool *pool = nullptr;
    trace::Tracer *tracer = nullptr;
    std::function<Status(Status)> fail;  // the group's: a failed collective fails the group
};

// Collective on the shard group when any trainable unit holds a param whose optimizer
// needs per-param sums (every rank knows: the mask and the param groups agree), else
// nothing. *sumsq (if not null): the sum of squares of their segments' scaled gradients.
Status update_param_reductions(const StepPasses &c, float grad_scale, double *sumsq);

// Likewise for the params whose optimizer needs a param's whole matrix on one rank.
Status update_whole_params(const StepPasses &c, float grad_scale, double *sumsq);

// This rank's segments of one optimizer, together in segs: [begin, end).
struct OptimizerSegments {
    const optim::OptimizerSpec *row;
    size_t begin, end;
};
// segs reordered so that each optimizer's are together, optimizers in the table's order
// (each one's in the order they came), and where each one's lie.
std::vector<OptimizerSegments> by_optimizer(std::vector<optim::Segment> *segs);

// The row of param p's optimizer.
inline const optim::OptimizerSpec &row_of(const ParamTable &t, int32_t p) {
    return optim::spec_of(t.groups()[static_cast<size_t>(t.params()[static_cast<size_t>(p)].group)].hyper.kind);
}

}  // namespace core
}  // namespace sx
