// Packed optimizer state (bf16 and 8-bit, sx_param_group_desc_t.state_dtype) through the
// whole-state calls and the state views, with real ranks (threads over local://) at world
// sizes 1 to 3 and stages 1 to 3. One unit mixes 8-bit params ("a", "b": their shards
// split at block boundaries that differ between world sizes), one too small for 8 bits
// ("small", fp32 slots in the 8-bit group) and a bf16 param; a second unit is fp32.
//
// - The views show packed slots in place: bf16 as SX_DTYPE_BF16, 8-bit codes as
//   SX_DTYPE_U8 with "<slot>.scale" one fp32 per block, fallback and fp32 params as fp32.
// - A gather delivers what the views hold, decoded: bf16 widened, codes as map value
//   times block scale (the reference decoder).
// - Gather, scatter, gather is exact: the views' bytes (codes, scales, bf16) and the
//   gathered values are the same before and after.
// - A scatter of arbitrary values stores what the reference encoder gives: bf16 rounded
//   to nearest even, each block's codes and scale as optim::encode_block computes them.
// All of it for CPU groups, and (SX_SIMULATED_DEVICE set) for CUDA groups whose state is
// in the simulated device's memory, whose bytes the test reads in place.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/half.h"
#include "optim/state_codec.h"
#include "sx/sx.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"
#include "packed_params.h"
#include "run_ranks.h"

namespace {

using sxtest::PackedDef;
// Group 0: 8-bit; 1: bf16; 2: fp32. "small" keeps fp32 state in the 8-bit group.
const auto &kParams = sxtest::kPackedParams;
constexpr int kNumParams = sxtest::kNumPackedParams;
const char *const kSlots[2] = {"exp_avg", "exp_avg_sq"};

std::string text(const char *what, sx_status_t st) {
    return std::string(what) + ": " + sx_status_string(st) + ": " + sx_last_error_message();
}

// Whole state by param name: each tensor's fp32 values by tensor name, and the step.
struct Whole {
    std::map<std::string, std::map<std::string, std::vector<float>>> tensors;
    std::map<std::string, int64_t> steps;
};

sx_status_t keep(sx_param_state_t *st, void *user) {
    Whole *w = static_cast<Whole *>(user);
    for (int32_t t = 0; t < st->num_tensors; ++t)
        w->tensors[st->name][st->tensor_names[t]].assign(st->tensors[t], st->tensors[t] + st->tensor_numels[t]);
    w->steps[st->name] = st->step;
    return SX_OK;
}

sx_status_t give(sx_param_state_t *st, void *user) {
    const Whole *w = static_cast<const Whole *>(user);
    for (int32_t t = 0; t < st->num_tensors; ++t) {
        const std::vector<float> &v = w->tensors.at(st->name).at(st->tensor_names[t]);
        if (v.size() != st->tensor_numels[t]) return SX_ERR_INVALID_ARGUMENT;
        std::memcpy(st->tensors[t], v.data(), v.size() * sizeof(float));
    }
    st->step = w->steps.at(st->name);
    return SX_OK;
}

// One view as a rank holds it: its dtype, its param's shard range, and its bytes.
struct ViewBytes {
    int32_t dtype = 0;
    uint64_t begin = 0, numel = 0;
    std::string bytes;
};
using Views = std::map<std::string, ViewBytes>;  // "param/tensor"

size_t dtype_size(int32_t dtype) { return dtype == SX_DTYPE_U8 ? 1 : dtype == SX_DTYPE_BF16 ? 2 : 4; }

// Every state view of every param on this rank (the 8-bit params' scales too).
std::string views_of(sx_shard_group_t *g, Views *out) {
    out->clear();
    for (int32_t p = 0; p < kNumParams; ++p) {
        sx_param_info_t info;
        sx_param_info_init(&info, sizeof info);
        sx_status_t st = sx_get_param_info(g, p, &info);
        if (st != SX_OK) return text("param info", st);
        const bool eight = kParams[p].group == 0 && info.numel >= 4096;
        for (const char *slot : kSlots) {
            for (int scale = 0; scale < (eight ? 2 : 1); ++scale) {
                const std::string name = std::string(slot) + (scale ? ".scale" : "");
                sx_view_t v;
                sx_view_init(&v, sizeof v);
                if ((st = sx_state_view(g, p, name.c_str(), &v)) != SX_OK) return text("state view", st);
                ViewBytes &vb = (*out)[std::string(kParams[p].name) + "/" + name];
                vb.dtype = v.dtype;
                vb.begin = info.shard_begin;
                vb.numel = v.numel;
                if (v.numel) vb.bytes.assign(static_cast<const char *>(v.data), v.numel * dtype_size(v.dtype));
                const uint64_t n = info.shard_end - info.shard_begin;
                const int32_t want = scale ? SX_DTYPE_F32
                                     : eight ? SX_DTYPE_U8
                                     : kParams[p].group == 1 ? SX_DTYPE_BF16
                                                             : SX_DTYPE_F32;
                if ((v.numel && v.dtype != want) || v.numel != (scale ? n / 256 : n))
                    return "view " + name + " of " + kParams[p].name + ": dtype " + std::to_string(v.dtype) +
                           ", numel " + std::to_string(v.numel) + " (shard " + std::to_string(n) + ")";
            }
        }
    }
    return "";
}

sx_shard_group_t *make_group(int world, int stage, int rank, const std::string &rv, std::string *err) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    // Under SX_SIMULATED_DEVICE (ctest's test_packed_whole_state_simulated), CUDA groups
    // that keep their state in the simulated device's memory.
    const char *simulated = std::getenv("SX_SIMULATED_DEVICE");
    cfg.backend = simulated && *simulated && std::strcmp(simulated, "0") != 0 ? SX_BACKEND_CUDA : SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.stage = stage;
    cfg.num_threads = 1;
    sx_shard_group_t *g = nullptr;
    sx_status_t st = sx_create_shard_group(&cfg, &g);
    if (st != SX_OK) return *err = text("create", st), nullptr;
    *err = sxtest::add_packed_params(g, SX_STATE_8BIT);
    if (err->empty() && (st = sx_finalize(g)) != SX_OK) *err = text("finalize", st);
    return g;
}

