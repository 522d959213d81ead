// sxckpt join and export --optimizer of several checkpoints: a tensor-parallel trainer's
// slices (TP = 2, each slice a data-parallel group of 2 ranks, threads over local://)
// joined into one checkpoint of the logical model, which a group of the unsharded model
// loads at world size 1 and 3 with every param, every optimizer slot and every step
// count equal, bit for bit, to the slices' pieces, and which steps on equal to the
// slices. Then what cannot be joined exactly, refused by name, leaving nothing behind.
#include <dirent.h>

#include <cmath>
#include <functional>

#include "run_ranks.h"
#include "sxckpt_fixture.h"

using namespace sxckpt_test;

namespace {

int setup(void **) {
    fx = new Fixture;
    fx->dir = sxtest::make_tmpdir("sxckpt-join");
    return fx->dir.empty() ? -1 : 0;
}

constexpr int kTp = 2;

// A logical param and how the slices hold it: split (in kTp equal pieces on
// split_dim), replicated (a copy in every slice), or whole in slice `owner`.
struct Def {
    const char *name;
    std::vector<int64_t> logical;
    int placement;
    int split_dim;
    int owner;
    int group;
    int tensor;  // its values' seed
    int dtype = SX_DTYPE_F32;  // SX_DTYPE_BF16: its own unit 1, with fp32 masters
    // Filled for one slice's piece (piece_of).
    int64_t offset = 0, extent = 0;
    int replica = 0;
};

struct GroupDef {
    int optimizer;
    int state_dtype;
    double lr;
};

// Slice t's piece of d (placement WHOLE for the unsharded model: t < 0).
Def piece_of(Def d, int t) {
    if (t < 0) {
        d.placement = SX_PLACEMENT_WHOLE;
    } else if (d.placement == SX_PLACEMENT_SPLIT) {
        d.extent = d.logical[static_cast<size_t>(d.split_dim)] / kTp;
        d.offset = t * d.extent;
    } else if (d.placement == SX_PLACEMENT_REPLICATED) {
        d.replica = t;
    }
    return d;
}

std::vector<int64_t> shape_of(const Def &d) {
    std::vector<int64_t> s = d.logical;
    if (d.placement == SX_PLACEMENT_SPLIT) s[static_cast<size_t>(d.split_dim)] = d.extent;
    return s;
}

uint64_t numel_of(const std::vector<int64_t> &s) {
    uint64_t n = 1;
    for (int64_t e : s) n *= static_cast<uint64_t>(e);
    return n;
}

// The logical index of element e of d's piece (row-major).
int64_t logical_index(const Def &d, int64_t e) {
    if (d.placement != SX_PLACEMENT_SPLIT) return e;
    const std::vector<int64_t> s = shape_of(d);
    int64_t inner = 1;
    for (size_t k = static_cast<size_t>(d.split_dim) + 1; k < s.size(); ++k) inner *= s[k];
    const int64_t run = d.extent * inner, stride = d.logical[static_cast<size_t>(d.split_dim)] * inner;
    return d.offset * inner + (e / run) * stride + e % run;
}

float init_of(const Def &d, int64_t i) { return static_cast<float>((i * 37 + d.tensor * 11) % 101) / 128.0f - 0.375f; }

// Multiples of 1/64: a group of 1, 2 or 3 ranks averages equal gradients back exactly.
float grad_of(int step, const Def &d, int64_t i) {
    uint64_t h = (static_cast<uint64_t>(step) * 1000003ull + static_cast<uint64_t>(d.tensor) * 7919ull +
                  static_cast<uint64_t>(i)) * 2654435761ull;
    h ^= h >> 29;
    return static_cast<float>(static_cast<int64_t>(h % 65) - 32) / 64.0f;
}

// A view's element e as fp32 (bf16 widened), and v's element e set to x (exact in bf16
// for the values here: multiples of 1/128 of magnitude below 1).
float get(const sx_view_t &v, uint64_t e) {
    if (v.dtype != SX_DTYPE_BF16) return static_cast<const float *>(v.data)[e];
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t *>(v.data)[e]) << 16;
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
}

