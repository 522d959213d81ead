// Hugging Face checkpoints and PEFT adapters out of and into a group (sx_interop.h):
// a world-1 group's params exported as sharded bf16 files hold the params' values (read
// back with the safetensors reader); imported through a rename map into 3 ranks at stage 3
// (threads) and into 2 processes over TCP at stage 3, and exported again, they come back
// as the files held them; the params of each rank equal them too. Bad input is named and
// changes nothing: missing and unexpected keys, a shape or dtype that does not fit, a
// truncated or damaged file, a name map naming no param, an export into an existing
// directory; an export whose rename fails leaves no directory behind; the ABI's misuse
// rules (bad handle, NULL path, a newer struct's non-zero tail, a bad root or dtype).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "base/half.h"
#include "interop/hf_files.h"
#include "interop/json_value.h"
#include "interop/safetensors.h"
#include "io/fault_file_ops.h"
#include "io/file_ops.h"
#include "process_ranks.h"
#include "run_ranks.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

namespace {

struct P {
    std::string name;
    std::vector<int64_t> shape;
    int32_t dtype;
    int32_t unit;
};

// Three units, fp32 and bf16 params (a unit's share a dtype), sizes that do not divide by 2 or 3.
constexpr int32_t kUnits = 3;
const std::vector<P> kParams = {
    {"embed.weight", {13, 7}, SX_DTYPE_F32, 0},
    {"layer.q.weight", {7, 7}, SX_DTYPE_BF16, 1},
    {"layer.q.lora_A", {3, 7}, SX_DTYPE_F32, 2},
    {"layer.q.lora_B", {7, 3}, SX_DTYPE_F32, 2},
    {"norm", {7}, SX_DTYPE_BF16, 1},
};

uint64_t numel(const P &p) {
    uint64_t n = 1;
    for (int64_t e : p.shape) n *= static_cast<uint64_t>(e);
    return n;
}

float value(size_t p, uint64_t i) { return std::sin(0.37f * static_cast<float>(i) + static_cast<float>(p)) * (1.0f + p); }

std::string tmp_dir(const std::string &tag) {
    const std::string d = "/tmp/sx-test-interop-" + tag + "-" + std::to_string(getpid());
    sx::io::posix_file_ops()->remove_tree(d);
    return d;
}

std::string err(const char *what, sx_status_t s) {
    return std::string(what) + ": " + sx_status_string(s) + ": " + sx_last_error_message();
}

sx_shard_group_t *make_group(const std::string &rv, int rank, int world, int stage, std::string *why) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.stage = stage;
    cfg.num_threads = 1;
    cfg.timeout_ms = 60000;
    sx_shard_group_t *g = nullptr;
    sx_status_t s = sx_create_shard_group(&cfg, &g);
    if (s != SX_OK) return *why = err("create", s), nullptr;
    sx_param_group_desc_t a;
    sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_ADAMW);
    sx_add_param_group(g, &a, nullptr);
    for (const P &p : kParams) {
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = p.name.c_str();
        d.ndim = static_cast<int32_t>(p.shape.size());
        d.shape = p.shape.data();
        d.dtype = p.dtype;
        d.unit = p.unit;
        s = sx_add_param(g, &d, nullptr);
        if (s != SX_OK) return *why = err("add_param", s), nullptr;
    }
    s = sx_finalize(g);
    if (s != SX_OK) return *why = err("finalize", s), nullptr;
    return g;
}

// A world-1 group whose params hold value(p, i) (bf16 params: rounded).
sx_shard_group_t *filled_group(const std::string &tag) {
    std::string why;
    sx_shard_group_t *g = make_group("local://interop-" + tag + "-" + std::to_string(getpid()), 0, 1, 1, &why);
    if (!g) fail_msg("%s", why.c_str());
    for (size_t p = 0; p < kParams.size(); ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        assert_int_equal(sx_param_view(g, static_cast<int32_t>(p), &v), SX_OK);
        for (uint64_t i = 0; i < v.numel; ++i) {
            if (v.dtype == SX_DTYPE_F32) static_cast<float *>(v.data)[i] = value(p, i);
            else static_cast<uint16_t *>(v.data)[i] = sx::half::f32_to_bf16(value(p, i));
        }
    }
    return g;
}

