// Every hyperparameter of optim/optimizer.h's table (SX_HYPERPARAMETERS) reaches every
// place that derives from it: the param group descriptor (sx_add_param_group, and its
// defaults), the public keys (sx_set/get_hyperparameter), the ranks' agreement
// (sx_step refuses ranks that differ in it) and the MANIFEST (written by a save, encoded,
// decoded, validated, and put back by a load). Each hyperparameter
// gets a value of its own, different from its default, and must come back where it
// went in; a place that leaves one out fails here.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "ckpt/manifest.h"
#include "core/params.h"
#include "optim/optimizer.h"
#include "sx/sx.h"
// Last: CMocka defines a fail() macro.
#include "sx_cmocka.h"
#include "manifest_testing.h"
#include "test_files.h"
#include "test_groups.h"

namespace {

struct Field {
    const char *name;
    int32_t key;
    bool flag;
    double value;  // valid for its optimizer (see optimizer_for), not the default
    double dflt;
};

// A value of each hyperparameter that no default and no other field has.
double distinct_value(const char *name, bool flag) {
    if (flag) return 1.0;
    const char *names[] = {"lr",       "weight_decay", "beta1",     "beta2", "eps", "momentum", "dampening",
                           "lr_decay", "initial_accumulator_value", "alpha", "momentum_decay", "ns_a", "ns_b",
                           "ns_c", "ns_steps", "adjust_lr", "beta2_decay", "eps2", "d", "state_dtype"};
    const double values[] = {0.0123, 0.0456, 0.789, 0.9876, 3.5e-7, 0.65, 0.25, 0.0625, 0.3125, 0.875, 0.0055,
                             3.25,   -4.5,   2.125, 3.0,    1.0,    -0.625, 0.0078125, 1.25, SX_STATE_8BIT};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i)
        if (std::strcmp(names[i], name) == 0) return values[i];
    return 0.375;  // a new double hyperparameter: give it its own value above
}

