// Norm domains and placement (sx_step.h, sx_params.h; docs/model-parallel.md): a
// tensor-parallel x data-parallel trainer, each tensor-parallel slice a data-parallel group
// of its own, all joined to one norm domain.
//  - A two-layer MLP, its first weight split by rows (column-parallel, Megatron's), its
//    second by columns (row-parallel) and its bias replicated, trained with clipping over
//    TP=2 x DP=2 (threads over local://, processes over tcp://) and TP=3 x DP=1: every
//    step's gradient norm is the same bits on every rank, and equals that of one group of
//    DP ranks training the unsharded model, as do the params after the steps (<= 1e-6
//    relative: see kTolerance); also with data-parallel groups that are 2 x 2 meshes, and
//    at stage 3.
//  - A NaN in one slice's gradient (a split param's, or a replicated one's on the copy that
//    does not count in the norm) skips the step on every rank of every group; dynamic loss
//    scaling backs off alike on all.
//  - Refusals: joins that do not make whole slices, a group joined twice, a bad slice,
//    groups stepping with different max_grad_norm (the step skipped everywhere, nothing
//    changed), a weighted step, and placements that do not fit, each with its words.
//  - The MANIFEST records each param's placement, and a checkpoint of them loads again;
//    a saved piece of a split tensor loads only into the same piece (another piece, or
//    the param declared whole, is refused naming both, and nothing changes), while a
//    replicated param loads into another copy. The ranks of a group that declare a param's
//    placement differently fail sx_finalize, naming it.
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/directory.h"
#include "io/file_ops.h"
#include "process_ranks.h"
#include "run_ranks.h"
#include "sx_cmocka.h"
#include "test_groups.h"

