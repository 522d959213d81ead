// The step timeline (docs/tracing.md): traced runs at world size 2, as threads over
// local:// (stages 2 and 3, a save and a load) and as processes over tcp:// (SX_TRACE),
// write one Chrome trace-event JSON file per rank that Python's json module reads
// (tests/core/trace_summary.py), with the spans of every phase, the units' ids and bytes,
// the threads' names, spans nested as Perfetto needs and times on one clock; the ring
// keeps at most its capacity and counts what it dropped; no trace, no file; a trace that
// cannot be written fails nothing but sx_trace_flush.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "sx_cmocka.h"

#include "base/trace.h"
#include "process_ranks.h"
#include "run_ranks.h"
#include "sx/sx.h"

namespace {

// Unit ids, not indices: the trace must name the units as the trainer did.
const int32_t kUnitIds[3] = {3, 5, 9};
const int64_t kNumel[3] = {37, 35, 100};

struct SpanSummary {
    long count = 0;
    std::set<long long> units;
    std::set<unsigned long long> bytes;
};

struct Summary {
    std::string error;  // trace_summary.py's complaint, or ""
    int pid = -1;
    long events = -1, dropped = -1, capacity = -1;
    double first = 0, last = 0;
    std::map<long, std::string> threads;
    std::map<std::string, SpanSummary> spans;
    bool has(const char *name) const { return spans.count(name) && spans.at(name).count > 0; }
    bool has_thread(const std::string &prefix) const {
        for (const auto &t : threads)
            if (t.second.compare(0, prefix.size(), prefix) == 0) return true;
        return false;
    }
};

template <typename T>
void parse_list(const std::string &text, std::set<T> *out) {
    if (text == "-") return;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) out->insert(static_cast<T>(std::stoull(item)));
}

// The summary of one trace file by trace_summary.py (which validates it).
Summary summarize(const std::string &path) {
    Summary s;
    const std::string cmd = std::string(SX_PYTHON3) + " " + TRACE_SUMMARY_PY + " '" + path + "' 2>&1";
    FILE *p = popen(cmd.c_str(), "r");
    if (!p) {
        s.error = "popen failed";
        return s;
    }
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int rc = pclose(p);
    if (rc != 0) {
        s.error = "trace_summary.py failed: " + out;
        return s;
    }
    std::stringstream lines(out);
    std::string line;
    while (std::getline(lines, line)) {
        std::stringstream ls(line);
        std::string key;
        ls >> key;
        if (key == "pid") ls >> s.pid;
        if (key == "events") ls >> s.events;
        if (key == "dropped") ls >> s.dropped;
        if (key == "capacity") ls >> s.capacity;
        if (key == "range") ls >> s.first >> s.last;
        if (key == "thread") {
            long tid;
            ls >> tid;
            std::string name;
            std::getline(ls, name);
            s.threads[tid] = name.substr(name.find_first_not_of(' '));
        }
        if (key == "span") {
            std::string name, units, bytes;
            long count;
            ls >> name >> count >> units >> bytes;
            SpanSummary &sp = s.spans[name];
            sp.count = count;
            parse_list(units.substr(6), &sp.units);   // "units="
            parse_list(bytes.substr(6), &sp.bytes);   // "bytes="
        }
    }
    return s;
}

double now_us() { return static_cast<double>(sx::trace::now_ns()) / 1000.0; }

std::string make_dir(const char *tag) {
    char templ[256];
    std::snprintf(templ, sizeof templ, "/tmp/sx-test-trace-%s-XXXXXX", tag);
    const char *d = mkdtemp(templ);
    assert_non_null(d);
    return d;
}

std::vector<std::string> list_dir(const std::string &dir) {
    std::vector<std::string> names;
    DIR *d = opendir(dir.c_str());
    if (!d) return names;
    while (dirent *e = readdir(d))
        if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.push_back(e->d_name);
    closedir(d);
    return names;
}

void remove_tree(const std::string &dir) {
    const std::string cmd = "rm -rf '" + dir + "'";
    if (std::system(cmd.c_str()) != 0) std::printf("could not remove %s\n", dir.c_str());
}

