/* Ranks that disagree (two ranks as threads over local://): different param tables make
 * sx_finalize fail with SX_ERR_MISMATCH on both ranks; different max_grad_norm, trainable
 * masks, hyperparameters or calls make sx_step fail with SX_ERR_MISMATCH on both, and
 * change nothing. And sx_abort from another thread while a rank waits in a collective.
 * CMocka's asserts are used on the main thread only: the rank threads record what
 * they saw. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "api_test_util.h"

#define WORLD 2

typedef struct {
    char rv[128];
    int rank;
    int variant;
    /* What the rank saw. */
    sx_status_t create, finalize, view_after;
    int32_t num_params;
    char finalize_msg[1024];
    char failure[512]; /* first unexpected thing, "" if none */
} table_ctx;

enum {
    kSame,     /* control: the same table on both ranks */
    kName,     /* rank 1 names a param differently */
    kShape,    /* rank 1 gives a param another shape */
    kExtra,    /* rank 1 registers one param more */
    kOrder,    /* rank 1 registers two params in the other order */
    kFrozen,   /* rank 1 registers a param frozen */
    kUnit,     /* rank 1 puts a param in another unit */
    kOptim,    /* rank 1's param group is AdamW instead of SGD */
    kGroupOf,  /* rank 1 puts a param in the other param group */
    kVariants
};

static const char *const kVariantNames[kVariants] = {
    "same", "name", "shape", "extra", "order", "frozen", "unit", "optimizer", "param group"};
/* What sx_finalize's message says, on every rank, for each variant. */
static const char *const kVariantWords[kVariants] = {
    "",
    "param 1 name: 'b' on rank 0, 'b2' on rank 1",
    "param 'b' shape: [5] on rank 0, [6] on rank 1",
    "the number of params: 3 on rank 0, 4 on rank 1",
    "param 0 name: 'a' on rank 0, 'b' on rank 1",
    "param 'c' frozen: no on rank 0, yes on rank 1",
    "param 'c' unit: 1 on rank 0, 2 on rank 1",
    "param group 0 optimizer: SGD on rank 0, AdamW on rank 1",
    "param 'c' param group: 0 on rank 0, 1 on rank 1"};

static void note(char *failure, size_t size, const char *fmt, const char *a, int b) {
    if (failure[0] == '\0') snprintf(failure, size, fmt, a, b);
}

static sx_status_t add_param(sx_shard_group_t *g, const char *name, int64_t extent, int32_t pg,
                             int32_t unit, int32_t frozen) {
    sx_param_desc_t d;
    sx_status_t s = sx_param_desc_init(&d, sizeof d);
    if (s != SX_OK) return s;
    d.name = name;
    d.ndim = 1;
    d.shape = &extent;
    d.param_group = pg;
    d.unit = unit;
    d.frozen = frozen;
    return sx_add_param(g, &d, NULL);
}

static sx_status_t add_group(sx_shard_group_t *g, int32_t optimizer) {
    sx_param_group_desc_t d;
    sx_status_t s = sx_param_group_desc_init(&d, sizeof d, optimizer);
    if (s != SX_OK) return s;
    return sx_add_param_group(g, &d, NULL);
}

static sx_status_t register_table(sx_shard_group_t *g, int rank, int variant) {
    const int odd = rank == 1;
    sx_status_t s;
    if ((s = add_group(g, odd && variant == kOptim ? SX_OPTIM_ADAMW : SX_OPTIM_SGD)) != SX_OK) return s;
    if ((s = add_group(g, SX_OPTIM_SGD)) != SX_OK) return s;
    const char *b = odd && variant == kName ? "b2" : "b";
    const int64_t b_extent = odd && variant == kShape ? 6 : 5;
    if (odd && variant == kOrder) {
        if ((s = add_param(g, b, b_extent, 0, 0, 0)) != SX_OK) return s;
        if ((s = add_param(g, "a", 12, 0, 0, 0)) != SX_OK) return s;
    } else {
        if ((s = add_param(g, "a", 12, 0, 0, 0)) != SX_OK) return s;
        if ((s = add_param(g, b, b_extent, 0, 0, 0)) != SX_OK) return s;
    }
    if ((s = add_param(g, "c", 7, odd && variant == kGroupOf ? 1 : 0, odd && variant == kUnit ? 2 : 1,
                       odd && variant == kFrozen)) != SX_OK)
        return s;
    if (odd && variant == kExtra && (s = add_param(g, "d", 2, 0, 1, 0)) != SX_OK) return s;
    return SX_OK;
}

