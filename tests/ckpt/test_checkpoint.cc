// Checkpoints through real ranks: a save at world size W1 loads at W2 for every pair in
// {1, 2, 3, 4, 8} with the state bit-identical, and training continued after the load
// follows the run that never stopped. Also: params only, mismatches, a save refused
// over an existing directory, `latest` and retention.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "api/handles.h"
#include "ckpt/checkpointer.h"
#include "ckpt/chunk_reader.h"
#include "ckpt/directory.h"
#include "io/crc32c.h"
#include "io/fault_file_ops.h"
#include "process_ranks.h"
#include "sx/sx.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"
#include "test_files.h"
#include "test_groups.h"

namespace {

struct PDef {
    const char *name;
    std::vector<int64_t> shape;
    int group;
};

// Two param groups (AdamW with amsgrad, SGD with momentum) over params of awkward sizes.
const std::vector<PDef> kParams = {
    {"embed", {37, 5}, 0}, {"scalar", {}, 1}, {"w1", {300}, 0}, {"b1", {7}, 1}, {"w2", {11, 13}, 0},
};

uint64_t numel(const PDef &p) {
    uint64_t n = 1;
    for (int64_t d : p.shape) n *= static_cast<uint64_t>(d);
    return n;
}

// The gradient every rank adds: the same on every rank, so the rank-averaged gradient
// (and hence the trajectory) does not depend on the world size.
float grad_value(int step, size_t p, uint64_t i) {
    uint64_t h = (static_cast<uint64_t>(step) * 1000003ull + p * 7919ull + i) * 2654435761ull;
    h ^= h >> 29;
    return static_cast<float>(static_cast<int64_t>(h % 65) - 32) / 64.0f;
}

// Everything one rank holds, assembled over ranks into full tensors: values and each
// optimizer state, per param, in the param's own index space.
struct FullState {
    std::vector<std::vector<float>> tensors[4];  // [0] params, [1..3] state slots
    std::vector<int64_t> steps;
    uint64_t group_steps = 0;
};

struct Rank {
    sx_shard_group_t *h = nullptr;
    sx::core::ShardGroup *g = nullptr;
};

std::string make_tmpdir() { return sxtest::make_tmpdir("ckpt-test"); }
using sxtest::read_file;
using sxtest::remove_tree;

using sxtest::run_ranks;

std::string err_text(const char *what) { return std::string(what) + ": " + sx_last_error_message(); }

// Creates rank r's group; `units_split` puts every param in its own unit.
std::string setup(const std::string &rv, int r, int world, bool units_split, Rank *out) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = r;
    cfg.world_size = world;
    cfg.num_threads = 1;
    cfg.timeout_ms = 30000;
    if (sx_create_shard_group(&cfg, &out->h) != SX_OK) return err_text("create");
    sx_param_group_desc_t a, b;
    sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_ADAMW);
    a.lr = 0.01, a.amsgrad = 1;
    sx_param_group_desc_init(&b, sizeof b, SX_OPTIM_SGD);
    b.lr = 0.05, b.momentum = 0.9;
    if (sx_add_param_group(out->h, &a, nullptr) != SX_OK || sx_add_param_group(out->h, &b, nullptr) != SX_OK)
        return err_text("add_param_group");
    for (size_t p = 0; p < kParams.size(); ++p) {
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = kParams[p].name;
        d.ndim = static_cast<int32_t>(kParams[p].shape.size());
        d.shape = kParams[p].shape.data();
        d.param_group = kParams[p].group;
        d.unit = units_split ? static_cast<int32_t>(p) : static_cast<int32_t>(p / 3);
        if (sx_add_param(out->h, &d, nullptr) != SX_OK) return err_text("add_param");
    }
    if (sx_finalize(out->h) != SX_OK) return err_text("finalize");
    out->g = out->h->impl.get();
    return "";
}

void init_params(Rank &rk) {
    for (size_t p = 0; p < kParams.size(); ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        sx_param_view(rk.h, static_cast<int32_t>(p), &v);
        for (uint64_t i = 0; i < v.numel; ++i)
            static_cast<float *>(v.data)[i] = static_cast<float>((i * 37 + p * 11) % 101) / 100.0f - 0.5f;
    }
}

std::string train(Rank &rk, int first_step, int steps) {
    for (int s = first_step; s < first_step + steps; ++s) {
        for (size_t p = 0; p < kParams.size(); ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            sx_grad_view(rk.h, static_cast<int32_t>(p), &v);
            for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] += grad_value(s, p, i);
        }
        if (sx_step(rk.h, nullptr, nullptr) != SX_OK) return err_text("step");
    }
    return "";
}

// Copies rank r's part of every tensor into `full` (disjoint regions across ranks).
void collect(Rank &rk, FullState *full, std::mutex *mu) {
    sx::core::ShardGroup &g = *rk.g;
    std::lock_guard<std::mutex> lock(*mu);
    for (int k = 0; k < 4; ++k) full->tensors[k].resize(kParams.size());
    full->steps.resize(kParams.size());
    full->group_steps = g.steps_taken();
    for (size_t p = 0; p < kParams.size(); ++p) {
        const uint64_t n = numel(kParams[p]);
        for (int k = 0; k < 4; ++k) full->tensors[k][p].resize(n, 0.0f);
        full->steps[p] = g.param(static_cast<int32_t>(p)).step;
        const sx::core::ShardPiece piece = g.layout().piece(static_cast<int32_t>(p), g.rank());
        if (piece.begin == piece.end) continue;
        const sx::core::UnitShard v = g.unit_shard(g.layout().placement(static_cast<int32_t>(p)).unit_index);
        const uint64_t len = piece.end - piece.begin;
        std::memcpy(&full->tensors[0][p][piece.begin],
                    v.values + piece.shard_offset, len * 4);
        for (int k = 0; k < v.state_slots; ++k)
            std::memcpy(&full->tensors[k + 1][p][piece.begin], v.state[k] + piece.shard_offset, len * 4);
    }
}

std::vector<std::vector<float>> params_of(Rank &rk) {
    std::vector<std::vector<float>> out;
    for (size_t p = 0; p < kParams.size(); ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        sx_param_view(rk.h, static_cast<int32_t>(p), &v);
        const float *d = static_cast<const float *>(v.data);
        out.emplace_back(d, d + v.numel);
    }
    return out;
}

void save_then_load(int w1, int w2, const std::string &dir) {
    const std::string path = dir + "/ck-" + std::to_string(w1) + "-" + std::to_string(w2);
    FullState saved, loaded;
    std::mutex mu;
    std::vector<std::vector<float>> reference;
    // Phase A: train 3 steps at w1, save, train 3 more (the run that never stops).
    std::string err = run_ranks(w1, [&](int r) -> std::string {
        Rank rk;
        std::string e = setup("local://cka-" + std::to_string(w1) + "-" + std::to_string(w2), r, w1, false, &rk);
        if (e.empty()) {
            init_params(rk);
            e = train(rk, 1, 3);
        }
        if (e.empty()) {
            sx::ckpt::Checkpointer ck(rk.g, sx::io::posix_file_ops());
            sx::ckpt::SaveOptions so;
            so.path = path;
            so.user_blob = std::string("loader\0pos=42", 13);
            sx::Status s = ck.save(so);
            if (!s.ok()) e = "save: " + s.message();
        }
        if (e.empty()) {
            collect(rk, &saved, &mu);
            e = train(rk, 4, 3);
        }
        if (e.empty() && r == 0) reference = params_of(rk);
        sx_destroy_shard_group(rk.h);
        return e;
    });
    if (!err.empty()) fail_msg("save at %d: %s", w1, err.c_str());
    // Phase B: a fresh group at w2 (another unit split) loads and trains the same 3 steps.
    err = run_ranks(w2, [&](int r) -> std::string {
        Rank rk;
        std::string e = setup("local://ckb-" + std::to_string(w1) + "-" + std::to_string(w2), r, w2, w2 % 2 == 0, &rk);
        if (e.empty()) {
            sx::ckpt::Checkpointer ck(rk.g, sx::io::posix_file_ops());
            sx::ckpt::LoadOptions lo;
            lo.path = path;
            std::string blob;
            sx::Status s = ck.load(lo, &blob);
            if (!s.ok()) e = "load: " + s.message();
            else if (blob != std::string("loader\0pos=42", 13)) e = "the user blob did not round-trip";
        }
        if (e.empty()) {
            collect(rk, &loaded, &mu);
            e = train(rk, 4, 3);
        }
        if (e.empty()) {
            std::vector<std::vector<float>> got = params_of(rk);
            for (size_t p = 0; p < got.size() && e.empty(); ++p)
                for (size_t i = 0; i < got[p].size(); ++i) {
                    const double a = got[p][i], b = reference[p][i];
                    if (std::fabs(a - b) > 1e-6 * std::max(std::fabs(b), 1e-3)) {
                        e = "after training on, param " + std::to_string(p) + "[" + std::to_string(i) +
                            "] = " + std::to_string(a) + ", the uninterrupted run has " + std::to_string(b);
                        break;
                    }
                }
        }
        sx_destroy_shard_group(rk.h);
        return e;
    });
    if (!err.empty()) fail_msg("%d -> %d: %s", w1, w2, err.c_str());
    // Bit-identical state: values, every state slot, step counts.
    for (int k = 0; k < 4; ++k)
        for (size_t p = 0; p < kParams.size(); ++p)
            if (saved.tensors[k][p] != loaded.tensors[k][p])
                fail_msg("%d -> %d: tensor %d of param %s differs after the load", w1, w2, k, kParams[p].name);
    assert_true(saved.steps == loaded.steps);
    assert_int_equal(saved.group_steps, loaded.group_steps);
    assert_int_equal(loaded.group_steps, 3);
}


