// Checkpoints of packed optimizer state (format 4.0): a group of 8-bit AdamW (params
// whose shards split at block boundaries that differ between world sizes, and one too
// small for 8 bits, which keeps fp32 state), of bf16 AdamW and of fp32 AdamW, saved by 2
// ranks (threads over local://) and loaded at other world sizes and stages. Codes and
// scales are copied as they are: a save right after the load holds the same bytes, and
// steps after it give what an uninterrupted run gives, bit for bit (the steps after the
// save have zero gradients, so that their maths does not depend on the world size). A
// group keeping another state dtype is refused, and so is a damaged packed chunk; a
// checkpoint without packed state is still format 3.0.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ckpt/directory.h"
#include "ckpt/manifest.h"
#include "ckpt/shard_index.h"
#include "io/file_ops.h"
#include "sx/sx.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"
#include "run_ranks.h"
#include "stored_tensors.h"
#include "test_files.h"
#include "packed_params.h"
#include "test_groups.h"

namespace {

using sx::ckpt::Manifest;
using sx::ckpt::TensorKind;

// Group 0: 8-bit; 1: bf16; 2: fp32. "small" keeps fp32 state in the 8-bit group.
const auto &kParams = sxtest::kPackedParams;
constexpr int kGradSteps = 3, kZeroSteps = 2;

std::string text(const char *what, sx_status_t st) {
    return std::string(what) + ": " + sx_status_string(st) + ": " + sx_last_error_message();
}

// What one rank does: make the group (state dtype `dtype0` for group 0), load `load`
// (if any), take `grad_steps` steps with rank 0's gradients, then `zero_steps` with none,
// then save into `save` (if any).
struct Run {
    int world = 2, stage = 2;
    int32_t dtype0 = SX_STATE_8BIT;
    std::string load, save;
    int grad_steps = 0, zero_steps = 0;
    sx_status_t load_status = SX_OK;  // what the load must return
    const char *load_message = nullptr;  // and say
};

std::string rank_main(const Run &run, const std::string &rv, int rank) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = run.world;
    cfg.stage = run.stage;
    cfg.num_threads = 1;
    sx_shard_group_t *g = nullptr;
    sx_status_t st = sx_create_shard_group(&cfg, &g);
    if (st != SX_OK) return text("create", st);
    std::string err = sxtest::add_packed_params(g, run.dtype0);
    if (!err.empty()) return err;
    if ((st = sx_finalize(g)) != SX_OK) err = text("finalize", st);
    if (err.empty() && !run.load.empty()) {
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = run.load.c_str();
        st = sx_load_optim_state(g, &lo);
        if (st != run.load_status) err = text("load", st);
        else if (run.load_message && !std::strstr(sx_last_error_message(), run.load_message))
            err = std::string("the load's error lacks '") + run.load_message + "': " + sx_last_error_message();
    }
    for (int s = 0; err.empty() && st == SX_OK && s < run.grad_steps + run.zero_steps; ++s) {
        for (int32_t p = 0; err.empty() && rank == 0 && s < run.grad_steps && p < 5; ++p) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            if ((st = sx_grad_view(g, p, &v)) != SX_OK) err = text("grad view", st);
            for (uint64_t i = 0; err.empty() && i < v.numel; ++i)
                static_cast<float *>(v.data)[i] =
                    0.001f * static_cast<float>(static_cast<int>((i * 7919 + 31 * p + 101 * s) % 2001) - 1000);
        }
        if (err.empty() && (st = sx_step(g, nullptr, nullptr)) != SX_OK) err = text("step", st);
    }
    if (err.empty() && st == SX_OK && !run.save.empty() && (st = sxtest::save_synchronously(g, run.save)) != SX_OK)
        err = text("save", st);
    sx_destroy_shard_group(g);
    return err;
}

void run_ranks(const Run &run, const std::string &tag) {
    const std::string rv = "local://packed-" + tag + "-" + std::to_string(getpid());
    const std::string err = sxtest::run_ranks(run.world, [&](int r) { return rank_main(run, rv, r); });
    if (!err.empty()) print_error("%s: %s\n", tag.c_str(), err.c_str());
    assert_true(err.empty());
}

using sxtest::expect_same_tensors;

// Every stored tensor of the checkpoint in `dir`, whole, by "param/kind", with its dtype.
sxtest::StoredTensors tensors_of(const std::string &dir, Manifest *out = nullptr) {
    return sxtest::stored_tensors(dir, out);
}

