// The future of an asynchronous save: completion, status and error text, progress
// (bytes written of this rank's total), cancellation, and an optional callback.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "base/status.h"

namespace sx {
namespace ckpt {

class SaveFuture {
  public:
    using Callback = std::function<void(const Status &)>;
    explicit SaveFuture(Callback callback = nullptr) : callback_(std::move(callback)) {}

    // --- the saving side ---
    void set_total(uint64_t bytes) { total_.store(bytes); }
    void add_done(uint64_t bytes) { done_bytes_.fetch_add(bytes); }
    bool cancel_requested() const { return cancel_.load(); }
    // The snapshot has been copied out of the group's memory.
    void set_staged();
    // Records the outcome, runs the callback on this thread, then wakes waiters.
    void complete(const Status &s);

    // --- the caller's side (any thread) ---
    bool done() const { return done_.load(std::memory_order_acquire); }
    // Waits at most `timeout` (negative: forever). False if still running.
    bool wait(std::chrono::milliseconds timeout) const;
    // Waits at most `timeout` (negative: forever) until the snapshot is staged (or the
    // save completed, which implies it). False if not yet.
    bool wait_staged(std::chrono::milliseconds timeout) const;
    // The outcome; only meaningful once done().
    Status status() const;
    void request_cancel() { cancel_.store(true); }
    uint64_t done_bytes() const { return done_bytes_.load(); }
    uint64_t total_bytes() const { return total_.load(); }

  private:
    Callback callback_;
    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    std::atomic<bool> done_{false};
    std::atomic<bool> staged_{false};
    std::atomic<bool> cancel_{false};
    std::atomic<uint64_t> done_bytes_{0}, total_{0};
    Status status_;
};

}  // namespace ckpt
}  // namespace sx
