// The Communicator on NCCL (communicator.h), for groups whose buffers live on a GPU.
//
// The communicator is non-blocking (ncclConfig_t.blocking = 0): creating it and
// enqueueing each collective return at once, possibly "in progress", and sx polls
// ncclCommGetAsyncError for the enqueue to finish; then it polls an event recorded
// after the collective, checking the communicator's asynchronous error and the
// deadline as it goes. A timeout, an asynchronous error (a peer died, a network
// failure) or abort() aborts the communicator (ncclCommAbort), which releases every
// rank's kernels, and the call returns an error instead of hanging. After any failure
// every later call fails at once.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "base/log.h"
#include "comm/communicator.h"
#include "comm/nccl/nccl_api.h"
#include "rdzv/stores.h"
#include "cuda/device_scope.h"
#include "cuda/elementwise.h"
#include "cuda/status.h"

namespace sx {
namespace comm {
namespace {

// How often a wait looks at the event, the communicator's state and the deadline.
constexpr auto kPoll = std::chrono::microseconds(20);

Status cuda_error(cudaError_t err, const char *what) {
    return cuda::cuda_status(err, what, __FILE__, __LINE__);
}

class NcclCommunicator final : public Communicator {
  public:
    NcclCommunicator(const nccl::Api *api, int rank, int world, int device, Millis timeout)
        : api_(api), rank_(rank), world_(world), device_(device), timeout_(timeout) {}

    ~NcclCommunicator() override {
        const cuda::DeviceScope scope(device_);
        if (comm_ != nullptr) {
            // A healthy communicator flushes and is destroyed; one that does not finish
            // flushing in time (a dead peer) is aborted, so destruction always returns.
            bool clean = false;
            const ncclResult_t f = api_->CommFinalize(comm_);
            if (f == ncclSuccess || f == ncclInProgress) {
                const auto deadline = Clock::now() + std::min<Millis>(timeout_, Millis(10000));
                ncclResult_t st = ncclInProgress;
                while (api_->CommGetAsyncError(comm_, &st) == ncclSuccess && st == ncclInProgress &&
                       Clock::now() < deadline)
                    std::this_thread::sleep_for(kPoll);
                clean = st == ncclSuccess;
            }
            if (clean) {
                api_->CommDestroy(comm_);
            } else {
                api_->CommAbort(comm_);
            }
        }
        if (done_) cudaEventDestroy(done_);
        if (stream_) cudaStreamDestroy(stream_);
        if (scratch_) cudaFree(scratch_);
        if (pinned_) cudaFreeHost(pinned_);
    }

    // Forms the communicator by `deadline` (the group's creation deadline).
    Status init(rdzv::Store &store, Clock::time_point deadline) {
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        SX_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating the NCCL stream");
        SX_CUDA_TRY(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "creating the NCCL event");
        // Rank 0 makes the unique id; every other rank reads it from the store.
        ncclUniqueId id;
        const std::string key = "nccl-unique-id";
        if (rank_ == 0) {
            SX_TRY(nccl_call("ncclGetUniqueId", api_->GetUniqueId(&id)));
            SX_TRY(store.set(key, std::string(id.internal, sizeof id.internal)));
        } else {
            std::string v;
            SX_TRY(store.get(key, &v, time_left(deadline)));
            SX_CHECK(v.size() == sizeof id.internal, SX_ERR_COMM, "the NCCL unique id in the store has %zu bytes, not %zu",
                     v.size(), sizeof id.internal);
            std::memcpy(id.internal, v.data(), v.size());
        }
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        const ncclResult_t r = api_->CommInitRankConfig(&comm_, world_, id, rank_, &config);
        if (r != ncclSuccess && r != ncclInProgress) {
            Status s = nccl_error("ncclCommInitRankConfig", r);
            if (comm_ != nullptr) api_->CommAbort(comm_);
            comm_ = nullptr;
            return s;
        }
        Status s = wait_state("forming the NCCL communicator", deadline);
        if (!s.ok()) {
            api_->CommAbort(comm_);
            comm_ = nullptr;
            return s;
        }
        log(SX_LOG_INFO, "sx: NCCL %d communicator formed: rank %d of %d on CUDA device %d", api_->version, rank_, world_,
            device_);
        return Status::Ok();
    }

