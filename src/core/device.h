// Where a group keeps its buffers and runs its element-wise work on them: the host (the
// CPU kernels, split across the group's thread pool) or a CUDA device (the CUDA kernels,
// on the group's stream). The step, the conversions of 16-bit params and gradients, and
// the checkpoint's copies in and out go through DeviceOps, so that one orchestration
// serves both backends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/memory.h"
#include "base/status.h"
#include "core/memory_budget.h"
#include "optim/custom.h"
#include "optim/optimizer.h"
#include "optim/param_passes.h"
#include "optim/thread_pool.h"

namespace sx {
namespace core {

// Memory a DeviceOps allocated other than as a plain HostBuffer (device memory, or host
// memory pinned for the device's copies), freed by its destructor.
class DeviceMemory {
  public:
    virtual ~DeviceMemory() = default;
    virtual void *data() const = 0;
    virtual size_t size() const = 0;
    // Whether it is the device's memory (false: host memory, e.g. pinned).
    virtual bool on_device() const { return true; }
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
    // Whether the bytes are the device's (sx_memory_stats_t.device_bytes counts them).
    bool on_device() const { return device_ && device_->on_device(); }
    void reset() {
        host_.reset();
        device_.reset();
        charge_.reset();
    }

    // Set by the DeviceOps that allocates (exactly one of them non-empty).
    HostBuffer host_;
    std::unique_ptr<DeviceMemory> device_;
    // Its bytes charged to a context's memory budget (memory_budget.h), given back with it.
    std::shared_ptr<void> charge_;
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
    // naming `what`, or naming the budget where a context's (set_budget) has no room for
    // them. lazy: host pages are faulted in on first touch (see HostBuffer).
    // exchanged: host memory that this host's other ranks can read in place, where the
    // process's shared arena has room (HostBuffer::kExchanged); devices ignore it.
    Status allocate(size_t bytes, const char *what, Buffer *out, bool lazy = false, bool exchanged = false) {
        std::shared_ptr<void> charge;
        if (budget_) SX_TRY(budget_->charge(bytes, what, &charge));
        SX_TRY(allocate_memory(bytes, what, out, lazy, exchanged));
        out->charge_ = std::move(charge);
        return Status::Ok();
    }
    // Every allocation from now on is charged to `budget` (null: none).
    void set_budget(std::shared_ptr<MemoryBudget> budget) { budget_ = std::move(budget); }
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
    // Whether sum_of_squares and fused_update read 16-bit gradients (a segment's grad16),
    // widening them as they go: a one-rank shard group's 16-bit gradients then reach the
    // update without a pass that widens them into fp32 first. The host's kernels do not.
    virtual bool reads_16bit_grads() const { return false; }

    // Whether the optimizer of row `spec` can keep its state here and update it: the host
    // runs every one; a CUDA device every built-in one (Muon where cuBLAS can be opened),
    // not custom optimizers, which call the trainer's functions on host memory.
    // SX_ERR_UNSUPPORTED saying why not.
    virtual Status check_runs(const optim::OptimizerSpec &spec) const {
        (void)spec;
        return Status::Ok();
    }
    // The passes of an optimizer of per-param sums (spec.passes, param_passes.h) over
    // segments of this DeviceOps's buffers: *run's passes read and write the segments here
    // (the blocks of sums handed to them are host memory), its row's own loops on the host.
    virtual Status start_param_passes(const optim::OptimizerSpec &spec, const optim::PassInput &in,
                                      std::unique_ptr<optim::ParamPassRun> *run) {
        *run = spec.passes->start(in);
        return Status::Ok();
    }

    // An optimizer of whole params (spec.whole_update, param_passes.h) over segments and
    // buffers of this DeviceOps (pieces: one per segment, of its n values): its first pass,
    // a whole param's update on the rank that owns it (u and out: its values), and its last
    // pass. Here: the row's own functions (the host's override shares the whole update
    // over its pool).
    virtual Status whole_first(const optim::OptimizerSpec &spec, const optim::Segment *segs, size_t n,
                               float grad_scale, float *const *pieces, double *grad_sumsq) {
        spec.whole_update->first(segs, n, grad_scale, pieces, grad_sumsq);
        return Status::Ok();
    }
    virtual Status whole_update(const optim::OptimizerSpec &spec, const float *u, const std::vector<int64_t> &shape,
                                const optim::Hyper &h, float *out) {
        spec.whole_update->whole(u, shape, h, nullptr, out);
        return Status::Ok();
    }
    virtual Status whole_apply(const optim::OptimizerSpec &spec, const optim::Segment *segs, size_t n,
                               const std::vector<int64_t> *const *shapes, const float *const *pieces) {
        spec.whole_update->apply(segs, n, shapes, pieces);
        return Status::Ok();
    }

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

