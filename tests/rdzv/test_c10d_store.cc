// The client of torch's c10d TCPStore against real torch servers (c10d_server.py, run by
// the Python given as the first argument, the CMake cache's SX_TORCH_PYTHON): the Store
// contract on both of torch's backends, keys and bytes exchanged with torch's own
// client, large values and the limits, a group's keys removed when its last rank
// leaves, env:// under torchrun's variables, and the failures: a server that goes away,
// an address where nothing listens or something else answers.
//
// usage: test_c10d_store PYTHON SERVER_SCRIPT
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>

#include "rdzv/rendezvous.h"
#include "rdzv/stores.h"
#include "rdzv/tcp_store_server.h"
#include "comm_test_util.h"
#include "store_checks.h"

extern char **environ;

using sx::Status;
using sx::Millis;
using sx::rdzv::open_c10d_store;
using sx::rdzv::open_store;
using sx::rdzv::parse_rendezvous;
using sx::rdzv::Rendezvous;
using sx::rdzv::Store;
using sxtest::contains;
using sxtest::kSlackMs;
using sxtest::kStoreWait;
using sxtest::ms_since;

namespace {

const char *g_python = nullptr;
const char *g_script = nullptr;

// c10d_server.py as a child process: its stores' ports, and SIGKILL on destruction.
class TorchServers {
  public:
    // Starts the script and reads its ports; "" or what went wrong.
    std::string start() {
        int out[2], in[2];
        if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(in, O_CLOEXEC) != 0) return std::strerror(errno);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, in[0], 0);
        posix_spawn_file_actions_adddup2(&fa, out[1], 1);
        char *argv[] = {const_cast<char *>(g_python), const_cast<char *>(g_script), nullptr};
        int rc = ::posix_spawn(&pid_, g_python, &fa, nullptr, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        ::close(in[0]);
        ::close(out[1]);
        stdin_ = in[1];
        if (rc != 0) {
            ::close(out[0]);
            pid_ = -1;
            return std::string("cannot start ") + g_python + ": " + std::strerror(rc);
        }
        // torch takes seconds to import on a loaded machine.
        std::string text;
        const auto start = sxtest::Clock::now();
        while (text.find("classic ") == std::string::npos || text.back() != '\n') {
            struct pollfd p = {out[0], POLLIN, 0};
            const long long left = 120000 - ms_since(start);
            char buf[256];
            ssize_t n = 0;
            if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0 || (n = ::read(out[0], buf, sizeof buf)) <= 0) {
                ::close(out[0]);
                return "c10d_server.py did not print its ports (it printed '" + text + "')";
            }
            text.append(buf, static_cast<size_t>(n));
        }
        ::close(out[0]);
        if (std::sscanf(text.c_str(), "libuv %d classic %d", &libuv_, &classic_) != 2) {
            return "c10d_server.py printed '" + text + "'";
        }
        return "";
    }

    void kill() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
        if (stdin_ >= 0) ::close(stdin_);
        pid_ = -1;
        stdin_ = -1;
    }

    ~TorchServers() { kill(); }
    int libuv() const { return libuv_; }
    int classic() const { return classic_; }

  private:
    pid_t pid_ = -1;
    int stdin_ = -1;
    int libuv_ = 0;
    int classic_ = 0;
};

TorchServers *g_servers = nullptr;  // shared by the tests that do not stop them

// A rendezvous joining the store on `port` under `prefix`, as env:// under torchrun.
Rendezvous joined(int port, const std::string &prefix, int rank, int world) {
    Rendezvous rv;
    rv.scheme = Rendezvous::Scheme::kC10d;
    rv.url = "env://";
    rv.host = "127.0.0.1";
    rv.port = port;
    rv.key_prefix = prefix;
    rv.rank = rank;
    rv.world_size = world;
    return rv;
}

// Ranks of the next group under a prefix of its own on `port`, each time it is called.
sxtest::OpenGroup group_on(int port) {
    const std::string prefix = "sx/" + sxtest::unique_name("test") + "/";
    return [port, prefix](int world) {
        std::vector<std::shared_ptr<Store>> stores(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r)
            ASSERT_OK(open_store(joined(port, prefix, r, world), kStoreWait, &stores[static_cast<size_t>(r)]));
        return stores;
    };
}

