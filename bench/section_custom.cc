// bench_sx section custom_optimizer: AdamW written in C as a custom optimizer
// (tests/core/custom_adamw.c, registered through sx_register_optimizer) against sx's own
// fused AdamW kernel, at --elements (64 Mi) and 1 Mi elements, on the pool's 2 threads.
// The custom side is the whole path a step takes for it (optim/custom.h): the params
// copied aside, the slots copied into their second buffers piece by piece, and the C
// function called on each piece. Goal at 64 Mi: custom / built-in <= 1.3.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../tests/core/custom_adamw.h"
#include "bench_util.h"
#include "optim/custom.h"
#include "optim/kernels.h"
#include "optim/optimizer.h"
#include "optim/thread_pool.h"

namespace sxbench {

int section_custom_optimizer(const Options &opt) {
    using namespace sx::optim;
    int32_t id = 0, id_in_place = 0;
    if (custom_adamw_register(&id) != SX_OK || custom_adamw_register_in_place(&id_in_place) != SX_OK) {
        std::fprintf(stderr, "bench_sx: registering the custom AdamW failed: %s\n", sx_last_error_message());
        return 1;
    }
    const int threads = 2;
    ThreadPool pool(threads);
    const Hyper builtin = default_hyper(Kind::kAdamW);
    const Hyper custom = default_hyper(static_cast<Kind>(id));
    const Hyper custom_in_place = default_hyper(static_cast<Kind>(id_in_place));
    std::printf("custom_optimizer: AdamW as a custom optimizer in C (double-buffered: params copied aside, slots "
                "copied into their second buffers) vs sx's fused AdamW (%s, %d threads), %d reps of the pair; "
                "ratio = median over reps of custom time / built-in time; in_place: the same function registered "
                "SX_OPTIMIZER_IN_PLACE (no second buffers, no undo)\n",
                isa_name(detect_isa()), threads, opt.reps);
    std::printf("%10s %12s %10s %8s %13s %9s\n", "elements", "builtin_ms", "custom_ms", "ratio", "in_place_ms",
                "ratio");
    std::vector<std::string> json;
    for (size_t n : {opt.elements, size_t(1) << 20}) {
        Streams s;
        HostBuffer m2, v2, undo;
        if (!s.allocate(n) || !m2.allocate(n * sizeof(float), "benchmark stream").ok() ||
            !v2.allocate(n * sizeof(float), "benchmark stream").ok() ||
            !undo.allocate(n * sizeof(float), "benchmark stream").ok())
            return 1;
        for (HostBuffer *b : {&s.m, &s.v, &m2, &v2, &undo}) std::memset(b->as<float>(), 0, n * sizeof(float));
        Segment seg_b = s.adamw_segment(&builtin, n);
        seg_b.step = 10;
        Segment seg_c = s.adamw_segment(&custom, n);
        seg_c.step = 10;
        seg_c.state_in[0] = s.m.as<float>();
        seg_c.state_in[1] = s.v.as<float>();
        seg_c.state[0] = m2.as<float>();
        seg_c.state[1] = v2.as<float>();
        seg_c.undo = undo.as<float>();
        seg_c.param_index = 0;
        Segment seg_i = s.adamw_segment(&custom_in_place, n);
        seg_i.step = 10;
        seg_i.param_index = 0;
        auto run_builtin = [&] { fused_update(&seg_b, 1, 1e-3f, &pool, Isa::kAuto, nullptr); };
        bool ok = true;
        auto run_custom = [&] {
            CustomFailure failure;
            ok = custom_update(&seg_c, 1, 1e-3f, &pool, nullptr, &failure) && ok;
        };
        auto run_in_place = [&] {
            CustomFailure failure;
            ok = custom_update(&seg_i, 1, 1e-3f, &pool, nullptr, &failure) && ok;
        };
        const PairTimes t = time_pair(run_builtin, run_custom, opt.reps);
        const PairTimes ti = time_pair(run_builtin, run_in_place, opt.reps);
        if (!ok) {
            std::fprintf(stderr, "bench_sx: the custom AdamW reported failure\n");
            return 1;
        }
        std::printf("%10zu %12.3f %10.3f %8.3f %13.3f %9.3f\n", n, t.min_a() * 1e3, t.min_b() * 1e3, t.paired_ratio(),
                    ti.min_b() * 1e3, ti.paired_ratio());
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"custom_optimizer\",\"optimizer\":\"AdamW\",\"threads\":%d,\"elements\":%zu,"
                      "\"reps\":%d,\"builtin_ms\":%.4f,\"custom_ms\":%.4f,\"ratio_custom_vs_builtin\":%.4f,"
                      "\"in_place_ms\":%.4f,\"ratio_in_place_vs_builtin\":%.4f}",
                      threads, n, opt.reps, t.min_a() * 1e3, t.min_b() * 1e3, t.paired_ratio(), ti.min_b() * 1e3,
                      ti.paired_ratio());
        json.push_back(line);
    }
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    return 0;
}

}  // namespace sxbench
