// A thread that runs one communicator's collectives in the order they were submitted,
// so that the trainer's thread goes on (with its backward, or its forward) while they
// run: the grain of overlap of units as a pipeline (docs/design.md, "Units as a
// pipeline"). Every rank submits the same collectives in the same order; the channel
// keeps that order.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "base/status.h"

namespace sx {
namespace core {

class CommChannel {
  public:
    using Job = std::function<Status()>;

    // `name` names the thread's work in errors ("the gradient reductions").
    explicit CommChannel(std::string name) : name_(std::move(name)) {}
    // Stops the thread once the job under way (if any) returns; jobs not yet started
    // are dropped. The owner aborts the communicator first, so that a job waiting on a
    // peer returns at once.
    ~CommChannel();
    CommChannel(const CommChannel &) = delete;
    CommChannel &operator=(const CommChannel &) = delete;

    // Queues `job` behind every job submitted before it and returns its ticket (> 0).
    // Once a job has failed, the later ones are not run: each ends with that failure
    // (an exception thrown by a job is its failure), but for a job submitted `always`
    // (local work that must not be lost, such as a copy back into a shard), which runs
    // and whose own failure is then ignored. Where no thread can be started, the job runs
    // on the caller's thread, before submit returns.
    uint64_t submit(Job job, bool always = false);
    // Waits until job `ticket` has ended: ok, or the channel's first failure if it came
    // at or before that job.
    Status wait(uint64_t ticket);
    // Waits until every job submitted has ended; the first failure, if any.
    Status drain();
    // The ticket of the first failed job, or 0 (none since the last clear_failure).
    uint64_t failed_at();
    // After a drain, forgets the failure (a disagreement that every rank saw and the
    // caller has reported), so that later jobs run again.
    void clear_failure();
    // True while a job is queued or running. Any thread.
    bool busy();

  private:
    void run();

    const std::string name_;
    std::mutex mu_;
    std::condition_variable cv_;
    struct Entry {
        uint64_t ticket;
        Job job;
        bool always;
    };
    std::deque<Entry> queue_;
    uint64_t submitted_ = 0;  // tickets handed out
    uint64_t finished_ = 0;   // every job up to this ticket has ended
    uint64_t failed_at_ = 0;  // the ticket of the first failed job (0: none)
    Status failure_;
    bool stop_ = false;
    bool started_ = false;  // the thread exists (or could not be started: inline)
    bool inline_ = false;   // no thread could be started
    std::thread thread_;
};

}  // namespace core
}  // namespace sx
