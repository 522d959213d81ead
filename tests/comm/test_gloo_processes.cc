// The Gloo communicator with ranks as processes over tcp:// on 127.0.0.1: every
// collective, a rank killed with SIGKILL, and a rank stopped with SIGSTOP.
//
// The test program is its own rank program: `test_comm_gloo_processes rank SCENARIO
// RANK WORLD PORT` runs one rank (spawned from /proc/self/exe by the tests below)
// and exits 0 if that rank saw what it should, 1 otherwise (saying why on stderr).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>

#include "collective_checks.h"
#include "comm/communicator.h"
#include "rdzv/rendezvous.h"
#include "comm_test_util.h"

extern char **environ;

using sx::Status;
using sx::comm::Communicator;
using sx::Millis;
using sxtest::ms_since;

namespace {

constexpr int kFaultTimeoutMs = 1500;
constexpr long long kSlackMs = 2500;

// --- the rank program ---

int rank_fails(int rank, const std::string &why) {
    std::fprintf(stderr, "rank %d: %s\n", rank, why.c_str());
    return 1;
}

int run_rank(const std::string &scenario, int r, int p, int port) {
    const std::string url = "tcp://127.0.0.1:" + std::to_string(port);
    sx::rdzv::Rendezvous rv;
    Status s = sx::rdzv::parse_rendezvous(url.c_str(), r, p, &rv);
    std::shared_ptr<sx::rdzv::Store> store;
    if (s.ok()) s = sx::rdzv::open_store(rv, Millis(30000), &store);
    if (!s.ok()) return rank_fails(r, "open_store: " + s.message());
    // Every rank is up before the clock of the (short) fault timeout starts.
    std::vector<std::string> ready;
    for (int q = 0; q < p; ++q) ready.push_back("ready/" + std::to_string(q));
    s = store->set(ready[static_cast<size_t>(r)], "");
    if (s.ok()) s = store->wait(ready, Millis(30000));
    if (!s.ok()) return rank_fails(r, "ready: " + s.message());

    sx::comm::GlooOptions opts;
    opts.bind_address = "127.0.0.1";
    opts.timeout = Millis(scenario == "collectives" ? 30000 : kFaultTimeoutMs);
    std::unique_ptr<Communicator> c;
    s = sx::comm::create_gloo_communicator(store, r, p, opts, &c);
    if (!s.ok()) return rank_fails(r, "create: " + s.message());

    if (scenario == "collectives") {
        std::string e = sxtest::check_all_collectives(*c);
        return e.empty() ? 0 : rank_fails(r, e);
    }

    s = c->barrier();
    if (!s.ok()) return rank_fails(r, "barrier: " + s.message());
    const bool killed = scenario == "killed";
    if (r == p - 1) {
        // Let the barrier's last messages reach the others before this rank goes.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        raise(killed ? SIGKILL : SIGSTOP);
        return rank_fails(r, "still running after raise()");  // SIGSTOP: the parent kills us
    }
    if (killed) std::this_thread::sleep_for(std::chrono::milliseconds(700));  // rank p-1 is dead by now

    std::vector<float> buf(static_cast<size_t>(p) * 100000, 1.0f), out(100000);
    auto start = sxtest::Clock::now();
    s = c->reduce_scatter_sum(buf.data(), 100000, out.data(), false);
    long long took = ms_since(start);
    const bool code_ok = killed ? (s.code() == SX_ERR_COMM || s.code() == SX_ERR_TIMEOUT) : s.code() == SX_ERR_TIMEOUT;
    if (!code_ok) return rank_fails(r, "reduce_scatter_sum returned " + std::to_string(s.code()) + ": " + s.message());
    if (took > kFaultTimeoutMs + kSlackMs) return rank_fails(r, "the error came after " + std::to_string(took) + " ms");
    if (!killed && took < kFaultTimeoutMs * 3 / 4)
        return rank_fails(r, "timed out after only " + std::to_string(took) + " ms");
    std::fprintf(stderr, "rank %d: %lld ms: %s\n", r, took, s.message().c_str());

    start = sxtest::Clock::now();
    c.reset();
    store.reset();
    if (ms_since(start) > 3000) return rank_fails(r, "destruction took " + std::to_string(ms_since(start)) + " ms");
    return 0;
}

// --- the tests ---

pid_t spawn_rank(const std::string &scenario, int r, int p, int port) {
    std::vector<std::string> args = {"rank", scenario, std::to_string(r), std::to_string(p), std::to_string(port)};
    std::vector<char *> argv = {const_cast<char *>("/proc/self/exe")};
    for (std::string &a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    pid_t pid = 0;
    int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
    if (rc != 0) {
        print_error("posix_spawn: %s\n", std::strerror(rc));
        fail();
    }
    return pid;
}

// Waits for `pid` until `deadline`; kills it if it is still running then. Returns the
// wait status, or -1 if it had to be killed.
int wait_rank(pid_t pid, sxtest::Clock::time_point deadline) {
    int status = 0;
    while (sxtest::Clock::now() < deadline) {
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) return status;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

bool exited_cleanly(int status) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

void run_world(const std::string &scenario, int p) {
    const int port = sxtest::free_port();
    std::vector<pid_t> pids;
    for (int r = 0; r < p; ++r) pids.push_back(spawn_rank(scenario, r, p, port));
    const auto deadline = sxtest::Clock::now() + std::chrono::seconds(50);
    bool ok = true;
    // The last rank is the faulty one in the fault scenarios: wait for the others first.
    for (int r = 0; r < p; ++r) {
        const bool faulty = scenario != "collectives" && r == p - 1;
        if (faulty) continue;
        int status = wait_rank(pids[static_cast<size_t>(r)], deadline);
        if (!exited_cleanly(status)) {
            print_error("%s: rank %d of %d ended with wait status %d\n", scenario.c_str(), r, p, status);
            ok = false;
        }
    }
    if (scenario != "collectives") {
        pid_t faulty = pids.back();
        if (scenario == "stalled") kill(faulty, SIGKILL);  // stopped, waiting for this
        int status = wait_rank(faulty, deadline);
        if (status == -1 || !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
            print_error("%s: the faulty rank ended with wait status %d\n", scenario.c_str(), status);
            ok = false;
        }
    }
    assert_true(ok);
}

void test_collectives_world_2(void **) { run_world("collectives", 2); }
void test_collectives_world_3(void **) { run_world("collectives", 3); }
void test_killed_rank(void **) { run_world("killed", 3); }
void test_stalled_rank(void **) { run_world("stalled", 3); }

}  // namespace

int main(int argc, char **argv) {
    if (argc == 6 && std::strcmp(argv[1], "rank") == 0)
        return run_rank(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives_world_2),
        cmocka_unit_test(test_collectives_world_3),
        cmocka_unit_test(test_killed_rank),
        cmocka_unit_test(test_stalled_rank),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
