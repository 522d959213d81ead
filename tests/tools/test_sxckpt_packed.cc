// sxckpt export and import of packed optimizer state (format 4.0), against a checkpoint
// two ranks (threads over local://) save after training an 8-bit AdamW group with
// amsgrad (params of 32, 17 and 4700 blocks, and one of 100 elements that keeps fp32
// state) and a bf16 Adam group:
//
// - export (the default, torch's form): every 8-bit slot as fp32, each element the
//   slot's map entry of its code times its block's scale, read here from the shard files
//   and decoded independently; bf16 widened; fp32 as stored; PREFIX.json says each
//   group's state_dtype;
// - export --state-format torchao: codes (U8) and scales (F32) byte for byte the stored
//   ones, bf16 as BF16;
// - import of the torchao form at another world size stores the same bytes, and a group
//   that loads it steps as one that loads the original; import of the fp32 form quantizes
//   with sx's encoder and rounds bf16 back exactly;
// - bad input (a truncated codes tensor, a scale count that does not match, U8 tensors for
//   an fp32 group, both forms of one slot, a bad state_dtype, --state-format misused)
//   fails with a message naming it, and leaves no checkpoint or partial directory.
#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "optim/state_codec.h"
#include "sxckpt_fixture.h"
#include "stored_tensors.h"

namespace {

using sxckpt_test::expect_has;
using sxckpt_test::expect_status;
using sxckpt_test::exists;
using sxckpt_test::fx;
using sxckpt_test::sxckpt;
using sxtest::read_file;

struct Def {
    const char *name;
    int64_t rows, cols;
    int32_t group;
};
// Group 0: 8-bit AdamW with amsgrad ("small" keeps fp32 state); group 1: bf16 Adam. "big"
// and "c2" are larger than the pieces the tool converts and reads at once (2^16 and 2^20
// elements), and "big"'s values take two chunks (4 MiB each).
const Def kDefs[] = {{"w", 64, 128, 0},  {"v", 17, 256, 0},     {"small", 10, 10, 0},
                     {"c", 48, 100, 1},  {"big", 4700, 256, 0}, {"c2", 1100, 1000, 1}};
constexpr int kDefCount = sizeof kDefs / sizeof kDefs[0];

std::string text(const char *what, sx_status_t st) {
    return std::string(what) + ": " + sx_status_string(st) + ": " + sx_last_error_message();
}

// One rank: its group, a load of `load` (if any), `steps` steps with rank 0's gradients
// (of step numbers from `first_step`), a save into `save`.
std::string rank_main(int world, const std::string &rv, int rank, const std::string &load, int first_step, int steps,
                      const std::string &save) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.num_threads = 1;
    sx_shard_group_t *g = nullptr;
    sx_status_t st = sx_create_shard_group(&cfg, &g);
    if (st != SX_OK) return text("create", st);
    std::string err;
    const int32_t optimizers[2] = {SX_OPTIM_ADAMW, SX_OPTIM_ADAM};
    const int32_t dtypes[2] = {SX_STATE_8BIT, SX_STATE_BF16};
    for (int i = 0; i < 2 && err.empty(); ++i) {
        sx_param_group_desc_t d;
        sx_param_group_desc_init(&d, sizeof d, optimizers[i]);
        d.lr = 0.01, d.weight_decay = 0.05, d.state_dtype = dtypes[i], d.amsgrad = i == 0;
        if ((st = sx_add_param_group(g, &d, nullptr)) != SX_OK) err = text("param group", st);
    }
    for (const Def &p : kDefs) {
        const int64_t shape[2] = {p.rows, p.cols};
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = p.name, d.ndim = 2, d.shape = shape, d.param_group = p.group;
        if (err.empty() && (st = sx_add_param(g, &d, nullptr)) != SX_OK) err = text("param", st);
    }
    if (err.empty() && (st = sx_finalize(g)) != SX_OK) err = text("finalize", st);
    if (err.empty() && !load.empty()) {
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = load.c_str();
        if ((st = sx_load_optim_state(g, &lo)) != SX_OK) err = text("load", st);
    }
    for (int s = first_step; err.empty() && s < first_step + steps; ++s) {
        for (int32_t p = 0; err.empty() && rank == 0 && p < kDefCount; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            if ((st = sx_grad_view(g, p, &v)) != SX_OK) err = text("grad view", st);
            for (uint64_t i = 0; err.empty() && i < v.numel; ++i)
                // Skewed negative, so that many of exp_avg's blocks have a negative
                // extreme (the end of the signed map that is not -1).
                static_cast<float *>(v.data)[i] =
                    0.001f * static_cast<float>(static_cast<int>((i * 7919 + 31 * p + 101 * s) % 2001) - 1100);
        }
        if (err.empty() && (st = sx_step(g, nullptr, nullptr)) != SX_OK) err = text("step", st);
    }
    if (err.empty() && !save.empty() && (st = sxtest::save_synchronously(g, save)) != SX_OK) err = text("save", st);
    sx_destroy_shard_group(g);
    return err;
}

