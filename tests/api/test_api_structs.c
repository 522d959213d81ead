/* Versioned structs of the public C API (include/sx/sx.h, docs/conventions.md "The C ABI"
 * rule 4): struct_size out of range is rejected; an older caller's smaller struct gets
 * the defaults for the fields it lacks (whatever bytes follow it in memory); a newer
 * caller's larger struct is accepted only with an all-zero tail; output structs are
 * filled at most struct_size bytes; the sx_*_init functions write at most `size` bytes. */
#include <math.h>
#include <stdlib.h>

#include "api_test_util.h"

#define CANARY 0xCD
#define BUF 8192

/* Suitably aligned scratch for a struct and the bytes after it. */
typedef union {
    unsigned char bytes[BUF];
    long double align_ld;
    uint64_t align_u64;
    void *align_ptr;
} scratch;

static void expect_bytes(const unsigned char *p, size_t from, size_t to, unsigned char value,
                         const char *what) {
    for (size_t i = from; i < to; ++i)
        if (p[i] != value)
            fail_msg("%s: byte %zu is 0x%02x, expected 0x%02x", what, i, p[i], value);
}

/* ---------------------------------------------------------------------------------
 * The init functions
 * ------------------------------------------------------------------------------- */

typedef sx_status_t (*init_fn)(void *p, size_t size);

static sx_status_t init_config(void *p, size_t s) { return sx_group_config_init((sx_group_config_t *)p, s); }
static sx_status_t init_pg_sgd(void *p, size_t s) {
    return sx_param_group_desc_init((sx_param_group_desc_t *)p, s, SX_OPTIM_SGD);
}
static sx_status_t init_pg_adamw(void *p, size_t s) {
    return sx_param_group_desc_init((sx_param_group_desc_t *)p, s, SX_OPTIM_ADAMW);
}
static sx_status_t init_param(void *p, size_t s) { return sx_param_desc_init((sx_param_desc_t *)p, s); }
static sx_status_t init_view(void *p, size_t s) { return sx_view_init((sx_view_t *)p, s); }
static sx_status_t init_options(void *p, size_t s) { return sx_step_options_init((sx_step_options_t *)p, s); }
static sx_status_t init_result(void *p, size_t s) { return sx_step_result_init((sx_step_result_t *)p, s); }
static sx_status_t init_stats(void *p, size_t s) { return sx_memory_stats_init((sx_memory_stats_t *)p, s); }
static sx_status_t init_pinfo(void *p, size_t s) { return sx_param_info_init((sx_param_info_t *)p, s); }
static sx_status_t init_uinfo(void *p, size_t s) { return sx_unit_info_init((sx_unit_info_t *)p, s); }
static sx_status_t init_ctx_config(void *p, size_t s) {
    return sx_context_config_init((sx_context_config_t *)p, s);
}
static sx_status_t init_ctx_stats(void *p, size_t s) { return sx_context_stats_init((sx_context_stats_t *)p, s); }
static sx_status_t init_hf_export(void *p, size_t s) {
    return sx_hf_export_options_init((sx_hf_export_options_t *)p, s);
}
static sx_status_t init_peft(void *p, size_t s) { return sx_peft_config_init((sx_peft_config_t *)p, s); }
static sx_status_t init_hf_import(void *p, size_t s) {
    return sx_hf_import_options_init((sx_hf_import_options_t *)p, s);
}
static sx_status_t init_hf_report(void *p, size_t s) {
    return sx_hf_import_report_init((sx_hf_import_report_t *)p, s);
}

