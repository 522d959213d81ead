/*
 * The bindings' sample in C: a linear regression trained by 4 ranks (threads of this
 * process) with ZeRO-2 AdamW. samples/LINREG.md specifies every number, so that the
 * same loop in Rust, Go, Python or Julia produces the same losses to the last bit and
 * their checkpoints can be exchanged.
 *
 * usage: train_linreg [--steps N] [--save DIR] [--load DIR]
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sx/sx.h"

#define RANKS 4
#define OUT 8
#define IN 16
#define BATCH 4

static int g_steps = 20;
static const char *g_save, *g_load;
static char g_rendezvous[64];

typedef struct {
    uint64_t state;
} rng_t;

static double rng_next(rng_t *r) {
    r->state = r->state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(r->state >> 11) * 0x1p-53 * 2.0 - 1.0;
}

typedef struct {
    int rank;
    int failed;
} rank_ctx_t;

#define CHECK(call)                                                                          \
    do {                                                                                     \
        sx_status_t s_ = (call);                                                             \
        if (s_ != SX_OK) {                                                                   \
            fprintf(stderr, "rank %d: %s failed: %s\n  %s\n", ctx->rank, #call,              \
                    sx_status_string(s_), sx_last_error_message());                          \
            ctx->failed = 1;                                                                 \
            goto out;                                                                        \
        }                                                                                    \
    } while (0)

static void *run_rank(void *arg) {
    rank_ctx_t *ctx = arg;
    sx_shard_group_t *g = NULL;
    sx_future_t *fut = NULL;
    double teacher_w[OUT][IN], teacher_b[OUT];
    rng_t teacher = {7};
    for (int i = 0; i < OUT; i++)
        for (int j = 0; j < IN; j++) teacher_w[i][j] = rng_next(&teacher);
    for (int i = 0; i < OUT; i++) teacher_b[i] = rng_next(&teacher);

    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.rendezvous = g_rendezvous;
    cfg.rank = ctx->rank;
    cfg.world_size = RANKS;
    cfg.stage = 2;
    cfg.backend = SX_BACKEND_CPU; /* the model computes on the host, in the views */
    cfg.num_threads = 1;
    CHECK(sx_create_shard_group(&cfg, &g));

    sx_param_group_desc_t adamw;
    sx_param_group_desc_init(&adamw, sizeof adamw, SX_OPTIM_ADAMW);
    adamw.lr = 0.05;
    CHECK(sx_add_param_group(g, &adamw, NULL));
    int64_t w_shape[2] = {OUT, IN}, b_shape[1] = {OUT};
    sx_param_desc_t d;
    sx_param_desc_init(&d, sizeof d);
    d.name = "w", d.ndim = 2, d.shape = w_shape, d.unit = 0;
    CHECK(sx_add_param(g, &d, NULL));
    d.name = "b", d.ndim = 1, d.shape = b_shape, d.unit = 1;
    CHECK(sx_add_param(g, &d, NULL));
    CHECK(sx_finalize(g));

    sx_view_t wv, bv, dwv, dbv;
    sx_view_init(&wv, sizeof wv);
    sx_view_init(&bv, sizeof bv);
    sx_view_init(&dwv, sizeof dwv);
    sx_view_init(&dbv, sizeof dbv);
    CHECK(sx_param_view(g, 0, &wv));
    CHECK(sx_param_view(g, 1, &bv));
    CHECK(sx_grad_view(g, 0, &dwv));
    CHECK(sx_grad_view(g, 1, &dbv));
    float *w = wv.data, *b = bv.data, *dw = dwv.data, *db = dbv.data;

    uint64_t step = 0;
    if (g_load) {
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = g_load;
        CHECK(sx_load_optim_state(g, &lo));
        unsigned char blob[8];
        uint64_t size = 0;
        CHECK(sx_read_user_blob(g_load, blob, sizeof blob, &size));
        if (size != 8) {
            fprintf(stderr, "rank %d: %s: user blob is %" PRIu64 " bytes, expected 8\n",
                    ctx->rank, g_load, size);
            ctx->failed = 1;
            goto out;
        }
        for (int k = 7; k >= 0; k--) step = step << 8 | blob[k];
    } else {
        rng_t init = {1};
        for (int k = 0; k < OUT * IN; k++) w[k] = (float)(0.1 * rng_next(&init));
        for (int i = 0; i < OUT; i++) b[i] = (float)(0.1 * rng_next(&init));
    }

    for (int it = 0; it < g_steps; it++, step++) {
        double gw[OUT][IN] = {{0}}, gb[OUT] = {0}, loss = 0;
        rng_t data = {step * 4096 + (uint64_t)ctx->rank * 64 + 1};
        for (int n = 0; n < BATCH; n++) {
            double x[IN];
            for (int j = 0; j < IN; j++) x[j] = rng_next(&data);
            for (int i = 0; i < OUT; i++) {
                double y = (double)b[i], t = teacher_b[i];
                for (int j = 0; j < IN; j++) {
                    y += (double)w[i * IN + j] * x[j];
                    t += teacher_w[i][j] * x[j];
                }
                double diff = y - t;
                loss += diff * diff / (OUT * BATCH);
                double dd = 2.0 * diff / (OUT * BATCH);
                for (int j = 0; j < IN; j++) gw[i][j] += dd * x[j];
                gb[i] += dd;
            }
        }
        for (int i = 0; i < OUT; i++) {
            for (int j = 0; j < IN; j++) dw[i * IN + j] = (float)gw[i][j];
            db[i] = (float)gb[i];
        }
        if (ctx->rank == 0) {
            uint64_t bits;
            memcpy(&bits, &loss, sizeof bits);
            printf("step %" PRIu64 " loss %.6f bits %016" PRIx64 "\n", step, loss, bits);
            fflush(stdout);
        }
        CHECK(sx_step(g, NULL, NULL));
    }

    if (g_save) {
        unsigned char blob[8];
        for (int k = 0; k < 8; k++) blob[k] = (unsigned char)(step >> (8 * k));
        sx_save_options_t so;
        sx_save_options_init(&so, sizeof so);
        so.path = g_save;
        so.user_blob = blob;
        so.user_blob_size = sizeof blob;
        CHECK(sx_save_optim_state(g, &so, &fut));
        CHECK(sx_future_wait(fut, -1));
        if (ctx->rank == 0) printf("saved %s\n", g_save);
    }
out:
    sx_future_destroy(fut);
    sx_destroy_shard_group(g);
    return NULL;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            g_steps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--save") && i + 1 < argc) {
            g_save = argv[++i];
        } else if (!strcmp(argv[i], "--load") && i + 1 < argc) {
            g_load = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--steps N] [--save DIR] [--load DIR]\n", argv[0]);
            return 2;
        }
    }
    snprintf(g_rendezvous, sizeof g_rendezvous, "local://linreg-%ld", (long)getpid());
    pthread_t threads[RANKS];
    rank_ctx_t ctx[RANKS];
    for (int r = 0; r < RANKS; r++) {
        ctx[r] = (rank_ctx_t){.rank = r};
        pthread_create(&threads[r], NULL, run_rank, &ctx[r]);
    }
    int failed = 0;
    for (int r = 0; r < RANKS; r++) {
        pthread_join(threads[r], NULL);
        failed |= ctx[r].failed;
    }
    return failed ? 1 : 0;
}
