/*
 * sx demo: a character-level language model trained by 4 ranks (threads of this
 * process) with ZeRO sharded AdamW (stage 2 by default), a warmup + cosine
 * learning-rate schedule and gradient clipping.
 *
 * Model: the embeddings of the previous CONTEXT characters, concatenated, one tanh
 * hidden layer, and a softmax over the characters of the text. Forward and backward
 * are written out by hand below; sx owns the parameters and gradients (the model
 * computes straight into views of sx's flat buffers) and does everything between
 * "gradients are ready" and "new parameters are ready".
 *
 * Each layer is a unit, and forward and backward go layer by layer over a micro-batch,
 * so that sx can work unit by unit: with --overlap, backward signals each layer's
 * gradients ready as soon as they are complete (sx_unit_grads_ready), so that their
 * reduction runs while the layers below are differentiated, and the step's all-gather
 * is deferred (stages 1 and 2): forward waits for each layer's params (sx_unit_gather)
 * just before it needs them. With --stage 3 a rank holds only its shard of every layer
 * between uses, and each layer is gathered around its forward and its backward.
 * With --shard-size 2 the 4 ranks are a 2 x 2 mesh (HSDP): ranks {0, 1} and {2, 3} each
 * shard the model, and the two pairs replicate it (only the reduced half of the
 * gradients crosses between the pairs).
 *
 * With --trace FILE each rank writes its timeline (every step's agreement, each unit's
 * reduce-scatter and all-gather, the norm, the update, the waits on peers, the save's and
 * the resume's phases) as a Chrome trace-event JSON file: FILE with ".rank<N>" before
 * ".json", or with "%r" replaced by the rank. Open the ranks' files together in
 * https://ui.perfetto.dev ("Open multiple trace files"), or one at a time in
 * chrome://tracing. The 2 resuming ranks write theirs with "-resume" in the name.
 *
 * With --lose-rank R the 4 ranks are processes (forked, meeting on a file:// rendezvous
 * that outlives them), and rank R's is killed (SIGKILL) at step --lose-at (default 150),
 * and the other 3 ranks' step fails. The ranks save a checkpoint every 50 steps in this
 * mode; the survivors ask which ranks were lost (sx_get_lost_ranks: their processes are
 * gone), regroup into 3 ranks (sx_regroup, expecting 4 less those, so that they do not
 * wait for the join window) from the last checkpoint, say what happened and how long it
 * took, take the steps since that checkpoint again, and go on to the end. With
 * --memory-copies N as well, every rank keeps a copy of its shard in memory every N steps
 * (and sends it to the next rank, before its step returns: SX_GROUP_MEMORY_COPY_WAIT),
 * and the survivors' state comes from those copies instead: only the steps since the
 * newest copy are taken again. With --replace as well,
 * a new process takes the lost one's place, as a launcher would start one: it creates a
 * group that joins (SX_GROUP_JOIN), registers the model, and waits; the 3 others poll for
 * it every step (sx_poll_joiners), admit it, and the 4 go on.
 *
 * With --state-dtype bf16 or 8bit, AdamW keeps its moments in bf16, or in torchao's 8-bit
 * blocks (the two weight matrices; the embeddings and biases are too small and stay
 * fp32). Checkpoints carry packed state as it is: the resume is identical at any state dtype.
 *
 * usage: train_charlm [--stage 1|2|3] [--overlap] [--shard-size 1|2|4] [--trace FILE]
 *                     [--lose-rank R [--lose-at STEP] [--memory-copies N] [--replace]]
 *                     [--state-dtype fp32|bf16|8bit] [TEXT_FILE] [STEPS]
 *        (default: stage 2, flat, Debian's GPL-3 text, 400 steps, no trace, no rank lost, fp32 state)
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sx/sx.h"

#define RANKS 4
#define CONTEXT 3
#define EMBED 16
#define HIDDEN 128
#define BATCH 32        /* examples per micro-batch per rank */
#define MICRO_BATCHES 2 /* micro-batches per step */
#define MAX_VOCAB 256

enum { P_EMBED, P_W1, P_B1, P_W2, P_B2, NUM_PARAMS };

static const char *g_path = "/usr/share/common-licenses/GPL-3";
static int g_steps = 400;
static int g_stage = 2;
static int g_overlap = 0;
static int g_shard_size = 0; /* 0: every rank shards (flat) */
static const char *g_trace = NULL; /* --trace: the trace file template */
static int g_lose_rank = -1;       /* --lose-rank: the rank lost (-1: none) */
static int g_lose_at = 150;        /* --lose-at: at which step */
static int g_memory_copies = 0;    /* --memory-copies: steps between memory copies (0: none) */
static int g_replace = 0;          /* --replace: the lost rank comes back as a joining process */
static char g_rendezvous[300] = "local://charlm"; /* with --lose-rank: file:// in the temporary directory */
#define SAVE_EVERY 50              /* with --lose-rank: a checkpoint every this many steps */
static char g_resume_trace[512];   /* the resuming ranks' template */
static unsigned char *g_text; /* the text as vocabulary indices */
static long g_len, g_train_len;
static int g_vocab;
static unsigned char g_chars[MAX_VOCAB]; /* index -> byte */

