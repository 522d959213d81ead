// Stochastic rounding into bf16 (stochastic_round.h): the reference and the update's loops.
#include "optim/stochastic_round.h"

namespace sx {
namespace optim {

void stochastic_round_reference(const float *x, uint16_t *out, size_t n, uint64_t key, uint64_t first_element) {
    for (size_t i = 0; i < n; ++i) out[i] = bf16_round_stochastic(x[i], random16(key, first_element + i));
}

void stochastic_round(const float *x, uint16_t *out, size_t n, uint64_t key, uint64_t first_element) {
    // Blocks of bits, then of roundings: two branch-free loops of the same arithmetic.
    constexpr size_t kBlock = 256;
    uint32_t bits[kBlock];
    uint32_t rand[kBlock];
    for (size_t b = 0; b < n; b += kBlock) {
        const size_t m = n - b < kBlock ? n - b : kBlock;
        const uint64_t base = key + (first_element + b + 1) * kGoldenGamma;
#pragma omp simd
        for (size_t i = 0; i < m; ++i) rand[i] = static_cast<uint32_t>(mix64(base + i * kGoldenGamma) >> 48);
        std::memcpy(bits, x + b, m * sizeof(float));
#pragma omp simd
        for (size_t i = 0; i < m; ++i) {
            const uint32_t v = bits[i];
            const bool nan = (v & 0x7FFFFFFFu) > 0x7F800000u;
            out[b + i] = static_cast<uint16_t>(nan ? (v >> 16) | 0x0040u : (v + rand[i]) >> 16);
        }
    }
}

}  // namespace optim
}  // namespace sx
