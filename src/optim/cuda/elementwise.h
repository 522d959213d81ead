// The launch shape of the simple element-wise kernels (conversions, NCCL's helpers):
// kElementwiseThreads per block, one element per thread up to kMaxElementwiseBlocks
// blocks, grid-stride beyond. For .cu files only.
#pragma once

#include <cstddef>

namespace sx {
namespace optim {
namespace cuda {

constexpr int kElementwiseThreads = 256;
constexpr size_t kMaxElementwiseBlocks = 8192;

inline unsigned elementwise_blocks(size_t n) {
    const size_t b = (n + kElementwiseThreads - 1) / kElementwiseThreads;
    return static_cast<unsigned>(b < kMaxElementwiseBlocks ? (b ? b : 1) : kMaxElementwiseBlocks);
}

}  // namespace cuda
}  // namespace optim
}  // namespace sx