// One rank, trained 2 steps: the group for the single-rank tests below.
struct Single {
    Rank rk;
    std::string error;
    explicit Single(const std::string &name) {
        error = setup("local://" + name, 0, 1, false, &rk);
        if (error.empty()) {
            init_params(rk);
            error = train(rk, 1, 2);
        }
    }
    ~Single() { sx_destroy_shard_group(rk.h); }
};

FullState state_of(Rank &rk) {
    FullState f;
    std::mutex mu;
    collect(rk, &f, &mu);
    return f;
}

bool same_state(const FullState &a, const FullState &b) {
    for (int k = 0; k < 4; ++k)
        if (a.tensors[k] != b.tensors[k]) return false;
    return a.steps == b.steps && a.group_steps == b.group_steps;
}

bool file_exists(const std::string &path) { return access(path.c_str(), F_OK) == 0; }

void write_file(const std::string &path, const std::string &bytes) { assert_true(sxtest::write_file(path, bytes)); }

// A tiny group: one AdamW param of 8 elements, trained 2 steps (3 chunks of 32 bytes).
struct Tiny {
    sx_shard_group_t *h = nullptr;
    explicit Tiny(const std::string &name) {
        h = sxtest::one_rank_group(name, {{"tiny", {8}}});
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        for (int s = 0; s < 2; ++s) {
            sx_grad_view(h, 0, &v);
            for (int i = 0; i < 8; ++i) static_cast<float *>(v.data)[i] = 0.25f * static_cast<float>(i - s);
            assert_int_equal(sx_step(h, nullptr, nullptr), SX_OK);
        }
    }
    ~Tiny() { sx_destroy_shard_group(h); }
    // Params and both moments, as raw bytes.
    std::string state() const {
        const sx::core::UnitShard v = h->impl->unit_shard(0);
        std::string out(reinterpret_cast<const char *>(v.values), 32);
        for (int k = 0; k < v.state_slots; ++k) out.append(reinterpret_cast<const char *>(v.state[k]), 32);
        return out;
    }
};


void test_params_only_and_mismatches_change_nothing(void **) {
    const std::string dir = make_tmpdir();
    Single a("ck-mis-a");
    assert_true(a.error.empty());
    sx::ckpt::Checkpointer ck(a.rk.g, sx::io::posix_file_ops());
    sx::ckpt::SaveOptions so;
    so.path = dir + "/ck";
    assert_true(ck.save(so).ok());
    // Saving over an existing checkpoint is refused and leaves it intact.
    sx::Status again = ck.save(so);
    assert_int_equal(again.code(), SX_ERR_ALREADY_EXISTS);
    assert_true(file_exists(dir + "/ck/MANIFEST"));
    assert_string_equal(read_file(dir + "/latest").c_str(), "ck\n");

    // A failed load (no such checkpoint) changes nothing; params-only loads values only.
    Single b("ck-mis-b");
    assert_true(b.error.empty());
    const FullState before = state_of(b.rk);
    sx::ckpt::Checkpointer ckb(b.rk.g, sx::io::posix_file_ops());
    sx::ckpt::LoadOptions lo;
    lo.path = dir + "/nonexistent";
    sx::Status s = ckb.load(lo, nullptr);
    assert_int_not_equal(s.code(), SX_OK);
    lo.path = dir + "/ck";
    // Params-only: values come, optimizer state and steps stay.
    lo.params_only = true;
    s = ckb.load(lo, nullptr);
    assert_true(s.ok());
    const FullState after_values = state_of(b.rk);
    const FullState source = state_of(a.rk);
    assert_true(after_values.tensors[0] == source.tensors[0]);
    assert_true(after_values.tensors[1] == before.tensors[1]);
    assert_true(after_values.steps == before.steps);
    remove_tree(dir);
}

// A checkpoint's params never count more updates than the checkpoint counts steps (a
// manifest that says otherwise is refused). A load that leaves a param as it was (allowed
// missing) may keep a count above the steps it restores: the group then counts at least
// that many, and its next save is valid. Here b trained 5 steps, then loads a's 2-step
// checkpoint in which 'b1' is named 'b1.old'.
void test_a_partial_load_keeps_the_step_counts_consistent(void **) {
    const std::string dir = make_tmpdir();
    Single a("ck-steps-a");
    assert_true(a.error.empty());
    auto posix = sx::io::posix_file_ops();
    sx::ckpt::Checkpointer ck(a.rk.g, posix);
    sx::ckpt::SaveOptions so;
    so.path = dir + "/ck";
    assert_true(ck.save(so).ok());
    sx::ckpt::Manifest m;
    assert_true(sx::ckpt::read_manifest(*posix, so.path, &m).ok());
    assert_int_equal(m.step, 2);
    for (auto &p : m.params)
        if (p.name == "b1") p.name = "b1.old";
    std::string bytes;
    assert_true(sx::ckpt::encode_manifest(m, &bytes).ok());
    write_file(so.path + "/MANIFEST", bytes);

    Single b("ck-steps-b");
    assert_true(b.error.empty() && train(b.rk, 3, 3).empty());
    assert_int_equal(b.rk.g->steps_taken(), 5);
    sx::ckpt::Checkpointer loader(b.rk.g, posix);
    sx::ckpt::LoadOptions lo;
    lo.path = so.path;
    lo.allow_missing = true;
    lo.allow_extra = true;
    assert_true(loader.load(lo, nullptr).ok());
    assert_int_equal(b.rk.g->steps_taken(), 5);  // 'b1' still counts 5 updates
    sx::ckpt::SaveOptions again;
    again.path = dir + "/after";
    sx::Status saved = loader.save(again);
    if (!saved.ok()) fail_msg("save after a partial load: %s", saved.message().c_str());
    sx::ckpt::Manifest after;
    assert_true(sx::ckpt::read_manifest(*posix, again.path, &after).ok());
    assert_int_equal(after.step, 5);
    for (const auto &p : after.params) assert_true(p.step == (p.name == "b1" ? 5 : 2) || p.step == 0);
    remove_tree(dir);
}

