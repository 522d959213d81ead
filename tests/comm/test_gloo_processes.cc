// The Gloo communicator with ranks as processes over tcp:// on 127.0.0.1: every
// collective, a rank killed with SIGKILL, and a rank stopped with SIGSTOP; the full
// mesh's connection through the store (comm/gloo/full_mesh.h): what it asks of the
// store, and a rank that never arrives; and a sparse mesh of 9 (scenarios "sparse-..."):
// its connection, every collective, and a rank killed.
//
// The test program is its own rank program: `test_comm_gloo_processes rank SCENARIO
// RANK WORLD PORT` runs one rank (spawned from /proc/self/exe by the tests below)
// and exits 0 if that rank saw what it should, 1 otherwise (saying why on stderr).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "collective_checks.h"
#include "comm/communicator.h"
#include "comm/gloo/full_mesh.h"
#include "rdzv/rendezvous.h"
#include "rdzv/store.h"
#include "comm_test_util.h"

extern char **environ;

using sx::Status;
using sx::comm::Communicator;
using sx::Millis;
using sxtest::ms_since;

namespace {

constexpr int kFaultTimeoutMs = 1500;
constexpr long long kSlackMs = 2500;
constexpr int kAbsentRank = 2;  // the rank that never arrives in the "absent" scenario

int rank_fails(int rank, const std::string &why) {
    std::fprintf(stderr, "rank %d: %s\n", rank, why.c_str());
    return 1;
}

// A rank's view of its store that counts what the mesh's connection asks of it.
class CountingStore final : public sx::rdzv::Store {
  public:
    explicit CountingStore(std::shared_ptr<sx::rdzv::Store> inner) : inner_(std::move(inner)) {}
    Status set(const std::string &key, const std::string &value) override {
        ++sets;
        return inner_->set(key, value);
    }
    Status get(const std::string &key, std::string *value, Millis timeout) override {
        ++gets;
        Status s = inner_->get(key, value, timeout);
        if (s.ok()) received += value->size(), largest = std::max(largest, value->size());
        return s;
    }
    Status wait(const std::vector<std::string> &keys, Millis timeout) override {
        ++others;
        return inner_->wait(keys, timeout);
    }
    Status add(const std::string &key, int64_t delta, int64_t *result) override {
        ++others;
        return inner_->add(key, delta, result);
    }
    Status check(const std::vector<std::string> &keys, bool *present) override {
        ++others;
        return inner_->check(keys, present);
    }
    Status erase(const std::string &key) override {
        ++erases;
        return inner_->erase(key);
    }
    int sets = 0, gets = 0, erases = 0, others = 0;
    size_t received = 0, largest = 0;

