// DeviceOps on a CUDA device: buffers from cudaMalloc, work on the group's own stream
// (cuda/elementwise.h's and optim/cuda_kernels.h's kernels), every call finished before
// it returns, and the calling thread's current device as it was. Calls may come from
// several threads (a save's copy into staging runs on the I/O thread): the runtime orders
// them on the stream.
//
// Why each call waits for its stream: the collectives (NCCL, on its own stream) read
// what these calls write, and return only once their own work has finished, so a step
// is ordered on the host, call after call. Waiting on a stream, never on the device.
#include <cuda_runtime.h>

#include <cmath>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <string>
#include <vector>

#include "core/device.h"
#include "cuda/device_scope.h"
#include "cuda/elementwise.h"
#include "cuda/runtime.h"
#include "cuda/status.h"
#include "cuda/stream.h"
#include "optim/cuda_kernels.h"

namespace sx {
namespace core {
namespace {

class CudaMemory final : public DeviceMemory {
  public:
    void *data() const override { return buffer.data(); }
    size_t size() const override { return buffer.size(); }

    cuda::DeviceBuffer buffer;
};

class CudaOps final : public DeviceOps {
  public:
    explicit CudaOps(int device) : device_(device) {}

    Status init() {
        SX_TRY(copies_[0].stream.create(device_, "creating the group's stream for copies to the host"));
        SX_TRY(copies_[1].stream.create(device_, "creating the group's stream for copies to the device"));
        return stream_.create(device_, "creating the group's stream");
    }
    ~CudaOps() override {
        for (CopyQueue &q : copies_) q.events.clear();
    }

    int32_t device() const override { return SX_DEVICE_CUDA; }

    Status allocate_memory(size_t bytes, const char *what, Buffer *out, bool lazy, bool exchanged) override {
        (void)lazy, (void)exchanged;
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        std::unique_ptr<CudaMemory> m(new CudaMemory());
        SX_TRY(m->buffer.allocate(bytes, what));
        if (bytes) {
            cudaError_t z = cudaMemsetAsync(m->buffer.data(), 0, bytes, stream_.get());
            if (z == cudaSuccess) z = cudaStreamSynchronize(stream_.get());
            if (z != cudaSuccess)
                return SX_ERROR(SX_ERR_INTERNAL, "zeroing new device memory for %s: %s", what, cudaGetErrorString(z));
        }
        out->host_.reset();
        out->device_ = std::move(m);
        return Status::Ok();
    }

    Status zero(void *p, size_t bytes) override {
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        if (bytes) SX_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, stream_.get()), "zeroing device memory");
        return finish("zeroing device memory");
    }
    Status copy(void *dst, const void *src, size_t bytes) override {
        return copy_kind(dst, src, bytes, cudaMemcpyDeviceToDevice, "copying within the device");
    }
    Status to_host(void *dst, const void *src, size_t bytes) override {
        return copy_kind(dst, src, bytes, cudaMemcpyDeviceToHost, "copying from the device");
    }
    Status from_host(void *dst, const void *src, size_t bytes) override {
        return copy_kind(dst, src, bytes, cudaMemcpyHostToDevice, "copying to the device");
    }

    Status widen(int32_t dtype, const uint16_t *in, float *out, size_t n, bool accumulate) override {
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        SX_TRY(cuda::widen(dtype, in, out, n, 1.0f, accumulate, stream_.get()));
        return finish("widening 16-bit values");
    }
    Status narrow(int32_t dtype, const float *in, uint16_t *out, size_t n) override {
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        SX_TRY(cuda::narrow(dtype, in, out, n, stream_.get()));
        return finish("rounding to 16 bits");
    }
    Status scale16(int32_t dtype, uint16_t *p, float s, size_t n) override {
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        SX_TRY(cuda::scale16(dtype, p, s, n, stream_.get()));
        return finish("scaling 16-bit values");
    }

    Status sum_of_squares(const optim::Segment *segs, size_t n, float grad_scale, double *sumsq) override {
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        const std::vector<optim::cuda::CudaSegment> cs = convert(segs, n);
        SX_TRY(workspace_.grad_stats(cs.data(), cs.size(), grad_scale, stream_.get()));
        return read(sumsq);
    }
    Status fused_update(const optim::Segment *segs, size_t n, float grad_scale, double *sumsq) override {
        for (size_t i = 0; i < n; ++i)
            SX_CHECK(segs[i].zero_grad == nullptr, SX_ERR_INTERNAL,
                     "the CUDA update does not zero gradients; the step zeroes them itself");
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        const std::vector<optim::cuda::CudaSegment> cs = convert(segs, n);
        SX_TRY(workspace_.fused_update(cs.data(), cs.size(), grad_scale, stream_.get(), sumsq != nullptr));
        if (sumsq) return read(sumsq);
        return finish("the optimizer update");
    }

    bool reads_16bit_grads() const override { return true; }

