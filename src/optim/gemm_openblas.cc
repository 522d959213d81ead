// OpenBLAS's sgemm for gemm.h's kBlas flavour. libsx links the serial build's static
// archive (cmake/SxDependencies.cmake): its symbols stay inside libsx and it starts no
// thread. That build is not safe to call from several threads at once (its work buffers
// are shared: concurrent calls from the ranks of one process gave wrong products), so
// every call holds one process-wide lock.
#include "optim/gemm_openblas.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>

#include "base/vector_state.h"

namespace sx {
namespace optim {

void openblas_rows(bool trans_b, const float *a, const float *b, float *c, int64_t rows, int64_t k, int64_t n) {
    if (rows <= 0 || n <= 0) return;
    if (k == 0) {  // sgemm would reject lda = 0 (and print why): C is zeros
        std::fill(c, c + rows * n, 0.0f);
        return;
    }
    static std::mutex *const one_at_a_time = new std::mutex();  // never destroyed: callers may outlive statics
    std::lock_guard<std::mutex> lock(*one_at_a_time);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(rows),
                static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(k), b,
                static_cast<blasint>(trans_b ? k : n), 0.0f, c, static_cast<blasint>(n));
    // OpenBLAS's kernel for this CPU may leave 256- or 512-bit registers' upper halves in
    // use, which would slow the caller's SSE code (base/vector_state.h).
    leave_vector_state_clean();
}

}  // namespace optim
}  // namespace sx
