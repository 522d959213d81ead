// Deadlines: every wait in sx is bounded, and measures what is left of its deadline on the
// steady clock in milliseconds.
#pragma once

#include <chrono>

namespace sx {

using Millis = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// What is left of `deadline` now, never negative.
inline Millis time_left(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    return left.count() > 0 ? left : Millis(0);
}

}  // namespace sx