typedef struct {
    int rank;
    int world;
    int resume;           /* 1: load g_ckpt_dir instead of training */
    int failed;
    int lost; /* --lose-rank: this rank was lost */
    int join; /* --replace: this process replaces the lost one (it joins the running group) */
    int regrouped; /* this rank's group was formed by a regroup (it is no longer the one lost) */
    double final_eval_loss;
    uint64_t step;
    sx_memory_stats_t mem;
} rank_result_t;

static char g_ckpt_dir[256]; /* where the 4 ranks save, and 2 ranks resume from */
static int32_t g_state_dtype = SX_STATE_FP32; /* --state-dtype */

#define CHECK(call)                                                                          \
    do {                                                                                     \
        sx_status_t s_ = (call);                                                             \
        if (s_ != SX_OK) {                                                                   \
            fprintf(stderr, "rank %d: %s failed: %s\n  %s\n", res->rank, #call,              \
                    sx_status_string(s_), sx_last_error_message());                          \
            res->failed = 1;                                                                 \
            goto out;                                                                        \
        }                                                                                    \
    } while (0)

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(uint64_t *s) { return (float)((rng_next(s) >> 40) * (1.0 / 16777216.0)); }

static int load_text(void) {
    FILE *f = fopen(g_path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", g_path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    g_len = ftell(f);
    fseek(f, 0, SEEK_SET);
    g_text = malloc((size_t)g_len);
    if (!g_text || fread(g_text, 1, (size_t)g_len, f) != (size_t)g_len) {
        fclose(f);
        return -1;
    }
    fclose(f);
    int index[256];
    memset(index, -1, sizeof index);
    for (long i = 0; i < g_len; ++i) {
        if (index[g_text[i]] < 0) {
            index[g_text[i]] = g_vocab;
            g_chars[g_vocab++] = g_text[i];
        }
        g_text[i] = (unsigned char)index[g_text[i]];
    }
    g_train_len = g_len * 9 / 10; /* the last tenth is held out */
    return g_len > 1000 ? 0 : -1;
}

typedef struct {
    float *p[NUM_PARAMS]; /* param views (at stage 3, valid only while the unit is gathered) */
    float *g[NUM_PARAMS]; /* grad views */
} model_t;

/* The units: one per layer. */
enum { U_EMBED, U_HIDDEN, U_OUT, NUM_UNITS };
static const int k_unit_of[NUM_PARAMS] = {U_EMBED, U_HIDDEN, U_HIDDEN, U_OUT, U_OUT};

/* One micro-batch's activations, layer by layer. */
typedef struct {
    int n;
    long t[BATCH];
    float x[BATCH][CONTEXT * EMBED], h[BATCH][HIDDEN], probs[BATCH][MAX_VOCAB];
    float dh[BATCH][HIDDEN], dx[BATCH][CONTEXT * EMBED];
} batch_t;

static void embed_forward(const model_t *m, batch_t *b) {
    for (int k = 0; k < b->n; ++k)
        for (int c = 0; c < CONTEXT; ++c)
            memcpy(b->x[k] + c * EMBED, m->p[P_EMBED] + g_text[b->t[k] - CONTEXT + c] * EMBED,
                   EMBED * sizeof(float));
}

static void hidden_forward(const model_t *m, batch_t *b) {
    for (int k = 0; k < b->n; ++k)
        for (int j = 0; j < HIDDEN; ++j) {
            float a = m->p[P_B1][j];
            for (int i = 0; i < CONTEXT * EMBED; ++i) a += b->x[k][i] * m->p[P_W1][i * HIDDEN + j];
            b->h[k][j] = tanhf(a);
        }
}

/* Softmax over the characters; returns the sum of -log p(text[t]) over the batch. */
static double out_forward(const model_t *m, batch_t *b) {
    double loss = 0;
    for (int k = 0; k < b->n; ++k) {
        float *probs = b->probs[k], maxlogit = -1e30f, sum = 0;
        for (int v = 0; v < g_vocab; ++v) {
            float a = m->p[P_B2][v];
            for (int j = 0; j < HIDDEN; ++j) a += b->h[k][j] * m->p[P_W2][j * g_vocab + v];
            probs[v] = a;
            if (a > maxlogit) maxlogit = a;
        }
        for (int v = 0; v < g_vocab; ++v) sum += (probs[v] = expf(probs[v] - maxlogit));
        for (int v = 0; v < g_vocab; ++v) probs[v] /= sum;
        loss += -logf(probs[g_text[b->t[k]]] + 1e-12f);
    }
    return loss;
}

/* The backward of each layer adds scale * dloss/dparam into its grad views and passes
 * the gradient of its input down. */
static void out_backward(model_t *m, batch_t *b, float scale) {
    for (int k = 0; k < b->n; ++k) {
        float *probs = b->probs[k];
        const float *h = b->h[k];
        probs[g_text[b->t[k]]] -= 1.0f; /* dloss/dlogits = probs - onehot */
        for (int j = 0; j < HIDDEN; ++j) {
            float *gw = m->g[P_W2] + j * g_vocab;
            const float *w = m->p[P_W2] + j * g_vocab;
            float acc = 0;
            for (int v = 0; v < g_vocab; ++v) {
                gw[v] += scale * h[j] * probs[v];
                acc += w[v] * probs[v];
            }
            b->dh[k][j] = acc * (1.0f - h[j] * h[j]); /* through tanh */
        }
        for (int v = 0; v < g_vocab; ++v) m->g[P_B2][v] += scale * probs[v];
    }
}

static void hidden_backward(model_t *m, batch_t *b, float scale) {
    for (int k = 0; k < b->n; ++k) {
        for (int i = 0; i < CONTEXT * EMBED; ++i) {
            float acc = 0;
            for (int j = 0; j < HIDDEN; ++j) {
                m->g[P_W1][i * HIDDEN + j] += scale * b->x[k][i] * b->dh[k][j];
                acc += m->p[P_W1][i * HIDDEN + j] * b->dh[k][j];
            }
            b->dx[k][i] = acc;
        }
        for (int j = 0; j < HIDDEN; ++j) m->g[P_B1][j] += scale * b->dh[k][j];
    }
}

static void embed_backward(model_t *m, batch_t *b, float scale) {
    for (int k = 0; k < b->n; ++k)
        for (int c = 0; c < CONTEXT; ++c)
            for (int e = 0; e < EMBED; ++e)
                m->g[P_EMBED][g_text[b->t[k] - CONTEXT + c] * EMBED + e] += scale * b->dx[k][c * EMBED + e];
}

/* Makes unit u's params readable and points the model at them: at stage 3 this gathers
 * the unit (collective; sx prefetches the next one meanwhile), after a deferred step it
 * waits for the unit's all-gather, and otherwise it returns at once. */
static sx_status_t use_unit(sx_shard_group_t *g, model_t *m, int u) {
    sx_status_t s = sx_unit_gather(g, u);
    for (int p = 0; p < NUM_PARAMS && s == SX_OK; ++p) {
        if (k_unit_of[p] != u) continue;
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        s = sx_param_view(g, p, &v);
        m->p[p] = v.data;
    }
    return s;
}

/* The gradient views, again after a regroup (the new group's buffers are new). */
static sx_status_t take_grad_views(sx_shard_group_t *g, model_t *m) {
    sx_status_t s = SX_OK;
    for (int p = 0; p < NUM_PARAMS && s == SX_OK; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        s = sx_grad_view(g, p, &v);
        m->g[p] = v.data;
    }
    return s;
}

/* Ends use_unit (at stage 3 the rank drops all but its shard; otherwise nothing). */
static sx_status_t done_unit(sx_shard_group_t *g, model_t *m, int u) {
    for (int p = 0; p < NUM_PARAMS; ++p)
        if (k_unit_of[p] == u) m->p[p] = NULL;
    return sx_unit_release(g, u);
}

/* Forward of a micro-batch, layer by layer; returns its summed loss in *loss. */
static sx_status_t forward(sx_shard_group_t *g, model_t *m, batch_t *b, double *loss) {
    sx_status_t s;
    if ((s = use_unit(g, m, U_EMBED)) != SX_OK) return s;
    embed_forward(m, b);
    if ((s = done_unit(g, m, U_EMBED)) != SX_OK || (s = use_unit(g, m, U_HIDDEN)) != SX_OK) return s;
    hidden_forward(m, b);
    if ((s = done_unit(g, m, U_HIDDEN)) != SX_OK || (s = use_unit(g, m, U_OUT)) != SX_OK) return s;
    *loss = out_forward(m, b);
    return done_unit(g, m, U_OUT);
}

/* Backward of a micro-batch, top layer first. With overlap, each layer's gradients are
 * signalled ready once complete: their reduction runs while the layers below go on.
 * accumulate: this micro-batch ends with sx_accumulate_grads (not the last one). */
static sx_status_t backward(sx_shard_group_t *g, model_t *m, batch_t *b, float scale, int accumulate) {
    sx_unit_ready_options_t ro;
    sx_unit_ready_options_init(&ro, sizeof ro);
    ro.accumulate = accumulate;
    for (int u = NUM_UNITS - 1; u >= 0; --u) {
        sx_status_t s = use_unit(g, m, u);
        if (s != SX_OK) return s;
        if (u == U_OUT) out_backward(m, b, scale);
        if (u == U_HIDDEN) hidden_backward(m, b, scale);
        if (u == U_EMBED) embed_backward(m, b, scale);
        if ((s = done_unit(g, m, u)) != SX_OK) return s;
        if (g_overlap && (s = sx_unit_grads_ready(g, u, &ro)) != SX_OK) return s;
    }
    return SX_OK;
}

/* Linear warmup for the first 5% of steps, then cosine decay to 10% of the peak. */
static double lr_at(int step, double peak) {
    int warmup = g_steps / 20 > 0 ? g_steps / 20 : 1;
    if (step < warmup) return peak * (step + 1) / warmup;
    double progress = (double)(step - warmup) / (double)(g_steps - warmup);
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + cos(3.14159265358979 * progress)));
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* --lose-rank: the checkpoint of `step` steps, beside the final one. */
static void periodic_checkpoint(char *out, size_t size, int step) {
    snprintf(out, size, "%s-step-%d", g_ckpt_dir, step);
}

