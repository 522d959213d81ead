#include "base/vector_state.h"

namespace sx {

void leave_vector_state_clean() {
#if defined(__x86_64__) || defined(__i386__)
    // This file is built without AVX, so the compiler keeps nothing in the upper halves
    // that vzeroupper clears (the lower 128 bits of every register are kept).
    static const bool avx = __builtin_cpu_supports("avx");
    if (avx) __asm__ volatile("vzeroupper");
#endif
}

}  // namespace sx
