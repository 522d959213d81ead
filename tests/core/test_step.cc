// The distributed step against an unsharded single-process reference: world sizes 1-4
// as threads and 2 as processes over tcp://, stages 1 and 2, every optimizer, two
// param groups, 3 micro-batches, clipping; freezing and unfreezing mid-run.
#include "sx_cmocka.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "process_ranks.h"
#include "step_scenario.h"

using sxtest::Scenario;

namespace {

void expect_ok(const std::string &err) {
    if (!err.empty()) fail_msg("%s", err.c_str());
}

void run_matrix(int32_t optimizer, const char *tag) {
    for (int world = 1; world <= 4; ++world) {
        for (int stage = 1; stage <= 2; ++stage) {
            Scenario sc = sxtest::two_group_scenario(optimizer);
            sc.world = world;
            sc.stage = stage;
            std::string name = std::string(tag) + "-w" + std::to_string(world) + "-s" + std::to_string(stage);
            std::string err = sxtest::run_threads_and_compare(sc, name, 1e-6);
            if (!err.empty()) fail_msg("%s world %d stage %d: %s", tag, world, stage, err.c_str());
        }
    }
}

void test_sgd_matches_reference(void **) { run_matrix(SX_OPTIM_SGD, "sgd"); }
void test_adam_matches_reference(void **) { run_matrix(SX_OPTIM_ADAM, "adam"); }
void test_adamw_matches_reference(void **) { run_matrix(SX_OPTIM_ADAMW, "adamw"); }

void test_without_clipping_and_single_micro_batch(void **) {
    for (int world : {1, 3}) {
        Scenario sc = sxtest::two_group_scenario(SX_OPTIM_ADAMW);
        sc.world = world;
        sc.max_grad_norm = 0.0;
        sc.micro_batches = 1;
        expect_ok(sxtest::run_threads_and_compare(sc, "noclip-" + std::to_string(world), 1e-6));
    }
}

void test_freeze_and_unfreeze(void **) {
    for (int world : {1, 2, 3}) {
        for (int stage = 1; stage <= 2; ++stage) {
            for (int32_t opt : {SX_OPTIM_ADAMW, SX_OPTIM_SGD}) {
                Scenario sc = sxtest::two_group_scenario(opt);
                sc.world = world;
                sc.stage = stage;
                sc.trainable = sxtest::freeze_schedule;
                sc.mask_through_pointer = (world + stage) % 2 == 0;
                std::string name = "freeze-" + std::to_string(world) + "-" + std::to_string(stage) +
                                   "-" + std::to_string(opt);
                std::string err = sxtest::run_threads_and_compare(sc, name, 1e-6);
                if (!err.empty())
                    fail_msg("world %d stage %d optimizer %d: %s", world, stage, opt, err.c_str());
            }
        }
    }
}

void test_freezing_changes_the_trajectory(void **) {
    // Guard against a schedule that has no effect: the reference with and without
    // freezing must differ for the frozen params.
    Scenario a = sxtest::two_group_scenario(SX_OPTIM_ADAMW), b = a;
    b.trainable = sxtest::freeze_schedule;
    auto ra = sxtest::reference_run(a), rb = sxtest::reference_run(b);
    assert_true(ra[2] != rb[2]);
    assert_true(ra[4] != rb[4]);
    assert_true(ra[1] != rb[1]);
}

void test_processes_over_tcp(void **) {
    for (int stage = 1; stage <= 2; ++stage) {
        std::string err = sxtest::run_process_ranks(2, {"--scenario", "adamw", "--stage", std::to_string(stage)},
                                                    60);
        if (!err.empty()) fail_msg("stage %d: %s", stage, err.c_str());
    }
}

// Child process role: one rank of a tcp:// run; exits 0 if its params match the reference.
int child_main(int argc, char **argv) {
    sxtest::ChildArgs args;
    if (!sxtest::parse_child_args(argc, argv, &args)) return 2;
    Scenario sc = sxtest::two_group_scenario(SX_OPTIM_ADAMW);
    sc.world = args.world;
    sc.stage = std::atoi(args.get("--stage", "2").c_str());
    std::vector<std::vector<float>> got;
    std::string err = sxtest::rank_run(sc, args.rendezvous, args.rank, 30000, &got);
    if (err.empty()) err = sxtest::compare(got, sxtest::reference_run(sc), 1e-6);
    if (!err.empty()) {
        std::fprintf(stderr, "rank %d: %s\n", args.rank, err.c_str());
        return 1;
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_matches_reference),
        cmocka_unit_test(test_adam_matches_reference),
        cmocka_unit_test(test_adamw_matches_reference),
        cmocka_unit_test(test_without_clipping_and_single_micro_batch),
        cmocka_unit_test(test_freeze_and_unfreeze),
        cmocka_unit_test(test_freezing_changes_the_trajectory),
        cmocka_unit_test(test_processes_over_tcp),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
