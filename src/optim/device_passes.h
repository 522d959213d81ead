// LAMB's and Adafactor's passes (param_passes.h) where the segments live in a device's
// memory: the element work runs as kernels over "runs" of each segment, each run's sums
// come back to the host, and the host adds them into the blocks the step exchanges and
// derives what the next pass needs (LAMB's factors, Adafactor's factored moments and
// factors), which go to the device with the next launch.
//
// The runs: a segment of an unfactored param (every LAMB param, Adafactor's 1-D ones) is
// cut into runs of kDeviceRun elements; a factored Adafactor param's segment into the
// pieces of its rows it covers, one run per row, so that a run's sum of squared gradients
// is that row's sum. Adafactor's column sums are "column items": for each matrix the
// segment touches, each block of kColumnRows rows and each column, the sum down that
// column over those rows (the elements the segment holds). Every sum is in double, each
// run's added by the device in one fixed order, and the host adds the runs' (and the
// column items') in their order: the same inputs give the same bits every time, on any
// device of one kind. The element formulas are those of lamb.cc, adafactor.cc and muon.cc,
// operation for operation (device_pass_body.h): given the same sums, the fp32 values are
// the host's. The double sums themselves are added in another order than the host's
// loops add them, so a float derived from them (a norm, a factor, a moment) may rarely
// differ from the host's in its last bit.
//
// What launches the kernels is a PassLauncher: the CUDA one (optim/cuda_kernels.h's
// make_cuda_pass_launcher) or the host one here, which runs the same bodies one element
// at a time (a simulated device's, and the tests' of this logic without a device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "optim/optimizer.h"
#include "optim/param_passes.h"

// What the host and the device both call.
#ifdef __CUDACC__
#define SX_PASS_BODY __host__ __device__ __forceinline__
#else
#define SX_PASS_BODY inline
#endif

namespace sx {
namespace optim {

constexpr uint64_t kDeviceRun = 4096;   // elements per run of an unfactored segment
constexpr uint64_t kColumnRows = 512;   // rows per column item

// What a launch computes over every run (or column item) of the table.
enum class PassKernel : int32_t {
    kLambFirst = 0,         // moments and decay written; per run: sum p^2, sum u^2, sum g^2
    kLambApply = 1,         // p += factor * u; compute_out
    kAdafactorSums = 2,     // per run: sum p^2, sum g^2 (a factored run: its row's)
    kAdafactorColumns = 3,  // per column item: sum g^2
    kAdafactorSecond = 4,   // a 1-D param's variance lerped; per run: sum u^2
    kAdafactorApply = 5,    // p = p * decay + factor * u; compute_out
    kMuonMomentum = 6,      // momentum written, u into `pieces`; per run: sum g^2
    kMuonApply = 7,         // p = p * decay + factor * pieces; compute_out
};

// Doubles a launch writes per run (kAdafactorColumns: one per column item).
constexpr int kRunSums = 3;

// Whether a launch of `kernel` gives sums (the apply launches give none).
SX_PASS_BODY bool gives_sums(PassKernel kernel) {
    return kernel != PassKernel::kLambApply && kernel != PassKernel::kAdafactorApply &&
           kernel != PassKernel::kMuonApply;
}

// One segment as the kernels read it (trivially copyable, the same layout on host and
// device). Pointers are device addresses; `aux` indexes the launch's floats.
struct PassSegment {
    float *param;
    const float *grad;
    float *state0, *state1;  // LAMB: exp_avg, exp_avg_sq; Adafactor: a 1-D param's variance; Muon: its buffer
    float *pieces;           // Muon: this segment's piece of u (momentum), then of O (apply)
    uint16_t *compute_out;   // or null
    int32_t compute_dtype;   // SX_DTYPE_BF16 or SX_DTYPE_F16 where compute_out is set
    int32_t l2;              // LAMB: weight decay added to the direction
    uint64_t n, offset;      // its elements, and the first one's index in its param
    uint64_t rows, cols;     // a factored param's matrices (cols 0: not factored)
    uint64_t run_begin, run_count;        // its runs among the table's
    uint64_t column_begin, column_count;  // its column items among the table's
    uint64_t aux;            // Adafactor: its param's row_var, col_var, row_means in the floats
    uint64_t row_count, col_count;  // of its param (row_var's and col_var's lengths)
    // fp32 constants of the step, as lamb.cc and adafactor.cc round them.
    float grad_scale;  // negated under maximize
    float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, weight_decay;
    float eps1_sq, lerp_coeff;  // Adafactor's; Muon's lerp into its buffer
    int32_t lerp_from_end;
    float factor;  // the apply launches' (Muon: -adjusted_lr)
    float nesterov_coeff;  // Muon with Nesterov: g.lerp(buf, momentum)'s
    int32_t nesterov_from_end, nesterov;
};

// Run k of segment s: elements [*lo, *hi) of it.
SX_PASS_BODY void pass_run(const PassSegment &s, uint64_t k, uint64_t *lo, uint64_t *hi) {
    if (s.cols == 0) {
        *lo = k * kDeviceRun;
        *hi = *lo + kDeviceRun < s.n ? *lo + kDeviceRun : s.n;
        return;
    }
    const uint64_t row = s.offset / s.cols + k;
    const uint64_t first = row * s.cols, last = first + s.cols;
    *lo = (first > s.offset ? first : s.offset) - s.offset;
    *hi = (last < s.offset + s.n ? last : s.offset + s.n) - s.offset;
}

// Launches the kernels of the passes. One thread at a time.
class PassLauncher {
  public:
    virtual ~PassLauncher() = default;
    // Runs `kernel` over every run (kAdafactorColumns: every column item) of `segs`, whose
    // runs and items are numbered in order from 0 (pass_plan sets them), with `aux` the
    // floats the kernel reads; *out gets kRunSums doubles per run (one per column item),
    // or nothing where the kernel gives no sums (gives_sums).
    // The table and aux are read during the call; it returns once the kernel is done.
    virtual Status launch(PassKernel kernel, const std::vector<PassSegment> &segs, const std::vector<float> &aux,
                          std::vector<double> *out) = 0;
};

// The host's launcher: every run's elements in order on the calling thread.
std::unique_ptr<PassLauncher> make_host_pass_launcher();

// A run of LAMB's or Adafactor's passes over in.segs (device memory where the launcher's
// kernels run) through `launcher`. SX_ERR_UNSUPPORTED for another optimizer.
Status start_device_passes(Kind kind, const PassInput &in, std::unique_ptr<PassLauncher> launcher,
                           std::unique_ptr<ParamPassRun> *out);

// Muon's first and last passes (muon.h's muon_momentum and muon_apply) through `launcher`:
// segments and pieces in the launcher's memory, *grad_sumsq (if not null) the sum of
// (grad * grad_scale)^2 added in run order; shapes[s] segment s's param's.
Status device_muon_momentum(PassLauncher &launcher, const Segment *segs, size_t num_segs, float grad_scale,
                            float *const *pieces, double *grad_sumsq);
Status device_muon_apply(PassLauncher &launcher, const Segment *segs, size_t num_segs,
                         const std::vector<int64_t> *const *shapes, const float *const *pieces);

}  // namespace optim
}  // namespace sx
