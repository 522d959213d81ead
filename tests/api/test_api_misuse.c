/* Misuse of the public C API (include/sx/sx.h): NULL pointers, garbage and destroyed
 * handles, out-of-range indices and enum values, calls in the wrong order, bad names
 * and shapes. Every rejected call must return its documented status, leave a message
 * that names the entry point and the offending argument, and change nothing. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "api_test_util.h"

/* ---------------------------------------------------------------------------------
 * Versions, status strings, the thread-local error, logging
 * ------------------------------------------------------------------------------- */

static void test_version(void **state) {
    (void)state;
    assert_int_equal(sx_version(), SX_VERSION_NUMBER);
    assert_int_equal(sx_version() / 10000, SX_VERSION_MAJOR);
    assert_int_equal(sx_version() / 100 % 100, SX_VERSION_MINOR);
    assert_int_equal(sx_version() % 100, SX_VERSION_PATCH);
}

static void test_status_strings(void **state) {
    (void)state;
    static const struct {
        sx_status_t code;
        const char *name;
    } codes[] = {
        {SX_OK, "SX_OK"},
        {SX_ERR_INVALID_ARGUMENT, "SX_ERR_INVALID_ARGUMENT"},
        {SX_ERR_INVALID_HANDLE, "SX_ERR_INVALID_HANDLE"},
        {SX_ERR_INVALID_STATE, "SX_ERR_INVALID_STATE"},
        {SX_ERR_OUT_OF_MEMORY, "SX_ERR_OUT_OF_MEMORY"},
        {SX_ERR_NOT_FOUND, "SX_ERR_NOT_FOUND"},
        {SX_ERR_ALREADY_EXISTS, "SX_ERR_ALREADY_EXISTS"},
        {SX_ERR_UNSUPPORTED, "SX_ERR_UNSUPPORTED"},
        {SX_ERR_TIMEOUT, "SX_ERR_TIMEOUT"},
        {SX_ERR_COMM, "SX_ERR_COMM"},
        {SX_ERR_GROUP_FAILED, "SX_ERR_GROUP_FAILED"},
        {SX_ERR_IO, "SX_ERR_IO"},
        {SX_ERR_CORRUPT, "SX_ERR_CORRUPT"},
        {SX_ERR_VERSION, "SX_ERR_VERSION"},
        {SX_ERR_ABORTED, "SX_ERR_ABORTED"},
        {SX_ERR_MISMATCH, "SX_ERR_MISMATCH"},
        {SX_ERR_INTERNAL, "SX_ERR_INTERNAL"},
        {SX_ERR_CANCELLED, "SX_ERR_CANCELLED"},
    };
    const size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; ++i) {
        const char *s = sx_status_string(codes[i].code);
        assert_non_null(s);
        /* "SX_ERR_X: words": begins with its own name followed by ':' (so that
         * SX_ERR_INVALID_STATE is not taken for SX_ERR_INVALID_...). */
        size_t len = strlen(codes[i].name);
        if (strncmp(s, codes[i].name, len) != 0 || s[len] != ':')
            fail_msg("sx_status_string(%d) = \"%s\" does not begin with \"%s:\"", (int)codes[i].code,
                     s, codes[i].name);
        assert_true(strlen(s) > len + 2); /* and says something after the name */
        for (size_t j = 0; j < i; ++j) assert_string_not_equal(s, sx_status_string(codes[j].code));
    }
    /* Unknown codes: never NULL, never one of the known texts. */
    const sx_status_t unknown[] = {18, 100, -1, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; ++i) {
        const char *s = sx_status_string(unknown[i]);
        assert_non_null(s);
        assert_true(strlen(s) > 0);
        for (size_t j = 0; j < n; ++j) assert_string_not_equal(s, sx_status_string(codes[j].code));
    }
}

typedef struct {
    char before[256];
    char after_fail[256];
} thread_error_result;

static void *thread_error_main(void *arg) {
    thread_error_result *r = (thread_error_result *)arg;
    snprintf(r->before, sizeof r->before, "%s", sx_last_error_message());
    sx_param_desc_init(NULL, sizeof(sx_param_desc_t));
    snprintf(r->after_fail, sizeof r->after_fail, "%s", sx_last_error_message());
    return NULL;
}

static void test_last_error_is_thread_local(void **state) {
    (void)state;
    /* A failure on this thread... */
    EXPECT_STATUS(sx_view_init(NULL, sizeof(sx_view_t)), SX_ERR_INVALID_ARGUMENT, "view");
    char mine[256];
    snprintf(mine, sizeof mine, "%s", sx_last_error_message());
    /* ...is not seen by a new thread, which starts with "", and the new thread's own
     * failure does not replace ours. */
    thread_error_result r;
    memset(&r, 0, sizeof r);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, thread_error_main, &r), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_string_equal(r.before, "");
    assert_non_null(strstr(r.after_fail, "sx_param_desc_init"));
    assert_string_equal(sx_last_error_message(), mine);
    /* A successful call leaves the last failure's message in place ("the message of
     * the last failed call"), and the pointer is never NULL. */
    sx_view_t v;
    EXPECT_OK(sx_view_init(&v, sizeof v));
    assert_non_null(sx_last_error_message());
}

typedef struct {
    int calls;
    int max_level_seen;
    int bad_level;
    int saw_failed_call;
    void *user_seen;
} log_capture;

static void capture_log(int32_t level, const char *message, void *user) {
    log_capture *c = (log_capture *)user;
    c->calls++;
    c->user_seen = user;
    if (level > c->max_level_seen) c->max_level_seen = level;
    if (level < SX_LOG_ERROR || level > SX_LOG_DEBUG) c->bad_level = 1;
    if (message != NULL && strstr(message, "sx_view_init") && strstr(message, "view is NULL"))
        c->saw_failed_call = 1;
}

static int reset_log_callback(void **state) {
    (void)state;
    return sx_set_log_callback(NULL, NULL, SX_LOG_ERROR) == SX_OK ? 0 : -1;
}

static void test_log_callback(void **state) {
    (void)state;
    log_capture cap;
    memset(&cap, 0, sizeof cap);
    /* Bad levels are rejected, and do not install the callback. */
    const int32_t bad[] = {0, -1, 5, 1000, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        sx_status_t s = sx_set_log_callback(capture_log, &cap, bad[i]);
        api_expect(s, SX_ERR_INVALID_ARGUMENT, "max_level", "sx_set_log_callback(bad level)",
                   __FILE__, __LINE__);
    }
    sx_view_init(NULL, 0); /* a failed call: nobody must hear of it */
    assert_int_equal(cap.calls, 0);

    /* At SX_LOG_DEBUG a failed call is logged, with its message. */
    EXPECT_OK(sx_set_log_callback(capture_log, &cap, SX_LOG_DEBUG));
    assert_int_equal(sx_view_init(NULL, sizeof(sx_view_t)), SX_ERR_INVALID_ARGUMENT);
    assert_true(cap.calls > 0);
    assert_true(cap.saw_failed_call);
    assert_ptr_equal(cap.user_seen, &cap);
    assert_int_equal(cap.bad_level, 0);

    /* At SX_LOG_ERROR nothing more verbose than an error is passed on (a group's
     * creation logs at INFO, a failed call at DEBUG). */
    EXPECT_OK(sx_set_log_callback(capture_log, &cap, SX_LOG_ERROR));
    memset(&cap, 0, sizeof cap);
    assert_int_equal(sx_view_init(NULL, sizeof(sx_view_t)), SX_ERR_INVALID_ARGUMENT);
    sx_shard_group_t *g = api_group();
    EXPECT_OK(sx_destroy_shard_group(g));
    assert_true(cap.max_level_seen <= SX_LOG_ERROR);
    assert_int_equal(cap.saw_failed_call, 0);

    /* NULL turns logging off. */
    EXPECT_OK(sx_set_log_callback(NULL, NULL, SX_LOG_DEBUG));
    memset(&cap, 0, sizeof cap);
    assert_int_equal(sx_view_init(NULL, sizeof(sx_view_t)), SX_ERR_INVALID_ARGUMENT);
    assert_int_equal(cap.calls, 0);
}

/* ---------------------------------------------------------------------------------
 * Handles: NULL, garbage, destroyed
 * ------------------------------------------------------------------------------- */

/* Calls every entry point that takes a group with `h` and otherwise valid arguments;
 * each must return `want` with a message mentioning `needle`. */
