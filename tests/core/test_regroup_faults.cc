// A failed recovery never turns into wrong state. 4 ranks as processes over tcp:// on
// sx-rendezvous keep memory copies every step and save a checkpoint before each step;
// ranks are lost at random moments, and more than one:
//
// - Two neighbours lost together: no copy holds their shards. Every regroup without a
//   checkpoint fails (the first and any retry: the state exists nowhere), and a retry
//   with a checkpoint then succeeds at a new epoch with exactly the checkpoint's state.
// - A second rank lost inside the survivors' regroup (seeded trials over flat stages 1-3
//   and a 2 x 2 mesh): whatever each regroup returns, the survivors retry until one
//   succeeds, and their final params equal, bit for bit, fresh ranks that load a
//   checkpoint of the step their last regroup restored and take the same steps.
// - Rank 0 lost while the copies are being sent (no SX_GROUP_MEMORY_COPY_WAIT): the
//   restored step is at most one before the last step every survivor returned.
// - A joiner that breaks the admitting regroup (another param table): the members'
//   retry at the next epoch succeeds from the copies of the step they admitted at.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "process_ranks.h"
#include "regroup_ranks.h"
#include "sx_cmocka.h"

using namespace sxtest::regroup;

namespace {

std::string arg(const sxtest::ChildArgs &a, const char *key) { return a.get(key, ""); }

std::string format_delay(int us) { return "; it dies " + std::to_string(us) + " us into its regroup"; }

// The expected world size of this handle's next regroup: its group's ranks less the ones
// known to be lost.
int expected_survivors(sx_shard_group_t *g) {
    int32_t world = 0, lost = 0;
    sx_get_world_size(g, &world);
    if (sx_get_lost_ranks(g, nullptr, 0, &lost) != SX_OK) return 0;
    return world - lost;
}

// Steps from `from` to kSteps; SX_OK or the failed step's status.
sx_status_t train_from(Child &c, int from) {
    for (int s = from; s <= kSteps; ++s) {
        const sx_status_t st = c.step(s);
        if (st != SX_OK) return st;
    }
    return SX_OK;
}

// The 4-rank run's first part, up to the step that fails because --victim died at a
// random moment of step --kill-step: steps with a checkpoint of step s-1 before step s.
// Returns the last checkpoint every rank committed, *failed_step, and *step_time (of the
// last step that returned); -1 where something else failed (said on stderr).
int train_until_a_loss(Child &c, const sxtest::ChildArgs &a, int *failed_step,
                       std::chrono::microseconds *step_time) {
    const int victim = std::stoi(a.get("--victim", "-1"));
    const int kill_step = std::stoi(a.get("--kill-step", std::to_string(kKillStep)));
    const uint32_t seed = static_cast<uint32_t>(std::stoul(a.get("--seed", "1")));
    const std::string dir = arg(a, "--dir");
    sx_status_t st = c.init_params();
    int committed = -1, s = 1;
    std::chrono::microseconds last_step{1000};
    for (; st == SX_OK && s <= kSteps; ++s) {
        *failed_step = s;
        if ((st = c.save(checkpoint(dir, s - 1))) != SX_OK) break;
        committed = s - 1;
        if (a.rank == victim && s == kill_step) {
            std::mt19937 rng(seed);
            const int delay_us = std::uniform_int_distribution<int>(0, static_cast<int>(last_step.count()))(rng);
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
        std::fprintf(stderr, "rank %d: finished every step though rank %d was killed\n", a.rank, victim);
        return -1;
    }
    std::fprintf(stderr, "rank %d: step %d failed: %s\n", a.rank, *failed_step, failed("step", st).c_str());
    *step_time = last_step;
    return committed;
}

// Writes what the survivors' new rank 0 reports: the step restored last, then the
// params after training on from it; and every survivor the size of its group (its
// previous rank's file), which must be one group of them all.
int finish(Child &c, const sxtest::ChildArgs &a, int restored) {
    std::vector<float> params;
    const sx_status_t st = c.read_params(&params);
    if (st != SX_OK) {
        std::fprintf(stderr, "rank %d: %s\n", a.rank, failed("read params", st).c_str());
        return 3;
    }
    if (c.rank == 0 && !write_floats(arg(a, "--out"), params, restored)) return 3;
    const std::vector<float> world = {static_cast<float>(c.world)};
    if (!write_floats(arg(a, "--out") + ".world" + std::to_string(a.rank), world, restored)) return 3;
    return 0;
}

// Every survivor's group has `world` ranks (not two groups of fewer).
void check_one_group(const std::string &out, const std::vector<int> &survivors, int world, const std::string &what) {
    for (int r : survivors) {
        std::string text;
        float w = 0;
        if (!read_file(out + ".world" + std::to_string(r), &text) || text.size() != sizeof(int64_t) + sizeof w)
            fail_msg("%s: survivor %d wrote no group size", what.c_str(), r);
        std::memcpy(&w, text.data() + sizeof(int64_t), sizeof w);
        if (static_cast<int>(w) != world)
            fail_msg("%s: survivor %d ended in a group of %d, not the group of all %d survivors", what.c_str(), r,
                     static_cast<int>(w), world);
    }
}

// Two neighbours (--victim and --victim2) die together at the start of step 5.
int neighbours_child(const sxtest::ChildArgs &a) {
    Child c;
    c.rank = a.rank;
    c.world = 4;
    c.stage = 2;
    c.memory_copies = 1;
    const int victim2 = std::stoi(arg(a, "--victim2"));
    std::string err = c.create(arg(a, "--store"), 0);
    if (!err.empty()) return std::fprintf(stderr, "rank %d: %s\n", a.rank, err.c_str()), 3;
    sx_status_t st = c.init_params();
    int committed = -1, s = 1;
    for (; st == SX_OK && s <= kSteps; ++s) {
        if ((st = c.save(checkpoint(arg(a, "--dir"), s - 1))) != SX_OK) break;
        committed = s - 1;
        if (s == kKillStep && (a.rank == std::stoi(arg(a, "--victim")) || a.rank == victim2)) raise(SIGKILL);
        st = c.step(s);
    }
    if (st == SX_OK) return std::fprintf(stderr, "rank %d: no step failed\n", a.rank), 3;
    auto fail_with = [&](const std::string &what) {
        std::fprintf(stderr, "rank %d: %s\n", a.rank, what.c_str());
        return 3;
    };
    // Both victims are named once both have died (the second may die a moment later).
    int32_t lost[4] = {-1, -1, -1, -1}, count = 0;
    for (int k = 0; k < 500 && count < 2; ++k) {
        if ((st = sx_get_lost_ranks(c.g, lost, 4, &count)) != SX_OK) return fail_with(failed("lost ranks", st));
        if (count < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (count != 2 || lost[0] != std::stoi(arg(a, "--victim")) || lost[1] != victim2)
        return fail_with("sx_get_lost_ranks named " + std::to_string(count) + " ranks, not the two killed");
    sx_regroup_options_t ro;
    sx_regroup_options_init(&ro, sizeof ro);
    ro.expected_world_size = expected_survivors(c.g);
    ro.join_window_ms = 10000;
    sx_regroup_result_t rr;
    // Without a checkpoint: the lost shards exist nowhere, now or at any retry.
    for (int attempt = 1; attempt <= 2; ++attempt) {
        sx_regroup_result_init(&rr, sizeof rr);
        st = sx_regroup(c.g, &ro, &rr);
        if (st != SX_ERR_NOT_FOUND || !std::strstr(sx_last_error_message(), "checkpoint"))
            return fail_with("regroup " + std::to_string(attempt) + " without a checkpoint: " + failed("", st) +
                             " " + format_result(rr));
        // Nothing changed: the handle is still the broken group of 4.
        int32_t w = 0;
        sx_get_world_size(c.g, &w);
        if (w != 4) return fail_with("a failed regroup left a group of " + std::to_string(w));
        if (sx_step(c.g, nullptr, nullptr) != SX_ERR_GROUP_FAILED)
            return fail_with("the broken group stepped after a failed regroup");
    }
    const std::string from = checkpoint(arg(a, "--dir"), committed);
    ro.checkpoint = from.c_str();
    sx_regroup_result_init(&rr, sizeof rr);
    if ((st = sx_regroup(c.g, &ro, &rr)) != SX_OK) return fail_with(failed("regroup with a checkpoint", st));
    const int want_rank = a.rank == 0 ? 0 : 1;
    if (rr.epoch != 3 || rr.world_size != 2 || rr.rank != want_rank || rr.from_memory != 0 ||
        rr.step != static_cast<uint64_t>(committed))
        return fail_with("regroup with a checkpoint: " + format_result(rr) + "; expected epoch 3, rank " +
                         std::to_string(want_rank) + " of 2, step " + std::to_string(committed) + " from the checkpoint");
    c.rank = rr.rank;
    c.world = 2;
    if ((st = train_from(c, committed + 1)) != SX_OK) return fail_with(failed("step after the regroup", st));
    return finish(c, a, committed);
}

// A trial: --victim dies at a random moment of step --kill-step; the survivors regroup
// (from memory, with the last checkpoint as the fallback); --victim2 dies --delay-us into
// its own regroup, or as it returns. The survivors retry until a regroup succeeds and
// they train to the end.
int second_loss_child(const sxtest::ChildArgs &a) {
    Child c;
    c.rank = a.rank;
    c.world = 4;
    c.stage = std::stoi(arg(a, "--stage"));
    c.memory_copies = 1;
    c.timeout_ms = 6000;  // a member lost inside a regroup fails the others' within it
    const int victim2 = std::stoi(arg(a, "--victim2"));
    const double when = std::stod(arg(a, "--when"));
    std::string err = c.create(arg(a, "--store"), std::stoi(arg(a, "--shard-size")));
    if (!err.empty()) return std::fprintf(stderr, "rank %d: %s\n", a.rank, err.c_str()), 3;
    int failed_step = 0;
    std::chrono::microseconds step_time{0};
    const int committed = train_until_a_loss(c, a, &failed_step, &step_time);
    if (committed < 0) return 3;
    // A regroup takes about as long as 2-3 steps here: the kill lands within the first 4.
    const int delay_us = static_cast<int>(when * 4 * static_cast<double>(step_time.count()));
    std::fprintf(stderr, "rank %d: a step took %lld us%s\n", a.rank, static_cast<long long>(step_time.count()),
                 a.rank == victim2 ? format_delay(delay_us).c_str() : "");
    if (a.rank == victim2) {
        std::thread([delay_us] {
            std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
            raise(SIGKILL);
        }).detach();
    }
    const std::string from = checkpoint(arg(a, "--dir"), committed);
    for (int attempt = 1; attempt <= 5; ++attempt) {
        sx_regroup_options_t ro;
        sx_regroup_options_init(&ro, sizeof ro);
        ro.checkpoint = from.c_str();
        ro.expected_world_size = expected_survivors(c.g);
        ro.join_window_ms = 5000;
        sx_regroup_result_t rr;
        sx_regroup_result_init(&rr, sizeof rr);
        const auto t0 = std::chrono::steady_clock::now();
        const sx_status_t st = sx_regroup(c.g, &ro, &rr);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (a.rank == victim2) raise(SIGKILL);  // its regroup returned before the kill: it dies before any step
        if (st != SX_OK) {
            std::fprintf(stderr, "rank %d: regroup %d (%.1f ms): %s\n", a.rank, attempt, ms, failed("", st).c_str());
            continue;
        }
        std::fprintf(stderr, "rank %d: regroup %d (%.1f ms): %s\n", a.rank, attempt, ms, format_result(rr).c_str());
        c.rank = rr.rank;
        c.world = rr.world_size;
        c.stage = c.stage;
        const sx_status_t trained = train_from(c, static_cast<int>(rr.step) + 1);
        if (trained == SX_OK) return finish(c, a, static_cast<int>(rr.step));
        std::fprintf(stderr, "rank %d: after regroup %d: %s\n", a.rank, attempt, failed("step", trained).c_str());
    }
    std::fprintf(stderr, "rank %d: no regroup succeeded in 5 attempts\n", a.rank);
    return 3;
}

// Rank 0 dies at a random moment of step 5, while the copy of step 4 is being sent (no
// SX_GROUP_MEMORY_COPY_WAIT); the survivors regroup from memory alone. Each writes the last
// step that returned to it (--out.returned<rank>); new rank 0 the step restored and the
// params at the end.
int copy_window_child(const sxtest::ChildArgs &a) {
    Child c;
    c.rank = a.rank;
    c.world = 4;
    c.stage = std::stoi(arg(a, "--stage"));
    c.memory_copies = 1;
    std::string err = c.create(arg(a, "--store"), 0);
    if (!err.empty()) return std::fprintf(stderr, "rank %d: %s\n", a.rank, err.c_str()), 3;
    int failed_step = 0;
    std::chrono::microseconds step_time{0};
    if (train_until_a_loss(c, a, &failed_step, &step_time) < 0) return 3;
    if (!write_floats(arg(a, "--out") + ".returned" + std::to_string(a.rank), {}, failed_step - 1)) return 3;
    sx_regroup_options_t ro;
    sx_regroup_options_init(&ro, sizeof ro);
    ro.expected_world_size = expected_survivors(c.g);
    ro.join_window_ms = 10000;
    sx_regroup_result_t rr;
    sx_regroup_result_init(&rr, sizeof rr);
    const sx_status_t st = sx_regroup(c.g, &ro, &rr);
    if (st != SX_OK || !rr.from_memory)
        return std::fprintf(stderr, "rank %d: %s %s\n", a.rank, failed("regroup", st).c_str(),
                            format_result(rr).c_str()),
               3;
    c.rank = rr.rank;
    c.world = rr.world_size;
    const sx_status_t trained = train_from(c, static_cast<int>(rr.step) + 1);
    if (trained != SX_OK) return std::fprintf(stderr, "rank %d: %s\n", a.rank, failed("step", trained).c_str()), 3;
    return finish(c, a, static_cast<int>(rr.step));
}

// 3 members train 3 steps (no memory copies of their own) and admit a joining process
// (rank 3 here) whose param "b" is one element longer: the regroup that admits it fails
// on every side (SX_ERR_MISMATCH, the tables differ), and the members' retry without it
// succeeds at the next epoch from the copies their sound group took as it began.
int bad_joiner_child(const sxtest::ChildArgs &a) {
    Child c;
    c.stage = 2;
    auto fail_with = [&](const std::string &what) {
        std::fprintf(stderr, "%s %d: %s\n", a.rank == 3 ? "joiner" : "rank", a.rank, what.c_str());
        return 3;
    };
    sx_regroup_options_t ro;
    sx_regroup_options_init(&ro, sizeof ro);
    ro.join_window_ms = 10000;
    sx_regroup_result_t rr;
    sx_regroup_result_init(&rr, sizeof rr);
    if (a.rank == 3) {
        c.flags = SX_GROUP_JOIN;
        c.b_extra = 1;
        std::string err = c.create(arg(a, "--store"), 0);
        if (!err.empty()) return fail_with(err);
        const sx_status_t st = sx_regroup(c.g, &ro, &rr);
        if (st != SX_ERR_MISMATCH) return fail_with("joining with another table: " + failed("regroup", st));
        return 0;
    }
    c.rank = a.rank;
    c.world = 3;
    std::string err = c.create(arg(a, "--store"), 0);
    if (!err.empty()) return fail_with(err);
    sx_status_t st = c.init_params();
    for (int s = 1; st == SX_OK && s <= 3; ++s) st = c.step(s);
    if (st != SX_OK) return fail_with(failed("step", st));
    int32_t waiting = 0;
    for (int k = 0; k < 6000 && waiting == 0; ++k) {
        if ((st = sx_poll_joiners(c.g, &waiting)) != SX_OK) return fail_with(failed("poll", st));
        if (waiting == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if ((st = c.save(checkpoint(arg(a, "--dir"), 3))) != SX_OK) return fail_with(failed("save", st));
    ro.admit = waiting;
    if ((st = sx_regroup(c.g, &ro, &rr)) != SX_ERR_MISMATCH)
        return fail_with("admitting a joiner with another table: " + failed("regroup", st));
    ro.admit = 0;
    sx_regroup_result_init(&rr, sizeof rr);
    if ((st = sx_regroup(c.g, &ro, &rr)) != SX_OK) return fail_with(failed("the retry without it", st));
    if (rr.epoch != 2 || rr.world_size != 3 || rr.rank != a.rank || rr.step != 3 || !rr.from_memory)
        return fail_with("the retry: " + format_result(rr));
    if ((st = train_from(c, 4)) != SX_OK) return fail_with(failed("step after the retry", st));
    return finish(c, a, 3);
}

int child_main(int argc, char **argv) {
    sxtest::ChildArgs a;
    if (!sxtest::parse_child_args(argc, argv, &a)) return 2;
    const std::string mode = a.get("--mode", "");
    if (mode == "reference") return reference_child(a);
    if (mode == "clean") return clean_child(a);
    if (mode == "neighbours") return neighbours_child(a);
    if (mode == "second-loss") return second_loss_child(a);
    if (mode == "copy-window") return copy_window_child(a);
    if (mode == "bad-joiner") return bad_joiner_child(a);
    return 2;
}

// The run's processes: the victims died by SIGKILL, every other exited 0.
void check_exits(const std::vector<sxtest::ProcessResult> &results, const std::vector<int> &victims,
                 const std::string &what) {
    for (size_t r = 0; r < results.size(); ++r) {
        const bool victim = std::find(victims.begin(), victims.end(), static_cast<int>(r)) != victims.end();
        if (victim && results[r].signal != SIGKILL) fail_msg("%s: victim %zu was not killed", what.c_str(), r);
        if (!victim && results[r].exit_code != 0)
            fail_msg("%s: survivor %zu exited with %d (signal %d)", what.c_str(), r, results[r].exit_code,
                     results[r].signal);
    }
}

// 4 ranks as processes with `args` (and --store: a fresh sx-rendezvous store, --dir: a
// fresh directory, --out: a file in it); *dir and *out say where.
std::vector<sxtest::ProcessResult> run_four(std::vector<std::string> args, const char *what, std::string *dir,
                                            std::string *out) {
    *dir = temp_dir(what);
    assert_int_equal(mkdir(dir->c_str(), 0700), 0);
    *out = *dir + "/survivors.bin";
    pid_t server = -1;
    const std::string store = start_external_store(&server);
    assert_true(server > 0);
    args.insert(args.end(), {"--dir", *dir, "--out", *out, "--store", store});
    std::vector<sxtest::ProcessResult> results;
    sxtest::run_process_ranks(4, args, 120, &results);
    stop_external_store(server);
    return results;
}

void remove_dir(const std::string &dir) {
    const std::string rm = "rm -rf '" + dir + "'";
    assert_int_equal(std::system(rm.c_str()), 0);
}

void test_neighbours_lost_together(void **) {
    std::string dir, out;
    const auto results = run_four({"--mode", "neighbours", "--victim", "1", "--victim2", "2"}, "neighbours", &dir, &out);
    check_exits(results, {1, 2}, "ranks 1 and 2 lost together");
    check_one_group(out, {0, 3}, 2, "ranks 1 and 2 lost together");
    int64_t restored = -1;
    const std::string err = compare_with_reference(dir, out, 2, 2, 0, 4, 0, &restored);
    if (!err.empty()) fail_msg("%s", err.c_str());
    assert_int_equal(restored, kKillStep - 1);
    remove_dir(dir);
}

// Seeded trials: the first and the second victim, and when each dies, drawn from the seed.
void second_loss_trials(int stage, int shard_size, int trials, uint32_t seed) {
    std::mt19937 rng(seed);
    for (int t = 0; t < trials; ++t) {
        const int victim = std::uniform_int_distribution<int>(0, 3)(rng);
        int victim2 = std::uniform_int_distribution<int>(0, 2)(rng);
        if (victim2 >= victim) ++victim2;
        const double when = std::uniform_real_distribution<double>(0, 1)(rng);
        const uint32_t kill_seed = static_cast<uint32_t>(rng());
        std::string dir, out;
        const auto results = run_four({"--mode", "second-loss", "--stage", std::to_string(stage), "--shard-size",
                                       std::to_string(shard_size), "--victim", std::to_string(victim), "--victim2",
                                       std::to_string(victim2), "--when", std::to_string(when), "--seed",
                                       std::to_string(kill_seed), "--kill-step", "3"},
                                      "second", &dir, &out);
        char what[160];
        std::snprintf(what, sizeof what, "stage %d%s, trial %d: rank %d lost in step 3, rank %d %.0f%% into 4 steps' "
                      "time after it", stage, shard_size ? " (2 x 2 mesh)" : "", t, victim, victim2, when * 100);
        check_exits(results, {victim, victim2}, what);
        std::vector<int> survivors;
        for (int r = 0; r < 4; ++r)
            if (r != victim && r != victim2) survivors.push_back(r);
        check_one_group(out, survivors, 2, what);
        int64_t restored = -1;
        const std::string err = compare_with_reference(dir, out, stage, 2, 0, 4, shard_size, &restored);
        if (!err.empty()) fail_msg("%s: %s", what, err.c_str());
        std::printf("%s: the 2 survivors restored step %lld and equal 2 fresh ranks\n", what,
                    static_cast<long long>(restored));
        remove_dir(dir);
    }
}

// Rank 0 lost while the copy of the last step every survivor returned is being sent:
// without SX_GROUP_MEMORY_COPY_WAIT the contract is that at most that step is taken again
// besides the one in flight, i.e. the restored step is at least one before the last step
// that returned on every survivor. Seeded trials, each equal to 3 fresh ranks loading a
// checkpoint of the restored step.
void test_rank0_lost_while_a_copy_is_sent(void **) {
    for (int t = 0; t < 8; ++t) {
        const int stage = 1 + t % 3;
        std::string dir, out;
        const auto results = run_four({"--mode", "copy-window", "--stage", std::to_string(stage), "--victim", "0",
                                       "--seed", std::to_string(1000 + t)},
                                      "window", &dir, &out);
        char what[96];
        std::snprintf(what, sizeof what, "stage %d, trial %d: rank 0 lost in step %d", stage, t, kKillStep);
        check_exits(results, {0}, what);
        int64_t everyone = kSteps;  // the last step that returned on every survivor
        for (int r = 1; r < 4; ++r) {
            std::string text;
            int64_t returned = -1;
            assert_true(read_file(out + ".returned" + std::to_string(r), &text) && text.size() >= sizeof returned);
            std::memcpy(&returned, text.data(), sizeof returned);
            everyone = std::min(everyone, returned);
        }
        int64_t restored = -1;
        const std::string err = compare_with_reference(dir, out, stage, 3, 0, 4, 0, &restored);
        if (!err.empty()) fail_msg("%s: %s", what, err.c_str());
        if (restored + 1 < everyone)
            fail_msg("%s: every survivor had returned step %lld, and the regroup restored step %lld", what,
                     static_cast<long long>(everyone), static_cast<long long>(restored));
        std::printf("%s: every survivor had returned step %lld; restored step %lld from memory\n", what,
                    static_cast<long long>(everyone), static_cast<long long>(restored));
        remove_dir(dir);
    }
}

void test_a_joiner_that_breaks_the_regroup(void **) {
    std::string dir, out;
    const auto results = run_four({"--mode", "bad-joiner"}, "badjoin", &dir, &out);
    check_exits(results, {}, "a joiner with another table");
    check_one_group(out, {0, 1, 2}, 3, "a joiner with another table");
    int64_t restored = -1;
    const std::string err = compare_with_reference(dir, out, 2, 3, 0, 3, 0, &restored);
    if (!err.empty()) fail_msg("after the failed admission: %s", err.c_str());
    assert_int_equal(restored, 3);
    remove_dir(dir);
}

void test_second_loss_flat_stage1(void **) { second_loss_trials(1, 0, 8, 11); }
void test_second_loss_flat_stage2(void **) { second_loss_trials(2, 0, 8, 22); }
void test_second_loss_flat_stage3(void **) { second_loss_trials(3, 0, 8, 33); }
void test_second_loss_mesh(void **) { second_loss_trials(2, 2, 8, 44); }

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) return child_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_neighbours_lost_together),
        cmocka_unit_test(test_rank0_lost_while_a_copy_is_sent),
        cmocka_unit_test(test_a_joiner_that_breaks_the_regroup),
        cmocka_unit_test(test_second_loss_flat_stage1),
        cmocka_unit_test(test_second_loss_flat_stage2),
        cmocka_unit_test(test_second_loss_flat_stage3),
        cmocka_unit_test(test_second_loss_mesh),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
