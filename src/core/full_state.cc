// The whole params' optimizer state, as the group's calls (the part: whole_state.h), and
// this rank's own shard of it in place (sx_state_view).
#include <algorithm>
#include <cstring>

#include "core/group.h"

namespace sx {
namespace core {

// sx_gather_optim_state and sx_scatter_optim_state: checks, the call's header, then the
// whole-state part (whole_state.h).
Status ShardGroup::whole_state_call(const char *name, int root, bool gather, const StateFn &fn) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    SX_TRY(check_fp32_state(name));
    SX_CHECK_ARG(root >= 0 && root < mesh_.world_size(), "root rank %d is outside [0, %d)", root, mesh_.world_size());
    SX_TRY(settle());
    const std::string call = format("%s (root %d)", name, root);
    SX_TRY(gathers_->meet(call.c_str()));
    const Agreement a = stepper_.step_agreement(call.c_str(), stepper_.candidate_mask(), 0.0, -1, false);
    SX_TRY(stepper_.agree(a, 0.0, nullptr));
    WholeState::Mesh mesh;
    mesh.world = mesh_.world_size() > 1 ? &mesh_.world() : nullptr;
    mesh.shard = mesh_.shard_size() > 1 ? &mesh_.shard() : nullptr;
    mesh.replica = mesh_.replica();
    WholeState whole(*this, mesh);
    return gather ? whole.gather(root, fn) : whole.scatter(root, fn);
}

Status ShardGroup::gather_state(int root, const StateFn &fn) {
    return whole_state_call("sx_gather_optim_state", root, true, fn);
}

Status ShardGroup::scatter_state(int root, const StateFn &fn) {
    return whole_state_call("sx_scatter_optim_state", root, false, fn);
}

Status ShardGroup::state_view(int32_t param, const char *tensor, void **data, uint64_t *numel) {
    SX_TRY(table_.check_laid_out(param));
    SX_CHECK_ARG(tensor != nullptr, "tensor is NULL");
    SX_TRY(check_fp32_state("sx_state_view"));
    const ParamSpec &spec = table_.params()[param];
    const size_t u = static_cast<size_t>(layout_.placement(param).unit_index);
    const Unit &unit = units_[u];
    const std::vector<StateTensor> all = state_tensors(*this, unit_shard(u), param, true);
    auto it = std::find_if(all.begin(), all.end(), [&](const StateTensor &t) { return std::strcmp(t.name, tensor) == 0; });
    if (it == all.end()) {
        std::string names;
        for (const StateTensor &t : all) names += std::string(names.empty() ? "" : ", ") + t.name;
        return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "param '%s' has no tensor '%s'; its optimizer state holds: %s",
                        spec.name.c_str(), tensor, names.empty() ? "nothing" : names.c_str());
    }
    if (it->slot < 0 && !unit.master_valid) {
        // The masters are fixed now, from the params, as the first step would: what the
        // view shows is current, and what is written into it is what the step takes.
        SX_TRY(ops_->wait_for(nullptr));
        SX_TRY(units_.ensure_master(u));
    }
    const float *base = it->slot < 0 ? unit.master.as<float>() : nullptr;
    if (it->slot >= 0) {
        SX_CHECK(it->slot < unit.state_slots, SX_ERR_INVALID_STATE,
                 "param '%s' has no optimizer state yet: its unit gets it at sx_finalize if one of its params is "
                 "trainable then, else at the first step at which one is",
                 spec.name.c_str());
        base = unit.state[it->slot].as<float>();
    }
    const ShardPiece piece = layout_.piece(param, mesh_.shard_rank());
    *numel = piece.end - piece.begin;
    *data = *numel ? const_cast<float *>(base) + piece.shard_offset : nullptr;
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
