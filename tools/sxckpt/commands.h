// The sxckpt commands. Each takes the arguments after its name and returns the exit
// status: kExitOk, kExitFailed (the checkpoint is broken or unreadable, or the work
// failed), kExitUsage (the command line is wrong).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "io/file_ops.h"

namespace sx {
namespace tool {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

int inspect_command(const std::vector<std::string> &args);
int verify_command(const std::vector<std::string> &args);
int export_command(const std::vector<std::string> &args);
int import_command(const std::vector<std::string> &args);
int join_command(const std::vector<std::string> &args);

// What `join` is made of (join.cc). export_for_join: the checkpoints `dirs` joined into
// the logical model's files, WEIGHTS and PREFIX.{safetensors,json}, as `export` writes
// them but for packed state copied as stored (torchao's form), PREFIX.json carrying the
// first checkpoint's loss scaler and user blob, and refusing what import would not store
// again exactly (a split param whose pieces keep a state dtype the logical tensor would
// not). import_for_join: `import` of those files into the new checkpoint DIR as saved by
// `world_size` ranks; *summary says what it wrote.
Status export_for_join(io::FileOps &ops, const std::vector<std::string> &dirs, const std::string &weights,
                       const std::string &prefix);
Status import_for_join(io::FileOps &ops, const std::string &weights, const std::string &prefix, int world_size,
                       const std::string &dir, std::string *summary);
// Parses --world-size's value into *n (1 .. the most ranks a checkpoint's file names
// allow); false if it is no such number.
bool parse_world_size(const std::string &text, int *n);

// The usage text of every command.
extern const char *const kUsage;

// Prints "sxckpt: MESSAGE" and the usage text to stderr; returns kExitUsage.
int usage_error(const std::string &message);
// Prints "sxckpt: MESSAGE" to stderr; returns kExitFailed.
int failure(const Status &s);
// Whether `a` asks for help ("-h", "--help").
bool is_help(const std::string &a);
// Reads a command's arguments: each of `options` (its name, "--name", and where its
// value goes) as "--name VALUE" or "--name=VALUE"; every argument that is no option into
// *positional. Returns -1 to go on, else the exit status: kExitOk once it printed the
// usage for -h or --help, kExitUsage (having said why) for an unknown option or one
// without its value.
int parse_args(const std::string &command, const std::vector<std::string> &args,
               const std::vector<std::pair<std::string, std::string *>> &options,
               std::vector<std::string> *positional);

}  // namespace tool
}  // namespace sx
