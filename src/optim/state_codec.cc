// Encoding and decoding of packed optimizer state (state_codec.h). Built with
// -ffp-contract=off like the kernels: each operation rounds once, as torchao's compiled
// quantizer does.
#include "optim/state_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "optim/kernels.h"

namespace sx {
namespace optim {

namespace {

// The nearest code of y in map (ascending), ties to the larger: torchao's
// quantize_8bit_with_qmap, as its inductor kernel computes it (a binary search over the
// map, then a step up when y lies at least half-way to the next entry).
uint8_t nearest_code(float y, const float *map) {
    int c = y >= map[128] ? 128 : 0;
    for (int k = 64; k >= 1; k /= 2)
        if (y >= map[c + k]) c += k;
    const int up = c < 255 ? c + 1 : 255;
    if ((y - map[c]) >= (map[up] - map[c]) * 0.5f) c = up;
    return static_cast<uint8_t>(c);
}

// The largest c with map[c] <= v, 0 if none (or v is NaN).
int code_below(float v, const float *map) {
    int c = 0;
    for (int k = 128; k >= 1; k >>= 1)
        if (v >= map[c + k]) c += k;
    return c;
}

float from_bits(uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

struct CodeLut {
    uint8_t entries[2 * kLutBuckets + 3] = {};
    bool exact = true;
    explicit CodeLut(const float *map) {
        for (uint32_t sign = 0; sign < 2; ++sign) {
            for (uint32_t k = 0; k < kLutBuckets; ++k) {
                // The bucket's magnitudes in bits: [lo, hi]; bucket 0 from 0.
                const uint32_t lo = k == 0 ? 0 : (k + (102u << 8)) << 15;
                const uint32_t hi = ((k + 1 + (102u << 8)) << 15) - 1;
                const float low = sign ? -from_bits(hi) : from_bits(lo);
                const float high = sign ? -from_bits(lo) : from_bits(hi);
                const int below_low = code_below(low, map), below_high = code_below(high, map);
                entries[sign * kLutBuckets + k] = static_cast<uint8_t>(below_low);
                exact = exact && below_high - below_low <= 1;
            }
        }
    }
};

const CodeLut &lut_of(bool nonnegative) {
    static const CodeLut signed_lut(kSignedMap), unsigned_lut(kUnsignedMap);
    return nonnegative ? unsigned_lut : signed_lut;
}

}  // namespace

const uint8_t *code_lut(const float *map) { return lut_of(map == kUnsignedMap).entries; }

namespace {

struct SearchTables {
    alignas(64) float entries[304] = {};
    explicit SearchTables(const float *map) {
        for (int step = 0; step < 8; ++step) {
            const int k = 128 >> step;
            for (int i = 0; i < 128 / k; ++i) entries[kSearchTableOffset[step] + i] = map[(2 * i + 1) * k];
        }
    }
};

}  // namespace

const float *search_tables(const float *map) {
    static const SearchTables signed_tables(kSignedMap), unsigned_tables(kUnsignedMap);
    return (map == kUnsignedMap ? unsigned_tables : signed_tables).entries;
}

namespace {

// The least bits in [lo, hi] whose code is at least c (the codes of y >= 0 rise with y).
uint32_t least_bits_with_code(uint32_t lo, uint32_t hi, int c, const float *map) {
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (nearest_code(from_bits(mid), map) >= c)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

// The least non-negative float whose nearest code is at least c.
float least_with_code(int c, const float *map) { return from_bits(least_bits_with_code(0, 0x3f800000u, c, map)); }

// The least magnitude a whose negation's nearest code is at most c.
float least_negated_with_code(int c, const float *map) {
    uint32_t lo = 0, hi = 0x3f800000u;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (nearest_code(-from_bits(mid), map) <= c)
            hi = mid;
        else
            lo = mid + 1;
    }
    return from_bits(lo);
}

float ulps_away(float a, int n) {
    uint32_t b;
    std::memcpy(&b, &a, 4);
    return from_bits(static_cast<uint32_t>(static_cast<int64_t>(b) + n));
}

struct FastTables {
    FastCodeTables t = {};
    explicit FastTables(const float *map) {
        const bool is_signed = map[0] < 0.0f;
        const int zero = is_signed ? 127 : 0;
        t.mirror = is_signed ? 254 : 0;
        // Classes: the zero code, decades 0..6, the 1.0 code; each one's least magnitude.
        float least[9];
        least[0] = 0.0f;
        int first = zero + 1;
        for (int d = 0; d < 7; ++d) {
            const int n = is_signed ? 1 << d : 2 << d;
            least[1 + d] = least_with_code(first, map);
            t.first[1 + d] = first;
            t.last[1 + d] = first + n - 1;
            t.factor[1 + d] = static_cast<float>(std::pow(10.0, 6 - d) * n / 0.9);
            t.offset[1 + d] = static_cast<float>(n / 9.0);
            first += n;
        }
        least[8] = least_with_code(255, map);
        t.first[0] = t.last[0] = zero;
        t.first[8] = t.last[8] = 255;
        for (int q : {0, 8}) t.offset[q] = -0.5f;
        t.exact = first == 255;
        for (uint32_t e = kFastLowestExponent; e < 127 + 1; ++e) {
            const float lo = e == kFastLowestExponent ? 0.0f : from_bits(e << 23), hi = from_bits((e + 1) << 23);
            const uint32_t o = e % 32;
            int q = 0, changes = 0;
            t.octave_bound[o] = INFINITY;
            for (int k = 1; k < 9; ++k) {
                if (least[k] <= lo) q = k;
                if (least[k] > lo && least[k] < hi) {
                    t.octave_bound[o] = least[k];
                    ++changes;
                }
            }
            t.octave_class[o] = q;
            t.exact = t.exact && changes <= 1;
        }
        // Every threshold inside a decade, and a few ulps either side, lies within a
        // quarter of the guard of its grid line.
        for (int d = 0; d < 7; ++d)
            for (int c = t.first[1 + d] + 1; c <= t.last[1 + d]; ++c) {
                const float at = least_with_code(c, map);
                for (int u = -8; u <= 8; ++u) {
                    const float tt = std::fmaf(ulps_away(at, u), t.factor[1 + d], -t.offset[1 + d]);
                    t.exact = t.exact && std::fabs(tt - static_cast<float>(c - t.first[1 + d])) < kFastGuardT / 4;
                }
            }
        // A negative magnitude's thresholds are the positive ones', give or take an ulp.
        if (is_signed)
            for (int c = 128; c <= 254; ++c) {
                const float pos = least_with_code(c, map), neg = least_negated_with_code(254 - c, map);
                t.exact = t.exact && neg >= ulps_away(pos, -4) && neg <= ulps_away(pos, 4);
            }
    }
};

}  // namespace

const FastCodeTables &fast_code_tables(const float *map) {
    static const FastTables signed_tables(kSignedMap), unsigned_tables(kUnsignedMap);
    return (map == kUnsignedMap ? unsigned_tables : signed_tables).t;
}

namespace {

uint32_t bits_of(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

struct MagnitudeTables {
    MagnitudeIndex t = {};
    explicit MagnitudeTables(const float *map) {
        const bool is_signed = map[0] < 0.0f;
        t.mirror = is_signed ? 254 : 0;
        t.exact = true;
        // Each bucket's first bits, the code just below them (the previous bucket's last
        // bits; bucket 0's own), and its own threshold (0 if none): the least bits of the
        // bucket whose code is above that.
        std::vector<uint32_t> first(kMagnitudeBuckets + 1), own(kMagnitudeBuckets, 0);
        std::vector<int> code(kMagnitudeBuckets);
        for (uint32_t k = 0; k <= kMagnitudeBuckets; ++k) first[k] = k == 0 ? 0 : (k + kMagnitudeKeyBase) << 16;
        for (uint32_t k = 0; k < kMagnitudeBuckets; ++k) {
            // The last bucket holds everything from 1.0 up: its code is 255's throughout.
            const uint32_t last = k + 1 < kMagnitudeBuckets ? first[k + 1] - 1 : 0x7f7fffffu;
            code[k] = nearest_code(from_bits(k == 0 ? 0 : first[k] - 1), map);
            const int top = nearest_code(from_bits(last), map);
            t.exact = t.exact && top - code[k] <= 1;
            if (top != code[k]) own[k] = least_bits_with_code(first[k], last, top, map);
        }
        for (uint32_t k = 0; k < kMagnitudeBuckets; ++k) {
            // A neighbour's threshold within the guard of this bucket's edge.
            const bool below = k > 0 && own[k - 1] != 0 && first[k] - own[k - 1] <= kMagnitudeGuard;
            const bool above = k + 1 < kMagnitudeBuckets && own[k + 1] != 0 && own[k + 1] - first[k + 1] <= kMagnitudeGuard;
            // Bucket 0 holds every smaller magnitude and the last every larger one, so
            // neither may have a threshold.
            const bool end = k == 0 || k + 1 == kMagnitudeBuckets;
            t.exact = t.exact && (own[k] != 0) + below + above <= (end ? 0 : 1);
            uint32_t threshold = own[k];
            int below_code = code[k];
            if (below) threshold = own[k - 1], below_code = code[k - 1];
            if (above) threshold = own[k + 1];
            const uint32_t field =
                threshold == 0 ? kMagnitudeNone : threshold - first[k] + kMagnitudeBias;  // wraps below first[k]
            t.entries[k] = static_cast<uint32_t>(below_code) | (field & 0xffffffu) << 8;
        }
        // A negative y's thresholds lie within 4 ulps of the positive ones' (mirrored).
        if (is_signed)
            for (int c = 128; c <= 254; ++c) {
                const float pos = least_with_code(c, map), neg = least_negated_with_code(254 - c, map);
                const int64_t apart = static_cast<int64_t>(bits_of(pos)) - static_cast<int64_t>(bits_of(neg));
                t.exact = t.exact && apart >= -4 && apart <= 4;
            }
    }
};

}  // namespace

const MagnitudeIndex &magnitude_index(const float *map) {
    static const MagnitudeTables signed_tables(kSignedMap), unsigned_tables(kUnsignedMap);
    return (map == kUnsignedMap ? unsigned_tables : signed_tables).t;
}

bool code_lut_exact() { return lut_of(false).exact && lut_of(true).exact; }

float encode_block(const float *x, size_t n, const float *map, uint8_t *codes) {
    float absmax = 0.0f;
    for (size_t i = 0; i < n; ++i) {
        const float a = __builtin_fabsf(x[i]);
        if (a != a || absmax != absmax)
            absmax = a != a ? a : absmax;
        else if (a > absmax)
            absmax = a;
    }
    const float scale = absmax < 1e-12f ? 1e-12f : absmax;  // clip(1e-12); NaN stays NaN
    for (size_t i = 0; i < n; ++i) codes[i] = nearest_code(x[i] / scale, map);
    return scale;
}

void decode_block(const uint8_t *codes, size_t n, float scale, const float *map, float *out) {
    for (size_t i = 0; i < n; ++i) out[i] = map[codes[i]] * scale;
}

namespace {

// Whether codes under scale decode to exactly x (NaN where x is NaN).
bool decodes_to(const float *x, size_t n, const uint8_t *codes, float scale, const float *map) {
    for (size_t i = 0; i < n; ++i) {
        const float d = map[codes[i]] * scale;
        uint32_t a, b;
        std::memcpy(&a, &d, 4);
        std::memcpy(&b, &x[i], 4);
        if (a != b && !(d != d && x[i] != x[i])) return false;
    }
    return true;
}

}  // namespace

float encode_decoded_block(const float *x, size_t n, const float *map, uint8_t *codes) {
    const float scale = encode_block(x, n, map, codes);
    if (n > kQuantBlock || decodes_to(x, n, codes, scale, map)) return scale;
    // The element that set the scale decoded to map[0] * scale: the most negative.
    float lowest = x[0];
    for (size_t i = 1; i < n; ++i) lowest = x[i] < lowest ? x[i] : lowest;
    const float near = lowest / map[0];
    uint8_t trial[kQuantBlock];
    for (float s : {near, std::nextafter(near, 0.0f), std::nextafter(near, 1.0f)}) {
        if (!(s >= 0.0f)) continue;
        for (size_t i = 0; i < n; ++i) trial[i] = nearest_code(x[i] / s, map);
        if (decodes_to(x, n, trial, s, map)) {
            std::memcpy(codes, trial, n);
            return s;
        }
    }
    return scale;  // not a decoded block: encode_block's codes, already in place
}

}  // namespace optim
}  // namespace sx
