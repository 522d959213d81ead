// Ranks that disagree are told at once: every collective call begins with the same
// header, so ranks in different calls (sx_step against a save, a load, a broadcast, a
// gather of the whole state, sx_accumulate_grads) meet in one exchange and every rank
// fails with SX_ERR_MISMATCH naming each rank's call, in well under a second with a
// timeout of 20; ranks loading different checkpoints fail naming each one's checkpoint
// and step, and nothing changes; a rank that cannot read its checkpoint fails its peers
// at once; ranks that disagree on the world size fail at creation. Ranks as threads over
// local:// and as processes over tcp://, and the group goes on training afterwards. And
// the collectives a step makes, counted: over shared memory the step's agreement and norm
// ride on its reduce-scatter and all-gather.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "process_ranks.h"
#include "run_ranks.h"
#include "sx/sx.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"
#include "test_files.h"

namespace {

constexpr int kTimeoutMs = 20000;
constexpr double kAtOnce = 1.0;  // seconds: "at once", against the 20 s timeout

double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string check(sx_status_t s, const char *what) {
    if (s == SX_OK) return "";
    return std::string(what) + ": " + sx_last_error_message();
}

// Rank r of 2 over `rv`: one AdamW group, two params in two units, finalized, params set
// (stage 3: no prefetch, so that every sx_unit_gather communicates).
std::string make_group(const std::string &rv, int r, sx_shard_group_t **out, int stage = 0,
                       int32_t transport = SX_TRANSPORT_AUTO) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = r;
    cfg.world_size = 2;
    cfg.num_threads = 1;
    cfg.timeout_ms = kTimeoutMs;
    cfg.stage = stage;
    cfg.transport = transport;
    if (stage == 3) cfg.prefetch_depth = SX_PREFETCH_NONE;
    std::string e = check(sx_create_shard_group(&cfg, out), "create");
    if (!e.empty()) return e;
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    pg.lr = 0.1;
    e = check(sx_add_param_group(*out, &pg, nullptr), "add_param_group");
    for (int p = 0; p < 2 && e.empty(); ++p) {
        const int64_t n = 100 + 37 * p;
        const std::string name = "p" + std::to_string(p);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = name.c_str();
        d.ndim = 1;
        d.shape = &n;
        d.unit = p;
        e = check(sx_add_param(*out, &d, nullptr), "add_param");
    }
    if (e.empty()) e = check(sx_finalize(*out), "finalize");
    for (int p = 0; p < 2 && e.empty(); ++p) {
        if (stage == 3) e = check(sx_unit_gather(*out, p), "unit_gather");
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        if (e.empty()) e = check(sx_param_view(*out, p, &v), "param_view");
        for (uint64_t i = 0; e.empty() && i < v.numel; ++i) static_cast<float *>(v.data)[i] = 0.01f * (i % 13);
        if (e.empty() && stage == 3) e = check(sx_unit_release(*out, p), "unit_release");
    }
    return e;
}

// One agreed step: gradients written, sx_step; its step count into *step.
std::string step(sx_shard_group_t *g, int s, uint64_t *count = nullptr, double *norm = nullptr) {
    for (int p = 0; p < 2; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        if (sx_grad_view(g, p, &v) != SX_OK) return "grad_view";
        for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = 0.25f * ((i + s) % 5) - 0.5f;
    }
    sx_step_result_t res;
    sx_step_result_init(&res, sizeof res);
    std::string e = check(sx_step(g, nullptr, &res), "sx_step");
    if (count) *count = res.step;
    if (norm) *norm = res.grad_norm;
    return e;
}

// The params' values (stage 3: each unit gathered for it, which is collective).
std::vector<float> params(sx_shard_group_t *g, int stage = 0) {
    std::vector<float> out;
    for (int p = 0; p < 2; ++p) {
        if (stage == 3 && sx_unit_gather(g, p) != SX_OK) return {};
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        sx_param_view(g, p, &v);
        const float *d = static_cast<const float *>(v.data);
        out.insert(out.end(), d, d + v.numel);
        if (stage == 3) sx_unit_release(g, p);
    }
    return out;
}

