// Gloo's mesh of TCP pairs, full or sparse, connected through sx's store with store
// traffic per rank that grows with the pairs it connects, not W^2.
//
// A full mesh pairs every two ranks. A sparse one pairs each rank only with the ranks at a
// distance of a power of two, either way round the ring (sparse_peers: 2 log2 W at most),
// which is every pair that Gloo's own ring all-reduce (+-1), binomial broadcast (+-2^i
// from any root) and dissemination barrier (+-2^i) use, and what sx's ring, binomial-tree
// and chain collectives (ring.h, tree.h) are built on.
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
// rank p (the bytes of a sockaddr_in, 16, or sockaddr_in6, 28). Rank r, with its P
// peers in ascending order (W - 1 of them in a full mesh),
//   - SETs its own keys in that order, at most kPublishAhead peers beyond the one it is
//     connecting, not all P at once: the ranks move through their peers in step, so a
//     key is read about when it is written and the store holds a few keys per rank, not
//     W P (`bench_sx scale` measures the most);
//   - for each peer p in order: GETs "<p>/<r>" (waiting for it until the deadline) and
//     ERASEs it; where its side of the pair is the one that connects (the greater
//     listening address, as tcp::Pair::connect decides), it connects at once (the
//     peer's pair has listened since it was made);
//   - then waits for the pairs whose peers connect to it, in ascending order;
// so 3 P requests and P x 16 bytes received (IPv4; 28 for IPv6) per rank.
//
// A sparse mesh's keys are one per rank instead: "<r>" holds the addresses of all of rank
// r's P pairs (5 bytes of peer and length, then the address, per pair). Rank r SETs its
// key, then for each peer p in ascending order GETs "<p>" (waiting for it until the
// deadline), finds its own pair's address in it and connects (or, where the peer's side
// connects, waits for it last, as above); once connected, the ranks pass a barrier on the
// mesh (every key has been read) and each ERASEs its own key (forget_keys): P + 2 requests
// and about 21 P^2 bytes received per rank, W keys held at most. No rank waits for a key
// that is not SET first, nor for a connection before its last step.
//
// Until its last step a rank waits only for keys. The pairing is symmetric (p is among
// r's peers exactly when r is among p's). Rank r waits for peer p's key when p has not
// yet reached the peer kPublishAhead places before r in its own list: p waits, if at all,
// for a peer q of its own below r. In a cycle of ranks each waiting for the next, every
// rank would then be above the one two steps on, which cannot be. So every key is read,
// every connecting side connects, and every listening side is connected. A rank that never arrives stops every other at its own
// key, and each fails at its deadline naming it; one that dies after publishing leaves
// its peers waiting for its connection, and they fail naming it at the pair's timeout.
#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/transport/device.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "base/deadline.h"
#include "base/status.h"
#include "rdzv/store.h"

namespace sx {
namespace comm {

// The ranks at a distance of a power of two from `rank`, either way round a ring of `size`,
// in ascending order, without `rank` itself: a sparse mesh's pairs.
std::vector<int> sparse_peers(int rank, int size);

// A gloo::rendezvous::Context connected by connect() below: what every sx collective
// uses as Gloo's context, unchanged. A sparse one has no pair for the ranks it did not
// connect (getPair is null there): only the collectives built for it may run on it.
class FullMeshContext final : public gloo::rendezvous::Context,
                              public std::enable_shared_from_this<FullMeshContext> {
  public:
    // How many peers beyond the one being connected a rank publishes its keys for.
    static constexpr int kPublishAhead = 8;

    FullMeshContext(int rank, int size) : gloo::rendezvous::Context(rank, size) {}

    // Creates a pair for each of `peers` (ascending, without this rank; empty: every other
    // rank, a full mesh) on `device` (each with this context's timeout as its connect
    // timeout, set beforehand), publishes their addresses and connects them, through
    // `store` (its keys as above), every store wait ending by `deadline`. Every rank's
    // list must name it exactly where its own names that rank.
    // On success the context is connected; on failure it holds nothing (the pairs made
    // are closed) and the Status says which peer: SX_ERR_TIMEOUT where a peer's address
    // did not come by the deadline, or its connection within the pair's timeout; the
    // store's own error where the store failed; SX_ERR_COMM where a connection failed.
    // Never throws. Call once.
    Status connect(rdzv::Store &store, const std::shared_ptr<gloo::transport::Device> &device,
                   Clock::time_point deadline, std::vector<int> peers = {});

    // After connect(), on a sparse mesh: a barrier over it (every rank has read its peers'
    // keys), then this rank's key erased. Errors as connect()'s. Nothing on a full mesh.
    Status forget_keys(rdzv::Store &store);

    // The ranks connect() paired this context with, ascending.
    const std::vector<int> &peers() const { return peers_; }
    // Whether connect() was given its peers (a sparse mesh, even where, at a few ranks,
    // they are every other rank): the collectives of gloo/tree.h run on it.
    bool sparse() const { return sparse_; }

    // On a sparse mesh, after connect(): pairs with those of `ranks` that have none yet,
    // made now (a context's channel over some of its ranks needs pairs the mesh lacks).
    // Each new pair's address goes through `store` under "pair/<this rank>/<peer>",
    // which the peer reads and erases; so both sides of a pair must ask for it, by
    // `deadline` (a pair another thread is making meanwhile is waited for, not made
    // twice). Connecting sides connect before accepting sides wait, as in connect().
    // Errors as connect()'s; a pair that failed stays failed (every later call that needs
    // it fails). Any thread; nothing to do on a full mesh.
    Status add_pairs(rdzv::Store &store, const std::vector<int> &ranks, Clock::time_point deadline);
    // The pairs this rank holds: connect()'s and add_pairs'.
    size_t pairs() const;
    // Closes every pair (closeConnections), none being made meanwhile by add_pairs. Any
    // thread; never throws.
    void close_pairs();

  private:
    enum class PairState { kNone, kMaking, kMade, kFailed };
    // add_pairs' work for the pairs with `peers`, which this call alone makes.
    Status connect_added(rdzv::Store &store, const std::vector<int> &peers, Clock::time_point deadline);
    std::vector<int> peers_;
    bool sparse_ = false;
    mutable std::mutex pairs_mu_;
    std::condition_variable pairs_cv_;
    std::vector<PairState> pair_state_;  // by peer rank, under pairs_mu_ (a sparse mesh's)
};

}  // namespace comm
}  // namespace sx
