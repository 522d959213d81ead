// CommChannel (core/channel.h): jobs run in submission order on its thread; after a
// failure the later jobs end with it unrun, but for jobs submitted `always` (local work,
// which runs); waits report the first failure at or before their job; clear_failure
// lets later jobs run again; failed_at names the failed job.
#include <atomic>
#include <string>
#include <vector>

#include "core/channel.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

using sx::Status;
using sx::core::CommChannel;

namespace {

void test_order_failure_and_always(void **) {
    CommChannel ch("the test jobs");
    std::vector<int> ran;  // written by the channel's thread, read after drain()
    auto job = [&](int k, sx_status_t code = SX_OK) {
        return [&ran, k, code]() -> Status {
            ran.push_back(k);
            return code == SX_OK ? Status::Ok() : SX_ERROR(code, "job %d failed", k);
        };
    };
    const uint64_t t1 = ch.submit(job(1));
    const uint64_t t2 = ch.submit(job(2, SX_ERR_MISMATCH));
    const uint64_t t3 = ch.submit(job(3));
    const uint64_t t4 = ch.submit(job(4), true);
    const uint64_t t5 = ch.submit(job(5, SX_ERR_IO), true);  // its own failure is ignored: one came first
    assert_true(ch.wait(t1).ok());
    const Status w3 = ch.wait(t3);
    assert_int_equal(w3.code(), SX_ERR_MISMATCH);
    assert_true(w3.message().find("the test jobs: job 2 failed") != std::string::npos);
    assert_int_equal(ch.drain().code(), SX_ERR_MISMATCH);
    assert_true(ran == std::vector<int>({1, 2, 4, 5}));  // 3 dropped; the local ones ran
    assert_true(ch.failed_at() == t2);
    (void)t4;
    (void)t5;
    ch.clear_failure();
    assert_true(ch.failed_at() == 0);
    const uint64_t t6 = ch.submit(job(6));
    assert_true(ch.wait(t6).ok());
    assert_true(ran.back() == 6);
    assert_false(ch.busy());
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_failure_and_always),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
