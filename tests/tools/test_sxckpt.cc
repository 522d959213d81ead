// sxckpt against a real checkpoint (sxckpt_fixture.h: two ranks, threads over local://,
// save one with an AdamW group (amsgrad) and an SGD group (momentum), a scalar param, a
// frozen param without optimizer state, and names that need escaping). The built tool
// inspects it (text and JSON), verifies it (intact; flipped bytes in three chunks of two
// files; a truncated and a missing shard file; a damaged MANIFEST) and exports it; an
// independent reader (read_safetensors.py, Python's standard library only) parses the
// exports, and every tensor's values are compared with the ranks' own: params from the
// views (the default export: one tensor per param), optimizer state from each rank's
// shard (--optimizer), cross-checked against the state a world-size-1 group loads from
// the checkpoint. Also: names export must refuse, a tensor larger than one 4 MiB chunk,
// and export's and import's memory, which does not grow with the checkpoint.
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/directory.h"
#include "ckpt/manifest.h"
#include "ckpt/shard_plan.h"
#include "sx/sx.h"
// Last: it includes CMocka, which defines a fail() macro.
#include "sxckpt_fixture.h"

namespace {

using namespace sxckpt_test;

int setup(void **) { return fixture_setup("sxckpt"); }

// --- checkpoints ---

// The first chunk of `param`'s tensor `kind` stored in file `file`.
const sx::ckpt::Chunk &find_chunk(const sx::ckpt::Manifest &m, const char *param, sx::ckpt::TensorKind kind,
                                  uint32_t file) {
    for (const auto &p : m.params)
        if (p.name == param)
            for (const auto &t : p.tensors)
                if (t.kind == kind)
                    for (const auto &c : t.chunks)
                        if (c.file == file) return c;
    fail_msg("no chunk of %s in file %u", param, file);
    static sx::ckpt::Chunk none;
    return none;
}

void flip_byte(const std::string &path, uint64_t offset) {
    FILE *f = std::fopen(path.c_str(), "r+b");
    assert_non_null(f);
    assert_int_equal(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
    const int c = std::fgetc(f);
    assert_true(c != EOF);
    assert_int_equal(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
    std::fputc(c ^ 0x5A, f);
    std::fclose(f);
}

std::string at_byte(const std::string &file, uint64_t offset) {
    return file + " at byte " + std::to_string(offset) + " ";
}

// --- tests ---

// The world-size-1 group that loads the checkpoint holds, unit by unit, exactly what
// the two ranks recorded: the known values are the checkpoint's.
void test_reload_matches_known(void **) {
    sx_shard_group_t *h = nullptr;
    const std::string e = make_group("local://sxckpt-reload-" + std::to_string(getpid()), 0, 1, &h);
    if (!e.empty()) fail_msg("%s", e.c_str());
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = fx->ck.c_str();
    assert_int_equal(sx_load_optim_state(h, &lo), SX_OK);
    sx::core::ShardGroup &g = *h->impl;
    size_t compared = 0;
    for (int32_t p = 0; p < static_cast<int32_t>(kParams.size()); ++p) {
        const uint64_t numel = g.layout().numel(p);
        const Known &kp = fx->known.at(kParams[p].name);
        assert_memory_equal(g.param_data(p), kp.values.data(), numel * sizeof(float));
        ++compared;
        const auto kinds = sx::ckpt::stored_kinds(g.hyper(kParams[p].group));
        const auto v = g.unit_shard(g.layout().placement(p).unit_index);
        // With one rank the shard is the whole unit: the param sits at its offset.
        const uint64_t offset = g.layout().placement(p).offset;
        for (size_t k = 1; k < kinds.size() && static_cast<int>(k) <= v.state_slots; ++k) {
            const Known &ks = fx->known.at(std::string(kParams[p].name) + sx::ckpt::tensor_suffix(kinds[k]));
            assert_memory_equal(v.state[k - 1] + offset, ks.values.data(), numel * sizeof(float));
            ++compared;
        }
    }
    assert_int_equal(compared, fx->known.size());
    // 4 + 4 + 2 + 2 + 4 + 1: AdamW with amsgrad keeps 3 states, SGD 1, frozen none.
    assert_int_equal(fx->known.size(), 17);
    sx_destroy_shard_group(h);
}

void test_inspect_text(void **) {
    const Run r = sxckpt({"inspect", fx->ck});
    expect_status(r, 0);
    const std::string written_by = "format      " + format_version() + " (written by sx " + std::to_string(SX_VERSION_MAJOR) + "." +
                                   std::to_string(SX_VERSION_MINOR) + "." + std::to_string(SX_VERSION_PATCH) + ")";
    expect_has(r.out, written_by);
    for (const char *s : {"step        3",
                          "world size  2 (ZeRO stage 2, alignment 64 bytes)", "user blob   5 bytes",
                          "created     20",
                          "params (6, ", "param groups (2)", "AdamW", "amsgrad=true", "betas=(0.9, 0.999)",
                          "weight_decay=0.02", "SGD", "momentum=0.9", "dampening=0.1", "MANIFEST",
                          "shard-00000-of-00002.bin", "shard-00001-of-00002.bin", "total"})
        expect_has(r.out, s);
    // One row per param, control characters shown as \xNN; the stored tensors last.
    const std::vector<std::pair<std::string, std::string>> rows = {
        {"embed.weight", "[300, 17]"},
        {"layer.\"q\"\\k", "param exp_avg exp_avg_sq max_exp_avg_sq"},
        {"ctl\\x09name\\x01\xc3\xa9", "param momentum_buffer"},
        {"scale", "[]"},
        {"head.bias", "param exp_avg exp_avg_sq max_exp_avg_sq"},
        {"frozen.table", " no "},
    };
    for (const auto &row : rows) {
        const size_t at = r.out.find("  " + row.first + " ");
        if (at == std::string::npos) fail_msg("no row for %s in:\n%s", row.first.c_str(), r.out.c_str());
        const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
        expect_has(line, row.second);
    }
    // A flat group's checkpoint shows no mesh.
    assert_true(r.out.find("mesh ") == std::string::npos);
    const size_t frozen = r.out.find("  frozen.table ");
    const std::string frozen_row = r.out.substr(frozen, r.out.find('\n', frozen) - frozen);
    assert_true(frozen_row.size() > 6 && frozen_row.compare(frozen_row.size() - 6, 6, " param") == 0);
    assert_string_equal(r.err.c_str(), "");
}

void test_inspect_json(void **) {
    const std::string format_json = "\"format_version\":\"" + format_version() + "\"";
    const Run r = sxckpt({"inspect", "--json", fx->ck});
    expect_status(r, 0);
    assert_true(r.out.size() > 2 && r.out[0] == '{' && r.out.compare(r.out.size() - 2, 2, "}\n") == 0);
    for (const char *s : {"\"name\":\"layer.\\\"q\\\"\\\\k\"", "\"name\":\"ctl\\tname\\u0001\xc3\xa9\"",
                          format_json.c_str(), "\"step\":3,", "\"world_size\":2,", "\"shard_size\":2,",
                          "\"stage\":2,",
                          "\"user_blob_bytes\":5,", "\"amsgrad\":true", "\"shape\":[]", "\"shape\":[300,17]",
                          "\"momentum\":0.9,", "\"total_bytes\":"})
        expect_has(r.out, s);
    if (!have_python()) return;
    // Python's json module reads it back, names and all.
    const std::string file = fx->dir + "/inspect.json";
    FILE *f = std::fopen(file.c_str(), "wb");
    std::fwrite(r.out.data(), 1, r.out.size(), f);
    std::fclose(f);
    const Run py = run({SX_PYTHON3, "-c",
                        "import json, sys\n"
                        "d = json.load(open(sys.argv[1], encoding='utf-8'))\n"
                        "print(d['step'], d['world_size'], len(d['param_groups']))\n"
                        "for p in d['params']: print(p['name'].encode('utf-8').hex())\n",
                        file});
    expect_status(py, 0);
    std::string want = "3 2 2\n";
    for (const PDef &p : kParams) {
        for (const char *c = p.name; *c; ++c) {
            char hex[3];
            std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(*c));
            want += hex;
        }
        want += "\n";
    }
    assert_string_equal(py.out.c_str(), want.c_str());
}

// The golden checkpoint of a 2 x 2 mesh: the mesh in words and in JSON, its 2 files.
void test_inspect_a_mesh(void **) {
    const std::string ck = std::string(SX_GOLDEN_DIR) + "/v1.2/adamw-sgd-w4-mesh2x2";
    const Run r = sxckpt({"inspect", ck});
    expect_status(r, 0);
    expect_has(r.out, "world size  4 (ZeRO stage 2, alignment 64 bytes)");
    expect_has(r.out, "mesh        2 shards x 2 replicas");
    expect_has(r.out, "shard-00001-of-00002.bin");
    const Run j = sxckpt({"inspect", "--json", ck});
    expect_status(j, 0);
    expect_has(j.out, "\"world_size\":4,\"shard_size\":2,");
}

void test_verify_intact(void **) {
    const Run r = sxckpt({"verify", fx->ck});
    expect_status(r, 0);
    expect_has(r.out, "OK: MANIFEST, 2 files, ");
    assert_true(r.out.find("BROKEN") == std::string::npos);
}

// Three chunks damaged in two files: verify names each one, and goes on to the end.
void test_verify_names_every_broken_chunk(void **) {
    using sx::ckpt::TensorKind;
    const std::string ck = copy_checkpoint("flipped");
    const sx::ckpt::Manifest m = manifest_of(ck);
    const std::string f0 = "shard-00000-of-00002.bin", f1 = "shard-00001-of-00002.bin";
    const sx::ckpt::Chunk &a = find_chunk(m, "embed.weight", TensorKind::kExpAvgSq, 1);
    const sx::ckpt::Chunk &b = find_chunk(m, "scale", TensorKind::kMomentumBuffer, 1);
    const sx::ckpt::Chunk &c = find_chunk(m, kParams[2].name, TensorKind::kParam, 0);
    flip_byte(ck + "/" + f1, a.offset + 7);
    flip_byte(ck + "/" + f1, b.offset + 1);
    flip_byte(ck + "/" + f0, c.offset);
    const Run r = sxckpt({"verify", ck});
    expect_status(r, 1);
    expect_has(r.out, "BROKEN " + at_byte(f1, a.offset));
    expect_has(r.out, "param 'embed.weight' exp_avg_sq, elements [" + std::to_string(a.begin) + ", " +
                          std::to_string(a.end) + ")");
    expect_has(r.out, "BROKEN " + at_byte(f1, b.offset));
    expect_has(r.out, "param 'scale' momentum_buffer, elements [0, 1)");
    expect_has(r.out, "BROKEN " + at_byte(f0, c.offset));
    expect_has(r.out, "param 'ctl\\x09name\\x01\xc3\xa9' param, elements [0, 20)");
    expect_has(r.out, "CRC32C of its bytes is 0x");
    expect_has(r.out, "FAILED: 3 of ");
    expect_has(r.out, " chunks broken, 0 of 2 files broken");

    // inspect reads only the MANIFEST and still works; export refuses, leaving nothing.
    expect_status(sxckpt({"inspect", ck}), 0);
    const std::string out = fx->dir + "/flipped.safetensors";
    const Run e = sxckpt({"export", "--safetensors", out, ck});
    expect_status(e, 1);
    expect_has(e.err, at_byte(f0, c.offset));
    expect_has(e.err, "CRC32C");
    assert_false(exists(out));
    assert_false(exists(out + ".tmp"));
}

// Format 2.0: a file's chunk table is the index at its end, which the MANIFEST checksums.
// A flip there loses every chunk of that file (their places are unknown): verify says so
// and goes on with the other file; export refuses.
void test_verify_names_a_damaged_index(void **) {
    const std::string ck = copy_checkpoint("index");
    const sx::ckpt::Manifest m = manifest_of(ck);
    const std::string f0 = "shard-00000-of-00002.bin", f1 = "shard-00001-of-00002.bin";
    assert_true(m.chunks_in_files());
    const sx::ckpt::FileIndex index = m.file_indexes[1];
    assert_int_equal(file_size(ck + "/" + f1), index.offset + index.length);
    flip_byte(ck + "/" + f1, index.offset + index.length - 5);
    const Run r = sxckpt({"verify", ck});
    expect_status(r, 1);
    expect_has(r.out, "BROKEN " + f1 + ": ");
    expect_has(r.out, "its index fails its CRC32C check");
    expect_has(r.out, "(its " + std::to_string(index.chunks) + " chunks are lost)");
    expect_has(r.out, "FAILED: " + std::to_string(index.chunks) + " of ");
    expect_has(r.out, " chunks broken, 1 of 2 files broken");
    assert_true(r.out.find("BROKEN " + f0) == std::string::npos);
    const std::string out = fx->dir + "/index.safetensors";
    const Run e = sxckpt({"export", "--safetensors", out, ck});
    expect_status(e, 1);
    expect_has(e.err, "its index fails its CRC32C check");
    assert_false(exists(out));
}

// A shard file that is a FIFO (reading it would wait for a writer forever) or a link to a
// file elsewhere is reported at once, by kind; inspect says the same.
void test_verify_refuses_what_is_not_a_regular_file(void **) {
    const std::string ck = copy_checkpoint("kinds");
    const std::string f0 = "shard-00000-of-00002.bin", f1 = "shard-00001-of-00002.bin";
    const std::string outside = fx->dir + "/kinds-outside.bin";
    assert_int_equal(std::rename((ck + "/" + f1).c_str(), outside.c_str()), 0);
    assert_int_equal(::symlink(outside.c_str(), (ck + "/" + f1).c_str()), 0);
    assert_int_equal(std::rename((ck + "/" + f0).c_str(), (fx->dir + "/kinds-f0.bin").c_str()), 0);
    assert_int_equal(::mkfifo((ck + "/" + f0).c_str(), 0644), 0);
    const Run r = sxckpt({"verify", ck});
    expect_status(r, 1);
    expect_has(r.out, "BROKEN " + f0 + ": open for reading '" + ck + "/" + f0 + "': it is a FIFO");
    expect_has(r.out, "BROKEN " + f1 + ": open for reading '" + ck + "/" + f1 + "': it is a symbolic link");
    expect_has(r.out, "2 of 2 files broken");
    const Run i = sxckpt({"inspect", ck});
    expect_status(i, 0);
    expect_has(i.out, "it is a FIFO");
}

void test_verify_truncated_and_missing_files(void **) {
    const std::string ck = copy_checkpoint("truncated");
    const std::string f0 = "shard-00000-of-00002.bin", f1 = "shard-00001-of-00002.bin";
    const uint64_t size = file_size(ck + "/" + f1);
    const uint64_t half = size / 2;
    assert_int_equal(truncate((ck + "/" + f1).c_str(), static_cast<off_t>(half)), 0);
    Run r = sxckpt({"verify", ck});
    expect_status(r, 1);
    expect_has(r.out, "BROKEN " + f1 + ": " + std::to_string(half) + " bytes, but its chunks need " +
                          std::to_string(size) + " (truncated)");
    // Its index, at its end, is gone with the bytes: every one of its chunks is lost.
    expect_has(r.out, "the file ends before its index does (truncated) (its ");
    expect_has(r.out, "1 of 2 files broken");

    assert_int_equal(unlink((ck + "/" + f0).c_str()), 0);
    r = sxckpt({"verify", ck});
    expect_status(r, 1);
    expect_has(r.out, "BROKEN " + f0 + ": missing (its ");
    expect_has(r.out, "BROKEN " + f1 + ": ");
    expect_has(r.out, "2 of 2 files broken");
    const Run i = sxckpt({"inspect", ck});
    expect_status(i, 0);
    expect_has(i.out, f0 + "  missing");
}

void test_damaged_manifest(void **) {
    const std::string ck = copy_checkpoint("bad-manifest");
    flip_byte(ck + "/MANIFEST", file_size(ck + "/MANIFEST") / 2);
    const Run v = sxckpt({"verify", ck});
    expect_status(v, 1);
    expect_has(v.out, "BROKEN " + ck + "/MANIFEST: manifest checksum mismatch");
    expect_has(v.out, "FAILED");
    for (const std::vector<std::string> &args :
         {std::vector<std::string>{"inspect", ck},
          std::vector<std::string>{"export", "--safetensors", fx->dir + "/bad.safetensors", ck}}) {
        const Run r = sxckpt(args);
        expect_status(r, 1);
        expect_has(r.err, "sxckpt: " + ck + "/MANIFEST: manifest checksum mismatch");
    }
    assert_false(exists(fx->dir + "/bad.safetensors"));
}

void test_usage_and_bad_input(void **) {
    Run r = sxckpt({});
    expect_status(r, 2);
    expect_has(r.err, "usage: sxckpt inspect");
    expect_status(sxckpt({"frobnicate"}), 2);
    expect_has(sxckpt({"frobnicate"}).err, "unknown command 'frobnicate'");
    expect_status(sxckpt({"verify"}), 2);
    expect_status(sxckpt({"verify", fx->ck, fx->ck}), 2);
    expect_status(sxckpt({"inspect", "--bogus", fx->ck}), 2);
    expect_status(sxckpt({"export", fx->ck}), 2);
    expect_has(sxckpt({"export", fx->ck}).err, "--safetensors");
    expect_status(sxckpt({"export", fx->ck, "--safetensors"}), 2);
    expect_status(sxckpt({"export", "--safetensors", "o", fx->ck, "--optimizer"}), 2);
    r = sxckpt({"export", "--safetensors", "p.safetensors", "--optimizer", "p", fx->ck});
    expect_status(r, 2);
    expect_has(r.err, "must differ");
    r = sxckpt({"--help"});
    expect_status(r, 0);
    expect_has(r.out, "usage: sxckpt inspect");
    expect_status(sxckpt({"--version"}), 0);

    r = sxckpt({"inspect", "/nonexistent/sx-checkpoint"});
    expect_status(r, 1);
    expect_has(r.err, "sxckpt: /nonexistent/sx-checkpoint: No such file or directory");
    r = sxckpt({"verify", fx->ck + "/MANIFEST"});
    expect_status(r, 1);
    expect_has(r.err, "is not a directory");
    // An unfinished save's directory is refused by its name, even holding a whole
    // checkpoint (a save killed after writing its MANIFEST); so is `latest`.
    const std::string partial = fx->dir + "/copy" + sx::ckpt::kPartialSuffix;
    assert_int_equal(std::system(("cp -r '" + fx->ck + "' '" + partial + "'").c_str()), 0);
    for (const char *cmd : {"inspect", "verify"}) {
        r = sxckpt({cmd, partial});
        expect_status(r, 1);
        expect_has(r.err, "the suffix of a save that has not committed");
    }
    sxtest::remove_tree(partial);
    r = sxckpt({"inspect", fx->dir + "/latest"});
    expect_status(r, 1);
    expect_has(r.err, "the name sx keeps for the file naming the newest checkpoint");
    // The parent holds `latest`, which names the checkpoint: say where to look.
    r = sxckpt({"inspect", fx->dir});
    expect_status(r, 1);
    expect_has(r.err, "has no MANIFEST; its `latest` names 'ck': try " + fx->dir + "/ck");
}

// The names of fx->known that are params (no state suffix), or that are state.
std::vector<std::string> known_names(bool state) {
    std::vector<std::string> out;
    for (const auto &k : fx->known) {
        bool is_param = false;
        for (const PDef &p : kParams) is_param |= k.first == p.name;
        if (is_param != state) out.push_back(k.first);
    }
    return out;
}

// read_safetensors.py parses `file`, which must hold exactly the tensors `names` of
// fx->known, each with the ranks' shape and values; its metadata goes to *meta.
void expect_known_tensors(const std::string &file, const std::vector<std::string> &names,
                          std::map<std::string, std::string> *meta) {
    const std::string values = file + ".values.txt";
    const Run py = run({SX_PYTHON3, READ_SAFETENSORS_PY, file, "--values", values});
    expect_status(py, 0);
    expect_has(py.out, std::to_string(names.size()) + " tensors; metadata ");
    std::map<std::string, Known> got;
    read_values(values, &got, meta);
    assert_int_equal(got.size(), names.size());
    for (const std::string &name : names) {
        const Known &k = fx->known.at(name);
        const auto it = got.find(name);
        if (it == got.end()) fail_msg("%s has no tensor '%s'", file.c_str(), name.c_str());
        assert_true(it->second.shape == k.shape);
        assert_int_equal(it->second.values.size(), k.values.size());
        assert_memory_equal(it->second.values.data(), k.values.data(), k.values.size() * sizeof(float));
    }
}

// By default export writes the params alone: one tensor per param, named by the param,
// in its shape, holding the ranks' values.
void test_export_weights_only(void **) {
    const std::string out = fx->dir + "/model.safetensors";
    const Run r = sxckpt({"export", "--safetensors", out, fx->ck});
    expect_status(r, 0);
    expect_has(r.out, "wrote " + out + ": 6 params");
    assert_false(exists(out + ".tmp"));

    // The layout, checked here without any JSON parser.
    const std::string bytes = read_file(out);
    assert_true(bytes.size() >= 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
    assert_int_equal(n % 8, 0);
    uint64_t data = 0;
    for (const std::string &name : known_names(false)) data += fx->known.at(name).values.size() * sizeof(float);
    assert_int_equal(bytes.size(), 8 + n + data);
    const std::string header = bytes.substr(8, n);
    assert_int_equal(header[0], '{');
    const size_t last = header.find_last_not_of(' ');
    assert_int_equal(header[last], '}');
    assert_true(header.size() - (last + 1) < 8);  // padded with at most 7 spaces
    const std::string format_meta = "\"sx_format_version\":\"" + format_version() + "\"";
    for (const char *s : {"\"__metadata__\":{", "\"step\":\"3\"", format_meta.c_str(),
                          "\"layer.\\\"q\\\"\\\\k\":{\"dtype\":\"F32\",\"shape\":[33],",
                          "\"scale\":{\"dtype\":\"F32\",\"shape\":[],",
                          "\"embed.weight\":{\"dtype\":\"F32\",\"shape\":[300,17],"})
        expect_has(header, s);
    for (const char *state : {".exp_avg", ".momentum_buffer"}) assert_true(header.find(state) == std::string::npos);

    if (!have_python()) return;
    std::map<std::string, std::string> meta;
    expect_known_tensors(out, known_names(false), &meta);
    assert_int_equal(known_names(false).size(), kParams.size());
    assert_string_equal(meta["step"].c_str(), "3");
    assert_string_equal(meta["sx_format_version"].c_str(), format_version().c_str());

    // The reader is not a rubber stamp: a file whose offsets leave a gap fails it.
    std::string damaged = bytes;
    damaged.push_back('\0');
    const std::string bad = fx->dir + "/gap.safetensors";
    assert_true(sxtest::write_file(bad, damaged));
    const Run rejected = run({SX_PYTHON3, READ_SAFETENSORS_PY, bad});
    expect_status(rejected, 1);
    expect_has(rejected.err, "the tensors cover");
}

// With --optimizer, PREFIX.safetensors holds every state tensor the checkpoint has (in
// torch's names, the ranks' values) and PREFIX.json the param groups in torch's keys
// and every param's steps, read back here by Python's json module.
void test_export_optimizer(void **) {
    const std::string out = fx->dir + "/weights.safetensors", prefix = fx->dir + "/optim";
    const Run r = sxckpt({"export", "--safetensors", out, "--optimizer", prefix, fx->ck});
    expect_status(r, 0);
    expect_has(r.out, "wrote " + prefix + ".safetensors: 11 optimizer state tensors");
    expect_has(r.out, "wrote " + prefix + ".json: 2 param groups");
    for (const std::string &f : {out, prefix + ".safetensors", prefix + ".json"}) assert_false(exists(f + ".tmp"));
    const std::string json = read_file(prefix + ".json");
    for (const char *s : {"\"schema_version\":1,", "\"step\":3,",
                          "{\"optimizer\":\"AdamW\",\"lr\":0.01,\"weight_decay\":0.02,\"betas\":[0.9,0.999],"
                          "\"eps\":1e-08,\"maximize\":false,\"amsgrad\":true,\"params\":[\"embed.weight\","
                          "\"layer.\\\"q\\\"\\\\k\",\"head.bias\",\"frozen.table\"]}",
                          "{\"optimizer\":\"SGD\",\"lr\":0.05,\"weight_decay\":0.001,\"momentum\":0.9,"
                          "\"dampening\":0.1,\"nesterov\":false,\"maximize\":false,\"params\":[\"ctl\\tname\\u0001"
                          "\xc3\xa9\",\"scale\"]}",
                          "\"scale\":{\"step\":3,\"momentum_steps\":3,\"unit\":1,\"trainable\":true}",
                          "\"frozen.table\":{\"step\":0,\"unit\":2,\"trainable\":false}"})
        expect_has(json, s);
    if (!have_python()) return;
    std::map<std::string, std::string> meta;
    expect_known_tensors(prefix + ".safetensors", known_names(true), &meta);
    assert_int_equal(known_names(true).size(), 11);
    const Run py = run({SX_PYTHON3, "-c",
                        "import json, sys\n"
                        "d = json.load(open(sys.argv[1], encoding='utf-8'))\n"
                        "print(d['schema_version'], d['format_version'], d['step'])\n"
                        "for g in d['param_groups']: print(g['optimizer'], len(g['params']))\n"
                        "print(sorted((n, s['step']) for n, s in d['state'].items()))\n",
                        prefix + ".json"});
    expect_status(py, 0);
    expect_has(py.out, "1 " + format_version() + " 3\nAdamW 4\nSGD 2\n");
    expect_has(py.out, "('frozen.table', 0), ('head.bias', 3)");
}

// A one-rank checkpoint of the given params (one AdamW step), saved at dir/small/name.
std::string small_checkpoint(const std::string &name, const std::vector<const char *> &params) {
    std::vector<sxtest::ParamDef> defs;
    for (const char *p : params) defs.push_back({p, {4}});
    sx_shard_group_t *h = sxtest::one_rank_group("sxckpt-" + name, defs);
    assert_int_equal(sx_step(h, nullptr, nullptr), SX_OK);
    // Beside the others would move their parent's `latest`, which a test reads.
    const std::string parent = fx->dir + "/small";
    if (mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST)
        fail_msg("mkdir %s: %s", parent.c_str(), std::strerror(errno));
    const std::string path = parent + "/" + name;
    sxtest::save_sync(h, path);
    sx_destroy_shard_group(h);
    return path;
}

// A param named like the metadata key would give two entries one name: export refuses
// it rather than drop a tensor, and leaves nothing behind. A param named like another's
// state ("w" and "w.exp_avg") no longer collides: the state goes to a file of its own.
void test_export_names(void **) {
    const std::string meta = small_checkpoint("collide-meta", {"__metadata__"});
    expect_status(sxckpt({"verify", meta}), 0);
    const std::string out = meta + ".safetensors", prefix = meta + "-optim";
    const Run r = sxckpt({"export", "--safetensors", out, "--optimizer", prefix, meta});
    expect_status(r, 1);
    expect_has(r.err, "two tensors of " + out + " the name '__metadata__'");
    for (const std::string &f : {out, prefix + ".safetensors", prefix + ".json"}) {
        assert_false(exists(f));
        assert_false(exists(f + ".tmp"));
    }

    const std::string state = small_checkpoint("like-state", {"w", "w.exp_avg"});
    const Run ok = sxckpt({"export", "--safetensors", state + ".safetensors", "--optimizer", state + "-optim", state});
    expect_status(ok, 0);
    const std::string header = read_file(state + "-optim.safetensors");
    for (const char *name : {"\"w.exp_avg\":", "\"w.exp_avg.exp_avg\":", "\"w.exp_avg.exp_avg_sq\":"})
        expect_has(header, name);
}

// A tensor larger than one chunk (4 MiB): one rank, one param of 2^20 + 3 elements
// under SGD without momentum (no state), so its single file holds two chunks of it.
// verify reads both; export puts them back to back, value for value.
void test_tensor_of_two_chunks(void **) {
    sx_shard_group_t *h = one_rank_sgd("big", {"big"}, (int64_t{1} << 20) + 3, 0.0);
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    assert_int_equal(sx_param_view(h, 0, &v), SX_OK);
    float *data = static_cast<float *>(v.data);
    for (uint64_t i = 0; i < v.numel; ++i) data[i] = init_value(7, i) * static_cast<float>(i % 1000);
    const std::vector<float> values(data, data + v.numel);
    const std::string parent = fx->dir + "/big", ck = parent + "/ck";
    save_and_destroy(h, parent, ck);

    const sx::ckpt::Manifest m = manifest_of(ck);
    assert_int_equal(m.params[0].tensors.size(), 1);
    assert_int_equal(m.params[0].tensors[0].chunks.size(), 2);
    const Run r = sxckpt({"verify", ck});
    expect_status(r, 0);
    expect_has(r.out, "OK: MANIFEST, 1 files, 2 chunks, " + std::to_string(values.size() * 4) + " bytes");
    const std::string out = parent + "/big.safetensors";
    expect_status(sxckpt({"export", "--safetensors", out, ck}), 0);
    if (!have_python()) return;
    const std::string text = parent + "/values.txt";
    expect_status(run({SX_PYTHON3, READ_SAFETENSORS_PY, out, "--values", text}), 0);
    std::map<std::string, Known> got;
    std::map<std::string, std::string> meta;
    read_values(text, &got, &meta);
    assert_int_equal(got.size(), 1);
    assert_true(got["big"].shape == std::vector<int64_t>{(int64_t{1} << 20) + 3});
    assert_int_equal(got["big"].values.size(), values.size());
    assert_memory_equal(got["big"].values.data(), values.data(), values.size() * sizeof(float));
    assert_string_equal(meta["step"].c_str(), "0");
}

// export and import stream: their peak memory does not grow with the checkpoint.
// Exporting 128 MiB of tensors (two params of 8 Mi elements and their SGD momentum) and
// importing them again each take less than 32 MiB more than the small fixture does.
void test_memory_is_bounded(void **) {
    sx_shard_group_t *h = one_rank_sgd("mem", {"a", "b"}, int64_t{8} << 20, 0.9);
    for (int32_t p = 0; p < 2; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        assert_int_equal(sx_grad_view(h, p, &v), SX_OK);
        for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = init_value(p, i);
    }
    assert_int_equal(sx_step(h, nullptr, nullptr), SX_OK);
    const std::string parent = fx->dir + "/mem", ck = parent + "/ck";
    save_and_destroy(h, parent, ck);

    // The fixture and the big checkpoint, each exported with its state and imported
    // back: the peaks of the big ones against the small ones'.
    const auto export_import = [&](const std::string &tag, const std::string &from, Run *ex, Run *im) {
        const std::string w = parent + "/" + tag + ".safetensors", o = parent + "/" + tag + "-optim";
        *ex = sxckpt({"export", "--safetensors", w, "--optimizer", o, from});
        expect_status(*ex, 0);
        *im = sxckpt({"import", "--safetensors", w, "--optimizer", o, "--world-size", "2", parent + "/" + tag + "-ck"});
        expect_status(*im, 0);
        return std::vector<std::string>{w, o + ".safetensors"};
    };
    Run small_ex, small_im, big_ex, big_im;
    export_import("small", fx->ck, &small_ex, &small_im);
    const std::vector<std::string> outs = export_import("big", ck, &big_ex, &big_im);
    for (const std::string &out : outs) {
        struct stat st;
        assert_int_equal(stat(out.c_str(), &st), 0);
        assert_true(st.st_size > (int64_t{64} << 20));
    }
    for (const Run *r : {&small_ex, &small_im, &big_ex, &big_im}) assert_true(r->peak_kib > 0);
    std::printf("peak RSS: export %ld KiB for the fixture, %ld KiB for 128 MiB of tensors; import %ld KiB and "
                "%ld KiB\n",
                small_ex.peak_kib, big_ex.peak_kib, small_im.peak_kib, big_im.peak_kib);
    if (big_ex.peak_kib - small_ex.peak_kib > 32 * 1024)
        fail_msg("export's peak RSS grew by %ld KiB for 128 MiB of tensors", big_ex.peak_kib - small_ex.peak_kib);
    if (big_im.peak_kib - small_im.peak_kib > 32 * 1024)
        fail_msg("import's peak RSS grew by %ld KiB for 128 MiB of tensors", big_im.peak_kib - small_im.peak_kib);
    sxtest::remove_tree(parent);
}

// --- several checkpoints: the slices of a model-parallel trainer ---

// A logical tensor's value at flat index i.
float logical_value(int tensor, int64_t i) { return static_cast<float>(tensor * 100 + i) * 0.25f; }

// One param of a slice: its shape and placement, and the logical tensor it is part of.
struct SliceParam {
    const char *name;
    std::vector<int64_t> shape;
    int placement;
    std::vector<int64_t> global;  // SPLIT: the logical shape
    int split_dim;
    int64_t offset;
    int replica, replicas;
    int tensor;  // logical_value's tensor
};

// Saves a one-rank checkpoint of `params` at parent/ck, each param holding its piece of
// its logical tensor (logical_value), and returns ck's path.
std::string slice_checkpoint(const std::string &parent, const std::vector<SliceParam> &params) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    const std::string rv = "local://sxckpt-" + parent.substr(parent.rfind('/') + 1) + "-" + std::to_string(getpid());
    cfg.rendezvous = rv.c_str();
    cfg.world_size = 1;
    cfg.num_threads = 1;
    sx_shard_group_t *h = nullptr;
    assert_int_equal(sx_create_shard_group(&cfg, &h), SX_OK);
    sx_param_group_desc_t sgd;
    sx_param_group_desc_init(&sgd, sizeof sgd, SX_OPTIM_SGD);
    assert_int_equal(sx_add_param_group(h, &sgd, nullptr), SX_OK);
    for (const SliceParam &p : params) {
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = p.name;
        d.ndim = static_cast<int32_t>(p.shape.size());
        d.shape = p.shape.data();
        d.placement = p.placement;
        d.global_shape = p.global.empty() ? nullptr : p.global.data();
        d.split_dim = p.split_dim;
        d.split_offset = p.offset;
        d.replica = p.replica;
        d.replicas = p.replicas;
        assert_int_equal(sx_add_param(h, &d, nullptr), SX_OK);
    }
    assert_int_equal(sx_finalize(h), SX_OK);
    for (int32_t i = 0; i < static_cast<int32_t>(params.size()); ++i) {
        const SliceParam &p = params[static_cast<size_t>(i)];
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        assert_int_equal(sx_param_view(h, i, &v), SX_OK);
        // Element e of the piece is element base + (e / run) * stride + e % run of the
        // logical tensor (row-major).
        int64_t inner = 1, run = static_cast<int64_t>(v.numel), stride = 0, base = 0;
        if (p.placement == SX_PLACEMENT_SPLIT) {
            for (size_t k = static_cast<size_t>(p.split_dim) + 1; k < p.shape.size(); ++k) inner *= p.shape[k];
            run = p.shape[static_cast<size_t>(p.split_dim)] * inner;
            stride = p.global[static_cast<size_t>(p.split_dim)] * inner;
            base = p.offset * inner;
        }
        for (int64_t e = 0; e < static_cast<int64_t>(v.numel); ++e)
            static_cast<float *>(v.data)[e] = logical_value(p.tensor, base + (e / run) * stride + e % run);
    }
    const std::string ck = parent + "/ck";
    save_and_destroy(h, parent, ck);
    return ck;
}

// A TP = 2 trainer's two slices: a column-parallel weight split on dimension 0 (pieces
// of 2 and 4 rows), a row-parallel one on dimension 1, a replicated norm and a whole
// param in each slice of its own. export of both writes each logical tensor whole,
// value for value; of checkpoints whose pieces leave a gap, of a slice twice (overlap),
// or with two whole params of one name, it refuses, naming what is wrong, and writes
// nothing; with --optimizer it joins their (empty) state too. (One checkpoint alone
// exports its pieces as they are.)
void test_export_joins_the_slices(void **) {
    const std::vector<int64_t> col{6, 3}, row{2, 6};
    const std::string a = slice_checkpoint(fx->dir + "/slice-a", {
        {"col", {2, 3}, SX_PLACEMENT_SPLIT, col, 0, 0, 0, 0, 0},
        {"row", {2, 4}, SX_PLACEMENT_SPLIT, row, 1, 0, 0, 0, 1},
        {"norm", {3}, SX_PLACEMENT_REPLICATED, {}, 0, 0, 0, 2, 2},
        {"embed", {5}, SX_PLACEMENT_WHOLE, {}, 0, 0, 0, 0, 3},
    });
    const std::string b = slice_checkpoint(fx->dir + "/slice-b", {
        {"row", {2, 2}, SX_PLACEMENT_SPLIT, row, 1, 4, 0, 0, 1},
        {"norm", {3}, SX_PLACEMENT_REPLICATED, {}, 0, 0, 1, 2, 2},
        {"col", {4, 3}, SX_PLACEMENT_SPLIT, col, 0, 2, 0, 0, 0},
        {"head", {2, 2}, SX_PLACEMENT_WHOLE, {}, 0, 0, 0, 0, 4},
    });
    const std::string out = fx->dir + "/joined.safetensors";
    const Run r = sxckpt({"export", "--safetensors", out, a, b});
    expect_status(r, 0);
    expect_has(r.out, "wrote " + out + ": 5 params");
    const std::string header = read_file(out);
    for (const char *s : {"\"col\":{\"dtype\":\"F32\",\"shape\":[6,3],", "\"row\":{\"dtype\":\"F32\",\"shape\":[2,6],",
                          "\"norm\":{\"dtype\":\"F32\",\"shape\":[3],", "\"head\":{\"dtype\":\"F32\",\"shape\":[2,2],",
                          "\"checkpoints\":\"2\""})
        expect_has(header, s);
    if (have_python()) {
        const std::string text = fx->dir + "/joined.values.txt";
        expect_status(run({SX_PYTHON3, READ_SAFETENSORS_PY, out, "--values", text}), 0);
        std::map<std::string, Known> got;
        std::map<std::string, std::string> meta;
        read_values(text, &got, &meta);
        const std::map<std::string, std::pair<int, std::vector<int64_t>>> want = {
            {"col", {0, col}}, {"row", {1, row}}, {"norm", {2, {3}}}, {"embed", {3, {5}}}, {"head", {4, {2, 2}}}};
        assert_int_equal(got.size(), want.size());
        for (const auto &[name, w] : want) {
            const Known &k = got.at(name);
            assert_true(k.shape == w.second);
            for (size_t i = 0; i < k.values.size(); ++i)
                if (k.values[i] != logical_value(w.first, static_cast<int64_t>(i)))
                    fail_msg("%s[%zu] = %g, want %g", name.c_str(), i, k.values[i],
                             logical_value(w.first, static_cast<int64_t>(i)));
        }
    }
    const std::string c = slice_checkpoint(fx->dir + "/slice-c", {{"embed", {5}, SX_PLACEMENT_WHOLE, {}, 0, 0, 0, 0, 3}});
    const std::string bad = fx->dir + "/bad.safetensors";
    const std::vector<std::pair<std::vector<std::string>, std::string>> refusals = {
        {{a, c}, "param 'col': [2, 6) of dimension 0 (of 6) is in none of the checkpoints"},
        {{a, b, a}, "param 'col': the pieces in the checkpoints overlap at 0 of dimension 0 (" + a + " holds [0, 2))"},
        {{a, b, c}, "param 'embed' is whole in both " + a + " and " + c},
    };
    for (const auto &[dirs, words] : refusals) {
        std::vector<std::string> args = {"export", "--safetensors", bad};
        args.insert(args.end(), dirs.begin(), dirs.end());
        const Run refused = sxckpt(args);
        expect_status(refused, 1);
        expect_has(refused.err, words);
        assert_false(exists(bad));
        assert_false(exists(bad + ".tmp"));
    }
    // Their optimizer state joins too (test_sxckpt_join): SGD without momentum keeps none.
    const Run optim = sxckpt({"export", "--safetensors", bad, "--optimizer", fx->dir + "/o", a, b});
    expect_status(optim, 0);
    expect_has(optim.out, "wrote " + fx->dir + "/o.safetensors: 0 optimizer state tensors");
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reload_matches_known),
        cmocka_unit_test(test_inspect_text),
        cmocka_unit_test(test_inspect_json),
        cmocka_unit_test(test_inspect_a_mesh),
        cmocka_unit_test(test_verify_intact),
        cmocka_unit_test(test_verify_names_every_broken_chunk),
        cmocka_unit_test(test_verify_truncated_and_missing_files),
        cmocka_unit_test(test_verify_names_a_damaged_index),
        cmocka_unit_test(test_verify_refuses_what_is_not_a_regular_file),
        cmocka_unit_test(test_damaged_manifest),
        cmocka_unit_test(test_usage_and_bad_input),
        cmocka_unit_test(test_export_weights_only),
        cmocka_unit_test(test_export_optimizer),
        cmocka_unit_test(test_memory_is_bounded),
        cmocka_unit_test(test_export_names),
        cmocka_unit_test(test_tensor_of_two_chunks),
        cmocka_unit_test(test_export_joins_the_slices),
    };
    return cmocka_run_group_tests(tests, setup, fixture_teardown);
}
