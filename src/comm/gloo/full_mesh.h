// Gloo's full mesh of TCP pairs, connected through sx's store with store traffic per rank
// that grows with W, not W^2.
//
// Gloo's own connectFullMesh (gloo/rendezvous/context.cc) has every rank SET one key
// holding the addresses of its W-1 pairs (136 bytes each) and GET every other rank's
// whole list, of which it uses one address: 136 (W-1)^2 bytes received per rank, and
// 136 W (W-1) bytes held by the store. Here each address travels alone, to the one rank
// that uses it.
//
// Why a key per pair and not one per rank: in the Gloo that sx builds on (Debian's
// 0.0~git20220518), every tcp::Pair listens on a socket of its own, bound to a port the
// kernel picks when the pair is made (Pair::listen), so no peer can compute a pair's
// address from its rank's. Pair::connect then compares the two pairs' addresses to
// choose the side that connects; both sides need the other's. (Gloo's later releases
// listen once per device and name a pair by a sequence number, where one key per rank
// would do.)
//
// Keys, under the store given: "<r>/<p>" holds the socket address of rank r's pair for
// rank p (the bytes of a sockaddr_in, 16, or sockaddr_in6, 28). Rank r
//   - SETs its own keys in ascending peer order, at most kPublishAhead peers beyond the
//     one it is connecting, not all W-1 at once: the ranks move through their peers in
//     step (the ascending order below), so a key is read about when it is written and
//     the store holds a few keys per rank, not W^2 (`bench_sx scale` measures the most);
//   - for each peer p in ascending order: GETs "<p>/<r>" (waiting for it until the
//     deadline) and ERASEs it; where its side of the pair is the one that connects (the
//     greater listening address, as tcp::Pair::connect decides), it connects at once
//     (the peer's pair has listened since it was made);
//   - then waits for the pairs whose peers connect to it, in ascending order;
// so 3 (W-1) requests and (W-1) x 16 bytes received (IPv4; 28 for IPv6) per rank.
//
// Until its last step a rank waits only for keys: for peer p's key, where p has not yet
// reached rank r - kPublishAhead, and p in turn waits, if at all, on a rank below that;
// ranks waiting on each other in a cycle would each be below the one two steps back,
// which cannot be. So every key is read, every connecting side connects, and every
// listening side is connected. A rank that never arrives stops every other at its own
// key, and each fails at its deadline naming it; one that dies after publishing leaves
// its peers waiting for its connection, and they fail naming it at the pair's timeout.
#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include <memory>

#include "base/deadline.h"
#include "base/status.h"
#include "rdzv/store.h"

namespace sx {
namespace comm {

// A gloo::rendezvous::Context connected by connect() below: what every sx collective
// uses as Gloo's context, unchanged.
class FullMeshContext final : public gloo::rendezvous::Context {
  public:
    // How many peers beyond the one being connected a rank publishes its keys for.
    static constexpr int kPublishAhead = 8;

    FullMeshContext(int rank, int size) : gloo::rendezvous::Context(rank, size) {}

    // Creates a pair for every other rank on `device` (each with this context's timeout
    // as its connect timeout, set beforehand), publishes their addresses and connects
    // them, through `store` (its keys as above), every store wait ending by `deadline`.
    // On success the context is connected; on failure it holds nothing (the pairs made
    // are closed) and the Status says which peer: SX_ERR_TIMEOUT where a peer's address
    // did not come by the deadline, or its connection within the pair's timeout; the
    // store's own error where the store failed; SX_ERR_COMM where a connection failed.
    // Never throws. Call once.
    Status connect(rdzv::Store &store, const std::shared_ptr<gloo::transport::Device> &device,
                   Clock::time_point deadline);
};

}  // namespace comm
}  // namespace sx