// A rank whose group fails (as a load whose params' gather failed there fails it) closes
// its connections, so that a peer's collective with it fails at once rather than at the
// peer's timeout (30 s here): rank 1 fails its group and stays (its process lives on),
// rank 0 steps.
void test_a_failed_rank_fails_its_peers_at_once(void **) {
    double seconds = 0;
    std::atomic<bool> stepped{false};
    const std::string err = run_ranks(2, [&](int r) -> std::string {
        Rank rk;
        std::string e = setup("local://ck-fails-peers", r, 2, false, &rk);
        if (!e.empty()) return e;
        init_params(rk);
        if (r == 1) {
            (rk.g->fail)(SX_ERROR(SX_ERR_INTERNAL, "injected: the params' gather failed here"));
            for (int i = 0; i < 400 && !stepped; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        } else {
            const auto t0 = std::chrono::steady_clock::now();
            e = train(rk, 1, 1);
            seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            e = e.empty() ? "rank 0 stepped with a failed peer" : "";
            stepped = true;
        }
        sx_destroy_shard_group(rk.h);
        return e;
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
    if (seconds > 10) fail_msg("rank 0's step failed after %.1f s, not at once", seconds);
}

void test_corrupt_chunk_is_detected_and_changes_nothing(void **) {
    const std::string dir = make_tmpdir();
    Single a("ck-corrupt-a");
    assert_true(a.error.empty());
    sx::ckpt::Checkpointer ck(a.rk.g, sx::io::posix_file_ops());
    sx::ckpt::SaveOptions so;
    so.path = dir + "/ck";
    assert_true(ck.save(so).ok());
    // Flip one bit inside the first chunk of the shard file.
    const std::string shard = dir + "/ck/" + sx::ckpt::shard_file_name(0, 1);
    FILE *f = std::fopen(shard.c_str(), "r+b");
    assert_non_null(f);
    std::fseek(f, 10, SEEK_SET);
    int c = std::fgetc(f);
    std::fseek(f, 10, SEEK_SET);
    std::fputc(c ^ 0x10, f);
    std::fclose(f);
    Single b("ck-corrupt-b");
    const FullState before = state_of(b.rk);
    sx::ckpt::Checkpointer ckb(b.rk.g, sx::io::posix_file_ops());
    sx::ckpt::LoadOptions lo;
    lo.path = dir + "/ck";
    sx::Status s = ckb.load(lo, nullptr);
    assert_int_equal(s.code(), SX_ERR_CORRUPT);
    assert_non_null(std::strstr(s.message().c_str(), "CRC32C"));
    assert_true(same_state(before, state_of(b.rk)));
    remove_tree(dir);
}

// A FileOps that records the length of every pread.
class PreadSizes : public sx::io::FaultFileOps {
  public:
    PreadSizes() : FaultFileOps(sx::io::posix_file_ops()) {}
    sx::Status pread_all(int fd, void *data, size_t n, uint64_t offset, const std::string &path) override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            sizes_.push_back(n);
        }
        return FaultFileOps::pread_all(fd, data, n, offset, path);
    }
    std::vector<size_t> sizes() {
        std::lock_guard<std::mutex> lock(mu_);
        return sizes_;
    }

  private:
    std::mutex mu_;
    std::vector<size_t> sizes_;
};

// A 1-rank group with one AdamW param "w" of n elements, values i/n, stepped once with
// gradient 1 - 2i/n (keep_grads), so that both states are non-zero.
sx_shard_group_t *one_param_group(const std::string &rv, uint64_t n, bool step) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = 0, cfg.world_size = 1, cfg.num_threads = 1;
    sx_shard_group_t *h = nullptr;
    if (sx_create_shard_group(&cfg, &h) != SX_OK) return nullptr;
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    sx_param_desc_t d;
    sx_param_desc_init(&d, sizeof d);
    const int64_t shape[1] = {static_cast<int64_t>(n)};
    d.name = "w", d.ndim = 1, d.shape = shape;
    sx_view_t pv, gv;
    sx_view_init(&pv, sizeof pv);
    sx_view_init(&gv, sizeof gv);
    sx_step_options_t so;
    sx_step_options_init(&so, sizeof so);
    so.keep_grads = 1;
    if (sx_add_param_group(h, &pg, nullptr) != SX_OK || sx_add_param(h, &d, nullptr) != SX_OK ||
        sx_finalize(h) != SX_OK || sx_param_view(h, 0, &pv) != SX_OK || sx_grad_view(h, 0, &gv) != SX_OK) {
        sx_destroy_shard_group(h);
        return nullptr;
    }
    for (uint64_t i = 0; i < n; ++i) {
        static_cast<float *>(pv.data)[i] = static_cast<float>(i) / static_cast<float>(n);
        static_cast<float *>(gv.data)[i] = 1.0f - 2.0f * static_cast<float>(i) / static_cast<float>(n);
    }
    if (step && sx_step(h, &so, nullptr) != SX_OK) {
        sx_destroy_shard_group(h);
        return nullptr;
    }
    return h;
}

// Chunks that follow each other in the file and in their place are read by one call of
// more than one chunk and at most kMaxRunBytes; the load is exact, and a damaged chunk in
// the middle of such a run is still found by its own CRC, naming it, with nothing changed.
void test_chunks_in_a_row_are_read_by_one_call(void **) {
    const std::string dir = make_tmpdir(), path = dir + "/ck";
    const uint64_t chunk = sx::ckpt::kMaxChunkBytes / 4, n = 13 * chunk + 123;  // 14 chunks a tensor
    sx_shard_group_t *a = one_param_group("local://ck-runs-a", n, true);
    if (!a) fail_msg("group a: %s", sx_last_error_message());
    {
        sx::ckpt::Checkpointer ck(a->impl.get(), sx::io::posix_file_ops());
        sx::ckpt::SaveOptions so;
        so.path = path;
        assert_true(ck.save(so).ok());
    }
    Rank ra;
    ra.h = a, ra.g = a->impl.get();
    sx_shard_group_t *b = one_param_group("local://ck-runs-b", n, false);
    if (!b) fail_msg("group b: %s", sx_last_error_message());
    Rank rb;
    rb.h = b, rb.g = b->impl.get();
    auto ops = std::make_shared<PreadSizes>();
    sx::ckpt::LoadOptions lo;
    lo.path = path;
    {
        sx::ckpt::Checkpointer ck(rb.g, ops);
        sx::Status s = ck.load(lo, nullptr);
        if (!s.ok()) fail_msg("load: %s", s.message().c_str());
    }
    const sx::core::UnitShard va = ra.g->unit_shard(0), vb = rb.g->unit_shard(0);
    assert_int_equal(vb.state_slots, 2);
    assert_memory_equal(va.values, vb.values, n * 4);
    for (int k = 0; k < 2; ++k) assert_memory_equal(va.state[k], vb.state[k], n * 4);
    size_t biggest = 0, data_reads = 0;
    for (size_t sz : ops->sizes()) {
        biggest = std::max(biggest, sz);
        if (sz >= sx::ckpt::kMaxChunkBytes) ++data_reads;
        assert_true(sz <= sx::ckpt::ChunkReader::kMaxRunBytes);
    }
    assert_true(biggest > sx::ckpt::kMaxChunkBytes);
    assert_true(data_reads < 3 * 13);  // 13 whole chunks in each of 3 tensors, fewer calls
    // Damage the 6th chunk of the values (inside a run of them), and load again.
    const std::string shard = path + "/" + sx::ckpt::shard_file_name(0, 1);
    FILE *f = std::fopen(shard.c_str(), "r+b");
    assert_non_null(f);
    const long at = static_cast<long>(5 * sx::ckpt::kMaxChunkBytes + 777);
    std::fseek(f, at, SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, at, SEEK_SET);
    std::fputc(c ^ 0x01, f);
    std::fclose(f);
    auto snapshot = [&] {
        const sx::core::UnitShard v = rb.g->unit_shard(0);
        std::vector<float> all(v.values, v.values + n);
        for (int k = 0; k < v.state_slots; ++k) all.insert(all.end(), v.state[k], v.state[k] + n);
        return all;
    };
    const std::vector<float> before = snapshot();
    {
        sx::ckpt::Checkpointer ck(rb.g, sx::io::posix_file_ops());
        sx::Status s = ck.load(lo, nullptr);
        assert_int_equal(s.code(), SX_ERR_CORRUPT);
        if (!std::strstr(s.message().c_str(), "CRC32C") ||
            !std::strstr(s.message().c_str(), std::to_string(5 * sx::ckpt::kMaxChunkBytes).c_str()))
            fail_msg("the error names neither the check nor the chunk: %s", s.message().c_str());
    }
    assert_true(before == snapshot());
    sx_destroy_shard_group(a);
    sx_destroy_shard_group(b);
    remove_tree(dir);
}

// Ranks of a fresh group of `world` train 2 steps and save to path; an error or "".
std::string save_trained(const std::string &name, int world, const std::string &path) {
    return run_ranks(world, [&](int r) -> std::string {
        Rank rk;
        std::string e = setup("local://" + name, r, world, false, &rk);
        if (e.empty()) {
            init_params(rk);
            e = train(rk, 1, 2);
        }
        if (e.empty()) {
            sx::ckpt::Checkpointer ck(rk.g, sx::io::posix_file_ops());
            sx::ckpt::SaveOptions so;
            so.path = path;
            sx::Status s = ck.save(so);
            if (!s.ok()) e = "save: " + s.message();
        }
        sx_destroy_shard_group(rk.h);
        return e;
    });
}

// A FileOps that records the names of the files opened for reading.
class RecordingOps : public sx::io::FaultFileOps {
  public:
    RecordingOps() : FaultFileOps(sx::io::posix_file_ops()) {}
    sx::Status open_read(const std::string &path, int *fd) override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            opened_.insert(path.substr(path.rfind('/') + 1));
        }
        return FaultFileOps::open_read(path, fd);
    }
    std::set<std::string> opened() {
        std::lock_guard<std::mutex> lock(mu_);
        return opened_;
    }

  private:
    std::mutex mu_;
    std::set<std::string> opened_;
};

