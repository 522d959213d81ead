/*
 * sx sample: a trainer that splits its model itself (Megatron-style tensor parallelism)
 * and lets sx shard each slice over its data-parallel ranks.
 *
 * Model (the logical one): y = fc2(gelu(fc1(layernorm(x)))), with x of D_IN = 8 values,
 * a hidden layer of HIDDEN = 16 and D_OUT = 4 outputs, loss 0.5 |y - target|^2 averaged
 * over the batch. Tensor-parallel rank t of TP = 2 holds half of the hidden units:
 *   fc1.weight [16, 8]  rows 8t..8t+7     column-parallel: SX_PLACEMENT_SPLIT on dim 0
 *   fc1.bias   [16]     the same rows     SX_PLACEMENT_SPLIT on dim 0
 *   fc2.weight [4, 16]  columns 8t..8t+7  row-parallel: SX_PLACEMENT_SPLIT on dim 1
 *   ln.weight, ln.bias [8], fc2.bias [4]  on both: SX_PLACEMENT_REPLICATED, copy t of 2
 * The forward sums the two slices' partial outputs of fc2 (an all-reduce over the
 * tensor-parallel pair), and the backward sums their partial gradients of fc1's input
 * (another), as Megatron's MLP does; those exchanges are the trainer's own, made here
 * with sx_all_reduce on a group of the pair that holds no params.
 *
 * Ranks: TP = 2 x DP = 2 = 4 processes (forked, meeting over tcp:// on 127.0.0.1).
 * Process r is tensor-parallel rank t = r % 2 and data-parallel rank d = r / 2. Each
 * slice's data-parallel ranks form one sx group (ZeRO-2 AdamW, two param groups: weight
 * decay on the matrices only), which reduces that slice's gradients and updates it. The
 * two groups are joined into one norm domain (sx_create_norm_domain,
 * sx_join_norm_domain), so that clipping (max_grad_norm 0.05, below every step's norm:
 * every step clips) takes the norm of the whole model, each replicated param counted
 * once. The data are synthetic and deterministic: example e of step s is a function of
 * (s, e), the global batch is GLOBAL_BATCH examples, data-parallel rank d takes its half.
 *
 * What it proves, and prints:
 *  (a) the losses, gradient norms and final params of the 4 processes equal those of one
 *      process training the unsharded model (one group of world size 1, whole params, the
 *      whole batch, the same clipping and optimizer) within a relative 1e-6 (each loss
 *      and norm against its own value; each param's largest difference against its
 *      largest magnitude: AdamW moves every element by about lr whatever its size, so
 *      the last bits of the updates, which differ with the order of the sums, are
 *      compared with the tensor's scale, not with an element that happens to be near 0);
 *  (b) each slice's group saves a checkpoint at step SAVE_AT (DIR/ckpt/tp0/step-10 and
 *      DIR/ckpt/tp1/step-10), and 2 processes, TP = 2 x DP = 1 (each slice's group of one
 *      rank, each on the whole batch), resume from them and train to the end: equal to the
 *      uninterrupted run (the same 1e-6);
 *  (c) with --resume-joined JOINED: a checkpoint of the logical model, joined from the
 *      slices' checkpoints by `sxckpt join JOINED DIR/ckpt/tp0/step-10
 *      DIR/ckpt/tp1/step-10`, resumes at TP = 1 x DP = 2 (the unsharded model in one group
 *      of 2 processes) to the end, equal to the uninterrupted run that `--dir DIR` wrote.
 * The program fails (exit status 1) where a difference is above 1e-6. DIR/uninterrupted
 * records the TP = 2 x DP = 2 run for (c) and for samples/python/compare_tp_mlp_torch.py
 * (the same model under torch's DTensor and FSDP2): STEPS losses and STEPS gradient
 * norms (doubles), then the params in k_names' order, row-major (floats), in the
 * machine's byte order (summary_t).
 *
 * usage: train_tp_mlp [--dir DIR]                (a) and (b); DIR kept (default: a
 *                                                temporary directory, removed)
 *        train_tp_mlp --dir DIR --resume-joined JOINED    (c), after a run with --dir DIR
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sx/sx.h"

#define TP 2
#define DP 2
#define D_IN 8
#define HIDDEN 16
#define D_OUT 4
#define GLOBAL_BATCH 8
#define STEPS 20
#define SAVE_AT 10
#define MAX_GRAD_NORM 0.05
#define LR 1e-2
#define WEIGHT_DECAY 0.1
#define LN_EPS 1e-5
#define TOLERANCE 1e-6
#define MAX_RANKS (TP * DP)

/* The logical params, and where each lies in a flat array of the whole model. */
enum { P_LN_W, P_LN_B, P_FC1_W, P_FC1_B, P_FC2_W, P_FC2_B, NUM_PARAMS };
static const char *const k_names[NUM_PARAMS] = {"ln.weight", "ln.bias",   "fc1.weight",
                                                "fc1.bias",  "fc2.weight", "fc2.bias"};
