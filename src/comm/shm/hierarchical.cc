// The Communicator of ranks on several hosts with several ranks each
// (create_cpu_communicator): the ranks of a host combine through their shared memory, and
// the hosts exchange through Gloo between host peers, the ranks of the same local index
// on each host (NCCL's hierarchy, in rings of host peers). Three communicators:
//   local  the ranks of this host (shared memory), local index i of L;
//   peers  the ranks of local index i on every host (Gloo), host h of H, hosts ordered by
//          their lowest global rank;
//   flat   every rank (Gloo), for the small and rare calls.
// A reduce-scatter packs the buffer so that local index i's part holds, for every host h,
// the shard of the rank (h, i); a local reduce-scatter sums each part over the host, and
// a reduce-scatter among the host peers sums the hosts' sums: each rank ends with the sum
// of its own shard, and only 1/L of the data leaves a host per rank. An all-gather is the
// reverse (peers, then the host), and an fp32 all-reduce sums over the host, then each
// local index its slice over the hosts, then the host gathers the slices.
#include <algorithm>
#include <cstring>
#include <mutex>

#include "base/half.h"
#include "base/log.h"
#include "base/memory.h"
#include "comm/communicator.h"
#include "comm/gloo/channels.h"
#include "comm/shm/hierarchical.h"
#include "rdzv/store.h"

namespace sx {
namespace comm {
namespace {

class HierarchicalCommunicator final : public Communicator {
  public:
    HierarchicalCommunicator(const HostPlacement &placement, int rank, std::unique_ptr<Communicator> local,
                             std::unique_ptr<Communicator> peers, std::unique_ptr<Communicator> flat, bool channels)
        : p_(placement), rank_(rank), local_(std::move(local)), peers_(std::move(peers)), flat_(std::move(flat)),
          channels_(channels) {
        if (!channels_) return;
        // A peer's notice on a Gloo channel (every failure is told on the one among all
        // ranks) ends this rank's waits on the other two at once, whichever it is in.
        listen_for_notice(peers_.get(), [this](const Status &why) { noticed(why, peers_.get()); });
        listen_for_notice(flat_.get(), [this](const Status &why) { noticed(why, flat_.get()); });
    }
    ~HierarchicalCommunicator() override {
        if (!channels_) return;
        listen_for_notice(peers_.get(), nullptr);  // no notice runs once these return
        listen_for_notice(flat_.get(), nullptr);
    }

    int rank() const override { return rank_; }
    int world_size() const override { return p_.hosts * p_.per_host; }

    Status reduce_scatter_sum(float *buf, size_t shard_elems, float *out, bool accumulate) override {
        if (shard_elems == 0) return usable("reduce_scatter_sum");
        SX_TRY(check_reduce_scatter_args(*this, buf, shard_elems, out, accumulate));
        SX_TRY(usable("reduce_scatter_sum"));
        const size_t H = static_cast<size_t>(p_.hosts), S = shard_elems;
        float *packed = nullptr, *host_sum = nullptr;
        SX_TRY(scratch(0, H * S * static_cast<size_t>(p_.per_host), &packed));
        SX_TRY(scratch(1, H * S, &host_sum));
        pack(buf, packed, S * sizeof(float));
        Status s = local_->reduce_scatter_sum(packed, H * S, host_sum, false);
        if (s.ok()) s = peers_->reduce_scatter_sum(host_sum, S, out, accumulate);
        return checked(s);
    }

    Status reduce_scatter_sum_16(uint16_t *buf, int32_t dtype, size_t shard_elems, float *out, float out_scale,
                                 bool accumulate) override {
        if (shard_elems == 0) return usable("reduce_scatter_sum_16");
        SX_TRY(check_reduce_scatter_16_args(*this, buf, dtype, shard_elems, out));
        SX_TRY(usable("reduce_scatter_sum_16"));
        const size_t H = static_cast<size_t>(p_.hosts), S = shard_elems;
        uint16_t *packed = nullptr, *host_sum = nullptr;
        float *wide = nullptr;
        SX_TRY(scratch(0, H * S * static_cast<size_t>(p_.per_host), &packed));
        SX_TRY(scratch(1, H * S, &wide));
        SX_TRY(scratch(2, H * S, &host_sum));
        pack(buf, packed, S * sizeof(uint16_t));
        // The host's sum, in the dtype (widened exactly, and narrowed back exactly), then
        // the hosts' in the dtype too: every addition rounds to it, as the contract says.
        Status s = local_->reduce_scatter_sum_16(packed, dtype, H * S, wide, 1.0f, false);
        if (s.ok()) {
            half::from_f32(dtype, wide, host_sum, H * S);
            s = peers_->reduce_scatter_sum_16(host_sum, dtype, S, out, out_scale, accumulate);
        }
        return checked(s);
    }

