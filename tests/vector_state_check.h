// Whether the wide vector registers' upper halves are in use on this thread: XINUSE
// (XGETBV with ECX = 1) bit 2 (the YMM upper halves) or bit 6 (the upper 256 bits of
// ZMM0-15), which only vzeroupper (or never having used them) clears. While they are in
// use, SSE code on this core is penalised (see src/base/vector_state.h).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace sxtest {

// 1 in use, 0 clean, -1 where the processor cannot say (no XGETBV with ECX = 1).
inline int upper_halves_in_use() {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return -1;  // OSXSAVE
    if (!__get_cpuid_count(0xD, 1, &a, &b, &c, &d) || !(a & (1u << 2))) return -1;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1u));
    (void)hi;
    return (lo & ((1u << 2) | (1u << 6))) ? 1 : 0;
#else
    return -1;
#endif
}

}  // namespace sxtest
