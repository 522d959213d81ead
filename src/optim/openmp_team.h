// The OpenMP runtime that the host program already runs (torch's libgomp, for one), as a
// place for the pool's jobs: a job started on a thread that has an OpenMP team runs on
// that team, whose workers are the ones the host's last parallel region left spinning
// or sleeping, instead of on the pool's own threads, which would then compete with them
// for the processors (docs/threads.md, "In a PyTorch process"). sx never loads an OpenMP
// runtime: it only finds one that is loaded, through the GOMP entry points that GCC's
// libgomp and LLVM's libomp (and Intel's libiomp5) all export.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "base/status.h"

namespace sx {
namespace optim {

class OpenMpTeam {
  public:
    // The runtime loaded in this process (the first of libgomp.so.1, libomp.so.5,
    // libomp.so, libiomp5.so that is), or SX_ERR_UNSUPPORTED naming what was looked for.
    // The same object for every call; never unloaded. Each call reads the late start that
    // makes the team cold (run()) from SX_OPENMP_LATE_START_US: microseconds, 0 = never;
    // unset = 200. A value that is not a number >= 0: SX_ERR_INVALID_ARGUMENT.
    static Status find(const OpenMpTeam **out);

    // The library's file name as found ("libgomp.so.1").
    const std::string &library() const { return library_; }

    // Calls fn(i) for i in [0, n) on a team of n threads of the runtime started from this
    // thread (index 0 on this thread; if the runtime gives fewer, each runs its share of
    // the indices in turn), and returns when all have returned. False, doing nothing, when
    // this thread is inside a parallel region already (a nested region would be a team of
    // one), or while the team is cold here: a team thread that started more than 200 us
    // (find())
    // after a call (its workers asleep, or the processors busy with other programs, where
    // the region's closing barrier waits for whoever is descheduled) has the next 64 jobs
    // on this thread declined, the pool (which waits for no late worker) taking them; then
    // the team is tried again. The caller runs a declined job elsewhere. fn must not throw.
    bool run(const std::function<void(int)> &fn, int n) const;

  private:
    using Parallel = void (*)(void (*)(void *), void *, unsigned, unsigned);
    using IntFn = int (*)();
    static OpenMpTeam *load();
    static void trampoline(void *job);

    std::string library_;
    Parallel parallel_ = nullptr;  // GOMP_parallel
    IntFn thread_num_ = nullptr, num_threads_ = nullptr, in_parallel_ = nullptr;
    std::atomic<int64_t> late_start_ns_{0};
};

// Where this thread's pool jobs run while it is inside a call that asked for its OpenMP
// team (nullptr: the pool's own threads). Set for the length of an API call on the
// caller's thread only: sx's own threads (channels, pipelines, writers) keep the pool.
const OpenMpTeam *caller_openmp_team();
void set_caller_openmp_team(const OpenMpTeam *team);

}  // namespace optim
}  // namespace sx