    int rank() const override { return rank_; }
    int world_size() const override { return world_; }

    Status reduce_scatter_sum(float *buf, size_t shard_elems, float *out, bool accumulate) override {
        if (shard_elems == 0) return usable("reduce_scatter_sum");
        SX_TRY(check_reduce_scatter_args(*this, buf, shard_elems, out, accumulate));
        float *recv = out;
        if (accumulate) {
            SX_TRY(reserve_scratch(shard_elems * sizeof(float)));
            recv = static_cast<float *>(scratch_);
        }
        return run(
            "reduce_scatter_sum",
            [&] { return api_->ReduceScatter(buf, recv, shard_elems, ncclFloat32, ncclSum, comm_, stream_); },
            [&] { return accumulate ? cuda::add(out, recv, shard_elems, stream_) : Status::Ok(); });
    }

    Status reduce_scatter_sum_16(uint16_t *buf, int32_t dtype, size_t shard_elems, float *out, float out_scale,
                                 bool accumulate) override {
        if (shard_elems == 0) return usable("reduce_scatter_sum_16");
        SX_TRY(check_reduce_scatter_16_args(*this, buf, dtype, shard_elems, out));
        SX_TRY(reserve_scratch(shard_elems * sizeof(uint16_t)));
        uint16_t *recv = static_cast<uint16_t *>(scratch_);
        const ncclDataType_t type = dtype == SX_DTYPE_F16 ? ncclFloat16 : ncclBfloat16;
        return run(
            "reduce_scatter_sum_16",
            [&] { return api_->ReduceScatter(buf, recv, shard_elems, type, ncclSum, comm_, stream_); },
            [&] { return cuda::widen(dtype, recv, out, shard_elems, out_scale, accumulate, stream_); });
    }

    Status all_gather(void *buf, size_t shard_bytes) override {
        if (shard_bytes == 0) return usable("all_gather");
        SX_CHECK_ARG(buf != nullptr, "all_gather: buf must not be NULL");
        char *b = static_cast<char *>(buf);
        return run("all_gather", [&] {
            return api_->AllGather(b + static_cast<size_t>(rank_) * shard_bytes, b, shard_bytes, ncclUint8, comm_,
                                   stream_);
        });
    }

    Status all_reduce_sum(double *data, size_t n) override {
        return small_all_reduce("all_reduce_sum", data, n * sizeof(double), n, ncclFloat64, ncclSum);
    }

    Status all_reduce_max(uint64_t *data, size_t n) override {
        return small_all_reduce("all_reduce_max", data, n * sizeof(uint64_t), n, ncclUint64, ncclMax);
    }

    Status all_reduce_sum_f32(float *data, size_t n) override {
        if (n == 0) return usable("all_reduce_sum_f32");
        SX_CHECK_ARG(data != nullptr, "all_reduce_sum_f32: data must not be NULL");
        return run("all_reduce_sum_f32",
                   [&] { return api_->AllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream_); });
    }

    Status broadcast(void *data, size_t bytes, int root) override {
        SX_CHECK_ARG(root >= 0 && root < world_, "broadcast: root %d is not in [0, %d)", root, world_);
        if (bytes == 0) return usable("broadcast");
        SX_CHECK_ARG(data != nullptr, "broadcast: data must not be NULL");
        return run("broadcast",
                   [&] { return api_->Broadcast(data, data, bytes, ncclUint8, root, comm_, stream_); });
    }

    // Device memory pieces, point to point within one NCCL group call.
    Status gather_pieces(const std::vector<Piece> &mine, const std::vector<std::vector<Piece>> &theirs,
                         int root) override {
        SX_TRY(check_pieces_args(*this, "gather_pieces", theirs, root));
        return run("gather_pieces", [&] { return point_to_point(root, mine, theirs, true); });
    }

    Status scatter_pieces(const std::vector<std::vector<Piece>> &theirs, const std::vector<Piece> &mine,
                          int root) override {
        SX_TRY(check_pieces_args(*this, "scatter_pieces", theirs, root));
        return run("scatter_pieces", [&] { return point_to_point(root, mine, theirs, false); });
    }

    Status barrier() override {
        uint64_t one = 1;
        return all_reduce_max(&one, 1);
    }

    void abort() override { aborted_.store(true); }

