// bench_sx section comm: sx's Gloo communicator against the same traffic done with Gloo directly,
// measured in the same run (docs/conventions.md, "Tests and measurements").
//
// Two ranks are threads of this process; each holds an sx communicator (local://
// rendezvous) and a plain Gloo context (Gloo's in-process HashStore), both on
// 127.0.0.1. Figures, each the median over iterations of the slower rank's time,
// with sx and Gloo iterations interleaved so that both see the same noise:
//   rs+ag  sx reduce_scatter_sum + all_gather of N MiB   vs  gloo::allreduce (ring)
//          of the same N MiB, which is a reduce-scatter and an all-gather inside
//   ag     sx all_gather of N MiB                         vs  gloo::allgather
// Each three times: "tcp", every collective of sx through Gloo's TCP pairs, as between
// processes; "in-process", sx's default for threads of one process, where all_gather
// copies straight from the peers' buffers (GlooOptions::in_process); "channel", a
// channel on a context's Gloo mesh (a context's group across hosts), whose calls send
// from and receive into copies of their own.
// The ceiling is 1.10: sx may cost at most 10% more than Gloo doing the same work.
//
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "comm/communicator.h"
#include "comm/gloo/channels.h"
#include "rdzv/rendezvous.h"
#include "rdzv/store.h"

namespace sxbench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRanks = 2;
constexpr double kCeiling = 1.10;

struct Figure {
    const char *name;
    double ceiling;                      // 0: none (the channel's copies are the price of its isolation)
    std::vector<double> sx_ms, gloo_ms;  // per iteration, slower rank
};

void die(const std::string &what) {
    std::fprintf(stderr, "bench_sx comm: %s\n", what.c_str());
    std::exit(1);
}

}  // namespace

