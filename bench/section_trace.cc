// bench_sx section trace: what the step timeline (docs/tracing.md) costs. Two ranks as
// threads over local:// each hold two identical groups, one traced (the default ring of
// 65536 events, written to a temporary directory at the end) and one not, and time the
// same steps on both, in alternation (which goes first alternates), every rank starting
// together. Two models: many small units with the step overlapped (each unit signalled
// ready, the gathers deferred: the most spans per byte of work, on three threads), and
// one large unit with the plain step (the spans of a step are few against its work).
// The ratio is the median over repetitions of traced time / untraced time.
//
// On a shared machine that ratio moves by more than tracing costs, so the section also
// times a span alone (a million in a row, on and off) and counts the events a traced
// step records (from the trace file: its events and those it dropped): events per step x
// the cost of a span, over the untraced step's time, is what tracing adds at most (every
// span on the step's critical path), measured without the noise of the collectives.
//
// There is no build without the spans to compare with: off, a span is a test of a null
// pointer where it starts and where it ends, which the untraced group pays; the figure is
// what turning the trace on adds to that.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/trace.h"
#include "bench_util.h"
#include "sx/sx.h"

namespace sxbench {

namespace {

void check(sx_status_t st, const char *what) {
    if (st != SX_OK) {
        std::fprintf(stderr, "bench_sx trace: %s: %s\n", what, sx_last_error_message());
        std::exit(1);
    }
}

struct Model {
    const char *name;
    int units;
    int64_t unit_numel;
    bool overlap;  // units signalled ready, gathers deferred
    int steps;     // per timed repetition
};

sx_shard_group_t *make_group(const std::string &url, int rank, const Model &m, const char *trace) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = url.c_str();
    cfg.rank = rank;
    cfg.world_size = 2;
    cfg.stage = 2;
    cfg.num_threads = 1;
    cfg.timeout_ms = 120000;
    cfg.trace_path = trace;
    sx_shard_group_t *g = nullptr;
    check(sx_create_shard_group(&cfg, &g), "sx_create_shard_group");
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    check(sx_add_param_group(g, &pg, nullptr), "sx_add_param_group");
    for (int u = 0; u < m.units; ++u) {
        const std::string name = "layer" + std::to_string(u);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = name.c_str();
        d.ndim = 1;
        d.shape = &m.unit_numel;
        d.unit = u;
        check(sx_add_param(g, &d, nullptr), "sx_add_param");
    }
    check(sx_finalize(g), "sx_finalize");
    return g;
}

void run_steps(sx_shard_group_t *g, const Model &m) {
    sx_step_options_t o;
    sx_step_options_init(&o, sizeof o);
    o.defer_gather = m.overlap ? 1 : 0;
    o.keep_grads = 1;  // the gradients stay as written: every step does the same work
    for (int s = 0; s < m.steps; ++s) {
        if (m.overlap) {
            for (int32_t u = 0; u < m.units; ++u) check(sx_unit_gather(g, u), "sx_unit_gather");
            for (int32_t u = m.units - 1; u >= 0; --u) check(sx_unit_grads_ready(g, u, nullptr), "sx_unit_grads_ready");
        }
        check(sx_step(g, &o, nullptr), "sx_step");
    }
}

// Nanoseconds per span, recorded into a tracer (on) or not (off).
void span_cost(const std::string &dir, double *off_ns, double *on_ns) {
    const int n = 1000000;
    sx::trace::Tracer tracer(dir + "/spans.json", 0, 1, sx::trace::kDefaultCapacity);
    sx::trace::Tracer *none = nullptr;
    for (int rep = 0; rep < 3; ++rep) {  // the fastest of 3: the least disturbed
        for (int on = 0; on < 2; ++on) {
            sx::trace::Tracer *t = on ? &tracer : none;
            asm volatile("" : "+r"(t));  // not known to be null at compile time, as in the library
            const double t0 = now_seconds();
            for (int i = 0; i < n; ++i) {
                SX_TRACE_SPAN(t, "bench", "span", i, 64);
                asm volatile("" ::: "memory");
            }
            const double ns = (now_seconds() - t0) * 1e9 / n;
            double *out = on ? on_ns : off_ns;
            if (rep == 0 || ns < *out) *out = ns;
        }
    }
}

// Events one rank's traced group recorded, from its trace file (those kept and dropped).
long recorded_events(const std::string &path) {
    FILE *f = std::fopen(path.c_str(), "r");
    if (!f) return -1;
    char head[4096];
    const size_t n = std::fread(head, 1, sizeof head - 1, f);
    std::fclose(f);
    head[n] = '\0';
    const char *e = std::strstr(head, "\"events\":"), *d = std::strstr(head, "\"dropped_events\":");
    if (!e || !d) return -1;
    return std::atol(e + 9) + std::atol(d + 17);
}

// Seconds per repetition, untraced (a) and traced (b), as rank 0 timed them.
PairTimes time_model(const Model &m, int reps, const std::string &dir) {
    const std::string tag = std::to_string(getpid()) + "-" + m.name;
    const std::string trace = dir + "/" + m.name + "-%r.json";
    PairTimes t;
    Barrier barrier(2);
    auto rank_main = [&](int rank) {
        sx_shard_group_t *off = make_group("local://bench-trace-off-" + tag, rank, m, nullptr);
        sx_shard_group_t *on = make_group("local://bench-trace-on-" + tag, rank, m, trace.c_str());
        for (sx_shard_group_t *g : {off, on}) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            for (int32_t p = 0; p < m.units; ++p) {
                check(sx_grad_view(g, p, &v), "sx_grad_view");
                float *d = static_cast<float *>(v.data);
                for (uint64_t i = 0; i < v.numel; ++i) d[i] = 1e-3f * static_cast<float>((i + rank) % 13);
            }
            run_steps(g, m);  // untimed: buffers faulted in, state allocated
        }
        for (int r = 0; r < reps; ++r) {
            for (int k = 0; k < 2; ++k) {
                const bool traced = (r % 2 == 0) == (k == 1);
                barrier.wait();
                const double t0 = now_seconds();
                run_steps(traced ? on : off, m);
                barrier.wait();  // both ranks done: the slower one's time
                if (rank == 0) (traced ? t.b : t.a).push_back(now_seconds() - t0);
            }
        }
        check(sx_destroy_shard_group(off), "sx_destroy_shard_group");
        check(sx_destroy_shard_group(on), "sx_destroy_shard_group (writes the trace)");
    };
    std::thread peer(rank_main, 1);
    rank_main(0);
    peer.join();
    return t;
}

}  // namespace

