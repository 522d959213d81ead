// sxckpt import, on the checkpoint of sxckpt_fixture.h (two ranks; AdamW with amsgrad
// and SGD with momentum; a scalar, a frozen param without state, names that need
// escaping). Round trip: export with the optimizer state, import as 3 ranks' shards (and
// as 1 rank's), load into a group of 2 ranks: every value, state element, step count,
// hyperparameter and unit's state slot count equals, bit for bit, what the same group
// loads from the original. Values only: one AdamW group of torch's defaults, no state,
// loads with SX_LOAD_PARAMS_ONLY. F16 and BF16 weights are widened exactly. Damaged,
// truncated and mismatched inputs and an existing output are refused, each with a
// message naming the file, tensor, param or field, and nothing is written.
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "base/half.h"
#include "ckpt/manifest.h"
#include "ckpt/shard_plan.h"
#include "sx/sx.h"
// Last: it includes CMocka, which defines a fail() macro.
#include "sxckpt_fixture.h"

namespace {

using namespace sxckpt_test;

// The fixture exported once, with its optimizer state: the inputs of every import.
std::string g_weights, g_prefix;

int setup(void **) {
    if (fixture_setup("sxckpt-import") != 0) return -1;
    g_weights = fx->dir + "/weights.safetensors";
    g_prefix = fx->dir + "/optim";
    const Run r = sxckpt({"export", "--safetensors", g_weights, "--optimizer", g_prefix, fx->ck});
    if (r.status != 0) {
        std::fprintf(stderr, "export: %s%s", r.out.c_str(), r.err.c_str());
        return -1;
    }
    return 0;
}

// What a group holds after a load: every tensor whole (NAME, NAME.exp_avg, ...), each
// param's step counts, each param group's optimizer and hyperparameters, the step count
// and each unit's state slots.
struct Loaded {
    std::map<std::string, std::vector<float>> tensors;
    std::map<std::string, std::pair<int64_t, int64_t>> steps;
    std::vector<sx::optim::Hyper> hypers;
    uint64_t steps_taken = 0;
    std::vector<int> state_slots;
};

// Rank r of a group of kParams loads `ck` with `flags`, and adds its shard to *out
// (rank 0 also the rest). "" or the error.
std::string load_rank(const std::string &rv, int r, int world, const std::string &ck, uint32_t flags,
                      Loaded *out, std::mutex *mu) {
    sx_shard_group_t *h = nullptr;
    std::string e = make_group(rv, r, world, &h);
    if (e.empty()) {
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = ck.c_str();
        lo.flags = flags;
        if (sx_load_optim_state(h, &lo) != SX_OK) e = err_text("load");
    }
    if (e.empty()) {
        const sx::core::ShardGroup &g = *h->impl;
        std::lock_guard<std::mutex> lock(*mu);
        for (int32_t p = 0; p < g.num_params(); ++p) {
            const std::string name = g.param(p).name;
            const uint64_t numel = g.layout().numel(p);
            const int32_t u = g.layout().placement(p).unit_index;
            if (r == 0) {
                const float *d = static_cast<const float *>(g.param_data(p));
                out->tensors[name].assign(d, d + numel);
                out->steps[name] = {g.param(p).step, g.param(p).momentum_steps};
            }
            const auto kinds = sx::ckpt::stored_kinds(g.hyper(g.param(p).group));
            const sx::core::UnitShard v = g.unit_shard(static_cast<size_t>(u));
            const sx::core::ShardPiece piece = g.layout().piece(p, r);
            for (size_t k = 1; k < kinds.size() && static_cast<int>(k) <= v.state_slots; ++k) {
                std::vector<float> &t = out->tensors[name + sx::ckpt::tensor_suffix(kinds[k])];
                t.resize(numel);
                for (uint64_t j = 0; j < piece.end - piece.begin; ++j)
                    t[piece.begin + j] = v.state[k - 1][piece.shard_offset + j];
            }
        }
        if (r == 0) {
            for (int32_t i = 0; i < g.table().num_groups(); ++i) out->hypers.push_back(g.hyper(i));
            out->steps_taken = g.steps_taken();
            for (size_t u = 0; u < g.layout().units().size(); ++u)
                out->state_slots.push_back(g.unit_shard(u).state_slots);
        }
    }
    sx_destroy_shard_group(h);
    return e;
}

// Loads `ck` into a fresh group of 2 ranks (threads) of kParams; "" or rank 0's error.
std::string load_two_ranks(const std::string &ck, uint32_t flags, Loaded *out) {
    static int n = 0;
    const std::string rv = "local://sxckpt-import-load-" + std::to_string(getpid()) + "-" + std::to_string(n++);
    std::mutex mu;
    std::vector<std::string> errs(2);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r) ts.emplace_back([&, r] { errs[r] = load_rank(rv, r, 2, ck, flags, out, &mu); });
    for (auto &t : ts) t.join();
    return errs[0].empty() ? errs[1] : errs[0];
}

