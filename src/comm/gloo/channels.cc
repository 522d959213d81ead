// Channels on a context's one Gloo mesh (channels.h).
#include "comm/gloo/channels.h"

#include <gloo/math.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

#include "base/log.h"
#include "base/sigpipe.h"
#include "comm/gloo/op_scope.h"
#include "comm/gloo/ordered_all_reduce.h"
#include "comm/gloo/ring.h"
#include "comm/gloo/tree.h"
#include "rdzv/stores.h"

namespace sx {
namespace comm {
namespace {

constexpr uint64_t kChannelSlotPrefix = 0x55ull << 56;
constexpr int kIdBits = 28, kCallBits = 28;
constexpr uint64_t kIdMask = (1ull << kIdBits) - 1, kCallMask = (1ull << kCallBits) - 1;
// The context's one slot for failure notices (channels.h), from any peer.
constexpr uint64_t kNoticeSlot = 0x56ull << 56;
// The notice thread's wait: the timer wakes it every kNoticePoke, long before Gloo's own
// timeout of the wait would fail every pair of the context.
constexpr Millis kNoticeWait(3600 * 1000), kNoticePoke(600 * 1000);
// Notices sent that are kept for Gloo to send from (the oldest go; long delivered).
constexpr size_t kNoticesKept = 64, kEarlyKept = 256;

// From this size a float all-reduce goes round the ring (ring_all_reduce); below it,
// where latency and not bandwidth counts, it gathers to rank 0 in one round trip.
constexpr size_t kRingAllReduceBytes = 64 << 10;

class GlooChannel final : public Communicator, private GlooChannels::Watched, public GlooChannels::Noticed {
  public:
    GlooChannel(std::shared_ptr<GlooChannels> channels, uint64_t id, std::vector<int> ranks, int rank,
                const GlooOptions &options)
        : channels_(std::move(channels)),
          id_(id),
          ranks_(std::move(ranks)),
          rank_(rank),
          label_(options.label.empty() ? "the communicator" : options.label),
          timeout_(options.timeout),
          grace_(std::max(Millis(2000), options.timeout / 4)),
          rs_segment_bytes_(std::max(options.segment_bytes ? options.segment_bytes : kReduceScatterSegmentBytes,
                                     sizeof(float))),
          ag_segment_bytes_(options.segment_bytes ? options.segment_bytes : kAllGatherSegmentBytes),
          rooted_sum_bytes_(options.rooted_sum_bytes),
          sparse_(channels_->sparse()),
          spares_(&channels_->spare_bytes) {
        channels_->open.fetch_add(1);
    }
    ~GlooChannel() override {
        channels_->withdraw(id_);
        channels_->open.fetch_sub(1);
    }
    // Notices for it reach it from now on (create_gloo_channel, once it is made).
    void enlist() { channels_->enlist(id_, this); }

    int rank() const override { return rank_; }
    int world_size() const override { return static_cast<int>(ranks_.size()); }

    Status reduce_scatter_sum(float *buf, size_t shard_elems, float *out, bool accumulate) override {
        if (shard_elems == 0) return usable("reduce_scatter_sum");
        SX_TRY(check_reduce_scatter_args(*this, buf, shard_elems, out, accumulate));
        return run("reduce_scatter_sum", [&](OpScope &op) {
            return ring_reduce_scatter(op, buf, shard_elems, out, accumulate, rs_segment_bytes_ / sizeof(float));
        });
    }

    Status reduce_scatter_sum_16(uint16_t *buf, int32_t dtype, size_t shard_elems, float *out, float out_scale,
                                 bool accumulate) override {
        if (shard_elems == 0) return usable("reduce_scatter_sum_16");
        SX_TRY(check_reduce_scatter_16_args(*this, buf, dtype, shard_elems, out));
        return run("reduce_scatter_sum_16", [&](OpScope &op) {
            return ring_reduce_scatter_16(op, dtype, buf, shard_elems, out, out_scale, accumulate,
                                          rs_segment_bytes_ / sizeof(uint16_t));
        });
    }

