/* A trainer as a launcher starts it (torchrun --no-python, mpirun, srun): one rank per
 * process, a group formed over env:// with rank and world size from the environment,
 * a few ZeRO-2 AdamW steps, and this rank's params written to OUT_DIR/params.<rank>
 * for run_launchers.py to compare.
 *
 * The model is spelled out in env_train.py, whose arithmetic this follows to the bit:
 * params w[37] (unit 0) and b[5] (unit 1) start at 0; rank r's gradient at step s is
 * p[i] - target(r, s, i), target = (r + 1) / 4 + i / 64 + s / 8, computed in double
 * and rounded to fp32. Ranks differ in their gradients, so equal params at the end
 * mean the ranks reduced and gathered together.
 *
 * With ENV_TRAIN_FAIL_FIRST_ATTEMPT set, rank 1 of torchrun's first attempt
 * (TORCHELASTIC_RESTART_COUNT=0) exits after its first step, as a crash would, for the
 * agent to restart the workers.
 *
 * usage: env_train OUT_DIR [STEPS]     (exit 0 on success) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sx/sx.h"

#define CHECK(call)                                                                                    \
    do {                                                                                               \
        sx_status_t s_ = (call);                                                                       \
        if (s_ != SX_OK) {                                                                             \
            fprintf(stderr, "env_train: %s failed: %s\n  %s\n", #call, sx_status_string(s_),           \
                    sx_last_error_message());                                                          \
            goto out;                                                                                  \
        }                                                                                              \
    } while (0)

static const int64_t kSizes[2] = {37, 5};

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s OUT_DIR [STEPS]\n", argv[0]);
        return 2;
    }
    const int steps = argc == 3 ? atoi(argv[2]) : 5;
    int failed = 1;
    sx_shard_group_t *g = NULL;
    FILE *f = NULL;

    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.rendezvous = "env://";
    cfg.world_size = 0; /* from the environment */
    cfg.stage = 2;
    cfg.backend = SX_BACKEND_CPU;
    cfg.num_threads = 1;
    cfg.timeout_ms = 60000;
    CHECK(sx_create_shard_group(&cfg, &g));
    int32_t rank = 0, world = 0;
    CHECK(sx_get_rank(g, &rank));
    CHECK(sx_get_world_size(g, &world));

    sx_param_group_desc_t adamw;
    sx_param_group_desc_init(&adamw, sizeof adamw, SX_OPTIM_ADAMW);
    adamw.lr = 0.1;
    CHECK(sx_add_param_group(g, &adamw, NULL));
    const char *names[2] = {"w", "b"};
    for (int p = 0; p < 2; p++) {
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = names[p];
        d.ndim = 1;
        d.shape = &kSizes[p];
        d.unit = p;
        CHECK(sx_add_param(g, &d, NULL));
    }
    CHECK(sx_finalize(g));

    float *param[2], *grad[2];
    for (int p = 0; p < 2; p++) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        CHECK(sx_param_view(g, p, &v));
        param[p] = v.data;
        CHECK(sx_grad_view(g, p, &v));
        grad[p] = v.data;
    }
    for (int s = 0; s < steps; s++) {
        for (int p = 0; p < 2; p++)
            for (int64_t i = 0; i < kSizes[p]; i++)
                grad[p][i] = (float)((double)param[p][i] - ((rank + 1) / 4.0 + (double)i / 64.0 + s / 8.0));
        CHECK(sx_step(g, NULL, NULL));
        const char *attempt = getenv("TORCHELASTIC_RESTART_COUNT");
        if (rank == 1 && getenv("ENV_TRAIN_FAIL_FIRST_ATTEMPT") && attempt && !strcmp(attempt, "0")) {
            printf("rank 1 fails its first attempt on purpose\n");
            fflush(stdout);
            _Exit(3);
        }
    }

    char path[4096];
    snprintf(path, sizeof path, "%s/params.%d", argv[1], (int)rank);
    f = fopen(path, "wb");
    if (f == NULL) {
        perror(path);
        goto out;
    }
    for (int p = 0; p < 2; p++) {
        if (fwrite(param[p], sizeof(float), (size_t)kSizes[p], f) != (size_t)kSizes[p]) {
            perror(path);
            goto out;
        }
    }
    printf("rank %d of %d: %d steps, w[0] = %.9g\n", (int)rank, (int)world, steps, (double)param[0][0]);
    failed = 0;
out:
    if (f != NULL && fclose(f) != 0) failed = 1;
    if (sx_destroy_shard_group(g) != SX_OK) failed = 1;
    return failed;
}
