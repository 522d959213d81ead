// OpenBLAS's sgemm for gemm.h's kBlas flavour. libsx links the serial build's static
// archive (cmake/SxDependencies.cmake): its symbols stay inside libsx and it starts no
// thread. Calls run one at a time in the process, under one lock: with torch (and its
// MKL) loaded in the same process, concurrent calls from ranks that were threads of it
// gave wrong products now and then (Muon resumed by 4 ranks as a 2 x 2 mesh: 9 runs in
// 20 wrong without the lock; none in 20 with sx's ordered product, none in 15 with torch
// not loaded, none of test_muon's threads at once in a plain process). Why was not
// found, so the lock stays until it is.
#include "optim/gemm_openblas.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>

#include "base/vector_state.h"

namespace sx {
namespace optim {

void openblas_product(bool trans_b, const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t n) {
    if (m <= 0 || n <= 0) return;
    if (k == 0) {  // sgemm would reject lda = 0 (and print why): C is zeros
        std::fill(c, c + m * n, 0.0f);
        return;
    }
    static std::mutex *const one_at_a_time = new std::mutex();  // never destroyed: callers may outlive statics
    std::lock_guard<std::mutex> lock(*one_at_a_time);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
                static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(k), b,
                static_cast<blasint>(trans_b ? k : n), 0.0f, c, static_cast<blasint>(n));
    // OpenBLAS's kernel for this CPU may leave 256- or 512-bit registers' upper halves in
    // use, which would slow the caller's SSE code (base/vector_state.h).
    leave_vector_state_clean();
}

}  // namespace optim
}  // namespace sx
