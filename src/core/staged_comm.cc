// The staged communicator (staged_comm.h): each collective's buffers on the side the
// inner communicator does not take copied to scratch on its side, the inner collective run
// on that, the results copied back.
#include "core/staged_comm.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace sx {
namespace core {
namespace {

// What both wrappers pass straight to the communicator they wrap.
class Wrapping : public comm::Communicator {
  public:
    explicit Wrapping(std::unique_ptr<comm::Communicator> inner) : inner_(std::move(inner)) {}

    int rank() const override { return inner_->rank(); }
    int world_size() const override { return inner_->world_size(); }
    bool carries_riders() const override { return inner_->carries_riders(); }
    bool sums_in_rank_order() const override { return inner_->sums_in_rank_order(); }
    Status attach_rider(const comm::Rider &mine, std::vector<comm::Rider> *all) override {
        return inner_->attach_rider(mine, all);
    }
    Status barrier() override { return inner_->barrier(); }
    void abort() override { inner_->abort(); }
    void abort_because(const Status &why) override { inner_->abort_because(why); }
    void fail_channel(const Status &why) override { inner_->fail_channel(why); }
    std::vector<int> exited_peers() const override { return inner_->exited_peers(); }

  protected:
    std::unique_ptr<comm::Communicator> inner_;
};

class StagedCommunicator final : public Wrapping {
  public:
    StagedCommunicator(std::unique_ptr<comm::Communicator> inner, DeviceOps &ops, StagedSide inner_takes)
        : Wrapping(std::move(inner)), ops_(ops), device_inner_(inner_takes == StagedSide::kDevice) {}