static const struct {
    const char *function;
    init_fn fn;
    size_t size;     /* sizeof in this header */
    size_t min_size; /* the smallest size accepted */
    const char *what;
} kInits[] = {
    {"sx_group_config_init", init_config, sizeof(sx_group_config_t),
     offsetof(sx_group_config_t, rendezvous) + sizeof(char *), "config"},
    {"sx_param_group_desc_init", init_pg_sgd, sizeof(sx_param_group_desc_t), sizeof(size_t), "desc"},
    {"sx_param_group_desc_init", init_pg_adamw, sizeof(sx_param_group_desc_t), sizeof(size_t), "desc"},
    {"sx_param_desc_init", init_param, sizeof(sx_param_desc_t), sizeof(size_t), "desc"},
    {"sx_view_init", init_view, sizeof(sx_view_t), sizeof(size_t), "view"},
    {"sx_step_options_init", init_options, sizeof(sx_step_options_t), sizeof(size_t), "options"},
    {"sx_step_result_init", init_result, sizeof(sx_step_result_t), sizeof(size_t), "result"},
    {"sx_memory_stats_init", init_stats, sizeof(sx_memory_stats_t), sizeof(size_t), "stats"},
    {"sx_param_info_init", init_pinfo, sizeof(sx_param_info_t), sizeof(size_t), "info"},
    {"sx_unit_info_init", init_uinfo, sizeof(sx_unit_info_t), sizeof(size_t), "info"},
    {"sx_context_config_init", init_ctx_config, sizeof(sx_context_config_t),
     offsetof(sx_context_config_t, rendezvous) + sizeof(char *), "config"},
    {"sx_context_stats_init", init_ctx_stats, sizeof(sx_context_stats_t), sizeof(size_t), "stats"},
    {"sx_hf_export_options_init", init_hf_export, sizeof(sx_hf_export_options_t), sizeof(size_t), "options"},
    {"sx_peft_config_init", init_peft, sizeof(sx_peft_config_t), sizeof(size_t), "config"},
    {"sx_hf_import_options_init", init_hf_import, sizeof(sx_hf_import_options_t), sizeof(size_t), "options"},
    {"sx_hf_import_report_init", init_hf_report, sizeof(sx_hf_import_report_t), sizeof(size_t), "report"},
};

static void test_init_functions(void **state) {
    (void)state;
    static scratch buf, full;
    for (size_t k = 0; k < sizeof kInits / sizeof kInits[0]; ++k) {
        const char *fn = kInits[k].function;
        const size_t size = kInits[k].size;
        char needle[64];
        snprintf(needle, sizeof needle, "%s->struct_size", kInits[k].what);

        api_reset_error();
        api_expect(kInits[k].fn(NULL, size), SX_ERR_INVALID_ARGUMENT, kInits[k].what, fn, __FILE__,
                   __LINE__);

        /* Sizes out of range: rejected, nothing written. */
        const size_t bad[] = {0, kInits[k].min_size - 1, 4097, (size_t)1 << 40, (size_t)-1};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
            memset(buf.bytes, CANARY, BUF);
            api_reset_error();
            api_expect(kInits[k].fn(buf.bytes, bad[i]), SX_ERR_INVALID_ARGUMENT, needle, fn, __FILE__,
                       __LINE__);
            expect_bytes(buf.bytes, 0, BUF, CANARY, fn);
        }

        /* Exactly sizeof: struct_size set, nothing after it touched. */
        memset(full.bytes, CANARY, BUF);
        EXPECT_OK(kInits[k].fn(full.bytes, size));
        size_t got;
        memcpy(&got, full.bytes, sizeof got);
        assert_int_equal(got, size);
        expect_bytes(full.bytes, size, BUF, CANARY, fn);

        /* An older caller's smaller struct: the first `small` bytes as for the full
         * struct (its defaults), the rest untouched. Try every size from the minimum. */
        for (size_t small = kInits[k].min_size; small < size; small += 4) {
            memset(buf.bytes, CANARY, BUF);
            EXPECT_OK(kInits[k].fn(buf.bytes, small));
            memcpy(&got, buf.bytes, sizeof got);
            assert_int_equal(got, small);
            assert_memory_equal(buf.bytes + sizeof(size_t), full.bytes + sizeof(size_t),
                                small - sizeof(size_t));
            expect_bytes(buf.bytes, small, BUF, CANARY, fn);
        }

        /* A newer caller's larger struct: our part as for the full struct, its unknown
         * tail zeroed, nothing beyond its size touched; up to the 4096-byte limit. */
        const size_t larger[] = {size + 8, size + 40, 4096};
        for (size_t i = 0; i < 3; ++i) {
            memset(buf.bytes, CANARY, BUF);
            EXPECT_OK(kInits[k].fn(buf.bytes, larger[i]));
            memcpy(&got, buf.bytes, sizeof got);
            assert_int_equal(got, larger[i]);
            assert_memory_equal(buf.bytes + sizeof(size_t), full.bytes + sizeof(size_t),
                                size - sizeof(size_t));
            expect_bytes(buf.bytes, size, larger[i], 0, fn);
            expect_bytes(buf.bytes, larger[i], BUF, CANARY, fn);
        }
    }
}