// A client of the whole store (no prefix): what torch's own clients see.
std::shared_ptr<Store> raw(int port) {
    std::shared_ptr<Store> s;
    ASSERT_OK(open_c10d_store("127.0.0.1", port, kStoreWait, &s));
    return s;
}

enum Backend { kLibuv, kClassic };
int port_of(Backend b) { return b == kLibuv ? g_servers->libuv() : g_servers->classic(); }

void test_contract_libuv(void **) { sxtest::check_contract(group_on(port_of(kLibuv))); }
void test_contract_classic(void **) { sxtest::check_contract(group_on(port_of(kClassic))); }
void test_timeouts_libuv(void **) { sxtest::check_timeouts(group_on(port_of(kLibuv))); }
void test_timeouts_classic(void **) { sxtest::check_timeouts(group_on(port_of(kClassic))); }
void test_concurrent_adds_libuv(void **) { sxtest::check_concurrent_adds(group_on(port_of(kLibuv))); }
void test_concurrent_adds_classic(void **) { sxtest::check_concurrent_adds(group_on(port_of(kClassic))); }
void test_fresh_key_spaces_libuv(void **) { sxtest::check_fresh_key_spaces(group_on(port_of(kLibuv))); }
void test_fresh_key_spaces_classic(void **) { sxtest::check_fresh_key_spaces(group_on(port_of(kClassic))); }

// torch's own client (in c10d_server.py) reads what sx wrote, and sx what it wrote.
void check_interop(Backend b) {
    std::shared_ptr<Store> s = raw(port_of(b));
    std::string v;
    ASSERT_OK(s->get("interop/from-torch", &v, kStoreWait));
    assert_string_equal(v.c_str(), "hello from torch");
    const std::string bytes("sx\0\xff bytes", 10);
    ASSERT_OK(s->set("interop/from-sx", bytes));
    ASSERT_OK(s->get("interop/seen-by-torch", &v, kStoreWait));
    assert_true(v == bytes);
}

void test_interop_libuv(void **) { check_interop(kLibuv); }
void test_interop_classic(void **) { check_interop(kClassic); }

// The largest value and key torch's libuv server takes go through; larger ones are
// refused before anything is sent, by name, and the store goes on.
void check_limits(Backend b) {
    std::shared_ptr<Store> s = raw(port_of(b));
    const std::string prefix = sxtest::unique_name("limits") + "/";
    std::string big(8 << 20, '\0');
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 13));
    ASSERT_OK(s->set(prefix + "big", big));
    std::string v;
    ASSERT_OK(s->get(prefix + "big", &v, kStoreWait));
    assert_true(v == big);

    Status st = s->set(prefix + "bigger", big + "x");
    ASSERT_CODE(st, SX_ERR_INVALID_ARGUMENT);
    assert_true(contains(st.message(), "bigger") && contains(st.message(), "8388609"));
    const std::string longest(8191, 'k');
    ASSERT_OK(s->set(longest, "v"));
    ASSERT_OK(s->get(longest, &v, kStoreWait));
    assert_string_equal(v.c_str(), "v");
    ASSERT_CODE(s->set(longest + "k", "v"), SX_ERR_INVALID_ARGUMENT);
    ASSERT_CODE(s->add(longest + "k", 1, nullptr), SX_ERR_INVALID_ARGUMENT);
    ASSERT_OK(s->erase(longest));
    ASSERT_OK(s->erase(prefix + "big"));
}

void test_limits_libuv(void **) { check_limits(kLibuv); }
void test_limits_classic(void **) { check_limits(kClassic); }

