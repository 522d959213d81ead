// The collectives a shard group needs, behind one small interface: shm/ implements it
// for CPU ranks on one host, gloo/ for CPU ranks across hosts, nccl/ for GPUs. Every call
// either completes, or returns within the timeout given at creation: SX_ERR_TIMEOUT when a
// peer stalls, SX_ERR_COMM when a peer dies or a socket fails, SX_ERR_ABORTED after abort().
// After any error the communicator is unusable (every later call fails fast), with one
// exception: where ranks are found in different calls at a call's first meeting, before
// any data moved, the shared-memory transport returns SX_ERR_MISMATCH on every rank and
// stays usable (the caller may meet its peers again to find out why).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rdzv/store.h"

namespace sx {
namespace comm {

// Collectives started in this process, by every communicator (each call of the interface
// that gets as far as running): what a benchmark counts to say how many exchanges a step
// makes. Any thread.
uint64_t collectives_started();
// Counts one (the implementations call it as a collective starts).
void count_collective();
// Of those, the ones whose data the ranks read from each other's buffers where they lie
// (processes over shared memory, reads_in_place), counted once per rank and call.
uint64_t collectives_in_place();
void count_in_place();

// A few words that travel with a collective at no extra round trip, where the transport
// can carry them (Communicator::carries_riders): what a caller would otherwise exchange
// in a call of its own just before. The ranks compare their tags at the collective's first
// meeting, before any data moves; each reads every rank's value after it.
struct Rider {
    uint64_t tag = 0;  // nonzero
    double value = 0.0;
};

// A communicator's first failure, kept so that every later call fails fast with it (the
// rule above). Any thread.
class FailureLatch {
  public:
    // Keeps s (an error) unless a failure is kept already; true where s is the first.
    bool record(const Status &s);
    // Ok, or the kept failure, as seen by the call `what`.
    Status check(const char *what) const;

  private:
    mutable std::mutex mu_;  // guards failure_
    Status failure_;
    std::atomic<bool> failed_{false};
};

// A contiguous piece of memory a collective sends or receives.
struct Piece {
    void *data = nullptr;
    size_t bytes = 0;
};

class Communicator {
  public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int world_size() const = 0;

    // Whether the large collectives (reduce-scatter, all-gather, broadcast) read the peers'
    // buffers where they lie, when those come from their processes' shared arenas
    // (HostBuffer::kExchanged): ranks in processes of one host over shared memory. Where
    // they do not, the buffers are copied through the transport as any memory is.
    virtual bool reads_in_place() const { return false; }

    // Whether attach_rider works: collectives that meet before moving data carry riders
    // for free (shared memory); the others do not (a caller exchanges its words itself).
    virtual bool carries_riders() const { return false; }
    // The next collective this rank calls on this communicator (a call with data, on the
    // same thread) carries `mine`. At its first meeting the ranks compare their riders'
    // tags (a rank without a rider has none): where any differ, or ranks are in different
    // calls, every rank returns SX_ERR_MISMATCH with nothing moved and the communicator
    // still usable; otherwise (*all)[r] = rank r's rider once the call returns Ok. *all
    // (world_size entries) must outlive the call. SX_ERR_UNSUPPORTED where
    // carries_riders() is false; SX_ERR_INVALID_ARGUMENT for a zero tag.
    virtual Status attach_rider(const Rider &mine, std::vector<Rider> *all);