static void expect_handle_rejected(sx_shard_group_t *h, sx_status_t want, const char *needle) {
    sx_param_group_desc_t pgd;
    EXPECT_OK(sx_param_group_desc_init(&pgd, sizeof pgd, SX_OPTIM_ADAMW));
    sx_param_desc_t pd;
    EXPECT_OK(sx_param_desc_init(&pd, sizeof pd));
    const int64_t shape[1] = {4};
    pd.name = "p";
    pd.ndim = 1;
    pd.shape = shape;
    sx_view_t v;
    EXPECT_OK(sx_view_init(&v, sizeof v));
    sx_step_options_t o;
    EXPECT_OK(sx_step_options_init(&o, sizeof o));
    sx_step_result_t r;
    EXPECT_OK(sx_step_result_init(&r, sizeof r));
    sx_memory_stats_t m;
    EXPECT_OK(sx_memory_stats_init(&m, sizeof m));
    sx_param_info_t pi;
    EXPECT_OK(sx_param_info_init(&pi, sizeof pi));
    sx_unit_info_t ui;
    EXPECT_OK(sx_unit_info_init(&ui, sizeof ui));
    int32_t i32 = 12345;
    double d = 42.0;
    int64_t steps = 0;
    uint8_t *mask = (uint8_t *)&i32;

    EXPECT_STATUS(sx_abort(h), want, needle);
    EXPECT_STATUS(sx_add_param_group(h, &pgd, &i32), want, needle);
    EXPECT_STATUS(sx_set_hyperparameter(h, 0, SX_HP_LR, 0.5), want, needle);
    EXPECT_STATUS(sx_get_hyperparameter(h, 0, SX_HP_LR, &d), want, needle);
    EXPECT_STATUS(sx_get_param_group_steps(h, 0, &steps), want, needle);
    EXPECT_STATUS(sx_set_lr(h, 0, 0.5), want, needle);
    EXPECT_STATUS(sx_add_param(h, &pd, &i32), want, needle);
    EXPECT_STATUS(sx_finalize(h), want, needle);
    EXPECT_STATUS(sx_broadcast_params(h, 0), want, needle);
    EXPECT_STATUS(sx_param_view(h, 0, &v), want, needle);
    EXPECT_STATUS(sx_grad_view(h, 0, &v), want, needle);
    EXPECT_STATUS(sx_find_param(h, "p", &i32), want, needle);
    EXPECT_STATUS(sx_set_trainable(h, 0, 1), want, needle);
    EXPECT_STATUS(sx_get_trainable(h, 0, &i32), want, needle);
    EXPECT_STATUS(sx_trainable_mask(h, &mask, &i32), want, needle);
    EXPECT_STATUS(sx_refresh_trainable(h), want, needle);
    EXPECT_STATUS(sx_accumulate_grads(h), want, needle);
    EXPECT_STATUS(sx_step(h, &o, &r), want, needle);
    EXPECT_STATUS(sx_step(h, NULL, NULL), want, needle);
    EXPECT_STATUS(sx_get_rank(h, &i32), want, needle);
    EXPECT_STATUS(sx_get_world_size(h, &i32), want, needle);
    EXPECT_STATUS(sx_get_stage(h, &i32), want, needle);
    EXPECT_STATUS(sx_get_num_params(h, &i32), want, needle);
    EXPECT_STATUS(sx_get_num_units(h, &i32), want, needle);
    EXPECT_STATUS(sx_get_num_param_groups(h, &i32), want, needle);
    EXPECT_STATUS(sx_get_memory_stats(h, &m), want, needle);
    EXPECT_STATUS(sx_get_param_info(h, 0, &pi), want, needle);
    EXPECT_STATUS(sx_get_unit_info(h, 0, &ui), want, needle);
    if (h != NULL) EXPECT_STATUS(sx_destroy_shard_group(h), want, needle);

    /* Nothing was written through the output pointers. */
    assert_int_equal(i32, 12345);
    assert_true(d == 42.0);
    assert_ptr_equal(mask, (uint8_t *)&i32);
    assert_int_equal(v.struct_size, sizeof v);
    assert_null(v.data);
    assert_int_equal(r.step, 0);
    assert_int_equal(m.param_bytes, 0);
    assert_null(pi.name);
    assert_int_equal(ui.num_params, 0);
}

static void test_null_handle(void **state) {
    (void)state;
    EXPECT_OK(sx_destroy_shard_group(NULL));
    expect_handle_rejected(NULL, SX_ERR_INVALID_HANDLE, "group");
    EXPECT_OK(sx_destroy_context(NULL));
    sx_context_stats_t s;
    EXPECT_OK(sx_context_stats_init(&s, sizeof s));
    EXPECT_STATUS(sx_get_context_stats(NULL, &s), SX_ERR_INVALID_HANDLE, "context");
    EXPECT_OK(sx_destroy_norm_domain(NULL));
    EXPECT_STATUS(sx_join_norm_domain(NULL, NULL, 0), SX_ERR_INVALID_HANDLE, "group");
    sx_norm_domain_t *d = (sx_norm_domain_t *)&s;  /* not a domain */
    EXPECT_STATUS(sx_destroy_norm_domain(d), SX_ERR_INVALID_HANDLE, "not a live sx norm domain");
    EXPECT_STATUS(sx_create_norm_domain(NULL, NULL), SX_ERR_INVALID_ARGUMENT, "out is NULL");
}

static void test_garbage_handle(void **state) {
    (void)state;
    /* A stack object that even carries the handle's magic word ("SXGRP001") and a
     * non-NULL pointer where the implementation keeps its own: not from
     * sx_create_shard_group, so not a handle. */
    uint64_t fake[8];
    for (size_t i = 0; i < 8; ++i) fake[i] = 0x5358475250303031ull;
    expect_handle_rejected((sx_shard_group_t *)fake, SX_ERR_INVALID_HANDLE, "group");
    for (size_t i = 0; i < 8; ++i) assert_true(fake[i] == 0x5358475250303031ull);

    /* Heap garbage and a misaligned pointer into a live group's handle. */
    void *junk = calloc(1, 256);
    assert_non_null(junk);
    expect_handle_rejected((sx_shard_group_t *)junk, SX_ERR_INVALID_HANDLE, "group");
    free(junk);
    sx_shard_group_t *g = api_small_group(1);
    expect_handle_rejected((sx_shard_group_t *)((char *)g + 8), SX_ERR_INVALID_HANDLE, "group");
    /* The real group is untouched by all of that. */
    assert_int_equal(api_num_params(g), 2);
    int32_t rank = -1;
    EXPECT_OK(sx_get_rank(g, &rank));
    assert_int_equal(rank, 0);
    EXPECT_OK(sx_destroy_shard_group(g));
}

static void test_destroyed_handle(void **state) {
    (void)state;
    /* A finalized group, and an unfinalized one: destroyed, both are dead handles. No
     * group is created between the destroy and the checks, so the memory cannot have
     * been handed to a new live group. */
    sx_shard_group_t *g = api_small_group(1);
    EXPECT_OK(sx_destroy_shard_group(g));
    expect_handle_rejected(g, SX_ERR_INVALID_HANDLE, "group");
    EXPECT_STATUS(sx_destroy_shard_group(g), SX_ERR_INVALID_HANDLE, "group");

    g = api_group();
    EXPECT_OK(sx_destroy_shard_group(g));
    expect_handle_rejected(g, SX_ERR_INVALID_HANDLE, "group");
}

/* ---------------------------------------------------------------------------------
 * Creating a group
 * ------------------------------------------------------------------------------- */

static sx_shard_group_t *const kPoison = (sx_shard_group_t *)(uintptr_t)0xdeadbeef;

/* sx_create_shard_group(c) must fail with `want`, a message containing `needle`, and
 * set *out to NULL. */
static void expect_create_fails(const sx_group_config_t *c, sx_status_t want, const char *needle,
                                int line) {
    sx_shard_group_t *out = kPoison;
    api_reset_error();
    sx_status_t s = sx_create_shard_group(c, &out);
    api_expect(s, want, needle, "sx_create_shard_group(config)", __FILE__, line);
    assert_null(out);
}

#define EXPECT_CREATE_FAILS(c, want, needle) expect_create_fails((c), (want), (needle), __LINE__)

static void test_create_errors(void **state) {
    (void)state;
    char rv[128];
    sx_group_config_t c;
    api_config(&c, rv, sizeof rv, 0, 1);

    sx_shard_group_t *out = kPoison;
    EXPECT_STATUS(sx_create_shard_group(NULL, &out), SX_ERR_INVALID_ARGUMENT, "config");
    assert_null(out);
    EXPECT_STATUS(sx_create_shard_group(&c, NULL), SX_ERR_INVALID_ARGUMENT, "out");

    sx_group_config_t b = c;
    b.rendezvous = NULL;
    EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "config->rendezvous");
    b.rendezvous = "";
    EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "config->rendezvous");
    b.rendezvous = "bogus://nowhere";
    EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "rendezvous");
    b.rendezvous = "no scheme at all";
    EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "rendezvous");
    b.rendezvous = "local://"; /* no name */
    EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "local://NAME");

    const int32_t bad_rank[] = {-1, 1, INT32_MAX};
    for (size_t i = 0; i < 3; ++i) {
        b = c;
        b.rank = bad_rank[i];
        EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "rank");
    }
    b = c;
    b.world_size = -2;
    EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "world_size");

    const int32_t bad_stage[] = {-1, 4, 100};
    for (size_t i = 0; i < 3; ++i) {
        b = c;
        b.stage = bad_stage[i];
        EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "stage");
    }
    const int32_t bad_backend[] = {-1, 3, 99};
    for (size_t i = 0; i < 3; ++i) {
        b = c;
        b.backend = bad_backend[i];
        EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "backend");
    }
    /* SX_BACKEND_CUDA: a group on the device where there is one, else SX_ERR_UNSUPPORTED
     * saying why (no CUDA device or driver, or a build without CUDA), and nothing made. */
    {
        sx_shard_group_t *cg = NULL;
        b = c;
        b.backend = SX_BACKEND_CUDA;
        const sx_status_t st = sx_create_shard_group(&b, &cg);
        if (st == SX_OK) {
            assert_non_null(cg);
            EXPECT_OK(sx_destroy_shard_group(cg));
        } else {
            assert_int_equal(st, SX_ERR_UNSUPPORTED);
            assert_null(cg);
            assert_non_null(strstr(sx_last_error_message(), "SX_BACKEND_CUDA"));
        }
    }
    const int32_t bad_alignment[] = {-64, 3, 63, 96, 100, 1 << 21, INT32_MIN};
    for (size_t i = 0; i < sizeof bad_alignment / sizeof bad_alignment[0]; ++i) {
        b = c;
        b.alignment = bad_alignment[i];
        EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "alignment");
    }
    b = c;
    b.timeout_ms = -1;
    EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "timeout_ms");
    b = c;
    b.num_threads = -1;
    EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "num_threads");
    b.num_threads = 1 << 20;
    EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "num_threads");
    const uint32_t bad_flags[] = {0x20, 0x80000000u, 0xffffffffu};
    for (size_t i = 0; i < 3; ++i) {
        b = c;
        b.flags = bad_flags[i];
        EXPECT_CREATE_FAILS(&b, SX_ERR_INVALID_ARGUMENT, "config->flags");
    }

    /* The same config, unbroken, works (so the failures above were the fields'), and the
     * documented values are taken: stage 1, alignment 4096, the flags. */
    b = c;
    b.stage = 1;
    b.alignment = 4096;
    b.backend = SX_BACKEND_CPU;
    b.flags = SX_GROUP_NO_TRAINABLE_AUTODETECT | SX_GROUP_RESERVE_CHECKPOINT_STAGING;
    sx_shard_group_t *g = NULL;
    EXPECT_OK(sx_create_shard_group(&b, &g));
    assert_non_null(g);
    int32_t v = -1;
    EXPECT_OK(sx_get_stage(g, &v));
    assert_int_equal(v, 1);
    EXPECT_OK(sx_get_world_size(g, &v));
    assert_int_equal(v, 1);
    EXPECT_OK(sx_destroy_shard_group(g));
}