static const int k_numel[NUM_PARAMS] = {D_IN, D_IN, HIDDEN * D_IN, HIDDEN, D_OUT * HIDDEN, D_OUT};
#define MODEL_NUMEL (2 * D_IN + HIDDEN * D_IN + HIDDEN + D_OUT * HIDDEN + D_OUT)

static int model_offset(int p) {
    int off = 0;
    for (int q = 0; q < p; ++q) off += k_numel[q];
    return off;
}

/* What one rank does. */
typedef struct {
    int tp, t;          /* tensor-parallel degree and rank */
    int dp, d;          /* data-parallel size and rank */
    int first_step;     /* 0, or the step a resume starts at */
    char load[512];     /* the checkpoint to resume from ("": none) */
    char save[512];     /* where to save at SAVE_AT ("": nowhere) */
    char rv_group[96];  /* rendezvous of this slice's data-parallel group */
    char rv_pair[96];   /* ... of this data-parallel rank's tensor-parallel pair (tp > 1) */
    char rv_domain[96]; /* ... of the norm domain (tp > 1) */
} rank_plan_t;

/* What it saw, written into memory shared with the parent. */
typedef struct {
    int failed;
    int clipped_every_step;       /* every step's norm was above MAX_GRAD_NORM */
    double loss_sum[STEPS];       /* the sum of its examples' losses at each step */
    double norm[STEPS];           /* sx_step's gradient norm (before clipping) */
    float model[MODEL_NUMEL];     /* its pieces at their places in the whole model, after the last step */
    unsigned char have[MODEL_NUMEL]; /* 1 where it holds the element */
} rank_out_t;

/* A run's outcome: the global batch's mean loss and the norm at each step, the model. */
typedef struct {
    double loss[STEPS];
    double norm[STEPS];
    float model[MODEL_NUMEL];
} summary_t;

#define CHECK(call)                                                                            \
    do {                                                                                       \
        sx_status_t s_ = (call);                                                               \
        if (s_ != SX_OK) {                                                                     \
            fprintf(stderr, "tp rank %d, dp rank %d: %s failed: %s\n  %s\n", plan->t, plan->d, \
                    #call, sx_status_string(s_), sx_last_error_message());                     \
            out->failed = 1;                                                                   \
            goto done;                                                                         \
        }                                                                                      \
    } while (0)

/* ---- data and initial values: functions of logical indices, the same on every rank ---- */

static double input(int step, int e, int k) { return sin(1.3 * (step + 1) + 0.7 * e + 1.1 * k) * (1.0 + 0.25 * k); }

/* The target: a fixed "teacher" of the input, plus a part no model of the input can
 * fit (so that the loss, and the gradients, stay well away from 0). */
static double target(int step, int e, int o) {
    double a = 0.0;
    for (int k = 0; k < D_IN; ++k) a += cos(0.8 * o + 0.3 * k) * input(step, e, k);
    return tanh(0.3 * a) + 0.5 * cos(2.3 * step + 1.7 * e + 0.9 * o);
}

static double init_value(int p, int i, int j) { /* element [i][j] ([i] for vectors) */
    switch (p) {
    case P_LN_W: return 1.0 + 0.1 * sin(1.0 * i);
    case P_LN_B: return 0.05 * cos(1.0 * i);
    case P_FC1_W: return 0.35 * sin(0.9 * i + 0.5 * j + 0.1);
    case P_FC1_B: return 0.02 * sin(2.0 * i);
    case P_FC2_W: return 0.25 * cos(0.7 * i + 0.3 * j + 0.2);
    default: return 0.1 * (i + 1) - 0.2;
    }
}

/* ---- the model on one rank: its pieces, forward and backward in double ---- */

typedef struct {
    int hs, h0; /* this rank's hidden units: [h0, h0 + hs) */
    float *p[NUM_PARAMS], *g[NUM_PARAMS]; /* views: fc1 [hs, D_IN], fc1.bias [hs], fc2 [D_OUT, hs] */
} model_t;

static double gelu(double a) { return 0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a))); }