bool file_exists(const std::string &path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

#define R_CHECK(call)                                                                                  \
    do {                                                                                               \
        const sx_status_t s_ = (call);                                                                 \
        if (s_ != SX_OK) return std::string(#call) + ": " + sx_status_string(s_) + ": " + sx_last_error_message(); \
    } while (0)

// A group of 3 units (ids 3, 5, 9) of one AdamW group at `stage`; trace_path may be null.
std::string make_group(const std::string &rv, int rank, int world, int stage, const char *trace_path,
                       int32_t trace_events, sx_shard_group_t **out) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.stage = stage;
    cfg.num_threads = 1;
    cfg.timeout_ms = 60000;
    cfg.trace_path = trace_path;
    cfg.trace_events = trace_events;
    R_CHECK(sx_create_shard_group(&cfg, out));
    sx_param_group_desc_t adamw;
    sx_param_group_desc_init(&adamw, sizeof adamw, SX_OPTIM_ADAMW);
    R_CHECK(sx_add_param_group(*out, &adamw, nullptr));
    const char *names[3] = {"a", "b", "c"};
    for (int u = 0; u < 3; ++u) {
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = names[u];
        d.ndim = 1;
        d.shape = &kNumel[u];
        d.unit = kUnitIds[u];
        R_CHECK(sx_add_param(*out, &d, nullptr));
    }
    R_CHECK(sx_finalize(*out));
    return "";
}

// `steps` steps: at stage 3 each unit gathered and released (a forward), then signalled
// ready in reverse (an overlapped backward); else the plain step.
std::string train(sx_shard_group_t *g, int rank, int stage, int steps) {
    for (int step = 0; step < steps; ++step) {
        for (int u = 0; u < 3; ++u) {
            if (stage == 3) R_CHECK(sx_unit_gather(g, u));
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            R_CHECK(sx_grad_view(g, u, &v));
            float *grad = static_cast<float *>(v.data);
            for (uint64_t i = 0; i < v.numel; ++i) grad[i] = 0.01f * static_cast<float>((rank + 1) * (i % 7) + step);
            if (stage == 3) R_CHECK(sx_unit_release(g, u));
        }
        if (stage == 3)
            for (int u = 2; u >= 0; --u) R_CHECK(sx_unit_grads_ready(g, u, nullptr));
        R_CHECK(sx_step(g, nullptr, nullptr));
    }
    return "";
}

// An asynchronous save into `ckpt`, then a load of it.
std::string save_and_load(sx_shard_group_t *g, const std::string &ckpt) {
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    so.path = ckpt.c_str();
    sx_future_t *f = nullptr;
    R_CHECK(sx_save_optim_state(g, &so, &f));
    const sx_status_t saved = sx_future_wait(f, -1);
    sx_future_destroy(f);
    R_CHECK(saved);
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = ckpt.c_str();
    R_CHECK(sx_load_optim_state(g, &lo));
    return "";
}

// Every unit's flat buffer bytes (fp32): what its reduce-scatter and all-gather move.
std::set<unsigned long long> unit_bytes(int world) {
    std::set<unsigned long long> b;
    // The layout pads each unit to a multiple of world x 64 bytes (16 floats).
    for (int u = 0; u < 3; ++u) {
        const long long align = 16LL * world;
        b.insert(static_cast<unsigned long long>((kNumel[u] + align - 1) / align * align * 4));
    }
    return b;
}

// What every traced rank's file of a run with steps, a save and a load must hold.
void check_rank_file(const Summary &s, int rank, int world, int stage, double t0, double t1) {
    if (!s.error.empty()) fail_msg("rank %d: %s", rank, s.error.c_str());
    assert_int_equal(s.pid, rank);
    assert_int_equal(s.dropped, 0);
    assert_true(s.events > 20);
    assert_true(s.first >= t0 - 1000 && s.last <= t1 + 1000);  // the trace clock is the wall clock
    const std::set<long long> ids(kUnitIds, kUnitIds + 3);
    for (const char *name : {"reduce_scatter", "all_gather"}) {
        if (!s.has(name)) fail_msg("rank %d: no %s span", rank, name);
        const SpanSummary &sp = s.spans.at(name);
        if (sp.units != ids) fail_msg("rank %d: %s spans name units other than 3, 5 and 9", rank, name);
        if (sp.bytes != unit_bytes(world)) fail_msg("rank %d: %s spans' bytes are not the units' buffers", rank, name);
    }
    for (const char *name : {"sx_step", "agreement", "update", "sx_finalize", "sx_create_shard_group",
                             "save.snapshot", "save.stage", "save.persist", "save.open", "save.write", "load",
                             "load.plan", "load.read_values", "load.agree_values", "load.gather_params",
                             "load.read_states", "load.agree", "load.commit"})
        if (!s.has(name)) fail_msg("rank %d (stage %d): no %s span", rank, stage, name);
    // The gradient norm's sum over the ranks: an exchange of its own at stage 3; at stages 1
    // and 2 it rides on the params' all-gather (these ranks share memory), so none.
    if (s.has("grad_norm") != (stage == 3))
        fail_msg("rank %d (stage %d): %s grad_norm span", rank, stage, stage == 3 ? "no" : "a");
    if (!s.has(rank == 0 ? "save.commit" : "save.wait_commit"))
        fail_msg("rank %d: no %s span", rank, rank == 0 ? "save.commit" : "save.wait_commit");
    // The update's bytes: this rank's elements of the params (not the padding), in fp32,
    // the same at every step (the ranks' sum is checked by the caller).
    assert_int_equal(s.spans.at("update").bytes.size(), 1);
    assert_true(s.spans.at("save.write").bytes.size() == 1 && *s.spans.at("save.write").bytes.begin() > 0);
    if (!s.has_thread("sx checkpoint I/O")) fail_msg("rank %d: the asynchronous save's thread is not named", rank);
    if (!s.has_thread("caller")) fail_msg("rank %d: the trainer's thread is not named 'caller'", rank);
    if (stage == 3) {
        if (!s.has("wait_reductions") || !s.has("sx_unit_gather"))
            fail_msg("rank %d: stage 3 lacks wait_reductions or sx_unit_gather", rank);
        if (!s.has_thread("sx channel: the gradient reductions") || !s.has_thread("sx channel: the param gathers"))
            fail_msg("rank %d: the channels' threads are not named", rank);
    } else if (!s.has("wait_gathers")) {
        fail_msg("rank %d: no wait_gathers span", rank);
    }
}

// Both ranks' files of one run: their updates cover every param element once, and their
// spans overlap in time, as the ranks did (one clock).
void check_ranks_together(const Summary s[2]) {
    const unsigned long long elements = static_cast<unsigned long long>(kNumel[0] + kNumel[1] + kNumel[2]);
    assert_int_equal(*s[0].spans.at("update").bytes.begin() + *s[1].spans.at("update").bytes.begin(), 4 * elements);
    assert_true(s[0].first < s[1].last && s[1].first < s[0].last);
}

void traced_threads(int stage) {
    const std::string dir = make_dir("threads");
    // A checkpoint path that JSON must escape (a quote and a backslash).
    const std::string ckpt = dir + "/ck\"pt\\" + std::to_string(stage);
    const std::string templ = dir + "/t-%r.json";
    const std::string rv = "local://trace-" + std::to_string(stage) + "-" + std::to_string(getpid());
    const double t0 = now_us();
    const std::string err = sxtest::run_ranks(2, [&](int rank) -> std::string {
        sx_shard_group_t *g = nullptr;
        std::string e = make_group(rv, rank, 2, stage, templ.c_str(), 0, &g);
        if (e.empty()) e = train(g, rank, stage, 3);
        if (e.empty()) e = save_and_load(g, ckpt);
        if (e.empty()) e = train(g, rank, stage, 1);
        sx_destroy_shard_group(g);
        return e;
    });
    const double t1 = now_us();
    if (!err.empty()) fail_msg("%s", err.c_str());
    Summary s[2];
    for (int r = 0; r < 2; ++r) {
        s[r] = summarize(dir + "/t-" + std::to_string(r) + ".json");
        check_rank_file(s[r], r, 2, stage, t0, t1);
    }
    check_ranks_together(s);
    for (const std::string &name : list_dir(dir))
        if (name.find(".partial") != std::string::npos) fail_msg("a half-written trace %s is left", name.c_str());
    remove_tree(dir);
}

void test_traced_threads_stage2(void **) { traced_threads(2); }
void test_traced_threads_stage3(void **) { traced_threads(3); }

// The same as 2 processes over tcp://, the file named by SX_TRACE (no %r: ".rank<N>"
// goes before ".json").
void test_traced_processes(void **) {
    const std::string dir = make_dir("procs");
    setenv("SX_TRACE", (dir + "/job.json").c_str(), 1);
    const double t0 = now_us();
    const std::string err = sxtest::run_process_ranks(2, {"--ckpt", dir + "/ckpt"}, 120);
    const double t1 = now_us();
    unsetenv("SX_TRACE");
    if (!err.empty()) fail_msg("%s", err.c_str());
    Summary s[2];
    for (int r = 0; r < 2; ++r) {
        s[r] = summarize(dir + "/job.rank" + std::to_string(r) + ".json");
        check_rank_file(s[r], r, 2, 2, t0, t1);
    }
    check_ranks_together(s);
    remove_tree(dir);
}

int child_main(int argc, char **argv) {
    sxtest::ChildArgs args;
    if (!sxtest::parse_child_args(argc, argv, &args)) return 2;
    sx_shard_group_t *g = nullptr;
    std::string e = make_group(args.rendezvous, args.rank, args.world, 2, nullptr, 0, &g);
    if (e.empty()) e = train(g, args.rank, 2, 3);
    if (e.empty()) e = save_and_load(g, args.get("--ckpt", ""));
    if (e.empty()) e = train(g, args.rank, 2, 1);
    sx_destroy_shard_group(g);
    if (!e.empty()) std::fprintf(stderr, "rank %d: %s\n", args.rank, e.c_str());
    return e.empty() ? 0 : 1;
}

// A ring of 8 events: a flush in the middle writes a file; the file at destroy holds 8
// events, and says how many went.
void test_ring_bound(void **) {
    const std::string dir = make_dir("ring");
    const std::string templ = dir + "/ring.json";
    const std::string path = dir + "/ring.rank0.json";
    const std::string rv = "local://trace-ring-" + std::to_string(getpid());
    sx_shard_group_t *g = nullptr;
    std::string e = make_group(rv, 0, 1, 2, templ.c_str(), 8, &g);
    if (!e.empty()) fail_msg("%s", e.c_str());
    e = train(g, 0, 2, 2);
    if (!e.empty()) fail_msg("%s", e.c_str());
    assert_false(file_exists(path));  // nothing is written before a flush
    assert_int_equal(sx_trace_flush(g), SX_OK);
    const Summary mid = summarize(path);
    if (!mid.error.empty()) fail_msg("%s", mid.error.c_str());
    e = train(g, 0, 2, 20);
    if (!e.empty()) fail_msg("%s", e.c_str());
    assert_int_equal(sx_destroy_shard_group(g), SX_OK);
    const Summary s = summarize(path);
    if (!s.error.empty()) fail_msg("%s", s.error.c_str());
    assert_int_equal(s.capacity, 8);
    assert_int_equal(s.events, 8);
    assert_true(mid.events <= 8);
    // 22 steps record far more than 8 spans (each at least sx_step, reduce_scatter x 3,
    // update); the latest stay.
    assert_true(s.dropped > 22 * 5 - 8);
    assert_true(s.dropped > mid.dropped);
    assert_true(s.last > mid.last);
    assert_true(s.has("sx_step"));
    remove_tree(dir);
}

// No path and no SX_TRACE: no file anywhere in the run's directory, and flush does nothing.
void test_off_writes_nothing(void **) {
    unsetenv("SX_TRACE");
    const std::string dir = make_dir("off");
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(dir.c_str()), 0);
    const std::string rv = "local://trace-off-" + std::to_string(getpid());
    sx_shard_group_t *g = nullptr;
    std::string e = make_group(rv, 0, 1, 2, nullptr, 0, &g);
    if (e.empty()) e = train(g, 0, 2, 3);
    if (!e.empty()) fail_msg("%s", e.c_str());
    assert_int_equal(sx_trace_flush(g), SX_OK);
    assert_int_equal(sx_destroy_shard_group(g), SX_OK);
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(list_dir(dir).size(), 0);
    remove_tree(dir);
}

