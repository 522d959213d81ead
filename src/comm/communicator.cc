#include "comm/communicator.h"

#include <atomic>
#include <cstdint>

#include "comm/gloo/channels.h"
#include "comm/shm/hierarchical.h"

namespace sx {
namespace comm {

namespace {
std::atomic<uint64_t> g_collectives{0};
std::atomic<uint64_t> g_in_place{0};
}  // namespace

uint64_t collectives_started() { return g_collectives.load(std::memory_order_relaxed); }

void count_collective() { g_collectives.fetch_add(1, std::memory_order_relaxed); }

uint64_t collectives_in_place() { return g_in_place.load(std::memory_order_relaxed); }

void count_in_place() { g_in_place.fetch_add(1, std::memory_order_relaxed); }

bool FailureLatch::record(const Status &s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load()) return false;
    failure_ = s;
    failed_.store(true);
    return true;
}

Status FailureLatch::check(const char *what) const {
    if (!failed_.load()) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu_);
    return Status(failure_.code(), format("%s: the communicator failed earlier: %s", what, failure_.message().c_str()),
                  failure_.file(), failure_.line());
}

Status check_reduce_scatter_args(const Communicator &c, const float *buf, size_t shard_elems, const float *out,
                                 bool accumulate) {
    SX_CHECK_ARG(buf != nullptr && out != nullptr, "reduce_scatter_sum: buf and out must not be NULL");
    const size_t total = shard_elems * static_cast<size_t>(c.world_size());
    const uintptr_t o = reinterpret_cast<uintptr_t>(out), b = reinterpret_cast<uintptr_t>(buf);
    const bool in_place = out == buf + static_cast<size_t>(c.rank()) * shard_elems;
    SX_CHECK_ARG(!(in_place && accumulate), "reduce_scatter_sum: accumulate cannot be in place");
    SX_CHECK_ARG(in_place || o + shard_elems * sizeof(float) <= b || o >= b + total * sizeof(float),
                 "reduce_scatter_sum: out must be this rank's chunk of buf or not overlap buf");
    return Status::Ok();
}

Status check_reduce_scatter_16_args(const Communicator &c, const uint16_t *buf, int32_t dtype, size_t shard_elems,
                                    const float *out) {
    SX_CHECK_ARG(buf != nullptr && out != nullptr, "reduce_scatter_sum_16: buf and out must not be NULL");
    SX_CHECK_ARG(dtype == SX_DTYPE_F16 || dtype == SX_DTYPE_BF16,
                 "reduce_scatter_sum_16: dtype %d is not SX_DTYPE_F16 or SX_DTYPE_BF16", dtype);
    const size_t total = shard_elems * static_cast<size_t>(c.world_size());
    const uintptr_t o = reinterpret_cast<uintptr_t>(out), b = reinterpret_cast<uintptr_t>(buf);
    SX_CHECK_ARG(o + shard_elems * sizeof(float) <= b || o >= b + total * sizeof(uint16_t),
                 "reduce_scatter_sum_16: out must not overlap buf");
    return Status::Ok();
}

Status Communicator::attach_rider(const Rider &, std::vector<Rider> *) {
    return SX_ERROR(SX_ERR_UNSUPPORTED, "this transport carries no riders: exchange the words in a call of their own");
}

Status create_communicator(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const CommunicatorSpec &spec,
                           std::unique_ptr<Communicator> *out) {
    if (spec.cuda && world_size == 1) return create_one_device_communicator(spec.device, out);
    if (spec.cuda) {
        NcclOptions n;
        n.device = spec.device;
        n.timeout = spec.timeout;
        n.deadline = spec.deadline;
        return create_nccl_communicator(std::move(store), rank, world_size, n, out);
    }
    if (spec.channels && spec.gloo_channels) return create_context_channel(std::move(store), rank, world_size, spec, out);
    if (spec.channels) {
        ShmOptions so;
        so.timeout = spec.timeout;
        so.deadline = spec.deadline;
        so.channels = spec.channels;
        so.label = spec.label;
        return create_shm_communicator(std::move(store), rank, world_size, so, out);
    }
    GlooOptions g;
    g.timeout = spec.timeout;
    g.deadline = spec.deadline;
    g.bind_address = spec.bind_address;
    g.label = spec.label;
    if (spec.gloo_channels) return create_gloo_channel(spec.gloo_channels, std::move(store), rank, world_size, g, out);
    return create_cpu_communicator(std::move(store), rank, world_size, g, spec.shared_memory, out);
}

Status check_pieces_args(const Communicator &c, const char *what, const std::vector<std::vector<Piece>> &theirs,
                         int root) {
    SX_CHECK_ARG(root >= 0 && root < c.world_size(), "%s: root %d is not in [0, %d)", what, root, c.world_size());
    if (c.rank() == root)
        SX_CHECK_ARG(theirs.size() == static_cast<size_t>(c.world_size()),
                     "%s: root has pieces for %zu ranks, not %d", what, theirs.size(), c.world_size());
    return Status::Ok();
}

}  // namespace comm
}  // namespace sx
