// The agreement part on its own (core/agreement.h): call headers exchanged by 3 ranks
// (threads over local://, Gloo) on a communicator whose ranks are world ranks 4-6 (a
// mesh's second shard group): ranks that agree get every header in rank order; ranks in
// different calls, or whose facts differ, all get SX_ERR_MISMATCH naming the first fact
// that differs with each rank's value, as world ranks; a rank that refuses the call gets
// its own code and its peers the same code naming it; a failed exchange goes to the
// group's fail function. And the facts of an agreement and of a param table.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "core/agreement.h"
#include "gloo_rank.h"
#include "run_ranks.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

using sx::Status;
using sx::core::CallHeader;
using sx::core::CallHeaders;
using sx::core::Fact;

namespace {

constexpr int kRanks = 3;
constexpr int kFirstWorldRank = 4;

// Rank r's side of one exchange: its call, its facts (their fingerprint is the header's),
// its weight and its verdict on its arguments.
Status exchange(const CallHeaders &h, sx::comm::Communicator &c, const char *call, const std::vector<Fact> &facts,
                double weight, Status local, std::vector<CallHeader> *all) {
    CallHeader mine;
    mine.fingerprint = sx::core::facts_fingerprint(facts);
    mine.weight = weight;
    mine.refused = local.code();
    return h.exchange(c, call, mine, [&] { return facts; }, all, "ranks disagree");
}

void test_headers(void **) {
    const std::string url = "local://agreement-" + std::to_string(getpid());
    std::atomic<int> failed{0};
    const std::string err = sxtest::run_ranks(kRanks, [&](int r) -> std::string {
        std::unique_ptr<sx::comm::Communicator> c;
        Status s = sxtest::connect_gloo(url, r, kRanks, &c);
        if (!s.ok()) return "connect: " + s.message();
        CallHeaders h(kFirstWorldRank + r, nullptr, [&](Status f) {
            ++failed;
            return f;
        });
        const std::vector<Fact> same = {{"the call", "sx_step"}, {"lr", "0.1"}};
        // Agreed: every header, in rank order.
        std::vector<CallHeader> all;
        s = exchange(h, *c, "sx_step", same, 1.5 * r, Status::Ok(), &all);
        if (!s.ok()) return "agreed: " + s.message();
        if (all.size() != kRanks || all[2].weight != 3.0 || all[0].call != all[1].call) return "agreed: the headers";
        // Different calls: rank 1 saves.
        const bool saves = r == 1;
        s = exchange(h, *c, saves ? "sx_save_optim_state" : "sx_step",
                     {{"the call", saves ? "sx_save_optim_state" : "sx_step"}}, 0, Status::Ok(), nullptr);
        if (s.code() != SX_ERR_MISMATCH ||
            s.message().find("ranks disagree: the call: sx_step on ranks 4, 6, sx_save_optim_state on rank 5") ==
                std::string::npos)
            return "different calls: " + s.message();
        // The same call, a fact that differs on rank 2: the first that differs is named.
        std::vector<Fact> mine = {{"the call", "sx_step"}, {"lr", "0.1"}, {"eps", r == 2 ? "1e-6" : "1e-8"},
                                  {"wd", r == 0 ? "0" : "0.1"}};
        s = exchange(h, *c, "sx_step", mine, 0, Status::Ok(), nullptr);
        if (s.code() != SX_ERR_MISMATCH || s.message().find("eps: 1e-8 on ranks 4, 5, 1e-6 on rank 6") == std::string::npos)
            return "different facts: " + s.message();
        // Rank 0 refuses its arguments: its own code for it, the same code naming it for
        // the others (header ranks are the communicator's).
        const Status local = r == 0 ? SX_ERROR(SX_ERR_NOT_FOUND, "no such checkpoint") : Status::Ok();
        s = exchange(h, *c, "sx_load_optim_state", same, 0, local, nullptr);
        if (s.code() != SX_ERR_NOT_FOUND) return "refused: " + s.message();
        if (r != 0 && s.message().find("sx_load_optim_state failed on rank 0") == std::string::npos)
            return "refused, a peer: " + s.message();
        // A failed exchange (rank 2's communicator aborted) goes to fail on that rank.
        if (r == 2) {
            c->abort();
            s = exchange(h, *c, "sx_step", same, 0, Status::Ok(), nullptr);
            if (s.ok() || failed.load() != 1) return "an aborted exchange: " + s.message();
        }
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

void test_facts(void **) {
    std::deque<sx::core::ParamSpec> params(2);
    params[0].name = "w";
    params[0].shape = {4, 4};
    params[0].dtype = SX_DTYPE_F32;
    params[1].name = "b";
    params[1].shape = {4};
    params[1].dtype = SX_DTYPE_BF16;
    params[1].unit = 1;
    sx::optim::Hyper adam;
    adam.kind = sx::optim::Kind::kAdamW;
    const std::vector<Fact> t = sx::core::table_facts({2, 0, 0, 0.0}, {adam}, params, {1, 0});
    auto has = [&](const std::vector<Fact> &f, const std::string &what, const std::string &value) {
        for (const Fact &x : f)
            if (x.what == what) return x.value == value;
        return false;
    };
    assert_true(has(t, "stage", "2"));
    assert_true(has(t, "param 'w' shape", "[4, 4]"));
    assert_true(has(t, "param 'b' dtype", "bf16"));
    assert_true(has(t, "param 'b' unit", "1"));
    assert_true(has(t, "param 'b' frozen", "yes"));
    assert_true(has(t, "param group 0 optimizer", sx::optim::optimizer_name(sx::optim::Kind::kAdamW)));
    // An agreement's facts and fingerprint follow its fields.
    sx::core::Agreement a;
    a.call = "sx_step";
    a.mask = {1, 0};
    a.hypers = {adam};
    a.max_grad_norm = 1.0;
    const std::vector<Fact> f = sx::core::agreement_facts(a, params);
    assert_true(f[0].what == "the call" && f[0].value == "sx_step");
    assert_true(has(f, "param 'b' trainable", "no"));
    assert_true(has(f, "max_grad_norm", "1"));
    sx::core::Agreement b = a;
    assert_true(sx::core::agreement_fingerprint(a) == sx::core::agreement_fingerprint(b));
    b.hypers[0].lr *= 2;
    assert_true(sx::core::agreement_fingerprint(a) != sx::core::agreement_fingerprint(b));
    b = a;
    b.micro_batches = 1;
    assert_true(sx::core::agreement_fingerprint(a) != sx::core::agreement_fingerprint(b));
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_headers),
        cmocka_unit_test(test_facts),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