// Every tensor of a checkpoint (a directory or file) as fp32, by key.
std::map<std::string, std::vector<float>> read_all(const std::string &path, std::string *dtypes = nullptr) {
    auto ops = sx::io::posix_file_ops();
    std::vector<std::string> files;
    bool is_dir = false;
    ops->is_directory(path, &is_dir);
    if (is_dir) {
        std::vector<std::string> names;
        ops->list_dir(path, &names);
        for (const std::string &n : names)
            if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) files.push_back(path + "/" + n);
    } else {
        files.push_back(path);
    }
    std::map<std::string, std::vector<float>> out;
    for (const std::string &f : files) {
        sx::interop::StFile st;
        sx::Status s = sx::interop::read_safetensors(*ops, f, &st);
        if (!s.ok()) fail_msg("%s", s.message().c_str());
        int fd = -1;
        ops->open_read(f, &fd);
        std::vector<char> scratch;
        for (const sx::interop::StTensor &t : st.tensors) {
            std::vector<float> v(t.numel());
            s = sx::interop::read_f32(*ops, fd, st, t, 0, t.numel(), v.data(), &scratch);
            if (!s.ok()) fail_msg("%s", s.message().c_str());
            out[t.name] = v;
            if (dtypes) *dtypes += t.dtype_text + " ";
        }
        ops->close(fd, f);
    }
    return out;
}

// The rename map of the tests: sx name -> "model.<sx name>".
struct Names {
    std::vector<std::string> keys;
    std::vector<const char *> sx, file;
    Names() {
        for (const P &p : kParams) keys.push_back("model." + p.name);
        for (size_t i = 0; i < kParams.size(); ++i) sx.push_back(kParams[i].name.c_str()), file.push_back(keys[i].c_str());
    }
};

sx_status_t export_dir(sx_shard_group_t *g, const std::string &dir, int32_t dtype, uint64_t max_shard, const Names *n) {
    sx_hf_export_options_t o;
    sx_hf_export_options_init(&o, sizeof o);
    o.dtype = dtype;
    o.max_shard_bytes = max_shard;
    if (n) o.num_names = static_cast<int32_t>(n->sx.size()), o.sx_names = n->sx.data(), o.file_names = n->file.data();
    return sx_export_hf(g, dir.c_str(), &o);
}

sx_status_t import_dir(sx_shard_group_t *g, const std::string &path, const Names *n, sx_hf_import_report_t *rep,
                       int allow_missing = 0, int allow_unexpected = 0) {
    sx_hf_import_options_t o;
    sx_hf_import_options_init(&o, sizeof o);
    if (n) o.num_names = static_cast<int32_t>(n->sx.size()), o.sx_names = n->sx.data(), o.file_names = n->file.data();
    o.allow_missing = allow_missing;
    o.allow_unexpected = allow_unexpected;
    return sx_import_hf(g, path.c_str(), &o, rep);
}

// This rank's view of every param's values (stage 3: each unit gathered), as fp32.
std::string params_of(sx_shard_group_t *g, int stage, std::vector<std::vector<float>> *out) {
    out->assign(kParams.size(), {});
    for (int32_t u = 0; u < kUnits; ++u) {
        if (stage == 3) {
            sx_status_t s = sx_unit_gather(g, u);
            if (s != SX_OK) return err("gather", s);
        }
        for (size_t p = 0; p < kParams.size(); ++p) {
            if (kParams[p].unit != u) continue;
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            sx_status_t s = sx_param_view(g, static_cast<int32_t>(p), &v);
            if (s != SX_OK) return err("view", s);
            for (uint64_t i = 0; i < v.numel; ++i)
                (*out)[p].push_back(v.dtype == SX_DTYPE_F32 ? static_cast<float *>(v.data)[i]
                                                            : sx::half::bf16_to_f32(static_cast<uint16_t *>(v.data)[i]));
        }
        if (stage == 3) {
            sx_status_t s = sx_unit_release(g, u);
            if (s != SX_OK) return err("release", s);
        }
    }
    return "";
}