static double gelu_grad(double a) {
    const double c = 0.7978845608028654, th = tanh(c * (a + 0.044715 * a * a * a));
    return 0.5 * (1.0 + th) + 0.5 * a * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * a * a);
}

/* One step's activations for up to GLOBAL_BATCH examples. */
typedef struct {
    int n, first; /* examples first .. first + n - 1 of the global batch */
    double xhat[GLOBAL_BATCH][D_IN], z[GLOBAL_BATCH][D_IN];
    double a[GLOBAL_BATCH][HIDDEN], h[GLOBAL_BATCH][HIDDEN];
    double y[GLOBAL_BATCH][D_OUT], dz[GLOBAL_BATCH][D_IN];
} acts_t;

/* Sums values over the tensor-parallel pair (pair NULL: one slice, nothing to sum). */
static sx_status_t pair_sum(sx_shard_group_t *pair, double *values, int count) {
    for (int i = 0; pair && i < count; i += SX_MAX_ALL_REDUCE) {
        const int n = count - i < SX_MAX_ALL_REDUCE ? count - i : SX_MAX_ALL_REDUCE;
        sx_status_t s = sx_all_reduce(pair, values + i, n, SX_REDUCE_SUM);
        if (s != SX_OK) return s;
    }
    return SX_OK;
}

/* Forward of step `step`: layer norm (replicated), fc1 on this rank's hidden units,
 * gelu, fc2's partial sums over them, summed over the pair, plus fc2.bias. Returns the
 * sum of the examples' losses in *loss. */
static sx_status_t forward(const model_t *m, sx_shard_group_t *pair, int step, acts_t *b, double *loss) {
    for (int i = 0; i < b->n; ++i) {
        const int e = b->first + i;
        double mu = 0.0, var = 0.0;
        for (int k = 0; k < D_IN; ++k) mu += input(step, e, k);
        mu /= D_IN;
        for (int k = 0; k < D_IN; ++k) var += (input(step, e, k) - mu) * (input(step, e, k) - mu);
        const double rstd = 1.0 / sqrt(var / D_IN + LN_EPS);
        for (int k = 0; k < D_IN; ++k) {
            b->xhat[i][k] = (input(step, e, k) - mu) * rstd;
            b->z[i][k] = m->p[P_LN_W][k] * b->xhat[i][k] + m->p[P_LN_B][k];
        }
        for (int j = 0; j < m->hs; ++j) {
            double a = m->p[P_FC1_B][j];
            for (int k = 0; k < D_IN; ++k) a += (double)m->p[P_FC1_W][j * D_IN + k] * b->z[i][k];
            b->a[i][j] = a;
            b->h[i][j] = gelu(a);
        }
        for (int o = 0; o < D_OUT; ++o) {
            double y = 0.0;
            for (int j = 0; j < m->hs; ++j) y += (double)m->p[P_FC2_W][o * m->hs + j] * b->h[i][j];
            b->y[i][o] = y;
        }
    }
    sx_status_t s = pair_sum(pair, &b->y[0][0], b->n * D_OUT); /* row-parallel fc2: sum the slices */
    *loss = 0.0;
    for (int i = 0; i < b->n; ++i)
        for (int o = 0; o < D_OUT; ++o) {
            b->y[i][o] += m->p[P_FC2_B][o];
            const double r = b->y[i][o] - target(step, b->first + i, o);
            *loss += 0.5 * r * r;
        }
    return s;
}

/* Backward of the mean loss over the rank's examples: writes the gradients of its pieces
 * (computed in double, rounded once) into sx's grad views. fc1's input gradient is a sum
 * over all hidden units: each slice's part is summed over the pair before the layer
 * norm's params take it. */
