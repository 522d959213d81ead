#include "core/layout.h"

#include <algorithm>
#include <map>

namespace sx {
namespace core {
namespace {

// a rounded up to a multiple of m, or false on overflow.
bool round_up(uint64_t a, uint64_t m, uint64_t *out) {
    uint64_t r = a % m;
    if (r == 0) {
        *out = a;
        return true;
    }
    if (a > UINT64_MAX - (m - r)) return false;
    *out = a + (m - r);
    return true;
}

}  // namespace

Status Layout::build(const std::vector<ParamShape> &params, int world_size, uint64_t align_bytes,
                     Layout *out) {
    SX_CHECK_ARG(world_size >= 1, "world size %d must be >= 1", world_size);
    SX_CHECK_ARG(align_bytes >= 1 && (align_bytes & (align_bytes - 1)) == 0,
                 "alignment of %llu bytes must be a power of two",
                 static_cast<unsigned long long>(align_bytes));
    Layout l;
    l.world_size_ = world_size;
    l.placement_.resize(params.size());
    l.numel_.resize(params.size());

    // Units ordered by id; params inside a unit in registration order.
    std::map<int32_t, std::vector<int32_t>> by_unit;
    for (size_t i = 0; i < params.size(); ++i) {
        SX_CHECK_ARG(params[i].numel >= 1, "param %zu has no elements", i);
        SX_CHECK_ARG(params[i].unit >= 0, "param %zu has negative unit %d", i, params[i].unit);
        SX_CHECK_ARG(params[i].elem_bytes == 2 || params[i].elem_bytes == 4,
                     "param %zu has elements of %u bytes (2 or 4)", i, params[i].elem_bytes);
        by_unit[params[i].unit].push_back(static_cast<int32_t>(i));
        l.numel_[i] = params[i].numel;
    }
    for (auto &entry : by_unit) {
        UnitLayout u;
        u.unit_id = entry.first;
        u.params = std::move(entry.second);
        u.elem_bytes = params[u.params[0]].elem_bytes;
        // An alignment below the element size packs the params (each starts where the
        // one before ends).
        const uint64_t align_elems = std::max<uint64_t>(1, align_bytes / u.elem_bytes);
        u.align_elems = align_elems;
        for (int32_t p : u.params) {
            SX_CHECK_ARG(params[p].block >= 1 && (params[p].block & (params[p].block - 1)) == 0,
                         "param %d has a block of %u elements (a power of two)", p, params[p].block);
            u.block = std::max<uint64_t>(u.block, params[p].block);
        }
        // Powers of two both: the larger is a multiple of the smaller.
        const uint64_t granule = std::max(align_elems, u.block) * static_cast<uint64_t>(world_size);
        uint64_t cursor = 0;
        for (int32_t p : u.params) {
            SX_CHECK_ARG(params[p].elem_bytes == u.elem_bytes,
                         "unit %d mixes element sizes (param %d has %u bytes, param %d has %u)", u.unit_id,
                         u.params[0], u.elem_bytes, p, params[p].elem_bytes);
            uint64_t start;
            if (!round_up(cursor, std::max<uint64_t>(align_elems, params[p].block), &start) ||
                start > UINT64_MAX - params[p].numel)
                return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "unit %d is too large to lay out", u.unit_id);
            l.placement_[p].unit_index = static_cast<int32_t>(l.units_.size());
            l.placement_[p].offset = start;
            cursor = start + params[p].numel;
        }
        u.numel = cursor;
        if (!round_up(cursor, granule, &u.padded_numel))
            return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "unit %d is too large to lay out", u.unit_id);
        u.shard_numel = u.padded_numel / static_cast<uint64_t>(world_size);
        l.units_.push_back(std::move(u));
    }
    *out = std::move(l);
    return Status::Ok();
}

ShardPiece Layout::piece(int32_t param, int rank) const {
    const ParamPlacement &pl = placement_[param];
    const UnitLayout &u = units_[pl.unit_index];
    const uint64_t shard_begin = static_cast<uint64_t>(rank) * u.shard_numel;
    const uint64_t shard_end = shard_begin + u.shard_numel;
    const uint64_t p_begin = pl.offset, p_end = pl.offset + numel_[param];
    ShardPiece s;
    const uint64_t b = std::max(p_begin, shard_begin), e = std::min(p_end, shard_end);
    if (b < e) {
        s.begin = b - p_begin;
        s.end = e - p_begin;
        s.shard_offset = b - shard_begin;
    }
    return s;
}

}  // namespace core
}  // namespace sx
