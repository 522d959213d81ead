// The Gloo communicator with ranks as threads over local://: every collective at
// world sizes 1, 2, 3 and 5, with all_gather and broadcast met in-process (the default
// for threads) and through TCP, and on a sparse mesh at 2, 6 and 9 ranks; a stalled
// rank (also one that a sparse mesh does not pair with the others); a destroyed peer;
// abort() from another thread; argument and creation errors.
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>

#include "collective_checks.h"
#include "comm/abort_at_deadline.h"
#include "comm/communicator.h"
#include "rdzv/rendezvous.h"
#include "rdzv/stores.h"
#include "comm_test_util.h"

using sx::Status;
using sx::comm::Communicator;
using sx::Millis;
using sxtest::contains;
using sxtest::ms_since;

namespace {

constexpr long long kSlackMs = 2500;

// Opens rank r's store on `url` and connects its communicator.
using Mesh = sx::comm::GlooOptions::Mesh;

Status join(const std::string &url, int r, int p, Millis timeout, std::unique_ptr<Communicator> *out,
            const char *bind = "127.0.0.1", size_t segment_bytes = 0, bool in_process = true,
            Mesh mesh = Mesh::kAuto) {
    sx::rdzv::Rendezvous rv;
    SX_TRY(sx::rdzv::parse_rendezvous(url.c_str(), r, p, &rv));
    std::shared_ptr<sx::rdzv::Store> store;
    SX_TRY(sx::rdzv::open_store(rv, Millis(20000), &store));
    sx::comm::GlooOptions opts;
    opts.bind_address = bind;
    opts.timeout = timeout;
    opts.segment_bytes = segment_bytes;
    opts.in_process = in_process;
    opts.mesh = mesh;
    return sx::comm::create_gloo_communicator(store, r, p, opts, out);
}

// A one-shot event for rank threads.
class Event {
  public:
    void set() {
        std::lock_guard<std::mutex> l(mu_);
        set_ = true;
        cv_.notify_all();
    }
    void wait() {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return set_; });
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    bool set_ = false;
};

// in_process: all_gather and broadcast copy from the peers' buffers (the default for
// threads of one process); otherwise every collective goes through Gloo's TCP pairs.
void check_world(int p, size_t segment_bytes = 0, bool in_process = true, Mesh mesh = Mesh::kAuto) {
    const std::string url = "local://" + sxtest::unique_name("collectives");
    std::atomic<int> arrived{0};
    sxtest::run_ranks(p, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, p, Millis(30000), &c, "127.0.0.1", segment_bytes, in_process, mesh);
        if (!s.ok()) return "join: " + s.message();
        if (c->rank() != r || c->world_size() != p) return "wrong rank or world size";
        // Gloo carries no riders: its callers exchange their words in calls of their own.
        std::vector<sx::comm::Rider> riders;
        if (c->carries_riders() || c->attach_rider({1u, 1.0}, &riders).code() != SX_ERR_UNSUPPORTED)
            return "Gloo claims to carry riders";
        std::string e = sxtest::check_all_collectives(*c);
        if (!e.empty()) return e;
        // A barrier orders: nobody leaves before everybody arrived.
        arrived.fetch_add(1);
        s = c->barrier();
        if (!s.ok()) return "barrier: " + s.message();
        if (arrived.load() != p) return "left the barrier before every rank arrived";
        return "";
    });
}

void test_world_1(void **) { check_world(1); }
void test_world_2(void **) { check_world(2); }
void test_world_3(void **) { check_world(3); }
void test_world_5(void **) { check_world(5); }
void test_world_3_tcp(void **) { check_world(3, 0, false); }
// Segments of 4 KiB: hundreds per call, so the receive window wraps many times.
void test_world_2_small_segments(void **) { check_world(2, 4096, false); }
void test_world_3_small_segments(void **) { check_world(3, 4096, false); }
// A sparse mesh: at 6 and 9 ranks some pairs are missing (rank 0 has none with 3, nor at 9
// with 6), and every collective goes round the ring, through trees or along the chain.
void test_world_2_sparse(void **) { check_world(2, 0, false, Mesh::kSparse); }
void test_world_6_sparse(void **) { check_world(6, 0, true, Mesh::kSparse); }
void test_world_9_sparse_small_segments(void **) { check_world(9, 4096, false, Mesh::kSparse); }