static sx_status_t backward(model_t *m, sx_shard_group_t *pair, int step, acts_t *b) {
    double g1[HIDDEN * D_IN] = {0}, gb1[HIDDEN] = {0}, g2[D_OUT * HIDDEN] = {0}, gb2[D_OUT] = {0};
    double gw[D_IN] = {0}, gb[D_IN] = {0};
    for (int i = 0; i < b->n; ++i) {
        double dy[D_OUT];
        for (int o = 0; o < D_OUT; ++o) {
            dy[o] = (b->y[i][o] - target(step, b->first + i, o)) / b->n;
            gb2[o] += dy[o];
            for (int j = 0; j < m->hs; ++j) g2[o * m->hs + j] += dy[o] * b->h[i][j];
        }
        for (int k = 0; k < D_IN; ++k) b->dz[i][k] = 0.0;
        for (int j = 0; j < m->hs; ++j) {
            double dh = 0.0;
            for (int o = 0; o < D_OUT; ++o) dh += (double)m->p[P_FC2_W][o * m->hs + j] * dy[o];
            const double da = dh * gelu_grad(b->a[i][j]);
            gb1[j] += da;
            for (int k = 0; k < D_IN; ++k) {
                g1[j * D_IN + k] += da * b->z[i][k];
                b->dz[i][k] += (double)m->p[P_FC1_W][j * D_IN + k] * da;
            }
        }
    }
    sx_status_t s = pair_sum(pair, &b->dz[0][0], b->n * D_IN); /* column-parallel fc1: sum the slices */
    for (int i = 0; i < b->n; ++i)
        for (int k = 0; k < D_IN; ++k) {
            gw[k] += b->dz[i][k] * b->xhat[i][k];
            gb[k] += b->dz[i][k];
        }
    const double *grads[NUM_PARAMS] = {gw, gb, g1, gb1, g2, gb2};
    const int numel[NUM_PARAMS] = {D_IN, D_IN, m->hs * D_IN, m->hs, D_OUT * m->hs, D_OUT};
    for (int p = 0; p < NUM_PARAMS; ++p)
        for (int e = 0; e < numel[p]; ++e) m->g[p][e] = (float)grads[p][e];
    return s;
}

/* ---- one rank ---- */

/* Registers this rank's pieces (whole params where tp == 1) in two param groups. */
static sx_status_t add_params(sx_shard_group_t *g, const rank_plan_t *plan, int decay, int no_decay) {
    const int hs = HIDDEN / plan->tp, h0 = plan->t * hs;
    const int64_t shapes[NUM_PARAMS][2] = {{D_IN}, {D_IN}, {hs, D_IN}, {hs}, {D_OUT, hs}, {D_OUT}};
    const int64_t globals[NUM_PARAMS][2] = {{D_IN}, {D_IN}, {HIDDEN, D_IN}, {HIDDEN}, {D_OUT, HIDDEN}, {D_OUT}};
    const int split_dim[NUM_PARAMS] = {-1, -1, 0, 0, 1, -1}; /* -1: replicated */
    for (int p = 0; p < NUM_PARAMS; ++p) {
        sx_param_desc_t desc;
        sx_param_desc_init(&desc, sizeof desc);
        desc.name = k_names[p];
        desc.ndim = p == P_FC1_W || p == P_FC2_W ? 2 : 1;
        desc.shape = shapes[p];
        desc.param_group = p == P_FC1_W || p == P_FC2_W ? decay : no_decay;
        if (plan->tp > 1 && split_dim[p] >= 0) {
            desc.placement = SX_PLACEMENT_SPLIT;
            desc.split_dim = split_dim[p];
            desc.global_shape = globals[p];
            desc.split_offset = h0;
        } else if (plan->tp > 1) {
            desc.placement = SX_PLACEMENT_REPLICATED;
            desc.replica = plan->t;
            desc.replicas = plan->tp;
        }
        sx_status_t s = sx_add_param(g, &desc, NULL);
        if (s != SX_OK) return s;
    }
    return SX_OK;
}

/* Element e of param p's piece on this rank: its (row, column) in the logical tensor. */
static void logical_index(const model_t *m, int p, int e, int *i, int *j) {
    *j = 0;
    if (p == P_FC1_W) {
        *i = m->h0 + e / D_IN;
        *j = e % D_IN;
    } else if (p == P_FC2_W) {
        *i = e / m->hs;
        *j = m->h0 + e % m->hs;
    } else {
        *i = p == P_FC1_B ? m->h0 + e : e;
    }
}

static int piece_numel(const model_t *m, int p) {
    return p == P_FC1_W ? m->hs * D_IN : p == P_FC1_B ? m->hs : p == P_FC2_W ? D_OUT * m->hs : k_numel[p];
}

