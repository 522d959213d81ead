// Fork-join pool. run() publishes the job under the mutex with a new generation
// number; each worker runs it once per generation it observes, and the last one to
// finish wakes run(). The generation number (not a flag) is what workers wait on, so
// a worker that is slow to wake still runs each job exactly once, and run() cannot
// return before every worker has finished with the job it was given. run_open() is the
// same but for the count: a worker claims the job (pending_ + 1) only while the caller
// has not finished its own call of it, and the caller waits for the claimed ones only.
// On the thread of an API call that asked for it, a job runs on the host's OpenMP team
// instead (openmp_team.h), still one at a time.
#include "optim/thread_pool.h"

#include "optim/openmp_team.h"

namespace sx {
namespace optim {

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
    threads_.reserve(static_cast<size_t>(num_threads_ - 1));
    for (int i = 1; i < num_threads_; ++i) threads_.emplace_back(&ThreadPool::worker, this, i);
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    start_cv_.notify_all();
    for (std::thread &t : threads_) t.join();
}

void ThreadPool::run(const std::function<void(int)> &fn) { run_job(fn, Claim::every); }

void ThreadPool::run_open(const std::function<void(int)> &fn) { run_job(fn, Claim::open); }

// Publishes the job: every worker must run it (pending_ counts them), or, open, those
// that claim it before the caller has finished its own part (each claim adds to pending_).
void ThreadPool::run_job(const std::function<void(int)> &fn, Claim claim) {
    std::lock_guard<std::mutex> one_at_a_time(run_mu_);
    if (num_threads_ == 1) {
        fn(0);
        return;
    }
    // A call made for a group with SX_GROUP_OPENMP_THREADS, on the trainer's thread: the
    // host's OpenMP team takes the job (every index at once, as run() promises; run_open's
    // callers share their work whoever runs, so it needs nothing more).
    if (const OpenMpTeam *team = caller_openmp_team())
        if (team->run(fn, num_threads_)) return;
    {
        std::lock_guard<std::mutex> lock(mu_);
        job_ = &fn;
        claim_ = claim;
        pending_ = claim == Claim::every ? num_threads_ - 1 : 0;
        ++generation_;
    }
    start_cv_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lock(mu_);
    if (claim_ == Claim::open) claim_ = Claim::closed;  // a worker yet to claim it skips it
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
}

void ThreadPool::worker(int index) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (claim_ == Claim::closed) continue;  // the caller has done the work
        if (claim_ == Claim::open) ++pending_;
        const std::function<void(int)> *job = job_;
        lock.unlock();
        (*job)(index);
        lock.lock();
        if (--pending_ == 0) done_cv_.notify_one();
    }
}

}  // namespace optim
}  // namespace sx