int section_comm(const Options &opt) {
    const size_t mib = opt.comm_mib;
    const int iters = opt.reps;
    const size_t bytes = mib << 20;
    const size_t floats = bytes / sizeof(float);
    const size_t shard = floats / kRanks;

    constexpr int kComms = 3;
    Figure figs[2 * kComms] = {{"rs+ag tcp", kCeiling, {}, {}},     {"ag tcp", kCeiling, {}, {}},
                               {"rs+ag in-process", kCeiling, {}, {}}, {"ag in-process", kCeiling, {}, {}},
                               {"rs+ag channel", 0, {}, {}},          {"ag channel", 0, {}, {}}};
    std::vector<double> rank_ms(kRanks);
    Barrier barrier(kRanks);
    auto hash_store = std::make_shared<gloo::rendezvous::HashStore>();
    const std::string url = "local://bench-comm-" + std::to_string(::getpid());

    auto rank_main = [&](int r) {
        sx::comm::GlooOptions opts;
        opts.bind_address = "127.0.0.1";
        opts.timeout = std::chrono::milliseconds(120000);
        // kind 0: a Gloo communicator of its own; 1: the same in-process; 2: a channel on a context.
        std::shared_ptr<sx::comm::GlooChannels> context;
        auto connect = [&](const std::string &where, int kind) {
            sx::rdzv::Rendezvous rv;
            std::shared_ptr<sx::rdzv::Store> store;
            std::unique_ptr<sx::comm::Communicator> c;
            opts.in_process = kind == 1;
            sx::Status s = sx::rdzv::parse_rendezvous(where.c_str(), r, kRanks, &rv);
            if (s.ok()) s = sx::rdzv::open_store(rv, opts.timeout, &store);
            if (s.ok() && kind < 2) s = sx::comm::create_gloo_communicator(store, r, kRanks, opts, &c);
            if (s.ok() && kind == 2)
                s = sx::comm::open_gloo_channels(sx::rdzv::make_prefix_store(store, "context/"), r, kRanks, opts,
                                                 &context);
            if (s.ok() && kind == 2)
                s = sx::comm::create_gloo_channel(context, sx::rdzv::make_prefix_store(store, "channel/"), r, kRanks,
                                                  opts, &c);
            if (!s.ok()) die(s.message());
            return c;
        };
        std::unique_ptr<sx::comm::Communicator> comms[kComms] = {connect(url + "-tcp", 0), connect(url, 1),
                                                                 connect(url + "-channel", 2)};

        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto device = gloo::transport::tcp::CreateDevice(attr);
        auto g = std::make_shared<gloo::rendezvous::Context>(r, kRanks);
        g->setTimeout(opts.timeout);
        g->connectFullMesh(*hash_store, device);

        std::vector<float> buf(floats, 1.0f), out(shard);
        std::vector<char> gather(bytes, static_cast<char>(r));
        uint32_t tag = 0;

        // Times fn on every rank; figure gets the slower rank's milliseconds.
        auto timed = [&](std::vector<double> &into, const std::function<void()> &fn) {
            barrier.wait();
            auto t0 = Clock::now();
            fn();
            rank_ms[static_cast<size_t>(r)] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
            barrier.wait();
            if (r == 0) into.push_back(*std::max_element(rank_ms.begin(), rank_ms.end()));
        };
        auto check = [](const sx::Status &st) {
            if (!st.ok()) die(st.message());
        };

        sx::comm::Communicator *c = nullptr;  // the one being measured
        auto sx_rs_ag = [&] {
            check(c->reduce_scatter_sum(buf.data(), shard, out.data(), false));
            check(c->all_gather(buf.data(), shard * sizeof(float)));
        };
        auto gloo_allreduce = [&] {
            gloo::AllreduceOptions o(g);
            o.setOutput(buf.data(), floats);
            o.setReduceFunction(static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
            o.setTag(++tag);
            gloo::allreduce(o);
        };
        auto sx_ag = [&] { check(c->all_gather(gather.data(), bytes / kRanks)); };
        auto gloo_ag = [&] {
            gloo::AllgatherOptions o(g);
            o.setOutput(gather.data(), bytes);
            o.setTag(++tag);
            gloo::allgather(o);
        };
        // Iteration 0 warms up and is dropped; odd iterations run Gloo first, so that
        // neither side always finds the other's data in cache.
        for (int it = 0; it <= iters; ++it) {
            std::vector<double> dropped;
            const bool keep = it > 0, gloo_first = it % 2 == 1;
            for (int k = 0; k < kComms; ++k) {
                c = comms[k].get();
                Figure &rs_ag = figs[2 * k], &ag = figs[2 * k + 1];
                for (int side = 0; side < 2; ++side) {
                    if ((side == 0) == gloo_first) {
                        timed(keep ? rs_ag.gloo_ms : dropped, gloo_allreduce);
                    } else {
                        timed(keep ? rs_ag.sx_ms : dropped, sx_rs_ag);
                    }
                    std::fill(buf.begin(), buf.end(), 1.0f);  // keep the sums finite
                }
                for (int side = 0; side < 2; ++side) {
                    if ((side == 0) == gloo_first) {
                        timed(keep ? ag.gloo_ms : dropped, gloo_ag);
                    } else {
                        timed(keep ? ag.sx_ms : dropped, sx_ag);
                    }
                }
            }
        }
    };

    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) threads.emplace_back(rank_main, r);
    for (std::thread &t : threads) t.join();

    std::printf("comm: %d ranks (threads, 127.0.0.1), %zu MiB per collective, median of %d interleaved "
                "iterations of the slower rank; ratio = sx time / Gloo time (goal <= %.2f but for a channel)\n",
                kRanks, mib, iters, kCeiling);
    std::printf("%-17s %8s %10s %10s %8s %8s\n", "figure", "MiB", "sx ms", "gloo ms", "ratio", "ceiling");
    for (const Figure &f : figs) {
        const double sx = median(f.sx_ms), gl = median(f.gloo_ms);
        if (f.ceiling > 0)
            std::printf("%-17s %8zu %10.2f %10.2f %8.3f %8.2f\n", f.name, mib, sx, gl, sx / gl, f.ceiling);
        else
            std::printf("%-17s %8zu %10.2f %10.2f %8.3f %8s\n", f.name, mib, sx, gl, sx / gl, "-");
    }
    for (const Figure &f : figs) {
        const double sx = median(f.sx_ms), gl = median(f.gloo_ms);
        std::printf("{\"bench\":\"comm\",\"figure\":\"%s\",\"ranks\":%d,\"mib\":%zu,\"iterations\":%d,"
                    "\"sx_ms\":%.3f,\"gloo_ms\":%.3f,\"ratio\":%.4f,\"ceiling\":%.2f}\n",
                    f.name, kRanks, mib, iters, sx, gl, sx / gl, f.ceiling);
    }
    return 0;
}

}  // namespace sxbench
