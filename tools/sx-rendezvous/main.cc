// sx-rendezvous: sx's TCP rendezvous store served by a process of its own, so that it
// outlives every rank of the job (a group that loses rank 0 can still regroup: see
// sx_regroup). Ranks reach it with tcp://HOST:PORT?server=external, or env:// with
// SX_ENV_STORE=external.
//   sx-rendezvous --port PORT [--bind ADDRESS] [--max-ranks N]
// The token comes from SX_RENDEZVOUS_TOKEN (never from the command line, which other
// users of the machine can read). Runs until SIGINT or SIGTERM.
#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "base/log.h"
#include "rdzv/rendezvous.h"
#include "rdzv/tcp_store_server.h"

namespace {

const char *const kUsage =
    "usage: sx-rendezvous --port PORT [--bind ADDRESS] [--max-ranks N]\n"
    "       sx-rendezvous --help\n"
    "\n"
    "Serves sx's rendezvous store on PORT until SIGINT or SIGTERM, for one job: ranks\n"
    "name it tcp://HOST:PORT?server=external (or env:// with SX_ENV_STORE=external and\n"
    "MASTER_ADDR/MASTER_PORT). It outlives any rank, so the survivors of a lost rank can\n"
    "regroup on it. Start a new one (or use another port) for each job.\n"
    "  --port PORT      the port to listen on (1-65535)\n"
    "  --bind ADDRESS   the address to listen on (default *: every interface)\n"
    "  --max-ranks N    the most ranks of one group (default 1024; sizes the\n"
    "                   connection limit)\n"
    "The token every rank must prove it holds comes from SX_RENDEZVOUS_TOKEN (the ranks'\n"
    "from the same variable or sx_group_config_t.rendezvous_token).\n"
    "exit status: 0 stopped by a signal, 1 could not serve, 2 usage error\n";

int usage_error(const std::string &message) {
    std::fprintf(stderr, "sx-rendezvous: %s\n%s", message.c_str(), kUsage);
    return 2;
}

bool parse_number(const std::string &text, long lo, long hi, long *out) {
    if (text.empty()) return false;
    errno = 0;
    char *end = nullptr;
    const long v = std::strtol(text.c_str(), &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
    *out = v;
    return true;
}

void print_log(int32_t level, const char *message, void *) {
    std::fprintf(stderr, "sx-rendezvous: %s%s\n", level <= SX_LOG_WARN ? "warning: " : "", message);
}

}  // namespace

int main(int argc, char **argv) {
    long port = 0, max_ranks = 1024;
    std::string bind = "*";
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (i + 1 >= argc) return usage_error("'" + a + "' needs a value, or is not an option");
        const std::string v = argv[++i];
        if (a == "--port") {
            if (!parse_number(v, 1, 65535, &port)) return usage_error("--port '" + v + "' is not a port in 1-65535");
        } else if (a == "--bind") {
            if (v.empty()) return usage_error("--bind is empty");
            bind = v;
        } else if (a == "--max-ranks") {
            if (!parse_number(v, 1, SX_MAX_WORLD_SIZE, &max_ranks))
                return usage_error("--max-ranks '" + v + "' is not in 1-" + std::to_string(SX_MAX_WORLD_SIZE));
        } else {
            return usage_error("unknown option '" + a + "'");
        }
    }
    if (port == 0) return usage_error("--port is required");
    const char *token = std::getenv("SX_RENDEZVOUS_TOKEN");
    if (token != nullptr && std::strlen(token) > sx::rdzv::kMaxTokenBytes) {
        std::fprintf(stderr, "sx-rendezvous: SX_RENDEZVOUS_TOKEN has %zu bytes; at most %zu are taken\n",
                     std::strlen(token), sx::rdzv::kMaxTokenBytes);
        return 2;
    }
    // The signals that stop it are taken by sigwait below, on this thread; blocked before
    // the server's thread starts, which inherits the mask.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    sx::set_log_callback(print_log, nullptr, SX_LOG_WARN);

    sx::rdzv::ServerOptions options;
    options.port = static_cast<int>(port);
    options.host = bind == "*" ? "" : bind;
    options.bind = bind;
    options.token = token != nullptr ? token : "";
    options.world_size = static_cast<int>(max_ranks);
    std::shared_ptr<sx::rdzv::TcpStoreServer> server;
    sx::Status s = sx::rdzv::TcpStoreServer::acquire(options, &server);
    if (!s.ok()) {
        std::fprintf(stderr, "sx-rendezvous: %s\n", s.message().c_str());
        return 1;
    }
    std::printf("sx-rendezvous: serving on %s port %ld (%s)\n", server->bound_address().c_str(), port,
                options.token.empty() ? "no token: anyone who reaches the port may join; set SX_RENDEZVOUS_TOKEN"
                                      : "ranks must prove they hold SX_RENDEZVOUS_TOKEN");
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop, &sig);
    const size_t peak = server->peak_connections();
    const sx::rdzv::StoreCore::Stats st = server->stats();
    server.reset();
    std::printf("sx-rendezvous: stopped by %s (%zu connections open at most, %zu keys held, %llu peers refused)\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM", peak, st.keys, static_cast<unsigned long long>(st.refused));
    return 0;
}
