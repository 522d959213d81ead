// Stochastic rounding of fp32 values into bf16 params (bf16_stochastic_round: bf16 params
// kept without fp32 masters), as torchao's _fp32_to_bf16_sr (torchao 0.18,
// torchao/optim/quant_utils.py): 16 random bits are added to the fp32 bit pattern and the
// upper 16 bits kept, so that x rounds away from zero with probability (its lower 16
// bits) / 2^16 and the rounded value's expectation is x. NaN stays NaN.
//
// The random bits are not drawn from a generator's state: they are a hash of (param
// index, the param's step count, element index within the param), SplitMix64's output
// function (Steele, Lea and Flood 2014) applied to a counter, so that every rank, world
// size and stage, and any split of the update among threads, gives each element the same
// bits.
//
// The hash and the rounding of one element are host and device functions alike: a CUDA
// group's update (optim/cuda/fused_update.cu) rounds with these very lines, so that its
// params are a CPU group's bit for bit.
#ifndef SX_OPTIM_STOCHASTIC_ROUND_H
#define SX_OPTIM_STOCHASTIC_ROUND_H

#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define SX_SR_HOST_DEVICE __host__ __device__
#else
#define SX_SR_HOST_DEVICE
#endif

namespace sx {
namespace optim {

constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;  // SplitMix64's increment

// SplitMix64's output function: a bijection of 64 bits whose outputs for consecutive
// inputs pass BigCrush.
SX_SR_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The key of param `param`'s update number `step` (its step count including it, >= 1).
SX_SR_HOST_DEVICE inline uint64_t stochastic_round_key(int32_t param, int64_t step) {
    return mix64(mix64(static_cast<uint64_t>(static_cast<uint32_t>(param)) + kGoldenGamma) ^
                 static_cast<uint64_t>(step));
}

// The 16 random bits of element `element` (of the whole param, not of a shard) under `key`.
SX_SR_HOST_DEVICE inline uint32_t random16(uint64_t key, uint64_t element) {
    return static_cast<uint32_t>(mix64(key + (element + 1) * kGoldenGamma) >> 48);
}

// x rounded to bf16 with the random bits `rand16` (< 2^16).
SX_SR_HOST_DEVICE inline uint16_t bf16_round_stochastic(float x, uint32_t rand16) {
#ifdef __CUDA_ARCH__
    const uint32_t bits = __float_as_uint(x);
#else
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
#endif
    // NaN: a quiet NaN of its sign (adding to it could carry it into infinity).
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
    return static_cast<uint16_t>((bits + rand16) >> 16);
}

// out[i] = x[i] rounded stochastically, with the bits of element first_element + i under
// key: the scalar reference.
void stochastic_round_reference(const float *x, uint16_t *out, size_t n, uint64_t key, uint64_t first_element);
// The same, bit for bit, in loops the compiler vectorises: the scalar kernel flavour's
// (the update rounds with its flavour's, KernelTable::round_stochastic; AVX2's and
// AVX-512's are hand-written).
void stochastic_round(const float *x, uint16_t *out, size_t n, uint64_t key, uint64_t first_element);

}  // namespace optim
}  // namespace sx

#endif  // SX_OPTIM_STOCHASTIC_ROUND_H