static void test_init_defaults(void **state) {
    (void)state;
    sx_group_config_t c;
    memset(&c, 0xFF, sizeof c);
    EXPECT_OK(sx_group_config_init(&c, sizeof c));
    assert_null(c.rendezvous);
    assert_null(c.bind_address);
    assert_int_equal(c.rank, 0);
    assert_int_equal(c.world_size, 0);
    assert_int_equal(c.stage, 0);
    assert_int_equal(c.backend, SX_BACKEND_AUTO);
    assert_int_equal(c.alignment, 0);
    assert_int_equal(c.timeout_ms, 0);
    assert_int_equal(c.flags, 0);

    /* torch.optim's defaults per optimizer. */
    sx_param_group_desc_t d;
    memset(&d, 0xFF, sizeof d);
    EXPECT_OK(sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_SGD));
    assert_int_equal(d.optimizer, SX_OPTIM_SGD);
    assert_true(d.lr == 1e-3);
    assert_true(d.momentum == 0.0 && d.dampening == 0.0 && d.weight_decay == 0.0);
    assert_int_equal(d.nesterov, 0);
    assert_int_equal(d.maximize, 0);
    memset(&d, 0xFF, sizeof d);
    EXPECT_OK(sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_ADAM));
    assert_int_equal(d.optimizer, SX_OPTIM_ADAM);
    assert_true(d.lr == 1e-3 && d.beta1 == 0.9 && d.beta2 == 0.999 && d.eps == 1e-8);
    assert_true(d.weight_decay == 0.0);
    assert_int_equal(d.amsgrad, 0);
    const int32_t adamw[] = {SX_OPTIM_ADAMW, 0};
    for (size_t i = 0; i < 2; ++i) {
        memset(&d, 0xFF, sizeof d);
        EXPECT_OK(sx_param_group_desc_init(&d, sizeof d, adamw[i]));
        assert_int_equal(d.optimizer, SX_OPTIM_ADAMW);
        assert_true(d.lr == 1e-3 && d.beta1 == 0.9 && d.beta2 == 0.999 && d.eps == 1e-8);
        assert_true(d.weight_decay == 1e-2);
        assert_int_equal(d.amsgrad, 0);
    }

    sx_param_desc_t p;
    memset(&p, 0xFF, sizeof p);
    EXPECT_OK(sx_param_desc_init(&p, sizeof p));
    assert_null(p.name);
    assert_null(p.shape);
    assert_int_equal(p.ndim, 0);
    assert_int_equal(p.dtype, 0);
    assert_int_equal(p.param_group, 0);
    assert_int_equal(p.unit, 0);
    assert_int_equal(p.frozen, 0);

    sx_step_options_t o;
    memset(&o, 0xFF, sizeof o);
    EXPECT_OK(sx_step_options_init(&o, sizeof o));
    assert_true(o.max_grad_norm == 0.0);
    assert_null(o.stream);
    assert_int_equal(o.keep_grads, 0);
}

/* ---------------------------------------------------------------------------------
 * Input structs
 * ------------------------------------------------------------------------------- */