// Steps with gradients of rank 0 (the others' are zero), spread so that about half of
// the blocks of exp_avg have their largest magnitude negative.
std::string train(sx_shard_group_t *g, int rank, int steps) {
    for (int s = 0; s < steps; ++s) {
        for (int32_t p = 0; rank == 0 && p < kNumParams; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            sx_status_t st = sx_grad_view(g, p, &v);
            if (st != SX_OK) return text("grad view", st);
            for (uint64_t i = 0; i < v.numel; ++i)
                static_cast<float *>(v.data)[i] = 0.001f * static_cast<float>(static_cast<int>(
                    ((i + 1) * 2654435761u + 31u * static_cast<uint64_t>(p) + 7919u * static_cast<uint64_t>(s)) % 2001) - 1000);
        }
        sx_status_t st = sx_step(g, nullptr, nullptr);
        if (st != SX_OK) return text("step", st);
    }
    return "";
}

// The slot's map: exp_avg signed, exp_avg_sq unsigned (never negative).
const float *map_of(const std::string &slot) {
    return slot == "exp_avg_sq" ? sx::optim::kUnsignedMap : sx::optim::kSignedMap;
}

// What the views of one rank hold, decoded as the step decodes: the param's elements
// [begin, begin + numel) of each slot must equal the gathered whole values.
void check_views_decode_to(const Views &views, const Whole &whole, const std::string &tag) {
    for (const PackedDef &p : kParams) {
        for (const char *slot : kSlots) {
            const ViewBytes &vb = views.at(std::string(p.name) + "/" + slot);
            const std::vector<float> &all = whole.tensors.at(p.name).at(slot);
            std::vector<float> decoded(vb.numel);
            if (vb.dtype == SX_DTYPE_U8) {
                const ViewBytes &sc = views.at(std::string(p.name) + "/" + slot + ".scale");
                const float *scales = reinterpret_cast<const float *>(sc.bytes.data());
                for (uint64_t b = 0; b < vb.numel / 256; ++b)
                    sx::optim::decode_block(reinterpret_cast<const uint8_t *>(vb.bytes.data()) + b * 256, 256, scales[b],
                                            map_of(slot), decoded.data() + b * 256);
            } else if (vb.dtype == SX_DTYPE_BF16) {
                const uint16_t *h = reinterpret_cast<const uint16_t *>(vb.bytes.data());
                for (uint64_t i = 0; i < vb.numel; ++i) decoded[i] = sx::half::bf16_to_f32(h[i]);
            } else if (vb.numel) {
                std::memcpy(decoded.data(), vb.bytes.data(), vb.numel * 4);
            }
            if (vb.numel && std::memcmp(decoded.data(), all.data() + vb.begin, vb.numel * 4) != 0)
                fail_msg("%s: %s/%s: the gathered values are not the view's decoded", tag.c_str(), p.name, slot);
        }
    }
}