// On a sparse mesh of 6, rank 3 (paired with 1, 2, 4 and 5, not with 0) never calls: every
// other rank's all_reduce_sum (a tree through rank 0) and then broadcast fail within the
// timeout and slack, none hangs, and each later call fails at once.
void test_sparse_mesh_stalled_rank(void **) {
    const std::string url = "local://" + sxtest::unique_name("sparse-stalled");
    constexpr int kTimeoutMs = 1500;
    Event survivors_done;
    std::atomic<int> finished{0};
    sxtest::run_ranks(6, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, 6, Millis(kTimeoutMs), &c, "127.0.0.1", 0, false, Mesh::kSparse);
        if (!s.ok()) return "join: " + s.message();
        if (r == 3) {
            survivors_done.wait();
            return "";
        }
        std::vector<double> d(4, 1.0);
        auto start = sxtest::Clock::now();
        s = c->all_reduce_sum(d.data(), d.size());
        const long long took = ms_since(start);
        std::string e;
        if (s.ok() || (s.code() != SX_ERR_TIMEOUT && s.code() != SX_ERR_COMM) || took > kTimeoutMs + kSlackMs)
            e = "expected a timeout or a broken connection within the timeout, got (" + std::to_string(took) +
                " ms): " + s.message();
        start = sxtest::Clock::now();
        Status again = c->barrier();
        if (e.empty() && (again.ok() || ms_since(start) > 100)) e = "later call: " + again.message();
        if (finished.fetch_add(1) == 4) survivors_done.set();
        return e;
    });
}

// Rank 2 of 3 never calls: the others time out within the timeout, every later call
// fails at once with the same error, and destruction returns.
void test_stalled_rank(void **) {
    const std::string url = "local://" + sxtest::unique_name("stalled");
    constexpr int kTimeoutMs = 1500;
    Event survivors_done;
    std::atomic<int> finished{0};
    sxtest::run_ranks(3, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, 3, Millis(kTimeoutMs), &c);
        if (!s.ok()) return "join: " + s.message();
        if (r == 2) {
            survivors_done.wait();
            c.reset();
            return "";
        }
        std::vector<float> buf(3 * 1000, 1.0f), out(1000);
        auto start = sxtest::Clock::now();
        s = c->reduce_scatter_sum(buf.data(), 1000, out.data(), false);
        long long took = ms_since(start);
        std::string e;
        if (s.code() != SX_ERR_TIMEOUT) e = "expected SX_ERR_TIMEOUT, got: " + s.message();
        else if (took < kTimeoutMs * 3 / 4 || took > kTimeoutMs + kSlackMs)
            e = "timed out after " + std::to_string(took) + " ms";
        else if (!contains(s.message(), "reduce_scatter_sum") || !contains(s.message(), "1500 ms"))
            e = "message does not say what timed out: " + s.message();
        // Fails fast from now on, with the first error's text.
        start = sxtest::Clock::now();
        Status again = c->barrier();
        if (e.empty() && (again.code() != SX_ERR_TIMEOUT || !contains(again.message(), "failed earlier") ||
                          ms_since(start) > 100))
            e = "later call: " + again.message();
        start = sxtest::Clock::now();
        c.reset();
        if (e.empty() && ms_since(start) > 2000) e = "destruction took " + std::to_string(ms_since(start)) + " ms";
        if (finished.fetch_add(1) == 1) survivors_done.set();
        return e;
    });
}

// Ranks 0 and 1 of 3 call all_gather, with timeouts of timeout_ms[0] and [1] (rank 2's
// is [1]), while rank 2 stays away until both returned; check(r, status, ms taken) says
// what is wrong with rank r's result ("" if nothing).
void all_gather_with_rank_2_away(const char *name, bool in_process, const int timeout_ms[2],
                                 const std::function<std::string(int, const Status &, long long)> &check) {
    const std::string url = "local://" + sxtest::unique_name(name);
    Event survivors_done;
    std::atomic<int> finished{0};
    sxtest::run_ranks(3, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, 3, Millis(timeout_ms[r == 0 ? 0 : 1]), &c, "127.0.0.1", 0, in_process);
        if (!s.ok()) return "join: " + s.message();
        if (r == 2) {
            survivors_done.wait();
            return "";
        }
        std::vector<char> buf(3 * 1000);
        auto start = sxtest::Clock::now();
        s = c->all_gather(buf.data(), 1000);
        const std::string e = check(r, s, ms_since(start));
        if (finished.fetch_add(1) == 1) survivors_done.set();
        return e;
    });
}

