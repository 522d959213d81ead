#include "comm/abort_at_deadline.h"

namespace sx {
namespace comm {

AbortAtDeadline::AbortAtDeadline(Communicator *comm, std::chrono::steady_clock::time_point deadline) {
    thread_ = std::thread([this, comm, deadline] {
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_until(lock, deadline, [this] { return done_; })) return;
        fired_ = true;
        lock.unlock();
        comm->abort();
    });
}

AbortAtDeadline::~AbortAtDeadline() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        done_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

bool AbortAtDeadline::fired() const {
    std::lock_guard<std::mutex> lock(mu_);
    return fired_;
}

}  // namespace comm
}  // namespace sx
