// The shared-memory communicator: every collective at world sizes 1 to 5 with ranks as
// threads, with slots small enough that each collective moves many chunks; ranks
// calling different collectives; a stalled rank (the timeout); abort() from another
// thread; a destroyed peer; ranks as processes, one of them killed with SIGKILL (the
// others fail fast) and, after every process has exited, nothing of theirs left: their
// abstract socket is gone (the segment is a memfd: nothing of it has a name anywhere). The transport choice: ranks on one host take shared
// memory, ranks that say they are on other hosts (SX_HOST_ID) take Gloo.
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "base/shared_arena.h"
#include "collective_checks.h"
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

std::string url_for(const char *name) { return std::string("local://shm-") + name + "-" + std::to_string(::getpid()); }

// socket: where not null, the name of the abstract socket rank 0 handed the segment out
// on (what the rendezvous store says), for the checks that nothing of it is left.
Status join(const std::string &url, int r, int p, Millis timeout, std::unique_ptr<Communicator> *out,
            size_t slot_bytes = 0, bool in_place = true, std::string *socket = nullptr) {
    sx::rdzv::Rendezvous rv;
    SX_TRY(sx::rdzv::parse_rendezvous(url.c_str(), r, p, &rv));
    std::shared_ptr<sx::rdzv::Store> store;
    SX_TRY(sx::rdzv::open_store(rv, Millis(20000), &store));
    sx::comm::ShmOptions opts;
    opts.timeout = timeout;
    opts.slot_bytes = slot_bytes;
    opts.in_place = in_place;
    SX_TRY(sx::comm::create_shm_communicator(store, r, p, opts, out));
    if (socket != nullptr) SX_TRY(store->get("shm/socket", socket, Millis(1000)));
    return Status::Ok();
}

std::string text(const Status &s) { return s.ok() ? "" : s.message(); }

void test_every_collective(void **) {
    for (int p : {1, 2, 3, 5})
        for (size_t slot : {size_t(192), size_t(4096), size_t(0)}) {
            const std::string url = url_for("all") + "-" + std::to_string(p) + "-" + std::to_string(slot);
            sxtest::run_ranks(p, [&](int r) -> std::string {
                std::unique_ptr<Communicator> c;
                Status s = join(url, r, p, Millis(20000), &c, slot);
                if (!s.ok()) return "join: " + s.message();
                return sxtest::check_all_collectives(*c);
            });
        }
}

// Small all-reduces (one barrier each: their values go through the call's lines, which
// every other call reuses) back to back with other calls, on both sides of the 8 KiB
// threshold, one rank at a time late: every result is the exact sum of that call's values
// (each call's values differ from the last's, so a line read a call late is found).
std::string small_all_reduces_back_to_back(Communicator &c, int r, int p) {
    Status s;
    for (int i = 0; i < 1500; ++i) {
        if (i % 100 < 3 && (i / 100) % p == r) std::this_thread::sleep_for(std::chrono::microseconds(300));
        const size_t n = i % 50 == 0 ? 1025 : i % 50 == 1 ? 1024 : 1 + static_cast<size_t>(i) % 9;
        std::vector<double> v(n);
        for (size_t k = 0; k < n; ++k) v[k] = r * 1000.0 + i + static_cast<double>(k);
        if (!(s = c.all_reduce_sum(v.data(), n)).ok()) return "all_reduce_sum: " + s.message();
        const double ranks = p * (p - 1) / 2 * 1000.0;
        for (size_t k = 0; k < n; ++k)
            if (v[k] != ranks + p * (i + static_cast<double>(k)))
                return "call " + std::to_string(i) + ": element " + std::to_string(k) + " = " + std::to_string(v[k]);
        if (i % 3 == 0) {
            uint64_t m = static_cast<uint64_t>(r * 7 + i);
            if (!(s = c.all_reduce_max(&m, 1)).ok()) return "all_reduce_max: " + s.message();
            if (m != static_cast<uint64_t>((p - 1) * 7 + i)) return "call " + std::to_string(i) + ": max wrong";
        }
        if (i % 7 == 0) {
            int32_t b = r == i % p ? i : -1;
            if (!(s = c.broadcast(&b, sizeof b, i % p)).ok()) return "broadcast: " + s.message();
            if (b != i) return "call " + std::to_string(i) + ": broadcast wrong";
        }
        if (i % 11 == 0) {
            float f = static_cast<float>(r + i);
            if (!(s = c.all_reduce_sum_f32(&f, 1)).ok()) return "all_reduce_sum_f32: " + s.message();
            if (f != static_cast<float>(p * i + p * (p - 1) / 2)) return "call " + std::to_string(i) + ": f32 sum wrong";
        }
    }
    return "";
}

