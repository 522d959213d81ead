// bench_sx: sx's speed figures, each against a ceiling or a peer measured in the same run.
//
// Every figure is a ratio to a ceiling (or peer) timed in the same run, the two timed
// in alternation over several repetitions: the machines here are shared and noisy, so
// absolute times mean little, and the memory bandwidth a run gets drifts by tens of
// percent within seconds. So each repetition times the two back to back (which goes
// first alternates), and the headline ratio is the median over repetitions of the
// ratio within each pair; the ratio of the fastest repetitions is printed beside it.
// Each section prints a readable table and one JSON line per figure.
//
// Sections (run in order; name some on the command line to run only those):
//   adamw_kernel  the fused AdamW kernel vs a streaming ceiling with its memory pattern
//   step          sx_step with one rank vs the fused kernel alone
//   comm          reduce-scatter + all-gather through sx vs the same traffic with Gloo directly
//   checkpoint    saving (blocking time, persist throughput, steps meanwhile, memory) and
//                 loading with resharding vs plain file I/O of the same bytes
//   pipeline      units as a pipeline on a simulated trainer (2 and 4 ranks as processes, 8
//                 units, compute calibrated to equal the communication, as a busy loop and as
//                 sleeps): overlapped and plain step time against compute + communication,
//                 and stage 3's peak param bytes against 1/W of the model
//   mesh          HSDP: bytes per rank per step on shard-group and replica links (the
//                 kernel's TCP counts) and step time, flat ZeRO vs a 2 x 2 mesh, 4 ranks
//   gpu_adamw     (CUDA builds) the fused AdamW kernel on the device vs a traffic-only kernel
//                 with its memory pattern, and its bandwidth beside the device's peak;
//                 prints that it was skipped, and why, where there is no device
// A new section is a function of the Options, appended to kSections.
//
// usage: bench_sx [--elements N] [--comm-mib M] [--reps R] [--ckpt-mib M] [--ckpt-dir DIR]
//                 [--gpu-elements N] [SECTION...]
//   --gpu-elements  gpu_adamw section: fp32 elements (2^28)
//   --ckpt-mib  checkpoint section: MiB of values + optimizer state in the files (576)
//   --ckpt-dir  checkpoint section: where its mkdtemp directory goes (/tmp); that directory
//               is removed at the end
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bench_util.h"

using namespace sxbench;

namespace {

// ---------------------------------------------------------------------- driver

struct Section {
    const char *name;
    int (*run)(const Options &);
};
const Section kSections[] = {
    {"adamw_kernel", section_adamw_kernel},
    {"step", section_step},
    {"comm", section_comm},
    {"checkpoint", section_checkpoint},
    {"pipeline", section_pipeline},
    {"mesh", section_mesh},
#ifdef SX_HAVE_CUDA
    {"gpu_adamw", section_gpu_adamw},
#endif
};

}  // namespace

int main(int argc, char **argv) {
    if (argc > 1 && !std::strcmp(argv[1], "--pipeline-rank")) return pipeline_rank_main(argc, argv);
    if (argc > 1 && !std::strcmp(argv[1], "--mesh-rank")) return mesh_rank_main(argc, argv);
    Options opt;
    std::vector<std::string> wanted;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--elements") && i + 1 < argc) {
            opt.elements = std::strtoull(argv[++i], nullptr, 10);
        } else if (!std::strcmp(argv[i], "--comm-mib") && i + 1 < argc) {
            opt.comm_mib = std::strtoull(argv[++i], nullptr, 10);
        } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
            opt.reps = std::atoi(argv[++i]);
        } else if (!std::strcmp(argv[i], "--ckpt-mib") && i + 1 < argc) {
            opt.ckpt_mib = std::strtoull(argv[++i], nullptr, 10);
        } else if (!std::strcmp(argv[i], "--ckpt-dir") && i + 1 < argc) {
            opt.ckpt_dir = argv[++i];
        } else if (!std::strcmp(argv[i], "--gpu-elements") && i + 1 < argc) {
            opt.gpu_elements = std::strtoull(argv[++i], nullptr, 10);
        } else if (argv[i][0] == '-') {
            std::fprintf(stderr,
                         "usage: %s [--elements N] [--comm-mib M] [--reps R] [--ckpt-mib M] [--ckpt-dir DIR] "
                         "[--gpu-elements N] [SECTION...]\n",
                         argv[0]);
            return 2;
        } else {
            wanted.push_back(argv[i]);
        }
    }
    if (opt.elements == 0 || opt.comm_mib == 0 || opt.reps < 1 || opt.ckpt_mib == 0 || opt.gpu_elements == 0) {
        std::fprintf(stderr, "bench_sx: --elements, --comm-mib, --reps, --ckpt-mib and --gpu-elements must be positive\n");
        return 2;
    }
    int rc = 0;
    for (const Section &s : kSections) {
        if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), s.name) == wanted.end()) continue;
        rc |= s.run(opt);
    }
    return rc;
}
