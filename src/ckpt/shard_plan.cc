#include "ckpt/shard_plan.h"

#include <algorithm>

namespace sx {
namespace ckpt {

WritePlan plan_write(const core::Layout &layout, int rank,
                     const std::vector<std::vector<TensorKind>> &kinds_of) {
    WritePlan plan;
    const uint64_t max_elems = kMaxChunkBytes / sizeof(float);
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
                for (uint64_t b = piece.begin; b < piece.end; b += max_elems) {
                    WriteChunk c;
                    c.param = p;
                    c.kind = kinds[k];
                    c.slot = static_cast<int32_t>(k) - 1;
                    c.begin = b;
                    c.end = std::min(piece.end, b + max_elems);
                    c.shard_offset = piece.shard_offset + (b - piece.begin);
                    c.unit_index = static_cast<int32_t>(u);
                    c.file_offset = (cursor + kChunkAlignment - 1) / kChunkAlignment * kChunkAlignment;
                    const uint64_t bytes = (c.end - c.begin) * sizeof(float);
                    cursor = c.file_offset + bytes;
                    plan.data_bytes += bytes;
                    plan.chunks.push_back(c);
                }
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
                auto it = std::upper_bound(t->chunks.begin(), t->chunks.end(), piece.begin,
                                           [](uint64_t v, const Chunk &c) { return v < c.end; });
                uint64_t covered = piece.begin;
                for (; it != t->chunks.end() && it->begin < piece.end; ++it) {
                    ReadOp op;
                    op.param = p;
                    op.manifest_param = mi;
                    op.kind = kind;
                    op.chunk = &*it;
                    op.copy_begin = std::max(piece.begin, it->begin);
                    op.copy_end = std::min(piece.end, it->end);
                    SX_CHECK(op.copy_begin == covered, SX_ERR_CORRUPT,
                             "param '%s'%s: the checkpoint's chunks leave elements [%llu, %llu) uncovered",
                             entry.name.c_str(), tensor_suffix(kind),
                             static_cast<unsigned long long>(covered),
                             static_cast<unsigned long long>(op.copy_begin));
                    op.unit_index = static_cast<int32_t>(u);
                    op.shard_offset = piece.shard_offset + (op.copy_begin - piece.begin);
                    covered = op.copy_end;
                    out.push_back(op);
                }
                SX_CHECK(covered == piece.end, SX_ERR_CORRUPT,
                         "param '%s'%s: the checkpoint's chunks end at element %llu, before %llu",
                         entry.name.c_str(), tensor_suffix(kind), static_cast<unsigned long long>(covered),
                         static_cast<unsigned long long>(piece.end));
            }
        }
    }
    *ops = std::move(out);
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
