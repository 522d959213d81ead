// Bounds a collective by a deadline that is not the communicator's own timeout: while an
// AbortAtDeadline lives, a thread of its own aborts the communicator if the deadline
// passes first, so that a call under way returns (SX_ERR_ABORTED) and fired() tells why.
// A group's creation uses it for its collectives, which must end by the creation's one
// deadline rather than a whole collective timeout after it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "comm/communicator.h"

namespace sx {
namespace comm {

class AbortAtDeadline {
  public:
    // `comm` is borrowed for the guard's life. Throws std::system_error if its thread
    // cannot be started.
    AbortAtDeadline(Communicator *comm, std::chrono::steady_clock::time_point deadline);
    ~AbortAtDeadline();  // stops the thread (without aborting, if the deadline has not passed)
    AbortAtDeadline(const AbortAtDeadline &) = delete;
    AbortAtDeadline &operator=(const AbortAtDeadline &) = delete;

    // The deadline passed and the communicator was aborted.
    bool fired() const;

  private:
    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false, fired_ = false;
    std::thread thread_;
};

}  // namespace comm
}  // namespace sx
