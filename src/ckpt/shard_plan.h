// Which bytes of which tensors a rank writes when saving, and reads when loading.
//
// Saving: rank r stores, for every param piece inside its shard of every unit, one
// chunk per stored tensor (the param, and each optimizer state the param's optimizer
// keeps), split so that no chunk exceeds kMaxChunkBytes, each starting on a 4 KiB
// boundary of its shard file. Chunks are in the param's own index space: the padding
// of the layout never reaches a file.
//
// Loading into any layout (world size, stage, units): rank r lists the pieces it owns
// now, intersects each with the manifest's chunks of that tensor, and reads exactly
// those chunks (a chunk's CRC32C covers it whole, so a chunk that is only partly needed
// is read whole and verified, then the needed part is copied). No rank ever holds more
// than its own shard plus a few chunks (the reader keeps 4 ahead of the CRC checks).
#pragma once

#include <cstdint>
#include <vector>

#include "ckpt/manifest.h"
#include "core/layout.h"
#include "core/params.h"

namespace sx {
namespace ckpt {

constexpr uint64_t kMaxChunkBytes = 4ull << 20;


// One chunk a rank writes.
struct WriteChunk {
    int32_t param = 0;
    TensorKind kind = TensorKind::kParam;
    int32_t slot = -1;            // -1: the param buffer; else the optimizer state slot (or its scales)
    int32_t dtype = SX_DTYPE_F32; // as stored: F32, BF16 or kDTypeQ8
    uint64_t begin = 0, end = 0;  // elements, param index space (blocks for scales)
    uint64_t shard_offset = 0;    // element offset of `begin` in this rank's shard of the unit
    uint64_t piece_offset = 0;    // of `begin` from the start of the param's piece, in its index space
    uint64_t bytes = 0;           // (end - begin) * the dtype's size
    int32_t unit_index = 0;
    uint64_t file_offset = 0;     // bytes, a multiple of kChunkAlignment
};

struct WritePlan {
    std::vector<WriteChunk> chunks;
    uint64_t file_bytes = 0;   // size of the shard file
    uint64_t data_bytes = 0;   // tensor bytes (file_bytes less alignment gaps)
};

// What rank `rank` writes. kinds_of[p] lists the kinds stored for param p (from
// stored_kinds of its group, restricted to what its unit has allocated); state_dtype_of[p]
// how its state slots are kept (SX_STATE_*, as the param keeps them; empty: every param's
// in fp32): each is stored in
// its own dtype, an 8-bit slot as its codes, then its scales (kScales0 + slot), split
// into chunks on block boundaries only. The file holds
// every param's values first, then every param's first state, and so on: a load of the
// params alone reads one contiguous range of each file, and a whole load reads the values
// (which it gathers across ranks while the states are read) and then the rest, each
// sequentially.
WritePlan plan_write(const core::Layout &layout, int rank, const std::vector<std::vector<TensorKind>> &kinds_of,
                     const std::vector<int32_t> &state_dtype_of = {});

// Where a param's piece lies in the tensor a checkpoint saved for it: element i of the
// piece (its own row-major index space) is element base + (i / run) * stride + i % run
// of the saved tensor. run 0: the saved tensor is the piece (element i is i).
struct PieceCut {
    uint64_t base = 0, run = 0, stride = 0;
    bool identity() const { return run == 0; }
    uint64_t at(uint64_t i) const { return run == 0 ? i : base + (i / run) * stride + i % run; }
};

// Whether a param of shape `shape` and placement `here` takes its values from a tensor
// a checkpoint saved with shape `saved_shape` and placement `saved`, and where (*cut):
// - the same shape: a whole or replicated saved tensor loads into any placement, a saved
//   piece of a split tensor only into the same piece (cut: identity);
// - a piece of a split tensor (here) within the saved tensor: the saved logical tensor
//   whole (a checkpoint of a run at a lower tensor-parallel degree, or the slices'
//   checkpoints joined by `sxckpt join`), or a saved piece of the same logical tensor,
//   split on the same dimension, that contains it (2 -> 4 tensor-parallel ranks).
// Anything else (a piece not within the saved one, another logical shape) is false.
bool cut_of(const std::vector<int64_t> &saved_shape, const core::Placement &saved, const std::vector<int64_t> &shape,
            const core::Placement &here, PieceCut *cut);

// One read a rank makes: the whole chunk, then the part [copy_begin, copy_end) of it
// (elements, param index space) goes to the destination.
struct ReadOp {
    int32_t param = 0;            // index in the current group
    int32_t manifest_param = 0;   // index in the manifest
    TensorKind kind = TensorKind::kParam;
    const Chunk *chunk = nullptr;
    uint64_t copy_begin = 0, copy_end = 0;  // elements (blocks for scales), the saved tensor's index space
    int32_t unit_index = 0;
    uint64_t shard_offset = 0;    // where copy_begin's value goes: its element offset in this rank's shard (not for scales)
    uint64_t piece_offset = 0;    // and its offset from the start of this rank's part of the param, in the param's index space
    uint64_t elem_bytes = 4;      // of the tensor's dtype
};

// Plans the reads of `rank` under `layout` for every (param, kind) wanted: want[p] lists
// the kinds to load for current param p (scales kinds read the piece's blocks), and manifest_index[p] its index in `m` (-1:
// not in the checkpoint; such params are skipped), cuts[p] where its piece lies in the
// saved tensor (empty: every param is its saved tensor; a cut param wants no scales).
// SX_ERR_CORRUPT if the manifest does not cover a wanted range (validate() makes that
// impossible for a verified manifest).
Status plan_read(const Manifest &m, const core::Layout &layout, int rank,
                 const std::vector<int32_t> &manifest_index,
                 const std::vector<std::vector<TensorKind>> &want, std::vector<ReadOp> *ops,
                 const std::vector<PieceCut> &cuts = {});

}  // namespace ckpt
}  // namespace sx
