// sxckpt against a real checkpoint: two ranks (threads over local://) save one with an
// AdamW group (amsgrad) and an SGD group (momentum), a scalar param, a frozen param
// without optimizer state, and names that need escaping (quote, backslash, control
// characters, non-ASCII). The built tool then inspects it (text and JSON), verifies it
// (intact; flipped bytes in three chunks of two files; a truncated and a missing shard
// file; a damaged MANIFEST) and exports it; an independent reader
// (read_safetensors.py, Python's standard library only) parses the export, and every
// tensor's values are compared with the ranks' own: params from the views, optimizer
// state from each rank's shard, cross-checked against the state a world-size-1 group
// loads from the checkpoint. Also: names export must refuse, and a tensor larger than
// one 4 MiB chunk.
#include <fcntl.h>
#include <spawn.h>
#include <climits>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/handles.h"
#include "ckpt/manifest.h"
#include "ckpt/shard_plan.h"
#include "sx/sx.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"
#include "test_groups.h"
#include "test_files.h"

extern char **environ;

namespace {

// The checkpoint format this library writes, "MAJOR.MINOR".
std::string format_version() {
    return std::to_string(sx::ckpt::kFormatMajor) + "." + std::to_string(sx::ckpt::kFormatMinor);
}

struct PDef {
    const char *name;
    std::vector<int64_t> shape;
    int group;  // 0: AdamW with amsgrad, 1: SGD with momentum
    int unit;
    bool frozen;
};

// Unit 0 is split between the two ranks inside "embed.weight"; unit 1 mixes both
// optimizers; unit 2 is never trainable, so it has no optimizer state at all.
const std::vector<PDef> kParams = {
    {"embed.weight", {300, 17}, 0, 0, false},
    {"layer.\"q\"\\k", {33}, 0, 0, false},
    {"ctl\tname\x01\xc3\xa9", {4, 5}, 1, 1, false},
    {"scale", {}, 1, 1, false},
    {"head.bias", {5}, 0, 1, false},
    {"frozen.table", {7, 3}, 0, 2, true},
};
constexpr int kSteps = 3;
const char kBlob[] = "blob!";

// One exported tensor as the ranks know it.
struct Known {
    std::vector<int64_t> shape;
    std::vector<float> values;
};

struct Fixture {
    std::string dir, ck;
    std::map<std::string, Known> known;  // by exported name: NAME, NAME.exp_avg, ...
    std::mutex mu;
};
Fixture *fx = nullptr;

float init_value(size_t p, uint64_t i) { return static_cast<float>((i * 37 + p * 11) % 101) / 100.0f - 0.5f; }

float grad_value(int step, size_t p, uint64_t i) {
    uint64_t h = (static_cast<uint64_t>(step) * 1000003ull + p * 7919ull + i) * 2654435761ull;
    h ^= h >> 29;
    return static_cast<float>(static_cast<int64_t>(h % 65) - 32) / 64.0f;
}

std::string err_text(const char *what) { return std::string(what) + ": " + sx_last_error_message(); }

// Creates, registers and finalizes rank r's group.
std::string make_group(const std::string &rv, int r, int world, sx_shard_group_t **out) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.rendezvous = rv.c_str();
    cfg.rank = r;
    cfg.world_size = world;
    cfg.num_threads = 1;
    cfg.timeout_ms = 30000;
    if (sx_create_shard_group(&cfg, out) != SX_OK) return err_text("create");
    sx_param_group_desc_t a, b;
    sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_ADAMW);
    a.lr = 0.01, a.amsgrad = 1, a.weight_decay = 0.02;
    sx_param_group_desc_init(&b, sizeof b, SX_OPTIM_SGD);
    b.lr = 0.05, b.momentum = 0.9, b.dampening = 0.1, b.weight_decay = 0.001;
    if (sx_add_param_group(*out, &a, nullptr) != SX_OK || sx_add_param_group(*out, &b, nullptr) != SX_OK)
        return err_text("add_param_group");
    for (const PDef &p : kParams) {
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = p.name;
        d.ndim = static_cast<int32_t>(p.shape.size());
        d.shape = p.shape.data();
        d.param_group = p.group;
        d.unit = p.unit;
        d.frozen = p.frozen;
        if (sx_add_param(*out, &d, nullptr) != SX_OK) return err_text("add_param");
    }
    if (sx_finalize(*out) != SX_OK) return err_text("finalize");
    return "";
}

