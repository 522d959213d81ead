// The state side of regrouping (regroup.cc has who is in): the memory copies a group
// keeps of the groups before it (memory_copies.h, "Lineages"), the copy a sound group
// takes as a regroup begins, a new group's table and counters from the group it came
// from, the restore of its shards from the copies the survivors chose, and which ranks
// are known to be lost.
#include <algorithm>
#include <array>
#include <cstring>

#include "base/log.h"
#include "optim/state_codec.h"
#include "recovery/recovery.h"
#include "recovery/restore.h"

namespace sx {
namespace recovery {

using namespace core;

namespace {

// How unit u keeps shard `shard` of `layout`: its state pieces (packed units) and where
// a copy of it holds each tensor.
struct ShardGeometry {
    std::vector<StatePiece> pieces;
    uint64_t slot_bytes = 0, slot_scales = 0;
    // Bytes of one value: the bf16 params of a bf16_stochastic_round unit (a unit's
    // params all take it or none does), else fp32 values.
    uint64_t value_size = sizeof(float);
    ShardGeometry(const RecoveryAccess &g, const Layout &layout, int shard, size_t u) {
        pieces = state_pieces_of(layout, shard, u, g.table().params(), g.table().groups(), &slot_bytes, &slot_scales);
        const std::vector<int32_t> &params = layout.units()[u].params;
        if (!params.empty() && g.table().groups()[g.table().params()[params[0]].group].hyper.bf16_stochastic_round)
            value_size = sizeof(uint16_t);
    }
    // Where element `at` (in the param's index space) of param p's piece `sp` lies in a
    // slot's bytes, and how many bytes an element takes there.
    uint64_t slot_offset(const ShardPiece &sp, int32_t p, uint64_t at, uint64_t *elem_bytes) const {
        const StatePiece *piece = find_state_piece(pieces, p);
        *elem_bytes = piece ? optim::state_elem_bytes(piece->dtype) : sizeof(float);
        return piece ? piece->byte_offset + (at - sp.begin) * *elem_bytes : (sp.shard_offset + at - sp.begin) * sizeof(float);
    }
    // Where element `at`'s block scale lies in a slot's scales (8-bit pieces; else none).
    bool scale_offset(const ShardPiece &sp, int32_t p, uint64_t at, uint64_t *offset) const {
        const StatePiece *piece = find_state_piece(pieces, p);
        if (!piece || piece->dtype != SX_STATE_8BIT) return false;
        *offset = (piece->scale_offset + (at - sp.begin) / optim::kQuantBlock) * sizeof(float);
        return true;
    }
};

// Calls fn(u, t, from, to, bytes) for every run that shard `from_shard` of `from` (a
// copy's layout) and shard `to_shard` of `to` have in common: tensor t of unit u (0: the
// values, 1 + k: state slot k, 1 + slots[u] + k: slot k's 8-bit block scales), at byte
// `from` of the copy's unit (CopiedUnit) and byte `to` of that tensor in the other
// shard. Blocks follow shards in both layouts, so an 8-bit run is whole blocks. The same
// order on every rank. The values are fp32, or bf16 (ShardGeometry::value_size) in both.
template <typename Fn>
void for_each_overlap(const RecoveryAccess &g, const Layout &from, int from_shard, const Layout &to, int to_shard,
                      const std::vector<int> &slots, Fn fn) {
    for (size_t u = 0; u < to.units().size(); ++u) {
        const ShardGeometry gf(g, from, from_shard, u), gt(g, to, to_shard, u);
        const uint64_t vs = gf.value_size;
        const CopiedUnit copied(from.units()[u].shard_numel, vs, slots[u], gf.slot_bytes, gf.slot_scales);
        for (int32_t p : to.units()[u].params) {
            const ShardPiece a = from.piece(p, from_shard), b = to.piece(p, to_shard);
            const uint64_t lo = std::max(a.begin, b.begin), hi = std::min(a.end, b.end);
            if (lo >= hi) continue;
            fn(u, 0, (a.shard_offset + lo - a.begin) * vs, (b.shard_offset + lo - b.begin) * vs, (hi - lo) * vs);
            uint64_t eb = 0, from_scale = 0, to_scale = 0;
            const uint64_t from_at = gf.slot_offset(a, p, lo, &eb), to_at = gt.slot_offset(b, p, lo, &eb);
            const bool scaled = gf.scale_offset(a, p, lo, &from_scale) && gt.scale_offset(b, p, lo, &to_scale);
            for (int k = 0; k < slots[u]; ++k) {
                fn(u, 1 + k, copied.slot_at(k) + from_at, to_at, (hi - lo) * eb);
                if (scaled)
                    fn(u, 1 + slots[u] + k, copied.scales_at(k) + from_scale, to_scale,
                       (hi - lo) / optim::kQuantBlock * sizeof(float));
            }
        }
    }
}

const ShardCopy *find_copy(const RecoveryAccess &g, int epoch, uint64_t seq, bool own) {
    const MemoryCopies *copies = g.memory_copies();
    if (copies && copies->settings().epoch == epoch) return copies->find(seq, own);
    for (const std::shared_ptr<const KeptCopies> &k : g.lineage().kept)
        if (k->epoch == epoch) return k->find(seq, own);
    return nullptr;
}

}  // namespace

std::vector<int> Recovery::lost_ranks() const {
    if (g_.lineage().joining || g_.world_size() == 1) return {};
    return g_.exited_peers();
}

bool Recovery::holds_copies() const {
    const RecoveryAccess &g = g_;
    return g.memory_copies() != nullptr || !g.lineage().kept.empty();
}

// A member whose group is sound (a regroup that admits joiners, or shrinks without a
// loss) is at a step boundary: it copies its shard as it is now, so that the new group
// starts from this step where every member is sound (no copy is sent: the members all
// hold theirs). A group without memory copies keeps this one alone.
bool Recovery::sound() const {
    // (CPU groups: the copies are exchanged through host memory.)
    return !g_.lineage().joining && g_.config().backend != SX_BACKEND_CUDA && g_.check_usable().ok() &&
           g_.between_steps() && g_.table().finalized();
}

Status Recovery::copy_if_sound() {
    if (!sound()) return Status::Ok();
    if (g_.memory_copies() == nullptr) {
        MemoryCopies::Settings cs;
        cs.interval = 1;
        cs.rank = g_.rank();
        cs.world_size = g_.world_size();
        cs.shard = g_.shard_rank();
        cs.shards = g_.shard_size();
        cs.epoch = g_.lineage().epoch;
        g_.set_memory_copies(std::unique_ptr<MemoryCopies>(new MemoryCopies(cs, g_.state_ops(), nullptr)));
    }
    SX_TRY(g_.settle());
    return g_.keep_copy(false);
}

void keep_copies_for_regroup(RecoveryAccess &g, Millis grace) {
    std::unique_ptr<MemoryCopies> copies = g.take_memory_copies();
    if (!copies) return;
    copies->finish(grace);
    std::shared_ptr<const KeptCopies> mine = copies->release();
    if (!mine->own.empty() || !mine->peer.empty()) g.lineage().kept.push_back(std::move(mine));
}

std::vector<CopyHolding> held_copies(const RecoveryAccess &g) {
    const MemoryCopies *copies = g.memory_copies();
    std::vector<CopyHolding> out = copies ? copies->holdings() : std::vector<CopyHolding>();
    for (const std::shared_ptr<const KeptCopies> &k : g.lineage().kept)
        for (bool own : {true, false})
            for (const ShardCopy &c : own ? k->own : k->peer) out.push_back({own, k->epoch, c.seq, c.shard, k->shards});
    return out;
}

namespace {

// Where each of a unit's tensors goes in the group's memory (the values, then each state
// slot, then each slot's scales: for_each_overlap's t).
using UnitTargets = std::array<uint8_t *, 7>;

// Shard i of the copy, from the member chosen to provide it, into every rank's pieces of
// it (`into`: per unit, in the group's memory).
Status scatter_shard(RecoveryAccess &g, const CopyChoice &choice, const Layout &old, int i,
                     const std::vector<int> &slots, const std::vector<UnitTargets> &into) {
    const int W = g.world_size(), S = g.shard_size(), me = g.rank();
    const int root = choice.provider[i];  // a member's index is its new rank
    const ShardCopy *src = me == root ? find_copy(g, choice.epoch, choice.seq, choice.provider_own[i]) : nullptr;
    SX_CHECK(me != root || (src != nullptr && src->shard == i), SX_ERR_INTERNAL,
             "rank %d was chosen to send shard %d of copy %llu of epoch %d, which it does not hold", me, i,
             static_cast<unsigned long long>(choice.seq), choice.epoch);
    std::vector<comm::Piece> mine;
    std::vector<std::vector<comm::Piece>> theirs(me == root ? static_cast<size_t>(W) : 0);
    // The provider's own pieces: the copy's bytes (host memory) put in place after.
    std::vector<comm::Piece> local_to, local_from;
    for (int r = 0; r < W; ++r) {
        if (r != me && me != root) continue;
        for_each_overlap(g, old, i, g.layout(), r % S, slots, [&](size_t u, int t, uint64_t at_from, uint64_t at_to, uint64_t n) {
            uint8_t *to = r == me ? into[u][t] + at_to : nullptr;
            uint8_t *there = src ? const_cast<uint8_t *>(src->units[u].data() + at_from) : nullptr;
            if (r == me && me == root) {
                local_to.push_back({to, n});
                local_from.push_back({there, n});
            } else if (r == me) {
                mine.push_back({to, n});
            } else {
                theirs[r].push_back({there, n});
            }
        });
    }
    for (size_t k = 0; k < local_to.size(); ++k) {
        // Into the group's memory, which may be a device's.
        Status s = g.state_ops().from_host(local_to[k].data, local_from[k].data, local_to[k].bytes);
        if (!s.ok()) return g.fail(s);
    }
    if (W > 1) SX_TRY(g.collective([&](comm::Communicator &c) { return c.scatter_pieces(theirs, mine, root); }));
    return Status::Ok();
}

}  // namespace

// restore.h
Status restore_copies(RecoveryAccess &g, const CopyChoice &choice) {
    SX_TRACE_SPAN(g.tracer(), "group", "restore_memory_copies");
    const int W = g.world_size(), me = g.rank();
    Layout old;
    SX_TRY(g.build_layout(choice.shards, &old));
    // The slots and progress of the copy: the first member holding its own copy sends
    // them to all (a joining rank has none).
    const int progress_root = choice.progress_from;
    std::string packed;
    if (me == progress_root) {
        const ShardCopy *own = find_copy(g, choice.epoch, choice.seq, true);
        SX_CHECK(own != nullptr && own->units.size() == g.layout().units().size(), SX_ERR_INTERNAL,
                 "rank %d holds no copy %llu of epoch %d of its own shard for %zu units", me,
                 static_cast<unsigned long long>(choice.seq), choice.epoch, g.layout().units().size());
        packed = pack_progress(own->slots, own->progress);
    }
    if (W > 1) {
        uint64_t bytes = packed.size();
        SX_TRY(g.collective([&](comm::Communicator &c) { return c.broadcast(&bytes, sizeof bytes, progress_root); }));
        packed.resize(static_cast<size_t>(bytes));
        SX_TRY(g.collective(
            [&](comm::Communicator &c) { return c.broadcast(&packed[0], packed.size(), progress_root); }));
    }
    std::vector<int> slots;
    ShardProgress progress;
    SX_TRY(unpack_progress(packed, &slots, &progress));
    SX_CHECK(slots.size() == g.layout().units().size(), SX_ERR_INTERNAL, "the copy has %zu units, the group %zu", slots.size(),
             g.layout().units().size());
    // Where each unit's tensors go (where the group keeps its state: the host's, or a
    // device's, which the group's communicators reach through staging): the values (fp32
    // masters of 16-bit units, and of every unit offloaded; the bf16 params themselves of
    // a unit without masters) in place, each state slot into a new buffer that a restore
    // then swaps in with the progress.
    Status s = g.ensure_masters();  // valid from here: the values below replace them
    const size_t units = g.layout().units().size();
    std::vector<std::array<Buffer, 3>> state(units), scales(units);
    std::vector<UnitTargets> into(units);
    for (size_t u = 0; u < units && s.ok(); ++u) {
        const UnitShard shard = g.unit_shard(u);
        into[u].fill(nullptr);
        into[u][0] = shard.bf16_params ? reinterpret_cast<uint8_t *>(shard.bf16_params)
                                       : reinterpret_cast<uint8_t *>(shard.values);
        if (shard.shard_numel == 0) continue;  // no piece lies in it
        for (int k = 0; k < slots[u] && s.ok(); ++k) {
            s = g.state_ops().allocate(shard.slot_bytes, "optimizer state restored from memory copies", &state[u][k]);
            if (s.ok() && shard.slot_scales)
                s = g.state_ops().allocate(shard.slot_scales * sizeof(float),
                                           "8-bit optimizer state's scales restored from memory copies", &scales[u][k]);
            into[u][1 + k] = state[u][k].as<uint8_t>();
            into[u][1 + slots[u] + k] = scales[u][k].empty() ? nullptr : scales[u][k].as<uint8_t>();
        }
    }
    if (!s.ok()) return g.fail(s);
    for (int i = 0; i < static_cast<int>(choice.provider.size()); ++i) SX_TRY(scatter_shard(g, choice, old, i, slots, into));
    ShardRestore r;
    r.state = &state;
    r.scales = &scales;
    r.slots = slots;
    r.progress = &progress;
    SX_TRY(g.restore_shard(r));
    return g.gather_params();
}

// restore.h
Status replay_table(RecoveryAccess &to, const RecoveryAccess &from) {
    for (const ParamGroup &pg : from.table().groups()) {
        int32_t index = 0;
        SX_TRY(to.table().add_group(pg.hyper, &index));
    }
    for (size_t i = 0; i < from.table().params().size(); ++i) {
        const ParamSpec &p = from.table().params()[i];
        int32_t index = 0;
        SX_TRY(to.table().add_param(p.name.c_str(), static_cast<int32_t>(p.shape.size()), p.shape.data(), p.dtype,
                                    p.group, p.unit, !from.table().trainable(static_cast<int32_t>(i)), &index));
    }
    SX_TRY(to.finalize());
    for (size_t i = 0; i < from.table().params().size(); ++i) {
        const ParamSpec &p = from.table().params()[i];
        ParamSpec &q = to.table().params()[i];
        q.step = p.step;
        q.momentum_steps = p.momentum_steps;
        q.mu_product = p.mu_product;
        q.row_var = p.row_var;
        q.col_var = p.col_var;
    }
    for (size_t k = 0; k < from.table().groups().size(); ++k)
        to.table().groups()[k].steps = from.table().groups()[k].steps;
    to.continue_counters(from.steps_taken(), from.loss_scaling(), from.loss_scaler());
    return Status::Ok();
}

}  // namespace recovery
}  // namespace sx
