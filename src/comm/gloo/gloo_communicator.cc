// The Communicator on Gloo's TCP transport (communicator.h).
//
// What Gloo does on failure, and what we make of it:
//  - a wait that times out makes Gloo close every pair of the context and throw
//    IoException("Timed out waiting Nms for recv operation to complete"): SX_ERR_TIMEOUT;
//  - a peer that dies closes its sockets; Gloo's event loop sees EOF or a reset,
//    fails that pair, and the waits on its pending operations throw IoException
//    ("Connection closed by peer", "Connection reset by peer"): SX_ERR_COMM. A wait
//    on an operation already under way on that pair is not woken and times out;
//  - a peer that times out closes its sockets too, so a stalled rank reaches the
//    other survivors as a closed connection at about their own deadline; a closure
//    seen after 3/4 of the timeout is therefore reported as SX_ERR_TIMEOUT.
// After any failure the communicator closes every connection (peers then fail fast
// instead of waiting out their timeout) and every later call fails at once.
//
// Gloo 0.5's algorithms ignore the result of aborted waits, so abort() cannot rely on
// abortWaitRecv alone: it "poisons" the context (a receive that nobody will answer,
// waited on for 1 ms, makes Gloo fail every pair and wake every pending operation
// with an exception), then aborts the waits it knows and closes what is left.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>

#include "base/log.h"
#include "comm/communicator.h"
#include "comm/gloo/channels.h"
#include "comm/gloo/full_mesh.h"
#include "comm/gloo/in_process.h"
#include "comm/gloo/op_scope.h"
#include "comm/gloo/ordered_all_reduce.h"
#include "comm/gloo/ring.h"
#include "comm/gloo/tree.h"
#include "base/sigpipe.h"

namespace sx {
namespace comm {
namespace {

// Slots are 64-bit: Gloo's own algorithms use prefix bytes 0x01-0x08 in the top byte
// and the tag in bits 24-55 (gloo::Slot::build); ours take prefixes no Gloo
// algorithm uses, so they can never match a Gloo operation's.
constexpr uint64_t kRingSlotPrefix = 0x53ull << 56;
constexpr uint64_t kPoisonSlot = 0x54ull << 56;

// Gloo's option classes keep their buffers protected; these expose them for abort().
struct AllreduceOptions : gloo::AllreduceOptions {
    using gloo::AllreduceOptions::AllreduceOptions;
    UnboundBuffer *output() { return impl_.out[0].get(); }
};
struct BroadcastOptions : gloo::BroadcastOptions {
    using gloo::BroadcastOptions::BroadcastOptions;
    UnboundBuffer *output() { return out.get(); }
};
struct BarrierOptions : gloo::BarrierOptions {
    using gloo::BarrierOptions::BarrierOptions;
    UnboundBuffer *scratch() { return buffer.get(); }
};

// Whether this host can bind a TCP socket to an address `host` resolves to: what
// Gloo's CreateDevice looks for. Checked here first because Gloo 0.5 mishandles both
// failures: it compares getaddrinfo's result with -1 only and then walks an
// uninitialised list when the name does not resolve, and it leaks the list when no
// address can be bound.
Status check_bind_address(const std::string &host) {
    struct addrinfo hints;
    std::memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo *res = nullptr;
    int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
    SX_CHECK(rc == 0, SX_ERR_COMM, "cannot bind Gloo's TCP transport to '%s': %s", host.c_str(), ::gai_strerror(rc));
    bool bound = false;
    for (struct addrinfo *ai = res; ai != nullptr && !bound; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        bound = ::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;  // the port in ai_addr is 0: any
        ::close(fd);
    }
    ::freeaddrinfo(res);
    SX_CHECK(bound, SX_ERR_COMM, "cannot bind Gloo's TCP transport to '%s': it is no address of this host",
             host.c_str());
    return Status::Ok();
}

// This host's name if it can be bound, else the loopback address.
std::string default_bind_address() {
    char name[256];
    if (::gethostname(name, sizeof name) != 0) return "127.0.0.1";
    name[sizeof name - 1] = '\0';
    return check_bind_address(name).ok() ? std::string(name) : std::string("127.0.0.1");
}

class GlooCommunicator final : public Communicator {
  public:
    GlooCommunicator(std::shared_ptr<FullMeshContext> context, const GlooOptions &options,
                     std::shared_ptr<Meeting> meeting)
        : context_(std::move(context)),
          meeting_(std::move(meeting)),
          timeout_(options.timeout),
          rs_segment_bytes_(std::max(options.segment_bytes ? options.segment_bytes : kReduceScatterSegmentBytes,
                                     sizeof(float))),
          ag_segment_bytes_(options.segment_bytes ? options.segment_bytes : kAllGatherSegmentBytes),
          rooted_sum_bytes_(options.rooted_sum_bytes),
          names_(options.rank_names) {}

