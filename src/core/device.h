// Where a group keeps its buffers and runs its element-wise work on them: the host (the
// CPU kernels, split across the group's thread pool) or a CUDA device (the CUDA kernels,
// on the group's stream). The step, the conversions of 16-bit params and gradients, and
// the checkpoint's copies in and out go through DeviceOps, so that one orchestration
// serves both backends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/memory.h"
#include "base/status.h"
#include "optim/custom.h"
#include "optim/optimizer.h"
#include "optim/thread_pool.h"

namespace sx {
namespace core {

// Memory on a device, freed by its destructor.
class DeviceMemory {
  public:
    virtual ~DeviceMemory() = default;
    virtual void *data() const = 0;
    virtual size_t size() const = 0;
};

// One of a group's buffers: host memory or device memory, as its DeviceOps allocated it.
class Buffer {
  public:
    Buffer() = default;
    Buffer(Buffer &&) = default;
    Buffer &operator=(Buffer &&) = default;

    void *data() const { return device_ ? device_->data() : host_.data(); }
    template <typename T>
    T *as() const { return static_cast<T *>(data()); }
    size_t size() const { return device_ ? device_->size() : host_.size(); }
    bool empty() const { return data() == nullptr; }
    void reset() {
        host_.reset();
        device_.reset();
    }

    // Set by the DeviceOps that allocates (exactly one of them non-empty).
    HostBuffer host_;
    std::unique_ptr<DeviceMemory> device_;
};

// Every call is ordered after the calls before it on the same DeviceOps; a call that
// returns host data (to_host, sum_of_squares, fused_update's sumsq) waits for its result.
// Pointers are into buffers of this DeviceOps unless named host. One thread at a time,
// except that the copies (copy, to_host, from_host) may run on several: a load copies on
// up to three threads (the caller's, one that copies values aside on the host, and one
// that gathers), and a save copies into staging on its own thread while the trainer steps.
class DeviceOps {
  public:
    virtual ~DeviceOps() = default;
    // SX_DEVICE_CPU or SX_DEVICE_CUDA: where the buffers live.
    virtual int32_t device() const = 0;

    // `bytes` zero-filled into *out (replaced only on success); SX_ERR_OUT_OF_MEMORY
    // naming `what`. lazy: host pages are faulted in on first touch (see HostBuffer).
    // exchanged: host memory that this host's other ranks can read in place, where the
    // process's shared arena has room (HostBuffer::kExchanged); devices ignore it.
    virtual Status allocate(size_t bytes, const char *what, Buffer *out, bool lazy = false,
                            bool exchanged = false) = 0;
    virtual Status zero(void *p, size_t bytes) = 0;
    virtual Status copy(void *dst, const void *src, size_t bytes) = 0;
    virtual Status to_host(void *host_dst, const void *src, size_t bytes) = 0;
    virtual Status from_host(void *dst, const void *host_src, size_t bytes) = 0;

    // out[i] = (accumulate ? out[i] : 0) + float(in[i]) for n 16-bit values of dtype.
    virtual Status widen(int32_t dtype, const uint16_t *in, float *out, size_t n, bool accumulate) = 0;
    // out[i] = in[i] rounded to dtype (nearest even).
    virtual Status narrow(int32_t dtype, const float *in, uint16_t *out, size_t n) = 0;
    // p[i] = p[i] * s, rounded to dtype.
    virtual Status scale16(int32_t dtype, uint16_t *p, float s, size_t n) = 0;

    // optim.h's sum_of_squares and fused_update over segments of this device's buffers
    // (a segment's compute_out, if any, gets the updated value in compute_dtype).
    virtual Status sum_of_squares(const optim::Segment *segs, size_t n, float grad_scale, double *sumsq) = 0;
    virtual Status fused_update(const optim::Segment *segs, size_t n, float grad_scale, double *sumsq) = 0;
    // Custom optimizers (host only; elsewhere SX_ERR_UNSUPPORTED): optim/custom.h's
    // custom_update (*ok: whether every update succeeded) and its undo.
    virtual Status custom_update(const optim::Segment *segs, size_t n, float grad_scale, double *sumsq,
                                          optim::CustomFailure *failure, bool *ok) {
        (void)segs, (void)n, (void)grad_scale, (void)sumsq, (void)failure, (void)ok;
        return SX_ERROR(SX_ERR_UNSUPPORTED, "custom optimizers run on the CPU only");
    }
    virtual Status undo_double_buffered(const optim::Segment *segs, size_t n) {
        (void)segs, (void)n;
        return SX_ERROR(SX_ERR_UNSUPPORTED, "custom optimizers run on the CPU only");
    }

    // What follows is ordered after the work enqueued so far on the trainer's `stream`
    // (a cudaStream_t; null: the legacy default stream). The host has nothing to wait for.
    virtual Status wait_for(void *stream) {
        (void)stream;
        return Status::Ok();
    }
};

// The host: the CPU kernels over `pool` (borrowed; it outlives the DeviceOps).
std::unique_ptr<DeviceOps> make_host_ops(optim::ThreadPool *pool);

// CUDA device `device`, with a stream of its own: SX_ERR_UNSUPPORTED in a build without
// CUDA or where there is no device, SX_ERR_INVALID_ARGUMENT for an ordinal out of range.
Status make_cuda_ops(int device, std::unique_ptr<DeviceOps> *out);

// Whether this build has CUDA and the runtime finds a device here (SX_BACKEND_AUTO's
// choice).
bool cuda_device_present();

}  // namespace core
}  // namespace sx
