// Packed optimizer state (optim/state_codec.h): the maps, the block encoder, and every
// kernel flavour stepping bf16 and 8-bit slots bit for bit as the scalar reference does.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "optim/state_codec.h"
#include "optim/thread_pool.h"
#include "optim_test_util.h"
#include "sx_cmocka.h"

using namespace sx::optim;
using namespace sx::optim::test;
namespace in = sx::optim::internal;

namespace {

float ulps_from(float f, int n) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    // Floats of one sign are ordered as their bits: n ulps up in magnitude for n > 0.
    b = static_cast<uint32_t>(static_cast<int64_t>(b) + n);
    std::memcpy(&f, &b, 4);
    return f;
}

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

void test_maps(void **) {
    for (int i = 0; i < 255; ++i) {
        assert_true(kSignedMap[i] < kSignedMap[i + 1]);
        assert_true(kUnsignedMap[i] < kUnsignedMap[i + 1]);
    }
    // torchao's: the signed map has 0 at 127 and 1 at 255 but no -1; the unsigned one 0
    // and 1 at its ends.
    assert_true(kSignedMap[127] == 0.0f && kSignedMap[255] == 1.0f && kSignedMap[0] > -1.0f);
    assert_true(kUnsignedMap[0] == 0.0f && kUnsignedMap[255] == 1.0f);
    assert_int_equal(bits(kSignedMap[0]), bits(-0x1.fc6666p-1f));
    assert_int_equal(bits(kUnsignedMap[1]), bits(0x1.5cf754p-22f));
    // The kernels' index of each map holds at most one entry per bucket.
    assert_true(code_lut_exact());
}

// Every code is the nearest entry of the map to x / scale, ties to the larger.
void check_nearest(const float *x, size_t n, const float *map) {
    uint8_t codes[kQuantBlock];
    const float scale = encode_block(x, n, map, codes);
    float absmax = 0.0f;
    for (size_t i = 0; i < n; ++i) absmax = std::fmax(absmax, std::fabs(x[i]));
    assert_int_equal(bits(scale), bits(absmax < 1e-12f ? 1e-12f : absmax));
    for (size_t i = 0; i < n; ++i) {
        const float y = x[i] / scale;
        const int c = codes[i];
        const float d = std::fabs(y - map[c]);
        if (c > 0) assert_true(d < std::fabs(y - map[c - 1]) || map[c - 1] > y);
        if (c < 255) assert_true(d <= std::fabs(y - map[c + 1]) || (map[c + 1] - y) == (y - map[c]));
    }
    float back[kQuantBlock];
    decode_block(codes, n, scale, map, back);
    for (size_t i = 0; i < n; ++i) assert_int_equal(bits(back[i]), bits(map[codes[i]] * scale));
}

void test_encode_takes_the_nearest_code(void **) {
    Rng rng(7);
    float x[kQuantBlock];
    for (int round = 0; round < 50; ++round) {
        // A wide dynamic range: the map is dense near 0.
        for (size_t i = 0; i < kQuantBlock; ++i)
            x[i] = rng.uniform(-1.0f, 1.0f) * std::pow(10.0f, rng.uniform(-7.0f, 0.0f));
        check_nearest(x, kQuantBlock, kSignedMap);
        for (size_t i = 0; i < kQuantBlock; ++i) x[i] = std::fabs(x[i]);
        check_nearest(x, kQuantBlock, kUnsignedMap);
    }
    // The midpoint between two codes goes to the larger: with scale 1 (x[0] = 1).
    x[0] = 1.0f;
    x[1] = kSignedMap[200] + (kSignedMap[201] - kSignedMap[200]) * 0.5f;
    uint8_t codes[3];
    encode_block(x, 2, kSignedMap, codes);
    assert_int_equal(codes[1], 201);
    // All zeros: the scale floor 1e-12 and the code of 0; NaN: a NaN scale.
    const float zeros[3] = {0.0f, -0.0f, 0.0f};
    assert_int_equal(bits(encode_block(zeros, 3, kSignedMap, codes)), bits(1e-12f));
    assert_int_equal(codes[0], 127);
    const float with_nan[3] = {1.0f, NAN, 2.0f};
    assert_true(std::isnan(encode_block(with_nan, 3, kSignedMap, codes)));
}

