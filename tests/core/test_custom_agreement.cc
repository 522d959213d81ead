// Custom optimizers across ranks and against the step's nonfinite policy:
// - Ranks (processes: each registers its own) that registered the same optimizer name
//   with other slots, or another hyperparameter default, are refused at sx_finalize, on
//   every rank, with SX_ERR_MISMATCH naming the optimizer, what differs and both values.
// - A custom update that writes inf or NaN is judged by options->nonfinite as gradients
//   are: SX_NONFINITE_DEFAULT keeps it and the result says so, SX_NONFINITE_SKIP skips the
//   step on every rank (nothing changes), SX_NONFINITE_ERROR skips it and returns
//   SX_ERR_NONFINITE naming the optimizer and the param, the group usable after; an
//   optimizer that updates in place cannot be undone, so the policy's skip fails the group.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "process_ranks.h"
#include "run_ranks.h"
#include "sx/sx.h"
#include "sx_cmocka.h"

namespace {

constexpr int64_t kElements = 1000;

// A plain SGD; where its user data says so, it writes NaN into the elements of the
// param's second half (rank 1's shard, at 2 ranks).
struct Behaviour {
    bool nan = false;
};

int32_t sgd(const sx_optimizer_piece_t *p) {
    const bool nan = static_cast<const Behaviour *>(p->user_data)->nan;
    for (size_t i = 0; i < p->n; ++i) {
        p->param[i] -= static_cast<float>(p->hyperparameters[0]) * p->grad[i] * p->grad_scale;
        if (p->num_slots > 0) p->state[0][i] = p->grad[i];
        if (nan && p->offset + i >= static_cast<uint64_t>(kElements / 2))
            p->param[i] = std::numeric_limits<float>::quiet_NaN();
    }
    return 0;
}

// Not a flag of sx's: register_probe's own, which it takes out (the NaN is the update's).
constexpr uint32_t kNanInSecondHalf = 0x80000000u;

// Registers `name` as this process (rank) has it: `slots` slots, and its own "beta"
// hyperparameter with default `beta`; flags SX_OPTIMIZER_*.
int32_t register_probe(const char *name, int slots, double beta, Behaviour *b, uint32_t flags = 0) {
    flags &= ~kNanInSecondHalf;
    const char *slot_names[2] = {"m", "v"};
    sx_optimizer_hyperparameter_t hp[2] = {{"lr", 0.1, 0, 0}, {"beta", beta, 0, 1}};
    sx_optimizer_desc_t d;
    sx_optimizer_desc_init(&d, sizeof d);
    d.name = name;
    d.num_slots = slots;
    d.slot_names = slot_names;
    d.num_hyperparameters = 2;
    d.hyperparameters = hp;
    d.update = sgd;
    d.user_data = b;
    d.flags = flags;
    int32_t id = -1;
    return sx_register_optimizer(&d, &id) == SX_OK ? id : -1;
}

// A group of rank/world on `rendezvous` with one param of `optimizer`, finalized: its
// finalize status in *finalized (the group may be returned unfinalized).
sx_shard_group_t *make_group(const std::string &rendezvous, int rank, int world, int32_t optimizer,
                             sx_status_t *finalized) {
    sx_group_config_t c;
    sx_group_config_init(&c, sizeof c);
    c.rendezvous = rendezvous.c_str();
    c.rank = rank;
    c.world_size = world;
    c.backend = SX_BACKEND_CPU;
    c.num_threads = 1;
    c.timeout_ms = 30000;
    sx_shard_group_t *g = nullptr;
    if (sx_create_shard_group(&c, &g) != SX_OK) return nullptr;
    sx_param_group_desc_t d;
    sx_param_group_desc_init(&d, sizeof d, optimizer);
    sx_add_param_group(g, &d, nullptr);
    sx_param_desc_t pd;
    sx_param_desc_init(&pd, sizeof pd);
    pd.name = "w";
    pd.ndim = 1;
    pd.shape = &kElements;
    sx_add_param(g, &pd, nullptr);
    *finalized = sx_finalize(g);
    return g;
}

// A rank registering "probe" its own way (--case slots|default): its sx_finalize must
// fail with SX_ERR_MISMATCH whose text has --says.
int child_main(int argc, char **argv) {
    sxtest::ChildArgs a;
    if (!sxtest::parse_child_args(argc, argv, &a)) return 2;
    const std::string which = a.get("--case", "");
    static Behaviour b;
    const int32_t id = which == "slots" ? register_probe("probe", a.rank == 0 ? 1 : 2, 0.9, &b)
                                        : register_probe("probe", 1, a.rank == 0 ? 0.9 : 0.95, &b);
    sx_status_t finalized = SX_OK;
    sx_shard_group_t *g = make_group(a.rendezvous, a.rank, a.world, id, &finalized);
    const std::string message = sx_last_error_message();
    sx_destroy_shard_group(g);
    const std::string says = a.get("--says", "");
    if (g == nullptr || finalized != SX_ERR_MISMATCH || message.find(says) == std::string::npos) {
        std::fprintf(stderr, "rank %d: sx_finalize returned %s \"%s\"; expected SX_ERR_MISMATCH saying \"%s\"\n",
                     a.rank, sx_status_string(finalized), message.c_str(), says.c_str());
        return 1;
    }
    return 0;
}

void test_other_slots_are_refused_at_finalize(void **) {
    const std::string err = sxtest::run_process_ranks(
        2, {"--case", "slots", "--says", "custom optimizer 'probe' slots: 'm' on rank 0, 'm', 'v' on rank 1"}, 60);
    if (!err.empty()) fail_msg("%s", err.c_str());
}

void test_other_defaults_are_refused_at_finalize(void **) {
    const std::string err = sxtest::run_process_ranks(
        2, {"--case", "default", "--says", "custom optimizer 'probe' hyperparameter 'beta' default: 0.9 on rank 0, 0.95 on rank 1"},
        60);
    if (!err.empty()) fail_msg("%s", err.c_str());
}

std::vector<float> params_of(sx_shard_group_t *g) {
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    if (sx_param_view(g, 0, &v) != SX_OK) return {};
    return std::vector<float>(static_cast<float *>(v.data), static_cast<float *>(v.data) + v.numel);
}

sx_status_t step(sx_shard_group_t *g, int rank, int nonfinite, sx_step_result_t *r) {
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    sx_grad_view(g, 0, &v);
    for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = 0.01f * static_cast<float>(i % 7 + rank);
    sx_step_options_t o;
    sx_step_options_init(&o, sizeof o);
    o.nonfinite = nonfinite;
    sx_step_result_init(r, sizeof *r);
    return sx_step(g, &o, r);
}

// 2 ranks (threads) step once; then the optimizer writes NaN into rank 1's shard (the
// param's second half) in the next step, under `nonfinite`. What each rank's step returns
// and reports, and whether the params changed, are checked; then the NaN stops and a step
// must succeed (except where the group failed).
void nan_under_policy(int nonfinite, uint32_t flags) {
    static int run = 0;
    const std::string name = "nan" + std::to_string(run);
    const std::string rv = "local://custom-nan-" + std::to_string(run++);
    static Behaviour behaviour;
    behaviour.nan = false;
    const int32_t id = register_probe(name.c_str(), 1, 0.9, &behaviour, flags | kNanInSecondHalf);
    assert_true(id > 0);
    sx_shard_group_t *groups[2] = {nullptr, nullptr};
    std::vector<float> before[2];
    std::string err = sxtest::run_ranks(2, [&](int rank) -> std::string {
        sx_status_t finalized = SX_OK;
        groups[rank] = make_group(rv, rank, 2, id, &finalized);
        sx_step_result_t r;
        if (groups[rank] == nullptr || finalized != SX_OK) return "make_group failed";
        if (step(groups[rank], rank, nonfinite, &r) != SX_OK || r.nonfinite) return "the first step failed";
        before[rank] = params_of(groups[rank]);
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
    behaviour.nan = true;
    err = sxtest::run_ranks(2, [&](int rank) -> std::string {
        sx_step_result_t r;
        const sx_status_t st = step(groups[rank], rank, nonfinite, &r);
        const std::string says = sx_last_error_message();
        const std::vector<float> after = params_of(groups[rank]);
        const bool nan = std::isnan(after.back());
        if (flags & SX_OPTIMIZER_IN_PLACE) {
            // Cannot be undone: a policy that skips fails the group (rank 1 wrote them).
            if (nonfinite == SX_NONFINITE_DEFAULT) return st == SX_OK && r.nonfinite ? "" : "in place, default: " + says;
            if (rank == 1 && (st != SX_ERR_NONFINITE || says.find("half done") == std::string::npos))
                return "in place, skipped: " + says;
            return st != SX_OK ? "" : "in place: a rank stepped on";
        }
        if (nonfinite == SX_NONFINITE_DEFAULT) {
            if (st != SX_OK || !r.nonfinite || r.skipped || !nan) return "default: the NaN was not kept and reported";
            return "";
        }
        const bool skipped_ok = r.skipped && r.nonfinite && after == before[rank] && r.step == 1;
        if (nonfinite == SX_NONFINITE_SKIP && (st != SX_OK || !skipped_ok)) return "skip: " + says;
        if (nonfinite == SX_NONFINITE_ERROR &&
            (st != SX_ERR_NONFINITE || !skipped_ok || says.find(name) == std::string::npos ||
             says.find("param 'w'") == std::string::npos))
            return "error: " + std::string(sx_status_string(st)) + " " + says;
        return "";
    });
    if (!err.empty()) fail_msg("policy %d, flags %u: %s", nonfinite, flags, err.c_str());
    behaviour.nan = false;
    err = sxtest::run_ranks(2, [&](int rank) -> std::string {
        sx_step_result_t r;
        const sx_status_t st = step(groups[rank], rank, nonfinite, &r);
        sx_destroy_shard_group(groups[rank]);
        const bool failed = (flags & SX_OPTIMIZER_IN_PLACE) && nonfinite != SX_NONFINITE_DEFAULT;
        if (failed) return st == SX_ERR_GROUP_FAILED ? "" : "the failed group stepped";
        return st == SX_OK ? "" : std::string("the next step: ") + sx_last_error_message();
    });
    if (!err.empty()) fail_msg("policy %d, flags %u: %s", nonfinite, flags, err.c_str());
}

void test_nan_kept_by_default(void **) { nan_under_policy(SX_NONFINITE_DEFAULT, 0); }
void test_nan_skipped(void **) { nan_under_policy(SX_NONFINITE_SKIP, 0); }
void test_nan_refused(void **) { nan_under_policy(SX_NONFINITE_ERROR, 0); }
void test_nan_in_place_kept_by_default(void **) { nan_under_policy(SX_NONFINITE_DEFAULT, SX_OPTIMIZER_IN_PLACE); }
void test_nan_in_place_fails_the_group(void **) { nan_under_policy(SX_NONFINITE_ERROR, SX_OPTIMIZER_IN_PLACE); }

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_other_slots_are_refused_at_finalize),
        cmocka_unit_test(test_other_defaults_are_refused_at_finalize),
        cmocka_unit_test(test_nan_kept_by_default),
        cmocka_unit_test(test_nan_skipped),
        cmocka_unit_test(test_nan_refused),
        cmocka_unit_test(test_nan_in_place_kept_by_default),
        cmocka_unit_test(test_nan_in_place_fails_the_group),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
