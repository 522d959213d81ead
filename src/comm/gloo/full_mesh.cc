#include "comm/gloo/full_mesh.h"

#include <gloo/transport/context.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "comm/gloo/ring.h"

namespace sx {
namespace comm {
namespace {

std::string pair_key(int from, int to) { return std::to_string(from) + "/" + std::to_string(to); }

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

// Publishes this rank's keys for the peers from *next up to `last` (ranks), in order.
Status publish(rdzv::Store &store, gloo::transport::Context &transport, int last, int *next) {
    for (; *next <= last; ++*next) {
        if (*next == transport.rank) continue;
        const sockaddr_storage &ss = listening_address(*transport.getPair(*next));
        SX_TRY(store.set(pair_key(transport.rank, *next),
                         std::string(reinterpret_cast<const char *>(&ss), sockaddr_size(ss))));
    }
    return Status::Ok();
}

// Takes `peer`'s key for rank `rank` from the store (and erases it): where the peer's pair
// with this rank listens.
Status take_address(rdzv::Store &store, int rank, int peer, Clock::time_point deadline, sockaddr_storage *theirs) {
    const std::string key = pair_key(peer, rank);
    std::string value;
    Status s = store.get(key, &value, time_left(deadline));
    if (!s.ok())
        return s.prefix(format("no address came from rank %d (it has not arrived, or it failed before "
                               "publishing it): ",
                               peer));
    SX_TRY(store.erase(key));
    std::memset(theirs, 0, sizeof *theirs);
    if (value.size() <= sizeof *theirs) std::memcpy(theirs, value.data(), value.size());
    SX_CHECK(!value.empty() && value.size() == sockaddr_size(*theirs), SX_ERR_COMM,
             "rank %d published %zu bytes that are no IPv4 or IPv6 socket address", peer, value.size());
    return Status::Ok();
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

Status FullMeshContext::connect(rdzv::Store &store, const std::shared_ptr<gloo::transport::Device> &device,
                                Clock::time_point deadline) {
    try {
        std::shared_ptr<gloo::transport::Context> transport = device->createContext(rank, size);
        transport->setTimeout(getTimeout());
        for (int p = 0; p < size; ++p)
            if (p != rank) transport->createPair(p);
        int next = 0, local_rank = 0;
        // The pairs whose other side connects, and where each listens: connected last,
        // so that no rank waits on a peer's connection while the peer waits on a key.
        std::vector<std::pair<int, sockaddr_storage>> accepting;
        for (int p = 0; p < size; ++p) {
            if (p == rank) continue;
            SX_TRY(publish(store, *transport, std::min(size - 1, p + kPublishAhead), &next));
            sockaddr_storage theirs;
            SX_TRY(take_address(store, rank, p, deadline, &theirs));
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
        for (int p = 0; p < size; ++p)
            if (p != rank) transport->getPair(p)->setLocalRank(local_rank);
        device_ = device;
        transportContext_ = std::move(transport);
        return Status::Ok();
    } catch (const std::bad_alloc &) {
        return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "no memory for Gloo's pairs");
    } catch (const std::exception &e) {
        return SX_ERROR(SX_ERR_COMM, "Gloo could not make its pairs: %s", e.what());
    }
}

}  // namespace comm
}  // namespace sx