static void *rank_main(void *arg) {
    rank_result_t *res = arg;
    sx_shard_group_t *g = NULL;
    model_t m;
    batch_t *b = calloc(1, sizeof *b);
    uint64_t rng = 1234 + (uint64_t)res->rank * 7919;
    const double peak_lr = 1e-2;
    double loss_window = 0;
    long window = 0;
    if (!b) {
        res->failed = 1;
        return NULL;
    }
    int joining = res->join; /* --replace: this process is the lost rank's replacement */
    int first_step = 0; /* where the training loop starts (a replacement: where it joined) */

    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU; /* the model computes on the host, in the views */
    cfg.rendezvous = res->resume ? "local://charlm-resume" : g_rendezvous;
    cfg.rank = res->rank;
    cfg.world_size = res->world;
    cfg.stage = g_stage;
    cfg.shard_size = res->resume ? 0 : g_shard_size; /* the checkpoint resumes on a flat group */
    cfg.timeout_ms = 60000;
    cfg.memory_copy_interval = res->resume ? 0 : g_memory_copies;
    /* A step that takes a copy returns once the next rank holds it: no step that returned
     * anywhere is taken again after a loss. */
    if (cfg.memory_copy_interval) cfg.flags |= SX_GROUP_MEMORY_COPY_WAIT;
    cfg.trace_path = res->resume ? (g_trace ? g_resume_trace : NULL) : g_trace; /* written at destroy */
    if (joining) {
        cfg.flags = SX_GROUP_JOIN; /* connects to nobody until the members admit it */
        cfg.trace_path = NULL;
    }
    CHECK(sx_create_shard_group(&cfg, &g));

    /* Two param groups, as in GPT training: weight decay on matrices, none on biases. */
    sx_param_group_desc_t decay, no_decay;
    sx_param_group_desc_init(&decay, sizeof decay, SX_OPTIM_ADAMW);
    decay.lr = peak_lr;
    decay.weight_decay = 0.01;
    decay.state_dtype = g_state_dtype;
    no_decay = decay;
    no_decay.weight_decay = 0.0;
    int32_t g_decay, g_no_decay;
    CHECK(sx_add_param_group(g, &decay, &g_decay));
    CHECK(sx_add_param_group(g, &no_decay, &g_no_decay));

    /* One unit per layer: each is communicated as one flat buffer. */
    const struct {
        const char *name;
        int64_t shape[2];
        int ndim, group, unit;
    } defs[NUM_PARAMS] = {
        {"embed.weight", {g_vocab, EMBED}, 2, g_decay, 0},
        {"hidden.weight", {CONTEXT * EMBED, HIDDEN}, 2, g_decay, 1},
        {"hidden.bias", {HIDDEN, 0}, 1, g_no_decay, 1},
        {"out.weight", {HIDDEN, g_vocab}, 2, g_decay, 2},
        {"out.bias", {g_vocab, 0}, 1, g_no_decay, 2},
    };
    for (int p = 0; p < NUM_PARAMS; ++p) {
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = defs[p].name;
        d.ndim = defs[p].ndim;
        d.shape = defs[p].shape;
        d.param_group = defs[p].group;
        d.unit = defs[p].unit;
        CHECK(sx_add_param(g, &d, NULL));
    }
    CHECK(sx_finalize(g));
    if (joining) {
        /* Waits until the members admit it; its state is then theirs. */
        const double t0 = seconds_now();
        sx_regroup_options_t ro;
        sx_regroup_options_init(&ro, sizeof ro);
        sx_regroup_result_t rr;
        sx_regroup_result_init(&rr, sizeof rr);
        CHECK(sx_regroup(g, &ro, &rr));
        printf("replacement: joined as rank %d of %d at step %llu, %.3f s after it started\n", rr.rank,
               rr.world_size, (unsigned long long)rr.step + 1, seconds_now() - t0);
        fflush(stdout);
        res->rank = rr.rank;
        res->world = rr.world_size;
        CHECK(take_grad_views(g, &m));
        for (int p = 0; p < NUM_PARAMS; ++p) m.p[p] = NULL;
        first_step = (int)rr.step;
        goto train;
    }

    /* Rank 0 initialises (uniform, scaled by fan-in); the broadcast below copies it. At
     * stage 3 every rank holds every unit gathered for it. */
    for (int u = 0; u < NUM_UNITS; ++u) CHECK(use_unit(g, &m, u));
    for (int p = 0; p < NUM_PARAMS; ++p) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        CHECK(sx_param_view(g, p, &v));
        if (res->rank == 0 && (p == P_EMBED || p == P_W1 || p == P_W2)) {
            float bound = p == P_EMBED ? 1.0f : 1.0f / sqrtf((float)defs[p].shape[0]);
            for (uint64_t i = 0; i < v.numel; ++i) m.p[p][i] = (2 * rng_uniform(&rng) - 1) * bound;
        }
        CHECK(sx_grad_view(g, p, &v));
        m.g[p] = v.data;
    }
    CHECK(sx_broadcast_params(g, 0));
    for (int u = 0; u < NUM_UNITS; ++u) CHECK(done_unit(g, &m, u));
    if (res->resume) {
        /* Resume from the checkpoint the 4 ranks wrote: each of these 2 ranks reads only
         * the chunks of its own shard. */
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = g_ckpt_dir;
        CHECK(sx_load_optim_state(g, &lo));
        goto evaluate;
    }

