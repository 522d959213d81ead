// Real ranks as processes: the test program re-executes itself (/proc/self/exe) once
// per rank with "--rank R --world W --rendezvous tcp://127.0.0.1:PORT" and its own
// arguments, and waits for all of them with a deadline.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "free_port.h"

namespace sxtest {

struct ChildArgs {
    int rank = 0;
    int world = 0;
    std::string rendezvous;
    std::vector<std::pair<std::string, std::string>> extra;
    std::string get(const std::string &key, const std::string &fallback) const;
};

bool is_child(int argc, char **argv);
bool parse_child_args(int argc, char **argv, ChildArgs *out);

struct ProcessResult {
    int exit_code = -1;  // -1 if killed by a signal or still running at the deadline
    int signal = 0;
};

// Starts `world` ranks with `extra` arguments (key value pairs); returns "" if all
// exited 0 within timeout_s, else which did not.
std::string run_process_ranks(int world, const std::vector<std::string> &extra, int timeout_s,
                              std::vector<ProcessResult> *results = nullptr);

}  // namespace sxtest