  private:
    // The sends and receives of gather_pieces (to root) or scatter_pieces, as one group.
    ncclResult_t point_to_point(int root, const std::vector<Piece> &mine, const std::vector<std::vector<Piece>> &theirs,
                                bool gather) {
        ncclResult_t r = api_->GroupStart();
        auto post = [&](const Piece &p, int peer, bool send) {
            if (r != ncclSuccess && r != ncclInProgress) return;
            if (p.bytes == 0) return;
            r = send ? api_->Send(p.data, p.bytes, ncclUint8, peer, comm_, stream_)
                     : api_->Recv(p.data, p.bytes, ncclUint8, peer, comm_, stream_);
        };
        if (rank_ == root) {
            for (int peer = 0; peer < world_; ++peer)
                if (peer != root)
                    for (const Piece &p : theirs[static_cast<size_t>(peer)]) post(p, peer, !gather);
        } else {
            for (const Piece &p : mine) post(p, root, gather);
        }
        const ncclResult_t end = api_->GroupEnd();
        return r == ncclSuccess || r == ncclInProgress ? end : r;
    }

    Status nccl_call(const char *what, ncclResult_t r) {
        return r == ncclSuccess || r == ncclInProgress ? Status::Ok() : nccl_error(what, r);
    }

    Status nccl_error(const char *what, ncclResult_t r) const {
        const char *detail = comm_ != nullptr ? api_->GetLastError(comm_) : "";
        const sx_status_t code = (r == ncclInvalidArgument || r == ncclInvalidUsage) ? SX_ERR_INTERNAL : SX_ERR_COMM;
        return SX_ERROR(code, "%s: NCCL error %d (%s)%s%s", what, static_cast<int>(r), api_->GetErrorString(r),
                        detail && *detail ? ": " : "", detail ? detail : "");
    }

    Status usable(const char *what) const {
        if (aborted_.load()) return SX_ERROR(SX_ERR_ABORTED, "%s: the communicator was aborted", what);
        if (!failure_.empty())
            return SX_ERROR(SX_ERR_COMM, "%s: the NCCL communicator failed earlier: %s", what, failure_.c_str());
        return Status::Ok();
    }

    // Marks the communicator failed and aborts it (every rank's pending kernels end).
    Status fail(Status s) {
        if (failure_.empty()) failure_ = s.message();
        if (comm_ != nullptr) {
            api_->CommAbort(comm_);
            comm_ = nullptr;
        }
        return s;
    }

    // Polls the communicator's state until no operation is in progress.
    Status wait_state(const char *what, Clock::time_point deadline) {
        for (;;) {
            ncclResult_t st = ncclSuccess;
            const ncclResult_t r = api_->CommGetAsyncError(comm_, &st);
            if (r != ncclSuccess) return nccl_error(what, r);
            if (st == ncclSuccess) return Status::Ok();
            if (st != ncclInProgress) return nccl_error(what, st);
            if (aborted_.load()) return SX_ERROR(SX_ERR_ABORTED, "%s: aborted", what);
            if (Clock::now() >= deadline)
                return SX_ERROR(SX_ERR_TIMEOUT, "%s did not finish within %lld ms (a rank is missing or stalled)", what,
                                static_cast<long long>(timeout_.count()));
            std::this_thread::sleep_for(kPoll);
        }
    }

    // Enqueues the NCCL call, then `after` (device work on the same stream, once NCCL's
    // enqueue has finished), and waits for both within the timeout.
    Status run(const char *what, const std::function<ncclResult_t()> &enqueue,
               const std::function<Status()> &after = [] { return Status::Ok(); }) {
        SX_TRY(usable(what));
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        const auto deadline = Clock::now() + timeout_;
        Status s = nccl_call(what, enqueue());
        if (s.ok()) s = wait_state(what, deadline);
        if (s.ok()) s = after();
        if (s.ok()) {
            const cudaError_t e = cudaEventRecord(done_, stream_);
            if (e != cudaSuccess) s = cuda_error(e, what);
        }
        while (s.ok()) {
            const cudaError_t q = cudaEventQuery(done_);
            if (q == cudaSuccess) return Status::Ok();
            if (q != cudaErrorNotReady) {
                s = cuda_error(q, what);
                break;
            }
            // "Not ready" is kept as the thread's last error by some runtimes, where the
            // next kernel launch's check would take it for its own failure.
            (void)cudaGetLastError();
            ncclResult_t st = ncclSuccess;
            if (api_->CommGetAsyncError(comm_, &st) != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
                s = nccl_error(what, st);
            } else if (aborted_.load()) {
                s = SX_ERROR(SX_ERR_ABORTED, "%s: aborted", what);
            } else if (Clock::now() >= deadline) {
                s = SX_ERROR(SX_ERR_TIMEOUT, "%s did not finish within %lld ms (a rank is missing or stalled)", what,
                             static_cast<long long>(timeout_.count()));
            } else {
                std::this_thread::sleep_for(kPoll);
            }
        }
        return fail(s);
    }

