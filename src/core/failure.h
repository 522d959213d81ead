// A shard group's failure, a part of it: the first failure (a failed collective or
// device, a load that cannot be undone), kept so that every later call fails with its
// words, and whether sx_abort() was called. Any thread.
#pragma once

#include <atomic>
#include <mutex>

#include "base/status.h"

namespace sx {
namespace core {

class Failure {
  public:
    // Records s as the group's failure where it is the first; true then.
    bool record(const Status &s);
    void set_aborted() { aborted_.store(true); }
    bool aborted() const { return aborted_.load(); }
    // SX_ERR_GROUP_FAILED with the first failure's words (or saying that sx_abort() was
    // called), or ok. After sx_abort, collectives in flight return SX_ERR_ABORTED (from
    // the communicator); later calls this.
    Status check() const;

  private:
    std::atomic<bool> failed_{false};
    std::atomic<bool> aborted_{false};
    mutable std::mutex mu_;
    Status first_;
};

}  // namespace core
}  // namespace sx
