// How one launch covers all segments of a step: the segment table the kernel reads
// from device memory, and how blocks are assigned to its elements. Plain C++ (the
// kernel in fused_update.cu reads the same structs), built on the host, and tested
// without a device (tests/optim/test_cuda_plan.cc).
//
// Every segment is cut into chunks of kChunk positions. Position q of a segment is
// element q - lead, where lead (0..3) is how far element 0 lies past a 16-byte boundary
// (its grad pointer's; of 16-bit gradients, past an 8-byte one, and the param's must
// agree), so every chunk but a segment's first and last starts and ends
// on 16-byte boundaries: the kernel reads and writes its inside as float4 and only up
// to 3 elements at each end of a segment one by one. A segment whose other buffers do
// not share grad's alignment (or whose compute output is not 2-byte aligned alike)
// runs one element at a time (vector = 0, lead = 0), and so do segments of packed state:
// bf16 slots one element at a time, 8-bit ones a quantization block at a time; so do
// segments of bf16 params without masters (bf16_stochastic_round), whose params are the
// 16-bit output itself.
//
// The chunks of all segments are numbered one after another (chunk_begin/chunk_end);
// block b of a grid of G runs chunks [b*T/G, (b+1)*T/G) of the T in all, in order:
// contiguous runs, so that a block walks the table forward from first_segment[b]
// (computed here) instead of searching it for every chunk, and so that the blocks'
// partial sums, added in block order, always add the same numbers in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "optim/cuda_kernels.h"
#include "optim/kernels.h"
#include "optim/state_codec.h"

// Functions both the host (planning) and the kernel call.
#ifdef __CUDACC__
#define SX_HOST_DEVICE __host__ __device__
#else
#define SX_HOST_DEVICE
#endif

namespace sx {
namespace optim {
namespace cuda {
namespace internal {

constexpr unsigned kThreads = 256;  // per block
constexpr unsigned kIlp = 2;        // float4 per thread per stream in flight
// Blocks per multiprocessor the kernel's registers must allow (its launch bounds): 3 caps
// the update at 80 registers (no spills), so 24 warps per multiprocessor keep the loads
// of the next group in flight while others compute. With the compiler's free choice (90
// registers, 2 blocks) the AdamW update took 1.99 ms on 2^28 fp32 elements of an H200,
// 0.95 of the traffic-only kernel; with 3, 1.90 ms, as fast as that kernel (bench_sx
// gpu_adamw; one float4 per stream with 4 or 6 blocks: 1.93 and 1.94 ms).
constexpr unsigned kMinBlocks = 3;
constexpr uint64_t kChunk = uint64_t(kThreads) * 4 * kIlp;  // positions per chunk
// An 8-bit segment's chunk is whole quantization blocks (the segment starts on one, with
// lead 0), each updated by the block's threads one element apiece.
static_assert(kThreads == kQuantBlock && kChunk % kQuantBlock == 0, "a chunk of 8-bit state is whole blocks");

// What a launch computes.
enum class Mode : int32_t {
    kUpdate = 0,       // the optimizer step (+ GradStats if stats)
    kStats = 1,        // GradStats of the gradients alone
    kTrafficOnly = 2,  // the update's loads and stores with no arithmetic (benchmark ceiling)
    // kUpdate where a segment keeps packed state (LaunchPlan::packed): a kernel of its own,
    // so that the fp32 update's registers are not sized for the packed one's.
    kUpdatePacked = 3,
};

// One segment as the kernel reads it (trivially copyable; the same layout on host and
// device).
struct TableSegment {
    float *param;
    const float *grad;       // or null: grad16
    const uint16_t *grad16;  // 16-bit gradients of grad_dtype, widened as they are read
    float *state[3];           // fp32 slots (state_dtype SX_STATE_FP32)
    uint16_t *state16[3];      // bf16 slots: widened as read, rounded to nearest even as written
    uint8_t *codes[3];         // 8-bit slots: a code per element, and per kQuantBlock
    float *scales[3];          // elements (from element 0) one scale
    void *out;
    uint64_t n;
    uint64_t chunk_begin, chunk_end;  // this segment's chunks in the launch's numbering
    uint32_t lead;                    // see above; 0 when vector == 0
    int32_t vector;                   // 1: float4 inside the chunks
    int32_t out_dtype;                // ComputeDtype
    int32_t grad_dtype;               // ComputeDtype of grad16 (kNone: grad is fp32)
    int32_t state_dtype;              // SX_STATE_* of the slots (8-bit: n is whole blocks, vector == 0)
    int32_t slots;                    // state_slots(*hyper): an 8-bit segment decodes and encodes each
    int32_t unsigned_maps;            // bit k: 8-bit slot k's codes index kUnsignedMap, else kSignedMap
    // bf16_stochastic_round (Segment::stochastic_round): param is null and `out` holds
    // the bf16 params themselves, widened as read and rounded stochastically as written,
    // element e with the bits of element param_offset + e under sr_key (stochastic_round.h).
    int32_t stochastic_round;
    uint64_t sr_key;
    uint64_t param_offset;
    optim::internal::SegmentConsts c;  // from make_consts(), as the CPU kernels use them
};

struct LaunchPlan {
    std::vector<TableSegment> segments;     // the non-empty ones, in the caller's order
    std::vector<uint32_t> first_segment;    // per block: the segment holding its first chunk
    uint64_t total_chunks = 0;
    uint32_t grid = 0;                      // min(total_chunks, max_grid); 0: nothing to do
    bool packed = false;                    // a segment keeps bf16 or 8-bit state
};

// Fills *plan for segs with at most max_grid blocks (max_grid >= 1). Checks every
// segment (see Workspace::fused_update) and returns SX_ERR_INVALID_ARGUMENT naming the
// segment and what is wrong; *plan is unspecified then. In kStats mode only grad is
// needed and checked; kTrafficOnly takes fp32 state alone.
Status build_plan(const CudaSegment *segs, size_t num_segs, float grad_scale, Mode mode,
                  uint32_t max_grid, LaunchPlan *plan);

// Block b's chunk range [begin, end), as the kernel computes it.
SX_HOST_DEVICE inline uint64_t block_chunk_begin(uint64_t b, uint64_t total_chunks, uint64_t grid) {
    return b * total_chunks / grid;
}

// The update's memory traffic with no arithmetic, through the same table and kernel
// structure as Workspace::fused_update (benchmark ceiling; parameters are overwritten
// with other streams' values).
Status traffic_only(Workspace *ws, const CudaSegment *segs, size_t num_segs, void *stream);

}  // namespace internal
}  // namespace cuda
}  // namespace optim
}  // namespace sx