// Format 2.0 keeps each file's chunk table in the file: a load opens the MANIFEST and the
// files holding its own shard, and no other (with the chunks in the MANIFEST, every rank
// decoded every file's chunks). Saved by 4 ranks, loaded into 4 (each its own file) and
// into 2. There, unit 0 (embed, scalar, w1: 512 elements padded either way) splits at
// the border of files 1 and 2, but unit 1 (b1, then w2 from element 16: 160 elements
// padded in 2 shards of 80, 192 in 4 of 48) puts rank 1's half, [80, 160), in files 1
// to 3: rank 0 opens files 0 and 1, rank 1 files 1, 2 and 3.
void test_a_load_opens_only_the_files_it_reads(void **) {
    const std::string dir = make_tmpdir();
    const std::string path = dir + "/ck";
    std::string err = save_trained("ck-files-a", 4, path);
    if (!err.empty()) fail_msg("save: %s", err.c_str());
    for (int world : {4, 2}) {
        err = run_ranks(world, [&](int r) -> std::string {
            Rank rk;
            std::string e = setup("local://ck-files-" + std::to_string(world), r, world, false, &rk);
            if (!e.empty()) return e;
            auto ops = std::make_shared<RecordingOps>();
            sx::ckpt::Checkpointer ck(rk.g, ops);
            sx::ckpt::LoadOptions lo;
            lo.path = path;
            sx::Status s = ck.load(lo, nullptr);
            std::set<std::string> expected = {"MANIFEST"};
            const std::vector<int> files = world == 4 ? std::vector<int>{r} : r == 0 ? std::vector<int>{0, 1}
                                                                                     : std::vector<int>{1, 2, 3};
            for (int q : files) expected.insert(sx::ckpt::shard_file_name(q, 4));
            if (!s.ok()) {
                e = "load: " + s.message();
            } else if (ops->opened() != expected) {
                e = "opened:";
                for (const std::string &n : ops->opened()) e += " " + n;
            }
            sx_destroy_shard_group(rk.h);
            return e;
        });
        if (!err.empty()) fail_msg("into %d ranks: %s", world, err.c_str());
    }
    remove_tree(dir);
}

// Rank r of a fresh group of `world`, trained 1 step; an error (and no group) or "".
std::string trained_one_step(const std::string &name, int r, int world, Rank *rk) {
    std::string e = setup("local://" + name, r, world, false, rk);
    if (e.empty()) {
        init_params(*rk);
        e = train(*rk, 1, 1);
    }
    if (!e.empty()) sx_destroy_shard_group(rk->h);
    return e;
}

// A load fails on rank 1 of 2 at a chunk of its file: a file holds the values first,
// then the states, so a flip in its first byte fails the load before the ranks gather
// the values, and one in its last byte after (they then restore the params).
void a_failure_on_one_rank_changes_nothing_on_any(bool in_a_value) {
    const std::string dir = make_tmpdir();
    const std::string path = dir + "/ck";
    std::string err = save_trained("ck-onefails-a", 2, path);
    if (!err.empty()) fail_msg("save: %s", err.c_str());
    const std::string shard = path + "/" + sx::ckpt::shard_file_name(1, 2);
    std::string bytes = read_file(shard);
    const uint64_t data = sxtest::shard_data_bytes(path, 1);  // the index follows the last chunk
    assert_true(data > 0 && bytes.size() > data);
    const size_t at = in_a_value ? 0 : data - 1;
    bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
    write_file(shard, bytes);
    err = run_ranks(2, [&](int r) -> std::string {
        Rank rk;
        std::string e = trained_one_step(in_a_value ? "ck-onefails-v" : "ck-onefails-s", r, 2, &rk);
        if (!e.empty()) return e;
        const FullState before = state_of(rk);
        const std::vector<std::vector<float>> params = params_of(rk);
        sx::ckpt::Checkpointer ck(rk.g, sx::io::posix_file_ops());
        sx::ckpt::LoadOptions lo;
        lo.path = path;
        sx::Status s = ck.load(lo, nullptr);
        if (s.code() != SX_ERR_CORRUPT) e = "expected SX_ERR_CORRUPT, got: " + s.message();
        else if (r == 0 && !std::strstr(s.message().c_str(), "another rank")) e = "rank 0 says: " + s.message();
        else if (r == 1 && !std::strstr(s.message().c_str(), in_a_value ? "' at byte" : "'.max_exp_avg_sq at byte"))
            e = "rank 1 names another chunk: " + s.message();
        else if (!same_state(before, state_of(rk))) e = "the failed load changed this rank's shard";
        else if (params_of(rk) != params) e = "the failed load changed this rank's params";
        sx_destroy_shard_group(rk.h);
        return e;
    });
    if (!err.empty()) fail_msg("load (%s): %s", in_a_value ? "a value" : "a state", err.c_str());
    remove_tree(dir);
}

void test_a_failure_on_one_rank_changes_nothing_on_any(void **) {
    a_failure_on_one_rank_changes_nothing_on_any(true);
    a_failure_on_one_rank_changes_nothing_on_any(false);
}

// File operations whose open_write blocks until released: a rank stalled in the middle
// of a save, as a stopped process would be.
class StallingFileOps : public sx::io::FaultFileOps {
  public:
    StallingFileOps() : FaultFileOps(sx::io::posix_file_ops()) {}
    sx::Status open_write(const std::string &path, int *fd) override {
        std::unique_lock<std::mutex> lock(mu_);
        entered_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return released_; });
        lock.unlock();
        return FaultFileOps::open_write(path, fd);
    }
    void wait_entered() {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return entered_; });
    }
    void release() {
        std::lock_guard<std::mutex> lock(mu_);
        released_ = true;
        cv_.notify_all();
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool entered_ = false, released_ = false;
};

// A peer stalls in the middle of an asynchronous save (rank 1 cannot open its shard
// file) while rank 0 waits for its report, with a timeout of 30 s: cancelling rank 0's
// future ends its save within 1 s with SX_ERR_CANCELLED, and sx_abort with
// SX_ERR_ABORTED, after which destroying the group returns within 1 s. Nothing is
// committed, and the next save in the directory clears what this one left.
void test_a_stalled_peer_does_not_hold_a_save(void **) {
    for (const bool abort : {false, true}) {
        const std::string dir = make_tmpdir();
        auto stalling = std::make_shared<StallingFileOps>();
        std::string err = run_ranks(2, [&](int r) -> std::string {
            Rank rk;
            std::string e = setup(std::string("local://ck-stall-") + (abort ? "abort" : "cancel"), r, 2, false, &rk);
            if (!e.empty()) return e;
            init_params(rk);
            e = train(rk, 1, 1);
            if (!e.empty()) return e;
            auto *ck = new sx::ckpt::Checkpointer(rk.g, r == 1 ? std::shared_ptr<sx::io::FileOps>(stalling)
                                                                : sx::io::posix_file_ops());
            sx::ckpt::SaveOptions so;
            so.path = dir + "/stalled";
            std::shared_ptr<sx::ckpt::SaveFuture> f;
            sx::Status s = ck->save_async(so, nullptr, &f);
            if (!s.ok()) e = "save_async: " + s.message();
            if (e.empty() && r == 0) {
                stalling->wait_entered();
                std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 waits for rank 1's report
                const auto t0 = std::chrono::steady_clock::now();
                if (abort) {
                    sx_abort(rk.h);
                } else {
                    f->request_cancel();
                }
                if (!f->wait(std::chrono::milliseconds(10000))) e = "the save did not end";
                const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                const sx_status_t want = abort ? SX_ERR_ABORTED : SX_ERR_CANCELLED;
                if (e.empty() && f->status().code() != want)
                    e = "the save ended with " + std::to_string(f->status().code()) + ": " + f->status().message();
                if (e.empty() && took > 1.0) e = "the save took " + std::to_string(took) + " s to end";
                const auto t1 = std::chrono::steady_clock::now();
                delete ck;
                ck = nullptr;
                sx_destroy_shard_group(rk.h);
                const double gone = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
                if (e.empty() && gone > 1.0) e = "destroying the group took " + std::to_string(gone) + " s";
                stalling->release();
                return e;
            }
            if (!e.empty()) stalling->release();
            // Rank 1, released once rank 0 is done: its save fails (rank 0 stopped it).
            if (e.empty() && (!f->wait(std::chrono::milliseconds(30000)) || f->status().ok()))
                e = "rank 1's save did not fail";
            delete ck;
            sx_destroy_shard_group(rk.h);
            return e;
        });
        if (!err.empty()) fail_msg("%s: %s", abort ? "abort" : "cancel", err.c_str());
        assert_false(file_exists(dir + "/stalled/MANIFEST"));
        remove_tree(dir);
    }
}

// Two ranks given different parent directories for one save (rank 1's has a crashed
// save's leftover it could write into): the call's header names both paths, both ranks
// fail at once, and neither parent gets a checkpoint or a `latest`.
void test_ranks_saving_to_different_paths_commit_nothing(void **) {
    const std::string dir = make_tmpdir();
    const std::string parents[2] = {dir + "/p0", dir + "/p1"};
    for (const std::string &p : parents) assert_int_equal(::mkdir(p.c_str(), 0755), 0);
    // What a crashed save left in rank 1's parent: rank 1 writes into it and succeeds.
    assert_int_equal(::mkdir((parents[1] + "/C" + sx::ckpt::kPartialSuffix).c_str(), 0755), 0);
    sx::Status got[2];
    std::string err = run_ranks(2, [&](int r) -> std::string {
        Rank rk;
        std::string e = trained_one_step("ck-two-paths", r, 2, &rk);
        if (!e.empty()) return e;
        sx::ckpt::Checkpointer ck(rk.g, sx::io::posix_file_ops());
        sx::ckpt::SaveOptions so;
        so.path = parents[r] + "/C";
        got[r] = ck.save(so);
        sx_destroy_shard_group(rk.h);
        return "";
    });
    if (!err.empty()) fail_msg("%s", err.c_str());
    for (int r = 0; r < 2; ++r) {
        if (got[r].ok()) fail_msg("rank %d's save succeeded", r);
        assert_int_equal(got[r].code(), SX_ERR_MISMATCH);
        const std::string want = "the checkpoint path: " + parents[0] + "/C on rank 0, " + parents[1] + "/C on rank 1";
        if (got[r].message().find(want) == std::string::npos) fail_msg("rank %d: %s", r, got[r].message().c_str());
    }
    for (const std::string &p : parents) {
        struct stat st;
        assert_int_not_equal(::stat((p + "/C/" + sx::ckpt::kManifestName).c_str(), &st), 0);
        assert_int_not_equal(::stat((p + "/" + sx::ckpt::kLatestName).c_str(), &st), 0);
    }
    remove_tree(dir);
}

