// Rank-ordered sums (comm/ordered_sum.h), what the per-param sums of LAMB and Adafactor go
// through: on every transport each rank gets (((0 + d_0) + d_1) + ...) + d_{W-1}, bit for
// bit, for values whose sum depends on the order (wide exponents, mixed signs) and for
// zeros of both signs; where any value is NaN, or infinities of both signs meet, NaN,
// and an infinity where the others are finite. Shared memory sums with its all-reduce (a
// rank's call holds `width` doubles), between threads at 3, 4 and 5 ranks and between
// forked processes at 3, through its call lines (at most 8 KiB), its slots in parts and
// its slots whole; so do a context's Gloo channel and a Gloo communicator (over TCP,
// between threads at 2, 3 and 4 ranks and between forked processes over tcp:// at 3),
// each through its rank 0 and in parts (gloo/ordered_all_reduce.h), every width from 1 to
// 9 (fewer values than ranks: parts of none) and past the default rooted size; and a Gloo
// communicator on a sparse mesh (through a tree and along a chain, gloo/tree.h) at 3, 6
// and 9 ranks.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/gloo/channels.h"
#include "comm/ordered_sum.h"
#include "rdzv/rendezvous.h"
#include "rdzv/stores.h"
#include "comm_test_util.h"

using sx::Millis;
using sx::Status;
using sx::comm::Communicator;
using sx::comm::RankOrderedSum;