// ... with ranks as threads (3 and 5), and as forked processes (3).
void test_small_all_reduces_back_to_back(void **) {
    for (int p : {3, 5}) {
        const std::string url = url_for("small") + "-" + std::to_string(p);
        sxtest::run_ranks(p, [&](int r) -> std::string {
            std::unique_ptr<Communicator> c;
            Status s = join(url, r, p, Millis(20000), &c, 4096);
            if (!s.ok()) return "join: " + s.message();
            return small_all_reduces_back_to_back(*c, r, p);
        });
    }
}

// A reduce-scatter of 1 Mi floats per rank through 64 KiB slots gives the sums, in place
// too, and the same bits on every rank for the all-reduce.
void test_large_and_in_place(void **) {
    const int p = 3;
    const size_t shard = 1 << 20;
    sxtest::run_ranks(p, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url_for("large"), r, p, Millis(20000), &c, 64 << 10);
        if (!s.ok()) return "join: " + s.message();
        std::vector<float> buf(shard * p);
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = sxtest::rs_input(r, i);
        float *own = buf.data() + static_cast<size_t>(r) * shard;
        s = c->reduce_scatter_sum(buf.data(), shard, own, false);
        if (!s.ok()) return s.message();
        for (size_t i = 0; i < shard; ++i) {
            float want = 0.0f;
            for (int q = 0; q < p; ++q) want += sxtest::rs_input(q, static_cast<size_t>(r) * shard + i);
            if (own[i] != want) return "in-place reduce-scatter: element " + std::to_string(i) + " wrong";
        }
        std::vector<float> x(300001);
        for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(r + 1) / static_cast<float>(i + 3);
        s = c->all_reduce_sum_f32(x.data(), x.size());
        if (!s.ok()) return s.message();
        std::vector<float> mine(x);
        std::vector<float> rank0(x.size());
        if (r == 0) rank0 = x;
        s = c->broadcast(rank0.data(), rank0.size() * sizeof(float), 0);
        if (!s.ok()) return s.message();
        if (std::memcmp(rank0.data(), mine.data(), mine.size() * sizeof(float)) != 0)
            return "all_reduce_sum_f32 gave other bits on this rank than on rank 0";
        return "";
    });
}

void test_ranks_in_different_collectives(void **) {
    sxtest::run_ranks(2, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url_for("mismatch"), r, 2, Millis(20000), &c);
        if (!s.ok()) return "join: " + s.message();
        std::vector<char> buf(64);
        std::vector<double> d(4, 1.0);
        s = r == 0 ? c->all_gather(buf.data(), 32) : c->all_reduce_sum(d.data(), d.size());
        if (s.code() != SX_ERR_MISMATCH) return "expected SX_ERR_MISMATCH, got " + text(s);
        if (!contains(s.message(), "all_gather") || !contains(s.message(), "all_reduce_sum"))
            return "the message names not both calls: " + s.message();
        // Nothing moved and the ranks left that call together: the communicator goes on.
        s = c->barrier();
        if (!s.ok()) return "a barrier after the mismatch: " + s.message();
        d.assign(4, static_cast<double>(r + 1));
        s = c->all_reduce_sum(d.data(), d.size());
        if (!s.ok() || d[3] != 3.0) return "an all-reduce after the mismatch: " + text(s);
        return "";
    });
}