    // LAMB's and Adafactor's passes run as the device's kernels (optim/device_passes.h),
    // and Muon's, its Newton-Schulz iterations through cuBLAS where it can be opened.
    Status check_runs(const optim::OptimizerSpec &spec) const override {
        SX_CHECK(spec.custom == nullptr, SX_ERR_UNSUPPORTED, "the custom optimizer '%s' runs on the host only",
                 spec.name);
        std::string why;
        SX_CHECK(spec.needs != optim::Needs::kWholeParam || optim::cuda::cublas_available(&why), SX_ERR_UNSUPPORTED,
                 "%s", why.c_str());
        return Status::Ok();
    }
    Status whole_first(const optim::OptimizerSpec &spec, const optim::Segment *segs, size_t n, float grad_scale,
                       float *const *pieces, double *grad_sumsq) override {
        SX_CHECK(spec.kind == optim::Kind::kMuon, SX_ERR_UNSUPPORTED, "%s does not run on a CUDA device", spec.name);
        const auto launcher = optim::cuda::make_cuda_pass_launcher(device_, stream_.get());
        return optim::device_muon_momentum(*launcher, segs, n, grad_scale, pieces, grad_sumsq);
    }
    Status whole_update(const optim::OptimizerSpec &spec, const float *u, const std::vector<int64_t> &shape,
                        const optim::Hyper &h, float *out) override {
        SX_CHECK(spec.kind == optim::Kind::kMuon, SX_ERR_UNSUPPORTED, "%s does not run on a CUDA device", spec.name);
        return optim::cuda::newton_schulz_cuda(device_, stream_.get(), u, shape[0], shape[1], h, out);
    }
    Status whole_apply(const optim::OptimizerSpec &spec, const optim::Segment *segs, size_t n,
                       const std::vector<int64_t> *const *shapes, const float *const *pieces) override {
        SX_CHECK(spec.kind == optim::Kind::kMuon, SX_ERR_UNSUPPORTED, "%s does not run on a CUDA device", spec.name);
        const auto launcher = optim::cuda::make_cuda_pass_launcher(device_, stream_.get());
        return optim::device_muon_apply(*launcher, segs, n, shapes, pieces);
    }
    Status start_param_passes(const optim::OptimizerSpec &spec, const optim::PassInput &in,
                              std::unique_ptr<optim::ParamPassRun> *run) override {
        return optim::start_device_passes(spec.kind, in, optim::cuda::make_cuda_pass_launcher(device_, stream_.get()),
                                          run);
    }

    // Tickets: the queue's copy number, times two, plus 1 for the copies to the device. Each
    // copy records an event after it on its direction's stream, destroyed once waited for.
    Status to_host_async(void *dst, const void *src, size_t bytes, uint64_t *ticket) override {
        return enqueue(0, dst, src, bytes, cudaMemcpyDeviceToHost, "copying from the device", ticket);
    }
    Status from_host_async(void *dst, const void *src, size_t bytes, uint64_t *ticket) override {
        return enqueue(1, dst, src, bytes, cudaMemcpyHostToDevice, "copying to the device", ticket);
    }
    // The wait runs outside the queue's lock, so that copies can be queued meanwhile (the
    // next unit's, while this one's is awaited). The copies of one direction run in order
    // on its stream: once copy n is done, so are those before it, and their events go.
    Status wait_copy(uint64_t ticket) override {
        if (ticket == 0) return Status::Ok();
        CopyQueue &q = copies_[ticket & 1];
        const uint64_t n = ticket / 2;
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        std::shared_ptr<CopyEvent> ev;
        {
            std::lock_guard<std::mutex> lock(q.mu);
            for (const auto &e : q.events)
                if (e->number == n) ev = e;
        }
        // Gone from the queue: another wait saw it done.
        if (!ev) return Status::Ok();
        SX_CUDA_TRY(cudaEventSynchronize(ev->event), "waiting for a copy between the device and the host");
        std::lock_guard<std::mutex> lock(q.mu);
        while (!q.events.empty() && q.events.front()->number <= n) q.events.pop_front();
        return Status::Ok();
    }