train:;
    sx_step_options_t opt;
    sx_step_options_init(&opt, sizeof opt);
    opt.max_grad_norm = 0.5;
    opt.defer_gather = g_overlap; /* forward's use_unit waits for each unit */
    int saved_at = -1;            /* --lose-rank: the last checkpoint every rank committed */
    for (int step = first_step; step < g_steps; ++step) {
        if (g_replace && res->world == RANKS - 1) {
            /* A replacement may be waiting: every member polls, and all admit it at once. */
            int32_t waiting = 0;
            CHECK(sx_poll_joiners(g, &waiting));
            if (waiting > 0) {
                const double t0 = seconds_now();
                sx_regroup_options_t ro;
                sx_regroup_options_init(&ro, sizeof ro);
                ro.admit = waiting;
                sx_regroup_result_t rr;
                sx_regroup_result_init(&rr, sizeof rr);
                CHECK(sx_regroup(g, &ro, &rr));
                printf("rank %d: admitted %d joining process at step %d in %.3f s: rank %d of %d\n", res->rank,
                       waiting, step + 1, seconds_now() - t0, rr.rank, rr.world_size);
                fflush(stdout);
                res->rank = rr.rank;
                res->world = rr.world_size;
                res->regrouped = 1;
                CHECK(take_grad_views(g, &m));
            }
        }
        if (g_lose_rank >= 0 && step % SAVE_EVERY == 0 && saved_at < step) {
            char path[512];
            periodic_checkpoint(path, sizeof path, step);
            sx_save_options_t so;
            sx_save_options_init(&so, sizeof so);
            so.path = path;
            so.synchronous = 1;
            sx_future_t *f = NULL;
            CHECK(sx_save_optim_state(g, &so, &f));
            sx_status_t saved = sx_future_wait(f, -1);
            sx_future_destroy(f);
            CHECK(saved);
            saved_at = step;
        }
        if (res->rank == g_lose_rank && step == g_lose_at && !res->join && !res->regrouped) {
            /* Lost: the process is killed, as a preempted machine's is (its parent starts
             * a replacement with --replace). */
            printf("rank %d: lost at step %d\n", res->rank, step + 1);
            fflush(stdout);
            raise(SIGKILL);
        }
        sx_status_t stepped = SX_OK; /* the first failure of this step's calls */
        CHECK(sx_set_lr(g, g_decay, lr_at(step, peak_lr)));
        CHECK(sx_set_lr(g, g_no_decay, lr_at(step, peak_lr)));
        for (int mb = 0; mb < MICRO_BATCHES; ++mb) {
            b->n = BATCH;
            for (int k = 0; k < BATCH; ++k)
                b->t[k] = CONTEXT + (long)(rng_next(&rng) % (uint64_t)(g_train_len - CONTEXT));
            double loss = 0;
            if ((stepped = forward(g, &m, b, &loss)) != SX_OK) goto step_failed;
            loss_window += loss;
            window += BATCH;
            const int last = mb + 1 == MICRO_BATCHES;
            if ((stepped = backward(g, &m, b, 1.0f / (BATCH * MICRO_BATCHES), !last)) != SX_OK) goto step_failed;
            if (!last && (stepped = sx_accumulate_grads(g)) != SX_OK) goto step_failed;
        }
        sx_step_result_t r;
        sx_step_result_init(&r, sizeof r);
        stepped = sx_step(g, &opt, &r);
    step_failed:
        if (stepped != SX_OK && g_lose_rank >= 0 && res->world == RANKS) {
            /* A peer was lost: regroup with the others, from the memory copies where they
             * are kept, else from the last checkpoint. The ranks whose process is gone
             * will not come: the group closes once the others are there. */
            const double t0 = seconds_now();
            int32_t lost[RANKS], nlost = 0;
            CHECK(sx_get_lost_ranks(g, lost, RANKS, &nlost));
            char named[64] = "";
            for (int k = 0; k < nlost && k < RANKS; ++k)
                snprintf(named + strlen(named), sizeof named - strlen(named), "%s%d", k ? ", " : "", lost[k]);
            char path[512];
            periodic_checkpoint(path, sizeof path, saved_at);
            sx_regroup_options_t ro;
            sx_regroup_options_init(&ro, sizeof ro);
            ro.checkpoint = path;
            ro.expected_world_size = res->world - nlost;
            sx_regroup_result_t rr;
            sx_regroup_result_init(&rr, sizeof rr);
            CHECK(sx_regroup(g, &ro, &rr));
            printf("rank %d: step %d failed (%s; lost: rank %s); regrouped in %.3f s as rank %d of %d from %s of "
                   "step %llu: steps %llu-%d are taken again\n",
                   res->rank, step + 1, sx_status_string(stepped), nlost ? named : "none known",
                   seconds_now() - t0, rr.rank, rr.world_size, rr.from_memory ? "the memory copies" : "the checkpoint",
                   (unsigned long long)rr.step, (unsigned long long)rr.step + 1, step + 1);
            fflush(stdout);
            res->rank = rr.rank;
            res->world = rr.world_size;
            res->regrouped = 1;
            CHECK(take_grad_views(g, &m)); /* the views are the new group's */
            step = (int)rr.step - 1; /* the loop's ++ makes it the checkpoint's next */
            continue;
        }
        CHECK(stepped);
        if (res->rank == 0 && ((step + 1) % 50 == 0 || step == 0)) {
            printf("step %4llu  loss %.4f  grad norm %7.4f  lr %.5f\n", (unsigned long long)r.step,
                   loss_window / window, r.grad_norm, lr_at(step, peak_lr));
            fflush(stdout);
            loss_window = 0;
            window = 0;
        }
    }

    {
        /* Save the trained state. The call returns after the snapshot; the files are
         * written in the background, and the future says when they are committed. */
        sx_save_options_t so;
        sx_save_options_init(&so, sizeof so);
        so.path = g_ckpt_dir;
        sx_future_t *f = NULL;
        CHECK(sx_save_optim_state(g, &so, &f));
        sx_status_t saved = sx_future_wait(f, -1);
        if (saved != SX_OK) fprintf(stderr, "rank %d: save failed: %s\n", res->rank, sx_future_error_message(f));
        sx_future_destroy(f);
        CHECK(saved);
    }

