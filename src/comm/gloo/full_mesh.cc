#include "comm/gloo/full_mesh.h"

#include <gloo/barrier.h>
#include <gloo/transport/context.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "base/log.h"
#include "comm/gloo/ring.h"

namespace sx {
namespace comm {
namespace {

std::string pair_key(int from, int to) { return std::to_string(from) + "/" + std::to_string(to); }
// add_pairs' keys: where rank `from`'s pair with rank `to`, made after connect(), listens.
std::string added_key(int from, int to) { return "pair/" + pair_key(from, to); }

// The bytes of a socket address of this family; 0 for a family Gloo's TCP transport
// does not use.
size_t sockaddr_size(const sockaddr_storage &ss) {
    if (ss.ss_family == AF_INET) return sizeof(sockaddr_in);
    if (ss.ss_family == AF_INET6) return sizeof(sockaddr_in6);
    return 0;
}

// Where a pair listens (before it connects): its device's host address and its own port.
const sockaddr_storage &listening_address(const gloo::transport::Pair &pair) {
    return dynamic_cast<const gloo::transport::tcp::Address &>(pair.address()).getSockaddr();
}

// Whether two socket addresses are the same host address (their ports aside).
bool same_host(const sockaddr_storage &a, const sockaddr_storage &b) {
    if (a.ss_family != b.ss_family) return false;
    if (a.ss_family == AF_INET)
        return std::memcmp(&reinterpret_cast<const sockaddr_in &>(a).sin_addr,
                           &reinterpret_cast<const sockaddr_in &>(b).sin_addr, sizeof(in_addr)) == 0;
    return std::memcmp(&reinterpret_cast<const sockaddr_in6 &>(a).sin6_addr,
                       &reinterpret_cast<const sockaddr_in6 &>(b).sin6_addr, sizeof(in6_addr)) == 0;
}

// Whether this rank's side of a pair connects to the peer's, as tcp::Pair::connect
// decides it: the side whose listening address is the greater (host addresses compared
// as bytes, then ports as stored) connects, the other waits to be connected. Addresses
// of different families: true (Pair::connect then refuses them at once).
bool connects(const sockaddr_storage &self, const sockaddr_storage &peer) {
    if (self.ss_family != peer.ss_family) return true;
    int rv = 0;
    if (self.ss_family == AF_INET) {
        const auto &a = reinterpret_cast<const sockaddr_in &>(self), &b = reinterpret_cast<const sockaddr_in &>(peer);
        rv = std::memcmp(&a.sin_addr, &b.sin_addr, sizeof(in_addr));
        if (rv == 0) rv = a.sin_port - b.sin_port;
    } else {
        const auto &a = reinterpret_cast<const sockaddr_in6 &>(self), &b = reinterpret_cast<const sockaddr_in6 &>(peer);
        rv = std::memcmp(&a.sin6_addr, &b.sin6_addr, sizeof(in6_addr));
        if (rv == 0) rv = a.sin6_port - b.sin6_port;
    }
    return rv > 0;
}

// Publishes this rank's keys for peers[*next] up to peers[last] (indexes), in order.
Status publish(rdzv::Store &store, gloo::transport::Context &transport, const std::vector<int> &peers, size_t last,
               size_t *next) {
    for (; *next <= last; ++*next) {
        const int p = peers[*next];
        const sockaddr_storage &ss = listening_address(*transport.getPair(p));
        SX_TRY(store.set(pair_key(transport.rank, p),
                         std::string(reinterpret_cast<const char *>(&ss), sockaddr_size(ss))));
    }
    return Status::Ok();
}

// Takes `peer`'s key for rank `rank` from the store (and erases it): where the peer's pair
// with this rank listens.
Status take_address(rdzv::Store &store, const std::string &key, int peer, Clock::time_point deadline,
                    sockaddr_storage *theirs) {
    std::string value;
    Status s = store.get(key, &value, time_left(deadline));
    if (!s.ok())
        return s.prefix(format("no address came from rank %d (it has not arrived, it failed before publishing "
                               "it, or it connects a sparse mesh: SX_GLOO_MESH must be the same on every rank): ",
                               peer));
    SX_TRY(store.erase(key));
    std::memset(theirs, 0, sizeof *theirs);
    if (value.size() <= sizeof *theirs) std::memcpy(theirs, value.data(), value.size());
    SX_CHECK(!value.empty() && value.size() == sockaddr_size(*theirs), SX_ERR_COMM,
             "rank %d published %zu bytes that are no IPv4 or IPv6 socket address", peer, value.size());
    return Status::Ok();
}

// A sparse mesh's one key per rank, "<r>": for each of its pairs, the peer (4 bytes), the
// length of the pair's listening address (1 byte) and the address's bytes.
std::string sparse_key(int r) { return std::to_string(r); }

std::string sparse_value(gloo::transport::Context &transport, const std::vector<int> &peers) {
    std::string value;
    for (int p : peers) {
        const sockaddr_storage &ss = listening_address(*transport.getPair(p));
        const int32_t peer = p;
        const uint8_t bytes = static_cast<uint8_t>(sockaddr_size(ss));
        value.append(reinterpret_cast<const char *>(&peer), sizeof peer);
        value.append(reinterpret_cast<const char *>(&bytes), 1);
        value.append(reinterpret_cast<const char *>(&ss), bytes);
    }
    return value;
}

// Reads `peer`'s key (waiting for it until the deadline) and finds in it where its pair
// with `rank` listens.
Status sparse_address(rdzv::Store &store, int rank, int peer, Clock::time_point deadline, sockaddr_storage *theirs) {
    std::string value;
    Status s = store.get(sparse_key(peer), &value, time_left(deadline));
    if (!s.ok())
        return s.prefix(format("no addresses came from rank %d (it has not arrived, it failed before publishing "
                               "them, or it connects a full mesh: SX_GLOO_MESH must be the same on every rank): ",
                               peer));
    for (size_t at = 0; at + 5 <= value.size();) {
        int32_t p = 0;
        std::memcpy(&p, value.data() + at, sizeof p);
        const size_t bytes = static_cast<uint8_t>(value[at + 4]);
        SX_CHECK(at + 5 + bytes <= value.size() && bytes <= sizeof *theirs, SX_ERR_COMM,
                 "rank %d published a list of addresses cut short", peer);
        if (p == rank) {
            std::memset(theirs, 0, sizeof *theirs);
            std::memcpy(theirs, value.data() + at + 5, bytes);
            SX_CHECK(bytes > 0 && bytes == sockaddr_size(*theirs), SX_ERR_COMM,
                     "rank %d published %zu bytes that are no IPv4 or IPv6 socket address", peer, bytes);
            return Status::Ok();
        }
        at += 5 + bytes;
    }
    return SX_ERROR(SX_ERR_MISMATCH,
                    "rank %d's sparse mesh has no pair with rank %d: every rank must connect a mesh of the same "
                    "ranks",
                    peer, rank);
}

// Connects this rank's pair with `peer`, whose side listens at `theirs`.
Status connect_pair(gloo::transport::Context &transport, int peer, const sockaddr_storage &theirs) {
    try {
        transport.getPair(peer)->connect(gloo::transport::tcp::Address(theirs).bytes());
    } catch (const std::exception &e) {
        // Gloo waits up to 5x the pair's timeout for the connection (tcp::Pair::waitUntil).
        return SX_ERROR(mentions_timeout(e.what()) ? SX_ERR_TIMEOUT : SX_ERR_COMM,
                        "could not connect to rank %d within %lld ms: gloo: %s", peer,
                        static_cast<long long>(transport.getTimeout().count() * 5), e.what());
    }
    return Status::Ok();
}

}  // namespace

std::vector<int> sparse_peers(int rank, int size) {
    std::vector<int> peers;
    for (int64_t d = 1; d < size; d <<= 1) {
        peers.push_back(static_cast<int>((rank + d) % size));
        peers.push_back(static_cast<int>((rank + size - d) % size));
    }
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    peers.erase(std::remove(peers.begin(), peers.end(), rank), peers.end());
    return peers;
}

Status FullMeshContext::connect(rdzv::Store &store, const std::shared_ptr<gloo::transport::Device> &device,
                                Clock::time_point deadline, std::vector<int> peers) {
    const bool sparse = !peers.empty();
    if (peers.empty())
        for (int p = 0; p < size; ++p)
            if (p != rank) peers.push_back(p);
    try {
        std::shared_ptr<gloo::transport::Context> transport = device->createContext(rank, size);
        transport->setTimeout(getTimeout());
        for (int p : peers) transport->createPair(p);
        size_t next = 0;
        int local_rank = 0;
        // The pairs whose other side connects, and where each listens: connected last,
        // so that no rank waits on a peer's connection while the peer waits on a key.
        std::vector<std::pair<int, sockaddr_storage>> accepting;
        if (sparse) SX_TRY(store.set(sparse_key(rank), sparse_value(*transport, peers)));
        for (size_t i = 0; i < peers.size(); ++i) {
            const int p = peers[i];
            sockaddr_storage theirs;
            if (sparse) {
                SX_TRY(sparse_address(store, rank, p, deadline, &theirs));
            } else {
                SX_TRY(publish(store, *transport, peers, std::min(peers.size() - 1, i + kPublishAhead), &next));
                SX_TRY(take_address(store, pair_key(p, rank), p, deadline, &theirs));
            }
            const sockaddr_storage &mine = listening_address(*transport->getPair(p));
            if (p < rank && same_host(theirs, mine)) ++local_rank;
            if (connects(mine, theirs))
                SX_TRY(connect_pair(*transport, p, theirs));
            else
                accepting.emplace_back(p, theirs);
        }
        for (const auto &a : accepting) SX_TRY(connect_pair(*transport, a.first, a.second));
        // Gloo counts the ranks below this one with its host name; here, with its host
        // address. Neither Gloo's TCP transport nor sx reads it.
        for (int p : peers) transport->getPair(p)->setLocalRank(local_rank);
        if (sparse) {
            std::lock_guard<std::mutex> lock(pairs_mu_);
            pair_state_.assign(static_cast<size_t>(size), PairState::kNone);
            pair_state_[static_cast<size_t>(rank)] = PairState::kMade;  // never a pair
            for (int p : peers) pair_state_[static_cast<size_t>(p)] = PairState::kMade;
        }
        peers_ = std::move(peers);
        sparse_ = sparse;
        device_ = device;
        transportContext_ = std::move(transport);
        return Status::Ok();
    } catch (const std::bad_alloc &) {
        return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "no memory for Gloo's pairs");
    } catch (const std::exception &e) {
        return SX_ERROR(SX_ERR_COMM, "Gloo could not make its pairs: %s", e.what());
    }
}

void FullMeshContext::close_pairs() {
    std::lock_guard<std::mutex> lock(pairs_mu_);
    try {
        closeConnections();
    } catch (...) {
        // A pair that cannot even be closed has already failed.
    }
}

size_t FullMeshContext::pairs() const {
    std::lock_guard<std::mutex> lock(pairs_mu_);
    if (!sparse_) return peers_.size();
    size_t n = 0;
    for (size_t p = 0; p < pair_state_.size(); ++p) n += p != static_cast<size_t>(rank) && pair_state_[p] == PairState::kMade;
    return n;
}

Status FullMeshContext::add_pairs(rdzv::Store &store, const std::vector<int> &ranks, Clock::time_point deadline) {
    if (!sparse_) return Status::Ok();
    std::vector<int> mine, others;  // the pairs this call makes; those another call is making
    std::unique_lock<std::mutex> lock(pairs_mu_);
    for (int p : ranks) {
        SX_CHECK(p >= 0 && p < size, SX_ERR_INTERNAL, "add_pairs: rank %d is not in [0, %d)", p, size);
        PairState &st = pair_state_[static_cast<size_t>(p)];
        if (st == PairState::kFailed)
            return SX_ERROR(SX_ERR_COMM, "the Gloo pair with rank %d could not be connected earlier", p);
        if (st == PairState::kMaking) others.push_back(p);
        if (st != PairState::kNone) continue;
        // Made under the lock, so that close_pairs() never meets a pair half made.
        Status made = catching([&] {
            transportContext_->createPair(p);
            return Status::Ok();
        });
        if (!made.ok()) {
            st = PairState::kFailed;
            return made.prefix(format("the Gloo pair with rank %d: ", p));
        }
        st = PairState::kMaking;
        mine.push_back(p);
    }
    lock.unlock();
    Status made = connect_added(store, mine, deadline);
    if (made.ok() && !mine.empty())
        log(SX_LOG_DEBUG, "sx: rank %d of %d: %zu Gloo pairs made beyond the sparse mesh's, the first with rank %d", rank,
            size, mine.size(), mine.front());
    lock.lock();
    for (int p : mine) pair_state_[static_cast<size_t>(p)] = made.ok() ? PairState::kMade : PairState::kFailed;
    pairs_cv_.notify_all();
    SX_TRY(made);
    for (int p : others) {
        const PairState &st = pair_state_[static_cast<size_t>(p)];
        if (!pairs_cv_.wait_until(lock, deadline, [&] { return st != PairState::kMaking; }))
            return SX_ERROR(SX_ERR_TIMEOUT, "the Gloo pair with rank %d, which another call makes, was not connected "
                                            "by the deadline", p);
        SX_CHECK(st == PairState::kMade, SX_ERR_COMM, "the Gloo pair with rank %d could not be connected", p);
    }
    return Status::Ok();
}

Status FullMeshContext::connect_added(rdzv::Store &store, const std::vector<int> &peers, Clock::time_point deadline) {
    if (peers.empty()) return Status::Ok();
    try {
        for (int p : peers) {
            const sockaddr_storage &ss = listening_address(*transportContext_->getPair(p));
            SX_TRY(store.set(added_key(rank, p), std::string(reinterpret_cast<const char *>(&ss), sockaddr_size(ss))));
        }
        std::vector<std::pair<int, sockaddr_storage>> accepting;
        for (int p : peers) {
            sockaddr_storage theirs;
            SX_TRY(take_address(store, added_key(p, rank), p, deadline, &theirs));
            if (connects(listening_address(*transportContext_->getPair(p)), theirs))
                SX_TRY(connect_pair(*transportContext_, p, theirs));
            else
                accepting.emplace_back(p, theirs);
        }
        for (const auto &a : accepting) SX_TRY(connect_pair(*transportContext_, a.first, a.second));
        return Status::Ok();
    } catch (const std::bad_alloc &) {
        return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "no memory for Gloo's pairs");
    } catch (const std::exception &e) {
        return SX_ERROR(SX_ERR_COMM, "Gloo could not make its pairs: %s", e.what());
    }
}

Status FullMeshContext::forget_keys(rdzv::Store &store) {
    if (!sparse_) return Status::Ok();
    try {
        gloo::BarrierOptions opts(shared_from_this());
        opts.setTimeout(getTimeout());
        gloo::barrier(opts);
    } catch (const std::exception &e) {
        return SX_ERROR(mentions_timeout(e.what()) ? SX_ERR_TIMEOUT : SX_ERR_COMM,
                        "the ranks' barrier after connecting failed: gloo: %s", e.what());
    }
    return store.erase(sparse_key(rank));
}

}  // namespace comm
}  // namespace sx
