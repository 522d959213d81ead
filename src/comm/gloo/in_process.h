// Ranks of one communicator that are threads of one process (local://, or any
// rendezvous whose ranks all turn out to run here) copy each other's buffers directly
// instead of sending them through sockets: a collective meets at a Meeting, where each
// rank leaves the address of its buffer and reads the others' once all are there.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "rdzv/stores.h"

namespace sx {
namespace comm {

// A string that is the same for every caller in this process and differs between
// processes (a fork's child included).
std::string process_token();

class Meeting {
  public:
    // The meeting named `id` (every rank of a communicator passes the same, unique id),
    // made by its first caller. Thread-safe.
    static std::shared_ptr<Meeting> join(const std::string &id, int world_size);

    explicit Meeting(int world_size);

    // One collective, `what` (its name and sizes: every rank must pass the same):
    // leaves `mine` as this rank's buffer, waits until every rank has left its own, runs
    // fn(buffers) (buffers[r] is rank r's), then waits until every rank has run its fn,
    // so that no buffer changes or goes while a peer reads it (that wait ends whatever
    // happens: every rank it waits for is copying). Errors, with nothing run:
    // SX_ERR_MISMATCH on every rank when ranks pass different `what`s, SX_ERR_TIMEOUT at
    // the deadline, SX_ERR_ABORTED once *aborted is set (and wake() called), or the code
    // of the failure another rank reported with fail(). After any of them the meeting
    // stays failed. One call at a time per rank.
    Status meet(int rank, const std::string &what, void *mine, Clock::time_point deadline,
                const std::atomic<bool> &aborted, const std::function<void(void *const *buffers)> &fn);

    // Fails every wait, present and later, of every rank: the others get `code` and
    // words naming `rank` and `why`. The first failure stays.
    void fail(int rank, sx_status_t code, const std::string &why);
    // Wakes the waits, so that an aborted one sees its flag.
    void wake();

  private:
    // Under mu_: the meeting fails with `code` and `text`, unless it already failed (the
    // first failure stays); the waits wake.
    void fail_locked(sx_status_t code, std::string text);

    const int world_size_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<void *> buffers_;
    std::string what_;  // of the round's first rank
    int arrived_ = 0, finished_ = 0;
    uint64_t arrive_round_ = 0, finish_round_ = 0;  // completed rounds of each barrier
    bool failed_ = false;
    sx_status_t failure_code_ = SX_OK;
    std::string failure_;
};

}  // namespace comm
}  // namespace sx