static void test_group_config_versions(void **state) {
    (void)state;
    char rv[128];
    static scratch buf;
    sx_group_config_t c;
    api_config(&c, rv, sizeof rv, 0, 1);
    sx_shard_group_t *g = (sx_shard_group_t *)&c; /* anything but NULL */

    /* struct_size out of range. */
    const size_t bad[] = {0, 8, offsetof(sx_group_config_t, rendezvous) + sizeof(char *) - 1, 4097,
                          (size_t)-1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        sx_group_config_t b = c;
        b.struct_size = bad[i];
        g = (sx_shard_group_t *)&c;
        EXPECT_STATUS(sx_create_shard_group(&b, &g), SX_ERR_INVALID_ARGUMENT, "config->struct_size");
        assert_null(g);
    }

    /* An older caller's struct that ends before `stage`: whatever follows it in memory
     * (here 0xFF bytes: stage -1, backend -1, alignment -1, ... all invalid) is not
     * read; the missing fields take their defaults (stage 2). */
    memset(buf.bytes, 0xFF, BUF);
    sx_group_config_t *old = (sx_group_config_t *)buf.bytes;
    old->struct_size = offsetof(sx_group_config_t, stage);
    old->rendezvous = rv;
    old->rank = 0;
    old->world_size = 1;
    g = NULL;
    EXPECT_OK(sx_create_shard_group(old, &g));
    assert_non_null(g);
    int32_t v = -1;
    EXPECT_OK(sx_get_stage(g, &v));
    assert_int_equal(v, 2);
    EXPECT_OK(sx_get_world_size(g, &v));
    assert_int_equal(v, 1);
    EXPECT_OK(sx_destroy_shard_group(g));
    /* The caller's struct is not written to. */
    assert_int_equal(old->struct_size, offsetof(sx_group_config_t, stage));
    expect_bytes(buf.bytes, offsetof(sx_group_config_t, stage), BUF, 0xFF, "old config");

    /* An older struct that ends before `alignment`: stage given (1) is used. */
    memset(buf.bytes, 0xFF, BUF);
    old->struct_size = offsetof(sx_group_config_t, alignment);
    old->rendezvous = rv;
    old->rank = 0;
    old->world_size = 1;
    old->stage = 1;
    old->backend = 0;
    old->num_threads = 1;
    api_unique_rendezvous(rv, sizeof rv);
    EXPECT_OK(sx_create_shard_group(old, &g));
    EXPECT_OK(sx_get_stage(g, &v));
    assert_int_equal(v, 1);
    EXPECT_OK(sx_destroy_shard_group(g));

    /* A newer caller's larger struct: accepted with a zero tail... */
    struct {
        sx_group_config_t c;
        unsigned char tail[40];
    } big;
    memset(&big, 0, sizeof big);
    big.c = c;
    big.c.struct_size = sizeof big;
    api_unique_rendezvous(rv, sizeof rv);
    EXPECT_OK(sx_create_shard_group(&big.c, &g));
    assert_non_null(g);
    EXPECT_OK(sx_destroy_shard_group(g));
    /* ...and rejected with any non-zero byte in it, first or last. */
    const size_t where[] = {0, 17, sizeof big.tail - 1};
    for (size_t i = 0; i < 3; ++i) {
        memset(big.tail, 0, sizeof big.tail);
        big.tail[where[i]] = 1;
        api_unique_rendezvous(rv, sizeof rv);
        g = (sx_shard_group_t *)&c;
        EXPECT_STATUS(sx_create_shard_group(&big.c, &g), SX_ERR_INVALID_ARGUMENT, "config");
        assert_non_null(strstr(sx_last_error_message(), "not zero"));
        assert_null(g);
    }
    /* A larger struct_size than the 4096-byte limit, even with zeros behind it. */
    memset(buf.bytes, 0, BUF);
    memcpy(buf.bytes, &c, sizeof c);
    ((sx_group_config_t *)buf.bytes)->struct_size = 4097;
    EXPECT_STATUS(sx_create_shard_group((sx_group_config_t *)buf.bytes, &g), SX_ERR_INVALID_ARGUMENT,
                  "config->struct_size");
    ((sx_group_config_t *)buf.bytes)->struct_size = 4096;
    api_unique_rendezvous(rv, sizeof rv);
    EXPECT_OK(sx_create_shard_group((sx_group_config_t *)buf.bytes, &g));
    EXPECT_OK(sx_destroy_shard_group(g));
}

/* Adds a param group from a truncated desc (struct_size = `size`, 0xFF bytes after it),
 * returning its index. */
static int32_t add_truncated_group(sx_shard_group_t *g, int32_t optimizer, size_t size, double lr) {
    static scratch buf;
    memset(buf.bytes, 0xFF, BUF);
    sx_param_group_desc_t *d = (sx_param_group_desc_t *)buf.bytes;
    d->struct_size = size;
    d->optimizer = optimizer;
    if (size > offsetof(sx_param_group_desc_t, optimizer) + sizeof(int32_t)) {
        d->nesterov = d->maximize = d->amsgrad = 0;
    }
    if (size > offsetof(sx_param_group_desc_t, lr)) d->lr = lr;
    int32_t index = -1;
    EXPECT_OK(sx_add_param_group(g, d, &index));
    expect_bytes(buf.bytes, size, BUF, 0xFF, "truncated desc");
    return index;
}

static double hp(sx_shard_group_t *g, int32_t pg, int32_t key) {
    double v = NAN;
    EXPECT_OK(sx_get_hyperparameter(g, pg, key, &v));
    return v;
}

