#include "ckpt/future.h"

#include "base/vector_state.h"

namespace sx {
namespace ckpt {

void SaveFuture::complete(const Status &s) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        status_ = s;
    }
    // The callback runs before the future reports done, so that whoever waits for
    // completion (and then releases the future) never races with it.
    leave_vector_state_clean();  // the trainer's callback runs on registers as clean as its own thread's
    if (callback_) callback_(s);
    {
        std::lock_guard<std::mutex> lock(mu_);
        done_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
}

void SaveFuture::set_staged() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        staged_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
}

namespace {

template <typename Ready>
bool wait_until(std::mutex &mu, std::condition_variable &cv, std::chrono::milliseconds timeout, Ready ready) {
    std::unique_lock<std::mutex> lock(mu);
    // Beyond a century is forever: a larger timeout would overflow the clock's arithmetic
    // (nanoseconds since its epoch) and wait not at all.
    constexpr std::chrono::milliseconds kForever = std::chrono::hours(24 * 365 * 100);
    if (timeout.count() < 0 || timeout >= kForever) {
        cv.wait(lock, ready);
        return true;
    }
    return cv.wait_for(lock, timeout, ready);
}

}  // namespace

bool SaveFuture::wait(std::chrono::milliseconds timeout) const {
    return wait_until(mu_, cv_, timeout, [&] { return done_.load(std::memory_order_acquire); });
}

bool SaveFuture::wait_staged(std::chrono::milliseconds timeout) const {
    return wait_until(mu_, cv_, timeout, [&] {
        return staged_.load(std::memory_order_acquire) || done_.load(std::memory_order_acquire);
    });
}

Status SaveFuture::status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
}

}  // namespace ckpt
}  // namespace sx