    // Destroying the context closes every pair (no I/O, so peers that are dead or
    // stalled cannot hold it up) and joins Gloo's event-loop thread. Peers waiting at
    // the meeting learn that this rank has gone.
    ~GlooCommunicator() override {
        if (meeting_) meeting_->fail(rank(), SX_ERR_COMM, "its communicator was destroyed");
    }

    int rank() const override { return context_->rank; }
    int world_size() const override { return context_->size; }

    Status reduce_scatter_sum(float *buf, size_t shard_elems, float *out, bool accumulate) override {
        if (shard_elems == 0) return usable("reduce_scatter_sum");
        SX_TRY(check_reduce_scatter_args(*this, buf, shard_elems, out, accumulate));
        return run("reduce_scatter_sum", [&](const Call &call) {
            OpScope op = scope(call);
            return ring_reduce_scatter(op, buf, shard_elems, out, accumulate,
                                       rs_segment_bytes_ / sizeof(float));
        });
    }

    Status reduce_scatter_sum_16(uint16_t *buf, int32_t dtype, size_t shard_elems, float *out, float out_scale,
                                 bool accumulate) override {
        if (shard_elems == 0) return usable("reduce_scatter_sum_16");
        SX_TRY(check_reduce_scatter_16_args(*this, buf, dtype, shard_elems, out));
        return run("reduce_scatter_sum_16", [&](const Call &call) {
            OpScope op = scope(call);
            return ring_reduce_scatter_16(op, dtype, buf, shard_elems, out, out_scale, accumulate,
                                          rs_segment_bytes_ / sizeof(uint16_t));
        });
    }

    Status all_gather(void *buf, size_t shard_bytes) override {
        if (shard_bytes == 0) return usable("all_gather");
        SX_CHECK_ARG(buf != nullptr, "all_gather: buf must not be NULL");
        if (meeting_) {
            // Threads of one process: each copies the others' parts straight from their buffers.
            return run("all_gather", [&](const Call &call) {
                return meet("all_gather", format("all_gather of %zu bytes per rank", shard_bytes), call, buf,
                            [&](void *const *bufs) {
                    for (int r = 0; r < world_size(); ++r) {
                        if (r == rank()) continue;
                        const size_t at = static_cast<size_t>(r) * shard_bytes;
                        std::memcpy(static_cast<char *>(buf) + at, static_cast<const char *>(bufs[r]) + at, shard_bytes);
                    }
                });
            });
        }
        return run("all_gather", [&](const Call &call) {
            OpScope op = scope(call);
            return ring_all_gather(op, static_cast<char *>(buf), shard_bytes, ag_segment_bytes_);
        });
    }

    // Added in rank order (gloo/ordered_all_reduce.h), over TCP also between threads.
    Status all_reduce_sum(double *data, size_t n) override {
        if (n == 0) return usable("all_reduce_sum");
        SX_CHECK_ARG(data != nullptr, "all_reduce_sum: data must not be NULL");
        return run("all_reduce_sum", [&](const Call &call) {
            OpScope op = scope(call);
            if (context_->sparse())
                return sparse_ordered_sum(op, data, n, rooted_sum_bytes_, rs_segment_bytes_ / sizeof(double));
            return rank_ordered_sum(op, data, n, rooted_sum_bytes_);
        });
    }
    bool sums_in_rank_order() const override { return true; }

    Status all_reduce_max(uint64_t *data, size_t n) override {
        return all_reduce("all_reduce_max", data, n, &gloo::max<uint64_t>);
    }

    // Gloo's ring all-reduce: each element is summed by one rank and sent to the others,
    // so every rank ends with the same bits.
    Status all_reduce_sum_f32(float *data, size_t n) override {
        return all_reduce("all_reduce_sum_f32", data, n, &gloo::sum<float>);
    }

    Status broadcast(void *data, size_t bytes, int root) override {
        SX_CHECK_ARG(root >= 0 && root < world_size(), "broadcast: root %d is not in [0, %d)", root, world_size());
        if (bytes == 0) return usable("broadcast");
        SX_CHECK_ARG(data != nullptr, "broadcast: data must not be NULL");
        if (meeting_) {
            return run("broadcast", [&](const Call &call) {
                return meet("broadcast", format("broadcast of %zu bytes from rank %d", bytes, root), call, data,
                            [&](void *const *bufs) {
                    if (rank() != root) std::memcpy(data, bufs[root], bytes);
                });
            });
        }
        return run("broadcast", [&](const Call &call) {
            BroadcastOptions opts(context_);
            opts.setOutput(static_cast<char *>(data), bytes);
            opts.setRoot(root);
            return run_gloo(call, opts, opts.output(), [&] { gloo::broadcast(opts); });
        });
    }

