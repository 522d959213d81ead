// Ranks as threads of the test program: run_ranks runs a function once per rank.
#pragma once

#include <cstdio>
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
    // The first rank's error is returned; the others' go to stderr, since the first is
    // often only the consequence of another's.
    std::string first;
    for (int r = 0; r < world; ++r) {
        const std::string &e = errs[static_cast<size_t>(r)];
        if (e.empty()) continue;
        if (first.empty())
            first = "rank " + std::to_string(r) + ": " + e;
        else
            std::fprintf(stderr, "also rank %d: %s\n", r, e.c_str());
    }
    return first;
}

}  // namespace sxtest