// erase_prefix removes the keys under the prefix, and only those; the last of three
// ranks to leave a group removes the group's keys, as they outlive it in the agent's store.
void check_erase(Backend b) {
    std::shared_ptr<Store> s = raw(port_of(b));
    const std::string p = sxtest::unique_name("erase");
    ASSERT_OK(s->set(p + "/a/1", "1"));
    ASSERT_OK(s->set(p + "/a/2", "2"));
    ASSERT_OK(s->set(p + "/ab", "3"));
    ASSERT_OK(s->erase_prefix(p + "/a/"));
    bool present = true;
    ASSERT_OK(s->check({p + "/a/1"}, &present));
    assert_false(present);
    ASSERT_OK(s->check({p + "/a/2"}, &present));
    assert_false(present);
    ASSERT_OK(s->check({p + "/ab"}, &present));
    assert_true(present);

    const std::string prefix = "sx/" + p + "/";
    std::vector<std::shared_ptr<Store>> g(3);
    for (int r = 0; r < 3; ++r) ASSERT_OK(open_store(joined(port_of(b), prefix, r, 3), kStoreWait, &g[r]));
    ASSERT_OK(g[1]->set("addr", "x"));
    g[0].reset();
    g[2].reset();
    ASSERT_OK(s->check({prefix + "g1/addr"}, &present));  // one rank still in: keys stay
    assert_true(present);
    g[1].reset();
    ASSERT_OK(s->check({prefix + "g1/addr"}, &present));
    assert_false(present);
    ASSERT_OK(s->check({prefix + "g1/__sx/left"}, &present));
    assert_false(present);
}

void test_erase_libuv(void **) { check_erase(kLibuv); }
void test_erase_classic(void **) { check_erase(kClassic); }