// Riders: equal tags give every rank's value, in rank order, on a reduce-scatter (slots and
// threads' buffers alike), an all-gather and a barrier; differing tags, a rider against
// none, and ranks in different calls are SX_ERR_MISMATCH on every rank with nothing
// moved, the communicator usable after; a rider waiting for a call without data, and a
// zero tag, are refused.
void test_riders(void **) {
    for (size_t slot : {size_t(256), size_t(0)}) {
        const int p = 3;
        const std::string url = url_for("riders") + "-" + std::to_string(slot);
        sxtest::run_ranks(p, [&](int r) -> std::string {
            std::unique_ptr<Communicator> c;
            Status s = join(url, r, p, Millis(20000), &c, slot);
            if (!s.ok()) return "join: " + s.message();
            if (!c->carries_riders()) return "the shared-memory transport says it carries no riders";
            std::vector<sx::comm::Rider> all;
            const size_t shard = 100;
            std::vector<float> buf(shard * p, static_cast<float>(r + 1)), out(shard, -1.0f);
            // Equal tags on a reduce-scatter.
            s = c->attach_rider({0x5157u, 0.25 * (r + 1)}, &all);
            if (s.ok()) s = c->reduce_scatter_sum(buf.data(), shard, out.data(), false);
            if (!s.ok()) return "reduce-scatter with a rider: " + s.message();
            if (all.size() != static_cast<size_t>(p)) return "riders: " + std::to_string(all.size()) + " entries";
            for (int q = 0; q < p; ++q)
                if (all[q].value != 0.25 * (q + 1) || all[q].tag != 0x5157u)
                    return "rider of rank " + std::to_string(q) + " reads " + std::to_string(all[q].value);
            if (out[0] != 6.0f || out[shard - 1] != 6.0f) return "the reduce-scatter under a rider summed wrong";
            // Differing tags: nothing moved, every rank told, usable after.
            std::vector<char> g(8 * p, static_cast<char>(r));
            s = c->attach_rider({r == 1 ? 2u : 1u, 1.0}, &all);
            if (s.ok()) s = c->all_gather(g.data(), 8);
            if (s.code() != SX_ERR_MISMATCH || !contains(s.message(), "different riders"))
                return "differing tags: expected SX_ERR_MISMATCH naming the riders, got " + text(s);
            for (int q = 0; q < p; ++q)
                if (q != r && g[static_cast<size_t>(q) * 8] != static_cast<char>(r))
                    return "an all-gather refused for its riders moved data";
            // A rider against none.
            if (r == 0) s = c->attach_rider({7u, 1.0}, &all);
            if (s.ok() || r != 0) s = c->barrier();
            if (s.code() != SX_ERR_MISMATCH) return "a rider against none: expected SX_ERR_MISMATCH, got " + text(s);
            // Equal tags on an all-gather, then on a barrier.
            s = c->attach_rider({9u, -1.0 * r}, &all);
            if (s.ok()) s = c->all_gather(g.data(), 8);
            if (!s.ok() || all[2].value != -2.0 || g[0] != 0 || g[8] != 1 || g[16] != 2)
                return "all-gather with a rider: " + text(s);
            s = c->attach_rider({9u, 10.0 + r}, &all);
            if (s.ok()) s = c->barrier();
            if (!s.ok() || all[1].value != 11.0) return "barrier with a rider: " + text(s);
            // Refused locally, meeting nobody.
            s = c->attach_rider({0u, 1.0}, &all);
            if (s.code() != SX_ERR_INVALID_ARGUMENT) return "a zero tag: expected SX_ERR_INVALID_ARGUMENT, got " + text(s);
            s = c->attach_rider({3u, 1.0}, &all);
            if (s.ok()) s = c->all_gather(g.data(), 0);
            if (s.code() != SX_ERR_INVALID_ARGUMENT || !contains(s.message(), "carries no rider"))
                return "a rider on an empty call: expected SX_ERR_INVALID_ARGUMENT, got " + text(s);
            // And the next call carries none.
            s = c->barrier();
            return s.ok() ? "" : "a barrier after the refusals: " + s.message();
        });
    }
}

