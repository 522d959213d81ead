// A simulated device (device.h, make_simulated_ops): the device paths of a CUDA group
// (copies in and out, kernels on device buffers, an offloaded group's host state beside
// them) run on the host, in memory of the device's own that every call checks it is
// handed where a CUDA device would need it. What a real device would reject (a host
// pointer handed to a kernel, a copy's direction wrong, host work on device memory) fails
// here with SX_ERR_INTERNAL naming the call, so the CPU suite catches it.
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/half.h"
#include "base/log.h"
#include "core/device.h"
#include "optim/device_passes.h"
#include "optim/state_codec.h"

namespace sx {
namespace core {
namespace {

// Every simulated device's memory in this process (ranks that are threads share it):
// begin -> end.
class Registry {
  public:
    void add(const void *p, size_t bytes) {
        std::lock_guard<std::mutex> lock(mu_);
        ranges_[reinterpret_cast<uintptr_t>(p)] = reinterpret_cast<uintptr_t>(p) + bytes;
    }
    void remove(const void *p) {
        std::lock_guard<std::mutex> lock(mu_);
        ranges_.erase(reinterpret_cast<uintptr_t>(p));
    }
    bool contains(const void *p) const {
        const uintptr_t a = reinterpret_cast<uintptr_t>(p);
        std::lock_guard<std::mutex> lock(mu_);
        auto it = ranges_.upper_bound(a);
        if (it == ranges_.begin()) return false;
        --it;
        return a >= it->first && a < it->second;
    }

  private:
    mutable std::mutex mu_;
    std::map<uintptr_t, uintptr_t> ranges_;
};

Registry &registry() {
    static Registry *r = new Registry();  // never destroyed: buffers may outlive statics
    return *r;
}

class SimulatedMemory final : public DeviceMemory {
  public:
    ~SimulatedMemory() override {
        if (buffer.data()) registry().remove(buffer.data());
    }
    void *data() const override { return buffer.data(); }
    size_t size() const override { return buffer.size(); }

    HostBuffer buffer;
};

// One thread that runs one direction's copies in the order given, each after the delay.
class CopyEngine {
  public:
    explicit CopyEngine(int delay_us) : delay_us_(delay_us), thread_([this] { run(); }) {}
    ~CopyEngine() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    // Queues the copy after those before it; returns its number (from 1).
    uint64_t submit(void *dst, const void *src, size_t bytes) {
        std::lock_guard<std::mutex> lock(mu_);
        jobs_.push_back({dst, src, bytes});
        cv_.notify_all();
        return ++submitted_;
    }
    // Returns once copy `ticket` is done.
    void wait(uint64_t ticket) {
        std::unique_lock<std::mutex> lock(mu_);
        done_cv_.wait(lock, [&] { return finished_ >= ticket; });
    }
    void copy(void *dst, const void *src, size_t bytes) { wait(submit(dst, src, bytes)); }
    // Whether a copy is queued or running now.
    bool busy() const {
        std::lock_guard<std::mutex> lock(mu_);
        return finished_ < submitted_;
    }

  private:
    struct Job {
        void *dst;
        const void *src;
        size_t bytes;
    };
    void run() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
            if (jobs_.empty() && stop_) return;
            const Job job = jobs_.front();
            jobs_.pop_front();
            lock.unlock();
            if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
            if (job.bytes) std::memcpy(job.dst, job.src, job.bytes);
            lock.lock();
            ++finished_;
            done_cv_.notify_all();
        }
    }

