// The optimizer state of whole params: gathered onto one rank (sx_gather_optim_state, as
// ZeroRedundancyOptimizer.consolidate_state_dict does), scattered from one rank into every
// rank's shard (sx_scatter_optim_state, its load_state_dict), and this rank's own shard
// of it in place (sx_state_view).
//
// Param by param, in index order: the root holds one param's whole state at a time (one
// buffer sized for the largest param, allocated before the first exchange) besides its
// own shard, whatever the model's size. Each param's pieces travel point to point
// between their owner and the root (gather_pieces, scatter_pieces), straight from and
// into the owners' shards. A scatter writes into copies of every rank's shard, which
// replace the shard only when every rank has its pieces and the root's callback
// succeeded for every param: a failure anywhere changes nothing.
#include <algorithm>
#include <array>
#include <cstring>

#include "base/vector_state.h"
#include "core/group.h"

namespace sx {
namespace core {
namespace {

constexpr const char *kMaster = "master";
constexpr size_t kMessageBytes = 1024;

}  // namespace

std::vector<ShardGroup::StateTensor> ShardGroup::state_tensors(int32_t p, bool as_if_allocated) const {
    std::vector<StateTensor> t;
    const ParamSpec &spec = params_[p];
    const Unit &unit = units_[layout_.placement(p).unit_index];
    const optim::Hyper &h = groups_[spec.group].hyper;
    const int slots = optim::state_slots(h);
    // A unit's state exists once it has been trainable; it has the most slots any of its
    // params' optimizers keeps.
    if (as_if_allocated || (unit.state_slots > 0 && unit.state_slots >= slots))
        for (int k = 0; k < slots; ++k) t.push_back({optim::state_slot_name(h, k), k});
    if (!unit.master.empty()) t.push_back({kMaster, -1});
    return t;
}

Status ShardGroup::state_view(int32_t param, const char *tensor, void **data, uint64_t *numel) const {
    SX_TRY(check_laid_out(param));
    SX_CHECK_ARG(tensor != nullptr, "tensor is NULL");
    const ParamSpec &spec = params_[param];
    const size_t u = static_cast<size_t>(layout_.placement(param).unit_index);
    const Unit &unit = units_[u];
    const std::vector<StateTensor> all = state_tensors(param, true);
    auto it = std::find_if(all.begin(), all.end(), [&](const StateTensor &t) { return std::strcmp(t.name, tensor) == 0; });
    if (it == all.end()) {
        std::string names;
        for (const StateTensor &t : all) names += std::string(names.empty() ? "" : ", ") + t.name;
        return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "param '%s' has no tensor '%s'; its optimizer state holds: %s",
                        spec.name.c_str(), tensor, names.empty() ? "nothing" : names.c_str());
    }
    const float *base = it->slot < 0 ? unit.master.as<float>() : nullptr;
    if (it->slot >= 0) {
        SX_CHECK(it->slot < unit.state_slots, SX_ERR_INVALID_STATE,
                 "param '%s' has no optimizer state yet: its unit gets it at sx_finalize if one of its params is "
                 "trainable then, else at the first step at which one is",
                 spec.name.c_str());
        base = unit.state[it->slot].as<float>();
    }
    const ShardPiece piece = layout_.piece(param, shard_rank_);
    *numel = piece.end - piece.begin;
    *data = *numel ? const_cast<float *>(base) + piece.shard_offset : nullptr;
    return Status::Ok();
}

float *ShardGroup::state_pointer(size_t u, int slot) const {
    return slot < 0 ? units_[u].master.as<float>() : units_[u].state[slot].as<float>();
}

Status ShardGroup::root_buffers(int root, bool as_if_allocated, Buffer *staging, std::vector<float> *host) {
    if (rank_ != root) return Status::Ok();
    uint64_t most = 0;
    for (int32_t p = 0; p < num_params(); ++p)
        most = std::max<uint64_t>(most, state_tensors(p, as_if_allocated).size() * params_[p].numel);
    if (most == 0) return Status::Ok();
    SX_TRY(ops_->allocate(most * sizeof(float), "one param's whole optimizer state", staging, true));
    if (ops_->device() != SX_DEVICE_CPU) {
        try {
            host->resize(most);
        } catch (const std::bad_alloc &) {
            return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "allocating %llu bytes of host memory for one param's whole "
                            "optimizer state failed", static_cast<unsigned long long>(most * sizeof(float)));
        }
    }
    return Status::Ok();
}