// Blocks of "a"'s exp_avg on this rank whose largest magnitude is negative: no code
// reaches the map's 1.0 (255) but the scale is not the clip of a zero block. They decode
// that element to -0.99297 * scale (the signed map's lowest entry), and encode_block
// alone would not give them back.
int negative_blocks(const Views &views) {
    const std::string &codes = views.at("a/exp_avg").bytes;
    const float *scales = reinterpret_cast<const float *>(views.at("a/exp_avg.scale").bytes.data());
    int count = 0;
    for (size_t b = 0; b < codes.size() / 256; ++b)
        count += scales[b] > 1e-12f && codes.substr(b * 256, 256).find('\xff') == std::string::npos;
    return count;
}

bool same_values(const Whole &x, const Whole &y) {
    if (x.steps != y.steps || x.tensors.size() != y.tensors.size()) return false;
    for (const auto &p : x.tensors)
        for (const auto &t : p.second) {
            const std::vector<float> &other = y.tensors.at(p.first).at(t.first);
            if (other.size() != t.second.size() || std::memcmp(other.data(), t.second.data(), other.size() * 4) != 0)
                return false;
        }
    return true;
}

void test_gather_scatter_gather_is_exact(void **) {
    for (int world = 1; world <= 3; ++world) {
        for (int stage = 1; stage <= 3; ++stage) {
            const std::string tag = "w" + std::to_string(world) + "s" + std::to_string(stage);
            const std::string rv = "local://packed-whole-" + tag + "-" + std::to_string(getpid());
            Whole first, second;
            std::vector<Views> before(world), after(world);
            const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
                std::string e;
                sx_shard_group_t *g = make_group(world, stage, rank, rv, &e);
                if (e.empty()) e = train(g, rank, 3);
                if (e.empty()) e = views_of(g, &before[rank]);
                sx_status_t st = SX_OK;
                if (e.empty() && (st = sx_gather_optim_state(g, 0, keep, rank == 0 ? &first : nullptr)) != SX_OK)
                    e = text("gather", st);
                if (e.empty() && (st = sx_scatter_optim_state(g, 0, give, rank == 0 ? &first : nullptr)) != SX_OK)
                    e = text("scatter", st);
                if (e.empty()) e = views_of(g, &after[rank]);
                if (e.empty() && (st = sx_gather_optim_state(g, 0, keep, rank == 0 ? &second : nullptr)) != SX_OK)
                    e = text("second gather", st);
                if (e.empty()) e = train(g, rank, 1);  // the group steps on what it took
                sx_destroy_shard_group(g);
                return e;
            });
            if (!err.empty()) fail_msg("%s: %s", tag.c_str(), err.c_str());
            int negative = 0;
            for (int r = 0; r < world; ++r) {
                negative += negative_blocks(before[r]);
                check_views_decode_to(before[r], first, tag);
                for (const auto &v : before[r]) {
                    const ViewBytes &w = after[r].at(v.first);
                    if (v.second.dtype != w.dtype || v.second.bytes != w.bytes)
                        fail_msg("%s rank %d: %s changed in gather, scatter", tag.c_str(), r, v.first.c_str());
                }
            }
            assert_true(same_values(first, second));
            assert_true(negative > 0);
            // Trained: the 8-bit slots hold more than zeros (else the test proves little).
            const std::vector<float> &m = first.tensors.at("a").at("exp_avg");
            assert_true(std::any_of(m.begin(), m.end(), [](float x) { return x != 0.0f; }));
        }
    }
}

// A value for element i of a tensor: spread over many magnitudes, a few blocks all zero,
// never negative where the slot is not.
float arbitrary(uint64_t i, bool nonnegative, int salt) {
    if ((i / 256) % 7 == 3) return 0.0f;
    const int k = static_cast<int>((i * 2654435761u + static_cast<uint64_t>(salt) * 40503u) % 20001) - 10000;
    const float x = static_cast<float>(k) * 1e-4f * static_cast<float>(1 + (i % 13)) * (i % 5 == 0 ? 1e-6f : 1.0f);
    return nonnegative ? (x < 0 ? -x : x) : x;
}

sx_status_t give_arbitrary(sx_param_state_t *st, void *) {
    for (int32_t t = 0; t < st->num_tensors; ++t) {
        const bool nonneg = std::strcmp(st->tensor_names[t], "exp_avg_sq") == 0;
        for (uint64_t i = 0; i < st->tensor_numels[t]; ++i) st->tensors[t][i] = arbitrary(i, nonneg, st->param * 3 + t);
    }
    st->step = 5;
    return SX_OK;
}