void run_group(int world, const std::string &tag, const std::string &load, int first_step, int steps,
               const std::string &save) {
    const std::string rv = "local://sxckpt-packed-" + tag + "-" + std::to_string(getpid());
    const std::string err =
        sxtest::run_ranks(world, [&](int r) { return rank_main(world, rv, r, load, first_step, steps, save); });
    if (!err.empty()) fail_msg("%s: %s", tag.c_str(), err.c_str());
}

// --- a small safetensors reader and writer, for what the tool writes here (plain names) ---

struct StT {
    std::string dtype;
    std::vector<int64_t> shape;
    std::string bytes;
};
using StMap = std::vector<std::pair<std::string, StT>>;  // in the order of their data

StMap read_st(const std::string &path) {
    const std::string f = read_file(path);
    assert_true(f.size() >= 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(f[static_cast<size_t>(i)]);
    const std::string h = f.substr(8, n);
    StMap out;
    const std::string key = "\":{\"dtype\":\"";
    for (size_t at = h.find(key); at != std::string::npos; at = h.find(key, at + 1)) {
        const size_t open = h.rfind('"', at - 1);
        StT t;
        const size_t d = at + key.size();
        t.dtype = h.substr(d, h.find('"', d) - d);
        const size_t s = h.find('[', d), e = h.find(']', s);
        for (size_t b = s + 1; b < e;) {
            t.shape.push_back(std::stoll(h.substr(b)));
            b = h.find(',', b);
            b = b == std::string::npos || b > e ? e : b + 1;
        }
        unsigned long long begin = 0, end = 0;
        assert_int_equal(std::sscanf(h.c_str() + h.find("\"data_offsets\":[", e), "\"data_offsets\":[%llu,%llu]",
                                     &begin, &end),
                         2);
        t.bytes = f.substr(8 + n + begin, end - begin);
        out.emplace_back(h.substr(open + 1, at - open - 1), t);
    }
    return out;
}

const StT &get(const StMap &m, const std::string &name) {
    for (const auto &e : m)
        if (e.first == name) return e.second;
    fail_msg("no tensor '%s'", name.c_str());
    return m[0].second;
}

bool has(const StMap &m, const std::string &name) {
    for (const auto &e : m)
        if (e.first == name) return true;
    return false;
}

void write_st(const std::string &path, const StMap &m) {
    std::string h = "{", data;
    for (const auto &e : m) {
        h += (h.size() > 1 ? "," : "") + std::string("\"") + e.first + "\":{\"dtype\":\"" + e.second.dtype +
             "\",\"shape\":[";
        for (size_t i = 0; i < e.second.shape.size(); ++i)
            h += (i ? "," : "") + std::to_string(e.second.shape[i]);
        h += "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
             std::to_string(data.size() + e.second.bytes.size()) + "]}";
        data += e.second.bytes;
    }
    h += "}";
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xFF);
    assert_true(sxtest::write_file(path, out + h + data));
}