namespace {

// The model: y = W2 relu(W1 x) + b, loss 0.5 |y - t|^2 averaged over a batch of kB.
constexpr int kD = 3, kH = 6, kO = 2, kB = 2;
// The TP run and the unsharded one write the same fp32 gradients (the forward and backward
// are computed in double, the TP partial sums added in double by sx_all_reduce), so
// they differ only in the order the norm's squares are added (over the domain's ranks
// against over one group's), a few ulp of a double; the clip coefficient, rounded to fp32
// in the update's scale, then differs at most by one ulp of fp32 (6e-8) now and then, which
// steps carry into the params. 1e-6 relative leaves a margin of 10 such ulps.
constexpr double kTolerance = 1e-6;

std::string failed(const char *what, sx_status_t st) {
    return std::string(what) + ": " + sx_status_string(st) + " (" + sx_last_error_message() + ")";
}

double init_w1(int j, int k) { return 0.4 * std::sin(0.9 * j + 0.5 * k + 0.1); }
double init_w2(int o, int j) { return 0.4 * std::cos(0.7 * o + 0.3 * j + 0.2); }
double init_b(int o) { return 0.1 * (o + 1); }
double input(int step, int d, int i, int k) { return std::sin(1.3 * (step + 1) + 0.7 * (d * kB + i) + 1.1 * k); }
double target(int step, int d, int i, int o) { return std::cos(0.9 * (step + 1) + 0.4 * (d * kB + i) + 0.8 * o); }

struct Run {
    int tp = 2, dp = 2, steps = 4;
    double max_grad_norm = 0.05;
    bool domain = true;       // false: the unsharded reference (tp 1), no domain
    bool tcp = false;         // ranks as processes (the test's ranks' ports in ports)
    int bad_step = -1;        // the step whose gradient gets a NaN (or inf with loss scaling)
    int bad_rank = -1;        // ... on this domain rank
    int bad_param = 0;        // ... in this param: 0 W1, 1 W2, 2 b
    bool loss_scaling = false;
    int stage = 2, shard_size = 0;  // the data-parallel groups' stage and mesh
    std::string tag;
};

// What a rank saw: each step's norm, skip and loss scale, and its params at the end.
struct Seen {
    std::vector<double> norms, scales;
    std::vector<int> skipped;
    std::vector<float> w1, w2, b;  // this rank's pieces
};

struct Rank {
    sx_norm_domain_t *domain = nullptr;
    sx_shard_group_t *dp = nullptr, *tp = nullptr;
    ~Rank() {
        sx_destroy_shard_group(dp);
        sx_destroy_shard_group(tp);
        sx_destroy_norm_domain(domain);
    }
};

sx_group_config_t config(const std::string &rv, int rank, int world) {
    sx_group_config_t c;
    sx_group_config_init(&c, sizeof c);
    c.rendezvous = rv.c_str();
    c.rank = rank;
    c.world_size = world;
    c.timeout_ms = 20000;
    c.num_threads = 1;
    return c;
}

sx_status_t add(sx_shard_group_t *g, const char *name, std::vector<int64_t> shape, int placement,
                std::vector<int64_t> global, int split_dim, int64_t offset, int replica, int replicas) {
    sx_param_desc_t d;
    sx_param_desc_init(&d, sizeof d);
    d.name = name;
    d.ndim = static_cast<int32_t>(shape.size());
    d.shape = shape.data();
    d.placement = placement;
    d.global_shape = global.empty() ? nullptr : global.data();
    d.split_dim = split_dim;
    d.split_offset = offset;
    d.replica = replica;
    d.replicas = replicas;
    return sx_add_param(g, &d, nullptr);
}

// (config keeps rv's characters: rv outlives the call that takes c.)

// The rank's rendezvous: local:// names, or tcp:// ports the parent chose.
struct Places {
    std::string domain, dp, tp;
};

// The rank of domain rank `r` (dp-major: r = d * tp + t) trains run's steps.
std::string train(const Run &run, int r, const Places &at, Seen *seen) {
    const int t = r % run.tp, d = r / run.tp, H = kH / run.tp;
    Rank k;
    sx_status_t st;
    sx_group_config_t c = config(at.dp, d, run.dp);
    c.stage = run.stage;
    c.shard_size = run.shard_size;
    if ((st = sx_create_shard_group(&c, &k.dp)) != SX_OK) return failed("dp group", st);
    if (run.tp > 1) {
        sx_group_config_t ct = config(at.tp, t, run.tp);
        if ((st = sx_create_shard_group(&ct, &k.tp)) != SX_OK) return failed("tp group", st);
    }
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_SGD);
    pg.lr = 0.2;
    pg.momentum = 0.9;
    if ((st = sx_add_param_group(k.dp, &pg, nullptr)) != SX_OK) return failed("param group", st);
    const bool split = run.tp > 1;
    st = add(k.dp, "w1", {H, kD}, split ? SX_PLACEMENT_SPLIT : 0, split ? std::vector<int64_t>{kH, kD} : std::vector<int64_t>{},
             0, split ? t * H : 0, 0, 0);
    if (st == SX_OK)
        st = add(k.dp, "w2", {kO, H}, split ? SX_PLACEMENT_SPLIT : 0,
                 split ? std::vector<int64_t>{kO, kH} : std::vector<int64_t>{}, split ? 1 : 0, split ? t * H : 0, 0, 0);
    if (st == SX_OK)
        st = add(k.dp, "b", {kO}, split ? SX_PLACEMENT_REPLICATED : 0, {}, 0, 0, split ? t : 0, split ? run.tp : 0);
    if (st != SX_OK) return failed("params", st);
    if ((st = sx_finalize(k.dp)) != SX_OK) return failed("finalize", st);
    if (run.loss_scaling) {
        sx_loss_scaling_t ls;
        sx_loss_scaling_init(&ls, sizeof ls);
        ls.mode = SX_LOSS_SCALING_DYNAMIC;
        ls.init_scale = 1024;
        if ((st = sx_set_loss_scaling(k.dp, &ls)) != SX_OK) return failed("loss scaling", st);
    }
    if (run.domain) {
        sx_group_config_t cd = config(at.domain, r, run.tp * run.dp);
        if ((st = sx_create_norm_domain(&cd, &k.domain)) != SX_OK) return failed("domain", st);
        if ((st = sx_join_norm_domain(k.dp, k.domain, t)) != SX_OK) return failed("join", st);
    }
    // Stage 3: the unit is gathered around each step's forward and backward (and the
    // initial values' writes, and the final read); the views are taken inside.
    sx_view_t pv[3], gv[3];
    float *w1 = nullptr, *w2 = nullptr, *b = nullptr;
    auto gather = [&]() -> sx_status_t {
        sx_status_t gs = run.stage == 3 ? sx_unit_gather(k.dp, 0) : SX_OK;
        for (int p = 0; p < 3 && gs == SX_OK; ++p) {
            sx_view_init(&pv[p], sizeof pv[p]);
            sx_view_init(&gv[p], sizeof gv[p]);
            gs = sx_param_view(k.dp, p, &pv[p]);
            if (gs == SX_OK) gs = sx_grad_view(k.dp, p, &gv[p]);
        }
        w1 = static_cast<float *>(pv[0].data), w2 = static_cast<float *>(pv[1].data);
        b = static_cast<float *>(pv[2].data);
        return gs;
    };
    auto release = [&]() { return run.stage == 3 ? sx_unit_release(k.dp, 0) : SX_OK; };
    if ((st = gather()) != SX_OK) return failed("views", st);
    for (int j = 0; j < H; ++j)
        for (int q = 0; q < kD; ++q) w1[j * kD + q] = static_cast<float>(init_w1(t * H + j, q));
    for (int o = 0; o < kO; ++o) {
        for (int j = 0; j < H; ++j) w2[o * H + j] = static_cast<float>(init_w2(o, t * H + j));
        b[o] = static_cast<float>(init_b(o));
    }
    if ((st = release()) != SX_OK) return failed("release", st);
    for (int s = 0; s < run.steps; ++s) {
        if ((st = gather()) != SX_OK) return failed("gather", st);
        double scale = 1.0;
        if ((st = sx_get_loss_scale(k.dp, &scale)) != SX_OK) return failed("loss scale", st);
        // Forward: this slice's hidden units, and its part of y (summed over the slices).
        std::vector<double> h(kB * H), y(kB * kO, 0.0);
        for (int i = 0; i < kB; ++i) {
            for (int j = 0; j < H; ++j) {
                double a = 0.0;
                for (int q = 0; q < kD; ++q) a += double(w1[j * kD + q]) * input(s, d, i, q);
                h[i * H + j] = a > 0 ? a : 0.0;
            }
            for (int o = 0; o < kO; ++o)
                for (int j = 0; j < H; ++j) y[i * kO + o] += double(w2[o * H + j]) * h[i * H + j];
        }
        if (k.tp && (st = sx_all_reduce(k.tp, y.data(), kB * kO, SX_REDUCE_SUM)) != SX_OK)
            return failed("tp all_reduce", st);
        // Backward (times the loss scale, as a trainer's scaled loss gives).
        std::vector<double> gw1(H * kD, 0.0), gw2(kO * H, 0.0), gb(kO, 0.0);
        for (int i = 0; i < kB; ++i) {
            double dy[kO];
            for (int o = 0; o < kO; ++o) dy[o] = scale * (y[i * kO + o] + b[o] - target(s, d, i, o)) / kB;
            for (int o = 0; o < kO; ++o) {
                gb[o] += dy[o];
                for (int j = 0; j < H; ++j) gw2[o * H + j] += dy[o] * h[i * H + j];
            }
            for (int j = 0; j < H; ++j) {
                if (h[i * H + j] <= 0) continue;
                double dh = 0.0;
                for (int o = 0; o < kO; ++o) dh += double(w2[o * H + j]) * dy[o];
                for (int q = 0; q < kD; ++q) gw1[j * kD + q] += dh * input(s, d, i, q);
            }
        }
        const std::vector<double> *g[3] = {&gw1, &gw2, &gb};
        for (int p = 0; p < 3; ++p)
            for (size_t e = 0; e < g[p]->size(); ++e) static_cast<float *>(gv[p].data)[e] = float((*g[p])[e]);
        if (s == run.bad_step && r == run.bad_rank)
            static_cast<float *>(gv[run.bad_param].data)[0] = run.loss_scaling ? INFINITY : NAN;
        sx_step_options_t so;
        sx_step_options_init(&so, sizeof so);
        so.max_grad_norm = run.max_grad_norm;
        sx_step_result_t res;
        sx_step_result_init(&res, sizeof res);
        if ((st = release()) != SX_OK) return failed("release", st);
        if ((st = sx_step(k.dp, &so, &res)) != SX_OK) return failed("step", st);
        seen->norms.push_back(res.grad_norm);
        seen->skipped.push_back(res.skipped);
        seen->scales.push_back(res.loss_scale);
    }
    if ((st = gather()) != SX_OK) return failed("gather", st);
    seen->w1.assign(w1, w1 + H * kD);
    seen->w2.assign(w2, w2 + kO * H);
    seen->b.assign(b, b + kO);
    if ((st = release()) != SX_OK) return failed("release", st);
    return "";
}