/* Trains plan's steps; every rank writes what it saw into *out. */
static void run_rank(const rank_plan_t *plan, rank_out_t *out) {
    sx_shard_group_t *g = NULL, *pair = NULL;
    sx_norm_domain_t *domain = NULL;
    acts_t *b = calloc(1, sizeof *b);
    model_t m;
    memset(&m, 0, sizeof m);
    m.hs = HIDDEN / plan->tp;
    m.h0 = plan->t * m.hs;
    out->clipped_every_step = 1;
    if (!b) {
        out->failed = 1;
        return;
    }

    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = plan->rv_group;
    cfg.rank = plan->d;
    cfg.world_size = plan->dp;
    cfg.stage = 2;
    cfg.timeout_ms = 60000;
    cfg.num_threads = 1;
    CHECK(sx_create_shard_group(&cfg, &g));
    sx_param_group_desc_t decay, no_decay;
    sx_param_group_desc_init(&decay, sizeof decay, SX_OPTIM_ADAMW);
    decay.lr = LR;
    decay.weight_decay = WEIGHT_DECAY;
    no_decay = decay;
    no_decay.weight_decay = 0.0;
    int32_t pg_decay, pg_no_decay;
    CHECK(sx_add_param_group(g, &decay, &pg_decay));
    CHECK(sx_add_param_group(g, &no_decay, &pg_no_decay));
    CHECK(add_params(g, plan, pg_decay, pg_no_decay));
    CHECK(sx_finalize(g));
    if (plan->tp > 1) {
        /* The pair of this data-parallel rank, for the activations' sums... */
        sx_group_config_t pc = cfg;
        pc.rendezvous = plan->rv_pair;
        pc.rank = plan->t;
        pc.world_size = plan->tp;
        CHECK(sx_create_shard_group(&pc, &pair));
        /* ... and the norm domain over every rank, which this slice's group joins. */
        sx_group_config_t dc = cfg;
        dc.rendezvous = plan->rv_domain;
        dc.rank = plan->d * plan->tp + plan->t;
        dc.world_size = plan->tp * plan->dp;
        CHECK(sx_create_norm_domain(&dc, &domain));
        CHECK(sx_join_norm_domain(g, domain, plan->t));
    }
    for (int p = 0; p < NUM_PARAMS; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        CHECK(sx_param_view(g, p, &v));
        m.p[p] = v.data;
        CHECK(sx_grad_view(g, p, &v));
        m.g[p] = v.data;
        for (int e = 0; e < piece_numel(&m, p); ++e) { /* every rank writes the same values */
            int i, j;
            logical_index(&m, p, e, &i, &j);
            m.p[p][e] = (float)init_value(p, i, j);
        }
    }
    if (plan->load[0]) {
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = plan->load;
        CHECK(sx_load_optim_state(g, &lo));
        for (int32_t pg = 0; pg < 2; ++pg) { /* the checkpoint's step counts came back */
            int64_t steps = -1;
            CHECK(sx_get_param_group_steps(g, pg, &steps));
            if (steps != plan->first_step) {
                fprintf(stderr, "after loading %s, param group %d has taken %lld steps, not %d\n", plan->load, pg,
                        (long long)steps, plan->first_step);
                out->failed = 1;
                goto done;
            }
        }
    }

    sx_step_options_t so;
    sx_step_options_init(&so, sizeof so);
    so.max_grad_norm = MAX_GRAD_NORM;
    b->n = GLOBAL_BATCH / plan->dp;
    b->first = plan->d * b->n;
    for (int step = plan->first_step; step < STEPS; ++step) {
        CHECK(forward(&m, pair, step, b, &out->loss_sum[step]));
        CHECK(backward(&m, pair, step, b));
        sx_step_result_t r;
        sx_step_result_init(&r, sizeof r);
        CHECK(sx_step(g, &so, &r));
        out->norm[step] = r.grad_norm;
        if (!(r.grad_norm > MAX_GRAD_NORM)) out->clipped_every_step = 0;
        if (plan->save[0] && step + 1 == SAVE_AT) {
            sx_save_options_t sv;
            sx_save_options_init(&sv, sizeof sv);
            sv.path = plan->save;
            sv.synchronous = 1;
            sx_future_t *f = NULL;
            CHECK(sx_save_optim_state(g, &sv, &f));
            const sx_status_t saved = sx_future_wait(f, -1);
            if (saved != SX_OK) fprintf(stderr, "save to %s: %s\n", plan->save, sx_future_error_message(f));
            sx_future_destroy(f);
            CHECK(saved);
        }
    }
    for (int p = 0; p < NUM_PARAMS; ++p)
        for (int e = 0; e < piece_numel(&m, p); ++e) {
            int i, j;
            logical_index(&m, p, e, &i, &j);
            const int at = model_offset(p) + (p == P_FC1_W ? i * D_IN + j : p == P_FC2_W ? i * HIDDEN + j : i);
            out->model[at] = m.p[p][e];
            out->have[at] = 1;
        }

done:
    sx_destroy_shard_group(g);
    sx_destroy_shard_group(pair);
    sx_destroy_norm_domain(domain);
    free(b);
}