evaluate:;
    /* Held-out loss (every rank has the same params after the all-gather). */
    double eval = 0;
    long n = 0;
    for (long t = g_train_len; t < g_len;) {
        b->n = 0;
        for (; t < g_len && b->n < BATCH; t += 7) b->t[b->n++] = t;
        double loss = 0;
        CHECK(forward(g, &m, b, &loss));
        eval += loss;
        n += b->n;
    }
    res->final_eval_loss = eval / (double)n;

    sx_memory_stats_init(&res->mem, sizeof res->mem);
    CHECK(sx_get_memory_stats(g, &res->mem));

out:
    sx_destroy_shard_group(g);
    free(b);
    return NULL;
}

/* Runs `world` ranks as threads. */
static int run_threads(rank_result_t *results, int world) {
    pthread_t threads[RANKS];
    for (int r = 0; r < world; ++r) pthread_create(&threads[r], NULL, rank_main, &results[r]);
    int failed = 0;
    for (int r = 0; r < world; ++r) {
        pthread_join(threads[r], NULL);
        failed |= results[r].failed;
    }
    return failed;
}

/* Forks a process running rank_main(res) (results live in shared memory); its pid. */
static pid_t fork_rank(rank_result_t *res) {
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        rank_main(res);
        fflush(stdout);
        _exit(res->failed ? 1 : 0);
    }
    return pid;
}