    Status all_gather(void *buf, size_t shard_bytes) override {
        if (shard_bytes == 0) return usable("all_gather");
        SX_CHECK_ARG(buf != nullptr, "all_gather: buf must not be NULL");
        return run("all_gather", [&](OpScope &op) {
            return ring_all_gather(op, static_cast<char *>(buf), shard_bytes, ag_segment_bytes_);
        });
    }

    // Added in rank order (gloo/ordered_all_reduce.h): through rank 0 when small, else in parts.
    Status all_reduce_sum(double *data, size_t n) override {
        if (n == 0) return usable("all_reduce_sum");
        SX_CHECK_ARG(data != nullptr, "all_reduce_sum: data must not be NULL");
        return run("all_reduce_sum", [&](OpScope &op) {
            data = op.own(data, n, OpScope::kReads | OpScope::kWrites);
            if (sparse_) return sparse_ordered_sum(op, data, n, rooted_sum_bytes_, rs_segment_bytes_ / sizeof(double));
            return rank_ordered_sum(op, data, n, rooted_sum_bytes_);
        });
    }
    bool sums_in_rank_order() const override { return true; }
    Status all_reduce_max(uint64_t *data, size_t n) override {
        return all_reduce("all_reduce_max", data, n, &gloo::max<uint64_t>);
    }
    Status all_reduce_sum_f32(float *data, size_t n) override {
        if (n * sizeof(float) < kRingAllReduceBytes || world_size() == 1)
            return all_reduce("all_reduce_sum_f32", data, n, &gloo::sum<float>);
        return ring_all_reduce(data, n);
    }

    Status broadcast(void *data, size_t bytes, int root) override {
        SX_CHECK_ARG(root >= 0 && root < world_size(), "broadcast: root %d is not in [0, %d)", root, world_size());
        if (bytes == 0) return usable("broadcast");
        SX_CHECK_ARG(data != nullptr, "broadcast: data must not be NULL");
        return run("broadcast", [&](OpScope &op) {
            data = op.own(static_cast<char *>(data), bytes, rank_ == root ? OpScope::kReads : OpScope::kWrites);
            if (sparse_) {
                SX_TRY(tree_broadcast(op, root, data, bytes));
                op.done();
                return Status::Ok();
            }
            UnboundBuffer *b = op.buffer(data, bytes);
            if (rank_ != root) {
                b->recv(op.peer(root), op.slot(), 0, bytes);
                if (!op.wait_recv(b, root)) return SX_ERROR(SX_ERR_ABORTED, "aborted");
            } else {
                for (int q = 0; q < world_size(); ++q)
                    if (q != root) b->send(op.peer(q), op.slot(), 0, bytes);
                for (int q = 0; q < world_size(); ++q)
                    if (q != root && !op.wait_send(b, q)) return SX_ERROR(SX_ERR_ABORTED, "aborted");
            }
            op.done();
            return Status::Ok();
        });
    }

    Status gather_pieces(const std::vector<Piece> &mine, const std::vector<std::vector<Piece>> &theirs,
                         int root) override {
        SX_TRY(check_pieces_args(*this, "gather_pieces", theirs, root));
        return run("gather_pieces", [&](OpScope &op) { return exchange(op, root, mine, theirs, true); });
    }

    Status scatter_pieces(const std::vector<std::vector<Piece>> &theirs, const std::vector<Piece> &mine,
                          int root) override {
        SX_TRY(check_pieces_args(*this, "scatter_pieces", theirs, root));
        return run("scatter_pieces", [&](OpScope &op) { return exchange(op, root, mine, theirs, false); });
    }

    Status barrier() override {
        uint64_t one = 1;
        return all_reduce("barrier", &one, 1, &gloo::max<uint64_t>);
    }

    // The channel's own waits only: the transport and the other channels go on.
    void abort() override {
        if (aborted_.exchange(true)) return;
        in_flight_.abort_waits();
        log(SX_LOG_INFO, "sx: rank %d: channel %llu aborted", rank_, static_cast<unsigned long long>(id_));
    }
    // This rank failed the channel first (unless a peer's notice came before): the other
    // ranks are told.
    void fail_channel(const Status &why) override {
        if (!why.ok()) tell_peers(why);
        abort();
    }

