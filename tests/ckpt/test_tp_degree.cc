// A checkpoint loads at another tensor-parallel degree (docs/model-parallel.md,
// "Placement"): a param declared as a piece of a split tensor takes its values, masters
// and optimizer slots from the logical tensor saved whole (a run at a lower degree, or
// the slices' checkpoints joined by `sxckpt join`), or from a saved piece of the same
// tensor, split on the same dimension, that contains it.
//  - An unsharded run (whole params, 2 data-parallel ranks) saves at step 3; a TP = 2 x
//    DP = 2 run (the first weight split by rows, the second by columns, the bias
//    replicated) loads it: every piece is the saved tensor's sub-box, bit for bit, and
//    after 3 more steps with the same gradients the pieces are still the unsharded run's
//    (AdamW's moments and step counts came along: any slot missed would change the bits).
//  - That TP = 2 run's slices save; a TP = 4 x DP = 1 run at stage 3 loads each piece from
//    the slice whose piece contains it (2 -> 4), and ends equal too.
//  - Another pipeline split: stages {w1} | {w2, b} save; stages {w1, w2} | {b} load each
//    param from the old stage's checkpoint that holds it, and end equal too.
//  - Refusals: a piece that straddles two saved pieces, 8-bit state and Adafactor's
//    factored moments cut from a larger tensor (each named; nothing changes), while the
//    same loads of params only succeed.
// Every data-parallel rank writes the same gradient and the groups have 1 or 2 ranks, so
// the averaged gradient is the same bits in every layout (x + x and its half are exact;
// three ranks' x + x + x is not always 3x), which keeps the comparison bit for bit.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "run_ranks.h"
#include "sx_cmocka.h"
#include "test_groups.h"