// encode_decoded_block gives back the codes and scale a block was decoded from: random
// codes under scales over a wide range (with the signed map about half the blocks have
// no code of the map's 1.0, so their extreme decodes to -0.99297 * scale, which
// encode_block alone turns into a smaller scale), a block never updated (scale 0, codes
// 0), a NaN block; and values no decoding gave get encode_block's codes and scale.
void test_decoded_blocks_encode_back(void **) {
    Rng rng(11);
    uint8_t codes[kQuantBlock], again[kQuantBlock], plain[kQuantBlock];
    float x[kQuantBlock];
    int plain_differs = 0;
    for (int round = 0; round < 400; ++round) {
        const bool nonnegative = round % 2 == 1;
        const float *map = nonnegative ? kUnsignedMap : kSignedMap;
        for (size_t i = 0; i < kQuantBlock; ++i) codes[i] = static_cast<uint8_t>(rng.uniform(0.0f, 255.99f));
        // As an encoding leaves a block: the element that set the scale took an end of the
        // map (code 255, 1.0; or, signed, code 0, -0.99297), and the scale is at least 1e-12.
        if (round % 4 == 0) std::replace(codes, codes + kQuantBlock, uint8_t{255}, uint8_t{254});
        codes[static_cast<size_t>(round) % kQuantBlock] = round % 4 == 0 ? 0 : 255;
        float scale = std::pow(10.0f, rng.uniform(-12.0f, 6.0f));
        if (round == 8) scale = 0.0f, std::fill(codes, codes + kQuantBlock, uint8_t{0});  // never updated
        if (round == 10) scale = NAN, std::fill(codes, codes + kQuantBlock, uint8_t{0});  // as a NaN step leaves it
        decode_block(codes, kQuantBlock, scale, map, x);
        const float s = encode_decoded_block(x, kQuantBlock, map, again);
        assert_int_equal(bits(s), bits(scale));
        assert_memory_equal(again, codes, kQuantBlock);
        plain_differs += bits(encode_block(x, kQuantBlock, map, plain)) != bits(scale);
    }
    assert_true(plain_differs >= 50);  // the blocks without code 255 under the signed map
    // Values no decoding gave: encode_block's.
    for (int round = 0; round < 50; ++round) {
        for (size_t i = 0; i < kQuantBlock; ++i)
            x[i] = rng.uniform(-1.0f, 1.0f) * std::pow(10.0f, rng.uniform(-7.0f, 0.0f));
        const float s = encode_decoded_block(x, kQuantBlock, kSignedMap, again);
        assert_int_equal(bits(s), bits(encode_block(x, kQuantBlock, kSignedMap, plain)));
        assert_memory_equal(again, plain, kQuantBlock);
    }
}

// A flavour's encode8 of x gives encode_block's scale and codes (left in `got`, if given).
float expect_reference_codes(const in::KernelTable &k, const float *x, size_t n, const float *map,
                             uint8_t *got = nullptr) {
    uint8_t mine[kQuantBlock], want[kQuantBlock];
    if (!got) got = mine;
    const float s_got = k.encode8(x, n, map, code_lut(map), got), s_want = encode_block(x, n, map, want);
    assert_int_equal(bits(s_got), bits(s_want));
    for (size_t i = 0; i < n; ++i)
        if (got[i] != want[i])
            fail_msg("%s: x[%zu] = %a (scale %a): code %d, the reference's %d", k.name, i, static_cast<double>(x[i]),
                     static_cast<double>(s_want), got[i], want[i]);
    return s_got;
}

// Every flavour's block encoder gives encode_block's scale and codes on awkward blocks:
// the map's own entries and the midpoints between them (times the scale), both zeros,
// magnitudes far below the smallest entry, denormals, NaN, and wide random ranges.
void test_flavours_encode_as_the_reference(void **) {
    Rng rng(11);
    for (Isa isa : runnable_isas()) {
        const in::KernelTable &k = in::kernels_for(in::resolve_isa(isa));
        for (const float *map : {kSignedMap, kUnsignedMap}) {
            for (int round = 0; round < 64; ++round) {
                float x[kQuantBlock];
                const float scale = round % 4 == 0 ? 1.0f : rng.uniform(1e-6f, 3.0f);
                for (size_t i = 0; i < kQuantBlock; ++i) {
                    const int c = static_cast<int>(rng.next() % 255);
                    switch ((i + static_cast<size_t>(round)) % 8) {
                    case 0: x[i] = map[c] * scale; break;
                    case 1: x[i] = (map[c] + (map[c + 1] - map[c]) * 0.5f) * scale; break;
                    case 2: x[i] = i % 2 ? 0.0f : -0.0f; break;
                    case 3: x[i] = rng.uniform(-1.0f, 1.0f) * 1e-9f * scale; break;
                    case 4: x[i] = rng.uniform(-1.0f, 1.0f) * 1e-40f; break;  // denormal
                    default: x[i] = rng.uniform(-1.0f, 1.0f) * std::pow(10.0f, rng.uniform(-8.0f, 0.0f)) * scale;
                    }
                    if (map == kUnsignedMap) x[i] = std::fabs(x[i]);
                }
                x[0] = scale;  // the block's absmax: y = x / scale is exact where scale is 1
                if (round % 16 == 5) x[1 + rng.next() % (kQuantBlock - 1)] = NAN;
                if (round % 16 == 9) std::fill(x, x + kQuantBlock, 0.0f);  // the scale's floor
                const size_t n = round % 8 == 7 ? 1 + rng.next() % (kQuantBlock - 1) : kQuantBlock;  // tails
                expect_reference_codes(k, x, n, map);
            }
        }
    }
}