std::string save(sx_shard_group_t *g, const std::string &path, bool synchronous, sx_status_t *status) {
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    so.path = path.c_str();
    so.synchronous = synchronous ? 1 : 0;
    sx_future_t *f = nullptr;
    *status = sx_save_optim_state(g, &so, &f);
    if (*status != SX_OK) return "";
    const sx_status_t w = sx_future_wait(f, -1);
    sx_future_destroy(f);
    return check(w, "sx_future_wait");
}

sx_status_t load(sx_shard_group_t *g, const std::string &path) {
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    return sx_load_optim_state(g, &lo);
}

sx_status_t ignore_state(sx_param_state_t *, void *) { return SX_OK; }

// The calls a rank can be in, each as the public API makes it; `dir` holds a checkpoint
// "ck" both can load.
enum Call { kStep, kSyncSave, kAsyncSave, kLoad, kBroadcast, kAccumulate, kGatherState, kCalls };
const char *const kNames[kCalls] = {"sx_step",          "sx_save_optim_state", "sx_save_optim_state",
                                    "sx_load_optim_state", "sx_broadcast_params", "sx_accumulate_grads",
                                    "sx_gather_optim_state (root 0)"};

sx_status_t call(sx_shard_group_t *g, Call c, const std::string &dir, int tag) {
    sx_status_t s = SX_OK;
    switch (c) {
    case kStep: return sx_step(g, nullptr, nullptr);
    case kSyncSave:
    case kAsyncSave: save(g, dir + "/new-" + std::to_string(tag), c == kSyncSave, &s); return s;
    case kLoad: return load(g, dir + "/ck");
    case kBroadcast: return sx_broadcast_params(g, 0);
    case kAccumulate: return sx_accumulate_grads(g);
    case kGatherState: return sx_gather_optim_state(g, 0, ignore_state, nullptr);
    default: return SX_ERR_INTERNAL;
    }
}

// Rank r's side of one mismatch: in `mine` while the peer is in `theirs`; then the
// group trains on. "" or what was wrong.
std::string mismatched(sx_shard_group_t *g, int r, Call mine, Call theirs, const std::string &dir, int tag) {
    const std::vector<float> before = params(g);
    const double t0 = now();
    const sx_status_t s = call(g, mine, dir, tag);
    const double took = now() - t0;
    const std::string msg = sx_last_error_message();
    const std::string what = std::string(kNames[mine]) + " against " + kNames[theirs];
    if (s != SX_ERR_MISMATCH) return what + ": returned " + std::to_string(s) + " (" + msg + "), not SX_ERR_MISMATCH";
    if (took > kAtOnce) return what + ": took " + std::to_string(took) + " s";
    const std::string want = std::string("the call: ") + kNames[r == 0 ? mine : theirs] + " on rank 0, " +
                             kNames[r == 0 ? theirs : mine] + " on rank 1";
    if (msg.find(want) == std::string::npos) return what + ": the message does not say \"" + want + "\": " + msg;
    if (params(g) != before) return what + ": the params changed";
    return "";
}

std::string ranks_in_different_calls(const std::string &rv, int r, const std::string &dir) {
    sx_shard_group_t *g = nullptr;
    std::string e = make_group(rv, r, &g);
    if (e.empty()) e = step(g, 1);
    sx_status_t s = SX_OK;
    if (e.empty()) e = save(g, dir + "/ck", true, &s);
    if (e.empty() && s != SX_OK) e = std::string("save: ") + sx_last_error_message();
    int tag = 0;
    for (int a = 0; a < kCalls && e.empty(); ++a)
        for (int b = 0; b < kCalls && e.empty(); ++b) {
            if (a == b || (a == kSyncSave && b == kAsyncSave) || (a == kAsyncSave && b == kSyncSave)) continue;
            // Only pairs in which rank 0 is in sx_step or rank 1 is: every call against a step,
            // and a few others among themselves.
            if (a != kStep && b != kStep && !(a == kLoad && b == kSyncSave) && !(a == kBroadcast && b == kLoad))
                continue;
            ++tag;
            e = mismatched(g, r, static_cast<Call>(r == 0 ? a : b), static_cast<Call>(r == 0 ? b : a), dir, tag);
        }
    uint64_t count = 0;
    if (e.empty()) e = step(g, 2, &count);
    if (e.empty() && count != 2) e = "the agreed step after the mismatches counted " + std::to_string(count);
    sx_destroy_shard_group(g);
    return e;
}

