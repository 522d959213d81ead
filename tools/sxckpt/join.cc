// sxckpt join [--world-size N] OUT DIR...: the checkpoints of a model-parallel trainer's
// slices (one per tensor-parallel rank, or per pipeline stage and tensor-parallel rank,
// each saved by that slice's data-parallel group) joined into ONE sx checkpoint of the
// logical model at OUT: every param whole (SX_PLACEMENT_WHOLE), its values (the masters)
// and every optimizer state slot joined from its pieces, each param's step counts, the
// param groups, the global step, and the first checkpoint's loss scaler and user blob.
// OUT loads like any checkpoint, into a group of any world size and stage: a run goes on
// at tensor-parallel degree 1.
//
// It is export and import, end to end: `export` of the DIRs into temporaries beside OUT
// (OUT.sx-join.safetensors, OUT.sx-join-optimizer.{safetensors,json}), packed state in
// torchao's form (bf16 values, 8-bit codes and scales copied as stored, never quantized
// again), then `import` of them as saved by N ranks (the commit of
// ckpt::commit_checkpoint: OUT appears whole or not at all), then the temporaries are
// removed, whether it succeeded or not. What cannot be joined exactly is refused before
// anything is written (export.cc: check_groups, check_state_agrees, check_blocks).
#include <cstdio>

#include "checkpoint_dir.h"
#include "commands.h"

namespace sx {
namespace tool {

int join_command(const std::vector<std::string> &args) {
    std::string world = "1";
    std::vector<std::string> positional;
    const int parsed = parse_args("join", args, {{"--world-size", &world}}, &positional);
    if (parsed >= 0) return parsed;
    if (positional.size() < 2) return usage_error("join takes OUT and at least one checkpoint directory");
    int n = 0;
    if (!parse_world_size(world, &n))
        return usage_error("join: --world-size is '" + printable(world) + "'; it must be a number from 1 to 99999");
    std::string out = positional[0];
    while (out.size() > 1 && out.back() == '/') out.pop_back();
    const std::vector<std::string> dirs(positional.begin() + 1, positional.end());
    auto ops = io::posix_file_ops();
    bool exists = false;
    Status s = ops->exists(out, &exists);
    if (s.ok() && exists)
        s = SX_ERROR(SX_ERR_ALREADY_EXISTS, "%s already exists; join makes a new checkpoint directory",
                     printable(out).c_str());
    const std::string weights = out + ".sx-join.safetensors", prefix = out + ".sx-join-optimizer";
    if (s.ok()) s = export_for_join(*ops, dirs, weights, prefix);
    std::string summary;
    if (s.ok()) s = import_for_join(*ops, weights, prefix, n, out, &summary);
    for (const std::string &tmp : {weights, prefix + ".safetensors", prefix + ".json"}) {
        bool left = false;
        if (ops->exists(tmp, &left).ok() && left) ops->unlink(tmp);  // best effort: s is what matters
    }
    if (!s.ok()) return failure(s.prefix("join into " + printable(out) + " failed: "));
    std::fputs(summary.c_str(), stdout);
    std::printf("joined %zu checkpoints; every param whole\n", dirs.size());
    return kExitOk;
}

}  // namespace tool
}  // namespace sx
