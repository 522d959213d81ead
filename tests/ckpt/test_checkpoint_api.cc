// Checkpoints through the public API: asynchronous saves and their futures, a save
// taken while steps continue against a synchronous one at the same step, retention and
// `latest`, the user blob, cancellation, and bad arguments.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sx/sx.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"
#include "test_files.h"
#include "test_groups.h"
#include "vector_state_check.h"

namespace {

const int64_t kShape[2] = {512, 257};  // about 0.5 MB of params, 1.5 MB of AdamW state

std::string make_tmpdir() { return sxtest::make_tmpdir("ckpt-api"); }
using sxtest::read_file;
using sxtest::remove_tree;

sx_shard_group_t *make_group(const std::string &name) {
    sx_shard_group_t *g = sxtest::one_rank_group(name, {{"w", {kShape[0], kShape[1]}}});
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    sx_param_view(g, 0, &v);
    for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = static_cast<float>(i % 97) / 97.0f;
    return g;
}

void steps(sx_shard_group_t *g, int first, int n) {
    for (int s = first; s < first + n; ++s) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        sx_grad_view(g, 0, &v);
        for (uint64_t i = 0; i < v.numel; ++i)
            static_cast<float *>(v.data)[i] += static_cast<float>(static_cast<int>((i * 31 + s * 7) % 17) - 8) / 16.0f;
        assert_int_equal(sx_step(g, nullptr, nullptr), SX_OK);
    }
}

std::vector<float> params_of(sx_shard_group_t *g) {
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    sx_param_view(g, 0, &v);
    const float *d = static_cast<const float *>(v.data);
    return std::vector<float>(d, d + v.numel);
}

struct CallbackLog {
    std::atomic<int> calls{0};
    std::atomic<int> status{-1};
    std::thread::id thread;
};

void on_done(sx_future_t *, sx_status_t status, void *user) {
    CallbackLog *log = static_cast<CallbackLog *>(user);
    log->thread = std::this_thread::get_id();
    log->status = status;
    log->calls++;
}

void test_async_save_while_training_equals_sync_save(void **) {
    const std::string dir = make_tmpdir();
    sx_shard_group_t *a = make_group("api-async-a"), *b = make_group("api-async-b");
    steps(a, 1, 2);
    steps(b, 1, 2);
    CallbackLog log;
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    const std::string pa = dir + "/async", pb = dir + "/sync";
    so.path = pa.c_str();
    so.user_blob = "epoch=3";
    so.user_blob_size = 7;
    so.callback = on_done;
    so.callback_user = &log;
    sx_future_t *fa = nullptr;
    assert_int_equal(sx_save_optim_state(a, &so, &fa), SX_OK);
    steps(a, 3, 2);  // training goes on while the save persists
    assert_int_equal(sx_future_wait(fa, -1), SX_OK);
    int32_t done = 0;
    assert_int_equal(sx_future_poll(fa, &done), SX_OK);
    assert_int_equal(done, 1);
    uint64_t written = 0, total = 0;
    assert_int_equal(sx_future_progress(fa, &written, &total), SX_OK);
    assert_true(total >= 4ull * 512 * 257 * 3);
    assert_int_equal(written, total);
    assert_string_equal(sx_future_error_message(fa), "");
    assert_int_equal(log.calls.load(), 1);
    assert_int_equal(log.status.load(), SX_OK);
    assert_true(log.thread != std::this_thread::get_id());
    assert_int_equal(sx_future_destroy(fa), SX_OK);
    // The staging memory stays for the next save, and is counted.
    sx_memory_stats_t ms;
    sx_memory_stats_init(&ms, sizeof ms);
    assert_int_equal(sx_get_memory_stats(a, &ms), SX_OK);
    assert_true(ms.staging_bytes >= total);

    so.path = pb.c_str();
    so.callback = nullptr;
    so.synchronous = 1;
    sx_future_t *fb = nullptr;
    assert_int_equal(sx_save_optim_state(b, &so, &fb), SX_OK);
    assert_int_equal(sx_future_poll(fb, &done), SX_OK);
    assert_int_equal(done, 1);
    assert_int_equal(sx_future_wait(fb, 0), SX_OK);
    sx_future_destroy(fb);

    // The shard files are byte for byte the same; so is what loads from them.
    const std::string shard = "/shard-00000-of-00001.bin";
    const std::string bytes_a = read_file(pa + shard);
    assert_true(bytes_a.size() > 0);
    assert_true(bytes_a == read_file(pb + shard));
    sx_shard_group_t *c = make_group("api-async-c"), *d = make_group("api-async-d");
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = pa.c_str();
    assert_int_equal(sx_load_optim_state(c, &lo), SX_OK);
    lo.path = pb.c_str();
    assert_int_equal(sx_load_optim_state(d, &lo), SX_OK);
    assert_true(params_of(c) == params_of(d));
    steps(c, 3, 2);
    steps(d, 3, 2);
    assert_true(params_of(c) == params_of(d));
    // ... and equals the run that saved asynchronously and went on.
    assert_true(params_of(c) == params_of(a));

    char blob[16];
    uint64_t size = 0;
    assert_int_equal(sx_read_user_blob(pa.c_str(), blob, sizeof blob, &size), SX_OK);
    assert_int_equal(size, 7);
    assert_memory_equal(blob, "epoch=3", 7);
    assert_int_equal(sx_read_user_blob(pa.c_str(), blob, 3, &size), SX_ERR_INVALID_ARGUMENT);
    assert_int_equal(size, 7);
    for (sx_shard_group_t *g : {a, b, c, d}) sx_destroy_shard_group(g);
    remove_tree(dir);
}

