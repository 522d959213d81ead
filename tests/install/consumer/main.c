/* A program built against an installed sx (find_package or pkg-config): one rank,
 * one param, one SGD step; checks the param moved by exactly lr * grad. */
#include <stdio.h>

#include <sx/sx.h>

int main(void) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = "local://installed";
    cfg.world_size = 1;
    sx_shard_group_t *g = NULL;
    sx_param_group_desc_t pg;
    sx_param_desc_t d;
    sx_view_t p, gr;
    int64_t shape[1] = {5};
    int ok = 0;
    if (sx_create_shard_group(&cfg, &g) != SX_OK) goto out;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_SGD);
    pg.lr = 0.5;
    if (sx_add_param_group(g, &pg, NULL) != SX_OK) goto out;
    sx_param_desc_init(&d, sizeof d);
    d.name = "w";
    d.ndim = 1;
    d.shape = shape;
    if (sx_add_param(g, &d, NULL) != SX_OK || sx_finalize(g) != SX_OK) goto out;
    sx_view_init(&p, sizeof p);
    sx_view_init(&gr, sizeof gr);
    if (sx_param_view(g, 0, &p) != SX_OK || sx_grad_view(g, 0, &gr) != SX_OK) goto out;
    for (int i = 0; i < 5; ++i) ((float *)p.data)[i] = 1.0f, ((float *)gr.data)[i] = 1.0f;
    if (sx_step(g, NULL, NULL) != SX_OK) goto out;
    ok = 1;
    for (int i = 0; i < 5; ++i) ok &= ((float *)p.data)[i] == 0.5f;
out:
    if (!ok) fprintf(stderr, "consumer failed: %s\n", sx_last_error_message());
    sx_destroy_shard_group(g);
    if (ok) printf("installed sx %u works\n", sx_version());
    return ok ? 0 : 1;
}
