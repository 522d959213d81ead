// The model of the packed-state tests (tests/ckpt/test_packed_state.cc,
// tests/core/test_packed_whole_state.cc): AdamW (lr 0.01) in three param groups, 8-bit
// (or another state dtype), bf16 and fp32, and five 2-D params. "a" (32 blocks) and "b"
// (40 blocks) are 8-bit, their shards split at block boundaries that differ between
// world sizes; "small" (100 elements) keeps fp32 slots in the 8-bit group; "c" is bf16,
// all four in unit 0; "d" is fp32, in unit 1.
#pragma once

#include <string>

#include "sx/sx.h"

namespace sxtest {

struct PackedDef {
    const char *name;
    int64_t rows, cols;
    int32_t group, unit;
};
constexpr PackedDef kPackedParams[] = {{"a", 64, 128, 0, 0}, {"b", 40, 256, 0, 0}, {"small", 10, 10, 0, 0},
                                       {"c", 48, 100, 1, 0}, {"d", 30, 30, 2, 1}};
constexpr int kNumPackedParams = 5;

// Adds the three param groups (the first of state dtype `dtype0`) and kPackedParams to
// g; "" or what failed, in words.
inline std::string add_packed_params(sx_shard_group_t *g, int32_t dtype0) {
    auto text = [](const char *what, sx_status_t st) {
        return std::string(what) + ": " + sx_status_string(st) + ": " + sx_last_error_message();
    };
    sx_status_t st = SX_OK;
    for (int32_t dt : {dtype0, static_cast<int32_t>(SX_STATE_BF16), static_cast<int32_t>(SX_STATE_FP32)}) {
        sx_param_group_desc_t d;
        sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_ADAMW);
        d.lr = 0.01;
        d.state_dtype = dt;
        if ((st = sx_add_param_group(g, &d, nullptr)) != SX_OK) return text("param group", st);
    }
    for (const PackedDef &p : kPackedParams) {
        const int64_t shape[2] = {p.rows, p.cols};
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = p.name;
        d.ndim = 2;
        d.shape = shape;
        d.param_group = p.group;
        d.unit = p.unit;
        if ((st = sx_add_param(g, &d, nullptr)) != SX_OK) return text("param", st);
    }
    return "";
}

}  // namespace sxtest
