// The whole params' optimizer state, as the group's calls (the part: whole_state.h), and
// this rank's own shard of it in place (sx_state_view).
#include <algorithm>
#include <cstring>

#include "core/group.h"

namespace sx {
namespace core {

// sx_gather_optim_state and sx_scatter_optim_state: checks, the call's header, then the
// whole-state part (whole_state.h).
// The checks and the header (`call`, which the ranks agree on) of a whole-param call
// with `root`; *mesh: the communicators it exchanges through.
Status ShardGroup::whole_call_header(const std::string &call, int root, WholeState::Mesh *mesh) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    SX_CHECK_ARG(root >= 0 && root < mesh_.world_size(), "root rank %d is outside [0, %d)", root, mesh_.world_size());
    SX_TRY(settle());
    SX_TRY(gathers_->meet(call.c_str()));
    const Agreement a = stepper_.step_agreement(call.c_str(), stepper_.candidate_mask(), 0.0, -1, false);
    SX_TRY(stepper_.agree(a, 0.0, nullptr));
    mesh->world = mesh_.world_size() > 1 ? &mesh_.world() : nullptr;
    mesh->shard = mesh_.shard_size() > 1 ? &mesh_.shard() : nullptr;
    mesh->replica = mesh_.replica();
    return Status::Ok();
}

Status ShardGroup::whole_state_call(const char *name, int root, bool gather, const StateFn &fn) {
    WholeState::Mesh mesh;
    SX_TRY(whole_call_header(format("%s (root %d)", name, root), root, &mesh));
    WholeState whole(*this, mesh);
    return gather ? whole.gather(root, fn) : whole.scatter(root, fn);
}

// The interop calls (sx_export_hf, sx_export_peft, sx_import_hf): checks, the call's
// header (its name, root and path must agree on every rank), then the values' part.
Status ShardGroup::values_call(const char *name, const std::string &what, int root, bool gather,
                               const ValuesCall &call, std::string *note) {
    WholeState::Mesh mesh;
    SX_TRY(whole_call_header(format("%s (root %d, %s)", name, root, what.c_str()), root, &mesh));
    WholeValues values(*this, mesh);
    return gather ? values.gather(root, call, note) : values.scatter(root, call, note);
}

Status ShardGroup::gather_state(int root, const StateFn &fn) {
    return whole_state_call("sx_gather_optim_state", root, true, fn);
}

Status ShardGroup::scatter_state(int root, const StateFn &fn) {
    return whole_state_call("sx_scatter_optim_state", root, false, fn);
}

namespace {

constexpr const char *kScaleSuffix = ".scale";

// The names sx_state_view takes for a param: its state tensors', and each 8-bit slot's
// "<slot>.scale".
std::string view_names(const std::vector<StateTensor> &all, bool eight_bit) {
    std::string names;
    for (const StateTensor &t : all) {
        names += std::string(names.empty() ? "" : ", ") + t.name;
        if (eight_bit && t.slot >= 0) names += std::string(", ") + t.name + kScaleSuffix;
    }
    return names.empty() ? "nothing" : names;
}

// SX_DTYPE_* of a slot kept in SX_STATE_* `state`.
int32_t view_dtype(int32_t state) {
    return state == SX_STATE_BF16 ? SX_DTYPE_BF16 : state == SX_STATE_8BIT ? SX_DTYPE_U8 : SX_DTYPE_F32;
}

}  // namespace

Status ShardGroup::state_view(int32_t param, const char *tensor, StateViewOut *out) {
    SX_TRY(table_.check_laid_out(param));
    SX_CHECK_ARG(tensor != nullptr, "tensor is NULL");
    const ParamSpec &spec = table_.params()[param];
    const size_t u = static_cast<size_t>(layout_.placement(param).unit_index);
    const Unit &unit = units_[u];
    const int32_t state = param_state_dtype(spec, table_.groups()[spec.group]);
    const std::vector<StateTensor> all = state_tensors(*this, unit_shard(u), param, true);
    // "<slot>.scale": an 8-bit slot's block scales.
    std::string name = tensor;
    const size_t suffix = std::strlen(kScaleSuffix);
    const bool scale = state == SX_STATE_8BIT && name.size() > suffix &&
                       name.compare(name.size() - suffix, suffix, kScaleSuffix) == 0;
    if (scale) name.resize(name.size() - suffix);
    auto it = std::find_if(all.begin(), all.end(), [&](const StateTensor &t) { return name == t.name; });
    if (it == all.end() || (scale && it->slot < 0))
        return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "param '%s' has no tensor '%s'; its optimizer state holds: %s",
                        spec.name.c_str(), tensor, view_names(all, state == SX_STATE_8BIT).c_str());
    if (it->slot < 0 && !unit.values_valid) {
        // The masters are fixed now, from the params, as the first step would: what the
        // view shows is current, and what is written into it is what the step takes.
        SX_TRY(ops_->wait_for(nullptr));
        SX_TRY(units_.ensure_master(u));
    }
    const ShardPiece piece = layout_.piece(param, mesh_.shard_rank());
    const uint64_t n = piece.end - piece.begin;
    *out = StateViewOut();
    if (it->slot < 0 && unit.stochastic_round) {
        // No fp32 masters: "master" is this rank's piece of the bf16 params themselves,
        // which the update widens and rounds back (a checkpoint's fp32 copy of them, where
        // one exists, is taken afresh at every export and is no value of the group's);
        // offloaded, their copy on the host, which the step updates.
        out->numel = n;
        out->dtype = SX_DTYPE_BF16;
        uint16_t *params = units_.rounded_params(u);
        out->data = n ? static_cast<void *>(params + piece.shard_offset) : nullptr;
        return Status::Ok();
    }
    if (it->slot < 0) {
        out->numel = n;
        out->data = n ? unit.master.as<float>() + piece.shard_offset : nullptr;
        return Status::Ok();
    }
    SX_CHECK(it->slot < unit.state_slots, SX_ERR_INVALID_STATE,
             "param '%s' has no optimizer state yet: its unit gets it at sx_finalize if one of its params is "
             "trainable then, else at the first step at which one is",
             spec.name.c_str());
    if (unit.state_pieces.empty()) {  // fp32 state, laid out as the shard
        out->numel = n;
        out->data = n ? unit.state[it->slot].as<float>() + piece.shard_offset : nullptr;
        return Status::Ok();
    }
    // Packed: the param's piece of the slot, in its own dtype (none where this rank holds none).
    out->dtype = scale ? SX_DTYPE_F32 : view_dtype(state);
    for (const StatePiece &sp : unit.state_pieces) {
        if (sp.param != param || sp.n == 0) continue;
        out->numel = scale ? sp.n / optim::kQuantBlock : sp.n;
        out->data = scale ? static_cast<void *>(unit.scales[it->slot].as<float>() + sp.scale_offset)
                          : static_cast<void *>(unit.state[it->slot].as<char>() + sp.byte_offset);
    }
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