struct Captured {
    std::mutex mu;
    std::vector<std::string> warnings;
};

void capture(int32_t level, const char *message, void *user) {
    Captured *c = static_cast<Captured *>(user);
    std::lock_guard<std::mutex> lock(c->mu);
    if (level <= SX_LOG_WARN) c->warnings.push_back(message);
}

// A trace that cannot be written: the steps go on; sx_trace_flush says which file and
// why; the destroy's flush is a logged warning.
void test_unwritable_trace(void **) {
    Captured cap;
    assert_int_equal(sx_set_log_callback(capture, &cap, SX_LOG_WARN), SX_OK);
    const std::string templ = "/nonexistent-sx-dir/t.json";
    const std::string rv = "local://trace-unwritable-" + std::to_string(getpid());
    sx_shard_group_t *g = nullptr;
    std::string e = make_group(rv, 0, 1, 2, templ.c_str(), 0, &g);
    if (e.empty()) e = train(g, 0, 2, 2);
    if (!e.empty()) fail_msg("%s", e.c_str());
    assert_int_equal(sx_trace_flush(g), SX_ERR_IO);
    assert_non_null(std::strstr(sx_last_error_message(), "/nonexistent-sx-dir/t.rank0.json"));
    e = train(g, 0, 2, 1);
    if (!e.empty()) fail_msg("%s", e.c_str());
    assert_int_equal(sx_destroy_shard_group(g), SX_OK);
    sx_set_log_callback(nullptr, nullptr, SX_LOG_ERROR);
    bool warned = false;
    for (const std::string &w : cap.warnings) warned |= w.find("/nonexistent-sx-dir/t.rank0.json") != std::string::npos;
    assert_true(warned);
}