// Stage 3, where a gather runs on a communicator of its own: a rank in sx_unit_gather
// and a rank in each other call (or gathering another unit) both fail at once, naming
// each rank's call (or unit); nothing changes, and the ranks go on gathering and
// training together.
std::string gathers_against_other_calls(const std::string &rv, int r, const std::string &dir) {
    sx_shard_group_t *g = nullptr;
    std::string e = make_group(rv, r, &g, 3);
    if (e.empty()) e = step(g, 1);
    sx_status_t s = SX_OK;
    if (e.empty()) e = save(g, dir + "/ck", true, &s);
    if (e.empty() && s != SX_OK) e = std::string("save: ") + sx_last_error_message();
    const std::vector<float> before = e.empty() ? params(g, 3) : std::vector<float>();
    if (e.empty() && before.empty()) e = std::string("gathering the params: ") + sx_last_error_message();
    int tag = 0;
    for (int other = 0; other <= kCalls && e.empty(); ++other) {
        // Rank 0 gathers unit 1 while rank 1 is in `other` (kCalls: gathering unit 0),
        // then the other way round.
        for (int gatherer = 0; gatherer < 2 && e.empty(); ++gatherer) {
            const std::string theirs = other == kCalls ? "sx_unit_gather" : kNames[other];
            const double t0 = now();
            sx_status_t got;
            if (r == gatherer || other == kCalls) {
                got = sx_unit_gather(g, r == gatherer ? 1 : 0);
            } else {
                got = call(g, static_cast<Call>(other), dir, ++tag);
            }
            const double took = now() - t0;
            const std::string msg = sx_last_error_message();
            const std::string what = "sx_unit_gather on rank " + std::to_string(gatherer) + " against " + theirs;
            if (got != SX_ERR_MISMATCH) {
                e = what + ": returned " + std::to_string(got) + " (" + msg + ")";
            } else if (took > kAtOnce) {
                e = what + ": took " + std::to_string(took) + " s";
            } else {
                const std::string want = other == kCalls ? (gatherer == 0 ? "the unit gathered: 1 on rank 0, 0 on rank 1"
                                                                          : "the unit gathered: 0 on rank 0, 1 on rank 1")
                                         : gatherer == 0 ? "the call: sx_unit_gather on rank 0, " + theirs + " on rank 1"
                                                         : "the call: " + theirs + " on rank 0, sx_unit_gather on rank 1";
                if (msg.find(want) == std::string::npos) e = what + ": the message does not say \"" + want + "\": " + msg;
            }
            if (e.empty() && sx_unit_release(g, 1) != SX_ERR_INVALID_STATE)
                e = what + ": the refused gather left unit 1 gathered";
        }
    }
    if (e.empty() && params(g, 3) != before) e = "the params changed";
    uint64_t count = 0;
    if (e.empty()) e = step(g, 2, &count);
    if (e.empty() && count != 2) e = "the agreed step after the mismatches counted " + std::to_string(count);
    sx_destroy_shard_group(g);
    return e;
}

void test_stage3_gathers_against_other_calls(void **) {
    const std::string dir = sxtest::make_tmpdir("headers-gather");
    const std::string rv = "local://headers-gather-" + std::to_string(getpid());
    const std::string err = sxtest::run_ranks(2, [&](int r) { return gathers_against_other_calls(rv, r, dir); });
    if (!err.empty()) fail_msg("%s", err.c_str());
    sxtest::remove_tree(dir);
}