// Rank r of `world`: trains kSteps steps, saves to `path`, and records what it knows
// into fx->known (rank 0 the params, every rank its shard of each optimizer state).
std::string save_rank(const std::string &rv, int r, int world, const std::string &path) {
    sx_shard_group_t *h = nullptr;
    std::string e = make_group(rv, r, world, &h);
    if (!e.empty()) return e;
    for (size_t p = 0; p < kParams.size(); ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        sx_param_view(h, static_cast<int32_t>(p), &v);
        for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = init_value(p, i);
    }
    for (int s = 1; s <= kSteps && e.empty(); ++s) {
        for (size_t p = 0; p < kParams.size(); ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            sx_grad_view(h, static_cast<int32_t>(p), &v);
            for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] += grad_value(s, p, i);
        }
        if (sx_step(h, nullptr, nullptr) != SX_OK) e = err_text("step");
    }
    if (e.empty()) {
        sx_save_options_t so;
        sx_save_options_init(&so, sizeof so);
        so.path = path.c_str();
        so.user_blob = kBlob;
        so.user_blob_size = std::strlen(kBlob);
        so.synchronous = 1;
        sx_future_t *f = nullptr;
        if (sx_save_optim_state(h, &so, &f) != SX_OK || sx_future_wait(f, -1) != SX_OK) e = err_text("save");
        sx_future_destroy(f);
    }
    if (e.empty()) {
        sx::core::ShardGroup &g = *h->impl;
        std::lock_guard<std::mutex> lock(fx->mu);
        for (int32_t p = 0; p < static_cast<int32_t>(kParams.size()); ++p) {
            const uint64_t numel = g.layout().numel(p);
            if (r == 0) {
                const float *d = static_cast<const float *>(g.param_data(p));
                fx->known[kParams[p].name] = {kParams[p].shape, std::vector<float>(d, d + numel)};
            }
            const auto kinds = sx::ckpt::stored_kinds(g.hyper(kParams[p].group));
            const auto v = g.unit_shard(g.layout().placement(p).unit_index);
            const sx::core::ShardPiece piece = g.layout().piece(p, r);
            for (size_t k = 1; k < kinds.size() && static_cast<int>(k) <= v.state_slots; ++k) {
                Known &kn = fx->known[std::string(kParams[p].name) + sx::ckpt::tensor_suffix(kinds[k])];
                kn.shape = kParams[p].shape;
                kn.values.resize(numel);
                for (uint64_t j = 0; j < piece.end - piece.begin; ++j)
                    kn.values[piece.begin + j] = v.state[k - 1][piece.shard_offset + j];
            }
        }
    }
    sx_destroy_shard_group(h);
    return e;
}

int setup(void **) {
    fx = new Fixture;
    fx->dir = sxtest::make_tmpdir("sxckpt");
    if (fx->dir.empty()) return -1;
    fx->ck = fx->dir + "/ck";
    const std::string rv = "local://sxckpt-" + std::to_string(getpid());
    std::vector<std::string> errs(2);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r) ts.emplace_back([&, r] { errs[r] = save_rank(rv, r, 2, fx->ck); });
    for (auto &t : ts) t.join();
    for (int r = 0; r < 2; ++r)
        if (!errs[r].empty()) {
            std::fprintf(stderr, "rank %d: %s\n", r, errs[r].c_str());
            return -1;
        }
    return 0;
}

int teardown(void **) {
    if (std::getenv("SX_TEST_KEEP_TMP")) {  // to look at what the tool saw
        std::printf("kept %s\n", fx->dir.c_str());
        delete fx;
        return 0;
    }
    sxtest::remove_tree(fx->dir);
    delete fx;
    return 0;
}

// --- running programs ---

using sxtest::read_file;

struct Run {
    int status = -1;  // exit status; 128 + signal if killed
    std::string out, err;
    long peak_kib = 0;  // the program's peak resident memory (VmHWM), sampled while it ran
};