    Status gather_pieces(const std::vector<Piece> &mine, const std::vector<std::vector<Piece>> &theirs,
                         int root) override {
        SX_TRY(check_pieces_args(*this, "gather_pieces", theirs, root));
        return run("gather_pieces", [&](const Call &call) {
            OpScope op = scope(call);
            if (context_->sparse()) return tree_exchange_pieces(op, root, mine, theirs, true);
            return exchange_pieces(op, root, mine, theirs, true);
        });
    }

    Status scatter_pieces(const std::vector<std::vector<Piece>> &theirs, const std::vector<Piece> &mine,
                          int root) override {
        SX_TRY(check_pieces_args(*this, "scatter_pieces", theirs, root));
        return run("scatter_pieces", [&](const Call &call) {
            OpScope op = scope(call);
            if (context_->sparse()) return tree_exchange_pieces(op, root, mine, theirs, false);
            return exchange_pieces(op, root, mine, theirs, false);
        });
    }

    Status barrier() override {
        return run("barrier", [&](const Call &call) {
            BarrierOptions opts(context_);
            return run_gloo(call, opts, opts.scratch(), [&] { gloo::barrier(opts); });
        });
    }

    void abort() override {
        if (aborted_.exchange(true)) return;
        if (meeting_) {
            meeting_->fail(rank(), SX_ERR_COMM, "its communicator was aborted");
            meeting_->wake();
        }
        SigpipeBlock no_sigpipe;
        poison();
        in_flight_.abort_waits();
        try {
            context_->closeConnections();
        } catch (...) {
            // Pairs that cannot be closed have failed already.
        }
        log(SX_LOG_INFO, "sx: rank %d: communicator aborted", rank());
    }

  private:
    template <class T>
    Status all_reduce(const char *what, T *data, size_t n, void (*reduce)(void *, const void *, const void *, size_t)) {
        if (n == 0) return usable(what);
        SX_CHECK_ARG(data != nullptr, "%s: data must not be NULL", what);
        return run(what, [&](const Call &call) {
            AllreduceOptions opts(context_);
            opts.setOutput(data, n);
            opts.setReduceFunction(reduce);
            return run_gloo(call, opts, opts.output(), [&] { gloo::allreduce(opts); });
        });
    }

    // One call's slot and deadline, from run() to the body that opens its OpScope.
    struct Call {
        uint64_t slot;
        Clock::time_point deadline;
    };
    OpScope scope(const Call &call) { return OpScope(*context_, in_flight_, call.slot, call.deadline, &waiting_for_); }

    // Runs one of Gloo's own algorithms: its options (declared by the caller, so they
    // outlive the scope opened here) get the call's tag and deadline, and their buffer
    // is registered for abort().
    template <class Options, class Algorithm>
    Status run_gloo(const Call &call, Options &opts, UnboundBuffer *buffer, Algorithm algorithm) {
        OpScope op = scope(call);
        opts.setTag(tag_);
        opts.setTimeout(op.wait_time());
        op.adopt(buffer);
        algorithm();
        op.done();
        return Status::Ok();
    }

    // Common frame of every collective: fail fast if unusable, run `body` within the
    // deadline, and turn whatever Gloo threw into a Status that names the collective.
    template <class Body>
    Status run(const char *what, Body body) {
        SX_TRY(usable(what));
        count_collective();
        SigpipeBlock no_sigpipe;
        const Clock::time_point start = Clock::now();
        ++tag_;
        waiting_for_.store(-1);
        Status s;
        try {
            s = body(Call{kRingSlotPrefix | (static_cast<uint64_t>(tag_) << 24), start + timeout_});
        } catch (const std::exception &e) {
            s = classify(what, e.what(), std::chrono::duration_cast<Millis>(Clock::now() - start));
        } catch (...) {
            s = SX_ERROR(SX_ERR_COMM, "%s failed on rank %d of %d: unknown exception from Gloo", what, rank(),
                         world_size());
        }
        if (aborted_.load()) s = SX_ERROR(SX_ERR_ABORTED, "%s was aborted (abort() was called)", what);
        if (!s.ok()) record_failure(s);
        return s;
    }