    Status all_gather(void *buf, size_t shard_bytes) override {
        if (shard_bytes == 0) return usable("all_gather");
        SX_CHECK_ARG(buf != nullptr, "all_gather: buf must not be NULL");
        SX_TRY(usable("all_gather"));
        const size_t H = static_cast<size_t>(p_.hosts), L = static_cast<size_t>(p_.per_host), B = shard_bytes;
        char *peers = nullptr, *all = nullptr;
        SX_TRY(scratch(0, H * B, &peers));
        SX_TRY(scratch(1, L * H * B, &all));
        char *b = static_cast<char *>(buf);
        std::memcpy(peers + static_cast<size_t>(p_.host) * B, b + static_cast<size_t>(rank_) * B, B);
        Status s = peers_->all_gather(peers, B);
        if (s.ok()) {
            std::memcpy(all + static_cast<size_t>(p_.local) * H * B, peers, H * B);
            s = local_->all_gather(all, H * B);
        }
        if (s.ok()) unpack(all, b, B);
        return checked(s);
    }

    Status all_reduce_sum(double *data, size_t n) override { return checked(flat_->all_reduce_sum(data, n)); }
    bool sums_in_rank_order() const override { return flat_->sums_in_rank_order(); }
    Status all_reduce_max(uint64_t *data, size_t n) override { return checked(flat_->all_reduce_max(data, n)); }

    // The host's sum on every local rank; local index i sums its slice over the hosts;
    // the host gathers the slices. Every rank ends with the same bits.
    Status all_reduce_sum_f32(float *data, size_t n) override {
        if (n == 0) return usable("all_reduce_sum_f32");
        SX_CHECK_ARG(data != nullptr, "all_reduce_sum_f32: data must not be NULL");
        SX_TRY(usable("all_reduce_sum_f32"));
        const size_t L = static_cast<size_t>(p_.per_host), per = (n + L - 1) / L;
        const size_t lo = std::min(n, per * static_cast<size_t>(p_.local)), hi = std::min(n, lo + per);
        float *slices = nullptr;
        SX_TRY(scratch(0, per * L, &slices));
        Status s = local_->all_reduce_sum_f32(data, n);
        if (s.ok() && hi > lo) s = peers_->all_reduce_sum_f32(data + lo, hi - lo);
        if (s.ok()) {
            std::memcpy(slices + static_cast<size_t>(p_.local) * per, data + lo, (hi - lo) * sizeof(float));
            s = local_->all_gather(slices, per * sizeof(float));
        }
        if (s.ok())
            for (size_t q = 0; q < L; ++q) {
                const size_t a = std::min(n, per * q), z = std::min(n, a + per);
                std::memcpy(data + a, slices + q * per, (z - a) * sizeof(float));
            }
        return checked(s);
    }

    Status broadcast(void *data, size_t bytes, int root) override {
        return checked(flat_->broadcast(data, bytes, root));
    }
    Status gather_pieces(const std::vector<Piece> &mine, const std::vector<std::vector<Piece>> &theirs,
                         int root) override {
        return checked(flat_->gather_pieces(mine, theirs, root));
    }
    Status scatter_pieces(const std::vector<std::vector<Piece>> &theirs, const std::vector<Piece> &mine,
                          int root) override {
        return checked(flat_->scatter_pieces(theirs, mine, root));
    }
    Status barrier() override { return checked(flat_->barrier()); }

    void abort() override {
        local_->abort();
        peers_->abort();
        flat_->abort();
    }

    // A context's channels: every peer, on this host and the others, is told (where this
    // rank's is the first failure; else the waits end).
    void fail_channel(const Status &why) override {
        if (!channels_ || why.ok() || !first_failure(why, nullptr)) return abort();
        tell(why);
    }

    // This host's peers are watched through shared memory; the other hosts' are not.
    std::vector<int> exited_peers() const override {
        std::vector<int> out;
        for (int i : local_->exited_peers()) out.push_back(p_.rank_of[static_cast<size_t>(p_.host * p_.per_host + i)]);
        std::sort(out.begin(), out.end());
        return out;
    }

