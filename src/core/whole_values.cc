#include "core/whole_values.h"

#include <algorithm>
#include <cstring>

#include "base/vector_state.h"

namespace sx {
namespace core {

Status WholeValues::share_outcome(int root, const Status &mine, const char *what) {
    uint64_t code = static_cast<uint64_t>(mine.code());
    std::string text = g_.rank() == root ? mine.message() : std::string();
    if (mesh_.world) {
        uint64_t length = text.size();
        Status s = mesh_.world->all_reduce_max(&code, 1);
        if (s.ok()) s = mesh_.world->broadcast(&length, sizeof length, root);
        if (s.ok()) text.resize(length);
        if (s.ok() && length) s = mesh_.world->broadcast(&text[0], length, root);
        if (!s.ok()) return g_.fail(s);
    }
    if (!mine.ok()) return mine;
    if (code == 0) return Status::Ok();
    if (!text.empty())
        return SX_ERROR(static_cast<sx_status_t>(code), "%s failed on rank %d (the root): %s", what, root,
                        text.c_str());
    return SX_ERROR(static_cast<sx_status_t>(code), "%s failed on another rank (%s); nothing changed", what,
                    sx_status_string(static_cast<sx_status_t>(code)));
}

Status WholeValues::share_plan(int root, const Status &mine, const ValuesCall &call, ValuesPlan *plan,
                               std::string *note) {
    const size_t np = static_cast<size_t>(g_.num_params());
    Status local = mine;
    if (local.ok() && g_.rank() == root) {
        local = catching([&] { return call.plan(plan); });
        leave_vector_state_clean();
        if (local.ok() && plan->selected.size() != np)
            local = SX_ERROR(SX_ERR_INTERNAL, "the plan selects from %zu params, the group has %zu",
                             plan->selected.size(), np);
    }
    // The note first: every rank has it, also where the plan refused the call.
    if (mesh_.world) {
        uint64_t length = plan->note.size();
        Status s = mesh_.world->broadcast(&length, sizeof length, root);
        if (s.ok()) plan->note.resize(length);
        if (s.ok() && length) s = mesh_.world->broadcast(&plan->note[0], length, root);
        if (!s.ok()) return g_.fail(s);
    }
    *note = plan->note;
    SX_TRY(share_outcome(root, local, "planning the call"));
    plan->selected.resize(np, 0);
    if (!mesh_.world) return Status::Ok();
    Status s = mesh_.world->broadcast(plan->selected.data(), np, root);
    return s.ok() ? s : g_.fail(s);
}

Status WholeValues::root_buffers(int root, const ValuesPlan &plan, Buffer *staging, std::vector<float> *host) {
    if (g_.rank() != root) return Status::Ok();
    uint64_t most = 0;
    for (int32_t p = 0; p < g_.num_params(); ++p)
        if (plan.selected[static_cast<size_t>(p)]) most = std::max(most, g_.param(p).numel);
    if (most == 0) return Status::Ok();
    SX_TRY(g_.state_ops().allocate(most * sizeof(float), "one param's whole values", staging, true));
    if (g_.state_ops().device() != SX_DEVICE_CPU) {
        try {
            host->resize(most);
        } catch (const std::bad_alloc &) {
            return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "allocating %llu bytes of host memory for one param's whole values "
                            "failed", static_cast<unsigned long long>(most * sizeof(float)));
        }
    }
    return Status::Ok();
}

Status WholeValues::gather(int root, const ValuesCall &call, std::string *note) {
    ShardState shard;
    ValuesPlan plan;
    Buffer staging;
    std::vector<float> host;
    // The shard as it stands, with the masters of 16-bit units derived (what is gathered).
    Status local = g_.export_shard(&shard);
    SX_TRY(share_plan(root, local, call, &plan, note));
    SX_TRY(share_outcome(root, catching([&] { return root_buffers(root, plan, &staging, &host); }), "allocating"));

    // The root's shard group holds every shard: its ranks alone send.
    const int rank = g_.rank(), S = g_.shard_size(), root_shard = root % S;
    DeviceOps &ops = g_.state_ops();
    Status outcome;  // the root's: once a callback fails no more calls are made
    for (int32_t p = 0; p < g_.num_params() && in_root_group(root); ++p) {
        if (!plan.selected[static_cast<size_t>(p)]) continue;
        const UnitShard &unit = shard.units[static_cast<size_t>(g_.layout().placement(p).unit_index)];
        const uint64_t n = g_.param(p).numel;
        float *full = staging.as<float>();
        std::vector<comm::Piece> mine;
        std::vector<std::vector<comm::Piece>> theirs(rank == root ? static_cast<size_t>(S) : 0);
        for (int q = 0; q < S; ++q) {
            const ShardPiece piece = g_.layout().piece(p, q);
            const size_t bytes = (piece.end - piece.begin) * sizeof(float);
            if (q == g_.shard_rank() && rank != root && bytes) mine.push_back({unit.values + piece.shard_offset, bytes});
            if (rank == root && q != root_shard) theirs[static_cast<size_t>(q)].push_back({full + piece.begin, bytes});
            if (rank == root && q == root_shard && bytes) {
                Status s = ops.copy(full + piece.begin, unit.values + piece.shard_offset, bytes);
                if (!s.ok()) return g_.fail(s);
            }
        }
        if (S > 1) {
            Status s = mesh_.shard->gather_pieces(mine, theirs, root_shard);
            if (!s.ok()) return g_.fail(s);
        }
        if (rank != root || !outcome.ok()) continue;
        const float *data = full;
        if (!host.empty()) {
            Status s = ops.to_host(host.data(), full, n * sizeof(float));
            if (!s.ok()) return g_.fail(s);
            data = host.data();
        }
        outcome = catching([&] { return call.take(p, data, n); });
        leave_vector_state_clean();  // the trainer's code runs next, on this thread
    }
    if (rank == root && outcome.ok() && call.finish) {
        outcome = catching([&] { return call.finish(); });
        leave_vector_state_clean();
    }
    return share_outcome(root, outcome, "the gather of the values");
}

namespace {

// Unit u's shard of the values as the scatter receives it: a copy of the values as they
// stand (what params the root does not send keep), in the values' memory.
Status copy_units(ShardAccess &g, const ShardState &shard, const ValuesPlan &plan, std::vector<Buffer> *copies) {
    copies->resize(shard.units.size());
    for (int32_t p = 0; p < g.num_params(); ++p) {
        const size_t u = static_cast<size_t>(g.layout().placement(p).unit_index);
        const UnitShard &unit = shard.units[u];
        if (!plan.selected[static_cast<size_t>(p)] || !(*copies)[u].empty() || unit.shard_numel == 0) continue;
        const size_t bytes = unit.shard_numel * sizeof(float);
        SX_CHECK(unit.values != nullptr, SX_ERR_INTERNAL, "unit %zu has no fp32 values to import into", u);
        SX_TRY(g.state_ops().allocate(bytes, "a copy of the params' values to import into", &(*copies)[u]));
        SX_TRY(g.state_ops().copy((*copies)[u].data(), unit.values, bytes));
    }
    return Status::Ok();
}

}  // namespace

Status WholeValues::scatter(int root, const ValuesCall &call, std::string *note) {
    ShardState shard;
    ValuesPlan plan;
    Buffer staging;
    std::vector<float> host;
    std::vector<Buffer> copies;
    SX_TRY(share_plan(root, g_.export_shard(&shard), call, &plan, note));
    Status local = catching([&] { return root_buffers(root, plan, &staging, &host); });
    if (local.ok()) local = catching([&] { return copy_units(g_, shard, plan, &copies); });
    SX_TRY(share_outcome(root, local, "allocating"));

    const int rank = g_.rank();
    DeviceOps &ops = g_.state_ops();
    Status outcome;  // the root's: once a callback fails it sends zeros, and nothing is placed
    for (int32_t p = 0; p < g_.num_params(); ++p) {
        if (!plan.selected[static_cast<size_t>(p)]) continue;
        const size_t u = static_cast<size_t>(g_.layout().placement(p).unit_index);
        const uint64_t n = g_.param(p).numel;
        float *full = staging.as<float>();
        if (rank == root) {
            float *data = host.empty() ? full : host.data();
            std::memset(data, 0, n * sizeof(float));
            if (outcome.ok()) outcome = catching([&] { return call.fill(p, data, n); });
            leave_vector_state_clean();
            if (!host.empty()) {
                Status s = ops.from_host(full, host.data(), n * sizeof(float));
                if (!s.ok()) return g_.fail(s);
            }
        }
        const ShardPiece own = g_.layout().piece(p, g_.shard_rank());
        float *dst = own.end > own.begin ? copies[u].as<float>() + own.shard_offset : nullptr;
        SX_TRY(WholeState(g_, mesh_).scatter_param(root, p, full, {dst}));
    }
    if (rank == root && outcome.ok() && call.finish) {
        outcome = catching([&] { return call.finish(); });
        leave_vector_state_clean();
    }
    SX_TRY(share_outcome(root, outcome, "the scatter of the values"));

    // Every rank has its pieces: they replace its values (once a checkpoint's snapshot
    // has been copied out of them), and the params take them on every rank.
    if (std::none_of(plan.selected.begin(), plan.selected.end(), [](uint8_t x) { return x != 0; }))
        return Status::Ok();
    g_.shard_fence().wait_readers();
    for (size_t u = 0; u < copies.size(); ++u) {
        if (copies[u].empty()) continue;
        Status s = ops.copy(shard.units[u].values, copies[u].data(), shard.units[u].shard_numel * sizeof(float));
        if (!s.ok()) return g_.fail(s.prefix("placing the imported values: "));
    }
    return g_.gather_params();
}

}  // namespace core
}  // namespace sx