    // Copies between this device and host memory that overlap what the caller does next
    // (an offloaded group's gradients down and params up): queued in order on the
    // device's copy engine for that direction (one each way, apart from the calls above),
    // *ticket naming the copy for wait_copy. The memory on both sides must stay as it is
    // until the copy is waited for. Where there is no engine (the host), the copy is done
    // when the call returns, and *ticket is 0.
    virtual Status to_host_async(void *host_dst, const void *src, size_t bytes, uint64_t *ticket) {
        *ticket = 0;
        return to_host(host_dst, src, bytes);
    }
    virtual Status from_host_async(void *dst, const void *host_src, size_t bytes, uint64_t *ticket) {
        *ticket = 0;
        return from_host(dst, host_src, bytes);
    }
    // Returns once copy `ticket` (and those queued before it in its direction) is done, or
    // with its failure; 0 returns at once. Any thread.
    virtual Status wait_copy(uint64_t ticket) {
        (void)ticket;
        return Status::Ok();
    }

    // Whether p points into this device's memory (false on the host).
    virtual bool holds(const void *p) const {
        (void)p;
        return false;
    }
    // Which device this is, the same string in every process that uses it (a CUDA
    // device's UUID); "" for the host. Ranks on one host whose devices say the same share
    // one device, which NCCL cannot put two ranks on.
    virtual std::string identity() const { return ""; }

    // What follows is ordered after the work enqueued so far on the trainer's `stream`
    // (a cudaStream_t; null: the legacy default stream). The host has nothing to wait for.
    virtual Status wait_for(void *stream) {
        (void)stream;
        return Status::Ok();
    }

  protected:
    // allocate() without the budget: each DeviceOps's own.
    virtual Status allocate_memory(size_t bytes, const char *what, Buffer *out, bool lazy, bool exchanged) = 0;

  private:
    std::shared_ptr<MemoryBudget> budget_;
};

// How a host DeviceOps gets its memory where it is not a plain HostBuffer (pinned for a
// device's copies; checked by a simulated device). allocate has DeviceOps::allocate's
// contract.
class HostAllocator {
  public:
    virtual ~HostAllocator() = default;
    virtual Status allocate(size_t bytes, const char *what, Buffer *out) = 0;
    // Whether p lies in memory of this allocator's device (a simulated device's check that
    // host work never touches device memory); false where nothing can tell.
    virtual bool is_device_memory(const void *p) const {
        (void)p;
        return false;
    }
    // Called by the host DeviceOps at each call it runs (a simulated device counts the
    // ones made while its copies were in flight).
    virtual void note_host_work() const {}
};

// The host: the CPU kernels over `pool` (borrowed; it outlives the DeviceOps). With
// `allocator` (shared), its buffers come from it, and where the allocator can tell device
// memory from host memory, every call checks that it is given host memory alone
// (SX_ERR_INTERNAL naming the call otherwise).
std::unique_ptr<DeviceOps> make_host_ops(optim::ThreadPool *pool,
                                         std::shared_ptr<HostAllocator> allocator = nullptr);

// Host memory pinned (page-locked) for CUDA device `device`'s copies, which then run at
// the link's speed and may overlap the device's work: an offloaded group's masters,
// optimizer state and staging (SX_OFFLOAD_STATE). In a build without CUDA,
// SX_ERR_UNSUPPORTED.
Status make_pinned_allocator(int device, std::shared_ptr<HostAllocator> *out);

// A simulated device (tests of the device paths without a GPU; SX_SIMULATED_DEVICE): its
// memory is host memory of its own, registered so that every call can check that it is
// handed the device's memory where a CUDA device would need it (a copy's device side, a
// kernel's operands) and host memory elsewhere; its copies run on a copy thread of its
// own, each after `copy_delay_us` microseconds (a link's latency, to move the timing of
// the work around them). Kernels run on the host's kernels over `pool`. device() is
// SX_DEVICE_CUDA. *host gets the host allocator that goes with it: the host memory of an
// offloaded group's state, checked to be outside the device.
struct SimulatedDevice {
    int copy_delay_us = 0;
    // Its ranks exchange as ranks on separate devices would, through NCCL (whose memory
    // rules a CPU communicator then keeps), rather than as ranks that share one.
    bool nccl = false;
};
std::unique_ptr<DeviceOps> make_simulated_ops(optim::ThreadPool *pool, const SimulatedDevice &settings,
                                              std::shared_ptr<HostAllocator> *host);
// SX_SIMULATED_DEVICE's setting: *on where it is set and not "0": "1", or a comma-separated
// list of "delay_us=N" (a copy delay of N microseconds) and "nccl" (SimulatedDevice::nccl).
void simulated_device_from_env(bool *on, SimulatedDevice *settings);
// Calls of the simulated devices' host ops so far (an offloaded group's update), and those
// made while one of the devices' copies was queued or running: the overlap of the host's
// work with the copies, as tests see it. Any thread.
void simulated_overlap_counts(uint64_t *host_calls, uint64_t *overlapped);

// The elements of 16-bit gradients the simulated devices' sums and updates widened as
// they read them (DeviceOps::reads_16bit_grads), so far. Any thread.
uint64_t simulated_widened_grads();

// CUDA device `device`, with a stream of its own: SX_ERR_UNSUPPORTED in a build without
// CUDA or where there is no device, SX_ERR_INVALID_ARGUMENT for an ordinal out of range.
Status make_cuda_ops(int device, std::unique_ptr<DeviceOps> *out);

// Whether this build has CUDA and the runtime finds a device here (SX_BACKEND_AUTO's
// choice).
bool cuda_device_present();

}  // namespace core
}  // namespace sx
