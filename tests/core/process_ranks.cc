#include "process_ranks.h"

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstring>

extern char **environ;

namespace sxtest {

std::string ChildArgs::get(const std::string &key, const std::string &fallback) const {
    for (const auto &kv : extra)
        if (kv.first == key) return kv.second;
    return fallback;
}

bool is_child(int argc, char **argv) { return argc > 1 && std::strcmp(argv[1], "--rank") == 0; }

bool parse_child_args(int argc, char **argv, ChildArgs *out) {
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string k = argv[i], v = argv[i + 1];
        if (k == "--rank")
            out->rank = std::atoi(v.c_str());
        else if (k == "--world")
            out->world = std::atoi(v.c_str());
        else if (k == "--rendezvous")
            out->rendezvous = v;
        else
            out->extra.emplace_back(k, v);
    }
    return out->world > 0 && !out->rendezvous.empty();
}

std::string run_process_ranks(int world, const std::vector<std::string> &extra, int timeout_s,
                              std::vector<ProcessResult> *results) {
    const std::string rv = "tcp://127.0.0.1:" + std::to_string(free_port());
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r) {
        std::vector<std::string> args = {"/proc/self/exe", "--rank", std::to_string(r), "--world",
                                         std::to_string(world), "--rendezvous", rv};
        args.insert(args.end(), extra.begin(), extra.end());
        std::vector<char *> argv;
        for (auto &a : args) argv.push_back(&a[0]);
        argv.push_back(nullptr);
        pid_t pid;
        if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0)
            return "posix_spawn failed";
        pids.push_back(pid);
    }
    std::vector<ProcessResult> res(world);
    std::vector<bool> done(world, false);
    timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int remaining = world;
    while (remaining > 0) {
        for (int r = 0; r < world; ++r) {
            if (done[r]) continue;
            int status;
            if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
                done[r] = true;
                --remaining;
                if (WIFEXITED(status)) res[r].exit_code = WEXITSTATUS(status);
                if (WIFSIGNALED(status)) res[r].signal = WTERMSIG(status);
            }
        }
        timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > timeout_s) break;
        if (remaining > 0) usleep(20000);
    }
    std::string err;
    for (int r = 0; r < world; ++r) {
        if (!done[r]) {
            kill(pids[r], SIGKILL);
            waitpid(pids[r], nullptr, 0);
            err += "rank " + std::to_string(r) + " still running after " + std::to_string(timeout_s) + " s; ";
        } else if (res[r].exit_code != 0) {
            err += "rank " + std::to_string(r) + " exited with " + std::to_string(res[r].exit_code) +
                   (res[r].signal ? " (signal " + std::to_string(res[r].signal) + ")" : "") + "; ";
        }
    }
    if (results) *results = res;
    return err;
}

}  // namespace sxtest
