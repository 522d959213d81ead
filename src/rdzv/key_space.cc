// open_store (rendezvous.h): the store behind a rendezvous, seen through a key space
// private to one group.
//
// Key spaces. A process counts the groups it opens per (rendezvous, rank); its N-th
// group on a rendezvous sees the store through the prefix "g<N>/". Ranks create their
// groups in the same order (a group is collective), so the N-th group of every rank
// shares "g<N>/", and no group ever reads keys an earlier group left behind. This holds
// whether or not the store outlived the earlier groups: the in-process store of
// local:// dies with its last group, the TCP server with rank 0's last group on its
// port, a file:// directory and torchrun's agent store live on. In the agent's store,
// which torch and other sx groups share, the prefix is "sx/RUN/ATTEMPT/g<N>/"
// (rendezvous.cc): workers the agent restarts count their groups from 1 again.
//
// Leaving. Where the store outlives its groups (file://, torchrun's agent store, and
// local:// while other groups on the same name live), each rank counts itself out under
// "g<N>/__sx/left" when it releases the store, and the last of world_size ranks removes
// the group's keys: nobody reads them any more. A rank that dies never counts itself
// out, so its group's keys stay (a file:// directory must be fresh per job for this
// reason too). For the agent's store this costs each rank one round trip when it leaves
// (bounded by the group's timeout; at once an error if the agent is gone), worth it as
// the store lives for the whole job. sx's own TCP store does not do this: releasing
// must not wait on a network round trip to a server that may be gone or stalled, and
// its keys die with the server anyway.
#include <map>
#include <mutex>

#include "rdzv/rendezvous.h"
#include "rdzv/stores.h"
#include "rdzv/tcp_store_server.h"

namespace sx {
namespace rdzv {
namespace {

// The next group number (1, 2, ...) of `rank` on the rendezvous named `where`.
int64_t next_group_number(const std::string &where, int rank) {
    static std::mutex mu;
    static std::map<std::pair<std::string, int>, int64_t> *opened = new std::map<std::pair<std::string, int>, int64_t>();
    std::lock_guard<std::mutex> lock(mu);
    return ++(*opened)[{where, rank}];
}

// `store` seen through `prefix`; releasing the last pointer counts the rank out of the
// group and, for the last of `world_size` ranks, erases the group's keys.
std::shared_ptr<Store> leaving_key_space(std::shared_ptr<Store> store, const std::string &prefix,
                                         int world_size) {
    std::shared_ptr<Store> view = make_prefix_store(store, prefix);
    Store *raw = view.get();
    return std::shared_ptr<Store>(raw, [view, store, prefix, world_size](Store *) mutable {
        int64_t left = 0;
        if (store->add(prefix + "__sx/left", 1, &left).ok() && left == world_size) store->erase_prefix(prefix);
        view.reset();
    });
}

}  // namespace

Status open_store(const Rendezvous &rv, Millis timeout, std::shared_ptr<Store> *out) {
    SX_CHECK_ARG(rv.world_size > 0 && rv.rank >= 0 && rv.rank < rv.world_size,
                 "rank %d is not in [0, world_size %d)", rv.rank, rv.world_size);
    SX_CHECK_ARG(timeout.count() > 0, "timeout %lld ms must be > 0", static_cast<long long>(timeout.count()));
    // A joining process counts its groups apart from the ranks' (as rank -1), and leaves
    // the members to count themselves out.
    const int counted = rv.joining ? -1 : rv.rank;
    auto key_space = [&](std::shared_ptr<Store> store, const std::string &prefix) {
        return rv.joining ? make_prefix_store(std::move(store), prefix)
                          : leaving_key_space(std::move(store), prefix, rv.world_size);
    };
    switch (rv.scheme) {
    case Rendezvous::Scheme::kLocal: {
        int64_t n = next_group_number("local://" + rv.name, counted);
        *out = key_space(open_local_store(rv.name), "g" + std::to_string(n) + "/");
        return Status::Ok();
    }
    case Rendezvous::Scheme::kFile: {
        std::shared_ptr<Store> store;
        SX_TRY(open_file_store(rv.path, timeout, &store));
        int64_t n = next_group_number("file://" + rv.path, counted);
        *out = key_space(std::move(store), "g" + std::to_string(n) + "/");
        return Status::Ok();
    }
    case Rendezvous::Scheme::kC10d: {
        // torchrun's agent store outlives the group, as a file:// directory does: the
        // last rank out removes the group's keys.
        int64_t n = next_group_number("c10d://" + rv.host + ":" + std::to_string(rv.port) + "/" + rv.key_prefix,
                                      counted);
        std::shared_ptr<Store> store;
        SX_TRY(open_c10d_store(rv.host, rv.port, timeout, &store));
        *out = key_space(std::move(store), rv.key_prefix + "g" + std::to_string(n) + "/");
        return Status::Ok();
    }
    case Rendezvous::Scheme::kTcp: {
        int64_t n = next_group_number("tcp://" + rv.host + ":" + std::to_string(rv.port), counted);
        std::shared_ptr<Store> store;
        ServerOptions server;
        server.host = rv.host;
        server.port = rv.port;
        server.bind = rv.bind;
        server.token = rv.token;
        server.world_size = rv.world_size;
        const bool first = rv.rank == 0 && !rv.joining;
        SX_TRY(open_tcp_store(server, first && !rv.external, first, n, timeout, &store));
        *out = make_prefix_store(std::move(store), "g" + std::to_string(n) + "/");
        return Status::Ok();
    }
    }
    return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "unknown rendezvous scheme in '%s'", rv.url.c_str());
}

}  // namespace rdzv
}  // namespace sx