static void *table_rank(void *arg) {
    table_ctx *c = (table_ctx *)arg;
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = c->rv;
    cfg.rank = c->rank;
    cfg.world_size = WORLD;
    cfg.timeout_ms = 5000;
    cfg.num_threads = 1;
    sx_shard_group_t *g = NULL;
    c->create = sx_create_shard_group(&cfg, &g);
    if (c->create != SX_OK) {
        note(c->failure, sizeof c->failure, "create: %s (%d)", sx_last_error_message(), c->create);
        return NULL;
    }
    sx_status_t s = register_table(g, c->rank, c->variant);
    if (s != SX_OK) note(c->failure, sizeof c->failure, "register: %s (%d)", sx_last_error_message(), s);
    c->finalize = sx_finalize(g);
    snprintf(c->finalize_msg, sizeof c->finalize_msg, "%s", sx_last_error_message());
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    c->view_after = sx_param_view(g, 0, &v);
    c->num_params = -1;
    sx_get_num_params(g, &c->num_params);
    s = sx_destroy_shard_group(g);
    if (s != SX_OK) note(c->failure, sizeof c->failure, "destroy: %s (%d)", sx_last_error_message(), s);
    return NULL;
}

static void test_finalize_mismatch(void **state) {
    (void)state;
    for (int variant = 0; variant < kVariants; ++variant) {
        table_ctx ctx[WORLD];
        pthread_t t[WORLD];
        memset(ctx, 0, sizeof ctx);
        char rv[128];
        api_unique_rendezvous(rv, sizeof rv);
        for (int r = 0; r < WORLD; ++r) {
            snprintf(ctx[r].rv, sizeof ctx[r].rv, "%s", rv);
            ctx[r].rank = r;
            ctx[r].variant = variant;
            assert_int_equal(pthread_create(&t[r], NULL, table_rank, &ctx[r]), 0);
        }
        for (int r = 0; r < WORLD; ++r) assert_int_equal(pthread_join(t[r], NULL), 0);
        for (int r = 0; r < WORLD; ++r) {
            const table_ctx *c = &ctx[r];
            if (c->failure[0]) fail_msg("variant %s, rank %d: %s", kVariantNames[variant], r, c->failure);
            if (variant == kSame) {
                if (c->finalize != SX_OK)
                    fail_msg("identical tables: rank %d: sx_finalize = %d: %s", r, c->finalize,
                             c->finalize_msg);
                assert_int_equal(c->view_after, SX_OK);
                continue;
            }
            if (c->finalize != SX_ERR_MISMATCH)
                fail_msg("variant %s, rank %d: sx_finalize returned %d (%s), expected SX_ERR_MISMATCH",
                         kVariantNames[variant], r, c->finalize, c->finalize_msg);
            if (strncmp(c->finalize_msg, "sx_finalize:", 12) != 0 ||
                strstr(c->finalize_msg, "param tables") == NULL)
                fail_msg("variant %s, rank %d: message \"%s\" does not say the param tables differ",
                         kVariantNames[variant], r, c->finalize_msg);
            /* Every rank names the first thing that differs, and each rank's value. */
            if (strstr(c->finalize_msg, kVariantWords[variant]) == NULL)
                fail_msg("variant %s, rank %d: message \"%s\" does not say \"%s\"", kVariantNames[variant], r,
                         c->finalize_msg, kVariantWords[variant]);
            /* Nothing was finalized, nothing was lost. */
            assert_int_equal(c->view_after, SX_ERR_INVALID_STATE);
            const int32_t expect_params = variant == kExtra && r == 1 ? 4 : 3;
            assert_int_equal(c->num_params, expect_params);
        }
    }
}