/* ---------------------------------------------------------------------------------
 * Param groups and hyperparameters
 * ------------------------------------------------------------------------------- */

static void test_param_group_errors(void **state) {
    (void)state;
    sx_shard_group_t *g = api_group();
    sx_param_group_desc_t d;
    int32_t index = 777;

    EXPECT_STATUS(sx_param_group_desc_init(NULL, sizeof d, 0), SX_ERR_INVALID_ARGUMENT, "desc");
    const int32_t bad_opt[] = {-1, 14, 100, INT32_MAX};
    for (size_t i = 0; i < 4; ++i) {
        memset(&d, 0xAB, sizeof d);
        EXPECT_STATUS(sx_param_group_desc_init(&d, sizeof d, bad_opt[i]), SX_ERR_INVALID_ARGUMENT,
                      "optimizer");
        /* A rejected init leaves the struct alone. */
        assert_true(d.struct_size == (size_t)0xABABABABABABABABull);
    }

    EXPECT_STATUS(sx_add_param_group(g, NULL, &index), SX_ERR_INVALID_ARGUMENT, "desc");
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_OK(sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_ADAM));
        d.optimizer = bad_opt[i];
        EXPECT_STATUS(sx_add_param_group(g, &d, &index), SX_ERR_INVALID_ARGUMENT, "optimizer");
    }

#define BAD_DESC(optim, field, value, needle)                                                \
    do {                                                                                     \
        EXPECT_OK(sx_param_group_desc_init(&d, sizeof d, (optim)));                          \
        d.field = (value);                                                                   \
        EXPECT_STATUS(sx_add_param_group(g, &d, &index), SX_ERR_INVALID_ARGUMENT, (needle)); \
    } while (0)

    BAD_DESC(SX_OPTIM_SGD, nesterov, 2, "desc->nesterov");
    BAD_DESC(SX_OPTIM_SGD, nesterov, -1, "desc->nesterov");
    BAD_DESC(SX_OPTIM_ADAMW, maximize, 2, "desc->maximize");
    BAD_DESC(SX_OPTIM_ADAMW, amsgrad, 7, "desc->amsgrad");
    BAD_DESC(SX_OPTIM_ADAMW, lr, -1e-3, "lr");
    BAD_DESC(SX_OPTIM_ADAMW, lr, NAN, "finite");
    BAD_DESC(SX_OPTIM_ADAMW, lr, INFINITY, "finite");
    BAD_DESC(SX_OPTIM_ADAMW, weight_decay, -0.1, "weight_decay");
    BAD_DESC(SX_OPTIM_ADAM, beta1, 1.0, "beta1");
    BAD_DESC(SX_OPTIM_ADAM, beta1, -0.1, "beta1");
    BAD_DESC(SX_OPTIM_ADAM, beta2, 1.5, "beta2");
    BAD_DESC(SX_OPTIM_ADAM, eps, -1e-8, "eps");
    BAD_DESC(SX_OPTIM_SGD, momentum, -0.9, "momentum");
    /* torch: "Nesterov momentum requires a momentum and zero dampening". */
    BAD_DESC(SX_OPTIM_SGD, nesterov, 1, "nesterov");
    /* Options of the other optimizer family are errors, not silently ignored. */
    BAD_DESC(SX_OPTIM_SGD, amsgrad, 1, "amsgrad");
    BAD_DESC(SX_OPTIM_ADAM, momentum, 0.9, "momentum");
    BAD_DESC(SX_OPTIM_ADAMW, nesterov, 1, "nesterov");
#undef BAD_DESC

    /* None of that added a group or wrote the index. */
    assert_int_equal(api_num_param_groups(g), 0);
    assert_int_equal(index, 777);

    /* index_out may be NULL. */
    EXPECT_OK(sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_SGD));
    EXPECT_OK(sx_add_param_group(g, &d, NULL));
    assert_int_equal(api_num_param_groups(g), 1);
    EXPECT_OK(sx_destroy_shard_group(g));
}

static void test_hyperparameter_errors(void **state) {
    (void)state;
    sx_shard_group_t *g = api_group();
    double v = -5.0;
    /* No param group yet: index 0 does not exist. */
    EXPECT_STATUS(sx_set_hyperparameter(g, 0, SX_HP_LR, 0.1), SX_ERR_INVALID_ARGUMENT, "param group");
    EXPECT_STATUS(sx_get_hyperparameter(g, 0, SX_HP_LR, &v), SX_ERR_INVALID_ARGUMENT, "param group");
    assert_true(v == -5.0);
    int64_t steps = -5;
    EXPECT_STATUS(sx_get_param_group_steps(g, 0, &steps), SX_ERR_INVALID_ARGUMENT, "param group");
    assert_true(steps == -5);

    const int32_t adamw = api_add_group(g, SX_OPTIM_ADAMW);
    const int32_t sgd = api_add_group(g, SX_OPTIM_SGD);
    assert_int_equal(adamw, 0);
    assert_int_equal(sgd, 1);
    EXPECT_OK(sx_set_lr(g, adamw, 0.25));
    EXPECT_OK(sx_set_hyperparameter(g, sgd, SX_HP_MOMENTUM, 0.5));

    const int32_t bad_group[] = {-1, 2, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_STATUS(sx_set_hyperparameter(g, bad_group[i], SX_HP_LR, 0.1), SX_ERR_INVALID_ARGUMENT,
                      "param group");
        EXPECT_STATUS(sx_set_lr(g, bad_group[i], 0.1), SX_ERR_INVALID_ARGUMENT, "param group");
        EXPECT_STATUS(sx_get_hyperparameter(g, bad_group[i], SX_HP_LR, &v), SX_ERR_INVALID_ARGUMENT,
                      "param group");
    }
    const int32_t bad_key[] = {0, 29, -1, 999};
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_STATUS(sx_set_hyperparameter(g, adamw, bad_key[i], 0.1), SX_ERR_INVALID_ARGUMENT,
                      "hyperparameter key");
        EXPECT_STATUS(sx_get_hyperparameter(g, adamw, bad_key[i], &v), SX_ERR_INVALID_ARGUMENT,
                      "hyperparameter key");
    }
    /* SX_HP_CUSTOM + i keys a custom optimizer's own hyperparameters; AdamW has none. */
    const int32_t custom_key[] = {SX_HP_CUSTOM, INT32_MAX};
    for (size_t i = 0; i < 2; ++i) {
        EXPECT_STATUS(sx_set_hyperparameter(g, adamw, custom_key[i], 0.1), SX_ERR_INVALID_ARGUMENT,
                      "AdamW has none");
        EXPECT_STATUS(sx_get_hyperparameter(g, adamw, custom_key[i], &v), SX_ERR_INVALID_ARGUMENT,
                      "AdamW has none");
    }
    assert_true(v == -5.0);
    EXPECT_STATUS(sx_get_hyperparameter(g, adamw, SX_HP_LR, NULL), SX_ERR_INVALID_ARGUMENT, "value");
    EXPECT_STATUS(sx_get_param_group_steps(g, adamw, NULL), SX_ERR_INVALID_ARGUMENT, "steps is NULL");
    EXPECT_STATUS(sx_get_param_group_steps(g, 2, &steps), SX_ERR_INVALID_ARGUMENT, "param_group 2 is not one");
    EXPECT_OK(sx_get_param_group_steps(g, sgd, &steps));
    assert_true(steps == 0);

    /* Values out of range, and keys that do not apply to the optimizer. */
    struct {
        int32_t group, key;
        double value;
        const char *needle;
    } bad[] = {
        {0, SX_HP_LR, -0.1, "lr"},
        {0, SX_HP_LR, NAN, "lr"},
        {0, SX_HP_LR, INFINITY, "lr"},
        {0, SX_HP_WEIGHT_DECAY, -1.0, "weight_decay"},
        {0, SX_HP_BETA1, 1.0, "beta1"},
        {0, SX_HP_BETA1, -0.5, "beta1"},
        {0, SX_HP_BETA2, 1.0, "beta2"},
        {0, SX_HP_EPS, -1.0, "eps"},
        {0, SX_HP_AMSGRAD, 0.5, "amsgrad"},
        {0, SX_HP_AMSGRAD, 2.0, "amsgrad"},
        {0, SX_HP_MAXIMIZE, -1.0, "maximize"},
        {0, SX_HP_MOMENTUM, 0.9, "momentum"},   /* not an SGD group */
        {0, SX_HP_NESTEROV, 1.0, "nesterov"},   /* not an SGD group */
        {0, SX_HP_DAMPENING, 0.1, "dampening"}, /* not an SGD group */
        {1, SX_HP_BETA1, 0.5, "beta1"},         /* not an Adam group */
        {1, SX_HP_EPS, 1e-6, "eps"},            /* not an Adam group */
        {1, SX_HP_AMSGRAD, 1.0, "amsgrad"},     /* not an Adam group */
        {1, SX_HP_MOMENTUM, -0.5, "momentum"},
        {1, SX_HP_NESTEROV, 2.0, "nesterov"},
        {1, SX_HP_DAMPENING, NAN, "dampening"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        double before = -1, after = -2;
        const int32_t key = bad[i].key;
        const int readable = sx_get_hyperparameter(g, bad[i].group, key, &before) == SX_OK;
        api_reset_error();
        sx_status_t s = sx_set_hyperparameter(g, bad[i].group, key, bad[i].value);
        char what[96];
        snprintf(what, sizeof what, "sx_set_hyperparameter(group %d, key %d, %g)", bad[i].group, key,
                 bad[i].value);
        api_expect(s, SX_ERR_INVALID_ARGUMENT, bad[i].needle, what, __FILE__, __LINE__);
        if (readable) {
            EXPECT_OK(sx_get_hyperparameter(g, bad[i].group, key, &after));
            if (!(before == after)) fail_msg("%s changed the value from %g to %g", what, before, after);
        }
    }
    /* The values set earlier survived every rejected call. */
    EXPECT_OK(sx_get_hyperparameter(g, adamw, SX_HP_LR, &v));
    assert_true(v == 0.25);
    EXPECT_OK(sx_get_hyperparameter(g, sgd, SX_HP_MOMENTUM, &v));
    assert_true(v == 0.5);
    EXPECT_OK(sx_get_hyperparameter(g, adamw, SX_HP_AMSGRAD, &v));
    assert_true(v == 0.0);
    EXPECT_STATUS(sx_set_lr(g, adamw, -1.0), SX_ERR_INVALID_ARGUMENT, "lr");
    EXPECT_OK(sx_get_hyperparameter(g, adamw, SX_HP_LR, &v));
    assert_true(v == 0.25);
    /* Nesterov needs momentum > 0 and dampening 0: rejected with dampening set. */
    EXPECT_OK(sx_set_hyperparameter(g, sgd, SX_HP_DAMPENING, 0.1));
    EXPECT_STATUS(sx_set_hyperparameter(g, sgd, SX_HP_NESTEROV, 1.0), SX_ERR_INVALID_ARGUMENT,
                  "nesterov");
    EXPECT_OK(sx_get_hyperparameter(g, sgd, SX_HP_NESTEROV, &v));
    assert_true(v == 0.0);
    EXPECT_OK(sx_destroy_shard_group(g));
}

