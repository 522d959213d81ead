// The Store contract, checked the same way on every store: each check takes a function
// that opens ranks 0..world-1 of the next group on one rendezvous (a fresh one per check).
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "rdzv/store.h"
#include "comm_test_util.h"

namespace sxtest {

using sx::Status;
using sx::Millis;
using sx::rdzv::Store;

using OpenGroup = std::function<std::vector<std::shared_ptr<Store>>(int world)>;

constexpr Millis kStoreWait(20000);
// How late a timeout may come back on a loaded 2-core machine under sanitizers.
constexpr long long kSlackMs = 1500;

inline void check_contract(const OpenGroup &open_group) {
    auto g = open_group(2);
    Store &a = *g[0];
    Store &b = *g[1];
    std::string v;

    ASSERT_OK(a.set("k", "v1"));
    ASSERT_OK(b.get("k", &v, kStoreWait));
    assert_string_equal(v.c_str(), "v1");
    ASSERT_OK(b.set("k", std::string("v2\0bin", 6)));  // replaces; values are bytes
    ASSERT_OK(a.get("k", &v, Millis(10)));
    assert_int_equal(v.size(), 6);
    assert_memory_equal(v.data(), "v2\0bin", 6);

    bool present = false;
    ASSERT_OK(a.check({"k"}, &present));
    assert_true(present);
    ASSERT_OK(a.check({"k", "other"}, &present));
    assert_false(present);
    ASSERT_OK(a.wait({"k"}, Millis(10)));

    int64_t n = 0;
    ASSERT_OK(a.add("count", 5, &n));
    assert_int_equal(n, 5);
    ASSERT_OK(b.add("count", -2, &n));
    assert_int_equal(n, 3);
    ASSERT_OK(b.add("count", 0, nullptr));
    ASSERT_OK(a.get("count", &v, kStoreWait));
    assert_string_equal(v.c_str(), "3");
    ASSERT_CODE(a.add("k", 1, &n), SX_ERR_INVALID_STATE);  // not a counter

    ASSERT_OK(b.erase("k"));
    ASSERT_OK(a.check({"k"}, &present));
    assert_false(present);
    ASSERT_OK(b.erase("k"));  // absent: fine

    // A get blocks until another rank sets the key.
    std::thread setter([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        b.set("late", "here");
    });
    auto start = sxtest::Clock::now();
    ASSERT_OK(a.get("late", &v, kStoreWait));
    setter.join();
    assert_string_equal(v.c_str(), "here");
    assert_true(ms_since(start) < 5000);

    // So does a wait for several keys.
    std::thread setter2([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        b.set("w1", "");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        b.set("w2", "");
    });
    ASSERT_OK(a.wait({"w1", "w2"}, kStoreWait));
    setter2.join();
}

inline void check_timeouts(const OpenGroup &open_group) {
    auto g = open_group(1);
    Store &s = *g[0];
    ASSERT_OK(s.set("there", "1"));
    std::string v;
    for (int round = 0; round < 2; ++round) {  // the store stays usable after a timeout
        auto start = sxtest::Clock::now();
        Status st = s.get("missing-key", &v, Millis(300));
        long long took = ms_since(start);
        ASSERT_CODE(st, SX_ERR_TIMEOUT);
        assert_true(contains(st.message(), "missing-key"));
        assert_true(took >= 290 && took <= 300 + kSlackMs);

        start = sxtest::Clock::now();
        st = s.wait({"there", "absent-key"}, Millis(300));
        took = ms_since(start);
        ASSERT_CODE(st, SX_ERR_TIMEOUT);
        assert_true(contains(st.message(), "absent-key"));
        assert_true(took >= 290 && took <= 300 + kSlackMs);

        ASSERT_OK(s.get("there", &v, Millis(1000)));
        assert_string_equal(v.c_str(), "1");
    }
}

// Threads adding through two ranks' stores at once: no add is lost.
inline void check_concurrent_adds(const OpenGroup &open_group) {
    auto g = open_group(2);
    constexpr int kThreads = 4, kAdds = 50;
    sxtest::run_ranks(kThreads, [&](int t) -> std::string {
        Store &s = *g[static_cast<size_t>(t % 2)];
        for (int i = 0; i < kAdds; ++i) {
            Status st = s.add("sum", t + 1, nullptr);
            if (!st.ok()) return st.message();
        }
        return "";
    });
    int64_t total = 0;
    ASSERT_OK(g[0]->add("sum", 0, &total));
    assert_int_equal(total, kAdds * (1 + 2 + 3 + 4));
}

// Successive groups on one rendezvous each start from an empty key space, also while
// an earlier group is still alive.
inline void check_fresh_key_spaces(const OpenGroup &open_group) {
    auto first = open_group(2);
    ASSERT_OK(first[0]->set("addr", "old"));
    int64_t n = 0;
    ASSERT_OK(first[1]->add("joined", 1, &n));

    auto second = open_group(2);  // `first` still alive
    bool present = true;
    ASSERT_OK(second[1]->check({"addr"}, &present));
    assert_false(present);
    ASSERT_OK(second[0]->add("joined", 1, &n));
    assert_int_equal(n, 1);
    ASSERT_OK(second[0]->set("addr", "new"));
    std::string v;
    ASSERT_OK(first[1]->get("addr", &v, kStoreWait));
    assert_string_equal(v.c_str(), "old");

    second.clear();
    first.clear();
    auto third = open_group(2);
    ASSERT_OK(third[0]->check({"addr"}, &present));
    assert_false(present);
    ASSERT_OK(third[1]->check({"joined"}, &present));
    assert_false(present);
}

}  // namespace sxtest
