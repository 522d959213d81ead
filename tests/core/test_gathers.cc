// The gathers part on its own (core/gathers.h), 2 ranks as threads over local:// (Gloo):
// stage 3's gathers fill a unit's whole params from every rank's shard, a release copies
// this rank's shard back (what the trainer wrote is kept), nested gathers need as many
// releases, the prefetch follows the last step's order of gathers (and its depth), and
// ranks that gather different units, or a rank that gathers (or prefetches) while the
// other is in another call, are told at once with nothing changed; stages 1-2's deferred
// gathers run in the order given, in place.
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/gathers.h"
#include "optim/thread_pool.h"
#include "gloo_rank.h"
#include "run_ranks.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

using sx::Status;
using sx::core::Gathers;

namespace {

constexpr int kRanks = 2;
constexpr uint64_t kShard = 5;  // floats per rank and unit
constexpr int kUnits = 3;

// One rank's gathers over `url` ("<url>/g" for the gather communicator), with kUnits units
// of kShard floats per rank: own[u][i] = 100 r + 10 u + i (stage 3), or whole[u] with this
// rank's shard set so (stages 1-2).
struct Rank {
    int r = 0;
    std::unique_ptr<sx::optim::ThreadPool> pool{new sx::optim::ThreadPool(1)};
    std::unique_ptr<sx::core::DeviceOps> ops = sx::core::make_host_ops(pool.get());
    sx::core::CallHeaders headers{0, nullptr, [](Status s) { return s; }};
    std::vector<std::vector<float>> own, whole;
    std::unique_ptr<Gathers> g;
    int failures = 0;