void test_stalled_rank_times_out(void **) {
    const long long timeout = 800;
    std::mutex mu;
    std::vector<std::unique_ptr<Communicator>> keep(2);
    sxtest::run_ranks(2, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url_for("stall"), r, 2, Millis(timeout), &c);
        if (!s.ok()) return "join: " + s.message();
        if (r == 1) {  // never calls: the stalled rank
            std::lock_guard<std::mutex> l(mu);
            keep[1] = std::move(c);
            return "";
        }
        const auto start = sxtest::Clock::now();
        s = c->barrier();
        const long long took = ms_since(start);
        if (s.code() != SX_ERR_TIMEOUT) return "expected SX_ERR_TIMEOUT, got " + text(s);
        if (took < timeout - 50 || took > timeout + kSlackMs) return "timed out after " + std::to_string(took) + " ms";
        return "";
    });
}

void test_abort_and_a_destroyed_peer(void **) {
    // abort() from another thread ends a wait at once.
    sxtest::run_ranks(2, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url_for("abort"), r, 2, Millis(30000), &c);
        if (!s.ok()) return "join: " + s.message();
        if (r == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            return "";  // destroyed without calling: rank 0's wait ends then at the latest
        }
        std::thread aborter([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            c->abort();
        });
        const auto start = sxtest::Clock::now();
        s = c->barrier();
        aborter.join();
        if (s.code() != SX_ERR_ABORTED) return "expected SX_ERR_ABORTED, got " + text(s);
        if (ms_since(start) > 1000) return "abort took " + std::to_string(ms_since(start)) + " ms";
        if (c->barrier().code() != SX_ERR_ABORTED) return "a call after abort() did not fail";
        return "";
    });
    // A peer destroyed while this rank waits: SX_ERR_COMM long before the timeout.
    sxtest::run_ranks(2, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url_for("gone"), r, 2, Millis(30000), &c);
        if (!s.ok()) return "join: " + s.message();
        if (r == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            c.reset();
            return "";
        }
        const auto start = sxtest::Clock::now();
        s = c->barrier();
        if (s.code() != SX_ERR_COMM || !contains(s.message(), "rank 1")) return "expected SX_ERR_COMM naming rank 1, got " + text(s);
        if (ms_since(start) > 5000) return "noticed after " + std::to_string(ms_since(start)) + " ms";
        return "";
    });
}

// Rank 0's socket of a run of forked ranks, as it wrote its name into `dir`; "" where it
// wrote none.
std::string socket_of(const sxtest::TempDir &dir) {
    std::ifstream f(dir.path() + "/socket");
    std::string name;
    std::getline(f, name);
    return name;
}

// Rank 0 writes the name of its socket into `dir` (socket_of reads it).
bool tell_socket(const sxtest::TempDir &dir, const std::string &name) {
    std::ofstream f(dir.path() + "/socket");
    f << name << "\n";
    return f.good();
}

// What is left of the abstract socket named `name` (made by this test's ranks; other sx
// processes on the machine have sockets of their own, which are not looked at): the
// lines of /proc/net/unix that name it.
std::vector<std::string> leftovers(const std::string &name) {
    std::vector<std::string> out;
    std::ifstream unix_sockets("/proc/net/unix");
    for (std::string line; std::getline(unix_sockets, line);)
        if (contains(line, ("@" + name).c_str())) out.push_back(line);
    return out;
}

// Forks p processes, rank r running rank(r) and exiting 0 where it returns "" (else 1,
// saying why on stderr); their pids in rank order.
std::vector<pid_t> fork_ranks(int p, const std::function<std::string(int)> &rank) {
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
    return pids;
}