// The full tensors from the slices' pieces (those of data-parallel rank 0).
void assemble(const Run &run, const std::vector<Seen> &seen, std::vector<float> *w1, std::vector<float> *w2) {
    const int H = kH / run.tp;
    w1->assign(kH * kD, 0.0f);
    w2->assign(kO * kH, 0.0f);
    for (int t = 0; t < run.tp; ++t) {
        for (int e = 0; e < H * kD; ++e) (*w1)[t * H * kD + e] = seen[t].w1[e];
        for (int o = 0; o < kO; ++o)
            for (int j = 0; j < H; ++j) (*w2)[o * kH + t * H + j] = seen[t].w2[o * H + j];
    }
}

std::vector<Seen> run_threads(const Run &run) {
    const int world = run.tp * run.dp;
    std::vector<Seen> seen(world);
    const std::string base = "local://nd-" + run.tag + (run.domain ? "" : "-ref");
    const std::string err = sxtest::run_ranks(world, [&](int r) {
        Places at{base + "-domain", base + "-dp" + std::to_string(r % run.tp), base + "-tp" + std::to_string(r / run.tp)};
        return train(run, r, at, &seen[r]);
    });
    if (!err.empty()) fail_msg("%s: %s", run.tag.c_str(), err.c_str());
    return seen;
}