    Status meet(const char *what, const std::string &call_text, const Call &call, void *mine,
                const std::function<void(void *const *)> &fn) {
        Status s = meeting_->meet(rank(), call_text, mine, call.deadline, aborted_, fn);
        if (!s.ok()) s.prefix(format("%s on rank %d of %d (threads of one process): ", what, rank(), world_size()));
        return s;
    }

    // Which peer a failed wait was on, in words: "; it was waiting for rank 2 (host 'b')".
    std::string peer_waited_for() const {
        const int q = waiting_for_.load();
        if (q < 0 || q >= world_size() || q == rank()) return "";
        if (names_.empty()) return format("; it was waiting for its rank %d", q);
        return "; it was waiting for " + names_[static_cast<size_t>(q)];
    }

    Status classify(const char *what, const std::string &text, Millis elapsed) const {
        const long long t = static_cast<long long>(timeout_.count());
        const std::string peer = peer_waited_for();
        if (mentions_timeout(text)) {
            return SX_ERROR(SX_ERR_TIMEOUT, "%s timed out on rank %d of %d (timeout %lld ms)%s: gloo: %s", what,
                            rank(), world_size(), t, peer.c_str(), text.c_str());
        }
        if (elapsed * 4 >= timeout_ * 3) {
            return SX_ERROR(SX_ERR_TIMEOUT,
                            "%s timed out on rank %d of %d: a peer closed its connection after %lld of the %lld ms "
                            "timeout, as a peer does when it times out waiting for a stalled rank%s: gloo: %s",
                            what, rank(), world_size(), static_cast<long long>(elapsed.count()), t, peer.c_str(),
                            text.c_str());
        }
        return SX_ERROR(SX_ERR_COMM, "%s failed on rank %d of %d: a peer died or a connection broke%s: gloo: %s", what,
                        rank(), world_size(), peer.c_str(), text.c_str());
    }

    Status usable(const char *what) {
        if (aborted_.load()) return SX_ERROR(SX_ERR_ABORTED, "%s: the communicator was aborted", what);
        return failure_.check(what);
    }

    // The first failure also fails the peers: they stop waiting on this rank at once.
    void record_failure(const Status &s) {
        if (!failure_.record(s)) return;
        if (meeting_) meeting_->fail(rank(), s.code(), s.message());
        try {
            context_->closeConnections();  // peers fail fast instead of waiting for their timeout
        } catch (...) {
        }
    }

    // Makes Gloo fail every pair, waking every operation pending on any of them: a
    // receive on a slot nobody sends to, waited on for 1 ms, takes Gloo's timeout path,
    // which signals an exception to every pair of the context. A peer whose pair has
    // failed already refuses the receive; the next one is tried.
    void poison() {
        for (int peer : context_->peers()) {
            char byte = 0;
            bool waited = false;
            try {
                std::unique_ptr<UnboundBuffer> b = context_->createUnboundBuffer(&byte, 1);
                b->recv(peer, kPoisonSlot, 0, 1);
                waited = true;
                b->waitRecv(nullptr, Millis(1));
            } catch (...) {
                // Expected: the timeout path throws after failing the pairs.
            }
            if (waited) return;
        }
    }

    std::shared_ptr<FullMeshContext> context_;
    std::shared_ptr<Meeting> meeting_;  // when every rank is a thread of this process
    const Millis timeout_;
    const size_t rs_segment_bytes_, ag_segment_bytes_, rooted_sum_bytes_;
    InFlight in_flight_;
    uint32_t tag_ = 0;  // calls so far; only the calling thread touches it
    std::atomic<int> waiting_for_{-1};  // the peer the call in flight waits on (-1: unknown)
    const std::vector<std::string> names_;  // per rank, how errors call it (GlooOptions::rank_names)