void test_scatter_encodes_as_the_reference(void **) {
    for (int world : {2, 3}) {
        const int stage = world == 2 ? 3 : 1;
        const std::string tag = "w" + std::to_string(world);
        const std::string rv = "local://packed-scatter-" + tag + "-" + std::to_string(getpid());
        std::vector<Views> views(world), again(world);
        Whole whole;
        const std::string err = sxtest::run_ranks(world, [&](int rank) -> std::string {
            std::string e;
            sx_shard_group_t *g = make_group(world, stage, rank, rv, &e);
            sx_status_t st = SX_OK;
            if (e.empty() && (st = sx_scatter_optim_state(g, world - 1, give_arbitrary, nullptr)) != SX_OK)
                e = text("scatter", st);
            if (e.empty()) e = views_of(g, &views[rank]);
            // Gathered and scattered again: the same bytes.
            if (e.empty() && (st = sx_gather_optim_state(g, 0, keep, rank == 0 ? &whole : nullptr)) != SX_OK)
                e = text("gather", st);
            if (e.empty() && (st = sx_scatter_optim_state(g, 0, give, rank == 0 ? &whole : nullptr)) != SX_OK)
                e = text("scatter again", st);
            if (e.empty()) e = views_of(g, &again[rank]);
            sx_destroy_shard_group(g);
            return e;
        });
        if (!err.empty()) fail_msg("%s: %s", tag.c_str(), err.c_str());
        int negative = 0;
        for (int r = 0; r < world; ++r) {
            check_views_decode_to(views[r], whole, tag);
            for (const auto &v : views[r])
                if (v.second.bytes != again[r].at(v.first).bytes)
                    fail_msg("%s rank %d: %s changed in gather, scatter", tag.c_str(), r, v.first.c_str());
            negative += negative_blocks(views[r]);
        }
        assert_true(negative > 0);
        for (int r = 0; r < world; ++r) {
            for (int32_t p = 0; p < kNumParams; ++p) {
                for (int t = 0; t < 2; ++t) {
                    const std::string key = std::string(kParams[p].name) + "/" + kSlots[t];
                    const ViewBytes &vb = views[r].at(key);
                    std::vector<float> x(vb.numel);
                    for (uint64_t i = 0; i < vb.numel; ++i) x[i] = arbitrary(vb.begin + i, t == 1, p * 3 + t);
                    std::string want(vb.bytes.size(), '\0');
                    std::string want_scales;
                    if (vb.dtype == SX_DTYPE_U8) {
                        want_scales.resize(vb.numel / 256 * 4);
                        for (uint64_t b = 0; b < vb.numel / 256; ++b) {
                            const float s = sx::optim::encode_block(x.data() + b * 256, 256, map_of(kSlots[t]),
                                                                    reinterpret_cast<uint8_t *>(&want[b * 256]));
                            std::memcpy(&want_scales[b * 4], &s, 4);
                        }
                        if (views[r].at(key + ".scale").bytes != want_scales)
                            fail_msg("%s rank %d: %s's scales are not the reference's", tag.c_str(), r, key.c_str());
                    } else if (vb.dtype == SX_DTYPE_BF16) {
                        for (uint64_t i = 0; i < vb.numel; ++i) {
                            const uint16_t h = sx::half::f32_to_bf16(x[i]);
                            std::memcpy(&want[i * 2], &h, 2);
                        }
                    } else if (vb.numel) {
                        std::memcpy(&want[0], x.data(), vb.numel * 4);
                    }
                    if (vb.bytes != want) fail_msg("%s rank %d: %s is not the reference's", tag.c_str(), r, key.c_str());
                }
            }
        }
    }
}

// The names a view takes: "<slot>.scale" only for an 8-bit param's slots, and an unknown
// name's error lists them.
void test_view_names(void **) {
    std::string e;
    sx_shard_group_t *g = make_group(1, 1, 0, "local://packed-names-" + std::to_string(getpid()), &e);
    assert_true(e.empty());
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    assert_int_equal(sx_state_view(g, 2, "exp_avg.scale", &v), SX_ERR_INVALID_ARGUMENT);  // "small": fp32
    assert_non_null(std::strstr(sx_last_error_message(), "holds: exp_avg, exp_avg_sq"));
    assert_int_equal(sx_state_view(g, 3, "exp_avg.scale", &v), SX_ERR_INVALID_ARGUMENT);  // "c": bf16
    assert_int_equal(sx_state_view(g, 0, "master.scale", &v), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "exp_avg, exp_avg.scale, exp_avg_sq, exp_avg_sq.scale"));
    assert_int_equal(sx_state_view(g, 0, "exp_avg_sq.scale", &v), SX_OK);
    assert_int_equal(v.dtype, SX_DTYPE_F32);
    assert_int_equal(v.numel, 64 * 128 / 256);
    sx_destroy_shard_group(g);
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gather_scatter_gather_is_exact),
        cmocka_unit_test(test_scatter_encodes_as_the_reference),
        cmocka_unit_test(test_view_names),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