/* ---- the ranks as processes ---- */

/* A TCP port on 127.0.0.1 for a rendezvous, free a moment ago. It is taken below the
 * kernel's ephemeral range (which every outgoing connection draws from, so that none
 * takes it before the rank binds it), and claimed through a lock on a file named after it
 * in /tmp/sx-test-ports, held until this program exits, as sx's own tests claim theirs:
 * programs run side by side never choose the same one. */
static int free_port(void) {
    static unsigned seed;
    if (!seed) seed = (unsigned)getpid() * 2654435761u;
    mkdir("/tmp/sx-test-ports", 01777);
    for (int attempt = 0; attempt < 500; ++attempt) {
        seed = seed * 1103515245u + 12345u;
        const int port = 20000 + (int)((seed >> 8) % 12000); /* 20000..31999 */
        char path[64];
        snprintf(path, sizeof path, "/tmp/sx-test-ports/%d", port);
        const int lock = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0666);
        if (lock < 0) break;
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons((uint16_t)port);
        const int one = 1;
        if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        const int ok = flock(lock, LOCK_EX | LOCK_NB) == 0 && fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        if (fd >= 0) close(fd);
        if (ok) return port; /* the lock stays held: `lock` stays open */
        close(lock);
    }
    return 0;
}

static void tcp_rendezvous(char *out, size_t size) { snprintf(out, size, "tcp://127.0.0.1:%d", free_port()); }

