// bench_sx section shm: ranks as processes on this host (2 and 4), the shared-memory
// communicator against sx's Gloo (TCP) communicator and against the floor of shared
// memory, all in the same processes, iterations interleaved:
//   rs+ag   reduce_scatter_sum of --comm-mib MiB per rank, then all_gather of the result,
//           the buffer from the process's shared arena as a group's flat buffers are
//   floor   the same work with every rank's buffer in shared memory from the start:
//           each rank sums its slice of every rank's buffer into its own, a barrier, each
//           copies the others' summed slices, a barrier (no staging copies at all)
//   ar8     an 8-byte all_reduce_sum: median latency in microseconds
// Each timed figure is the median over iterations of the slower rank's time. Then the
// same between 2 ranks that are threads of this process (the floor's buffers plain
// memory; sx's Gloo communicator as it is for threads: its all-gather met in-process).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "base/memory.h"
#include "comm/communicator.h"
#include "rdzv/rendezvous.h"
#include "comm/shm/segment.h"
#include "rdzv/stores.h"

namespace sxbench {
namespace {

void die(const std::string &what) {
    std::fprintf(stderr, "bench_sx shm: %s\n", what.c_str());
    std::exit(1);
}

void check(const sx::Status &s) {
    if (!s.ok()) die(s.message());
}

}  // namespace

namespace {

struct Times {
    double floor = 0, shm = 0, gloo = 0, ar_shm = 0, ar_gloo = 0;
};

// One rank's figures (every rank returns the slower rank's, through the communicators):
// floor(q) is rank q's buffer of `bytes`, where every rank can read it.
Times measure(int r, int world, std::shared_ptr<sx::rdzv::Store> store, int reps, size_t bytes,
              const std::function<float *(int)> &floor_buf) {
    sx::comm::ShmOptions so;
    so.timeout = std::chrono::milliseconds(120000);
    if (const char *slot = std::getenv("SX_BENCH_SHM_SLOT_KIB")) so.slot_bytes = static_cast<size_t>(std::atoi(slot)) << 10;
    std::unique_ptr<sx::comm::Communicator> shm, gloo;
    check(sx::comm::create_shm_communicator(sx::rdzv::make_prefix_store(store, "shm/"), r, world, so, &shm));
    sx::comm::GlooOptions go;
    go.bind_address = "127.0.0.1";
    go.timeout = so.timeout;
    check(sx::comm::create_gloo_communicator(sx::rdzv::make_prefix_store(store, "gloo/"), r, world, go, &gloo));

    const size_t floats = bytes / sizeof(float), shard = floats / static_cast<size_t>(world);
    // As a group's flat buffers: from the process's shared arena, which peers read in place.
    sx::HostBuffer mem;
    check(mem.allocate(floats * sizeof(float), "the benchmark's buffer", sx::HostBuffer::kPopulate,
                       sx::HostBuffer::kExchanged));
    float *const buf = mem.as<float>();
    std::fill(buf, buf + floats, 1.0f);
    std::fill(floor_buf(r), floor_buf(r) + floats, 1.0f);
    auto rs_ag = [&](sx::comm::Communicator &c) {
        return [&] {
            // In place, as a step does: this rank's sums land in its own part of buf.
            check(c.reduce_scatter_sum(buf, shard, buf + static_cast<size_t>(r) * shard, false));
            check(c.all_gather(buf, shard * sizeof(float)));
        };
    };
    auto floor_op = [&] {
        float *own = floor_buf(r) + static_cast<size_t>(r) * shard;
        for (int q = 0; q < world; ++q) {
            if (q == r) continue;
            const float *theirs = floor_buf(q) + static_cast<size_t>(r) * shard;
            for (size_t i = 0; i < shard; ++i) own[i] += theirs[i];
        }
        check(shm->barrier());
        for (int q = 0; q < world; ++q)
            if (q != r)
                std::memcpy(floor_buf(r) + static_cast<size_t>(q) * shard, floor_buf(q) + static_cast<size_t>(q) * shard,
                            shard * sizeof(float));
        check(shm->barrier());
    };
    // The slower rank's milliseconds of fn, on every rank.
    auto timed = [&](const std::function<void()> &fn) {
        check(shm->barrier());
        const double t0 = now_seconds();
        fn();
        uint64_t us = static_cast<uint64_t>((now_seconds() - t0) * 1e6);
        check(shm->all_reduce_max(&us, 1));
        return static_cast<double>(us) / 1e3;
    };
    std::vector<double> t_floor, t_shm, t_gloo;
    const std::function<void()> ops[3] = {floor_op, rs_ag(*shm), rs_ag(*gloo)};
    std::vector<double> *into[3] = {&t_floor, &t_shm, &t_gloo};
    for (int it = 0; it <= reps; ++it)
        for (int k = 0; k < 3; ++k) {
            const int which = (k + it) % 3;  // each goes first in turn
            const double ms = timed(ops[which]);
            if (it > 0) into[which]->push_back(ms);
        }
    // 8-byte all-reduce latency: 190 of each, alternating, after 10 of each.
    std::vector<double> l_shm, l_gloo;
    for (int it = 0; it < 400; ++it) {
        double v = 1.0;
        sx::comm::Communicator &c = it % 2 ? *gloo : *shm;
        check(shm->barrier());
        const double t0 = now_seconds();
        check(c.all_reduce_sum(&v, 1));
        uint64_t us10 = static_cast<uint64_t>((now_seconds() - t0) * 1e7);
        check(shm->all_reduce_max(&us10, 1));
        if (it >= 20) (it % 2 ? l_gloo : l_shm).push_back(static_cast<double>(us10) / 10.0);
    }
    check(shm->barrier());
    return {median(t_floor), median(t_shm), median(t_gloo), median(l_shm), median(l_gloo)};
}

}  // namespace

// One rank: bench_sx --shm-rank R WORLD PORT REPS MIB OUTFILE
int shm_rank_main(int argc, char **argv) {
    if (argc != 8) return 2;
    const int r = std::atoi(argv[2]), world = std::atoi(argv[3]), port = std::atoi(argv[4]);
    const int reps = std::atoi(argv[5]);
    const size_t bytes = static_cast<size_t>(std::atoi(argv[6])) << 20;
    const std::string url = "tcp://127.0.0.1:" + std::to_string(port);
    sx::rdzv::Rendezvous rv;
    std::shared_ptr<sx::rdzv::Store> store;
    check(sx::rdzv::parse_rendezvous(url.c_str(), r, world, &rv));
    check(sx::rdzv::open_store(rv, std::chrono::milliseconds(60000), &store));
    // The floor's buffers: every rank's in one shared segment.
    std::unique_ptr<sx::comm::SharedSegment> mem;
    check(sx::comm::SharedSegment::open(*sx::rdzv::make_prefix_store(store, "floor/"), r, world,
                                        bytes * static_cast<size_t>(world),
                                        std::chrono::steady_clock::now() + std::chrono::seconds(60), &mem));
    const Times t = measure(r, world, store, reps, bytes,
                            [&](int q) { return reinterpret_cast<float *>(mem->data() + bytes * static_cast<size_t>(q)); });
    if (r == 0) {
        std::ofstream f(argv[7]);
        f << t.floor << " " << t.shm << " " << t.gloo << " " << t.ar_shm << " " << t.ar_gloo << "\n";
    }
    return 0;
}

int section_shm(const Options &opt) {
    const size_t mib = opt.comm_mib;
    std::printf("shm: ranks as processes on this host; reduce_scatter_sum + all_gather of %zu MiB per rank through the "
                "shared-memory communicator and through sx's Gloo (TCP) one, against the floor of shared memory "
                "(buffers shared from the start, no staging), median of %d of the slower rank, interleaved; and an "
                "8-byte all_reduce_sum's median latency\n",
                mib, opt.reps);
    std::printf("%6s %10s %10s %10s %10s %10s %10s %10s %9s\n", "ranks", "floor_ms", "shm_ms", "gloo_ms", "shm/floor",
                "gloo/floor", "ar8_shm_us", "ar8_gloo_us", "gloo/shm");
    std::vector<std::string> json;
    for (int world : {2, 4}) {
        char tmpl[] = "/tmp/sx-bench-shm-XXXXXX";
        if (!mkdtemp(tmpl)) return 1;
        const std::string result = std::string(tmpl) + "/result";
        const int port = free_ports(1);
        const bool ok = port != 0 && run_self(world, [&](int r) {
                            return std::vector<std::string>{"--shm-rank", std::to_string(r), std::to_string(world),
                                                            std::to_string(port), std::to_string(opt.reps),
                                                            std::to_string(mib), result};
                        });
        double fl = 0, sh = 0, gl = 0, ls = 0, lg = 0;
        std::ifstream in(result);
        if (!ok || !(in >> fl >> sh >> gl >> ls >> lg)) {
            std::printf("%6d (the ranks failed)\n", world);
            return 1;
        }
        std::remove(result.c_str());
        rmdir(tmpl);
        std::printf("%6d %10.2f %10.2f %10.2f %10.2f %10.2f %10.1f %10.1f %9.1f\n", world, fl, sh, gl, sh / fl, gl / fl, ls,
                    lg, lg / ls);
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"shm\",\"ranks\":%d,\"mib\":%zu,\"reps\":%d,\"floor_ms\":%.3f,\"shm_ms\":%.3f,"
                      "\"gloo_ms\":%.3f,\"shm_vs_floor\":%.3f,\"gloo_vs_floor\":%.3f,\"allreduce8_shm_us\":%.2f,"
                      "\"allreduce8_gloo_us\":%.2f,\"allreduce8_gloo_vs_shm\":%.2f}",
                      world, mib, opt.reps, fl, sh, gl, sh / fl, gl / fl, ls, lg, lg / ls);
        json.push_back(line);
    }
    // Ranks as threads of this process: the floor's buffers are plain memory.
    {
        const int world = 2;
        const size_t bytes = mib << 20;
        std::vector<std::vector<float>> bufs(world, std::vector<float>(bytes / sizeof(float)));
        std::vector<Times> got(world);
        const std::string url = "local://bench-shm-" + std::to_string(::getpid());
        std::vector<std::thread> threads;
        for (int r = 0; r < world; ++r)
            threads.emplace_back([&, r] {
                sx::rdzv::Rendezvous rv;
                std::shared_ptr<sx::rdzv::Store> store;
                check(sx::rdzv::parse_rendezvous(url.c_str(), r, world, &rv));
                check(sx::rdzv::open_store(rv, std::chrono::milliseconds(60000), &store));
                got[static_cast<size_t>(r)] = measure(r, world, store, opt.reps, bytes,
                                                      [&](int q) { return bufs[static_cast<size_t>(q)].data(); });
            });
        for (std::thread &t : threads) t.join();
        const Times &t = got[0];
        std::printf("%6s %10.2f %10.2f %10.2f %10.2f %10.2f %10.1f %10.1f %9.1f\n", "2 thr", t.floor, t.shm, t.gloo,
                    t.shm / t.floor, t.gloo / t.floor, t.ar_shm, t.ar_gloo, t.ar_gloo / t.ar_shm);
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"shm\",\"ranks\":2,\"threads\":true,\"mib\":%zu,\"reps\":%d,\"floor_ms\":%.3f,"
                      "\"shm_ms\":%.3f,\"gloo_ms\":%.3f,\"shm_vs_floor\":%.3f,\"gloo_vs_floor\":%.3f,"
                      "\"allreduce8_shm_us\":%.2f,\"allreduce8_gloo_us\":%.2f,\"allreduce8_gloo_vs_shm\":%.2f}",
                      mib, opt.reps, t.floor, t.shm, t.gloo, t.shm / t.floor, t.gloo / t.floor, t.ar_shm, t.ar_gloo,
                      t.ar_gloo / t.ar_shm);
        json.push_back(line);
    }
    for (const std::string &j : json) std::printf("%s\n", j.c_str());
    return 0;
}

}  // namespace sxbench