/* The optimizer table's rules for the optimizers beyond SGD and Adam: each refused with
 * the hyperparameter's name, changing nothing; and the changes that would move a state
 * slot, refused after the first step. */
static void test_optimizer_table_rules(void **state) {
    (void)state;
    sx_shard_group_t *g = api_group();
    const int32_t adagrad = api_add_group(g, SX_OPTIM_ADAGRAD);
    const int32_t rmsprop = api_add_group(g, SX_OPTIM_RMSPROP);
    const int32_t nadam = api_add_group(g, SX_OPTIM_NADAM);
    const int32_t lion = api_add_group(g, SX_OPTIM_LION);
    struct {
        int32_t group, key;
        double value;
        const char *needle;
    } bad[] = {
        {adagrad, SX_HP_LR_DECAY, -0.1, "lr_decay"},
        {adagrad, SX_HP_INITIAL_ACCUMULATOR_VALUE, -1.0, "initial_accumulator_value"},
        {adagrad, SX_HP_EPS, NAN, "eps"},
        {adagrad, SX_HP_ALPHA, 0.5, "does not apply to Adagrad"},
        {adagrad, SX_HP_BETA1, 0.5, "does not apply to Adagrad"},
        {rmsprop, SX_HP_ALPHA, -0.5, "alpha"},
        {rmsprop, SX_HP_CENTERED, 0.5, "centered"},
        {rmsprop, SX_HP_MOMENTUM, -1.0, "momentum"},
        {rmsprop, SX_HP_LR_DECAY, 0.1, "does not apply to RMSprop"},
        {nadam, SX_HP_MOMENTUM_DECAY, -4e-3, "momentum_decay"},
        {nadam, SX_HP_DECOUPLED_WEIGHT_DECAY, 2.0, "decoupled_weight_decay"},
        {nadam, SX_HP_BETA2, 1.0, "beta2"},
        {nadam, SX_HP_AMSGRAD, 1.0, "does not apply to NAdam"},
        {lion, SX_HP_EPS, 1e-6, "does not apply to Lion"},
        {lion, SX_HP_BETA1, 1.5, "beta1"},
        {lion, SX_HP_DECOUPLED_WEIGHT_DECAY, 1.0, "does not apply to Lion"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        double before = -1, after = -2;
        const int readable = sx_get_hyperparameter(g, bad[i].group, bad[i].key, &before) == SX_OK;
        char what[96];
        snprintf(what, sizeof what, "sx_set_hyperparameter(group %d, key %d, %g)", bad[i].group, bad[i].key,
                 bad[i].value);
        api_reset_error();
        api_expect(sx_set_hyperparameter(g, bad[i].group, bad[i].key, bad[i].value), SX_ERR_INVALID_ARGUMENT,
                   bad[i].needle, what, __FILE__, __LINE__);
        if (readable) {
            EXPECT_OK(sx_get_hyperparameter(g, bad[i].group, bad[i].key, &after));
            if (!(before == after)) fail_msg("%s changed the value from %g to %g", what, before, after);
        }
    }
    /* A descriptor with a hyperparameter of another optimizer names the ones it applies to. */
    sx_param_group_desc_t d;
    EXPECT_OK(sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_ADAMW));
    d.alpha = 0.5;
    const int32_t groups = api_num_param_groups(g);
    EXPECT_STATUS(sx_add_param_group(g, &d, NULL), SX_ERR_INVALID_ARGUMENT, "it applies to RMSprop");
    assert_int_equal(api_num_param_groups(g), groups);
    /* ... but 0 there, as a zero-filled descriptor holds, means the default. */
    d.alpha = 0.0;
    EXPECT_OK(sx_add_param_group(g, &d, NULL));
    EXPECT_OK(sx_destroy_shard_group(g));

    /* After the first step: centered cannot change, nor can momentum when it would move
     * a centered RMSprop's grad_avg; a plain RMSprop may start momentum. */
    g = api_group();
    const int32_t centered = api_add_group(g, SX_OPTIM_RMSPROP);
    const int32_t plain = api_add_group(g, SX_OPTIM_RMSPROP);
    EXPECT_OK(sx_set_hyperparameter(g, centered, SX_HP_CENTERED, 1.0));
    const int64_t n[1] = {5};
    api_add_param(g, "c", 1, n, centered, 0);
    api_add_param(g, "p", 1, n, plain, 0);
    EXPECT_OK(sx_finalize(g));
    EXPECT_OK(sx_step(g, NULL, NULL));
    double v = -1;
    EXPECT_STATUS(sx_set_hyperparameter(g, centered, SX_HP_CENTERED, 0.0), SX_ERR_INVALID_STATE, "centered");
    EXPECT_STATUS(sx_set_hyperparameter(g, centered, SX_HP_MOMENTUM, 0.5), SX_ERR_INVALID_STATE, "grad_avg");
    EXPECT_OK(sx_get_hyperparameter(g, centered, SX_HP_MOMENTUM, &v));
    assert_true(v == 0.0);
    EXPECT_OK(sx_set_hyperparameter(g, plain, SX_HP_MOMENTUM, 0.5));
    EXPECT_OK(sx_step(g, NULL, NULL));
    EXPECT_OK(sx_destroy_shard_group(g));
}

/* ---------------------------------------------------------------------------------
 * Params: descriptors, shapes, names
 * ------------------------------------------------------------------------------- */

/* sx_add_param(d) must fail with want/needle, and add nothing. */
static void expect_add_param_fails(sx_shard_group_t *g, const sx_param_desc_t *d, sx_status_t want,
                                   const char *needle, int line) {
    const int32_t before = api_num_params(g);
    int32_t index = 4242;
    api_reset_error();
    sx_status_t s = sx_add_param(g, d, &index);
    api_expect(s, want, needle, "sx_add_param(desc)", __FILE__, line);
    assert_int_equal(index, 4242);
    assert_int_equal(api_num_params(g), before);
    if (d != NULL && d->name != NULL && want != SX_ERR_ALREADY_EXISTS) {
        int32_t found = -1;
        if (sx_find_param(g, d->name, &found) != SX_ERR_NOT_FOUND)
            fail_msg("line %d: the rejected param is findable (index %d)", line, (int)found);
    }
}

#define EXPECT_ADD_PARAM_FAILS(g, d, want, needle) expect_add_param_fails((g), (d), (want), (needle), __LINE__)