// Runs argv[0] (a path) with stdout and stderr captured.
Run run(const std::vector<std::string> &args) {
    const std::string out = fx->dir + "/stdout.txt", err = fx->dir + "/stderr.txt";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char *> argv;
    for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    Run r;
    pid_t pid;
    const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        r.err = "posix_spawn " + args[0] + ": " + std::strerror(rc);
        return r;
    }
    // Peak memory: the program's own VmHWM, read every millisecond until it exits, once
    // /proc says it runs argv[0] (before its exec, the child shares this process's memory,
    // which getrusage would count too).
    int ws = 0;
    char exe_want[PATH_MAX];
    const bool have_exe = realpath(argv[0], exe_want) != nullptr;
    const std::string proc = "/proc/" + std::to_string(pid);
    for (;;) {
        const pid_t w = waitpid(pid, &ws, WNOHANG);
        if (w == pid || (w < 0 && errno != EINTR)) break;
        char exe[PATH_MAX];
        const ssize_t n = readlink((proc + "/exe").c_str(), exe, sizeof exe - 1);
        if (have_exe && n > 0 && std::string(exe, static_cast<size_t>(n)) == exe_want) {
            const std::string status = read_file(proc + "/status");
            const size_t at = status.find("VmHWM:");
            if (at != std::string::npos) r.peak_kib = std::max(r.peak_kib, std::atol(status.c_str() + at + 6));
        }
        usleep(1000);
    }
    r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    r.out = read_file(out);
    r.err = read_file(err);
    return r;
}

Run sxckpt(const std::vector<std::string> &args) {
    std::vector<std::string> all = {SXCKPT_PATH};
    all.insert(all.end(), args.begin(), args.end());
    return run(all);
}

void expect_status(const Run &r, int status) {
    if (r.status != status)
        fail_msg("exit status %d, expected %d\nstdout:\n%s\nstderr:\n%s", r.status, status, r.out.c_str(),
                 r.err.c_str());
}

void expect_has(const std::string &text, const std::string &needle) {
    if (text.find(needle) == std::string::npos)
        fail_msg("expected to find [%s] in:\n%s", needle.c_str(), text.c_str());
}

bool have_python() {
    if (SX_PYTHON3[0] != '\0' && access(SX_PYTHON3, X_OK) == 0) return true;
    std::printf("NOTE: no python3 to run (configured as '%s'); skipping the independent Python checks "
                "(scripts/install-deps.sh installs python3)\n",
                SX_PYTHON3);
    return false;
}

// --- checkpoints ---

std::string copy_checkpoint(const std::string &name) {
    const std::string dst = fx->dir + "/" + name;
    const Run r = run({"/bin/cp", "-a", fx->ck, dst});
    if (r.status != 0) fail_msg("cp: %s", r.err.c_str());
    return dst;
}

sx::ckpt::Manifest manifest_of(const std::string &ck) {
    const std::string bytes = read_file(ck + "/MANIFEST");
    sx::ckpt::Manifest m;
    const sx::Status s = sx::ckpt::decode_manifest(bytes.data(), bytes.size(), &m);
    if (!s.ok()) fail_msg("%s", s.message().c_str());
    return m;
}

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

uint64_t file_size(const std::string &path) {
    struct stat st;
    assert_int_equal(stat(path.c_str(), &st), 0);
    return static_cast<uint64_t>(st.st_size);
}

bool exists(const std::string &path) { return access(path.c_str(), F_OK) == 0; }

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
                          format_json.c_str(), "\"step\":3,", "\"world_size\":2,", "\"stage\":2,",
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
    expect_has(r.out, "the file ends before the chunk does (truncated)");
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
    // The parent holds `latest`, which names the checkpoint: say where to look.
    r = sxckpt({"inspect", fx->dir});
    expect_status(r, 1);
    expect_has(r.err, "has no MANIFEST; its `latest` names 'ck': try " + fx->dir + "/ck");
}