static void test_param_group_desc_versions(void **state) {
    (void)state;
    sx_shard_group_t *g = api_group();
    const size_t after_optimizer = offsetof(sx_param_group_desc_t, optimizer) + sizeof(int32_t);

    /* Truncated right after `optimizer`: torch's defaults for that optimizer. */
    int32_t pg = add_truncated_group(g, SX_OPTIM_ADAMW, after_optimizer, 0);
    assert_true(hp(g, pg, SX_HP_WEIGHT_DECAY) == 0.01);
    assert_true(hp(g, pg, SX_HP_LR) == 1e-3);
    assert_true(hp(g, pg, SX_HP_BETA1) == 0.9);
    assert_true(hp(g, pg, SX_HP_BETA2) == 0.999);
    assert_true(hp(g, pg, SX_HP_EPS) == 1e-8);
    assert_true(hp(g, pg, SX_HP_AMSGRAD) == 0.0);
    assert_true(hp(g, pg, SX_HP_MAXIMIZE) == 0.0);

    pg = add_truncated_group(g, 0, after_optimizer, 0); /* 0 = AdamW */
    assert_true(hp(g, pg, SX_HP_WEIGHT_DECAY) == 0.01);
    EXPECT_STATUS(sx_set_hyperparameter(g, pg, SX_HP_MOMENTUM, 0.9), SX_ERR_INVALID_ARGUMENT,
                  "momentum"); /* an Adam-family group */

    pg = add_truncated_group(g, SX_OPTIM_ADAM, after_optimizer, 0);
    assert_true(hp(g, pg, SX_HP_WEIGHT_DECAY) == 0.0);
    assert_true(hp(g, pg, SX_HP_BETA2) == 0.999);

    pg = add_truncated_group(g, SX_OPTIM_SGD, after_optimizer, 0);
    assert_true(hp(g, pg, SX_HP_WEIGHT_DECAY) == 0.0);
    assert_true(hp(g, pg, SX_HP_LR) == 1e-3);
    assert_true(hp(g, pg, SX_HP_MOMENTUM) == 0.0);
    assert_true(hp(g, pg, SX_HP_DAMPENING) == 0.0);
    assert_true(hp(g, pg, SX_HP_NESTEROV) == 0.0);
    EXPECT_STATUS(sx_set_hyperparameter(g, pg, SX_HP_BETA1, 0.5), SX_ERR_INVALID_ARGUMENT, "beta1");

    /* Truncated after `lr`: lr is the caller's, the rest defaults. */
    const size_t after_lr = offsetof(sx_param_group_desc_t, weight_decay);
    pg = add_truncated_group(g, SX_OPTIM_ADAMW, after_lr, 0.25);
    assert_true(hp(g, pg, SX_HP_LR) == 0.25);
    assert_true(hp(g, pg, SX_HP_WEIGHT_DECAY) == 0.01);
    assert_true(hp(g, pg, SX_HP_EPS) == 1e-8);
    assert_int_equal(api_num_param_groups(g), 5);

    /* Out of range: too small to hold `optimizer`, zero, or over the limit. */
    static scratch buf;
    const size_t bad[] = {0, 8, after_optimizer - 1, 4097, (size_t)-1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        memset(buf.bytes, 0, BUF);
        sx_param_group_desc_t *d = (sx_param_group_desc_t *)buf.bytes;
        EXPECT_OK(sx_param_group_desc_init(d, sizeof *d, SX_OPTIM_SGD));
        d->struct_size = bad[i];
        EXPECT_STATUS(sx_add_param_group(g, d, NULL), SX_ERR_INVALID_ARGUMENT, "desc->struct_size");
    }

    /* Larger: zero tail accepted, a non-zero byte rejected. */
    memset(buf.bytes, 0, BUF);
    sx_param_group_desc_t *d = (sx_param_group_desc_t *)buf.bytes;
    EXPECT_OK(sx_param_group_desc_init(d, sizeof *d + 64, SX_OPTIM_ADAM));
    d->lr = 0.5;
    EXPECT_OK(sx_add_param_group(g, d, &pg));
    assert_true(hp(g, pg, SX_HP_LR) == 0.5);
    const size_t where[] = {0, 33, 63};
    for (size_t i = 0; i < 3; ++i) {
        memset(buf.bytes + sizeof *d, 0, 64);
        buf.bytes[sizeof *d + where[i]] = 0x80;
        EXPECT_STATUS(sx_add_param_group(g, d, &pg), SX_ERR_INVALID_ARGUMENT, "desc");
        assert_non_null(strstr(sx_last_error_message(), "not zero"));
    }
    assert_int_equal(api_num_param_groups(g), 6);
    EXPECT_OK(sx_destroy_shard_group(g));
}

