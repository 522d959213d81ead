// The staged communicator (staged_comm.h): each collective's device buffers copied to host
// scratch, the inner communicator's collective run on that, the results copied back.
#include "core/staged_comm.h"

#include <cstring>
#include <vector>

namespace sx {
namespace core {
namespace {

class StagedCommunicator final : public comm::Communicator {
  public:
    StagedCommunicator(std::unique_ptr<comm::Communicator> inner, DeviceOps &ops)
        : inner_(std::move(inner)), ops_(ops) {}

    int rank() const override { return inner_->rank(); }
    int world_size() const override { return inner_->world_size(); }
    bool carries_riders() const override { return inner_->carries_riders(); }
    Status attach_rider(const comm::Rider &mine, std::vector<comm::Rider> *all) override {
        return inner_->attach_rider(mine, all);
    }

    Status reduce_scatter_sum(float *buf, size_t shard_elems, float *out, bool accumulate) override {
        if (!on_device(buf) && !on_device(out)) return inner_->reduce_scatter_sum(buf, shard_elems, out, accumulate);
        const size_t W = static_cast<size_t>(world_size()), own = static_cast<size_t>(rank()) * shard_elems;
        const bool in_place = out == buf + own;
        float *host = scratch<float>(0, (W + (in_place ? 0 : 1)) * shard_elems);
        float *host_out = in_place ? host + own : host + W * shard_elems;
        SX_TRY(down(host, buf, W * shard_elems * sizeof(float)));
        if (accumulate && !in_place) SX_TRY(down(host_out, out, shard_elems * sizeof(float)));
        SX_TRY(inner_->reduce_scatter_sum(host, shard_elems, host_out, accumulate && !in_place));
        return up(out, host_out, shard_elems * sizeof(float));
    }
    Status reduce_scatter_sum_16(uint16_t *buf, int32_t dtype, size_t shard_elems, float *out, float out_scale,
                                 bool accumulate) override {
        if (!on_device(buf) && !on_device(out))
            return inner_->reduce_scatter_sum_16(buf, dtype, shard_elems, out, out_scale, accumulate);
        const size_t W = static_cast<size_t>(world_size());
        uint16_t *host = scratch<uint16_t>(0, W * shard_elems);
        float *host_out = scratch<float>(1, shard_elems);
        SX_TRY(down(host, buf, W * shard_elems * sizeof(uint16_t)));
        if (accumulate) SX_TRY(down(host_out, out, shard_elems * sizeof(float)));
        SX_TRY(inner_->reduce_scatter_sum_16(host, dtype, shard_elems, host_out, out_scale, accumulate));
        return up(out, host_out, shard_elems * sizeof(float));
    }
    Status all_gather(void *buf, size_t shard_bytes) override {
        if (!on_device(buf)) return inner_->all_gather(buf, shard_bytes);
        const size_t W = static_cast<size_t>(world_size()), own = static_cast<size_t>(rank()) * shard_bytes;
        char *host = scratch<char>(0, W * shard_bytes);
        SX_TRY(down(host + own, static_cast<char *>(buf) + own, shard_bytes));
        SX_TRY(inner_->all_gather(host, shard_bytes));
        return up(buf, host, W * shard_bytes);
    }
    Status all_reduce_sum(double *data, size_t n) override {
        return staged(data, n * sizeof(double), true, [&](void *h) { return inner_->all_reduce_sum(static_cast<double *>(h), n); });
    }
    Status all_reduce_sum_f32(float *data, size_t n) override {
        return staged(data, n * sizeof(float), true,
                      [&](void *h) { return inner_->all_reduce_sum_f32(static_cast<float *>(h), n); });
    }
    Status all_reduce_max(uint64_t *data, size_t n) override {
        return staged(data, n * sizeof(uint64_t), true,
                      [&](void *h) { return inner_->all_reduce_max(static_cast<uint64_t *>(h), n); });
    }
    Status broadcast(void *data, size_t bytes, int root) override {
        return staged(data, bytes, rank() == root, [&](void *h) { return inner_->broadcast(h, bytes, root); });
    }
    Status gather_pieces(const std::vector<comm::Piece> &mine, const std::vector<std::vector<comm::Piece>> &theirs,
                         int root) override {
        std::vector<comm::Piece> host_mine;
        std::vector<std::vector<comm::Piece>> host_theirs;
        SX_TRY(stage_pieces(mine, theirs, true, false, &host_mine, &host_theirs));
        SX_TRY(inner_->gather_pieces(host_mine, host_theirs, root));
        return unstage_pieces(theirs, host_theirs, root);  // root's own entry: nothing came
    }
    Status scatter_pieces(const std::vector<std::vector<comm::Piece>> &theirs, const std::vector<comm::Piece> &mine,
                          int root) override {
        std::vector<comm::Piece> host_mine;
        std::vector<std::vector<comm::Piece>> host_theirs;
        SX_TRY(stage_pieces(mine, theirs, false, true, &host_mine, &host_theirs));
        SX_TRY(inner_->scatter_pieces(host_theirs, host_mine, root));
        return unstage_pieces({mine}, {host_mine}, -1);
    }
    Status barrier() override { return inner_->barrier(); }
    void abort() override { inner_->abort(); }
    void abort_because(const Status &why) override { inner_->abort_because(why); }
    std::vector<int> exited_peers() const override { return inner_->exited_peers(); }

