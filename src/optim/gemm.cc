// gemm.h's dispatch: the BLAS flavour in one call, sx's own product (over sx's pool)
// otherwise.
#include "optim/gemm.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "optim/thread_pool.h"
#ifdef SX_HAVE_OPENBLAS
#include "optim/gemm_openblas.h"
#endif

namespace sx {
namespace optim {
namespace {

#ifdef SX_HAVE_OPENBLAS
// Whether OpenBLAS's int holds every dimension (else sx's own product runs).
bool fits_blas(int64_t m, int64_t k, int64_t n) {
    const int64_t most = std::numeric_limits<int32_t>::max();
    return m <= most && k <= most && n <= most;
}
#endif

// x (rows x cols) transposed into t (cols x rows).
void transpose(const float *x, int64_t rows, int64_t cols, float *t) {
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = x[i * cols + j];
}

}  // namespace

bool gemm_available(Gemm flavour) {
#ifdef SX_HAVE_OPENBLAS
    return flavour == Gemm::kOrdered || flavour == Gemm::kBlas;
#else
    return flavour == Gemm::kOrdered;
#endif
}

Gemm default_gemm() { return gemm_available(Gemm::kBlas) ? Gemm::kBlas : Gemm::kOrdered; }

const char *gemm_name(Gemm flavour) { return flavour == Gemm::kBlas ? "openblas" : "ordered"; }

void gemm_ab(Gemm flavour, const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t n,
             ThreadPool *pool) {
#ifdef SX_HAVE_OPENBLAS
    if (flavour == Gemm::kBlas && fits_blas(m, k, n)) return openblas_product(false, a, b, c, m, k, n);  // one call: see gemm.h
#endif
    (void)flavour;
    matmul_ordered(a, b, c, m, k, n, pool);
}

void gemm_abt(Gemm flavour, const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t n,
              ThreadPool *pool) {
#ifdef SX_HAVE_OPENBLAS
    if (flavour == Gemm::kBlas && fits_blas(m, k, n)) return openblas_product(true, a, b, c, m, k, n);
#endif
    (void)flavour;
    std::vector<float> bt(static_cast<size_t>(k * n));
    transpose(b, n, k, bt.data());
    matmul_ordered(a, bt.data(), c, m, k, n, pool);
}

}  // namespace optim
}  // namespace sx