// What a param holds after importing `file` values: fp32 ones as they are, bf16 ones rounded.
std::string check_params(const std::vector<std::vector<float>> &got, const std::map<std::string, std::vector<float>> &file,
                         const std::string &prefix) {
    for (size_t p = 0; p < kParams.size(); ++p) {
        const auto it = file.find(prefix + kParams[p].name);
        if (it == file.end()) return "no key for " + kParams[p].name;
        if (got[p].size() != it->second.size()) return kParams[p].name + ": size differs";
        for (size_t i = 0; i < got[p].size(); ++i) {
            float want = it->second[i];
            if (kParams[p].dtype == SX_DTYPE_BF16) want = sx::half::bf16_to_f32(sx::half::f32_to_bf16(want));
            if (got[p][i] != want) return kParams[p].name + "[" + std::to_string(i) + "] differs";
        }
    }
    return "";
}

// The first file: world 1, bf16, sharded (at most 150 bytes of tensors per file: 3 files), renamed.
std::map<std::string, std::vector<float>> first_export(const std::string &dir) {
    sx_shard_group_t *g = filled_group("first");
    Names n;
    assert_int_equal(export_dir(g, dir, SX_DTYPE_BF16, 150, &n), SX_OK);
    sx_destroy_shard_group(g);
    std::string dtypes;
    auto got = read_all(dir, &dtypes);
    assert_true(dtypes.find("F32") == std::string::npos);  // every tensor bf16
    return got;
}

void test_export_holds_the_params_sharded(void **) {
    const std::string dir = tmp_dir("first");
    const auto got = first_export(dir);
    assert_int_equal(got.size(), kParams.size());
    for (size_t p = 0; p < kParams.size(); ++p) {
        const std::vector<float> &v = got.at("model." + kParams[p].name);
        assert_int_equal(v.size(), numel(kParams[p]));
        for (uint64_t i = 0; i < v.size(); ++i)
            assert_true(v[i] == sx::half::bf16_to_f32(sx::half::f32_to_bf16(value(p, i))));
    }
    // Sharded: an index naming every key's file, each file holding at most the limit
    // (but for a tensor larger than it alone), and no partial directory beside it.
    std::string index;
    assert_true(sx::io::read_file(*sx::io::posix_file_ops(), dir + "/model.safetensors.index.json", 1 << 20, &index).ok());
    sx::interop::JsonValue j;
    assert_true(sx::interop::parse_json(index, &j).ok());
    const sx::interop::JsonValue *map = j.find("weight_map");
    assert_non_null(map);
    assert_int_equal(map->members.size(), kParams.size());
    std::map<std::string, int> files;
    for (const auto &m : map->members) ++files[m.second.text];
    assert_int_equal(files.size(), 3);  // [embed] [q, lora_A] [lora_B, norm]: 182, 140 and 56 bytes
    assert_true(files.count("model-00001-of-0000" + std::to_string(files.size()) + ".safetensors") == 1);
    bool partial = true;
    sx::io::posix_file_ops()->exists(dir + ".sx-partial-" + std::to_string(getpid()), &partial);
    assert_false(partial);
    sx::io::posix_file_ops()->remove_tree(dir);
}