void expect_close(const std::vector<float> &got, const std::vector<float> &want, const char *what) {
    assert_int_equal(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
        const double diff = std::fabs(double(got[i]) - want[i]), mag = std::fabs(double(want[i]));
        if (diff > kTolerance * (mag > 1e-3 ? mag : 1e-3))
            fail_msg("%s[%zu] = %.9g, the unsharded model's %.9g", what, i, got[i], want[i]);
    }
}

// Every rank's norms and skips are the same bits, and equal the reference's within kTolerance.
void compare(const Run &run, const std::vector<Seen> &seen, const std::vector<Seen> &ref) {
    for (size_t r = 1; r < seen.size(); ++r) {
        assert_memory_equal(seen[r].norms.data(), seen[0].norms.data(), seen[0].norms.size() * sizeof(double));
        assert_true(seen[r].skipped == seen[0].skipped);
        assert_true(seen[r].scales == seen[0].scales);
    }
    for (size_t s = 0; s < ref[0].norms.size(); ++s) {
        assert_int_equal(seen[0].skipped[s], ref[0].skipped[s]);
        if (std::fabs(seen[0].norms[s] - ref[0].norms[s]) > kTolerance * ref[0].norms[s])
            fail_msg("step %zu: the domain's norm %.17g, the unsharded model's %.17g", s, seen[0].norms[s],
                     ref[0].norms[s]);
        // Clipping is active: the test would prove nothing otherwise.
        assert_true(ref[0].skipped[s] || ref[0].norms[s] > run.max_grad_norm);
    }
    std::vector<float> w1, w2;
    assemble(run, seen, &w1, &w2);
    expect_close(w1, ref[0].w1, "w1");
    expect_close(w2, ref[0].w2, "w2");
    for (int t = 0; t < run.tp; ++t) expect_close(seen[t].b, ref[0].b, "b");
}

Run reference_of(Run run) {
    run.tp = 1;
    run.domain = false;
    if (run.bad_rank >= 0) run.bad_step = -1;  // the unsharded run skips nothing: compared where it matters
    return run;
}

void test_tp2_dp2_threads_equal_the_unsharded_model(void **) {
    Run run;
    run.tag = "tp2dp2";
    compare(run, run_threads(run), run_threads(reference_of(run)));
}

// Data-parallel groups that are meshes (HSDP: 2 replicas of 2 shards), at stage 1.
void test_tp2_dp4_meshes_equal_the_unsharded_model(void **) {
    Run run;
    run.dp = 4;
    run.shard_size = 2;
    run.stage = 1;
    run.tag = "tp2dp4mesh";
    compare(run, run_threads(run), run_threads(reference_of(run)));
}

// Data-parallel groups at stage 3 (each rank holds a shard of the params between steps).
void test_tp2_dp2_stage3_equal_the_unsharded_model(void **) {
    Run run;
    run.stage = 3;
    run.tag = "tp2dp2s3";
    compare(run, run_threads(run), run_threads(reference_of(run)));
}

void test_tp3_dp1_threads_equal_the_unsharded_model(void **) {
    Run run;
    run.tp = 3;
    run.dp = 1;
    run.tag = "tp3dp1";
    compare(run, run_threads(run), run_threads(reference_of(run)));
}

// A NaN on one rank of one slice skips the step on every rank of every group, even in the
// copy of the replicated bias that does not count in the norm; the other steps go on.
void test_a_nonfinite_slice_skips_every_group(void **) {
    for (int param : {0, 2}) {
        Run run;
        run.tag = "nan" + std::to_string(param);
        run.bad_step = 1;
        run.bad_rank = 3;  // tp 1 of dp 1: b's copy 1 does not count in the norm
        run.bad_param = param;
        const std::vector<Seen> seen = run_threads(run);
        for (const Seen &s : seen) {
            assert_true(s.skipped == std::vector<int>({0, 1, 0, 0}));
            assert_true(std::isnan(s.norms[1]));
        }
        for (size_t r = 1; r < seen.size(); ++r)
            assert_memory_equal(seen[r].norms.data(), seen[0].norms.data(), 4 * sizeof(double));
        // Every slice skipped, so the params are those of the same run without step 1's
        // update... which a run without the NaN and its step 1 cannot give simply; instead:
        // the replicas of b agree bit for bit across the slices.
        for (size_t r = 1; r < seen.size(); ++r) assert_memory_equal(seen[r].b.data(), seen[0].b.data(), kO * 4);
    }
}

