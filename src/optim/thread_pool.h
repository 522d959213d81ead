// A small fork-join pool owned by a group (never a process-global runtime such as
// OpenMP's, which would impose itself on the host program). Idle workers sleep at once:
// polling before sleeping hands jobs out faster back to back, but a poller delays the
// thread it waits for whenever the scheduler puts both on one processor (seen often on
// small virtual machines), and takes processors from the host program's other threads
// and processes. bench_sx adamw_kernel compares the pool with OpenMP (bench/README.md).
// Where the host program runs an OpenMP runtime of its own and a group asks for it
// (SX_GROUP_OPENMP_THREADS), jobs started on the thread of that group's API call run on
// the host's team instead (openmp_team.h): its workers are awake already.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sx {
namespace optim {

class ThreadPool {
  public:
    // num_threads >= 1 workers take part in run(), the calling thread being one of them,
    // so num_threads - 1 threads are started.
    explicit ThreadPool(int num_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int size() const { return num_threads_; }

    // Calls fn(i) for i in [0, size()) concurrently, one per thread, and returns when
    // all have returned. fn must not throw. Not reentrant; calls from several threads
    // run one after the other.
    void run(const std::function<void(int)> &fn);
    // For work that fn takes from a shared counter until none is left: calls fn(0) on
    // this thread at once, and fn(i) on each worker i that wakes while fn(0) runs; then
    // returns as soon as the workers that started have returned. A worker that wakes
    // late (or finds its processor busy with another program's threads, such as a
    // framework's spinning OpenMP workers) delays nothing: whoever runs takes the work.
    // Same rules as run().
    void run_open(const std::function<void(int)> &fn);

  private:
    // Which workers run the published job.
    enum class Claim {
        every,   // run()'s: every worker, once
        open,    // run_open()'s, while the caller runs its part: a worker that wakes claims it
        closed,  // run_open()'s, after the caller's part: a worker that wakes skips it
    };
    void run_job(const std::function<void(int)> &fn, Claim claim);
    void worker(int index);

    int num_threads_;
    std::vector<std::thread> threads_;
    std::mutex run_mu_;  // one run() at a time
    std::mutex mu_;
    std::condition_variable start_cv_, done_cv_;
    const std::function<void(int)> *job_ = nullptr;
    uint64_t generation_ = 0;
    int pending_ = 0;  // workers yet to return from the job
    Claim claim_ = Claim::every;
    bool stop_ = false;
};

}  // namespace optim
}  // namespace sx