/* ---------------------------------------------------------------------------------
 * Step mismatches
 * ------------------------------------------------------------------------------- */

enum { kPhaseNorm, kPhaseMask, kPhaseMaskApi, kPhaseLr, kPhaseCall, kPhaseAccum, kPhases };
static const char *const kPhaseNames[kPhases] = {
    "max_grad_norm", "mask (pointer)", "mask (sx_set_trainable)", "lr", "call (accumulate vs step)",
    "max_grad_norm after a micro-batch"};
/* What each rejected step's message says, on both ranks: the first difference and each
 * rank's value. */
static const char *const kPhaseWords[kPhases] = {
    "max_grad_norm: 1 on rank 0, 2 on rank 1",
    "param 'v' trainable: no on rank 0, yes on rank 1",
    "param 'w' trainable: yes on rank 0, no on rank 1",
    "param group 0 lr: 0.5 on rank 0, 0.25 on rank 1",
    "the call: sx_accumulate_grads on rank 0, sx_step on rank 1",
    "max_grad_norm: 0 on rank 0, 0.001 on rank 1"};

typedef struct {
    char rv[128];
    int rank;
    sx_status_t phase[kPhases];
    char phase_msg[kPhases][512];
    sx_status_t bad_root, final_step;
    uint64_t final_step_count;
    float final_param, final_grad;
    char failure[512];
} step_ctx;

/* Every element of every param == pv and of every grad == gv, else a note. */
static void check_values(sx_shard_group_t *g, float pv, float gv, step_ctx *c, const char *when) {
    for (int32_t p = 0; p < 2; ++p) {
        for (int grad = 0; grad < 2; ++grad) {
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            sx_status_t s = grad ? sx_grad_view(g, p, &v) : sx_param_view(g, p, &v);
            if (s != SX_OK) {
                note(c->failure, sizeof c->failure, "%s: view failed (%d)", when, s);
                return;
            }
            const float *x = (const float *)v.data;
            const float want = grad ? gv : pv;
            for (uint64_t i = 0; i < v.numel; ++i)
                if (x[i] != want) {
                    note(c->failure, sizeof c->failure,
                         grad ? "%s: a grad changed (rank %d)" : "%s: a param changed (rank %d)", when,
                         c->rank);
                    return;
                }
        }
    }
}

static void fill_all(sx_shard_group_t *g, float pv, float gv) {
    for (int32_t p = 0; p < 2; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        sx_param_view(g, p, &v);
        for (uint64_t i = 0; i < v.numel; ++i) ((float *)v.data)[i] = pv;
        sx_grad_view(g, p, &v);
        for (uint64_t i = 0; i < v.numel; ++i) ((float *)v.data)[i] = gv;
    }
}

static void record(step_ctx *c, int phase, sx_status_t s) {
    c->phase[phase] = s;
    snprintf(c->phase_msg[phase], sizeof c->phase_msg[phase], "%s", sx_last_error_message());
}

