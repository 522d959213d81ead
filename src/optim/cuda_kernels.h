// The optimizer on a CUDA device: the same torch.optim SGD, Adam and AdamW as
// optimizer.h, over segments whose buffers live in device memory, with every segment of
// a step updated by ONE kernel launch. Built only where SX_HAVE_CUDA is defined; no
// CUDA type appears here (streams are void*, a cudaStream_t; null is the legacy
// default stream).
//
// Results: every element of every flavour equals, bit for bit, what reference_update()
// gives (the kernels round where the reference rounds, with the explicitly rounded
// intrinsics __fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn, never a fused multiply-add,
// and the per-segment constants come from the CPU's make_consts()). The optional cast
// of the updated fp32 master weight to bf16 or fp16 rounds to nearest even.
//
// Device discovery, device memory and the element-wise kernels are the cuda module's
// (cuda/runtime.h, cuda/elementwise.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "optim/device_passes.h"
#include "optim/optimizer.h"

namespace sx {
namespace optim {
namespace cuda {

// Where the updated fp32 master weights also go, cast, for the forward pass.
enum class ComputeDtype : int32_t { kNone = 0, kBf16 = 1, kFp16 = 2 };

// One segment: seg's pointers (param, grad, state) are device addresses; seg.hyper and
// seg.step are read on the host at launch time (the hyperparameters are copied, so
// they may change before the next step). compute_out, if compute_dtype is not kNone,
// is the device address of seg.n values of that type, written with the updated param.
struct CudaSegment {
    Segment seg;
    void *compute_out = nullptr;
    ComputeDtype compute_dtype = ComputeDtype::kNone;
};

// Gradient statistics of one launch, over every element of every segment:
// sumsq = sum of (grad*grad_scale)^2, accumulated in double; nonfinite = how many
// grad*grad_scale are inf or NaN. Per-block partial sums are added in a fixed order
// (no atomics), so the same inputs on the same device give the same bits every time.
struct GradStats {
    double sumsq = 0.0;
    double nonfinite = 0.0;
};

// Device memory for one stream's launches: the segment table (double-buffered in pinned
// host memory and on the device, so that the host can prepare step k+1 while step k
// runs), the per-block partial sums and the GradStats result. Bound to the device that
// is current at its first launch. One thread and one stream use a Workspace at a time;
// destroying it waits for its launches to finish.
class Workspace {
  public:
    Workspace();
    ~Workspace();
    Workspace(const Workspace &) = delete;
    Workspace &operator=(const Workspace &) = delete;

    // Enqueues on `stream` the update of all segments (segments with n == 0 are
    // skipped unread). With want_stats, the same pass also writes GradStats
    // (read them with read_stats, or on the device at stats_device()). Needs
    // hyper and the first state_slots(*hyper) state pointers of every segment with
    // n > 0; segments must not overlap. Returns SX_ERR_INVALID_ARGUMENT (nothing is
    // enqueued) for a missing pointer, a pointer not aligned to its element size or a
    // step < 1; SX_ERR_UNSUPPORTED where there is no device; SX_ERR_INTERNAL naming
    // the CUDA error for a failed launch. The caller's arrays are read during the call
    // only.
    Status fused_update(const CudaSegment *segs, size_t num_segs, float grad_scale, void *stream,
                        bool want_stats);

    // Enqueues GradStats of the segments' gradients alone (the norm for clipping and the
    // inf/NaN check for the loss scaler, before the update); reads nothing but grad.
    Status grad_stats(const CudaSegment *segs, size_t num_segs, float grad_scale, void *stream);

    // Device address of the GradStats of the last launch that computed them (two
    // doubles, sumsq then nonfinite), valid in stream order after that launch: an
    // all-reduce of two doubles (sum) gives the group's statistics. Null before the
    // first such launch.
    const double *stats_device() const;

    // Waits for `stream` and copies the GradStats of the last launch that computed
    // them to *out (SX_ERR_INVALID_STATE before the first).
    Status read_stats(void *stream, GradStats *out);

    // Blocks per launch on this device (the number of partial sums); 0 before the
    // first launch. Tests and benchmarks report it.
    unsigned grid_size() const;

    struct Impl;
    Impl *impl() const { return impl_; }  // for launch_plan.h's traffic_only

  private:
    Impl *impl_;
};

// Muon's Newton-Schulz iterations (muon.h's newton_schulz) on CUDA device `device`, as
// torch.optim.Muon runs them there: every product a bf16 matrix product through cuBLAS
// (fp32 sums in cuBLAS's order; each result, with addmm's epilogue, rounded to bf16
// once). u and out: the rows x cols matrix, row-major fp32, in device memory (out does
// not alias u); on `stream` (a cudaStream_t), waited for before it returns.
// SX_ERR_UNSUPPORTED where cuBLAS cannot be opened (libcublas.so.13, or the file
// SX_CUBLAS_LIBRARY names), saying so.
Status newton_schulz_cuda(int device, void *stream, const float *u, int64_t rows, int64_t cols, const Hyper &h,
                          float *out);
// Whether cuBLAS can be opened here (*why, if not null: why not).
bool cublas_available(std::string *why);

// The launcher of LAMB's and Adafactor's device passes (device_passes.h) on CUDA device
// `device`, on `stream` (a cudaStream_t; borrowed, it outlives the launcher). Each
// launch waits for the stream before it returns.
std::unique_ptr<PassLauncher> make_cuda_pass_launcher(int device, void *stream);

}  // namespace cuda
}  // namespace optim
}  // namespace sx