  private:
    // Scratch buffer k, of n T's at least, from this process's shared arena where it has
    // room, so that the host's ranks read each other's in place (else private, through
    // the slots); kept, and grown as calls need.
    template <class T>
    Status scratch(int k, size_t n, T **out) {
        HostBuffer &b = scratch_[k];
        if (b.size() < n * sizeof(T)) {
            b.reset();
            SX_TRY(b.allocate(n * sizeof(T), "a scratch buffer of the hierarchical communicator", HostBuffer::kLazy,
                              HostBuffer::kExchanged));
        }
        *out = b.as<T>();
        return Status::Ok();
    }

    // buf's shards (W of `bytes` each, in global rank order) into `packed`, ordered by
    // local index, then host: part i of the host's reduce-scatter holds the shards of the
    // ranks (h, i) for every host h. unpack is the reverse.
    void pack(const void *buf, void *packed, size_t bytes) const {
        permute(const_cast<void *>(buf), packed, bytes, true);
    }
    void unpack(const void *packed, void *buf, size_t bytes) const {
        permute(buf, const_cast<void *>(packed), bytes, false);
    }
    // One walk of the packed order (local index, then host) for both directions.
    void permute(void *by_rank, void *packed, size_t bytes, bool to_packed) const {
        char *ranked = static_cast<char *>(by_rank), *p = static_cast<char *>(packed);
        for (int i = 0; i < p_.per_host; ++i)
            for (int h = 0; h < p_.hosts; ++h) {
                const size_t r = static_cast<size_t>(p_.rank_of[static_cast<size_t>(h * p_.per_host + i)]);
                if (to_packed)
                    std::memcpy(p, ranked + r * bytes, bytes);
                else
                    std::memcpy(ranked + r * bytes, p, bytes);
                p += bytes;
            }
    }

    // A failed part fails the whole: the other parts are aborted, so that every peer,
    // whichever part it waits in, fails at once (this host's peers told why; a context's
    // channels tell every peer), and every later call fails fast.
    Status checked(Status s) {
        if (s.ok()) return s;
        if (channels_) {
            // Told already (this rank failed first, or a peer's notice aborted the part
            // this call was in): the first failure says why.
            Status kept;
            if (first_failure(s, &kept)) tell(s);
            return kept;
        }
        failure_.record(s);
        local_->abort_because(s);
        peers_->abort();
        flat_->abort();
        return s;
    }

    Status usable(const char *what) { return failure_.check(what); }

    // A peer's notice failed `on` (one of the Gloo channels): the other parts' waits end.
    void noticed(const Status &why, Communicator *on) {
        if (!first_failure(why, nullptr)) return;
        local_->abort_because(why);
        for (Communicator *c : {peers_.get(), flat_.get()})
            if (c != on) c->abort();
    }

    // Keeps s as the communicator's failure unless one is kept already: true where s is
    // the first; *kept (if not null): the first.
    bool first_failure(const Status &s, Status *kept) {
        failure_.record(s);
        std::lock_guard<std::mutex> lock(first_mu_);
        const bool first = first_.ok();
        if (first) first_ = s;
        if (kept) *kept = first_;
        return first;
    }

    // The first failure is this rank's: every peer is told, on the channels among all ranks
    // and among host peers first, then on this host's (whose abort ends this rank's own
    // waits, which then find the failure kept).
    void tell(const Status &why) {
        flat_->fail_channel(why);
        peers_->fail_channel(why);
        local_->fail_channel(why);
    }