// Imported into W ranks at stage 3 through the rename map, the params hold the file's
// values on every rank; exported again (fp32, one file, own names) they come back.
std::string import_and_export(int rank, int world, const std::string &rv, const std::string &in, const std::string &out) {
    std::string why;
    sx_shard_group_t *g = make_group(rv, rank, world, 3, &why);
    if (!g) return why;
    Names n;
    sx_hf_import_report_t rep;
    sx_hf_import_report_init(&rep, sizeof rep);
    sx_status_t s = import_dir(g, in, &n, &rep);
    if (s != SX_OK) return err("import", s);
    if (rep.num_loaded != static_cast<int32_t>(kParams.size()) || rep.num_missing || rep.num_unexpected)
        return "the report says " + std::to_string(rep.num_loaded) + " loaded";
    std::vector<std::vector<float>> got;
    why = params_of(g, 3, &got);
    if (why.empty()) why = check_params(got, read_all(in), "model.");
    if (why.empty() && (s = export_dir(g, out, 0, 0, nullptr)) != SX_OK) why = err("export", s);
    sx_destroy_shard_group(g);
    return why;
}

void test_import_into_three_ranks_at_stage_3_and_back(void **) {
    const std::string in = tmp_dir("in3"), out = tmp_dir("out3");
    const auto file = first_export(in);
    const std::string rv = "local://interop-w3-" + std::to_string(getpid());
    const std::string e = sxtest::run_ranks(3, [&](int r) { return import_and_export(r, 3, rv, in, out); });
    if (!e.empty()) fail_msg("%s", e.c_str());
    const auto back = read_all(out + "/model.safetensors");
    for (size_t p = 0; p < kParams.size(); ++p) {
        const std::vector<float> &want = file.at("model." + kParams[p].name), &got = back.at(kParams[p].name);
        assert_int_equal(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) assert_true(got[i] == want[i]);  // bf16 values are exact in fp32
    }
    sx::io::posix_file_ops()->remove_tree(in);
    sx::io::posix_file_ops()->remove_tree(out);
}

int child_main(int argc, char **argv) {
    sxtest::ChildArgs a;
    if (!sxtest::parse_child_args(argc, argv, &a)) return 2;
    const std::string e = import_and_export(a.rank, a.world, a.rendezvous, a.get("in", ""), a.get("out", ""));
    if (!e.empty()) std::fprintf(stderr, "rank %d: %s\n", a.rank, e.c_str());
    return e.empty() ? 0 : 1;
}

void test_import_into_two_processes_over_tcp(void **) {
    const std::string in = tmp_dir("inp"), out = tmp_dir("outp");
    const auto file = first_export(in);
    const std::string e = sxtest::run_process_ranks(2, {"in", in, "out", out}, 120);
    if (!e.empty()) fail_msg("%s", e.c_str());
    const auto back = read_all(out + "/model.safetensors");
    for (size_t p = 0; p < kParams.size(); ++p) assert_true(back.at(kParams[p].name) == file.at("model." + kParams[p].name));
    sx::io::posix_file_ops()->remove_tree(in);
    sx::io::posix_file_ops()->remove_tree(out);
}

// The params of a world-1 group, for "nothing changed".
std::vector<std::vector<float>> snapshot(sx_shard_group_t *g) {
    std::vector<std::vector<float>> v;
    const std::string e = params_of(g, 1, &v);
    if (!e.empty()) fail_msg("%s", e.c_str());
    return v;
}

// A one-file checkpoint written by hand: the tensors given (name, dtype text, shape), data zero.
void write_file(const std::string &path, const std::vector<sx::interop::StTensor> &ts) {
    std::vector<sx::interop::StTensor> tensors = ts;
    uint64_t at = 0;
    for (auto &t : tensors) {
        t.begin = at;
        at += t.numel() * t.elem_bytes;
        t.end = at;
    }
    std::string header;
    assert_true(sx::interop::safetensors_header({}, tensors, &header).ok());
    std::ofstream f(path, std::ios::binary);
    f << header << std::string(at, '\0');
}

sx::interop::StTensor tensor(const std::string &name, const char *dtype, std::vector<int64_t> shape, uint64_t elem) {
    sx::interop::StTensor t;
    t.name = name;
    t.dtype = 0;
    t.dtype_text = dtype;
    t.elem_bytes = elem;
    t.shape = std::move(shape);
    return t;
}