// --- the checkpoint under test ---

std::string ck() { return fx->dir + "/ck"; }
std::string kind_key(const char *param, sx::ckpt::TensorKind k) {
    return std::string(param) + "/" + std::to_string(static_cast<int>(k));
}

int setup(void **) {
    fx = new sxckpt_test::Fixture;
    fx->dir = sxtest::make_tmpdir("sxckpt-packed");
    if (fx->dir.empty()) return -1;
    const std::string rv = "local://sxckpt-packed-setup-" + std::to_string(getpid());
    const std::string err = sxtest::run_ranks(2, [&](int r) { return rank_main(2, rv, r, "", 0, 3, ck()); });
    if (!err.empty()) std::fprintf(stderr, "%s\n", err.c_str());
    return err.empty() ? 0 : -1;
}

// The default export: 8-bit slots decoded (map[code] x scale, done here from the stored
// bytes), bf16 widened, fp32 as stored; the JSON names each group's state dtype.
void test_export_dequantized(void **) {
    using sx::ckpt::TensorKind;
    const std::string prefix = fx->dir + "/deq";
    expect_status(sxckpt({"export", "--safetensors", fx->dir + "/deq-w.safetensors", "--optimizer", prefix, ck()}),
                  0);
    const sxtest::StoredTensors stored = sxtest::stored_tensors(ck());
    const StMap out = read_st(prefix + ".safetensors");
    const TensorKind kinds[3] = {TensorKind::kExpAvg, TensorKind::kExpAvgSq, TensorKind::kMaxExpAvgSq};
    const char *const names[3] = {".exp_avg", ".exp_avg_sq", ".max_exp_avg_sq"};
    for (const char *p : {"w", "v", "big"})
        for (int slot = 0; slot < 3; ++slot) {
            const std::string &codes = stored.at(kind_key(p, kinds[slot])).second;
            const std::string &scales = stored.at(kind_key(p, sx::ckpt::scales_kind(slot))).second;
            const float *map = slot == 0 ? sx::optim::kSignedMap : sx::optim::kUnsignedMap;
            const StT &t = get(out, p + std::string(names[slot]));
            assert_string_equal(t.dtype.c_str(), "F32");
            assert_int_equal(t.bytes.size(), codes.size() * 4);
            size_t nonzero = 0;
            for (size_t i = 0; i < codes.size(); ++i) {
                float scale, got;
                std::memcpy(&scale, scales.data() + i / 256 * 4, 4);
                std::memcpy(&got, t.bytes.data() + i * 4, 4);
                const float want = map[static_cast<unsigned char>(codes[i])] * scale;
                if (std::memcmp(&got, &want, 4) != 0) fail_msg("%s slot %d element %zu: %g, not %g", p, slot, i, got, want);
                nonzero += want != 0.0f;
            }
            assert_true(nonzero > codes.size() / 2);  // the state is real
        }
    for (const char *p : {"c", "c2"}) {
        const std::string &bf16 = stored.at(kind_key(p, TensorKind::kExpAvg)).second;
        const StT &c = get(out, p + std::string(".exp_avg"));
        assert_string_equal(c.dtype.c_str(), "F32");
        assert_int_equal(c.bytes.size(), bf16.size() * 2);
        for (size_t i = 0; i < bf16.size() / 2; ++i) {
            uint32_t bits = 0;
            std::memcpy(reinterpret_cast<char *>(&bits) + 2, bf16.data() + 2 * i, 2);  // little-endian: the high half
            if (std::memcmp(&bits, c.bytes.data() + 4 * i, 4) != 0) fail_msg("%s.exp_avg element %zu", p, i);
        }
    }
    assert_true(get(out, "small.exp_avg").bytes == stored.at(kind_key("small", TensorKind::kExpAvg)).second);
    assert_false(has(out, "w.exp_avg.codes"));
    assert_false(has(out, "w.exp_avg.scale"));
    const std::string json = read_file(prefix + ".json");
    expect_has(json, "\"state_dtype\":\"8bit\"");
    expect_has(json, "\"state_dtype\":\"bf16\"");
}