    // buf holds world_size * shard_elems floats. On return, out[0, shard_elems) is
    // (accumulate ? out + : ) the sum over ranks of their buf[rank*shard_elems, +shard_elems).
    // buf's contents afterwards are unspecified. out is either this rank's own chunk
    // buf + rank*shard_elems (in place, without accumulate) or does not overlap buf.
    virtual Status reduce_scatter_sum(float *buf, size_t shard_elems, float *out,
                                      bool accumulate) = 0;
    // The same over 16-bit values of dtype (SX_DTYPE_F16 or SX_DTYPE_BF16), summed in that
    // dtype (every addition rounds to it, as NCCL sums fp16): on return out[0, shard_elems)
    // = (accumulate ? out + : ) out_scale * (the sum, widened to fp32). out is separate
    // from buf; buf's contents afterwards are unspecified.
    virtual Status reduce_scatter_sum_16(uint16_t *buf, int32_t dtype, size_t shard_elems, float *out,
                                         float out_scale, bool accumulate) = 0;
    // buf holds world_size * shard_bytes; this rank's part at rank*shard_bytes is given,
    // on return every part holds its rank's bytes.
    virtual Status all_gather(void *buf, size_t shard_bytes) = 0;
    virtual Status all_reduce_sum(double *data, size_t n) = 0;
    // Whether all_reduce_sum adds the ranks' values in rank order, ((d_0 + d_1) + d_2) + ...,
    // every element so on every rank (shared memory, Gloo: gloo/ordered_all_reduce.h).
    // NCCL's order is its algorithm's own (the same bits on every rank, but not these):
    // RankOrderedSum (ordered_sum.h) then gathers and adds itself.
    virtual bool sums_in_rank_order() const { return false; }
    // data[0, n) = the sum over ranks of their data, the same bits on every rank (NCCL:
    // device memory; the others host). A mesh's replicas sum their gradient shards so.
    virtual Status all_reduce_sum_f32(float *data, size_t n) = 0;
    virtual Status all_reduce_max(uint64_t *data, size_t n) = 0;
    virtual Status broadcast(void *data, size_t bytes, int root) = 0;
    // Every rank calls them, as every other collective (non-root ranks with nothing to
    // send or receive pass empty lists). gather_pieces: each rank but root sends its
    // `mine` pieces, in order, to root, which receives rank r's into theirs[r] (the same
    // count and sizes, in order); theirs is root's alone (size world_size; its own entry
    // is ignored: root's own pieces stay where they are). scatter_pieces: the reverse,
    // root's theirs[r] go to rank r's `mine`. Pieces of 0 bytes are skipped.
    virtual Status gather_pieces(const std::vector<Piece> &mine, const std::vector<std::vector<Piece>> &theirs,
                                 int root) = 0;
    virtual Status scatter_pieces(const std::vector<std::vector<Piece>> &theirs, const std::vector<Piece> &mine,
                                  int root) = 0;
    virtual Status barrier() = 0;
    // Makes calls in flight on other threads fail with SX_ERR_ABORTED soon, and every
    // later call fail. Thread-safe; may be called any number of times.
    virtual void abort() = 0;
    // abort(), because of `why` (a failure elsewhere): where the peers learn why this rank
    // left (shared memory), they are told.
    virtual void abort_because(const Status &why) {
        (void)why;
        abort();
    }
    // Where the communicator is a channel of a context (shared memory, or the context's
    // Gloo mesh): abort_because(why), and every other rank's call on it, in flight or
    // later, fails within about a second (not at its own timeout) with an error naming its
    // label, this rank and `why`: SX_ERR_TIMEOUT where why is a timeout, else SX_ERR_COMM.
    // The first rank to fail a channel is the one every rank names. Elsewhere abort(), as
    // ever. Any thread.
    virtual void fail_channel(const Status &why) {
        (void)why;
        abort();
    }
    // The ranks (ascending) whose process this rank knows to have exited, asked now: where
    // it shares memory with them, their processes are watched (a pidfd); over TCP alone
    // nothing is known (a closed connection may be a live peer that gave up). Any thread.
    virtual std::vector<int> exited_peers() const { return {}; }
};

// The argument checks of gather_pieces and scatter_pieces: root in range, and on root one
// list of pieces per rank.
Status check_pieces_args(const Communicator &c, const char *what, const std::vector<std::vector<Piece>> &theirs,
                         int root);

// The argument checks of reduce_scatter_sum and reduce_scatter_sum_16 (for non-empty
// calls), with the same words in every backend.
Status check_reduce_scatter_args(const Communicator &c, const float *buf, size_t shard_elems, const float *out,
                                 bool accumulate);
Status check_reduce_scatter_16_args(const Communicator &c, const uint16_t *buf, int32_t dtype, size_t shard_elems,
                                    const float *out);

struct GlooOptions {
    std::string bind_address;  // empty = this host's name
    Millis timeout{300000};
    // When connecting must be done (a group's creation counts every phase against one
    // timeout); the zero time point = timeout from the call.
    std::chrono::steady_clock::time_point deadline{};
    // Pipeline segment of the ring reduce-scatter and all-gather, in bytes; 0 = tuned
    // defaults (1 MiB and 4 MiB). Tests make it small to run many segments cheaply.
    size_t segment_bytes = 0;
    // all_reduce_sum (its doubles added in rank order) of at most this many bytes goes
    // through the call's rank 0, larger ones are scattered in parts over the ranks
    // (gloo/ordered_all_reduce.h); 0 = the tuned default (16 KiB). Tests set it to run each.
    size_t rooted_sum_bytes = 0;
    // Where every rank turns out to be a thread of this process, all_gather and
    // broadcast copy straight from the peers' buffers instead of going through TCP
    // (the other collectives always use Gloo). Tests turn it off to run the TCP ring.
    bool in_process = true;
    // Per rank of this communicator, how errors that name a peer call it ("rank 2 (host
    // 'b')"; empty: "its rank 2").
    std::vector<std::string> rank_names;
    // A context's channel: what its errors call the communicator's owner ("group 'a'").
    std::string label;
    // Which pairs a communicator's mesh connects (create_gloo_communicator; a context's
    // mesh is always full): kAuto is SX_GLOO_MESH's choice ("full" or "sparse"), else a
    // full mesh up to kFullMeshMost ranks and a sparse one beyond (gloo/full_mesh.h).
    enum class Mesh { kAuto, kFull, kSparse };
    Mesh mesh = Mesh::kAuto;
    static constexpr int kFullMeshMost = 64;
};

// Connects a mesh of `world_size` ranks through `store` (keys under the store's own key
// space) with Gloo's TCP transport: full, or sparse (GlooOptions::mesh), where each rank
// pairs with 2 log2 W others and the collectives go round a ring, up and down binomial
// trees and along a chain (gloo/tree.h) with the same results. SX_ERR_INVALID_ARG where
// SX_GLOO_MESH is set to anything but "full", "sparse" or "auto".
Status create_gloo_communicator(std::shared_ptr<rdzv::Store> store, int rank, int world_size,
                                const GlooOptions &options, std::unique_ptr<Communicator> *out);

class SharedChannels;  // shm/segment.h
class GlooChannels;    // gloo/channels.h

// A context's one Gloo full mesh (its ranks span hosts, or may not share memory),
// connected through `store` (keys under its own space; the channels' ids are counted
// there too), on which each communicator of the context's groups is a channel: a slot
// space of its own on the shared connections (create_communicator with
// CommunicatorSpec::gloo_channels). Collective over the context's ranks; errors as
// create_gloo_communicator's.
Status open_gloo_channels(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const GlooOptions &options,
                          std::shared_ptr<GlooChannels> *out);
// The channels open on it now. Any thread.
int64_t gloo_channels_open(const GlooChannels &channels);
// The bytes its channels keep on this rank beyond their calls in flight: blocks kept for
// their next calls, and what calls that ended early left until the connections close
// (gloo/op_scope.h). Any thread.
uint64_t gloo_channels_kept_bytes(GlooChannels &channels);

struct ShmOptions {
    Millis timeout{300000};
    std::chrono::steady_clock::time_point deadline{};  // as GlooOptions::deadline
    // Bytes of each rank's slot of the segment (a collective moves its data in chunks of
    // this size); 0 = 8 MiB. Tests make it small to run many chunks cheaply.
    size_t slot_bytes = 0;
    // Processes read the buffers that come from each other's shared arenas in place
    // (reads_in_place); false: every buffer goes through the slots (tests, the benchmark).
    bool in_place = true;
    // A context's shared memory: the communicator is a channel of it (a region of the
    // context's segment, taken through the store), and connects nothing.
    std::shared_ptr<SharedChannels> channels;
    // A context's channel: what its errors call the communicator's owner ("group 'a'").
    std::string label;
    // Which pairs a communicator's mesh connects (create_gloo_communicator; a context's
    // mesh is always full): kAuto is SX_GLOO_MESH's choice ("full" or "sparse"), else a
    // full mesh up to kFullMeshMost ranks and a sparse one beyond (gloo/full_mesh.h).
    enum class Mesh { kAuto, kFull, kSparse };
    Mesh mesh = Mesh::kAuto;
    static constexpr int kFullMeshMost = 64;
};

// Connects `world_size` ranks that run on this host (processes, or threads of one
// process) through one shared-memory segment (shm/shm_communicator.cc), handed out
// through `store`: every collective of the interface, without sockets. The segment
// leaves nothing behind in any file system, however the ranks exit. At most 512 ranks.
Status create_shm_communicator(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const ShmOptions &options,
                               std::unique_ptr<Communicator> *out);

enum class CpuTransport { kGloo, kSharedMemory, kHierarchical };

// The CPU communicator of `world_size` ranks, chosen from where they run (their host
// identities, exchanged through `store`; SX_HOST_ID overrides this host's, and `host` this
// rank's) where `shared_memory` is set: shared memory where every rank runs on this host;
// where there are several hosts, each with the same number of ranks (two or more), shared
// memory within each host and Gloo between the hosts' peers (shm/hierarchical.h); else
// Gloo's TCP transport. *chosen (if not null) says which it chose.
Status create_cpu_communicator(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const GlooOptions &options,
                               bool shared_memory, std::unique_ptr<Communicator> *out,
                               CpuTransport *chosen = nullptr, const std::string &host = "");

struct NcclOptions {
    int device = 0;  // CUDA device ordinal of this rank
    Millis timeout{300000};
    std::chrono::steady_clock::time_point deadline{};  // as GlooOptions::deadline
};

// Connects `world_size` ranks, one GPU each, through NCCL (opened at run time: libsx
// does not link it), the unique id exchanged through `store`. Its reduce_scatter_sum,
// reduce_scatter_sum_16, all_gather and broadcast take device memory (of `device`);
// all_reduce_sum and all_reduce_max take host arrays (a few control values: norms,
// fingerprints). Every call returns once its work on the device has finished, or
// within the timeout (the communicator is then aborted: SX_ERR_TIMEOUT). SX_ERR_UNSUPPORTED
// in a build without CUDA, or where NCCL or the device cannot be used.
Status create_nccl_communicator(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const NcclOptions &options,
                                std::unique_ptr<Communicator> *out);

// The communicator of a one-rank group on CUDA device `device`, without NCCL: its
// reduce-scatters copy (or add, or widen) the one rank's buffer into `out` on the
// device, and its other collectives have nothing to do. Same contracts as NCCL's.
// SX_ERR_UNSUPPORTED in a build without CUDA.
Status create_one_device_communicator(int device, std::unique_ptr<Communicator> *out);

// What a group asks of a communicator: its backend and that backend's settings.
struct CommunicatorSpec {
    bool cuda = false;      // NCCL between GPUs (one device each), else the CPU transports
    int device = 0;         // CUDA: this rank's device ordinal
    Millis timeout{300000};
    std::chrono::steady_clock::time_point deadline{};  // of the connection (as GlooOptions::deadline)
    std::string bind_address;  // CPU, Gloo: the address its TCP transport binds
    bool shared_memory = true; // CPU: ranks all on this host share memory
    // CPU: a context's shared memory (its ranks all on this host): the communicator is a
    // channel of it, whatever shared_memory says.
    std::shared_ptr<SharedChannels> channels;
    // CPU: a context's Gloo mesh (where it has no shared memory): the communicator is a
    // channel of it, and connects nothing.
    std::shared_ptr<GlooChannels> gloo_channels;
    // A context's channel: what its errors call the communicator's owner ("group 'a'").
    std::string label;
    // Which pairs a communicator's mesh connects (create_gloo_communicator; a context's
    // mesh is always full): kAuto is SX_GLOO_MESH's choice ("full" or "sparse"), else a
    // full mesh up to kFullMeshMost ranks and a sparse one beyond (gloo/full_mesh.h).
    enum class Mesh { kAuto, kFull, kSparse };
    Mesh mesh = Mesh::kAuto;
    static constexpr int kFullMeshMost = 64;
};

// The one place a communicator is chosen: CUDA with one rank, the device's own (no NCCL);
// CUDA, NCCL; CPU, create_cpu_communicator (shared memory on one host, else Gloo).
Status create_communicator(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const CommunicatorSpec &spec,
                           std::unique_ptr<Communicator> *out);

}  // namespace comm
}  // namespace sx