    // A few host values through the device: copied in, reduced, copied back, through
    // pinned host memory. A copy from or to pageable memory would return only once the
    // stream reached it, behind an all-reduce that a stalled peer never lets finish:
    // through pinned memory the copies are queued too, and run() keeps the deadline.
    Status small_all_reduce(const char *what, void *data, size_t bytes, size_t n, ncclDataType_t type, ncclRedOp_t op) {
        if (n == 0) return usable(what);
        SX_CHECK_ARG(data != nullptr, "%s: data must not be NULL", what);
        SX_TRY(usable(what));
        SX_TRY(reserve_scratch(bytes));
        SX_TRY(reserve_pinned(bytes));
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        std::memcpy(pinned_, data, bytes);
        SX_CUDA_TRY(cudaMemcpyAsync(scratch_, pinned_, bytes, cudaMemcpyHostToDevice, stream_), what);
        SX_TRY(run(
            what, [&] { return api_->AllReduce(scratch_, scratch_, n, type, op, comm_, stream_); },
            [&]() -> Status {
                SX_CUDA_TRY(cudaMemcpyAsync(pinned_, scratch_, bytes, cudaMemcpyDeviceToHost, stream_), what);
                return Status::Ok();
            }));
        std::memcpy(data, pinned_, bytes);
        return Status::Ok();
    }

    // Device scratch of at least `bytes`, kept for later calls (after the stream has
    // finished with the old one: every call waits for its work before returning).
    Status reserve_scratch(size_t bytes) {
        if (bytes <= scratch_bytes_) return Status::Ok();
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        void *p = nullptr;
        SX_CUDA_TRY(cudaMalloc(&p, bytes), "allocating the NCCL scratch buffer");
        if (scratch_) cudaFree(scratch_);
        scratch_ = p;
        scratch_bytes_ = bytes;
        return Status::Ok();
    }

    // Pinned host memory of at least `bytes`, kept (small: control values only).
    Status reserve_pinned(size_t bytes) {
        if (bytes <= pinned_bytes_) return Status::Ok();
        void *h = nullptr;
        SX_CUDA_TRY(cudaMallocHost(&h, bytes), "allocating the NCCL pinned host buffer");
        if (pinned_) cudaFreeHost(pinned_);
        pinned_ = h;
        pinned_bytes_ = bytes;
        return Status::Ok();
    }

    const nccl::Api *api_;
    const int rank_, world_, device_;
    const Millis timeout_;
    ncclComm_t comm_ = nullptr;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t done_ = nullptr;
    void *scratch_ = nullptr;
    size_t scratch_bytes_ = 0;
    void *pinned_ = nullptr;  // pinned host memory for small_all_reduce
    size_t pinned_bytes_ = 0;
    std::atomic<bool> aborted_{false};
    std::string failure_;
};

}  // namespace

Status create_nccl_communicator(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const NcclOptions &options,
                                std::unique_ptr<Communicator> *out) {
    SX_CHECK_ARG(world_size >= 1 && rank >= 0 && rank < world_size, "rank %d of %d is not valid", rank, world_size);
    SX_CHECK_ARG(options.device >= 0, "CUDA device %d must be >= 0", options.device);
    const nccl::Api *api = nullptr;
    SX_TRY(nccl::load(&api));
    std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(api, rank, world_size, options.device, options.timeout));
    const Clock::time_point deadline =
        options.deadline == Clock::time_point() ? Clock::now() + options.timeout : options.deadline;
    SX_TRY(c->init(*make_prefix_store(std::move(store), "nccl/"), deadline));
    *out = std::move(c);
    return Status::Ok();
}

}  // namespace comm
}  // namespace sx
