// The loss scaler part on its own: torch.cuda.amp.GradScaler's rule (growth after
// growth_interval finite steps in a row, backoff and a restarted count on a non-finite
// one), static and no scaling left alone, a restored state, and each setting's check.
#include <cstring>

#include "core/loss_scaler.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"

using sx::core::LossScaler;
using sx::core::LossScalerState;
using sx::core::LossScaling;

namespace {

LossScaling dynamic_scaling() {
    LossScaling s;
    s.mode = SX_LOSS_SCALING_DYNAMIC;
    s.init_scale = 1024.0;
    s.growth_factor = 2.0;
    s.backoff_factor = 0.25;
    s.growth_interval = 3;
    return s;
}

void test_dynamic_follows_grad_scaler(void **) {
    LossScaler sc;
    sc.configure(dynamic_scaling());
    assert_true(sc.dynamic());
    assert_true(sc.scale() == 1024.0);
    // GradScaler, step by step: (finite?, scale after, growth count after).
    const struct {
        bool finite;
        double scale;
        int64_t tracker;
    } steps[] = {{true, 1024, 1},   {true, 1024, 2},  {true, 2048, 0}, {true, 2048, 1},
                 {false, 512, 0},   {true, 512, 1},   {true, 512, 2},  {false, 128, 0},
                 {true, 128, 1},    {true, 128, 2},   {true, 256, 0}};
    for (const auto &st : steps) {
        if (st.finite) {
            sc.on_finite_step();
        } else {
            sc.on_nonfinite_step();
        }
        assert_true(sc.scale() == st.scale);
        assert_int_equal(sc.state().growth_tracker, st.tracker);
    }
    // A new configuration starts over.
    sc.configure(dynamic_scaling());
    assert_true(sc.scale() == 1024.0 && sc.state().growth_tracker == 0);
}

void test_static_and_none_stay(void **) {
    LossScaler sc;
    assert_true(sc.scale() == 1.0 && !sc.dynamic());  // unconfigured: no scaling
    LossScaling s = dynamic_scaling();
    s.mode = SX_LOSS_SCALING_STATIC;
    sc.configure(s);
    for (int i = 0; i < 10; ++i) {
        sc.on_finite_step();
        sc.on_nonfinite_step();
    }
    assert_true(sc.scale() == 1024.0 && sc.state().growth_tracker == 0);
    s.mode = SX_LOSS_SCALING_NONE;
    sc.configure(s);
    assert_true(sc.scale() == 1.0);  // none: init_scale does not apply
}

void test_restore(void **) {
    LossScaler sc;
    sc.configure(dynamic_scaling());
    LossScalerState st;
    st.scale = 8.0;
    st.growth_tracker = 2;
    sc.restore(st);
    sc.on_finite_step();  // the third in a row
    assert_true(sc.scale() == 16.0 && sc.state().growth_tracker == 0);
}

void test_validate(void **) {
    assert_true(LossScaler::validate(dynamic_scaling()).ok());
    const struct {
        void (*bad)(LossScaling *);
        const char *names;
    } cases[] = {
        {[](LossScaling *s) { s->mode = 7; }, "mode 7"},
        {[](LossScaling *s) { s->init_scale = 0; }, "init_scale"},
        {[](LossScaling *s) { s->init_scale = 1.0 / 0.0; }, "init_scale"},
        {[](LossScaling *s) { s->growth_factor = 1.0; }, "growth_factor"},
        {[](LossScaling *s) { s->backoff_factor = 1.0; }, "backoff_factor"},
        {[](LossScaling *s) { s->backoff_factor = 0.0; }, "backoff_factor"},
        {[](LossScaling *s) { s->growth_interval = 0; }, "growth_interval"},
    };
    for (const auto &c : cases) {
        LossScaling s = dynamic_scaling();
        c.bad(&s);
        const sx::Status st = LossScaler::validate(s);
        assert_int_equal(st.code(), SX_ERR_INVALID_ARGUMENT);
        if (!std::strstr(st.message().c_str(), c.names)) fail_msg("'%s' does not name %s", st.message().c_str(), c.names);
    }
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dynamic_follows_grad_scaler),
        cmocka_unit_test(test_static_and_none_stay),
        cmocka_unit_test(test_restore),
        cmocka_unit_test(test_validate),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