    const int delay_us_;
    mutable std::mutex mu_;
    std::condition_variable cv_, done_cv_;
    std::deque<Job> jobs_;
    bool stop_ = false;
    uint64_t finished_ = 0, submitted_ = 0;
    std::thread thread_;
};

// Host work done while a simulated device's copy was in flight (overlap_counts): what a
// test of the offloaded step's overlap asks.
std::atomic<uint64_t> g_host_calls{0}, g_host_calls_overlapped{0};
// Elements of 16-bit gradients widened for the sums and updates (simulated_widened_grads).
std::atomic<uint64_t> g_widened{0};
// The engines of every simulated device, for SimulatedHost's question "is a copy running?".
std::mutex g_engines_mu;
std::set<const CopyEngine *> g_engines;

bool any_copy_in_flight() {
    std::lock_guard<std::mutex> lock(g_engines_mu);
    for (const CopyEngine *e : g_engines)
        if (e->busy()) return true;
    return false;
}

// The host memory beside the device (an offloaded group's state): plain host buffers,
// told apart from the device's.
class SimulatedHost final : public HostAllocator {
  public:
    Status allocate(size_t bytes, const char *what, Buffer *out) override {
        HostBuffer b;
        SX_TRY(b.allocate(bytes, what));
        out->device_.reset();
        out->host_ = std::move(b);
        return Status::Ok();
    }
    bool is_device_memory(const void *p) const override { return registry().contains(p); }
    void note_host_work() const override {
        ++g_host_calls;
        if (any_copy_in_flight()) ++g_host_calls_overlapped;
    }
};

class SimulatedOps final : public DeviceOps {
  public:
    SimulatedOps(optim::ThreadPool *pool, const SimulatedDevice &settings)
        : kernels_(make_host_ops(pool)), down_(settings.copy_delay_us), up_(settings.copy_delay_us) {
        std::lock_guard<std::mutex> lock(g_engines_mu);
        g_engines.insert(&down_);
        g_engines.insert(&up_);
    }
    ~SimulatedOps() override {
        std::lock_guard<std::mutex> lock(g_engines_mu);
        g_engines.erase(&down_);
        g_engines.erase(&up_);
    }

    int32_t device() const override { return SX_DEVICE_CUDA; }

    Status allocate_memory(size_t bytes, const char *what, Buffer *out, bool lazy, bool exchanged) override {
        (void)lazy, (void)exchanged;  // a device's memory: never lazy, never exchanged
        std::unique_ptr<SimulatedMemory> m(new SimulatedMemory());
        SX_TRY(m->buffer.allocate(bytes, what));
        if (bytes) registry().add(m->buffer.data(), bytes);
        out->host_.reset();
        out->device_ = std::move(m);
        return Status::Ok();
    }

    Status zero(void *p, size_t bytes) override {
        SX_TRY(on_device("zero", {p}));
        return kernels_->zero(p, bytes);
    }
    Status copy(void *dst, const void *src, size_t bytes) override {
        SX_TRY(on_device("copy", {dst, src}));
        down_.copy(dst, src, bytes);
        return Status::Ok();
    }
    Status to_host(void *dst, const void *src, size_t bytes) override {
        uint64_t ticket = 0;
        SX_TRY(to_host_async(dst, src, bytes, &ticket));
        return wait_copy(ticket);
    }
    Status from_host(void *dst, const void *src, size_t bytes) override {
        uint64_t ticket = 0;
        SX_TRY(from_host_async(dst, src, bytes, &ticket));
        return wait_copy(ticket);
    }
    // Tickets: the engine's copy number, times two, plus 1 for the copies up.
    Status to_host_async(void *dst, const void *src, size_t bytes, uint64_t *ticket) override {
        SX_TRY(on_device("to_host's source", {src}));
        SX_TRY(on_host("to_host's destination", dst));
        *ticket = down_.submit(dst, src, bytes) * 2;
        return Status::Ok();
    }
    Status from_host_async(void *dst, const void *src, size_t bytes, uint64_t *ticket) override {
        SX_TRY(on_device("from_host's destination", {dst}));
        SX_TRY(on_host("from_host's source", src));
        *ticket = up_.submit(dst, src, bytes) * 2 + 1;
        return Status::Ok();
    }
    Status wait_copy(uint64_t ticket) override {
        if (ticket != 0) (ticket & 1 ? up_ : down_).wait(ticket / 2);
        return Status::Ok();
    }

