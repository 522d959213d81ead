// Regrouping after a lost rank (sx_regroup in sx.h; docs/recovery.md): the ranks still
// alive agree, through the rendezvous store, on who forms the group of the next epoch,
// and each builds that group (a new mesh on the same store, the same params and param
// groups) beside the broken one, which the caller then drops.
//
// Who is in. Each survivor draws an arrival number from the counter
// "regroup/E/arrived" and writes its previous rank under "regroup/E/member/<n>". The
// group closes when the previous world has arrived whole (sx_abort on every rank, or
// a regroup to the same ranks) or, else, when the first survivor's join window ends:
// that survivor (the first to draw "regroup/E/closer") writes how many had arrived
// under "regroup/E/closed", and everyone reads it. A survivor that arrives after the
// group closed is told so and is not in it. New ranks follow the previous ranks'
// order, so the survivors keep their relative places.
//
// The store. Everything goes through the group's key space on the rendezvous; the new
// group's keys are under "e<E>/" inside it. The store must outlive the lost rank: the
// sx-rendezvous command (tcp://HOST:PORT?server=external), file://, or torchrun's agent
// store. With tcp:// served by rank 0, losing rank 0 loses the store, and the survivors'
// regroup fails naming it.
#include <algorithm>
#include <string>
#include <vector>

#include "base/log.h"
#include "core/group.h"

namespace sx {
namespace core {
namespace {

// The previous ranks of epoch `epoch`'s members, in order (this rank among them, or
// SX_ERR_INVALID_STATE if it came after the group closed).
Status agree_members(rdzv::Store &store, int epoch, int rank, int world, const RegroupSpec &spec,
                     Clock::time_point deadline, std::vector<int> *members) {
    const std::string base = format("regroup/%d/", epoch);
    int64_t arrival = 0;
    SX_TRY(store.add(base + "arrived", 1, &arrival));
    SX_TRY(store.set(base + "member/" + std::to_string(arrival), std::to_string(rank)));
    const int expected = spec.expected_world_size > 0 ? spec.expected_world_size : world;
    std::string closed;
    Status waited = Status::Ok();
    if (arrival < expected) {
        waited = store.get(base + "closed", &closed, std::min(spec.join_window, time_left(deadline)));
        if (!waited.ok() && waited.code() != SX_ERR_TIMEOUT) return waited;
    }
    if (arrival >= expected || !waited.ok()) {
        // Everyone expected is here, or this survivor's window ended first: close it, once.
        int64_t closer = 0;
        SX_TRY(store.add(base + "closer", 1, &closer));
        if (closer == 1) {
            int64_t count = 0;
            SX_TRY(store.add(base + "arrived", 0, &count));
            SX_TRY(store.set(base + "closed", std::to_string(count)));
        }
        SX_TRY(store.get(base + "closed", &closed, time_left(deadline)));
    }
    const int64_t count = std::stoll(closed);
    SX_CHECK(arrival <= count, SX_ERR_INVALID_STATE,
             "rank %d reached the regroup of epoch %d after the survivors had closed it with %lld of the %d ranks "
             "(they waited %lld ms from the first arrival: options->join_window_ms)",
             rank, epoch, static_cast<long long>(count), world, static_cast<long long>(spec.join_window.count()));
    members->clear();
    for (int64_t k = 1; k <= count; ++k) {
        std::string previous;
        SX_TRY(store.get(base + "member/" + std::to_string(k), &previous, time_left(deadline)));
        members->push_back(std::stoi(previous));
    }
    std::sort(members->begin(), members->end());
    return Status::Ok();
}

}  // namespace

Status ShardGroup::check_regroup(const RegroupSpec &spec) const {
    SX_CHECK(table_.finalized() && !table_.pending(), SX_ERR_INVALID_STATE,
             "sx_regroup needs a finalized group with nothing added since sx_finalize");
    SX_CHECK_ARG(spec.join_window.count() > 0, "the join window %lld ms must be > 0",
                 static_cast<long long>(spec.join_window.count()));
    SX_CHECK_ARG(spec.expected_world_size >= 0 && spec.expected_world_size <= world_size(),
                 "expected_world_size %d is not in [0, the previous world size %d]", spec.expected_world_size,
                 world_size());
    return Status::Ok();
}

Status ShardGroup::regroup(const RegroupSpec &spec, std::unique_ptr<ShardGroup> *out, RegroupInfo *info) {
    SX_TRY(check_regroup(spec));
    SX_TRACE_SPAN(tracer(), "group", "sx_regroup");
    // The broken group's collectives end now (a survivor may still be inside one), and no
    // later call of this group runs.
    abort();
    const Clock::time_point deadline = Clock::now() + Millis(config_.timeout_ms);
    const int epoch = epoch_ + 1;
    std::vector<int> members;
    Status s = agree_members(mesh_.store(), epoch, rank(), world_size(), spec, deadline, &members);
    if (!s.ok()) {
        return SX_ERROR(s.code(), "the survivors could not agree on the group of epoch %d through the rendezvous %s: "
                        "%s (the store must outlive every rank: the sx-rendezvous command, file:// or torchrun's "
                        "agent store, not rank 0's)",
                        epoch, config_.rendezvous.c_str(), s.message().c_str());
    }
    const int new_world = static_cast<int>(members.size());
    const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());

