// One-rank groups for tests that need a group but not its ranks: made, registered,
// finalized and saved through the public API, each step asserted with CMocka.
// Include it after sx_cmocka.h.
#pragma once

#include <unistd.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "run_ranks.h"
#include "sx/sx.h"

namespace sxtest {

struct ParamDef {
    std::string name;
    std::vector<int64_t> shape;
    bool frozen = false;
    int32_t dtype = 0;  // SX_DTYPE_*; 0 = fp32
};

// Rank 0 of 1 over local://TAG-PID with one thread: one param group `desc` (NULL: AdamW
// with torch's defaults) and `params`, all in unit 0, finalized. Params and grads are zero.
inline sx_shard_group_t *one_rank_group(const std::string &tag, const std::vector<ParamDef> &params,
                                        const sx_param_group_desc_t *desc = nullptr) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    const std::string rv = "local://" + tag + "-" + std::to_string(getpid());
    cfg.rendezvous = rv.c_str();
    cfg.world_size = 1;
    cfg.num_threads = 1;
    sx_shard_group_t *g = nullptr;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_OK);
    sx_param_group_desc_t adamw;
    sx_param_group_desc_init(&adamw, sizeof adamw, SX_OPTIM_ADAMW);
    assert_int_equal(sx_add_param_group(g, desc ? desc : &adamw, nullptr), SX_OK);
    for (const ParamDef &p : params) {
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = p.name.c_str();
        d.ndim = static_cast<int32_t>(p.shape.size());
        d.shape = p.shape.data();
        d.frozen = p.frozen ? 1 : 0;
        d.dtype = p.dtype;
        assert_int_equal(sx_add_param(g, &d, nullptr), SX_OK);
    }
    assert_int_equal(sx_finalize(g), SX_OK);
    return g;
}

// A synchronous save of g into `path` (a new directory): the call's status, or the save's.
inline sx_status_t save_synchronously(sx_shard_group_t *g, const std::string &path) {
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    so.path = path.c_str();
    so.synchronous = 1;
    sx_future_t *f = nullptr;
    sx_status_t st = sx_save_optim_state(g, &so, &f);
    if (st == SX_OK) st = sx_future_wait(f, -1);
    sx_future_destroy(f);
    return st;
}

// The same, asserted to succeed.
inline void save_sync(sx_shard_group_t *g, const std::string &path) {
    assert_int_equal(save_synchronously(g, path), SX_OK);
}

}  // namespace sxtest
