// bench_sx section cache_step: sx_step where the state sits in cache, against
// torch.optim.AdamW(fused=True) in the same run. One rank (nothing to exchange), one fp32
// param of N elements (256 Ki, 1 Mi, 4 Mi: 4, 16 and 64 MiB of param, gradient and AdamW
// state), the pool's 2 threads against torch's 2 intra-op threads. bench/torch_cache_step.py
// runs in a child process for the whole section and takes turns with sx: in each of
// `reps` rounds (at least 21), sx's default step (which zeroes the gradients), sx's step
// with keep_grads, and torch's step (which never zeroes) each take 30 steps, every step
// timed alone; the order rotates from round to round. sx's gradients are written again
// before each default step, untimed, as a backward would (zeroed ones would drive the
// moments into denormals). Reported: each one's median and fastest step over every round,
// and sx's median / torch's median (the goal: at most 1).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "fixtures.h"
#include "sx/sx.h"

namespace sxbench {
namespace {

constexpr int kSteps = 30;   // per turn
constexpr int kThreads = 2;

// bench/torch_cache_step.py in a child, spoken to through two pipes.
class TorchPeer {
  public:
    ~TorchPeer() {
        if (to_) std::fclose(to_);
        if (from_) std::fclose(from_);
        if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
    }
    // Starts the script; false (with *why) where it cannot or torch is missing.
    bool start(const std::string &python, std::string *why) {
        int in[2], out[2];
        if (::pipe(in) != 0 || ::pipe(out) != 0) return *why = "pipe failed", false;
        pid_ = ::fork();
        if (pid_ < 0) return *why = "fork failed", false;
        if (pid_ == 0) {
            ::dup2(in[0], 0);
            ::dup2(out[1], 1);
            ::close(in[1]);
            ::close(out[0]);
            const std::string cmd =
                torch_command(python, SX_BENCH_SOURCE_DIR "/torch_cache_step.py --threads " + std::to_string(kThreads));
            ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char *>(nullptr));
            std::_Exit(127);
        }
        ::close(in[0]);
        ::close(out[1]);
        to_ = ::fdopen(in[1], "w");
        from_ = ::fdopen(out[0], "r");
        std::string line;
        if (!read_line(&line)) return *why = "the script did not start", false;
        if (line.rfind("ready ", 0) != 0) return *why = line, false;
        version_ = line.substr(6);
        return true;
    }
    const std::string &version() const { return version_; }
    // K steps of torch at n elements: their times (s), appended to *times.
    bool steps(size_t n, int k, std::vector<double> *times) {
        std::fprintf(to_, "%zu %d\n", n, k);
        std::fflush(to_);
        std::string line;
        if (!read_line(&line)) return false;
        const char *p = line.c_str();
        char *end = nullptr;
        for (int i = 0; i < k; ++i, p = end) {
            const double t = std::strtod(p, &end);
            if (end == p) return false;
            times->push_back(t);
        }
        return true;
    }

  private:
    bool read_line(std::string *line) {
        line->clear();
        char buf[4096];
        while (std::fgets(buf, sizeof buf, from_)) {
            *line += buf;
            if (!line->empty() && line->back() == '\n') {
                line->pop_back();
                return true;
            }
        }
        return !line->empty();
    }