static void base_param(sx_param_desc_t *d, const char *name, const int64_t *shape, int32_t ndim) {
    assert_int_equal(sx_param_desc_init(d, sizeof *d), SX_OK);
    d->name = name;
    d->shape = shape;
    d->ndim = ndim;
}

static void test_add_param_errors(void **state) {
    (void)state;
    sx_shard_group_t *g = api_group();
    const int64_t shape[3] = {2, 3, 4};
    sx_param_desc_t d;

    /* No param group exists yet. */
    base_param(&d, "x", shape, 3);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "param group");
    api_add_group(g, SX_OPTIM_ADAMW);
    api_add_param(g, "first", 1, shape, 0, 0);

    EXPECT_ADD_PARAM_FAILS(g, NULL, SX_ERR_INVALID_ARGUMENT, "desc");

    const int32_t bad_frozen[] = {-1, 2, 255};
    for (size_t i = 0; i < 3; ++i) {
        base_param(&d, "x", shape, 3);
        d.frozen = bad_frozen[i];
        EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "desc->frozen");
    }
    const int32_t bad_dtype[] = {-1, 4, 99};
    for (size_t i = 0; i < 3; ++i) {
        base_param(&d, "x", shape, 3);
        d.dtype = bad_dtype[i];
        EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "dtype");
    }
    const int32_t bad_pg[] = {-1, 1, INT32_MAX};
    for (size_t i = 0; i < 3; ++i) {
        base_param(&d, "x", shape, 3);
        d.param_group = bad_pg[i];
        EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "param group");
    }
    base_param(&d, "x", shape, 3);
    d.unit = -1;
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "unit");
    d.unit = INT32_MIN;
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "unit");

    /* Shapes. */
    const int32_t bad_ndim[] = {-1, SX_MAX_NDIM + 1, 1000};
    const int64_t nine[SX_MAX_NDIM + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (size_t i = 0; i < 3; ++i) {
        base_param(&d, "x", nine, bad_ndim[i]);
        EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "ndim");
    }
    base_param(&d, "x", NULL, 2);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "shape");
    const int64_t zero_extent[3] = {2, 0, 4};
    base_param(&d, "x", zero_extent, 3);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "param 'x': shape[1] = 0");
    const int64_t negative[2] = {-3, 4};
    base_param(&d, "x", negative, 2);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "shape[0]");
    const int64_t min_extent[1] = {INT64_MIN};
    base_param(&d, "x", min_extent, 1);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "shape[0]");
    /* 2^32 * 2^32 elements: the product overflows 64 bits (and 2^62). */
    const int64_t huge[2] = {(int64_t)1 << 32, (int64_t)1 << 32};
    base_param(&d, "x", huge, 2);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "2^62");
    const int64_t max_dims[4] = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
    base_param(&d, "x", max_dims, 4);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "2^62");
    /* Wraps to exactly 2^64 = 0 in 64-bit arithmetic. */
    const int64_t wraps[4] = {1 << 16, 1 << 16, 1 << 16, 1 << 16};
    base_param(&d, "x", wraps, 4);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "2^62");
    const int64_t just_over[2] = {((int64_t)1 << 31) + 1, (int64_t)1 << 31};
    base_param(&d, "x", just_over, 2);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "2^62");

    /* The edges that are valid: a scalar (ndim 0, shape NULL), SX_MAX_NDIM dims, an
     * fp32 dtype given explicitly, a frozen param, a large unit id, index_out NULL. */
    base_param(&d, "scalar", NULL, 0);
    int32_t index = -1;
    EXPECT_OK(sx_add_param(g, &d, &index));
    assert_int_equal(index, 1);
    base_param(&d, "eight_dims", nine, SX_MAX_NDIM);
    d.dtype = SX_DTYPE_F32;
    d.frozen = 1;
    d.unit = INT32_MAX;
    EXPECT_OK(sx_add_param(g, &d, NULL));
    assert_int_equal(api_num_params(g), 3);
    int32_t trainable = -1;
    EXPECT_OK(sx_get_trainable(g, 2, &trainable));
    assert_int_equal(trainable, 0);
    sx_param_info_t info;
    EXPECT_OK(sx_param_info_init(&info, sizeof info));
    EXPECT_OK(sx_get_param_info(g, 1, &info));
    assert_string_equal(info.name, "scalar");
    assert_int_equal(info.ndim, 0);
    assert_int_equal(info.numel, 1);
    EXPECT_OK(sx_finalize(g));
    EXPECT_OK(sx_destroy_shard_group(g));
}

static void test_param_names(void **state) {
    (void)state;
    sx_shard_group_t *g = api_group();
    api_add_group(g, SX_OPTIM_SGD);
    const int64_t shape[1] = {3};
    sx_param_desc_t d;

    base_param(&d, NULL, shape, 1);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "name");
    base_param(&d, "", shape, 1);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "empty");

    /* Valid UTF-8 of every length, then every kind of invalid sequence. */
    const char *valid = "layer.0/w\xC3\xA4ight\xE2\x82\xAC\xF0\x9F\x98\x80";  /* ä € 😀 */
    api_add_param(g, valid, 1, shape, 0, 0);
    const char *invalid[] = {
        "\x80" "abc",             /* stray continuation byte first */
        "ab\xBF" "cd",            /* stray continuation byte inside */
        "ab\xC3",                 /* 2-byte sequence truncated at the end */
        "ab\xC3x",                /* 2-byte sequence cut by an ASCII byte */
        "\xE2\x82",               /* 3-byte sequence truncated */
        "\xF0\x9F\x98",           /* 4-byte sequence truncated */
        "\xC0\xAF",               /* overlong '/' */
        "\xC1\xBF",               /* overlong */
        "\xE0\x80\xAF",           /* overlong 3-byte '/' */
        "\xF0\x80\x80\xAF",       /* overlong 4-byte '/' */
        "\xED\xA0\x80",           /* U+D800, a surrogate */
        "\xED\xBF\xBF",           /* U+DFFF, a surrogate */
        "\xF4\x90\x80\x80",       /* U+110000, beyond Unicode */
        "\xF8\x88\x80\x80\x80",   /* 5-byte form */
        "x\xFF",                  /* never valid */
        "x\xFE",                  /* never valid */
    };
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; ++i) {
        base_param(&d, invalid[i], shape, 1);
        char what[64];
        snprintf(what, sizeof what, "sx_add_param(invalid UTF-8 #%zu)", i);
        api_reset_error();
        sx_status_t s = sx_add_param(g, &d, NULL);
        api_expect(s, SX_ERR_INVALID_ARGUMENT, "UTF-8", what, __FILE__, __LINE__);
    }
    assert_int_equal(api_num_params(g), 1);

    /* Duplicates: the exact same bytes, including the multi-byte ones. */
    base_param(&d, "layer.0/w\xC3\xA4ight\xE2\x82\xAC\xF0\x9F\x98\x80", shape, 1);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_ALREADY_EXISTS, "already");
    /* A prefix or an extension of a registered name is a different name. */
    api_add_param(g, "layer.0/w", 1, shape, 0, 0);
    api_add_param(g, "layer.0/w\xC3\xA4ight\xE2\x82\xAC\xF0\x9F\x98\x80.", 1, shape, 0, 0);
    base_param(&d, "layer.0/w", shape, 1);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_ALREADY_EXISTS, "layer.0/w");

    /* Exactly SX_MAX_NAME_BYTES is accepted; one more byte is not. */
    char *name = (char *)malloc(SX_MAX_NAME_BYTES + 2);
    assert_non_null(name);
    memset(name, 'n', SX_MAX_NAME_BYTES + 1);
    name[SX_MAX_NAME_BYTES + 1] = '\0';
    base_param(&d, name, shape, 1);
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "1024");
    /* ...also when the extra byte completes a multi-byte character. */
    name[SX_MAX_NAME_BYTES - 1] = '\xC3';
    name[SX_MAX_NAME_BYTES] = '\xA4';
    EXPECT_ADD_PARAM_FAILS(g, &d, SX_ERR_INVALID_ARGUMENT, "1024");
    name[SX_MAX_NAME_BYTES - 1] = 'n';
    name[SX_MAX_NAME_BYTES] = '\0';
    assert_int_equal(strlen(name), SX_MAX_NAME_BYTES);
    int32_t index = -1;
    EXPECT_OK(sx_add_param(g, &d, &index));
    /* Ending in a 2-byte character at exactly the limit. */
    name[SX_MAX_NAME_BYTES - 2] = '\xC3';
    name[SX_MAX_NAME_BYTES - 1] = '\xA4';
    EXPECT_OK(sx_add_param(g, &d, NULL));
    int32_t found = -1;
    EXPECT_OK(sx_find_param(g, name, &found));
    assert_int_equal(found, index + 1);
    /* The name is copied: changing our buffer does not rename the param. */
    memset(name, 'z', SX_MAX_NAME_BYTES);
    EXPECT_STATUS(sx_find_param(g, name, &found), SX_ERR_NOT_FOUND, "zzzz");
    sx_param_info_t info;
    EXPECT_OK(sx_param_info_init(&info, sizeof info));
    EXPECT_OK(sx_get_param_info(g, index, &info));
    assert_int_equal(strlen(info.name), SX_MAX_NAME_BYTES);
    assert_int_equal(info.name[0], 'n');
    free(name);

    assert_int_equal(api_num_params(g), 5);
    EXPECT_OK(sx_find_param(g, valid, &found));
    assert_int_equal(found, 0);
    EXPECT_STATUS(sx_find_param(g, "layer.0", &found), SX_ERR_NOT_FOUND, "layer.0");
    EXPECT_STATUS(sx_find_param(g, NULL, &found), SX_ERR_INVALID_ARGUMENT, "name");
    EXPECT_STATUS(sx_find_param(g, valid, NULL), SX_ERR_INVALID_ARGUMENT, "index");
    assert_int_equal(found, 0);
    EXPECT_OK(sx_destroy_shard_group(g));
}

