// Ranks on different hosts, across a real (virtual) network (netlab.h): 2 hosts of 2 rank
// processes each, and a third host serving the rendezvous store (sx-rendezvous). Within a
// host the ranks share memory; between hosts they go through the hosts' links (the
// two-level exchange: each rank's log must say its world combines on its host and then
// across). Shown:
// - the same bits as the same 4 ranks on one host told they are on two (SX_HOST_ID), at
//   stages 1-3 and on a mesh whose shard groups are the hosts, and with the group made in
//   a context of the 4 ranks (each host's shared memory, the context's Gloo mesh);
// - with 1% of the packets lost and 1 ms between the hosts: the run completes, exact;
// - a partition (host 1's link down in the middle of a step): every rank fails within its
//   timeout with an error naming the unreachable host or rank; once the link is back the
//   4 regroup (from their memory copies) and finish on the same bits;
// - host 1's processes all killed at once: host 0's ranks regroup, from the checkpoint
//   (flat) or, where host 0 holds a whole replica (the mesh), from memory, and equal 2 fresh
//   ranks loading the step they restored.
// Skips, saying why, where the lab cannot be made (no root, no network namespaces, no TUN).
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "netlab.h"
#include "process_ranks.h"
#include "regroup_ranks.h"
#include "sx_cmocka.h"

using namespace sxtest::regroup;

