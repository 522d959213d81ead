// The parts of a shard group that both its step (stepper.h) and its pipeline
// (pipeline.h) work on, by reference: the group owns them, the step and the pipeline,
// and the parts outlive both. The ones held by pointer are made when the group is
// assembled. Each part that works on them derives from this privately, so that the
// references are its members, named as the group's own.
#pragma once

#include <memory>

#include "base/status.h"
#include "base/trace.h"
#include "core/agreement.h"
#include "core/device.h"
#include "core/gathers.h"
#include "core/group_config.h"
#include "core/layout.h"
#include "core/mesh.h"
#include "core/param_table.h"
#include "core/round.h"
#include "core/shard_state.h"
#include "core/units.h"
#include "optim/thread_pool.h"

namespace sx {
namespace core {

struct PartRefs {
    ShardAccess &group_;  // the group's failure, checks and trace
    const GroupConfig &config_;
    std::unique_ptr<CallHeaders> &headers_;
    Mesh &mesh_;
    std::unique_ptr<DeviceOps> &ops_;
    ParamTable &table_;
    const Layout &layout_;
    Units &units_;
    std::unique_ptr<ReductionRound> &round_;
    std::unique_ptr<Gathers> &gathers_;
    std::shared_ptr<optim::ThreadPool> &pool_;

    // The group's, through ShardAccess.
    Status fail(Status s) const { return group_.fail(s); }
    Status check_usable() const { return group_.check_usable(); }
    Status check_finalized() const { return group_.check_finalized(); }
    trace::Tracer *tracer() const { return group_.tracer(); }
};

}  // namespace core
}  // namespace sx
