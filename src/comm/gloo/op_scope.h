// The bookkeeping of one collective call on Gloo: its unbound buffers, its slot, its
// deadline, and what must happen if it ends early.
#pragma once

#include <atomic>

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
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

// A block of a call's own memory (OpScope::scratch), `size` bytes.
struct Block {
    std::unique_ptr<char[]> data;
    size_t size = 0;
};

// The blocks a channel's calls reuse (they run one at a time), so that a call's copies do
// not fault in fresh pages each time: a completed call's blocks come back here, and at
// most kKept are kept, the largest. A channel thus holds about its largest call's payload
// between calls. The bytes kept are added to `*kept` (shared by the context's channels).
class Spares {
  public:
    explicit Spares(std::atomic<int64_t> *kept) : kept_(kept) {}
    ~Spares() { kept_->fetch_sub(static_cast<int64_t>(bytes_)); }
    Spares(const Spares &) = delete;
    Spares &operator=(const Spares &) = delete;

    // A block of at least `bytes`: the smallest kept one that fits, or a new one.
    Block take(size_t bytes) {
        auto best = blocks_.end();
        for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
            if (it->size >= bytes && (best == blocks_.end() || it->size < best->size)) best = it;
        if (best == blocks_.end()) return Block{std::unique_ptr<char[]>(new char[bytes]), bytes};
        Block b = std::move(*best);
        blocks_.erase(best);
        recount();
        return b;
    }
    void give(std::vector<Block> blocks) {
        for (Block &b : blocks) blocks_.push_back(std::move(b));
        std::sort(blocks_.begin(), blocks_.end(), [](const Block &a, const Block &b) { return a.size > b.size; });
        if (blocks_.size() > kKept) blocks_.resize(kKept);
        recount();
    }

  private:
    void recount() {
        size_t n = 0;
        for (const Block &b : blocks_) n += b.size;
        kept_->fetch_add(static_cast<int64_t>(n) - static_cast<int64_t>(bytes_));
        bytes_ = n;
    }
    static constexpr size_t kKept = 4;
    std::vector<Block> blocks_;
    size_t bytes_ = 0;  // blocks_' sizes
    std::atomic<int64_t> *const kept_;
};

// What the channel calls that ended early left (OpScope's destructor): their buffers, and
// the memory those cover, which Gloo may still complete a posted operation on. A call is
// ended early by its timeout, an abort or a peer's notice while a peer may still be in it:
// the peer's payload for a receive posted here, or its readiness for a send posted here,
// can come at any time after. Gloo's TCP pair (2022) stops at an operation whose buffer
// is gone (Pair::prepareRead, Pair::write), and every later message on that pair, any
// channel's, would wait behind it; kept here, the operation completes into memory no one
// reads. Kept for as long as the connections: the owner closes every pair before this goes.
// A channel fails at its first early end and posts nothing after, so this holds at most
// one call's memory per failed channel.
class Remains {
  public:
    void keep(std::vector<std::unique_ptr<UnboundBuffer>> buffers, std::vector<Block> memory) {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto &b : buffers) buffers_.push_back(std::move(b));
        for (Block &m : memory) {
            bytes_ += m.size;
            memory_.push_back(std::move(m));
        }
    }
    // The bytes of memory kept.
    size_t bytes() const {
        std::lock_guard<std::mutex> lock(mu_);
        return bytes_;
    }

  private:
    mutable std::mutex mu_;
    std::vector<Block> memory_;                            // goes after buffers_
    std::vector<std::unique_ptr<UnboundBuffer>> buffers_;  // under mu_, as the rest
    size_t bytes_ = 0;
};