// env:// with the variables torchrun sets joins the agent's store under
// sx/RUN/ATTEMPT/g<N>/, beside torch's keys; a restarted attempt starts afresh.
void test_env_under_torchrun(void **) {
    const std::string port = std::to_string(g_servers->libuv());
    const std::string run = sxtest::unique_name("run");
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    setenv("TORCHELASTIC_RUN_ID", run.c_str(), 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port.c_str(), 1);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    Rendezvous rv;
    ASSERT_OK(parse_rendezvous("env://", 0, 0, &rv));
    assert_true(rv.scheme == Rendezvous::Scheme::kC10d);
    assert_string_equal(rv.key_prefix.c_str(), ("sx/" + run + "/0/").c_str());
    std::shared_ptr<Store> rank0, rank1;
    ASSERT_OK(open_store(rv, kStoreWait, &rank0));
    rv.rank = 1;
    ASSERT_OK(open_store(rv, kStoreWait, &rank1));
    ASSERT_OK(rank1->set("gloo/addr", "here"));
    std::string v;
    ASSERT_OK(rank0->get("gloo/addr", &v, kStoreWait));
    assert_string_equal(v.c_str(), "here");
    std::shared_ptr<Store> torch_view = raw(g_servers->libuv());
    ASSERT_OK(torch_view->get("sx/" + run + "/0/g1/gloo/addr", &v, kStoreWait));
    assert_string_equal(v.c_str(), "here");

    // The agent restarts the workers: their first group is g1 again, but not the old one.
    setenv("TORCHELASTIC_RESTART_COUNT", "1", 1);
    ASSERT_OK(parse_rendezvous("env://", 0, 0, &rv));
    std::shared_ptr<Store> again;
    ASSERT_OK(open_store(rv, kStoreWait, &again));
    bool present = true;
    ASSERT_OK(again->check({"gloo/addr"}, &present));
    assert_false(present);
    for (const char *name : {"TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                             "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"})
        unsetenv(name);
}

// A server that goes away: a held get fails at once, not at its timeout, naming the
// address; so does the next request, which finds nothing listening.
void test_server_goes_away(void **) {
    TorchServers doomed;
    const std::string started = doomed.start();
    if (!started.empty()) {
        print_error("%s\n", started.c_str());
        fail();
    }
    std::shared_ptr<Store> s = raw(doomed.libuv());
    ASSERT_OK(s->set("k", "v"));
    Status held;
    long long took = 0;
    std::thread waiter([&] {
        const auto start = sxtest::Clock::now();
        std::string v;
        held = s->get("never", &v, Millis(20000));
        took = ms_since(start);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    doomed.kill();
    waiter.join();
    ASSERT_CODE(held, SX_ERR_COMM);
    const std::string where = "127.0.0.1:" + std::to_string(doomed.libuv());
    assert_true(contains(held.message(), where.c_str()) && contains(held.message(), "'never'"));
    assert_true(took < 300 + kSlackMs);

    const auto start = sxtest::Clock::now();
    Status st = s->set("k", "w");
    ASSERT_CODE(st, SX_ERR_COMM);
    assert_true(contains(st.message(), where.c_str()) && contains(st.message(), "gone"));
    assert_true(ms_since(start) < kSlackMs);
}

// Nothing listens at the address: SX_ERR_TIMEOUT at the timeout, naming it. A name that
// does not exist fails at once. A server that is not a c10d store fails the
// handshake: sx's own store closes the connection, a silent one times out.
void test_wrong_address(void **) {
    const int nobody = sxtest::free_port();
    std::shared_ptr<Store> s;
    auto start = sxtest::Clock::now();
    Status st = open_c10d_store("127.0.0.1", nobody, Millis(500), &s);
    long long took = ms_since(start);
    ASSERT_CODE(st, SX_ERR_TIMEOUT);
    assert_true(contains(st.message(), ("127.0.0.1:" + std::to_string(nobody)).c_str()));
    assert_true(took >= 490 && took <= 500 + kSlackMs);

    // A resolver that answers says the name does not exist, and that is final. Where no
    // resolver answers (a machine without a DNS server), it may yet: retried to the timeout.
    st = open_c10d_store("no-such-host.invalid", 4000, Millis(500), &s);
    if (st.code() != SX_ERR_INVALID_ARGUMENT) ASSERT_CODE(st, SX_ERR_TIMEOUT);
    assert_true(contains(st.message(), "cannot resolve the rendezvous host 'no-such-host.invalid'"));

    const int ours = sxtest::free_port();
    std::shared_ptr<sx::rdzv::TcpStoreServer> server;
    sx::rdzv::ServerOptions so;
    so.host = "127.0.0.1";
    so.port = ours;
    ASSERT_OK(sx::rdzv::TcpStoreServer::acquire(so, &server));
    st = open_c10d_store("127.0.0.1", ours, Millis(5000), &s);
    ASSERT_CODE(st, SX_ERR_COMM);
    assert_true(contains(st.message(), "handshake") && contains(st.message(), std::to_string(ours).c_str()));

    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    assert_int_equal(::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    assert_int_equal(::listen(fd, 4), 0);  // accepted by the kernel, never answered
    assert_int_equal(::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len), 0);
    start = sxtest::Clock::now();
    st = open_c10d_store("127.0.0.1", ntohs(a.sin_port), Millis(500), &s);
    took = ms_since(start);
    ::close(fd);
    ASSERT_CODE(st, SX_ERR_TIMEOUT);
    assert_true(contains(st.message(), "handshake"));
    assert_true(took >= 490 && took <= 500 + kSlackMs);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s PYTHON SERVER_SCRIPT\n", argv[0]);
        return 2;
    }
    g_python = argv[1];
    g_script = argv[2];
    TorchServers servers;
    const std::string started = servers.start();
    if (!started.empty()) {
        std::fprintf(stderr, "%s\n", started.c_str());
        return 1;
    }
    g_servers = &servers;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contract_libuv),
        cmocka_unit_test(test_contract_classic),
        cmocka_unit_test(test_timeouts_libuv),
        cmocka_unit_test(test_timeouts_classic),
        cmocka_unit_test(test_concurrent_adds_libuv),
        cmocka_unit_test(test_concurrent_adds_classic),
        cmocka_unit_test(test_fresh_key_spaces_libuv),
        cmocka_unit_test(test_fresh_key_spaces_classic),
        cmocka_unit_test(test_interop_libuv),
        cmocka_unit_test(test_interop_classic),
        cmocka_unit_test(test_limits_libuv),
        cmocka_unit_test(test_limits_classic),
        cmocka_unit_test(test_erase_libuv),
        cmocka_unit_test(test_erase_classic),
        cmocka_unit_test(test_env_under_torchrun),
        cmocka_unit_test(test_server_goes_away),
        cmocka_unit_test(test_wrong_address),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
