// The BLAS flavour's one call (gemm.h): built only where CMake found OpenBLAS
// (SX_HAVE_OPENBLAS).
#pragma once

#include <cstdint>

namespace sx {
namespace optim {

// C (m x n) = A (m x k) B (k x n), or A B^T with B n x k (trans_b), row-major fp32,
// through OpenBLAS's sgemm on this thread; then vzeroupper where the CPU has AVX. Each of
// m, k and n at most INT32_MAX (OpenBLAS's int).
void openblas_product(bool trans_b, const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t n);

}  // namespace optim
}  // namespace sx