    Status widen(int32_t dtype, const uint16_t *in, float *out, size_t n, bool accumulate) override {
        SX_TRY(on_device("widen", {in, out}));
        return kernels_->widen(dtype, in, out, n, accumulate);
    }
    Status narrow(int32_t dtype, const float *in, uint16_t *out, size_t n) override {
        SX_TRY(on_device("narrow", {in, out}));
        return kernels_->narrow(dtype, in, out, n);
    }
    Status scale16(int32_t dtype, uint16_t *p, float s, size_t n) override {
        SX_TRY(on_device("scale16", {p}));
        return kernels_->scale16(dtype, p, s, n);
    }
    bool holds(const void *p) const override { return registry().contains(p); }
    // One simulated device per process and host: its ranks always share it.
    std::string identity() const override { return "simulated"; }

    // As a CUDA device, the sums and the update read 16-bit gradients: here widened into
    // host memory of the call's own first (the host's kernels read fp32 alone).
    bool reads_16bit_grads() const override { return true; }
    Status sum_of_squares(const optim::Segment *segs, size_t n, float grad_scale, double *sumsq) override {
        SX_TRY(segments_on_device("sum_of_squares", segs, n));
        Widened w(segs, n);
        return kernels_->sum_of_squares(w.segs.data(), n, grad_scale, sumsq);
    }
    Status fused_update(const optim::Segment *segs, size_t n, float grad_scale, double *sumsq) override {
        // As the CUDA update: the step zeroes the gradients itself.
        for (size_t i = 0; i < n; ++i)
            SX_CHECK(segs[i].zero_grad == nullptr, SX_ERR_INTERNAL,
                     "the device's update does not zero gradients; the step zeroes them itself");
        SX_TRY(segments_on_device("fused_update", segs, n));
        // As the CUDA plan requires (its 8-bit chunks are whole quantization blocks).
        for (size_t i = 0; i < n; ++i)
            SX_CHECK(segs[i].state_dtype != SX_STATE_8BIT || segs[i].n % optim::kQuantBlock == 0, SX_ERR_INTERNAL,
                     "a segment of 8-bit state of %zu elements, not whole blocks of %zu, reached the device's update",
                     segs[i].n, optim::kQuantBlock);
        Widened w(segs, n);
        return kernels_->fused_update(w.segs.data(), n, grad_scale, sumsq);
    }

    // As a CUDA device: LAMB's and Adafactor's passes run where the state is, through the
    // device passes' host launcher (the CUDA kernels' bodies and runs, one element at a time).
    Status check_runs(const optim::OptimizerSpec &spec) const override {
        SX_CHECK(spec.custom == nullptr, SX_ERR_UNSUPPORTED, "the custom optimizer '%s' runs on the host only",
                 spec.name);
        return Status::Ok();
    }
    Status start_param_passes(const optim::OptimizerSpec &spec, const optim::PassInput &in,
                              std::unique_ptr<optim::ParamPassRun> *run) override {
        SX_TRY(check_runs(spec));
        SX_TRY(segments_on_device("start_param_passes", in.segs, in.num_segs));
        return optim::start_device_passes(spec.kind, in, optim::make_host_pass_launcher(), run);
    }

    // Muon's passes through the device passes' host launcher (the CUDA kernels' bodies);
    // its Newton-Schulz iterations as the host's (a device's run through cuBLAS).
    Status whole_first(const optim::OptimizerSpec &spec, const optim::Segment *segs, size_t n, float grad_scale,
                       float *const *pieces, double *grad_sumsq) override {
        SX_TRY(segments_on_device("whole_first", segs, n));
        for (size_t s = 0; s < n; ++s) SX_TRY(on_device("whole_first", {pieces[s]}));
        SX_CHECK(spec.kind == optim::Kind::kMuon, SX_ERR_INTERNAL, "%s's passes on the simulated device", spec.name);
        const std::unique_ptr<optim::PassLauncher> launcher = optim::make_host_pass_launcher();
        return optim::device_muon_momentum(*launcher, segs, n, grad_scale, pieces, grad_sumsq);
    }
    Status whole_update(const optim::OptimizerSpec &spec, const float *u, const std::vector<int64_t> &shape,
                        const optim::Hyper &h, float *out) override {
        SX_TRY(on_device("whole_update", {u, out}));
        return kernels_->whole_update(spec, u, shape, h, out);
    }
    Status whole_apply(const optim::OptimizerSpec &spec, const optim::Segment *segs, size_t n,
                       const std::vector<int64_t> *const *shapes, const float *const *pieces) override {
        SX_TRY(segments_on_device("whole_apply", segs, n));
        for (size_t s = 0; s < n; ++s) SX_TRY(on_device("whole_apply", {pieces[s]}));
        SX_CHECK(spec.kind == optim::Kind::kMuon, SX_ERR_INTERNAL, "%s's passes on the simulated device", spec.name);
        const std::unique_ptr<optim::PassLauncher> launcher = optim::make_host_pass_launcher();
        return optim::device_muon_apply(*launcher, segs, n, shapes, pieces);
    }