std::vector<Field> table() {
    std::vector<Field> fields;
#define SX_FIELD(name, type, dflt, hp_key, rule)                                                         \
    fields.push_back({#name, hp_key, std::is_same<type, bool>::value,                                    \
                      distinct_value(#name, std::is_same<type, bool>::value), static_cast<double>(dflt)});
    SX_HYPERPARAMETERS(SX_FIELD)
#undef SX_FIELD
    return fields;
}

// The first optimizer of the table (AdamW before the others, as the most used) that
// f applies to.
int32_t optimizer_for(const Field &f) {
    if (sx::optim::applies_to(f.key, sx::optim::Kind::kAdamW)) return SX_OPTIM_ADAMW;
    size_t count = 0;
    const sx::optim::OptimizerSpec *rows = sx::optim::all_optimizers(&count);
    for (size_t k = 0; k < count; ++k)
        if (sx::optim::applies_to(f.key, rows[k].kind)) return static_cast<int32_t>(rows[k].kind);
    return 0;
}

// The descriptor of f's optimizer with f set to its value (SGD gets momentum, which
// nesterov needs).
sx_param_group_desc_t desc_with(const Field &f, bool set) {
    sx_param_group_desc_t d;
    assert_int_equal(sx_param_group_desc_init(&d, sizeof d, optimizer_for(f)), SX_OK);
    if (optimizer_for(f) == SX_OPTIM_SGD && std::strcmp(f.name, "momentum") != 0) d.momentum = 0.5;
    if (!set) return d;
#define SX_SET_DESC(NAME, TYPE, DFLT, KEY, RULE) \
    if (std::strcmp(#NAME, f.name) == 0) d.NAME = static_cast<decltype(d.NAME)>(f.value);
    SX_HYPERPARAMETERS(SX_SET_DESC)
#undef SX_SET_DESC
    return d;
}

double get(sx_shard_group_t *g, const Field &f) {
    double v = NAN;
    assert_int_equal(sx_get_hyperparameter(g, 0, f.key, &v), SX_OK);
    return v;
}

void fail_with(const Field &f, const char *where) {
    print_error("hyperparameter %s is missing from %s\n", f.name, where);
    fail();
}

// The param "w" of f's groups: bf16 where f is bf16_stochastic_round (which takes bf16
// params only).
std::vector<sxtest::ParamDef> w_of(const Field &f) {
    return {{"w", {2, 2}, false, f.key == SX_HP_BF16_STOCHASTIC_ROUND ? SX_DTYPE_BF16 : 0}};
}

std::string tag_of(const Field &f, const char *what) { return std::string("hyper-") + what + "-" + f.name; }

// The descriptor's defaults, and what sx_add_param_group makes of a descriptor.
void test_descriptor(void **) {
    for (const Field &f : table()) {
        // sx_param_group_desc_init states torch's default of every hyperparameter.
        {
            sx_param_group_desc_t d = desc_with(f, false);
            sx_shard_group_t *g = sxtest::one_rank_group(tag_of(f, "default"), w_of(f), &d);
            // The optimizer's row may set its own default (AdamW's weight decay is 1e-2).
            double expected = NAN;
            assert_int_equal(sx::core::get_hyperparameter(
                                 sx::optim::default_hyper(static_cast<sx::optim::Kind>(optimizer_for(f))), f.key,
                                 &expected)
                                 .code(),
                             SX_OK);
            assert_true(f.dflt == expected || optimizer_for(f) != SX_OPTIM_ADAMW || f.key == SX_HP_WEIGHT_DECAY);
            if (get(g, f) != expected) fail_with(f, "sx_param_group_desc_init's defaults");
            sx_destroy_shard_group(g);
        }
        sx_param_group_desc_t d = desc_with(f, true);
        sx_shard_group_t *g = sxtest::one_rank_group(tag_of(f, "desc"), w_of(f), &d);
        if (get(g, f) != f.value) fail_with(f, "the descriptor's reading (sx_add_param_group)");
        sx_destroy_shard_group(g);
    }
}

// sx_set_hyperparameter and sx_get_hyperparameter by key.
void test_keys(void **) {
    for (const Field &f : table()) {
        assert_non_null(sx::core::hyperparameter_name(f.key));
        assert_string_equal(sx::core::hyperparameter_name(f.key), f.name);
        sx_param_group_desc_t d = desc_with(f, false);
        sx_shard_group_t *g = sxtest::one_rank_group(tag_of(f, "key"), w_of(f), &d);
        // The layout follows them (8-bit blocks; masters or none): fixed once laid out.
        if (f.key == SX_HP_STATE_DTYPE || f.key == SX_HP_BF16_STOCHASTIC_ROUND) {
            assert_int_equal(sx_set_hyperparameter(g, 0, f.key, f.value), SX_ERR_INVALID_STATE);
            assert_true(get(g, f) == f.dflt);
            sx_destroy_shard_group(g);
            continue;
        }
        assert_int_equal(sx_set_hyperparameter(g, 0, f.key, f.value), SX_OK);
        if (get(g, f) != f.value) fail_with(f, "sx_set_hyperparameter / sx_get_hyperparameter");
        sx_destroy_shard_group(g);
    }
}

// Two ranks that differ in one hyperparameter alone are refused by the step.
void test_agreement(void **) {
    for (const Field &f : table()) {
        const std::string rv = "local://" + tag_of(f, "agree") + "-" + std::to_string(getpid());
        const std::string err = sxtest::run_ranks(2, [&](int rank) -> std::string {
            sx_group_config_t cfg;
            sx_group_config_init(&cfg, sizeof cfg);
            cfg.backend = SX_BACKEND_CPU;
            cfg.rendezvous = rv.c_str();
            cfg.rank = rank;
            cfg.world_size = 2;
            cfg.num_threads = 1;
            cfg.timeout_ms = 20000;
            sx_shard_group_t *g = nullptr;
            if (sx_create_shard_group(&cfg, &g) != SX_OK) return "create failed";
            sx_param_group_desc_t d = desc_with(f, rank == 1);
            sx_param_desc_t p;
            sx_param_desc_init(&p, sizeof p);
            const int64_t shape[2] = {2, 4};  // 2-D: every optimizer takes it (Muon only such)
            p.name = "w";
            p.ndim = 2;
            p.shape = shape;
            if (f.key == SX_HP_BF16_STOCHASTIC_ROUND) p.dtype = SX_DTYPE_BF16;
            std::string out;
            if (sx_add_param_group(g, &d, nullptr) != SX_OK || sx_add_param(g, &p, nullptr) != SX_OK ||
                sx_finalize(g) != SX_OK)
                out = "registration failed";
            else if (sx_step(g, nullptr, nullptr) != SX_ERR_MISMATCH)
                out = std::string("the ranks' agreement accepted ranks that differ in ") + f.name;
            sx_destroy_shard_group(g);
            return out;
        });
        if (!err.empty()) {
            print_error("%s\n", err.c_str());
            fail();
        }
    }
}

// A save writes it into the MANIFEST and a load puts it back.
void test_save_and_load(void **) {
    const std::string dir = sxtest::make_tmpdir("hyper-table");
    for (const Field &f : table()) {
        const std::string path = dir + "/" + f.name;
        sx_param_group_desc_t d = desc_with(f, true);
        sx_shard_group_t *saved = sxtest::one_rank_group(tag_of(f, "save"), w_of(f), &d);
        // Every built-in optimizer's group has its place in the format (a row of the table
        // without one would have its saves refused).
        if (!sx::ckpt::check_storable(sx::core::hyper_from_desc(d)).ok())
            fail_with(f, "the format (no Optimizer or TensorKind for its optimizer)");
        sxtest::save_sync(saved, path);
        sx_destroy_shard_group(saved);
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = path.c_str();
        sx_param_group_desc_t plain = desc_with(f, false);
        if (f.key == SX_HP_STATE_DTYPE) {
            // A group must keep its state as the checkpoint did (it is fixed at sx_finalize):
            // another state dtype is refused, and the same one loads.
            sx_shard_group_t *other = sxtest::one_rank_group(tag_of(f, "other"), w_of(f), &plain);
            assert_int_equal(sx_load_optim_state(other, &lo), SX_ERR_MISMATCH);
            assert_non_null(std::strstr(sx_last_error_message(), "fp32 optimizer state here but 8-bit"));
            sx_destroy_shard_group(other);
            plain = d;
        }
        // A group keeps its own way of holding values (its units were laid out for it): a
        // load leaves bf16_stochastic_round as it is, so it is loaded into one that has it.
        if (f.key == SX_HP_BF16_STOCHASTIC_ROUND) plain = d;
        sx_shard_group_t *loaded = sxtest::one_rank_group(tag_of(f, "load"), w_of(f), &plain);
        assert_true(f.key == SX_HP_STATE_DTYPE || f.key == SX_HP_BF16_STOCHASTIC_ROUND || get(loaded, f) != f.value);
        assert_int_equal(sx_load_optim_state(loaded, &lo), SX_OK);
        if (get(loaded, f) != f.value) fail_with(f, "the MANIFEST (save, encoding, decoding or load)");
        sx_destroy_shard_group(loaded);
    }
    sxtest::remove_tree(dir);
}

// The MANIFEST's encoding and decoding on their own, and its validation: a value that
// sx_add_param_group refuses is refused in a manifest too.
void test_manifest_fields(void **) {
    using namespace sx::ckpt;
    for (const Field &f : table()) {
        Manifest m = testing::small_manifest();
        sx_param_group_desc_t d = desc_with(f, true);
        m.param_groups[0] = param_group_entry(sx::core::hyper_from_desc(d));
        std::string bytes;
        assert_int_equal(encode_manifest(m, &bytes).code(), SX_OK);
        Manifest back;
        assert_int_equal(decode_manifest(bytes.data(), bytes.size(), &back).code(), SX_OK);
        const sx::optim::Hyper h = hyper_of(back.param_groups[0]);
        double got = NAN;
        assert_int_equal(sx::core::get_hyperparameter(h, f.key, &got).code(), SX_OK);
        if (got != f.value) fail_with(f, "the MANIFEST's encoding or decoding");
        if (f.flag) continue;
        // A non-finite value is refused, naming the param group.
#define SX_POISON(NAME, TYPE, DFLT, KEY, RULE) \
    if (std::strcmp(#NAME, f.name) == 0) m.param_groups[0].NAME = static_cast<TYPE>(NAN);
        SX_HYPERPARAMETERS(SX_POISON)
#undef SX_POISON
        const sx::Status s = validate(m);
        if (s.code() != SX_ERR_CORRUPT) fail_with(f, "the MANIFEST's validation");
    }
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descriptor),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_agreement),
        cmocka_unit_test(test_save_and_load),
        cmocka_unit_test(test_manifest_fields),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
