// bench_sx section small_step: what a step costs where there is almost nothing to reduce
// or update, so that the ranks' own exchanges (each call's header, the round's end) are
// what is timed. Two ranks as threads over local:// (Gloo over loopback TCP), SGD on
// three units of 256 fp32 each; per kind of step, every rank takes 100 untimed steps
// and then `reps` x 100 timed ones, and the median over repetitions of rank 0's time per
// step is reported. Kinds: a plain sx_step; the units signalled ready one by one
// (sx_unit_grads_ready) before sx_step; a micro-batch folded by sx_accumulate_grads
// before the step; stage 3, each unit gathered and released for a forward and again for
// a backward before the step, without prefetch (every gather communicates) and with
// the default prefetch of one unit. Its ceiling is one small all_gather of Gloo, timed the same way on a
// communicator of the same ranks: the ratio step / all_gather is how many such round
// trips a step costs. Beside it, the collectives each rank starts per step (every
// communicator's, counted: deterministic, where the times are not).
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "comm/communicator.h"
#include "rdzv/rendezvous.h"
#include "rdzv/stores.h"

namespace sxbench {
namespace {

constexpr int kUnits = 3;
constexpr int64_t kUnitNumel = 256;
constexpr int kSteps = 100;  // per repetition

enum Kind { kPlain, kSignalled, kAccumulated, kStage3, kStage3Prefetch, kKinds };
const char *const kKindNames[kKinds] = {"sx_step", "signalled+step", "accumulate+step", "stage3 no prefetch",
                                        "stage3 prefetch 1"};

// Stage 3: a forward and a backward of gathers and releases around the step.
bool gathers(sx_shard_group_t *g) {
    for (int u = 0; u < kUnits; ++u)
        if (sx_unit_gather(g, u) != SX_OK || sx_unit_release(g, u) != SX_OK) return false;
    for (int u = kUnits - 1; u >= 0; --u)
        if (sx_unit_gather(g, u) != SX_OK || sx_unit_release(g, u) != SX_OK) return false;
    return true;
}

bool one_step(sx_shard_group_t *g, Kind kind) {
    if (kind == kAccumulated && sx_accumulate_grads(g) != SX_OK) return false;
    if ((kind == kStage3 || kind == kStage3Prefetch) && !gathers(g)) return false;
    if (kind == kSignalled)
        for (int u = kUnits - 1; u >= 0; --u)
            if (sx_unit_grads_ready(g, u, nullptr) != SX_OK) return false;
    return sx_step(g, nullptr, nullptr) == SX_OK;
}

// Seconds per step of each repetition, on each rank (rank 0's kept), and the collectives
// each rank started per step (on every communicator of the group, counted over the timed
// steps of both ranks, halved).
bool time_steps(Kind kind, int reps, std::vector<double> *per_step, double *exchanges) {
    const std::string url = std::string("local://bench-small-step-") + kKindNames[kind];
    Barrier barrier(2);
    std::vector<double> times[2];
    bool ok[2] = {false, false};
    uint64_t started = 0, ended = 0;
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
        ranks.emplace_back([&, r] {
            const int stage = kind == kStage3 || kind == kStage3Prefetch ? 3 : 0;
            const int prefetch = kind == kStage3 ? SX_PREFETCH_NONE : 0;
            sx_shard_group_t *g = make_sgd_group("small_step", url, r, 2, stage, prefetch, 0, kUnits, kUnitNumel);
            bool good = true;  // make_sgd_group exits on an error
            for (int s = 0; s < kSteps && good; ++s) good = one_step(g, kind);
            barrier.wait();
            if (r == 0) started = sx::comm::collectives_started();
            for (int rep = 0; rep < reps && good; ++rep) {
                barrier.wait();
                const double t0 = now_seconds();
                for (int s = 0; s < kSteps && good; ++s) good = one_step(g, kind);
                times[r].push_back((now_seconds() - t0) / kSteps);
            }
            barrier.wait();
            if (r == 0) ended = sx::comm::collectives_started();
            if (!good) std::fprintf(stderr, "small_step rank %d: %s\n", r, sx_last_error_message());
            ok[r] = good;
            sx_destroy_shard_group(g);
        });
    for (std::thread &t : ranks) t.join();
    *per_step = times[0];
    *exchanges = static_cast<double>(ended - started) / (2.0 * kSteps * reps);
    return ok[0] && ok[1];
}

// Seconds per all_gather of five words (a header's size) on a Gloo communicator of two
// ranks over local://.
bool time_all_gather(int reps, std::vector<double> *per_call) {
    Barrier barrier(2);
    std::vector<double> times[2];
    bool ok[2] = {false, false};
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
        ranks.emplace_back([&, r] {
            sx::rdzv::Rendezvous rv;
            std::shared_ptr<sx::rdzv::Store> store;
            std::unique_ptr<sx::comm::Communicator> c;
            bool good = sx::rdzv::parse_rendezvous("local://bench-small-step-gloo", r, 2, &rv).ok() &&
                        sx::rdzv::open_store(rv, sx::Millis(60000), &store).ok();
            sx::comm::GlooOptions o;
            o.bind_address = "127.0.0.1";
            good = good && sx::comm::create_gloo_communicator(store, r, 2, o, &c).ok();
            uint64_t words[10] = {};
            for (int s = 0; s < kSteps && good; ++s) good = c->all_gather(words, 5 * sizeof(uint64_t)).ok();
            for (int rep = 0; rep < reps && good; ++rep) {
                barrier.wait();
                const double t0 = now_seconds();
                for (int s = 0; s < kSteps && good; ++s) good = c->all_gather(words, 5 * sizeof(uint64_t)).ok();
                times[r].push_back((now_seconds() - t0) / kSteps);
            }
            ok[r] = good;
        });
    for (std::thread &t : ranks) t.join();
    *per_call = times[0];
    return ok[0] && ok[1];
}

}  // namespace

int section_small_step(const Options &opt) {
    std::printf("small_step: 2 ranks (threads, local://), SGD on %d units of %lld fp32; %d reps of %d steps; "
                "median over reps of rank 0's time per step, and per step / one all_gather of a header's 5 words\n",
                kUnits, static_cast<long long>(kUnitNumel), opt.reps, kSteps);
    std::vector<double> gather;
    if (!time_all_gather(opt.reps, &gather)) {
        std::fprintf(stderr, "small_step: the all_gather ceiling failed\n");
        return 1;
    }
    const double g = median(gather);
    std::printf("%-20s %10s %12s %15s\n", "step", "us/step", "x all_gather", "exchanges/step");
    std::printf("%-20s %10.1f %12.2f %15s\n", "all_gather (5w)", g * 1e6, 1.0, "1");
    std::vector<std::string> json;
    for (int k = 0; k < kKinds; ++k) {
        std::vector<double> t;
        double exchanges = 0.0;
        if (!time_steps(static_cast<Kind>(k), opt.reps, &t, &exchanges)) return 1;
        const double m = median(t);
        std::printf("%-20s %10.1f %12.2f %15.2f\n", kKindNames[k], m * 1e6, m / g, exchanges);
        char line[320];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"small_step\",\"step\":\"%s\",\"reps\":%d,\"us_per_step\":%.2f,"
                      "\"all_gather_us\":%.2f,\"ratio_vs_all_gather\":%.3f,\"exchanges_per_step\":%.2f}",
                      kKindNames[k], opt.reps, m * 1e6, g * 1e6, m / g, exchanges);
        json.push_back(line);
    }
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    return 0;
}

}  // namespace sxbench
