// Encoding and decoding of packed optimizer state (state_codec.h). Built with
// -ffp-contract=off like the kernels: each operation rounds once, as torchao's compiled
// quantizer does.
#include "optim/state_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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
