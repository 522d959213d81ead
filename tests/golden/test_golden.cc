// Golden checkpoints, committed under tests/golden/vX.Y/: every later version of sx must
// keep loading them, at any world size and stage, bit for bit.
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "api/handles.h"
#include "every_optimizer.h"
#include "every_optimizer_io.h"
#include "golden_model.h"
#include "sx/sx.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

namespace {

// A group's ranks: world, as shard groups of `shard` ranks (0: one, flat).
struct Mesh {
    int world, shard;
};

// Loads `dir` into mesh.world ranks (threads) and checks every value, state, step count,
// hyperparameter and the user blob. Returns "" or the first difference.
std::string load_and_check(const std::string &dir, Mesh mesh, bool split_units, int stage) {
    const int world = mesh.world;
    std::vector<std::string> errs(world);
    std::vector<std::thread> ts;
    const std::string rv = "local://golden-" + std::to_string(world) + "x" + std::to_string(mesh.shard) +
                           (split_units ? "s" : "") + "-" + std::to_string(stage);
    for (int r = 0; r < world; ++r) {
        ts.emplace_back([&, r] {
            std::string &e = errs[r];
            sx_group_config_t cfg;
            sx_group_config_init(&cfg, sizeof cfg);
            cfg.backend = SX_BACKEND_CPU;
            cfg.rendezvous = rv.c_str();
            cfg.rank = r;
            cfg.world_size = world;
            cfg.shard_size = mesh.shard;
            cfg.stage = stage;
            cfg.num_threads = 1;
            sx_shard_group_t *g = nullptr;
            if (sx_create_shard_group(&cfg, &g) != SX_OK) {
                e = sx_last_error_message();
                return;
            }
            sx_param_group_desc_t a, b;
            sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_ADAMW);
            a.amsgrad = 1;
            sx_param_group_desc_init(&b, sizeof b, SX_OPTIM_SGD);
            b.momentum = 0.5;
            sx_add_param_group(g, &a, nullptr);
            sx_add_param_group(g, &b, nullptr);
            const auto &defs = sxgolden::params();
            for (size_t p = 0; p < defs.size(); ++p) {
                sx_param_desc_t pd;
                sx_param_desc_init(&pd, sizeof pd);
                pd.name = defs[p].name;
                pd.ndim = static_cast<int32_t>(defs[p].shape.size());
                pd.shape = defs[p].shape.data();
                pd.param_group = defs[p].group;
                pd.unit = split_units ? static_cast<int32_t>(p) : defs[p].unit;
                sx_add_param(g, &pd, nullptr);
            }
            sx_load_options_t lo;
            sx_load_optim_state_options_init(&lo, sizeof lo);
            lo.path = dir.c_str();
            if (sx_finalize(g) != SX_OK || sx_load_optim_state(g, &lo) != SX_OK) {
                e = sx_last_error_message();
                sx_destroy_shard_group(g);
                return;
            }
            sx::core::ShardGroup &sg = *g->impl;
            int32_t units = 0;
            sx_get_num_units(g, &units);
            for (int32_t u = 0; u < units && stage == 3; ++u)
                if (sx_unit_gather(g, u) != SX_OK) e = std::string("gather: ") + sx_last_error_message();
            for (size_t p = 0; p < defs.size() && e.empty(); ++p) {
                sx_view_t v;
                sx_view_init(&v, sizeof v);
                if (sx_param_view(g, static_cast<int32_t>(p), &v) != SX_OK) {
                    e = std::string("param view: ") + sx_last_error_message();
                    break;
                }
                for (uint64_t i = 0; i < v.numel; ++i)
                    if (static_cast<float *>(v.data)[i] != sxgolden::value(static_cast<int>(p), 0, i))
                        e = std::string("value of ") + defs[p].name + " differs";
                const sx::core::ShardPiece piece = sg.layout().piece(static_cast<int32_t>(p), r);
                const auto uv = sg.unit_shard(sg.layout().placement(static_cast<int32_t>(p)).unit_index);
                const int slots = defs[p].group == 0 ? 3 : 1;
                for (int k = 0; k < slots && e.empty(); ++k)
                    for (uint64_t i = piece.begin; i < piece.end; ++i)
                        if (uv.state[k][piece.shard_offset + (i - piece.begin)] !=
                            sxgolden::value(static_cast<int>(p), k + 1, i))
                            e = std::string("state ") + std::to_string(k) + " of " + defs[p].name + " differs";
                if (sg.param(static_cast<int32_t>(p)).step != sxgolden::step_of(static_cast<int>(p)))
                    e = std::string("step count of ") + defs[p].name + " differs";
            }
            double lr = 0, momentum = 0;
            sx_get_hyperparameter(g, 0, SX_HP_LR, &lr);
            sx_get_hyperparameter(g, 1, SX_HP_MOMENTUM, &momentum);
            if (e.empty() && (lr != 0.003 || momentum != 0.8)) e = "hyperparameters were not restored";
            if (e.empty() && sg.steps_taken() != sxgolden::kGroupSteps) e = "the step count was not restored";
            sx_destroy_shard_group(g);
        });
    }
    for (auto &t : ts) t.join();
    for (int r = 0; r < world; ++r)
        if (!errs[r].empty()) return "rank " + std::to_string(r) + ": " + errs[r];
    return "";
}

