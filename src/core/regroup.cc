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
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "base/log.h"
#include "core/group.h"

namespace sx {
namespace core {
namespace {

// The previous ranks of epoch `epoch`'s members, in order (this rank among them, or
// SX_ERR_INVALID_STATE if it came after the group closed), and the memory copies each
// holds (`mine`: this rank's, published before it arrives).
Status agree_members(rdzv::Store &store, int epoch, int rank, int world, const RegroupSpec &spec,
                     const std::vector<CopyHolding> &mine, Clock::time_point deadline, std::vector<int> *members,
                     std::vector<std::vector<CopyHolding>> *holdings) {
    const std::string base = format("regroup/%d/", epoch);
    SX_TRY(store.set(base + "copies/" + std::to_string(rank), describe_holdings(mine)));
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
    holdings->assign(members->size(), {});
    for (size_t m = 0; m < members->size(); ++m) {
        std::string text;
        SX_TRY(store.get(base + "copies/" + std::to_string((*members)[m]), &text, time_left(deadline)));
        SX_TRY(parse_holdings(text, &(*holdings)[m]));
    }
    return Status::Ok();
}

// Calls fn(u, k, from, to, n) for every run of n elements that shard `from_shard` of
// `from` and shard `to_shard` of `to` have in common: state tensor k (0: the values,
// then each slot of slots[u]) of unit u, at element `from` of the one's unit shard
// (tensors one after another) and `to` of the other's. The same order on every rank.
template <typename Fn>
void for_each_overlap(const Layout &from, int from_shard, const Layout &to, int to_shard, const std::vector<int> &slots,
                      Fn fn) {
    for (size_t u = 0; u < to.units().size(); ++u) {
        const uint64_t n_from = from.units()[u].shard_numel, n_to = to.units()[u].shard_numel;
        for (int32_t p : to.units()[u].params) {
            const ShardPiece a = from.piece(p, from_shard), b = to.piece(p, to_shard);
            const uint64_t lo = std::max(a.begin, b.begin), hi = std::min(a.end, b.end);
            if (lo >= hi) continue;
            for (int k = 0; k <= slots[u]; ++k)
                fn(u, k, n_from * k + a.shard_offset + (lo - a.begin), n_to * k + b.shard_offset + (lo - b.begin),
                   hi - lo);
        }
    }
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
    std::vector<std::vector<CopyHolding>> holdings;
    std::vector<CopyHolding> mine;
    if (copies_) {
        copies_->finish(spec.join_window);  // a copy still being sent may complete
        mine = copies_->holdings();
    }
    Status s = agree_members(mesh_.store(), epoch, rank(), world_size(), spec, mine, deadline, &members, &holdings);
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
    // The state from the memory copies where every shard of one boundary is still held.
    if (copies_) {
        const CopyChoice choice = choose_copies(holdings, shard_size());
        if (choice.found) {
            SX_TRY(g->restore_copies(*this, choice));
            info->from_memory = true;
        } else {
            info->why_not_memory = choice.why_not;
            log(SX_LOG_WARN, "sx: epoch %d: rank %d: the memory copies cannot restore the state: %s", epoch,
                new_rank, choice.why_not.c_str());
        }
    }
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

namespace sx {
namespace core {

// Copies out of the live shard at a step boundary (memory_copies.h), holding the fence
// until they are out, so that the next update waits for them.
Status ShardGroup::keep_copy() {
    SX_TRACE_SPAN(tracer(), "step", "memory_copy");
    SX_TRY(ops_->wait_for(nullptr));
    {
        Status s = units_.ensure_masters();
        if (!s.ok()) return fail(s);
    }
    std::vector<UnitShard> shards;
    for (size_t u = 0; u < units_.size(); ++u) shards.push_back(unit_shard(u));
    std::unique_ptr<ShardFence::Hold> hold(new ShardFence::Hold(fence_));
    copies_->take(std::move(shards), progress(), std::move(hold));
    return Status::Ok();
}

// This (new) group's state from `from`'s memory copies, as `choice` says (collective):
// for each shard index of `from`'s layout, the member holding it sends every member the
// pieces of it that member owns now; the progress is each member's own copy's. Then the
// params are gathered, as after a load.
Status ShardGroup::restore_copies(const ShardGroup &from, const CopyChoice &choice) {
    SX_TRACE_SPAN(tracer(), "group", "restore_memory_copies");
    const ShardCopy *own = from.copies_->find(choice.seq, true);
    SX_CHECK(own != nullptr && own->units.size() == units_.size(), SX_ERR_INTERNAL,
             "rank %d holds no copy %llu of its own shard for %zu units", rank(),
             static_cast<unsigned long long>(choice.seq), units_.size());
    const int W = world_size(), S = shard_size(), me = rank();
    const Layout &old = from.layout_;
    // Where each unit's tensors go: the values (fp32 masters of 16-bit units) in place,
    // each state slot into a new buffer that a restore then swaps in with the progress.
    // Host memory is written directly; a device's through host staging.
    const bool host = ops_->device() == SX_DEVICE_CPU;
    Status s = units_.ensure_masters();  // valid from here: the values below replace them
    std::vector<std::array<Buffer, 3>> state(units_.size());
    std::vector<std::vector<float>> staging(units_.size());
    std::vector<std::array<float *, 4>> into(units_.size());
    for (size_t u = 0; u < units_.size() && s.ok(); ++u) {
        const uint64_t n = layout_.units()[u].shard_numel;
        if (!host) staging[u].assign(static_cast<size_t>((1 + own->slots[u]) * n), 0.0f);
        into[u][0] = host ? unit_shard(u).values : staging[u].data();
        if (n == 0) continue;  // no piece lies in it
        for (int k = 0; k < own->slots[u] && s.ok(); ++k) {
            s = ops_->allocate(n * sizeof(float), "optimizer state restored from memory copies", &state[u][k]);
            into[u][k + 1] = host ? state[u][k].as<float>() : staging[u].data() + (k + 1) * n;
        }
    }
    if (!s.ok()) return fail(s);
    for (int i = 0; i < static_cast<int>(choice.provider.size()); ++i) {
        const int root = choice.provider[i];  // a member's index is its new rank
        const ShardCopy *src = me == root ? from.copies_->find(choice.seq, choice.provider_own[i]) : nullptr;
        SX_CHECK(me != root || (src != nullptr && src->shard == i), SX_ERR_INTERNAL,
                 "rank %d was chosen to send shard %d of copy %llu, which it does not hold", me, i,
                 static_cast<unsigned long long>(choice.seq));
        std::vector<comm::Piece> mine;
        std::vector<std::vector<comm::Piece>> theirs(me == root ? static_cast<size_t>(W) : 0);
        for (int r = 0; r < W; ++r) {
            if (r != me && me != root) continue;
            const std::vector<UnitLayout> &to_units = layout_.units();
            for_each_overlap(old, i, layout_, r % S, own->slots,
                             [&](size_t u, int k, uint64_t at_from, uint64_t at_to, uint64_t n) {
                                 const uint64_t n_to = to_units[u].shard_numel;
                                 float *to = into[u][k] + (at_to - static_cast<uint64_t>(k) * n_to);
                                 const float *there = src ? src->units[u].data() + at_from : nullptr;
                                 if (r == me && me == root)
                                     std::memcpy(to, there, n * sizeof(float));
                                 else if (r == me)
                                     mine.push_back({to, n * sizeof(float)});
                                 else
                                     theirs[r].push_back({const_cast<float *>(there), n * sizeof(float)});
                             });
        }
        if (W > 1) SX_TRY(collective([&](comm::Communicator &c) { return c.scatter_pieces(theirs, mine, root); }));
    }
    for (size_t u = 0; u < units_.size() && s.ok() && !host; ++u) {
        const uint64_t n = layout_.units()[u].shard_numel;
        s = ops_->from_host(unit_shard(u).values, staging[u].data(), n * sizeof(float));
        for (int k = 0; k < own->slots[u] && s.ok(); ++k)
            s = ops_->from_host(state[u][k].data(), staging[u].data() + (k + 1) * n, n * sizeof(float));
    }
    if (!s.ok()) return fail(s);
    ShardRestore r;
    r.state = &state;
    r.slots = own->slots;
    r.progress = &own->progress;
    SX_TRY(restore_shard(r));
    return gather_params();
}

}  // namespace core
}  // namespace sx