/* Runs plans[0..n) as forked processes; out[] is shared memory. 0 if all succeeded. */
static int run_processes(const rank_plan_t *plans, int n, rank_out_t *out) {
    pid_t pids[MAX_RANKS];
    memset(out, 0, sizeof *out * (size_t)n);
    fflush(stdout);
    for (int r = 0; r < n; ++r) {
        pids[r] = fork();
        if (pids[r] == 0) {
            run_rank(&plans[r], &out[r]);
            _exit(out[r].failed ? 1 : 0);
        }
        if (pids[r] < 0) return 1;
    }
    int failed = 0;
    for (int r = 0; r < n; ++r) {
        int status = 0;
        if (waitpid(pids[r], &status, 0) != pids[r] || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
    }
    return failed;
}

/* One plan per process of a TP x DP run; r = d * tp + t. */
static void make_plans(rank_plan_t *plans, int tp, int dp, int first_step) {
    char group[TP][96], pair[DP][96], domain[96];
    for (int t = 0; t < tp; ++t)
        if (dp > 1) tcp_rendezvous(group[t], sizeof group[t]);
        else snprintf(group[t], sizeof group[t], "local://tp-mlp-slice%d", t); /* a group of one rank */
    for (int d = 0; d < dp && tp > 1; ++d) tcp_rendezvous(pair[d], sizeof pair[d]);
    if (tp > 1) tcp_rendezvous(domain, sizeof domain);
    for (int r = 0; r < tp * dp; ++r) {
        rank_plan_t *p = &plans[r];
        memset(p, 0, sizeof *p);
        p->tp = tp, p->t = r % tp, p->dp = dp, p->d = r / tp;
        p->first_step = first_step;
        strcpy(p->rv_group, group[p->t]);
        if (tp > 1) {
            strcpy(p->rv_pair, pair[p->d]);
            strcpy(p->rv_domain, domain);
        }
    }
}

/* The run's summary from its ranks' outputs: the losses of one slice's data-parallel
 * ranks summed (every slice computes the same), the model from the pieces. Checks that
 * every rank holding an element holds the same bits (data-parallel ranks after the
 * all-gather, the copies of a replicated param) and that the pieces cover the model. */
static int summarize(const rank_out_t *out, int tp, int dp, summary_t *sum) {
    int consistent = 1;
    for (int s = 0; s < STEPS; ++s) {
        double loss = 0.0;
        for (int d = 0; d < dp; ++d) loss += out[d * tp].loss_sum[s];
        sum->loss[s] = loss / GLOBAL_BATCH;
        sum->norm[s] = out[0].norm[s];
        for (int r = 1; r < tp * dp; ++r)
            if (out[r].norm[s] != out[0].norm[s]) consistent = 0;
    }
    for (int e = 0; e < MODEL_NUMEL; ++e) {
        int seen = 0;
        for (int r = 0; r < tp * dp; ++r) {
            if (!out[r].have[e]) continue;
            if (seen++ == 0) sum->model[e] = out[r].model[e];
            else if (memcmp(&sum->model[e], &out[r].model[e], sizeof(float)) != 0) consistent = 0;
        }
        if (!seen) consistent = 0;
    }
    return consistent;
}

/* |a - b| / |b| (the losses and the norms are well away from 0). */
static double rel(double a, double b) { return fabs(a - b) / fabs(b); }

/* Compares a run with another from step `from` on: each loss and norm relative to its
 * own value, each param's largest difference relative to its largest magnitude. Prints
 * the verdict; 0 if equal within TOLERANCE. */
static int compare(const char *what, const summary_t *run, const summary_t *want, int from) {
    double loss = 0.0, norm = 0.0, model = 0.0;
    for (int s = from; s < STEPS; ++s) {
        if (rel(run->loss[s], want->loss[s]) > loss) loss = rel(run->loss[s], want->loss[s]);
        if (rel(run->norm[s], want->norm[s]) > norm) norm = rel(run->norm[s], want->norm[s]);
    }
    for (int p = 0; p < NUM_PARAMS; ++p) { /* each param against its largest magnitude */
        const float *a = run->model + model_offset(p), *b = want->model + model_offset(p);
        double scale = 0.0, diff = 0.0;
        for (int e = 0; e < k_numel[p]; ++e) {
            if (fabs(b[e]) > scale) scale = fabs(b[e]);
            if (fabs((double)a[e] - b[e]) > diff) diff = fabs((double)a[e] - b[e]);
        }
        if (diff / scale > model) model = diff / scale;
    }
    const int equal = loss <= TOLERANCE && norm <= TOLERANCE && model <= TOLERANCE;
    printf("%s: max relative difference of the losses %.2e, of the gradient norms %.2e, of the params %.2e "
           "(<= %.0e: %s)\n",
           what, loss, norm, model, TOLERANCE, equal ? "equal" : "DIFFERENT");
    return equal ? 0 : 1;
}

static void print_losses(const summary_t *a, const char *a_name, const summary_t *b, const char *b_name) {
    printf("step  loss (%s)  loss (%s)  grad norm (%s)\n", a_name, b_name, a_name);
    for (int s = 0; s < STEPS; ++s)
        printf("%4d  %*.9f  %*.9f  %.9f\n", s + 1, (int)strlen(a_name) + 7, a->loss[s], (int)strlen(b_name) + 7,
               b->loss[s], a->norm[s]);
}

static int write_summary(const char *path, const summary_t *s) {
    FILE *f = fopen(path, "wb");
    const int ok = f && fwrite(s, sizeof *s, 1, f) == 1;
    if (f && fclose(f) != 0) return -1;
    return ok ? 0 : -1;
}

static int read_summary(const char *path, summary_t *s) {
    FILE *f = fopen(path, "rb");
    const int ok = f && fread(s, sizeof *s, 1, f) == 1;
    if (f) fclose(f);
    return ok ? 0 : -1;
}

/* (a) and (b): the 4 processes with their checkpoints, the reference, the resume at DP = 1. */
static int train_and_prove(const char *dir, rank_out_t *out) {
    rank_plan_t plans[MAX_RANKS];
    summary_t run, ref, resumed;
    char path[512];
    make_plans(plans, TP, DP, 0);
    for (int t = 0; t < TP; ++t) {
        snprintf(path, sizeof path, "%s/ckpt/tp%d", dir, t);
        if (mkdir(path, 0777) != 0 && errno != EEXIST) return 1;
        snprintf(plans[t].save, sizeof plans[t].save, "%s/ckpt/tp%d/step-%d", dir, t, SAVE_AT); /* and rank (1, t) */
        strcpy(plans[TP + t].save, plans[t].save);
    }
    if (run_processes(plans, TP * DP, out) != 0) return 1;
    if (!summarize(out, TP, DP, &run)) {
        printf("the ranks disagree: a norm, a data-parallel rank's piece or a replicated param's copy differs\n");
        return 1;
    }
    printf("TP=%d x DP=%d: every rank saw the same gradient norms; every piece is the same bits on its "
           "data-parallel ranks and the replicated params on both slices\n", TP, DP);
    snprintf(path, sizeof path, "%s/uninterrupted", dir);
    if (write_summary(path, &run) != 0) return 1;
    int clipped = 1;
    for (int r = 0; r < TP * DP; ++r) clipped &= out[r].clipped_every_step;

    /* The reference: one process, one group of world size 1, the whole model and batch. */
    make_plans(plans, 1, 1, 0);
    snprintf(plans[0].rv_group, sizeof plans[0].rv_group, "local://tp-mlp-reference");
    if (run_processes(plans, 1, out) != 0) return 1;
    summarize(out, 1, 1, &ref);
    print_losses(&run, "TP=2 x DP=2", &ref, "reference");
    printf("clipped at every step (every norm above max_grad_norm %g): %s\n", MAX_GRAD_NORM, clipped ? "yes" : "NO");
    int failed = !clipped;
    failed |= compare("(a) TP=2 x DP=2 against one process training the unsharded model", &run, &ref, 0);

    /* (b) Resume at TP=2 x DP=1 from the slices' checkpoints of step SAVE_AT. */
    make_plans(plans, TP, 1, SAVE_AT);
    for (int t = 0; t < TP; ++t) snprintf(plans[t].load, sizeof plans[t].load, "%s/ckpt/tp%d/step-%d", dir, t, SAVE_AT);
    if (run_processes(plans, TP, out) != 0) return 1;
    if (!summarize(out, TP, 1, &resumed)) return 1;
    failed |= compare("(b) resumed at TP=2 x DP=1 (2 processes) from the slices' checkpoints of step 10, "
                      "against the uninterrupted run, steps 11-20", &resumed, &run, SAVE_AT);
    return failed;
}

/* (c): resume at TP=1 x DP=2 from the joined checkpoint, against the run `--dir` wrote. */
static int resume_joined(const char *dir, const char *joined, rank_out_t *out) {
    summary_t run, resumed;
    char path[512];
    snprintf(path, sizeof path, "%s/uninterrupted", dir);
    if (read_summary(path, &run) != 0) {
        fprintf(stderr, "cannot read %s: run `train_tp_mlp --dir %s` first\n", path, dir);
        return 1;
    }
    rank_plan_t plans[DP];
    make_plans(plans, 1, DP, SAVE_AT);
    for (int d = 0; d < DP; ++d) snprintf(plans[d].load, sizeof plans[d].load, "%s", joined);
    if (run_processes(plans, DP, out) != 0) return 1;
    if (!summarize(out, 1, DP, &resumed)) return 1;
    return compare("(c) resumed at TP=1 x DP=2 (the unsharded model, 2 processes) from the joined checkpoint "
                   "of step 10, against the uninterrupted run, steps 11-20", &resumed, &run, SAVE_AT);
}

int main(int argc, char **argv) {
    const char *dir = NULL, *joined = NULL;
    int bad = 0;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) dir = argv[++i];
        else if (strcmp(argv[i], "--resume-joined") == 0 && i + 1 < argc) joined = argv[++i];
        else bad = 1;
    }
    if (bad || (joined && !dir)) {
        fprintf(stderr, "usage: %s [--dir DIR]                          (a) and (b), DIR kept\n"
                        "       %s --dir DIR --resume-joined JOINED     (c), after a run with --dir DIR\n",
                argv[0], argv[0]);
        return 2;
    }
    if (sx_version() / 10000 != SX_VERSION_MAJOR) {
        fprintf(stderr, "libsx major version %u does not match the header's %d\n", sx_version() / 10000,
                SX_VERSION_MAJOR);
        return 2;
    }
    /* The ranks' outputs, in memory the forked processes share with this one. */
    rank_out_t *out = mmap(NULL, sizeof(rank_out_t) * MAX_RANKS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (out == MAP_FAILED) return 1;
    if (joined) return resume_joined(dir, joined, out);

    char tmp[] = "/tmp/sx-tp-mlp-XXXXXX", path[512];
    if (!dir && !(dir = mkdtemp(tmp))) return 1;
    snprintf(path, sizeof path, "%s/ckpt", dir);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) return 1;
    if (mkdir(path, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "cannot make %s\n", path);
        return 1;
    }
    printf("sx %u.%u.%u: MLP (layer norm %d -> fc1 %d -> gelu -> fc2 %d), TP=%d x DP=%d = %d processes over "
           "tcp://127.0.0.1, ZeRO-2 AdamW in each slice's group, the groups in one norm domain, clipped to %g; "
           "%d steps, a checkpoint of each slice at step %d in %s/ckpt\n",
           sx_version() / 10000, sx_version() / 100 % 100, sx_version() % 100, D_IN, HIDDEN, D_OUT, TP, DP, TP * DP,
           MAX_GRAD_NORM, STEPS, SAVE_AT, dir);
    const int failed = train_and_prove(dir, out);
    if (dir == tmp) {
        snprintf(path, sizeof path, "rm -rf '%s'", tmp);
        if (system(path) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    }
    return failed;
}
