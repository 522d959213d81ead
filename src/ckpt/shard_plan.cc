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

Status plan_read(const Manifest &m, const core::Layout &layout, int rank,
                 const std::vector<int32_t> &manifest_index,
                 const std::vector<std::vector<TensorKind>> &want, std::vector<ReadOp> *ops) {
    std::vector<ReadOp> out;
    const auto &units = layout.units();
    for (size_t u = 0; u < units.size(); ++u) {
        for (int32_t p : units[u].params) {
            const int32_t mi = manifest_index[p];
            if (mi < 0) continue;
            const core::ShardPiece piece = layout.piece(p, rank);
            if (piece.begin == piece.end) continue;
            const ParamEntry &entry = m.params[mi];
            for (TensorKind kind : want[p]) {
                const Tensor *t = nullptr;
                for (const Tensor &cand : entry.tensors)
                    if (cand.kind == kind) t = &cand;
                SX_CHECK(t != nullptr, SX_ERR_NOT_FOUND, "the checkpoint has no %s%s for param '%s'",
                         kind == TensorKind::kParam ? "values" : "state ",
                         kind == TensorKind::kParam ? "" : tensor_suffix(kind) + 1, entry.name.c_str());
                // First chunk ending after the piece's start (chunks are sorted, disjoint).
                // Scales: the piece's blocks (whole: blocks follow every layout's shards).
                const uint64_t block = kind_block(kind), begin = piece.begin / block, end = piece.end / block;
                auto it = std::upper_bound(t->chunks.begin(), t->chunks.end(), begin,
                                           [](uint64_t v, const Chunk &c) { return v < c.end; });
                uint64_t covered = begin;
                for (; it != t->chunks.end() && it->begin < end; ++it) {
                    ReadOp op;
                    op.param = p;
                    op.manifest_param = mi;
                    op.kind = kind;
                    op.chunk = &*it;
                    op.copy_begin = std::max(begin, it->begin);
                    op.copy_end = std::min(end, it->end);
                    op.elem_bytes = dtype_bytes(t->dtype);
                    SX_CHECK(op.copy_begin == covered, SX_ERR_CORRUPT,
                             "param '%s'%s: the checkpoint's chunks leave elements [%llu, %llu) uncovered",
                             entry.name.c_str(), tensor_suffix(kind),
                             static_cast<unsigned long long>(covered),
                             static_cast<unsigned long long>(op.copy_begin));
                    op.unit_index = static_cast<int32_t>(u);
                    op.piece_offset = op.copy_begin - begin;
                    op.shard_offset = piece.shard_offset + op.piece_offset * block;
                    covered = op.copy_end;
                    out.push_back(op);
                }
                SX_CHECK(covered == end, SX_ERR_CORRUPT,
                         "param '%s'%s: the checkpoint's chunks end at element %llu, before %llu",
                         entry.name.c_str(), tensor_suffix(kind), static_cast<unsigned long long>(covered),
                         static_cast<unsigned long long>(end));
            }
        }
    }
    *ops = std::move(out);
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