// The estimate some encoders take in place of a search (state_codec.h's FastCodeTables)
// holds for both maps, and every flavour's encoder gives the reference's codes for every
// float within 48 ulps of each midpoint between entries (where a code changes; both signs),
// times scales that make x / scale exact and inexact, and the decoders give map * scale.
void test_flavours_encode_near_every_threshold(void **) {
    for (const float *map : {kSignedMap, kUnsignedMap}) {
        const FastCodeTables &ft = fast_code_tables(map);
        assert_true(ft.exact);
        assert_int_equal(ft.mirror, map == kSignedMap ? 254 : 0);
    }
    Rng rng(5);
    for (Isa isa : runnable_isas()) {
        const in::KernelTable &k = in::kernels_for(in::resolve_isa(isa));
        for (const float *map : {kSignedMap, kUnsignedMap}) {
            std::vector<float> ys;
            for (int c = 0; c < 255; ++c) {
                const float mid = map[c] + (map[c + 1] - map[c]) * 0.5f;
                for (int u = -48; u <= 48; ++u) ys.push_back(ulps_from(mid, u));
            }
            for (float scale : {1.0f, 0.37f, 3.1e-5f, 1.7e3f}) {
                for (size_t b = 0; b < ys.size(); b += kQuantBlock - 1) {
                    float x[kQuantBlock];
                    x[0] = scale * (rng.next() % 2 ? 1.0f : -1.0f);  // |y| <= 1: the scale is this
                    if (map == kUnsignedMap) x[0] = scale;
                    const size_t n = std::min(kQuantBlock, ys.size() - b + 1);
                    for (size_t i = 1; i < n; ++i) x[i] = ys[b + i - 1] * scale;
                    uint8_t got[kQuantBlock];
                    const float s_got = expect_reference_codes(k, x, n, map, got);
                    float back[kQuantBlock], ref[kQuantBlock];
                    k.decode8(got, n, s_got, map, back);
                    decode_block(got, n, s_got, map, ref);
                    for (size_t i = 0; i < n; ++i) assert_int_equal(bits(back[i]), bits(ref[i]));
                }
            }
        }
    }
}

// The reference's codes of ys (each of magnitude at most 1: x / 1.0 is exact).
std::vector<uint8_t> reference_codes(const std::vector<float> &ys, const float *map) {
    std::vector<uint8_t> out(ys.size());
    float x[kQuantBlock];
    uint8_t codes[kQuantBlock];
    for (size_t b = 0; b < ys.size(); b += kQuantBlock - 1) {
        const size_t n = std::min(kQuantBlock - 1, ys.size() - b);
        x[0] = 1.0f;
        std::copy(ys.begin() + static_cast<ptrdiff_t>(b), ys.begin() + static_cast<ptrdiff_t>(b + n), x + 1);
        assert_true(encode_block(x, n + 1, map, codes) == 1.0f);
        std::copy(codes + 1, codes + 1 + n, out.begin() + static_cast<ptrdiff_t>(b));
    }
    return out;
}

