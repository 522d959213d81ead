// A param group's state dtype (sx_param_group_desc_t.state_dtype) through the public API:
// which optimizers take it, and what the group's memory then holds at worlds 1, 2 and 4
// against the theory (the whole-state calls and views of packed state:
// test_packed_whole_state.cc).
#include <cstring>
#include <string>

#include "sx_cmocka.h"
#include "test_groups.h"

namespace {

constexpr int64_t kRows = 256, kCols = 256;  // 65536 elements: 256 blocks of 256
constexpr uint64_t kNumel = kRows * kCols;

sx_param_group_desc_t adamw(int32_t state_dtype) {
    sx_param_group_desc_t d;
    sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_ADAMW);
    d.state_dtype = state_dtype;
    return d;
}

// Adds "w", kRows x kCols, to param group 0 of g.
sx_status_t add_w(sx_shard_group_t *g) {
    static const int64_t shape[2] = {kRows, kCols};
    sx_param_desc_t p;
    sx_param_desc_init(&p, sizeof p);
    p.name = "w";
    p.ndim = 2;
    p.shape = shape;
    return sx_add_param(g, &p, nullptr);
}

void test_descriptor_checks(void **) {
    sx_param_group_desc_t lamb;
    sx_param_group_desc_init(&lamb, sizeof lamb, SX_OPTIM_LAMB);
    lamb.state_dtype = SX_STATE_8BIT;
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    const std::string rv = "local://state-dtype-desc-" + std::to_string(getpid());
    cfg.rendezvous = rv.c_str();
    cfg.world_size = 1;
    cfg.num_threads = 1;
    sx_shard_group_t *g = nullptr;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_OK);
    // LAMB keeps its slots in fp32: refused, naming them.
    assert_int_equal(sx_add_param_group(g, &lamb, nullptr), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "exp_avg, exp_avg_sq"));
    sx_param_group_desc_t bad = adamw(3);
    assert_int_equal(sx_add_param_group(g, &bad, nullptr), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "state_dtype = 3"));
    int32_t groups = -1;
    assert_int_equal(sx_get_num_param_groups(g, &groups), SX_OK);
    assert_int_equal(groups, 0);  // nothing was added
    // Set before sx_finalize, it holds; after, it cannot change.
    sx_param_group_desc_t fp32 = adamw(SX_STATE_FP32);
    assert_int_equal(sx_add_param_group(g, &fp32, nullptr), SX_OK);
    assert_int_equal(sx_set_hyperparameter(g, 0, SX_HP_STATE_DTYPE, SX_STATE_8BIT), SX_OK);
    assert_int_equal(add_w(g), SX_OK);
    assert_int_equal(sx_finalize(g), SX_OK);
    assert_int_equal(sx_set_hyperparameter(g, 0, SX_HP_STATE_DTYPE, SX_STATE_BF16), SX_ERR_INVALID_STATE);
    double value = -1;
    assert_int_equal(sx_get_hyperparameter(g, 0, SX_HP_STATE_DTYPE, &value), SX_OK);
    assert_true(value == SX_STATE_8BIT);
    sx_destroy_shard_group(g);
}

// Optimizer bytes per rank after a step, for AdamW's two slots of kNumel elements.
uint64_t theory(int32_t state_dtype, int world) {
    const uint64_t shard = kNumel / static_cast<uint64_t>(world);
    if (state_dtype == SX_STATE_FP32) return 2 * 4 * shard;
    if (state_dtype == SX_STATE_BF16) return 2 * 2 * shard;
    return 2 * (shard + shard / 256 * 4);  // codes, and one fp32 scale per 256
}

void test_memory_per_rank_is_the_theory(void **) {
    for (int32_t dtype : {SX_STATE_FP32, SX_STATE_BF16, SX_STATE_8BIT}) {
        for (int world : {1, 2, 4}) {
            const std::string rv = "local://state-dtype-mem-" + std::to_string(dtype) + "-" + std::to_string(world) +
                                   "-" + std::to_string(getpid());
            const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
                sx_group_config_t cfg;
                sx_group_config_init(&cfg, sizeof cfg);
                cfg.rendezvous = rv.c_str();
                cfg.rank = rank;
                cfg.world_size = world;
                cfg.num_threads = 1;
                sx_shard_group_t *g = nullptr;
                if (sx_create_shard_group(&cfg, &g) != SX_OK) return sx_last_error_message();
                sx_param_group_desc_t d = adamw(dtype);
                std::string out;
                sx_memory_stats_t m;
                sx_memory_stats_init(&m, sizeof m);
                if (sx_add_param_group(g, &d, nullptr) != SX_OK || add_w(g) != SX_OK ||
                    sx_finalize(g) != SX_OK || sx_step(g, nullptr, nullptr) != SX_OK ||
                    sx_get_memory_stats(g, &m) != SX_OK)
                    out = sx_last_error_message();
                else if (m.optimizer_bytes != theory(dtype, world) || m.unsharded_optimizer_bytes != theory(dtype, 1))
                    out = "state " + std::to_string(dtype) + " world " + std::to_string(world) + ": optimizer bytes " +
                          std::to_string(m.optimizer_bytes) + " (unsharded " + std::to_string(m.unsharded_optimizer_bytes) +
                          "), the theory " + std::to_string(theory(dtype, world));
                sx_destroy_shard_group(g);
                return out;
            });
            if (!err.empty()) fail_msg("%s", err.c_str());
        }
    }
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descriptor_checks),
        cmocka_unit_test(test_memory_per_rank_is_the_theory),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
