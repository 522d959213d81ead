// The threads that asynchronous checkpoint saves run on: one I/O thread runs each item's
// work, and the loop thread runs its completion. Both belong to the IoLoop and end with
// it. Neither is a process-wide pool (libuv's, for one): a process-wide pool outlives
// every group, and libuv's joins its threads from the library's exit handler, which in a
// child forked after a save joins threads that do not exist there.
#pragma once

#include <functional>
#include <memory>

#include "base/status.h"

namespace sx {
namespace io {

class IoLoop {
  public:
    // Starts the loop thread and the I/O thread. SX_ERR_INTERNAL if a thread cannot start.
    static Status create(std::unique_ptr<IoLoop> *out);
    // Stops the loop after the work already queued has completed, and joins both threads.
    // Work that done callbacks submit meanwhile completes too. Must not run on the loop
    // thread (from a done callback) or the I/O thread, nor race with submit() from other
    // threads.
    ~IoLoop();

    // Runs work() on the I/O thread, then done(status of work) on the loop thread.
    // Thread-safe; done may submit more work. done must not block. An exception from
    // work becomes SX_ERR_INTERNAL for done; one from done is logged and dropped. An
    // empty done is allowed. Works run one at a time, in the order submitted; a done may
    // run while the next work does.
    void submit(std::function<Status()> work, std::function<void(Status)> done);

    // Whether the caller is the loop thread (where done callbacks run).
    bool on_loop_thread() const;

    IoLoop(const IoLoop &) = delete;
    IoLoop &operator=(const IoLoop &) = delete;

  private:
    IoLoop();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace io
}  // namespace sx