static void test_param_desc_versions(void **state) {
    (void)state;
    sx_shard_group_t *g = api_group();
    api_add_group(g, SX_OPTIM_SGD);
    static scratch buf;
    const int64_t shape[2] = {3, 4};
    sx_param_desc_t *d = (sx_param_desc_t *)buf.bytes;

    /* Older: ends before `frozen`; the 0xFF bytes after it (frozen = -1, invalid) are
     * not read: the param is trainable. */
    memset(buf.bytes, 0xFF, BUF);
    d->struct_size = offsetof(sx_param_desc_t, frozen);
    d->name = "old";
    d->ndim = 2;
    d->dtype = 0;
    d->shape = shape;
    d->param_group = 0;
    d->unit = 0;
    int32_t index = -1;
    EXPECT_OK(sx_add_param(g, d, &index));
    assert_int_equal(index, 0);
    int32_t t = -1;
    EXPECT_OK(sx_get_trainable(g, 0, &t));
    assert_int_equal(t, 1);
    expect_bytes(buf.bytes, offsetof(sx_param_desc_t, frozen), BUF, 0xFF, "old param desc");

    /* Out of range: too small to hold `unit` (the last field an older caller had), zero,
     * over the limit. */
    const size_t bad[] = {0, 8, offsetof(sx_param_desc_t, unit), 4097, (size_t)-1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        memset(buf.bytes, 0, BUF);
        EXPECT_OK(sx_param_desc_init(d, sizeof *d));
        d->name = "bad";
        d->ndim = 2;
        d->shape = shape;
        d->struct_size = bad[i];
        EXPECT_STATUS(sx_add_param(g, d, NULL), SX_ERR_INVALID_ARGUMENT, "desc->struct_size");
    }

    /* Larger: zero tail accepted (frozen given as 1 is used), non-zero rejected. */
    memset(buf.bytes, 0, BUF);
    EXPECT_OK(sx_param_desc_init(d, sizeof *d + 16));
    d->name = "new";
    d->ndim = 2;
    d->shape = shape;
    d->frozen = 1;
    EXPECT_OK(sx_add_param(g, d, &index));
    assert_int_equal(index, 1);
    EXPECT_OK(sx_get_trainable(g, 1, &t));
    assert_int_equal(t, 0);
    d->name = "newer";
    buf.bytes[sizeof *d + 15] = 1;
    EXPECT_STATUS(sx_add_param(g, d, NULL), SX_ERR_INVALID_ARGUMENT, "desc");
    assert_non_null(strstr(sx_last_error_message(), "not zero"));
    assert_int_equal(api_num_params(g), 2);
    EXPECT_OK(sx_destroy_shard_group(g));
}

/* ---------------------------------------------------------------------------------
 * Step options (input) and every output struct
 * ------------------------------------------------------------------------------- */

static void test_step_options_versions(void **state) {
    (void)state;
    sx_shard_group_t *g = api_small_group(1);
    static scratch buf;
    sx_step_options_t *o = (sx_step_options_t *)buf.bytes;
    sx_step_result_t r;
    EXPECT_OK(sx_step_result_init(&r, sizeof r));

    /* Older: only max_grad_norm; the 0xFF bytes after it (stream non-NULL, keep_grads
     * -1: both would be rejected) are not read. */
    memset(buf.bytes, 0xFF, BUF);
    o->struct_size = offsetof(sx_step_options_t, stream);
    o->max_grad_norm = 1.0;
    EXPECT_OK(sx_step(g, o, &r));
    assert_int_equal(r.step, 1);
    /* Only struct_size. */
    o->struct_size = sizeof(size_t);
    EXPECT_OK(sx_step(g, o, &r));
    assert_int_equal(r.step, 2);

    const size_t bad[] = {0, 4, 4097, (size_t)-1};
    for (size_t i = 0; i < 4; ++i) {
        memset(buf.bytes, 0, BUF);
        o->struct_size = bad[i];
        EXPECT_STATUS(sx_step(g, o, &r), SX_ERR_INVALID_ARGUMENT, "options->struct_size");
    }
    memset(buf.bytes, 0, BUF);
    EXPECT_OK(sx_step_options_init(o, sizeof *o + 8));
    EXPECT_OK(sx_step(g, o, &r));
    assert_int_equal(r.step, 3);
    buf.bytes[sizeof *o + 3] = 9;
    EXPECT_STATUS(sx_step(g, o, &r), SX_ERR_INVALID_ARGUMENT, "options");
    assert_non_null(strstr(sx_last_error_message(), "not zero"));
    EXPECT_OK(sx_step(g, NULL, &r));
    assert_int_equal(r.step, 4);
    EXPECT_OK(sx_destroy_shard_group(g));
}