// Dynamic loss scaling: an inf on one slice backs the scale off on every rank alike.
void test_loss_scaling_backs_off_on_every_group(void **) {
    Run run;
    run.tag = "scale";
    run.loss_scaling = true;
    run.bad_step = 2;
    run.bad_rank = 1;
    run.bad_param = 1;
    const std::vector<Seen> seen = run_threads(run);
    for (const Seen &s : seen) {
        assert_true(s.skipped == std::vector<int>({0, 0, 1, 0}));
        assert_true(s.scales[2] == 512.0 && s.scales[3] == 512.0);
    }
    // Without the inf, the same run with loss scaling equals the unsharded one.
    Run clean = run;
    clean.tag = "scale-clean";
    clean.bad_step = -1;
    compare(clean, run_threads(clean), run_threads(reference_of(clean)));
}

// Ranks as processes over tcp://: TP=2 x DP=2, against the unsharded model (threads).
int child_main(int argc, char **argv) {
    sxtest::ChildArgs a;
    if (!sxtest::parse_child_args(argc, argv, &a)) return 2;
    Run run;
    run.tag = "tcp";
    const int t = a.rank % run.tp, d = a.rank / run.tp;
    Places at{a.rendezvous, a.get("--dp" + std::to_string(t), ""), a.get("--tp" + std::to_string(d), "")};
    Seen seen;
    const std::string err = train(run, a.rank, at, &seen);
    if (!err.empty()) return std::fprintf(stderr, "rank %d: %s\n", a.rank, err.c_str()), 3;
    FILE *f = std::fopen(a.get("--out", "").append(std::to_string(a.rank)).c_str(), "wb");
    if (!f) return 3;
    std::fwrite(seen.norms.data(), sizeof(double), seen.norms.size(), f);
    std::fwrite(seen.w1.data(), 4, seen.w1.size(), f);
    std::fwrite(seen.w2.data(), 4, seen.w2.size(), f);
    std::fwrite(seen.b.data(), 4, seen.b.size(), f);
    return std::fclose(f) == 0 ? 0 : 3;
}

void test_tp2_dp2_processes_over_tcp(void **) {
    Run run;
    run.tag = "tcp";
    char dir[] = "/tmp/sx-norm-domain-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const std::string out = std::string(dir) + "/seen-";
    auto port = [] { return "tcp://127.0.0.1:" + std::to_string(sxtest::free_port()); };
    const std::string err = sxtest::run_process_ranks(
        4, {"--dp0", port(), "--dp1", port(), "--tp0", port(), "--tp1", port(), "--out", out}, 120);
    if (!err.empty()) fail_msg("%s", err.c_str());
    std::vector<Seen> seen(4);
    const int H = kH / run.tp;
    for (int r = 0; r < 4; ++r) {
        Seen &s = seen[r];
        s.norms.resize(run.steps);
        s.skipped.assign(run.steps, 0);
        s.scales.assign(run.steps, 1.0);
        s.w1.resize(H * kD);
        s.w2.resize(kO * H);
        s.b.resize(kO);
        FILE *f = std::fopen((out + std::to_string(r)).c_str(), "rb");
        assert_non_null(f);
        assert_int_equal(std::fread(s.norms.data(), sizeof(double), s.norms.size(), f), s.norms.size());
        assert_int_equal(std::fread(s.w1.data(), 4, s.w1.size(), f), s.w1.size());
        assert_int_equal(std::fread(s.w2.data(), 4, s.w2.size(), f), s.w2.size());
        assert_int_equal(std::fread(s.b.data(), 4, s.b.size(), f), s.b.size());
        std::fclose(f);
        std::remove((out + std::to_string(r)).c_str());
    }
    ::rmdir(dir);
    compare(run, seen, run_threads(reference_of(run)));
}

// --- refusals ---