// As above, but rank 0 has a shorter timeout than rank 1: rank 0 times out and closes
// its connections; rank 1 sees a closed connection near its own deadline, which is
// what a peer's timeout looks like, and reports SX_ERR_TIMEOUT too.
void test_stalled_rank_seen_through_a_peer(void **) {
    const int timeout_ms[2] = {1500, 1800};
    all_gather_with_rank_2_away("stalled-peer", false, timeout_ms, [&](int r, const Status &s, long long took) {
        if (s.code() != SX_ERR_TIMEOUT || took > timeout_ms[r] + kSlackMs)
            return "expected SX_ERR_TIMEOUT after about " + std::to_string(timeout_ms[r]) + " ms, got (" +
                   std::to_string(took) + " ms): " + s.message();
        if (r == 1 && took < 1700 && !contains(s.message(), "peer closed its connection"))
            return "rank 1 should have seen rank 0 close first: " + s.message();
        return std::string();
    });
}

// The same between threads meeting in-process: rank 0's timeout fails the meeting, and
// rank 1 hears of it at once, long before its own deadline.
void test_stalled_rank_in_process(void **) {
    const int timeout_ms[2] = {1500, 6000};
    all_gather_with_rank_2_away("stalled-meeting", true, timeout_ms, [](int r, const Status &s, long long took) {
        if (s.code() != SX_ERR_TIMEOUT || took < 1100 || took > 1500 + kSlackMs)
            return "expected SX_ERR_TIMEOUT after about 1500 ms, got (" + std::to_string(took) + " ms): " +
                   s.message();
        const char *says = r == 0 ? "did not come" : "rank 0 timed out";
        if (!contains(s.message(), says) || !contains(s.message(), "threads of one process"))
            return "the message should say '" + std::string(says) + "': " + s.message();
        return std::string();
    });
}

// Ranks in different collectives, or the same one with other sizes, fail at once with
// SX_ERR_MISMATCH (between threads each would copy with its own sizes out of the
// other's buffer), and the communicator fails for good.
void test_mismatch_in_process(void **) {
    const std::string url = "local://" + sxtest::unique_name("mismatch-meeting");
    sxtest::run_ranks(2, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, 2, Millis(60000), &c);
        if (!s.ok()) return "join: " + s.message();
        std::vector<char> buf(2 * 2000);
        auto start = sxtest::Clock::now();
        s = c->all_gather(buf.data(), r == 0 ? 1000 : 2000);
        if (s.code() != SX_ERR_MISMATCH || ms_since(start) > 5000 || !contains(s.message(), "different collectives"))
            return "expected SX_ERR_MISMATCH at once, got (" + std::to_string(ms_since(start)) + " ms): " + s.message();
        s = c->broadcast(buf.data(), 10, 0);
        if (s.code() != SX_ERR_MISMATCH) return "the next call: " + s.message();
        return "";
    });
}

// A rank destroys its communicator while its peer waits in an in-process all_gather:
// the peer fails at once with SX_ERR_COMM, and so does its next call.
void test_peer_destroyed_in_process(void **) {
    const std::string url = "local://" + sxtest::unique_name("destroyed-meeting");
    sxtest::run_ranks(2, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, 2, Millis(60000), &c);
        if (!s.ok()) return "join: " + s.message();
        if (r == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            c.reset();
            return "";
        }
        std::vector<char> buf(2 * 1000);
        auto start = sxtest::Clock::now();
        s = c->all_gather(buf.data(), 1000);
        if (s.code() != SX_ERR_COMM || ms_since(start) > 5000 || !contains(s.message(), "destroyed"))
            return "expected SX_ERR_COMM naming the destroyed peer soon, got (" + std::to_string(ms_since(start)) +
                   " ms): " + s.message();
        s = c->broadcast(buf.data(), 10, 0);
        if (s.code() != SX_ERR_COMM) return "the next call: " + s.message();
        return "";
    });
}

enum class Op { kReduceScatter, kAllGather, kAllReduce, kBarrier };

