// Finding the host's OpenMP runtime (dlopen with RTLD_NOLOAD: an object already mapped,
// matched by its soname, or nothing) and running a job on the calling thread's team
// through GOMP_parallel, the entry point GCC emits for `#pragma omp parallel`.
#include "optim/openmp_team.h"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "base/vector_state.h"

namespace sx {
namespace optim {
namespace {

const char *const kLibraries[] = {"libgomp.so.1", "libomp.so.5", "libomp.so", "libiomp5.so"};

using Clock = std::chrono::steady_clock;

// A team thread that starts this long after the call began was not awake for it: the
// host's workers sleep (OMP_WAIT_POLICY=passive, or spun out), or other threads hold the
// processors. A spinning worker starts within microseconds. SX_OPENMP_LATE_START_US
// replaces it (0: never decline the team).
constexpr int64_t kLateStartUs = 200;
// Jobs the pool then runs before the team is tried again on this thread.
constexpr int kJobsAfterLateStart = 64;

struct Job {
    const std::function<void(int)> *fn;
    int n;
    int (*thread_num)();
    int (*num_threads)();
    Clock::time_point start;
    std::atomic<int64_t> latest_start_ns{0};
};

thread_local const OpenMpTeam *t_caller_team = nullptr;
thread_local int t_jobs_to_pool = 0;  // jobs left before this thread's team is tried again

}  // namespace

// The first runtime of kLibraries loaded in this process, or nullptr.
OpenMpTeam *OpenMpTeam::load() {
    for (const char *name : kLibraries) {
        void *h = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
        if (!h) continue;
        std::unique_ptr<OpenMpTeam> t(new OpenMpTeam());
        t->library_ = name;
        t->parallel_ = reinterpret_cast<Parallel>(dlsym(h, "GOMP_parallel"));
        t->thread_num_ = reinterpret_cast<IntFn>(dlsym(h, "omp_get_thread_num"));
        t->num_threads_ = reinterpret_cast<IntFn>(dlsym(h, "omp_get_num_threads"));
        t->in_parallel_ = reinterpret_cast<IntFn>(dlsym(h, "omp_in_parallel"));
        if (t->parallel_ && t->thread_num_ && t->num_threads_ && t->in_parallel_)
            return t.release();  // kept for the process's life, as the library
        dlclose(h);
    }
    return nullptr;
}

Status OpenMpTeam::find(const OpenMpTeam **out) {
    static std::mutex mu;
    static OpenMpTeam *found = nullptr;
    std::lock_guard<std::mutex> lock(mu);
    if (!found) found = load();
    if (!found)
        return SX_ERROR(SX_ERR_UNSUPPORTED,
                        "no OpenMP runtime is loaded in this process (looked for libgomp.so.1, libomp.so.5, "
                        "libomp.so and libiomp5.so, each exporting GOMP_parallel); sx does not load one itself");
    const char *env = std::getenv("SX_OPENMP_LATE_START_US");
    char *end = nullptr;
    const long long us = env && env[0] ? std::strtoll(env, &end, 10) : kLateStartUs;
    SX_CHECK_ARG(!env || !env[0] || (*end == '\0' && us >= 0 && us < INT64_MAX / 1000),
                 "SX_OPENMP_LATE_START_US is '%s'; it must be a whole number of microseconds >= 0", env);
    found->late_start_ns_.store(us == 0 ? INT64_MAX : us * 1000, std::memory_order_relaxed);
    *out = found;
    return Status::Ok();
}

void OpenMpTeam::trampoline(void *p) {
    Job *job = static_cast<Job *>(p);
    const int k = job->num_threads(), t = job->thread_num();
    if (t != 0) {
        const int64_t late = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - job->start).count();
        int64_t seen = job->latest_start_ns.load(std::memory_order_relaxed);
        while (late > seen && !job->latest_start_ns.compare_exchange_weak(seen, late, std::memory_order_relaxed)) {
        }
    }
    for (int i = t; i < job->n; i += k) (*job->fn)(i);
    // The team's workers go back to the host's code (its next parallel region).
    if (t != 0) leave_vector_state_clean();
}

bool OpenMpTeam::run(const std::function<void(int)> &fn, int n) const {
    if (t_jobs_to_pool > 0) {
        --t_jobs_to_pool;
        return false;
    }
    if (in_parallel_()) return false;
    Job job{&fn, n, thread_num_, num_threads_, Clock::now()};
    parallel_(&OpenMpTeam::trampoline, &job, static_cast<unsigned>(n), 0);
    if (job.latest_start_ns.load(std::memory_order_relaxed) > late_start_ns_.load(std::memory_order_relaxed))
        t_jobs_to_pool = kJobsAfterLateStart;
    return true;
}

const OpenMpTeam *caller_openmp_team() { return t_caller_team; }
void set_caller_openmp_team(const OpenMpTeam *team) { t_caller_team = team; }

}  // namespace optim
}  // namespace sx