namespace {

constexpr int kStoreHost = 2;
constexpr int kTimeoutMs = 4000;  // the ranks' timeout in the partition

bool exists(const std::string &path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
}

void touch(const std::string &path) { std::ofstream(path) << "1\n"; }

// Waits until `path` exists (false at the deadline).
bool wait_for(const std::string &path, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!exists(path)) {
        if (std::chrono::steady_clock::now() > end) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
}

std::string arg(const sxtest::ChildArgs &a, const char *key) { return a.get(key, ""); }

// Counts the communicators that said they combine on their host, then across.
int g_two_level = 0;

// A rank: trains, or loses its peers as --scenario says, and writes what happened.
int child_main(int argc, char **argv) {
    sxtest::ChildArgs a;
    if (!sxtest::parse_child_args(argc, argv, &a)) return 2;
    sx_set_log_callback(
        [](int32_t, const char *message, void *) {
            if (std::strstr(message, "through TCP with its host peers") ||
                std::strstr(message, "shared memory on each host and on one Gloo mesh between"))
                ++g_two_level;
        },
        nullptr, SX_LOG_DEBUG);
    const std::string scenario = arg(a, "--scenario"), dir = arg(a, "--dir");
    auto fail_with = [&](const std::string &what) {
        std::fprintf(stderr, "rank %d: %s\n", a.rank, what.c_str());
        return 3;
    };
    Child c;
    c.rank = a.rank;
    c.world = a.world;
    c.stage = std::stoi(arg(a, "--stage"));
    c.memory_copies = scenario == "plain" ? 0 : 1;
    c.timeout_ms = scenario == "partition" ? kTimeoutMs : 20000;
    if (arg(a, "--context") == "1") {
        // The group in a context of the 4 ranks (the handle goes at once: the group keeps it).
        sx_context_config_t cc;
        sx_context_config_init(&cc, sizeof cc);
        cc.rendezvous = a.rendezvous.c_str();
        cc.rank = a.rank;
        cc.world_size = a.world;
        cc.backend = SX_BACKEND_CPU;
        cc.num_threads = 1;
        cc.timeout_ms = c.timeout_ms;
        sx_status_t made = sx_create_context(&cc, &c.context);
        if (made != SX_OK) return fail_with(failed("context", made));
    }
    std::string err = c.create(a.rendezvous, std::stoi(arg(a, "--shard-size")));
    sx_destroy_context(c.context);
    if (!err.empty()) return fail_with(err);
    if (arg(a, "--hosts") == "2" && g_two_level < 1)
        return fail_with("its world does not combine on the host and then across (" + std::to_string(g_two_level) +
                         " communicators said so)");
    sx_status_t st = c.init_params();
    int s = 1;
    for (; st == SX_OK && s <= kSteps; ++s) {
        if (scenario == "killed" && (st = c.save(checkpoint(dir, s - 1))) != SX_OK) break;
        if (scenario != "plain" && s == 5) touch(dir + "/at5." + std::to_string(a.rank));
        const auto t0 = std::chrono::steady_clock::now();
        st = c.step(s);
        if (st != SX_OK && scenario == "partition") {
            const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::ofstream(dir + "/failed." + std::to_string(a.rank))
                << took << "\n" << sx_status_string(st) << ": " << sx_last_error_message() << "\n";
        }
    }
    if (scenario == "plain") {
        if (st != SX_OK) return fail_with(failed("step", st));
    } else {
        if (st == SX_OK) return fail_with("no step failed");
        // Regroup once the peers are back (the partition) or known gone (the kill).
        if (scenario == "partition" && !wait_for(dir + "/link-up", 60)) return fail_with("the link never came back");
        sx_regroup_options_t ro;
        sx_regroup_options_init(&ro, sizeof ro);
        const std::string from = checkpoint(dir, s - 2);
        if (scenario == "killed") ro.checkpoint = from.c_str();
        ro.join_window_ms = 3000;
        sx_regroup_result_t rr;
        sx_regroup_result_init(&rr, sizeof rr);
        if ((st = sx_regroup(c.g, &ro, &rr)) != SX_OK) return fail_with(failed("regroup", st));
        std::fprintf(stderr, "rank %d: regrouped: %s\n", a.rank, format_result(rr).c_str());
        c.rank = rr.rank;
        c.world = rr.world_size;
        for (s = static_cast<int>(rr.step) + 1; s <= kSteps; ++s)
            if ((st = c.step(s)) != SX_OK) return fail_with(failed("step after the regroup", st));
        s = static_cast<int>(rr.step);
    }
    std::vector<float> params;
    if ((st = c.read_params(&params)) != SX_OK) return fail_with(failed("read params", st));
    if (c.rank == 0 && !write_floats(arg(a, "--out"), params, scenario == "plain" ? kSteps : s)) return 3;
    return 0;
}

struct Run {
    std::vector<int> status;  // per rank: waitpid's
    std::string dir;
};

// 4 ranks (rank r on host r / 2) with `extra` arguments: across the lab's 2 hosts (over
// its wire, the store on a host of its own), or on this machine's loopback (SX_HOST_ID
// saying which host each rank is on; rank 0 serves the store). `conduct` runs beside them
// (it may take links down or kill ranks, given their pids). Waits for every rank (a minute
// at most).
Run run_ranks(netlab::Lab *lab, bool across, const std::vector<std::string> &extra, const std::string &dir,
              const std::function<void(const std::vector<pid_t> &)> &conduct = nullptr) {
    Run run;
    run.dir = dir;
    std::string rendezvous;
    pid_t store = -1;
    const std::vector<std::pair<std::string, std::string>> token = {{"SX_RENDEZVOUS_TOKEN", "hosts-test"}};
    if (across) {
        store = lab->spawn(kStoreHost, {SX_RENDEZVOUS_PATH, "--port", "29500", "--bind", lab->address(kStoreHost)},
                           token);
        rendezvous = "tcp://" + lab->address(kStoreHost) + ":29500?server=external";
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // listening (ranks retry meanwhile anyway)
    } else {
        rendezvous = "tcp://127.0.0.1:" + std::to_string(sxtest::free_port());
    }
    std::vector<pid_t> pids;
    for (int r = 0; r < 4; ++r) {
        std::vector<std::string> args = {"/proc/self/exe", "--rank", std::to_string(r), "--world", "4", "--rendezvous",
                                         rendezvous, "--hosts", across ? "2" : "1", "--dir", dir};
        args.insert(args.end(), extra.begin(), extra.end());
        std::vector<std::pair<std::string, std::string>> env = token;
        env.push_back({"SX_HOST_ID", "host-" + std::to_string(r / 2)});
        pids.push_back(lab->spawn(across ? r / 2 : -1, args, env));
    }
    if (conduct) conduct(pids);
    run.status.assign(4, -1);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int left = 4; left > 0 && std::chrono::steady_clock::now() < end;) {
        for (int r = 0; r < 4; ++r) {
            int status = 0;
            if (run.status[static_cast<size_t>(r)] == -1 && ::waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG) > 0) {
                run.status[static_cast<size_t>(r)] = status;
                --left;
            }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (int r = 0; r < 4; ++r)
        if (run.status[static_cast<size_t>(r)] == -1) {
            ::kill(pids[static_cast<size_t>(r)], SIGKILL);
            ::waitpid(pids[static_cast<size_t>(r)], nullptr, 0);
        }
    if (store > 0) {
        ::kill(store, SIGTERM);
        ::waitpid(store, nullptr, 0);
    }
    return run;
}

// What a run wrote: the step it went on from, and rank 0's final params.
std::string result_of(const std::string &path) {
    std::string bytes;
    if (!read_file(path, &bytes)) fail_msg("no result in %s", path.c_str());
    return bytes;
}

std::string fresh_dir(const char *what) {
    const std::string dir = temp_dir(what);
    assert_int_equal(::mkdir(dir.c_str(), 0700), 0);
    return dir;
}

void remove_dir(const std::string &dir) {
    const std::string rm = "rm -rf '" + dir + "'";
    assert_int_equal(std::system(rm.c_str()), 0);
}

void check_statuses(const Run &run, const std::vector<int> &killed, const char *what) {
    for (int r = 0; r < 4; ++r) {
        const int st = run.status[static_cast<size_t>(r)];
        const bool was_killed = std::find(killed.begin(), killed.end(), r) != killed.end();
        if (was_killed ? !(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) : !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
            fail_msg("%s: rank %d ended with status 0x%x", what, r, st);
    }
}

// The lab, or a skip (a message and no failure) where it cannot be made here.
std::unique_ptr<netlab::Lab> lab_or_skip() {
    std::unique_ptr<netlab::Lab> lab;
    const std::string why = netlab::Lab::create(3, &lab);
    if (!why.empty()) {
        std::printf("skipped: %s\n", why.c_str());
        return nullptr;
    }
    return lab;
}

// Plain training across the hosts, and the same 4 ranks on one host: the same bits.
// in_context: across the hosts, the group is made in a context of the 4 ranks.
void same_bits(int stage, int shard_size, const netlab::Link &link, const char *what, bool in_context = false) {
    std::unique_ptr<netlab::Lab> lab = lab_or_skip();
    if (!lab) return;
    const std::string dir = fresh_dir("hosts");
    const std::vector<std::string> args = {"--scenario", "plain", "--stage", std::to_string(stage), "--shard-size",
                                           std::to_string(shard_size)};
    std::vector<std::string> across = args, here = args;
    across.insert(across.end(), {"--out", dir + "/across.bin", "--context", in_context ? "1" : "0"});
    here.insert(here.end(), {"--out", dir + "/here.bin"});
    lab->set_links(link);
    const auto t0 = std::chrono::steady_clock::now();
    check_statuses(run_ranks(lab.get(), true, across, dir), {}, what);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const netlab::WireStats wire = lab->stats();
    check_statuses(run_ranks(lab.get(), false, here, dir), {}, what);
    if (result_of(dir + "/across.bin") != result_of(dir + "/here.bin"))
        fail_msg("%s: 2 hosts of 2 ranks differ from the same 4 ranks on one host", what);
    std::printf("%s: 2 hosts x 2 ranks equal 4 ranks on one host, bit for bit (%.1f s; the wire moved %llu packets, "
                "%.1f MB, and dropped %llu)\n",
                what, took, static_cast<unsigned long long>(wire.packets), static_cast<double>(wire.bytes) / 1e6,
                static_cast<unsigned long long>(wire.dropped));
    remove_dir(dir);
}

void test_same_bits_stage1(void **) { same_bits(1, 0, {}, "stage 1"); }
void test_same_bits_stage2(void **) { same_bits(2, 0, {}, "stage 2"); }
void test_same_bits_stage3(void **) { same_bits(3, 0, {}, "stage 3"); }
void test_same_bits_mesh(void **) { same_bits(2, 2, {}, "a 2 x 2 mesh whose shard groups are the hosts"); }
void test_same_bits_context(void **) { same_bits(2, 0, {}, "stage 2, in a context of the 4 ranks", true); }
void test_same_bits_context_mesh(void **) {
    same_bits(2, 2, {}, "a 2 x 2 mesh in a context of the 4 ranks (its shard groups on their host's memory)", true);
}

void test_lossy_slow_link(void **) {
    netlab::Link link;
    link.delay_ms = 0.5;  // each host's link: 1 ms from host to host
    link.loss = 0.005;    // each way of each link: about 1% of the packets between hosts
    same_bits(2, 0, link, "1% of the packets lost, 1 ms between the hosts");
}

// Host 1's link goes down in the middle of step 5: every rank's step fails within its
// timeout, naming what it could not reach; the link comes back, the 4 regroup from their
// memory copies and finish on the bits of a run without the partition.
void test_partition(void **) {
    std::unique_ptr<netlab::Lab> lab = lab_or_skip();
    if (!lab) return;
    const std::string dir = fresh_dir("partition");
    const std::vector<std::string> args = {"--stage", "2", "--shard-size", "0"};
    std::vector<std::string> cut = args, plain = args;
    cut.insert(cut.end(), {"--scenario", "partition", "--out", dir + "/cut.bin"});
    plain.insert(plain.end(), {"--scenario", "plain", "--out", dir + "/plain.bin"});
    bool all_failed = false;
    const Run run = run_ranks(lab.get(), true, cut, dir, [&](const std::vector<pid_t> &) {
        for (int r = 0; r < 4; ++r) wait_for(dir + "/at5." + std::to_string(r), 30);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        netlab::Link down;
        down.up = false;
        lab->set_link(1, down);
        all_failed = true;
        for (int r = 0; r < 4; ++r) all_failed = wait_for(dir + "/failed." + std::to_string(r), 30) && all_failed;
        lab->set_link(1, netlab::Link());
        touch(dir + "/link-up");
    });
    if (!all_failed) fail_msg("not every rank's step failed while host 1 was cut off");
    check_statuses(run, {}, "the partition");
    for (int r = 0; r < 4; ++r) {
        std::ifstream f(dir + "/failed." + std::to_string(r));
        double took = 0;
        std::string line, text;
        f >> took;
        std::getline(f, line);
        std::getline(f, text);
        std::printf("rank %d (host %d) failed after %.1f s: %s\n", r, r / 2, took, text.c_str());
        if (took > 2.0 * kTimeoutMs / 1000.0)
            fail_msg("rank %d failed after %.1f s, beyond its timeout of %d ms", r, took, kTimeoutMs);
        // The other host, cut off from this one, and one of its ranks.
        const std::string other = "(host 'host-" + std::to_string(1 - r / 2) + "')";
        if (text.find(other) == std::string::npos || text.find("waiting for rank ") == std::string::npos)
            fail_msg("rank %d's error does not name the rank it waited for on the other host %s: %s", r,
                     other.c_str(), text.c_str());
    }
    check_statuses(run_ranks(lab.get(), false, plain, dir), {}, "without the partition");
    if (result_of(dir + "/cut.bin").substr(sizeof(int64_t)) != result_of(dir + "/plain.bin").substr(sizeof(int64_t)))
        fail_msg("after the partition and the regroup the params differ from a run without them");
    remove_dir(dir);
}

// Host 1's two ranks are killed at once in step 5; host 0's two regroup and finish, equal
// to 2 fresh ranks loading the step they restored.
void host_killed(int shard_size, const char *what) {
    std::unique_ptr<netlab::Lab> lab = lab_or_skip();
    if (!lab) return;
    const std::string dir = fresh_dir("killed");
    const std::string out = dir + "/survivors.bin";
    const Run run = run_ranks(lab.get(), true,
                              {"--scenario", "killed", "--stage", "2", "--shard-size", std::to_string(shard_size),
                               "--out", out},
                              dir, [&](const std::vector<pid_t> &pids) {
                                  for (int r = 0; r < 4; ++r) wait_for(dir + "/at5." + std::to_string(r), 30);
                                  ::kill(pids[2], SIGKILL);
                                  ::kill(pids[3], SIGKILL);
                              });
    check_statuses(run, {2, 3}, what);
    int64_t restored = -1;
    const std::string err = compare_with_reference(dir, out, 2, 2, 0, 4, shard_size, &restored);
    if (!err.empty()) fail_msg("%s: %s", what, err.c_str());
    std::printf("%s: host 1 lost in step 5; host 0's ranks restored step %lld and equal 2 fresh ranks\n", what,
                static_cast<long long>(restored));
    remove_dir(dir);
}

void test_host_killed_flat(void **) { host_killed(0, "flat, from the checkpoint"); }
void test_host_killed_mesh(void **) { host_killed(2, "a 2 x 2 mesh, host 0 a whole replica: from memory"); }

}  // namespace

int main(int argc, char **argv) {
    if (sxtest::is_child(argc, argv)) {
        // compare_with_reference's ranks, or a rank of the runs here.
        sxtest::ChildArgs a;
        if (!sxtest::parse_child_args(argc, argv, &a)) return 2;
        const std::string mode = a.get("--mode", "");
        if (mode == "clean") return clean_child(a);
        if (mode == "reference") return reference_child(a);
        return child_main(argc, argv);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits_stage1),   cmocka_unit_test(test_same_bits_stage2),
        cmocka_unit_test(test_same_bits_stage3),   cmocka_unit_test(test_same_bits_mesh),
        cmocka_unit_test(test_same_bits_context),  cmocka_unit_test(test_same_bits_context_mesh),
        cmocka_unit_test(test_lossy_slow_link),    cmocka_unit_test(test_partition),
        cmocka_unit_test(test_host_killed_flat),   cmocka_unit_test(test_host_killed_mesh),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