/* --lose-rank: the ranks are processes. The lost one's is killed; with --replace a new
 * process takes its place once it is gone, as a launcher would start one. */
static int run_processes(rank_result_t *results, int world) {
    pid_t pids[RANKS];
    for (int r = 0; r < world; ++r) pids[r] = fork_rank(&results[r]);
    int failed = 0, running = world;
    while (running > 0) {
        int status = 0;
        const pid_t pid = wait(&status);
        if (pid < 0) return 1;
        for (int r = 0; r < world; ++r) {
            if (pids[r] != pid) continue;
            --running;
            if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && r == g_lose_rank && !results[r].join) {
                if (g_replace) {
                    results[r].join = 1;
                    pids[r] = fork_rank(&results[r]);
                    ++running;
                } else {
                    results[r].lost = 1;
                }
            } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                failed = 1;
            }
        }
    }
    return failed;
}

/* Runs `world` ranks; resume = 1 loads the checkpoint instead of training. */
static int run_ranks(rank_result_t *results, int world, int resume) {
    memset(results, 0, sizeof *results * (size_t)world);
    for (int r = 0; r < world; ++r) {
        results[r].rank = r;
        results[r].world = world;
        results[r].resume = resume;
    }
    return g_lose_rank >= 0 && !resume ? run_processes(results, world) : run_threads(results, world);
}