  private:
    bool on_device(const void *p) const { return p != nullptr && ops_.holds(p); }
    Status down(void *host, const void *device, size_t bytes) { return ops_.to_host(host, device, bytes); }
    Status up(void *device, const void *host, size_t bytes) { return ops_.from_host(device, host, bytes); }

    // Host scratch `which` (0 or 1) of at least n T's, kept for the next calls.
    template <typename T>
    T *scratch(int which, size_t n) {
        std::vector<char> &s = scratch_[which];
        if (s.size() < n * sizeof(T) + alignof(double)) s.resize(n * sizeof(T) + alignof(double));
        return reinterpret_cast<T *>(s.data());
    }

    // fn on a host copy of `data` (copied down first where `down_first`, and up after), or
    // on data itself where it is host memory.
    template <typename Fn>
    Status staged(void *data, size_t bytes, bool down_first, Fn fn) {
        if (!on_device(data)) return fn(data);
        char *host = scratch<char>(0, bytes);
        if (down_first && bytes) SX_TRY(down(host, data, bytes));
        SX_TRY(fn(host));
        return bytes ? up(data, host, bytes) : Status::Ok();
    }

    // Host copies of the pieces that are device memory (the others kept), their bytes
    // copied down where they are sent (mine when send_mine, theirs when send_theirs).
    Status stage_pieces(const std::vector<comm::Piece> &mine, const std::vector<std::vector<comm::Piece>> &theirs,
                        bool send_mine, bool send_theirs, std::vector<comm::Piece> *host_mine,
                        std::vector<std::vector<comm::Piece>> *host_theirs) {
        size_t total = 0;
        const auto count = [&](const std::vector<comm::Piece> &ps) {
            for (const comm::Piece &p : ps)
                if (on_device(p.data)) total += p.bytes;
        };
        count(mine);
        for (const std::vector<comm::Piece> &ps : theirs) count(ps);
        char *host = scratch<char>(1, total);
        size_t at = 0;
        const auto stage = [&](const std::vector<comm::Piece> &ps, bool send, std::vector<comm::Piece> *out) -> Status {
            for (const comm::Piece &p : ps) {
                if (!on_device(p.data)) {
                    out->push_back(p);
                    continue;
                }
                out->push_back({host + at, p.bytes});
                if (send && p.bytes) SX_TRY(down(host + at, p.data, p.bytes));
                at += p.bytes;
            }
            return Status::Ok();
        };
        SX_TRY(stage(mine, send_mine, host_mine));
        host_theirs->resize(theirs.size());
        for (size_t r = 0; r < theirs.size(); ++r) SX_TRY(stage(theirs[r], send_theirs, &(*host_theirs)[r]));
        return Status::Ok();
    }
    // The staged pieces that were received copied up into the device's (but list `skip`'s).
    Status unstage_pieces(const std::vector<std::vector<comm::Piece>> &device,
                          const std::vector<std::vector<comm::Piece>> &host, int skip) {
        for (size_t r = 0; r < device.size(); ++r)
            if (static_cast<int>(r) != skip)
                for (size_t i = 0; i < device[r].size(); ++i)
                    if (device[r][i].data != host[r][i].data && device[r][i].bytes)
                        SX_TRY(up(device[r][i].data, host[r][i].data, device[r][i].bytes));
        return Status::Ok();
    }

    std::unique_ptr<comm::Communicator> inner_;
    DeviceOps &ops_;
    std::vector<char> scratch_[2];
};

}  // namespace

std::unique_ptr<comm::Communicator> make_staged_communicator(std::unique_ptr<comm::Communicator> inner,
                                                             DeviceOps &ops) {
    return std::unique_ptr<comm::Communicator>(new StagedCommunicator(std::move(inner), ops));
}

}  // namespace core
}  // namespace sx
