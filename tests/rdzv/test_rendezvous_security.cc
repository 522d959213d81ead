// The TCP rendezvous under attack and misconfiguration, through the public API and raw
// sockets on 127.0.0.1: a shared token (right, wrong, missing, on one side only; ranks
// as threads and as processes), the server going on serving the others; 100 hostile
// connections (garbage, half frames, oversized lengths) while a group forms, which still
// forms, with the server's buffered bytes and the process's resident memory bounded; the
// store's caps through a real server; the bind address; the bound on the world size and
// the deadline of creation. `test_rdzv_rendezvous_security rank R PORT MODE` runs one rank
// of the process test (spawned from /proc/self/exe).
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "rdzv/rendezvous.h"
#include "rdzv/stores.h"
#include "rdzv/tcp_store_protocol.h"
#include "rdzv/tcp_store_server.h"
#include "comm_test_util.h"
#include "store_checks.h"
#include "sx/sx.h"

extern char **environ;

using sx::rdzv::ServerOptions;
using sx::rdzv::StoreLimits;
using sx::rdzv::TcpStoreServer;
using sxtest::contains;
using sxtest::ms_since;
namespace wire = sx::rdzv::wire;

namespace {

const char kToken[] = "correct horse battery staple";
const char kWrongToken[] = "incorrect mule";

// Every log message of the library, to check that no token shows in one.
std::mutex log_mu;
std::string log_text;
void capture_log(int32_t, const char *message, void *) {
    std::lock_guard<std::mutex> lock(log_mu);
    log_text += message;
    log_text += "\n";
}

int setup(void **) {
    unsetenv("SX_RENDEZVOUS_TOKEN");
    unsetenv("SX_RENDEZVOUS_BIND");
    sx_set_log_callback(capture_log, nullptr, SX_LOG_DEBUG);
    return 0;
}

struct Outcome {
    sx_status_t status = SX_OK;
    std::string message;
    long long ms = 0;
};

// Creates rank `rank` of `world` on tcp://HOST:PORT and destroys it again.
Outcome join(const std::string &host, int port, int rank, int world, const char *token, int timeout_ms = 20000,
             const char *bind = nullptr) {
    const std::string rv = "tcp://" + host + ":" + std::to_string(port);
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = rv.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.num_threads = 1;
    cfg.timeout_ms = timeout_ms;
    cfg.rendezvous_token = token;
    cfg.rendezvous_bind = bind;
    sx_shard_group_t *g = nullptr;
    const auto start = sxtest::Clock::now();
    Outcome o;
    o.status = sx_create_shard_group(&cfg, &g);
    o.ms = ms_since(start);
    if (o.status != SX_OK) o.message = sx_last_error_message();
    sx_destroy_shard_group(g);
    return o;
}

std::string describe(const Outcome &o) { return std::to_string(o.status) + " after " + std::to_string(o.ms) + " ms: " + o.message; }

void expect_refused(const Outcome &o, const char *part) {
    if (o.status != SX_ERR_INVALID_ARGUMENT || !contains(o.message, part) || o.ms > 5000 ||
        contains(o.message, kToken) || contains(o.message, kWrongToken)) {
        print_error("expected SX_ERR_INVALID_ARGUMENT at once naming \"%s\", got %s\n", part, describe(o).c_str());
        fail();
    }
}

void expect_ok(const Outcome &o, const char *who) {
    if (o.status != SX_OK) {
        print_error("%s: %s\n", who, describe(o).c_str());
        fail();
    }
}

void expect_no_token_in_log() {
    std::lock_guard<std::mutex> lock(log_mu);
    assert_false(contains(log_text, kToken));
    assert_false(contains(log_text, kWrongToken));
}

// Ranks 0 and 1 (threads) hold the token; a rank 2 with a wrong token, then one with
// none, are refused at once while the server goes on serving; then rank 2 joins with the
// right one and the group forms. (The refused ones spell the host "localhost": a process
// counts its groups per rendezvous URL and rank (key_space.cc), and these stand for
// other processes, whose attempts do not count here.)
void test_token_threads(void **) {
    const int port = sxtest::free_port();
    Outcome r0, r1, wrong, none, right;
    std::thread t0([&] { r0 = join("127.0.0.1", port, 0, 3, kToken); });
    std::thread t1([&] { r1 = join("127.0.0.1", port, 1, 3, kToken); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    wrong = join("localhost", port, 2, 3, kWrongToken);
    none = join("localhost", port, 2, 3, nullptr);
    right = join("127.0.0.1", port, 2, 3, kToken);
    t0.join();
    t1.join();
    expect_refused(wrong, "does not match");
    expect_refused(none, "requires a token");
    expect_ok(r0, "rank 0");
    expect_ok(r1, "rank 1");
    expect_ok(right, "rank 2 with the token");
    expect_no_token_in_log();
}

// A rank with a token refuses a server that has none (it could be anyone's).
void test_token_on_one_side(void **) {
    const int port = sxtest::free_port();
    Outcome r0, r1;
    std::thread t0([&] { r0 = join("127.0.0.1", port, 0, 2, nullptr, 3000); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    r1 = join("127.0.0.1", port, 1, 2, kToken, 3000);
    t0.join();
    expect_refused(r1, "asks for no token");
    assert_int_equal(r0.status, SX_ERR_TIMEOUT);
    // A token from the environment counts as one from the config.
    const int port2 = sxtest::free_port();
    setenv("SX_RENDEZVOUS_TOKEN", kToken, 1);
    Outcome a, b;
    std::thread ta([&] { a = join("127.0.0.1", port2, 0, 2, nullptr); });
    b = join("127.0.0.1", port2, 1, 2, nullptr);
    ta.join();
    unsetenv("SX_RENDEZVOUS_TOKEN");
    expect_ok(a, "rank 0 (token from the environment)");
    expect_ok(b, "rank 1 (token from the environment)");
    // An overlong token is refused by name, without showing it.
    std::string huge(sx::rdzv::kMaxTokenBytes + 1, 't');
    Outcome h = join("127.0.0.1", sxtest::free_port(), 0, 2, huge.c_str(), 1000);
    assert_int_equal(h.status, SX_ERR_INVALID_ARGUMENT);
    assert_true(contains(h.message, "rendezvous_token") && !contains(h.message, "tttt"));
}

// --- ranks as processes ---

int run_rank(int rank, int port, const std::string &mode) {
    setup(nullptr);
    if (mode == "env") setenv("SX_RENDEZVOUS_TOKEN", kToken, 1);
    if (mode == "wrong" || mode == "none") {
        Outcome w = join("127.0.0.1", port, rank, 3, mode == "wrong" ? kWrongToken : nullptr);
        const char *expected = mode == "wrong" ? "does not match" : "requires a token";
        if (w.status != SX_ERR_INVALID_ARGUMENT || !contains(w.message, expected) || w.ms > 5000) {
            std::fprintf(stderr, "rank %d, %s token: %s\n", rank, mode.c_str(), describe(w).c_str());
            return 2;
        }
        return contains(log_text, kToken) || contains(log_text, kWrongToken) ? 3 : 0;
    }
    Outcome o = join("127.0.0.1", port, rank, 3, mode == "env" ? nullptr : kToken);
    if (o.status != SX_OK) {
        std::fprintf(stderr, "rank %d (%s): %s\n", rank, mode.c_str(), describe(o).c_str());
        return 1;
    }
    return contains(log_text, kToken) ? 3 : 0;
}

pid_t spawn_rank(int rank, int port, const char *mode) {
    std::vector<std::string> args = {"rank", std::to_string(rank), std::to_string(port), mode};
    std::vector<char *> argv = {const_cast<char *>("/proc/self/exe")};
    for (std::string &a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    pid_t pid = 0;
    int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
    assert_int_equal(rc, 0);
    return pid;
}

// Rank 0 has the token in its config, rank 1 in SX_RENDEZVOUS_TOKEN; a process with a
// wrong token and one with none are refused while the two wait; then rank 2 joins.
void test_token_processes(void **) {
    const int port = sxtest::free_port();
    std::vector<pid_t> pids = {spawn_rank(0, port, "config"), spawn_rank(1, port, "env")};
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (const char *mode : {"wrong", "none"}) {
        pid_t stranger = spawn_rank(2, port, mode);
        int status = 0;
        waitpid(stranger, &status, 0);
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            print_error("the process with %s token ended with wait status %d\n", mode, status);
            fail();
        }
    }
    pids.push_back(spawn_rank(2, port, "config"));
    bool ok = true;
    for (size_t r = 0; r < pids.size(); ++r) {
        int status = 0;
        const auto deadline = sxtest::Clock::now() + std::chrono::seconds(60);
        pid_t done = 0;
        while ((done = waitpid(pids[r], &status, WNOHANG)) == 0 && sxtest::Clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (done == 0) {
            kill(pids[r], SIGKILL);
            waitpid(pids[r], &status, 0);
        }
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            print_error("rank %zu ended with wait status %d\n", r, status);
            ok = false;
        }
    }
    assert_true(ok);
}

// --- hostile connections ---

// A blocking socket to 127.0.0.1:port whose sends give up after a second.
int connect_to(const char *address, int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, address, &a.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
        ::close(fd);
        return -1;
    }
    struct timeval tv = {1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return fd;
}

void send_some(int fd, const std::string &bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
        ssize_t k = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
        if (k <= 0) return;  // refused, closed or stuck: what a server should do to it
        done += static_cast<size_t>(k);
    }
}

std::string header(uint32_t n) {
    std::string h(4, '\0');
    for (int i = 0; i < 4; ++i) h[i] = static_cast<char>(n >> (8 * i));
    return h;
}

long long resident_kib() {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
        if (line.compare(0, 6, "VmRSS:") == 0) return std::atoll(line.c_str() + 6);
    return -1;
}

std::shared_ptr<TcpStoreServer> serve(int port, const std::string &token, int world, StoreLimits limits = StoreLimits()) {
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.token = token;
    o.world_size = world;
    o.limits = limits;
    std::shared_ptr<TcpStoreServer> s;
    ASSERT_OK(TcpStoreServer::acquire(o, &s));
    return s;
}

// 100 connections: 40 send garbage, 30 half a frame (and stay), 30 a frame length of
// 60 MiB followed by 2 MiB of it; then 3 ranks form a group with the token while they
// are all still open. The group forms; the server buffered at most what 100 unadmitted
// connections may (264 bytes each) and the ranks' own requests; the process's resident
// memory grew by less than 16 MiB over the attack (the 30 oversized frames alone were
// 60 MiB of buffers before the limits).
void test_hostile_connections(void **) {
    const int port = sxtest::free_port();
    auto server = serve(port, kToken, 3);  // the server rank 0's group will share
    std::mt19937 rng(7);
    // Every buffer the attack sends is made before the first measurement and reused:
    // under AddressSanitizer freed memory stays resident for a while (its quarantine),
    // and a fresh 2 MiB string per connection would be counted against the server.
    std::string garbage(1024, '\0');
    const std::string oversized = header(60u << 20) + std::string(2u << 20, 'z');
    const std::string half = header(200) + std::string(100, 'h');
    std::vector<int> fds;
    fds.reserve(100);
    const long long before = resident_kib();
    for (int i = 0; i < 100; ++i) {
        int fd = connect_to("127.0.0.1", port);
        assert_true(fd >= 0);
        fds.push_back(fd);
        if (i < 40) {
            for (char &c : garbage) c = static_cast<char>(rng());
            send_some(fd, garbage);
        } else if (i < 70) {
            send_some(fd, half);
        } else {
            send_some(fd, oversized);
        }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const long long during = resident_kib();
    Outcome r[3];
    std::vector<std::thread> ts;
    for (int k = 0; k < 3; ++k) ts.emplace_back([&, k] { r[k] = join("127.0.0.1", port, k, 3, kToken, 30000); });
    for (std::thread &t : ts) t.join();
    for (int k = 0; k < 3; ++k) expect_ok(r[k], "a rank among the hostile connections");
    const sx::rdzv::StoreCore::Stats st = server->stats();
    std::fprintf(stderr, "hostile: peak buffered %zu bytes, %llu refused, %zu connections at most, VmRSS %lld -> %lld KiB\n",
                 st.peak_buffered_bytes, static_cast<unsigned long long>(st.refused), server->peak_connections(),
                 before, during);
    assert_true(st.peak_buffered_bytes <= 100 * (wire::kPreAdmissionFrame + 8) + (64u << 10));
    assert_true(st.refused >= 30);  // the oversized at least; garbage too, unless its length fits
    assert_true(during - before < 16 * 1024);
    for (int fd : fds) ::close(fd);
    expect_no_token_in_log();
}

// The case: 8 SETs of 16 MiB from strangers before admission hold nothing.
void test_unadmitted_sets_hold_nothing(void **) {
    const int port = sxtest::free_port();
    auto server = serve(port, kToken, 2);
    const std::string value(16u << 20, 'v');
    for (int i = 0; i < 8; ++i) {
        int fd = connect_to("127.0.0.1", port);
        assert_true(fd >= 0);
        send_some(fd, wire::Writer().u8(wire::kSet).str("k" + std::to_string(i)).str(value).frame());
        ::close(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto st = server->stats();
    assert_int_equal(st.keys, 0);
    assert_int_equal(st.stored_bytes, 0);
    assert_true(st.peak_buffered_bytes <= 8 * (wire::kPreAdmissionFrame + 8));
}

// The attack as it was reported: ten connections, on a server without a token, each say
// HELLO (and are admitted) and then send 8 MiB of a frame that claims 64 MiB. Each is
// closed when the length arrives, over the 16 MiB frame limit, with at most one read
// (64 KiB) of it buffered (the server grew by 88 MB before the limits).
void test_reported_attack(void **) {
    const int port = sxtest::free_port();
    auto server = serve(port, "", 2);
    const std::string hello = wire::Writer().u8(wire::kHello).frame();
    const std::string frame = header(64u << 20) + std::string(8u << 20, 'a');
    const long long before = resident_kib();
    std::vector<int> fds;
    for (int i = 0; i < 10; ++i) {
        int fd = connect_to("127.0.0.1", port);
        assert_true(fd >= 0);
        send_some(fd, hello);
        char reply[64];
        struct timeval tv = {5, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        assert_true(::recv(fd, reply, sizeof reply, 0) > 4);  // admitted: id, no token, no nonce
        send_some(fd, frame);
        fds.push_back(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const long long after = resident_kib();
    const auto st = server->stats();
    std::fprintf(stderr, "reported attack: peak buffered %zu bytes, %llu refused, VmRSS %lld -> %lld KiB\n",
                 st.peak_buffered_bytes, static_cast<unsigned long long>(st.refused), before, after);
    assert_int_equal(st.refused, 10);
    assert_true(st.peak_buffered_bytes <= 10 * (64u << 10));
    assert_true(after - before < 16 * 1024);
    for (int fd : fds) ::close(fd);
}

// True once the server closed fd (it reads EOF, maybe after an error frame).
bool closed_by_server(int fd) {
    char buf[256];
    for (;;) {
        const ssize_t k = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k == 0) return true;
        if (k < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
    }
}

// Strangers that connect and send nothing: the server never holds more than its limit
// (2 x world size + 128), and closes each about 2 s after it came without a HELLO; a rank
// is served afterwards.
void test_connection_cap(void **) {
    const int port = sxtest::free_port();
    auto server = serve(port, kToken, 1);
    const size_t cap = 2 * 1 + TcpStoreServer::kSpareConnections;
    std::vector<int> fds;
    for (size_t i = 0; i < cap + 12; ++i) {
        int fd = connect_to("127.0.0.1", port);  // the kernel accepts; the server decides
        assert_true(fd >= 0);
        fds.push_back(fd);
    }
    size_t most = 0, closed = 0;
    const auto until = sxtest::Clock::now() + std::chrono::seconds(8);
    while (sxtest::Clock::now() < until) {
        most = std::max(most, server->connections());
        closed = 0;
        for (int fd : fds) closed += closed_by_server(fd) ? 1 : 0;
        if (closed == fds.size()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::fprintf(stderr, "connection cap %zu: at most %zu open, %zu of %zu closed by the server\n", cap, most, closed,
                 fds.size());
    // A newcomer at the limit is accepted an instant before the one it replaces is closed.
    assert_true(most <= cap + 1);
    assert_int_equal(closed, fds.size());
    for (int fd : fds) ::close(fd);
    expect_ok(join("127.0.0.1", port, 0, 1, kToken, 5000), "a rank after the strangers left");
}

// The starvation that was reported: 200 connections held open, each reopened as soon
// as the server closes it, kept a rank out until its timeout. Now each newcomer at the
// limit takes the place of the oldest connection not admitted, so the rank, admitted
// within milliseconds of connecting, joins while the flood goes on.
void test_held_connections_do_not_starve_a_rank(void **) {
    const int port = sxtest::free_port();
    auto server = serve(port, kToken, 1);
    std::atomic<bool> stop{false};
    std::atomic<long> reopened{0};
    std::thread flood([&] {
        std::vector<int> fds(200, -1);
        while (!stop.load()) {
            for (int &fd : fds) {
                if (fd >= 0 && !closed_by_server(fd)) continue;
                if (fd >= 0) ::close(fd), reopened.fetch_add(1);
                fd = connect_to("127.0.0.1", port);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        for (int fd : fds)
            if (fd >= 0) ::close(fd);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the flood fills the server
    const Outcome o = join("127.0.0.1", port, 0, 1, kToken, 10000);
    stop.store(true);
    flood.join();
    std::fprintf(stderr, "held connections: the rank joined in %lld ms; the flood reopened %ld connections\n",
                 static_cast<long long>(o.ms), reopened.load());
    expect_ok(o, "a rank among 200 held connections");
}

// Where every connection is admitted (a server without a token admits at HELLO), a
// newcomer is told that the server is saturated, and a rank that cannot get in says so
// rather than that rank 0 did not open its group.
void test_a_full_server_says_so(void **) {
    const int port = sxtest::free_port();
    auto server = serve(port, "", 1);
    const size_t cap = 2 * 1 + TcpStoreServer::kSpareConnections;
    const std::string hello = sx::rdzv::wire::Writer().u8(sx::rdzv::wire::kHello).frame();
    std::vector<int> fds;
    for (size_t i = 0; i < cap; ++i) {
        int fd = connect_to("127.0.0.1", port);
        assert_true(fd >= 0);
        send_some(fd, hello);
        char reply[4];
        assert_int_equal(::recv(fd, reply, sizeof reply, MSG_WAITALL), 4);  // answered: admitted
        fds.push_back(fd);
    }
    const Outcome o = join("127.0.0.1", port, 0, 1, nullptr, 1500);
    for (int fd : fds) ::close(fd);
    if (o.status != SX_ERR_TIMEOUT || !contains(o.message, "saturated") || contains(o.message, "rank 0 did not")) {
        print_error("a rank at a full server: %s\n", describe(o).c_str());
        fail();
    }
}

// A real server with small caps: a rank's set beyond them fails with a clear error.
void test_store_caps(void **) {
    const int port = sxtest::free_port();
    StoreLimits limits;
    limits.max_keys = 40;
    limits.max_bytes = 64 << 10;
    auto server = serve(port, "", 1, limits);
    sx::rdzv::Rendezvous rv;
    ASSERT_OK(sx::rdzv::parse_rendezvous(("tcp://127.0.0.1:" + std::to_string(port)).c_str(), 0, 1, &rv));
    std::shared_ptr<sx::rdzv::Store> store;
    ASSERT_OK(sx::rdzv::open_store(rv, sx::Millis(5000), &store));
    sx::Status s = store->set("big", std::string(65 << 10, 'b'));
    ASSERT_CODE(s, SX_ERR_INVALID_STATE);
    assert_true(contains(s.message(), "full"));
    int stored = 0;
    for (int i = 0; i < 100 && (s.ok() || i == 0); ++i) {
        s = store->set("k" + std::to_string(i), "v");
        if (s.ok()) ++stored;
    }
    ASSERT_CODE(s, SX_ERR_INVALID_STATE);
    assert_true(contains(s.message(), "keys"));
    assert_true(stored < 40);  // the attach key counts too
    assert_int_equal(server->stats().keys, 40);
    // Too large for any request: refused by the client, naming the key.
    s = store->set("huge", std::string(wire::kMaxFrame, 'h'));
    ASSERT_CODE(s, SX_ERR_INVALID_ARGUMENT);
    assert_true(contains(s.message(), "huge"));
}

// The server listens on the rendezvous host's address by default, on every interface
// with "*", and an address that is not this host's is refused by name.
void test_bind_address(void **) {
    const int port = sxtest::free_port();
    ServerOptions o;
    o.host = "127.0.0.2";
    o.port = port;
    std::shared_ptr<TcpStoreServer> s;
    ASSERT_OK(TcpStoreServer::acquire(o, &s));
    assert_string_equal(s->bound_address().c_str(), "127.0.0.2");
    int fd = connect_to("127.0.0.1", port);
    assert_true(fd < 0);  // not listening there
    fd = connect_to("127.0.0.2", port);
    assert_true(fd >= 0);
    ::close(fd);
    s.reset();

    o.bind = "*";
    ASSERT_OK(TcpStoreServer::acquire(o, &s));
    assert_string_equal(s->bound_address().c_str(), "0.0.0.0");
    for (const char *a : {"127.0.0.1", "127.0.0.2"}) {
        fd = connect_to(a, port);
        assert_true(fd >= 0);
        ::close(fd);
    }
    // Another group of this process on the port must agree on token and bind.
    ServerOptions other = o;
    other.token = "x";
    std::shared_ptr<TcpStoreServer> s2;
    sx::Status st = TcpStoreServer::acquire(other, &s2);
    ASSERT_CODE(st, SX_ERR_INVALID_ARGUMENT);
    s.reset();

    // Through the API: a bind address that is not this host's (TEST-NET-1).
    Outcome bad = join("127.0.0.1", sxtest::free_port(), 0, 2, nullptr, 2000, "192.0.2.1");
    assert_int_equal(bad.status, SX_ERR_COMM);
    assert_true(contains(bad.message, "192.0.2.1"));
}

// Sizes beyond SX_MAX_WORLD_SIZE are refused at once; a missing rank fails creation at
// its timeout, even for a world of 1000 (whose full mesh would bind 999 sockets first).
void test_world_size_and_deadline(void **) {
    for (int world : {SX_MAX_WORLD_SIZE + 1, 100000, 1 << 30}) {
        Outcome o = join("127.0.0.1", sxtest::free_port(), 0, world, nullptr, 2000);
        assert_int_equal(o.status, SX_ERR_INVALID_ARGUMENT);
        assert_true(contains(o.message, "SX_MAX_WORLD_SIZE"));
        assert_true(o.ms < 200);
    }
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "100000", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "4000", 1);
    sx::rdzv::Rendezvous rv;
    sx::Status s = sx::rdzv::parse_rendezvous("env://", 0, 0, &rv);
    for (const char *v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(v);
    ASSERT_CODE(s, SX_ERR_INVALID_ARGUMENT);
    assert_true(contains(s.message(), "WORLD_SIZE") && contains(s.message(), "SX_MAX_WORLD_SIZE"));

    // Rank 0 (serving) and rank 7 (joining) of 1000, alone: back within the timeout.
    for (int rank : {0, 7}) {
        const int port = sxtest::free_port();
        std::shared_ptr<TcpStoreServer> keep;
        if (rank != 0) keep = serve(port, "", 1000);  // someone serves, nobody else comes
        Outcome o = join("127.0.0.1", port, rank, 1000, nullptr, 2000);
        std::fprintf(stderr, "world 1000, rank %d alone, timeout 2000 ms: status %d after %lld ms\n", rank, o.status,
                     o.ms);
        assert_int_equal(o.status, SX_ERR_TIMEOUT);
        assert_true(o.ms >= 1900 && o.ms <= 2000 + sxtest::kSlackMs);
    }
}

}  // namespace

int main(int argc, char **argv) {
    if (argc == 5 && std::strcmp(argv[1], "rank") == 0) return run_rank(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_token_threads, setup),
        cmocka_unit_test_setup(test_token_on_one_side, setup),
        cmocka_unit_test_setup(test_token_processes, setup),
        cmocka_unit_test_setup(test_hostile_connections, setup),
        cmocka_unit_test_setup(test_unadmitted_sets_hold_nothing, setup),
        cmocka_unit_test_setup(test_reported_attack, setup),
        cmocka_unit_test_setup(test_connection_cap, setup),
        cmocka_unit_test_setup(test_held_connections_do_not_starve_a_rank, setup),
        cmocka_unit_test_setup(test_a_full_server_says_so, setup),
        cmocka_unit_test_setup(test_store_caps, setup),
        cmocka_unit_test_setup(test_bind_address, setup),
        cmocka_unit_test_setup(test_world_size_and_deadline, setup),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