// After sx_future_wait_staged the trainer may write params through views: the
// checkpoint keeps the values of the call.
void test_params_written_after_staging_are_not_saved(void **) {
    const std::string dir = make_tmpdir();
    sx_shard_group_t *a = make_group("api-staged-a");
    steps(a, 1, 2);
    const std::vector<float> before = params_of(a);
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    const std::string path = dir + "/ck";
    so.path = path.c_str();
    sx_future_t *f = nullptr;
    assert_int_equal(sx_save_optim_state(a, &so, &f), SX_OK);
    assert_int_equal(sx_future_wait_staged(f, -1), SX_OK);
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    assert_int_equal(sx_param_view(a, 0, &v), SX_OK);
    for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = -7.0f;
    assert_int_equal(sx_future_wait(f, -1), SX_OK);
    // Staged implies nothing more to wait for once complete, with a zero timeout too.
    assert_int_equal(sx_future_wait_staged(f, 0), SX_OK);
    sx_future_destroy(f);
    assert_int_equal(sx_future_wait_staged(nullptr, 0), SX_ERR_INVALID_HANDLE);

    sx_shard_group_t *b = make_group("api-staged-b");
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    assert_int_equal(sx_load_optim_state(b, &lo), SX_OK);
    assert_true(params_of(b) == before);
    sx_destroy_shard_group(a);
    sx_destroy_shard_group(b);
    remove_tree(dir);
}

// Every param's gradient depends on its name's first letter and the step only.
void train_named(sx_shard_group_t *g, int first, int n) {
    int32_t count = 0;
    sx_get_num_params(g, &count);
    for (int s = first; s < first + n; ++s) {
        for (int32_t p = 0; p < count; ++p) {
            sx_param_info_t info;
            sx_param_info_init(&info, sizeof info);
            sx_get_param_info(g, p, &info);
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            sx_grad_view(g, p, &v);
            for (uint64_t i = 0; i < v.numel; ++i)
                static_cast<float *>(v.data)[i] = static_cast<float>(static_cast<int>((i * 13 + s * 5 + info.name[0]) % 11) - 5) / 8.0f;
        }
        assert_int_equal(sx_step(g, nullptr, nullptr), SX_OK);
    }
}

std::vector<float> values_of(sx_shard_group_t *g, const char *name) {
    int32_t p = -1;
    assert_int_equal(sx_find_param(g, name, &p), SX_OK);
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    sx_param_view(g, p, &v);
    const float *d = static_cast<const float *>(v.data);
    return std::vector<float>(d, d + v.numel);
}

