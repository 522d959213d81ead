// Rendezvous strings (docs/design.md, "Rendezvous") and the store behind each.
#pragma once

#include <memory>
#include <string>

#include "rdzv/store.h"

namespace sx {
namespace rdzv {

struct Rendezvous {
    // kC10d: env:// joining the torch TCPStore at host:port (torchrun's agent store).
    enum class Scheme { kLocal, kFile, kTcp, kC10d } scheme = Scheme::kLocal;
    std::string url;         // as given
    std::string name;        // local://NAME
    std::string path;        // file:///DIR -> /DIR
    std::string host;        // tcp://HOST:PORT, or MASTER_ADDR for env://
    std::string key_prefix;  // kC10d: sx's part of the shared store, "sx/RUN/ATTEMPT/"
    int port = 0;
    int rank = 0;
    int world_size = 0;
    // kTcp: the secret every client proves it holds ("" = none), and where rank 0's
    // server listens ("" = the address `host` resolves to; "*" = every interface).
    std::string token;
    std::string bind;
    // kTcp: a server of its own serves the store (the sx-rendezvous command:
    // tcp://HOST:PORT?server=external, or env:// with SX_ENV_STORE=external), so that it
    // outlives every rank; rank 0 serves none.
    bool external = false;
    // A process joining a running group (SX_GROUP_JOIN): it sees the store through the
    // key space of the first group on this rendezvous (its own count of groups, apart
    // from its ranks'), serves nothing, and never counts itself out of that key space
    // (key_space.cc), whose members do.
    bool joining = false;
};

// The largest token accepted, in bytes.
constexpr size_t kMaxTokenBytes = 4096;

// Sets rv->token and rv->bind from the group's config (`token`, `bind`: NULL or "" =
// unset), or else from SX_RENDEZVOUS_TOKEN and SX_RENDEZVOUS_BIND. They apply to sx's
// own TCP server (tcp://, and env:// where rank 0 serves); local:// and file:// need
// none, and torch's store (env:// joining torchrun's agent) cannot ask for one: the token
// is then ignored, with a warning in the log. A token longer than kMaxTokenBytes is
// SX_ERR_INVALID_ARGUMENT (the message never shows the token).
Status apply_rendezvous_guard(const char *token, const char *bind, Rendezvous *rv);

// Parses `url`. For env:// (or world_size == 0) rank and world size come from the
// environment: RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE
// (mpirun), SLURM_PROCID/SLURM_NTASKS (srun); the address from MASTER_ADDR and
// MASTER_PORT. env:// then either serves or joins a store there: SX_ENV_STORE=serve
// makes it a tcp rendezvous (rank 0 serves sx's store), SX_ENV_STORE=join a kC10d one
// (every rank joins the torch TCPStore served there), SX_ENV_STORE=external a tcp one
// that the sx-rendezvous command serves there; unset, it joins exactly when
// TORCHELASTIC_USE_AGENT_STORE is "True" (torchrun's agent serves its store on
// MASTER_PORT and says so). Otherwise rank/world_size are taken as given and checked
// (0 <= rank < world_size). Errors name the variable or the part of the URL that is
// wrong.
Status parse_rendezvous(const char *url, int rank, int world_size, Rendezvous *out);

// Opens the store: local:// shares one in-process store per NAME among the threads;
// file:// uses the directory (created if missing); tcp:// starts the libuv server on
// rank 0 and connects every rank (rank 0 included) as a client, retrying until
// `timeout`; kC10d connects every rank to the torch TCPStore, under rv.key_prefix. The returned store is private to one group: each successive group a
// process creates on the same rendezvous gets a fresh key space, so stale keys of an
// earlier group are never seen (key_space.cc says how). A file:// directory must be
// fresh for each job: a group's keys are removed when its last rank releases the
// store, but a job that crashed leaves its keys behind. Thread-safe; the store is too.
Status open_store(const Rendezvous &rv, Millis timeout, std::shared_ptr<Store> *out);

// The address this host reaches the store of `rv` from (the source address of its route
// to a tcp:// or env:// host that is not a loopback one): the interface through which its
// peers on other hosts reach it too, which is what its transport should bind. "" where
// there is none to choose (local://, file://, loopback, an unresolvable host).
std::string address_towards(const Rendezvous &rv);

}  // namespace rdzv
}  // namespace sx