// Bad trace settings are refused by name, before anything connects.
void test_bad_config(void **) {
    const std::string rv = "local://trace-bad-" + std::to_string(getpid());
    const int32_t bad_events[2] = {-1, (1 << 24) + 1};
    for (int32_t n : bad_events) {
        sx_group_config_t cfg;
        sx_group_config_init(&cfg, sizeof cfg);
        cfg.backend = SX_BACKEND_CPU;
        cfg.rendezvous = rv.c_str();
        cfg.world_size = 1;
        cfg.trace_path = "/tmp/never-written.json";
        cfg.trace_events = n;
        sx_shard_group_t *g = nullptr;
        assert_int_equal(sx_create_shard_group(&cfg, &g), SX_ERR_INVALID_ARGUMENT);
        assert_null(g);
        assert_non_null(std::strstr(sx_last_error_message(), "trace_events"));
    }
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.world_size = 1;
    cfg.transport = 7;
    sx_shard_group_t *g = nullptr;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "transport"));
    assert_int_equal(sx_trace_flush(nullptr), SX_ERR_INVALID_HANDLE);
}

void test_rank_path(void **) {
    using sx::trace::rank_path;
    assert_string_equal(rank_path("t.json", 3).c_str(), "t.rank3.json");
    assert_string_equal(rank_path("t", 3).c_str(), "t.rank3.json");
    assert_string_equal(rank_path("/x/.json", 0).c_str(), "/x/.rank0.json");
    assert_string_equal(rank_path("run-%r/t-%r.json", 12).c_str(), "run-12/t-12.json");
    assert_string_equal(rank_path("t%", 1).c_str(), "t%.rank1.json");
}

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_path),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_off_writes_nothing),
        cmocka_unit_test(test_ring_bound),
        cmocka_unit_test(test_unwritable_trace),
        cmocka_unit_test(test_traced_threads_stage2),
        cmocka_unit_test(test_traced_threads_stage3),
        cmocka_unit_test(test_traced_processes),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