    void notice(int from, sx_status_t code, const std::string &why) override {
        int r = -1;
        for (size_t q = 0; q < ranks_.size(); ++q)
            if (ranks_[q] == from) r = static_cast<int>(q);
        {
            std::lock_guard<std::mutex> lock(notice_mu_);
            if (noticed_.load()) return;
            notice_ = SX_ERROR(code == SX_ERR_TIMEOUT ? SX_ERR_TIMEOUT : SX_ERR_COMM,
                               "%s: its rank %d (rank %d of the context) failed first, and every rank's calls on this "
                               "channel fail with it (%s: %s)",
                               label_.c_str(), r, from, sx_status_string(code), why.c_str());
            noticed_.store(true);
            if (listener_) listener_(notice_);
        }
        told_.store(true);  // the first failure is the peer's: nothing to tell
        in_flight_.stop_waits();
    }

    void transport_failed() override { in_flight_.stop_waits(); }

    void listen(std::function<void(const Status &)> listener) {
        std::lock_guard<std::mutex> lock(notice_mu_);
        listener_ = std::move(listener);
        if (listener_ && noticed_.load()) listener_(notice_);
    }

  private:
    void tell_peers(const Status &why) {
        if (noticed_.load() || told_.exchange(true)) return;
        std::vector<int> to;
        for (size_t q = 0; q < ranks_.size(); ++q)
            if (static_cast<int>(q) != rank_) to.push_back(ranks_[q]);
        channels_->tell(id_, to, why);
    }
    Status notice_status(const char *what) {
        std::lock_guard<std::mutex> lock(notice_mu_);
        return Status(notice_).prefix(format("%s on rank %d of %d: ", what, rank_, world_size()));
    }

    void expire() override {
        timed_out_.store(true);
        in_flight_.abort_waits();
    }

    // Gathers to rank 0, which combines in rank order and sends the result back: the
    // same bits on every rank.
    template <class T>
    Status all_reduce(const char *what, T *data, size_t n, ReduceFn reduce) {
        if (n == 0) return usable(what);
        SX_CHECK_ARG(data != nullptr, "%s: data must not be NULL", what);
        return run(what, [&](OpScope &op) {
            data = op.own(data, n, OpScope::kReads | OpScope::kWrites);
            if (sparse_) return tree_all_reduce(op, data, n, sizeof(T), reduce);
            return rooted_all_reduce(op, data, n, sizeof(T), reduce);
        });
    }

    // A large float all-reduce (a mesh's replica all-reduce of a unit's shard, a trainer's
    // sx_all_reduce): the ring's reduce-scatter, then its all-gather, so that every rank
    // sends and receives 2 (P-1)/P of the data and none gathers all of it. Each part is
    // summed once, in its ring order, by the rank that owns it: the same bits on every rank.
    // Data not divisible into P equal parts is staged through a zero-padded copy.
    Status ring_all_reduce(float *data, size_t n) {
        SX_CHECK_ARG(data != nullptr, "all_reduce_sum_f32: data must not be NULL");
        const size_t P = static_cast<size_t>(world_size()), shard = (n + P - 1) / P;
        return run("all_reduce_sum_f32", [&](OpScope &op) {
            float *whole = data;
            if (shard * P != n) {  // zero-padded, in a block of the call's own
                whole = op.scratch<float>(shard * P);
                std::copy(data, data + n, whole);
            }
            SX_TRY(ring_reduce_scatter(op, whole, shard, whole + static_cast<size_t>(rank_) * shard, false,
                                       rs_segment_bytes_ / sizeof(float)));
            op.copy_back(data, whole, n * sizeof(float));  // at the all-gather's end (where padded)
            return ring_all_gather(op, reinterpret_cast<char *>(whole), shard * sizeof(float), ag_segment_bytes_);
        });
    }

