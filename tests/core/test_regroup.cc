// Losing a rank and going on (sx_regroup): 4 ranks as processes over tcp:// on a store
// served by the sx-rendezvous command (with a token) train, saving a checkpoint before
// each step; one of them (rank 0, 1 or 3) SIGKILLs itself at a random moment of a step.
// The 3 survivors notice it through the failed call, regroup into 3 ranks loading the
// last committed checkpoint, and train to the end. Their final params must equal, bit
// for bit, those of 3 fresh ranks that load the same checkpoint and take the same
// steps; their sx_regroup result must name the checkpoint's step as the one they are at,
// and the ranks in the order of the previous ones. Flat groups at stages 1-3, and a
// 2 x 2 mesh (the 3 survivors fill no whole shard group of 2: they go on flat). And the
// misuse: no checkpoint, a regroup with the store gone.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "process_ranks.h"
#include "regroup_ranks.h"
#include "run_ranks.h"
#include "sx/sx.h"
#include "sx_cmocka.h"
#include "test_groups.h"

using namespace sxtest::regroup;

namespace {

// A rank of the 4-rank run: exit 0 = survived and wrote its result (new rank 0 writes
// the params), 3 = failed; the victim dies by SIGKILL.
int run_child(const sxtest::ChildArgs &a) {
    Child c;
    c.rank = a.rank;
    c.world = a.world;
    c.stage = std::stoi(a.get("--stage", "2"));
    c.memory_copies = std::stoi(a.get("--memory", "0"));
    c.offload = a.get("--device", "cpu") == "offload";
    c.cuda = a.get("--device", "cpu") == "cuda";
    c.state_dtype = std::stoi(a.get("--state-dtype", "0"));
    const bool wait = a.get("--wait", "0") == "1";
    if (wait) c.flags = SX_GROUP_MEMORY_COPY_WAIT;
    const std::string dir = a.get("--dir", "");
    const int victim = std::stoi(a.get("--victim", "-1"));
    const std::string rendezvous = a.get("--store", a.rendezvous);
    std::string err = c.create(rendezvous, std::stoi(a.get("--shard-size", "0")));
    if (!err.empty()) {
        std::fprintf(stderr, "rank %d: %s\n", a.rank, err.c_str());
        return 3;
    }
    sx_status_t st = c.init_params();
    int committed = -1;  // the last checkpoint every rank committed
    int s = 1, failed_step = 0;
    std::chrono::microseconds last_step{0};
    for (; st == SX_OK && s <= kSteps; ++s) {
        failed_step = s;
        if ((st = c.save(checkpoint(dir, s - 1))) != SX_OK) break;
        committed = s - 1;
        if (a.rank == victim && s == kKillStep) {
            // Dies at a random moment of this step: within the time the step before took.
            std::mt19937 rng(static_cast<uint32_t>(victim * 7919 + c.stage * 31));
            const int delay_us =
                std::uniform_int_distribution<int>(0, static_cast<int>(last_step.count()))(rng);
            std::fprintf(stderr, "rank %d: dies %d us into step %d (step %d took %lld us)\n", a.rank, delay_us, s,
                         s - 1, static_cast<long long>(last_step.count()));
            std::thread killer([delay_us] {
                std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
                raise(SIGKILL);
            });
            c.step(s);
            killer.join();
        }
        const auto t0 = std::chrono::steady_clock::now();
        st = c.step(s);
        last_step = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
    }
    if (st == SX_OK) {
        std::fprintf(stderr, "rank %d: finished every step though rank %d was killed at step %d\n", a.rank, victim,
                     kKillStep);
        return 3;
    }
    std::fprintf(stderr, "rank %d: step %d failed as rank %d died: %s (%s)\n", a.rank, failed_step, victim,
                 sx_status_string(st), sx_last_error_message());
    // Regroup from the last committed checkpoint.
    sx_regroup_options_t ro;
    sx_regroup_options_init(&ro, sizeof ro);
    const std::string from = checkpoint(dir, committed);
    ro.checkpoint = c.memory_copies ? nullptr : from.c_str();  // from memory: no checkpoint at all
    ro.expected_world_size = 3;
    ro.join_window_ms = 10000;
    sx_regroup_result_t rr;
    sx_regroup_result_init(&rr, sizeof rr);
    st = sx_regroup(c.g, &ro, &rr);
    if (a.get("--store-dies", "0") == "1") {
        // Rank 0 served the store: the survivors cannot agree, and are told why.
        const std::string why = sx_last_error_message();
        if (st != SX_OK && why.find("must outlive every rank") != std::string::npos) return 5;
        std::fprintf(stderr, "rank %d: regroup without the store: %s\n", a.rank, failed("regroup", st).c_str());
        return 3;
    }
    if (st != SX_OK) {
        std::fprintf(stderr, "rank %d: %s\n", a.rank, failed("regroup", st).c_str());
        return 3;
    }
    const int want_rank = a.rank - (a.rank > victim ? 1 : 0);
    // From memory: the copy of the last step every survivor finished, or of the one before
    // where the loss cut the sending of that step's copy short.
    // (failed_step - 1 is the last step this survivor finished; another may have finished
    // one fewer.)
    // With SX_GROUP_MEMORY_COPY_WAIT no step that returned here is lost.
    const uint64_t behind = wait ? 1 : 3;
    const bool step_ok = c.memory_copies ? rr.from_memory == 1 && rr.step + behind >= static_cast<uint64_t>(failed_step) &&
                                               rr.step <= static_cast<uint64_t>(failed_step)
                                         : rr.from_memory == 0 && rr.step == static_cast<uint64_t>(committed);
    if (rr.epoch != 1 || rr.world_size != 3 || rr.rank != want_rank || rr.previous_rank != a.rank ||
        rr.previous_world_size != 4 || rr.shard_size != 3 || !step_ok) {
        std::fprintf(stderr, "rank %d: regroup result epoch %d rank %d of %d (shard %d), was %d of %d, step %llu, "
                     "from memory %d; expected epoch 1, rank %d of 3 (shard 3), step %d (from memory: %d)\n",
                     a.rank, rr.epoch, rr.rank, rr.world_size, rr.shard_size, rr.previous_rank,
                     rr.previous_world_size, static_cast<unsigned long long>(rr.step), rr.from_memory, want_rank,
                     committed, c.memory_copies);
        return 3;
    }
    int32_t r = -1, w = -1;
    sx_get_rank(c.g, &r);
    sx_get_world_size(c.g, &w);
    if (r != rr.rank || w != 3) {
        std::fprintf(stderr, "rank %d: the group says rank %d of %d after the regroup\n", a.rank, r, w);
        return 3;
    }
    c.rank = rr.rank;
    c.world = rr.world_size;
    const int restored = static_cast<int>(rr.step);
    if (c.memory_copies)
        std::fprintf(stderr, "rank %d: step %d failed; restored step %d from memory: steps %d-%d are taken again\n",
                     a.rank, failed_step, restored, restored + 1, failed_step);
    for (s = restored + 1; s <= kSteps; ++s) {
        if ((st = c.step(s)) != SX_OK) {
            std::fprintf(stderr, "rank %d: %s\n", a.rank, failed("step after the regroup", st).c_str());
            return 3;
        }
    }
    std::vector<float> params;
    if ((st = c.read_params(&params)) != SX_OK) {
        std::fprintf(stderr, "rank %d: %s\n", a.rank, failed("read params", st).c_str());
        return 3;
    }
    if (c.rank == 0 && !write_floats(a.get("--out", ""), params, restored)) return 3;
    return 0;
}

// Growing back, 4 -> 3 -> 4: ranks 0-3 train with memory copies, --victim SIGKILLs
// itself in step 5, the other 3 regroup from memory; a 5th process (rank 4 here) has been
// waiting to join all along. The 3 poll until they see it, save a checkpoint of that step
// (the reference's, nothing else reads it), and admit it: the 4 then train to the end.
// Exit 0, new rank 0 writing its params and the step of the join.
int grow_child(const sxtest::ChildArgs &a) {
    Child c;
    c.stage = std::stoi(a.get("--stage", "2"));
    c.memory_copies = 1;
    const std::string dir = a.get("--dir", "");
    const std::string rendezvous = a.get("--store", a.rendezvous);
    const int victim = std::stoi(a.get("--victim", "1"));
    sx_regroup_options_t ro;
    sx_regroup_options_init(&ro, sizeof ro);
    sx_regroup_result_t rr;
    sx_regroup_result_init(&rr, sizeof rr);
    auto fail_with = [&](const std::string &what) {
        std::fprintf(stderr, "%s %d: %s\n", a.rank == 4 ? "joiner" : "rank", a.rank, what.c_str());
        return 3;
    };
    if (a.rank == 4) {
        // The joiner: registers as the members do, then waits to be admitted.
        c.flags = SX_GROUP_JOIN;
        std::string err = c.create(rendezvous, 0);
        if (!err.empty()) return fail_with(err);
        sx_status_t st = sx_step(c.g, nullptr, nullptr);
        if (st != SX_ERR_INVALID_STATE) return fail_with("a joining group stepped before its admission");
        ro.join_window_ms = 10000;
        if ((st = sx_regroup(c.g, &ro, &rr)) != SX_OK) return fail_with(failed("join", st));
        if (rr.previous_rank != -1 || rr.rank != 3 || rr.world_size != 4 || rr.previous_world_size != 3 ||
            rr.from_memory != 1)
            return fail_with(format_result(rr));
        c.rank = rr.rank;
        c.world = rr.world_size;
        for (int s = static_cast<int>(rr.step) + 1; s <= kSteps; ++s)
            if ((st = c.step(s)) != SX_OK) return fail_with(failed("step after joining", st));
        std::vector<float> params;  // collective at stage 3 (the units are gathered)
        if ((st = c.read_params(&params)) != SX_OK) return fail_with(failed("read params", st));
        return 0;
    }
    c.rank = a.rank;
    c.world = 4;
    std::string err = c.create(rendezvous, 0);
    if (!err.empty()) return fail_with(err);
    sx_status_t st = c.init_params();
    int s = 1;
    for (; st == SX_OK && s <= kSteps; ++s) {
        if (a.rank == victim && s == kKillStep) {
            std::thread killer([] {
                std::this_thread::sleep_for(std::chrono::microseconds(300));
                raise(SIGKILL);
            });
            c.step(s);
            killer.join();
        }
        st = c.step(s);
    }
    if (st == SX_OK) return fail_with("finished every step though a rank was killed");
    ro.expected_world_size = 3;
    ro.join_window_ms = 10000;
    if ((st = sx_regroup(c.g, &ro, &rr)) != SX_OK || rr.from_memory != 1 || rr.world_size != 3)
        return fail_with(failed("regroup", st) + " " + format_result(rr));
    c.rank = rr.rank;
    c.world = 3;
    const int joined = static_cast<int>(rr.step);
    int32_t waiting = 0;
    for (int k = 0; k < 6000 && waiting == 0; ++k) {
        if ((st = sx_poll_joiners(c.g, &waiting)) != SX_OK) return fail_with(failed("poll", st));
        if (waiting == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (waiting != 1) return fail_with("sx_poll_joiners saw " + std::to_string(waiting) + " joining processes, not 1");
    if ((st = c.save(checkpoint(dir + "/joined", joined))) != SX_OK) return fail_with(failed("save", st));
    ro.admit = waiting;
    if ((st = sx_regroup(c.g, &ro, &rr)) != SX_OK) return fail_with(failed("admitting", st));
    if (rr.world_size != 4 || rr.epoch != 2 || rr.rank != c.rank || rr.step != static_cast<uint64_t>(joined) ||
        rr.from_memory != 1)
        return fail_with("admitting: " + format_result(rr));
    c.world = 4;
    for (s = joined + 1; s <= kSteps; ++s)
        if ((st = c.step(s)) != SX_OK) return fail_with(failed("step after admitting", st));
    std::vector<float> params;
    if ((st = c.read_params(&params)) != SX_OK) return fail_with(failed("read params", st));
    if (c.rank == 0 && !write_floats(a.get("--out", ""), params, joined)) return 3;
    return 0;
}

int child_main(int argc, char **argv) {
    sxtest::ChildArgs a;
    if (!sxtest::parse_child_args(argc, argv, &a)) return 2;
    if (a.get("--mode", "") == "reference") return reference_child(a);
    if (a.get("--mode", "") == "clean") return clean_child(a);
    if (a.get("--mode", "") == "grow") return grow_child(a);
    return run_child(a);
}

// One scenario: the 4-rank run losing `victim`, then the 3-rank reference. memory: the
// group keeps memory copies every step, and the survivors regroup without a checkpoint.
// device: "cpu", or the 4 ranks are a CUDA group on the simulated device that keeps its
// state there ("cuda") or offloads it ("offload"); the reference is CPU ranks (the
// simulated device's kernels and offloaded training are the CPU's bit for bit).
void lose_one_of_four(int victim, int stage, int shard_size, bool memory = false, bool wait = false,
                      const char *device = "cpu", int state_dtype = SX_STATE_FP32) {
    const std::string dir = temp_dir("ckpt");
    mkdir(dir.c_str(), 0700);
    pid_t server = -1;
    const std::string store = start_external_store(&server);
    assert_true(server > 0);
    const std::string out = dir + "/survivors.bin";
    std::vector<sxtest::ProcessResult> results;
    sxtest::run_process_ranks(4,
                              {"--mode", "run", "--stage", std::to_string(stage), "--victim", std::to_string(victim),
                               "--shard-size", std::to_string(shard_size), "--dir", dir, "--out", out, "--store",
                               store, "--memory", memory ? "1" : "0", "--wait", wait ? "1" : "0", "--device", device,
                               "--state-dtype", std::to_string(state_dtype)},
                              120, &results);
    stop_external_store(server);
    for (int r = 0; r < 4; ++r) {
        if (r == victim) {
            if (results[r].signal != SIGKILL) fail_msg("the victim, rank %d, was not killed", victim);
        } else if (results[r].exit_code != 0) {
            fail_msg("stage %d, shard size %d, rank %d lost: survivor rank %d exited with %d (signal %d)", stage,
                     shard_size, victim, r, results[r].exit_code, results[r].signal);
        }
    }
    int64_t restored = -1;
    const std::string err = compare_with_reference(dir, out, stage, 3, 0, 4, shard_size, &restored, state_dtype);
    if (!err.empty()) fail_msg("stage %d, shard size %d, rank %d lost: %s", stage, shard_size, victim, err.c_str());
    assert_true(restored >= kKillStep - (memory && !wait ? 2 : 1) && restored <= kKillStep);
    std::printf("stage %d%s%s: rank %d lost at step %d; the 3 survivors restored step %lld from %s and equal 3 "
                "fresh ranks\n",
                stage, shard_size ? " (2 x 2 mesh)" : "",
                state_dtype == SX_STATE_8BIT               ? ", 8-bit state"
                : state_dtype == SX_STATE_BF16             ? ", bf16 state"
                : state_dtype == kBf16StochasticRound      ? ", bf16 params without masters"
                                                           : "",
                victim, kKillStep, static_cast<long long>(restored), memory ? "memory copies" : "the checkpoint");
    std::string rm = "rm -rf '" + dir + "'";
    assert_int_equal(std::system(rm.c_str()), 0);
}

// With tcp:// served by rank 0, losing rank 0 loses the store: every survivor's
// sx_regroup fails, saying that the store must outlive every rank, within its timeout.
void test_the_store_dies_with_rank0(void **) {
    const std::string dir = temp_dir("store");
    mkdir(dir.c_str(), 0700);
    std::vector<sxtest::ProcessResult> results;
    const auto start = std::chrono::steady_clock::now();
    sxtest::run_process_ranks(4, {"--mode", "run", "--stage", "2", "--victim", "0", "--dir", dir, "--store-dies", "1"},
                              120, &results);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    assert_true(results[0].signal == SIGKILL);
    for (int r = 1; r < 4; ++r)
        if (results[r].exit_code != 5)
            fail_msg("survivor %d exited with %d (signal %d), not 5 (told the store is gone)", r,
                     results[r].exit_code, results[r].signal);
    std::printf("rank 0 lost with its store: the survivors were told in %.1f s\n", seconds);
    const std::string rm = "rm -rf '" + dir + "'";
    assert_int_equal(std::system(rm.c_str()), 0);
}

// 4 -> 3 -> 4 (grow_child): the 4 ranks after the join equal 4 fresh ranks loading the
// checkpoint of the step at which it joined, bit for bit.
void grow_back(int stage, int victim) {
    const std::string dir = temp_dir("grow");
    mkdir(dir.c_str(), 0700);
    mkdir((dir + "/joined").c_str(), 0700);
    pid_t server = -1;
    const std::string store = start_external_store(&server);
    assert_true(server > 0);
    const std::string out = dir + "/grown.bin";
    std::vector<sxtest::ProcessResult> results;
    sxtest::run_process_ranks(5,
                              {"--mode", "grow", "--stage", std::to_string(stage), "--victim", std::to_string(victim),
                               "--dir", dir, "--out", out, "--store", store},
                              120, &results);
    stop_external_store(server);
    for (int r = 0; r < 5; ++r) {
        if (r == victim) {
            if (results[r].signal != SIGKILL) fail_msg("the victim, rank %d, was not killed", victim);
        } else if (results[r].exit_code != 0) {
            fail_msg("stage %d, 4 -> 3 -> 4: process %d exited with %d (signal %d)", stage, r, results[r].exit_code,
                     results[r].signal);
        }
    }
    int64_t joined = -1;
    const std::string err = compare_with_reference(dir + "/joined", out, stage, 4, 0, 4, 0, &joined);
    if (!err.empty()) fail_msg("stage %d, after the join at step %lld: %s", stage, static_cast<long long>(joined), err.c_str());
    std::printf("stage %d: 4 -> 3 (rank %d lost) -> 4 (a new process joined at step %lld): equal to 4 fresh ranks\n",
                stage, victim, static_cast<long long>(joined));
    const std::string rm = "rm -rf '" + dir + "'";
    assert_int_equal(std::system(rm.c_str()), 0);
}

void test_grow_back_stage2(void **) { grow_back(2, 1); }
void test_grow_back_stage3(void **) { grow_back(3, 0); }

void test_flat_stage1_rank0_lost(void **) { lose_one_of_four(0, 1, 0); }
void test_flat_stage2_rank1_lost(void **) { lose_one_of_four(1, 2, 0); }
void test_flat_stage3_rank3_lost(void **) { lose_one_of_four(3, 3, 0); }
void test_flat_stage2_rank0_lost(void **) { lose_one_of_four(0, 2, 0); }
void test_mesh_2x2_rank2_lost(void **) { lose_one_of_four(2, 2, 2); }
// From memory: peer copies in flat groups (the first two with SX_GROUP_MEMORY_COPY_WAIT:
// no step that returned is lost), the other replica in the mesh.
void test_memory_flat_stage1_rank0_lost(void **) { lose_one_of_four(0, 1, 0, true, true); }
void test_memory_flat_stage2_rank1_lost(void **) { lose_one_of_four(1, 2, 0, true, true); }
void test_memory_flat_stage3_rank3_lost(void **) { lose_one_of_four(3, 3, 0, true); }
void test_memory_flat_stage2_rank2_lost(void **) { lose_one_of_four(2, 2, 0, true); }
void test_memory_mesh_2x2_rank2_lost(void **) { lose_one_of_four(2, 2, 2, true); }
void test_memory_mesh_2x2_rank1_lost(void **) { lose_one_of_four(1, 3, 2, true); }
// Packed optimizer state: 4 ranks' copies (8-bit codes and scales, bf16 slots, fp32 pieces
// beside them) restored into 3 ranks' layout, equal to fresh ranks loading a checkpoint.
void test_memory_8bit_flat_stage2_rank1_lost(void **) {
    lose_one_of_four(1, 2, 0, true, true, "cpu", SX_STATE_8BIT);
}
void test_memory_8bit_mesh_2x2_rank3_lost(void **) { lose_one_of_four(3, 3, 2, true, false, "cpu", SX_STATE_8BIT); }
void test_memory_bf16_flat_stage3_rank0_lost(void **) {
    lose_one_of_four(0, 3, 0, true, true, "cpu", SX_STATE_BF16);
}
void test_checkpoint_8bit_stage1_rank2_lost(void **) { lose_one_of_four(2, 1, 0, false, false, "cpu", SX_STATE_8BIT); }
// bf16 params without fp32 masters (bf16_stochastic_round): the copies hold the bf16
// params themselves and the fp32 state; the survivors, restored from them (or from a
// checkpoint), go on with the random bits of each param's own step and elements, and
// equal fresh ranks loading the checkpoint of that step.
void test_memory_sr_flat_stage2_last_rank_lost(void **) {
    lose_one_of_four(3, 2, 0, true, true, "cpu", kBf16StochasticRound);
}
void test_memory_sr_flat_stage3_rank1_lost(void **) { lose_one_of_four(1, 3, 0, true, false, "cpu", kBf16StochasticRound); }
void test_memory_sr_mesh_2x2_rank0_lost(void **) { lose_one_of_four(0, 2, 2, true, false, "cpu", kBf16StochasticRound); }
void test_memory_sr_mesh_2x2_last_rank_lost(void **) {
    lose_one_of_four(3, 3, 2, true, false, "cpu", kBf16StochasticRound);
}
void test_checkpoint_sr_stage3_rank2_lost(void **) { lose_one_of_four(2, 3, 0, false, false, "cpu", kBf16StochasticRound); }
// CUDA groups keep memory copies of their state (on the host, or copied down from the
// device), and their survivors regroup from them, or from a checkpoint (on the simulated
// device, which the ranks inherit: its ranks share it); a 2 x 2 mesh too.
void lose_one_on_a_device(int victim, int stage, bool memory, const char *device, int shard_size = 0,
                          int state_dtype = SX_STATE_FP32) {
    setenv("SX_SIMULATED_DEVICE", "1", 1);
    lose_one_of_four(victim, stage, shard_size, memory, false, device, state_dtype);
    unsetenv("SX_SIMULATED_DEVICE");
}
// Offloaded CUDA groups keep packed state in host memory, copied and restored as a CPU group's.
void test_offloaded_memory_8bit_stage2_rank3_lost(void **) {
    lose_one_on_a_device(3, 2, true, "offload", 0, SX_STATE_8BIT);
}
// Device-state CUDA groups keep packed state in device memory: copied down and restored
// into it, or loaded from the checkpoint's codes and scales.
void test_device_memory_8bit_stage3_rank1_lost(void **) { lose_one_on_a_device(1, 3, true, "cuda", 0, SX_STATE_8BIT); }
void test_device_checkpoint_bf16_stage2_rank0_lost(void **) {
    lose_one_on_a_device(0, 2, false, "cuda", 0, SX_STATE_BF16);
}
void test_offloaded_memory_stage2_rank1_lost(void **) { lose_one_on_a_device(1, 2, true, "offload"); }
void test_offloaded_memory_stage3_rank0_lost(void **) { lose_one_on_a_device(0, 3, true, "offload"); }
void test_offloaded_checkpoint_stage1_rank2_lost(void **) { lose_one_on_a_device(2, 1, false, "offload"); }
void test_device_memory_stage2_rank2_lost(void **) { lose_one_on_a_device(2, 2, true, "cuda"); }
void test_device_memory_stage3_rank1_lost(void **) { lose_one_on_a_device(1, 3, true, "cuda"); }
void test_device_checkpoint_stage2_rank0_lost(void **) { lose_one_on_a_device(0, 2, false, "cuda"); }
void test_offloaded_mesh_2x2_rank3_lost(void **) { lose_one_on_a_device(3, 2, true, "offload", 2); }
// bf16 params without masters on CUDA groups: offloaded, the copies hold the params' shard
// on the host (which the host's update steps); on the device, the device's params copied
// down; either way restored as a CPU group's are, and equal to fresh ranks.
void test_offloaded_memory_sr_stage2_rank1_lost(void **) {
    lose_one_on_a_device(1, 2, true, "offload", 0, kBf16StochasticRound);
}
void test_device_memory_sr_stage3_rank2_lost(void **) {
    lose_one_on_a_device(2, 3, true, "cuda", 0, kBf16StochasticRound);
}
void test_device_mesh_2x2_rank0_lost(void **) { lose_one_on_a_device(0, 3, true, "cuda", 2); }

// Every rank aborts after step 5 and all 4 regroup from their memory copies, kept every
// 2 steps: the state is step 4's (the newest copy), held by each rank (and, flat, by its
// successor) and sent to the same ranks of the new group; a mesh stays a mesh. Taking
// step 5 again must give the params step 5 gave the first time, bit for bit; the copies
// take 2 (mesh) or 4 (flat: the predecessor's too) copies of a shard's state.
void all_ranks_regroup_from_memory(int stage, int shard_size, int state_dtype = SX_STATE_FP32) {
    uint64_t copy_of[4] = {0, 0, 0, 0}, held[4] = {0, 0, 0, 0};  // per rank: one copy's bytes, all it holds
    static int run = 0;
    const std::string rendezvous = "local://regroup-memory-" + std::to_string(run++);
    const std::string err = sxtest::run_ranks(4, [&](int rank) -> std::string {
        Child c;
        c.rank = rank;
        c.world = 4;
        c.stage = stage;
        c.memory_copies = 2;
        c.state_dtype = state_dtype;
        std::string e = c.create(rendezvous, shard_size);
        if (!e.empty()) return e;
        sx_status_t st = c.init_params();
        for (int s = 1; st == SX_OK && s <= 5; ++s) st = c.step(s);
        std::vector<float> first, again;
        if (st == SX_OK) st = c.read_params(&first);
        if (st != SX_OK) return failed("steps", st);
        sx_memory_stats_t ms;
        sx_memory_stats_init(&ms, sizeof ms);
        if ((st = sx_get_memory_stats(c.g, &ms)) != SX_OK) return failed("memory stats", st);
        // Each copy: the values of the shard, fp32 or bf16 params without masters (stage
        // 3: param_bytes; else the full buffers' 1/shards) and AdamW's 2 slots as the shard keeps them (the optimizer
        // state: fp32, or bf16, or 8-bit codes and scales beside fp32 pieces).
        const uint64_t values = stage == 3 ? ms.param_bytes : ms.param_bytes / (shard_size ? shard_size : 4);
        copy_of[rank] = ms.optimizer_bytes + values;
        held[rank] = ms.memory_copy_bytes;
        sx_abort(c.g);
        sx_regroup_options_t ro;
        sx_regroup_options_init(&ro, sizeof ro);
        sx_regroup_result_t rr;
        sx_regroup_result_init(&rr, sizeof rr);
        if ((st = sx_regroup(c.g, &ro, &rr)) != SX_OK) return failed("regroup", st);
        if (rr.from_memory != 1 || rr.step != 4 || rr.rank != rank || rr.world_size != 4 ||
            rr.shard_size != (shard_size ? shard_size : 4))
            return "regroup result: from memory " + std::to_string(rr.from_memory) + ", step " +
                   std::to_string(rr.step) + ", rank " + std::to_string(rr.rank) + " of " +
                   std::to_string(rr.world_size) + ", shard size " + std::to_string(rr.shard_size);
        if ((st = c.step(5)) != SX_OK || (st = c.read_params(&again)) != SX_OK) return failed("step 5 again", st);
        if (again != first) return "step 5 taken again from the memory copy of step 4 differs from the first";
        return "";
    });
    if (!err.empty()) fail_msg("stage %d, shard size %d, state dtype %d: %s", stage, shard_size, state_dtype, err.c_str());
    // A mesh holds two copies of its own shard; a flat group also two of its predecessor's,
    // which with packed state may take other bytes than its own (another piece of "a" and
    // more or fewer of the fp32 params beside it).
    for (int r = 0; r < 4; ++r) {
        const uint64_t want = 2 * copy_of[r] + (shard_size ? 0 : 2 * copy_of[(r + 3) % 4]);
        if (held[r] != want)
            fail_msg("stage %d, shard size %d, state dtype %d: rank %d holds %llu bytes of memory copies, expected "
                     "%llu",
                     stage, shard_size, state_dtype, r, static_cast<unsigned long long>(held[r]),
                     static_cast<unsigned long long>(want));
    }
}

void test_memory_all_ranks_flat(void **) { all_ranks_regroup_from_memory(2, 0); }
void test_memory_all_ranks_mesh(void **) { all_ranks_regroup_from_memory(3, 2); }
void test_memory_all_ranks_8bit_flat(void **) { all_ranks_regroup_from_memory(2, 0, SX_STATE_8BIT); }
void test_memory_all_ranks_bf16_mesh(void **) { all_ranks_regroup_from_memory(3, 2, SX_STATE_BF16); }
// Without masters, step 5 taken again rounds with step 5's bits again; a copy holds the
// bf16 params (param_bytes) and the fp32 state.
void test_memory_all_ranks_sr_flat(void **) { all_ranks_regroup_from_memory(2, 0, kBf16StochasticRound); }
void test_memory_all_ranks_sr_mesh(void **) { all_ranks_regroup_from_memory(3, 2, kBf16StochasticRound); }

// Misuse changes nothing: no checkpoint, a bad struct, a closed group's late arrival.
void test_misuse(void **) {
    sx_regroup_options_t ro;
    assert_int_equal(sx_regroup_options_init(&ro, sizeof ro), SX_OK);
    assert_int_equal(sx_regroup(nullptr, &ro, nullptr), SX_ERR_INVALID_HANDLE);
    sx_group_config_t c;
    sx_group_config_init(&c, sizeof c);
    c.rendezvous = "local://regroup-misuse";
    c.world_size = 1;
    c.backend = SX_BACKEND_CPU;
    sx_shard_group_t *g = nullptr;
    c.memory_copy_interval = -1;
    assert_int_equal(sx_create_shard_group(&c, &g), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "memory_copy_interval"));
    c.memory_copy_interval = 0;
    assert_int_equal(sx_create_shard_group(&c, &g), SX_OK);
    sx_param_group_desc_t d;
    sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_SGD);
    sx_add_param_group(g, &d, nullptr);
    sx_param_desc_t pd;
    sx_param_desc_init(&pd, sizeof pd);
    pd.name = "w";
    pd.ndim = 1;
    pd.shape = &kShapes[1];
    sx_add_param(g, &pd, nullptr);
    assert_int_equal(sx_finalize(g), SX_OK);
    ro.admit = -1;
    assert_int_equal(sx_regroup(g, &ro, nullptr), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "admit"));
    ro.admit = 0;
    int32_t waiting = -1;
    assert_int_equal(sx_poll_joiners(g, nullptr), SX_ERR_INVALID_ARGUMENT);
    assert_int_equal(sx_poll_joiners(g, &waiting), SX_OK);
    assert_int_equal(waiting, 0);
    ro.checkpoint = "/nonexistent";
    ro.join_window_ms = -1;
    assert_int_equal(sx_regroup(g, &ro, nullptr), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "join_window_ms"));
    ro.join_window_ms = 0;
    sx_status_t st = sx_regroup(g, &ro, nullptr);
    assert_true(st != SX_OK);
    assert_non_null(std::strstr(sx_last_error_message(), "/nonexistent"));
    // The refused calls left the group working.
    assert_int_equal(sx_step(g, nullptr, nullptr), SX_OK);
    // A failed group has no state to go on from without a checkpoint or memory copies.
    sx_abort(g);
    ro.checkpoint = nullptr;
    assert_int_equal(sx_regroup(g, &ro, nullptr), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(sx_last_error_message(), "checkpoint"));
    sx_destroy_shard_group(g);
    // A joining group takes part in nothing before its admission, and admits nobody.
    c.rendezvous = "local://regroup-misuse-join";
    c.flags = SX_GROUP_JOIN;
    c.timeout_ms = 300;
    assert_int_equal(sx_create_shard_group(&c, &g), SX_OK);
    sx_add_param_group(g, &d, nullptr);
    sx_add_param(g, &pd, nullptr);
    assert_int_equal(sx_finalize(g), SX_OK);
    assert_int_equal(sx_step(g, nullptr, nullptr), SX_ERR_INVALID_STATE);
    assert_int_equal(sx_poll_joiners(g, &waiting), SX_ERR_INVALID_STATE);
    ro.admit = 1;
    assert_int_equal(sx_regroup(g, &ro, nullptr), SX_ERR_INVALID_ARGUMENT);
    // Nobody admits it: its wait ends at the timeout, saying how the members admit.
    ro.admit = 0;
    assert_int_equal(sx_regroup(g, &ro, nullptr), SX_ERR_TIMEOUT);
    assert_non_null(std::strstr(sx_last_error_message(), "sx_poll_joiners"));
    sx_destroy_shard_group(g);
}

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_the_store_dies_with_rank0),
        cmocka_unit_test(test_memory_all_ranks_flat),
        cmocka_unit_test(test_memory_all_ranks_mesh),
        cmocka_unit_test(test_memory_all_ranks_8bit_flat),
        cmocka_unit_test(test_memory_all_ranks_bf16_mesh),
        cmocka_unit_test(test_memory_all_ranks_sr_flat),
        cmocka_unit_test(test_memory_all_ranks_sr_mesh),
        cmocka_unit_test(test_flat_stage1_rank0_lost),
        cmocka_unit_test(test_flat_stage2_rank1_lost),
        cmocka_unit_test(test_flat_stage3_rank3_lost),
        cmocka_unit_test(test_flat_stage2_rank0_lost),
        cmocka_unit_test(test_mesh_2x2_rank2_lost),
        cmocka_unit_test(test_memory_flat_stage1_rank0_lost),
        cmocka_unit_test(test_memory_flat_stage2_rank1_lost),
        cmocka_unit_test(test_memory_flat_stage3_rank3_lost),
        cmocka_unit_test(test_memory_flat_stage2_rank2_lost),
        cmocka_unit_test(test_memory_mesh_2x2_rank2_lost),
        cmocka_unit_test(test_memory_mesh_2x2_rank1_lost),
        cmocka_unit_test(test_memory_8bit_flat_stage2_rank1_lost),
        cmocka_unit_test(test_memory_8bit_mesh_2x2_rank3_lost),
        cmocka_unit_test(test_memory_bf16_flat_stage3_rank0_lost),
        cmocka_unit_test(test_checkpoint_8bit_stage1_rank2_lost),
        cmocka_unit_test(test_memory_sr_flat_stage2_last_rank_lost),
        cmocka_unit_test(test_memory_sr_flat_stage3_rank1_lost),
        cmocka_unit_test(test_memory_sr_mesh_2x2_rank0_lost),
        cmocka_unit_test(test_memory_sr_mesh_2x2_last_rank_lost),
        cmocka_unit_test(test_checkpoint_sr_stage3_rank2_lost),
        cmocka_unit_test(test_offloaded_memory_8bit_stage2_rank3_lost),
        cmocka_unit_test(test_offloaded_memory_stage2_rank1_lost),
        cmocka_unit_test(test_offloaded_memory_stage3_rank0_lost),
        cmocka_unit_test(test_offloaded_checkpoint_stage1_rank2_lost),
        cmocka_unit_test(test_device_memory_stage2_rank2_lost),
        cmocka_unit_test(test_device_memory_stage3_rank1_lost),
        cmocka_unit_test(test_device_memory_8bit_stage3_rank1_lost),
        cmocka_unit_test(test_device_checkpoint_bf16_stage2_rank0_lost),
        cmocka_unit_test(test_device_checkpoint_stage2_rank0_lost),
        cmocka_unit_test(test_offloaded_mesh_2x2_rank3_lost),
        cmocka_unit_test(test_offloaded_memory_sr_stage2_rank1_lost),
        cmocka_unit_test(test_device_memory_sr_stage3_rank2_lost),
        cmocka_unit_test(test_device_mesh_2x2_rank0_lost),
        cmocka_unit_test(test_grow_back_stage2),
        cmocka_unit_test(test_grow_back_stage3),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