static void *step_rank(void *arg) {
    step_ctx *c = (step_ctx *)arg;
    const int r = c->rank;
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = c->rv;
    cfg.rank = r;
    cfg.world_size = WORLD;
    cfg.timeout_ms = 5000;
    cfg.num_threads = 1;
    sx_shard_group_t *g = NULL;
    sx_status_t s = sx_create_shard_group(&cfg, &g);
    if (s != SX_OK) {
        note(c->failure, sizeof c->failure, "create: %s (%d)", sx_last_error_message(), s);
        return NULL;
    }
    sx_param_group_desc_t pgd;
    sx_param_group_desc_init(&pgd, sizeof pgd, SX_OPTIM_SGD);
    pgd.lr = 0.5;
    int32_t pg = -1;
    s = sx_add_param_group(g, &pgd, &pg);
    if (s == SX_OK) s = add_param(g, "w", 30, pg, 0, 0);
    if (s == SX_OK) s = add_param(g, "v", 9, pg, 1, 0);
    if (s == SX_OK) s = sx_finalize(g);
    if (s != SX_OK) {
        note(c->failure, sizeof c->failure, "setup: %s (%d)", sx_last_error_message(), s);
        sx_destroy_shard_group(g);
        return NULL;
    }
    fill_all(g, 1.0f, 1.0f);

    sx_step_options_t o;
    sx_step_options_init(&o, sizeof o);
    sx_step_result_t res;
    sx_step_result_init(&res, sizeof res);

    /* Different max_grad_norm. */
    o.max_grad_norm = r == 0 ? 1.0 : 2.0;
    record(c, kPhaseNorm, sx_step(g, &o, &res));
    check_values(g, 1.0f, 1.0f, c, kPhaseNames[kPhaseNorm]);
    o.max_grad_norm = 0;

    /* Different masks, written through the group's mask pointer on rank 0. */
    uint8_t *mask = NULL;
    int32_t count = 0;
    s = sx_trainable_mask(g, &mask, &count);
    if (s != SX_OK || count != 2) note(c->failure, sizeof c->failure, "%s: sx_trainable_mask (%d)", "mask", s);
    if (r == 0 && mask) mask[1] = 0;
    record(c, kPhaseMask, sx_step(g, &o, &res));
    check_values(g, 1.0f, 1.0f, c, kPhaseNames[kPhaseMask]);
    if (r == 0 && mask) mask[1] = 1;

    /* Different masks through sx_set_trainable on rank 1. */
    if (r == 1) sx_set_trainable(g, 0, 0);
    record(c, kPhaseMaskApi, sx_step(g, &o, &res));
    check_values(g, 1.0f, 1.0f, c, kPhaseNames[kPhaseMaskApi]);
    if (r == 1) sx_set_trainable(g, 0, 1);

    /* Different learning rates. */
    if (r == 1) sx_set_lr(g, pg, 0.25);
    record(c, kPhaseLr, sx_step(g, &o, &res));
    check_values(g, 1.0f, 1.0f, c, kPhaseNames[kPhaseLr]);
    if (r == 1) sx_set_lr(g, pg, 0.5);

    /* Different calls: rank 0 accumulates while rank 1 steps. */
    record(c, kPhaseCall, r == 0 ? sx_accumulate_grads(g) : sx_step(g, &o, &res));
    check_values(g, 1.0f, 1.0f, c, kPhaseNames[kPhaseCall]);

    /* A micro-batch folded into the accumulator (stage 2: grads zeroed), then a step
     * with different max_grad_norm: rejected, and the accumulated gradients survive
     * it (the agreed step below uses them). */
    s = sx_accumulate_grads(g);
    if (s != SX_OK) note(c->failure, sizeof c->failure, "accumulate: %s (%d)", sx_last_error_message(), s);
    check_values(g, 1.0f, 0.0f, c, "after sx_accumulate_grads");
    o.max_grad_norm = r == 0 ? 0.0 : 1e-3;
    record(c, kPhaseAccum, sx_step(g, &o, &res));
    check_values(g, 1.0f, 0.0f, c, kPhaseNames[kPhaseAccum]);
    o.max_grad_norm = 0;

    /* A root that does not exist is rejected on every rank before any communication;
     * an existing one works. */
    c->bad_root = sx_broadcast_params(g, WORLD);
    s = sx_broadcast_params(g, 1);
    if (s != SX_OK) note(c->failure, sizeof c->failure, "broadcast: %s (%d)", sx_last_error_message(), s);

    /* All agree now: a real step, the first one. The accumulated gradient is 1 on both
     * ranks, so their average is 1: p = 1 - 0.5 * 1. */
    c->final_step = sx_step(g, &o, &res);
    c->final_step_count = res.step;
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    sx_param_view(g, 1, &v);
    c->final_param = v.data ? ((float *)v.data)[0] : NAN;
    sx_grad_view(g, 1, &v);
    c->final_grad = v.data ? ((float *)v.data)[0] : NAN;
    s = sx_destroy_shard_group(g);
    if (s != SX_OK) note(c->failure, sizeof c->failure, "destroy: %s (%d)", sx_last_error_message(), s);
    return NULL;
}

