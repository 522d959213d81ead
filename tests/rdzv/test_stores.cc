// The rendezvous stores (local://, file://, tcp://) through open_store: the Store
// contract, timeouts, concurrent adds, fresh key spaces for successive groups,
// erase_prefix, and the TCP store's restart and port cases.
#include <netdb.h>
#include <sys/socket.h>

#include <mutex>

#include "rdzv/rendezvous.h"
#include "rdzv/store.h"
#include "rdzv/stores.h"
#include "comm_test_util.h"
#include "store_checks.h"

using sx::Status;
using sx::Millis;
using sx::rdzv::open_store;
using sx::rdzv::parse_rendezvous;
using sx::rdzv::Rendezvous;
using sx::rdzv::Store;
using sxtest::contains;
using sxtest::ms_since;

namespace {

constexpr Millis kLong = sxtest::kStoreWait;
using sxtest::kSlackMs;

enum class Kind { kLocal, kFile, kTcp };

// A fresh rendezvous URL of the given kind; `dir` keeps file:// directories.
struct Url {
    explicit Url(Kind kind) {
        switch (kind) {
        case Kind::kLocal:
            text = "local://" + sxtest::unique_name("stores");
            break;
        case Kind::kFile:
            text = "file://" + dir.path() + "/" + sxtest::unique_name("rv");
            break;
        case Kind::kTcp:
            text = "tcp://127.0.0.1:" + std::to_string(sxtest::free_port());
            break;
        }
    }
    sxtest::TempDir dir;
    std::string text;
};

Status open(const std::string &url, int rank, int world, std::shared_ptr<Store> *out, Millis timeout = kLong) {
    Rendezvous rv;
    SX_TRY(parse_rendezvous(url.c_str(), rank, world, &rv));
    return open_store(rv, timeout, out);
}

// Opens ranks 0..world-1 of one group on `url` (rank 0 first: it serves tcp://).
std::vector<std::shared_ptr<Store>> open_group(const std::string &url, int world) {
    std::vector<std::shared_ptr<Store>> stores(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) ASSERT_OK(open(url, r, world, &stores[static_cast<size_t>(r)]));
    return stores;
}

// Ranks of the next group on `url` each time it is called.
sxtest::OpenGroup group_on(const std::string &url) {
    return [url](int world) { return open_group(url, world); };
}

void check(void (*checker)(const sxtest::OpenGroup &), Kind kind) {
    Url url(kind);
    checker(group_on(url.text));
}

void test_contract_local(void **) { check(sxtest::check_contract, Kind::kLocal); }
void test_contract_file(void **) { check(sxtest::check_contract, Kind::kFile); }
void test_contract_tcp(void **) { check(sxtest::check_contract, Kind::kTcp); }
void test_timeouts_local(void **) { check(sxtest::check_timeouts, Kind::kLocal); }
void test_timeouts_file(void **) { check(sxtest::check_timeouts, Kind::kFile); }
void test_timeouts_tcp(void **) { check(sxtest::check_timeouts, Kind::kTcp); }
void test_concurrent_adds_local(void **) { check(sxtest::check_concurrent_adds, Kind::kLocal); }
void test_concurrent_adds_file(void **) { check(sxtest::check_concurrent_adds, Kind::kFile); }
void test_concurrent_adds_tcp(void **) { check(sxtest::check_concurrent_adds, Kind::kTcp); }
void test_fresh_key_spaces_local(void **) { check(sxtest::check_fresh_key_spaces, Kind::kLocal); }
void test_fresh_key_spaces_file(void **) { check(sxtest::check_fresh_key_spaces, Kind::kFile); }
void test_fresh_key_spaces_tcp(void **) { check(sxtest::check_fresh_key_spaces, Kind::kTcp); }

// erase_prefix removes the keys under a prefix and only those (a context erases a gone
// group's key space so: core/context.h).
void check_erase_prefix(Kind kind) {
    Url url(kind);
    std::vector<std::shared_ptr<Store>> base = open_group(url.text, 3);
    ASSERT_OK(base[0]->set("x/a/1", "1"));
    ASSERT_OK(base[1]->set("x/ab", "2"));
    ASSERT_OK(base[2]->erase_prefix("x/a/"));
    bool present = true;
    ASSERT_OK(base[0]->check({"x/a/1"}, &present));
    assert_false(present);
    ASSERT_OK(base[0]->check({"x/ab"}, &present));
    assert_true(present);
}

void test_erase_prefix_local(void **) { check_erase_prefix(Kind::kLocal); }
void test_erase_prefix_file(void **) { check_erase_prefix(Kind::kFile); }
void test_erase_prefix_tcp(void **) { check_erase_prefix(Kind::kTcp); }

// file://: a group's keys are removed when its last rank leaves, not before.
void test_file_cleanup_when_last_rank_leaves(void **) {
    sxtest::TempDir dir;
    const std::string url = "file://" + dir.path();
    auto g = open_group(url, 3);
    ASSERT_OK(g[0]->set("a/b c", "1"));  // needs encoding
    int64_t n = 0;
    ASSERT_OK(g[1]->add("n", 2, &n));
    assert_false(dir.list().empty());
    g[0].reset();
    g[2].reset();
    std::string v;
    ASSERT_OK(g[1]->get("a/b c", &v, Millis(10)));  // one rank still in: keys stay
    assert_string_equal(v.c_str(), "1");
    g[1].reset();
    for (const std::string &name : dir.list()) {
        print_error("left behind: %s\n", name.c_str());
        fail();
    }
}

// local:// keeps one in-process store per name while any group holds it, and starts
// afresh after the last one is gone.
void test_local_store_is_released(void **) {
    const std::string name = sxtest::unique_name("released");
    std::shared_ptr<Store> s = sx::rdzv::open_local_store(name);
    std::shared_ptr<Store> same = sx::rdzv::open_local_store(name);
    assert_ptr_equal(s.get(), same.get());
    ASSERT_OK(s->set("k", "v"));
    std::weak_ptr<Store> alive = s;
    s.reset();
    assert_false(alive.expired());
    same.reset();
    assert_true(alive.expired());
    s = sx::rdzv::open_local_store(name);
    bool present = true;
    ASSERT_OK(s->check({"k"}, &present));
    assert_false(present);
}

// tcp://: a rank that reaches rank 0's server of an earlier group, just before rank 0
// replaces it, still joins the new group on the new server.
void test_tcp_rank_reaches_old_server(void **) {
    const std::string url = "tcp://127.0.0.1:" + std::to_string(sxtest::free_port());
    auto first = open_group(url, 2);
    first[1].reset();  // rank 1 left group 1; rank 0 (the server) has not yet

    std::shared_ptr<Store> late;
    Status late_status;
    std::thread rank1([&] { late_status = open(url, 1, 2, &late); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 1 now waits on the old server
    first.clear();                                                // old server stops
    std::shared_ptr<Store> rank0;
    ASSERT_OK(open(url, 0, 2, &rank0));
    rank1.join();
    ASSERT_OK(late_status);
    ASSERT_OK(late->set("x", "1"));
    std::string v;
    ASSERT_OK(rank0->get("x", &v, kLong));
    assert_string_equal(v.c_str(), "1");

    // Once attached, a restarted server is an error, not a silent loss of keys.
    rank0.reset();
    std::shared_ptr<Store> again;
    ASSERT_OK(open(url, 0, 2, &again));  // rank 0's third group: a new server
    Status st = late->get("x", &v, Millis(2000));
    ASSERT_CODE(st, SX_ERR_COMM);
    assert_true(contains(st.message(), "restarted"));
}

// tcp://: rank 0 cannot serve on a port that is taken; others time out without it.
void test_tcp_port_taken_and_no_server(void **) {
    int port = sxtest::free_port();
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    assert_int_equal(::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    assert_int_equal(::listen(fd, 1), 0);
    const std::string url = "tcp://127.0.0.1:" + std::to_string(port);
    std::shared_ptr<Store> s;
    Status st = open(url, 0, 2, &s);
    ASSERT_CODE(st, SX_ERR_COMM);
    assert_true(contains(st.message(), std::to_string(port).c_str()));
    ::close(fd);

    const std::string nobody = "tcp://127.0.0.1:" + std::to_string(sxtest::free_port());
    auto start = sxtest::Clock::now();
    st = open(nobody, 1, 2, &s, Millis(500));
    long long took = ms_since(start);
    ASSERT_CODE(st, SX_ERR_TIMEOUT);
    assert_true(took >= 490 && took <= 500 + kSlackMs);
}

// tcp://[::1]:PORT: rank 0 serves on the IPv6 wildcard when the host is IPv6.
void test_tcp_ipv6(void **) {
    int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
        if (fd >= 0) ::close(fd);
        skip();  // no IPv6 loopback here
    }
    const int port = ntohs(a.sin6_port);
    ::close(fd);
    auto g = open_group("tcp://[::1]:" + std::to_string(port), 2);
    ASSERT_OK(g[1]->set("k", "six"));
    std::string v;
    ASSERT_OK(g[0]->get("k", &v, kLong));
    assert_string_equal(v.c_str(), "six");
}

// gather_values: 7 ranks as threads, values repeated (as hosts' identities are), empty and
// binary; every rank gets every rank's value. A table that is none is refused, and a rank
// that never says its value makes rank 0 name it at the deadline.
void test_gather_values(void **) {
    std::shared_ptr<sx::rdzv::Store> store = sx::rdzv::open_local_store(sxtest::unique_name("gather"));
    constexpr int kRanks = 7;
    auto value = [](int r) { return r == 3 ? std::string() : r == 5 ? std::string("\0\xff;x", 4) : "host-" + std::to_string(r % 2); };
    sxtest::run_ranks(kRanks, [&](int r) -> std::string {
        std::vector<std::string> all;
        sx::Status s = sx::rdzv::gather_values(*store, "v/", r, kRanks, value(r), sx::Clock::now() + sx::Millis(20000),
                                               &all);
        if (!s.ok()) return s.message();
        if (all.size() != static_cast<size_t>(kRanks)) return "wrong count";
        for (int q = 0; q < kRanks; ++q)
            if (all[static_cast<size_t>(q)] != value(q)) return "rank " + std::to_string(q) + "'s value differs";
        return "";
    });
    std::vector<std::string> all;
    assert_true(store->set("bad/all", "\x05\0\0\0abc").ok());
    sx::Status s = sx::rdzv::gather_values(*store, "bad/", 1, 2, "x", sx::Clock::now() + sx::Millis(2000), &all);
    assert_int_equal(s.code(), SX_ERR_CORRUPT);
    s = sx::rdzv::gather_values(*store, "absent/", 0, 3, "x", sx::Clock::now() + sx::Millis(300), &all);
    assert_int_equal(s.code(), SX_ERR_TIMEOUT);
    assert_true(sxtest::contains(s.message(), "rank 1 did not say"));
}

void test_open_errors(void **) {
    std::shared_ptr<Store> s;
    sxtest::TempDir dir;
    const std::string file = dir.path() + "/not-a-dir";
    std::fclose(std::fopen(file.c_str(), "w"));
    ASSERT_CODE(open("file://" + file, 0, 1, &s), SX_ERR_IO);
    // A name that does not exist is a bad argument. Where the resolver cannot be reached
    // (a machine with no DNS server answers EAI_AGAIN, "try again"), nothing says the name
    // is bad, and the store keeps trying until its timeout, as for a server not up yet.
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    const int gai = ::getaddrinfo("no-such-host.invalid", "4000", &hints, &res);
    if (res) ::freeaddrinfo(res);
    assert_int_not_equal(gai, 0);
    ASSERT_CODE(open("tcp://no-such-host.invalid:4000", 1, 2, &s, Millis(500)),
                gai == EAI_AGAIN ? SX_ERR_TIMEOUT : SX_ERR_INVALID_ARGUMENT);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gather_values),
        cmocka_unit_test(test_contract_local),
        cmocka_unit_test(test_contract_file),
        cmocka_unit_test(test_contract_tcp),
        cmocka_unit_test(test_timeouts_local),
        cmocka_unit_test(test_timeouts_file),
        cmocka_unit_test(test_timeouts_tcp),
        cmocka_unit_test(test_concurrent_adds_local),
        cmocka_unit_test(test_concurrent_adds_file),
        cmocka_unit_test(test_concurrent_adds_tcp),
        cmocka_unit_test(test_fresh_key_spaces_local),
        cmocka_unit_test(test_fresh_key_spaces_file),
        cmocka_unit_test(test_fresh_key_spaces_tcp),
        cmocka_unit_test(test_erase_prefix_local),
        cmocka_unit_test(test_erase_prefix_file),
        cmocka_unit_test(test_erase_prefix_tcp),
        cmocka_unit_test(test_file_cleanup_when_last_rank_leaves),
        cmocka_unit_test(test_local_store_is_released),
        cmocka_unit_test(test_tcp_rank_reaches_old_server),
        cmocka_unit_test(test_tcp_port_taken_and_no_server),
        cmocka_unit_test(test_tcp_ipv6),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