    GroupConfig c = config_;
    c.rank = new_rank;
    c.world_size = new_world;
    // A mesh keeps its shard groups' size where the survivors still fill whole shard
    // groups of it; else the new group is flat.
    const bool flat = shard_size() == world_size();
    c.shard_size = !flat && new_world % shard_size() == 0 ? shard_size() : new_world;
    const std::string trace_path = config_.trace_path.empty() ? "" : config_.trace_path + format(".epoch%d", epoch);
    std::shared_ptr<rdzv::Store> store = rdzv::make_prefix_store(mesh_.store_ptr(), format("e%d/", epoch));
    std::unique_ptr<ShardGroup> g;
    SX_TRY(assemble(c, trace_path, deadline,
                    [&](std::shared_ptr<rdzv::Store> *opened) {
                        *opened = store;
                        return Status::Ok();
                    },
                    &g));
    g->epoch_ = epoch;
    SX_TRY(g->replay_table(*this));
    log(SX_LOG_INFO, "sx: epoch %d: rank %d of %d is rank %d of %d (mesh %d x %d)", epoch, rank(), world_size(),
        new_rank, new_world, g->shard_size(), new_world / g->shard_size());
    info->epoch = epoch;
    info->rank = new_rank;
    info->world_size = new_world;
    info->shard_size = g->shard_size();
    info->previous_rank = rank();
    info->previous_world_size = world_size();
    info->members = members;
    *out = std::move(g);
    return Status::Ok();
}

// This (new) group takes `from`'s param groups, params (units, dtypes), trainable flags
// and counters, and lays them out (collective: every member does it).
Status ShardGroup::replay_table(const ShardGroup &from) {
    for (const ParamGroup &pg : from.table_.groups()) {
        int32_t index = 0;
        SX_TRY(table_.add_group(pg.hyper, &index));
    }
    for (size_t i = 0; i < from.table_.params().size(); ++i) {
        const ParamSpec &p = from.table_.params()[i];
        int32_t index = 0;
        SX_TRY(table_.add_param(p.name.c_str(), static_cast<int32_t>(p.shape.size()), p.shape.data(), p.dtype,
                                p.group, p.unit, !from.table_.trainable(static_cast<int32_t>(i)), &index));
    }
    scaler_.configure(from.scaler_.settings());
    SX_TRY(finalize());
    for (size_t i = 0; i < from.table_.params().size(); ++i) {
        const ParamSpec &p = from.table_.params()[i];
        ParamSpec &q = table_.params()[i];
        q.step = p.step;
        q.momentum_steps = p.momentum_steps;
        q.mu_product = p.mu_product;
        q.row_var = p.row_var;
        q.col_var = p.col_var;
    }
    for (size_t k = 0; k < from.table_.groups().size(); ++k) table_.groups()[k].steps = from.table_.groups()[k].steps;
    steps_ = from.steps_;
    scaler_.restore(from.scaler_.state());
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
