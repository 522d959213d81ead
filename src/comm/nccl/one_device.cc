// The communicator of a one-rank CUDA group: nothing to exchange, so no NCCL (a trainer
// on one GPU need not have it installed). A reduce-scatter over one rank is its own
// buffer, copied or added into `out` on the device; the rest has nothing to do.
#include <cuda_runtime.h>

#include <atomic>

#include "comm/communicator.h"
#include "cuda/device_scope.h"
#include "cuda/elementwise.h"
#include "cuda/status.h"
#include "cuda/stream.h"

namespace sx {
namespace comm {
namespace {

class OneDeviceCommunicator final : public Communicator {
  public:
    explicit OneDeviceCommunicator(int device) : device_(device) {}

    Status init() { return stream_.create(device_, "creating a stream"); }

    int rank() const override { return 0; }
    int world_size() const override { return 1; }

    Status reduce_scatter_sum(float *buf, size_t shard_elems, float *out, bool accumulate) override {
        SX_TRY(usable("reduce_scatter_sum"));
        if (shard_elems == 0) return Status::Ok();
        SX_TRY(check_reduce_scatter_args(*this, buf, shard_elems, out, accumulate));
        if (out == buf && !accumulate) return Status::Ok();
        return on_device("reduce_scatter_sum", [&]() -> Status {
            if (accumulate) return cuda::add(out, buf, shard_elems, stream_.get());
            SX_CUDA_TRY(cudaMemcpyAsync(out, buf, shard_elems * sizeof(float), cudaMemcpyDeviceToDevice, stream_.get()),
                        "reduce_scatter_sum: copying the one rank's shard");
            return Status::Ok();
        });
    }

    Status reduce_scatter_sum_16(uint16_t *buf, int32_t dtype, size_t shard_elems, float *out, float out_scale,
                                 bool accumulate) override {
        SX_TRY(usable("reduce_scatter_sum_16"));
        if (shard_elems == 0) return Status::Ok();
        SX_TRY(check_reduce_scatter_16_args(*this, buf, dtype, shard_elems, out));
        return on_device("reduce_scatter_sum_16", [&] {
            return cuda::widen(dtype, buf, out, shard_elems, out_scale, accumulate, stream_.get());
        });
    }

    Status all_gather(void *, size_t) override { return usable("all_gather"); }
    Status all_reduce_sum(double *, size_t) override { return usable("all_reduce_sum"); }
    Status all_reduce_max(uint64_t *, size_t) override { return usable("all_reduce_max"); }
    Status broadcast(void *, size_t, int root) override {
        SX_CHECK_ARG(root == 0, "broadcast: root %d is not in [0, 1)", root);
        return usable("broadcast");
    }
    // One rank: the sum is its own data.
    Status all_reduce_sum_f32(float *, size_t) override { return Status::Ok(); }

    // One rank: root, with no peer to send to or receive from.
    Status gather_pieces(const std::vector<Piece> &, const std::vector<std::vector<Piece>> &theirs,
                         int root) override {
        return check_pieces_args(*this, "gather_pieces", theirs, root);
    }
    Status scatter_pieces(const std::vector<std::vector<Piece>> &theirs, const std::vector<Piece> &,
                          int root) override {
        return check_pieces_args(*this, "scatter_pieces", theirs, root);
    }

    Status barrier() override { return usable("barrier"); }
    void abort() override { aborted_.store(true); }

  private:
    Status usable(const char *what) const {
        if (aborted_.load()) return SX_ERROR(SX_ERR_ABORTED, "%s: the communicator was aborted", what);
        return Status::Ok();
    }
    // Runs `enqueue` on this communicator's stream and waits for it, as every
    // communicator's calls return once their work is done.
    template <class Enqueue>
    Status on_device(const char *what, Enqueue enqueue) {
        const cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        SX_TRY(enqueue());
        return stream_.synchronize(what);
    }

    const int device_;
    cuda::OwnedStream stream_;
    std::atomic<bool> aborted_{false};
};

}  // namespace

Status create_one_device_communicator(int device, std::unique_ptr<Communicator> *out) {
    std::unique_ptr<OneDeviceCommunicator> c(new OneDeviceCommunicator(device));
    SX_TRY(c->init());
    *out = std::move(c);
    return Status::Ok();
}

}  // namespace comm
}  // namespace sx