namespace {

constexpr int kD = 3, kH = 8, kO = 2, kSteps = 3;

std::string failed(const char *what, sx_status_t st) {
    return std::string(what) + ": " + sx_status_string(st) + " (" + sx_last_error_message() + ")";
}

// The logical model: w1 [kH, kD], w2 [kO, kH], b [kO]; their initial values and each
// step's gradients, element by element of the logical tensor.
const std::vector<int64_t> kShapes[3] = {{kH, kD}, {kO, kH}, {kO}};
const char *const kNames[3] = {"w1", "w2", "b"};
float init_value(int p, int64_t e) { return static_cast<float>(0.3 * std::sin(0.7 * e + 1.9 * p + 0.2)); }
float grad_value(int p, int step, int64_t e) { return static_cast<float>(0.05 * std::cos(0.41 * e + 1.3 * step + p)); }

// Logical element of a piece's element i: w1 split by rows, w2 by columns, `tp` ways.
int64_t logical(int p, int tp, int t, int64_t i) {
    if (tp == 1 || p == 2) return i;
    const int64_t h = kH / tp;
    if (p == 0) return t * h * kD + i;              // rows [t h, (t + 1) h) of w1
    return (i / h) * kH + t * h + i % h;            // columns [t h, (t + 1) h) of w2
}

int64_t piece_numel(int p, int tp) { return p == 2 ? kO : (p == 0 ? kH * kD : kO * kH) / tp; }

// The logical params as an unsharded run holds them (tp 1) or as pieces (one slice's).
struct Values {
    std::vector<float> v[3];
};

// tp slices of dp ranks each at ZeRO stage `stage`; with `stages` given, the slices are
// pipeline stages instead, slice t holding the whole params stages[t].
struct Layout {
    int tp = 1, dp = 2, stage = 2;
    std::string tag;
    std::vector<std::vector<int>> stages;
    // How many ways the params are split, and which slice t holds.
    int split() const { return stages.empty() ? tp : 1; }
    std::vector<int> held(int t) const { return stages.empty() ? std::vector<int>{0, 1, 2} : stages[t]; }
};

sx_status_t add_params(sx_shard_group_t *g, const Layout &l, int t) {
    const int64_t h = kH / l.split();
    const std::vector<int64_t> shapes[3] = {{h, kD}, {kO, h}, {kO}};
    sx_status_t st = SX_OK;
    for (int p : l.held(t)) {
        if (st != SX_OK) break;
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = kNames[p];
        d.ndim = static_cast<int32_t>(shapes[p].size());
        d.shape = shapes[p].data();
        if (l.split() > 1 && p < 2) {
            d.placement = SX_PLACEMENT_SPLIT;
            d.split_dim = p;
            d.global_shape = kShapes[p].data();
            d.split_offset = t * h;
        } else if (l.split() > 1) {
            d.placement = SX_PLACEMENT_REPLICATED;
            d.replica = t;
            d.replicas = l.tp;
        }
        st = sx_add_param(g, &d, nullptr);
    }
    return st;
}

// One rank's part of a run: its group loaded from the checkpoints `from` in turn (none:
// initialised; a pipeline stage's group takes from each what it holds), saved into
// `save_at_load` right after that (if not empty), kSteps steps from step `first`, saved
// into `save_at_end` (if not empty).
struct Leg {
    std::vector<std::string> from;
    std::string save_at_load, save_at_end;
    int first = 0;
};

// The rank of slice t, data-parallel rank d, of layout l: *at_load gets its pieces after
// the load (or the initialisation), *after at the end.
std::string run_rank(const Layout &l, int t, int d, const Leg &leg, Values *at_load, Values *after) {
    const std::string rv = "local://" + l.tag + "-" + std::to_string(t);
    sx_group_config_t c;
    sx_group_config_init(&c, sizeof c);
    c.rendezvous = rv.c_str();
    c.rank = d;
    c.world_size = l.dp;
    c.num_threads = 1;
    c.stage = l.stage;
    c.timeout_ms = 20000;
    sx_shard_group_t *g = nullptr;
    sx_status_t st = sx_create_shard_group(&c, &g);
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    pg.lr = 0.01;
    if (st == SX_OK) st = sx_add_param_group(g, &pg, nullptr);
    if (st == SX_OK) st = add_params(g, l, t);
    if (st == SX_OK) st = sx_finalize(g);
    std::string err = st == SX_OK ? "" : failed("setup", st);
    const int n = l.split();
    // Each param's values (and gradient) through its view, gathered around at stage 3.
    auto with_views = [&](const char *what, const std::function<void(int, float *, float *)> &fn) {
        if (!err.empty()) return;
        sx_status_t s = l.stage == 3 ? sx_unit_gather(g, 0) : SX_OK;
        const std::vector<int> held = l.held(t);
        for (int k = 0; k < static_cast<int>(held.size()) && s == SX_OK; ++k) {
            sx_view_t pv, gv;
            sx_view_init(&pv, sizeof pv);
            sx_view_init(&gv, sizeof gv);
            s = sx_param_view(g, k, &pv);
            if (s == SX_OK) s = sx_grad_view(g, k, &gv);
            if (s == SX_OK) fn(held[k], static_cast<float *>(pv.data), static_cast<float *>(gv.data));
        }
        if (s == SX_OK && l.stage == 3) s = sx_unit_release(g, 0);
        if (s != SX_OK) err = failed(what, s);
    };
    auto keep = [&](Values *into) {
        with_views("views", [&](int p, float *v, float *) { into->v[p].assign(v, v + piece_numel(p, n)); });
    };
    if (leg.from.empty()) {
        with_views("init", [&](int p, float *v, float *) {
            for (int64_t i = 0; i < piece_numel(p, n); ++i) v[i] = init_value(p, logical(p, n, t, i));
        });
    }
    for (const std::string &from : leg.from) {
        if (!err.empty()) break;
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = from.c_str();
        if (!l.stages.empty()) lo.flags = SX_LOAD_ALLOW_MISSING | SX_LOAD_ALLOW_EXTRA;
        if ((st = sx_load_optim_state(g, &lo)) != SX_OK) err = failed(("loading " + from).c_str(), st);
    }
    keep(at_load);
    if (err.empty() && !leg.save_at_load.empty() && (st = sxtest::save_synchronously(g, leg.save_at_load)) != SX_OK)
        err = failed("save", st);
    for (int s = leg.first; s < leg.first + kSteps && err.empty(); ++s) {
        with_views("grads", [&](int p, float *, float *gr) {
            for (int64_t i = 0; i < piece_numel(p, n); ++i) gr[i] = grad_value(p, s, logical(p, n, t, i));
        });
        if (err.empty() && (st = sx_step(g, nullptr, nullptr)) != SX_OK) err = failed("step", st);
    }
    keep(after);
    if (err.empty() && !leg.save_at_end.empty() && (st = sxtest::save_synchronously(g, leg.save_at_end)) != SX_OK)
        err = failed("save", st);
    sx_destroy_shard_group(g);
    return err;
}

// Runs every rank of layout l (slice t = r % tp, data-parallel rank r / tp); *at_load and
// *after get each slice's pieces as its data-parallel rank 0 saw them (every rank's must
// be the same). `leg_of(t)` is slice t's leg.
void run_layout(const Layout &l, const std::function<Leg(int)> &leg_of, std::vector<Values> *at_load,
                std::vector<Values> *after) {
    const int n = l.tp * l.dp;
    std::vector<Values> loaded(static_cast<size_t>(n)), ended(static_cast<size_t>(n));
    const std::string err = sxtest::run_ranks(n, [&](int r) {
        return run_rank(l, r % l.tp, r / l.tp, leg_of(r % l.tp), &loaded[r], &ended[r]);
    });
    if (!err.empty()) fail_msg("%s: %s", l.tag.c_str(), err.c_str());
    for (int r = l.tp; r < n; ++r)
        for (int p = 0; p < 3; ++p) assert_true(ended[r].v[p] == ended[r % l.tp].v[p]);
    loaded.resize(static_cast<size_t>(l.tp));
    ended.resize(static_cast<size_t>(l.tp));
    *at_load = std::move(loaded);
    *after = std::move(ended);
}

// Every slice's pieces (of the params it holds) are the unsharded values' sub-boxes, bit
// for bit.
void expect_pieces(const char *what, const Layout &l, const std::vector<Values> &pieces, const Values &whole) {
    const int tp = l.split();
    for (int t = 0; t < l.tp; ++t)
        for (int p : l.held(t))
            for (int64_t i = 0; i < piece_numel(p, tp); ++i) {
                const float got = pieces[t].v[p][i], want = whole.v[p][logical(p, tp, t, i)];
                if (std::memcmp(&got, &want, sizeof got) != 0)
                    fail_msg("%s: slice %d of %d, %s[%lld] (logical %lld) is %.9g, not %.9g", what, t, tp, kNames[p],
                             static_cast<long long>(i), static_cast<long long>(logical(p, tp, t, i)), got, want);
            }
}

std::string temp_dir() {
    char dir[] = "/tmp/sx-tp-degree-XXXXXX";
    assert_non_null(mkdtemp(dir));
    return dir;
}

void remove_dir(const std::string &dir) { assert_int_equal(std::system(("rm -rf " + dir).c_str()), 0); }

// The unsharded run: 3 steps, saved into `whole`, loaded again and 3 more: *mid and *end
// its values after 3 and 6 steps.
void run_unsharded(const std::string &whole, const std::string &pid, Values *mid, Values *end) {
    std::vector<Values> start, at3, loaded, at6;
    const Layout u1{1, 2, 2, "tpd-u1-" + pid, {}}, u2{1, 2, 2, "tpd-u2-" + pid, {}};
    run_layout(u1, [&](int) { return Leg{{}, "", whole, 0}; }, &start, &at3);
    run_layout(u2, [&](int) { return Leg{{whole}, "", "", kSteps}; }, &loaded, &at6);
    expect_pieces("the unsharded run, loaded", u2, loaded, at3[0]);
    // The optimizer state matters: the second 3 steps move the params as the first did not.
    assert_true(at6[0].v[0] != at3[0].v[0]);
    *mid = at3[0];
    *end = at6[0];
}

void test_a_whole_checkpoint_loads_into_tp2_and_on_into_tp4(void **) {
    const std::string dir = temp_dir(), pid = std::to_string(getpid()), whole = dir + "/whole";
    Values mid, end;
    run_unsharded(whole, pid, &mid, &end);
    // TP = 2 x DP = 2 from the whole checkpoint; each slice saves what it loaded, into a
    // directory of its own (a save owns its parent directory: its `latest`, its retention).
    for (const char *slice : {"/tp2-0", "/tp2-1"}) assert_int_equal(mkdir((dir + slice).c_str(), 0755), 0);
    std::vector<Values> tp2_loaded, tp2_end;
    const Layout tp2{2, 2, 2, "tpd-t2-" + pid, {}};
    run_layout(tp2, [&](int t) { return Leg{{whole}, dir + "/tp2-" + std::to_string(t) + "/ck", "", kSteps}; },
               &tp2_loaded, &tp2_end);
    expect_pieces("TP = 2, loaded from the whole tensors", tp2, tp2_loaded, mid);
    expect_pieces("TP = 2, 3 steps after", tp2, tp2_end, end);
    // TP = 4 x DP = 1 at stage 3, each piece from the TP = 2 slice that holds it.
    std::vector<Values> tp4_loaded, tp4_end;
    const Layout tp4{4, 1, 3, "tpd-t4-" + pid, {}};
    run_layout(tp4, [&](int t) { return Leg{{dir + "/tp2-" + std::to_string(t / 2) + "/ck"}, "", "", kSteps}; },
               &tp4_loaded, &tp4_end);
    expect_pieces("TP = 4, loaded from the TP = 2 slices", tp4, tp4_loaded, mid);
    expect_pieces("TP = 4, 3 steps after", tp4, tp4_end, end);
    remove_dir(dir);
}

// Another pipeline split: stages {w1} | {w2, b} of 2 data-parallel ranks each save after
// 3 steps; stages {w1, w2} | {b} of one rank (the first at ZeRO stage 3) take each param
// from the old stage's checkpoint that holds it (one load per checkpoint, missing and
// extra params allowed), and go on equal to the unsharded run, bit for bit.
void test_a_pipeline_split_resumes_as_another(void **) {
    const std::string dir = temp_dir(), pid = std::to_string(getpid());
    Values mid, end;
    run_unsharded(dir + "/whole", pid, &mid, &end);
    for (const char *stage : {"/pp-0", "/pp-1"}) assert_int_equal(mkdir((dir + stage).c_str(), 0755), 0);
    Layout old_split{2, 2, 2, "tpd-pp-old-" + pid, {{0}, {1, 2}}};
    std::vector<Values> started, saved;
    run_layout(old_split, [&](int t) { return Leg{{}, "", dir + "/pp-" + std::to_string(t) + "/ck", 0}; }, &started,
               &saved);
    expect_pieces("the old split after 3 steps", old_split, saved, mid);
    Layout new_split{2, 1, 2, "tpd-pp-new-" + pid, {{0, 1}, {2}}};
    new_split.stage = 3;
    std::vector<Values> loaded, ended;
    run_layout(new_split, [&](int) { return Leg{{dir + "/pp-0/ck", dir + "/pp-1/ck"}, "", "", kSteps}; }, &loaded,
               &ended);
    expect_pieces("the new split, loaded", new_split, loaded, mid);
    expect_pieces("the new split, 3 steps after", new_split, ended, end);
    remove_dir(dir);
}

// A group of one rank over local://TAG-PID with param group `pg` and one param "w" of
// `shape`: split on dimension 0 of `global` at `offset`, or whole (global empty).
sx_shard_group_t *group_with(const std::string &tag, const sx_param_group_desc_t &pg, std::vector<int64_t> shape,
                             std::vector<int64_t> global, int64_t offset) {
    const std::string rv = "local://" + tag + "-" + std::to_string(getpid());
    sx_group_config_t c;
    sx_group_config_init(&c, sizeof c);
    c.rendezvous = rv.c_str();
    c.world_size = 1;
    c.num_threads = 1;
    sx_shard_group_t *g = nullptr;
    assert_int_equal(sx_create_shard_group(&c, &g), SX_OK);
    assert_int_equal(sx_add_param_group(g, &pg, nullptr), SX_OK);
    sx_param_desc_t d;
    sx_param_desc_init(&d, sizeof d);
    d.name = "w";
    d.ndim = static_cast<int32_t>(shape.size());
    d.shape = shape.data();
    if (!global.empty()) {
        d.placement = SX_PLACEMENT_SPLIT;
        d.global_shape = global.data();
        d.split_offset = offset;
    }
    assert_int_equal(sx_add_param(g, &d, nullptr), SX_OK);
    assert_int_equal(sx_finalize(g), SX_OK);
    return g;
}

float *values_of(sx_shard_group_t *g, int which = 0) {
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    assert_int_equal(which == 0 ? sx_param_view(g, 0, &v) : sx_grad_view(g, 0, &v), SX_OK);
    return static_cast<float *>(v.data);
}

// Saves into `path` a group of `pg` whose "w" (whole, or split as given) took one step;
// *saved gets its values.
void save_one_step(const std::string &path, const sx_param_group_desc_t &pg, std::vector<int64_t> shape,
                   std::vector<int64_t> global, int64_t offset, std::vector<float> *saved) {
    sx_shard_group_t *g = group_with("tpd-save", pg, shape, global, offset);
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    float *v = values_of(g), *gr = values_of(g, 1);
    for (int64_t i = 0; i < n; ++i) v[i] = init_value(0, i), gr[i] = grad_value(0, 0, i);
    assert_int_equal(sx_step(g, nullptr, nullptr), SX_OK);
    saved->assign(v, v + n);
    sxtest::save_sync(g, path);
    sx_destroy_shard_group(g);
}

// Loads `path` into a new group's "w" (split on dimension 0 at `offset`, shape `shape`,
// of `global`): refused with `code` and `words` (nothing changed), or loaded (words NULL)
// with the saved values' rows from `offset` on (saved_offset: the saved piece's).
void expect_load(const std::string &path, const sx_param_group_desc_t &pg, std::vector<int64_t> shape,
                 std::vector<int64_t> global, int64_t offset, uint32_t flags, sx_status_t code, const char *words,
                 const std::vector<float> &saved, int64_t saved_offset) {
    sx_shard_group_t *g = group_with("tpd-load", pg, shape, global, offset);
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    float *v = values_of(g);
    for (int64_t i = 0; i < n; ++i) v[i] = -5.0f;
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    lo.flags = flags;
    const sx_status_t st = sx_load_optim_state(g, &lo);
    const std::string msg = sx_last_error_message();
    if (words && (st != code || msg.find(words) == std::string::npos))
        fail_msg("loading %s: %s, not '%s'", path.c_str(), failed("load", st).c_str(), words);
    if (!words && st != SX_OK) fail_msg("loading %s: %s", path.c_str(), failed("load", st).c_str());
    const int64_t row = n / shape[0];
    for (int64_t i = 0; i < n; ++i) {
        const float want = words ? -5.0f : saved[static_cast<size_t>((offset - saved_offset) * row + i)];
        if (v[i] != want) fail_msg("w[%lld] is %g after the load, not %g", static_cast<long long>(i), v[i], want);
    }
    sx_destroy_shard_group(g);
}

// What cannot be cut exactly is refused, naming why, and nothing changes; a piece within
// a saved piece loads, and so do the refused ones' params alone.
void test_what_cannot_be_cut_exactly_is_refused(void **) {
    const std::string dir = temp_dir();
    std::vector<float> saved;
    sx_param_group_desc_t adamw;
    sx_param_group_desc_init(&adamw, sizeof adamw, SX_OPTIM_ADAMW);
    // Rows [0, 4) of [8, 3]: rows [2, 6) straddle it, rows [1, 3) lie within.
    save_one_step(dir + "/piece", adamw, {4, 3}, {8, 3}, 0, &saved);
    expect_load(dir + "/piece", adamw, {4, 3}, {8, 3}, 2, 0, SX_ERR_MISMATCH,
                "is the piece at 2 on dimension 0 (of 8) of [8, 3] here but the piece at 0 on dimension 0 (of 8) of "
                "[8, 3] in the checkpoint: a saved piece of a split tensor loads only into a piece within it",
                saved, 0);
    expect_load(dir + "/piece", adamw, {2, 3}, {8, 3}, 1, 0, SX_OK, nullptr, saved, 0);
    // 8-bit state, whole [128, 64] into rows [64, 128): its blocks are the whole's.
    sx_param_group_desc_t q8 = adamw;
    q8.state_dtype = SX_STATE_8BIT;
    save_one_step(dir + "/q8", q8, {128, 64}, {}, 0, &saved);
    expect_load(dir + "/q8", q8, {64, 64}, {128, 64}, 64, 0, SX_ERR_UNSUPPORTED,
                "its 8-bit optimizer state cannot be cut exactly from the checkpoint's [128, 64]", saved, 0);
    expect_load(dir + "/q8", q8, {64, 64}, {128, 64}, 64, SX_LOAD_PARAMS_ONLY, SX_OK, nullptr, saved, 0);
    // Adafactor's factored moments, whole [8, 4] into rows [4, 8).
    sx_param_group_desc_t adafactor;
    sx_param_group_desc_init(&adafactor, sizeof adafactor, SX_OPTIM_ADAFACTOR);
    save_one_step(dir + "/adafactor", adafactor, {8, 4}, {}, 0, &saved);
    expect_load(dir + "/adafactor", adafactor, {4, 4}, {8, 4}, 4, 0, SX_ERR_UNSUPPORTED,
                "Adafactor's factored moments of the checkpoint's [8, 4] cannot be cut exactly", saved, 0);
    expect_load(dir + "/adafactor", adafactor, {4, 4}, {8, 4}, 4, SX_LOAD_PARAMS_ONLY, SX_OK, nullptr, saved, 0);
    // Another logical shape is refused as before, naming both shapes.
    expect_load(dir + "/piece", adamw, {2, 3}, {9, 3}, 1, 0, SX_ERR_MISMATCH, "is not within what the checkpoint holds",
                saved, 0);
    remove_dir(dir);
}

}  // namespace

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_whole_checkpoint_loads_into_tp2_and_on_into_tp4),
        cmocka_unit_test(test_a_pipeline_split_resumes_as_another),
        cmocka_unit_test(test_what_cannot_be_cut_exactly_is_refused),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