// The AVX2 encoder's estimate (state_codec.h's MagnitudeIndex) is the reference's code, or
// says it is near a threshold, for every magnitude within 2 ulps (the error of |x| times
// the scale's reciprocal against x / scale) of every float near a threshold or a bucket's
// edge, and of every 251st float in [0, 1], both signs; and it says so of both maps.
void test_magnitude_index_estimates_the_reference(void **) {
    for (const float *map : {kSignedMap, kUnsignedMap}) {
        const MagnitudeIndex &mi = magnitude_index(map);
        assert_true(mi.exact);
        assert_int_equal(mi.mirror, map == kSignedMap ? 254 : 0);
        std::vector<uint32_t> around;  // floats' bits worth a close look
        for (int c = 0; c < 255; ++c) around.push_back(bits(map[c] + (map[c + 1] - map[c]) * 0.5f));
        for (uint32_t k = 1; k < kMagnitudeBuckets; ++k) around.push_back((k + kMagnitudeKeyBase) << 16);
        std::vector<float> ys;
        for (uint32_t a : around)
            for (int u = -24; u <= 24; ++u) ys.push_back(std::fabs(ulps_from(from_bits(a), u)));
        for (uint32_t a = 0; a <= bits(1.0f); a += 251) ys.push_back(from_bits(a));
        size_t near_count = 0;
        for (int negative = 0; negative < 2; ++negative) {
            std::vector<float> signed_ys(ys);
            for (float &y : signed_ys) y = std::fmin(y, 1.0f) * (negative ? -1.0f : 1.0f);
            const std::vector<uint8_t> want = reference_codes(signed_ys, map);
            for (size_t i = 0; i < signed_ys.size(); ++i) {
                const uint32_t a = bits(std::fabs(signed_ys[i]));
                for (int u = -2; u <= 2; ++u) {
                    if (u < 0 && a < static_cast<uint32_t>(-u)) continue;
                    bool near;
                    const int got = magnitude_estimate(mi, a + static_cast<uint32_t>(u), negative, &near);
                    near_count += near;
                    if (!near && got != want[i])
                        fail_msg("map %s: y = %a, estimate from %d ulps away %d, the reference's %d",
                                 map == kSignedMap ? "signed" : "unsigned", static_cast<double>(signed_ys[i]), u, got,
                                 want[i]);
                }
            }
        }
        assert_true(near_count > 0 && near_count < ys.size() / 10);  // the guard is narrow
    }
}

float widen(uint16_t h) {
    const uint32_t x = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}

// One segment's packed slots: codes and scales (8-bit) or bf16 values.
struct Packed {
    int32_t dtype;
    size_t n;
    std::vector<uint8_t> codes[kMaxStateSlots];
    std::vector<float> scales[kMaxStateSlots];
    std::vector<uint16_t> wide16[kMaxStateSlots];
    Packed(int32_t d, size_t count) : dtype(d), n(count) {
        for (int k = 0; k < kMaxStateSlots; ++k) {
            codes[k].assign(n, 0);
            scales[k].assign(n / kQuantBlock + 1, 0.0f);
            wide16[k].assign(n, 0);
        }
    }
    void point(Segment *s) {
        s->state_dtype = dtype;
        for (int k = 0; k < kMaxStateSlots; ++k) {
            s->state[k] = nullptr;
            s->state16[k] = dtype == SX_STATE_BF16 ? wide16[k].data() : nullptr;
            s->codes[k] = dtype == SX_STATE_8BIT ? codes[k].data() : nullptr;
            s->scales[k] = dtype == SX_STATE_8BIT ? scales[k].data() : nullptr;
        }
    }
    // Random state of the ranges fill() gives, packed.
    void randomize(const Hyper &h, Rng &rng) {
        std::vector<float> v(n);
        for (int k = 0; k < state_slots(h); ++k) {
            const bool nonneg = state_slot_nonnegative(h, k);
            for (size_t i = 0; i < n; ++i) v[i] = nonneg ? rng.uniform(0.001f, 0.01f) : rng.uniform(-0.1f, 0.1f);
            for (size_t i = 0; i < n; ++i) wide16[k][i] = static_cast<uint16_t>(bits(v[i]) >> 16);
            for (size_t b = 0; b < n; b += kQuantBlock)
                scales[k][b / kQuantBlock] = encode_block(v.data() + b, std::min(kQuantBlock, n - b),
                                                          nonneg ? kUnsignedMap : kSignedMap, codes[k].data() + b);
        }
    }
    size_t mismatches_with(const Packed &o) const {
        size_t bad = 0;
        for (int k = 0; k < kMaxStateSlots; ++k) {
            bad += codes[k] != o.codes[k];
            for (size_t i = 0; i < n; ++i)  // any NaN matches any NaN, as Guarded::same
                bad += !Guarded::same(widen(wide16[k][i]), widen(o.wide16[k][i]));
            for (size_t i = 0; i < scales[k].size(); ++i) bad += bits(scales[k][i]) != bits(o.scales[k][i]);
        }
        return bad;
    }
};

