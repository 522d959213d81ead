// fp16 and bf16 conversions (base/half.h): the scalar functions against the definition
// of round-to-nearest-even (checked from the neighbouring representable values, not
// from a second implementation), exactness of every widening, and the F16C / AVX2
// flavour bit for bit against the scalar one, NaNs included.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/half.h"
#include "sx_cmocka.h"

namespace h = sx::half;
namespace hi = sx::half::internal;

namespace {

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

float widen(int32_t dtype, uint16_t v) { return dtype == SX_DTYPE_F16 ? h::f16_to_f32(v) : h::bf16_to_f32(v); }
uint16_t narrow(int32_t dtype, float f) { return dtype == SX_DTYPE_F16 ? h::f32_to_f16(f) : h::f32_to_bf16(f); }

void test_known_values(void **) {
    assert_int_equal(h::f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(h::f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(h::f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(h::f32_to_f16(65519.99f), 0x7bff);   // below the tie: max finite
    assert_int_equal(h::f32_to_f16(65520.0f), 0x7c00);    // the tie goes to even: infinity
    assert_int_equal(h::f32_to_f16(1e9f), 0x7c00);
    assert_int_equal(h::f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(h::f32_to_f16(0x1p-24f), 0x0001);    // smallest subnormal
    assert_int_equal(h::f32_to_f16(0x1p-25f), 0x0000);    // half of it: tie to even (0)
    assert_int_equal(h::f32_to_f16(0x1.8p-24f), 0x0002);  // 1.5 ulp: tie to even (2)
    assert_int_equal(h::f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(h::f32_to_f16(1.0f + 0x1p-11f), 0x3c00);                // tie, even below
    assert_int_equal(h::f32_to_f16(1.0f + 0x1p-10f + 0x1p-11f), 0x3c02);     // tie, even above
    assert_true(h::f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(h::f16_to_f32(0x3555) == 0.333251953125f);
    assert_int_equal(h::f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(h::f32_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie, even below
    assert_int_equal(h::f32_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie, even above
    assert_int_equal(h::f32_to_bf16(from_bits(0x7f7fffff)), 0x7f80);  // rounds up to infinity
    assert_true(std::isnan(h::f16_to_f32(h::f32_to_f16(NAN))));
    assert_true(std::isnan(h::bf16_to_f32(h::f32_to_bf16(NAN))));
    assert_true(std::isnan(h::bf16_to_f32(h::f32_to_bf16(from_bits(0x7f800001)))));  // NaN with a low payload
}

// Every 16-bit pattern widens exactly and narrows back to itself (NaNs to a NaN).
void test_every_pattern_round_trips(void **) {
    for (int32_t dtype : {SX_DTYPE_F16, SX_DTYPE_BF16}) {
        for (uint32_t v = 0; v <= 0xffff; ++v) {
            const float f = widen(dtype, static_cast<uint16_t>(v));
            if (std::isnan(f)) {
                assert_true(std::isnan(widen(dtype, narrow(dtype, f))));
                continue;
            }
            assert_int_equal(narrow(dtype, f), v);
        }
    }
    // fp16 finite values are what the format says: (-1)^s 2^(e-15) (1 + m/1024), or m 2^-24.
    for (uint32_t v = 0; v < 0x7c00; ++v) {
        const int e = static_cast<int>(v >> 10), m = static_cast<int>(v & 0x3ff);
        const double want = e ? std::ldexp(1.0 + m / 1024.0, e - 15) : std::ldexp(m, -24);
        assert_true(static_cast<double>(h::f16_to_f32(static_cast<uint16_t>(v))) == want);
        assert_true(static_cast<double>(h::f16_to_f32(static_cast<uint16_t>(v | 0x8000))) == -want);
    }
}

// Round to nearest, ties to even, from the definition: no representable value is
// nearer than the result; at a tie the result's last bit is 0.
void check_rne(int32_t dtype, float f) {
    if (std::isnan(f)) return;
    const uint16_t r = narrow(dtype, f);
    const double x = f;
    const uint16_t max_finite = dtype == SX_DTYPE_F16 ? 0x7bff : 0x7f7f;
    const uint16_t mag = r & 0x7fff, sign = r & 0x8000;
    const double got = widen(dtype, r);
    if (std::isinf(got)) {
        // Overflow: |x| is at least halfway between the largest finite value and the next power.
        const double maxv = widen(dtype, max_finite);
        const double ulp = maxv - widen(dtype, max_finite - 1);
        assert_true(std::fabs(x) >= maxv + ulp / 2);
        assert_true((x < 0) == (sign != 0));
        return;
    }
    const double err = std::fabs(x - got);
    for (int d : {-1, 1}) {
        const int nb = static_cast<int>(mag) + d;
        if (nb < 0 || nb > max_finite) continue;
        const double other = widen(dtype, static_cast<uint16_t>(nb | sign));
        const double e2 = std::fabs(x - other);
        assert_true(err <= e2);
        if (err == e2) assert_int_equal(mag & 1, 0);
    }
    if (mag == 0 && x != 0) {  // rounded to zero: not nearer to the smallest value of the other sign
        assert_true(err <= std::fabs(x - widen(dtype, static_cast<uint16_t>(1))));
    }
}

std::vector<float> awkward_floats() {
    std::vector<float> v;
    // A stride through every bit pattern, plus the neighbourhood of each rounding
    // boundary of both formats (ties and one ulp either side) at every exponent.
    for (uint64_t u = 0; u <= 0xffffffffull; u += 65521) v.push_back(from_bits(static_cast<uint32_t>(u)));
    for (uint32_t e = 0; e < 256; ++e) {
        for (uint32_t m : {0x0u, 0x1000u, 0x3000u, 0x8000u, 0x18000u, 0x7fe000u, 0x7ff000u, 0x7fffffu, 0x400000u}) {
            for (int d : {-1, 0, 1}) {
                const uint32_t base = (e << 23) | m;
                const uint32_t u = base + static_cast<uint32_t>(d);
                v.push_back(from_bits(u));
                v.push_back(from_bits(u | 0x80000000u));
            }
        }
    }
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> small(-70000.f, 70000.f);
    for (int i = 0; i < 100000; ++i) v.push_back(small(rng));
    return v;
}

void test_narrowing_is_round_to_nearest_even(void **) {
    const std::vector<float> v = awkward_floats();
    for (int32_t dtype : {SX_DTYPE_F16, SX_DTYPE_BF16})
        for (float f : v) check_rne(dtype, f);
}

// The bulk functions of every flavour equal the scalar ones bit for bit, over awkward
// lengths and offsets (vector bodies and scalar tails).
void check_flavour(const hi::Table &t) {
    const std::vector<float> v = awkward_floats();
    std::vector<uint16_t> all16(65536);
    for (uint32_t i = 0; i < 65536; ++i) all16[i] = static_cast<uint16_t>(i);
    for (int32_t dtype : {SX_DTYPE_F16, SX_DTYPE_BF16}) {
        std::vector<uint16_t> out(v.size());
        t.from_f32(dtype, v.data(), out.data(), v.size());
        for (size_t i = 0; i < v.size(); ++i) assert_int_equal(out[i], narrow(dtype, v[i]));
        std::vector<float> wide(all16.size());
        t.to_f32(dtype, all16.data(), wide.data(), all16.size());
        for (size_t i = 0; i < all16.size(); ++i) assert_int_equal(bits(wide[i]), bits(widen(dtype, all16[i])));
        for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(31), size_t(1025)}) {
            for (size_t off : {size_t(0), size_t(3)}) {
                std::vector<uint16_t> o(n + 2, 0xabcd);
                t.from_f32(dtype, v.data() + off, o.data() + 1, n);
                assert_int_equal(o[0], 0xabcd);
                assert_int_equal(o[n + 1], 0xabcd);  // nothing written past the end
                for (size_t i = 0; i < n; ++i) assert_int_equal(o[i + 1], narrow(dtype, v[off + i]));
            }
        }
    }
}

void test_scalar_flavour(void **) { check_flavour(hi::kScalar); }

void test_simd_flavour(void **) {
#if defined(__x86_64__)
    if (!h::simd_available()) {
        skip();
        return;
    }
    check_flavour(hi::kF16cAvx2);
#else
    skip();
#endif
}

void test_add_and_scale_round_once(void **) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> d(-3000.f, 3000.f);
    for (int32_t dtype : {SX_DTYPE_F16, SX_DTYPE_BF16}) {
        const size_t n = 3001;
        std::vector<uint16_t> a(n), b(n), s(n);
        for (size_t i = 0; i < n; ++i) a[i] = narrow(dtype, d(rng)), b[i] = narrow(dtype, d(rng));
        s = a;
        h::add_into(dtype, s.data(), b.data(), n);
        for (size_t i = 0; i < n; ++i) assert_int_equal(s[i], narrow(dtype, widen(dtype, a[i]) + widen(dtype, b[i])));
        std::vector<float> acc(n, 0.25f);
        h::add_to_f32(dtype, a.data(), acc.data(), n);
        for (size_t i = 0; i < n; ++i) assert_true(acc[i] == 0.25f + widen(dtype, a[i]));
        s = a;
        h::scale(dtype, s.data(), 0.3f, n);
        for (size_t i = 0; i < n; ++i) assert_int_equal(s[i], narrow(dtype, widen(dtype, a[i]) * 0.3f));
    }
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_values),
        cmocka_unit_test(test_every_pattern_round_trips),
        cmocka_unit_test(test_narrowing_is_round_to_nearest_even),
        cmocka_unit_test(test_scalar_flavour),
        cmocka_unit_test(test_simd_flavour),
        cmocka_unit_test(test_add_and_scale_round_once),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