    const HostPlacement p_;
    const int rank_;
    std::unique_ptr<Communicator> local_, peers_, flat_;
    const bool channels_;  // the three are a context's channels
    HostBuffer scratch_[3];
    FailureLatch failure_;
    std::mutex first_mu_;
    Status first_;  // under first_mu_: a context's channels' first failure, this rank's or a peer's
};

}  // namespace

std::string host_name_of(const std::string &identity) {
    for (const char *given : {"override:", "given:"})
        if (identity.compare(0, std::strlen(given), given) == 0) return identity.substr(std::strlen(given));
    const size_t slash = identity.find('/');  // "<boot id>/<host name>"
    return slash == std::string::npos ? identity : identity.substr(slash + 1);
}

bool place_hosts(const std::vector<std::string> &hosts, HostPlacement *out) {
    HostPlacement p;
    std::vector<std::string> order;  // hosts by their lowest rank
    std::vector<std::vector<int>> ranks;
    for (size_t r = 0; r < hosts.size(); ++r) {
        const size_t h = static_cast<size_t>(std::find(order.begin(), order.end(), hosts[r]) - order.begin());
        if (h == order.size()) {
            order.push_back(hosts[r]);
            ranks.emplace_back();
        }
        ranks[h].push_back(static_cast<int>(r));
    }
    p.hosts = static_cast<int>(order.size());
    p.per_host = ranks.empty() ? 0 : static_cast<int>(ranks[0].size());
    for (const std::vector<int> &on : ranks)
        if (static_cast<int>(on.size()) != p.per_host) return false;
    if (p.hosts < 2 || p.per_host < 2) return false;
    for (int h = 0; h < p.hosts; ++h)
        for (int i = 0; i < p.per_host; ++i) p.rank_of.push_back(ranks[static_cast<size_t>(h)][static_cast<size_t>(i)]);
    for (const std::string &h : order) p.names.push_back(host_name_of(h));
    *out = p;
    return true;
}

bool locate_rank(HostPlacement *p, int rank) {
    const size_t at = static_cast<size_t>(std::find(p->rank_of.begin(), p->rank_of.end(), rank) - p->rank_of.begin());
    if (at >= p->rank_of.size() || p->per_host <= 0) return false;
    p->host = static_cast<int>(at) / p->per_host;
    p->local = static_cast<int>(at) % p->per_host;
    return true;
}

std::unique_ptr<Communicator> combine_hosts(const HostPlacement &placement, int rank,
                                            std::unique_ptr<Communicator> local, std::unique_ptr<Communicator> peers,
                                            std::unique_ptr<Communicator> flat, bool channels) {
    return std::unique_ptr<Communicator>(new HierarchicalCommunicator(placement, rank, std::move(local),
                                                                      std::move(peers), std::move(flat), channels));
}

Millis host_part_timeout(Millis timeout) {
    return timeout + std::min(std::max(timeout / 4, Millis(250)), Millis(5000));
}

std::vector<std::string> host_peer_names(const HostPlacement &p) {
    std::vector<std::string> names;
    for (int h = 0; h < p.hosts; ++h)
        names.push_back(format("rank %d (host '%s')", p.rank_of[static_cast<size_t>(h * p.per_host + p.local)],
                               p.names[static_cast<size_t>(h)].c_str()));
    return names;
}

Status create_hierarchical_communicator(std::shared_ptr<rdzv::Store> store, int rank, const HostPlacement &placement,
                                        const GlooOptions &options, std::unique_ptr<Communicator> *out,
                                        bool *hierarchical) {
    HostPlacement p = placement;
    SX_CHECK_ARG(locate_rank(&p, rank), "create_hierarchical_communicator: rank %d is on no host", rank);
    const int world = p.hosts * p.per_host;
    std::unique_ptr<Communicator> flat, local, peers;
    SX_TRY(create_gloo_communicator(rdzv::make_prefix_store(store, "flat/"), rank, world, options, &flat));
    ShmOptions so;
    so.timeout = host_part_timeout(options.timeout);
    so.deadline = options.deadline;
    Status s = create_shm_communicator(rdzv::make_prefix_store(store, "host" + std::to_string(p.host) + "/"),
                                       p.local, p.per_host, so, &local);
    if (!s.ok() && s.code() != SX_ERR_UNSUPPORTED) return s;
    // Every rank learns whether every host shares memory: where one cannot, plain Gloo.
    uint64_t failed = s.ok() ? 0 : 1;
    SX_TRY(flat->all_reduce_max(&failed, 1));
    if (failed) {
        if (!s.ok()) log(SX_LOG_WARN, "sx: rank %d: %s; the ranks exchange through TCP instead", rank, s.message().c_str());
        *hierarchical = false;
        *out = std::move(flat);
        return Status::Ok();
    }
    GlooOptions po = options;  // the host peers are named by their ranks in the world and their hosts
    po.rank_names = host_peer_names(p);
    SX_TRY(create_gloo_communicator(rdzv::make_prefix_store(store, "peers" + std::to_string(p.local) + "/"), p.host,
                                    p.hosts, po, &peers));
    log(SX_LOG_DEBUG,
        "sx: rank %d of %d: host %d of %d, local rank %d of %d: its communicator combines through shared memory on its "
        "host and through TCP with its host peers",
        rank, world, p.host, p.hosts, p.local, p.per_host);
    *hierarchical = true;
    *out = combine_hosts(p, rank, std::move(local), std::move(peers), std::move(flat), false);
    return Status::Ok();
}

}  // namespace comm
}  // namespace sx
