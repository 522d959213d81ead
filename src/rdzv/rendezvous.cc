// Parsing of rendezvous strings (rendezvous.h). Every error names the variable or the
// part of the URL that is wrong and says what was expected.
#include "rdzv/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/log.h"

namespace sx {
namespace rdzv {
namespace {

// Parses all of `text` as a decimal integer in [lo, hi]; false on anything else
// (empty, sign only, trailing junk, overflow).
bool parse_int(const char *text, long lo, long hi, long *out) {
    if (text == nullptr || *text == '\0') return false;
    errno = 0;
    char *end = nullptr;
    long v = std::strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool starts_with(const std::string &s, const char *prefix) {
    return s.compare(0, std::strlen(prefix), prefix) == 0;
}

// The launchers whose variables carry rank and world size, in the order they are tried.
struct RankVariables {
    const char *rank;
    const char *size;
    const char *launcher;
};
constexpr RankVariables kRankVariables[] = {
    {"RANK", "WORLD_SIZE", "torchrun"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun"},
    {"SLURM_PROCID", "SLURM_NTASKS", "srun"},
};

// Rank and world size from the first launcher family that has either variable set.
Status rank_from_environment(int *rank, int *world_size) {
    for (const RankVariables &v : kRankVariables) {
        const char *r = std::getenv(v.rank);
        const char *n = std::getenv(v.size);
        if (r == nullptr && n == nullptr) continue;
        SX_CHECK_ARG(r != nullptr, "%s is set but %s is not (both come from %s)", v.size, v.rank,
                     v.launcher);
        SX_CHECK_ARG(n != nullptr, "%s is set but %s is not (both come from %s)", v.rank, v.size,
                     v.launcher);
        long world = 0, me = 0;
        SX_CHECK_ARG(parse_int(n, 1, SX_MAX_WORLD_SIZE, &world), "%s='%s' is not a world size in [1, SX_MAX_WORLD_SIZE = %d]",
                     v.size, n, SX_MAX_WORLD_SIZE);
        SX_CHECK_ARG(parse_int(r, 0, world - 1, &me), "%s='%s' is not a rank in [0, %s-1 = %ld]", v.rank, r,
                     v.size, world - 1);
        *rank = static_cast<int>(me);
        *world_size = static_cast<int>(world);
        return Status::Ok();
    }
    return SX_ERROR(SX_ERR_INVALID_ARGUMENT,
                    "the rank and world size come from the environment, but none is set: set RANK and "
                    "WORLD_SIZE (as torchrun does), or launch with mpirun (OMPI_COMM_WORLD_RANK/"
                    "OMPI_COMM_WORLD_SIZE) or srun (SLURM_PROCID/SLURM_NTASKS)");
}

// Whether env:// joins the store torchrun's agent serves on MASTER_PORT rather than
// serving sx's own there: SX_ENV_STORE says so, or else TORCHELASTIC_USE_AGENT_STORE,
// which torchrun sets to "True" when its agent serves a c10d TCPStore at
// MASTER_ADDR:MASTER_PORT for the workers (torch.distributed compares it the same way).
// mpirun and srun serve nothing: rank 0 serves there. *external: an sx-rendezvous
// serves sx's store there (SX_ENV_STORE=external).
Status env_joins_store(bool *join, bool *external) {
    *external = false;
    const char *choice = std::getenv("SX_ENV_STORE");
    if (choice != nullptr && *choice != '\0') {
        const std::string c = choice;
        SX_CHECK_ARG(c == "serve" || c == "join" || c == "external",
                     "SX_ENV_STORE='%s' is none of 'serve' (rank 0 serves sx's store on MASTER_PORT), 'join' "
                     "(every rank joins the torch TCPStore served there) and 'external' (the sx-rendezvous "
                     "command serves sx's store there)",
                     choice);
        *join = c == "join";
        *external = c == "external";
        return Status::Ok();
    }
    const char *agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    *join = agent != nullptr && std::strcmp(agent, "True") == 0;
    return Status::Ok();
}

// sx's part of a joined store, which lives as long as torchrun's agent: one part per
// run (TORCHELASTIC_RUN_ID) and per attempt (TORCHELASTIC_RESTART_COUNT), so that the
// workers the agent restarts after a failure never read the keys of the ones before.
std::string joined_key_prefix() {
    const char *run = std::getenv("TORCHELASTIC_RUN_ID");
    const char *attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    return std::string("sx/") + (run != nullptr && *run != '\0' ? run : "none") + "/" +
           (attempt != nullptr && *attempt != '\0' ? attempt : "0") + "/";
}

Status parse_port(const std::string &text, const std::string &what, int *port) {
    long p = 0;
    SX_CHECK_ARG(parse_int(text.c_str(), 1, 65535, &p), "port '%s' in %s is not a number in [1, 65535]",
                 text.c_str(), what.c_str());
    *port = static_cast<int>(p);
    return Status::Ok();
}

// tcp://HOST:PORT with HOST a name, an IPv4 address or a bracketed IPv6 address.
Status parse_host_port(const std::string &url, const std::string &rest, Rendezvous *rv) {
    std::string host, port;
    if (!rest.empty() && rest[0] == '[') {
        size_t close = rest.find(']');
        SX_CHECK_ARG(close != std::string::npos, "'%s': an IPv6 address opened with '[' needs a closing ']'",
                     url.c_str());
        host = rest.substr(1, close - 1);
        SX_CHECK_ARG(close + 1 < rest.size() && rest[close + 1] == ':',
                     "'%s' has no port: expected tcp://[ADDRESS]:PORT", url.c_str());
        port = rest.substr(close + 2);
    } else {
        size_t colon = rest.rfind(':');
        SX_CHECK_ARG(colon != std::string::npos, "'%s' has no port: expected tcp://HOST:PORT", url.c_str());
        host = rest.substr(0, colon);
        port = rest.substr(colon + 1);
        SX_CHECK_ARG(host.find(':') == std::string::npos,
                     "'%s': an IPv6 address must be written in brackets, as tcp://[::1]:PORT", url.c_str());
    }
    SX_CHECK_ARG(!host.empty(), "'%s' has no host: expected tcp://HOST:PORT", url.c_str());
    SX_TRY(parse_port(port, "'" + url + "'", &rv->port));
    rv->host = host;
    return Status::Ok();
}

}  // namespace

Status parse_rendezvous(const char *url, int rank, int world_size, Rendezvous *out) {
    SX_CHECK_ARG(url != nullptr && *url != '\0',
                 "the rendezvous is empty: expected env://, tcp://HOST:PORT, file:///DIR or local://NAME");
    SX_CHECK_ARG(out != nullptr, "out is NULL");
    SX_CHECK_ARG(world_size >= 0, "world_size %d must be >= 0 (0 = from the environment)", world_size);
    Rendezvous rv;
    rv.url = url;
    const std::string &u = rv.url;
    bool rank_read = false;  // env:// reads rank and world size before the address
    if (starts_with(u, "env://")) {
        SX_CHECK_ARG(u.size() == 6, "'%s': env:// takes no address (it comes from MASTER_ADDR and MASTER_PORT)",
                     url);
        SX_TRY(rank_from_environment(&rv.rank, &rv.world_size));
        rank_read = true;
        bool join = false;
        SX_TRY(env_joins_store(&join, &rv.external));
        rv.scheme = join ? Rendezvous::Scheme::kC10d : Rendezvous::Scheme::kTcp;
        if (join) rv.key_prefix = joined_key_prefix();
        const char *addr = std::getenv("MASTER_ADDR");
        const char *port = std::getenv("MASTER_PORT");
        SX_CHECK_ARG(addr != nullptr && *addr != '\0',
                     "env:// needs MASTER_ADDR, the host of the rendezvous store, and it is not set");
        SX_CHECK_ARG(port != nullptr && *port != '\0', "env:// needs MASTER_PORT, and it is not set");
        rv.host = addr;
        // MASTER_ADDR is a bare address; accept an IPv6 one with or without brackets.
        if (rv.host.size() > 2 && rv.host.front() == '[' && rv.host.back() == ']')
            rv.host = rv.host.substr(1, rv.host.size() - 2);
        SX_TRY(parse_port(port, "MASTER_PORT", &rv.port));
    } else if (starts_with(u, "tcp://")) {
        rv.scheme = Rendezvous::Scheme::kTcp;
        std::string rest = u.substr(6);
        const size_t query = rest.find('?');
        if (query != std::string::npos) {
            const std::string q = rest.substr(query + 1);
            SX_CHECK_ARG(q == "server=external",
                         "'%s': the only option a tcp:// rendezvous takes is '?server=external' (the sx-rendezvous "
                         "command serves the store; rank 0 serves none), not '?%s'",
                         url, q.c_str());
            rv.external = true;
            rest = rest.substr(0, query);
        }
        SX_TRY(parse_host_port(u, rest, &rv));
    } else if (starts_with(u, "file://")) {
        rv.scheme = Rendezvous::Scheme::kFile;
        rv.path = u.substr(7);
        SX_CHECK_ARG(!rv.path.empty(), "'%s' has no directory: expected file:///DIR", url);
    } else if (starts_with(u, "local://")) {
        rv.scheme = Rendezvous::Scheme::kLocal;
        rv.name = u.substr(8);
        SX_CHECK_ARG(!rv.name.empty(), "'%s' has no name: expected local://NAME", url);
    } else {
        size_t sep = u.find("://");
        return SX_ERROR(SX_ERR_INVALID_ARGUMENT,
                        "unknown rendezvous scheme '%s' in '%s': expected env://, tcp://HOST:PORT, "
                        "file:///DIR or local://NAME",
                        sep == std::string::npos ? u.c_str() : u.substr(0, sep + 3).c_str(), url);
    }
    if (rank_read) {
        // done above
    } else if (world_size == 0) {
        SX_TRY(rank_from_environment(&rv.rank, &rv.world_size));
    } else {
        SX_CHECK_ARG(rank >= 0 && rank < world_size, "rank %d is not in [0, world_size %d)", rank, world_size);
        rv.rank = rank;
        rv.world_size = world_size;
    }
    *out = rv;
    return Status::Ok();
}

Status apply_rendezvous_guard(const char *token, const char *bind, Rendezvous *rv) {
    const char *t = token != nullptr && *token != '\0' ? token : std::getenv("SX_RENDEZVOUS_TOKEN");
    const char *b = bind != nullptr && *bind != '\0' ? bind : std::getenv("SX_RENDEZVOUS_BIND");
    const bool from_config = token != nullptr && *token != '\0';
    const std::string secret = t != nullptr ? t : "";
    SX_CHECK_ARG(secret.size() <= kMaxTokenBytes, "the rendezvous token (%s) has %zu bytes; at most %zu are taken",
                 from_config ? "config->rendezvous_token" : "SX_RENDEZVOUS_TOKEN", secret.size(), kMaxTokenBytes);
    rv->bind = b != nullptr ? b : "";
    rv->token.clear();
    if (secret.empty()) return Status::Ok();
    switch (rv->scheme) {
    case Rendezvous::Scheme::kTcp:
        rv->token = secret;
        break;
    case Rendezvous::Scheme::kC10d:
        log(SX_LOG_WARN,
            "sx: a rendezvous token is set, but env:// joins the store torchrun's agent serves at %s:%d, which "
            "cannot ask for one: the token is not used (keep that port off untrusted networks, or serve sx's own "
            "store with SX_ENV_STORE=serve)",
            rv->host.c_str(), rv->port);
        break;
    case Rendezvous::Scheme::kLocal:
    case Rendezvous::Scheme::kFile:
        break;  // no server: the process or the directory's permissions are the boundary
    }
    return Status::Ok();
}

std::string address_towards(const Rendezvous &rv) {
    if ((rv.scheme != Rendezvous::Scheme::kTcp && rv.scheme != Rendezvous::Scheme::kC10d) || rv.host.empty() ||
        rv.host == "localhost" || rv.host.compare(0, 4, "127.") == 0 || rv.host == "::1")
        return "";
    struct addrinfo hints;
    std::memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    struct addrinfo *res = nullptr;
    if (::getaddrinfo(rv.host.c_str(), std::to_string(rv.port > 0 ? rv.port : 1).c_str(), &hints, &res) != 0) return "";
    std::string out;
    for (struct addrinfo *ai = res; ai != nullptr && out.empty(); ai = ai->ai_next) {
        // A datagram socket's connect() only picks the route: nothing is sent.
        const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        struct sockaddr_storage local;
        socklen_t len = sizeof local;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            ::getsockname(fd, reinterpret_cast<struct sockaddr *>(&local), &len) == 0) {
            char text[INET6_ADDRSTRLEN] = {0};
            const void *addr = local.ss_family == AF_INET
                                   ? static_cast<const void *>(&reinterpret_cast<struct sockaddr_in *>(&local)->sin_addr)
                                   : static_cast<const void *>(&reinterpret_cast<struct sockaddr_in6 *>(&local)->sin6_addr);
            if (::inet_ntop(local.ss_family, addr, text, sizeof text) != nullptr &&
                std::strncmp(text, "127.", 4) != 0 && std::strcmp(text, "::1") != 0)
                out = text;
        }
        ::close(fd);
    }
    ::freeaddrinfo(res);
    return out;
}

}  // namespace rdzv
}  // namespace sx