// Small all-reduces back to back (above), ranks as forked processes over a file:// store.
void test_small_all_reduces_between_processes(void **) {
    sxtest::TempDir dir;
    const std::string url = "file://" + dir.path();
    const int p = 3;
    const std::vector<pid_t> pids = fork_ranks(p, [&](int r) -> std::string {
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, p, Millis(20000), &c, 4096);
        if (!s.ok()) return "join: " + s.message();
        return small_all_reduces_back_to_back(*c, r, p);
    });
    for (pid_t pid : pids) {
        int status = 0;
        assert_int_equal(::waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
}

// A host's communicator of more ranks than one message can hand descriptors to: 210
// processes (forked, over a file:// store), each with a shared arena, so that each is
// handed the segment and 209 arenas' descriptors, in runs of 200 (whether it can map
// them all is another matter: under ThreadSanitizer it cannot); each rank sums and
// broadcasts.
// 513 ranks, one past the most, are refused by name.
void test_many_ranks_on_one_host(void **) {
    sxtest::TempDir dir;
    const std::string url = "file://" + dir.path();
    const int p = 210;
    const std::vector<pid_t> pids = fork_ranks(p, [&](int r) -> std::string {
        sx::arena::Block block;  // the arena this rank offers
        if (!sx::arena::allocate(4096, 0, false, &block)) return "no shared arena";
        std::unique_ptr<Communicator> c;
        Status s = join(url, r, p, Millis(120000), &c, 4096);
        if (!s.ok()) return "join: " + s.message();
        double v[3] = {static_cast<double>(r), 1.0, static_cast<double>(r % 7)};
        if (!(s = c->all_reduce_sum(v, 3)).ok()) return "all_reduce_sum: " + s.message();
        double sevens = 0;
        for (int q = 0; q < p; ++q) sevens += q % 7;
        if (v[0] != p * (p - 1) / 2.0 || v[1] != p || v[2] != sevens) return "wrong sums";
        int32_t b = r == p - 1 ? 12345 : -1;
        if (!(s = c->broadcast(&b, sizeof b, p - 1)).ok()) return "broadcast: " + s.message();
        return b == 12345 ? "" : "broadcast wrong";
    });
    int failed = 0;
    for (pid_t pid : pids) {
        int status = 0;
        assert_int_equal(::waitpid(pid, &status, 0), pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    }
    assert_int_equal(failed, 0);
    std::unique_ptr<Communicator> c;
    const Status s = join(url_for("too-many"), 0, 513, Millis(1000), &c);
    assert_int_equal(s.code(), SX_ERR_INVALID_ARGUMENT);
    assert_true(contains(s.message(), "rank 0 of 513 (shared memory takes 1 to 512 ranks per host)"));
}

// Ranks as processes (forked, over a file:// store), their buffers in their shared arenas:
// every collective, then rank 2 is killed with SIGKILL while the others wait for it in a
// reduce-scatter. They fail with
// SX_ERR_COMM within a second (the process is gone), not at the 20 s timeout; once all
// have exited nothing of the segment, the arenas or the socket is left.
void test_processes_and_sigkill(void **) {
    // Rank 2 reaped as soon as it dies (its pid gone), or left a zombie until the others
    // are done, as a launcher that waits for another child first leaves it (kill(pid, 0)
    // still finds it; its pidfd says it exited).
    for (bool zombie : {false, true}) {
        sxtest::TempDir dir;
        const std::string url = "file://" + dir.path();
        const int p = 3;
        const std::vector<pid_t> pids = fork_ranks(p, [&](int r) -> std::string {
            sxtest::check_placement() = sx::HostBuffer::kExchanged;  // the buffers read in place
            std::unique_ptr<Communicator> c;
            std::string socket;
            Status s = join(url, r, p, Millis(20000), &c, 4096, true, &socket);
            std::string e = s.ok() ? sxtest::check_all_collectives(*c) : "join: " + s.message();
            if (e.empty() && r == 0 && !tell_socket(dir, socket)) e = "cannot write the socket's name";
            if (e.empty() && r == 2) {
                s = c->barrier();
                ::raise(SIGKILL);
            }
            if (e.empty()) s = c->barrier();
            if (e.empty() && !s.ok()) e = "barrier: " + s.message();
            if (e.empty()) {
                sxtest::Placed<float> buf(p * 100000, 1.0f), out(100000);
                const auto start = sxtest::Clock::now();
                s = c->reduce_scatter_sum(buf.data(), 100000, out.data(), false);
                if (s.code() != SX_ERR_COMM) e = "after the kill: expected SX_ERR_COMM, got " + text(s);
                else if (ms_since(start) > 3000) e = "the kill was noticed after " + std::to_string(ms_since(start)) + " ms";
            }
            return e;
        });
        for (int k = 0; k < p; ++k) {
            const int r = zombie ? k : p - 1 - k;
            int status = 0;
            assert_int_equal(::waitpid(pids[static_cast<size_t>(r)], &status, 0), pids[static_cast<size_t>(r)]);
            if (r == 2) {
                assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
            } else {
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    print_error("rank %d failed%s\n", r, zombie ? " (rank 2 a zombie)" : "");
                assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            }
        }
        const std::string socket = socket_of(dir);
        assert_true(socket.compare(0, 7, "sx-shm-") == 0);
        const std::vector<std::string> left = leftovers(socket);
        for (const std::string &l : left) print_error("left behind: %s\n", l.c_str());
        assert_true(left.empty());
    }
}

// Ranks as processes whose buffers come from their shared arenas: every collective exact,
// the large ones read in place (counted), with slots small enough for many chunks where
// they are not. Where one rank's buffers are private (the others' in place: the late
// path), where every rank's are, and where the communicator is told not to read in place,
// every collective is as exact, and only what can be is read in place.
void test_processes_read_in_place(void **) {
    enum Mode { kAll, kOnePrivate, kNone, kTurnedOff };
    for (Mode mode : {kAll, kOnePrivate, kNone, kTurnedOff}) {
        sxtest::TempDir dir;
        const std::string url = "file://" + dir.path();
        const int p = 3;
        const std::vector<pid_t> pids = fork_ranks(p, [&](int r) -> std::string {
            const bool exchanged = mode == kAll || mode == kTurnedOff || (mode == kOnePrivate && r != 1);
            sxtest::check_placement() = exchanged ? sx::HostBuffer::kExchanged : sx::HostBuffer::kPrivate;
            std::unique_ptr<Communicator> c;
            std::string socket;
            Status s = join(url, r, p, Millis(20000), &c, 4096, mode != kTurnedOff, &socket);
            std::string e = s.ok() ? "" : "join: " + s.message();
            if (e.empty() && r == 0 && !tell_socket(dir, socket)) e = "cannot write the socket's name";
            if (e.empty() && c->reads_in_place() != (mode != kTurnedOff)) e = "reads_in_place() is wrong";
            if (e.empty()) e = sxtest::check_all_collectives(*c);
            // Which calls read in place: a reduce-scatter and an all-gather need every
            // rank's buffer there, a broadcast its root's alone.
            sxtest::Placed<float> buf(3 * 1000, 1.0f);
            const char *calls[] = {"reduce_scatter_sum", "all_gather", "broadcast from 1", "broadcast from 0"};
            const bool want[4][4] = {{true, true, true, true}, {false, false, false, true}, {}, {}};
            for (int k = 0; k < 4 && e.empty(); ++k) {
                const uint64_t before = sx::comm::collectives_in_place();
                if (k == 0) s = c->reduce_scatter_sum(buf.data(), 1000, buf.data() + r * 1000, false);
                if (k == 1) s = c->all_gather(buf.data(), 1000 * sizeof(float));
                if (k >= 2) s = c->broadcast(buf.data(), 4000, k == 2 ? 1 : 0);
                const bool read = sx::comm::collectives_in_place() - before == 1;
                if (!s.ok()) e = std::string(calls[k]) + ": " + s.message();
                else if (read != want[mode][k])
                    e = "mode " + std::to_string(mode) + ": " + calls[k] + (read ? " read" : " did not read") +
                        " in place";
            }
            return e;
        });
        for (pid_t pid : pids) {
            int status = 0;
            assert_int_equal(::waitpid(pid, &status, 0), pid);
            assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        const std::string socket = socket_of(dir);
        assert_true(socket.compare(0, 7, "sx-shm-") == 0);
        assert_true(leftovers(socket).empty());
    }
}

// Ranks on one host take shared memory; ranks whose SX_HOST_ID differs take Gloo.
void test_transport_choice(void **) {
    for (bool same : {true, false}) {
        const std::string url = url_for(same ? "choice-same" : "choice-other");
        std::vector<int> chose(2, -1);
        sxtest::run_ranks(2, [&](int r) -> std::string {
            sx::rdzv::Rendezvous rv;
            Status s = sx::rdzv::parse_rendezvous(url.c_str(), r, 2, &rv);
            std::shared_ptr<sx::rdzv::Store> store;
            if (s.ok()) s = sx::rdzv::open_store(rv, Millis(20000), &store);
            sx::comm::GlooOptions opts;
            opts.bind_address = "127.0.0.1";
            opts.timeout = Millis(20000);
            std::unique_ptr<Communicator> c;
            sx::comm::CpuTransport chosen = sx::comm::CpuTransport::kHierarchical;
            // Another host for rank 1 where asked.
            if (s.ok())
                s = sx::comm::create_cpu_communicator(store, r, 2, opts, true, &c, &chosen,
                                                      !same && r == 1 ? "elsewhere" : "");
            if (!s.ok()) return s.message();
            chose[static_cast<size_t>(r)] = chosen == sx::comm::CpuTransport::kSharedMemory ? 1 : 0;
            return sxtest::check_all_collectives(*c);
        });
        assert_int_equal(chose[0], same ? 1 : 0);
        assert_int_equal(chose[1], same ? 1 : 0);
    }
}

// Ranks on several hosts of several ranks each (hosts named per rank): shared memory on
// each host and Gloo between host peers, every collective exact, with hosts whose ranks
// are contiguous, interleaved, and in three hosts; hosts of different sizes, or a rank
// alone on its host, take Gloo.
void test_hierarchy(void **) {
    struct Case {
        std::vector<std::string> hosts;
        sx::comm::CpuTransport want;
    };
    using T = sx::comm::CpuTransport;
    const std::vector<Case> cases = {
        {{"a", "a", "b", "b"}, T::kHierarchical},
        {{"a", "b", "a", "b"}, T::kHierarchical},
        {{"b", "a", "c", "a", "c", "b"}, T::kHierarchical},
        {{"a", "a", "b"}, T::kGloo},
        {{"a", "b", "b", "b"}, T::kGloo},
    };
    for (size_t k = 0; k < cases.size(); ++k) {
        const Case &cs = cases[k];
        const int p = static_cast<int>(cs.hosts.size());
        const std::string url = url_for("hier") + "-" + std::to_string(k);
        std::vector<T> chose(static_cast<size_t>(p), T::kSharedMemory);
        sxtest::run_ranks(p, [&](int r) -> std::string {
            sx::rdzv::Rendezvous rv;
            Status s = sx::rdzv::parse_rendezvous(url.c_str(), r, p, &rv);
            std::shared_ptr<sx::rdzv::Store> store;
            if (s.ok()) s = sx::rdzv::open_store(rv, Millis(20000), &store);
            sx::comm::GlooOptions opts;
            opts.bind_address = "127.0.0.1";
            opts.timeout = Millis(20000);
            opts.in_process = false;  // the hosts' peers over TCP, as between machines
            std::unique_ptr<Communicator> c;
            if (s.ok())
                s = sx::comm::create_cpu_communicator(store, r, p, opts, true, &c, &chose[static_cast<size_t>(r)],
                                                      cs.hosts[static_cast<size_t>(r)]);
            if (!s.ok()) return s.message();
            if (c->rank() != r || c->world_size() != p) return "wrong rank or world size";
            return sxtest::check_all_collectives(*c);
        });
        for (int r = 0; r < p; ++r)
            if (chose[static_cast<size_t>(r)] != cs.want)
                fail_msg("case %zu: rank %d chose transport %d, not %d", k, r, static_cast<int>(chose[static_cast<size_t>(r)]),
                         static_cast<int>(cs.want));
    }
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_collective),
        cmocka_unit_test(test_many_ranks_on_one_host),
        cmocka_unit_test(test_large_and_in_place),
        cmocka_unit_test(test_small_all_reduces_back_to_back),
        cmocka_unit_test(test_small_all_reduces_between_processes),
        cmocka_unit_test(test_ranks_in_different_collectives),
        cmocka_unit_test(test_riders),
        cmocka_unit_test(test_stalled_rank_times_out),
        cmocka_unit_test(test_abort_and_a_destroyed_peer),
        cmocka_unit_test(test_processes_and_sigkill),
        cmocka_unit_test(test_processes_read_in_place),
        cmocka_unit_test(test_transport_choice),
        cmocka_unit_test(test_hierarchy),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
