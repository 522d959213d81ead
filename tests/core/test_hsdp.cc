// HSDP: a group of W ranks as a 2-D mesh of shard groups of shard_size ranks that each
// shard the model, replicated W / shard_size times. Meshes 2x2, 1x4 and 4x1 (flat) at
// stages 1-3, plain and pipelined, follow the unsharded reference at world size 4, every
// rank bit-identical to the others (replicas too) and to a repeat of the run, and, with no
// clipping (whose norm is summed over other pieces), bit-identical to the flat group. The
// 16-bit pre-divide factor (FSDP's), checkpoints written once per shard and resharded
// across meshes, stages and world sizes, a rank killed in either dimension, bad meshes
// refused on every rank, and the mesh reported per unit.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "base/half.h"
#include "ckpt/directory.h"
#include "core/group.h"
#include "io/file_ops.h"
#include "process_ranks.h"
#include "run_ranks.h"
#include "step_scenario.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"
#include "test_files.h"

using sxtest::Scenario;

namespace {

using Params = std::vector<std::vector<float>>;
using sxtest::run_threads;

// Runs sc: every rank's params bit-identical to rank 0's, and rank 0's to the unsharded
// reference to 1e-6. Rank 0's params.
Params run_checked(const Scenario &sc, const std::string &name) {
    std::vector<Params> got;
    std::string err = run_threads(sc, name, &got);
    if (!err.empty()) fail_msg("%s: %s", name.c_str(), err.c_str());
    err = sxtest::compare(got[0], sxtest::reference_run(sc), 1e-6);
    if (!err.empty()) fail_msg("%s against the reference: %s", name.c_str(), err.c_str());
    for (size_t r = 1; r < got.size(); ++r) {
        err = sxtest::compare(got[r], got[0], 0.0);
        if (!err.empty()) fail_msg("%s: rank %zu differs from rank 0: %s", name.c_str(), r, err.c_str());
    }
    return got[0];
}

std::string tag(const char *what, int shard, int stage, int variant) {
    return std::string(what) + "-m" + std::to_string(shard) + "-s" + std::to_string(stage) + "-v" +
           std::to_string(variant);
}

// At world size 4, meshes 2x2, 1x4 and 4x1, stages 1-3, plain, pipelined (units signalled
// ready, deferred gathers; stage 3 gathers around every unit), with micro-batches,
// clipping and freezing.
void test_meshes_follow_the_reference(void **) {
    for (int stage = 1; stage <= 3; ++stage) {
        for (int variant = 0; variant < 3; ++variant) {
            Scenario sc = sxtest::two_group_scenario(variant == 2 ? SX_OPTIM_SGD : SX_OPTIM_ADAMW);
            sc.world = 4;
            sc.stage = stage;
            sc.steps = 8;
            if (variant == 2) sc.trainable = sxtest::freeze_schedule;
            if (variant >= 1) {
                sc.overlap = true;
                sc.defer_gather = stage < 3;
                sc.gather_units = true;
            }
            Params flat;
            for (int shard : {4, 2, 1}) {
                Scenario m = sc;
                m.shard_size = shard;
                const Params got = run_checked(m, tag("mesh", shard, stage, variant));
                // The same bits again: nothing depends on timing.
                const Params again = run_checked(m, tag("again", shard, stage, variant));
                std::string err = sxtest::compare(again, got, 0.0);
                if (!err.empty()) fail_msg("shard %d stage %d: a repeat differs: %s", shard, stage, err.c_str());
                if (shard == 4) flat = got;
            }
            // Without clipping, the mesh's updates are the flat group's, bit for bit.
            Scenario nc = sc;
            nc.max_grad_norm = 0.0;
            nc.shard_size = 4;
            const Params flat_nc = run_checked(nc, tag("noclip-flat", 4, stage, variant));
            for (int shard : {2, 1}) {
                nc.shard_size = shard;
                const Params got = run_checked(nc, tag("noclip", shard, stage, variant));
                std::string err = sxtest::compare(got, flat_nc, 0.0);
                if (!err.empty())
                    fail_msg("shard %d stage %d variant %d, no clipping: differs from the flat group: %s", shard, stage,
                             variant, err.c_str());
            }
        }
    }
}

// Six ranks: 3x2 and 2x3, stage 2 pipelined and stage 3.
void test_six_ranks(void **) {
    for (int shard : {3, 2}) {
        for (int stage : {2, 3}) {
            Scenario sc = sxtest::two_group_scenario(SX_OPTIM_ADAM);
            sc.world = 6;
            sc.stage = stage;
            sc.steps = 6;
            sc.shard_size = shard;
            sc.overlap = true;
            sc.gather_units = true;
            sc.defer_gather = stage < 3;
            run_checked(sc, tag("six", shard, stage, 0));
        }
    }
}

// sx_get_unit_info reports the mesh; each shard group's shards tile the unit, and the
// replicas of a shard own the same range.
void test_unit_info_reports_the_mesh(void **) {
    Scenario sc = sxtest::two_group_scenario(SX_OPTIM_ADAMW);
    sc.world = 4;
    sc.shard_size = 2;
    sc.steps = 1;
    std::vector<sx_unit_info_t> info(4);
    sc.after_setup = [&](sx_shard_group_t *g, int rank) -> std::string {
        sx_unit_info_t &i = info[static_cast<size_t>(rank)];
        sx_unit_info_init(&i, sizeof i);
        return sx_get_unit_info(g, 0, &i) == SX_OK ? "" : "sx_get_unit_info";
    };
    std::vector<Params> got;
    std::string err = run_threads(sc, "info", &got);
    if (!err.empty()) fail_msg("%s", err.c_str());
    for (int r = 0; r < 4; ++r) {
        const sx_unit_info_t &i = info[static_cast<size_t>(r)];
        assert_int_equal(i.shard_size, 2);
        assert_int_equal(i.replicas, 2);
        assert_int_equal(i.shard_rank, r % 2);
        assert_int_equal(i.replica_rank, r / 2);
        assert_int_equal(i.padded_numel, 2 * i.shard_numel);
        assert_int_equal(i.shard_begin, static_cast<uint64_t>(r % 2) * i.shard_numel);
    }
}

// FSDP's factor for these rank counts, as torch 2.15 computes it
// (torch.distributed.algorithms._comm_hooks.default_hooks.DefaultState.
// _get_gradient_predivide_factor).
void test_predivide_factor_is_fsdps(void **) {
    const int n[] = {1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 96, 1024, 4096};
    const int f[] = {1, 2, 2, 2, 4, 4, 4, 4, 8, 8, 16, 32, 64};
    for (size_t k = 0; k < sizeof n / sizeof n[0]; ++k) {
        if (sx::core::fsdp_predivide_factor(n[k]) != f[k])
            fail_msg("%d ranks: factor %d, FSDP's is %d", n[k], sx::core::fsdp_predivide_factor(n[k]), f[k]);
    }
}

// One fp16 param of 64 elements, SGD with lr 1, at world size 4 as a 2x2 mesh, fp16
// gradients summed in fp16 within each shard group: every rank's gradient is g; the
// param after one step, widened.
std::string fp16_step(float g, double factor, std::vector<float> *out) {
    const std::string rv = "local://predivide-" + std::to_string(getpid()) + "-" + std::to_string(g) + "-" +
                           std::to_string(factor);
    std::vector<std::vector<float>> after(4);
    std::string err = sxtest::run_ranks(4, [&](int r) -> std::string {
        sx_group_config_t cfg;
        sx_group_config_init(&cfg, sizeof cfg);
        cfg.backend = SX_BACKEND_CPU;
        cfg.rendezvous = rv.c_str();
        cfg.rank = r;
        cfg.world_size = 4;
        cfg.shard_size = 2;
        cfg.num_threads = 1;
        cfg.grad_predivide_factor = factor;
        sx_shard_group_t *grp = nullptr;
        if (sx_create_shard_group(&cfg, &grp) != SX_OK) return std::string("create: ") + sx_last_error_message();
        sx_param_group_desc_t sgd;
        sx_param_group_desc_init(&sgd, sizeof sgd, SX_OPTIM_SGD);
        sgd.lr = 1.0;
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        const int64_t shape[1] = {64};
        d.name = "w";
        d.ndim = 1;
        d.shape = shape;
        d.dtype = SX_DTYPE_F16;
        std::string e;
        if (sx_add_param_group(grp, &sgd, nullptr) != SX_OK || sx_add_param(grp, &d, nullptr) != SX_OK ||
            sx_finalize(grp) != SX_OK)
            e = std::string("setup: ") + sx_last_error_message();
        sx_view_t gv;
        sx_view_init(&gv, sizeof gv);
        if (e.empty() && sx_grad_view(grp, 0, &gv) != SX_OK) e = "grad view";
        for (uint64_t i = 0; e.empty() && i < gv.numel; ++i) static_cast<uint16_t *>(gv.data)[i] = sx::half::f32_to_f16(g);
        if (e.empty() && sx_step(grp, nullptr, nullptr) != SX_OK) e = std::string("step: ") + sx_last_error_message();
        sx_view_t pv;
        sx_view_init(&pv, sizeof pv);
        if (e.empty() && sx_param_view(grp, 0, &pv) != SX_OK) e = "param view";
        for (uint64_t i = 0; e.empty() && i < pv.numel; ++i)
            after[static_cast<size_t>(r)].push_back(sx::half::f16_to_f32(static_cast<uint16_t *>(pv.data)[i]));
        sx_destroy_shard_group(grp);
        return e;
    });
    if (err.empty())
        for (int r = 1; r < 4; ++r)
            if (after[static_cast<size_t>(r)] != after[0]) err = "rank " + std::to_string(r) + " differs from rank 0";
    *out = after[0];
    return err;
}

// The factor divides the gradients before their 16-bit sum: 40000 + 40000 overflows fp16
// without it (factor 1) and not with FSDP's 2; 2^-20 underflows to 0 divided by 32 and
// not by 2. The mean gradient is applied exactly otherwise.
void test_predivide_factor_prevents_overflow_and_underflow(void **) {
    struct Case {
        float grad;
        double factor;
        float want;  // the param after a step from 0 (NaN: not finite)
    };
    const Case cases[] = {
        {40000.0f, 0.0, -40000.0f},
        {40000.0f, 2.0, -40000.0f},
        {40000.0f, 1.0, NAN},
        {std::ldexp(1.0f, -20), 0.0, -std::ldexp(1.0f, -20)},
        {std::ldexp(1.0f, -20), 32.0, 0.0f},
    };
    for (const Case &c : cases) {
        std::vector<float> after;
        std::string err = fp16_step(c.grad, c.factor, &after);
        if (!err.empty()) fail_msg("grad %g factor %g: %s", c.grad, c.factor, err.c_str());
        assert_int_equal(after.size(), 64);
        for (float v : after) {
            const bool ok = std::isnan(c.want) ? !std::isfinite(v) : v == c.want;
            if (!ok) fail_msg("grad %g factor %g: the param is %g, expected %g", c.grad, c.factor, v, c.want);
        }
    }
}

// The bytes of a checkpoint's shard files, and their number.
uint64_t directory_bytes(const std::string &dir, size_t *files) {
    uint64_t bytes = 0;
    *files = 0;
    for (const auto &e : std::filesystem::directory_iterator(dir)) {
        if (e.path().filename().string().compare(0, 6, "shard-") != 0) continue;
        bytes += e.file_size();
        ++*files;
    }
    return bytes;
}

// A 2x2 mesh writes what a flat group of 2 writes (its files, byte for byte in size), and
// its manifest records the mesh; the checkpoint then reshards: 2x2 at stage 2 (steps
// 1-4) -> 3 flat ranks at stage 1 (5-8) -> 3x2 at stage 3, pipelined (9-12), following
// the run that never stopped (whose average over 4, 3 and then 6 ranks rounds as the
// legs' does: every rank adds the same gradients) to 1e-6.
void test_checkpoints_across_meshes(void **) {
    const std::string dir = sxtest::make_tmpdir("hsdp-ckpt");
    Scenario sc = sxtest::two_group_scenario(SX_OPTIM_ADAMW);
    sc.same_grads_on_every_rank = true;
    sc.steps = 12;
    Scenario whole = sc;
    whole.world_of_step = [](int step) { return step <= 4 ? 4 : step <= 8 ? 3 : 6; };
    const Params want = sxtest::reference_run(whole);
    // The same state saved by a 2x2 mesh and by 2 flat ranks.
    {
        Scenario a = sc;
        a.steps = 4;
        a.world = 4;
        a.shard_size = 2;
        a.save_to = dir + "/mesh";
        run_checked(a, "ckpt-mesh");
        a.world = 2;
        a.shard_size = 0;
        a.save_to = dir + "/flat";
        run_checked(a, "ckpt-flat");
        size_t mesh_files = 0, flat_files = 0;
        const uint64_t mesh_bytes = directory_bytes(dir + "/mesh", &mesh_files);
        const uint64_t flat_bytes = directory_bytes(dir + "/flat", &flat_files);
        assert_int_equal(mesh_files, 2);
        assert_int_equal(flat_files, 2);
        assert_int_equal(mesh_bytes, flat_bytes);
        sx::ckpt::Manifest m;
        if (!sx::ckpt::read_manifest(*sx::io::posix_file_ops(), dir + "/mesh", &m).ok()) fail_msg("the mesh's manifest");
        assert_int_equal(m.world_size, 4);
        assert_int_equal(m.shard_size, 2);
        assert_int_equal(m.files.size(), 2);
    }
    const std::string err = sxtest::run_legs(sc, {{4, 2, 2, 1, 4}, {3, 0, 1, 5, 8}, {6, 3, 3, 9, 12}}, dir,
                                             "ckpt-legs-" + std::to_string(getpid()), want, 1e-6);
    if (!err.empty()) fail_msg("%s", err.c_str());
    sxtest::remove_tree(dir);
}

// Bad meshes fail sx_create_shard_group on every rank with an error naming the problem:
// a size that does not divide the world size, and ranks that ask for different meshes.
void test_bad_meshes_fail_every_rank(void **) {
    struct Case {
        int world;
        std::vector<int> shard;  // per rank
        sx_status_t code;
        const char *says;
    };
    const Case cases[] = {
        {4, {3, 3, 3, 3}, SX_ERR_INVALID_ARGUMENT, "shard_size 3 does not divide the world size 4"},
        {2, {4, 4}, SX_ERR_INVALID_ARGUMENT, "shard_size 4 does not divide the world size 2"},
        {4, {2, 2, 2, 4}, SX_ERR_MISMATCH, "shard_size"},
        {3, {3, 0, 1}, SX_ERR_MISMATCH, "shard_size"},
    };
    int k = 0;
    for (const Case &c : cases) {
        const std::string rv = "local://badmesh-" + std::to_string(getpid()) + "-" + std::to_string(k++);
        std::vector<sx_status_t> codes(static_cast<size_t>(c.world));
        std::vector<std::string> texts(static_cast<size_t>(c.world));
        sxtest::run_ranks(c.world, [&](int r) -> std::string {
            sx_group_config_t cfg;
            sx_group_config_init(&cfg, sizeof cfg);
            cfg.backend = SX_BACKEND_CPU;
            cfg.rendezvous = rv.c_str();
            cfg.rank = r;
            cfg.world_size = c.world;
            cfg.shard_size = c.shard[static_cast<size_t>(r)];
            cfg.timeout_ms = 20000;
            sx_shard_group_t *g = nullptr;
            codes[static_cast<size_t>(r)] = sx_create_shard_group(&cfg, &g);
            texts[static_cast<size_t>(r)] = sx_last_error_message();
            sx_destroy_shard_group(g);
            return "";
        });
        for (int r = 0; r < c.world; ++r) {
            if (codes[static_cast<size_t>(r)] != c.code || texts[static_cast<size_t>(r)].find(c.says) == std::string::npos)
                fail_msg("case %d rank %d: %s \"%s\"; expected %s naming \"%s\"", k - 1, r,
                         sx_status_string(codes[static_cast<size_t>(r)]), texts[static_cast<size_t>(r)].c_str(),
                         sx_status_string(c.code), c.says);
        }
    }
    // Settings refused before anything connects.
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.shard_size = -1;
    cfg.rendezvous = "local://negative";
    sx_shard_group_t *g = nullptr;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "shard_size -1"));
    cfg.shard_size = 0;
    cfg.grad_predivide_factor = 0.5;
    assert_int_equal(sx_create_shard_group(&cfg, &g), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "grad_predivide_factor"));
}