// Rank 1 of 2 stays away; rank 0's call is aborted from another thread long before its
// (long) timeout; rank 1 then sees the closed connections at once.
void check_abort(Op op) {
    const std::string url = "local://" + sxtest::unique_name("abort");
    Event rank0_done;
    sxtest::run_ranks(2, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, 2, Millis(60000), &c);
        if (!s.ok()) return "join: " + s.message();
        if (r == 1) {
            rank0_done.wait();
            auto start = sxtest::Clock::now();
            s = c->barrier();
            if (s.code() != SX_ERR_COMM || ms_since(start) > 5000)
                return "after the peer aborted, expected SX_ERR_COMM at once, got (" +
                       std::to_string(ms_since(start)) + " ms): " + s.message();
            return "";
        }
        std::thread aborter([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            c->abort();
            c->abort();  // idempotent
        });
        std::vector<float> buf(2 * (1 << 20), 1.0f), out(1 << 20);
        std::vector<double> d(1000, 1.0);
        auto start = sxtest::Clock::now();
        switch (op) {
        case Op::kReduceScatter:
            s = c->reduce_scatter_sum(buf.data(), 1 << 20, out.data(), false);
            break;
        case Op::kAllGather:
            s = c->all_gather(buf.data(), 4 << 20);
            break;
        case Op::kAllReduce:
            s = c->all_reduce_sum(d.data(), d.size());
            break;
        case Op::kBarrier:
            s = c->barrier();
            break;
        }
        long long took = ms_since(start);
        aborter.join();
        std::string e;
        if (s.code() != SX_ERR_ABORTED || took > 3000)
            e = "expected SX_ERR_ABORTED soon, got (" + std::to_string(took) + " ms): " + s.message();
        Status later = c->barrier();
        if (e.empty() && later.code() != SX_ERR_ABORTED) e = "later call: " + later.message();
        c.reset();
        rank0_done.set();
        return e;
    });
}

// AbortAtDeadline: a collective that a peer never joins ends at the guard's deadline, long
// before the communicator's own timeout, and the guard says it fired; one that completes
// in time is left alone, and the guard does not fire.
void test_abort_at_deadline(void **) {
    const std::string url = "local://" + sxtest::unique_name("deadline");
    Event rank0_done;
    sxtest::run_ranks(2, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, 2, Millis(60000), &c);
        if (!s.ok()) return "join: " + s.message();
        uint64_t v[2] = {static_cast<uint64_t>(r), 7};
        {
            sx::comm::AbortAtDeadline guard(c.get(), sxtest::Clock::now() + std::chrono::seconds(30));
            s = c->all_reduce_max(v, 2);
            if (!s.ok() || v[0] != 1 || guard.fired()) return "in time: " + s.message();
        }
        if (r == 1) {
            rank0_done.wait();
            return "";
        }
        auto start = sxtest::Clock::now();
        bool fired = false;
        {
            sx::comm::AbortAtDeadline guard(c.get(), start + std::chrono::milliseconds(300));
            s = c->all_reduce_max(v, 2);
            fired = guard.fired();
        }
        const long long took = ms_since(start);
        rank0_done.set();
        if (s.code() != SX_ERR_ABORTED || !fired || took < 250 || took > kSlackMs)
            return "expected SX_ERR_ABORTED at the deadline (300 ms), got (" + std::to_string(took) + " ms, fired " +
                   std::to_string(fired) + "): " + s.message();
        return "";
    });
}

void test_abort_reduce_scatter(void **) { check_abort(Op::kReduceScatter); }
void test_abort_all_gather(void **) { check_abort(Op::kAllGather); }
void test_abort_all_reduce(void **) { check_abort(Op::kAllReduce); }
void test_abort_barrier(void **) { check_abort(Op::kBarrier); }

void test_abort_before_any_call(void **) {
    const std::string url = "local://" + sxtest::unique_name("abort-first");
    sxtest::run_ranks(2, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, 2, Millis(20000), &c);
        if (!s.ok()) return "join: " + s.message();
        if (r == 0) {
            c->abort();
            double x = 1;
            s = c->all_reduce_sum(&x, 1);
            if (s.code() != SX_ERR_ABORTED) return "expected SX_ERR_ABORTED, got: " + s.message();
        } else {
            s = c->barrier();
            if (s.code() != SX_ERR_COMM) return "expected SX_ERR_COMM from the aborted peer, got: " + s.message();
        }
        return "";
    });
}

void test_argument_errors(void **) {
    std::unique_ptr<Communicator> c;
    ASSERT_OK(join("local://" + sxtest::unique_name("args"), 0, 1, Millis(5000), &c));
    float buf[4] = {1, 2, 3, 4};
    ASSERT_CODE(c->reduce_scatter_sum(buf, 4, buf + 2, false), SX_ERR_INVALID_ARGUMENT);  // overlap
    ASSERT_CODE(c->reduce_scatter_sum(nullptr, 4, buf, false), SX_ERR_INVALID_ARGUMENT);
    ASSERT_CODE(c->broadcast(buf, 4, 1), SX_ERR_INVALID_ARGUMENT);
    ASSERT_CODE(c->broadcast(buf, 4, -1), SX_ERR_INVALID_ARGUMENT);
    ASSERT_CODE(c->all_gather(nullptr, 4), SX_ERR_INVALID_ARGUMENT);
    uint16_t h16[8] = {0};
    ASSERT_CODE(c->reduce_scatter_sum_16(h16, SX_DTYPE_F32, 4, buf, 1.0f, false), SX_ERR_INVALID_ARGUMENT);  // dtype
    ASSERT_CODE(c->reduce_scatter_sum_16(h16, SX_DTYPE_F16, 4, reinterpret_cast<float *>(h16 + 2), 1.0f, false),
                SX_ERR_INVALID_ARGUMENT);  // overlap
    // Empty calls do nothing, and an invalid call leaves the communicator usable.
    ASSERT_OK(c->reduce_scatter_sum(nullptr, 0, nullptr, false));
    ASSERT_OK(c->all_gather(nullptr, 0));
    ASSERT_OK(c->all_reduce_sum(nullptr, 0));
    float out[4] = {1, 1, 1, 1};
    ASSERT_OK(c->reduce_scatter_sum(buf, 4, out, true));
    assert_true(out[0] == 2 && out[3] == 5);
}