void set(const sx_view_t &v, uint64_t e, float x) {
    if (v.dtype != SX_DTYPE_BF16) {
        static_cast<float *>(v.data)[e] = x;
        return;
    }
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    static_cast<uint16_t *>(v.data)[e] = static_cast<uint16_t>(bits >> 16);
}

// What the ranks hold, as logical tensors: "NAME" (values), "NAME.SLOT" (gathered
// state, fp32), "NAME#step".
using Values = std::map<std::string, std::vector<float>>;

struct Recorder {
    const std::vector<Def> *defs;  // the group's params, by index
    Values *values;
    std::mutex *mu;
};

void put(const Recorder &rec, const Def &d, const std::string &key, const float *data, uint64_t n) {
    std::vector<float> &v = (*rec.values)[key];
    if (v.empty()) v.assign(numel_of(d.logical), NAN);
    for (uint64_t e = 0; e < n; ++e) v[static_cast<size_t>(logical_index(d, static_cast<int64_t>(e)))] = data[e];
}

sx_status_t on_state(sx_param_state_t *s, void *user) {
    const Recorder &rec = *static_cast<Recorder *>(user);
    const Def &d = (*rec.defs)[static_cast<size_t>(s->param)];
    std::lock_guard<std::mutex> lock(*rec.mu);
    (*rec.values)[std::string(d.name) + "#step"] = {static_cast<float>(s->step), static_cast<float>(s->momentum_steps)};
    for (int32_t k = 0; k < s->num_tensors; ++k) {
        const std::string key = std::string(d.name) + "." + s->tensor_names[k];
        if (s->tensor_numels[k] == s->numel)
            put(rec, d, key, s->tensors[k], s->numel);
        else  // Adafactor's factored moments, of a whole param here
            (*rec.values)[key].assign(s->tensors[k], s->tensors[k] + s->tensor_numels[k]);
    }
    return SX_OK;
}

// Rank r's params' values and param groups' step counts (rank 0) and every param's
// gathered state, into rec.
std::string record(sx_shard_group_t *h, int r, const Recorder &rec) {
    int32_t groups = 0;
    if (r == 0 && sx_get_num_param_groups(h, &groups) != SX_OK) return err_text("num_param_groups");
    for (int32_t g = 0; g < groups; ++g) {
        int64_t steps = -1;
        if (sx_get_param_group_steps(h, g, &steps) != SX_OK) return err_text("param_group_steps");
        std::lock_guard<std::mutex> lock(*rec.mu);
        (*rec.values)["#group-steps-" + std::to_string(g)] = {static_cast<float>(steps)};
    }
    if (r == 0)
        for (size_t p = 0; p < rec.defs->size(); ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            if (sx_param_view(h, static_cast<int32_t>(p), &v) != SX_OK) return err_text("param_view");
            std::vector<float> values(v.numel);
            for (uint64_t e = 0; e < v.numel; ++e) values[e] = get(v, e);
            std::lock_guard<std::mutex> lock(*rec.mu);
            put(rec, (*rec.defs)[p], (*rec.defs)[p].name, values.data(), v.numel);
        }
    Recorder copy = rec;
    if (sx_gather_optim_state(h, 0, r == 0 ? on_state : nullptr, &copy) != SX_OK) return err_text("gather");
    return "";
}