static void test_step_mismatch(void **state) {
    (void)state;
    step_ctx ctx[WORLD];
    pthread_t t[WORLD];
    memset(ctx, 0, sizeof ctx);
    char rv[128];
    api_unique_rendezvous(rv, sizeof rv);
    for (int r = 0; r < WORLD; ++r) {
        snprintf(ctx[r].rv, sizeof ctx[r].rv, "%s", rv);
        ctx[r].rank = r;
        assert_int_equal(pthread_create(&t[r], NULL, step_rank, &ctx[r]), 0);
    }
    for (int r = 0; r < WORLD; ++r) assert_int_equal(pthread_join(t[r], NULL), 0);
    for (int r = 0; r < WORLD; ++r) {
        const step_ctx *c = &ctx[r];
        if (c->failure[0]) fail_msg("rank %d: %s", r, c->failure);
        for (int p = 0; p < kPhases; ++p) {
            if (c->phase[p] != SX_ERR_MISMATCH)
                fail_msg("rank %d, different %s: returned %d (%s), expected SX_ERR_MISMATCH", r,
                         kPhaseNames[p], c->phase[p], c->phase_msg[p]);
            const char *fn = (p == kPhaseCall && r == 0) ? "sx_accumulate_grads:" : "sx_step:";
            if (strncmp(c->phase_msg[p], fn, strlen(fn)) != 0 || strstr(c->phase_msg[p], "disagree") == NULL)
                fail_msg("rank %d, different %s: message \"%s\" does not say ranks disagree", r,
                         kPhaseNames[p], c->phase_msg[p]);
            if (strstr(c->phase_msg[p], kPhaseWords[p]) == NULL)
                fail_msg("rank %d, different %s: message \"%s\" does not say \"%s\"", r, kPhaseNames[p],
                         c->phase_msg[p], kPhaseWords[p]);
        }
        assert_int_equal(c->bad_root, SX_ERR_INVALID_ARGUMENT);
        if (c->final_step != SX_OK) fail_msg("rank %d: the agreed step returned %d", r, c->final_step);
        /* None of the rejected steps counted. */
        assert_int_equal(c->final_step_count, 1);
        /* The accumulated gradient (1 on each rank, averaged: 1) went into the step. */
        assert_true(fabsf(c->final_param - 0.5f) < 1e-6f);
        assert_true(c->final_grad == 0.0f);
    }
}

/* ---------------------------------------------------------------------------------
 * sx_abort while a collective is in flight
 * ------------------------------------------------------------------------------- */

typedef struct {
    char rv[128];
    int rank;
    sx_shard_group_t *group; /* rank 0's, for the main thread's sx_abort */
    volatile int ready;      /* set (under `mu`) once the group is finalized */
    volatile int stepping;   /* rank 0: about to enter sx_step */
    volatile int release;    /* rank 1: the main thread says it may destroy */
    pthread_mutex_t *mu;
    sx_status_t step, later, destroy;
    double step_seconds;
    char step_msg[512], later_msg[512], failure[512];
} abort_ctx;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int read_flag(pthread_mutex_t *mu, volatile int *flag) {
    pthread_mutex_lock(mu);
    int v = *flag;
    pthread_mutex_unlock(mu);
    return v;
}

static void set_flag(pthread_mutex_t *mu, volatile int *flag) {
    pthread_mutex_lock(mu);
    *flag = 1;
    pthread_mutex_unlock(mu);
}