/* Calls `fill` into an output struct of struct_size `size` placed in a canary buffer;
 * checks the bytes [size, BUF) are untouched and struct_size is still `size`. */
typedef sx_status_t (*fill_fn)(sx_shard_group_t *g, void *out);

static sx_status_t fill_param_view(sx_shard_group_t *g, void *o) { return sx_param_view(g, 1, (sx_view_t *)o); }
static sx_status_t fill_grad_view(sx_shard_group_t *g, void *o) { return sx_grad_view(g, 0, (sx_view_t *)o); }
static sx_status_t fill_stats(sx_shard_group_t *g, void *o) {
    return sx_get_memory_stats(g, (sx_memory_stats_t *)o);
}
static sx_status_t fill_pinfo(sx_shard_group_t *g, void *o) {
    return sx_get_param_info(g, 0, (sx_param_info_t *)o);
}
static sx_status_t fill_uinfo(sx_shard_group_t *g, void *o) {
    return sx_get_unit_info(g, 1, (sx_unit_info_t *)o);
}
static sx_status_t fill_result(sx_shard_group_t *g, void *o) {
    return sx_step(g, NULL, (sx_step_result_t *)o);
}
/* The context the first group was made in (test_output_structs makes it). */
static sx_context_t *output_context;
static sx_status_t fill_ctx_stats(sx_shard_group_t *g, void *o) {
    (void)g;
    return sx_get_context_stats(output_context, (sx_context_stats_t *)o);
}

static const struct {
    const char *function;
    fill_fn fn;
    size_t size;
    size_t first_field_end; /* the first field after struct_size ends here */
} kOutputs[] = {
    {"sx_param_view", fill_param_view, sizeof(sx_view_t), offsetof(sx_view_t, numel)},
    {"sx_grad_view", fill_grad_view, sizeof(sx_view_t), offsetof(sx_view_t, numel)},
    {"sx_get_memory_stats", fill_stats, sizeof(sx_memory_stats_t), offsetof(sx_memory_stats_t, grad_bytes)},
    {"sx_get_param_info", fill_pinfo, sizeof(sx_param_info_t), offsetof(sx_param_info_t, ndim)},
    {"sx_get_unit_info", fill_uinfo, sizeof(sx_unit_info_t), offsetof(sx_unit_info_t, num_params)},
    {"sx_step", fill_result, sizeof(sx_step_result_t), offsetof(sx_step_result_t, step)},
    {"sx_get_context_stats", fill_ctx_stats, sizeof(sx_context_stats_t), offsetof(sx_context_stats_t, groups_created)},
};