    // gather_pieces (`gather`) and scatter_pieces. On a sparse mesh the tree's pieces are
    // packed in the call's own memory; on a full mesh they go straight between the root and
    // each rank, from and into copies of the call's own (OpScope::own).
    Status exchange(OpScope &op, int root, const std::vector<Piece> &mine,
                    const std::vector<std::vector<Piece>> &theirs, bool gather) {
        if (sparse_) return tree_exchange_pieces(op, root, mine, theirs, gather);
        auto own = [&](const std::vector<Piece> &pieces, bool sent) {
            std::vector<Piece> copies(pieces);
            for (Piece &p : copies)
                p.data = op.own(static_cast<char *>(p.data), p.bytes, sent ? OpScope::kReads : OpScope::kWrites);
            return copies;
        };
        if (rank_ != root) return exchange_pieces(op, root, own(mine, gather), theirs, gather);
        std::vector<std::vector<Piece>> copies(theirs.size());
        for (size_t q = 0; q < theirs.size(); ++q)
            if (static_cast<int>(q) != root) copies[q] = own(theirs[q], !gather);
        return exchange_pieces(op, root, mine, copies, gather);
    }

    // Every collective: fail fast if unusable; the call's slot, deadline and timer; what
    // Gloo threw, as a Status (a comm failure fails the whole transport).
    template <class Body>
    Status run(const char *what, Body body) {
        SX_TRY(usable(what));
        count_collective();
        SigpipeBlock no_sigpipe;
        const Clock::time_point start = Clock::now(), deadline = start + timeout_;
        const uint64_t slot = kChannelSlotPrefix | ((id_ & kIdMask) << kCallBits) | (++calls_ & kCallMask);
        waiting_for_.store(-1);
        timed_out_.store(false);
        channels_->watch(this, deadline);
        Status s;
        bool broken = false;
        try {
            OpScope op(channels_->context(), in_flight_, slot, deadline, &waiting_for_, ranks_, rank_, grace_,
                       channels_->remains(), spares_);
            s = body(op);
        } catch (const std::exception &e) {
            s = SX_ERROR(mentions_timeout(e.what()) ? SX_ERR_TIMEOUT : SX_ERR_COMM,
                         "%s failed on rank %d of %d: a peer died or a connection of the context broke%s: gloo: %s",
                         what, rank_, world_size(), peer_waited_for().c_str(), e.what());
            broken = true;
        } catch (...) {
            s = SX_ERROR(SX_ERR_COMM, "%s failed on rank %d of %d: unknown exception from Gloo", what, rank_,
                         world_size());
            broken = true;
        }
        channels_->unwatch(this);
        const Status thrown = s;  // what Gloo threw, for the transport (before the rewrites below)
        if (!s.ok() && aborted_.load()) {
            s = SX_ERROR(SX_ERR_ABORTED, "%s was aborted (abort() was called)", what);
        } else if (!s.ok() && !broken && !channels_->usable(what).ok()) {
            s = channels_->usable(what);  // another channel found the transport broken
        } else if (!s.ok() && !broken && noticed_.load()) {
            s = notice_status(what);
        } else if (!s.ok() && !broken && timed_out_.load()) {
            s = SX_ERROR(SX_ERR_TIMEOUT, "%s timed out on rank %d of %d (timeout %lld ms)%s", what, rank_,
                         world_size(), static_cast<long long>(timeout_.count()), peer_waited_for().c_str());
            tell_peers(s);
        }
        if (!s.ok()) {
            failure_.record(s);
            // The transport broke: every channel fails with what broke it, not with this
            // channel's abort (an owner's abort that came while Gloo threw).
            if (broken) channels_->fail(thrown);
        }
        return s;
    }

    std::string peer_waited_for() const {
        const int q = waiting_for_.load();
        if (q < 0 || q >= world_size() || q == rank_) return "";
        return format("; it was waiting for its rank %d (rank %d of the context)", q, ranks_[static_cast<size_t>(q)]);
    }

    Status usable(const char *what) {
        if (aborted_.load()) return SX_ERROR(SX_ERR_ABORTED, "%s: the communicator was aborted", what);
        SX_TRY(failure_.check(what));
        if (noticed_.load()) return notice_status(what);
        return channels_->usable(what);
    }