Status ShardGroup::share_outcome(int root, Status mine, const char *what) {
    // Every rank's code, the worst wins; root's words go to everyone.
    uint64_t code = static_cast<uint64_t>(mine.code());
    std::vector<char> text(kMessageBytes, 0);
    if (rank_ == root) std::snprintf(text.data(), kMessageBytes, "%s", mine.message().c_str());
    if (world_size_ > 1) {
        Status s = comm_->all_reduce_max(&code, 1);
        if (s.ok()) s = comm_->broadcast(text.data(), kMessageBytes, root);
        if (!s.ok()) return fail(s);
    }
    if (!mine.ok()) return mine;
    if (code == 0) return Status::Ok();
    if (text[0]) return SX_ERROR(static_cast<sx_status_t>(code), "%s failed on rank %d (the root): %s", what, root,
                                 text.data());
    return SX_ERROR(static_cast<sx_status_t>(code), "%s failed on another rank (%s); nothing changed", what,
                    sx_status_string(static_cast<sx_status_t>(code)));
}

Status ShardGroup::gather_state(int root, const StateFn &fn) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    SX_CHECK_ARG(root >= 0 && root < world_size_, "root rank %d is outside [0, %d)", root, world_size_);
    SX_TRY(settle());
    const std::string call = format("sx_gather_optim_state (root %d)", root);
    SX_TRY(gathers_->meet(call.c_str()));
    SX_TRY(agree(step_agreement(call.c_str(), candidate_mask(), 0.0, -1, false), 0.0, nullptr));
    Buffer staging;
    std::vector<float> host;
    Status local = ensure_masters();
    if (local.ok()) local = root_buffers(root, false, &staging, &host);
    SX_TRY(share_outcome(root, local, "sx_gather_optim_state"));

    // The root's shard group holds every shard: its ranks alone send (the other replica
    // groups have nothing to do but the outcome's exchange).
    const bool in_root_group = replica_rank_ == root / shard_size_;
    const int root_shard = root % shard_size_;
    Status outcome;  // the root's callback's, once it fails no more calls are made
    for (int32_t p = 0; p < num_params() && in_root_group; ++p) {
        const std::vector<StateTensor> tensors = state_tensors(p, false);
        const uint64_t n = params_[p].numel;
        const size_t u = static_cast<size_t>(layout_.placement(p).unit_index);
        float *full = staging.as<float>();
        std::vector<comm::Piece> mine;
        std::vector<std::vector<comm::Piece>> theirs(rank_ == root ? static_cast<size_t>(shard_size_) : 0);
        for (int q = 0; q < shard_size_ && !tensors.empty(); ++q) {
            const ShardPiece piece = layout_.piece(p, q);
            const size_t bytes = (piece.end - piece.begin) * sizeof(float);
            for (size_t t = 0; t < tensors.size(); ++t) {
                if (q == shard_rank_ && rank_ != root)
                    mine.push_back({state_pointer(u, tensors[t].slot) + piece.shard_offset, bytes});
                if (rank_ == root && q != root_shard) theirs[q].push_back({full + t * n + piece.begin, bytes});
                if (rank_ == root && q == root_shard && bytes) {
                    Status s = ops_->copy(full + t * n + piece.begin, state_pointer(u, tensors[t].slot) + piece.shard_offset,
                                          bytes);
                    if (!s.ok()) return fail(s);
                }
            }
        }
        if (shard_size_ > 1 && !tensors.empty()) {
            Status s = shard_comm_->gather_pieces(mine, theirs, root_shard);
            if (!s.ok()) return fail(s);
        }
        if (rank_ != root || !outcome.ok()) continue;
        float *data = full;
        if (!host.empty() && !tensors.empty()) {
            Status s = ops_->to_host(host.data(), full, tensors.size() * n * sizeof(float));
            if (!s.ok()) return fail(s);
            data = host.data();
        }
        ParamState st;
        st.param = p;
        st.group = params_[p].group;
        st.name = params_[p].name.c_str();
        st.numel = n;
        st.step = params_[p].step;
        st.momentum_steps = params_[p].momentum_steps;
        for (size_t t = 0; t < tensors.size(); ++t) {
            st.names.push_back(tensors[t].name);
            st.tensors.push_back(data + t * n);
        }
        leave_vector_state_clean();  // the trainer's code runs next, on this thread
        outcome = catching([&] { return fn(st); });
    }
    return share_outcome(root, outcome, "sx_gather_optim_state");
}