int section_trace(const Options &opt) {
    char templ[] = "/tmp/sx-bench-trace-XXXXXX";
    if (!mkdtemp(templ)) {
        std::fprintf(stderr, "bench_sx trace: cannot make a temporary directory\n");
        return 1;
    }
    const std::string dir = templ;
    const Model models[] = {
        {"small_units_overlapped", 32, 1024, true, 50},
        {"one_large_unit", 1, int64_t(4) << 20, false, 5},
    };
    std::printf("trace: sx_step at 2 ranks (threads over local://, stage 2, AdamW, 1 thread each), traced vs "
                "not; ratio = median over %d reps of traced time / untraced time\n",
                opt.reps);
    double off_ns = 0, on_ns = 0;
    span_cost(dir, &off_ns, &on_ns);
    std::printf("a span: %.1f ns off, %.1f ns on (the fastest of 3 runs of a million)\n", off_ns, on_ns);
    std::printf("%-24s %6s %10s %7s %12s %12s %7s %13s %12s %14s\n", "model", "units", "unit_numel", "steps",
                "off_ms/step", "on_ms/step", "ratio", "ratio_of_mins", "spans/step", "spans_x_cost");
    std::vector<std::string> json;
    char line[640];
    std::snprintf(line, sizeof line, "{\"bench\":\"trace_span\",\"off_ns\":%.2f,\"on_ns\":%.2f}", off_ns, on_ns);
    json.push_back(line);
    for (const Model &m : models) {
        const PairTimes t = time_model(m, opt.reps, dir);
        const double ratio = t.paired_ratio(), mins = t.min_b() / t.min_a();
        const double off_ms = t.min_a() * 1e3 / m.steps, on_ms = t.min_b() * 1e3 / m.steps;
        // The traced group ran (1 + reps) x steps steps (the first untimed); its creation
        // and finalize add a handful of events, left in.
        const long events = recorded_events(dir + "/" + m.name + "-0.json");
        const double per_step = static_cast<double>(events) / ((1.0 + opt.reps) * m.steps);
        // The bound: every span of a step one after the other on its critical path.
        const double bound = 1.0 + per_step * (on_ns - off_ns) * 1e-6 / off_ms;
        std::printf("%-24s %6d %10lld %7d %12.3f %12.3f %7.3f %13.3f %12.1f %14.4f\n", m.name, m.units,
                    static_cast<long long>(m.unit_numel), m.steps, off_ms, on_ms, ratio, mins, per_step, bound);
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"trace_on_vs_off\",\"model\":\"%s\",\"ranks\":2,\"units\":%d,\"unit_numel\":%lld,"
                      "\"steps_per_rep\":%d,\"reps\":%d,\"off_ms_per_step\":%.4f,\"on_ms_per_step\":%.4f,"
                      "\"ratio_on_over_off\":%.4f,\"ratio_of_mins\":%.4f,\"spans_per_step\":%.1f,"
                      "\"ratio_bound_from_span_cost\":%.5f}",
                      m.name, m.units, static_cast<long long>(m.unit_numel), m.steps, opt.reps, off_ms, on_ms, ratio,
                      mins, per_step, bound);
        json.push_back(line);
    }
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    const std::string rm = "rm -rf '" + dir + "'";
    if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "bench_sx trace: could not remove %s\n", dir.c_str());
    return 0;
}

}  // namespace sxbench