// Both ranks, as threads, at the same point (a reusable barrier of 2).
class Meet {
  public:
    void operator()() {
        std::unique_lock<std::mutex> lock(mu_);
        const int round = round_;
        if (++arrived_ == 2) {
            arrived_ = 0;
            ++round_;
            cv_.notify_all();
        } else {
            cv_.wait(lock, [&] { return round_ != round; });
        }
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    int arrived_ = 0, round_ = 0;
};

// The collectives a step makes, per rank (both ranks' count, halved), after a first step.
struct Trips {
    double plain = 0, clipped = 0, accumulated = 0;  // sx_step; with clipping; a micro-batch and a step
    double signalled = 0;                             // both units signalled ready, then sx_step
    double norm = 0;                                  // the plain step's grad_norm
};

std::string count_trips(const std::string &rv, int r, int stage, int32_t transport, Meet &meet, Trips *out) {
    sx_shard_group_t *g = nullptr;
    std::string e = make_group(rv, r, &g, stage, transport);
    if (e.empty()) e = step(g, 1);
    sx_step_options_t clip;
    sx_step_options_init(&clip, sizeof clip);
    clip.max_grad_norm = 0.5;
    double norm = 0.0;
    for (int kind = 0; kind < 4; ++kind) {
        meet();
        const uint64_t before = sx::comm::collectives_started();
        meet();
        if (e.empty() && kind == 0) e = step(g, 2);
        if (e.empty() && kind == 0) e = step(g, 3, nullptr, &norm);
        if (e.empty() && kind == 1) e = check(sx_step(g, &clip, nullptr), "sx_step clipped");
        if (e.empty() && kind == 2) e = check(sx_accumulate_grads(g), "sx_accumulate_grads");
        if (e.empty() && kind == 2) e = check(sx_step(g, nullptr, nullptr), "sx_step after a micro-batch");
        for (int32_t u : {1, 0})
            if (e.empty() && kind == 3) e = check(sx_unit_grads_ready(g, u, nullptr), "sx_unit_grads_ready");
        if (e.empty() && kind == 3) e = check(sx_step(g, nullptr, nullptr), "sx_step after the signals");
        meet();
        const double n = static_cast<double>(sx::comm::collectives_started() - before) / 2;
        if (r == 0) {
            // kind 0 made two steps: the count is per step
            if (kind == 0) out->plain = n / 2, out->norm = norm;
            if (kind == 1) out->clipped = n;
            if (kind == 2) out->accumulated = n;
            if (kind == 3) out->signalled = n;
        }
        meet();
    }
    sx_destroy_shard_group(g);
    return e;
}

// A step makes the collectives its math needs: over shared memory, a reduce-scatter and an
// all-gather per unit (the agreement rides on the first reduce-scatter, the norm on the
// first all-gather), one more for the norm before the update where clipping needs it, and a
// micro-batch its reduce-scatters alone (stage 2); a step whose units were signalled ready
// one exchange more, the round's end (the units signalled, the weights and the norm),
// its opening agreement riding on the first reduce-scatter; over TCP the agreements and
// the norm are exchanges of their own. The norm is the same either way, to the bit.
void test_round_trips_per_step(void **) {
    Trips t[2];
    const int32_t transports[2] = {SX_TRANSPORT_AUTO, SX_TRANSPORT_TCP};
    for (int k = 0; k < 2; ++k) {
        Meet meet;
        const std::string rv = "local://headers-trips-" + std::to_string(k) + "-" + std::to_string(getpid());
        const std::string err =
            sxtest::run_ranks(2, [&](int r) { return count_trips(rv, r, 2, transports[k], meet, &t[k]); });
        if (!err.empty()) fail_msg("%s", err.c_str());
    }
    // 2 units: shared memory 2 + 2, TCP 1 + 2 + 1 + 2.
    if (t[0].plain != 4 || t[0].clipped != 5 || t[0].accumulated != 6 || t[0].signalled != 5)
        fail_msg("shared memory: %g, %g, %g and %g collectives per rank, not 4, 5, 6 and 5", t[0].plain, t[0].clipped,
                 t[0].accumulated, t[0].signalled);
    if (t[1].plain != 6 || t[1].clipped != 6 || t[1].accumulated != 9 || t[1].signalled != 6)
        fail_msg("TCP: %g, %g, %g and %g collectives per rank, not 6, 6, 9 and 6", t[1].plain, t[1].clipped,
                 t[1].accumulated, t[1].signalled);
    if (!(t[0].norm > 0) || std::memcmp(&t[0].norm, &t[1].norm, sizeof(double)) != 0)
        fail_msg("the step's norm: %.17g over shared memory, %.17g over TCP", t[0].norm, t[1].norm);
}

void test_ranks_in_different_calls(void **) {
    const std::string dir = sxtest::make_tmpdir("headers");
    const std::string rv = "local://headers-" + std::to_string(getpid());
    const std::string err = sxtest::run_ranks(2, [&](int r) { return ranks_in_different_calls(rv, r, dir); });
    if (!err.empty()) fail_msg("%s", err.c_str());
    sxtest::remove_tree(dir);
}

// Ranks loading different checkpoints of the same shapes (steps 3 and 5): both fail at
// once, naming each rank's checkpoint and step; nothing changes; the next step is 6.
std::string different_checkpoints(const std::string &rv, int r, const std::string &dir) {
    sx_shard_group_t *g = nullptr;
    std::string e = make_group(rv, r, &g);
    sx_status_t s = SX_OK;
    for (int k = 1; k <= 5 && e.empty(); ++k) {
        e = step(g, k);
        if (e.empty() && (k == 3 || k == 5)) e = save(g, dir + "/step" + std::to_string(k), true, &s);
        if (e.empty() && s != SX_OK) e = std::string("save: ") + sx_last_error_message();
    }
    if (!e.empty()) {
        sx_destroy_shard_group(g);
        return e;
    }
    const std::vector<float> before = params(g);
    const std::string mine = dir + (r == 0 ? "/step3" : "/step5");
    const double t0 = now();
    s = load(g, mine);
    const double took = now() - t0;
    const std::string msg = sx_last_error_message();
    if (s != SX_ERR_MISMATCH) e = "load returned " + std::to_string(s) + ": " + msg;
    if (e.empty() && took > kAtOnce) e = "the mismatched load took " + std::to_string(took) + " s";
    const std::string want = "the checkpoint: " + dir + "/step3 on rank 0, " + dir + "/step5 on rank 1";
    if (e.empty() && msg.find(want) == std::string::npos) e = "the message does not name both checkpoints: " + msg;
    if (e.empty() && params(g) != before) e = "the mismatched load changed the params";
    uint64_t count = 0;
    if (e.empty()) e = step(g, 6, &count);
    if (e.empty() && count != 6) e = "the step after the refused load counted " + std::to_string(count);
    // Both ranks loading one of them works, and sets the step count.
    if (e.empty() && load(g, dir + "/step3") != SX_OK) e = std::string("load: ") + sx_last_error_message();
    if (e.empty()) e = step(g, 4, &count);
    if (e.empty() && count != 4) e = "the step after the load counted " + std::to_string(count);
    // One rank cannot read its checkpoint: its peer fails at once with its code.
    if (e.empty()) {
        s = load(g, r == 0 ? dir + "/step3" : dir + "/no-such-checkpoint");
        const std::string m = sx_last_error_message();
        if (s != SX_ERR_NOT_FOUND) e = "a load one rank cannot read returned " + std::to_string(s) + ": " + m;
        if (e.empty() && r == 0 && m.find("failed on rank 1") == std::string::npos)
            e = "rank 0 is not told which rank failed: " + m;
    }
    sx_destroy_shard_group(g);
    return e;
}

void test_loads_of_different_checkpoints(void **) {
    const std::string dir = sxtest::make_tmpdir("headers-load");
    const std::string rv = "local://headers-load-" + std::to_string(getpid());
    const std::string err = sxtest::run_ranks(2, [&](int r) { return different_checkpoints(rv, r, dir); });
    if (!err.empty()) fail_msg("%s", err.c_str());
    sxtest::remove_tree(dir);
}

// sx_all_reduce over 3 ranks: sums in rank order (the same bits everywhere), means,
// maxima and minima; NaN wins; ranks that pass different ops, or another call, are told;
// a rank that passes a bad count fails, and its peers with its code; nothing changes then.
void test_all_reduce(void **) {
    const std::string rv = "local://headers-allreduce-" + std::to_string(getpid());
    std::vector<double> got[3][4];
    const std::string err = sxtest::run_ranks(3, [&](int r) -> std::string {
        sx_group_config_t cfg;
        sx_group_config_init(&cfg, sizeof cfg);
        cfg.backend = SX_BACKEND_CPU;
        cfg.rendezvous = rv.c_str();
        cfg.rank = r;
        cfg.world_size = 3;
        cfg.num_threads = 1;
        cfg.timeout_ms = kTimeoutMs;
        sx_shard_group_t *g = nullptr;
        if (sx_create_shard_group(&cfg, &g) != SX_OK) return std::string("create: ") + sx_last_error_message();
        std::string e;
        // Before sx_finalize too.
        double one = 1.0;
        if (sx_all_reduce(g, &one, 1, SX_REDUCE_SUM) != SX_OK || one != 3.0)
            e = std::string("before finalize: ") + sx_last_error_message();
        sx_param_group_desc_t pg;
        sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_SGD);
        const int64_t n = 10;
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = "w", d.ndim = 1, d.shape = &n;
        if (e.empty() && (sx_add_param_group(g, &pg, nullptr) != SX_OK || sx_add_param(g, &d, nullptr) != SX_OK ||
                          sx_finalize(g) != SX_OK))
            e = std::string("setup: ") + sx_last_error_message();
        for (int32_t op = SX_REDUCE_SUM; op <= SX_REDUCE_MIN && e.empty(); ++op) {
            std::vector<double> v = {0.1 * (r + 1), -1.0 * r, r == 1 ? std::nan("") : 2.0, 1e16 * (r == 0 ? 1 : -1)};
            if (sx_all_reduce(g, v.data(), 4, op) != SX_OK) e = std::string("all_reduce: ") + sx_last_error_message();
            got[r][op - 1] = v;
        }
        // Different ops: told, and the values stay.
        std::vector<double> v = {1.0, 2.0};
        const std::vector<double> before = v;
        if (e.empty() && (sx_all_reduce(g, v.data(), 2, r == 2 ? SX_REDUCE_MAX : SX_REDUCE_SUM) != SX_ERR_MISMATCH ||
                          !std::strstr(sx_last_error_message(), "op: sum on ranks 0, 1, max on rank 2")))
            e = std::string("different ops: ") + sx_last_error_message();
        if (e.empty() && v != before) e = "a refused all_reduce changed the values";
        // A bad count on rank 1: its own error; its peers fail with the same code.
        if (e.empty()) {
            const sx_status_t s = sx_all_reduce(g, v.data(), r == 1 ? SX_MAX_ALL_REDUCE + 1 : 2, SX_REDUCE_SUM);
            const std::string m = sx_last_error_message();
            if (s != SX_ERR_INVALID_ARGUMENT) e = "a bad count on rank 1 gave " + std::to_string(s) + ": " + m;
            if (e.empty() && r != 1 && m.find("failed on rank 1") == std::string::npos) e = "not told which rank: " + m;
        }
        // Another call.
        if (e.empty() && r == 0 && sx_all_reduce(g, v.data(), 2, SX_REDUCE_SUM) != SX_ERR_MISMATCH)
            e = std::string("all_reduce against broadcast: ") + sx_last_error_message();
        if (e.empty() && r != 0 && sx_broadcast_params(g, 0) != SX_ERR_MISMATCH)
            e = std::string("broadcast against all_reduce: ") + sx_last_error_message();
        sx_destroy_shard_group(g);
        return e;
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
    for (int op = 0; op < 4; ++op) {
        for (int r = 1; r < 3; ++r)
            if (std::memcmp(got[r][op].data(), got[0][op].data(), 4 * sizeof(double)) != 0)
                fail_msg("op %d: rank %d got other bits than rank 0", op + 1, r);
        const std::vector<double> &v = got[0][op];
        assert_true(std::isnan(v[2]));
    }
    assert_true(got[0][0][0] == (0.1 + 0.2) + 0.30000000000000004);  // in rank order
    assert_true(got[0][0][1] == -3.0 && got[0][0][3] == -1e16);
    assert_true(got[0][1][1] == -1.0);
    assert_true(got[0][2][0] == 0.30000000000000004 && got[0][2][1] == 0.0 && got[0][2][3] == 1e16);
    assert_true(got[0][3][0] == 0.1 && got[0][3][1] == -2.0 && got[0][3][3] == -1e16);
}

// Ranks that disagree on the world size at sx_create_shard_group (2 on rank 0, 3 on rank
// 1) both fail at once, naming both sizes, over local:// and tcp://.
void test_world_sizes_that_differ(void **) {
    for (const std::string &url : {"local://headers-world-" + std::to_string(getpid()),
                                   "tcp://127.0.0.1:" + std::to_string(sxtest::free_port())}) {
        std::string msgs[2];
        const std::string err = sxtest::run_ranks(2, [&](int r) -> std::string {
            sx_group_config_t cfg;
            sx_group_config_init(&cfg, sizeof cfg);
            cfg.backend = SX_BACKEND_CPU;
            cfg.rendezvous = url.c_str();
            cfg.rank = r;
            cfg.world_size = r == 0 ? 2 : 3;
            cfg.num_threads = 1;
            cfg.timeout_ms = kTimeoutMs;
            sx_shard_group_t *g = nullptr;
            const double t0 = now();
            const sx_status_t s = sx_create_shard_group(&cfg, &g);
            const double took = now() - t0;
            msgs[r] = sx_last_error_message();
            sx_destroy_shard_group(g);
            if (s != SX_ERR_MISMATCH) return "create returned " + std::to_string(s) + ": " + msgs[r];
            if (took > kAtOnce) return "create took " + std::to_string(took) + " s";
            return "";
        });
        if (!err.empty()) fail_msg("%s: %s", url.c_str(), err.c_str());
        for (const std::string &m : msgs)
            if (m.find("world_size: 2 on rank 0, 3 on rank 1") == std::string::npos)
                fail_msg("%s: the message does not name both sizes: %s", url.c_str(), m.c_str());
    }
}

// The same over tcp://, ranks as processes: a step against a load, then different
// checkpoints.
int child_main(int argc, char **argv) {
    sxtest::ChildArgs a;
    if (!sxtest::parse_child_args(argc, argv, &a)) return 2;
    const std::string dir = a.get("dir", "");
    if (a.get("stage3", "") == "1") {
        const std::string e = gathers_against_other_calls(a.rendezvous, a.rank, dir);
        if (!e.empty()) std::fprintf(stderr, "rank %d: %s\n", a.rank, e.c_str());
        return e.empty() ? 0 : 1;
    }
    sx_shard_group_t *g = nullptr;
    std::string e = make_group(a.rendezvous, a.rank, &g);
    sx_status_t s = SX_OK;
    if (e.empty()) e = step(g, 1);
    if (e.empty()) e = save(g, dir + "/ck", true, &s);
    if (e.empty() && s != SX_OK) e = std::string("save: ") + sx_last_error_message();
    if (e.empty()) e = mismatched(g, a.rank, a.rank == 0 ? kStep : kLoad, a.rank == 0 ? kLoad : kStep, dir, 0);
    if (e.empty()) e = step(g, 2);
    if (e.empty()) e = save(g, dir + "/ck2", true, &s);
    if (e.empty() && s != SX_OK) e = std::string("save: ") + sx_last_error_message();
    if (e.empty()) {
        const double t0 = now();
        s = load(g, a.rank == 0 ? dir + "/ck" : dir + "/ck2");
        if (s != SX_ERR_MISMATCH) e = std::string("different checkpoints over tcp: ") + sx_last_error_message();
        if (e.empty() && now() - t0 > kAtOnce) e = "different checkpoints over tcp took too long";
    }
    sx_destroy_shard_group(g);
    if (!e.empty()) std::fprintf(stderr, "rank %d: %s\n", a.rank, e.c_str());
    return e.empty() ? 0 : 1;
}

void test_over_tcp_as_processes(void **) {
    const std::string dir = sxtest::make_tmpdir("headers-tcp");
    const std::string err = sxtest::run_process_ranks(2, {"dir", dir}, 60);
    if (!err.empty()) fail_msg("%s", err.c_str());
    // Stage 3's gathers against the other calls.
    const std::string dir3 = dir + "/stage3";
    if (mkdir(dir3.c_str(), 0755) != 0) fail_msg("mkdir %s", dir3.c_str());
    const std::string err3 = sxtest::run_process_ranks(2, {"dir", dir3, "stage3", "1"}, 60);
    if (!err3.empty()) fail_msg("stage 3: %s", err3.c_str());
    sxtest::remove_tree(dir);
}

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranks_in_different_calls),
        cmocka_unit_test(test_loads_of_different_checkpoints),
        cmocka_unit_test(test_stage3_gathers_against_other_calls),
        cmocka_unit_test(test_over_tcp_as_processes),
        cmocka_unit_test(test_world_sizes_that_differ),
        cmocka_unit_test(test_all_reduce),
        cmocka_unit_test(test_round_trips_per_step),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