// Reads `path` (from read_safetensors.py --values) into tensors and metadata.
void read_values(const std::string &path, std::map<std::string, Known> *tensors,
                 std::map<std::string, std::string> *meta) {
    const auto unhex = [](const std::string &h) {
        std::string s;
        for (size_t i = 0; i + 1 < h.size(); i += 2)
            s.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
        return s;
    };
    const std::string text = read_file(path);
    size_t pos = 0;
    while (pos < text.size()) {
        const size_t nl = text.find('\n', pos);
        const std::string line = text.substr(pos, nl - pos);
        pos = nl == std::string::npos ? text.size() : nl + 1;
        std::vector<std::string> f;
        for (size_t b = 0;;) {
            const size_t sp = line.find(' ', b);
            f.push_back(line.substr(b, sp - b));
            if (sp == std::string::npos) break;
            b = sp + 1;
        }
        if (f[0] == "meta") {
            assert_int_equal(f.size(), 3);
            (*meta)[unhex(f[1])] = unhex(f[2]);
            continue;
        }
        assert_string_equal(f[0].c_str(), "tensor");
        assert_true(f.size() >= 5);
        assert_string_equal(f[2].c_str(), "F32");
        Known k;
        if (f[3] != "-")
            for (size_t b = 0;;) {
                const size_t comma = f[3].find(',', b);
                k.shape.push_back(std::stoll(f[3].substr(b, comma - b)));
                if (comma == std::string::npos) break;
                b = comma + 1;
            }
        // Python's repr of a float read back by strtod is the exact double, and the
        // double is the exact float the file held.
        for (size_t i = 4; i < f.size(); ++i)
            k.values.push_back(static_cast<float>(std::strtod(f[i].c_str(), nullptr)));
        const std::string name = unhex(f[1]);
        assert_true(tensors->count(name) == 0);
        (*tensors)[name] = std::move(k);
    }
}