// --state-format torchao: codes and scales as stored, bf16 as BF16.
void test_export_torchao(void **) {
    using sx::ckpt::TensorKind;
    const std::string prefix = fx->dir + "/ao";
    const auto r = sxckpt({"export", "--safetensors", fx->dir + "/ao-w.safetensors", "--optimizer", prefix,
                           "--state-format", "torchao", ck()});
    expect_status(r, 0);
    const sxtest::StoredTensors stored = sxtest::stored_tensors(ck());
    const StMap out = read_st(prefix + ".safetensors");
    const StT &codes = get(out, "w.exp_avg_sq.codes");
    assert_string_equal(codes.dtype.c_str(), "U8");
    assert_true(codes.shape == (std::vector<int64_t>{64, 128}));
    assert_true(codes.bytes == stored.at(kind_key("w", TensorKind::kExpAvgSq)).second);
    const StT &scale = get(out, "v.exp_avg.scale");
    assert_string_equal(scale.dtype.c_str(), "F32");
    assert_true(scale.shape == (std::vector<int64_t>{17}));
    assert_true(scale.bytes == stored.at(kind_key("v", TensorKind::kScales0)).second);
    const StT &bf16 = get(out, "c.exp_avg_sq");
    assert_string_equal(bf16.dtype.c_str(), "BF16");
    assert_true(bf16.bytes == stored.at(kind_key("c", TensorKind::kExpAvgSq)).second);
    assert_string_equal(get(out, "small.exp_avg").dtype.c_str(), "F32");
    assert_false(has(out, "w.exp_avg"));
}

// The torchao form imported at 3 ranks stores what the original stores, byte for byte;
// two ranks that load either and step on get the same checkpoint.
void test_import_torchao_form(void **) {
    const std::string prefix = fx->dir + "/ao", back = fx->dir + "/ao-ck";
    expect_status(sxckpt({"import", "--safetensors", fx->dir + "/ao-w.safetensors", "--optimizer", prefix,
                          "--world-size", "3", back}),
                  0);
    expect_status(sxckpt({"verify", back}), 0);
    sxtest::expect_same_tensors(ck(), back);
    run_group(2, "from-original", ck(), 3, 2, fx->dir + "/after-original");
    run_group(2, "from-import", back, 3, 2, fx->dir + "/after-import");
    sxtest::expect_same_tensors(fx->dir + "/after-original", fx->dir + "/after-import");
}