void expect_same_hyper(const sx::optim::Hyper &a, const sx::optim::Hyper &b, size_t group) {
    if (a.kind != b.kind) fail_msg("param group %zu: optimizer %d, expected %d", group, (int)a.kind, (int)b.kind);
#define SX_SAME(name, type, dflt, key, applies)                                                            \
    if (std::memcmp(&a.name, &b.name, sizeof(type)) != 0)                                                  \
        fail_msg("param group %zu: " #name " %.17g, expected %.17g", group, static_cast<double>(a.name), \
                 static_cast<double>(b.name));
    SX_HYPERPARAMETERS(SX_SAME)
#undef SX_SAME
}

// Bit for bit: every tensor, step count, hyperparameter and state slot count.
void expect_same(const Loaded &got, const Loaded &want) {
    assert_int_equal(got.tensors.size(), want.tensors.size());
    for (const auto &t : want.tensors) {
        const auto it = got.tensors.find(t.first);
        if (it == got.tensors.end()) fail_msg("no tensor '%s' after the load", t.first.c_str());
        assert_int_equal(it->second.size(), t.second.size());
        if (std::memcmp(it->second.data(), t.second.data(), t.second.size() * sizeof(float)) != 0)
            fail_msg("tensor '%s' differs", t.first.c_str());
    }
    assert_true(got.steps == want.steps);
    assert_int_equal(got.hypers.size(), want.hypers.size());
    for (size_t g = 0; g < want.hypers.size(); ++g) expect_same_hyper(got.hypers[g], want.hypers[g], g);
    assert_int_equal(got.steps_taken, want.steps_taken);
    assert_true(got.state_slots == want.state_slots);
}

// export --optimizer, import as W ranks' shards, load into 2 ranks: the same as loading
// the original, which holds what the ranks that saved it knew.
void test_round_trip(void **) {
    Loaded original;
    const std::string e = load_two_ranks(fx->ck, 0, &original);
    if (!e.empty()) fail_msg("%s", e.c_str());
    assert_int_equal(original.tensors.size(), fx->known.size());
    for (const auto &k : fx->known)
        assert_memory_equal(original.tensors.at(k.first).data(), k.second.values.data(),
                            k.second.values.size() * sizeof(float));
    assert_int_equal(original.steps.at("scale").second, kSteps);      // SGD: its momentum steps
    assert_int_equal(original.steps.at("frozen.table").first, 0);
    assert_int_equal(original.steps_taken, kSteps);
    assert_true(original.state_slots == (std::vector<int>{3, 3, 0}));  // the frozen unit has no state

    for (const int world : {3, 1}) {
        const std::string ck = fx->dir + "/imported-w" + std::to_string(world);
        const Run r = sxckpt({"import", "--safetensors", g_weights, "--optimizer", g_prefix, "--world-size",
                              std::to_string(world), ck});
        expect_status(r, 0);
        expect_has(r.out, "wrote " + ck + ": 6 params, 11 optimizer state tensors, 2 param groups");
        const Run v = sxckpt({"verify", ck});
        expect_status(v, 0);
        expect_has(v.out, "OK: MANIFEST, " + std::to_string(world) + " files");
        const sx::ckpt::Manifest m = manifest_of(ck);
        assert_int_equal(m.world_size, world);
        assert_int_equal(m.files.size(), world);
        assert_int_equal(m.step, kSteps);
        for (size_t p = 0; p < kParams.size(); ++p) {
            assert_string_equal(m.params[p].name.c_str(), kParams[p].name);  // registration order kept
            assert_int_equal(m.params[p].unit, kParams[p].unit);
            assert_int_equal(m.params[p].trainable, !kParams[p].frozen);
        }
        assert_false(exists(ck + ".sx-partial"));
        Loaded imported;
        const std::string le = load_two_ranks(ck, 0, &imported);
        if (!le.empty()) fail_msg("%s", le.c_str());
        expect_same(imported, original);
    }
}

