// The reduction round part on its own (core/round.h), with a fake group (its Work) on one
// rank: a unit's reduction is queued once it and every unit before it in the agreed order
// are signalled, and runs on the channel in that order, its part of the norm after it;
// frozen units are not reduced, nor a stage-1 micro-batch's; the round's end reduces what
// was not signalled, sums the norm's parts and makes the order of signals the next
// rounds' order; a signal twice or with another accumulate flag is refused; a
// disagreement at the round's opening agreement is returned, and the next round runs.
#include <unistd.h>

#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "core/round.h"
#include "gloo_rank.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

using sx::Status;
using sx::core::Agreement;
using sx::core::ReductionRound;

namespace {

class FakeGroup : public ReductionRound::Work {
  public:
    std::mutex mu;
    std::vector<std::string> calls;  // in the order the channel made them
    std::vector<float> shards = std::vector<float>(4, 0.0f);
    bool disagree = false;

    void note(const std::string &c) {
        std::lock_guard<std::mutex> lock(mu);
        calls.push_back(c);
    }
    Status agree_round(const Agreement &a) override {
        note(std::string("agree ") + a.call);
        return disagree ? SX_ERROR(SX_ERR_MISMATCH, "ranks disagree: the call") : Status::Ok();
    }
    Status reduce_unit_grads(size_t u, bool accumulate, float **shard) override {
        note("reduce " + std::to_string(u) + (accumulate ? " acc" : ""));
        shards[u] = static_cast<float>(u + 1);
        *shard = &shards[u];
        return Status::Ok();
    }
    Status reduce_unit_replicas(size_t u, float *) override {
        note("replicas " + std::to_string(u));
        return Status::Ok();
    }
    Status unit_sum_of_squares(size_t u, float *shard, float scale, double *out) override {
        note("sumsq " + std::to_string(u));
        *out = static_cast<double>(*shard) * *shard * scale;
        return Status::Ok();
    }
    Status fail_group(Status s) override { return s; }
    bool usable() const override { return true; }
};

// The world of the round's end: one rank, over a Gloo communicator of its own.
struct OneRank {
    std::unique_ptr<sx::comm::Communicator> comm;
    sx::core::CallHeaders headers{0, nullptr, [](Status s) { return s; }};
    std::deque<sx::core::ParamSpec> params;
    ReductionRound::World world;
    explicit OneRank(const char *name) {
        const std::string url = std::string("local://round-") + name + "-" + std::to_string(getpid());
        assert_true(sxtest::connect_gloo(url, 0, 1, &comm).ok());
        world.comm = comm.get();
        world.headers = &headers;
        world.params = &params;
    }
};

Agreement agreement(const char *call) {
    Agreement a;
    a.call = call;
    return a;
}

void test_order_and_end(void **) {
    FakeGroup g;
    ReductionRound r(g, nullptr, 2, false);
    r.add_units({10, 11, 12, 13});
    assert_true(r.order() == std::vector<int32_t>({3, 2, 1, 0}));  // a backward's order first
    OneRank one("order");
    const ReductionRound::World &w = one.world;
    // Unit 1 is frozen. Signals 2, 3, 0: 2 waits for 3 (first in the order); unit 1 is
    // reduced (skipped) at the end.
    r.begin(false, {1, 0, 1, 1}, {1, 0, 1, 1}, agreement("sx_unit_grads_ready"), 0.5f);
    assert_true(r.open());
    r.signal(2);
    assert_int_equal(r.check_signal(2, false).code(), SX_ERR_INVALID_STATE);
    assert_int_equal(r.check_signal(0, true).code(), SX_ERR_INVALID_ARGUMENT);
    r.signal(3);
    r.signal(0);
    double sumsq = 0.0, weights = 0.0;
    bool dropped = true;
    assert_true(r.end(w, agreement("sx_step"), 2.0, &sumsq, &weights, &dropped).ok());
    assert_false(dropped || r.open());
    const std::vector<std::string> want = {"agree sx_unit_grads_ready", "reduce 3", "replicas 3", "sumsq 3",
                                           "reduce 2",  "replicas 2", "sumsq 2",  "reduce 0", "replicas 0", "sumsq 0"};
    if (g.calls != want) {
        std::string got;
        for (const std::string &c : g.calls) got += c + "; ";
        fail_msg("calls: %s", got.c_str());
    }
    // 0.5 x (4^2 + 3^2 + 1^2), the weight of the one rank.
    assert_true(sumsq == 13.0 && weights == 2.0);
    assert_true(r.reduced(2) == &g.shards[2] && *r.reduced(2) == 3.0f);
    // The order of signals (then the rest) is the next round's.
    assert_true(r.order() == std::vector<int32_t>({2, 3, 0, 1}));
    assert_true(r.reductions_run() == 3);
}

void test_stage1_accumulate_and_disagreement(void **) {
    OneRank one("stage1");
    FakeGroup g;
    ReductionRound stage1(g, nullptr, 1, false);
    stage1.add_units({0, 1});
    stage1.begin(true, {1, 1}, {1, 1}, agreement("sx_unit_grads_ready (accumulate)"), 1.0f);
    stage1.signal(1);
    stage1.signal(0);
    bool dropped = false;
    assert_true(stage1.end(one.world, agreement("sx_accumulate_grads"), 0.0, nullptr, nullptr, &dropped).ok());
    assert_int_equal(g.calls.size(), 1);  // the agreement alone: stage 1 keeps them in place
    // A disagreement at the opening: the round's end says so, nothing was reduced, and
    // the next round runs.
    FakeGroup h;
    h.disagree = true;
    ReductionRound r(h, nullptr, 2, false);
    r.add_units({0});
    r.begin(false, {1}, {1}, agreement("sx_unit_grads_ready"), 1.0f);
    r.signal(0);
    assert_int_equal(r.end(one.world, agreement("sx_step"), 1.0, nullptr, nullptr, &dropped).code(), SX_ERR_MISMATCH);
    assert_int_equal(h.calls.size(), 1);
    h.disagree = false;
    r.begin(false, {1}, {1}, agreement("sx_unit_grads_ready"), 1.0f);
    r.signal(0);
    assert_true(r.end(one.world, agreement("sx_step"), 1.0, nullptr, nullptr, &dropped).ok());
    assert_true(h.calls.back() == "sumsq 0");
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_end),
        cmocka_unit_test(test_stage1_accumulate_and_disagreement),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