// A group of params "a" (100) and "b" (50), trained 2 steps, saved into `path`.
sx_shard_group_t *saved_ab(const std::string &tag, const std::string &path) {
    sx_shard_group_t *g = sxtest::one_rank_group(tag, {{"a", {100}}, {"b", {50}}});
    train_named(g, 1, 2);
    sxtest::save_sync(g, path);
    return g;
}

// Missing and extra params are errors that name the param and change nothing; allowed,
// the params the checkpoint has load (values and optimizer state), and the others keep
// theirs, even in the middle of a unit.
void test_missing_and_extra_params(void **) {
    const std::string dir = make_tmpdir();
    const std::string path = dir + "/ck";
    sx_shard_group_t *a = saved_ab("api-miss-a", path);

    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    // "c" sits between "a" and "b" in the same flat buffer.
    sx_shard_group_t *b = sxtest::one_rank_group("api-miss-b", {{"a", {100}}, {"c", {30}}, {"b", {50}}});
    train_named(b, 7, 3);
    const std::vector<float> c_before = values_of(b, "c"), a_before = values_of(b, "a");
    assert_int_equal(sx_load_optim_state(b, &lo), SX_ERR_NOT_FOUND);
    assert_non_null(std::strstr(sx_last_error_message(), "'c'"));
    assert_true(values_of(b, "a") == a_before);
    lo.flags = SX_LOAD_ALLOW_MISSING;
    assert_int_equal(sx_load_optim_state(b, &lo), SX_OK);
    assert_true(values_of(b, "a") == values_of(a, "a"));
    assert_true(values_of(b, "b") == values_of(a, "b"));
    assert_true(values_of(b, "c") == c_before);
    // The optimizer state came too: the same steps from here give the same values.
    train_named(a, 3, 2);
    train_named(b, 3, 2);
    assert_true(values_of(b, "a") == values_of(a, "a"));
    assert_true(values_of(b, "b") == values_of(a, "b"));
    assert_true(values_of(b, "c") != c_before);

    sx_shard_group_t *c = sxtest::one_rank_group("api-miss-c", {{"a", {100}}});
    lo.flags = 0;
    assert_int_equal(sx_load_optim_state(c, &lo), SX_ERR_MISMATCH);
    assert_non_null(std::strstr(sx_last_error_message(), "'b'"));
    lo.flags = SX_LOAD_ALLOW_EXTRA;
    assert_int_equal(sx_load_optim_state(c, &lo), SX_OK);
    for (sx_shard_group_t *g : {a, b, c}) sx_destroy_shard_group(g);
    remove_tree(dir);
}

sx_memory_stats_t memory_stats(sx_shard_group_t *g) {
    sx_memory_stats_t ms;
    sx_memory_stats_init(&ms, sizeof ms);
    assert_int_equal(sx_get_memory_stats(g, &ms), SX_OK);
    return ms;
}

uint64_t optimizer_bytes(sx_shard_group_t *g) { return memory_stats(g).optimizer_bytes; }

// Frozen params have no optimizer state. A load that fails after reading leaves them
// without (not even zeroed slots are allocated); one that succeeds brings the
// checkpoint's state, and a param of the same unit that the checkpoint lacks gets the
// zero state a new slot holds: trained on, each follows a group that never stopped.
void test_load_into_a_frozen_unit(void **) {
    const std::string dir = make_tmpdir();
    const std::string path = dir + "/ck";
    sx_shard_group_t *a = saved_ab("api-frozen-a", path);
    sx_shard_group_t *b =
        sxtest::one_rank_group("api-frozen-b", {{"a", {100}, true}, {"c", {30}, true}, {"b", {50}, true}});
    assert_int_equal(optimizer_bytes(b), 0);

    const std::string shard = path + "/shard-00000-of-00001.bin";
    const std::string original = read_file(shard);
    std::string damaged = original;
    damaged[damaged.size() - 1] = static_cast<char>(damaged[damaged.size() - 1] ^ 1);
    assert_true(sxtest::write_file(shard, damaged));
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    lo.flags = SX_LOAD_ALLOW_MISSING;
    const std::vector<float> a_before = values_of(b, "a");
    assert_int_equal(sx_load_optim_state(b, &lo), SX_ERR_CORRUPT);
    assert_int_equal(optimizer_bytes(b), 0);
    assert_true(values_of(b, "a") == a_before);

    assert_true(sxtest::write_file(shard, original));
    assert_int_equal(sx_load_optim_state(b, &lo), SX_OK);
    assert_true(optimizer_bytes(b) > 0);
    assert_true(values_of(b, "a") == values_of(a, "a"));
    for (int32_t p = 0; p < 3; ++p) assert_int_equal(sx_set_trainable(b, p, 1), SX_OK);
    sx_shard_group_t *c = sxtest::one_rank_group("api-frozen-c", {{"c", {30}}});
    train_named(a, 3, 2);
    train_named(b, 3, 2);
    train_named(c, 3, 2);
    assert_true(values_of(b, "a") == values_of(a, "a"));
    assert_true(values_of(b, "b") == values_of(a, "b"));
    assert_true(values_of(b, "c") == values_of(c, "c"));
    for (sx_shard_group_t *g : {a, b, c}) sx_destroy_shard_group(g);
    remove_tree(dir);
}

