// Fuzz target for the shard reader: the input replaces the shard file of a small,
// valid checkpoint, which is then loaded. Every load must either fail with
// SX_ERR_CORRUPT and leave the group as it was, or load exactly the saved state:
// never a crash, never a silent wrong load. (The ckpt_shard_corpus test replays the
// committed corpus through this entry point in every build.)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "api/handles.h"
#include "ckpt/checkpointer.h"
#include "sx/sx.h"
#include "test_files.h"

namespace {

void check(bool ok, const char *what) {
    if (ok) return;
    std::fprintf(stderr, "fuzz_shard: %s\n", what);
    std::abort();
}

// Two groups of one rank: `saver` wrote the checkpoint, `loader` loads the inputs.
struct World {
    sx_shard_group_t *saver = nullptr, *loader = nullptr;
    std::string dir, shard, saved;
    std::unique_ptr<sx::ckpt::Checkpointer> ck;

    static sx_shard_group_t *group(const char *rv) {
        sx_group_config_t cfg;
        sx_group_config_init(&cfg, sizeof cfg);
        cfg.backend = SX_BACKEND_CPU;
        cfg.rendezvous = rv;
        cfg.world_size = 1;
        cfg.num_threads = 1;
        sx_shard_group_t *g = nullptr;
        check(sx_create_shard_group(&cfg, &g) == SX_OK, "create");
        sx_param_group_desc_t a, b;
        sx_param_group_desc_init(&a, sizeof a, SX_OPTIM_ADAMW);
        a.amsgrad = 1;
        sx_param_group_desc_init(&b, sizeof b, SX_OPTIM_SGD);
        b.momentum = 0.9;
        sx_add_param_group(g, &a, nullptr);
        sx_add_param_group(g, &b, nullptr);
        const int64_t s1[1] = {6}, s2[2] = {2, 3};
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = "a", d.ndim = 1, d.shape = s1, d.param_group = 0;
        sx_add_param(g, &d, nullptr);
        d.name = "b", d.ndim = 2, d.shape = s2, d.param_group = 1, d.unit = 1;
        sx_add_param(g, &d, nullptr);
        check(sx_finalize(g) == SX_OK, "finalize");
        return g;
    }

    // Values and every state slot of both units, as bytes.
    static std::string state(sx_shard_group_t *g) {
        std::string out;
        for (size_t u = 0; u < 2; ++u) {
            const auto v = g->impl->unit_shard(u);
            out.append(reinterpret_cast<const char *>(v.values), v.shard_numel * 4);
            for (int k = 0; k < v.state_slots; ++k)
                out.append(reinterpret_cast<const char *>(v.state[k]), v.shard_numel * 4);
        }
        return out;
    }

    World() {
        char tmpl[] = "/tmp/sx-fuzz-shard-XXXXXX";
        check(mkdtemp(tmpl) != nullptr, "mkdtemp");
        dir = tmpl;
        saver = group("local://fuzz-shard-saver");
        for (int s = 0; s < 2; ++s) {
            for (int p = 0; p < 2; ++p) {
                sx_view_t v;
                sx_view_init(&v, sizeof v);
                sx_grad_view(saver, p, &v);
                for (uint64_t i = 0; i < v.numel; ++i) static_cast<float *>(v.data)[i] = 0.5f - 0.125f * i + s;
            }
            check(sx_step(saver, nullptr, nullptr) == SX_OK, "step");
        }
        sx::ckpt::Checkpointer save(saver->impl.get(), sx::io::posix_file_ops());
        sx::ckpt::SaveOptions so;
        so.path = dir + "/ck";
        check(save.save(so).ok(), "save");
        saved = state(saver);
        shard = so.path + "/" + sx::ckpt::shard_file_name(0, 1);
        loader = group("local://fuzz-shard-loader");
        ck.reset(new sx::ckpt::Checkpointer(loader->impl.get(), sx::io::posix_file_ops()));
    }
    ~World() {
        ck.reset();
        sx_destroy_shard_group(loader);
        sx_destroy_shard_group(saver);
        sxtest::remove_tree(dir);
    }
};

World &world() {
    static World w;
    return w;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    World &w = world();
    FILE *f = std::fopen(w.shard.c_str(), "wb");
    check(f != nullptr, "open the shard file");
    if (size) check(std::fwrite(data, 1, size, f) == size, "write the shard file");
    std::fclose(f);
    const std::string before = World::state(w.loader);
    sx::ckpt::LoadOptions lo;
    lo.path = w.dir + "/ck";
    const sx::Status s = w.ck->load(lo, nullptr);
    if (s.ok()) {
        check(World::state(w.loader) == w.saved, "a damaged shard file loaded a wrong state");
    } else {
        check(s.code() == SX_ERR_CORRUPT, "a damaged shard file gave a status other than SX_ERR_CORRUPT");
        check(World::state(w.loader) == before, "a failed load changed the group");
    }
    return 0;
}
