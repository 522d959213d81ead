// Rendezvous strings (docs/design.md, "Rendezvous") and the store behind each.
#pragma once

#include <memory>
#include <string>

#include "comm/store.h"

namespace sx {
namespace comm {

struct Rendezvous {
    enum class Scheme { kLocal, kFile, kTcp } scheme = Scheme::kLocal;
    std::string url;    // as given
    std::string name;   // local://NAME
    std::string path;   // file:///DIR -> /DIR
    std::string host;   // tcp://HOST:PORT, or MASTER_ADDR for env://
    int port = 0;
    int rank = 0;
    int world_size = 0;
};

// Parses `url`. For env:// (or world_size == 0) rank and world size come from the
// environment: RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE
// (mpirun), SLURM_PROCID/SLURM_NTASKS (srun); the address from MASTER_ADDR and
// MASTER_PORT; env:// becomes a tcp rendezvous. Otherwise rank/world_size are taken as
// given and checked (0 <= rank < world_size). Errors name the variable or the part of
// the URL that is wrong.
Status parse_rendezvous(const char *url, int rank, int world_size, Rendezvous *out);

// Opens the store: local:// shares one in-process store per NAME among the threads;
// file:// uses the directory (created if missing); tcp:// starts the libuv server on
// rank 0 and connects every rank (rank 0 included) as a client, retrying until
// `timeout`. The returned store is private to one group: each successive group a
// process creates on the same rendezvous gets a fresh key space, so stale keys of an
// earlier group are never seen (key_space.cc says how). A file:// directory must be
// fresh for each job: a group's keys are removed when its last rank releases the
// store, but a job that crashed leaves its keys behind. Thread-safe; the store is too.
Status open_store(const Rendezvous &rv, Millis timeout, std::shared_ptr<Store> *out);

}  // namespace comm
}  // namespace sx
