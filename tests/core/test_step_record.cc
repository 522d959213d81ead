// The step record on its own (core/step_record.h): the step options refused, a taken
// step's counts (per param only where the step applied it, SGD's momentum count only with
// momentum, every group's, the dynamic scale's growth), the result, the all-zero warning
// (the 1st, 10th, 100th step in a row, and again after a step with gradients), and the
// nonfinite policy's verdict on a skipped step.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "base/log.h"
#include "core/step_record.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

using sx::core::StepOptions;
using sx::core::StepRecord;
using sx::core::StepResult;

namespace {

std::vector<std::string> warnings;

void keep(int32_t level, const char *message, void *) {
    if (level == SX_LOG_WARN) warnings.push_back(message);
}

void test_options_refused(void **) {
    StepOptions o;
    assert_true(sx::core::check_step_options(o).ok());
    o.max_grad_norm = -1.0;
    assert_int_equal(sx::core::check_step_options(o).code(), SX_ERR_INVALID_ARGUMENT);
    o.max_grad_norm = std::numeric_limits<double>::infinity();
    assert_int_equal(sx::core::check_step_options(o).code(), SX_ERR_INVALID_ARGUMENT);
    o = StepOptions();
    o.weight = -2.0;  // not weighted: not looked at
    assert_true(sx::core::check_step_options(o).ok());
    o.weighted = true;
    sx::Status s = sx::core::check_step_options(o);
    assert_int_equal(s.code(), SX_ERR_INVALID_ARGUMENT);
    assert_non_null(std::strstr(s.message().c_str(), "weight = -2"));
}

void test_counts_and_result(void **) {
    sx::core::ParamTable t;
    sx::optim::Hyper sgd;
    sgd.kind = sx::optim::Kind::kSgd;
    sgd.momentum = 0.9;
    sx::optim::Hyper adamw;
    adamw.kind = sx::optim::Kind::kAdamW;
    assert_true(t.add_group(sgd, nullptr).ok() && t.add_group(adamw, nullptr).ok());
    const int64_t shape[1] = {4};
    for (int p = 0; p < 3; ++p)
        assert_true(t.add_param(("p" + std::to_string(p)).c_str(), 1, shape, 0, p == 2 ? 1 : 0, p, false, nullptr)
                        .ok());
    t.applied().assign(3, 1);
    t.applied()[1] = 0;  // frozen for this step
    sx::core::LossScaler scaler;
    sx::core::LossScaling ls;
    ls.mode = SX_LOSS_SCALING_DYNAMIC;
    ls.init_scale = 8.0;
    ls.growth_interval = 2;
    scaler.configure(ls);
    StepRecord r;
    for (int k = 0; k < 2; ++k) {
        r.count(t, scaler, true);
        r.advance();
    }
    assert_int_equal(r.steps(), 2);
    assert_int_equal(t.params()[0].step, 2);
    assert_int_equal(t.params()[0].momentum_steps, 2);
    assert_int_equal(t.params()[1].step, 0);  // not applied
    assert_int_equal(t.params()[2].step, 2);
    assert_int_equal(t.params()[2].momentum_steps, 0);  // AdamW has no momentum buffer
    assert_int_equal(t.groups()[0].steps, 2);
    assert_int_equal(t.groups()[1].steps, 2);
    assert_true(scaler.scale() == 16.0);  // grown after growth_interval finite steps
    StepResult res;
    r.begin_update();
    r.note_nonfinite(false);
    r.report(1.5, false, scaler.scale(), &res);
    assert_true(res.grad_norm == 1.5 && res.step == 2 && !res.skipped && res.loss_scale == 16.0 && !res.nonfinite);
    r.note_nonfinite(true);
    r.note_nonfinite(false);  // once written, the step reports it
    r.report(1.5, true, 4.0, &res);
    assert_true(res.nonfinite && res.skipped && res.loss_scale == 4.0);
    r.begin_update();
    r.report(std::nan(""), true, 4.0, &res);
    assert_true(res.nonfinite);  // the norm itself
    r.report(1.0, false, 1.0, nullptr);  // no result asked for
    r.set_steps(40);
    assert_int_equal(r.steps(), 40);
}

void test_zero_gradient_warning(void **) {
    sx::set_log_callback(keep, nullptr, SX_LOG_WARN);
    StepRecord r;
    warnings.clear();
    for (int k = 0; k < 100; ++k) r.warn_if_no_gradient(0.0, true);
    assert_int_equal(warnings.size(), 3);  // the 1st, the 10th, the 100th
    assert_non_null(std::strstr(warnings[1].c_str(), "(10 steps in a row)"));
    r.warn_if_no_gradient(0.0, false);  // nothing trainable: not the trainer's mistake
    r.warn_if_no_gradient(0.0, true);
    assert_int_equal(warnings.size(), 4);  // the run started again
    assert_non_null(std::strstr(warnings[3].c_str(), "(1 step in a row)"));
    r.warn_if_no_gradient(0.5, true);
    r.warn_if_no_gradient(0.0, true);
    assert_int_equal(warnings.size(), 5);
    sx::set_log_callback(nullptr, nullptr, SX_LOG_WARN);
}

void test_skip_verdicts(void **) {
    const sx::Status nonfinite = SX_ERROR(SX_ERR_NONFINITE, "wrote inf");
    const sx::Status failed = SX_ERROR(SX_ERR_OPTIMIZER, "returned 3");
    assert_true(StepRecord::after_custom_skip(nonfinite, SX_NONFINITE_SKIP).ok());
    assert_int_equal(StepRecord::after_custom_skip(nonfinite, SX_NONFINITE_ERROR).code(), SX_ERR_NONFINITE);
    assert_int_equal(StepRecord::after_custom_skip(failed, SX_NONFINITE_SKIP).code(), SX_ERR_OPTIMIZER);
    assert_true(StepRecord::after_nonfinite_norm(INFINITY, SX_NONFINITE_SKIP).ok());
    assert_true(StepRecord::after_nonfinite_norm(INFINITY, SX_NONFINITE_DEFAULT).ok());
    sx::Status s = StepRecord::after_nonfinite_norm(INFINITY, SX_NONFINITE_ERROR);
    assert_int_equal(s.code(), SX_ERR_NONFINITE);
    assert_non_null(std::strstr(s.message().c_str(), "global norm is inf"));
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_refused),
        cmocka_unit_test(test_counts_and_result),
        cmocka_unit_test(test_zero_gradient_warning),
        cmocka_unit_test(test_skip_verdicts),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