static void *abort_rank(void *arg) {
    abort_ctx *c = (abort_ctx *)arg;
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = c->rv;
    cfg.rank = c->rank;
    cfg.world_size = WORLD;
    cfg.timeout_ms = 5000;
    cfg.num_threads = 1;
    sx_shard_group_t *g = NULL;
    sx_status_t s = sx_create_shard_group(&cfg, &g);
    if (s == SX_OK) s = add_group(g, SX_OPTIM_SGD);
    if (s == SX_OK) s = add_param(g, "w", 16, 0, 0, 0);
    if (s == SX_OK) s = sx_finalize(g);
    if (s != SX_OK) {
        note(c->failure, sizeof c->failure, "setup: %s (%d)", sx_last_error_message(), s);
        sx_destroy_shard_group(g);
        set_flag(c->mu, &c->ready);
        return NULL;
    }
    pthread_mutex_lock(c->mu);
    c->group = g;
    c->ready = 1;
    pthread_mutex_unlock(c->mu);
    if (c->rank == 0) {
        /* Rank 1 never steps: this step waits for it until the main thread aborts. */
        set_flag(c->mu, &c->stepping);
        const double t0 = now_seconds();
        c->step = sx_step(g, NULL, NULL);
        c->step_seconds = now_seconds() - t0;
        snprintf(c->step_msg, sizeof c->step_msg, "%s", sx_last_error_message());
        c->later = sx_step(g, NULL, NULL);
        snprintf(c->later_msg, sizeof c->later_msg, "%s", sx_last_error_message());
    } else {
        while (!read_flag(c->mu, &c->release)) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    c->destroy = sx_destroy_shard_group(g);
    return NULL;
}

static void test_abort_in_flight(void **state) {
    (void)state;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    abort_ctx ctx[WORLD];
    pthread_t t[WORLD];
    memset(ctx, 0, sizeof ctx);
    char rv[128];
    api_unique_rendezvous(rv, sizeof rv);
    for (int r = 0; r < WORLD; ++r) {
        snprintf(ctx[r].rv, sizeof ctx[r].rv, "%s", rv);
        ctx[r].rank = r;
        ctx[r].mu = &mu;
        ctx[r].destroy = -1;
        assert_int_equal(pthread_create(&t[r], NULL, abort_rank, &ctx[r]), 0);
    }
    /* Wait until rank 0 is about to block in sx_step, give it time to get into the
     * collective, then abort its group from this thread. */
    while (!read_flag(&mu, &ctx[0].stepping) && !(read_flag(&mu, &ctx[0].ready) && ctx[0].failure[0])) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    sx_status_t aborted = SX_ERR_INTERNAL;
    if (ctx[0].failure[0] == '\0') {
        struct timespec ts = {0, 300000000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&mu);
        sx_shard_group_t *g0 = ctx[0].group;
        pthread_mutex_unlock(&mu);
        aborted = sx_abort(g0);
    }
    assert_int_equal(pthread_join(t[0], NULL), 0);
    set_flag(&mu, &ctx[1].release);
    assert_int_equal(pthread_join(t[1], NULL), 0);
    for (int r = 0; r < WORLD; ++r)
        if (ctx[r].failure[0]) fail_msg("rank %d: %s", r, ctx[r].failure);
    assert_int_equal(aborted, SX_OK);
    /* The collective in flight: SX_ERR_ABORTED, long before the 5 s timeout. */
    if (ctx[0].step != SX_ERR_ABORTED)
        fail_msg("the step in flight returned %d (%s), expected SX_ERR_ABORTED", ctx[0].step, ctx[0].step_msg);
    assert_true(strncmp(ctx[0].step_msg, "sx_step:", 8) == 0);
    assert_true(ctx[0].step_seconds < 3.0);
    /* Later calls: SX_ERR_GROUP_FAILED. */
    if (ctx[0].later != SX_ERR_GROUP_FAILED)
        fail_msg("a call after the abort returned %d (%s), expected SX_ERR_GROUP_FAILED", ctx[0].later,
                 ctx[0].later_msg);
    /* Both groups are destroyed cleanly, the aborted one and its stranded peer. */
    assert_int_equal(ctx[0].destroy, SX_OK);
    assert_int_equal(ctx[1].destroy, SX_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finalize_mismatch),
        cmocka_unit_test(test_step_mismatch),
        cmocka_unit_test(test_abort_in_flight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