sx_status_t load(sx_shard_group_t *g, const std::string &path) {
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    return sx_load_optim_state(g, &lo);
}

// A load after a successful one keeps the optimizer state it replaced, to stage the
// next load in: counted in staging_bytes, reused rather than grown. The first load keeps
// nothing of the kind (a trainer loads once, then trains). Loads in a row through them
// (one failing in between) are exact: trained on, the group follows the one that saved.
// SX_GROUP_RESERVE_CHECKPOINT_STAGING: sx_finalize holds the staging of this rank's
// file, sized for AdamW's two states though none exists yet, and the saves that follow
// (before and after the first step) use it without growing it; without the flag the
// staging appears with the first save.
void test_finalize_reserves_the_staging(void **) {
    const std::string dir = make_tmpdir();
    for (bool reserve : {false, true}) {
        sx_group_config_t cfg;
        sx_group_config_init(&cfg, sizeof cfg);
        cfg.backend = SX_BACKEND_CPU;
        const std::string rv = "local://api-reserve-" + std::to_string(reserve) + "-" + std::to_string(getpid());
        cfg.rendezvous = rv.c_str();
        cfg.world_size = 1;
        cfg.num_threads = 1;
        cfg.flags = reserve ? SX_GROUP_RESERVE_CHECKPOINT_STAGING : 0;
        sx_shard_group_t *g = nullptr;
        assert_int_equal(sx_create_shard_group(&cfg, &g), SX_OK);
        sx_param_group_desc_t adamw;
        sx_param_group_desc_init(&adamw, sizeof adamw, SX_OPTIM_ADAMW);
        assert_int_equal(sx_add_param_group(g, &adamw, nullptr), SX_OK);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = "w", d.ndim = 2, d.shape = kShape;
        assert_int_equal(sx_add_param(g, &d, nullptr), SX_OK);
        assert_int_equal(sx_finalize(g), SX_OK);
        const uint64_t reserved = memory_stats(g).staging_bytes;
        const std::string first = dir + "/first-" + std::to_string(reserve), later = dir + "/later-" + std::to_string(reserve);
        sxtest::save_sync(g, first);
        steps(g, 1, 1);
        sxtest::save_sync(g, later);
        const uint64_t needed = sxtest::shard_data_bytes(later, 0);  // values and both states
        assert_true(needed > 0);
        if (reserve) {
            assert_int_equal(reserved, needed);
            assert_int_equal(memory_stats(g).staging_bytes, reserved);
        } else {
            assert_int_equal(reserved, 0);
            assert_int_equal(memory_stats(g).staging_bytes, needed);
        }
        sx_destroy_shard_group(g);
    }
    remove_tree(dir);
}

