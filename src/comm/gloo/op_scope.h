// The bookkeeping of one collective call on Gloo: its unbound buffers, its slot, its
// deadline, and what must happen if it ends early.
#pragma once

#include <atomic>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "rdzv/stores.h"

namespace sx {
namespace comm {

using gloo::transport::UnboundBuffer;

// The unbound buffers of the calls in flight on one communicator, so that abort() (any
// thread) can wake the waits on them. Lock order: mu_ before a buffer's own lock.
class InFlight {
  public:
    void add(UnboundBuffer *b) {
        std::lock_guard<std::mutex> lock(mu_);
        buffers_.push_back(b);
        if (stopped_) {
            b->abortWaitRecv();
            b->abortWaitSend();
        }
    }
    void remove(UnboundBuffer *b) {
        std::lock_guard<std::mutex> lock(mu_);
        buffers_.erase(std::remove(buffers_.begin(), buffers_.end(), b), buffers_.end());
    }
    // Makes the current (or next) waitRecv/waitSend on every registered buffer return false.
    void abort_waits() {
        std::lock_guard<std::mutex> lock(mu_);
        for (UnboundBuffer *b : buffers_) {
            b->abortWaitRecv();
            b->abortWaitSend();
        }
    }
    // abort_waits(), and the waits of every buffer registered from now on: a call that
    // registers its buffers after it, however soon, ends at its first wait.
    void stop_waits() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stopped_ = true;
        }
        abort_waits();
    }

  private:
    std::mutex mu_;
    bool stopped_ = false;  // under mu_
    std::vector<UnboundBuffer *> buffers_;
};

// One collective call. Buffers it creates are owned and registered; buffers owned by
// Gloo's option objects are registered with adopt() (those objects must be declared
// before the scope, so that they outlive it).
//
// If the call ends without done() (an exception, a timeout, an abort), the destructor
// closes every connection of the context before any buffer goes: Gloo's event loop may
// still be reading into a posted receive, and once a pair is closed (under its lock) it
// no longer touches any buffer. Only then are the buffers released.
class OpScope {
  public:
    // waiting_for (may be null): where each wait notes the peer it waits on, for the
    // error that a timeout or a broken connection becomes.
    OpScope(gloo::Context &context, InFlight &in_flight, uint64_t slot, Clock::time_point deadline,
            std::atomic<int> *waiting_for = nullptr)
        : context_(context), in_flight_(in_flight), slot_(slot), deadline_(deadline), waiting_for_(waiting_for),
          rank_(context.rank), size_(context.size) {}

    // A call on a channel of a shared context (gloo/channels.h): its ranks are `ranks`
    // (channel rank -> the context's rank; borrowed for the scope's life), `rank` among
    // them. If the call ends early, the connections stay: they are every channel's (Gloo
    // never touches a destroyed buffer's memory; what its pending operations then do to the
    // pair is in channels.h). Waits get `grace` more than the deadline, so that the
    // channel's own timer (not Gloo's timeout, which fails every pair) ends a late call.
    OpScope(gloo::Context &context, InFlight &in_flight, uint64_t slot, Clock::time_point deadline,
            std::atomic<int> *waiting_for, const std::vector<int> &ranks, int rank, Millis grace)
        : context_(context), in_flight_(in_flight), slot_(slot), deadline_(deadline), waiting_for_(waiting_for),
          rank_(rank), size_(static_cast<int>(ranks.size())), ranks_(&ranks), grace_(grace) {}

    ~OpScope() {
        if (!done_ && ranks_ == nullptr) {
            try {
                context_.closeConnections();
            } catch (...) {
                // A pair that cannot even be closed has already failed; nothing more to do.
            }
        }
        for (UnboundBuffer *b : registered_) in_flight_.remove(b);
    }
    OpScope(const OpScope &) = delete;
    OpScope &operator=(const OpScope &) = delete;

    gloo::Context &context() { return context_; }
    // This rank and the number of ranks of the call (the context's, or its channel's), and
    // the context's rank of the call's rank q.
    int rank() const { return rank_; }
    int size() const { return size_; }
    int peer(int q) const { return ranks_ ? (*ranks_)[static_cast<size_t>(q)] : q; }
    uint64_t slot() const { return slot_; }
    Clock::time_point deadline() const { return deadline_; }

    // `n` elements of T that this scope owns (zeroed unless `zeroed` is false), for the
    // call's own receives: they outlive every buffer over them and, where the call ends
    // early, the connections closed in the destructor, so that Gloo's event loop never
    // writes into memory already freed. A call's scratch must come from here, not from
    // a local of its own, which would go before the scope does.
    template <class T>
    T *scratch(size_t n, bool zeroed = true) {
        scratch_.emplace_back(zeroed ? new char[n * sizeof(T)]() : new char[n * sizeof(T)]);
        return reinterpret_cast<T *>(scratch_.back().get());
    }

    // A buffer over [ptr, ptr + bytes) owned by this scope.
    UnboundBuffer *buffer(void *ptr, size_t bytes) {
        owned_.push_back(context_.createUnboundBuffer(ptr, bytes));
        adopt(owned_.back().get());
        return owned_.back().get();
    }
    void adopt(UnboundBuffer *b) {
        in_flight_.add(b);
        registered_.push_back(b);
    }

    // Wait for the next receive (send) completion on b, from (to) the call's rank `peer`,
    // until the deadline. False if abort() woke it; Gloo throws on a timeout or a failed peer.
    bool wait_recv(UnboundBuffer *b, int peer) {
        note(peer);
        return b->waitRecv(nullptr, wait_time() + grace_);
    }
    bool wait_send(UnboundBuffer *b, int peer) {
        note(peer);
        return b->waitSend(nullptr, wait_time() + grace_);
    }
    // What is left of the deadline, at least 1 ms (0 would be no time at all to Gloo's
    // waits, and -1 its "use the context default").
    std::chrono::milliseconds wait_time() const { return std::max(time_left(deadline_), Millis(1)); }

    // The call completed: every posted operation finished.
    void done() { done_ = true; }
  private:
    void note(int peer) {
        if (waiting_for_) waiting_for_->store(peer);
    }

    gloo::Context &context_;
    InFlight &in_flight_;
    const uint64_t slot_;
    const Clock::time_point deadline_;
    std::vector<std::unique_ptr<char[]>> scratch_;       // destroyed after owned_'s buffers
    std::vector<std::unique_ptr<UnboundBuffer>> owned_;  // destroyed after the destructor body
    std::vector<UnboundBuffer *> registered_;
    bool done_ = false;
    std::atomic<int> *waiting_for_;
    const int rank_, size_;
    const std::vector<int> *ranks_ = nullptr;  // a channel's ranks (null: the context's)
    const Millis grace_{0};
};

}  // namespace comm
}  // namespace sx
