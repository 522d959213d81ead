// What test_sxckpt and test_sxckpt_import share: the checkpoint they work on (two ranks,
// threads over local://, save one with an AdamW group (amsgrad) and an SGD group
// (momentum), a scalar param, a frozen param without optimizer state, and names that
// need escaping: quote, backslash, control characters, non-ASCII), what the ranks knew
// of it, running the built tool and Python with their output captured, and reading
// what read_safetensors.py prints. It includes sx_cmocka.h after the headers CMocka's
// fail() macro would break, so a test includes its own headers before this one.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
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
#include "ckpt/shard_index.h"
#include "test_files.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"
#include "test_groups.h"

extern char **environ;

namespace sxckpt_test {

// The checkpoint format this library writes for fp32 state (every checkpoint these tests
// make), "MAJOR.MINOR".
inline std::string format_version() { return std::to_string(sx::ckpt::kFp32FormatMajor) + ".0"; }

struct PDef {
    const char *name;
    std::vector<int64_t> shape;
    int group;  // 0: AdamW with amsgrad, 1: SGD with momentum
    int unit;
    bool frozen;
};

// Unit 0 is split between the two ranks inside "embed.weight"; unit 1 mixes both
// optimizers; unit 2 is never trainable, so it has no optimizer state at all.
inline const std::vector<PDef> kParams = {
    {"embed.weight", {300, 17}, 0, 0, false},
    {"layer.\"q\"\\k", {33}, 0, 0, false},
    {"ctl\tname\x01\xc3\xa9", {4, 5}, 1, 1, false},
    {"scale", {}, 1, 1, false},
    {"head.bias", {5}, 0, 1, false},
    {"frozen.table", {7, 3}, 0, 2, true},
};
constexpr int kSteps = 3;
inline const char kBlob[] = "blob!";

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
inline Fixture *fx = nullptr;

inline float init_value(size_t p, uint64_t i) {
    return static_cast<float>((i * 37 + p * 11) % 101) / 100.0f - 0.5f;
}

inline float grad_value(int step, size_t p, uint64_t i) {
    uint64_t h = (static_cast<uint64_t>(step) * 1000003ull + p * 7919ull + i) * 2654435761ull;
    h ^= h >> 29;
    return static_cast<float>(static_cast<int64_t>(h % 65) - 32) / 64.0f;
}

inline std::string err_text(const char *what) { return std::string(what) + ": " + sx_last_error_message(); }

// Creates, registers and finalizes rank r's group.
inline std::string make_group(const std::string &rv, int r, int world, sx_shard_group_t **out) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
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
inline std::string save_rank(const std::string &rv, int r, int world, const std::string &path) {
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

// CMocka's group setup: the fixture checkpoint in a new temporary directory named after
// `tag`, saved by two ranks (threads), with what they know recorded in fx.
inline int fixture_setup(const char *tag) {
    fx = new Fixture;
    fx->dir = sxtest::make_tmpdir(tag);
    if (fx->dir.empty()) return -1;
    fx->ck = fx->dir + "/ck";
    const std::string rv = std::string("local://") + tag + "-" + std::to_string(getpid());
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

inline int fixture_teardown(void **) {
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
inline Run run(const std::vector<std::string> &args) {
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

inline Run sxckpt(const std::vector<std::string> &args) {
    std::vector<std::string> all = {SXCKPT_PATH};
    all.insert(all.end(), args.begin(), args.end());
    return run(all);
}

inline void expect_status(const Run &r, int status) {
    if (r.status != status)
        fail_msg("exit status %d, expected %d\nstdout:\n%s\nstderr:\n%s", r.status, status, r.out.c_str(),
                 r.err.c_str());
}

inline void expect_has(const std::string &text, const std::string &needle) {
    if (text.find(needle) == std::string::npos)
        fail_msg("expected to find [%s] in:\n%s", needle.c_str(), text.c_str());
}

inline bool have_python() {
    if (SX_PYTHON3[0] != '\0' && access(SX_PYTHON3, X_OK) == 0) return true;
    std::printf("NOTE: no python3 to run (configured as '%s'); skipping the independent Python checks "
                "(scripts/install-deps.sh installs python3)\n",
                SX_PYTHON3);
    return false;
}

// --- checkpoints ---

inline std::string copy_checkpoint(const std::string &name) {
    const std::string dst = fx->dir + "/" + name;
    const Run r = run({"/bin/cp", "-a", fx->ck, dst});
    if (r.status != 0) fail_msg("cp: %s", r.err.c_str());
    return dst;
}

inline sx::ckpt::Manifest manifest_of(const std::string &ck) {
    const std::string bytes = read_file(ck + "/MANIFEST");
    sx::ckpt::Manifest m;
    sx::Status s = sx::ckpt::decode_manifest(bytes.data(), bytes.size(), &m);
    // From format 2.0 the chunks are in the files' indexes.
    if (s.ok() && m.chunks_in_files()) s = sx::ckpt::read_all_file_indexes(*sx::io::posix_file_ops(), ck, &m);
    if (!s.ok()) fail_msg("%s", s.message().c_str());
    return m;
}

inline uint64_t file_size(const std::string &path) {
    struct stat st;
    assert_int_equal(stat(path.c_str(), &st), 0);
    return static_cast<uint64_t>(st.st_size);
}

inline bool exists(const std::string &path) { return access(path.c_str(), F_OK) == 0; }

// Reads `path` (from read_safetensors.py --values) into tensors and metadata.
inline void read_values(const std::string &path, std::map<std::string, Known> *tensors,
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

// One rank, one SGD param group with `momentum`, and 1-D params of `numel` elements each.
inline sx_shard_group_t *one_rank_sgd(const std::string &tag, const std::vector<const char *> &names,
                                      int64_t numel, double momentum) {
    sx_param_group_desc_t sgd;
    sx_param_group_desc_init(&sgd, sizeof sgd, SX_OPTIM_SGD);
    sgd.momentum = momentum;
    std::vector<sxtest::ParamDef> defs;
    for (const char *name : names) defs.push_back({name, {numel}});
    return sxtest::one_rank_group("sxckpt-" + tag, defs, &sgd);
}

// Saves h synchronously into ck, a new directory of `parent` (created here), then
// destroys h.
inline void save_and_destroy(sx_shard_group_t *h, const std::string &parent, const std::string &ck) {
    assert_int_equal(mkdir(parent.c_str(), 0755), 0);
    sxtest::save_sync(h, ck);
    sx_destroy_shard_group(h);
}

}  // namespace sxckpt_test
