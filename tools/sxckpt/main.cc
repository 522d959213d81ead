// sxckpt: looks into sx checkpoints without the program that wrote them, and moves
// them to and from torch's tensors.
//   sxckpt inspect [--json] DIR             what the checkpoint holds
//   sxckpt verify DIR                       every byte checked against its CRC32C
//   sxckpt export --safetensors OUT [--optimizer PREFIX [--state-format torch|torchao]] DIR...
//                                           the unsharded params; their optimizer state
//   sxckpt import --safetensors IN [--optimizer PREFIX] [--world-size N] DIR
//                                           a new checkpoint from such files
//   sxckpt join [--world-size N] OUT DIR... the slices' checkpoints as one of the
//                                           logical model
#include <algorithm>
#include <cstdio>
#include <exception>

#include "ckpt/manifest.h"
#include "commands.h"

namespace sx {
namespace tool {

const char *const kUsage =
    "usage: sxckpt inspect [--json] DIR\n"
    "       sxckpt verify DIR\n"
    "       sxckpt export --safetensors OUT [--optimizer PREFIX [--state-format F]] DIR...\n"
    "       sxckpt import --safetensors IN [--optimizer PREFIX] [--world-size N] DIR\n"
    "       sxckpt join [--world-size N] OUT DIR...\n"
    "       sxckpt --help | --version\n"
    "\n"
    "DIR is an sx checkpoint directory (MANIFEST and shard-RRRRR-of-WWWWW.bin files).\n"
    "  inspect  prints the format and library versions, step, world size, stage, creation\n"
    "           time, user blob size, the params, the param groups with their\n"
    "           hyperparameters, and the files; --json prints one JSON object instead.\n"
    "  verify   checks the MANIFEST, that every shard file holds the bytes its chunks\n"
    "           need, and every chunk's CRC32C; names every broken file and chunk.\n"
    "  export   writes the full (unsharded) params as a safetensors file OUT, one tensor\n"
    "           NAME per param (what torch's load_state_dict(strict=True) takes). With\n"
    "           --optimizer, also PREFIX.safetensors (NAME.exp_avg, NAME.exp_avg_sq,\n"
    "           NAME.max_exp_avg_sq, NAME.momentum_buffer) and PREFIX.json (the param\n"
    "           groups in torch's names, every param's step). Streams chunk by chunk;\n"
    "           the files appear only whole. Optimizer state kept in bf16 or 8 bits is\n"
    "           written as fp32 (--state-format torch, the default: 8-bit codes decoded\n"
    "           with their scales), or with --state-format torchao as torchao's\n"
    "           OptimState8bit holds it: NAME.exp_avg.codes (U8) and NAME.exp_avg.scale\n"
    "           (F32, one per block of 256), bf16 as BF16, all copied as stored.\n"
    "           Several DIRs (the checkpoints of a model-parallel trainer's slices):\n"
    "           each logical tensor whole, its pieces joined by the placements the\n"
    "           checkpoints record, a replicated param once; with --optimizer, every\n"
    "           state tensor joined so too (the checkpoints' param groups equal, each\n"
    "           param's pieces of equal steps; refused: Adafactor's row_var and col_var\n"
    "           of a split param, and torchao's 8-bit form of a split param whose\n"
    "           pieces' blocks are not the logical tensor's).\n"
    "  import   makes the new checkpoint DIR from such files, as if saved by N ranks\n"
    "           (default 1). Without --optimizer it holds the values only: load it with\n"
    "           SX_LOAD_PARAMS_ONLY. A param group whose \"state_dtype\" in PREFIX.json\n"
    "           is \"bf16\" or \"8bit\" gets its state in that form: fp32 tensors rounded\n"
    "           or quantized, torchao's codes and scales copied. DIR must not exist; it\n"
    "           appears only whole.\n"
    "  join     makes the new checkpoint OUT of the logical model from the checkpoints\n"
    "           of a model-parallel trainer's slices, as if saved by N ranks (default\n"
    "           1): every param whole, its values and optimizer state joined from its\n"
    "           pieces exactly (bf16 and 8-bit state copied, never quantized again),\n"
    "           steps, param groups, and the first DIR's loss scaler and user blob. It\n"
    "           loads into a group of the unsharded model at any world size. Refused,\n"
    "           naming the param: what export --optimizer refuses, and a split param\n"
    "           whose pieces keep another state dtype than the whole would, or keep\n"
    "           8-bit state in blocks that are not the whole's. OUT must not exist;\n"
    "           it appears only whole, and a failed join leaves nothing.\n"
    "\n"
    "exit status: 0 success (verify: intact), 1 failure (verify: broken), 2 usage error\n";

int usage_error(const std::string &message) {
    std::fprintf(stderr, "sxckpt: %s\n%s", message.c_str(), kUsage);
    return kExitUsage;
}

int failure(const Status &s) {
    std::fprintf(stderr, "sxckpt: %s\n", s.message().c_str());
    return kExitFailed;
}

bool is_help(const std::string &a) { return a == "-h" || a == "--help"; }

int parse_args(const std::string &command, const std::vector<std::string> &args,
               const std::vector<std::pair<std::string, std::string *>> &options,
               std::vector<std::string> *positional) {
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string &a = args[i];
        if (is_help(a)) {
            std::fputs(kUsage, stdout);
            return kExitOk;
        }
        const auto option = std::find_if(options.begin(), options.end(), [&](const auto &o) {
            return a == o.first || a.compare(0, o.first.size() + 1, o.first + "=") == 0;
        });
        if (option != options.end()) {
            const std::string &name = option->first;
            std::string value;
            if (a != name)
                value = a.substr(name.size() + 1);
            else if (i + 1 < args.size())
                value = args[++i];
            if (value.empty()) return usage_error(command + ": " + name + " needs a value");
            *option->second = value;
            continue;
        }
        if (a.size() > 1 && a[0] == '-') return usage_error(command + ": unknown option '" + a + "'");
        positional->push_back(a);
    }
    return -1;
}

}  // namespace tool
}  // namespace sx

int main(int argc, char **argv) {
    using namespace sx::tool;
    if (argc < 2) return usage_error("no command given");
    const std::string command = argv[1];
    const std::vector<std::string> args(argv + 2, argv + argc);
    try {
        if (is_help(command) || command == "help") {
            std::fputs(kUsage, stdout);
            return kExitOk;
        }
        if (command == "--version") {
            const uint32_t v = sx_version();
            std::printf("sxckpt (sx %u.%u.%u), reads checkpoint format %u.x\n", v / 10000, v / 100 % 100, v % 100,
                        static_cast<unsigned>(sx::ckpt::kFormatMajor));
            return kExitOk;
        }
        if (command == "inspect") return inspect_command(args);
        if (command == "verify") return verify_command(args);
        if (command == "export") return export_command(args);
        if (command == "import") return import_command(args);
        if (command == "join") return join_command(args);
        return usage_error("unknown command '" + command + "'");
    } catch (const std::exception &e) {
        // Allocation failures and the like: say so rather than abort.
        std::fprintf(stderr, "sxckpt: %s\n", e.what());
        return kExitFailed;
    }
}