// Two fresh ranks, trained 1 step, load `path`, rank 1 through ops1. ok[r]: rank r's
// load succeeded, and then `loaded` gets its state; a failed load must fail with `code`
// and change nothing on its rank. An error or "".
std::string load_by_two(const std::string &name, const std::string &path,
                        const std::shared_ptr<sx::io::FileOps> &ops1, sx_status_t code, FullState *loaded,
                        bool ok[2]) {
    std::mutex mu;
    return run_ranks(2, [&](int r) -> std::string {
        Rank rk;
        std::string e = trained_one_step(name, r, 2, &rk);
        if (!e.empty()) return e;
        const FullState before = state_of(rk);
        const std::vector<std::vector<float>> params = params_of(rk);
        sx::ckpt::Checkpointer ck(rk.g, r == 1 ? ops1 : sx::io::posix_file_ops());
        sx::ckpt::LoadOptions lo;
        lo.path = path;
        const sx::Status s = ck.load(lo, nullptr);
        ok[r] = s.ok();
        if (s.ok()) {
            collect(rk, loaded, &mu);
        } else if (s.code() != code) {
            e = "expected " + std::string(sx_status_string(code)) + ", got: " + s.message();
        } else if (!same_state(before, state_of(rk)) || params_of(rk) != params) {
            e = "the failed load changed this rank's state (" + s.message() + ")";
        }
        sx_destroy_shard_group(rk.h);
        return e;
    });
}

// Two ranks load what three saved: each reads two files, one stream each, whole chunks
// in place and split ones through buffers. Rank 1's n-th file operation fails, for every
// n: the load fails on both ranks with SX_ERR_IO and changes nothing on either, or (a
// call it can do without) it succeeds and the state is the one a clean load gives.
void test_a_failed_file_call_at_every_point_of_a_load(void **) {
    const std::string dir = make_tmpdir();
    const std::string path = dir + "/ck";
    std::string err = save_trained("ck-iofail-save", 3, path);
    if (!err.empty()) fail_msg("save: %s", err.c_str());
    auto posix = sx::io::posix_file_ops();
    FullState clean;
    bool ok[2] = {false, false};
    auto counting = std::make_shared<sx::io::FaultFileOps>(posix);
    err = load_by_two("ck-iofail-count", path, counting, SX_ERR_IO, &clean, ok);
    if (!err.empty() || !ok[0] || !ok[1]) fail_msg("clean load: %s", err.c_str());
    const int64_t calls = counting->count(sx::io::OpKind::kAny);
    assert_true(counting->count(sx::io::OpKind::kRead) >= 4);
    int failed = 0;
    for (int64_t n = 1; n <= calls; ++n) {
        auto faulty = std::make_shared<sx::io::FaultFileOps>(posix);
        faulty->arm(sx::io::OpKind::kAny, n, false);
        FullState loaded;
        err = load_by_two("ck-iofail-" + std::to_string(n), path, faulty, SX_ERR_IO, &loaded, ok);
        if (!err.empty()) fail_msg("call %lld of %lld failing: %s", (long long)n, (long long)calls, err.c_str());
        if (ok[0] != ok[1]) fail_msg("call %lld failing: one rank loaded, the other did not", (long long)n);
        if (ok[0] && !same_state(loaded, clean)) fail_msg("call %lld failing: the load succeeded, wrong", (long long)n);
        failed += ok[0] ? 0 : 1;
    }
    // Every call but the closes of the shard files is needed.
    assert_true(failed >= calls - counting->count(sx::io::OpKind::kClose));
    remove_tree(dir);
}

// File operations whose n-th read throws std::bad_alloc, as a read into memory that
// cannot be had would.
class ThrowingReads : public sx::io::FaultFileOps {
  public:
    ThrowingReads(int64_t n) : FaultFileOps(sx::io::posix_file_ops()), n_(n) {}
    sx::Status pread_all(int fd, void *data, size_t n, uint64_t offset, const std::string &path) override {
        if (++reads_ == n_) throw std::bad_alloc();
        return FaultFileOps::pread_all(fd, data, n, offset, path);
    }

  private:
    const int64_t n_;
    std::atomic<int64_t> reads_{0};
};

// The same load, rank 1's n-th read throwing, for every n: the MANIFEST's read on the
// calling thread, each chunk's on a reading thread. The load fails on both ranks with
// SX_ERR_OUT_OF_MEMORY, changes nothing, and the process goes on.
void test_an_exception_while_reading_fails_the_load(void **) {
    const std::string dir = make_tmpdir();
    const std::string path = dir + "/ck";
    std::string err = save_trained("ck-throw-save", 3, path);
    if (!err.empty()) fail_msg("save: %s", err.c_str());
    FullState clean;
    bool ok[2] = {false, false};
    auto counting = std::make_shared<sx::io::FaultFileOps>(sx::io::posix_file_ops());
    err = load_by_two("ck-throw-count", path, counting, SX_ERR_OUT_OF_MEMORY, &clean, ok);
    if (!err.empty() || !ok[0] || !ok[1]) fail_msg("clean load: %s", err.c_str());
    const int64_t reads = counting->count(sx::io::OpKind::kRead);
    assert_true(reads >= 4);
    for (int64_t n = 1; n <= reads; ++n) {
        FullState loaded;
        err = load_by_two("ck-throw-" + std::to_string(n), path, std::make_shared<ThrowingReads>(n),
                          SX_ERR_OUT_OF_MEMORY, &loaded, ok);
        if (!err.empty()) fail_msg("read %lld of %lld throwing: %s", (long long)n, (long long)reads, err.c_str());
        if (ok[0] || ok[1]) fail_msg("read %lld throwing: a rank loaded", (long long)n);
    }
    remove_tree(dir);
}

// Removes the temporary files of `latest` that crashed writes left in `dir`.
void remove_latest_temporaries(const std::string &dir) {
    DIR *d = opendir(dir.c_str());
    assert_non_null(d);
    std::vector<std::string> doomed;
    while (struct dirent *e = readdir(d))
        if (sx::ckpt::is_latest_temporary_name(e->d_name)) doomed.push_back(dir + "/" + e->d_name);
    closedir(d);
    for (const std::string &p : doomed) assert_int_equal(unlink(p.c_str()), 0);
}

// No save or removal left a .sx-partial directory in `dir`.
void expect_nothing_left_over(const std::string &dir) {
    DIR *d = opendir(dir.c_str());
    assert_non_null(d);
    while (dirent *e = readdir(d))
        if (std::strstr(e->d_name, ".sx-partial")) fail_msg("left over: %s", e->d_name);
    closedir(d);
}

