// bench_sx section context: groups made in a context (sx_context.h) against groups of
// their own, 2 ranks as threads over local://. Two kinds of figure:
//   create  the time to make (and destroy) one small group, 2 ranks as threads over
//           local:// and as processes over tcp://: on a rendezvous of its own
//           (store, rendezvous, transport, pool: what every group without a context does)
//           against the 1st..100th group made in one context (its channels only); the
//           ratio is the median fresh time over the median in-context time, and the
//           100th in-context creation's own time is printed beside it. "hosts apart":
//           the processes say they run on hosts of their own (SX_HOST_ID), as ranks on
//           two hosts: a fresh group connects Gloo's TCP mesh, a context's group takes
//           channels on the context's one mesh. "two hosts of two": 4 processes, ranks
//           2h and 2h + 1 on host h: a fresh group is hierarchical (shared memory on each
//           host, Gloo between), as is a context's group (three channels).
//   tenants 8 small tenant groups (64 Ki AdamW params each) stepped at once, each on a
//           thread of its own per rank, for 20 steps: in one context against as 8 groups of
//           their own; steps per second of all tenants, and their ratio.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "fixtures.h"
#include "sx/sx.h"

namespace sxbench {
namespace {

constexpr int kWorld = 2;

// A small group: in ctx (named `name`), or on `rendezvous` of its own. Null on failure (printed).
sx_shard_group_t *make_group(sx_context_t *ctx, const std::string &rendezvous, const std::string &name, int rank,
                             int64_t elements, int world = kWorld) {
    sx_group_config_t c;
    sx_group_config_init(&c, sizeof c);
    if (ctx) {
        c.context = ctx;
        c.name = name.c_str();
    } else {
        c.rendezvous = rendezvous.c_str();
        c.rank = rank;
        c.world_size = world;
        c.num_threads = 1;
        c.backend = SX_BACKEND_CPU;
    }
    sx_shard_group_t *g = nullptr;
    sx_status_t st = sx_create_shard_group(&c, &g);
    sx_param_group_desc_t d;
    sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_ADAMW);
    if (st == SX_OK) st = sx_add_param_group(g, &d, nullptr);
    sx_param_desc_t p;
    sx_param_desc_init(&p, sizeof p);
    p.name = "w";
    p.ndim = 1;
    p.shape = &elements;
    if (st == SX_OK) st = sx_add_param(g, &p, nullptr);
    if (st == SX_OK) st = sx_finalize(g);
    if (st != SX_OK) {
        std::fprintf(stderr, "bench_sx context: %s: %s\n", sx_status_string(st), sx_last_error_message());
        sx_destroy_shard_group(g);
        return nullptr;
    }
    return g;
}

// Seconds each of `n` groups took to make and finalize (and destroy), per rank 0.
std::vector<double> creation_times(bool in_context, int n) {
    std::vector<double> times(static_cast<size_t>(n));
    static std::atomic<int> runs{0};
    const int run = ++runs;
    std::vector<std::thread> ranks;
    for (int r = 0; r < kWorld; ++r)
        ranks.emplace_back([&, r] {
            sx_context_t *ctx = in_context ? make_context("local://bench-ctx-" + std::to_string(run), r, kWorld) : nullptr;
            for (int i = 0; i < n; ++i) {
                const double t0 = now_seconds();
                sx_shard_group_t *g = make_group(ctx, "local://bench-fresh-" + std::to_string(run) + "-" + std::to_string(i),
                                                 "g", r, 4096);
                if (r == 0) times[static_cast<size_t>(i)] = now_seconds() - t0;
                sx_destroy_shard_group(g);
            }
            sx_destroy_context(ctx);
        });
    for (auto &t : ranks) t.join();
    return times;
}

// Steps per second of `tenants` groups stepped at once for `steps` steps each.
double tenant_rate(bool in_context, int tenants, int steps, int64_t elements) {
    static std::atomic<int> runs{0};
    const int run = ++runs;
    double seconds = 0;
    std::vector<std::thread> ranks;
    for (int r = 0; r < kWorld; ++r)
        ranks.emplace_back([&, r] {
            sx_context_t *ctx = in_context ? make_context("local://bench-tenants-" + std::to_string(run), r, kWorld) : nullptr;
            std::vector<sx_shard_group_t *> groups(static_cast<size_t>(tenants), nullptr);
            std::vector<std::thread> made;
            for (int t = 0; t < tenants; ++t)
                made.emplace_back([&, t] {
                    groups[static_cast<size_t>(t)] =
                        make_group(ctx, "local://bench-tenant-" + std::to_string(run) + "-" + std::to_string(t),
                                   "tenant-" + std::to_string(t), r, elements);
                });
            for (auto &t : made) t.join();
            const double t0 = now_seconds();
            std::vector<std::thread> stepping;
            for (int t = 0; t < tenants; ++t)
                stepping.emplace_back([&, t] {
                    sx_shard_group_t *g = groups[static_cast<size_t>(t)];
                    for (int s = 0; g && s < steps; ++s) {
                        sx_view_t v;
                        sx_view_init(&v, sizeof v);
                        sx_grad_view(g, 0, &v);
                        float *grad = static_cast<float *>(v.data);
                        for (uint64_t i = 0; i < v.numel; ++i) grad[i] = 1e-3f * static_cast<float>((i + s) % 97);
                        sx_step(g, nullptr, nullptr);
                    }
                });
            for (auto &t : stepping) t.join();
            if (r == 0) seconds = now_seconds() - t0;
            for (sx_shard_group_t *g : groups) sx_destroy_shard_group(g);
            sx_destroy_context(ctx);
        });
    for (auto &t : ranks) t.join();
    return tenants * steps / seconds;
}

// The processes' variant of creation_times: this program again per rank (context_rank_main),
// over tcp:// on free ports (each fresh group a rendezvous of its own); rank 0's times.
// hosts: "one", "apart" (a host per rank) or "pairs" (ranks 2h and 2h + 1 on host h).
std::vector<double> creation_times_processes(bool in_context, int n, const char *hosts = "one", int world = kWorld) {
    const int port = free_ports(in_context ? 1 : n);
    char path[] = "/tmp/sx-bench-context-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd >= 0) ::close(fd);
    const bool ok = port != 0 && fd >= 0 && run_self(world, [&](int r) {
        return std::vector<std::string>{"--context-rank", in_context ? "context" : "fresh", std::to_string(port),
                                        std::to_string(r), std::to_string(n), path, hosts, std::to_string(world)};
    });
    std::vector<double> times;
    std::ifstream f(path);
    for (double t; ok && f >> t;) times.push_back(t);
    ::unlink(path);
    return times;
}

void print_create(const char *how, const std::vector<double> &fresh, const std::vector<double> &in_ctx,
                  int world = kWorld) {
    if (fresh.empty() || in_ctx.empty()) {
        std::printf("%-28s failed\n", how);
        return;
    }
    const double fresh_ms = median(fresh) * 1e3, ctx_ms = median(in_ctx) * 1e3, last_ms = in_ctx.back() * 1e3;
    std::printf("%-28s %12.3f %12.3f %14.3f %8.1f\n", how, fresh_ms, ctx_ms, last_ms, fresh_ms / ctx_ms);
    std::printf("{\"bench\":\"context\",\"figure\":\"create\",\"ranks\":\"%s\",\"world\":%d,\"fresh_ms\":%.4f,"
                "\"context_ms\":%.4f,\"context_last_ms\":%.4f,\"groups\":%zu,\"ratio\":%.3f}\n",
                how, world, fresh_ms, ctx_ms, last_ms, in_ctx.size(), fresh_ms / ctx_ms);
}

}  // namespace

