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
//   load          2->1 and 4->2 resharding loads, page cache cold and warm, vs each loading
//                 rank reading the same bytes from one plain file
//   pipeline      units as a pipeline on a simulated trainer (2 and 4 ranks as processes, 8
//                 units, compute calibrated to equal the communication, as a busy loop and as
//                 sleeps): overlapped and plain step time against compute + communication,
//                 and stage 3's peak param bytes against 1/W of the model
//   mesh          HSDP: bytes per rank per step on shard-group and replica links (the
//                 kernel's TCP counts) and step time, flat ZeRO vs a 2 x 2 mesh, 4 ranks
//   scale         one rank of a 1024-, 4096- and 16384-rank job of a 70-billion-param model,
//                 simulated: layout, checkpoint write plan, MANIFEST (rank 0's commit) and
//                 read plans, flat and as 8-rank shard groups, with each step's time and
//                 heap bytes, and the store traffic of Gloo's rendezvous (docs/scale.md)
//   trace         the step timeline's cost: steps of 2 ranks traced vs not (docs/tracing.md)
//   small_step    a step of 2 ranks with almost nothing to reduce (plain, units signalled,
//                 micro-batches accumulated) against one all_gather of a call's header
//   packed        the packed layout (alignment 4) against the default 64: a one-rank AdamW step
//                 over params of odd sizes
//   state_dtype   AdamW with fp32, bf16 and 8-bit state, each against a ceiling of its own bytes
//                 and against fp32's; 8 bits against torchao's AdamW8bit (--torch-python)
//   stochastic_round  bf16_stochastic_round's rounding (a cache-sized block, and a stream)
//                 against truncation of the same bytes, and its AdamW update against a
//                 traffic-only pass of its bytes
//   param_sums    LAMB (per-param norms summed over the ranks) and Muon (matrices whole on one
//                 rank) against AdamW on the same models at 2 and 4 ranks, the bytes they
//                 exchange; Newton-Schulz and its products (OpenBLAS's where built with it,
//                 and sx's ordered one) against torch's
//   form          W real processes forming a group on this machine (--form-worlds, default
//                 8,32,64,128), all on one host (shared memory) and each a host of its own
//                 (Gloo's mesh): each rank's create, finalize and first step
//   context       groups made in a context (sx_context.h) vs groups of their own: the time to
//                 make one (the 100th of a context's), and 8 tenants stepping at once
//   norm_domain   TP=2 x DP=2 groups joined to a norm domain (sx_step.h) vs the same groups
//                 alone, clipping: time per step, collectives per step, the domain's bytes
//   regroup       a rank of 4 SIGKILLed: the survivors' sx_regroup and first step against
//                 a restart of 3 new processes loading the same checkpoint, flat and 2 x 2
//   hosts         (builds with the tests; root) a step of 16 Mi fp32 AdamW at 2 hosts x 2
//                 ranks across a 1 Gbit/s, 0.5 ms link: two-level against flat Gloo over
//                 every rank, each against the link's ceiling
//   gpu_adamw     (CUDA builds) the fused AdamW kernel on the device vs a traffic-only kernel
//                 with its memory pattern, and its bandwidth beside the device's peak;
//                 prints that it was skipped, and why, where there is no device
//   gpu_step      (CUDA builds) sx_step of a one-rank CUDA group vs the fused kernel alone
//   gpu_offload   (CUDA builds) a group offloading its state to the host vs one keeping it on
//                 the device: device bytes per param, the step, the host kernel vs its
//                 ceiling, and the share of the offloaded step a simulated backward hides
// A new section is a function of the Options, appended to kSections.
//
// usage: bench_sx [--elements N] [--comm-mib M] [--reps R] [--ckpt-mib M] [--ckpt-dir DIR]
//                 [--gpu-elements N] [--scale-worlds W,...] [--scale-load FROM:INTO]
//                 [--scale-reps R] [--scale-unit-per-param] [SECTION...]
//   --gpu-elements  gpu_adamw, gpu_step and gpu_offload sections: elements (2^28)
//   --ckpt-mib  checkpoint and load sections: MiB of values + optimizer state in the files (576)
//   --torch-python  optimizers and state_dtype sections: a Python with torch (and lion-pytorch,
//                   torchao), which times torch's optimizers (torchao's AdamW8bit) in the same run
//                   (else SX_BENCH_TORCH_PYTHON; neither: no torch column)
//   --ckpt-dir  checkpoint and load sections: where its mkdtemp directory goes (/tmp); that directory
//               is removed at the end
//   --scale-worlds  scale section: the saving jobs' ranks (1024,4096,16384), each flat and as
//                   shard groups of 8 (multiples of 8)
//   --scale-load    scale section: the resharding load, FROM one of the worlds (4096:3072)
//   --scale-reps    scale section: timed runs per figure (3)
//   --scale-unit-per-param  scale section: one unit per param instead of one per layer
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

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
    {"load", section_load},
    {"pipeline", section_pipeline},
    {"mesh", section_mesh},
    {"scale", section_scale},
    {"trace", section_trace},
    {"small_step", section_small_step},
    {"packed", section_packed},
    {"optimizers", section_optimizers},
    {"state_dtype", section_state_dtype},
    {"stochastic_round", section_stochastic_round},
    {"custom_optimizer", section_custom_optimizer},
    {"param_sums", section_param_sums},
    {"shm", section_shm},
    {"shm_step", section_shm_step},
    {"cache_step", section_cache_step},
    {"regroup", section_regroup},
    {"context", section_context},
    {"form", section_form},
    {"norm_domain", section_norm_domain},
