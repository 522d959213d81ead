// The state side of regrouping (regroup.cc has who is in): the memory copies a group
// keeps and those it keeps of the groups before it (memory_copies.h, "Lineages"), the
// copy a sound group takes as a regroup begins, the restore of a new group's shards from
// the copies the survivors chose, and which ranks are known to be lost.
#include <algorithm>
#include <array>
#include <cstring>

#include "base/log.h"
#include "core/group.h"

namespace sx {
namespace core {
namespace {

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

std::vector<int> ShardGroup::lost_ranks() const {
    if (joining_ || world_size() == 1) return {};
    return mesh_.world().exited_peers();
}

// A member whose group is sound (a regroup that admits joiners, or shrinks without a
// loss) is at a step boundary: it copies its shard as it is now, so that the new group
// starts from this step where every member is sound (no copy is sent: the members all
// hold theirs). A group without memory copies keeps this one alone.
bool ShardGroup::sound() const {
    // (CPU groups: the copies are exchanged through host memory.)
    return !joining_ && config_.backend != SX_BACKEND_CUDA && check_usable().ok() && !round_->open() &&
           micro_batches_ == 0 && table_.finalized();
}

Status ShardGroup::copy_if_sound() {
    if (!sound()) return Status::Ok();
    if (!copies_) {
        MemoryCopies::Settings cs;
        cs.interval = 1;
        cs.rank = rank();
        cs.world_size = world_size();
        cs.shard = shard_rank();
        cs.shards = shard_size();
        cs.epoch = epoch_;
        copies_.reset(new MemoryCopies(cs, *ops_, nullptr));
    }
    SX_TRY(settle());
    return keep_copy(false);
}

// Copies out of the live shard at a step boundary (memory_copies.h), holding the fence
// until they are out, so that the next update waits for them. The copies of the groups
// before this one go once this group's own are held by every rank.
Status ShardGroup::keep_copy(bool send) {
    SX_TRACE_SPAN(tracer(), "step", "memory_copy");
    SX_TRY(ops_->wait_for(nullptr));
    {
        Status s = units_.ensure_masters();
        if (!s.ok()) return fail(s);
    }
    if (!kept_.empty() && copies_->settled()) kept_.clear();
    std::vector<UnitShard> shards;
    for (size_t u = 0; u < units_.size(); ++u) shards.push_back(unit_shard(u));
    std::unique_ptr<ShardFence::Hold> hold(new ShardFence::Hold(fence_));
    copies_->take(std::move(shards), progress(), std::move(hold), send);
    return Status::Ok();
}

// As a regroup begins (the group aborted): the copies this group took become kept ones,
// which every group made from it, and any later try of the regroup, restore from. A copy
// still being sent gets `grace` to arrive.
void ShardGroup::keep_copies_for_regroup(Millis grace) {
    if (!copies_) return;
    copies_->finish(grace);
    std::shared_ptr<const KeptCopies> mine = copies_->release();
    if (!mine->own.empty() || !mine->peer.empty()) kept_.push_back(std::move(mine));
    copies_.reset();
}

std::vector<CopyHolding> ShardGroup::held_copies() const {
    std::vector<CopyHolding> out = copies_ ? copies_->holdings() : std::vector<CopyHolding>();
    for (const std::shared_ptr<const KeptCopies> &k : kept_)
        for (bool own : {true, false})
            for (const ShardCopy &c : own ? k->own : k->peer) out.push_back({own, k->epoch, c.seq, c.shard, k->shards});
    return out;
}

const ShardCopy *ShardGroup::find_copy(int epoch, uint64_t seq, bool own) const {
    if (copies_ && copies_->settings().epoch == epoch) return copies_->find(seq, own);
    for (const std::shared_ptr<const KeptCopies> &k : kept_)
        if (k->epoch == epoch) return k->find(seq, own);
    return nullptr;
}

// This (new) group's state from the memory copies of the groups before it, as `choice`
// says (collective): for each shard index of the layout the copy was taken in, the member
// holding it sends every rank the pieces of it that rank owns now. A joining rank holds
// none. Then the params are gathered, as after a load.
Status ShardGroup::restore_copies(const CopyChoice &choice) {
    SX_TRACE_SPAN(tracer(), "group", "restore_memory_copies");
    const int W = world_size(), S = shard_size(), me = rank();
    Layout old;
    SX_TRY(build_layout(choice.shards, &old));
    // The slots and progress of the copy: the first member holding its own copy sends
    // them to all (a joining rank has none).
    const int progress_root = choice.progress_from;
    std::string packed;
    if (me == progress_root) {
        const ShardCopy *own = find_copy(choice.epoch, choice.seq, true);
        SX_CHECK(own != nullptr && own->units.size() == units_.size(), SX_ERR_INTERNAL,
                 "rank %d holds no copy %llu of epoch %d of its own shard for %zu units", me,
                 static_cast<unsigned long long>(choice.seq), choice.epoch, units_.size());
        packed = pack_progress(own->slots, own->progress);
    }
    if (W > 1) {
        uint64_t bytes = packed.size();
        SX_TRY(collective([&](comm::Communicator &c) { return c.broadcast(&bytes, sizeof bytes, progress_root); }));
        packed.resize(static_cast<size_t>(bytes));
        SX_TRY(collective(
            [&](comm::Communicator &c) { return c.broadcast(&packed[0], packed.size(), progress_root); }));
    }
    std::vector<int> slots;
    ShardProgress progress;
    SX_TRY(unpack_progress(packed, &slots, &progress));
    SX_CHECK(slots.size() == units_.size(), SX_ERR_INTERNAL, "the copy has %zu units, the group %zu", slots.size(),
             units_.size());
    // Where each unit's tensors go (host memory: the copies are CPU groups'): the values
    // (fp32 masters of 16-bit units) in place, each state slot into a new buffer that a
    // restore then swaps in with the progress.
    SX_CHECK(ops_->device() == SX_DEVICE_CPU, SX_ERR_UNSUPPORTED, "memory copies restore CPU groups only");
    Status s = units_.ensure_masters();  // valid from here: the values below replace them
    std::vector<std::array<Buffer, 3>> state(units_.size());
    std::vector<std::array<float *, 4>> into(units_.size());
    for (size_t u = 0; u < units_.size() && s.ok(); ++u) {
        const uint64_t n = layout_.units()[u].shard_numel;
        into[u][0] = unit_shard(u).values;
        if (n == 0) continue;  // no piece lies in it
        for (int k = 0; k < slots[u] && s.ok(); ++k) {
            s = ops_->allocate(n * sizeof(float), "optimizer state restored from memory copies", &state[u][k]);
            into[u][k + 1] = state[u][k].as<float>();
        }
    }
    if (!s.ok()) return fail(s);
    for (int i = 0; i < static_cast<int>(choice.provider.size()); ++i) {
        const int root = choice.provider[i];  // a member's index is its new rank
        const ShardCopy *src = me == root ? find_copy(choice.epoch, choice.seq, choice.provider_own[i]) : nullptr;
        SX_CHECK(me != root || (src != nullptr && src->shard == i), SX_ERR_INTERNAL,
                 "rank %d was chosen to send shard %d of copy %llu of epoch %d, which it does not hold", me, i,
                 static_cast<unsigned long long>(choice.seq), choice.epoch);
        std::vector<comm::Piece> mine;
        std::vector<std::vector<comm::Piece>> theirs(me == root ? static_cast<size_t>(W) : 0);
        for (int r = 0; r < W; ++r) {
            if (r != me && me != root) continue;
            const std::vector<UnitLayout> &to_units = layout_.units();
            for_each_overlap(old, i, layout_, r % S, slots,
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
    ShardRestore r;
    r.state = &state;
    r.slots = slots;
    r.progress = &progress;
    SX_TRY(restore_shard(r));
    return gather_params();
}

}  // namespace core
}  // namespace sx