void test_save_and_load_across_layouts(void **) {
    const std::string dir = sxtest::make_tmpdir("packed-ckpt");
    Run ref;
    ref.grad_steps = kGradSteps;
    ref.zero_steps = kZeroSteps;
    ref.save = dir + "/ref";
    run_ranks(ref, "ref");
    Run saved = ref;
    saved.zero_steps = 0;
    saved.save = dir + "/saved";
    run_ranks(saved, "saved");

    // The packed tensors, in their dtypes: 4.0.
    Manifest m;
    const auto t = tensors_of(saved.save, &m);
    assert_int_equal(m.format_major, 4);
    assert_int_equal(m.format_minor, 0);
    const std::string exp_avg = std::to_string(static_cast<int>(TensorKind::kExpAvg));
    const std::string scales0 = std::to_string(static_cast<int>(TensorKind::kScales0));
    assert_int_equal(t.at("a/" + exp_avg).first, sx::ckpt::kDTypeQ8);
    assert_int_equal(t.at("a/" + exp_avg).second.size(), 64 * 128);
    assert_int_equal(t.at("a/" + scales0).second.size(), 64 * 128 / 256 * 4);
    assert_int_equal(t.at("small/" + exp_avg).first, SX_DTYPE_F32);
    assert_true(t.find("small/" + scales0) == t.end());
    assert_int_equal(t.at("c/" + exp_avg).first, SX_DTYPE_BF16);
    assert_int_equal(t.at("c/" + exp_avg).second.size(), 48 * 100 * 2);
    assert_int_equal(t.at("d/" + exp_avg).first, SX_DTYPE_F32);

    const struct {
        int world, stage;
    } layouts[] = {{3, 2}, {1, 1}, {2, 3}, {3, 3}};
    for (const auto &l : layouts) {
        const std::string tag = std::to_string(l.world) + "-" + std::to_string(l.stage);
        // Loaded and saved again at once: the same bytes (no requantization).
        Run again;
        again.world = l.world;
        again.stage = l.stage;
        again.load = saved.save;
        again.save = dir + "/again-" + tag;
        run_ranks(again, "again-" + tag);
        expect_same_tensors(saved.save, again.save);
        // Loaded and stepped on: what the run that never stopped has.
        Run resumed = again;
        resumed.zero_steps = kZeroSteps;
        resumed.save = dir + "/resumed-" + tag;
        run_ranks(resumed, "resumed-" + tag);
        expect_same_tensors(ref.save, resumed.save);
    }
    sxtest::remove_tree(dir);
}

void test_refusals(void **) {
    const std::string dir = sxtest::make_tmpdir("packed-refuse");
    Run saved;
    saved.world = 1;
    saved.grad_steps = 1;
    saved.save = dir + "/saved";
    run_ranks(saved, "refuse-saved");
    // Another state dtype for group 0: refused, naming the group and both dtypes.
    Run other;
    other.world = 1;
    other.dtype0 = SX_STATE_BF16;
    other.load = saved.save;
    other.load_status = SX_ERR_MISMATCH;
    other.load_message = "param group 0 keeps bf16 optimizer state here but 8-bit in the checkpoint";
    run_ranks(other, "refuse-dtype");
    // A damaged byte of an 8-bit chunk: its CRC32C refuses it.
    Manifest m;
    tensors_of(saved.save, &m);
    const sx::ckpt::Chunk *codes = nullptr;
    for (const sx::ckpt::ParamEntry &p : m.params)
        for (const sx::ckpt::Tensor &t : p.tensors)
            if (t.dtype == sx::ckpt::kDTypeQ8 && !codes) codes = &t.chunks[0];
    assert_non_null(codes);
    const std::string file = saved.save + "/" + m.files[codes->file];
    const int fd = open(file.c_str(), O_RDWR);
    assert_true(fd >= 0);
    char byte = 0;
    assert_int_equal(pread(fd, &byte, 1, static_cast<off_t>(codes->offset + 5)), 1);
    byte = static_cast<char>(byte ^ 0x40);
    assert_int_equal(pwrite(fd, &byte, 1, static_cast<off_t>(codes->offset + 5)), 1);
    close(fd);
    Run damaged;
    damaged.world = 1;
    damaged.load = saved.save;
    damaged.load_status = SX_ERR_CORRUPT;
    damaged.load_message = "CRC32C";
    run_ranks(damaged, "refuse-damaged");
    sxtest::remove_tree(dir);
}

// A group of fp32 state writes 3.0, as before packed state existed.
void test_fp32_state_stays_format_3(void **) {
    const std::string dir = sxtest::make_tmpdir("packed-fp32");
    sx_shard_group_t *g = sxtest::one_rank_group("packed-fp32", {{"w", {64, 64}}});
    assert_int_equal(sx_step(g, nullptr, nullptr), SX_OK);
    sxtest::save_sync(g, dir + "/c");
    sx_destroy_shard_group(g);
    Manifest m;
    tensors_of(dir + "/c", &m);
    assert_int_equal(m.format_major, 3);
    assert_int_equal(m.format_minor, 0);
    sxtest::remove_tree(dir);
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_and_load_across_layouts),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_fp32_state_stays_format_3),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
