// The units' memory part on its own (core/units.h), one rank on the host: the buffers
// sx_finalize allocates per unit and dtype (fp32 params, bf16 params with fp32 masters,
// stage 3's own shard); a unit that mixes dtypes refused; the optimizer state a mask
// needs (AdamW 2 slots, SGD with momentum 1, frozen units none, an accumulator for
// 16-bit gradients) and kept when the mask drops it; masters derived from the bf16
// params and rounded back; the step's segments (frozen params skipped, the hyper and the
// step count each param's optimizer wants); a unit's sum of squares; gradients zeroed.
#include <cmath>
#include <cstring>
#include <deque>
#include <vector>

#include "base/half.h"
#include "core/units.h"
#include "optim/thread_pool.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

using sx::core::Layout;
using sx::core::ParamSpec;
using sx::core::Units;

namespace {

struct Fixture {
    sx::optim::ThreadPool pool{1};
    std::unique_ptr<sx::core::DeviceOps> ops = sx::core::make_host_ops(&pool);
    Layout layout;
    std::deque<ParamSpec> params;
    std::vector<sx::core::ParamGroup> groups;
    std::vector<uint8_t> applied;
    Units units;

    // Unit 0: "a" (10) and "b" (7), fp32, AdamW; unit 1: "c" (9), bf16, SGD with momentum.
    explicit Fixture(int stage) {
        sx::core::ParamGroup adamw, sgd;
        adamw.hyper.kind = sx::optim::Kind::kAdamW;
        sgd.hyper.kind = sx::optim::Kind::kSgd;
        sgd.hyper.momentum = 0.9;
        groups = {adamw, sgd};
        const struct {
            const char *name;
            uint64_t numel;
            int32_t dtype, group, unit;
        } ps[] = {{"a", 10, SX_DTYPE_F32, 0, 0}, {"b", 7, SX_DTYPE_F32, 0, 0}, {"c", 9, SX_DTYPE_BF16, 1, 1}};
        std::vector<sx::core::ParamShape> shapes;
        for (const auto &p : ps) {
            ParamSpec s;
            s.name = p.name;
            s.numel = p.numel;
            s.shape = {static_cast<int64_t>(p.numel)};
            s.dtype = p.dtype;
            s.group = p.group;
            s.unit = p.unit;
            params.push_back(s);
            shapes.push_back({p.unit, p.numel, static_cast<uint32_t>(sx::core::dtype_size(p.dtype))});
        }
        applied.assign(params.size(), 0);
        assert_true(Layout::build(shapes, 1, 64, &layout).ok());
        Units::Settings s;
        s.stage = stage;
        units.configure(s, ops.get(), nullptr, nullptr, {&layout, &params, &groups, &applied});
        std::vector<Units::Unit> added;
        assert_true(units.check_dtypes().ok());
        assert_true(units.allocate(layout, 0, &added).ok());
        units.append(&added);
    }
};

void test_allocation_and_state(void **) {
    Fixture f(2);
    assert_int_equal(f.units.size(), 2);
    const uint64_t padded0 = f.layout.units()[0].padded_numel;
    assert_true(f.units[0].params.size() == padded0 * 4 && f.units[0].grads.size() == padded0 * 4);
    assert_true(f.units[0].master.empty() && f.units[1].master.size() == f.layout.units()[1].shard_numel * 4);
    assert_true(f.units[1].params.size() == f.layout.units()[1].padded_numel * 2);
    // Stage 3 keeps this rank's shard of the params only.
    Fixture s3(3);
    assert_true(s3.units[0].params.empty() && s3.units[0].own.size() == s3.layout.units()[0].shard_numel * 4);
    // The mask {a, c}: unit 0 gets AdamW's two slots, unit 1 SGD's momentum and, for its
    // bf16 gradients, the fp32 accumulator.
    assert_true(f.units.prepare({1, 0, 1}, false).ok());
    assert_int_equal(f.units[0].state_slots, 2);
    assert_int_equal(f.units[1].state_slots, 1);
    assert_false(f.units[1].accum.empty());
    assert_true(f.units[0].trainable && f.units[1].trainable);
    // Freezing unit 1 keeps its state (unfreezing resumes it).
    assert_true(f.units.prepare({1, 1, 0}, false).ok());
    assert_false(f.units[1].trainable);
    assert_int_equal(f.units[1].state_slots, 1);
    uint64_t params = 0, grads = 0, optimizer = 0, unsharded = 0, device = 0;
    f.units.count_bytes(&params, &grads, &optimizer, &unsharded, &device);
    assert_true(optimizer == (2 * f.layout.units()[0].shard_numel + 2 * f.layout.units()[1].shard_numel) * 4);
    assert_int_equal(device, 0);  // the host's
    // A unit that mixes dtypes is refused, naming both params.
    f.params[1].dtype = SX_DTYPE_F16;
    const sx::Status bad = f.units.check_dtypes();
    assert_int_equal(bad.code(), SX_ERR_INVALID_ARGUMENT);
    assert_true(bad.message().find("'a' is fp32 but param 'b' is fp16") != std::string::npos);
}

void test_masters_segments_and_norm(void **) {
    Fixture f(2);
    assert_true(f.units.prepare({1, 1, 1}, false).ok());
    for (size_t i = 0; i < f.applied.size(); ++i) f.applied[i] = 1;  // as the group does
    // bf16 params 0.5 * i: the masters take them exactly, and round back to them.
    uint16_t *c = f.units[1].params.as<uint16_t>();
    for (int i = 0; i < 9; ++i) c[i] = sx::half::f32_to_bf16(0.5f * static_cast<float>(i));
    assert_true(f.units.ensure_masters().ok());
    const float *m = f.units[1].master.as<float>();
    for (int i = 0; i < 9; ++i) assert_true(m[i] == 0.5f * static_cast<float>(i));
    f.units[1].master.as<float>()[3] = 2.25f;
    assert_true(f.units.masters_to_params().ok());
    assert_true(sx::half::bf16_to_f32(c[3]) == 2.25f);
    // Segments: a and b of unit 0 (AdamW: step counts + 1), c of unit 1 (SGD: momentum
    // steps + 1, its params rounded into bf16 in the same pass).
    f.params[2].step = 5;
    f.params[2].momentum_steps = 3;
    std::vector<float> g0(f.layout.units()[0].padded_numel, 1.0f), g1(f.layout.units()[1].padded_numel, 2.0f);
    const std::vector<float *> reduced = {g0.data(), g1.data()};
    std::vector<sx::optim::Segment> segs = f.units.segments(reduced);
    assert_int_equal(segs.size(), 3);
    assert_true(segs[0].n == 10 && segs[1].n == 7 && segs[2].n == 9);
    assert_true(segs[0].step == 1 && segs[2].step == 4);
    assert_true(segs[2].compute_dtype == SX_DTYPE_BF16 && segs[2].state[0] != nullptr);
    assert_true(f.units.segments(reduced, 1).size() == 2);
    // b frozen: its segment goes, and unit 0's sum of squares is a's alone: 10 x (1 x 0.5)^2.
    f.applied[1] = 0;
    assert_true(f.units.segments(reduced).size() == 2);
    double sumsq = 0.0;
    assert_true(f.units.sum_of_squares(0, g0.data(), 0.5f, &sumsq).ok());
    assert_true(std::fabs(sumsq - 2.5) < 1e-12);
    // Zeroing the gradients (nothing zeroed by an update): every byte.
    std::memset(f.units[0].grads.data(), 0x7f, f.units[0].grads.size());
    f.units.mark_zeroed_by_update(false, reduced);
    assert_true(f.units.zero_grads(reduced).ok());
    for (size_t i = 0; i < f.units[0].grads.size(); ++i) assert_int_equal(f.units[0].grads.as<uint8_t>()[i], 0);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allocation_and_state),
        cmocka_unit_test(test_masters_segments_and_norm),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
