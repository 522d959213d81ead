// Ranks as threads of the test program: run_ranks runs a function once per rank.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace sxtest {

// Runs fn(rank) on `world` threads (CMocka's assertions belong to the main thread, so
// fn reports a failure as text); returns the first rank's error, or "".
inline std::string run_ranks(int world, const std::function<std::string(int)> &fn) {
    std::vector<std::string> errs(static_cast<size_t>(world));
    std::vector<std::thread> ts;
    for (int r = 0; r < world; ++r) ts.emplace_back([&, r] { errs[static_cast<size_t>(r)] = fn(r); });
    for (auto &t : ts) t.join();
    for (int r = 0; r < world; ++r)
        if (!errs[static_cast<size_t>(r)].empty()) return "rank " + std::to_string(r) + ": " + errs[static_cast<size_t>(r)];
    return "";
}

}  // namespace sxtest