Status ShardGroup::scatter_state(int root, const StateFn &fn) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    SX_CHECK_ARG(root >= 0 && root < world_size_, "root rank %d is outside [0, %d)", root, world_size_);
    SX_TRY(settle());
    const std::string call = format("sx_scatter_optim_state (root %d)", root);
    SX_TRY(gathers_->meet(call.c_str()));
    SX_TRY(agree(step_agreement(call.c_str(), candidate_mask(), 0.0, -1, false), 0.0, nullptr));

    // Copies of this rank's shard to receive into: every slot any param's optimizer keeps
    // (zero where the root leaves nothing: the units' padding), and the masters.
    const size_t nu = units_.size();
    std::vector<std::array<Buffer, 3>> state(nu);
    std::vector<int> slots(nu, 0);
    std::vector<Buffer> masters(nu);
    Buffer staging;
    std::vector<float> host;
    auto allocate = [&]() -> Status {
        std::vector<uint8_t> all(params_.size(), 1);
        for (size_t u = 0; u < nu; ++u) {
            const uint64_t bytes = layout_.units()[u].shard_numel * sizeof(float);
            slots[u] = std::max(units_[u].state_slots, required_slots(u, all));
            for (int k = 0; k < slots[u]; ++k) {
                SX_TRY(ops_->allocate(bytes, "a copy of the optimizer state to scatter into", &state[u][k]));
                SX_TRY(ops_->zero(state[u][k].data(), bytes));
            }
            if (!units_[u].master.empty()) {
                SX_TRY(ops_->allocate(bytes, "a copy of the master weights to scatter into", &masters[u]));
                SX_TRY(ops_->zero(masters[u].data(), bytes));
            }
        }
        return root_buffers(root, true, &staging, &host);
    };
    SX_TRY(share_outcome(root, catching(allocate), "sx_scatter_optim_state"));

    Status outcome;  // the root's callback's, once it fails the root sends zeros
    std::vector<int64_t> steps(2 * params_.size(), 0);
    for (int32_t p = 0; p < num_params(); ++p) {
        const std::vector<StateTensor> tensors = state_tensors(p, true);
        if (tensors.empty() && rank_ != root) continue;
        const uint64_t n = params_[p].numel;
        const size_t u = static_cast<size_t>(layout_.placement(p).unit_index);
        float *full = staging.as<float>();
        if (rank_ == root) {
            // The root's callback fills the param's whole state (zero where it writes nothing).
            float *data = host.empty() ? full : host.data();
            if (!tensors.empty()) std::memset(data, 0, tensors.size() * n * sizeof(float));
            ParamState st;
            st.param = p;
            st.group = params_[p].group;
            st.name = params_[p].name.c_str();
            st.numel = n;
            for (size_t t = 0; t < tensors.size(); ++t) {
                st.names.push_back(tensors[t].name);
                st.tensors.push_back(data + t * n);
            }
            leave_vector_state_clean();  // the trainer's code runs next, on this thread
            if (outcome.ok()) outcome = catching([&] { return fn(st); });
            // The rules a checkpoint's manifest is held to, so that what is scattered in
            // can be saved and stepped on.
            if (outcome.ok() && !optim::valid_steps(st.step, st.momentum_steps))
                outcome = SX_ERROR(SX_ERR_INVALID_ARGUMENT,
                                   "param '%s': step %lld and momentum_steps %lld; they must satisfy 0 <= "
                                   "momentum_steps <= step <= %llu",
                                   st.name, static_cast<long long>(st.step), static_cast<long long>(st.momentum_steps),
                                   static_cast<unsigned long long>(optim::kMaxSteps));
            steps[2 * p] = st.step;
            steps[2 * p + 1] = st.momentum_steps;
            if (!host.empty() && !tensors.empty()) {
                Status s = ops_->from_host(full, host.data(), tensors.size() * n * sizeof(float));
                if (!s.ok()) return fail(s);
            }
        }
        if (tensors.empty()) continue;
        std::vector<float *> into;  // where each tensor's shard goes: a state slot's copy, or the masters'
        for (const StateTensor &t : tensors)
            into.push_back(t.slot < 0 ? masters[u].as<float>() : state[u][t.slot].as<float>());
        SX_TRY(scatter_param(root, p, full, into));
    }
    SX_TRY(share_outcome(root, outcome, "sx_scatter_optim_state"));
    if (world_size_ > 1) {
        Status s = comm_->broadcast(steps.data(), steps.size() * sizeof(int64_t), root);
        if (!s.ok()) return fail(s);
    }

    return install_scattered(&state, slots, &masters, steps);
}