void test_crash_at_every_io_call(void **) {
    // Checkpoint "a" is good. Then a save of "b" crashes at its n-th file operation, for
    // every n: "a" still loads and equals what was saved; "b" either does not exist as a
    // checkpoint or loads whole; `latest` names one that loads. Every failure is SX_ERR_IO.
    const std::string dir = make_tmpdir();
    Single g("ck-crash");
    assert_true(g.error.empty());
    auto posix = sx::io::posix_file_ops();
    sx::ckpt::Checkpointer good(g.rk.g, posix);
    sx::ckpt::SaveOptions so;
    so.path = dir + "/a";
    assert_true(good.save(so).ok());
    const FullState state_a = state_of(g.rk);
    assert_true(train(g.rk, 3, 1).empty());
    const FullState state_b = state_of(g.rk);

    // Count the calls a whole save makes.
    auto counting = std::make_shared<sx::io::FaultFileOps>(posix);
    {
        sx::ckpt::Checkpointer ck(g.rk.g, counting);
        so.path = dir + "/count";
        assert_true(ck.save(so).ok());
    }
    const int64_t calls = counting->count(sx::io::OpKind::kAny);
    assert_true(calls > 8);
    remove_tree(dir + "/count");
    write_file(dir + "/latest", "a\n");
    for (int64_t n = 1; n <= 2 * calls; ++n) {
        // First a crash at call n (it and everything after fail), then a lone failure of
        // call n - calls (the save must notice and report it).
        auto faulty = std::make_shared<sx::io::FaultFileOps>(posix);
        const bool crash = n <= calls;
        faulty->arm(sx::io::OpKind::kAny, crash ? n : n - calls, crash);
        sx::ckpt::Checkpointer ck(g.rk.g, faulty);
        so.path = dir + "/b";
        sx::Status s = ck.save(so);
        if (!s.ok()) assert_int_equal(s.code(), SX_ERR_IO);
        // A lone failure must be noticed: the save reports it (a failure after the
        // rename may leave b complete, which the checks below then require to load).
        if (!crash && faulty->fired() && s.ok())
            fail_msg("call %lld failed alone and the save reported success", (long long)(n - calls));
        // What loads is either the old checkpoint or the complete new one.
        Single fresh("ck-crash-check-" + std::to_string(n));
        sx::ckpt::Checkpointer loader(fresh.rk.g, posix);
        sx::ckpt::LoadOptions lo;
        lo.path = dir + "/a";
        assert_true(loader.load(lo, nullptr).ok());
        if (!same_state(state_a, state_of(fresh.rk))) fail_msg("crash at call %lld: checkpoint a changed", (long long)n);
        lo.path = dir + "/b";
        sx::Status lb = loader.load(lo, nullptr);
        if (lb.ok()) {
            if (!same_state(state_b, state_of(fresh.rk))) fail_msg("crash at call %lld: b loads torn", (long long)n);
        } else if (file_exists(dir + "/b/MANIFEST")) {
            fail_msg("crash at call %lld: b has a MANIFEST but does not load: %s", (long long)n, lb.message().c_str());
        }
        const std::string latest = read_file(dir + "/latest");
        if (latest == "b\n" && !lb.ok()) fail_msg("crash at call %lld: latest names b, which does not load", (long long)n);
        if (latest != "a\n" && latest != "b\n") fail_msg("crash at call %lld: latest is '%s'", (long long)n, latest.c_str());
        remove_tree(dir + "/b");
        write_file(dir + "/latest", "a\n");
    }
    // The next good save cleans up what crashed saves left.
    so.path = dir + "/c";
    assert_true(good.save(so).ok());
    expect_nothing_left_over(dir);
    remove_tree(dir);
}

// Retention under crashes: checkpoints a (step 2) and b (step 3) exist; a save of c (step
// 4) with keep_last 1, which removes a and b after it commits, crashes at its n-th file
// call, for every n up to the last call of its retention. Whatever is left, every
// directory holding a MANIFEST loads, whole and as saved, and `latest` names one that
// loads. Then a good save clears what the crashes left.
void test_crash_at_every_call_of_a_retention(void **) {
    const std::string dir = make_tmpdir();
    Single g("ck-retain");
    assert_true(g.error.empty());
    auto posix = sx::io::posix_file_ops();
    sx::ckpt::Checkpointer good(g.rk.g, posix);
    // The states of a, b and c: the group after 2, 3 and 4 steps.
    std::vector<FullState> states;
    for (int k = 0; k < 3; ++k) {
        if (k > 0) assert_true(train(g.rk, 2 + k, 1).empty());
        states.push_back(state_of(g.rk));
    }
    auto save_ab = [&] {
        Single s("ck-retain-ab");
        assert_true(s.error.empty());
        sx::ckpt::Checkpointer ck(s.rk.g, posix);
        sx::ckpt::SaveOptions so;
        so.path = dir + "/a";
        assert_true(ck.save(so).ok());
        assert_true(train(s.rk, 3, 1).empty());
        so.path = dir + "/b";
        assert_true(ck.save(so).ok());
    };
    // Count the calls of a whole save of c with its retention.
    save_ab();
    sx::ckpt::SaveOptions so;
    so.path = dir + "/c";
    so.keep_last = 1;
    auto counting = std::make_shared<sx::io::FaultFileOps>(posix);
    {
        sx::ckpt::Checkpointer ck(g.rk.g, counting);
        assert_true(ck.save(so).ok());
    }
    const int64_t calls = counting->count(sx::io::OpKind::kAny);
    assert_false(file_exists(dir + "/a/MANIFEST") || file_exists(dir + "/b/MANIFEST"));
    int64_t removals_cut = 0;
    for (int64_t n = 1; n <= calls; ++n) {
        for (const char *name : {"a", "b", "c", "a.sx-partial", "b.sx-partial", "c.sx-partial"})
            if (file_exists(dir + "/" + name)) remove_tree(dir + "/" + name);
        remove_latest_temporaries(dir);  // what the crash before left: as before the count
        save_ab();
        auto faulty = std::make_shared<sx::io::FaultFileOps>(posix);
        faulty->arm(sx::io::OpKind::kAny, n, true);
        {
            sx::ckpt::Checkpointer ck(g.rk.g, faulty);
            sx::Status st = ck.save(so);
            if (!st.ok()) assert_int_equal(st.code(), SX_ERR_IO);
        }
        int manifests = 0;
        for (int k = 0; k < 3; ++k) {
            const std::string name = std::string(1, static_cast<char>('a' + k));
            // c.sx-partial is c's save before its commit, whose MANIFEST may be cut short;
            // a.sx-partial and b.sx-partial are a and b being removed.
            for (const std::string &at : {dir + "/" + name, dir + "/" + name + ".sx-partial"}) {
                if (!file_exists(at + "/MANIFEST") || at == dir + "/c.sx-partial") continue;
                ++manifests;
                Single fresh("ck-retain-check");
                sx::ckpt::Checkpointer loader(fresh.rk.g, posix);
                sx::ckpt::LoadOptions lo;
                lo.path = at;
                sx::Status ls = loader.load(lo, nullptr);
                if (at.size() > 11 && at.compare(at.size() - 11, 11, ".sx-partial") == 0) {
                    // A checkpoint being removed is refused by name, whatever it still holds.
                    if (ls.code() != SX_ERR_INVALID_ARGUMENT || ls.message().find(".sx-partial") == std::string::npos)
                        fail_msg("crash at call %lld: %s was not refused as an unfinished save's: %s", (long long)n,
                                 at.c_str(), ls.message().c_str());
                    continue;
                }
                if (!ls.ok()) fail_msg("crash at call %lld: %s has a MANIFEST but does not load: %s", (long long)n,
                                       at.c_str(), ls.message().c_str());
                if (!same_state(states[k], state_of(fresh.rk)))
                    fail_msg("crash at call %lld: %s loads another state", (long long)n, at.c_str());
            }
            if (file_exists(dir + "/" + name) && !file_exists(dir + "/" + name + "/MANIFEST") && k < 2)
                fail_msg("crash at call %lld: %s lost its MANIFEST but kept its name", (long long)n, name.c_str());
        }
        if (manifests < 3 && file_exists(dir + "/c/MANIFEST")) ++removals_cut;
        const std::string latest = read_file(dir + "/latest");
        if (latest.size() < 2 || !file_exists(dir + "/" + latest.substr(0, latest.size() - 1) + "/MANIFEST"))
            fail_msg("crash at call %lld: latest is '%s', which names no checkpoint", (long long)n, latest.c_str());
    }
    assert_true(removals_cut >= 4);  // crashes inside the retention itself were among them
    // The next good save clears what the crashes left: no .sx-partial directory stays.
    so.path = dir + "/d";
    so.keep_last = 0;
    assert_true(good.save(so).ok());
    expect_nothing_left_over(dir);
    remove_tree(dir);
}