// Steps one packed segment with the reference and with every flavour, split across a
// pool's threads at every 256 elements, from fresh state (steps 1-3) and from random
// state (steps 10-11): params and packed slots equal bit for bit.
void check_packed(const Hyper &h, int32_t dtype, size_t n, ThreadPool *pool) {
    for (Isa isa : runnable_isas()) {
        const in::KernelTable &k = in::kernels_for(in::resolve_isa(isa));
        Rng rng(n * 31 + static_cast<uint64_t>(dtype));
        std::vector<float> param(n), grad(n), param_ref(n);
        Packed got(dtype, n), ref(dtype, n);
        for (int phase = 0; phase < 2; ++phase) {
            for (size_t i = 0; i < n; ++i) param[i] = param_ref[i] = rng.uniform(-1.0f, 1.0f);
            if (phase == 1) {
                got.randomize(h, rng);
                ref = got;
            }
            for (int64_t step = phase ? 10 : 1; step < (phase ? 12 : 4); ++step) {
                for (size_t i = 0; i < n; ++i) grad[i] = rng.uniform(-2.0f, 2.0f);
                // bf16 slots narrow NaN and infinities as the reference does (quiet NaN).
                const bool special = dtype == SX_STATE_BF16 && step == 11;
                if (special) {
                    grad[n / 3] = std::numeric_limits<float>::quiet_NaN();
                    grad[n / 2] = -std::numeric_limits<float>::infinity();
                }
                Segment gs, rs;
                gs.param = param.data();
                rs.param = param_ref.data();
                gs.grad = rs.grad = grad.data();
                gs.n = rs.n = n;
                gs.hyper = rs.hyper = &h;
                gs.step = rs.step = step;
                gs.mu_product = rs.mu_product = mu_product_after(h, step);
                got.point(&gs);
                ref.point(&rs);
                reference_update(rs, 0.5f);
                double sumsq = 0.0;
                in::fused_update_with(k, &gs, 1, 0.5f, pool, 1, &sumsq);
                const size_t bad = mismatches("param", param.data(), param_ref.data(), n) + got.mismatches_with(ref);
                if (bad != 0)
                    fail_msg("%s kind %d state %s wd %g amsgrad %d: n %zu step %lld: %zu mismatches",
                             in::kernels_for(in::resolve_isa(isa)).name, static_cast<int>(h.kind),
                             state_dtype_name(dtype), h.weight_decay, h.amsgrad, n, static_cast<long long>(step), bad);
                if (!special) assert_true(std::fabs(sumsq - sumsq_of_scaled(grad.data(), n, 0.5f)) <= 1e-5 * sumsq);
            }
        }
    }
}

void test_packed_kernels_match_reference(void **) {
    ThreadPool pool(3);
    for (const Hyper &config : all_configs()) {
        for (int32_t dtype : {SX_STATE_BF16, SX_STATE_8BIT}) {
            // (Adam's 8-bit configs are there for their 8-bit formulas, torchao's.)
            if (config.state_dtype == SX_STATE_8BIT && dtype == SX_STATE_BF16) continue;
            Hyper h = config;
            h.state_dtype = dtype;
            for (size_t n : {kQuantBlock * 5, kQuantBlock * 17})
                check_packed(h, dtype, n, &pool);
            if (dtype == SX_STATE_BF16) check_packed(h, dtype, 1001, &pool);  // bf16 has no blocks
        }
    }
}

// The threads' cuts through an 8-bit segment fall between its blocks.
void test_partition_keeps_blocks_whole(void **) {
    Segment segs[2];
    segs[0].n = 1000;
    segs[1].n = kQuantBlock * 40;
    segs[1].state_dtype = SX_STATE_8BIT;
    for (int parts = 2; parts <= 7; ++parts) {
        const std::vector<in::Cut> cuts = in::partition(segs, 2, parts);
        for (const in::Cut &c : cuts)
            if (c.segment == 1) assert_int_equal(c.offset % kQuantBlock, 0);
    }
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_maps),
        cmocka_unit_test(test_encode_takes_the_nearest_code),
        cmocka_unit_test(test_decoded_blocks_encode_back),
        cmocka_unit_test(test_flavours_encode_as_the_reference),
        cmocka_unit_test(test_flavours_encode_near_every_threshold),
        cmocka_unit_test(test_magnitude_index_estimates_the_reference),
        cmocka_unit_test(test_packed_kernels_match_reference),
        cmocka_unit_test(test_partition_keeps_blocks_whole),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
