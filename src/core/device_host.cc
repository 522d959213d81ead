// DeviceOps on the host: memcpy and memset, base/half.h's conversions and optim's CPU
// kernels, each split across the group's thread pool.
#include <algorithm>
#include <cstring>
#include <functional>
#include <initializer_list>

#include "base/half.h"
#include "core/device.h"

namespace sx {
namespace core {
namespace {

class HostOps final : public DeviceOps {
  public:
    HostOps(optim::ThreadPool *pool, std::shared_ptr<HostAllocator> allocator)
        : pool_(pool), allocator_(std::move(allocator)) {}

    int32_t device() const override { return SX_DEVICE_CPU; }

    Status allocate_memory(size_t bytes, const char *what, Buffer *out, bool lazy, bool exchanged) override {
        if (allocator_) return allocator_->allocate(bytes, what, out);
        HostBuffer b;
        SX_TRY(b.allocate(bytes, what, lazy ? HostBuffer::kLazy : HostBuffer::kPopulate,
                          exchanged ? HostBuffer::kExchanged : HostBuffer::kPrivate));
        out->device_.reset();
        out->host_ = std::move(b);
        return Status::Ok();
    }

    Status zero(void *p, size_t bytes) override {
        SX_TRY(check("zero", {p}));
        char *c = static_cast<char *>(p);
        parallel_for(bytes, [&](size_t b, size_t e) { std::memset(c + b, 0, e - b); });
        return Status::Ok();
    }
    // Copies run on the calling thread alone: a checkpoint's load copies on two threads
    // at once, and the pool serves one caller at a time.
    Status copy(void *dst, const void *src, size_t bytes) override {
        SX_TRY(check("copy", {dst, src}));
        return copy_bytes(dst, src, bytes);
    }
    Status to_host(void *dst, const void *src, size_t bytes) override {
        SX_TRY(check("to_host", {dst, src}));
        return copy_bytes(dst, src, bytes);
    }
    Status from_host(void *dst, const void *src, size_t bytes) override {
        SX_TRY(check("from_host", {dst, src}));
        return copy_bytes(dst, src, bytes);
    }

    Status widen(int32_t dtype, const uint16_t *in, float *out, size_t n, bool accumulate) override {
        SX_TRY(check("widen", {in, out}));
        parallel_for(n, [&](size_t b, size_t e) {
            if (accumulate) {
                half::add_to_f32(dtype, in + b, out + b, e - b);
            } else {
                half::to_f32(dtype, in + b, out + b, e - b);
            }
        });
        return Status::Ok();
    }
    Status narrow(int32_t dtype, const float *in, uint16_t *out, size_t n) override {
        SX_TRY(check("narrow", {in, out}));
        parallel_for(n, [&](size_t b, size_t e) { half::from_f32(dtype, in + b, out + b, e - b); });
        return Status::Ok();
    }
    Status scale16(int32_t dtype, uint16_t *p, float s, size_t n) override {
        SX_TRY(check("scale16", {p}));
        parallel_for(n, [&](size_t b, size_t e) { half::scale(dtype, p + b, s, e - b); });
        return Status::Ok();
    }

    Status sum_of_squares(const optim::Segment *segs, size_t n, float grad_scale, double *sumsq) override {
        SX_TRY(check_segments("sum_of_squares", segs, n));
        *sumsq = optim::sum_of_squares(segs, n, grad_scale, pool_, optim::Isa::kAuto);
        return Status::Ok();
    }
    Status custom_update(const optim::Segment *segs, size_t n, float grad_scale, double *sumsq,
                                  optim::CustomFailure *failure, bool *ok) override {
        SX_TRY(check_segments("custom_update", segs, n));
        *ok = optim::custom_update(segs, n, grad_scale, pool_, sumsq, failure);
        return Status::Ok();
    }
    Status undo_double_buffered(const optim::Segment *segs, size_t n) override {
        SX_TRY(check_segments("undo_double_buffered", segs, n));
        optim::undo_double_buffered(segs, n, pool_);
        return Status::Ok();
    }
    Status fused_update(const optim::Segment *segs, size_t n, float grad_scale, double *sumsq) override {
        SX_TRY(check_segments("fused_update", segs, n));
        optim::fused_update(segs, n, grad_scale, pool_, optim::Isa::kAuto, sumsq);
        return Status::Ok();
    }

    Status whole_update(const optim::OptimizerSpec &spec, const float *u, const std::vector<int64_t> &shape,
                        const optim::Hyper &h, float *out) override {
        SX_TRY(check("whole_update", {u, out}));
        spec.whole_update->whole(u, shape, h, pool_, out);
        return Status::Ok();
    }

  private:
    // Where the allocator tells device memory apart (a simulated device's): none of `ps` is
    // device memory, which host work must never touch.
    Status check(const char *call, std::initializer_list<const void *> ps) const {
        if (!allocator_) return Status::Ok();
        allocator_->note_host_work();
        for (const void *p : ps)
            SX_CHECK(!p || !allocator_->is_device_memory(p), SX_ERR_INTERNAL,
                     "the host's %s was handed device memory (%p)", call, p);
        return Status::Ok();
    }
    Status check_segments(const char *call, const optim::Segment *segs, size_t n) const {
        for (size_t i = 0; i < n; ++i)
            SX_CHECK(segs[i].grad16 == nullptr, SX_ERR_INTERNAL,
                     "the host's %s was handed 16-bit gradients, which it does not read", call);
        if (!allocator_) return Status::Ok();
        for (size_t i = 0; i < n; ++i) {
            const optim::Segment &g = segs[i];
            SX_TRY(check(call, {g.param, g.grad, g.compute_out, g.zero_grad, g.undo}));
            for (int k = 0; k < 3; ++k) SX_TRY(check(call, {g.state[k], g.state_in[k]}));
        }
        return Status::Ok();
    }

    static Status copy_bytes(void *dst, const void *src, size_t bytes) {
        if (bytes) std::memcpy(dst, src, bytes);
        return Status::Ok();
    }

    // Runs fn(begin, end) over [0, n) split across the pool in cache-line multiples.
    void parallel_for(size_t n, const std::function<void(size_t, size_t)> &fn) {
        const int threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(pool_->size()), n / 16384 + 1));
        if (threads <= 1) {
            if (n) fn(0, n);
            return;
        }
        const size_t per = (n / static_cast<size_t>(threads) + 63) / 64 * 64;
        pool_->run([&](int t) {
            if (t >= threads) return;
            const size_t b = std::min(n, per * static_cast<size_t>(t)), e = std::min(n, b + per);
            if (e > b) fn(b, e);
        });
    }

    optim::ThreadPool *pool_;
    std::shared_ptr<HostAllocator> allocator_;
};

}  // namespace

std::unique_ptr<DeviceOps> make_host_ops(optim::ThreadPool *pool, std::shared_ptr<HostAllocator> allocator) {
    return std::unique_ptr<DeviceOps>(new HostOps(pool, std::move(allocator)));
}

}  // namespace core
}  // namespace sx