std::string make(const std::string &rv, int r, int world, const std::vector<GroupDef> &groups,
                 const std::vector<Def> &defs, sx_shard_group_t **out) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.rendezvous = rv.c_str();
    cfg.rank = r;
    cfg.world_size = world;
    cfg.num_threads = 1;
    cfg.timeout_ms = 30000;
    if (sx_create_shard_group(&cfg, out) != SX_OK) return err_text("create");
    for (const GroupDef &g : groups) {
        sx_param_group_desc_t gd;
        sx_param_group_desc_init(&gd, sizeof gd, g.optimizer);
        gd.lr = g.lr;
        gd.state_dtype = g.state_dtype;
        if (g.optimizer == SX_OPTIM_ADAMW) gd.weight_decay = 0.02;
        if (sx_add_param_group(*out, &gd, nullptr) != SX_OK) return err_text("add_param_group");
    }
    for (const Def &d : defs) {
        const std::vector<int64_t> shape = shape_of(d);
        sx_param_desc_t pd;
        sx_param_desc_init(&pd, sizeof pd);
        pd.name = d.name;
        pd.ndim = static_cast<int32_t>(shape.size());
        pd.shape = shape.data();
        pd.param_group = d.group;
        pd.dtype = d.dtype;
        pd.unit = d.dtype == SX_DTYPE_BF16 ? 1 : 0;
        pd.placement = d.placement;
        if (d.placement == SX_PLACEMENT_SPLIT) {
            pd.global_shape = d.logical.data();
            pd.split_dim = d.split_dim;
            pd.split_offset = d.offset;
        } else if (d.placement == SX_PLACEMENT_REPLICATED) {
            pd.replica = d.replica;
            pd.replicas = kTp;
        }
        if (sx_add_param(*out, &pd, nullptr) != SX_OK) return err_text(("add_param " + std::string(d.name)).c_str());
    }
    if (sx_finalize(*out) != SX_OK) return err_text("finalize");
    return "";
}

std::string step_with(sx_shard_group_t *h, const std::vector<Def> &defs, int step) {
    for (size_t p = 0; p < defs.size(); ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        if (sx_grad_view(h, static_cast<int32_t>(p), &v) != SX_OK) return err_text("grad_view");
        for (int64_t e = 0; e < static_cast<int64_t>(v.numel); ++e)
            set(v, static_cast<uint64_t>(e), grad_of(step, defs[p], logical_index(defs[p], e)));
    }
    return sx_step(h, nullptr, nullptr) == SX_OK ? "" : err_text("step");
}

// What one slice does: rank r of its group of `world`.
struct Slice {
    std::string parent;  // saves to parent/slice-T/ck
    std::vector<std::vector<GroupDef>> groups;  // per slice
    std::vector<Def> logical;
    int steps = 3;
    std::function<void(sx_shard_group_t *, const std::vector<Def> &, int t, int step)> before_step;
    Values *saved = nullptr, *after = nullptr;  // recorded at the save, and after one step more
};

std::string ck_of(const Slice &s, int t) { return s.parent + "/slice-" + std::to_string(t) + "/ck"; }

std::string run_slice(const Slice &s, int t, int r, int world, std::mutex *mu) {
    std::vector<Def> defs;
    for (const Def &d : s.logical)
        if (d.placement != SX_PLACEMENT_WHOLE || d.owner == t) defs.push_back(piece_of(d, t));
    const std::string rv = "local://sxckpt-join-" + std::to_string(getpid()) + "-" +
                           s.parent.substr(s.parent.rfind('/') + 1) + "-" + std::to_string(t);
    sx_shard_group_t *h = nullptr;
    std::string e = make(rv, r, world, s.groups[static_cast<size_t>(t)], defs, &h);
    for (size_t p = 0; p < defs.size() && e.empty(); ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        sx_param_view(h, static_cast<int32_t>(p), &v);
        for (int64_t i = 0; i < static_cast<int64_t>(v.numel); ++i)
            set(v, static_cast<uint64_t>(i), init_of(defs[p], logical_index(defs[p], i)));
    }
    for (int step = 1; step <= s.steps && e.empty(); ++step) {
        if (s.before_step) s.before_step(h, defs, t, step);
        e = step_with(h, defs, step);
    }
    const std::string blob = "blob of slice " + std::to_string(t);
    if (e.empty()) {
        sx_save_options_t so;
        sx_save_options_init(&so, sizeof so);
        const std::string path = ck_of(s, t);
        so.path = path.c_str();
        so.user_blob = blob.data();
        so.user_blob_size = blob.size();
        so.synchronous = 1;
        sx_future_t *f = nullptr;
        if (sx_save_optim_state(h, &so, &f) != SX_OK || sx_future_wait(f, -1) != SX_OK) e = err_text("save");
        sx_future_destroy(f);
    }
    if (e.empty() && s.saved) e = record(h, r, {&defs, s.saved, mu});
    if (e.empty() && s.after) e = step_with(h, defs, s.steps + 1);
    if (e.empty() && s.after) e = record(h, r, {&defs, s.after, mu});
    sx_destroy_shard_group(h);
    return e;
}

