// The matrix products Muon's Newton-Schulz iterations need (muon.h), row-major fp32:
// C = A B and C = A B^T, behind one seam with two flavours, chosen at build time:
//
// - kBlas: OpenBLAS's sgemm (Debian's libopenblas-serial-dev, its static archive linked
//   into libsx with every symbol hidden, so that no other copy of OpenBLAS in the process,
//   threaded or not, is seen or changed). The serial build starts no thread; a product is
//   one sgemm call, and the process's calls run one at a time (gemm_openblas.cc says
//   why), so the pool is not used and an element's bits cannot depend on its size. The
//   order of the sums within an element is OpenBLAS's (its kernel for this CPU, with fused
//   multiply-adds): another CPU may give other bits.
// - kOrdered: sx's own product (gemm_ordered.cc), every element summed over k in
//   ascending order with no fused multiply-add: the same bits on every CPU. Always built;
//   the one used where OpenBLAS was not found at build time (SX_WITH_BLAS, README.md).
//
// Neither leaves wide-vector state dirty: after OpenBLAS's AVX kernels each calling
// thread runs vzeroupper; neither changes the floating-point environment.
#pragma once

#include <cstdint>

namespace sx {
namespace optim {

class ThreadPool;

enum class Gemm {
    kOrdered,  // sx's own product
    kBlas,     // OpenBLAS's sgemm, where libsx was built with it
};

// Whether this build has the flavour (kOrdered: always).
bool gemm_available(Gemm flavour);
// The flavour Newton-Schulz uses: kBlas where built with it, else kOrdered.
Gemm default_gemm();
// "openblas" or "ordered".
const char *gemm_name(Gemm flavour);

// C (m x n) = A (m x k) B (k x n). pool (or null) splits C's rows (kOrdered); c must not alias a or
// b. A flavour this build lacks is computed by kOrdered.
void gemm_ab(Gemm flavour, const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t n,
             ThreadPool *pool);
// C (m x n) = A (m x k) B^T, B being n x k (a Gram matrix X X^T with b == a).
void gemm_abt(Gemm flavour, const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t n,
              ThreadPool *pool);

// sx's own C = A B (kOrdered): each element summed as ((0 + a0 b0) + a1 b1) + ... in
// ascending k, whatever pool's size (exported for its test and bench).
void matmul_ordered(const float *a, const float *b, float *c, int64_t m, int64_t kk, int64_t n, ThreadPool *pool);

}  // namespace optim
}  // namespace sx