    bool holds(const void *p) const override {
        cudaPointerAttributes a;
        if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
            (void)cudaGetLastError();  // not the runtime's: host memory
            return false;
        }
        return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
    }
    std::string identity() const override {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess) {
            (void)cudaGetLastError();
            return "cuda:" + std::to_string(device_);
        }
        static const char kHex[] = "0123456789abcdef";
        std::string id = "cuda:";
        for (unsigned char c : prop.uuid.bytes) {
            id += kHex[c >> 4];
            id += kHex[c & 15];
        }
        return id;
    }

    Status wait_for(void *stream) override {
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        // The trainer's work on its stream (the legacy default stream if none is given)
        // comes first: an event on it that this group's stream waits for.
        cudaStream_t theirs = stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
        cudaEvent_t ev = nullptr;
        SX_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "creating an event");
        cudaError_t e = cudaEventRecord(ev, theirs);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_.get(), ev, 0);
        if (e == cudaSuccess) e = cudaStreamSynchronize(stream_.get());
        cudaEventDestroy(ev);
        SX_CUDA_TRY(e, "waiting for the trainer's stream");
        return Status::Ok();
    }

  private:
    // The event recorded after copy `number` of a direction, destroyed with the last
    // reference to it (a wait may hold one outside the queue's lock).
    struct CopyEvent {
        uint64_t number = 0;
        cudaEvent_t event = nullptr;
        ~CopyEvent() {
            if (event) cudaEventDestroy(event);
        }
    };
    // One direction's copies: their stream, and an event after each copy not yet waited for.
    struct CopyQueue {
        cuda::OwnedStream stream;
        std::mutex mu;
        uint64_t submitted = 0;
        std::deque<std::shared_ptr<CopyEvent>> events;
    };
    Status enqueue(int dir, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *what,
                   uint64_t *ticket) {
        CopyQueue &q = copies_[dir];
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        std::lock_guard<std::mutex> lock(q.mu);
        auto ev = std::make_shared<CopyEvent>();
        SX_CUDA_TRY(cudaEventCreateWithFlags(&ev->event, cudaEventDisableTiming), "creating an event");
        if (bytes) SX_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, q.stream.get()), what);
        SX_CUDA_TRY(cudaEventRecord(ev->event, q.stream.get()), what);
        ev->number = ++q.submitted;
        q.events.push_back(std::move(ev));
        *ticket = q.submitted * 2 + static_cast<uint64_t>(dir);
        return Status::Ok();
    }

    Status finish(const char *what) { return stream_.synchronize(what); }
    Status copy_kind(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *what) {
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        if (bytes) SX_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, stream_.get()), what);
        return finish(what);
    }
    // The sum of squares, inf where any gradient was not finite (as on the host, where
    // such a value makes the sum inf or NaN).
    Status read(double *sumsq) {
        optim::cuda::GradStats st;
        SX_TRY(workspace_.read_stats(stream_.get(), &st));
        *sumsq = st.nonfinite > 0 && std::isfinite(st.sumsq) ? INFINITY : st.sumsq;
        return Status::Ok();
    }
    static std::vector<optim::cuda::CudaSegment> convert(const optim::Segment *segs, size_t n) {
        using optim::cuda::ComputeDtype;
        std::vector<optim::cuda::CudaSegment> out(n);
        for (size_t i = 0; i < n; ++i) {
            out[i].seg = segs[i];
            out[i].compute_out = segs[i].compute_out;
            out[i].compute_dtype = segs[i].compute_dtype == SX_DTYPE_BF16  ? ComputeDtype::kBf16
                                   : segs[i].compute_dtype == SX_DTYPE_F16 ? ComputeDtype::kFp16
                                                                           : ComputeDtype::kNone;
            out[i].seg.compute_out = nullptr;  // the CUDA kernel takes it from the CudaSegment
            out[i].seg.compute_dtype = 0;
        }
        return out;
    }

    const int device_;
    optim::cuda::Workspace workspace_;
    CopyQueue copies_[2];  // to the host, to the device
    // Declared last, so destroyed first: waited for before the workspace is freed.
    cuda::OwnedStream stream_;
};

// Host memory registered with the CUDA runtime (page-locked), so that the device's copies
// from and to it run at the link's speed and asynchronously.
class PinnedMemory final : public DeviceMemory {
  public:
    ~PinnedMemory() override {
        if (registered) cudaHostUnregister(buffer.data());
    }
    void *data() const override { return buffer.data(); }
    size_t size() const override { return buffer.size(); }
    bool on_device() const override { return false; }

    HostBuffer buffer;
    bool registered = false;
};

class PinnedAllocator final : public HostAllocator {
  public:
    explicit PinnedAllocator(int device) : device_(device) {}

    Status allocate(size_t bytes, const char *what, Buffer *out) override {
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        std::unique_ptr<PinnedMemory> m(new PinnedMemory());
        SX_TRY(m->buffer.allocate(bytes, what));
        if (bytes) {
            const cudaError_t e = cudaHostRegister(m->buffer.data(), bytes, cudaHostRegisterDefault);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "pinning %zu bytes of host memory for %s: %s", bytes, what,
                                cudaGetErrorString(e));
            }
            m->registered = true;
        }
        out->host_.reset();
        out->device_ = std::move(m);
        return Status::Ok();
    }

  private:
    const int device_;
};

}  // namespace

Status make_pinned_allocator(int device, std::shared_ptr<HostAllocator> *out) {
    out->reset(new PinnedAllocator(device));
    return Status::Ok();
}

bool cuda_device_present() {
    std::string why;
    return cuda::device_available(&why);
}

Status make_cuda_ops(int device, std::unique_ptr<DeviceOps> *out) {
    std::string why;
    SX_CHECK(cuda::device_available(&why), SX_ERR_UNSUPPORTED, "SX_BACKEND_CUDA needs a CUDA device: %s",
             why.c_str());
    const int count = cuda::device_count();
    SX_CHECK_ARG(device >= 0 && device < count, "device_ordinal %d is not a CUDA device here (%d found)", device,
                 count);
    std::unique_ptr<CudaOps> ops(new CudaOps(device));
    SX_TRY(ops->init());
    *out = std::move(ops);
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