// A save releases them and keeps its own staging alone.
void test_loads_in_a_row_reuse_their_staging(void **) {
    const std::string dir = make_tmpdir();
    const std::string pa = dir + "/a", pb = dir + "/b", pc = dir + "/c", pg = dir + "/g";
    const std::string shard = "/shard-00000-of-00001.bin";
    sx_shard_group_t *a = make_group("api-spare-a"), *b = make_group("api-spare-b"), *g = make_group("api-spare-g");
    steps(a, 1, 2);
    steps(b, 1, 3);
    steps(g, 1, 1);
    sxtest::save_sync(a, pa);
    sxtest::save_sync(b, pb);
    sxtest::save_sync(b, pc);
    std::string damaged = read_file(pc + shard);
    const uint64_t last = sxtest::shard_data_bytes(pc, 0) - 1;  // the last chunk's last byte
    assert_true(last < damaged.size());
    damaged[last] = static_cast<char>(damaged[last] ^ 1);
    assert_true(sxtest::write_file(pc + shard, damaged));
    assert_int_equal(load(g, pa), SX_OK);
    assert_true(memory_stats(g).staging_bytes < optimizer_bytes(g));
    assert_int_equal(load(g, pb), SX_OK);
    assert_true(params_of(g) == params_of(b));
    const uint64_t staged = memory_stats(g).staging_bytes;
    assert_true(staged >= optimizer_bytes(g) + params_of(g).size() * sizeof(float));
    assert_int_equal(load(g, pc), SX_ERR_CORRUPT);
    assert_true(params_of(g) == params_of(b));
    assert_int_equal(load(g, pa), SX_OK);
    assert_int_equal(memory_stats(g).staging_bytes, staged);
    steps(a, 3, 2);
    steps(g, 3, 2);
    assert_true(params_of(g) == params_of(a));
    sxtest::save_sync(g, pg);
    assert_int_equal(memory_stats(g).staging_bytes, sxtest::shard_data_bytes(pg, 0));
    for (sx_shard_group_t *x : {a, b, g}) sx_destroy_shard_group(x);
    remove_tree(dir);
}

void test_retention_and_latest(void **) {
    const std::string dir = make_tmpdir();
    sx_shard_group_t *g = make_group("api-retention");
    for (int i = 0; i < 4; ++i) {
        steps(g, i + 1, 1);
        const std::string p = dir + "/step-" + std::to_string(i);
        sx_save_options_t so;
        sx_save_options_init(&so, sizeof so);
        so.path = p.c_str();
        so.keep_last = 2;
        sx_future_t *f = nullptr;
        assert_int_equal(sx_save_optim_state(g, &so, &f), SX_OK);
        assert_int_equal(sx_future_wait(f, -1), SX_OK);
        sx_future_destroy(f);
        assert_string_equal(read_file(dir + "/latest").c_str(), ("step-" + std::to_string(i) + "\n").c_str());
    }
    assert_int_equal(access((dir + "/step-0").c_str(), F_OK), -1);
    assert_int_equal(access((dir + "/step-1").c_str(), F_OK), -1);
    assert_int_equal(access((dir + "/step-2/MANIFEST").c_str(), F_OK), 0);
    assert_int_equal(access((dir + "/step-3/MANIFEST").c_str(), F_OK), 0);
    sx_destroy_shard_group(g);
    remove_tree(dir);
}

// The caller's thread gets its wide vector registers back clean from every call that
// checks CRCs on it (a synchronous save, a load, sx_read_user_blob) and from a step: a
// trainer's SSE code after them runs at full speed.
void test_calls_leave_the_vector_state_clean(void **) {
    if (sxtest::upper_halves_in_use() < 0) {
        print_message("this processor cannot report its vector state (XGETBV with ECX = 1)\n");
        skip();
    }
    const std::string dir = make_tmpdir();
    sx_shard_group_t *g = make_group("api-vector-state");
    steps(g, 1, 1);
    assert_int_equal(sxtest::upper_halves_in_use(), 0);
    const std::string path = dir + "/ck";
    sxtest::save_sync(g, path);
    assert_int_equal(sxtest::upper_halves_in_use(), 0);
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    lo.path = path.c_str();
    assert_int_equal(sx_load_optim_state(g, &lo), SX_OK);
    assert_int_equal(sxtest::upper_halves_in_use(), 0);
    uint64_t size = 1;
    char blob[8];
    assert_int_equal(sx_read_user_blob(path.c_str(), blob, sizeof blob, &size), SX_OK);
    assert_int_equal(sxtest::upper_halves_in_use(), 0);
    sx_destroy_shard_group(g);
    remove_tree(dir);
}