    pid_t pid_ = -1;
    FILE *to_ = nullptr, *from_ = nullptr;
    std::string version_;
};

struct SxStep {
    sx_shard_group_t *g = nullptr;
    float *grad = nullptr;
    std::vector<float> fresh;  // what a backward writes
    size_t n = 0;
    ~SxStep() {
        if (g) sx_destroy_shard_group(g);
    }
    // The group (make_group: AdamW at torch's defaults, lr 1e-3 and weight_decay 0.01, as
    // the peer's) and 5 warm-up steps.
    bool open(size_t elements) {
        n = elements;
        g = make_group("local://bench-cache-step-" + std::to_string(::getpid()) + "-" + std::to_string(n), 0, 1,
                       kThreads, n, false);
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        if (!g || sx_grad_view(g, 0, &v) != SX_OK) return false;
        grad = static_cast<float *>(v.data);
        fresh.assign(grad, grad + n);
        for (int i = 0; i < 5; ++i)
            if (!steps(true, 1, nullptr)) return false;
        return true;
    }
    // k steps, each timed alone: the default (zeroing) step with fresh gradients written
    // before it, untimed; or keep_grads on the gradients as they are.
    bool steps(bool zeroing, int k, std::vector<double> *times) {
        sx_step_options_t o;
        sx_step_options_init(&o, sizeof o);
        o.keep_grads = zeroing ? 0 : 1;
        for (int i = 0; i < k; ++i) {
            if (zeroing) std::memcpy(grad, fresh.data(), n * sizeof(float));
            const double t0 = now_seconds();
            if (sx_step(g, &o, nullptr) != SX_OK) return false;
            if (times) times->push_back(now_seconds() - t0);
        }
        return true;
    }
};

}  // namespace

int section_cache_step(const Options &opt) {
    std::string python = opt.torch_python;
    if (python.empty() && std::getenv("SX_BENCH_TORCH_PYTHON")) python = std::getenv("SX_BENCH_TORCH_PYTHON");
    const int rounds = std::max(opt.reps, 21);
    TorchPeer torch;
    std::string why = "no --torch-python or SX_BENCH_TORCH_PYTHON";
    const bool have_torch = !python.empty() && torch.start(python, &why);
    std::printf("cache_step: sx_step at one rank (AdamW fp32, %d threads) against torch %s AdamW(fused=True) "
                "(%d intra-op threads), taking turns: %d rounds of %d steps each, every step timed alone; "
                "sx's default step zeroes the gradients (written again before it, untimed), keep_grads does not, "
                "torch's never does\n",
                kThreads, have_torch ? torch.version().c_str() : ("(not run: " + why + ")").c_str(), kThreads, rounds,
                kSteps);
    std::printf("%10s %-14s %10s %10s %16s\n", "elements", "step", "median_us", "fastest_us", "median/torch's");
    for (size_t n : {size_t(1) << 18, size_t(1) << 20, size_t(1) << 22}) {
        SxStep s;
        if (!s.open(n)) {
            std::fprintf(stderr, "cache_step: the group of %zu elements: %s\n", n, sx_last_error_message());
            return 1;
        }
        std::vector<double> times[3];  // sx default, sx keep_grads, torch
        for (int r = 0; r < rounds; ++r) {
            for (int j = 0; j < 3; ++j) {
                const int which = (r + j) % 3;
                bool ok = true;
                if (which == 0) ok = s.steps(true, kSteps, &times[0]);
                if (which == 1) ok = s.steps(false, kSteps, &times[1]);
                if (which == 2 && have_torch) ok = torch.steps(n, kSteps, &times[2]);
                if (!ok) {
                    std::fprintf(stderr, "cache_step: %s failed at %zu elements: %s\n",
                                 which == 2 ? "torch's step" : "sx_step", n, which == 2 ? "" : sx_last_error_message());
                    return 1;
                }
            }
        }
        const double torch_median = have_torch ? median(times[2]) : 0.0;
        const char *names[3] = {"sx_step", "sx keep_grads", "torch fused"};
        for (int j = 0; j < (have_torch ? 3 : 2); ++j) {
            if (times[j].empty()) continue;
            const double m = median(times[j]);
            const double fastest = *std::min_element(times[j].begin(), times[j].end());
            const double ratio = have_torch ? m / torch_median : 0.0;
            std::printf("%10zu %-14s %10.1f %10.1f %16.3f\n", n, names[j], m * 1e6, fastest * 1e6, ratio);
            std::printf("{\"bench\":\"cache_step\",\"elements\":%zu,\"step\":\"%s\",\"rounds\":%d,\"median_us\":%.2f,"
                        "\"fastest_us\":%.2f,\"vs_torch_median\":%.4f}\n",
                        n, names[j], rounds, m * 1e6, fastest * 1e6, ratio);
        }
    }
    return 0;
}

}  // namespace sxbench