// Every slice, each a group of `world` ranks (threads).
void save_slices(const Slice &s, int world) {
    for (int t = 0; t < kTp; ++t) assert_int_equal(mkdir((s.parent + "/slice-" + std::to_string(t)).c_str(), 0755), 0);
    std::mutex mu;
    const std::string e = sxtest::run_ranks(kTp * world, [&](int r) { return run_slice(s, r % kTp, r / kTp, world, &mu); });
    if (!e.empty()) fail_msg("%s", e.c_str());
}

// The unsharded model over `world` ranks: loads ck, records, steps once, records.
void load_joined(const Slice &s, const std::string &ck, int world, Values *saved, Values *after) {
    std::vector<Def> defs;
    for (const Def &d : s.logical) defs.push_back(piece_of(d, -1));
    std::mutex mu;
    const std::string rv = "local://sxckpt-join-" + std::to_string(getpid()) + "-whole-" + std::to_string(world);
    const std::string e = sxtest::run_ranks(world, [&](int r) {
        sx_shard_group_t *h = nullptr;
        std::string e = make(rv, r, world, s.groups[0], defs, &h);
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = ck.c_str();
        if (e.empty() && sx_load_optim_state(h, &lo) != SX_OK) e = err_text("load");
        if (e.empty()) e = record(h, r, {&defs, saved, &mu});
        if (e.empty()) e = step_with(h, defs, s.steps + 1);
        if (e.empty()) e = record(h, r, {&defs, after, &mu});
        sx_destroy_shard_group(h);
        return e;
    });
    if (!e.empty()) fail_msg("world %d: %s", world, e.c_str());
}

// want and got hold the same tensors, bit for bit.
void expect_same(const Values &want, const Values &got, const char *what) {
    for (const auto &[key, w] : want) {
        const auto it = got.find(key);
        if (it == got.end()) fail_msg("%s: no %s", what, key.c_str());
        assert_int_equal(it->second.size(), w.size());
        for (size_t i = 0; i < w.size(); ++i)
            if (std::memcmp(&w[i], &it->second[i], sizeof(float)) != 0)
                fail_msg("%s: %s[%zu] is %.9g, want %.9g", what, key.c_str(), i, it->second[i], w[i]);
    }
    assert_int_equal(got.size(), want.size());
}

