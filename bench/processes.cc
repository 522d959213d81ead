// Ranks as processes for the sections that need them: this program started again once
// per rank, and free TCP ports for their rendezvous.
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "bench_util.h"
#include "sx/sx.h"

extern char **environ;

namespace sxbench {

int free_ports(int n) {
    auto bindable = [](int port) {
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a;
        std::memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<uint16_t>(port));
        const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
        if (fd >= 0) close(fd);
        return ok;
    };
    for (int attempt = 0; attempt < 100; ++attempt) {
        const int base = 20000 + static_cast<int>((static_cast<unsigned>(::getpid()) * 7919u + attempt * 104729u) % 30000u);
        int k = 0;
        while (k < n && bindable(base + k)) ++k;
        if (k == n) return base;
    }
    return 0;
}

bool run_self(int world, const std::function<std::vector<std::string>(int rank)> &args) {
    std::vector<pid_t> pids;
    bool ok = true;
    for (int r = 0; r < world && ok; ++r) {
        std::vector<std::string> a = args(r);
        a.insert(a.begin(), "/proc/self/exe");
        std::vector<char *> argv;
        for (const std::string &s : a) argv.push_back(const_cast<char *>(s.c_str()));
        argv.push_back(nullptr);
        pid_t pid;
        if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) {
            ok = false;
            break;
        }
        pids.push_back(pid);
    }
    for (pid_t p : pids) {
        int status = 0;
        if (waitpid(p, &status, 0) != p || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ok = false;
    }
    return ok;
}

sx_shard_group_t *make_sgd_group(const char *section, const std::string &url, int rank, int world, int stage,
                                 int prefetch, int shard_size, int units, int64_t unit_numel, int32_t transport) {
    auto check = [section](sx_status_t st, const char *what) {
        if (st == SX_OK) return;
        std::fprintf(stderr, "bench_sx %s: %s: %s\n", section, what, sx_last_error_message());
        std::exit(1);
    };
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = url.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.stage = stage;
    cfg.num_threads = 1;
    cfg.prefetch_depth = prefetch;
    cfg.shard_size = shard_size;
    cfg.transport = transport;
    cfg.timeout_ms = 120000;
    sx_shard_group_t *g = nullptr;
    check(sx_create_shard_group(&cfg, &g), "sx_create_shard_group");
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_SGD);
    pg.lr = 1e-3;
    check(sx_add_param_group(g, &pg, nullptr), "sx_add_param_group");
    for (int u = 0; u < units; ++u) {
        const std::string name = "layer" + std::to_string(u);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = name.c_str();
        d.ndim = 1;
        d.shape = &unit_numel;
        d.unit = u;
        check(sx_add_param(g, &d, nullptr), "sx_add_param");
    }
    check(sx_finalize(g), "sx_finalize");
    return g;
}

}  // namespace sxbench