    const std::shared_ptr<GlooChannels> channels_;
    const uint64_t id_;
    const std::vector<int> ranks_;  // channel rank -> the context's rank
    const int rank_;
    const std::string label_;  // what errors call the channel's owner
    const Millis timeout_, grace_;
    const size_t rs_segment_bytes_, ag_segment_bytes_, rooted_sum_bytes_;
    const bool sparse_;  // on a sparse mesh: gloo/tree.h's collectives, over pairs made for the channel
    InFlight in_flight_;
    Spares spares_;                     // the memory of its calls, reused (one call at a time)
    uint64_t calls_ = 0;                // only the calling thread touches it
    std::atomic<int> waiting_for_{-1};  // the channel rank the call in flight waits on
    std::atomic<bool> timed_out_{false}, aborted_{false};
    FailureLatch failure_;
    // A peer's notice (notice()): the channel's first failure, a peer's.
    std::mutex notice_mu_;
    Status notice_;  // under notice_mu_
    std::function<void(const Status &)> listener_;  // under notice_mu_ (listen_for_notice)
    std::atomic<bool> noticed_{false}, told_{false};  // told_: this rank's failure was told, or needs not be
};

}  // namespace

// A failure notice, as it travels (every one of this size).
struct GlooChannels::Notice {
    uint64_t channel = 0;
    int32_t from = -1;  // the context rank that failed first
    int32_t code = 0;   // sx_status_t
    char why[496] = {0};
};

GlooChannels::GlooChannels(std::shared_ptr<FullMeshContext> context, std::shared_ptr<rdzv::Store> store)
    : context_(std::move(context)), store_(std::move(store)), inbox_(new Notice()) {
    peers_ = context_->peers();
    inbox_buffer_ = context_->createUnboundBuffer(inbox_.get(), sizeof(Notice));
    if (!peers_.empty()) inbox_buffer_->recv(peers_, kNoticeSlot, 0, sizeof(Notice));
    // Nothing unwinds out of either thread (a wait or an abort that threw would end the process).
    timer_ = std::thread([this] {
        Status s = catching([&] {
            run_timer();
            return Status::Ok();
        });
        if (!s.ok()) log(SX_LOG_ERROR, "sx: the context's channel timer stopped: %s", s.message().c_str());
    });
    try {
        if (!peers_.empty()) listener_ = std::thread([this] { listen(); });
    } catch (...) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        timer_.join();
        throw;
    }
}

GlooChannels::~GlooChannels() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    inbox_buffer_->abortWaitRecv();
    timer_.join();
    if (listener_.joinable()) listener_.join();
    // Every channel has gone, and the transport goes with this: its pairs are closed first
    // (under each pair's lock, after which Gloo's event loop touches no buffer), so that a
    // notice still being sent to a peer that stopped reading is not written from freed
    // memory as the notices kept in sent_ go.
    SigpipeBlock no_sigpipe;
    context_->close_pairs();
}

// Waits for the peers' notices, one at a time (the receive is posted again before one is
// delivered). A wait that throws (the transport failed) ends it: the channels then fail
// as their calls do.
void GlooChannels::listen() {
    for (;;) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (stop_) return;
        }
        Notice n;
        int source = -1;
        try {
            if (!inbox_buffer_->waitRecv(&source, kNoticeWait)) continue;  // woken: stop, or the timer's poke
            n = *inbox_;
            inbox_buffer_->recv(peers_, kNoticeSlot, 0, sizeof(Notice));
        } catch (const std::exception &e) {
            log(SX_LOG_DEBUG, "sx: rank %d: the context's failure notices stop: gloo: %s", context_->rank, e.what());
            return;
        }
        deliver(n, source);
    }
}

void GlooChannels::deliver(const Notice &n, int source) {
    const std::string why(n.why, strnlen(n.why, sizeof n.why));
    const sx_status_t code = static_cast<sx_status_t>(n.code);
    if (sparse()) {
        {
            std::lock_guard<std::mutex> lock(notice_mu_);
            if (!relayed_.insert(n.channel).second) return;  // told or passed on already
        }
        std::vector<int> on;
        for (int q : peers_)
            if (q != source && q != n.from) on.push_back(q);
        send(std::unique_ptr<Notice>(new Notice(n)), on);
    }
    std::lock_guard<std::mutex> lock(notice_mu_);
    auto it = enlisted_.find(n.channel);
    if (it != enlisted_.end()) {
        it->second->notice(n.from, code, why);
        return;
    }
    early_[n.channel] = Early{n.from, code, why};
    if (early_.size() > kEarlyKept) early_.erase(early_.begin());  // the oldest channel's
}

