#include "core/channel.h"

#include "base/trace.h"

namespace sx {
namespace core {

CommChannel::~CommChannel() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

uint64_t CommChannel::submit(Job job, bool always) {
    uint64_t ticket;
    bool run_here = false;
    {
        std::lock_guard<std::mutex> lock(mu_);
        ticket = ++submitted_;
        if (!started_) {
            started_ = true;
            try {
                thread_ = std::thread([this] { run(); });
            } catch (...) {
                inline_ = true;
            }
        }
        if (inline_) {
            run_here = true;
        } else {
            queue_.push_back({ticket, std::move(job), always});
        }
    }
    if (run_here) {
        // No thread: the job runs now, in order (every earlier one ran the same way).
        Status s;
        bool skip;
        {
            std::lock_guard<std::mutex> lock(mu_);
            skip = failed_at_ != 0 && !always;
        }
        if (!skip) s = catching(job);
        std::lock_guard<std::mutex> lock(mu_);
        if (!s.ok() && !failed_at_) {
            failed_at_ = ticket;
            failure_ = s.prefix(name_ + ": ");
        }
        finished_ = ticket;
        return ticket;
    }
    cv_.notify_all();
    return ticket;
}

void CommChannel::run() {
    trace::name_this_thread("sx channel: " + name_);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        Entry next = std::move(queue_.front());
        queue_.pop_front();
        const bool skip = failed_at_ != 0 && !next.always;
        lock.unlock();
        Status s = skip ? Status::Ok() : catching(next.job);
        next.job = nullptr;  // whatever the job holds goes before it is reported done
        lock.lock();
        if (!s.ok() && !failed_at_) {
            failed_at_ = next.ticket;
            failure_ = s.prefix(name_ + ": ");
        }
        finished_ = next.ticket;
        cv_.notify_all();
    }
}

Status CommChannel::wait(uint64_t ticket) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_ >= ticket || stop_; });
    if (failed_at_ && failed_at_ <= ticket) return failure_;
    if (finished_ < ticket)
        return SX_ERROR(SX_ERR_INTERNAL, "%s: the channel stopped before job %llu ran", name_.c_str(),
                        static_cast<unsigned long long>(ticket));
    return Status::Ok();
}

Status CommChannel::drain() {
    uint64_t last;
    {
        std::lock_guard<std::mutex> lock(mu_);
        last = submitted_;
    }
    return wait(last);
}

uint64_t CommChannel::failed_at() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_at_;
}

void CommChannel::clear_failure() {
    std::lock_guard<std::mutex> lock(mu_);
    failed_at_ = 0;
    failure_ = Status::Ok();
}

bool CommChannel::busy() {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_ < submitted_;
}

}  // namespace core
}  // namespace sx