int main(int argc, char **argv) {
    int positional = 0, bad = 0;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--stage") == 0 && i + 1 < argc) {
            g_stage = atoi(argv[++i]);
            bad |= g_stage < 1 || g_stage > 3;
        } else if (strcmp(argv[i], "--shard-size") == 0 && i + 1 < argc) {
            g_shard_size = atoi(argv[++i]);
            bad |= g_shard_size < 0 || g_shard_size > RANKS || (g_shard_size > 0 && RANKS % g_shard_size != 0);
        } else if (strcmp(argv[i], "--trace") == 0 && i + 1 < argc) {
            g_trace = argv[++i];
        } else if (strcmp(argv[i], "--overlap") == 0) {
            g_overlap = 1;
        } else if (strcmp(argv[i], "--lose-rank") == 0 && i + 1 < argc) {
            g_lose_rank = atoi(argv[++i]);
            bad |= g_lose_rank < 0 || g_lose_rank >= RANKS;
        } else if (strcmp(argv[i], "--memory-copies") == 0 && i + 1 < argc) {
            g_memory_copies = atoi(argv[++i]);
            bad |= g_memory_copies < 1;
        } else if (strcmp(argv[i], "--replace") == 0) {
            g_replace = 1;
        } else if (strcmp(argv[i], "--lose-at") == 0 && i + 1 < argc) {
            g_lose_at = atoi(argv[++i]);
            bad |= g_lose_at < 1;
        } else if (strcmp(argv[i], "--state-dtype") == 0 && i + 1 < argc) {
            ++i;
            g_state_dtype = strcmp(argv[i], "bf16") == 0   ? SX_STATE_BF16
                            : strcmp(argv[i], "8bit") == 0 ? SX_STATE_8BIT
                                                           : SX_STATE_FP32;
            bad |= g_state_dtype == SX_STATE_FP32 && strcmp(argv[i], "fp32") != 0;
        } else if (argv[i][0] == '-' && argv[i][1] == '-') {
            bad = 1;
        } else if (positional++ == 0) {
            g_path = argv[i];
        } else {
            g_steps = atoi(argv[i]);
        }
    }
    /* A lost rank is recovered through sx_regroup: fp32 state only so far. */
    if (bad || positional > 2 || g_steps < 1 || (g_lose_rank >= 0 && g_lose_at >= g_steps) ||
        (g_replace && g_lose_rank < 0) || (g_lose_rank >= 0 && g_state_dtype != SX_STATE_FP32) || load_text() != 0) {
        fprintf(stderr,
                "usage: %s [--stage 1|2|3] [--overlap] [--shard-size 1|2|4] [--trace FILE]\n"
                "          [--lose-rank R [--lose-at STEP < STEPS] [--memory-copies N] [--replace]]\n"
                "          [--state-dtype fp32|bf16|8bit (not with --lose-rank)] [TEXT_FILE] [STEPS]\n",
                argv[0]);
        return 2;
    }
    if (sx_version() / 10000 != SX_VERSION_MAJOR) {
        fprintf(stderr, "libsx major version %u does not match the header's %d\n", sx_version() / 10000,
                SX_VERSION_MAJOR);
        return 2;
    }
    if (g_trace) {
        /* The resuming ranks' files beside the training ranks': "-resume" before ".json" (or
         * at the end). */
        size_t n = strlen(g_trace);
        const int json = n > 5 && strcmp(g_trace + n - 5, ".json") == 0;
        snprintf(g_resume_trace, sizeof g_resume_trace, "%.*s-resume%s", (int)(json ? n - 5 : n), g_trace,
                 json ? ".json" : "");
    }
    const int shards = g_shard_size ? g_shard_size : RANKS;
    printf("sx %u.%u.%u: %d ranks (%d shards x %d replicas), ZeRO-%d AdamW%s%s, text %s (%ld bytes, %d distinct)\n",
           sx_version() / 10000, sx_version() / 100 % 100, sx_version() % 100, RANKS, shards, RANKS / shards,
           g_stage, g_state_dtype == SX_STATE_BF16 ? " (bf16 state)" : g_state_dtype == SX_STATE_8BIT ? " (8-bit state)" : "",
           g_overlap ? ", communication overlapped unit by unit" : "", g_path, g_len, g_vocab);
    printf("uniform guess loss: %.4f\n", log((double)g_vocab));
    snprintf(g_ckpt_dir, sizeof g_ckpt_dir, "/tmp/sx-charlm-XXXXXX");
    if (!mkdtemp(g_ckpt_dir)) {
        fprintf(stderr, "cannot make a temporary directory\n");
        return 1;
    }
    if (g_lose_rank >= 0) snprintf(g_rendezvous, sizeof g_rendezvous, "file://%s/rendezvous", g_ckpt_dir);
    strcat(g_ckpt_dir, "/checkpoint");
    /* In shared memory: with --lose-rank the ranks are processes, which report here. */
    rank_result_t *results = mmap(NULL, sizeof(rank_result_t) * RANKS, PROT_READ | PROT_WRITE,
                                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    rank_result_t resumed[2];
    if (results == MAP_FAILED) {
        fprintf(stderr, "cannot map the ranks' results\n");
        return 1;
    }
    if (run_ranks(results, RANKS, 0) != 0) return 1;
    /* The first rank that trained to the end (with --lose-rank, the lost one did not). */
    const rank_result_t *first = &results[g_lose_rank == 0 && !g_replace ? 1 : 0];
    printf("held-out loss after %d steps: %.4f\n", g_steps, first->final_eval_loss);
    printf("optimizer state per rank (ZeRO-%d over %d shards) vs one unsharded process%s:\n", g_stage, shards,
           g_replace ? " (4 ranks again, the replacement among them)" : g_lose_rank >= 0 ? " (the survivors, as 3 ranks)" : "");
    for (int r = 0; r < RANKS; ++r)
        if (!results[r].lost)
            printf("  rank %d: %8llu bytes  (unsharded: %llu bytes, %.2fx less)\n", results[r].rank,
               (unsigned long long)results[r].mem.optimizer_bytes,
               (unsigned long long)results[r].mem.unsharded_optimizer_bytes,
               (double)results[r].mem.unsharded_optimizer_bytes / (double)results[r].mem.optimizer_bytes);
    {
        const double model = 4.0 * ((double)g_vocab * EMBED + CONTEXT * EMBED * HIDDEN + HIDDEN +
                                    (double)HIDDEN * g_vocab + g_vocab);
        printf("param bytes on rank 0: %llu between steps, at most %llu (the whole model: %.0f)\n",
               (unsigned long long)first->mem.param_bytes, (unsigned long long)first->mem.peak_param_bytes, model);
    }
    {
        printf("saved a checkpoint at %s\n", g_ckpt_dir);
        /* Resume on a different number of ranks: the model must be exactly the same. */
        if (run_ranks(resumed, 2, 1) != 0) return 1;
        printf("resumed on 2 ranks from the %d-rank checkpoint: held-out loss %.4f (%s)\n",
               g_lose_rank >= 0 && !g_replace ? RANKS - 1 : RANKS, resumed[0].final_eval_loss,
               resumed[0].final_eval_loss == first->final_eval_loss ? "identical" : "DIFFERENT");
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%.*s'", (int)(strlen(g_ckpt_dir) - strlen("/checkpoint")), g_ckpt_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_ckpt_dir);
    if (g_trace)
        printf("traces: %s and %s, one file per rank (\"%%r\" replaced by the rank, or \".rank<N>\" before \".json\");\n"
               "  open them together in https://ui.perfetto.dev (Open multiple trace files), or one at a time in\n"
               "  chrome://tracing: a row per rank, a track per thread, a span per phase (hover for unit and bytes)\n",
               g_trace, g_resume_trace);
    if (resumed[0].final_eval_loss != first->final_eval_loss) return 1;
    free(g_text);
    return first->final_eval_loss < log((double)g_vocab) ? 0 : 1;
}