// A directory whose name sx keeps for something else is refused by a load and by
// sx_read_user_blob, saying what the name is: an unfinished save's (here a whole
// checkpoint renamed so, as a save killed after writing its MANIFEST leaves one), and
// `latest`, the file naming the newest checkpoint.
void test_reserved_names_are_not_read(void **) {
    const std::string dir = make_tmpdir();
    sx_shard_group_t *g = make_group("api-reserved-read");
    steps(g, 1, 1);
    sxtest::save_sync(g, dir + "/ck");
    const std::vector<float> before = params_of(g);
    const std::string partial = dir + "/ck2.sx-partial";
    assert_int_equal(std::system(("cp -r '" + dir + "/ck' '" + partial + "'").c_str()), 0);
    for (const std::string &path : {partial, partial + "/", dir + "/latest"}) {
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = path.c_str();
        assert_int_equal(sx_load_optim_state(g, &lo), SX_ERR_INVALID_ARGUMENT);
        const std::string msg = sx_last_error_message();
        const bool says = msg.find(path.find("latest") != std::string::npos ? "naming the newest checkpoint"
                                                                             : "a save that has not committed") !=
                          std::string::npos;
        if (!says) fail_msg("loading %s: %s", path.c_str(), msg.c_str());
        char blob[4];
        uint64_t size = 0;
        assert_int_equal(sx_read_user_blob(path.c_str(), blob, sizeof blob, &size), SX_ERR_INVALID_ARGUMENT);
    }
    assert_true(params_of(g) == before);
    sx_destroy_shard_group(g);
    remove_tree(dir);
}

void test_cancel_commits_nothing_or_everything(void **) {
    const std::string dir = make_tmpdir();
    sx_shard_group_t *g = make_group("api-cancel");
    steps(g, 1, 1);
    const std::string p = dir + "/cancelled";
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    so.path = p.c_str();
    sx_future_t *f = nullptr;
    assert_int_equal(sx_save_optim_state(g, &so, &f), SX_OK);
    assert_int_equal(sx_future_cancel(f), SX_OK);
    const sx_status_t s = sx_future_wait(f, -1);
    if (s == SX_ERR_CANCELLED) {
        assert_int_equal(access((p + "/MANIFEST").c_str(), F_OK), -1);
        assert_true(std::strlen(sx_future_error_message(f)) > 0);
    } else {
        assert_int_equal(s, SX_OK);  // it finished before it noticed
        assert_int_equal(access((p + "/MANIFEST").c_str(), F_OK), 0);
    }
    sx_future_destroy(f);
    sx_destroy_shard_group(g);
    remove_tree(dir);
}

void test_bad_arguments(void **) {
    sx_shard_group_t *g = make_group("api-ckpt-bad");
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    sx_future_t *f = nullptr;
    assert_int_equal(sx_save_optim_state(g, nullptr, &f), SX_ERR_INVALID_ARGUMENT);
    assert_int_equal(sx_save_optim_state(g, &so, &f), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "path"));
    so.path = "/tmp/never-written";
    assert_int_equal(sx_save_optim_state(g, &so, nullptr), SX_ERR_INVALID_ARGUMENT);
    so.keep_last = -1;
    assert_int_equal(sx_save_optim_state(g, &so, &f), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "keep_last"));
    so.keep_last = 0;
    so.user_blob_size = 5;
    assert_int_equal(sx_save_optim_state(g, &so, &f), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "user_blob"));
    assert_null(f);
    assert_int_equal(sx_save_optim_state(nullptr, &so, &f), SX_ERR_INVALID_HANDLE);
    int32_t done;
    assert_int_equal(sx_future_poll(nullptr, &done), SX_ERR_INVALID_HANDLE);
    sx_future_t *garbage = reinterpret_cast<sx_future_t *>(&done);
    assert_int_equal(sx_future_wait(garbage, 0), SX_ERR_INVALID_HANDLE);
    assert_int_equal(sx_future_destroy(nullptr), SX_OK);
    sx_load_options_t lo;
    sx_load_optim_state_options_init(&lo, sizeof lo);
    assert_int_equal(sx_load_optim_state(g, &lo), SX_ERR_INVALID_ARGUMENT);
    lo.path = "/tmp";
    lo.flags = 0x80;
    assert_int_equal(sx_load_optim_state(g, &lo), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "flags"));
    lo.flags = 0;
    lo.path = "/nonexistent/sx/checkpoint";
    assert_int_equal(sx_load_optim_state(g, &lo), SX_ERR_NOT_FOUND);
    assert_non_null(std::strstr(sx_last_error_message(), "MANIFEST"));
    sx_destroy_shard_group(g);
}