// Joins on 4 ranks whose slices are not whole, or whose arguments are bad: every rank
// fails, and nothing is joined (a good join after them succeeds, and steps).
void test_bad_joins_are_refused_on_every_rank(void **) {
    const std::string err = sxtest::run_ranks(4, [&](int r) -> std::string {
        const int t = r % 2, d = r / 2;
        Rank k;
        const std::string rv = "local://nd-bad-dp" + std::to_string(t);
        sx_group_config_t c = config(rv, d, 2);
        sx_status_t st = sx_create_shard_group(&c, &k.dp);
        const std::string drv = "local://nd-bad-domain";
        sx_group_config_t cd = config(drv, r, 4);
        cd.timeout_ms = 20000;
        if (st == SX_OK) st = sx_create_norm_domain(&cd, &k.domain);
        if (st != SX_OK) return failed("setup", st);
        // Slice 0 and 2, none 1: a gap.
        st = sx_join_norm_domain(k.dp, k.domain, t == 0 ? 0 : 2);
        if (st != SX_ERR_MISMATCH || !std::strstr(sx_last_error_message(), "no rank joined slice 1"))
            return failed("a gap in the slices", st);
        // Everyone on slice 0: two ranks per group rank.
        st = sx_join_norm_domain(k.dp, k.domain, 0);
        if (st != SX_ERR_MISMATCH || !std::strstr(sx_last_error_message(), "both joined slice 0"))
            return failed("a slice joined twice", st);
        // A negative slice on rank 3: its own words there, the others told which rank.
        st = sx_join_norm_domain(k.dp, k.domain, r == 3 ? -1 : t);
        if (r == 3 ? st != SX_ERR_INVALID_ARGUMENT || !std::strstr(sx_last_error_message(), "slice is -1")
                   : st != SX_ERR_MISMATCH || !std::strstr(sx_last_error_message(), "rank 3 of the domain refused"))
            return failed("a negative slice", st);
        if (sx_join_norm_domain(k.dp, nullptr, t) != SX_ERR_INVALID_HANDLE) return "a NULL domain was taken";
        // Now a good join, and a second one refused on every rank.
        if ((st = sx_join_norm_domain(k.dp, k.domain, t)) != SX_OK) return failed("the good join", st);
        st = sx_join_norm_domain(k.dp, k.domain, t);
        if (st != SX_ERR_INVALID_STATE || !std::strstr(sx_last_error_message(), "has joined a norm domain already"))
            return failed("a second join", st);
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// Groups of one domain stepping with different max_grad_norm: the step is skipped on every
// rank (params unchanged), SX_ERR_MISMATCH names it; a weighted step is refused.
void test_steps_that_differ_are_refused(void **) {
    const std::string err = sxtest::run_ranks(2, [&](int r) -> std::string {
        Rank k;
        const std::string rv = "local://nd-diff-dp" + std::to_string(r), drv = "local://nd-diff-domain";
        sx_group_config_t c = config(rv, 0, 1);
        sx_status_t st = sx_create_shard_group(&c, &k.dp);
        sx_param_group_desc_t pg;
        sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_SGD);
        if (st == SX_OK) st = sx_add_param_group(k.dp, &pg, nullptr);
        if (st == SX_OK) st = add(k.dp, "w", {4}, SX_PLACEMENT_SPLIT, {8}, 0, 4 * r, 0, 0);
        if (st == SX_OK) st = sx_finalize(k.dp);
        sx_group_config_t cd = config(drv, r, 2);
        if (st == SX_OK) st = sx_create_norm_domain(&cd, &k.domain);
        if (st == SX_OK) st = sx_join_norm_domain(k.dp, k.domain, r);
        if (st != SX_OK) return failed("setup", st);
        sx_view_t pv, gv;
        sx_view_init(&pv, sizeof pv);
        sx_view_init(&gv, sizeof gv);
        sx_param_view(k.dp, 0, &pv);
        sx_grad_view(k.dp, 0, &gv);
        for (int i = 0; i < 4; ++i) static_cast<float *>(pv.data)[i] = 1.0f, static_cast<float *>(gv.data)[i] = 0.5f;
        sx_step_options_t so;
        sx_step_options_init(&so, sizeof so);
        so.max_grad_norm = r == 0 ? 1.0 : 2.0;
        sx_step_result_t res;
        sx_step_result_init(&res, sizeof res);
        st = sx_step(k.dp, &so, &res);
        if (st != SX_ERR_MISMATCH || !std::strstr(sx_last_error_message(), "max_grad_norm is 2 on domain rank 1"))
            return failed("different max_grad_norm", st);
        for (int i = 0; i < 4; ++i)
            if (static_cast<float *>(pv.data)[i] != 1.0f) return "a refused step changed a param";
        so.max_grad_norm = 1.0;
        so.weighted = 1;
        so.weight = 1.0;
        st = sx_step(k.dp, &so, &res);
        if (st != SX_ERR_UNSUPPORTED || !std::strstr(sx_last_error_message(), "weighted")) return failed("weighted", st);
        // The same options on both: the step goes, over both slices' gradients (norm of 8 x 0.5).
        so.weighted = 0;
        so.weight = 0.0;
        for (int i = 0; i < 4; ++i) static_cast<float *>(gv.data)[i] = 0.5f;
        if ((st = sx_step(k.dp, &so, &res)) != SX_OK) return failed("the agreed step", st);
        if (res.grad_norm != std::sqrt(8 * 0.25)) return "the agreed step's norm is not that of both slices";
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

// A group of one rank over `rv` with one SGD param group.
sx_shard_group_t *one_rank_sgd_group(const std::string &rv) {
    sx_group_config_t c = config(rv, 0, 1);
    sx_shard_group_t *g = nullptr;
    assert_int_equal(sx_create_shard_group(&c, &g), SX_OK);
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_SGD);
    assert_int_equal(sx_add_param_group(g, &pg, nullptr), SX_OK);
    return g;
}

// Placements that do not fit are refused with their words, and add nothing.
void test_bad_placements_are_refused(void **) {
    sx_shard_group_t *g = one_rank_sgd_group("local://nd-placement");
    struct Case {
        int placement;
        std::vector<int64_t> global;
        int split_dim;
        int64_t offset;
        int replica, replicas;
        const char *words;
    } cases[] = {
        {SX_PLACEMENT_SPLIT, {8, 5}, 0, 6, 0, 0, "does not fit in the logical tensor's extent 8"},
        {SX_PLACEMENT_SPLIT, {8, 5}, 0, -1, 0, 0, "does not fit"},
        {SX_PLACEMENT_SPLIT, {8, 6}, 0, 0, 0, 0, "global_shape[1] = 6 differs from shape[1] = 5"},
        {SX_PLACEMENT_SPLIT, {8, 5}, 2, 0, 0, 0, "split_dim 2 is outside [0, 2)"},
        {SX_PLACEMENT_SPLIT, {}, 0, 0, 0, 0, "global_shape is NULL"},
        {SX_PLACEMENT_SPLIT, {8, 5}, 0, 0, 1, 2, "must be 0 for SX_PLACEMENT_SPLIT"},
        {SX_PLACEMENT_REPLICATED, {}, 0, 0, 2, 2, "replica 2 is outside [0, desc->replicas = 2)"},
        {SX_PLACEMENT_REPLICATED, {}, 0, 0, 0, 0, "replicas >= 1"},
        {SX_PLACEMENT_REPLICATED, {8, 5}, 0, 0, 0, 1, "global_shape is for SX_PLACEMENT_SPLIT"},
        {SX_PLACEMENT_WHOLE, {}, 1, 0, 0, 0, "are for SX_PLACEMENT_SPLIT"},
        {SX_PLACEMENT_WHOLE, {}, 0, 0, 0, 2, "are for SX_PLACEMENT_REPLICATED"},
        {7, {}, 0, 0, 0, 0, "placement 7 is not SX_PLACEMENT_WHOLE"},
    };
    for (const Case &k : cases) {
        const sx_status_t st = add(g, "w", {4, 5}, k.placement, k.global, k.split_dim, k.offset, k.replica, k.replicas);
        if (st != SX_ERR_INVALID_ARGUMENT || !std::strstr(sx_last_error_message(), k.words))
            fail_msg("placement %d: %s, not '%s'", k.placement, failed("sx_add_param", st).c_str(), k.words);
    }
    int32_t n = -1;
    assert_int_equal(sx_get_num_params(g, &n), SX_OK);
    assert_int_equal(n, 0);
    // Those that fit: the last piece of a split, a replica.
    assert_int_equal(add(g, "w", {4, 5}, SX_PLACEMENT_SPLIT, {8, 5}, 0, 4, 0, 0), SX_OK);
    assert_int_equal(add(g, "n", {5}, SX_PLACEMENT_REPLICATED, {}, 0, 0, 2, 3), SX_OK);
    sx_destroy_shard_group(g);
}

// A checkpoint's MANIFEST holds each param's placement; the checkpoint loads back.
void test_the_manifest_records_placement(void **) {
    char dir[] = "/tmp/sx-norm-domain-ckpt-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const std::string path = std::string(dir) + "/ck";
    sx_shard_group_t *g = one_rank_sgd_group("local://nd-manifest");
    assert_int_equal(add(g, "w2", {kO, 3}, SX_PLACEMENT_SPLIT, {kO, kH}, 1, 3, 0, 0), SX_OK);
    assert_int_equal(add(g, "b", {kO}, SX_PLACEMENT_REPLICATED, {}, 0, 0, 1, 2), SX_OK);
    assert_int_equal(add(g, "whole", {5}, SX_PLACEMENT_WHOLE, {}, 0, 0, 0, 0), SX_OK);
    assert_int_equal(sx_finalize(g), SX_OK);
    sxtest::save_sync(g, path);
    sx::ckpt::Manifest m;
    assert_true(sx::ckpt::read_manifest(*sx::io::posix_file_ops(), path, &m).ok());
    assert_int_equal(m.params.size(), 3);
    const sx::ckpt::ParamEntry &w2 = m.params[0], &b = m.params[1], &whole = m.params[2];
    assert_int_equal(w2.placement, SX_PLACEMENT_SPLIT);
    assert_true(w2.global_shape == std::vector<int64_t>({kO, kH}));
    assert_int_equal(w2.split_dim, 1);
    assert_int_equal(w2.split_offset, 3);
    assert_int_equal(b.placement, SX_PLACEMENT_REPLICATED);
    assert_int_equal(b.replica, 1);
    assert_int_equal(b.replicas, 2);
    assert_int_equal(whole.placement, SX_PLACEMENT_WHOLE);
    assert_true(whole.global_shape.empty());
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    assert_int_equal(sx_load_optim_state(g, &lo), SX_OK);
    sx_destroy_shard_group(g);
    // Another piece of w2 (TP rank 0's where rank 1 saved), then w2 declared whole: both
    // refused, naming the two placements, the values left as they were. The replicated b
    // as another copy, and "whole" declared as a piece: loaded.
    struct Other {
        int placement;
        std::vector<int64_t> global;
        int64_t offset;
        const char *words;
    } others[] = {
        {SX_PLACEMENT_SPLIT, {kO, kH}, 0, "is the piece at 0 on dimension 1 (of 6) of [2, 6] here but the piece at 3"},
        {SX_PLACEMENT_WHOLE, {}, 0, "is whole here but the piece at 3 on dimension 1 (of 6) of [2, 6] in the checkpoint"},
        {SX_PLACEMENT_SPLIT, {kO, kH}, 3, nullptr},
    };
    for (const Other &o : others) {
        sx_shard_group_t *h = one_rank_sgd_group("local://nd-manifest-other");
        assert_int_equal(add(h, "w2", {kO, 3}, o.placement, o.global, o.placement ? 1 : 0, o.offset, 0, 0), SX_OK);
        assert_int_equal(add(h, "b", {kO}, SX_PLACEMENT_REPLICATED, {}, 0, 0, 0, 2), SX_OK);
        assert_int_equal(add(h, "whole", {5}, SX_PLACEMENT_SPLIT, {10}, 0, 5, 0, 0), SX_OK);
        assert_int_equal(sx_finalize(h), SX_OK);
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        assert_int_equal(sx_param_view(h, 0, &v), SX_OK);
        for (int i = 0; i < kO * 3; ++i) static_cast<float *>(v.data)[i] = -5.0f;
        const sx_status_t st = sx_load_optim_state(h, &lo);
        if (o.words) {
            if (st != SX_ERR_MISMATCH || !std::strstr(sx_last_error_message(), o.words))
                fail_msg("%s, not '%s'", failed("loading another placement", st).c_str(), o.words);
            for (int i = 0; i < kO * 3; ++i) assert_true(static_cast<float *>(v.data)[i] == -5.0f);
        } else if (st != SX_OK) {
            fail_msg("%s", failed("loading the same piece, another copy of b", st).c_str());
        }
        sx_destroy_shard_group(h);
    }
    std::string rm = std::string("rm -rf ") + dir;
    assert_int_equal(std::system(rm.c_str()), 0);
}

// Two ranks of one group that place a param differently (another offset) fail
// sx_finalize on both, naming the param's placement.
void test_ranks_that_place_a_param_differently_fail_finalize(void **) {
    const std::string err = sxtest::run_ranks(2, [&](int r) -> std::string {
        sx_shard_group_t *g = nullptr;
        const std::string rv = "local://nd-finalize-placement";
        sx_group_config_t c = config(rv, r, 2);
        sx_status_t st = sx_create_shard_group(&c, &g);
        sx_param_group_desc_t pg;
        sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_SGD);
        if (st == SX_OK) st = sx_add_param_group(g, &pg, nullptr);
        if (st == SX_OK) st = add(g, "w", {4}, SX_PLACEMENT_SPLIT, {8}, 0, 4 * r, 0, 0);
        if (st != SX_OK) {
            sx_destroy_shard_group(g);
            return failed("setup", st);
        }
        st = sx_finalize(g);
        const std::string msg = sx_last_error_message();
        sx_destroy_shard_group(g);
        if (st != SX_ERR_MISMATCH || msg.find("param 'w' placement") == std::string::npos ||
            msg.find("the piece at 4 on dimension 0") == std::string::npos)
            return "finalize with placements that differ: " + std::string(sx_status_string(st)) + " (" + msg + ")";
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
}

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp2_dp2_threads_equal_the_unsharded_model),
        cmocka_unit_test(test_tp2_dp4_meshes_equal_the_unsharded_model),
        cmocka_unit_test(test_tp2_dp2_stage3_equal_the_unsharded_model),
        cmocka_unit_test(test_tp3_dp1_threads_equal_the_unsharded_model),
        cmocka_unit_test(test_a_nonfinite_slice_skips_every_group),
        cmocka_unit_test(test_loss_scaling_backs_off_on_every_group),
        cmocka_unit_test(test_tp2_dp2_processes_over_tcp),
        cmocka_unit_test(test_bad_joins_are_refused_on_every_rank),
        cmocka_unit_test(test_steps_that_differ_are_refused),
        cmocka_unit_test(test_bad_placements_are_refused),
        cmocka_unit_test(test_the_manifest_records_placement),
        cmocka_unit_test(test_ranks_that_place_a_param_differently_fail_finalize),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