#ifdef SX_BENCH_NETLAB
    {"hosts", section_hosts},
#endif
#ifdef SX_HAVE_CUDA
    {"gpu_adamw", section_gpu_adamw},
    {"gpu_step", section_gpu_step},
    {"gpu_offload", section_gpu_offload},
#endif
};

// "1024,4096": positive numbers separated by commas, into *out; false if malformed.
bool parse_list(const char *text, std::vector<int> *out) {
    std::vector<int> v;
    for (const char *p = text;;) {
        char *end = nullptr;
        const long n = std::strtol(p, &end, 10);
        if (end == p || n < 1 || n > (1 << 24)) return false;
        v.push_back(static_cast<int>(n));
        if (*end == '\0') break;
        if (*end != ',') return false;
        p = end + 1;
    }
    *out = std::move(v);
    return true;
}

const char kUsage[] =
    "usage: %s [--elements N] [--comm-mib M] [--reps R] [--ckpt-mib M] [--ckpt-dir DIR] [--gpu-elements N]\n"
    "          [--torch-python PYTHON]\n"
    "          [--scale-worlds W,...] [--scale-load FROM:INTO] [--scale-reps R] [--scale-unit-per-param]\n"
    "          [--form-worlds W,...]\n"
    "          [SECTION...]\n";

}  // namespace

int main(int argc, char **argv) {
#ifdef SX_BENCH_OPENMP
    // OpenMP reads its wait policy when it loads: the adamw_kernel section compares the
    // pool with OpenMP threads that sleep between regions, as the pool's do (see
    // section_kernel.cc), unless the caller chose a policy.
    if (!std::getenv("OMP_WAIT_POLICY")) {
        ::setenv("OMP_WAIT_POLICY", "passive", 1);
        ::setenv("SX_BENCH_SET_OMP_WAIT_POLICY", "1", 1);  // torch_command() takes it back for torch
        ::execv("/proc/self/exe", argv);  // returns only if it failed: go on as we are
    }
#endif
    if (argc > 1 && !std::strcmp(argv[1], "--pipeline-rank")) return pipeline_rank_main(argc, argv);
    if (argc > 1 && !std::strcmp(argv[1], "--mesh-rank")) return mesh_rank_main(argc, argv);
    if (argc > 1 && !std::strcmp(argv[1], "--shm-rank")) return shm_rank_main(argc, argv);
    if (argc > 1 && !std::strcmp(argv[1], "--shm-step-rank")) return shm_step_rank_main(argc, argv);
    if (argc > 1 && !std::strcmp(argv[1], "--regroup-rank")) return regroup_rank_main(argc, argv);
    if (argc > 1 && !std::strcmp(argv[1], "--context-rank")) return context_rank_main(argc, argv);
    if (argc > 1 && !std::strcmp(argv[1], "--form-rank")) return form_rank_main(argc, argv);
#ifdef SX_BENCH_NETLAB
    if (argc > 1 && !std::strcmp(argv[1], "--hosts-rank")) return hosts_rank_main(argc, argv);
#endif
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
        } else if (!std::strcmp(argv[i], "--torch-python") && i + 1 < argc) {
            opt.torch_python = argv[++i];
        } else if (!std::strcmp(argv[i], "--gpu-elements") && i + 1 < argc) {
            opt.gpu_elements = std::strtoull(argv[++i], nullptr, 10);
        } else if (!std::strcmp(argv[i], "--scale-worlds") && i + 1 < argc) {
            if (!parse_list(argv[++i], &opt.scale_worlds)) {
                std::fprintf(stderr, "bench_sx: --scale-worlds takes positive numbers separated by commas\n");
                return 2;
            }
        } else if (!std::strcmp(argv[i], "--scale-load") && i + 1 < argc) {
            if (std::sscanf(argv[++i], "%d:%d", &opt.scale_load_from, &opt.scale_load_into) != 2) {
                std::fprintf(stderr, "bench_sx: --scale-load takes FROM:INTO, two world sizes\n");
                return 2;
            }
        } else if (!std::strcmp(argv[i], "--scale-reps") && i + 1 < argc) {
            opt.scale_reps = std::atoi(argv[++i]);
        } else if (!std::strcmp(argv[i], "--form-worlds") && i + 1 < argc) {
            if (!parse_list(argv[++i], &opt.form_worlds)) {
                std::fprintf(stderr, "bench_sx: --form-worlds takes positive numbers separated by commas\n");
                return 2;
            }
        } else if (!std::strcmp(argv[i], "--scale-unit-per-param")) {
            opt.scale_unit_per_param = true;
        } else if (argv[i][0] == '-') {
            std::fprintf(stderr, kUsage, argv[0]);
            return 2;
        } else {
            wanted.push_back(argv[i]);
        }
    }
    if (opt.elements == 0 || opt.comm_mib == 0 || opt.reps < 1 || opt.ckpt_mib == 0 || opt.gpu_elements == 0 ||
        opt.scale_reps < 1 || opt.scale_load_from < 1 || opt.scale_load_into < 1) {
        std::fprintf(stderr,
                     "bench_sx: --elements, --comm-mib, --reps, --ckpt-mib, --gpu-elements, --scale-reps and "
                     "--scale-load must be positive\n");
        return 2;
    }
    int rc = 0;
    for (const Section &s : kSections) {
        if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), s.name) == wanted.end()) continue;
        rc |= s.run(opt);
    }
    return rc;
}