void expect_refused(sx_shard_group_t *g, const std::string &path, sx_status_t code, const std::vector<std::string> &words,
                    const Names *n = nullptr) {
    const auto before = snapshot(g);
    sx_hf_import_report_t rep;
    sx_hf_import_report_init(&rep, sizeof rep);
    const sx_status_t s = import_dir(g, path, n, &rep);
    const std::string msg = sx_last_error_message();
    if (s != code) fail_msg("%s: got %s: %s", path.c_str(), sx_status_string(s), msg.c_str());
    for (const std::string &w : words)
        if (msg.find(w) == std::string::npos) fail_msg("the message lacks '%s': %s", w.c_str(), msg.c_str());
    assert_true(snapshot(g) == before);
}

void test_bad_input_is_named_and_changes_nothing(void **) {
    sx_shard_group_t *g = filled_group("bad");
    const std::string dir = tmp_dir("bad");
    assert_int_equal(export_dir(g, dir, SX_DTYPE_F32, 0, nullptr), SX_OK);
    const std::string file = dir + "/model.safetensors";
    // An export into an existing directory is refused, naming it.
    assert_int_equal(export_dir(g, dir, SX_DTYPE_F32, 0, nullptr), SX_ERR_ALREADY_EXISTS);
    assert_non_null(std::strstr(sx_last_error_message(), "exists already"));
    // A name map naming no param.
    Names wrong;
    wrong.sx[2] = "layer.q.lora_C";
    assert_int_equal(export_dir(g, tmp_dir("wrong"), 0, 0, &wrong), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "\"layer.q.lora_C\", which is no param"));

    // Missing keys: a file without "norm" (and with a key no param takes).
    std::vector<sx::interop::StTensor> ts;
    for (const P &p : kParams)
        if (p.name != "norm") ts.push_back(tensor(p.name, "F32", p.shape, 4));
    ts.push_back(tensor("extra.bias", "F32", {2}, 4));
    const std::string partial = dir + "/partial.safetensors";
    write_file(partial, ts);
    expect_refused(g, partial, SX_ERR_NOT_FOUND, {"\"norm\"", "\"extra.bias\""});
    sx_hf_import_report_t rep;
    sx_hf_import_report_init(&rep, sizeof rep);
    assert_int_equal(import_dir(g, partial, nullptr, &rep, 1, 0), SX_ERR_INVALID_ARGUMENT);  // still unexpected
    assert_int_equal(rep.num_missing, 1);
    assert_string_equal(rep.missing[0], "norm");
    assert_int_equal(rep.num_unexpected, 1);
    assert_string_equal(rep.unexpected[0], "extra.bias");
    assert_int_equal(import_dir(g, partial, nullptr, &rep, 1, 1), SX_OK);  // allowed: the others load (zeros)
    assert_int_equal(rep.num_loaded, 4);
    assert_true(snapshot(g)[0] == std::vector<float>(numel(kParams[0]), 0.0f));

    // A shape that does not fit, and a dtype sx does not take, name the param and key.
    ts.assign({tensor("embed.weight", "F32", {7, 13}, 4)});
    write_file(partial, ts);
    Names n;
    std::vector<const char *> one_sx = {"embed.weight"}, one_file = {"embed.weight"};
    n.sx = one_sx, n.file = one_file;
    sx_hf_import_options_t o;
    sx_hf_import_options_init(&o, sizeof o);
    o.num_names = 1, o.sx_names = one_sx.data(), o.file_names = one_file.data(), o.only_named = 1;
    assert_int_equal(sx_import_hf(g, partial.c_str(), &o, nullptr), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "shape is [7, 13], the param's [13, 7]"));
    ts.assign({tensor("embed.weight", "I64", {13, 7}, 8)});
    write_file(partial, ts);
    assert_int_equal(sx_import_hf(g, partial.c_str(), &o, nullptr), SX_ERR_UNSUPPORTED);
    assert_non_null(std::strstr(sx_last_error_message(), "I64"));

    // A truncated file, and a header that is not JSON.
    sx_destroy_shard_group(g);
    g = filled_group("bad2");
    const auto before = snapshot(g);
    assert_int_equal(truncate(file.c_str(), 100), 0);
    expect_refused(g, file, SX_ERR_CORRUPT, {"model.safetensors"});
    {
        std::ofstream f(file, std::ios::binary | std::ios::trunc);
        f << std::string("\x10\0\0\0\0\0\0\0{not json at all", 24);
    }
    expect_refused(g, file, SX_ERR_CORRUPT, {"not valid JSON"});
    expect_refused(g, dir + "/none", SX_ERR_NOT_FOUND, {"none"});
    assert_true(snapshot(g) == before);
    sx_destroy_shard_group(g);
    sx::io::posix_file_ops()->remove_tree(dir);
}