// A golden's loads into every stage and each mesh, with its units and one per param,
// each checked by `check` (golden_model.h's load_and_check by default), and its user blob.
using LoadAndCheck = std::function<std::string(const std::string &dir, Mesh mesh, bool split_units, int stage)>;

void expect_golden(const std::string &dir, const std::vector<Mesh> &meshes, const LoadAndCheck &check = load_and_check,
                   const char *user_blob = sxgolden::kUserBlob) {
    for (int stage = 1; stage <= 3; ++stage) {
        for (Mesh mesh : meshes) {
            for (bool split : {false, true}) {
                const std::string err = check(dir, mesh, split, stage);
                if (!err.empty())
                    fail_msg("%s into stage %d, world %d (shard size %d)%s: %s", dir.c_str(), stage, mesh.world,
                             mesh.shard, split ? " (units split)" : "", err.c_str());
            }
        }
    }
    char blob[64];
    uint64_t size = 0;
    assert_int_equal(sx_read_user_blob(dir.c_str(), blob, sizeof blob, &size), SX_OK);
    assert_int_equal(size, std::strlen(user_blob));
    assert_memory_equal(blob, user_blob, size);
}

// Format 1.0, saved by sx 1.0.0 on 2 ranks at stage 2.
void test_golden_v1_0_loads_bit_for_bit(void **) {
    expect_golden(std::string(SX_GOLDEN_DIR) + "/v1.0/adamw-sgd-w2", {{1, 0}, {2, 0}, {3, 0}, {4, 2}});
}

// Format 1.1, saved by sx 1.2.0 on 3 ranks at stage 3 (each rank held a shard of the params).
void test_golden_v1_1_stage3_loads_bit_for_bit(void **) {
    expect_golden(std::string(SX_GOLDEN_DIR) + "/v1.1/adamw-sgd-w3-stage3", {{1, 0}, {2, 0}, {4, 0}, {4, 1}});
}

// Format 1.2, saved by sx 1.4.0 on 4 ranks as a 2 x 2 mesh at stage 2 (the first replica
// group wrote 2 files).
void test_golden_v1_2_mesh_loads_bit_for_bit(void **) {
    expect_golden(std::string(SX_GOLDEN_DIR) + "/v1.2/adamw-sgd-w4-mesh2x2", {{1, 0}, {3, 0}, {4, 2}, {6, 2}});
}

// Format 2.0, saved by sx 1.5.0 on 6 ranks as a 3 x 2 mesh at stage 3 (the first replica
// group wrote 3 files, each ending with its chunk index).
void test_golden_v2_0_mesh_stage3_loads_bit_for_bit(void **) {
    expect_golden(std::string(SX_GOLDEN_DIR) + "/v2.0/adamw-sgd-w6-mesh3x2-stage3", {{1, 0}, {2, 0}, {4, 2}, {6, 3}});
}

// Format 3.0, saved by sx 1.6.0 on 3 ranks at stage 2: a param group of every built-in
// optimizer and one of a registered optimizer (every_optimizer.h), with the state that
// only 3.0 holds (Adafactor's factored moments in the MANIFEST, NAdam's mu_product, LAMB's
// and AdEMAMix's group step counts, a custom optimizer's named slots).
void test_golden_v3_0_every_optimizer_loads_bit_for_bit(void **) {
    expect_golden(
        std::string(SX_GOLDEN_DIR) + "/v3.0/every-optimizer-w3-stage2", {{1, 0}, {2, 0}, {4, 2}, {5, 0}},
        [](const std::string &dir, Mesh mesh, bool split, int stage) {
            return sxgolden3::load_and_check(dir, mesh.world, mesh.shard, stage, split);
        },
        sxgolden3::kUserBlob);
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_v1_0_loads_bit_for_bit),
        cmocka_unit_test(test_golden_v1_1_stage3_loads_bit_for_bit),
        cmocka_unit_test(test_golden_v1_2_mesh_loads_bit_for_bit),
        cmocka_unit_test(test_golden_v2_0_mesh_stage3_loads_bit_for_bit),
        cmocka_unit_test(test_golden_v3_0_every_optimizer_loads_bit_for_bit),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