void GlooChannels::enlist(uint64_t id, Noticed *c) {
    std::lock_guard<std::mutex> lock(notice_mu_);
    enlisted_[id] = c;
    auto it = early_.find(id);
    if (it == early_.end()) return;
    c->notice(it->second.from, it->second.code, it->second.why);
    early_.erase(it);
}

void GlooChannels::withdraw(uint64_t id) {
    std::lock_guard<std::mutex> lock(notice_mu_);
    enlisted_.erase(id);
}

void GlooChannels::tell(uint64_t id, const std::vector<int> &to, const Status &why) {
    if (to.empty()) return;
    std::unique_ptr<Notice> n(new Notice());
    n->channel = id;
    n->from = context_->rank;
    n->code = why.code();
    std::snprintf(n->why, sizeof n->why, "%s", why.message().c_str());
    if (!sparse()) return send(std::move(n), to);
    {
        std::lock_guard<std::mutex> lock(notice_mu_);
        if (!relayed_.insert(id).second) return;  // a peer's notice for it came first, and went on
    }
    send(std::move(n), peers_);
}

void GlooChannels::send(std::unique_ptr<Notice> n, const std::vector<int> &to) {
    if (to.empty()) return;
    SigpipeBlock no_sigpipe;
    std::lock_guard<std::mutex> lock(sent_mu_);
    std::unique_ptr<gloo::transport::UnboundBuffer> b;
    Status made = catching([&] {
        b = context_->createUnboundBuffer(n.get(), sizeof(Notice));
        return Status::Ok();
    });
    if (!made.ok()) return;
    // A peer whose connection broke is not told (the others still are).
    for (int r : to) {
        Status sent = catching([&] {
            b->send(r, kNoticeSlot, 0, sizeof(Notice));
            return Status::Ok();
        });
        if (!sent.ok())
            log(SX_LOG_DEBUG, "sx: rank %d: a failure notice to rank %d was not sent: %s", context_->rank, r,
                sent.message().c_str());
    }
    sent_.emplace_back(std::move(n), std::move(b));
    while (sent_.size() > kNoticesKept) sent_.pop_front();
}

void GlooChannels::fail(const Status &why) {
    if (!failure_.record(Status(why).prefix("the context's Gloo transport failed: "))) return;
    SigpipeBlock no_sigpipe;
    context_->close_pairs();  // every channel's waits at the peers fail now
    std::lock_guard<std::mutex> lock(notice_mu_);
    for (auto &c : enlisted_) c.second->transport_failed();  // and here
}

void GlooChannels::watch(Watched *w, Clock::time_point deadline) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        watched_[w] = deadline;
    }
    cv_.notify_all();
}

void GlooChannels::unwatch(Watched *w) {
    std::lock_guard<std::mutex> lock(mu_);
    watched_.erase(w);
}

void GlooChannels::run_timer() {
    std::unique_lock<std::mutex> lock(mu_);
    Clock::time_point poke = Clock::now() + kNoticePoke;
    while (!stop_) {
        Clock::time_point next = Clock::time_point::max();
        const Clock::time_point now = Clock::now();
        if (now >= poke) {
            inbox_buffer_->abortWaitRecv();  // the notice thread waits again, never to Gloo's timeout
            poke = now + kNoticePoke;
        }
        next = poke;
        for (auto it = watched_.begin(); it != watched_.end();) {
            if (it->second <= now) {
                it->first->expire();
                it = watched_.erase(it);
            } else {
                next = std::min(next, it->second);
                ++it;
            }
        }
        cv_.wait_until(lock, next);
    }
}