  private:
    std::shared_ptr<sx::rdzv::Store> inner_;
};

// "mesh": the connection asked the store for one SET, one GET and one ERASE per peer, got
// one socket address (at most 28 bytes) per GET, and left no key of the mesh behind. On a
// sparse mesh (its peers those of sparse_peers): one SET and one ERASE of its own key, one
// GET of each peer's, each holding that peer's pairs (at most 33 bytes each).
std::string check_mesh_traffic(const CountingStore &counted, sx::rdzv::Store &store, int r, int p, bool sparse) {
    const int peers = sparse ? static_cast<int>(sx::comm::sparse_peers(r, p).size()) : p - 1;
    const int sets = sparse ? 1 : peers, erases = sets;
    if (counted.sets != sets || counted.gets != peers || counted.erases != erases || counted.others != 0)
        return sx::format("the connection made %d SETs, %d GETs, %d ERASEs and %d other requests; expected %d, %d, "
                          "%d and 0",
                          counted.sets, counted.gets, counted.erases, counted.others, sets, peers, erases);
    const size_t most = sparse ? 33u * static_cast<size_t>(2 * 4) : 28;  // at 9 ranks a rank has 6 pairs at most
    if (counted.largest > most || counted.received > most * static_cast<size_t>(peers))
        return sx::format("the connection received %zu bytes (the largest value %zu) for %d peers", counted.received,
                          counted.largest, peers);
    for (int a = 0; a < p && r == 0 && sparse; ++a) {
        bool present = true;
        Status s = store.check({"gloo/" + std::to_string(a)}, &present);
        if (!s.ok() || present) return sx::format("key gloo/%d is still in the store (%s)", a, s.message().c_str());
    }
    for (int a = 0; a < p && r == 0; ++a) {
        for (int b = 0; b < p; ++b) {
            bool present = true;
            Status s = store.check({"gloo/" + std::to_string(a) + "/" + std::to_string(b)}, &present);
            if (!s.ok() || present) return sx::format("key gloo/%d/%d is still in the store (%s)", a, b,
                                                      s.message().c_str());
        }
    }
    return "";
}

// "absent": rank kAbsentRank never arrives; every other rank fails to connect within its
// timeout, naming that rank. Rank 0 (whose process serves the store) waits for the
// others to have failed before it goes.
int run_absent(std::unique_ptr<Communicator> *c, const std::shared_ptr<sx::rdzv::Store> &store,
               const sx::comm::GlooOptions &opts, int r, int p) {
    const auto start = sxtest::Clock::now();
    Status s = sx::comm::create_gloo_communicator(store, r, p, opts, c);
    const long long took = ms_since(start);
    const std::string absent = "rank " + std::to_string(kAbsentRank);
    if (s.code() != SX_ERR_TIMEOUT || s.message().find("no address came from " + absent) == std::string::npos)
        return rank_fails(r, "create returned " + std::to_string(s.code()) + ": " + s.message());
    if (took < kFaultTimeoutMs * 3 / 4 || took > kFaultTimeoutMs + kSlackMs)
        return rank_fails(r, "the error came after " + std::to_string(took) + " ms");
    std::fprintf(stderr, "rank %d: %lld ms: %s\n", r, took, s.message().c_str());
    s = store->set("failed/" + std::to_string(r), "");
    std::vector<std::string> failed;
    for (int q = 1; q < p && r == 0; ++q)
        if (q != kAbsentRank) failed.push_back("failed/" + std::to_string(q));
    if (s.ok() && r == 0) s = store->wait(failed, Millis(30000));
    return s.ok() ? 0 : rank_fails(r, "failed/: " + s.message());
}

// --- the rank program ---

int run_rank(const std::string &named, int r, int p, int port) {
    const bool sparse = named.rfind("sparse-", 0) == 0;
    const std::string scenario = sparse ? named.substr(7) : named;
    const std::string url = "tcp://127.0.0.1:" + std::to_string(port);
    sx::rdzv::Rendezvous rv;
    Status s = sx::rdzv::parse_rendezvous(url.c_str(), r, p, &rv);
    std::shared_ptr<sx::rdzv::Store> store;
    if (s.ok()) s = sx::rdzv::open_store(rv, Millis(30000), &store);
    if (!s.ok()) return rank_fails(r, "open_store: " + s.message());
    // Every rank is up before the clock of the (short) fault timeout starts.
    std::vector<std::string> ready;
    for (int q = 0; q < p; ++q)
        if (scenario != "absent" || q != kAbsentRank) ready.push_back("ready/" + std::to_string(q));
    s = store->set("ready/" + std::to_string(r), "");
    if (s.ok()) s = store->wait(ready, Millis(30000));
    if (!s.ok()) return rank_fails(r, "ready: " + s.message());

    const bool connects = scenario == "collectives" || scenario == "mesh";
    sx::comm::GlooOptions opts;
    opts.bind_address = "127.0.0.1";
    opts.timeout = Millis(connects ? 30000 : kFaultTimeoutMs);
    opts.mesh = sparse ? sx::comm::GlooOptions::Mesh::kSparse : sx::comm::GlooOptions::Mesh::kAuto;
    std::unique_ptr<Communicator> c;
    if (scenario == "absent") return run_absent(&c, store, opts, r, p);
    opts.in_process = scenario != "mesh";  // "mesh" counts the connection's requests alone
    auto counted = std::make_shared<CountingStore>(store);
    s = sx::comm::create_gloo_communicator(counted, r, p, opts, &c);
    if (!s.ok()) return rank_fails(r, "create: " + s.message());

    if (connects) {
        std::string e = sxtest::check_all_collectives(*c);
        if (e.empty()) s = c->barrier();  // every rank has connected, and read its keys
        if (e.empty() && !s.ok()) e = "barrier: " + s.message();
        if (e.empty() && scenario == "mesh") e = check_mesh_traffic(*counted, *store, r, p, sparse);
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

void run_world(const std::string &named, int p) {
    const std::string scenario = named.rfind("sparse-", 0) == 0 ? named.substr(7) : named;
    const int port = sxtest::free_port();
    const bool absent = scenario == "absent";
    std::vector<pid_t> pids;
    for (int r = 0; r < p; ++r) pids.push_back(absent && r == kAbsentRank ? 0 : spawn_rank(named, r, p, port));
    const auto deadline = sxtest::Clock::now() + std::chrono::seconds(50);
    bool ok = true;
    // The last rank is the faulty one in the fault scenarios: wait for the others first.
    for (int r = 0; r < p; ++r) {
        const bool faulty = (scenario == "killed" || scenario == "stalled") && r == p - 1;
        if (faulty || pids[static_cast<size_t>(r)] == 0) continue;
        int status = wait_rank(pids[static_cast<size_t>(r)], deadline);
        if (!exited_cleanly(status)) {
            print_error("%s: rank %d of %d ended with wait status %d\n", scenario.c_str(), r, p, status);
            ok = false;
        }
    }
    if (scenario == "killed" || scenario == "stalled") {
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
// Five processes connect their full mesh, one SET, GET and ERASE per peer each, and run
// every collective on it.
void test_mesh_world_5(void **) { run_world("mesh", 5); }
// Rank 2 of 5 never arrives: the four others fail at their timeout, naming it.
void test_absent_rank_world_5(void **) { run_world("absent", 5); }
// Nine processes connect a sparse mesh (each pairs with 6 ranks: its one key SET and
// ERASEd, one GET per pair) and run every collective on it.
void test_sparse_mesh_world_9(void **) { run_world("sparse-mesh", 9); }
// On a sparse mesh of 9, rank 8 is killed (SIGKILL) before a reduce-scatter: every other
// rank, paired with it or not, fails within the timeout and slack.
void test_sparse_killed_rank_world_9(void **) { run_world("sparse-killed", 9); }

}  // namespace

int main(int argc, char **argv) {
    if (argc == 6 && std::strcmp(argv[1], "rank") == 0)
        return run_rank(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives_world_2),
        cmocka_unit_test(test_collectives_world_3),
        cmocka_unit_test(test_killed_rank),
        cmocka_unit_test(test_stalled_rank),
        cmocka_unit_test(test_mesh_world_5),
        cmocka_unit_test(test_absent_rank_world_5),
        cmocka_unit_test(test_sparse_mesh_world_9),
        cmocka_unit_test(test_sparse_killed_rank_world_9),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