namespace {

// Rank r's value j in round `round`: zeros of both signs (every rank's -0.0, or some
// ranks' -0.0 and others' +0.0), and doubles of exponents 2^-40 to 2^40 of both signs.
double value(int r, size_t j, int round) {
    constexpr double inf = std::numeric_limits<double>::infinity();
    if (round % 3 == 2 && j % 5 == 3) {  // every third round: some infinities and NaNs
        switch ((j / 5) % 4) {
            case 0: return r == 0 ? inf : 1.0;                  // inf
            case 1: return r == 0 ? inf : r == 1 ? -inf : 2.0;  // NaN (with 2 ranks or more)
            case 2: return r == 1 ? std::nan("") : -0.0;        // NaN
            default: return -inf;                               // -inf
        }
    }
    const uint64_t h = (static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ull) ^ ((j + 1) * 0xBF58476D1CE4E5B9ull) ^
                       (static_cast<uint64_t>(round + 1) * 0x94D049BB133111EBull);
    const uint64_t x = h ^ (h >> 29) ^ (h << 17);
    switch ((j + static_cast<size_t>(round)) % 7) {
        case 0: return -0.0;
        case 1: return r % 2 ? -0.0 : 0.0;
        default: {
            const double m = static_cast<double>(x % 1000003) / 1000003.0 + 0.5;
            const int e = static_cast<int>((x >> 20) % 81) - 40;
            return ((x >> 40) & 1 ? -m : m) * std::ldexp(1.0, e);
        }
    }
}

// Every rank's sums of `width` values over c, checked against the rank-ordered sum from
// 0.0, bit for bit; `reduces`: whether they must go through the transport's all-reduce.
std::string check_sums(Communicator &c, size_t width, int round, bool reduces) {
    const int p = c.world_size();
    RankOrderedSum sums(&c, width);
    if (p > 1 && sums.reduces() != reduces) return std::string("reduces() is ") + (reduces ? "false" : "true");
    const size_t bytes = p == 1 ? 0 : (reduces ? 1 : static_cast<size_t>(p)) * width * sizeof(double);
    if (sums.exchanged_bytes() != bytes)
        return "exchanged_bytes() = " + std::to_string(sums.exchanged_bytes()) + ", expected " + std::to_string(bytes);
    for (size_t j = 0; j < width; ++j) sums.mine()[j] = value(c.rank(), j, round);
    std::vector<double> whole;
    Status s = sums.sum(&whole);
    if (!s.ok()) return "sum: " + s.message();
    if (whole.size() != width) return "the sums have " + std::to_string(whole.size()) + " values";
    size_t order_matters = 0;
    for (size_t j = 0; j < width; ++j) {
        double want = 0.0, backwards = 0.0;
        for (int q = 0; q < p; ++q) want += value(q, j, round);
        for (int q = p - 1; q >= 0; --q) backwards += value(q, j, round);
        if (!std::isnan(want) && std::memcmp(&want, &backwards, sizeof want) != 0) ++order_matters;
        if (std::isnan(want) ? !std::isnan(whole[j]) : std::memcmp(&want, &whole[j], sizeof want) != 0)
            return "width " + std::to_string(width) + ", value " + std::to_string(j) + ": " +
                   std::to_string(whole[j]) + (std::signbit(whole[j]) ? " (negative)" : "") + ", expected " +
                   std::to_string(want) + (std::signbit(want) ? " (negative)" : "");
    }
    // The values are such that another order would give other bits (at 3 ranks or more).
    if (p >= 3 && width >= 100 && order_matters == 0) return "no value whose sum depends on the order";
    return "";
}

// Widths through the call lines (1, 7, 1024 doubles: at most 8 KiB), and past them: through
// 4 KiB slots (chunks of 512) or the default slots (5000 doubles, combined in parts).
std::string every_width(Communicator &c, bool reduces) {
    int round = 0;
    for (size_t width : {size_t(1), size_t(2), size_t(3), size_t(7), size_t(9), size_t(1024), size_t(1025),
                         size_t(2049), size_t(5000)})
        for (int again = 0; again < 3; ++again)
            if (std::string e = check_sums(c, width, round++, reduces); !e.empty()) return e;
    return "";
}

Status join_shm(const std::string &url, int r, int p, size_t slot_bytes, std::unique_ptr<Communicator> *out) {
    sx::rdzv::Rendezvous rv;
    SX_TRY(sx::rdzv::parse_rendezvous(url.c_str(), r, p, &rv));
    std::shared_ptr<sx::rdzv::Store> store;
    SX_TRY(sx::rdzv::open_store(rv, Millis(20000), &store));
    sx::comm::ShmOptions opts;
    opts.timeout = Millis(20000);
    opts.slot_bytes = slot_bytes;
    return sx::comm::create_shm_communicator(store, r, p, opts, out);
}

// rooted_sum_bytes: GlooOptions's (0 the default; 1 every sum in parts; SIZE_MAX every one
// through rank 0).
// *kept (where given) keeps the rendezvous store open (over tcp://, rank 0's serves it
// until the others have connected).
// mesh and segment_bytes: GlooOptions's.
Status join_gloo(const std::string &url, int r, int p, std::unique_ptr<Communicator> *out,
                 size_t rooted_sum_bytes = 0, std::shared_ptr<sx::rdzv::Store> *kept = nullptr,
                 sx::comm::GlooOptions::Mesh mesh = sx::comm::GlooOptions::Mesh::kAuto, size_t segment_bytes = 0) {
    sx::rdzv::Rendezvous rv;
    SX_TRY(sx::rdzv::parse_rendezvous(url.c_str(), r, p, &rv));
    std::shared_ptr<sx::rdzv::Store> store;
    SX_TRY(sx::rdzv::open_store(rv, Millis(20000), &store));
    if (kept) *kept = store;
    sx::comm::GlooOptions opts;
    opts.bind_address = "127.0.0.1";
    opts.timeout = Millis(20000);
    opts.rooted_sum_bytes = rooted_sum_bytes;
    opts.mesh = mesh;
    opts.segment_bytes = segment_bytes;
    return sx::comm::create_gloo_communicator(store, r, p, opts, out);
}

std::string url_for(const char *name, int p, size_t slot) {
    return std::string("local://ordered-sum-") + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(p) +
           "-" + std::to_string(slot);
}

void test_shared_memory_threads(void **) {
    for (int p : {1, 3, 4, 5})
        for (size_t slot : {size_t(4096), size_t(0)}) {
            const std::string url = url_for("shm", p, slot);
            sxtest::run_ranks(p, [&](int r) -> std::string {
                std::unique_ptr<Communicator> c;
                Status s = join_shm(url, r, p, slot, &c);
                if (!s.ok()) return "join: " + s.message();
                if (!c->sums_in_rank_order()) return "shared memory does not say it sums in rank order";
                return every_width(*c, true);
            });
        }
}

// Runs rank(r) in a forked process for each of p ranks; each must return "" (else it says why).
void fork_ranks(int p, const std::function<std::string(int)> &rank) {
    std::vector<pid_t> pids;
    for (int r = 0; r < p; ++r) {
        const pid_t pid = ::fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            const std::string e = rank(r);
            if (!e.empty()) std::fprintf(stderr, "rank %d: %s\n", r, e.c_str());
            ::_exit(e.empty() ? 0 : 1);
        }
        pids.push_back(pid);
    }
    for (pid_t pid : pids) {
        int status = 0;
        assert_int_equal(::waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
}

void test_shared_memory_processes(void **) {
    sxtest::TempDir dir;
    const std::string url = "file://" + dir.path();
    fork_ranks(3, [&](int r) {
        std::unique_ptr<Communicator> c;
        Status s = join_shm(url, r, 3, 4096, &c);
        return s.ok() ? every_width(*c, true) : "join: " + s.message();
    });
}

constexpr size_t kRootedSizes[] = {0, 1, SIZE_MAX};  // the default, every sum in parts, every one rooted

void test_gloo_threads(void **) {
    for (int p : {2, 3, 4})
        for (size_t rooted : kRootedSizes) {
            const std::string url = url_for("gloo", p, rooted == SIZE_MAX ? 2 : rooted);
            sxtest::run_ranks(p, [&](int r) -> std::string {
                std::unique_ptr<Communicator> c;
                Status s = join_gloo(url, r, p, &c, rooted);
                if (!s.ok()) return "join: " + s.message();
                if (!c->sums_in_rank_order()) return "Gloo does not say it sums in rank order";
                const std::string e = every_width(*c, true);
                return e.empty() ? e : "rooted_sum_bytes " + std::to_string(rooted) + ": " + e;
            });
        }
}

// A sparse Gloo mesh (gloo/tree.h) between threads at 3, 6 and 9 ranks: its sums through a
// tree to rank 0, and along the chain in segments of 512 doubles (widths 1025 to 5000 in
// several), then down a tree from the last rank.
void test_gloo_sparse_threads(void **) {
    for (int p : {3, 6, 9})
        for (size_t rooted : kRootedSizes) {
            const std::string url = url_for("gloo-sparse", p, rooted == SIZE_MAX ? 2 : rooted);
            sxtest::run_ranks(p, [&](int r) -> std::string {
                std::unique_ptr<Communicator> c;
                Status s = join_gloo(url, r, p, &c, rooted, nullptr, sx::comm::GlooOptions::Mesh::kSparse, 4096);
                if (!s.ok()) return "join: " + s.message();
                if (!c->sums_in_rank_order()) return "Gloo does not say it sums in rank order";
                const std::string e = every_width(*c, true);
                return e.empty() ? e : "sparse, rooted_sum_bytes " + std::to_string(rooted) + ": " + e;
            });
        }
}

// 3 forked processes over tcp://, every sum in parts, then every one through rank 0.
void test_gloo_processes(void **) {
    for (size_t rooted : {size_t(1), SIZE_MAX}) {
        const std::string url = "tcp://127.0.0.1:" + std::to_string(sxtest::free_port());
        fork_ranks(3, [&](int r) {
            std::unique_ptr<Communicator> c;
            std::shared_ptr<sx::rdzv::Store> store;
            Status s = join_gloo(url, r, 3, &c, rooted, &store);
            const std::string e = s.ok() ? every_width(*c, true) : "join: " + s.message();
            return e.empty() ? e : "rooted_sum_bytes " + std::to_string(rooted) + ": " + e;
        });
    }
}

// A context's Gloo channel over 3 of its 4 ranks (in another order).
void test_gloo_channel_reduces(void **) {
    const int world = 4;
    const std::vector<int> members = {3, 0, 2};
    for (size_t rooted : kRootedSizes) {
        const std::string url = url_for("channel", world, rooted == SIZE_MAX ? 2 : rooted);
        sxtest::run_ranks(world, [&](int r) -> std::string {
            sx::rdzv::Rendezvous rv;
            Status s = sx::rdzv::parse_rendezvous(url.c_str(), r, world, &rv);
            std::shared_ptr<sx::rdzv::Store> store;
            if (s.ok()) s = sx::rdzv::open_store(rv, Millis(20000), &store);
            sx::comm::GlooOptions o;
            o.bind_address = "127.0.0.1";
            o.timeout = Millis(20000);
            o.rooted_sum_bytes = rooted;
            std::shared_ptr<sx::comm::GlooChannels> ch;
            if (s.ok()) s = sx::comm::open_gloo_channels(sx::rdzv::make_prefix_store(store, "context/"), r, world, o, &ch);
            if (!s.ok()) return "context: " + s.message();
            // The rank outside the channel keeps the context (its connections) until every
            // rank is done: going at once, it could close a pair a peer is still connecting.
            std::vector<std::string> done;
            for (int q = 0; q < world; ++q) done.push_back("done/" + std::to_string(q));
            auto finish = [&](const std::string &e) {
                Status d = store->set(done[static_cast<size_t>(r)], "");
                if (d.ok()) d = store->wait(done, Millis(20000));
                return e.empty() && !d.ok() ? "done: " + d.message() : e;
            };
            int mine = -1;
            for (size_t i = 0; i < members.size(); ++i)
                if (members[i] == r) mine = static_cast<int>(i);
            if (mine < 0) return finish("");
            std::unique_ptr<Communicator> c;
            s = sx::comm::create_gloo_channel(ch, sx::rdzv::make_prefix_store(store, "c/"), mine,
                                              static_cast<int>(members.size()), o, &c);
            if (!s.ok()) return finish("channel: " + s.message());
            if (!c->sums_in_rank_order()) return finish("the channel does not say it sums in rank order");
            return finish(every_width(*c, true));
        });
    }
}

// Without a communicator (a group of one rank): 0 + d_0, nothing exchanged.
void test_one_rank(void **) {
    RankOrderedSum sums(nullptr, 3);
    assert_false(sums.reduces());
    assert_int_equal(sums.exchanged_bytes(), 0);
    sums.mine()[0] = -0.0, sums.mine()[1] = 1.5, sums.mine()[2] = -2.0;
    std::vector<double> whole;
    ASSERT_OK(sums.sum(&whole));
    assert_int_equal(whole.size(), 3);
    assert_false(std::signbit(whole[0]));
    assert_true(whole[1] == 1.5 && whole[2] == -2.0);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_memory_threads),
        cmocka_unit_test(test_shared_memory_processes),
        cmocka_unit_test(test_gloo_threads),
        cmocka_unit_test(test_gloo_sparse_threads),
        cmocka_unit_test(test_gloo_processes),
        cmocka_unit_test(test_gloo_channel_reduces),
        cmocka_unit_test(test_one_rank),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