/* ---------------------------------------------------------------------------------
 * The group's life: calls in the wrong order
 * ------------------------------------------------------------------------------- */

static void test_before_finalize(void **state) {
    (void)state;
    sx_shard_group_t *g = api_group();
    /* Nothing to finalize yet. */
    EXPECT_STATUS(sx_finalize(g), SX_ERR_INVALID_STATE, NULL);
    api_add_group(g, SX_OPTIM_ADAMW);
    EXPECT_STATUS(sx_finalize(g), SX_ERR_INVALID_STATE, NULL);
    const int64_t shape[1] = {5};
    api_add_param(g, "p", 1, shape, 0, 0);

    sx_view_t v;
    EXPECT_OK(sx_view_init(&v, sizeof v));
    sx_memory_stats_t m;
    EXPECT_OK(sx_memory_stats_init(&m, sizeof m));
    sx_unit_info_t ui;
    EXPECT_OK(sx_unit_info_init(&ui, sizeof ui));
    uint8_t *mask = NULL;
    int32_t count = -1;

    EXPECT_STATUS(sx_param_view(g, 0, &v), SX_ERR_INVALID_STATE, "sx_finalize");
    EXPECT_STATUS(sx_grad_view(g, 0, &v), SX_ERR_INVALID_STATE, "sx_finalize");
    assert_null(v.data);
    EXPECT_STATUS(sx_trainable_mask(g, &mask, &count), SX_ERR_INVALID_STATE, "sx_finalize");
    assert_null(mask);
    assert_int_equal(count, -1);
    EXPECT_STATUS(sx_refresh_trainable(g), SX_ERR_INVALID_STATE, "sx_finalize");
    EXPECT_STATUS(sx_accumulate_grads(g), SX_ERR_INVALID_STATE, "sx_finalize");
    EXPECT_STATUS(sx_step(g, NULL, NULL), SX_ERR_INVALID_STATE, "sx_finalize");
    EXPECT_STATUS(sx_broadcast_params(g, 0), SX_ERR_INVALID_STATE, "sx_finalize");
    EXPECT_STATUS(sx_get_memory_stats(g, &m), SX_ERR_INVALID_STATE, "sx_finalize");
    assert_int_equal(m.param_bytes, 0);
    EXPECT_STATUS(sx_get_num_units(g, &count), SX_ERR_INVALID_STATE, "sx_finalize");
    assert_int_equal(count, -1);
    EXPECT_STATUS(sx_get_unit_info(g, 0, &ui), SX_ERR_INVALID_STATE, "sx_finalize");

    /* Still usable: registration continues, finalize works, then the same calls do. */
    api_add_param(g, "q", 1, shape, 0, 0);
    EXPECT_OK(sx_finalize(g));
    EXPECT_OK(sx_param_view(g, 1, &v));
    assert_non_null(v.data);
    assert_int_equal(v.numel, 5);
    EXPECT_OK(sx_trainable_mask(g, &mask, &count));
    assert_int_equal(count, 2);
    EXPECT_OK(sx_get_num_units(g, &count));
    assert_int_equal(count, 1);
    sx_step_result_t r;
    EXPECT_OK(sx_step_result_init(&r, sizeof r));
    EXPECT_OK(sx_step(g, NULL, &r));
    assert_int_equal(r.step, 1);
    EXPECT_OK(sx_destroy_shard_group(g));
}

static void test_after_finalize(void **state) {
    (void)state;
    sx_shard_group_t *g = api_small_group(1);
    EXPECT_STATUS(sx_finalize(g), SX_ERR_INVALID_STATE, "nothing was added");

    /* Params added after sx_finalize go in new units, after every laid-out one (units 0
     * and 1 are): an old unit id is refused by name and changes nothing. */
    sx_param_desc_t d;
    const int64_t shape[1] = {3};
    int32_t index = 99;
    base_param(&d, "late", shape, 1);
    d.unit = 1;
    EXPECT_STATUS(sx_add_param(g, &d, &index), SX_ERR_INVALID_ARGUMENT, "ids above 1");
    assert_int_equal(index, 99);
    assert_int_equal(api_num_params(g), 2);
    int32_t found = -1;
    EXPECT_STATUS(sx_find_param(g, "late", &found), SX_ERR_NOT_FOUND, "late");

    /* A param group and a param in a new unit wait for the next sx_finalize: until then
     * the new param has no views, and the group does not step. */
    sx_param_group_desc_t pgd;
    EXPECT_OK(sx_param_group_desc_init(&pgd, sizeof pgd, SX_OPTIM_SGD));
    EXPECT_OK(sx_add_param_group(g, &pgd, &index));
    assert_int_equal(index, 1);
    d.unit = 2;
    d.param_group = 1;
    EXPECT_OK(sx_add_param(g, &d, &index));
    assert_int_equal(index, 2);
    sx_view_t v;
    EXPECT_OK(sx_view_init(&v, sizeof v));
    EXPECT_STATUS(sx_param_view(g, 2, &v), SX_ERR_INVALID_STATE, "next sx_finalize");
    EXPECT_OK(sx_param_view(g, 0, &v)); /* laid-out params keep their views */
    EXPECT_STATUS(sx_step(g, NULL, NULL), SX_ERR_INVALID_STATE, "call sx_finalize again");
    EXPECT_OK(sx_finalize(g));
    EXPECT_OK(sx_param_view(g, 2, &v));
    assert_int_equal(v.numel, 3);
    EXPECT_OK(sx_step(g, NULL, NULL));
    assert_int_equal(api_num_params(g), 3);
    assert_int_equal(api_num_param_groups(g), 2);

    /* Hyperparameters may still change after finalize. */
    EXPECT_OK(sx_set_lr(g, 0, 0.125));
    double lr = 0;
    EXPECT_OK(sx_get_hyperparameter(g, 0, SX_HP_LR, &lr));
    assert_true(lr == 0.125);
    EXPECT_OK(sx_destroy_shard_group(g));
}

/* ---------------------------------------------------------------------------------
 * Indices and NULL outputs on a finalized group
 * ------------------------------------------------------------------------------- */

static void test_index_errors(void **state) {
    (void)state;
    sx_shard_group_t *g = api_small_group(1);
    sx_view_t v;
    EXPECT_OK(sx_view_init(&v, sizeof v));
    sx_param_info_t pi;
    EXPECT_OK(sx_param_info_init(&pi, sizeof pi));
    sx_unit_info_t ui;
    EXPECT_OK(sx_unit_info_init(&ui, sizeof ui));
    int32_t t = -7;

    const int32_t bad_param[] = {-1, 2, 3, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < 5; ++i) {
        const int32_t p = bad_param[i];
        EXPECT_STATUS(sx_param_view(g, p, &v), SX_ERR_INVALID_ARGUMENT, "param index");
        EXPECT_STATUS(sx_grad_view(g, p, &v), SX_ERR_INVALID_ARGUMENT, "param index");
        EXPECT_STATUS(sx_set_trainable(g, p, 0), SX_ERR_INVALID_ARGUMENT, "param index");
        EXPECT_STATUS(sx_get_trainable(g, p, &t), SX_ERR_INVALID_ARGUMENT, "param index");
        EXPECT_STATUS(sx_get_param_info(g, p, &pi), SX_ERR_INVALID_ARGUMENT, "param index");
    }
    assert_null(v.data);
    assert_int_equal(t, -7);
    assert_null(pi.name);

    const int32_t bad_unit[] = {-1, 2, INT32_MAX};
    for (size_t i = 0; i < 3; ++i)
        EXPECT_STATUS(sx_get_unit_info(g, bad_unit[i], &ui), SX_ERR_INVALID_ARGUMENT, "unit index");
    assert_int_equal(ui.num_params, 0);

    const int32_t bad_root[] = {-1, 1, INT32_MAX};
    for (size_t i = 0; i < 3; ++i)
        EXPECT_STATUS(sx_broadcast_params(g, bad_root[i]), SX_ERR_INVALID_ARGUMENT, "root rank");
    EXPECT_OK(sx_broadcast_params(g, 0));

    /* Enum-like values. */
    const int32_t bad_trainable[] = {-1, 2, 100};
    for (size_t i = 0; i < 3; ++i)
        EXPECT_STATUS(sx_set_trainable(g, 0, bad_trainable[i]), SX_ERR_INVALID_ARGUMENT, "trainable");
    EXPECT_OK(sx_get_trainable(g, 0, &t));
    assert_int_equal(t, 1);
    EXPECT_OK(sx_set_trainable(g, 1, 0));
    EXPECT_STATUS(sx_set_trainable(g, 5, 1), SX_ERR_INVALID_ARGUMENT, "param index");
    EXPECT_OK(sx_get_trainable(g, 1, &t));
    assert_int_equal(t, 0);

    /* NULL outputs: each named. */
    EXPECT_STATUS(sx_param_view(g, 0, NULL), SX_ERR_INVALID_ARGUMENT, "out");
    EXPECT_STATUS(sx_grad_view(g, 0, NULL), SX_ERR_INVALID_ARGUMENT, "out");
    EXPECT_STATUS(sx_get_param_info(g, 0, NULL), SX_ERR_INVALID_ARGUMENT, "out");
    EXPECT_STATUS(sx_get_unit_info(g, 0, NULL), SX_ERR_INVALID_ARGUMENT, "out");
    EXPECT_STATUS(sx_get_memory_stats(g, NULL), SX_ERR_INVALID_ARGUMENT, "out");
    EXPECT_STATUS(sx_get_trainable(g, 0, NULL), SX_ERR_INVALID_ARGUMENT, "trainable");
    uint8_t *mask = NULL;
    int32_t count = -1;
    EXPECT_STATUS(sx_trainable_mask(g, NULL, &count), SX_ERR_INVALID_ARGUMENT, "mask");
    EXPECT_STATUS(sx_trainable_mask(g, &mask, NULL), SX_ERR_INVALID_ARGUMENT, "count");
    assert_null(mask);
    assert_int_equal(count, -1);
    EXPECT_STATUS(sx_get_rank(g, NULL), SX_ERR_INVALID_ARGUMENT, "rank");
    EXPECT_STATUS(sx_get_world_size(g, NULL), SX_ERR_INVALID_ARGUMENT, "world_size");
    EXPECT_STATUS(sx_get_stage(g, NULL), SX_ERR_INVALID_ARGUMENT, "stage");
    EXPECT_STATUS(sx_get_num_params(g, NULL), SX_ERR_INVALID_ARGUMENT, "count");
    EXPECT_STATUS(sx_get_num_units(g, NULL), SX_ERR_INVALID_ARGUMENT, "count");
    EXPECT_STATUS(sx_get_num_param_groups(g, NULL), SX_ERR_INVALID_ARGUMENT, "count");

    /* The valid ends of the ranges work. */
    EXPECT_OK(sx_param_view(g, 1, &v));
    assert_int_equal(v.numel, 8);
    EXPECT_OK(sx_get_unit_info(g, 1, &ui));
    assert_int_equal(ui.unit, 1);
    assert_int_equal(ui.num_params, 1);
    EXPECT_OK(sx_destroy_shard_group(g));
}

