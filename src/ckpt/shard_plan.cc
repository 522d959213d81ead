#include "ckpt/shard_plan.h"

#include <algorithm>

namespace sx {
namespace ckpt {

namespace {

// Appends the chunks of one stored tensor of param p's piece: [begin, end) of its index
// space (elements, or blocks for scales), at most kMaxChunkBytes each; 8-bit codes split
// on block boundaries only.
void add_chunks(WriteChunk c, const core::ShardPiece &piece, uint64_t block, uint64_t *cursor, WritePlan *plan) {
    const uint64_t elem = dtype_bytes(c.dtype);
    uint64_t max_elems = kMaxChunkBytes / elem;
    if (c.dtype == kDTypeQ8) max_elems -= max_elems % kScaleBlock;
    const uint64_t begin = piece.begin / block, end = piece.end / block;
    for (uint64_t b = begin; b < end; b += max_elems) {
        c.begin = b;
        c.end = std::min(end, b + max_elems);
        c.piece_offset = b - begin;
        c.shard_offset = piece.shard_offset + (b - begin) * block;
        c.bytes = (c.end - c.begin) * elem;
        c.file_offset = (*cursor + kChunkAlignment - 1) / kChunkAlignment * kChunkAlignment;
        *cursor = c.file_offset + c.bytes;
        plan->data_bytes += c.bytes;
        plan->chunks.push_back(c);
    }
}

}  // namespace

WritePlan plan_write(const core::Layout &layout, int rank, const std::vector<std::vector<TensorKind>> &kinds_of,
                     const std::vector<int32_t> &state_dtype_of) {
    WritePlan plan;
    uint64_t cursor = 0;
    const auto &units = layout.units();
    size_t most_kinds = 0;
    for (const std::vector<TensorKind> &kinds : kinds_of) most_kinds = std::max(most_kinds, kinds.size());
    for (size_t k = 0; k < most_kinds; ++k) {
        for (size_t u = 0; u < units.size(); ++u) {
            for (int32_t p : units[u].params) {
                const core::ShardPiece piece = layout.piece(p, rank);
                const std::vector<TensorKind> &kinds = kinds_of[p];
                if (piece.begin == piece.end || k >= kinds.size()) continue;
                WriteChunk c;
                c.param = p;
                c.kind = kinds[k];
                c.slot = static_cast<int32_t>(k) - 1;
                c.unit_index = static_cast<int32_t>(u);
                const int32_t state_dtype = state_dtype_of.empty() ? SX_STATE_FP32 : state_dtype_of[p];
                c.dtype = k == 0 ? SX_DTYPE_F32 : state_tensor_dtype(state_dtype);
                add_chunks(c, piece, 1, &cursor, &plan);
                if (c.dtype != kDTypeQ8) continue;
                c.kind = scales_kind(c.slot);
                c.dtype = SX_DTYPE_F32;
                add_chunks(c, piece, kScaleBlock, &cursor, &plan);
            }
        }
    }
    plan.file_bytes = cursor;
    return plan;
}

bool cut_of(const std::vector<int64_t> &saved_shape, const core::Placement &saved, const std::vector<int64_t> &shape,
            const core::Placement &here, PieceCut *cut) {
    *cut = PieceCut();
    if (saved_shape == shape && core::placement_loads_into(saved, here)) return true;
    if (here.kind != SX_PLACEMENT_SPLIT) return false;
    const size_t d = static_cast<size_t>(here.split_dim);
    // The saved tensor's range on dimension d of the logical tensor: all of it, or its piece.
    int64_t lo = 0;
    if (saved.kind == SX_PLACEMENT_SPLIT) {
        if (saved.split_dim != here.split_dim || saved.global_shape != here.global_shape) return false;
        lo = saved.offset;
    } else if (saved_shape != here.global_shape) {
        return false;
    }
    if (saved_shape.size() != shape.size()) return false;
    for (size_t i = 0; i < shape.size(); ++i)
        if (i != d && saved_shape[i] != shape[i]) return false;
    if (here.offset < lo || here.offset + shape[d] > lo + saved_shape[d]) return false;
    uint64_t inner = 1;
    for (size_t i = d + 1; i < shape.size(); ++i) inner *= static_cast<uint64_t>(shape[i]);
    cut->run = static_cast<uint64_t>(shape[d]) * inner;
    cut->stride = static_cast<uint64_t>(saved_shape[d]) * inner;
    cut->base = static_cast<uint64_t>(here.offset - lo) * inner;
    return true;
}

namespace {

// The reads of [src, src + n) of saved tensor t (elements, or blocks for scales), whose
// first element goes to `to` of this rank's part of the param (from its piece's start):
// each chunk overlapping the range, in order. `proto` carries the param, kind and unit.
Status cover(const ParamEntry &entry, const Tensor &t, ReadOp proto, uint64_t src, uint64_t n, uint64_t to,
             const core::ShardPiece &piece, uint64_t block, std::vector<ReadOp> *out) {
    const uint64_t end = src + n;
    // First chunk ending after the range's start (chunks are sorted, disjoint).
    auto it = std::upper_bound(t.chunks.begin(), t.chunks.end(), src,
                               [](uint64_t v, const Chunk &c) { return v < c.end; });
    uint64_t covered = src;
    for (; it != t.chunks.end() && it->begin < end; ++it) {
        ReadOp op = proto;
        op.chunk = &*it;
        op.copy_begin = std::max(src, it->begin);
        op.copy_end = std::min(end, it->end);
        SX_CHECK(op.copy_begin == covered, SX_ERR_CORRUPT,
                 "param '%s'%s: the checkpoint's chunks leave elements [%llu, %llu) uncovered", entry.name.c_str(),
                 tensor_suffix(proto.kind), static_cast<unsigned long long>(covered),
                 static_cast<unsigned long long>(op.copy_begin));
        op.piece_offset = to + (op.copy_begin - src);
        op.shard_offset = piece.shard_offset + op.piece_offset * block;
        covered = op.copy_end;
        out->push_back(op);
    }
    SX_CHECK(covered == end, SX_ERR_CORRUPT, "param '%s'%s: the checkpoint's chunks end at element %llu, before %llu",
             entry.name.c_str(), tensor_suffix(proto.kind), static_cast<unsigned long long>(covered),
             static_cast<unsigned long long>(end));
    return Status::Ok();
}

// The reads of this rank's part `piece` of param p's tensor `kind`, through its cut: one
// range of the saved tensor, or one per run of the piece's split dimension.
Status plan_tensor(const ParamEntry &entry, ReadOp proto, const core::ShardPiece &piece, const PieceCut &cut,
                   std::vector<ReadOp> *out) {
    const Tensor *t = nullptr;
    for (const Tensor &cand : entry.tensors)
        if (cand.kind == proto.kind) t = &cand;
    SX_CHECK(t != nullptr, SX_ERR_NOT_FOUND, "the checkpoint has no %s%s for param '%s'",
             proto.kind == TensorKind::kParam ? "values" : "state ",
             proto.kind == TensorKind::kParam ? "" : tensor_suffix(proto.kind) + 1, entry.name.c_str());
    proto.elem_bytes = dtype_bytes(t->dtype);
    // Scales: the piece's blocks (whole: blocks follow every layout's shards).
    const uint64_t block = kind_block(proto.kind), begin = piece.begin / block, end = piece.end / block;
    SX_CHECK(cut.identity() || block == 1, SX_ERR_INTERNAL, "param '%s': 8-bit state cannot be read through a cut",
             entry.name.c_str());
    if (cut.identity()) return cover(entry, *t, proto, begin, end - begin, 0, piece, block, out);
    for (uint64_t at = begin; at < end;) {
        const uint64_t n = std::min(end - at, cut.run - at % cut.run);
        SX_TRY(cover(entry, *t, proto, cut.at(at), n, at - begin, piece, block, out));
        at += n;
    }
    return Status::Ok();
}

}  // namespace

Status plan_read(const Manifest &m, const core::Layout &layout, int rank,
                 const std::vector<int32_t> &manifest_index,
                 const std::vector<std::vector<TensorKind>> &want, std::vector<ReadOp> *ops,
                 const std::vector<PieceCut> &cuts) {
    std::vector<ReadOp> out;
    const auto &units = layout.units();
    for (size_t u = 0; u < units.size(); ++u) {
        for (int32_t p : units[u].params) {
            const int32_t mi = manifest_index[p];
            if (mi < 0) continue;
            const core::ShardPiece piece = layout.piece(p, rank);
            if (piece.begin == piece.end) continue;
            const PieceCut cut = cuts.empty() ? PieceCut() : cuts[p];
            for (TensorKind kind : want[p]) {
                ReadOp proto;
                proto.param = p;
                proto.manifest_param = mi;
                proto.kind = kind;
                proto.unit_index = static_cast<int32_t>(u);
                SX_TRY(plan_tensor(m.params[mi], proto, piece, cut, &out));
            }
        }
    }
    *ops = std::move(out);
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