// The fp32 form imported into the same groups: each 8-bit slot quantized by sx's encoder
// (block by block, here), each bf16 slot rounded back to the bits it was widened from.
void test_import_fp32_form(void **) {
    using sx::ckpt::TensorKind;
    const std::string prefix = fx->dir + "/deq", back = fx->dir + "/deq-ck";
    expect_status(sxckpt({"import", "--safetensors", fx->dir + "/deq-w.safetensors", "--optimizer", prefix, back}), 0);
    const sxtest::StoredTensors stored = sxtest::stored_tensors(back), orig = sxtest::stored_tensors(ck());
    const StMap in = read_st(prefix + ".safetensors");
    for (const char *p : {"w", "big"}) {
        const StT &values = get(in, p + std::string(".exp_avg_sq"));
        const std::string &codes = stored.at(kind_key(p, TensorKind::kExpAvgSq)).second;
        const std::string &scales = stored.at(kind_key(p, TensorKind::kScales1)).second;
        assert_int_equal(stored.at(kind_key(p, TensorKind::kExpAvgSq)).first, sx::ckpt::kDTypeQ8);
        assert_int_equal(codes.size() * 4, values.bytes.size());
        for (size_t b = 0; b < codes.size() / 256; ++b) {
            uint8_t want[256];
            const float scale = sx::optim::encode_block(reinterpret_cast<const float *>(values.bytes.data()) + b * 256,
                                                        256, sx::optim::kUnsignedMap, want);
            if (std::memcmp(want, codes.data() + b * 256, 256) != 0 || std::memcmp(&scale, scales.data() + b * 4, 4) != 0)
                fail_msg("%s.exp_avg_sq block %zu: not sx's encoding of the fp32 values", p, b);
        }
    }
    for (const char *key : {"c/1", "c/2", "c2/1", "small/1", "small/2", "small/3", "w/0", "big/0", "c/0"})
        assert_true(stored.at(key) == orig.at(key));
    // The signed slot's values were decoded from codes: they take back those codes and
    // scales, blocks whose largest magnitude is negative included (there are some).
    size_t negative = 0;
    const StT &w = get(in, "w.exp_avg");
    for (size_t b = 0; b < w.bytes.size() / 1024; ++b) {
        const float *f = reinterpret_cast<const float *>(w.bytes.data()) + b * 256;
        negative += -*std::min_element(f, f + 256) > *std::max_element(f, f + 256);
    }
    assert_true(negative > 0);
    for (const char *p : {"w", "big"})
        for (TensorKind kind : {TensorKind::kExpAvg, TensorKind::kScales0, TensorKind::kExpAvgSq, TensorKind::kScales1})
            if (stored.at(kind_key(p, kind)) != orig.at(kind_key(p, kind)))
                fail_msg("%s: tensor kind %d imported from the fp32 form differs from the checkpoint's", p,
                         static_cast<int>(kind));
    run_group(1, "load-fp32-form", back, 3, 1, "");
}

// Writes an import input from the torchao export with `edit` applied to its state
// tensors and `json_edit` to its JSON; runs the import and checks that it fails saying
// `message`, leaving nothing behind.
// `cut` bytes are cut off the end of the state file.
void expect_refused(const std::string &tag, const std::function<void(StMap *)> &edit,
                    const std::function<void(std::string *)> &json_edit, const std::string &message,
                    off_t cut = 0) {
    const std::string prefix = fx->dir + "/bad-" + tag, dir = fx->dir + "/bad-" + tag + "-ck";
    StMap state = read_st(fx->dir + "/ao.safetensors");
    edit(&state);
    write_st(prefix + ".safetensors", state);
    if (cut > 0)
        assert_int_equal(truncate((prefix + ".safetensors").c_str(),
                                  static_cast<off_t>(sxckpt_test::file_size(prefix + ".safetensors")) - cut),
                         0);
    std::string json = read_file(fx->dir + "/ao.json");
    json_edit(&json);
    assert_true(sxtest::write_file(prefix + ".json", json));
    const auto r = sxckpt({"import", "--safetensors", fx->dir + "/ao-w.safetensors", "--optimizer", prefix, dir});
    expect_status(r, 1);
    expect_has(r.err, message);
    assert_false(exists(dir));
    assert_false(exists(dir + ".sx-partial"));
}

StT &find(StMap *m, const std::string &name) {
    for (auto &e : *m)
        if (e.first == name) return e.second;
    fail_msg("no tensor '%s'", name.c_str());
    return m->front().second;
}