/* ---------------------------------------------------------------------------------
 * Rejected steps change nothing
 * ------------------------------------------------------------------------------- */

static float *view_data(sx_shard_group_t *g, int32_t p, int grad, uint64_t *numel) {
    sx_view_t v;
    EXPECT_OK(sx_view_init(&v, sizeof v));
    EXPECT_OK(grad ? sx_grad_view(g, p, &v) : sx_param_view(g, p, &v));
    assert_int_equal(v.dtype, SX_DTYPE_F32);
    assert_int_equal(v.device, SX_DEVICE_CPU);
    *numel = v.numel;
    return (float *)v.data;
}

static void fill(float *x, uint64_t n, float value) {
    for (uint64_t i = 0; i < n; ++i) x[i] = value;
}

static void expect_all(const float *x, uint64_t n, float value, const char *what) {
    for (uint64_t i = 0; i < n; ++i)
        if (x[i] != value) fail_msg("%s[%llu] = %g, expected %g", what, (unsigned long long)i, x[i], value);
}

static void test_rejected_step_changes_nothing(void **state) {
    (void)state;
    sx_shard_group_t *g = api_group();
    const int32_t pg = api_add_group(g, SX_OPTIM_SGD);
    EXPECT_OK(sx_set_lr(g, pg, 0.5));
    const int64_t shape[2] = {3, 5};
    api_add_param(g, "w", 2, shape, pg, 0);
    EXPECT_OK(sx_finalize(g));
    uint64_t n = 0, ng = 0;
    float *w = view_data(g, 0, 0, &n);
    float *gw = view_data(g, 0, 1, &ng);
    assert_int_equal(n, 15);
    assert_int_equal(ng, 15);
    fill(w, n, 1.0f);
    fill(gw, n, 1.0f);

    sx_step_options_t o;
    sx_step_result_t r;
    EXPECT_OK(sx_step_result_init(&r, sizeof r));

    EXPECT_OK(sx_step_options_init(&o, sizeof o));
    o.keep_grads = 2;
    EXPECT_STATUS(sx_step(g, &o, &r), SX_ERR_INVALID_ARGUMENT, "options->keep_grads");
    o.keep_grads = -1;
    EXPECT_STATUS(sx_step(g, &o, &r), SX_ERR_INVALID_ARGUMENT, "options->keep_grads");
    EXPECT_OK(sx_step_options_init(&o, sizeof o));
    o.stream = &o;
    EXPECT_STATUS(sx_step(g, &o, &r), SX_ERR_INVALID_ARGUMENT, "options->stream");
    const double bad_norm[] = {-1.0, -1e-300, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < 5; ++i) {
        EXPECT_OK(sx_step_options_init(&o, sizeof o));
        o.max_grad_norm = bad_norm[i];
        EXPECT_STATUS(sx_step(g, &o, &r), SX_ERR_INVALID_ARGUMENT, "max_grad_norm");
    }
    EXPECT_OK(sx_step_options_init(&o, sizeof o));
    o.struct_size = 0;
    EXPECT_STATUS(sx_step(g, &o, &r), SX_ERR_INVALID_ARGUMENT, "options->struct_size");
    o.struct_size = 4097;
    EXPECT_STATUS(sx_step(g, &o, &r), SX_ERR_INVALID_ARGUMENT, "options->struct_size");
    EXPECT_OK(sx_step_options_init(&o, sizeof o));
    r.struct_size = 0;
    EXPECT_STATUS(sx_step(g, &o, &r), SX_ERR_INVALID_ARGUMENT, "result->struct_size");
    r.struct_size = (size_t)-1;
    EXPECT_STATUS(sx_step(g, &o, &r), SX_ERR_INVALID_ARGUMENT, "result->struct_size");
    /* Nothing was written to the result. */
    assert_int_equal(r.step, 0);
    assert_true(r.grad_norm == 0.0);

    /* Params and grads are as the trainer left them. */
    expect_all(w, n, 1.0f, "param after rejected steps");
    expect_all(gw, n, 1.0f, "grad after rejected steps");

    /* The first step that goes through is step 1: SGD, lr 0.5, grad 1: 1 - 0.5. */
    EXPECT_OK(sx_step_result_init(&r, sizeof r));
    EXPECT_OK(sx_step(g, NULL, &r));
    assert_int_equal(r.step, 1);
    assert_int_equal(r.skipped, 0);
    assert_true(fabs(r.grad_norm - sqrt(15.0)) < 1e-5);
    expect_all(w, n, 0.5f, "param after the step");
    expect_all(gw, n, 0.0f, "grad after the step");

    /* And a rejected step after it leaves the count at 1. */
    o.keep_grads = 3;
    EXPECT_STATUS(sx_step(g, &o, &r), SX_ERR_INVALID_ARGUMENT, "keep_grads");
    assert_int_equal(r.step, 1);
    fill(gw, n, 1.0f);
    EXPECT_OK(sx_step_options_init(&o, sizeof o));
    o.keep_grads = 1;
    EXPECT_OK(sx_step(g, &o, &r));
    assert_int_equal(r.step, 2);
    expect_all(w, n, 0.0f, "param after the second step");
    expect_all(gw, n, 1.0f, "kept grad");
    EXPECT_OK(sx_destroy_shard_group(g));
}

static void test_amsgrad_after_first_step(void **state) {
    (void)state;
    sx_shard_group_t *g = api_small_group(1);
    double v = -1;
    /* Before the first step (after finalize) it may change, both ways. */
    EXPECT_OK(sx_set_hyperparameter(g, 0, SX_HP_AMSGRAD, 1.0));
    EXPECT_OK(sx_get_hyperparameter(g, 0, SX_HP_AMSGRAD, &v));
    assert_true(v == 1.0);
    EXPECT_OK(sx_set_hyperparameter(g, 0, SX_HP_AMSGRAD, 0.0));
    /* A rejected step is not a step. */
    sx_step_options_t o;
    EXPECT_OK(sx_step_options_init(&o, sizeof o));
    o.max_grad_norm = -1;
    EXPECT_STATUS(sx_step(g, &o, NULL), SX_ERR_INVALID_ARGUMENT, "max_grad_norm");
    EXPECT_OK(sx_set_hyperparameter(g, 0, SX_HP_AMSGRAD, 1.0));
    EXPECT_OK(sx_set_hyperparameter(g, 0, SX_HP_AMSGRAD, 0.0));

    EXPECT_OK(sx_step(g, NULL, NULL));
    EXPECT_STATUS(sx_set_hyperparameter(g, 0, SX_HP_AMSGRAD, 1.0), SX_ERR_INVALID_STATE, "amsgrad");
    EXPECT_OK(sx_get_hyperparameter(g, 0, SX_HP_AMSGRAD, &v));
    assert_true(v == 0.0);
    /* Other hyperparameters still change. */
    EXPECT_OK(sx_set_hyperparameter(g, 0, SX_HP_BETA1, 0.5));
    EXPECT_OK(sx_get_hyperparameter(g, 0, SX_HP_BETA1, &v));
    assert_true(v == 0.5);
    EXPECT_OK(sx_destroy_shard_group(g));
}

/* A param whose element count passes validation (<= 2^62) but whose byte size does not
 * fit in 64 bits must not be "allocated" as a wrapped-around small buffer. */
