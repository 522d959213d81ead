// ThreadPool: every index runs exactly once per run(), concurrently, and run() returns
// only after all have finished; size 1 runs inline on the caller; run_open() shares work
// among whoever runs and waits only for the workers that started.
//
// Tests with worker threads assert only after their pool is destroyed: a failed
// assertion leaves by longjmp, which would skip the destructor and leave workers
// waiting on a condition variable in a dead stack frame.
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

extern "C" {
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
}

#include <dlfcn.h>

#include "optim/openmp_team.h"
#include "optim/thread_pool.h"

using sx::optim::OpenMpTeam;
using sx::optim::ThreadPool;

namespace {

void test_size_one_runs_inline(void **) {
    ThreadPool pool(1);
    assert_int_equal(pool.size(), 1);
    const std::thread::id caller = std::this_thread::get_id();
    int calls = 0;
    bool on_caller = false;
    pool.run([&](int i) {
        assert_int_equal(i, 0);
        ++calls;
        on_caller = std::this_thread::get_id() == caller;
    });
    assert_int_equal(calls, 1);
    assert_true(on_caller);
}

void test_nonpositive_size_means_one(void **) {
    ThreadPool zero(0), negative(-3);
    assert_int_equal(zero.size(), 1);
    assert_int_equal(negative.size(), 1);
    int calls = 0;
    negative.run([&](int) { ++calls; });
    assert_int_equal(calls, 1);
}

// Each index once, on distinct threads, index 0 on the caller.
void test_each_index_once_on_distinct_threads(void **) {
    const std::thread::id caller = std::this_thread::get_id();
    std::vector<std::atomic<int>> calls(4);
    std::vector<std::thread::id> ids(4);
    int size = 0;
    {
        ThreadPool pool(4);
        size = pool.size();
        pool.run([&](int i) {
            calls[i].fetch_add(1);
            ids[i] = std::this_thread::get_id();
        });
    }
    assert_int_equal(size, 4);
    std::set<std::thread::id> distinct(ids.begin(), ids.end());
    assert_int_equal(distinct.size(), 4);
    assert_true(ids[0] == caller);
    for (auto &c : calls) assert_int_equal(c.load(), 1);
}

// All workers are inside fn at the same time: each waits (bounded) until every one
// has arrived. A pool that ran the calls one after another would time out here.
void test_runs_concurrently(void **) {
    std::atomic<int> arrived{0};
    std::atomic<int> timed_out{0};
    {
        ThreadPool pool(3);
        pool.run([&](int) {
            arrived.fetch_add(1);
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            while (arrived.load() < 3) {
                if (std::chrono::steady_clock::now() > deadline) {
                    timed_out.fetch_add(1);
                    return;
                }
                std::this_thread::yield();
            }
        });
    }
    assert_int_equal(timed_out.load(), 0);
    assert_int_equal(arrived.load(), 3);
}

// Many back-to-back runs: no lost wake-up, no index run twice or skipped, and every
// call finished before run() returned (the counts are read without waiting).
void test_many_runs(void **) {
    std::vector<std::atomic<int>> calls(3);
    int bad_run = 0, bad_index = -1, bad_count = 0;
    {
        ThreadPool pool(3);
        for (int r = 1; r <= 2000 && bad_run == 0; ++r) {
            pool.run([&](int i) {
                if (i == 2 && r % 100 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
                calls[i].fetch_add(1);
            });
            for (int i = 0; i < 3; ++i) {
                if (calls[i].load() != r && bad_run == 0) {
                    bad_run = r;
                    bad_index = i;
                    bad_count = calls[i].load();
                }
            }
        }
    }
    if (bad_run != 0) fail_msg("run %d: index %d had run %d times", bad_run, bad_index, bad_count);
    for (auto &c : calls) assert_int_equal(c.load(), 2000);
}

// run_open: the work taken from a shared counter is done exactly once whoever takes it;
// every call that started has returned when run_open() does (none is inside fn after
// it); the indexes are the pool's; and back-to-back with run(), which still runs every
// index once, no worker is lost or runs a closed job. Some jobs keep the caller inside
// until a worker has taken a part (bounded), so workers do join; others are so small that
// the caller finishes before any worker wakes.
void test_run_open(void **) {
    const int kItems = 64;
    int bad_run = 0, bad_items = 0, bad_inside = 0, bad_index = 0, joined = 0, run_bad = 0;
    {
        ThreadPool pool(3);
        std::vector<std::atomic<int>> calls(3);
        for (int r = 1; r <= 3000 && bad_run == 0; ++r) {
            std::atomic<int> next{0}, done{0}, inside{0}, by_worker{0};
            const bool wait_for_worker = r % 10 == 0;
            pool.run_open([&](int i) {
                inside.fetch_add(1);
                if (i < 0 || i >= 3) bad_index = i;
                if (i == 0 && wait_for_worker) {
                    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                    while (by_worker.load() == 0 && std::chrono::steady_clock::now() < deadline)
                        std::this_thread::yield();
                }
                for (int k; (k = next.fetch_add(1)) < kItems;) {
                    done.fetch_add(1);
                    if (i != 0) by_worker.fetch_add(1);
                }
                inside.fetch_sub(1);
            });
            if (done.load() != kItems) bad_run = r, bad_items = done.load();
            if (inside.load() != 0) bad_run = r, bad_inside = inside.load();
            if (wait_for_worker && by_worker.load() > 0) ++joined;
            pool.run([&](int i) { calls[i].fetch_add(1); });
            for (int i = 0; i < 3; ++i)
                if (calls[i].load() != r && run_bad == 0) run_bad = r;
        }
    }
    if (bad_run != 0)
        fail_msg("run_open %d: %d of %d items done, %d calls still inside", bad_run, bad_items, kItems, bad_inside);
    if (bad_index != 0) fail_msg("run_open called fn(%d)", bad_index);
    if (run_bad != 0) fail_msg("run() %d after run_open did not run every index once", run_bad);
    // Every job that kept its caller waiting was joined by a worker within 10 s.
    assert_int_equal(joined, 300);
}

// Destruction with no run, and right after one.
void test_destroy(void **) {
    { ThreadPool idle(5); }
    std::atomic<int> sum{0};
    {
        ThreadPool pool(5);
        pool.run([&](int i) { sum.fetch_add(i); });
    }
    assert_int_equal(sum.load(), 0 + 1 + 2 + 3 + 4);
}

// libgomp, loaded as a PyTorch program has it, and the entry points the tests call.
struct Gomp {
    int (*thread_num)();
    int (*in_parallel)();
    void (*parallel)(void (*)(void *), void *, unsigned, unsigned);
};

Gomp load_gomp() {
    void *h = dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL);
    assert_non_null(h);
    Gomp g;
    g.thread_num = reinterpret_cast<int (*)()>(dlsym(h, "omp_get_thread_num"));
    g.in_parallel = reinterpret_cast<int (*)()>(dlsym(h, "omp_in_parallel"));
    g.parallel = reinterpret_cast<decltype(g.parallel)>(dlsym(h, "GOMP_parallel"));
    assert_true(g.thread_num && g.in_parallel && g.parallel);
    return g;
}

// On a thread whose caller team is set, run() calls each index once on the OpenMP team
// (index i on team thread i, 0 the caller), and run_open() too; cleared, the pool's own
// threads run it again. Inside a parallel region the team declines, and the pool runs it.
void test_caller_openmp_team(void **) {
#ifdef __SANITIZE_THREAD__
    skip();  // libgomp is not built for ThreadSanitizer: its barriers would read as races
#endif
    const Gomp gomp = load_gomp();
    auto thread_num = gomp.thread_num, in_parallel = gomp.in_parallel;
    auto parallel = gomp.parallel;
    setenv("SX_OPENMP_LATE_START_US", "0", 1);  // never cold: the team takes every job
    const OpenMpTeam *team = nullptr;
    assert_true(OpenMpTeam::find(&team).ok());
    assert_string_equal(team->library().c_str(), "libgomp.so.1");
    std::vector<int> team_index(3, -1), in_region(3, -1);
    std::vector<std::atomic<int>> calls(3);
    int after_clear_in_region = 0, open_sum = 0;
    {
        ThreadPool pool(3);
        sx::optim::set_caller_openmp_team(team);
        pool.run([&](int i) {
            calls[static_cast<size_t>(i)].fetch_add(1);
            team_index[static_cast<size_t>(i)] = thread_num();
            in_region[static_cast<size_t>(i)] = in_parallel();
        });
        std::atomic<int> next{0}, sum{0};
        pool.run_open([&](int) {
            for (int k; (k = next.fetch_add(1)) < 100;) sum.fetch_add(k);
        });
        open_sum = sum.load();
        sx::optim::set_caller_openmp_team(nullptr);
        std::atomic<int> regions{0};
        pool.run([&](int) { regions.fetch_add(in_parallel()); });
        after_clear_in_region = regions.load();
    }
    for (int i = 0; i < 3; ++i) {
        assert_int_equal(calls[static_cast<size_t>(i)].load(), 1);
        assert_int_equal(team_index[static_cast<size_t>(i)], i);
        assert_int_equal(in_region[static_cast<size_t>(i)], 1);
    }
    assert_int_equal(open_sum, 99 * 100 / 2);
    assert_int_equal(after_clear_in_region, 0);
    // Nested: a team of one would serialise the job, so run() declines it.
    struct Nested {
        const OpenMpTeam *team;
        int (*thread_num)();
        std::atomic<int> declined{0}, ran{0};
    } nested{team, thread_num};
    parallel([](void *p) {
        Nested *n = static_cast<Nested *>(p);
        if (n->thread_num() != 0) return;
        const bool ran = n->team->run([&](int) { n->ran.fetch_add(1); }, 2);
        if (!ran) n->declined.fetch_add(1);
    }, &nested, 2, 0);
    assert_int_equal(nested.declined.load(), 1);
    assert_int_equal(nested.ran.load(), 0);
}

// A team thread that starts late (here: more than 1 us after the call, as the team's
// threads of a new thread are created by its first region) makes the team cold on that
// thread: the pool takes its next 64 jobs, then the team is tried again.
void test_late_team_goes_cold(void **) {
#ifdef __SANITIZE_THREAD__
    skip();  // libgomp is not built for ThreadSanitizer: its barriers would read as races
#endif
    auto in_parallel = load_gomp().in_parallel;
    const OpenMpTeam *team = nullptr;
    setenv("SX_OPENMP_LATE_START_US", "x", 1);
    assert_false(OpenMpTeam::find(&team).ok());
    setenv("SX_OPENMP_LATE_START_US", "1", 1);
    assert_true(OpenMpTeam::find(&team).ok());
    std::vector<int> on_team;  // per job: whether it ran in a parallel region
    {
        ThreadPool pool(2);
        std::thread fresh([&] {
            sx::optim::set_caller_openmp_team(team);
            for (int job = 0; job < 66; ++job) {
                std::atomic<int> regions{0};
                pool.run([&](int) { regions.fetch_add(in_parallel()); });
                on_team.push_back(regions.load() > 0 ? 1 : 0);
            }
            sx::optim::set_caller_openmp_team(nullptr);
        });
        fresh.join();
    }
    setenv("SX_OPENMP_LATE_START_US", "0", 1);
    assert_true(OpenMpTeam::find(&team).ok());
    assert_int_equal(on_team.size(), 66);
    assert_int_equal(on_team[0], 1);
    for (int job = 1; job <= 64; ++job) assert_int_equal(on_team[static_cast<size_t>(job)], 0);
    assert_int_equal(on_team[65], 1);
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_one_runs_inline),
        cmocka_unit_test(test_nonpositive_size_means_one),
        cmocka_unit_test(test_each_index_once_on_distinct_threads),
        cmocka_unit_test(test_runs_concurrently),
        cmocka_unit_test(test_run_open),
        cmocka_unit_test(test_many_runs),
        cmocka_unit_test(test_destroy),
        cmocka_unit_test(test_caller_openmp_team),
        cmocka_unit_test(test_late_team_goes_cold),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
