// bench_sx section shm_step: the whole sx_step of one AdamW param of --elements (default
// 64 Mi) fp32 elements, ranks as processes on this host over tcp:// (2 and 4), one
// thread each, through three transports started in turn, round after round:
//   in place  shared memory, the flat buffers in the processes' shared arenas (default)
//   slots     shared memory, every buffer copied through the segment's slots
//             (SX_SHARED_ARENA=0: how steps ran before the arenas)
//   tcp       Gloo over TCP (SX_SHARED_MEMORY=0)
// Each run times --reps steps (keep_grads, so every step moves the same gradients) after
// one untimed step; a figure is the median over rounds of the slower rank's median step.
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
#include "sx/sx.h"

namespace sxbench {

// One rank: bench_sx --shm-step-rank R WORLD PORT REPS ELEMENTS OUTFILE
int shm_step_rank_main(int argc, char **argv) {
    if (argc != 8) return 2;
    const int r = std::atoi(argv[2]), world = std::atoi(argv[3]), port = std::atoi(argv[4]);
    const int reps = std::atoi(argv[5]);
    const size_t n = std::strtoull(argv[6], nullptr, 10);
    const std::string url = "tcp://127.0.0.1:" + std::to_string(port);
    sx_shard_group_t *g = make_group(url, r, world, 1, n, true);
    sx_step_options_t so;
    sx_step_options_init(&so, sizeof so);
    so.keep_grads = 1;
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
        const double t0 = now_seconds();
        check(sx_step(g, &so, nullptr), "sx_step");
        ms.push_back((now_seconds() - t0) * 1e3);
    }
    sx_destroy_shard_group(g);
    std::ofstream f(std::string(argv[7]) + "." + std::to_string(r));
    f << median(ms) << "\n";
    return f ? 0 : 1;
}

namespace {

struct Variant {
    const char *name;
    const char *env;  // set to "0" for the run (null: none)
};
const Variant kVariants[] = {{"in_place", nullptr}, {"slots", "SX_SHARED_ARENA"}, {"tcp", "SX_SHARED_MEMORY"}};

// The slower rank's median step, in ms, of one run of `world` processes; < 0 if it failed.
double run_once(int world, int reps, size_t n, const Variant &v) {
    char tmpl[] = "/tmp/sx-bench-shm-step-XXXXXX";
    if (!mkdtemp(tmpl)) return -1;
    const std::string result = std::string(tmpl) + "/result";
    const int port = free_ports(1);
    if (v.env) ::setenv(v.env, "0", 1);
    const bool ok = port != 0 && run_self(world, [&](int r) {
                        return std::vector<std::string>{"--shm-step-rank", std::to_string(r), std::to_string(world),
                                                        std::to_string(port), std::to_string(reps), std::to_string(n),
                                                        result};
                    });
    if (v.env) ::unsetenv(v.env);
    double slowest = ok ? 0 : -1;
    for (int r = 0; r < world; ++r) {
        const std::string path = result + "." + std::to_string(r);
        std::ifstream in(path);
        double ms = -1;
        if (!(in >> ms)) slowest = -1;
        if (slowest >= 0) slowest = std::max(slowest, ms);
        std::remove(path.c_str());
    }
    rmdir(tmpl);
    return slowest;
}

}  // namespace

int section_shm_step(const Options &opt) {
    const size_t n = opt.elements ? opt.elements : size_t(64) << 20;
    const int rounds = 3;
    std::printf("shm_step: sx_step of %zu fp32 AdamW elements, ranks as processes over tcp:// (one thread each), "
                "through shared memory reading the peers' buffers in place, through the segment's slots "
                "(SX_SHARED_ARENA=0) and through TCP (SX_SHARED_MEMORY=0), runs in turn; median over %d rounds of "
                "the slower rank's median of %d steps\n",
                n, rounds, opt.reps);
    std::printf("%6s %12s %10s %10s %14s %12s\n", "ranks", "in_place_ms", "slots_ms", "tcp_ms", "in_place/slots",
                "in_place/tcp");
    std::vector<std::string> json;
    for (int world : {2, 4}) {
        std::vector<double> got[3];
        for (int round = 0; round < rounds; ++round)
            for (int k = 0; k < 3; ++k) {
                const Variant &v = kVariants[(k + round) % 3];  // each goes first in turn
                const double ms = run_once(world, opt.reps, n, v);
                if (ms < 0) {
                    std::printf("%6d (the %s ranks failed)\n", world, v.name);
                    return 1;
                }
                got[(k + round) % 3].push_back(ms);
            }
        const double in_place = median(got[0]), slots = median(got[1]), tcp = median(got[2]);
        std::printf("%6d %12.1f %10.1f %10.1f %14.3f %12.3f\n", world, in_place, slots, tcp, in_place / slots,
                    in_place / tcp);
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"shm_step\",\"ranks\":%d,\"elements\":%zu,\"reps\":%d,\"in_place_ms\":%.3f,"
                      "\"slots_ms\":%.3f,\"tcp_ms\":%.3f,\"in_place_vs_slots\":%.3f,\"in_place_vs_tcp\":%.3f}",
                      world, n, opt.reps, in_place, slots, tcp, in_place / slots, in_place / tcp);
        json.push_back(line);
    }
    for (const std::string &j : json) std::printf("%s\n", j.c_str());
    return 0;
}

}  // namespace sxbench