// Without --optimizer: the values alone, in one AdamW group of torch's defaults, every
// step 0. They load with SX_LOAD_PARAMS_ONLY into the fixture's two groups; a full load
// is refused, since the param groups do not match.
void test_values_only(void **) {
    const std::string ck = fx->dir + "/values-only";
    const Run r = sxckpt({"import", "--safetensors", g_weights, "--world-size", "2", ck});
    expect_status(r, 0);
    expect_has(r.out, "0 optimizer state tensors, 1 param group");
    expect_has(r.out, "SX_LOAD_PARAMS_ONLY");
    expect_status(sxckpt({"verify", ck}), 0);
    const sx::ckpt::Manifest m = manifest_of(ck);
    assert_int_equal(m.param_groups.size(), 1);
    assert_int_equal(m.param_groups[0].optimizer, SX_OPTIM_ADAMW);
    assert_true(m.param_groups[0].lr == 1e-3 && m.param_groups[0].weight_decay == 1e-2);
    assert_int_equal(m.step, 0);
    for (const sx::ckpt::ParamEntry &p : m.params) {
        assert_int_equal(p.tensors.size(), 1);
        assert_int_equal(p.step, 0);
        assert_int_equal(p.param_group, 0);
    }
    Loaded loaded;
    const std::string e = load_two_ranks(ck, SX_LOAD_PARAMS_ONLY, &loaded);
    if (!e.empty()) fail_msg("%s", e.c_str());
    for (const PDef &p : kParams) {
        const Known &k = fx->known.at(p.name);
        assert_memory_equal(loaded.tensors.at(p.name).data(), k.values.data(), k.values.size() * sizeof(float));
    }
    Loaded refused;
    const std::string full = load_two_ranks(ck, 0, &refused);
    expect_has(full, "uses SGD here but AdamW in the checkpoint (load params only");
}

// --- safetensors files made here ---

struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::string bytes;
};