// One rank of creation_times_processes: argv = --context-rank MODE PORT RANK N FILE HOSTS WORLD.
int context_rank_main(int argc, char **argv) {
    if (argc != 9) return 2;
    const bool in_context = std::string(argv[2]) == "context";
    const int port = std::atoi(argv[3]), rank = std::atoi(argv[4]), n = std::atoi(argv[5]), world = std::atoi(argv[8]);
    const std::string hosts = argv[7];
    if (hosts == "apart") ::setenv("SX_HOST_ID", ("bench-host-" + std::to_string(rank)).c_str(), 1);
    if (hosts == "pairs") ::setenv("SX_HOST_ID", ("bench-host-" + std::to_string(rank / 2)).c_str(), 1);
    const std::string url = "tcp://127.0.0.1:";
    sx_context_t *ctx = in_context ? make_context(url + std::to_string(port), rank, world) : nullptr;
    if (in_context && !ctx) return 3;
    std::vector<double> times;
    for (int i = 0; i < n; ++i) {
        const double t0 = now_seconds();
        sx_shard_group_t *g = make_group(ctx, url + std::to_string(port + i), "g", rank, 4096, world);
        if (!g) return 3;
        times.push_back(now_seconds() - t0);
        sx_destroy_shard_group(g);
    }
    sx_destroy_context(ctx);
    if (rank != 0) return 0;
    std::ofstream f(argv[6]);
    for (double t : times) f << t << "\n";
    return f.good() ? 0 : 3;
}

int section_context(const Options &opt) {
    const int n = 100;
    std::printf("context: %d ranks (two hosts of two: 4); groups made in one context vs groups of their own\n",
                kWorld);
    std::printf("%-28s %12s %12s %14s %8s\n", "create (median)", "fresh_ms", "context_ms", "last_ms", "ratio");
    print_create("threads over local://", creation_times(false, 20), creation_times(true, n));
    print_create("processes over tcp://", creation_times_processes(false, 20), creation_times_processes(true, n));
    print_create("tcp://, hosts apart", creation_times_processes(false, 20, "apart"),
                 creation_times_processes(true, n, "apart"));
    print_create("tcp://, two hosts of two", creation_times_processes(false, 20, "pairs", 4),
                 creation_times_processes(true, n, "pairs", 4), 4);
    const int tenants = 8, steps = 20;
    std::vector<double> own, shared;
    for (int r = 0; r < std::max(3, opt.reps / 5); ++r) {
        own.push_back(tenant_rate(false, tenants, steps, 64 << 10));
        shared.push_back(tenant_rate(true, tenants, steps, 64 << 10));
    }
    const double own_rate = median(own), shared_rate = median(shared);
    std::printf("%-28s %12s %12s %14s %8s\n", "figure", "own_steps/s", "context", "", "ratio");
    std::printf("%-28s %12.1f %12.1f %14s %8.3f\n", "8 tenants stepping at once", own_rate, shared_rate, "",
                shared_rate / own_rate);
    std::printf("{\"bench\":\"context\",\"figure\":\"tenants\",\"world\":%d,\"tenants\":%d,\"elements\":%d,"
                "\"own_steps_per_s\":%.2f,\"context_steps_per_s\":%.2f,\"ratio\":%.3f}\n",
                kWorld, tenants, 64 << 10, own_rate, shared_rate, shared_rate / own_rate);
    return 0;
}

}  // namespace sxbench
