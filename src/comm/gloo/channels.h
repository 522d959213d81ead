// Channels on a context's one Gloo mesh (sx_context.h): where a context's ranks span
// hosts (or may not share memory), it connects Gloo's TCP mesh once, and every
// communicator of its groups is a channel on it. A channel connects nothing: its rank 0
// takes an id from the context's counter in the store and names it, with the channel's
// ranks (channel rank -> the context's rank), through the channel's own key space.
//
// Slots. Every operation of a channel is on a slot of its own namespace:
//   bits 56-63  0x55, a prefix no Gloo algorithm and no non-context sx communicator uses;
//   bits 28-55  the channel's id (28 bits: a context refuses its 2^28-th channel, so two
//               channels, live or gone, never share an id);
//   bits  0-27  the channel's call counter, which wraps after 2^28 calls: a channel's
//               calls run one after another, so the call it meets again is long done.
// Gloo matches sends and receives per pair and slot, so no channel's call ever meets
// another's, in whatever order the groups' threads run them.
//
// Gloo's own algorithms (allreduce, broadcast, barrier) run over the whole context and
// ignore aborted waits, so a channel has its own, over its ranks, on UnboundBuffers: the
// small all-reduce gathers to the channel's rank 0, which combines in rank order and
// sends the result back (every rank gets the same bits), a float one of 64 KiB or more is
// the ring's reduce-scatter then all-gather, a double sum of more than 16 KiB is added in
// rank order in parts (gloo/ordered_all_reduce.h); broadcast sends from the root
// to each rank; barrier is a one-word all-reduce. The ring reduce-scatter and all-gather
// (ring.h) take the channel's ranks.
//
// A sparse mesh (full_mesh.h: more than 64 ranks, or SX_GLOO_MESH=sparse) pairs each rank
// only with the ranks a power of two away. A channel over some of the ranks, in its own
// order, needs others: as it is made, it connects the pairs its ring and binomial trees
// use (its ranks a power of two apart in the channel's order) that the mesh lacks
// (FullMeshContext::add_pairs, through the context's store), and its collectives are
// gloo/tree.h's, over the channel's ranks, with the same results. Notices are relayed
// (tell).
//
// Concurrency: Gloo's TCP context lets threads create unbound buffers and post sends and
// receives on them at once (each pair serialises its operations under its own lock; a
// buffer's waits are under the buffer's); every call of a channel uses buffers of its own.
//
// Failures:
//  - a Gloo exception (a peer died, a connection broke) means the shared transport is
//    broken: the channel closes every connection of the context, so that every channel of
//    every group fails at its next wait (SX_ERR_COMM), peers too, and no new channel opens;
//  - a call that passes its timeout fails its channel alone (SX_ERR_TIMEOUT): the context's
//    timer aborts that call's waits (Gloo's own timeout, which would fail every pair, is
//    set later by a grace);
//  - abort() aborts the channel's own waits and leaves the transport alone;
//  - a channel's first failure on a rank (its call's timeout, or fail_channel: its group
//    failed, or sx_abort) is told to the channel's other ranks: a notice of a few hundred
//    bytes on the context's one notice slot (prefix 0x56), which every rank keeps a
//    receive posted on, from any peer, and a thread of the context's waits for. A notice
//    aborts the named channel's waits there (or waits for the channel, if it is not yet
//    made there), so that its peers' calls, in flight or later, fail at once, naming the
//    rank that failed first and why; the other channels go on.
// A call ended early leaves the connections open, and a peer may still answer it (its
// payload for a receive posted here, or its readiness for a send posted here: a notice
// stops this rank's call while a peer, not yet told, goes on with it). Gloo's TCP pair
// (Debian's 2022 Gloo) stops at an operation whose buffer is gone, and every later
// message on that pair, other channels' too, would wait behind it. So a channel's call
// posts buffers only over memory of its own (OpScope::own: the caller's data copied in,
// and the result copied back when the call completes), and one that ends early leaves
// them, with that memory, to the context's Remains (op_scope.h) until the connections
// close: Gloo completes what comes for them, and no other message waits.
#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "comm/communicator.h"
#include "comm/gloo/full_mesh.h"
#include "comm/gloo/op_scope.h"

namespace sx {
namespace comm {

// Connects `world_size` ranks' Gloo mesh through `store` (keys under "gloo/" of it) by
// options.deadline (or options.timeout from now): the connection every Gloo communicator
// and every context's GlooChannels makes. Sparse where options.mesh says so, or where it
// is kAuto and SX_GLOO_MESH is "sparse" or, unset or "auto", world_size is above
// GlooOptions::kFullMeshMost.
Status connect_gloo_mesh(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const GlooOptions &options,
                         std::shared_ptr<FullMeshContext> *out);

// Where `channel` is a channel on a context's Gloo mesh (create_gloo_channel): `listener`
// is called, on the context's notice thread, when a peer's notice fails the channel (at
// once, where one came already), with the channel's error, so that an owner combining
// several channels ends its waits on the others too. nullptr: no more calls, and none is
// running once this returns. False (nothing done) where it is not such a channel. Any thread.
bool listen_for_notice(Communicator *channel, std::function<void(const Status &)> listener);

// The communicator of a channel on `channels` over `world_size` of the context's ranks
// (any of them, `rank` among them), agreed through `store` (the channel's own key space),
// by options.deadline. SX_ERR_COMM once the context's transport has failed.
Status create_gloo_channel(const std::shared_ptr<GlooChannels> &channels, std::shared_ptr<rdzv::Store> store, int rank,
                           int world_size, const GlooOptions &options, std::unique_ptr<Communicator> *out);

class GlooChannels {
  public:
    // What the timer aborts at a deadline (a channel's call in flight).
    class Watched {
      public:
        virtual void expire() = 0;  // under the timer's lock: the watched must still be alive

