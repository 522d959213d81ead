// The sxckpt commands. Each takes the arguments after its name and returns the exit
// status: kExitOk, kExitFailed (the checkpoint is broken or unreadable, or the work
// failed), kExitUsage (the command line is wrong).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace sx {
namespace tool {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

int inspect_command(const std::vector<std::string> &args);
int verify_command(const std::vector<std::string> &args);
int export_command(const std::vector<std::string> &args);
int import_command(const std::vector<std::string> &args);

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