// A shard file or MANIFEST that is not a regular file in the checkpoint's directory (a
// FIFO, which would block a reader forever; a symbolic link, which could point anywhere;
// a directory) is refused at once, naming what it is.
void test_only_regular_files_are_read(void **) {
    const std::string dir = make_tmpdir();
    Single a("ck-kinds-a");
    assert_true(a.error.empty());
    auto posix = sx::io::posix_file_ops();
    sx::ckpt::Checkpointer ck(a.rk.g, posix);
    sx::ckpt::SaveOptions so;
    so.path = dir + "/ck";
    assert_true(ck.save(so).ok());
    const std::string shard = dir + "/ck/" + sx::ckpt::shard_file_name(0, 1), moved = dir + "/elsewhere.bin";
    assert_int_equal(::rename(shard.c_str(), moved.c_str()), 0);
    Single b("ck-kinds-b");
    const FullState before = state_of(b.rk);
    sx::ckpt::Checkpointer loader(b.rk.g, posix);
    sx::ckpt::LoadOptions lo;
    lo.path = dir + "/ck";
    struct Kind {
        const char *what;
        std::function<int()> plant;
    };
    const std::vector<Kind> kinds = {
        {"a FIFO", [&] { return ::mkfifo(shard.c_str(), 0644); }},
        {"a symbolic link", [&] { return ::symlink(moved.c_str(), shard.c_str()); }},
        {"a directory", [&] { return ::mkdir(shard.c_str(), 0755); }},
    };
    for (const Kind &k : kinds) {
        assert_int_equal(k.plant(), 0);
        const auto t0 = std::chrono::steady_clock::now();
        sx::Status s = loader.load(lo, nullptr);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s.code() != SX_ERR_CORRUPT || !std::strstr(s.message().c_str(), k.what))
            fail_msg("%s as the shard file: %s", k.what, s.ok() ? "loaded" : s.message().c_str());
        assert_true(secs < 5.0);
        assert_true(same_state(before, state_of(b.rk)));
        assert_int_equal(::remove(shard.c_str()), 0);
    }
    // The MANIFEST as a link to a good one elsewhere: refused too, by the load and by
    // sx_read_user_blob.
    assert_int_equal(::rename(moved.c_str(), shard.c_str()), 0);
    const std::string manifest = dir + "/ck/MANIFEST", other = dir + "/MANIFEST.elsewhere";
    assert_int_equal(::rename(manifest.c_str(), other.c_str()), 0);
    assert_int_equal(::symlink(other.c_str(), manifest.c_str()), 0);
    sx::Status s = loader.load(lo, nullptr);
    assert_int_equal(s.code(), SX_ERR_CORRUPT);
    assert_non_null(std::strstr(s.message().c_str(), "symbolic link"));
    char blob[16];
    uint64_t size = 0;
    assert_int_equal(sx_read_user_blob(lo.path.c_str(), blob, sizeof blob, &size), SX_ERR_CORRUPT);
    assert_non_null(std::strstr(sx_last_error_message(), "symbolic link"));
    // Put back as a regular file, it loads.
    assert_int_equal(::remove(manifest.c_str()), 0);
    assert_int_equal(::rename(other.c_str(), manifest.c_str()), 0);
    assert_true(loader.load(lo, nullptr).ok());
    remove_tree(dir);
}

void test_damaged_shard_files_never_load_wrong(void **) {
    // A flipped bit in every byte of a tiny checkpoint's shard file, and truncation at
    // many offsets: each load either fails with SX_ERR_CORRUPT and changes nothing or,
    // where the damage hit only the alignment gaps between chunks, loads exactly the
    // saved state. Never a crash, never a silent wrong load.
    const std::string dir = make_tmpdir();
    Tiny a("ck-damage-a");
    sx::ckpt::Checkpointer ck(a.h->impl.get(), sx::io::posix_file_ops());
    sx::ckpt::SaveOptions so;
    so.path = dir + "/ck";
    assert_true(ck.save(so).ok());
    const std::string saved = a.state();
    const std::string shard = dir + "/ck/" + sx::ckpt::shard_file_name(0, 1);
    const std::string original = read_file(shard);
    assert_true(original.size() > 2 * sx::ckpt::kChunkAlignment);
    Tiny b("ck-damage-b");
    const std::string before = b.state();
    sx::ckpt::Checkpointer loader(b.h->impl.get(), sx::io::posix_file_ops());
    sx::ckpt::LoadOptions lo;
    lo.path = dir + "/ck";
    int detected = 0;
    for (size_t i = 0; i < original.size(); ++i) {
        // Every byte of every chunk; one byte in 61 of the gaps between them.
        const bool in_chunk = i % sx::ckpt::kChunkAlignment < 32;
        if (!in_chunk && i % 61 != 0) continue;
        std::string bytes = original;
        bytes[i] = static_cast<char>(bytes[i] ^ (1 << (i % 8)));
        write_file(shard, bytes);
        sx::Status s = loader.load(lo, nullptr);
        if (s.ok()) {
            if (in_chunk || b.state() != saved) fail_msg("byte %zu flipped: it loaded", i);
        } else {
            if (s.code() != SX_ERR_CORRUPT) fail_msg("byte %zu flipped: %s", i, s.message().c_str());
            if (b.state() != before) fail_msg("byte %zu flipped: the failed load changed the group", i);
            ++detected;
        }
    }
    assert_true(detected >= 96);
    // Every byte of the file's index (its chunk table, after the last chunk): the
    // MANIFEST's CRC32C of it refuses each flip.
    const uint64_t index = sxtest::shard_data_bytes(dir + "/ck", 0);
    assert_true(index > 0 && index < original.size());
    for (size_t i = index; i < original.size(); ++i) {
        std::string bytes = original;
        bytes[i] = static_cast<char>(bytes[i] ^ (1 << (i % 8)));
        write_file(shard, bytes);
        sx::Status s = loader.load(lo, nullptr);
        if (s.code() != SX_ERR_CORRUPT || !std::strstr(s.message().c_str(), "its index fails its CRC32C check"))
            fail_msg("index byte %zu flipped: %s", i - index, s.ok() ? "loaded" : s.message().c_str());
        if (b.state() != before) fail_msg("index byte %zu flipped: the failed load changed the group", i - index);
    }
    for (size_t cut = 0; cut < original.size(); cut += 97) {
        write_file(shard, original.substr(0, cut));
        sx::Status s = loader.load(lo, nullptr);
        if (s.code() != SX_ERR_CORRUPT) fail_msg("truncated at %zu: %s", cut, s.ok() ? "loaded" : s.message().c_str());
    }
    write_file(shard, original);
    assert_true(loader.load(lo, nullptr).ok());
    assert_true(b.state() == saved);
    remove_tree(dir);
}

void test_non_fp32_tensors_are_refused(void **) {
    // A valid manifest whose param is stored as fp16 (a later writer could make one):
    // this build must refuse it by name, not read fp16 bytes as fp32.
    const std::string dir = make_tmpdir();
    Tiny a("ck-f16-a");
    sx::ckpt::Checkpointer ck(a.h->impl.get(), sx::io::posix_file_ops());
    sx::ckpt::SaveOptions so;
    so.path = dir + "/ck";
    assert_true(ck.save(so).ok());
    const std::string bytes = read_file(so.path + "/MANIFEST");
    sx::ckpt::Manifest m;
    assert_true(sx::ckpt::decode_manifest(bytes.data(), bytes.size(), &m).ok());
    const std::string shard = read_file(so.path + "/" + m.files[0]);
    for (sx::ckpt::Tensor &t : m.params[0].tensors) {
        if (t.kind != sx::ckpt::TensorKind::kParam) continue;
        t.dtype = SX_DTYPE_F16;
        for (sx::ckpt::Chunk &c : t.chunks) {
            c.length = (c.end - c.begin) * 2;
            c.crc32c = sx::io::crc32c(shard.data() + c.offset, c.length);
        }
    }
    std::string out;
    sx::Status e = sx::ckpt::encode_manifest(m, &out);
    if (!e.ok()) fail_msg("encode: %s", e.message().c_str());
    write_file(so.path + "/MANIFEST", out);
    Tiny b("ck-f16-b");
    const std::string before = b.state();
    sx::ckpt::Checkpointer loader(b.h->impl.get(), sx::io::posix_file_ops());
    sx::ckpt::LoadOptions lo;
    lo.path = so.path;
    sx::Status s = loader.load(lo, nullptr);
    assert_int_equal(s.code(), SX_ERR_UNSUPPORTED);
    assert_non_null(std::strstr(s.message().c_str(), "tiny"));
    assert_true(b.state() == before);
    remove_tree(dir);
}

