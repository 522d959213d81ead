#include "comm/gloo/in_process.h"

#include <unistd.h>

#include <map>
#include <random>

namespace sx {
namespace comm {

std::string process_token() {
    // A random number drawn once per process; a fork's child keeps it, but not its pid.
    static const uint64_t nonce = [] {
        std::random_device rd;
        return (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }();
    return std::to_string(nonce) + "." + std::to_string(static_cast<long long>(::getpid()));
}

std::shared_ptr<Meeting> Meeting::join(const std::string &id, int world_size) {
    static std::mutex mu;
    static auto *meetings = new std::map<std::string, std::weak_ptr<Meeting>>();
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = meetings->begin(); it != meetings->end();) it = it->second.expired() ? meetings->erase(it) : ++it;
    std::weak_ptr<Meeting> &slot = (*meetings)[id];
    std::shared_ptr<Meeting> m = slot.lock();
    if (!m) {
        m = std::make_shared<Meeting>(world_size);
        slot = m;
    }
    return m;
}

Meeting::Meeting(int world_size) : world_size_(world_size), buffers_(static_cast<size_t>(world_size), nullptr) {}

Status Meeting::meet(int rank, const std::string &what, void *mine, Clock::time_point deadline,
                     const std::atomic<bool> &aborted, const std::function<void(void *const *buffers)> &fn) {
    std::unique_lock<std::mutex> lock(mu_);
    auto refuse = [&]() -> Status {
        if (aborted.load()) return SX_ERROR(SX_ERR_ABORTED, "rank %d: aborted", rank);
        return SX_ERROR(failure_code_, "%s", failure_.c_str());
    };
    if (failed_ || aborted.load()) return refuse();
    if (arrived_ == 0) {
        what_ = what;
    } else if (what != what_) {
        // The ranks already waiting read their buffers' sizes from their own call: none
        // may copy. The meeting fails for all.
        fail_locked(SX_ERR_MISMATCH, format("ranks called different collectives: rank %d %s, another rank %s",
                                            rank, what.c_str(), what_.c_str()));
        return refuse();
    }
    buffers_[static_cast<size_t>(rank)] = mine;
    const uint64_t round = arrive_round_;
    if (++arrived_ == world_size_) {
        arrived_ = 0;
        ++arrive_round_;
        cv_.notify_all();
    } else {
        const bool met = cv_.wait_until(lock, deadline, [&] {
            return arrive_round_ != round || failed_ || aborted.load();
        });
        if (arrive_round_ == round) {
            // Not everyone came: nobody will read this rank's buffer, and this round can
            // never complete (failed_ is set before the lock is released).
            if (!met && !failed_ && !aborted.load()) {
                fail_locked(SX_ERR_TIMEOUT, format("rank %d timed out waiting for its peers", rank));
                return SX_ERROR(SX_ERR_TIMEOUT, "rank %d: a peer did not come before the deadline", rank);
            }
            fail_locked(SX_ERR_COMM, format("rank %d was aborted", rank));
            return refuse();
        }
    }
    // Every rank's buffer is here, and stays until every rank has finished below.
    const std::vector<void *> buffers = buffers_;
    lock.unlock();
    fn(buffers.data());
    lock.lock();
    const uint64_t done_round = finish_round_;
    if (++finished_ == world_size_) {
        finished_ = 0;
        ++finish_round_;
        cv_.notify_all();
    } else {
        cv_.wait(lock, [&] { return finish_round_ != done_round; });
    }
    return Status::Ok();
}

void Meeting::fail(int rank, sx_status_t code, const std::string &why) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_locked(code, format("rank %d failed: %s", rank, why.c_str()));
}

void Meeting::fail_locked(sx_status_t code, std::string text) {
    if (!failed_) {
        failed_ = true;
        failure_code_ = code;
        failure_ = std::move(text);
    }
    cv_.notify_all();
}

void Meeting::wake() {
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_.notify_all();
}

}  // namespace comm
}  // namespace sx
