// A context (sx_context.h): what the groups on the same ranks share. The store, opened
// once, in which each group takes a key space of its own; the thread pool; the transport:
// where every rank runs on this host, shared memory (comm/shm/segment.h, SharedChannels),
// whose channels the groups' communicators become; where the ranks run on several hosts of
// the same number (two or more) each, each host's shared memory and one Gloo full mesh
// (comm/gloo/channels.h, GlooChannels), the groups' communicators combining a channel of
// each (comm/shm/hierarchical.h, create_context_channel); else, for a CPU context, the Gloo
// mesh alone; and a memory budget. Groups hold it (a shared pointer in their GroupConfig),
// so it lives while any of them does.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>
#include <string>

#include "base/status.h"
#include "core/group_config.h"
#include "core/memory_budget.h"
#include "optim/thread_pool.h"
#include "rdzv/store.h"

namespace sx {
namespace comm {
class SharedChannels;
class GlooChannels;
struct HostPlacement;
}
namespace core {

// Whether `name` may name a group of a context: 1 to 128 letters, digits, '-', '_' or '.'.
bool valid_group_name(const std::string &name);

class Context {
  public:
    // Collective over base's ranks: opens the rendezvous, waits for every rank, starts the
    // pool, and where the CPU transport may share memory, opens the shared memory its
    // groups' channels come from: all of it where every rank runs on this host, else each
    // host's where there are several of the same number of ranks (two or more) each. A CPU
    // context of more than one rank on several hosts also connects the Gloo mesh. budget:
    // bytes per rank (0: none).
    static Status create(const GroupConfig &base, uint64_t budget, std::shared_ptr<Context> *out);
    ~Context();

    // What every group of the context takes from it: rendezvous, rank, world size, backend,
    // pool size, timeout, transport and bind address, resolved.
    const GroupConfig &base() const { return base_; }
    const std::shared_ptr<rdzv::Store> &store() const { return store_; }
    const std::shared_ptr<optim::ThreadPool> &pool() const { return pool_; }
    // This host's ranks' shared memory; null where there is none (its ranks span hosts of
    // unequal numbers of ranks, or a rank alone on a host, or memory may not be shared).
    const std::shared_ptr<comm::SharedChannels> &channels() const { return channels_; }
    // Null where every rank shares this host's memory, or it is not a CPU context of
    // several ranks. Where both are set, a group's channel combines the two.
    const std::shared_ptr<comm::GlooChannels> &gloo_channels() const { return gloo_channels_; }
    const std::shared_ptr<MemoryBudget> &budget() const { return budget_; }

    // A group named `name` joins: SX_ERR_INVALID_ARGUMENT for a bad name, SX_ERR_INVALID_STATE
    // for one a live group has or after close(). *key_space: the group's own prefix of the
    // store ("groups/NAME/N/": N counts the groups of that name so far, alike on every rank
    // that makes and destroys its groups in the same order, so that no group reads what an
    // earlier one of its name left). Any thread.
    // Before it claims, it erases what groups gone since the last claim left in the store
    // (forget_released).
    Status claim(const std::string &name, std::string *key_space);
    // The group went; any thread. `erasable`: its key space may be erased once every rank's
    // group of that name has gone (false where a regroup of it may still use the space).
    void release(const std::string &name, bool erasable);
    // The handle went: no group may join from now on. Any thread.
    void close();

    struct Stats {
        int64_t groups = 0, groups_created = 0, channels = 0;
        uint64_t memory_bytes = 0, memory_budget_bytes = 0;
        int shared_memory = 0;  // sx_context_stats_t's: 0, 1 (one host) or 2 (within each host)
        uint64_t transport_bytes = 0;  // comm::gloo_channels_kept_bytes
    };
    Stats stats() const;  // any thread

  private:
    Context() = default;
    static Status open_gloo(Context &c, const std::shared_ptr<rdzv::Store> &own, Clock::time_point deadline);
    static Status open_hosts_memory(Context &c, const std::shared_ptr<rdzv::Store> &own, const comm::HostPlacement &placement,
                                    Clock::time_point deadline);
    void forget_released();
    GroupConfig base_;
    std::shared_ptr<rdzv::Store> store_;
    std::shared_ptr<optim::ThreadPool> pool_;
    std::shared_ptr<comm::SharedChannels> channels_;
    std::shared_ptr<comm::GlooChannels> gloo_channels_;
    std::shared_ptr<MemoryBudget> budget_;

    mutable std::mutex mu_;
    std::map<std::string, int64_t> made_;  // under mu_: per name, groups made so far
    std::map<std::string, std::string> live_;  // under mu_: live groups' names and key spaces
    // Under mu_: the key spaces of gone groups, which this rank has not yet counted itself
    // out of. A release makes no request to the store (it may come when the store's server
    // is gone or stalled, as the last thing a process does); the next claim, which talks to
    // the store anyway, counts this rank out of each, and the last rank erases it: a
    // context's store lives as long as the context, which a service keeps for its life.
    std::vector<std::string> released_;
    int64_t created_ = 0;                  // under mu_
    bool closed_ = false;                  // under mu_
};

}  // namespace core
}  // namespace sx