    FailureLatch failure_;
    std::atomic<bool> aborted_{false};
};

// Whether every rank runs in this process (each tells its process_token through the
// store); if so, *meeting is the one they share, named by rank 0.
Status meet_in_process(const std::shared_ptr<rdzv::Store> &store, int rank, int world_size, Clock::time_point deadline,
                       std::shared_ptr<Meeting> *meeting) {
    static std::atomic<uint64_t> made{0};
    const std::string token = process_token();
    SX_TRY(store->set("process/" + std::to_string(rank), token));
    // Rank 0's first: a rank in another process than rank 0's reads one key, not all.
    for (int r = 0; r < world_size; ++r) {
        std::string theirs;
        SX_TRY(store->get("process/" + std::to_string(r), &theirs, time_left(deadline)));
        if (theirs != token) return Status::Ok();
    }
    if (rank == 0) SX_TRY(store->set("meeting", token + "#" + std::to_string(++made)));
    std::string id;
    SX_TRY(store->get("meeting", &id, time_left(deadline)));
    *meeting = Meeting::join(id, world_size);
    return Status::Ok();
}

// Whether the mesh of `world_size` ranks is sparse (connect_gloo_mesh).
Status choose_sparse(const GlooOptions &options, int world_size, bool *sparse) {
    GlooOptions::Mesh mesh = options.mesh;
    const char *env = std::getenv("SX_GLOO_MESH");
    if (mesh == GlooOptions::Mesh::kAuto && env != nullptr && *env != '\0') {
        const std::string v(env);
        SX_CHECK_ARG(v == "full" || v == "sparse" || v == "auto",
                     "SX_GLOO_MESH is '%s': it must be 'full', 'sparse' or 'auto'", env);
        if (v != "auto") mesh = v == "full" ? GlooOptions::Mesh::kFull : GlooOptions::Mesh::kSparse;
    }
    *sparse = mesh == GlooOptions::Mesh::kSparse ||
              (mesh == GlooOptions::Mesh::kAuto && world_size > GlooOptions::kFullMeshMost);
    return Status::Ok();
}

}  // namespace

Status connect_gloo_mesh(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const GlooOptions &options,
                         std::shared_ptr<FullMeshContext> *out) {
    SX_CHECK_ARG(store != nullptr, "store is NULL");
    SX_CHECK_ARG(world_size >= 1 && rank >= 0 && rank < world_size, "rank %d is not in [0, world_size %d)", rank,
                 world_size);
    SX_CHECK_ARG(options.timeout.count() > 0, "timeout %lld ms must be > 0",
                 static_cast<long long>(options.timeout.count()));
    const Clock::time_point deadline =
        options.deadline == Clock::time_point() ? Clock::now() + options.timeout : options.deadline;
    const std::string address = options.bind_address.empty() ? default_bind_address() : options.bind_address;

    SX_TRY(check_bind_address(address));
    bool sparse = false;
    SX_TRY(choose_sparse(options, world_size, &sparse));

    // Gloo's event-loop thread is created with the device and inherits this mask.
    SigpipeBlock no_sigpipe;
    std::shared_ptr<gloo::transport::Device> device;
    try {
        gloo::transport::tcp::attr attr;
        attr.hostname = address;
        device = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception &e) {
        return SX_ERROR(SX_ERR_COMM, "cannot bind Gloo's TCP transport to '%s': %s", address.c_str(), e.what());
    }

    auto context = std::make_shared<FullMeshContext>(rank, world_size);
    // Gloo waits up to 5x its timeout for a TCP connection to a peer to come up; give
    // it a fifth, so that creation stays within the timeout. The store waits (the long
    // part: ranks start at different times) use the full deadline.
    context->setTimeout(std::max(time_left(deadline) / 5, Millis(1)));
    std::shared_ptr<rdzv::Store> keys = make_prefix_store(store, "gloo/");
    SX_TRY(context->connect(*keys, device, deadline, sparse ? sparse_peers(rank, world_size) : std::vector<int>())
               .prefix(format("rank %d of %d: Gloo rendezvous: ", rank, world_size)));
    context->setTimeout(std::max(time_left(deadline), Millis(1)));
    SX_TRY(context->forget_keys(*keys).prefix(format("rank %d of %d: Gloo rendezvous: ", rank, world_size)));
    context->setTimeout(options.timeout);
    log(SX_LOG_DEBUG, "sx: rank %d of %d: Gloo connected on %s (%s mesh, %zu pairs)", rank, world_size,
        address.c_str(), sparse ? "sparse" : "full", context->peers().size());
    *out = std::move(context);
    return Status::Ok();
}

Status create_gloo_communicator(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const GlooOptions &options,
                                std::unique_ptr<Communicator> *out) {
    const Clock::time_point deadline =
        options.deadline == Clock::time_point() ? Clock::now() + options.timeout : options.deadline;
    GlooOptions o = options;
    o.deadline = deadline;
    std::shared_ptr<FullMeshContext> context;
    SX_TRY(connect_gloo_mesh(store, rank, world_size, o, &context));
    std::shared_ptr<Meeting> meeting;
    if (world_size > 1 && options.in_process)
        SX_TRY(meet_in_process(make_prefix_store(store, "inproc/"), rank, world_size, deadline, &meeting)
                   .prefix(format("rank %d of %d: ", rank, world_size)));
    out->reset(new GlooCommunicator(std::move(context), options, std::move(meeting)));
    return Status::Ok();
}

}  // namespace comm
}  // namespace sx
