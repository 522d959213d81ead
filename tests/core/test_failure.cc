// The failure part on its own (core/failure.h): the first failure is kept (a later one
// is not), every later check says so in its words, and sx_abort is told apart.
#include <string>

#include "core/failure.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

namespace {

void test_first_failure_and_abort(void **) {
    sx::core::Failure f;
    assert_true(f.check().ok() && !f.aborted());
    assert_true(f.record(SX_ERROR(SX_ERR_TIMEOUT, "rank 1 did not come")));
    assert_false(f.record(SX_ERROR(SX_ERR_COMM, "a later one")));
    sx::Status s = f.check();
    assert_int_equal(s.code(), SX_ERR_GROUP_FAILED);
    assert_true(s.message().find("the first error was: rank 1 did not come") != std::string::npos);
    sx::core::Failure a;
    a.set_aborted();
    assert_true(a.aborted());
    assert_true(a.check().message().find("aborted with sx_abort()") != std::string::npos);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_first_failure_and_abort)};
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