// ---------------------------------------------------------------------------------
// A rank killed (SIGKILL) in a 2x2 mesh during the second step, as processes over tcp://:
// rank 1 (rank 0's shard group: the reduce-scatter) or rank 2 (rank 0's replica group:
// the replicas' all-reduce). Every survivor fails with a clear error within the timeout.
// The processes run on one host, so every communicator shares memory; and again told
// they are on two hosts, {0, 1} and {2, 3} (SX_HOST_ID), where the shard groups share
// memory (each rank's log says so, once) and the world and the replica groups use TCP.

constexpr int kTimeoutMs = 4000;

int child_main(int argc, char **argv) {
    sxtest::ChildArgs args;
    if (!sxtest::parse_child_args(argc, argv, &args)) return 2;
    const int victim = std::atoi(args.get("--victim", "1").c_str());
    const bool pipelined = args.get("--pipelined", "0") == "1";
    const bool hosts = args.get("--hosts", "0") == "1";
    if (hosts) ::setenv("SX_HOST_ID", ("host-" + std::to_string(args.rank / 2)).c_str(), 1);
    static int shared = 0;        // communicators that said they share memory
    static int hierarchical = 0;  // ... or that they combine on each host, then across
    sx_set_log_callback(
        [](int32_t, const char *message, void *) {
            if (std::strstr(message, "exchanges through shared memory")) ++shared;
            if (std::strstr(message, "through TCP with its host peers")) ++hierarchical;
        },
        nullptr, SX_LOG_DEBUG);
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = args.rendezvous.c_str();
    cfg.rank = args.rank;
    cfg.world_size = args.world;
    cfg.shard_size = 2;
    cfg.timeout_ms = kTimeoutMs;
    cfg.num_threads = 1;
    sx_shard_group_t *g = nullptr;
    if (sx_create_shard_group(&cfg, &g) != SX_OK) {
        std::fprintf(stderr, "rank %d: create: %s\n", args.rank, sx_last_error_message());
        return 1;
    }
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    sx_add_param_group(g, &pg, nullptr);
    for (int u = 0; u < 2; ++u) {
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        const int64_t shape[1] = {100000};
        const std::string name = "w" + std::to_string(u);
        d.name = name.c_str();
        d.ndim = 1;
        d.shape = shape;
        d.unit = u;
        sx_add_param(g, &d, nullptr);
    }
    if (sx_finalize(g) != SX_OK) {
        std::fprintf(stderr, "rank %d: finalize: %s\n", args.rank, sx_last_error_message());
        return 1;
    }
    // One host: the world, the shard and the replica group share memory; two: the shard
    // group does, the world (2 hosts of 2) combines on each host and then across, and the
    // replica group (a rank on each host) is TCP alone.
    if (shared != (hosts ? 1 : 3) || hierarchical != (hosts ? 1 : 0)) {
        std::fprintf(stderr, "rank %d: %d communicators share memory and %d are hierarchical, expected %d and %d\n",
                     args.rank, shared, hierarchical, hosts ? 1 : 3, hosts ? 1 : 0);
        return 1;
    }
    for (int s = 0; s < 2; ++s) {
        const auto t0 = std::chrono::steady_clock::now();
        sx_status_t st = SX_OK;
        for (int32_t u = 1; u >= 0 && st == SX_OK; --u) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            sx_grad_view(g, u, &v);
            for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = 0.5f;
            if (s == 1 && args.rank == victim && u == 0) raise(SIGKILL);
            if (pipelined) st = sx_unit_grads_ready(g, u, nullptr);
        }
        if (st == SX_OK) st = sx_step(g, nullptr, nullptr);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s == 0 && st != SX_OK) {
            std::fprintf(stderr, "rank %d: the first step failed: %s\n", args.rank, sx_last_error_message());
            return 1;
        }
        if (s == 1) {
            if (st != SX_ERR_COMM && st != SX_ERR_TIMEOUT && st != SX_ERR_GROUP_FAILED) {
                std::fprintf(stderr, "rank %d: the step with a dead peer returned %s\n", args.rank,
                             sx_status_string(st));
                return 1;
            }
            if (std::string(sx_last_error_message()).empty()) {
                std::fprintf(stderr, "rank %d: no error message\n", args.rank);
                return 1;
            }
            if (secs > 3.0 * kTimeoutMs / 1000.0 + 5.0) {
                std::fprintf(stderr, "rank %d: the failure took %.1f s\n", args.rank, secs);
                return 1;
            }
        }
    }
    const auto t0 = std::chrono::steady_clock::now();
    sx_destroy_shard_group(g);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (secs > 10.0) {
        std::fprintf(stderr, "rank %d: destroy took %.1f s\n", args.rank, secs);
        return 1;
    }
    return 0;
}