    Status reduce_scatter_sum(float *buf, size_t shard_elems, float *out, bool accumulate) override {
        if (!foreign(buf) && !foreign(out)) return inner_->reduce_scatter_sum(buf, shard_elems, out, accumulate);
        const size_t W = static_cast<size_t>(world_size()), own = static_cast<size_t>(rank()) * shard_elems;
        const bool in_place = out == buf + own;
        float *host = nullptr;
        SX_TRY(scratch(0, (W + (in_place ? 0 : 1)) * shard_elems, &host));
        float *host_out = in_place ? host + own : host + W * shard_elems;
        SX_TRY(down(host, buf, W * shard_elems * sizeof(float)));
        if (accumulate && !in_place) SX_TRY(down(host_out, out, shard_elems * sizeof(float)));
        SX_TRY(inner_->reduce_scatter_sum(host, shard_elems, host_out, accumulate && !in_place));
        return up(out, host_out, shard_elems * sizeof(float));
    }
    Status reduce_scatter_sum_16(uint16_t *buf, int32_t dtype, size_t shard_elems, float *out, float out_scale,
                                 bool accumulate) override {
        if (!foreign(buf) && !foreign(out))
            return inner_->reduce_scatter_sum_16(buf, dtype, shard_elems, out, out_scale, accumulate);
        const size_t W = static_cast<size_t>(world_size());
        uint16_t *host = nullptr;
        float *host_out = nullptr;
        SX_TRY(scratch(0, W * shard_elems, &host));
        SX_TRY(scratch(1, shard_elems, &host_out));
        SX_TRY(down(host, buf, W * shard_elems * sizeof(uint16_t)));
        if (accumulate) SX_TRY(down(host_out, out, shard_elems * sizeof(float)));
        SX_TRY(inner_->reduce_scatter_sum_16(host, dtype, shard_elems, host_out, out_scale, accumulate));
        return up(out, host_out, shard_elems * sizeof(float));
    }
    Status all_gather(void *buf, size_t shard_bytes) override {
        if (!foreign(buf)) return inner_->all_gather(buf, shard_bytes);
        const size_t W = static_cast<size_t>(world_size()), own = static_cast<size_t>(rank()) * shard_bytes;
        char *host = nullptr;
        SX_TRY(scratch(0, W * shard_bytes, &host));
        SX_TRY(down(host + own, static_cast<char *>(buf) + own, shard_bytes));
        SX_TRY(inner_->all_gather(host, shard_bytes));
        return up(buf, host, W * shard_bytes);
    }
    // NCCL's all_reduce_sum and all_reduce_max take host values (they are small), as the
    // CPU transports do: staged only from the device, to the host.
    Status all_reduce_sum(double *data, size_t n) override {
        if (device_inner_) return inner_->all_reduce_sum(data, n);
        return staged(data, n * sizeof(double), true,
                      [&](void *h) { return inner_->all_reduce_sum(static_cast<double *>(h), n); });
    }
    Status all_reduce_sum_f32(float *data, size_t n) override {
        return staged(data, n * sizeof(float), true,
                      [&](void *h) { return inner_->all_reduce_sum_f32(static_cast<float *>(h), n); });
    }
    Status all_reduce_max(uint64_t *data, size_t n) override {
        if (device_inner_) return inner_->all_reduce_max(data, n);
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

  private:
    // Memory the inner communicator does not take: the device's where it takes the host's,
    // and the reverse.
    bool foreign(const void *p) const { return p != nullptr && ops_.holds(p) != device_inner_; }
    // Into scratch (the inner's side) from src, or back from scratch into dst: across the
    // link where the other end is foreign, else within the side.
    Status down(void *scratch, const void *src, size_t bytes) {
        if (!foreign(src)) return device_inner_ ? ops_.copy(scratch, src, bytes) : copy_on_host(scratch, src, bytes);
        return device_inner_ ? ops_.from_host(scratch, src, bytes) : ops_.to_host(scratch, src, bytes);
    }
    Status up(void *dst, const void *scratch, size_t bytes) {
        if (!foreign(dst)) return device_inner_ ? ops_.copy(dst, scratch, bytes) : copy_on_host(dst, scratch, bytes);
        return device_inner_ ? ops_.to_host(dst, scratch, bytes) : ops_.from_host(dst, scratch, bytes);
    }
    static Status copy_on_host(void *dst, const void *src, size_t bytes) {
        if (bytes) std::memcpy(dst, src, bytes);
        return Status::Ok();
    }

    // Scratch `which` (0 or 1) on the inner's side, of at least n T's, kept for the next
    // calls.
    template <typename T>
    Status scratch(int which, size_t n, T **out) {
        Buffer &s = scratch_[which];
        const size_t bytes = std::max<size_t>(n * sizeof(T), 1);
        if (s.size() < bytes) {
            Buffer grown;
            if (device_inner_)
                SX_TRY(ops_.allocate(bytes, "a collective's staging on the device", &grown));
            else
                SX_TRY(grown.host_.allocate(bytes, "a collective's staging in host memory"));
            s = std::move(grown);
        }
        *out = s.as<T>();
        return Status::Ok();
    }

    // fn on a copy of `data` on the inner's side (copied there first where `down_first`,
    // and back after), or on data itself where it is on that side.
    template <typename Fn>
    Status staged(void *data, size_t bytes, bool down_first, Fn fn) {
        if (!foreign(data)) return fn(data);
        char *host = nullptr;
        SX_TRY(scratch(0, bytes, &host));
        if (down_first && bytes) SX_TRY(down(host, data, bytes));
        SX_TRY(fn(host));
        return bytes ? up(data, host, bytes) : Status::Ok();
    }

    // Copies on the inner's side of the pieces that are foreign (the others kept), their
    // bytes copied there where they are sent (mine when send_mine, theirs when send_theirs).
    Status stage_pieces(const std::vector<comm::Piece> &mine, const std::vector<std::vector<comm::Piece>> &theirs,
                        bool send_mine, bool send_theirs, std::vector<comm::Piece> *host_mine,
                        std::vector<std::vector<comm::Piece>> *host_theirs) {
        size_t total = 0;
        const auto count = [&](const std::vector<comm::Piece> &ps) {
            for (const comm::Piece &p : ps)
                if (foreign(p.data)) total += p.bytes;
        };
        count(mine);
        for (const std::vector<comm::Piece> &ps : theirs) count(ps);
        char *host = nullptr;
        SX_TRY(scratch(1, total, &host));
        size_t at = 0;
        const auto stage = [&](const std::vector<comm::Piece> &ps, bool send, std::vector<comm::Piece> *out) -> Status {
            for (const comm::Piece &p : ps) {
                if (!foreign(p.data)) {
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

    DeviceOps &ops_;
    const bool device_inner_;  // the inner takes device memory (NCCL), else host memory
    Buffer scratch_[2];
};

// NCCL's memory rules on a CPU communicator (make_device_only_communicator).
class DeviceOnlyCommunicator final : public Wrapping {
  public:
    DeviceOnlyCommunicator(std::unique_ptr<comm::Communicator> inner, DeviceOps &ops)
        : Wrapping(std::move(inner)), ops_(ops) {}
    Status reduce_scatter_sum(float *buf, size_t shard_elems, float *out, bool accumulate) override {
        SX_TRY(device("reduce_scatter_sum", {buf, out}));
        return inner_->reduce_scatter_sum(buf, shard_elems, out, accumulate);
    }
    Status reduce_scatter_sum_16(uint16_t *buf, int32_t dtype, size_t shard_elems, float *out, float out_scale,
                                 bool accumulate) override {
        SX_TRY(device("reduce_scatter_sum_16", {buf, out}));
        return inner_->reduce_scatter_sum_16(buf, dtype, shard_elems, out, out_scale, accumulate);
    }
    Status all_gather(void *buf, size_t shard_bytes) override {
        SX_TRY(device("all_gather", {buf}));
        return inner_->all_gather(buf, shard_bytes);
    }
    Status all_reduce_sum(double *data, size_t n) override {
        SX_TRY(host("all_reduce_sum", data));
        return inner_->all_reduce_sum(data, n);
    }
    Status all_reduce_sum_f32(float *data, size_t n) override {
        SX_TRY(device("all_reduce_sum_f32", {data}));
        return inner_->all_reduce_sum_f32(data, n);
    }
    Status all_reduce_max(uint64_t *data, size_t n) override {
        SX_TRY(host("all_reduce_max", data));
        return inner_->all_reduce_max(data, n);
    }
    Status broadcast(void *data, size_t bytes, int root) override {
        SX_TRY(device("broadcast", {data}));
        return inner_->broadcast(data, bytes, root);
    }
    Status gather_pieces(const std::vector<comm::Piece> &mine, const std::vector<std::vector<comm::Piece>> &theirs,
                         int root) override {
        SX_TRY(pieces("gather_pieces", mine, theirs));
        return inner_->gather_pieces(mine, theirs, root);
    }
    Status scatter_pieces(const std::vector<std::vector<comm::Piece>> &theirs, const std::vector<comm::Piece> &mine,
                          int root) override {
        SX_TRY(pieces("scatter_pieces", mine, theirs));
        return inner_->scatter_pieces(theirs, mine, root);
    }

  private:
    Status device(const char *call, std::initializer_list<const void *> ps) const {
        for (const void *p : ps)
            SX_CHECK(p == nullptr || ops_.holds(p), SX_ERR_INTERNAL,
                     "NCCL's %s (as a simulated device has it) was handed host memory (%p)", call, p);
        return Status::Ok();
    }
    Status host(const char *call, const void *p) const {
        SX_CHECK(p == nullptr || !ops_.holds(p), SX_ERR_INTERNAL,
                 "NCCL's %s (as a simulated device has it) was handed device memory (%p) where it takes host values",
                 call, p);
        return Status::Ok();
    }
    Status pieces(const char *call, const std::vector<comm::Piece> &mine,
                  const std::vector<std::vector<comm::Piece>> &theirs) const {
        for (const comm::Piece &p : mine)
            if (p.bytes) SX_TRY(device(call, {p.data}));
        for (const std::vector<comm::Piece> &ps : theirs)
            for (const comm::Piece &p : ps)
                if (p.bytes) SX_TRY(device(call, {p.data}));
        return Status::Ok();
    }

    DeviceOps &ops_;
};

}  // namespace

std::unique_ptr<comm::Communicator> make_device_only_communicator(std::unique_ptr<comm::Communicator> inner,
                                                                  DeviceOps &ops) {
    return std::unique_ptr<comm::Communicator>(new DeviceOnlyCommunicator(std::move(inner), ops));
}

std::unique_ptr<comm::Communicator> make_staged_communicator(std::unique_ptr<comm::Communicator> inner,
                                                             DeviceOps &ops, StagedSide inner_takes) {
    return std::unique_ptr<comm::Communicator>(new StagedCommunicator(std::move(inner), ops, inner_takes));
}

}  // namespace core
}  // namespace sx