// The names in dir (without . and ..), sorted.
std::vector<std::string> listing(const std::string &dir) {
    std::vector<std::string> names;
    DIR *d = opendir(dir.c_str());
    assert_non_null(d);
    while (const dirent *e = readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
}

const std::vector<GroupDef> kGroups = {{SX_OPTIM_ADAMW, SX_STATE_FP32, 0.01},
                                      {SX_OPTIM_ADAMW, SX_STATE_BF16, 0.02},
                                      {SX_OPTIM_ADAMW, SX_STATE_8BIT, 0.03},
                                      {SX_OPTIM_ADAFACTOR, SX_STATE_FP32, 0.01}};

// A Megatron-style block over TP = 2, each slice a group of 2: a column-parallel weight
// (split on dimension 0), a row-parallel one (dimension 1, its group's state bf16), a
// replicated norm, an 8-bit weight split on dimension 0 into whole blocks, a whole param
// in each slice (one of them Adafactor's, factored), and a bf16 param (fp32 masters)
// split on dimension 1. join, then the unsharded model at world size 1 and 3 loads it:
// values, masters, every slot and every step count equal the slices' bit for bit, and
// one more step with the same gradients stays equal. export --optimizer of the slices
// gives the same tensors (8-bit decoded), each param once.
void test_join_resumes_unsharded(void **) {
    Values saved, after;
    Slice s;
    s.parent = fx->dir + "/tp";
    assert_int_equal(mkdir(s.parent.c_str(), 0755), 0);
    s.groups = {kGroups, kGroups};
    s.logical = {
        {"col", {8, 3}, SX_PLACEMENT_SPLIT, 0, 0, 0, 1},
        {"row", {3, 8}, SX_PLACEMENT_SPLIT, 1, 0, 1, 2},
        {"norm", {5}, SX_PLACEMENT_REPLICATED, 0, 0, 0, 3},
        {"big", {32, 256}, SX_PLACEMENT_SPLIT, 0, 0, 2, 4},
        {"embed", {6}, SX_PLACEMENT_WHOLE, 0, 0, 0, 5},
        {"head", {2, 3}, SX_PLACEMENT_WHOLE, 0, 1, 1, 6},
        {"proj", {4, 6}, SX_PLACEMENT_SPLIT, 1, 0, 0, 7, SX_DTYPE_BF16},
        {"ada", {3, 4}, SX_PLACEMENT_WHOLE, 0, 1, 3, 8},
    };
    s.saved = &saved;
    s.after = &after;
    save_slices(s, 2);
    // What the slices hold covers every logical tensor: 8 values, 14 slots, Adafactor's
    // row_var and col_var, 1 master, 8 step counts, 4 param groups' step counts.
    assert_int_equal(saved.size(), 37);
    assert_int_equal(saved.count("proj.master"), 1);
    for (const auto &[key, v] : saved)
        for (float x : v)
            if (std::isnan(x)) fail_msg("the slices hold no %s of every element", key.c_str());
    const std::string out = s.parent + "/joined";
    const Run r = sxckpt({"join", "--world-size", "2", out, ck_of(s, 0), ck_of(s, 1)});
    expect_status(r, 0);
    expect_has(r.out, "wrote " + out + ": 8 params");
    expect_has(r.out, "joined 2 checkpoints");
    assert_true(listing(s.parent) == (std::vector<std::string>{"joined", "slice-0", "slice-1"}));
    const sx::ckpt::Manifest m = manifest_of(out);
    assert_int_equal(m.step, 3);
    assert_int_equal(m.world_size, 2);
    assert_string_equal(m.user_blob.c_str(), "blob of slice 0");
    // The first slice's loss scaler (test_sxckpt_import: one that is not the default).
    const sx::ckpt::LossScalerEntry ls = manifest_of(ck_of(s, 0)).loss_scaler;
    assert_true(m.loss_scaler.scale == ls.scale && m.loss_scaler.growth_tracker == ls.growth_tracker &&
                m.loss_scaler.growth_interval == ls.growth_interval && m.loss_scaler.growth_factor == ls.growth_factor &&
                m.loss_scaler.backoff_factor == ls.backoff_factor);
    assert_int_equal(m.params.size(), 8);
    for (const sx::ckpt::ParamEntry &p : m.params) assert_int_equal(p.placement, SX_PLACEMENT_WHOLE);
    expect_status(sxckpt({"verify", out}), 0);
    for (int world : {1, 3}) {
        Values got_saved, got_after;
        load_joined(s, out, world, &got_saved, &got_after);
        expect_same(saved, got_saved, world == 1 ? "loaded at world size 1" : "loaded at world size 3");
        expect_same(after, got_after, world == 1 ? "stepped at world size 1" : "stepped at world size 3");
    }
    const std::string st = s.parent + "/model.safetensors", prefix = s.parent + "/optim";
    const Run e = sxckpt({"export", "--safetensors", st, "--optimizer", prefix, ck_of(s, 0), ck_of(s, 1)});
    expect_status(e, 0);
    expect_has(e.out, "wrote " + prefix + ".safetensors: 16 optimizer state tensors");
    const std::string json = read_file(prefix + ".json");
    expect_has(json, "\"schema_version\":1,");
    expect_has(json, "\"params\":[\"big\"]");
    expect_has(json, "\"big\":{\"step\":3,\"unit\":0,\"trainable\":true}");
    for (const char *name : {"\"col\"", "\"norm\"", "\"head\""}) {  // once in its group, once in "state"
        size_t count = 0;
        for (size_t at = json.find(name); at != std::string::npos; at = json.find(name, at + 1)) ++count;
        assert_int_equal(count, 2);
    }
    if (!have_python()) return;
    std::map<std::string, Known> got;
    std::map<std::string, std::string> meta;
    for (const std::string &file : {st, prefix + ".safetensors"}) {
        const std::string text = file + ".values.txt";
        expect_status(run({SX_PYTHON3, READ_SAFETENSORS_PY, file, "--values", text}), 0);
        read_values(text, &got, &meta);
    }
    Values exported, want;
    for (const auto &[name, k] : got) exported[name] = k.values;
    for (const auto &[key, v] : saved) {  // a 16-bit param is exported as its masters
        const size_t master = key.rfind(".master");
        if (master != std::string::npos && master + 7 == key.size())
            want[key.substr(0, master)] = v;
        else if (key.find('#') == std::string::npos)
            want[key] = v;
    }
    expect_same(want, exported, "exported");
}

// Refused, naming the param and why, by export --optimizer (torch and torchao forms)
// and by join; a refused join leaves nothing (no OUT, no temporaries).
struct Refusal {
    const char *tag;
    std::vector<std::vector<GroupDef>> groups;
    std::vector<Def> logical;
    int steps;
    std::function<void(sx_shard_group_t *, const std::vector<Def> &, int, int)> before_step;
    std::string torch, torchao, join;  // "": accepted; else words of the refusal ("A", "B": the slices)
};

std::string replaced(std::string text, const Slice &s) {
    for (const auto &[from, t] : {std::make_pair(std::string("{A}"), 0), std::make_pair(std::string("{B}"), 1)})
        for (size_t at; (at = text.find(from)) != std::string::npos;) text.replace(at, from.size(), ck_of(s, t));
    return text;
}

void expect_outcome(const Run &r, const std::string &words) {
    expect_status(r, words.empty() ? 0 : 1);
    if (!words.empty()) expect_has(r.err, words);
}

void test_join_refusals(void **) {
    const auto freeze_w_at_first_step = [](sx_shard_group_t *h, const std::vector<Def> &, int t, int step) {
        if (t == 1) sx_set_trainable(h, 0, step == 1 ? 0 : 1);
    };
    const std::vector<GroupDef> adamw = {{SX_OPTIM_ADAMW, SX_STATE_FP32, 0.01}};
    const std::vector<GroupDef> q8 = {{SX_OPTIM_ADAMW, SX_STATE_8BIT, 0.01}};
    const std::vector<Refusal> cases = {
        {"adafactor", {{{SX_OPTIM_ADAFACTOR, 0, 0.01}}, {{SX_OPTIM_ADAFACTOR, 0, 0.01}}},
         {{"w", {4, 6}, SX_PLACEMENT_SPLIT, 0, 0, 0, 1}}, 1, nullptr,
         "param 'w' is split (on dimension 0) and has Adafactor's factored moments (row_var, col_var) in {A}",
         "param 'w' is split (on dimension 0) and has Adafactor's factored moments",
         "param 'w' is split (on dimension 0) and has Adafactor's factored moments"},
        {"q8-dim1", {q8, q8}, {{"w", {16, 512}, SX_PLACEMENT_SPLIT, 1, 0, 0, 1}}, 1, nullptr, "",
         "param 'w' keeps 8-bit state and is split on dimension 1 of [16, 512]: the blocks of 256 elements of its "
         "piece in {A} are not blocks of the logical tensor",
         "param 'w' keeps 8-bit state and is split on dimension 1 of [16, 512]"},
        {"q8-kept", {q8, q8}, {{"w", {16, 256}, SX_PLACEMENT_SPLIT, 0, 0, 0, 1}}, 1, nullptr, "", "",
         "param 'w': its piece in {A} (2048 elements) keeps fp32 state, but the logical tensor (4096 elements) "
         "would keep 8-bit state: join would quantize them again"},
        {"steps", {adamw, adamw},
         {{"w", {4, 3}, SX_PLACEMENT_SPLIT, 0, 0, 0, 1}, {"x0", {3}, SX_PLACEMENT_WHOLE, 0, 0, 0, 2},
          {"x1", {3}, SX_PLACEMENT_WHOLE, 0, 1, 0, 3}},
         2, freeze_w_at_first_step,
         "param 'w' has taken 2 steps (momentum_steps 0, mu_product 1) in {A} but 1 (momentum_steps 0, "
         "mu_product 1) in {B}: its pieces' optimizer state cannot be joined",
         "param 'w' has taken 2 steps", "param 'w' has taken 2 steps"},
        {"groups", {adamw, {{SX_OPTIM_ADAMW, SX_STATE_FP32, 0.02}}}, {{"w", {4, 3}, SX_PLACEMENT_SPLIT, 0, 0, 0, 1}}, 1,
         nullptr, "param group 0 differs between {A} and {B} (lr is 0.01 in one and 0.02 in the other)",
         "param group 0 differs", "param group 0 differs"},
    };
    for (const Refusal &c : cases) {
        Slice s;
        s.parent = fx->dir + "/" + c.tag;
        assert_int_equal(mkdir(s.parent.c_str(), 0755), 0);
        s.groups = c.groups;
        s.logical = c.logical;
        s.steps = c.steps;
        s.before_step = c.before_step;
        save_slices(s, 1);
        const std::string outs = s.parent + "/outs";
        assert_int_equal(mkdir(outs.c_str(), 0755), 0);
        const std::string a = ck_of(s, 0), b = ck_of(s, 1);
        expect_outcome(sxckpt({"export", "--safetensors", outs + "/w-torch.safetensors", "--optimizer", outs + "/torch", a, b}),
                       replaced(c.torch, s));
        expect_outcome(sxckpt({"export", "--safetensors", outs + "/w-torchao.safetensors", "--optimizer", outs + "/torchao",
                               "--state-format", "torchao", a, b}),
                       replaced(c.torchao, s));
        const Run j = sxckpt({"join", outs + "/joined", a, b});
        expect_outcome(j, replaced(c.join, s));
        expect_has(j.err, "join into " + outs + "/joined failed: ");
        std::vector<std::string> left;
        for (const std::string &n : listing(outs))
            if (n.rfind("joined", 0) == 0) left.push_back(n);
        if (!left.empty()) fail_msg("%s: a refused join left %s", c.tag, left[0].c_str());
    }
}

// Usage errors, and an OUT that exists (left as it was).
void test_join_usage(void **) {
    const std::string dir = fx->dir + "/usage";
    assert_int_equal(mkdir(dir.c_str(), 0755), 0);
    expect_status(sxckpt({"join", dir + "/out"}), 2);
    const Run w = sxckpt({"join", "--world-size", "0", dir + "/out", dir});
    expect_status(w, 2);
    expect_has(w.err, "join: --world-size is '0'; it must be a number from 1 to 99999");
    const Run exists = sxckpt({"join", dir, dir});
    expect_status(exists, 1);
    expect_has(exists.err, dir + " already exists; join makes a new checkpoint directory");
    assert_true(listing(dir).empty());
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_join_resumes_unsharded),
        cmocka_unit_test(test_join_refusals),
        cmocka_unit_test(test_join_usage),
    };
    return cmocka_run_group_tests(tests, setup, fixture_teardown);
}