Status ShardGroup::scatter_param(int root, int32_t p, float *full, const std::vector<float *> &into) {
    // The root's shard group takes its pieces from the root; every other replica group's
    // rank then takes its shard's from the rank of the root's group with its shard index.
    const bool in_root_group = replica_rank_ == root / shard_size_;
    const int root_shard = root % shard_size_, root_replica = root / shard_size_;
    const uint64_t n = params_[p].numel;
    std::vector<comm::Piece> mine;
    std::vector<std::vector<comm::Piece>> theirs(rank_ == root ? static_cast<size_t>(shard_size_) : 0);
    for (int q = 0; q < shard_size_; ++q) {
        const ShardPiece piece = layout_.piece(p, q);
        const size_t bytes = (piece.end - piece.begin) * sizeof(float);
        for (size_t t = 0; t < into.size(); ++t) {
            float *dst = into[t] + piece.shard_offset;
            if (q == shard_rank_) mine.push_back({dst, bytes});
            if (rank_ == root && q != root_shard) theirs[q].push_back({full + t * n + piece.begin, bytes});
            if (rank_ == root && q == root_shard && bytes) {
                Status s = ops_->copy(dst, full + t * n + piece.begin, bytes);
                if (!s.ok()) return fail(s);
            }
        }
    }
    if (shard_size_ > 1 && in_root_group) {
        const std::vector<comm::Piece> receive = rank_ == root ? std::vector<comm::Piece>() : mine;
        Status s = shard_comm_->scatter_pieces(theirs, receive, root_shard);
        if (!s.ok()) return fail(s);
    }
    for (const comm::Piece &piece : mine) {
        if (replicas_ == 1 || piece.bytes == 0) continue;
        Status s = replica_comm_->broadcast(piece.data, piece.bytes, root_replica);
        if (!s.ok()) return fail(s);
    }
    return Status::Ok();
}

Status ShardGroup::install_scattered(std::vector<std::array<Buffer, 3>> *state, const std::vector<int> &slots,
                                     std::vector<Buffer> *masters, const std::vector<int64_t> &steps) {
    // Every rank has its pieces: they replace the shard (once a checkpoint's snapshot has
    // been copied out of it).
    fence_.wait_readers();
    ShardProgress progress;
    progress.steps_taken = steps_;
    for (size_t p = 0; p < params_.size(); ++p) progress.params.push_back({steps[2 * p], steps[2 * p + 1]});
    for (const ParamGroup &g : groups_) progress.hypers.push_back(g.hyper);
    progress.scaler = scaler_.state();
    ShardRestore restore;
    restore.state = state;
    restore.slots = slots;
    restore.progress = &progress;
    SX_TRY(restore_shard(restore));
    bool sixteen = false;
    for (size_t u = 0; u < units_.size(); ++u) {
        if (units_[u].master.empty()) continue;
        std::swap(units_[u].master, (*masters)[u]);
        sixteen = true;
    }
    // 16-bit params take their values from the new masters, on every rank.
    return sixteen ? gather_params() : Status::Ok();
}

}  // namespace core
}  // namespace sx