void test_import_refusals(void **) {
    const auto same_json = [](std::string *) {};
    // A codes tensor cut short: 64 x 127 codes for a 64 x 128 param.
    expect_refused("short-codes", [](StMap *m) {
        StT &t = find(m, "w.exp_avg.codes");
        t.shape = {64, 127};
        t.bytes.resize(64 * 127);
    }, same_json, "tensor 'w.exp_avg.codes' is U8 [64, 127]; the codes of param 'w' are U8 [64, 128]");
    // One scale too few.
    expect_refused("scale-count", [](StMap *m) {
        StT &t = find(m, "v.exp_avg_sq.scale");
        t.shape = {16};
        t.bytes.resize(16 * 4);
    }, same_json, "tensor 'v.exp_avg_sq.scale' is F32 [16]; param 'v' (4352 elements) has one F32 scale per block of 256: [17]");
    // Codes and scales for a group of fp32 state.
    const auto fp32_group = [](std::string *j) {
        const size_t at = j->find("\"state_dtype\":\"8bit\",");
        assert_true(at != std::string::npos);
        j->erase(at, std::strlen("\"state_dtype\":\"8bit\","));
    };
    expect_refused("fp32-group", [](StMap *) {}, fp32_group,
                   "'w.exp_avg.codes' and 'w.exp_avg.scale': torchao's 8-bit state, but param 'w' keeps fp32 state "
                   "(its param group's state_dtype is fp32)");
    // A U8 tensor under a slot's own name.
    expect_refused("u8-plain", [](StMap *m) {
        for (auto &e : *m)
            if (e.first == "small.exp_avg") e.second = {"U8", {10, 10}, std::string(100, '\0')};
    }, same_json, "tensor 'small.exp_avg' has dtype U8");
    // Codes for a param too small for 8 bits.
    expect_refused("small-codes", [](StMap *m) {
        for (auto &e : *m)
            if (e.first == "small.exp_avg") e = {"small.exp_avg.codes", {"U8", {10, 10}, std::string(100, '\0')}};
        m->push_back({"small.exp_avg.scale", {"F32", {0}, ""}});
    }, same_json, "param 'small' keeps fp32 state (its param group is 8-bit, but 100 elements are fewer than 4096");
    // Both forms of one slot.
    expect_refused("both", [](StMap *m) {
        m->push_back({"w.exp_avg", {"F32", {64, 128}, std::string(64 * 128 * 4, '\0')}});
    }, same_json, "param 'w' has both 'w.exp_avg' and torchao's 'w.exp_avg.codes'");
    // Codes without their scales.
    expect_refused("no-scale", [](StMap *m) {
        for (size_t i = 0; i < m->size(); ++i)
            if ((*m)[i].first == "w.exp_avg.scale") m->erase(m->begin() + static_cast<long>(i));
    }, same_json, "param 'w' has 'w.exp_avg.codes' but no 'w.exp_avg.scale'");
    // A state dtype sx does not have.
    expect_refused("bad-dtype", [](StMap *) {}, [](std::string *j) {
        const size_t at = j->find("\"8bit\"");
        j->replace(at, 6, "\"4bit\"");
    }, "\"state_dtype\" is \"4bit\"; it is \"fp32\", \"bf16\" or \"8bit\"");
    // The file cut inside its last tensor.
    expect_refused("truncated-file", [](StMap *) {}, same_json, "truncated", 100);
}

// --state-format needs --optimizer, and is torch or torchao: usage errors (exit 2). The
// params alone export from a checkpoint of packed state as from any other.
void test_export_usage(void **) {
    const std::string w = fx->dir + "/usage.safetensors";
    auto r = sxckpt({"export", "--safetensors", w, "--state-format", "torchao", ck()});
    expect_status(r, 2);
    expect_has(r.err, "--state-format applies to the optimizer state; it needs --optimizer PREFIX");
    r = sxckpt({"export", "--safetensors", w, "--optimizer", fx->dir + "/usage", "--state-format", "bnb", ck()});
    expect_status(r, 2);
    expect_has(r.err, "--state-format is 'bnb'; it is torch or torchao");
    assert_false(exists(w));
    // Without --optimizer, the params alone, as stored.
    expect_status(sxckpt({"export", "--safetensors", w, ck()}), 0);
    const StMap params = read_st(w);
    assert_int_equal(params.size(), kDefCount);
    assert_true(get(params, "big").bytes == sxtest::stored_tensors(ck()).at("big/0").second);
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_dequantized),
        cmocka_unit_test(test_export_torchao),
        cmocka_unit_test(test_import_torchao_form),
        cmocka_unit_test(test_import_fp32_form),
        cmocka_unit_test(test_import_refusals),
        cmocka_unit_test(test_export_usage),
    };
    return cmocka_run_group_tests(tests, setup, sxckpt_test::fixture_teardown);
}