    Rank(const std::string &url, int rank, int stage, int prefetch) : r(rank), headers(rank, nullptr, [this](Status s) {
        ++failures;
        return s;
    }) {
        own.assign(kUnits, std::vector<float>(kShard));
        whole.assign(kUnits, std::vector<float>(kShard * kRanks, -1.0f));
        for (int u = 0; u < kUnits; ++u)
            for (uint64_t i = 0; i < kShard; ++i) {
                own[u][i] = static_cast<float>(100 * r + 10 * u + i);
                whole[u][r * kShard + i] = own[u][i];
            }
        Gathers::Settings s;
        s.stage = stage;
        s.shard_rank = r;
        s.shard_size = kRanks;
        s.prefetch_depth = prefetch;
        g.reset(new Gathers(s, *ops, nullptr, headers, [this](Status f) {
            ++failures;
            return f;
        }, [] { return true; }, [url, rank](std::unique_ptr<sx::comm::Communicator> *out) {
            return sxtest::connect_gloo(url, rank, kRanks, out);
        }));
        for (int u = 0; u < kUnits; ++u)
            g->add_unit({u, kShard, kShard * kRanks, sizeof(float), stage == 3 ? nullptr : whole[u].data(),
                         stage == 3 ? own[u].data() : nullptr});
    }
    // The whole params of unit u as gathered (stage 3), or its flat buffer.
    const float *values(int u) const {
        return g->whole(static_cast<size_t>(u)) ? static_cast<const float *>(g->whole(static_cast<size_t>(u)))
                                                : whole[u].data();
    }
    // Every rank's shard of unit u is there, as each rank's own holds it.
    bool complete(int u, float delta_rank1 = 0.0f) const {
        const float *v = values(u);
        for (int k = 0; k < kRanks; ++k)
            for (uint64_t i = 0; i < kShard; ++i)
                if (v[k * kShard + i] != static_cast<float>(100 * k + 10 * u + i) + (k == 1 ? delta_rank1 : 0.0f))
                    return false;
        return true;
    }
};

std::string stage3(const std::string &url, int r) {
    Rank k(url, r, 3, 1);
    if (!k.g->open().ok()) return "open";
    // A gather: every rank's shard; nested, it needs two releases.
    if (!k.g->gather(0).ok() || !k.complete(0)) return "gather 0";
    if (!k.g->gather(0).ok() || k.g->pins(0) != 2) return "nested gather";
    // The trainer writes into its shard of the whole params; the last release keeps it.
    float *w = static_cast<float *>(k.g->whole(0));
    for (uint64_t i = 0; i < kShard; ++i) w[r * kShard + i] += 1.0f;
    if (!k.g->release(0).ok() || k.g->pins(0) != 1) return "first release";
    if (!k.g->release(0).ok() || k.g->pins(0) != 0) return "second release";
    if (k.g->release(0).code() != SX_ERR_INVALID_STATE) return "a release without a gather";
    if (!k.g->drain().ok()) return "drain";
    for (uint64_t i = 0; i < kShard; ++i)
        if (k.own[0][i] != static_cast<float>(100 * r + i) + 1.0f) return "the release did not copy the shard back";
    for (uint64_t i = 0; i < kShard; ++i) k.own[0][i] -= 1.0f;
    if (!k.g->end_step().ok()) return "the first step's end";
    // A step's order of gathers (2, 0, 1) is the next step's prefetch order: after the
    // step's end the first (2) is gathered ahead; gathering it prefetches the next (0).
    for (int u : {2, 0, 1}) {
        if (!k.g->gather(static_cast<size_t>(u)).ok() || !k.complete(u)) return "gather in order";
        if (!k.g->release(static_cast<size_t>(u)).ok()) return "release in order";
    }
    if (!k.g->end_step().ok() || !k.g->drain().ok()) return "end_step";
    if (!k.g->whole(2) || k.g->whole(0) || k.g->whole(1)) return "the step's end did not prefetch unit 2 alone";
    if (!k.g->gather(2).ok() || !k.g->drain().ok() || !k.g->whole(0) || k.g->whole(1))
        return "gathering unit 2 did not prefetch unit 0 alone";
    if (!k.g->release(2).ok()) return "release 2";
    // A rank whose gather is of a prefetched unit exchanges nothing, but the prefetch it
    // starts is headed: its peer, in another call, is told at once, and so is it at its
    // next call; nothing else changes (unit 0 stays held).
    Status s = r == 0 ? k.g->meet("sx_step") : k.g->gather(0);
    if (r == 0 && (s.code() != SX_ERR_MISMATCH ||
                   s.message().find("the call: sx_step on rank 0, sx_unit_gather on rank 1") == std::string::npos))
        return "a step against a prefetch: " + s.message();
    if (r == 1) {
        if (!s.ok() || k.g->pins(0) != 1) return "the gather of a prefetched unit";
        s = k.g->meet("sx_step");
        if (s.code() != SX_ERR_MISMATCH) return "the next call after a disagreeing prefetch: " + s.message();
        if (!k.g->release(0).ok()) return "release 0";
    }
    if (!k.g->drain().ok() || k.failures != 0) return "the disagreement failed the group";
    // The ranks go on together.
    for (int u : {2, 0, 1})
        if (!k.g->gather(static_cast<size_t>(u)).ok() || !k.complete(u) || !k.g->release(static_cast<size_t>(u)).ok())
            return "gathers after the disagreement";
    return k.g->end_step().ok() && k.g->drain().ok() ? "" : "end_step after";
}

// Without prefetch every gather communicates: ranks that gather different units, or a
// rank that gathers while the other is in another call, are all told at once, and the
// unit is not held.
std::string disagreements(const std::string &url, int r) {
    Rank k(url, r, 3, 0);
    if (!k.g->open().ok()) return "open";
    Status s = k.g->gather(r == 0 ? 1 : 2);
    if (s.code() != SX_ERR_MISMATCH ||
        s.message().find("the unit gathered: 1 on rank 0, 2 on rank 1") == std::string::npos)
        return "different units: " + s.message();
    s = r == 0 ? k.g->gather(1) : k.g->meet("sx_step");
    if (s.code() != SX_ERR_MISMATCH ||
        s.message().find("the call: sx_unit_gather on rank 0, sx_step on rank 1") == std::string::npos)
        return "a gather against a step: " + s.message();
    if (k.g->pins(1) != 0 || k.g->pins(2) != 0 || k.g->whole(1) || k.g->whole(2))
        return "a refused gather left its unit held";
    // Both go on: the same gather works, and nothing failed the group.
    if (!k.g->gather(1).ok() || !k.complete(1) || !k.g->release(1).ok()) return "the agreed gather after";
    if (!k.g->meet("sx_step").ok()) return "an agreed meet";
    if (k.failures != 0) return "a disagreement failed the group";
    return "";
}

std::string deferred(const std::string &url, int r) {
    Rank k(url, r, 2, 1);
    if (!k.g->deferred({2, 0, 1}, -1).ok() || !k.g->drain().ok()) return "deferred";
    if (k.g->deferred_order() != std::vector<int32_t>({2, 0, 1})) return "the deferred order";
    for (int u = 0; u < kUnits; ++u)
        if (!k.complete(u)) return "unit " + std::to_string(u) + " was not gathered in place";
    // A unit already submitted is not gathered twice (each rank submits it itself).
    if (!k.g->submit(1).ok() || !k.g->deferred({1, 2}, 1).ok() || !k.g->wait(1).ok() || !k.g->drain().ok())
        return "deferred with one submitted";
    return k.failures ? "failures" : "";
}

void test_stage3(void **) {
    const std::string url = "local://gathers3-" + std::to_string(getpid());
    const std::string err = sxtest::run_ranks(kRanks, [&](int r) { return stage3(url, r); });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

void test_stage3_disagreements(void **) {
    const std::string url = "local://gathers3d-" + std::to_string(getpid());
    const std::string err = sxtest::run_ranks(kRanks, [&](int r) { return disagreements(url, r); });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

void test_deferred(void **) {
    const std::string url = "local://gathers2-" + std::to_string(getpid());
    const std::string err = sxtest::run_ranks(kRanks, [&](int r) { return deferred(url, r); });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stage3),
        cmocka_unit_test(test_stage3_disagreements),
        cmocka_unit_test(test_deferred),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