// A save whose parent directory is missing, or is a file, fails in the call itself (the
// asynchronous one too, not at its wait), naming the parent, and writes nothing; the
// group saves fine afterwards.
void test_a_missing_parent_fails_the_save_at_once(void **) {
    const std::string dir = make_tmpdir();
    sx_shard_group_t *g = make_group("api-ckpt-parent");
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    const std::string missing = dir + "/no-such-dir", ck = missing + "/step-1";
    so.path = ck.c_str();
    for (int32_t sync = 0; sync <= 1; ++sync) {
        so.synchronous = sync;
        sx_future_t *f = nullptr;
        assert_int_equal(sx_save_optim_state(g, &so, &f), SX_ERR_NOT_FOUND);
        assert_null(f);
        const char *msg = sx_last_error_message();
        if (!std::strstr(msg, ("parent directory '" + missing + "' does not exist").c_str()))
            fail_msg("message: %s", msg);
        assert_int_equal(access(missing.c_str(), F_OK), -1);
    }
    const std::string file = dir + "/a-file", under_file = file + "/step-1";
    sxtest::write_file(file, "x");
    so.path = under_file.c_str();
    sx_future_t *f = nullptr;
    assert_int_equal(sx_save_optim_state(g, &so, &f), SX_ERR_INVALID_ARGUMENT);
    assert_null(f);
    if (!std::strstr(sx_last_error_message(), ("'" + file + "' is not a directory").c_str()))
        fail_msg("message: %s", sx_last_error_message());
    assert_string_equal(read_file(file).c_str(), "x");
    const std::string good = dir + "/step-1";
    so.path = good.c_str();
    so.synchronous = 0;
    assert_int_equal(sx_save_optim_state(g, &so, &f), SX_OK);
    assert_int_equal(sx_future_wait(f, -1), SX_OK);
    sx_future_destroy(f);
    assert_int_equal(access((good + "/MANIFEST").c_str(), F_OK), 0);
    sx_destroy_shard_group(g);
    remove_tree(dir);
}

sx_status_t save_at(sx_shard_group_t *g, const std::string &path) {
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    so.path = path.c_str();
    sx_future_t *f = nullptr;
    sx_status_t s = sx_save_optim_state(g, &so, &f);
    if (s == SX_OK) s = sx_future_wait(f, -1);
    sx_future_destroy(f);
    return s;
}

