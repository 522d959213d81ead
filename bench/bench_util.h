// Shared by the sections of bench_sx: options, paired timing, staggered streams.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "base/memory.h"
#include "optim/optimizer.h"
#include "sx/sx.h"

namespace sx {
namespace optim {
class ThreadPool;
}  // namespace optim
}  // namespace sx

namespace sxbench {

using sx::HostBuffer;

struct Options {
    size_t elements = size_t(64) << 20;  // 64 Mi fp32: far beyond any cache
    size_t comm_mib = 64;                // bytes per collective in the comm section
    int reps = 15;
    size_t ckpt_mib = 576;               // checkpoint section: values + state in the files
    std::string ckpt_dir = "/tmp";       // checkpoint section: its mkdtemp directory goes here
    size_t gpu_elements = size_t(1) << 28;  // gpu_adamw and gpu_step sections
    std::vector<int> scale_worlds = {1024, 4096, 16384};  // scale section: the saving jobs' ranks
    int scale_load_from = 4096, scale_load_into = 3072;   // scale section: the resharding load
    bool scale_unit_per_param = false;                    // scale section: one unit per param
    int scale_reps = 3;                                   // scale section: timed runs per figure
    std::vector<int> form_worlds = {8, 32, 64, 128};      // form section: the worlds of processes
    std::string torch_python;  // optimizers section: a Python with torch, to time torch's optimizers
};

// Heap bytes of this process allocated through operator new and not yet freed
// (bench/heap_counter.cc replaces the global operator new and delete), and the most of
// them live at once since the last reset_peak(). Any thread.
struct HeapCounter {
    static int64_t live();
    static int64_t peak();
    static void reset_peak();  // peak = live
    // While one exists, what this thread allocates is not counted, now or when freed.
    struct Uncounted {
        Uncounted();
        ~Uncounted();
        Uncounted(const Uncounted &) = delete;
        Uncounted &operator=(const Uncounted &) = delete;
    };
};


// The command line that runs `python args` as a user would: where bench_sx chose
// OpenMP's passive wait policy for itself (main.cc), torch's OpenMP threads get their
// default back (they spin between parallel regions), so that torch is not slowed by our
// choice.
inline std::string torch_command(const std::string &python, const std::string &args) {
    const bool ours = std::getenv("SX_BENCH_SET_OMP_WAIT_POLICY") != nullptr;
    return (ours ? "env -u OMP_WAIT_POLICY -u SX_BENCH_SET_OMP_WAIT_POLICY " : "") + python + " " + args;
}

inline double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Seconds per repetition of a and of b; a[r] and b[r] ran back to back.
struct PairTimes {
    std::vector<double> a, b;
    // Median over repetitions of b[r] / a[r].
    double paired_ratio() const {
        std::vector<double> r;
        for (size_t i = 0; i < a.size(); ++i) r.push_back(b[i] / a[i]);
        return median(r);
    }
    double min_a() const { return *std::min_element(a.begin(), a.end()); }
    double min_b() const { return *std::min_element(b.begin(), b.end()); }
};

// Times a and b `reps` times each, alternating which goes first, after one untimed
// run of each.
inline PairTimes time_pair(const std::function<void()> &a, const std::function<void()> &b, int reps) {
    a();
    b();
    PairTimes t;
    for (int r = 0; r < reps; ++r) {
        for (int k = 0; k < 2; ++k) {
            const bool run_a = (r % 2 == 0) == (k == 0);
            const double t0 = now_seconds();
            (run_a ? a : b)();
            (run_a ? t.a : t.b).push_back(now_seconds() - t0);
        }
    }
    return t;
}

// A reusable barrier for rank threads (C++17 has none).
class Barrier {
  public:
    explicit Barrier(int n) : n_(n) {}
    void wait() {
        std::unique_lock<std::mutex> l(mu_);
        const int gen = gen_;
        if (++count_ == n_) {
            count_ = 0;
            ++gen_;
            cv_.notify_all();
        } else {
            cv_.wait(l, [&] { return gen_ != gen; });
        }
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    int n_, count_ = 0, gen_ = 0;
};

// Streams of `n` floats in staggered host buffers (see base/memory.h for why).
struct Streams {
    HostBuffer param, grad, m, v;
    // One AdamW segment over all n elements of the streams.
    sx::optim::Segment adamw_segment(const sx::optim::Hyper *h, size_t n) const {
        sx::optim::Segment seg;
        seg.param = param.as<float>();
        seg.grad = grad.as<float>();
        seg.state[0] = m.as<float>();
        seg.state[1] = v.as<float>();
        seg.n = n;
        seg.hyper = h;
        return seg;
    }
    bool allocate(size_t n) {
        const size_t bytes = n * sizeof(float);
        for (auto *b : {&param, &grad, &m, &v}) {
            sx::Status s = b->allocate(bytes, "benchmark stream");
            if (!s.ok()) {
                std::fprintf(stderr, "bench_sx: %s\n", s.message().c_str());
                return false;
            }
        }
        uint32_t x = 12345;
        float *p = param.as<float>(), *g = grad.as<float>();
        for (size_t i = 0; i < n; ++i) {
            x = x * 1664525u + 1013904223u;
            g[i] = static_cast<float>(static_cast<int32_t>(x)) * (1.0f / 2147483648.0f);
            p[i] = 0.5f * g[i] + 0.25f;
        }
        return true;
    }
};

// Sections: each prints a readable table and one JSON line per figure; 0 = success.
int section_adamw_kernel(const Options &opt);
// The host's fused AdamW kernel (isa's) on *seg against the memory-traffic ceiling with
// its pattern (4 streams read, 3 written), both split across `pool` as the kernel splits
// its work, timed in alternation (section adamw_kernel's measure; a: the kernel).
PairTimes adamw_kernel_vs_ceiling(sx::optim::Segment *seg, sx::optim::Isa isa, sx::optim::ThreadPool &pool,
                                  int reps);
int section_step(const Options &opt);
int section_comm(const Options &opt);
int section_checkpoint(const Options &opt);
int section_load(const Options &opt);
int section_pipeline(const Options &opt);
int section_scale(const Options &opt);
int section_trace(const Options &opt);
int section_small_step(const Options &opt);
int section_optimizers(const Options &opt);
int section_state_dtype(const Options &opt);
int section_stochastic_round(const Options &opt);
int section_context(const Options &opt);
int context_rank_main(int argc, char **argv);
int section_form(const Options &opt);
int form_rank_main(int argc, char **argv);
int section_custom_optimizer(const Options &opt);
int section_param_sums(const Options &opt);
// One rank of the pipeline section (bench_sx runs itself once per rank with --pipeline-rank).
int pipeline_rank_main(int argc, char **argv);

// The first of n consecutive TCP ports on 127.0.0.1 that were free a moment ago, or 0.
int free_ports(int n);
// Starts this program once per rank with args(rank) (its argv after argv[0]) and waits
// for all of them; true if every one exited 0.
bool run_self(int world, const std::function<std::vector<std::string>(int rank)> &args);
// A group over `url` with one SGD param group (lr 1e-3) and `units` params of
// `unit_numel` fp32, one per unit, finalized; one thread per rank; the CPU transport
// chosen by `transport` (SX_TRANSPORT_*). Exits the program, naming `section`, on any
// error.
sx_shard_group_t *make_sgd_group(const char *section, const std::string &url, int rank, int world, int stage,
                                 int prefetch, int shard_size, int units, int64_t unit_numel,
                                 int32_t transport = SX_TRANSPORT_AUTO);
int section_mesh(const Options &opt);
int section_norm_domain(const Options &opt);
int section_packed(const Options &opt);
int mesh_rank_main(int argc, char **argv);
int section_shm(const Options &opt);
int section_cache_step(const Options &opt);
int shm_rank_main(int argc, char **argv);
int section_shm_step(const Options &opt);
int shm_step_rank_main(int argc, char **argv);
int section_regroup(const Options &opt);
int regroup_rank_main(int argc, char **argv);
#ifdef SX_BENCH_NETLAB
int section_hosts(const Options &opt);
int hosts_rank_main(int argc, char **argv);
#endif
#ifdef SX_HAVE_CUDA
// Where there is no CUDA device: prints that `section` was skipped and why (its table line
// and its JSON line), and returns true.
bool gpu_skipped(const char *section);
int section_gpu_adamw(const Options &opt);
int section_gpu_step(const Options &opt);
int section_gpu_offload(const Options &opt);
#endif

}  // namespace sxbench
