// The param table part on its own (core/param_table.h): registration checks (a dtype,
// a param group and a unit that exist, names unique), indices by name, trainable flags,
// and what sx_finalize laid out: params added after it wait (pending), must go in new
// units above every laid-out one, and are not laid out until the next.
#include <cstring>
#include <string>

#include "core/param_table.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

using sx::core::ParamTable;

namespace {

sx::Status add(ParamTable &t, const char *name, int32_t unit, int32_t group = 0, int32_t dtype = 0,
               int32_t *index = nullptr) {
    const int64_t shape[2] = {3, 4};
    return t.add_param(name, 2, shape, dtype, group, unit, false, index);
}

bool names(const sx::Status &s, const char *what) { return std::strstr(s.message().c_str(), what) != nullptr; }

void test_registration_and_layout(void **) {
    ParamTable t;
    // A param needs a param group.
    assert_int_equal(add(t, "w", 0).code(), SX_ERR_INVALID_ARGUMENT);
    sx::optim::Hyper h;
    h.kind = sx::optim::Kind::kAdamW;
    int32_t g = -1;
    assert_true(t.add_group(h, &g).ok() && g == 0);
    h.lr = -1.0;
    assert_int_equal(t.add_group(h, nullptr).code(), SX_ERR_INVALID_ARGUMENT);  // checked as torch does
    int32_t i = -1;
    assert_true(add(t, "w", 0, 0, 0, &i).ok() && i == 0);
    assert_true(t.params()[0].numel == 12 && t.params()[0].dtype == SX_DTYPE_F32);
    sx::Status s = add(t, "w", 1);
    assert_int_equal(s.code(), SX_ERR_ALREADY_EXISTS);
    assert_int_equal(add(t, "x", 0, 0, 77).code(), SX_ERR_INVALID_ARGUMENT);
    assert_int_equal(add(t, "x", -1).code(), SX_ERR_INVALID_ARGUMENT);
    assert_true(add(t, "b", 2, 0, SX_DTYPE_BF16).ok());
    assert_true(t.find("b", &i).ok() && i == 1);
    assert_int_equal(t.find("nope", &i).code(), SX_ERR_NOT_FOUND);
    // Trainable flags, through set_trainable and through the pointer.
    assert_true(t.trainable(1));
    assert_true(t.set_trainable(1, false).ok() && !t.trainable(1));
    t.mask()[1] = 1;
    assert_true(t.trainable(1));
    assert_int_equal(t.set_trainable(5, true).code(), SX_ERR_INVALID_ARGUMENT);
    // Not laid out yet.
    assert_false(t.finalized() || t.pending());
    assert_int_equal(t.check_laid_out(0).code(), SX_ERR_INVALID_STATE);
    t.set_finalized(true);
    t.laid_out(2);
    assert_true(t.check_laid_out(1).ok() && !t.pending());
    // After it: a new param goes in a unit above 2, and waits for the next layout.
    s = add(t, "late", 2);
    assert_int_equal(s.code(), SX_ERR_INVALID_ARGUMENT);
    assert_true(names(s, "ids above 2"));
    assert_true(add(t, "late", 3).ok() && t.pending() && t.pending_params() == 1);
    s = t.check_laid_out(2);
    assert_int_equal(s.code(), SX_ERR_INVALID_STATE);
    assert_true(names(s, "'late' was added after sx_finalize"));
    t.laid_out(3);
    assert_false(t.pending());
    double lr = 0.0;
    assert_true(t.get_hyperparameter(0, SX_HP_LR, &lr).ok() && lr == sx::optim::Hyper().lr);
    assert_int_equal(t.get_hyperparameter(4, SX_HP_LR, &lr).code(), SX_ERR_INVALID_ARGUMENT);
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registration_and_layout),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