void test_a_peft_adapter(void **) {
    sx_shard_group_t *g = filled_group("peft");
    const std::string dir = tmp_dir("peft");
    std::vector<const char *> sx = {"layer.q.lora_A", "layer.q.lora_B"};
    std::vector<const char *> keys = {"base_model.model.layer.q.lora_A.weight", "base_model.model.layer.q.lora_B.weight"};
    sx_hf_export_options_t o;
    sx_hf_export_options_init(&o, sizeof o);
    o.num_names = 2, o.sx_names = sx.data(), o.file_names = keys.data();
    sx_peft_config_t c;
    sx_peft_config_init(&c, sizeof c);
    const char *modules[] = {"q"};
    c.base_model_name_or_path = "tiny/base";
    c.task_type = "CAUSAL_LM";
    c.target_modules = modules, c.num_target_modules = 1;
    c.r = 3, c.lora_alpha = 6;
    c.extra_json = "{\"modules_to_save\": null, \"layers_to_transform\": [0]}";
    // Without target modules, or repeating a field, it is refused and nothing is written.
    c.num_target_modules = 0;
    assert_int_equal(sx_export_peft(g, dir.c_str(), &o, &c), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "target_modules"));
    c.num_target_modules = 1;
    c.extra_json = "{\"r\": 4}";
    assert_int_equal(sx_export_peft(g, dir.c_str(), &o, &c), SX_ERR_INVALID_ARGUMENT);
    bool exists = true;
    sx::io::posix_file_ops()->exists(dir, &exists);
    assert_false(exists);
    c.extra_json = "{\"modules_to_save\": null, \"layers_to_transform\": [0]}";
    assert_int_equal(sx_export_peft(g, dir.c_str(), &o, &c), SX_OK);
    const auto got = read_all(dir + "/adapter_model.safetensors");
    assert_int_equal(got.size(), 2);
    assert_true(got.at(keys[0]).size() == numel(kParams[2]));
    assert_true(got.at(keys[1])[4] == value(3, 4));
    std::string config;
    assert_true(sx::io::read_file(*sx::io::posix_file_ops(), dir + "/adapter_config.json", 1 << 20, &config).ok());
    sx::interop::JsonValue j;
    assert_true(sx::interop::parse_json(config, &j).ok());
    assert_string_equal(j.find("peft_type")->text.c_str(), "LORA");
    assert_string_equal(j.find("r")->text.c_str(), "3");
    assert_string_equal(j.find("lora_alpha")->text.c_str(), "6");
    assert_string_equal(j.find("target_modules")->items[0].text.c_str(), "q");
    assert_int_equal(j.find("layers_to_transform")->items.size(), 1);
    // Read back by name into another group's lora params (only those take part).
    sx_shard_group_t *h = filled_group("peft2");
    sx_hf_import_options_t io;
    sx_hf_import_options_init(&io, sizeof io);
    io.num_names = 2, io.sx_names = sx.data(), io.file_names = keys.data(), io.only_named = 1;
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    sx_param_view(h, 3, &v);
    static_cast<float *>(v.data)[4] = 99.0f;
    assert_int_equal(sx_import_hf(h, dir.c_str(), &io, nullptr), SX_OK);
    assert_true(static_cast<float *>(v.data)[4] == value(3, 4));
    sx_destroy_shard_group(h);
    sx_destroy_shard_group(g);
    sx::io::posix_file_ops()->remove_tree(dir);
}