static void test_output_structs(void **state) {
    (void)state;
    sx_shard_group_t *g = api_small_group(1);
    /* A context of one rank with one group in it, for sx_get_context_stats. */
    char rv[128];
    api_unique_rendezvous(rv, sizeof rv);
    sx_context_config_t cc;
    EXPECT_OK(sx_context_config_init(&cc, sizeof cc));
    cc.rendezvous = rv;
    cc.rank = 0;
    cc.world_size = 1;
    EXPECT_OK(sx_create_context(&cc, &output_context));
    sx_group_config_t gc;
    EXPECT_OK(sx_group_config_init(&gc, sizeof gc));
    gc.context = output_context;
    gc.name = "tenant";
    sx_shard_group_t *tenant = NULL;
    EXPECT_OK(sx_create_shard_group(&gc, &tenant));
    static scratch buf, full;
    for (size_t k = 0; k < sizeof kOutputs / sizeof kOutputs[0]; ++k) {
        const char *fn = kOutputs[k].function;
        const size_t size = kOutputs[k].size;

        /* The full struct, for reference; nothing after it touched. */
        memset(full.bytes, CANARY, BUF);
        memcpy(full.bytes, &size, sizeof size);
        EXPECT_OK(kOutputs[k].fn(g, full.bytes));
        expect_bytes(full.bytes, size, BUF, CANARY, fn);
        size_t got;
        memcpy(&got, full.bytes, sizeof got);
        assert_int_equal(got, size);
        /* The first field was written (not left as canary bytes). */
        int written = 0;
        for (size_t i = sizeof(size_t); i < kOutputs[k].first_field_end; ++i)
            written |= full.bytes[i] != CANARY;
        if (!written) fail_msg("%s did not fill its first field", fn);

        /* struct_size out of range: rejected, nothing written. */
        const size_t bad[] = {0, 7, 4097, (size_t)-1};
        const char *needle = "->struct_size";
        for (size_t i = 0; i < 4; ++i) {
            memset(buf.bytes, CANARY, BUF);
            memcpy(buf.bytes, &bad[i], sizeof bad[i]);
            api_reset_error();
            api_expect(kOutputs[k].fn(g, buf.bytes), SX_ERR_INVALID_ARGUMENT, needle, fn, __FILE__,
                       __LINE__);
            expect_bytes(buf.bytes, sizeof(size_t), BUF, CANARY, fn);
        }

        /* An older caller's struct: truncated after its first field. The first field
         * is the full struct's; the canary after it is untouched. */
        const size_t small = kOutputs[k].first_field_end;
        memset(buf.bytes, CANARY, BUF);
        memcpy(buf.bytes, &small, sizeof small);
        EXPECT_OK(kOutputs[k].fn(g, buf.bytes));
        memcpy(&got, buf.bytes, sizeof got);
        assert_int_equal(got, small);
        expect_bytes(buf.bytes, small, BUF, CANARY, fn);
        if (kOutputs[k].fn != fill_result) /* the step's grad_norm may differ per step */
            assert_memory_equal(buf.bytes + sizeof(size_t), full.bytes + sizeof(size_t),
                                small - sizeof(size_t));
        /* Only struct_size: nothing else written. */
        const size_t tiny = sizeof(size_t);
        memset(buf.bytes, CANARY, BUF);
        memcpy(buf.bytes, &tiny, sizeof tiny);
        EXPECT_OK(kOutputs[k].fn(g, buf.bytes));
        expect_bytes(buf.bytes, tiny, BUF, CANARY, fn);

        /* A newer caller's larger struct: ours filled, its tail zeroed, nothing beyond. */
        const size_t large = size + 24;
        memset(buf.bytes, CANARY, BUF);
        memcpy(buf.bytes, &large, sizeof large);
        EXPECT_OK(kOutputs[k].fn(g, buf.bytes));
        memcpy(&got, buf.bytes, sizeof got);
        assert_int_equal(got, large);
        if (kOutputs[k].fn != fill_result)
            assert_memory_equal(buf.bytes + sizeof(size_t), full.bytes + sizeof(size_t),
                                size - sizeof(size_t));
        expect_bytes(buf.bytes, size, large, 0, fn);
        expect_bytes(buf.bytes, large, BUF, CANARY, fn);
    }

    /* The step's result in detail: a result truncated before `step` did not receive
     * it, but the steps were counted: 1 (full) + 1 (truncated) + 1 (tiny) + 1 (large). */
    sx_step_result_t r;
    EXPECT_OK(sx_step_result_init(&r, sizeof r));
    EXPECT_OK(sx_step(g, NULL, &r));
    assert_int_equal(r.step, 5);
    EXPECT_OK(sx_destroy_shard_group(g));
    /* The context's stats are its own: one group alive in it. */
    sx_context_stats_t cs;
    EXPECT_OK(sx_context_stats_init(&cs, sizeof cs));
    EXPECT_OK(sx_get_context_stats(output_context, &cs));
    assert_int_equal(cs.groups, 1);
    assert_int_equal(cs.groups_created, 1);
    EXPECT_OK(sx_destroy_shard_group(tenant));
    EXPECT_OK(sx_destroy_context(output_context));
    output_context = NULL;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_functions),
        cmocka_unit_test(test_init_defaults),
        cmocka_unit_test(test_group_config_versions),
        cmocka_unit_test(test_param_group_desc_versions),
        cmocka_unit_test(test_param_desc_versions),
        cmocka_unit_test(test_step_options_versions),
        cmocka_unit_test(test_output_structs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
