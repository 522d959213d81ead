// Writes a golden checkpoint in the format this sx writes (tests/golden/README.md says
// when to run it: only when a new format version adds new goldens; the committed ones are
// never rewritten). usage: make_golden [--every-optimizer] OUT_DIR WORLD_SIZE [STAGE [SHARD_SIZE]]
// (golden_model.h's AdamW and SGD model, or every_optimizer.h's).
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "api/handles.h"
#include "every_optimizer_io.h"
#include "golden_model.h"
#include "sx/sx.h"

namespace {

int rank_main(const std::string &out, int rank, int world, int stage, int shard_size) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = "local://golden";
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.stage = stage;
    cfg.shard_size = shard_size;
    cfg.num_threads = 1;
    sx_shard_group_t *g = nullptr;
    if (sx_create_shard_group(&cfg, &g) != SX_OK) return 1;
    sx_param_group_desc_t a, b;
    sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_ADAMW);
    a.lr = 0.003, a.amsgrad = 1, a.weight_decay = 0.05;
    sx_param_group_desc_init(&b, sizeof b, SX_OPTIM_SGD);
    b.lr = 0.1, b.momentum = 0.8, b.dampening = 0.1;
    sx_add_param_group(g, &a, nullptr);
    sx_add_param_group(g, &b, nullptr);
    const auto &defs = sxgolden::params();
    for (const auto &d : defs) {
        sx_param_desc_t pd;
        sx_param_desc_init(&pd, sizeof pd);
        pd.name = d.name;
        pd.ndim = static_cast<int32_t>(d.shape.size());
        pd.shape = d.shape.data();
        pd.param_group = d.group;
        pd.unit = d.unit;
        if (sx_add_param(g, &pd, nullptr) != SX_OK) return 1;
    }
    if (sx_finalize(g) != SX_OK) return 1;
    sx::core::ShardGroup &sg = *g->impl;
    // Stage 3: the params' views exist while their units are gathered; each rank keeps its
    // shard of what was written when they are released.
    int32_t units = 0;
    sx_get_num_units(g, &units);
    for (int32_t u = 0; u < units && stage == 3; ++u)
        if (sx_unit_gather(g, u) != SX_OK) return 1;
    for (size_t p = 0; p < defs.size(); ++p) {
        const sx::core::ShardPiece piece = sg.layout().piece(static_cast<int32_t>(p), sg.shard_rank());
        const int u = sg.layout().placement(static_cast<int32_t>(p)).unit_index;
        const auto v = sg.unit_shard(u);
        sx_view_t pv;
        sx_view_init(&pv, sizeof pv);
        sx_param_view(g, static_cast<int32_t>(p), &pv);
        for (uint64_t i = 0; i < pv.numel; ++i) static_cast<float *>(pv.data)[i] = sxgolden::value(static_cast<int>(p), 0, i);
        for (uint64_t i = piece.begin; i < piece.end; ++i)
            for (int k = 0; k < v.state_slots; ++k)
                v.state[k][piece.shard_offset + (i - piece.begin)] = sxgolden::value(static_cast<int>(p), k + 1, i);
    }
    for (int32_t u = 0; u < units && stage == 3; ++u)
        if (sx_unit_release(g, u) != SX_OK) return 1;
    // The step counts a trained group would have, put in place as a load does.
    sx::core::ShardState shard;
    if (!sg.export_shard(&shard).ok()) return 1;
    sx::core::ShardProgress progress = shard.progress;
    for (size_t p = 0; p < defs.size(); ++p) {
        progress.params[p].step = sxgolden::step_of(static_cast<int>(p));
        progress.params[p].momentum_steps = defs[p].group == 1 ? sxgolden::step_of(static_cast<int>(p)) : 0;
    }
    progress.steps_taken = sxgolden::kGroupSteps;
    std::vector<std::array<sx::core::Buffer, 3>> no_state(shard.units.size());
    sx::core::ShardRestore restore;
    restore.state = &no_state;
    restore.slots.assign(shard.units.size(), 0);
    restore.progress = &progress;
    if (!sg.restore_shard(restore).ok()) return 1;
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    so.path = out.c_str();
    so.user_blob = sxgolden::kUserBlob;
    so.user_blob_size = std::string(sxgolden::kUserBlob).size();
    so.synchronous = 1;
    sx_future_t *f = nullptr;
    int rc = sx_save_optim_state(g, &so, &f) == SX_OK && sx_future_wait(f, -1) == SX_OK ? 0 : 1;
    if (rc) std::fprintf(stderr, "rank %d: %s %s\n", rank, sx_last_error_message(), f ? sx_future_error_message(f) : "");
    sx_future_destroy(f);
    sx_destroy_shard_group(g);
    return rc;
}

}  // namespace

int main(int argc, char **argv) {
    const bool every_optimizer = argc > 1 && std::string(argv[1]) == "--every-optimizer";
    if (every_optimizer) --argc, ++argv;
    if (argc < 3 || argc > 5) {
        std::fprintf(stderr, "usage: make_golden [--every-optimizer] OUT_DIR WORLD_SIZE [STAGE [SHARD_SIZE]]\n");
        return 2;
    }
    const int world = std::atoi(argv[2]);
    const int stage = argc >= 4 ? std::atoi(argv[3]) : 2;
    const int shard = argc == 5 ? std::atoi(argv[4]) : 0;
    if (every_optimizer) {
        const std::string err = sxgolden3::write(argv[1], world, stage, shard);
        if (!err.empty()) std::fprintf(stderr, "make_golden: %s\n", err.c_str());
        return err.empty() ? 0 : 1;
    }
    std::vector<int> rc(world, 1);
    std::vector<std::thread> ts;
    for (int r = 0; r < world; ++r) ts.emplace_back([&, r] { rc[r] = rank_main(argv[1], r, world, stage, shard); });
    for (auto &t : ts) t.join();
    for (int r : rc)
        if (r) return 1;
    return 0;
}