Status open_gloo_channels(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const GlooOptions &options,
                          std::shared_ptr<GlooChannels> *out) {
    // Full, or sparse where the options, SX_GLOO_MESH or the size say so: a channel then
    // makes the pairs it needs beyond the mesh's as it is created (create_gloo_channel).
    std::shared_ptr<FullMeshContext> context;
    SX_TRY(connect_gloo_mesh(store, rank, world_size, options, &context));
    // Its timer thread may not start (std::system_error): the context is not made.
    return catching([&] {
        *out = std::make_shared<GlooChannels>(std::move(context), std::move(store));
        return Status::Ok();
    });
}

int64_t gloo_channels_open(const GlooChannels &channels) { return channels.open.load(); }

uint64_t gloo_channels_kept_bytes(GlooChannels &channels) {
    return static_cast<uint64_t>(channels.spare_bytes.load()) + channels.remains().bytes();
}

// The channel's rank 0 takes an id from the context's counter and names it with the
// channel's ranks ("id r0 r1 ..."); the others read it.
Status create_gloo_channel(const std::shared_ptr<GlooChannels> &channels, std::shared_ptr<rdzv::Store> store, int rank,
                           int world_size, const GlooOptions &options, std::unique_ptr<Communicator> *out) {
    SX_CHECK_ARG(channels != nullptr && store != nullptr, "create_gloo_channel: channels and store must not be NULL");
    SX_CHECK_ARG(world_size >= 1 && world_size <= channels->world_size() && rank >= 0 && rank < world_size,
                 "rank %d is not in [0, world_size %d), or the channel has more ranks than its context's %d", rank,
                 world_size, channels->world_size());
    SX_TRY(channels->usable("a new channel"));
    const Clock::time_point deadline =
        options.deadline == Clock::time_point() ? Clock::now() + options.timeout : options.deadline;
    SX_TRY(store->set(format("gloo-channel/rank/%d", rank), std::to_string(channels->rank())));
    std::string named;
    if (rank == 0) {
        std::ostringstream text;
        int64_t id = 0;
        SX_TRY(channels->store().add("gloo-channels", 1, &id));
        SX_CHECK(static_cast<uint64_t>(id) <= kIdMask, SX_ERR_UNSUPPORTED,
                 "the context has made %lld channels, the most its Gloo slots can tell apart: make a new context",
                 static_cast<long long>(id));
        text << id;
        for (int q = 0; q < world_size; ++q) {
            std::string theirs;
            SX_TRY(store->get(format("gloo-channel/rank/%d", q), &theirs, time_left(deadline)));
            text << ' ' << theirs;
        }
        named = text.str();
        SX_TRY(store->set("gloo-channel", named));
    } else {
        SX_TRY(store->get("gloo-channel", &named, time_left(deadline)));
    }
    std::istringstream in(named);
    uint64_t id = 0;
    in >> id;
    std::vector<int> ranks(static_cast<size_t>(world_size), -1);
    for (int &r : ranks) in >> r;
    SX_CHECK(in && ranks[static_cast<size_t>(rank)] == channels->rank(), SX_ERR_INTERNAL,
             "the channel's ranks '%s' do not place this rank (%d of the context) at %d", named.c_str(),
             channels->rank(), rank);
    if (channels->sparse()) {
        // Its ring's and trees' pairs: its ranks a power of two away, in its own order.
        std::vector<int> needed;
        for (int q : sparse_peers(rank, world_size)) needed.push_back(ranks[static_cast<size_t>(q)]);
        SX_TRY(channels->pair_with(needed, deadline)
                   .prefix(format("channel rank %d of %d (rank %d of the context): ", rank, world_size,
                                  channels->rank())));
        SX_TRY(channels->usable("a new channel"));  // the transport failed while its pairs were made
    }
    std::unique_ptr<GlooChannel> c(new GlooChannel(channels, id, std::move(ranks), rank, options));
    c->enlist();
    *out = std::move(c);
    return Status::Ok();
}

bool listen_for_notice(Communicator *channel, std::function<void(const Status &)> listener) {
    GlooChannel *c = dynamic_cast<GlooChannel *>(channel);
    if (c) c->listen(std::move(listener));
    return c != nullptr;
}

}  // namespace comm
}  // namespace sx