// The copy into staging runs after sx_save_optim_state has returned: the group's writers
// of the shard wait for it, so what is saved is the state at the call, even when the
// next step (or a broadcast) comes before the copy.
void test_step_waits_for_the_snapshot_copy(void **) {
    const std::string dir = make_tmpdir();
    Single a("fence-a"), b("fence-b");
    assert_string_equal(a.error.c_str(), "");
    assert_string_equal(b.error.c_str(), "");
    sx::ckpt::Checkpointer ca(a.rk.g, sx::io::posix_file_ops()), cb(b.rk.g, sx::io::posix_file_ops());
    sx::ckpt::SaveOptions so;
    so.path = dir + "/deferred";
    sx::ckpt::Snapshot snap;
    assert_true(ca.snapshot(so, &snap).ok());

    // A step on another thread must not update the shard before the copy.
    std::atomic<bool> stepped{false};
    std::string step_error;
    std::thread stepper([&] {
        step_error = train(a.rk, 3, 1);
        stepped = true;
    });
    // The file is written as the copy goes: nothing of it before.
    sx::ckpt::StagedBytes staged;
    sx::ckpt::SaveFuture progress;
    sx::Status persisted;
    std::thread persister([&] { persisted = ca.persist(snap, &progress, &staged); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const bool early = stepped.load();
    const uint64_t written_early = progress.done_bytes();
    ca.stage(&snap, &staged);
    stepper.join();
    persister.join();
    assert_false(early);
    assert_int_equal(written_early, 0);
    assert_string_equal(step_error.c_str(), "");
    assert_true(persisted.ok());
    assert_int_equal(progress.done_bytes(), progress.total_bytes());

    // Equal to a synchronous save of the twin group at the same step, and the step did
    // happen afterwards (the live state moved on).
    so.path = dir + "/sync";
    assert_true(cb.save(so).ok());
    const std::string shard = "/shard-00000-of-00001.bin";
    assert_true(read_file(dir + "/deferred" + shard) == read_file(dir + "/sync" + shard));
    assert_false(same_state(state_of(a.rk), state_of(b.rk)));
    assert_true(train(b.rk, 3, 1).empty());
    assert_true(same_state(state_of(a.rk), state_of(b.rk)));

    // A copy that fails (on a device) fails the save, which leaves no checkpoint.
    so.path = dir + "/unstaged";
    sx::ckpt::Snapshot never;
    assert_true(ca.snapshot(so, &never).ok());
    sx::ckpt::StagedBytes failed;
    failed.advance(4096);
    failed.finish(SX_ERROR(SX_ERR_IO, "the copy out of the device failed"));
    const sx::Status s = ca.persist(never, nullptr, &failed);
    assert_int_equal(s.code(), SX_ERR_IO);
    assert_non_null(std::strstr(s.message().c_str(), "the copy out of the device failed"));
    assert_int_not_equal(access(so.path.c_str(), F_OK), 0);
    assert_int_not_equal(access((so.path + ".sx-partial").c_str(), F_OK), 0);
    remove_tree(dir);
}

void test_every_world_size_pair(void **) {
    const std::string dir = make_tmpdir();
    const int sizes[] = {1, 2, 3, 4, 8};
    for (int a : sizes)
        for (int b : sizes) save_then_load(a, b, dir);
    remove_tree(dir);
}

// On a filesystem that keeps no directory locks (NFS), an unfinished save is taken for
// a dead process's only once neither it nor any file in it changed for
// ckpt::kUnlockedPartialQuietMs; a directory that is gone already is no error. The
// temporary file of `latest` that a crashed write left goes by the same rule.
void test_unfinished_saves_without_locks_wait_until_quiet(void **) {
    class NoLocks final : public sx::io::FaultFileOps {
      public:
        NoLocks() : FaultFileOps(sx::io::posix_file_ops()) {}
        sx::Status lock_directory(const std::string &, int *fd, LockState *state) override {
            *fd = -1;
            *state = LockState::kUnsupported;
            return sx::Status::Ok();
        }
    } ops;
    const std::string dir = make_tmpdir(), partial = dir + "/step-5.sx-partial";
    assert_int_equal(mkdir(partial.c_str(), 0755), 0);
    assert_true(sxtest::write_file(partial + "/shard-00000-of-00002.bin", "being written"));
    bool removed = true;
    assert_true(sx::ckpt::clear_unfinished(ops, partial, &removed).ok());
    assert_false(removed);
    assert_true(file_exists(partial + "/shard-00000-of-00002.bin"));
    // Quiet for longer than the wait, the directory and its file: a dead save's.
    const time_t quiet = time(nullptr) - static_cast<time_t>(sx::ckpt::kUnlockedPartialQuietMs / 1000) - 5;
    const struct timespec then[2] = {{quiet, 0}, {quiet, 0}};
    assert_int_equal(utimensat(AT_FDCWD, (partial + "/shard-00000-of-00002.bin").c_str(), then, 0), 0);
    assert_true(sx::ckpt::clear_unfinished(ops, partial, &removed).ok());
    assert_false(removed);  // the directory itself changed recently
    assert_int_equal(utimensat(AT_FDCWD, partial.c_str(), then, 0), 0);
    assert_true(sx::ckpt::clear_unfinished(ops, partial, &removed).ok());
    assert_true(removed);
    assert_false(file_exists(partial));
    assert_true(sx::ckpt::clear_unfinished(ops, partial, &removed).ok());
    assert_false(removed);

    // A save clears an old temporary file of `latest`, and keeps a fresh one (a live
    // writer's, in another process).
    const std::string old_tmp = dir + "/latest.tmp.999.3", fresh_tmp = dir + "/latest.tmp.998.0";
    assert_true(sxtest::write_file(old_tmp, "step-1\n"));
    assert_true(sxtest::write_file(fresh_tmp, "step-2\n"));
    assert_int_equal(utimensat(AT_FDCWD, old_tmp.c_str(), then, 0), 0);
    Single g("ck-nolocks");
    assert_true(g.error.empty());
    sx::ckpt::Checkpointer ck(g.rk.g, sx::io::posix_file_ops());
    sx::ckpt::SaveOptions so;
    so.path = dir + "/step-7";
    assert_true(ck.save(so).ok());
    assert_false(file_exists(old_tmp));
    assert_true(file_exists(fresh_tmp));
    assert_string_equal(read_file(dir + "/latest").c_str(), "step-7\n");
    remove_tree(dir);
}

}  // namespace

// Ranks as processes over tcp://: 3 save asynchronously while they train on, 2 load
// (another unit split) and train the same steps; their params must equal those of the
// run that never stopped, which rank 0 of the savers writes to DIR/reference.
void test_processes_over_tcp(void **) {
    const std::string dir = make_tmpdir();
    std::string err = sxtest::run_process_ranks(3, {"--role", "save", "--dir", dir}, 120);
    if (!err.empty()) fail_msg("saving on 3 processes: %s", err.c_str());
    assert_true(file_exists(dir + "/ck/MANIFEST"));
    err = sxtest::run_process_ranks(2, {"--role", "load", "--dir", dir}, 120);
    if (!err.empty()) fail_msg("loading on 2 processes: %s", err.c_str());
    remove_tree(dir);
}

std::string flatten(const std::vector<std::vector<float>> &params) {
    std::string out;
    for (const auto &p : params) out.append(reinterpret_cast<const char *>(p.data()), p.size() * sizeof(float));
    return out;
}

// Child process role of test_processes_over_tcp.
std::string child_role(const sxtest::ChildArgs &args) {
    const std::string role = args.get("--role", ""), dir = args.get("--dir", "");
    Rank rk;
    std::string e = setup(args.rendezvous, args.rank, args.world, role == "load", &rk);
    if (!e.empty()) return e;
    const std::string path = dir + "/ck";
    if (role == "save") {
        init_params(rk);
        e = train(rk, 1, 3);
        sx_future_t *f = nullptr;
        if (e.empty()) {
            sx_save_options_t so;
            sx_save_options_init(&so, sizeof so);
            so.path = path.c_str();
            if (sx_save_optim_state(rk.h, &so, &f) != SX_OK) e = err_text("save");
        }
        if (e.empty()) e = train(rk, 4, 3);
        if (e.empty() && sx_future_wait(f, -1) != SX_OK) e = std::string("save: ") + sx_future_error_message(f);
        sx_future_destroy(f);
        if (e.empty() && args.rank == 0 && !sxtest::write_file(dir + "/reference", flatten(params_of(rk))))
            e = "cannot write the reference";
    } else {
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = path.c_str();
        if (sx_load_optim_state(rk.h, &lo) != SX_OK) e = err_text("load");
        if (e.empty()) e = train(rk, 4, 3);
        if (e.empty() && flatten(params_of(rk)) != read_file(dir + "/reference"))
            e = "the params after loading and training on differ from the run that never stopped";
    }
    sx_destroy_shard_group(rk.h);
    return e;
}

int child_main(int argc, char **argv) {
    sxtest::ChildArgs args;
    if (!sxtest::parse_child_args(argc, argv, &args)) return 2;
    const std::string e = child_role(args);
    if (e.empty()) return 0;
    std::fprintf(stderr, "rank %d: %s\n", args.rank, e.c_str());
    return 1;
}

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_world_size_pair),
        cmocka_unit_test(test_processes_over_tcp),
        cmocka_unit_test(test_step_waits_for_the_snapshot_copy),
        cmocka_unit_test(test_params_only_and_mismatches_change_nothing),
        cmocka_unit_test(test_corrupt_chunk_is_detected_and_changes_nothing),
        cmocka_unit_test(test_chunks_in_a_row_are_read_by_one_call),
        cmocka_unit_test(test_a_load_opens_only_the_files_it_reads),
        cmocka_unit_test(test_a_failed_rank_fails_its_peers_at_once),
        cmocka_unit_test(test_a_partial_load_keeps_the_step_counts_consistent),
        cmocka_unit_test(test_crash_at_every_call_of_a_retention),
        cmocka_unit_test(test_only_regular_files_are_read),
        cmocka_unit_test(test_a_failure_on_one_rank_changes_nothing_on_any),
        cmocka_unit_test(test_ranks_saving_to_different_paths_commit_nothing),
        cmocka_unit_test(test_a_stalled_peer_does_not_hold_a_save),
        cmocka_unit_test(test_a_failed_file_call_at_every_point_of_a_load),
        cmocka_unit_test(test_an_exception_while_reading_fails_the_load),
        cmocka_unit_test(test_crash_at_every_io_call),
        cmocka_unit_test(test_damaged_shard_files_never_load_wrong),
        cmocka_unit_test(test_non_fp32_tensors_are_refused),
        cmocka_unit_test(test_unfinished_saves_without_locks_wait_until_quiet),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