// A failed rename (or fsync) of the export leaves neither the directory nor its partial copy.
void test_a_failed_export_leaves_nothing(void **) {
    for (const sx::io::OpKind op : {sx::io::OpKind::kRename, sx::io::OpKind::kFsync, sx::io::OpKind::kWrite}) {
        const std::string dir = tmp_dir("fault");
        sx::io::FaultFileOps ops(sx::io::posix_file_ops());
        ops.arm(op, 1, false);
        std::vector<sx::interop::ParamEntry> params = {{"a", {4}}, {"b", {3, 2}}};
        std::vector<std::string> keys = {"a", "b"};
        sx::Status s;
        {
            sx::interop::HfWriter w(ops);
            s = w.plan(dir, params, keys, SX_DTYPE_BF16, 8, "");
            std::vector<float> v(6, 1.0f);
            if (s.ok()) s = w.write(0, v.data(), 4);
            if (s.ok()) s = w.write(1, v.data(), 6);
            if (s.ok()) s = w.commit();
        }
        assert_false(s.ok());
        bool exists = true, partial = true;
        sx::io::posix_file_ops()->exists(dir, &exists);
        sx::io::posix_file_ops()->exists(dir + ".sx-partial-" + std::to_string(getpid()), &partial);
        assert_false(exists);
        assert_false(partial);
    }
}

// The ABI's rules on the new calls: a bad handle, a NULL path, an options struct from a
// newer caller whose unknown tail is not zero, an out-of-range root, and a dtype the files
// do not take are refused, and nothing is written.
void test_misuse_is_refused(void **) {
    const std::string dir = tmp_dir("misuse");
    assert_int_equal(sx_export_hf(nullptr, dir.c_str(), nullptr), SX_ERR_INVALID_HANDLE);
    sx_shard_group_t *g = filled_group("misuse");
    assert_int_equal(sx_export_hf(g, nullptr, nullptr), SX_ERR_INVALID_ARGUMENT);
    assert_int_equal(sx_import_hf(g, "", nullptr, nullptr), SX_ERR_INVALID_ARGUMENT);
    struct {
        sx_hf_export_options_t o;
        uint64_t tail;
    } newer;
    std::memset(&newer, 0, sizeof newer);
    sx_hf_export_options_init(&newer.o, sizeof newer);
    newer.tail = 1;
    assert_int_equal(sx_export_hf(g, dir.c_str(), &newer.o), SX_ERR_INVALID_ARGUMENT);
    newer.tail = 0;
    newer.o.root = 1;
    assert_int_equal(sx_export_hf(g, dir.c_str(), &newer.o), SX_ERR_INVALID_ARGUMENT);
    newer.o.root = 0;
    newer.o.dtype = SX_DTYPE_U8;
    assert_int_equal(sx_export_hf(g, dir.c_str(), &newer.o), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "options->dtype"));
    bool exists = true;
    sx::io::posix_file_ops()->exists(dir, &exists);
    assert_false(exists);
    newer.o.dtype = SX_DTYPE_F16;
    assert_int_equal(sx_export_hf(g, dir.c_str(), &newer.o), SX_OK);  // the same struct, fixed, works
    sx_destroy_shard_group(g);
    sx::io::posix_file_ops()->remove_tree(dir);
}

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_holds_the_params_sharded),
        cmocka_unit_test(test_import_into_three_ranks_at_stage_3_and_back),
        cmocka_unit_test(test_import_into_two_processes_over_tcp),
        cmocka_unit_test(test_bad_input_is_named_and_changes_nothing),
        cmocka_unit_test(test_a_peft_adapter),
        cmocka_unit_test(test_a_failed_export_leaves_nothing),
        cmocka_unit_test(test_misuse_is_refused),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