void test_create_errors(void **) {
    std::unique_ptr<Communicator> c;
    std::shared_ptr<sx::rdzv::Store> store = sx::rdzv::open_local_store(sxtest::unique_name("create"));
    sx::comm::GlooOptions opts;
    opts.bind_address = "127.0.0.1";
    ASSERT_CODE(sx::comm::create_gloo_communicator(store, 2, 2, opts, &c), SX_ERR_INVALID_ARGUMENT);
    ASSERT_CODE(sx::comm::create_gloo_communicator(nullptr, 0, 1, opts, &c), SX_ERR_INVALID_ARGUMENT);
    opts.bind_address = "256.1.1.1";  // does not resolve
    ASSERT_CODE(sx::comm::create_gloo_communicator(store, 0, 1, opts, &c), SX_ERR_COMM);
    opts.bind_address = "192.0.2.1";  // resolves (TEST-NET-1) but is no address of this host
    ASSERT_CODE(sx::comm::create_gloo_communicator(store, 0, 1, opts, &c), SX_ERR_COMM);
    // SX_GLOO_MESH names the kind of mesh, or is refused saying what it was.
    opts.bind_address = "127.0.0.1";
    ::setenv("SX_GLOO_MESH", "ring", 1);
    Status bad = sx::comm::create_gloo_communicator(store, 0, 1, opts, &c);
    ::unsetenv("SX_GLOO_MESH");
    ASSERT_CODE(bad, SX_ERR_INVALID_ARGUMENT);
    assert_true(contains(bad.message(), "SX_GLOO_MESH is 'ring'"));

    // A peer that never comes: creation ends with SX_ERR_TIMEOUT within the timeout.
    auto start = sxtest::Clock::now();
    Status s = join("local://" + sxtest::unique_name("alone"), 0, 2, Millis(500), &c);
    long long took = ms_since(start);
    ASSERT_CODE(s, SX_ERR_TIMEOUT);
    assert_true(took <= 500 + kSlackMs);
}

// An empty bind address means this host's name (or 127.0.0.1 if it does not resolve).
void test_default_bind_address(void **) {
    const std::string url = "local://" + sxtest::unique_name("bind");
    sxtest::run_ranks(2, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, 2, Millis(20000), &c, "");
        if (!s.ok()) return "join: " + s.message();
        return sxtest::check_reduce_scatter(*c, 10, false);
    });
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_1),
        cmocka_unit_test(test_world_2),
        cmocka_unit_test(test_world_3),
        cmocka_unit_test(test_world_5),
        cmocka_unit_test(test_world_3_tcp),
        cmocka_unit_test(test_world_2_small_segments),
        cmocka_unit_test(test_world_3_small_segments),
        cmocka_unit_test(test_world_2_sparse),
        cmocka_unit_test(test_world_6_sparse),
        cmocka_unit_test(test_world_9_sparse_small_segments),
        cmocka_unit_test(test_sparse_mesh_stalled_rank),
        cmocka_unit_test(test_stalled_rank),
        cmocka_unit_test(test_stalled_rank_seen_through_a_peer),
        cmocka_unit_test(test_stalled_rank_in_process),
        cmocka_unit_test(test_peer_destroyed_in_process),
        cmocka_unit_test(test_mismatch_in_process),
        cmocka_unit_test(test_abort_reduce_scatter),
        cmocka_unit_test(test_abort_all_gather),
        cmocka_unit_test(test_abort_all_reduce),
        cmocka_unit_test(test_abort_barrier),
        cmocka_unit_test(test_abort_before_any_call),
        cmocka_unit_test(test_abort_at_deadline),
        cmocka_unit_test(test_argument_errors),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_default_bind_address),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
