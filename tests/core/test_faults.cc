// A rank killed during a step, and one that stops responding: the survivors' calls
// return an error within the configured timeout, the group is marked failed, and
// destroying it returns.
#include "sx_cmocka.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "process_ranks.h"
#include "sx/sx.h"

namespace {

constexpr int kTimeoutMs = 2000;
constexpr int kSlackMs = 3000;

using Clock = std::chrono::steady_clock;

struct Rank {
    sx_shard_group_t *g = nullptr;
    float *grad = nullptr;
};

// A group with one AdamW param of 1000 elements.
sx_status_t setup(const std::string &rv, int rank, int world, Rank *out) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.timeout_ms = kTimeoutMs;
    cfg.num_threads = 1;
    sx_status_t s = sx_create_shard_group(&cfg, &out->g);
    if (s != SX_OK) return s;
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    if ((s = sx_add_param_group(out->g, &pg, nullptr)) != SX_OK) return s;
    sx_param_desc_t d;
    sx_param_desc_init(&d, sizeof d);
    int64_t shape[1] = {1000};
    d.name = "w";
    d.ndim = 1;
    d.shape = shape;
    if ((s = sx_add_param(out->g, &d, nullptr)) != SX_OK) return s;
    if ((s = sx_finalize(out->g)) != SX_OK) return s;
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    if ((s = sx_grad_view(out->g, 0, &v)) != SX_OK) return s;
    out->grad = static_cast<float *>(v.data);
    return SX_OK;
}

sx_status_t one_step(Rank *r) {
    for (int i = 0; i < 1000; ++i) r->grad[i] += 0.25f;
    return sx_step(r->g, nullptr, nullptr);
}

// A survivor: two good steps, then a step that must fail in time, then
// SX_ERR_GROUP_FAILED, then destroy. Returns "" or what was wrong.
std::string survivor(Rank *r) {
    for (int s = 0; s < 2; ++s)
        if (one_step(r) != SX_OK) return std::string("a good step failed: ") + sx_last_error_message();
    auto t0 = Clock::now();
    sx_status_t st = one_step(r);
    const long ms = static_cast<long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
    if (st != SX_ERR_TIMEOUT && st != SX_ERR_COMM)
        return std::string("the step after the peer's failure returned ") + sx_status_string(st);
    if (ms > kTimeoutMs + kSlackMs) return "the failing step took " + std::to_string(ms) + " ms";
    if (std::string(sx_last_error_message()).empty()) return "no error message";
    st = one_step(r);
    if (st != SX_ERR_GROUP_FAILED)
        return std::string("a step on a failed group returned ") + sx_status_string(st);
    auto t1 = Clock::now();
    sx_destroy_shard_group(r->g);
    r->g = nullptr;
    const long destroy_ms = static_cast<long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t1).count());
    if (destroy_ms > kTimeoutMs + kSlackMs) return "destroy took " + std::to_string(destroy_ms) + " ms";
    return "";
}

int child_main(int argc, char **argv) {
    sxtest::ChildArgs a;
    if (!sxtest::parse_child_args(argc, argv, &a)) return 2;
    const std::string mode = a.get("--mode", "");
    const int victim = std::atoi(a.get("--victim", "2").c_str());
    Rank r;
    if (setup(a.rendezvous, a.rank, a.world, &r) != SX_OK) {
        std::fprintf(stderr, "rank %d: setup failed: %s\n", a.rank, sx_last_error_message());
        return 3;
    }
    if (a.rank == victim) {
        for (int s = 0; s < 2; ++s)
            if (one_step(&r) != SX_OK) return 4;
        if (mode == "kill") raise(SIGKILL);
        // Stalled: never takes part in step 3; long after the survivors gave up, leave.
        std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs + 2 * kSlackMs));
        _exit(0);
    }
    std::string err = survivor(&r);
    if (!err.empty()) {
        std::fprintf(stderr, "rank %d: %s\n", a.rank, err.c_str());
        return 1;
    }
    return 0;
}

void run_fault(const char *mode, int victim) {
    std::vector<sxtest::ProcessResult> res;
    sxtest::run_process_ranks(3, {"--mode", mode, "--victim", std::to_string(victim)}, 60, &res);
    for (int r = 0; r < 3; ++r) {
        if (r == victim) {
            if (std::string(mode) == "kill") assert_int_equal(res[r].signal, SIGKILL);
            continue;
        }
        if (res[r].exit_code != 0) fail_msg("%s victim %d: survivor rank %d exited %d", mode, victim, r,
                                            res[r].exit_code);
    }
}

void test_killed_rank(void **) { run_fault("kill", 2); }
void test_killed_store_host(void **) { run_fault("kill", 0); }
void test_stalled_rank(void **) { run_fault("stall", 1); }

void test_stalled_thread_rank(void **) {
    // Ranks as threads over local://: rank 2 stops calling; the others time out.
    const int world = 3;
    std::string errs[world];
    Rank ranks[world];
    std::thread threads[world];
    bool survivors_done[world] = {false, false, false};
    for (int r = 0; r < world; ++r) {
        threads[r] = std::thread([&, r] {
            if (setup("local://stalled-threads", r, world, &ranks[r]) != SX_OK) {
                errs[r] = std::string("setup: ") + sx_last_error_message();
                return;
            }
            if (r == 2) {
                for (int s = 0; s < 2; ++s) one_step(&ranks[r]);
                std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs + kSlackMs));
                sx_destroy_shard_group(ranks[r].g);
                return;
            }
            errs[r] = survivor(&ranks[r]);
            survivors_done[r] = true;
        });
    }
    for (auto &t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
        if (!errs[r].empty()) fail_msg("rank %d: %s", r, errs[r].c_str());
        assert_true(survivors_done[r]);
    }
}

void test_abort_from_another_thread(void **) {
    // Rank 0 waits in a step for rank 1, which never comes; sx_abort from a third
    // thread ends the wait well before the timeout.
    Rank r0, r1;
    std::thread t1([&] { setup("local://abort", 1, 2, &r1); });
    assert_int_equal(setup("local://abort", 0, 2, &r0), SX_OK);
    t1.join();
    sx_status_t st = SX_OK;
    auto t0 = Clock::now();
    std::thread stepper([&] { st = one_step(&r0); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    assert_int_equal(sx_abort(r0.g), SX_OK);
    stepper.join();
    const long ms = static_cast<long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
    assert_true(st == SX_ERR_ABORTED || st == SX_ERR_COMM);
    assert_true(ms < kTimeoutMs);
    assert_int_equal(sx_step(r0.g, nullptr, nullptr), SX_ERR_GROUP_FAILED);
    sx_destroy_shard_group(r0.g);
    sx_destroy_shard_group(r1.g);
}

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_rank),
        cmocka_unit_test(test_killed_store_host),
        cmocka_unit_test(test_stalled_rank),
        cmocka_unit_test(test_stalled_thread_rank),
        cmocka_unit_test(test_abort_from_another_thread),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