  private:
    // The segments with each one's 16-bit gradients widened into an fp32 copy of its own.
    struct Widened {
        std::vector<optim::Segment> segs;
        std::vector<std::vector<float>> grads;
        Widened(const optim::Segment *in, size_t n) : segs(in, in + n), grads(n) {
            for (size_t i = 0; i < n; ++i) {
                if (!segs[i].grad16) continue;
                grads[i].resize(segs[i].n);
                half::to_f32(segs[i].grad_dtype, segs[i].grad16, grads[i].data(), segs[i].n);
                g_widened += segs[i].n;
                segs[i].grad = grads[i].data();
                segs[i].grad16 = nullptr;
            }
        }
    };

    static Status on_device(const char *call, std::initializer_list<const void *> ps) {
        for (const void *p : ps)
            SX_CHECK(!p || registry().contains(p), SX_ERR_INTERNAL,
                     "the simulated device's %s was handed host memory (%p) where a device needs its own", call, p);
        return Status::Ok();
    }
    static Status on_host(const char *what, const void *p) {
        SX_CHECK(!p || !registry().contains(p), SX_ERR_INTERNAL,
                 "the simulated device's %s is device memory (%p) where the host's is needed", what, p);
        return Status::Ok();
    }
    static Status segments_on_device(const char *call, const optim::Segment *segs, size_t n) {
        for (size_t i = 0; i < n; ++i) {
            const optim::Segment &g = segs[i];
            SX_TRY(on_device(call, {g.param, g.grad, g.grad16, g.compute_out, g.undo}));
            for (int k = 0; k < 3; ++k)
                SX_TRY(on_device(call, {g.state[k], g.state_in[k], g.state16[k], g.codes[k], g.scales[k]}));
        }
        return Status::Ok();
    }

    std::unique_ptr<DeviceOps> kernels_;  // the host's, over the group's pool
    CopyEngine down_, up_;                // to the host (and within the device), and from it
};

}  // namespace

std::unique_ptr<DeviceOps> make_simulated_ops(optim::ThreadPool *pool, const SimulatedDevice &settings,
                                              std::shared_ptr<HostAllocator> *host) {
    if (host) host->reset(new SimulatedHost());
    return std::unique_ptr<DeviceOps>(new SimulatedOps(pool, settings));
}

uint64_t simulated_widened_grads() { return g_widened.load(); }

void simulated_overlap_counts(uint64_t *host_calls, uint64_t *overlapped) {
    *host_calls = g_host_calls.load();
    *overlapped = g_host_calls_overlapped.load();
}

void simulated_device_from_env(bool *on, SimulatedDevice *settings) {
    const char *v = std::getenv("SX_SIMULATED_DEVICE");
    *on = v && *v && std::strcmp(v, "0") != 0;
    *settings = SimulatedDevice();
    if (!*on) return;
    for (const char *p = v; *p;) {
        const char *end = std::strchr(p, ',');
        const std::string item(p, end ? static_cast<size_t>(end - p) : std::strlen(p));
        if (item.compare(0, 9, "delay_us=") == 0) settings->copy_delay_us = std::atoi(item.c_str() + 9);
        if (item == "nccl") settings->nccl = true;
        p = end ? end + 1 : p + item.size();
    }
}

}  // namespace core
}  // namespace sx