static void test_unit_too_large_to_allocate(void **state) {
    (void)state;
    sx_shard_group_t *g = api_group();
    api_add_group(g, SX_OPTIM_SGD);
    const int64_t shape[1] = {(int64_t)1 << 62};
    api_add_param(g, "enormous", 1, shape, 0, 0);
    EXPECT_STATUS(sx_finalize(g), SX_ERR_OUT_OF_MEMORY, NULL);
    /* Nothing was finalized. */
    sx_view_t v;
    EXPECT_OK(sx_view_init(&v, sizeof v));
    EXPECT_STATUS(sx_param_view(g, 0, &v), SX_ERR_INVALID_STATE, "sx_finalize");
    EXPECT_OK(sx_destroy_shard_group(g));

    /* Three params of 2^62 elements in one unit: 3 * 2^64 bytes. */
    g = api_group();
    api_add_group(g, SX_OPTIM_SGD);
    api_add_param(g, "a", 1, shape, 0, 7);
    api_add_param(g, "b", 1, shape, 0, 7);
    api_add_param(g, "c", 1, shape, 0, 7);
    EXPECT_STATUS(sx_finalize(g), SX_ERR_OUT_OF_MEMORY, NULL);
    EXPECT_STATUS(sx_grad_view(g, 2, &v), SX_ERR_INVALID_STATE, "sx_finalize");
    EXPECT_OK(sx_destroy_shard_group(g));
}

static void test_abort(void **state) {
    (void)state;
    EXPECT_STATUS(sx_abort(NULL), SX_ERR_INVALID_HANDLE, "group");
    sx_shard_group_t *g = api_small_group(1);
    EXPECT_OK(sx_abort(g));
    EXPECT_OK(sx_abort(g)); /* any number of times */
    /* Later calls: the group failed; only destroy is allowed. */
    EXPECT_STATUS(sx_step(g, NULL, NULL), SX_ERR_GROUP_FAILED, "sx_abort");
    EXPECT_STATUS(sx_accumulate_grads(g), SX_ERR_GROUP_FAILED, "sx_abort");
    EXPECT_STATUS(sx_set_lr(g, 0, 0.5), SX_ERR_GROUP_FAILED, "sx_abort");
    EXPECT_STATUS(sx_broadcast_params(g, 0), SX_ERR_GROUP_FAILED, "sx_abort");
    EXPECT_OK(sx_destroy_shard_group(g));

    g = api_group();
    EXPECT_OK(sx_abort(g));
    api_reset_error();
    sx_param_group_desc_t d;
    EXPECT_OK(sx_param_group_desc_init(&d, sizeof d, SX_OPTIM_SGD));
    EXPECT_STATUS(sx_add_param_group(g, &d, NULL), SX_ERR_GROUP_FAILED, "sx_abort");
    EXPECT_STATUS(sx_finalize(g), SX_ERR_GROUP_FAILED, "sx_abort");
    assert_int_equal(api_num_param_groups(g), 0);
    EXPECT_OK(sx_destroy_shard_group(g));
}

/* ---------------------------------------------------------------------------------
 * Checkpoints and whole state: names sx keeps for itself, synchronous saves that are
 * invalid calls, unbounded waits, step counts a checkpoint could not hold
 * ------------------------------------------------------------------------------- */

static int path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static void save_to(sx_shard_group_t *g, const char *path, int synchronous, sx_status_t want, const char *needle) {
    sx_save_options_t o;
    EXPECT_OK(sx_save_options_init(&o, sizeof o));
    o.path = path;
    o.synchronous = synchronous;
    sx_future_t *f = NULL;
    EXPECT_STATUS(sx_save_optim_state(g, &o, &f), want, needle);
    if (want != SX_OK) {
        assert_null(f);
        return;
    }
    /* Far past what the clock can add to now: this must wait, not time out at once. */
    EXPECT_OK(sx_future_wait_staged(f, INT64_MAX));
    EXPECT_OK(sx_future_wait(f, INT64_MAX));
    EXPECT_OK(sx_future_destroy(f));
}

static void test_checkpoint_names_and_calls(void **state) {
    (void)state;
    char dir[] = "/tmp/sx-api-misuse-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];

    /* A synchronous save before sx_finalize is an invalid call, as an asynchronous one is. */
    sx_shard_group_t *g = api_small_group(0);
    snprintf(path, sizeof path, "%s/early", dir);
    save_to(g, path, 1, SX_ERR_INVALID_STATE, "sx_finalize");
    save_to(g, path, 0, SX_ERR_INVALID_STATE, "sx_finalize");
    assert_false(path_exists(path));
    EXPECT_OK(sx_finalize(g));

    /* The names sx gives other things beside a checkpoint are refused, and nothing is made. */
    const char *reserved[] = {"latest", "latest.tmp", "latest.tmp.123.0", "good.sx-partial", ".sx-partial", "..", "."};
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; ++i) {
        snprintf(path, sizeof path, "%s/%s", dir, reserved[i]);
        save_to(g, path, 1, SX_ERR_INVALID_ARGUMENT, "checkpoint path");
        save_to(g, path, 0, SX_ERR_INVALID_ARGUMENT, "checkpoint path");
    }
    snprintf(path, sizeof path, "%s/latest", dir);
    assert_false(path_exists(path));

    /* Saves that keep to the rules still work, and the next one keeps the first. */
    snprintf(path, sizeof path, "%s/first", dir);
    save_to(g, path, 0, SX_OK, NULL);
    snprintf(path, sizeof path, "%s/second", dir);
    save_to(g, path, 1, SX_OK, NULL);
    snprintf(path, sizeof path, "%s/first/MANIFEST", dir);
    assert_true(path_exists(path));

    sx_load_options_t lo;
    EXPECT_OK(sx_load_optim_state_options_init(&lo, sizeof lo));
    snprintf(path, sizeof path, "%s/first", dir);
    lo.path = path;
    lo.reserved0 = 1;
    EXPECT_STATUS(sx_load_optim_state(g, &lo), SX_ERR_INVALID_ARGUMENT, "reserved0");
    lo.reserved0 = 0;
    EXPECT_OK(sx_load_optim_state(g, &lo));
    EXPECT_OK(sx_destroy_shard_group(g));

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static sx_status_t set_steps(sx_param_state_t *st, void *user) {
    const int64_t *steps = (const int64_t *)user;
    st->step = steps[0];
    st->momentum_steps = steps[1];
    return SX_OK;
}

static sx_status_t no_state(sx_param_state_t *st, void *user) {
    (void)st;
    (void)user;
    return SX_OK;
}

static void test_scattered_steps_are_checked(void **state) {
    (void)state;
    sx_shard_group_t *g = api_small_group(1);
    /* momentum_steps above step, a step past 2^53, negative counts: all refused. */
    const int64_t bad[][2] = {{1, 10}, {INT64_MAX, 0}, {((int64_t)1 << 53) + 1, 0}, {-1, 0}, {3, -1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i)
        EXPECT_STATUS(sx_scatter_optim_state(g, 0, set_steps, (void *)bad[i]), SX_ERR_INVALID_ARGUMENT,
                      "momentum_steps <= step");
    const int64_t good[2] = {(int64_t)1 << 53, 5};
    EXPECT_OK(sx_scatter_optim_state(g, 0, set_steps, (void *)good));
    /* A NULL fn on the root is named once, after the entry point. */
    EXPECT_STATUS(sx_gather_optim_state(g, 0, NULL, NULL), SX_ERR_INVALID_ARGUMENT, "fn is NULL on the root");
    assert_null(strstr(sx_last_error_message(), "sx_gather_optim_state: sx_gather_optim_state"));
    EXPECT_OK(sx_gather_optim_state(g, 0, no_state, NULL));
    EXPECT_OK(sx_destroy_shard_group(g));
}

static void test_reserved_fields_must_be_zero(void **state) {
    (void)state;
    char rv[128];
    sx_group_config_t c;
    api_config(&c, rv, sizeof rv, 0, 1);
    c.reserved0 = 7;
    sx_shard_group_t *out = NULL;
    EXPECT_STATUS(sx_create_shard_group(&c, &out), SX_ERR_INVALID_ARGUMENT, "reserved0");
    assert_null(out);

    sx_shard_group_t *g = api_group();
    api_add_group(g, SX_OPTIM_ADAMW);
    const int64_t shape[1] = {4};
    sx_param_desc_t d;
    EXPECT_OK(sx_param_desc_init(&d, sizeof d));
    d.name = "p";
    d.ndim = 1;
    d.shape = shape;
    d.reserved0 = 5;
    int32_t index = -1;
    EXPECT_STATUS(sx_add_param(g, &d, &index), SX_ERR_INVALID_ARGUMENT, "reserved0");
    assert_int_equal(api_num_params(g), 0);
    d.reserved0 = 0;
    EXPECT_OK(sx_add_param(g, &d, &index));
    EXPECT_OK(sx_destroy_shard_group(g));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_status_strings),
        cmocka_unit_test(test_last_error_is_thread_local),
        cmocka_unit_test_teardown(test_log_callback, reset_log_callback),
        cmocka_unit_test(test_null_handle),
        cmocka_unit_test(test_garbage_handle),
        cmocka_unit_test(test_destroyed_handle),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_param_group_errors),
        cmocka_unit_test(test_hyperparameter_errors),
        cmocka_unit_test(test_optimizer_table_rules),
        cmocka_unit_test(test_add_param_errors),
        cmocka_unit_test(test_param_names),
        cmocka_unit_test(test_before_finalize),
        cmocka_unit_test(test_after_finalize),
        cmocka_unit_test(test_index_errors),
        cmocka_unit_test(test_rejected_step_changes_nothing),
        cmocka_unit_test(test_amsgrad_after_first_step),
        cmocka_unit_test(test_unit_too_large_to_allocate),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_checkpoint_names_and_calls),
        cmocka_unit_test(test_scattered_steps_are_checked),
        cmocka_unit_test(test_reserved_fields_must_be_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