// One collective call. Buffers it creates are owned and registered; buffers owned by
// Gloo's option objects are registered with adopt() (those objects must be declared
// before the scope, so that they outlive it).
//
// If the call ends without done() (an exception, a timeout, an abort), the destructor
// closes every connection of the context before any buffer goes: Gloo's event loop may
// still be reading into a posted receive, and once a pair is closed (under its lock) it
// no longer touches any buffer. Only then are the buffers released.
//
// A call on a channel of a shared context leaves the connections open (they are every
// channel's), so its buffers cover only memory of its own: scratch(), and own()'s copies
// of the caller's data (buffer() refuses any other). Ended early, it hands its buffers and
// that memory to the context's Remains, where what Gloo still does with them is harmless.
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
    // pair is in the class comment). Waits get `grace` more than the deadline, so that the
    // channel's own timer (not Gloo's timeout, which fails every pair) ends a late call.
    // `remains` (borrowed; it outlives the connections) keeps what a call ended early leaves;
    // the call's memory comes from `spares` (the channel's, borrowed) and goes back to it.
    OpScope(gloo::Context &context, InFlight &in_flight, uint64_t slot, Clock::time_point deadline,
            std::atomic<int> *waiting_for, const std::vector<int> &ranks, int rank, Millis grace, Remains &remains,
            Spares &spares)
        : context_(context), in_flight_(in_flight), slot_(slot), deadline_(deadline), waiting_for_(waiting_for),
          rank_(rank), size_(static_cast<int>(ranks.size())), ranks_(&ranks), grace_(grace), remains_(&remains),
          spares_(&spares) {}

    ~OpScope() {
        for (UnboundBuffer *b : registered_) in_flight_.remove(b);
        if (remains_ != nullptr) {
            if (!done_ && !owned_.empty()) {
                remains_->keep(std::move(owned_), std::move(scratch_));
            } else {
                owned_.clear();  // nothing is posted on them: the memory is free again
                spares_->give(std::move(scratch_));
            }
            return;
        }
        if (done_) return;
        try {
            context_.closeConnections();
        } catch (...) {
            // A pair that cannot even be closed has already failed; nothing more to do.
        }
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
        const size_t bytes = n * sizeof(T);
        scratch_.push_back(spares_ ? spares_->take(bytes) : Block{std::unique_ptr<char[]>(new char[bytes]), bytes});
        char *p = scratch_.back().data.get();
        if (zeroed) std::memset(p, 0, bytes);
        memory_.emplace(p, bytes);
        return reinterpret_cast<T *>(p);
    }
    // Whether a buffer over [ptr, ptr + bytes) must go through memory of the call's own
    // instead: on a channel, where it is not scratch().
    bool stages(const void *ptr, size_t bytes) const { return remains_ != nullptr && !owns(ptr, bytes); }

    // What the call does with the caller's data given to own().
    enum Use : unsigned {
        kReads = 1,   // its values are read (sent, or added to): copied in now
        kWrites = 2,  // the result goes there: copied back at done()
    };
    // The memory the call works on in place of the caller's [ptr, ptr + n): on a channel, a
    // copy of the scope's own (not zeroed unless read), copied in and back as `use` says;
    // elsewhere ptr itself. Borrows ptr until done() or the scope's end.
    template <class T>
    T *own(T *ptr, size_t n, unsigned use) {
        if (remains_ == nullptr || n == 0) return ptr;
        T *copy = scratch<T>(n, false);
        if (use & kReads) std::memcpy(copy, ptr, n * sizeof(T));
        if (use & kWrites) copy_back(ptr, copy, n * sizeof(T));
        return copy;
    }
    // At the next done(): [src, src + bytes) goes to dst (nothing where they are the same).
    void copy_back(void *dst, const void *src, size_t bytes) {
        if (dst != src && bytes > 0) copy_backs_.push_back({dst, src, bytes});
    }

    // A buffer over [ptr, ptr + bytes) owned by this scope. On a channel, the range must lie
    // in memory the scope owns (scratch(), own()); std::logic_error otherwise.
    UnboundBuffer *buffer(void *ptr, size_t bytes) {
        if (stages(ptr, bytes))
            throw std::logic_error("a channel call's Gloo buffer must cover only memory of the call's own");
        owned_.push_back(context_.createUnboundBuffer(ptr, bytes));
        adopt(owned_.back().get());
        done_ = false;  // an operation to come
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

    // Every operation posted so far finished: the copies copy_back() asked for are made.
    // A buffer made after it makes the call unfinished again.
    void done() {
        for (const CopyBack &c : copy_backs_) std::memcpy(c.dst, c.src, c.bytes);
        copy_backs_.clear();
        done_ = true;
    }

  private:
    void note(int peer) {
        if (waiting_for_) waiting_for_->store(peer);
    }
    // Whether [ptr, ptr + bytes) lies in one block of scratch().
    bool owns(const void *ptr, size_t bytes) const {
        const char *p = static_cast<const char *>(ptr);
        auto it = memory_.upper_bound(p);
        if (it == memory_.begin()) return bytes == 0;
        --it;
        return p >= it->first && static_cast<size_t>(p - it->first) + bytes <= it->second;
    }
    struct CopyBack {
        void *dst;
        const void *src;
        size_t bytes;
    };

    gloo::Context &context_;
    InFlight &in_flight_;
    const uint64_t slot_;
    const Clock::time_point deadline_;
    std::vector<Block> scratch_;                         // destroyed after owned_'s buffers
    std::map<const char *, size_t> memory_;              // scratch_'s blocks: start -> bytes used
    std::vector<std::unique_ptr<UnboundBuffer>> owned_;  // destroyed after the destructor body
    std::vector<CopyBack> copy_backs_;
    std::vector<UnboundBuffer *> registered_;
    bool done_ = false;
    std::atomic<int> *waiting_for_;
    const int rank_, size_;
    const std::vector<int> *ranks_ = nullptr;  // a channel's ranks (null: the context's)
    const Millis grace_{0};
    Remains *const remains_ = nullptr;  // a channel's (null: the context's own call)
    Spares *const spares_ = nullptr;    // a channel's (null: scratch is allocated afresh)
};

}  // namespace comm
}  // namespace sx