void test_export_safetensors(void **) {
    const std::string out = fx->dir + "/model.safetensors";
    const Run r = sxckpt({"export", "--safetensors", out, fx->ck});
    expect_status(r, 0);
    expect_has(r.out, "wrote " + out + ": 17 tensors of 6 params");
    assert_false(exists(out + ".tmp"));

    // The layout, checked here without any JSON parser.
    const std::string bytes = read_file(out);
    assert_true(bytes.size() >= 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
    assert_int_equal(n % 8, 0);
    uint64_t data = 0;
    for (const auto &k : fx->known) data += k.second.values.size() * sizeof(float);
    assert_int_equal(bytes.size(), 8 + n + data);
    const std::string header = bytes.substr(8, n);
    assert_int_equal(header[0], '{');
    const size_t last = header.find_last_not_of(' ');
    assert_int_equal(header[last], '}');
    assert_true(last + 8 > header.size());
    const std::string format_meta = "\"sx_format_version\":\"" + format_version() + "\"";
    for (const char *s : {"\"__metadata__\":{", "\"step\":\"3\"", format_meta.c_str(),
                          "\"layer.\\\"q\\\"\\\\k\":{\"dtype\":\"F32\",\"shape\":[33],",
                          "\"ctl\\tname\\u0001\xc3\xa9.momentum_buffer\":{",
                          "\"scale\":{\"dtype\":\"F32\",\"shape\":[],",
                          "\"embed.weight.max_exp_avg_sq\":{\"dtype\":\"F32\",\"shape\":[300,17],"})
        expect_has(header, s);
    assert_true(header.find("frozen.table.exp_avg") == std::string::npos);

    if (!have_python()) return;
    const std::string values = fx->dir + "/values.txt";
    const Run py = run({SX_PYTHON3, READ_SAFETENSORS_PY, out, "--values", values});
    expect_status(py, 0);
    expect_has(py.out, "17 tensors; metadata ");
    std::map<std::string, Known> got;
    std::map<std::string, std::string> meta;
    read_values(values, &got, &meta);
    assert_string_equal(meta["step"].c_str(), "3");
    assert_string_equal(meta["sx_format_version"].c_str(), format_version().c_str());
    assert_int_equal(got.size(), fx->known.size());
    for (const auto &k : fx->known) {
        const auto it = got.find(k.first);
        if (it == got.end()) fail_msg("the export has no tensor '%s'", k.first.c_str());
        assert_true(it->second.shape == k.second.shape);
        assert_int_equal(it->second.values.size(), k.second.values.size());
        assert_memory_equal(it->second.values.data(), k.second.values.data(),
                            k.second.values.size() * sizeof(float));
    }

    // The reader is not a rubber stamp: a file whose offsets leave a gap fails it.
    std::string damaged = bytes;
    damaged.push_back('\0');
    const std::string bad = fx->dir + "/gap.safetensors";
    FILE *f = std::fopen(bad.c_str(), "wb");
    std::fwrite(damaged.data(), 1, damaged.size(), f);
    std::fclose(f);
    const Run rejected = run({SX_PYTHON3, READ_SAFETENSORS_PY, bad});
    expect_status(rejected, 1);
    expect_has(rejected.err, "the tensors cover");
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

// Names that safetensors cannot hold apart: a param named like another's state, or
// like the metadata key. Export refuses them rather than drop a tensor.
void test_export_refuses_colliding_names(void **) {
    struct Case {
        const char *dir;
        std::vector<const char *> params;
        const char *message;
    };
    const std::vector<Case> cases = {
        {"collide-state", {"w", "w.exp_avg"}, "two tensors the name 'w.exp_avg'"},
        {"collide-meta", {"__metadata__"}, "two tensors the name '__metadata__'"},
    };
    for (const Case &c : cases) {
        const std::string ck = small_checkpoint(c.dir, c.params);
        expect_status(sxckpt({"verify", ck}), 0);
        const std::string out = ck + ".safetensors";
        const Run r = sxckpt({"export", "--safetensors", out, ck});
        expect_status(r, 1);
        expect_has(r.err, c.message);
        assert_false(exists(out));
        assert_false(exists(out + ".tmp"));
    }
}

// One rank, one SGD param group with `momentum`, and 1-D params of `numel` elements each.
sx_shard_group_t *one_rank_sgd(const std::string &tag, const std::vector<const char *> &names, int64_t numel,
                               double momentum) {
    sx_param_group_desc_t sgd;
    sx_param_group_desc_init(&sgd, sizeof sgd, SX_OPTIM_SGD);
    sgd.momentum = momentum;
    std::vector<sxtest::ParamDef> defs;
    for (const char *name : names) defs.push_back({name, {numel}});
    return sxtest::one_rank_group("sxckpt-" + tag, defs, &sgd);
}

// Saves h synchronously into ck, a new directory of `parent` (created here), then
// destroys h.
void save_and_destroy(sx_shard_group_t *h, const std::string &parent, const std::string &ck) {
    assert_int_equal(mkdir(parent.c_str(), 0755), 0);
    sxtest::save_sync(h, ck);
    sx_destroy_shard_group(h);
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

// export streams: its peak memory does not grow with the checkpoint. Exporting 128 MiB
// of tensors (two params of 8 Mi elements and their SGD momentum) takes less than 32 MiB
// more than exporting the small fixture checkpoint.
void test_export_memory_is_bounded(void **) {
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

    const Run small = sxckpt({"export", "--safetensors", parent + "/small.safetensors", fx->ck});
    expect_status(small, 0);
    const std::string out = parent + "/big.safetensors";
    const Run big = sxckpt({"export", "--safetensors", out, ck});
    expect_status(big, 0);
    struct stat st;
    assert_int_equal(stat(out.c_str(), &st), 0);
    assert_true(st.st_size > (int64_t{128} << 20));
    assert_true(small.peak_kib > 0);
    assert_true(big.peak_kib > 0);
    const long growth_kib = big.peak_kib - small.peak_kib;
    std::printf("export peak RSS: %ld KiB for the fixture, %ld KiB for 128 MiB of tensors\n", small.peak_kib,
                big.peak_kib);
    if (growth_kib > 32 * 1024) fail_msg("export's peak RSS grew by %ld KiB for 128 MiB of tensors", growth_kib);
    std::remove(out.c_str());
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reload_matches_known),
        cmocka_unit_test(test_inspect_text),
        cmocka_unit_test(test_inspect_json),
        cmocka_unit_test(test_verify_intact),
        cmocka_unit_test(test_verify_names_every_broken_chunk),
        cmocka_unit_test(test_verify_truncated_and_missing_files),
        cmocka_unit_test(test_damaged_manifest),
        cmocka_unit_test(test_usage_and_bad_input),
        cmocka_unit_test(test_export_safetensors),
        cmocka_unit_test(test_export_memory_is_bounded),
        cmocka_unit_test(test_export_refuses_colliding_names),
        cmocka_unit_test(test_tensor_of_two_chunks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
