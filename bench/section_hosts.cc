// bench_sx section hosts: one step of an AdamW param of --elements (default 16 Mi) fp32
// elements at 2 hosts x 2 ranks, across a shaped link (tests/netlab: hosts as network
// namespaces whose packets a thread moves through links of 1 Gbit/s and 0.25 ms each way,
// so 0.5 ms from host to host, and again at 250 Mbit/s, where the link alone bounds the
// step on this machine; the store on a third host), stage 2:
//   two-level  sx's default: shared memory within each host, TCP between host peers
//   flat       Gloo's TCP between every pair of ranks (SX_TRANSPORT_TCP)
//   context two-level, context flat: the same group made in a context of the 4 ranks
//              (sx_context.h): channels of each host's shared memory and of the context's
//              Gloo mesh, or (SX_TRANSPORT_TCP) channels of the mesh alone
// The median step (the slowest rank's) of --reps steps (at most 5) after 2 warm-up
// steps, the bytes each host's link carried per timed step (what the wire moved between
// rank 0's first and last timed step, halved: each packet crosses two links), and the
// ceiling: that many bytes at the link's rate. The ratio of the two transports, and of
// each to its ceiling, are the figures.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "fixtures.h"
#include "netlab.h"
#include "sx/sx.h"

namespace sxbench {
namespace {

constexpr double kRates[2] = {125e6, 31.25e6};  // bytes a second: 1 Gbit/s, and 250 Mbit/s
constexpr double kLinkDelayMs = 0.25;           // each way of each host's link
constexpr int kStoreHost = 2;

void fail(const char *what) {
    std::fprintf(stderr, "bench_sx hosts: %s: %s\n", what, sx_last_error_message());
    std::exit(1);
}

}  // namespace

// One rank: bench_sx --hosts-rank MODE R URL ELEMENTS STEPS DIR: writes DIR/step_s.R,
// the times of the steps after 2 warm-up ones; rank 0 also DIR/warm before the first timed
// step and DIR/done after the last.
int hosts_rank_main(int argc, char **argv) {
    if (argc != 8) return 2;
    const std::string mode = argv[2], url = argv[4], dir = argv[7];
    const int rank = std::atoi(argv[3]), steps = std::atoi(argv[6]);
    int64_t n = std::strtoll(argv[5], nullptr, 10);
    const bool flat = mode == "flat" || mode == "context flat", in_context = mode.compare(0, 8, "context ") == 0;
    sx_context_t *ctx = nullptr;
    if (in_context) {
        sx_context_config_t cc;
        sx_context_config_init(&cc, sizeof cc);
        cc.backend = SX_BACKEND_CPU;
        cc.rendezvous = url.c_str();
        cc.rank = rank;
        cc.world_size = 4;
        cc.num_threads = 1;
        cc.timeout_ms = 120000;
        cc.transport = flat ? SX_TRANSPORT_TCP : SX_TRANSPORT_AUTO;
        if (sx_create_context(&cc, &ctx) != SX_OK) fail("sx_create_context");
    }
    sx_group_config_t c;
    sx_group_config_init(&c, sizeof c);
    c.stage = 2;
    if (in_context) {
        c.context = ctx;
        c.name = "bench";
    } else {
        c.backend = SX_BACKEND_CPU;
        c.rendezvous = url.c_str();
        c.rank = rank;
        c.world_size = 4;
        c.num_threads = 1;
        c.timeout_ms = 120000;
        c.transport = flat ? SX_TRANSPORT_TCP : SX_TRANSPORT_AUTO;
    }
    sx_shard_group_t *g = make_adamw_group(c, n);
    std::ofstream out(dir + "/step_s." + std::to_string(rank));
    for (int s = 0; s < steps + 2; ++s) {
        if (rank == 0 && s == 2) std::ofstream(dir + "/warm") << "1\n";
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        if (sx_grad_view(g, 0, &v) != SX_OK) fail("sx_grad_view");
        std::fill(static_cast<float *>(v.data), static_cast<float *>(v.data) + v.numel, 0.001f * (rank + 1));
        const double t0 = now_seconds();
        if (sx_step(g, nullptr, nullptr) != SX_OK) fail("sx_step");
        if (s >= 2) out << now_seconds() - t0 << "\n";
    }
    if (rank == 0) std::ofstream(dir + "/done") << "1\n";
    sx_destroy_shard_group(g);
    sx_destroy_context(ctx);
    return out.good() ? 0 : 1;
}

namespace {

constexpr int kNumModes = 4;
const char *const kModes[kNumModes] = {"two-level", "flat", "context two-level", "context flat"};

// One run of 4 ranks with transport kModes[m] (the link as set): its median step into
// *step, and its line of the table and its JSON printed; false if a rank failed.
bool run_mode(netlab::Lab *lab, int m, int64_t n, int steps, const std::string &dir, double rate, double *step) {
    const std::vector<std::pair<std::string, std::string>> token = {{"SX_RENDEZVOUS_TOKEN", "bench-hosts"}};
    const pid_t store =
        lab->spawn(kStoreHost, {SX_RENDEZVOUS_PATH, "--port", "29500", "--bind", lab->address(kStoreHost)}, token);
    const std::string url = "tcp://" + lab->address(kStoreHost) + ":29500?server=external";
    ::unlink((dir + "/warm").c_str());
    ::unlink((dir + "/done").c_str());
    std::vector<pid_t> ranks;
    for (int r = 0; r < 4; ++r) {
        std::vector<std::pair<std::string, std::string>> env = token;
        env.push_back({"SX_HOST_ID", "host-" + std::to_string(r / 2)});
        ranks.push_back(lab->spawn(r / 2,
                                   {"/proc/self/exe", "--hosts-rank", kModes[m], std::to_string(r), url,
                                    std::to_string(n), std::to_string(steps), dir},
                                   env));
    }
    // The wire's counts when rank 0 starts timing and when it is done.
    netlab::WireStats before, after;
    bool ok = true;
    for (const char *mark : {"warm", "done"}) {
        while (ok && ::access((dir + "/" + mark).c_str(), F_OK) != 0) {
            int status = 0;
            ok = ::waitpid(ranks[0], &status, WNOHANG) != ranks[0];
            ::usleep(1000);
        }
        (std::strcmp(mark, "warm") == 0 ? before : after) = lab->stats();
    }
    for (pid_t pid : ranks) {
        int status = 0;
        ok = ::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0 && ok;
    }
    ::kill(store, SIGTERM);
    ::waitpid(store, nullptr, 0);
    if (!ok) {
        std::fprintf(stderr, "bench_sx hosts: a rank of the %s run failed\n", kModes[m]);
        return false;
    }
    // Per step, the slowest rank's; the median over the steps.
    std::vector<double> slowest(static_cast<size_t>(steps), 0.0);
    for (int r = 0; r < 4; ++r) {
        std::ifstream f(dir + "/step_s." + std::to_string(r));
        for (int s = 0; s < steps; ++s) {
            double t = 0;
            f >> t;
            slowest[static_cast<size_t>(s)] = std::max(slowest[static_cast<size_t>(s)], t);
        }
    }
    *step = median(slowest);
    // What crossed the links per timed step and per host (each packet crosses its
    // sender's link and its receiver's).
    const double per_link = static_cast<double>(after.bytes - before.bytes) / 2.0 / steps;
    const double ceiling = per_link / rate;
    std::printf("%-18s %10.3f %14.1f %14.3f %10.2f\n", kModes[m], *step, per_link / 1e6, ceiling, ceiling / *step);
    std::printf("{\"bench\":\"hosts\",\"transport\":\"%s\",\"elements\":%lld,\"hosts\":2,\"ranks_per_host\":2,"
                "\"link_mbit\":%.0f,\"link_delay_ms\":%.2f,\"steps\":%d,\"step_s\":%.4f,\"mb_per_link_per_step\":%.2f,"
                "\"ceiling_s\":%.4f,\"ceiling_over_step\":%.3f}\n",
                kModes[m], static_cast<long long>(n), rate * 8 / 1e6, kLinkDelayMs, steps, *step, per_link / 1e6,
                ceiling, ceiling / *step);
    return true;
}

}  // namespace

int section_hosts(const Options &opt) {
    const int64_t n = opt.elements == (size_t(64) << 20) ? (int64_t(16) << 20) : static_cast<int64_t>(opt.elements);
    const int steps = std::max(1, std::min(opt.reps, 5));
    std::unique_ptr<netlab::Lab> lab;
    const std::string why = netlab::Lab::create(3, &lab);
    if (!why.empty()) {
        std::printf("hosts: skipped: %s\n", why.c_str());
        return 0;
    }
    char templ[] = "/tmp/sx-bench-hosts-XXXXXX";
    const std::string dir = mkdtemp(templ) ? templ : "";
    if (dir.empty()) return 1;
    for (double rate : kRates) {
        netlab::Link link;
        link.rate = rate;
        link.delay_ms = kLinkDelayMs;
        lab->set_links(link);
        std::printf("hosts: 2 hosts x 2 ranks, AdamW on %lld fp32 elements (stage 2), each host's link %.0f Mbit/s "
                    "and %.2f ms each way (%.1f ms host to host); median step of %d\n",
                    static_cast<long long>(n), rate * 8 / 1e6, kLinkDelayMs, 2 * kLinkDelayMs, steps);
        std::printf("%-18s %10s %14s %14s %10s\n", "transport", "step s", "MB/link/step", "ceiling s", "ceiling/s");
        double step_of[kNumModes] = {0, 0, 0, 0};
        for (int m = 0; m < kNumModes; ++m) {
            if (!run_mode(lab.get(), m, n, steps, dir, rate, &step_of[m])) return 1;
        }
        for (int in_context = 0; in_context < 2; ++in_context) {
            const double ratio = step_of[2 * in_context + 1] / step_of[2 * in_context];
            std::printf("%stwo-level is %.2fx faster than flat Gloo over every rank\n", in_context ? "in a context, " : "",
                        ratio);
            std::printf("{\"bench\":\"hosts\",\"figure\":\"flat_over_two_level\",\"context\":%s,\"link_mbit\":%.0f,"
                        "\"ratio\":%.3f}\n",
                        in_context ? "true" : "false", rate * 8 / 1e6, ratio);
        }
    }
    const std::string rm = "rm -rf '" + dir + "'";
    return std::system(rm.c_str()) == 0 ? 0 : 1;
}

}  // namespace sxbench