void test_a_rank_killed_in_either_dimension(void **) {
    for (const char *victim : {"1", "2"}) {
        for (const char *pipelined : {"0", "1"}) {
            // Two hosts for one of the pipelined settings each.
            const char *hosts = (victim[0] == '1') == (pipelined[0] == '0') ? "1" : "0";
            std::vector<sxtest::ProcessResult> res;
            std::string err = sxtest::run_process_ranks(
                4, {"--victim", victim, "--pipelined", pipelined, "--hosts", hosts}, 90, &res);
            assert_int_equal(res.size(), 4);
            const int v = std::atoi(victim);
            for (int r = 0; r < 4; ++r) {
                if (r == v) {
                    assert_int_equal(res[static_cast<size_t>(r)].signal, SIGKILL);
                } else if (res[static_cast<size_t>(r)].exit_code != 0) {
                    fail_msg("victim %s pipelined %s: survivor %d: %s", victim, pipelined, r, err.c_str());
                }
            }
        }
    }
}

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meshes_follow_the_reference),
        cmocka_unit_test(test_six_ranks),
        cmocka_unit_test(test_unit_info_reports_the_mesh),
        cmocka_unit_test(test_predivide_factor_is_fsdps),
        cmocka_unit_test(test_predivide_factor_prevents_overflow_and_underflow),
        cmocka_unit_test(test_checkpoints_across_meshes),
        cmocka_unit_test(test_bad_meshes_fail_every_rank),
        cmocka_unit_test(test_a_rank_killed_in_either_dimension),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