      protected:
        ~Watched() = default;
    };

    // What a notice reaches: a channel of this rank.
    class Noticed {
      public:
        // Channel `id` failed first on context rank `from`, with code and why. On the
        // notice thread, under the registry's lock: the channel is alive.
        virtual void notice(int from, sx_status_t code, const std::string &why) = 0;
        // The transport failed (fail()): the channel's waits end now, here too (closing the
        // connections wakes only the peers' waits). Under the registry's lock.
        virtual void transport_failed() = 0;

      protected:
        ~Noticed() = default;
    };

    // Throws (gloo's exceptions, std::system_error) where its notice receive or its
    // threads cannot be started.
    GlooChannels(std::shared_ptr<FullMeshContext> context, std::shared_ptr<rdzv::Store> store);
    ~GlooChannels();  // stops the timer; the context, going, closes every pair
    GlooChannels(const GlooChannels &) = delete;
    GlooChannels &operator=(const GlooChannels &) = delete;

    gloo::Context &context() { return *context_; }
    int rank() const { return context_->rank; }
    int world_size() const { return context_->size; }
    rdzv::Store &store() { return *store_; }
    // Whether the context's mesh is sparse: its channels then run the collectives of
    // gloo/tree.h over pairs made for them (pair_with), and notices are relayed.
    bool sparse() const { return context_->sparse(); }
    // On a sparse mesh: the context's pairs with `ranks` (the context's) that it lacks,
    // made now (FullMeshContext::add_pairs, through the context's store).
    Status pair_with(const std::vector<int> &ranks, Clock::time_point deadline) {
        return context_->add_pairs(*store_, ranks, deadline);
    }
    size_t pairs() const { return context_->pairs(); }
    // What channel calls that ended early left, kept until the connections close.
    Remains &remains() { return remains_; }

    // A comm failure of any channel: every connection of the context is closed, once, and
    // every channel's waits on this rank end.
    void fail(const Status &why);
    Status usable(const char *what) const { return failure_.check(what); }

    // w's call must end by `deadline`, else w->expire() runs (on the timer's thread).
    void watch(Watched *w, Clock::time_point deadline);
    void unwatch(Watched *w);  // after it, expire() is neither running nor to come

    // Channel `id`'s notices go to c (one that came before it, at once); until withdraw(id),
    // after which no notice() is running or to come.
    void enlist(uint64_t id, Noticed *c);
    void withdraw(uint64_t id);
    // Tells the context ranks `to` that channel `id` failed first on this rank, because
    // of `why`. Any thread; sends without waiting. On a sparse mesh the notice goes to
    // this rank's paired peers instead, and every rank passes on the first notice it gets
    // for a channel to its own (not back where it came from): it reaches every rank of
    // the context, in log2 W hops, each rank sending one per failed channel.
    void tell(uint64_t id, const std::vector<int> &to, const Status &why);

    std::atomic<int64_t> open{0};
    std::atomic<int64_t> spare_bytes{0};  // the blocks its channels keep for their next calls

  private:
    struct Notice;
    void run_timer();
    void listen();
    void deliver(const Notice &n, int source);
    // Sends `n` to the context ranks `to`, keeping its memory until Gloo has sent it.
    void send(std::unique_ptr<Notice> n, const std::vector<int> &to);

    std::shared_ptr<FullMeshContext> context_;
    std::shared_ptr<rdzv::Store> store_;
    FailureLatch failure_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::map<Watched *, Clock::time_point> watched_;  // under mu_
    bool stop_ = false;                              // under mu_
    std::thread timer_;

    // Notices (tell, listen): the channels they reach, and those that came for a channel
    // not made here yet (the last few).
    std::mutex notice_mu_;
    std::map<uint64_t, Noticed *> enlisted_;  // under notice_mu_
    struct Early {
        int from;
        sx_status_t code;
        std::string why;
    };
    std::map<uint64_t, Early> early_;  // under notice_mu_
    std::set<uint64_t> relayed_;       // a sparse mesh's channels told or passed on, under notice_mu_
    std::unique_ptr<Notice> inbox_;    // the posted receive's memory, and its buffer
    std::unique_ptr<gloo::transport::UnboundBuffer> inbox_buffer_;
    std::vector<int> peers_;           // the mesh's pairs (every context rank but this one, on a full mesh)
    std::mutex sent_mu_;               // the notices sent lately (Gloo sends from their memory)
    std::deque<std::pair<std::unique_ptr<Notice>, std::unique_ptr<gloo::transport::UnboundBuffer>>> sent_;
    std::thread listener_;
    Remains remains_;  // goes after the destructor has closed every pair
};

}  // namespace comm
}  // namespace sx
