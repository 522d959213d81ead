// A save's or a load's progress in the log: one line at the start, one as each quarter of
// this rank's bytes is done, one at the end with the time and the rate (at SX_LOG_INFO
// on rank 0, SX_LOG_DEBUG on the others, so that a thousand ranks do not flood the log at
// INFO). A save's future reports the same bytes (sx_future_progress); a load, which has
// no future, reports here alone. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "base/log.h"
#include "base/trace.h"

namespace sx {
namespace ckpt {

class ProgressLog {
  public:
    // verb: "saving" or "loading"; path: the checkpoint; total: this rank's bytes.
    ProgressLog(const char *verb, std::string path, int rank, uint64_t total, const std::string &what)
        : verb_(verb), path_(std::move(path)), rank_(rank), level_(rank == 0 ? SX_LOG_INFO : SX_LOG_DEBUG),
          total_(total), start_ns_(trace::now_ns()) {
        if (log_enabled(level_))
            log(level_, "sx: rank %d %s %s: %s, %.1f MiB on this rank", rank_, verb_, path_.c_str(), what.c_str(),
                mib(total_));
    }

    // `bytes` more are done.
    void add(uint64_t bytes) {
        const uint64_t before = done_.fetch_add(bytes), after = before + bytes;
        if (total_ == 0 || !log_enabled(level_)) return;
        const uint64_t q0 = before * 4 / total_, q1 = after * 4 / total_;
        if (q1 > q0 && q1 < 4)
            log(level_, "sx: rank %d %s %s: %.1f of %.1f MiB (%d%%)", rank_, verb_, path_.c_str(), mib(after),
                mib(total_), static_cast<int>(q1 * 25));
    }

    // The rank's part is done (the checkpoint committed, or loaded).
    void finish(const char *what) {
        if (!log_enabled(level_)) return;
        const double s = static_cast<double>(trace::now_ns() - start_ns_) * 1e-9;
        log(level_, "sx: rank %d %s %s: %.1f MiB in %.3f s (%.0f MiB/s); %s", rank_, verb_, path_.c_str(),
            mib(done_.load()), s, s > 0 ? mib(done_.load()) / s : 0.0, what);
    }

    uint64_t done() const { return done_.load(); }

  private:
    static double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

    const char *verb_;
    const std::string path_;
    const int rank_, level_;
    const uint64_t total_;
    const int64_t start_ns_;
    std::atomic<uint64_t> done_{0};
};

}  // namespace ckpt
}  // namespace sx