// An unfinished save that a live process holds (its rank 0 locks the directory, here
// flock(2) on a descriptor of the test's own, as another process's sx would) is left
// alone by every other save in the directory; one whose process died (no lock) is
// cleared. A save into the same checkpoint as the live one is refused, naming it.
void test_a_live_save_of_another_process_is_left_alone(void **) {
    const std::string dir = make_tmpdir();
    const std::string live = dir + "/other.sx-partial", dead = dir + "/crashed.sx-partial";
    assert_int_equal(mkdir(live.c_str(), 0755), 0);
    assert_int_equal(mkdir(dead.c_str(), 0755), 0);
    assert_true(sxtest::write_file(live + "/shard-00000-of-00001.bin", "being written"));
    assert_true(sxtest::write_file(dead + "/shard-00000-of-00001.bin", "left by a crash"));
    const int held = open(live.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(held >= 0);
    assert_int_equal(flock(held, LOCK_EX | LOCK_NB), 0);

    sx_shard_group_t *g = make_group("api-live-partial");
    steps(g, 1, 1);
    assert_int_equal(save_at(g, dir + "/step-1"), SX_OK);
    assert_int_equal(access((dir + "/step-1/MANIFEST").c_str(), F_OK), 0);
    assert_string_equal(read_file(live + "/shard-00000-of-00001.bin").c_str(), "being written");
    assert_int_equal(access(dead.c_str(), F_OK), -1);

    // The same checkpoint as the live save: refused, and the live one untouched.
    assert_int_equal(save_at(g, dir + "/other"), SX_ERR_ALREADY_EXISTS);
    const std::string msg = sx_last_error_message();
    if (msg.find("another save into the checkpoint directory " + dir + "/other is under way") == std::string::npos ||
        msg.find(live) == std::string::npos)
        fail_msg("message: %s", msg.c_str());
    assert_string_equal(read_file(live + "/shard-00000-of-00001.bin").c_str(), "being written");
    assert_int_equal(access((dir + "/other").c_str(), F_OK), -1);

    // Its process gone (the lock released): the next save clears it.
    close(held);
    steps(g, 2, 1);
    assert_int_equal(save_at(g, dir + "/step-2"), SX_OK);
    assert_int_equal(access(live.c_str(), F_OK), -1);
    assert_int_equal(access((dir + "/step-2/MANIFEST").c_str(), F_OK), 0);
    sx_destroy_shard_group(g);
    remove_tree(dir);
}

// Two jobs (groups of their own) saving into one directory at the same time: each
// save's rank 0 clears the unfinished saves it finds there, and never the other's
// save under way. Every save commits, and each loads back into its own group.
void test_two_jobs_save_into_one_directory_at_once(void **) {
    const std::string dir = make_tmpdir();
    const int kSaves = 12;
    sx_shard_group_t *g[2] = {make_group("api-two-jobs-a"), make_group("api-two-jobs-b")};
    sx_status_t failed[2] = {SX_OK, SX_OK};
    std::string messages[2];
    std::vector<std::thread> jobs;
    for (int j = 0; j < 2; ++j)
        jobs.emplace_back([&, j] {
            for (int i = 0; i < kSaves && failed[j] == SX_OK; ++i) {
                steps(g[j], i + 1, 1);
                failed[j] = save_at(g[j], dir + "/job" + std::to_string(j) + "-" + std::to_string(i));
                if (failed[j] != SX_OK) messages[j] = sx_last_error_message();
            }
        });
    for (std::thread &t : jobs) t.join();
    for (int j = 0; j < 2; ++j)
        if (failed[j] != SX_OK) fail_msg("job %d's save failed: %s", j, messages[j].c_str());
    for (int j = 0; j < 2; ++j) {
        const std::vector<float> last = params_of(g[j]);
        steps(g[j], kSaves + 1, 1);
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        const std::string p = dir + "/job" + std::to_string(j) + "-" + std::to_string(kSaves - 1);
        lo.path = p.c_str();
        assert_int_equal(sx_load_optim_state(g[j], &lo), SX_OK);
        assert_true(params_of(g[j]) == last);
        for (int i = 0; i < kSaves; ++i)
            assert_int_equal(
                access((dir + "/job" + std::to_string(j) + "-" + std::to_string(i) + "/MANIFEST").c_str(), F_OK), 0);
    }
    sx_destroy_shard_group(g[0]);
    sx_destroy_shard_group(g[1]);
    remove_tree(dir);
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_save_while_training_equals_sync_save),
        cmocka_unit_test(test_params_written_after_staging_are_not_saved),
        cmocka_unit_test(test_missing_and_extra_params),
        cmocka_unit_test(test_load_into_a_frozen_unit),
        cmocka_unit_test(test_loads_in_a_row_reuse_their_staging),
        cmocka_unit_test(test_finalize_reserves_the_staging),
        cmocka_unit_test(test_retention_and_latest),
        cmocka_unit_test(test_cancel_commits_nothing_or_everything),
        cmocka_unit_test(test_calls_leave_the_vector_state_clean),
        cmocka_unit_test(test_reserved_names_are_not_read),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_a_missing_parent_fails_the_save_at_once),
        cmocka_unit_test(test_a_live_save_of_another_process_is_left_alone),
        cmocka_unit_test(test_two_jobs_save_into_one_directory_at_once),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
