// Forming a group of W real processes on this machine: each rank a process of its own
// (this program again, --form-rank), over tcp:// on rank 0's store, times its
// sx_create_shard_group, sx_finalize (one param of 4096 fp32, AdamW) and first sx_step.
// Three layouts: every rank on one host (one shared-memory communicator), and every rank
// saying it runs on a host of its own (SX_HOST_ID), on Gloo's full mesh (SX_GLOO_MESH=full:
// W - 1 connections and W - 1 listening sockets per rank, all of them on this machine's
// one port range) and on its sparse mesh (SX_GLOO_MESH=sparse: 2 log2 W of each at most);
// and, a host each again, a context (sx_create_context) on either mesh with the group made
// in it ("create" is then the context's creation and the group's, together).
// The figures are absolute: what they show is how each grows with W on 2 vCPUs.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "fixtures.h"
#include "comm/gloo/full_mesh.h"
#include "sx/sx.h"

namespace sxbench {
namespace {

struct Formed {
    bool ok = false;
    double wall = 0;                 // spawning the ranks to the last one's exit
    std::vector<double> create, finalize, step;  // per rank, seconds
};

// hosts: "one", "full" or "sparse" (a host each, SX_GLOO_MESH), or "context-full" or
// "context-sparse" (the same, the group made in a context).
Formed form(int world, const std::string &hosts) {
    Formed out;
    const int port = free_ports(1);
    char path[] = "/tmp/sx-bench-form-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd >= 0) ::close(fd);
    const double t0 = now_seconds();
    out.ok = port != 0 && fd >= 0 && run_self(world, [&](int r) {
        return std::vector<std::string>{"--form-rank", std::to_string(port), std::to_string(r), std::to_string(world),
                                        path, hosts};
    });
    out.wall = now_seconds() - t0;
    std::ifstream f(path);
    int rank = 0;
    double c = 0, z = 0, s = 0;
    while (f >> rank >> c >> z >> s) {
        out.create.push_back(c);
        out.finalize.push_back(z);
        out.step.push_back(s);
    }
    ::unlink(path);
    out.ok = out.ok && out.create.size() == static_cast<size_t>(world);
    return out;
}

double most(const std::vector<double> &v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

// The ports of this machine's ephemeral range (net.ipv4.ip_local_port_range), which every
// listening socket bound to port 0 and every connection's near end take one of.
long ephemeral_ports() {
    std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
    long lo = 0, hi = 0;
    return f >> lo >> hi && hi >= lo ? hi - lo + 1 : 0;
}

}  // namespace

// One rank: argv = --form-rank PORT RANK WORLD FILE HOSTS. Appends "rank create finalize
// step" (seconds) to FILE in one write.
int form_rank_main(int argc, char **argv) {
    if (argc != 7) return 2;
    const int port = std::atoi(argv[2]), rank = std::atoi(argv[3]), world = std::atoi(argv[4]);
    const std::string hosts = argv[6];
    const bool in_context = hosts.rfind("context-", 0) == 0;
    if (hosts != "one") {
        ::setenv("SX_HOST_ID", (std::string("form-host-") + argv[3]).c_str(), 1);
        ::setenv("SX_GLOO_MESH", in_context ? hosts.c_str() + std::strlen("context-") : hosts.c_str(), 1);
    }
    const std::string url = "tcp://127.0.0.1:" + std::to_string(port);
    const double t0 = now_seconds();
    sx_context_t *ctx = in_context ? make_context(url, rank, world, 600000) : nullptr;
    if (in_context && !ctx) return 3;
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = in_context ? nullptr : url.c_str();
    cfg.context = ctx;
    cfg.name = in_context ? "form" : nullptr;
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.num_threads = in_context ? 0 : 1;  // a context's groups take its pool
    cfg.timeout_ms = 600000;
    sx_shard_group_t *g = nullptr;
    if (sx_create_shard_group(&cfg, &g) != SX_OK) {
        sx_destroy_context(ctx);
        std::fprintf(stderr, "bench_sx form: rank %d: %s\n", rank, sx_last_error_message());
        return 3;
    }
    const double t1 = now_seconds();
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    const int64_t numel = 4096;
    sx_param_desc_t d;
    sx_param_desc_init(&d, sizeof d);
    d.name = "w";
    d.ndim = 1;
    d.shape = &numel;
    const bool made = sx_add_param_group(g, &pg, nullptr) == SX_OK && sx_add_param(g, &d, nullptr) == SX_OK &&
                      sx_finalize(g) == SX_OK;
    const double t2 = now_seconds();
    const bool stepped = made && sx_step(g, nullptr, nullptr) == SX_OK;
    const double t3 = now_seconds();
    if (!stepped) std::fprintf(stderr, "bench_sx form: rank %d: %s\n", rank, sx_last_error_message());
    sx_destroy_shard_group(g);
    sx_destroy_context(ctx);
    if (!stepped) return 3;
    char line[128];
    const int n = std::snprintf(line, sizeof line, "%d %.6f %.6f %.6f\n", rank, t1 - t0, t2 - t1, t3 - t2);
    const int out = ::open(argv[5], O_WRONLY | O_APPEND | O_CLOEXEC);
    const bool written = out >= 0 && ::write(out, line, static_cast<size_t>(n)) == n;
    if (out >= 0) ::close(out);
    return written ? 0 : 3;
}

int section_form(const Options &opt) {
    std::printf("\nform: W processes (this program again) over tcp:// on rank 0's store; each makes a group, "
                "finalizes one param of 4096 fp32 (AdamW) and steps once\n");
    std::printf("%-26s %6s | %12s %12s | %12s %12s | %8s\n", "hosts", "ranks", "create med s", "create max s",
                "finalize max", "1st step max", "wall s");
    for (const std::string hosts : {"one", "full", "sparse", "context-full", "context-sparse"})
        for (int world : opt.form_worlds) {
            const char *how = hosts == "one"            ? "one host (shared memory)"
                              : hosts == "full"         ? "a host each (Gloo, full)"
                              : hosts == "sparse"       ? "a host each (Gloo, sparse)"
                              : hosts == "context-full" ? "in a context (Gloo, full)"
                                                        : "in a context (Gloo, sparse)";
            if (hosts == "one" && world > 512) continue;  // one host's shared memory takes 512 ranks
            // Every rank's Gloo pairs each listen on a port of their own, and half of them
            // connect from another: 3/2 ports of this one machine's range per pair end.
            long pair_ends = 0;
            for (int r = 0; r < world && hosts != "one"; ++r)
                pair_ends += hosts == "full" || hosts == "context-full"
                                 ? world - 1
                                 : static_cast<long>(sx::comm::sparse_peers(r, world).size());
            const long ports = 3 * pair_ends / 2;
            if (ports > ephemeral_ports()) {
                std::printf("%-26s %6d | skipped: %ld ports, the machine's ephemeral range has %ld\n", how, world,
                            ports, ephemeral_ports());
                continue;
            }
            const Formed f = form(world, hosts);
            if (!f.ok) {
                std::printf("%-26s %6d | failed\n", how, world);
                continue;
            }
            std::printf("%-26s %6d | %12.3f %12.3f | %12.3f %12.3f | %8.2f\n", how, world, median(f.create),
                        most(f.create), most(f.finalize), most(f.step), f.wall);
            std::printf("{\"bench\":\"form\",\"hosts\":\"%s\",\"world\":%d,\"create_median_s\":%.4f,"
                        "\"create_max_s\":%.4f,\"finalize_max_s\":%.4f,\"first_step_max_s\":%.4f,\"wall_s\":%.3f}\n",
                        hosts.c_str(), world, median(f.create), most(f.create), most(f.finalize), most(f.step),
                        f.wall);
        }
    return 0;
}

}  // namespace sxbench