std::string safetensors_of(const std::vector<Entry> &entries) {
    std::string header = "{";
    std::string data;
    for (const Entry &e : entries) {
        std::string shape;
        for (int64_t d : e.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
        header += (header.size() > 1 ? "," : "") + std::string("\"") + e.name + "\":{\"dtype\":\"" + e.dtype +
                  "\",\"shape\":[" + shape + "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
                  std::to_string(data.size() + e.bytes.size()) + "]}";
        data += e.bytes;
    }
    header += "}";
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
    return out + header + data;
}

template <typename T>
std::string bytes_of(const std::vector<T> &v) {
    return std::string(reinterpret_cast<const char *>(v.data()), v.size() * sizeof(T));
}

// F16 and BF16 weights become fp32 values, exactly; the MANIFEST keeps their dtype as
// the params' own and stores fp32 tensors.
void test_widens_16_bit_weights(void **) {
    const std::vector<uint16_t> h = {0x3c00, 0xc000, 0x3555, 0x0001, 0x7bff, 0x8000};  // 1, -2, ~1/3, tiny, max, -0
    const std::vector<uint16_t> b = {0x3f80, 0xbf00, 0x4049, 0x0080};                  // 1, -0.5, ~3.14, tiny
    const std::vector<float> f = {0.25f, -7.5f};
    const std::string w = fx->dir + "/16bit.safetensors", ck = fx->dir + "/16bit";
    assert_true(sxtest::write_file(w, safetensors_of({{"h", "F16", {2, 3}, bytes_of(h)},
                                                      {"b", "BF16", {4}, bytes_of(b)},
                                                      {"f", "F32", {2}, bytes_of(f)}})));
    expect_status(sxckpt({"import", "--safetensors", w, ck}), 0);
    expect_status(sxckpt({"verify", ck}), 0);
    const sx::ckpt::Manifest m = manifest_of(ck);
    assert_int_equal(m.params[0].dtype, SX_DTYPE_F16);
    assert_int_equal(m.params[1].dtype, SX_DTYPE_BF16);
    for (const auto &p : m.params) assert_int_equal(p.tensors[0].dtype, SX_DTYPE_F32);

    std::vector<sxtest::ParamDef> defs = {{"h", {2, 3}}, {"b", {4}}, {"f", {2}}};
    sx_shard_group_t *g = sxtest::one_rank_group("sxckpt-16bit", defs);
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = ck.c_str();
    lo.flags = SX_LOAD_PARAMS_ONLY;
    assert_int_equal(sx_load_optim_state(g, &lo), SX_OK);
    std::vector<float> want;
    for (uint16_t x : h) want.push_back(sx::half::f16_to_f32(x));
    for (uint16_t x : b) want.push_back(sx::half::bf16_to_f32(x));
    want.insert(want.end(), f.begin(), f.end());
    size_t at = 0;
    for (int32_t p = 0; p < 3; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        assert_int_equal(sx_param_view(g, p, &v), SX_OK);
        assert_memory_equal(v.data, want.data() + at, v.numel * sizeof(float));
        at += v.numel;
    }
    assert_int_equal(at, want.size());
    sx_destroy_shard_group(g);
}

// --- refusals ---

// `bytes` with `from` replaced by `to` (the first `count` times; all if 0); the test
// fails if `from` is not there.
std::string replaced(std::string bytes, const std::string &from, const std::string &to, int count = 1) {
    size_t at = bytes.find(from);
    if (at == std::string::npos) fail_msg("no [%s] to replace", from.c_str());
    for (int n = 0; at != std::string::npos && (count == 0 || n < count); ++n) {
        bytes.replace(at, from.size(), to);
        at = bytes.find(from, at + to.size());
    }
    return bytes;
}

// Runs `import` on the given inputs (written here as W.safetensors, P.safetensors and
// P.json beside each other; a missing one stays absent) and expects it to fail with
// `message`, leaving neither the checkpoint nor its temporary directory behind.
void expect_refused(const std::string &tag, const std::string &weights, const std::string &state,
                    const std::string &json, const std::string &message, bool with_optimizer = true) {
    const std::string dir = fx->dir + "/refused-" + tag;
    assert_int_equal(mkdir(dir.c_str(), 0755), 0);
    const std::string w = dir + "/W.safetensors", p = dir + "/P";
    if (!weights.empty()) assert_true(sxtest::write_file(w, weights));
    if (!state.empty()) assert_true(sxtest::write_file(p + ".safetensors", state));
    if (!json.empty()) assert_true(sxtest::write_file(p + ".json", json));
    std::vector<std::string> args = {"import", "--safetensors", w};
    if (with_optimizer) args.insert(args.end(), {"--optimizer", p});
    args.insert(args.end(), {"--world-size", "3", dir + "/ck"});
    const Run r = sxckpt(args);
    if (r.status != 1)
        fail_msg("%s: exit status %d, expected 1\n%s%s", tag.c_str(), r.status, r.out.c_str(), r.err.c_str());
    expect_has(r.err, "sxckpt: import into " + dir + "/ck failed: ");
    expect_has(r.err, message);
    assert_false(exists(dir + "/ck"));
    assert_false(exists(dir + "/ck.sx-partial"));
}

void test_refuses_damaged_files(void **) {
    const std::string w = read_file(g_weights), s = read_file(g_prefix + ".safetensors"),
                      j = read_file(g_prefix + ".json");
    expect_refused("truncated", w.substr(0, w.size() - 10), s, j,
                   "lie outside the file's 20710 bytes of data (is the file truncated?)");
    expect_refused("truncated-state", w, s.substr(0, s.size() / 2), j, "P.safetensors: tensor ");
    expect_refused("cut-header", w.substr(0, 100), s, j, "but the file has only 92 after it (truncated?)");
    expect_refused("short", w.substr(0, 5), s, j, "W.safetensors: the file has 5 bytes, too few");
    expect_refused("not-json", replaced(w, "{\"__metadata__\"", "[\"__metadata__\""), s, j,
                   "W.safetensors: its header is not valid JSON: JSON: expected");
    expect_refused("huge-length", std::string("\xff\xff\xff\xff\xff\xff\xff\x00", 8) + w.substr(8), s, j,
                   "its header length field says");
    expect_refused("json-cut", w, s, j.substr(0, j.size() / 2), "P.json: JSON: expected");
    expect_refused("no-state-file", w, "", j, "P.safetensors");
    expect_refused("no-json", w, s, "", "P.json");
    expect_refused("no-weights", "", s, j, "W.safetensors");
}

void test_refuses_mismatches(void **) {
    const std::string w = read_file(g_weights), s = read_file(g_prefix + ".safetensors"),
                      j = read_file(g_prefix + ".json");
    // A state tensor missing (renamed, so that the file stays well formed).
    expect_refused("missing-state", w, replaced(s, "\"head.bias.exp_avg\"", "\"head.bias.exp_avX\""), j,
                   "P.safetensors: param 'head.bias' (param group 0, AdamW) has 'head.bias.exp_avg_sq', "
                   "'head.bias.max_exp_avg_sq' but no tensor 'head.bias.exp_avg'");
    expect_refused("wrong-shape", w, replaced(s, "[300,17]", "[17,300]"), j,
                   "P.safetensors: tensor 'embed.weight.exp_avg' has shape [17, 300], but param 'embed.weight' "
                   "has [300, 17]");
    expect_refused("not-f32", replaced(w, "\"F32\"", "\"I32\""), s, j,
                   "W.safetensors: tensor \"embed.weight\" has dtype \"I32\"; sx imports F32, F16 and BF16 "
                   "tensors, and U8 ones as 8-bit optimizer state's codes only");
    expect_refused("not-f32-state", w, replaced(s, "\"F32\"", "\"F64\""), j, "has dtype \"F64\"");
    expect_refused("unknown-optimizer", w, s, replaced(j, "\"AdamW\"", "\"Adadelta\""),
                   "P.json: param group 0: optimizer \"Adadelta\" is not one sx has (SGD, Adam, AdamW, Adagrad, "
                   "RMSprop, Adamax, NAdam, RAdam, Lion, Lamb, Muon, Adafactor, AdEMAMix)");
    expect_refused("key-of-another-optimizer", w, s, replaced(j, "\"AdamW\"", "\"AdEMAMix\""),
                   "P.json: param group 0 (AdEMAMix): unknown key \"amsgrad\"; its keys are optimizer, lr, "
                   "weight_decay, betas, eps, maximize, alpha, decoupled_weight_decay, beta3, t_alpha_beta3, step, "
                   "state_dtype, params");
    expect_refused("two-groups", w, s, replaced(j, "\"frozen.table\"]", "\"frozen.table\",\"scale\"]"),
                   "P.json: param \"scale\" is in param group 0 and again in param group 1");
    expect_refused("not-in-weights", w, s, replaced(j, "\"head.bias\"", "\"nohead\"", 0),
                   "P.json: param 'nohead' of param group 0 is not in ");
    expect_refused("not-in-groups", w, s, replaced(replaced(j, ",\"scale\"]", "]"), ",\"scale\":{\"step\":3,"
                   "\"momentum_steps\":3,\"unit\":1,\"trainable\":true}", ""),
                   "W.safetensors has param 'scale', which no param group of ");
    expect_refused("stray-state", w, s, replaced(j, "\"amsgrad\":true", "\"amsgrad\":false"),
                   "P.safetensors: tensor 'embed.weight.max_exp_avg_sq' is no param's state: param 'embed.weight' "
                   "is in param group 0 (AdamW without amsgrad), which keeps no max_exp_avg_sq");
    expect_refused("unknown-key", w, s, replaced(j, "\"amsgrad\":true", "\"amsgrad\":true,\"nesterov\":false"),
                   "P.json: param group 0 (AdamW): unknown key \"nesterov\"");
    expect_refused("missing-key", w, s, replaced(j, "\"eps\":1e-08,", ""),
                   "P.json: param group 0 (AdamW) has no \"eps\"");
    expect_refused("bad-hyper", w, s, replaced(j, "\"lr\":0.05", "\"lr\":-1"), "P.json: param group 1 (SGD): ");
    expect_refused("newer-schema", w, s, replaced(j, "\"schema_version\":1", "\"schema_version\":3"),
                   "P.json: schema_version is 3, newer than this sxckpt's 2");
    expect_refused("momentum-steps", w, s, replaced(j, "\"momentum_steps\":3", "\"momentum_steps\":4"),
                   "they must satisfy 0 <= momentum_steps <= step");
    expect_refused("no-state-entry", w, s,
                   replaced(j, "\"frozen.table\":{\"step\":0,\"unit\":2,\"trainable\":false}", "\"x\":{}"),
                   "\"state\" has an entry for param \"x\", which no param group lists");
    expect_refused("duplicate-key", w, s,
                   replaced(j, "\"step\":3,\"param_groups\"", "\"step\":3,\"step\":3,\"param_groups\""),
                   "P.json: JSON: the key \"step\" at byte ");
}

// Schema 2's optional "loss_scaler" and "user_blob" (what sxckpt join carries) reach the
// MANIFEST; malformed ones are refused, naming the key.
void test_loss_scaler_and_user_blob(void **) {
    const std::string w = read_file(g_weights), s = read_file(g_prefix + ".safetensors"),
                      j = read_file(g_prefix + ".json");
    const std::string scaler = "\"loss_scaler\":{\"scale\":1024,\"growth_tracker\":7,\"growth_interval\":2000,"
                               "\"growth_factor\":2,\"backoff_factor\":0.5}";
    const std::string with = replaced(replaced(j, "\"schema_version\":1", "\"schema_version\":2"),
                                      "\"step\":3,\"param_groups\"",
                                      "\"step\":3," + scaler + ",\"user_blob\":\"00ff41\",\"param_groups\"");
    const std::string dir = fx->dir + "/run-state";
    assert_int_equal(mkdir(dir.c_str(), 0755), 0);
    assert_true(sxtest::write_file(dir + "/W.safetensors", w));
    assert_true(sxtest::write_file(dir + "/P.safetensors", s));
    assert_true(sxtest::write_file(dir + "/P.json", with));
    expect_status(sxckpt({"import", "--safetensors", dir + "/W.safetensors", "--optimizer", dir + "/P", dir + "/ck"}), 0);
    const sx::ckpt::Manifest m = manifest_of(dir + "/ck");
    assert_true(m.loss_scaler.scale == 1024 && m.loss_scaler.growth_tracker == 7 &&
                m.loss_scaler.growth_interval == 2000 && m.loss_scaler.growth_factor == 2 &&
                m.loss_scaler.backoff_factor == 0.5);
    assert_true(m.user_blob == std::string("\x00\xff\x41", 3));
    expect_refused("bad-blob", w, s, replaced(with, "\"00ff41\"", "\"0g\""),
                   "P.json: \"user_blob\" is not pairs of hexadecimal digits");
    expect_refused("scaler-key", w, s, replaced(with, ",\"backoff_factor\":0.5", ""),
                   "P.json: \"loss_scaler\" has no \"backoff_factor\"");
}

// DIR exists: refused, and left as it was. A leftover DIR.sx-partial is no checkpoint:
// an import removes it. A parent that does not exist fails the import cleanly.
void test_output_directory(void **) {
    const std::string ck = fx->dir + "/taken";
    assert_int_equal(mkdir(ck.c_str(), 0755), 0);
    assert_true(sxtest::write_file(ck + "/mine", "keep"));
    Run r = sxckpt({"import", "--safetensors", g_weights, ck});
    expect_status(r, 1);
    expect_has(r.err, ck + " already exists; import makes a new checkpoint directory");
    assert_string_equal(read_file(ck + "/mine").c_str(), "keep");
    assert_false(exists(ck + ".sx-partial"));

    const std::string fresh = fx->dir + "/fresh";
    assert_int_equal(mkdir((fresh + ".sx-partial").c_str(), 0755), 0);
    assert_true(sxtest::write_file(fresh + ".sx-partial/shard-00000-of-00001.bin", "torn"));
    expect_status(sxckpt({"import", "--safetensors", g_weights, fresh}), 0);
    assert_false(exists(fresh + ".sx-partial"));
    expect_status(sxckpt({"verify", fresh}), 0);

    r = sxckpt({"import", "--safetensors", g_weights, fx->dir + "/no/such/parent/ck"});
    expect_status(r, 1);
    assert_false(exists(fx->dir + "/no"));
}

void test_usage(void **) {
    expect_status(sxckpt({"import", fx->dir + "/u1"}), 2);
    expect_has(sxckpt({"import", fx->dir + "/u1"}).err, "import needs --safetensors WEIGHTS");
    for (const char *n : {"0", "-1", "abc", "100000", "2x"}) {
        const Run r = sxckpt({"import", "--safetensors", g_weights, "--world-size", n, fx->dir + "/u2"});
        expect_status(r, 2);
        expect_has(r.err, "--world-size is '" + std::string(n) + "'");
    }
    expect_status(sxckpt({"import", "--safetensors", g_weights, fx->dir + "/u3", fx->dir + "/u4"}), 2);
    expect_status(sxckpt({"import", "--safetensors", g_weights, "--bogus", fx->dir + "/u5"}), 2);
    expect_status(sxckpt({"import", "--safetensors", g_weights, fx->dir + "/u6", "--optimizer"}), 2);
    for (const char *d : {"/u1", "/u2", "/u3", "/u4", "/u5", "/u6"}) assert_false(exists(fx->dir + d));
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_values_only),
        cmocka_unit_test(test_widens_16_bit_weights),
        cmocka_unit_test(test_refuses_damaged_files),
        cmocka_unit_test(test_refuses_mismatches),
        cmocka_unit_test(test_loss_scaler_and_user_blob),
        cmocka_unit_test(test_output_directory),
        cmocka_unit_test(test_usage),
    };
    return cmocka_run_group_tests(tests, setup, fixture_teardown);
}
